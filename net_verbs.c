// net_verbs.c: the RDMA verbs byte stream declared in net_verbs.h (the API and its use are there),
// and at the end the verbs transport of net.h (its NET_VERBS entry: a transport, on the bootstrap's
// store, below the algorithms). The byte stream itself uses only common.h.
//
// Protocol. Each end owns two registered host buffers of `slots` slots of `slot_bytes`: a send
// staging buffer and a receive buffer that the peer writes into. Slot i of my send buffer is only
// ever written to slot i of the peer's receive buffer, round robin, one RDMA write with immediate per
// slot (the immediate carries the byte count), and every write consumes one receive request that I
// keep posted at the peer's side; reliable-connected queue pairs deliver the writes and their
// completions in order, so the receiver knows which slot each arrival filled. A sender holds one
// credit per free slot of the peer's receive buffer. The receiver copies bytes out of arrived slots
// as its caller asks for them and returns the credits of emptied slots in batches, as a zero-length
// send with immediate (flagged CREDIT). When a credit comes back, the peer has consumed that slot, so
// the matching send slot has been read by the adapter too and may be refilled.
//
// Receive requests never run out: at most `slots` data writes and at most `slots` credit messages
// can be unconsumed at any time (each carries at least one of the `slots` credits), plus the one
// message that ends the stream (flagged FIN, after the last write), and 2·slots + 2 receives are kept
// posted, each reposted as soon as its completion is polled. The send queue has the same bound.
//
// Closing needs no store and no timer: each end sends FIN after its last write and destroys its
// queue pair once the peer's FIN has arrived and its own was acknowledged (the acknowledgement
// proves the peer's adapter holds it, so the peer is not left waiting).
//
// libibverbs is reached only through the function pointers in VerbsLib (dlvsym with the versions the
// library has exported since rdma-core's first release); post_send, post_recv, poll_cq and
// req_notify_cq are inline functions in verbs.h that call through the context's ops, so they are
// called the same way here and need no symbol. ibv_query_port is an inline that prefers the
// extended context's query_port; the same is done here, with the exported symbol as the fallback.
#define _GNU_SOURCE
#include "net_verbs.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define VERBS_LIB "libibverbs.so.1"
#define CREDIT_FLAG 0x80000000u
#define FIN_FLAG 0x40000000u
// Local ACK timeout 4.096 us * 2^18 = 1.07 s, 6 retries: a dead peer is reported after about 7.5 s,
// while a loaded machine (or a software RoCE device under emulation) that answers late is not. Not 7
// retries: soft-RoCE (rdma_rxe) treats a retry count of 7 as "forever", like the RNR count.
enum { QP_TIMEOUT = 18, QP_RETRY = 6, QP_RNR_RETRY = 7 /* 7: retry forever */ };
enum { BLOB_MAGIC = 0x4c56424c /* "LBVL" */ };
// work request ids of the zero-length sends (data writes use their slot number)
#define CREDIT_WR_ID UINT64_MAX
#define FIN_WR_ID (UINT64_MAX - 1)

typedef struct {
    void *so;
    __typeof__(&ibv_get_device_list) get_device_list;
    __typeof__(&ibv_free_device_list) free_device_list;
    __typeof__(&ibv_get_device_name) get_device_name;
    __typeof__(&ibv_open_device) open_device;
    __typeof__(&ibv_close_device) close_device;
    __typeof__(&ibv_query_device) query_device;
    __typeof__(&ibv_query_port) query_port_compat;
    __typeof__(&ibv_query_gid) query_gid;
    __typeof__(&_ibv_query_gid_ex) query_gid_ex; // optional (rdma-core 31 and later)
    __typeof__(&ibv_alloc_pd) alloc_pd;
    __typeof__(&ibv_dealloc_pd) dealloc_pd;
    __typeof__(&ibv_reg_mr) reg_mr;
    __typeof__(&ibv_dereg_mr) dereg_mr;
    __typeof__(&ibv_create_comp_channel) create_comp_channel;
    __typeof__(&ibv_destroy_comp_channel) destroy_comp_channel;
    __typeof__(&ibv_create_cq) create_cq;
    __typeof__(&ibv_destroy_cq) destroy_cq;
    __typeof__(&ibv_get_cq_event) get_cq_event;
    __typeof__(&ibv_ack_cq_events) ack_cq_events;
    __typeof__(&ibv_create_qp) create_qp;
    __typeof__(&ibv_modify_qp) modify_qp;
    __typeof__(&ibv_destroy_qp) destroy_qp;
    __typeof__(&ibv_wc_status_str) wc_status_str;
} VerbsLib;

static const struct {
    const char *name, *version;
    size_t offset;
    int optional;
} SYMBOLS[] = {
#define SYM(field, name, version, optional) { name, version, offsetof(VerbsLib, field), optional }
    SYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1", 0),
    SYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1", 0),
    SYM(get_device_name, "ibv_get_device_name", "IBVERBS_1.1", 0),
    SYM(open_device, "ibv_open_device", "IBVERBS_1.1", 0),
    SYM(close_device, "ibv_close_device", "IBVERBS_1.1", 0),
    SYM(query_device, "ibv_query_device", "IBVERBS_1.1", 0),
    SYM(query_port_compat, "ibv_query_port", "IBVERBS_1.1", 0),
    SYM(query_gid, "ibv_query_gid", "IBVERBS_1.1", 0),
    SYM(query_gid_ex, "_ibv_query_gid_ex", "IBVERBS_1.11", 1),
    SYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", 0),
    SYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", 0),
    SYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1", 0),
    SYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", 0),
    SYM(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0", 0),
    SYM(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0", 0),
    SYM(create_cq, "ibv_create_cq", "IBVERBS_1.1", 0),
    SYM(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", 0),
    SYM(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1", 0),
    SYM(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1", 0),
    SYM(create_qp, "ibv_create_qp", "IBVERBS_1.1", 0),
    SYM(modify_qp, "ibv_modify_qp", "IBVERBS_1.1", 0),
    SYM(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1", 0),
    SYM(wc_status_str, "ibv_wc_status_str", "IBVERBS_1.1", 0),
#undef SYM
};

struct VerbsDev {
    VerbsLib lib;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    char name[64];
    int port;
    struct ibv_port_attr attr;
    int gid_index, use_grh;
    union ibv_gid gid;
    char describe[192];
};

struct VerbsEp {
    VerbsDev *d;
    char peer[96];
    char err[256];
    int failed;
    unsigned slots;
    size_t slot_bytes;
    unsigned char *sbuf, *rbuf; // send staging, receive buffer the peer writes into
    struct ibv_mr *smr, *rmr;
    struct ibv_comp_channel *channel; // one per endpoint: each communicator's thread sleeps on its own
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t psn;
    int sq_depth, rq_depth, sq_busy; // posted sends not yet completed
    // peer's receive buffer
    uint64_t peer_addr;
    uint32_t peer_rkey;
    // sender side
    uint64_t sent_slots; // slots written so far (next slot = sent_slots % slots)
    unsigned credits;    // free slots in the peer's receive buffer
    // receiver side
    uint64_t arrived, consumed; // slots that arrived / were emptied, in order
    size_t offset;              // bytes already copied out of slot consumed % slots
    uint32_t *length;           // [slots] byte count of each arrived slot
    unsigned credits_owed;      // emptied slots not yet returned to the peer
    int fin_sent, fin_received; // the stream's ends (verbs_ep_finish)
    int fin_acked;              // this end's FIN completed (acknowledged by the peer's adapter)
};

// The blob one end hands the other through the bootstrap store.
typedef struct {
    uint32_t magic, qpn, psn, slots;
    uint64_t slot_bytes, addr;
    uint32_t rkey;
    uint16_t lid;
    uint8_t mtu, link_layer;
    uint8_t gid[16];
} Blob;
_Static_assert(sizeof(Blob) <= VERBS_BLOB_BYTES, "blob too large");

static void say(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

static int ep_fail(VerbsEp *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ep_fail(VerbsEp *e, const char *fmt, ...) {
    if (!e->failed) { // the first failure is the cause; later ones (flushed requests) are echoes
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->err, sizeof e->err, fmt, ap);
        va_end(ap);
        e->failed = 1;
    }
    return -1;
}

static int load_lib(VerbsLib *lib, char *err, size_t cap) {
    memset(lib, 0, sizeof *lib);
    lib->so = dlopen(VERBS_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib->so) {
        say(err, cap, "RDMA verbs unavailable: cannot load %s (%s); install rdma-core's libibverbs1 and the provider of the adapter (Debian: ibverbs-providers)",
            VERBS_LIB, dlerror());
        return -1;
    }
    for (size_t i = 0; i < sizeof SYMBOLS / sizeof SYMBOLS[0]; i++) {
        void *p = dlvsym(lib->so, SYMBOLS[i].name, SYMBOLS[i].version);
        if (!p && !SYMBOLS[i].optional) {
            say(err, cap, "RDMA verbs unavailable: %s has no %s@%s (rdma-core too old?)", VERBS_LIB, SYMBOLS[i].name, SYMBOLS[i].version);
            dlclose(lib->so);
            lib->so = NULL;
            return -1;
        }
        memcpy((char *)lib + SYMBOLS[i].offset, &p, sizeof p); // POSIX: function and data pointers share a representation
    }
    return 0;
}

static int query_port(const VerbsLib *lib, struct ibv_context *ctx, int port, struct ibv_port_attr *attr) {
    memset(attr, 0, sizeof *attr);
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx) return vctx->query_port(ctx, (uint8_t)port, attr, sizeof *attr);
    return lib->query_port_compat(ctx, (uint8_t)port, (struct _compat_ibv_port_attr *)attr);
}

static const char *port_state_name(enum ibv_port_state s) {
    switch (s) {
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
    }
}

static int mtu_bytes(int mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0; }

static void gid_text(const union ibv_gid *g, char *out, size_t cap) {
    if (!inet_ntop(AF_INET6, g->raw, out, (socklen_t)cap)) snprintf(out, cap, "?");
}
static int gid_is_zero(const union ibv_gid *g) {
    static const uint8_t zero[16];
    return !memcmp(g->raw, zero, 16);
}
static int gid_is_link_local(const union ibv_gid *g) { return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80; }
static int gid_is_ipv4(const union ibv_gid *g) {
    static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    return !memcmp(g->raw, prefix, 12);
}

enum { GID_UNKNOWN = -1, GID_IB = 0, GID_ROCE_V1 = 1, GID_ROCE_V2 = 2 };
// The type of a GID table entry as the kernel's sysfs states it ("IB/RoCE v1" or "RoCE v2").
static int gid_type_sysfs(const VerbsDev *d, int index) {
    char path[256], text[32] = "";
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", d->name, d->port, index);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return GID_UNKNOWN;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return GID_UNKNOWN;
    text[n] = 0;
    if (!strncmp(text, "RoCE v2", 7)) return GID_ROCE_V2;
    if (!strncmp(text, "IB/RoCE v1", 10)) return d->attr.link_layer == IBV_LINK_LAYER_ETHERNET ? GID_ROCE_V1 : GID_IB;
    return GID_UNKNOWN;
}
// The same from libibverbs' extended query, where the library has it (GID_UNKNOWN otherwise).
static int gid_type_query(const VerbsDev *d, int index) {
    if (!d->lib.query_gid_ex) return GID_UNKNOWN;
    struct ibv_gid_entry entry;
    if (d->lib.query_gid_ex(d->ctx, (uint32_t)d->port, (uint32_t)index, &entry, 0, sizeof entry) != 0) return GID_UNKNOWN;
    switch (entry.gid_type) {
    case IBV_GID_TYPE_IB: return GID_IB;
    case IBV_GID_TYPE_ROCE_V1: return GID_ROCE_V1;
    case IBV_GID_TYPE_ROCE_V2: return GID_ROCE_V2;
    default: return GID_UNKNOWN;
    }
}
static int gid_type(const VerbsDev *d, int index) {
    int t = gid_type_query(d, index);
    return t != GID_UNKNOWN ? t : gid_type_sysfs(d, index);
}
static const char *gid_type_name(int t) {
    return t == GID_IB ? "IB" : t == GID_ROCE_V1 ? "RoCE v1" : t == GID_ROCE_V2 ? "RoCE v2" : "unknown";
}

// RoCE: the GID decides the packets' addresses. RoCE v2 over IPv4 first, then RoCE v2 over a routable
// IPv6 address; link-local GIDs (fe80::/10) cannot cross a router and RoCE v1 cannot leave the L2
// segment, so neither is picked automatically. InfiniBand routes by LID inside a subnet: index 0.
static int choose_gid(VerbsDev *d, int requested, char *err, size_t cap) {
    int n = d->attr.gid_tbl_len;
    if (requested >= 0) {
        if (requested >= n) {
            say(err, cap, "--ib-gid-index %d: %s port %d has GID indices 0-%d", requested, d->name, d->port, n - 1);
            return -1;
        }
        if (d->lib.query_gid(d->ctx, (uint8_t)d->port, requested, &d->gid) != 0 || gid_is_zero(&d->gid)) {
            say(err, cap, "--ib-gid-index %d: %s port %d has no GID at that index", requested, d->name, d->port);
            return -1;
        }
        d->gid_index = requested;
        d->use_grh = 1; // an explicit GID on InfiniBand asks for global routing
        return 0;
    }
    if (d->attr.link_layer != IBV_LINK_LAYER_ETHERNET) {
        d->gid_index = 0;
        d->use_grh = 0;
        if (d->lib.query_gid(d->ctx, (uint8_t)d->port, 0, &d->gid) != 0) memset(&d->gid, 0, sizeof d->gid);
        if (d->attr.lid == 0) {
            say(err, cap, "%s port %d (InfiniBand) has no LID: is a subnet manager running?", d->name, d->port);
            return -1;
        }
        return 0;
    }
    int best = -1, best_rank = 0;
    for (int i = 0; i < n; i++) {
        union ibv_gid g;
        if (d->lib.query_gid(d->ctx, (uint8_t)d->port, i, &g) != 0 || gid_is_zero(&g) || gid_is_link_local(&g)) continue;
        if (gid_type(d, i) != GID_ROCE_V2) continue;
        int rank = gid_is_ipv4(&g) ? 2 : 1;
        if (rank > best_rank) best = i, best_rank = rank, d->gid = g;
    }
    if (best < 0) {
        say(err, cap, "%s port %d has no routable RoCE v2 GID (no IP address on its network interface?); choose one with --ib-gid-index",
            d->name, d->port);
        return -1;
    }
    d->gid_index = best;
    d->use_grh = 1;
    return 0;
}

// Appends to a list for an error message; a list too long for the buffer is cut.
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...) {
    if (*used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used = *used + (size_t)n < cap ? *used + (size_t)n : cap - 1;
}

// The device named by opt->dev ("name" or "name:port"), or the first device with an active port.
static int choose_port(VerbsDev *d, const VerbsOptions *opt, char *err, size_t cap) {
    char want[64] = "";
    int want_port = 0;
    if (opt->dev && *opt->dev) {
        const char *colon = strchr(opt->dev, ':');
        size_t len = colon ? (size_t)(colon - opt->dev) : strlen(opt->dev);
        char *end = NULL;
        if (colon) want_port = (int)strtol(colon + 1, &end, 10);
        if (len == 0 || len >= sizeof want || (colon && (end == colon + 1 || *end || want_port < 1 || want_port > 255))) {
            say(err, cap, "--ib-dev '%s' is not DEVICE or DEVICE:PORT", opt->dev);
            return -1;
        }
        memcpy(want, opt->dev, len);
        want[len] = 0;
    }
    int ndev = 0;
    errno = 0;
    struct ibv_device **list = d->lib.get_device_list(&ndev);
    if (!list) {
        say(err, cap, "RDMA verbs: cannot list devices: %s", errno == ENOSYS ? "the kernel has no RDMA support" : strerror(errno));
        return -1;
    }
    char seen[512] = "";
    size_t used = 0;
    int found = 0, matched = 0;
    for (int i = 0; i < ndev && !found; i++) {
        const char *name = d->lib.get_device_name(list[i]);
        if (*want && strcmp(name, want)) {
            append(seen, sizeof seen, &used, "%s%s", used ? ", " : "", name);
            continue;
        }
        matched = 1;
        struct ibv_context *ctx = d->lib.open_device(list[i]);
        if (!ctx) {
            say(err, cap, "cannot open RDMA device %s: %s", name, strerror(errno));
            d->lib.free_device_list(list);
            return -1;
        }
        struct ibv_device_attr dattr;
        if (d->lib.query_device(ctx, &dattr) != 0) {
            say(err, cap, "cannot query RDMA device %s", name);
            d->lib.close_device(ctx);
            d->lib.free_device_list(list);
            return -1;
        }
        for (int p = 1; p <= dattr.phys_port_cnt && !found; p++) {
            if (want_port && p != want_port) continue;
            struct ibv_port_attr pa;
            if (query_port(&d->lib, ctx, p, &pa) != 0) {
                say(err, cap, "cannot query port %d of RDMA device %s", p, name);
                d->lib.close_device(ctx);
                d->lib.free_device_list(list);
                return -1;
            }
            if (pa.state == IBV_PORT_ACTIVE) {
                found = 1;
                d->ctx = ctx;
                d->port = p;
                d->attr = pa;
                snprintf(d->name, sizeof d->name, "%s", name);
            } else {
                append(seen, sizeof seen, &used, "%s%s port %d %s", used ? ", " : "", name, p, port_state_name(pa.state));
            }
        }
        if (!found && *want && want_port > dattr.phys_port_cnt) {
            say(err, cap, "--ib-dev %s: device %s has %d port(s)", opt->dev, name, dattr.phys_port_cnt);
            d->lib.close_device(ctx);
            d->lib.free_device_list(list);
            return -1;
        }
        if (!found) d->lib.close_device(ctx);
    }
    d->lib.free_device_list(list);
    if (found) return 0;
    if (ndev == 0) say(err, cap, "RDMA verbs: no RDMA device found (is the adapter's kernel driver loaded?)");
    else if (*want && !matched) say(err, cap, "--ib-dev %s: no such RDMA device (found: %s)", opt->dev, seen);
    else say(err, cap, "RDMA verbs: no active RDMA port (%s)", seen);
    return -1;
}

VerbsDev *verbs_open(const VerbsOptions *opt, char *err, size_t cap) {
    VerbsDev *d = xcalloc(1, sizeof *d);
    if (load_lib(&d->lib, err, cap) != 0) {
        free(d);
        return NULL;
    }
    if (choose_port(d, opt, err, cap) != 0 || choose_gid(d, opt->gid_index, err, cap) != 0) goto fail;
    if (!(d->pd = d->lib.alloc_pd(d->ctx))) {
        say(err, cap, "%s: cannot allocate a protection domain: %s", d->name, strerror(errno));
        goto fail;
    }
    char g[INET6_ADDRSTRLEN];
    gid_text(&d->gid, g, sizeof g);
    if (d->attr.link_layer == IBV_LINK_LAYER_ETHERNET)
        snprintf(d->describe, sizeof d->describe, "%s port %d, %s GID index %d (%s), MTU %d", d->name, d->port,
                 gid_type_name(gid_type(d, d->gid_index)), d->gid_index, g, mtu_bytes(d->attr.active_mtu));
    else
        snprintf(d->describe, sizeof d->describe, "%s port %d, InfiniBand LID %u%s, MTU %d", d->name, d->port, d->attr.lid,
                 d->use_grh ? ", global routing" : "", mtu_bytes(d->attr.active_mtu));
    return d;
fail:
    if (d->pd) d->lib.dealloc_pd(d->pd); // already failing: the first reason is the one to report
    if (d->ctx) d->lib.close_device(d->ctx);
    dlclose(d->lib.so);
    free(d);
    return NULL;
}

const char *verbs_describe(const VerbsDev *d) { return d->describe; }

int verbs_close(VerbsDev *d, char *err, size_t cap) {
    if (!d) return 0;
    int pd_rc = d->pd ? d->lib.dealloc_pd(d->pd) : 0, ctx_rc = d->ctx ? d->lib.close_device(d->ctx) : 0;
    if (pd_rc) say(err, cap, "verbs: cannot free the protection domain of %s: %s", d->name, strerror(pd_rc));
    else if (ctx_rc) say(err, cap, "verbs: cannot close %s: %s", d->name, strerror(errno));
    dlclose(d->lib.so);
    free(d);
    return pd_rc || ctx_rc ? -1 : 0;
}

static int post_recv(VerbsEp *e, uint64_t id) {
    // No scatter list: every arrival is an RDMA write with immediate (data lands in the receive
    // buffer) or a zero-length send (a credit), so a receive request only carries the immediate.
    struct ibv_recv_wr wr = { .wr_id = id }, *bad = NULL;
    int rc = e->qp->context->ops.post_recv(e->qp, &wr, &bad);
    return rc ? ep_fail(e, "verbs: cannot post a receive for %s: %s", e->peer, strerror(rc)) : 0;
}

static void *staging_alloc(size_t bytes) {
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, bytes) != 0) die("out of memory allocating %zu bytes of RDMA staging", bytes);
    memset(p, 0, bytes);
    return p;
}

VerbsEp *verbs_ep_create(VerbsDev *d, unsigned slots, size_t slot_bytes, const char *peer, char *err, size_t cap) {
    if (!slots) slots = VERBS_DEFAULT_SLOTS;
    if (!slot_bytes) slot_bytes = VERBS_DEFAULT_SLOT_BYTES;
    if (slots > 4096 || slot_bytes > (1u << 30)) {
        say(err, cap, "verbs: staging of %u slots of %zu bytes is out of range", slots, slot_bytes);
        return NULL;
    }
    VerbsEp *e = xcalloc(1, sizeof *e);
    e->d = d;
    snprintf(e->peer, sizeof e->peer, "%s", peer);
    e->slots = slots;
    e->slot_bytes = slot_bytes;
    e->length = xcalloc(slots, sizeof *e->length);
    e->sbuf = staging_alloc(slots * slot_bytes);
    e->rbuf = staging_alloc(slots * slot_bytes);
    e->sq_depth = e->rq_depth = 2 * (int)slots + 2;
    e->smr = d->lib.reg_mr(d->pd, e->sbuf, slots * slot_bytes, IBV_ACCESS_LOCAL_WRITE);
    e->rmr = d->lib.reg_mr(d->pd, e->rbuf, slots * slot_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!e->smr || !e->rmr) {
        say(err, cap, "%s: cannot register %zu bytes of RDMA staging for %s: %s (locked-memory limit? see ulimit -l)", d->name,
            slots * slot_bytes, peer, strerror(errno));
        goto fail;
    }
    if (!(e->channel = d->lib.create_comp_channel(d->ctx))) {
        say(err, cap, "%s: cannot create a completion channel for %s: %s", d->name, peer, strerror(errno));
        goto fail;
    }
    int flags = fcntl(e->channel->fd, F_GETFL);
    if (flags < 0 || fcntl(e->channel->fd, F_SETFL, flags | O_NONBLOCK) != 0) { // events are drained without blocking
        say(err, cap, "%s: completion channel for %s: %s", d->name, peer, strerror(errno));
        goto fail;
    }
    if (!(e->cq = d->lib.create_cq(d->ctx, e->sq_depth + e->rq_depth, e, e->channel, 0))) {
        say(err, cap, "%s: cannot create a completion queue for %s: %s", d->name, peer, strerror(errno));
        goto fail;
    }
    struct ibv_qp_init_attr qia = {
        .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
        .cap = { .max_send_wr = (uint32_t)e->sq_depth, .max_recv_wr = (uint32_t)e->rq_depth, .max_send_sge = 1, .max_recv_sge = 1 },
    };
    if (!(e->qp = d->lib.create_qp(d->pd, &qia))) {
        say(err, cap, "%s: cannot create a queue pair for %s: %s", d->name, peer, strerror(errno));
        goto fail;
    }
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = (uint8_t)d->port,
                             .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
    int rc = d->lib.modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc) {
        say(err, cap, "%s: queue pair for %s: INIT failed: %s", d->name, peer, strerror(rc));
        goto fail;
    }
    for (int i = 0; i < e->rq_depth; i++)
        if (post_recv(e, (uint64_t)i) != 0) {
            say(err, cap, "%s", e->err);
            goto fail;
        }
    e->psn = (uint32_t)(mix64((uint64_t)getpid() << 32 ^ (uint64_t)(now_seconds() * 1e9) ^ (uintptr_t)e) & 0xffffff);
    e->credits = slots;
    return e;
fail:
    verbs_ep_destroy(e, NULL, 0);
    return NULL;
}

void verbs_ep_blob(const VerbsEp *e, unsigned char out[VERBS_BLOB_BYTES]) {
    Blob b = { .magic = BLOB_MAGIC, .qpn = e->qp->qp_num, .psn = e->psn, .slots = e->slots, .slot_bytes = e->slot_bytes,
               .addr = (uint64_t)(uintptr_t)e->rbuf, .rkey = e->rmr->rkey, .lid = e->d->attr.lid,
               .mtu = (uint8_t)e->d->attr.active_mtu, .link_layer = e->d->attr.link_layer };
    memcpy(b.gid, e->d->gid.raw, 16);
    memset(out, 0, VERBS_BLOB_BYTES);
    memcpy(out, &b, sizeof b);
}

int verbs_ep_connect(VerbsEp *e, const unsigned char blob[VERBS_BLOB_BYTES]) {
    Blob b;
    memcpy(&b, blob, sizeof b);
    VerbsDev *d = e->d;
    if (b.magic != BLOB_MAGIC) return ep_fail(e, "verbs: the address %s published is not a verbs address", e->peer);
    if (b.slots != e->slots || b.slot_bytes != e->slot_bytes)
        return ep_fail(e, "verbs: %s stages %u x %llu bytes, this rank %u x %zu", e->peer, b.slots, (unsigned long long)b.slot_bytes,
                       e->slots, e->slot_bytes);
    if (b.link_layer != d->attr.link_layer)
        return ep_fail(e, "verbs: %s is on %s, this rank on %s: no path between them", e->peer,
                       b.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand",
                       d->attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand");
    e->peer_addr = b.addr;
    e->peer_rkey = b.rkey;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = b.mtu < d->attr.active_mtu ? b.mtu : d->attr.active_mtu, .dest_qp_num = b.qpn,
        .rq_psn = b.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
        .ah_attr = { .dlid = b.lid, .sl = 0, .src_path_bits = 0, .port_num = (uint8_t)d->port, .is_global = (uint8_t)d->use_grh },
    };
    if (d->use_grh) { // RoCE always: the GRH carries the GIDs (IP addresses)
        memcpy(a.ah_attr.grh.dgid.raw, b.gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    int rc = d->lib.modify_qp(e->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER);
    if (rc) return ep_fail(e, "verbs: queue pair to %s: ready-to-receive failed: %s", e->peer, strerror(rc));
    struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = QP_TIMEOUT, .retry_cnt = QP_RETRY, .rnr_retry = QP_RNR_RETRY,
                             .sq_psn = e->psn, .max_rd_atomic = 1 };
    rc = d->lib.modify_qp(e->qp, &s, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc) return ep_fail(e, "verbs: queue pair to %s: ready-to-send failed: %s", e->peer, strerror(rc));
    return 0;
}

static int completion_error(VerbsEp *e, const struct ibv_wc *wc) {
    const char *what = e->d->lib.wc_status_str(wc->status);
    switch (wc->status) {
    case IBV_WC_RETRY_EXC_ERR:
        return ep_fail(e, "%s unreachable over verbs (%s: no acknowledgement after %d retries)", e->peer, e->d->name, QP_RETRY);
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return ep_fail(e, "%s is not receiving over verbs (%s: receiver not ready)", e->peer, e->d->name);
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
        return ep_fail(e, "%s refused an RDMA write (%s): its address or key does not match this connection", e->peer, what);
    case IBV_WC_WR_FLUSH_ERR:
        return ep_fail(e, "verbs connection to %s was shut down (work requests flushed)", e->peer);
    default:
        return ep_fail(e, "verbs error on the connection to %s: %s (status %d, vendor error 0x%x)", e->peer, what, (int)wc->status,
                       wc->vendor_err);
    }
}

static int post(VerbsEp *e, struct ibv_send_wr *wr) {
    struct ibv_send_wr *bad = NULL;
    int rc = e->qp->context->ops.post_send(e->qp, wr, &bad);
    if (rc) return ep_fail(e, "verbs: cannot post a send to %s: %s", e->peer, strerror(rc));
    e->sq_busy++;
    return 0;
}

// Credits go back in batches of a quarter of the slots: fewer messages, and the sender still has three
// quarters to fill meanwhile. Never a deadlock: a sender out of credits means every slot holds data
// this side has not consumed yet, or has consumed and is returning now.
static int return_credits(VerbsEp *e) {
    unsigned batch = e->slots / 4 ? e->slots / 4 : 1;
    if (e->credits_owed < batch || e->sq_busy >= e->sq_depth) return 0; // a full send queue: the next progress retries
    struct ibv_send_wr wr = { .wr_id = CREDIT_WR_ID, .opcode = IBV_WR_SEND_WITH_IMM, .num_sge = 0,
                              .imm_data = htonl(CREDIT_FLAG | e->credits_owed) };
    if (post(e, &wr) != 0) return -1;
    e->credits_owed = 0;
    return 0;
}

int verbs_progress(VerbsEp *e) {
    if (e->failed) return -1;
    int any = 0;
    for (;;) {
        struct ibv_wc wc[16];
        int n = e->cq->context->ops.poll_cq(e->cq, 16, wc);
        if (n < 0) return ep_fail(e, "verbs: polling the completion queue of %s failed", e->peer);
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) return completion_error(e, &wc[i]);
            if (wc[i].opcode & IBV_WC_RECV) { // IBV_WC_RECV or IBV_WC_RECV_RDMA_WITH_IMM
                uint32_t imm = ntohl(wc[i].imm_data);
                if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                    if (e->arrived - e->consumed >= e->slots || imm > e->slot_bytes)
                        return ep_fail(e, "verbs: %s wrote past the credits it was given (protocol violation)", e->peer);
                    e->length[e->arrived++ % e->slots] = imm;
                } else if (imm & CREDIT_FLAG) {
                    e->credits += imm & ~CREDIT_FLAG;
                    if (e->credits > e->slots) return ep_fail(e, "verbs: %s returned more credits than it had", e->peer);
                } else if (imm == FIN_FLAG && !e->fin_received) {
                    e->fin_received = 1;
                } else {
                    return ep_fail(e, "verbs: unexpected message from %s", e->peer);
                }
                if (post_recv(e, wc[i].wr_id) != 0) return -1;
            } else {
                e->sq_busy--;
                if (wc[i].wr_id == FIN_WR_ID) e->fin_acked = 1;
            }
        }
        any |= n > 0;
        if (n < 16) break;
    }
    if (return_credits(e) != 0) return -1; // a batch that a full send queue deferred
    return any;
}

ssize_t verbs_send(VerbsEp *e, const void *buf, size_t n) {
    if (verbs_progress(e) < 0) return -1;
    const unsigned char *p = buf;
    size_t done = 0;
    while (done < n && e->credits > 0 && e->sq_busy < e->sq_depth) {
        unsigned slot = (unsigned)(e->sent_slots % e->slots);
        size_t len = n - done < e->slot_bytes ? n - done : e->slot_bytes;
        unsigned char *src = e->sbuf + (size_t)slot * e->slot_bytes;
        memcpy(src, p + done, len);
        struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)src, .length = (uint32_t)len, .lkey = e->smr->lkey };
        struct ibv_send_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                                  .imm_data = htonl((uint32_t)len),
                                  .wr.rdma = { .remote_addr = e->peer_addr + (uint64_t)slot * e->slot_bytes, .rkey = e->peer_rkey } };
        if (post(e, &wr) != 0) return -1;
        e->sent_slots++;
        e->credits--;
        done += len;
    }
    return (ssize_t)done;
}

// Releases len bytes of the current slot (at most what is left of it).
static void consume(VerbsEp *e, size_t len) {
    unsigned slot = (unsigned)(e->consumed % e->slots);
    e->offset += len;
    if (e->offset == e->length[slot]) {
        e->consumed++;
        e->offset = 0;
        e->credits_owed++;
    }
}

ssize_t verbs_recv(VerbsEp *e, void *buf, size_t n) {
    if (verbs_progress(e) < 0) return -1;
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n && e->consumed < e->arrived) {
        unsigned slot = (unsigned)(e->consumed % e->slots);
        size_t avail = e->length[slot] - e->offset, len = n - done < avail ? n - done : avail;
        memcpy(p + done, e->rbuf + (size_t)slot * e->slot_bytes + e->offset, len);
        done += len;
        consume(e, len);
    }
    return return_credits(e) != 0 ? -1 : (ssize_t)done;
}

ssize_t verbs_recv_peek(VerbsEp *e, const void **p) {
    if (verbs_progress(e) < 0) return -1;
    if (e->consumed == e->arrived) return 0;
    unsigned slot = (unsigned)(e->consumed % e->slots);
    *p = e->rbuf + (size_t)slot * e->slot_bytes + e->offset;
    return (ssize_t)(e->length[slot] - e->offset);
}

int verbs_recv_consume(VerbsEp *e, size_t k) {
    if (e->failed) return -1;
    unsigned slot = (unsigned)(e->consumed % e->slots);
    if (e->consumed == e->arrived || k > e->length[slot] - e->offset)
        return ep_fail(e, "verbs: internal: consuming %zu bytes beyond what arrived from %s", k, e->peer);
    consume(e, k);
    return return_credits(e);
}

int verbs_sent_all(const VerbsEp *e) { return e->sq_busy == 0; }

int verbs_ep_finish(VerbsEp *e) {
    if (verbs_progress(e) < 0) return -1;
    if (e->fin_sent) return 0;
    if (e->sq_busy >= e->sq_depth) return 1;
    struct ibv_send_wr wr = { .wr_id = FIN_WR_ID, .opcode = IBV_WR_SEND_WITH_IMM, .num_sge = 0, .imm_data = htonl(FIN_FLAG) };
    if (post(e, &wr) != 0) return -1;
    e->fin_sent = 1;
    return 0;
}

int verbs_ep_finished(VerbsEp *e) {
    int rc = verbs_progress(e);
    if (rc < 0) return e->fin_received && e->fin_sent ? 1 : -1;
    return e->fin_received && e->fin_acked;
}

int verbs_ep_arm(VerbsEp *e) {
    if (e->failed) return -1;
    int rc = e->cq->context->ops.req_notify_cq(e->cq, 0);
    if (rc) return ep_fail(e, "verbs: cannot request completion events for %s: %s", e->peer, strerror(rc));
    return verbs_progress(e); // completions that arrived before the request raise no event
}

int verbs_ep_fd(const VerbsEp *e) { return e->channel->fd; }

int verbs_ep_clear(VerbsEp *e) {
    for (;;) {
        struct ibv_cq *cq;
        void *cq_ctx;
        if (e->d->lib.get_cq_event(e->channel, &cq, &cq_ctx) != 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return ep_fail(e, "verbs: reading completion events for %s: %s", e->peer, strerror(errno));
        }
        e->d->lib.ack_cq_events(cq, 1); // acknowledged at once, so destroying the queue never waits
    }
}

int verbs_ep_wait(VerbsEp *e, int timeout_ms) {
    int rc = verbs_ep_arm(e);
    if (rc != 0) return rc;
    struct pollfd p = { .fd = e->channel->fd, .events = POLLIN };
    rc = poll(&p, 1, timeout_ms);
    if (rc < 0 && errno != EINTR) return ep_fail(e, "verbs: waiting for completions from %s: %s", e->peer, strerror(errno));
    if (rc <= 0) return rc < 0; // EINTR counts as a wake-up
    return verbs_ep_clear(e) < 0 ? -1 : 1;
}

const char *verbs_ep_error(const VerbsEp *e) { return e->err; }

int verbs_ep_destroy(VerbsEp *e, char *err, size_t cap) {
    if (!e) return 0;
    const VerbsLib *lib = &e->d->lib;
    const char *what = NULL;
    int rc = 0;
    // in dependency order; the first failure is reported, the rest is still released
    if (e->qp && (rc = lib->destroy_qp(e->qp)) != 0 && !what) what = "queue pair";
    if (e->cq && (rc = lib->destroy_cq(e->cq)) != 0 && !what) what = "completion queue";
    if (e->channel && (rc = lib->destroy_comp_channel(e->channel)) != 0 && !what) what = "completion channel";
    if (e->smr && (rc = lib->dereg_mr(e->smr)) != 0 && !what) what = "send staging registration";
    if (e->rmr && (rc = lib->dereg_mr(e->rmr)) != 0 && !what) what = "receive buffer registration";
    if (what && err) say(err, cap, "verbs: cannot destroy the %s for %s", what, e->peer);
    free(e->sbuf);
    free(e->rbuf);
    free(e->length);
    free(e);
    return what ? -1 : 0;
}

int verbs_print_gids(VerbsDev *d, FILE *out) {
    int mismatches = 0;
    fprintf(out, "%s\n", d->describe);
    for (int i = 0; i < d->attr.gid_tbl_len; i++) {
        union ibv_gid g;
        if (d->lib.query_gid(d->ctx, (uint8_t)d->port, i, &g) != 0) return -1;
        if (gid_is_zero(&g)) continue;
        char text[INET6_ADDRSTRLEN];
        gid_text(&g, text, sizeof text);
        int q = gid_type_query(d, i), s = gid_type_sysfs(d, i);
        fprintf(out, "gid %d %s verbs:%s sysfs:%s%s%s\n", i, text, gid_type_name(q), gid_type_name(s),
                gid_is_link_local(&g) ? " link-local" : "", i == d->gid_index ? " chosen" : "");
        if (q != s && q != GID_UNKNOWN && s != GID_UNKNOWN) mismatches++;
    }
    return mismatches;
}

// ---------------------------------------------------------------------------------------------
// the transport (net.h): one endpoint per peer of a communicator, over the byte stream above
// (test/verbs_pair.c tests the byte stream alone and builds without it: VERBS_CORE_ONLY)
#ifndef VERBS_CORE_ONLY

#include <pthread.h>

#include "bootstrap.h"
#include "net.h"

// Where a lazily opened pair stands: this rank's address is published (waiting for the peer's),
// its queue pair is connected and "ready" published (waiting for the peer's), or both ends are.
enum { VC_ADDRESS, VC_READY, VC_UP };
#define HANDSHAKE_LOOK_S 1e-3 // between two looks into the store for a handshake's next key

typedef struct VerbsConn {
    NetConn base;
    struct VerbsNet *vn;
    VerbsEp *e;
    int state;        // VC_*: no byte moves before VC_UP
    double next_look; // the handshake's next store look
    // the handshake's keys and error lines, which may outlive the communicator (verbs_net_close)
    World *w;
    uint64_t comm_id;
    int me_w;
    char comm_name[96];
    unsigned char part[16]; // a reducing receive's element that straddles two slots
    size_t held;
    NetStaging stage; // device memory's way through this connection (pinned host buffers)
    struct VerbsConn *next_closing;
} VerbsConn;

struct VerbsNet {
    VerbsDev *dev;
    unsigned slots;    // staging of every endpoint: 0 for the default,
    size_t slot_bytes; // or LLM4D_VERBS_STAGING (a testing aid)
    pthread_mutex_t mu;
    VerbsConn *closing; // connections whose communicator is gone, until the peer's end arrives
};

VerbsNet *verbs_net_open(const char *dev, int gid_index, char *why, size_t cap) {
    // LLM4D_VERBS_STAGING=SLOTSxBYTES, the same on every rank: small or odd slots, so that tests wrap
    // the staging ring and cut elements at slot boundaries
    unsigned slots = 0;
    size_t slot_bytes = 0;
    const char *st = getenv("LLM4D_VERBS_STAGING");
    if (st && *st) {
        char *end;
        unsigned long a = strtoul(st, &end, 10), b = 0;
        if (end != st && *end == 'x') {
            const char *p = end + 1;
            b = strtoul(p, &end, 10);
            if (end == p) b = 0;
        }
        if (*end || a < 1 || a > 4096 || b < 1 || b > (1ul << 30))
            die("LLM4D_VERBS_STAGING must be SLOTSxBYTES (1-4096 slots of 1 byte to 1 GiB), got '%s'", st);
        slots = (unsigned)a;
        slot_bytes = b;
    }
    VerbsOptions opt = { dev, gid_index };
    VerbsDev *d = verbs_open(&opt, why, cap);
    if (!d) return NULL;
    VerbsNet *vn = xcalloc(1, sizeof *vn);
    vn->dev = d;
    vn->slots = slots;
    vn->slot_bytes = slot_bytes;
    if (pthread_mutex_init(&vn->mu, NULL) != 0) die("pthread_mutex_init failed");
    return vn;
}

const char *verbs_net_describe(const VerbsNet *vn) { return verbs_describe(vn->dev); }

static const char *opname(const NetConn *c) { return c->opname && *c->opname ? *c->opname : "setup"; }

static void verbs_lost(NetConn *c) {
    VerbsConn *vc = (VerbsConn *)c;
    net_peer_lost(c, "%s on communicator %s: %s", opname(c), c->comm, verbs_ep_error(vc->e));
}

static int verbs_handshake(VerbsConn *vc);

static void verbs_conn_progress(NetConn *c, int *moved) {
    VerbsConn *vc = (VerbsConn *)c;
    VerbsEp *e = vc->e;
    if (vc->state != VC_UP) {
        int was = vc->state;
        verbs_handshake(vc);
        *moved |= vc->state != was;
        if (vc->state != VC_UP) return;
    }
    for (NetReq *q = c->sq; q; q = q->next) { // a byte stream: one request after the other
        if (q->done < q->bytes) {
            const char *from = q->dev ? net_stage_send(&vc->stage, q, "verbs") : q->buf;
            ssize_t n = verbs_send(e, from + q->done, q->bytes - q->done);
            if (n < 0) verbs_lost(c);
            q->done += (size_t)n;
            *moved |= n > 0;
        }
        if (q->done < q->bytes) break;
        if (!q->complete) *moved = 1; // in the staging buffer: the caller's buffer is free again
        q->complete = 1;
    }
    for (NetReq *q = c->rq; q; q = q->next) {
        while (q->done < q->bytes) {
            if (!q->reduce || q->dev) { // device memory arrives whole in staging, then goes onto the device
                char *to = q->dev ? net_stage_recv(&vc->stage, q, "verbs") : q->buf;
                ssize_t n = verbs_recv(e, to + q->done, q->bytes - q->done);
                if (n < 0) verbs_lost(c);
                if (n == 0) break;
                q->done += (size_t)n;
                *moved = 1;
                continue;
            }
            // reducing: straight out of the receive buffer the adapter wrote, whole elements at a time
            size_t es = q->reduce->in_size;
            if (vc->held) { // the rest of an element cut by a slot boundary
                ssize_t n = verbs_recv(e, vc->part + vc->held, es - vc->held);
                if (n < 0) verbs_lost(c);
                if (n == 0) break;
                *moved = 1;
                if ((vc->held += (size_t)n) < es) continue;
                net_reduce_bytes(q->reduce, q->buf, q->done, vc->part, es);
                q->done += es;
                vc->held = 0;
                continue;
            }
            const void *p;
            ssize_t avail = verbs_recv_peek(e, &p);
            if (avail < 0) verbs_lost(c);
            if (avail == 0) break;
            *moved = 1;
            size_t take = q->bytes - q->done < (size_t)avail ? q->bytes - q->done : (size_t)avail, whole = take / es * es;
            if (whole) {
                net_reduce_bytes(q->reduce, q->buf, q->done, p, whole);
                if (verbs_recv_consume(e, whole) != 0) verbs_lost(c);
                q->done += whole;
            } else {
                memcpy(vc->part, p, take);
                if (verbs_recv_consume(e, take) != 0) verbs_lost(c);
                vc->held = take;
            }
        }
        if (q->done < q->bytes) break;
        if (q->dev) net_stage_recv_done(&vc->stage, q);
        q->complete = 1;
    }
    net_pop_done(c);
}

// The completion channel's descriptor, armed; ready instead when completions came in meanwhile.
static void verbs_conn_wait_hint(NetConn *c, NetWait *w) {
    VerbsConn *vc = (VerbsConn *)c;
    if (verbs_ep_clear(vc->e) < 0) verbs_lost(c); // events of an earlier sleep
    int rc = verbs_ep_arm(vc->e);
    if (rc < 0) verbs_lost(c);
    if (rc > 0) w->ready = 1;
    else if (w->nfd < NET_MAX_POLL) {
        w->fd[w->nfd] = verbs_ep_fd(vc->e);
        w->events[w->nfd++] = POLLIN;
    } else {
        w->ready = 1; // no room to sleep on it: look again soon
    }
}

static const char *verbs_conn_peer_state(NetConn *c, char *buf, size_t cap) {
    (void)c, (void)buf, (void)cap;
    return NULL; // a dead peer shows as an error completion (retry exceeded), a silent one as a timeout
}

// Tears down once the peer has its end too; until then the endpoint waits in the closing list.
static void verbs_conn_close(NetConn *c) {
    VerbsConn *vc = (VerbsConn *)c;
    VerbsNet *vn = vc->vn;
    // a pair opened but never used by a byte (a broadcast's non-root pairs) may not be up yet: one more
    // look, and else its handshake ends in verbs_net_close, which waits for no one in particular (a wait
    // here would make the order in which ranks close communicators matter); the goodbye needs it up
    vc->next_look = 0;
    if (verbs_handshake(vc)) (void)verbs_ep_finish(vc->e); // a full send queue or an error: verbs_net_close tries again and reports
    net_staging_free(&vc->stage); // nothing is posted any more
    pthread_mutex_lock(&vn->mu);
    vc->next_closing = vn->closing;
    vn->closing = vc;
    pthread_mutex_unlock(&vn->mu);
}

static const NetOps VERBS_OPS = { "verbs", verbs_conn_progress, verbs_conn_wait_hint, verbs_conn_peer_state, verbs_conn_close, NULL, NULL };

static void handshake_key(char *key, size_t cap, const char *what, const VerbsConn *vc, int from_w, int to_w) {
    snprintf(key, cap, "%s/%016llx/%d/%d", what, (unsigned long long)vc->comm_id, from_w, to_w);
}

// The handshake's next steps, as far as the store has the peer's keys, looking at most every
// HANDSHAKE_LOOK_S and never waiting: the peer's address connects this rank's queue pair, and "ready"
// then says so; the pair is up once the peer's "ready" is in too, so that no write reaches a queue pair
// not yet able to receive. 1 when the pair is up.
static int verbs_handshake(VerbsConn *vc) {
    if (vc->state == VC_UP) return 1;
    double now = now_seconds();
    if (now < vc->next_look) return 0;
    vc->next_look = now + HANDSHAKE_LOOK_S;
    int pw = vc->base.peer_world;
    char key[128];
    uint32_t n;
    if (vc->state == VC_ADDRESS) {
        handshake_key(key, sizeof key, "verbs", vc, pw, vc->me_w);
        char *blob = store_peek(vc->w, key, &n, "connecting over verbs");
        if (!blob) return 0;
        if (n != VERBS_BLOB_BYTES) die("communicator %s: rank %d published a malformed verbs address", vc->comm_name, pw);
        if (verbs_ep_connect(vc->e, (const unsigned char *)blob) != 0) die("communicator %s: %s", vc->comm_name, verbs_ep_error(vc->e));
        free(blob);
        handshake_key(key, sizeof key, "verbs-ready", vc, vc->me_w, pw);
        store_set(vc->w, key, "1", 1);
        vc->state = VC_READY;
    }
    handshake_key(key, sizeof key, "verbs-ready", vc, pw, vc->me_w);
    char *ready = store_peek(vc->w, key, &n, "connecting over verbs");
    if (!ready) return 0;
    free(ready);
    vc->state = VC_UP;
    return 1;
}

// On first use: this rank's endpoint for the pair (its receives posted), and its address published;
// the handshake goes on in progress, so this never waits for the peer.
static NetConn *verbs_connect(void *endpoint, const NetSetup *s, int p) {
    (void)endpoint;
    World *w = s->w;
    VerbsNet *vn = s->vn;
    unsigned slots = vn->slots ? vn->slots : VERBS_DEFAULT_SLOTS;
    size_t slot_bytes = vn->slot_bytes ? vn->slot_bytes : verbs_staging_slot_bytes(s->connections); // net_verbs.h
    int pw = s->world_ranks[p];
    const RankInfo *pi = world_rank_info(w, pw);
    char name[96], err[512], key[128];
    snprintf(name, sizeof name, "rank %d at %.64s", pw, pi->node_id);
    VerbsEp *e = verbs_ep_create(vn->dev, slots, slot_bytes, name, err, sizeof err);
    if (!e) die("communicator %s: %s", s->comm_name, err);
    VerbsConn *vc = xcalloc(1, sizeof *vc);
    net_conn_init(&vc->base, &VERBS_OPS);
    vc->base.peer_pid = pi->pid;
    vc->base.peer_world = pw; // connect_pair sets it too; the handshake needs it first
    vc->vn = vn;
    vc->e = e;
    vc->w = w;
    vc->comm_id = s->comm_id;
    vc->me_w = s->world_ranks[s->rank];
    snprintf(vc->comm_name, sizeof vc->comm_name, "%s", s->comm_name);
    vc->state = VC_ADDRESS;
    unsigned char blob[VERBS_BLOB_BYTES];
    verbs_ep_blob(e, blob);
    handshake_key(key, sizeof key, "verbs", vc, vc->me_w, pw);
    store_set(w, key, blob, sizeof blob);
    verbs_handshake(vc); // the peer may have opened its end already
    return &vc->base;
}

static int verbs_can_connect(const NetReach *r, int a, int b) { return r->rdma(r->ctx, a) && r->rdma(r->ctx, b); }

// no setup: nothing is made until a pair is first used (connect), no queue pair, no registered staging
const NetTransport NET_VERBS = { "verbs", 0, verbs_can_connect, NULL, verbs_connect, NULL };

// Arms every endpoint still closing and sleeps until one has a completion (at most timeout_ms: 1 while
// a handshake looks into the store).
static void wait_closing(VerbsNet *vn, int timeout_ms) {
    struct pollfd pf[NET_MAX_POLL];
    int n = 0;
    for (VerbsConn *vc = vn->closing; vc && n < NET_MAX_POLL; vc = vc->next_closing) {
        if (verbs_ep_clear(vc->e) < 0 || verbs_ep_arm(vc->e) != 0) return; // completions or an error: look again at once
        pf[n++] = (struct pollfd){ .fd = verbs_ep_fd(vc->e), .events = POLLIN };
    }
    if (poll(pf, (nfds_t)n, timeout_ms) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
}

void verbs_net_close(VerbsNet *vn, double timeout_s) {
    if (!vn) return;
    double deadline = now_seconds() + timeout_s;
    char err[512];
    pthread_mutex_lock(&vn->mu);
    while (vn->closing) {
        int left = 0, handshaking = 0;
        for (VerbsConn **pp = &vn->closing; *pp;) {
            VerbsConn *vc = *pp;
            if (!verbs_handshake(vc)) { // a pair closed before it was up: its peer's keys, then the goodbye
                left++, handshaking = 1;
                pp = &vc->next_closing;
                continue;
            }
            int rc = verbs_ep_finish(vc->e);
            if (rc >= 0) rc = rc ? 0 : verbs_ep_finished(vc->e);
            if (rc < 0) die("closing the verbs connections: %s", verbs_ep_error(vc->e));
            if (rc == 0) {
                left++;
                pp = &vc->next_closing;
                continue;
            }
            if (verbs_ep_destroy(vc->e, err, sizeof err) != 0) die("%s", err);
            *pp = vc->next_closing;
            free(vc);
        }
        if (!left) break;
        if (now_seconds() > deadline)
            die("timeout: closing the verbs connections: %d peer(s) did not close theirs within %.1f s", left, timeout_s);
        wait_closing(vn, handshaking ? 1 : 100);
    }
    pthread_mutex_unlock(&vn->mu);
    pthread_mutex_destroy(&vn->mu);
    if (verbs_close(vn->dev, err, sizeof err) != 0) die("%s", err);
    free(vn);
}

#endif // VERBS_CORE_ONLY

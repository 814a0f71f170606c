// net_shm.c: the shared-memory transport between ranks of one node (net.h: its NET_SHM entry and
// NetOps), and the doorbells every communicator sleeps on. A transport: on the bootstrap's store
// (inboxes are published there), below the algorithms.
//
// Each rank has, per communicator, an inbox: a memfd segment holding its doorbell and one incoming
// ring per local peer the algorithm may use, made and published when the communicator is (setup). A
// peer maps the inbox through /proc/PID/fd/N (so no name ever exists in /dev/shm) when it first talks
// to its owner (connect: the connection), and appends records to its ring:
//   EAGER  header + the bytes (small messages, or buffers the receiver cannot read in place)
//   MAP    header + a hostmem handle: the bytes sit in the sender's registered memory, which the
//          receiver maps once and reads in place (large messages, and point-to-point hand-offs,
//          NetReq.direct, at any size)
//   CMA    header + an address: the receiver reads the sender's ordinary memory with
//          process_vm_readv (cross-memory attach), one kernel copy
//   DEV    header + a device handle (devmem.h): the bytes sit in the sender's device memory, which
//          the receiver opens once (CUDA IPC) and reads with the device's copy and reduction
// MAP, CMA and DEV are single-copy: the receiver copies, or reduces, straight from the sender's
// buffer into its own, then bumps a per-ring counter (a step flag, release/acquire) that completes
// the sender's request. For DEV the copy or reduction is queued on the device, and the flag is bumped
// only once the device's mark says it has finished reading, so the flag in host shared memory orders
// device work of two processes exactly as it orders host copies. A posted single-copy send is passive
// (NetReq.passive): the sender has nothing left to do, so no progress thread is woken for it; its
// owner notices the flag at its next look. Each side counts the copies it makes (NetConn.copies).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "common.h"
#include "devmem.h"
#include "hostmem.h"
#include "net.h"

#define RING_BYTES (1u << 20)
#define EAGER_MAX (16u << 10)  // messages up to this size are copied through the ring
#define BOUNCE_BYTES (256u << 10)
#define INBOX_MAGIC 0x78626e49344d4c4cull // "LLM4Inbx"

// ---------------------------------------------------------------------------------------------
// doorbells: an event count. A waiter arms (announces itself), checks once more for work, then
// sleeps on the sequence number; a publisher that sees an armed waiter bumps it and wakes the futex.

static void futex_wake_all(_Atomic uint32_t *addr) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0); }

void doorbell_ring(Doorbell *bell) {
    atomic_thread_fence(memory_order_seq_cst); // the data published before this, then the waiter count
    if (atomic_load_explicit(&bell->waiters, memory_order_relaxed) > 0) {
        atomic_fetch_add(&bell->seq, 1);
        futex_wake_all(&bell->seq);
    }
}

void doorbell_wait(Doorbell *bell, uint32_t seen, int timeout_ms) {
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
    if (atomic_load(&bell->seq) == seen) syscall(SYS_futex, (uint32_t *)&bell->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    atomic_fetch_sub(&bell->waiters, 1);
}

// ---------------------------------------------------------------------------------------------
// the inbox

typedef struct {
    _Atomic uint64_t head;     // bytes the sender has written
    char pad0[56];
    _Atomic uint64_t tail;     // bytes the receiver has consumed
    _Atomic uint64_t rdv_done; // single-copy records of this ring the receiver has finished
    _Atomic uint32_t can_cma;  // the receiver can read the sender's memory with process_vm_readv
    char pad1[44];
    unsigned char data[RING_BYTES];
} Ring;

typedef struct {
    uint64_t magic;
    int32_t nlocal, pad;
    char pad0[48];
    Doorbell bell;
    NetSlot slot[2]; // this rank's small-collective slots (net.h)
    Ring ring[];     // [nlocal]: ring i carries the messages of local member i to the inbox's owner
    // then int32_t member[nlocal]: the communicator rank of each ring's sender (inbox_members), so
    // that ranks connected to different sets of peers (a ring's neighbours) find their ring
} Inbox;
static int32_t *inbox_members(Inbox *b) { return (int32_t *)&b->ring[b->nlocal]; }

// An inbox: its header, one ring per local member, then the members' ranks (which rank sends on each ring)
size_t shm_inbox_bytes(int nlocal) { return sizeof(Inbox) + (sizeof(Ring) + sizeof(int32_t)) * (size_t)nlocal; }

typedef struct { // what a rank publishes about its inbox
    int32_t pid, fd;
    uint64_t bytes, addr;
} InboxInfo;

typedef struct {
    Inbox *mine;
    size_t bytes;
    int fd;
    InboxInfo *peer; // [communicator size]: each peer's inbox as it published it (setup's peers only)
} ShmEndpoint;

enum { REC_EAGER = 1, REC_MAP, REC_CMA, REC_DEV };
typedef struct {
    uint32_t kind, pad;
    uint64_t bytes;
} RecHdr;

// Where a request stands (NetReq.tstate; net_post_send and net_post_recv start it at SHM_NEW).
enum {
    SHM_NEW = 0,     // nothing of it in the ring yet (send), its header not read yet (receive)
    SHM_EAGER,       // an eager record: the header is in the ring (send) or consumed (receive), bytes follow
    SHM_POSTED,      // send: a single-copy record is in the ring; complete once the receiver bumps the step flag
    SHM_SENT,        // send: every byte of an eager record is in the ring
    SHM_DEV_READING, // receive: the device reads the peer's buffer; complete once its mark has passed
};

typedef struct {
    NetConn base;
    Inbox *mine;           // this rank's inbox
    Ring *tx, *rx;         // tx: in the peer's inbox; rx: in ours
    Doorbell *peer_bell;
    Inbox *peer_inbox;     // mapped, kept for the connection's life
    size_t peer_inbox_bytes;
    uint64_t rdv_sent;     // single-copy records posted to the peer
    unsigned char *bounce; // reducing cross-memory reads
} ShmConn;

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static void ring_write(Ring *r, uint64_t at, const void *src, size_t n) {
    size_t o = (size_t)(at % RING_BYTES), first = RING_BYTES - o < n ? RING_BYTES - o : n;
    memcpy(r->data + o, src, first);
    memcpy(r->data, (const char *)src + first, n - first);
}
static void ring_read(const Ring *r, uint64_t at, void *dst, size_t n) {
    size_t o = (size_t)(at % RING_BYTES), first = RING_BYTES - o < n ? RING_BYTES - o : n;
    memcpy(dst, r->data + o, first);
    memcpy((char *)dst + first, r->data, n - first);
}

static const char *opname(const NetConn *c) { return c->opname && *c->opname ? *c->opname : "setup"; }

// ---------------------------------------------------------------------------------------------
// sending

// Writes as much of request q as the ring takes; returns 1 when q is fully written.
static int send_some(ShmConn *sc, NetReq *q) {
    Ring *r = sc->tx;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t space = RING_BYTES - (size_t)(head - atomic_load_explicit(&r->tail, memory_order_acquire));
    if (q->tstate == SHM_NEW && q->dev) { // device memory: always single-copy, through its exported handle
        RecHdr hdr = { REC_DEV, 0, q->bytes };
        DevHandle h;
        if (space < sizeof hdr + sizeof h) return 0;
        if (!q->dev->export_range(q->buf, q->bytes, &h))
            die("%s on communicator %s: cannot export a device buffer of %zu bytes to rank %d (%s)", opname(&sc->base),
                sc->base.comm, q->bytes, sc->base.peer_world, q->dev->name);
        ring_write(r, head, &hdr, sizeof hdr);
        ring_write(r, head + sizeof hdr, &h, sizeof h);
        q->tseq = ++sc->rdv_sent;
        q->tstate = SHM_POSTED;
        q->passive = 1;
        atomic_store_explicit(&r->head, head + sizeof hdr + sizeof h, memory_order_release);
        doorbell_ring(sc->peer_bell);
        return 1;
    }
    if (q->tstate == SHM_NEW) { // choose the record: single-copy when the receiver can read our buffer
        HostMemHandle h;
        int kind = REC_EAGER;
        // a hand-off (direct) from registered memory is read in place at any size: one copy instead of
        // two, and nothing for this rank to do once posted; cross-memory attach, a system call, only
        // pays for itself above the eager size
        if ((q->bytes > EAGER_MAX || (q->direct && q->bytes > 0)) && hostmem_find(q->buf, q->bytes, &h)) kind = REC_MAP;
        else if (q->bytes > EAGER_MAX && atomic_load_explicit(&r->can_cma, memory_order_acquire)) kind = REC_CMA;
        RecHdr hdr = { (uint32_t)kind, 0, q->bytes };
        size_t rec = sizeof hdr + (kind == REC_MAP ? sizeof h : kind == REC_CMA ? 8 : 0);
        // small messages go in one piece, so the receiver sees them whole in one look
        size_t want = kind == REC_EAGER && q->bytes <= EAGER_MAX ? rec + pad8(q->bytes) : rec;
        if (space < want) return 0;
        ring_write(r, head, &hdr, sizeof hdr);
        if (kind == REC_MAP) ring_write(r, head + sizeof hdr, &h, sizeof h);
        if (kind == REC_CMA) {
            uint64_t addr = (uint64_t)(uintptr_t)q->buf;
            ring_write(r, head + sizeof hdr, &addr, 8);
        }
        head += rec;
        space -= rec;
        if (kind != REC_EAGER) {
            q->tseq = ++sc->rdv_sent;
            q->tstate = SHM_POSTED;
            q->passive = 1;
            atomic_store_explicit(&r->head, head, memory_order_release);
            doorbell_ring(sc->peer_bell);
            return 1;
        }
        q->tstate = SHM_EAGER;
    }
    // eager payload; its last piece carries the padding to the next record
    size_t left = q->bytes - q->done, tail_pad = pad8(q->bytes) - q->bytes, w;
    if (left + tail_pad <= space) w = left;    // the last piece, with the padding
    else w = space < left ? space : (left ? left - 1 : 0); // not yet: the last byte waits for room for the padding
    if (w > 0 || left == 0) {
        ring_write(r, head, (const char *)q->buf + q->done, w);
        sc->base.copied_bytes += w;
        sc->base.copies += q->done == 0 && w > 0; // one copy of the message, however many pieces
        q->done += w;
        head += w;
        if (q->done == q->bytes) head += tail_pad;
        atomic_store_explicit(&r->head, head, memory_order_release);
        doorbell_ring(sc->peer_bell);
    }
    if (q->done < q->bytes) return 0;
    q->tstate = SHM_SENT;
    q->complete = 1;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// receiving

static void deliver(const NetReq *q, size_t at, const void *src, size_t n) {
    if (q->reduce) net_reduce_bytes(q->reduce, q->buf, at, src, n);
    else if (q->streaming) copy_streaming((char *)q->buf + at, src, n);
    else memcpy((char *)q->buf + at, src, n);
}

static void cma_read(ShmConn *sc, NetReq *q, uint64_t addr) {
    NetConn *c = &sc->base;
    size_t es = q->reduce ? q->reduce->in_size : 1;
    while (q->done < q->bytes) {
        size_t n = q->bytes - q->done;
        void *dst = (char *)q->buf + q->done;
        if (q->reduce) {
            if (!sc->bounce) sc->bounce = xmalloc(BOUNCE_BYTES);
            n = n < BOUNCE_BYTES ? n : BOUNCE_BYTES / es * es;
            dst = sc->bounce;
        }
        struct iovec l = { dst, n }, rm = { (void *)(uintptr_t)(addr + q->done), n };
        ssize_t got = process_vm_readv(c->peer_pid, &l, 1, &rm, 1, 0);
        if (got <= 0 && errno == ESRCH)
            net_peer_lost(c, "%s on communicator %s: rank %d (pid %d) died", opname(c), c->comm, c->peer_world, (int)c->peer_pid);
        if (got <= 0)
            die("%s on communicator %s: cannot read rank %d's buffer (process_vm_readv: %s)", opname(c), c->comm,
                c->peer_world, got < 0 ? strerror(errno) : "nothing read");
        size_t whole = (size_t)got / es * es;
        if (q->reduce) net_reduce_bytes(q->reduce, q->buf, q->done, sc->bounce, whole);
        q->done += whole;
        if (whole < (size_t)got) die("internal: partial element from process_vm_readv");
    }
}

// The step flag of a single-copy record of rec bytes at tail: the receiver is done with the sender's buffer.
static void single_copy_done(ShmConn *sc, NetReq *q, uint64_t tail, size_t rec) {
    Ring *r = sc->rx;
    sc->base.copies += q->bytes > 0;
    sc->base.copied_bytes += q->bytes;
    atomic_store_explicit(&r->tail, tail + rec, memory_order_release);
    atomic_store_explicit(&r->rdv_done, atomic_load_explicit(&r->rdv_done, memory_order_relaxed) + 1, memory_order_release);
    q->complete = 1;
}

// A DEV record: queues the device's copy or reduction from the peer's buffer and a mark after it;
// the request waits in SHM_DEV_READING until the mark has passed (recv_device_done).
static void recv_device(ShmConn *sc, NetReq *q, const RecHdr *hdr, uint64_t tail) {
    NetConn *c = &sc->base;
    DevHandle h;
    ring_read(sc->rx, tail + sizeof *hdr, &h, sizeof h);
    char why[256];
    const void *src = q->dev->open_range(c->peer_pid, &h, why, sizeof why);
    if (!src && kill(c->peer_pid, 0) != 0)
        net_peer_lost(c, "%s on communicator %s: rank %d (pid %d) died", opname(c), c->comm, c->peer_world, (int)c->peer_pid);
    if (!src) die("%s on communicator %s: cannot open rank %d's device memory: %s", opname(c), c->comm, c->peer_world, why);
    if (q->reduce) net_reduce_bytes(q->reduce, q->buf, 0, src, q->bytes);
    else q->dev->copy(q->buf, src, q->bytes);
    q->mark = q->dev->mark(DEV_COMM);
    q->tstate = SHM_DEV_READING;
}
static int recv_device_done(ShmConn *sc, NetReq *q) {
    if (!q->dev->test(q->mark)) return 0;
    q->dev->release(q->mark);
    q->mark = NULL;
    single_copy_done(sc, q, atomic_load_explicit(&sc->rx->tail, memory_order_relaxed), sizeof(RecHdr) + sizeof(DevHandle));
    return 1;
}

// Finishes a single-copy record whose header is at tail.
static void recv_single_copy(ShmConn *sc, NetReq *q, const RecHdr *hdr, uint64_t tail) {
    NetConn *c = &sc->base;
    Ring *r = sc->rx;
    size_t rec = sizeof *hdr;
    if (hdr->kind == REC_MAP) {
        HostMemHandle h;
        ring_read(r, tail + rec, &h, sizeof h);
        rec += sizeof h;
        char why[256];
        const void *src = hostmem_peer_view(c->peer_pid, &h, why, sizeof why);
        if (!src && kill(c->peer_pid, 0) != 0)
            net_peer_lost(c, "%s on communicator %s: rank %d (pid %d) died", opname(c), c->comm, c->peer_world, (int)c->peer_pid);
        if (!src) die("%s on communicator %s: cannot map rank %d's registered memory: %s", opname(c), c->comm, c->peer_world, why);
        deliver(q, 0, src, q->bytes);
        q->done = q->bytes;
    } else {
        uint64_t addr;
        ring_read(r, tail + rec, &addr, 8);
        rec += 8;
        cma_read(sc, q, addr);
    }
    single_copy_done(sc, q, tail, rec);
}

static void shm_progress(NetConn *c, int *moved) {
    ShmConn *sc = (ShmConn *)c;
    // sends: in order; single-copy ones stay queued until the receiver has read them
    for (NetReq *q = c->sq; q; q = q->next) {
        if (q->complete) continue;
        if (q->tstate == SHM_POSTED) {
            if (atomic_load_explicit(&sc->tx->rdv_done, memory_order_acquire) >= q->tseq) {
                q->complete = 1;
                *moved = 1;
            }
            continue;
        }
        size_t before = q->done;
        int st = q->tstate;
        int whole = send_some(sc, q);
        if (q->done != before || q->tstate != st) *moved = 1;
        if (!whole) break;
    }
    // receives
    Ring *r = sc->rx;
    int freed = 0;
    for (NetReq *q = c->rq; q && !q->complete; q = q->next) {
        if (q->tstate == SHM_DEV_READING) {
            if (!recv_device_done(sc, q)) break;
            *moved = freed = 1;
            continue;
        }
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        size_t avail = (size_t)(atomic_load_explicit(&r->head, memory_order_acquire) - tail);
        if (q->tstate == SHM_NEW) {
            RecHdr hdr;
            if (avail < sizeof hdr) break;
            ring_read(r, tail, &hdr, sizeof hdr);
            if (hdr.bytes != q->bytes)
                die("%s on communicator %s: rank %d sent a message of %llu bytes where %zu were expected", opname(c),
                    c->comm, c->peer_world, (unsigned long long)hdr.bytes, q->bytes);
            if ((hdr.kind == REC_DEV) != (q->dev != NULL))
                die("%s on communicator %s: rank %d sent %s memory where this rank receives into %s memory (every rank "
                    "of an operation passes buffers of one kind)", opname(c), c->comm, c->peer_world,
                    hdr.kind == REC_DEV ? "device" : "host", q->dev ? "device" : "host");
            *moved = 1;
            freed = 1;
            if (hdr.kind == REC_DEV) {
                recv_device(sc, q, &hdr, tail);
                if (!recv_device_done(sc, q)) break;
                continue;
            }
            if (hdr.kind != REC_EAGER) {
                recv_single_copy(sc, q, &hdr, tail);
                continue;
            }
            tail += sizeof hdr;
            avail -= sizeof hdr;
            atomic_store_explicit(&r->tail, tail, memory_order_relaxed);
            q->tstate = SHM_EAGER;
        }
        size_t es = q->reduce ? q->reduce->in_size : 1;
        size_t left = q->bytes - q->done, take = avail < left ? avail / es * es : left;
        if (take > 0) {
            size_t o = (size_t)(tail % RING_BYTES), first = RING_BYTES - o < take ? RING_BYTES - o : take;
            deliver(q, q->done, r->data + o, first);
            if (take > first) deliver(q, q->done + first, r->data, take - first);
            q->done += take;
            tail += take;
            *moved = freed = 1;
        }
        if (q->done == q->bytes) {
            tail += pad8(q->bytes) - q->bytes; // written with the last piece
            q->complete = 1;
            c->copies += q->bytes > 0;
            c->copied_bytes += q->bytes;
        }
        atomic_store_explicit(&r->tail, tail, memory_order_release);
        if (!q->complete) break;
    }
    if (freed) doorbell_ring(sc->peer_bell); // the sender may wait for space or a completion
    net_pop_done(c);
}

// Nothing to poll: peers ring the endpoint's doorbell (shm_setup hands it to the communicator).
static void shm_wait_hint(NetConn *c, NetWait *w) { (void)c, (void)w; }

static const char *shm_peer_state(NetConn *c, char *buf, size_t cap) { return process_state(c->peer_pid, buf, cap); }

static void shm_close(NetConn *c) {
    ShmConn *sc = (ShmConn *)c;
    for (NetReq *q = c->rq; q; q = q->next) // a device read still in flight when the job stops
        if (q->mark) q->dev->release(q->mark), q->mark = NULL;
    munmap(sc->peer_inbox, sc->peer_inbox_bytes);
    free(sc->bounce);
    free(sc);
}

static NetSlot *shm_slot(NetConn *c, int mine, int parity) {
    ShmConn *sc = (ShmConn *)c;
    return mine ? &sc->mine->slot[parity] : &sc->peer_inbox->slot[parity];
}

static void shm_notify(NetConn *c) { doorbell_ring(((ShmConn *)c)->peer_bell); }

static const NetOps SHM_OPS = { "shm", shm_progress, shm_wait_hint, shm_peer_state, shm_close, shm_slot, shm_notify };

// ---------------------------------------------------------------------------------------------
// setup: publish the inbox, map the peers' inboxes, test cross-memory attach

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

// The shared-memory peers of a communicator: every member of one node (`--transport shm` refuses a
// job on several nodes before any pair is connected).
static int shm_can_connect(const NetReach *r, int a, int b) {
    return !strcmp(world_rank_info(r->w, a)->node_id, world_rank_info(r->w, b)->node_id);
}

// This rank's inbox, published; then the peers' records (each member publishes its own before it
// reads any, so nobody waits for a peer that waits for it). No peer's inbox is mapped yet.
static void *shm_setup(const NetSetup *s, int npeers, const int *peers) {
    World *w = s->w;
    int nl = npeers + 1;
    int *members = xmalloc(sizeof(int) * nl);
    memcpy(members, peers, sizeof(int) * npeers);
    members[npeers] = s->rank;
    qsort(members, (size_t)nl, sizeof(int), cmp_int);
    ShmEndpoint *ep = xcalloc(1, sizeof *ep);
    ep->bytes = shm_inbox_bytes(nl);
    ep->fd = memfd_create("llm4d-inbox", MFD_CLOEXEC);
    if (ep->fd < 0) die("communicator %s: memfd_create: %s (use --transport tcp)", s->comm_name, strerror(errno));
    if (ftruncate(ep->fd, (off_t)ep->bytes) != 0) die("communicator %s: ftruncate: %s", s->comm_name, strerror(errno));
    ep->mine = mmap(NULL, ep->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ep->fd, 0);
    if (ep->mine == MAP_FAILED) die("communicator %s: mmap of %zu bytes: %s", s->comm_name, ep->bytes, strerror(errno));
    ep->mine->nlocal = nl;
    for (int i = 0; i < nl; i++) inbox_members(ep->mine)[i] = members[i];
    ep->mine->magic = INBOX_MAGIC;
    *s->bell = &ep->mine->bell;
    free(members);
    char key[160];
    int me_w = s->world_ranks[s->rank];
    InboxInfo mine = { getpid(), ep->fd, ep->bytes, (uint64_t)(uintptr_t)ep->mine };
    snprintf(key, sizeof key, "shm/%016llx/%d", (unsigned long long)s->comm_id, me_w);
    store_set(w, key, &mine, sizeof mine);
    ep->peer = xcalloc((size_t)s->size, sizeof *ep->peer);
    for (int i = 0; i < npeers; i++) {
        int pw = s->world_ranks[peers[i]];
        snprintf(key, sizeof key, "shm/%016llx/%d", (unsigned long long)s->comm_id, pw);
        uint32_t n;
        InboxInfo *info = (InboxInfo *)store_get(w, key, &n, "shared-memory setup");
        if (n != sizeof *info) die("communicator %s: malformed inbox record from rank %d", s->comm_name, pw);
        ep->peer[peers[i]] = *info;
        free(info);
    }
    return ep;
}

// On first use: maps peer p's inbox (its rings and doorbell), without waiting for p: messages wait in
// the rings until p connects its end.
static NetConn *shm_connect(void *endpoint, const NetSetup *s, int p) {
    World *w = s->w;
    ShmEndpoint *ep = endpoint;
    const InboxInfo *info = &ep->peer[p];
    int pw = s->world_ranks[p], li = 0;
    while (li < ep->mine->nlocal && inbox_members(ep->mine)[li] != p) li++;
    if (li == ep->mine->nlocal || !info->pid) die("internal: communicator %s: rank %d is not a shared-memory peer", s->comm_name, pw);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)info->pid, (int)info->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        char st[96];
        const char *state = process_state(info->pid, st, sizeof st);
        // the inbox descriptor lives as long as its process: gone means the process is going
        if (e == ENOENT || (state && !strcmp(state, "died"))) { // it may have died of another rank's failure: name the first
            world_set_waiting(w, pw, "shared-memory setup", s->comm_name);
            world_set_failed(w);
            world_die_after(w, pw, "communicator %s: rank %d (pid %d) died during shared-memory setup", s->comm_name, pw, (int)info->pid);
        }
        die("communicator %s: cannot open rank %d's shared memory %s: %s (use --transport tcp)", s->comm_name, pw,
            path, strerror(e));
    }
    ShmConn *sc = xcalloc(1, sizeof *sc);
    sc->peer_inbox_bytes = info->bytes;
    sc->peer_inbox = mmap(NULL, info->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (sc->peer_inbox == MAP_FAILED) die("communicator %s: cannot map rank %d's inbox: %s", s->comm_name, pw, strerror(errno));
    int tx_li = -1; // this rank's ring in the peer's inbox
    if (sc->peer_inbox->magic == INBOX_MAGIC && (size_t)sc->peer_inbox->nlocal * (sizeof(Ring) + sizeof(int32_t)) + sizeof(Inbox) == info->bytes)
        for (int k = 0; k < sc->peer_inbox->nlocal; k++)
            if (inbox_members(sc->peer_inbox)[k] == s->rank) tx_li = k;
    if (tx_li < 0) die("communicator %s: rank %d's inbox is not what it announced", s->comm_name, pw);
    net_conn_init(&sc->base, &SHM_OPS);
    sc->base.peer_pid = info->pid;
    sc->mine = ep->mine;
    sc->tx = &sc->peer_inbox->ring[tx_li];
    sc->rx = &ep->mine->ring[li];
    sc->peer_bell = &sc->peer_inbox->bell;
    // can this rank read the peer's ordinary memory? (Yama or a container may forbid it)
    uint64_t probe = 0;
    struct iovec l = { &probe, sizeof probe }, rm = { (void *)(uintptr_t)info->addr, sizeof probe };
    if (process_vm_readv(info->pid, &l, 1, &rm, 1, 0) == (ssize_t)sizeof probe && probe == INBOX_MAGIC)
        atomic_store_explicit(&sc->rx->can_cma, 1, memory_order_release);
    return &sc->base;
}

static void shm_teardown(void *endpoint) {
    ShmEndpoint *ep = endpoint;
    if (!ep) return;
    munmap(ep->mine, ep->bytes);
    close(ep->fd);
    free(ep->peer);
    free(ep);
}

const NetTransport NET_SHM = { "shm", 1, shm_can_connect, shm_setup, shm_connect, shm_teardown };

// collectives.c: communicators and the progress engine (collectives.h); what each collective sends,
// receives and adds is in algorithms.c.
//
// Read top to bottom: communicators (a transport for each peer, chosen alike at both ends); the
// engine that runs operations (who drives, how a waiting rank spins, sleeps and times out); the
// public calls.
#define _GNU_SOURCE
#include "collectives.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms.h"
#include "bootstrap.h"
#include "common.h"
#include "hostmem.h"
#include "net.h"

// ---------------------------------------------------------------------------------------------
// communicators

int comm_parse_transport(const char *s) {
    if (!strcmp(s, "auto")) return TRANSPORT_AUTO;
    if (!strcmp(s, "shm")) return TRANSPORT_SHM;
    if (!strcmp(s, "tcp")) return TRANSPORT_TCP;
    if (!strcmp(s, "verbs")) return TRANSPORT_VERBS;
    return -1;
}
static const char *const TRANSPORT_NAMES[] = { "auto", "shm", "tcp", "verbs" };

static void *progress_main(void *arg);
static int has_work_locked(const Comm *c) { return c->head || c->cur || c->p2p; }

// What decides each pair's transport, shared by the world's communicators (the last one closes it).
// Where verbs may carry a pair (--transport verbs, or auto on more than one node), every rank opens
// its RDMA device at start and publishes in the store whether it has one ("+" and the device, or "-"
// and why not); a rank reads another's entry when it first needs it. Both ends of a pair compute
// the same answer from the same entries.
typedef struct Transports {
    _Atomic int refs;
    int choice;          // TransportChoice
    int verbs_considered;
    VerbsNet *vn;        // this rank's device (NULL: none)
    char why[320];       // why not, when vn is NULL
    pthread_mutex_t mu;
    signed char *usable; // per world rank: -1 not read yet, 0 or 1
} Transports;

enum { VIA_SHM, VIA_TCP, VIA_VERBS };

static int same_node(const World *w, int a, int b) {
    return !strcmp(world_rank_info(w, a)->node_id, world_rank_info(w, b)->node_id);
}

static Transports *transports_open(World *w, const CommOptions *opt) {
    Transports *tr = xcalloc(1, sizeof *tr);
    atomic_store(&tr->refs, 1);
    tr->choice = opt->transport;
    if (pthread_mutex_init(&tr->mu, NULL) != 0) die("pthread_mutex_init failed");
    const LaunchEnv *env = world_env(w);
    int nodes = 1;
    for (int r = 1; r < env->world && nodes == 1; r++) nodes += !same_node(w, 0, r);
    tr->verbs_considered = env->world > 1 && (opt->transport == TRANSPORT_VERBS || (opt->transport == TRANSPORT_AUTO && nodes > 1));
    tr->usable = xmalloc((size_t)env->world);
    memset(tr->usable, -1, (size_t)env->world);
    if (!tr->verbs_considered) return tr;
#ifdef LLM4D_VERBS
    tr->vn = verbs_net_open(opt->ib_dev, opt->ib_gid_index, tr->why, sizeof tr->why);
#else
    snprintf(tr->why, sizeof tr->why, "this ./train was built without RDMA verbs (no <infiniband/verbs.h>: install "
             "libibverbs-dev, e.g. with scripts/deps.sh, and rebuild)");
#endif
    char entry[400], key[64];
#ifdef LLM4D_VERBS
    if (tr->vn) snprintf(entry, sizeof entry, "+%s", verbs_net_describe(tr->vn));
    else
#endif
        snprintf(entry, sizeof entry, "-%s", tr->why);
    snprintf(key, sizeof key, "rdma/%d", env->rank);
    store_set(w, key, entry, (uint32_t)strlen(entry));
    tr->usable[env->rank] = tr->vn != NULL;
    return tr;
}

// 1 when world rank r has an active RDMA port; otherwise 0, with its reason (or device) in text.
static int rank_usable(Transports *tr, World *w, int r, char *text, size_t cap) {
    if (!tr->verbs_considered) return 0;
    pthread_mutex_lock(&tr->mu);
    int known = tr->usable[r];
    pthread_mutex_unlock(&tr->mu);
    if (known >= 0 && !text) return known;
    char key[64];
    uint32_t n;
    snprintf(key, sizeof key, "rdma/%d", r);
    char *v = store_get(w, key, &n, "RDMA capabilities");
    int ok = n > 0 && v[0] == '+';
    if (text) snprintf(text, cap, "%s", n > 0 ? v + 1 : "");
    free(v);
    pthread_mutex_lock(&tr->mu);
    tr->usable[r] = (signed char)ok;
    pthread_mutex_unlock(&tr->mu);
    return ok;
}

static int pair_via(Transports *tr, World *w, int a, int b) {
    int same = same_node(w, a, b);
    switch (tr->choice) {
    case TRANSPORT_SHM: return VIA_SHM; // comm_init refused pairs on different nodes
    case TRANSPORT_TCP: return VIA_TCP;
    case TRANSPORT_VERBS: return VIA_VERBS; // comm_init refused ranks without a device
    default: return same ? VIA_SHM : rank_usable(tr, w, a, NULL, 0) && rank_usable(tr, w, b, NULL, 0) ? VIA_VERBS : VIA_TCP;
    }
}

// A forced transport that cannot reach a peer: one line naming both ranks.
static void transports_check(Transports *tr, World *w) {
    const LaunchEnv *env = world_env(w);
    int me = env->rank;
    if (tr->choice == TRANSPORT_SHM)
        for (int r = 0; r < env->world; r++)
            if (!same_node(w, me, r))
                die("--transport shm: rank %d (node %s) and rank %d (node %s) do not share a node", me, env->node_id, r,
                    world_rank_info(w, r)->node_id);
    if (tr->choice == TRANSPORT_VERBS && env->world > 1) {
        // every rank finds the same first rank without a device and prints the same line, after rank 0,
        // which serves the store, has seen that every rank has read what it needs
        char why[400], key[64];
        int first = -1;
        for (int r = 0; r < env->world && first < 0; r++)
            if (!rank_usable(tr, w, r, why, sizeof why)) first = r;
        if (first < 0) return;
        snprintf(key, sizeof key, "rdma-checked/%d", me);
        store_set(w, key, "1", 1);
        for (int r = 0; r < env->world && me == 0; r++) {
            uint32_t n;
            snprintf(key, sizeof key, "rdma-checked/%d", r);
            free(store_get(w, key, &n, "RDMA capabilities"));
        }
        die("--transport verbs: rank %d (node %s) has no RDMA device: %s", first, world_rank_info(w, first)->node_id, why);
    }
}

static void transports_release(Transports *tr, double timeout_s) {
    if (atomic_fetch_sub(&tr->refs, 1) != 1) return;
#ifdef LLM4D_VERBS
    verbs_net_close(tr->vn, timeout_s);
#else
    (void)timeout_s;
#endif
    pthread_mutex_destroy(&tr->mu);
    free(tr->usable);
    free(tr);
}

static void comm_connect(Comm *c) {
    World *w = c->w;
    int me_w = c->world_ranks[c->rank];
    c->conn = xcalloc((size_t)c->size, sizeof(NetConn *));
    int *peers[3], np[3] = { 0, 0, 0 };
    for (int k = 0; k < 3; k++) peers[k] = xmalloc(sizeof(int) * c->size);
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        int via = pair_via(c->tr, w, me_w, c->world_ranks[r]);
        peers[via][np[via]++] = r;
    }
    NetSetup s = { w, c->id, c->name, c->rank, c->size, c->world_ranks, &c->op };
    NetConn **tmp = xcalloc((size_t)c->size, sizeof(NetConn *));
    c->bell = &c->private_bell;
    // every rank sets its transports up in this order, so that no two wait for each other
    for (int via = 0; via < 3; via++) {
        if (!np[via]) continue;
        if (via == VIA_SHM) c->shm = shm_setup(&s, np[via], peers[via], tmp, &c->bell);
        else if (via == VIA_TCP) tcp_setup(&s, np[via], peers[via], tmp);
#ifdef LLM4D_VERBS
        else verbs_setup(&s, c->tr->vn, np[via], peers[via], tmp);
#endif
        for (int i = 0; i < np[via]; i++) c->conn[peers[via][i]] = tmp[i];
    }
    for (int r = 0; r < c->size; r++)
        if (c->conn[r]) {
            c->conn[r]->peer = r;
            c->conn[r]->peer_world = c->world_ranks[r];
            c->conn[r]->comm = c->name;
            c->conn[r]->world = w;
            c->conn[r]->opname = &c->op;
        }
    free(tmp);
    for (int k = 0; k < 3; k++) free(peers[k]);
    int local = 0;
    for (int r = 0; r < world_env(w)->world; r++) local += same_node(w, r, me_w);
    c->oversubscribed = local > sysconf(_SC_NPROCESSORS_ONLN);
    c->slots = c->size > 1;
    for (int r = 0; r < c->size; r++)
        if (c->conn[r] && !c->conn[r]->ops->slot) c->slots = 0;
    c->chunk_bytes = CHUNK_BYTES;
    c->acc = xmalloc(c->chunk_bytes);
    if (pthread_mutex_init(&c->mu, NULL) || pthread_cond_init(&c->work_cv, NULL) || pthread_cond_init(&c->done_cv, NULL))
        die("pthread init failed");
    if (pthread_create(&c->thread, NULL, progress_main, c) != 0) die("pthread_create: %s", strerror(errno));
}

static Comm *comm_new(World *w, uint64_t id, const char *name) {
    Comm *c = xcalloc(1, sizeof *c);
    c->w = w;
    c->id = id;
    snprintf(c->name, sizeof c->name, "%s", name);
    return c;
}

// Rank 0's one line about the world: ranks, nodes and which transport each pair uses; where auto
// left pairs of different nodes on TCP, the first rank without RDMA and why.
static void log_transports(Transports *tr, World *w) {
    int n = world_env(w)->world, nodes = 0, count[3] = { 0, 0, 0 }, no_rdma = -1;
    for (int a = 0; a < n; a++) {
        int first = 1;
        for (int b = 0; b < a; b++)
            if (same_node(w, a, b)) first = 0;
        nodes += first;
        for (int b = a + 1; b < n; b++) count[pair_via(tr, w, a, b)]++;
        if (no_rdma < 0 && tr->verbs_considered && !rank_usable(tr, w, a, NULL, 0)) no_rdma = a;
    }
    char dev[400] = "", tcp_why[1024] = "";
    int with_dev = -1;
    for (int r = 0; r < n && with_dev < 0 && count[VIA_VERBS]; r++)
        if (rank_usable(tr, w, r, NULL, 0)) with_dev = r;
    if (with_dev >= 0) rank_usable(tr, w, with_dev, dev, sizeof dev);
    if (tr->choice == TRANSPORT_AUTO && count[VIA_TCP] && no_rdma >= 0) {
        char why[400];
        rank_usable(tr, w, no_rdma, why, sizeof why);
        snprintf(tcp_why, sizeof tcp_why, " (rank %d on %s has no RDMA: %s)", no_rdma, world_rank_info(w, no_rdma)->node_id, why);
    }
    printf("collectives: %d rank(s) on %d node(s) | transports (--transport %s): shared memory, single-copy, for %d "
           "pair(s); RDMA verbs for %d pair(s)%s%s%s; TCP for %d pair(s)%s\n",
           n, nodes, TRANSPORT_NAMES[tr->choice], count[VIA_SHM], count[VIA_VERBS], *dev ? " (" : "", dev, *dev ? ")" : "",
           count[VIA_TCP], tcp_why);
    fflush(stdout);
}

Comm *comm_init(const LaunchEnv *env, const CommOptions *opt) {
    World *w = world_create(env, opt->timeout);
    Comm *c = comm_new(w, 0, "world");
    c->rank = env->rank;
    c->size = env->world;
    c->world_ranks = xmalloc(sizeof(int) * c->size);
    for (int r = 0; r < c->size; r++) c->world_ranks[r] = r;
    world_hold(w, 1);
    c->tr = transports_open(w, opt);
    transports_check(c->tr, w);
    comm_connect(c);
    if (opt->log && env->rank == 0) log_transports(c->tr, w);
    return c;
}

Comm *comm_split(Comm *parent, int colour, int key, const char *name) {
    World *w = parent->w;
    uint32_t seq = parent->split_seq++;
    char k[128];
    int32_t mine[2] = { colour, key };
    snprintf(k, sizeof k, "split/%016llx/%u/%d", (unsigned long long)parent->id, seq, parent->rank);
    store_set(w, k, mine, sizeof mine);
    int32_t *all = xmalloc(sizeof(int32_t) * 2 * parent->size);
    for (int r = 0; r < parent->size; r++) {
        uint32_t n;
        snprintf(k, sizeof k, "split/%016llx/%u/%d", (unsigned long long)parent->id, seq, r);
        char *v = store_get(w, k, &n, "comm_split");
        if (n != sizeof mine) die("comm_split: malformed entry from rank %d", r);
        memcpy(all + 2 * r, v, sizeof mine);
        free(v);
    }
    if (colour < 0) {
        free(all);
        return NULL;
    }
    Comm *c = comm_new(w, mix64(parent->id ^ mix64(((uint64_t)seq << 32) ^ (uint32_t)colour)) | 1, name ? name : "split");
    c->world_ranks = xmalloc(sizeof(int) * parent->size);
    int n = 0; // members ordered by (key, parent rank): insertion sort over the parent ranks
    for (int r = 0; r < parent->size; r++) {
        if (all[2 * r] != colour) continue;
        int pos = n++;
        while (pos > 0) {
            int q = c->world_ranks[pos - 1], qr = 0;
            while (parent->world_ranks[qr] != q) qr++;
            if (all[2 * qr + 1] <= all[2 * r + 1]) break;
            c->world_ranks[pos] = c->world_ranks[pos - 1];
            pos--;
        }
        c->world_ranks[pos] = parent->world_ranks[r];
    }
    c->size = n;
    for (int r = 0; r < n; r++)
        if (c->world_ranks[r] == parent->world_ranks[parent->rank]) c->rank = r;
    free(all);
    world_hold(w, 1);
    c->tr = parent->tr;
    atomic_fetch_add(&c->tr->refs, 1);
    comm_connect(c);
    return c;
}

void comm_use_device(Comm *c, const DevMem *dev) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    if (c->driver || has_work_locked(c)) die("internal: comm_use_device on communicator %s while it runs operations", c->name);
    c->dev = dev;
    c->chunk_bytes = dev ? DEV_CHUNK_BYTES : CHUNK_BYTES; // every member attaches alike, so chunks match
    free(c->acc);
    c->acc = xmalloc(c->chunk_bytes);
    pthread_mutex_unlock(&c->mu);
}

double comm_busy_seconds(Comm *c) { return atomic_load(&c->busy_ns) * 1e-9; }
int comm_rank(const Comm *c) { return c->rank; }
int comm_size(const Comm *c) { return c->size; }
int comm_world_rank(const Comm *c, int r) { return c->world_ranks[r]; }
const char *comm_name(const Comm *c) { return c->name; }

// ---------------------------------------------------------------------------------------------
// the work area (see comm_count_memory)

static void set_work(Comm *c, size_t bytes, MemAccount *acct, const char *what) {
    if (c->work_acct) mem_free(c->work_acct, c->work);
    else hostmem_free(c->work);
    c->work = NULL;
    c->work_bytes = 0;
    c->work_acct = acct;
    if (!bytes) return;
    if (acct) {
        c->work = mem_host_alloc(acct, MEM_COMM, bytes, "collectives' work area");
    } else {
        c->work = hostmem_alloc(bytes);
        if (!c->work) die("out of memory: %zu bytes for a %s", bytes, what);
    }
    c->work_bytes = bytes;
}

void comm_grow_work(Comm *c, size_t bytes, const char *what) {
    if (c->work_bytes < bytes) set_work(c, bytes, c->work_acct, what);
}

void comm_count_memory(Comm *c, MemAccount *acct) {
    if (c && c->work_acct != acct) set_work(c, acct ? c->work_bytes : 0, acct, "work area");
}

const char *comm_transports(const Comm *c, char *buf, size_t cap) {
    const char *seen[8];
    int n = 0;
    size_t used = 0;
    buf[0] = 0;
    for (int r = 0; r < c->size; r++) {
        if (!c->conn[r]) continue;
        const char *name = c->conn[r]->ops->name;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= !strcmp(seen[i], name);
        if (dup || n == 8) continue;
        seen[n++] = name;
        int k = snprintf(buf + used, cap - used, "%s%s", used ? "+" : "", name);
        if (k < 0 || (size_t)k >= cap - used) break;
        used += (size_t)k;
    }
    if (!n) snprintf(buf, cap, "none");
    return buf;
}

void comm_destroy(Comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->shutdown = 1;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    for (int r = 0; r < c->size; r++)
        if (c->conn[r]) c->conn[r]->ops->close(c->conn[r]);
    shm_teardown(c->shm);
    World *w = c->w;
    transports_release(c->tr, world_timeout(w));
    free(c->conn);
    free(c->world_ranks);
    free(c->acc);
    set_work(c, 0, NULL, NULL);
    if (c->dev) {
        c->dev->free(c->dacc);
        c->dev->free(c->dwork);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
    const DevMem *dev = c->dev;
    free(c);
    if (world_hold(w, -1) == 0) {
        if (dev) dev->forget_peers(); // the last communicator: no peer's device memory is read any more
        world_destroy(w);
    }
}

// ---------------------------------------------------------------------------------------------
// the engine: whoever drives (the progress thread, or a caller waiting for its own operation while
// nobody else drives) starts queued operations in order, moves every connection, and advances the
// running collective. An operation starts only when the collective before it has finished (a
// collective posts transfers until its end), so that each connection's messages keep the order in
// which the operations were issued; sends and receives start at once and complete in any order.

static void finish(Comm *c, CommRequest *q) {
    op_release(q);
    pthread_mutex_lock(&c->mu);
    atomic_store(&q->done, 1);
    pthread_cond_broadcast(&c->done_cv);
    pthread_mutex_unlock(&c->mu);
}

static int start_queued(Comm *c) {
    int started = 0;
    pthread_mutex_lock(&c->mu);
    while (c->head && !c->cur) { // a collective posts until it ends: nothing issued later may pass it
        CommRequest *q = c->head;
        // device buffers: the kernels that wrote them must have finished (the mark of submission)
        if (q->ready && !q->dev->test(q->ready)) break;
        c->head = q->next;
        if (!c->head) c->tail = NULL;
        q->next = NULL;
        pthread_mutex_unlock(&c->mu);
        op_start(c, q);
        if (op_is_p2p(q)) {
            q->next = c->p2p;
            c->p2p = q;
        } else {
            c->cur = q;
        }
        started = 1;
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return started;
}

static int engine_idle(const Comm *c) { return !c->cur && !c->p2p; }

// One pass: start, move, advance, finish. Returns 1 when anything moved.
static int engine_pass(Comm *c) {
    int moved = start_queued(c);
    for (int r = 0; r < c->size; r++)
        if (c->conn[r] && net_busy(c->conn[r])) c->conn[r]->ops->progress(c->conn[r], &moved);
    if (c->cur) {
        moved |= op_advance(c, c->cur);
        if (op_complete(c->cur)) {
            CommRequest *q = c->cur;
            c->cur = NULL;
            finish(c, q);
            moved = 1;
        }
    }
    for (CommRequest **pp = &c->p2p; *pp;) {
        CommRequest *q = *pp;
        if (op_complete(q)) {
            *pp = q->next;
            finish(c, q);
            moved = 1;
        } else {
            pp = &q->next;
        }
    }
    return moved;
}

// Waiting without progress: spin (a peer is usually microseconds away), then yield the core, then
// sleep on the doorbell (and the TCP sockets) until a peer rings; after the timeout, die naming the
// operation, the communicator and the rank that stopped answering. A caller waiting for its own
// operation on a node with a core for each of its ranks spins longest: nothing else of this rank
// wants the core, and a rank that yields to another process loses its core for a whole time slice.
// The progress thread, which shares the rank's cores with its compute threads, and every waiter on
// an oversubscribed node, yield early.
typedef struct {
    double last_progress;
    int idle, published, spin_only;
} Waiter;

static void waiter_reset(Waiter *wt) {
    wt->last_progress = now_seconds();
    wt->idle = 0;
}

static void waiter_pass(Comm *c, Waiter *wt, int moved) {
    if (moved) {
        if (wt->published) world_set_waiting(c->w, -1, NULL, NULL), wt->published = 0;
        wt->idle = 0;
        wt->last_progress = now_seconds();
        return;
    }
    // (on an oversubscribed node every spin keeps a rank that would make progress off the core)
    if (++wt->idle < (c->oversubscribed ? 8 : 256) || (wt->spin_only && (wt->idle & 255))) {
        __builtin_ia32_pause();
        return;
    }
    double now = now_seconds();
    if (now - wt->last_progress < (wt->spin_only ? 10e-3 : 200e-6)) {
        if (!wt->spin_only) sched_yield();
        return;
    }
    CommRequest *q = c->cur ? c->cur : c->p2p;
    int peer = q ? op_waits_for(q) : -1;
    int peer_w = peer >= 0 ? c->world_ranks[peer] : -1;
    if (!wt->published && peer_w >= 0) {
        world_set_waiting(c->w, peer_w, c->op, c->name);
        wt->published = 1;
    }
    char st[128];
    const char *state = peer >= 0 && c->conn[peer] ? c->conn[peer]->ops->peer_state(c->conn[peer], st, sizeof st) : NULL;
    if (state && !strcmp(state, "died")) {
        // a rank that finished its part and exited (the last barrier) left its contribution readable:
        // look once more before blaming it
        if (engine_pass(c)) {
            waiter_pass(c, wt, 1);
            return;
        }
        world_set_failed(c->w);
        world_die_after(c->w, peer_w, "%s on communicator %s: rank %d (pid %d) died", c->op, c->name, peer_w, (int)c->conn[peer]->peer_pid);
    }
    if (now - wt->last_progress > world_timeout(c->w)) {
        world_set_failed(c->w);
        char head[256], why[256] = "";
        snprintf(head, sizeof head, "timeout: %s on communicator %s (rank %d of %d, world rank %d): no progress with rank %d for %.1f s",
                 c->op, c->name, c->rank, c->size, c->world_ranks[c->rank], peer_w, now - wt->last_progress);
        if (peer_w < 0) die("%s", head);
        if (world_root_cause(c->w, peer_w, why, sizeof why) == peer_w) world_die_after(c->w, peer_w, "%s: rank %d %s", head, peer_w, why);
        world_die_after(c->w, peer_w, "%s", head);
    }
    // queued device work finishes without ringing anything: look again soon
    if (q && q->dev) {
        sched_yield();
        return;
    }
    for (CommRequest *h = c->head; h; h = h->next)
        if (h->ready) {
            sched_yield();
            return;
        }
    // sleep until a peer rings or a socket is ready; the doorbell is armed before the last look
    uint32_t key = doorbell_arm(c->bell);
    if (engine_pass(c)) {
        doorbell_disarm(c->bell);
        waiter_pass(c, wt, 1);
        return;
    }
    NetWait nw = { 0 };
    for (int r = 0; r < c->size; r++)
        if (c->conn[r] && net_busy(c->conn[r])) c->conn[r]->ops->wait_hint(c->conn[r], &nw);
    if (nw.ready) {
        doorbell_disarm(c->bell);
    } else if (nw.nfd) {
        struct pollfd pf[NET_MAX_POLL];
        for (int i = 0; i < nw.nfd; i++) pf[i] = (struct pollfd){ .fd = nw.fd[i], .events = nw.events[i] };
        // shared-memory peers of the same operation are looked at again after at most 1 ms
        if (poll(pf, (nfds_t)nw.nfd, c->shm ? 1 : 2) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
        doorbell_disarm(c->bell);
    } else {
        doorbell_wait(c->bell, key, 20);
    }
}

// Drives until `until` is done (a caller) or no work is left (the progress thread).
static void drive(Comm *c, CommRequest *until) {
    Waiter wt = { .spin_only = until && !c->oversubscribed };
    waiter_reset(&wt);
    double tick = now_seconds();
    for (;;) {
        int moved = engine_pass(c);
        double now = now_seconds();
        if (!engine_idle(c) || moved) atomic_fetch_add(&c->busy_ns, (uint64_t)((now - tick) * 1e9));
        tick = now;
        if (until ? atomic_load(&until->done) : engine_idle(c) && !c->head) break;
        waiter_pass(c, &wt, moved);
    }
    if (wt.published) world_set_waiting(c->w, -1, NULL, NULL);
}

static int has_work(const Comm *c) { return c->head || !engine_idle(c); }

// Gives up the driver's seat (mu held): a waiting caller may take it, and the progress thread takes
// what is left.
static void release_driver(Comm *c) {
    c->driver = 0;
    pthread_cond_broadcast(&c->done_cv);
    if (has_work(c)) pthread_cond_signal(&c->work_cv);
}

static void *progress_main(void *arg) {
    Comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->shutdown && (c->driver || !has_work(c))) pthread_cond_wait(&c->work_cv, &c->mu);
        if (c->driver || !has_work(c)) break; // shut down, nothing left
        c->driver = 1;
        pthread_mutex_unlock(&c->mu);
        drive(c, NULL);
        pthread_mutex_lock(&c->mu);
        release_driver(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// public calls

static void check_args(const Comm *c, int kind, CommType t, CommOp op, int root, int peer) {
    if ((unsigned)t >= CT_NTYPES || (unsigned)op >= CT_NOPS) die("internal: bad type or op for %s", REQ_NAMES[kind]);
    if ((kind == REQ_BROADCAST && (root < 0 || root >= c->size)) ||
        ((kind == REQ_SEND || kind == REQ_RECV) && (peer < 0 || peer >= c->size || peer == c->rank)))
        die("internal: %s on communicator %s: bad peer %d", REQ_NAMES[kind], c->name, kind == REQ_BROADCAST ? root : peer);
}

// An operation on device memory (the communicator's DevMem owns its buffers) starts after the compute
// stream's work queued so far, which wrote them. Its buffers are all device or all host memory.
static void classify(Comm *c, CommRequest *q) {
    if (!c->dev) return;
    int ds = q->send && c->dev->owns(q->send), dr = q->recv && c->dev->owns(q->recv);
    if (!ds && !dr) return;
    if ((q->send && !ds) || (q->recv && !dr))
        die("internal: %s on communicator %s mixes device and host buffers", REQ_NAMES[q->kind], c->name);
    q->dev = c->dev;
    q->ready = c->dev->mark(DEV_COMPUTE);
}

static CommRequest *submit(Comm *c, int kind, const void *send, void *recv, size_t count, CommType t, CommOp op,
                           int root, int peer, int async) {
    check_args(c, kind, t, op, root, peer);
    CommRequest *q = xmalloc(sizeof *q);
    memset(q, 0, offsetof(CommRequest, inline_nr));
    q->c = c, q->kind = kind, q->send = send, q->recv = recv, q->count = count, q->t = t, q->op = op, q->root = root;
    q->peer = peer;
    classify(c, q);
    pthread_mutex_lock(&c->mu);
    if (c->tail) c->tail->next = q;
    else c->head = q;
    c->tail = q;
    int start_here = async && !c->driver;
    if (start_here) c->driver = 2;
    else if (!c->driver) pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    if (start_here) { // post its first transfers now (a send leaves at once); the progress thread does the rest
        engine_pass(c);
        pthread_mutex_lock(&c->mu);
        release_driver(c);
        pthread_mutex_unlock(&c->mu);
    } else {
        doorbell_ring(c->bell); // a driver asleep on the doorbell picks it up at once
    }
    return q;
}

CommRequest *comm_iall_reduce(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op) {
    return submit(c, REQ_ALLREDUCE, send, recv, count, t, op, 0, 0, 1);
}
CommRequest *comm_ireduce_scatter(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op) {
    return submit(c, REQ_REDUCE_SCATTER, send, recv, count, t, op, 0, 0, 1);
}
CommRequest *comm_iall_gather(Comm *c, const void *send, void *recv, size_t count, CommType t) {
    return submit(c, REQ_ALLGATHER, send, recv, count, t, OP_SUM, 0, 0, 1);
}
CommRequest *comm_ibroadcast(Comm *c, void *buf, size_t count, CommType t, int root) {
    return submit(c, REQ_BROADCAST, buf, buf, count, t, OP_SUM, root, 0, 1);
}
CommRequest *comm_isend(Comm *c, const void *buf, size_t bytes, int peer) {
    return submit(c, REQ_SEND, buf, NULL, bytes, CT_F32, OP_SUM, 0, peer, 1);
}
CommRequest *comm_irecv(Comm *c, void *buf, size_t bytes, int peer) {
    return submit(c, REQ_RECV, NULL, buf, bytes, CT_F32, OP_SUM, 0, peer, 1);
}

void comm_wait(CommRequest *q) {
    Comm *c = q->c;
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&q->done)) {
        if (!c->driver) { // nobody drives: run the engine here until this request is done
            c->driver = 2;
            pthread_mutex_unlock(&c->mu);
            drive(c, q);
            pthread_mutex_lock(&c->mu);
            release_driver(c);
        } else {
            pthread_cond_wait(&c->done_cv, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(q);
}

int comm_test(CommRequest *q) {
    if (!atomic_load(&q->done)) return 0;
    comm_wait(q);
    return 1;
}

// A blocking call: on an idle communicator the caller runs the operation itself, without queueing
// or allocating it (the latency path); otherwise it waits its turn.
static void run(Comm *c, int kind, const void *s, void *r, size_t n, CommType t, CommOp op, int root, int peer) {
    pthread_mutex_lock(&c->mu);
    if (c->driver || has_work(c) || (c->dev && ((s && c->dev->owns(s)) || (r && c->dev->owns(r))))) {
        pthread_mutex_unlock(&c->mu); // device memory goes the queued way: it waits for the compute stream
        comm_wait(submit(c, kind, s, r, n, t, op, root, peer, 0));
        return;
    }
    c->driver = 2;
    pthread_mutex_unlock(&c->mu);
    check_args(c, kind, t, op, root, peer);
    CommRequest q;
    memset(&q, 0, offsetof(CommRequest, inline_nr));
    q.c = c, q.kind = kind, q.send = s, q.recv = r, q.count = n, q.t = t, q.op = op, q.root = root, q.peer = peer;
    op_start(c, &q);
    if (op_is_p2p(&q)) q.next = c->p2p, c->p2p = &q;
    else c->cur = &q;
    drive(c, &q);
    pthread_mutex_lock(&c->mu);
    release_driver(c);
    pthread_mutex_unlock(&c->mu);
}
void comm_all_reduce(Comm *c, const void *s, void *r, size_t n, CommType t, CommOp op) { run(c, REQ_ALLREDUCE, s, r, n, t, op, 0, 0); }
void comm_reduce_scatter(Comm *c, const void *s, void *r, size_t n, CommType t, CommOp op) { run(c, REQ_REDUCE_SCATTER, s, r, n, t, op, 0, 0); }
void comm_all_gather(Comm *c, const void *s, void *r, size_t n, CommType t) { run(c, REQ_ALLGATHER, s, r, n, t, OP_SUM, 0, 0); }
void comm_broadcast(Comm *c, void *buf, size_t n, CommType t, int root) { run(c, REQ_BROADCAST, buf, buf, n, t, OP_SUM, root, 0); }
void comm_send(Comm *c, const void *buf, size_t bytes, int peer) { run(c, REQ_SEND, buf, NULL, bytes, CT_F32, OP_SUM, 0, peer); }
void comm_recv(Comm *c, void *buf, size_t bytes, int peer) { run(c, REQ_RECV, NULL, buf, bytes, CT_F32, OP_SUM, 0, peer); }

double comm_sum_double(Comm *c, double x) {
    if (!c || c->size == 1) return x;
    double *all = xmalloc(sizeof(double) * c->size);
    comm_all_gather(c, &x, all, (size_t)c->size, CT_I64); // raw bits: summed below in rank order
    double s = 0;
    for (int r = 0; r < c->size; r++) s += all[r];
    free(all);
    return s;
}

void comm_barrier(Comm *c) {
    int32_t one = 1, sum = 0;
    comm_all_reduce(c, &one, &sum, 1, CT_I32, OP_SUM);
    if (sum != c->size) die("barrier on communicator %s: expected %d ranks, counted %d", c->name, c->size, sum);
}

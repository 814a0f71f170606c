// collectives.c: communicators and the progress engine (collectives.h). It owns struct Comm and
// struct CommRequest (created, run and destroyed here); what each collective sends, receives and adds
// is in algorithms.c, which sees a communicator only as its AlgoComm and never calls back. In the
// chain it sits on the algorithms, the transport table (net.h) and the bootstrap (bootstrap.h).
//
// Read top to bottom: communicators (the world's transports, a transport for each peer from the
// table, chosen alike at both ends; connections opened on first use); the engine that runs operations
// (who drives, how a waiting rank spins, sleeps and times out); the public calls.
//
// Connections are lazy: a communicator that is made prepares its end of every pair its algorithm may
// use (shared memory: its inbox, published) but opens none; its first collective opens every pair the
// algorithm's collectives use (algo_collective_pair: fan-in every pair, ring the two neighbours,
// hierarchy the node and the cross-node ring) before it starts, and a send or receive opens only the
// pair it talks over, when it first does. The driver opens them, just before the operation starts, so
// a pair is opened by each end at that end's first operation over it; an opening never waits for the
// other end (net.h: shared memory maps the peer's inbox, TCP's higher end takes the lower one's
// connection in progress), so no order between pairs or communicators is needed, and a peer that
// never comes is an operation without progress: the timeout, or the peer seen dead, names it and the
// communicator in one line. Verbs does the same: its handshake's keys are looked for in the store
// without waiting (net_verbs.c).
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
#include "net.h"

// ---------------------------------------------------------------------------------------------
// communicators

// A communicator: its members, its connections (one transport per peer) and the engine that runs
// its operations; what the algorithms see of it is `a` (algorithms.h).
struct Comm {
    World *w;
    uint64_t id;
    char name[96];
    int *world_ranks;
    AlgoComm a;       // rank, size, connections, the operations' buffers
    void *endpoint[NET_MAX_TRANSPORTS]; // per NET_TRANSPORTS entry: what its setup returned
    NetSetup setup;   // what the transports' connect reads
    signed char *pair_tr; // [size]: the transport of each pair the algorithm may use, -1 for the others
    int coll_connected;   // the pairs of the collectives are open (the first collective opened them)
    struct Transports *tr; // shared by the world's communicators: the choice, the RDMA device
    Doorbell *bell;   // what the engine sleeps on: the shared-memory doorbell, or private_bell
    Doorbell private_bell;
    int machine_ranks;  // the world's ranks on this rank's machine (same_machine)
    int oversubscribed; // this machine runs more ranks than it has cores
    uint32_t split_seq;
    // the engine: the queue under mu; cur and p2p belong to whoever drives
    pthread_mutex_t mu;
    pthread_cond_t work_cv; // the progress thread waits here for work and for the driver's seat
    pthread_cond_t done_cv; // callers wait here for their requests
    CommRequest *head, *tail; // submitted, not started
    CommRequest *cur;         // the collective running
    CommRequest *p2p;         // started sends and receives
    int driver;               // 0: nobody drives, 1: the progress thread, 2: a caller
    int shutdown;
    pthread_t thread;
    _Atomic uint64_t busy_ns; // time operations were running
    _Atomic uint64_t progress_wakeups, sleeps, cond_waits, yields; // CommCounters
};

// A request: the queue's links and completion around the operation (algorithms.h).
struct CommRequest {
    Comm *c;
    _Atomic int done;
    struct CommRequest *next; // the queue, then the list of started sends and receives
    AlgoOp alg;               // last: its inline transfers are not cleared
};

int comm_parse_transport(const char *s) {
    if (!strcmp(s, "auto")) return TRANSPORT_AUTO;
    if (!strcmp(s, "shm")) return TRANSPORT_SHM;
    if (!strcmp(s, "tcp")) return TRANSPORT_TCP;
    if (!strcmp(s, "verbs")) return TRANSPORT_VERBS;
    return -1;
}
static const char *const TRANSPORT_NAMES[] = { "auto", "shm", "tcp", "verbs" };
int comm_parse_algo(const char *s) {
    for (int a = 0; a <= ALGO_HIER; a++)
        if (!strcmp(s, ALGO_NAMES[a])) return a; // CommAlgo numbers the algorithms as algorithms.h
    return -1;
}
const char *comm_algo(const Comm *c) { return ALGO_NAMES[c->a.algo]; }

typedef struct {
    int node, rank;
} NodeRank;
static int by_node_then_rank(const void *x, const void *y) {
    const NodeRank *a = x, *b = y;
    if (a->node != b->node) return a->node < b->node ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}
static int by_int(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    return a < b ? -1 : a > b;
}

long long comm_algo_buffer_bytes(int algo, int size, const int *node, const char **why) {
    AlgoComm a = { .size = size };
    a.node_of = xmalloc(sizeof(int) * (size_t)size);
    // nodes numbered by first appearance, as choose_algo does: the ranks sorted by (node, rank), each
    // node's first rank then gives its number in rank order (n log n: the planner asks of 16384 ranks)
    NodeRank *by = xmalloc(sizeof(NodeRank) * (size_t)size);
    int *first = xmalloc(sizeof(int) * (size_t)size);
    for (int r = 0; r < size; r++) by[r] = (NodeRank){ node[r], r };
    qsort(by, (size_t)size, sizeof(NodeRank), by_node_then_rank);
    int groups = 0;
    for (int i = 0; i < size; i++)
        if (i == 0 || by[i].node != by[i - 1].node) first[groups++] = by[i].rank;
    qsort(first, (size_t)groups, sizeof(int), by_int);
    for (int k = 0; k < groups; k++) a.node_of[first[k]] = k; // a node's number: its first rank's place among the firsts
    for (int i = 0, g = 0; i < size; i++) {
        if (i == 0 || by[i].node != by[i - 1].node) g = a.node_of[by[i].rank]; // (by[i]: the node's first rank)
        a.node_of[by[i].rank] = g;
    }
    free(by);
    free(first);
    *why = algo_choose(&a, algo);
    free(a.node_of);
    return *why ? -1 : (long long)algo_buffer_bytes(a.algo, size, a.local, a.nodes, CHUNK_BYTES);
}
int comm_machine_ranks(const Comm *c) { return c->machine_ranks; }
int comm_node(const Comm *c, int r) { return c->a.node_of[r]; }
int comm_connections(const Comm *c) {
    int k = 0;
    for (int r = 0; r < c->a.size; r++) k += c->a.conn[r] != NULL;
    return k;
}

static void *progress_main(void *arg);
static int has_work_locked(const Comm *c) { return c->head || c->cur || c->p2p; }

// Work that a driver could move: anything queued, a collective, or a connection with a receive or a
// send that is not passive (net.h). Started sends that only wait for their reader (single-copy on
// shared memory) need nobody: the progress thread is not woken for them, and their owner's next look
// (comm_wait, comm_test, its next operation) completes them.
static int needs_driver(Comm *c) {
    if (c->head || c->cur) return 1;
    if (!c->p2p) return 0;
    for (int r = 0; r < c->a.size; r++)
        if (c->a.conn[r] && net_needs_progress(c->a.conn[r])) return 1;
    for (CommRequest *q = c->p2p; q; q = q->next) // transfers complete, the request not finished yet
        if (op_complete(&q->alg)) return 1;
    return 0;
}

// What decides each pair's transport, shared by the world's communicators (the last one closes it).
// Where verbs may carry a pair (--transport verbs, or auto on more than one node), every rank opens
// its RDMA device at start and publishes in the store whether it has one ("+" and the device, or "-"
// and why not); a rank reads another's entry when it first needs it. Both ends of a pair compute
// the same answer from the same entries.
typedef struct Transports {
    _Atomic int refs;
    World *w;
    int choice;          // TransportChoice
    int algo;            // CommAlgo requested
    int verbs_considered;
    VerbsNet *vn;        // this rank's device (NULL: none)
    char why[320];       // why not, when vn is NULL
    pthread_mutex_t mu;
    signed char *usable; // per world rank: -1 not read yet, 0 or 1
    NetReach reach;      // what the table's can_connect asks
} Transports;

static int same_node(const World *w, int a, int b) {
    return !strcmp(world_rank_info(w, a)->node_id, world_rank_info(w, b)->node_id);
}
// Ranks on one machine's cores: the same boot id, or, where either is unknown, the same node.
static int same_machine(const World *w, int a, int b) {
    const char *ma = world_rank_info(w, a)->machine_id, *mb = world_rank_info(w, b)->machine_id;
    return *ma && *mb ? !strcmp(ma, mb) : same_node(w, a, b);
}

static int rank_usable(Transports *tr, World *w, int r, char *text, size_t cap);
static int reach_rdma(void *ctx, int r) {
    Transports *tr = ctx;
    return rank_usable(tr, tr->w, r, NULL, 0);
}

static Transports *transports_open(World *w, const CommOptions *opt) {
    Transports *tr = xcalloc(1, sizeof *tr);
    atomic_store(&tr->refs, 1);
    tr->w = w;
    tr->reach = (NetReach){ w, reach_rdma, tr };
    tr->choice = opt->transport;
    tr->algo = opt->algo;
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

// The transport of world ranks a and b (an index into NET_TRANSPORTS): the first that can connect
// them, among all (auto) or the one --transport forces (transports_check has refused a forced one that
// cannot reach every pair).
static int pair_transport(Transports *tr, int a, int b) {
    for (int t = 0; NET_TRANSPORTS[t]; t++) {
        if (tr->choice != TRANSPORT_AUTO && strcmp(NET_TRANSPORTS[t]->name, TRANSPORT_NAMES[tr->choice])) continue;
        if (NET_TRANSPORTS[t]->can_connect(&tr->reach, a, b)) return t;
    }
    die("internal: no transport reaches ranks %d and %d (--transport %s)", a, b, TRANSPORT_NAMES[tr->choice]);
}

// per[t] for the transport of that name (0 when this build has none).
static int pairs_via(const int *per, const char *name) {
    for (int t = 0; NET_TRANSPORTS[t]; t++)
        if (!strcmp(NET_TRANSPORTS[t]->name, name)) return per[t];
    return 0;
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

// Every pair's transport, then each transport's end of the communicator, in the table's order on
// every rank: no connection yet (connect_pair opens them). Returns 1 when every peer shares memory (the
// small collectives' slots may serve).
static int prepare_peers(Comm *c) {
    World *w = c->w;
    int me_w = c->world_ranks[c->a.rank], slots = c->a.size > 1;
    c->a.conn = xcalloc((size_t)c->a.size, sizeof(NetConn *));
    c->pair_tr = xmalloc((size_t)c->a.size);
    int *peers[NET_MAX_TRANSPORTS], np[NET_MAX_TRANSPORTS] = { 0 };
    for (int t = 0; t < NET_MAX_TRANSPORTS; t++) peers[t] = xmalloc(sizeof(int) * c->a.size);
    for (int r = 0; r < c->a.size; r++) {
        c->pair_tr[r] = -1;
        if (r == c->a.rank || !algo_uses_pair(&c->a, r)) continue;
        int t = pair_transport(c->tr, me_w, c->world_ranks[r]);
        c->pair_tr[r] = (signed char)t;
        peers[t][np[t]++] = r;
    }
    for (int r = 0; r < c->a.size; r++)
        if (r != c->a.rank && (c->pair_tr[r] < 0 || !NET_TRANSPORTS[(int)c->pair_tr[r]]->slots)) slots = 0;
    c->setup = (NetSetup){ w, c->id, c->name, c->a.rank, c->a.size, c->world_ranks, &c->a.op, algo_connections(&c->a), &c->bell, c->tr->vn };
    c->bell = &c->private_bell;
    for (int t = 0; NET_TRANSPORTS[t]; t++)
        if (np[t] && NET_TRANSPORTS[t]->setup) c->endpoint[t] = NET_TRANSPORTS[t]->setup(&c->setup, np[t], peers[t]);
    for (int t = 0; t < NET_MAX_TRANSPORTS; t++) free(peers[t]);
    return slots;
}

// Opens the pair with member r, where the algorithm may use it and it is not open yet (the driver's),
// and tells the connection whose it is (what its errors name).
static void connect_pair(Comm *c, int r) {
    if (c->a.conn[r] || c->pair_tr[r] < 0) return;
    const NetTransport *t = NET_TRANSPORTS[(int)c->pair_tr[r]];
    NetConn *pc = t->connect(c->endpoint[c->pair_tr[r]], &c->setup, r);
    pc->peer = r;
    pc->peer_world = c->world_ranks[r];
    pc->comm = c->name;
    pc->world = c->w;
    pc->opname = &c->a.op;
    c->a.conn[r] = pc;
}

// Before an operation starts: the pair of a send or receive, or every pair of the collectives.
static void connect_for(Comm *c, const AlgoOp *q) {
    if (op_is_p2p(q)) {
        connect_pair(c, q->peer);
        return;
    }
    if (c->coll_connected) return;
    for (int r = 0; r < c->a.size; r++)
        if (r != c->a.rank && algo_collective_pair(&c->a, r)) connect_pair(c, r);
    algo_connected(&c->a);
    c->coll_connected = 1;
}

// The members' nodes (numbered by first appearance) and local ranks, and the algorithm for them.
static void choose_algo(Comm *c) {
    int n = c->a.size;
    c->a.node_of = xmalloc(sizeof(int) * n);
    c->a.local_of = xmalloc(sizeof(int) * n);
    for (int r = 0; r < n; r++) {
        c->a.node_of[r] = -1, c->a.local_of[r] = 0;
        int nodes = 0;
        for (int q = 0; q < r; q++) {
            if (c->a.local_of[q] == 0) nodes++; // q was the first of its node
            if (same_node(c->w, c->world_ranks[q], c->world_ranks[r])) {
                if (c->a.node_of[r] < 0) c->a.node_of[r] = c->a.node_of[q];
                c->a.local_of[r]++;
            }
        }
        if (c->a.node_of[r] < 0) c->a.node_of[r] = nodes;
    }
    const char *why = algo_choose(&c->a, c->tr->algo);
    if (why) die("communicator %s: %s", c->name, why);
}

static void comm_connect(Comm *c) {
    World *w = c->w;
    int me_w = c->world_ranks[c->a.rank];
    choose_algo(c);
    int slots = prepare_peers(c);
    // ranks on this machine's cores, not this node's: fake nodes or namespaces on one machine share them
    c->machine_ranks = 0;
    for (int r = 0; r < world_env(w)->world; r++) c->machine_ranks += same_machine(w, r, me_w);
    c->oversubscribed = c->machine_ranks > sysconf(_SC_NPROCESSORS_ONLN);
    algo_init(&c->a, slots);
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
static void log_transports(Transports *tr, World *w, const Comm *c) {
    int n = world_env(w)->world, nodes = 0, per[NET_MAX_TRANSPORTS] = { 0 }, no_rdma = -1;
    for (int a = 0; a < n; a++) {
        int first = 1;
        for (int b = 0; b < a; b++)
            if (same_node(w, a, b)) first = 0;
        nodes += first;
        for (int b = a + 1; b < n; b++) per[pair_transport(tr, a, b)]++;
        if (no_rdma < 0 && tr->verbs_considered && !rank_usable(tr, w, a, NULL, 0)) no_rdma = a;
    }
    int shm = pairs_via(per, "shm"), tcp = pairs_via(per, "tcp"), verbs = pairs_via(per, "verbs");
    char dev[400] = "", tcp_why[1024] = "";
    int with_dev = -1;
    for (int r = 0; r < n && with_dev < 0 && verbs; r++)
        if (rank_usable(tr, w, r, NULL, 0)) with_dev = r;
    if (with_dev >= 0) rank_usable(tr, w, with_dev, dev, sizeof dev);
    if (tr->choice == TRANSPORT_AUTO && tcp && no_rdma >= 0) {
        char why[400];
        rank_usable(tr, w, no_rdma, why, sizeof why);
        snprintf(tcp_why, sizeof tcp_why, " (rank %d on %s has no RDMA: %s)", no_rdma, world_rank_info(w, no_rdma)->node_id, why);
    }
    printf("collectives: %d rank(s) on %d node(s) | transports (--transport %s): shared memory, single-copy, for %d "
           "pair(s); RDMA verbs for %d pair(s)%s%s%s; TCP for %d pair(s)%s | algorithm (--algo %s): %s on the world, "
           "%d connection(s) per rank once used%s | rank 0's machine: %d rank(s) on %ld core(s)%s\n",
           n, nodes, TRANSPORT_NAMES[tr->choice], shm, verbs, *dev ? " (" : "", dev, *dev ? ")" : "",
           tcp, tcp_why, ALGO_NAMES[tr->algo], comm_algo(c), algo_connections(&c->a),
           tr->algo == ALGO_AUTO ? " (each communicator: fan-in inside one node, hierarchical across nodes)" : "",
           c->machine_ranks, sysconf(_SC_NPROCESSORS_ONLN), c->oversubscribed ? ", oversubscribed: a waiting rank yields its core" : "");
    fflush(stdout);
}

Comm *comm_init(const LaunchEnv *env, const CommOptions *opt) {
    World *w = world_create(env, opt->timeout, opt->stop_requested);
    Comm *c = comm_new(w, 0, "world");
    c->a.rank = env->rank;
    c->a.size = env->world;
    c->world_ranks = xmalloc(sizeof(int) * c->a.size);
    for (int r = 0; r < c->a.size; r++) c->world_ranks[r] = r;
    world_hold(w, 1);
    c->tr = transports_open(w, opt);
    transports_check(c->tr, w);
    comm_connect(c);
    if (opt->log && env->rank == 0) log_transports(c->tr, w, c);
    return c;
}

Comm *comm_split(Comm *parent, int colour, int key, const char *name) {
    World *w = parent->w;
    uint32_t seq = parent->split_seq++;
    char k[128];
    int32_t mine[2] = { colour, key };
    snprintf(k, sizeof k, "split/%016llx/%u/%d", (unsigned long long)parent->id, seq, parent->a.rank);
    store_set(w, k, mine, sizeof mine);
    int32_t *all = xmalloc(sizeof(int32_t) * 2 * parent->a.size);
    for (int r = 0; r < parent->a.size; r++) {
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
    c->world_ranks = xmalloc(sizeof(int) * parent->a.size);
    int n = 0; // members ordered by (key, parent rank): insertion sort over the parent ranks
    for (int r = 0; r < parent->a.size; r++) {
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
    c->a.size = n;
    for (int r = 0; r < n; r++)
        if (c->world_ranks[r] == parent->world_ranks[parent->a.rank]) c->a.rank = r;
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
    algo_use_device(&c->a, dev);
    pthread_mutex_unlock(&c->mu);
}

double comm_busy_seconds(Comm *c) { return atomic_load(&c->busy_ns) * 1e-9; }
int comm_rank(const Comm *c) { return c->a.rank; }
int comm_size(const Comm *c) { return c->a.size; }
int comm_world_rank(const Comm *c, int r) { return c->world_ranks[r]; }
const char *comm_name(const Comm *c) { return c->name; }

void comm_count_memory(Comm *c, MemAccount *acct) {
    if (c) algo_count_memory(&c->a, acct);
}

const char *comm_transports(const Comm *c, char *buf, size_t cap) {
    const char *seen[8];
    int n = 0;
    size_t used = 0;
    buf[0] = 0;
    for (int r = 0; r < c->a.size; r++) {
        if (!c->a.conn[r]) continue;
        const char *name = c->a.conn[r]->ops->name;
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
    for (int r = 0; r < c->a.size; r++)
        if (c->a.conn[r]) c->a.conn[r]->ops->close(c->a.conn[r]);
    for (int t = 0; NET_TRANSPORTS[t]; t++)
        if (c->endpoint[t]) NET_TRANSPORTS[t]->teardown(c->endpoint[t]);
    World *w = c->w;
    transports_release(c->tr, world_timeout(w));
    free(c->a.conn);
    free(c->pair_tr);
    free(c->world_ranks);
    const DevMem *dev = c->a.dev;
    algo_free(&c->a);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
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
    op_release(&q->alg);
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
        if (q->alg.ready && !q->alg.dev->test(q->alg.ready)) break;
        c->head = q->next;
        if (!c->head) c->tail = NULL;
        q->next = NULL;
        pthread_mutex_unlock(&c->mu);
        connect_for(c, &q->alg);
        op_start(&c->a, &q->alg);
        if (op_is_p2p(&q->alg)) {
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
    for (int r = 0; r < c->a.size; r++)
        if (c->a.conn[r] && net_busy(c->a.conn[r])) c->a.conn[r]->ops->progress(c->a.conn[r], &moved);
    if (c->cur) {
        moved |= op_advance(&c->a, &c->cur->alg);
        if (op_complete(&c->cur->alg)) {
            CommRequest *q = c->cur;
            c->cur = NULL;
            finish(c, q);
            moved = 1;
        }
    }
    for (CommRequest **pp = &c->p2p; *pp;) {
        CommRequest *q = *pp;
        if (op_complete(&q->alg)) {
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
// operation on a machine with a core for each of its ranks spins longest: nothing else of this rank
// wants the core, and a rank that yields to another process loses its core for a whole time slice.
// The progress thread, which shares the rank's cores with its compute threads, and every waiter on
// an oversubscribed machine, yield early: there a spinning rank keeps the peer it waits for off the
// core (counted per machine, not per node: fake nodes or namespaces on one machine share its cores).
typedef struct {
    double last_progress;
    int idle, published, spin_only;
} Waiter;

static void waiter_reset(Waiter *wt) {
    wt->last_progress = now_seconds();
    wt->idle = 0;
}

static void waiter_progressed(Comm *c, Waiter *wt) {
    if (wt->published) world_set_waiting(c->w, -1, NULL, NULL), wt->published = 0;
    wt->idle = 0;
    wt->last_progress = now_seconds();
}

// The first part of a wait: spin, then yield. 1 while it lasts; 0 with *now set once it is over.
static int waiter_spin(Comm *c, Waiter *wt, double *now) {
    // (on an oversubscribed machine every spin keeps a rank that would make progress off the core)
    if (++wt->idle < (c->oversubscribed ? 8 : 256) || (wt->spin_only && (wt->idle & 255))) {
        __builtin_ia32_pause();
        return 1;
    }
    *now = now_seconds();
    if (*now - wt->last_progress < (wt->spin_only ? 10e-3 : 200e-6)) {
        if (!wt->spin_only) sched_yield(), atomic_fetch_add_explicit(&c->yields, 1, memory_order_relaxed);
        return 1;
    }
    return 0;
}

// A connected member of c other than `except` whose process has died (without leaving the job
// cleanly) or is stopped, as far as its transport can tell (-1: none), its state in st. A wait that
// times out names it: the peer waited for may itself be waiting, not for this rank's dead member, but
// for one of its own operations that member holds up (two live ranks each waiting for the other's
// part, neither for the dead one).
static int lost_member(Comm *c, int except, char *st, size_t cap) {
    for (int r = 0; r < c->a.size; r++) {
        NetConn *pc = c->a.conn[r];
        if (!pc || r == except || world_rank_finished(c->w, c->world_ranks[r])) continue;
        const char *state = pc->ops->peer_state(pc, st, cap);
        if (!state) continue;
        if (state != st) snprintf(st, cap, "%s", state);
        return r;
    }
    return -1;
}

// Publishes whom this rank waits for, and dies when that peer has died or the wait has timed out.
// 1 when one more look found progress after all.
static int waiter_check_peer(Comm *c, Waiter *wt, int peer, double now) {
    int peer_w = peer >= 0 ? c->world_ranks[peer] : -1;
    if (!wt->published && peer_w >= 0) {
        world_set_waiting(c->w, peer_w, c->a.op, c->name);
        wt->published = 1;
    }
    char st[128];
    NetConn *pc = peer >= 0 ? c->a.conn[peer] : NULL;
    const char *state = pc ? pc->ops->peer_state(pc, st, sizeof st) : NULL;
    if (state && !strcmp(state, "died")) {
        // a rank that finished its part and exited (the last barrier) left its contribution readable:
        // look once more before blaming it
        if (engine_pass(c)) return 1;
        world_set_failed(c->w);
        world_die_after(c->w, peer_w, "%s on communicator %s: rank %d (pid %d) died", c->a.op, c->name, peer_w, (int)pc->peer_pid);
    }
    if (now - wt->last_progress > world_timeout(c->w)) {
        world_set_failed(c->w);
        char head[256], why[256] = "";
        snprintf(head, sizeof head, "timeout: %s on communicator %s (rank %d of %d, world rank %d): no progress with rank %d for %.1f s",
                 c->a.op, c->name, c->a.rank, c->a.size, c->world_ranks[c->a.rank], peer_w, now - wt->last_progress);
        if (peer_w < 0) die("%s", head);
        int lost = lost_member(c, peer, st, sizeof st);
        if (lost >= 0)
            world_die_after(c->w, c->world_ranks[lost], "%s; rank %d (pid %d) of the communicator %s", head, c->world_ranks[lost],
                            (int)c->a.conn[lost]->peer_pid, st);
        if (world_root_cause(c->w, peer_w, why, sizeof why) == peer_w) world_die_after(c->w, peer_w, "%s: rank %d %s", head, peer_w, why);
        world_die_after(c->w, peer_w, "%s", head);
    }
    return 0;
}

// Queued device work finishes without ringing anything: 1 when the running or a queued operation
// waits for some (then the waiter looks again soon instead of sleeping).
static int waits_for_device(const Comm *c, const CommRequest *q) {
    if (q && q->alg.dev) return 1;
    for (const CommRequest *h = c->head; h; h = h->next)
        if (h->alg.ready) return 1;
    return 0;
}

// Sleeps until a peer rings or a socket is ready; the doorbell is armed before the last look.
static void waiter_sleep(Comm *c, Waiter *wt) {
    uint32_t key = doorbell_arm(c->bell);
    if (engine_pass(c)) {
        doorbell_disarm(c->bell);
        waiter_progressed(c, wt);
        return;
    }
    atomic_fetch_add_explicit(&c->sleeps, 1, memory_order_relaxed);
    NetWait nw = { 0 };
    for (int r = 0; r < c->a.size; r++)
        if (c->a.conn[r] && net_busy(c->a.conn[r])) c->a.conn[r]->ops->wait_hint(c->a.conn[r], &nw);
    if (nw.ready) {
        doorbell_disarm(c->bell);
    } else if (nw.nfd) {
        struct pollfd pf[NET_MAX_POLL];
        for (int i = 0; i < nw.nfd; i++) pf[i] = (struct pollfd){ .fd = nw.fd[i], .events = nw.events[i] };
        // peers that ring the doorbell (shared memory) are looked at again after at most 1 ms
        if (poll(pf, (nfds_t)nw.nfd, c->bell != &c->private_bell ? 1 : 2) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
        doorbell_disarm(c->bell);
    } else {
        doorbell_wait(c->bell, key, 20);
    }
}

// One step of waiting after an engine pass that moved (moved) or did not.
static void waiter_pass(Comm *c, Waiter *wt, int moved) {
    double now;
    if (moved) {
        waiter_progressed(c, wt);
        return;
    }
    if (waiter_spin(c, wt, &now)) return;
    CommRequest *q = c->cur ? c->cur : c->p2p;
    if (waiter_check_peer(c, wt, q ? op_waits_for(&q->alg) : -1, now)) waiter_progressed(c, wt);
    else if (waits_for_device(c, q)) sched_yield(), atomic_fetch_add_explicit(&c->yields, 1, memory_order_relaxed);
    else waiter_sleep(c, wt);
}

// Drives until `until` is done (a caller) or nothing is left that needs a driver (the progress thread).
static void drive(Comm *c, CommRequest *until) {
    Waiter wt = { .spin_only = until && !c->oversubscribed };
    waiter_reset(&wt);
    double tick = now_seconds();
    for (;;) {
        int moved = engine_pass(c);
        double now = now_seconds();
        if (!engine_idle(c) || moved) atomic_fetch_add(&c->busy_ns, (uint64_t)((now - tick) * 1e9));
        tick = now;
        if (until ? atomic_load(&until->done) : !needs_driver(c)) break;
        waiter_pass(c, &wt, moved);
    }
    if (wt.published) world_set_waiting(c->w, -1, NULL, NULL);
}

// Gives up the driver's seat (mu held): a waiting caller may take it, and the progress thread takes
// what is left that needs a driver (not a passive send: needs_driver).
static void release_driver(Comm *c) {
    c->driver = 0;
    pthread_cond_broadcast(&c->done_cv);
    if (needs_driver(c)) pthread_cond_signal(&c->work_cv);
}

static void *progress_main(void *arg) {
    Comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->shutdown && (c->driver || !needs_driver(c))) pthread_cond_wait(&c->work_cv, &c->mu);
        if (c->driver || !needs_driver(c)) break; // shut down, nothing left
        c->driver = 1;
        atomic_fetch_add_explicit(&c->progress_wakeups, 1, memory_order_relaxed);
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
    if ((kind == REQ_BROADCAST && (root < 0 || root >= c->a.size)) ||
        ((kind == REQ_SEND || kind == REQ_RECV) && (peer < 0 || peer >= c->a.size || peer == c->a.rank)))
        die("internal: %s on communicator %s: bad peer %d", REQ_NAMES[kind], c->name, kind == REQ_BROADCAST ? root : peer);
}

// An operation on device memory (the communicator's DevMem owns its buffers) starts after the compute
// stream's work queued so far, which wrote them. Its buffers are all device or all host memory.
static void classify(Comm *c, CommRequest *q) {
    if (!c->a.dev) return;
    int ds = q->alg.send && c->a.dev->owns(q->alg.send), dr = q->alg.recv && c->a.dev->owns(q->alg.recv);
    if (!ds && !dr) return;
    if ((q->alg.send && !ds) || (q->alg.recv && !dr))
        die("internal: %s on communicator %s mixes device and host buffers", REQ_NAMES[q->alg.kind], c->name);
    q->alg.dev = c->a.dev;
    q->alg.ready = c->a.dev->mark(DEV_COMPUTE);
}

static CommRequest *submit(Comm *c, int kind, const void *send, void *recv, size_t count, CommType t, CommOp op,
                           int root, int peer, int async) {
    check_args(c, kind, t, op, root, peer);
    CommRequest *q = xmalloc(sizeof *q);
    q->c = c, q->next = NULL;
    atomic_init(&q->done, 0);
    op_init(&q->alg, kind, send, recv, count, t, op, root, peer);
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
            atomic_fetch_add_explicit(&c->cond_waits, 1, memory_order_relaxed);
            pthread_cond_wait(&c->done_cv, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(q);
}

int comm_test(CommRequest *q) {
    Comm *c = q->c;
    if (!atomic_load(&q->done)) { // nobody may be driving it (a passive send): one pass here
        pthread_mutex_lock(&c->mu);
        int here = !c->driver;
        if (here) c->driver = 2;
        pthread_mutex_unlock(&c->mu);
        if (!here) return 0;
        engine_pass(c);
        pthread_mutex_lock(&c->mu);
        release_driver(c);
        pthread_mutex_unlock(&c->mu);
        if (!atomic_load(&q->done)) return 0;
    }
    comm_wait(q);
    return 1;
}

void comm_counters(Comm *c, CommCounters *out) {
    *out = (CommCounters){ atomic_load(&c->progress_wakeups), atomic_load(&c->sleeps), atomic_load(&c->cond_waits),
                           atomic_load(&c->yields), 0, 0 };
    for (int r = 0; r < c->a.size; r++)
        if (c->a.conn[r]) out->copies += c->a.conn[r]->copies, out->copied_bytes += c->a.conn[r]->copied_bytes;
}

// A blocking call: with nobody driving and nothing queued or running ahead of it (started sends and
// receives may be: they complete in any order, and its passes move them too), the caller runs the
// operation itself, without queueing, allocating or waking anyone (the latency path); otherwise it
// waits its turn.
static void run(Comm *c, int kind, const void *s, void *r, size_t n, CommType t, CommOp op, int root, int peer) {
    pthread_mutex_lock(&c->mu);
    if (c->driver || c->head || c->cur || (c->a.dev && ((s && c->a.dev->owns(s)) || (r && c->a.dev->owns(r))))) {
        pthread_mutex_unlock(&c->mu); // device memory goes the queued way: it waits for the compute stream
        comm_wait(submit(c, kind, s, r, n, t, op, root, peer, 0));
        return;
    }
    c->driver = 2;
    pthread_mutex_unlock(&c->mu);
    check_args(c, kind, t, op, root, peer);
    CommRequest q;
    q.c = c, q.next = NULL;
    atomic_init(&q.done, 0);
    op_init(&q.alg, kind, s, r, n, t, op, root, peer);
    connect_for(c, &q.alg);
    op_start(&c->a, &q.alg);
    if (op_is_p2p(&q.alg)) q.next = c->p2p, c->p2p = &q;
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
    if (!c || c->a.size == 1) return x;
    double *all = xmalloc(sizeof(double) * c->a.size);
    comm_all_gather(c, &x, all, (size_t)c->a.size, CT_I64); // raw bits: summed below in rank order
    double s = 0;
    for (int r = 0; r < c->a.size; r++) s += all[r];
    free(all);
    return s;
}

void comm_barrier(Comm *c) {
    int32_t one = 1, sum = 0;
    comm_all_reduce(c, &one, &sum, 1, CT_I32, OP_SUM);
    if (sum != c->a.size) die("barrier on communicator %s: expected %d ranks, counted %d", c->name, c->a.size, sum);
}

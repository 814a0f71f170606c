// net.h: moving bytes between two ranks, behind one interface (NetOps) and one table of transports
// (NetTransport, NET_TRANSPORTS), with one file per transport and what they share in net.c. In the
// communication chain (common -> sockets -> bootstrap -> transports -> algorithms -> collectives ->
// launch) the transports sit on the bootstrap (bootstrap.h: connections are set up through its store
// and acceptor) and serve the algorithms, which post transfers without knowing who carries them.
//
//   net_shm.c  ranks of one node. Small messages are copied through a ring in the receiver's
//              shared memory; larger ones are single-copy: the sender publishes where its bytes
//              are (a registered buffer, see hostmem.h, or its address for cross-memory attach) and
//              the receiver copies, or reduces, them straight from there into its own buffer.
//   net_tcp.c  ranks of different nodes: one TCP connection per pair.
//   net_verbs.c ranks of different nodes that both have an RDMA device (InfiniBand, RoCE): one
//              reliable-connected queue pair per pair, RDMA writes into registered staging buffers.
// Each implements the same operations: a posted send names a registered region, a posted receive names
// where the bytes go (or the accumulator they are reduced into), and progress moves what it can
// without blocking. Device memory (devmem.h) takes net_shm.c with CUDA IPC handles (net_ipc.cu)
// inside a node, and pinned staging (NetStaging below) through TCP or verbs across nodes.
//
// A connection (NetConn) carries messages in order in each direction. Sends and receives are posted
// as NetReq records and match one to one, in order, with the peer's: the collectives decide the
// order, both ends alike, so the transports need no tags. Nothing blocks: progress returns at once,
// and wait_hint tells the progress engine what it may sleep on when nothing moved.
#ifndef LLM4D_NET_H
#define LLM4D_NET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bootstrap.h"

// ---------------------------------------------------------------------------------------------
// posted transfers

// A reducing receive: acc[i] = in[i] for the first contribution, acc[i] (op)= in[i] after it, for
// elements of in_size bytes (incoming) and acc_size bytes (accumulator, e.g. fp32 for bf16).
typedef struct NetReduce {
    size_t in_size, acc_size;
    int first;
    void (*fn)(const struct NetReduce *r, void *acc, const void *in, size_t n);
    int type, op; // CommType and CommOp, for fn
    const struct DevMem *dev; // a device reduction (devmem.h): fn queues it
} NetReduce;

typedef struct NetReq {
    void *buf;               // send: the bytes; receive: where they go, or the accumulator
    size_t bytes;            // bytes on the wire (a reducing receive: incoming elements x in_size)
    const NetReduce *reduce; // receives only: NULL copies
    int streaming;           // receives only: a large operation's bytes, copied past the cache
    int direct;              // sends only: single-copy at any size where the receiver can read the bytes in
                             // place (a point-to-point hand-off: one copy, and its buffer waits for the reader)
    const struct DevMem *dev; // buf is device memory of this DevMem (devmem.h); NULL: host memory
    struct DevMark *mark;     // transport-private: queued device work the request waits for
    size_t done;             // bytes moved so far
    int complete;            // set by the transport; the request is then the caller's again
    int passive;             // set by the transport: nothing left for this rank to do but notice the
                             // peer's completion (a single-copy send on shared memory), so no progress
                             // thread need drive it; the next look (a wait, another operation) completes it
    int peer;                // communicator rank, for the engine
    struct NetReq *next;     // the connection's queue
    uint64_t tseq;           // transport-private
    int tstate;              // transport-private: where the request stands, 0 when posted
} NetReq;

typedef struct NetConn NetConn;
typedef struct NetOps NetOps;

struct NetConn {
    const NetOps *ops;
    int peer, peer_world;       // rank in the communicator, world rank (for messages)
    pid_t peer_pid;
    World *world;               // for naming the root cause when the peer is lost
    const char *comm;           // communicator name and the operation now running, for error lines
    const char *const *opname;
    NetReq *sq, **sq_tail;      // posted sends, in order
    NetReq *rq, **rq_tail;      // posted receives, in order
    uint64_t copies, copied_bytes; // memory copies this rank made of the connection's bytes (shm; CommCounters)
};

// What the engine may sleep on besides the communicator's doorbell (which shared-memory peers ring;
// shm_setup provides it): descriptors to poll.
typedef struct Doorbell Doorbell;
#define NET_MAX_POLL 64
typedef struct {
    int nfd;
    int fd[NET_MAX_POLL];
    short events[NET_MAX_POLL];
    int ready; // a transport found work while arming its descriptor: look again instead of sleeping
} NetWait;

// Small collectives on transports whose peers share memory (optional): each rank has two slots that
// its peers read in place. A rank writes its contribution to operation s into slot s & 1, then s
// into seq (release); a peer reads the bytes once it sees seq == s (acquire). Two slots suffice: a
// rank writes operation s + 2 only after it has read every peer's operation s + 1, which each peer
// wrote after it had read this rank's operation s.
#define NET_SLOT_BYTES 4096
typedef struct {
    _Atomic uint64_t seq;
    char pad[56];
    unsigned char data[NET_SLOT_BYTES];
} NetSlot;

struct NetOps {
    const char *name;
    // Moves what it can for the posted requests; sets *moved when anything moved. Dies with one line
    // naming the operation, the communicator and the peer when the peer is gone.
    void (*progress)(NetConn *c, int *moved);
    void (*wait_hint)(NetConn *c, NetWait *w);
    // NULL while the peer looks alive; otherwise what happened to it ("died", "is stopped (SIGSTOP)").
    const char *(*peer_state)(NetConn *c, char *buf, size_t cap);
    void (*close)(NetConn *c);
    // Optional (NULL when the transport has none): slot `parity` of this rank (mine) or of the peer,
    // and a wake-up for the peer after this rank has written its slot.
    NetSlot *(*slot)(NetConn *c, int mine, int parity);
    void (*notify)(NetConn *c);
};

static inline void net_post_send(NetConn *c, NetReq *r) {
    r->done = 0, r->complete = 0, r->passive = 0, r->next = NULL, r->tstate = 0;
    *c->sq_tail = r;
    c->sq_tail = &r->next;
}
static inline void net_post_recv(NetConn *c, NetReq *r) {
    r->done = 0, r->complete = 0, r->passive = 0, r->next = NULL, r->tstate = 0;
    *c->rq_tail = r;
    c->rq_tail = &r->next;
}
static inline int net_busy(const NetConn *c) { return c->sq || c->rq; }
// 1 when a progress pass on c could move something of this rank's: a posted receive, or a send that is
// neither complete nor passive.
static inline int net_needs_progress(const NetConn *c) {
    if (c->rq) return 1;
    for (const NetReq *q = c->sq; q; q = q->next)
        if (!q->complete && !q->passive) return 1;
    return 0;
}
// The peer is gone (died, closed the connection): dies with the message, naming the rank that
// failed first when that is another (net.c, through the bootstrap's status board).
void net_peer_lost(const NetConn *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
// Queue helpers for transports: drop completed requests from the heads.
static inline void net_pop_done(NetConn *c) {
    while (c->sq && c->sq->complete) {
        c->sq = c->sq->next;
        if (!c->sq) c->sq_tail = &c->sq;
    }
    while (c->rq && c->rq->complete) {
        c->rq = c->rq->next;
        if (!c->rq) c->rq_tail = &c->rq;
    }
}
static inline void net_conn_init(NetConn *c, const NetOps *ops) {
    c->ops = ops;
    c->sq = c->rq = NULL;
    c->sq_tail = &c->sq;
    c->rq_tail = &c->rq;
    c->copies = c->copied_bytes = 0;
}
// Reduces in_bytes of whole incoming elements, which start in_offset bytes into the message, into
// the accumulator.
static inline void net_reduce_bytes(const NetReduce *r, void *acc, size_t in_offset, const void *in, size_t in_bytes) {
    size_t first = in_offset / r->in_size;
    r->fn(r, (char *)acc + first * r->acc_size, in, in_bytes / r->in_size);
}

// Device memory (devmem.h) through a byte-stream transport (TCP, verbs): staged through pinned host
// buffers, one per direction (a connection sends one message at a time and receives one at a time).
// A send's bytes are copied out whole before its first byte leaves; a receive arrives whole in the
// staging buffer before the device copies or reduces it in. Implemented in net.c.
typedef struct {
    const struct DevMem *dev; // whose pinned host memory tx and rx are
    void *tx, *rx;
    size_t cap_tx, cap_rx;
} NetStaging;
// The host bytes to send for q (q->dev set): its staging buffer, filled by the first call.
const void *net_stage_send(NetStaging *s, NetReq *q, const char *transport);
// Where q's bytes (q->dev set) arrive, all of them; then net_stage_recv_done puts them onto the
// device (a copy, or q's reduction) and waits for it.
void *net_stage_recv(NetStaging *s, NetReq *q, const char *transport);
void net_stage_recv_done(NetStaging *s, NetReq *q);
void net_staging_free(NetStaging *s);

// ---------------------------------------------------------------------------------------------
// the transport table (as NCCL's ncclTransport): one entry per transport file, in order of
// preference; the collectives give each pair of ranks the first entry that can connect it (both ends
// compute the same answer). A communicator prepares its end entry by entry in this order when it is
// made (setup), and a transport with connect opens each pair only when the pair is first used, one
// end at a time: neither end waits for the other there, so no order between pairs is needed. Setup and
// connections go through the bootstrap (bootstrap.h).

typedef struct VerbsNet VerbsNet;

// What can_connect may ask about a pair of world ranks: their nodes (through the world), and whether a
// rank has an active RDMA device (what it published at start; rdma may be called from any thread).
typedef struct {
    World *w;
    int (*rdma)(void *ctx, int world_rank);
    void *ctx;
} NetReach;

// One communicator's connections through one transport: every member that uses the transport calls
// setup with the same peers list of the others it reaches through it (communicator ranks). The
// NetSetup stays valid for the communicator's life (connect reads it).
typedef struct {
    World *w;
    uint64_t comm_id;
    const char *comm_name;
    int rank, size;
    const int *world_ranks;
    const char *const *opname;
    int connections; // what the algorithm connects per rank, the same on every member (verbs sizes its staging by it)
    Doorbell **bell; // a transport whose peers ring this rank's doorbell points it at its own (shm)
    VerbsNet *vn;    // this process's RDMA device (verbs)
} NetSetup;

typedef struct {
    const char *name; // as --transport names it: "shm", "tcp", "verbs"
    int slots;        // its connections offer the small collectives' slots (NetOps.slot)
    // 1 when this transport can carry world ranks a and b.
    int (*can_connect)(const NetReach *r, int a, int b);
    // Optional (NULL: nothing to prepare): prepares this rank's end for peers[], opening no connection,
    // and returns the endpoint that teardown frees after the connections are closed (NULL: none).
    void *(*setup)(const NetSetup *s, int npeers, const int *peers);
    // Opens the connection to peer (one of setup's peers) when this rank first needs it, without
    // waiting for the peer to do the same; a connection whose other end is not there yet completes in
    // progress (and a peer that never comes shows as no progress, or as died).
    NetConn *(*connect)(void *endpoint, const NetSetup *s, int peer);
    void (*teardown)(void *endpoint); // NULL where setup returns no endpoint
} NetTransport;

// Shared memory (net_shm.c): ranks of one node; the endpoint holds this rank's doorbell and rings,
// made and published at setup; connect maps a peer's inbox.
extern const NetTransport NET_SHM;
// The bytes of one rank's inbox on a communicator with nlocal members on its node (itself included):
// a header and one ring of 1 MiB per member (./train plan comm counts them).
size_t shm_inbox_bytes(int nlocal);
// TCP (net_tcp.c): any pair; the lower world rank of each pair connects, the higher takes the
// connection from the bootstrap's acceptor when it arrives.
extern const NetTransport NET_TCP;
// RDMA verbs (net_verbs.c, built where <infiniband/verbs.h> is installed; libibverbs is opened at run
// time): pairs whose ranks both have an RDMA device. Connection blobs (QP number, PSN, GID/LID,
// receive buffer and rkey) go through the store, then a "ready" key per pair: no rank writes before
// its peer's queue pair can receive. Nothing is made at setup; connect makes the pair's endpoint and
// publishes its address, and progress finishes the handshake as the peer's keys appear (store_peek).
extern const NetTransport NET_VERBS;
// The table (net.c): shm, verbs (where built), tcp; NULL-terminated.
extern const NetTransport *const NET_TRANSPORTS[];
#define NET_MAX_TRANSPORTS 3

// One VerbsNet per process: the device (--ib-dev, --ib-gid-index; NULL and -1 choose), and the
// connections whose communicator is closed until their peers have closed theirs too.
#ifdef LLM4D_VERBS
VerbsNet *verbs_net_open(const char *dev, int gid_index, char *why, size_t cap); // NULL: why says
const char *verbs_net_describe(const VerbsNet *vn); // "mlx5_0 port 1, InfiniBand LID 7, MTU 4096"
// After the last communicator: waits (up to timeout_s) until every peer has closed its end, then
// releases the device. Waiting here rather than in each close lets ranks close communicators in any
// order.
void verbs_net_close(VerbsNet *vn, double timeout_s);
#endif

// ---------------------------------------------------------------------------------------------
// doorbells: a waiting rank spins briefly, then sleeps on a futex that its peers ring

struct Doorbell {
    _Atomic uint32_t seq;
    _Atomic uint32_t waiters;
    char pad[56];
};
// After publishing work for the bell's owner: wakes it if it sleeps.
void doorbell_ring(Doorbell *bell);
// A waiter arms the bell (the key it returns), looks for work once more, then either sleeps until a
// ring or timeout_ms (doorbell_wait) or, having found work, disarms.
static inline uint32_t doorbell_arm(Doorbell *bell) {
    uint32_t key = atomic_load(&bell->seq);
    atomic_fetch_add(&bell->waiters, 1);
    return key;
}
static inline void doorbell_disarm(Doorbell *bell) { atomic_fetch_sub(&bell->waiters, 1); }
void doorbell_wait(Doorbell *bell, uint32_t key, int timeout_ms); // disarms

#endif

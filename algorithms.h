// algorithms.h: what each collective sends, receives and adds (algorithms.c), for the progress engine
// (collectives.c). Not an interface for the rest of the trainer (that is collectives.h).
//
// In the communication chain (common -> sockets -> bootstrap -> transports -> algorithms ->
// collectives -> launch) it sits on the transports (net.h: connections and posted transfers) and the
// host reductions (reduce.h), and knows nothing of communicators, queues or threads: collectives.c
// owns those and embeds the two structs below, an AlgoComm in each communicator and an AlgoOp in each
// request, which the functions here read and advance.
#ifndef LLM4D_ALGORITHMS_H
#define LLM4D_ALGORITHMS_H

#include <stddef.h>
#include <stdint.h>

#include "devmem.h"
#include "mem.h"
#include "net.h"
#include "reduce.h"

#define CHUNK_BYTES (256u << 10) // accumulator bytes per chunk: a chunk's reduction stays in L2
#define DEV_CHUNK_BYTES (4u << 20) // on a device communicator: a chunk is a kernel, large enough to fill it
#define SMALL_BYTES 4096u         // all-reduces up to this size: one exchange, no all-gather
#define INLINE_REQS 16            // transfers an operation carries without allocating
#define STREAM_BYTES (16u << 20)  // operations from this size copy past the cache (half this L3)
#define RING_DEPTH 4              // a ring's chunks in flight per direction (its staging: 2 x this x a chunk)
#define RING_FILL 8               // a ring reduction's chunks per segment at least, ...
#define RING_MIN_CHUNK 4096       // ... of this many elements at least
#define HIER_PIECE_BYTES (4u << 20) // the hierarchy reduces a vector in pieces of this many accumulator bytes

// The algorithms (--algo): the owner fan-in (every pair connected), the ring (two neighbours), the
// hierarchy (fan-in inside each node, a ring across the nodes per local rank). AUTO is resolved by
// algo_choose before a communicator connects.
enum { ALGO_AUTO = 0, ALGO_FANIN, ALGO_RING, ALGO_HIER };
extern const char *const ALGO_NAMES[];

enum { REQ_ALLREDUCE, REQ_REDUCE_SCATTER, REQ_ALLGATHER, REQ_BROADCAST, REQ_SEND, REQ_RECV };
extern const char *const REQ_NAMES[];

// What the algorithms know of a communicator: its members and their connections (the communicator's),
// and the buffers its operations share (algorithms.c's: algo_init to algo_free).
typedef struct AlgoComm {
    int rank, size;
    NetConn **conn;           // [size]; NULL at this rank and for pairs not open (yet: opened on first use)
    int algo;                 // ALGO_FANIN, ALGO_RING or ALGO_HIER
    // the layout (set before algo_choose; algo_free frees it): each member's node (numbered by first
    // appearance in rank order) and local rank among its node's members
    int *node_of, *local_of;
    int nodes, local;         // nodes, and members per node (ALGO_HIER: every node alike)
    struct AlgoComm *vnode, *vcross; // ALGO_HIER: views of this rank's node (fan-in) and of its
                              // cross-node ring (the members of its local rank, one per node)
    int *to_parent;           // a view: its ranks as ranks of the communicator it views,
    int parent_size;          // and that communicator's size where its all-gathers place segments of it
    unsigned char *rbuf;      // ALGO_RING: 2 x RING_DEPTH chunks of staging (forward, backward)
    unsigned char *hbuf;      // ALGO_HIER: the node's partial sums of this rank's node segment of a
    unsigned char *hout;      // piece, and a reduce-scatter's output piece (HIER_PIECE_BYTES)
    MemAccount *bufs_acct;    // rbuf, hbuf and hout from this account (the work area's, as it was
                              // then); NULL: uncounted
    int slots;                // every peer shares memory: small collectives go through slots (net.h)
    uint64_t slot_seq;        // slot operations so far
    const char *op;           // the operation running (for error lines)
    size_t chunk_bytes;       // accumulator bytes per chunk: CHUNK_BYTES, DEV_CHUNK_BYTES with a device
    unsigned char *acc;       // one chunk's accumulator
    unsigned char *work;      // a private copy of an input that its own output overlaps
    size_t work_bytes;
    MemAccount *work_acct;    // where work comes from (algo_count_memory); NULL: uncounted
    const DevMem *dev;        // device memory the communicator moves in place (algo_use_device)
    void *dacc, *dwork;       // the device's accumulator and private copy (allocated on first use)
    size_t dwork_bytes;
} AlgoComm;

// With rank, size, node_of and local_of set: the algorithm for `requested` (ALGO_*; AUTO: fan-in on
// one node, the hierarchy across nodes with as many members on each, the ring otherwise); NULL, or why
// it cannot serve this layout (one line).
const char *algo_choose(AlgoComm *a, int requested);
// 1 when the chosen algorithm's collectives use the pair of this rank and member r (both ends of a
// pair agree): what the first collective connects.
int algo_collective_pair(const AlgoComm *a, int r);
// 1 when the algorithm may use that pair at all: its collectives', and the point-to-point pairs it
// allows (the hierarchy's neighbours in rank order); what the communicator prepares for.
int algo_uses_pair(const AlgoComm *a, int r);
// The connections per rank the algorithm's collectives hold, as ./train plan comm counts them (a
// function of the layout: the same on every member): fan-in n - 1, ring min(2, n - 1), hierarchy the
// node's L - 1 and min(2, nodes - 1) across (send/recv's neighbours in rank order can add up to two).
int algo_connections(const AlgoComm *a);
// Before any connection: whether the slots serve small collectives (shared: every peer's transport
// offers them), the host accumulator, a ring's staging, the hierarchy's buffers.
void algo_init(AlgoComm *a, int shared);
// After the communicator has opened the collectives' pairs (conn): the hierarchy's views see them.
void algo_connected(AlgoComm *a);
// Device memory from now on (NULL: none); while no operation runs. Every member attaches alike.
void algo_use_device(AlgoComm *a, const DevMem *dev);
// The work area from acct from now on (NULL: uncounted memory); see comm_count_memory.
void algo_count_memory(AlgoComm *a, MemAccount *acct);
// The bytes of host memory that algo_count_memory moves into an account for a communicator of `size`
// members, `local` per node on `nodes` nodes under algorithm `algo` (its own staging and buffers, views
// included; the work area, which grows with in-place operations, apart), with chunks of chunk_bytes
// (CHUNK_BYTES; DEV_CHUNK_BYTES on a device): what ./train plan --exact adds per communicator.
size_t algo_buffer_bytes(int algo, int size, int local, int nodes, size_t chunk_bytes);
void algo_free(AlgoComm *a); // everything algo_init and the operations allocated

// One operation: what was asked (op_init), then its running state (the driver's).
typedef struct AlgoOp {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    CommType t;
    CommOp op;
    int root, peer;
    NetReq *nr;                 // every transfer of the operation
    size_t nnr, scan;           // transfers; the first that may be incomplete
    NetReduce red_first, red_rest;
    // the owner's reduction: chunk rj of the owned range, contribution of rank rk next
    size_t own_off, own_len, chunk, rnch, rj;
    int rk, posted;
    NetReq *rrecv;              // [rnch][n-1] reducing receives
    NetReq *ag_send, *ag_recv;  // all-gather transfers, posted as the owner finishes chunks
    size_t n_ag_send, n_ag_recv;
    size_t nsend;               // the reduction's sends come first in nr
    int small, ag_posted, hold_finish;
    int slot, slot_done, slot_peer; // a small collective through the slots: done, and whom it waits for
    uint64_t seq;
    // inside the hierarchy: the input holds accumulators (in_acc), the output keeps them (acc_out),
    // and avg divides by `ranks` (0: the communicator's size)
    int in_acc, acc_out, ranks;
    struct RingOp *ring;        // ALGO_RING: the chains' state
    struct AlgoOp *child;       // ALGO_HIER: the phase running, on the view child_on
    struct AlgoComm *child_on;
    int hier, phase;            // ALGO_HIER: the phase (HIER_DONE at the end)
    size_t hoff, hlen;          // ALGO_HIER reductions: the piece of the vector in hand
    // device buffers (the communicator's DevMem owns them): the compute stream's mark at submission,
    // which the start waits for; a finished chunk's mark, which its all-gather sends wait for; the
    // last queued work's
    const DevMem *dev;
    DevMark *ready, *fin, *last;
    NetReq inline_nr[INLINE_REQS]; // last: op_init clears everything before it
} AlgoOp;

// What was asked; the running state cleared.
void op_init(AlgoOp *q, int kind, const void *send, void *recv, size_t count, CommType t, CommOp op, int root, int peer);
// Plans and posts what an operation can post at once.
void op_start(AlgoComm *c, AlgoOp *q);
// Advances what an operation does itself (the owner's reduction, reading the slots); 1 when it moved.
int op_advance(AlgoComm *c, AlgoOp *q);
// 1 when every transfer of q is complete (and its own work done).
int op_complete(AlgoOp *q);
// The rank an incomplete operation waits for (communicator rank), -1 when none.
int op_waits_for(const AlgoOp *q);
// Frees what op_start allocated, and q's device marks.
void op_release(AlgoOp *q);
static inline int op_is_p2p(const AlgoOp *q) { return q->kind == REQ_SEND || q->kind == REQ_RECV; }

#endif

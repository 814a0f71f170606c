// algorithms.h: what the collectives share inside llm4d (collectives.c, algorithms.c): the state of a
// communicator and of an operation, and the algorithms the progress engine runs. Not an interface
// for the rest of the trainer (that is collectives.h).
#ifndef LLM4D_ALGORITHMS_H
#define LLM4D_ALGORITHMS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"
#include "collectives.h"
#include "devmem.h"
#include "net.h"
#include "reduce.h"

#define CHUNK_BYTES (256u << 10) // accumulator bytes per chunk: a chunk's reduction stays in L2
#define DEV_CHUNK_BYTES (4u << 20) // on a device communicator: a chunk is a kernel, large enough to fill it
#define SMALL_BYTES 4096u         // all-reduces up to this size: one exchange, no all-gather
#define INLINE_REQS 16            // transfers an operation carries without allocating
#define STREAM_BYTES (16u << 20)  // operations from this size copy past the cache (half this L3)

enum { REQ_ALLREDUCE, REQ_REDUCE_SCATTER, REQ_ALLGATHER, REQ_BROADCAST, REQ_SEND, REQ_RECV };
extern const char *const REQ_NAMES[];

struct Comm {
    World *w;
    uint64_t id;
    char name[96];
    int rank, size;
    int *world_ranks;
    NetConn **conn;   // [size]; NULL at this rank
    void *shm;        // the shared-memory endpoint (NULL without local peers)
    struct Transports *tr; // shared by the world's communicators: the choice, the RDMA device
    Doorbell *bell;   // what the engine sleeps on: the endpoint's doorbell, or private_bell
    Doorbell private_bell;
    int slots;          // every peer shares memory: small collectives go through slots (net.h)
    int oversubscribed; // this node runs more ranks than it has cores
    uint64_t slot_seq;  // slot operations so far
    uint32_t split_seq;
    const char *op;   // the operation running (for error lines)
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
    size_t chunk_bytes;       // accumulator bytes per chunk: CHUNK_BYTES, DEV_CHUNK_BYTES with a device
    unsigned char *acc;       // one chunk's accumulator
    unsigned char *work;      // a private copy of an input that its own output overlaps
    size_t work_bytes;
    MemAccount *work_acct;    // where work comes from (comm_count_memory); NULL: uncounted
    const DevMem *dev;        // device memory this communicator moves in place (comm_use_device)
    void *dacc, *dwork;       // the device's accumulator and private copy (allocated on first use)
    size_t dwork_bytes;
    _Atomic uint64_t busy_ns; // time operations were running
};

struct CommRequest {
    Comm *c;
    int kind;
    const void *send;
    void *recv;
    size_t count;
    CommType t;
    CommOp op;
    int root, peer;
    _Atomic int done;
    struct CommRequest *next;   // the queue, then the list of started sends and receives
    // running state (the driver's)
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
    // device buffers (c->dev owns them): the compute stream's mark at submission, which the start
    // waits for; a finished chunk's mark, which its all-gather sends wait for; the last queued work's
    const DevMem *dev;
    DevMark *ready, *fin, *last;
    NetReq inline_nr[INLINE_REQS]; // last: submit() clears everything before it
};

// Makes the work area at least `bytes` (its contents are not kept).
void comm_grow_work(Comm *c, size_t bytes, const char *what);
// Plans and posts what an operation can post at once.
void op_start(Comm *c, CommRequest *q);
// Advances what an operation does itself (the owner's reduction, reading the slots); 1 when it moved.
int op_advance(Comm *c, CommRequest *q);
// 1 when every transfer of q is complete (and its own work done).
int op_complete(CommRequest *q);
// The rank an incomplete operation waits for (communicator rank), -1 when none.
int op_waits_for(const CommRequest *q);
// Frees what op_start allocated.
void op_release(CommRequest *q);
static inline int op_is_p2p(const CommRequest *q) { return q->kind == REQ_SEND || q->kind == REQ_RECV; }

#endif

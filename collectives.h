// collectives.h: communicators and hand-written collectives (collectives.c), the interface the
// trainer calls. In the communication chain (common -> sockets -> bootstrap -> transports ->
// algorithms -> collectives -> launch) it sits on the algorithms (algorithms.h); only the launcher
// (launch.h: the environment, --nproc) is above it.
//
// One process per device. The world is bootstrapped over TCP through rank 0 (MASTER_ADDR:MASTER_PORT,
// authenticated with a job token; bootstrap.c); each pair of ranks talks through the best transport
// that reaches it (net.h: shared memory inside a node, single-copy for large messages; TCP across
// nodes). Every communicator has its own connections and its own progress thread, so collectives on
// different communicators run concurrently, while the operations issued on one communicator run in
// issue order (as on a CUDA stream); a blocking call runs its operation on the caller's thread when
// the communicator is idle. Reductions add the ranks' contributions in rank order, 0, 1, ..., n-1
// (--algo fanin and ring; hier adds each node's members in rank order, then the nodes in order),
// whatever the message size, so each output element is a function of that element's inputs and the
// layout alone: bitwise the same on every rank, every run, every bucket or chunk boundary. A
// communicator connects only the pairs its algorithm uses (CommOptions.algo), and only on first use:
// none until its first operation, then the pairs of its collectives at the first collective, and a
// send/recv pair when that pair first talks (every transport).
#ifndef LLM4D_COLLECTIVES_H
#define LLM4D_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "mem.h"
#include "reduce.h" // CommType, CommOp

typedef struct LaunchEnv LaunchEnv; // bootstrap.h (launch.h reads it from the environment)

typedef struct Comm Comm;
typedef struct CommRequest CommRequest;

typedef enum { TRANSPORT_AUTO = 0, TRANSPORT_SHM, TRANSPORT_TCP, TRANSPORT_VERBS } TransportChoice;
// "auto", "shm", "tcp" or "verbs"; -1 otherwise.
int comm_parse_transport(const char *s);
typedef struct {
    double timeout;  // seconds any wait may last (connecting, every collective)
    // TransportChoice. auto: shared memory inside a node; across nodes RDMA verbs where both ranks
    // have an active RDMA port, TCP otherwise. shm, tcp and verbs force one for every pair.
    int transport;
    int log;            // rank 0 prints one line: the ranks, nodes and the transport of each pair
    const char *ib_dev; // RDMA device "name" or "name:port" (--ib-dev); NULL: the first active port
    int ib_gid_index;   // RoCE GID index (--ib-gid-index); -1: RoCE v2 over IPv4 found automatically
    // CommAlgo, for every communicator of the world (--algo). auto: the fan-in on one node, the
    // hierarchy across nodes (the ring where nodes hold different numbers of a communicator's members)
    int algo;
    // While the job forms: the stop signal a rank gives up on at once (SIGINT, SIGTERM), else 0; NULL:
    // none (world_create)
    int (*stop_requested)(void);
} CommOptions;
typedef enum { COMM_ALGO_AUTO = 0, COMM_ALGO_FANIN, COMM_ALGO_RING, COMM_ALGO_HIER } CommAlgo;
// "auto", "fanin", "ring" or "hier"; -1 otherwise.
int comm_parse_algo(const char *s);
// The host bytes a communicator of `size` members on the nodes node[0..size) (any numbering) keeps for
// its algorithm (CommAlgo, auto resolved as a communicator resolves it), which comm_count_memory counts
// as comm buffers: for ./train plan --exact, without connecting. -1, and *why, where the algorithm
// cannot serve those members.
long long comm_algo_buffer_bytes(int algo, int size, const int *node, const char **why);
// The algorithm communicator c runs ("fanin", "ring" or "hier"), and its open connections (opened on
// first use: 0 before any operation).
const char *comm_algo(const Comm *c);
int comm_connections(const Comm *c);
// Member r's node, numbered by first appearance in rank order (the hierarchy's layout).
int comm_node(const Comm *c, int r);
// The world's ranks on this rank's machine, which share its cores (counted by the kernel's boot id, so
// simulated nodes on one machine count together).
int comm_machine_ranks(const Comm *c);

// Bootstraps the world communicator.
Comm *comm_init(const LaunchEnv *env, const CommOptions *opt);
// Splits comm into sub-communicators: ranks passing the same colour form one, ordered by (key, rank).
// Collective over comm. A negative colour returns NULL (the rank joins none). name shows in errors.
Comm *comm_split(Comm *comm, int colour, int key, const char *name);
// Once every member is done with comm: its operations over, and the pairs its first collective opened
// open (a pair that carried no byte, as a broadcast's, may still be opening on a member that has
// finished its part: a barrier on an enclosing communicator first, as test_comm's test_close_order).
void comm_destroy(Comm *comm);
int comm_rank(const Comm *comm);
int comm_size(const Comm *comm);
int comm_world_rank(const Comm *comm, int rank); // world rank of a member
const char *comm_name(const Comm *comm);
// The transports this rank's connections use, e.g. "shm+verbs" ("none" with no peers).
const char *comm_transports(const Comm *comm, char *buf, size_t cap);
// Seconds this communicator's progress thread has spent running operations (for comm_ms).
double comm_busy_seconds(Comm *comm);
// What the engine did on this rank since the communicator was made, for counting the cost of a
// hand-off without a clock: the progress thread's wake-ups (each takes the driver's seat), sleeps on
// the doorbell or the sockets, callers that slept on a condition variable while another thread drove,
// yields of the core, and the copies this rank made of message bytes (shared memory: one per message
// and side that copied it; the bytes). Wake-ups, copies and bytes follow from the operations issued;
// sleeps, condition waits and yields depend on timing. Read between operations.
typedef struct {
    uint64_t progress_wakeups, sleeps, cond_waits, yields, copies, copied_bytes;
} CommCounters;
void comm_counters(Comm *comm, CommCounters *out);
// Device memory (devmem.h): from now on, operations whose buffers `dev` owns move and reduce them on
// the device (CUDA IPC inside a node, pinned staging across nodes) without the host touching their
// bytes; other operations stay on the host. Every member attaches the same device kind, before the
// communicator's first operation or between operations; an operation's buffers are all of one kind,
// on every rank. NULL detaches.
struct DevMem;
void comm_use_device(Comm *comm, const struct DevMem *dev);

// An all-reduce or reduce-scatter whose output overlaps its input otherwise than exactly in place (or,
// for a reduce-scatter, exactly on this rank's own segment) reduces from a private copy of the input: the
// communicator's work area, registered host memory that grows and is kept. comm_count_memory(c, acct)
// makes it, and the algorithm's own buffers (the ring's staging, the hierarchy's partial sums and
// output piece: algo_buffer_bytes) come from acct from now on (the rank's memory account, as comm
// buffers; the trainer counts every communicator of its layout: layout_count_memory), freeing the
// ones it had; acct NULL frees it and returns to uncounted memory, which must happen before acct goes away.
// Call it while no operation is in flight on c; c NULL (a dry build) does nothing. The trainer's own
// collectives are in place, into their own segment or into a separate buffer, so during training the
// area stays empty: counting it keeps the account whole should one ever need it.
void comm_count_memory(Comm *c, MemAccount *acct);

// Asynchronous collectives. Buffers must stay valid until the request completes. count is in
// elements; send == recv is in place. For reduce_scatter, recv holds ceil(count/n) elements: rank r
// receives elements [r·ceil(count/n), min(count, (r+1)·ceil(count/n))) of the reduction. For all_gather,
// send holds ceil(count/n) elements from each rank (the last rank's tail beyond count is ignored) and
// recv holds count.
CommRequest *comm_iall_reduce(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op);
CommRequest *comm_ireduce_scatter(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op);
CommRequest *comm_iall_gather(Comm *c, const void *send, void *recv, size_t count, CommType t);
CommRequest *comm_ibroadcast(Comm *c, void *buf, size_t count, CommType t, int root);
CommRequest *comm_isend(Comm *c, const void *buf, size_t bytes, int peer);
CommRequest *comm_irecv(Comm *c, void *buf, size_t bytes, int peer);
// Waits for completion (dies with a one-line message on timeout or a dead peer) and frees the request.
void comm_wait(CommRequest *req);
// 1 when complete (the request is then freed), 0 otherwise; with nobody driving, it makes one pass
// itself (a passive send, net.h, completes at the next look).
int comm_test(CommRequest *req);

// Blocking forms.
void comm_all_reduce(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op);
void comm_reduce_scatter(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op);
void comm_all_gather(Comm *c, const void *send, void *recv, size_t count, CommType t);
void comm_broadcast(Comm *c, void *buf, size_t count, CommType t, int root);
void comm_send(Comm *c, const void *buf, size_t bytes, int peer);
void comm_recv(Comm *c, void *buf, size_t bytes, int peer);
void comm_barrier(Comm *c);
// Sums one double per rank in rank order, so every rank gets the same bits (c may be NULL: x).
double comm_sum_double(Comm *c, double x);

#endif

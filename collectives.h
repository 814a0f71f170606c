// collectives.h: ranks, bootstrap, communicators and hand-written collectives.
//
// One process per device. The world is bootstrapped over TCP through rank 0 (MASTER_ADDR:MASTER_PORT,
// authenticated with a job token); ranks on the same node talk through shared-memory rings, ranks on
// different nodes through TCP. Every communicator has its own channels and its own progress thread,
// so collectives on different communicators run concurrently, while the operations issued on one
// communicator run in issue order (as on a CUDA stream). All reductions run in a fixed order: the
// same inputs give bitwise the same outputs on every rank and every run.
#ifndef LLM4D_COLLECTIVES_H
#define LLM4D_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

typedef enum { CT_F32 = 0, CT_BF16, CT_I32, CT_I64, CT_NTYPES } CommType;
typedef enum { OP_SUM = 0, OP_AVG, OP_MAX, CT_NOPS } CommOp;

size_t comm_type_size(CommType t);
const char *comm_type_name(CommType t);
const char *comm_op_name(CommOp op);

// How this process learned its place: filled from the environment (see launch_env_read).
typedef struct {
    int rank, world;
    int local_rank, local_world, node_rank;
    char master_addr[256];
    int master_port;
    char token[65];    // job token every rank presents to the bootstrap
    char node_id[256]; // ranks with equal node_id share memory (hostname unless LLM4D_NODE_ID is set)
} LaunchEnv;

// Reads the torchrun-style variables (RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK
// MASTER_ADDR MASTER_PORT), or Slurm's (SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID
// SLURM_JOB_NODELIST; MASTER_ADDR overrides the first node of the list). Returns 0 when neither is
// set, with env describing a world of one; dies naming the variable when one is malformed.
int launch_env_read(LaunchEnv *env);
// Expands a Slurm host list ("gpu[01-04,07],login2") and returns its first host in out.
void slurm_first_host(const char *nodelist, char *out, size_t cap);

typedef struct Comm Comm;
typedef struct CommRequest CommRequest;

// `--nproc N`: forks N local ranks running this binary with argv minus "--nproc N", each with the
// torchrun-style environment and a fresh job token; waits for them, stops them all when one fails or
// on SIGINT/SIGTERM, and returns the exit status for the launcher to exit with.
int launch_local(int nproc, int argc, char **argv);
// The SIGINT or SIGTERM that stopped the last launch_local, 0 when none did (the job ended by itself).
int launch_local_signal(void);

// Bootstraps the world communicator; timeout_s bounds every wait (connecting, every collective).
Comm *comm_init(const LaunchEnv *env, double timeout_s);
// Splits comm into sub-communicators: ranks passing the same colour form one, ordered by (key, rank).
// Collective over comm. A negative colour returns NULL (the rank joins none). name shows in errors.
Comm *comm_split(Comm *comm, int colour, int key, const char *name);
void comm_destroy(Comm *comm);
int comm_rank(const Comm *comm);
int comm_size(const Comm *comm);
int comm_world_rank(const Comm *comm, int rank); // world rank of a member
const char *comm_name(const Comm *comm);
// Seconds this communicator's progress thread has spent running operations (for comm_ms).
double comm_busy_seconds(Comm *comm);

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
// 1 when complete (the request is then freed), 0 otherwise.
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

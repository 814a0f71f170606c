// bootstrap.h: how the ranks of a job find each other (bootstrap.c). In the communication chain
// (common -> sockets -> bootstrap -> transports -> algorithms -> collectives -> launch) it sits on the
// sockets (sock.h) and serves everything above: the transports set their connections up through its
// store and acceptor, the collectives report through its status board. Rank 0 serves a key-value
// store on MASTER_ADDR:MASTER_PORT; every rank connects, presents the job token and receives the
// table of all ranks (pid, node, data address). Each rank also listens on a data port where the TCP
// transport's connections arrive; the acceptor authenticates them concurrently, so silent or
// foreign connections never delay the job. A status board in shared memory (one per node, or the
// --nproc launcher's) shows what each rank waits for, so that a timeout names the rank that stopped
// answering rather than a neighbour that waited on it.
#ifndef LLM4D_BOOTSTRAP_H
#define LLM4D_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// How this process learned its place: filled from the environment (launch.h launch_env_read).
typedef struct LaunchEnv {
    int rank, world;
    int local_rank, local_world, node_rank;
    char master_addr[256];
    int master_port;
    char token[65];    // job token every rank presents to the bootstrap
    char node_id[256]; // ranks with equal node_id share memory (hostname unless LLM4D_NODE_ID is set)
} LaunchEnv;

#define NET_MAGIC 0x344d4c4cu // "LLM4", first word of every greeting

typedef struct World World;

typedef struct {
    char token[65];
    int32_t rank, world, pid, port;
    char node_id[256];
    char ip[64];
    // the kernel's boot id (empty where unknown): ranks with equal machine_id share one machine's
    // cores, whatever their node_id says (LLM4D_NODE_ID's fake nodes, network namespaces as nodes)
    char machine_id[40];
} RankInfo;

// A data connection's greeting (TCP transport -> acceptor).
typedef struct {
    uint32_t magic;
    char token[65];
    uint64_t comm_id;
    int32_t src;
} ConnectHello;

// Joins the job described by env: names this process "<program>-r<rank>" (ps, top); rank 0 serves
// the store; every rank waits (timeout_s) for the others and dies with one line when the job cannot
// form (every rank then prints the same root cause, which rank 0 sends to those connected when a
// rank never joins). While it waits, stop (when not NULL) is asked, at least every quarter second,
// whether a stop signal came; one it returns (its number) ends the process with one line and exit
// status 128 + that number: nothing has run yet, and a peer that never comes would hold the rank
// for the whole timeout.
World *world_create(const LaunchEnv *env, double timeout_s, int (*stop)(void));
// Raises this process's soft limit on open files to its hard limit (world_create does; so does the
// --nproc launcher, which holds pipes to every rank): rank 0's store takes a socket per rank.
void raise_open_files(void);
void world_destroy(World *w); // when the last communicator goes; frees everything world_create made
int world_hold(World *w, int delta); // communicators alive (returns the count after adding delta)

const LaunchEnv *world_env(const World *w);
const RankInfo *world_rank_info(const World *w, int world_rank);
double world_timeout(const World *w);
const char *world_token(const World *w);

void store_set(World *w, const char *key, const void *val, uint32_t vlen);
// Waits (up to the timeout) for a key; returns its value (malloc'd) and length. The store answers when
// the key is set; this rank's connection to it is held 20 ms at a time, so any thread may wait here.
char *store_get(World *w, const char *key, uint32_t *vlen, const char *what);
// One look, no wait: the value (malloc'd) when the key is set, else NULL. A connection that must not
// wait for its peer (net_verbs.c's lazy handshake) looks again later.
char *store_peek(World *w, const char *key, uint32_t *vlen, const char *what);
// An authenticated data connection from world rank src for communicator comm_id; -1 at the deadline
// (a deadline already past: one look, no wait).
int world_take_connection(World *w, uint64_t comm_id, int src, double deadline);

// ---------------------------------------------------------------------------------------------
// the status board

// What a process is doing, from /proc: NULL when it runs or sleeps normally, else "died", "is
// stopped (...)".
const char *process_state(pid_t pid, char *buf, size_t cap);

// This rank waits for world rank `peer` in operation op on communicator comm (peer -1: it does not
// wait any more). Cheap: a few stores into shared memory.
void world_set_waiting(World *w, int peer, const char *op, const char *comm);
// This rank opens a connection to world rank `peer` (-1: done): what a rank waiting for it follows
// where it waits in no operation (a communicator's progress thread may connect while the caller waits
// elsewhere, so this is a field of its own).
void world_set_connecting(World *w, int peer);
void world_set_failed(World *w);
// A failure caused by world rank `peer` (it died, closed its connection, stopped answering): dies
// with the message, plus "; root cause: rank R ..." when the status board traces it further, to
// rank R. Exits quietly instead when that rank has already printed its error on the stderr this rank
// shares (under the launcher): the consequence adds nothing.
void world_die_after(World *w, int peer, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
// Follows "who waits for whom" from world rank `peer` to the rank that stopped answering. Returns
// its world rank and writes what is known about it into why ("is stopped (by SIGSTOP ...)", "died",
// "is not waiting for any rank", "is on another node").
int world_root_cause(World *w, int peer, char *why, size_t cap);
// Whether world rank `rank` has left the job cleanly (0 when there is no status board).
int world_rank_finished(const World *w, int rank);

// The launcher's side: a board for `world` ranks in a memfd the ranks inherit (its descriptor is
// passed as LLM4D_BOARD_FD). Errors every rank prints alike are then printed once.
typedef struct Board Board;
Board *board_create(int world, int *fd);
void board_destroy(Board *b, int world);
// What the launcher saw: a rank stopped by signal stopped_sig (0: continued; -1: no change), or
// terminated by it after the job failed.
void board_note(Board *b, int rank, int stopped_sig, int terminated);
// 1 when the rank printed an error line (or an identical one was printed for it).
int board_reported(Board *b, int rank);
// The root cause seen from the board alone (the launcher has no store): first waiter's chain.
int board_root_cause(Board *b, int world, int first_failed, char *why, size_t cap);

#endif

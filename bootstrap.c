// bootstrap.c: the store rank 0 serves, each rank's data-port acceptor, and the status board (see
// bootstrap.h). Read top to bottom: wire format; the status board; the store (server side); the
// acceptor; joining the job (client side); teardown.
#define _GNU_SOURCE
#include "bootstrap.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "hostmem.h"
#include "sock.h"

#define MAX_STORE_VALUE (1u << 20) // longest value the store accepts
#define GREETING_S 10.0            // an unauthenticated connection has this long to greet
#define MAX_GREETING 256           // unauthenticated connections held at once by the acceptor

typedef struct {
    uint32_t magic, type, klen, vlen;
} WireHdr;
// MSG_LOOK never waits in the store: the reply is MSG_VALUE, or MSG_ABSENT when the key is not set yet.
// MSG_WAIT (its value: a uint32 of milliseconds) is answered when the key is set, or with MSG_ABSENT
// once that long has passed (at most STORE_WAIT_MAX_MS): a rank that waits asks again (store_wait).
enum { MSG_HELLO = 1, MSG_TABLE, MSG_SET, MSG_LOOK, MSG_VALUE, MSG_ABANDON, MSG_ABSENT, MSG_WAIT };
#define STORE_WAIT_MAX_MS 5000

// ---------------------------------------------------------------------------------------------
// the status board: one slot per world rank, in shared memory

#define BOARD_MAGIC 0x64726f42344d4c4cull // "LLM4Bord"

typedef struct {
    _Atomic int32_t pid;        // 0: no rank of this node
    _Atomic int32_t waiting_on; // world rank this rank waits for; -1: none
    _Atomic int32_t failed;     // it gave up (timed out) while waiting
    _Atomic int32_t stopped;    // launcher: the signal that stopped it (0: running)
    _Atomic int32_t terminated; // launcher: it was told to stop because the job failed
    _Atomic int32_t reported;   // it printed an error line
    _Atomic int32_t connecting_to; // world rank this rank opens a connection to (its progress thread may); -1: none
    _Atomic int32_t blamed;     // 1 + the world rank its error named as the cause (0: none yet)
    _Atomic int32_t finished;   // it left the job cleanly (its last communicator destroyed)
    char op[48], comm[48];      // informational; written before waiting_on
} BoardSlot;

struct Board {
    uint64_t magic;
    int32_t world, shared_stderr; // shared_stderr: the launcher's board, whose ranks share its stderr
    _Atomic uint64_t error_hash;  // the first error line printed for the job
    _Atomic uint32_t error_written;
    char pad[36];
    BoardSlot slot[];
};

static size_t board_bytes(int world) { return sizeof(Board) + sizeof(BoardSlot) * (size_t)world; }

static Board *board_map(int fd, int world) {
    Board *b = mmap(NULL, board_bytes(world), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return b == MAP_FAILED ? NULL : b;
}

static Board *board_new(int world, int *fd, int cloexec) {
    *fd = memfd_create("llm4d-board", cloexec ? MFD_CLOEXEC : 0);
    if (*fd < 0) return NULL;
    Board *b = NULL;
    if (ftruncate(*fd, (off_t)board_bytes(world)) == 0) b = board_map(*fd, world);
    if (!b) {
        close(*fd);
        *fd = -1;
        return NULL;
    }
    b->world = world;
    for (int r = 0; r < world; r++) atomic_store(&b->slot[r].waiting_on, -1), atomic_store(&b->slot[r].connecting_to, -1);
    b->magic = BOARD_MAGIC;
    return b;
}

Board *board_create(int world, int *fd) {
    Board *b = board_new(world, fd, 0); // inherited by the ranks through exec
    if (b) b->shared_stderr = 1;
    return b;
}

void board_destroy(Board *b, int world) {
    if (b) munmap(b, board_bytes(world));
}

// /proc/PID/stat into stat[cap], and where its fields after the command name begin (at its state), or NULL.
static const char *proc_stat_fields(pid_t pid, char *stat, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    ssize_t n = read(fd, stat, cap - 1);
    close(fd);
    if (n <= 0) return NULL;
    stat[n] = 0;
    const char *p = strrchr(stat, ')'); // the state follows the command name, which may hold spaces
    return p && p[1] == ' ' ? p + 2 : NULL;
}

const char *process_state(pid_t pid, char *buf, size_t cap) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return "died";
    char stat[512];
    const char *f = proc_stat_fields(pid, stat, sizeof stat);
    if (!f) return NULL;
    switch (f[0]) {
    case 'T': snprintf(buf, cap, "is stopped (SIGSTOP or SIGTSTP)"); return buf;
    case 't': snprintf(buf, cap, "is stopped by a debugger"); return buf;
    case 'Z': case 'X': return "died";
    default: return NULL;
    }
}

// Whether a process is in its exit: killed a moment ago, its memory may be gone already (which is how a
// peer's read learns of it) while its state is not yet Z; the kernel's PF_EXITING flag (the flags field,
// the 9th) says so.
static int process_exiting(pid_t pid) {
    char stat[512];
    const char *f = proc_stat_fields(pid, stat, sizeof stat);
    unsigned flags = 0;
    return f && sscanf(f, "%*c %*d %*d %*d %*d %*d %u", &flags) == 1 && (flags & 0x4u);
}

// Whom a rank waits for: in an operation, else the peer it is connecting to (-1: none).
static int slot_waits_for(BoardSlot *s) {
    int y = atomic_load_explicit(&s->waiting_on, memory_order_acquire);
    return y >= 0 ? y : atomic_load_explicit(&s->connecting_to, memory_order_acquire);
}

// From `peer`, follow who waits for whom to the rank that stopped answering: one that is stopped,
// died on its own, or is alive but waits for nobody. Ranks that gave up or that the launcher stopped
// after the failure are passed through along what they were waiting for.
static int board_chain(Board *b, int world, int peer, const RankInfo *ranks, const char *my_node, char *why, size_t cap) {
    int x = peer;
    snprintf(why, cap, "stopped answering");
    for (int step = 0; b && step <= world; step++) {
        BoardSlot *s = &b->slot[x];
        int pid = atomic_load(&s->pid), sig = atomic_load(&s->stopped);
        if (pid == 0) break;
        if (sig) {
            snprintf(why, cap, "was stopped by signal %d (%s)", sig, sig == SIGSTOP ? "SIGSTOP" : sig == SIGTSTP ? "SIGTSTP" : "a stop signal");
            return x;
        }
        char st[96];
        const char *state = process_state(pid, st, sizeof st);
        int y = slot_waits_for(s);
        int passed_on = atomic_load(&s->failed) || atomic_load(&s->terminated), named = atomic_load(&s->blamed) - 1;
        // a rank that gave up named its cause; what it waited for last may be another rank that waits
        // for it, or nobody once it has stopped waiting
        if (passed_on && named >= 0 && named < world && named != x) y = named;
        if (!state && !passed_on && process_exiting(pid)) state = "died"; // (on its own: nobody stopped it)
        if (state && (strcmp(state, "died") || !passed_on || y < 0)) {
            snprintf(why, cap, "%s", state);
            return x;
        }
        if (y < 0 || y >= world) {
            snprintf(why, cap, "stopped answering (it is not waiting for any rank: busy or hung outside the collectives)");
            return x;
        }
        if (y == peer && step > 0) { // a cycle: report where we started
            snprintf(why, cap, "stopped answering (ranks wait for each other in a cycle)");
            return peer;
        }
        x = y;
    }
    if (ranks && my_node && strcmp(ranks[x].node_id, my_node) != 0)
        snprintf(why, cap, "stopped answering (it runs on node %s)", ranks[x].node_id);
    return x;
}

int board_reported(Board *b, int rank) { return b && atomic_load(&b->slot[rank].reported); }

void board_note(Board *b, int rank, int stopped_sig, int terminated) {
    if (!b) return;
    if (stopped_sig >= 0) atomic_store(&b->slot[rank].stopped, stopped_sig);
    if (terminated) atomic_store(&b->slot[rank].terminated, 1);
}

int board_root_cause(Board *b, int world, int first_failed, char *why, size_t cap) {
    int y = slot_waits_for(&b->slot[first_failed]);
    if (y < 0 || y >= world) {
        snprintf(why, cap, "failed");
        return first_failed;
    }
    return board_chain(b, world, y, NULL, NULL, why, cap);
}

// die()'s filter (installed on the launcher's board, whose ranks share one stderr): the first rank
// to report a line prints it; an identical line from another rank waits until it is out, then the
// rank exits quietly.
static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
    return h | 1;
}
static int board_claim(const char *line, void *ctx);
static void board_printed(void *ctx);

// ---------------------------------------------------------------------------------------------
// process-wide state of one job

typedef struct PendingConn { // an authenticated data connection waiting for its communicator
    uint64_t comm_id;
    int src, fd;
    struct PendingConn *next;
} PendingConn;

typedef struct Store Store;

struct World {
    LaunchEnv env;
    double timeout;
    RankInfo *ranks; // [world]
    int store_fd;    // this rank's connection to the store
    pthread_mutex_t store_mu;
    Store *store;    // rank 0
    int data_listen_fd, wake[2];
    pthread_t acceptor;
    pthread_mutex_t pending_mu;
    pthread_cond_t pending_cv;
    PendingConn *pending;
    Board *board;    // NULL when none could be made
    int board_fd, board_mine; // board_mine: this rank created or mapped it (unmap at the end)
    int refs;                 // communicators alive
    int forming;              // inside world_create: its waits ask stop
    int (*stop)(void);
};

int world_hold(World *w, int delta) { return w->refs += delta; }

static int board_claim(const char *line, void *ctx) {
    Board *b = ((World *)ctx)->board;
    uint64_t h = str_hash(line), zero = 0;
    if (atomic_compare_exchange_strong(&b->error_hash, &zero, h)) return 1;
    if (zero != h) return 1; // a different error: print it too
    for (int i = 0; i < 500 && !atomic_load(&b->error_written); i++) usleep(10000);
    atomic_store(&b->slot[((World *)ctx)->env.rank].reported, 1); // said for it, by another rank
    return 0;
}
static void board_printed(void *ctx) {
    World *w = ctx;
    atomic_store(&w->board->error_written, 1);
    atomic_store(&w->board->slot[w->env.rank].reported, 1);
}

void world_die_after(World *w, int peer, const char *fmt, ...) {
    char line[1024], why[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int root = peer >= 0 && peer < w->env.world ? world_root_cause(w, peer, why, sizeof why) : -1;
    if (w->board && root >= 0 && root != w->env.rank) atomic_store(&w->board->slot[w->env.rank].blamed, root + 1);
    if (w->board && w->board->shared_stderr && root >= 0 && root != w->env.rank &&
        (atomic_load(&w->board->slot[root].reported) || atomic_load(&w->board->slot[peer].reported)))
        exit(1); // the rank that failed first said why, on the same stderr: this is only its consequence
    if (root >= 0 && root != peer && n >= 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "; root cause: rank %d %s", root, why);
    die("%s", line);
}

const LaunchEnv *world_env(const World *w) { return &w->env; }
const RankInfo *world_rank_info(const World *w, int r) { return &w->ranks[r]; }
double world_timeout(const World *w) { return w->timeout; }
const char *world_token(const World *w) { return w->env.token; }

void world_set_waiting(World *w, int peer, const char *op, const char *comm) {
    if (!w->board) return;
    BoardSlot *s = &w->board->slot[w->env.rank];
    if (peer >= 0) {
        snprintf(s->op, sizeof s->op, "%s", op ? op : "?");
        snprintf(s->comm, sizeof s->comm, "%s", comm ? comm : "?");
    }
    atomic_store_explicit(&s->waiting_on, peer, memory_order_release);
}

void world_set_connecting(World *w, int peer) {
    if (w->board) atomic_store_explicit(&w->board->slot[w->env.rank].connecting_to, peer, memory_order_release);
}

void world_set_failed(World *w) {
    if (w->board) atomic_store(&w->board->slot[w->env.rank].failed, 1);
}

int world_rank_finished(const World *w, int rank) { return w->board && atomic_load(&w->board->slot[rank].finished); }

int world_root_cause(World *w, int peer, char *why, size_t cap) {
    return board_chain(w->board, w->env.world, peer, w->ranks, w->env.node_id, why, cap);
}

// ---------------------------------------------------------------------------------------------
// the store (rank 0): one thread per connection, a key-value hash table under a lock

typedef struct KV {
    char *key, *val;
    uint32_t vlen;
    struct KV *next;
} KV;

typedef struct StoreConn {
    Store *s;
    int fd, rank; // rank: -1 until it has greeted
    char peer[64];
    const char *want;  // the key a MSG_WAIT of this connection waits for, else NULL
    pthread_cond_t cv; // signalled when want is set (CLOCK_MONOTONIC)
    struct StoreConn *next;
} StoreConn;

struct Store {
    LaunchEnv env;
    double timeout, join_deadline;
    int listen_fd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; // CLOCK_MONOTONIC
    KV **kv; // kv_buckets chains (a power of two), the newest of a key first
    size_t kv_buckets;
    RankInfo *ranks;
    int joined, abandoned, closing;
    char abandon[512];
    StoreConn *conns; // live connections (closed at teardown)
    int live;
    unsigned long requests, formed_at; // SET, LOOK and WAIT served; how many when the job had formed
};

static void store_conn_end(StoreConn *sc) {
    Store *s = sc->s;
    pthread_mutex_lock(&s->mu);
    for (StoreConn **p = &s->conns; *p; p = &(*p)->next)
        if (*p == sc) {
            *p = sc->next;
            break;
        }
    close(sc->fd);
    pthread_cond_destroy(&sc->cv);
    free(sc);
    s->live--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

// Whether rank r's connection to the store is open (it joined and has not closed it).
static int store_has_rank(Store *s, int r) {
    pthread_mutex_lock(&s->mu);
    int found = 0;
    for (StoreConn *c = s->conns; c && !found; c = c->next) found = c->rank == r;
    pthread_mutex_unlock(&s->mu);
    return found;
}

static int send_msg(int fd, uint32_t type, const void *v, uint32_t vlen, double deadline) {
    WireHdr h = { NET_MAGIC, type, 0, vlen };
    return tcp_write_all(fd, &h, sizeof h, deadline) || tcp_write_all(fd, v, vlen, deadline);
}

// Tells the connection why it is refused and ends it; -1.
static int store_reject(StoreConn *sc, const char *why) {
    warn("bootstrap: rejected a connection from %s: %s", sc->peer, why);
    char msg[256];
    snprintf(msg, sizeof msg, "bootstrap: rank 0 rejected this rank: %s", why);
    send_msg(sc->fd, MSG_ABANDON, msg, (uint32_t)strlen(msg), now_seconds() + 1.0); // best effort
    store_conn_end(sc);
    return -1;
}

// A condition variable whose timed waits take CLOCK_MONOTONIC time points (timespec_at).
static void cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(cv, &ca) != 0) die("pthread init failed");
    pthread_condattr_destroy(&ca);
}

static void timespec_at(struct timespec *ts, double t) { // a CLOCK_MONOTONIC time point
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

// Waits until every rank has joined; at the deadline composes the reason the job is abandoned.
static int store_wait_joined(Store *s) {
    struct timespec ts;
    timespec_at(&ts, s->join_deadline);
    while (s->joined < s->env.world && !s->abandoned && !s->closing && now_seconds() < s->join_deadline)
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    if (s->joined == s->env.world) return 1;
    if (!s->abandoned && !s->closing) {
        s->abandoned = 1;
        int missing = 0, n;
        n = snprintf(s->abandon, sizeof s->abandon, "timeout: bootstrap: not every rank joined within %.1f s: rank", s->timeout);
        for (int r = 0; r < s->env.world && n < (int)sizeof s->abandon - 64; r++)
            if (s->ranks[r].world == 0) n += snprintf(s->abandon + n, sizeof s->abandon - n, "%s %d", missing++ ? "," : "", r);
        snprintf(s->abandon + n, sizeof s->abandon - n, " of %d never joined; rank 0 abandons the job", s->env.world);
        // Tell every connected rank why, rank 0's own connection last: once rank 0 reads it, it
        // exits, and the others must have their copy in their sockets by then.
        for (int last = 0; last < 2; last++)
            for (StoreConn *c = s->conns; c; c = c->next)
                if (c->rank >= 0 && (c->rank == 0) == last)
                    send_msg(c->fd, MSG_ABANDON, s->abandon, (uint32_t)strlen(s->abandon), now_seconds() + 1.0);
        pthread_cond_broadcast(&s->cv);
    }
    return 0;
}

// A rank holds a socket for each peer it reaches over TCP or verbs, and rank 0 one for each rank of the
// job (the store): more than the 1024 open files login shells and Slurm often pass on as the soft
// limit, past a thousand ranks. So the soft limit goes up to the hard one, as far as the kernel allows
// (an unlimited hard limit is capped by fs.nr_open); where it cannot, the limit stays, and running out
// says so (die_if_out_of_files, sock.h).
void raise_open_files(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) die("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    if (rl.rlim_cur == rl.rlim_max) return;
    rlim_t want = rl.rlim_max;
    FILE *f = rl.rlim_max == RLIM_INFINITY ? fopen("/proc/sys/fs/nr_open", "r") : NULL;
    unsigned long long cap;
    if (f) {
        if (fscanf(f, "%llu", &cap) == 1) want = (rlim_t)cap;
        fclose(f);
    }
    if (want <= rl.rlim_cur) return;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return; // kept: the limit stays what it was
}

// A rank's greeting: checked, recorded, and answered with the table once every rank has joined.
// 0 when the connection is to go on serving the rank; otherwise the connection has been ended.
static int store_join(StoreConn *sc) {
    Store *s = sc->s;
    WireHdr h;
    RankInfo info;
    double hello_deadline = now_seconds() + GREETING_S;
    if (tcp_read_all(sc->fd, &h, sizeof h, hello_deadline) != 0) return store_reject(sc, "no greeting");
    if (h.magic != NET_MAGIC || h.type != MSG_HELLO || h.klen != 0 || h.vlen != sizeof info)
        return store_reject(sc, "not an llm4d greeting");
    if (tcp_read_all(sc->fd, &info, sizeof info, hello_deadline) != 0) return store_reject(sc, "truncated greeting");
    info.token[sizeof info.token - 1] = 0;
    info.node_id[sizeof info.node_id - 1] = 0;
    info.ip[sizeof info.ip - 1] = 0;
    info.machine_id[sizeof info.machine_id - 1] = 0;
    if (strcmp(info.token, s->env.token) != 0) return store_reject(sc, "wrong job token");
    if (info.world != s->env.world || info.rank < 0 || info.rank >= info.world)
        return store_reject(sc, "rank or world size does not match this job");
    pthread_mutex_lock(&s->mu);
    if (s->ranks[info.rank].world != 0) {
        pthread_mutex_unlock(&s->mu);
        return store_reject(sc, "rank already joined");
    }
    if (s->abandoned) { // too late: the job is over
        char why[512];
        snprintf(why, sizeof why, "%s", s->abandon);
        pthread_mutex_unlock(&s->mu);
        send_msg(sc->fd, MSG_ABANDON, why, (uint32_t)strlen(why), now_seconds() + 1.0);
        store_conn_end(sc);
        return -1;
    }
    s->ranks[info.rank] = info;
    s->joined++;
    sc->rank = info.rank;
    pthread_cond_broadcast(&s->cv);
    int ok = store_wait_joined(s); // at the deadline, the ranks are told why the job is abandoned
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        store_conn_end(sc);
        return -1;
    }
    uint32_t tbytes = (uint32_t)(sizeof(RankInfo) * s->env.world);
    RankInfo *table = xmalloc(tbytes);
    memcpy(table, s->ranks, tbytes);
    for (int r = 0; r < s->env.world; r++) memset(table[r].token, 0, sizeof table[r].token);
    int bad = send_msg(sc->fd, MSG_TABLE, table, tbytes, now_seconds() + s->timeout);
    free(table);
    if (bad) store_conn_end(sc);
    return bad ? -1 : 0;
}

// The chain key belongs to. Under s->mu.
static KV **store_chain(Store *s, const char *key) { return &s->kv[str_hash(key) & (s->kv_buckets - 1)]; }

// The newest value of key, or NULL. Under s->mu.
static KV *store_find(Store *s, const char *key) {
    for (KV *kv = *store_chain(s, key); kv; kv = kv->next)
        if (!strcmp(kv->key, key)) return kv;
    return NULL;
}

// One SET, LOOK or WAIT of the joined rank; 0 to serve the next, -1 when the connection is done.
static int store_serve_one(StoreConn *sc) {
    Store *s = sc->s;
    WireHdr h;
    if (tcp_read_all(sc->fd, &h, sizeof h, 1e18) != 0) return -1;
    if (h.magic != NET_MAGIC || h.klen == 0 || h.klen > 4096 || h.vlen > MAX_STORE_VALUE ||
        !(h.type == MSG_SET || (h.type == MSG_LOOK && h.vlen == 0) || (h.type == MSG_WAIT && h.vlen == sizeof(uint32_t)))) {
        warn("bootstrap: malformed request from rank %d; dropping its connection", sc->rank);
        return -1;
    }
    char *key = xmalloc(h.klen + 1), *val = xmalloc(h.vlen + 1);
    if (tcp_read_all(sc->fd, key, h.klen, now_seconds() + s->timeout) ||
        tcp_read_all(sc->fd, val, h.vlen, now_seconds() + s->timeout)) {
        free(key);
        free(val);
        return -1;
    }
    key[h.klen] = 0;
    pthread_mutex_lock(&s->mu);
    s->requests++;
    if (h.type == MSG_SET) {
        if (!strcmp(key, "attached/all")) s->formed_at = s->requests;
        KV **b = store_chain(s, key);
        KV *kv = xmalloc(sizeof *kv);
        *kv = (KV){ key, val, h.vlen, *b };
        *b = kv;
        for (StoreConn *c = s->conns; c; c = c->next) // whoever waits for it
            if (c->want && !strcmp(c->want, key)) pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    KV *found = store_find(s, key);
    if (!found && h.type == MSG_WAIT) {
        uint32_t ms;
        memcpy(&ms, val, sizeof ms);
        struct timespec ts;
        timespec_at(&ts, now_seconds() + (ms < STORE_WAIT_MAX_MS ? ms : STORE_WAIT_MAX_MS) / 1e3);
        sc->want = key;
        int rc = 0;
        while (!(found = store_find(s, key)) && !s->closing && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&sc->cv, &s->mu, &ts);
        sc->want = NULL;
    }
    free(val);
    free(key);
    if (!found) {
        int closing = s->closing;
        pthread_mutex_unlock(&s->mu);
        return closing || send_msg(sc->fd, MSG_ABSENT, NULL, 0, now_seconds() + s->timeout) ? -1 : 0;
    }
    uint32_t vlen = found->vlen;
    char *copy = xmalloc(vlen + 1);
    memcpy(copy, found->val, vlen);
    pthread_mutex_unlock(&s->mu);
    int bad = send_msg(sc->fd, MSG_VALUE, copy, vlen, now_seconds() + s->timeout);
    free(copy);
    return bad ? -1 : 0;
}

// A connection to the store: the greeting, then SET and GET until the rank disconnects (or the store
// closes).
static void *store_conn_main(void *arg) {
    StoreConn *sc = arg;
    if (store_join(sc) != 0) return NULL;
    while (store_serve_one(sc) == 0) {}
    store_conn_end(sc);
    return NULL;
}

static void *store_main(void *arg) {
    Store *s = arg;
    for (;;) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&a, &len, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            die_if_out_of_files(errno, "bootstrap: rank 0 cannot accept a rank's connection to the store");
            return NULL; // shut down at teardown
        }
        tcp_set_options(fd);
        StoreConn *sc = xcalloc(1, sizeof *sc);
        sc->s = s;
        sc->fd = fd;
        sc->rank = -1;
        cond_init_monotonic(&sc->cv);
        if (!inet_ntop(AF_INET, &a.sin_addr, sc->peer, sizeof sc->peer)) snprintf(sc->peer, sizeof sc->peer, "?");
        pthread_mutex_lock(&s->mu);
        if (s->closing) {
            pthread_mutex_unlock(&s->mu);
            close(fd);
            pthread_cond_destroy(&sc->cv);
            free(sc);
            continue;
        }
        sc->next = s->conns;
        s->conns = sc;
        s->live++;
        pthread_mutex_unlock(&s->mu);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, store_conn_main, sc) != 0) die("pthread_create: %s", strerror(errno));
        pthread_attr_destroy(&at);
    }
}

// The --nproc launcher's listening socket for the store (LLM4D_STORE_FD), when it is one on `port`;
// else -1 (rank 0 then binds the port itself, as under srun or torchrun).
static int inherited_listener(int port) {
    const char *v = getenv("LLM4D_STORE_FD");
    if (!v) return -1;
    int fd = atoi(v), listening = 0;
    unsetenv("LLM4D_STORE_FD");
    struct sockaddr_in a;
    socklen_t len = sizeof a, ilen = sizeof listening;
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0 || a.sin_family != AF_INET || ntohs(a.sin_port) != port ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) != 0 || !listening)
        return -1;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) die("fcntl: %s", strerror(errno));
    return fd;
}

static Store *store_start(const LaunchEnv *env, double timeout, int *port) {
    Store *s = xcalloc(1, sizeof *s);
    s->env = *env;
    s->timeout = timeout;
    s->join_deadline = now_seconds() + timeout;
    s->ranks = xcalloc((size_t)env->world, sizeof(RankInfo));
    for (s->kv_buckets = 64; s->kv_buckets < 4 * (size_t)env->world; s->kv_buckets *= 2) {} // a few keys a rank
    s->kv = xcalloc(s->kv_buckets, sizeof(KV *));
    if (pthread_mutex_init(&s->mu, NULL)) die("pthread init failed");
    cond_init_monotonic(&s->cv);
    s->listen_fd = inherited_listener(*port);
    if (s->listen_fd < 0) s->listen_fd = tcp_listen_any(port);
    if (s->listen_fd < 0) die("bootstrap: cannot listen on port %d (MASTER_PORT): %s", env->master_port, strerror(errno));
    if (pthread_create(&s->thread, NULL, store_main, s) != 0) die("pthread_create: %s", strerror(errno));
    return s;
}

static void store_stop(Store *s) {
    pthread_mutex_lock(&s->mu);
    // the other ranks may still need the store as they close (net_verbs.c: a verbs pair finishing its
    // handshake in verbs_net_close): it serves until every rank has said goodbye, or the timeout
    struct timespec ts;
    double deadline = now_seconds() + s->timeout;
    timespec_at(&ts, deadline);
    while (s->live > 0 && now_seconds() < deadline) pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    s->closing = 1;
    for (StoreConn *c = s->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR), pthread_cond_signal(&c->cv);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    shutdown(s->listen_fd, SHUT_RDWR); // accept() returns: the listener thread ends
    pthread_join(s->thread, NULL);
    close(s->listen_fd);
    pthread_mutex_lock(&s->mu);
    while (s->live > 0) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    // LLM4D_STORE_STATS (for tests): what the store served, and how much of it before the job formed
    if (getenv("LLM4D_STORE_STATS"))
        fprintf(stderr, "bootstrap store: %lu requests until the job had formed, %lu in all, from %d ranks\n", s->formed_at,
                s->requests, s->env.world);
    for (size_t b = 0; b < s->kv_buckets; b++)
        for (KV *kv = s->kv[b], *next; kv; kv = next) {
            next = kv->next;
            free(kv->key);
            free(kv->val);
            free(kv);
        }
    free(s->kv);
    free(s->ranks);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

// ---------------------------------------------------------------------------------------------
// the store, from a rank

static void store_lost(World *w) {
    world_die_after(w, 0, "bootstrap store: lost the connection to rank 0 (%s:%d)", w->env.master_addr, w->env.master_port);
}

void store_set(World *w, const char *key, const void *val, uint32_t vlen) {
    WireHdr h = { NET_MAGIC, MSG_SET, (uint32_t)strlen(key), vlen };
    double dl = now_seconds() + w->timeout;
    pthread_mutex_lock(&w->store_mu);
    if (tcp_write_all(w->store_fd, &h, sizeof h, dl) || tcp_write_all(w->store_fd, key, h.klen, dl) ||
        tcp_write_all(w->store_fd, val, vlen, dl))
        store_lost(w);
    pthread_mutex_unlock(&w->store_mu);
}

// One look for key (wait_ms 0), or one wait of up to wait_ms for it to be set, under this rank's lock
// of the connection for the round trip: NULL when it is not set (yet).
static char *store_ask(World *w, const char *key, uint32_t wait_ms, uint32_t *vlen, const char *what) {
    WireHdr h = { NET_MAGIC, wait_ms ? MSG_WAIT : MSG_LOOK, (uint32_t)strlen(key), wait_ms ? (uint32_t)sizeof wait_ms : 0 };
    double dl = now_seconds() + w->timeout + wait_ms / 1e3;
    pthread_mutex_lock(&w->store_mu);
    if (tcp_write_all(w->store_fd, &h, sizeof h, dl) || tcp_write_all(w->store_fd, key, h.klen, dl) ||
        (wait_ms && tcp_write_all(w->store_fd, &wait_ms, sizeof wait_ms, dl)))
        store_lost(w);
    int rc = tcp_read_all(w->store_fd, &h, sizeof h, dl);
    if (rc == TCP_CLOSED)
        world_die_after(w, 0, "%s: rank 0 at %s:%d closed the bootstrap connection (it exited)", what, w->env.master_addr, w->env.master_port);
    if (rc != 0) die("timeout: %s: rank 0's bootstrap store did not answer within %.1f s", what, w->timeout);
    if (h.magic != NET_MAGIC || h.vlen > MAX_STORE_VALUE || !(h.type == MSG_VALUE || (h.type == MSG_ABSENT && !h.vlen)))
        die("bootstrap store: malformed reply");
    if (h.type == MSG_ABSENT) {
        pthread_mutex_unlock(&w->store_mu);
        return NULL;
    }
    char *v = xmalloc(h.vlen + 1);
    if (tcp_read_all(w->store_fd, v, h.vlen, dl) != 0) die("bootstrap store: truncated reply");
    pthread_mutex_unlock(&w->store_mu);
    v[h.vlen] = 0;
    *vlen = h.vlen;
    return v;
}
char *store_peek(World *w, const char *key, uint32_t *vlen, const char *what) { return store_ask(w, key, 0, vlen, what); }

// Waits until the key is set, in waits of wait_ms in the store (which answers as soon as it is set:
// no rank polls, so a job of thousands of ranks does not flood rank 0). The lock is free between
// waits (50 us apart), so that another thread of this rank (a communicator's engine opening a verbs
// pair, which may be what the key waits for) is held up by at most one wait: once communicators
// exist, wait_ms is STORE_WAIT_MS; before (world_create), longer. Between waits check (when not NULL)
// may die with a better reason than the timeout's, and is told when the timeout has passed (late).
#define STORE_WAIT_MS 20
#define STORE_WAIT_START_MS 1000
#define FORMING_LOOK_MS 250 // how often world_create's waits ask whether to stop (a signal cuts it short)

// Inside world_create, between waits: ends the process when a stop signal came (world_create).
static void forming_stop(World *w, const char *waiting) {
    int sig = w->forming && w->stop ? w->stop() : 0;
    if (!sig) return;
    fflush(stdout);
    fprintf(stderr, "received %s while the job was forming (rank %d of %d, %s): stopping; nothing had run yet\n",
            sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a stop signal", w->env.rank, w->env.world, waiting);
    exit(128 + sig);
}

static char *store_wait(World *w, const char *key, uint32_t wait_ms, uint32_t *vlen, const char *what,
                        void (*check)(World *, int r, int late), int r) {
    double deadline = now_seconds() + w->timeout;
    for (;;) {
        char *v = store_ask(w, key, wait_ms, vlen, what);
        if (v) return v;
        int late = now_seconds() > deadline;
        forming_stop(w, "waiting for every rank to start");
        if (check) check(w, r, late);
        if (late) die("timeout: %s: waited %.1f s for '%s' from the bootstrap store", what, w->timeout, key);
        struct timespec ts = { 0, 50000 };
        nanosleep(&ts, NULL);
    }
}
char *store_get(World *w, const char *key, uint32_t *vlen, const char *what) {
    return store_wait(w, key, STORE_WAIT_MS, vlen, what, NULL, -1);
}

// ---------------------------------------------------------------------------------------------
// the data-port acceptor: greets every incoming connection at once, each with a short deadline, and
// parks the authenticated ones until their communicator takes them

typedef struct {
    int fd;
    double deadline;
    size_t got;
    ConnectHello hello;
    char peer[64];
} Greeting;

static void greeting_reject(World *w, Greeting *g, const char *why) {
    warn("rank %d rejected a data connection from %s: %s", w->env.rank, g->peer, why);
    close(g->fd);
}

static void *acceptor_main(void *arg) {
    World *w = arg;
    Greeting *g = xcalloc(MAX_GREETING, sizeof(Greeting));
    struct pollfd *pf = xcalloc(MAX_GREETING + 2, sizeof(struct pollfd));
    int ng = 0;
    for (;;) {
        double now = now_seconds(), next = now + 3600;
        pf[0] = (struct pollfd){ .fd = w->wake[0], .events = POLLIN };
        pf[1] = (struct pollfd){ .fd = w->data_listen_fd, .events = POLLIN };
        for (int i = 0; i < ng; i++) {
            pf[2 + i] = (struct pollfd){ .fd = g[i].fd, .events = POLLIN };
            if (g[i].deadline < next) next = g[i].deadline;
        }
        int rc = poll(pf, (nfds_t)ng + 2, (int)((next - now) * 1000) + 1);
        if (rc < 0 && errno != EINTR) die("poll: %s", strerror(errno));
        if (pf[0].revents) break; // teardown
        now = now_seconds();
        for (int i = ng - 1; i >= 0; i--) {
            Greeting *x = &g[i];
            int done = 0;
            if (pf[2 + i].revents) {
                ssize_t r = recv(x->fd, (char *)&x->hello + x->got, sizeof x->hello - x->got, MSG_DONTWAIT);
                if (r > 0) x->got += (size_t)r;
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    greeting_reject(w, x, "closed before greeting");
                    done = 1;
                } else if (x->got == sizeof x->hello) {
                    if (x->hello.magic != NET_MAGIC || strncmp(x->hello.token, w->env.token, sizeof x->hello.token) != 0 ||
                        x->hello.src < 0 || x->hello.src >= w->env.world) {
                        greeting_reject(w, x, "bad greeting");
                    } else {
                        PendingConn *p = xmalloc(sizeof *p);
                        pthread_mutex_lock(&w->pending_mu);
                        *p = (PendingConn){ x->hello.comm_id, x->hello.src, x->fd, w->pending };
                        w->pending = p;
                        pthread_cond_broadcast(&w->pending_cv);
                        pthread_mutex_unlock(&w->pending_mu);
                    }
                    done = 1;
                }
            }
            if (!done && now > x->deadline) {
                greeting_reject(w, x, "no greeting in time");
                done = 1;
            }
            if (done) g[i] = g[--ng];
        }
        if (pf[1].revents) {
            struct sockaddr_in a;
            socklen_t len = sizeof a;
            int fd = accept4(w->data_listen_fd, (struct sockaddr *)&a, &len, SOCK_CLOEXEC);
            if (fd < 0) die_if_out_of_files(errno, "cannot accept a peer's data connection");
            if (fd >= 0) {
                if (ng == MAX_GREETING) { // the oldest silent one goes
                    greeting_reject(w, &g[0], "too many connections waiting to greet");
                    g[0] = g[--ng];
                }
                tcp_set_options(fd);
                Greeting *x = &g[ng++];
                *x = (Greeting){ .fd = fd, .deadline = now + (w->timeout < GREETING_S ? w->timeout : GREETING_S) };
                if (!inet_ntop(AF_INET, &a.sin_addr, x->peer, sizeof x->peer)) snprintf(x->peer, sizeof x->peer, "?");
            }
        }
    }
    for (int i = 0; i < ng; i++) close(g[i].fd);
    free(g);
    free(pf);
    return NULL;
}

int world_take_connection(World *w, uint64_t comm_id, int src, double deadline) {
    pthread_mutex_lock(&w->pending_mu);
    for (;;) {
        for (PendingConn **pp = &w->pending; *pp; pp = &(*pp)->next) {
            if ((*pp)->comm_id == comm_id && (*pp)->src == src) {
                PendingConn *p = *pp;
                *pp = p->next;
                pthread_mutex_unlock(&w->pending_mu);
                int fd = p->fd;
                free(p);
                return fd;
            }
        }
        if (now_seconds() >= deadline) {
            pthread_mutex_unlock(&w->pending_mu);
            return -1;
        }
        struct timespec ts;
        timespec_at(&ts, now_seconds() + 0.1 < deadline ? now_seconds() + 0.1 : deadline);
        pthread_cond_timedwait(&w->pending_cv, &w->pending_mu, &ts);
    }
}

// ---------------------------------------------------------------------------------------------
// joining the job

// Shows this process as "<program>-r<rank>" in ps and top.
static void name_process(int rank) {
    // "train-r3" in ps and top (the kernel keeps 15 characters), so users can find and stop ranks. No
    // spaces or parentheses: tools that read /proc/PID/stat as whitespace-separated fields misparse such
    // a name; Slurm's proctrack/linuxproc then misses the rank and never passes it a step's signals.
    char exe[4096], name[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *base = "llm4d";
    if (n > 0) {
        exe[n] = 0;
        char *gone = strstr(exe, " (deleted)");
        if (gone) *gone = 0;
        base = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
    }
    char suffix[16];
    int ns = snprintf(suffix, sizeof suffix, "-r%d", rank);
    size_t keep = sizeof name - 1 - (size_t)ns, nb = strlen(base) < keep ? strlen(base) : keep;
    memcpy(name, base, nb);
    for (size_t i = 0; i < nb; i++)
        if (isspace((unsigned char)name[i]) || name[i] == '(' || name[i] == ')') name[i] = '_';
    memcpy(name + nb, suffix, (size_t)ns + 1);
    prctl(PR_SET_NAME, name, 0, 0, 0);
}


// The node's status board: the launcher's (inherited descriptor), else one the node's lowest rank
// makes and the others open.
static void board_attach(World *w) {
    const char *v = getenv("LLM4D_BOARD_FD");
    if (v) {
        int fd = atoi(v);
        struct stat st;
        if (fstat(fd, &st) == 0 && (size_t)st.st_size >= board_bytes(w->env.world)) {
            Board *b = board_map(fd, w->env.world);
            if (b && b->magic == BOARD_MAGIC && b->world == w->env.world) {
                w->board = b;
                w->board_mine = 1;
                w->board_fd = -1;
                close(fd);
                DieFilter f = { board_claim, board_printed, w };
                die_set_filter(&f);
                goto attached;
            }
            if (b) munmap(b, board_bytes(w->env.world));
        }
        close(fd);
    }
    w->board_fd = -1;
    int leader = w->env.rank;
    for (int r = 0; r < w->env.world; r++)
        if (!strcmp(w->ranks[r].node_id, w->env.node_id) && r < leader) leader = r;
    char key[64];
    snprintf(key, sizeof key, "board/%d", leader);
    int32_t ref[2] = { -1, -1 };
    if (leader == w->env.rank) {
        w->board = board_new(w->env.world, &w->board_fd, 1);
        if (w->board) ref[0] = getpid(), ref[1] = w->board_fd;
        store_set(w, key, ref, sizeof ref);
    } else {
        uint32_t n;
        int32_t *got = (int32_t *)store_wait(w, key, STORE_WAIT_START_MS, &n, "status board", NULL, -1);
        if (n == sizeof ref && got[0] > 0) {
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/fd/%d", got[0], got[1]);
            int fd = open(path, O_RDWR | O_CLOEXEC);
            if (fd >= 0) {
                w->board = board_map(fd, w->env.world);
                close(fd);
            }
        }
        free(got);
    }
    w->board_mine = w->board != NULL;
attached:
    if (w->board) atomic_store(&w->board->slot[w->env.rank].pid, (int32_t)getpid());
}

// Rank 0, at the end of world_create, while it waits for rank r to mark itself attached: a rank gone
// before it did (its process dead on this node, or its store connection closed) is named at once; one
// alive but late, at the timeout.
static void attach_check(World *w, int r, int late) {
    char st[96];
    const RankInfo *ri = &w->ranks[r];
    const char *state = !strcmp(ri->node_id, w->env.node_id) ? process_state(ri->pid, st, sizeof st) : NULL;
    int gone = (state && !strcmp(state, "died")) || !store_has_rank(w->store, r);
    if (!gone && !late) return;
    world_set_failed(w);
    if (gone) world_die_after(w, r, "bootstrap: rank %d (pid %d) exited before every rank had started", r, (int)ri->pid);
    world_die_after(w, r, "timeout: bootstrap: rank %d did not finish starting within %.1f s", r, w->timeout);
}

// RankInfo.machine_id: the kernel's boot id, which every process of one machine reads alike (in any
// network namespace); empty where /proc does not have it (then ranks share a machine when they share a
// node: same_machine, collectives.c).
static void machine_id(char *out, size_t cap) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    char id[64] = "";
    if (f) {
        if (!fgets(id, sizeof id, f)) id[0] = 0;
        fclose(f);
    }
    id[strcspn(id, "\n")] = 0;
    snprintf(out, cap, "%.*s", (int)cap - 1, id);
}

World *world_create(const LaunchEnv *env, double timeout_s, int (*stop)(void)) {
    name_process(env->rank);
    raise_open_files();
    if (sizeof(RankInfo) * (size_t)env->world > UINT32_MAX) // one message carries the rank table
        die("a world of %d ranks is more than the bootstrap's rank table holds (%zu bytes a rank, 4 GiB in all)", env->world,
            sizeof(RankInfo));
    World *w = xcalloc(1, sizeof *w);
    w->env = *env;
    w->timeout = timeout_s;
    w->forming = 1;
    w->stop = stop;
    w->board_fd = -1;
    if (pthread_mutex_init(&w->store_mu, NULL) || pthread_mutex_init(&w->pending_mu, NULL)) die("pthread init failed");
    cond_init_monotonic(&w->pending_cv);
    if (env->rank == 0) {
        int port = env->master_port;
        w->store = store_start(env, timeout_s, &port);
        w->env.master_port = port; // as bound: MASTER_PORT 0 asks for any free port (a world of one)
    }
    int port = 0;
    w->data_listen_fd = tcp_listen_any(&port);
    if (w->data_listen_fd < 0) die("cannot open a data listener: %s", strerror(errno));
    if (pipe2(w->wake, O_CLOEXEC) != 0) die_if_out_of_files(errno, "pipe"), die("pipe: %s", strerror(errno));
    if (pthread_create(&w->acceptor, NULL, acceptor_main, w) != 0) die("pthread_create: %s", strerror(errno));
    double deadline = now_seconds() + timeout_s;
    char why[320] = "", reaching[320];
    snprintf(reaching, sizeof reaching, "reaching rank 0 at %s:%d", env->master_addr, w->env.master_port);
    for (;;) { // rank 0 may not listen yet
        double look = now_seconds() + FORMING_LOOK_MS / 1e3;
        w->store_fd = tcp_connect(env->master_addr, w->env.master_port, look < deadline ? look : deadline, 0, why, sizeof why);
        if (w->store_fd >= 0 || now_seconds() >= deadline) break;
        forming_stop(w, reaching);
    }
    if (w->store_fd < 0)
        die("timeout: rank %d cannot reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.1f s: %s", env->rank,
            env->master_addr, w->env.master_port, timeout_s, why);
    RankInfo me = { .rank = env->rank, .world = env->world, .pid = getpid(), .port = port };
    snprintf(me.token, sizeof me.token, "%s", env->token);
    snprintf(me.node_id, sizeof me.node_id, "%s", env->node_id);
    machine_id(me.machine_id, sizeof me.machine_id);
    tcp_local_ip(w->store_fd, me.ip, sizeof me.ip); // the address that routes to rank 0 routes to us too
    if (send_msg(w->store_fd, MSG_HELLO, &me, sizeof me, deadline))
        die("bootstrap: cannot greet rank 0 at %s:%d", env->master_addr, env->master_port);
    // Rank 0 answers with the table, or with why the job is abandoned, by its own deadline, which
    // passed before ours: it started listening before we could connect.
    deadline = now_seconds() + timeout_s + 10.0;
    for (;;) {
        struct pollfd p = { .fd = w->store_fd, .events = POLLIN };
        int ready = poll(&p, 1, FORMING_LOOK_MS);
        if (ready < 0 && errno != EINTR) die("poll: %s", strerror(errno));
        if (ready > 0 || now_seconds() >= deadline) break;
        forming_stop(w, "waiting for every rank to join");
    }
    WireHdr h;
    int rc = tcp_read_all(w->store_fd, &h, sizeof h, deadline);
    if (rc == TCP_CLOSED) die("bootstrap: rank 0 at %s:%d closed the connection (it exited)", env->master_addr, w->env.master_port);
    if (rc != 0) die("timeout: bootstrap: rank 0 at %s:%d did not answer within %.1f s", env->master_addr, w->env.master_port, timeout_s + 10.0);
    // (the table grows with the world: a few hundred bytes a rank, past MAX_STORE_VALUE at a few thousand)
    size_t table_bytes = sizeof(RankInfo) * (size_t)env->world;
    if (h.magic != NET_MAGIC || (h.vlen > MAX_STORE_VALUE && !(h.type == MSG_TABLE && h.vlen == table_bytes)))
        die("bootstrap: malformed answer from rank 0");
    char *body = xmalloc(h.vlen + 1);
    if (tcp_read_all(w->store_fd, body, h.vlen, deadline) != 0) die("bootstrap: truncated answer from rank 0");
    body[h.vlen] = 0;
    if (h.type == MSG_ABANDON) die("%s", body);
    if (h.type != MSG_TABLE || h.vlen != table_bytes) die("bootstrap: malformed rank table from rank 0");
    w->ranks = (RankInfo *)body;
    board_attach(w);
    // No rank goes on before every rank has its board: one that fails at once (and rank 0 with it, whose
    // store goes then) would leave a slower rank still asking the store for its board, with no board to
    // follow to the root cause. Rank 0 waits for every rank's mark, the others for rank 0's.
    if (env->world > 1) {
        char key[32];
        uint32_t n;
        if (env->rank == 0) {
            for (int r = 1; r < env->world; r++) {
                snprintf(key, sizeof key, "attached/%d", r);
                world_set_waiting(w, r, "start-up", "world");
                free(store_wait(w, key, STORE_WAIT_START_MS, &n, "bootstrap", attach_check, r));
            }
            world_set_waiting(w, -1, NULL, NULL);
            store_set(w, "attached/all", "1", 1);
        } else {
            snprintf(key, sizeof key, "attached/%d", env->rank);
            store_set(w, key, "1", 1);
            free(store_wait(w, "attached/all", STORE_WAIT_START_MS, &n, "bootstrap", NULL, -1));
        }
    }
    w->forming = 0;
    return w;
}

void world_destroy(World *w) {
    close(w->store_fd); // goodbye to the store
    if (write(w->wake[1], "x", 1) != 1) die("acceptor wake-up: %s", strerror(errno));
    pthread_join(w->acceptor, NULL);
    close(w->wake[0]);
    close(w->wake[1]);
    close(w->data_listen_fd);
    for (PendingConn *p = w->pending, *next; p; p = next) {
        next = p->next;
        close(p->fd);
        free(p);
    }
    if (w->store) store_stop(w->store);
    if (w->board) {
        atomic_store(&w->board->slot[w->env.rank].waiting_on, -1);
        atomic_store(&w->board->slot[w->env.rank].finished, 1);
        die_set_filter(NULL);
        board_destroy(w->board, w->env.world);
    }
    if (w->board_fd >= 0) close(w->board_fd);
    hostmem_forget_peers();
    free(w->ranks);
    pthread_mutex_destroy(&w->store_mu);
    pthread_mutex_destroy(&w->pending_mu);
    pthread_cond_destroy(&w->pending_cv);
    free(w);
}

// collectives.c: launch, bootstrap, communicators and the ring collectives (see collectives.h).
//
// Read top to bottom: element types and reductions; the launch environment and the local launcher;
// the bootstrap store that rank 0 serves; the data-plane acceptor; communicator creation (shared-
// memory segments and TCP connections); the progress thread and the ring engine; the public calls.
#define _GNU_SOURCE
#include "collectives.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "kernels.h"
#include "net.h"

#define WIRE_MAGIC 0x344d4c4cu     // "LLM4"
#define CHUNK_BYTES (256u << 10)   // pipelining unit of the ring algorithms
#define MAX_STORE_VALUE (1u << 20) // longest value the bootstrap store accepts

// ---------------------------------------------------------------------------------------------
// element types and reductions

size_t comm_type_size(CommType t) {
    static const size_t sizes[CT_NTYPES] = { 4, 2, 4, 8 };
    return sizes[t];
}
const char *comm_type_name(CommType t) {
    static const char *names[CT_NTYPES] = { "fp32", "bf16", "int32", "int64" };
    return names[t];
}
const char *comm_op_name(CommOp op) {
    static const char *names[CT_NOPS] = { "sum", "avg", "max" };
    return names[op];
}

// dst[i] = incoming[i] (op) dst[i]: the partial that arrives first, this rank's value second. bf16 is
// added in fp32 and rounded once. avg sums here and divides at the owner (comm_finish_avg).
static void reduce_into(void *dst, const void *incoming, size_t n, CommType t, CommOp op) {
    int mx = op == OP_MAX;
    switch (t) {
    case CT_F32: {
        float *d = dst;
        const float *s = incoming;
        for (size_t i = 0; i < n; i++) d[i] = mx ? (s[i] > d[i] ? s[i] : d[i]) : s[i] + d[i];
        break;
    }
    case CT_BF16: {
        uint16_t *d = dst;
        const uint16_t *s = incoming;
        for (size_t i = 0; i < n; i++) {
            float a = bf16_to_f32(s[i]), b = bf16_to_f32(d[i]);
            d[i] = f32_to_bf16(mx ? (a > b ? a : b) : a + b);
        }
        break;
    }
    case CT_I32: {
        int32_t *d = dst;
        const int32_t *s = incoming;
        for (size_t i = 0; i < n; i++) d[i] = mx ? (s[i] > d[i] ? s[i] : d[i]) : (int32_t)((uint32_t)s[i] + (uint32_t)d[i]);
        break;
    }
    case CT_I64: {
        int64_t *d = dst;
        const int64_t *s = incoming;
        for (size_t i = 0; i < n; i++) d[i] = mx ? (s[i] > d[i] ? s[i] : d[i]) : (int64_t)((uint64_t)s[i] + (uint64_t)d[i]);
        break;
    }
    default:
        die("internal: bad comm type %d", (int)t);
    }
}

static void finish_avg(void *buf, size_t n, CommType t, int ranks) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case CT_F32: ((float *)buf)[i] /= (float)ranks; break;
        case CT_BF16: ((uint16_t *)buf)[i] = f32_to_bf16(bf16_to_f32(((uint16_t *)buf)[i]) / (float)ranks); break;
        case CT_I32: ((int32_t *)buf)[i] /= ranks; break;
        case CT_I64: ((int64_t *)buf)[i] /= ranks; break;
        default: die("internal: bad comm type %d", (int)t);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// launch environment

static int env_int(const char *name, int *out) {
    const char *v = getenv(name);
    if (!v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0 || x > 1 << 24) die("environment variable %s='%s' is not a valid count", name, v);
    *out = (int)x;
    return 1;
}

void slurm_first_host(const char *list, char *out, size_t cap) {
    // The first host of the first entry: text outside brackets is copied, and each bracket group
    // ("[01-04,07]") contributes its first number with its zero padding, e.g. rack[1-2]-n[07,09] -> rack1-n07.
    size_t w = 0;
    const char *p = list;
    while (*p && *p != ',') {
        if (*p == ']') die("SLURM_JOB_NODELIST '%s': unbalanced ']'", list);
        if (*p != '[') {
            if (w + 1 >= cap) die("SLURM_JOB_NODELIST '%s': host name too long", list);
            out[w++] = *p++;
            continue;
        }
        p++;
        if (!isdigit((unsigned char)*p)) die("SLURM_JOB_NODELIST '%s': expected a number after '['", list);
        while (isdigit((unsigned char)*p)) {
            if (w + 1 >= cap) die("SLURM_JOB_NODELIST '%s': host name too long", list);
            out[w++] = *p++;
        }
        while (*p && *p != ']') p++;
        if (*p != ']') die("SLURM_JOB_NODELIST '%s': unbalanced '['", list);
        p++;
    }
    if (w == 0) die("SLURM_JOB_NODELIST '%s': no host name", list);
    out[w] = 0;
}

// The leading count of a Slurm tasks-per-node list such as "2(x2),1".
static int slurm_tasks_here(const char *v, int fallback) {
    if (!v || !isdigit((unsigned char)*v)) return fallback;
    return atoi(v);
}

int launch_env_read(LaunchEnv *e) {
    memset(e, 0, sizeof *e);
    int have_torchrun = getenv("RANK") && getenv("WORLD_SIZE");
    // only a job step (srun) is a launch: a batch script's own shell carries SLURM_PROCID too
    int have_slurm = getenv("SLURM_PROCID") && getenv("SLURM_NTASKS") && getenv("SLURM_STEP_ID");
    if (!have_torchrun && !have_slurm) { // a world of one: rank 0 serves itself on any free port
        *e = (LaunchEnv){ .rank = 0, .world = 1, .local_world = 1, .master_port = 0 };
        snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
        snprintf(e->token, sizeof e->token, "single");
        snprintf(e->node_id, sizeof e->node_id, "local");
        return 0;
    }
    const char *addr = getenv("MASTER_ADDR");
    if (have_torchrun) {
        env_int("RANK", &e->rank);
        env_int("WORLD_SIZE", &e->world);
        e->local_rank = e->rank;
        e->local_world = e->world;
        env_int("LOCAL_RANK", &e->local_rank);
        env_int("LOCAL_WORLD_SIZE", &e->local_world);
        env_int("NODE_RANK", &e->node_rank);
        if (!addr) addr = "127.0.0.1";
        snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
    } else {
        env_int("SLURM_PROCID", &e->rank);
        env_int("SLURM_NTASKS", &e->world);
        env_int("SLURM_LOCALID", &e->local_rank);
        env_int("SLURM_NODEID", &e->node_rank);
        e->local_world = slurm_tasks_here(getenv("SLURM_STEP_TASKS_PER_NODE"), e->world);
        if (addr) {
            snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
        } else {
            const char *nl = getenv("SLURM_STEP_NODELIST");
            if (!nl) nl = getenv("SLURM_JOB_NODELIST");
            if (!nl) nl = getenv("SLURM_NODELIST");
            if (!nl) die("Slurm launch: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set");
            slurm_first_host(nl, e->master_addr, sizeof e->master_addr);
        }
    }
    if (e->world < 1 || e->rank >= e->world)
        die("launch environment: rank %d is not inside a world of %d", e->rank, e->world);
    // job and step ids are large numbers, not counts: parsed without a bound, mixed into port and token
    unsigned long long job = 0, step = 0;
    if (have_slurm) {
        job = strtoull(getenv("SLURM_JOB_ID") ? getenv("SLURM_JOB_ID") : "0", NULL, 10);
        step = strtoull(getenv("SLURM_STEP_ID"), NULL, 10);
    }
    e->master_port = 29500;
    if (getenv("MASTER_PORT")) {
        env_int("MASTER_PORT", &e->master_port);
        if (e->master_port < 1 || e->master_port > 65535) die("MASTER_PORT=%d is not a TCP port", e->master_port);
    } else if (have_slurm) {
        e->master_port = 20000 + (int)((job * 31 + step) % 20000); // every rank of a step derives the same port
    }
    const char *tok = getenv("LLM4D_JOB_TOKEN");
    char slurm_tok[64];
    if (!tok && have_slurm) { // every rank of a Slurm job step knows these
        snprintf(slurm_tok, sizeof slurm_tok, "slurm-%llu.%llu", job, step);
        tok = slurm_tok;
    }
    if (!tok) tok = "llm4d-default-token";
    snprintf(e->token, sizeof e->token, "%s", tok);
    const char *node = getenv("LLM4D_NODE_ID");
    if (node) snprintf(e->node_id, sizeof e->node_id, "%s", node);
    else if (gethostname(e->node_id, sizeof e->node_id - 1) != 0) die("gethostname: %s", strerror(errno));
    return 1;
}

// ---------------------------------------------------------------------------------------------
// the local launcher

static volatile sig_atomic_t launcher_signal; // set by the launcher's SIGINT/SIGTERM handler
static void launcher_on_signal(int sig) { launcher_signal = sig; }
static void launcher_on_child(int sig) { (void)sig; } // only interrupts sigsuspend
int launch_local_signal(void) { return launcher_signal; }

int launch_local(int nproc, int argc, char **argv) {
    if (nproc < 1) die("--nproc must be at least 1");
    unsigned char rnd[16];
    int ufd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (ufd < 0 || read(ufd, rnd, sizeof rnd) != (ssize_t)sizeof rnd) die("cannot read /dev/urandom: %s", strerror(errno));
    close(ufd);
    char token[40];
    for (int i = 0; i < 16; i++) snprintf(token + 2 * i, 3, "%02x", rnd[i]);
    int port = 0;
    int lfd = tcp_listen_any(&port); // a free port for rank 0; released just before the ranks start
    if (lfd < 0) die("cannot find a free TCP port: %s", strerror(errno));
    close(lfd);
    char **child_argv = xcalloc((size_t)argc + 1, sizeof(char *));
    int k = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++;
            continue;
        }
        child_argv[k++] = argv[i];
    }
    // Signals stay blocked except inside sigsuspend, so one that arrives while the ranks are being
    // forked or reaped is never lost.
    sigset_t block, orig;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &block, &orig) != 0) die("sigprocmask: %s", strerror(errno));
    struct sigaction sa = { .sa_handler = launcher_on_signal }, sc = { .sa_handler = launcher_on_child };
    sigemptyset(&sa.sa_mask);
    sigemptyset(&sc.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL) || sigaction(SIGCHLD, &sc, NULL))
        die("sigaction: %s", strerror(errno));
    pid_t *pids = xcalloc((size_t)nproc, sizeof(pid_t));
    pid_t launcher = getpid();
    for (int r = 0; r < nproc; r++) {
        pid_t pid = fork();
        if (pid < 0) die("fork: %s", strerror(errno));
        if (pid == 0) {
            // the rank starts with default signal handling, and dies with its launcher, even on SIGKILL
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGCHLD, SIG_DFL);
            sigprocmask(SIG_SETMASK, &orig, NULL);
            if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != launcher) _exit(1);
            char buf[32];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", nproc);
            setenv("WORLD_SIZE", buf, 1);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            setenv("NODE_RANK", "0", 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(buf, sizeof buf, "%d", port);
            setenv("MASTER_PORT", buf, 1);
            setenv("LLM4D_JOB_TOKEN", token, 1);
            execv("/proc/self/exe", child_argv);
            fprintf(stderr, "error: cannot start rank %d: %s\n", r, strerror(errno));
            _exit(127);
        }
        pids[r] = pid;
    }
    int alive = nproc, status_out = 0, stopping = 0;
    while (alive > 0) {
        if (launcher_signal && !stopping) {
            stopping = 1;
            status_out = 128 + launcher_signal;
            fprintf(stderr, "error: interrupted by signal %d; stopping the %d rank(s)\n", (int)launcher_signal, alive);
            for (int r = 0; r < nproc; r++)
                if (pids[r]) kill(pids[r], SIGTERM);
        }
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0) die("waitpid: %s", strerror(errno));
        if (pid == 0) {
            sigsuspend(&orig); // returns after a handler ran: a child ended or a stop signal came
            continue;
        }
        int r = 0;
        while (r < nproc && pids[r] != pid) r++;
        if (r == nproc) continue;
        pids[r] = 0;
        alive--;
        int failed = WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
        if (failed && !stopping) {
            stopping = 1;
            status_out = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (WIFSIGNALED(st)) fprintf(stderr, "error: rank %d was killed by signal %d; stopping the other ranks\n", r, WTERMSIG(st));
            for (int q = 0; q < nproc; q++)
                if (pids[q]) kill(pids[q], SIGTERM);
        }
    }
    sigprocmask(SIG_SETMASK, &orig, NULL);
    free(pids);
    free(child_argv);
    return status_out;
}

// ---------------------------------------------------------------------------------------------
// process-wide state: the world table, the store connection, the data-plane acceptor

typedef struct {
    char token[65];
    int32_t rank, world, pid, port;
    char node_id[256];
    char ip[64];
} RankInfo;

typedef struct PendingConn {
    uint64_t comm_id;
    int src;
    int fd;
    struct PendingConn *next;
} PendingConn;

typedef struct {
    LaunchEnv env;
    double timeout;
    RankInfo *ranks; // [world]
    int store_fd;    // this rank's connection to the store (rank 0 serves it)
    pthread_mutex_t store_mu;
    int data_listen_fd;
    pthread_t acceptor;
    pthread_mutex_t pending_mu;
    pthread_cond_t pending_cv;
    PendingConn *pending;
    int refs; // communicators alive
} World;

struct CommRequest;

struct Comm {
    World *w;
    uint64_t id;
    char name[96];
    int rank, size;
    int *world_ranks;
    Channel *ch; // [size]; ch[rank] unused
    void *shm;
    size_t shm_bytes;
    Doorbell *bell; // this rank's doorbell in the segment (a private one when no peer shares the node)
    Doorbell private_bell;
    int any_tcp;
    uint32_t split_seq;
    unsigned char *scratch; // one chunk for incoming partial sums
    unsigned char *work;    // reduce-scatter's working copy of the input; grows, never shrinks
    size_t work_bytes;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct CommRequest *head, *tail;
    int shutdown;
    _Atomic uint64_t busy_ns; // time the progress thread spent running requests
    const char *op;           // the operation the progress thread runs (for channel error lines)
};

enum { REQ_ALLREDUCE, REQ_REDUCE_SCATTER, REQ_ALLGATHER, REQ_BROADCAST, REQ_SEND, REQ_RECV };
static const char *const REQ_NAMES[] = { "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv" };

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
    struct CommRequest *next;
};

// ---------------------------------------------------------------------------------------------
// wire messages: header then key then value

typedef struct {
    uint32_t magic, type, klen, vlen;
} WireHdr;
enum { MSG_HELLO = 1, MSG_TABLE, MSG_SET, MSG_GET, MSG_VALUE, MSG_CONNECT };

typedef struct {
    uint32_t magic;
    char token[65];
    uint64_t comm_id;
    int32_t src;
} ConnectHello;

// ---------------------------------------------------------------------------------------------
// the bootstrap store (rank 0): one thread per connection, a key-value table under a lock

typedef struct KV {
    char *key;
    char *val;
    uint32_t vlen;
    struct KV *next;
} KV;

typedef struct {
    LaunchEnv env;
    double timeout;
    int listen_fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    KV *kv;
    RankInfo *ranks;
    int joined;
} Store;

typedef struct {
    Store *s;
    int fd;
    char peer[64];
} StoreConn;

static void store_reject(StoreConn *sc, const char *why) {
    fprintf(stderr, "warning: bootstrap: rejected a connection from %s: %s\n", sc->peer, why);
    close(sc->fd);
    free(sc);
}

static void *store_conn_main(void *arg) {
    StoreConn *sc = arg;
    Store *s = sc->s;
    WireHdr h;
    RankInfo info;
    double hello_deadline = now_seconds() + 10.0;
    if (tcp_read_all(sc->fd, &h, sizeof h, hello_deadline) != 0) return store_reject(sc, "no greeting"), NULL;
    if (h.magic != WIRE_MAGIC || h.type != MSG_HELLO || h.klen != 0 || h.vlen != sizeof info)
        return store_reject(sc, "not an llm4d greeting"), NULL;
    if (tcp_read_all(sc->fd, &info, sizeof info, hello_deadline) != 0) return store_reject(sc, "truncated greeting"), NULL;
    info.token[sizeof info.token - 1] = 0;
    info.node_id[sizeof info.node_id - 1] = 0;
    info.ip[sizeof info.ip - 1] = 0;
    if (strcmp(info.token, s->env.token) != 0) return store_reject(sc, "wrong job token"), NULL;
    if (info.world != s->env.world || info.rank < 0 || info.rank >= info.world)
        return store_reject(sc, "rank or world size does not match this job"), NULL;
    pthread_mutex_lock(&s->mu);
    if (s->ranks[info.rank].world != 0) {
        pthread_mutex_unlock(&s->mu);
        return store_reject(sc, "rank already joined"), NULL;
    }
    s->ranks[info.rank] = info;
    s->joined++;
    pthread_cond_broadcast(&s->cv);
    while (s->joined < s->env.world) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    WireHdr th = { WIRE_MAGIC, MSG_TABLE, 0, (uint32_t)(sizeof(RankInfo) * s->env.world) };
    RankInfo *table = xmalloc(sizeof(RankInfo) * s->env.world);
    memcpy(table, s->ranks, sizeof(RankInfo) * s->env.world);
    for (int r = 0; r < s->env.world; r++) memset(table[r].token, 0, sizeof table[r].token);
    if (tcp_write_all(sc->fd, &th, sizeof th, now_seconds() + s->timeout) ||
        tcp_write_all(sc->fd, table, th.vlen, now_seconds() + s->timeout))
        die("bootstrap: cannot send the rank table to rank %d", info.rank);
    free(table);
    // then serve SET and GET until the rank disconnects
    for (;;) {
        if (tcp_read_all(sc->fd, &h, sizeof h, 1e18) != 0) break;
        if (h.magic != WIRE_MAGIC || h.klen == 0 || h.klen > 4096 || h.vlen > MAX_STORE_VALUE ||
            (h.type != MSG_SET && h.type != MSG_GET)) {
            fprintf(stderr, "warning: bootstrap: malformed request from rank %d; dropping its connection\n", info.rank);
            break;
        }
        char *key = xmalloc(h.klen + 1);
        char *val = xmalloc(h.vlen + 1);
        if (tcp_read_all(sc->fd, key, h.klen, now_seconds() + s->timeout) ||
            tcp_read_all(sc->fd, val, h.vlen, now_seconds() + s->timeout)) {
            free(key);
            free(val);
            break;
        }
        key[h.klen] = 0;
        pthread_mutex_lock(&s->mu);
        if (h.type == MSG_SET) {
            KV *kv = xmalloc(sizeof *kv);
            *kv = (KV){ key, val, h.vlen, s->kv };
            s->kv = kv;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        free(val);
        KV *found = NULL;
        for (;;) {
            for (KV *kv = s->kv; kv; kv = kv->next)
                if (!strcmp(kv->key, key)) found = kv;
            if (found) break;
            pthread_cond_wait(&s->cv, &s->mu);
        }
        WireHdr vh = { WIRE_MAGIC, MSG_VALUE, 0, found->vlen };
        char *copy = xmalloc(found->vlen + 1);
        memcpy(copy, found->val, found->vlen);
        pthread_mutex_unlock(&s->mu);
        free(key);
        int bad = tcp_write_all(sc->fd, &vh, sizeof vh, now_seconds() + s->timeout) ||
                  tcp_write_all(sc->fd, copy, vh.vlen, now_seconds() + s->timeout);
        free(copy);
        if (bad) break;
    }
    close(sc->fd);
    free(sc);
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
            if (errno == EBADF || errno == EINVAL) return NULL; // closed at exit
            die("bootstrap: accept: %s", strerror(errno));
        }
        tcp_set_options(fd);
        StoreConn *sc = xcalloc(1, sizeof *sc);
        sc->s = s;
        sc->fd = fd;
        if (!inet_ntop(AF_INET, &a.sin_addr, sc->peer, sizeof sc->peer)) snprintf(sc->peer, sizeof sc->peer, "?");
        pthread_t t;
        if (pthread_create(&t, NULL, store_conn_main, sc) != 0) die("pthread_create: %s", strerror(errno));
        pthread_detach(t);
    }
}

static void store_set(World *w, const char *key, const void *val, uint32_t vlen) {
    WireHdr h = { WIRE_MAGIC, MSG_SET, (uint32_t)strlen(key), vlen };
    double dl = now_seconds() + w->timeout;
    pthread_mutex_lock(&w->store_mu);
    if (tcp_write_all(w->store_fd, &h, sizeof h, dl) || tcp_write_all(w->store_fd, key, h.klen, dl) ||
        tcp_write_all(w->store_fd, val, vlen, dl))
        die("bootstrap store: lost the connection to rank 0 (%s:%d)", w->env.master_addr, w->env.master_port);
    pthread_mutex_unlock(&w->store_mu);
}

// Waits (up to the timeout) for a key; returns its value (malloc'd) and length.
static char *store_get(World *w, const char *key, uint32_t *vlen, const char *what) {
    WireHdr h = { WIRE_MAGIC, MSG_GET, (uint32_t)strlen(key), 0 };
    double dl = now_seconds() + w->timeout;
    pthread_mutex_lock(&w->store_mu);
    if (tcp_write_all(w->store_fd, &h, sizeof h, dl) || tcp_write_all(w->store_fd, key, h.klen, dl))
        die("bootstrap store: lost the connection to rank 0 (%s:%d)", w->env.master_addr, w->env.master_port);
    int rc = tcp_read_all(w->store_fd, &h, sizeof h, dl);
    if (rc == TCP_CLOSED) die("%s: rank 0 at %s:%d closed the bootstrap connection (it exited)", what, w->env.master_addr, w->env.master_port);
    if (rc != 0) die("timeout: %s: waited %.1f s for '%s' from the bootstrap store", what, w->timeout, key);
    if (h.magic != WIRE_MAGIC || h.type != MSG_VALUE || h.vlen > MAX_STORE_VALUE) die("bootstrap store: malformed reply");
    char *v = xmalloc(h.vlen + 1);
    if (tcp_read_all(w->store_fd, v, h.vlen, dl) != 0) die("bootstrap store: truncated reply");
    pthread_mutex_unlock(&w->store_mu);
    v[h.vlen] = 0;
    *vlen = h.vlen;
    return v;
}

// ---------------------------------------------------------------------------------------------
// data-plane acceptor: authenticates incoming channel connections and parks them for comm setup

static void *acceptor_main(void *arg) {
    World *w = arg;
    for (;;) {
        int fd = accept4(w->data_listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return NULL;
        }
        tcp_set_options(fd);
        ConnectHello hello;
        if (tcp_read_all(fd, &hello, sizeof hello, now_seconds() + 10.0) != 0 || hello.magic != WIRE_MAGIC ||
            strncmp(hello.token, w->env.token, sizeof hello.token) != 0 || hello.src < 0 || hello.src >= w->env.world) {
            fprintf(stderr, "warning: rank %d rejected a data connection with a bad greeting\n", w->env.rank);
            close(fd);
            continue;
        }
        PendingConn *p = xmalloc(sizeof *p);
        pthread_mutex_lock(&w->pending_mu);
        *p = (PendingConn){ hello.comm_id, hello.src, fd, w->pending };
        w->pending = p;
        pthread_cond_broadcast(&w->pending_cv);
        pthread_mutex_unlock(&w->pending_mu);
    }
}

static int take_pending(World *w, uint64_t comm_id, int src, double deadline) {
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
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double left = deadline - now_seconds();
        if (left <= 0) {
            pthread_mutex_unlock(&w->pending_mu);
            return -1;
        }
        double step = left < 0.1 ? left : 0.1;
        ts.tv_nsec += (long)(step * 1e9);
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&w->pending_cv, &w->pending_mu, &ts);
    }
}

// ---------------------------------------------------------------------------------------------
// shared-memory segments: names are recorded until unlinked so that a signal never leaves one behind

#define MAX_SHM_NAMES 64
static char shm_names[MAX_SHM_NAMES][96]; // written before the segment exists, read by the signal handler
static volatile sig_atomic_t shm_name_used[MAX_SHM_NAMES];

static void unlink_tracked_shm(void) {
    for (int i = 0; i < MAX_SHM_NAMES; i++)
        if (shm_name_used[i]) {
            char path[128] = "/dev/shm";
            size_t n = strlen(path), j = 0;
            while (shm_names[i][j] && n < sizeof path - 1) path[n++] = shm_names[i][j++];
            path[n] = 0;
            unlink(path);
        }
}

// Segments not yet unlinked (a peer died before mapping one) go with the process: on a fatal signal
// here, on any exit (die() included) through atexit.
static void on_fatal_signal(int sig) {
    unlink_tracked_shm();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int shm_track(const char *name) {
    for (int i = 0; i < MAX_SHM_NAMES; i++)
        if (!shm_name_used[i]) {
            snprintf(shm_names[i], sizeof shm_names[i], "%s", name);
            shm_name_used[i] = 1;
            return i;
        }
    return -1;
}

// ---------------------------------------------------------------------------------------------
// communicator setup

static void *progress_main(void *arg);

static void comm_connect(Comm *c) {
    World *w = c->w;
    int me_w = c->world_ranks[c->rank];
    const char *my_node = w->ranks[me_w].node_id;
    c->ch = xcalloc((size_t)c->size, sizeof(Channel));
    // local members, in communicator order
    int *local = xmalloc(sizeof(int) * c->size), nl = 0, my_li = -1;
    for (int r = 0; r < c->size; r++)
        if (!strcmp(w->ranks[c->world_ranks[r]].node_id, my_node)) {
            if (r == c->rank) my_li = nl;
            local[nl++] = r;
        }
    c->bell = &c->private_bell;
    if (nl > 1) {
        char name[96], key[160];
        snprintf(name, sizeof name, "/llm4d-%.16s-%016llx-%d", w->env.token, (unsigned long long)c->id, c->world_ranks[local[0]]);
        c->shm_bytes = sizeof(Doorbell) * nl + sizeof(ShmRing) * (size_t)nl * nl;
        int slot = shm_track(name);
        int fd;
        if (my_li == 0) {
            fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
            if (fd < 0) die("shm_open %s: %s", name, strerror(errno));
            if (ftruncate(fd, (off_t)c->shm_bytes) != 0) die("ftruncate %s: %s", name, strerror(errno));
        } else {
            uint32_t n;
            snprintf(key, sizeof key, "shm/%016llx/%d/created", (unsigned long long)c->id, c->world_ranks[local[0]]);
            free(store_get(w, key, &n, "shared-memory setup"));
            fd = shm_open(name, O_RDWR, 0600);
            if (fd < 0) die("shm_open %s: %s", name, strerror(errno));
        }
        c->shm = mmap(NULL, c->shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (c->shm == MAP_FAILED) die("mmap %s (%zu bytes): %s", name, c->shm_bytes, strerror(errno));
        close(fd);
        if (my_li == 0) {
            snprintf(key, sizeof key, "shm/%016llx/%d/created", (unsigned long long)c->id, c->world_ranks[local[0]]);
            store_set(w, key, "1", 1);
            // once every local member has mapped it, the name is no longer needed: nothing is left behind
            for (int i = 1; i < nl; i++) {
                uint32_t n;
                snprintf(key, sizeof key, "shm/%016llx/mapped/%d", (unsigned long long)c->id, c->world_ranks[local[i]]);
                free(store_get(w, key, &n, "shared-memory setup"));
            }
            if (shm_unlink(name) != 0) die("shm_unlink %s: %s", name, strerror(errno));
        } else {
            snprintf(key, sizeof key, "shm/%016llx/mapped/%d", (unsigned long long)c->id, me_w);
            store_set(w, key, "1", 1);
        }
        if (slot >= 0) shm_name_used[slot] = 0;
        Doorbell *bells = c->shm;
        ShmRing *rings = (ShmRing *)(bells + nl);
        c->bell = &bells[my_li];
        for (int i = 0; i < nl; i++) {
            if (i == my_li) continue;
            Channel *ch = &c->ch[local[i]];
            ch->kind = NET_SHM;
            ch->tx = &rings[(size_t)my_li * nl + i];
            ch->rx = &rings[(size_t)i * nl + my_li];
            ch->peer_bell = &bells[i];
            ch->peer_pid = w->ranks[c->world_ranks[local[i]]].pid;
        }
    }
    // TCP to every member on another node: the lower world rank connects
    double deadline = now_seconds() + w->timeout;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank || c->ch[r].kind) continue;
        int pw = c->world_ranks[r];
        int fd;
        if (me_w < pw) {
            fd = tcp_connect(w->ranks[pw].ip, w->ranks[pw].port, deadline);
            if (fd < 0) die("timeout: communicator %s: cannot connect to rank %d at %s:%d within %.1f s", c->name, pw, w->ranks[pw].ip, w->ranks[pw].port, w->timeout);
            ConnectHello hello = { .magic = WIRE_MAGIC, .comm_id = c->id, .src = me_w };
            snprintf(hello.token, sizeof hello.token, "%s", w->env.token);
            if (tcp_write_all(fd, &hello, sizeof hello, deadline) != 0) die("communicator %s: cannot greet rank %d", c->name, pw);
        } else {
            fd = take_pending(w, c->id, pw, deadline);
            if (fd < 0) die("timeout: communicator %s: rank %d did not connect within %.1f s", c->name, pw, w->timeout);
        }
        c->ch[r] = (Channel){ .kind = NET_TCP, .peer = r, .peer_world = pw, .fd = fd };
        c->any_tcp = 1;
    }
    for (int r = 0; r < c->size; r++) {
        c->ch[r].peer = r;
        c->ch[r].peer_world = c->world_ranks[r];
        c->ch[r].comm = c->name;
        c->ch[r].op = &c->op;
    }
    free(local);
    c->scratch = xmalloc(CHUNK_BYTES);
    if (pthread_mutex_init(&c->mu, NULL) || pthread_cond_init(&c->cv, NULL)) die("pthread init failed");
    if (pthread_create(&c->thread, NULL, progress_main, c) != 0) die("pthread_create: %s", strerror(errno));
}

Comm *comm_init(const LaunchEnv *env, double timeout_s) {
    World *w = xcalloc(1, sizeof *w);
    w->env = *env;
    w->timeout = timeout_s;
    if (pthread_mutex_init(&w->store_mu, NULL) || pthread_mutex_init(&w->pending_mu, NULL) ||
        pthread_cond_init(&w->pending_cv, NULL))
        die("pthread init failed");
    struct sigaction sa = { .sa_handler = on_fatal_signal };
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL)) die("sigaction: %s", strerror(errno));
    if (atexit(unlink_tracked_shm) != 0) die("atexit failed");
    if (env->rank == 0) {
        Store *s = xcalloc(1, sizeof *s);
        s->env = *env;
        s->timeout = timeout_s;
        s->ranks = xcalloc((size_t)env->world, sizeof(RankInfo));
        if (pthread_mutex_init(&s->mu, NULL) || pthread_cond_init(&s->cv, NULL)) die("pthread init failed");
        int port = env->master_port;
        s->listen_fd = tcp_listen_any(&port);
        if (s->listen_fd < 0) die("bootstrap: cannot listen on port %d (MASTER_PORT): %s", env->master_port, strerror(errno));
        w->env.master_port = port; // as bound: MASTER_PORT 0 asks for any free port (single process)
        pthread_t t;
        if (pthread_create(&t, NULL, store_main, s) != 0) die("pthread_create: %s", strerror(errno));
        pthread_detach(t);
    }
    int port = 0;
    w->data_listen_fd = tcp_listen_any(&port);
    if (w->data_listen_fd < 0) die("cannot open a data listener: %s", strerror(errno));
    double deadline = now_seconds() + timeout_s;
    w->store_fd = tcp_connect(env->master_addr, w->env.master_port, deadline);
    if (w->store_fd < 0)
        die("timeout: rank %d cannot reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.1f s", env->rank,
            env->master_addr, w->env.master_port, timeout_s);
    RankInfo me = { .rank = env->rank, .world = env->world, .pid = getpid(), .port = port };
    snprintf(me.token, sizeof me.token, "%s", env->token);
    snprintf(me.node_id, sizeof me.node_id, "%s", env->node_id);
    tcp_local_ip(w->store_fd, me.ip, sizeof me.ip); // the address that routes to rank 0 routes to us too
    WireHdr h = { WIRE_MAGIC, MSG_HELLO, 0, sizeof me };
    if (tcp_write_all(w->store_fd, &h, sizeof h, deadline) || tcp_write_all(w->store_fd, &me, sizeof me, deadline))
        die("bootstrap: cannot greet rank 0 at %s:%d", env->master_addr, env->master_port);
    int rc = tcp_read_all(w->store_fd, &h, sizeof h, deadline);
    if (rc == TCP_CLOSED)
        die("bootstrap: rank 0 at %s:%d closed the connection (a wrong LLM4D_JOB_TOKEN or WORLD_SIZE, a rank that "
            "already joined, or rank 0 exited)", env->master_addr, w->env.master_port);
    if (rc != 0) die("timeout: bootstrap: not every rank joined within %.1f s (world size %d)", timeout_s, env->world);
    if (h.magic != WIRE_MAGIC || h.type != MSG_TABLE || h.vlen != sizeof(RankInfo) * env->world)
        die("bootstrap: malformed rank table from rank 0");
    w->ranks = xmalloc(h.vlen);
    if (tcp_read_all(w->store_fd, w->ranks, h.vlen, deadline) != 0) die("bootstrap: truncated rank table");
    if (pthread_create(&w->acceptor, NULL, acceptor_main, w) != 0) die("pthread_create: %s", strerror(errno));
    pthread_detach(w->acceptor);

    Comm *c = xcalloc(1, sizeof *c);
    c->w = w;
    c->id = 0;
    snprintf(c->name, sizeof c->name, "world");
    c->rank = env->rank;
    c->size = env->world;
    c->world_ranks = xmalloc(sizeof(int) * c->size);
    for (int r = 0; r < c->size; r++) c->world_ranks[r] = r;
    w->refs = 1;
    comm_connect(c);
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
    Comm *c = xcalloc(1, sizeof *c);
    c->w = w;
    c->id = mix64(parent->id ^ mix64(((uint64_t)seq << 32) ^ (uint32_t)colour)) | 1;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "split");
    c->world_ranks = xmalloc(sizeof(int) * parent->size);
    // members ordered by (key, parent rank): insertion sort over the parent ranks
    int n = 0;
    for (int r = 0; r < parent->size; r++) {
        if (all[2 * r] != colour) continue;
        int pos = n++;
        while (pos > 0) {
            int q = c->world_ranks[pos - 1];
            int qr = 0;
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
    w->refs++;
    comm_connect(c);
    return c;
}

double comm_busy_seconds(Comm *c) { return atomic_load(&c->busy_ns) * 1e-9; }
int comm_rank(const Comm *c) { return c->rank; }
int comm_size(const Comm *c) { return c->size; }
int comm_world_rank(const Comm *c, int r) { return c->world_ranks[r]; }
const char *comm_name(const Comm *c) { return c->name; }

void comm_destroy(Comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->shutdown = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    for (int r = 0; r < c->size; r++)
        if (c->ch[r].kind == NET_TCP) close(c->ch[r].fd);
    if (c->shm) munmap(c->shm, c->shm_bytes);
    World *w = c->w;
    free(c->ch);
    free(c->world_ranks);
    free(c->scratch);
    free(c->work);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    if (--w->refs == 0) {
        // the world is gone: say goodbye to the store (rank 0 keeps serving the others until exit)
        close(w->store_fd);
        shutdown(w->data_listen_fd, SHUT_RDWR);
        close(w->data_listen_fd);
        free(w->ranks);
        // World itself stays allocated: the detached acceptor thread may still be returning from accept
    }
}

// ---------------------------------------------------------------------------------------------
// the progress engine

typedef struct {
    Comm *c;
    const char *op;
    double last_progress;
    uint32_t bell_seen;
    int idle;
} Waiter;

static void waiter_start(Waiter *wt, Comm *c, const char *op) {
    wt->c = c;
    wt->op = op;
    c->op = op;
    wt->last_progress = now_seconds();
    wt->idle = 0;
    wt->bell_seen = atomic_load_explicit(&c->bell->seq, memory_order_acquire);
}

// Called after each pass over the channels; blocks briefly when nothing moved, and dies with one line
// naming the operation, the communicator and the peer when nothing moved for the whole timeout.
static void waiter_pass(Waiter *wt, int progressed, Channel *waiting_on, Channel *tcp_a, Channel *tcp_b) {
    Comm *c = wt->c;
    if (progressed) {
        wt->idle = 0;
        wt->last_progress = now_seconds();
        wt->bell_seen = atomic_load_explicit(&c->bell->seq, memory_order_acquire);
        return;
    }
    // spin (yielding the core) for up to 100 µs: the peer is usually microseconds away, and a futex
    // or poll wake-up costs far more than that
    double now = now_seconds();
    if (++wt->idle < 64 || now - wt->last_progress < 100e-6) {
        if (wt->idle >= 64) sched_yield();
        return;
    }
    if (now - wt->last_progress > c->w->timeout)
        die("timeout: %s on communicator %s (rank %d of %d, world rank %d): no progress with rank %d for %.1f s", wt->op,
            c->name, c->rank, c->size, c->world_ranks[c->rank], waiting_on ? waiting_on->peer_world : -1,
            now - wt->last_progress);
    if (waiting_on && waiting_on->kind == NET_SHM && kill(waiting_on->peer_pid, 0) != 0 && errno == ESRCH)
        die("%s on communicator %s: rank %d (pid %d) died", wt->op, c->name, waiting_on->peer_world, (int)waiting_on->peer_pid);
    if ((tcp_a && tcp_a->kind == NET_TCP) || (tcp_b && tcp_b->kind == NET_TCP)) {
        struct pollfd p[2];
        int np = 0;
        if (tcp_a && tcp_a->kind == NET_TCP) p[np++] = (struct pollfd){ .fd = tcp_a->fd, .events = POLLIN };
        if (tcp_b && tcp_b->kind == NET_TCP) p[np++] = (struct pollfd){ .fd = tcp_b->fd, .events = POLLOUT };
        // shared-memory peers of the same operation are polled again after at most 1 ms
        if (poll(p, (nfds_t)np, 1) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
    } else {
        doorbell_wait(c->bell, wt->bell_seen, 20);
    }
    wt->bell_seen = atomic_load_explicit(&c->bell->seq, memory_order_acquire);
}

// The ring engine. Step s sends segment send_seg(s) to the next rank and receives segment
// recv_seg(s) from the previous one, chunk by chunk; chunk k of step s + 1 leaves as soon as chunk k
// of step s has arrived (and been reduced), so sending, receiving and reducing overlap. Steps below
// reduce_steps add the incoming partial into the buffer; later steps copy it.
typedef struct {
    unsigned char *buf; // the whole vector, count elements
    size_t count, seg;  // seg = ceil(count / n) elements per segment
    CommType t;
    CommOp op;
    int nsteps, reduce_steps;
    int send_base, recv_base; // send_seg(s) = (send_base - s) mod n, likewise recv
} Ring;

static void seg_range(const Ring *g, int n, int idx, size_t *off, size_t *len) {
    idx = ((idx % n) + n) % n;
    size_t a = (size_t)idx * g->seg, b = a + g->seg;
    if (a > g->count) a = g->count;
    if (b > g->count) b = g->count;
    *off = a;
    *len = b - a;
}

static void run_ring(Comm *c, Ring *g, const char *opname) {
    int n = c->size;
    if (n == 1 || g->nsteps == 0 || g->count == 0) return;
    size_t es = comm_type_size(g->t), chunk = CHUNK_BYTES / es;
    Channel *next = &c->ch[(c->rank + 1) % n], *prev = &c->ch[(c->rank + n - 1) % n];
    int ss = 0, rs = 0;           // current send and receive steps
    int send_full = 0;            // the last send found the channel full (not waiting for data)
    size_t sk = 0, sb = 0;        // send: chunk index, bytes of it already sent
    size_t rk = 0, rb = 0;        // receive: chunk index, bytes of it already received
    Waiter wt;
    waiter_start(&wt, c, opname);
    while (ss < g->nsteps || rs < g->nsteps) {
        int progressed = 0;
        // receive
        while (rs < g->nsteps) {
            size_t off, len;
            seg_range(g, n, g->recv_base - rs, &off, &len);
            size_t nch = (len + chunk - 1) / chunk;
            if (rk >= nch) { // this step's segment is complete (or empty)
                rs++;
                rk = rb = 0;
                progressed = 1;
                continue;
            }
            size_t elems = len - rk * chunk < chunk ? len - rk * chunk : chunk, bytes = elems * es;
            int reducing = rs < g->reduce_steps;
            unsigned char *dst = reducing ? c->scratch : g->buf + (off + rk * chunk) * es;
            size_t got = chan_recv(prev, dst + rb, bytes - rb);
            if (got == 0) break;
            progressed = 1;
            rb += got;
            if (rb < bytes) continue;
            if (reducing) {
                unsigned char *mine = g->buf + (off + rk * chunk) * es;
                reduce_into(mine, c->scratch, elems, g->t, g->op);
                if (g->op == OP_AVG && rs == g->reduce_steps - 1) finish_avg(mine, elems, g->t, n);
            }
            rk++;
            rb = 0;
        }
        // send what is ready
        while (ss < g->nsteps) {
            size_t off, len;
            seg_range(g, n, g->send_base - ss, &off, &len);
            size_t nch = (len + chunk - 1) / chunk;
            if (sk >= nch) {
                ss++;
                sk = sb = 0;
                progressed = 1;
                continue;
            }
            send_full = 0;
            if (ss > 0 && !(rs > ss - 1 || (rs == ss - 1 && rk > sk))) break; // chunk not arrived yet
            size_t elems = len - sk * chunk < chunk ? len - sk * chunk : chunk, bytes = elems * es;
            size_t put = chan_send(next, g->buf + (off + sk * chunk) * es + sb, bytes - sb);
            if (put == 0) {
                send_full = 1;
                break;
            }
            progressed = 1;
            sb += put;
            if (sb < bytes) continue;
            sk++;
            sb = 0;
        }
        Channel *waiting_on = rs < g->nsteps ? prev : next;
        waiter_pass(&wt, progressed, waiting_on, rs < g->nsteps ? prev : NULL, send_full ? next : NULL);
    }
}

static void run_broadcast(Comm *c, unsigned char *buf, size_t bytes, int root) {
    int n = c->size;
    if (n == 1 || bytes == 0) return;
    int pos = (c->rank - root + n) % n;
    Channel *next = &c->ch[(c->rank + 1) % n], *prev = &c->ch[(c->rank + n - 1) % n];
    size_t have = pos == 0 ? bytes : 0, sent = 0;
    int forwards = pos < n - 1;
    Waiter wt;
    waiter_start(&wt, c, "broadcast");
    while (have < bytes || (forwards && sent < bytes)) {
        int progressed = 0;
        if (have < bytes) {
            size_t got = chan_recv(prev, buf + have, bytes - have);
            if (got) progressed = 1;
            have += got;
        }
        if (forwards && sent < have) {
            size_t put = chan_send(next, buf + sent, have - sent);
            if (put) progressed = 1;
            sent += put;
        }
        int send_full = forwards && sent < have;
        waiter_pass(&wt, progressed, have < bytes ? prev : next, have < bytes ? prev : NULL, send_full ? next : NULL);
    }
}

static void mark_done(Comm *c, struct CommRequest *q) {
    pthread_mutex_lock(&c->mu);
    atomic_store(&q->done, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int is_p2p(const struct CommRequest *q) { return q->kind == REQ_SEND || q->kind == REQ_RECV; }

#define MAX_P2P 64

// Point-to-point requests progress together, and requests queued while they run join them, so that
// a send and a receive between the same two ranks never wait on each other (an isend posted just
// before its irecv would otherwise fill the channel and block both ranks).
static void run_p2p(Comm *c, struct CommRequest *first) {
    struct CommRequest *reqs[MAX_P2P];
    size_t done[MAX_P2P];
    int nreq = 1, live = 1;
    reqs[0] = first;
    done[0] = 0;
    Waiter wt;
    waiter_start(&wt, c, REQ_NAMES[first->kind]);
    while (live > 0) {
        pthread_mutex_lock(&c->mu);
        while (c->head && is_p2p(c->head) && nreq < MAX_P2P) {
            reqs[nreq] = c->head;
            done[nreq++] = 0;
            live++;
            c->head = c->head->next;
            if (!c->head) c->tail = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        int progressed = 0;
        Channel *waiting = NULL, *ra = NULL, *sb = NULL;
        for (int i = 0; i < nreq; i++) {
            struct CommRequest *q = reqs[i];
            if (!q) continue;
            Channel *ch = &c->ch[q->peer];
            size_t m = q->kind == REQ_SEND ? chan_send(ch, (const unsigned char *)q->send + done[i], q->count - done[i])
                                           : chan_recv(ch, (unsigned char *)q->recv + done[i], q->count - done[i]);
            done[i] += m;
            if (m) progressed = 1;
            if (done[i] >= q->count) {
                mark_done(c, q);
                reqs[i] = NULL;
                live--;
                progressed = 1;
                continue;
            }
            waiting = ch;
            wt.op = c->op = REQ_NAMES[q->kind];
            if (q->kind == REQ_SEND) sb = ch;
            else ra = ch;
        }
        if (live > 0) waiter_pass(&wt, progressed, waiting, ra, sb);
    }
}

static void execute(Comm *c, struct CommRequest *q) {
    int n = c->size;
    size_t es = comm_type_size(q->t);
    switch (q->kind) {
    case REQ_ALLREDUCE: {
        if (q->send != q->recv && q->count) memcpy(q->recv, q->send, q->count * es);
        Ring g = { q->recv, q->count, (q->count + n - 1) / n, q->t, q->op, 2 * (n - 1), n - 1, c->rank - 1, c->rank - 2 };
        run_ring(c, &g, "all_reduce");
        break;
    }
    case REQ_REDUCE_SCATTER: {
        size_t seg = (q->count + n - 1) / n;
        if (c->work_bytes < q->count * es) { // reused: a fresh large buffer would page-fault on every call
            free(c->work);
            c->work_bytes = q->count * es;
            c->work = xmalloc(c->work_bytes);
        }
        unsigned char *work = c->work;
        if (q->count) memcpy(work, q->send, q->count * es);
        Ring g = { work, q->count, seg, q->t, q->op, n - 1, n - 1, c->rank - 1, c->rank - 2 };
        run_ring(c, &g, "reduce_scatter");
        if (n == 1 && q->op == OP_AVG) finish_avg(work, q->count, q->t, 1);
        size_t off, len;
        seg_range(&g, n, c->rank, &off, &len);
        if (len) memmove(q->recv, work + off * es, len * es);
        break;
    }
    case REQ_ALLGATHER: {
        size_t seg = (q->count + n - 1) / n;
        Ring g = { q->recv, q->count, seg, q->t, OP_SUM, n - 1, 0, c->rank, c->rank - 1 };
        size_t off, len;
        seg_range(&g, n, c->rank, &off, &len);
        if (len && (const unsigned char *)q->send != (unsigned char *)q->recv + off * es)
            memmove((unsigned char *)q->recv + off * es, q->send, len * es);
        run_ring(c, &g, "all_gather");
        break;
    }
    case REQ_BROADCAST:
        run_broadcast(c, q->recv, q->count * es, q->root);
        break;
    default:
        die("internal: bad request kind %d", q->kind);
    }
}

static void *progress_main(void *arg) {
    Comm *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->head && !c->shutdown) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head) {
            pthread_mutex_unlock(&c->mu);
            return NULL;
        }
        struct CommRequest *q = c->head;
        c->head = q->next;
        if (!c->head) c->tail = NULL;
        pthread_mutex_unlock(&c->mu);
        double t0 = now_seconds();
        if (is_p2p(q)) {
            run_p2p(c, q);
        } else {
            execute(c, q);
            mark_done(c, q);
        }
        atomic_fetch_add(&c->busy_ns, (uint64_t)((now_seconds() - t0) * 1e9));
    }
}

// ---------------------------------------------------------------------------------------------
// public calls

static CommRequest *submit(Comm *c, int kind, const void *send, void *recv, size_t count, CommType t, CommOp op,
                           int root, int peer) {
    if ((unsigned)t >= CT_NTYPES || (unsigned)op >= CT_NOPS) die("internal: bad type or op for %s", REQ_NAMES[kind]);
    if ((kind == REQ_BROADCAST && (root < 0 || root >= c->size)) ||
        ((kind == REQ_SEND || kind == REQ_RECV) && (peer < 0 || peer >= c->size || peer == c->rank)))
        die("internal: %s on communicator %s: bad peer %d", REQ_NAMES[kind], c->name, kind == REQ_BROADCAST ? root : peer);
    CommRequest *q = xcalloc(1, sizeof *q);
    *q = (CommRequest){ .c = c, .kind = kind, .send = send, .recv = recv, .count = count, .t = t, .op = op, .root = root, .peer = peer };
    pthread_mutex_lock(&c->mu);
    if (c->tail) c->tail->next = q;
    else c->head = q;
    c->tail = q;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    doorbell_ring(c->bell); // a progress thread sleeping in a point-to-point batch picks it up at once
    return q;
}

CommRequest *comm_iall_reduce(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op) {
    return submit(c, REQ_ALLREDUCE, send, recv, count, t, op, 0, 0);
}
CommRequest *comm_ireduce_scatter(Comm *c, const void *send, void *recv, size_t count, CommType t, CommOp op) {
    return submit(c, REQ_REDUCE_SCATTER, send, recv, count, t, op, 0, 0);
}
CommRequest *comm_iall_gather(Comm *c, const void *send, void *recv, size_t count, CommType t) {
    return submit(c, REQ_ALLGATHER, send, recv, count, t, OP_SUM, 0, 0);
}
CommRequest *comm_ibroadcast(Comm *c, void *buf, size_t count, CommType t, int root) {
    return submit(c, REQ_BROADCAST, buf, buf, count, t, OP_SUM, root, 0);
}
CommRequest *comm_isend(Comm *c, const void *buf, size_t bytes, int peer) {
    return submit(c, REQ_SEND, buf, NULL, bytes, CT_F32, OP_SUM, 0, peer);
}
CommRequest *comm_irecv(Comm *c, void *buf, size_t bytes, int peer) {
    return submit(c, REQ_RECV, NULL, buf, bytes, CT_F32, OP_SUM, 0, peer);
}

void comm_wait(CommRequest *q) {
    Comm *c = q->c;
    double t0 = now_seconds();
    while (!atomic_load(&q->done) && now_seconds() - t0 < 50e-6) sched_yield(); // short operations end here
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&q->done)) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    free(q);
}

int comm_test(CommRequest *q) {
    if (!atomic_load(&q->done)) return 0;
    comm_wait(q);
    return 1;
}

void comm_all_reduce(Comm *c, const void *s, void *r, size_t n, CommType t, CommOp op) { comm_wait(comm_iall_reduce(c, s, r, n, t, op)); }
void comm_reduce_scatter(Comm *c, const void *s, void *r, size_t n, CommType t, CommOp op) { comm_wait(comm_ireduce_scatter(c, s, r, n, t, op)); }
void comm_all_gather(Comm *c, const void *s, void *r, size_t n, CommType t) { comm_wait(comm_iall_gather(c, s, r, n, t)); }
void comm_broadcast(Comm *c, void *buf, size_t n, CommType t, int root) { comm_wait(comm_ibroadcast(c, buf, n, t, root)); }
void comm_send(Comm *c, const void *buf, size_t bytes, int peer) { comm_wait(comm_isend(c, buf, bytes, peer)); }
void comm_recv(Comm *c, void *buf, size_t bytes, int peer) { comm_wait(comm_irecv(c, buf, bytes, peer)); }

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

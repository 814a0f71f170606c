// launch.c: how a process learns its place in the job (the torchrun-style or Slurm environment), and
// the `--nproc N` launcher, which forks N local ranks, forwards signals to them, names the rank that
// stopped answering when the job fails, and never leaves a rank or a shared-memory segment behind
// (launch.h; the top of the communication chain: it uses the bootstrap's status board and sockets).
// The launcher reads top to bottom: open (token, port, board, signals), spawn, wait, close.
#define _GNU_SOURCE
#include "launch.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap.h"
#include "common.h"
#include "sock.h"

// ---------------------------------------------------------------------------------------------
// the launch environment

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
    if (!have_torchrun && !have_slurm && (getenv("RANK") || getenv("WORLD_SIZE"))) // half a launch is no world of one
        die("launch environment: %s is set but %s is not (a torchrun-style launch sets both; unset it for one rank)",
            getenv("RANK") ? "RANK" : "WORLD_SIZE", getenv("RANK") ? "WORLD_SIZE" : "RANK");
    if (!have_torchrun && !have_slurm) { // a world of one: rank 0 serves itself on any free port
        *e = (LaunchEnv){ .rank = 0, .world = 1, .local_world = 1, .master_port = 0 };
        snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
        snprintf(e->token, sizeof e->token, "single");
        snprintf(e->node_id, sizeof e->node_id, "local");
        return 0;
    }
    const char *addr = getenv("MASTER_ADDR");
    if (addr && !*addr) die("launch environment: MASTER_ADDR is empty (rank 0's host name or address, or unset it)");
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
    if (e->local_world < 1 || e->local_world > e->world || e->local_rank >= e->local_world)
        die("launch environment: local rank %d is not inside a node of %d rank(s) (of a world of %d)", e->local_rank,
            e->local_world, e->world);
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

static int launcher_pipe = -1; // the signal handler's only way out: the write end of this call's self-pipe

static void launcher_on_signal(int sig) {
    int e = errno;
    unsigned char b = (unsigned char)sig;
    if (write(launcher_pipe, &b, 1) < 0) (void)0; // full: a wake-up is already pending
    errno = e;
}

static double env_seconds(const char *name, double dflt) {
    const char *v = getenv(name);
    if (!v) return dflt;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 0 && x < 1e7)) die("environment variable %s='%s' is not a number of seconds", name, v);
    return x;
}

static const char *signame(int sig) {
    static const char *const names[] = { [SIGHUP] = "SIGHUP", [SIGINT] = "SIGINT", [SIGQUIT] = "SIGQUIT", [SIGILL] = "SIGILL",
                                         [SIGABRT] = "SIGABRT", [SIGBUS] = "SIGBUS", [SIGFPE] = "SIGFPE", [SIGKILL] = "SIGKILL",
                                         [SIGUSR1] = "SIGUSR1", [SIGSEGV] = "SIGSEGV", [SIGUSR2] = "SIGUSR2",
                                         [SIGPIPE] = "SIGPIPE", [SIGALRM] = "SIGALRM", [SIGTERM] = "SIGTERM",
                                         [SIGSTOP] = "SIGSTOP", [SIGTSTP] = "SIGTSTP" };
    return sig > 0 && sig < (int)(sizeof names / sizeof names[0]) && names[sig] ? names[sig] : "a signal";
}

typedef struct {
    pid_t pid;   // 0 once reaped
    int stopped; // the signal that stopped it, 0 when running
    int ended, status; // reaped, with this wait status
} Child;

static void signal_all(Child *k, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (k[r].pid) kill(k[r].pid, sig);
}

// Stops every rank still running (SIGCONT first to stopped ones, which cannot act on SIGTERM), and
// marks them on the board so that root causes look past them.
static void terminate_all(Child *k, int n, Board *board) {
    for (int r = 0; r < n; r++)
        if (k[r].pid) board_note(board, r, -1, 1);
    signal_all(k, n, SIGTERM);
    signal_all(k, n, SIGCONT);
}

// One line naming why the job failed: the rank that stopped answering, not the one that timed out.
static void report_failure(const Child *k, int n, Board *board, int r, int st) {
    if (WIFSIGNALED(st)) {
        error_line("rank %d was killed by signal %d (%s); stopping the other ranks", r, WTERMSIG(st), signame(WTERMSIG(st)));
        return;
    }
    for (int q = 0; q < n; q++)
        if (k[q].pid && k[q].stopped) {
            error_line("rank %d (pid %d) stopped answering: it was stopped by %s; rank %d gave up waiting; stopping every rank",
                       q, (int)k[q].pid, signame(k[q].stopped), r);
            return;
        }
    char why[256];
    int root = board ? board_root_cause(board, n, r, why, sizeof why) : r;
    if (root != r && k[root].ended) { // how it ended, when the launcher knows
        int rs = k[root].status;
        if (WIFSIGNALED(rs)) snprintf(why, sizeof why, "was killed by signal %d (%s)", WTERMSIG(rs), signame(WTERMSIG(rs)));
        else snprintf(why, sizeof why, "exited with status %d while the others still needed it", WEXITSTATUS(rs));
    }
    // (a root cause that printed its own error has said it: the user reads that line)
    if (root != r && !board_reported(board, root))
        error_line("rank %d %s; rank %d gave up waiting for it; stopping every rank", root, why, r);
    // otherwise the rank said what went wrong itself
}

// The signals the launcher handles; while it forks they are blocked (a rank inherits the mask across
// exec and unblocks SIGUSR1 only once its handler is installed), and the handlers only write to the pipe.
static const int LAUNCHER_SIGS[] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD };
enum { NSIG_HANDLED = sizeof LAUNCHER_SIGS / sizeof LAUNCHER_SIGS[0] };

// One launch_local call's state.
typedef struct {
    int nproc;
    double grace_signal, grace_failure; // seconds before SIGKILL after an interrupt, after a failure
    char token[40];
    int port;          // rank 0's store ...
    int store_fd;      // ... listening already: rank 0 inherits it (-1 once handed over)
    char **argv;       // the ranks': ours minus "--nproc N"
    Board *board;      // NULL without memfd: root causes are then the ranks' own
    int board_fd;
    int pipe[2];       // the signal handlers' self-pipe
    struct sigaction old[NSIG_HANDLED];
    sigset_t orig;     // the signal mask before the launch
    Child *kid;
    int alive;
    double kill_at;    // when stopping: the end of the grace period, then SIGKILL
    double signalled_at; // when the interrupt that stops the job came
    int killed;          // a second interrupt killed the ranks
    LaunchResult res;
} Launcher;

// A fresh job token, a free port for rank 0, the ranks' argv, the board, the self-pipe and the signal
// handlers, with the handled signals blocked.
static void launcher_open(Launcher *L, int nproc, int argc, char **argv) {
    *L = (Launcher){ .nproc = nproc, .board_fd = -1, .store_fd = -1, .res = { LAUNCH_OK, -1, 0, 0 }, .alive = nproc };
    L->grace_signal = env_seconds("LLM4D_KILL_GRACE", 30.0);
    L->grace_failure = L->grace_signal < 5.0 ? L->grace_signal : 5.0;
    unsigned char rnd[16];
    int ufd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (ufd < 0 || read(ufd, rnd, sizeof rnd) != (ssize_t)sizeof rnd) die("cannot read /dev/urandom: %s", strerror(errno));
    close(ufd);
    for (int i = 0; i < 16; i++) snprintf(L->token + 2 * i, 3, "%02x", rnd[i]);
    // rank 0's store socket, bound and listening here and inherited by rank 0: a port found free and
    // closed again could be taken (by another rank's data listener, say) before rank 0 bound it
    L->store_fd = tcp_listen_any(&L->port);
    if (L->store_fd < 0) die("cannot find a free TCP port: %s", strerror(errno));
    L->argv = xcalloc((size_t)argc + 1, sizeof(char *));
    int k = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++;
            continue;
        }
        L->argv[k++] = argv[i];
    }
    L->board = board_create(nproc, &L->board_fd);
    if (pipe2(L->pipe, O_CLOEXEC | O_NONBLOCK) != 0) die("pipe: %s", strerror(errno));
    launcher_pipe = L->pipe[1];
    sigset_t block;
    sigemptyset(&block);
    for (int i = 0; i < NSIG_HANDLED; i++) sigaddset(&block, LAUNCHER_SIGS[i]);
    if (sigprocmask(SIG_BLOCK, &block, &L->orig) != 0) die("sigprocmask: %s", strerror(errno));
    for (int i = 0; i < NSIG_HANDLED; i++) {
        struct sigaction sa = { .sa_handler = launcher_on_signal, .sa_flags = SA_RESTART };
        sigemptyset(&sa.sa_mask);
        if (sigaction(LAUNCHER_SIGS[i], &sa, &L->old[i]) != 0) die("sigaction: %s", strerror(errno));
    }
    L->kid = xcalloc((size_t)nproc, sizeof(Child));
}

// In the forked child: rank r's environment, then this very program.
static void exec_rank(const Launcher *L, int r, pid_t launcher) {
    for (int i = 0; i < NSIG_HANDLED; i++) signal(LAUNCHER_SIGS[i], SIG_DFL);
    sigset_t m = L->orig;
    sigaddset(&m, SIGUSR1);
    sigprocmask(SIG_SETMASK, &m, NULL);
    // the rank dies with its launcher, even when that is killed outright; it has a process group
    // of its own, so that a signal to the launcher's group (Ctrl-C, kill -- -PGID) reaches it once,
    // passed on by the launcher, not twice
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != launcher || setpgid(0, 0) != 0) _exit(1);
    char buf[32];
    snprintf(buf, sizeof buf, "%d", r);
    setenv("RANK", buf, 1);
    setenv("LOCAL_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", L->nproc);
    setenv("WORLD_SIZE", buf, 1);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    setenv("NODE_RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(buf, sizeof buf, "%d", L->port);
    setenv("MASTER_PORT", buf, 1);
    setenv("LLM4D_JOB_TOKEN", L->token, 1);
    if (L->board_fd >= 0) {
        snprintf(buf, sizeof buf, "%d", L->board_fd);
        setenv("LLM4D_BOARD_FD", buf, 1);
    }
    if (r == 0) { // the store's socket survives the exec in rank 0 only (it is close-on-exec elsewhere)
        if (fcntl(L->store_fd, F_SETFD, 0) != 0) {
            error_line("cannot hand rank 0 its store socket: %s", strerror(errno));
            _exit(127);
        }
        snprintf(buf, sizeof buf, "%d", L->store_fd);
        setenv("LLM4D_STORE_FD", buf, 1);
    }
    execv("/proc/self/exe", L->argv); // this very program, even if its file was replaced since
    error_line("cannot start rank %d: %s", r, strerror(errno));
    _exit(127);
}

static void spawn_ranks(Launcher *L) {
    pid_t launcher = getpid();
    for (int r = 0; r < L->nproc; r++) {
        pid_t pid = fork();
        if (pid < 0) die("fork: %s", strerror(errno));
        if (pid == 0) exec_rank(L, r, launcher);
        L->kid[r].pid = pid;
    }
    close(L->store_fd); // rank 0 has it
    L->store_fd = -1;
    sigprocmask(SIG_SETMASK, &L->orig, NULL); // from here on the handlers run, and only write the pipe
}

// What the handlers wrote: SIGUSR1 goes to the ranks; an interrupt stops them (a second one at once).
static void handle_signals(Launcher *L) {
    unsigned char got[64];
    ssize_t nb = read(L->pipe[0], got, sizeof got);
    for (ssize_t i = 0; i < nb; i++) {
        int sig = got[i];
        if (sig == SIGUSR1) { // Slurm's warning before the time limit: the ranks decide
            signal_all(L->kid, L->nproc, SIGUSR1);
        } else if (sig != SIGCHLD) {
            if (L->res.cause == LAUNCH_SIGNALLED) { // a second interrupt: no more grace
                if (now_seconds() - L->signalled_at >= SAME_STOP_S && !L->killed) {
                    fflush(stdout);
                    fprintf(stderr, "received %s again: killing the %d rank(s) still running; what their clean stop had not "
                            "written yet (checkpoint, model) is not written\n", signame(sig), L->alive);
                    signal_all(L->kid, L->nproc, SIGKILL);
                    L->killed = 1;
                }
                continue;
            }
            if (L->res.cause == LAUNCH_OK) {
                // not an error: a stop asked for, which the ranks make cleanly (a checkpoint, the model)
                fflush(stdout);
                fprintf(stderr, "received %s: stopping the %d rank(s) cleanly (a second signal kills them)\n",
                        signame(sig), L->alive);
                L->res = (LaunchResult){ LAUNCH_SIGNALLED, -1, sig, 128 + sig };
                L->signalled_at = now_seconds();
                L->kill_at = L->signalled_at + L->grace_signal;
            }
            terminate_all(L->kid, L->nproc, L->board);
        }
    }
}

// Reaps everything that ended, then judges: when several ranks ended at once, the one a signal
// killed (a crash) goes before those that gave up waiting for it.
static void reap_ranks(Launcher *L) {
    Child *kid = L->kid;
    int first = -1;
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
        if (pid <= 0) break;
        int r = 0;
        while (r < L->nproc && kid[r].pid != pid) r++;
        if (r == L->nproc) continue;
        if (WIFSTOPPED(st)) {
            kid[r].stopped = WSTOPSIG(st);
            board_note(L->board, r, kid[r].stopped, 0);
            continue;
        }
        if (WIFCONTINUED(st)) {
            if (L->res.cause == LAUNCH_OK) { // (after a failure the board keeps it: we continued it to end it)
                kid[r].stopped = 0;
                board_note(L->board, r, 0, 0);
            }
            continue;
        }
        kid[r].pid = 0;
        kid[r].status = st;
        kid[r].ended = 1;
        L->alive--;
        int failed = WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
        if (failed && L->res.cause == LAUNCH_OK && (first < 0 || (WIFSIGNALED(st) && !WIFSIGNALED(kid[first].status))))
            first = r;
    }
    if (first < 0) return;
    int st = kid[first].status;
    report_failure(kid, L->nproc, L->board, first, st);
    L->res = (LaunchResult){ LAUNCH_RANK_FAILED, first, WIFSIGNALED(st) ? WTERMSIG(st) : 0, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st) };
    terminate_all(kid, L->nproc, L->board);
    L->kill_at = now_seconds() + L->grace_failure;
}

// Until every rank has ended: signals, ended ranks, and SIGKILL once a grace period is over.
static void wait_ranks(Launcher *L) {
    while (L->alive > 0) {
        double now = now_seconds();
        if (L->kill_at > 0 && now >= L->kill_at) {
            signal_all(L->kid, L->nproc, SIGKILL);
            L->kill_at = now + 3600;
        }
        struct pollfd p = { .fd = L->pipe[0], .events = POLLIN };
        int wait_ms = L->kill_at > 0 ? (int)((L->kill_at - now) * 1000) + 1 : 1000;
        if (poll(&p, 1, wait_ms) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
        handle_signals(L);
        reap_ranks(L);
    }
}

// Sweeps the job's named shared memory, restores the signal handlers, frees everything.
static void launcher_close(Launcher *L) {
    // Nothing may stay in /dev/shm: the transports use memfds, which go with their processes, and this
    // sweep covers named segments of the job however its ranks ended.
    char pattern[64];
    snprintf(pattern, sizeof pattern, "/dev/shm/llm4d-%.16s-*", L->token);
    glob_t gl;
    if (glob(pattern, 0, NULL, &gl) == 0)
        for (size_t i = 0; i < gl.gl_pathc; i++) unlink(gl.gl_pathv[i]);
    globfree(&gl);
    for (int i = 0; i < NSIG_HANDLED; i++) sigaction(LAUNCHER_SIGS[i], &L->old[i], NULL);
    launcher_pipe = -1;
    close(L->pipe[0]);
    close(L->pipe[1]);
    if (L->board) board_destroy(L->board, L->nproc);
    if (L->board_fd >= 0) close(L->board_fd);
    if (L->store_fd >= 0) close(L->store_fd);
    free(L->kid);
    free(L->argv);
}

int launch_local(int nproc, int argc, char **argv, LaunchResult *result) {
    if (nproc < 1) die("--nproc must be at least 1");
    raise_open_files();
    Launcher L;
    launcher_open(&L, nproc, argc, argv);
    spawn_ranks(&L);
    wait_ranks(&L);
    launcher_close(&L);
    if (result) *result = L.res;
    return L.res.status;
}

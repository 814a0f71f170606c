// verbs_pair: two processes on one machine talk through net_verbs.c over one RDMA device and check
// every byte. The program forks; each process opens the device itself, and the two exchange their
// connection blobs (and two barriers) through a socketpair, standing in for the bootstrap store.
//
//   verbs_pair [--ib-dev D[:P]] [--ib-gid-index N] [--slots N] [--slot-bytes B] [--max-bytes B] [--timeout S]
//       both directions at once: a stream of messages of many sizes (1 byte up to --max-bytes, odd
//       sizes and sizes around the slot size), read back in chunks of other sizes, every byte
//       compared against the generator; the staging ring wraps many times.
//   verbs_pair --kill-peer ...   the second process exits once connected; the first keeps writing and
//       must fail with one line naming the peer ("rank 1 at HOST unreachable over verbs").
//   verbs_pair --list ...        the chosen port and its GID table, each GID's type read both through
//       libibverbs and through sysfs; exits 1 if the two disagree.
// Exit status 0 when everything matched; 1 with one "error: ..." line otherwise.
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "net_verbs.h"

typedef struct {
    VerbsOptions opt;
    unsigned slots;
    size_t slot_bytes, max_bytes;
    double timeout_s;
    int kill_peer, list;
} Args;

static long long parse_num(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end == 'K' || *end == 'M') x <<= *end++ == 'K' ? 10 : 20;
    if (end == s || *end || errno || x < lo || x > hi) die("%s: '%s' is not a number in [%lld, %lld]", flag, s, lo, hi);
    return x;
}

static void write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("socketpair write: %s", k < 0 ? strerror(errno) : "closed");
        p += k, n -= (size_t)k;
    }
}
static void read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("socketpair read: %s", k < 0 ? strerror(errno) : "the other process exited");
        p += k, n -= (size_t)k;
    }
}
static void barrier(int fd) {
    char c = 'b';
    write_all(fd, &c, 1);
    read_all(fd, &c, 1);
}

// Message sizes: tiny and odd ones, the slot size and its neighbours, then doubling up to max.
static size_t make_sizes(size_t *out, size_t cap, size_t slot, size_t max) {
    size_t n = 0, fixed[] = { 1, 2, 3, 7, 8, 13, 64, 1000, 4095, 4096, 4097, slot - 1, slot, slot + 1, 2 * slot + 3, 3 * slot };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && n < cap; i++)
        if (fixed[i] >= 1 && fixed[i] <= max) out[n++] = fixed[i];
    for (size_t s = 8192; s < max && n < cap; s *= 2) out[n++] = s + (s >> 3) + 1; // between powers of two
    if (n < cap) out[n++] = max;
    return n;
}

// Byte j of message m in the stream from process `who`: independent of how anything is cut.
static void fill(unsigned char *p, size_t n, int who, size_t m) {
    for (size_t j = 0; j < n; j += 8) {
        uint64_t v = mix64((uint64_t)who << 56 ^ (uint64_t)m << 40 ^ j / 8);
        size_t k = n - j < 8 ? n - j : 8;
        memcpy(p + j, &v, k);
    }
}

typedef struct {
    VerbsDev *d;
    VerbsEp *e;
    int peer_fd; // the socketpair, watched for the other process's exit; -1: not watched
    double deadline;
} Conn;

// Blocks until a completion arrives (or 100 ms pass); dies at the deadline or when the other process
// has exited, so that one process's failure is reported at once instead of as the other's timeout.
static void wait_progress(Conn *c, const char *doing) {
    int rc = verbs_ep_arm(c->e);
    if (rc < 0) die("%s", verbs_ep_error(c->e));
    if (rc > 0) return;
    struct pollfd p[2] = { { .fd = verbs_ep_fd(c->e), .events = POLLIN }, { .fd = c->peer_fd, .events = POLLRDHUP } };
    if (poll(p, c->peer_fd >= 0 ? 2 : 1, 100) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
    if (c->peer_fd >= 0 && p[1].revents) die("the other process exited while this one was %s", doing);
    if (p[0].revents && verbs_ep_clear(c->e) < 0) die("%s", verbs_ep_error(c->e));
    if (now_seconds() > c->deadline) die("timed out %s", doing);
}

static int run_stream(Conn *c, int me, const Args *a) {
    size_t sizes[64], nsizes = make_sizes(sizes, 64, a->slot_bytes, a->max_bytes);
    unsigned char *out = xmalloc(a->max_bytes), *in = xmalloc(a->max_bytes), *want = xmalloc(a->max_bytes);
    size_t sm = 0, ssent = 0, rm = 0, rgot = 0, chunk_no = 0, total = 0;
    double t0 = now_seconds();
    fill(out, sizes[0], me, 0);
    fill(want, sizes[0], 1 - me, 0);
    while (sm < nsizes || rm < nsizes) {
        int moved = 0;
        if (sm < nsizes) {
            ssize_t k = verbs_send(c->e, out + ssent, sizes[sm] - ssent);
            if (k < 0) die("%s", verbs_ep_error(c->e));
            ssent += (size_t)k, moved |= k > 0;
            if (ssent == sizes[sm]) {
                total += sizes[sm];
                ssent = 0;
                if (++sm < nsizes) fill(out, sizes[sm], me, sm);
            }
        }
        if (rm < nsizes) {
            // read in chunks unrelated to the slots: 1 byte up to 1.5 slots, chosen by a hash
            size_t chunk = 1 + mix64((uint64_t)me << 32 ^ chunk_no++) % (a->slot_bytes + a->slot_bytes / 2);
            size_t left = sizes[rm] - rgot;
            ssize_t k = verbs_recv(c->e, in + rgot, chunk < left ? chunk : left);
            if (k < 0) die("%s", verbs_ep_error(c->e));
            rgot += (size_t)k, moved |= k > 0;
            if (rgot == sizes[rm]) {
                if (memcmp(in, want, sizes[rm])) {
                    size_t j = 0;
                    while (in[j] == want[j]) j++;
                    die("process %d: message %zu (%zu bytes) differs at byte %zu: got 0x%02x, want 0x%02x", me, rm, sizes[rm], j, in[j], want[j]);
                }
                rgot = 0;
                if (++rm < nsizes) fill(want, sizes[rm], 1 - me, rm);
            }
        }
        if (!moved) wait_progress(c, sm < nsizes ? "sending" : "receiving");
    }
    while (!verbs_sent_all(c->e)) { // the last writes acknowledged before anyone tears down
        int rc = verbs_progress(c->e);
        if (rc < 0) die("%s", verbs_ep_error(c->e));
        if (rc == 0) wait_progress(c, "waiting for the last acknowledgements");
    }
    double dt = now_seconds() - t0;
    if (me == 0)
        printf("verbs_pair: %zu messages, %.1f MiB each way, %u slots x %zu bytes, checked in %.2f s (%.1f MiB/s each way)\n", nsizes,
               total / 1048576.0, a->slots, a->slot_bytes, dt, total / 1048576.0 / dt);
    free(out), free(in), free(want);
    return 0;
}

static int run_process(int me, int fd, const Args *a) {
    char err[512], host[64], peer[96];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    snprintf(peer, sizeof peer, "rank %d at %s", 1 - me, host);
    Conn c = { .peer_fd = a->kill_peer ? -1 : fd, .deadline = now_seconds() + a->timeout_s };
    if (!(c.d = verbs_open(&a->opt, err, sizeof err))) die("%s", err);
    if (me == 0) printf("verbs_pair: %s\n", verbs_describe(c.d));
    if (!(c.e = verbs_ep_create(c.d, a->slots, a->slot_bytes, peer, err, sizeof err))) die("%s", err);
    unsigned char mine[VERBS_BLOB_BYTES], theirs[VERBS_BLOB_BYTES];
    verbs_ep_blob(c.e, mine);
    write_all(fd, mine, sizeof mine);
    read_all(fd, theirs, sizeof theirs);
    if (verbs_ep_connect(c.e, theirs) != 0) die("%s", verbs_ep_error(c.e));
    barrier(fd); // both queue pairs ready to receive before either writes
    if (a->kill_peer) {
        if (me == 1) _exit(0); // the kernel destroys this process's queue pair: the peer's writes go unanswered
        unsigned char *buf = xcalloc(1, a->slot_bytes);
        for (;;) { // keep writing until the adapter gives up on the dead peer
            if (verbs_send(c.e, buf, a->slot_bytes) < 0 || verbs_ep_wait(c.e, 100) < 0) die("%s", verbs_ep_error(c.e));
            if (now_seconds() > c.deadline) die("timed out waiting for the dead peer to be reported");
        }
    }
    run_stream(&c, me, a);
    barrier(fd);
    if (verbs_ep_destroy(c.e, err, sizeof err) != 0 || verbs_close(c.d, err, sizeof err) != 0) die("%s", err);
    return 0;
}

int main(int argc, char **argv) {
    Args a = { .opt = { .dev = NULL, .gid_index = -1 }, .slots = 8, .slot_bytes = 64 << 10, .max_bytes = 64 << 20, .timeout_s = 120 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--kill-peer")) a.kill_peer = 1;
        else if (!strcmp(f, "--list")) a.list = 1;
        else if (!v) die("%s needs a value (see the top of test/verbs_pair.c)", f);
        else if (!strcmp(f, "--ib-dev")) a.opt.dev = v, i++;
        else if (!strcmp(f, "--ib-gid-index")) a.opt.gid_index = (int)parse_num(f, v, 0, 1 << 20), i++;
        else if (!strcmp(f, "--slots")) a.slots = (unsigned)parse_num(f, v, 1, 4096), i++;
        else if (!strcmp(f, "--slot-bytes")) a.slot_bytes = (size_t)parse_num(f, v, 1, 1 << 30), i++;
        else if (!strcmp(f, "--max-bytes")) a.max_bytes = (size_t)parse_num(f, v, 1, 1LL << 32), i++;
        else if (!strcmp(f, "--timeout")) a.timeout_s = (double)parse_num(f, v, 1, 3600), i++;
        else die("unknown flag %s (see the top of test/verbs_pair.c)", f);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[512];
    if (a.list) {
        VerbsDev *d = verbs_open(&a.opt, err, sizeof err);
        if (!d) die("%s", err);
        int bad = verbs_print_gids(d, stdout);
        if (verbs_close(d, err, sizeof err) != 0) die("%s", err);
        if (bad < 0) die("cannot read the GID table");
        if (bad > 0) die("%d GID type(s) differ between libibverbs and sysfs", bad);
        return 0;
    }
    VerbsDev *probe = verbs_open(&a.opt, err, sizeof err); // fail once, before there are two processes to say so
    if (!probe) die("%s", err);
    if (verbs_close(probe, err, sizeof err) != 0) die("%s", err);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(sv[0]);
        exit(run_process(1, sv[1], &a));
    }
    close(sv[1]);
    int rc = run_process(0, sv[0], &a), st = 0;
    if (waitpid(pid, &st, 0) < 0) die("waitpid: %s", strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the second process failed (status %d)", st);
    return rc;
}

// Collective tests: every collective against a serial reference computed here, for every type, op,
// count and placement, on the world and on split communicators, two in flight at once, async overlap
// and point-to-point; the connections each communicator holds before and after its first use. Run as
// `test_comm --nproc N [--transport auto|shm|tcp|verbs] [--algo A] [--quick|--small] [--device cpu|cuda]
// [--exit-before-use R] [--lost-member [clean]]` (or under a torchrun/Slurm environment; --exit-before-use: rank R exits once
// the world communicator is made, before any operation, for the failure tests).
//
// Every rank can compute every rank's input (a function of the world rank and the index), so each rank
// checks its own output against a serial reduction in the order the collectives promise: element i
// is x_0[i] (op) x_1[i] (op) ... (op) x_{n-1}[i], communicator ranks in order, accumulated in fp32
// for bf16 (rounded once) and divided by n at the end for avg. Outputs must match bitwise, floats
// included. Buffers come both from registered memory (hostmem_alloc: the single-copy path) and from
// malloc (cross-memory attach, or copies through the ring). With --device cpu every buffer is device
// memory of the stand-in (devmem.h: pointers the host cannot dereference, marks that pass late), so
// the same checks cover the device path: exported handles, reads ordered by marks, TCP staging.
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives.h"
#include "launch.h"
#include "bootstrap.h"
#include "common.h"
#include "devmem.h"
#include "hostmem.h"
#include "kernels.h"

static int failures;
static const DevMem *DEV; // --device cpu: the stand-in's memory for every buffer the collectives move

static uint64_t hash64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// input element i of world rank w for test case `tc`
static void gen(void *dst, size_t count, CommType t, int w, uint64_t tc) {
    for (size_t i = 0; i < count; i++) {
        uint64_t h = hash64(hash64(tc * 1000003ULL + (uint64_t)w) ^ i);
        double u = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        switch (t) {
        case CT_F32: ((float *)dst)[i] = (float)u; break;
        case CT_BF16: ((uint16_t *)dst)[i] = f32_to_bf16((float)u); break;
        case CT_I32: ((int32_t *)dst)[i] = (int32_t)(u * 1000000); break;
        case CT_I64: ((int64_t *)dst)[i] = (int64_t)(u * 1e15); break;
        default: break;
        }
    }
}

// Serial reduction of the whole vector over the communicator's members, in rank order.
static void *reference_reduce(Comm *c, size_t count, CommType t, CommOp op, uint64_t tc) {
    int n = comm_size(c);
    size_t es = comm_type_size(t);
    unsigned char *out = xmalloc(count * es + 1), **in = xmalloc(sizeof(void *) * n);
    for (int r = 0; r < n; r++) {
        in[r] = xmalloc(count * es + 1);
        gen(in[r], count, t, comm_world_rank(c, r), tc);
    }
    // the hierarchy adds each node's members in rank order, then the nodes in order; the fan-in and
    // the ring add every rank in order (one "node")
    int hier = !strcmp(comm_algo(c), "hier");
    for (size_t i = 0; i < count; i++) {
        if (t == CT_F32 || t == CT_BF16) {
            float acc = 0;
            for (int m = 0, seen = 0; seen < n; m++) { // node by node (one node unless hier)
                float part = 0;
                int any = 0;
                for (int r = 0; r < n; r++) {
                    if (hier && comm_node(c, r) != m) continue;
                    float x = t == CT_F32 ? ((float *)in[r])[i] : bf16_to_f32(((uint16_t *)in[r])[i]);
                    part = !any ? x : op == OP_MAX ? (x > part ? x : part) : part + x;
                    any = 1, seen++;
                }
                if (any) acc = m == 0 ? part : op == OP_MAX ? (part > acc ? part : acc) : acc + part;
            }
            if (op == OP_AVG) acc /= (float)n;
            if (t == CT_F32) ((float *)out)[i] = acc;
            else ((uint16_t *)out)[i] = f32_to_bf16(acc);
        } else {
            int64_t acc = 0; // integers wrap like the element type: sum in 64 bits, then truncate
            for (int r = 0; r < n; r++) {
                int64_t x = t == CT_I32 ? ((int32_t *)in[r])[i] : ((int64_t *)in[r])[i];
                acc = r == 0 ? x : op == OP_MAX ? (x > acc ? x : acc) : (int64_t)((uint64_t)acc + (uint64_t)x);
                if (t == CT_I32) acc = (int32_t)acc;
            }
            if (op == OP_AVG) acc /= n;
            if (t == CT_I32) ((int32_t *)out)[i] = (int32_t)acc;
            else ((int64_t *)out)[i] = acc;
        }
    }
    for (int r = 0; r < n; r++) free(in[r]);
    free(in);
    return out;
}

// Host views of test buffers: filled on the host and copied in (put), copied out before comparing.
static void put(void *dst, const void *host, size_t bytes) {
    if (DEV) DEV->copy(dst, host, bytes);
    else memcpy(dst, host, bytes);
}
static void fill(void *dst, size_t count, CommType t, int w, uint64_t tc) {
    if (!DEV) return gen(dst, count, t, w, tc);
    void *h = xmalloc(count * comm_type_size(t) + 1);
    gen(h, count, t, w, tc);
    put(dst, h, count * comm_type_size(t));
    free(h);
}
static void set_bytes(void *dst, int v, size_t bytes) {
    if (!DEV) return (void)memset(dst, v, bytes);
    void *h = xmalloc(bytes + 1);
    memset(h, v, bytes);
    put(dst, h, bytes);
    free(h);
}

static void expect_equal(Comm *c, const char *what, const void *gotp, const void *want, size_t bytes) {
    void *copy = NULL;
    const void *got = gotp;
    if (DEV && bytes) {
        got = copy = xmalloc(bytes);
        DEV->copy(copy, gotp, bytes);
    }
    if (bytes && memcmp(got, want, bytes) != 0) {
        size_t i = 0;
        while (((const unsigned char *)got)[i] == ((const unsigned char *)want)[i]) i++;
        printf("FAIL rank %d: %s on %s: first difference at byte %zu of %zu\n", comm_world_rank(c, comm_rank(c)), what,
               comm_name(c), i, bytes);
        failures++;
    }
    free(copy);
}

static uint64_t case_id;

// Buffers the collectives move: registered memory for most cases, malloc for every third (which
// rank gets which varies, so that both kinds meet in one operation). hostmem_free frees either.
static void *tbuf(Comm *c, size_t bytes, uint64_t tc) {
    if (DEV) return DEV->alloc(bytes);
    return (tc + (uint64_t)comm_world_rank(c, comm_rank(c))) % 3 ? hostmem_alloc(bytes) : xmalloc(bytes);
}
static void tfree(void *p) {
    if (DEV) DEV->free(p);
    else hostmem_free(p);
}

static void test_reductions(Comm *c, size_t count, CommType t, CommOp op, int in_place) {
    int n = comm_size(c), r = comm_rank(c);
    size_t es = comm_type_size(t), seg = (count + n - 1) / n;
    uint64_t tc = ++case_id;
    char what[128];
    unsigned char *want = reference_reduce(c, count, t, op, tc);
    unsigned char *send = tbuf(c, count * es + 1, tc), *recv = tbuf(c, count * es + 1, tc + 1);
    // all-reduce
    fill(send, count, t, comm_world_rank(c, r), tc);
    if (in_place) {
        comm_all_reduce(c, send, send, count, t, op);
        snprintf(what, sizeof what, "all_reduce %s %s count %zu in place", comm_type_name(t), comm_op_name(op), count);
        expect_equal(c, what, send, want, count * es);
    } else {
        set_bytes(recv, 0xab, count * es);
        comm_all_reduce(c, send, recv, count, t, op);
        snprintf(what, sizeof what, "all_reduce %s %s count %zu", comm_type_name(t), comm_op_name(op), count);
        expect_equal(c, what, recv, want, count * es);
    }
    // reduce-scatter: rank r gets segment r
    fill(send, count, t, comm_world_rank(c, r), tc);
    size_t off = (size_t)r * seg < count ? (size_t)r * seg : count;
    size_t len = off + seg < count ? seg : count - off;
    void *dst = in_place ? (void *)send : (void *)recv;
    comm_reduce_scatter(c, send, dst, count, t, op);
    snprintf(what, sizeof what, "reduce_scatter %s %s count %zu%s", comm_type_name(t), comm_op_name(op), count, in_place ? " in place" : "");
    expect_equal(c, what, dst, want + off * es, len * es);
    free(want);
    tfree(send);
    tfree(recv);
}

// Outputs that overlap the input otherwise than exactly in place (collectives.h: reduced from a
// private copy): an all-reduce's output shifted forward and back by an odd count, and a
// reduce-scatter's output shifted by one element inside this rank's own segment, either way, and by a
// whole segment. Counts cross a chunk (64 Ki elements) and, above 1 Mi, the hierarchy's piece.
static void test_overlapping(Comm *c, size_t count) {
    int n = comm_size(c), r = comm_rank(c);
    size_t es = 4, seg = (count + n - 1) / n, k = count / 3 + 1;
    size_t off = (size_t)r * seg < count ? (size_t)r * seg : count, len = off + seg < count ? seg : count - off;
    uint64_t tc = ++case_id;
    char what[160];
    unsigned char *want = reference_reduce(c, count, CT_F32, OP_SUM, tc);
    unsigned char *buf = tbuf(c, 2 * count * es + es, tc); // room for every placement below
    for (int dir = 0; dir < 2; dir++) { // all-reduce: output k elements after the input, then before it
        unsigned char *send = buf + (dir ? k : 0) * es, *recv = buf + (dir ? 0 : k) * es;
        fill(send, count, CT_F32, comm_world_rank(c, r), tc);
        comm_all_reduce(c, send, recv, count, CT_F32, OP_SUM);
        snprintf(what, sizeof what, "all_reduce f32 count %zu, output %s%zu elements from the input", count, dir ? "-" : "+", k);
        expect_equal(c, what, recv, want, count * es);
    }
    // reduce-scatter: the output at the own segment's start plus a shift (elements)
    const long shifts[] = { 1, -1, (long)seg };
    for (int i = 0; i < 3; i++) {
        long at = (long)off + shifts[i];
        size_t base = at < 0 ? (size_t)-at : 0; // where the input starts in buf
        unsigned char *send = buf + base * es, *recv = buf + (size_t)((long)base + at) * es;
        fill(send, count, CT_F32, comm_world_rank(c, r), tc);
        comm_reduce_scatter(c, send, recv, count, CT_F32, OP_SUM);
        snprintf(what, sizeof what, "reduce_scatter f32 count %zu, output at the own segment %+ld elements", count, shifts[i]);
        expect_equal(c, what, recv, want + off * es, len * es);
    }
    free(want);
    tfree(buf);
}

static void test_gather_broadcast(Comm *c, size_t count, CommType t, int in_place) {
    int n = comm_size(c), r = comm_rank(c);
    size_t es = comm_type_size(t), seg = (count + n - 1) / n;
    uint64_t tc = ++case_id;
    char what[128];
    // all-gather: the reference is every rank's generated segment laid end to end
    unsigned char *want = xmalloc(count * es + 1), *part = tbuf(c, seg * es + 1, tc), *out = tbuf(c, count * es + 1, tc + 1);
    for (int q = 0; q < n; q++) {
        size_t off = (size_t)q * seg < count ? (size_t)q * seg : count, len = off + seg < count ? seg : count - off;
        gen(want + off * es, len, t, comm_world_rank(c, q), tc);
    }
    size_t off = (size_t)r * seg < count ? (size_t)r * seg : count, len = off + seg < count ? seg : count - off;
    unsigned char *mine = xmalloc(seg * es + 1);
    gen(mine, seg, t, comm_world_rank(c, r), tc);
    set_bytes(out, 0xcd, count * es);
    if (in_place) {
        put(out + off * es, mine, len * es);
        comm_all_gather(c, out + off * es, out, count, t);
    } else {
        put(part, mine, seg * es);
        comm_all_gather(c, part, out, count, t);
    }
    free(mine);
    snprintf(what, sizeof what, "all_gather %s count %zu%s", comm_type_name(t), count, in_place ? " in place" : "");
    expect_equal(c, what, out, want, count * es);
    // broadcast from the first and the last rank
    for (int root = 0; root < n; root += (n > 1 ? n - 1 : 1)) {
        gen(want, count, t, comm_world_rank(c, root), tc + 7);
        if (r == root) put(out, want, count * es);
        else set_bytes(out, 0xee, count * es);
        comm_broadcast(c, out, count, t, root);
        snprintf(what, sizeof what, "broadcast %s count %zu root %d", comm_type_name(t), count, root);
        expect_equal(c, what, out, want, count * es);
    }
    free(want);
    tfree(part);
    tfree(out);
}

// Two all-reduces in flight on two communicators, plus compute between start and wait.
// Two communicators of the same members, each used by one broadcast only (under the fan-in its pairs
// between non-roots are opened and never carry a byte), destroyed in opposite orders by even and odd
// ranks: closing must not wait for one particular peer (over verbs such a pair is not up yet when it is
// closed), and the broadcasts' values arrive.
static void test_close_order(Comm *world) {
    int r = comm_rank(world);
    Comm *x = comm_split(world, 0, r, "close-x"), *y = comm_split(world, 0, r, "close-y");
    comm_use_device(x, DEV);
    comm_use_device(y, DEV);
    int32_t vx = r == 0 ? 41 : -1, vy = r == 0 ? 42 : -1;
    comm_broadcast(x, &vx, 1, CT_I32, 0);
    comm_broadcast(y, &vy, 1, CT_I32, 0);
    if (vx != 41 || vy != 42) printf("FAIL rank %d: broadcasts before closing gave %d and %d\n", r, (int)vx, (int)vy), failures++;
    comm_barrier(world); // every member has opened x's and y's pairs (comm_destroy's condition)
    comm_destroy(r % 2 ? y : x);
    comm_destroy(r % 2 ? x : y);
}

static void test_concurrent(Comm *a, Comm *b) {
    size_t count = 300007;
    uint64_t ta = ++case_id, tb = ++case_id;
    float *xa = tbuf(a, count * 4, ta), *xb = tbuf(b, count * 4, tb);
    fill(xa, count, CT_F32, comm_world_rank(a, comm_rank(a)), ta);
    fill(xb, count, CT_F32, comm_world_rank(b, comm_rank(b)), tb);
    CommRequest *ra = comm_iall_reduce(a, xa, xa, count, CT_F32, OP_SUM);
    CommRequest *rb = comm_iall_reduce(b, xb, xb, count, CT_F32, OP_SUM);
    // compute while the collectives run
    double s = 0;
    for (int i = 0; i < 2000000; i++) s += (double)i * 1e-9;
    if (s < 0) printf("?");
    comm_wait(rb);
    comm_wait(ra);
    float *wa = reference_reduce(a, count, CT_F32, OP_SUM, ta), *wb = reference_reduce(b, count, CT_F32, OP_SUM, tb);
    expect_equal(a, "concurrent all_reduce (first communicator)", xa, wa, count * 4);
    expect_equal(b, "concurrent all_reduce (second communicator)", xb, wb, count * 4);
    tfree(xa); tfree(xb); free(wa); free(wb);
}

// Every rank sends to the next and receives from the previous at once (a deadlock if serialised).
static void test_p2p(Comm *c) {
    int n = comm_size(c), r = comm_rank(c);
    uint64_t tc = ++case_id; // every rank counts the case, so that inputs stay in step across ranks
    if (n < 2) return;
    size_t bytes = 3 << 20; // larger than a shared-memory ring
    unsigned char *out = tbuf(c, bytes, tc), *in = tbuf(c, bytes, tc + 1), *want = xmalloc(bytes);
    fill(out, bytes / 4, CT_I32, comm_world_rank(c, r), tc);
    gen(want, bytes / 4, CT_I32, comm_world_rank(c, (r + n - 1) % n), tc);
    CommRequest *s = comm_isend(c, out, bytes, (r + 1) % n);
    CommRequest *q = comm_irecv(c, in, bytes, (r + n - 1) % n);
    comm_wait(s);
    comm_wait(q);
    expect_equal(c, "send/recv ring exchange", in, want, bytes);
    tfree(out); tfree(in); free(want);
}

// A pipeline's hand-offs, counted without a clock: ranks 0 and 1 pass a message back and forth (an
// isend, then a blocking receive of the answer on the same communicator, each send waited for before
// its buffer is written again, as pipeline.c does), in registered memory on shared memory. The design:
// the receiver reads the sender's buffer in place (one copy of the message's bytes per hand-off, made
// by the receiver) and the progress thread is never woken (a posted single-copy send is passive, a
// blocking receive runs on the caller). Sleeps, condition waits and yields depend on timing: printed only.
static void test_handoff_counts(Comm *world) {
    int me = comm_rank(world);
    Comm *c = comm_split(world, me < 2 ? 0 : -1, me, "hand-offs");
    uint64_t tc = ++case_id;
    if (!c) return;
    char tr[32];
    if (strcmp(comm_transports(c, tr, sizeof tr), "shm") || DEV) { // the count is shared memory's design
        comm_destroy(c);
        return;
    }
    static const size_t sizes[] = { 4096, 16384, 65536, 1 << 20 };
    enum { ROUNDS = 40 };
    for (int si = 0; si < 4; si++) {
        size_t bytes = sizes[si];
        unsigned char *out[2] = { hostmem_alloc(bytes), hostmem_alloc(bytes) }, *in = hostmem_alloc(bytes), *want = xmalloc(bytes);
        CommRequest *s[2] = { NULL, NULL };
        comm_barrier(c);
        CommCounters a, b;
        comm_counters(c, &a);
        for (int k = 0; k < ROUNDS; k++) {
            int peer = 1 - me, slot = k & 1;
            if (s[slot]) comm_wait(s[slot]); // its reader is done with the buffer
            s[slot] = NULL;
            if (me == 1) comm_recv(c, in, bytes, peer);
            gen(out[slot], bytes / 4, CT_I32, me, tc + (uint64_t)k);
            s[slot] = comm_isend(c, out[slot], bytes, peer);
            if (me == 0) comm_recv(c, in, bytes, peer);
            gen(want, bytes / 4, CT_I32, peer, tc + (uint64_t)k);
            if (memcmp(in, want, bytes)) {
                printf("FAIL rank %d: hand-off %d of %zu bytes arrived wrong\n", comm_world_rank(c, me), k, bytes);
                failures++;
            }
        }
        for (int i = 0; i < 2; i++)
            if (s[i]) comm_wait(s[i]);
        comm_counters(c, &b);
        // per rank: ROUNDS sends and ROUNDS receives; per hand-off (both ranks): 2 * ROUNDS of them
        uint64_t d[6] = { b.progress_wakeups - a.progress_wakeups, b.sleeps - a.sleeps, b.cond_waits - a.cond_waits,
                          b.yields - a.yields, b.copies - a.copies, b.copied_bytes - a.copied_bytes }, sum[6];
        comm_all_reduce(c, d, sum, 6, CT_I64, OP_SUM);
        double h = 2.0 * ROUNDS;
        if (me == 0)
            printf("hand-offs of %zu bytes on shared memory, per hand-off: %.2f copies, %.0f bytes copied, %.2f progress-thread "
                   "wake-ups; %.2f sleeps, %.2f condition waits, %.2f yields (timing)\n",
                   bytes, sum[4] / h, sum[5] / h, sum[0] / h, sum[1] / h, sum[2] / h, sum[3] / h);
        if (me == 0 && (sum[4] != 2 * ROUNDS || sum[5] != 2 * ROUNDS * bytes || sum[0] != 0)) {
            printf("FAIL: hand-offs of %zu bytes: %llu copies of %llu bytes and %llu progress-thread wake-ups for %d "
                   "hand-offs; the design is one copy of the message each and none\n", bytes, (unsigned long long)sum[4],
                   (unsigned long long)sum[5], (unsigned long long)sum[0], 2 * ROUNDS);
            failures++;
        }
        hostmem_free(out[0]), hostmem_free(out[1]), hostmem_free(in), free(want);
    }
    comm_destroy(c);
}

// The connections a communicator holds, counted here from the algorithms' definitions. Connections
// open on first use: none before the first operation; after a collective the pairs the collectives
// use (the fan-in every pair, the ring the two neighbours, the hierarchy the node's other members and
// the same local rank on the neighbouring nodes); send/recv add the pairs they talk over (test_p2p:
// the neighbours in rank order, round the ends; a pipeline's: without the wrap from n-1 to 0), over
// every transport alike.
enum { BEFORE_USE, AFTER_COLLECTIVE, AFTER_P2P, AFTER_CHAIN };
// Whether member p is a pair of c's collectives.
static int algo_pair(Comm *c, int p) {
    int n = comm_size(c), me = comm_rank(c), nodes = 0, lp = 0, lme = 0, m = comm_node(c, me), pm = comm_node(c, p);
    const char *algo = comm_algo(c);
    for (int r = 0; r < n; r++) nodes = comm_node(c, r) + 1 > nodes ? comm_node(c, r) + 1 : nodes;
    for (int q = 0; q < p; q++) lp += comm_node(c, q) == pm; // local ranks
    for (int q = 0; q < me; q++) lme += comm_node(c, q) == m;
    int nb = p == (me + 1) % n || p == (me + n - 1) % n;
    if (!strcmp(algo, "fanin")) return 1;
    if (!strcmp(algo, "ring")) return nb;
    return pm == m || (lp == lme && (pm == (m + 1) % nodes || pm == (m + nodes - 1) % nodes));
}
static void check_connections(Comm *c, int phase) {
    int n = comm_size(c), me = comm_rank(c), want = 0, nodes = 0;
    const char *algo = comm_algo(c);
    for (int r = 0; r < n; r++) nodes = comm_node(c, r) + 1 > nodes ? comm_node(c, r) + 1 : nodes;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        int nb = p == (me + 1) % n || p == (me + n - 1) % n;
        int sent = phase == AFTER_P2P ? nb : phase == AFTER_CHAIN && (p == me + 1 || p == me - 1); // pairs send/recv used
        want += phase != BEFORE_USE && (algo_pair(c, p) || sent);
    }
    static const char *const when[] = { "before its first operation", "after a collective", "after send/recv",
                                        "after a pipeline step and a collective" };
    if (comm_connections(c) != want) {
        printf("FAIL rank %d: --algo %s on %s holds %d connection(s) %s, expected %d\n", comm_world_rank(c, me), algo,
               comm_name(c), comm_connections(c), when[phase], want);
        failures++;
    }
    if (me == 0 && phase == AFTER_COLLECTIVE)
        printf("%s: %d rank(s) on %d node(s), algorithm %s, %d connection(s) at rank 0\n", comm_name(c), n, nodes, algo, want);
}

// A pipeline's hand-offs on a fresh communicator (every member, rank order as stages): activations
// forward r -> r+1, gradients back; each rank then holds its stage neighbours only, one or two, under
// every algorithm, and the collectives' pairs once a collective has run.
static void test_pipeline_connections(Comm *world) {
    int n = comm_size(world), r = comm_rank(world);
    Comm *c = comm_split(world, 0, r, "pipeline");
    int32_t act = r, got = -1;
    if (r > 0) comm_recv(c, &got, sizeof got, r - 1);
    if (r > 0 && got != r - 1) printf("FAIL rank %d: pipeline activation %d from rank %d\n", r, (int)got, r - 1), failures++;
    if (r < n - 1) comm_send(c, &act, sizeof act, r + 1);
    int32_t grad = (r + 1) * 1000, back = -1;
    if (r < n - 1) comm_recv(c, &back, sizeof back, r + 1);
    if (r < n - 1 && back != (r + 2) * 1000) printf("FAIL rank %d: pipeline gradient %d from rank %d\n", r, (int)back, r + 1), failures++;
    if (r > 0) comm_send(c, &grad, sizeof grad, r - 1);
    int stages = (r > 0) + (r < n - 1); // the neighbours the step talked to
    if (comm_connections(c) != stages) {
        printf("FAIL rank %d: pipeline communicator (--algo %s) holds %d connection(s) after a pipeline step, expected its %d neighbour(s)\n",
               comm_world_rank(c, r), comm_algo(c), comm_connections(c), stages);
        failures++;
    }
    if (r == 0) printf("pipeline: %d rank(s), algorithm %s, %d connection(s) at rank 0 after a pipeline step\n", n, comm_algo(c), stages);
    comm_barrier(c);
    check_connections(c, AFTER_CHAIN);
    comm_destroy(c);
}

static void suite(Comm *c, int full, int quick) {
    check_connections(c, BEFORE_USE);
    int32_t one = 1, sum = 0; // the first collective opens the collectives' pairs
    comm_all_reduce(c, &one, &sum, 1, CT_I32, OP_SUM);
    if (sum != comm_size(c)) printf("FAIL rank %d: first all_reduce on %s counted %d\n", comm_rank(c), comm_name(c), (int)sum), failures++;
    check_connections(c, AFTER_COLLECTIVE);
    static const size_t counts[] = { 0, 1, 7, 1000, 1048579 };
    for (int ci = 0; ci < (quick ? 4 : 5); ci++) {
        size_t count = counts[ci];
        for (int t = 0; t < CT_NTYPES; t++) {
            for (int op = 0; op < CT_NOPS; op++)
                for (int ip = 0; ip < 2; ip++) {
                    // the largest count: every type and op out of place, a selection in place
                    if (!full && count > 1000 && (ip || op == OP_AVG)) continue;
                    test_reductions(c, count, (CommType)t, (CommOp)op, ip);
                }
            for (int ip = 0; ip < 2; ip++) test_gather_broadcast(c, count, (CommType)t, ip);
        }
    }
    if (full && !quick) { // above the size whose copies go past the cache (algorithms.h STREAM_BYTES): fp32 sums
        size_t big = (16u << 20) / 4 + 12345;
        test_reductions(c, big, CT_F32, OP_SUM, 0);
        test_reductions(c, big, CT_F32, OP_SUM, 1);
        test_gather_broadcast(c, big, CT_F32, 0);
    }
    if (full) { // across a chunk; under the hierarchy, across its 4 MiB piece too unless --small or --quick
        test_overlapping(c, 140001);
        if (!quick && !strcmp(comm_algo(c), "hier")) test_overlapping(c, (4u << 20) / 4 + 4099);
    }
    test_p2p(c);
    comm_barrier(c);
    check_connections(c, AFTER_P2P);
}

// --lost-member (3 ranks, comm_failures.sh): rank 1 exits once every pair is open; when it is gone,
// ranks 0 and 2 each wait to receive from the other, which never sends. Neither waits for rank 1,
// and each waits for a live rank that waits in turn: the timeout must still name the dead rank 1.
// --lost-member clean: rank 1 leaves the job cleanly instead (destroys the world, exits 0): then it is
// not the cause, and the timeout names the cycle between the live ranks.
static void test_lost_member(Comm *world, int clean) {
    int r = comm_rank(world);
    if (comm_size(world) != 3) die("--lost-member runs on 3 ranks");
    int32_t pid = (int32_t)getpid(), pids[3];
    comm_all_gather(world, &pid, pids, 3, CT_I32);
    comm_barrier(world);
    if (r == 1 && clean) comm_destroy(world), exit(0);
    if (r == 1) _exit(3);
    char st[96];
    const char *state;
    double t0 = now_seconds();
    while (!(state = process_state(pids[1], st, sizeof st)) || strcmp(state, "died")) {
        if (now_seconds() - t0 > 120) die("rank 1 (pid %d) is still there 120 s after it exited", (int)pids[1]);
        usleep(1000); // waiting for the condition, not standing in for it
    }
    int32_t never;
    comm_recv(world, &never, sizeof never, r == 0 ? 2 : 0);
    printf("FAIL rank %d: a receive nobody sends completed\n", r);
    exit(1);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--nproc")) return launch_local(atoi(argv[i + 1]), argc, argv, NULL);
    CommOptions opt = { .timeout = 60, .transport = TRANSPORT_AUTO, .ib_gid_index = -1 };
    int cuda = 0;
    // --quick: the world suite up to 1000 elements (failure tests); --small: every suite up to 1000
    // elements (under emulation, where bandwidth is scarce)
    // --handoffs: only the hand-offs' counts (test_handoff_counts)
    int quick = 0, small = 0, handoffs = 0, exit_unused = -1, lost = 0;
    for (int i = 1; i < argc; i++)
        quick |= !strcmp(argv[i], "--quick"), small |= !strcmp(argv[i], "--small"), handoffs |= !strcmp(argv[i], "--handoffs"),
        lost |= !strcmp(argv[i], "--lost-member") ? 1 + (i + 1 < argc && !strcmp(argv[i + 1], "clean")) : 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--comm-timeout")) opt.timeout = atof(argv[i + 1]);
        if (!strcmp(argv[i], "--exit-before-use")) exit_unused = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--transport") && (opt.transport = comm_parse_transport(argv[i + 1])) < 0)
            die("--transport must be auto, shm, tcp or verbs");
        if (!strcmp(argv[i], "--algo") && (opt.algo = comm_parse_algo(argv[i + 1])) < 0)
            die("--algo must be auto, fanin, ring or hier");
        if (!strcmp(argv[i], "--device")) {
            if (!strcmp(argv[i + 1], "cpu")) DEV = devmem_cpu();
            else if (!strcmp(argv[i + 1], "cuda") && backend_cuda()) cuda = 1; // the table once the device is chosen
            else die("--device must be cpu (the stand-in) or cuda (a CUDA build), got '%s'", argv[i + 1]);
        }
    }
    LaunchEnv env;
    launch_env_read(&env); // without a launcher: a world of one
    if (cuda) { // this rank's GPU of the node, chosen before any context exists
        int ndev = cuda_device_count();
        if (ndev == 0) die("--device cuda: no CUDA device is available");
        cuda_use_device(env.local_rank % ndev);
        DEV = devmem_cuda();
    }
    // the ring and the hierarchy move host memory only so far: with device memory auto is the fan-in
    if (DEV && opt.algo == COMM_ALGO_AUTO) opt.algo = COMM_ALGO_FANIN;
    Comm *world = comm_init(&env, &opt);
    comm_use_device(world, DEV);
    int r = comm_rank(world), n = comm_size(world);
    if (r == exit_unused) exit(3); // a member gone before any pair of the world is open (comm_failures.sh)
    if (lost) test_lost_member(world, lost == 2);
    if (!handoffs) suite(world, 1, quick || small);
    test_handoff_counts(world);
    if (!handoffs) test_pipeline_connections(world);
    if (!quick && !handoffs) {
        Comm *parity = comm_split(world, r % 2, r, "parity");
        Comm *reversed = comm_split(world, 0, n - r, "reversed"); // same members, opposite rank order
        comm_use_device(parity, DEV);
        comm_use_device(reversed, DEV);
        suite(parity, 0, small);
        suite(reversed, 0, small);
        test_concurrent(parity, reversed);
        test_concurrent(world, parity);
        comm_destroy(parity);
        comm_destroy(reversed);
        test_close_order(world);
    }
    if (DEV == devmem_cpu()) { // every mark the collectives took was given back
        long marks, released;
        devmem_cpu_counts(&marks, &released);
        if (marks == 0 || marks != released) {
            printf("FAIL rank %d: the device stand-in's marks: %ld taken, %ld released\n", r, marks, released);
            failures++;
        }
    }
    int total = 0; // host memory on a device communicator: the host path
    comm_all_reduce(world, &failures, &total, 1, CT_I32, OP_SUM);
    if (r == 0) printf("collectives on %d rank(s)%s: %s (%d failure(s) over all ranks)\n", n, DEV ? ", device memory" : "", total ? "FAIL" : "ok", total);
    comm_destroy(world);
    return total ? 1 : 0;
}

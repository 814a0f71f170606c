// Unit tests of the CPU backend and the file formats, built with AddressSanitizer and UBSan.
// Kernels are checked against naive double-precision loops written here (and fused kernels against the
// unfused ones); formats by round trips. Shapes are chosen off every tile size (odd T, C not a multiple
// of 16, K spanning several GEMM slices, one head, many heads).
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collectives.h"
#include "launch.h"
#include "common.h"
#include "data.h"
#include "kernels.h"
#include "model.h"

static int passed, failed;

static void check(int ok, const char *name, double detail) {
    if (ok) passed++;
    else failed++;
    printf("%s %s (%g)\n", ok ? "ok" : "FAIL", name, detail);
}

static uint64_t rng_state = 88172645463325252ULL;
static float frand(void) { // uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) / 8388608.0 - 1.0);
}
static float *randv(size_t n) {
    float *p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}
static double max_rel(const float *a, const double *ref, size_t n) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs(a[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    return scale > 0 ? err / scale : err;
}

static void test_bf16(void) {
    // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even mantissa (1.0);
    // 1 + 3·2^-8 is halfway too and goes up to 1 + 2^-6.
    check(f32_to_bf16(1.0f + 1.0f / 256) == f32_to_bf16(1.0f), "bf16 tie rounds to even (down)", 0);
    check(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64, "bf16 tie rounds to even (up)", 0);
    check(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 4096)) == 1.0f + 1.0f / 128, "bf16 above half rounds up", 0);
    check(isnan(bf16_to_f32(f32_to_bf16(NAN))), "bf16 keeps NaN", 0);
    check(bf16_to_f32(f32_to_bf16(-3.5f)) == -3.5f, "bf16 exact values survive", 0);
}

// out[N,OC] = inp·Wᵀ + b against a double loop, for shapes off every tile size, and the backward.
static void test_matmul(const Backend *be, int N, int C, int OC) {
    float *inp = randv((size_t)N * C), *w = randv((size_t)OC * C), *b = randv(OC), *dout = randv((size_t)N * OC);
    float *out = xcalloc((size_t)N * OC, 4), *dinp = xcalloc((size_t)N * C, 4);
    float *dw = xcalloc((size_t)OC * C, 4), *db = xcalloc(OC, 4);
    double *ref = xcalloc((size_t)N * OC, 8), *rdi = xcalloc((size_t)N * C, 8), *rdw = xcalloc((size_t)OC * C, 8);
    double *rdb = xcalloc(OC, 8);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b[o];
            for (int c = 0; c < C; c++) s += (double)inp[n * C + c] * w[o * C + c];
            ref[n * OC + o] = s;
            rdb[o] += dout[n * OC + o] * 2.0; // accumulated twice below
            for (int c = 0; c < C; c++) {
                rdi[n * C + c] += (double)dout[n * OC + o] * w[o * C + c];
                rdw[o * C + c] += 2.0 * dout[n * OC + o] * inp[n * C + c];
            }
        }
    be->matmul_fwd(DT_F32, out, NULL, inp, w, b, N, C, OC);
    be->matmul_bwd(DT_F32, dinp, dw, db, dout, inp, w, NULL, N, C, OC);
    be->matmul_bwd(DT_F32, dinp, dw, db, dout, inp, w, NULL, N, C, OC); // dinp overwritten, dw/db accumulate
    char name[128];
    snprintf(name, sizeof name, "matmul %dx%dx%d forward", N, C, OC);
    check(max_rel(out, ref, (size_t)N * OC) < 1e-5, name, max_rel(out, ref, (size_t)N * OC));
    snprintf(name, sizeof name, "matmul %dx%dx%d dinp (overwritten)", N, C, OC);
    check(max_rel(dinp, rdi, (size_t)N * C) < 1e-5, name, max_rel(dinp, rdi, (size_t)N * C));
    snprintf(name, sizeof name, "matmul %dx%dx%d dweight and dbias (accumulated)", N, C, OC);
    double e = fmax(max_rel(dw, rdw, (size_t)OC * C), max_rel(db, rdb, OC));
    check(e < 1e-5, name, e);
    free(inp); free(w); free(b); free(dout); free(out); free(dinp); free(dw); free(db);
    free(ref); free(rdi); free(rdw); free(rdb);
}

// Every kernel whose work is split over threads, with 1 and 2 threads: bit for bit the same.
static void test_thread_determinism(const Backend *be) {
    int N = 150, C = 300, OC = 200, B = 2, T = 45, AC = 48, NH = 3, V = 300;
    float *inp = randv((size_t)N * C), *w = randv((size_t)OC * C), *dout = randv((size_t)N * OC), *b = randv(OC);
    float *qkv = randv((size_t)B * T * 3 * AC), *ady = randv((size_t)B * T * AC), *logits = randv((size_t)N * V);
    uint16_t *ib = xmalloc(2 * (size_t)N * C), *wb = xmalloc(2 * (size_t)OC * C);
    for (size_t i = 0; i < (size_t)N * C; i++) ib[i] = f32_to_bf16(inp[i]);
    for (size_t i = 0; i < (size_t)OC * C; i++) wb[i] = f32_to_bf16(w[i]);
    int32_t *tg = xmalloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) tg[n] = (n * 37) % V;
    size_t sizes[] = { (size_t)N * OC, (size_t)N * OC, (size_t)OC * C, (size_t)N * OC, (size_t)B * T * AC,
                       (size_t)B * NH * T, (size_t)B * T * 3 * AC, (size_t)N * C, (size_t)N * C, 2 * (size_t)C,
                       (size_t)N * V, 3 * (size_t)N };
    enum { NOUT = sizeof sizes / sizeof sizes[0] };
    float *res[2][NOUT];
    double s[2];
    for (int r = 0; r < 2; r++) {
        be->set_threads(r + 1);
        for (int i = 0; i < NOUT; i++) res[r][i] = xcalloc(sizes[i], 4);
        float **o = res[r];
        be->matmul_fwd(DT_F32, o[0], o[1], inp, w, b, N, C, OC);
        be->matmul_bwd(DT_F32, NULL, o[2], NULL, dout, inp, w, NULL, N, C, OC);
        be->matmul_fwd(DT_BF16, o[3], NULL, ib, wb, NULL, N, C, OC); // bf16 output: half the buffer
        be->attention_fwd(DT_F32, o[4], o[5], qkv, B, T, AC, NH);
        be->attention_bwd(DT_F32, o[6], ady, qkv, o[4], o[5], B, T, AC, NH);
        float *st = o[11];
        be->residual_layernorm_fwd(DT_F32, o[7], o[8], st, st + N, inp, inp, w, w + C, N, C);
        be->layernorm_bwd(DT_F32, o[7], o[9], o[9] + C, o[8], inp, w, st, st + N, N, C);
        be->crossentropy_fused(DT_F32, o[10], st, st + N, st + 2 * N, logits, tg, 0.5f, N, V - 10, V);
        s[r] = be->sumsq(o[2], (size_t)OC * C);
    }
    int same = s[0] == s[1];
    for (int i = 0; i < NOUT; i++) same &= !memcmp(res[0][i], res[1][i], 4 * sizes[i]);
    check(same, "results independent of the thread count (matmuls fp32 and bf16, attention, LayerNorm, cross-entropy)", 0);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NOUT; i++) free(res[r][i]);
    free(inp); free(w); free(dout); free(b); free(qkv); free(ady); free(logits); free(ib); free(wb); free(tg);
}

static void test_sumsq(const Backend *be) {
    size_t n = 200003;
    float *x = randv(n);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    double got = be->sumsq(x, n);
    check(fabs(got - ref) / ref < 1e-12, "sumsq", fabs(got - ref) / ref);
    free(x);
}

// cast_rows against a plain loop: every dtype pair, rows narrower than their strides; the elements
// between the rows stay untouched.
static void test_cast_rows(const Backend *be) {
    size_t rows = 37, n = 21, ss = 50, ds = 29;
    float *src = randv(rows * ss);
    for (int pair = 0; pair < 4; pair++) {
        DType sdt = pair & 1 ? DT_BF16 : DT_F32, ddt = pair & 2 ? DT_BF16 : DT_F32;
        size_t se = dtype_size(sdt), de = dtype_size(ddt);
        unsigned char *s = xmalloc(rows * ss * se), *d = xmalloc(rows * ds * de), *want = xmalloc(rows * ds * de);
        for (size_t i = 0; i < rows * ss; i++) {
            if (sdt == DT_F32) memcpy(s + 4 * i, &src[i], 4);
            else {
                uint16_t h = f32_to_bf16(src[i]);
                memcpy(s + 2 * i, &h, 2);
            }
        }
        memset(d, 0x5a, rows * ds * de);
        memset(want, 0x5a, rows * ds * de);
        for (size_t r = 0; r < rows; r++)
            for (size_t i = 0; i < n; i++) {
                float v;
                if (sdt == DT_F32) memcpy(&v, s + 4 * (r * ss + i), 4);
                else {
                    uint16_t h;
                    memcpy(&h, s + 2 * (r * ss + i), 2);
                    v = bf16_to_f32(h);
                }
                if (ddt == DT_F32) memcpy(want + 4 * (r * ds + i), &v, 4);
                else {
                    uint16_t h = f32_to_bf16(v);
                    memcpy(want + 2 * (r * ds + i), &h, 2);
                }
            }
        be->cast_rows(d, ddt, ds, s, sdt, ss, rows, n);
        char name[64];
        snprintf(name, sizeof name, "cast_rows %s <- %s", dtype_name(ddt), dtype_name(sdt));
        check(memcmp(d, want, rows * ds * de) == 0, name, 0);
        free(s);
        free(d);
        free(want);
    }
    free(src);
}

// Runs fn in a child process; returns 1 when it exited with status 1 and its stderr holds `expect`.
static int dies_with(void (*fn)(const Backend *), const Backend *be, const char *expect) {
    int fd[2];
    if (pipe(fd) != 0) die("pipe failed");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
        close(fd[0]);
        if (dup2(fd[1], 2) < 0) _exit(3);
        fn(be);
        _exit(0);
    }
    close(fd[1]);
    char buf[1024] = "";
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    buf[got] = 0;
    close(fd[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) die("waitpid failed");
    return WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(buf, expect) != NULL;
}
static BackendEvent *g_child_event; // reachable at the child's exit: no leak report
static void wait_unrecorded(const Backend *be) {
    g_child_event = be->event_create();
    be->stream_wait(STREAM_COMM, g_child_event);
}
static void sync_unrecorded(const Backend *be) {
    g_child_event = be->event_create();
    be->event_sync(g_child_event);
}
static void bad_stream(const Backend *be) { be->set_stream((StreamId)2); }
static void record_bad_stream(const Backend *be) {
    g_child_event = be->event_create();
    be->event_record(g_child_event, (StreamId)-1);
}

// The stream and event stand-ins: the bookkeeping of records, set_stream's previous stream, and the
// protocol errors that would be silent races on a GPU; sumsq_acc against sumsq.
static void test_streams(const Backend *be) {
    BackendEvent *e = be->event_create();
    int ok = e && e->stream == -1 && e->records == 0;
    be->event_record(e, STREAM_COMPUTE);
    ok &= e->stream == STREAM_COMPUTE && e->records == 1;
    be->stream_wait(STREAM_COMM, e);
    StreamId prev = be->set_stream(STREAM_COMM);
    ok &= prev == STREAM_COMPUTE;
    be->event_record(e, STREAM_COMM); // the reverse direction
    be->stream_wait(STREAM_COMPUTE, e);
    ok &= e->stream == STREAM_COMM && e->records == 2 && be->event_done(e) == 1;
    be->event_sync(e);
    ok &= be->set_stream(prev) == STREAM_COMM;
    be->event_destroy(e);
    check(ok, "events: records, streams and set_stream's previous stream", 0);
    check(dies_with(wait_unrecorded, be, "error: backend stream_wait: the event was never recorded"),
          "events: waiting for an event never recorded is an error", 0);
    check(dies_with(sync_unrecorded, be, "error: backend event_sync: the event was never recorded"),
          "events: the host waiting for an event never recorded is an error", 0);
    check(dies_with(bad_stream, be, "error: backend set_stream: stream 2 is not a stream"), "events: unknown stream", 0);
    check(dies_with(record_bad_stream, be, "error: backend event_record: stream -1 is not a stream"),
          "events: recording on an unknown stream", 0);

    size_t n = 150001; // three chunks of the fixed order
    float *x = randv(n), *y = randv(1000);
    double acc = 1.25, ref = 1.25;
    be->sumsq_acc(&acc, x, n);
    be->sumsq_acc(&acc, y, 1000);
    ref += be->sumsq(x, n);
    ref += be->sumsq(y, 1000);
    check(memcmp(&acc, &ref, sizeof acc) == 0, "sumsq_acc adds what sumsq returns, bitwise", acc - ref);
    check(be->scratch_bytes() > 0, "scratch_bytes counts the kernels' scratch pool", (double)be->scratch_bytes());
    free(x);
    free(y);
}

// Cross-entropy split over two vocabulary slices (as tensor parallelism does), combined here, against
// a direct softmax over the real vocabulary; padding columns never count.
static void test_crossentropy(const Backend *be) {
    int N = 5, V = 13, Vloc = 8; // slice 0: columns 0-7, slice 1: 8-12 real, 13-15 padding
    float *logits = randv((size_t)N * 2 * Vloc), *dl = xcalloc((size_t)N * 2 * Vloc, 4);
    int32_t targets[5] = { 0, 12, 3, 8, 7 };
    float mx[2][5], sm[2][5], tg[2][5], gmax[5], gsum[5];
    for (int n = 0; n < N; n++)
        for (int j = V - Vloc; j < Vloc; j++) logits[(size_t)Vloc * N + n * Vloc + j] = 100.0f; // padding
    for (int s = 0; s < 2; s++)
        be->crossentropy_stats(DT_F32, mx[s], sm[s], tg[s], logits + (size_t)s * N * Vloc, targets, N, s * Vloc,
                               s == 0 ? Vloc : V - Vloc, Vloc);
    double err = 0, pad = 0;
    for (int n = 0; n < N; n++) {
        gmax[n] = mx[0][n] > mx[1][n] ? mx[0][n] : mx[1][n];
        gsum[n] = sm[0][n] * expf(mx[0][n] - gmax[n]) + sm[1][n] * expf(mx[1][n] - gmax[n]);
        double loss = log(gsum[n]) + gmax[n] - (tg[0][n] + tg[1][n]);
        double s = 0, x[13];
        for (int j = 0; j < V; j++) {
            x[j] = logits[(size_t)(j / Vloc) * N * Vloc + n * Vloc + j % Vloc];
            s += exp(x[j]);
        }
        err = fmax(err, fabs(loss - (log(s) - x[targets[n]])));
    }
    for (int s = 0; s < 2; s++)
        be->crossentropy_bwd(DT_F32, dl + (size_t)s * N * Vloc, logits + (size_t)s * N * Vloc, targets, gmax, gsum, 0.5f,
                             N, s * Vloc, s == 0 ? Vloc : V - Vloc, Vloc);
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int j = 0; j < V; j++) s += exp(logits[(size_t)(j / Vloc) * N * Vloc + n * Vloc + j % Vloc]);
        for (int j = 0; j < V; j++) {
            size_t at = (size_t)(j / Vloc) * N * Vloc + n * Vloc + j % Vloc;
            double g = (exp(logits[at]) / s - (j == targets[n])) * 0.5;
            err = fmax(err, fabs(dl[at] - g));
        }
        for (int j = V - Vloc; j < Vloc; j++) pad = fmax(pad, fabs(dl[(size_t)Vloc * N + n * Vloc + j]));
    }
    check(err < 1e-5 && pad == 0, "cross-entropy over vocabulary slices, padding excluded", err + pad);
    free(logits);
    free(dl);
}

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_grad_d(double x) {
    double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

// The GELU epilogues: forward pre = x·Wᵀ + b, out = gelu(pre); backward dinp = (dout·W) · gelu'(pre).
static void test_matmul_gelu(const Backend *be, int N, int C, int OC) {
    float *inp = randv((size_t)N * C), *w = randv((size_t)OC * C), *b = randv(OC), *dout = randv((size_t)N * OC);
    float *gpre = randv((size_t)N * C), *out = xcalloc((size_t)N * OC, 4), *pre = xcalloc((size_t)N * OC, 4);
    float *dinp = xcalloc((size_t)N * C, 4), *dw = xcalloc((size_t)OC * C, 4);
    double *rpre = xcalloc((size_t)N * OC, 8), *rout = xcalloc((size_t)N * OC, 8), *rdi = xcalloc((size_t)N * C, 8);
    for (size_t i = 0; i < (size_t)N * C; i++) gpre[i] *= 3.0f;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = b[o];
            for (int c = 0; c < C; c++) acc += (double)inp[n * C + c] * w[o * C + c];
            rpre[n * OC + o] = acc;
            rout[n * OC + o] = gelu_d(acc);
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int o = 0; o < OC; o++) acc += (double)dout[n * OC + o] * w[o * C + c];
            rdi[n * C + c] = acc * gelu_grad_d(gpre[n * C + c]);
        }
    be->matmul_fwd(DT_F32, out, pre, inp, w, b, N, C, OC);
    be->matmul_bwd(DT_F32, dinp, dw, NULL, dout, inp, w, gpre, N, C, OC);
    double e = fmax(max_rel(pre, rpre, (size_t)N * OC), max_rel(out, rout, (size_t)N * OC));
    char name[160];
    snprintf(name, sizeof name, "matmul %dx%dx%d with bias and GELU in the epilogue", N, C, OC);
    check(e < 1e-5, name, e);
    e = max_rel(dinp, rdi, (size_t)N * C);
    snprintf(name, sizeof name, "matmul %dx%dx%d backward with GELU's derivative in the epilogue", N, C, OC);
    check(e < 1e-5, name, e);
    free(inp); free(w); free(b); free(dout); free(gpre); free(out); free(pre); free(dinp); free(dw);
    free(rpre); free(rout); free(rdi);
}

static float *bf16_to_floats(const uint16_t *h, size_t n) {
    float *f = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    return f;
}
static uint16_t *rand_bf16(size_t n) {
    uint16_t *h = xmalloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(frand());
    return h;
}
static double max_rel_f(const float *a, const float *ref, size_t n) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)a[i] - ref[i]));
        scale = fmax(scale, fabs((double)ref[i]));
    }
    return scale > 0 ? err / scale : err;
}

// bf16 matmuls on both paths (the AVX512-BF16 dot product when the CPU has it, and the generic widening
// path): against the fp32 matmul of the same bf16 values, within bf16 tolerance; the fp32 parameter
// gradient, whose products are exact, much closer. Both paths also against each other.
static void test_matmul_bf16(const Backend *be, int N, int C, int OC) {
    uint16_t *inp = rand_bf16((size_t)N * C), *w = rand_bf16((size_t)OC * C), *b = rand_bf16(OC);
    uint16_t *dout = rand_bf16((size_t)N * OC), *gp = rand_bf16((size_t)N * C);
    float *fi = bf16_to_floats(inp, (size_t)N * C), *fw = bf16_to_floats(w, (size_t)OC * C), *fb = bf16_to_floats(b, OC);
    float *fd = bf16_to_floats(dout, (size_t)N * OC), *fg = bf16_to_floats(gp, (size_t)N * C);
    // fp32 reference on the same values
    float *rout = xcalloc((size_t)N * OC, 4), *rpre = xcalloc((size_t)N * OC, 4), *rdi = xcalloc((size_t)N * C, 4);
    float *rdw = xcalloc((size_t)OC * C, 4);
    be->matmul_fwd(DT_F32, rout, rpre, fi, fw, fb, N, C, OC);
    be->matmul_bwd(DT_F32, rdi, rdw, NULL, fd, fi, fw, fg, N, C, OC);
    const char *paths[2] = { "generic", "avx512bf16" };
    float *outs[2][3] = { { NULL } };
    for (int p = 0; p < 2; p++) {
        char name[200];
        if (!cpu_select_isa(paths[p])) {
            snprintf(name, sizeof name, "bf16 matmul %dx%dx%d on the %s path: this CPU lacks it, skipped", N, C, OC, paths[p]);
            check(1, name, 0);
            continue;
        }
        uint16_t *out = xcalloc((size_t)N * OC, 2), *pre = xcalloc((size_t)N * OC, 2), *dinp = xcalloc((size_t)N * C, 2);
        float *dw = xcalloc((size_t)OC * C, 4);
        be->matmul_fwd(DT_BF16, out, pre, inp, w, b, N, C, OC);
        be->matmul_bwd(DT_BF16, dinp, dw, NULL, dout, inp, w, gp, N, C, OC);
        outs[p][0] = bf16_to_floats(out, (size_t)N * OC);
        outs[p][1] = bf16_to_floats(dinp, (size_t)N * C);
        outs[p][2] = dw;
        double e = fmax(max_rel_f(outs[p][0], rout, (size_t)N * OC), max_rel_f(outs[p][1], rdi, (size_t)N * C));
        double ew = max_rel_f(dw, rdw, (size_t)OC * C);
        snprintf(name, sizeof name, "bf16 matmul %dx%dx%d (%s path) against fp32: out, dinp 1e-2, dweight 1e-5", N, C, OC,
                 paths[p]);
        check(e < 1e-2 && ew < 1e-5, name, fmax(e, ew));
        free(out); free(pre); free(dinp);
    }
    if (outs[0][0] && outs[1][0]) {
        double e = 0;
        size_t n[3] = { (size_t)N * OC, (size_t)N * C, (size_t)OC * C };
        for (int i = 0; i < 3; i++) e = fmax(e, max_rel_f(outs[1][i], outs[0][i], n[i]));
        char name[160];
        snprintf(name, sizeof name, "bf16 matmul %dx%dx%d: avx512bf16 and generic paths agree within 1e-2", N, C, OC);
        check(e < 1e-2, name, e);
    }
    cpu_select_isa(NULL);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 3; i++) free(outs[p][i]);
    free(inp); free(w); free(b); free(dout); free(gp); free(fi); free(fw); free(fb); free(fd); free(fg);
    free(rout); free(rpre); free(rdi); free(rdw);
}

// Residual add + LayerNorm forward against double loops (the residual bitwise), the plain LayerNorm
// bitwise equal to the fused one, and the backward (accumulating) against double loops.
static void test_layernorm(const Backend *be, int N, int C) {
    float *a = randv((size_t)N * C), *b = randv((size_t)N * C), *w = randv(C), *bias = randv(C), *dy = randv((size_t)N * C);
    float *res = xcalloc((size_t)N * C, 4), *out = xcalloc((size_t)N * C, 4), *out2 = xcalloc((size_t)N * C, 4);
    float *mean = xcalloc(N, 4), *rstd = xcalloc(N, 4), *mean2 = xcalloc(N, 4), *rstd2 = xcalloc(N, 4);
    float *dinp = randv((size_t)N * C), *dw = randv(C), *db = randv(C);
    double *rout = xcalloc((size_t)N * C, 8), *rdi = xcalloc((size_t)N * C, 8), *rdw = xcalloc(C, 8), *rdb = xcalloc(C, 8);
    double *rmean = xcalloc(N, 8), *rrstd = xcalloc(N, 8);
    int res_exact = 1;
    be->residual_layernorm_fwd(DT_F32, res, out, mean, rstd, a, b, w, bias, N, C);
    be->layernorm_fwd(DT_F32, out2, mean2, rstd2, res, w, bias, N, C);
    for (int c = 0; c < C; c++) rdw[c] = dw[c], rdb[c] = db[c];
    for (int n = 0; n < N; n++) {
        const float *x = res + (size_t)n * C;
        double m = 0, v = 0, dmean = 0, ddot = 0;
        for (int c = 0; c < C; c++) res_exact &= x[c] == a[n * C + c] + b[n * C + c], m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        double s = 1.0 / sqrt(v / C + 1e-5);
        rmean[n] = m, rrstd[n] = s;
        for (int c = 0; c < C; c++) {
            double xn = (x[c] - m) * s, dn = (double)w[c] * dy[n * C + c];
            rout[n * C + c] = xn * w[c] + bias[c];
            dmean += dn, ddot += dn * xn;
            rdw[c] += dy[n * C + c] * xn, rdb[c] += dy[n * C + c];
        }
        dmean /= C, ddot /= C;
        for (int c = 0; c < C; c++) {
            double xn = (x[c] - m) * s, dn = (double)w[c] * dy[n * C + c];
            rdi[n * C + c] = dinp[n * C + c] + (dn - dmean - xn * ddot) * s;
        }
    }
    double e = fmax(max_rel(out, rout, (size_t)N * C), fmax(max_rel(mean, rmean, N), max_rel(rstd, rrstd, N)));
    char name[160];
    snprintf(name, sizeof name, "residual + LayerNorm %dx%d forward (the plain LayerNorm bitwise the same)", N, C);
    check(e < 1e-5 && res_exact && !memcmp(out, out2, 4 * (size_t)N * C) && !memcmp(rstd, rstd2, 4 * (size_t)N), name, e);
    be->layernorm_bwd(DT_F32, dinp, dw, db, dy, res, w, mean, rstd, N, C);
    e = fmax(max_rel(dinp, rdi, (size_t)N * C), fmax(max_rel(dw, rdw, C), max_rel(db, rdb, C)));
    snprintf(name, sizeof name, "LayerNorm %dx%d backward (dinp, dweight, dbias accumulated)", N, C);
    check(e < 1e-5, name, e);
    free(a); free(b); free(w); free(bias); free(dy); free(res); free(out); free(out2); free(mean); free(rstd);
    free(mean2); free(rstd2); free(dinp); free(dw); free(db); free(rout); free(rdi); free(rdw); free(rdb);
    free(rmean); free(rrstd);
}

// Naive causal attention in double over qkv[B,T,3C]: out[B,T,C], lse[B,NH,T] and, with dout, dqkv.
static void ref_attention(const float *qkv, const float *dout, int B, int T, int C, int NH, double *out, double *lse,
                          double *dqkv) {
    int hs = C / NH;
    double scale = 1.0 / sqrt(hs), *p = xmalloc(sizeof(double) * T), *dp = xmalloc(sizeof(double) * T);
    if (dqkv) memset(dqkv, 0, sizeof(double) * B * T * 3 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0, D = 0;
                for (int s = 0; s <= t; s++) {
                    const float *k = qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += (double)q[i] * k[i];
                    p[s] = d * scale;
                    mx = fmax(mx, p[s]);
                }
                for (int s = 0; s <= t; s++) sum += exp(p[s] - mx);
                lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - mx) / sum;
                    const float *v = qkv + ((size_t)b * T + s) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += p[s] * v[i];
                }
                if (!dqkv) continue;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
                for (int s = 0; s <= t; s++) {
                    const float *v = qkv + ((size_t)b * T + s) * 3 * C + 2 * C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += (double)dy[i] * v[i];
                    dp[s] = d;
                    D += p[s] * d;
                }
                for (int s = 0; s <= t; s++) {
                    const float *k = qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    double ds = p[s] * (dp[s] - D) * scale;
                    double *dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                    double *dk = dqkv + ((size_t)b * T + s) * 3 * C + C + h * hs, *dv = dk + C;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p[s] * dy[i];
                    }
                }
            }
    free(p);
    free(dp);
}

static float *rand_qkv(size_t n) { // scores of a few units, so the softmax is neither flat nor one-hot
    float *x = randv(n);
    for (size_t i = 0; i < n; i++) x[i] *= 1.5f;
    return x;
}

static void test_attention(const Backend *be, int B, int T, int C, int NH) {
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = rand_qkv(n3), *dy = randv(n1), *out = xcalloc(n1, 4), *lse = xcalloc(nl, 4), *dqkv = randv(n3);
    double *rout = xmalloc(8 * n1), *rlse = xmalloc(8 * nl), *rd = xmalloc(8 * n3);
    ref_attention(qkv, dy, B, T, C, NH, rout, rlse, rd);
    be->attention_fwd(DT_F32, out, lse, qkv, B, T, C, NH);
    be->attention_bwd(DT_F32, dqkv, dy, qkv, out, lse, B, T, C, NH); // dqkv: random before, overwritten
    double ef = fmax(max_rel(out, rout, n1), max_rel(lse, rlse, nl)), eb = max_rel(dqkv, rd, n3);
    char name[160];
    snprintf(name, sizeof name, "flash attention B=%d T=%d C=%d NH=%d: out, lse and dqkv against double loops", B, T, C, NH);
    check(ef < 1e-5 && eb < 1e-5, name, fmax(ef, eb));
    free(qkv); free(dy); free(out); free(lse); free(dqkv); free(rout); free(rlse); free(rd);
}

// bf16 storage: against the fp32 kernel on the same (bf16) values, within bf16 tolerance.
static void test_attention_bf16(const Backend *be, int B, int T, int C, int NH) {
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint16_t *qkv = xmalloc(2 * n3), *dy = rand_bf16(n1), *out = xcalloc(n1, 2), *dqkv = xcalloc(n3, 2);
    for (size_t i = 0; i < n3; i++) qkv[i] = f32_to_bf16(1.5f * frand());
    float *fq = bf16_to_floats(qkv, n3), *fdy = bf16_to_floats(dy, n1), *fo = xcalloc(n1, 4), *fl = xcalloc(nl, 4);
    float *fd = xcalloc(n3, 4), *lse = xcalloc(nl, 4);
    be->attention_fwd(DT_F32, fo, fl, fq, B, T, C, NH);
    be->attention_bwd(DT_F32, fd, fdy, fq, fo, fl, B, T, C, NH);
    be->attention_fwd(DT_BF16, out, lse, qkv, B, T, C, NH);
    be->attention_bwd(DT_BF16, dqkv, dy, qkv, out, lse, B, T, C, NH);
    float *o = bf16_to_floats(out, n1), *d = bf16_to_floats(dqkv, n3);
    double e = fmax(fmax(max_rel_f(o, fo, n1), max_rel_f(lse, fl, nl)), max_rel_f(d, fd, n3));
    check(e < 2e-2, "flash attention in bf16 against fp32 on the same values (2e-2)", e);
    free(qkv); free(dy); free(out); free(dqkv); free(fq); free(fdy); free(fo); free(fl); free(fd); free(lse); free(o); free(d);
}

// The block ops as context parallelism will use them, on zigzag-like splits: the sequence in nchunks
// chunks; each query chunk against every key chunk in a scrambled order (often starting with a block it
// cannot see at all), merged into fp32 accumulators; then the backward of every pair, accumulated. The
// union must equal whole-sequence attention.
static void test_attention_blocks(const Backend *be, int B, int T, int C, int NH, int nchunks) {
    int hs = C / NH, cs = T / nchunks;
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = rand_qkv(n3), *dy = randv(n1), *out = xcalloc(n1, 4), *lse = xcalloc(nl, 4), *dqkv = xcalloc(n3, 4);
    be->attention_fwd(DT_F32, out, lse, qkv, B, T, C, NH);
    be->attention_bwd(DT_F32, dqkv, dy, qkv, out, lse, B, T, C, NH);
    float *bout = xcalloc(n1, 4), *blse = xcalloc(nl, 4), *dq = xcalloc(n1, 4), *dk = xcalloc(n1, 4), *dv = xcalloc(n1, 4);
    size_t s3 = (size_t)T * 3 * C, s1 = (size_t)T * C;
    for (int qc = 0; qc < nchunks; qc++) {
        AttnView q = { DT_F32, qkv + (size_t)qc * cs * 3 * C, s3, 3 * (size_t)C };
        AttnView o = { DT_F32, bout + (size_t)qc * cs * C, s1, (size_t)C };
        float *l = blse + (size_t)qc * B * NH * cs; // [B, NH, cs] per chunk
        for (int j = 0; j < nchunks; j++) {
            int kc = (nchunks - 1 - j + qc) % nchunks; // a different order for every query chunk
            AttnView k = { DT_F32, qkv + (size_t)kc * cs * 3 * C + C, s3, 3 * (size_t)C }, v = k;
            v.p = (float *)k.p + C;
            be->attention_block_fwd(o, l, q, k, v, B, NH, hs, cs, qc * cs, cs, kc * cs, j > 0);
        }
    }
    for (int j = 0; j < nchunks * nchunks; j++) { // the pairs in yet another order
        int qc = j % nchunks, kc = (j / nchunks + qc) % nchunks;
        AttnView q = { DT_F32, qkv + (size_t)qc * cs * 3 * C, s3, 3 * (size_t)C };
        AttnView k = { DT_F32, qkv + (size_t)kc * cs * 3 * C + C, s3, 3 * (size_t)C }, v = k;
        v.p = (float *)k.p + C;
        AttnView o = { DT_F32, bout + (size_t)qc * cs * C, s1, (size_t)C }, g = { DT_F32, dy + (size_t)qc * cs * C, s1, (size_t)C };
        AttnView vq = { DT_F32, dq + (size_t)qc * cs * C, s1, (size_t)C }, vk = { DT_F32, dk + (size_t)kc * cs * C, s1, (size_t)C };
        AttnView vv = { DT_F32, dv + (size_t)kc * cs * C, s1, (size_t)C };
        be->attention_block_bwd(vq, vk, vv, g, o, blse + (size_t)qc * B * NH * cs, q, k, v, B, NH, hs, cs, qc * cs, cs,
                                kc * cs);
    }
    double e = max_rel(bout, (double[]){ 0 }, 0); // (max_rel needs doubles: compare through a copy)
    double *ref = xmalloc(sizeof(double) * n3);
    for (size_t i = 0; i < n1; i++) ref[i] = out[i];
    e = max_rel(bout, ref, n1);
    double el = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                float x = blse[((size_t)(t / cs) * B * NH + (size_t)b * NH + h) * cs + t % cs];
                el = fmax(el, fabs(x - lse[((size_t)b * NH + h) * T + t]) / fabs(lse[((size_t)b * NH + h) * T + t]));
            }
    double eb = 0;
    for (int part = 0; part < 3; part++) {
        float *mine = part == 0 ? dq : part == 1 ? dk : dv, *got = xmalloc(4 * n1);
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (int c = 0; c < C; c++) ref[r * C + c] = dqkv[r * 3 * C + part * C + c], got[r * C + c] = mine[r * C + c];
        eb = fmax(eb, max_rel(got, ref, n1));
        free(got);
    }
    char name[200];
    snprintf(name, sizeof name, "attention blocks: %d chunks of %d, merged in scrambled orders, equal whole attention "
                                "(out, lse, dq, dk, dv; B=%d C=%d NH=%d)", nchunks, cs, B, C, NH);
    check(fmax(e, fmax(el, eb)) < 1e-5, name, fmax(e, fmax(el, eb)));
    free(qkv); free(dy); free(out); free(lse); free(dqkv); free(bout); free(blse); free(dq); free(dk); free(dv); free(ref);
}

// The fused softmax + cross-entropy + gradient: bitwise what the two unfused kernels give for one slice,
// and against a double softmax; padding columns get 0.
static void test_crossentropy_fused(const Backend *be, int N, int V, int Vloc) {
    float *logits = randv((size_t)N * Vloc), *d1 = xcalloc((size_t)N * Vloc, 4), *d2 = randv((size_t)N * Vloc);
    float *st1 = xcalloc(3 * (size_t)N, 4), *st2 = xcalloc(3 * (size_t)N, 4);
    int32_t *tg = xmalloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) {
        tg[n] = (int32_t)((n * 7919) % V);
        for (int j = 0; j < Vloc; j++) logits[(size_t)n * Vloc + j] *= 4.0f;
    }
    be->crossentropy_stats(DT_F32, st1, st1 + N, st1 + 2 * N, logits, tg, N, 0, V, Vloc);
    be->crossentropy_bwd(DT_F32, d1, logits, tg, st1, st1 + N, 0.25f, N, 0, V, Vloc);
    memcpy(d2, logits, 4 * (size_t)N * Vloc); // in place, as the model runs it
    be->crossentropy_fused(DT_F32, d2, st2, st2 + N, st2 + 2 * N, d2, tg, 0.25f, N, V, Vloc);
    int same = !memcmp(d1, d2, 4 * (size_t)N * Vloc) && !memcmp(st1, st2, 12 * (size_t)N);
    double err = 0;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vloc;
        double m = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) m = fmax(m, x[j]);
        for (int j = 0; j < V; j++) s += exp(x[j] - m);
        double loss = log(s) + m - x[tg[n]], ours = log(st2[N + n]) + st2[n] - st2[2 * N + n];
        err = fmax(err, fabs(loss - ours) / loss);
        for (int j = 0; j < Vloc; j++) {
            double g = j < V ? (exp(x[j] - m) / s - (j == tg[n])) * 0.25 : 0.0;
            err = fmax(err, fabs(d2[(size_t)n * Vloc + j] - g) / 0.25);
        }
    }
    check(same && err < 1e-5, "fused softmax + cross-entropy + gradient: bitwise the unfused kernels, and a double softmax", err);
    free(logits); free(d1); free(d2); free(st1); free(st2); free(tg);
}

// AdamW over several segments in one call (one without decay, one with bf16 working weights, one whose
// master is its own working copy) against the update written out per element here.
static void test_adamw(const Backend *be) {
    size_t n = 70001, cut[4] = { 0, 30000, 69990, n };
    float *master = randv(n), *grad = randv(n), *m = randv(n), *v = randv(n), *rm = xmalloc(4 * n), *rv = xmalloc(4 * n);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]) * 0.01f, m[i] *= 0.1f;
    double *ref = xmalloc(8 * n);
    uint16_t *working = xcalloc(n, 2);
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, bc1 = 1 - b1 * b1, bc2 = 1 - b2 * b2, gs = 0.5f;
    for (int s = 0; s < 3; s++)
        for (size_t i = cut[s]; i < cut[s + 1]; i++) {
            double wd = s == 1 ? 0.0 : 0.1, g = (double)grad[i] * gs;
            double mi = b1 * (double)m[i] + (1 - b1) * g, vi = b2 * (double)v[i] + (1 - b2) * g * g;
            ref[i] = master[i] * (1 - lr * wd) - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
            rm[i] = (float)mi, rv[i] = (float)vi;
        }
    AdamWSegment segs[3];
    for (int s = 0; s < 3; s++)
        segs[s] = (AdamWSegment){ master + cut[s], s == 1 ? working + cut[s] : NULL, grad + cut[s], m + cut[s], v + cut[s],
                                  cut[s + 1] - cut[s], s == 1 ? 0.0f : 0.1f };
    be->adamw(DT_BF16, segs, 3, lr, b1, b2, eps, bc1, bc2, gs);
    double e = max_rel(master, ref, n);
    int bf = 1;
    for (size_t i = 0; i < n; i++) {
        bf &= (i >= cut[1] && i < cut[2]) ? working[i] == f32_to_bf16(master[i]) : working[i] == 0;
        e = fmax(e, fabs(m[i] - rm[i]) + fabs(v[i] - rv[i]));
    }
    check(e < 1e-6 && bf, "AdamW over three segments in one pass (decay per segment, bf16 working copy)", e);
    free(master); free(grad); free(m); free(v); free(rm); free(rv); free(ref); free(working);
}

static char tmpdir[256];

static void test_formats(void) {
    char path[512];
    // shard round trip and the window contract across two shards
    uint16_t a[100], b[57];
    for (int i = 0; i < 100; i++) a[i] = (uint16_t)(i * 7 % 50);
    for (int i = 0; i < 57; i++) b[i] = (uint16_t)(i * 3 % 50);
    snprintf(path, sizeof path, "%s/s_0.bin", tmpdir);
    shard_write(path, a, 100);
    snprintf(path, sizeof path, "%s/s_1.bin", tmpdir);
    shard_write(path, b, 57);
    snprintf(path, sizeof path, "%s/s_*.bin", tmpdir);
    TokenSet ts;
    int T = 10;
    tokenset_open(&ts, path, "--train", 50, T, 0, 1);
    int ok = ts.ntokens == 157 && ts.windows == 15;
    for (uint64_t g = 0; g < 40 && ok; g++) {
        int32_t in[10], tg[10];
        tokenset_sequence(&ts, g, in, tg);
        uint64_t start = (g % 15) * T;
        for (int t = 0; t < T; t++) {
            uint64_t p = start + t;
            int want_in = p < 100 ? a[p] : b[p - 100], want_tg = p + 1 < 100 ? a[p + 1] : b[p + 1 - 100];
            ok &= in[t] == want_in && tg[t] == want_tg;
        }
    }
    check(ok, "shards concatenate and windows follow the batch-order contract (with wrap-around)", 0);
    tokenset_close(&ts);
    // shuffling: each epoch visits every window exactly once, and epochs differ
    tokenset_open(&ts, path, "--train", 50, T, 1, 1);
    int seen[2][15] = { { 0 } }, same = 1;
    for (uint64_t g = 0; g < 30; g++) seen[g / 15][tokenset_window(&ts, g)]++;
    for (uint64_t g = 0; g < 15; g++) same &= tokenset_window(&ts, g) == tokenset_window(&ts, g + 15);
    ok = !same;
    for (int e = 0; e < 2; e++)
        for (int w = 0; w < 15; w++) ok &= seen[e][w] == 1;
    check(ok, "shuffle is a per-epoch permutation of the windows", 0);
    tokenset_close(&ts);

    // Llama 3's uint32 shards (ids above 65,535) concatenated with a GPT-2 uint16 one
    uint32_t c[40];
    for (int i = 0; i < 40; i++) c[i] = 65530u + (uint32_t)(i * 13 % 300);
    snprintf(path, sizeof path, "%s/m_0.bin", tmpdir);
    shard_write(path, a, 100);
    snprintf(path, sizeof path, "%s/m_1.bin", tmpdir);
    shard_write_u32(path, c, 40);
    snprintf(path, sizeof path, "%s/m_*.bin", tmpdir);
    tokenset_open(&ts, path, "--train", 70000, T, 0, 1);
    ok = ts.ntokens == 140 && ts.shards[0].tok_bytes == 2 && ts.shards[1].tok_bytes == 4;
    for (uint64_t g = 0; g < 13 && ok; g++) {
        int32_t in[10], tg[10];
        tokenset_sequence(&ts, g, in, tg);
        for (int t = 0; t < T; t++) {
            uint64_t p = (g % ts.windows) * T + t;
            ok &= in[t] == (int32_t)(p < 100 ? a[p] : c[p - 100]) && tg[t] == (int32_t)(p + 1 < 100 ? a[p + 1] : c[p + 1 - 100]);
        }
    }
    check(ok, "uint32 token shards (Llama 3 header) round trip and concatenate with uint16 ones", 0);
    tokenset_close(&ts);

    // tokenizer round trip
    snprintf(path, sizeof path, "%s/tok.bin", tmpdir);
    tokenizer_write_bytes(path);
    Tokenizer tk;
    tokenizer_load(&tk, path);
    ok = tk.vocab == 256;
    // sample text: the expected strings are Python's bytes.decode("utf-8", "backslashreplace") of the
    // whole stream, with controls other than newline escaped
    static const struct {
        const char *tokens; // the byte tokens, one call per '|'-separated group
        const char *want;
    } texts[] = {
        { "A|\n", "A\n" },
        { "\xe9", "\\xe9" },                        // Latin-1, not UTF-8
        { "\xc3|\xa9", "\xc3\xa9" },                 // é split across two tokens
        { "\xe2\x82|\xac|!", "\xe2\x82\xac!" },    // € in two
        { "\xf0\x9f\x98|\x80", "\xf0\x9f\x98\x80" }, // an emoji
        { "\x01|\x7f|\t", "\\x01\\x7f\\x09" },
        { "\xc0\x80", "\\xc0\\x80" },             // overlong
        { "\xed\xa0\x80", "\\xed\\xa0\\x80" },   // a surrogate
        { "\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80" }, // above U+10FFFF
        { "\xe2\x82|A", "\\xe2\\x82A" },          // cut short by the next token
        { "x\xe2\x82", "x\\xe2\\x82" },           // cut short by the end
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char *got = NULL;
        size_t glen = 0;
        FILE *mf = open_memstream(&got, &glen);
        if (!mf) die("open_memstream: %s", strerror(errno));
        TextOut to = { { 0 }, 0 };
        for (const char *s = texts[i].tokens; *s; s++)
            if (*s != '|') text_out_token(&to, &tk, (unsigned char)*s, mf);
        text_out_token(&to, &tk, 300, mf);
        text_out_flush(&to, mf);
        fclose(mf);
        char want[64];
        snprintf(want, sizeof want, "%s", texts[i].want);
        // an id outside the vocabulary ends each stream: the unfinished character is escaped first
        snprintf(want + strlen(want), sizeof want - strlen(want), "<300>");
        if (strcmp(got, want)) ok = 0, fprintf(stderr, "    text_out case %zu: got '%s', want '%s'\n", i, got, want);
        free(got);
    }
    check(ok, "sample text: UTF-8 across tokens as it is, ill-formed bytes and controls as \\xNN", 0);
    tokenizer_free(&tk);

    // model file: init, save, load, save again: bitwise identical; init values follow GPT-2
    GPT2Config cfg = { .maxT = 16, .V = 100, .Vp = 128, .L = 2, .NH = 2, .C = 12 };
    float *p = gpt2_init_params(&cfg, 42);
    snprintf(path, sizeof path, "%s/m.bin", tmpdir);
    gpt2_save_file(path, &cfg, p);
    GPT2Config c2;
    float *q = gpt2_load_file(path, &c2);
    size_t sizes[NUM_PARAM_TENSORS], offs[NUM_PARAM_TENSORS];
    size_t n = gpt2_param_layout(&cfg, sizes, offs);
    check(!memcmp(&cfg, &c2, sizeof cfg) && !memcmp(p, q, n * 4), "model file round trip is bitwise", 0);
    int pad_zero = 1;
    for (size_t i = (size_t)cfg.V * cfg.C; i < sizes[P_WTE]; i++) pad_zero &= p[i] == 0.0f;
    double var = 0;
    for (size_t i = 0; i < sizes[P_FCW]; i++) var += (double)p[offs[P_FCW] + i] * p[offs[P_FCW] + i];
    double std = sqrt(var / sizes[P_FCW]);
    int ln_ok = p[offs[P_LN1W]] == 1.0f && p[offs[P_LN1B]] == 0.0f && p[offs[P_LNFW] + 11] == 1.0f;
    check(pad_zero && ln_ok && fabs(std - 0.02) < 0.002, "GPT-2 initialisation (std, LayerNorm, zero pad rows)", std);
    free(p);
    free(q);
}

static void test_slurm_hostlist(void) {
    static const char *cases[][2] = {
        { "gpu[01-04,07],login2", "gpu01" }, { "node7", "node7" },       { "login2,gpu[1-2]", "login2" },
        { "a[3]", "a3" },                    { "rack[1-2]-n[07,09]", "rack1-n07" }, { "x[009-011]", "x009" },
    };
    int ok = 1;
    char out[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        slurm_first_host(cases[i][0], out, sizeof out);
        if (strcmp(out, cases[i][1]) != 0) {
            printf("  %s -> %s (expected %s)\n", cases[i][0], out, cases[i][1]);
            ok = 0;
        }
    }
    check(ok, "Slurm host lists: the first host", 0);
}

int main(void) {
    const Backend *be = backend_cpu();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llm4d-unit-XXXXXX");
    if (!mkdtemp(tmpdir)) die("cannot create a temporary directory");
    test_bf16();
    test_matmul(be, 1, 1, 1);
    test_matmul(be, 7, 13, 5);
    test_matmul(be, 67, 300, 131);
    test_matmul(be, 97, 33, 290);
    test_matmul(be, 40, 1100, 70); // three k-slices
    test_matmul(be, 1100, 600, 20); // more tokens than one column block, two k-slices, an edge row block
    test_matmul_gelu(be, 67, 300, 131);
    test_matmul_gelu(be, 37, 1100, 50);
    test_matmul_bf16(be, 67, 300, 131);
    test_matmul_bf16(be, 40, 1100, 70);
    test_layernorm(be, 67, 40);
    test_layernorm(be, 200, 300);
    test_attention(be, 2, 37, 48, 3);   // odd T, hs 16
    test_attention(be, 1, 1, 16, 1);    // a single token
    test_attention(be, 3, 33, 17, 1);   // one head of 17 channels
    test_attention(be, 2, 70, 64, 16);  // many heads of 4 channels
    test_attention(be, 1, 100, 128, 2); // hs 64, T past several tiles
    test_attention_bf16(be, 2, 45, 96, 3);
    test_attention_blocks(be, 2, 32, 48, 3, 4); // zigzag chunks of 8
    test_attention_blocks(be, 1, 75, 40, 2, 3); // chunks of 25, across tile boundaries
    test_crossentropy_fused(be, 37, 300, 320);
    test_adamw(be);
    test_thread_determinism(be);
    test_sumsq(be);
    test_cast_rows(be);
    test_streams(be);
    test_crossentropy(be);
    test_formats();
    test_slurm_hostlist();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

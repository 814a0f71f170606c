// Unit tests of the CPU backend and the file formats, built with AddressSanitizer and UBSan.
// Kernels are checked against naive double-precision loops written here; formats by round trips.
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives.h"
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
    be->matmul_fwd(DT_F32, out, inp, w, b, N, C, OC);
    be->matmul_bwd(DT_F32, dinp, dw, db, dout, inp, w, N, C, OC);
    be->matmul_bwd(DT_F32, dinp, dw, db, dout, inp, w, N, C, OC); // dinp overwritten, dw/db accumulate
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

// The same matmul and norm with 1 and 2 threads must agree bit for bit.
static void test_thread_determinism(const Backend *be) {
    int N = 150, C = 300, OC = 200;
    float *inp = randv((size_t)N * C), *w = randv((size_t)OC * C), *dout = randv((size_t)N * OC);
    float *o1 = xcalloc((size_t)N * OC, 4), *o2 = xcalloc((size_t)N * OC, 4);
    float *dw1 = xcalloc((size_t)OC * C, 4), *dw2 = xcalloc((size_t)OC * C, 4);
    be->set_threads(1);
    be->matmul_fwd(DT_F32, o1, inp, w, NULL, N, C, OC);
    be->matmul_bwd(DT_F32, NULL, dw1, NULL, dout, inp, w, N, C, OC);
    double s1 = be->sumsq(dw1, (size_t)OC * C);
    be->set_threads(2);
    be->matmul_fwd(DT_F32, o2, inp, w, NULL, N, C, OC);
    be->matmul_bwd(DT_F32, NULL, dw2, NULL, dout, inp, w, N, C, OC);
    double s2 = be->sumsq(dw2, (size_t)OC * C);
    check(!memcmp(o1, o2, 4 * (size_t)N * OC) && !memcmp(dw1, dw2, 4 * (size_t)OC * C) && s1 == s2,
          "results independent of the thread count", 0);
    free(inp); free(w); free(dout); free(o1); free(o2); free(dw1); free(dw2);
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

    // tokenizer round trip
    snprintf(path, sizeof path, "%s/tok.bin", tmpdir);
    tokenizer_write_bytes(path);
    Tokenizer tk;
    tokenizer_load(&tk, path);
    char buf[16];
    ok = tk.vocab == 256;
    tokenizer_decode(&tk, 'A', buf, sizeof buf);
    ok &= !strcmp(buf, "A");
    tokenizer_decode(&tk, 0xe9, buf, sizeof buf);
    ok &= !strcmp(buf, "\\xe9");
    check(ok, "tokenizer decodes bytes", 0);
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
    test_thread_determinism(be);
    test_sumsq(be);
    test_crossentropy(be);
    test_formats();
    test_slurm_hostlist();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

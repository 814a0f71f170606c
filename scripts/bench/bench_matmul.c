// Matmul benchmark: the CPU backend's linear layers (forward, and backward = input gradient + weight
// gradient) on the model's shapes, against the core's fp32 FMA peak, which is measured here with
// independent vector FMA chains (no memory traffic). Medians of several runs.
//
//   build/bench_matmul            every shape, fp32 and bf16, 1 and 2 threads; then the forward at one
//                                 micro-batch of T 64 with the weight in cache and from memory
//   build/bench_matmul --peak     only the measured per-core peak in GFLOP/s (for scripts)
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(VW * 4)));

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// GFLOP/s of one thread running 12 independent FMA chains; the best of 5 tries (a shared machine only
// ever makes it look slower).
static double fma_peak_one_core(void) {
    double best = 0;
    for (int tries = 0; tries < 5; tries++) {
        vf acc[12];
        for (int i = 0; i < 12; i++) acc[i] = (vf){ 0 } + (float)i;
        vf a = (vf){ 0 } + 0.999999f, b = (vf){ 0 } + 1e-7f;
        long iters = 10000000;
        double t0 = now_seconds();
        for (long it = 0; it < iters; it++) {
            for (int i = 0; i < 12; i++) acc[i] = acc[i] * a + b;
        }
        double dt = now_seconds() - t0;
        float sink = 0;
        for (int i = 0; i < 12; i++) sink += acc[i][0];
        if (sink == 12345.0f) printf("!");
        double g = 2.0 * VW * 12 * iters / dt / 1e9;
        if (g > best) best = g;
    }
    return best;
}

static void *fill(size_t n, DType dt, int seed) {
    void *p = xmalloc(n * dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = (float)((i * (37 + seed)) % 101) / 101.0f - 0.5f;
        if (dt == DT_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
        else ((float *)p)[i] = v;
    }
    return p;
}

// median seconds of reps runs of a linear layer's forward (bwd 0) or backward (bwd 1), the weight
// cycled through copies: 1 keeps it in cache; enough of them (past a last-level cache) make each run
// read it from memory, as a step does. A first round through the copies warms caches and the allocator.
static double time_layer(const Backend *be, DType dt, int N, int C, int OC, int bwd, int copies, int reps) {
    void *inp = fill((size_t)N * C, dt, 0), *out = fill((size_t)N * OC, dt, 2), *w[64];
    for (int q = 0; q < copies; q++) w[q] = fill((size_t)OC * C, dt, 1 + q);
    void *dinp = xcalloc((size_t)N * C, dtype_size(dt));
    float *dw = xcalloc((size_t)OC * C, sizeof(float));
    double t[256];
    for (int r = 0; r < reps + copies; r++) {
        double t0 = now_seconds();
        if (bwd) be->matmul_bwd(dt, dinp, dw, NULL, out, inp, w[r % copies], NULL, N, C, OC);
        else be->matmul_fwd(dt, out, NULL, inp, w[r % copies], NULL, N, C, OC);
        if (r >= copies) t[r - copies] = now_seconds() - t0;
    }
    qsort(t, reps, sizeof(double), cmp_double);
    for (int q = 0; q < copies; q++) free(w[q]);
    free(inp), free(out), free(dinp), free(dw);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    double peak1 = fma_peak_one_core();
    if (argc > 1 && !strcmp(argv[1], "--peak")) {
        printf("%.2f\n", peak1);
        return 0;
    }
    const Backend *be = backend_cpu();
    printf("measured fp32 FMA peak: %.1f GFLOP/s per core (%d-wide vectors); bf16 matmuls: %s\n", peak1, VW, cpu_isa());
    static const struct { const char *what; int N, C, OC; } shapes[] = {
        { "L4 C256 T256 B4: qkv", 1024, 256, 768 },  { "L4 C256 T256 B4: fc", 1024, 256, 1024 },
        { "L4 C256 T256 B4: fcproj", 1024, 1024, 256 }, { "d12 B4 T1024: fc", 4096, 768, 3072 },
        { "d12 B4 T1024: fcproj", 4096, 3072, 768 },
    };
    printf("%-26s %-5s %-4s %7s %11s %9s %16s\n", "shape (N x C x OC)", "dtype", "pass", "threads", "ms (median)",
           "GFLOP/s", "% of fp32 peak");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 2; d++)
            for (int bwd = 0; bwd < 2; bwd++)
                for (int threads = 1; threads <= 2; threads++) {
                    DType dt = d ? DT_BF16 : DT_F32;
                    int N = shapes[s].N, C = shapes[s].C, OC = shapes[s].OC, big = (size_t)N * C * OC > 2000000000ull;
                    be->set_threads(threads);
                    double sec = time_layer(be, dt, N, C, OC, bwd, 1, big ? 3 : 7);
                    double gflops = 2.0 * N * C * OC * (bwd ? 2 : 1) / sec / 1e9;
                    printf("%-26s %-5s %-4s %7d %11.2f %9.1f %15.0f%%\n", shapes[s].what, dtype_name(dt), bwd ? "bwd" : "fwd",
                           threads, sec * 1e3, gflops, 100.0 * gflops / (peak1 * threads));
                }
    // a pipeline stage's or a small job's forward: few rows, so the weight's traffic is what counts
    static const struct { const char *what; int C, OC; } small[] = {
        { "C256 T64 B1: qkv", 256, 768 },    { "C256 T64 B1: attproj", 256, 256 }, { "C256 T64 B1: fc", 256, 1024 },
        { "C256 T64 B1: fcproj", 1024, 256 }, { "C256 T64 B1: lm head", 256, 3456 },
    };
    printf("\nfp32 forward, N 64, one thread; the weight in cache, and from memory (cycled through copies, 16-64 MiB)\n");
    printf("%-26s %13s %9s %13s %9s\n", "shape (C x OC)", "cached ms", "GFLOP/s", "memory ms", "GFLOP/s");
    be->set_threads(1);
    for (size_t s = 0; s < sizeof small / sizeof small[0]; s++) {
        int C = small[s].C, OC = small[s].OC;
        size_t bytes = (size_t)C * OC * 4;
        int copies = (int)((64u << 20) / bytes + 1);
        if (copies > 64) copies = 64;
        double warm = time_layer(be, DT_F32, 64, C, OC, 0, 1, 41), cold = time_layer(be, DT_F32, 64, C, OC, 0, copies, 4 * copies);
        double f = 2.0 * 64 * C * OC / 1e9;
        printf("%-26s %13.3f %9.1f %13.3f %9.1f\n", small[s].what, warm * 1e3, f / warm, cold * 1e3, f / cold);
    }
    return 0;
}

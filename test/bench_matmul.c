// Matmul benchmark: the CPU backend's matmul forward at 768 x 3072 x (B*T) against the core's fp32
// FMA peak, which is measured here with independent vector FMA chains (no memory traffic).
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

// GFLOP/s of one thread running 12 independent FMA chains.
static double fma_peak_one_core(void) {
    vf acc[12];
    for (int i = 0; i < 12; i++) acc[i] = (vf){ 0 } + (float)i;
    vf a = (vf){ 0 } + 0.999999f, b = (vf){ 0 } + 1e-7f;
    long iters = 20000000;
    double t0 = now_seconds();
    for (long it = 0; it < iters; it++) {
        for (int i = 0; i < 12; i++) acc[i] = acc[i] * a + b;
    }
    double dt = now_seconds() - t0;
    float sink = 0;
    for (int i = 0; i < 12; i++) sink += acc[i][0];
    if (sink == 12345.0f) printf("!");
    return 2.0 * VW * 12 * iters / dt / 1e9;
}

int main(int argc, char **argv) {
    int BT = argc > 1 ? atoi(argv[1]) : 1024, C = 768, OC = 3072, reps = 7;
    const Backend *be = backend_cpu();
    float *inp = xmalloc(sizeof(float) * BT * C), *w = xmalloc(sizeof(float) * OC * C), *out = xmalloc(sizeof(float) * BT * OC);
    for (long i = 0; i < (long)BT * C; i++) inp[i] = (float)((i * 37) % 101) / 101.0f;
    for (long i = 0; i < (long)OC * C; i++) w[i] = (float)((i * 53) % 97) / 97.0f;
    double peak1 = fma_peak_one_core();
    printf("measured fp32 FMA peak: %.1f GFLOP/s per core (%d-wide vectors)\n", peak1, VW);
    for (int threads = 1; threads <= 2; threads++) {
        be->set_threads(threads);
        double t[16];
        for (int r = 0; r < reps; r++) {
            double t0 = now_seconds();
            be->matmul_fwd(DT_F32, out, NULL, inp, w, NULL, BT, C, OC);
            t[r] = now_seconds() - t0;
        }
        qsort(t, reps, sizeof(double), cmp_double);
        double gflops = 2.0 * BT * C * OC / t[reps / 2] / 1e9;
        printf("matmul %d x %d x %d, %d thread(s): median %.2f ms, %.1f GFLOP/s = %.0f%% of %d x core peak\n", BT, C, OC,
               threads, t[reps / 2] * 1e3, gflops, 100.0 * gflops / (peak1 * threads), threads);
    }
    free(inp);
    free(w);
    free(out);
    return 0;
}

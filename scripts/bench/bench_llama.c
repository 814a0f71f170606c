// Llama kernels benchmark: the CPU backend's grouped-query attention (alone and with RoPE fused) against GPT-2's
// multi-head attention of the same query shape, as a fraction of the core's measured fp32 FMA peak
// (build/bench_matmul --peak measures it the same way); and the Llama elementwise ops (RMSNorm, SwiGLU,
// RoPE) beside their GPT-2 counterparts (LayerNorm, GELU), in GB/s of the bytes they must move.
// Medians of several runs, the first (warm-up) dropped.
//
//   build/bench_llama PEAK_GFLOPS_PER_CORE [THREADS...]   (default threads: 1 2)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *fill(size_t n, int seed) {
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * (37 + seed)) % 101) / 101.0f - 0.5f;
    return p;
}

#define REPS 5
typedef void (*Op)(void *ctx);
static double median_s(Op op, void *ctx) {
    double t[REPS];
    for (int r = 0; r < REPS + 1; r++) {
        double t0 = now_seconds();
        op(ctx);
        if (r) t[r - 1] = now_seconds() - t0;
    }
    qsort(t, REPS, sizeof(double), cmp_double);
    return t[REPS / 2];
}

typedef struct {
    const Backend *be;
    int B, T, NH, NKV, hs, gqa, bwd;
    RopeConfig rope;
    void *qkv, *out, *dout, *dqkv;
    float *lse;
} Att;

static void att_run(void *p) {
    Att *a = p;
    if (!a->gqa) {
        int C = a->NH * a->hs;
        if (a->bwd) a->be->attention_bwd(DT_F32, a->dqkv, a->dout, a->qkv, a->out, a->lse, a->B, a->T, C, a->NH);
        else a->be->attention_fwd(DT_F32, a->out, a->lse, a->qkv, a->B, a->T, C, a->NH);
    } else {
        if (a->bwd)
            a->be->attention_gqa_bwd(DT_F32, a->dqkv, a->dout, a->qkv, a->out, a->lse, a->B, a->T, a->NH, a->NKV, a->hs,
                                     a->gqa == 2 ? &a->rope : NULL);
        else a->be->attention_gqa_fwd(DT_F32, a->out, a->lse, a->qkv, a->B, a->T, a->NH, a->NKV, a->hs, a->gqa == 2 ? &a->rope : NULL);
    }
}

typedef struct {
    const Backend *be;
    int N, C, which, bwd;
    void *x, *y, *w, *b, *dy, *dx;
    float *s1, *s2, *dw, *db;
} Elt;

enum { E_LN, E_RMS, E_GELU, E_SWIGLU, E_ROPE };
static void elt_run(void *p) {
    Elt *e = p;
    RopeConfig rc = { 500000.0, 0, 0, 0, 0 };
    switch (e->which) {
    case E_LN:
        if (e->bwd) e->be->layernorm_bwd(DT_F32, e->dx, e->dw, e->db, e->dy, e->x, e->w, e->s1, e->s2, e->N, e->C);
        else e->be->layernorm_fwd(DT_F32, e->y, e->s1, e->s2, e->x, e->w, e->b, e->N, e->C);
        break;
    case E_RMS:
        if (e->bwd) e->be->rmsnorm_bwd(DT_F32, e->dx, e->dw, e->dy, e->x, e->w, e->s1, e->N, e->C);
        else e->be->rmsnorm_fwd(DT_F32, e->y, e->s1, e->x, e->w, e->N, e->C, 1e-5f);
        break;
    case E_GELU: e->be->gelu_fwd(DT_F32, e->y, e->x, (size_t)e->N * e->C); break;
    case E_SWIGLU: // x holds gate|up [N, 2C]
        if (e->bwd) e->be->swiglu_bwd(DT_F32, e->dx, e->dy, e->x, e->N, e->C);
        else e->be->swiglu_fwd(DT_F32, e->y, e->x, e->N, e->C);
        break;
    case E_ROPE: { // x as [N tokens, C/64 heads, 64]
        AttnView v = { DT_F32, e->y, (size_t)e->N * e->C, (size_t)e->C };
        if (e->bwd) e->be->rope_bwd(v, 1, e->N, e->C / 64, 64, NULL, 0, &rc);
        else e->be->rope_fwd(v, 1, e->N, e->C / 64, 64, NULL, 0, &rc);
        break;
    }
    }
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: bench_llama PEAK_GFLOPS_PER_CORE [THREADS...]");
    double peak1 = atof(argv[1]);
    int threads[8] = { 1, 2 }, nth = 2;
    if (argc > 2) {
        nth = 0;
        for (int i = 2; i < argc && nth < 8; i++) threads[nth++] = atoi(argv[i]);
    }
    const Backend *be = backend_cpu();
    static const struct { const char *what; int B, T, NH, NKV, hs; } shapes[] = {
        { "L4 C256 T256 B4 (bench.sh's model)", 4, 256, 4, 1, 64 },
        { "d12-like C768 T1024 B1, 12 heads", 1, 1024, 12, 4, 64 },
        { "d12-like C768 T1024 B1, 12 heads", 1, 1024, 12, 12, 64 },
    };
    printf("== attention: GPT-2 multi-head vs Llama GQA with RoPE fused (fp32, causal FLOPs: fwd 2·B·NH·T²·hs, bwd 5·B·NH·T²·hs) ==\n");
    printf("%-36s %-24s %-4s %7s %9s %9s %15s\n", "shape", "attention", "pass", "threads", "ms", "GFLOP/s", "% of fp32 peak");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int gqa = 0; gqa < 3; gqa++) { // 0 GPT-2's op, 1 GQA, 2 GQA with RoPE fused
            if (!gqa && s == 2) continue; // the MHA row of this shape is shape 1's
            Att a = { be, shapes[s].B, shapes[s].T, shapes[s].NH, gqa ? shapes[s].NKV : shapes[s].NH, shapes[s].hs, gqa, 0,
                      { 500000.0, 0, 0, 0, 0 }, NULL, NULL, NULL, NULL, NULL };
            size_t W = (size_t)(a.NH + 2 * a.NKV) * a.hs, nq = (size_t)a.B * a.T * a.NH * a.hs;
            a.qkv = fill((size_t)a.B * a.T * W, 1);
            a.dqkv = xcalloc((size_t)a.B * a.T * W, 4);
            a.out = xcalloc(nq, 4);
            a.dout = fill(nq, 2);
            a.lse = xcalloc((size_t)a.B * a.NH * a.T, 4);
            char label[64];
            if (gqa) snprintf(label, sizeof label, "GQA %d/%d KV heads%s", a.NKV, a.NH, gqa == 2 ? "+RoPE" : "");
            else snprintf(label, sizeof label, "GPT-2 MHA %d heads", a.NH);
            for (int ti = 0; ti < nth; ti++)
                for (int bwd = 0; bwd < 2; bwd++) {
                    be->set_threads(threads[ti]);
                    a.bwd = 0;
                    att_run(&a); // out and lse for the backward
                    a.bwd = bwd;
                    double sec = median_s(att_run, &a);
                    double flops = (bwd ? 5.0 : 2.0) * a.B * a.NH * (double)a.T * a.T * a.hs;
                    double g = flops / sec / 1e9;
                    printf("%-36s %-24s %-4s %7d %9.2f %9.1f %14.0f%%\n", shapes[s].what, label, bwd ? "bwd" : "fwd",
                           threads[ti], sec * 1e3, g, 100.0 * g / (peak1 * threads[ti]));
                }
            free(a.qkv); free(a.dqkv); free(a.out); free(a.dout); free(a.lse);
        }
    printf("\n== elementwise ops, N=4096 rows (fp32; GB/s of the bytes each must read and write) ==\n");
    printf("%-30s %-4s %7s %9s %9s\n", "op", "pass", "threads", "ms", "GB/s");
    int N = 4096, C = 768, F = 2048;
    Elt e = { be, N, C, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL };
    size_t big = (size_t)N * 2 * F;
    e.x = fill(big, 1), e.y = fill(big, 2), e.dy = fill(big, 3), e.dx = xcalloc(big, 4);
    e.w = fill(C, 4), e.b = fill(C, 5);
    e.s1 = xcalloc(N, 4), e.s2 = xcalloc(N, 4), e.dw = xcalloc(2 * F, 4), e.db = xcalloc(2 * F, 4);
    static const struct { const char *what; int which, bwd, C; double rw; } ops[] = { // rw: N·C floats moved
        { "LayerNorm C768 (GPT-2)", E_LN, 0, 768, 2 }, { "LayerNorm C768 (GPT-2)", E_LN, 1, 768, 4 },
        { "RMSNorm C768 (Llama)", E_RMS, 0, 768, 2 },  { "RMSNorm C768 (Llama)", E_RMS, 1, 768, 4 },
        { "GELU 4C=3072 (GPT-2)", E_GELU, 0, 3072, 2 }, { "SwiGLU F=2048 (Llama)", E_SWIGLU, 0, 2048, 3 },
        { "SwiGLU F=2048 (Llama)", E_SWIGLU, 1, 2048, 5 }, { "RoPE C768, hs 64 (in place)", E_ROPE, 0, 768, 2 },
        { "RoPE C768, hs 64 (in place)", E_ROPE, 1, 768, 2 },
    };
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int ti = 0; ti < nth; ti++) {
            be->set_threads(threads[ti]);
            e.which = ops[o].which, e.bwd = ops[o].bwd, e.C = ops[o].C;
            if (e.which == E_LN) { e.bwd = 0; elt_run(&e); e.bwd = ops[o].bwd; }   // statistics for the backward
            if (e.which == E_RMS) { e.bwd = 0; elt_run(&e); e.bwd = ops[o].bwd; }
            double sec = median_s(elt_run, &e);
            printf("%-30s %-4s %7d %9.3f %9.1f\n", ops[o].what, ops[o].bwd ? "bwd" : "fwd", threads[ti], sec * 1e3,
                   ops[o].rw * N * ops[o].C * 4 / sec / 1e9);
        }
    return 0;
}

// bench_attention: causal attention on the GPU through the backend table (built and run by
// scripts/gpu_check.sh only): for head sizes 64 and 128 and T = 1024, 2048, 4096 (16384 tokens per call:
// B = 16384 / T, 16 heads), the flash kernels (attention.cu) forward and backward in TFLOP/s, the simple
// kernels' times as the comparator measured in the same run, and the flash results against the simple
// kernels' (max |flash - simple| / max |simple| over out, lse and dqkv; fresh random bf16 inputs).
//
// FLOPs are the usual causal counts: forward 2·B·NH·T²·hs (Q·Kᵀ and P·V over half the scores),
// backward 2.5 times that (five products; the dQ pass here recomputes two of them, which is not
// counted). Time: the host clock around N calls between two device synchronisations, median of 5.
//
//   build/bench_attention [--table FILE]   writes the markdown table to FILE too
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

void cuda_set_attention_simple(int simple); // kernels.cu test hook
long long cuda_tc_calls(void);

static const Backend *GPU;

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint16_t rand_bf16(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return f32_to_bf16((float)((rng >> 40) / 8388608.0 - 1.0));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int B, T, C, NH;
    void *qkv, *out, *dout, *dqkv;
    float *lse;
} Prob;

static void run_fwd(const Prob *p) { GPU->attention_fwd(DT_BF16, p->out, p->lse, p->qkv, p->B, p->T, p->C, p->NH); }
static void run_bwd(const Prob *p) {
    GPU->attention_bwd(DT_BF16, p->dqkv, p->dout, p->qkv, p->out, p->lse, p->B, p->T, p->C, p->NH);
}

// median seconds per call of fn over 5 measurements of `calls` calls each, after 2 warm-up calls
static double time_calls(void (*fn)(const Prob *), const Prob *p, int calls) {
    double t[5];
    fn(p);
    fn(p);
    GPU->sync();
    for (int r = 0; r < 5; r++) {
        double t0 = now_seconds();
        for (int i = 0; i < calls; i++) fn(p);
        GPU->sync();
        t[r] = (now_seconds() - t0) / calls;
    }
    qsort(t, 5, sizeof t[0], cmp_double);
    return t[2];
}

static double max_rel(const void *a, const void *b, size_t n, int f32) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double x = f32 ? ((const float *)a)[i] : bf16_to_f32(((const uint16_t *)a)[i]);
        double y = f32 ? ((const float *)b)[i] : bf16_to_f32(((const uint16_t *)b)[i]);
        if (isinf(x) && x == y) continue;
        if (isnan(x) || isnan(y)) return INFINITY;
        err = fmax(err, fabs(x - y));
        scale = fmax(scale, fabs(y));
    }
    return scale > 0 ? err / scale : err;
}

static void *download(const void *dev, size_t bytes) {
    void *h = xmalloc(bytes);
    GPU->to_host(h, dev, bytes);
    return h;
}

int main(int argc, char **argv) {
    const char *table = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--table") && i + 1 < argc) table = argv[++i];
        else die("unknown argument %s (usage: bench_attention [--table FILE])", argv[i]);
    }
    if (cuda_device_count() <= 0) die("bench_attention: no CUDA device");
    cuda_use_device(0);
    GPU = backend_cuda();
    char lines[16][256];
    int nl = 0, bad = 0;
    snprintf(lines[nl++], sizeof lines[0], "| hs | T | B x heads | fwd TFLOP/s | bwd TFLOP/s | simple fwd, bwd TFLOP/s | flash/simple fwd, bwd | err vs simple |");
    snprintf(lines[nl++], sizeof lines[0], "|---|---|---|---|---|---|---|---|");
    const int hss[2] = { 64, 128 }, Ts[3] = { 1024, 2048, 4096 };
    for (int hi = 0; hi < 2; hi++)
        for (int ti = 0; ti < 3; ti++) {
            Prob p = { 16384 / Ts[ti], Ts[ti], 16 * hss[hi], 16, NULL, NULL, NULL, NULL, NULL };
            size_t n3 = (size_t)p.B * p.T * 3 * p.C, n1 = (size_t)p.B * p.T * p.C, nl_ = (size_t)p.B * p.NH * p.T;
            uint16_t *h = xmalloc(2 * n3);
            p.qkv = GPU->alloc(2 * n3);
            p.dqkv = GPU->alloc(2 * n3);
            p.out = GPU->alloc(2 * n1);
            p.dout = GPU->alloc(2 * n1);
            p.lse = GPU->alloc(4 * nl_);
            if (!p.qkv || !p.dqkv || !p.out || !p.dout || !p.lse) die("bench_attention: out of device memory");
            for (size_t i = 0; i < n3; i++) h[i] = rand_bf16();
            GPU->to_device(p.qkv, h, 2 * n3);
            for (size_t i = 0; i < n1; i++) h[i] = rand_bf16();
            GPU->to_device(p.dout, h, 2 * n1);
            free(h);

            // the simple kernels: reference results and comparator times (fewer calls: they are slow)
            cuda_set_attention_simple(1);
            run_fwd(&p);
            run_bwd(&p);
            void *ro = download(p.out, 2 * n1), *rl = download(p.lse, 4 * nl_), *rd = download(p.dqkv, 2 * n3);
            double sf = time_calls(run_fwd, &p, 1), sb = time_calls(run_bwd, &p, 1);
            cuda_set_attention_simple(0);
            long long tc0 = cuda_tc_calls();
            run_fwd(&p);
            run_bwd(&p);
            GPU->sync();
            int flash = cuda_tc_calls() - tc0 == 2;
            void *fo = download(p.out, 2 * n1), *fl = download(p.lse, 4 * nl_), *fd = download(p.dqkv, 2 * n3);
            double err = fmax(max_rel(fo, ro, n1, 0), fmax(max_rel(fl, rl, nl_, 1), max_rel(fd, rd, n3, 0)));
            double ff = time_calls(run_fwd, &p, 10), fb = time_calls(run_bwd, &p, 10);
            double flops = 2.0 * p.B * p.NH * (double)p.T * p.T * hss[hi];
            if (!flash || !(err < 2e-2)) bad++;
            snprintf(lines[nl++], sizeof lines[0], "| %d | %d | %d x %d | %.1f | %.1f | %.1f, %.1f | %.1fx, %.1fx | %.2g%s |",
                     hss[hi], p.T, p.B, p.NH, flops / ff / 1e12, 2.5 * flops / fb / 1e12, flops / sf / 1e12,
                     2.5 * flops / sb / 1e12, sf / ff, sb / fb, err, flash ? "" : " (flash kernels did not run)");
            printf("%s\n", lines[nl - 1]);
            fflush(stdout);
            free(ro), free(rl), free(rd), free(fo), free(fl), free(fd);
            GPU->free(p.qkv), GPU->free(p.dqkv), GPU->free(p.out), GPU->free(p.dout), GPU->free(p.lse);
        }
    printf("\n");
    for (int i = 0; i < nl; i++) printf("%s\n", lines[i]);
    if (table) {
        SafeFile sf;
        safe_open_or_die(&sf, table);
        for (int i = 0; i < nl; i++) {
            safe_write_or_die(&sf, lines[i], strlen(lines[i]));
            safe_write_or_die(&sf, "\n", 1);
        }
        safe_commit_or_die(&sf);
    }
    if (bad) printf("bench_attention: %d shape(s) with the flash kernels missing or off the simple kernels by 2e-2 or more\n", bad);
    return bad ? 1 : 0;
}

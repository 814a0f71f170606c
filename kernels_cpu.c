// kernels_cpu.c: the reference backend. Plain C with OpenMP threads; the matmul is blocked, packed
// and vectorised (GCC vector extensions, so it compiles to AVX-512, AVX2 or SSE as the flags allow).
// Every reduction runs in a fixed order that does not depend on the thread count, so results are
// bitwise reproducible.
#include "kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

// ---------------------------------------------------------------------------------------------
// element access in either storage dtype

static inline float ld(DType dt, const void *p, size_t i) {
    return dt == DT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void st(DType dt, void *p, size_t i, float v) {
    if (dt == DT_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

// ---------------------------------------------------------------------------------------------
// memory

static void *cpu_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, rounded) != 0) return NULL;
    memset(p, 0, rounded);
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_memcpy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}
static void cpu_sync(void) {}
static void cpu_set_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}

// ---------------------------------------------------------------------------------------------
// GEMM: C[M,N] (=, or += when accumulate) Σ_k A(m,k)·B(k,n) (+ bias[n]).
// Operands are strided views (row stride, column stride) so that the three products of a linear
// layer (x·Wᵀ, dy·W, dyᵀ·x) share one kernel. Each thread owns whole MC×NC tiles of C and sums
// over k in the same order whatever the thread count.

#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
#define MR 8
#define NR (2 * VW)
#define MC (16 * MR)
#define KC 256
#define NC (8 * NR)

typedef struct {
    DType dt;
    const void *p;
    size_t rs, cs; // element (r, c) is at p[r*rs + c*cs]
} View;

// Ap[panel][k][r] = A(m0 + panel*MR + r, k0 + k), zero-padded past mc. The loop order follows the
// source's unit stride so that packing streams through memory.
static void pack_a(float *Ap, View A, int m0, int mc, int k0, int kc) {
    for (int pm = 0; pm < mc; pm += MR) {
        float *dst = Ap + (size_t)pm * kc;
        int rows = mc - pm < MR ? mc - pm : MR;
        if (A.cs == 1) {
            for (int r = 0; r < rows; r++) {
                size_t base = (size_t)(m0 + pm + r) * A.rs + (size_t)k0;
                for (int k = 0; k < kc; k++) dst[k * MR + r] = ld(A.dt, A.p, base + (size_t)k);
            }
        } else {
            for (int k = 0; k < kc; k++) {
                size_t base = (size_t)(k0 + k) * A.cs + (size_t)(m0 + pm) * A.rs;
                for (int r = 0; r < rows; r++) dst[k * MR + r] = ld(A.dt, A.p, base + (size_t)r * A.rs);
            }
        }
        for (int r = rows; r < MR; r++)
            for (int k = 0; k < kc; k++) dst[k * MR + r] = 0.0f;
    }
}

// Bp[panel][k][j] = B(k0 + k, n0 + panel*NR + j), zero-padded past nc
static void pack_b_panel(float *dst, View B, int k0, int kc, int n0, int cols) {
    if (B.cs == 1) {
        for (int k = 0; k < kc; k++) {
            size_t base = (size_t)(k0 + k) * B.rs + (size_t)n0;
            for (int j = 0; j < cols; j++) dst[k * NR + j] = ld(B.dt, B.p, base + (size_t)j);
        }
    } else {
        for (int j = 0; j < cols; j++) {
            size_t base = (size_t)(n0 + j) * B.cs + (size_t)k0 * B.rs;
            for (int k = 0; k < kc; k++) dst[k * NR + j] = ld(B.dt, B.p, base + (size_t)k * B.rs);
        }
    }
    for (int k = 0; k < kc; k++)
        for (int j = cols; j < NR; j++) dst[k * NR + j] = 0.0f;
}

// acc[MR][NR] (row stride ldc) += Ap-panel · Bp-panel over kc
static inline void micro_kernel(int kc, const float *restrict a, const float *restrict b, float *restrict acc,
                                int ldc) {
    vf c[MR][2];
    for (int r = 0; r < MR; r++) {
        memcpy(&c[r][0], acc + r * ldc, sizeof(vf));
        memcpy(&c[r][1], acc + r * ldc + VW, sizeof(vf));
    }
    for (int k = 0; k < kc; k++) {
        vf b0, b1;
        memcpy(&b0, b + k * NR, sizeof(vf));
        memcpy(&b1, b + k * NR + VW, sizeof(vf));
        for (int r = 0; r < MR; r++) {
            float av = a[k * MR + r];
            c[r][0] += av * b0;
            c[r][1] += av * b1;
        }
    }
    for (int r = 0; r < MR; r++) {
        memcpy(acc + r * ldc, &c[r][0], sizeof(vf));
        memcpy(acc + r * ldc + VW, &c[r][1], sizeof(vf));
    }
}

// Goto-style loop nest: for each NC-wide column block and KC-deep slice, A and B are packed once into
// shared buffers and the threads split the (MC row block × NR column panel) tasks. Partial sums live
// in an fp32 panel and reach C (with bias, accumulation and dtype conversion) after the last slice,
// so each element of C sums its k-slices in the same order whatever the thread count.
static void gemm(int M, int N, int K, View A, View B, DType cdt, void *C, int accumulate, const void *bias,
                 DType bias_dt) {
    if (M <= 0 || N <= 0) return;
    int Mp = (M + MR - 1) / MR * MR;
    int kc_max = K < KC ? (K > 0 ? K : 1) : KC;
    float *Ap = NULL, *Bp = NULL, *acc = NULL;
    if (posix_memalign((void **)&Ap, 64, sizeof(float) * (size_t)Mp * kc_max) ||
        posix_memalign((void **)&Bp, 64, sizeof(float) * (size_t)kc_max * NC) ||
        posix_memalign((void **)&acc, 64, sizeof(float) * (size_t)Mp * NC))
        die("out of memory in matmul scratch (%d x %d x %d)", M, N, K);
    int mblocks = (M + MC - 1) / MC;
    for (int n0 = 0; n0 < N; n0 += NC) {
        int nc = N - n0 < NC ? N - n0 : NC;
        int npanels = (nc + NR - 1) / NR;
        memset(acc, 0, sizeof(float) * (size_t)Mp * NC);
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC;
#pragma omp parallel
            {
#pragma omp for schedule(static) nowait
                for (int p = 0; p < npanels; p++) {
                    int cols = nc - p * NR < NR ? nc - p * NR : NR;
                    pack_b_panel(Bp + (size_t)p * NR * kc, B, k0, kc, n0 + p * NR, cols);
                }
#pragma omp for schedule(static)
                for (int mb = 0; mb < mblocks; mb++) {
                    int m0 = mb * MC, mc = M - m0 < MC ? M - m0 : MC;
                    pack_a(Ap + (size_t)m0 * kc, A, m0, mc, k0, kc);
                }
#pragma omp for collapse(2) schedule(static)
                for (int mb = 0; mb < mblocks; mb++)
                    for (int p = 0; p < npanels; p++) {
                        int m0 = mb * MC, mcp = ((M - m0 < MC ? M - m0 : MC) + MR - 1) / MR * MR;
                        for (int pm = 0; pm < mcp; pm += MR)
                            micro_kernel(kc, Ap + (size_t)(m0 + pm) * kc, Bp + (size_t)p * NR * kc,
                                         acc + (size_t)(m0 + pm) * NC + p * NR, NC);
                    }
            }
        }
#pragma omp parallel for schedule(static)
        for (int i = 0; i < M; i++) {
            size_t row = (size_t)i * N + n0;
            for (int j = 0; j < nc; j++) {
                float v = acc[(size_t)i * NC + j];
                if (bias) v += ld(bias_dt, bias, (size_t)(n0 + j));
                if (accumulate) v = ld(cdt, C, row + j) + v;
                st(cdt, C, row + j, v);
            }
        }
    }
    free(Ap);
    free(Bp);
    free(acc);
}

static void cpu_matmul_fwd(DType dt, void *out, const void *inp, const void *weight, const void *bias, int N,
                           int C, int OC) {
    View A = { dt, inp, (size_t)C, 1 };
    View B = { dt, weight, 1, (size_t)C };
    gemm(N, OC, C, A, B, dt, out, 0, bias, dt);
}

static void cpu_matmul_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                           const void *weight, int N, int C, int OC) {
    if (dinp) {
        View A = { dt, dout, (size_t)OC, 1 };
        View B = { dt, weight, (size_t)C, 1 };
        gemm(N, C, OC, A, B, dt, dinp, 0, NULL, dt);
    }
    View A = { dt, dout, 1, (size_t)OC };
    View B = { dt, inp, (size_t)C, 1 };
    gemm(OC, C, N, A, B, DT_F32, dweight, 1, NULL, dt);
    if (dbias) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) s += ld(dt, dout, (size_t)n * OC + o);
            dbias[o] += s;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// encoder

static void cpu_encoder_fwd(DType dt, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B,
                            int T, int C, int vstart, int vlen) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T, row = tokens[bt] - vstart;
        int have = row >= 0 && row < vlen;
        size_t te = (size_t)(have ? row : 0) * C, pe = (size_t)t * C, o = (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            float v = have ? ld(dt, wte, te + c) : 0.0f;
            if (wpe) v += ld(dt, wpe, pe + c);
            st(dt, out, o + c, v);
        }
    }
}

// Parallel over channels so that rows sharing a token or a position never race, and each sum runs
// over (b, t) in order.
static void cpu_encoder_bwd(DType dt, float *dwte, float *dwpe, const void *dout, const int32_t *tokens, int B,
                            int T, int C, int vstart, int vlen) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        for (int bt = 0; bt < B * T; bt++) {
            float g = ld(dt, dout, (size_t)bt * C + c);
            int row = tokens[bt] - vstart;
            if (row >= 0 && row < vlen) dwte[(size_t)row * C + c] += g;
            if (dwpe) dwpe[(size_t)(bt % T) * C + c] += g;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

static void cpu_layernorm_fwd(DType dt, void *out, float *mean, float *rstd, const void *inp, const void *weight,
                              const void *bias, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += ld(dt, inp, o + c);
        m /= C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = ld(dt, inp, o + c) - m;
            var += d * d;
        }
        var /= C;
        float s = 1.0f / sqrtf(var + 1e-5f);
        for (int c = 0; c < C; c++) {
            float xn = (ld(dt, inp, o + c) - m) * s;
            st(dt, out, o + c, xn * ld(dt, weight, c) + ld(dt, bias, c));
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

static void cpu_layernorm_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                              const void *weight, const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        float dmean = 0.0f, dnorm_dot = 0.0f;
        for (int c = 0; c < C; c++) {
            float xn = (ld(dt, inp, o + c) - mean[n]) * rstd[n];
            float dn = ld(dt, weight, c) * ld(dt, dout, o + c);
            dmean += dn;
            dnorm_dot += dn * xn;
        }
        dmean /= C;
        dnorm_dot /= C;
        for (int c = 0; c < C; c++) {
            float xn = (ld(dt, inp, o + c) - mean[n]) * rstd[n];
            float dn = ld(dt, weight, c) * ld(dt, dout, o + c);
            float g = (dn - dmean - xn * dnorm_dot) * rstd[n];
            st(dt, dinp, o + c, ld(dt, dinp, o + c) + g);
        }
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float dw = 0.0f, db = 0.0f;
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * C + c;
            float g = ld(dt, dout, i);
            dw += g * (ld(dt, inp, i) - mean[n]) * rstd[n];
            db += g;
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
}

// ---------------------------------------------------------------------------------------------
// attention: one (batch, head) pair per task, with q, k, v converted to fp32 once per task.

static void load_head(DType dt, float *dst, const void *qkv, int b, int T, int C, int part, int h, int hs) {
    for (int t = 0; t < T; t++) {
        size_t base = ((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * hs;
        for (int i = 0; i < hs; i++) dst[t * hs + i] = ld(dt, qkv, base + i);
    }
}

static void cpu_attention_fwd(DType dt, void *out, float *att, const void *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *q = xmalloc(sizeof(float) * 3 * (size_t)T * hs), *k = q + (size_t)T * hs, *v = k + (size_t)T * hs;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            load_head(dt, q, qkv, b, T, C, 0, h, hs);
            load_head(dt, k, qkv, b, T, C, 1, h, hs);
            load_head(dt, v, qkv, b, T, C, 2, h, hs);
            for (int t = 0; t < T; t++) {
                float *row = att + ((size_t)bh * T + t) * T;
                float mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) s += q[t * hs + i] * k[t2 * hs + i];
                    row[t2] = s * scale;
                    if (row[t2] > mx) mx = row[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    row[t2] = expf(row[t2] - mx);
                    sum += row[t2];
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;
                size_t o = ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int i = 0; i < hs; i++) {
                    float s = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) s += row[t2] * v[t2 * hs + i];
                    st(dt, out, o + i, s);
                }
            }
        }
        free(q);
    }
}

static void cpu_attention_bwd(DType dt, void *dqkv, float *datt, const void *dout, const void *qkv, const float *att,
                              int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        size_t th = (size_t)T * hs;
        float *q = xmalloc(sizeof(float) * 7 * th);
        float *k = q + th, *v = k + th, *dy = v + th, *dq = dy + th, *dk = dq + th, *dv = dk + th;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            load_head(dt, q, qkv, b, T, C, 0, h, hs);
            load_head(dt, k, qkv, b, T, C, 1, h, hs);
            load_head(dt, v, qkv, b, T, C, 2, h, hs);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) dy[t * hs + i] = ld(dt, dout, ((size_t)b * T + t) * C + (size_t)h * hs + i);
            memset(dq, 0, sizeof(float) * 3 * th);
            for (int t = 0; t < T; t++) {
                const float *a = att + ((size_t)bh * T + t) * T;
                float *da = datt + ((size_t)bh * T + t) * T;
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) s += dy[t * hs + i] * v[t2 * hs + i];
                    da[t2] = s;
                    dot += a[t2] * s;
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    float dpre = a[t2] * (da[t2] - dot) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[t * hs + i] += dpre * k[t2 * hs + i];
                        dk[t2 * hs + i] += dpre * q[t * hs + i];
                        dv[t2 * hs + i] += a[t2] * dy[t * hs + i];
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                size_t base = ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                for (int i = 0; i < hs; i++) {
                    st(dt, dqkv, base + i, dq[t * hs + i]);
                    st(dt, dqkv, base + C + i, dk[t * hs + i]);
                    st(dt, dqkv, base + 2 * (size_t)C + i, dv[t * hs + i]);
                }
            }
        }
        free(q);
    }
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation), residual

#define GELU_K 0.7978845608028654f // sqrt(2/pi)

static void cpu_gelu_fwd(DType dt, void *out, const void *inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = ld(dt, inp, i);
        st(dt, out, i, 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
    }
}

static void cpu_gelu_bwd(DType dt, void *dinp, const void *inp, const void *dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = ld(dt, inp, i);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        st(dt, dinp, i, grad * ld(dt, dout, i));
    }
}

static void cpu_residual_fwd(DType dt, void *out, const void *a, const void *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dt, out, i, ld(dt, a, i) + ld(dt, b, i));
}

static void cpu_residual_bwd(DType dt, void *dst, const void *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dt, dst, i, ld(dt, dst, i) + ld(dt, src, i));
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy over the real vocabulary (columns < V)

static void cpu_crossentropy_stats(DType dt, float *rowmax, float *rowsum, float *target, const void *logits,
                                   const int32_t *targets, int N, int vstart, int vreal, int Vloc) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * Vloc;
        float m = -INFINITY;
        for (int j = 0; j < vreal; j++) {
            float x = ld(dt, logits, o + j);
            if (x > m) m = x;
        }
        float s = 0.0f;
        for (int j = 0; j < vreal; j++) s += expf(ld(dt, logits, o + j) - m);
        int tj = targets[n] - vstart;
        rowmax[n] = m;
        rowsum[n] = s;
        target[n] = (tj >= 0 && tj < vreal) ? ld(dt, logits, o + tj) : 0.0f;
    }
}

static void cpu_crossentropy_bwd(DType dt, void *dlogits, const void *logits, const int32_t *targets, const float *gmax,
                                 const float *gsum, float dloss, int N, int vstart, int vreal, int Vloc) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * Vloc;
        float inv = 1.0f / gsum[n];
        int tj = targets[n] - vstart;
        for (int j = 0; j < vreal; j++) {
            float p = expf(ld(dt, logits, o + j) - gmax[n]) * inv;
            st(dt, dlogits, o + j, (p - (j == tj ? 1.0f : 0.0f)) * dloss);
        }
        for (int j = vreal > 0 ? vreal : 0; j < Vloc; j++) st(dt, dlogits, o + j, 0.0f);
    }
}

// ---------------------------------------------------------------------------------------------
// optimizer, norms, casts

static void cpu_adamw(DType dt, float *master, void *working, const float *grad, float *m, float *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2,
                      float grad_scale) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master[i] * (1.0f - lr * weight_decay);
        p -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        master[i] = p;
        if (working) st(dt, working, i, p);
    }
}

#define SUMSQ_CHUNK 65536

static double cpu_sumsq(const float *x, size_t n) {
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunks == 0) return 0.0;
    double *partial = xmalloc(sizeof(double) * nchunks);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t end = (c + 1) * SUMSQ_CHUNK < n ? (c + 1) * SUMSQ_CHUNK : n;
        double s = 0.0;
        for (size_t i = c * SUMSQ_CHUNK; i < end; i++) s += (double)x[i] * x[i];
        partial[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += partial[c];
    free(partial);
    return total;
}

static void cpu_cast(void *dst, DType dst_dt, const void *src, DType src_dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dst_dt, dst, i, ld(src_dt, src, i));
}

static const Backend CPU_BACKEND = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .copy = cpu_memcpy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .set_threads = cpu_set_threads,
    .encoder_fwd = cpu_encoder_fwd,
    .encoder_bwd = cpu_encoder_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .residual_fwd = cpu_residual_fwd,
    .residual_bwd = cpu_residual_bwd,
    .crossentropy_stats = cpu_crossentropy_stats,
    .crossentropy_bwd = cpu_crossentropy_bwd,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .cast = cpu_cast,
};

const Backend *backend_cpu(void) { return &CPU_BACKEND; }

#ifndef LLM4D_CUDA
// CPU-only build: kernels.cu is not linked in.
int cuda_device_count(void) { return 0; }
void cuda_use_device(int ordinal) { (void)ordinal; }
const Backend *backend_cuda(void) { return NULL; }
#endif

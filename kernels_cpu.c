// kernels_cpu.c: the reference backend. Plain C with OpenMP threads and GCC vector extensions (so it
// compiles to AVX-512, AVX2 or SSE as the flags allow), plus an AVX512-BF16 matmul kernel that is chosen
// at run time when the CPU has it. Every reduction runs in a fixed order that does not depend on the
// thread count, so results are bitwise reproducible.
//
// What is fused (each saves a pass over memory): bias and GELU in the matmul epilogue (and GELU's
// backward in the input-gradient matmul's epilogue); the residual add with the LayerNorm that follows
// it; softmax, cross-entropy and its gradient in one pass over a row of logits; AdamW over every tensor
// in one parallel loop. Attention never materialises the T x T scores (see the attention section).
// The Llama family's ops: RMSNorm (with the residual add fused as for LayerNorm), RoPE (standalone, or
// fused into the attention prologue), SwiGLU's activation in one pass, and grouped-query attention
// inside the same flash kernels (one task per key/value head and its group of query heads).
#include "kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "hostmem.h"

// vector lanes: what the target has (vectors are passed by value, which needs registers that wide)
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
#if VW == 16 && defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX512 1 // intrinsics: the bf16 kernel, the packing's transpose
#else
#define HAVE_AVX512 0
#endif
#define HAVE_BF16_KERNEL HAVE_AVX512

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));
typedef uint16_t vh __attribute__((vector_size(VW * 2)));

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vsplat(float x) { return (vf){ 0 } + x; }
static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
static inline vf vmax(vf a, vf b) { return vsel(a > b, a, b); }
static inline float hsum(vf v) { // a fixed pairwise tree
    for (int w = VW / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) v[i] += v[i + w];
    return v[0];
}
static inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < VW; i++) m = v[i] > m ? v[i] : m;
    return m;
}

// exp for VW lanes: x = n·ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative
// error about 2e-7), 2^n put into the exponent bits. Inputs below -87 give 0 (exp(-inf) = 0), inputs
// above 88 are clamped. Deterministic: the same bits on every run and thread.
static inline vf vexp(vf x) {
    vi under = x < vsplat(-87.0f);
    x = vmax(x, vsplat(-87.0f));
    x = vsel(x > vsplat(88.0f), vsplat(88.0f), x);
    const float magic = 12582912.0f; // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits
    vf t = x * 1.44269504088896341f + magic;
    vf n = t - magic;
    vi ni = (vi)t - 0x4B400000;
    vf r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    vf p = vsplat(1.0f / 720);
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vf scale = (vf)((ni + 127) << 23);
    return vsel(under, vsplat(0.0f), p * scale);
}
static inline vf vtanh(vf u) { return 1.0f - 2.0f / (vexp(2.0f * u) + 1.0f); }

#define GELU_K 0.7978845608028654f // sqrt(2/pi)
static inline vf vgelu(vf x) {
    vf u = GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + vtanh(u));
}
static inline vf vgelu_grad(vf x) {
    vf th = vtanh(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

// ---------------------------------------------------------------------------------------------
// element and row access in either storage dtype

static inline float ld(DType dt, const void *p, size_t i) {
    return dt == DT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void st(DType dt, void *p, size_t i, float v) {
    if (dt == DT_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}
// dst[0..n) = p[off..off+n) in fp32
static void row_load(DType dt, const void *p, size_t off, int n, float *restrict dst) {
    if (dt == DT_F32) {
        memcpy(dst, (const float *)p + off, sizeof(float) * (size_t)n);
    } else {
        const uint16_t *s = (const uint16_t *)p + off;
        for (int i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    }
}
// f32_to_bf16 for VW lanes: round to nearest even, NaN kept quiet
static inline vh vbf16(vf x) {
    vu u = (vu)x, nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
    vu r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return __builtin_convertvector((r & ~nan) | (((u >> 16) | 0x40u) & nan), vh);
}
static void row_store(DType dt, void *p, size_t off, int n, const float *restrict src) {
    if (dt == DT_F32) {
        memmove((float *)p + off, src, sizeof(float) * (size_t)n);
    } else {
        uint16_t *d = (uint16_t *)p + off;
        int i = 0;
        for (; i + VW <= n; i += VW) {
            vh h = vbf16(vload(src + i));
            memcpy(d + i, &h, sizeof h);
        }
        for (; i < n; i++) d[i] = f32_to_bf16(src[i]);
    }
}

// Σ x, Σ x·y and max x over n floats: VW lanes, then a fixed tree, then the tail in order.
static float vsum(const float *x, int n) {
    vf acc = vsplat(0.0f);
    int i = 0;
    for (; i + VW <= n; i += VW) acc += vload(x + i);
    float s = hsum(acc);
    for (; i < n; i++) s += x[i];
    return s;
}
static float vdot(const float *x, const float *y, int n) {
    vf acc = vsplat(0.0f);
    int i = 0;
    for (; i + VW <= n; i += VW) acc += vload(x + i) * vload(y + i);
    float s = hsum(acc);
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}
static float vmaxof(const float *x, int n) {
    vf acc = vsplat(-INFINITY);
    int i = 0;
    for (; i + VW <= n; i += VW) acc = vmax(acc, vload(x + i));
    float m = hmax(acc);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
// x[i] = exp(x[i] - sub); returns Σ over the lanes in a fixed order
static float vexp_sub_sum(float *x, int n, float sub) {
    vf acc = vsplat(0.0f);
    int i = 0;
    for (; i + VW <= n; i += VW) {
        vf e = vexp(vload(x + i) - sub);
        vstore(x + i, e);
        acc += e;
    }
    if (i < n) { // the tail padded with -inf, whose exp adds exactly 0
        float t[VW];
        for (int j = 0; j < VW; j++) t[j] = i + j < n ? x[i + j] : -INFINITY;
        vf e = vexp(vload(t) - sub);
        acc += e;
        for (int j = 0; i + j < n; j++) x[i + j] = e[j];
    }
    return hsum(acc);
}
static void gelu_row(float *x, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) vstore(x + i, vgelu(vload(x + i)));
    if (i < n) {
        float t[VW] = { 0 };
        memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
        vf g = vgelu(vload(t));
        for (int j = 0; i + j < n; j++) x[i + j] = g[j];
    }
}
// x[i] *= gelu'(pre[i])
static void gelu_grad_row(float *x, const float *pre, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) vstore(x + i, vload(x + i) * vgelu_grad(vload(pre + i)));
    if (i < n) {
        float t[VW] = { 0 };
        memcpy(t, pre + i, sizeof(float) * (size_t)(n - i));
        vf g = vgelu_grad(vload(t));
        for (int j = 0; i + j < n; j++) x[i + j] *= g[j];
    }
}

static void *aligned_scratch(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0) die("out of memory (%zu bytes of kernel scratch)", bytes);
    return p;
}

// Grow-only scratch buffers, one per purpose, kept across calls: fresh multi-megabyte allocations would
// come from mmap and page-fault zeroed memory in every matmul. Like the OpenMP runtime they are
// process-wide; ops are called from one thread at a time, which takes them before its parallel region
// and gives each OpenMP thread its own slice.
enum { SCR_GEMM_A, SCR_GEMM_B, SCR_GEMM_PART, SCR_WORK, SCR_ROPE, NSCRATCH };
static struct {
    void *p;
    size_t cap;
} g_scratch[NSCRATCH];

static void *scratch(int slot, size_t bytes) {
    if (bytes > g_scratch[slot].cap) {
        free(g_scratch[slot].p);
        g_scratch[slot].p = aligned_scratch(bytes);
        g_scratch[slot].cap = bytes;
    }
    return g_scratch[slot].p;
}

static size_t cpu_scratch_bytes(void) {
    size_t n = 0;
    for (int i = 0; i < NSCRATCH; i++) n += g_scratch[i].cap;
    return n;
}

// per-thread slices of a scratch slot, each `floats` long (rounded to a cache line)
static size_t slice_floats(size_t floats) { return (floats + 15) / 16 * 16; }
static float *thread_slices(int slot, size_t floats) {
    return scratch(slot, sizeof(float) * slice_floats(floats) * (size_t)omp_get_max_threads());
}
static float *my_slice(float *base, size_t floats) { return base + slice_floats(floats) * (size_t)omp_get_thread_num(); }

// ---------------------------------------------------------------------------------------------
// memory

// Registered host memory: the collectives' peers on this node read these buffers in place.
static void *cpu_alloc(size_t bytes) { return hostmem_alloc(bytes); }
static void cpu_free(void *p) { hostmem_free(p); }
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
// instruction-set selection for bf16 matmuls. Process-wide, like the OpenMP thread count: chosen once
// at start (cpu_select_isa), read by every matmul.

enum { ISA_GENERIC, ISA_AVX512BF16 };
static int g_isa = -1; // -1: not chosen yet; the first matmul takes the best available

static int bf16_supported(void) {
#if HAVE_BF16_KERNEL
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return 0;
#endif
}

const char *cpu_select_isa(const char *name) {
    if (!name) g_isa = bf16_supported() ? ISA_AVX512BF16 : ISA_GENERIC;
    else if (!strcmp(name, "generic")) g_isa = ISA_GENERIC;
    else if (!strcmp(name, "avx512bf16") && bf16_supported()) g_isa = ISA_AVX512BF16;
    else return NULL;
    return cpu_isa();
}

const char *cpu_isa(void) {
    if (g_isa < 0) cpu_select_isa(NULL);
    return g_isa == ISA_AVX512BF16 ? "avx512bf16" : "generic";
}

// ---------------------------------------------------------------------------------------------
// GEMM: C[M,N] (=, or += when accumulating) Σ_k A(m,k)·B(k,n), then an epilogue (bias, GELU, GELU's
// derivative, dtype conversion). Operands are strided views (row stride, column stride) so that the
// three products of a linear layer (x·Wᵀ, dy·W, dyᵀ·x) share one kernel.
//
// Goto/BLIS loop nest: for each NC-wide column block and KC-deep slice the threads pack B together
// into one shared buffer, then take row blocks of A in turn (about eight per thread, at most MC rows),
// pack them privately (or, for fp32 rows contiguous in k under a transposed C, read them in place)
// and run an MR x NR register-tile kernel over the block. Each element of C sums k in ascending order, slice after slice,
// with one fused multiply-add per term (or one bf16 dot-product pair), whichever thread computes it,
// so results do not depend on the thread count.

#if VW == 16
#define NV 4 // vectors per tile row: 6 x 64 tiles, 24 accumulators
#else
#define NV 2 // 16 vector registers without AVX-512: 6 x 2 vectors
#endif
#define MR 6
#define NR (NV * VW)
#define MC (16 * MR)
#define KC 512
#define NC (16 * NR)

typedef struct {
    DType dt;
    const void *p;
    size_t rs, cs; // element (r, c) is at p[r*rs + c*cs]
} View;

typedef struct {
    DType dt;
    void *p;
    size_t ld;
    int accumulate;       // C += product
    const void *bias;     // [N], same dtype as C, added to every row
    void *pre;            // GELU: pre = product (+ bias), C = gelu(pre)
    const void *gelu_pre; // GELU backward: C = product · gelu'(gelu_pre), gelu_pre laid out as C
    int trans;            // C is stored transposed: element (i, j) at p[j*ld + i], bias indexed by i
} Out;

typedef struct {
    int M, N, K;
    View A, B;
    Out o;
    int bf16;       // operands packed as bf16 pairs for the AVX512-BF16 kernel
    int direct;     // partial sums live in C itself (fp32 C without a GELU epilogue)
    float *scratch; // otherwise partial sums of one column block, when K spans several slices
    size_t lds;
} Gemm;

// fp32 panels: Ap[k][r] for MR rows, Bp[k][j] for NR columns, zero-padded
static void pack_a_f32(float *restrict dst, View A, int m0, int rows, int k0, int kc) {
    if (A.cs == 1 && A.dt == DT_F32 && rows == MR) { // MR row streams, contiguous stores
        const float *s[MR];
        for (int r = 0; r < MR; r++) s[r] = (const float *)A.p + (size_t)(m0 + r) * A.rs + (size_t)k0;
        for (int k = 0; k < kc; k++)
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) dst[k * MR + r] = s[r][k];
        return;
    }
    if (A.cs == 1) {
        for (int r = 0; r < rows; r++) {
            size_t base = (size_t)(m0 + r) * A.rs + (size_t)k0;
            if (A.dt == DT_F32) {
                const float *s = (const float *)A.p + base;
                for (int k = 0; k < kc; k++) dst[k * MR + r] = s[k];
            } else {
                const uint16_t *s = (const uint16_t *)A.p + base;
                for (int k = 0; k < kc; k++) dst[k * MR + r] = bf16_to_f32(s[k]);
            }
        }
    } else if (A.rs == 1 && A.dt == DT_F32) { // columns contiguous: MR floats per k
        for (int k = 0; k < kc; k++) {
            const float *s = (const float *)A.p + (size_t)(k0 + k) * A.cs + (size_t)m0;
            for (int r = 0; r < rows; r++) dst[k * MR + r] = s[r];
        }
    } else {
        for (int k = 0; k < kc; k++) {
            size_t base = (size_t)(k0 + k) * A.cs + (size_t)m0 * A.rs;
            for (int r = 0; r < rows; r++) dst[k * MR + r] = ld(A.dt, A.p, base + (size_t)r * A.rs);
        }
    }
    for (int r = rows; r < MR; r++)
        for (int k = 0; k < kc; k++) dst[k * MR + r] = 0.0f;
}

#if HAVE_AVX512
// A 16 x 16 transpose in registers: out[k][j] = rows[j][k] (unpacks of 32 and 64 bits, then two
// rounds of 128-bit lane shuffles). Only moves bits.
static inline void transpose16(const float *const rows[16], float *const out[16]) {
    __m512 r[16], t[16], u[16], v[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(rows[i]);
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4)
        for (int h = 0; h < 2; h++) {
            __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + h + 2]);
            u[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++)
            v[i + j] = _mm512_shuffle_f32x4(u[i + j], u[i + j + 4], 0x88), v[i + j + 4] = _mm512_shuffle_f32x4(u[i + j], u[i + j + 4], 0xdd);
    for (int j = 0; j < 8; j++) {
        _mm512_storeu_ps(out[j], _mm512_shuffle_f32x4(v[j], v[j + 8], 0x88));
        _mm512_storeu_ps(out[j + 8], _mm512_shuffle_f32x4(v[j], v[j + 8], 0xdd));
    }
}
#endif

static void pack_b_f32(float *restrict dst, View B, int k0, int kc, int n0, int cols) {
    if (B.cs == 1) {
        for (int k = 0; k < kc; k++) {
            float *d = dst + (size_t)k * NR;
            if (B.dt == DT_F32) {
                const float *s = (const float *)B.p + (size_t)(k0 + k) * B.rs + (size_t)n0;
                for (int j = 0; j < cols; j++) d[j] = s[j];
            } else {
                const uint16_t *s = (const uint16_t *)B.p + (size_t)(k0 + k) * B.rs + (size_t)n0;
                for (int j = 0; j < cols; j++) d[j] = bf16_to_f32(s[j]);
            }
            for (int j = cols; j < NR; j++) d[j] = 0.0f;
        }
    } else if (B.rs == 1 && B.dt == DT_F32) {
        // columns of B are rows in memory: TB of them at a time, 16 k at a time, through a small
        // transpose so that both the loads and the stores are contiguous
        enum { TB = NR < 16 ? NR : 16 };
        for (int j0 = 0; j0 < NR; j0 += TB) {
            int w = cols - j0 < TB ? (cols - j0 > 0 ? cols - j0 : 0) : TB;
            for (int kb = 0; kb < kc; kb += 16) {
                int h = kc - kb < 16 ? kc - kb : 16;
#if HAVE_AVX512
                if (TB == 16 && w == 16 && h == 16) { // (the forward's weight: a scalar transpose was 14% of a small step)
                    const float *rows[16];
                    float *out[16];
                    for (int j = 0; j < 16; j++) rows[j] = (const float *)B.p + (size_t)(n0 + j0 + j) * B.cs + (size_t)(k0 + kb);
                    for (int k = 0; k < 16; k++) out[k] = dst + (size_t)(kb + k) * NR + j0;
                    transpose16(rows, out);
                    continue;
                }
#endif
                float t[16][TB];
                for (int j = 0; j < w; j++) {
                    const float *s = (const float *)B.p + (size_t)(n0 + j0 + j) * B.cs + (size_t)(k0 + kb);
                    for (int k = 0; k < h; k++) t[k][j] = s[k];
                }
                for (int k = 0; k < h; k++) {
                    float *d = dst + (size_t)(kb + k) * NR + j0;
                    for (int j = 0; j < TB; j++) d[j] = j < w ? t[k][j] : 0.0f;
                }
            }
        }
    } else {
        for (int j = 0; j < cols; j++) {
            size_t base = (size_t)(n0 + j) * B.cs + (size_t)k0 * B.rs;
            for (int k = 0; k < kc; k++) dst[k * NR + j] = ld(B.dt, B.p, base + (size_t)k * B.rs);
        }
        for (int k = 0; k < kc; k++)
            for (int j = cols; j < NR; j++) dst[k * NR + j] = 0.0f;
    }
}

// bf16 panels: pairs of consecutive k in one 32-bit word (low half even k), Ap[k/2][r], Bp[k/2][j].
// Where k is the contiguous index a pair is one 32-bit load (little-endian: the even k lands low);
// otherwise two rows are interleaved. An odd last k pairs with 0.
static inline uint32_t ld_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint32_t bf16_pair(const uint16_t *p, size_t lo, size_t stride, int have_hi) {
    return (uint32_t)p[lo] | (have_hi ? (uint32_t)p[lo + stride] << 16 : 0u);
}

static void pack_a_bf16(uint32_t *restrict dst, View A, int m0, int rows, int k0, int kc) {
    const uint16_t *p = A.p;
    int kc2 = (kc + 1) / 2, full = kc / 2;
    if (A.cs == 1) { // rows contiguous in k
        for (int r = 0; r < rows; r++) {
            const uint16_t *s = p + (size_t)(m0 + r) * A.rs + (size_t)k0;
            for (int kk = 0; kk < full; kk++) dst[kk * MR + r] = ld_pair(s + 2 * kk);
            if (full < kc2) dst[full * MR + r] = s[2 * full];
        }
    } else { // columns contiguous: interleave two k-rows
        for (int kk = 0; kk < kc2; kk++) {
            const uint16_t *lo = p + (size_t)(k0 + 2 * kk) * A.cs + (size_t)m0 * A.rs, *hi = lo + A.cs;
            int have_hi = 2 * kk + 1 < kc;
            for (int r = 0; r < rows; r++)
                dst[kk * MR + r] = (uint32_t)lo[(size_t)r * A.rs] | (have_hi ? (uint32_t)hi[(size_t)r * A.rs] << 16 : 0u);
        }
    }
    for (int kk = 0; kk < kc2; kk++)
        for (int r = rows; r < MR; r++) dst[kk * MR + r] = 0;
}

static void pack_b_bf16(uint32_t *restrict dst, View B, int k0, int kc, int n0, int cols) {
    const uint16_t *p = B.p;
    int kc2 = (kc + 1) / 2, full = kc / 2;
    if (B.cs == 1) { // k-rows contiguous in j: interleave two of them
        for (int kk = 0; kk < kc2; kk++) {
            const uint16_t *restrict lo = p + (size_t)(k0 + 2 * kk) * B.rs + (size_t)n0, *restrict hi = lo + B.rs;
            uint32_t *restrict d = dst + (size_t)kk * NR;
            if (kk < full)
                for (int j = 0; j < cols; j++) d[j] = (uint32_t)lo[j] | (uint32_t)hi[j] << 16;
            else
                for (int j = 0; j < cols; j++) d[j] = lo[j];
            for (int j = cols; j < NR; j++) d[j] = 0;
        }
    } else if (B.rs == 1) { // columns of B are rows in memory, contiguous in k: pairs are 32-bit loads,
                            // moved through a small transpose as in pack_b_f32
        enum { TB = NR < 16 ? NR : 16 };
        for (int j0 = 0; j0 < NR; j0 += TB) {
            int w = cols - j0 < TB ? (cols - j0 > 0 ? cols - j0 : 0) : TB;
            for (int kb = 0; kb < kc2; kb += 16) {
                int h = kc2 - kb < 16 ? kc2 - kb : 16;
                uint32_t t[16][TB];
                for (int j = 0; j < w; j++) {
                    const uint16_t *s = p + (size_t)(n0 + j0 + j) * B.cs + (size_t)k0;
                    for (int kk = 0; kk < h; kk++)
                        t[kk][j] = kb + kk < full ? ld_pair(s + 2 * (kb + kk)) : s[2 * (kb + kk)];
                }
                for (int kk = 0; kk < h; kk++) {
                    uint32_t *d = dst + (size_t)(kb + kk) * NR + j0;
                    for (int j = 0; j < TB; j++) d[j] = j < w ? t[kk][j] : 0;
                }
            }
        }
    } else {
        for (int kk = 0; kk < kc2; kk++) {
            int hi = 2 * kk + 1 < kc;
            size_t base = (size_t)(k0 + 2 * kk) * B.rs + (size_t)n0 * B.cs;
            for (int j = 0; j < cols; j++) dst[kk * NR + j] = bf16_pair(p, base + (size_t)j * B.cs, B.rs, hi);
            for (int j = cols; j < NR; j++) dst[kk * NR + j] = 0;
        }
    }
}

// dst[MR][NR] (row stride ldd) = src (or 0 when src is NULL) + A-panel · Bp-panel over kc, A's
// element (r, k) at a[k*ak + r*ar]: packed (ak = MR, ar = 1) or MR rows of A read in place (ak = 1).
// src and dst may be the same tile.
static inline __attribute__((always_inline)) void kernel_f32_body(int kc, const float *restrict a, size_t ak,
                                                                  size_t ar, const float *restrict b,
                                                                  const float *src, size_t lds, float *dst,
                                                                  size_t ldd) {
    vf c[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = src ? vload(src + r * lds + v * VW) : vsplat(0.0f);
    for (int k = 0; k < kc; k++) {
        vf bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = vload(b + (size_t)k * NR + v * VW);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            float av = a[(size_t)k * ak + (size_t)r * ar];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] += av * bv[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) vstore(dst + r * ldd + v * VW, c[r][v]);
}
static void kernel_f32(int kc, const float *restrict a, const float *restrict b, const float *src, size_t lds,
                       float *dst, size_t ldd) {
    kernel_f32_body(kc, a, MR, 1, b, src, lds, dst, ldd);
}
static void kernel_f32_rows(int kc, const float *restrict a, size_t lda, const float *restrict b, const float *src,
                            size_t lds, float *dst, size_t ldd) {
    kernel_f32_body(kc, a, 1, lda, b, src, lds, dst, ldd);
}

#if HAVE_BF16_KERNEL
// The same with bf16 pairs: vdpbf16ps adds a[2k]·b[2k] + a[2k+1]·b[2k+1] into each fp32 lane.
__attribute__((target("avx512f,avx512bf16"))) static void kernel_bf16(int kc2, const uint32_t *restrict a,
                                                                      const uint32_t *restrict b, const float *src,
                                                                      size_t lds, float *dst, size_t ldd) {
    __m512 c[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = src ? _mm512_loadu_ps(src + r * lds + v * 16) : _mm512_setzero_ps();
    for (int kk = 0; kk < kc2; kk++) {
        __m512bh bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + (size_t)kk * NR + v * 16);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[kk * MR + r]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(dst + r * ldd + v * 16, c[r][v]);
}
#endif

// lda: 0 for a packed A panel, else A's row stride (fp32 rows read in place)
static void run_kernel(const Gemm *g, int kc, const void *ap, size_t lda, const void *bp, const float *src, size_t lds,
                       float *dst, size_t ldd) {
    (void)g;
    if (lda) {
        kernel_f32_rows(kc, ap, lda, bp, src, lds, dst, ldd);
        return;
    }
#if HAVE_BF16_KERNEL
    if (g->bf16) {
        kernel_bf16((kc + 1) / 2, ap, bp, src, lds, dst, ldd);
        return;
    }
#endif
    kernel_f32(kc, ap, bp, src, lds, dst, ldd);
}

// bias, accumulation into C (when partial sums did not already start from it), GELU or its derivative,
// and the conversion to C's dtype, for rows x cols of a finished tile
static void gemm_epilogue(const Gemm *g, float *tile, int i0, int j0, int rows, int cols) {
    const Out *o = &g->o;
    float tmp[NR], bias[NR];
    if (o->bias) row_load(o->dt, o->bias, (size_t)j0, cols, bias);
    for (int r = 0; r < rows; r++) {
        float *x = tile + r * NR;
        size_t off = (size_t)(i0 + r) * o->ld + (size_t)j0;
        if (o->bias)
            for (int j = 0; j < cols; j++) x[j] += bias[j];
        if (o->accumulate && !g->direct) {
            row_load(o->dt, o->p, off, cols, tmp);
            for (int j = 0; j < cols; j++) x[j] = tmp[j] + x[j];
        }
        if (o->pre) { // GELU of the stored (rounded) value, which is what the backward will see
            row_store(o->dt, o->pre, off, cols, x);
            if (o->dt == DT_BF16) row_load(o->dt, o->pre, off, cols, x);
            gelu_row(x, cols);
        }
        if (o->gelu_pre) {
            row_load(o->dt, o->gelu_pre, off, cols, tmp);
            gelu_grad_row(x, tmp, cols);
        }
        row_store(o->dt, o->p, off, cols, x);
    }
}

// dst[j*ld + r] = tile[r*NR + j] for rows x cols
static void store_transposed(float *dst, size_t ld, const float *tile, int rows, int cols) {
    int j = 0;
#if HAVE_AVX512
    static const float zero[16];
    for (; j + 16 <= cols; j += 16) { // through the register transpose, rows padded with zeros
        float t[16][16] __attribute__((aligned(64)));
        const float *src[16];
        float *out[16];
        for (int r = 0; r < 16; r++) src[r] = r < rows ? tile + r * NR + j : zero, out[r] = t[r];
        transpose16(src, out);
        for (int k = 0; k < 16; k++) memcpy(dst + (size_t)(j + k) * ld, t[k], sizeof(float) * (size_t)rows);
    }
#endif
    for (; j < cols; j++)
        for (int r = 0; r < rows; r++) dst[(size_t)j * ld + r] = tile[r * NR + j];
}

// The same for a transposed fp32 C (bias and GELU only): the tile's row r is C's column i0 + r. Each
// element meets the same operations as in gemm_epilogue, so the bits are those of the untransposed
// product; GELU runs along the tile's rows, whole vectors.
static void gemm_epilogue_trans(const Gemm *g, float *tile, int i0, int j0, int rows, int cols) {
    const Out *o = &g->o;
    float *out = o->p, *pre = o->pre;
    for (int r = 0; r < rows; r++) {
        float *x = tile + r * NR;
        if (o->bias) {
            float b = ((const float *)o->bias)[i0 + r];
            for (int j = 0; j < cols; j++) x[j] += b;
        }
    }
    if (pre) {
        store_transposed(pre + (size_t)j0 * o->ld + (size_t)i0, o->ld, tile, rows, cols);
        for (int r = 0; r < rows; r++) gelu_row(tile + r * NR, cols);
    }
    store_transposed(out + (size_t)j0 * o->ld + (size_t)i0, o->ld, tile, rows, cols);
}

// One MR x NR tile of C over one k-slice: partial sums start from C (direct, accumulating), from the
// previous slice, or from zero, and the last slice runs the epilogue.
static void gemm_tile(const Gemm *g, const void *ap, size_t lda, const void *bp, int kc, int i0, int j0, int n0, int rows, int cols,
                      int first, int last) {
    float tile[MR * NR] __attribute__((aligned(64)));
    float *part;
    size_t ldp;
    if (g->direct) {
        part = (float *)g->o.p + (size_t)i0 * g->o.ld + (size_t)j0;
        ldp = g->o.ld;
    } else {
        part = g->scratch ? g->scratch + (size_t)i0 * g->lds + (size_t)(j0 - n0) : NULL;
        ldp = g->lds;
    }
    const float *src = first ? (g->direct && g->o.accumulate ? part : NULL) : part;
    int epilogue = last && (!g->direct || g->o.bias);
    if (epilogue && !g->o.trans) { // the rows the epilogue reads and writes, fetched while the kernel runs
        size_t es = dtype_size(g->o.dt);
        for (int r = 0; r < rows; r++) {
            size_t off = ((size_t)(i0 + r) * g->o.ld + (size_t)j0) * es;
            for (size_t b = 0; b < (size_t)cols * es; b += 64) {
                __builtin_prefetch((char *)g->o.p + off + b, 1);
                if (g->o.gelu_pre) __builtin_prefetch((const char *)g->o.gelu_pre + off + b, 0);
            }
        }
    }
    if (rows == MR && cols == NR) {
        if (epilogue) run_kernel(g, kc, ap, lda, bp, src, ldp, tile, NR);
        else run_kernel(g, kc, ap, lda, bp, src, ldp, part, ldp);
    } else { // an edge tile: computed whole on a local copy
        if (src) {
            memset(tile, 0, sizeof tile);
            for (int r = 0; r < rows; r++) memcpy(tile + r * NR, src + r * ldp, sizeof(float) * (size_t)cols);
        }
        run_kernel(g, kc, ap, lda, bp, src ? tile : NULL, NR, tile, NR);
        if (!epilogue)
            for (int r = 0; r < rows; r++) memcpy(part + r * ldp, tile + r * NR, sizeof(float) * (size_t)cols);
    }
    if (epilogue && g->o.trans) gemm_epilogue_trans(g, tile, i0, j0, rows, cols);
    else if (epilogue) gemm_epilogue(g, tile, i0, j0, rows, cols);
}

static void gemm(int M, int N, int K, View A, View B, Out o) {
    if (M <= 0 || N <= 0) return;
    Gemm g = { .M = M, .N = N, .K = K, .A = A, .B = B, .o = o };
    g.bf16 = HAVE_BF16_KERNEL && A.dt == DT_BF16 && B.dt == DT_BF16 && !strcmp(cpu_isa(), "avx512bf16");
    if (o.trans && (o.dt != DT_F32 || o.accumulate || o.gelu_pre)) die("internal: a transposed GEMM output is fp32 with bias and GELU only");
    g.direct = o.dt == DT_F32 && !o.pre && !o.gelu_pre && !o.trans;
    // A's full MR-row blocks read in place: only with a transposed C, where A is the weight (packing
    // it, from memory, was 40% of the forward matmul's time at N 64)
    int a_rows = o.trans && A.dt == DT_F32 && A.cs == 1 && !g.bf16;
    int nslices = K > KC ? (K + KC - 1) / KC : 1;
    int ncmax = N < NC ? N : NC, kcmax = K < KC ? (K > 0 ? K : 1) : KC;
    size_t a_bytes = (size_t)MR * ((kcmax + 1) / 2 * 2) * 4, panel_bytes = (size_t)NR * ((kcmax + 1) / 2 * 2) * 4;
    if (!g.direct && nslices > 1) {
        g.lds = (size_t)ncmax;
        g.scratch = scratch(SCR_GEMM_PART, sizeof(float) * (size_t)M * ncmax);
    }
    char *Bp = scratch(SCR_GEMM_B, panel_bytes * (size_t)((ncmax + NR - 1) / NR));
    // about 8 row blocks per thread, so that small M still balances; no block is larger than MC. The
    // blocking never changes a result: each element adds its k in the same order in any block.
    int nth = omp_get_max_threads(), mc_blk = (M + 8 * nth - 1) / (8 * nth);
    mc_blk = (mc_blk + MR - 1) / MR * MR;
    if (mc_blk > MC) mc_blk = MC;
    int mblocks = (M + mc_blk - 1) / mc_blk;
    size_t a_floats = a_bytes / 4 * (MC / MR);
    float *Ap_all = thread_slices(SCR_GEMM_A, a_floats);
#pragma omp parallel
    {
        char *Ap = (char *)my_slice(Ap_all, a_floats);
        for (int n0 = 0; n0 < N; n0 += NC) {
            int nc = N - n0 < NC ? N - n0 : NC, npanels = (nc + NR - 1) / NR;
            for (int s = 0; s < nslices; s++) {
                int k0 = s * KC, kc = K - k0 < KC ? K - k0 : KC;
                if (kc < 0) kc = 0;
#pragma omp for schedule(static)
                for (int p = 0; p < npanels; p++) {
                    int cols = nc - p * NR < NR ? nc - p * NR : NR;
                    if (g.bf16) pack_b_bf16((uint32_t *)(Bp + p * panel_bytes), B, k0, kc, n0 + p * NR, cols);
                    else pack_b_f32((float *)(Bp + p * panel_bytes), B, k0, kc, n0 + p * NR, cols);
                }
#pragma omp for schedule(dynamic, 1)
                for (int mb = 0; mb < mblocks; mb++) {
                    int m0 = mb * mc_blk, mc = M - m0 < mc_blk ? M - m0 : mc_blk;
                    for (int pm = 0; pm < mc; pm += MR) {
                        int rows = mc - pm < MR ? mc - pm : MR;
                        if (a_rows && rows == MR) continue;
                        if (g.bf16) pack_a_bf16((uint32_t *)(Ap + (pm / MR) * a_bytes), A, m0 + pm, rows, k0, kc);
                        else pack_a_f32((float *)(Ap + (pm / MR) * a_bytes), A, m0 + pm, rows, k0, kc);
                    }
                    for (int p = 0; p < npanels; p++) {
                        int cols = nc - p * NR < NR ? nc - p * NR : NR;
                        for (int pm = 0; pm < mc; pm += MR) {
                            int in_place = a_rows && mc - pm >= MR;
                            const void *ap = in_place ? (const void *)((const float *)A.p + (size_t)(m0 + pm) * A.rs + k0)
                                                      : (const void *)(Ap + (pm / MR) * a_bytes);
                            gemm_tile(&g, ap, in_place ? A.rs : 0, Bp + p * panel_bytes, kc, m0 + pm, n0 + p * NR, n0,
                                      mc - pm < MR ? mc - pm : MR, cols, s == 0, s == nslices - 1);
                        }
                    }
                }
            }
        }
    }
}

// dst[c] += Σ_n x[n, c] over column chunks, each summed row by row (a fixed order) by one thread
#define COLSUM_W 64
static void colsum_add(DType dt, float *dst, const void *x, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COLSUM_W) {
        int w = C - c0 < COLSUM_W ? C - c0 : COLSUM_W;
        float acc[COLSUM_W] = { 0 }, tmp[COLSUM_W];
        for (int n = 0; n < N; n++) {
            row_load(dt, x, (size_t)n * C + c0, w, tmp);
            for (int j = 0; j < w; j++) acc[j] += tmp[j];
        }
        for (int j = 0; j < w; j++) dst[c0 + j] += acc[j];
    }
}

// GELU of stored values, through the epilogue's own gelu_row, so that the bits match it
#define GELU_CHUNK 1024
static void cpu_gelu_fwd(DType dt, void *out, const void *inp, size_t n) {
    size_t nchunks = (n + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel
    {
        float x[GELU_CHUNK];
#pragma omp for schedule(static)
        for (size_t c = 0; c < nchunks; c++) {
            size_t off = c * GELU_CHUNK;
            int len = n - off < GELU_CHUNK ? (int)(n - off) : GELU_CHUNK;
            row_load(dt, inp, off, len, x);
            gelu_row(x, len);
            row_store(dt, out, off, len, x);
        }
    }
}

static void cpu_matmul_fwd(DType dt, void *out, void *pre, const void *inp, const void *weight, const void *bias, int N,
                           int C, int OC) {
    Out o = { .dt = dt, .p = out, .ld = (size_t)OC, .bias = bias, .pre = pre };
    if (dt == DT_F32) { // outᵀ = W·inpᵀ: the weight's rows feed the kernel in place, and only inp, N rows,
                        // is packed (as B, transposed); the same sums (x·w = w·x), 2-3% of a step at N 64
        o.trans = 1;
        gemm(OC, N, C, (View){ dt, weight, (size_t)C, 1 }, (View){ dt, inp, 1, (size_t)C }, o);
        return;
    }
    gemm(N, OC, C, (View){ dt, inp, (size_t)C, 1 }, (View){ dt, weight, 1, (size_t)C }, o);
}

static void cpu_matmul_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                           const void *weight, const void *gelu_pre, int N, int C, int OC) {
    if (dinp) {
        View A = { dt, dout, (size_t)OC, 1 };
        View B = { dt, weight, (size_t)C, 1 };
        Out o = { .dt = dt, .p = dinp, .ld = (size_t)C, .gelu_pre = gelu_pre };
        gemm(N, C, OC, A, B, o);
    }
    if (dweight) {
        View A = { dt, dout, 1, (size_t)OC };
        View B = { dt, inp, (size_t)C, 1 };
        Out o = { .dt = DT_F32, .p = dweight, .ld = (size_t)C, .accumulate = 1 };
        gemm(OC, C, N, A, B, o);
    }
    if (dbias) colsum_add(dt, dbias, dout, N, OC);
}

// ---------------------------------------------------------------------------------------------
// encoder

static void cpu_encoder_fwd(DType dt, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B,
                            int T, int C, int vstart, int vlen) {
#pragma omp parallel
    {
        float *x = xmalloc(sizeof(float) * 2 * (size_t)C), *y = x + C;
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            int t = bt % T, row = tokens[bt] - vstart;
            if (row >= 0 && row < vlen) row_load(dt, wte, (size_t)row * C, C, x);
            else memset(x, 0, sizeof(float) * (size_t)C);
            if (wpe) {
                row_load(dt, wpe, (size_t)t * C, C, y);
                for (int c = 0; c < C; c++) x[c] += y[c];
            }
            row_store(dt, out, (size_t)bt * C, C, x);
        }
        free(x);
    }
}

// Parallel over column chunks so that rows sharing a token or a position never race, and each sum runs
// over (b, t) in order.
static void cpu_encoder_bwd(DType dt, float *dwte, float *dwpe, const void *dout, const int32_t *tokens, int B,
                            int T, int C, int vstart, int vlen) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COLSUM_W) {
        int w = C - c0 < COLSUM_W ? C - c0 : COLSUM_W;
        float g[COLSUM_W];
        for (int bt = 0; bt < B * T; bt++) {
            row_load(dt, dout, (size_t)bt * C + c0, w, g);
            int row = tokens[bt] - vstart;
            if (row >= 0 && row < vlen)
                for (int j = 0; j < w; j++) dwte[(size_t)row * C + c0 + j] += g[j];
            if (dwpe)
                for (int j = 0; j < w; j++) dwpe[(size_t)(bt % T) * C + c0 + j] += g[j];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (and the residual add before it)

// y = (x - mean)·rstd·w + b over one row
static void ln_row(const float *x, const float *w, const float *b, float *y, int C, float *mean, float *rstd) {
    float m = vsum(x, C) / C;
    for (int c = 0; c < C; c++) y[c] = x[c] - m;
    float var = vdot(y, y, C) / C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    for (int c = 0; c < C; c++) y[c] = y[c] * s * w[c] + b[c];
    *mean = m;
    *rstd = s;
}

static void layernorm_rows(DType dt, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                           const void *weight, const void *bias, int N, int C) {
    float *wb = xmalloc(sizeof(float) * 2 * (size_t)C);
    row_load(dt, weight, 0, C, wb);
    row_load(dt, bias, 0, C, wb + C);
#pragma omp parallel
    {
        float *x = xmalloc(sizeof(float) * 3 * (size_t)C), *y = x + C, *z = y + C;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * C;
            row_load(dt, a, o, C, x);
            if (b) { // the residual add, stored as the stream's next value
                row_load(dt, b, o, C, z);
                for (int c = 0; c < C; c++) x[c] += z[c];
                row_store(dt, res, o, C, x);
                if (dt == DT_BF16) row_load(dt, res, o, C, x); // normalise what is stored
            }
            ln_row(x, wb, wb + C, y, C, &mean[n], &rstd[n]);
            row_store(dt, out, o, C, y);
        }
        free(x);
    }
    free(wb);
}

static void cpu_layernorm_fwd(DType dt, void *out, float *mean, float *rstd, const void *inp, const void *weight,
                              const void *bias, int N, int C) {
    layernorm_rows(dt, NULL, out, mean, rstd, inp, NULL, weight, bias, N, C);
}

static void cpu_residual_layernorm_fwd(DType dt, void *res, void *out, float *mean, float *rstd, const void *a,
                                       const void *b, const void *weight, const void *bias, int N, int C) {
    layernorm_rows(dt, res, out, mean, rstd, a, b, weight, bias, N, C);
}

// One pass over the rows: each chunk of LN_ROWS rows adds its parameter gradients into its own partial
// sums, and the chunks are then added in order, so the result does not depend on the thread count.
#define LN_ROWS 32
static void cpu_layernorm_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                              const void *weight, const float *mean, const float *rstd, int N, int C) {
    int nchunks = (N + LN_ROWS - 1) / LN_ROWS;
    float *partial = scratch(SCR_WORK, sizeof(float) * 2 * (size_t)C * (nchunks > 0 ? nchunks : 1));
    float *w = xcalloc((size_t)C, sizeof(float));
    if (dinp) row_load(dt, weight, 0, C, w); // (the weight-gradient half alone needs no weight)
#pragma omp parallel
    {
        float *x = xmalloc(sizeof(float) * 4 * (size_t)C), *dy = x + C, *dn = dy + C, *di = dn + C;
#pragma omp for schedule(static)
        for (int ch = 0; ch < nchunks; ch++) {
            float *pw = partial + (size_t)ch * 2 * C, *pb = pw + C;
            memset(pw, 0, sizeof(float) * 2 * (size_t)C);
            for (int n = ch * LN_ROWS; n < N && n < (ch + 1) * LN_ROWS; n++) {
                size_t o = (size_t)n * C;
                row_load(dt, inp, o, C, x);
                row_load(dt, dout, o, C, dy);
                float m = mean[n], s = rstd[n];
                for (int c = 0; c < C; c++) {
                    x[c] = (x[c] - m) * s; // x̂
                    dn[c] = w[c] * dy[c];
                    pw[c] += dy[c] * x[c];
                    pb[c] += dy[c];
                }
                if (!dinp) continue;
                row_load(dt, dinp, o, C, di);
                float dmean = vsum(dn, C) / C, ddot = vdot(dn, x, C) / C;
                for (int c = 0; c < C; c++) di[c] += (dn[c] - dmean - x[c] * ddot) * s;
                row_store(dt, dinp, o, C, di);
            }
        }
        free(x);
#pragma omp for schedule(static)
        for (int c = 0; c < C; c++) {
            float sw = 0.0f, sb = 0.0f;
            for (int ch = 0; ch < nchunks; ch++) {
                sw += partial[(size_t)ch * 2 * C + c];
                sb += partial[(size_t)ch * 2 * C + C + c];
            }
            if (dweight) dweight[c] += sw;
            if (dbias) dbias[c] += sb;
        }
    }
    free(w);
}

// RoPE's rotation of one head's row x[0..hs) by the cos|sin row cs (kernels.h): rope_row applies it,
// rope_row_t its transpose (the backward)
static inline void rope_row(float *x, int hs, const float *cs) {
    int half = hs / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half], c = cs[i], s = cs[half + i];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}
static inline void rope_row_t(float *x, int hs, const float *cs) {
    int half = hs / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half], c = cs[i], s = cs[half + i];
        x[i] = a * c + b * s;
        x[i + half] = b * c - a * s;
    }
}
static void rope_table(const RopeConfig *r, int hs, const int32_t *pos, int p0, int n, float *tab);

// ---------------------------------------------------------------------------------------------
// Attention, flash style. For each (batch, head) pair, queries are taken ATT_BQ rows at a time against
// keys ATT_BK at a time; a tile's scores S = (q/√hs)·kᵀ live only in a small buffer. The forward keeps a
// running row max m and sum l (online softmax): a new tile rescales the output accumulated so far by
// exp(m_old - m_new). Tiles entirely above the causal diagonal are skipped. It saves
// lse = m + log l per row. The backward recomputes P = exp(S - lse) tile by tile, with
// D = rowsum(dout·out): dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P·(dP - D), dQ += dS·K, dK += dSᵀ·Q. Key tiles are
// the outer loop and query tiles the inner one, so dK and dV of a key tile sum the query tiles in order
// and dQ of a query tile sums the key tiles in order. One task per (batch, key/value head), so the results
// do not depend on the thread count: with grouped-query attention the task runs the group's query heads
// in head order against the K and V it loaded once, and dK, dV sum them in that order (multi-head
// attention is the group of one). RoPE, when given, rotates q and k as they are loaded (the prologue) and
// rotates dq and dk back as they are stored. The whole-sequence ops are the block ops with q, k, v from
// one qkv buffer.

#define ATT_BQ 32
#define ATT_BK 32         // a multiple of VW
#define ATT_HC (4 * VW)   // head channels are padded with zeros to a multiple of this
#define ATT_NK (ATT_BK / VW)

typedef struct {
    int B, NH, hs, Tq, q0, Tk, k0;
    int hsp, Tqp, Tkp; // padded sizes
    int kvis;          // keys visible to at least one query of the block (a prefix of the block)
    float scale;
    int NKV;           // key/value heads: NH for multi-head attention, fewer for grouped-query attention
    const float *rq, *rk; // RoPE cos|sin rows of the queries [Tq][hs] and visible keys [kvis][hs]; NULL: none
} AttDims;

static AttDims att_dims(int B, int NH, int NKV, int hs, int Tq, int q0, int Tk, int k0) {
    AttDims d = { B, NH, hs, Tq, q0, Tk, k0, 0, 0, 0, 0, 0.0f, NKV, NULL, NULL };
    d.hsp = (hs + ATT_HC - 1) / ATT_HC * ATT_HC;
    d.Tqp = (Tq + ATT_BQ - 1) / ATT_BQ * ATT_BQ;
    d.kvis = q0 + Tq - k0; // keys at positions <= the last query's
    if (d.kvis > Tk) d.kvis = Tk;
    if (d.kvis < 0 || Tq <= 0) d.kvis = 0;
    d.Tkp = (d.kvis + ATT_BK - 1) / ATT_BK * ATT_BK;
    if (d.Tkp == 0) d.Tkp = ATT_BK;
    d.scale = 1.0f / sqrtf((float)hs);
    return d;
}

static inline size_t av_off(const AttnView *v, int b, int t, int h, int hs) {
    return (size_t)b * v->bstride + (size_t)t * v->tstride + (size_t)h * hs;
}

// rows [0, n) of (b, h) into dst[t][hsp], rotated by rot's rows when rot is not NULL, times mul, zero
// elsewhere up to rows_pad
static void att_load_rows(const AttnView *v, int b, int h, const AttDims *d, int n, int rows_pad, float mul,
                          const float *rot, float *dst) {
    memset(dst, 0, sizeof(float) * (size_t)rows_pad * d->hsp);
    for (int t = 0; t < n; t++) {
        float *r = dst + (size_t)t * d->hsp;
        row_load(v->dt, v->p, av_off(v, b, t, h, d->hs), d->hs, r);
        if (rot) rope_row(r, d->hs, rot + (size_t)t * d->hs);
        if (mul != 1.0f)
            for (int i = 0; i < d->hs; i++) r[i] *= mul;
    }
}
// the same transposed: dst[i][t], row stride Tkp
static void att_load_cols(const AttnView *v, int b, int h, const AttDims *d, int n, const float *rot, float *dst,
                          float *tmp) {
    memset(dst, 0, sizeof(float) * (size_t)d->hsp * d->Tkp);
    for (int t = 0; t < n; t++) {
        row_load(v->dt, v->p, av_off(v, b, t, h, d->hs), d->hs, tmp);
        if (rot) rope_row(tmp, d->hs, rot + (size_t)t * d->hs);
        for (int i = 0; i < d->hs; i++) dst[(size_t)i * d->Tkp + t] = tmp[i];
    }
}

// s[BQ][BK] = a[BQ][hsp] · bt[hsp][BK] (bt with row stride ldb)
static void att_abt(const float *restrict a, const float *restrict bt, size_t ldb, int hsp, float *restrict s) {
    for (int r0 = 0; r0 < ATT_BQ; r0 += 8) {
        vf acc[8][ATT_NK];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
#pragma GCC unroll 4
            for (int v = 0; v < ATT_NK; v++) acc[r][v] = vsplat(0.0f);
        for (int i = 0; i < hsp; i++) {
            vf b[ATT_NK];
#pragma GCC unroll 4
            for (int v = 0; v < ATT_NK; v++) b[v] = vload(bt + (size_t)i * ldb + v * VW);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                float x = a[(size_t)(r0 + r) * hsp + i];
#pragma GCC unroll 4
                for (int v = 0; v < ATT_NK; v++) acc[r][v] += x * b[v];
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
#pragma GCC unroll 4
            for (int v = 0; v < ATT_NK; v++) vstore(s + (r0 + r) * ATT_BK + v * VW, acc[r][v]);
    }
}

// o[rows][hsp] += P · v[n][hsp] with P[r][c] = p[r*sr + c*sc] (sc = 1 for P, sr = 1 for a transposed
// tile, so no transpose is ever copied); rows a multiple of 4
static void att_ab(float *restrict o, const float *restrict p, int sr, int sc, int n, const float *restrict v, int hsp,
                   int rows) {
    for (int r0 = 0; r0 < rows; r0 += 4)
        for (int i0 = 0; i0 < hsp; i0 += ATT_HC) {
            vf acc[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++) acc[r][x] = vload(o + (size_t)(r0 + r) * hsp + i0 + x * VW);
            for (int c = 0; c < n; c++) {
                vf vv[4];
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++) vv[x] = vload(v + (size_t)c * hsp + i0 + x * VW);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    float w = p[(size_t)(r0 + r) * sr + (size_t)c * sc];
#pragma GCC unroll 4
                    for (int x = 0; x < 4; x++) acc[r][x] += w * vv[x];
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++) vstore(o + (size_t)(r0 + r) * hsp + i0 + x * VW, acc[r][x]);
        }
}

// Keys of the tile at kt0 visible to query row r of the tile at qt0 (a prefix of the tile; may be <= 0).
static inline int att_visible(const AttDims *d, int qt0, int r, int kt0) {
    int lim = d->q0 + qt0 + r - (d->k0 + kt0) + 1, left = d->Tk - kt0;
    lim = lim < left ? lim : left;
    return lim < ATT_BK ? lim : ATT_BK;
}

// One task: key/value head hk of batch row b, and the NH/NKV query heads that share it, in head order
// (K and V are loaded once for the group).
static void att_fwd_head(const AttDims *d, int b, int hk, AttnView out, float *lse, AttnView q, AttnView k, AttnView v,
                         int merge, float *work) {
    int hsp = d->hsp, group = d->NH / d->NKV;
    float *kt = work, *vv = kt + (size_t)hsp * d->Tkp, *qt = vv + (size_t)d->Tkp * hsp, *o = qt + ATT_BQ * hsp;
    float *s = o + ATT_BQ * hsp, *row = s + ATT_BQ * ATT_BK;
    float m[ATT_BQ], l[ATT_BQ];
    att_load_cols(&k, b, hk, d, d->kvis, d->rk, kt, row);
    att_load_rows(&v, b, hk, d, d->kvis, d->Tkp, 1.0f, NULL, vv);
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int qt0 = 0; qt0 < d->Tq; qt0 += ATT_BQ) {
            int nq = d->Tq - qt0 < ATT_BQ ? d->Tq - qt0 : ATT_BQ, qmax = d->q0 + qt0 + nq - 1;
            memset(qt, 0, sizeof(float) * ATT_BQ * hsp);
            for (int r = 0; r < nq; r++) {
                float *qr = qt + (size_t)r * hsp;
                row_load(q.dt, q.p, av_off(&q, b, qt0 + r, h, d->hs), d->hs, qr);
                if (d->rq) rope_row(qr, d->hs, d->rq + (size_t)(qt0 + r) * d->hs);
                for (int i = 0; i < d->hs; i++) qr[i] *= d->scale;
            }
            memset(o, 0, sizeof(float) * ATT_BQ * hsp);
            for (int r = 0; r < ATT_BQ; r++) m[r] = -INFINITY, l[r] = 0.0f;
            for (int kt0 = 0; kt0 < d->kvis && d->k0 + kt0 <= qmax; kt0 += ATT_BK) {
                att_abt(qt, kt + kt0, (size_t)d->Tkp, hsp, s);
                for (int r = 0; r < ATT_BQ; r++) {
                    float *sr = s + r * ATT_BK;
                    int lim = r < nq ? att_visible(d, qt0, r, kt0) : 0;
                    for (int c = lim > 0 ? lim : 0; c < ATT_BK; c++) sr[c] = -INFINITY;
                    float mt = lim > 0 ? vmaxof(sr, ATT_BK) : -INFINITY;
                    if (mt == -INFINITY) {
                        memset(sr, 0, sizeof(float) * ATT_BK);
                        continue;
                    }
                    float mnew = mt > m[r] ? mt : m[r];
                    float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
                    l[r] = l[r] * alpha + vexp_sub_sum(sr, ATT_BK, mnew);
                    m[r] = mnew;
                    if (alpha != 1.0f)
                        for (int i = 0; i < hsp; i++) o[(size_t)r * hsp + i] *= alpha;
                }
                att_ab(o, s, ATT_BK, 1, ATT_BK, vv + (size_t)kt0 * hsp, hsp, ATT_BQ);
            }
            for (int r = 0; r < nq; r++) {
                float *orow = o + (size_t)r * hsp;
                float lb = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY, inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
                for (int i = 0; i < d->hs; i++) orow[i] *= inv;
                size_t li = ((size_t)b * d->NH + h) * d->Tq + qt0 + r, oo = av_off(&out, b, qt0 + r, h, d->hs);
                if (merge) { // log-sum-exp rule against what earlier blocks left
                    float la = lse[li];
                    if (lb == -INFINITY) continue;
                    if (la != -INFINITY) {
                        float mx = la > lb ? la : lb, lnew = mx + logf(expf(la - mx) + expf(lb - mx));
                        float wa = expf(la - lnew), wb = expf(lb - lnew);
                        row_load(out.dt, out.p, oo, d->hs, row);
                        for (int i = 0; i < d->hs; i++) orow[i] = row[i] * wa + orow[i] * wb;
                        lb = lnew;
                    }
                }
                lse[li] = lb;
                row_store(out.dt, out.p, oo, d->hs, orow);
            }
        }
}

// RoPE cos|sin rows of the block's queries and visible keys (in the RoPE scratch slot); NULL rope: none
static void att_rope_tables(AttDims *d, const RopeConfig *rope) {
    if (!rope) return;
    size_t nq = (size_t)d->Tq * d->hs, nk = (size_t)d->kvis * d->hs;
    float *tab = scratch(SCR_ROPE, sizeof(float) * (nq + nk + 1));
    rope_table(rope, d->hs, NULL, d->q0, d->Tq, tab);
    rope_table(rope, d->hs, NULL, d->k0, d->kvis, tab + nq);
    d->rq = tab;
    d->rk = tab + nq;
}

static void attn_fwd(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int Tq,
                     int q0, int Tk, int k0, const RopeConfig *rope, int merge) {
    if (B <= 0 || NH <= 0 || hs <= 0 || Tq <= 0) return;
    if (NKV <= 0 || NH % NKV) die("attention: %d query heads do not share %d key/value heads evenly", NH, NKV);
    if (rope && hs % 2) die("attention: RoPE needs an even head size (got %d)", hs);
    AttDims d = att_dims(B, NH, NKV, hs, Tq, q0, Tk, k0);
    att_rope_tables(&d, rope);
    size_t work = 2 * (size_t)d.hsp * d.Tkp + 2 * (size_t)ATT_BQ * d.hsp + ATT_BQ * ATT_BK + (size_t)d.hsp;
    float *all = thread_slices(SCR_WORK, work);
#pragma omp parallel
    {
        float *w = my_slice(all, work);
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NKV; bh++) att_fwd_head(&d, bh / NKV, bh % NKV, out, lse, q, k, v, merge, w);
    }
}

// g[0..n) of (b, h) into the view: overwritten, or added to what is there (accumulate); rows at or past
// valid hold no gradient (keys no query of the block sees): zero, or left alone when accumulating.
// unrot: RoPE rows to take the gradient back through (the transposed rotation), or NULL.
static void att_store_grad(AttnView *ov, int b, int h, const AttDims *d, const float *src, int n, int valid,
                           int accumulate, const float *unrot, float *row, float *row2) {
    for (int t = 0; t < n; t++) {
        size_t oo = av_off(ov, b, t, h, d->hs);
        const float *g = t < valid ? src + (size_t)t * d->hsp : NULL;
        if (!g) {
            if (accumulate) continue;
            memset(row2, 0, sizeof(float) * (size_t)d->hs);
            g = row2;
        } else if (unrot) {
            memcpy(row2, g, sizeof(float) * (size_t)d->hs);
            rope_row_t(row2, d->hs, unrot + (size_t)t * d->hs);
            g = row2;
        }
        if (accumulate) {
            row_load(ov->dt, ov->p, oo, d->hs, row);
            for (int i = 0; i < d->hs; i++) row[i] += g[i];
            g = row;
        }
        row_store(ov->dt, ov->p, oo, d->hs, g);
    }
}

// One task: key/value head hk of batch row b; its group's query heads in head order, each adding into
// dK and dV, which are written once at the end (a fixed order of addition for every thread count).
static void att_bwd_head(const AttDims *d, int b, int hk, AttnView dq, AttnView dk, AttnView dv, int accumulate,
                         AttnView dout, AttnView out, const float *lse, AttnView q, AttnView k, AttnView v, float *work) {
    int hsp = d->hsp, Tqp = d->Tqp, Tkp = d->Tkp, group = d->NH / d->NKV;
    size_t qn = (size_t)Tqp * hsp, kn = (size_t)Tkp * hsp;
    float *qs = work, *dO = qs + qn, *dQ = dO + qn, *K = dQ + qn, *Kt = K + kn, *Vt = Kt + kn, *dK = Vt + kn, *dV = dK + kn;
    float *D = dV + kn, *L = D + Tqp, *P = L + Tqp, *dP = P + ATT_BQ * ATT_BK;
    float *row = dP + ATT_BQ * ATT_BK, *row2 = row + hsp;
    att_load_rows(&k, b, hk, d, d->kvis, Tkp, 1.0f, d->rk, K);
    att_load_cols(&k, b, hk, d, d->kvis, d->rk, Kt, row);
    att_load_cols(&v, b, hk, d, d->kvis, NULL, Vt, row);
    memset(dK, 0, sizeof(float) * 2 * kn);
    for (int h = hk * group; h < (hk + 1) * group; h++) {
        att_load_rows(&q, b, h, d, d->Tq, Tqp, d->scale, d->rq, qs);
        att_load_rows(&dout, b, h, d, d->Tq, Tqp, 1.0f, NULL, dO);
        for (int t = 0; t < Tqp; t++) {
            if (t < d->Tq) {
                row_load(out.dt, out.p, av_off(&out, b, t, h, d->hs), d->hs, row);
                D[t] = vdot(dO + (size_t)t * hsp, row, d->hs);
                L[t] = lse[((size_t)b * d->NH + h) * d->Tq + t];
            } else {
                D[t] = 0.0f;
                L[t] = -INFINITY;
            }
        }
        memset(dQ, 0, sizeof(float) * qn);
        for (int kt0 = 0; kt0 < d->kvis; kt0 += ATT_BK) {
            for (int qt0 = 0; qt0 < d->Tq; qt0 += ATT_BQ) {
                int nq = d->Tq - qt0 < ATT_BQ ? d->Tq - qt0 : ATT_BQ;
                if (d->k0 + kt0 > d->q0 + qt0 + nq - 1) continue; // above the diagonal
                const float *qi = qs + (size_t)qt0 * hsp, *doi = dO + (size_t)qt0 * hsp;
                att_abt(qi, Kt + kt0, (size_t)Tkp, hsp, P);
                for (int r = 0; r < ATT_BQ; r++) {
                    float *pr = P + r * ATT_BK, lr = L[qt0 + r];
                    int lim = r < nq && lr != -INFINITY ? att_visible(d, qt0, r, kt0) : 0;
                    if (lim <= 0) {
                        memset(pr, 0, sizeof(float) * ATT_BK);
                        continue;
                    }
                    vexp_sub_sum(pr, ATT_BK, lr);
                    for (int c = lim; c < ATT_BK; c++) pr[c] = 0.0f;
                }
                att_ab(dV + (size_t)kt0 * hsp, P, 1, ATT_BK, ATT_BQ, doi, hsp, ATT_BK); // dV += Pᵀ·dO
                att_abt(doi, Vt + kt0, (size_t)Tkp, hsp, dP);                          // dP = dO·Vᵀ
                for (int r = 0; r < ATT_BQ; r++) {
                    float dr = D[qt0 + r];
                    for (int c = 0; c < ATT_BK; c++) dP[r * ATT_BK + c] = P[r * ATT_BK + c] * (dP[r * ATT_BK + c] - dr);
                }
                att_ab(dQ + (size_t)qt0 * hsp, dP, ATT_BK, 1, ATT_BK, K + (size_t)kt0 * hsp, hsp, ATT_BQ); // dQ += dS·K
                att_ab(dK + (size_t)kt0 * hsp, dP, 1, ATT_BK, ATT_BQ, qi, hsp, ATT_BK); // dK += dSᵀ·(q/√hs)
            }
        }
        // dQ carries the 1/√hs of the scores; dK got it from the scaled queries
        for (int t = 0; t < d->Tq; t++) {
            float *g = dQ + (size_t)t * hsp;
            for (int i = 0; i < d->hs; i++) g[i] *= d->scale;
        }
        att_store_grad(&dq, b, h, d, dQ, d->Tq, d->Tq, accumulate, d->rq, row, row2);
    }
    att_store_grad(&dk, b, hk, d, dK, d->Tk, d->kvis, accumulate, d->rk, row, row2);
    att_store_grad(&dv, b, hk, d, dV, d->Tk, d->kvis, accumulate, NULL, row, row2);
}

static void attn_bwd(AttnView dq, AttnView dk, AttnView dv, int accumulate, AttnView dout, AttnView out, const float *lse,
                     AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int Tq, int q0, int Tk, int k0,
                     const RopeConfig *rope) {
    if (B <= 0 || NH <= 0 || hs <= 0 || (Tq <= 0 && Tk <= 0)) return;
    if (NKV <= 0 || NH % NKV) die("attention: %d query heads do not share %d key/value heads evenly", NH, NKV);
    if (rope && hs % 2) die("attention: RoPE needs an even head size (got %d)", hs);
    AttDims d = att_dims(B, NH, NKV, hs, Tq, q0, Tk, k0);
    att_rope_tables(&d, rope);
    size_t work = 3 * (size_t)d.Tqp * d.hsp + 5 * (size_t)d.Tkp * d.hsp + 2 * (size_t)d.Tqp + 2 * ATT_BQ * ATT_BK +
                  2 * (size_t)d.hsp;
    float *all = thread_slices(SCR_WORK, work);
#pragma omp parallel
    {
        float *w = my_slice(all, work);
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NKV; bh++)
            att_bwd_head(&d, bh / NKV, bh % NKV, dq, dk, dv, accumulate, dout, out, lse, q, k, v, w);
    }
}

static void cpu_attention_block_fwd(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int hs,
                                    int Tq, int q0, int Tk, int k0, int merge) {
    attn_fwd(out, lse, q, k, v, B, NH, NH, hs, Tq, q0, Tk, k0, NULL, merge);
}

static void cpu_attention_block_bwd(AttnView dq, AttnView dk, AttnView dv, AttnView dout, AttnView out, const float *lse,
                                    AttnView q, AttnView k, AttnView v, int B, int NH, int hs, int Tq, int q0, int Tk,
                                    int k0) {
    attn_bwd(dq, dk, dv, 1, dout, out, lse, q, k, v, B, NH, NH, hs, Tq, q0, Tk, k0, NULL);
}

static void cpu_attention_gqa_block_fwd(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH,
                                        int NKV, int hs, int Tq, int q0, int Tk, int k0, const RopeConfig *rope, int merge) {
    attn_fwd(out, lse, q, k, v, B, NH, NKV, hs, Tq, q0, Tk, k0, rope, merge);
}

static void cpu_attention_gqa_block_bwd(AttnView dq, AttnView dk, AttnView dv, AttnView dout, AttnView out,
                                        const float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int NKV,
                                        int hs, int Tq, int q0, int Tk, int k0, const RopeConfig *rope) {
    attn_bwd(dq, dk, dv, 1, dout, out, lse, q, k, v, B, NH, NKV, hs, Tq, q0, Tk, k0, rope);
}

static void cpu_attention_fwd(DType dt, void *out, float *lse, const void *qkv, int B, int T, int C, int NH) {
    attn_fwd(btc_view(dt, out, T, C), lse, qkv_view(dt, qkv, 0, T, C), qkv_view(dt, qkv, 1, T, C),
             qkv_view(dt, qkv, 2, T, C), B, NH, NH, C / NH, T, 0, T, 0, NULL, 0);
}

static void cpu_attention_bwd(DType dt, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int B, int T, int C, int NH) {
    attn_bwd(qkv_view(dt, dqkv, 0, T, C), qkv_view(dt, dqkv, 1, T, C), qkv_view(dt, dqkv, 2, T, C), 0,
             btc_view(dt, dout, T, C), btc_view(dt, out, T, C), lse, qkv_view(dt, qkv, 0, T, C),
             qkv_view(dt, qkv, 1, T, C), qkv_view(dt, qkv, 2, T, C), B, NH, NH, C / NH, T, 0, T, 0, NULL);
}

static void cpu_attention_gqa_fwd(DType dt, void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV, int hs,
                                  const RopeConfig *rope) {
    attn_fwd(btc_view(dt, out, T, NH * hs), lse, gqa_view(dt, qkv, 0, T, NH, NKV, hs), gqa_view(dt, qkv, 1, T, NH, NKV, hs),
             gqa_view(dt, qkv, 2, T, NH, NKV, hs), B, NH, NKV, hs, T, 0, T, 0, rope, 0);
}

static void cpu_attention_gqa_bwd(DType dt, void *dqkv, const void *dout, const void *qkv, const void *out,
                                  const float *lse, int B, int T, int NH, int NKV, int hs, const RopeConfig *rope) {
    attn_bwd(gqa_view(dt, dqkv, 0, T, NH, NKV, hs), gqa_view(dt, dqkv, 1, T, NH, NKV, hs),
             gqa_view(dt, dqkv, 2, T, NH, NKV, hs), 0, btc_view(dt, dout, T, NH * hs), btc_view(dt, out, T, NH * hs), lse,
             gqa_view(dt, qkv, 0, T, NH, NKV, hs), gqa_view(dt, qkv, 1, T, NH, NKV, hs),
             gqa_view(dt, qkv, 2, T, NH, NKV, hs), B, NH, NKV, hs, T, 0, T, 0, rope);
}

// ---------------------------------------------------------------------------------------------
// The Llama family: RMSNorm, RoPE, SwiGLU (grouped-query attention is in the attention section)

// y = x·rstd·w over one row
static void rms_row(const float *x, const float *w, float *y, int C, float eps, float *rstd) {
    float s = 1.0f / sqrtf(vdot(x, x, C) / C + eps);
    for (int c = 0; c < C; c++) y[c] = x[c] * s * w[c];
    *rstd = s;
}

static void rmsnorm_rows(DType dt, void *res, void *out, float *rstd, const void *a, const void *b, const void *weight,
                         int N, int C, float eps) {
    float *w = xmalloc(sizeof(float) * (size_t)C);
    row_load(dt, weight, 0, C, w);
#pragma omp parallel
    {
        float *x = xmalloc(sizeof(float) * 3 * (size_t)C), *y = x + C, *z = y + C;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * C;
            row_load(dt, a, o, C, x);
            if (b) { // the residual add, stored as the stream's next value
                row_load(dt, b, o, C, z);
                for (int c = 0; c < C; c++) x[c] += z[c];
                row_store(dt, res, o, C, x);
                if (dt == DT_BF16) row_load(dt, res, o, C, x); // normalise what is stored
            }
            rms_row(x, w, y, C, eps, &rstd[n]);
            row_store(dt, out, o, C, y);
        }
        free(x);
    }
    free(w);
}

static void cpu_rmsnorm_fwd(DType dt, void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
    rmsnorm_rows(dt, NULL, out, rstd, inp, NULL, weight, N, C, eps);
}

static void cpu_residual_rmsnorm_fwd(DType dt, void *res, void *out, float *rstd, const void *a, const void *b,
                                     const void *weight, int N, int C, float eps) {
    rmsnorm_rows(dt, res, out, rstd, a, b, weight, N, C, eps);
}

// As layernorm_bwd: chunks of LN_ROWS rows keep partial weight gradients, added in chunk order.
static void cpu_rmsnorm_bwd(DType dt, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                            const float *rstd, int N, int C) {
    int nchunks = (N + LN_ROWS - 1) / LN_ROWS;
    float *partial = scratch(SCR_WORK, sizeof(float) * (size_t)C * (nchunks > 0 ? nchunks : 1));
    // either half alone (the split backward): dinp NULL skips the input gradient and weight is not read,
    // dweight NULL skips the weight gradient; each half's bits are the same either way
    float *w = xmalloc(sizeof(float) * (size_t)C);
    if (dinp) row_load(dt, weight, 0, C, w);
#pragma omp parallel
    {
        float *x = xmalloc(sizeof(float) * 4 * (size_t)C), *dy = x + C, *dn = dy + C, *di = dn + C;
#pragma omp for schedule(static)
        for (int ch = 0; ch < nchunks; ch++) {
            float *pw = partial + (size_t)ch * C;
            memset(pw, 0, sizeof(float) * (size_t)C);
            for (int n = ch * LN_ROWS; n < N && n < (ch + 1) * LN_ROWS; n++) {
                size_t o = (size_t)n * C;
                row_load(dt, inp, o, C, x);
                row_load(dt, dout, o, C, dy);
                float s = rstd[n];
                for (int c = 0; c < C; c++) {
                    x[c] *= s; // x̂
                    pw[c] += dy[c] * x[c];
                }
                if (!dinp) continue;
                row_load(dt, dinp, o, C, di);
                for (int c = 0; c < C; c++) dn[c] = w[c] * dy[c];
                float ddot = vdot(dn, x, C) / C;
                for (int c = 0; c < C; c++) di[c] += (dn[c] - x[c] * ddot) * s;
                row_store(dt, dinp, o, C, di);
            }
        }
        free(x);
#pragma omp for schedule(static)
        for (int c = 0; c < (dweight ? C : 0); c++) {
            float sw = 0.0f;
            for (int ch = 0; ch < nchunks; ch++) sw += partial[(size_t)ch * C + c];
            dweight[c] += sw;
        }
    }
    free(w);
}

void rope_inv_freq(const RopeConfig *r, int hs, double *inv_freq) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < hs / 2; i++) {
        double f = pow(r->theta, -2.0 * i / hs);
        if (r->factor > 0) { // Llama 3.1: long wavelengths slowed by factor, short kept, a smooth ramp between
            double wavelen = 2 * pi / f, old = r->original_max_pos;
            double low_wavelen = old / r->low_freq_factor, high_wavelen = old / r->high_freq_factor;
            if (wavelen > low_wavelen) f /= r->factor;
            else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                f = (1 - smooth) * f / r->factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

// tab[t][0..hs/2) = cos, tab[t][hs/2..hs) = sin of the angles of position pos[t] (or p0 + t)
static void rope_table(const RopeConfig *r, int hs, const int32_t *pos, int p0, int n, float *tab) {
    int half = hs / 2;
    double *inv = xmalloc(sizeof(double) * (size_t)(half > 0 ? half : 1));
    rope_inv_freq(r, hs, inv);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        double p = pos ? pos[t] : (double)p0 + t;
        for (int i = 0; i < half; i++) {
            double a = p * inv[i];
            tab[(size_t)t * hs + i] = (float)cos(a);
            tab[(size_t)t * hs + half + i] = (float)sin(a);
        }
    }
    free(inv);
}

static void rope_apply(AttnView x, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope,
                       int transposed) {
    if (B <= 0 || T <= 0 || nheads <= 0) return;
    if (hs <= 0 || hs % 2) die("rope: the head size must be even (got %d)", hs);
    float *tab = scratch(SCR_ROPE, sizeof(float) * (size_t)T * hs);
    rope_table(rope, hs, pos, pos0, T, tab);
#pragma omp parallel
    {
        float *r = xmalloc(sizeof(float) * (size_t)hs);
#pragma omp for schedule(static)
        for (long bt = 0; bt < (long)B * T; bt++) {
            int b = (int)(bt / T), t = (int)(bt % T);
            for (int h = 0; h < nheads; h++) {
                size_t o = av_off(&x, b, t, h, hs);
                row_load(x.dt, x.p, o, hs, r);
                if (transposed) rope_row_t(r, hs, tab + (size_t)t * hs);
                else rope_row(r, hs, tab + (size_t)t * hs);
                row_store(x.dt, x.p, o, hs, r);
            }
        }
        free(r);
    }
}

static void cpu_rope_fwd(AttnView x, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope) {
    rope_apply(x, B, T, nheads, hs, pos, pos0, rope, 0);
}
static void cpu_rope_bwd(AttnView dx, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope) {
    rope_apply(dx, B, T, nheads, hs, pos, pos0, rope, 1);
}

// sigmoid for VW lanes through vexp (exp(-x) clamps for x below -88: sigmoid then rounds to 0)
static inline vf vsigmoid(vf x) { return 1.0f / (1.0f + vexp(-x)); }

// rows of gate|up in fp32: g[0..F), u[0..F); y[f] = silu(g)·u (fwd) or g := dgate, u := dup from dy (bwd)
static void swiglu_row(float *g, float *u, const float *dy, float *y, int F) {
    int f = 0;
    for (; f < F; f += VW) {
        vf gv, uv, dv = vsplat(0.0f);
        int n = F - f < VW ? F - f : VW;
        if (n == VW) {
            gv = vload(g + f), uv = vload(u + f);
            if (dy) dv = vload(dy + f);
        } else { // the tail through padded lanes
            float tg[VW] = { 0 }, tu[VW] = { 0 }, td[VW] = { 0 };
            memcpy(tg, g + f, sizeof(float) * (size_t)n);
            memcpy(tu, u + f, sizeof(float) * (size_t)n);
            if (dy) memcpy(td, dy + f, sizeof(float) * (size_t)n);
            gv = vload(tg), uv = vload(tu), dv = vload(td);
        }
        vf s = vsigmoid(gv), silu = gv * s;
        vf r0, r1;
        if (!dy) {
            r0 = silu * uv;
            r1 = r0;
        } else {
            r0 = dv * uv * s * (1.0f + gv * (1.0f - s)); // dgate
            r1 = dv * silu;                              // dup
        }
        for (int j = 0; j < n; j++) {
            if (!dy) y[f + j] = r0[j];
            else g[f + j] = r0[j], u[f + j] = r1[j];
        }
    }
}

static void cpu_swiglu_fwd(DType dt, void *out, const void *gateup, int N, int F) {
#pragma omp parallel
    {
        float *g = xmalloc(sizeof(float) * 3 * (size_t)F), *u = g + F, *y = u + F;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            row_load(dt, gateup, (size_t)n * 2 * F, F, g);
            row_load(dt, gateup, (size_t)n * 2 * F + F, F, u);
            swiglu_row(g, u, NULL, y, F);
            row_store(dt, out, (size_t)n * F, F, y);
        }
        free(g);
    }
}

static void cpu_swiglu_bwd(DType dt, void *dgateup, const void *dout, const void *gateup, int N, int F) {
#pragma omp parallel
    {
        float *g = xmalloc(sizeof(float) * 3 * (size_t)F), *u = g + F, *dy = u + F;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            row_load(dt, gateup, (size_t)n * 2 * F, F, g);
            row_load(dt, gateup, (size_t)n * 2 * F + F, F, u);
            row_load(dt, dout, (size_t)n * F, F, dy);
            swiglu_row(g, u, dy, NULL, F);
            row_store(dt, dgateup, (size_t)n * 2 * F, 2 * F, g); // g and u are adjacent: one row of 2F
        }
        free(g);
    }
}

// ---------------------------------------------------------------------------------------------
// residual

static void cpu_residual_fwd(DType dt, void *out, const void *a, const void *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dt, out, i, ld(dt, a, i) + ld(dt, b, i));
}

static void cpu_residual_bwd(DType dt, void *dst, const void *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dt, dst, i, ld(dt, dst, i) + ld(dt, src, i));
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy over the real vocabulary (columns < vreal). A row is read into fp32 once;
// the statistics and the gradient are computed while it is in cache.

// rowmax and rowsum of x[0..vreal), exponentials left in e (which may be x)
static void ce_row_stats(const float *x, float *e, int vreal, float *rowmax, float *rowsum) {
    float m = vreal > 0 ? vmaxof(x, vreal) : -INFINITY;
    if (e != x) memcpy(e, x, sizeof(float) * (size_t)(vreal > 0 ? vreal : 0));
    *rowmax = m;
    *rowsum = vreal > 0 ? vexp_sub_sum(e, vreal, m) : 0.0f;
}

// e holds exp(x - gmax) over the real columns: dlogits = (e/gsum - onehot)·dloss, padding 0
static void ce_row_grad(DType dt, void *dlogits, size_t o, float *e, int tj, float gsum, float dloss, int vreal, int Vloc) {
    float inv = 1.0f / gsum;
    int nr = vreal > 0 ? vreal : 0;
    for (int j = 0; j < nr; j++) e[j] = (e[j] * inv - (j == tj ? 1.0f : 0.0f)) * dloss;
    for (int j = nr; j < Vloc; j++) e[j] = 0.0f;
    row_store(dt, dlogits, o, Vloc, e);
}

static void cpu_crossentropy_stats(DType dt, float *rowmax, float *rowsum, float *target, const void *logits,
                                   const int32_t *targets, int N, int vstart, int vreal, int Vloc) {
    size_t work = 2 * ((size_t)Vloc + VW);
    float *all = thread_slices(SCR_WORK, work);
#pragma omp parallel
    {
        float *x = my_slice(all, work), *e = x + Vloc + VW;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * Vloc;
            int nr = vreal > 0 ? vreal : 0;
            row_load(dt, logits, o, nr, x);
            ce_row_stats(x, e, vreal, &rowmax[n], &rowsum[n]);
            int tj = targets[n] - vstart;
            target[n] = (tj >= 0 && tj < vreal) ? x[tj] : 0.0f;
        }
    }
}

static void cpu_crossentropy_bwd(DType dt, void *dlogits, const void *logits, const int32_t *targets, const float *gmax,
                                 const float *gsum, float dloss, int N, int vstart, int vreal, int Vloc) {
    float *all = thread_slices(SCR_WORK, (size_t)Vloc + VW);
#pragma omp parallel
    {
        float *e = my_slice(all, (size_t)Vloc + VW);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * Vloc;
            int nr = vreal > 0 ? vreal : 0;
            row_load(dt, logits, o, nr, e);
            if (nr) vexp_sub_sum(e, nr, gmax[n]);
            ce_row_grad(dt, dlogits, o, e, targets[n] - vstart, gsum[n], dloss, vreal, Vloc);
        }
    }
}

static void cpu_crossentropy_fused(DType dt, void *dlogits, float *rowmax, float *rowsum, float *target,
                                   const void *logits, const int32_t *targets, float dloss, int N, int vreal, int Vloc) {
    float *all = thread_slices(SCR_WORK, (size_t)Vloc + VW);
#pragma omp parallel
    {
        float *e = my_slice(all, (size_t)Vloc + VW);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * Vloc;
            int nr = vreal > 0 ? vreal : 0, tj = targets[n];
            row_load(dt, logits, o, nr, e);
            target[n] = (tj >= 0 && tj < nr) ? e[tj] : 0.0f;
            ce_row_stats(e, e, vreal, &rowmax[n], &rowsum[n]);
            ce_row_grad(dt, dlogits, o, e, tj, rowsum[n], dloss, vreal, Vloc);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// optimizer, norms, casts

// One parallel loop over fixed chunks of every segment; each element's update is independent.
#define ADAMW_CHUNK 16384
static void cpu_adamw(DType dt, const AdamWSegment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                      float bc1, float bc2, float grad_scale) {
    size_t nitems = 0;
    for (int s = 0; s < nsegs; s++) nitems += (segs[s].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
    if (!nitems) return;
    int *seg_of = xmalloc(sizeof(int) * nitems);
    size_t *start = xmalloc(sizeof(size_t) * nitems), it = 0;
    for (int s = 0; s < nsegs; s++)
        for (size_t i = 0; i < segs[s].n; i += ADAMW_CHUNK) seg_of[it] = s, start[it++] = i;
#pragma omp parallel for schedule(static)
    for (size_t w = 0; w < nitems; w++) {
        const AdamWSegment *sg = &segs[seg_of[w]];
        size_t i0 = start[w], n = sg->n - i0 < ADAMW_CHUNK ? sg->n - i0 : ADAMW_CHUNK;
        float *restrict master = sg->master + i0, *restrict m = sg->m + i0, *restrict v = sg->v + i0;
        const float *restrict grad = sg->grad + i0;
        float decay = 1.0f - lr * sg->weight_decay;
        for (size_t i = 0; i < n; i++) {
            float g = grad[i] * grad_scale;
            float mi = beta1 * m[i] + (1.0f - beta1) * g;
            float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            master[i] = master[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        }
        if (sg->working) row_store(dt, sg->working, i0, (int)n, master);
    }
    free(seg_of);
    free(start);
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

static void cpu_sumsq_acc(double *acc, const float *x, size_t n) { *acc += cpu_sumsq(x, n); }

// ---------------------------------------------------------------------------------------------
// streams and events: every op has finished when it returns, so these keep the bookkeeping and check
// the protocol (kernels.h), and the CUDA backend runs the same checks before its own calls

StreamId backend_stream_check(int s, const char *op) {
    if (s < 0 || s >= NUM_STREAMS) die("backend %s: stream %d is not a stream (0 compute, 1 communication)", op, s);
    return (StreamId)s;
}

void backend_event_check(const BackendEvent *e, const char *op) {
    if (!e) die("backend %s: no event", op);
    if (e->records == 0) die("backend %s: the event was never recorded (waiting for it would not wait on a GPU)", op);
}

void backend_event_note(BackendEvent *e, StreamId s) {
    if (!e) die("backend event_record: no event");
    e->stream = (int)s;
    e->records++;
}

static StreamId g_cpu_stream = STREAM_COMPUTE; // what set_stream last chose (the CPU runs everything in place)

static StreamId cpu_set_stream(StreamId s) {
    StreamId prev = g_cpu_stream;
    g_cpu_stream = backend_stream_check((int)s, "set_stream");
    return prev;
}
static BackendEvent *cpu_event_create(void) {
    BackendEvent *e = xcalloc(1, sizeof *e);
    e->stream = -1;
    return e;
}
static void cpu_event_destroy(BackendEvent *e) { free(e); }
static void cpu_event_record(BackendEvent *e, StreamId s) {
    backend_event_note(e, backend_stream_check((int)s, "event_record"));
}
static void cpu_stream_wait(StreamId s, BackendEvent *e) {
    backend_stream_check((int)s, "stream_wait");
    backend_event_check(e, "stream_wait");
}
static void cpu_event_sync(BackendEvent *e) { backend_event_check(e, "event_sync"); }
static int cpu_event_done(BackendEvent *e) {
    backend_event_check(e, "event_done");
    return 1;
}

static void cpu_cast(void *dst, DType dst_dt, const void *src, DType src_dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dst_dt, dst, i, ld(src_dt, src, i));
}

static void cpu_cast_rows(void *dst, DType dst_dt, size_t dst_stride, const void *src, DType src_dt, size_t src_stride,
                          size_t rows, size_t n) {
    size_t ds = dtype_size(dst_dt), ss = dtype_size(src_dt);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        char *d = (char *)dst + r * dst_stride * ds;
        const char *s = (const char *)src + r * src_stride * ss;
        if (dst_dt == src_dt) memcpy(d, s, n * ds);
        else
            for (size_t i = 0; i < n; i++) st(dst_dt, d, i, ld(src_dt, s, i));
    }
}

static const Backend CPU_BACKEND = {
    .name = "cpu",
    .mem_kind = MEMKIND_HOST,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .copy = cpu_memcpy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .set_threads = cpu_set_threads,
    .scratch_bytes = cpu_scratch_bytes,
    .encoder_fwd = cpu_encoder_fwd,
    .encoder_bwd = cpu_encoder_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .residual_layernorm_fwd = cpu_residual_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .attention_block_fwd = cpu_attention_block_fwd,
    .attention_block_bwd = cpu_attention_block_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .residual_rmsnorm_fwd = cpu_residual_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .attention_gqa_block_fwd = cpu_attention_gqa_block_fwd,
    .attention_gqa_block_bwd = cpu_attention_gqa_block_bwd,
    .attention_gqa_fwd = cpu_attention_gqa_fwd,
    .attention_gqa_bwd = cpu_attention_gqa_bwd,
    .residual_fwd = cpu_residual_fwd,
    .residual_bwd = cpu_residual_bwd,
    .crossentropy_stats = cpu_crossentropy_stats,
    .crossentropy_bwd = cpu_crossentropy_bwd,
    .crossentropy_fused = cpu_crossentropy_fused,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .sumsq_acc = cpu_sumsq_acc,
    .cast = cpu_cast,
    .cast_rows = cpu_cast_rows,
    .set_stream = cpu_set_stream,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .event_done = cpu_event_done,
};

const Backend *backend_cpu(void) { return &CPU_BACKEND; }

#ifndef LLM4D_CUDA
// CPU-only build: kernels.cu is not linked in.
int cuda_device_count(void) { return 0; }
void cuda_unavailable_reason(char *buf, size_t cap) { snprintf(buf, cap, "this binary was built without CUDA"); }
void cuda_use_device(int ordinal) { (void)ordinal; }
const Backend *backend_cuda(void) { return NULL; }
#endif

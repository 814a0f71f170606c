// kernels.cu: the CUDA backend. Every op of kernels.h, hand-written (no cuBLAS/cuDNN), with the
// semantics of kernels_cpu.c: storage dtype fp32 or bf16, arithmetic fp32, parameter gradients fp32.
//
// Determinism: no atomics anywhere. Every output element is produced by exactly one thread, which sums
// its terms in a fixed order, and reductions across threads use a fixed tree whose shape depends only on
// compile-time constants. The GEMM sums k in ascending order with one fma per term in every tile
// configuration, so the result does not even depend on which tile size was chosen.
//
// Error handling: every CUDA API call and every kernel launch is checked; a failure prints
// "error: CUDA <call>: <message>" through die() and exits with status 1.
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common.h"
#include "kernels.h"
}

// ---------------------------------------------------------------------------------------------
// error checking

#define CK(fn, args)                                                                                        \
    do {                                                                                                    \
        cudaError_t e_ = fn args;                                                                           \
        if (e_ != cudaSuccess) die("CUDA %s: %s", #fn, cudaGetErrorString(e_));                             \
    } while (0)

static void check_launch(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) die("CUDA launch %s: %s", kernel, cudaGetErrorString(e));
}

// ---------------------------------------------------------------------------------------------
// storage types. bf16 is its own type so that overloads cannot confuse it with an integer.

struct bf16s {
    uint16_t x;
};

__device__ __forceinline__ float tof(float v) { return v; }
__device__ __forceinline__ float tof(bf16s v) { return __uint_as_float((uint32_t)v.x << 16); }

template <typename T> __device__ __forceinline__ T fromf(float f);
template <> __device__ __forceinline__ float fromf<float>(float f) { return f; }
// Round to nearest, ties to even, exactly as f32_to_bf16 in kernels.h (NaN stays a quiet NaN).
template <> __device__ __forceinline__ bf16s fromf<bf16s>(float f) {
    uint32_t u = __float_as_uint(f);
    bf16s r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (uint16_t)((u >> 16) | 0x40u);
        return r;
    }
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    r.x = (uint16_t)((u + rounding) >> 16);
    return r;
}

static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// grid for a grid-stride elementwise loop over n items
static inline unsigned ew_blocks(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65536 * 8) b = 65536 * 8;
    if (b < 1) b = 1;
    return (unsigned)b;
}

// Butterfly reductions: every lane ends with the same value (a+b == b+a bitwise), in a fixed order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024). All threads get the result.
__device__ float block_sum(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // sh may still be in use by a previous reduction
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(r);
}
__device__ float block_max(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(r);
}

// ---------------------------------------------------------------------------------------------
// device state and scratch

static int g_num_sms = 132;
static int g_gemm_tile = 0; // 0: automatic; 64 or 128 forces a tile size (tests)

// Grow-only scratch buffers (all work runs on the default stream, so reuse is ordered).
static void *scratch(int slot, size_t bytes) {
    static void *ptr[4];
    static size_t cap[4];
    if (bytes == 0) bytes = 1;
    if (bytes > cap[slot]) {
        if (ptr[slot]) CK(cudaFree, (ptr[slot]));
        ptr[slot] = NULL;
        cap[slot] = 0;
        CK(cudaMalloc, (&ptr[slot], bytes));
        cap[slot] = bytes;
    }
    return ptr[slot];
}
enum { SCR_COLSUM = 0, SCR_SUMSQ = 1 };

// ---------------------------------------------------------------------------------------------
// memory

static void *cu_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); // clear the (non-sticky) error; the caller reports the failure
        return NULL;
    }
    CK(cudaMemset, (p, 0, bytes));
    return p;
}
static void cu_free(void *p) {
    if (p) CK(cudaFree, (p));
}
static void cu_to_device(void *dst, const void *src, size_t bytes) {
    if (bytes) CK(cudaMemcpy, (dst, src, bytes, cudaMemcpyHostToDevice));
}
static void cu_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) CK(cudaMemcpy, (dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CK(cudaMemcpy, (dst, src, bytes, cudaMemcpyDeviceToDevice));
}
static void cu_zero(void *dst, size_t bytes) {
    if (bytes) CK(cudaMemset, (dst, 0, bytes));
}
static void cu_sync(void) { CK(cudaDeviceSynchronize, ()); }
static void cu_set_threads(int n) { (void)n; }

// ---------------------------------------------------------------------------------------------
// GEMM: C[M,N] (=, or += when accumulate) Σ_k A(m,k)·B(k,n) (+ bias[n]), batched over blockIdx.z.
//
// A(m,k) is A[m*lda + k] when A_KC (k contiguous) else A[k*lda + m]; B(k,n) is B[n*ldb + k] when
// B_KC else B[k*ldb + n]. The loaders map consecutive threads to the contiguous dimension, so every
// global load is coalesced, and store the tile k-major into shared memory (converted to fp32). Each of
// the 256 threads owns a (BM/16)×(BN/16) register tile made of 4×4 blocks spaced 64 apart, read from
// shared memory as float4. Tiles are double-buffered in shared memory and the next tile is prefetched
// into registers while the current one is multiplied. Out-of-range rows, columns and k are zero-filled,
// so any M, N, K work.
//
// Batch index z = zo*batch_inner + zi offsets each operand by zo*s?0 + zi*s?1 elements (used by
// attention: batch = B*NH, inner = NH).
// Causal helpers for attention (all skip only terms or tiles that are exactly zero or never read):
//  skip_upper: skip output tiles entirely above the diagonal (n0 >= m0 + BM);
//  k_hi:       A(m,k) == 0 for k > m, so stop k at m0 + BM;
//  k_lo:       A(m,k) == 0 for k < m, so start k at m0.
// Skipped terms are exact zeros, and fma(0, b, acc) == acc, so the result is the same as without.

struct GemmArgs {
    int M, N, K;
    const void *A;
    long long lda, sA0, sA1;
    const void *B;
    long long ldb, sB0, sB1;
    void *C;
    long long ldc, sC0, sC1;
    const void *bias; // [N], same dtype as C; NULL for none
    int accumulate;
    int batch, batch_inner;
    int skip_upper, k_hi, k_lo;
};

#define GEMM_THREADS 256
#define GEMM_BK 16

template <int BM, int BN, typename TA, typename TB, typename TC, bool A_KC, bool B_KC>
__global__ void __launch_bounds__(GEMM_THREADS) gemm_kernel(const GemmArgs g) {
    constexpr int BK = GEMM_BK;
    constexpr int TM = BM / 16, TN = BN / 16;
    constexpr int AL = BM * BK / GEMM_THREADS, BL = BN * BK / GEMM_THREADS;
    static_assert(BM % 64 == 0 && BN % 64 == 0, "tile must be a multiple of 64");
    __shared__ __align__(16) float As[2][BK][BM + 4];
    __shared__ __align__(16) float Bs[2][BK][BN + 4];

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    if (g.skip_upper && n0 >= m0 + BM) return;
    const int M = g.M, N = g.N;
    const int zo = blockIdx.z / g.batch_inner, zi = blockIdx.z % g.batch_inner;
    const TA *A = (const TA *)g.A + zo * g.sA0 + zi * g.sA1;
    const TB *B = (const TB *)g.B + zo * g.sB0 + zi * g.sB1;
    TC *C = (TC *)g.C + zo * g.sC0 + zi * g.sC1;
    const long long lda = g.lda, ldb = g.ldb, ldc = g.ldc;

    int k_begin = g.k_lo ? m0 : 0;
    int k_end = g.k_hi ? min(g.K, m0 + BM) : g.K;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

    float ra[AL], rb[BL];
    auto load_global = [&](int k0) {
#pragma unroll
        for (int i = 0; i < AL; i++) {
            int idx = tid + i * GEMM_THREADS;
            int mm = A_KC ? idx / BK : idx % BM;
            int kk = A_KC ? idx % BK : idx / BM;
            int gm = m0 + mm, gk = k0 + kk;
            float v = 0.0f;
            if (gm < M && gk < k_end) v = tof(A_KC ? A[gm * lda + gk] : A[gk * lda + gm]);
            ra[i] = v;
        }
#pragma unroll
        for (int i = 0; i < BL; i++) {
            int idx = tid + i * GEMM_THREADS;
            int nn = B_KC ? idx / BK : idx % BN;
            int kk = B_KC ? idx % BK : idx / BN;
            int gn = n0 + nn, gk = k0 + kk;
            float v = 0.0f;
            if (gn < N && gk < k_end) v = tof(B_KC ? B[gn * ldb + gk] : B[gk * ldb + gn]);
            rb[i] = v;
        }
    };
    auto store_shared = [&](int buf) {
#pragma unroll
        for (int i = 0; i < AL; i++) {
            int idx = tid + i * GEMM_THREADS;
            int mm = A_KC ? idx / BK : idx % BM;
            int kk = A_KC ? idx % BK : idx / BM;
            As[buf][kk][mm] = ra[i];
        }
#pragma unroll
        for (int i = 0; i < BL; i++) {
            int idx = tid + i * GEMM_THREADS;
            int nn = B_KC ? idx / BK : idx % BN;
            int kk = B_KC ? idx % BK : idx / BN;
            Bs[buf][kk][nn] = rb[i];
        }
    };

    if (k_begin < k_end) {
        load_global(k_begin);
        store_shared(0);
        __syncthreads();
        int buf = 0;
        for (int k0 = k_begin; k0 < k_end; k0 += BK) {
            bool more = k0 + BK < k_end;
            if (more) load_global(k0 + BK);
#pragma unroll
            for (int k = 0; k < BK; k++) {
                float a[TM], b[TN];
#pragma unroll
                for (int s = 0; s < TM / 4; s++) {
                    float4 v = *reinterpret_cast<const float4 *>(&As[buf][k][s * 64 + ty * 4]);
                    a[s * 4 + 0] = v.x;
                    a[s * 4 + 1] = v.y;
                    a[s * 4 + 2] = v.z;
                    a[s * 4 + 3] = v.w;
                }
#pragma unroll
                for (int s = 0; s < TN / 4; s++) {
                    float4 v = *reinterpret_cast<const float4 *>(&Bs[buf][k][s * 64 + tx * 4]);
                    b[s * 4 + 0] = v.x;
                    b[s * 4 + 1] = v.y;
                    b[s * 4 + 2] = v.z;
                    b[s * 4 + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TM; i++)
#pragma unroll
                    for (int j = 0; j < TN; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            if (more) store_shared(buf ^ 1);
            __syncthreads();
            buf ^= 1;
        }
    }

    const TC *bias = (const TC *)g.bias;
#pragma unroll
    for (int i = 0; i < TM; i++) {
        int r = m0 + (i / 4) * 64 + ty * 4 + (i % 4);
        if (r >= M) continue;
        TC *crow = C + r * ldc;
#pragma unroll
        for (int j = 0; j < TN; j++) {
            int c = n0 + (j / 4) * 64 + tx * 4 + (j % 4);
            if (c >= N) continue;
            float v = acc[i][j];
            if (bias) v += tof(bias[c]);
            if (g.accumulate) v = tof(crow[c]) + v;
            crow[c] = fromf<TC>(v);
        }
    }
}

template <typename TA, typename TB, typename TC, bool A_KC, bool B_KC>
static void gemm(const GemmArgs &g, const char *name) {
    if (g.M <= 0 || g.N <= 0 || g.batch <= 0) return;
    int tile = g_gemm_tile;
    if (tile != 64 && tile != 128) {
        size_t tiles128 = (size_t)cdiv(g.M, 128) * cdiv(g.N, 128) * g.batch;
        tile = (g.M <= 64 || g.N <= 64 || tiles128 < (size_t)g_num_sms) ? 64 : 128;
    }
    if (g.batch > 65535 || cdiv(g.M, tile) > 65535u) die("CUDA %s: matrix too large (%d x %d x %d)", name, g.M, g.N, g.batch);
    dim3 grid(cdiv(g.N, tile), cdiv(g.M, tile), g.batch);
    if (tile == 128) gemm_kernel<128, 128, TA, TB, TC, A_KC, B_KC><<<grid, GEMM_THREADS>>>(g);
    else gemm_kernel<64, 64, TA, TB, TC, A_KC, B_KC><<<grid, GEMM_THREADS>>>(g);
    check_launch(name);
}

static GemmArgs gemm_args(int M, int N, int K, const void *A, long long lda, const void *B, long long ldb, void *C,
                          long long ldc) {
    GemmArgs g;
    memset(&g, 0, sizeof g);
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.lda = lda;
    g.B = B;
    g.ldb = ldb;
    g.C = C;
    g.ldc = ldc;
    g.batch = 1;
    g.batch_inner = 1;
    return g;
}

// ---------------------------------------------------------------------------------------------
// column sums over rows, deterministic: rows are cut into fixed chunks of COL_CHUNK; block (32, 8)
// sums one chunk for 32 columns (each thread rows ty, ty+8, ...; then the 8 partials in order), and a
// second kernel adds the chunk partials in chunk order into the fp32 destination.

#define COL_CHUNK 256

template <typename T>
__global__ void dbias_partial_kernel(float *partial, const T *x, int N, int C) {
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    int n0 = chunk * COL_CHUNK, n1 = min(N, n0 + COL_CHUNK);
    float s = 0.0f;
    if (c < C)
        for (int n = n0 + threadIdx.y; n < n1; n += 8) s += tof(x[(size_t)n * C + c]);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int i = 0; i < 8; i++) t += sh[i][threadIdx.x];
        partial[(size_t)chunk * C + c] = t;
    }
}

__global__ void colsum_finalize_kernel(float *dst, const float *partial, int nchunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++) s += partial[(size_t)k * C + c];
    dst[c] += s;
}

static void colsum_finalize(float *dst, const float *partial, int nchunks, int C) {
    colsum_finalize_kernel<<<cdiv(C, 256), 256>>>(dst, partial, nchunks, C);
    check_launch("colsum_finalize_kernel");
}

// ---------------------------------------------------------------------------------------------
// linear layer

template <typename T>
static void matmul_fwd_t(void *out, const void *inp, const void *weight, const void *bias, int N, int C, int OC) {
    GemmArgs g = gemm_args(N, OC, C, inp, C, weight, C, out, OC);
    g.bias = bias;
    gemm<T, T, T, true, true>(g, "matmul_fwd");
}

static void cu_matmul_fwd(DType dt, void *out, const void *inp, const void *weight, const void *bias, int N, int C,
                          int OC) {
    if (dt == DT_BF16) matmul_fwd_t<bf16s>(out, inp, weight, bias, N, C, OC);
    else matmul_fwd_t<float>(out, inp, weight, bias, N, C, OC);
}

template <typename T>
static void matmul_bwd_t(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                         const void *weight, int N, int C, int OC) {
    if (dinp) { // dinp[N,C] = dout[N,OC] · weight[OC,C]
        GemmArgs g = gemm_args(N, C, OC, dout, OC, weight, C, dinp, C);
        gemm<T, T, T, true, false>(g, "matmul_bwd_dinp");
    }
    { // dweight[OC,C] += dout[N,OC]ᵀ · inp[N,C]
        GemmArgs g = gemm_args(OC, C, N, dout, OC, inp, C, dweight, C);
        g.accumulate = 1;
        gemm<T, T, float, false, false>(g, "matmul_bwd_dweight");
    }
    if (dbias && N > 0 && OC > 0) {
        int nch = (int)cdiv(N, COL_CHUNK);
        float *partial = (float *)scratch(SCR_COLSUM, sizeof(float) * (size_t)nch * OC);
        dbias_partial_kernel<T><<<dim3(cdiv(OC, 32), nch), dim3(32, 8)>>>(partial, (const T *)dout, N, OC);
        check_launch("dbias_partial_kernel");
        colsum_finalize(dbias, partial, nch, OC);
    }
}

static void cu_matmul_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                          const void *weight, int N, int C, int OC) {
    if (dt == DT_BF16) matmul_bwd_t<bf16s>(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    else matmul_bwd_t<float>(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

// ---------------------------------------------------------------------------------------------
// encoder

// Token embeddings come from a slice of the vocabulary: wte holds rows vstart..vstart+vlen-1, and a token
// outside the slice contributes 0. wpe may be NULL (no position embedding).
template <typename T>
__global__ void encoder_fwd_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, int B, int T_, int C,
                                   int vstart, int vlen) {
    size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        long long row = (long long)tokens[bt] - vstart;
        float v = (row >= 0 && row < vlen) ? tof(wte[(size_t)row * C + c]) : 0.0f;
        if (wpe) v += tof(wpe[(size_t)t * C + c]);
        out[i] = fromf<T>(v);
    }
}

static void cu_encoder_fwd(DType dt, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B, int T,
                           int C, int vstart, int vlen) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    size_t n = (size_t)B * T * C;
    if (dt == DT_BF16)
        encoder_fwd_kernel<bf16s><<<ew_blocks(n, 256), 256>>>((bf16s *)out, tokens, (const bf16s *)wte,
                                                               (const bf16s *)wpe, B, T, C, vstart, vlen);
    else
        encoder_fwd_kernel<float><<<ew_blocks(n, 256), 256>>>((float *)out, tokens, (const float *)wte,
                                                               (const float *)wpe, B, T, C, vstart, vlen);
    check_launch("encoder_fwd_kernel");
}

// dwpe[t,c] += dout[b,t,c] for b in order: one thread per (t, c).
template <typename T>
__global__ void encoder_bwd_wpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
    size_t n = (size_t)T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += tof(dout[(size_t)b * n + i]);
        dwpe[i] = acc;
    }
}

// dwte[tok - vstart,c] += dout[bt,c] over bt in order, for the tokens of the slice [vstart, vstart+vlen).
// Thread (c, bucket) scans every token in order and handles the slice rows with row % ENC_BUCKETS ==
// bucket, so each (row, c) is still summed by one thread in bt order, as on the CPU, but the dependent
// read-modify-write chain per thread is ENC_BUCKETS times shorter.
#define ENC_BUCKETS 64
#define ENC_TOK_TILE 256

template <typename T>
__global__ void encoder_bwd_wte_kernel(float *dwte, const T *dout, const int32_t *tokens, int BT, int C, int vstart,
                                       int vlen) {
    __shared__ int32_t rows[ENC_TOK_TILE];
    int c = blockIdx.x * 32 + threadIdx.x;
    int bucket = blockIdx.y * blockDim.y + threadIdx.y;
    int lt = threadIdx.y * 32 + threadIdx.x, nthreads = blockDim.x * blockDim.y;
    for (int base = 0; base < BT; base += ENC_TOK_TILE) {
        int cnt = min(ENC_TOK_TILE, BT - base);
        __syncthreads();
        for (int i = lt; i < cnt; i += nthreads) {
            long long row = (long long)tokens[base + i] - vstart;
            rows[i] = (row >= 0 && row < vlen) ? (int32_t)row : -1; // -1: not in this slice
        }
        __syncthreads();
        if (c < C) {
            for (int i = 0; i < cnt; i++) {
                int r = rows[i];
                if (r < 0 || r % ENC_BUCKETS != bucket) continue;
                float *p = dwte + (size_t)r * C + c;
                *p = *p + tof(dout[(size_t)(base + i) * C + c]);
            }
        }
    }
}

static void cu_encoder_bwd(DType dt, float *dwte, float *dwpe, const void *dout, const int32_t *tokens, int B, int T,
                           int C, int vstart, int vlen) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    size_t ntc = (size_t)T * C;
    if (dwpe) {
        if (dt == DT_BF16)
            encoder_bwd_wpe_kernel<bf16s><<<ew_blocks(ntc, 256), 256>>>(dwpe, (const bf16s *)dout, B, T, C);
        else encoder_bwd_wpe_kernel<float><<<ew_blocks(ntc, 256), 256>>>(dwpe, (const float *)dout, B, T, C);
        check_launch("encoder_bwd_wpe_kernel");
    }
    if (dwte && vlen > 0) {
        dim3 gw(cdiv(C, 32), ENC_BUCKETS / 8), bw(32, 8);
        if (dt == DT_BF16)
            encoder_bwd_wte_kernel<bf16s><<<gw, bw>>>(dwte, (const bf16s *)dout, tokens, B * T, C, vstart, vlen);
        else encoder_bwd_wte_kernel<float><<<gw, bw>>>(dwte, (const float *)dout, tokens, B * T, C, vstart, vlen);
        check_launch("encoder_bwd_wte_kernel");
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm: one warp per row

template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *weight, const T *bias,
                                     int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += tof(x[c]);
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = tof(x[c]) - m;
        v += d * d;
    }
    float var = warp_sum(v) / C;
    float r = 1.0f / sqrtf(var + 1e-5f);
    for (int c = lane; c < C; c += 32) {
        float xn = (tof(x[c]) - m) * r;
        o[c] = fromf<T>(xn * tof(weight[c]) + tof(bias[c]));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

static void cu_layernorm_fwd(DType dt, void *out, float *mean, float *rstd, const void *inp, const void *weight,
                             const void *bias, int N, int C) {
    if (N <= 0) return;
    unsigned blocks = cdiv(N, 8);
    if (dt == DT_BF16)
        layernorm_fwd_kernel<bf16s><<<blocks, 256>>>((bf16s *)out, mean, rstd, (const bf16s *)inp,
                                                     (const bf16s *)weight, (const bf16s *)bias, N, C);
    else
        layernorm_fwd_kernel<float><<<blocks, 256>>>((float *)out, mean, rstd, (const float *)inp,
                                                     (const float *)weight, (const float *)bias, N, C);
    check_launch("layernorm_fwd_kernel");
}

template <typename T>
__global__ void layernorm_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight, const float *mean,
                                          const float *rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t o = (size_t)row * C;
    float mn = mean[row], rs = rstd[row];
    float dmean = 0.0f, dnorm_dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xn = (tof(inp[o + c]) - mn) * rs;
        float dn = tof(weight[c]) * tof(dout[o + c]);
        dmean += dn;
        dnorm_dot += dn * xn;
    }
    dmean = warp_sum(dmean) / C;
    dnorm_dot = warp_sum(dnorm_dot) / C;
    for (int c = lane; c < C; c += 32) {
        float xn = (tof(inp[o + c]) - mn) * rs;
        float dn = tof(weight[c]) * tof(dout[o + c]);
        float g = (dn - dmean - xn * dnorm_dot) * rs;
        dinp[o + c] = fromf<T>(tof(dinp[o + c]) + g);
    }
}

template <typename T>
__global__ void layernorm_bwd_wb_partial_kernel(float *pw, float *pb, const T *dout, const T *inp, const float *mean,
                                                const float *rstd, int N, int C) {
    __shared__ float shw[8][33], shb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    int n0 = chunk * COL_CHUNK, n1 = min(N, n0 + COL_CHUNK);
    float dw = 0.0f, db = 0.0f;
    if (c < C)
        for (int n = n0 + threadIdx.y; n < n1; n += 8) {
            size_t i = (size_t)n * C + c;
            float g = tof(dout[i]);
            dw += g * (tof(inp[i]) - mean[n]) * rstd[n];
            db += g;
        }
    shw[threadIdx.y][threadIdx.x] = dw;
    shb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int i = 0; i < 8; i++) {
            tw += shw[i][threadIdx.x];
            tb += shb[i][threadIdx.x];
        }
        pw[(size_t)chunk * C + c] = tw;
        pb[(size_t)chunk * C + c] = tb;
    }
}

template <typename T>
static void layernorm_bwd_t(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                            const void *weight, const float *mean, const float *rstd, int N, int C) {
    layernorm_bwd_dinp_kernel<T><<<cdiv(N, 8), 256>>>((T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight,
                                                      mean, rstd, N, C);
    check_launch("layernorm_bwd_dinp_kernel");
    int nch = (int)cdiv(N, COL_CHUNK);
    float *pw = (float *)scratch(SCR_COLSUM, sizeof(float) * 2 * (size_t)nch * C);
    float *pb = pw + (size_t)nch * C;
    layernorm_bwd_wb_partial_kernel<T><<<dim3(cdiv(C, 32), nch), dim3(32, 8)>>>(pw, pb, (const T *)dout,
                                                                                (const T *)inp, mean, rstd, N, C);
    check_launch("layernorm_bwd_wb_partial_kernel");
    colsum_finalize(dweight, pw, nch, C);
    colsum_finalize(dbias, pb, nch, C);
}

static void cu_layernorm_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                             const void *weight, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (dt == DT_BF16) layernorm_bwd_t<bf16s>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    else layernorm_bwd_t<float>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

// ---------------------------------------------------------------------------------------------
// attention: batched GEMMs over (batch, head) plus row-wise softmax kernels, one warp per row.

// att[row, 0..t] = softmax(scale * att[row, 0..t]); att[row, t+1..T-1] = 0; row = bh*T + t
__global__ void softmax_fwd_kernel(float *att, int rows, int T, float scale) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int t = row % T;
    float *a = att + (size_t)row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) {
        float s = a[j] * scale;
        a[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float e = expf(a[j] - mx);
        a[j] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j <= t; j += 32) a[j] *= inv;
    for (int j = t + 1 + lane; j < T; j += 32) a[j] = 0.0f;
}

// datt[row, t2] = att * (datt - Σ att·datt) * scale for t2 <= t, 0 above the diagonal
__global__ void softmax_bwd_kernel(float *datt, const float *att, int rows, int T, float scale) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int t = row % T;
    float *d = datt + (size_t)row * T;
    const float *a = att + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += a[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j <= t; j += 32) d[j] = a[j] * (d[j] - dot) * scale;
    for (int j = t + 1 + lane; j < T; j += 32) d[j] = 0.0f;
}

template <typename T>
static void attention_fwd_t(void *out, float *att, const void *qkv, int B, int T_, int C, int NH) {
    int hs = C / NH;
    long long C3 = 3LL * C, TT = (long long)T_ * T_;
    const T *q = (const T *)qkv, *k = q + C, *v = q + 2 * (size_t)C;
    { // att = q · kᵀ (lower triangle tiles only)
        GemmArgs g = gemm_args(T_, T_, hs, q, C3, k, C3, att, T_);
        g.batch = B * NH;
        g.batch_inner = NH;
        g.sA0 = g.sB0 = (long long)T_ * C3;
        g.sA1 = g.sB1 = hs;
        g.sC0 = NH * TT;
        g.sC1 = TT;
        g.skip_upper = 1;
        gemm<T, T, float, true, true>(g, "attention_fwd_qk");
    }
    int rows = B * NH * T_;
    softmax_fwd_kernel<<<cdiv(rows, 8), 256>>>(att, rows, T_, 1.0f / sqrtf((float)hs));
    check_launch("softmax_fwd_kernel");
    { // out = att · v
        GemmArgs g = gemm_args(T_, hs, T_, att, T_, v, C3, out, C);
        g.batch = B * NH;
        g.batch_inner = NH;
        g.sA0 = NH * TT;
        g.sA1 = TT;
        g.sB0 = (long long)T_ * C3;
        g.sB1 = hs;
        g.sC0 = (long long)T_ * C;
        g.sC1 = hs;
        g.k_hi = 1;
        gemm<float, T, T, true, false>(g, "attention_fwd_av");
    }
}

static void cu_attention_fwd(DType dt, void *out, float *att, const void *qkv, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
    if (dt == DT_BF16) attention_fwd_t<bf16s>(out, att, qkv, B, T, C, NH);
    else attention_fwd_t<float>(out, att, qkv, B, T, C, NH);
}

template <typename T>
static void attention_bwd_t(void *dqkv, float *datt, const void *dout, const void *qkv, const float *att, int B, int T_,
                            int C, int NH) {
    int hs = C / NH;
    long long C3 = 3LL * C, TT = (long long)T_ * T_;
    const T *q = (const T *)qkv, *k = q + C, *v = q + 2 * (size_t)C;
    T *dq = (T *)dqkv, *dk = dq + C, *dv = dq + 2 * (size_t)C;
    { // datt = dout · vᵀ (lower triangle tiles only)
        GemmArgs g = gemm_args(T_, T_, hs, dout, C, v, C3, datt, T_);
        g.batch = B * NH;
        g.batch_inner = NH;
        g.sA0 = (long long)T_ * C;
        g.sA1 = hs;
        g.sB0 = (long long)T_ * C3;
        g.sB1 = hs;
        g.sC0 = NH * TT;
        g.sC1 = TT;
        g.skip_upper = 1;
        gemm<T, T, float, true, true>(g, "attention_bwd_datt");
    }
    int rows = B * NH * T_;
    softmax_bwd_kernel<<<cdiv(rows, 8), 256>>>(datt, att, rows, T_, 1.0f / sqrtf((float)hs));
    check_launch("softmax_bwd_kernel");
    { // dq = dpre · k
        GemmArgs g = gemm_args(T_, hs, T_, datt, T_, k, C3, dq, C3);
        g.batch = B * NH;
        g.batch_inner = NH;
        g.sA0 = NH * TT;
        g.sA1 = TT;
        g.sB0 = g.sC0 = (long long)T_ * C3;
        g.sB1 = g.sC1 = hs;
        g.k_hi = 1;
        gemm<float, T, T, true, false>(g, "attention_bwd_dq");
    }
    { // dk = dpreᵀ · q
        GemmArgs g = gemm_args(T_, hs, T_, datt, T_, q, C3, dk, C3);
        g.batch = B * NH;
        g.batch_inner = NH;
        g.sA0 = NH * TT;
        g.sA1 = TT;
        g.sB0 = g.sC0 = (long long)T_ * C3;
        g.sB1 = g.sC1 = hs;
        g.k_lo = 1;
        gemm<float, T, T, false, false>(g, "attention_bwd_dk");
    }
    { // dv = attᵀ · dout
        GemmArgs g = gemm_args(T_, hs, T_, att, T_, dout, C, dv, C3);
        g.batch = B * NH;
        g.batch_inner = NH;
        g.sA0 = NH * TT;
        g.sA1 = TT;
        g.sB0 = (long long)T_ * C;
        g.sB1 = hs;
        g.sC0 = (long long)T_ * C3;
        g.sC1 = hs;
        g.k_lo = 1;
        gemm<float, T, T, false, false>(g, "attention_bwd_dv");
    }
}

static void cu_attention_bwd(DType dt, void *dqkv, float *datt, const void *dout, const void *qkv, const float *att,
                             int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
    if (dt == DT_BF16) attention_bwd_t<bf16s>(dqkv, datt, dout, qkv, att, B, T, C, NH);
    else attention_bwd_t<float>(dqkv, datt, dout, qkv, att, B, T, C, NH);
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation), residual

#define GELU_K 0.7978845608028654f // sqrt(2/pi)

#define GRID_STRIDE(i, n)                                                                                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

template <typename T> __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = tof(inp[i]);
        out[i] = fromf<T>(0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
    }
}

// dinp may alias dout: each element is read and written by the same thread.
template <typename T> __global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float x = tof(inp[i]);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = fromf<T>(grad * tof(dout[i]));
    }
}

template <typename T> __global__ void residual_fwd_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = fromf<T>(tof(a[i]) + tof(b[i]));
}

template <typename T> __global__ void residual_bwd_kernel(T *dst, const T *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = fromf<T>(tof(dst[i]) + tof(src[i]));
}

static void cu_gelu_fwd(DType dt, void *out, const void *inp, size_t n) {
    if (n == 0) return;
    if (dt == DT_BF16) gelu_fwd_kernel<bf16s><<<ew_blocks(n, 256), 256>>>((bf16s *)out, (const bf16s *)inp, n);
    else gelu_fwd_kernel<float><<<ew_blocks(n, 256), 256>>>((float *)out, (const float *)inp, n);
    check_launch("gelu_fwd_kernel");
}

static void cu_gelu_bwd(DType dt, void *dinp, const void *inp, const void *dout, size_t n) {
    if (n == 0) return;
    if (dt == DT_BF16)
        gelu_bwd_kernel<bf16s><<<ew_blocks(n, 256), 256>>>((bf16s *)dinp, (const bf16s *)inp, (const bf16s *)dout, n);
    else
        gelu_bwd_kernel<float><<<ew_blocks(n, 256), 256>>>((float *)dinp, (const float *)inp, (const float *)dout, n);
    check_launch("gelu_bwd_kernel");
}

static void cu_residual_fwd(DType dt, void *out, const void *a, const void *b, size_t n) {
    if (n == 0) return;
    if (dt == DT_BF16)
        residual_fwd_kernel<bf16s><<<ew_blocks(n, 256), 256>>>((bf16s *)out, (const bf16s *)a, (const bf16s *)b, n);
    else
        residual_fwd_kernel<float><<<ew_blocks(n, 256), 256>>>((float *)out, (const float *)a, (const float *)b, n);
    check_launch("residual_fwd_kernel");
}

static void cu_residual_bwd(DType dt, void *dst, const void *src, size_t n) {
    if (n == 0) return;
    if (dt == DT_BF16) residual_bwd_kernel<bf16s><<<ew_blocks(n, 256), 256>>>((bf16s *)dst, (const bf16s *)src, n);
    else residual_bwd_kernel<float><<<ew_blocks(n, 256), 256>>>((float *)dst, (const float *)src, n);
    check_launch("residual_bwd_kernel");
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy over a vocabulary slice: logits[N, Vloc] hold columns vstart.. of the padded
// vocabulary, of which the first vreal are real. One block per row.

#define CE_THREADS 512

// Per row: max and Σ exp(x - max) over the real local columns (-inf and 0 when there are none), and the
// target's logit when this slice holds it (else 0).
template <typename T>
__global__ void crossentropy_stats_kernel(float *rowmax, float *rowsum, float *target, const T *logits,
                                          const int32_t *targets, int vstart, int vreal, int Vloc) {
    __shared__ float sh[32];
    int n = blockIdx.x;
    const T *x = logits + (size_t)n * Vloc;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < vreal; j += blockDim.x) {
        float v = tof(x[j]);
        if (v > m) m = v; // NaNs are ignored by the max, as on the CPU
    }
    m = block_max(m, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < vreal; j += blockDim.x) s += expf(tof(x[j]) - m);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        long long tj = (long long)targets[n] - vstart;
        rowmax[n] = m;
        rowsum[n] = s;
        target[n] = (tj >= 0 && tj < vreal) ? tof(x[tj]) : 0.0f;
    }
}

// dlogits = (exp(x - gmax[n]) / gsum[n] - onehot) * dloss on the real columns, 0 on the rest. dlogits may
// alias logits: each element is read and written by the same thread.
template <typename T>
__global__ void crossentropy_bwd_kernel(T *dlogits, const T *logits, const int32_t *targets, const float *gmax,
                                        const float *gsum, float dloss, int vstart, int vreal, int Vloc) {
    int n = blockIdx.x;
    const T *x = logits + (size_t)n * Vloc;
    T *d = dlogits + (size_t)n * Vloc;
    float mx = gmax[n], inv = 1.0f / gsum[n];
    long long tj = (long long)targets[n] - vstart;
    int vr = vreal < Vloc ? vreal : Vloc;
    for (int j = threadIdx.x; j < vr; j += blockDim.x) {
        float p = expf(tof(x[j]) - mx) * inv;
        d[j] = fromf<T>((p - (j == tj ? 1.0f : 0.0f)) * dloss);
    }
    for (int j = (vr > 0 ? vr : 0) + threadIdx.x; j < Vloc; j += blockDim.x) d[j] = fromf<T>(0.0f);
}

static void cu_crossentropy_stats(DType dt, float *rowmax, float *rowsum, float *target, const void *logits,
                                  const int32_t *targets, int N, int vstart, int vreal, int Vloc) {
    if (N <= 0) return;
    if (vreal > Vloc) vreal = Vloc;
    if (dt == DT_BF16)
        crossentropy_stats_kernel<bf16s><<<N, CE_THREADS>>>(rowmax, rowsum, target, (const bf16s *)logits, targets,
                                                            vstart, vreal, Vloc);
    else
        crossentropy_stats_kernel<float><<<N, CE_THREADS>>>(rowmax, rowsum, target, (const float *)logits, targets,
                                                            vstart, vreal, Vloc);
    check_launch("crossentropy_stats_kernel");
}

static void cu_crossentropy_bwd(DType dt, void *dlogits, const void *logits, const int32_t *targets, const float *gmax,
                                const float *gsum, float dloss, int N, int vstart, int vreal, int Vloc) {
    if (N <= 0 || Vloc <= 0) return;
    if (dt == DT_BF16)
        crossentropy_bwd_kernel<bf16s><<<N, CE_THREADS>>>((bf16s *)dlogits, (const bf16s *)logits, targets, gmax, gsum,
                                                          dloss, vstart, vreal, Vloc);
    else
        crossentropy_bwd_kernel<float><<<N, CE_THREADS>>>((float *)dlogits, (const float *)logits, targets, gmax, gsum,
                                                          dloss, vstart, vreal, Vloc);
    check_launch("crossentropy_bwd_kernel");
}

// ---------------------------------------------------------------------------------------------
// optimizer, norms, casts

template <typename T>
__global__ void adamw_kernel(float *master, T *working, const float *grad, float *m, float *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2,
                             float grad_scale) {
    GRID_STRIDE(i, n) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master[i] * (1.0f - lr * weight_decay);
        p -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        master[i] = p;
        if (working) working[i] = fromf<T>(p);
    }
}

static void cu_adamw(DType dt, float *master, void *working, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) {
    if (n == 0) return;
    if (dt == DT_BF16)
        adamw_kernel<bf16s><<<ew_blocks(n, 256), 256>>>(master, (bf16s *)working, grad, m, v, n, lr, beta1, beta2, eps,
                                                        weight_decay, bc1, bc2, grad_scale);
    else
        adamw_kernel<float><<<ew_blocks(n, 256), 256>>>(master, (float *)working, grad, m, v, n, lr, beta1, beta2, eps,
                                                        weight_decay, bc1, bc2, grad_scale);
    check_launch("adamw_kernel");
}

// Σ x² in double: one block per fixed chunk of SUMSQ_CHUNK elements (each thread strides the chunk, then a
// fixed shared-memory tree); the chunk partials are summed in order on the host. Same chunking as the CPU.
#define SUMSQ_CHUNK 65536
#define SUMSQ_THREADS 256

__global__ void sumsq_kernel(double *partial, const float *x, size_t n) {
    __shared__ double sh[SUMSQ_THREADS];
    size_t begin = (size_t)blockIdx.x * SUMSQ_CHUNK;
    size_t end = begin + SUMSQ_CHUNK < n ? begin + SUMSQ_CHUNK : n;
    double s = 0.0;
    for (size_t i = begin + threadIdx.x; i < end; i += SUMSQ_THREADS) {
        double v = (double)x[i];
        s += v * v;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = SUMSQ_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

static double cu_sumsq(const float *x, size_t n) {
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunks == 0) return 0.0;
    if (nchunks > 0x7fffffffu) die("CUDA sumsq: tensor too large (%zu elements)", n);
    double *partial = (double *)scratch(SCR_SUMSQ, sizeof(double) * nchunks);
    sumsq_kernel<<<(unsigned)nchunks, SUMSQ_THREADS>>>(partial, x, n);
    check_launch("sumsq_kernel");
    double *host = (double *)xmalloc(sizeof(double) * nchunks);
    CK(cudaMemcpy, (host, partial, sizeof(double) * nchunks, cudaMemcpyDeviceToHost));
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += host[c];
    free(host);
    return total;
}

template <typename TD, typename TS> __global__ void cast_kernel(TD *dst, const TS *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = fromf<TD>(tof(src[i]));
}

static void cu_cast(void *dst, DType dst_dt, const void *src, DType src_dt, size_t n) {
    if (n == 0) return;
    unsigned blocks = ew_blocks(n, 256);
    if (dst_dt == DT_BF16 && src_dt == DT_BF16) cast_kernel<bf16s, bf16s><<<blocks, 256>>>((bf16s *)dst, (const bf16s *)src, n);
    else if (dst_dt == DT_BF16) cast_kernel<bf16s, float><<<blocks, 256>>>((bf16s *)dst, (const float *)src, n);
    else if (src_dt == DT_BF16) cast_kernel<float, bf16s><<<blocks, 256>>>((float *)dst, (const bf16s *)src, n);
    else cast_kernel<float, float><<<blocks, 256>>>((float *)dst, (const float *)src, n);
    check_launch("cast_kernel");
}

// ---------------------------------------------------------------------------------------------
// the table

static Backend CUDA_BACKEND;

extern "C" int cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void cuda_use_device(int ordinal) { CK(cudaSetDevice, (ordinal)); }

// Forces the GEMM tile size (64 or 128; 0 restores the automatic choice). Results do not depend on it;
// the tests use it to check exactly that.
extern "C" void cuda_set_gemm_tile(int tile) { g_gemm_tile = tile; }

static void fill_table(Backend *b) {
    b->name = "cuda";
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->to_device = cu_to_device;
    b->to_host = cu_to_host;
    b->copy = cu_copy;
    b->zero = cu_zero;
    b->sync = cu_sync;
    b->set_threads = cu_set_threads;
    b->encoder_fwd = cu_encoder_fwd;
    b->encoder_bwd = cu_encoder_bwd;
    b->layernorm_fwd = cu_layernorm_fwd;
    b->layernorm_bwd = cu_layernorm_bwd;
    b->matmul_fwd = cu_matmul_fwd;
    b->matmul_bwd = cu_matmul_bwd;
    b->attention_fwd = cu_attention_fwd;
    b->attention_bwd = cu_attention_bwd;
    b->gelu_fwd = cu_gelu_fwd;
    b->gelu_bwd = cu_gelu_bwd;
    b->residual_fwd = cu_residual_fwd;
    b->residual_bwd = cu_residual_bwd;
    b->crossentropy_stats = cu_crossentropy_stats;
    b->crossentropy_bwd = cu_crossentropy_bwd;
    b->adamw = cu_adamw;
    b->sumsq = cu_sumsq;
    b->cast = cu_cast;
}

extern "C" const Backend *backend_cuda(void) {
    static int ready = 0;
    if (ready) return &CUDA_BACKEND;
    // Without a device the table is still returned (this binary has CUDA; the caller checks
    // cuda_device_count() and reports), but nothing is initialised: every op would fail with a CUDA error.
    if (cuda_device_count() <= 0) {
        fill_table(&CUDA_BACKEND);
        return &CUDA_BACKEND;
    }
    int dev = 0;
    CK(cudaGetDevice, (&dev));
    CK(cudaFree, (0)); // create the context now, so that failures are reported here
    CK(cudaDeviceGetAttribute, (&g_num_sms, cudaDevAttrMultiProcessorCount, dev));
    if (g_num_sms <= 0) g_num_sms = 1;
    fill_table(&CUDA_BACKEND);
    ready = 1;
    return &CUDA_BACKEND;
}

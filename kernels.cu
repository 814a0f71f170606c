// kernels.cu: the CUDA backend. Every op of kernels.h, hand-written (no cuBLAS/cuDNN), with the
// semantics of kernels_cpu.c: storage dtype fp32 or bf16, arithmetic fp32, parameter gradients fp32.
//
// Which code runs:
//  - matmuls in bf16 on sm_80 and later: the tensor-core GEMMs of gemm.cu (wgmma on Hopper, mma.sync
//    elsewhere) with bias, GELU and GELU's derivative fused into their epilogues; in fp32, or when the
//    shapes break gemm.h's alignment rules, the SIMT GEMM below (exact fp32 FMAs: fp32 keeps the
//    design's 1e-5 promise, so tf32 is never used);
//  - attention in bf16 with head size 64 or 128 on sm_80 and later: the flash-attention kernels of
//    attention.cu (mma.sync); otherwise the simple kernels below (one warp per row); both take
//    grouped-query attention (K and V read per kv head) and RoPE in the prologue (the Llama family);
//  - everything else: the kernels below (RMSNorm, RoPE and SwiGLU among them).
//
// Determinism: no atomics anywhere. Every output element is produced by exactly one thread, which sums
// its terms in a fixed order, and reductions across threads use a fixed tree whose shape depends only on
// compile-time constants (gemm.cu's split-K adds its fixed splits in order). The SIMT GEMM sums k in
// ascending order with one fma per term in every tile configuration, so its result does not even
// depend on which tile size was chosen.
//
// Streams: every op is queued on the backend's current stream, one of two non-blocking streams it owns
// (compute and communication, kernels.h), never on the legacy default stream; the host waits only in
// sync, event_sync and to_host. A step allocates nothing: scratch buffers grow to the largest size
// asked for (in the first step) and are then reused; small uploads go through pinned staging buffers,
// so they do not wait for the device either.
//
// Device selection: backend_cuda() and cuda_device_count() create no context; cuda_use_device(ordinal)
// creates it on the rank's own device (or the first op does, on the current device).
//
// Error handling: every CUDA call and every kernel launch is checked (common.cuh); a failure prints
// "error: CUDA <call>: <message>" through die() and exits with status 1. LLM4D_CUDA_SYNC=1 waits for
// each kernel as it is launched, so that a failing kernel is named: "error: CUDA kernel <name> failed".
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "attention.h"
#include "common.h"
#include "gemm.h"
#include "kernels.h"
}
#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// device state: one device per process, set up once by cuda_use_device or the first op

enum { SCR_COLSUM = 0, SCR_SUMSQ, SCR_ATTN, SCR_ADAMW, SCR_GEMM, SCR_ROPE, NSCRATCH };
enum { STAGE_SLOTS = 4, STAGE_BYTES = 4 << 20 }; // pinned upload buffers, each reused after its copy ends

typedef struct CudaDev {
    int ready, ordinal, sms;
    cudaStream_t stream[NUM_STREAMS];
    StreamId cur;
    // Grow-only scratch per stream (the two streams may run at once) and slot; growth is counted so
    // the tests can check that a repeated step allocates nothing.
    void *scr[NUM_STREAMS][NSCRATCH];
    size_t cap[NUM_STREAMS][NSCRATCH];
    long long grows;
    void *stage[STAGE_SLOTS];
    cudaEvent_t stage_done[STAGE_SLOTS];
    int stage_used[STAGE_SLOTS], stage_next;
    int gemm_tile;   // SIMT GEMM tile: 0 automatic, 64 or 128 forced (tests)
    int gemm_kernel; // -1: SIMT only; 0: the best tensor-core GEMM; GEMM_KERNEL_MMA or _WGMMA forced (tests)
    int attn_simple; // 1: the simple attention kernels even where the flash kernels apply (tests)
    long long tc_calls; // ops that ran on the tensor-core GEMM or the flash kernels (tests)
} CudaDev;

static CudaDev g_cu;

static void dev_init(int ordinal) {
    CudaDev *d = &g_cu;
    if (ordinal >= 0) CK(cudaSetDevice, (ordinal));
    else CK(cudaGetDevice, (&ordinal));
    CK(cudaFree, (0)); // creates the context on this device now, so that failures are reported here
    d->ordinal = ordinal;
    CK(cudaDeviceGetAttribute, (&d->sms, cudaDevAttrMultiProcessorCount, ordinal));
    if (d->sms <= 0) d->sms = 1;
    for (int s = 0; s < NUM_STREAMS; s++) CK(cudaStreamCreateWithFlags, (&d->stream[s], cudaStreamNonBlocking));
    d->cur = STREAM_COMPUTE;
    for (int i = 0; i < STAGE_SLOTS; i++) {
        CK(cudaHostAlloc, (&d->stage[i], STAGE_BYTES, cudaHostAllocDefault));
        CK(cudaEventCreateWithFlags, (&d->stage_done[i], cudaEventDisableTiming));
    }
    (void)gemm_available(GEMM_KERNEL_NONE); // probes the device for the GEMM now, not inside a step
    d->ready = 1;
}

static inline CudaDev *dev(void) {
    if (!g_cu.ready) dev_init(-1);
    return &g_cu;
}
static inline cudaStream_t cur_stream(void) {
    CudaDev *d = dev();
    return d->stream[d->cur];
}
static inline void launched(const char *kernel) { cuda_launched(kernel, cur_stream()); }

// Scratch of at least `bytes` for this stream; grows (to a power of two, so that the first step's
// growing settles fast) only when a larger size is asked for, after the stream's earlier work.
static void *scratch(int slot, size_t bytes) {
    CudaDev *d = dev();
    const int s = d->cur;
    if (bytes > d->cap[s][slot]) {
        size_t cap = 1 << 16;
        while (cap < bytes) cap <<= 1;
        if (d->scr[s][slot]) {
            CK(cudaStreamSynchronize, (d->stream[s])); // earlier kernels may still read the old buffer
            CK(cudaFree, (d->scr[s][slot]));
        }
        d->scr[s][slot] = NULL;
        d->cap[s][slot] = 0;
        CK(cudaMalloc, (&d->scr[s][slot], cap));
        d->cap[s][slot] = cap;
        d->grows++;
    }
    return d->scr[s][slot];
}

// Copies host bytes to the device on the current stream without waiting for the device: through a
// pinned staging buffer (whose previous copy has long finished, normally) when they fit, else directly
// (a pageable copy, which waits).
static void upload(void *dst, const void *src, size_t bytes) {
    CudaDev *d = dev();
    if (bytes == 0) return;
    if (bytes > STAGE_BYTES) {
        CK(cudaMemcpyAsync, (dst, src, bytes, cudaMemcpyHostToDevice, cur_stream()));
        CK(cudaStreamSynchronize, (cur_stream())); // the caller may reuse src at once
        return;
    }
    const int i = d->stage_next;
    d->stage_next = (i + 1) % STAGE_SLOTS;
    if (d->stage_used[i]) CK(cudaEventSynchronize, (d->stage_done[i]));
    memcpy(d->stage[i], src, bytes);
    CK(cudaMemcpyAsync, (dst, d->stage[i], bytes, cudaMemcpyHostToDevice, cur_stream()));
    CK(cudaEventRecord, (d->stage_done[i], cur_stream()));
    d->stage_used[i] = 1;
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
// memory

static void *cu_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = NULL;
    dev();
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); // clear the (non-sticky) error; the caller reports the failure
        return NULL;
    }
    CK(cudaMemsetAsync, (p, 0, bytes, cur_stream()));
    CK(cudaStreamSynchronize, (cur_stream())); // zeroed before any stream uses it
    return p;
}
static void cu_free(void *p) {
    if (!p) return;
    CK(cudaDeviceSynchronize, ()); // no stream may still use it (frees happen at teardown, not in a step)
    CK(cudaFree, (p));
}
static void cu_to_device(void *dst, const void *src, size_t bytes) { upload(dst, src, bytes); }
static void cu_to_host(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CK(cudaMemcpyAsync, (dst, src, bytes, cudaMemcpyDeviceToHost, cur_stream()));
    CK(cudaStreamSynchronize, (cur_stream()));
}
static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CK(cudaMemcpyAsync, (dst, src, bytes, cudaMemcpyDeviceToDevice, cur_stream()));
}
static void cu_zero(void *dst, size_t bytes) {
    if (bytes) CK(cudaMemsetAsync, (dst, 0, bytes, cur_stream()));
}
static void cu_sync(void) {
    dev();
    CK(cudaDeviceSynchronize, ());
}
static void cu_set_threads(int n) { (void)n; }

// ---------------------------------------------------------------------------------------------
// streams and events (kernels.h); the protocol checks are the CPU stand-ins' (kernels_cpu.c)

static StreamId cu_set_stream(StreamId s) {
    CudaDev *d = dev();
    StreamId prev = d->cur;
    d->cur = backend_stream_check((int)s, "set_stream");
    return prev;
}
static BackendEvent *cu_event_create(void) {
    dev();
    BackendEvent *e = (BackendEvent *)xcalloc(1, sizeof *e);
    e->stream = -1;
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags, (&ev, cudaEventDisableTiming));
    e->handle = (void *)ev;
    return e;
}
static void cu_event_destroy(BackendEvent *e) {
    if (!e) return;
    CK(cudaEventDestroy, ((cudaEvent_t)e->handle));
    free(e);
}
static void cu_event_record(BackendEvent *e, StreamId s) {
    s = backend_stream_check((int)s, "event_record");
    if (!e) die("backend event_record: no event");
    CK(cudaEventRecord, ((cudaEvent_t)e->handle, dev()->stream[s]));
    backend_event_note(e, s);
}
static void cu_stream_wait(StreamId s, BackendEvent *e) {
    s = backend_stream_check((int)s, "stream_wait");
    backend_event_check(e, "stream_wait");
    CK(cudaStreamWaitEvent, (dev()->stream[s], (cudaEvent_t)e->handle, 0));
}
static void cu_event_sync(BackendEvent *e) {
    backend_event_check(e, "event_sync");
    CK(cudaEventSynchronize, ((cudaEvent_t)e->handle));
}
static int cu_event_done(BackendEvent *e) {
    backend_event_check(e, "event_done");
    cudaError_t r = cudaEventQuery((cudaEvent_t)e->handle);
    if (r == cudaErrorNotReady) { // not a failure, but left as the last error: the next launch check would report it
        (void)cudaGetLastError();
        return 0;
    }
    if (r != cudaSuccess) cuda_fail("cudaEventQuery", r);
    return 1;
}
static size_t cu_scratch_bytes(void) {
    if (!g_cu.ready) return 0;
    size_t total = 0; // device memory only: the pinned staging buffers are host memory
    for (int s = 0; s < NUM_STREAMS; s++)
        for (int i = 0; i < NSCRATCH; i++) total += g_cu.cap[s][i];
    return total;
}

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
// Batch index z = zo*batch_inner + zi offsets each operand by zo*s?0 + zi*s?1 elements.

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
    const int M = g.M, N = g.N;
    const int zo = blockIdx.z / g.batch_inner, zi = blockIdx.z % g.batch_inner;
    const TA *A = (const TA *)g.A + zo * g.sA0 + zi * g.sA1;
    const TB *B = (const TB *)g.B + zo * g.sB0 + zi * g.sB1;
    TC *C = (TC *)g.C + zo * g.sC0 + zi * g.sC1;
    const long long lda = g.lda, ldb = g.ldb, ldc = g.ldc;

    const int k_begin = 0, k_end = g.K;

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
    int tile = dev()->gemm_tile;
    if (tile != 64 && tile != 128) {
        size_t tiles128 = (size_t)cdiv(g.M, 128) * cdiv(g.N, 128) * g.batch;
        tile = (g.M <= 64 || g.N <= 64 || tiles128 < (size_t)dev()->sms) ? 64 : 128;
    }
    if (g.batch > 65535 || cdiv(g.M, tile) > 65535u) die("CUDA %s: matrix too large (%d x %d x %d)", name, g.M, g.N, g.batch);
    dim3 grid(cdiv(g.N, tile), cdiv(g.M, tile), g.batch);
    if (tile == 128) CUDA_LAUNCH(grid, GEMM_THREADS, 0, cur_stream(), gemm_kernel<128, 128, TA, TB, TC, A_KC, B_KC>)(g);
    else CUDA_LAUNCH(grid, GEMM_THREADS, 0, cur_stream(), gemm_kernel<64, 64, TA, TB, TC, A_KC, B_KC>)(g);
    launched(name);
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
    CUDA_LAUNCH(cdiv(C, 256), 256, 0, cur_stream(), colsum_finalize_kernel)(dst, partial, nchunks, C);
    launched("colsum_finalize_kernel");
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation) as separate elementwise passes around the SIMT GEMM (fp32, or shapes the
// tensor-core GEMM refuses; gemm.cu fuses it into its epilogue)

#define GELU_K 0.7978845608028654f // sqrt(2/pi)

#define GRID_STRIDE(i, n)                                                                                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))); }
__device__ __forceinline__ float gelu_grad(float x) {
    float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename T> __global__ void gelu_fwd_kernel(T *out, const T *pre, size_t n) {
    GRID_STRIDE(i, n) out[i] = fromf<T>(gelu(tof(pre[i])));
}

// x *= gelu'(pre), elementwise
template <typename T> __global__ void gelu_grad_mul_kernel(T *x, const T *pre, size_t n) {
    GRID_STRIDE(i, n) x[i] = fromf<T>(tof(x[i]) * gelu_grad(tof(pre[i])));
}

// ---------------------------------------------------------------------------------------------
// linear layer: the tensor-core GEMM in bf16 where it applies, else the SIMT GEMM with GELU and its
// derivative as separate passes (the same roundings: the fused epilogue rounds to bf16 where the
// separate kernels store)

template <typename T>
static void matmul_fwd_t(void *out, void *pre, const void *inp, const void *weight, const void *bias, int N, int C,
                         int OC) {
    GemmArgs g = gemm_args(N, OC, C, inp, C, weight, C, pre ? pre : out, OC);
    g.bias = bias;
    gemm<T, T, T, true, true>(g, "matmul_fwd");
    size_t n = (size_t)N * OC;
    if (pre && n) {
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), gelu_fwd_kernel<T>)((T *)out, (const T *)pre, n);
        launched("gelu_fwd_kernel");
    }
}

static void cu_gelu_fwd(DType dt, void *out, const void *inp, size_t n) {
    if (!n) return;
    if (dt == DT_BF16) CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), gelu_fwd_kernel<bf16s>)((bf16s *)out, (const bf16s *)inp, n);
    else CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), gelu_fwd_kernel<float>)((float *)out, (const float *)inp, n);
    launched("gelu_fwd_kernel");
}

// A bf16 problem on the tensor-core GEMM (gemm.cu) with its split-K workspace from the scratch pool;
// GEMM_KERNEL_NONE when it does not apply (device older than sm_80, shapes or alignment that gemm.h
// refuses, or the tests asked for SIMT), and the caller runs the SIMT GEMM.
static GemmKernel tc_gemm(const GemmProblem *p) {
    CudaDev *d = dev();
    if (d->gemm_kernel < 0 || gemm_problem_check(p)) return GEMM_KERNEL_NONE;
    const GemmKernel want = (GemmKernel)d->gemm_kernel;
    const size_t ws = gemm_workspace_bytes(p, want); // a function of the shape and the device alone
    GemmOptions o;
    memset(&o, 0, sizeof o);
    o.kernel = want;
    o.workspace = ws ? scratch(SCR_GEMM, ws) : NULL;
    o.workspace_bytes = ws;
    o.stream = (void *)cur_stream();
    const GemmKernel k = gemm_bf16(p, &o);
    if (k != GEMM_KERNEL_NONE) d->tc_calls++;
    return k;
}

static GemmProblem gemm_problem(int M, int N, int K, const void *A, long long lda, int a_kmajor, const void *B,
                                long long ldb, int b_kmajor, void *C, long long ldc, GemmStore store) {
    GemmProblem p;
    memset(&p, 0, sizeof p);
    p.M = M;
    p.N = N;
    p.K = K;
    p.A = (const uint16_t *)A;
    p.lda = lda;
    p.a_kmajor = a_kmajor;
    p.B = (const uint16_t *)B;
    p.ldb = ldb;
    p.b_kmajor = b_kmajor;
    p.C = C;
    p.ldc = ldc;
    p.store = store;
    return p;
}

static void cu_matmul_fwd(DType dt, void *out, void *pre, const void *inp, const void *weight, const void *bias, int N,
                          int C, int OC) {
    if (dt == DT_BF16 && N > 0 && OC > 0) { // out = inp·weightᵀ (+ bias) (GELU, pre kept), in one kernel
        GemmProblem p = gemm_problem(N, OC, C, inp, C, 1, weight, C, 1, out, OC, GEMM_STORE_BF16);
        p.bias = (const uint16_t *)bias;
        p.gelu = pre != NULL;
        p.pre_gelu = (uint16_t *)pre;
        if (tc_gemm(&p) != GEMM_KERNEL_NONE) return;
    }
    if (dt == DT_BF16) matmul_fwd_t<bf16s>(out, pre, inp, weight, bias, N, C, OC);
    else matmul_fwd_t<float>(out, pre, inp, weight, bias, N, C, OC);
}

template <typename T>
static void matmul_bwd_t(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                         const void *weight, const void *gelu_pre, int N, int C, int OC) {
    const bool bf = sizeof(T) == 2;
    if (dinp && bf && N > 0 && C > 0) { // dinp = dout·weight (· gelu'(gelu_pre)), on tensor cores
        GemmProblem p = gemm_problem(N, C, OC, dout, OC, 1, weight, C, 0, dinp, C, GEMM_STORE_BF16);
        p.dgelu_in = (const uint16_t *)gelu_pre;
        if (tc_gemm(&p) != GEMM_KERNEL_NONE) dinp = NULL; // done
    }
    if (dweight && bf && OC > 0 && C > 0) { // dweight += doutᵀ·inp, on tensor cores
        GemmProblem p = gemm_problem(OC, C, N, dout, OC, 0, inp, C, 0, dweight, C, GEMM_ACCUM_F32);
        if (tc_gemm(&p) != GEMM_KERNEL_NONE) dweight = NULL; // done
    }
    if (dinp) { // dinp[N,C] = dout[N,OC] · weight[OC,C] (· gelu'(gelu_pre))
        GemmArgs g = gemm_args(N, C, OC, dout, OC, weight, C, dinp, C);
        gemm<T, T, T, true, false>(g, "matmul_bwd_dinp");
        size_t n = (size_t)N * C;
        if (gelu_pre && n) {
            CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), gelu_grad_mul_kernel<T>)((T *)dinp, (const T *)gelu_pre, n);
            launched("gelu_grad_mul_kernel");
        }
    }
    if (dweight) { // dweight[OC,C] += dout[N,OC]ᵀ · inp[N,C]
        GemmArgs g = gemm_args(OC, C, N, dout, OC, inp, C, dweight, C);
        g.accumulate = 1;
        gemm<T, T, float, false, false>(g, "matmul_bwd_dweight");
    }
    if (dbias && N > 0 && OC > 0) {
        int nch = (int)cdiv(N, COL_CHUNK);
        float *partial = (float *)scratch(SCR_COLSUM, sizeof(float) * (size_t)nch * OC);
        CUDA_LAUNCH(dim3(cdiv(OC, 32), nch), dim3(32, 8), 0, cur_stream(), dbias_partial_kernel<T>)(partial, (const T *)dout, N, OC);
        launched("dbias_partial_kernel");
        colsum_finalize(dbias, partial, nch, OC);
    }
}

static void cu_matmul_bwd(DType dt, void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                          const void *weight, const void *gelu_pre, int N, int C, int OC) {
    if (dt == DT_BF16) matmul_bwd_t<bf16s>(dinp, dweight, dbias, dout, inp, weight, gelu_pre, N, C, OC);
    else matmul_bwd_t<float>(dinp, dweight, dbias, dout, inp, weight, gelu_pre, N, C, OC);
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
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), encoder_fwd_kernel<bf16s>)((bf16s *)out, tokens, (const bf16s *)wte,
                                                               (const bf16s *)wpe, B, T, C, vstart, vlen);
    else
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), encoder_fwd_kernel<float>)((float *)out, tokens, (const float *)wte,
                                                               (const float *)wpe, B, T, C, vstart, vlen);
    launched("encoder_fwd_kernel");
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
            CUDA_LAUNCH(ew_blocks(ntc, 256), 256, 0, cur_stream(), encoder_bwd_wpe_kernel<bf16s>)(dwpe, (const bf16s *)dout, B, T, C);
        else CUDA_LAUNCH(ew_blocks(ntc, 256), 256, 0, cur_stream(), encoder_bwd_wpe_kernel<float>)(dwpe, (const float *)dout, B, T, C);
        launched("encoder_bwd_wpe_kernel");
    }
    if (dwte && vlen > 0) {
        dim3 gw(cdiv(C, 32), ENC_BUCKETS / 8), bw(32, 8);
        if (dt == DT_BF16)
            CUDA_LAUNCH(gw, bw, 0, cur_stream(), encoder_bwd_wte_kernel<bf16s>)(dwte, (const bf16s *)dout, tokens, B * T, C, vstart, vlen);
        else CUDA_LAUNCH(gw, bw, 0, cur_stream(), encoder_bwd_wte_kernel<float>)(dwte, (const float *)dout, tokens, B * T, C, vstart, vlen);
        launched("encoder_bwd_wte_kernel");
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm: one warp per row

// The row a normalisation's warp takes (one warp per row, LayerNorm and RMSNorm) and its input: with add
// not NULL the residual res = inp + add, formed first (stored, and normalised as stored; res may alias
// inp or add: each element is read and written by the same lane). NULL past the last row.
template <typename T>
__device__ __forceinline__ const T *norm_row_input(const T *inp, T *res, const T *add, int N, int C, int *row, int *lane) {
    *row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), *lane = threadIdx.x & 31;
    if (*row >= N) return NULL;
    const T *x = inp + (size_t)*row * C;
    if (!add) return x;
    T *r = res + (size_t)*row * C;
    const T *a = add + (size_t)*row * C;
    for (int c = *lane; c < C; c += 32) r[c] = fromf<T>(tof(x[c]) + tof(a[c]));
    return r;
}

template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *weight, const T *bias,
                                     int N, int C, T *res, const T *add) {
    int row, lane;
    const T *x = norm_row_input(inp, res, add, N, C, &row, &lane);
    if (!x) return;
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

static void layernorm_fwd_any(DType dt, void *res, void *out, float *mean, float *rstd, const void *inp, const void *add,
                              const void *weight, const void *bias, int N, int C) {
    if (N <= 0) return;
    unsigned blocks = cdiv(N, 8);
    if (dt == DT_BF16)
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), layernorm_fwd_kernel<bf16s>)((bf16s *)out, mean, rstd, (const bf16s *)inp, (const bf16s *)weight,
                                                     (const bf16s *)bias, N, C, (bf16s *)res, (const bf16s *)add);
    else
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), layernorm_fwd_kernel<float>)((float *)out, mean, rstd, (const float *)inp, (const float *)weight,
                                                     (const float *)bias, N, C, (float *)res, (const float *)add);
    launched("layernorm_fwd_kernel");
}

static void cu_layernorm_fwd(DType dt, void *out, float *mean, float *rstd, const void *inp, const void *weight,
                             const void *bias, int N, int C) {
    layernorm_fwd_any(dt, NULL, out, mean, rstd, inp, NULL, weight, bias, N, C);
}

static void cu_residual_layernorm_fwd(DType dt, void *res, void *out, float *mean, float *rstd, const void *a,
                                      const void *b, const void *weight, const void *bias, int N, int C) {
    layernorm_fwd_any(dt, res, out, mean, rstd, a, b, weight, bias, N, C);
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
    if (dinp) {
        CUDA_LAUNCH(cdiv(N, 8), 256, 0, cur_stream(), layernorm_bwd_dinp_kernel<T>)((T *)dinp, (const T *)dout, (const T *)inp,
                                                                                   (const T *)weight, mean, rstd, N, C);
        launched("layernorm_bwd_dinp_kernel");
    }
    if (!dweight) return; // the input-gradient half alone (dbias goes with dweight)
    int nch = (int)cdiv(N, COL_CHUNK);
    float *pw = (float *)scratch(SCR_COLSUM, sizeof(float) * 2 * (size_t)nch * C);
    float *pb = pw + (size_t)nch * C;
    CUDA_LAUNCH(dim3(cdiv(C, 32), nch), dim3(32, 8), 0, cur_stream(), layernorm_bwd_wb_partial_kernel<T>)(pw, pb, (const T *)dout,
                                                                                (const T *)inp, mean, rstd, N, C);
    launched("layernorm_bwd_wb_partial_kernel");
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
// The Llama family: RMSNorm (one warp per row, as LayerNorm), RoPE and SwiGLU (elementwise)

// The residual with add as LayerNorm's (norm_row_input).
template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *weight, int N, int C, float eps, T *res,
                                   const T *add) {
    int row, lane;
    const T *x = norm_row_input(inp, res, add, N, C, &row, &lane);
    if (!x) return;
    T *o = out + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += tof(x[c]) * tof(x[c]);
    float s = 1.0f / sqrtf(warp_sum(ss) / C + eps);
    for (int c = lane; c < C; c += 32) o[c] = fromf<T>(tof(x[c]) * s * tof(weight[c]));
    if (lane == 0) rstd[row] = s;
}

static void rmsnorm_fwd_any(DType dt, void *res, void *out, float *rstd, const void *inp, const void *add,
                            const void *weight, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    unsigned blocks = cdiv(N, 8);
    if (dt == DT_BF16)
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), rmsnorm_fwd_kernel<bf16s>)((bf16s *)out, rstd, (const bf16s *)inp,
                                                                             (const bf16s *)weight, N, C, eps, (bf16s *)res,
                                                                             (const bf16s *)add);
    else
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), rmsnorm_fwd_kernel<float>)((float *)out, rstd, (const float *)inp,
                                                                             (const float *)weight, N, C, eps, (float *)res,
                                                                             (const float *)add);
    launched("rmsnorm_fwd_kernel");
}

static void cu_rmsnorm_fwd(DType dt, void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
    rmsnorm_fwd_any(dt, NULL, out, rstd, inp, NULL, weight, N, C, eps);
}

static void cu_residual_rmsnorm_fwd(DType dt, void *res, void *out, float *rstd, const void *a, const void *b,
                                    const void *weight, int N, int C, float eps) {
    rmsnorm_fwd_any(dt, res, out, rstd, a, b, weight, N, C, eps);
}

// dinp += (w·dout - x̂·mean(w·dout·x̂))·rstd per row, x̂ = x·rstd
template <typename T>
__global__ void rmsnorm_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight, const float *rstd, int N,
                                        int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t o = (size_t)row * C;
    float rs = rstd[row], dot = 0.0f;
    for (int c = lane; c < C; c += 32) dot += tof(weight[c]) * tof(dout[o + c]) * tof(inp[o + c]) * rs;
    dot = warp_sum(dot) / C;
    for (int c = lane; c < C; c += 32) {
        float xn = tof(inp[o + c]) * rs, dn = tof(weight[c]) * tof(dout[o + c]);
        dinp[o + c] = fromf<T>(tof(dinp[o + c]) + (dn - xn * dot) * rs);
    }
}

// partial dweight sums of dout·x̂ over one chunk of COL_CHUNK rows (as layernorm_bwd_wb_partial_kernel)
template <typename T>
__global__ void rmsnorm_bwd_w_partial_kernel(float *pw, const T *dout, const T *inp, const float *rstd, int N, int C) {
    __shared__ float shw[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    int n0 = chunk * COL_CHUNK, n1 = min(N, n0 + COL_CHUNK);
    float dw = 0.0f;
    if (c < C)
        for (int n = n0 + threadIdx.y; n < n1; n += 8) {
            size_t i = (size_t)n * C + c;
            dw += tof(dout[i]) * tof(inp[i]) * rstd[n];
        }
    shw[threadIdx.y][threadIdx.x] = dw;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f;
        for (int i = 0; i < 8; i++) tw += shw[i][threadIdx.x];
        pw[(size_t)chunk * C + c] = tw;
    }
}

template <typename T>
static void rmsnorm_bwd_t(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                          const float *rstd, int N, int C) {
    if (dinp) {
        CUDA_LAUNCH(cdiv(N, 8), 256, 0, cur_stream(), rmsnorm_bwd_dinp_kernel<T>)((T *)dinp, (const T *)dout, (const T *)inp,
                                                                                 (const T *)weight, rstd, N, C);
        launched("rmsnorm_bwd_dinp_kernel");
    }
    if (!dweight) return; // the input-gradient half alone
    int nch = (int)cdiv(N, COL_CHUNK);
    float *pw = (float *)scratch(SCR_COLSUM, sizeof(float) * (size_t)nch * C);
    CUDA_LAUNCH(dim3(cdiv(C, 32), nch), dim3(32, 8), 0, cur_stream(), rmsnorm_bwd_w_partial_kernel<T>)(pw, (const T *)dout,
                                                                                                     (const T *)inp, rstd, N, C);
    launched("rmsnorm_bwd_w_partial_kernel");
    colsum_finalize(dweight, pw, nch, C);
}

static void cu_rmsnorm_bwd(DType dt, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                           const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (dt == DT_BF16) rmsnorm_bwd_t<bf16s>(dinp, dweight, dout, inp, weight, rstd, N, C);
    else rmsnorm_bwd_t<float>(dinp, dweight, dout, inp, weight, rstd, N, C);
}

// RoPE's cos|sin table (kernels.h): row t holds cos of the angles p·inv_freq[i] in [0, hs/2) and their
// sin in [hs/2, hs), p = pos[t] or p0 + t. The angles and their cos and sin are computed in double from
// rope_inv_freq's frequencies and then rounded, as the CPU's table is, so both rotate by the same
// fp32 values (up to the last bit of the device's double cos/sin).
#define ROPE_MAX_HALF 128 // head sizes up to 256

struct RopeFreq {
    double inv[ROPE_MAX_HALF];
    int half;
};

__global__ void rope_table_kernel(float *tab, const int32_t *pos, int p0, int n, RopeFreq f) {
    GRID_STRIDE(k, (size_t)n * f.half) {
        const int t = (int)(k / f.half), i = (int)(k % f.half);
        const double a = (pos ? (double)pos[t] : (double)p0 + t) * f.inv[i];
        tab[(size_t)t * 2 * f.half + i] = (float)cos(a);
        tab[(size_t)t * 2 * f.half + f.half + i] = (float)sin(a);
    }
}

// tab[n][hs] in device memory, for positions pos[t] (device memory) or p0 + t
static void rope_table(const RopeConfig *r, int hs, const int32_t *pos, int p0, int n, float *tab) {
    if (hs <= 0 || hs % 2) die("rope: the head size must be even (got %d)", hs);
    if (hs / 2 > ROPE_MAX_HALF) die("CUDA rope: head size %d above %d", hs, 2 * ROPE_MAX_HALF);
    if (n <= 0) return;
    RopeFreq f;
    memset(&f, 0, sizeof f);
    f.half = hs / 2;
    rope_inv_freq(r, hs, f.inv);
    const size_t items = (size_t)n * f.half;
    CUDA_LAUNCH(ew_blocks(items, 256), 256, 0, cur_stream(), rope_table_kernel)(tab, pos, p0, n, f);
    launched("rope_table_kernel");
}

// One thread per channel pair (i, i + hs/2) of a head's row, in place: the rotation, or its transpose.
template <typename T>
__global__ void rope_apply_kernel(T *x, long long bstride, long long tstride, int B, int T_, int nheads, int hs,
                                  const float *tab, int transposed) {
    const int half = hs / 2;
    GRID_STRIDE(k, (size_t)B * T_ * nheads * half) {
        const int i = (int)(k % half), h = (int)(k / half % nheads);
        const int t = (int)(k / ((size_t)half * nheads) % T_), b = (int)(k / ((size_t)half * nheads * T_));
        T *r = x + b * bstride + t * tstride + (long long)h * hs;
        const float *cs = tab + (size_t)t * hs;
        const float a = tof(r[i]), bb = tof(r[i + half]), c = cs[i], s = cs[half + i];
        if (transposed) {
            r[i] = fromf<T>(a * c + bb * s);
            r[i + half] = fromf<T>(bb * c - a * s);
        } else {
            r[i] = fromf<T>(a * c - bb * s);
            r[i + half] = fromf<T>(bb * c + a * s);
        }
    }
}

static void rope_apply(AttnView x, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope,
                       int transposed) {
    if (B <= 0 || T <= 0 || nheads <= 0) return;
    float *tab = (float *)scratch(SCR_ROPE, sizeof(float) * (size_t)T * hs);
    rope_table(rope, hs, pos, pos0, T, tab);
    const size_t items = (size_t)B * T * nheads * (hs / 2);
    if (x.dt == DT_BF16)
        CUDA_LAUNCH(ew_blocks(items, 256), 256, 0, cur_stream(), rope_apply_kernel<bf16s>)((bf16s *)x.p, (long long)x.bstride,
                                                                                            (long long)x.tstride, B, T, nheads,
                                                                                            hs, tab, transposed);
    else
        CUDA_LAUNCH(ew_blocks(items, 256), 256, 0, cur_stream(), rope_apply_kernel<float>)((float *)x.p, (long long)x.bstride,
                                                                                            (long long)x.tstride, B, T, nheads,
                                                                                            hs, tab, transposed);
    launched("rope_apply_kernel");
}

static void cu_rope_fwd(AttnView x, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope) {
    rope_apply(x, B, T, nheads, hs, pos, pos0, rope, 0);
}
static void cu_rope_bwd(AttnView dx, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope) {
    rope_apply(dx, B, T, nheads, hs, pos, pos0, rope, 1);
}

// SwiGLU: gateup[n] holds gate[0..F) then up[0..F); one thread per (n, f), which reads the pair and
// writes out (forward) or both gradients (backward) of that pair only.
template <typename T> __global__ void swiglu_fwd_kernel(T *out, const T *gateup, int N, int F) {
    GRID_STRIDE(k, (size_t)N * F) {
        const size_t n = k / F, f = k % F;
        const float g = tof(gateup[n * 2 * F + f]), u = tof(gateup[n * 2 * F + F + f]);
        out[k] = fromf<T>(g / (1.0f + expf(-g)) * u);
    }
}

template <typename T> __global__ void swiglu_bwd_kernel(T *dgateup, const T *dout, const T *gateup, int N, int F) {
    GRID_STRIDE(k, (size_t)N * F) {
        const size_t n = k / F, f = k % F;
        const float g = tof(gateup[n * 2 * F + f]), u = tof(gateup[n * 2 * F + F + f]), dy = tof(dout[k]);
        const float s = 1.0f / (1.0f + expf(-g));
        dgateup[n * 2 * F + f] = fromf<T>(dy * u * s * (1.0f + g * (1.0f - s)));
        dgateup[n * 2 * F + F + f] = fromf<T>(dy * g * s);
    }
}

static void cu_swiglu_fwd(DType dt, void *out, const void *gateup, int N, int F) {
    const size_t n = (size_t)(N > 0 ? N : 0) * (F > 0 ? F : 0);
    if (n == 0) return;
    if (dt == DT_BF16)
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), swiglu_fwd_kernel<bf16s>)((bf16s *)out, (const bf16s *)gateup, N, F);
    else CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), swiglu_fwd_kernel<float>)((float *)out, (const float *)gateup, N, F);
    launched("swiglu_fwd_kernel");
}

static void cu_swiglu_bwd(DType dt, void *dgateup, const void *dout, const void *gateup, int N, int F) {
    const size_t n = (size_t)(N > 0 ? N : 0) * (F > 0 ? F : 0);
    if (n == 0) return;
    if (dt == DT_BF16)
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), swiglu_bwd_kernel<bf16s>)((bf16s *)dgateup, (const bf16s *)dout,
                                                                                        (const bf16s *)gateup, N, F);
    else
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), swiglu_bwd_kernel<float>)((float *)dgateup, (const float *)dout,
                                                                                        (const float *)gateup, N, F);
    launched("swiglu_bwd_kernel");
}

// ---------------------------------------------------------------------------------------------
// attention, flash style and simple: no T x T buffer. One warp per query row (forward, dq) or key row
// (dk, dv); each lane owns the head channels lane, lane+32, ... (at most ATT_MAXC per lane), and the
// scores are warp sums of the lanes' partial dot products in a fixed butterfly order. Keys (or queries)
// are visited in ascending order, with an online softmax in the forward, so every result has one fixed
// order of additions. Same semantics as the CPU's block ops (see kernels.h). These serve fp32, head
// sizes other than 64 and 128, and views the flash kernels (attention.cu) cannot load.
// Grouped-query attention: query head h reads kv head h / group in place (K and V are never copied per
// query head); a dK/dV row sums the group's query heads in head order. RoPE: q and k elements are
// rotated as they are read, from cos|sin tables of the block's positions (rope_table), and dq, dk are
// rotated back (the transposed rotation, through the warp's row in shared memory) before they are stored.

#define ATT_MAXC 8 // channels per lane: head sizes up to 256

struct AttView {
    int bf16;
    void *p;
    long long bstride, tstride;
};
static AttView att_view(AttnView v) {
    AttView a;
    a.bf16 = v.dt == DT_BF16;
    a.p = v.p;
    a.bstride = (long long)v.bstride;
    a.tstride = (long long)v.tstride;
    return a;
}
__device__ __forceinline__ long long att_off(const AttView &v, int b, int t, int h, int hs) {
    return b * v.bstride + t * v.tstride + (long long)h * hs;
}
__device__ __forceinline__ float att_ld(const AttView &v, long long i) {
    return v.bf16 ? tof(((const bf16s *)v.p)[i]) : ((const float *)v.p)[i];
}
__device__ __forceinline__ void att_st(const AttView &v, long long i, float x) {
    if (v.bf16) ((bf16s *)v.p)[i] = fromf<bf16s>(x);
    else ((float *)v.p)[i] = x;
}

struct AttShape {
    int B, NH, hs, Tq, q0, Tk, k0;
    float scale;
    int NKV, group;       // key/value heads, and query heads per kv head
    const float *rq, *rk; // RoPE cos|sin rows [Tq][hs] of the queries and [Tk][hs] of the keys; NULL: none
};

// element i of the row at off, rotated by the cos|sin row cs (NULL: as stored); kernels.h's rotation
__device__ __forceinline__ float att_ld_rot(const AttView &v, long long off, int i, int hs, const float *cs) {
    const float x = att_ld(v, off + i);
    if (!cs) return x;
    const int half = hs / 2;
    if (i < half) return x * cs[i] - att_ld(v, off + i + half) * cs[half + i];
    return x * cs[i - half] + att_ld(v, off + i - half) * cs[i];
}
__device__ __forceinline__ const float *att_rot_row(const float *tab, int t, int hs) {
    return tab ? tab + (long long)t * hs : NULL;
}
// The transposed rotation of a row whose channel lane + 32j is g[j] in each lane of the warp: through the
// warp's row sh[hs] in shared memory, since a channel's partner may live in another lane.
__device__ __forceinline__ void att_rot_t(float (&g)[ATT_MAXC], int hs, const float *cs, float *sh, int lane) {
    const int half = hs / 2;
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++)
        if (lane + 32 * j < hs) sh[lane + 32 * j] = g[j];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        const int i = lane + 32 * j;
        if (i < half) g[j] = sh[i] * cs[i] + sh[i + half] * cs[half + i];
        else if (i < hs) g[j] = sh[i] * cs[i - half] - sh[i - half] * cs[i];
    }
    __syncwarp(); // every lane has read sh before it is reused
}

// keys of the block visible to query t: s < Tk with k0 + s <= q0 + t
__device__ __forceinline__ int att_nvis(const AttShape &d, int t) {
    int n = d.q0 + t - d.k0 + 1;
    return n < d.Tk ? (n > 0 ? n : 0) : d.Tk;
}

__global__ void attention_fwd_kernel(AttView out, float *lse, AttView q, AttView k, AttView v, AttShape d, int merge) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= d.B * d.NH * d.Tq) return;
    int t = row % d.Tq, bh = row / d.Tq, b = bh / d.NH, h = bh % d.NH, hk = h / d.group;
    float qr[ATT_MAXC], acc[ATT_MAXC];
    long long qo = att_off(q, b, t, h, d.hs);
    const float *rq = att_rot_row(d.rq, t, d.hs);
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        int i = lane + 32 * j;
        qr[j] = i < d.hs ? att_ld_rot(q, qo, i, d.hs, rq) * d.scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int nvis = att_nvis(d, t);
    for (int s = 0; s < nvis; s++) {
        long long ko = att_off(k, b, s, hk, d.hs), vo = att_off(v, b, s, hk, d.hs);
        const float *rk = att_rot_row(d.rk, s, d.hs);
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_MAXC; j++) {
            int i = lane + 32 * j;
            if (i < d.hs) part += qr[j] * att_ld_rot(k, ko, i, d.hs, rk);
        }
        float sc = warp_sum(part);
        float mnew = fmaxf(m, sc), alpha = expf(m - mnew), p = expf(sc - mnew);
        l = l * alpha + p;
        m = mnew;
#pragma unroll
        for (int j = 0; j < ATT_MAXC; j++) {
            int i = lane + 32 * j;
            if (i < d.hs) acc[j] = acc[j] * alpha + p * att_ld(v, vo + i);
        }
    }
    float lb = l > 0.0f ? m + logf(l) : -INFINITY, inv = l > 0.0f ? 1.0f / l : 0.0f, wa = 0.0f, wb = 1.0f;
    long long li = (long long)bh * d.Tq + t, oo = att_off(out, b, t, h, d.hs);
    if (merge) { // log-sum-exp rule against what earlier blocks left
        float la = lse[li];
        __syncwarp(); // every lane has read the old lse before lane 0 replaces it below
        if (lb == -INFINITY) return;
        if (la != -INFINITY) {
            float mx = fmaxf(la, lb), lnew = mx + logf(expf(la - mx) + expf(lb - mx));
            wa = expf(la - lnew);
            wb = expf(lb - lnew);
            lb = lnew;
        }
    }
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        int i = lane + 32 * j;
        if (i < d.hs) {
            float o = acc[j] * inv;
            if (wa != 0.0f) o = att_ld(out, oo + i) * wa + o * wb;
            att_st(out, oo + i, o);
        }
    }
    if (lane == 0) lse[li] = lb;
}

// D[bh*Tq + t] = Σ_i dout·out over the row
__global__ void attention_rowdot_kernel(float *D, AttView dout, AttView out, AttShape d) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= d.B * d.NH * d.Tq) return;
    int t = row % d.Tq, bh = row / d.Tq, b = bh / d.NH, h = bh % d.NH;
    long long go = att_off(dout, b, t, h, d.hs), oo = att_off(out, b, t, h, d.hs);
    float part = 0.0f;
    for (int i = lane; i < d.hs; i += 32) part += att_ld(dout, go + i) * att_ld(out, oo + i);
    part = warp_sum(part);
    if (lane == 0) D[row] = part;
}

// dq of one query row: Σ over its visible keys in order
__global__ void attention_dq_kernel(AttView dq, int accumulate, AttView dout, const float *D, const float *lse, AttView q,
                                    AttView k, AttView v, AttShape d) {
    __shared__ float sh[8][32 * ATT_MAXC]; // one row per warp (RoPE's transposed rotation)
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= d.B * d.NH * d.Tq) return;
    int t = row % d.Tq, bh = row / d.Tq, b = bh / d.NH, h = bh % d.NH, hk = h / d.group;
    float qr[ATT_MAXC], gr[ATT_MAXC], acc[ATT_MAXC];
    long long qo = att_off(q, b, t, h, d.hs), go = att_off(dout, b, t, h, d.hs);
    const float *rq = att_rot_row(d.rq, t, d.hs);
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        int i = lane + 32 * j;
        qr[j] = i < d.hs ? att_ld_rot(q, qo, i, d.hs, rq) * d.scale : 0.0f;
        gr[j] = i < d.hs ? att_ld(dout, go + i) : 0.0f;
        acc[j] = 0.0f;
    }
    float L = lse[row], Dr = D[row];
    int nvis = L == -INFINITY ? 0 : att_nvis(d, t);
    for (int s = 0; s < nvis; s++) {
        long long ko = att_off(k, b, s, hk, d.hs), vo = att_off(v, b, s, hk, d.hs);
        const float *rk = att_rot_row(d.rk, s, d.hs);
        float kr[ATT_MAXC], ps = 0.0f, pd = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_MAXC; j++) {
            int i = lane + 32 * j;
            kr[j] = 0.0f;
            if (i < d.hs) {
                kr[j] = att_ld_rot(k, ko, i, d.hs, rk);
                ps += qr[j] * kr[j];
                pd += gr[j] * att_ld(v, vo + i);
            }
        }
        float p = expf(warp_sum(ps) - L), ds = p * (warp_sum(pd) - Dr);
#pragma unroll
        for (int j = 0; j < ATT_MAXC; j++) acc[j] += ds * kr[j];
    }
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) acc[j] *= d.scale;
    if (rq) att_rot_t(acc, d.hs, rq, sh[threadIdx.x >> 5], lane);
    long long oo = att_off(dq, b, t, h, d.hs);
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        int i = lane + 32 * j;
        if (i < d.hs) att_st(dq, oo + i, (accumulate ? att_ld(dq, oo + i) : 0.0f) + acc[j]);
    }
}

// dk and dv of one key row of kv head hk: Σ over the group's query heads in head order, and over the
// queries that see it in order
__global__ void attention_dkv_kernel(AttView dk, AttView dv, int accumulate, AttView dout, const float *D, const float *lse,
                                     AttView q, AttView k, AttView v, AttShape d) {
    __shared__ float sh[8][32 * ATT_MAXC]; // one row per warp (RoPE's transposed rotation)
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= d.B * d.NKV * d.Tk) return;
    int s = row % d.Tk, bk = row / d.Tk, b = bk / d.NKV, hk = bk % d.NKV;
    float kr[ATT_MAXC], vr[ATT_MAXC], ak[ATT_MAXC], av[ATT_MAXC];
    long long ko = att_off(k, b, s, hk, d.hs), vo = att_off(v, b, s, hk, d.hs);
    const float *rk = att_rot_row(d.rk, s, d.hs);
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        int i = lane + 32 * j;
        kr[j] = i < d.hs ? att_ld_rot(k, ko, i, d.hs, rk) : 0.0f;
        vr[j] = i < d.hs ? att_ld(v, vo + i) : 0.0f;
        ak[j] = av[j] = 0.0f;
    }
    int t0 = d.k0 + s - d.q0; // the first query that sees this key
    for (int h = hk * d.group; h < (hk + 1) * d.group; h++)
        for (int t = t0 > 0 ? t0 : 0; t < d.Tq; t++) {
            long long li = ((long long)b * d.NH + h) * d.Tq + t;
            float L = lse[li];
            if (L == -INFINITY) continue;
            long long qo = att_off(q, b, t, h, d.hs), go = att_off(dout, b, t, h, d.hs);
            const float *rq = att_rot_row(d.rq, t, d.hs);
            float qs[ATT_MAXC], ps = 0.0f, pd = 0.0f;
#pragma unroll
            for (int j = 0; j < ATT_MAXC; j++) {
                int i = lane + 32 * j;
                qs[j] = 0.0f;
                if (i < d.hs) {
                    qs[j] = att_ld_rot(q, qo, i, d.hs, rq);
                    ps += qs[j] * d.scale * kr[j];
                    pd += att_ld(dout, go + i) * vr[j];
                }
            }
            float p = expf(warp_sum(ps) - L), ds = p * (warp_sum(pd) - D[li]);
#pragma unroll
            for (int j = 0; j < ATT_MAXC; j++) {
                int i = lane + 32 * j;
                if (i < d.hs) {
                    av[j] += p * att_ld(dout, go + i);
                    ak[j] += ds * qs[j] * d.scale;
                }
            }
        }
    if (rk) att_rot_t(ak, d.hs, rk, sh[threadIdx.x >> 5], lane);
    long long dko = att_off(dk, b, s, hk, d.hs), dvo = att_off(dv, b, s, hk, d.hs);
#pragma unroll
    for (int j = 0; j < ATT_MAXC; j++) {
        int i = lane + 32 * j;
        if (i < d.hs) {
            att_st(dk, dko + i, (accumulate ? att_ld(dk, dko + i) : 0.0f) + ak[j]);
            att_st(dv, dvo + i, (accumulate ? att_ld(dv, dvo + i) : 0.0f) + av[j]);
        }
    }
}

static AttShape att_shape(int B, int NH, int NKV, int hs, int Tq, int q0, int Tk, int k0) {
    if (hs > 32 * ATT_MAXC) die("CUDA attention: head size %d above %d", hs, 32 * ATT_MAXC);
    if (NKV <= 0 || NH % NKV) die("attention: %d query heads do not share %d key/value heads evenly", NH, NKV);
    AttShape d = { B, NH, hs, Tq, q0, Tk, k0, 1.0f / sqrtf((float)hs), NKV, NH / NKV, NULL, NULL };
    return d;
}

// RoPE's cos|sin rows of the block's queries (positions q0..) and keys (k0..), in the RoPE scratch
static void att_rope_tables(AttShape *d, const RopeConfig *rope) {
    if (!rope) return;
    if (d->hs % 2) die("attention: RoPE needs an even head size (got %d)", d->hs);
    const size_t nq = (size_t)(d->Tq > 0 ? d->Tq : 0) * d->hs, nk = (size_t)(d->Tk > 0 ? d->Tk : 0) * d->hs;
    float *tab = (float *)scratch(SCR_ROPE, sizeof(float) * (nq + nk + 1));
    rope_table(rope, d->hs, NULL, d->q0, d->Tq, tab);
    rope_table(rope, d->hs, NULL, d->k0, d->Tk, tab + nq);
    d->rq = tab;
    d->rk = tab + nq;
}

// The flash kernels' arguments (attention.cu) for these views
static FaView fa_view(AttnView v) {
    FaView f = { v.p, (long long)v.bstride, (long long)v.tstride, v.dt == DT_F32 };
    return f;
}
static FaArgs fa_args(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, const AttShape &s) {
    FaArgs a;
    memset(&a, 0, sizeof a);
    a.q = fa_view(q);
    a.k = fa_view(k);
    a.v = fa_view(v);
    a.out = fa_view(out);
    a.lse = lse;
    FaShape d = { s.B, s.NH, s.hs, s.Tq > 0 ? s.Tq : 0, s.q0, s.Tk > 0 ? s.Tk : 0, s.k0 };
    a.d = d;
    a.group = s.group;
    a.rope_q = s.rq;
    a.rope_k = s.rk;
    return a;
}

// The block ops for NH query heads over NKV key/value heads, RoPE in the prologue when rope is not NULL
static void attn_fwd(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int Tq,
                     int q0, int Tk, int k0, const RopeConfig *rope, int merge) {
    if (B <= 0 || NH <= 0 || hs <= 0 || Tq <= 0) return;
    AttShape d = att_shape(B, NH, NKV, hs, Tq, q0, Tk, k0);
    att_rope_tables(&d, rope);
    if (!dev()->attn_simple) { // tensor cores where attention.cu takes the problem
        FaArgs a = fa_args(out, lse, q, k, v, d);
        a.merge = merge;
        if (fa_forward(&a, (void *)cur_stream()) == 0) {
            dev()->tc_calls++;
            return;
        }
    }
    size_t rows = (size_t)B * NH * Tq;
    CUDA_LAUNCH(cdiv(rows, 8), 256, 0, cur_stream(), attention_fwd_kernel)(att_view(out), lse, att_view(q), att_view(k), att_view(v), d, merge);
    launched("attention_fwd_kernel");
}

static void attn_bwd(AttnView dq, AttnView dk, AttnView dv, int accumulate, AttnView dout, AttnView out, const float *lse,
                     AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int Tq, int q0, int Tk, int k0,
                     const RopeConfig *rope) {
    if (B <= 0 || NH <= 0 || hs <= 0) return;
    AttShape d = att_shape(B, NH, NKV, hs, Tq, q0, Tk, k0);
    att_rope_tables(&d, rope);
    size_t qrows = (size_t)B * NH * (Tq > 0 ? Tq : 0), krows = (size_t)B * NKV * (Tk > 0 ? Tk : 0);
    float *D = (float *)scratch(SCR_ATTN, sizeof(float) * (qrows ? qrows : 1));
    if (qrows) { // D = rowsum(dout·out), used by both paths
        CUDA_LAUNCH(cdiv(qrows, 8), 256, 0, cur_stream(), attention_rowdot_kernel)(D, att_view(dout), att_view(out), d);
        launched("attention_rowdot_kernel");
    }
    if (!dev()->attn_simple) {
        FaArgs a = fa_args(out, (float *)lse, q, k, v, d);
        a.dout = fa_view(dout);
        a.dq = fa_view(dq);
        a.dk = fa_view(dk);
        a.dv = fa_view(dv);
        a.D = D;
        a.accumulate = accumulate;
        if (fa_backward(&a, (void *)cur_stream()) == 0) {
            dev()->tc_calls++;
            return;
        }
    }
    if (qrows) {
        CUDA_LAUNCH(cdiv(qrows, 8), 256, 0, cur_stream(), attention_dq_kernel)(att_view(dq), accumulate, att_view(dout), D, lse, att_view(q),
                                                     att_view(k), att_view(v), d);
        launched("attention_dq_kernel");
    }
    if (krows) {
        CUDA_LAUNCH(cdiv(krows, 8), 256, 0, cur_stream(), attention_dkv_kernel)(att_view(dk), att_view(dv), accumulate, att_view(dout), D, lse,
                                                      att_view(q), att_view(k), att_view(v), d);
        launched("attention_dkv_kernel");
    }
}

static void cu_attention_block_fwd(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int hs,
                                   int Tq, int q0, int Tk, int k0, int merge) {
    attn_fwd(out, lse, q, k, v, B, NH, NH, hs, Tq, q0, Tk, k0, NULL, merge);
}

static void cu_attention_block_bwd(AttnView dq, AttnView dk, AttnView dv, AttnView dout, AttnView out, const float *lse,
                                   AttnView q, AttnView k, AttnView v, int B, int NH, int hs, int Tq, int q0, int Tk,
                                   int k0) {
    attn_bwd(dq, dk, dv, 1, dout, out, lse, q, k, v, B, NH, NH, hs, Tq, q0, Tk, k0, NULL);
}

static void cu_attention_gqa_block_fwd(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int NKV,
                                       int hs, int Tq, int q0, int Tk, int k0, const RopeConfig *rope, int merge) {
    attn_fwd(out, lse, q, k, v, B, NH, NKV, hs, Tq, q0, Tk, k0, rope, merge);
}

static void cu_attention_gqa_block_bwd(AttnView dq, AttnView dk, AttnView dv, AttnView dout, AttnView out, const float *lse,
                                       AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int Tq, int q0,
                                       int Tk, int k0, const RopeConfig *rope) {
    attn_bwd(dq, dk, dv, 1, dout, out, lse, q, k, v, B, NH, NKV, hs, Tq, q0, Tk, k0, rope);
}

static void cu_attention_fwd(DType dt, void *out, float *lse, const void *qkv, int B, int T, int C, int NH) {
    if (NH <= 0) return;
    attn_fwd(btc_view(dt, out, T, C), lse, qkv_view(dt, qkv, 0, T, C), qkv_view(dt, qkv, 1, T, C),
             qkv_view(dt, qkv, 2, T, C), B, NH, NH, C / NH, T, 0, T, 0, NULL, 0);
}

static void cu_attention_bwd(DType dt, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                             int B, int T, int C, int NH) {
    if (NH <= 0) return;
    attn_bwd(qkv_view(dt, dqkv, 0, T, C), qkv_view(dt, dqkv, 1, T, C), qkv_view(dt, dqkv, 2, T, C), 0,
             btc_view(dt, dout, T, C), btc_view(dt, out, T, C), lse, qkv_view(dt, qkv, 0, T, C),
             qkv_view(dt, qkv, 1, T, C), qkv_view(dt, qkv, 2, T, C), B, NH, NH, C / NH, T, 0, T, 0, NULL);
}

static void cu_attention_gqa_fwd(DType dt, void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV, int hs,
                                 const RopeConfig *rope) {
    attn_fwd(btc_view(dt, out, T, NH * hs), lse, gqa_view(dt, qkv, 0, T, NH, NKV, hs), gqa_view(dt, qkv, 1, T, NH, NKV, hs),
             gqa_view(dt, qkv, 2, T, NH, NKV, hs), B, NH, NKV, hs, T, 0, T, 0, rope, 0);
}

static void cu_attention_gqa_bwd(DType dt, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                 int B, int T, int NH, int NKV, int hs, const RopeConfig *rope) {
    attn_bwd(gqa_view(dt, dqkv, 0, T, NH, NKV, hs), gqa_view(dt, dqkv, 1, T, NH, NKV, hs),
             gqa_view(dt, dqkv, 2, T, NH, NKV, hs), 0, btc_view(dt, dout, T, NH * hs), btc_view(dt, out, T, NH * hs), lse,
             gqa_view(dt, qkv, 0, T, NH, NKV, hs), gqa_view(dt, qkv, 1, T, NH, NKV, hs),
             gqa_view(dt, qkv, 2, T, NH, NKV, hs), B, NH, NKV, hs, T, 0, T, 0, rope);
}

// ---------------------------------------------------------------------------------------------
// residual

template <typename T> __global__ void residual_fwd_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = fromf<T>(tof(a[i]) + tof(b[i]));
}

template <typename T> __global__ void residual_bwd_kernel(T *dst, const T *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = fromf<T>(tof(dst[i]) + tof(src[i]));
}

static void cu_residual_fwd(DType dt, void *out, const void *a, const void *b, size_t n) {
    if (n == 0) return;
    if (dt == DT_BF16)
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), residual_fwd_kernel<bf16s>)((bf16s *)out, (const bf16s *)a, (const bf16s *)b, n);
    else
        CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), residual_fwd_kernel<float>)((float *)out, (const float *)a, (const float *)b, n);
    launched("residual_fwd_kernel");
}

static void cu_residual_bwd(DType dt, void *dst, const void *src, size_t n) {
    if (n == 0) return;
    if (dt == DT_BF16) CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), residual_bwd_kernel<bf16s>)((bf16s *)dst, (const bf16s *)src, n);
    else CUDA_LAUNCH(ew_blocks(n, 256), 256, 0, cur_stream(), residual_bwd_kernel<float>)((float *)dst, (const float *)src, n);
    launched("residual_bwd_kernel");
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy over a vocabulary slice: logits[N, Vloc] hold columns vstart.. of the padded
// vocabulary, of which the first vreal are real. One block per row.

#define CE_THREADS 512

// Per row: max and Σ exp(x - max) over the real local columns (-inf and 0 when there are none), and the
// target's logit when this slice holds it (else 0).
template <typename T> __device__ void ce_row_stats(const T *x, int vreal, float *sh, float *m_out, float *s_out) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < vreal; j += blockDim.x) {
        float v = tof(x[j]);
        if (v > m) m = v; // NaNs are ignored by the max, as on the CPU
    }
    m = block_max(m, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < vreal; j += blockDim.x) s += expf(tof(x[j]) - m);
    *s_out = block_sum(s, sh);
    *m_out = m;
}

template <typename T>
__global__ void crossentropy_stats_kernel(float *rowmax, float *rowsum, float *target, const T *logits,
                                          const int32_t *targets, int vstart, int vreal, int Vloc) {
    __shared__ float sh[32];
    int n = blockIdx.x;
    const T *x = logits + (size_t)n * Vloc;
    float m, s;
    ce_row_stats(x, vreal, sh, &m, &s);
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
__device__ void ce_row_grad(T *d, const T *x, long long tj, float mx, float gsum, float dloss, int vreal, int Vloc) {
    float inv = 1.0f / gsum;
    int vr = vreal < Vloc ? vreal : Vloc;
    for (int j = threadIdx.x; j < vr; j += blockDim.x) {
        float p = expf(tof(x[j]) - mx) * inv;
        d[j] = fromf<T>((p - (j == tj ? 1.0f : 0.0f)) * dloss);
    }
    for (int j = (vr > 0 ? vr : 0) + threadIdx.x; j < Vloc; j += blockDim.x) d[j] = fromf<T>(0.0f);
}

template <typename T>
__global__ void crossentropy_bwd_kernel(T *dlogits, const T *logits, const int32_t *targets, const float *gmax,
                                        const float *gsum, float dloss, int vstart, int vreal, int Vloc) {
    int n = blockIdx.x;
    ce_row_grad(dlogits + (size_t)n * Vloc, logits + (size_t)n * Vloc, (long long)targets[n] - vstart, gmax[n], gsum[n],
                dloss, vreal, Vloc);
}

// Both in one pass over a row (one block): the row is read for the statistics (the block reductions end
// with a barrier, so every read precedes the first write when dlogits aliases logits), then rewritten.
template <typename T>
__global__ void crossentropy_fused_kernel(T *dlogits, float *rowmax, float *rowsum, float *target, const T *logits,
                                          const int32_t *targets, float dloss, int vreal, int Vloc) {
    __shared__ float sh[32];
    int n = blockIdx.x;
    const T *x = logits + (size_t)n * Vloc;
    long long tj = targets[n];
    float tv = (tj >= 0 && tj < vreal) ? tof(x[tj]) : 0.0f, m, s;
    ce_row_stats(x, vreal, sh, &m, &s);
    if (threadIdx.x == 0) {
        rowmax[n] = m;
        rowsum[n] = s;
        target[n] = tv;
    }
    ce_row_grad(dlogits + (size_t)n * Vloc, x, tj, m, s, dloss, vreal, Vloc);
}

static void cu_crossentropy_stats(DType dt, float *rowmax, float *rowsum, float *target, const void *logits,
                                  const int32_t *targets, int N, int vstart, int vreal, int Vloc) {
    if (N <= 0) return;
    if (vreal > Vloc) vreal = Vloc;
    if (dt == DT_BF16)
        CUDA_LAUNCH(N, CE_THREADS, 0, cur_stream(), crossentropy_stats_kernel<bf16s>)(rowmax, rowsum, target, (const bf16s *)logits, targets,
                                                            vstart, vreal, Vloc);
    else
        CUDA_LAUNCH(N, CE_THREADS, 0, cur_stream(), crossentropy_stats_kernel<float>)(rowmax, rowsum, target, (const float *)logits, targets,
                                                            vstart, vreal, Vloc);
    launched("crossentropy_stats_kernel");
}

static void cu_crossentropy_fused(DType dt, void *dlogits, float *rowmax, float *rowsum, float *target, const void *logits,
                                  const int32_t *targets, float dloss, int N, int vreal, int Vloc) {
    if (N <= 0 || Vloc <= 0) return;
    if (vreal > Vloc) vreal = Vloc;
    if (dt == DT_BF16)
        CUDA_LAUNCH(N, CE_THREADS, 0, cur_stream(), crossentropy_fused_kernel<bf16s>)((bf16s *)dlogits, rowmax, rowsum, target,
                                                            (const bf16s *)logits, targets, dloss, vreal, Vloc);
    else
        CUDA_LAUNCH(N, CE_THREADS, 0, cur_stream(), crossentropy_fused_kernel<float>)((float *)dlogits, rowmax, rowsum, target,
                                                            (const float *)logits, targets, dloss, vreal, Vloc);
    launched("crossentropy_fused_kernel");
}

static void cu_crossentropy_bwd(DType dt, void *dlogits, const void *logits, const int32_t *targets, const float *gmax,
                                const float *gsum, float dloss, int N, int vstart, int vreal, int Vloc) {
    if (N <= 0 || Vloc <= 0) return;
    if (dt == DT_BF16)
        CUDA_LAUNCH(N, CE_THREADS, 0, cur_stream(), crossentropy_bwd_kernel<bf16s>)((bf16s *)dlogits, (const bf16s *)logits, targets, gmax, gsum,
                                                          dloss, vstart, vreal, Vloc);
    else
        CUDA_LAUNCH(N, CE_THREADS, 0, cur_stream(), crossentropy_bwd_kernel<float>)((float *)dlogits, (const float *)logits, targets, gmax, gsum,
                                                          dloss, vstart, vreal, Vloc);
    launched("crossentropy_bwd_kernel");
}

// ---------------------------------------------------------------------------------------------
// optimizer, norms, casts

// AdamW over every segment in one launch: the segments and fixed chunks of them (work items) are
// copied to the device, and block i updates item i; each element's update is independent.
#define ADAMW_CHUNK 16384

struct AdamWItem {
    int seg;
    size_t start;
};

template <typename T>
__global__ void adamw_kernel(const AdamWSegment *segs, const AdamWItem *items, float lr, float beta1, float beta2,
                             float eps, float bc1, float bc2, float grad_scale) {
    AdamWItem it = items[blockIdx.x];
    const AdamWSegment sg = segs[it.seg];
    size_t end = it.start + ADAMW_CHUNK < sg.n ? it.start + ADAMW_CHUNK : sg.n;
    float decay = 1.0f - lr * sg.weight_decay;
    for (size_t i = it.start + threadIdx.x; i < end; i += blockDim.x) {
        float g = sg.grad[i] * grad_scale;
        float mi = beta1 * sg.m[i] + (1.0f - beta1) * g;
        float vi = beta2 * sg.v[i] + (1.0f - beta2) * g * g;
        sg.m[i] = mi;
        sg.v[i] = vi;
        float p = sg.master[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        sg.master[i] = p;
        if (sg.working) ((T *)sg.working)[i] = fromf<T>(p);
    }
}

static void cu_adamw(DType dt, const AdamWSegment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                     float bc1, float bc2, float grad_scale) {
    size_t nitems = 0;
    for (int s = 0; s < nsegs; s++) nitems += (segs[s].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
    if (nitems == 0) return;
    if (nitems > 0x7fffffffu) die("CUDA adamw: too many elements");
    size_t seg_bytes = sizeof(AdamWSegment) * (size_t)nsegs, bytes = seg_bytes + sizeof(AdamWItem) * nitems;
    char *host = (char *)xmalloc(bytes);
    memcpy(host, segs, seg_bytes);
    AdamWItem *items = (AdamWItem *)(host + seg_bytes);
    size_t it = 0;
    for (int s = 0; s < nsegs; s++)
        for (size_t i = 0; i < segs[s].n; i += ADAMW_CHUNK) items[it++] = AdamWItem{ s, i };
    char *dev_items = (char *)scratch(SCR_ADAMW, bytes);
    upload(dev_items, host, bytes); // queued before the kernel on the same stream; no wait
    free(host);
    const AdamWSegment *dsegs = (const AdamWSegment *)dev_items;
    const AdamWItem *ditems = (const AdamWItem *)(dev_items + seg_bytes);
    if (dt == DT_BF16)
        CUDA_LAUNCH((unsigned)nitems, 256, 0, cur_stream(), adamw_kernel<bf16s>)(dsegs, ditems, lr, beta1, beta2, eps, bc1, bc2, grad_scale);
    else CUDA_LAUNCH((unsigned)nitems, 256, 0, cur_stream(), adamw_kernel<float>)(dsegs, ditems, lr, beta1, beta2, eps, bc1, bc2, grad_scale);
    launched("adamw_kernel");
}

// Σ x² in double: one block per fixed chunk of SUMSQ_CHUNK elements (each thread strides the chunk, then a
// fixed shared-memory tree), then one thread adds the chunk partials in chunk order and adds the total to
// *acc. Same chunking as the CPU; sumsq is sumsq_acc into a zeroed double, read back.
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

__global__ void sumsq_finish_kernel(double *acc, const double *partial, size_t nchunks) {
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += partial[c];
    *acc += total;
}

static void cu_sumsq_acc(double *acc, const float *x, size_t n) {
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunks == 0) return;
    if (nchunks > 0x7fffffffu) die("CUDA sumsq: tensor too large (%zu elements)", n);
    double *partial = (double *)scratch(SCR_SUMSQ, sizeof(double) * (nchunks + 1));
    CUDA_LAUNCH((unsigned)nchunks, SUMSQ_THREADS, 0, cur_stream(), sumsq_kernel)(partial, x, n);
    launched("sumsq_kernel");
    CUDA_LAUNCH(1, 1, 0, cur_stream(), sumsq_finish_kernel)(acc, partial, nchunks);
    launched("sumsq_finish_kernel");
}

static double cu_sumsq(const float *x, size_t n) {
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunks == 0) return 0.0;
    // the total goes to the slot after the partials, then back to the host
    double *acc = (double *)scratch(SCR_SUMSQ, sizeof(double) * (nchunks + 1)) + nchunks, total = 0.0;
    CK(cudaMemsetAsync, (acc, 0, sizeof(double), cur_stream()));
    cu_sumsq_acc(acc, x, n);
    cu_to_host(&total, acc, sizeof total);
    return total;
}

template <typename TD, typename TS> __global__ void cast_kernel(TD *dst, const TS *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = fromf<TD>(tof(src[i]));
}

static void cu_cast(void *dst, DType dst_dt, const void *src, DType src_dt, size_t n) {
    if (n == 0) return;
    unsigned blocks = ew_blocks(n, 256);
    if (dst_dt == DT_BF16 && src_dt == DT_BF16) CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_kernel<bf16s, bf16s>)((bf16s *)dst, (const bf16s *)src, n);
    else if (dst_dt == DT_BF16) CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_kernel<bf16s, float>)((bf16s *)dst, (const float *)src, n);
    else if (src_dt == DT_BF16) CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_kernel<float, bf16s>)((float *)dst, (const bf16s *)src, n);
    else CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_kernel<float, float>)((float *)dst, (const float *)src, n);
    launched("cast_kernel");
}

template <typename TD, typename TS>
__global__ void cast_rows_kernel(TD *dst, size_t dst_stride, const TS *src, size_t src_stride, size_t rows, size_t n) {
    GRID_STRIDE(i, rows * n) {
        size_t r = i / n, c = i % n;
        dst[r * dst_stride + c] = fromf<TD>(tof(src[r * src_stride + c]));
    }
}

static void cu_cast_rows(void *dst, DType dst_dt, size_t dst_stride, const void *src, DType src_dt, size_t src_stride,
                         size_t rows, size_t n) {
    if (rows == 0 || n == 0) return;
    unsigned blocks = ew_blocks(rows * n, 256);
    if (dst_dt == DT_BF16 && src_dt == DT_BF16)
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_rows_kernel<bf16s, bf16s>)((bf16s *)dst, dst_stride, (const bf16s *)src, src_stride, rows, n);
    else if (dst_dt == DT_BF16)
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_rows_kernel<bf16s, float>)((bf16s *)dst, dst_stride, (const float *)src, src_stride, rows, n);
    else if (src_dt == DT_BF16)
        CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_rows_kernel<float, bf16s>)((float *)dst, dst_stride, (const bf16s *)src, src_stride, rows, n);
    else CUDA_LAUNCH(blocks, 256, 0, cur_stream(), cast_rows_kernel<float, float>)((float *)dst, dst_stride, (const float *)src, src_stride, rows, n);
    launched("cast_rows_kernel");
}

// ---------------------------------------------------------------------------------------------
// the table

static Backend CUDA_BACKEND;

// cudaGetDeviceCount initialises the driver but creates no context on any device: a rank can count the
// devices before it chooses its own.
extern "C" int cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

// Why cuda_device_count() is 0, in words for an error line: a driver older than this build's CUDA
// runtime is not the same as no GPU at all.
extern "C" void cuda_unavailable_reason(char *buf, size_t cap) {
    int n = 0, drv = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (e == cudaErrorInsufficientDriver) {
        if (cudaDriverGetVersion(&drv) != cudaSuccess) (void)cudaGetLastError(), drv = 0;
        if (drv > 0)
            snprintf(buf, cap, "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d this binary was built with: "
                     "install a driver for CUDA %d.%d or later", drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000,
                     CUDART_VERSION % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        else // cudaDriverGetVersion gives 0 when no driver is installed at all
            snprintf(buf, cap, "no CUDA device is available (no NVIDIA driver is installed)");
    } else if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        snprintf(buf, cap, "no CUDA device is available");
    } else if (e != cudaSuccess) {
        snprintf(buf, cap, "no CUDA device is available (%s)", cudaGetErrorString(e));
    } else {
        snprintf(buf, cap, "%d CUDA device(s) available", n);
    }
}

extern "C" void cuda_use_device(int ordinal) {
    if (g_cu.ready) {
        if (g_cu.ordinal != ordinal)
            die("CUDA device %d chosen after this process started using device %d", ordinal, g_cu.ordinal);
        return;
    }
    dev_init(ordinal);
}

extern "C" void *cuda_stream_handle(StreamId s) { return (void *)dev()->stream[backend_stream_check((int)s, "stream handle")]; }

// Test hooks (test/test_cuda.c; not in kernels.h): force the SIMT GEMM's tile size (64 or 128; 0
// automatic), the GEMM (-1 SIMT only, 0 the best tensor-core kernel, GEMM_KERNEL_MMA or _WGMMA), the
// simple attention kernels (1), and read how often scratch grew and how many ops ran on tensor cores. Results do not depend on the SIMT
// tile; the tests check exactly that.
extern "C" void cuda_set_gemm_tile(int tile) { dev()->gemm_tile = tile; }
extern "C" void cuda_set_gemm_kernel(int kernel) { dev()->gemm_kernel = kernel; }
extern "C" void cuda_set_attention_simple(int simple) { dev()->attn_simple = simple; }
extern "C" long long cuda_scratch_grows(void) { return dev()->grows; }
extern "C" long long cuda_tc_calls(void) { return dev()->tc_calls; }
// The GEMM kernel a bf16 matmul runs now (0 none: the SIMT GEMM), for the tests' names.
extern "C" int cuda_gemm_kernel(void) {
    CudaDev *d = dev();
    return d->gemm_kernel < 0 ? 0 : (int)gemm_available((GemmKernel)d->gemm_kernel);
}

static void fill_table(Backend *b) {
    b->name = "cuda";
    b->mem_kind = MEMKIND_DEVICE;
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->to_device = cu_to_device;
    b->to_host = cu_to_host;
    b->copy = cu_copy;
    b->zero = cu_zero;
    b->sync = cu_sync;
    b->set_threads = cu_set_threads;
    b->scratch_bytes = cu_scratch_bytes;
    b->encoder_fwd = cu_encoder_fwd;
    b->encoder_bwd = cu_encoder_bwd;
    b->layernorm_fwd = cu_layernorm_fwd;
    b->residual_layernorm_fwd = cu_residual_layernorm_fwd;
    b->layernorm_bwd = cu_layernorm_bwd;
    b->matmul_fwd = cu_matmul_fwd;
    b->matmul_bwd = cu_matmul_bwd;
    b->gelu_fwd = cu_gelu_fwd;
    b->attention_fwd = cu_attention_fwd;
    b->attention_bwd = cu_attention_bwd;
    b->attention_block_fwd = cu_attention_block_fwd;
    b->attention_block_bwd = cu_attention_block_bwd;
    b->rmsnorm_fwd = cu_rmsnorm_fwd;
    b->residual_rmsnorm_fwd = cu_residual_rmsnorm_fwd;
    b->rmsnorm_bwd = cu_rmsnorm_bwd;
    b->rope_fwd = cu_rope_fwd;
    b->rope_bwd = cu_rope_bwd;
    b->swiglu_fwd = cu_swiglu_fwd;
    b->swiglu_bwd = cu_swiglu_bwd;
    b->attention_gqa_block_fwd = cu_attention_gqa_block_fwd;
    b->attention_gqa_block_bwd = cu_attention_gqa_block_bwd;
    b->attention_gqa_fwd = cu_attention_gqa_fwd;
    b->attention_gqa_bwd = cu_attention_gqa_bwd;
    b->residual_fwd = cu_residual_fwd;
    b->residual_bwd = cu_residual_bwd;
    b->crossentropy_stats = cu_crossentropy_stats;
    b->crossentropy_bwd = cu_crossentropy_bwd;
    b->crossentropy_fused = cu_crossentropy_fused;
    b->adamw = cu_adamw;
    b->sumsq = cu_sumsq;
    b->sumsq_acc = cu_sumsq_acc;
    b->cast = cu_cast;
    b->cast_rows = cu_cast_rows;
    b->set_stream = cu_set_stream;
    b->event_create = cu_event_create;
    b->event_destroy = cu_event_destroy;
    b->event_record = cu_event_record;
    b->stream_wait = cu_stream_wait;
    b->event_sync = cu_event_sync;
    b->event_done = cu_event_done;
}

// The table only: no CUDA call, so no context appears on any device before the rank has chosen its own
// (cuda_use_device), and a binary without a device still gets the table (the caller checks
// cuda_device_count and reports; any op would fail with a CUDA error).
extern "C" const Backend *backend_cuda(void) {
    if (!CUDA_BACKEND.name) fill_table(&CUDA_BACKEND);
    return &CUDA_BACKEND;
}

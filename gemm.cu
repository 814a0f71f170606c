// gemm.cu: bf16 GEMMs on tensor cores, fp32 accumulation, fused epilogues (the contract is in gemm.h).
//
// Two kernels, chosen at run time by the device (gemm_pick_kernel):
//  - gemm_mma_kernel (sm_80 and later): 128x128x32 block tiles, 8 warps of 64x32, mma.sync m16n8k16
//    fed by ldmatrix (.trans for operands stored m- or n-major), a 4-stage cp.async pipeline into
//    XOR-swizzled shared memory, zero-filled loads at the edges.
//  - gemm_wgmma_kernel (sm_90a, Hopper): 128x256x64 tiles, a 4-stage pipeline of TMA loads
//    (cp.async.bulk.tensor, 128-byte swizzle) completing on mbarriers, one producer warpgroup (one
//    thread issues the copies; setmaxnreg gives its registers away) and two consumer warpgroups that
//    each multiply 64 rows with wgmma m64n256k16 straight from shared memory; persistent: one block
//    per multiprocessor walks the tiles (gemm_tile_coords order).
// Every inline PTX statement (cp.async, ldmatrix, mma.sync, shared with attention.cu, and the sm_90a
// mbarrier, TMA, wgmma and setmaxnreg) is a wrapper in common.cuh.
// Both hand their fp32 sums to one epilogue (epi_pair). Split-K (few output tiles, long K) writes fp32
// partial sums to the caller's workspace and gemm_splitk_reduce_kernel adds them in split order, then
// runs the same epilogue. Edges: any M, N, K; loads outside the matrices read zeros (cp.async's
// src-size, TMA's out-of-bounds fill) and stores are predicated.
//
// The TMA descriptors (CUtensorMap) are built on the host by cuTensorMapEncodeTiled, which is reached
// through the runtime's cudaGetDriverEntryPointByVersion so that nothing links libcuda directly (the
// unversioned cudaGetDriverEntryPoint is deprecated in CUDA 13).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

extern "C" {
#include "common.h"
#include "gemm.h"
}
#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// epilogue

struct EpiArgs {
    void *C;
    long long ldc;
    int store; // GemmStore
    const uint16_t *bias, *dgelu_in, *residual;
    uint16_t *pre_gelu;
    int gelu;
    int M, N;
    float *ws;               // split-K partial sums [split][M][ws_ld]; NULL: finish in the kernel
    long long ws_ld, ws_split;
};

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
// round to nearest even, NaN stays a quiet NaN: f32_to_bf16 of kernels.h
__device__ __forceinline__ uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

#define GELU_K 0.7978845608028654f // sqrt(2/pi); the formulas are kernels_cpu.c's
__device__ __forceinline__ float gelu_f(float x) { return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))); }
__device__ __forceinline__ float gelu_grad_f(float x) {
    float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

// two adjacent bf16 values at p (4-byte aligned when two)
__device__ __forceinline__ void load_bf2(const uint16_t *p, bool two, float &a, float &b) {
    if (two) {
        uint32_t w = *reinterpret_cast<const uint32_t *>(p);
        a = bf2f((uint16_t)(w & 0xffffu));
        b = bf2f((uint16_t)(w >> 16));
    } else {
        a = bf2f(p[0]);
        b = 0.0f;
    }
}
__device__ __forceinline__ void store_bf2(uint16_t *p, bool two, float a, float b) {
    if (two) *reinterpret_cast<uint32_t *>(p) = (uint32_t)f2bf(a) | (uint32_t)f2bf(b) << 16;
    else p[0] = f2bf(a);
}

// The epilogue of gemm.h for columns col and col+1 (the second only when two) of one row.
__device__ __forceinline__ void epi_finish(const EpiArgs &e, int row, int col, bool two, float v0, float v1) {
    const bool bf = e.store == GEMM_STORE_BF16;
    const size_t off = (size_t)row * e.ldc + col;
    if (e.bias) {
        v0 += bf2f(e.bias[col]);
        if (two) v1 += bf2f(e.bias[col + 1]);
    }
    if (e.gelu) {
        if (bf) v0 = round_bf(v0), v1 = round_bf(v1);
        if (e.pre_gelu) store_bf2(e.pre_gelu + off, two, v0, v1);
        v0 = gelu_f(v0);
        v1 = gelu_f(v1);
    }
    if (e.dgelu_in) {
        float x0, x1;
        load_bf2(e.dgelu_in + off, two, x0, x1);
        if (bf) v0 = round_bf(v0), v1 = round_bf(v1);
        v0 *= gelu_grad_f(x0);
        v1 *= gelu_grad_f(x1);
    }
    if (e.residual) {
        float r0, r1;
        load_bf2(e.residual + off, two, r0, r1);
        if (bf) v0 = round_bf(v0), v1 = round_bf(v1);
        v0 += r0;
        v1 += r1;
    }
    if (bf) {
        store_bf2((uint16_t *)e.C + off, two, v0, v1);
    } else {
        float *c = (float *)e.C + off;
        if (two) {
            float2 *c2 = reinterpret_cast<float2 *>(c);
            if (e.store == GEMM_ACCUM_F32) {
                float2 old = *c2;
                v0 += old.x;
                v1 += old.y;
            }
            *c2 = make_float2(v0, v1);
        } else {
            c[0] = e.store == GEMM_ACCUM_F32 ? c[0] + v0 : v0;
        }
    }
}

// The sums of columns col, col+1 of one row from split `split`: to the workspace, or finished.
__device__ __forceinline__ void epi_pair(const EpiArgs &e, int split, int row, int col, float v0, float v1) {
    if (row >= e.M || col >= e.N) return;
    const bool two = col + 1 < e.N;
    if (e.ws) {
        float *w = e.ws + split * e.ws_split + (size_t)row * e.ws_ld + col;
        if (two) *reinterpret_cast<float2 *>(w) = make_float2(v0, v1);
        else w[0] = v0;
        return;
    }
    epi_finish(e, row, col, two, v0, v1);
}

// Adds the splits' partial sums in split order and runs the epilogue: one thread per column pair.
__global__ void gemm_splitk_reduce_kernel(const EpiArgs e, int splits) {
    const long long pairs_per_row = (e.N + 1) / 2, total = (long long)e.M * pairs_per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        int row = (int)(i / pairs_per_row), col = (int)(i % pairs_per_row) * 2;
        bool two = col + 1 < e.N;
        const float *w = e.ws + (size_t)row * e.ws_ld + col;
        float v0 = 0.0f, v1 = 0.0f;
        for (int s = 0; s < splits; s++, w += e.ws_split) {
            if (two) {
                float2 p = *reinterpret_cast<const float2 *>(w);
                v0 += p.x;
                v1 += p.y;
            } else {
                v0 += w[0];
            }
        }
        epi_finish(e, row, col, two, v0, v1);
    }
}

// ---------------------------------------------------------------------------------------------
// the work list shared by both kernels: unit u is split u / tiles of tile u % tiles

struct TileWork {
    int M, N, K;
    int tiles_m, tiles_n, k_tiles, splits, kt_per_split;
    long long tiles, units;
};

struct Unit {
    int m0, n0, split, kt0, kt1;
};

__device__ __forceinline__ Unit unit_of(const TileWork &w, long long u, int bm, int bn) {
    Unit r;
    long long tile = u % w.tiles;
    r.split = (int)(u / w.tiles);
    int tm, tn;
    gemm_tile_coords(tile, w.tiles_m, w.tiles_n, &tm, &tn);
    r.m0 = tm * bm;
    r.n0 = tn * bn;
    r.kt0 = r.split * w.kt_per_split;
    r.kt1 = min(r.kt0 + w.kt_per_split, w.k_tiles);
    return r;
}

// ---------------------------------------------------------------------------------------------
// sm_80: mma.sync + ldmatrix + cp.async

struct MmaArgs {
    const uint16_t *A, *B;
    long long lda, ldb;
    TileWork w;
    EpiArgs e;
};

// One operand's BK-deep slice of a tile into shared memory, 16 bytes per cp.async. k-major: EXT rows
// (m or n) of BK k's = 4 chunks; otherwise BK rows (k) of EXT values = EXT/8 chunks.
template <bool KMAJOR, int EXT>
__device__ __forceinline__ void mma_load_tile(uint32_t dst, const uint16_t *g, long long ld, int mn0, int mn_end, int k0,
                                              int K, int tid) {
    constexpr int BK = GEMM_MMA_BK, CHUNKS = EXT * BK / 8, PER = CHUNKS / GEMM_MMA_THREADS;
    static_assert(CHUNKS % GEMM_MMA_THREADS == 0, "tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int q = tid + i * GEMM_MMA_THREADS;
        int row, chunk, bytes, cpr;
        size_t goff;
        if (KMAJOR) {
            cpr = BK / 8;
            row = q / cpr;
            chunk = q % cpr;
            int gmn = mn0 + row, gk = k0 + chunk * 8, n = min(max(K - gk, 0), 8);
            bytes = gmn < mn_end ? n * 2 : 0;
            goff = (size_t)gmn * ld + gk;
        } else {
            cpr = EXT / 8;
            row = q / cpr;
            chunk = q % cpr;
            int gk = k0 + row, gmn = mn0 + chunk * 8, n = min(max(mn_end - gmn, 0), 8);
            bytes = gk < K ? n * 2 : 0;
            goff = (size_t)gk * ld + gmn;
        }
        cp_async16(dst + (uint32_t)(row * cpr + gemm_swizzle_chunk(row, chunk, cpr)) * 16u, bytes ? g + goff : g, bytes);
    }
}

// Epilogue staging tile: rows of BN floats padded by 8, so that the accumulator fragments' 8-byte
// stores (8 rows x 4 lanes per half-warp) hit 32 different banks.
enum {
    MMA_EPI_LD = GEMM_MMA_BN + 8,
    MMA_PIPE_SMEM = GEMM_MMA_STAGES * (GEMM_MMA_BM + GEMM_MMA_BN) * GEMM_MMA_BK * 2,
    MMA_EPI_SMEM = GEMM_MMA_BM * MMA_EPI_LD * 4,
    MMA_SMEM = MMA_PIPE_SMEM > MMA_EPI_SMEM ? MMA_PIPE_SMEM : MMA_EPI_SMEM,
};

template <bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(GEMM_MMA_THREADS) gemm_mma_kernel(const MmaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BM = GEMM_MMA_BM, BN = GEMM_MMA_BN, BK = GEMM_MMA_BK, S = GEMM_MMA_STAGES;
    constexpr uint32_t A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
    constexpr int ACPR = A_KMAJOR ? BK / 8 : BM / 8, BCPR = B_KMAJOR ? BK / 8 : BN / 8; // chunks per row
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sbase = smem_u32(smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const Unit u = unit_of(a.w, blockIdx.x, BM, BN);
    const int nk = u.kt1 - u.kt0;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

    auto load_stage = [&](int stage, int kt) {
        const uint32_t s = sbase + stage * STAGE;
        mma_load_tile<A_KMAJOR, BM>(s, a.A, a.lda, u.m0, a.w.M, kt * BK, a.w.K, tid);
        mma_load_tile<B_KMAJOR, BN>(s + A_BYTES, a.B, a.ldb, u.n0, a.w.N, kt * BK, a.w.K, tid);
    };

#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nk) load_stage(s, u.kt0 + s);
        cp_async_commit(); // empty groups keep the group count in step
    }
    for (int it = 0; it < nk; it++) {
        cp_async_wait<S - 2>(); // this thread's copies for k-tile `it` have landed
        __syncthreads();        // ... everyone's have, and everyone is done with the stage refilled next
        if (it + S - 1 < nk) load_stage((it + S - 1) % S, u.kt0 + it + S - 1);
        cp_async_commit();

        const uint32_t sA = sbase + (it % S) * STAGE, sB = sA + A_BYTES;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t af[4][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                int row, ch;
                gemm_mma_ldsm_a(A_KMAJOR, wm + mi * 16, kk, lane, &row, &ch);
                const uint32_t addr = sA + (uint32_t)(row * ACPR + gemm_swizzle_chunk(row, ch, ACPR)) * 16u;
                if (A_KMAJOR) ldsm_x4(addr, af[mi]);
                else ldsm_x4_t(addr, af[mi]);
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                uint32_t r[4];
                int row, ch;
                gemm_mma_ldsm_b(B_KMAJOR, wn + nj * 16, kk, lane, &row, &ch);
                const uint32_t addr = sB + (uint32_t)(row * BCPR + gemm_swizzle_chunk(row, ch, BCPR)) * 16u;
                if (B_KMAJOR) ldsm_x4(addr, r);
                else ldsm_x4_t(addr, r);
                bfr[2 * nj][0] = r[0];
                bfr[2 * nj][1] = r[1];
                bfr[2 * nj + 1][0] = r[2];
                bfr[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // the pipeline's shared memory becomes the epilogue's staging tile

    // Through shared memory, so that the epilogue runs as one compact loop with coalesced stores.
    // Accumulator fragment: d0,d1 at row g, columns 2c, 2c+1; d2,d3 at row g+8 (g = lane/4, c = lane%4).
    float *stage = reinterpret_cast<float *>(smem);
    const int g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            float *p = stage + (wm + mi * 16 + g) * MMA_EPI_LD + wn + ni * 8 + c2;
            *reinterpret_cast<float2 *>(p) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
            *reinterpret_cast<float2 *>(p + 8 * MMA_EPI_LD) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
    __syncthreads();
    for (int i = tid; i < BM * BN / 2; i += GEMM_MMA_THREADS) {
        const int r = i / (BN / 2), c = (i % (BN / 2)) * 2;
        const float2 v = *reinterpret_cast<const float2 *>(stage + r * MMA_EPI_LD + c);
        epi_pair(a.e, u.split, u.m0 + r, u.n0 + c, v.x, v.y);
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// sm_90a: TMA + mbarrier pipeline + wgmma, warp-specialised, persistent

struct WgArgs {
    TileWork w;
    GemmTmaPlan pa, pb;
    EpiArgs e;
};

// Shared memory: the A and B stages, then per consumer warpgroup an epilogue staging area of 64 rows x
// 32 columns of fp32 (rows padded by 8 floats: the fragments' 8-byte stores then hit 32 banks per
// half-warp), then the mbarriers; 1024 bytes of slack to align the start.
enum {
    WG_A_STAGE = GEMM_WG_BM * GEMM_WG_BK * 2,
    WG_B_STAGE = GEMM_WG_BN * GEMM_WG_BK * 2,
    WG_EPI_COLS = 32,
    WG_EPI_LD = WG_EPI_COLS + 8,
    WG_EPI_BYTES = 64 * WG_EPI_LD * 4,
    WG_SMEM = GEMM_WG_STAGES * (WG_A_STAGE + WG_B_STAGE) + 2 * WG_EPI_BYTES + 2 * GEMM_WG_STAGES * 8 + 1024,
    WG_CONSUMER_WARPS = 8,
};

// Waits for the completion of the phase with this parity. A fresh barrier counts its (never run)
// phase before phase 0 as complete, so waiting on parity 1 passes at once: the producer's first pass.
// A wait of more than 2^35 cycles (over 15 s; the longest real wait is one tile's epilogue) can only
// be a broken pipeline: trap, so that the launch fails with an error instead of hanging the GPU.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if (mbar_try_wait(bar, parity)) return;
    const long long start = clock64();
    while (!mbar_try_wait(bar, parity))
        if (clock64() - start > (1LL << 35)) __trap();
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Columns 32*CH .. 32*CH+31 of the warpgroup's 64 x 256 accumulators into its staging area. Layout of
// m64nNk16's accumulators: warp w holds rows 16w..16w+15; for each 8 columns j, d[4j], d[4j+1] sit at
// row g, columns 8j+2c, +1 and d[4j+2], d[4j+3] at row g+8 (g = lane/4, c = lane%4).
template <int CH> __device__ __forceinline__ void wg_stage_chunk(const float (&d)[128], float *buf, int t) {
    const int lane = t & 31, r = 16 * (t >> 5) + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
    for (int jj = 0; jj < WG_EPI_COLS / 8; jj++) {
        const int j = CH * (WG_EPI_COLS / 8) + jj;
        *reinterpret_cast<float2 *>(buf + r * WG_EPI_LD + jj * 8 + c) = make_float2(d[4 * j], d[4 * j + 1]);
        *reinterpret_cast<float2 *>(buf + (r + 8) * WG_EPI_LD + jj * 8 + c) = make_float2(d[4 * j + 2], d[4 * j + 3]);
    }
}

#endif

template <bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(GEMM_WG_THREADS, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, const WgArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int S = GEMM_WG_STAGES, BM = GEMM_WG_BM, BN = GEMM_WG_BN, BK = GEMM_WG_BK;
    extern __shared__ uint8_t smem_raw[];
    // TMA's 128-byte swizzle repeats every 1024 bytes and the wgmma descriptors assume the pattern
    // starts on such a boundary (base offset 0), so every stage starts 1024-aligned.
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sA = base, sB = base + S * WG_A_STAGE, sE = sB + S * WG_B_STAGE, bars = sE + 2 * WG_EPI_BYTES;
    auto full = [&](int s) { return bars + 8u * s; };      // TMA bytes landed (one arrival + tx count)
    auto empty = [&](int s) { return bars + 8u * (S + s); }; // consumers done reading (one per warp)

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), WG_CONSUMER_WARPS);
        }
        fence_mbarrier_init(); // visible to the async proxy
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        // producer warpgroup: keeps few registers so that the consumers can have more
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (long long un = blockIdx.x; un < a.w.units; un += gridDim.x) {
                const Unit u = unit_of(a.w, un, BM, BN);
                // Boxes of an m- or n-major operand that lie wholly past the matrix are not loaded:
                // they would only feed output rows or columns that are never stored.
                const int nba = A_KMAJOR ? 1 : min(a.pa.boxes, (a.w.M - u.m0 + 63) / 64);
                const int nbb = B_KMAJOR ? 1 : min(a.pb.boxes, (a.w.N - u.n0 + 63) / 64);
                const uint32_t tx = nba * a.pa.box_bytes + nbb * a.pb.box_bytes;
                for (int kt = u.kt0; kt < u.kt1; kt++) {
                    mbar_wait(empty(stage), phase ^ 1);
                    mbar_expect_tx(full(stage), tx);
                    for (int b = 0; b < nba; b++) {
                        int c0, c1;
                        gemm_tma_box_coords(&a.pa, b, u.m0, kt * BK, &c0, &c1);
                        tma_load_2d(sA + stage * WG_A_STAGE + b * a.pa.box_bytes, &tmA, c0, c1, full(stage));
                    }
                    for (int b = 0; b < nbb; b++) {
                        int c0, c1;
                        gemm_tma_box_coords(&a.pb, b, u.n0, kt * BK, &c0, &c1);
                        tma_load_2d(sB + stage * WG_B_STAGE + b * a.pb.box_bytes, &tmB, c0, c1, full(stage));
                    }
                    if (++stage == S) stage = 0, phase ^= 1;
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int cw = wg - 1, t = threadIdx.x & 127, lane = t & 31;
        const uint32_t a_off = gemm_tma_mn_offset(&a.pa, 64 * cw);
        float *epi = reinterpret_cast<float *>(smem_raw + (sE - smem_u32(smem_raw)) + cw * WG_EPI_BYTES);
        int stage = 0;
        uint32_t phase = 0;
        float acc[128];
        for (long long un = blockIdx.x; un < a.w.units; un += gridDim.x) {
            const Unit u = unit_of(a.w, un, BM, BN);
#pragma unroll
            for (int i = 0; i < 128; i++) acc[i] = 0.0f;
            acc_fence(acc);
            int prev = -1;
            for (int kt = u.kt0; kt < u.kt1; kt++) {
                mbar_wait(full(stage), phase);
                wgmma_fence();
                const uint64_t da = gemm_wgmma_desc(sA + stage * WG_A_STAGE + a_off, a.pa.lbo, a.pa.sbo, GEMM_DESC_SWIZZLE_128B);
                const uint64_t db = gemm_wgmma_desc(sB + stage * WG_B_STAGE, a.pb.lbo, a.pb.sbo, GEMM_DESC_SWIZZLE_128B);
#pragma unroll
                for (int k16 = 0; k16 < BK / 16; k16++)
                    wgmma_m64n256k16<A_KMAJOR ? 0 : 1, B_KMAJOR ? 0 : 1>(acc, da + ((k16 * a.pa.k16_bytes) >> 4),
                                                                          db + ((k16 * a.pb.k16_bytes) >> 4));
                wgmma_commit();
                // the previous k-tile's products are done: its stage can be refilled
                wgmma_wait<1>();
                if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
                prev = stage;
                if (++stage == S) stage = 0, phase ^= 1;
            }
            wgmma_wait<0>();
            acc_fence(acc);
            if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));

            // Epilogue, 32 columns at a time through shared memory: one compact loop (the switch keeps
            // the accumulator indices compile-time constants) and stores that cover whole row segments.
            const int row0 = u.m0 + 64 * cw;
            if (row0 >= a.w.M) continue;
#pragma unroll 1
            for (int ch = 0; ch < GEMM_WG_BN / WG_EPI_COLS && u.n0 + ch * WG_EPI_COLS < a.w.N; ch++) {
                wg_bar(1 + cw); // the previous chunk has been read
                switch (ch) {
                case 0: wg_stage_chunk<0>(acc, epi, t); break;
                case 1: wg_stage_chunk<1>(acc, epi, t); break;
                case 2: wg_stage_chunk<2>(acc, epi, t); break;
                case 3: wg_stage_chunk<3>(acc, epi, t); break;
                case 4: wg_stage_chunk<4>(acc, epi, t); break;
                case 5: wg_stage_chunk<5>(acc, epi, t); break;
                case 6: wg_stage_chunk<6>(acc, epi, t); break;
                default: wg_stage_chunk<7>(acc, epi, t); break;
                }
                wg_bar(1 + cw);
                const int col0 = u.n0 + ch * WG_EPI_COLS;
                for (int i = t; i < 64 * WG_EPI_COLS / 2; i += 128) {
                    const int r = i / (WG_EPI_COLS / 2), c = (i % (WG_EPI_COLS / 2)) * 2;
                    const float2 v = *reinterpret_cast<const float2 *>(epi + r * WG_EPI_LD + c);
                    epi_pair(a.e, u.split, row0 + r, col0 + c, v.x, v.y);
                }
            }
        }
    }
#endif
}

// Whether the running image of this binary was compiled for sm_90a (wgmma and setmaxnreg present).
__global__ void gemm_probe_kernel(int *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

// ---------------------------------------------------------------------------------------------
// host

namespace {

struct DeviceInfo {
    int ready;
    int major, minor, sms;
    int have_wgmma;
};

enum { MAX_DEVICES = 64 };
DeviceInfo g_dev[MAX_DEVICES]; // per device ordinal, filled on first use
PFN_cuTensorMapEncodeTiled_v12000 g_encode;

const DeviceInfo &device_info() {
    int dev = 0;
    CK(cudaGetDevice, (&dev));
    if (dev < 0 || dev >= MAX_DEVICES) die("CUDA device ordinal %d out of range for the GEMM", dev);
    DeviceInfo &d = g_dev[dev];
    if (d.ready) return d;
    CK(cudaDeviceGetAttribute, (&d.major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute, (&d.minor, cudaDevAttrComputeCapabilityMinor, dev));
    CK(cudaDeviceGetAttribute, (&d.sms, cudaDevAttrMultiProcessorCount, dev));
    d.have_wgmma = 0;
    if (d.major == 9 && d.minor == 0) {
        int *flag = NULL, host = 0;
        CK(cudaMalloc, (&flag, sizeof(int)));
        CUDA_LAUNCH(1, 1, 0, 0, gemm_probe_kernel)(flag);
        cuda_launched("gemm_probe_kernel", 0);
        CK(cudaMemcpy, (&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
        CK(cudaFree, (flag));
        d.have_wgmma = host == 1;
    }
    d.ready = 1;
    return d;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    if (g_encode) return g_encode;
    void *fn = cuda_driver_entry("cuTensorMapEncodeTiled");
    if (!fn) die("CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12.0 or later)");
    g_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    return g_encode;
}

void make_tensor_map(CUtensorMap *map, const void *base, const GemmTmaPlan &pl) {
    // a zero extent (K = 0) is never loaded but must still encode
    cuuint64_t dims[2] = { pl.dims[0] ? pl.dims[0] : 1, pl.dims[1] ? pl.dims[1] : 1 };
    cuuint64_t strides[1] = { pl.stride1 };
    cuuint32_t box[2] = { pl.box[0], pl.box[1] }, estride[2] = { 1, 1 };
    CUresult r = encode_fn()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides, box, estride,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        die("CUDA cuTensorMapEncodeTiled: error %d (dims %llu x %llu, stride %llu bytes, box %u x %u)", (int)r,
            (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)strides[0], box[0], box[1]);
}

struct Plan {
    TileWork w;
    long long ws_ld;
};

// Tiles and splits of problem p for kernel k on a device with `sms` multiprocessors. forced > 0 asks
// for that many splits; ws_bytes caps the splits whose partial sums fit.
Plan plan_work(const GemmProblem *p, GemmKernel k, int sms, int forced, size_t ws_bytes) {
    Plan pl;
    const int bm = k == GEMM_KERNEL_WGMMA ? GEMM_WG_BM : GEMM_MMA_BM, bn = k == GEMM_KERNEL_WGMMA ? GEMM_WG_BN : GEMM_MMA_BN;
    const int bk = k == GEMM_KERNEL_WGMMA ? GEMM_WG_BK : GEMM_MMA_BK;
    TileWork &w = pl.w;
    w.M = p->M;
    w.N = p->N;
    w.K = p->K;
    w.tiles_m = (p->M + bm - 1) / bm;
    w.tiles_n = (p->N + bn - 1) / bn;
    w.k_tiles = (p->K + bk - 1) / bk;
    w.tiles = (long long)w.tiles_m * w.tiles_n;
    pl.ws_ld = (p->N + 1) & ~1;
    const size_t per_split = (size_t)p->M * pl.ws_ld * sizeof(float);
    const size_t fit = per_split ? ws_bytes / per_split : 1;
    const int max_fit = fit < (size_t)GEMM_MAX_SPLITS ? (int)fit : (int)GEMM_MAX_SPLITS;
    GemmSplit sp = { 1, w.k_tiles > 0 ? w.k_tiles : 1 };
    if (forced > 0) {
        int s = forced < max_fit ? forced : max_fit;
        if (s > w.k_tiles) s = w.k_tiles;
        if (s > 1) {
            sp.kt_per_split = (w.k_tiles + s - 1) / s;
            sp.splits = (w.k_tiles + sp.kt_per_split - 1) / sp.kt_per_split;
        }
    } else if (max_fit > 1) {
        sp = gemm_choose_splits(w.tiles, w.k_tiles, sms, max_fit);
    }
    w.splits = sp.splits;
    w.kt_per_split = sp.kt_per_split;
    w.units = w.tiles * w.splits;
    return pl;
}

EpiArgs epi_args(const GemmProblem *p, const Plan &pl, void *ws) {
    EpiArgs e;
    memset(&e, 0, sizeof e);
    e.C = p->C;
    e.ldc = p->ldc;
    e.store = p->store;
    e.bias = p->bias;
    e.dgelu_in = p->dgelu_in;
    e.residual = p->residual;
    e.pre_gelu = p->pre_gelu;
    e.gelu = p->gelu;
    e.M = p->M;
    e.N = p->N;
    if (pl.w.splits > 1) {
        e.ws = (float *)ws;
        e.ws_ld = pl.ws_ld;
        e.ws_split = (long long)p->M * pl.ws_ld;
    }
    return e;
}

template <bool AK, bool BK>
void launch_mma(const GemmProblem *p, const Plan &pl, const EpiArgs &e, cudaStream_t st) {
    MmaArgs a;
    a.A = p->A;
    a.B = p->B;
    a.lda = p->lda;
    a.ldb = p->ldb;
    a.w = pl.w;
    a.e = e;
    const int smem = MMA_SMEM;
    CK(cudaFuncSetAttribute, (gemm_mma_kernel<AK, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (pl.w.units > 0x7fffffffLL) die("CUDA gemm: %lld tiles is too many for one launch", pl.w.units);
    CUDA_LAUNCH((unsigned)pl.w.units, GEMM_MMA_THREADS, smem, st, gemm_mma_kernel<AK, BK>)(a);
    cuda_launched("gemm_mma_kernel", st);
}

template <bool AK, bool BK>
void launch_wgmma(const GemmProblem *p, const Plan &pl, const EpiArgs &e, int sms, cudaStream_t st) {
    WgArgs a;
    memset(&a, 0, sizeof a);
    a.w = pl.w;
    a.e = e;
    gemm_tma_plan(&a.pa, AK, p->M, p->K, p->lda, GEMM_WG_BM);
    gemm_tma_plan(&a.pb, BK, p->N, p->K, p->ldb, GEMM_WG_BN);
    CUtensorMap ta, tb;
    make_tensor_map(&ta, p->A, a.pa);
    make_tensor_map(&tb, p->B, a.pb);
    CK(cudaFuncSetAttribute, (gemm_wgmma_kernel<AK, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WG_SMEM));
    long long grid = pl.w.units < sms ? pl.w.units : sms;
    CUDA_LAUNCH((unsigned)grid, GEMM_WG_THREADS, WG_SMEM, st, gemm_wgmma_kernel<AK, BK>)(ta, tb, a);
    cuda_launched("gemm_wgmma_kernel", st);
}

} // namespace

extern "C" const char *gemm_kernel_name(GemmKernel k) {
    return k == GEMM_KERNEL_WGMMA ? "wgmma" : k == GEMM_KERNEL_MMA ? "mma.sync" : "none";
}

extern "C" GemmKernel gemm_available(GemmKernel want) {
    const DeviceInfo &d = device_info();
    return gemm_pick_kernel(d.major, d.minor, d.have_wgmma, want);
}

extern "C" size_t gemm_workspace_bytes(const GemmProblem *p, GemmKernel kernel) {
    const DeviceInfo &d = device_info();
    GemmKernel k = gemm_pick_kernel(d.major, d.minor, d.have_wgmma, kernel);
    if (k == GEMM_KERNEL_NONE || p->M <= 0 || p->N <= 0) return 0;
    Plan pl = plan_work(p, k, d.sms, 0, (size_t)-1);
    return pl.w.splits > 1 ? (size_t)pl.w.splits * p->M * pl.ws_ld * sizeof(float) : 0;
}

extern "C" GemmKernel gemm_bf16(const GemmProblem *p, const GemmOptions *o) {
    static const GemmOptions defaults = { GEMM_KERNEL_NONE, 0, NULL, 0, NULL };
    if (!o) o = &defaults;
    if (gemm_problem_check(p)) return GEMM_KERNEL_NONE;
    const DeviceInfo &d = device_info();
    const GemmKernel k = gemm_pick_kernel(d.major, d.minor, d.have_wgmma, o->kernel);
    if (k == GEMM_KERNEL_NONE) return k;
    if (p->M == 0 || p->N == 0) return k;
    cudaStream_t st = (cudaStream_t)o->stream;
    const Plan pl = plan_work(p, k, d.sms, o->splits, o->workspace ? o->workspace_bytes : 0);
    const EpiArgs e = epi_args(p, pl, o->workspace);
    const int ak = p->a_kmajor != 0, bk = p->b_kmajor != 0;
    if (k == GEMM_KERNEL_WGMMA) {
        if (ak && bk) launch_wgmma<true, true>(p, pl, e, d.sms, st);
        else if (ak) launch_wgmma<true, false>(p, pl, e, d.sms, st);
        else if (bk) launch_wgmma<false, true>(p, pl, e, d.sms, st);
        else launch_wgmma<false, false>(p, pl, e, d.sms, st);
    } else {
        if (ak && bk) launch_mma<true, true>(p, pl, e, st);
        else if (ak) launch_mma<true, false>(p, pl, e, st);
        else if (bk) launch_mma<false, true>(p, pl, e, st);
        else launch_mma<false, false>(p, pl, e, st);
    }
    if (pl.w.splits > 1) {
        long long pairs = (long long)p->M * ((p->N + 1) / 2), blocks = (pairs + 255) / 256;
        if (blocks > (long long)d.sms * 16) blocks = (long long)d.sms * 16;
        CUDA_LAUNCH((unsigned)blocks, 256, 0, st, gemm_splitk_reduce_kernel)(e, pl.w.splits);
        cuda_launched("gemm_splitk_reduce_kernel", st);
    }
    return k;
}

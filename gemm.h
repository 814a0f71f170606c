// gemm.h: bf16 GEMMs on tensor cores with fp32 accumulation and fused epilogues (gemm.cu), and the pure
// index arithmetic behind them (tile order, split-K, shared-memory swizzle, wgmma descriptors, TMA
// boxes) as inline functions that plain C tests can call (test/test_gemm.c).
//
// One problem: C[m,n] (=, or +=) epilogue(Σ_k A(m,k)·B(k,n)) with
//   A(m,k) = A[m*lda + k] when a_kmajor, else A[k*lda + m]
//   B(k,n) = B[n*ldb + k] when b_kmajor, else B[k*ldb + n]
// so the three products of a linear layer in llm.c's convention (weight[OC][C]) are
//   forward  out[N,OC]   = inp[N,C] · weightᵀ   M=N,  N=OC, K=C:  a_kmajor=1, b_kmajor=1
//   dinp     dinp[N,C]   = dout[N,OC] · weight  M=N,  N=C,  K=OC: a_kmajor=1, b_kmajor=0
//   dweight  dw[OC,C]   += doutᵀ · inp          M=OC, N=C,  K=N:  a_kmajor=0, b_kmajor=0
//
// In the backend (kernels.cu, bf16 storage), e.g. the forward: fill a GemmProblem {M=N, N=OC, K=C,
// A=inp, lda=C, a_kmajor=1, B=weight, ldb=C, b_kmajor=1, C=out, ldc=OC, store=GEMM_STORE_BF16,
// bias=bias} and keep the SIMT GEMM when gemm_bf16 returns GEMM_KERNEL_NONE. A workspace allocated
// once (gemm_workspace_bytes of the largest weight gradient) lets split-K fill the GPU.
//
// Determinism: every output element is summed by one thread in a fixed k order (ascending k-tiles,
// then the tensor core's fixed order inside a tile). With split-K the splits write fp32 partial sums
// to a workspace and one reduction adds them in split order, so results depend on the problem, the
// kernel, the multiprocessor count and the workspace size, never on timing. No atomics.
#ifndef LLM4D_GEMM_H
#define LLM4D_GEMM_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define GEMM_HD static inline __host__ __device__
#else
#define GEMM_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GEMM_STORE_BF16 = 0, GEMM_STORE_F32 = 1, GEMM_ACCUM_F32 = 2 } GemmStore;
typedef enum { GEMM_KERNEL_NONE = 0, GEMM_KERNEL_MMA = 1, GEMM_KERNEL_WGMMA = 2 } GemmKernel;

typedef struct GemmProblem {
    int M, N, K;
    const uint16_t *A; // bf16
    long long lda;
    int a_kmajor;
    const uint16_t *B; // bf16
    long long ldb;
    int b_kmajor;
    void *C; // bf16 (GEMM_STORE_BF16) or fp32
    long long ldc;
    GemmStore store;
    // Epilogue, in this order, each step skipped when its pointer (or flag) is 0:
    //   v += bias[n];  pre_gelu[m*ldc+n] = v, v = gelu(v);  v *= gelu'(dgelu_in[m*ldc+n]);
    //   v += residual[m*ldc+n];  then C = v (bf16 or fp32) or C += v (fp32).
    // With a bf16 store, v is rounded to bf16 before each step as the unfused ops would store and
    // reload it, so a fused epilogue gives exactly the bits of the separate kernels.
    const uint16_t *bias;     // bf16 [N]
    int gelu;                 // tanh GELU, as kernels_cpu.c
    uint16_t *pre_gelu;       // bf16, leading dimension ldc (may be NULL when gelu)
    const uint16_t *dgelu_in; // bf16, leading dimension ldc: the GELU input of the forward
    const uint16_t *residual; // bf16, leading dimension ldc (may alias C for a bf16 store)
} GemmProblem;

typedef struct GemmOptions {
    GemmKernel kernel;    // GEMM_KERNEL_NONE: the fastest for this device
    int splits;           // 0: automatic split-K; n > 0 forces n (capped by K and the workspace)
    void *workspace;      // device memory for split-K partial sums (NULL: no split-K)
    size_t workspace_bytes;
    void *stream;         // cudaStream_t; NULL is the default stream
} GemmOptions;

// Runs the problem on the current device and returns the kernel that ran, or GEMM_KERNEL_NONE when
// none of these can (device older than sm_80, the requested kernel not built or not supported here,
// or a problem that breaks gemm_problem_check's rules): the caller then uses its SIMT GEMM. CUDA
// errors die() with the call's name.
GemmKernel gemm_bf16(const GemmProblem *p, const GemmOptions *o);
// Workspace bytes that automatic split-K may use for this problem on this device (0: none).
size_t gemm_workspace_bytes(const GemmProblem *p, GemmKernel kernel);
// The kernel gemm_bf16 would choose on the current device for `want` (GEMM_KERNEL_NONE: automatic).
GemmKernel gemm_available(GemmKernel want);
const char *gemm_kernel_name(GemmKernel k);

// ------------------------------------------------------------------------------------------------
// Tile shapes. mma: the portable mma.sync kernel (sm_80+); wg: the Hopper wgmma kernel (sm_90a).

enum {
    GEMM_MMA_BM = 128, GEMM_MMA_BN = 128, GEMM_MMA_BK = 32, GEMM_MMA_STAGES = 4, GEMM_MMA_THREADS = 256,
    GEMM_WG_BM = 128, GEMM_WG_BN = 256, GEMM_WG_BK = 64, GEMM_WG_STAGES = 4, GEMM_WG_THREADS = 384,
    GEMM_GROUP_M = 8,        // tile rows walked together, so neighbouring tiles share operands in L2
    GEMM_MAX_SPLITS = 16,
    GEMM_MIN_SPLIT_KTILES = 4, // each split of split-K gets at least this many k-tiles
};

// Why a problem cannot run on the tensor-core kernels, or NULL when it can. The TMA and cp.async
// loads move 16 bytes at a time, so A and B must be 16-byte aligned with leading dimensions that are
// multiples of 8 elements; the epilogue stores two adjacent columns at once, so C and the epilogue
// arrays need an even ldc and 2-element alignment. Sizes themselves may be anything.
GEMM_HD const char *gemm_problem_check(const GemmProblem *p) {
    if (p->M < 0 || p->N < 0 || p->K < 0) return "negative size";
    if (!p->A || !p->B || !p->C) return "null operand";
    if (((uintptr_t)p->A & 15) || ((uintptr_t)p->B & 15)) return "A or B not 16-byte aligned";
    if (p->lda % 8 || p->ldb % 8) return "lda or ldb not a multiple of 8";
    if (p->lda < (p->a_kmajor ? p->K : p->M) || p->lda < 1) return "lda too small";
    if (p->ldb < (p->b_kmajor ? p->K : p->N) || p->ldb < 1) return "ldb too small";
    if (p->ldc % 2 || p->ldc < p->N) return "ldc odd or too small";
    if (p->store > GEMM_ACCUM_F32 || (int)p->store < 0) return "unknown store";
    size_t csize = p->store == GEMM_STORE_BF16 ? 2 : 4;
    if ((uintptr_t)p->C % (2 * csize)) return "C not aligned to two elements";
    if (((uintptr_t)p->pre_gelu & 3) || ((uintptr_t)p->dgelu_in & 3) || ((uintptr_t)p->residual & 3))
        return "epilogue array not 4-byte aligned";
    if ((uintptr_t)p->bias & 1) return "bias not 2-byte aligned";
    if (p->pre_gelu && !p->gelu) return "pre_gelu without gelu";
    return 0;
}

// The kernel for a device of compute capability major.minor; have_wgmma: this binary carries sm_90a
// code. Hopper's wgmma exists on 9.0 only (sm_90a code runs nowhere else); mma.sync on 8.0 and later.
GEMM_HD GemmKernel gemm_pick_kernel(int cc_major, int cc_minor, int have_wgmma, GemmKernel want) {
    int wg = cc_major == 9 && cc_minor == 0 && have_wgmma;
    if (cc_major < 8) return GEMM_KERNEL_NONE;
    if (want == GEMM_KERNEL_WGMMA) return wg ? GEMM_KERNEL_WGMMA : GEMM_KERNEL_NONE;
    if (want == GEMM_KERNEL_MMA) return GEMM_KERNEL_MMA;
    return wg ? GEMM_KERNEL_WGMMA : GEMM_KERNEL_MMA;
}

// Tile t of a tiles_m x tiles_n grid, walked GEMM_GROUP_M tile rows at a time: down a group's rows,
// then to the next column, so the tiles running at once share rows of A and columns of B in L2.
GEMM_HD void gemm_tile_coords(long long t, int tiles_m, int tiles_n, int *tm, int *tn) {
    long long per_group = (long long)GEMM_GROUP_M * tiles_n;
    int first_m = (int)(t / per_group) * GEMM_GROUP_M;
    int rows = tiles_m - first_m < GEMM_GROUP_M ? tiles_m - first_m : GEMM_GROUP_M;
    int r = (int)(t % per_group);
    *tm = first_m + r % rows;
    *tn = r / rows;
}

// Split-K: how many slices of the k-tiles to run as separate work units when there are too few output
// tiles to fill the multiprocessors. Cost model in k-tile times: waves x k-tiles per split, plus half a
// k-tile per split for writing and reducing its partial sums; the smallest cost wins, ties to fewer
// splits. Big problems (tiles >= SMs) never split.
typedef struct GemmSplit {
    int splits;      // work units per output tile
    int kt_per_split; // k-tiles per split; the last split takes the rest (at least 1)
} GemmSplit;

GEMM_HD GemmSplit gemm_choose_splits(long long tiles, int k_tiles, int num_sms, int max_splits) {
    GemmSplit best = { 1, k_tiles > 0 ? k_tiles : 1 };
    if (tiles <= 0 || k_tiles <= 0 || num_sms <= 0 || tiles >= num_sms) return best;
    if (max_splits > GEMM_MAX_SPLITS) max_splits = GEMM_MAX_SPLITS;
    long long best_cost = -1;
    for (int s = 1; s <= max_splits; s++) {
        int kps = (k_tiles + s - 1) / s;
        int used = (k_tiles + kps - 1) / kps; // splits that actually get k-tiles
        if (used != s) continue;
        if (s > 1 && kps < GEMM_MIN_SPLIT_KTILES) break;
        long long waves = (tiles * s + num_sms - 1) / num_sms;
        long long cost = 2 * waves * kps + (s > 1 ? s : 0); // doubled: half a k-tile per split
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            best.splits = s;
            best.kt_per_split = kps;
        }
    }
    return best;
}

// The mma.sync kernel's shared-memory tiles are rows of `chunks` 16-byte chunks (a row is one m or n
// with BK k's for k-major operands, one k with BM or BN values otherwise). ldmatrix reads one chunk
// from each of 8 consecutive rows, so chunk c of row r is stored at chunk c ^ f(r): the 8 reads then
// fall in 8 different groups of 4 banks. Rows of 4 chunks (64 bytes) pair up in a 128-byte line,
// hence f(r) = (r/2) % 4 there, and r % 8 for rows of 8 or more chunks.
GEMM_HD int gemm_swizzle_chunk(int row, int chunk, int chunks) {
    if (chunks >= 8) return chunk ^ (row & 7);
    if (chunks == 4) return chunk ^ ((row >> 1) & 3);
    return chunk;
}

// The mma.sync kernel's ldmatrix.x4 addresses (.trans for an operand that is not k-major): the
// shared-memory row and logical chunk that lane `lane` points at. For A's 16x16 block at tile row m,
// k-step kk, the four 8x8 matrices become the fragment registers a0..a3 of mma.m16n8k16 (rows +0/+8
// of m, then k +0/+8). For B's two n8 blocks at tile column n: r0, r1 are block n's b0, b1 (k +0/+8),
// r2, r3 block n+8's. Rows are m or n when k-major, else k.
GEMM_HD void gemm_mma_ldsm_a(int kmajor, int m, int kk, int lane, int *row, int *chunk) {
    const int q = lane >> 3, r8 = lane & 7;
    if (kmajor) {
        *row = m + (q & 1) * 8 + r8;
        *chunk = kk * 2 + (q >> 1);
    } else {
        *row = kk * 16 + (q >> 1) * 8 + r8;
        *chunk = (m + (q & 1) * 8) >> 3;
    }
}
GEMM_HD void gemm_mma_ldsm_b(int kmajor, int n, int kk, int lane, int *row, int *chunk) {
    const int q = lane >> 3, r8 = lane & 7;
    if (kmajor) {
        *row = n + (q >> 1) * 8 + r8;
        *chunk = kk * 2 + (q & 1);
    } else {
        *row = kk * 16 + (q & 1) * 8 + r8;
        *chunk = (n + (q >> 1) * 8) >> 3;
    }
}

// wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address,
// 16-29 leading-dimension byte offset, 32-45 stride-dimension byte offset (each >> 4), 49-51 base offset
// (0: the operand's swizzle pattern starts on its 1024-byte boundary), 62-63 swizzle mode (1 = 128 B).
enum { GEMM_DESC_SWIZZLE_128B = 1 };
GEMM_HD uint64_t gemm_wgmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes, int swizzle) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32 | (uint64_t)(swizzle & 3) << 62;
}

// How the Hopper kernel brings one operand's tile into shared memory with TMA and describes it to
// wgmma, 128-byte swizzle throughout (a TMA box row is then exactly 128 bytes = 64 bf16).
//  k-major (rows of k): one box of 64 k x tile_mn rows; 8-row atoms of 1024 bytes (SBO); a k16 step
//    moves 32 bytes along the row; LBO is unused with this swizzle.
//  mn-major (rows of m or n): tile_mn/64 boxes of 64 mn x BK k, one after another; in each, 8 k-rows
//    make a 1024-byte atom (SBO) and the next 64 mn start one box later (LBO); a k16 step moves 16
//    k-rows = 2048 bytes.
typedef struct GemmTmaPlan {
    uint64_t dims[2];     // tensor extent in elements; dims[0] is the contiguous dimension
    uint64_t stride1;     // bytes between consecutive indices of dims[1]
    uint32_t box[2];      // box extent in elements
    int boxes;            // boxes per stage
    uint32_t box_bytes;   // bytes of one box in shared memory
    uint32_t lbo, sbo;    // wgmma descriptor offsets in bytes
    uint32_t k16_bytes;   // start-address step per k16
    int kmajor;
} GemmTmaPlan;

GEMM_HD void gemm_tma_plan(GemmTmaPlan *pl, int kmajor, long long mn, long long k, long long ld, int tile_mn) {
    pl->kmajor = kmajor;
    pl->stride1 = (uint64_t)ld * 2;
    if (kmajor) {
        pl->dims[0] = (uint64_t)k;
        pl->dims[1] = (uint64_t)mn;
        pl->box[0] = GEMM_WG_BK;
        pl->box[1] = (uint32_t)tile_mn;
        pl->boxes = 1;
        pl->lbo = 16;
        pl->sbo = 1024;
        pl->k16_bytes = 32;
    } else {
        pl->dims[0] = (uint64_t)mn;
        pl->dims[1] = (uint64_t)k;
        pl->box[0] = 64;
        pl->box[1] = GEMM_WG_BK;
        pl->boxes = tile_mn / 64;
        pl->lbo = 64 * GEMM_WG_BK * 2;
        pl->sbo = 1024;
        pl->k16_bytes = 16 * 128;
    }
    pl->box_bytes = pl->box[0] * pl->box[1] * 2;
}

// Coordinates (dims[0], dims[1]) of box b for the tile starting at (mn0, k0).
GEMM_HD void gemm_tma_box_coords(const GemmTmaPlan *pl, int b, int mn0, int k0, int *c0, int *c1) {
    if (pl->kmajor) {
        *c0 = k0;
        *c1 = mn0;
    } else {
        *c0 = mn0 + 64 * b;
        *c1 = k0;
    }
}

// Byte offset, inside one stage of this operand, of the sub-tile starting at row or column mn (a
// multiple of 64): where a consumer warpgroup's 64 rows of A begin.
GEMM_HD uint32_t gemm_tma_mn_offset(const GemmTmaPlan *pl, int mn) {
    return pl->kmajor ? (uint32_t)mn * 128u : (uint32_t)(mn / 64) * pl->box_bytes;
}

#ifdef __cplusplus
}
#endif

#endif

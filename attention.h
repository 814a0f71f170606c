// attention.h: causal flash attention on tensor cores (attention.cu: mma.sync m16n8k16, bf16 operands,
// fp32 accumulation, sm_80 and later), and the pure index arithmetic behind it as inline functions that
// plain C tests can call (test/test_attention.c).
//
// The problem is kernels.h's attention block: Tq queries at sequence positions q0.. against Tk keys and
// values at k0.. (key s is visible to query t when k0 + s <= q0 + t), heads of hs channels, scores
// scaled by 1/sqrt(hs). Views give element (b, t, h, i) at p[b*bs + t*ts + h*hs + i].
//
//  forward   one block per (batch·head, 128 queries): 4 warps of 32 query rows (two m16 tiles each)
//            walk the visible key tiles in ascending order with an online softmax (running max and sum
//            per row, in base-2 units), P = exp2(S·scale·log2e − m) rounded to bf16 feeds P·V straight
//            from the accumulators; out = O / l, lse = (m + log2 l)·ln 2, or merged into (out, lse)
//            by the log-sum-exp rule.
//  backward  D = rowsum(dout·out) first (kernels.cu), then two kernels, no atomics: dK and dV per block
//            of 64 keys (one warp per 16 keys, query tiles in ascending order: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ,
//            Pᵀ = exp2(Sᵀ·c − L), dSᵀ = Pᵀ·(dPᵀ − D), dV += Pᵀ·dO, dK += dSᵀ·Q), and dQ in its own pass
//            per block of 64 queries (key tiles in ascending order: dQ += dS·K). Every output element is
//            summed by one thread in one fixed order: results are bitwise reproducible.
//
// Grouped-query attention (FaArgs.group query heads per key/value head): the forward and dQ blocks read
// their query head's kv head; a dK/dV block belongs to one kv head and walks the group's query heads in
// head order, so dK and dV sum over them in one fixed order and K, V are loaded once per kv head. RoPE:
// q and k tiles are rotated in shared memory as they land (the prologue), from cos|sin tables the caller
// computed per position; dQ and dK are rotated back in registers before they are stored.
//
// Shared-memory tiles hold rows of hs bf16 (hs/8 chunks of 16 bytes), chunk c of row r stored at
// gemm_swizzle_chunk(r, c, hs/8) (gemm.h: conflict-free ldmatrix), and every fragment address comes from
// gemm_mma_ldsm_a/b (gemm.h), so this file adds only the attention-specific arithmetic.
#ifndef LLM4D_ATTENTION_H
#define LLM4D_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "gemm.h"

#if defined(__CUDACC__)
#define FA_HD static inline __host__ __device__
#else
#define FA_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FA_THREADS = 128,      // 4 warps
    FA_FWD_MT = 2,         // forward: m16 tiles per warp, so 32 query rows per warp
    FA_FWD_BQ = 64 * FA_FWD_MT, // forward: query rows per block
    FA_BWD_BQ = 64,        // dQ pass: query rows per block (16 per warp)
    FA_BWD_BK = 64,        // dK/dV pass: keys per block (16 per warp)
};

// Keys per tile in the forward and the dQ pass (64 for hs 64; 32 for hs 128 in the forward, so that the
// score and output accumulators fit in registers), and query rows per tile in the dK/dV pass.
FA_HD int fa_fwd_bk(int hs) { return hs == 128 ? 32 : 64; }
FA_HD int fa_dq_bk(int hs) { (void)hs; return 64; }
FA_HD int fa_dkv_bq(int hs) { return hs == 128 ? 32 : 64; }

// One tensor view: element (b, t, h, i) at p[b*bs + t*ts + h*hs + i]; f32 says the element type (bf16
// otherwise).
typedef struct FaView {
    void *p;
    long long bs, ts;
    int f32;
} FaView;

typedef struct FaShape {
    int B, NH, hs, Tq, q0, Tk, k0;
} FaShape;

typedef struct FaArgs {
    FaView q, k, v, out, dout, dq, dk, dv; // q, k, v, dout bf16; out, dq, dk, dv bf16 or fp32
    float *lse;                           // [B, NH, Tq]
    const float *D;                       // backward: rowsum(dout·out) [B, NH, Tq]
    FaShape d;
    int merge;      // forward: merge into (out, lse) by the log-sum-exp rule
    int accumulate; // backward: dq, dk, dv += (else =)
    // Grouped-query attention: `group` query heads share each key/value head (query head h reads kv head
    // h / group; k, v, dk, dv hold NH / group heads); 0 or 1: multi-head attention.
    int group;
    // RoPE (kernels.h): the cos|sin rows [Tq][hs] of the queries' and [Tk][hs] of the keys' positions
    // (fp32, device memory); q and k are given unrotated and rotated as their tiles land in shared
    // memory, dq and dk are rotated back before they are stored. NULL: none.
    const float *rope_q, *rope_k;
} FaArgs;

// Whether the tensor-core kernels take this problem: head size 64 or 128, the inputs bf16, every view
// 16-byte aligned with strides that are multiples of 8 elements (the loads move 16 bytes, the stores
// two elements). `backward` adds dout, dq, dk, dv. NULL when they can, else the reason.
FA_HD const char *fa_check_view(const FaView *v, int must_bf16) {
    if (!v->p) return "null view";
    if (must_bf16 && v->f32) return "input not bf16";
    if ((uintptr_t)v->p % 16) return "view not 16-byte aligned";
    if (v->bs % 8 || v->ts % 8 || v->bs < 0 || v->ts < 0) return "view strides not multiples of 8 elements";
    return 0;
}
FA_HD const char *fa_unsupported(const FaArgs *a, int backward) {
    if (a->d.hs != 64 && a->d.hs != 128) return "head size not 64 or 128";
    if (a->d.B <= 0 || a->d.NH <= 0 || a->d.Tq < 0 || a->d.Tk < 0) return "empty or negative shape";
    if (a->group > 1 && a->d.NH % a->group) return "query heads not a multiple of the group";
    if (!a->rope_q != !a->rope_k) return "RoPE tables for only one of q and k";
    const char *r;
    if ((r = fa_check_view(&a->q, 1)) || (r = fa_check_view(&a->k, 1)) || (r = fa_check_view(&a->v, 1)) ||
        (r = fa_check_view(&a->out, 0)))
        return r;
    if (backward && ((r = fa_check_view(&a->dout, 1)) || (r = fa_check_view(&a->dq, 0)) ||
                     (r = fa_check_view(&a->dk, 0)) || (r = fa_check_view(&a->dv, 0))))
        return r;
    return 0;
}

// Keys of the block visible to at least one of the query rows [t0, t0 + n): a prefix of the keys,
// s < min(Tk, q0 + t0 + n - 1 - k0 + 1), clamped at 0.
FA_HD int fa_visible_keys(const FaShape *d, int t0, int n) {
    long long lim = (long long)d->q0 + t0 + n - d->k0;
    if (n <= 0 || lim <= 0) return 0;
    return lim < d->Tk ? (int)lim : d->Tk;
}

// Key tiles of `bk` keys that the query rows [t0, t0 + n) need, from tile 0.
FA_HD int fa_key_tiles(const FaShape *d, int t0, int n, int bk) { return (fa_visible_keys(d, t0, n) + bk - 1) / bk; }

// The first tile of `bq` query rows that sees key s0 (the first key of a key tile; later keys are seen
// no earlier), or Tq rounded up to bq when no query row sees it.
FA_HD int fa_first_query_tile(const FaShape *d, int s0, int bq) {
    long long t = (long long)d->k0 + s0 - d->q0; // the first query row whose position reaches the key's
    if (t < 0) t = 0;
    if (t >= d->Tq) return (d->Tq + bq - 1) / bq * bq;
    return (int)(t / bq) * bq;
}

// Key s (block-local) is visible to query row t.
FA_HD int fa_visible(const FaShape *d, int t, int s) {
    return s >= 0 && s < d->Tk && t >= 0 && (long long)d->k0 + s <= (long long)d->q0 + t;
}

// The same per row of a tile: query row t sees exactly the keys s0 + c of the tile with c < the limit
// (which may be <= 0: none), and key s is seen by exactly the query rows t0 + c with c >= the first
// column (when s < Tk; keys past Tk are seen by none).
FA_HD int fa_row_limit(const FaShape *d, int t, int s0) {
    long long lim = (long long)d->q0 + t - d->k0 + 1, tk = d->Tk;
    lim = lim < tk ? lim : tk;
    lim -= s0;
    return lim < -1 ? -1 : lim > 1 << 30 ? 1 << 30 : (int)lim;
}
FA_HD int fa_col_first(const FaShape *d, int s, int t0) {
    if (s >= d->Tk) return 1 << 30;
    long long c = (long long)d->k0 + s - d->q0 - t0;
    return c < -1 ? -1 : c > 1 << 30 ? 1 << 30 : (int)c;
}

// Whether every key of the tile [s0, s0 + bk) is visible to every query row of [t0, t0 + bq) that
// exists: then the kernel skips the mask. (Rows past Tq are never stored and carry zero weight.)
FA_HD int fa_tile_unmasked(const FaShape *d, int t0, int s0, int bk) {
    return s0 + bk <= d->Tk && (long long)d->k0 + s0 + bk - 1 <= (long long)d->q0 + t0;
}

// mma.m16n8k16 accumulator register i (0..3) of lane `lane` in an n8 tile: row g or g+8 of the 16, column
// 2c or 2c+1 of the 8 (g = lane/4, c = lane%4).
FA_HD int fa_acc_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
FA_HD int fa_acc_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// The accumulators of two neighbouring n8 tiles (columns 16kk..16kk+15 of a 16-row block) are the A
// operand of the next product's k-step kk: A register r (0..3) packs the accumulator pair i = 2(r%2),
// 2(r%2)+1 of n8 tile 2kk + r/2 (PTX ISA fragment layouts: a0 rows g, k 2c..; a1 rows g+8; a2, a3 k+8).
FA_HD int fa_a_tile(int kk, int r) { return 2 * kk + (r >> 1); }
FA_HD int fa_a_pair(int r) { return 2 * (r & 1); }

// The tile loader's share of a tile of `rows` rows of hs bf16: 16-byte chunk q (q = thread + FA_THREADS*i)
// is row q / (hs/8), chunk q % (hs/8), stored at the swizzled chunk.
FA_HD void fa_load_coords(int q, int hs, int *row, int *chunk) {
    int cpr = hs / 8;
    *row = q / cpr;
    *chunk = q % cpr;
}
// Byte offset in a tile of the 16-byte chunk `chunk` of row `row`.
FA_HD uint32_t fa_smem_off(int row, int chunk, int hs) {
    int cpr = hs / 8;
    return (uint32_t)(row * cpr + gemm_swizzle_chunk(row, chunk, cpr)) * 16u;
}

// Shared memory of each kernel in bytes, for hs (tiles of bf16 rows; the backward's per-row statistics
// in fp32).
FA_HD size_t fa_fwd_smem(int hs) { return (size_t)(FA_FWD_BQ + 4 * fa_fwd_bk(hs)) * hs * 2; }
FA_HD size_t fa_dq_smem(int hs) { return (size_t)(2 * FA_BWD_BQ + 4 * fa_dq_bk(hs)) * hs * 2; }
FA_HD size_t fa_dkv_smem(int hs) {
    return (size_t)(2 * FA_BWD_BK + 4 * fa_dkv_bq(hs)) * hs * 2 + (size_t)4 * fa_dkv_bq(hs) * 4;
}

#ifdef __cplusplus
}
#endif

// Entry points (attention.cu): launch on `stream` (a cudaStream_t) and return 0, or return -1 without
// launching when fa_unsupported says no or the device is older than sm_80.
#ifdef __cplusplus
extern "C" {
#endif
int fa_forward(const FaArgs *a, void *stream);
int fa_backward(const FaArgs *a, void *stream); // needs a->D
#ifdef __cplusplus
}
#endif

#endif

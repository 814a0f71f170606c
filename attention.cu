// attention.cu: causal flash attention on tensor cores (the contract and the algorithm are in
// attention.h). Three kernels, each 4 warps of mma.sync m16n8k16 (bf16 operands, fp32 accumulators)
// fed by ldmatrix from XOR-swizzled shared-memory tiles that cp.async fills two tiles ahead:
//  - fa_fwd_kernel: 128 query rows per block (32 per warp, FA_FWD_MT m16 tiles) against key tiles in ascending order;
//  - fa_dkv_kernel: 64 keys per block (16 per warp) against query tiles in ascending order;
//  - fa_dq_kernel: 64 query rows per block (16 per warp) against key tiles in ascending order.
// Heavy blocks first: causal blocks late in the sequence (forward, dQ) or early (dK/dV) see the most
// work, so they are launched first. No atomics: each output element belongs to one thread.
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

extern "C" {
#include "attention.h"
#include "common.h"
#include "gemm.h"
}
#include "common.cuh"

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

// two fp32 values into a bf16 pair register (round to nearest even): lo in the low half
__device__ __forceinline__ uint32_t fa_pack_bf16(float lo, float hi) {
    return cvt_bf16x2(hi, lo);
}
__device__ __forceinline__ float fa_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
// round to nearest even, NaN stays a quiet NaN: f32_to_bf16 of kernels.h
__device__ __forceinline__ uint16_t fa_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// element offset of row t, channel 0 of head h in batch b
__device__ __forceinline__ long long fa_off(const FaView &v, int b, int t, int h, int hs) {
    return b * v.bs + t * v.ts + (long long)h * hs;
}

// Two neighbouring elements (i, i+1) of a view's row, as fp32: load, and store or add.
__device__ __forceinline__ float2 fa_ld2(const FaView &v, long long off) {
    if (v.f32) return *reinterpret_cast<const float2 *>((const float *)v.p + off);
    uint32_t w = *reinterpret_cast<const uint32_t *>((const uint16_t *)v.p + off);
    return make_float2(fa_bf2f((uint16_t)(w & 0xffffu)), fa_bf2f((uint16_t)(w >> 16)));
}
__device__ __forceinline__ void fa_st2(const FaView &v, long long off, float x, float y, int accumulate) {
    if (accumulate) {
        float2 o = fa_ld2(v, off);
        x = o.x + x;
        y = o.y + y;
    }
    if (v.f32) *reinterpret_cast<float2 *>((float *)v.p + off) = make_float2(x, y);
    else *reinterpret_cast<uint32_t *>((uint16_t *)v.p + off) = (uint32_t)fa_f2bf(x) | (uint32_t)fa_f2bf(y) << 16;
}

// Rows [r0, r0 + ROWS) of one head of a bf16 view (base points at row 0, channel 0) into a shared tile;
// rows at or past nrows read zeros.
template <int ROWS, int HS>
__device__ __forceinline__ void fa_load_tile(uint32_t dst, const uint16_t *base, long long ts, int r0, int nrows, int tid) {
    constexpr int PER = ROWS * (HS / 8) / FA_THREADS;
    static_assert(ROWS * (HS / 8) % FA_THREADS == 0, "a tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int row, ch;
        fa_load_coords(tid + i * FA_THREADS, HS, &row, &ch);
        const int t = r0 + row;
        const bool ok = t < nrows;
        cp_async16(dst + fa_smem_off(row, ch, HS), ok ? base + (long long)t * ts + ch * 8 : base, ok ? 16 : 0);
    }
}

// A operand (16 rows from row m, k-step kk) of a tile whose rows are the operand's rows
template <int HS> __device__ __forceinline__ void fa_lda(uint32_t tile, int m, int kk, int lane, uint32_t (&a)[4]) {
    int row, ch;
    gemm_mma_ldsm_a(1, m, kk, lane, &row, &ch);
    ldsm_x4(tile + fa_smem_off(row, ch, HS), a);
}
// B operands of two n8 blocks (n, n+8) at k-step kk. kmajor: the tile's rows are the n's (S = X·Yᵀ);
// otherwise its rows are the k's (O = P·V), read transposed.
template <int HS, bool KMAJOR>
__device__ __forceinline__ void fa_ldb(uint32_t tile, int n, int kk, int lane, uint32_t (&b)[4]) {
    int row, ch;
    gemm_mma_ldsm_b(KMAJOR, n, kk, lane, &row, &ch);
    if (KMAJOR) ldsm_x4(tile + fa_smem_off(row, ch, HS), b);
    else ldsm_x4_t(tile + fa_smem_off(row, ch, HS), b);
}

// The A operand of k-step kk made of accumulator tiles 2kk and 2kk+1 (attention.h: fa_a_tile, fa_a_pair)
template <int NT> __device__ __forceinline__ void fa_acc_to_a(const float (&s)[NT][4], int kk, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int j = fa_a_tile(kk, r), p = fa_a_pair(r);
        a[r] = fa_pack_bf16(s[j][p], s[j][p + 1]);
    }
}

// RoPE (kernels.h) on the rows [0, ROWS) of a bf16 tile in shared memory (tile: its generic address),
// which hold the view's rows r0..: channel pair (i, i + HS/2) rotated by the table row cs[(r0 + row)·HS]
// in fp32 and rounded back to bf16, in place; rows at or past nrows (zeros) are left alone. Each pair
// belongs to one thread; the caller syncs before (the tile landed) and after (before ldmatrix).
template <int ROWS, int HS>
__device__ __forceinline__ void fa_rope_tile(uint8_t *tile, const float *cs, int r0, int nrows, int tid) {
    constexpr int HALF = HS / 2; // a multiple of 8: both channels of a pair sit at the same place of their chunks
    for (int q = tid; q < ROWS * HALF; q += FA_THREADS) {
        const int row = q / HALF, i = q % HALF, t = r0 + row;
        if (t >= nrows) continue;
        uint16_t *x = reinterpret_cast<uint16_t *>(tile + fa_smem_off(row, i / 8, HS)) + i % 8;
        uint16_t *y = reinterpret_cast<uint16_t *>(tile + fa_smem_off(row, (i + HALF) / 8, HS)) + i % 8;
        const float c = cs[(long long)t * HS + i], sn = cs[(long long)t * HS + HALF + i];
        const float xa = fa_bf2f(*x), xb = fa_bf2f(*y);
        *x = fa_f2bf(xa * c - xb * sn);
        *y = fa_f2bf(xb * c + xa * sn);
    }
}

// The transposed rotation (the gradient of the unrotated input) on accumulator row half r of an output
// tile [DT n8 blocks] of view row cs_row's token: block j and j + DT/2 hold channels c and c + HS/2 in the
// same registers of the same thread, so it needs no shuffle.
template <int DT> __device__ __forceinline__ void fa_rope_acc_t(float (&o)[DT][4], int r, const float *cs_row, int lane) {
    constexpr int HALF = DT * 4;
#pragma unroll
    for (int j = 0; j < DT / 2; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int c = 8 * j + fa_acc_col(lane, e);
            const float cs = cs_row[c], sn = cs_row[HALF + c], xa = o[j][2 * r + e], xb = o[j + DT / 2][2 * r + e];
            o[j][2 * r + e] = xa * cs + xb * sn;
            o[j + DT / 2][2 * r + e] = xb * cs - xa * sn;
        }
}

// query heads per key/value head
__device__ __forceinline__ int fa_group(const FaArgs &a) { return a.group > 1 ? a.group : 1; }

// ---------------------------------------------------------------------------------------------
// forward

template <int HS, int BK, int MT>
__global__ void __launch_bounds__(FA_THREADS) fa_fwd_kernel(const __grid_constant__ FaArgs a, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BQ = 64 * MT, NT = BK / 8, DT = HS / 8;
    constexpr uint32_t QBYTES = BQ * HS * 2, KBYTES = BK * HS * 2;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sQ = smem_u32(smem), sK0 = sQ + QBYTES, sV0 = sK0 + 2 * KBYTES;
    const FaShape &d = a.d; // read from the parameter bank, not copied into registers
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int bh = blockIdx.x, b = bh / d.NH, h = bh % d.NH, hk = h / fa_group(a);
    const int t0 = (gridDim.y - 1 - blockIdx.y) * BQ, nq = min(BQ, d.Tq - t0);
    const int nkt = fa_key_tiles(&d, t0, nq, BK);
    const uint16_t *qb = (const uint16_t *)a.q.p + fa_off(a.q, b, 0, h, HS);
    const uint16_t *kb = (const uint16_t *)a.k.p + fa_off(a.k, b, 0, hk, HS);
    const uint16_t *vb = (const uint16_t *)a.v.p + fa_off(a.v, b, 0, hk, HS);

    fa_load_tile<BQ, HS>(sQ, qb, a.q.ts, t0, d.Tq, tid);
    if (nkt > 0) {
        fa_load_tile<BK, HS>(sK0, kb, a.k.ts, 0, d.Tk, tid);
        fa_load_tile<BK, HS>(sV0, vb, a.v.ts, 0, d.Tk, tid);
    }
    cp_async_commit();

    float o[MT][DT][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int j = 0; j < DT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[mt][j][i] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    const int wrow = t0 + warp * 16 * MT; // this warp's first query row

    for (int kt = 0; kt < nkt; kt++) {
        const int buf = kt & 1;
        if (kt + 1 < nkt) { // the next tile streams in while this one is used
            fa_load_tile<BK, HS>(sK0 + (buf ^ 1) * KBYTES, kb, a.k.ts, (kt + 1) * BK, d.Tk, tid);
            fa_load_tile<BK, HS>(sV0 + (buf ^ 1) * KBYTES, vb, a.v.ts, (kt + 1) * BK, d.Tk, tid);
        }
        cp_async_commit();
        cp_async_wait<1>(); // everything but the newest group: Q and tile kt have landed
        __syncthreads();
        const uint32_t sK = sK0 + buf * KBYTES, sV = sV0 + buf * KBYTES;
        if (a.rope_q) { // RoPE in the prologue: the queries with the first tile, every key tile as it lands
            if (kt == 0) fa_rope_tile<BQ, HS>(smem, a.rope_q, t0, d.Tq, tid);
            fa_rope_tile<BK, HS>(smem + (sK - sQ), a.rope_k, kt * BK, d.Tk, tid);
            __syncthreads();
        }

        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) s[mt][j][i] = 0.0f;
#pragma unroll 1 // kk only moves addresses: a loop keeps registers for the accumulators
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) fa_lda<HS>(sQ, warp * 16 * MT + mt * 16, kk, lane, qa[mt]);
#pragma unroll
            for (int nj = 0; nj < NT / 2; nj++) {
                uint32_t kf[4];
                fa_ldb<HS, true>(sK, nj * 16, kk, lane, kf);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(s[mt][2 * nj], qa[mt], kf[0], kf[1]);
                    mma_16816(s[mt][2 * nj + 1], qa[mt], kf[2], kf[3]);
                }
            }
        }

        // online softmax, base 2: m is the running max of the scaled scores, l the running sum of
        // exp2(score - m) over this thread's columns (the quad's partial sums are added at the end)
        const int s0 = kt * BK;
        const bool unmasked = fa_tile_unmasked(&d, wrow, s0, BK);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int lim = unmasked ? BK : fa_row_limit(&d, wrow + mt * 16 + fa_acc_row(lane, 2 * r), s0);
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float x = s[mt][j][2 * r + e] * scale_log2;
                        if (8 * j + fa_acc_col(lane, e) >= lim) x = -INFINITY;
                        s[mt][j][2 * r + e] = x;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[mt][r], mx), muse = mnew == -INFINITY ? 0.0f : mnew;
                const float alpha = exp2f(m[mt][r] - muse);
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float p = exp2f(s[mt][j][2 * r + e] - muse);
                        s[mt][j][2 * r + e] = p;
                        sum += p;
                    }
                l[mt][r] = l[mt][r] * alpha + sum;
                m[mt][r] = mnew;
#pragma unroll
                for (int j = 0; j < DT; j++) {
                    o[mt][j][2 * r] *= alpha;
                    o[mt][j][2 * r + 1] *= alpha;
                }
            }

        // O += P·V, P straight from the accumulators (packed to bf16 first: half the registers)
        uint32_t pa[MT][BK / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) fa_acc_to_a<NT>(s[mt], kk, pa[mt][kk]);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
#pragma unroll
            for (int dj = 0; dj < DT / 2; dj++) {
                uint32_t vf[4];
                fa_ldb<HS, false>(sV, dj * 16, kk, lane, vf);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(o[mt][2 * dj], pa[mt][kk], vf[0], vf[1]);
                    mma_16816(o[mt][2 * dj + 1], pa[mt][kk], vf[2], vf[3]);
                }
            }
        }
        __syncthreads(); // every warp is done with this buffer before the next loads overwrite it
    }
    cp_async_wait<0>();

    // out = O / l and lse = (m + log2 l)·ln 2 (natural log of Σ exp of the scaled scores), or both
    // merged into what earlier key blocks left by the log-sum-exp rule (kernels.h). Every lane of a
    // quad reads the row's old lse before one of them writes the new one (after the __syncwarp).
    float lnew[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[mt][r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1); // a butterfly: every lane of the quad gets the same sum
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            const int t = wrow + mt * 16 + fa_acc_row(lane, 2 * r);
            float lb = lt > 0.0f ? (m[mt][r] + log2f(lt)) * FA_LN2 : -INFINITY, inv = lt > 0.0f ? 1.0f / lt : 0.0f;
            lnew[mt][r] = NAN; // NaN: nothing to write
            if (t >= d.Tq) continue;
            float wa = 0.0f, wb = 1.0f;
            int mix = 0;
            if (a.merge) {
                const float la = a.lse[(long long)bh * d.Tq + t];
                if (lb == -INFINITY) continue; // this block adds nothing to the row
                if (la != -INFINITY) {
                    const float mx = fmaxf(la, lb), ln = mx + logf(expf(la - mx) + expf(lb - mx));
                    wa = expf(la - ln);
                    wb = expf(lb - ln);
                    lb = ln;
                    mix = 1;
                }
            }
            lnew[mt][r] = lb;
            const long long oo = fa_off(a.out, b, t, h, HS) + fa_acc_col(lane, 0);
#pragma unroll
            for (int j = 0; j < DT; j++) {
                float x = o[mt][j][2 * r] * inv, y = o[mt][j][2 * r + 1] * inv;
                if (mix) {
                    const float2 old = fa_ld2(a.out, oo + 8 * j);
                    x = old.x * wa + x * wb;
                    y = old.y * wa + y * wb;
                }
                fa_st2(a.out, oo + 8 * j, x, y, 0);
            }
        }
    __syncwarp();
    if ((lane & 3) == 0)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (!isnan(lnew[mt][r])) a.lse[(long long)bh * d.Tq + wrow + mt * 16 + fa_acc_row(lane, 2 * r)] = lnew[mt][r];
#endif
}

// ---------------------------------------------------------------------------------------------
// backward: dK and dV per block of keys

template <int HS, int BQ>
__global__ void __launch_bounds__(FA_THREADS) fa_dkv_kernel(const __grid_constant__ FaArgs a, float scale_log2, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BKV = FA_BWD_BK, NT = BQ / 8, DT = HS / 8;
    constexpr uint32_t KBYTES = BKV * HS * 2, QBYTES = BQ * HS * 2;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sK = smem_u32(smem), sV = sK + KBYTES, sQ0 = sV + KBYTES, sO0 = sQ0 + 2 * QBYTES;
    float *sL = reinterpret_cast<float *>(smem + 2 * KBYTES + 4 * QBYTES); // [2][BQ] lse·log2e, +inf: no weight
    float *sD = sL + 2 * BQ;                                                // [2][BQ]
    const FaShape &d = a.d; // read from the parameter bank, not copied into registers
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // one block per (batch, key/value head): the group's query heads run in head order, each over its
    // query tiles in ascending order, all adding into the same dK, dV accumulators (a fixed order)
    const int group = fa_group(a), NKV = d.NH / group;
    const int bh = blockIdx.x, b = bh / NKV, hk = bh % NKV;
    const int s0 = blockIdx.y * BKV;
    const int qstart = fa_first_query_tile(&d, s0, BQ), ntiles = qstart < d.Tq ? (d.Tq - qstart + BQ - 1) / BQ : 0;
    if (ntiles == 0 && a.accumulate) return; // no query sees these keys: nothing to add
    const uint16_t *kb = (const uint16_t *)a.k.p + fa_off(a.k, b, 0, hk, HS);
    const uint16_t *vb = (const uint16_t *)a.v.p + fa_off(a.v, b, 0, hk, HS);

    // query tile `it` of the walk over (head of the group, tile): its Q and dO tiles and row statistics
    // into buffer `buf` (the statistics by plain stores: the barrier after the cp.async wait orders them too)
    auto load_qtile = [&](int buf, int it) {
        const int h = hk * group + it / ntiles, qt = qstart + (it % ntiles) * BQ;
        const uint16_t *qb = (const uint16_t *)a.q.p + fa_off(a.q, b, 0, h, HS);
        const uint16_t *ob = (const uint16_t *)a.dout.p + fa_off(a.dout, b, 0, h, HS);
        fa_load_tile<BQ, HS>(sQ0 + buf * QBYTES, qb, a.q.ts, qt, d.Tq, tid);
        fa_load_tile<BQ, HS>(sO0 + buf * QBYTES, ob, a.dout.ts, qt, d.Tq, tid);
        const float *lse = a.lse + ((long long)b * d.NH + h) * d.Tq, *D = a.D + ((long long)b * d.NH + h) * d.Tq;
        for (int i = tid; i < BQ; i += FA_THREADS) {
            const int t = qt + i;
            const float L = t < d.Tq ? lse[t] : -INFINITY;
            sL[buf * BQ + i] = L == -INFINITY ? INFINITY : L * FA_LOG2E;
            sD[buf * BQ + i] = t < d.Tq ? D[t] : 0.0f;
        }
    };

    fa_load_tile<BKV, HS>(sK, kb, a.k.ts, s0, d.Tk, tid);
    fa_load_tile<BKV, HS>(sV, vb, a.v.ts, s0, d.Tk, tid);
    if (ntiles > 0) load_qtile(0, 0);
    cp_async_commit();

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[j][i] = dv[j][i] = 0.0f;
    const int wkey = s0 + warp * 16; // this warp's first key

    for (int it = 0; it < group * ntiles; it++) {
        const int buf = it & 1, qt = qstart + (it % ntiles) * BQ;
        if (it + 1 < group * ntiles) load_qtile(buf ^ 1, it + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint32_t sQ = sQ0 + buf * QBYTES, sO = sO0 + buf * QBYTES;
        if (a.rope_q) { // RoPE in the prologue: the keys with the first tile, every query tile as it lands
            if (it == 0) fa_rope_tile<BKV, HS>(smem, a.rope_k, s0, d.Tk, tid);
            fa_rope_tile<BQ, HS>(smem + (sQ - sK), a.rope_q, qt, d.Tq, tid);
            __syncthreads();
        }
        const float *L = sL + buf * BQ, *Dq = sD + buf * BQ;

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: rows are this warp's 16 keys, columns the tile's queries
        float st[NT][4], dpt[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) st[j][i] = dpt[j][i] = 0.0f;
#pragma unroll 1 // kk only moves addresses: a loop keeps registers for the accumulators
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t ka[4], va[4];
            fa_lda<HS>(sK, warp * 16, kk, lane, ka);
            fa_lda<HS>(sV, warp * 16, kk, lane, va);
#pragma unroll
            for (int nj = 0; nj < NT / 2; nj++) {
                uint32_t qf[4], of[4];
                fa_ldb<HS, true>(sQ, nj * 16, kk, lane, qf);
                fa_ldb<HS, true>(sO, nj * 16, kk, lane, of);
                mma_16816(st[2 * nj], ka, qf[0], qf[1]);
                mma_16816(st[2 * nj + 1], ka, qf[2], qf[3]);
                mma_16816(dpt[2 * nj], va, of[0], of[1]);
                mma_16816(dpt[2 * nj + 1], va, of[2], of[3]);
            }
        }
        // Pᵀ = exp2(Sᵀ·c − L) where visible (0 elsewhere and for rows without weight), dSᵀ = Pᵀ·(dPᵀ − D)
        const bool unmasked = fa_tile_unmasked(&d, qt, wkey, 16);
        int first[2];
#pragma unroll
        for (int r = 0; r < 2; r++) first[r] = unmasked ? 0 : fa_col_first(&d, wkey + fa_acc_row(lane, 2 * r), qt);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int col = 8 * j + fa_acc_col(lane, i);
                float p = 0.0f;
                if (col >= first[i >> 1]) p = exp2f(st[j][i] * scale_log2 - L[col]);
                st[j][i] = p;
                dpt[j][i] = p * (dpt[j][i] - Dq[col]);
            }
        // dV += Pᵀ·dO and dK += dSᵀ·Q: the k dimension is the tile's queries
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t pa[4], dsa[4];
            fa_acc_to_a<NT>(st, kk, pa);
            fa_acc_to_a<NT>(dpt, kk, dsa);
#pragma unroll
            for (int dj = 0; dj < DT / 2; dj++) {
                uint32_t of[4], qf[4];
                fa_ldb<HS, false>(sO, dj * 16, kk, lane, of);
                fa_ldb<HS, false>(sQ, dj * 16, kk, lane, qf);
                mma_16816(dv[2 * dj], pa, of[0], of[1]);
                mma_16816(dv[2 * dj + 1], pa, of[2], of[3]);
                mma_16816(dk[2 * dj], dsa, qf[0], qf[1]);
                mma_16816(dk[2 * dj + 1], dsa, qf[2], qf[3]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();

    // dK carries the 1/sqrt(hs) of the scores (the queries were not scaled); with RoPE it is rotated back
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = wkey + fa_acc_row(lane, 2 * r);
        if (key >= d.Tk) continue;
        if (a.rope_k) fa_rope_acc_t<DT>(dk, r, a.rope_k + (long long)key * HS, lane);
        const long long ko = fa_off(a.dk, b, key, hk, HS), vo = fa_off(a.dv, b, key, hk, HS);
#pragma unroll
        for (int j = 0; j < DT; j++) {
            const int c = 8 * j + fa_acc_col(lane, 0);
            fa_st2(a.dk, ko + c, dk[j][2 * r] * scale, dk[j][2 * r + 1] * scale, a.accumulate);
            fa_st2(a.dv, vo + c, dv[j][2 * r], dv[j][2 * r + 1], a.accumulate);
        }
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// backward: dQ per block of queries

template <int HS, int BK>
__global__ void __launch_bounds__(FA_THREADS) fa_dq_kernel(const __grid_constant__ FaArgs a, float scale_log2, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BQ = FA_BWD_BQ, NT = BK / 8, DT = HS / 8;
    constexpr uint32_t QBYTES = BQ * HS * 2, KBYTES = BK * HS * 2;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sQ = smem_u32(smem), sO = sQ + QBYTES, sK0 = sO + QBYTES, sV0 = sK0 + 2 * KBYTES;
    const FaShape &d = a.d; // read from the parameter bank, not copied into registers
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int bh = blockIdx.x, b = bh / d.NH, h = bh % d.NH, hk = h / fa_group(a);
    const int t0 = (gridDim.y - 1 - blockIdx.y) * BQ, nq = min(BQ, d.Tq - t0);
    const int nkt = fa_key_tiles(&d, t0, nq, BK);
    const uint16_t *qb = (const uint16_t *)a.q.p + fa_off(a.q, b, 0, h, HS);
    const uint16_t *ob = (const uint16_t *)a.dout.p + fa_off(a.dout, b, 0, h, HS);
    const uint16_t *kb = (const uint16_t *)a.k.p + fa_off(a.k, b, 0, hk, HS);
    const uint16_t *vb = (const uint16_t *)a.v.p + fa_off(a.v, b, 0, hk, HS);
    const int wrow = t0 + warp * 16;

    fa_load_tile<BQ, HS>(sQ, qb, a.q.ts, t0, d.Tq, tid);
    fa_load_tile<BQ, HS>(sO, ob, a.dout.ts, t0, d.Tq, tid);
    if (nkt > 0) {
        fa_load_tile<BK, HS>(sK0, kb, a.k.ts, 0, d.Tk, tid);
        fa_load_tile<BK, HS>(sV0, vb, a.v.ts, 0, d.Tk, tid);
    }
    cp_async_commit();

    // this thread's two rows: lse·log2e (+inf: the row carries no weight) and D
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = wrow + fa_acc_row(lane, 2 * r);
        const float x = t < d.Tq ? a.lse[(long long)bh * d.Tq + t] : -INFINITY;
        L[r] = x == -INFINITY ? INFINITY : x * FA_LOG2E;
        Dr[r] = t < d.Tq ? a.D[(long long)bh * d.Tq + t] : 0.0f;
    }
    float dq[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) dq[j][i] = 0.0f;

    for (int kt = 0; kt < nkt; kt++) {
        const int buf = kt & 1;
        if (kt + 1 < nkt) {
            fa_load_tile<BK, HS>(sK0 + (buf ^ 1) * KBYTES, kb, a.k.ts, (kt + 1) * BK, d.Tk, tid);
            fa_load_tile<BK, HS>(sV0 + (buf ^ 1) * KBYTES, vb, a.v.ts, (kt + 1) * BK, d.Tk, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint32_t sK = sK0 + buf * KBYTES, sV = sV0 + buf * KBYTES;
        if (a.rope_q) { // RoPE in the prologue: the queries with the first tile, every key tile as it lands
            if (kt == 0) fa_rope_tile<BQ, HS>(smem, a.rope_q, t0, d.Tq, tid);
            fa_rope_tile<BK, HS>(smem + (sK - sQ), a.rope_k, kt * BK, d.Tk, tid);
            __syncthreads();
        }

        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[j][i] = dp[j][i] = 0.0f;
#pragma unroll 1 // kk only moves addresses: a loop keeps registers for the accumulators
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t qa[4], oa[4];
            fa_lda<HS>(sQ, warp * 16, kk, lane, qa);
            fa_lda<HS>(sO, warp * 16, kk, lane, oa);
#pragma unroll
            for (int nj = 0; nj < NT / 2; nj++) {
                uint32_t kf[4], vf[4];
                fa_ldb<HS, true>(sK, nj * 16, kk, lane, kf);
                fa_ldb<HS, true>(sV, nj * 16, kk, lane, vf);
                mma_16816(s[2 * nj], qa, kf[0], kf[1]);
                mma_16816(s[2 * nj + 1], qa, kf[2], kf[3]);
                mma_16816(dp[2 * nj], oa, vf[0], vf[1]);
                mma_16816(dp[2 * nj + 1], oa, vf[2], vf[3]);
            }
        }
        const int s0 = kt * BK;
        const bool unmasked = fa_tile_unmasked(&d, wrow, s0, BK);
        int lim[2];
#pragma unroll
        for (int r = 0; r < 2; r++) lim[r] = unmasked ? BK : fa_row_limit(&d, wrow + fa_acc_row(lane, 2 * r), s0);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1;
                float p = 0.0f;
                if (8 * j + fa_acc_col(lane, i) < lim[r]) p = exp2f(s[j][i] * scale_log2 - L[r]);
                s[j][i] = p * (dp[j][i] - Dr[r]); // dS
            }
        // dQ += dS·K: the k dimension is the tile's keys
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t dsa[4];
            fa_acc_to_a<NT>(s, kk, dsa);
#pragma unroll
            for (int dj = 0; dj < DT / 2; dj++) {
                uint32_t kf[4];
                fa_ldb<HS, false>(sK, dj * 16, kk, lane, kf);
                mma_16816(dq[2 * dj], dsa, kf[0], kf[1]);
                mma_16816(dq[2 * dj + 1], dsa, kf[2], kf[3]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = wrow + fa_acc_row(lane, 2 * r);
        if (t >= d.Tq) continue;
        if (a.rope_q) fa_rope_acc_t<DT>(dq, r, a.rope_q + (long long)t * HS, lane);
        const long long qo = fa_off(a.dq, b, t, h, HS);
#pragma unroll
        for (int j = 0; j < DT; j++)
            fa_st2(a.dq, qo + 8 * j + fa_acc_col(lane, 0), dq[j][2 * r] * scale, dq[j][2 * r + 1] * scale, a.accumulate);
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// host

static int fa_device_ok(void) { return gemm_available(GEMM_KERNEL_MMA) != GEMM_KERNEL_NONE; } // sm_80 or later

// heads: the query heads (forward, dQ) or the key/value heads (dK/dV)
static dim3 fa_grid(const FaShape &d, int heads, int rows, int per_block) {
    const long long bh = (long long)d.B * heads, blocks = (rows + per_block - 1) / per_block;
    if (bh > 0x7fffffffLL || blocks > 65535) die("CUDA attention: %lld heads x %d rows is too large a grid", bh, rows);
    return dim3((unsigned)bh, (unsigned)blocks);
}

extern "C" int fa_forward(const FaArgs *a, void *stream) {
    if (fa_unsupported(a, 0) || !fa_device_ok()) return -1;
    if (a->d.Tq == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    const float scale_log2 = 1.0f / sqrtf((float)a->d.hs) * FA_LOG2E;
    const dim3 grid = fa_grid(a->d, a->d.NH, a->d.Tq, FA_FWD_BQ);
    const size_t smem = fa_fwd_smem(a->d.hs);
    if (a->d.hs == 64) {
        CK(cudaFuncSetAttribute, (fa_fwd_kernel<64, 64, FA_FWD_MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_LAUNCH(grid, FA_THREADS, smem, st, fa_fwd_kernel<64, 64, FA_FWD_MT>)(*a, scale_log2);
    } else {
        CK(cudaFuncSetAttribute, (fa_fwd_kernel<128, 32, FA_FWD_MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_LAUNCH(grid, FA_THREADS, smem, st, fa_fwd_kernel<128, 32, FA_FWD_MT>)(*a, scale_log2);
    }
    cuda_launched("fa_fwd_kernel", st);
    return 0;
}

extern "C" int fa_backward(const FaArgs *a, void *stream) {
    if (fa_unsupported(a, 1) || !a->D || !fa_device_ok()) return -1;
    cudaStream_t st = (cudaStream_t)stream;
    const float scale = 1.0f / sqrtf((float)a->d.hs), scale_log2 = scale * FA_LOG2E;
    if (a->d.Tk > 0) {
        const dim3 grid = fa_grid(a->d, a->d.NH / (a->group > 1 ? a->group : 1), a->d.Tk, FA_BWD_BK);
        const size_t smem = fa_dkv_smem(a->d.hs);
        if (a->d.hs == 64) {
            CK(cudaFuncSetAttribute, (fa_dkv_kernel<64, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CUDA_LAUNCH(grid, FA_THREADS, smem, st, fa_dkv_kernel<64, 64>)(*a, scale_log2, scale);
        } else {
            CK(cudaFuncSetAttribute, (fa_dkv_kernel<128, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CUDA_LAUNCH(grid, FA_THREADS, smem, st, fa_dkv_kernel<128, 32>)(*a, scale_log2, scale);
        }
        cuda_launched("fa_dkv_kernel", st);
    }
    if (a->d.Tq > 0) {
        const dim3 grid = fa_grid(a->d, a->d.NH, a->d.Tq, FA_BWD_BQ);
        const size_t smem = fa_dq_smem(a->d.hs);
        if (a->d.hs == 64) {
            CK(cudaFuncSetAttribute, (fa_dq_kernel<64, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CUDA_LAUNCH(grid, FA_THREADS, smem, st, fa_dq_kernel<64, 64>)(*a, scale_log2, scale);
        } else {
            CK(cudaFuncSetAttribute, (fa_dq_kernel<128, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CUDA_LAUNCH(grid, FA_THREADS, smem, st, fa_dq_kernel<128, 64>)(*a, scale_log2, scale);
        }
        cuda_launched("fa_dq_kernel", st);
    }
    return 0;
}

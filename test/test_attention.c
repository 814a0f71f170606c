// Host-side tests of the flash-attention kernels' index arithmetic (attention.h), each against an
// independent model:
//  - the visibility helpers (row limits, first columns, key tiles, first query tiles, unmasked tiles)
//    against the definition of causal visibility, by brute force over positions and block offsets;
//  - the whole forward, dK/dV and dQ kernels of attention.cu emulated warp by warp on a model of the
//    hardware: shared-memory tiles filled through fa_load_coords/fa_smem_off, ldmatrix (.trans) from
//    gemm.h's lane addresses, mma.m16n8k16 per the PTX ISA's fragment layouts, the accumulator-to-A
//    conversion (fa_a_tile/fa_a_pair), quad shuffles, the online softmax, the masks and the epilogues,
//    against plain double-precision attention (kernels.h's block semantics: positions q0, k0, merging
//    by the log-sum-exp rule, accumulation into dq, dk, dv), with outputs poisoned with NaN first.
// The emulation follows the kernels statement by statement; what it cannot see is the CUDA itself
// (cp.async group counts, barriers, the PTX strings), which only a GPU checks (test/test_cuda.c).
// Prints "N passed, N failed"; exits non-zero on any failure.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

#include "check.h"

// ------------------------------------------------------------------------------------------------
// the visibility helpers against the definition: key s is visible to query row t iff s < Tk and
// k0 + s <= q0 + t

static int def_visible(const FaShape *d, int t, int s) { return s >= 0 && s < d->Tk && d->k0 + s <= d->q0 + t; }

static void test_visibility(void) {
    int bad = 0;
    const int offs[][2] = { { 0, 0 }, { 24, 0 }, { 0, 30 }, { 100, 37 }, { 5, 200 }, { 64, 64 }, { 1000, 0 } };
    for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++)
        for (int Tq = 1; Tq <= 140; Tq += 23)
            for (int Tk = 0; Tk <= 150; Tk += 37) {
                FaShape d = { 1, 1, 64, Tq, offs[o][0], Tk, offs[o][1] };
                for (int t = 0; t < Tq; t++)
                    for (int s0 = 0; s0 < Tk + 64; s0 += 16) {
                        int lim = fa_row_limit(&d, t, s0);
                        for (int c = 0; c < 64; c++)
                            if ((c < lim) != def_visible(&d, t, s0 + c) || fa_visible(&d, t, s0 + c) != def_visible(&d, t, s0 + c))
                                bad++;
                    }
                for (int s = 0; s < Tk + 10; s++)
                    for (int t0 = 0; t0 < Tq; t0 += 32) {
                        int first = fa_col_first(&d, s, t0);
                        for (int c = 0; c < 32 && t0 + c < Tq; c++)
                            if ((c >= first) != def_visible(&d, t0 + c, s)) bad++;
                    }
                for (int bk = 16; bk <= 64; bk *= 2) {
                    for (int t0 = 0; t0 < Tq; t0 += 32) {
                        int n = Tq - t0 < 32 ? Tq - t0 : 32, tiles = fa_key_tiles(&d, t0, n, bk), last = -1;
                        for (int t = t0; t < t0 + n; t++)
                            for (int s = 0; s < Tk; s++)
                                if (def_visible(&d, t, s) && s > last) last = s;
                        // the tiles cover every visible key and end with a tile that holds one
                        if (tiles != (last + bk) / bk) bad++;
                        for (int s0 = 0; s0 < Tk; s0 += bk)
                            if (fa_tile_unmasked(&d, t0, s0, bk))
                                for (int t = t0; t < t0 + n; t++)
                                    for (int s = s0; s < s0 + bk; s++) bad += !def_visible(&d, t, s);
                    }
                    for (int s0 = 0; s0 < Tk; s0 += bk) {
                        int q = fa_first_query_tile(&d, s0, 32), seen = -1;
                        for (int t = 0; t < Tq && seen < 0; t++)
                            for (int s = s0; s < s0 + bk && s < Tk; s++)
                                if (def_visible(&d, t, s)) {
                                    seen = t;
                                    break;
                                }
                        // the first tile holds the first row that sees any key of the tile
                        if (seen < 0 ? q < Tq : (q > seen || q + 32 <= seen || q % 32)) bad++;
                    }
                }
            }
    CHECK(!bad, "visibility helpers: %d disagreements with the definition", bad);
}

// ------------------------------------------------------------------------------------------------
// a model of the warp-level hardware (PTX ISA): bf16 values as uint16, registers as pairs

static uint16_t f2bf(float f) { // round to nearest even
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t pack(float lo, float hi) { return (uint32_t)f2bf(lo) | (uint32_t)f2bf(hi) << 16; }

typedef struct {
    uint16_t *mem; // a shared-memory tile of bf16
} Tile;

// ldmatrix.x4: lane 8j+i gives the address (byte offset) of row i of matrix j; thread t receives, per
// matrix j, the pair at row t/4, columns 2(t%4), +1 (.trans: rows 2(t%4), +1 of column t/4).
static void ldsm(const Tile *tl, const uint32_t addr[32], int trans, uint32_t r[32][4]) {
    for (int t = 0; t < 32; t++)
        for (int j = 0; j < 4; j++) {
            uint16_t v[2];
            for (int h = 0; h < 2; h++) {
                int row = trans ? 2 * (t % 4) + h : t / 4, col = trans ? t / 4 : 2 * (t % 4) + h;
                v[h] = tl->mem[addr[8 * j + row] / 2 + col];
            }
            r[t][j] = (uint32_t)v[0] | (uint32_t)v[1] << 16;
        }
}

// mma.m16n8k16 (row.col, bf16 -> fp32): d += A·B with A from a[t][0..3], B from b0[t], b1[t]
static void mma(float d[32][4], const uint32_t a[32][4], const uint32_t b0[32], const uint32_t b1[32]) {
    float A[16][16], B[16][8];
    for (int t = 0; t < 32; t++) {
        int g = t / 4, c = t % 4;
        for (int h = 0; h < 2; h++) {
            A[g][2 * c + h] = bf2f((uint16_t)(a[t][0] >> (16 * h)));
            A[g + 8][2 * c + h] = bf2f((uint16_t)(a[t][1] >> (16 * h)));
            A[g][2 * c + 8 + h] = bf2f((uint16_t)(a[t][2] >> (16 * h)));
            A[g + 8][2 * c + 8 + h] = bf2f((uint16_t)(a[t][3] >> (16 * h)));
            B[2 * c + h][g] = bf2f((uint16_t)(b0[t] >> (16 * h)));
            B[2 * c + 8 + h][g] = bf2f((uint16_t)(b1[t] >> (16 * h)));
        }
    }
    for (int t = 0; t < 32; t++) {
        int g = t / 4, c = t % 4;
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i >> 1), col = 2 * c + (i & 1);
            float s = 0;
            for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
            d[t][i] += s;
        }
    }
}

// the kernels' fa_lda / fa_ldb
static void lda(const Tile *tl, int hs, int m, int kk, uint32_t a[32][4]) {
    uint32_t addr[32];
    for (int l = 0; l < 32; l++) {
        int row, ch;
        gemm_mma_ldsm_a(1, m, kk, l, &row, &ch);
        addr[l] = fa_smem_off(row, ch, hs);
    }
    ldsm(tl, addr, 0, a);
}
static void ldb(const Tile *tl, int hs, int kmajor, int n, int kk, uint32_t b[32][4]) {
    uint32_t addr[32];
    for (int l = 0; l < 32; l++) {
        int row, ch;
        gemm_mma_ldsm_b(kmajor, n, kk, l, &row, &ch);
        addr[l] = fa_smem_off(row, ch, hs);
    }
    ldsm(tl, addr, !kmajor, b);
}
// fa_acc_to_a: accumulator tiles 2kk, 2kk+1 as the A operand of k-step kk
static void acc_to_a(float (*s)[32][4], int kk, uint32_t a[32][4]) {
    for (int t = 0; t < 32; t++)
        for (int r = 0; r < 4; r++) {
            int j = fa_a_tile(kk, r), p = fa_a_pair(r);
            a[t][r] = pack(s[j][t][p], s[j][t][p + 1]);
        }
}
static void mma2(float d0[32][4], float d1[32][4], const uint32_t a[32][4], const uint32_t b[32][4]) {
    uint32_t b0[32], b1[32], b2[32], b3[32];
    for (int t = 0; t < 32; t++) b0[t] = b[t][0], b1[t] = b[t][1], b2[t] = b[t][2], b3[t] = b[t][3];
    mma(d0, a, b0, b1);
    mma(d1, a, b2, b3);
}

// ------------------------------------------------------------------------------------------------
// tensors: [B, T, NH, hs] views in float (bf16 values for the inputs), element (b,t,h,i) at
// p[b*bs + t*ts + h*hs + i]

typedef struct {
    float *p;
    long long bs, ts;
} View;

static float vget(const View *v, int b, int t, int h, int hs, int i) { return v->p[b * v->bs + t * v->ts + (long long)h * hs + i]; }
static float *vat(const View *v, int b, int t, int h, int hs, int i) { return &v->p[b * v->bs + t * v->ts + (long long)h * hs + i]; }

// fa_load_tile: rows [r0, r0 + rows) of one head into a tile, zeros past nrows
static void load_tile(Tile *tl, int rows, int hs, const View *v, int b, int h, int r0, int nrows) {
    for (int q = 0; q < rows * hs / 8; q++) {
        int row, ch;
        fa_load_coords(q, hs, &row, &ch);
        uint32_t off = fa_smem_off(row, ch, hs) / 2;
        for (int e = 0; e < 8; e++) {
            int t = r0 + row;
            tl->mem[off + e] = t < nrows ? f2bf(vget(v, b, t, h, hs, ch * 8 + e)) : 0;
        }
    }
}

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// fa_fwd_kernel, one block (bh, query tile t0), warp by warp
static void emu_fwd(const FaShape *d, View q, View k, View v, View out, float *lse, int merge, int bh, int t0) {
    const int hs = d->hs, BK = fa_fwd_bk(hs), MT = FA_FWD_MT, NT = BK / 8, DT = hs / 8, BQ = 64 * MT;
    const int b = bh / d->NH, h = bh % d->NH, nq = BQ < d->Tq - t0 ? BQ : d->Tq - t0;
    const int nkt = fa_key_tiles(d, t0, nq, BK);
    const float scale_log2 = 1.0f / sqrtf((float)hs) * LOG2E;
    Tile sQ = { calloc((size_t)BQ * hs, 2) }, sK = { calloc((size_t)BK * hs, 2) }, sV = { calloc((size_t)BK * hs, 2) };
    load_tile(&sQ, BQ, hs, &q, b, h, t0, d->Tq);
    float(*o)[16][32][4] = calloc((size_t)MT * 16 * 32 * 4, sizeof(float)); // [MT][DT<=16][lane][4]
    float(*s)[8][32][4] = calloc((size_t)MT * 8 * 32 * 4, sizeof(float));   // [MT][NT<=8][lane][4]
    for (int warp = 0; warp < 4; warp++) {
        float m[2][32][2], l[2][32][2];
        memset(o, 0, (size_t)MT * 16 * 32 * 4 * sizeof(float));
        for (int mt = 0; mt < MT; mt++)
            for (int t = 0; t < 32; t++) m[mt][t][0] = m[mt][t][1] = -INFINITY, l[mt][t][0] = l[mt][t][1] = 0;
        const int wrow = t0 + warp * 16 * MT;
        for (int kt = 0; kt < nkt; kt++) {
            load_tile(&sK, BK, hs, &k, b, h, kt * BK, d->Tk);
            load_tile(&sV, BK, hs, &v, b, h, kt * BK, d->Tk);
            memset(s, 0, (size_t)MT * 8 * 32 * 4 * sizeof(float));
            for (int kk = 0; kk < hs / 16; kk++) {
                uint32_t qa[2][32][4], kf[32][4];
                for (int mt = 0; mt < MT; mt++) lda(&sQ, hs, warp * 16 * MT + mt * 16, kk, qa[mt]);
                for (int nj = 0; nj < NT / 2; nj++) {
                    ldb(&sK, hs, 1, nj * 16, kk, kf);
                    for (int mt = 0; mt < MT; mt++) mma2(s[mt][2 * nj], s[mt][2 * nj + 1], qa[mt], kf);
                }
            }
            const int s0 = kt * BK, unmasked = fa_tile_unmasked(d, wrow, s0, BK);
            for (int mt = 0; mt < MT; mt++)
                for (int r = 0; r < 2; r++) {
                    float mx[32];
                    for (int t = 0; t < 32; t++) {
                        int lim = unmasked ? BK : fa_row_limit(d, wrow + mt * 16 + fa_acc_row(t, 2 * r), s0);
                        mx[t] = -INFINITY;
                        for (int j = 0; j < NT; j++)
                            for (int e = 0; e < 2; e++) {
                                float x = s[mt][j][t][2 * r + e] * scale_log2;
                                if (8 * j + fa_acc_col(t, e) >= lim) x = -INFINITY;
                                s[mt][j][t][2 * r + e] = x;
                                mx[t] = fmaxf(mx[t], x);
                            }
                    }
                    float q1[32], q2[32]; // shfl_xor 1, then 2
                    for (int t = 0; t < 32; t++) q1[t] = fmaxf(mx[t], mx[t ^ 1]);
                    for (int t = 0; t < 32; t++) q2[t] = fmaxf(q1[t], q1[t ^ 2]);
                    for (int t = 0; t < 32; t++) {
                        float mnew = fmaxf(m[mt][t][r], q2[t]), muse = mnew == -INFINITY ? 0.0f : mnew;
                        float alpha = exp2f(m[mt][t][r] - muse), sum = 0;
                        for (int j = 0; j < NT; j++)
                            for (int e = 0; e < 2; e++) {
                                float p = exp2f(s[mt][j][t][2 * r + e] - muse);
                                s[mt][j][t][2 * r + e] = p;
                                sum += p;
                            }
                        l[mt][t][r] = l[mt][t][r] * alpha + sum;
                        m[mt][t][r] = mnew;
                        for (int j = 0; j < DT; j++) o[mt][j][t][2 * r] *= alpha, o[mt][j][t][2 * r + 1] *= alpha;
                    }
                }
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t pa[2][32][4], vf[32][4];
                for (int mt = 0; mt < MT; mt++) acc_to_a(s[mt], kk, pa[mt]);
                for (int dj = 0; dj < DT / 2; dj++) {
                    ldb(&sV, hs, 0, dj * 16, kk, vf);
                    for (int mt = 0; mt < MT; mt++) mma2(o[mt][2 * dj], o[mt][2 * dj + 1], pa[mt], vf);
                }
            }
        }
        float lnew[2][2][32];
        for (int mt = 0; mt < MT; mt++)
            for (int r = 0; r < 2; r++) {
                float l1[32], lt[32];
                for (int t = 0; t < 32; t++) l1[t] = l[mt][t][r] + l[mt][t ^ 1][r];
                for (int t = 0; t < 32; t++) lt[t] = l1[t] + l1[t ^ 2];
                for (int lane = 0; lane < 32; lane++) {
                    const int t = wrow + mt * 16 + fa_acc_row(lane, 2 * r);
                    float lb = lt[lane] > 0 ? (m[mt][lane][r] + log2f(lt[lane])) * LN2 : -INFINITY;
                    float inv = lt[lane] > 0 ? 1.0f / lt[lane] : 0.0f, wa = 0, wb = 1;
                    lnew[mt][r][lane] = NAN;
                    if (t >= d->Tq) continue;
                    int mix = 0;
                    if (merge) {
                        float la = lse[(long long)bh * d->Tq + t];
                        if (lb == -INFINITY) continue;
                        if (la != -INFINITY) {
                            float mxx = fmaxf(la, lb), ln = mxx + logf(expf(la - mxx) + expf(lb - mxx));
                            wa = expf(la - ln);
                            wb = expf(lb - ln);
                            lb = ln;
                            mix = 1;
                        }
                    }
                    lnew[mt][r][lane] = lb;
                    for (int j = 0; j < DT; j++)
                        for (int e = 0; e < 2; e++) {
                            float *p = vat(&out, b, t, h, hs, 8 * j + fa_acc_col(lane, e));
                            float x = o[mt][j][lane][2 * r + e] * inv;
                            *p = mix ? *p * wa + x * wb : x;
                        }
                }
            }
        // __syncwarp: every lane has read the old lse; lane 4g writes row g's
        for (int lane = 0; lane < 32; lane += 4)
            for (int mt = 0; mt < MT; mt++)
                for (int r = 0; r < 2; r++)
                    if (!isnan(lnew[mt][r][lane])) lse[(long long)bh * d->Tq + wrow + mt * 16 + fa_acc_row(lane, 2 * r)] = lnew[mt][r][lane];
    }
    free(sQ.mem), free(sK.mem), free(sV.mem), free(o), free(s);
}

// fa_dkv_kernel, one block (bh, key tile s0)
static void emu_dkv(const FaShape *d, View q, View k, View v, View dout, const float *lse, const float *D, View dk,
                    View dv, int accumulate, int bh, int s0) {
    const int hs = d->hs, BQ = fa_dkv_bq(hs), BKV = FA_BWD_BK, NT = BQ / 8, DT = hs / 8;
    const int b = bh / d->NH, h = bh % d->NH;
    const float scale = 1.0f / sqrtf((float)hs), scale_log2 = scale * LOG2E;
    const int qstart = fa_first_query_tile(d, s0, BQ), ntiles = qstart < d->Tq ? (d->Tq - qstart + BQ - 1) / BQ : 0;
    if (ntiles == 0 && accumulate) return;
    Tile sK = { calloc((size_t)BKV * hs, 2) }, sV = { calloc((size_t)BKV * hs, 2) };
    Tile sQ = { calloc((size_t)BQ * hs, 2) }, sO = { calloc((size_t)BQ * hs, 2) };
    float *sL = malloc(sizeof(float) * BQ), *sD = malloc(sizeof(float) * BQ);
    load_tile(&sK, BKV, hs, &k, b, h, s0, d->Tk);
    load_tile(&sV, BKV, hs, &v, b, h, s0, d->Tk);
    for (int warp = 0; warp < 4; warp++) {
        static float dkacc[16][32][4], dvacc[16][32][4], st[8][32][4], dpt[8][32][4];
        memset(dkacc, 0, sizeof dkacc);
        memset(dvacc, 0, sizeof dvacc);
        const int wkey = s0 + warp * 16;
        for (int it = 0; it < ntiles; it++) {
            const int qt = qstart + it * BQ;
            load_tile(&sQ, BQ, hs, &q, b, h, qt, d->Tq);
            load_tile(&sO, BQ, hs, &dout, b, h, qt, d->Tq);
            for (int i = 0; i < BQ; i++) {
                int t = qt + i;
                float L = t < d->Tq ? lse[(long long)bh * d->Tq + t] : -INFINITY;
                sL[i] = L == -INFINITY ? INFINITY : L * LOG2E;
                sD[i] = t < d->Tq ? D[(long long)bh * d->Tq + t] : 0;
            }
            memset(st, 0, sizeof st);
            memset(dpt, 0, sizeof dpt);
            for (int kk = 0; kk < hs / 16; kk++) {
                uint32_t ka[32][4], va[32][4], qf[32][4], of[32][4];
                lda(&sK, hs, warp * 16, kk, ka);
                lda(&sV, hs, warp * 16, kk, va);
                for (int nj = 0; nj < NT / 2; nj++) {
                    ldb(&sQ, hs, 1, nj * 16, kk, qf);
                    ldb(&sO, hs, 1, nj * 16, kk, of);
                    mma2(st[2 * nj], st[2 * nj + 1], ka, qf);
                    mma2(dpt[2 * nj], dpt[2 * nj + 1], va, of);
                }
            }
            const int unmasked = fa_tile_unmasked(d, qt, wkey, 16);
            for (int lane = 0; lane < 32; lane++) {
                int first[2];
                for (int r = 0; r < 2; r++) first[r] = unmasked ? 0 : fa_col_first(d, wkey + fa_acc_row(lane, 2 * r), qt);
                for (int j = 0; j < NT; j++)
                    for (int i = 0; i < 4; i++) {
                        int col = 8 * j + fa_acc_col(lane, i);
                        float p = 0;
                        if (col >= first[i >> 1]) p = exp2f(st[j][lane][i] * scale_log2 - sL[col]);
                        st[j][lane][i] = p;
                        dpt[j][lane][i] = p * (dpt[j][lane][i] - sD[col]);
                    }
            }
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t pa[32][4], dsa[32][4], of[32][4], qf[32][4];
                acc_to_a(st, kk, pa);
                acc_to_a(dpt, kk, dsa);
                for (int dj = 0; dj < DT / 2; dj++) {
                    ldb(&sO, hs, 0, dj * 16, kk, of);
                    ldb(&sQ, hs, 0, dj * 16, kk, qf);
                    mma2(dvacc[2 * dj], dvacc[2 * dj + 1], pa, of);
                    mma2(dkacc[2 * dj], dkacc[2 * dj + 1], dsa, qf);
                }
            }
        }
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 2; r++) {
                const int key = wkey + fa_acc_row(lane, 2 * r);
                if (key >= d->Tk) continue;
                for (int j = 0; j < DT; j++)
                    for (int e = 0; e < 2; e++) {
                        int c = 8 * j + fa_acc_col(lane, e);
                        float *pk = vat(&dk, b, key, h, hs, c), *pv = vat(&dv, b, key, h, hs, c);
                        float xk = dkacc[j][lane][2 * r + e] * scale, xv = dvacc[j][lane][2 * r + e];
                        *pk = accumulate ? *pk + xk : xk;
                        *pv = accumulate ? *pv + xv : xv;
                    }
            }
    }
    free(sK.mem), free(sV.mem), free(sQ.mem), free(sO.mem), free(sL), free(sD);
}

// fa_dq_kernel, one block (bh, query tile t0)
static void emu_dq(const FaShape *d, View q, View k, View v, View dout, const float *lse, const float *D, View dq,
                   int accumulate, int bh, int t0) {
    const int hs = d->hs, BQ = FA_BWD_BQ, BK = fa_dq_bk(hs), NT = BK / 8, DT = hs / 8;
    const int b = bh / d->NH, h = bh % d->NH, nq = BQ < d->Tq - t0 ? BQ : d->Tq - t0;
    const int nkt = fa_key_tiles(d, t0, nq, BK);
    const float scale = 1.0f / sqrtf((float)hs), scale_log2 = scale * LOG2E;
    Tile sQ = { calloc((size_t)BQ * hs, 2) }, sO = { calloc((size_t)BQ * hs, 2) };
    Tile sK = { calloc((size_t)BK * hs, 2) }, sV = { calloc((size_t)BK * hs, 2) };
    load_tile(&sQ, BQ, hs, &q, b, h, t0, d->Tq);
    load_tile(&sO, BQ, hs, &dout, b, h, t0, d->Tq);
    for (int warp = 0; warp < 4; warp++) {
        static float dqacc[16][32][4], s[8][32][4], dp[8][32][4];
        float L[32][2], Dr[32][2];
        const int wrow = t0 + warp * 16;
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 2; r++) {
                int t = wrow + fa_acc_row(lane, 2 * r);
                float x = t < d->Tq ? lse[(long long)bh * d->Tq + t] : -INFINITY;
                L[lane][r] = x == -INFINITY ? INFINITY : x * LOG2E;
                Dr[lane][r] = t < d->Tq ? D[(long long)bh * d->Tq + t] : 0;
            }
        memset(dqacc, 0, sizeof dqacc);
        for (int kt = 0; kt < nkt; kt++) {
            load_tile(&sK, BK, hs, &k, b, h, kt * BK, d->Tk);
            load_tile(&sV, BK, hs, &v, b, h, kt * BK, d->Tk);
            memset(s, 0, sizeof s);
            memset(dp, 0, sizeof dp);
            for (int kk = 0; kk < hs / 16; kk++) {
                uint32_t qa[32][4], oa[32][4], kf[32][4], vf[32][4];
                lda(&sQ, hs, warp * 16, kk, qa);
                lda(&sO, hs, warp * 16, kk, oa);
                for (int nj = 0; nj < NT / 2; nj++) {
                    ldb(&sK, hs, 1, nj * 16, kk, kf);
                    ldb(&sV, hs, 1, nj * 16, kk, vf);
                    mma2(s[2 * nj], s[2 * nj + 1], qa, kf);
                    mma2(dp[2 * nj], dp[2 * nj + 1], oa, vf);
                }
            }
            const int s0 = kt * BK, unmasked = fa_tile_unmasked(d, wrow, s0, BK);
            for (int lane = 0; lane < 32; lane++) {
                int lim[2];
                for (int r = 0; r < 2; r++) lim[r] = unmasked ? BK : fa_row_limit(d, wrow + fa_acc_row(lane, 2 * r), s0);
                for (int j = 0; j < NT; j++)
                    for (int i = 0; i < 4; i++) {
                        int r = i >> 1;
                        float p = 0;
                        if (8 * j + fa_acc_col(lane, i) < lim[r]) p = exp2f(s[j][lane][i] * scale_log2 - L[lane][r]);
                        s[j][lane][i] = p * (dp[j][lane][i] - Dr[lane][r]);
                    }
            }
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t dsa[32][4], kf[32][4];
                acc_to_a(s, kk, dsa);
                for (int dj = 0; dj < DT / 2; dj++) {
                    ldb(&sK, hs, 0, dj * 16, kk, kf);
                    mma2(dqacc[2 * dj], dqacc[2 * dj + 1], dsa, kf);
                }
            }
        }
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 2; r++) {
                int t = wrow + fa_acc_row(lane, 2 * r);
                if (t >= d->Tq) continue;
                for (int j = 0; j < DT; j++)
                    for (int e = 0; e < 2; e++) {
                        float *p = vat(&dq, b, t, h, hs, 8 * j + fa_acc_col(lane, e));
                        float x = dqacc[j][lane][2 * r + e] * scale;
                        *p = accumulate ? *p + x : x;
                    }
            }
    }
    free(sQ.mem), free(sO.mem), free(sK.mem), free(sV.mem);
}

// ------------------------------------------------------------------------------------------------
// plain double-precision attention of one block pair (kernels.h), for the references

static uint64_t rng = 12345;
static float frand(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) / 8388608.0 - 1.0);
}
// a [B, T, NH·hs] tensor inside a wider row (ts = NH·hs + pad), values rounded to bf16
static View new_view(int B, int T, int C, int pad, int fill_bf16, float poison) {
    View v = { calloc((size_t)B * T * (C + pad) + 1, sizeof(float)), (long long)T * (C + pad), C + pad };
    for (size_t i = 0; i < (size_t)B * T * (C + pad); i++) v.p[i] = fill_bf16 ? bf2f(f2bf(frand())) : poison;
    return v;
}

// out/lse of queries [0, Tq) at q0 against keys [0, Tk) at k0, in double
static void ref_fwd(const FaShape *d, View q, View k, View v, double *out /* [B][Tq][NH][hs] */, double *lse) {
    int hs = d->hs;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->NH; h++)
            for (int t = 0; t < d->Tq; t++) {
                double mx = -INFINITY, sum = 0, *o = out + (((size_t)b * d->Tq + t) * d->NH + h) * hs;
                double *sc = malloc(sizeof(double) * (d->Tk + 1));
                for (int s = 0; s < d->Tk; s++) {
                    sc[s] = -INFINITY;
                    if (!def_visible(d, t, s)) continue;
                    double x = 0;
                    for (int i = 0; i < hs; i++) x += (double)vget(&q, b, t, h, hs, i) * vget(&k, b, s, h, hs, i);
                    sc[s] = x * scale;
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int i = 0; i < hs; i++) o[i] = 0;
                for (int s = 0; s < d->Tk; s++)
                    if (sc[s] > -INFINITY) {
                        double p = exp(sc[s] - mx);
                        sum += p;
                        for (int i = 0; i < hs; i++) o[i] += p * vget(&v, b, s, h, hs, i);
                    }
                for (int i = 0; i < hs; i++) o[i] = sum > 0 ? o[i] / sum : 0;
                lse[((size_t)b * d->NH + h) * d->Tq + t] = sum > 0 ? mx + log(sum) : -INFINITY;
                free(sc);
            }
}

// dq, dk, dv of one block pair given the final lse and D (kernels.h's block backward), in double
static void ref_bwd(const FaShape *d, View q, View k, View v, View dout, const float *lse, const float *D, double *dq,
                    double *dk, double *dv) {
    int hs = d->hs;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->NH; h++)
            for (int t = 0; t < d->Tq; t++) {
                double L = lse[((size_t)b * d->NH + h) * d->Tq + t], Dt = D[((size_t)b * d->NH + h) * d->Tq + t];
                if (L == -INFINITY) continue;
                for (int s = 0; s < d->Tk; s++) {
                    if (!def_visible(d, t, s)) continue;
                    double x = 0, dp = 0;
                    for (int i = 0; i < hs; i++) {
                        x += (double)vget(&q, b, t, h, hs, i) * vget(&k, b, s, h, hs, i);
                        dp += (double)vget(&dout, b, t, h, hs, i) * vget(&v, b, s, h, hs, i);
                    }
                    double p = exp(x * scale - L), ds = p * (dp - Dt);
                    for (int i = 0; i < hs; i++) {
                        dq[(((size_t)b * d->Tq + t) * d->NH + h) * hs + i] += ds * vget(&k, b, s, h, hs, i) * scale;
                        dk[(((size_t)b * d->Tk + s) * d->NH + h) * hs + i] += ds * vget(&q, b, t, h, hs, i) * scale;
                        dv[(((size_t)b * d->Tk + s) * d->NH + h) * hs + i] += p * vget(&dout, b, t, h, hs, i);
                    }
                }
            }
}

// max |a - ref| / max |ref| over a view against a dense [B][T][NH][hs] reference; NaN fails
static double view_err(View a, const double *ref, int B, int T, int NH, int hs, int *nan) {
    double err = 0, scale = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < hs; i++) {
                    double x = vget(&a, b, t, h, hs, i), r = ref[(((size_t)b * T + t) * NH + h) * hs + i];
                    if (isnan(x)) *nan = 1;
                    err = fmax(err, fabs(x - r));
                    scale = fmax(scale, fabs(r));
                }
    // relative to the largest reference value, but at least 1: gradients that vanish (one token: dS = 0
    // up to rounding) are compared with the inputs' own size
    return err / fmax(scale, 1.0);
}

// The block API as context parallelism uses it: queries at q0 against two key blocks (the second one
// first, merged), then the backward of both pairs accumulated, against the double-precision union.
static void test_blocks(int B, int NH, int hs, int Tq, int q0, int Tk, int k0a, int k0b) {
    int C = NH * hs;
    View q = new_view(B, Tq, C, 8, 1, 0), ka = new_view(B, Tk, C, 0, 1, 0), va = new_view(B, Tk, C, 16, 1, 0);
    View kb = new_view(B, Tk, C, 0, 1, 0), vb = new_view(B, Tk, C, 0, 1, 0), dout = new_view(B, Tq, C, 8, 1, 0);
    View out = new_view(B, Tq, C, 0, 0, NAN);
    float *lse = malloc(sizeof(float) * B * NH * Tq);
    for (int i = 0; i < B * NH * Tq; i++) lse[i] = NAN;
    FaShape da = { B, NH, hs, Tq, q0, Tk, k0a }, db = { B, NH, hs, Tq, q0, Tk, k0b };
    for (int bh = 0; bh < B * NH; bh++)
        for (int t0 = 0; t0 < Tq; t0 += FA_FWD_BQ) emu_fwd(&db, q, kb, vb, out, lse, 0, bh, t0);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t0 = 0; t0 < Tq; t0 += FA_FWD_BQ) emu_fwd(&da, q, ka, va, out, lse, 1, bh, t0);

    // reference: attention over both key blocks at once (keys of a at k0a, of b at k0b, positions apart or
    // interleaved alike), by merging the two double-precision blocks exactly
    size_t nq = (size_t)B * Tq * NH * hs, nk = (size_t)B * Tk * NH * hs;
    double *oa = calloc(nq, 8), *ob = calloc(nq, 8), *la = calloc((size_t)B * NH * Tq, 8), *lb = calloc((size_t)B * NH * Tq, 8);
    ref_fwd(&da, q, ka, va, oa, la);
    ref_fwd(&db, q, kb, vb, ob, lb);
    double *oref = calloc(nq, 8), *lref = calloc((size_t)B * NH * Tq, 8);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tq; t++) {
                size_t li = ((size_t)b * NH + h) * Tq + t;
                double x = la[li], y = lb[li], mx = fmax(x, y), l = mx == -INFINITY ? -INFINITY : mx + log(exp(x - mx) + exp(y - mx));
                lref[li] = l;
                for (int i = 0; i < hs; i++) {
                    size_t oi = (((size_t)b * Tq + t) * NH + h) * hs + i;
                    oref[oi] = l == -INFINITY ? 0 : exp(x - l) * oa[oi] + exp(y - l) * ob[oi];
                }
            }
    int nan = 0;
    double e_out = view_err(out, oref, B, Tq, NH, hs, &nan), e_lse = 0;
    for (int i = 0; i < B * NH * Tq; i++) {
        if (isnan(lse[i]) || (isinf(lse[i]) != isinf(lref[i]))) nan = 1;
        else if (isfinite(lref[i])) e_lse = fmax(e_lse, fabs(lse[i] - lref[i]));
    }
    CHECK(!nan && e_out < 1e-2 && e_lse < 1e-3, "flash forward B%d NH%d hs%d Tq%d@%d Tk%d@%d,%d: out err %.3g, lse err %.3g%s",
          B, NH, hs, Tq, q0, Tk, k0a, k0b, e_out, e_lse, nan ? ", NaN or unwritten" : "");

    // backward: D from the final out, then both pairs accumulated onto random dq, dk, dv
    float *D = malloc(sizeof(float) * B * NH * Tq);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tq; t++) {
                double x = 0;
                for (int i = 0; i < hs; i++) x += (double)vget(&dout, b, t, h, hs, i) * vget(&out, b, t, h, hs, i);
                D[((size_t)b * NH + h) * Tq + t] = (float)x;
            }
    View dq = new_view(B, Tq, C, 0, 1, 0), dka = new_view(B, Tk, C, 0, 1, 0), dva = new_view(B, Tk, C, 0, 1, 0);
    View dkb = new_view(B, Tk, C, 0, 1, 0), dvb = new_view(B, Tk, C, 0, 1, 0);
    double *rq = calloc(nq, 8), *rka = calloc(nk, 8), *rva = calloc(nk, 8), *rkb = calloc(nk, 8), *rvb = calloc(nk, 8);
    for (size_t i = 0; i < nq; i++) rq[i] = dq.p[i]; // pad 0: dense
    for (size_t i = 0; i < nk; i++) rka[i] = dka.p[i], rva[i] = dva.p[i], rkb[i] = dkb.p[i], rvb[i] = dvb.p[i];
    ref_bwd(&da, q, ka, va, dout, lse, D, rq, rka, rva);
    ref_bwd(&db, q, kb, vb, dout, lse, D, rq, rkb, rvb);
    for (int bh = 0; bh < B * NH; bh++) {
        for (int s0 = 0; s0 < Tk; s0 += FA_BWD_BK) {
            emu_dkv(&da, q, ka, va, dout, lse, D, dka, dva, 1, bh, s0);
            emu_dkv(&db, q, kb, vb, dout, lse, D, dkb, dvb, 1, bh, s0);
        }
        for (int t0 = 0; t0 < Tq; t0 += FA_BWD_BQ) {
            emu_dq(&da, q, ka, va, dout, lse, D, dq, 1, bh, t0);
            emu_dq(&db, q, kb, vb, dout, lse, D, dq, 1, bh, t0);
        }
    }
    // the gradients' own size, not the random values they were added to, sets the tolerance
    double gq = 0, gk = 0;
    for (size_t i = 0; i < nq; i++) gq = fmax(gq, fabs(rq[i] - dq.p[i]));
    for (size_t i = 0; i < nk; i++) gk = fmax(gk, fmax(fabs(rka[i] - dka.p[i]), fabs(rkb[i] - dkb.p[i])));
    nan = 0;
    double e_q = view_err(dq, rq, B, Tq, NH, hs, &nan), e_ka = view_err(dka, rka, B, Tk, NH, hs, &nan);
    double e_va = view_err(dva, rva, B, Tk, NH, hs, &nan), e_kb = view_err(dkb, rkb, B, Tk, NH, hs, &nan);
    double e_vb = view_err(dvb, rvb, B, Tk, NH, hs, &nan);
    double e = fmax(fmax(e_q, e_ka), fmax(e_va, fmax(e_kb, e_vb)));
    CHECK(!nan && e < 1e-2, "flash backward B%d NH%d hs%d Tq%d@%d Tk%d@%d,%d: max err %.3g (dq %.3g dk %.3g,%.3g dv %.3g,%.3g)%s",
          B, NH, hs, Tq, q0, Tk, k0a, k0b, e, e_q, e_ka, e_kb, e_va, e_vb, nan ? ", NaN" : "");
    (void)gq, (void)gk;
    free(q.p), free(ka.p), free(va.p), free(kb.p), free(vb.p), free(dout.p), free(out.p), free(lse), free(D);
    free(dq.p), free(dka.p), free(dva.p), free(dkb.p), free(dvb.p);
    free(oa), free(ob), free(la), free(lb), free(oref), free(lref), free(rq), free(rka), free(rva), free(rkb), free(rvb);
}

// Whole-sequence attention (q0 = k0 = 0) with overwritten outputs: every element must be written.
static void test_whole(int B, int NH, int hs, int T) {
    int C = NH * hs;
    View q = new_view(B, T, 3 * C, 0, 1, 0), k = q, v = q, dout = new_view(B, T, C, 0, 1, 0);
    k.p += C, v.p += 2 * C;
    View out = new_view(B, T, C, 0, 0, NAN), dq = new_view(B, T, C, 0, 0, NAN), dk = new_view(B, T, C, 0, 0, NAN);
    View dv = new_view(B, T, C, 0, 0, NAN);
    float *lse = malloc(sizeof(float) * B * NH * T), *D = malloc(sizeof(float) * B * NH * T);
    FaShape d = { B, NH, hs, T, 0, T, 0 };
    for (int bh = 0; bh < B * NH; bh++)
        for (int t0 = 0; t0 < T; t0 += FA_FWD_BQ) emu_fwd(&d, q, k, v, out, lse, 0, bh, t0);
    size_t n = (size_t)B * T * NH * hs;
    double *oref = calloc(n, 8), *lref = calloc((size_t)B * NH * T, 8);
    ref_fwd(&d, q, k, v, oref, lref);
    int nan = 0;
    double e_out = view_err(out, oref, B, T, NH, hs, &nan), e_lse = 0;
    for (int i = 0; i < B * NH * T; i++) e_lse = fmax(e_lse, fabs(lse[i] - lref[i]));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double x = 0;
                for (int i = 0; i < hs; i++) x += (double)vget(&dout, b, t, h, hs, i) * vget(&out, b, t, h, hs, i);
                D[((size_t)b * NH + h) * T + t] = (float)x;
            }
    for (int bh = 0; bh < B * NH; bh++) {
        for (int s0 = 0; s0 < T; s0 += FA_BWD_BK) emu_dkv(&d, q, k, v, dout, lse, D, dk, dv, 0, bh, s0);
        for (int t0 = 0; t0 < T; t0 += FA_BWD_BQ) emu_dq(&d, q, k, v, dout, lse, D, dq, 0, bh, t0);
    }
    double *rq = calloc(n, 8), *rk = calloc(n, 8), *rv = calloc(n, 8);
    ref_bwd(&d, q, k, v, dout, lse, D, rq, rk, rv);
    double e_q = view_err(dq, rq, B, T, NH, hs, &nan), e_k = view_err(dk, rk, B, T, NH, hs, &nan);
    double e_v = view_err(dv, rv, B, T, NH, hs, &nan);
    CHECK(!nan && e_out < 1e-2 && e_lse < 1e-3 && e_q < 1e-2 && e_k < 1e-2 && e_v < 1e-2,
          "flash whole sequence B%d NH%d hs%d T%d: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g%s", B, NH, hs, T, e_out, e_lse,
          e_q, e_k, e_v, nan ? ", NaN or unwritten" : "");
    free(q.p), free(dout.p), free(out.p), free(dq.p), free(dk.p), free(dv.p), free(lse), free(D);
    free(oref), free(lref), free(rq), free(rk), free(rv);
}

// the accumulator-to-A conversion on its own: (Q·Kᵀ as accumulators) · V through the mma model equals
// the plain product of the bf16-rounded scores with V
static void test_acc_to_a(void) {
    Tile sq = { calloc(64 * 64, 2) }, sk = { calloc(64 * 64, 2) }, sv = { calloc(64 * 64, 2) };
    float Q[16][64], K[64][64], V[64][64];
    for (int r = 0; r < 16; r++)
        for (int i = 0; i < 64; i++) Q[r][i] = (float)((int)(frand() * 4));
    for (int r = 0; r < 64; r++)
        for (int i = 0; i < 64; i++) K[r][i] = (float)((int)(frand() * 4)), V[r][i] = (float)((int)(frand() * 4));
    for (int r = 0; r < 64; r++)
        for (int i = 0; i < 64; i++) {
            uint32_t off = fa_smem_off(r, i / 8, 64) / 2 + i % 8;
            if (r < 16) sq.mem[off] = f2bf(Q[r][i]);
            sk.mem[off] = f2bf(K[r][i]);
            sv.mem[off] = f2bf(V[r][i]);
        }
    static float s[8][32][4], o[8][32][4];
    memset(s, 0, sizeof s);
    memset(o, 0, sizeof o);
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[32][4], b[32][4];
        lda(&sq, 64, 0, kk, a);
        for (int nj = 0; nj < 4; nj++) {
            ldb(&sk, 64, 1, nj * 16, kk, b);
            mma2(s[2 * nj], s[2 * nj + 1], a, b);
        }
    }
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[32][4], b[32][4];
        acc_to_a(s, kk, a);
        for (int dj = 0; dj < 4; dj++) {
            ldb(&sv, 64, 0, dj * 16, kk, b);
            mma2(o[2 * dj], o[2 * dj + 1], a, b);
        }
    }
    int bad = 0;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 64; c++) {
            double want = 0;
            for (int j = 0; j < 64; j++) {
                double sc = 0;
                for (int i = 0; i < 64; i++) sc += Q[r][i] * K[j][i];
                want += bf2f(f2bf((float)sc)) * V[j][c];
            }
            int lane = (r % 8) * 4 + (c % 8) / 2, i = (r >= 8) * 2 + (c & 1);
            if (fa_acc_row(lane, i) != r || 8 * (c / 8) + fa_acc_col(lane, i) != c) bad++;
            if (o[c / 8][lane][i] != (float)want) bad++;
        }
    CHECK(!bad, "accumulators as the A operand: (Q·Kᵀ)·V through the fragment model, %d elements wrong", bad);
    free(sq.mem), free(sk.mem), free(sv.mem);
}

int main(void) {
    test_visibility();
    test_acc_to_a();
    test_whole(1, 1, 64, 150);  // edge tiles everywhere
    test_whole(2, 2, 128, 70);  // two heads and batches, hs 128
    test_whole(1, 1, 64, 1);    // a single token
    test_whole(1, 1, 128, 200); // several query tiles of each kernel
    test_blocks(1, 2, 64, 40, 24, 48, 0, 24);     // zigzag: the diagonal block merged into one fully seen
    test_blocks(1, 1, 128, 70, 24, 90, 40, 0);    // keys partly after the queries
    test_blocks(2, 1, 64, 100, 30, 70, 500, 0);   // a block no query sees, merged second
    test_blocks(1, 1, 64, 130, 0, 130, 0, 200);   // a block no query sees, merged first
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}

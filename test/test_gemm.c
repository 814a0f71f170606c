// Host-side tests of the tensor-core GEMM's index arithmetic (gemm.h), each against an independent
// model: tile order against nested loops, split-K against its cost model and the partition it must
// make, the mma.sync shared-memory swizzle against a bank count, the mma.sync kernel's ldmatrix
// addresses and fragments on a model of ldmatrix and mma (a whole block tile against a plain product),
// the wgmma descriptor against a
// hand-encoded value and its bit fields, and the TMA boxes plus descriptors against a simulation of
// both units on a model of shared memory: TMA writes boxes row by row through the 128-byte swizzle;
// wgmma reads the canonical layouts of the PTX ISA (k-major: 8-row atoms of 128-byte rows, SBO apart;
// mn-major: 64 contiguous values per 128-byte row, 8 k-rows per atom, SBO between atoms along k, LBO
// between them along m/n); every element read must be the one the GEMM needs, or zero past K.
// Prints "N passed, N failed"; exits non-zero on any failure.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"

#include "check.h"

// ------------------------------------------------------------------------------------------------

static void test_tile_order(void) {
    for (int tiles_m = 1; tiles_m <= 21; tiles_m++)
        for (int tiles_n = 1; tiles_n <= 9; tiles_n++) {
            // reference: groups of GEMM_GROUP_M tile rows; inside a group, column by column, rows down
            int total = tiles_m * tiles_n, t = 0;
            int *exp_m = malloc(sizeof(int) * total), *exp_n = malloc(sizeof(int) * total);
            char *seen = calloc(total, 1);
            for (int first = 0; first < tiles_m; first += GEMM_GROUP_M)
                for (int n = 0; n < tiles_n; n++)
                    for (int m = first; m < first + GEMM_GROUP_M && m < tiles_m; m++) {
                        exp_m[t] = m;
                        exp_n[t] = n;
                        t++;
                    }
            int bad = 0;
            for (t = 0; t < total; t++) {
                int tm = -1, tn = -1;
                gemm_tile_coords(t, tiles_m, tiles_n, &tm, &tn);
                if (tm != exp_m[t] || tn != exp_n[t] || tm < 0 || tm >= tiles_m || tn < 0 || tn >= tiles_n ||
                    seen[tm * tiles_n + tn]++)
                    bad++;
            }
            CHECK(!bad, "tile order %d x %d: %d tiles out of place", tiles_m, tiles_n, bad);
            free(exp_m);
            free(exp_n);
            free(seen);
        }
}

// ------------------------------------------------------------------------------------------------

static long long split_cost(long long tiles, int k_tiles, int sms, int s) {
    int kps = (k_tiles + s - 1) / s;
    long long waves = (tiles * s + sms - 1) / sms;
    return 2 * waves * kps + (s > 1 ? s : 0);
}

static void test_splits(void) {
    // d12's weight gradient of attproj: 768 x 768 outputs in 128 x 256 tiles (18), K = 65536 (1024
    // k-tiles of 64) on 132 SMs: 7 splits fill one wave (126 units) with 147 k-tiles each.
    GemmSplit s = gemm_choose_splits(18, 1024, 132, GEMM_MAX_SPLITS);
    CHECK(s.splits == 7 && s.kt_per_split == 147, "18 tiles, 1024 k-tiles: %d splits of %d", s.splits, s.kt_per_split);
    s = gemm_choose_splits(132, 1024, 132, GEMM_MAX_SPLITS);
    CHECK(s.splits == 1 && s.kt_per_split == 1024, "a full wave is never split");
    s = gemm_choose_splits(10, 12, 132, GEMM_MAX_SPLITS);
    CHECK(s.splits == 3 && s.kt_per_split == 4, "short K: splits keep >= %d k-tiles (got %d x %d)", GEMM_MIN_SPLIT_KTILES,
          s.splits, s.kt_per_split);
    s = gemm_choose_splits(4, 1000, 132, 2);
    CHECK(s.splits == 2, "max_splits caps the splits (got %d)", s.splits);
    s = gemm_choose_splits(4, 0, 132, 16);
    CHECK(s.splits == 1 && s.kt_per_split == 1, "K = 0 is one split");

    int bad = 0;
    for (long long tiles = 1; tiles <= 300; tiles += 7)
        for (int kt = 1; kt <= 2000; kt = kt * 3 + 1)
            for (int sms = 1; sms <= 140; sms += 23)
                for (int maxs = 1; maxs <= 20; maxs += 6) {
                    GemmSplit g = gemm_choose_splits(tiles, kt, sms, maxs);
                    // a partition of the k-tiles into non-empty splits
                    if (g.splits < 1 || g.kt_per_split < 1 || (long long)(g.splits - 1) * g.kt_per_split >= kt ||
                        (long long)g.splits * g.kt_per_split < kt)
                        bad++;
                    if (g.splits > 1 && (tiles >= sms || g.splits > maxs || g.splits > GEMM_MAX_SPLITS ||
                                         g.kt_per_split < GEMM_MIN_SPLIT_KTILES))
                        bad++;
                    // no admissible split count is cheaper under the model
                    for (int x = 1; x <= maxs && x <= GEMM_MAX_SPLITS && tiles < sms; x++) {
                        int kps = (kt + x - 1) / x;
                        if ((kt + kps - 1) / kps != x || (x > 1 && kps < GEMM_MIN_SPLIT_KTILES)) continue;
                        if (split_cost(tiles, kt, sms, x) < split_cost(tiles, kt, sms, g.splits)) bad++;
                    }
                }
    CHECK(!bad, "split-K: %d choices break the partition or the cost model", bad);
}

// ------------------------------------------------------------------------------------------------

static void test_mma_swizzle(void) {
    const int widths[2] = { 4, 16 }; // k-major rows of 32 k's; m/n-major rows of 128 values
    for (int w = 0; w < 2; w++) {
        int chunks = widths[w], bad_perm = 0, bad_ld = 0, bad_st = 0;
        for (int row = 0; row < 64; row++) {
            int used[16] = { 0 };
            for (int c = 0; c < chunks; c++) {
                int p = gemm_swizzle_chunk(row, c, chunks);
                if (p < 0 || p >= chunks || used[p]++) bad_perm++;
            }
        }
        // ldmatrix: chunk c of 8 consecutive rows (from a multiple of 8) must occupy 8 different
        // 16-byte bank groups (shared memory: 32 banks of 4 bytes = 8 groups per 128 bytes)
        for (int r0 = 0; r0 < 64; r0 += 8)
            for (int c = 0; c < chunks; c++) {
                int groups = 0;
                for (int r = r0; r < r0 + 8; r++) groups |= 1 << ((r * chunks + gemm_swizzle_chunk(r, c, chunks)) % 8);
                if (groups != 0xff) bad_ld++;
            }
        // cp.async: 8 consecutive threads store 8 consecutive logical chunks (row-major): one 128-byte
        // wavefront only if they cover all 8 groups
        for (int q0 = 0; q0 < 64 * chunks; q0 += 8) {
            int groups = 0;
            for (int q = q0; q < q0 + 8; q++) {
                int r = q / chunks, c = q % chunks;
                groups |= 1 << ((r * chunks + gemm_swizzle_chunk(r, c, chunks)) % 8);
            }
            if (groups != 0xff) bad_st++;
        }
        CHECK(!bad_perm, "swizzle (%d chunks/row) is not a permutation of each row", chunks);
        CHECK(!bad_ld, "swizzle (%d chunks/row): %d ldmatrix reads with bank conflicts", chunks, bad_ld);
        CHECK(!bad_st, "swizzle (%d chunks/row): %d cp.async stores with bank conflicts", chunks, bad_st);
    }
}

// ------------------------------------------------------------------------------------------------
// The mma.sync kernel's block tile on a model of the warp instructions, per the PTX ISA: ldmatrix.x4
// takes lane 8j+i's address as row i of 8x8 matrix j (8 consecutive 16-bit values) and gives thread t
// register j = row t/4, values 2(t%4), +1 (with .trans: column t/4, rows 2(t%4), +1); mma.m16n8k16
// takes A as a0 (rows g, k 2c..2c+1), a1 (rows g+8), a2 (k +8), a3 (rows g+8, k +8), B as b0
// (k 2c..2c+1, column g), b1 (k +8), and gives c0,c1 at row g, columns 2c, 2c+1, c2,c3 at row g+8
// (g = t/4, c = t%4). Small integers keep every sum exact.

enum { TBM = GEMM_MMA_BM, TBN = GEMM_MMA_BN, TBK = GEMM_MMA_BK };

// one operand's stage as mma_load_tile stores it: k-major rows of k, else rows of m (or n)
static void store_tile(int kmajor, int ext, const int *logical /* [ext][TBK] */, int *smem) {
    int cpr = kmajor ? TBK / 8 : ext / 8;
    for (int mn = 0; mn < ext; mn++)
        for (int k = 0; k < TBK; k++) {
            int row = kmajor ? mn : k, chunk = kmajor ? k / 8 : mn / 8, e = kmajor ? k % 8 : mn % 8;
            smem[(row * cpr + gemm_swizzle_chunk(row, chunk, cpr)) * 8 + e] = logical[mn * TBK + k];
        }
}

// ldmatrix.x4 from per-lane (row, chunk) addresses: out[t][j][h]
static void ldmatrix_x4(const int *smem, int cpr, const int (*addr)[2], int trans, int out[32][4][2]) {
    for (int t = 0; t < 32; t++)
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++) {
                int src_row = trans ? 8 * j + 2 * (t % 4) + h : 8 * j + t / 4, col = trans ? t / 4 : 2 * (t % 4) + h;
                int row = addr[src_row][0], chunk = addr[src_row][1];
                out[t][j][h] = smem[(row * cpr + gemm_swizzle_chunk(row, chunk, cpr)) * 8 + col];
            }
}

static void test_mma_fragments(void) {
    static int A[TBM * TBK], B[TBN * TBK], sa[TBM * TBK], sb[TBN * TBK];
    uint64_t x = 99;
    for (int i = 0; i < TBM * TBK; i++) A[i] = (int)((x = x * 6364136223846793005ULL + 1) >> 61) - 4;
    for (int i = 0; i < TBN * TBK; i++) B[i] = (int)((x = x * 6364136223846793005ULL + 1) >> 61) - 4; // B(k,n) = B[n][k]
    for (int ak = 0; ak <= 1; ak++)
        for (int bk = 0; bk <= 1; bk++) {
            store_tile(ak, TBM, A, sa);
            store_tile(bk, TBN, B, sb);
            int bad = 0;
            for (int warp = 0; warp < GEMM_MMA_THREADS / 32; warp++) {
                const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32; // as gemm_mma_kernel
                static int acc[32][4][4][4];
                memset(acc, 0, sizeof acc);
                for (int kk = 0; kk < TBK / 16; kk++) {
                    int af[4][32][4][2], bfr[4][32][2][2], addr[32][2], r[32][4][2];
                    for (int mi = 0; mi < 4; mi++) {
                        for (int l = 0; l < 32; l++) gemm_mma_ldsm_a(ak, wm + mi * 16, kk, l, &addr[l][0], &addr[l][1]);
                        ldmatrix_x4(sa, ak ? TBK / 8 : TBM / 8, (const int(*)[2])addr, !ak, af[mi]);
                    }
                    for (int nj = 0; nj < 2; nj++) {
                        for (int l = 0; l < 32; l++) gemm_mma_ldsm_b(bk, wn + nj * 16, kk, l, &addr[l][0], &addr[l][1]);
                        ldmatrix_x4(sb, bk ? TBK / 8 : TBN / 8, (const int(*)[2])addr, !bk, r);
                        for (int t = 0; t < 32; t++)
                            for (int h = 0; h < 2; h++) {
                                bfr[2 * nj][t][0][h] = r[t][0][h];
                                bfr[2 * nj][t][1][h] = r[t][1][h];
                                bfr[2 * nj + 1][t][0][h] = r[t][2][h];
                                bfr[2 * nj + 1][t][1][h] = r[t][3][h];
                            }
                    }
                    for (int mi = 0; mi < 4; mi++)
                        for (int ni = 0; ni < 4; ni++) {
                            int fa[16][16], fb[16][8];
                            for (int t = 0; t < 32; t++)
                                for (int h = 0; h < 2; h++) {
                                    int g = t / 4, c = t % 4;
                                    fa[g][2 * c + h] = af[mi][t][0][h];
                                    fa[g + 8][2 * c + h] = af[mi][t][1][h];
                                    fa[g][2 * c + 8 + h] = af[mi][t][2][h];
                                    fa[g + 8][2 * c + 8 + h] = af[mi][t][3][h];
                                    fb[2 * c + h][g] = bfr[ni][t][0][h];
                                    fb[2 * c + 8 + h][g] = bfr[ni][t][1][h];
                                }
                            for (int t = 0; t < 32; t++)
                                for (int v = 0; v < 4; v++) {
                                    int row = t / 4 + (v >= 2 ? 8 : 0), col = 2 * (t % 4) + (v & 1), d = 0;
                                    for (int k = 0; k < 16; k++) d += fa[row][k] * fb[k][col];
                                    acc[t][mi][ni][v] += d;
                                }
                        }
                }
                // the kernel's epilogue places acc[mi][ni][v] at row wm + mi*16 + g (+8), column wn + ni*8 + 2c (+1)
                for (int t = 0; t < 32; t++)
                    for (int mi = 0; mi < 4; mi++)
                        for (int ni = 0; ni < 4; ni++)
                            for (int v = 0; v < 4; v++) {
                                int m = wm + mi * 16 + t / 4 + (v >= 2 ? 8 : 0), n = wn + ni * 8 + 2 * (t % 4) + (v & 1), ref = 0;
                                for (int k = 0; k < TBK; k++) ref += A[m * TBK + k] * B[n * TBK + k];
                                if (acc[t][mi][ni][v] != ref) bad++;
                            }
            }
            CHECK(!bad, "mma.sync tile (A %s-major, B %s-major): %d of %d products wrong", ak ? "k" : "m", bk ? "k" : "n", bad,
                  TBM * TBN);
        }
}

// ------------------------------------------------------------------------------------------------

static void test_wgmma_desc(void) {
    // start 0x400 -> 0x40; LBO 8192 -> 0x200 at bit 16; SBO 1024 -> 0x40 at bit 32; 128B swizzle = 1 at 62
    uint64_t d = gemm_wgmma_desc(0x400, 8192, 1024, GEMM_DESC_SWIZZLE_128B);
    CHECK(d == 0x4000004002000040ULL, "descriptor 0x%016llx", (unsigned long long)d);
    uint64_t x = 0x1234567ULL;
    for (int i = 0; i < 1000; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t addr = (uint32_t)(x >> 20) & 0x3FFF0, lbo = (uint32_t)(x >> 40) & 0x3FFF0, sbo = (uint32_t)x & 0x3FFF0;
        int sw = (int)(x >> 62);
        uint64_t e = gemm_wgmma_desc(addr, lbo, sbo, sw);
        int ok = ((e & 0x3FFF) << 4) == addr && (((e >> 16) & 0x3FFF) << 4) == lbo && (((e >> 32) & 0x3FFF) << 4) == sbo &&
                 (int)(e >> 62) == sw && (e & 0x3FFFC000C000C000ULL) == 0; // reserved bits and base offset 0
        CHECK(ok, "descriptor fields of (0x%x, %u, %u, %d) -> 0x%016llx", addr, lbo, sbo, sw, (unsigned long long)e);
        if (!ok) break;
    }
}

// ------------------------------------------------------------------------------------------------
// TMA + wgmma on a model of shared memory. Shared memory holds 32-bit element ids (0 = zero) in 2-byte
// slots; the global matrix holds id 1 + mn*K + k at (mn, k).

enum { SMEM_BYTES = 64 * 1024 };

static uint32_t sw128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); } // TMA/wgmma 128-byte swizzle

static uint32_t global_id(long long mn, long long k, long long MN, long long K) {
    return mn < MN && k < K ? (uint32_t)(1 + mn * K + k) : 0;
}

// One operand: MN x K, stored k-major or not, tile of tile_mn rows at (mn0, k0); instruction rows
// `rows` (64 for A, 256 for B) starting at row `sub` of the tile (a consumer warpgroup's 64 rows of A).
static int simulate(int kmajor, long long MN, long long K, long long ld, int tile_mn, int mn0, int k0, int rows, int sub,
                    uint32_t stage_base, uint32_t *smem) {
    GemmTmaPlan pl;
    gemm_tma_plan(&pl, kmajor, MN, K, ld, tile_mn);
    int bad = 0;
    // constraints cuTensorMapEncodeTiled documents for 128-byte swizzle
    if (pl.stride1 % 16 || pl.stride1 < pl.dims[0] * 2 || pl.box[0] * 2 != 128 || pl.box[1] > 256 || pl.box[1] < 1) bad++;
    if ((uint64_t)(kmajor ? K : MN) != pl.dims[0] || (uint64_t)(kmajor ? MN : K) != pl.dims[1]) bad++;
    if (pl.box_bytes != pl.box[0] * pl.box[1] * 2 || (uint32_t)pl.boxes * pl.box_bytes != (uint32_t)tile_mn * GEMM_WG_BK * 2) bad++;
    memset(smem, 0xA5, SMEM_BYTES / 2 * sizeof(uint32_t)); // stale data: anything not written is garbage
    for (int b = 0; b < pl.boxes; b++) {
        int c0, c1;
        gemm_tma_box_coords(&pl, b, mn0, k0, &c0, &c1);
        uint32_t dst = stage_base + (uint32_t)b * pl.box_bytes;
        for (uint32_t i1 = 0; i1 < pl.box[1]; i1++)
            for (uint32_t i0 = 0; i0 < pl.box[0]; i0++) {
                long long g0 = c0 + (long long)i0, g1 = c1 + (long long)i1; // out of bounds: zero fill
                long long mn = kmajor ? g1 : g0, k = kmajor ? g0 : g1;
                uint32_t v = (uint64_t)g0 < pl.dims[0] && (uint64_t)g1 < pl.dims[1] ? global_id(mn, k, MN, K) : 0;
                smem[sw128(dst + (i1 * pl.box[0] + i0) * 2) / 2] = v;
            }
    }
    uint64_t desc0 = gemm_wgmma_desc(stage_base + gemm_tma_mn_offset(&pl, sub), pl.lbo, pl.sbo, GEMM_DESC_SWIZZLE_128B);
    for (int s = 0; s < GEMM_WG_BK / 16; s++) {
        uint64_t d = desc0 + ((s * pl.k16_bytes) >> 4); // as the kernel advances it
        uint32_t start = (uint32_t)(d & 0x3FFF) << 4, lbo = (uint32_t)((d >> 16) & 0x3FFF) << 4,
                 sbo = (uint32_t)((d >> 32) & 0x3FFF) << 4;
        if ((d >> 62) != 1) bad++;
        for (int r = 0; r < rows; r++)
            for (int k = 0; k < 16; k++) {
                uint32_t addr = kmajor ? start + (r / 8) * sbo + (r % 8) * 128 + k * 2
                                       : start + (r / 64) * lbo + (r % 64) * 2 + (k / 8) * sbo + (k % 8) * 128;
                long long mn = mn0 + sub + r, kk = k0 + 16 * s + k;
                if (mn >= MN) continue; // feeds an output row or column that is never stored
                if (addr >= SMEM_BYTES || smem[sw128(addr) / 2] != global_id(mn, kk, MN, K)) bad++;
            }
    }
    return bad;
}

static void test_tma_wgmma_layout(void) {
    uint32_t *smem = malloc(SMEM_BYTES / 2 * sizeof(uint32_t));
    struct {
        long long MN, K, ld;
    } shapes[] = { { 1000, 768, 768 }, { 300, 100, 104 }, { 77, 40, 48 }, { 4096, 4096, 4160 }, { 5, 3, 8 } };
    for (int kmajor = 0; kmajor <= 1; kmajor++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            long long MN = shapes[i].MN, K = shapes[i].K;
            long long ld = kmajor ? shapes[i].ld : (MN + 7) / 8 * 8 + 8; // mn-major: a multiple of 8 above MN
            for (int role = 0; role < 2; role++) { // 0: A (128-row tile, two 64-row consumers), 1: B (256 columns)
                int tile = role ? GEMM_WG_BN : GEMM_WG_BM, rows = role ? GEMM_WG_BN : 64;
                for (int mn0 = 0; mn0 < MN; mn0 += tile * 3)
                    for (int k0 = 0; k0 < K; k0 += GEMM_WG_BK * 5)
                        for (int sub = 0; sub < tile; sub += rows) {
                            int bad = simulate(kmajor, MN, K, ld, tile, mn0, k0, rows, sub, 0x2000, smem);
                            CHECK(!bad, "%s %s-major %lld x %lld (ld %lld) tile at (%d, %d) rows +%d: %d elements wrong",
                                  role ? "B" : "A", kmajor ? "k" : "mn", MN, K, ld, mn0, k0, sub, bad);
                        }
            }
        }
    free(smem);
}

// ------------------------------------------------------------------------------------------------

static void test_problem_check(void) {
    GemmProblem p;
    memset(&p, 0, sizeof p);
    p.M = 100;
    p.N = 50;
    p.K = 30;
    p.A = (const uint16_t *)(uintptr_t)0x10000;
    p.B = (const uint16_t *)(uintptr_t)0x20000;
    p.C = (void *)(uintptr_t)0x30000;
    p.lda = 32;
    p.a_kmajor = 1;
    p.ldb = 32;
    p.b_kmajor = 1;
    p.ldc = 50;
    CHECK(gemm_problem_check(&p) == NULL, "a good problem is rejected: %s", gemm_problem_check(&p));
    GemmProblem q = p;
    q.lda = 36;
    CHECK(gemm_problem_check(&q) != NULL, "lda = 36 (72 bytes) accepted");
    q = p;
    q.A = (const uint16_t *)(uintptr_t)0x10008;
    CHECK(gemm_problem_check(&q) != NULL, "A at 8-byte alignment accepted");
    q = p;
    q.lda = 24;
    CHECK(gemm_problem_check(&q) != NULL, "lda < K accepted");
    q = p;
    q.b_kmajor = 0;
    q.ldb = 48;
    CHECK(gemm_problem_check(&q) != NULL, "n-major B with ldb < N accepted");
    q.ldb = 56;
    CHECK(gemm_problem_check(&q) == NULL, "n-major B with ldb 56 >= N rejected");
    q = p;
    q.ldc = 51;
    CHECK(gemm_problem_check(&q) != NULL, "odd ldc accepted");
    q = p;
    q.store = GEMM_STORE_F32;
    q.C = (void *)(uintptr_t)0x30004;
    CHECK(gemm_problem_check(&q) != NULL, "fp32 C on 4 bytes accepted (pairs are stored as 8 bytes)");
    q = p;
    q.residual = (const uint16_t *)(uintptr_t)0x40002;
    CHECK(gemm_problem_check(&q) != NULL, "residual on 2 bytes accepted");
    q = p;
    q.pre_gelu = (uint16_t *)(uintptr_t)0x50000;
    CHECK(gemm_problem_check(&q) != NULL, "pre_gelu without gelu accepted");
    q = p;
    q.K = 0;
    q.lda = 8;
    q.ldb = 8;
    CHECK(gemm_problem_check(&q) == NULL, "K = 0 rejected");
}

static void test_pick_kernel(void) {
    struct {
        int major, minor, have;
        GemmKernel want, expect;
    } cases[] = {
        { 9, 0, 1, GEMM_KERNEL_NONE, GEMM_KERNEL_WGMMA }, { 9, 0, 0, GEMM_KERNEL_NONE, GEMM_KERNEL_MMA },
        { 9, 0, 1, GEMM_KERNEL_MMA, GEMM_KERNEL_MMA },    { 9, 0, 0, GEMM_KERNEL_WGMMA, GEMM_KERNEL_NONE },
        { 8, 0, 0, GEMM_KERNEL_NONE, GEMM_KERNEL_MMA },   { 8, 9, 1, GEMM_KERNEL_WGMMA, GEMM_KERNEL_NONE },
        { 10, 0, 1, GEMM_KERNEL_NONE, GEMM_KERNEL_MMA },  { 7, 5, 1, GEMM_KERNEL_NONE, GEMM_KERNEL_NONE },
        { 7, 0, 0, GEMM_KERNEL_MMA, GEMM_KERNEL_NONE },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        GemmKernel k = gemm_pick_kernel(cases[i].major, cases[i].minor, cases[i].have, cases[i].want);
        CHECK(k == cases[i].expect, "sm_%d%d (sm_90a code %d) asking %d: got %d, expected %d", cases[i].major, cases[i].minor,
              cases[i].have, cases[i].want, k, cases[i].expect);
    }
}

int main(void) {
    test_tile_order();
    test_splits();
    test_mma_swizzle();
    test_mma_fragments();
    test_wgmma_desc();
    test_tma_wgmma_layout();
    test_problem_check();
    test_pick_kernel();
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}

// gemm_check: the tensor-core GEMMs of gemm.cu on a GPU (built and run by scripts/gpu_check.sh only).
//
//   build/gemm_check --check [--kernel mma|wgmma|all]   correctness; exit status 1 on any failure
//   build/gemm_check --check --small ...                 the ragged shapes' small ones only (for the
//                                                        emulated GPU: build/gemm_check-emu)
//   build/gemm_check --bench [--kernel ...] [--table F]  timing table against cuBLAS
//
// Correctness: every kernel, for the three products of a linear layer at d12's shapes (M = B*T = 4096,
// K and N from {768, 2304, 3072}; one weight gradient with K = 65536), each with its operands stored as
// the model stores them and both transposed, and for ragged shapes in all four operand layouts (A k- or m-major, B k- or n-major) with every epilogue (bias, GELU with its input
// stored, GELU backward, residual, bf16 or fp32 store, fp32 accumulate) and with split-K forced, is
// compared with a CPU reference in fp64 on fresh random inputs. Outputs start poisoned (NaN), padding
// beyond N and the row after M hold a sentinel that must survive, and input padding holds NaN that
// must never be read; a check is `err <= tol`, so NaN never passes. Each case runs twice and must give
// the same bits. Large cases check sampled full rows and full columns (every element is still checked
// for NaN); small ones check everything. The 4096^3 product is also compared with cuBLAS in full.
//
// Timing: CUDA events around each launch, 5 warm-ups, median of 20, input buffers rotated so that
// every launch reads its operands from memory rather than L2; cuBLAS's bf16 GEMM (fp32 compute) on
// the same shapes and layouts is the comparator, linked into this binary only (-DGEMM_CHECK_CUBLAS,
// left out when the toolkit has no libcublas: the table then has no cuBLAS column).
#include <cuda_runtime.h>
#ifdef GEMM_CHECK_CUBLAS
#include <cublas_v2.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

extern "C" {
#include "common.h"
#include "gemm.h"
#include "kernels.h"
}

#include "common.cuh" // CUDA_LAUNCH; this file's CK below takes the call whole
#undef CK
#define CK(call)                                                                                            \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) die("CUDA %s: %s", #call, cudaGetErrorString(e_));                           \
    } while (0)

static const uint16_t BF_POISON = 0x7FA5;       // a NaN
static const uint32_t F32_POISON = 0x7FA5A5A5u; // a NaN
static const uint16_t BF_PAD = 0x7FC0;          // NaN in input padding: reading it spoils a sum

static double bf(uint16_t h) { return (double)bf16_to_f32(h); }
static double round_bf(double x) { return bf(f32_to_bf16((float)x)); }
static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_grad_d(double x) {
    double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

struct Rng {
    uint64_t s;
    uint64_t next() { return mix64(s++); }
    double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); } // [0, 1)
    uint16_t bf_pm1() { return f32_to_bf16((float)(2.0 * uniform() - 1.0)); }          // bf16 in [-1, 1]
};

// ------------------------------------------------------------------------------------------------
// one correctness case

struct Case {
    const char *name;
    int M, N, K;
    int ak, bk;
    GemmStore store;
    bool bias, gelu, pre, dgelu, residual;
};

static const char *store_name(GemmStore s) { return s == GEMM_STORE_BF16 ? "bf16" : s == GEMM_STORE_F32 ? "f32" : "f32+="; }

struct Totals {
    int cases = 0, failed = 0;
};

template <typename T> static T *dalloc(size_t n) {
    T *p = NULL;
    CK(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    return p;
}
template <typename T> static void upload(T *d, const std::vector<T> &h) {
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T> static void download(std::vector<T> &h, const T *d) {
    CK(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
}

// Runs case c with kernel k (splits: 0 automatic, n forced) and checks it. Returns true when it passed.
static bool run_case(const Case &c, GemmKernel k, int splits, void *ws, size_t ws_bytes, uint64_t seed) {
    const int M = c.M, N = c.N, K = c.K;
    // leading dimensions: a multiple of 8 with 8 spare elements, so the padding is really there
    const long long lda = ((c.ak ? K : M) + 7) / 8 * 8 + 8, ldb = ((c.bk ? K : N) + 7) / 8 * 8 + 8;
    const long long ldc = (N + 1) / 2 * 2 + 2;
    const long long arows = c.ak ? M : K, brows = c.bk ? N : K, crows = M + 1; // + a sentinel row
    Rng rng = { seed };
    std::vector<uint16_t> A(arows * lda, BF_PAD), B(brows * ldb, BF_PAD);
    for (int m = 0; m < M; m++)
        for (int kk = 0; kk < K; kk++) A[c.ak ? m * lda + kk : kk * lda + m] = rng.bf_pm1();
    for (int n = 0; n < N; n++)
        for (int kk = 0; kk < K; kk++) B[c.bk ? n * ldb + kk : kk * ldb + n] = rng.bf_pm1();
    std::vector<uint16_t> bias(N + 1, BF_PAD), resid(crows * ldc, BF_PAD), dgin(crows * ldc, BF_PAD);
    for (int n = 0; n < N; n++) bias[n] = rng.bf_pm1();
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            resid[m * ldc + n] = rng.bf_pm1();
            dgin[m * ldc + n] = f32_to_bf16((float)(4.0 * rng.uniform() - 2.0)); // GELU inputs in [-2, 2]
        }
    const bool cbf = c.store == GEMM_STORE_BF16;
    std::vector<uint16_t> Cb(cbf ? crows * ldc : 0, BF_POISON), pre(c.pre ? crows * ldc : 0, BF_POISON);
    std::vector<float> Cf(cbf ? 0 : crows * ldc), C0;
    if (!cbf) {
        float poison;
        memcpy(&poison, &F32_POISON, 4);
        std::fill(Cf.begin(), Cf.end(), poison);
        if (c.store == GEMM_ACCUM_F32)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) Cf[m * ldc + n] = (float)(2.0 * rng.uniform() - 1.0);
        C0 = Cf;
    }

    uint16_t *dA = dalloc<uint16_t>(A.size()), *dB = dalloc<uint16_t>(B.size()), *dbias = dalloc<uint16_t>(bias.size());
    uint16_t *dres = dalloc<uint16_t>(resid.size()), *ddg = dalloc<uint16_t>(dgin.size());
    uint16_t *dpre = dalloc<uint16_t>(pre.size());
    void *dC = cbf ? (void *)dalloc<uint16_t>(Cb.size()) : (void *)dalloc<float>(Cf.size());
    upload(dA, A);
    upload(dB, B);
    upload(dbias, bias);
    upload(dres, resid);
    upload(ddg, dgin);

    GemmProblem p;
    memset(&p, 0, sizeof p);
    p.M = M;
    p.N = N;
    p.K = K;
    p.A = dA;
    p.lda = lda;
    p.a_kmajor = c.ak;
    p.B = dB;
    p.ldb = ldb;
    p.b_kmajor = c.bk;
    p.C = dC;
    p.ldc = ldc;
    p.store = c.store;
    p.bias = c.bias ? dbias : NULL;
    p.gelu = c.gelu;
    p.pre_gelu = c.pre ? dpre : NULL;
    p.dgelu_in = c.dgelu ? ddg : NULL;
    p.residual = c.residual ? dres : NULL;
    GemmOptions o = { k, splits, ws, ws_bytes, NULL };

    // two runs from the same starting state: the second must reproduce the first bit for bit
    std::vector<uint16_t> Cb1, pre1;
    std::vector<float> Cf1;
    bool ran = true;
    for (int run = 0; run < 2 && ran; run++) {
        if (cbf) upload((uint16_t *)dC, Cb);
        else upload((float *)dC, Cf);
        if (c.pre) upload(dpre, pre);
        ran = gemm_bf16(&p, &o) == k;
        CK(cudaDeviceSynchronize());
        if (run == 0) {
            Cb1.resize(Cb.size());
            Cf1.resize(Cf.size());
            pre1.resize(pre.size());
            if (cbf) download(Cb1, (const uint16_t *)dC);
            else download(Cf1, (const float *)dC);
            if (c.pre) download(pre1, dpre);
        }
    }
    bool same = true;
    if (ran) {
        std::vector<uint16_t> Cb2(Cb.size()), pre2(pre.size());
        std::vector<float> Cf2(Cf.size());
        if (cbf) download(Cb2, (const uint16_t *)dC);
        else download(Cf2, (const float *)dC);
        if (c.pre) download(pre2, dpre);
        same = Cb1 == Cb2 && pre1 == pre2 && memcmp(Cf1.data(), Cf2.data(), Cf1.size() * sizeof(float)) == 0;
    }
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dbias));
    CK(cudaFree(dres));
    CK(cudaFree(ddg));
    CK(cudaFree(dpre));
    CK(cudaFree(dC));

    char label[256];
    snprintf(label, sizeof label, "%-8s %-22s %5d x %5d x %5d  A %s B %s  %-5s%s%s%s%s%s  splits %s", gemm_kernel_name(k), c.name, M,
             N, K, c.ak ? "k " : "mn", c.bk ? "k " : "mn", store_name(c.store), c.bias ? " bias" : "", c.gelu ? " gelu" : "",
             c.pre ? "+pre" : "", c.dgelu ? " dgelu" : "", c.residual ? " resid" : "",
             splits ? (splits == 1 ? "1" : "forced") : "auto");
    if (!ran) {
        printf("FAIL %s: gemm_bf16 did not run the requested kernel\n", label);
        return false;
    }

    // the reference, on the checked elements: everything when small, else sampled rows and columns
    std::vector<double> Ad((size_t)M * K), Bd((size_t)N * K);
    for (int m = 0; m < M; m++)
        for (int kk = 0; kk < K; kk++) Ad[(size_t)m * K + kk] = bf(A[c.ak ? m * lda + kk : kk * lda + m]);
    for (int n = 0; n < N; n++)
        for (int kk = 0; kk < K; kk++) Bd[(size_t)n * K + kk] = bf(B[c.bk ? n * ldb + kk : kk * ldb + n]);
    std::vector<std::pair<int, int>> pts;
    const bool full = (double)M * N * K <= 3e8;
    if (full) {
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) pts.push_back({ m, n });
    } else {
        std::vector<int> rows = { 0, M - 1 }, cols = { 0, N - 1 };
        for (int i = 0; i < 30; i++) {
            rows.push_back((int)(rng.next() % M));
            cols.push_back((int)(rng.next() % N));
        }
        for (int m : rows)
            for (int n = 0; n < N; n++) pts.push_back({ m, n });
        for (int n : cols)
            for (int m = 0; m < M; m++) pts.push_back({ m, n });
    }
    const long long npts = (long long)pts.size();
    std::vector<double> worst(omp_get_max_threads(), 0.0);
    std::vector<long long> nbad(omp_get_max_threads(), 0), first_bad(omp_get_max_threads(), -1);
    std::vector<double> got_v(omp_get_max_threads()), ref_v(omp_get_max_threads()), tol_v(omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 64)
    for (long long i = 0; i < npts; i++) {
        const int th = omp_get_thread_num(), m = pts[i].first, n = pts[i].second;
        const double *a = &Ad[(size_t)m * K], *b = &Bd[(size_t)n * K];
        double acc = 0.0, mag = 0.0;
        for (int kk = 0; kk < K; kk++) {
            acc += a[kk] * b[kk];
            mag += fabs(a[kk] * b[kk]);
        }
        // the epilogue, with bf16 rounding where a bf16 store rounds (see gemm.h)
        const size_t off = (size_t)m * ldc + n;
        double v = acc + (c.bias ? bf(bias[n]) : 0.0), pre_ref = 0.0, vin = fabs(v);
        if (c.gelu) {
            if (cbf) v = round_bf(v);
            pre_ref = round_bf(v);
            v = gelu_d(v);
        }
        if (c.dgelu) {
            if (cbf) v = round_bf(v);
            v *= gelu_grad_d(bf(dgin[off]));
        }
        double r = 0.0;
        if (c.residual) {
            if (cbf) v = round_bf(v);
            r = bf(resid[off]);
            v += r;
        }
        double got, ref;
        if (cbf) {
            ref = round_bf(v);
            got = bf(Cb1[off]);
        } else {
            ref = c.store == GEMM_ACCUM_F32 ? (double)C0[off] + v : v;
            got = Cf1[off];
        }
        // fp32 accumulation on the tensor cores; then bf16 roundings (a value near a rounding boundary
        // may round either way, one ulp = 2^-7 relative at most), through GELU's slope (< 1.2)
        const double acc_err = ldexp(mag, -16) * ((c.gelu || c.dgelu) ? 1.2 : 1.0);
        double tol = acc_err + 1e-6 + (cbf ? ldexp(vin + fabs(ref) + fabs(r), -7) : 1e-5 * (fabs(ref) + 1.0));
        bool ok = fabs(got - ref) <= tol;
        if (ok && c.pre) ok = fabs(bf(pre1[off]) - pre_ref) <= acc_err + ldexp(fabs(pre_ref) + vin, -7) + 1e-6;
        if (!ok) {
            if (nbad[th]++ == 0) {
                first_bad[th] = i;
                got_v[th] = got;
                ref_v[th] = ref;
                tol_v[th] = tol;
            }
        } else if (tol > 0) {
            worst[th] = std::max(worst[th], fabs(got - ref) / tol);
        }
    }
    long long bad = 0;
    double wr = 0;
    int fb = -1;
    for (size_t t = 0; t < nbad.size(); t++) {
        bad += nbad[t];
        wr = std::max(wr, worst[t]);
        if (nbad[t] && fb < 0) fb = (int)t;
    }
    // every output element written and finite; padding and the sentinel row untouched
    long long nonfinite = 0, clobbered = 0;
    for (long long m = 0; m < crows; m++)
        for (long long n = 0; n < ldc; n++) {
            const size_t off = (size_t)m * ldc + n;
            const bool inside = m < M && n < N;
            if (cbf) {
                if (inside ? !isfinite(bf(Cb1[off])) : Cb1[off] != BF_POISON) (inside ? nonfinite : clobbered)++;
            } else {
                uint32_t bits;
                memcpy(&bits, &Cf1[off], 4);
                if (inside ? !isfinite(Cf1[off]) : bits != F32_POISON) (inside ? nonfinite : clobbered)++;
            }
            if (c.pre) {
                if (inside ? !isfinite(bf(pre1[off])) : pre1[off] != BF_POISON) (inside ? nonfinite : clobbered)++;
            }
        }
    const bool pass = bad == 0 && nonfinite == 0 && clobbered == 0 && same;
    printf("%s %s: %lld elements %s, worst err/tol %.3f", pass ? "ok  " : "FAIL", label, npts, full ? "(all)" : "(sampled rows+cols)", wr);
    if (bad) {
        long long i = first_bad[fb];
        printf("; %lld wrong, e.g. C[%d][%d] = %.6g, reference %.6g, tol %.3g", bad, pts[i].first, pts[i].second, got_v[fb], ref_v[fb],
               tol_v[fb]);
    }
    if (nonfinite) printf("; %lld outputs NaN/Inf (unwritten?)", nonfinite);
    if (clobbered) printf("; %lld padding/sentinel elements overwritten", clobbered);
    if (!same) printf("; second run differs bitwise");
    printf("\n");
    fflush(stdout);
    return pass;
}

static bool g_small; // --small

static int check(const std::vector<GemmKernel> &kernels) {
    const int BT = 4096;
    std::vector<Case> d12 = {
        // forward: out = inp . W^T + bias (fused: GELU with its input kept; residual add)
        { "fwd qkv", BT, 2304, 768, 1, 1, GEMM_STORE_BF16, true, false, false, false, false },
        { "fwd attproj+resid", BT, 768, 768, 1, 1, GEMM_STORE_BF16, true, false, false, false, true },
        { "fwd fc+gelu", BT, 3072, 768, 1, 1, GEMM_STORE_BF16, true, true, true, false, false },
        { "fwd fcproj+resid", BT, 768, 3072, 1, 1, GEMM_STORE_BF16, true, false, false, false, true },
        // input gradients: dinp = dout . W (fused: GELU backward for fc's output gradient)
        { "dinp qkv", BT, 768, 2304, 1, 0, GEMM_STORE_BF16, false, false, false, false, false },
        { "dinp attproj", BT, 768, 768, 1, 0, GEMM_STORE_BF16, false, false, false, false, false },
        { "dinp fc", BT, 768, 3072, 1, 0, GEMM_STORE_BF16, false, false, false, false, false },
        { "dinp fcproj+dgelu", BT, 3072, 768, 1, 0, GEMM_STORE_BF16, false, false, false, true, false },
        // weight gradients: dW += dout^T . inp in fp32
        { "dW qkv", 2304, 768, BT, 0, 0, GEMM_ACCUM_F32, false, false, false, false, false },
        { "dW attproj", 768, 768, BT, 0, 0, GEMM_ACCUM_F32, false, false, false, false, false },
        { "dW fc", 3072, 768, BT, 0, 0, GEMM_ACCUM_F32, false, false, false, false, false },
        { "dW fcproj", 768, 3072, BT, 0, 0, GEMM_ACCUM_F32, false, false, false, false, false },
        { "dW attproj B*T=65536", 768, 768, 65536, 0, 0, GEMM_ACCUM_F32, false, false, false, false, false },
    };
    struct Epi {
        const char *name;
        GemmStore store;
        bool bias, gelu, pre, dgelu, residual;
    } epis[] = {
        { "plain", GEMM_STORE_BF16, false, false, false, false, false },
        { "bias+gelu", GEMM_STORE_BF16, true, true, true, false, false },
        { "dgelu+resid", GEMM_STORE_BF16, false, false, false, true, true },
        { "bias f32", GEMM_STORE_F32, true, false, false, false, false },
        { "accumulate", GEMM_ACCUM_F32, false, false, false, false, false },
    };
    const int ragged_all[][3] = { { 1, 1, 1 }, { 77, 130, 40 }, { 1000, 520, 300 }, { 129, 257, 65 }, { 300, 1000, 8 }, { 513, 33, 1000 }, { 64, 96, 0 } };
    const int ragged_small[][3] = { { 1, 1, 1 }, { 77, 130, 40 }, { 33, 24, 300 }, { 64, 96, 0 } };
    std::vector<std::vector<int>> ragged;
    if (g_small)
        for (auto &r : ragged_small) ragged.push_back({ r[0], r[1], r[2] });
    else
        for (auto &r : ragged_all) ragged.push_back({ r[0], r[1], r[2] });

    size_t ws_bytes = (size_t)256 << 20;
    void *ws = NULL;
    CK(cudaMalloc(&ws, ws_bytes));
    Totals t;
    uint64_t seed = 1;
    for (GemmKernel k : kernels) {
        printf("\n--- %s: d12 shapes (B*T = %d), the three products of each linear layer, with their operands as\n"
               "    the model stores them and with both operands stored transposed\n",
               gemm_kernel_name(k), BT);
        for (int flip = 0; flip <= 1 && !g_small; flip++)
            for (Case c : d12) {
                c.ak ^= flip;
                c.bk ^= flip;
                t.cases++;
                t.failed += !run_case(c, k, 0, ws, ws_bytes, seed++);
            }
        printf("\n--- %s: ragged shapes x 4 layouts x epilogues, automatic and forced split-K\n", gemm_kernel_name(k));
        for (auto &sh : ragged)
            for (int layout = 0; layout < 4; layout++)
                for (const Epi &e : epis)
                    for (int splits = 0; splits <= 3; splits += 3) {
                        Case c = { e.name, sh[0], sh[1], sh[2], layout & 1, layout >> 1, e.store, e.bias, e.gelu, e.pre, e.dgelu, e.residual };
                        t.cases++;
                        t.failed += !run_case(c, k, splits, ws, ws_bytes, seed++);
                    }
    }
    CK(cudaFree(ws));
    printf("\ngemm_check: %d passed, %d failed\n", t.cases - t.failed, t.failed);
    return t.failed;
}

// ------------------------------------------------------------------------------------------------
// timing

__global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (seed + i) * 0x9e3779b97f4a7c15ULL;
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 29;
        float f = (float)(x >> 40) * (2.0f / 16777216.0f) - 1.0f; // [-1, 1)
        p[i] = (uint16_t)(__float_as_uint(f) >> 16);
    }
}
static void fill_bf16(uint16_t *p, size_t n, uint64_t seed) {
    CUDA_LAUNCH(1024, 256, 0, 0, fill_bf16_kernel)(p, n, seed);
    CK(cudaGetLastError());
}

struct BenchShape {
    const char *name;
    int M, N, K, ak, bk;
    GemmStore store;
    bool bias, gelu; // fused epilogue (ours only; cuBLAS runs the plain product)
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct BenchEnv {
    int l2_bytes;
#ifdef GEMM_CHECK_CUBLAS
    cublasHandle_t cublas;
#endif
};

// median ms of one launch of `fn(buffer index)` over rotating buffers
template <typename F> static double time_launches(F fn, int nbuf, int warm, int iters) {
    std::vector<cudaEvent_t> ev(2 * iters);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < warm; i++) fn(i % nbuf);
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(ev[2 * i]));
        fn((warm + i) % nbuf);
        CK(cudaEventRecord(ev[2 * i + 1]));
    }
    CK(cudaDeviceSynchronize());
    std::vector<double> ms(iters);
    for (int i = 0; i < iters; i++) {
        float x = 0;
        CK(cudaEventElapsedTime(&x, ev[2 * i], ev[2 * i + 1]));
        ms[i] = x;
    }
    for (auto &e : ev) CK(cudaEventDestroy(e));
    return median(ms);
}

static void bench(const std::vector<GemmKernel> &kernels, const char *table_path) {
    BenchEnv env;
    CK(cudaDeviceGetAttribute(&env.l2_bytes, cudaDevAttrL2CacheSize, 0));
#ifdef GEMM_CHECK_CUBLAS
    if (cublasCreate(&env.cublas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
#endif
    const int BT = 65536; // d12 at B = 64, T = 1024
    std::vector<BenchShape> shapes = {
        { "square 4096", 4096, 4096, 4096, 1, 1, GEMM_STORE_BF16, false, false },
        { "square 8192", 8192, 8192, 8192, 1, 1, GEMM_STORE_BF16, false, false },
        { "d12 fwd qkv", BT, 2304, 768, 1, 1, GEMM_STORE_BF16, false, false },
        { "d12 fwd attproj", BT, 768, 768, 1, 1, GEMM_STORE_BF16, false, false },
        { "d12 fwd fc", BT, 3072, 768, 1, 1, GEMM_STORE_BF16, false, false },
        { "d12 fwd fcproj", BT, 768, 3072, 1, 1, GEMM_STORE_BF16, false, false },
        { "d12 dinp qkv", BT, 768, 2304, 1, 0, GEMM_STORE_BF16, false, false },
        { "d12 dinp attproj", BT, 768, 768, 1, 0, GEMM_STORE_BF16, false, false },
        { "d12 dinp fc", BT, 768, 3072, 1, 0, GEMM_STORE_BF16, false, false },
        { "d12 dinp fcproj", BT, 3072, 768, 1, 0, GEMM_STORE_BF16, false, false },
        { "d12 dW qkv", 2304, 768, BT, 0, 0, GEMM_ACCUM_F32, false, false },
        { "d12 dW attproj", 768, 768, BT, 0, 0, GEMM_ACCUM_F32, false, false },
        { "d12 dW fc", 3072, 768, BT, 0, 0, GEMM_ACCUM_F32, false, false },
        { "d12 dW fcproj", 768, 3072, BT, 0, 0, GEMM_ACCUM_F32, false, false },
        { "d12 fwd fc +bias+gelu (fused)", BT, 3072, 768, 1, 1, GEMM_STORE_BF16, true, true },
    };
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    char line[512];
    std::vector<std::string> out;
    snprintf(line, sizeof line, "GEMM benchmark on %s (%d SMs, L2 %d MB): TFLOP/s = 2MNK / median of 20 launches", prop.name,
             prop.multiProcessorCount, env.l2_bytes >> 20);
    out.push_back(line);
    std::string head = "| shape | M | N | K | A | B | C |";
    for (GemmKernel k : kernels) head += std::string(" ") + gemm_kernel_name(k) + " TFLOP/s | splits |";
#ifdef GEMM_CHECK_CUBLAS
    head += " cuBLAS TFLOP/s | best / cuBLAS |";
#else
    head += " (cuBLAS not built) |";
#endif
    out.push_back(head);
    std::string sep = "|";
    for (size_t i = 0, n = std::count(head.begin(), head.end(), '|') - 1; i < n; i++) sep += "---|";
    out.push_back(sep);
    printf("%s\n%s\n%s\n", out[0].c_str(), out[1].c_str(), out[2].c_str());

    size_t ws_bytes = (size_t)256 << 20;
    void *ws = NULL;
    CK(cudaMalloc(&ws, ws_bytes));
    for (const BenchShape &s : shapes) {
        const size_t an = (size_t)s.M * s.K, bn = (size_t)s.N * s.K, cn = (size_t)s.M * s.N;
        const size_t in_bytes = (an + bn) * 2;
        int nbuf = (int)std::min<size_t>(8, std::max<size_t>(2, (size_t)3 * env.l2_bytes / in_bytes + 1));
        std::vector<uint16_t *> A(nbuf), B(nbuf);
        for (int i = 0; i < nbuf; i++) {
            A[i] = dalloc<uint16_t>(an);
            B[i] = dalloc<uint16_t>(bn);
            fill_bf16(A[i], an, 1000 + 2 * i);
            fill_bf16(B[i], bn, 2001 + 2 * i);
        }
        const bool cbf = s.store == GEMM_STORE_BF16;
        void *C = cbf ? (void *)dalloc<uint16_t>(cn) : (void *)dalloc<float>(cn);
        CK(cudaMemset(C, 0, cn * (cbf ? 2 : 4)));
        uint16_t *bias = dalloc<uint16_t>(s.N), *pre = s.gelu ? dalloc<uint16_t>(cn) : NULL;
        fill_bf16(bias, s.N, 77);
        const double flop = 2.0 * s.M * s.N * s.K;
        snprintf(line, sizeof line, "| %s | %d | %d | %d | %s | %s | %s%s |", s.name, s.M, s.N, s.K, s.ak ? "k-major" : "m-major",
                 s.bk ? "k-major" : "n-major", store_name(s.store), s.gelu ? " bias gelu" : "");
        std::string row = line;
        double best = 0;
        for (GemmKernel k : kernels) {
            GemmProblem p;
            memset(&p, 0, sizeof p);
            p.M = s.M;
            p.N = s.N;
            p.K = s.K;
            p.lda = s.ak ? s.K : s.M;
            p.a_kmajor = s.ak;
            p.ldb = s.bk ? s.K : s.N;
            p.b_kmajor = s.bk;
            p.C = C;
            p.ldc = s.N;
            p.store = s.store;
            if (s.bias) p.bias = bias;
            p.gelu = s.gelu;
            p.pre_gelu = pre;
            GemmOptions o = { k, 0, ws, ws_bytes, NULL };
            size_t wsb = gemm_workspace_bytes(&p, k);
            int splits = wsb ? (int)(wsb / ((size_t)s.M * ((s.N + 1) & ~1) * 4)) : 1;
            double ms = time_launches(
                [&](int b) {
                    p.A = A[b];
                    p.B = B[b];
                    if (gemm_bf16(&p, &o) != k) die("gemm_bf16 did not run %s on %s", gemm_kernel_name(k), s.name);
                },
                nbuf, 5, 20);
            double tf = flop / (ms * 1e-3) / 1e12;
            best = std::max(best, tf);
            snprintf(line, sizeof line, " %.1f | %d |", tf, splits);
            row += line;
        }
#ifdef GEMM_CHECK_CUBLAS
        {
            const float one = 1.0f, zero = 0.0f;
            const float *beta = s.store == GEMM_ACCUM_F32 ? &one : &zero;
            double ms = time_launches(
                [&](int b) {
                    // cuBLAS is column-major: row-major C[M][N] is C^T[N][M] = B^T(N x K) A^T(K x M), where
                    // B^T is B read as stored when n-major, transposed when k-major; likewise A^T.
                    cublasStatus_t st = cublasGemmEx(env.cublas, s.bk ? CUBLAS_OP_T : CUBLAS_OP_N, s.ak ? CUBLAS_OP_N : CUBLAS_OP_T, s.N,
                                                     s.M, s.K, &one, B[b], CUDA_R_16BF, s.bk ? s.K : s.N, A[b], CUDA_R_16BF,
                                                     s.ak ? s.K : s.M, beta, C, cbf ? CUDA_R_16BF : CUDA_R_32F, s.N,
                                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    if (st != CUBLAS_STATUS_SUCCESS) die("cublasGemmEx failed (%d) on %s", (int)st, s.name);
                },
                nbuf, 5, 20);
            double tf = flop / (ms * 1e-3) / 1e12;
            snprintf(line, sizeof line, " %.1f | %.0f%% |", tf, 100.0 * best / tf);
            row += line;
        }
#else
        row += " - |";
#endif
        printf("%s\n", row.c_str());
        fflush(stdout);
        out.push_back(row);
        for (int i = 0; i < nbuf; i++) {
            CK(cudaFree(A[i]));
            CK(cudaFree(B[i]));
        }
        CK(cudaFree(C));
        CK(cudaFree(bias));
        if (pre) CK(cudaFree(pre));
    }
    CK(cudaFree(ws));
#ifdef GEMM_CHECK_CUBLAS
    cublasDestroy(env.cublas);
#endif
    if (table_path) {
        FILE *f = xfopen(table_path, "w");
        for (auto &l : out) fprintf(f, "%s\n", l.c_str());
        xfclose(f, table_path);
    }
}

#ifdef GEMM_CHECK_CUBLAS
// ours against cuBLAS on a full 4096^3 product (both bf16 out): an independent check at a size where the
// CPU reference only samples. Returns the number of elements out of tolerance.
static long long compare_cublas(GemmKernel k) {
    const int n = 4096;
    const size_t nn = (size_t)n * n;
    uint16_t *A = dalloc<uint16_t>(nn), *B = dalloc<uint16_t>(nn), *C1 = dalloc<uint16_t>(nn), *C2 = dalloc<uint16_t>(nn);
    fill_bf16(A, nn, 5);
    fill_bf16(B, nn, 6);
    GemmProblem p;
    memset(&p, 0, sizeof p);
    p.M = p.N = p.K = n;
    p.A = A;
    p.B = B;
    p.C = C1;
    p.lda = p.ldb = p.ldc = n;
    p.a_kmajor = p.b_kmajor = 1;
    GemmOptions o = { k, 0, NULL, 0, NULL };
    if (gemm_bf16(&p, &o) != k) die("gemm_bf16 did not run %s", gemm_kernel_name(k));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, B, CUDA_R_16BF, n, A, CUDA_R_16BF, n, &zero, C2, CUDA_R_16BF, n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        die("cublasGemmEx failed");
    CK(cudaDeviceSynchronize());
    cublasDestroy(h);
    std::vector<uint16_t> h1(nn), h2(nn);
    CK(cudaMemcpy(h1.data(), C1, nn * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2.data(), C2, nn * 2, cudaMemcpyDeviceToHost));
    long long bad = 0;
    double worst = 0;
    // |sum| ~ sqrt(K/9) = 21 for uniform [-1,1] inputs: both round to bf16 (2^-8 relative each), and
    // their fp32 sums differ by far less than 0.05
    for (size_t i = 0; i < nn; i++) {
        double a = bf(h1[i]), b = bf(h2[i]), tol = ldexp(fabs(a) + fabs(b), -7) + 0.05;
        if (!(fabs(a - b) <= tol)) bad++;
        else worst = std::max(worst, fabs(a - b) / tol);
    }
    printf("%s %-8s 4096^3 against cuBLAS, every element: %lld out of tolerance, worst err/tol %.3f\n", bad ? "FAIL" : "ok  ",
           gemm_kernel_name(k), bad, worst);
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C1));
    CK(cudaFree(C2));
    return bad;
}
#endif

int main(int argc, char **argv) {
    bool do_check = false, do_bench = false;
    const char *which = "all", *table = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) do_check = true;
        else if (!strcmp(argv[i], "--bench")) do_bench = true;
        else if (!strcmp(argv[i], "--kernel") && i + 1 < argc) which = argv[++i];
        else if (!strcmp(argv[i], "--table") && i + 1 < argc) table = argv[++i];
        else if (!strcmp(argv[i], "--small")) g_small = true;
        else die("unknown argument %s (usage: gemm_check --check|--bench [--small] [--kernel mma|wgmma|all] [--table FILE])", argv[i]);
    }
    if (!do_check && !do_bench) die("nothing to do: give --check and/or --bench");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, compute capability %d.%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (strcmp(which, "all") && strcmp(which, "mma") && strcmp(which, "wgmma")) die("unknown --kernel %s (mma, wgmma or all)", which);
    std::vector<GemmKernel> kernels;
    const GemmKernel all[2] = { GEMM_KERNEL_MMA, GEMM_KERNEL_WGMMA };
    for (GemmKernel k : all) {
        if (strcmp(which, "all") && strcmp(which, k == GEMM_KERNEL_MMA ? "mma" : "wgmma")) continue;
        if (gemm_available(k) == k) {
            kernels.push_back(k);
        } else if (k == GEMM_KERNEL_WGMMA && prop.major == 9 && prop.minor == 0) {
            printf("FAIL wgmma: this is a Hopper GPU but the binary has no sm_90a code (CUDA_GENCODE?)\n");
            return 1;
        } else {
            printf("%s: not for this device (compute capability %d.%d): skipped\n", gemm_kernel_name(k), prop.major, prop.minor);
        }
    }
    if (kernels.empty()) return 0;
    int failed = 0;
    if (do_check) {
        failed += check(kernels);
#ifdef GEMM_CHECK_CUBLAS
        for (GemmKernel k : kernels)
            if (!g_small) failed += compare_cublas(k) != 0;
#endif
    }
    if (do_bench) bench(kernels, table);
    return failed ? 1 : 0;
}

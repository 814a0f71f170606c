// test_cuda.c: every op of the CUDA backend against the CPU reference backend, in fp32 and bf16, on
// fresh random inputs and shapes that are not multiples of any tile size, under every code path the
// backend has for the op: the SIMT GEMM with each tile size and the tensor-core GEMMs (mma.sync, and
// wgmma where the device has it) for matmuls, the simple and the flash kernels for attention. Outputs
// that an op overwrites start as NaN on both sides (an element left unwritten fails), and NaN never
// passes a tolerance check. Each path is also rerun on the same inputs: the results must be bitwise
// identical. Then the backend's own machinery: streams and events ordering work across the compute and
// communication streams, sumsq_acc, memory ops, and a repeated step allocating no scratch.
//
// Prints "ok <name>" or "FAIL <name> <details>" per check and "N passed, N failed" at the end; exits
// non-zero on any failure. Without a CUDA device it prints "no CUDA device: skipped" and exits 0.
// `test_cuda --fault` runs one kernel on a bad pointer (for LLM4D_CUDA_SYNC=1: the error names it);
// `test_cuda --small` runs every op and path on small shapes (for the emulated GPU: build/test_cuda-emu).
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gemm.h"
#include "kernels.h"

// test hooks exported by kernels.cu (C linkage), not part of kernels.h
void cuda_set_gemm_tile(int tile);
void cuda_set_gemm_kernel(int kernel);
void cuda_set_attention_simple(int simple);
long long cuda_scratch_grows(void);
long long cuda_tc_calls(void);
int cuda_gemm_kernel(void);

static const Backend *CPU, *GPU;
static int npass, nfail;

static void report(int ok, const char *name, const char *details) {
    if (ok) {
        printf("ok %s\n", name);
        npass++;
    } else {
        printf("FAIL %s %s\n", name, details);
        nfail++;
    }
    fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// deterministic pseudo-random numbers (splitmix64)

static uint64_t rng = 0x1234567887654321ull;
static uint64_t next_u64(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)((next_u64() >> 40) * (1.0 / 16777216.0)); }

// ---------------------------------------------------------------------------------------------
// a test case: tensors present on both backends with the same initial bytes, an op run on each side,
// and the tensors to compare afterwards

#define MAXT 12
#define EXACT (-1.0) // tolerance meaning "bitwise identical"

typedef struct {
    size_t n, bytes;
    DType dt;
    int is_int;
    unsigned char *init;
    void *p[2]; // [0] cpu, [1] gpu
} Ten;

typedef struct Case Case;
typedef void (*RunFn)(const Backend *be, Case *c, int side);

// the code paths an op has on the GPU
enum { KIND_PLAIN = 0, KIND_GEMM, KIND_ATTN };

struct Case {
    char name[200];
    DType dt;
    int B, T, C, NH, N, OC, V, Vp;
    int vstart, vlen; // vocabulary slice: first row/column, and rows (encoder) or real columns (cross-entropy)
    size_t n;
    int flag;
    Ten t[MAXT];
    int nt;
    int out[MAXT];
    double tol[MAXT];
    int nout;
    int kind;       // KIND_*: which paths to run
    int tc;         // the tensor-core path must take this case (bf16, shapes it accepts)
};

#define P(i) (c->t[(i)].p[side])

static void case_init(Case *c, DType dt, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void case_init(Case *c, DType dt, const char *fmt, ...) {
    memset(c, 0, sizeof *c);
    c->dt = dt;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
}

static int add_ten(Case *c, DType dt, int is_int, size_t n) {
    if (c->nt >= MAXT) die("test case %s: too many tensors", c->name);
    Ten *t = &c->t[c->nt];
    t->n = n;
    t->dt = dt;
    t->is_int = is_int;
    t->bytes = n * (is_int ? 4 : dtype_size(dt));
    t->init = xcalloc(t->bytes ? t->bytes : 1, 1);
    return c->nt++;
}

static void set_val(Ten *t, size_t i, float v) {
    if (t->dt == DT_BF16) ((uint16_t *)t->init)[i] = f32_to_bf16(v);
    else ((float *)t->init)[i] = v;
}

static int add_rand(Case *c, DType dt, size_t n, float lo, float hi) {
    int k = add_ten(c, dt, 0, n);
    for (size_t i = 0; i < n; i++) set_val(&c->t[k], i, frand(lo, hi));
    return k;
}

static int add_tokens(Case *c, size_t n, int V) {
    int k = add_ten(c, DT_F32, 1, n);
    for (size_t i = 0; i < n; i++) ((int32_t *)c->t[k].init)[i] = (int32_t)(next_u64() % (uint64_t)V);
    return k;
}

static void add_out(Case *c, int k, double tol) {
    c->out[c->nout] = k;
    c->tol[c->nout] = tol;
    c->nout++;
}

// an output the op overwrites entirely: it starts as NaN, so an element left unwritten fails
static void add_out_poisoned(Case *c, int k, double tol) {
    Ten *t = &c->t[k];
    for (size_t i = 0; i < t->n; i++) set_val(t, i, NAN);
    add_out(c, k, tol);
}

static float elem(const Ten *t, const void *host, size_t i) {
    return t->dt == DT_BF16 ? bf16_to_f32(((const uint16_t *)host)[i]) : ((const float *)host)[i];
}

static void upload(Case *c, int side) {
    const Backend *be = side ? GPU : CPU;
    for (int i = 0; i < c->nt; i++) be->to_device(c->t[i].p[side], c->t[i].init, c->t[i].bytes);
}

static unsigned char *download(const Ten *t, int side) {
    const Backend *be = side ? GPU : CPU;
    unsigned char *h = xmalloc(t->bytes ? t->bytes : 1);
    be->to_host(h, t->p[side], t->bytes);
    return h;
}

// compares tensor k of the case between the CPU and the GPU side
static void compare(Case *c, const char *path, int k, double tol) {
    const Ten *t = &c->t[k];
    char name[300], details[400] = "";
    snprintf(name, sizeof name, "%s%s:t%d", c->name, path, k);
    unsigned char *a = download(t, 1), *b = download(t, 0);
    int ok = 1;
    if (tol < 0 || t->is_int) {
        size_t esz = t->is_int ? 4 : dtype_size(t->dt);
        for (size_t i = 0; i < t->n && ok; i++)
            if (memcmp(a + i * esz, b + i * esz, esz) != 0) {
                ok = 0;
                snprintf(details, sizeof details, "not bitwise equal at %zu: gpu %.9g cpu %.9g", i,
                         t->is_int ? (double)((int32_t *)a)[i] : (double)elem(t, a, i),
                         t->is_int ? (double)((int32_t *)b)[i] : (double)elem(t, b, i));
            }
    } else {
        double maxref = 0.0, maxdiff = 0.0;
        size_t worst = 0, nans = 0, infs = 0;
        for (size_t i = 0; i < t->n; i++) {
            double x = elem(t, a, i), y = elem(t, b, i);
            if (isnan(x) || isnan(y)) { // never passes, whatever the other side holds
                if (!nans++) worst = i;
                continue;
            }
            if (x == y) { // infinities included (lse of rows that see no key)
                if (isfinite(y) && fabs(y) > maxref) maxref = fabs(y);
                continue;
            }
            if (isinf(x) || isinf(y)) {
                if (!infs++ && !nans) worst = i;
                continue;
            }
            if (fabs(y) > maxref) maxref = fabs(y);
            double d = fabs(x - y);
            if (d > maxdiff) {
                maxdiff = d;
                if (!nans && !infs) worst = i;
            }
        }
        double rel = maxref > 0 ? maxdiff / maxref : maxdiff;
        if (nans || infs || !(rel <= tol)) {
            ok = 0;
            snprintf(details, sizeof details, "%zu NaN, %zu unequal infinities, max|a-b|/max|b| = %.3g (tol %.1g) (at %zu: gpu %.9g cpu %.9g)",
                     nans, infs, rel, tol, worst, (double)elem(t, a, worst), (double)elem(t, b, worst));
        }
    }
    report(ok, name, details);
    free(a);
    free(b);
}

// The GPU paths of each kind of op: name, GEMM (-1 SIMT, 0 best tensor-core, 1 mma.sync, 2 wgmma),
// SIMT tile, simple attention; `tc`: the path is a tensor-core one.
typedef struct {
    const char *name;
    int gemm, tile, attn_simple, tc;
} Path;
static const Path PLAIN_PATHS[] = { { "", 0, 0, 0, 0 } };
static const Path GEMM_PATHS[] = { { "@simt64", -1, 64, 0, 0 }, { "@simt128", -1, 128, 0, 0 },
                                   { "@mma", GEMM_KERNEL_MMA, 0, 0, 1 }, { "@wgmma", GEMM_KERNEL_WGMMA, 0, 0, 1 } };
static const Path ATTN_PATHS[] = { { "@simple", 0, 0, 1, 0 }, { "@flash", 0, 0, 0, 1 } };

static void set_path(const Path *p) {
    cuda_set_gemm_kernel(p->gemm);
    cuda_set_gemm_tile(p->tile);
    cuda_set_attention_simple(p->attn_simple);
}

static void run_case(Case *c, RunFn fn) {
    for (int i = 0; i < c->nt; i++) {
        size_t bytes = c->t[i].bytes;
        c->t[i].p[0] = CPU->alloc(bytes);
        c->t[i].p[1] = GPU->alloc(bytes);
        if (!c->t[i].p[0] || !c->t[i].p[1]) die("out of memory for test %s", c->name);
    }
    upload(c, 0);
    fn(CPU, c, 0);

    const Path *paths = PLAIN_PATHS;
    int npaths = 1;
    if (c->kind == KIND_GEMM) paths = GEMM_PATHS, npaths = c->dt == DT_BF16 ? 4 : 2;
    if (c->kind == KIND_ATTN) paths = ATTN_PATHS, npaths = c->dt == DT_BF16 ? 2 : 1;
    for (int pi = 0; pi < npaths; pi++) {
        const Path *path = &paths[pi];
        set_path(path);
        if (c->kind == KIND_GEMM && path->tc && cuda_gemm_kernel() != path->gemm) {
            printf("skipped %s%s: this device has no such kernel\n", c->name, path->name);
            continue;
        }
        long long tc0 = cuda_tc_calls();
        upload(c, 1);
        fn(GPU, c, 1);
        GPU->sync();
        for (int o = 0; o < c->nout; o++) compare(c, path->name, c->out[o], c->tol[o]);
        char name[300], details[300] = "";
        if (path->tc && c->tc) { // the fast path must really have run
            snprintf(name, sizeof name, "tensor cores:%s%s", c->name, path->name);
            report(cuda_tc_calls() > tc0, name, "the op fell back to the SIMT code");
        }

        // determinism: rerun from the same initial state on the same path
        unsigned char *ref[MAXT];
        for (int o = 0; o < c->nout; o++) ref[o] = download(&c->t[c->out[o]], 1);
        upload(c, 1);
        fn(GPU, c, 1);
        GPU->sync();
        int ok = 1;
        for (int o = 0; o < c->nout && ok; o++) {
            unsigned char *h = download(&c->t[c->out[o]], 1);
            if (memcmp(h, ref[o], c->t[c->out[o]].bytes) != 0) {
                ok = 0;
                snprintf(details, sizeof details, "t%d differs between runs", c->out[o]);
            }
            free(h);
        }
        snprintf(name, sizeof name, "determinism:%s%s", c->name, path->name);
        report(ok, name, details);
        for (int o = 0; o < c->nout; o++) free(ref[o]);
    }
    set_path(&PLAIN_PATHS[0]);
    for (int i = 0; i < c->nt; i++) {
        CPU->free(c->t[i].p[0]);
        GPU->free(c->t[i].p[1]);
        free(c->t[i].init);
    }
}

// tolerances
static double tol_ew(DType dt) { return dt == DT_BF16 ? 2e-2 : 1e-5; }
static double tol_mm(DType dt) { return dt == DT_BF16 ? 2e-2 : 1e-4; }

// ---------------------------------------------------------------------------------------------
// the ops

static void run_encoder_fwd(const Backend *be, Case *c, int side) {
    be->encoder_fwd(c->dt, P(0), P(1), P(2), c->flag ? P(3) : NULL, c->B, c->T, c->C, c->vstart, c->vlen);
}
// tokens in [0, V); wte holds the slice [vstart, vstart + vlen) of the vocabulary
static void test_encoder_fwd(DType dt, int B, int T, int C, int V, int vstart, int vlen, int wpe) {
    Case c;
    case_init(&c, dt, "encoder_fwd[%s,B=%d,T=%d,C=%d,V=%d,slice=%d+%d,%s]", dtype_name(dt), B, T, C, V, vstart, vlen,
              wpe ? "wpe" : "nowpe");
    c.B = B, c.T = T, c.C = C, c.V = V, c.vstart = vstart, c.vlen = vlen, c.flag = wpe;
    add_rand(&c, dt, (size_t)B * T * C, -1, 1);
    add_tokens(&c, (size_t)B * T, V);
    add_rand(&c, dt, (size_t)vlen * C, -1, 1);
    add_rand(&c, dt, (size_t)T * C, -1, 1);
    add_out_poisoned(&c, 0, EXACT);
    run_case(&c, run_encoder_fwd);
}

static void run_encoder_bwd(const Backend *be, Case *c, int side) {
    be->encoder_bwd(c->dt, P(0), c->flag ? P(1) : NULL, P(2), P(3), c->B, c->T, c->C, c->vstart, c->vlen);
}
static void test_encoder_bwd(DType dt, int B, int T, int C, int V, int vstart, int vlen, int wpe) {
    Case c;
    case_init(&c, dt, "encoder_bwd[%s,B=%d,T=%d,C=%d,V=%d,slice=%d+%d,%s]", dtype_name(dt), B, T, C, V, vstart, vlen,
              wpe ? "dwpe" : "nodwpe");
    c.B = B, c.T = T, c.C = C, c.V = V, c.vstart = vstart, c.vlen = vlen, c.flag = wpe;
    add_rand(&c, DT_F32, (size_t)vlen * C, -1, 1);
    add_rand(&c, DT_F32, (size_t)T * C, -1, 1); // dwpe: must stay untouched when not passed
    add_rand(&c, dt, (size_t)B * T * C, -1, 1);
    add_tokens(&c, (size_t)B * T, V);
    // same additions in the same order as the CPU: bitwise equal
    add_out(&c, 0, EXACT);
    add_out(&c, 1, EXACT);
    run_case(&c, run_encoder_bwd);
}

static void run_layernorm_fwd(const Backend *be, Case *c, int side) {
    be->layernorm_fwd(c->dt, P(0), P(1), P(2), P(3), P(4), P(5), c->N, c->C);
}
static void test_layernorm_fwd(DType dt, int N, int C) {
    Case c;
    case_init(&c, dt, "layernorm_fwd[%s,N=%d,C=%d]", dtype_name(dt), N, C);
    c.N = N, c.C = C;
    add_rand(&c, dt, (size_t)N * C, -1, 1);
    add_rand(&c, DT_F32, N, -1, 1);
    add_rand(&c, DT_F32, N, -1, 1);
    add_rand(&c, dt, (size_t)N * C, -2, 3);
    add_rand(&c, dt, C, 0.5f, 1.5f);
    add_rand(&c, dt, C, -0.5f, 0.5f);
    add_out_poisoned(&c, 0, tol_ew(dt));
    add_out_poisoned(&c, 1, tol_ew(dt));
    add_out_poisoned(&c, 2, tol_ew(dt));
    run_case(&c, run_layernorm_fwd);
}

static void run_residual_layernorm_fwd(const Backend *be, Case *c, int side) {
    // flag: the residual is written over its second input (as the model does under sequence parallelism)
    be->residual_layernorm_fwd(c->dt, c->flag ? P(5) : P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), c->N, c->C);
}
static void test_residual_layernorm_fwd(DType dt, int N, int C, int alias) {
    Case c;
    case_init(&c, dt, "residual_layernorm_fwd[%s,N=%d,C=%d%s]", dtype_name(dt), N, C, alias ? ",res=b" : "");
    c.N = N, c.C = C, c.flag = alias;
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // res
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // out
    add_rand(&c, DT_F32, N, -1, 1);          // mean
    add_rand(&c, DT_F32, N, -1, 1);          // rstd
    add_rand(&c, dt, (size_t)N * C, -2, 3);  // a
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // b
    add_rand(&c, dt, C, 0.5f, 1.5f);
    add_rand(&c, dt, C, -0.5f, 0.5f);
    if (alias) add_out(&c, 5, EXACT); // one rounded addition per element
    else add_out_poisoned(&c, 0, EXACT);
    add_out_poisoned(&c, 1, tol_ew(dt));
    add_out_poisoned(&c, 2, tol_ew(dt));
    add_out_poisoned(&c, 3, tol_ew(dt));
    run_case(&c, run_residual_layernorm_fwd);
}

static void run_layernorm_bwd(const Backend *be, Case *c, int side) {
    be->layernorm_bwd(c->dt, P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), c->N, c->C);
}
static void test_layernorm_bwd(DType dt, int N, int C) {
    Case c;
    case_init(&c, dt, "layernorm_bwd[%s,N=%d,C=%d]", dtype_name(dt), N, C);
    c.N = N, c.C = C;
    add_rand(&c, dt, (size_t)N * C, -1, 1);     // dinp (accumulated)
    add_rand(&c, DT_F32, C, -1, 1);             // dweight
    add_rand(&c, DT_F32, C, -1, 1);             // dbias
    add_rand(&c, dt, (size_t)N * C, -1, 1);     // dout
    add_rand(&c, dt, (size_t)N * C, -2, 2);     // inp
    add_rand(&c, dt, C, 0.5f, 1.5f);            // weight
    add_rand(&c, DT_F32, N, -0.5f, 0.5f);       // mean
    add_rand(&c, DT_F32, N, 0.5f, 2.0f);        // rstd
    add_out(&c, 0, tol_ew(dt));
    add_out(&c, 1, tol_ew(dt));
    add_out(&c, 2, tol_ew(dt));
    run_case(&c, run_layernorm_bwd);
}

// flag bit 0: bias; bit 1: GELU epilogue (pre keeps its input)
static void run_matmul_fwd(const Backend *be, Case *c, int side) {
    be->matmul_fwd(c->dt, P(0), c->flag & 2 ? P(4) : NULL, P(1), P(2), c->flag & 1 ? P(3) : NULL, c->N, c->C, c->OC);
}
static void test_matmul_fwd(DType dt, int N, int C, int OC, int bias, int gelu) {
    Case c;
    case_init(&c, dt, "matmul_fwd[%s,N=%d,C=%d,OC=%d,%s%s]", dtype_name(dt), N, C, OC, bias ? "bias" : "nobias",
              gelu ? ",gelu" : "");
    c.N = N, c.C = C, c.OC = OC, c.flag = bias | (gelu ? 2 : 0), c.kind = KIND_GEMM;
    c.tc = dt == DT_BF16 && C % 8 == 0 && OC % 8 == 0; // gemm.h: leading dimensions multiples of 8
    add_rand(&c, dt, (size_t)N * OC, -1, 1);
    add_rand(&c, dt, (size_t)N * C, -1, 1);
    add_rand(&c, dt, (size_t)OC * C, -1, 1);
    add_rand(&c, dt, OC, -1, 1);
    add_rand(&c, dt, (size_t)N * OC, -1, 1); // pre
    add_out_poisoned(&c, 0, tol_mm(dt));
    if (gelu) add_out_poisoned(&c, 4, tol_mm(dt));
    run_case(&c, run_matmul_fwd);
}

static void run_gelu_fwd(const Backend *be, Case *c, int side) { be->gelu_fwd(c->dt, P(0), P(1), c->n); }
static void test_gelu_fwd(DType dt, size_t n) {
    Case c;
    case_init(&c, dt, "gelu_fwd[%s,n=%zu]", dtype_name(dt), n);
    c.n = n;
    add_rand(&c, dt, n, -1, 1);
    add_rand(&c, dt, n, -6, 6);
    add_out_poisoned(&c, 0, tol_ew(dt));
    run_case(&c, run_gelu_fwd);
}

// gelu_fwd of the pre-activation matmul_fwd kept gives bitwise the output its GELU epilogue wrote, on
// every GEMM path (selective recompute rebuilds GELU's output this way and must not change the step)
static void test_gelu_rebuild(DType dt, int N, int C, int OC) {
    Case c;
    case_init(&c, dt, "gelu_fwd rebuilds matmul_fwd's GELU output[%s,N=%d,C=%d,OC=%d]", dtype_name(dt), N, C, OC);
    add_ten(&c, dt, 0, (size_t)N * OC);     // 0: out
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // 1: inp
    add_rand(&c, dt, (size_t)OC * C, -1, 1); // 2: weight
    add_rand(&c, dt, OC, -1, 1);             // 3: bias
    add_ten(&c, dt, 0, (size_t)N * OC);     // 4: pre
    add_ten(&c, dt, 0, (size_t)N * OC);     // 5: rebuilt
    for (int i = 0; i < c.nt; i++) {
        c.t[i].p[1] = GPU->alloc(c.t[i].bytes);
        if (!c.t[i].p[1]) die("out of memory for test %s", c.name);
    }
    int npaths = dt == DT_BF16 ? 4 : 2;
    for (int pi = 0; pi < npaths; pi++) {
        const Path *path = &GEMM_PATHS[pi];
        set_path(path);
        if (path->tc && cuda_gemm_kernel() != path->gemm) {
            printf("skipped %s%s: this device has no such kernel\n", c.name, path->name);
            continue;
        }
        upload(&c, 1);
        GPU->matmul_fwd(dt, c.t[0].p[1], c.t[4].p[1], c.t[1].p[1], c.t[2].p[1], c.t[3].p[1], N, C, OC);
        GPU->gelu_fwd(dt, c.t[5].p[1], c.t[4].p[1], (size_t)N * OC);
        unsigned char *a = download(&c.t[0], 1), *b = download(&c.t[5], 1);
        char name[300];
        snprintf(name, sizeof name, "%s%s", c.name, path->name);
        report(memcmp(a, b, c.t[0].bytes) == 0, name, "the rebuilt output differs from the epilogue's");
        free(a);
        free(b);
    }
    set_path(&PLAIN_PATHS[0]);
    for (int i = 0; i < c.nt; i++) {
        GPU->free(c.t[i].p[1]);
        free(c.t[i].init);
    }
}

// flag bit 0: dinp and dbias; bit 1: GELU's backward in the dinp epilogue
static void run_matmul_bwd(const Backend *be, Case *c, int side) {
    be->matmul_bwd(c->dt, c->flag & 1 ? P(0) : NULL, P(1), c->flag & 1 ? P(2) : NULL, P(3), P(4), P(5),
                   c->flag & 2 ? P(6) : NULL, c->N, c->C, c->OC);
}
static void test_matmul_bwd(DType dt, int N, int C, int OC, int full, int gelu) {
    Case c;
    case_init(&c, dt, "matmul_bwd[%s,N=%d,C=%d,OC=%d,%s%s]", dtype_name(dt), N, C, OC,
              full ? "dinp+dbias" : "dweight-only", gelu ? ",gelu" : "");
    c.N = N, c.C = C, c.OC = OC, c.flag = full | (gelu ? 2 : 0), c.kind = KIND_GEMM;
    c.tc = dt == DT_BF16 && C % 8 == 0 && OC % 8 == 0;
    add_rand(&c, dt, (size_t)N * C, -1, 1);       // dinp (overwritten)
    add_rand(&c, DT_F32, (size_t)OC * C, -1, 1);  // dweight (accumulated)
    add_rand(&c, DT_F32, OC, -1, 1);              // dbias (accumulated)
    add_rand(&c, dt, (size_t)N * OC, -1, 1);      // dout
    add_rand(&c, dt, (size_t)N * C, -1, 1);       // inp
    add_rand(&c, dt, (size_t)OC * C, -1, 1);      // weight
    add_rand(&c, dt, (size_t)N * C, -3, 3);       // gelu_pre
    if (full) add_out_poisoned(&c, 0, tol_mm(dt));
    add_out(&c, 1, tol_mm(dt));
    add_out(&c, 2, tol_mm(dt));
    run_case(&c, run_matmul_bwd);
}

static void run_attention_fwd(const Backend *be, Case *c, int side) {
    be->attention_fwd(c->dt, P(0), P(1), P(2), c->B, c->T, c->C, c->NH);
}
static void test_attention_fwd(DType dt, int B, int T, int C, int NH) {
    Case c;
    case_init(&c, dt, "attention_fwd[%s,B=%d,T=%d,C=%d,NH=%d]", dtype_name(dt), B, T, C, NH);
    c.B = B, c.T = T, c.C = C, c.NH = NH, c.kind = KIND_ATTN;
    c.tc = dt == DT_BF16 && (C / NH == 64 || C / NH == 128);
    add_rand(&c, dt, (size_t)B * T * C, -1, 1);
    add_rand(&c, DT_F32, (size_t)B * NH * T, -1, 1); // lse
    add_rand(&c, dt, (size_t)B * T * 3 * C, -1, 1);
    add_out_poisoned(&c, 0, tol_mm(dt));
    add_out_poisoned(&c, 1, tol_mm(dt));
    run_case(&c, run_attention_fwd);
}

static void run_attention_bwd(const Backend *be, Case *c, int side) {
    be->attention_bwd(c->dt, P(0), P(1), P(2), P(3), P(4), c->B, c->T, c->C, c->NH);
}
static void test_attention_bwd(DType dt, int B, int T, int C, int NH) {
    Case c;
    case_init(&c, dt, "attention_bwd[%s,B=%d,T=%d,C=%d,NH=%d]", dtype_name(dt), B, T, C, NH);
    c.B = B, c.T = T, c.C = C, c.NH = NH, c.kind = KIND_ATTN;
    c.tc = dt == DT_BF16 && (C / NH == 64 || C / NH == 128);
    add_rand(&c, dt, (size_t)B * T * 3 * C, -1, 1); // dqkv (overwritten)
    add_rand(&c, dt, (size_t)B * T * C, -1, 1);     // dout
    int q = add_rand(&c, dt, (size_t)B * T * 3 * C, -1, 1);
    int o = add_ten(&c, dt, 0, (size_t)B * T * C);
    int l = add_ten(&c, DT_F32, 0, (size_t)B * NH * T);
    // out and lse of these q, k, v from the CPU forward (its memory is host memory)
    CPU->attention_fwd(dt, c.t[o].init, (float *)c.t[l].init, c.t[q].init, B, T, C, NH);
    add_out_poisoned(&c, 0, tol_mm(dt));
    run_case(&c, run_attention_bwd);
}

// The block ops as context parallelism uses them: queries at positions [24, 24+Tq) against two key blocks
// at [k0a, k0a+Tk) and [k0b, k0b+Tk) (the second one first), merged into fp32 accumulators; then the
// backward of both pairs, accumulated. q, k, v and dout are [B, T, NH*hs] in dt.
static void run_attention_blocks(const Backend *be, Case *c, int side) {
    int B = c->B, NH = c->NH, hs = c->C / c->NH, Tq = c->T, Tk = c->N, k0a = c->vstart, k0b = c->vlen;
    size_t es = dtype_size(c->dt), kblock = (size_t)B * Tk * c->C;
    AttnView q = { c->dt, P(0), (size_t)Tq * c->C, (size_t)c->C };
    AttnView ka = { c->dt, P(1), (size_t)Tk * c->C, (size_t)c->C }, va = { c->dt, P(2), ka.bstride, ka.tstride };
    AttnView kb = ka, vb = va;
    kb.p = (char *)P(1) + kblock * es;
    vb.p = (char *)P(2) + kblock * es;
    AttnView out = { DT_F32, P(3), q.bstride, q.tstride }, dout = { c->dt, P(5), q.bstride, q.tstride };
    AttnView dq = { DT_F32, P(6), q.bstride, q.tstride }, dka = { DT_F32, P(7), ka.bstride, ka.tstride };
    AttnView dva = { DT_F32, P(8), ka.bstride, ka.tstride }, dkb = dka, dvb = dva;
    dkb.p = (float *)P(7) + kblock;
    dvb.p = (float *)P(8) + kblock;
    be->attention_block_fwd(out, P(4), q, kb, vb, B, NH, hs, Tq, 24, Tk, k0b, 0);
    be->attention_block_fwd(out, P(4), q, ka, va, B, NH, hs, Tq, 24, Tk, k0a, 1);
    be->attention_block_bwd(dq, dka, dva, dout, out, P(4), q, ka, va, B, NH, hs, Tq, 24, Tk, k0a);
    be->attention_block_bwd(dq, dkb, dvb, dout, out, P(4), q, kb, vb, B, NH, hs, Tq, 24, Tk, k0b);
}
static void test_attention_blocks(DType dt, int B, int Tq, int Tk, int C, int NH, int k0a, int k0b) {
    Case c;
    case_init(&c, dt, "attention_block_fwd+bwd[%s,B=%d,Tq=%d@24,Tk=%d@%d,%d,C=%d,NH=%d]", dtype_name(dt), B, Tq, Tk, k0a,
              k0b, C, NH);
    c.B = B, c.T = Tq, c.N = Tk, c.C = C, c.NH = NH, c.vstart = k0a, c.vlen = k0b, c.kind = KIND_ATTN;
    c.tc = dt == DT_BF16 && (C / NH == 64 || C / NH == 128);
    add_rand(&c, dt, (size_t)B * Tq * C, -1, 1);         // q
    add_rand(&c, dt, (size_t)2 * B * Tk * C, -1, 1);     // k of both blocks
    add_rand(&c, dt, (size_t)2 * B * Tk * C, -1, 1);     // v
    add_rand(&c, DT_F32, (size_t)B * Tq * C, -1, 1);     // out (fp32 accumulator)
    add_rand(&c, DT_F32, (size_t)B * NH * Tq, -1, 1);    // lse
    add_rand(&c, dt, (size_t)B * Tq * C, -1, 1);         // dout
    add_rand(&c, DT_F32, (size_t)B * Tq * C, -1, 1);     // dq (accumulated onto these values)
    add_rand(&c, DT_F32, (size_t)2 * B * Tk * C, -1, 1); // dk
    add_rand(&c, DT_F32, (size_t)2 * B * Tk * C, -1, 1); // dv
    add_out_poisoned(&c, 3, tol_mm(dt)); // the first key block writes out and lse whole
    add_out_poisoned(&c, 4, tol_mm(dt));
    for (int i = 6; i <= 8; i++) add_out(&c, i, tol_mm(dt));
    run_case(&c, run_attention_blocks);
}

// ---------------------------------------------------------------------------------------------
// the Llama family's ops (issue 27)

#define RMS_EPS 1e-5f

static void run_rmsnorm_fwd(const Backend *be, Case *c, int side) {
    be->rmsnorm_fwd(c->dt, P(0), P(1), P(2), P(3), c->N, c->C, RMS_EPS);
}
static void test_rmsnorm_fwd(DType dt, int N, int C) {
    Case c;
    case_init(&c, dt, "rmsnorm_fwd[%s,N=%d,C=%d]", dtype_name(dt), N, C);
    c.N = N, c.C = C;
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // out
    add_rand(&c, DT_F32, N, -1, 1);          // rstd
    add_rand(&c, dt, (size_t)N * C, -2, 3);  // inp
    add_rand(&c, dt, C, 0.5f, 1.5f);         // weight
    add_out_poisoned(&c, 0, tol_ew(dt));
    add_out_poisoned(&c, 1, tol_ew(dt));
    run_case(&c, run_rmsnorm_fwd);
}

static void run_residual_rmsnorm_fwd(const Backend *be, Case *c, int side) {
    // flag: the residual is written over its second input
    be->residual_rmsnorm_fwd(c->dt, c->flag ? P(4) : P(0), P(1), P(2), P(3), P(4), P(5), c->N, c->C, RMS_EPS);
}
static void test_residual_rmsnorm_fwd(DType dt, int N, int C, int alias) {
    Case c;
    case_init(&c, dt, "residual_rmsnorm_fwd[%s,N=%d,C=%d%s]", dtype_name(dt), N, C, alias ? ",res=b" : "");
    c.N = N, c.C = C, c.flag = alias;
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // res
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // out
    add_rand(&c, DT_F32, N, -1, 1);          // rstd
    add_rand(&c, dt, (size_t)N * C, -2, 3);  // a
    add_rand(&c, dt, (size_t)N * C, -1, 1);  // b
    add_rand(&c, dt, C, 0.5f, 1.5f);         // weight
    if (alias) add_out(&c, 4, EXACT); // one rounded addition per element
    else add_out_poisoned(&c, 0, EXACT);
    add_out_poisoned(&c, 1, tol_ew(dt));
    add_out_poisoned(&c, 2, tol_ew(dt));
    run_case(&c, run_residual_rmsnorm_fwd);
}

static void run_rmsnorm_bwd(const Backend *be, Case *c, int side) {
    be->rmsnorm_bwd(c->dt, P(0), P(1), P(2), P(3), P(4), P(5), c->N, c->C);
}
static void test_rmsnorm_bwd(DType dt, int N, int C) {
    Case c;
    case_init(&c, dt, "rmsnorm_bwd[%s,N=%d,C=%d]", dtype_name(dt), N, C);
    c.N = N, c.C = C;
    add_rand(&c, dt, (size_t)N * C, -1, 1); // dinp (accumulated)
    add_rand(&c, DT_F32, C, -1, 1);         // dweight (accumulated)
    add_rand(&c, dt, (size_t)N * C, -1, 1); // dout
    add_rand(&c, dt, (size_t)N * C, -2, 2); // inp
    add_rand(&c, dt, C, 0.5f, 1.5f);        // weight
    add_rand(&c, DT_F32, N, 0.5f, 2.0f);    // rstd
    add_out(&c, 0, tol_ew(dt));
    add_out(&c, 1, tol_ew(dt));
    run_case(&c, run_rmsnorm_bwd);
}

// Llama 3's theta, and Llama 3.1's frequency scaling when `scaled`
static RopeConfig test_rope_config(int scaled) {
    RopeConfig r = { 500000.0, scaled ? 8.0 : 0.0, 1.0, 4.0, 8192 };
    return r;
}

// RoPE forward on x and backward on dx, each [B, T, nheads + 1 heads][hs] of which the first nheads
// rotate (the view's token stride is wider than its heads, as q inside qkv is); the last head is left
// alone. flag bit 0: positions from pos[] (random, up to 100000), else pos0 = c->vstart + t; bit 1: scaled.
static void run_rope(const Backend *be, Case *c, int side) {
    size_t ts = (size_t)(c->NH + 1) * c->C;
    AttnView x = { c->dt, P(0), (size_t)c->T * ts, ts }, dx = { c->dt, P(1), x.bstride, ts };
    RopeConfig r = test_rope_config(c->flag & 2);
    const int32_t *pos = c->flag & 1 ? P(2) : NULL;
    be->rope_fwd(x, c->B, c->T, c->NH, c->C, pos, c->vstart, &r);
    be->rope_bwd(dx, c->B, c->T, c->NH, c->C, pos, c->vstart, &r);
}
static void test_rope(DType dt, int B, int T, int nheads, int hs, int use_pos, int pos0, int scaled) {
    Case c;
    case_init(&c, dt, "rope_fwd+bwd[%s,B=%d,T=%d,heads=%d,hs=%d,%s%s]", dtype_name(dt), B, T, nheads, hs,
              use_pos ? "pos[]" : "pos0", scaled ? ",llama3.1-scaled" : "");
    c.B = B, c.T = T, c.NH = nheads, c.C = hs, c.vstart = pos0, c.flag = (use_pos ? 1 : 0) | (scaled ? 2 : 0);
    size_t n = (size_t)B * T * (nheads + 1) * hs;
    add_rand(&c, dt, n, -1, 1); // x (rotated in place)
    add_rand(&c, dt, n, -1, 1); // dx
    int p = add_tokens(&c, (size_t)T, 100000); // pos
    (void)p;
    add_out(&c, 0, tol_ew(dt));
    add_out(&c, 1, tol_ew(dt));
    run_case(&c, run_rope);
}

static void run_swiglu(const Backend *be, Case *c, int side) {
    be->swiglu_fwd(c->dt, P(0), P(2), c->N, c->C);
    be->swiglu_bwd(c->dt, P(1), P(3), P(2), c->N, c->C);
}
static void test_swiglu(DType dt, int N, int F) {
    Case c;
    case_init(&c, dt, "swiglu_fwd+bwd[%s,N=%d,F=%d]", dtype_name(dt), N, F);
    c.N = N, c.C = F;
    add_rand(&c, dt, (size_t)N * F, -1, 1);     // out
    add_rand(&c, dt, (size_t)N * 2 * F, -1, 1); // dgateup
    add_rand(&c, dt, (size_t)N * 2 * F, -6, 6); // gateup
    add_rand(&c, dt, (size_t)N * F, -1, 1);     // dout
    add_out_poisoned(&c, 0, tol_ew(dt));
    add_out_poisoned(&c, 1, tol_ew(dt));
    run_case(&c, run_swiglu);
}

// Grouped-query attention over whole sequences: forward, then the backward of its own out and lse.
// qkv[B, T, (NH + 2 NKV)·hs]; flag: RoPE (scaled).
static void run_attention_gqa(const Backend *be, Case *c, int side) {
    int hs = c->C;
    RopeConfig r = test_rope_config(1);
    const RopeConfig *rope = c->flag ? &r : NULL;
    be->attention_gqa_fwd(c->dt, P(0), P(1), P(2), c->B, c->T, c->NH, c->OC, hs, rope);
    be->attention_gqa_bwd(c->dt, P(3), P(4), P(2), P(0), P(1), c->B, c->T, c->NH, c->OC, hs, rope);
}
static void test_attention_gqa(DType dt, int B, int T, int NH, int NKV, int hs, int rope) {
    Case c;
    case_init(&c, dt, "attention_gqa_fwd+bwd[%s,B=%d,T=%d,NH=%d,NKV=%d,hs=%d%s]", dtype_name(dt), B, T, NH, NKV, hs,
              rope ? ",rope" : "");
    c.B = B, c.T = T, c.NH = NH, c.OC = NKV, c.C = hs, c.flag = rope, c.kind = KIND_ATTN;
    c.tc = dt == DT_BF16 && (hs == 64 || hs == 128);
    size_t row = (size_t)(NH + 2 * NKV) * hs;
    add_rand(&c, dt, (size_t)B * T * NH * hs, -1, 1); // out
    add_rand(&c, DT_F32, (size_t)B * NH * T, -1, 1);  // lse
    add_rand(&c, dt, (size_t)B * T * row, -1, 1);     // qkv
    add_rand(&c, dt, (size_t)B * T * row, -1, 1);     // dqkv (overwritten)
    add_rand(&c, dt, (size_t)B * T * NH * hs, -1, 1); // dout
    add_out_poisoned(&c, 0, tol_mm(dt));
    add_out_poisoned(&c, 1, tol_mm(dt));
    add_out_poisoned(&c, 3, tol_mm(dt));
    run_case(&c, run_attention_gqa);
}

// The GQA block ops as context parallelism uses them (run_attention_blocks with NKV kv heads and RoPE at
// the blocks' global positions): queries at [24, 24+Tq) against key blocks at k0a and k0b (the second
// first), merged into fp32 accumulators, then both pairs' backward, accumulated.
static void run_attention_gqa_blocks(const Backend *be, Case *c, int side) {
    int B = c->B, NH = c->NH, NKV = c->OC, hs = c->C, Tq = c->T, Tk = c->N, k0a = c->vstart, k0b = c->vlen;
    size_t es = dtype_size(c->dt), kblock = (size_t)B * Tk * NKV * hs, qc = (size_t)NH * hs, kc = (size_t)NKV * hs;
    RopeConfig r = test_rope_config(0);
    const RopeConfig *rope = c->flag ? &r : NULL;
    AttnView q = { c->dt, P(0), (size_t)Tq * qc, qc };
    AttnView ka = { c->dt, P(1), (size_t)Tk * kc, kc }, va = { c->dt, P(2), ka.bstride, ka.tstride };
    AttnView kb = ka, vb = va;
    kb.p = (char *)P(1) + kblock * es;
    vb.p = (char *)P(2) + kblock * es;
    AttnView out = { DT_F32, P(3), q.bstride, q.tstride }, dout = { c->dt, P(5), q.bstride, q.tstride };
    AttnView dq = { DT_F32, P(6), q.bstride, q.tstride }, dka = { DT_F32, P(7), ka.bstride, ka.tstride };
    AttnView dva = { DT_F32, P(8), ka.bstride, ka.tstride }, dkb = dka, dvb = dva;
    dkb.p = (float *)P(7) + kblock;
    dvb.p = (float *)P(8) + kblock;
    be->attention_gqa_block_fwd(out, P(4), q, kb, vb, B, NH, NKV, hs, Tq, 24, Tk, k0b, rope, 0);
    be->attention_gqa_block_fwd(out, P(4), q, ka, va, B, NH, NKV, hs, Tq, 24, Tk, k0a, rope, 1);
    be->attention_gqa_block_bwd(dq, dka, dva, dout, out, P(4), q, ka, va, B, NH, NKV, hs, Tq, 24, Tk, k0a, rope);
    be->attention_gqa_block_bwd(dq, dkb, dvb, dout, out, P(4), q, kb, vb, B, NH, NKV, hs, Tq, 24, Tk, k0b, rope);
}
static void test_attention_gqa_blocks(DType dt, int B, int Tq, int Tk, int NH, int NKV, int hs, int k0a, int k0b,
                                      int rope) {
    Case c;
    case_init(&c, dt, "attention_gqa_block_fwd+bwd[%s,B=%d,Tq=%d@24,Tk=%d@%d,%d,NH=%d,NKV=%d,hs=%d%s]", dtype_name(dt), B,
              Tq, Tk, k0a, k0b, NH, NKV, hs, rope ? ",rope" : "");
    c.B = B, c.T = Tq, c.N = Tk, c.NH = NH, c.OC = NKV, c.C = hs, c.vstart = k0a, c.vlen = k0b, c.flag = rope;
    c.kind = KIND_ATTN;
    c.tc = dt == DT_BF16 && (hs == 64 || hs == 128);
    size_t nq = (size_t)B * Tq * NH * hs, nk = (size_t)2 * B * Tk * NKV * hs;
    add_rand(&c, dt, nq, -1, 1);                       // q
    add_rand(&c, dt, nk, -1, 1);                       // k of both blocks
    add_rand(&c, dt, nk, -1, 1);                       // v
    add_rand(&c, DT_F32, nq, -1, 1);                   // out (fp32 accumulator)
    add_rand(&c, DT_F32, (size_t)B * NH * Tq, -1, 1);  // lse
    add_rand(&c, dt, nq, -1, 1);                       // dout
    add_rand(&c, DT_F32, nq, -1, 1);                   // dq (accumulated onto these values)
    add_rand(&c, DT_F32, nk, -1, 1);                   // dk
    add_rand(&c, DT_F32, nk, -1, 1);                   // dv
    add_out_poisoned(&c, 3, tol_mm(dt));
    add_out_poisoned(&c, 4, tol_mm(dt));
    for (int i = 6; i <= 8; i++) add_out(&c, i, tol_mm(dt));
    run_case(&c, run_attention_gqa_blocks);
}

static void run_residual_fwd(const Backend *be, Case *c, int side) { be->residual_fwd(c->dt, P(0), P(1), P(2), c->n); }
static void test_residual_fwd(DType dt, size_t n) {
    Case c;
    case_init(&c, dt, "residual_fwd[%s,n=%zu]", dtype_name(dt), n);
    c.n = n;
    add_rand(&c, dt, n, -1, 1);
    add_rand(&c, dt, n, -1, 1);
    add_rand(&c, dt, n, -1, 1);
    add_out_poisoned(&c, 0, EXACT);
    run_case(&c, run_residual_fwd);
}

static void run_residual_bwd(const Backend *be, Case *c, int side) { be->residual_bwd(c->dt, P(0), P(1), c->n); }
static void test_residual_bwd(DType dt, size_t n) {
    Case c;
    case_init(&c, dt, "residual_bwd[%s,n=%zu]", dtype_name(dt), n);
    c.n = n;
    add_rand(&c, dt, n, -1, 1);
    add_rand(&c, dt, n, -1, 1);
    add_out(&c, 0, EXACT);
    run_case(&c, run_residual_bwd);
}

// Cross-entropy over a vocabulary slice: logits[N, Vloc] hold columns vstart.. of a padded vocabulary of V
// words, the first vreal of them real; targets are in [0, V).

// huge values in the padding columns (j >= vreal): they must never be counted
static int add_logits(Case *c, DType dt, int N, int vreal, int Vloc) {
    int l = add_rand(c, dt, (size_t)N * Vloc, -3, 3);
    for (int n = 0; n < N; n++)
        for (int j = vreal > 0 ? vreal : 0; j < Vloc; j++) set_val(&c->t[l], (size_t)n * Vloc + j, 1e4f);
    return l;
}

static void run_ce_stats(const Backend *be, Case *c, int side) {
    be->crossentropy_stats(c->dt, P(0), P(1), P(2), P(3), P(4), c->N, c->vstart, c->vlen, c->Vp);
}
static void test_crossentropy_stats(DType dt, int N, int V, int vstart, int vreal, int Vloc) {
    Case c;
    case_init(&c, dt, "crossentropy_stats[%s,N=%d,V=%d,vstart=%d,vreal=%d,Vloc=%d]", dtype_name(dt), N, V, vstart,
              vreal, Vloc);
    c.N = N, c.V = V, c.vstart = vstart, c.vlen = vreal, c.Vp = Vloc;
    add_rand(&c, DT_F32, N, -1, 1); // rowmax
    add_rand(&c, DT_F32, N, -1, 1); // rowsum
    add_rand(&c, DT_F32, N, -1, 1); // target
    add_logits(&c, dt, N, vreal, Vloc);
    add_tokens(&c, N, V);
    add_out_poisoned(&c, 0, EXACT);          // a max does not depend on the order (also -inf with no real column)
    add_out_poisoned(&c, 1, tol_ew(DT_F32)); // fp32 sums in a different order
    add_out_poisoned(&c, 2, EXACT);          // the logit itself, or 0
    run_case(&c, run_ce_stats);
}

static void run_ce_fused(const Backend *be, Case *c, int side) {
    be->crossentropy_fused(c->dt, c->flag ? P(3) : P(4), P(0), P(1), P(2), P(3), P(5), 1.0f / (float)c->N, c->N, c->vlen,
                           c->Vp);
}
static void test_crossentropy_fused(DType dt, int N, int V, int Vloc, int alias) {
    Case c;
    case_init(&c, dt, "crossentropy_fused[%s,N=%d,V=%d,Vloc=%d%s]", dtype_name(dt), N, V, Vloc,
              alias ? ",dlogits=logits" : "");
    c.N = N, c.V = V, c.vlen = V, c.Vp = Vloc, c.flag = alias;
    add_rand(&c, DT_F32, N, -1, 1); // rowmax
    add_rand(&c, DT_F32, N, -1, 1); // rowsum
    add_rand(&c, DT_F32, N, -1, 1); // target
    add_logits(&c, dt, N, V, Vloc);
    add_rand(&c, dt, (size_t)N * Vloc, -1, 1); // dlogits (NaN below unless it aliases the logits)
    add_tokens(&c, N, V);
    add_out_poisoned(&c, 0, EXACT);
    add_out_poisoned(&c, 1, tol_ew(DT_F32));
    add_out_poisoned(&c, 2, EXACT);
    if (alias) add_out(&c, 3, tol_ew(dt));
    else add_out_poisoned(&c, 4, tol_ew(dt));
    run_case(&c, run_ce_fused);
}

static void run_ce_bwd(const Backend *be, Case *c, int side) {
    be->crossentropy_bwd(c->dt, c->flag ? P(1) : P(0), P(1), P(2), P(3), P(4), 1.0f / (float)c->N, c->N, c->vstart,
                         c->vlen, c->Vp);
}
// from_stats: gmax/gsum are this single slice's own statistics (the whole vocabulary when vstart is 0 and
// vreal is V), computed by the CPU reference; otherwise arbitrary positive values.
static void test_crossentropy_bwd(DType dt, int N, int V, int vstart, int vreal, int Vloc, int alias, int from_stats) {
    Case c;
    case_init(&c, dt, "crossentropy_bwd[%s,N=%d,V=%d,vstart=%d,vreal=%d,Vloc=%d,%s%s]", dtype_name(dt), N, V, vstart,
              vreal, Vloc, from_stats ? "stats" : "arbitrary", alias ? ",dlogits=logits" : "");
    c.N = N, c.V = V, c.vstart = vstart, c.vlen = vreal, c.Vp = Vloc, c.flag = alias;
    add_rand(&c, dt, (size_t)N * Vloc, -1, 1); // dlogits: random, so the padding must be zeroed
    int l = add_logits(&c, dt, N, vreal, Vloc);
    int tg = add_tokens(&c, N, V);
    int gm = add_rand(&c, DT_F32, N, -1, 4);
    int gs = add_rand(&c, DT_F32, N, 0.5f, 200);
    if (from_stats) { // the CPU backend's memory is host memory
        float *target = xmalloc(sizeof(float) * (size_t)N);
        CPU->crossentropy_stats(dt, (float *)c.t[gm].init, (float *)c.t[gs].init, target, c.t[l].init,
                                (const int32_t *)c.t[tg].init, N, vstart, vreal, Vloc);
        free(target);
    }
    if (alias) add_out(&c, 1, tol_ew(dt));
    else add_out_poisoned(&c, 0, tol_ew(dt)); // the padding too must be written (zeros)
    run_case(&c, run_ce_bwd);
}

// three segments of the five arrays (the middle one without decay, the last one short)
static void run_adamw(const Backend *be, Case *c, int side) {
    float b1 = 0.9f, b2 = 0.95f;
    size_t cut[4] = { 0, c->n / 2, c->n - 7, c->n }, es = dtype_size(c->dt);
    AdamWSegment segs[3];
    for (int s = 0; s < 3; s++)
        segs[s] = (AdamWSegment){ (float *)P(0) + cut[s], c->flag ? (char *)P(1) + cut[s] * es : NULL,
                                  (const float *)P(2) + cut[s], (float *)P(3) + cut[s], (float *)P(4) + cut[s],
                                  cut[s + 1] - cut[s], s == 1 ? 0.0f : 0.1f };
    be->adamw(c->dt, segs, 3, 1e-3f, b1, b2, 1e-8f, 1.0f - b1 * b1 * b1, 1.0f - b2 * b2 * b2, 0.5f);
}
static void test_adamw(DType dt, size_t n, int working) {
    Case c;
    case_init(&c, dt, "adamw[%s,n=%zu,%s]", dtype_name(dt), n, working ? "working" : "noworking");
    c.n = n, c.flag = working;
    add_rand(&c, DT_F32, n, -1, 1);       // master
    add_rand(&c, dt, n, -1, 1);           // working
    add_rand(&c, DT_F32, n, -1, 1);       // grad
    add_rand(&c, DT_F32, n, -0.1f, 0.1f); // m
    add_rand(&c, DT_F32, n, 0, 0.01f);    // v
    add_out(&c, 0, tol_ew(DT_F32));
    add_out(&c, 1, tol_ew(dt));
    add_out(&c, 2, EXACT);
    add_out(&c, 3, tol_ew(DT_F32));
    add_out(&c, 4, tol_ew(DT_F32));
    run_case(&c, run_adamw);
}

static void run_cast(const Backend *be, Case *c, int side) {
    be->cast(P(0), c->t[0].dt, P(1), c->t[1].dt, c->n);
}
static void test_cast(DType dst_dt, DType src_dt, size_t n) {
    Case c;
    case_init(&c, dst_dt, "cast[%s<-%s,n=%zu]", dtype_name(dst_dt), dtype_name(src_dt), n);
    c.n = n;
    add_rand(&c, dst_dt, n, -1, 1);
    int s = add_rand(&c, src_dt, n, -100, 100);
    // special values: rounding ties, carries into the exponent, overflow to inf, infinities, zeros,
    // subnormals and NaNs (the signalling one only where a conversion happens)
    static const uint32_t f32_special[] = { 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x3fffffffu,
                                            0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
                                            0x00000001u, 0x807fffffu, 0x7fc00000u, 0xffc12345u, 0x7f800001u };
    static const uint16_t bf16_special[] = { 0x3f80, 0x7f7f, 0x7f80, 0xff80, 0x0000, 0x8000,
                                             0x0001, 0x807f, 0x7fc0, 0xffc1, 0x7f81 };
    if (src_dt == DT_F32) {
        size_t ns = sizeof f32_special / sizeof f32_special[0];
        if (dst_dt == DT_F32) ns--; // a plain copy may quiet a signalling NaN on some CPUs
        for (size_t i = 0; i < ns && i < n; i++) memcpy(c.t[s].init + 4 * i, &f32_special[i], 4);
    } else {
        size_t ns = sizeof bf16_special / sizeof bf16_special[0];
        for (size_t i = 0; i < ns && i < n; i++) memcpy(c.t[s].init + 2 * i, &bf16_special[i], 2);
    }
    add_out_poisoned(&c, 0, EXACT);
    run_case(&c, run_cast);
}

static void run_cast_rows(const Backend *be, Case *c, int side) {
    be->cast_rows(P(0), c->t[0].dt, (size_t)c->flag, P(1), c->t[1].dt, 3 * (size_t)c->flag, c->n, (size_t)c->flag - 1);
}
// rows of n - 1 elements of a source three times as wide into rows of n: the last element of each row stays
static void test_cast_rows(DType dst_dt, DType src_dt, size_t rows, int n) {
    Case c;
    case_init(&c, dst_dt, "cast_rows[%s<-%s,rows=%zu,n=%d]", dtype_name(dst_dt), dtype_name(src_dt), rows, n);
    c.n = rows, c.flag = n;
    add_rand(&c, dst_dt, rows * n, -1, 1);
    add_rand(&c, src_dt, rows * 3 * n, -100, 100);
    add_out(&c, 0, EXACT);
    run_case(&c, run_cast_rows);
}

static void test_sumsq(size_t n) {
    float *h = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = frand(-3, 3);
    float *dc = CPU->alloc(sizeof(float) * n), *dg = GPU->alloc(sizeof(float) * n);
    if (!dc || !dg) die("out of memory for sumsq test");
    CPU->to_device(dc, h, sizeof(float) * n);
    GPU->to_device(dg, h, sizeof(float) * n);
    double a = GPU->sumsq(dg, n), b = CPU->sumsq(dc, n), a2 = GPU->sumsq(dg, n);
    char name[100], details[200] = "";
    snprintf(name, sizeof name, "sumsq[n=%zu]", n);
    double rel = b != 0 ? fabs(a - b) / fabs(b) : fabs(a - b);
    if (!(rel <= 1e-12)) snprintf(details, sizeof details, "gpu %.17g cpu %.17g rel %.3g", a, b, rel);
    report(rel <= 1e-12, name, details);
    snprintf(name, sizeof name, "determinism:sumsq[n=%zu]", n);
    snprintf(details, sizeof details, "%.17g then %.17g", a, a2);
    report(memcmp(&a, &a2, sizeof a) == 0, name, details);
    CPU->free(dc);
    GPU->free(dg);
    free(h);
}

// sumsq_acc into a device double: 1.25 + two tensors' sums, bitwise what adding sumsq's results gives
static void test_sumsq_acc(void) {
    size_t n1 = (size_t)65536 * 2 + 5, n2 = 999;
    float *h = xmalloc(sizeof(float) * (n1 + n2));
    for (size_t i = 0; i < n1 + n2; i++) h[i] = frand(-3, 3);
    float *x = GPU->alloc(sizeof(float) * (n1 + n2));
    double *acc = GPU->alloc(sizeof(double)), start = 1.25, got = 0;
    if (!x || !acc) die("out of memory for sumsq_acc test");
    GPU->to_device(x, h, sizeof(float) * (n1 + n2));
    GPU->to_device(acc, &start, sizeof start);
    GPU->sumsq_acc(acc, x, n1);
    GPU->sumsq_acc(acc, x + n1, n2);
    GPU->to_host(&got, acc, sizeof got);
    double want = start;
    want += GPU->sumsq(x, n1);
    want += GPU->sumsq(x + n1, n2);
    char details[200];
    snprintf(details, sizeof details, "device %.17g, host %.17g", got, want);
    report(memcmp(&got, &want, sizeof got) == 0, "sumsq_acc adds what sumsq returns, bitwise", details);
    GPU->free(x);
    GPU->free(acc);
    free(h);
}

// Work ordered across the two streams by events alone: compute makes y = (2 + K)·x, communication reads
// it (after waiting for the compute stream's event) into z = y + x, compute reads z (after waiting for
// communication) into w = z + x. Small integers keep every sum exact: w must be (K + 4)·x. Without the
// waits the streams would race (the result would depend on timing, not on this test).
static void test_streams(size_t n) {
    const int K = 40;
    float *h = xmalloc(sizeof(float) * n), *back = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = (float)((int)(next_u64() % 201) - 100);
    float *x = GPU->alloc(sizeof(float) * n), *y = GPU->alloc(sizeof(float) * n), *z = GPU->alloc(sizeof(float) * n);
    if (!x || !y || !z) die("out of memory for the stream test");
    BackendEvent *e = GPU->event_create(), *f = GPU->event_create();
    GPU->to_device(x, h, sizeof(float) * n);
    GPU->residual_fwd(DT_F32, y, x, x, n);
    for (int i = 0; i < K; i++) GPU->residual_fwd(DT_F32, y, y, x, n);
    GPU->event_record(e, STREAM_COMPUTE);
    GPU->stream_wait(STREAM_COMM, e);
    StreamId prev = GPU->set_stream(STREAM_COMM);
    GPU->residual_fwd(DT_F32, z, y, x, n);
    GPU->event_record(f, STREAM_COMM);
    GPU->set_stream(prev);
    GPU->stream_wait(STREAM_COMPUTE, f);
    GPU->residual_fwd(DT_F32, y, z, x, n);
    GPU->to_host(back, y, sizeof(float) * n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += back[i] != (float)(K + 4) * h[i];
    char details[100];
    snprintf(details, sizeof details, "%zu of %zu elements wrong", bad, n);
    report(bad == 0 && prev == STREAM_COMPUTE, "streams: compute -> communication -> compute through events", details);
    GPU->event_sync(f);
    report(GPU->event_done(f) == 1 && GPU->event_done(e) == 1 && e->records == 1 && f->stream == STREAM_COMM,
           "streams: events done after event_sync, their bookkeeping", "");
    // polling an event that has not passed (cudaErrorNotReady, which the runtime leaves as the last
    // error) must not make the next launch's check fail
    GPU->residual_fwd(DT_F32, z, y, x, n);
    GPU->event_record(e, STREAM_COMPUTE);
    int polls = 0;
    while (!GPU->event_done(e)) polls++;
    GPU->residual_fwd(DT_F32, y, z, x, n);
    GPU->to_host(back, y, sizeof(float) * n);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += back[i] != (float)(K + 6) * h[i];
    snprintf(details, sizeof details, "%zu of %zu elements wrong after %d not-ready polls", bad, n, polls);
    report(bad == 0, "streams: a launch after polling a pending event", details);
    GPU->event_destroy(e);
    GPU->event_destroy(f);
    GPU->free(x);
    GPU->free(y);
    GPU->free(z);
    free(h);
    free(back);
}

// The scratch pool: a step's worth of ops run twice; the second run must not grow any scratch (a step
// allocates nothing once the first has run).
static void step_ops(DType dt, void **b, int N, int C, int NH, int T) {
    int B = N / T;
    GPU->matmul_fwd(dt, b[0], b[1], b[2], b[3], b[4], N, C, 4 * C);
    GPU->matmul_bwd(dt, b[5], (float *)b[6], (float *)b[7], b[0], b[2], b[3], b[1], N, C, 4 * C);
    GPU->attention_fwd(dt, b[8], (float *)b[9], b[10], B, T, C, NH);
    GPU->attention_bwd(dt, b[11], b[8], b[10], b[8], (float *)b[9], B, T, C, NH);
    GPU->layernorm_bwd(dt, b[5], (float *)b[6], (float *)b[7], b[2], b[2], b[4], (float *)b[9], (float *)b[9], N, C);
    AdamWSegment seg = { (float *)b[6], NULL, (const float *)b[6], (float *)b[12], (float *)b[12] + (size_t)4 * C * C,
                         (size_t)C * 4 * C, 0.1f };
    GPU->adamw(dt, &seg, 1, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 1.0f);
    (void)GPU->sumsq((float *)b[6], (size_t)4 * C * C);
}
static void test_scratch_reuse(DType dt, int N, int C, int NH, int T) {
    size_t es = dtype_size(dt), sizes[13] = { N * 4 * C * es, N * 4 * C * es, N * C * es, 4 * C * C * es, 4 * C * es,
                                               N * C * es, 4 * C * C * 4, 4 * C * 4, N * C * es, (size_t)N * NH * 4 + N * 8,
                                               N * 3 * C * es, N * 3 * C * es, 2 * 4 * C * C * 4 };
    void *b[13];
    for (int i = 0; i < 13; i++) {
        b[i] = GPU->alloc(sizes[i]);
        if (!b[i]) die("out of memory for the scratch test");
    }
    step_ops(dt, b, N, C, NH, T);
    GPU->sync();
    long long g1 = cuda_scratch_grows();
    size_t s1 = GPU->scratch_bytes();
    step_ops(dt, b, N, C, NH, T);
    GPU->sync();
    char name[100], details[200];
    snprintf(name, sizeof name, "scratch: a repeated step allocates nothing (%s)", dtype_name(dt));
    snprintf(details, sizeof details, "%lld growths in the second step; scratch %zu -> %zu bytes",
             cuda_scratch_grows() - g1, s1, GPU->scratch_bytes());
    report(cuda_scratch_grows() == g1 && GPU->scratch_bytes() == s1 && s1 > 0, name, details);
    for (int i = 0; i < 13; i++) GPU->free(b[i]);
}

static void test_memory(void) {
    size_t n = 1000003;
    unsigned char *h = xmalloc(n), *back = xmalloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(next_u64() & 0xff);
    unsigned char *a = GPU->alloc(n), *b = GPU->alloc(n);
    void *z = GPU->alloc(0);
    report(a && b && z, "memory:alloc", "alloc returned NULL");
    if (!a || !b || !z) return;
    GPU->to_host(back, a, n);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= back[i] == 0;
    report(zero, "memory:alloc_zeroed", "fresh allocation is not zero");
    GPU->to_device(a, h, n);
    GPU->to_host(back, a, n);
    report(memcmp(h, back, n) == 0, "memory:roundtrip", "to_device/to_host changed the bytes");
    GPU->copy(b, a, n);
    GPU->to_host(back, b, n);
    report(memcmp(h, back, n) == 0, "memory:copy", "copy changed the bytes");
    GPU->zero(b + 100, 1000);
    GPU->sync();
    GPU->to_host(back, b, n);
    memset(h + 100, 0, 1000);
    report(memcmp(h, back, n) == 0, "memory:zero", "zero cleared the wrong bytes");
    // uploads through the pinned staging ring: more small copies in a row than it has slots, no waits
    enum { NUP = 11 };
    unsigned char *ups[NUP];
    int same = 1;
    for (int i = 0; i < NUP; i++) {
        ups[i] = GPU->alloc(4000 + i);
        if (!ups[i]) die("out of memory for the upload test");
        GPU->to_device(ups[i], h + 1000 * i, 4000 + i);
    }
    for (int i = 0; i < NUP; i++) {
        GPU->to_host(back, ups[i], 4000 + i);
        same &= memcmp(back, h + 1000 * i, 4000 + i) == 0;
        GPU->free(ups[i]);
    }
    report(same, "memory:staged_uploads", "a small upload arrived wrong");
    GPU->set_threads(3);
    GPU->free(a);
    GPU->free(b);
    GPU->free(z);
    GPU->free(NULL);
    free(h);
    free(back);
}

// --fault: one kernel on a bad pointer. With LLM4D_CUDA_SYNC=1 the error line names residual_fwd_kernel;
// without, the next waiting call reports the failure and says how to name the kernel.
static int fault(void) {
    GPU = backend_cuda();
    void *bad = (void *)(uintptr_t)0x1000;
    GPU->residual_fwd(DT_F32, bad, bad, bad, (size_t)1 << 20);
    GPU->sync();
    printf("no error reported\n");
    return 0;
}


// --small: every op and path on shapes small enough for the emulated GPU (test/run.sh runs it there):
// ragged in every dimension, split-K, every epilogue, both operand layouts, head sizes 64 and 128,
// context-parallel blocks, T off the tiles.
static void run_small(void) {
    test_streams(3000);
    test_scratch_reuse(DT_BF16, 64, 64, 1, 64);
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DT_BF16 : DT_F32;
        test_encoder_fwd(dt, 2, 7, 48, 100, 30, 45, 1);
        test_encoder_fwd(dt, 2, 7, 48, 100, 0, 100, 0);
        test_encoder_bwd(dt, 2, 7, 48, 100, 0, 100, 1);
        test_encoder_bwd(dt, 4, 30, 40, 200, 70, 90, 0);
        test_layernorm_fwd(dt, 9, 40);
        test_residual_layernorm_fwd(dt, 9, 40, 1);
        test_layernorm_bwd(dt, 33, 72);
        test_matmul_fwd(dt, 17, 40, 13, 1, 0);   // SIMT only (leading dimensions off 8)
        test_matmul_fwd(dt, 130, 64, 136, 1, 1); // ragged M and N, bias + GELU
        test_matmul_fwd(dt, 1, 64, 8, 0, 0);
        test_matmul_bwd(dt, 70, 48, 40, 1, 1);   // GELU's derivative fused
        test_matmul_bwd(dt, 600, 16, 24, 1, 0);  // dweight: one output tile, long K: split-K
        test_gelu_fwd(dt, 1003);
        test_gelu_rebuild(dt, 17, 16, 24);
        test_attention_fwd(dt, 1, 9, 17, 1);   // simple kernels only
        test_attention_bwd(dt, 1, 9, 17, 1);
        test_attention_fwd(dt, 1, 70, 64, 1);  // head size 64, T off the tiles
        test_attention_bwd(dt, 1, 70, 64, 1);
        test_attention_fwd(dt, 1, 33, 256, 2); // head size 128
        test_attention_bwd(dt, 1, 33, 256, 2);
        test_attention_blocks(dt, 1, 20, 30, 64, 1, 10, 0);
        test_attention_blocks(dt, 1, 16, 16, 128, 1, 24, 40);
        test_rmsnorm_fwd(dt, 9, 40);
        test_residual_rmsnorm_fwd(dt, 9, 40, 1);
        test_rmsnorm_bwd(dt, 33, 72);
        test_rope(dt, 2, 7, 3, 64, 1, 0, 1);
        test_rope(dt, 1, 9, 2, 10, 0, 24, 0);  // half a head of 5 channels
        test_swiglu(dt, 5, 37);
        test_attention_gqa(dt, 1, 9, 3, 1, 16, 1);   // simple kernels only
        test_attention_gqa(dt, 1, 17, 4, 2, 64, 1);  // head size 64: two kv heads of two query heads, RoPE
        test_attention_gqa(dt, 1, 9, 2, 1, 128, 0);  // head size 128, no RoPE
        test_attention_gqa_blocks(dt, 1, 12, 16, 2, 1, 64, 10, 0, 1); // keys 10..25 partly after queries 24..35
        test_residual_fwd(dt, 1003);
        test_residual_bwd(dt, 1003);
        test_crossentropy_stats(dt, 5, 100, 30, 50, 128);
        test_crossentropy_fused(dt, 5, 100, 128, 1);
        test_crossentropy_bwd(dt, 5, 100, 30, 50, 128, 0, 1);
        test_crossentropy_bwd(dt, 5, 100, 30, 50, 128, 1, 0);
        test_adamw(dt, 1003, 1);
        test_adamw(dt, 1003, 0);
    }
    test_cast(DT_BF16, DT_F32, 1003);
    test_cast(DT_F32, DT_BF16, 1003);
    test_cast_rows(DT_BF16, DT_F32, 11, 96);
    test_cast_rows(DT_F32, DT_F32, 7, 13);
}

int main(int argc, char **argv) {
    if (cuda_device_count() <= 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--fault")) return fault();
    const int small = argc > 1 && !strcmp(argv[1], "--small");
    if (argc > 1 && !small) die("unknown argument %s (--small or --fault)", argv[1]);
    CPU = backend_cpu();
    GPU = backend_cuda();
    if (!GPU) die("backend_cuda() returned NULL");
    cuda_use_device(0);
    set_path(&PLAIN_PATHS[0]);
    printf("backend %s vs %s; tensor-core GEMM here: %s\n", GPU->name, CPU->name,
           gemm_kernel_name((GemmKernel)cuda_gemm_kernel()));

    test_memory();
    test_sumsq(0);
    test_sumsq(1000);
    test_sumsq((size_t)65536 * 3 + 17);
    test_sumsq_acc();
    if (small) {
        run_small();
        printf("%d passed, %d failed\n", npass, nfail);
        return nfail ? 1 : 0;
    }
    test_streams((size_t)1 << 22);
    test_scratch_reuse(DT_BF16, 512, 128, 2, 256);
    test_scratch_reuse(DT_F32, 512, 128, 2, 256);

    for (int d = 0; d < 2; d++) {
        DType dt = d ? DT_BF16 : DT_F32;
        test_encoder_fwd(dt, 2, 37, 48, 100, 0, 100, 1);
        test_encoder_fwd(dt, 2, 37, 48, 100, 30, 45, 1); // tokens on both sides of the slice
        test_encoder_fwd(dt, 2, 37, 48, 100, 30, 45, 0);
        test_encoder_fwd(dt, 2, 37, 48, 100, 0, 100, 0);
        test_encoder_bwd(dt, 2, 37, 48, 100, 0, 100, 1);
        test_encoder_bwd(dt, 4, 300, 40, 7, 0, 7, 1); // many repeated tokens, more tokens than one shared tile
        test_encoder_bwd(dt, 2, 37, 48, 100, 30, 45, 1);
        test_encoder_bwd(dt, 2, 37, 48, 100, 30, 45, 0);
        test_encoder_bwd(dt, 4, 300, 40, 200, 70, 90, 0); // slice rows spanning more than ENC_BUCKETS

        test_layernorm_fwd(dt, 67, 40);
        test_layernorm_fwd(dt, 5, 800);
        test_residual_layernorm_fwd(dt, 67, 40, 0);
        test_residual_layernorm_fwd(dt, 5, 800, 1);
        test_layernorm_bwd(dt, 67, 40);
        test_layernorm_bwd(dt, 600, 72); // several row chunks

        // shapes the tensor-core GEMM refuses (leading dimensions not multiples of 8): SIMT on every path
        test_matmul_fwd(dt, 67, 40, 131, 1, 0);
        test_matmul_fwd(dt, 67, 40, 131, 0, 0);
        test_matmul_fwd(dt, 1, 5, 3, 1, 0);
        test_matmul_fwd(dt, 130, 1000, 70, 1, 0);
        test_matmul_fwd(dt, 67, 40, 131, 1, 1);
        test_matmul_bwd(dt, 67, 40, 131, 1, 0);
        test_matmul_bwd(dt, 67, 40, 131, 0, 0);
        test_matmul_bwd(dt, 67, 40, 131, 1, 1);
        // shapes it takes: ragged rows and edge tiles in every dimension, bias, GELU and its derivative
        // fused, split-K (few output tiles, long K) in the weight gradients, d12's widths
        test_matmul_fwd(dt, 300, 200, 264, 1, 0);
        test_matmul_fwd(dt, 1, 64, 8, 1, 0);
        test_matmul_fwd(dt, 130, 1000, 72, 1, 1);
        test_matmul_fwd(dt, 333, 768, 2304, 1, 0);
        test_matmul_fwd(dt, 257, 768, 3072, 1, 1);
        test_matmul_bwd(dt, 600, 96, 144, 1, 0);
        test_matmul_bwd(dt, 300, 200, 264, 1, 0);
        test_matmul_bwd(dt, 600, 96, 704, 1, 1);
        test_matmul_bwd(dt, 4100, 128, 256, 1, 0);  // dweight: 2 output tiles, K = 4100: split-K
        test_matmul_bwd(dt, 4100, 128, 256, 0, 0);
        test_matmul_bwd(dt, 515, 3072, 768, 1, 1);  // the MLP's second matmul of d12, GELU's derivative fused
        test_gelu_fwd(dt, 100003);
        test_gelu_rebuild(dt, 67, 40, 131);
        test_gelu_rebuild(dt, 257, 768, 3072); // d12's MLP on the tensor-core GEMMs

        // head sizes the flash kernels do not take (simple kernels on both paths)
        test_attention_fwd(dt, 2, 37, 48, 3);
        test_attention_bwd(dt, 2, 37, 48, 3);
        test_attention_fwd(dt, 2, 200, 96, 4);
        test_attention_bwd(dt, 2, 200, 96, 4);
        test_attention_fwd(dt, 3, 33, 17, 1); // one head of 17 channels
        test_attention_bwd(dt, 3, 33, 17, 1);
        // head sizes 64 and 128: T off every tile size, one token, several query and key blocks
        test_attention_fwd(dt, 1, 150, 64, 1);
        test_attention_bwd(dt, 1, 150, 64, 1);
        test_attention_fwd(dt, 2, 1, 128, 2);
        test_attention_bwd(dt, 2, 1, 128, 2);
        test_attention_fwd(dt, 2, 301, 256, 4);
        test_attention_bwd(dt, 2, 301, 256, 4);
        test_attention_fwd(dt, 1, 333, 256, 2);
        test_attention_bwd(dt, 1, 333, 256, 2);
        test_attention_fwd(dt, 1, 1024, 128, 1);
        test_attention_bwd(dt, 1, 1024, 128, 1);
        // context-parallel blocks (queries at positions 24..): zigzag, keys partly after the queries,
        // blocks merged in any order, and the same with head sizes 64 and 128
        test_attention_blocks(dt, 2, 8, 8, 48, 3, 0, 24);
        test_attention_blocks(dt, 1, 37, 40, 64, 2, 30, 0);
        test_attention_blocks(dt, 2, 70, 90, 128, 2, 40, 0);
        test_attention_blocks(dt, 1, 130, 100, 256, 2, 0, 60);
        test_attention_blocks(dt, 1, 64, 64, 128, 1, 24, 88); // the second block sees nothing: lse stays

        test_rmsnorm_fwd(dt, 67, 40);
        test_rmsnorm_fwd(dt, 5, 2048);
        test_residual_rmsnorm_fwd(dt, 67, 40, 0);
        test_residual_rmsnorm_fwd(dt, 5, 800, 1);
        test_rmsnorm_bwd(dt, 67, 40);
        test_rmsnorm_bwd(dt, 600, 72); // several row chunks
        test_rope(dt, 2, 37, 8, 64, 1, 0, 1);
        test_rope(dt, 2, 37, 8, 128, 0, 1000, 0);
        test_rope(dt, 1, 37, 3, 10, 0, 24, 1);
        test_swiglu(dt, 67, 1000);
        test_swiglu(dt, 3, 8192);
        // grouped-query attention: groups of 1, 2 and 4, with and without RoPE, the simple and the flash
        // kernels, whole sequences and context-parallel blocks
        test_attention_gqa(dt, 2, 37, 6, 2, 48, 1);
        test_attention_gqa(dt, 2, 150, 8, 2, 64, 1);
        test_attention_gqa(dt, 1, 301, 4, 1, 128, 1);
        test_attention_gqa(dt, 2, 70, 4, 4, 64, 1);
        test_attention_gqa(dt, 1, 130, 8, 2, 64, 0);
        test_attention_gqa_blocks(dt, 2, 70, 90, 4, 2, 128, 40, 0, 1);
        test_attention_gqa_blocks(dt, 1, 64, 64, 4, 1, 64, 24, 88, 1);

        test_residual_fwd(dt, 100003);
        test_residual_bwd(dt, 100003);

        test_crossentropy_stats(dt, 67, 100, 0, 100, 128);
        test_crossentropy_stats(dt, 4, 5000, 0, 5000, 5056);
        test_crossentropy_stats(dt, 67, 300, 100, 90, 128); // targets before, inside and after the slice
        test_crossentropy_stats(dt, 5, 9000, 2528, 2472, 2528);
        test_crossentropy_stats(dt, 67, 300, 256, 0, 128);  // a slice made only of padding
        test_crossentropy_fused(dt, 67, 100, 128, 0);
        test_crossentropy_fused(dt, 4, 5000, 5056, 1);
        test_crossentropy_bwd(dt, 67, 100, 0, 100, 128, 0, 1);
        test_crossentropy_bwd(dt, 67, 100, 0, 100, 128, 1, 1);
        test_crossentropy_bwd(dt, 4, 5000, 0, 5000, 5056, 0, 1);
        test_crossentropy_bwd(dt, 67, 300, 100, 90, 128, 0, 1);
        test_crossentropy_bwd(dt, 67, 300, 100, 90, 128, 0, 0);
        test_crossentropy_bwd(dt, 67, 300, 100, 90, 128, 1, 0);
        test_crossentropy_bwd(dt, 5, 9000, 2528, 2472, 2528, 0, 0);
        test_crossentropy_bwd(dt, 67, 300, 256, 0, 128, 0, 0);
        test_crossentropy_bwd(dt, 67, 300, 256, 0, 128, 1, 0);

        test_adamw(dt, 100003, 1);
        test_adamw(dt, 100003, 0);
    }
    test_cast(DT_BF16, DT_F32, 100003);
    test_cast(DT_F32, DT_BF16, 100003);
    test_cast(DT_F32, DT_F32, 100003);
    test_cast(DT_BF16, DT_BF16, 100003);
    test_cast_rows(DT_BF16, DT_F32, 1001, 96);
    test_cast_rows(DT_F32, DT_BF16, 1001, 96);
    test_cast_rows(DT_F32, DT_F32, 77, 13);
    test_cast_rows(DT_BF16, DT_BF16, 77, 13);

    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}

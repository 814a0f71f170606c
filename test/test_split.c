// test_split.c: the backward in two halves (model.h: gpt2_backward_input_chunk, B, then
// gpt2_backward_weight_chunk, W) against the fused backward (gpt2_backward_chunk), bitwise: the
// parameter gradients after two micro-batches and every input gradient a stage sends back. The split
// runs in two zero-bubble orders: F0 F1 B0 B1 W0 W1 (every W after both Bs) and F0 B0 F1 B1 W0 W1.
// Cases: recompute none, selective and full; a whole model, the first and the last of two pipeline
// stages, each with one or two chunks (interleaved), zb-v's first stage (two chunks in a V, both ends of
// the model); fp32 and bf16. With --nproc 2: tensor parallelism (with and without sequence parallelism)
// and context parallelism (ring attention) over the two ranks. On a stage holding the head (not under
// SP), also that B leaves the head's weight gradient untouched until gpt2_backward_head_weight.
// Usage: test_split [--nproc 2]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives.h"
#include "launch.h"
#include "common.h"
#include "model.h"
#include "schedule.h"

static uint64_t rng_state;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

// n random values of type dt into device buffer dst
static void fill(const GPT2 *m, void *dst, size_t n) {
    if (m->dt == DT_F32) {
        float *h = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) h[i] = 0.01f * frand();
        m->be->to_device(dst, h, n * 4);
        free(h);
    } else {
        uint16_t *h = xmalloc(n * 2);
        for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(0.01f * frand());
        m->be->to_device(dst, h, n * 2);
        free(h);
    }
}

typedef struct {
    int recompute, pp_rank, pp, V, tp, sp, cp, zbv; // zbv: chunks in a V (zb-v), the head on stage 0
    DType dt;
} Case;

enum { M = 2, B = 2, T = 16 };

// The LM head's weight gradient (a stage holding the head), host bytes into dst.
static void head_grad(const GPT2 *m, unsigned char *dst) {
    const float *g = m->head_wte_grad ? m->head_wte_grad : gpt2_grad(m, m->head_k, 0); // (both ends on one stage)
    m->be->to_host(dst, g, m->param_sizes[m->head_k] * sizeof(float));
}

// On a stage holding the LM head, split: the B passes whose head weight gradient was checked, and those
// that added it before gpt2_backward_head_weight (B's input gradient sent first; model.h).
typedef struct {
    int checked, early;
} HeadWeight;

// Runs two micro-batches in `order` (0: fused backward; 1: F0 F1 B0 B1 W0 W1; 2: F0 B0 F1 B1 W0 W1) and
// returns the gradients followed by the input gradients sent back (host bytes, *n of them).
static unsigned char *run(const Case *k, Comm *world, Comm *cp_grad, int order, size_t *n, HeadWeight *hw) {
    GPT2Config cfg = gpt2_shape(NULL, 4, 32, 4, 256, 0, T * k->cp);
    Layout lay; // one stage of the pipeline, alone (its neighbours' tensors are drawn at random)
    memset(&lay, 0, sizeof lay);
    lay.nranks = comm_size(world), lay.rank = comm_rank(world), lay.lead = lay.rank == 0;
    lay.dp = lay.replicas = (Axis){ 1, 0, NULL };
    lay.tp = (Axis){ k->tp, k->tp > 1 ? comm_rank(world) : 0, k->tp > 1 ? world : NULL };
    lay.cp = (Axis){ k->cp, k->cp > 1 ? comm_rank(world) : 0, k->cp > 1 ? world : NULL };
    lay.pp = (Axis){ k->pp, k->pp_rank, NULL };
    lay.cp_grad = k->cp > 1 ? cp_grad : NULL;
    lay.sp = k->sp, lay.recompute = k->recompute, lay.B = B, lay.T = T * k->cp, lay.accum = M;
    lay.chunks = k->V, lay.nslots = M;
    if (k->zbv) lay.schedule = SCHED_ZBV;
    int per = 4 / (k->pp * k->V); // blocks per chunk; chunk c of stage s is global chunk c·pp + s (zb-v: s, 2pp-1-s)
    for (int c = 0; c < k->V; c++)
        lay.chunk_first[c] = (k->zbv && c ? 2 * k->pp - 1 - k->pp_rank : c * k->pp + k->pp_rank) * per, lay.chunk_len[c] = per;
    StepTimes times;
    memset(&times, 0, sizeof times);
    GPT2 m;
    gpt2_build(&m, &cfg, k->dt, backend_cpu(), &lay, &times, 1, 1);
    float *full = gpt2_init_params(&cfg, 7), *local = xmalloc(sizeof(float) * m.num_params);
    gpt2_full_to_local(&m, full, local);
    gpt2_upload_params(&m, local);
    gpt2_zero_grad(&m);
    int32_t tokens[M * B * T], targets[M * B * T];
    for (int i = 0; i < M * B * T; i++) tokens[i] = (i * 37 + 11) % 256, targets[i] = (i * 53 + 5) % 256;
    size_t sbytes = gpt2_stage_bytes(&m, B, T), gbytes = m.num_params * sizeof(float);
    int sends = 0;
    for (int c = 0; c < k->V; c++) sends += !(m.first && c == 0);
    *n = gbytes + (size_t)M * sends * sbytes;
    unsigned char *out = xcalloc(*n, 1), *sent = out + gbytes;
    float dloss = 1.0f / (M * B * T * k->cp);
    size_t selems = sbytes / dtype_size(k->dt);
    // the same random stage inputs and gradients in every order: drawn per (micro-batch, chunk)
    uint64_t seed0 = 12345 + (uint64_t)comm_rank(world) * 1000003;
    size_t hbytes = m.last ? m.param_sizes[m.head_k] * sizeof(float) : 0;
    unsigned char *hbefore = xmalloc(hbytes + 1), *hafter = xmalloc(hbytes + 1), *hlast = xmalloc(hbytes + 1);
#define FWD(mb)                                                                                            \
    do {                                                                                                   \
        gpt2_use_slot(&m, mb);                                                                             \
        for (int c = 0; c < k->V; c++) {                                                                   \
            rng_state = seed0 + (uint64_t)(mb) * 97 + (uint64_t)c;                                         \
            if (!(m.first && c == 0)) fill(&m, gpt2_stage_input(&m, c), selems);                            \
            gpt2_forward_chunk(&m, c, tokens + (mb) * B * T, targets + (mb) * B * T, B, T, dloss);         \
        }                                                                                                  \
    } while (0)
#define BWD(mb, split)                                                                                     \
    do {                                                                                                   \
        gpt2_use_slot(&m, mb);                                                                             \
        for (int c = k->V - 1, s = sends - 1; c >= 0; c--) {                                               \
            rng_state = seed0 + 5000 + (uint64_t)(mb) * 97 + (uint64_t)c;                                  \
            if (!(m.last && c == k->V - 1)) fill(&m, gpt2_stage_grad(&m), selems);                          \
            int head_now = split && m.last && (!m.first || k->pp > 1) && c == k->V - 1 && !k->sp; /* model.h */ \
            if (head_now) head_grad(&m, hbefore);                                                          \
            if (split) gpt2_backward_input_chunk(&m, c, mb, dloss);                                        \
            else gpt2_backward_chunk(&m, c, dloss);                                                        \
            if (!(m.first && c == 0)) m.be->to_host(sent + ((size_t)(mb) * sends + s--) * sbytes, gpt2_stage_grad(&m), sbytes); \
            if (head_now) head_grad(&m, hafter);                                                           \
            if (split) gpt2_backward_head_weight(&m);                                                      \
            if (head_now) { /* the head's weight gradient waits until B's input gradient has been sent */  \
                head_grad(&m, hlast);                                                                      \
                hw->checked++;                                                                             \
                if (memcmp(hbefore, hafter, hbytes) || !memcmp(hafter, hlast, hbytes)) hw->early++;        \
            }                                                                                              \
        }                                                                                                  \
    } while (0)
#define WGT(mb)                                                                                            \
    for (int c = k->V - 1; c >= 0; c--) gpt2_backward_weight_chunk(&m, c, mb)
    if (order == 0) {
        FWD(0);
        BWD(0, 0);
        FWD(1);
        BWD(1, 0);
    } else if (order == 1) {
        FWD(0);
        FWD(1);
        BWD(0, 1);
        BWD(1, 1);
        WGT(0);
        WGT(1);
    } else {
        FWD(0);
        BWD(0, 1);
        FWD(1);
        BWD(1, 1);
        WGT(0);
        WGT(1);
    }
    gpt2_join_tied_grads(&m); // zb-v's first stage: the head's part of the tied embedding, apart until here
    m.be->to_host(out, m.grads, gbytes);
    free(hbefore), free(hafter), free(hlast);
    free(full);
    free(local);
    gpt2_free(&m);
    return out;
}

static int check(const Case *k, Comm *world, Comm *cp_grad) {
    size_t n0, n1, n2;
    HeadWeight hw = { 0, 0 };
    unsigned char *a = run(k, world, cp_grad, 0, &n0, &hw), *b = run(k, world, cp_grad, 1, &n1, &hw), *c = run(k, world, cp_grad, 2, &n2, &hw);
    int nonzero = 0;
    for (size_t i = 0; i < n0; i++) nonzero |= a[i];
    int ok = nonzero && n0 == n1 && n0 == n2 && !memcmp(a, b, n0) && !memcmp(a, c, n0);
    // the last of several stages, rows in place: every split B's head weight gradient waits for the send
    int want = k->pp > 1 && k->pp_rank == (k->zbv ? 0 : k->pp - 1) && !k->sp ? 2 * M : 0;
    if (hw.early || hw.checked != want) {
        printf("FAIL split backward: the LM head's weight gradient: %d of %d B passes checked, %d added it before "
               "gpt2_backward_head_weight\n", hw.checked, want, hw.early);
        ok = 0;
    }
    if (comm_rank(world) == 0 || !ok)
        printf("%s split backward: recompute %s, stage %d of %d, %d chunk(s)%s, tp %d%s, cp %d, %s\n", ok ? "ok" : "FAIL",
               RECOMPUTE_NAMES[k->recompute], k->pp_rank, k->pp, k->V, k->zbv ? " in a V" : "", k->tp, k->sp ? " sp" : "", k->cp,
               k->dt == DT_F32 ? "fp32" : "bf16");
    free(a), free(b), free(c);
    return !ok;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--nproc")) return launch_local(atoi(argv[i + 1]), argc, argv, NULL);
    CommOptions opt = { .timeout = 60, .transport = TRANSPORT_AUTO, .ib_gid_index = -1 };
    LaunchEnv env;
    launch_env_read(&env);
    Comm *world = comm_init(&env, &opt);
    int n = comm_size(world), bad = 0;
    Comm *cp_grad = comm_split(world, 0, comm_rank(world), "cp-grad");
    for (int rc = 0; rc < 3; rc++) {
        if (n == 1) {
            int stages[][3] = { { 1, 0, 1 }, { 2, 0, 1 }, { 2, 1, 1 }, { 2, 0, 2 }, { 2, 1, 2 } }; // pp, rank, V
            for (int s = 0; s < 5; s++) {
                Case k = { .recompute = rc, .pp = stages[s][0], .pp_rank = stages[s][1], .V = stages[s][2], .tp = 1, .cp = 1, .dt = DT_F32 };
                bad += check(&k, world, cp_grad);
            }
            Case k = { .recompute = rc, .pp = 1, .V = 1, .tp = 1, .cp = 1, .dt = DT_BF16 };
            bad += check(&k, world, cp_grad);
            Case v = { .recompute = rc, .pp = 2, .pp_rank = 0, .V = 2, .tp = 1, .cp = 1, .zbv = 1, .dt = DT_F32 }; // both ends
            bad += check(&v, world, cp_grad);
        } else {
            Case tp = { .recompute = rc, .pp = 1, .V = 1, .tp = n, .cp = 1, .dt = DT_F32 };
            bad += check(&tp, world, cp_grad);
            tp.sp = 1;
            bad += check(&tp, world, cp_grad);
            Case tps = { .recompute = rc, .pp = 2, .pp_rank = 1, .V = 1, .tp = n, .sp = 1, .cp = 1, .dt = DT_F32 };
            bad += check(&tps, world, cp_grad);
            Case cp = { .recompute = rc, .pp = 1, .V = 1, .tp = 1, .cp = n, .dt = DT_F32 };
            bad += check(&cp, world, cp_grad);
        }
    }
    if (comm_rank(world) == 0) printf(bad ? "FAIL test_split\n" : "ok test_split\n");
    return bad ? 1 : 0;
}

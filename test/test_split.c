// test_split.c: the backward in two halves (model.h: gpt2_backward_input_chunk, B, then
// gpt2_backward_weight_chunk, W) against the fused backward (gpt2_backward_chunk), bitwise: the
// parameter gradients after two micro-batches and every input gradient a stage sends back. The split
// runs in two zero-bubble orders: F0 F1 B0 B1 W0 W1 (every W after both Bs) and F0 B0 F1 B1 W0 W1.
// Cases: recompute none, selective and full; a whole model, the first and the last of two pipeline
// stages, each with one or two chunks (interleaved); fp32 and bf16. With --nproc 2: tensor parallelism
// (with and without sequence parallelism) and context parallelism (ring attention) over the two ranks.
// Usage: test_split [--nproc 2]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives.h"
#include "launch.h"
#include "common.h"
#include "model.h"

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
    int recompute, pp_rank, pp, V, tp, sp, cp;
    DType dt;
} Case;

enum { M = 2, B = 2, T = 16 };

// Runs two micro-batches in `order` (0: fused backward; 1: F0 F1 B0 B1 W0 W1; 2: F0 B0 F1 B1 W0 W1) and
// returns the gradients followed by the input gradients sent back (host bytes, *n of them).
static unsigned char *run(const Case *k, Comm *world, Comm *cp_grad, int order, size_t *n) {
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
    int per = 4 / (k->pp * k->V); // blocks per chunk; chunk c of stage s is global chunk c·pp + s
    for (int c = 0; c < k->V; c++) lay.chunk_first[c] = (c * k->pp + k->pp_rank) * per, lay.chunk_len[c] = per;
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
            if (split) gpt2_backward_input_chunk(&m, c, mb, dloss);                                        \
            else gpt2_backward_chunk(&m, c, dloss);                                                        \
            if (!(m.first && c == 0)) m.be->to_host(sent + ((size_t)(mb) * sends + s--) * sbytes, gpt2_stage_grad(&m), sbytes); \
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
    m.be->to_host(out, m.grads, gbytes);
    free(full);
    free(local);
    gpt2_free(&m);
    return out;
}

static int check(const Case *k, Comm *world, Comm *cp_grad) {
    size_t n0, n1, n2;
    unsigned char *a = run(k, world, cp_grad, 0, &n0), *b = run(k, world, cp_grad, 1, &n1), *c = run(k, world, cp_grad, 2, &n2);
    int nonzero = 0;
    for (size_t i = 0; i < n0; i++) nonzero |= a[i];
    int ok = nonzero && n0 == n1 && n0 == n2 && !memcmp(a, b, n0) && !memcmp(a, c, n0);
    if (comm_rank(world) == 0 || !ok)
        printf("%s split backward: recompute %s, stage %d of %d, %d chunk(s), tp %d%s, cp %d, %s\n", ok ? "ok" : "FAIL",
               RECOMPUTE_NAMES[k->recompute], k->pp_rank, k->pp, k->V, k->tp, k->sp ? " sp" : "", k->cp,
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

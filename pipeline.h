// pipeline.h: pipeline parallelism. The blocks are split into contiguous stages; micro-batches flow
// forward through them and their gradients back, on the 1F1B schedule: stage s of P first runs
// min(P - s - 1, M) forwards (warm-up), then alternates one forward and one backward, then finishes
// the remaining backwards (cool-down), so that it never holds more than P micro-batches' activations.
// The bubble — the share of a step a stage spends waiting — is (P - 1)/(M + P - 1) for M micro-batches.
// The interleaved schedule (V chunks per stage, Megatron-LM's) visits the P·V virtual stages round
// robin, groups of P micro-batches at a time, and shrinks the bubble to (P - 1)/(V·M + P - 1); it
// needs M to be a multiple of P. pipeline_step executes the action lists of the layout's schedule
// (schedule.h: 1f1b, interleaved, zb-h1, zb-v); with zb-h1 and zb-v each backward runs as B (the input
// gradient, sent back at once) and W (the weight gradients, later, in micro-batch order), so the final
// model is bitwise 1f1b's. zb-v places two chunks per stage in a V (stage s: chunks s and 2P-1-s), so
// the first stage holds both the embedding and the head (and the loss), and the last stage hands its
// chunk 0's output to its chunk 1 in place.
#ifndef LLM4D_PIPELINE_H
#define LLM4D_PIPELINE_H

#include <stdio.h>

#include "collectives.h"
#include "model.h"
#include "schedule.h"
#include "zero.h"

typedef struct {
    GPT2 *model;
    Zero *zero;
    Comm *fwd, *bwd; // the pipeline's ranks, twice: activations flow on one, gradients on the other,
                     // so each direction of each channel carries one kind of message in schedule order
    int stages, stage, chunks;
    CommRequest **send_out, **send_grad; // sends still in flight, per activation set and chunk
    CommRequest **send_gbuf;             // with chunk sets: per gradient buffer (the layout's ngrads)
    // with chunk sets (the layout's chunk_sets: interleaved, zb-v): which sets are taken (F done, W not);
    // the schedule's cset says which set each (micro-batch, chunk) takes
    int *set_busy;
    StepTimes *times; // the model's: the pipeline adds its waits for activations and gradients
    int live, peak_live; // micro-batches whose activations this stage holds (F done, W not)
    int joins_left;      // chunks whose last W of the step is still to run (gpt2_join_tied_grads)
    Schedule sched;  // the action lists for sched.m micro-batches (built on the first step)
    char *trace;     // this step's operations, "F0 F1 B0 ...", for tests
    size_t trace_len, trace_cap;
    // --pp-schedule-dump: with keep_times, each step's start (t0) and every action's start and end on
    // this stage (act_t[2i], act_t[2i+1], now_seconds); a receive is the wait before its F or B, a send
    // the moment it was posted. 1f1b and interleaved run B and W as one backward: the B holds both.
    int keep_times;
    double t0, recv_end, send_at, *act_t;
    int act_cap;
    int times_measured; // --pp-times auto: the first step (at this M) measured F, B and W
    Schedule next;      // and the lists built for them, run from the next step (next.n: pending)
} Pipeline;

void pipeline_init(Pipeline *p, GPT2 *model, Zero *zero, Comm *fwd, Comm *bwd);

void pipeline_free(Pipeline *p);
// One step's forwards and backwards over M micro-batches (inputs and targets: M·B·T tokens each, used
// by the first and the last stage). Returns the sum of the micro-batch losses on the last stage, 0
// elsewhere.
double pipeline_step(Pipeline *p, const int32_t *inputs, const int32_t *targets, int M, int B, int T, float dloss);
// A forward of one micro-batch through every stage (validation, sampling): the loss on the last
// stage when targets are given, 0 elsewhere.
float pipeline_forward(Pipeline *p, const int32_t *inputs, const int32_t *targets, int B, int T);

// The model of the rank that l places (its slice, its stage's blocks, its activation sets), and its
// optimizer state and pipeline (times: where they add the step's times, timing.h), from host fp32 parameters in the internal order (NULL: dry). The trainer
// builds its own rank so; `./train plan --exact` builds any rank of any layout so with a dry backend
// (mem.h), communicators NULL, and reads the account: the same code, so the same bytes.
void layout_build_model(const Layout *l, const GPT2Config *cfg, DType dt, const Backend *be, StepTimes *times, GPT2 *m);
void layout_build_state(const Layout *l, GPT2 *m, Zero *z, Pipeline *p, const float *host_params, const AdamWConfig *acfg);

#endif

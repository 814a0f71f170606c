// timing.h: where one step's time went. One struct, StepTimes, that the trainer owns and resets once
// per step; the model, the pipeline, ZeRO and the context-parallel ring each add to their own field of
// it (they get a pointer at build time), through the one timed wait below.
#ifndef LLM4D_TIMING_H
#define LLM4D_TIMING_H

#include "collectives.h"
#include "common.h"

// The kinds of op --profile times.
enum { PROF_MATMUL, PROF_ATTENTION, PROF_NCAT };

typedef struct {
    int profile;             // --profile: model.c times its ops into op_s (device backends are synchronised
                             // around every timed op, so profiling slows a GPU run down)
    double op_s[PROF_NCAT];  // model.c: seconds in each kind of op
    // model.c, always: the FLOPs of the causally visible query-key pairs this rank's attention computed:
    // 4·hs per pair forward (scores and the weighted sum), 10·hs backward (the scores again, dV, dP, dQ, dK)
    double attention_flops;
    double pipe_wait_s;      // pipeline.c: waiting for the neighbour stages: their activations or gradients, or
                             // their reading a send whose buffer a pass reuses
    double pipe_span_s;      // pipeline.c: from the schedule's first action to the end of its last (waits included)
    double pipe_w_s;         // pipeline.c: W passes run apart from their B (zb-h1), what fills the bubble
    // pipeline.c: what this rank's hand-offs cost in the step's schedule, counted, not timed: receives
    // (one per hand-off), and on the two pipeline communicators (CommCounters) the copies and bytes
    // copied, the progress threads' wake-ups, sleeps and condition waits
    double pipe_recvs, pipe_copies, pipe_copied_bytes, pipe_wakeups, pipe_sleeps, pipe_cond_waits;
    double ring_wait_s;      // context.c: waiting for the context-parallel ring's transfers
    double ring_sent_bytes;  // context.c: bytes this rank sent round the ring (K/V blocks, dK/dV partial sums)
    double zero_wait_s;      // zero.c: waiting for data-parallel collectives after issuing them (exposed)
} StepTimes;

// The start of a step: every count back to zero (--profile stays).
static inline void step_times_reset(StepTimes *t) { *t = (StepTimes){ .profile = t->profile }; }

// Waits for *r (nothing when it is NULL), clears it, and adds the seconds waited to *seconds.
static inline void wait_timed(CommRequest **r, double *seconds) {
    if (!*r) return;
    double t0 = now_seconds();
    comm_wait(*r);
    *r = NULL;
    *seconds += now_seconds() - t0;
}

#endif

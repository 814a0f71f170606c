// layout.h: one rank's place in the layout, in one object that every axis file asks (model, zero,
// pipeline, context, ckpt, plan): the axis sizes, this rank's coordinate on each axis, its
// communicators, its pipeline chunks and activation slots, and the run's shape that decides its
// buffers. Built once (layout_place, layout_connect, layout_place_stages) and read-only afterwards.
//
// Ranks are ordered rank = ((dp·PP + pp)·CP + cp)·TP + tp: a tensor-parallel group is consecutive
// ranks (one node when it fits), a context-parallel group's ranks are TP apart and a pipeline's stages
// TP·CP apart. layout_rank and layout_coords are the only places that arithmetic is written.
#ifndef LLM4D_LAYOUT_H
#define LLM4D_LAYOUT_H

#include <stddef.h>

#include "collectives.h"

// The trainer's bounds on a step, so that no batch count overflows (options.c's check_layout; the planner
// refuses the same): tokens of a micro-batch, micro-batches a step accumulates, one rank's tokens a step.
#define MAX_MICRO_TOKENS (1LL << 24)
#define MAX_ACCUM (1LL << 16)
#define MAX_STEP_TOKENS (1LL << 28) // (two int32 copies)

#define MAX_CHUNKS 16

// One axis: how many ranks it has, this rank's coordinate on it, and the group along it (NULL in one
// process and in a dry build, see mem.h; layout_group gives NULL for an axis of one rank too).
typedef struct {
    int size, rank;
    Comm *comm;
} Axis;

typedef struct {
    int nranks, rank, lead; // lead: rank 0, which prints and logs
    Axis dp, tp, pp, cp;
    // the ranks holding the same weights, DP x CP of them (rank dp·CP + cp): the gradient group that
    // ZeRO shards over (context-parallel ranks hold the same weights too)
    Axis replicas;
    Comm *world;          // NULL: one process (or a dry build)
    Comm *pp_fwd, *pp_bwd; // the pipeline's ranks twice more: activations flow on one, gradients on the other
    Comm *embed;          // the first and last stage, which both hold the tied embedding (NULL: none)
    Comm *cp_grad;        // the context-parallel group again, for the dK/dV accumulators (context.h)
    int sp;               // sequence parallelism (only with TP > 1)
    int zero;             // the ZeRO stage asked for (zero.c uses 0 when there is one replica)
    int recompute;        // RECOMPUTE_* (model.h): what each activation set keeps
    int B, T, accum;      // micro-batch shape (T: whole sequences, of which a rank holds T / cp.size),
                          // micro-batches per step
    double bucket_mb;     // gradient bucket size (zero.c)
    // this stage's blocks: chunks runs (more than one with the interleaved schedule), each of
    // chunk_len[c] blocks from global block chunk_first[c]; nslots activation sets (micro-batches in flight)
    int chunks, chunk_first[MAX_CHUNKS], chunk_len[MAX_CHUNKS], nslots;
    int nstash; // a split schedule's weight-gradient stashes per chunk (its B passes awaiting W at once,
                // schedule.h's wpending), allocated with the model; 0: B and W together, none up front
    int chunk_sets; // 1 (interleaved, zb-v): each activation set holds one chunk's blocks, the one the
                    // schedule assigns at its F, free after its W (pipeline.c), nslots of them; 0: each
                    // holds every chunk of a micro-batch
    int nheads;     // with PP > 1, on the stage holding the head: sets of the head's buffers (final
                    // LayerNorm, logits, loss statistics), micro-batch mb's in mb % nheads; 0: in the set
    int ngrads;     // with chunk sets: the buffers input gradients are sent back from (schedule.h, gbuf)
    int schedule; // the pipeline schedule (SCHED_*, schedule.h; 0 = 1f1b), set before layout_connect
    double pp_times[3]; // --pp-times: the F, B, W times zb-v's lists are built for; zeros: unit times
    int pp_times_auto;  // --pp-times auto: zb-v measures them in the first step (pipeline.c)
} Layout;

// The rank at coordinates (dp, pp, cp, tp) of a TP x CP x PP model-parallel grid, and back.
int layout_rank(int dp, int pp, int cp, int tp, int TP, int CP, int PP);
void layout_coords(int rank, int TP, int CP, int PP, int *dp, int *pp, int *cp, int *tp);
// Whether nranks ranks split into the model-parallel axes TP x CP x PP: 0, or -1 with the reason.
int layout_error(int TP, int CP, int PP, int nranks, char *err, size_t cap);
// The sizes and this rank's coordinates (dies with the reason when TP x CP x PP does not divide nranks);
// clears everything else.
void layout_place(Layout *l, int rank, int nranks, int TP, int CP, int PP);
// The communicators of every axis, split from world (collective over it; nothing when world is NULL).
void layout_connect(Layout *l, Comm *world);
void layout_disconnect(Layout *l);
// Every communicator of the layout, for the device set-up (NULL entries where absent); returns the count.
int layout_comms(const Layout *l, Comm **out, int cap);
// Every communicator's own buffers (an algorithm's staging: comm_count_memory) from acct from now on
// (NULL: uncounted again); ./train plan --exact counts the same (algo_buffer_bytes).
void layout_count_memory(const Layout *l, MemAccount *acct);
// The pipeline stage holding the head (the final LayerNorm, the LM head and the loss): the last, or
// under zb-v the first, which then holds both ends of the model (schedule.h).
int layout_head_stage(const Layout *l);
// The F, B, W times zb-v's lists are built for (schedule_build), or NULL for unit times.
const double *layout_pass_times(const Layout *l);
// The group along an axis when it has other ranks, else NULL.
static inline Comm *layout_group(const Axis *a) { return a->size > 1 ? a->comm : NULL; }
// The pipeline stages of L blocks: V chunks per stage (the interleaved schedule or zb-v when V > 1; V is
// 1 without pipelining), --pp-layers counts (or NULL), and the activation sets for accum micro-batches
// that l->schedule keeps in flight. Interleaved: stage s holds chunks s, s + P, ...; zb-v: chunks s
// and 2P-1-s (a V: the first stage holds the first and the last chunk).
void layout_place_stages(Layout *l, int L, int V, const char *pp_layers);
// Splits L blocks into P stages: equal (the first L mod P stages one block longer) unless counts
// (comma-separated, from --pp-layers) says otherwise. Fills first[P] and count[P] and returns 0, or -1
// with a message naming the flag when it cannot (the launcher asks before it forks).
// With V > 1 chunks the L blocks form P·V chunks and stage s gets chunks s, s+P, ...; first and count
// then hold P·V entries.
int layout_split_layers(int L, int P, int V, const char *counts, int *first, int *count, char *err, size_t cap);

#endif

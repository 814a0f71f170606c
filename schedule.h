// schedule.h: pipeline schedules as action lists. One function computes, from p stages (ranks), m
// micro-batches and v chunks per rank, what each rank does in a step and in which order: forwards
// (F), input-gradient backwards (B), weight-gradient backwards (W), and the hand-offs between ranks
// (send and receive of an activation or of a gradient), each naming its micro-batch, its chunk and,
// for hand-offs, the peer rank. Nothing here runs a model; pipeline.c executes the lists.
//
// The schedules (the paper: Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241):
//   1f1b         stage r runs min(p-r-1, m) warm-up forwards, then one forward / one backward, then the
//                remaining backwards; each W directly follows its B (one merged backward, as before
//                the split). At most p-r micro-batches in flight on rank r.
//   interleaved  Megatron-LM's interleaved 1F1B over v chunks per rank (chunk c of rank r is virtual
//                stage c·p + r): groups of p micro-batches visit the chunks in turn, forwards in chunk
//                order and backwards in reverse, warm-up (p-r-1)·2 + (v-1)·p; W follows its B. Needs
//                m a multiple of p. At most min(m·v, warm-up + 1) chunk activations on rank r.
//   zb-h1        1f1b's order of F and B with B and W apart: rank r delays its W passes by r
//                iterations, so every rank holds min(p, m) micro-batches (1f1b's first-rank peak) and
//                the Ws fill the drain; bubble (p-1)(F+B-W) instead of 1f1b's (p-1)(F+B+W).
//   zb-v         two chunks per rank in a V: chunk 0 of rank r is virtual stage r, chunk 1 is virtual
//                stage 2p-1-r (the last rank turns the micro-batch round locally; rank 0 holds both
//                ends of the model, embedding and head). Built by list scheduling with F, B and W
//                times (unit times, the paper's, unless --pp-times gives others): an idle rank runs a ready B (chunk 0 first), else a ready F (chunk 1 first)
//                while it holds fewer than 2p chunk activations (1f1b's memory: p micro-batches of a
//                whole stage), else its oldest pending W (chunk 1's first on a tie: the blocks' gradients
//                become final from the model's end down, as in every other schedule). Bubble: the first activation's walk down
//                the ranks, (p-1) chunk-forwards, once per step, with unit times. With the times a
//                run measures (rarely equal), lists built for those times keep the ranks busy
//                where unit-time lists leave them waiting for a hand-off in the steady state; for
//                other times schedule_build searches a few scaled times (and a variant that keeps a
//                slot for chunk 1, which the greedy can otherwise stall without) and keeps the fastest.
// A micro-batch's activations on a rank are in flight from its F to its W. W passes of a chunk run in
// micro-batch order in every schedule (so the gradient sums are added in 1f1b's order).
#ifndef LLM4D_SCHEDULE_H
#define LLM4D_SCHEDULE_H

#include <stdio.h>

enum { SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZBH1, SCHED_ZBV, SCHED_COUNT };
extern const char *const SCHEDULE_NAMES[SCHED_COUNT];

enum { ACT_F, ACT_B, ACT_W, ACT_SEND_ACT, ACT_RECV_ACT, ACT_SEND_GRAD, ACT_RECV_GRAD, ACT_NKINDS };
extern const char *const ACTION_NAMES[ACT_NKINDS];

// One action. Hand-offs: chunk is this rank's chunk that produced (send) or will consume (receive) the
// tensor, peer the other rank; a message is named by (micro-batch, the virtual stage that produced it,
// direction). peer is -1 for F, B and W.
typedef struct {
    int kind, mb, chunk, peer;
} Action;

typedef struct {
    int kind, p, m, v;
    double times[3]; // the F, B and W times zb-v's lists were built for (1, 1, 1 unless --pp-times)
    int split;       // B and W are apart (zb-h1, zb-v); 0: each W directly follows its B
    int *n;          // [p] actions per rank
    Action **a;      // [p][n[r]]
    int *bound;      // [p] the schedule's stated bound on chunk activations in flight (F done, W not)
    int *slots;      // [p] activation sets a rank needs when micro-batch mb uses set mb % slots:
                     // the widest span of micro-batches in flight at once, from the order itself
    int *wpending;   // [p] the most B passes of one chunk whose W has not run, at once: the weight-gradient
                     // stashes a split backward keeps per chunk (zb-h1: min(r + 1, m) on rank r)
    int *live;       // [p] the most chunk activations in flight at once (F done, W not): the chunk sets a
                     // rank needs when each takes a free one at F and frees it after W (zb-v's pool)
    int *hspan;      // [p] per rank, the widest span of its last chunk's micro-batches between F and B: on
                     // the rank holding the head, the head's buffers it needs (B adds the head's weight
                     // gradient too, so nothing reads them after it), micro-batch mb's in mb % hspan
    int *cset;       // [p·m·v] with v > 1: the chunk set (r, mb, c)'s F takes, held until its W (schedule.c,
                     // assign_chunk_sets: the activation it sent on is known received by then)
    int *csets;      // [p] with v > 1: the chunk sets a rank needs (live)
    int *gbuf;       // [p·m·v] with v > 1: the gradient buffer (r, mb, c)'s B sends its input gradient from
                     // (-1: none sent), held until the rank knows it received
    int *gbufs;      // [p] with v > 1: the gradient buffers a rank needs
} Schedule;

// The schedule named on a command line (--pp-schedule), or -1.
int schedule_parse(const char *name);
// Builds the action lists of schedule `kind` for p ranks, m micro-batches and v chunks per rank
// (interleaved: v >= 1, m a multiple of p when v > 1; zb-v: v must be 2; 1f1b, zb-h1: v must be 1).
// times: the relative F, B and W times that zb-v's list scheduling assumes (NULL: 1, 1, 1); the other
// schedules are fixed orders. Returns 0 and fills s, or -1 with one line in why naming what does not fit.
int schedule_build(Schedule *s, int kind, int p, int m, int v, const double *times, char *why, size_t why_cap);

void schedule_free(Schedule *s);
// --pp-times F,B,W: three positive numbers into times (unit: 1, 1, 1), or one line naming the flag and exit.
void schedule_parse_times(const char *flag, const char *v, double times[3]);
// --pp-times VALUE (NULL: not given) with schedule kind (-1: the default): one line and exit unless zb-v.
void schedule_check_times_kind(int kind, const char *value);
// What a schedule's lists need allocated on rank r (layout_place_stages allocates it): activation sets
// (interleaved and zb-v: a pool of chunk sets, one taken at each F and freed after its W), the head's
// buffer sets (a ring apart from the sets, used where r holds the head), the weight-gradient stashes
// per chunk (split schedules; else 0) and the gradient buffers input gradients leave from (with chunk
// sets; else 0: the set's own).
typedef struct {
    int sets, heads, stashes, grads;
} SchedulePool;
SchedulePool schedule_pool(const Schedule *s, int r);
// Whether lists needing `need` on a rank run in what `have` allocated there: the head's buffers count on
// the rank holding the head, where a ring of them is apart from the sets (have.heads 0: one stage, the
// head in its set).
int schedule_pool_fits(SchedulePool need, SchedulePool have, int head);
// What --pp-times auto allocates on rank r, from the unit lists it runs first: their pool with as many
// gradient buffers as activation sets. Lists built for measured times keep more input gradients in
// flight than the unit lists (at PP 2, 2 a rank against 1), and a gradient buffer is one boundary
// activation (B·T·C), little beside a chunk's activation set, so that they can be run.
SchedulePool schedule_pool_auto(const Schedule *unit, int r);
// The lists --pp-times auto runs once its first step measured times: schedule_build's for those times,
// keeping only candidates that run in schedule_pool_auto of the unit lists on every rank (the model
// was allocated before the times were known); the unit lists are always one.
int schedule_build_auto(Schedule *s, int kind, int p, int m, int v, const double times[3], char *why, size_t why_cap);
// The share of the step every rank idles under F, B, W times t (each rank does m·v·(F + B + W)):
// 1 - that work over the makespan, or -1 when the lists deadlock.
double schedule_bubble(const Schedule *s, const double t[3]);
// Where chunk c of rank r sits in the model (its virtual stage, 0 .. p·v-1), and its neighbours: the rank
// and chunk that feed it (prev) and that it feeds (next); -1 at the model's ends.
int schedule_vstage(const Schedule *s, int r, int c);
void schedule_prev(const Schedule *s, int r, int c, int *pr, int *pc);
int schedule_holds_head(const Schedule *s, int r); // rank r holds the last virtual stage (the head)
void schedule_next(const Schedule *s, int r, int c, int *nr, int *nc);
// Start times of every compute action with F, B and W taking tf, tb and tw and hand-offs free (a
// receive waits for its send; sends never wait): start[r][i] for action i of rank r (-1 for hand-offs).
// Returns the makespan, or -1 if the lists deadlock. start may be NULL.
double schedule_times(const Schedule *s, double tf, double tb, double tw, double **start);
// For a reader (./train schedule): the per-rank action lists and an ASCII timeline in unit times, one
// row per rank, each cell an F, B or W with its micro-batch (and chunk letter a, b, ... when v > 1).
// ascii_only: the timeline alone (the README's pictures).
void schedule_dump(FILE *f, const Schedule *s, int ascii_only);
// --pp-schedule-dump: the action lists as a table for programs (scripts/plot.py; README "The schedule
// dump"), tab-separated, three header lines then one line per action in each rank's order:
//   # llm4d pipeline schedule dump 1
//   # schedule NAME p P m M v V split 0|1 times unit|ms
//   rank <TAB> index <TAB> action <TAB> mb <TAB> chunk <TAB> peer <TAB> start <TAB> end
// action is F, B, W, send-act, recv-act, send-grad or recv-grad (ACTION_NAMES); peer -1 for F, B and W.
// start and end: with times unit the schedule's own timeline (schedule_times with F = B = W = 1, hand-offs
// "-"); with times ms the measured times of one training step (start, end NULL: "-" for every action).
void schedule_write_dump(FILE *f, const Schedule *s, const char *times, double **start, double **end);
// ./train schedule --pp P --micro-batches M [--pp-virtual V] [--pp-schedule NAME] [--ascii]
// [--pp-schedule-dump FILE]: builds and prints one (--ascii: the timeline alone; the dump: the table).
int schedule_main(int argc, char **argv);

#endif

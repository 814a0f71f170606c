// report.h: what the trainer prints and logs: the header, one line (and one JSON record with --log) per
// step, validation losses, checkpoints, stragglers, and every rank's memory at the start and its peak at
// the end; each step's wall time (every second of the run in some step's record) and a stall clock that
// notices when this process did not run. Rank 0 prints and writes the log; the gathers over the ranks
// are collective.
#ifndef LLM4D_REPORT_H
#define LLM4D_REPORT_H

#include <stdio.h>

#include "ckpt.h"
#include "data.h"
#include "layout.h"
#include "options.h"
#include "pipeline.h"
#include "timing.h"
#include "zero.h"

typedef struct { // what one step did (train.c fills it), besides its StepTimes
    float loss, norm, lr;
    int skipped;             // this step's update was skipped (--skip-spikes)
    long long skipped_total; // skipped so far
    double ms, compute_ms, comm_ms, exposed_ms, tp_ms, cp_ms;
    double stall_ms;         // the checkpoint stall before the step
    double compute_stopped_ms; // of compute_ms, the time this process did not run (report_stopped_seconds)
    int zero3_gathers;       // units ZeRO-3 gathered (-1: not ZeRO-3)
} StepResult;

typedef struct StallClock StallClock;

typedef struct {
    const Layout *lay;
    const Options *o;
    long long batch_tokens;
    double flops_per_token;
    FILE *logf; // rank 0 with --log, else NULL
    // stragglers: consecutive slow steps of every rank, its host, and this step's busy ms of every rank
    // (compute, and the time it did not run outside compute) and the ms it did not run
    int *slow_for;
    char (*host)[64];
    double *compute, *stopped;
    // every second of the run belongs to one step's record: a step's wall time runs from the end of the
    // previous record (report_start for the first) to the end of its own
    StallClock *stall; // a thread that notices when this process did not run (SIGSTOP, a frozen machine)
    double t0, mark, stopped_seen; // report_start's time, the previous record's end, stopped seconds then
} Report;

void report_init(Report *r, const Layout *l, const Options *o, long long batch_tokens, double flops_per_token);
// The header on rank 0, then every rank's memory, one line each in rank order (collective): every buffer
// is allocated before step 1, so this is the plan. train: the training data (NULL: none); ckpt: NULL
// without --ckpt-dir.
void report_header(const Report *r, const GPT2 *m, const Zero *z, const TokenSet *train, const Ckpt *ckpt);
// Opens --log on rank 0 (a resumed run keeps its records up to start_step and appends a "resumed" record)
// and learns every rank's host (node_id; empty: localhost) for straggler reports (collective).
void report_open(Report *r, int resumed, int start_step, const char *node_id);
// The step line and record (collective: the bubble, stragglers, stopped time and attention FLOPs are
// gathered over the ranks); p: the pipeline, for --pp-trace. The record's wall_ms ends here, after the
// gathers: a rank that stalls the others lengthens the wall time of the step it stalls.
void report_step(Report *r, int step, const StepResult *res, const StepTimes *tm, const Pipeline *p);
// The start of the first step's wall time (just before the step loop).
void report_start(Report *r);
// Seconds this process has not run since report_open (gaps in the stall clock's ticks beyond
// STALL_MIN_S: stopped, frozen or starved), counting a gap still open; monotone.
double report_stopped_seconds(Report *r);
void report_val(Report *r, int step, float val_loss);
// A finished checkpoint (rank 0), with the stall of the step that started it.
void report_checkpoint(Report *r, const CkptEvent *ev, double stall_ms);
// The end of the run: every rank's peak bytes per category, printed in rank order and logged by rank 0
// as {"memory_peak":{"weights":..,...},"kernel_scratch":B,"rank":R}, one record per rank (kernel_scratch:
// the backend's own grow-only workspaces, which the categories do not see). Collective.
void report_memory_peak(Report *r, const GPT2 *m);
// --pp-schedule-dump: the schedule's action lists with the measured start and end of each action of the
// last step that ran, in ms from the earliest stage's start of that step (the stages' clocks are one
// CLOCK_MONOTONIC on one node; across nodes they differ by the clocks' offset), gathered over the
// pipeline group and written by rank 0 (schedule_write_dump's format). Collective; nothing when no step ran.
void report_schedule_dump(Report *r, const Pipeline *p, const char *path);
void report_close(Report *r);

#endif

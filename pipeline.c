// pipeline.c: building the rank a layout places (model, ZeRO state, pipeline), the execution of a
// schedule's action lists (schedule.h) and the hand-off of activations and gradients between stages.
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

void pipeline_init(Pipeline *p, GPT2 *m, Zero *z, Comm *fwd, Comm *bwd) {
    memset(p, 0, sizeof *p);
    p->model = m;
    p->zero = z;
    p->times = m->times;
    p->fwd = fwd;
    p->bwd = bwd;
    p->stages = m->lay->pp.size;
    p->stage = m->lay->pp.rank;
    p->chunks = m->lay->chunks;
    int n = m->lay->nslots;
    p->send_out = xcalloc((size_t)n * p->chunks, sizeof(CommRequest *));
    p->send_grad = xcalloc((size_t)n * p->chunks, sizeof(CommRequest *));
    p->send_gbuf = xcalloc((size_t)m->lay->ngrads + 1, sizeof(CommRequest *));
    p->set_busy = xcalloc((size_t)n, sizeof(int));
}

void layout_build_model(const Layout *l, const GPT2Config *cfg, DType dt, const Backend *be, StepTimes *times, GPT2 *m) {
    int stage = l->replicas.size > 1 ? l->zero : 0; // one replica: every stage is stage 0
    gpt2_build(m, cfg, dt, be, l, times, stage != 3, !zero_streams_gradients(stage, l));
}

void layout_build_state(const Layout *l, GPT2 *m, Zero *z, Pipeline *p, const float *host_params, const AdamWConfig *acfg) {
    zero_init(z, m, host_params, acfg);
    pipeline_init(p, m, z, l->pp_fwd, l->pp_bwd);
}

static void drain(CommRequest **r) {
    if (*r) comm_wait(*r);
    *r = NULL;
}

// A drain inside the schedule, before a pass reuses a buffer: a wait for the neighbour stage (a send on
// shared memory completes once the peer has read it), so it counts as the bubble, as receives do.
static void drain_waiting(Pipeline *p, CommRequest **r) { wait_timed(r, &p->times->pipe_wait_s); }

void pipeline_free(Pipeline *p) {
    for (int s = 0; s < p->model->lay->nslots * p->chunks; s++) {
        drain(&p->send_out[s]);
        drain(&p->send_grad[s]);
    }
    for (int g = 0; g < p->model->lay->ngrads; g++) drain(&p->send_gbuf[g]);
    free(p->send_out);
    free(p->send_grad);
    free(p->send_gbuf);
    free(p->set_busy);
    free(p->trace);
    free(p->act_t);
    if (p->sched.n) schedule_free(&p->sched);
    if (p->next.n) schedule_free(&p->next);
    memset(p, 0, sizeof *p);
}

static void trace_op(Pipeline *p, char kind, int mb, int chunk) {
    if (p->trace_len + 24 > p->trace_cap) {
        p->trace_cap = p->trace_cap ? 2 * p->trace_cap : 256;
        p->trace = realloc(p->trace, p->trace_cap);
        if (!p->trace) die("out of memory");
    }
    p->trace_len += (size_t)snprintf(p->trace + p->trace_len, p->trace_cap - p->trace_len, "%s%c%d", p->trace_len ? " " : "",
                                     kind, mb);
    if (p->chunks > 1) p->trace_len += (size_t)snprintf(p->trace + p->trace_len, p->trace_cap - p->trace_len, "c%d", chunk);
}

// Receives n bytes from rank `from` of c into dst, counting the wait. On a GPU dst and the sends'
// sources are device memory that the communicator moves in place (devmem.h), so every (slot, chunk)
// hands off from its own buffer, which stays untouched until its send completes (send_out and
// send_grad are drained before the slot is reused): no staging buffer is shared between chunks.
static void recv_into(Pipeline *p, Comm *c, void *dst, size_t n, int from) {
    double t0 = now_seconds(); // a blocking receive (its inline path is faster than a request's wait)
    comm_recv(c, dst, n, from);
    p->times->pipe_recvs += 1;
    p->recv_end = now_seconds();
    p->times->pipe_wait_s += p->recv_end - t0;
}

static CommRequest *send_from(Pipeline *p, Comm *c, const void *src, size_t n, int to) {
    if (p->keep_times) p->send_at = now_seconds(); // before the post: no receive ends earlier (--pp-schedule-dump)
    return comm_isend(c, src, n, to);
}

// Neighbours in the virtual pipeline (schedule.h's placement of the layout's schedule): interleaved,
// chunk c of stage s follows chunk c of stage s-1 and chunk c of the last stage feeds chunk c+1 of the
// first; zb-v, chunk 0 runs down the stages and chunk 1 back up, the last stage turning round locally
// (its chunk 0 feeds its own chunk 1). -1: none (the model's ends).
static int neighbour(const Pipeline *p, int chunk, int next) {
    Schedule where = { .kind = p->model->lay->schedule, .p = p->stages, .v = p->chunks }; // the placement only
    int r, c;
    if (next) schedule_next(&where, p->stage, chunk, &r, &c);
    else schedule_prev(&where, p->stage, chunk, &r, &c);
    return r;
}
static int prev_stage(const Pipeline *p, int chunk) { return neighbour(p, chunk, 0); }
static int next_stage(const Pipeline *p, int chunk) { return neighbour(p, chunk, 1); }

// The activation set of micro-batch mb's chunk: set mb mod nslots (every chunk of it), or with chunk sets
// the one the schedule assigns it (schedule.h's cset: its previous holder's W has run and its hand-offs
// are known received, so draining them cannot wait for a rank that waits for this one).
static int set_of(const Pipeline *p, int mb, int chunk) {
    const Layout *l = p->model->lay;
    return l->chunk_sets ? p->sched.cset[((size_t)p->stage * p->sched.m + mb) * p->chunks + chunk] : mb % l->nslots;
}

// A chunk's input, into set `slot`: received from the stage before it, or (zb-v's turn on the last stage)
// copied from this stage's previous chunk's output, in set `prev` (the same set without chunk sets).
static void take_input(Pipeline *p, int chunk, int slot, int prev, size_t bytes, int from) {
    GPT2 *m = p->model;
    if (from == p->stage) {
        gpt2_use_slot(m, prev);
        const void *out = gpt2_stage_output(m, chunk - 1);
        gpt2_use_slot(m, slot);
        m->be->copy(gpt2_stage_input(m, chunk), out, bytes);
    } else {
        recv_into(p, p->fwd, gpt2_stage_input(m, chunk), bytes, from);
    }
}

// Chunk sets: the set of micro-batch mb's chunk, taken at its F.
static int take_set(Pipeline *p, int mb, int chunk) {
    int n = p->model->lay->nslots, k = set_of(p, mb, chunk);
    if (k >= n || p->set_busy[k]) die("internal: chunk activation set %d of %d is taken or missing (the schedule's assignment)", k, n);
    p->set_busy[k] = 1;
    return k;
}

static double forward_op(Pipeline *p, const int32_t *inputs, const int32_t *targets, int mb, int chunk, int B, int T,
                         float dloss) {
    GPT2 *m = p->model;
    int sets = m->lay->chunk_sets, slot = sets ? take_set(p, mb, chunk) : mb % m->lay->nslots, sc = slot * p->chunks + chunk;
    gpt2_bind_set(m, slot, chunk, mb);
    size_t bytes = gpt2_stage_bytes(m, B, T), tokens = (size_t)B * T;
    int from = prev_stage(p, chunk), to = next_stage(p, chunk);
    // the input first: the set's input is never a send's source, and what the receive tells of the
    // previous stage is what the schedule's chunk sets count on (schedule.h, cset)
    if (from >= 0) take_input(p, chunk, slot, from == p->stage ? set_of(p, mb, chunk - 1) : slot, bytes, from);
    if (chunk == 0 || sets) // the set's previous micro-batch has left: its output and input gradient
        for (int c = 0; c < p->chunks; c++) {
            drain_waiting(p, &p->send_out[slot * p->chunks + c]);
            drain_waiting(p, &p->send_grad[slot * p->chunks + c]);
        }
    zero_begin_forward(p->zero);
    float loss = gpt2_forward_chunk(m, chunk, inputs + mb * tokens, targets ? targets + mb * tokens : NULL, B, T, dloss);
    if (to >= 0 && to != p->stage) p->send_out[sc] = send_from(p, p->fwd, gpt2_stage_output(m, chunk), bytes, to);
    trace_op(p, 'F', mb, chunk);
    if (++p->live > p->peak_live) p->peak_live = p->live;
    return to < 0 ? loss : 0.0;
}

// B: the input gradient of one micro-batch's chunk, sent back to the previous stage at once; with
// split, its weight gradients wait in the model's stash for weight_op (the LM head's, which nothing
// keeps for W, run here once the gradient has been sent, or inside B under SP: model.h), else they are
// added here too (one fused backward, as 1f1b and interleaved run).
static void backward_op(Pipeline *p, int mb, int chunk, int M, int B, int T, float dloss, int split) {
    GPT2 *m = p->model;
    int slot = set_of(p, mb, chunk);
    for (int c = 0; c < p->chunks; c++) drain_waiting(p, &p->send_grad[slot * p->chunks + c]); // dresidual is reused
    drain_waiting(p, &p->send_out[slot * p->chunks + chunk]); // (complete: its gradient came back) B leaves W's inputs there
    gpt2_use_slot(m, slot);
    size_t bytes = gpt2_stage_bytes(m, B, T);
    int from = next_stage(p, chunk), to = prev_stage(p, chunk);
    // zb-v's turn on the last stage: chunk 1's B left chunk 0's output gradient in place, in this set
    if (from >= 0 && from != p->stage) recv_into(p, p->bwd, gpt2_stage_grad(m), bytes, from);
    zero_begin_backward(p->zero, mb == M - 1);
    if (split) gpt2_backward_input_chunk(m, chunk, slot, dloss);
    else gpt2_backward_chunk(m, chunk, dloss);
    if (to >= 0 && to != p->stage && m->lay->chunk_sets) {
        // from the gradient buffer the schedule assigns, so that the set is free at its W: its last
        // send is known received (schedule.h, gbuf), and the drain does not wait
        int g = p->sched.gbuf[((size_t)p->stage * p->sched.m + mb) * p->chunks + chunk];
        drain_waiting(p, &p->send_gbuf[g]);
        void *buf = gpt2_grad_buffer(m, g);
        m->be->copy(buf, gpt2_stage_grad(m), bytes);
        p->send_gbuf[g] = send_from(p, p->bwd, buf, bytes, to);
    } else if (to >= 0 && to != p->stage) {
        p->send_grad[slot * p->chunks + chunk] = send_from(p, p->bwd, gpt2_stage_grad(m), bytes, to);
    }
    if (to == p->stage && m->lay->chunk_sets) { // zb-v's turn: the gradient into the previous chunk's set
        const void *g = gpt2_stage_grad(m);
        gpt2_use_slot(m, set_of(p, mb, chunk - 1));
        m->be->copy(gpt2_stage_grad(m), g, bytes);
    }
    if (split) { // the head's weight gradient, after its input gradient has left (model.h); gradients only
        zero_begin_weights(p->zero, mb == M - 1);
        gpt2_backward_head_weight(m);
    }
    trace_op(p, 'B', mb, chunk);
    if (!split) p->live--;
    if (!split && m->lay->chunk_sets) p->set_busy[slot] = 0;
}

// W: the weight gradients B left for micro-batch mb's chunk. ZeRO hears "ready" from here (the
// micro-batch's last contribution), so it is told which micro-batch this is. On a stage holding both
// ends of the model (zb-v's first), the tied embedding is ready once the last micro-batch's W of both
// chunks has run (joins_left counts them down).
static void weight_op(Pipeline *p, int mb, int chunk, int M) {
    double t0 = now_seconds();
    zero_begin_weights(p->zero, mb == M - 1);
    int slot = set_of(p, mb, chunk);
    gpt2_backward_weight_chunk(p->model, chunk, slot);
    if (p->model->lay->chunk_sets) p->set_busy[slot] = 0;
    if (mb == M - 1 && --p->joins_left == 0) gpt2_join_tied_grads(p->model);
    p->times->pipe_w_s += now_seconds() - t0;
    trace_op(p, 'W', mb, chunk);
    p->live--;
}

// --pp-schedule-dump: action i ran from t0 to t1; the receive before it (if the op waited in one) gets the
// wait, a send (which its compute posted) the time of the post.
static void keep_time(Pipeline *p, int i, double t0, double t1) {
    const Action *a = p->sched.a[p->stage];
    if ((a[i].kind == ACT_SEND_ACT || a[i].kind == ACT_SEND_GRAD) && i > 0) t0 = t1 = p->send_at;
    if (p->recv_end >= 0 && i > 0 && (a[i - 1].kind == ACT_RECV_ACT || a[i - 1].kind == ACT_RECV_GRAD)) {
        p->act_t[2 * (i - 1)] = t0;
        p->act_t[2 * (i - 1) + 1] = t0 = p->recv_end;
    }
    p->act_t[2 * i] = t0;
    p->act_t[2 * i + 1] = t1;
}

// The step's hand-off counts (StepTimes.pipe_*): the two pipeline communicators' counters, from before
// the schedule (before) to after it, added to the step's times.
static void count_handoffs(Pipeline *p, CommCounters before[2]) {
    for (int k = 0; k < 2; k++) {
        Comm *c = k ? p->bwd : p->fwd;
        if (!c) continue;
        CommCounters now;
        comm_counters(c, &now);
        StepTimes *t = p->times;
        t->pipe_copies += (double)(now.copies - before[k].copies);
        t->pipe_copied_bytes += (double)(now.copied_bytes - before[k].copied_bytes);
        t->pipe_wakeups += (double)(now.progress_wakeups - before[k].progress_wakeups);
        t->pipe_sleeps += (double)(now.sleeps - before[k].sleeps);
        t->pipe_cond_waits += (double)(now.cond_waits - before[k].cond_waits);
    }
}

// --pp-times auto, after the first step: zb-v's lists rebuilt for the F, B and W times it measured, the
// mean over every rank's passes (sum[k] seconds over cnt[k] passes here; one all-reduce over the world,
// so that every rank builds the same lists), the fastest of the candidates that fit the chunk sets,
// weight-gradient stashes, head and gradient buffers the model was given (layout_place_stages:
// schedule_pool_auto of the unit lists);
// rank 0 says what it did in one line, with the times as a --pp-times value for later runs.
static void adopt_measured_times(Pipeline *p, int M, const double sum[3], const double cnt[3]) {
    const Layout *l = p->model->lay;
    int64_t mine[6], all[6];
    for (int k = 0; k < 3; k++) mine[k] = (int64_t)(sum[k] * 1e9), mine[3 + k] = (int64_t)cnt[k];
    if (l->world) comm_all_reduce(l->world, mine, all, 6, CT_I64, OP_SUM);
    else memcpy(all, mine, sizeof all);
    p->times_measured = 1;
    double t[3];
    for (int k = 0; k < 3; k++) t[k] = all[3 + k] > 0 && all[k] > 0 ? (double)all[k] / (double)all[3 + k] / 1e6 : 0; // ms
    if (!(t[0] > 0 && t[1] > 0 && t[2] > 0)) return;
    Schedule s;
    char why[256];
    const Schedule *u = &p->sched; // the unit lists, for which the model was allocated
    if (schedule_build_auto(&s, l->schedule, p->stages, M, p->chunks, t, why, sizeof why)) die("--pp-times auto: %s", why);
    int same = 1;
    for (int r = 0; r < p->stages; r++)
        if (s.n[r] != u->n[r] || memcmp(s.a[r], u->a[r], sizeof(Action) * (size_t)s.n[r])) same = 0;
    if (l->lead)
        printf("zb-v: the first step measured F, B, W = %.3f, %.3f, %.3f ms a chunk pass (--pp-times %.17g,%.17g,%.17g); %s\n", t[0],
               t[1], t[2], t[0], t[1], t[2],
               same ? "the unit-time lists stay, the fastest under those times of the lists that fit the memory allocated for them"
                    : "lists built for them from the next step");
    if (l->lead && !same)
        printf("zb-v: bubble under those times %.1f%%, the unit-time lists' %.1f%%\n", 100.0 * schedule_bubble(&s, t), 100.0 * schedule_bubble(u, t));
    fflush(stdout);
    if (same) {
        schedule_free(&s);
        return;
    }
    p->next = s; // (this step's lists stay until it is reported: --pp-schedule-dump names their actions)
}

double pipeline_step(Pipeline *p, const int32_t *inputs, const int32_t *targets, int M, int B, int T, float dloss) {
    CommCounters before[2] = { 0 };
    for (int k = 0; k < 2; k++)
        if (k ? p->bwd : p->fwd) comm_counters(k ? p->bwd : p->fwd, &before[k]);
    p->live = p->peak_live = 0;
    p->joins_left = p->chunks;
    p->trace_len = 0;
    if (p->trace) p->trace[0] = 0;
    if (p->next.n && p->next.m == M) { // --pp-times auto: the lists for the measured times
        schedule_free(&p->sched);
        p->sched = p->next;
        memset(&p->next, 0, sizeof p->next);
    }
    if (!p->sched.n || p->sched.m != M) {
        if (p->sched.n) schedule_free(&p->sched), p->times_measured = 0; // (another M: measured again)
        if (p->next.n) schedule_free(&p->next);
        char why[256];
        int kind = p->model->lay->schedule;
        if (schedule_build(&p->sched, kind, p->stages, M, p->chunks, layout_pass_times(p->model->lay), why, sizeof why))
            die("--pp-schedule %s: %s", SCHEDULE_NAMES[kind], why);
        // the model was allocated for the layout's M (layout_place_stages): these lists must fit it, or
        // sets mb % nslots and the head's ring would be shared by micro-batches in flight together
        const Layout *l = p->model->lay;
        SchedulePool have = { l->nslots, l->nheads, l->nstash, l->ngrads };
        if (!schedule_pool_fits(schedule_pool(&p->sched, p->stage), have, schedule_holds_head(&p->sched, p->stage)))
            die("internal: %s's lists for %d micro-batches need more activation sets, head buffers, stashes or gradient buffers "
                "than were allocated for %d",
                SCHEDULE_NAMES[kind], M, l->accum);
    }
    memset(p->set_busy, 0, sizeof(int) * (size_t)p->model->lay->nslots); // every W of the last step has run
    // hand-offs travel with the compute: an F receives its input just before and sends its output just
    // after, a B likewise its gradient, so the lists' send and receive actions need no separate step
    const Schedule *s = &p->sched;
    double loss = 0;
    if (p->keep_times && p->act_cap < s->n[p->stage]) {
        free(p->act_t);
        p->act_cap = s->n[p->stage];
        p->act_t = xmalloc(sizeof(double) * 2 * (size_t)p->act_cap);
    }
    // --pp-times auto: this step times each pass, from the end of its receive (device work waited for)
    int measure = p->model->lay->pp_times_auto && s->kind == SCHED_ZBV && !p->times_measured;
    double sum[3] = { 0 }, cnt[3] = { 0 };
    p->t0 = now_seconds();
    for (int i = 0; i < s->n[p->stage]; i++) {
        const Action *a = &s->a[p->stage][i];
        int pass = a->kind == ACT_F || a->kind == ACT_B || a->kind == ACT_W;
        if (measure && pass) p->model->be->sync();
        double t0 = p->keep_times || measure ? now_seconds() : 0;
        p->recv_end = -1;
        if (a->kind == ACT_F) loss += forward_op(p, inputs, targets, a->mb, a->chunk, B, T, dloss);
        else if (a->kind == ACT_B) backward_op(p, a->mb, a->chunk, M, B, T, dloss, s->split);
        else if (a->kind == ACT_W && s->split) weight_op(p, a->mb, a->chunk, M);
        if (measure && pass) {
            p->model->be->sync();
            sum[a->kind] += now_seconds() - (p->recv_end > t0 ? p->recv_end : t0);
            cnt[a->kind] += 1;
        }
        if (p->keep_times) keep_time(p, i, t0, now_seconds());
    }
    p->times->pipe_span_s = now_seconds() - p->t0;
    for (int k = 0; k < p->model->lay->nslots * p->chunks; k++) { // every hand-off of this step has left
        drain(&p->send_out[k]);
        drain(&p->send_grad[k]);
    }
    for (int g = 0; g < p->model->lay->ngrads; g++) drain(&p->send_gbuf[g]);
    count_handoffs(p, before);
    if (measure) adopt_measured_times(p, M, sum, cnt);
    return loss;
}

float pipeline_forward(Pipeline *p, const int32_t *inputs, const int32_t *targets, int B, int T) {
    GPT2 *m = p->model;
    if (p->stages == 1) return gpt2_forward(m, inputs, targets, B, T);
    size_t bytes = gpt2_stage_bytes(m, B, T);
    float loss = 0.0f;
    for (int c = 0; c < p->chunks; c++) { // through the virtual stages in order
        int from = prev_stage(p, c), to = next_stage(p, c), slot = m->lay->chunk_sets ? c : 0; // (chunk sets: set c)
        gpt2_bind_set(m, slot, c, 0);
        if (from >= 0) take_input(p, c, slot, m->lay->chunk_sets ? c - 1 : 0, bytes, from);
        float l = gpt2_forward_chunk(m, c, inputs, targets, B, T, 0.0f);
        if (to == p->stage) continue; // zb-v's turn: the next chunk takes it in place
        if (to >= 0) {
            CommRequest *r = send_from(p, p->fwd, gpt2_stage_output(m, c), bytes, to);
            drain(&r);
        } else {
            loss = l;
        }
    }
    return loss;
}

// schedule.c: the pipeline schedules as per-rank action lists (schedule.h), their unit-time timeline,
// and the printout of both for a reader.
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

const char *const SCHEDULE_NAMES[SCHED_COUNT] = { "1f1b", "interleaved", "zb-h1", "zb-v" };
const char *const ACTION_NAMES[ACT_NKINDS] = { "F", "B", "W", "send-act", "recv-act", "send-grad", "recv-grad" };

int schedule_parse(const char *name) {
    for (int k = 0; k < SCHED_COUNT; k++)
        if (!strcmp(name, SCHEDULE_NAMES[k])) return k;
    return -1;
}

int schedule_vstage(const Schedule *s, int r, int c) {
    if (s->kind == SCHED_ZBV) return c == 0 ? r : 2 * s->p - 1 - r;
    return c * s->p + r;
}

// the (rank, chunk) holding virtual stage vs, or -1 past the model's ends
static void owner_of(const Schedule *s, int vs, int *r, int *c) {
    *r = *c = -1;
    for (int rr = 0; rr < s->p; rr++)
        for (int cc = 0; cc < s->v; cc++)
            if (schedule_vstage(s, rr, cc) == vs) *r = rr, *c = cc;
}
int schedule_holds_head(const Schedule *s, int r) { return schedule_vstage(s, r, s->v - 1) == s->p * s->v - 1; }
void schedule_prev(const Schedule *s, int r, int c, int *pr, int *pc) { owner_of(s, schedule_vstage(s, r, c) - 1, pr, pc); }
void schedule_next(const Schedule *s, int r, int c, int *nr, int *nc) { owner_of(s, schedule_vstage(s, r, c) + 1, nr, nc); }

// One rank's compute actions in order, before the hand-offs are added.
typedef struct {
    Action *a;
    int n, cap;
} List;

static void push(List *l, int kind, int mb, int chunk, int peer) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        Action *a = realloc(l->a, sizeof(Action) * (size_t)l->cap);
        if (!a) die("out of memory");
        l->a = a;
    }
    l->a[l->n++] = (Action){ kind, mb, chunk, peer };
}

// 1f1b and interleaved: the k-th forward (or backward) of a rank is op_at(k), as pipeline.c runs them;
// each W right after its B.
static void op_at(int p, int v, int k, int backward, int *mb, int *chunk) {
    if (v == 1) {
        *mb = k, *chunk = 0;
        return;
    }
    *mb = (k / (p * v)) * p + k % p;
    *chunk = (k / p) % v;
    if (backward) *chunk = v - 1 - *chunk;
}
static void order_1f1b(List *l, int p, int m, int v, int r) {
    int total = m * v, warm = v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p, mb, c;
    if (warm > total) warm = total;
    for (int k = 0; k < warm; k++) {
        op_at(p, v, k, 0, &mb, &c);
        push(l, ACT_F, mb, c, -1);
    }
    for (int i = 0; i < total; i++) {
        if (warm + i < total) {
            op_at(p, v, warm + i, 0, &mb, &c);
            push(l, ACT_F, mb, c, -1);
        }
        op_at(p, v, i, 1, &mb, &c);
        push(l, ACT_B, mb, c, -1);
        push(l, ACT_W, mb, c, -1);
    }
}

// zb-h1: 1f1b's F and B order; rank r keeps r Ws pending through the steady state (one W after each B
// once more than r are pending), so each rank holds min(p, m) micro-batches, and runs the rest at the end.
static void order_zbh1(List *l, int p, int m, int r) {
    int warm = p - r - 1 < m ? p - r - 1 : m, nextw = 0;
    for (int k = 0; k < warm; k++) push(l, ACT_F, k, 0, -1);
    for (int i = 0; i < m; i++) {
        if (warm + i < m) push(l, ACT_F, warm + i, 0, -1);
        push(l, ACT_B, i, 0, -1);
        if (i + 1 - nextw > r) push(l, ACT_W, nextw++, 0, -1);
    }
    while (nextw < m) push(l, ACT_W, nextw++, 0, -1);
}

// zb-v by list scheduling (schedule.h), F, B and W taking times[0..2] (unit times: the paper's): at
// time t each rank that is free (in rank order) sees what finished by t and starts one action; then
// the clock moves to the next moment a rank becomes free. reserve 1 keeps the last of a rank's 2p
// activation slots for a chunk-1 forward: with some times (B about twice F) a first stage can fill its
// slots with chunk-0 forwards while the gradients it waits for need its chunk-1 forward, and the
// greedy then stalls. -1 when it stalls (nothing runs and nothing will finish), else 0.
static int order_zbv(const Schedule *s, const double times[3], int reserve, List *lists) {
    int p = s->p, m = s->m, V = 2 * p, cap = 2 * p;
    // done[(mb·V + vs)·2 + 0/1]: when F / B of micro-batch mb at virtual stage vs finished (-1: not yet)
    double *done = xmalloc(sizeof(double) * (size_t)m * V * 2), *free_at = xcalloc((size_t)p, sizeof(double));
    for (size_t i = 0; i < (size_t)m * V * 2; i++) done[i] = -1;
    int *nf = xcalloc((size_t)p * 2, sizeof(int)), *nb = xcalloc((size_t)p * 2, sizeof(int));
    int *nw = xcalloc((size_t)p * 2, sizeof(int)), *live = xcalloc((size_t)p, sizeof(int));
    int left = 6 * p * m;
#define DONE(mb, vs, b) done[((size_t)(mb) * V + (vs)) * 2 + (b)]
    for (double t = 0; left > 0;) {
        for (int r = 0; r < p; r++) {
            if (free_at[r] > t) continue;
            int kind = -1, c = -1;
            for (int cc = 0; cc < 2 && kind < 0; cc++) { // B first, chunk 0 first: it ends a micro-batch
                int mb = nb[r * 2 + cc], vs = schedule_vstage(s, r, cc);
                if (mb >= m || nf[r * 2 + cc] <= mb) continue;
                double d = vs == V - 1 ? DONE(mb, vs, 0) : DONE(mb, vs + 1, 1);
                if (d >= 0 && d <= t) kind = ACT_B, c = cc;
            }
            for (int cc = 1; cc >= 0 && kind < 0 && live[r] < cap; cc--) { // F, chunk 1 first
                int mb = nf[r * 2 + cc], vs = schedule_vstage(s, r, cc);
                if (mb >= m || (cc == 0 && live[r] >= cap - reserve)) continue;
                double d = vs == 0 ? 0 : DONE(mb, vs - 1, 0);
                if (d >= 0 && d <= t) kind = ACT_F, c = cc;
            }
            if (kind < 0) { // the oldest pending W (chunk 1 on a tie: W in backward order, so each
                int best = -1; // unit's last gradient is in before the units below it, as ZeRO's buckets need)
                for (int cc = 1; cc >= 0; cc--)
                    if (nw[r * 2 + cc] < nb[r * 2 + cc] && (best < 0 || nw[r * 2 + cc] < nw[r * 2 + best])) best = cc;
                if (best >= 0) kind = ACT_W, c = best;
            }
            if (kind < 0) continue;
            int vs = schedule_vstage(s, r, c);
            free_at[r] = t + times[kind]; // (the same double that DONE holds, so "finished by t" is exact)
            if (kind == ACT_F) {
                DONE(nf[r * 2 + c], vs, 0) = free_at[r];
                push(&lists[r], ACT_F, nf[r * 2 + c]++, c, -1);
                live[r]++;
            } else if (kind == ACT_B) {
                DONE(nb[r * 2 + c], vs, 1) = free_at[r];
                push(&lists[r], ACT_B, nb[r * 2 + c]++, c, -1);
            } else {
                push(&lists[r], ACT_W, nw[r * 2 + c]++, c, -1);
                live[r]--;
            }
            left--;
        }
        double next = -1; // the next moment a rank becomes free: only then can anything change
        for (int r = 0; r < p; r++)
            if (free_at[r] > t && (next < 0 || free_at[r] < next)) next = free_at[r];
        if (next < 0) break; // done, or stalled
        t = next;
    }
#undef DONE
    free(done);
    free(free_at);
    free(nf);
    free(nb);
    free(nw);
    free(live);
    return left > 0 ? -1 : 0;
}

// Chunk sets (v > 1): each F takes the lowest free set, which its chunk's activations hold until their
// W. A hand-off is read in place from where it was sent (the receiver copies it out), so before that
// memory is written again the rank drains the send, waiting until it has been received; such a drain
// must never wait for a rank that waits for this one. Freed at W alone, an interleaved set still held
// its B's input gradient when the next F took it, and that drain waited for a previous stage that was
// waiting for that F: a deadlock; zb-v's drains, freed so, ran to the end but waited for busy receivers
// under unequal F, B, W times. So memory is reused only once the rank knows each send from it received
// (a message the receiver sent after its receive has arrived: direct knowledge only, sound if not the
// least), and no drain waits, whatever the timing (test_schedule's simulation checks both):
//   - the activation a chunk sends on is known received by its W (the gradient that came back was sent
//     after it): a set is free after its W;
//   - the input gradient a B sends back leaves from a gradient buffer of its own (pipeline.c copies it
//     there, R·C elements), taken at the send and free once it is known received: a ring beside the
//     sets, where the set itself would have stayed taken (a whole chunk's activations) as long.
typedef struct {
    int *send_at, *recv_at; // per message (micro-batch, producing virtual stage, direction): the action index, -1 none
} Messages;
static size_t msg_id(const Schedule *s, int mb, int producer_vs, int grad) { return ((size_t)mb * s->p * s->v + producer_vs) * 2 + grad; }
// The message an action sends or receives (-1: a compute action).
static long action_msg(const Schedule *s, int r, const Action *a) {
    int vs = schedule_vstage(s, r, a->chunk);
    if (a->kind == ACT_SEND_ACT || a->kind == ACT_SEND_GRAD) return (long)msg_id(s, a->mb, vs, a->kind == ACT_SEND_GRAD);
    if (a->kind == ACT_RECV_ACT) return (long)msg_id(s, a->mb, vs - 1, 0);
    if (a->kind == ACT_RECV_GRAD) return (long)msg_id(s, a->mb, vs + 1, 1);
    return -1;
}
static Messages messages(const Schedule *s) {
    size_t n = (size_t)s->m * s->p * s->v * 2;
    Messages g = { xmalloc(sizeof(int) * n), xmalloc(sizeof(int) * n) };
    for (size_t k = 0; k < n; k++) g.send_at[k] = g.recv_at[k] = -1;
    for (int r = 0; r < s->p; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const Action *a = &s->a[r][i];
            long k = action_msg(s, r, a);
            if (k < 0) continue;
            if (a->kind == ACT_SEND_ACT || a->kind == ACT_SEND_GRAD) g.send_at[k] = i;
            else g.recv_at[k] = i;
        }
    return g;
}

// Per rank r, for each (mb, c) at mb·v + c: the action after which its set is free (its W; its
// activation's send known received) and after which its gradient buffer is (its input gradient's send
// known received).
static void release_points(const Schedule *s, const Messages *g, int r, int *set_free, int *grad_free) {
    int n = s->n[r], p = s->p, v = s->v;
    int *known = xmalloc(sizeof(int) * (size_t)p * (n ? n : 1)), *last = xmalloc(sizeof(int) * (size_t)p);
    for (int q = 0; q < p; q++) last[q] = -1;
    for (int i = 0; i < n; i++) { // known[q·n + i]: the latest action of q known done after action i
        const Action *a = &s->a[r][i];
        long k = action_msg(s, r, a); // (a hand-off's peer: the rank that sent it)
        if (k >= 0 && (a->kind == ACT_RECV_ACT || a->kind == ACT_RECV_GRAD) && g->send_at[k] > last[a->peer]) last[a->peer] = g->send_at[k];
        for (int q = 0; q < p; q++) known[q * n + i] = last[q];
    }
    for (int i = 0; i < n; i++) {
        const Action *a = &s->a[r][i];
        size_t k = (size_t)a->mb * v + a->chunk;
        if (a->kind == ACT_F) set_free[k] = i;
        if (a->kind == ACT_W) set_free[k] = set_free[k] > i ? set_free[k] : i;
        if (a->kind != ACT_SEND_ACT && a->kind != ACT_SEND_GRAD) continue;
        long msg = action_msg(s, r, a);
        int q = a->peer, j = i + 1; // (the receiver)
        while (j < n && known[q * n + j] <= g->recv_at[msg]) j++; // q sent something after its receive
        int *at = a->kind == ACT_SEND_GRAD ? &grad_free[k] : &set_free[k];
        if (a->kind == ACT_SEND_GRAD || j > *at) *at = j;
    }
    free(known), free(last);
}

// The lowest of *count buffers free before action i (free_after[b] < i), taken until `until`.
static int take_lowest(int *free_after, int *count, int i, int until) {
    int b = 0;
    while (b < *count && free_after[b] >= i) b++;
    if (b == *count) ++*count;
    free_after[b] = until;
    return b;
}

static void take_sets(Schedule *s, const Messages *g) {
    int p = s->p, m = s->m, v = s->v;
    size_t mv = (size_t)m * v;
    int *set_free = xmalloc(sizeof(int) * mv), *grad_free = xmalloc(sizeof(int) * mv);
    int *sets = xmalloc(sizeof(int) * mv), *grads = xmalloc(sizeof(int) * mv);
    for (int r = 0; r < p; r++) {
        release_points(s, g, r, set_free, grad_free);
        int nsets = 0, ngrads = 0;
        for (int i = 0; i < s->n[r]; i++) {
            const Action *a = &s->a[r][i];
            size_t k = (size_t)a->mb * v + a->chunk, at = (size_t)r * mv + k;
            if (a->kind == ACT_F) s->cset[at] = take_lowest(sets, &nsets, i, set_free[k]);
            if (a->kind == ACT_SEND_GRAD) s->gbuf[at] = take_lowest(grads, &ngrads, i, grad_free[k]);
        }
        s->csets[r] = nsets;
        s->gbufs[r] = ngrads;
    }
    free(set_free), free(grad_free), free(sets), free(grads);
}

static void assign_chunk_sets(Schedule *s) {
    s->cset = xmalloc(sizeof(int) * (size_t)s->p * s->m * s->v);
    s->gbuf = xmalloc(sizeof(int) * (size_t)s->p * s->m * s->v);
    for (size_t i = 0; i < (size_t)s->p * s->m * s->v; i++) s->gbuf[i] = -1;
    s->csets = xcalloc((size_t)s->p, sizeof(int));
    s->gbufs = xcalloc((size_t)s->p, sizeof(int));
    Messages g = messages(s);
    take_sets(s, &g);
    free(g.send_at), free(g.recv_at);
}

// The lists of one schedule for times t (reserve: order_zbv's); -1 with why for what does not fit, -2
// when zb-v's list scheduling stalls for these times.
static int build(Schedule *s, int kind, int p, int m, int v, const double t[3], int reserve, char *why, size_t cap) {
    memset(s, 0, sizeof *s);
    if (kind < 0 || kind >= SCHED_COUNT) return snprintf(why, cap, "unknown pipeline schedule"), -1;
    const char *name = SCHEDULE_NAMES[kind];
    if (p < 1 || m < 1 || v < 1) return snprintf(why, cap, "--pp-schedule %s: needs --pp, --micro-batches and --pp-virtual >= 1", name), -1;
    if ((kind == SCHED_1F1B || kind == SCHED_ZBH1) && v != 1)
        return snprintf(why, cap, "--pp-schedule %s runs one chunk per rank (--pp-virtual 1, not %d)", name, v), -1;
    if (kind == SCHED_ZBV && v != 2) return snprintf(why, cap, "--pp-schedule zb-v runs two chunks per rank (--pp-virtual 2, not %d)", v), -1;
    if (kind == SCHED_INTERLEAVED && v > 1 && m % p)
        return snprintf(why, cap, "--pp-schedule interleaved: --micro-batches %d must be a multiple of --pp %d", m, p), -1;
    s->kind = kind, s->p = p, s->m = m, s->v = v;
    s->split = kind == SCHED_ZBH1 || kind == SCHED_ZBV;
    List *lists = xcalloc((size_t)p, sizeof(List));
    memcpy(s->times, t, sizeof s->times);
    if (kind == SCHED_ZBV && order_zbv(s, t, reserve, lists)) {
        for (int r = 0; r < p; r++) free(lists[r].a);
        free(lists);
        memset(s, 0, sizeof *s);
        return snprintf(why, cap, "zb-v's list scheduling stalls for F, B, W = %g, %g, %g", t[0], t[1], t[2]), -2;
    }
    for (int r = 0; r < p; r++) {
        if (kind == SCHED_1F1B || kind == SCHED_INTERLEAVED) order_1f1b(&lists[r], p, m, v, r);
        if (kind == SCHED_ZBH1) order_zbh1(&lists[r], p, m, r);
    }
    s->n = xcalloc((size_t)p, sizeof(int));
    s->a = xcalloc((size_t)p, sizeof(Action *));
    s->bound = xcalloc((size_t)p, sizeof(int));
    s->slots = xcalloc((size_t)p, sizeof(int));
    s->wpending = xcalloc((size_t)p, sizeof(int));
    s->live = xcalloc((size_t)p, sizeof(int));
    s->hspan = xcalloc((size_t)p, sizeof(int));
    int *inflight = xcalloc((size_t)m, sizeof(int)); // chunks of each micro-batch between F and W
    for (int r = 0; r < p; r++) {
        List out = { 0 };
        for (int i = 0; i < lists[r].n; i++) { // the hand-offs around each compute action
            Action a = lists[r].a[i];
            int pr, pc, nr, nc;
            schedule_prev(s, r, a.chunk, &pr, &pc);
            schedule_next(s, r, a.chunk, &nr, &nc);
            if (a.kind == ACT_F && pr >= 0 && pr != r) push(&out, ACT_RECV_ACT, a.mb, a.chunk, pr);
            if (a.kind == ACT_B && nr >= 0 && nr != r) push(&out, ACT_RECV_GRAD, a.mb, a.chunk, nr);
            push(&out, a.kind, a.mb, a.chunk, -1);
            if (a.kind == ACT_F && nr >= 0 && nr != r) push(&out, ACT_SEND_ACT, a.mb, a.chunk, nr);
            // the input gradient leaves after B, or after the W that directly follows it (one merged
            // backward, as pipeline.c ran it before the split)
            if (a.kind == (s->split ? ACT_B : ACT_W) && pr >= 0 && pr != r) push(&out, ACT_SEND_GRAD, a.mb, a.chunk, pr);
        }
        free(lists[r].a);
        s->n[r] = out.n;
        s->a[r] = out.a;
        // the stated bounds (schedule.h)
        int total = m * v, b;
        if (kind == SCHED_1F1B) b = p - r;
        else if (kind == SCHED_INTERLEAVED) b = (v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p) + 1;
        else if (kind == SCHED_ZBH1) b = p;
        else b = 2 * p;
        s->bound[r] = b < total ? b : total;
        // activation sets for micro-batch mb in set mb % slots: the widest span of micro-batches in flight
        memset(inflight, 0, sizeof(int) * (size_t)m);
        int lo = 0, hi = -1;
        for (int i = 0; i < out.n; i++) {
            Action a = out.a[i];
            if (a.kind == ACT_F) inflight[a.mb]++, hi = a.mb > hi ? a.mb : hi;
            if (a.kind == ACT_W) inflight[a.mb]--;
            while (lo < m && lo <= hi && inflight[lo] == 0) lo++;
            if (hi - lo + 1 > s->slots[r]) s->slots[r] = hi - lo + 1;
        }
        memset(inflight, 0, sizeof(int) * (size_t)m); // the last chunk's span from F to B
        lo = 0, hi = -1;
        for (int i = 0; i < out.n; i++) {
            Action a = out.a[i];
            if (a.chunk != v - 1 || (a.kind != ACT_F && a.kind != ACT_B)) continue;
            if (a.kind == ACT_F) inflight[a.mb] = 1, hi = a.mb > hi ? a.mb : hi;
            else inflight[a.mb] = 0;
            while (lo < m && lo <= hi && inflight[lo] == 0) lo++;
            if (hi - lo + 1 > s->hspan[r]) s->hspan[r] = hi - lo + 1;
        }
        for (int i = 0, n = 0; i < out.n; i++) {
            if (out.a[i].kind == ACT_F && ++n > s->live[r]) s->live[r] = n;
            if (out.a[i].kind == ACT_W) n--;
        }
        int *pend = xcalloc((size_t)v, sizeof(int)); // per chunk: B done, W not
        for (int i = 0; i < out.n; i++) {
            Action a = out.a[i];
            if (a.kind == ACT_B && ++pend[a.chunk] > s->wpending[r]) s->wpending[r] = pend[a.chunk];
            if (a.kind == ACT_W) pend[a.chunk]--;
        }
        free(pend);
    }
    free(inflight);
    free(lists);
    if (v > 1) assign_chunk_sets(s);
    return 0;
}

#define ZBV_SEARCH_ACTIONS 49152 // (p 8 x m 1024; a build of that size takes about a millisecond)
// schedule_build, keeping only lists that run in what have[r] allocates on every rank r (NULL: any)
static int build_within(Schedule *s, int kind, int p, int m, int v, const double *times, const SchedulePool *have, char *why,
                        size_t cap) {
    static const double unit[3] = { 1, 1, 1 };
    memset(s, 0, sizeof *s);
    const double *t = times ? times : unit;
    if (!(t[0] > 0 && t[1] > 0 && t[2] > 0 && t[0] < 1e9 && t[1] < 1e9 && t[2] < 1e9))
        return snprintf(why, cap, "--pp-times: F, B and W must be positive numbers"), -1;
    int unit_times = t[0] == 1 && t[1] == 1 && t[2] == 1;
    if (kind != SCHED_ZBV || unit_times) {
        int rc = build(s, kind, p, m, v, t, 0, why, cap);
        if (rc == -2) die("internal: %s", why); // (test_schedule: never with unit times, p <= 8, m <= 64)
        return rc ? -1 : 0;
    }
    // other times: the list scheduler is greedy, and its lists depend on the times in ways no rule
    // predicts (at PP 2, M 8 the lists for F, B, W = 1, 0.85, 0.44 leave 6.8% idle under those times,
    // lists for some of the scaled times below only 2.7%, the least any zb-v list can: the first
    // activation's walk). So it searches: lists for the given times with B and W scaled by the factors
    // below, each plain and with a slot kept for chunk 1 (which stalled in none of the cases tried
    // where the plain one did), and the unit-time lists; the fastest under the given times is kept
    // (the first of equals). Lists of more than ZBV_SEARCH_ACTIONS compute actions try the given times
    // and the unit lists alone.
    static const double fw[] = { 1, 0.6, 0.8, 1.25, 1.6 }, fb[] = { 1, 0.8, 1.25 };
    enum { NW = sizeof fw / sizeof fw[0], NB = sizeof fb / sizeof fb[0], NCAND = 2 * NW * NB + 1 };
    double ct[NCAND][3];
    int cres[NCAND], nc = 0, search = 6L * p * m <= ZBV_SEARCH_ACTIONS;
    for (int a = 0; a < (search ? NW : 1); a++)
        for (int b = 0; b < (search ? NB : 1); b++)
            for (int r = 0; r < 2; r++) ct[nc][0] = t[0], ct[nc][1] = t[1] * fb[b], ct[nc][2] = t[2] * fw[a], cres[nc++] = r;
    memcpy(ct[nc], unit, sizeof ct[nc]), cres[nc++] = 0;
    double best = -1;
    for (int k = 0; k < nc; k++) {
        Schedule c;
        int rc = build(&c, kind, p, m, v, ct[k], cres[k], why, cap);
        if (rc == -1) { // what does not fit (the same for every candidate)
            if (best >= 0) schedule_free(s);
            return -1;
        }
        if (rc == -2) continue;
        int fits = 1;
        for (int r = 0; have && r < p; r++) fits &= schedule_pool_fits(schedule_pool(&c, r), have[r], schedule_holds_head(&c, r));
        if (!fits) { // (have from the unit lists: the last candidate fits)
            schedule_free(&c);
            continue;
        }
        double tc = schedule_times(&c, t[0], t[1], t[2], NULL);
        if (tc >= 0 && (best < 0 || tc < best)) {
            if (best >= 0) schedule_free(s);
            *s = c, best = tc;
        } else {
            schedule_free(&c);
        }
    }
    if (best < 0) die("internal: no zb-v lists for F, B, W = %g, %g, %g", t[0], t[1], t[2]);
    memcpy(s->times, t, sizeof s->times);
    return 0;
}

int schedule_build(Schedule *s, int kind, int p, int m, int v, const double *times, char *why, size_t cap) {
    return build_within(s, kind, p, m, v, times, NULL, why, cap);
}

int schedule_build_auto(Schedule *s, int kind, int p, int m, int v, const double times[3], char *why, size_t cap) {
    Schedule u;
    if (schedule_build(&u, kind, p, m, v, NULL, why, cap)) return -1;
    SchedulePool *have = xmalloc(sizeof(SchedulePool) * (size_t)p);
    for (int r = 0; r < p; r++) have[r] = schedule_pool_auto(&u, r);
    int rc = build_within(s, kind, p, m, v, times, have, why, cap);
    free(have);
    schedule_free(&u);
    return rc;
}

void schedule_free(Schedule *s) {
    for (int r = 0; s->a && r < s->p; r++) free(s->a[r]);
    free(s->a);
    free(s->n);
    free(s->bound);
    free(s->slots);
    free(s->wpending);
    free(s->live);
    free(s->hspan);
    free(s->cset);
    free(s->csets);
    free(s->gbuf);
    free(s->gbufs);
    memset(s, 0, sizeof *s);
}

double schedule_times(const Schedule *s, double tf, double tb, double tw, double **start) {
    int p = s->p, nv = p * s->v;
    size_t nmsg = (size_t)s->m * nv * 2;
    double *posted = xmalloc(sizeof(double) * nmsg), *clock = xcalloc((size_t)p, sizeof(double)), end = 0;
    for (size_t i = 0; i < nmsg; i++) posted[i] = -1;
    int *at = xcalloc((size_t)p, sizeof(int)), left = 0;
    for (int r = 0; r < p; r++) left += s->n[r];
    for (int progress = 1; left > 0 && progress;) {
        progress = 0;
        for (int r = 0; r < p; r++)
            for (; at[r] < s->n[r]; at[r]++, left--, progress = 1) {
                const Action *a = &s->a[r][at[r]];
                int vs = schedule_vstage(s, r, a->chunk);
                double *st = start ? &start[r][at[r]] : NULL;
                if (st) *st = -1;
                if (a->kind == ACT_SEND_ACT || a->kind == ACT_SEND_GRAD) {
                    posted[((size_t)a->mb * nv + vs) * 2 + (a->kind == ACT_SEND_GRAD)] = clock[r];
                } else if (a->kind == ACT_RECV_ACT || a->kind == ACT_RECV_GRAD) {
                    int grad = a->kind == ACT_RECV_GRAD, from = grad ? vs + 1 : vs - 1;
                    double t = posted[((size_t)a->mb * nv + from) * 2 + grad];
                    if (t < 0) break; // blocked until the peer sends
                    if (t > clock[r]) clock[r] = t;
                } else {
                    if (st) *st = clock[r];
                    clock[r] += a->kind == ACT_F ? tf : a->kind == ACT_B ? tb : tw;
                }
            }
    }
    for (int r = 0; r < p; r++)
        if (clock[r] > end) end = clock[r];
    free(posted);
    free(clock);
    free(at);
    return left ? -1 : end;
}

// An action's name in the printout: F/B/W<mb> with chunk letter a, b, ... when v > 1; compact (--ascii,
// at most two chunks): the chunk in the letter's case instead (F3 chunk 0, f3 chunk 1), so a cell stays narrow.
static int label(char *buf, size_t cap, const Schedule *s, const Action *a, int compact) {
    char ch[4] = "";
    if (s->v > 1 && !compact) snprintf(ch, sizeof ch, "%c", 'a' + a->chunk);
    switch (a->kind) {
    case ACT_SEND_ACT: return snprintf(buf, cap, "sa%d%s>%d", a->mb, ch, a->peer);
    case ACT_RECV_ACT: return snprintf(buf, cap, "ra%d%s<%d", a->mb, ch, a->peer);
    case ACT_SEND_GRAD: return snprintf(buf, cap, "sg%d%s>%d", a->mb, ch, a->peer);
    case ACT_RECV_GRAD: return snprintf(buf, cap, "rg%d%s<%d", a->mb, ch, a->peer);
    default: return snprintf(buf, cap, "%c%d%s", compact && a->chunk == 1 ? ACTION_NAMES[a->kind][0] + ('a' - 'A') : ACTION_NAMES[a->kind][0],
                             a->mb, ch);
    }
}

void schedule_dump(FILE *f, const Schedule *s, int ascii_only) {
    int p = s->p, compact = ascii_only && s->v <= 2;
    if (ascii_only) {
        fprintf(f, "%s, p = %d, m = %d%s: F/B/W<micro-batch>%s, . idle\n", SCHEDULE_NAMES[s->kind], p, s->m,
                s->v > 1 ? (s->kind == SCHED_ZBV ? ", 2 chunks per rank in a V" : ", v = 2") : "",
                compact && s->v > 1 ? " (lower case: the rank's second chunk)" : "");
        if (s->v > 2) fprintf(f, "v = %d: chunk letters a, b, ... after the micro-batch\n", s->v);
    } else {
        fprintf(f, "schedule %s: %d ranks, %d micro-batches, %d chunk%s per rank%s\n", SCHEDULE_NAMES[s->kind], p, s->m, s->v,
            s->v > 1 ? "s" : "", s->split ? "; B and W apart" : "; each W right after its B");
    fprintf(f, "actions: F/B/W<mb>%s; sa/ra = send/receive activation, sg/rg = send/receive gradient, >peer <peer\n",
            s->v > 1 ? "<chunk a, b, ...>" : "");
    }
    char buf[64];
    for (int r = 0; r < p && !ascii_only; r++) {
        SchedulePool q = schedule_pool(s, r);
        fprintf(f, "rank %d (bound %d chunk activations, %d activation sets", r, s->bound[r], q.sets);
        if (q.grads) fprintf(f, ", %d gradient buffer%s", q.grads, q.grads > 1 ? "s" : "");
        if (schedule_holds_head(s, r)) fprintf(f, ", %d head buffer%s", q.heads, q.heads > 1 ? "s" : "");
        fprintf(f, "):");
        for (int i = 0; i < s->n[r]; i++) {
            label(buf, sizeof buf, s, &s->a[r][i], 0);
            fprintf(f, " %s", buf);
        }
        fprintf(f, "\n");
    }
    double **start = xmalloc(sizeof(double *) * (size_t)p);
    for (int r = 0; r < p; r++) start[r] = xmalloc(sizeof(double) * (size_t)(s->n[r] ? s->n[r] : 1));
    double T = schedule_times(s, 1, 1, 1, start);
    if (T < 0) {
        fprintf(f, "timeline: the action lists deadlock\n");
    } else {
        int width = 2, cells = (int)T;
        for (int r = 0; r < p; r++)
            for (int i = 0; i < s->n[r]; i++) {
                int w = label(buf, sizeof buf, s, &s->a[r][i], compact);
                if (start[r][i] >= 0 && w > width) width = w;
            }
        if (!ascii_only) fprintf(f, "timeline (F = B = W = 1 unit, hand-offs free; . idle), %d units:\n", cells);
        char *row = xmalloc((size_t)cells * (width + 1) + 1);
        long busy = 0;
        for (int r = 0; r < p; r++) {
            for (int c = 0; c < cells; c++) {
                memset(row + (size_t)c * (width + 1), ' ', (size_t)width + 1);
                row[(size_t)c * (width + 1)] = '.';
            }
            row[(size_t)cells * (width + 1)] = 0;
            for (int i = 0; i < s->n[r]; i++) {
                if (start[r][i] < 0) continue;
                int w = label(buf, sizeof buf, s, &s->a[r][i], compact);
                memcpy(row + (size_t)start[r][i] * (width + 1), buf, (size_t)w);
                busy++;
            }
            for (char *e = row + strlen(row); e > row && e[-1] == ' ';) *--e = 0;
            fprintf(f, "rank %d | %s\n", r, row);
        }
        free(row);
        fprintf(f, "bubble: %.1f%% of %d ranks x %d units idle\n", 100.0 * (1.0 - (double)busy / ((double)p * cells)), p, cells);
    }
    if (!ascii_only && s->kind == SCHED_ZBV && (s->times[0] != 1 || s->times[1] != 1 || s->times[2] != 1)) {
        // what building for the given times buys, under those times: against the unit-time lists
        Schedule u;
        char why[256];
        double b = schedule_bubble(s, s->times), bu = -1;
        if (!schedule_build(&u, s->kind, p, s->m, s->v, NULL, why, sizeof why)) {
            bu = schedule_bubble(&u, s->times);
            schedule_free(&u);
        }
        if (b >= 0 && bu >= 0)
            fprintf(f, "lists built for F, B, W = %g, %g, %g (--pp-times); under those times bubble %.1f%%, the unit-time lists' %.1f%%\n",
                    s->times[0], s->times[1], s->times[2], 100.0 * b, 100.0 * bu);
    }
    for (int r = 0; r < p; r++) free(start[r]);
    free(start);
}

void schedule_write_dump(FILE *f, const Schedule *s, const char *times, double **start, double **end) {
    fprintf(f, "# llm4d pipeline schedule dump 1\n# schedule %s p %d m %d v %d split %d times %s\n", SCHEDULE_NAMES[s->kind], s->p,
            s->m, s->v, s->split, times);
    fprintf(f, "rank\tindex\taction\tmb\tchunk\tpeer\tstart\tend\n");
    for (int r = 0; r < s->p; r++)
        for (int i = 0; i < s->n[r]; i++) {
            const Action *a = &s->a[r][i];
            fprintf(f, "%d\t%d\t%s\t%d\t%d\t%d\t", r, i, ACTION_NAMES[a->kind], a->mb, a->chunk, a->peer);
            if (start && start[r][i] >= 0) fprintf(f, "%.6f\t%.6f\n", start[r][i], end[r][i]);
            else fprintf(f, "-\t-\n");
        }
}

// The dump of the schedule's own unit-time timeline (./train schedule --pp-schedule-dump).
static void write_unit_dump(const char *path, const Schedule *s) {
    char target[SAFE_PATH_MAX], err[2 * SAFE_PATH_MAX + 256]; // as training checks it: no data file, no missing directory
    if (safe_check("--pp-schedule-dump", path, target, sizeof target, err, sizeof err) < 0) die("%s", err);
    double **start = xmalloc(sizeof(double *) * (size_t)s->p), **end = xmalloc(sizeof(double *) * (size_t)s->p);
    for (int r = 0; r < s->p; r++) {
        start[r] = xmalloc(sizeof(double) * (size_t)(s->n[r] ? s->n[r] : 1));
        end[r] = xmalloc(sizeof(double) * (size_t)(s->n[r] ? s->n[r] : 1));
    }
    if (schedule_times(s, 1, 1, 1, start) < 0) die("--pp-schedule-dump: the %s action lists deadlock", SCHEDULE_NAMES[s->kind]);
    for (int r = 0; r < s->p; r++)
        for (int i = 0; i < s->n[r]; i++) end[r][i] = start[r][i] + 1;
    FILE *f = xfopen(path, "w");
    schedule_write_dump(f, s, "unit", start, end);
    xfclose(f, path);
    for (int r = 0; r < s->p; r++) free(start[r]), free(end[r]);
    free(start);
    free(end);
}

void schedule_check_times_kind(int kind, const char *value) {
    if (value && kind != SCHED_ZBV)
        die("--pp-times %s: only zb-v's action lists are built for pass times (--pp-schedule zb-v); %s is a fixed order", value,
            kind >= 0 ? SCHEDULE_NAMES[kind] : "the default schedule");
}

int schedule_pool_fits(SchedulePool need, SchedulePool have, int head) {
    return need.sets <= have.sets && (!head || !have.heads || need.heads <= have.heads) && need.stashes <= have.stashes &&
           need.grads <= have.grads;
}

SchedulePool schedule_pool_auto(const Schedule *unit, int r) {
    SchedulePool q = schedule_pool(unit, r);
    if (unit->v > 1 && q.grads < q.sets) q.grads = q.sets;
    return q;
}

SchedulePool schedule_pool(const Schedule *s, int r) {
    SchedulePool q = { s->slots[r], s->hspan[r], s->split ? s->wpending[r] : 0, 0 };
    if (s->v > 1) { // a micro-batch's chunks are in flight apart: a pool of chunk sets, gradient buffers
        q.sets = s->csets[r] > s->v ? s->csets[r] : s->v; // (v: the validation forward's one of each)
        q.grads = s->gbufs[r];
    }
    return q;
}

double schedule_bubble(const Schedule *s, const double t[3]) {
    double span = schedule_times(s, t[0], t[1], t[2], NULL);
    return span > 0 ? 1.0 - (double)s->m * s->v * (t[0] + t[1] + t[2]) / span : -1;
}

void schedule_parse_times(const char *flag, const char *v, double times[3]) {
    if (!strcmp(v, "auto")) die("%s auto measures the times in a training run (./train --pp-times auto); give F,B,W or unit here", flag);
    if (!strcmp(v, "unit")) { // the paper's lists: schedule_build takes exactly 1, 1, 1 as unit times
        times[0] = times[1] = times[2] = 1;
        return;
    }
    static const char *const names[3] = { "F", "B", "W" };
    const char *p = v;
    for (int k = 0; k < 3; k++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char part[64], label[96];
        if (len == 0 || len >= sizeof part || (k < 2) != (end != NULL))
            die("%s '%s': expected F,B,W, three positive numbers (e.g. 1,0.85,0.45)", flag, v);
        memcpy(part, p, len);
        part[len] = 0;
        snprintf(label, sizeof label, "%s (%s)", flag, names[k]);
        times[k] = parse_number(label, part, NO_UNITS, 1e-6, 1e6, 0);
        p = end ? end + 1 : p + len;
    }
}

// ./train schedule: one schedule's action lists and timeline, for a reader.
int schedule_main(int argc, char **argv) {
    int p = 0, m = 0, v = 0, kind = -1, ascii = 0, auto_times = 0;
    const char *dump = NULL, *times_flag = NULL;
    double times[3] = { 1, 1, 1 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: ./train schedule --pp P --micro-batches M [--pp-virtual V] [--pp-schedule 1f1b|interleaved|zb-h1|zb-v]\n"
                   "                        [--pp-times F,B,W] [--ascii] [--pp-schedule-dump FILE]\n"
                   "prints each rank's actions (F, B, W, hand-offs) and a unit-time timeline of the schedule\n"
                   "  --pp-schedule S          as for training: 1f1b, or interleaved when --pp-virtual is above 1\n"
                   "  --pp-times F,B,W|unit|auto:F,B,W\n"
                   "                           zb-v: build the lists for these relative pass times (as ./train\n"
                   "                           --pp-times) and print their bubble under them beside the unit lists'.\n"
                   "                           Default unit: the paper's lists, which a training run's default\n"
                   "                           --pp-times auto runs in its first step; auto:F,B,W the lists such a\n"
                   "                           run builds once that step measured F,B,W (those that fit what was\n"
                   "                           allocated for the unit lists)\n"
                   "  --ascii                  the timeline alone, one narrow cell per unit (the README's pictures)\n"
                   "  --pp-schedule-dump FILE  also write the action lists with their unit-time start and end as a\n"
                   "                           tab-separated table (schedule.h; scripts/plot.py --schedule FILE draws it)\n");
            return 0;
        }
        if (!strcmp(f, "--ascii")) {
            ascii = 1;
            continue;
        }
        static const char *const valued[] = { "--pp", "--micro-batches", "--pp-virtual", "--pp-schedule", "--pp-schedule-dump", "--pp-times" };
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(f, valued[k]);
        if (!known && strncmp(f, "--", 2) != 0) die("unexpected argument '%s' for ./train schedule (./train schedule --help)", f);
        if (!known) die("unknown flag '%s' for ./train schedule (./train schedule --help)", f);
        if (!val) die("%s needs a value (./train schedule --help)", f);
        if (!strcmp(f, "--pp")) p = (int)parse_int(f, val, 1, 64);
        else if (!strcmp(f, "--micro-batches")) m = (int)parse_int(f, val, 1, 4096);
        else if (!strcmp(f, "--pp-virtual")) v = (int)parse_int(f, val, 1, 16);
        else if (!strcmp(f, "--pp-schedule")) {
            kind = schedule_parse(val);
            if (kind < 0) die("--pp-schedule '%s': expected 1f1b, interleaved, zb-h1 or zb-v", val);
        } else if (!strcmp(f, "--pp-schedule-dump")) dump = val;
        else { // --pp-times F,B,W, unit, or auto:F,B,W (what a --pp-times auto run builds once it measured those)
            auto_times = !strncmp(val, "auto:", 5);
            schedule_parse_times(f, auto_times ? val + 5 : val, times), times_flag = val;
        }
        i++;
    }
    if (!p || !m) die("./train schedule needs --pp P and --micro-batches M");
    if (kind < 0) kind = v > 1 ? SCHED_INTERLEAVED : SCHED_1F1B; // as training chooses
    if (kind == SCHED_INTERLEAVED && v < 2) die("--pp-schedule interleaved needs --pp-virtual V of 2 or more chunks per rank");
    if (!v) v = kind == SCHED_ZBV ? 2 : 1;
    schedule_check_times_kind(kind, times_flag);
    Schedule s;
    char why[256];
    if ((auto_times ? schedule_build_auto(&s, kind, p, m, v, times, why, sizeof why) : schedule_build(&s, kind, p, m, v, times, why, sizeof why)))
        die("%s", why);
    schedule_dump(stdout, &s, ascii);
    if (dump) write_unit_dump(dump, &s);
    schedule_free(&s);
    return 0;
}

// layout.c: the layout (layout.h): rank <-> coordinates, the communicators of every axis, the split of
// the blocks into pipeline stages and chunks.
#include "layout.h"
#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int layout_rank(int dp, int pp, int cp, int tp, int TP, int CP, int PP) { return ((dp * PP + pp) * CP + cp) * TP + tp; }

void layout_coords(int rank, int TP, int CP, int PP, int *dp, int *pp, int *cp, int *tp) {
    *tp = rank % TP;
    *cp = rank / TP % CP;
    *pp = rank / (TP * CP) % PP;
    *dp = rank / (TP * CP * PP);
}

int layout_error(int TP, int CP, int PP, int nranks, char *err, size_t cap) {
    int model_ranks = TP * CP * PP;
    if (nranks % model_ranks == 0) return 0;
    if (CP > 1)
        return snprintf(err, cap, "--tp %d x --cp %d x --pp %d = %d does not divide the %d ranks", TP, CP, PP, model_ranks,
                        nranks), -1;
    return snprintf(err, cap, "--tp %d x --pp %d = %d does not divide the %d ranks", TP, PP, model_ranks, nranks), -1;
}

void layout_place(Layout *l, int rank, int nranks, int TP, int CP, int PP) {
    memset(l, 0, sizeof *l);
    char err[160];
    if (layout_error(TP, CP, PP, nranks, err, sizeof err)) die("%s", err);
    l->rank = rank;
    l->nranks = nranks;
    l->lead = rank == 0;
    l->tp.size = TP;
    l->cp.size = CP;
    l->pp.size = PP;
    l->dp.size = nranks / (TP * CP * PP);
    layout_coords(rank, TP, CP, PP, &l->dp.rank, &l->pp.rank, &l->cp.rank, &l->tp.rank);
    l->replicas.size = l->dp.size * CP;
    l->replicas.rank = l->dp.rank * CP + l->cp.rank;
    l->chunks = l->nslots = 1;
}

// The group along the axes: the ranks that differ only in their coordinates on them. Its colour is
// the rank of its member at coordinates 0 there (layout_rank); key orders it.
enum { ALONG_DP = 1, ALONG_PP = 2, ALONG_CP = 4, ALONG_TP = 8 };
static Comm *split_along(const Layout *l, Comm *world, int axes, int key, const char *name) {
    int dp = axes & ALONG_DP ? 0 : l->dp.rank, pp = axes & ALONG_PP ? 0 : l->pp.rank, cp = axes & ALONG_CP ? 0 : l->cp.rank,
        tp = axes & ALONG_TP ? 0 : l->tp.rank;
    return comm_split(world, layout_rank(dp, pp, cp, tp, l->tp.size, l->cp.size, l->pp.size), key, name);
}

void layout_connect(Layout *l, Comm *world) {
    l->world = world;
    if (!world) return;
    int PP = l->pp.size, CP = l->cp.size, pp = l->pp.rank;
    l->tp.comm = split_along(l, world, ALONG_TP, l->tp.rank, "tp");
    l->pp.comm = split_along(l, world, ALONG_PP, pp, "pp");
    l->pp_fwd = split_along(l, world, ALONG_PP, pp, "pp activations");
    l->pp_bwd = split_along(l, world, ALONG_PP, pp, "pp gradients");
    l->replicas.comm = split_along(l, world, ALONG_DP | ALONG_CP, l->replicas.rank, CP > 1 ? "dp x cp" : "dp");
    // the two stages holding the tied embedding (none under zb-v: its first stage holds both ends)
    if (PP > 1 && layout_head_stage(l) != 0 && (pp == 0 || pp == PP - 1)) l->embed = split_along(l, world, ALONG_PP, pp, "embedding");
    else l->embed = comm_split(world, -1, pp, "embedding"); // collective: every rank takes part
    if (CP > 1) { // K/V blocks on one, dK/dV accumulators on the other
        l->cp.comm = split_along(l, world, ALONG_CP, l->cp.rank, "cp");
        l->cp_grad = split_along(l, world, ALONG_CP, l->cp.rank, "cp gradients");
    }
}

void layout_disconnect(Layout *l) {
    if (!l->world) return;
    comm_barrier(l->world); // nobody leaves while another rank still needs it
    if (l->cp.comm) comm_destroy(l->cp.comm);
    if (l->cp_grad) comm_destroy(l->cp_grad);
    comm_destroy(l->tp.comm);
    comm_destroy(l->replicas.comm);
    comm_destroy(l->pp.comm);
    comm_destroy(l->pp_fwd);
    comm_destroy(l->pp_bwd);
    comm_destroy(l->embed);
    comm_destroy(l->world);
    l->world = NULL;
}

int layout_comms(const Layout *l, Comm **out, int cap) {
    Comm *all[] = { l->world, l->tp.comm, l->pp.comm, l->pp_fwd, l->pp_bwd, l->replicas.comm, l->embed, l->cp.comm,
                    l->cp_grad };
    int n = (int)(sizeof all / sizeof all[0]);
    if (n > cap) die("internal: layout_comms needs room for %d communicators", n);
    memcpy(out, all, sizeof all);
    return n;
}

void layout_count_memory(const Layout *l, MemAccount *acct) {
    Comm *all[16];
    int n = layout_comms(l, all, 16);
    for (int i = 0; i < n; i++) comm_count_memory(all[i], acct);
}

const double *layout_pass_times(const Layout *l) { return l->pp_times[0] > 0 ? l->pp_times : NULL; }
int layout_head_stage(const Layout *l) { return l->schedule == SCHED_ZBV ? 0 : l->pp.size - 1; }

int layout_split_layers(int L, int P, int V, const char *counts, int *first, int *count, char *err, size_t cap) {
    if (P > L) return snprintf(err, cap, "--pp %d: more pipeline stages than the model's %d blocks", P, L), -1;
    if (P * V > L) return snprintf(err, cap, "--pp %d x --pp-virtual %d = %d chunks: more than the model's %d blocks", P, V, P * V, L), -1;
    if (V > 1 && counts) return snprintf(err, cap, "--pp-layers cannot be combined with --pp-virtual"), -1;
    if (!counts) {
        int n = P * V;
        for (int s = 0; s < n; s++) count[s] = L / n + (s < L % n);
        first[0] = 0;
        for (int s = 1; s < n; s++) first[s] = first[s - 1] + count[s - 1];
        return 0;
    }
    const char *c = counts;
    int sum = 0;
    for (int s = 0; s < P; s++) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || v < 1 || v > L) return snprintf(err, cap, "--pp-layers '%s': expected %d positive block counts separated by commas", counts, P), -1;
        count[s] = (int)v;
        sum += (int)v;
        c = end;
        if (s < P - 1) {
            if (*c != ',') return snprintf(err, cap, "--pp-layers '%s': expected %d counts, one per stage", counts, P), -1;
            c++;
        }
    }
    if (*c) return snprintf(err, cap, "--pp-layers '%s': expected %d counts, one per stage", counts, P), -1;
    if (sum != L) return snprintf(err, cap, "--pp-layers '%s' adds up to %d blocks, but the model has %d", counts, sum, L), -1;
    first[0] = 0;
    for (int s = 1; s < P; s++) first[s] = first[s - 1] + count[s - 1];
    return 0;
}

void layout_place_stages(Layout *l, int L, int V, const char *pp_layers) {
    int P = l->pp.size, stage = l->pp.rank, M = l->accum;
    if (V < 1 || V > MAX_CHUNKS) die("internal: %d chunks per stage", V);
    int *first = xmalloc(sizeof(int) * P * V), *count = xmalloc(sizeof(int) * P * V);
    char err[256];
    if (layout_split_layers(L, P, V, pp_layers, first, count, err, sizeof err)) die("%s", err);
    l->chunks = V;
    if (l->schedule == SCHED_ZBV && V != 2) die("internal: zb-v places 2 chunks per stage, not %d", V);
    for (int c = 0; c < V; c++) { // stage s holds chunks s, s + P, ... (zb-v: s and 2P-1-s)
        int k = l->schedule == SCHED_ZBV && c == 1 ? 2 * P - 1 - stage : c * P + stage;
        l->chunk_first[c] = first[k];
        l->chunk_len[c] = count[k];
    }
    // what the action lists hold at once: activation sets (1F1B: min(P - stage, M); with more than one
    // chunk a stage a pool of chunk sets), the head's buffers (a ring of their own, as B frees them: 1F1B
    // runs the last stage's B right after its F, test_schedule checks it) and the split backward's
    // stashes; one stage holds one set and its head
    l->nslots = P - stage < M ? P - stage : M;
    l->nheads = P > 1;
    l->nstash = l->chunk_sets = l->ngrads = 0;
    if (P > 1 && (V > 1 || l->schedule != SCHED_1F1B)) { // (1F1B's closed form: plan builds many layouts)
        Schedule s;
        char why[256];
        if (schedule_build(&s, l->schedule, P, M, V, layout_pass_times(l), why, sizeof why)) die("--pp-schedule %s: %s", SCHEDULE_NAMES[l->schedule], why);
        SchedulePool q = l->pp_times_auto && l->schedule == SCHED_ZBV ? schedule_pool_auto(&s, stage) : schedule_pool(&s, stage);
        l->nslots = q.sets, l->nheads = q.heads, l->nstash = q.stashes, l->ngrads = q.grads;
        l->chunk_sets = V > 1;
        schedule_free(&s);
    }
    if (l->nslots < 1) l->nslots = 1;
    free(first);
    free(count);
}

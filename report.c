// report.c: the header, the step lines and the --log records, stragglers and the stall clock, memory
// lines (report.h).
#define _GNU_SOURCE
#include "report.h"
#include "schedule.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"
#include "kernels.h"
#include "mem.h"

void report_init(Report *r, const Layout *l, const Options *o, long long batch_tokens, double flops_per_token) {
    *r = (Report){ .lay = l, .o = o, .batch_tokens = batch_tokens, .flops_per_token = flops_per_token };
}

// ---------------------------------------------------------------------------------------------
// the stall clock: a thread that ticks every STALL_TICK_S; a longer gap between two ticks beyond
// STALL_MIN_S is time the process did not run (stopped by SIGSTOP, a frozen VM, a starved machine).
// A waiting rank still ticks, so the rank that stalled the others is the one that did not.

#define STALL_TICK_S 0.005
#define STALL_MIN_S 0.2
struct StallClock {
    pthread_t thread;
    pthread_mutex_t mu;
    double last, stopped; // the last tick, the seconds not run so far
    int stop;
};

static double stall_gap(double gap) { return gap > STALL_MIN_S ? gap - STALL_TICK_S : 0; }

static void *stall_tick(void *arg) {
    StallClock *c = arg;
    struct timespec ts = { 0, (long)(STALL_TICK_S * 1e9) };
    for (;;) {
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->mu);
        double now = now_seconds();
        c->stopped += stall_gap(now - c->last);
        c->last = now;
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop) return NULL;
    }
}

static StallClock *stall_start(void) {
    StallClock *c = xcalloc(1, sizeof *c);
    c->last = now_seconds();
    pthread_mutex_init(&c->mu, NULL);
    int e = pthread_create(&c->thread, NULL, stall_tick, c);
    if (e) die("pthread_create: %s", strerror(e));
    return c;
}

double report_stopped_seconds(Report *r) {
    StallClock *c = r->stall;
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    double v = c->stopped + stall_gap(now_seconds() - c->last); // a gap the thread has not closed yet counts
    pthread_mutex_unlock(&c->mu);
    return v;
}

static void stall_stop(StallClock *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

// ---------------------------------------------------------------------------------------------
// gathering one value per rank

typedef struct {
    double min, max, sum, mean;
} Spread;

// The spread of v[0..n), reduced in index order.
static Spread spread_of(const double *v, int n) {
    Spread s = { v[0], v[0], 0, 0 };
    for (int i = 0; i < n; i++) {
        s.sum += v[i];
        s.mean += v[i] / n;
        s.min = v[i] < s.min ? v[i] : s.min;
        s.max = v[i] > s.max ? v[i] : s.max;
    }
    return s;
}

// One double from every rank of c (n ranks; c NULL: this process alone, n 1) into all[n], and their
// spread, reduced here in rank order. The gather only moves bits: the doubles travel as 64-bit integers
// (the collectives have no fp64 type, and nothing adds them on the way). all may be NULL.
static Spread gather_spread(Comm *c, int n, double mine, double *all) {
    double *v = all ? all : xmalloc(sizeof(double) * n);
    if (c) comm_all_gather(c, &mine, v, (size_t)n, CT_I64);
    else v[0] = mine;
    Spread s = spread_of(v, n);
    if (!all) free(v);
    return s;
}

// ---------------------------------------------------------------------------------------------
// the log

// A JSON string, escaped, for the log.
static void log_string(FILE *f, const char *s) {
    json_t *j = json_string(s);
    char *e = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(e ? e : "\"\"", f);
    free(e);
    json_decref(j);
}

// A resumed run keeps the log's records up to its checkpoint's step (complete lines only), so that
// the log of a run with restarts reads like the uninterrupted run's.
static void keep_log_until(const char *path, int step) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return;
    FILE *in = xfopen(path, "r");
    SafeFile sf;
    safe_open_or_die(&sf, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, in)) > 0) {
        long long s;
        if (line[n - 1] == '\n' && sscanf(line, "{\"step\":%lld", &s) == 1 && s <= step) safe_write_or_die(&sf, line, (size_t)n);
    }
    free(line);
    fclose(in);
    safe_commit_or_die(&sf);
}

void report_open(Report *r, int resumed, int start_step, const char *node_id) {
    const Options *o = r->o;
    const Layout *l = r->lay;
    if (o->log && l->lead) {
        if (resumed) keep_log_until(o->log, start_step);
        r->logf = xfopen(o->log, resumed ? "a" : "w");
        if (resumed) {
            const char *launch = getenv("LLM4D_LAUNCH");
            fprintf(r->logf, "{\"step\":%d,\"resumed\":true,\"launch\":%s}\n", start_step, launch && *launch ? launch : "0");
        }
    }
    r->slow_for = xcalloc((size_t)l->nranks, sizeof(int));
    r->compute = xcalloc((size_t)l->nranks, sizeof(double));
    r->stopped = xcalloc((size_t)l->nranks, sizeof(double));
    r->stall = stall_start();
    r->host = xcalloc((size_t)l->nranks, 64);
    snprintf(r->host[l->rank], 64, "%.63s", node_id[0] ? node_id : "localhost");
    if (l->world) { // every rank's host, for straggler reports
        char mine[64];
        memcpy(mine, r->host[l->rank], 64);
        comm_all_gather(l->world, mine, r->host, 16 * (size_t)l->nranks, CT_I32);
    }
}

void report_close(Report *r) {
    if (r->logf) xfclose(r->logf, r->o->log);
    r->logf = NULL;
    stall_stop(r->stall);
    r->stall = NULL;
    free(r->slow_for);
    free(r->compute);
    free(r->stopped);
    free(r->host);
}

// ---------------------------------------------------------------------------------------------
// the header and the memory lines

// The full local gradient buffer ZeRO-2/3 keep besides the reduced shard when a step accumulates more
// than one micro-batch (zero.h: one micro-batch streams its gradients through bucket buffers instead),
// in bytes; 0 when there is none.
static size_t grad_accum_bytes(const GPT2 *m) {
    const Layout *l = m->lay;
    return l->zero >= 2 && l->replicas.size > 1 && m->grads ? m->num_params * sizeof(float) : 0;
}

// One rank's memory table, one line: bytes per category (current or peak), in MiB; the gradients split
// into ZeRO-2/3's accumulation buffer and shard when there are both; kernel_scratch, the backend's own
// workspaces (outside the categories), when known.
static void print_memory(const GPT2 *m, int rank, const char *when, const size_t bytes[MEM_NCAT], size_t kernel_scratch) {
    size_t accum = grad_accum_bytes(m);
    printf("memory of rank %d%s:", rank, when);
    for (int c = 0; c < MEM_NCAT; c++) {
        printf(" %s %.2f MiB", MEM_NAMES[c], bytes[c] / 1048576.0);
        if (c == MEM_GRADS && accum)
            printf(" (%.2f full accumulation buffer for %d micro-batches + %.2f reduced shard)", accum / 1048576.0,
                   m->lay->accum, (bytes[c] - accum) / 1048576.0);
        printf(" |");
    }
    printf(" total %.2f MiB | largest logits buffer %zu bytes", mem_sum(bytes) / 1048576.0, m->logits_bytes);
    if (kernel_scratch) printf(" | besides: kernel workspaces %.2f MiB", kernel_scratch / 1048576.0);
    printf("\n");
    fflush(stdout);
}

static void print_run(const Report *r, const GPT2 *m, const Zero *z, const TokenSet *train, const Ckpt *ckpt) {
    const Options *o = r->o;
    const Layout *l = r->lay;
    const GPT2Config *c = &m->cfg;
    int T = l->T, CP = l->cp.size;
    size_t full_n = gpt2_param_layout(c, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 });
    printf("llm4d | device %s", m->be->name);
    if (m->be == backend_cpu() && m->dt == DT_BF16) printf(" (bf16 matmuls: %s)", cpu_isa());
    printf(" | dtype %s | model %sL=%d C=%d H=%d", dtype_name(m->dt), c->arch == ARCH_LLAMA ? "llama " : "", c->L, c->C, c->NH);
    if (c->arch == ARCH_LLAMA) printf(" KV=%d F=%d%s", c->NKV, c->F, c->tie ? " tied" : "");
    printf(" V=%d Vp=%d maxT=%d | %zu parameters", c->V, c->Vp, c->maxT, full_n);
    if (l->tp.size > 1) printf(", %zu on each tensor-parallel rank", m->num_params);
    printf("\n");
    printf("layout: %d rank(s) | data parallel %d x pipeline %d x context parallel %d x tensor parallel %d%s | ZeRO-%d | "
           "%d gradient bucket(s) | recompute %s\n", l->nranks, l->dp.size, l->pp.size, CP, l->tp.size,
           o->sp ? " (sequence parallel)" : "", z->stage, z->nbuckets, RECOMPUTE_NAMES[o->recompute]);
    if (l->zero > 0 && z->stage == 0) // ZeRO shards over the ranks holding the same weights (layout.h: replicas)
        printf("note: --zero %d has nothing to shard: ZeRO shards over the ranks holding the same weights, data parallel %d x "
               "context parallel %d = 1 here, so the run is ZeRO-0\n", l->zero, l->dp.size, CP);
    if (CP > 1)
        printf("context parallel: each sequence of %d in %d chunks of %d; rank c of a group holds chunks c and %d-c "
               "(%d positions); K/V round a ring of %d\n", T, 2 * CP, T / (2 * CP), 2 * CP - 1, T / CP, CP);
    printf("batch: %lld tokens per step = %d micro-batch(es) of %d x %d on each of %d rank(s) | %d steps\n",
           r->batch_tokens, l->accum, l->B, T, l->dp.size, o->steps);
    if (train)
        printf("data: %s (%llu tokens, %llu sequences of %d)%s\n", o->train, (unsigned long long)train->ntokens,
               (unsigned long long)train->windows, T, o->shuffle ? ", shuffled" : "");
    if (ckpt) {
        printf("checkpoints: %s | ", o->ckpt_dir);
        if (o->ckpt_every) printf("every %d steps, ", o->ckpt_every);
        if (o->keep) printf("at the end and on SIGTERM/SIGUSR1 | keeping the newest %d", o->keep);
        else printf("at the end and on SIGTERM/SIGUSR1 | keeping all");
        printf(" | staging %.2f MiB of host memory on rank 0\n", ckpt_staging_bytes(ckpt) / 1048576.0);
    }
}

void report_header(const Report *r, const GPT2 *m, const Zero *z, const TokenSet *train, const Ckpt *ckpt) {
    const Layout *l = r->lay;
    if (l->lead) print_run(r, m, z, train, ckpt);
    // every rank reports its own memory, one line each, in rank order: every buffer is allocated before
    // step 1, so this is the plan (the end of the run prints the peak)
    if (l->lead) printf("memory per rank: allocated at start, which is all the steps use (the peak follows at the end)\n");
    char when[64];
    snprintf(when, sizeof when, " (%s)", m->be->name);
    for (int q = 0; q < l->nranks; q++) {
        if (q == l->rank) print_memory(m, l->rank, when, m->mem.cur, 0);
        if (l->world) comm_barrier(l->world);
    }
}

void report_memory_peak(Report *r, const GPT2 *m) {
    const Layout *l = r->lay;
    size_t ks = m->be->scratch_bytes();
    for (int q = 0; q < l->nranks; q++) {
        if (q == l->rank) print_memory(m, l->rank, ", peak", m->mem.peak, ks);
        if (l->world) comm_barrier(l->world);
    }
    enum { N = MEM_NCAT + 1 };
    int64_t mine[N], *all = xmalloc(sizeof(int64_t) * N * l->nranks);
    for (int c = 0; c < MEM_NCAT; c++) mine[c] = (int64_t)m->mem.peak[c];
    mine[MEM_NCAT] = (int64_t)ks;
    if (l->world) comm_all_gather(l->world, mine, all, (size_t)N * l->nranks, CT_I64);
    else memcpy(all, mine, sizeof mine);
    for (int q = 0; r->logf && q < l->nranks; q++) {
        const int64_t *a = all + (size_t)q * N;
        fprintf(r->logf, "{\"memory_peak\":{");
        for (int c = 0; c < MEM_NCAT; c++) fprintf(r->logf, "%s\"%s\":%lld", c ? "," : "", MEM_KEYS[c], (long long)a[c]);
        fprintf(r->logf, "},\"kernel_scratch\":%lld,\"rank\":%d}\n", (long long)a[MEM_NCAT], q);
    }
    free(all);
}

// ---------------------------------------------------------------------------------------------
// steps

// Stragglers: every rank's busy time (its compute, and the time it did not run outside compute: a
// stopped rank stalls the others while they wait, and their waits are no one's busy time); a rank above
// the median by more than --straggler (and by more than STRAGGLER_MIN_MS: a busy machine's jitter on
// short steps is no straggler) for --straggler-steps steps in a row is reported once per streak; the
// slowest rank is the busiest (the lowest rank of equals). Collective.
#define STRAGGLER_MIN_MS 20.0
static void stragglers(Report *r, int step, double busy_ms, double stopped_ms, double *max_ms, double *median_ms,
                       int *slowest) {
    const Layout *l = r->lay;
    const Options *o = r->o;
    int n = l->nranks;
    gather_spread(l->world, n, busy_ms, r->compute);
    gather_spread(l->world, n, stopped_ms, r->stopped);
    double *sorted = xmalloc(sizeof(double) * n);
    memcpy(sorted, r->compute, sizeof(double) * n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            double x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    *median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    free(sorted);
    *slowest = 0;
    for (int q = 0; q < n; q++) {
        if (r->compute[q] > r->compute[*slowest]) *slowest = q;
        int slow = n > 1 && r->compute[q] > *median_ms * (1.0 + o->straggler) && r->compute[q] - *median_ms > STRAGGLER_MIN_MS;
        r->slow_for[q] = slow ? r->slow_for[q] + 1 : 0;
        if (r->slow_for[q] != o->straggler_steps || !l->lead) continue;
        char stopped[96] = "";
        if (r->stopped[q] > 0) snprintf(stopped, sizeof stopped, ", of which it did not run for %.1f ms", r->stopped[q]);
        fprintf(stderr, "warning: straggler: rank %d on %s has computed more than %.0f%% longer than the median for %d steps "
               "(%.1f ms against %.1f ms at step %d%s)\n", q, r->host[q], 100 * o->straggler, o->straggler_steps,
               r->compute[q], *median_ms, step + 1, stopped);
        if (r->logf) {
            fprintf(r->logf, "{\"step\":%d,\"straggler\":%d,\"host\":", step + 1, q);
            log_string(r->logf, r->host[q]);
            fprintf(r->logf, ",\"compute_ms\":%.3f,\"median_ms\":%.3f,\"stopped_ms\":%.3f}\n", r->compute[q], *median_ms,
                    r->stopped[q]);
        }
    }
    *max_ms = r->compute[*slowest];
}

// --pp-trace: one line per step, "step S peak K: F0 F1 B0 ...", appended to DIR/stageS.txt.
static void write_trace(const char *dir, int stage, int step, const Pipeline *p) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("--pp-trace: cannot create %s: %s", dir, strerror(errno));
    size_t n = strlen(dir) + 32;
    char *path = xmalloc(n);
    snprintf(path, n, "%s/stage%d.txt", dir, stage);
    FILE *f = xfopen(path, "a");
    fprintf(f, "step %d peak %d: %s\n", step, p->peak_live, p->trace ? p->trace : "");
    xfclose(f, path);
    free(path);
}

typedef struct { // what the ranks' gathers say about a step
    double bubble_max, bubble_mean, bubble_formula; // the share of the pipeline's span each stage was idle, and the schedule's
    double handoff[6]; // summed over the pipeline ranks: receives (hand-offs), copies, bytes copied, wake-ups, sleeps, condition waits
    double *busy, *idle, *wfill;                    // [P] per pipeline rank: seconds in its passes, idle, in W apart
    Spread attn;                                    // attention FLOPs of every rank
    double compute_max, compute_median; // busy times (stragglers)
    int slowest;
    double stopped_max; // the longest time a rank did not run in this step, and that rank (-1: none)
    int stopped_rank;
    double wall_ms, t_s; // the step's wall time (from the previous record's end), and the run's time here
} StepSpread;

static void print_step(const Report *r, int step, const StepResult *s, const StepTimes *tm, const StepSpread *g) {
    const Layout *l = r->lay;
    double tps = r->batch_tokens / (s->ms / 1e3);
    printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f GFLOP/s", step + 1, r->o->steps,
           s->loss, s->lr, s->norm, s->ms, tps, tps * r->flops_per_token / 1e9);
    if (l->dp.size > 1) printf(" | comm %.1f ms, exposed %.1f ms", s->comm_ms, s->exposed_ms);
    if (l->tp.size > 1) printf(" | tp comm %.1f ms", s->tp_ms);
    if (l->cp.size > 1) printf(" | cp comm %.1f ms, exposed %.1f ms", s->cp_ms, tm->ring_wait_s * 1e3);
    if (l->pp.size > 1)
        printf(" | bubble %.1f%% max, %.1f%% mean (formula %.1f%%)", 100 * g->bubble_max, 100 * g->bubble_mean,
               100 * g->bubble_formula);
    if (s->stall_ms > 0) printf(" | checkpoint stall %.1f ms", s->stall_ms);
    if (g->wall_ms > 1.05 * s->ms + 1) printf(" | wall %.1f ms", g->wall_ms); // step boundaries, checkpoints, stalls
    if (g->stopped_rank >= 0) printf(" | rank %d did not run for %.1f ms", g->stopped_rank, g->stopped_max);
    if (s->skipped) printf(" | SKIPPED (%lld so far)", s->skipped_total);
    if (r->o->profile) {
        double mm = tm->op_s[PROF_MATMUL] * 1e3, at = tm->op_s[PROF_ATTENTION] * 1e3;
        printf(" | matmul %.1f ms (%.0f%%), attention %.1f ms (%.0f%%), other %.1f ms (%.0f%%)", mm, 100 * mm / s->ms,
               at, 100 * at / s->ms, s->ms - mm - at, 100 * (s->ms - mm - at) / s->ms);
    }
    printf("\n");
    fflush(stdout);
}

// A loss or norm as a JSON number: null where it is not finite (JSON has no NaN; a skipped spike's
// loss is one).
typedef struct { char s[32]; } JsonReal;
static JsonReal json_real9(double v) {
    JsonReal j;
    if (isfinite(v)) snprintf(j.s, sizeof j.s, "%.9g", v);
    else snprintf(j.s, sizeof j.s, "null");
    return j;
}

static void log_step(const Report *r, int step, const StepResult *s, const StepTimes *tm, const StepSpread *g) {
    double tps = r->batch_tokens / (s->ms / 1e3);
    fprintf(r->logf,
            "{\"step\":%d,\"tokens\":%lld,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"ms\":%.3f,\"wall_ms\":%.3f,"
            "\"t_s\":%.6f,\"tokens_per_s\":%.1f,"
            "\"comm_ms\":%.3f,\"exposed_comm_ms\":%.3f,\"tp_comm_ms\":%.3f,\"cp_comm_ms\":%.3f,\"cp_exposed_ms\":%.3f,"
            "\"bubble_max\":%.4f,\"bubble_mean\":%.4f,\"bubble_formula\":%.4f,\"attn_flops_min\":%.0f,"
            "\"attn_flops_max\":%.0f,\"attn_flops_total\":%.0f,\"compute_ms_max\":%.3f,\"compute_ms_median\":%.3f,"
            "\"slowest_rank\":%d,\"stopped_ms_max\":%.3f,\"stopped_rank\":%d,\"ckpt_stall_ms\":%.3f,\"skipped\":%d,"
            "\"skipped_total\":%lld",
            step + 1, (step + 1) * r->batch_tokens, json_real9(s->loss).s, s->lr, json_real9(s->norm).s, s->ms, g->wall_ms, g->t_s, tps, s->comm_ms, s->exposed_ms, s->tp_ms,
            s->cp_ms, tm->ring_wait_s * 1e3, g->bubble_max, g->bubble_mean, g->bubble_formula, g->attn.min, g->attn.max,
            g->attn.sum, g->compute_max, g->compute_median, g->slowest, g->stopped_max, g->stopped_rank, s->stall_ms, s->skipped,
            s->skipped_total);
    if (s->zero3_gathers >= 0) fprintf(r->logf, ",\"zero3_gathers\":%d", s->zero3_gathers);
    if (r->lay->cp.size > 1) fprintf(r->logf, ",\"cp_sent_bytes\":%.0f", tm->ring_sent_bytes); // rank 0's; the ring is symmetric
    if (g->idle && g->handoff[0] > 0) { // the pipeline group's hand-offs, counted (timing.h)
        const double *h = g->handoff;
        fprintf(r->logf, ",\"pp_handoffs\":%.0f,\"pp_copies_per_handoff\":%.4g,\"pp_bytes_per_handoff\":%.0f,"
                "\"pp_wakeups_per_handoff\":%.4g,\"pp_sleeps_per_handoff\":%.4g,\"pp_cond_waits_per_handoff\":%.4g",
                h[0], h[1] / h[0], h[2] / h[0], h[3] / h[0], h[4] / h[0], h[5] / h[0]);
    }
    if (g->idle) { // per pipeline rank: busy (its span less its waits), idle (the pipeline's span less busy), W-fill
        const char *key[3] = { "pp_busy_ms", "pp_idle_ms", "pp_wfill_ms" };
        for (int k = 0; k < 3; k++) {
            fprintf(r->logf, ",\"%s\":[", key[k]);
            for (int i = 0; i < r->lay->pp.size; i++)
                fprintf(r->logf, "%s%.3f", i ? "," : "", (k == 0 ? g->busy[i] : k == 1 ? g->idle[i] : g->wfill[i]) * 1e3);
            fputc(']', r->logf);
        }
    }
    if (r->o->profile)
        fprintf(r->logf, ",\"matmul_ms\":%.3f,\"attention_ms\":%.3f", tm->op_s[PROF_MATMUL] * 1e3, tm->op_s[PROF_ATTENTION] * 1e3);
    fputs("}\n", r->logf);
    if (fflush(r->logf) != 0) die("cannot write %s: %s", r->o->log, strerror(errno));
}

void report_step(Report *r, int step, const StepResult *s, const StepTimes *tm, const Pipeline *p) {
    const Layout *l = r->lay;
    int P = l->pp.size;
    // the schedule's bubble with equal stages (zb-h1: the paper's (P-1)(F+B-W) over m(F+B+W) plus it, with
    // F = B = W; zb-v: P-1 chunk forwards over m two-chunk steps, each 6 chunk passes, as plan.c states it)
    double units = l->schedule == SCHED_ZBH1 ? 3.0 * l->accum : l->schedule == SCHED_ZBV ? 6.0 * l->accum
                                                                                          : (double)l->chunks * l->accum;
    StepSpread g = { .bubble_formula = (P - 1.0) / (units + P - 1.0) };
    if (P > 1) {
        // The bubble: the share of the pipeline's span each stage was idle. The span is the longest any stage
        // spent in the schedule (a local time on each: no clock shared across nodes), and a stage is busy for
        // its own span less its waits for the neighbour stages. So the last stage's drain counts, the
        // wait after its last pass for the first stage's last backward (it waits for that in the step's
        // reductions, not in a receive), and the optimizer and the reductions after the schedule do not.
        g.busy = xmalloc(sizeof(double) * P);
        g.idle = xmalloc(sizeof(double) * P);
        g.wfill = xmalloc(sizeof(double) * P);
        double span = gather_spread(l->pp.comm, P, tm->pipe_span_s, g.busy).max;
        gather_spread(l->pp.comm, P, tm->pipe_wait_s, g.idle);
        gather_spread(l->pp.comm, P, tm->pipe_w_s, g.wfill);
        for (int i = 0; i < P; i++) {
            g.busy[i] -= g.idle[i];
            g.idle[i] = span - g.busy[i];
        }
        Spread b = spread_of(g.idle, P);
        const double mine[6] = { tm->pipe_recvs, tm->pipe_copies, tm->pipe_copied_bytes, tm->pipe_wakeups, tm->pipe_sleeps, tm->pipe_cond_waits };
        for (int k = 0; k < 6; k++) g.handoff[k] = gather_spread(l->pp.comm, P, mine[k], NULL).sum;
        g.bubble_max = span > 0 && b.max > 0 ? b.max / span : 0;
        g.bubble_mean = span > 0 ? b.mean / span : 0;
        if (r->o->pp_trace && l->dp.rank == 0 && l->cp.rank == 0 && l->tp.rank == 0)
            write_trace(r->o->pp_trace, l->pp.rank, step + 1, p);
    }
    // the time this rank did not run since the previous record, and how much of it its compute holds
    double stopped = report_stopped_seconds(r), stopped_ms = (stopped - r->stopped_seen) * 1e3;
    r->stopped_seen = stopped;
    // (compute_ms holds at most its share of the time not run inside the schedule: the rest fell in waits)
    double in_compute = s->compute_stopped_ms < s->compute_ms ? s->compute_stopped_ms : s->compute_ms;
    stragglers(r, step, s->compute_ms + stopped_ms - in_compute, stopped_ms, &g.compute_max, &g.compute_median, &g.slowest);
    g.stopped_rank = -1;
    for (int q = 0; q < l->nranks; q++)
        if (r->stopped[q] > g.stopped_max) {
            g.stopped_max = r->stopped[q];
            g.stopped_rank = q;
        }
    // attention FLOPs of every rank: context parallelism should give each rank of a group the same share
    g.attn = gather_spread(l->world, l->world ? l->nranks : 1, tm->attention_flops, NULL);
    double now = now_seconds(); // the record's end: the gathers above (a stalled rank's wait) are in it
    g.wall_ms = (now - r->mark) * 1e3;
    g.t_s = now - r->t0;
    r->mark = now;
    if (l->lead) print_step(r, step, s, tm, &g);
    if (r->logf) log_step(r, step, s, tm, &g);
    free(g.idle);
    free(g.wfill);
    free(g.busy);
}

void report_schedule_dump(Report *r, const Pipeline *p, const char *path) {
    const Schedule *s = &p->sched;
    if (!s->n) { // no step ran (a resumed run at its end): every rank alike
        if (r->lay->lead) printf("--pp-schedule-dump: no step ran, %s not written\n", path);
        return;
    }
    int P = s->p, nmax = 0;
    for (int q = 0; q < P; q++) nmax = s->n[q] > nmax ? s->n[q] : nmax;
    size_t per = 1 + 2 * (size_t)nmax; // the stage's step start, then (start, end) per action
    double *mine = xcalloc(per, sizeof(double)), *all = xmalloc(sizeof(double) * per * P);
    mine[0] = p->t0;
    memcpy(mine + 1, p->act_t, sizeof(double) * 2 * (size_t)s->n[p->stage]);
    // bits only, as in gather_spread: the doubles travel as 64-bit integers
    if (r->lay->pp.comm) comm_all_gather(r->lay->pp.comm, mine, all, per * P, CT_I64);
    else memcpy(all, mine, sizeof(double) * per);
    if (r->lay->lead) {
        double t0 = all[0], **start = xmalloc(sizeof(double *) * P), **end = xmalloc(sizeof(double *) * P);
        for (int q = 1; q < P; q++) t0 = all[q * per] < t0 ? all[q * per] : t0;
        for (int q = 0; q < P; q++) {
            start[q] = xmalloc(sizeof(double) * (size_t)nmax);
            end[q] = xmalloc(sizeof(double) * (size_t)nmax);
            for (int i = 0; i < s->n[q]; i++) {
                start[q][i] = (all[q * per + 1 + 2 * i] - t0) * 1e3;
                end[q][i] = (all[q * per + 2 + 2 * i] - t0) * 1e3;
            }
        }
        FILE *f = xfopen(path, "w");
        schedule_write_dump(f, s, "ms", start, end);
        xfclose(f, path);
        for (int q = 0; q < P; q++) free(start[q]), free(end[q]);
        free(start);
        free(end);
    }
    free(mine);
    free(all);
}

void report_start(Report *r) { r->t0 = r->mark = now_seconds(); }

void report_val(Report *r, int step, float val_loss) {
    if (!r->lay->lead) return;
    printf("step %d | val loss %.6f\n", step, val_loss);
    if (r->logf) fprintf(r->logf, "{\"step\":%d,\"val_loss\":%s}\n", step, json_real9(val_loss).s);
}

void report_checkpoint(Report *r, const CkptEvent *ev, double stall) {
    double mibs = ev->write_s > 0 ? ev->bytes / 1048576.0 / ev->write_s : 0;
    if (ev->ok)
        printf("checkpoint %s: %.2f MiB in %.3f s (%.1f MiB/s), step stalled %.1f ms\n", ev->path, ev->bytes / 1048576.0,
               ev->write_s, mibs, stall);
    else if (ev->msg[0] && !strstr(ev->msg, "rank ")) // a shard's failure was reported when it happened
        fprintf(stderr, "warning: the checkpoint of step %lld was not completed (%s); training goes on\n",
                (long long)ev->step, ev->msg);
    if (!r->logf) return;
    fprintf(r->logf, "{\"step\":%lld,\"ckpt\":", (long long)ev->step);
    log_string(r->logf, ev->path);
    fprintf(r->logf, ",\"ckpt_ok\":%s,\"ckpt_bytes\":%llu,\"ckpt_write_s\":%.6f,\"ckpt_MiB_per_s\":%.3f,\"ckpt_stall_ms\":%.3f",
            ev->ok ? "true" : "false", (unsigned long long)ev->bytes, ev->write_s, mibs, stall);
    if (!ev->ok) {
        fprintf(r->logf, ",\"ckpt_error\":");
        log_string(r->logf, ev->msg);
    }
    fprintf(r->logf, "}\n");
    fflush(r->logf);
}

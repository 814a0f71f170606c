// train.c: the trainer: set-up (the layout, the device, the batch, data, model and state, checkpoints),
// the step (batch, forward and backward through the pipeline, reduction and norm, update), the loop
// with its step boundaries (stopping, checkpoints, validation, sampling), and main with the launcher's
// restarts. The flags are options.c's, the printing and logging report.c's, the layout layout.c's.
//
//   ./train prepare INPUT.txt DIR      byte-level token shards from any text
//   ./train plan [flags]               the layout planner (plan.c; ./train plan --help)
//   ./train schedule [flags]           a pipeline schedule's actions and timeline (schedule.c)
//   ./train sample|eval --model F ...  a run of no steps from a model file or checkpoint that samples
//                                      (sample) or validates (eval) once, through the same code
//   ./train [flags]                    train (see --help)
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "collectives.h"
#include "launch.h"
#include "devmem.h"
#include "common.h"
#include "ckpt.h"
#include "data.h"
#include "hf.h"
#include "kernels.h"
#include "model.h"
#include "options.h"
#include "pipeline.h"
#include "report.h"
#include "schedule.h"
#include "timing.h"
#include "tokenizer.h"
#include "prepare.h"
#include "zero.h"

// tokenizer.bin beside the first file `pattern` matches (the tokenizer a run reads without
// --tokenizer: open_tokenizer, vocab_of_data), in out; NULL when nothing matches.
static const char *tokenizer_beside(const char *pattern, char *out, size_t cap) {
    glob_t g;
    if (!pattern || glob(pattern, 0, NULL, &g) != 0) return NULL;
    char d[SAFE_PATH_MAX];
    dir_of(g.gl_pathv[0], d, sizeof d);
    globfree(&g);
    snprintf(out, cap, "%s/tokenizer.bin", d);
    return out;
}

// The vocabulary of the tokenizer file beside the first training shard (tokenizer.bin, as ./train
// prepare writes it), when --vocab is not given: 0 when there is none.
static int vocab_of_data(const Options *o) {
    char path[SAFE_PATH_MAX + 16];
    if (!o->train || !tokenizer_beside(o->train, path, sizeof path)) return 0; // no match: tokenset_open reports it
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    Tokenizer tk;
    tokenizer_load(&tk, path);
    int v = tk.vocab;
    tokenizer_free(&tk);
    return v;
}

// The model's shape: from --init-from or --init-from-hf (with the weights), from the checkpoint sample
// and eval read (src), or a preset overridden by the shape flags.
static GPT2Config resolve_shape(const Options *o, const CkptMeta *src, float **host_params) {
    GPT2Config cfg;
    int shape_flags = options_any_shape_flag(o);
    if (o->mode != MODE_TRAIN && o->resume_path) {
        *host_params = NULL;
        return src->model;
    }
    if (o->init_from_hf) { // options.c refused any shape flag beside it
        *host_params = hf_load_model(o->init_from_hf, &cfg);
        return cfg;
    }
    if (o->init_from) {
        if (shape_flags || o->preset)
            die("--init-from takes the shape from %s; drop --model and the shape flags", o->init_from);
        *host_params = gpt2_load_file(o->init_from, &cfg);
        return cfg;
    }
    *host_params = NULL;
    ShapeFlags f = options_shape_flags(o, o->vocab ? o->vocab : vocab_of_data(o));
    return model_shape(o->preset, &f, o->seq_len);
}

static float lr_at(const Options *o, int step) {
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    float min_lr = o->lr * o->lr_min_frac;
    if (!strcmp(o->schedule, "constant") || o->steps <= o->warmup) return o->lr;
    float ratio = (float)(step - o->warmup) / (float)(o->steps - o->warmup);
    if (!strcmp(o->schedule, "linear")) return o->lr - (o->lr - min_lr) * ratio;
    return min_lr + 0.5f * (1.0f + cosf((float)M_PI * ratio)) * (o->lr - min_lr);
}

// A resumed run whose learning-rate schedule is not the checkpoint's (--lr, --schedule, --warmup,
// --lr-min-frac, --steps: each may change) says so, with the rate its next step takes under either:
// a longer --steps stretches a decay, so the rate can jump at the resume.
static void note_schedule_change(const Options *o, const CkptMeta *saved) {
    Options was = *o;
    was.lr = saved->lr, was.schedule = saved->schedule, was.warmup = saved->warmup, was.lr_min_frac = saved->lr_min_frac,
    was.steps = saved->steps;
    char diff[256] = "";
    size_t n = 0;
#define SCHED_DIFF(cond, ...) \
    if (cond) n += (size_t)snprintf(diff + n, n < sizeof diff ? sizeof diff - n : 0, __VA_ARGS__)
    SCHED_DIFF(o->lr != was.lr, "%s--lr %g (the checkpoint's %g)", n ? ", " : "", o->lr, was.lr);
    SCHED_DIFF(strcmp(o->schedule, was.schedule), "%s--schedule %s (%s)", n ? ", " : "", o->schedule, was.schedule);
    SCHED_DIFF(o->warmup != was.warmup, "%s--warmup %d (%d)", n ? ", " : "", o->warmup, was.warmup);
    SCHED_DIFF(o->lr_min_frac != was.lr_min_frac, "%s--lr-min-frac %g (%g)", n ? ", " : "", o->lr_min_frac, was.lr_min_frac);
    SCHED_DIFF(o->steps != was.steps, "%s--steps %d (%d)", n ? ", " : "", o->steps, was.steps);
#undef SCHED_DIFF
    if (!n) return;
    int next = (int)saved->step; // the step about to run, 0-based
    printf("note: the learning-rate schedule is not the checkpoint's: %s; step %d takes lr %.6g, %.6g under the "
           "checkpoint's\n", diff, next + 1, lr_at(o, next), lr_at(&was, next));
}

static void write_raw(const char *dir, const char *name, const void *data, size_t bytes) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = xmalloc(n);
    snprintf(path, n, "%s/%s", dir, name);
    SafeFile sf;
    safe_open_or_die(&sf, path);
    safe_write_or_die(&sf, data, bytes);
    safe_commit_or_die(&sf);
    free(path);
}

// ---------------------------------------------------------------------------------------------
// signals

// SIGTERM (preemption, a launcher stopping its job), SIGUSR1 (Slurm's warning before the time limit)
// and SIGINT (Ctrl-C on a single rank; the --nproc launcher turns it into SIGTERM for its ranks) ask for
// a clean stop; the step loop reads this at every step boundary, and sampling and ./train eval between
// tokens and batches (stop_agreed). A second one a second or more later ends the process at once (a
// step can be long); one sooner is the same stop delivered twice (timeout(1) signals its child, then
// its process group). A rank that got SIGINT exits 130 after its checkpoint, as the launcher does.
static volatile sig_atomic_t stop_signal;
static struct timespec stop_first; // when the first came (clock_gettime is async-signal-safe)
static void on_stop_signal(int sig) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (stop_signal) {
        if ((double)(now.tv_sec - stop_first.tv_sec) + (double)(now.tv_nsec - stop_first.tv_nsec) * 1e-9 < SAME_STOP_S) return;
        signal(sig, SIG_DFL);
        raise(sig);
    }
    stop_first = now;
    stop_signal = sig;
}

// The handlers go in first thing, in one place: the --nproc launcher starts ranks with SIGUSR1 blocked
// (it passes SIGUSR1 on), so one sent while a rank starts waits for the handler instead of killing it.
// sample and eval (ignore_usr1) have nothing to checkpoint before a time limit: Slurm's warning leaves
// them running, and SIGTERM and SIGINT stop them.
static void install_stop_signals(int ignore_usr1) {
    struct sigaction sa = { .sa_handler = on_stop_signal }, ign = { .sa_handler = SIG_IGN };
    sigemptyset(&sa.sa_mask);
    sigemptyset(&ign.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGUSR1, ignore_usr1 ? &ign : &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
        die("sigaction: %s", strerror(errno));
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    if (sigprocmask(SIG_UNBLOCK, &m, NULL) != 0) die("sigprocmask: %s", strerror(errno));
}

// Whether any rank has been asked to stop (collective over the world: every rank gets the same answer,
// so all stop after the same work).
static int stop_agreed(const Layout *lay) {
    int32_t mine = stop_signal != 0, any = mine;
    if (lay->world) comm_all_reduce(lay->world, &mine, &any, 1, CT_I32, OP_MAX);
    return any;
}

// While the job forms, SIGINT and SIGTERM end the rank at once (world_create): nothing has run, and a
// peer that never comes would hold it for --comm-timeout. SIGUSR1, Slurm's warning, lets the job form
// and stop cleanly at its first step boundary, as any stop does once the job has formed.
static int stop_while_forming(void) { return stop_signal == SIGINT || stop_signal == SIGTERM ? stop_signal : 0; }

static const char *stop_name(void) {
    return stop_signal == SIGUSR1 ? "SIGUSR1 (the job's time limit is near)" : stop_signal == SIGTERM ? "SIGTERM"
           : stop_signal == SIGINT ? "SIGINT" : "a stop signal (on another rank)";
}

// ---------------------------------------------------------------------------------------------
// sampling and validation

static int sample_token(const Options *o, float *probs, int *order, int V, uint64_t *rng);

// Sampling: the model continues the prompt (np tokens: ./train sample's --prompt, else the first token
// of the training data), one token per forward. Training prints a header; ./train sample the text only (on out).
// Returns 1 when a stop signal cut it short (every rank alike).
static int sample(Pipeline *p, const Options *o, const Tokenizer *tk, const int *prompt, int np, int T, int step, int print, FILE *out) {
    GPT2 *m = p->model;
    int n = o->sample_tokens < T - np ? o->sample_tokens : T - np, Tl = T / m->lay->cp.size;
    int32_t *ctx = xcalloc((size_t)T, sizeof(int32_t)), *local = xcalloc((size_t)Tl, sizeof(int32_t));
    float *probs = xmalloc(sizeof(float) * m->cfg.V);
    int *order = xmalloc(sizeof(int) * m->cfg.V);
    uint64_t rng = o->seed * 0x9e3779b97f4a7c15ULL + (uint64_t)step + 1;
    if (print && o->mode == MODE_TRAIN) fprintf(out, "sample at step %d:\n", step);
    if (print && o->mode == MODE_SAMPLE && n < o->sample_tokens)
        fprintf(stderr, "note: --tokens %d and the %d-token prompt exceed the %d-token window (--seq-len): sampling %d\n",
                o->sample_tokens, np, T, n);
    TextOut text = { { 0 }, 0 };
    for (int i = 0; i < np; i++) {
        ctx[i] = prompt[i];
        if (!print) continue;
        if (tk) {
            text_out_token(&text, tk, prompt[i], out);
        } else {
            fprintf(out, "%d ", prompt[i]);
        }
    }
    // Each token's forward runs over the shortest window holding the context that the layout can split
    // (CP: an even number of positions per rank; SP: a multiple of TP per rank; T itself always can):
    // causal attention leaves the positions before t untouched by the zeros after them. On the CPU
    // without CP every position's arithmetic is the same in any window, so the tokens are the whole
    // window's; under CP the ring's attention blocks, and on a GPU the matmuls' split-K, follow the
    // window, so there they agree up to rounding, as CP's tokens agree with one rank's.
    int cp = m->lay->cp.size, tps = m->lay->sp ? m->lay->tp.size : 1, even = cp > 1 ? 2 : 1;
    int unit = cp * (tps % even ? tps * even : tps); // CP x lcm(even, tps): a window comes in these
    int t = np;
    for (; t < np + n && !stop_agreed(m->lay); t++) {
        int Tw = (t + unit - 1) / unit * unit;
        if (Tw > T) Tw = T;
        int Twl = Tw / cp;
        if (cp > 1) cp_slice(ctx, local, 1, Twl, cp, m->lay->cp.rank);
        pipeline_forward(p, cp > 1 ? local : ctx, NULL, 1, Twl);
        int V = m->cfg.V, next = 0;
        if (m->last) { // the head's stage holds the logits and samples; the others learn the token from it
            gpt2_logits_at(m, 0, t - 1, Twl, probs);
            next = sample_token(o, probs, order, V, &rng);
        }
        if (m->lay->pp.size > 1) {
            int32_t tok = next;
            comm_broadcast(layout_group(&m->lay->pp), &tok, 1, CT_I32, layout_head_stage(m->lay));
            next = tok;
        }
        ctx[t] = next;
        if (!print) continue;
        if (tk) {
            text_out_token(&text, tk, next, out);
        } else {
            fprintf(out, "%d ", next);
        }
    }
    if (print) text_out_flush(&text, out);
    if (print) fprintf(out, o->mode == MODE_TRAIN ? "\n---\n" : "\n");
    fflush(out);
    if (print && t < np + n) fprintf(stderr, "received %s: the sample stopped after %d of %d tokens\n", stop_name(), t - np, n);
    free(ctx);
    free(local);
    free(probs);
    free(order);
    return t < np + n;
}

// Temperature and top-k sampling from the logits in probs (overwritten).
static int sample_token(const Options *o, float *probs, int *order, int V, uint64_t *rng) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        probs[i] /= o->temperature;
        if (probs[i] > mx) mx = probs[i];
    }
    // top-k: the k largest by partial selection
    int k = (o->top_k > 0 && o->top_k < V) ? o->top_k : V;
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < k && k < V; i++) {
        int best = i;
        for (int j = i + 1; j < V; j++)
            if (probs[order[j]] > probs[order[best]]) best = j;
        int tmp = order[i];
        order[i] = order[best];
        order[best] = tmp;
    }
    double sum = 0.0;
    for (int i = 0; i < k; i++) sum += exp(probs[order[i]] - mx);
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    double r = (*rng >> 11) / 9007199254740992.0 * sum, acc = 0.0;
    for (int i = 0; i < k; i++) {
        acc += exp(probs[order[i]] - mx);
        if (r < acc) return order[i];
    }
    return order[k - 1];
}

// Returns the mean loss over `steps` batches. *done (when not NULL: ./train eval) gets the batches
// done, fewer when a stop signal came (checked between batches); training's validation always
// finishes, since its loss is logged as the run's.
static float validate(Pipeline *p, TokenSet *val, Comm *cp_comm, int B, int T, int steps, int *done) {
    GPT2 *m = p->model;
    int cp = m->lay->cp.size, Tl = T / cp;
    int32_t *inp = xmalloc(sizeof(int32_t) * B * T), *tgt = xmalloc(sizeof(int32_t) * B * T);
    int32_t *linp = xmalloc(sizeof(int32_t) * B * Tl), *ltgt = xmalloc(sizeof(int32_t) * B * Tl);
    double sum = 0.0;
    int s = 0;
    for (; s < steps && !(done && stop_agreed(m->lay)); s++) {
        for (int b = 0; b < B; b++) tokenset_sequence(val, (uint64_t)s * B + b, inp + b * T, tgt + b * T);
        if (cp > 1) { // this rank's positions
            cp_slice(inp, linp, B, Tl, cp, m->lay->cp.rank);
            cp_slice(tgt, ltgt, B, Tl, cp, m->lay->cp.rank);
        }
        sum += pipeline_forward(p, cp > 1 ? linp : inp, cp > 1 ? ltgt : tgt, B, Tl);
    }
    free(inp);
    free(tgt);
    free(linp);
    free(ltgt);
    // the loss lives on the head's stage; each context-parallel rank has the mean of its share of the tokens
    if (done) *done = s;
    return (float)(comm_sum_double(cp_comm, comm_sum_double(layout_group(&m->lay->pp), sum)) / ((double)(s ? s : 1) * cp));
}

// ---------------------------------------------------------------------------------------------
// injected faults

// LLM4D_FAULT, a testing aid: faults injected into this process, items "rank=R,step=S[,at=WHAT]
// [,ms=M][,launch=N]" separated by ';'. WHAT: kill (the default; rank R SIGKILLs itself as step S
// begins), ckpt-write (it SIGKILLs itself halfway through its shard of the checkpoint of step S), nan
// or spike (its loss of step S becomes NaN or 1000 times larger, a silent data corruption), slow
// (every step from S on computes M ms longer). An item applies to launch N of --max-restarts (0, the
// first launch, by default; the launcher sets LLM4D_LAUNCH).
typedef struct {
    int kill_step, ckpt_kill_step, nan_step, spike_step, slow_from, slow_ms, term_step, int_step, term2_step, sample_term_step;
} Faults;

static void parse_faults(Faults *f, int rank, int nranks) {
    *f = (Faults){ -1, -1, -1, -1, -1, 0, -1, -1, -1, -1 };
    const char *spec = getenv("LLM4D_FAULT"), *l = getenv("LLM4D_LAUNCH");
    if (!spec || !*spec) return;
    int launch = l ? (int)parse_int("LLM4D_LAUNCH", l, 0, INT32_MAX) : 0;
    char *copy = strdup(spec), *items = NULL;
    if (!copy) die("out of memory");
    for (char *item = strtok_r(copy, ";", &items); item; item = strtok_r(NULL, ";", &items)) {
        int r = -1, s = -1, ms = 0, when = 0;
        const char *at = "kill";
        char *kvs = NULL;
        for (char *kv = strtok_r(item, ",", &kvs); kv; kv = strtok_r(NULL, ",", &kvs)) {
            char *eq = strchr(kv, '=');
            if (!eq) die("LLM4D_FAULT: expected key=value, got '%s'", kv);
            *eq = 0;
            const char *v = eq + 1;
            if (!strcmp(kv, "rank")) r = (int)parse_int("LLM4D_FAULT rank", v, 0, INT32_MAX);
            else if (!strcmp(kv, "step")) s = (int)parse_int("LLM4D_FAULT step", v, 0, INT32_MAX);
            else if (!strcmp(kv, "ms")) ms = (int)parse_int("LLM4D_FAULT ms", v, 0, 3600000);
            else if (!strcmp(kv, "launch")) when = (int)parse_int("LLM4D_FAULT launch", v, 0, INT32_MAX);
            else if (!strcmp(kv, "at")) at = v;
            else die("LLM4D_FAULT: unknown key '%s' (rank, step, at, ms, launch)", kv);
        }
        if (r < 0 || s < 0) die("LLM4D_FAULT: every item needs rank= and step=");
        if (r >= nranks) die("LLM4D_FAULT: rank=%d is not a rank of this %d-rank job", r, nranks);
        int *slot = !strcmp(at, "kill") ? &f->kill_step : !strcmp(at, "ckpt-write") ? &f->ckpt_kill_step
                  : !strcmp(at, "nan") ? &f->nan_step : !strcmp(at, "spike") ? &f->spike_step
                  : !strcmp(at, "slow") ? &f->slow_from : !strcmp(at, "sigterm") ? &f->term_step
                  : !strcmp(at, "sigint") ? &f->int_step : !strcmp(at, "sigterm-twice") ? &f->term2_step
                  : !strcmp(at, "sigterm-sample") ? &f->sample_term_step : NULL;
        if (!slot)
            die("LLM4D_FAULT: at=%s is not kill, ckpt-write, nan, spike, slow, sigterm, sigterm-twice, sigterm-sample or sigint", at);
        if (r != rank || when != launch) continue;
        *slot = s;
        if (slot == &f->slow_from) f->slow_ms = ms;
    }
    free(copy);
}

// ---------------------------------------------------------------------------------------------
// the layout (layout.h)

// The world from the launcher's environment (none: one process), and this rank's place in it.
static void layout_init(Layout *l, LaunchEnv *env, const Options *o) {
    Comm *world = NULL;
    memset(env, 0, sizeof *env);
    if (launch_env_read(env)) {
        // the ring and the hierarchy move host memory only so far: a GPU run's auto stays with the fan-in
        int gpu = o->device ? !strcmp(o->device, "cuda") : cuda_device_count() > 0;
        int algo = o->algo == COMM_ALGO_AUTO && gpu ? COMM_ALGO_FANIN : o->algo;
        CommOptions copt = { .timeout = o->comm_timeout, .transport = o->transport, .algo = algo, .log = 1, .ib_dev = o->ib_dev,
                             .ib_gid_index = o->ib_gid_index, .stop_requested = stop_while_forming };
        world = comm_init(env, &copt);
    }
    layout_place(l, world ? comm_rank(world) : 0, world ? comm_size(world) : 1, o->tp, o->cp, o->pp);
    l->sp = o->sp;
    l->zero = o->zero;
    l->recompute = o->recompute;
    l->bucket_mb = o->bucket_mb;
    // the schedule decides where the head sits, so which stages hold the tied embedding (layout_connect)
    int kind = o->pp_schedule >= 0 ? o->pp_schedule : o->pp > 1 && o->pp_virtual > 1 ? SCHED_INTERLEAVED : SCHED_1F1B;
    l->schedule = o->pp > 1 ? kind : SCHED_1F1B; // one stage: nothing to schedule
    memcpy(l->pp_times, o->pp_times, sizeof l->pp_times);
    l->pp_times_auto = o->pp_times_auto;
    layout_connect(l, world);
}

// Whether every rank can go on: a problem (err) is printed once, by the lowest rank that has one, in
// one line; the other ranks exit quietly.
static void agree_or_exit(const Layout *l, const char *err) {
    int32_t mine = err ? -l->rank : INT32_MIN, lowest = mine; // the maximum of -rank: there is no OP_MIN
    if (l->world) comm_all_reduce(l->world, &mine, &lowest, 1, CT_I32, OP_MAX);
    if (lowest == INT32_MIN) return;
    if (err && -lowest == l->rank) die("%s", err);
    exit(1);
}

// ---------------------------------------------------------------------------------------------
// the trainer

typedef struct { // --skip-spikes: the recent applied steps
    int n;
    float loss[SPIKE_WINDOW], norm[SPIKE_WINDOW];
    int64_t skipped;
} SpikeGuard;
#define SPIKE_MIN_HISTORY 5 // steps before the running mean is trusted (non-finite values are always skipped)

typedef struct {
    Options o;
    LaunchEnv env;
    Layout lay; // built once (trainer_init), read-only afterwards
    const Backend *be;
    DType dt;
    GPT2Config cfg;
    int Tl;                  // positions of a sequence on this rank: T / CP
    long long batch_tokens, G; // G: sequences per step
    TokenSet train, val;
    int have_train, have_tk;
    int *prompt, nprompt; // what samples continue
    Tokenizer tk;
    CkptMeta src; // sample and eval from a checkpoint: its manifest
    GPT2 model;
    Zero zero;
    Pipeline pipe;
    Ckpt *ckpt;
    int ckpt_lock; // rank 0: the descriptor holding --ckpt-dir's lock (-1: none)
    int start_step, end_step, resumed;
    int resumed_validated, resumed_sampled; // what the checkpoint's run did at start_step's boundary
    int validated, sampled;                 // what evaluate() did at this boundary (the checkpoint after it records it)
    int val_batches; // --val-steps (eval's --batches), at most the batches of distinct windows --val holds
    int stopping;  // a stop signal reached some rank: the run ends at this boundary (or ended there anyway)
    int cut_short; // sample or eval stopped early by a stop signal (every rank alike)
    int32_t *inputs, *targets; // this rank's tokens of a step (its positions of them under context parallelism)
    int32_t *full_in, *full_tgt; // context parallelism: the whole sequences they are cut from
    Report rep;
    StepTimes times; // this step's: reset at its start, filled by the model, ZeRO, the pipeline and the ring
    SpikeGuard spikes;
    Faults faults;
    double flops_per_token, stall_ms; // the checkpoint stall before the coming step
    int64_t stall_step[4];
    double stall_hist[4]; // recent checkpoints' stalls, for their completion records
    int nstalls;
    CkptEvent last_ckpt; // rank 0: the newest finished checkpoint (step -1: none yet), for the exit status
    FILE *out; // the run's results: stdout, but for sample and eval the text or the loss alone (results_apart)
} Trainer;

static void setup_device(Trainer *t) {
    const Options *o = &t->o;
    int ncuda = cuda_device_count();
    if (o->device ? !strcmp(o->device, "cuda") : ncuda > 0) {
        if (!backend_cuda()) die("--device cuda: this binary was built without CUDA (make found no nvcc, or was run with NVCC= empty): rebuild with nvcc on the PATH or NVCC=/path/to/nvcc");
        if (ncuda == 0) {
            char why[256];
            cuda_unavailable_reason(why, sizeof why);
            die("--device cuda: %s", why);
        }
        if (t->lay.world) cuda_use_device(t->env.local_rank % ncuda); // one GPU per rank of this node
        t->be = backend_cuda();
    } else {
        t->be = backend_cpu();
    }
    const char *isa = getenv("LLM4D_CPU_ISA"); // unset or empty: the best this CPU has
    if (isa && *isa && !cpu_select_isa(isa)) {
        if (!strcmp(isa, "avx512bf16")) die("LLM4D_CPU_ISA=avx512bf16: this CPU does not have AVX512-BF16");
        die("LLM4D_CPU_ISA must be generic or avx512bf16, got '%s'", isa);
    }
    // ranks sharing a machine share its cores: OpenMP threads that outnumber the cores spin against
    // each other and against the progress threads, and a step can take 100x longer
    int threads = o->threads, here = t->lay.world ? comm_machine_ranks(t->lay.world) : 1;
    if (!threads && here > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores / here > 1 ? (int)(cores / here) : 1;
    }
    if (threads) t->be->set_threads(threads);
    t->dt = o->dtype >= 0 ? (DType)o->dtype : (t->be == backend_cpu() ? DT_F32 : DT_BF16);
    // the model, ZeRO, the pipeline and the context-parallel ring hand device buffers to the collectives,
    // which move them in place (devmem.h: CUDA IPC inside a node, pinned staging across nodes); host
    // buffers stay on the host
    if (t->be->mem_kind == MEMKIND_DEVICE) {
        const DevMem *dev = devmem_cuda(); // after cuda_use_device: the progress threads use that device
        Layout *l = &t->lay;
        Comm *all[16];
        for (int i = 0, n = layout_comms(l, all, 16); i < n; i++) comm_use_device(all[i], dev);
    }
}

// The batch of every rank and the layout's checks (options.c's check_layout, which the --nproc launcher
// asked before it forked: here for the other launchers); the lowest rank reports a problem.
static void setup_batch(Trainer *t) {
    char err[512];
    BatchShape b;
    agree_or_exit(&t->lay, check_layout(&t->o, &t->cfg, t->lay.nranks, &b, err, sizeof err) ? err : NULL);
    t->lay.T = b.T;
    t->lay.B = b.B;
    t->lay.accum = b.accum;
    t->Tl = b.T / t->lay.cp.size;
    t->batch_tokens = b.batch_tokens;
    t->G = b.G;
}

// The tokenizer that prints samples and encodes --prompt: --tokenizer, else tokenizer.bin beside the
// first training shard, the model file, the checkpoint's directory, the first --val shard or the
// training data a checkpoint records.
static void open_tokenizer(Trainer *t) {
    const Options *o = &t->o;
    if (o->tokenizer) {
        tokenizer_load(&t->tk, o->tokenizer);
        t->have_tk = 1;
    } else {
        char dir[SAFE_PATH_MAX], path[SAFE_PATH_MAX + 16], recorded[SAFE_PATH_MAX + 16];
        const char *near[5] = { t->have_train ? t->train.shards[0].path : NULL, o->init_from, NULL,
                                o->val ? t->val.shards[0].path : NULL, NULL };
        if (o->resume_path && o->mode != MODE_TRAIN) { // DIR/ckpt_X: beside DIR (where the shards or the model were)
            dir_of(o->resume_path, dir, sizeof dir);
            near[2] = dir;
            // (the manifest's --train, as the training run named it: from where that run started)
            near[4] = t->src.train[0] ? tokenizer_beside(t->src.train, recorded, sizeof recorded) : NULL;
        }
        for (int i = 0; i < 5 && !t->have_tk; i++) {
            if (!near[i]) continue;
            char d[SAFE_PATH_MAX];
            dir_of(near[i], d, sizeof d);
            snprintf(path, sizeof path, "%s/tokenizer.bin", d);
            struct stat st;
            if (stat(path, &st) == 0) {
                tokenizer_load(&t->tk, path);
                t->have_tk = 1;
            }
        }
    }
}

// --prompt as ids: with a byte-level BPE tokenizer (GPT-2's, or one prepare trained), GPT-2's pre-tokenizer
// and the merges recovered from the file, so a prompt gets the ids its training text got; any other
// vocabulary the longest piece first (tokenizer_encode). Returns as tokenizer_encode does.
static int encode_prompt(const Tokenizer *tk, const char *text, int *out, int cap) {
    char why[256];
    Bpe *b = bpe_from_tokenizer(tk, why, sizeof why);
    if (!b) return tokenizer_encode(tk, text, out, cap);
    BpeEncoder *e = bpe_encoder_new(b);
    uint16_t *ids = NULL;
    size_t n = 0, ncap = 0;
    bpe_encode(e, (const uint8_t *)text, strlen(text), &ids, &n, &ncap);
    int k = n < (size_t)cap ? (int)n : cap;
    for (int i = 0; i < k; i++) out[i] = ids[i];
    free(ids);
    bpe_encoder_free(e);
    bpe_free(b);
    return k;
}

static void open_data(Trainer *t) {
    const Options *o = &t->o;
    // --train given with --steps 0 (an initialisation to save) is opened too: checked, and the model
    // shaped as the run that trains on it would be
    t->have_train = o->steps > 0 || o->dump || (o->train && o->mode == MODE_TRAIN);
    uint32_t t0 = 0;
    if (t->have_train) {
        if (!o->train) die("no training data: pass --train PATTERN (make shards with ./train prepare INPUT.txt DIR)");
        tokenset_open(&t->train, o->train, "--train", t->cfg.V, t->lay.T, o->shuffle, o->seed);
        tokenset_read(&t->train, 0, 1, &t0);
    }
    if (o->val) {
        tokenset_open(&t->val, o->val, "--val", t->cfg.V, t->lay.T, 0, o->seed);
        // batches of distinct windows only, as llm.c caps its validation: more would repeat them
        uint64_t fit = t->val.windows / (uint64_t)t->lay.B;
        t->val_batches = fit < (uint64_t)o->val_steps ? (fit ? (int)fit : 1) : o->val_steps;
        if (t->val_batches < o->val_steps && t->lay.lead && (o->mode == MODE_EVAL || o->val_every > 0))
            printf("note: --val holds %llu window(s) of %d tokens: %d batch(es) of %d, not the %d %s asks for (more would "
                   "repeat windows)\n", (unsigned long long)t->val.windows, t->lay.T, t->val_batches, t->lay.B, o->val_steps,
                   o->mode == MODE_EVAL ? "--batches" : "--val-steps");
    }
    open_tokenizer(t);
    // what samples continue: --prompt, else the first training token, else the end-of-text token
    if (o->prompt) {
        if (!t->have_tk) die("--prompt needs a tokenizer to encode it: --tokenizer FILE (none beside the model)");
        t->prompt = xmalloc(sizeof(int) * ((size_t)t->lay.T + 1));
        t->nprompt = encode_prompt(&t->tk, o->prompt, t->prompt, t->lay.T);
        if (t->nprompt < 0) die("--prompt: the tokenizer has no piece for byte %d of the text", -t->nprompt - 1);
        if (t->nprompt == 0) die("--prompt: empty text");
        if (t->nprompt >= t->lay.T)
            die("--prompt is %d tokens or more; the window (--seq-len) is %d, so at most %d leave room for a token", t->nprompt,
                t->lay.T, t->lay.T - 1);
    } else {
        t->prompt = xmalloc(sizeof(int));
        t->nprompt = 1;
        int eot = t->have_tk && t->tk.eot >= 0 && t->tk.eot < t->cfg.V;
        t->prompt[0] = t->have_train ? (int)t0 : eot ? t->tk.eot : 0;
        if (o->mode == MODE_SAMPLE && !t->have_train && !eot && t->lay.lead) // a byte-level model: byte 0 starts nothing it read
            fprintf(stderr, "note: no --prompt, and no <|endoftext|> token to start from: the sample starts from "
                    "token 0, which the model may never have seen; --prompt TEXT gives it a start\n");
    }
    for (int i = 0; i < t->nprompt; i++)
        if (t->prompt[i] >= t->cfg.V)
            die("--prompt: token %d is outside the model's vocabulary of %d (the tokenizer's is %d)", t->prompt[i], t->cfg.V,
                t->tk.vocab);
}

// The log is written in place (it may be /dev/stdout); a regular file or symlink goes through the
// safe-write checks, since a resumed run rewrites it.
static int check_log(const char *path, char *err, size_t cap) {
    struct stat st;
    char target[SAFE_PATH_MAX];
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return 0;
    return safe_check("--log", path, target, sizeof target, err, cap) < 0 ? -1 : 0;
}

// Whether the existing regular file at path is one of the files the glob pattern `input` names (by
// device and inode, whatever the paths look like).
static int is_input(const char *path, const char *input) {
    struct stat out, in;
    glob_t g;
    if (!input || stat(path, &out) != 0 || !S_ISREG(out.st_mode) || glob(input, 0, NULL, &g) != 0) return 0;
    int same = 0;
    for (size_t i = 0; i < g.gl_pathc && !same; i++)
        same = stat(g.gl_pathv[i], &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino;
    globfree(&g);
    return same;
}

// Where output file `path` will be: its directory resolved, then its name (empty when the directory
// does not resolve: safe_check reports that).
static void output_target(const char *path, char *out, size_t cap) {
    char d[SAFE_PATH_MAX], real[PATH_MAX];
    if (realpath(path, real)) { // there already (a symlink: its target, where the output goes)
        snprintf(out, cap, "%s", real);
        return;
    }
    dir_of(path, d, sizeof d);
    const char *slash = strrchr(path, '/');
    if (realpath(d, real)) snprintf(out, cap, "%s/%s", real, slash ? slash + 1 : path);
    else out[0] = 0;
}

// An output file that is an input, another output or part of a checkpoint: the log is opened before
// the data is read (emptying a shard it names), and every output replaces what is there. The trained
// model may take --init-from's place (training on in place); it may not take data's.
static int output_clash(const Options *o, char *err, size_t cap) {
    const char *out[3][2] = { { "--log", o->log }, { "--save-model", o->save_model }, { "--pp-schedule-dump", o->pp_schedule_dump } };
    char tk[3][SAFE_PATH_MAX + 16];
    const char *in[7][2] = { { "--train", o->train }, { "--val", o->val }, { "--tokenizer", o->tokenizer }, { "--init-from", o->init_from },
                             // the tokenizers read without --tokenizer
                             { "the tokenizer beside --train", o->tokenizer ? NULL : tokenizer_beside(o->train, tk[0], sizeof tk[0]) },
                             { "the tokenizer beside --val", o->tokenizer ? NULL : tokenizer_beside(o->val, tk[1], sizeof tk[1]) },
                             { "the tokenizer beside --init-from", o->tokenizer ? NULL : tokenizer_beside(o->init_from, tk[2], sizeof tk[2]) } };
    if (o->ckpt_dir && ckpt_is_complete(o->ckpt_dir))
        return snprintf(err, cap, "--ckpt-dir %s is a checkpoint (it holds manifest.json): give the directory that holds the checkpoints",
                        o->ckpt_dir), -1;
    for (int i = 0; i < 3; i++) {
        if (!out[i][1]) continue;
        for (int j = 0; j < 7; j++)
            if (!(i == 1 && j == 3) && is_input(out[i][1], in[j][1]))
                return snprintf(err, cap, j < 4 ? "%s %s is a file of %s %s: writing it would destroy that input"
                                                : "%s %s is %s (%s), which this run reads: writing it would destroy it",
                                out[i][0], out[i][1], in[j][0], in[j][1]), -1;
        char a[SAFE_PATH_MAX + PATH_MAX], b[SAFE_PATH_MAX + PATH_MAX];
        output_target(out[i][1], a, sizeof a);
        for (int j = 0; j < i && a[0]; j++) {
            if (!out[j][1]) continue;
            output_target(out[j][1], b, sizeof b);
            if (!strcmp(a, b))
                return snprintf(err, cap, "%s %s and %s %s are the same file: each would overwrite the other", out[j][0], out[j][1],
                                out[i][0], out[i][1]), -1;
        }
        char dir[SAFE_PATH_MAX];
        dir_of(out[i][1], dir, sizeof dir);
        if (ckpt_is_complete(dir))
            return snprintf(err, cap, "%s %s is inside the checkpoint %s (it holds manifest.json): write it elsewhere", out[i][0],
                            out[i][1], dir), -1;
    }
    return 0;
}

// Every output location is checked before any work: a missing directory or a device node at a model
// path is found now, not after the run.
static void check_outputs(const Trainer *t) {
    const Options *o = &t->o;
    const Layout *l = &t->lay;
    char err[2 * SAFE_PATH_MAX] = "", target[SAFE_PATH_MAX];
    int bad = l->lead && output_clash(o, err, sizeof err) < 0;
    if (!bad && l->lead && o->mode == MODE_TRAIN && o->resume_path) { // before any directory is made or locked
        char buf[SAFE_PATH_MAX + 64];
        const char *why = ckpt_named_problem(o->resume_path, buf, sizeof buf);
        if (why) bad = snprintf(err, sizeof err, "--resume %s: %s", o->resume_path, why) > 0;
    }
    if (!bad && l->lead && o->save_model) {
        int link = safe_check("--save-model", o->save_model, target, sizeof target, err, sizeof err);
        bad = link < 0;
        if (link == 1) printf("note: --save-model %s is a symlink: the model goes to its target, %s\n", o->save_model, target);
    }
    if (!bad && l->lead && o->save_hf) bad = ensure_dir("--save-hf", o->save_hf, err, sizeof err) < 0;
    if (!bad && l->lead && o->log) bad = check_log(o->log, err, sizeof err) < 0;
    if (!bad && l->lead && o->pp_schedule_dump)
        bad = safe_check("--pp-schedule-dump", o->pp_schedule_dump, target, sizeof target, err, sizeof err) < 0;
    if (!bad && o->ckpt_dir) bad = ensure_dir("--ckpt-dir", o->ckpt_dir, err, sizeof err) < 0;
    if (!bad && l->lead && o->dump) bad = ensure_dir("--dump", o->dump, err, sizeof err) < 0;
    if (!bad && o->pp_trace && l->dp.rank == 0 && l->cp.rank == 0 && l->tp.rank == 0) bad = ensure_dir("--pp-trace", o->pp_trace, err, sizeof err) < 0;
    agree_or_exit(l, bad ? err : NULL);
}

// What a checkpoint of the state after `step` steps records besides the tensors.
static void fill_meta(const Trainer *t, int step, CkptMeta *m) {
    const Options *o = &t->o;
    memset(m, 0, sizeof *m);
    m->step = step;
    m->adam_t = t->zero.t;
    m->seed = o->seed;
    m->shuffle = o->shuffle;
    m->model = t->cfg;
    m->ranks = t->lay.nranks;
    m->dp = t->lay.dp.size;
    m->tp = t->lay.tp.size;
    m->pp = t->lay.pp.size;
    m->cp = t->lay.cp.size;
    m->pp_virtual = t->lay.chunks;
    m->zero = t->zero.model ? t->zero.stage : o->zero;
    m->sp = o->sp;
    m->bucket_mb = o->bucket_mb;
    snprintf(m->dtype, sizeof m->dtype, "%s", dtype_name(t->dt));
    m->micro_batch = t->lay.B;
    m->seq_len = t->lay.T;
    m->batch_tokens = t->batch_tokens;
    snprintf(m->train, sizeof m->train, "%s", o->train ? o->train : "");
    m->train_tokens = t->have_train ? t->train.ntokens : 0;
    snprintf(m->train_fp, sizeof m->train_fp, "%s", t->have_train ? tokenset_fingerprint(&t->train) : "");
    snprintf(m->schedule, sizeof m->schedule, "%s", o->schedule);
    m->lr = o->lr;
    m->lr_min_frac = o->lr_min_frac;
    m->beta1 = o->beta1;
    m->beta2 = o->beta2;
    m->eps = o->eps;
    m->weight_decay = o->weight_decay;
    m->clip = o->clip;
    m->warmup = o->warmup;
    m->steps = o->steps;
    m->skip_spikes = o->skip_spikes;
    m->skipped = t->spikes.skipped;
    m->nhist = t->spikes.n;
    memcpy(m->hist_loss, t->spikes.loss, sizeof m->hist_loss);
    memcpy(m->hist_norm, t->spikes.norm, sizeof m->hist_norm);
    m->validated = t->validated, m->sampled = t->sampled; // (a checkpoint is written right after its boundary's evaluate)
}

// The option that named the checkpoint read: sample and eval take it as --model DIR.
static const char *resume_flag(const Options *o) { return o->mode == MODE_TRAIN ? "--resume" : "--model"; }

// The model, the optimizer state and the pipeline: from a checkpoint (--resume), else from the seed or
// --init-from (host_params, the full model in file order).
static void build_model(Trainer *t, float *host_params) {
    const Options *o = &t->o;
    Layout *l = &t->lay;
    int P = l->pp.size, V = P > 1 ? o->pp_virtual : 1; // (check_layout has checked the split)
    int kind = l->schedule; // (layout_init; zb-v's two chunks: parse_options)
    if (V > 1 && kind != SCHED_INTERLEAVED && kind != SCHED_ZBV)
        die("--pp-schedule %s runs one chunk per stage: --pp-virtual %d is for the interleaved schedule", SCHEDULE_NAMES[kind], V);
    layout_place_stages(l, t->cfg.L, V, o->pp_layers);
    t->times.profile = o->profile;
    layout_build_model(l, &t->cfg, t->dt, t->be, &t->times, &t->model);
    size_t n = t->model.num_params;
    float *master = xmalloc(sizeof(float) * n), *m = NULL, *v = NULL;
    CkptMeta saved;
    if (o->resume) {
        m = xmalloc(sizeof(float) * n);
        v = xmalloc(sizeof(float) * n);
        CkptMeta now;
        fill_meta(t, 0, &now);
        if (o->mode != MODE_TRAIN) { // sample and eval read the weights only: the data position does not matter
            now.seq_len = t->src.seq_len;
            now.batch_tokens = t->src.batch_tokens;
            now.shuffle = t->src.shuffle;
            now.seed = t->src.seed;
            now.train_tokens = 0;
        }
        if (o->allow_data_change) now.train_tokens = 0; // another token count too
        char from[SAFE_PATH_MAX];
        t->resumed = ckpt_resume(o->ckpt_dir, o->resume_path, resume_flag(o), &t->model, l->world, &now, &saved, master, m, v, from, sizeof from);
        if (t->resumed && t->have_train) { // the same data as the checkpoint's, by content
            char why[2 * SAFE_PATH_MAX], msg[3 * SAFE_PATH_MAX + 128];
            int same = tokenset_fingerprint_check(&t->train, saved.train_fp, why, sizeof why);
            snprintf(msg, sizeof msg, "--resume %s: %s: pass --allow-data-change to train on other data on purpose", from, why);
            agree_or_exit(l, same < 0 && !o->allow_data_change ? msg : NULL);
            if (l->lead && same < 0) printf("note: --allow-data-change: %s\n", why);
            if (l->lead && same > 0)
                fprintf(stderr, "warning: %s records no fingerprint of its training data (written before them): the data "
                        "is not compared\n", from);
        }
        if (t->resumed) {
            t->start_step = (int)saved.step;
            t->resumed_validated = saved.validated, t->resumed_sampled = saved.sampled;
            t->spikes.n = saved.nhist;
            t->spikes.skipped = saved.skipped;
            memcpy(t->spikes.loss, saved.hist_loss, sizeof saved.hist_loss);
            memcpy(t->spikes.norm, saved.hist_norm, sizeof saved.hist_norm);
            if (l->lead)
                printf("resumed from %s: step %lld (written by %d rank(s): DP %d x PP %d x CP %d x TP %d, ZeRO-%d)\n", from,
                       (long long)saved.step, saved.ranks, saved.dp, saved.pp, saved.cp, saved.tp, saved.zero);
            // unshuffled (a shuffled run refuses another seed), a seed moves only the samples from here
            if (l->lead && o->mode == MODE_TRAIN && saved.seed != o->seed)
                printf("note: --seed %llu, the checkpoint's %llu: the samples from here follow this run's seed (the data "
                       "order is unshuffled, the same either way)\n", (unsigned long long)o->seed, (unsigned long long)saved.seed);
            if (l->lead && o->mode == MODE_TRAIN) note_schedule_change(o, &saved);
        } else if (l->lead) {
            printf("note: --resume: no complete checkpoint in %s, starting from step 0\n", o->ckpt_dir);
        }
    }
    if (!t->resumed) {
        if (!host_params) host_params = gpt2_init_params(&t->cfg, o->seed);
        gpt2_full_to_local(&t->model, host_params, master);
    }
    free(host_params);
    if (t->model.params) gpt2_upload_params(&t->model, master); // ZeRO-3 keeps no full working copy
    AdamWConfig acfg = { o->beta1, o->beta2, o->eps, o->weight_decay, o->clip };
    layout_build_state(l, &t->model, &t->zero, &t->pipe, master, &acfg);
    t->pipe.keep_times = t->o.pp_schedule_dump != NULL; // each action's times, for the dump at the end
    if (t->resumed) zero_set_moments(&t->zero, m, v, (int)saved.adam_t);
    free(master);
    free(m);
    free(v);
    t->end_step = o->steps;
}

// The model's shape as flags that give it exactly (what --resume takes in place of --init-from-hf).
static void shape_flags(const GPT2Config *c, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s--layers %d --channels %d --heads %d --vocab %d --max-seq-len %d", c->arch == ARCH_LLAMA ? "--arch llama " : "",
                     c->L, c->C, c->NH, c->V, c->maxT);
    char rs[96], eps[32];
    snprintf(eps, sizeof eps, "%g", c->norm_eps); // the shortest that reads back as the same float
    if ((float)strtod(eps, NULL) != c->norm_eps) snprintf(eps, sizeof eps, "%.9g", c->norm_eps);
    if (c->arch == ARCH_LLAMA && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " --kv-heads %d --ffn %d --tie-embeddings %d --norm-eps %s --rope-theta %.17g --rope-scaling %s",
                 c->NKV, c->F, c->tie, eps, c->rope.theta, rope_scaling_text(&c->rope, rs, sizeof rs));
}

static void setup_checkpoints(Trainer *t) {
    const Options *o = &t->o;
    if (!o->ckpt_dir) return;
    char err[3 * SAFE_PATH_MAX] = "", how[SAFE_PATH_MAX] = "", shape[512];
    if (o->init_from || o->init_from_hf) { // --resume refuses them: it takes the checkpoint's weights, the shape from flags
        shape_flags(&t->cfg, shape, sizeof shape);
        snprintf(how, sizeof how, "pass --resume in place of %s, with its shape as flags (%s),", o->init_from ? "--init-from" : "--init-from-hf", shape);
    }
    int bad = t->lay.lead && ckpt_prepare_dir(o->ckpt_dir, t->start_step, o->resume, !o->resume_path, *how ? how : NULL, err, sizeof err) < 0;
    agree_or_exit(&t->lay, bad ? err : NULL); // also: nobody writes before rank 0 has cleaned up
    t->ckpt = ckpt_open(o->ckpt_dir, &t->model, &t->zero, t->lay.world, o->keep);
    if (t->faults.ckpt_kill_step >= 0) ckpt_kill_during_write(t->ckpt, t->faults.ckpt_kill_step);
}

// What the defaults chose that a user should hear about, before the first step (after every check that
// can refuse the run): a tokenizer whose vocabulary is not the model's (the model's ids above it print
// as <id>), the vocabulary taken from the data's tokenizer, and a default model far too large for this
// machine. The step-time rule:
// flops_per_token x batch tokens / (the node's cores x 30 GFLOP/s), the fp32 matmul rate of one
// current x86 core (a stated rate, not a measured one); "far too large" is above 10 s a step.
#define CPU_CORE_FLOPS 30e9
static void warn_defaults(const Trainer *t) {
    const Options *o = &t->o;
    if (t->have_tk && t->tk.vocab != t->cfg.V)
        fprintf(stderr, "warning: the model's vocabulary is %d but the tokenizer's is %d: samples print the ids the "
                "tokenizer lacks as <id>%s\n", t->cfg.V, t->tk.vocab, o->vocab ? " (drop --vocab to take the tokenizer's)" : "");
    if (o->mode != MODE_TRAIN) return;
    if (o->sample_every > 0 && o->sample_tokens > t->lay.T - t->nprompt)
        printf("note: --sample-tokens %d: the %d-token window (--seq-len) leaves %d after the prompt; samples have %d\n",
               o->sample_tokens, t->lay.T, t->lay.T - t->nprompt, t->lay.T - t->nprompt);
    if (t->resumed && t->start_step >= o->steps)
        printf("note: the checkpoint resumed is at step %d, --steps %d: nothing left to train\n", t->start_step, o->steps);
    int default_shape = !o->init_from && !o->init_from_hf && !o->preset && !o->layers && !o->channels && !o->heads;
    if (!o->vocab && !o->init_from && !o->init_from_hf && !t->resumed && o->train && t->have_tk && t->cfg.V == t->tk.vocab)
        printf("note: vocabulary %d from the tokenizer beside the training data (--vocab V overrides it)\n", t->cfg.V);
    if (!default_shape || o->steps == 0 || t->be != backend_cpu()) return;
    // the cores the step runs on: every core, unless --threads holds the machine's ranks to fewer
    long cores = sysconf(_SC_NPROCESSORS_ONLN), ranks = t->lay.world ? comm_machine_ranks(t->lay.world) : 1;
    if (cores < 1) cores = 1;
    if (o->threads && o->threads * ranks < cores) cores = o->threads * ranks;
    double s = t->flops_per_token * (double)t->batch_tokens / ((double)cores * CPU_CORE_FLOPS);
    if (s > 10)
        fprintf(stderr, "warning: the default model (d12, %zu parameters) needs about %.0f s a step here (%.3g FLOPs a step "
                "on %ld core(s) at a stated %.0f GFLOP/s each): give a smaller shape, e.g. --layers 4 --channels 128 --heads "
                "4 (the demo's)\n", gpt2_param_layout(&t->cfg, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 }), s, t->flops_per_token * (double)t->batch_tokens, cores,
                CPU_CORE_FLOPS / 1e9);
}

// ./train sample and eval: their one result (the text, the loss) alone on standard output, so that
// `./train sample ... > out.txt` holds the text; every other line the run prints (the header, notes, the
// collectives' line) goes where stdout's file descriptor now points, standard error.
static FILE *results_apart(void) {
    // with standard error or output closed (2>&-, >&-) there is nowhere to set the results apart from
    if (fcntl(STDERR_FILENO, F_GETFD) < 0 || fcntl(STDOUT_FILENO, F_GETFD) < 0) return stdout;
    fflush(stdout);
    int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3); // above 2, whatever is open
    if (fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) die("cannot set standard output apart for the results: %s", strerror(errno));
    FILE *f = fdopen(fd, "w");
    if (!f) die("cannot open standard output for the results: %s", strerror(errno));
    return f;
}

static void trainer_init(Trainer *t, int argc, char **argv) {
    memset(t, 0, sizeof *t);
    Options *o = &t->o;
    parse_options(o, argc, argv);
    t->out = o->mode == MODE_TRAIN ? stdout : results_apart();
    if (o->max_restarts && !getenv("LLM4D_LAUNCH"))
        die("--max-restarts relaunches a --nproc job (under Slurm, scripts/train.sbatch relaunches job steps)");
    signal(SIGXFSZ, SIG_IGN); // a file over the size limit is a write error (EFBIG), not the end of the process
    layout_init(&t->lay, &t->env, o);
    Layout *l = &t->lay;
    if (o->dump && l->nranks > 1) die("--dump works on a single rank only");
    check_outputs(t);
    char err[2 * SAFE_PATH_MAX] = ""; // the checkpoint directory locked before anything in it is read or changed
    t->ckpt_lock = -1;
    t->last_ckpt.step = -1;
    // sample and eval only read a complete checkpoint, verifying it as they read: a run holding its
    // directory goes on (its --keep may remove the checkpoint mid-read, and the read then fails in one
    // line), where a resumed training run would mix with it
    const char *resumes = o->mode == MODE_TRAIN ? o->resume_path : NULL;
    agree_or_exit(l, l->lead && ckpt_lock(o->ckpt_dir, resumes, resume_flag(o), &t->ckpt_lock, err, sizeof err) < 0 ? err : NULL);
    parse_faults(&t->faults, l->rank, l->nranks);
    setup_device(t);
    float *host_params;
    if (o->mode != MODE_TRAIN && o->resume_path) { // sample, eval: the shape from the checkpoint's manifest
        if (o->model_step >= 0 && l->world) { // --model DIR: every rank reads rank 0's newest, found before a
            int64_t s = o->model_step;        // run still writing into DIR added another
            comm_broadcast(l->world, &s, 1, CT_I64, 0);
            if (s != o->model_step) ckpt_path(o->model_path, s, o->owned_path, SAFE_PATH_MAX), o->model_step = s;
        }
        char why[2 * SAFE_PATH_MAX], msg[3 * SAFE_PATH_MAX];
        int bad = ckpt_read_meta(o->resume_path, &t->src, why, sizeof why) != 0;
        if (bad && o->model_step >= 0 && !ckpt_is_complete(o->resume_path)) // (removed by that run's --keep)
            snprintf(msg, sizeof msg, "--model %s: its newest checkpoint, %s, went away while it was being read (a run's --keep "
                     "removes old ones): run it again", o->model_path, o->resume_path);
        else if (bad)
            snprintf(msg, sizeof msg, "--model: %s", why);
        agree_or_exit(l, bad ? msg : NULL);
    }
    t->cfg = resolve_shape(o, &t->src, &host_params);
    if (t->cfg.NH % l->tp.size) die("--tp %d does not divide the model's %d heads", l->tp.size, t->cfg.NH);
    if (o->sp && l->tp.size == 1) die("--sp needs tensor parallelism (--tp 2 or more)");
    setup_batch(t);
    open_data(t); // before any large allocation, so that a bad file is reported first
    build_model(t, host_params);
    setup_checkpoints(t);
    t->flops_per_token = gpt2_flops_per_token(&t->cfg, t->lay.T);
    report_init(&t->rep, l, o, t->batch_tokens, t->flops_per_token);
    report_header(&t->rep, &t->model, &t->zero, t->have_train ? &t->train : NULL, t->ckpt);
    report_open(&t->rep, t->resumed, t->start_step, t->env.node_id);
    if (l->lead) warn_defaults(t);
    size_t step_tokens = (size_t)t->lay.accum * t->lay.B * t->Tl;
    t->inputs = xmalloc(sizeof(int32_t) * step_tokens);
    t->targets = xmalloc(sizeof(int32_t) * step_tokens);
    if (l->cp.size > 1) {
        t->full_in = xmalloc(sizeof(int32_t) * step_tokens * l->cp.size);
        t->full_tgt = xmalloc(sizeof(int32_t) * step_tokens * l->cp.size);
    }
}

// ---------------------------------------------------------------------------------------------
// the step

// This rank's sequences of step `step`: a contiguous block of accum x B of the global batch (under
// context parallelism, this rank's positions of them).
static void next_batch(Trainer *t, int step) {
    int cp = t->lay.cp.size, n = t->lay.accum * t->lay.B;
    int32_t *in = cp > 1 ? t->full_in : t->inputs, *tgt = cp > 1 ? t->full_tgt : t->targets;
    for (int i = 0; i < n; i++) {
        uint64_t g = (uint64_t)step * t->G + (uint64_t)t->lay.dp.rank * n + i;
        tokenset_sequence(&t->train, g, in + (size_t)i * t->lay.T, tgt + (size_t)i * t->lay.T);
    }
    if (cp == 1) return;
    cp_slice(in, t->inputs, n, t->Tl, cp, t->lay.cp.rank);
    cp_slice(tgt, t->targets, n, t->Tl, cp, t->lay.cp.rank);
}

// --skip-spikes: whether to skip the update of a step with this loss and gradient norm (the same on
// every rank: the decision is combined over the world, in case one rank's loss was corrupted).
static int spike(Trainer *t, float loss, float norm) {
    SpikeGuard *g = &t->spikes;
    int32_t bad = !isfinite(loss) || !isfinite(norm), any;
    if (!bad && g->n >= SPIKE_MIN_HISTORY) {
        double ml = 0, mn = 0;
        for (int i = 0; i < g->n; i++) {
            ml += g->loss[i] / g->n;
            mn += g->norm[i] / g->n;
        }
        bad = loss > t->o.skip_spikes * ml || norm > t->o.skip_spikes * mn;
    }
    any = bad;
    if (t->lay.world) comm_all_reduce(t->lay.world, &bad, &any, 1, CT_I32, OP_MAX);
    if (any) {
        g->skipped++;
        return 1;
    }
    if (g->n == SPIKE_WINDOW) { // the oldest leaves
        memmove(g->loss, g->loss + 1, sizeof(float) * (SPIKE_WINDOW - 1));
        memmove(g->norm, g->norm + 1, sizeof(float) * (SPIKE_WINDOW - 1));
        g->n--;
    }
    g->loss[g->n] = loss;
    g->norm[g->n++] = norm;
    return 0;
}

// One optimizer step: the batch; forward, loss and backward of every micro-batch (the pipeline
// schedule, with the data-parallel reductions started inside); the reduced gradient and its norm;
// the update.
static void train_step(Trainer *t, int step, StepResult *r) {
    Layout *l = &t->lay;
    if (step + 1 == t->faults.kill_step) raise(SIGKILL);
    if (step + 1 == t->faults.term_step) raise(SIGTERM); // (a stop signal that comes during step S, for the tests)
    if (step + 1 == t->faults.int_step) raise(SIGINT);
    if (step + 1 == t->faults.term2_step) raise(SIGTERM), raise(SIGTERM); // (each handled before raise returns)
    double t0 = now_seconds(), tp_busy0 = l->tp.size > 1 ? comm_busy_seconds(l->tp.comm) : 0;
    double cp_busy0 = l->cp.comm ? comm_busy_seconds(l->cp.comm) + comm_busy_seconds(l->cp_grad) : 0;
    step_times_reset(&t->times);
    zero_begin_step(&t->zero);
    gpt2_zero_grad(&t->model);
    next_batch(t, step);

    double c0 = now_seconds(), stopped0 = report_stopped_seconds(&t->rep);
    if (t->faults.slow_from >= 0 && step + 1 >= t->faults.slow_from) { // compute that a signal does not cut short
        struct timespec left = { t->faults.slow_ms / 1000, (long)(t->faults.slow_ms % 1000) * 1000000L };
        while (nanosleep(&left, &left) != 0 && errno == EINTR) {}
    }
    double loss_sum = pipeline_step(&t->pipe, t->inputs, t->targets, t->lay.accum, t->lay.B, t->Tl, 1.0f / (float)t->batch_tokens);
    double tp_busy = l->tp.size > 1 ? comm_busy_seconds(l->tp.comm) - tp_busy0 : 0;
    // compute: the schedule's time less its waits for other ranks (pipeline hand-offs, ZeRO gathers and
    // buckets, tensor-parallel collectives, the context-parallel ring)
    r->compute_ms = (now_seconds() - c0 - t->times.pipe_wait_s - tp_busy - t->times.ring_wait_s - t->times.zero_wait_s) * 1e3;
    r->compute_stopped_ms = (report_stopped_seconds(&t->rep) - stopped0) * 1e3;
    if (step + 1 == t->faults.nan_step) loss_sum = NAN;
    if (step + 1 == t->faults.spike_step) loss_sum *= 1000;

    r->norm = zero_finish_grads(&t->zero); // first: the loss's reduction would queue behind the buckets
    // each rank's micro-batch losses are means over its B x Tl tokens, the same count on every rank
    r->loss = (float)(comm_sum_double(l->pp.comm, zero_sum_double(&t->zero, loss_sum)) / (t->lay.accum * l->dp.size * l->cp.size));

    r->lr = lr_at(&t->o, step);
    r->skipped = t->o.skip_spikes > 0 ? spike(t, r->loss, r->norm) : 0;
    if (!r->skipped && !isfinite(r->loss)) die("loss is %f at step %d: training diverged (--skip-spikes F skips such steps)", r->loss, step + 1);
    if (!r->skipped) zero_step(&t->zero, r->lr, r->norm);
    t->be->sync();
    r->ms = (now_seconds() - t0) * 1e3;
    r->comm_ms = zero_comm_ms(&t->zero);
    r->exposed_ms = t->times.zero_wait_s * 1e3;
    r->tp_ms = tp_busy * 1e3;
    r->cp_ms = l->cp.comm ? (comm_busy_seconds(l->cp.comm) + comm_busy_seconds(l->cp_grad) - cp_busy0) * 1e3 : 0;
    r->stall_ms = t->stall_ms;
    r->skipped_total = t->spikes.skipped;
    r->zero3_gathers = t->zero.stage == 3 ? t->zero.gathers : -1;
}

// ---------------------------------------------------------------------------------------------
// step boundaries: stopping, checkpoints, evaluation

// Rank 0 reports finished checkpoints: complete ones with their size and write bandwidth.
static void log_checkpoints(Trainer *t) {
    CkptEvent ev;
    while (t->ckpt && t->lay.lead && ckpt_event(t->ckpt, &ev)) {
        double stall = 0;
        for (int i = 0; i < 4; i++)
            if (t->stall_step[i] == ev.step) stall = t->stall_hist[i];
        report_checkpoint(&t->rep, &ev, stall);
        if (ev.step >= t->last_ckpt.step) t->last_ckpt = ev;
    }
}

// What every rank agrees on at each step boundary: whether to stop (a signal reached any rank), and
// whether every rank's shard of the checkpoint in flight is written. Returns 1 when the run ends here.
// A stop signal ends the run at this boundary (its checkpoint and model follow), said once. during and
// after: what the line adds about where the signal came.
static void stop_here(Trainer *t, int step, const char *during, const char *after) {
    if (t->lay.lead)
        printf("received %s%s: stopping cleanly after %d of %d steps%s%s%s\n", stop_name(), during, step, t->o.steps,
               t->ckpt && step > t->start_step ? ", with a checkpoint" : "", t->o.save_model ? " and the model saved" : "", after);
    t->end_step = step;
}

static int step_boundary(Trainer *t, int step) {
    int32_t f[2] = { stop_signal != 0, t->ckpt ? ckpt_writing(t->ckpt) : 0 }, g[2] = { f[0], f[1] };
    if (t->lay.world) comm_all_reduce(t->lay.world, f, g, 2, CT_I32, OP_MAX);
    if (t->ckpt) ckpt_advance(t->ckpt, g[1]);
    log_checkpoints(t);
    t->stopping = g[0];
    if (g[0] && step < t->end_step) {
        stop_here(t, step, "", "");
    } else if (g[0] && step > t->start_step && t->lay.lead && t->o.mode == MODE_TRAIN) {
        printf("received %s during the last step: the run ends as it would have (its last validation; no last sample)\n",
               stop_name());
    }
    return step >= t->end_step;
}

static void checkpoint(Trainer *t, int step) {
    CkptMeta meta;
    fill_meta(t, step, &meta);
    t->stall_ms = ckpt_save(t->ckpt, &meta) * 1e3;
    int i = t->nstalls++ % 4; // the completion record, a few steps later, looks it up
    t->stall_step[i] = step;
    t->stall_hist[i] = t->stall_ms;
}

// Validation and sampling run on every rank alike (ZeRO-3 gathers need every rank); rank 0 reports.
// A resumed run's first boundary does what the checkpoint's run did not do there before writing it
// (its manifest says): with the same flags nothing, so the log reads as the uninterrupted run's.
static void evaluate(Trainer *t, int step, int last) {
    const Options *o = &t->o;
    int first = t->resumed && step == t->start_step && o->mode == MODE_TRAIN;
    t->validated = t->sampled = 0;
    if (first && t->stopping) return; // no checkpoint follows to record it: the next resume does it
    // a training run stopping on a signal evaluates only what the boundary would have without it, so
    // the resumed run's log reads as the uninterrupted run's (and the checkpoint comes sooner)
    // (a signal during the last step cuts nothing short: that end is evaluated as the run's end)
    int end = last && !(o->mode == MODE_TRAIN && t->end_step < o->steps);
    if (o->val && o->val_every > 0 && (step % o->val_every == 0 || end) && !(first && t->resumed_validated)) {
        t->validated = 1;
        int done = t->val_batches;
        float vl = validate(&t->pipe, &t->val, t->lay.cp.comm, t->lay.B, t->lay.T, t->val_batches, o->mode == MODE_EVAL ? &done : NULL);
        if (done < t->val_batches) {
            t->cut_short = 1;
            if (t->lay.lead)
                fprintf(stderr, "received %s: eval stopped after %d of %d batches (their mean loss %.6f)\n", stop_name(), done,
                        t->val_batches, done ? vl : NAN);
        } else if (o->mode == MODE_EVAL && t->lay.lead)
            fprintf(t->out, "eval %s: loss %.6f | perplexity %.4f | %d batch(es) of %d x %d tokens from %s\n", o->model_path, vl,
                    exp(vl), t->val_batches, t->lay.B, t->lay.T, o->val), fflush(t->out);
        else
            report_val(&t->rep, step, vl);
    }
    // a training run that stops on a signal goes to its checkpoint without the last sample; a sample
    // under way when the signal comes stops at its next token
    if (o->sample_every > 0 && ((step > 0 && step % o->sample_every == 0) || end) && !(o->mode == MODE_TRAIN && t->stopping) &&
        !(first && t->resumed_sampled)) {
        if (step == t->faults.sample_term_step) raise(SIGTERM); // (a stop signal during the sample, for the tests)
        int cut = sample(&t->pipe, o, t->have_tk ? &t->tk : NULL, t->prompt, t->nprompt, t->lay.T, step, t->lay.lead, t->out);
        t->cut_short |= cut, t->sampled = !cut;
        // a training run stops at this boundary: its checkpoint records the sample as not done, and the
        // resumed run prints it whole (stopping at the next one would lose it)
        if (cut && o->mode == MODE_TRAIN && step < t->end_step) {
            t->stopping = 1;
            stop_here(t, step, " during the sample", "; the resumed run prints the sample");
        }
    }
}

// --dump, a testing aid (single rank): step 0's global batch tokens, the first micro-batch's logits
// by a forward that changes no state, the initial weights and the accumulated gradients (file order); the step itself then runs as usual.
static void dump_step0(Trainer *t) {
    const char *dir = t->o.dump;
    int B = t->lay.B, T = t->lay.T, V = t->cfg.V;
    next_batch(t, 0);
    gpt2_forward(&t->model, t->inputs, t->targets, B, T);
    float *logits = xmalloc(sizeof(float) * V * B * T);
    for (int b = 0; b < B; b++)
        for (int p = 0; p < T; p++) gpt2_logits_at(&t->model, b, p, T, logits + ((size_t)b * T + p) * V);
    write_raw(dir, "logits.bin", logits, sizeof(float) * V * B * T);
    free(logits);
    size_t n = t->model.num_params;
    float *w = xmalloc(sizeof(float) * n), *wf = xmalloc(sizeof(float) * n);
    zero_gather_master(&t->zero, w); // the initial weights in file order (a Llama has no --save-model)
    gpt2_gather_full(&t->model, w, wf);
    write_raw(dir, "params.bin", wf, sizeof(float) * n);
    free(w);
    free(wf);
    zero_begin_step(&t->zero);
    gpt2_zero_grad(&t->model);
    pipeline_step(&t->pipe, t->inputs, t->targets, t->lay.accum, B, T, 1.0f / (float)t->batch_tokens);
    zero_finish_grads(&t->zero);
    float *g = xmalloc(sizeof(float) * n), *gf = xmalloc(sizeof(float) * n);
    t->be->to_host(g, t->model.grads, sizeof(float) * n);
    gpt2_gather_full(&t->model, g, gf);
    write_raw(dir, "grads.bin", gf, sizeof(float) * n);
    free(g);
    free(gf);
    long long G = t->G;
    int32_t *tok = xmalloc(sizeof(int32_t) * 2 * G * T);
    for (long long i = 0; i < G; i++) tokenset_sequence(&t->train, (uint64_t)i, tok + i * T, tok + (G + i) * T);
    write_raw(dir, "tokens.bin", tok, sizeof(int32_t) * 2 * G * T);
    free(tok);
}

// The exit status: 1 when the run's last checkpoint could not be written (its end state is then saved
// nowhere but in --save-model), said in one line at the very end; rank 0 decides (it alone sees the
// checkpoints' outcomes) and the other ranks exit 0.
static int trainer_status(const Trainer *t) {
    const CkptEvent *e = &t->last_ckpt;
    if (!t->o.ckpt_dir || !t->lay.lead || e->step < 0 || e->ok) return 0;
    fflush(stdout); // the line comes last
    error_line("the last checkpoint (step %lld, %s) could not be written (%s): the run ends with an error%s",
               (long long)e->step, e->path, e->msg, t->o.save_model ? "; its model is in --save-model" : "");
    return 1;
}

static void trainer_finish(Trainer *t) {
    const Options *o = &t->o;
    if (t->ckpt) {
        ckpt_finish(t->ckpt); // the last checkpoint complete, manifest included
        log_checkpoints(t);
    }
    if (o->mode == MODE_TRAIN) report_memory_peak(&t->rep, &t->model); // every rank alike
    if (o->mode == MODE_TRAIN && o->pp_schedule_dump) report_schedule_dump(&t->rep, &t->pipe, o->pp_schedule_dump);
    report_close(&t->rep);
    if (o->save_model || o->save_hf) { // both from the one full vector in llm.c's order
        size_t full_n = gpt2_param_layout(&t->cfg, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 });
        float *host = xmalloc(sizeof(float) * t->model.num_params), *file = xmalloc(sizeof(float) * full_n);
        zero_gather_master(&t->zero, host);      // collective over the data-parallel group
        gpt2_gather_full(&t->model, host, file); // collective over the tensor-parallel group
        if (t->lay.lead && o->save_model) {
            gpt2_save_file(o->save_model, &t->cfg, file);
            printf("saved %s\n", o->save_model);
        }
        if (t->lay.lead && o->save_hf) {
            hf_save_model(o->save_hf, &t->cfg, file, (DType)o->save_hf_dtype, HF_MAX_SHARD_BYTES);
            printf("saved %s (Hugging Face, %s)\n", o->save_hf, o->save_hf_dtype == DT_BF16 ? "bf16" : "fp32");
        }
        free(host);
        free(file);
    }
    if (t->ckpt) ckpt_close(t->ckpt);
    if (t->ckpt_lock >= 0) close(t->ckpt_lock); // the directory released (an exit in any other way releases it too)
    free(t->inputs);
    free(t->targets);
    free(t->full_in);
    free(t->full_tgt);
    pipeline_free(&t->pipe);
    zero_free(&t->zero);
    gpt2_free(&t->model);
    if (t->have_train) tokenset_close(&t->train);
    if (o->val) tokenset_close(&t->val);
    if (t->have_tk) tokenizer_free(&t->tk);
    free(t->prompt);
    layout_disconnect(&t->lay);
}

static int train_main(int argc, char **argv) {
    install_stop_signals(argc >= 2 && (!strcmp(argv[1], "sample") || !strcmp(argv[1], "eval"))); // (parse_options' modes)
    Trainer t;
    trainer_init(&t, argc, argv); // layout, device, shapes, data, outputs, model and state, checkpoints
    if (t.o.dump) dump_step0(&t);
    report_start(&t.rep); // from here every second is in some step's wall time (its boundary, checkpoint, record)
    for (int step = t.start_step;; step++) {
        int last = step_boundary(&t, step);
        evaluate(&t, step, last);
        last |= step >= t.end_step; // (a sample a signal cut short ends the run here)
        if (t.ckpt && step > t.start_step && (last || (t.o.ckpt_every && step % t.o.ckpt_every == 0))) checkpoint(&t, step);
        if (last) break;
        StepResult r;
        train_step(&t, step, &r);
        report_step(&t.rep, step, &r, &t.times, &t.pipe);
        t.stall_ms = 0;
    }
    trainer_finish(&t);
    int status = trainer_status(&t);
    // sample and eval stopped by a signal did not finish their one job; a training run that stops
    // cleanly on SIGTERM or SIGUSR1 did (its checkpoint holds its work), and Ctrl-C gives 130
    if (!status && t.cut_short && t.o.mode != MODE_TRAIN) status = 128 + (stop_signal ? stop_signal : SIGTERM);
    options_free(&t.o);
    return status ? status : stop_signal == SIGINT ? 128 + SIGINT : 0;
}

// ---------------------------------------------------------------------------------------------

// --nproc N [--max-restarts R]: launches the ranks; when the job fails (not when a signal stopped the
// launcher), relaunches it, with --resume once --ckpt-dir holds a complete checkpoint, up to R times.
static int launch_with_restarts(const Options *o, int nproc, int argc, char **argv) {
    char **args = xcalloc((size_t)argc + 12, sizeof(char *));
    char shape[5][16]; // --init-from's shape, for a relaunch that resumes (which refuses --init-from)
    int n = 0;
    for (int i = 0; i < argc; i++) args[n++] = argv[i];
    for (int attempt = 0;; attempt++) {
        char buf[16];
        snprintf(buf, sizeof buf, "%d", attempt);
        setenv("LLM4D_LAUNCH", buf, 1);
        LaunchResult res;
        int rc = launch_local(nproc, n, args, &res);
        if (res.cause != LAUNCH_RANK_FAILED || attempt >= o->max_restarts) {
            free(args);
            return rc;
        }
        int64_t newest;
        int have = ckpt_newest_complete(o->ckpt_dir, &newest);
        if (have)
            fprintf(stderr, "restart %d of %d: the job failed (exit status %d); relaunching from the newest complete "
                    "checkpoint (step %lld)\n", attempt + 1, o->max_restarts, rc, (long long)newest);
        else
            fprintf(stderr, "restart %d of %d: the job failed (exit status %d) before its first complete checkpoint; "
                    "relaunching it as it was\n", attempt + 1, o->max_restarts, rc);
        if (!have) continue;
        n = 0; // the newest complete checkpoint: a --resume PATH of the first launch gives way to it
        for (int i = 0; i < argc; i++) {
            if (!strcmp(argv[i], "--resume")) {
                if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) i++;
                continue;
            }
            // --init-from (or llm.c's -e FILE): its weights are the checkpoint's now; its shape stays
            if (i + 1 < argc && (!strcmp(argv[i], "--init-from") || (!strcmp(argv[i], "-e") && o->init_from && !strcmp(argv[i + 1], o->init_from)))) {
                i++;
                continue;
            }
            args[n++] = argv[i];
        }
        if (o->init_from) {
            GPT2Config c;
            gpt2_file_shape(o->init_from, &c);
            const char *flag[5] = { "--layers", "--channels", "--heads", "--vocab", "--max-seq-len" };
            int v[5] = { c.L, c.C, c.NH, c.V, c.maxT };
            for (int k = 0; k < 5; k++) {
                snprintf(shape[k], sizeof shape[k], "%d", v[k]);
                args[n++] = (char *)flag[k];
                args[n++] = shape[k];
            }
        }
        args[n++] = "--resume";
    }
}

int bench_comm_main(int argc, char **argv);         // bench_comm.c
void bench_comm_check_flags(int argc, char **argv); // dies on a bad flag, as bench_comm_main would
int plan_main(int argc, char **argv);               // plan.c

int main(int argc, char **argv) {
    int nproc = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--nproc")) {
            if (i + 1 >= argc) die("--nproc needs a value");
            nproc = (int)parse_int("--nproc", argv[i + 1], 1, 4096);
        }
    if (argc >= 2 && !strcmp(argv[1], "bench-comm")) {
        if (!nproc) return bench_comm_main(argc - 1, argv + 1);
        bench_comm_check_flags(argc - 1, argv + 1); // a bad flag is reported once, not by every rank
        return launch_local(nproc, argc, argv, NULL);
    }
    if (argc >= 2 && !strcmp(argv[1], "plan")) return plan_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "hf-inspect")) return hf_inspect_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "schedule")) return schedule_main(argc - 1, argv + 1); // schedule.h
    if (argc >= 2 && !strcmp(argv[1], "prepare")) return prepare_main(argc - 2, argv + 2);
    if (nproc) {
        Options o;
        parse_options(&o, argc, argv); // every flag checked before any rank starts
        GPT2Config cfg = options_shape(&o);
        BatchShape b;
        char err[512];
        if (check_layout(&o, &cfg, nproc, &b, err, sizeof err)) die("%s", err); // no rank started for it
        Faults faults;
        parse_faults(&faults, 0, nproc); // a malformed LLM4D_FAULT too
        int rc = launch_with_restarts(&o, nproc, argc, argv);
        options_free(&o);
        return rc;
    }
    return train_main(argc, argv);
}

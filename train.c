// train.c: the command line, the step loop, validation, sampling and logging.
//
//   ./train prepare INPUT.txt DIR      byte-level token shards from any text
//   ./train plan [flags]               the layout planner (plan.c; ./train plan --help)
//   ./train [flags]                    train (see --help)
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives.h"
#include "common.h"
#include "data.h"
#include "kernels.h"
#include "model.h"
#include "pipeline.h"
#include "zero.h"

static const char USAGE[] =
    "usage: ./train [flags]                      train a GPT-2 model\n"
    "       ./train prepare INPUT.txt DIR        write DIR/train.bin, DIR/val.bin (last 10% of the bytes)\n"
    "                                            and DIR/tokenizer.bin with a byte-level tokenizer (V = 256)\n"
    "       ./train plan --gpus G --batch-tokens N [flags]\n"
    "                                            every (TP, PP, DP) layout of G GPUs: memory per GPU, bubble,\n"
    "                                            communication and compute (./train plan --help)\n"
    "       ./train bench-comm --nproc N [flags] collective bandwidth table, as nccl-tests prints\n"
    "\n"
    "model (a preset, then any shape flag overrides it; default d12):\n"
    "  --model d12|d24|d36|d48    GPT-2 124M / 350M / 774M / 1558M shapes (maxT 1024, V 50257)\n"
    "  --layers L --channels C --heads H --vocab V\n"
    "                             a custom shape; the vocab is padded to a multiple of 128 (Vp)\n"
    "  --max-seq-len N            the position table's length maxT (custom shapes: default --seq-len)\n"
    "  --seq-len T                tokens per sequence (default: the model's maxT; at most maxT)\n"
    "  --init-from FILE           start from an llm.c model file (version 3 fp32 or 5 bf16); the shape\n"
    "                             comes from the file\n"
    "  --save-model FILE          write the trained model (llm.c version 3, fp32 master weights) at the\n"
    "                             end; with --steps 0 it writes the initialisation and needs no data\n"
    "  --seed N                   initialisation, shuffling and sampling seed (default 1337)\n"
    "\n"
    "data (llm.c token shards: 256 x int32 header, magic 20240520, version 1, count; uint16 tokens):\n"
    "  --train PATTERN            training shards (a glob; matches are concatenated in sorted order)\n"
    "  --val PATTERN              validation shards\n"
    "  --tokenizer FILE           llm.c tokenizer for printing samples (default: tokenizer.bin next to\n"
    "                             the first training shard, if present)\n"
    "  --shuffle                  permute the sequences of each epoch with a seeded permutation\n"
    "  Global sequence i of step s (0 <= i < G, G = batch-tokens / T) is the window of T+1 tokens at\n"
    "  ((s*G + i) mod W) * T of the concatenated shards, W = (tokens - 1) / T; every layout trains on\n"
    "  exactly these sequences.\n"
    "\n"
    "batch and schedule:\n"
    "  --micro-batch B            sequences per forward/backward (default 4)\n"
    "  --batch-tokens N           tokens per optimizer step (default B*T); N / (B*T) micro-batches are\n"
    "                             accumulated, and N must be a multiple of B*T\n"
    "  --steps N                  optimizer steps (default 20)\n"
    "  --lr F                     peak learning rate (default 3e-4)\n"
    "  --warmup N                 linear warm-up steps: lr*(s+1)/N for s < N (default 0)\n"
    "  --schedule cosine|linear|constant\n"
    "                             decay after warm-up from lr to lr*lr-min-frac at the last step\n"
    "                             (default cosine)\n"
    "  --lr-min-frac F            final learning rate as a fraction of --lr (default 0.0)\n"
    "  --beta1 F --beta2 F --eps F\n"
    "                             AdamW moments (defaults 0.9, 0.95, 1e-8), bias-corrected\n"
    "  --weight-decay F           decoupled weight decay on matrices and embeddings only (default 0.0)\n"
    "  --clip F                   global-norm gradient clipping; 0 disables (default 1.0)\n"
    "\n"
    "evaluation and output:\n"
    "  --val-every N              validation loss every N steps and at the end; 0 disables (default 0)\n"
    "  --val-steps N              micro-batches per validation (default 10)\n"
    "  --sample-every N           print a sample every N steps and at the end; 0 disables (default 0)\n"
    "  --sample-tokens N          tokens per sample (default 64, at most T - 1)\n"
    "  --temperature F            sampling temperature (default 1.0)\n"
    "  --top-k N                  sample among the N most likely tokens; 0 = all (default 0)\n"
    "  --log FILE                 JSON Lines: {\"step\",\"tokens\",\"loss\",\"lr\",\"grad_norm\",\"ms\",\"tokens_per_s\",...}\n"
    "                             per step (tokens: trained so far) and {\"step\",\"val_loss\"} per validation;\n"
    "                             scripts/plot.py draws them\n"
    "  --dump DIR                 testing aid: write step 0's global batch tokens, first micro-batch\n"
    "                             logits and accumulated gradients (raw int32/fp32) into DIR\n"
    "\n"
    "parallelism:\n"
    "  --nproc N                  fork N local ranks running this command (or launch with torchrun-style\n"
    "                             RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT variables, or under srun)\n"
    "  --tp N                     tensor parallelism: N consecutive ranks share each block (QKV and MLP\n"
    "                             split by heads/columns, output projections by rows, embedding and loss\n"
    "                             by vocabulary); N must divide the heads (default 1); DP = ranks / N\n"
    "  --sp                       sequence parallelism with --tp: LayerNorm and residual regions split by\n"
    "                             rows, all-gather before and reduce-scatter after each tensor-parallel\n"
    "                             region (--seq-len divisible by --tp)\n"
    "  --pp N                     pipeline parallelism: the blocks in N contiguous stages (embedding on the\n"
    "                             first, final LayerNorm and head on the last), 1F1B over the micro-batches;\n"
    "                             bubble (N-1)/(M+N-1) for M micro-batches per step\n"
    "  --pp-layers a,b,...        blocks per stage (default: equal, earlier stages one longer)\n"
    "  --pp-virtual V             interleaved 1F1B: each stage holds V chunks of blocks (stage s: chunks s,\n"
    "                             s+N, ...); bubble (N-1)/(V*M+N-1); M must be a multiple of N\n"
    "  --pp-trace DIR             testing aid: each stage appends its per-step schedule to DIR/stageS.txt\n"
    "  --zero 0|1|2|3             ZeRO stage of the data-parallel state (default 0): 0 all-reduces\n"
    "                             gradients; 1 shards master weights and AdamW moments; 2 also the\n"
    "                             reduced gradient; 3 also the working weights, gathered unit by unit\n"
    "  --bucket-mb F              gradient bucket size in MiB of fp32 gradients; each bucket's reduction\n"
    "                             starts as soon as the backward has finished it (default 25; 0 = one\n"
    "                             bucket, reduced after the backward)\n"
    "  --comm-timeout S           seconds any collective may wait before the job stops with an error\n"
    "                             naming the operation and the silent rank (default 300)\n"
    "\n"
    "execution:\n"
    "  --device cpu|cuda          default cuda when a GPU is present, else cpu\n"
    "  --dtype fp32|bf16          weights and activations (default bf16 on cuda, fp32 on cpu); bf16\n"
    "                             stores bf16, computes in fp32 and updates fp32 master weights\n"
    "  --threads N                CPU threads per rank (default: the node's cores shared among its ranks)\n"
    "  -h, --help                 this text\n";

typedef struct {
    const char *preset, *init_from, *save_model, *train, *val, *tokenizer, *log, *dump, *device, *schedule;
    int layers, channels, heads, vocab, max_seq_len, seq_len; // 0 = not given
    int micro_batch, steps, warmup, val_every, val_steps, sample_every, sample_tokens, top_k, threads, shuffle;
    long long batch_tokens;
    float lr, lr_min_frac, beta1, beta2, eps, weight_decay, clip, temperature;
    uint64_t seed;
    int dtype; // -1 = default for the device
    int zero, tp, sp, pp, pp_virtual;
    const char *pp_layers, *pp_trace;
    double bucket_mb, comm_timeout;
} Options;

// ---------------------------------------------------------------------------------------------
// flag parsing: every value is checked whole, and every error names the flag

static long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) die("%s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) die("%s must be between %lld and %lld, got %lld", flag, lo, hi, v);
    return v;
}

static float parse_float(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) die("%s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) die("%s must be between %g and %g, got %g", flag, lo, hi, v);
    return (float)v;
}

static void parse_options(Options *o, int argc, char **argv) {
    *o = (Options){ .micro_batch = 4, .steps = 20, .val_steps = 10, .sample_tokens = 64, .lr = 3e-4f,
                    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .temperature = 1.0f,
                    .seed = 1337, .dtype = -1, .schedule = "cosine", .bucket_mb = 25,
                    .comm_timeout = 300, .tp = 1, .pp = 1, .pp_virtual = 1 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (!strcmp(f, "--shuffle")) {
            o->shuffle = 1;
            continue;
        }
        if (strncmp(f, "--", 2) != 0) die("unexpected argument '%s' (see --help)", f);
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(name) (!strcmp(f, name) && (v ? (i++, 1) : (die("%s needs a value", name), 0)))
        if (IS("--model")) o->preset = v;
        else if (IS("--layers")) o->layers = (int)parse_int(f, v, 1, 4096);
        else if (IS("--channels")) o->channels = (int)parse_int(f, v, 1, 65536);
        else if (IS("--heads")) o->heads = (int)parse_int(f, v, 1, 65536);
        else if (IS("--vocab")) o->vocab = (int)parse_int(f, v, 1, 65536);
        else if (IS("--max-seq-len")) o->max_seq_len = (int)parse_int(f, v, 1, 1048576);
        else if (IS("--seq-len")) o->seq_len = (int)parse_int(f, v, 1, 1048576);
        else if (IS("--init-from")) o->init_from = v;
        else if (IS("--save-model")) o->save_model = v;
        else if (IS("--seed")) o->seed = (uint64_t)parse_int(f, v, 0, INT64_MAX);
        else if (IS("--train")) o->train = v;
        else if (IS("--val")) o->val = v;
        else if (IS("--tokenizer")) o->tokenizer = v;
        else if (IS("--micro-batch")) o->micro_batch = (int)parse_int(f, v, 1, 1 << 20);
        else if (IS("--batch-tokens")) o->batch_tokens = parse_int(f, v, 1, (long long)1 << 40);
        else if (IS("--steps")) o->steps = (int)parse_int(f, v, 0, INT32_MAX);
        else if (IS("--lr")) o->lr = parse_float(f, v, 0, 1e3);
        else if (IS("--warmup")) o->warmup = (int)parse_int(f, v, 0, INT32_MAX);
        else if (IS("--schedule")) o->schedule = v;
        else if (IS("--lr-min-frac")) o->lr_min_frac = parse_float(f, v, 0, 1);
        else if (IS("--beta1")) o->beta1 = parse_float(f, v, 0, 0.999999999);
        else if (IS("--beta2")) o->beta2 = parse_float(f, v, 0, 0.999999999);
        else if (IS("--eps")) o->eps = parse_float(f, v, 0, 1);
        else if (IS("--weight-decay")) o->weight_decay = parse_float(f, v, 0, 1e3);
        else if (IS("--clip")) o->clip = parse_float(f, v, 0, 1e30);
        else if (IS("--val-every")) o->val_every = (int)parse_int(f, v, 0, INT32_MAX);
        else if (IS("--val-steps")) o->val_steps = (int)parse_int(f, v, 1, INT32_MAX);
        else if (IS("--sample-every")) o->sample_every = (int)parse_int(f, v, 0, INT32_MAX);
        else if (IS("--sample-tokens")) o->sample_tokens = (int)parse_int(f, v, 1, 1 << 20);
        else if (IS("--temperature")) o->temperature = parse_float(f, v, 1e-6, 1e6);
        else if (IS("--top-k")) o->top_k = (int)parse_int(f, v, 0, 1 << 20);
        else if (IS("--log")) o->log = v;
        else if (IS("--dump")) o->dump = v;
        else if (IS("--device")) o->device = v;
        else if (IS("--dtype")) {
            if (!strcmp(v, "fp32")) o->dtype = DT_F32;
            else if (!strcmp(v, "bf16")) o->dtype = DT_BF16;
            else die("--dtype must be fp32 or bf16, got '%s'", v);
        } else if (IS("--threads")) o->threads = (int)parse_int(f, v, 1, 4096);
        else if (IS("--zero")) o->zero = (int)parse_int(f, v, 0, 3);
        else if (IS("--tp")) o->tp = (int)parse_int(f, v, 1, 4096);
        else if (!strcmp(f, "--sp")) o->sp = 1;
        else if (IS("--pp")) o->pp = (int)parse_int(f, v, 1, 4096);
        else if (IS("--pp-layers")) o->pp_layers = v;
        else if (IS("--pp-virtual")) o->pp_virtual = (int)parse_int(f, v, 1, MAX_CHUNKS);
        else if (IS("--pp-trace")) o->pp_trace = v;
        else if (IS("--bucket-mb")) o->bucket_mb = parse_float(f, v, 0, 1e6);
        else if (IS("--comm-timeout")) o->comm_timeout = parse_float(f, v, 0.1, 1e7);
        else die("unknown flag %s (see --help)", f);
#undef IS
    }
    if (strcmp(o->schedule, "cosine") && strcmp(o->schedule, "linear") && strcmp(o->schedule, "constant"))
        die("--schedule must be cosine, linear or constant, got '%s'", o->schedule);
    if (o->device && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        die("--device must be cpu or cuda, got '%s'", o->device);
}

// The model's shape: from --init-from, or a preset overridden by the shape flags.
static GPT2Config resolve_shape(const Options *o, float **host_params) {
    GPT2Config cfg;
    int shape_flags = o->layers || o->channels || o->heads || o->vocab || o->max_seq_len;
    if (o->init_from) {
        if (shape_flags || o->preset)
            die("--init-from takes the shape from %s; drop --model and the shape flags", o->init_from);
        *host_params = gpt2_load_file(o->init_from, &cfg);
        return cfg;
    }
    *host_params = NULL;
    return gpt2_shape(o->preset, o->layers, o->channels, o->heads, o->vocab, o->max_seq_len, o->seq_len);
}

static float lr_at(const Options *o, int step) {
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    float min_lr = o->lr * o->lr_min_frac;
    if (!strcmp(o->schedule, "constant") || o->steps <= o->warmup) return o->lr;
    float ratio = (float)(step - o->warmup) / (float)(o->steps - o->warmup);
    if (!strcmp(o->schedule, "linear")) return o->lr - (o->lr - min_lr) * ratio;
    return min_lr + 0.5f * (1.0f + cosf((float)M_PI * ratio)) * (o->lr - min_lr);
}

static void print_memory(const GPT2 *m, int rank) {
    size_t total = 0;
    printf("memory of rank %d (%s):", rank, m->be->name);
    for (int c = 0; c < MEM_NCAT; c++) {
        printf(" %s %.2f MiB |", MEM_NAMES[c], m->mem.bytes[c] / 1048576.0);
        total += m->mem.bytes[c];
    }
    printf(" total %.2f MiB | largest logits buffer %zu bytes\n", total / 1048576.0, m->logits_bytes);
    fflush(stdout);
}

static void write_raw(const char *dir, const char *name, const void *data, size_t bytes) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = xmalloc(n);
    snprintf(path, n, "%s/%s", dir, name);
    char tmp[4096];
    FILE *f = atomic_open(path, tmp, sizeof tmp);
    xfwrite(data, 1, bytes, f, tmp);
    atomic_commit(f, tmp, path);
    free(path);
}

static int sample_token(const Options *o, float *probs, int *order, int V, uint64_t *rng);

// Sampling: the model continues the first token of the training data, one token per forward.
static void sample(Pipeline *p, const Options *o, const Tokenizer *tk, int first_token, int T, int step, int print) {
    GPT2 *m = p->model;
    int n = o->sample_tokens < T - 1 ? o->sample_tokens : T - 1;
    int32_t *ctx = xcalloc((size_t)T, sizeof(int32_t));
    float *probs = xmalloc(sizeof(float) * m->cfg.V);
    int *order = xmalloc(sizeof(int) * m->cfg.V);
    uint64_t rng = o->seed * 0x9e3779b97f4a7c15ULL + (uint64_t)step + 1;
    ctx[0] = first_token;
    if (print) printf("sample at step %d:\n", step);
    char buf[64];
    if (tk) {
        tokenizer_decode(tk, first_token, buf, sizeof buf);
        if (print) fputs(buf, stdout);
    }
    for (int t = 1; t <= n; t++) {
        // the whole window each time: causal attention leaves positions < t untouched by the zeros after
        // them, and the shape stays divisible for sequence parallelism
        pipeline_forward(p, ctx, NULL, 1, T);
        int V = m->cfg.V, next = 0;
        if (m->last) { // the last stage holds the logits and samples; the others learn the token from it
            gpt2_logits_at(m, 0, t - 1, T, probs);
            next = sample_token(o, probs, order, V, &rng);
        }
        if (m->pp > 1) {
            int32_t tok = next;
            comm_broadcast(m->pp_comm, &tok, 1, CT_I32, m->pp - 1);
            next = tok;
        }
        ctx[t] = next;
        if (!print) continue;
        if (tk) {
            tokenizer_decode(tk, next, buf, sizeof buf);
            fputs(buf, stdout);
        } else {
            printf("%d ", next);
        }
    }
    if (print) printf("\n---\n");
    fflush(stdout);
    free(ctx);
    free(probs);
    free(order);
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

static float validate(Pipeline *p, TokenSet *val, int B, int T, int steps) {
    int32_t *inp = xmalloc(sizeof(int32_t) * B * T), *tgt = xmalloc(sizeof(int32_t) * B * T);
    double sum = 0.0;
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < B; b++) tokenset_sequence(val, (uint64_t)s * B + b, inp + b * T, tgt + b * T);
        sum += pipeline_forward(p, inp, tgt, B, T);
    }
    free(inp);
    free(tgt);
    return (float)(comm_sum_double(p->model->pp_comm, sum) / steps); // the loss lives on the last stage
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

// Slurm's --signal=USR1@N warns a job before its time limit; the step loop checks this flag.
static volatile sig_atomic_t usr1_received;
static void on_usr1(int sig) { (void)sig; usr1_received = 1; }

static int train_main(int argc, char **argv) {
    Options o;
    parse_options(&o, argc, argv);

    // ranks: launched by --nproc, torchrun-style variables or Slurm; one process otherwise
    LaunchEnv env;
    Comm *world = NULL;
    if (launch_env_read(&env)) world = comm_init(&env, o.comm_timeout);
    int rank = world ? comm_rank(world) : 0, nranks = world ? comm_size(world) : 1;
    // layout: rank = (dp·PP + pp)·TP + tp, so a tensor-parallel group is consecutive ranks (one node when
    // it fits) and a pipeline's stages are TP ranks apart
    int tp_size = o.tp, pp_size = o.pp;
    if (nranks % (tp_size * pp_size))
        die("--tp %d x --pp %d = %d does not divide the %d ranks", tp_size, pp_size, tp_size * pp_size, nranks);
    int dp_size = nranks / (tp_size * pp_size);
    int tp_rank = rank % tp_size, pp_rank = rank / tp_size % pp_size, dp_rank = rank / (tp_size * pp_size);
    Comm *tp_comm = NULL, *dp_comm = NULL, *pp_comm = NULL, *embed_comm = NULL, *pp_fwd = NULL, *pp_bwd = NULL;
    if (world) {
        tp_comm = comm_split(world, rank / tp_size, tp_rank, "tp");
        pp_comm = comm_split(world, dp_rank * tp_size + tp_rank, pp_rank, "pp");
        pp_fwd = comm_split(world, dp_rank * tp_size + tp_rank, pp_rank, "pp activations");
        pp_bwd = comm_split(world, dp_rank * tp_size + tp_rank, pp_rank, "pp gradients");
        dp_comm = comm_split(world, pp_rank * tp_size + tp_rank, dp_rank, "dp");
        int ends = pp_size > 1 && (pp_rank == 0 || pp_rank == pp_size - 1);
        embed_comm = comm_split(world, ends ? dp_rank * tp_size + tp_rank : -1, pp_rank, "embedding");
    }
    int stage = dp_size > 1 ? o.zero : (o.zero == 3 ? 0 : o.zero);
    int lead = rank == 0;
    if (o.dump && nranks > 1) die("--dump works on a single rank only");

    int ncuda = cuda_device_count();
    const Backend *be;
    if (o.device ? !strcmp(o.device, "cuda") : ncuda > 0) {
        if (!backend_cuda()) die("--device cuda: this binary was built without CUDA (nvcc was not found)");
        if (ncuda == 0) die("--device cuda: no CUDA device is available");
        if (world) cuda_use_device(env.local_rank % ncuda); // one GPU per rank of this node
        be = backend_cuda();
    } else {
        be = backend_cpu();
    }
    // ranks sharing a node share its cores: OpenMP threads that outnumber the cores spin against each
    // other and against the progress threads, and a step can take 100x longer
    int threads = o.threads;
    if (!threads && world && env.local_world > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores / env.local_world > 1 ? (int)(cores / env.local_world) : 1;
    }
    if (threads) be->set_threads(threads);
    DType dt = o.dtype >= 0 ? (DType)o.dtype : (be == backend_cpu() ? DT_F32 : DT_BF16);
    // zero.c hands gradient and weight buffers straight to the host collectives: on a GPU that needs
    // device-aware transports (CUDA IPC), which are not built yet
    if (be != backend_cpu() && (dp_size > 1 || pp_size > 1))
        die("--device cuda: data and pipeline parallelism need device-aware collectives, not built yet (use --device cpu, "
            "or --tp alone)");

    float *host_params;
    GPT2Config cfg = resolve_shape(&o, &host_params);
    if (cfg.NH % tp_size) die("--tp %d does not divide the model's %d heads", tp_size, cfg.NH);
    if (o.sp && tp_size == 1) die("--sp needs tensor parallelism (--tp 2 or more)");
    int T = o.seq_len ? o.seq_len : cfg.maxT;
    if (T > cfg.maxT) die("--seq-len %d is above the model's maximum sequence length %d", T, cfg.maxT);
    int B = o.micro_batch;
    if (o.sp && T % tp_size) die("--sp splits sequences over the --tp %d ranks: --seq-len %d must be divisible by it", tp_size, T);
    long long micro_tokens = (long long)B * T * dp_size; // one micro-batch on every data-parallel rank
    long long batch_tokens = o.batch_tokens ? o.batch_tokens : micro_tokens;
    if (batch_tokens % micro_tokens != 0) {
        if (dp_size > 1)
            die("--batch-tokens %lld is not a multiple of data-parallel ranks x --micro-batch x --seq-len = %d x %d x %d = %lld",
                batch_tokens, dp_size, B, T, micro_tokens);
        die("--batch-tokens %lld is not a multiple of --micro-batch x --seq-len = %d x %d = %lld", batch_tokens, B, T,
            micro_tokens);
    }
    int accum = (int)(batch_tokens / micro_tokens);
    long long G = batch_tokens / T; // sequences per optimizer step

    // data first, so that a bad file is reported before any large allocation
    TokenSet train_set = { 0 }, val_set = { 0 };
    int have_train = o.steps > 0 || o.dump;
    if (have_train) {
        if (!o.train) die("no training data: pass --train PATTERN (make shards with ./train prepare INPUT.txt DIR)");
        tokenset_open(&train_set, o.train, "--train", cfg.V, T, o.shuffle, o.seed);
    }
    if (o.val) tokenset_open(&val_set, o.val, "--val", cfg.V, T, 0, o.seed);
    Tokenizer tk = { 0 };
    int have_tk = 0;
    if (o.tokenizer) {
        tokenizer_load(&tk, o.tokenizer);
        have_tk = 1;
    } else if (have_train) {
        const char *first = train_set.shards[0].path;
        const char *slash = strrchr(first, '/');
        size_t dirlen = slash ? (size_t)(slash - first) : 1;
        char *path = xmalloc(dirlen + 16);
        snprintf(path, dirlen + 16, "%.*s/tokenizer.bin", (int)dirlen, slash ? first : ".");
        struct stat st;
        if (stat(path, &st) == 0) {
            tokenizer_load(&tk, path);
            have_tk = 1;
        }
        free(path);
    }

    if (!host_params) host_params = gpt2_init_params(&cfg, o.seed);
    GPT2 model;
    int V = pp_size > 1 ? o.pp_virtual : 1;
    if (V > 1 && accum % pp_size)
        die("--pp-virtual %d: the %d micro-batch(es) per step must be a multiple of --pp %d for the interleaved schedule",
            V, accum, pp_size);
    int *chunk_first = xmalloc(sizeof(int) * pp_size * V), *chunk_count = xmalloc(sizeof(int) * pp_size * V);
    pipeline_split_layers(cfg.L, pp_size, V, o.pp_layers, chunk_first, chunk_count);
    Placement place = { .tp = tp_comm, .sp = o.sp, .pp = pp_comm, .nchunks = V, .embed = embed_comm };
    for (int c = 0; c < V; c++) { // stage s holds chunks s, s + PP, ...
        place.chunk_first[c] = chunk_first[c * pp_size + pp_rank];
        place.chunk_len[c] = chunk_count[c * pp_size + pp_rank];
    }
    // micro-batches whose activations a stage holds at once: at most PP with 1F1B; every one interleaved
    place.nslots = V > 1 ? accum : (pp_size - pp_rank < accum ? pp_size - pp_rank : accum);
    free(chunk_first);
    free(chunk_count);
    gpt2_build(&model, &cfg, dt, be, B, T, stage != 3, !zero_streams_gradients(stage, dp_size, accum), &place);
    float *host_internal = xmalloc(sizeof(float) * model.num_params);
    gpt2_full_to_local(&model, host_params, host_internal);
    free(host_params);
    if (stage != 3) gpt2_upload_params(&model, host_internal);
    AdamWConfig acfg = { o.beta1, o.beta2, o.eps, o.weight_decay, o.clip };
    Zero zero;
    zero_init(&zero, &model, dp_comm, stage, o.bucket_mb, accum, host_internal, &acfg);
    free(host_internal);
    Pipeline pipe;
    pipeline_init(&pipe, &model, &zero, pp_fwd, pp_bwd);

    double flops_per_token = gpt2_flops_per_token(&cfg, T);
    if (lead) {
        size_t full_n = gpt2_param_layout(&cfg, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 });
        printf("llm4d | device %s | dtype %s | model L=%d C=%d H=%d V=%d Vp=%d maxT=%d | %zu parameters", be->name,
               dtype_name(dt), cfg.L, cfg.C, cfg.NH, cfg.V, cfg.Vp, cfg.maxT, full_n);
        if (tp_size > 1) printf(", %zu on each tensor-parallel rank", model.num_params);
        printf("\n");
        printf("layout: %d rank(s) | data parallel %d x pipeline %d x tensor parallel %d%s | ZeRO-%d | %d gradient "
               "bucket(s)\n", nranks, dp_size, pp_size, tp_size, o.sp ? " (sequence parallel)" : "", stage, zero.nbuckets);
        printf("batch: %lld tokens per step = %d micro-batch(es) of %d x %d on each of %d rank(s) | %d steps\n",
               batch_tokens, accum, B, T, dp_size, o.steps);
        if (have_train)
            printf("data: %s (%llu tokens, %llu sequences of %d)%s\n", o.train, (unsigned long long)train_set.ntokens,
                   (unsigned long long)train_set.windows, T, o.shuffle ? ", shuffled" : "");
    }
    // every rank reports its own memory, one line each, in rank order
    for (int r = 0; r < nranks; r++) {
        if (r == rank) print_memory(&model, rank);
        if (world) comm_barrier(world);
    }

    FILE *logf = NULL;
    if (o.log && lead) logf = xfopen(o.log, "w");
    size_t step_tokens = (size_t)accum * B * T; // this rank's share of a step, all micro-batches
    int32_t *inputs = xmalloc(sizeof(int32_t) * step_tokens), *targets = xmalloc(sizeof(int32_t) * step_tokens);
    int first_token = 0;
    if (have_train) {
        uint16_t t0;
        tokenset_read(&train_set, 0, 1, &t0);
        first_token = t0;
    }

    struct sigaction su = { .sa_handler = on_usr1 };
    sigemptyset(&su.sa_mask);
    if (sigaction(SIGUSR1, &su, NULL) != 0) die("sigaction: %s", strerror(errno));
    for (int step = 0; step <= o.steps; step++) {
        // every rank stops at the same step: the flag is combined over the world
        int32_t stop = usr1_received, any = stop;
        if (world) comm_all_reduce(world, &stop, &any, 1, CT_I32, OP_MAX);
        if (any && step < o.steps) {
            if (lead)
                printf("received SIGUSR1 (the job's time limit is near): llm4d has no checkpoints yet, so it stops "
                       "cleanly after %d of %d steps%s\n", step, o.steps, o.save_model ? " and saves the model" : "");
            o.steps = step;
        }
        int last = step == o.steps;
        // validation and sampling run on every rank alike (ZeRO-3 gathers need every rank); rank 0 reports
        if (o.val && o.val_every > 0 && (step % o.val_every == 0 || last) && (step > 0 || !last)) {
            float vl = validate(&pipe, &val_set, B, T, o.val_steps);
            if (lead) {
                printf("step %d | val loss %.6f\n", step, vl);
                if (logf) fprintf(logf, "{\"step\":%d,\"val_loss\":%.9g}\n", step, vl);
            }
        }
        if (o.sample_every > 0 && have_train && ((step > 0 && step % o.sample_every == 0) || (last && step > 0)))
            sample(&pipe, &o, have_tk ? &tk : NULL, first_token, T, step, lead);
        if (last) break;

        double t0 = now_seconds(), tp_busy0 = tp_size > 1 ? comm_busy_seconds(tp_comm) : 0;
        zero_begin_step(&zero);
        gpt2_zero_grad(&model);
        // this rank's sequences of the global batch: a contiguous block of accum x B
        for (int i = 0; i < accum * B; i++) {
            uint64_t g = (uint64_t)step * G + (uint64_t)dp_rank * accum * B + i;
            tokenset_sequence(&train_set, g, inputs + (size_t)i * T, targets + (size_t)i * T);
        }
        if (o.dump && step == 0) { // the first micro-batch's logits, by a forward that changes no state
            gpt2_forward(&model, inputs, targets, B, T);
            float *logits = xmalloc(sizeof(float) * cfg.V * B * T);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < T; t++) gpt2_logits_at(&model, b, t, T, logits + ((size_t)b * T + t) * cfg.V);
            if (mkdir(o.dump, 0755) != 0 && errno != EEXIST) die("--dump: cannot create %s: %s", o.dump, strerror(errno));
            write_raw(o.dump, "logits.bin", logits, sizeof(float) * cfg.V * B * T);
            free(logits);
        }
        double loss_sum = pipeline_step(&pipe, inputs, targets, accum, B, T, 1.0f / (float)batch_tokens);
        float norm = zero_finish_grads(&zero); // first: the loss's reduction would queue behind the buckets
        float loss = (float)(comm_sum_double(pp_comm, zero_sum_double(&zero, loss_sum)) / (accum * dp_size));
        if (o.dump && step == 0) { // single rank: the full gradient buffer exists
            float *g = xmalloc(sizeof(float) * model.num_params), *gf = xmalloc(sizeof(float) * model.num_params);
            be->to_host(g, model.grads, sizeof(float) * model.num_params);
            gpt2_gather_full(&model, g, gf);
            write_raw(o.dump, "grads.bin", gf, sizeof(float) * model.num_params);
            free(g);
            free(gf);
            int32_t *tok = xmalloc(sizeof(int32_t) * 2 * G * T);
            for (long long i = 0; i < G; i++) tokenset_sequence(&train_set, (uint64_t)i, tok + i * T, tok + (G + i) * T);
            write_raw(o.dump, "tokens.bin", tok, sizeof(int32_t) * 2 * G * T);
            free(tok);
        }
        float lr = lr_at(&o, step);
        zero_step(&zero, lr, norm);
        be->sync();
        double ms = (now_seconds() - t0) * 1e3;
        double tps = batch_tokens / (ms / 1e3);
        double comm_ms = zero_comm_ms(&zero), exposed_ms = zero_exposed_ms(&zero);
        double tp_ms = tp_size > 1 ? (comm_busy_seconds(tp_comm) - tp_busy0) * 1e3 : 0.0;
        // the bubble: the share of the step each stage waited for activations or gradients
        double bubble_max = 0, bubble_mean = 0, bubble_formula = (pp_size - 1.0) / ((double)V * accum + pp_size - 1.0);
        if (pp_size > 1) {
            double mine = pipe.wait_s / (ms / 1e3), *all = xmalloc(sizeof(double) * pp_size);
            comm_all_gather(pp_comm, &mine, all, (size_t)pp_size, CT_I64);
            for (int s = 0; s < pp_size; s++) {
                bubble_mean += all[s] / pp_size;
                if (all[s] > bubble_max) bubble_max = all[s];
            }
            free(all);
            if (o.pp_trace && dp_rank == 0 && tp_rank == 0) write_trace(o.pp_trace, pp_rank, step + 1, &pipe);
        }
        if (!isfinite(loss)) die("loss is %f at step %d: training diverged", loss, step + 1);
        if (lead) {
            printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f GFLOP/s", step + 1,
                   o.steps, loss, lr, norm, ms, tps, tps * flops_per_token / 1e9);
            if (dp_size > 1) printf(" | comm %.1f ms, exposed %.1f ms", comm_ms, exposed_ms);
            if (tp_size > 1) printf(" | tp comm %.1f ms", tp_ms);
            if (pp_size > 1) printf(" | bubble %.1f%% max, %.1f%% mean (formula %.1f%%)", 100 * bubble_max, 100 * bubble_mean,
                                    100 * bubble_formula);
            printf("\n");
            fflush(stdout);
        }
        if (logf) {
            fprintf(logf,
                    "{\"step\":%d,\"tokens\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
                    "\"comm_ms\":%.3f,\"exposed_comm_ms\":%.3f,\"tp_comm_ms\":%.3f,\"bubble_max\":%.4f,"
                    "\"bubble_mean\":%.4f,\"bubble_formula\":%.4f}\n",
                    step + 1, (step + 1) * batch_tokens, loss, lr, norm, ms, tps, comm_ms, exposed_ms, tp_ms, bubble_max, bubble_mean, bubble_formula);
            if (fflush(logf) != 0) die("cannot write %s: %s", o.log, strerror(errno));
        }
    }
    if (logf) xfclose(logf, o.log);
    if (o.save_model) {
        size_t full_n = gpt2_param_layout(&cfg, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 });
        float *host = xmalloc(sizeof(float) * model.num_params), *file = xmalloc(sizeof(float) * full_n);
        zero_gather_master(&zero, host);     // collective over the data-parallel group
        gpt2_gather_full(&model, host, file); // collective over the tensor-parallel group
        if (lead) {
            gpt2_save_file(o.save_model, &cfg, file);
            printf("saved %s\n", o.save_model);
        }
        free(host);
        free(file);
    }
    free(inputs);
    free(targets);
    pipeline_free(&pipe);
    zero_free(&zero);
    gpt2_free(&model);
    if (have_train) tokenset_close(&train_set);
    if (o.val) tokenset_close(&val_set);
    if (have_tk) tokenizer_free(&tk);
    if (world) {
        comm_barrier(world); // nobody leaves while another rank still needs it
        comm_destroy(tp_comm);
        comm_destroy(dp_comm);
        comm_destroy(pp_comm);
        comm_destroy(pp_fwd);
        comm_destroy(pp_bwd);
        comm_destroy(embed_comm);
        comm_destroy(world);
    }
    return 0;
}

int bench_comm_main(int argc, char **argv); // bench_comm.c
int plan_main(int argc, char **argv);       // plan.c

int main(int argc, char **argv) {
    // --nproc N: this process becomes the launcher of N local ranks running the same command
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--nproc")) {
            if (i + 1 >= argc) die("--nproc needs a value");
            return launch_local((int)parse_int("--nproc", argv[i + 1], 1, 4096), argc, argv);
        }
    if (argc >= 2 && !strcmp(argv[1], "bench-comm")) return bench_comm_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "plan")) return plan_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "prepare")) {
        if (argc != 4) die("usage: ./train prepare INPUT.txt DIR");
        data_prepare(argv[2], argv[3]);
        return 0;
    }
    return train_main(argc, argv);
}

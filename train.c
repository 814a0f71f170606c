// train.c: the command line, the launcher's restarts, the layout, the step loop, validation, sampling,
// logging and checkpoints.
//
//   ./train prepare INPUT.txt DIR      byte-level token shards from any text
//   ./train plan [flags]               the layout planner (plan.c; ./train plan --help)
//   ./train [flags]                    train (see --help)
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
#include "pipeline.h"
#include "zero.h"

static const char USAGE[] =
    "usage: ./train [flags]                      train a GPT-2 model\n"
    "       ./train prepare INPUT.txt DIR        write DIR/train.bin, DIR/val.bin (last 10% of the bytes)\n"
    "                                            and DIR/tokenizer.bin with a byte-level tokenizer (V = 256)\n"
    "       ./train plan --gpus G --batch-tokens N [flags]\n"
    "                                            every (TP, CP, PP, DP) layout of G GPUs: memory per GPU,\n"
    "                                            bubble, communication and compute (./train plan --help)\n"
    "       ./train bench-comm --nproc N [flags] collective bandwidth table, as nccl-tests prints\n"
    "       ./train hf-inspect DIR [--dump OUT] [--save-hf OUT2 [--dtype fp32|bf16] [--max-shard-bytes N]]\n"
    "                                            a tool: a Hugging Face Llama checkpoint's config and tensors (read,\n"
    "                                            shape-checked, converted to fp32), dumped raw or written again\n"
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
    "                             per step (tokens: trained so far), {\"step\",\"val_loss\"} per validation,\n"
    "                             {\"step\",\"ckpt\",...} per checkpoint, {\"memory_peak\":{...},\"rank\"} per rank at\n"
    "                             the end (see README); scripts/plot.py draws\n"
    "                             them; a resumed run keeps the records up to its checkpoint's step and appends\n"
    "  --dump DIR                 testing aid: write step 0's global batch tokens, first micro-batch\n"
    "                             logits and accumulated gradients (raw int32/fp32) into DIR\n"
    "\n"
    "parallelism:\n"
    "  --nproc N                  fork N local ranks running this command (or launch with torchrun-style\n"
    "                             RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT variables, or under srun); passes\n"
    "                             SIGUSR1 on, turns SIGINT/SIGTERM into SIGTERM for every rank and kills\n"
    "                             what is left after LLM4D_KILL_GRACE seconds (default 30); when a rank\n"
    "                             fails, names the rank that stopped answering and stops the others\n"
    "  --tp N                     tensor parallelism: N consecutive ranks share each block (QKV and MLP\n"
    "                             split by heads/columns, output projections by rows, embedding and loss\n"
    "                             by vocabulary); N must divide the heads (default 1)\n"
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
    "  --cp N                     context parallelism: each sequence cut into 2N chunks, rank c of a group\n"
    "                             of N holding chunks c and 2N-1-c; position-wise work on those, attention\n"
    "                             as a ring passing K/V blocks (--seq-len divisible by 2N; default 1)\n"
    "  layout                     rank = ((dp*PP + pp)*CP + cp)*TP + tp (a TP group is consecutive ranks);\n"
    "                             DP = ranks / (TP*CP*PP); gradients are reduced over DP x CP, the ranks\n"
    "                             holding the same weights\n"
    "  --zero 0|1|2|3             ZeRO stage of the state, sharded over the DP x CP ranks (default 0): 0\n"
    "                             all-reduces gradients; 1 shards master weights and AdamW moments; 2 also\n"
    "                             the reduced gradient; 3 also the working weights, gathered unit by unit\n"
    "  --bucket-mb F              gradient bucket size in MiB of fp32 gradients; each bucket's reduction\n"
    "                             starts as soon as the backward has finished it (default 25; 0 = one\n"
    "                             bucket, reduced after the backward)\n"
    "  --comm-timeout S           seconds any collective may wait before the job stops with an error\n"
    "                             naming the operation and the rank that stopped answering (default 300)\n"
    "  --transport auto|shm|tcp|verbs\n"
    "                             how ranks talk: auto (default) takes shared memory between ranks of a\n"
    "                             node (single-copy for large messages) and, across nodes, RDMA verbs\n"
    "                             (InfiniBand, RoCE) where both ranks have an active RDMA port, TCP\n"
    "                             otherwise; shm, tcp and verbs force one for every pair (rank 0 prints\n"
    "                             the choice at start)\n"
    "  --algo auto|fanin|ring|hier\n"
    "                             how collectives move data: fanin (each rank owns a segment and every\n"
    "                             rank connects to every other), ring (two neighbours per rank; the same\n"
    "                             bits as fanin), hier (fan-in inside each node, a ring across the nodes\n"
    "                             per local rank; sums each node first); auto (default): fanin inside one\n"
    "                             node, hier across nodes (ring where nodes hold unequal numbers of ranks)\n"
    "  --ib-dev NAME[:PORT]       RDMA device and port for verbs (default: the first active port)\n"
    "  --ib-gid-index N           RoCE GID index (default: the port's RoCE v2 GID of an IPv4 address)\n"
    "\n"
    "checkpoints and failures:\n"
    "  --ckpt-dir DIR             checkpoints of the whole training state in DIR/ckpt_<step>/: one safetensors\n"
    "                             shard per rank and a manifest.json written last (see README)\n"
    "                             (one run at a time: rank 0 locks DIR/llm4d.lock; a second run into DIR is\n"
    "                             refused, naming the holder's PID and host)\n"
    "  --ckpt-every N             a checkpoint every N steps, written by a thread while training goes on\n"
    "                             (default 0: only at the end and on SIGTERM or SIGUSR1)\n"
    "  --keep K                   keep the newest K complete checkpoints, delete older ones (default 0: all)\n"
    "  --resume [PATH]            continue from the newest usable checkpoint in --ckpt-dir (from step 0 when\n"
    "                             it has none), or from the checkpoint directory PATH; any layout (ranks,\n"
    "                             --tp, --cp, --pp, --pp-virtual, --zero) reads a checkpoint of any other\n"
    "                             (an unusable one is reported, moved aside to ckpt_<step>.bad, and the one\n"
    "                             before it tried)\n"
    "  --allow-data-change        with --resume: continue on training data other than the checkpoint's\n"
    "                             (another content fingerprint or token count; refused without it)\n"
    "  --max-restarts R           with --nproc: when a rank dies, relaunch the job from the newest complete\n"
    "                             checkpoint, up to R times (default 0)\n"
    "  --skip-spikes F            skip (and count) the update of a step whose loss or gradient norm is not\n"
    "                             finite or above F times its mean over the last 20 applied steps (0: off)\n"
    "  --straggler F              report a rank whose compute time is above the median by more than the\n"
    "                             share F (default 0.5) ...\n"
    "  --straggler-steps N        ... for N steps in a row (default 5)\n"
    "  SIGTERM or SIGUSR1 (Slurm's warning before the time limit) makes every rank stop at the next step\n"
    "  boundary, write a checkpoint (with --ckpt-dir), save the model (with --save-model) and exit 0.\n"
    "\n"
    "execution:\n"
    "  --device cpu|cuda          default cuda when a GPU is present, else cpu\n"
    "  --dtype fp32|bf16          weights and activations (default bf16 on cuda, fp32 on cpu); bf16\n"
    "                             stores bf16, computes in fp32 and updates fp32 master weights\n"
    "  --threads N                CPU threads per rank (default: the node's cores shared among its ranks)\n"
    "  --recompute none|selective|full\n"
    "                             activation recompute (default none): selective keeps all but the LayerNorm\n"
    "                             outputs and GELU's output, which the backward rebuilds; full keeps only each\n"
    "                             block's input and reruns the block's forward before its backward; the\n"
    "                             gradients are bitwise the same\n"
    "  --profile                  time the ops of every step: each step line (and JSON record) adds the\n"
    "                             split of the step between matmuls, attention and everything else\n"
    "                             (matmul_ms, attention_ms); on a GPU this synchronises around each op\n"
    "  LLM4D_CPU_ISA=generic|avx512bf16\n"
    "                             environment: the CPU's bf16 matmul path (unset: avx512bf16 when the\n"
    "                             CPU has AVX512-BF16, else generic, which widens bf16 to fp32)\n"
    "  LLM4D_CUDA_SYNC=1          environment: wait for every CUDA kernel as it is launched, so that an\n"
    "                             error names the kernel that failed (slow; for debugging)\n"
    "  -h, --help                 this text\n";

typedef struct {
    const char *preset, *init_from, *save_model, *train, *val, *tokenizer, *log, *dump, *device, *schedule;
    int layers, channels, heads, vocab, max_seq_len, seq_len; // 0 = not given
    int micro_batch, steps, warmup, val_every, val_steps, sample_every, sample_tokens, top_k, threads, shuffle, profile;
    long long batch_tokens;
    float lr, lr_min_frac, beta1, beta2, eps, weight_decay, clip, temperature;
    uint64_t seed;
    int dtype; // -1 = default for the device
    int zero, tp, sp, pp, pp_virtual, recompute, cp;
    const char *pp_layers, *pp_trace;
    double bucket_mb, comm_timeout;
    const char *ckpt_dir, *resume_path;
    int ckpt_every, keep, resume, max_restarts, straggler_steps, allow_data_change;
    float skip_spikes, straggler;
    int transport;
    int algo; // CommAlgo
    const char *ib_dev;
    int ib_gid_index; // -1: automatic
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

// Context parallelism cuts each sequence into 2·cp chunks, and sequence parallelism splits a rank's
// positions over the tensor-parallel group: T must divide for both. Returns 0, or -1 with the reason.
static int context_split_error(const Options *o, int T, char *err, size_t cap) {
    if (o->cp > 1 && T % (2 * o->cp))
        return snprintf(err, cap, "--cp %d cuts each sequence into %d chunks: --seq-len %d must be divisible by %d", o->cp,
                        2 * o->cp, T, 2 * o->cp), -1;
    if (o->sp && o->cp > 1 && (T / o->cp) % o->tp)
        return snprintf(err, cap, "--sp splits each rank's %d positions (--seq-len %d / --cp %d) over the --tp %d ranks: they "
                        "must be divisible by it", T / o->cp, T, o->cp, o->tp), -1;
    if (o->sp && T % o->tp)
        return snprintf(err, cap, "--sp splits sequences over the --tp %d ranks: --seq-len %d must be divisible by it", o->tp,
                        T), -1;
    return 0;
}

static void parse_options(Options *o, int argc, char **argv) {
    *o = (Options){ .micro_batch = 4, .steps = 20, .val_steps = 10, .sample_tokens = 64, .lr = 3e-4f,
                    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .temperature = 1.0f,
                    .seed = 1337, .dtype = -1, .schedule = "cosine", .bucket_mb = 25,
                    .comm_timeout = 300, .tp = 1, .pp = 1, .pp_virtual = 1, .cp = 1, .straggler = 0.5f,
                    .straggler_steps = 5, .ib_gid_index = -1 };
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
        if (!strcmp(f, "--profile")) {
            o->profile = 1;
            continue;
        }
        if (!strcmp(f, "--allow-data-change")) {
            o->allow_data_change = 1;
            continue;
        }
        if (!strcmp(f, "--resume")) { // an optional value: a checkpoint directory
            o->resume = 1;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) o->resume_path = argv[++i];
            continue;
        }
        if (strncmp(f, "--", 2) != 0) die("unexpected argument '%s' (see --help)", f);
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(name) (!strcmp(f, name) && (v ? (i++, 1) : (die("%s needs a value", name), 0)))
        if (IS("--model")) o->preset = v;
        else if (IS("--layers")) o->layers = (int)parse_int(f, v, 1, 4096);
        else if (IS("--channels")) o->channels = (int)parse_int(f, v, 1, 65536);
        else if (IS("--heads")) o->heads = (int)parse_int(f, v, 1, 65536);
        else if (IS("--vocab")) o->vocab = (int)parse_int(f, v, 1, 1048448); // Vp (a multiple of 128) <= 2^20
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
        else if (IS("--cp")) o->cp = (int)parse_int(f, v, 1, 4096);
        else if (IS("--bucket-mb")) o->bucket_mb = parse_float(f, v, 0, 1e6);
        else if (IS("--recompute")) {
            int r = 0;
            while (r < 3 && strcmp(v, RECOMPUTE_NAMES[r])) r++;
            if (r == 3) die("--recompute must be none, selective or full, got '%s'", v);
            o->recompute = r;
        }
        else if (IS("--comm-timeout")) o->comm_timeout = parse_float(f, v, 0.1, 1e7);
        else if (IS("--nproc")) parse_int(f, v, 1, 4096); // the launcher's (main)
        else if (IS("--ckpt-dir")) o->ckpt_dir = v;
        else if (IS("--ckpt-every")) o->ckpt_every = (int)parse_int(f, v, 0, INT32_MAX);
        else if (IS("--keep")) o->keep = (int)parse_int(f, v, 0, INT32_MAX);
        else if (IS("--max-restarts")) o->max_restarts = (int)parse_int(f, v, 0, 1000000);
        else if (IS("--skip-spikes")) o->skip_spikes = parse_float(f, v, 0, 1e30);
        else if (IS("--straggler")) o->straggler = parse_float(f, v, 0, 1e6);
        else if (IS("--straggler-steps")) o->straggler_steps = (int)parse_int(f, v, 1, INT32_MAX);
        else if (IS("--algo")) {
            if ((o->algo = comm_parse_algo(v)) < 0) die("--algo must be auto, fanin, ring or hier, got '%s'", v);
        } else if (IS("--transport")) {
            o->transport = comm_parse_transport(v);
            if (o->transport < 0) die("--transport must be auto, shm, tcp or verbs, got '%s'", v);
        }
        else if (IS("--ib-dev")) o->ib_dev = v;
        else if (IS("--ib-gid-index")) o->ib_gid_index = (int)parse_int(f, v, 0, 65535);
        else die("unknown flag %s (see --help)", f);
#undef IS
    }
    if (strcmp(o->schedule, "cosine") && strcmp(o->schedule, "linear") && strcmp(o->schedule, "constant"))
        die("--schedule must be cosine, linear or constant, got '%s'", o->schedule);
    if (o->device && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        die("--device must be cpu or cuda, got '%s'", o->device);
    if (o->allow_data_change && !o->resume) die("--allow-data-change lets --resume continue on other data: it needs --resume");
    if (o->resume && !o->resume_path && !o->ckpt_dir)
        die("--resume needs --ckpt-dir DIR (the newest checkpoint in it), or a checkpoint: --resume PATH");
    if ((o->ib_dev || o->ib_gid_index >= 0) && (o->transport == TRANSPORT_SHM || o->transport == TRANSPORT_TCP))
        die("%s chooses an RDMA port, but --transport %s uses none (drop it, or use --transport auto or verbs)",
            o->ib_dev ? "--ib-dev" : "--ib-gid-index", o->transport == TRANSPORT_SHM ? "shm" : "tcp");
    if (!o->ckpt_dir && (o->ckpt_every || o->keep || o->max_restarts))
        die("%s needs --ckpt-dir DIR", o->ckpt_every ? "--ckpt-every" : o->keep ? "--keep" : "--max-restarts");
    char err[256];
    if (o->seq_len && context_split_error(o, o->seq_len, err, sizeof err)) die("%s", err); // before any rank starts
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

// One rank's memory table, one line: bytes per category (current or peak), in MiB; kernel_scratch, the
// backend's own workspaces (outside the categories), when known.
static void print_memory(const GPT2 *m, int rank, const char *when, const size_t bytes[MEM_NCAT], size_t kernel_scratch) {
    printf("memory of rank %d%s:", rank, when);
    for (int c = 0; c < MEM_NCAT; c++) printf(" %s %.2f MiB |", MEM_NAMES[c], bytes[c] / 1048576.0);
    printf(" total %.2f MiB | largest logits buffer %zu bytes", mem_sum(bytes) / 1048576.0, m->logits_bytes);
    if (kernel_scratch) printf(" | besides: kernel workspaces %.2f MiB", kernel_scratch / 1048576.0);
    printf("\n");
    fflush(stdout);
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

static int sample_token(const Options *o, float *probs, int *order, int V, uint64_t *rng);

// Sampling: the model continues the first token of the training data, one token per forward.
static void sample(Pipeline *p, const Options *o, const Tokenizer *tk, int first_token, int T, int step, int print) {
    GPT2 *m = p->model;
    int n = o->sample_tokens < T - 1 ? o->sample_tokens : T - 1, Tl = T / m->cp;
    int32_t *ctx = xcalloc((size_t)T, sizeof(int32_t)), *local = xcalloc((size_t)Tl, sizeof(int32_t));
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
        if (m->cp > 1) cp_slice(ctx, local, 1, Tl, m->cp, m->cp_rank);
        pipeline_forward(p, m->cp > 1 ? local : ctx, NULL, 1, Tl);
        int V = m->cfg.V, next = 0;
        if (m->last) { // the last stage holds the logits and samples; the others learn the token from it
            gpt2_logits_at(m, 0, t - 1, Tl, probs);
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
    free(local);
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

static float validate(Pipeline *p, TokenSet *val, Comm *cp_comm, int B, int T, int steps) {
    GPT2 *m = p->model;
    int cp = m->cp, Tl = T / cp;
    int32_t *inp = xmalloc(sizeof(int32_t) * B * T), *tgt = xmalloc(sizeof(int32_t) * B * T);
    int32_t *linp = xmalloc(sizeof(int32_t) * B * Tl), *ltgt = xmalloc(sizeof(int32_t) * B * Tl);
    double sum = 0.0;
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < B; b++) tokenset_sequence(val, (uint64_t)s * B + b, inp + b * T, tgt + b * T);
        if (cp > 1) { // this rank's positions
            cp_slice(inp, linp, B, Tl, cp, m->cp_rank);
            cp_slice(tgt, ltgt, B, Tl, cp, m->cp_rank);
        }
        sum += pipeline_forward(p, cp > 1 ? linp : inp, cp > 1 ? ltgt : tgt, B, Tl);
    }
    free(inp);
    free(tgt);
    free(linp);
    free(ltgt);
    // the loss lives on the last stage; each context-parallel rank has the mean of its share of the tokens
    return (float)(comm_sum_double(cp_comm, comm_sum_double(m->pp_comm, sum)) / ((double)steps * cp));
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

// ---------------------------------------------------------------------------------------------
// signals and injected faults

// SIGTERM (preemption, a launcher stopping its job) and SIGUSR1 (Slurm's warning before the time
// limit) ask for a clean stop; the step loop reads this at every step boundary. A second one ends the
// process at once (a step can be long).
static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) {
    if (stop_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    stop_signal = sig;
}

// The handlers go in first thing, in one place: the --nproc launcher starts ranks with SIGUSR1 blocked
// (it passes SIGUSR1 on), so one sent while a rank starts waits for the handler instead of killing it.
static void install_stop_signals(void) {
    struct sigaction sa = { .sa_handler = on_stop_signal };
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0) die("sigaction: %s", strerror(errno));
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    if (sigprocmask(SIG_UNBLOCK, &m, NULL) != 0) die("sigprocmask: %s", strerror(errno));
}

// LLM4D_FAULT, a testing aid: faults injected into this process, items "rank=R,step=S[,at=WHAT]
// [,ms=M][,launch=N]" separated by ';'. WHAT: kill (the default; rank R SIGKILLs itself as step S
// begins), ckpt-write (it SIGKILLs itself halfway through its shard of the checkpoint of step S), nan
// or spike (its loss of step S becomes NaN or 1000 times larger, a silent data corruption), slow
// (every step from S on computes M ms longer). An item applies to launch N of --max-restarts (0, the
// first launch, by default; the launcher sets LLM4D_LAUNCH).
typedef struct {
    int kill_step, ckpt_kill_step, nan_step, spike_step, slow_from, slow_ms;
} Faults;

static void parse_faults(Faults *f, int rank) {
    *f = (Faults){ -1, -1, -1, -1, -1, 0 };
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
        int *slot = !strcmp(at, "kill") ? &f->kill_step : !strcmp(at, "ckpt-write") ? &f->ckpt_kill_step
                  : !strcmp(at, "nan") ? &f->nan_step : !strcmp(at, "spike") ? &f->spike_step
                  : !strcmp(at, "slow") ? &f->slow_from : NULL;
        if (!slot) die("LLM4D_FAULT: at=%s is not kill, ckpt-write, nan, spike or slow", at);
        if (r != rank || when != launch) continue;
        *slot = s;
        if (slot == &f->slow_from) f->slow_ms = ms;
    }
    free(copy);
}

// ---------------------------------------------------------------------------------------------
// the layout: rank = ((dp·PP + pp)·CP + cp)·TP + tp, so a tensor-parallel group is consecutive ranks (one
// node when it fits), a context-parallel group's ranks are TP apart and a pipeline's stages TP·CP apart

typedef struct {
    LaunchEnv env;
    Comm *world; // NULL: one process
    // dp: the gradient group, every rank holding the same weights: DP x CP ranks (context-parallel ranks
    // hold the same weights too); ZeRO shards over it
    Comm *tp, *pp, *pp_fwd, *pp_bwd, *dp, *embed, *cp, *cp_grad;
    int rank, nranks, lead;
    int tp_size, pp_size, dp_size, cp_size, tp_rank, pp_rank, dp_rank, cp_rank;
} Topology;

// Whether nranks ranks split into the model-parallel axes: 0, or -1 with the reason.
static int layout_error(const Options *o, int nranks, char *err, size_t cap) {
    int model_ranks = o->tp * o->cp * o->pp;
    if (nranks % model_ranks == 0) return 0;
    if (o->cp > 1)
        return snprintf(err, cap, "--tp %d x --cp %d x --pp %d = %d does not divide the %d ranks", o->tp, o->cp, o->pp,
                        model_ranks, nranks), -1;
    return snprintf(err, cap, "--tp %d x --pp %d = %d does not divide the %d ranks", o->tp, o->pp, model_ranks, nranks), -1;
}

static void topology_init(Topology *t, const Options *o) {
    memset(t, 0, sizeof *t);
    if (launch_env_read(&t->env)) {
        CommOptions copt = { .timeout = o->comm_timeout, .transport = o->transport, .algo = o->algo, .log = 1, .ib_dev = o->ib_dev,
                             .ib_gid_index = o->ib_gid_index };
        t->world = comm_init(&t->env, &copt);
    }
    t->rank = t->world ? comm_rank(t->world) : 0;
    t->nranks = t->world ? comm_size(t->world) : 1;
    t->lead = t->rank == 0;
    t->tp_size = o->tp;
    t->pp_size = o->pp;
    t->cp_size = o->cp;
    int model_ranks = t->tp_size * t->cp_size * t->pp_size;
    char err[160];
    if (layout_error(o, t->nranks, err, sizeof err)) die("%s", err);
    t->dp_size = t->nranks / model_ranks;
    t->tp_rank = t->rank % t->tp_size;
    t->cp_rank = t->rank / t->tp_size % t->cp_size;
    t->pp_rank = t->rank / (t->tp_size * t->cp_size) % t->pp_size;
    t->dp_rank = t->rank / model_ranks;
    if (!t->world) return;
    int TP = t->tp_size, CP = t->cp_size, PP = t->pp_size;
    int pipe = (t->dp_rank * CP + t->cp_rank) * TP + t->tp_rank;
    int ends = PP > 1 && (t->pp_rank == 0 || t->pp_rank == PP - 1);
    t->tp = comm_split(t->world, t->rank / TP, t->tp_rank, "tp");
    t->pp = comm_split(t->world, pipe, t->pp_rank, "pp");
    t->pp_fwd = comm_split(t->world, pipe, t->pp_rank, "pp activations");
    t->pp_bwd = comm_split(t->world, pipe, t->pp_rank, "pp gradients");
    t->dp = comm_split(t->world, t->pp_rank * TP + t->tp_rank, t->dp_rank * CP + t->cp_rank, CP > 1 ? "dp x cp" : "dp");
    t->embed = comm_split(t->world, ends ? pipe : -1, t->pp_rank, "embedding");
    if (CP > 1) { // K/V blocks on one, dK/dV accumulators on the other
        int ring = (t->dp_rank * PP + t->pp_rank) * TP + t->tp_rank;
        t->cp = comm_split(t->world, ring, t->cp_rank, "cp");
        t->cp_grad = comm_split(t->world, ring, t->cp_rank, "cp gradients");
    }
}

static void topology_free(Topology *t) {
    if (!t->world) return;
    comm_barrier(t->world); // nobody leaves while another rank still needs it
    if (t->cp) comm_destroy(t->cp);
    if (t->cp_grad) comm_destroy(t->cp_grad);
    comm_destroy(t->tp);
    comm_destroy(t->dp);
    comm_destroy(t->pp);
    comm_destroy(t->pp_fwd);
    comm_destroy(t->pp_bwd);
    comm_destroy(t->embed);
    comm_destroy(t->world);
}

// Whether every rank can go on: a problem (err) is printed once, by the lowest rank that has one, in
// one line; the other ranks exit quietly.
static void agree_or_exit(const Topology *t, const char *err) {
    int32_t mine = err ? -t->rank : INT32_MIN, lowest = mine; // the maximum of -rank: there is no OP_MIN
    if (t->world) comm_all_reduce(t->world, &mine, &lowest, 1, CT_I32, OP_MAX);
    if (lowest == INT32_MIN) return;
    if (err && -lowest == t->rank) die("%s", err);
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

typedef struct { // stragglers: consecutive slow steps of every rank, and its host
    int *slow_for;
    char (*host)[64];
    double *compute; // this step's compute seconds of every rank
} Stragglers;

typedef struct {
    Options o;
    Topology topo;
    const Backend *be;
    DType dt;
    GPT2Config cfg;
    int B, T, accum, chunks; // chunks: --pp-virtual
    int Tl;                  // positions of a sequence on this rank: T / CP
    long long batch_tokens, G; // G: sequences per step
    TokenSet train, val;
    int have_train, have_tk, first_token;
    Tokenizer tk;
    RankLayout rl;
    GPT2 model;
    Zero zero;
    Pipeline pipe;
    Ckpt *ckpt;
    int ckpt_lock; // rank 0: the descriptor holding --ckpt-dir's lock (-1: none)
    int start_step, end_step, resumed;
    int32_t *inputs, *targets; // this rank's tokens of a step (its positions of them under context parallelism)
    int32_t *full_in, *full_tgt; // context parallelism: the whole sequences they are cut from
    FILE *logf;
    SpikeGuard spikes;
    Stragglers strag;
    Faults faults;
    double flops_per_token, stall_ms; // the checkpoint stall before the coming step
    int64_t stall_step[4];
    double stall_hist[4]; // recent checkpoints' stalls, for their completion records
    int nstalls;
} Trainer;

typedef struct { // what one step did, for the report
    float loss, norm, lr;
    int skipped;
    double ms, compute_ms, comm_ms, exposed_ms, tp_ms, cp_ms, cp_exposed_ms, attn_flops;
} StepResult;

static void setup_device(Trainer *t) {
    const Options *o = &t->o;
    int ncuda = cuda_device_count();
    if (o->device ? !strcmp(o->device, "cuda") : ncuda > 0) {
        if (!backend_cuda()) die("--device cuda: this binary was built without CUDA (nvcc was not found)");
        if (ncuda == 0) {
            char why[256];
            cuda_unavailable_reason(why, sizeof why);
            die("--device cuda: %s", why);
        }
        if (t->topo.world) cuda_use_device(t->topo.env.local_rank % ncuda); // one GPU per rank of this node
        t->be = backend_cuda();
    } else {
        t->be = backend_cpu();
    }
    const char *isa = getenv("LLM4D_CPU_ISA"); // unset or empty: the best this CPU has
    if (isa && *isa && !cpu_select_isa(isa)) {
        if (!strcmp(isa, "avx512bf16")) die("LLM4D_CPU_ISA=avx512bf16: this CPU does not have AVX512-BF16");
        die("LLM4D_CPU_ISA must be generic or avx512bf16, got '%s'", isa);
    }
    // ranks sharing a node share its cores: OpenMP threads that outnumber the cores spin against each
    // other and against the progress threads, and a step can take 100x longer
    int threads = o->threads;
    if (!threads && t->topo.world && t->topo.env.local_world > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores / t->topo.env.local_world > 1 ? (int)(cores / t->topo.env.local_world) : 1;
    }
    if (threads) t->be->set_threads(threads);
    t->dt = o->dtype >= 0 ? (DType)o->dtype : (t->be == backend_cpu() ? DT_F32 : DT_BF16);
    // the model, ZeRO, the pipeline and the context-parallel ring hand device buffers to the collectives,
    // which move them in place (devmem.h: CUDA IPC inside a node, pinned staging across nodes); host
    // buffers stay on the host
    if (t->be->mem_kind == MEMKIND_DEVICE) {
        const DevMem *dev = devmem_cuda(); // after cuda_use_device: the progress threads use that device
        Topology *tp = &t->topo;
        Comm *all[] = { tp->world, tp->tp, tp->pp, tp->pp_fwd, tp->pp_bwd, tp->dp, tp->embed, tp->cp, tp->cp_grad };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) comm_use_device(all[i], dev);
    }
}

// The batch arithmetic, bounded so that no count overflows: accum micro-batches of B x T tokens on
// each of the data-parallel ranks, G sequences per step, global sequence indices below 2^62.
#define MAX_MICRO_TOKENS (1LL << 24)
#define MAX_ACCUM (1LL << 16)
#define MAX_STEP_TOKENS (1LL << 28) // one rank's tokens of a step (two int32 copies)
static void setup_batch(Trainer *t) {
    const Options *o = &t->o;
    int dp = t->topo.dp_size;
    t->T = o->seq_len ? o->seq_len : t->cfg.maxT;
    if (t->T > t->cfg.maxT) die("--seq-len %d is above the model's maximum sequence length %d", t->T, t->cfg.maxT);
    t->B = o->micro_batch;
    char err[256];
    agree_or_exit(&t->topo, context_split_error(o, t->T, err, sizeof err) ? err : NULL); // the model's default T
    t->Tl = t->T / t->topo.cp_size;
    long long micro = (long long)t->B * t->T;
    if (micro > MAX_MICRO_TOKENS)
        die("--micro-batch %d x --seq-len %d = %lld tokens per micro-batch, more than the %lld allowed", t->B, t->T, micro,
            MAX_MICRO_TOKENS);
    long long micro_tokens = micro * dp; // one micro-batch on every data-parallel rank
    t->batch_tokens = o->batch_tokens ? o->batch_tokens : micro_tokens;
    if (t->batch_tokens % micro_tokens != 0) {
        if (dp > 1)
            die("--batch-tokens %lld is not a multiple of data-parallel ranks x --micro-batch x --seq-len = %d x %d x %d = %lld",
                t->batch_tokens, dp, t->B, t->T, micro_tokens);
        die("--batch-tokens %lld is not a multiple of --micro-batch x --seq-len = %d x %d = %lld", t->batch_tokens, t->B, t->T,
            micro_tokens);
    }
    long long accum = t->batch_tokens / micro_tokens;
    if (accum > MAX_ACCUM || accum * micro > MAX_STEP_TOKENS)
        die("--batch-tokens %lld means %lld micro-batches of %d x %d per data-parallel rank and step, more than the %lld "
            "micro-batches (and %lld tokens) a step may accumulate", t->batch_tokens, accum, t->B, t->T, MAX_ACCUM,
            MAX_STEP_TOKENS);
    t->accum = (int)accum;
    t->G = t->batch_tokens / t->T;
    if (t->G > (1LL << 62) / ((long long)o->steps + 1))
        die("--batch-tokens %lld x --steps %d: %lld sequences per step overflow the global sequence count", t->batch_tokens,
            o->steps, t->G);
}

static void open_data(Trainer *t) {
    const Options *o = &t->o;
    t->have_train = o->steps > 0 || o->dump;
    if (t->have_train) {
        if (!o->train) die("no training data: pass --train PATTERN (make shards with ./train prepare INPUT.txt DIR)");
        tokenset_open(&t->train, o->train, "--train", t->cfg.V, t->T, o->shuffle, o->seed);
        uint32_t t0;
        tokenset_read(&t->train, 0, 1, &t0);
        t->first_token = t0;
    }
    if (o->val) tokenset_open(&t->val, o->val, "--val", t->cfg.V, t->T, 0, o->seed);
    if (o->tokenizer) {
        tokenizer_load(&t->tk, o->tokenizer);
        t->have_tk = 1;
    } else if (t->have_train) { // tokenizer.bin next to the first training shard
        const char *first = t->train.shards[0].path;
        const char *slash = strrchr(first, '/');
        size_t dirlen = slash ? (size_t)(slash - first) : 1;
        char *path = xmalloc(dirlen + 16);
        snprintf(path, dirlen + 16, "%.*s/tokenizer.bin", (int)dirlen, slash ? first : ".");
        struct stat st;
        if (stat(path, &st) == 0) {
            tokenizer_load(&t->tk, path);
            t->have_tk = 1;
        }
        free(path);
    }
}

// The log is written in place (it may be /dev/stdout); a regular file or symlink goes through the
// safe-write checks, since a resumed run rewrites it.
static int check_log(const char *path, char *err, size_t cap) {
    struct stat st;
    char target[SAFE_PATH_MAX];
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return 0;
    return safe_check("--log", path, target, sizeof target, err, cap) < 0 ? -1 : 0;
}

// Every output location is checked before any work: a missing directory or a device node at a model
// path is found now, not after the run.
static void check_outputs(const Trainer *t) {
    const Options *o = &t->o;
    const Topology *tp = &t->topo;
    char err[2 * SAFE_PATH_MAX] = "", target[SAFE_PATH_MAX];
    int bad = 0;
    if (tp->lead && o->save_model) {
        int link = safe_check("--save-model", o->save_model, target, sizeof target, err, sizeof err);
        bad = link < 0;
        if (link == 1) printf("note: --save-model %s is a symlink: the model goes to its target, %s\n", o->save_model, target);
    }
    if (!bad && tp->lead && o->log) bad = check_log(o->log, err, sizeof err) < 0;
    if (!bad && o->ckpt_dir) bad = ensure_dir("--ckpt-dir", o->ckpt_dir, err, sizeof err) < 0;
    if (!bad && tp->lead && o->dump) bad = ensure_dir("--dump", o->dump, err, sizeof err) < 0;
    if (!bad && o->pp_trace && tp->dp_rank == 0 && tp->cp_rank == 0 && tp->tp_rank == 0) bad = ensure_dir("--pp-trace", o->pp_trace, err, sizeof err) < 0;
    agree_or_exit(tp, bad ? err : NULL);
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
    m->ranks = t->topo.nranks;
    m->dp = t->topo.dp_size;
    m->tp = t->topo.tp_size;
    m->pp = t->topo.pp_size;
    m->cp = t->topo.cp_size;
    m->pp_virtual = t->chunks;
    m->zero = t->zero.model ? t->zero.stage : o->zero;
    m->sp = o->sp;
    m->bucket_mb = o->bucket_mb;
    snprintf(m->dtype, sizeof m->dtype, "%s", dtype_name(t->dt));
    m->micro_batch = t->B;
    m->seq_len = t->T;
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
}

// The model, the optimizer state and the pipeline: from a checkpoint (--resume), else from the seed or
// --init-from (host_params, the full model in file order).
static void build_model(Trainer *t, float *host_params) {
    const Options *o = &t->o;
    Topology *tp = &t->topo;
    int P = tp->pp_size, V = P > 1 ? o->pp_virtual : 1;
    t->chunks = V;
    if (V > 1 && t->accum % P)
        die("--pp-virtual %d: the %d micro-batch(es) per step must be a multiple of --pp %d for the interleaved schedule",
            V, t->accum, P);
    t->rl = (RankLayout){ .cfg = &t->cfg, .dt = t->dt, .be = t->be, .B = t->B, .T = t->T, .accum = t->accum,
                          .tp_size = tp->tp_size, .tp_rank = tp->tp_rank, .sp = o->sp, .pp_size = P, .pp_rank = tp->pp_rank,
                          .pp_virtual = V, .cp_size = tp->cp_size, .cp_rank = tp->cp_rank, .dp_size = tp->dp_size,
                          .dp_rank = tp->dp_rank, .zero = o->zero, .recompute = o->recompute, .pp_layers = o->pp_layers,
                          .bucket_mb = o->bucket_mb, .tp = tp->tp, .pp = tp->pp, .pp_fwd = tp->pp_fwd, .pp_bwd = tp->pp_bwd,
                          .dp = tp->dp, .embed = tp->embed, .cp = tp->cp, .cp_grad = tp->cp_grad };
    layout_build_model(&t->rl, &t->model);
    size_t n = t->model.num_params;
    float *master = xmalloc(sizeof(float) * n), *m = NULL, *v = NULL;
    CkptMeta saved;
    if (o->resume) {
        m = xmalloc(sizeof(float) * n);
        v = xmalloc(sizeof(float) * n);
        CkptMeta now;
        fill_meta(t, 0, &now);
        if (o->allow_data_change) now.train_tokens = 0; // another token count too
        char from[SAFE_PATH_MAX];
        t->resumed = ckpt_resume(o->ckpt_dir, o->resume_path, &t->model, tp->world, &now, &saved, master, m, v, from, sizeof from);
        if (t->resumed && t->have_train) { // the same data as the checkpoint's, by content
            char why[2 * SAFE_PATH_MAX], msg[3 * SAFE_PATH_MAX + 128];
            int same = tokenset_fingerprint_check(&t->train, saved.train_fp, why, sizeof why);
            snprintf(msg, sizeof msg, "--resume %s: %s: pass --allow-data-change to train on other data on purpose", from, why);
            agree_or_exit(tp, same < 0 && !o->allow_data_change ? msg : NULL);
            if (tp->lead && same < 0) printf("note: --allow-data-change: %s\n", why);
            if (tp->lead && same > 0)
                fprintf(stderr, "warning: %s records no fingerprint of its training data (written before them): the data "
                        "is not compared\n", from);
        }
        if (t->resumed) {
            t->start_step = (int)saved.step;
            t->spikes.n = saved.nhist;
            t->spikes.skipped = saved.skipped;
            memcpy(t->spikes.loss, saved.hist_loss, sizeof saved.hist_loss);
            memcpy(t->spikes.norm, saved.hist_norm, sizeof saved.hist_norm);
            if (tp->lead)
                printf("resumed from %s: step %lld (written by %d rank(s): DP %d x PP %d x CP %d x TP %d, ZeRO-%d)\n", from,
                       (long long)saved.step, saved.ranks, saved.dp, saved.pp, saved.cp, saved.tp, saved.zero);
        } else if (tp->lead) {
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
    layout_build_state(&t->rl, &t->model, &t->zero, &t->pipe, master, &acfg);
    if (t->resumed) zero_set_moments(&t->zero, m, v, (int)saved.adam_t);
    free(master);
    free(m);
    free(v);
    t->end_step = o->steps;
}

static void setup_checkpoints(Trainer *t) {
    const Options *o = &t->o;
    if (!o->ckpt_dir) return;
    char err[2 * SAFE_PATH_MAX] = "";
    int bad = t->topo.lead && ckpt_prepare_dir(o->ckpt_dir, t->start_step, o->resume, !o->resume_path, err, sizeof err) < 0;
    agree_or_exit(&t->topo, bad ? err : NULL); // also: nobody writes before rank 0 has cleaned up
    t->ckpt = ckpt_open(o->ckpt_dir, &t->model, &t->zero, t->topo.world, o->keep);
    if (t->faults.ckpt_kill_step >= 0) ckpt_kill_during_write(t->ckpt, t->faults.ckpt_kill_step);
}

static void print_header(const Trainer *t) {
    const Options *o = &t->o;
    const Topology *tp = &t->topo;
    const GPT2Config *c = &t->cfg;
    if (tp->lead) {
        size_t full_n = gpt2_param_layout(c, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 });
        printf("llm4d | device %s", t->be->name);
        if (t->be == backend_cpu() && t->dt == DT_BF16) printf(" (bf16 matmuls: %s)", cpu_isa());
        printf(" | dtype %s | model L=%d C=%d H=%d V=%d Vp=%d maxT=%d | %zu parameters", dtype_name(t->dt), c->L, c->C,
               c->NH, c->V, c->Vp, c->maxT, full_n);
        if (tp->tp_size > 1) printf(", %zu on each tensor-parallel rank", t->model.num_params);
        printf("\n");
        printf("layout: %d rank(s) | data parallel %d x pipeline %d x context parallel %d x tensor parallel %d%s | ZeRO-%d | "
               "%d gradient bucket(s) | recompute %s\n", tp->nranks, tp->dp_size, tp->pp_size, tp->cp_size, tp->tp_size,
               o->sp ? " (sequence parallel)" : "", t->zero.stage, t->zero.nbuckets, RECOMPUTE_NAMES[o->recompute]);
        if (tp->cp_size > 1)
            printf("context parallel: each sequence of %d in %d chunks of %d; rank c of a group holds chunks c and %d-c "
                   "(%d positions); K/V round a ring of %d\n", t->T, 2 * tp->cp_size, t->T / (2 * tp->cp_size),
                   2 * tp->cp_size - 1, t->Tl, tp->cp_size);
        printf("batch: %lld tokens per step = %d micro-batch(es) of %d x %d on each of %d rank(s) | %d steps\n",
               t->batch_tokens, t->accum, t->B, t->T, tp->dp_size, o->steps);
        if (t->have_train)
            printf("data: %s (%llu tokens, %llu sequences of %d)%s\n", o->train, (unsigned long long)t->train.ntokens,
                   (unsigned long long)t->train.windows, t->T, o->shuffle ? ", shuffled" : "");
        if (t->ckpt) {
            printf("checkpoints: %s | ", o->ckpt_dir);
            if (o->ckpt_every) printf("every %d steps, ", o->ckpt_every);
            if (o->keep) printf("at the end and on SIGTERM/SIGUSR1 | keeping the newest %d", o->keep);
            else printf("at the end and on SIGTERM/SIGUSR1 | keeping all");
            printf(" | staging %.2f MiB of host memory on rank 0\n", ckpt_staging_bytes(t->ckpt) / 1048576.0);
        }
    }
    // every rank reports its own memory, one line each, in rank order: every buffer is allocated before
    // step 1, so this is the plan (the end of the run prints the peak)
    if (tp->lead) printf("memory per rank: allocated at start, which is all the steps use (the peak follows at the end)\n");
    char when[64];
    snprintf(when, sizeof when, " (%s)", t->be->name);
    for (int r = 0; r < tp->nranks; r++) {
        if (r == tp->rank) print_memory(&t->model, tp->rank, when, t->model.mem.cur, 0);
        if (tp->world) comm_barrier(tp->world);
    }
}

// The end of the run: every rank's peak bytes per category, printed in rank order and logged by rank 0
// as {"memory_peak":{"weights":..,...},"kernel_scratch":B,"rank":R}, one record per rank (kernel_scratch:
// the backend's own grow-only workspaces, which the categories do not see).
static void report_memory_peak(Trainer *t) {
    Topology *tp = &t->topo;
    size_t ks = t->be->scratch_bytes();
    for (int r = 0; r < tp->nranks; r++) {
        if (r == tp->rank) print_memory(&t->model, tp->rank, ", peak", t->model.mem.peak, ks);
        if (tp->world) comm_barrier(tp->world);
    }
    enum { N = MEM_NCAT + 1 };
    int64_t mine[N], *all = xmalloc(sizeof(int64_t) * N * tp->nranks);
    for (int c = 0; c < MEM_NCAT; c++) mine[c] = (int64_t)t->model.mem.peak[c];
    mine[MEM_NCAT] = (int64_t)ks;
    if (tp->world) comm_all_gather(tp->world, mine, all, (size_t)N * tp->nranks, CT_I64);
    else memcpy(all, mine, sizeof mine);
    for (int r = 0; t->logf && r < tp->nranks; r++) {
        const int64_t *a = all + (size_t)r * N;
        fprintf(t->logf, "{\"memory_peak\":{");
        for (int c = 0; c < MEM_NCAT; c++) fprintf(t->logf, "%s\"%s\":%lld", c ? "," : "", MEM_KEYS[c], (long long)a[c]);
        fprintf(t->logf, "},\"kernel_scratch\":%lld,\"rank\":%d}\n", (long long)a[MEM_NCAT], r);
    }
    free(all);
}

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

static void open_log(Trainer *t) {
    const Options *o = &t->o;
    if (!o->log || !t->topo.lead) return;
    if (t->resumed) keep_log_until(o->log, t->start_step);
    t->logf = xfopen(o->log, t->resumed ? "a" : "w");
    if (t->resumed) {
        const char *l = getenv("LLM4D_LAUNCH");
        fprintf(t->logf, "{\"step\":%d,\"resumed\":true,\"launch\":%s}\n", t->start_step, l && *l ? l : "0");
    }
}

static void trainer_init(Trainer *t, int argc, char **argv) {
    memset(t, 0, sizeof *t);
    Options *o = &t->o;
    parse_options(o, argc, argv);
    if (o->max_restarts && !getenv("LLM4D_LAUNCH"))
        die("--max-restarts relaunches a --nproc job (under Slurm, scripts/train.sbatch relaunches job steps)");
    signal(SIGXFSZ, SIG_IGN); // a file over the size limit is a write error (EFBIG), not the end of the process
    topology_init(&t->topo, o);
    Topology *tp = &t->topo;
    if (o->dump && tp->nranks > 1) die("--dump works on a single rank only");
    check_outputs(t);
    char err[2 * SAFE_PATH_MAX] = ""; // the checkpoint directory locked before anything in it is read or changed
    t->ckpt_lock = -1;
    agree_or_exit(tp, tp->lead && ckpt_lock(o->ckpt_dir, o->resume_path, &t->ckpt_lock, err, sizeof err) < 0 ? err : NULL);
    parse_faults(&t->faults, tp->rank);
    setup_device(t);
    float *host_params;
    t->cfg = resolve_shape(o, &host_params);
    if (t->cfg.NH % tp->tp_size) die("--tp %d does not divide the model's %d heads", tp->tp_size, t->cfg.NH);
    if (o->sp && tp->tp_size == 1) die("--sp needs tensor parallelism (--tp 2 or more)");
    setup_batch(t);
    open_data(t); // before any large allocation, so that a bad file is reported first
    build_model(t, host_params);
    setup_checkpoints(t);
    t->flops_per_token = gpt2_flops_per_token(&t->cfg, t->T);
    print_header(t);
    open_log(t);
    size_t step_tokens = (size_t)t->accum * t->B * t->Tl;
    t->inputs = xmalloc(sizeof(int32_t) * step_tokens);
    t->targets = xmalloc(sizeof(int32_t) * step_tokens);
    if (tp->cp_size > 1) {
        t->full_in = xmalloc(sizeof(int32_t) * step_tokens * tp->cp_size);
        t->full_tgt = xmalloc(sizeof(int32_t) * step_tokens * tp->cp_size);
    }
    t->strag.slow_for = xcalloc((size_t)tp->nranks, sizeof(int));
    t->strag.compute = xcalloc((size_t)tp->nranks, sizeof(double));
    t->strag.host = xcalloc((size_t)tp->nranks, 64);
    snprintf(t->strag.host[tp->rank], 64, "%.63s", tp->env.node_id[0] ? tp->env.node_id : "localhost");
    if (tp->world) { // every rank's host, for straggler reports
        char mine[64];
        memcpy(mine, t->strag.host[tp->rank], 64);
        comm_all_gather(tp->world, mine, t->strag.host, 16 * (size_t)tp->nranks, CT_I32);
    }
}

// ---------------------------------------------------------------------------------------------
// the step

// This rank's sequences of step `step`: a contiguous block of accum x B of the global batch (under
// context parallelism, this rank's positions of them).
static void next_batch(Trainer *t, int step) {
    int cp = t->topo.cp_size, n = t->accum * t->B;
    int32_t *in = cp > 1 ? t->full_in : t->inputs, *tgt = cp > 1 ? t->full_tgt : t->targets;
    for (int i = 0; i < n; i++) {
        uint64_t g = (uint64_t)step * t->G + (uint64_t)t->topo.dp_rank * n + i;
        tokenset_sequence(&t->train, g, in + (size_t)i * t->T, tgt + (size_t)i * t->T);
    }
    if (cp == 1) return;
    cp_slice(in, t->inputs, n, t->Tl, cp, t->topo.cp_rank);
    cp_slice(tgt, t->targets, n, t->Tl, cp, t->topo.cp_rank);
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
    if (t->topo.world) comm_all_reduce(t->topo.world, &bad, &any, 1, CT_I32, OP_MAX);
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
    Topology *tp = &t->topo;
    if (step + 1 == t->faults.kill_step) raise(SIGKILL);
    double t0 = now_seconds(), tp_busy0 = tp->tp_size > 1 ? comm_busy_seconds(tp->tp) : 0;
    double cp_busy0 = tp->cp ? comm_busy_seconds(tp->cp) + comm_busy_seconds(tp->cp_grad) : 0;
    t->model.prof = (Profile){ .on = t->o.profile };
    t->model.ring.wait_s = 0;
    zero_begin_step(&t->zero);
    gpt2_zero_grad(&t->model);
    next_batch(t, step);

    double c0 = now_seconds();
    if (t->faults.slow_from >= 0 && step + 1 >= t->faults.slow_from) usleep((useconds_t)t->faults.slow_ms * 1000);
    double loss_sum = pipeline_step(&t->pipe, t->inputs, t->targets, t->accum, t->B, t->Tl, 1.0f / (float)t->batch_tokens);
    double tp_busy = tp->tp_size > 1 ? comm_busy_seconds(tp->tp) - tp_busy0 : 0;
    // compute: the schedule's time less its waits for other ranks (pipeline hand-offs, ZeRO gathers and
    // buckets, tensor-parallel collectives, the context-parallel ring)
    r->compute_ms = (now_seconds() - c0 - t->pipe.wait_s - tp_busy - t->model.ring.wait_s) * 1e3 - zero_exposed_ms(&t->zero);
    if (step + 1 == t->faults.nan_step) loss_sum = NAN;
    if (step + 1 == t->faults.spike_step) loss_sum *= 1000;

    r->norm = zero_finish_grads(&t->zero); // first: the loss's reduction would queue behind the buckets
    // each rank's micro-batch losses are means over its B x Tl tokens, the same count on every rank
    r->loss = (float)(comm_sum_double(tp->pp, zero_sum_double(&t->zero, loss_sum)) / (t->accum * tp->dp_size * tp->cp_size));

    r->lr = lr_at(&t->o, step);
    r->skipped = t->o.skip_spikes > 0 ? spike(t, r->loss, r->norm) : 0;
    if (!r->skipped && !isfinite(r->loss)) die("loss is %f at step %d: training diverged (--skip-spikes F skips such steps)", r->loss, step + 1);
    if (!r->skipped) zero_step(&t->zero, r->lr, r->norm);
    t->be->sync();
    r->ms = (now_seconds() - t0) * 1e3;
    r->comm_ms = zero_comm_ms(&t->zero);
    r->exposed_ms = zero_exposed_ms(&t->zero);
    r->tp_ms = tp_busy * 1e3;
    r->cp_ms = tp->cp ? (comm_busy_seconds(tp->cp) + comm_busy_seconds(tp->cp_grad) - cp_busy0) * 1e3 : 0;
    r->cp_exposed_ms = t->model.ring.wait_s * 1e3;
    r->attn_flops = t->model.prof.attention_flops;
}

// Stragglers: every rank's compute time; a rank above the median by more than --straggler (and by more
// than STRAGGLER_MIN_MS: a busy machine's jitter on short steps is no straggler) for --straggler-steps
// steps in a row is reported once per streak. Collective.
#define STRAGGLER_MIN_MS 20.0
static void stragglers(Trainer *t, int step, const StepResult *r, double *max_ms, double *median_ms, int *slowest) {
    Topology *tp = &t->topo;
    Stragglers *s = &t->strag;
    double mine = r->compute_ms;
    if (tp->world) comm_all_gather(tp->world, &mine, s->compute, (size_t)tp->nranks, CT_I64);
    else s->compute[0] = mine;
    double *sorted = xmalloc(sizeof(double) * tp->nranks);
    memcpy(sorted, s->compute, sizeof(double) * tp->nranks);
    for (int i = 1; i < tp->nranks; i++)
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            double x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    int n = tp->nranks;
    *median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    free(sorted);
    *slowest = 0;
    for (int q = 0; q < tp->nranks; q++) {
        if (s->compute[q] > s->compute[*slowest]) *slowest = q;
        int slow = tp->nranks > 1 && s->compute[q] > *median_ms * (1.0 + t->o.straggler) &&
                   s->compute[q] - *median_ms > STRAGGLER_MIN_MS;
        s->slow_for[q] = slow ? s->slow_for[q] + 1 : 0;
        if (s->slow_for[q] != t->o.straggler_steps || !tp->lead) continue;
        fprintf(stderr, "warning: straggler: rank %d on %s has computed more than %.0f%% longer than the median for %d steps "
               "(%.1f ms against %.1f ms at step %d)\n", q, s->host[q], 100 * t->o.straggler, t->o.straggler_steps,
               s->compute[q], *median_ms, step + 1);
        if (t->logf) {
            fprintf(t->logf, "{\"step\":%d,\"straggler\":%d,\"host\":", step + 1, q);
            log_string(t->logf, s->host[q]);
            fprintf(t->logf, ",\"compute_ms\":%.3f,\"median_ms\":%.3f}\n", s->compute[q], *median_ms);
        }
    }
    *max_ms = s->compute[*slowest];
}

static void report(Trainer *t, int step, const StepResult *r) {
    Topology *tp = &t->topo;
    int P = tp->pp_size;
    double tps = t->batch_tokens / (r->ms / 1e3);
    // the bubble: the share of the step each stage waited for activations or gradients
    double bubble_max = 0, bubble_mean = 0, bubble_formula = (P - 1.0) / ((double)t->chunks * t->accum + P - 1.0);
    if (P > 1) {
        double mine = t->pipe.wait_s / (r->ms / 1e3), *all = xmalloc(sizeof(double) * P);
        comm_all_gather(tp->pp, &mine, all, (size_t)P, CT_I64);
        for (int s = 0; s < P; s++) {
            bubble_mean += all[s] / P;
            if (all[s] > bubble_max) bubble_max = all[s];
        }
        free(all);
        if (t->o.pp_trace && tp->dp_rank == 0 && tp->cp_rank == 0 && tp->tp_rank == 0) write_trace(t->o.pp_trace, tp->pp_rank, step + 1, &t->pipe);
    }
    double cmax, cmed;
    int slowest;
    stragglers(t, step, r, &cmax, &cmed, &slowest);
    // attention FLOPs of every rank: context parallelism should give each rank of a group the same share
    double amin = r->attn_flops, amax = r->attn_flops, asum = r->attn_flops;
    if (tp->world) {
        double *all = xmalloc(sizeof(double) * tp->nranks);
        comm_all_gather(tp->world, &r->attn_flops, all, (size_t)tp->nranks, CT_I64);
        asum = 0;
        for (int q = 0; q < tp->nranks; q++) {
            asum += all[q];
            amin = all[q] < amin ? all[q] : amin;
            amax = all[q] > amax ? all[q] : amax;
        }
        free(all);
    }
    if (tp->lead) {
        printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f GFLOP/s", step + 1, t->o.steps,
               r->loss, r->lr, r->norm, r->ms, tps, tps * t->flops_per_token / 1e9);
        if (tp->dp_size > 1) printf(" | comm %.1f ms, exposed %.1f ms", r->comm_ms, r->exposed_ms);
        if (tp->tp_size > 1) printf(" | tp comm %.1f ms", r->tp_ms);
        if (tp->cp_size > 1) printf(" | cp comm %.1f ms, exposed %.1f ms", r->cp_ms, r->cp_exposed_ms);
        if (P > 1) printf(" | bubble %.1f%% max, %.1f%% mean (formula %.1f%%)", 100 * bubble_max, 100 * bubble_mean, 100 * bubble_formula);
        if (t->stall_ms > 0) printf(" | checkpoint stall %.1f ms", t->stall_ms);
        if (r->skipped) printf(" | SKIPPED (%lld so far)", (long long)t->spikes.skipped);
        if (t->o.profile) {
            double mm = t->model.prof.seconds[PROF_MATMUL] * 1e3, at = t->model.prof.seconds[PROF_ATTENTION] * 1e3;
            printf(" | matmul %.1f ms (%.0f%%), attention %.1f ms (%.0f%%), other %.1f ms (%.0f%%)", mm, 100 * mm / r->ms,
                   at, 100 * at / r->ms, r->ms - mm - at, 100 * (r->ms - mm - at) / r->ms);
        }
        printf("\n");
        fflush(stdout);
    }
    if (t->logf) {
        fprintf(t->logf,
                "{\"step\":%d,\"tokens\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
                "\"comm_ms\":%.3f,\"exposed_comm_ms\":%.3f,\"tp_comm_ms\":%.3f,\"cp_comm_ms\":%.3f,\"cp_exposed_ms\":%.3f,"
                "\"bubble_max\":%.4f,\"bubble_mean\":%.4f,\"bubble_formula\":%.4f,\"attn_flops_min\":%.0f,"
                "\"attn_flops_max\":%.0f,\"attn_flops_total\":%.0f,\"compute_ms_max\":%.3f,\"compute_ms_median\":%.3f,"
                "\"slowest_rank\":%d,\"ckpt_stall_ms\":%.3f,\"skipped\":%d,\"skipped_total\":%lld",
                step + 1, (step + 1) * t->batch_tokens, r->loss, r->lr, r->norm, r->ms, tps, r->comm_ms, r->exposed_ms, r->tp_ms,
                r->cp_ms, r->cp_exposed_ms, bubble_max, bubble_mean, bubble_formula, amin, amax, asum, cmax, cmed, slowest,
                t->stall_ms, r->skipped, (long long)t->spikes.skipped);
        if (t->zero.stage == 3) fprintf(t->logf, ",\"zero3_gathers\":%d", t->zero.gathers);
        if (t->o.profile)
            fprintf(t->logf, ",\"matmul_ms\":%.3f,\"attention_ms\":%.3f", t->model.prof.seconds[PROF_MATMUL] * 1e3,
                    t->model.prof.seconds[PROF_ATTENTION] * 1e3);
        fputs("}\n", t->logf);
        if (fflush(t->logf) != 0) die("cannot write %s: %s", t->o.log, strerror(errno));
    }
    t->stall_ms = 0;
}

// ---------------------------------------------------------------------------------------------
// step boundaries: stopping, checkpoints, evaluation

// Rank 0 reports finished checkpoints: complete ones with their size and write bandwidth.
static void log_checkpoints(Trainer *t) {
    CkptEvent ev;
    while (t->ckpt && t->topo.lead && ckpt_event(t->ckpt, &ev)) {
        double stall = 0;
        for (int i = 0; i < 4; i++)
            if (t->stall_step[i] == ev.step) stall = t->stall_hist[i];
        double mibs = ev.write_s > 0 ? ev.bytes / 1048576.0 / ev.write_s : 0;
        if (ev.ok)
            printf("checkpoint %s: %.2f MiB in %.3f s (%.1f MiB/s), step stalled %.1f ms\n", ev.path, ev.bytes / 1048576.0,
                   ev.write_s, mibs, stall);
        else if (ev.msg[0] && !strstr(ev.msg, "rank ")) // a shard's failure was reported when it happened
            fprintf(stderr, "warning: the checkpoint of step %lld was not completed (%s); training goes on\n",
                    (long long)ev.step, ev.msg);
        if (!t->logf) continue;
        fprintf(t->logf, "{\"step\":%lld,\"ckpt\":", (long long)ev.step);
        log_string(t->logf, ev.path);
        fprintf(t->logf, ",\"ckpt_ok\":%s,\"ckpt_bytes\":%llu,\"ckpt_write_s\":%.6f,\"ckpt_MiB_per_s\":%.3f,\"ckpt_stall_ms\":%.3f",
                ev.ok ? "true" : "false", (unsigned long long)ev.bytes, ev.write_s, mibs, stall);
        if (!ev.ok) {
            fprintf(t->logf, ",\"ckpt_error\":");
            log_string(t->logf, ev.msg);
        }
        fprintf(t->logf, "}\n");
        fflush(t->logf);
    }
}

// What every rank agrees on at each step boundary: whether to stop (a signal reached any rank), and
// whether every rank's shard of the checkpoint in flight is written. Returns 1 when the run ends here.
static int step_boundary(Trainer *t, int step) {
    int32_t f[2] = { stop_signal != 0, t->ckpt ? ckpt_writing(t->ckpt) : 0 }, g[2] = { f[0], f[1] };
    if (t->topo.world) comm_all_reduce(t->topo.world, f, g, 2, CT_I32, OP_MAX);
    if (t->ckpt) ckpt_advance(t->ckpt, g[1]);
    log_checkpoints(t);
    if (g[0] && step < t->end_step) {
        if (t->topo.lead)
            printf("received %s: stopping cleanly after %d of %d steps%s%s\n",
                   stop_signal == SIGUSR1 ? "SIGUSR1 (the job's time limit is near)" : stop_signal == SIGTERM ? "SIGTERM"
                                                                                    : "a stop signal (on another rank)",
                   step, t->o.steps, t->ckpt && step > t->start_step ? ", with a checkpoint" : "",
                   t->o.save_model ? " and the model saved" : "");
        t->end_step = step;
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
// A resumed run skips its first boundary: that was evaluated before the checkpoint was written.
static void evaluate(Trainer *t, int step, int last) {
    const Options *o = &t->o;
    if (t->resumed && step == t->start_step) return;
    if (o->val && o->val_every > 0 && (step % o->val_every == 0 || last) && (step > 0 || !last)) {
        float vl = validate(&t->pipe, &t->val, t->topo.cp, t->B, t->T, o->val_steps);
        if (t->topo.lead) {
            printf("step %d | val loss %.6f\n", step, vl);
            if (t->logf) fprintf(t->logf, "{\"step\":%d,\"val_loss\":%.9g}\n", step, vl);
        }
    }
    if (o->sample_every > 0 && t->have_train && ((step > 0 && step % o->sample_every == 0) || (last && step > 0)))
        sample(&t->pipe, o, t->have_tk ? &t->tk : NULL, t->first_token, t->T, step, t->topo.lead);
}

// --dump, a testing aid (single rank): step 0's global batch tokens, the first micro-batch's logits
// by a forward that changes no state, and the accumulated gradients; the step itself then runs as usual.
static void dump_step0(Trainer *t) {
    const char *dir = t->o.dump;
    int B = t->B, T = t->T, V = t->cfg.V;
    next_batch(t, 0);
    gpt2_forward(&t->model, t->inputs, t->targets, B, T);
    float *logits = xmalloc(sizeof(float) * V * B * T);
    for (int b = 0; b < B; b++)
        for (int p = 0; p < T; p++) gpt2_logits_at(&t->model, b, p, T, logits + ((size_t)b * T + p) * V);
    write_raw(dir, "logits.bin", logits, sizeof(float) * V * B * T);
    free(logits);
    size_t n = t->model.num_params;
    zero_begin_step(&t->zero);
    gpt2_zero_grad(&t->model);
    pipeline_step(&t->pipe, t->inputs, t->targets, t->accum, B, T, 1.0f / (float)t->batch_tokens);
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

static void trainer_finish(Trainer *t) {
    const Options *o = &t->o;
    if (t->ckpt) {
        ckpt_finish(t->ckpt); // the last checkpoint complete, manifest included
        log_checkpoints(t);
    }
    report_memory_peak(t);
    if (t->logf) xfclose(t->logf, o->log);
    if (o->save_model) {
        size_t full_n = gpt2_param_layout(&t->cfg, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 });
        float *host = xmalloc(sizeof(float) * t->model.num_params), *file = xmalloc(sizeof(float) * full_n);
        zero_gather_master(&t->zero, host);      // collective over the data-parallel group
        gpt2_gather_full(&t->model, host, file); // collective over the tensor-parallel group
        if (t->topo.lead) {
            gpt2_save_file(o->save_model, &t->cfg, file);
            printf("saved %s\n", o->save_model);
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
    free(t->strag.slow_for);
    free(t->strag.compute);
    free(t->strag.host);
    pipeline_free(&t->pipe);
    zero_free(&t->zero);
    gpt2_free(&t->model);
    if (t->have_train) tokenset_close(&t->train);
    if (o->val) tokenset_close(&t->val);
    if (t->have_tk) tokenizer_free(&t->tk);
    topology_free(&t->topo);
}

static int train_main(int argc, char **argv) {
    install_stop_signals();
    Trainer t;
    trainer_init(&t, argc, argv); // layout, device, shapes, data, outputs, model and state, checkpoints
    if (t.o.dump) dump_step0(&t);
    for (int step = t.start_step;; step++) {
        int last = step_boundary(&t, step);
        evaluate(&t, step, last);
        if (t.ckpt && step > t.start_step && (last || (t.o.ckpt_every && step % t.o.ckpt_every == 0))) checkpoint(&t, step);
        if (last) break;
        StepResult r;
        train_step(&t, step, &r);
        report(&t, step, &r);
    }
    trainer_finish(&t);
    return 0;
}

// ---------------------------------------------------------------------------------------------

// --nproc N [--max-restarts R]: launches the ranks; when the job fails (not when a signal stopped the
// launcher), relaunches it, with --resume once --ckpt-dir holds a complete checkpoint, up to R times.
static int launch_with_restarts(const Options *o, int nproc, int argc, char **argv) {
    char **args = xcalloc((size_t)argc + 2, sizeof(char *));
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
            args[n++] = argv[i];
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
    if (argc >= 2 && !strcmp(argv[1], "prepare")) {
        if (argc != 4) die("usage: ./train prepare INPUT.txt DIR");
        data_prepare(argv[2], argv[3]);
        return 0;
    }
    if (nproc) {
        Options o;
        parse_options(&o, argc, argv); // every flag checked before any rank starts
        char err[160];
        if (layout_error(&o, nproc, err, sizeof err)) die("%s", err);
        return launch_with_restarts(&o, nproc, argc, argv);
    }
    return train_main(argc, argv);
}

// options.c: the trainer's command line (options.h): --help's text, the flags and their checks.
#include "options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives.h"
#include "common.h"
#include "model.h"
#include "schedule.h"

static const char USAGE[] =
    "usage: ./train [flags]                      train a GPT-2 model\n"
    "       ./train prepare INPUT.txt DIR        write DIR/train.bin, DIR/val.bin (last 10% of the bytes)\n"
    "                                            and DIR/tokenizer.bin with a byte-level tokenizer (V = 256)\n"
    "       ./train plan --gpus G --batch-tokens N [flags]\n"
    "                                            every (TP, CP, PP, DP) layout of G GPUs: memory per GPU,\n"
    "                                            bubble, communication and compute (./train plan --help)\n"
    "       ./train schedule --pp P --micro-batches M [--pp-virtual V] [--pp-schedule NAME]\n"
    "                                            a pipeline schedule's actions and timeline (1f1b,\n"
    "                                            interleaved, zb-h1, zb-v)\n"
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
    "  --pp-schedule S            1f1b (default), interleaved (default with --pp-virtual V > 1), zb-h1 (1F1B\n"
    "                             with each backward split into input (B) and weight (W) halves, the Ws\n"
    "                             filling the drain: bubble (N-1)(F+B-W) against (N-1)(F+B+W)); the same\n"
    "                             final model whatever the schedule. zb-v: ./train schedule only (for now)\n"
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

// ---------------------------------------------------------------------------------------------
// flag parsing: every value is checked whole, and every error names the flag

long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) die("%s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) die("%s must be between %lld and %lld, got %lld", flag, lo, hi, v);
    return v;
}

float parse_float(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) die("%s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) die("%s must be between %g and %g, got %g", flag, lo, hi, v);
    return (float)v;
}

int context_split_error(const Options *o, int T, char *err, size_t cap) {
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

// One flag that takes a value, argv[*i] (its value argv[*i + 1]; *i moves past it): a flat table.
static void parse_valued_flag(Options *o, int argc, char **argv, int *ip) {
    int i = *ip;
    const char *f = argv[i];
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
    else if (IS("--pp-schedule")) {
        o->pp_schedule = schedule_parse(v);
        if (o->pp_schedule < 0) die("--pp-schedule must be 1f1b, interleaved, zb-h1 or zb-v, got '%s'", v);
    }
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
    else if (IS("--transport")) {
        o->transport = comm_parse_transport(v);
        if (o->transport < 0) die("--transport must be auto, shm, tcp or verbs, got '%s'", v);
    }
    else if (IS("--ib-dev")) o->ib_dev = v;
    else if (IS("--ib-gid-index")) o->ib_gid_index = (int)parse_int(f, v, 0, 65535);
    else die("unknown flag %s (see --help)", f);
#undef IS
    *ip = i;
}

// The checks between flags that need no rank: before any rank starts, so that one line reports them.
static void check_options(const Options *o) {
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

void parse_options(Options *o, int argc, char **argv) {
    *o = (Options){ .micro_batch = 4, .steps = 20, .val_steps = 10, .sample_tokens = 64, .lr = 3e-4f,
                    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .temperature = 1.0f,
                    .seed = 1337, .dtype = -1, .schedule = "cosine", .bucket_mb = 25,
                    .comm_timeout = 300, .tp = 1, .pp = 1, .pp_virtual = 1, .pp_schedule = -1, .cp = 1, .straggler = 0.5f,
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
        parse_valued_flag(o, argc, argv, &i);
    }
    check_options(o);
}

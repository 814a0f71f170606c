// options.c: the trainer's command line (options.h): --help's text (and sample's and eval's), llm.c's
// short flags translated, the flags and their checks.
#include "options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "ckpt.h"
#include "collectives.h"
#include "common.h"
#include "hf.h"
#include "layout.h"
#include "model.h"
#include "schedule.h"

static const char SAMPLE_USAGE[] =
    "usage: ./train sample --model FILE|DIR [--prompt TEXT] [--tokens N] [--temperature F] [--top-k K] [--seed S]\n"
    "                      [--tokenizer FILE] [--device cpu|cuda] [--nproc N --tp N --pp N --cp N ...]\n"
    "  continue TEXT (default: the tokenizer's end-of-text token, else token 0) from a model file, a\n"
    "  checkpoint directory (DIR/ckpt_XXXXXXXX) or the newest checkpoint of a --ckpt-dir DIR, and print it\n"
    "  --model FILE|DIR           an llm.c model file (--save-model's), a checkpoint (directory), or a\n"
    "                             Hugging Face Llama checkpoint (a directory with config.json: --save-hf's)\n"
    "  --prompt TEXT              the text to continue, encoded by the tokenizer as prepare encodes text\n"
    "  --tokens N                 tokens to generate (default 64; prompt and tokens at most --seq-len:\n"
    "                             more are cut to the window, with a note)\n"
    "  --temperature F            sampling temperature (default 1.0)\n"
    "  --top-k K                  sample among the K most likely tokens; 0 = all, 1 = greedy (default 0)\n"
    "  --seed S                   the sampling seed (default 1337): the same seed gives the same text on\n"
    "                             every layout\n"
    "  --tokenizer FILE           llm.c tokenizer file (default: tokenizer.bin beside the model file, or\n"
    "                             beside the checkpoint directory, or beside the training data its\n"
    "                             manifest records); without one, token ids are printed\n"
    "  --seq-len T                the context window (default the model's maxT, at most 1024: a Llama's\n"
    "                             131072 would cost every token a forward over all of them)\n"
    "  and the layout and execution flags of training (./train --help): --device, --dtype, --threads,\n"
    "  --nproc, --tp, --sp, --pp, --cp, --zero, --transport ...\n"
    "  SIGTERM or SIGINT (Ctrl-C) stops it between tokens, on every rank alike: one line says how many\n"
    "  it made, exit 128 + the signal (143, 130); SIGUSR1 is ignored\n";

static const char EVAL_USAGE[] =
    "usage: ./train eval --model FILE|DIR --val PATTERN [--batches N] [--micro-batch B] [--seq-len T]\n"
    "                    [--device cpu|cuda] [--nproc N --tp N --pp N --cp N ...]\n"
    "  the mean loss and perplexity (exp of the loss) of a model file or checkpoint over token shards:\n"
    "  the same batches and the same computation as training's --val-every (batch i: the windows\n"
    "  i*B .. i*B+B-1 of the shards), so that it prints the validation loss a training run printed\n"
    "  --model FILE|DIR           an llm.c model file (--save-model's), a checkpoint (directory), or a\n"
    "                             Hugging Face Llama checkpoint (a directory with config.json: --save-hf's)\n"
    "  --val PATTERN              token shards (a glob)\n"
    "  --batches N                micro-batches of B x T tokens (default 10, as --val-steps)\n"
    "  --micro-batch B            sequences per batch (default 4)\n"
    "  --seq-len T                tokens per sequence (default the model's maxT, at most 1024)\n"
    "  and the layout and execution flags of training (./train --help)\n"
    "  SIGTERM or SIGINT (Ctrl-C) stops it between batches, on every rank alike: one line says how many\n"
    "  it ran and their mean loss, exit 128 + the signal (143, 130); SIGUSR1 is ignored\n";

static const char USAGE[] =
    "usage: ./train [flags]                      train a GPT-2 or Llama model\n"
    "       ./train sample --model FILE|DIR [--prompt TEXT] [--tokens N --temperature F --top-k K --seed S]\n"
    "                                            text from a saved model or checkpoint (./train sample --help)\n"
    "       ./train eval --model FILE|DIR --val PATTERN [--batches N]\n"
    "                                            loss and perplexity of a saved model over token shards\n"
    "                                            (./train eval --help)\n"
    "       ./train prepare [--tokenizer byte|gpt2|bpe:N|FILE] INPUT... DIR\n"
    "                                            token shards DIR/train.bin, DIR/val.bin (last 10%) and\n"
    "                                            DIR/tokenizer.bin from text: bytes (V = 256, the default),\n"
    "                                            GPT-2's BPE, a BPE learned on the input, or an earlier\n"
    "                                            tokenizer.bin (./train prepare --help)\n"
    "       ./train plan --gpus G --batch-tokens N [flags]\n"
    "                                            every (TP, CP, PP, DP) layout of G GPUs: memory per GPU,\n"
    "                                            bubble, communication and compute (./train plan --help)\n"
    "       ./train schedule --pp P --micro-batches M [--pp-virtual V] [--pp-schedule NAME] [--ascii]\n"
    "                        [--pp-schedule-dump FILE]\n"
    "                                            a pipeline schedule's actions and timeline (1f1b,\n"
    "                                            interleaved, zb-h1, zb-v)\n"
    "       ./train bench-comm --nproc N [flags] collective bandwidth table, as nccl-tests prints\n"
    "       ./train hf-inspect DIR [--dump OUT] [--via-model RAW] [--save-hf OUT2 [--dtype fp32|bf16] [--max-shard-bytes N]]\n"
    "                                            a tool: a Hugging Face Llama checkpoint's config and tensors (read,\n"
    "                                            shape-checked, converted to fp32), dumped raw or written again\n"
    "\n"
    "model (a preset, then any shape flag overrides it; default d12):\n"
    "  --model d12|d24|d36|d48    GPT-2 124M / 350M / 774M / 1558M shapes (maxT 1024, V 50257)\n"
    "  --layers L --channels C --heads H --vocab V\n"
    "                             a custom shape; the vocab is padded to a multiple of 128 (Vp); without\n"
    "                             --vocab, V is the vocabulary of tokenizer.bin beside the first training\n"
    "                             shard when there is one (./train prepare writes one: V = 256)\n"
    "  --max-seq-len N            the position table's length maxT (custom shapes: default --seq-len)\n"
    "  --arch gpt2|llama          the architecture (default gpt2; a Llama --model implies llama)\n"
    "  --model llama3-tiny|llama3.2-1b|llama3-8b|llama3-70b|llama3-405b\n"
    "                             Meta's shapes (llama3-tiny: 2 layers, C 64, 4 heads, 2 kv heads, for\n"
    "                             tests); --arch llama alone starts from llama3.2-1b\n"
    "  --kv-heads N --ffn F       Llama: key/value heads (grouped-query attention; default: the preset's,\n"
    "                             or --heads when --heads is given), SwiGLU's hidden size (default: the\n"
    "                             preset's, or 8C/3 rounded up to 256 when --channels is given)\n"
    "  --rope-theta X --norm-eps E --tie-embeddings 0|1\n"
    "                             Llama: RoPE base, RMSNorm epsilon, head tied to wte (1) or its own (0)\n"
    "  --rope-scaling none|FACTOR[,LOW,HIGH,ORIG]\n"
    "                             Llama 3.1's RoPE frequency scaling (HF's rope_type llama3; LOW 1, HIGH 4,\n"
    "                             ORIG 8192 by default): the presets keep their own, a custom shape has none\n"
    "  --seq-len T                tokens per sequence (default: the model's maxT; at most maxT)\n"
    "  --init-from FILE           start from an llm.c model file (version 3 fp32 or 5 bf16); the shape\n"
    "                             comes from the file\n"
    "  --save-model FILE          write the trained model (llm.c version 3, fp32 master weights) at the\n"
    "                             end; with --steps 0 it writes the initialisation and needs no data\n"
    "  --init-from-hf DIR         start from a Hugging Face Llama checkpoint: DIR/config.json gives the\n"
    "                             shape (no --model or shape flag with it), DIR/model.safetensors or the\n"
    "                             shards of DIR/model.safetensors.index.json the weights (F32, BF16 or F16;\n"
    "                             q/k/v_proj become qkvw, gate/up_proj fcw, the vocabulary is padded with\n"
    "                             zero rows; README: what is mapped how)\n"
    "  --save-hf DIR              write the trained Llama at the end as a Hugging Face checkpoint\n"
    "                             (config.json and model.safetensors, sharded above 5 GB with the index;\n"
    "                             fp32 master weights, the padding rows dropped) that transformers loads\n"
    "  --save-hf-dtype fp32|bf16  --save-hf's element type (default fp32; bf16 rounds to nearest even)\n"
    "  --seed N                   initialisation, shuffling and sampling seed (default 1337)\n"
    "\n"
    "data (llm.c token shards: 256 x int32 header, magic 20240520, version 1, count; uint16 tokens):\n"
    "  --train PATTERN            training shards (a glob; matches are concatenated in sorted order)\n"
    "  --val PATTERN              validation shards (read with --val-every; each needs the other)\n"
    "  --tokenizer FILE           llm.c tokenizer for printing samples (default: tokenizer.bin next to\n"
    "                             the first training shard, if present; a warning when its vocabulary is\n"
    "                             not the model's)\n"
    "  --shuffle                  permute the sequences of each epoch with a seeded permutation\n"
    "  Global sequence i of step s (0 <= i < G, G = batch-tokens / T) is the window of T+1 tokens at\n"
    "  ((s*G + i) mod W) * T of the concatenated shards, W = (tokens - 1) / T; every layout trains on\n"
    "  exactly these sequences.\n"
    "\n"
    "batch and schedule:\n"
    "  --micro-batch B            sequences per forward/backward (default 4)\n"
    "  --batch-tokens N           tokens per optimizer step, over every data-parallel rank (default\n"
    "                             DP*B*T: one micro-batch each); each DP rank accumulates N / (DP*B*T)\n"
    "                             micro-batches, so N must be a multiple of DP*B*T\n"
    "  --steps N                  optimizer steps (default 20)\n"
    "  --lr F                     peak learning rate (default 3e-4)\n"
    "  --warmup N                 linear warm-up steps: lr*(s+1)/N for s < N (default 0)\n"
    "  --schedule cosine|linear|constant\n"
    "                             decay after warm-up from lr towards lr*lr-min-frac, reached one step\n"
    "                             after the last (llm.c's formula)\n"
    "                             (default cosine)\n"
    "  --lr-min-frac F            final learning rate as a fraction of --lr (default 0.0)\n"
    "  --beta1 F --beta2 F --eps F\n"
    "                             AdamW moments (defaults 0.9, 0.95, 1e-8), bias-corrected\n"
    "  --weight-decay F           decoupled weight decay on matrices and embeddings only (default 0.0)\n"
    "  --clip F                   global-norm gradient clipping; 0 disables (default 1.0)\n"
    "\n"
    "evaluation and output:\n"
    "  --val-every N              validation loss every N steps and at the end; 0 disables (default 0)\n"
    "  --val-steps N              micro-batches per validation (default 10; with --val-every)\n"
    "  --sample-every N           print a sample every N steps and at the end; 0 disables (default 0)\n"
    "  --sample-tokens N          tokens per sample (default 64, at most T - 1; this and the next two\n"
    "                             refine --sample-every and need it)\n"
    "  --temperature F            sampling temperature (default 1.0)\n"
    "  --top-k N                  sample among the N most likely tokens; 0 = all (default 0)\n"
    "  --log FILE                 JSON Lines: {\"step\",\"tokens\",\"loss\",\"lr\",\"grad_norm\",\"ms\",\"wall_ms\",...}\n"
    "                             per step (tokens: trained so far), {\"step\",\"val_loss\"} per validation,\n"
    "                             {\"step\",\"ckpt\",...} per checkpoint, {\"memory_peak\":{...},\"rank\"} per rank at\n"
    "                             the end (see README); scripts/plot.py draws\n"
    "                             them; a resumed run keeps the records up to its checkpoint's step and appends\n"
    "  --dump DIR                 testing aid: write step 0's global batch tokens, first micro-batch\n"
    "                             logits, initial weights and accumulated gradients (raw int32/fp32) into DIR\n"
    "\n"
    "parallelism:\n"
    "  --nproc N                  fork N local ranks running this command (or launch with torchrun-style\n"
    "                             RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT variables, or under srun); passes\n"
    "                             SIGUSR1 on, turns SIGINT/SIGTERM into SIGTERM for every rank and kills\n"
    "                             what is left after LLM4D_KILL_GRACE seconds (default 30); when a rank\n"
    "                             fails, names the rank that stopped answering and stops the others\n"
    "  --dp N                     data parallelism: implied, the ranks over TP x CP x PP; given, it must\n"
    "                             be that (the planner's and Megatron's way of saying the layout)\n"
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
    "  --pp-schedule S            1f1b (default at --pp-virtual 1), interleaved (needs --pp-virtual V > 1;\n"
    "                             the default there), zb-h1 (1F1B with each backward split into input\n"
    "                             (B) and weight (W) halves, the Ws filling the drain: bubble\n"
    "                             (N-1)(F+B-W) against (N-1)(F+B+W)), zb-v (two chunks per stage in a V:\n"
    "                             stage s holds chunks s and 2N-1-s, so the first\n"
    "                             stage holds the embedding and the head; B and W apart; bubble about N-1\n"
    "                             chunk forwards a step; implies --pp-virtual 2, takes no other; needs\n"
    "                             --layers >= 2N); the same final model, bitwise, whatever the schedule;\n"
    "                             all but 1f1b need --pp 2+\n"
    "  --pp-times auto|unit|F,B,W zb-v: the relative times of one forward, input- and weight-gradient pass\n"
    "                             its action lists are built for. auto (the default): the times the first\n"
    "                             step measures (the mean over every rank's passes; that step runs the unit\n"
    "                             lists), lists rebuilt for them from the next; unit: the paper's lists for\n"
    "                             equal times (1,1,1); F,B,W: these (a run's --pp-schedule-dump measures\n"
    "                             them). Where F, B and W differ, lists built for the real times keep the\n"
    "                             stages busy that unit-time lists leave waiting; the model is the same\n"
    "                             either way\n"
    "  --pp-trace DIR             testing aid: each stage appends its per-step schedule to DIR/stageS.txt\n"
    "  --pp-schedule-dump FILE    write the schedule's per-rank action list with the measured start and end\n"
    "                             (ms) of each action of the run's last step, tab-separated (schedule.h;\n"
    "                             scripts/plot.py --schedule FILE draws it); ./train schedule takes it too\n"
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
    "                             node, hier across nodes (ring where nodes hold unequal numbers of ranks);\n"
    "                             on --device cuda auto is fanin (ring and hier move host memory only);\n"
    "                             connections open on first use, only for the pairs an operation uses\n"
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
    "  --max-restarts R           with --nproc and --ckpt-dir: when a rank dies, relaunch the job from the\n"
    "                             newest complete checkpoint, up to R times (default 0)\n"
    "  --skip-spikes F            skip (and count) the update of a step whose loss or gradient norm is not\n"
    "                             finite or above F times its mean over the last 20 applied steps (0: off)\n"
    "  --straggler F              report a rank whose busy time (compute, and time it did not run, e.g.\n"
    "                             stopped) is above the median by more than the share F (default 0.5) ...\n"
    "  --straggler-steps N        ... for N steps in a row (default 5)\n"
    "  SIGTERM or SIGUSR1 (Slurm's warning before the time limit) makes every rank stop at the next step\n"
    "  boundary, write a checkpoint (with --ckpt-dir), save the model (with --save-model, --save-hf) and\n"
    "  exit 0; SIGINT (Ctrl-C) does the same and exits 130. A run whose last checkpoint could not be\n"
    "  written exits 1, saying so in its last line. A --sample-every sample under way stops at its next\n"
    "  token; a run stopping on a signal skips its last sample. ./train sample and eval stop between\n"
    "  tokens or batches instead, saying how far they got, and exit 128 + the signal (143, 130). While\n"
    "  the job forms (reaching rank 0, waiting for the ranks to join), SIGINT and SIGTERM stop a rank at\n"
    "  once, in one line, with 128 + the signal.\n"
    "\n"
    "execution:\n"
    "  --device cpu|cuda          default cuda when a GPU is present, else cpu\n"
    "  --dtype fp32|bf16          weights and activations (default bf16 on cuda, fp32 on cpu); bf16\n"
    "                             stores bf16, computes in fp32 and updates fp32 master weights\n"
    "  --threads N                CPU threads per rank (default: the machine's cores shared among its ranks)\n"
    "  --recompute none|selective|full\n"
    "                             activation recompute (default none): selective keeps all but the LayerNorm\n"
    "                             outputs and GELU's output (Llama: the RMSNorm outputs and SwiGLU's output),\n"
    "                             which the backward rebuilds; full keeps only each\n"
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
    "  numbers                    decimal (no hex, octal, inf or nan); counts take K, M, G = 2^10, 2^20, 2^30\n"
    "                             (--batch-tokens 4K is 4096 tokens)\n"
    "  llm.c's short flags        -i -j -e -b -t -d -x -k -l -u -q -c -v -m -s -g -z -n -nk -y -r mean their llm4d\n"
    "                             flags (the README's table); the others stop with one line saying what to use\n"
    "  -h, --help                 this text\n";

// ---------------------------------------------------------------------------------------------
// flag parsing: every value is checked whole (common.c's one number parser), and every error names the flag

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

ShapeFlags options_shape_flags(const Options *o, int V) {
    return (ShapeFlags){ .arch = o->arch, .L = o->layers, .C = o->channels, .NH = o->heads, .NKV = o->kv_heads, .F = o->ffn,
                         .V = V, .maxT = o->max_seq_len, .tie = o->tie, .rope_theta = o->rope_theta, .norm_eps = o->norm_eps,
                         .rope_scaling = o->rope_scaling };
}

int options_any_shape_flag(const Options *o) {
    return o->layers || o->channels || o->heads || o->vocab || o->max_seq_len || o->kv_heads || o->ffn || o->tie >= 0 ||
           o->rope_theta || o->norm_eps || o->rope_scaling;
}

// --init-from-hf takes the whole shape from config.json: any shape flag beside it is refused, by name.
static void check_init_from_hf(const Options *o) {
    if (!o->init_from_hf) return;
    const struct { int given; const char *flag; } f[] = {
        { o->preset != NULL, "--model" }, { o->arch >= 0, "--arch" }, { o->layers, "--layers" }, { o->channels, "--channels" },
        { o->heads, "--heads" }, { o->kv_heads, "--kv-heads" }, { o->ffn, "--ffn" }, { o->vocab, "--vocab" },
        { o->max_seq_len, "--max-seq-len" }, { o->rope_theta != 0, "--rope-theta" }, { o->norm_eps != 0, "--norm-eps" }, { o->rope_scaling != NULL, "--rope-scaling" },
        { o->tie >= 0, "--tie-embeddings" }, { o->init_from != NULL, "--init-from" },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given) die("--init-from-hf takes the shape from %s/config.json: drop %s", o->init_from_hf, f[i].flag);
}

GPT2Config options_shape(const Options *o) {
    if (o->init_from_hf) {
        check_init_from_hf(o);
        HFConfig c;
        hf_config_read(o->init_from_hf, &c);
        return hf_model_config(&c, o->init_from_hf);
    }
    int shape_flags = options_any_shape_flag(o);
    if (!o->init_from) {
        ShapeFlags f = options_shape_flags(o, o->vocab);
        return model_shape(o->preset, &f, o->seq_len);
    }
    if (o->arch == ARCH_LLAMA) die("--init-from reads llm.c model files, which are GPT-2 only: a Llama starts from a checkpoint (--resume) or --init-from-hf");
    if (shape_flags || o->preset) die("--init-from takes the shape from %s; drop --model and the shape flags", o->init_from);
    GPT2Config cfg;
    gpt2_file_shape(o->init_from, &cfg);
    return cfg;
}

// The batch arithmetic, bounded so that no count overflows: accum micro-batches of B x T tokens on
// each of the data-parallel ranks, G sequences per step, global sequence indices below 2^62.
// (MAX_MICRO_TOKENS, MAX_ACCUM, MAX_STEP_TOKENS: layout.h, which the planner checks too)
#define SAMPLE_EVAL_MAX_T 1024 // ./train sample and eval without --seq-len

int check_layout(const Options *o, const GPT2Config *cfg, int nranks, BatchShape *b, char *err, size_t cap) {
    if (layout_error(o->tp, o->cp, o->pp, nranks, err, cap)) return -1;
    int dp = nranks / (o->tp * o->cp * o->pp);
    if (o->dp && o->dp != dp)
        return snprintf(err, cap, "--dp %d: the %d ranks over --tp %d x --cp %d x --pp %d give data parallel %d", o->dp, nranks, o->tp,
                        o->cp, o->pp, dp), -1;
    if (cfg->NH % o->tp) return snprintf(err, cap, "--tp %d does not divide the model's %d heads", o->tp, cfg->NH), -1;
    if (o->save_hf && cfg->arch != ARCH_LLAMA)
        return snprintf(err, cap, "--save-hf writes Hugging Face Llama checkpoints: this model is GPT-2 (--save-model writes "
                        "its llm.c file)"), -1;
    if (cfg->arch == ARCH_LLAMA) {
        if (o->save_model)
            return snprintf(err, cap, "--save-model writes llm.c model files, which are GPT-2 only: a Llama keeps its weights in "
                            "checkpoints (--ckpt-dir) or --save-hf"), -1;
        if (cfg->NKV >= o->tp ? cfg->NKV % o->tp : o->tp % cfg->NKV)
            return snprintf(err, cap, "--tp %d and the model's %d kv heads: one must divide the other", o->tp, cfg->NKV), -1;
        if (cfg->F % o->tp) return snprintf(err, cap, "--tp %d does not divide the model's SwiGLU size %d (--ffn)", o->tp, cfg->F), -1;
    }
    if (o->sp && o->tp == 1) return snprintf(err, cap, "--sp needs tensor parallelism (--tp 2 or more)"), -1;
    // sample and eval default to at most SAMPLE_EVAL_MAX_T (GPT-2's maxT): a Llama's 131072 positions
    // would make every sampled token a forward over all of them, and eval need shards that long
    int T = o->seq_len ? o->seq_len : o->mode != MODE_TRAIN && cfg->maxT > SAMPLE_EVAL_MAX_T ? SAMPLE_EVAL_MAX_T : cfg->maxT;
    *b = (BatchShape){ .T = T, .B = o->micro_batch, .dp = nranks / (o->tp * o->cp * o->pp) };
    if (b->T > cfg->maxT)
        return snprintf(err, cap, "--seq-len %d is above the model's maximum sequence length %d", b->T, cfg->maxT), -1;
    if (context_split_error(o, b->T, err, cap)) return -1; // the model's default T too
    long long micro = (long long)b->B * b->T;
    if (micro > MAX_MICRO_TOKENS)
        return snprintf(err, cap, "--micro-batch %d x --seq-len %d = %lld tokens per micro-batch, more than the %lld allowed",
                        b->B, b->T, micro, MAX_MICRO_TOKENS), -1;
    long long micro_tokens = micro * b->dp; // one micro-batch on every data-parallel rank
    b->batch_tokens = o->batch_tokens ? o->batch_tokens : micro_tokens;
    if (b->batch_tokens % micro_tokens != 0) {
        if (b->dp > 1)
            return snprintf(err, cap, "--batch-tokens %lld is not a multiple of data-parallel ranks x --micro-batch x --seq-len "
                            "= %d x %d x %d = %lld", b->batch_tokens, b->dp, b->B, b->T, micro_tokens), -1;
        return snprintf(err, cap, "--batch-tokens %lld is not a multiple of --micro-batch x --seq-len = %d x %d = %lld",
                        b->batch_tokens, b->B, b->T, micro_tokens), -1;
    }
    long long accum = b->batch_tokens / micro_tokens;
    if (accum > MAX_ACCUM || accum * micro > MAX_STEP_TOKENS)
        return snprintf(err, cap, "--batch-tokens %lld means %lld micro-batches of %d x %d per data-parallel rank and step, "
                        "more than the %lld micro-batches (and %lld tokens) a step may accumulate", b->batch_tokens, accum,
                        b->B, b->T, MAX_ACCUM, MAX_STEP_TOKENS), -1;
    b->accum = (int)accum;
    b->G = b->batch_tokens / b->T;
    if (b->G > (1LL << 62) / ((long long)o->steps + 1))
        return snprintf(err, cap, "--batch-tokens %lld x --steps %d: %lld sequences per step overflow the global sequence "
                        "count", b->batch_tokens, o->steps, b->G), -1;
    int P = o->pp, V = P > 1 ? o->pp_virtual : 1;
    if (P > 1 && o->pp_schedule == SCHED_ZBV) { // parse_options made V 2: say so in the schedule's words
        if (o->pp_layers) return snprintf(err, cap, "--pp-layers cannot be combined with --pp-schedule zb-v (two equal chunks per stage)"), -1;
        if (2 * P > cfg->L)
            return snprintf(err, cap, "--pp-schedule zb-v places two chunks per stage: --pp %d needs %d blocks, the model has %d",
                            P, 2 * P, cfg->L), -1;
    }
    int *first = xmalloc(sizeof(int) * P * V), *count = xmalloc(sizeof(int) * P * V);
    int bad = layout_split_layers(cfg->L, P, V, o->pp_layers, first, count, err, cap);
    free(first);
    free(count);
    if (bad) return -1;
    if (V > 1 && o->pp_schedule != SCHED_ZBV && b->accum % P)
        return snprintf(err, cap, "--pp-virtual %d: the %d micro-batch(es) per step must be a multiple of --pp %d for the "
                        "interleaved schedule", V, b->accum, P), -1;
    return 0;
}

// The flags of training that mean nothing to sample and eval (a run of no steps from --model).
static int is_training_only(const char *f) {
    static const char *const only[] = { "--steps", "--init-from", "--save-model", "--init-from-hf", "--save-hf",
                                        "--save-hf-dtype", "--train", "--ckpt-dir", "--ckpt-every",
                                        "--keep", "--max-restarts", "--log", "--dump", "--layers", "--channels", "--heads",
                                        "--vocab", "--max-seq-len", "--arch", "--kv-heads", "--ffn", "--rope-theta", "--rope-scaling",
                                        "--norm-eps", "--tie-embeddings", "--val-every", "--sample-every", "--val-steps",
                                        "--sample-tokens", "--batch-tokens", "--lr", "--warmup", "--schedule", "--lr-min-frac",
                                        "--beta1", "--beta2", "--eps", "--weight-decay", "--clip", "--skip-spikes", "--straggler",
                                        "--straggler-steps", "--bucket-mb", "--shuffle", "--allow-data-change", "--resume", NULL };
    for (int i = 0; only[i]; i++)
        if (!strcmp(f, only[i])) return 1;
    return 0;
}

// One flag that takes a value, argv[*i] (its value argv[*i + 1]; *i moves past it): a flat table.
static void parse_valued_flag(Options *o, int argc, char **argv, int *ip) {
    int i = *ip;
    const char *f = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(name) (!strcmp(f, name) && (v ? (i++, 1) : (die("%s needs a value", name), 0)))
    static const char *const paths[] = { "--train", "--val", "--tokenizer", "--log", "--dump", "--init-from", "--save-model",
                                         "--ckpt-dir", "--pp-trace", "--pp-schedule-dump", "--init-from-hf", "--save-hf" };
    int path = o->mode != MODE_TRAIN && !strcmp(f, "--model"); // (training's --model names a preset)
    for (size_t k = 0; k < sizeof paths / sizeof *paths; k++) path |= !strcmp(f, paths[k]);
    if (path && v && !*v) die("%s: the path is empty", f);
    if (o->mode != MODE_TRAIN && IS("--model")) o->model_path = v;
    else if (o->mode == MODE_SAMPLE && IS("--prompt")) o->prompt = v;
    else if (o->mode == MODE_SAMPLE && IS("--tokens")) o->sample_tokens = (int)parse_int(f, v, 1, 1 << 20);
    else if (o->mode == MODE_EVAL && IS("--batches")) o->val_steps = (int)parse_int(f, v, 1, INT32_MAX);
    else if (IS("--model")) o->preset = v;
    else if (IS("--layers")) o->layers = (int)parse_int(f, v, 1, 4096);
    else if (IS("--channels")) o->channels = (int)parse_int(f, v, 1, 65536);
    else if (IS("--heads")) o->heads = (int)parse_int(f, v, 1, 65536);
    else if (IS("--vocab")) o->vocab = (int)parse_int(f, v, 1, 1048448); // Vp (a multiple of 128) <= 2^20
    else if (IS("--max-seq-len")) o->max_seq_len = (int)parse_int(f, v, 1, 1048576);
    else if (IS("--arch")) {
        if (!strcmp(v, "gpt2")) o->arch = ARCH_GPT2;
        else if (!strcmp(v, "llama")) o->arch = ARCH_LLAMA;
        else die("--arch must be gpt2 or llama, got '%s'", v);
    } else if (IS("--kv-heads")) o->kv_heads = (int)parse_int(f, v, 1, 65536);
    else if (IS("--ffn")) o->ffn = (int)parse_int(f, v, 1, 1 << 20);
    else if (IS("--rope-theta")) o->rope_theta = parse_float(f, v, 1.0000001, 1e12);
    else if (IS("--norm-eps")) o->norm_eps = parse_float(f, v, 1e-12, 1);
    else if (IS("--rope-scaling")) o->rope_scaling = v;
    else if (IS("--tie-embeddings")) o->tie = (int)parse_int(f, v, 0, 1);
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
    else if (IS("--temperature")) {
        if (strtod(v, NULL) == 0 && strspn(v, "0.+-eE") == strlen(v) && *v)
            die("--temperature 0: the sampler divides by it; --top-k 1 samples greedily (the most likely token each time)");
        o->temperature = parse_float(f, v, 1e-6, 1e6);
    }
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
    else if (IS("--dp")) o->dp = (int)parse_int(f, v, 1, 4096);
    else if (!strcmp(f, "--sp")) o->sp = 1;
    else if (IS("--pp")) o->pp = (int)parse_int(f, v, 1, 4096);
    else if (IS("--pp-layers")) o->pp_layers = v;
    else if (IS("--pp-virtual")) o->pp_virtual = (int)parse_int(f, v, 1, MAX_CHUNKS);
    else if (IS("--pp-schedule")) {
        o->pp_schedule = schedule_parse(v);
        if (o->pp_schedule < 0) die("--pp-schedule must be 1f1b, interleaved, zb-h1 or zb-v, got '%s'", v);
    }
    else if (IS("--pp-trace")) o->pp_trace = v;
    else if (IS("--pp-schedule-dump")) o->pp_schedule_dump = v;
    else if (IS("--pp-times")) {
        o->pp_times_flag = v;
        if (!strcmp(v, "auto")) o->pp_times_auto = 1, memset(o->pp_times, 0, sizeof o->pp_times);
        else schedule_parse_times(f, v, o->pp_times), o->pp_times_auto = 0;
    }
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
    else if (IS("--init-from-hf")) o->init_from_hf = v;
    else if (IS("--save-hf")) o->save_hf = v;
    else if (IS("--save-hf-dtype")) {
        if (!strcmp(v, "fp32")) o->save_hf_dtype = DT_F32;
        else if (!strcmp(v, "bf16")) o->save_hf_dtype = DT_BF16;
        else die("--save-hf-dtype must be fp32 or bf16, got '%s'", v);
    }
    else if (strchr(f, '=')) die("%s: flags take their value as the next argument (--flag VALUE, not --flag=VALUE; see --help)", f);
    else {
        char hint[80];
        const char *usage = o->mode == MODE_SAMPLE ? SAMPLE_USAGE : o->mode == MODE_EVAL ? EVAL_USAGE : USAGE; // (its --help)
        die("unknown flag %s%s (see --help)", f, flag_hint(f, usage, hint, sizeof hint));
    }
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
    if (o->mode == MODE_TRAIN && o->val_every > 0 && !o->val) die("--val-every %d needs --val PATTERN (the validation shards)", o->val_every);
    if (o->mode == MODE_TRAIN && o->val && o->val_every == 0)
        die("--val %s is read only with --val-every N (validation every N steps and at the end)", o->val);
    if (o->pp_virtual > 1 && o->pp == 1)
        die("--pp-virtual %d interleaves pipeline stages: it needs --pp 2 or more", o->pp_virtual);
    if (o->pp_schedule >= 0 && o->pp_schedule != SCHED_1F1B && o->pp == 1)
        die("--pp-schedule %s orders pipeline stages: it needs --pp 2 or more", SCHEDULE_NAMES[o->pp_schedule]);
    if (o->init_from && o->resume)
        die("--init-from and --resume both give the starting weights: drop one (--resume continues a checkpoint, "
            "--init-from starts from a model file)");
    if (o->init_from_hf && o->resume && o->mode == MODE_TRAIN)
        die("--init-from-hf and --resume both give the starting weights: drop one (--resume continues a checkpoint, "
            "--init-from-hf starts from a Hugging Face checkpoint)");
    if (o->init_from_hf && o->max_restarts)
        die("--max-restarts relaunches with --resume, which takes the shape from the flags: give --init-from-hf's shape "
            "as flags for a run that restarts (or run it without --max-restarts)");
    check_init_from_hf(o);
    char err[256];
    if (o->seq_len && context_split_error(o, o->seq_len, err, sizeof err)) die("%s", err); // before any rank starts
}

// llm.c's short flags (train_gpt2.cu's usage text), for its users' habits: each one that means the same
// as an llm4d flag becomes it; each one that has none is refused with one line naming what to use.
typedef struct {
    const char *flag, *as; // as: the llm4d flag; NULL: no equivalent, why says what to use instead
    const char *why;
} LlmcFlag;
static const LlmcFlag LLMC_FLAGS[] = {
    { "-i", "--train", NULL },        { "-j", "--val", NULL },         { "-b", "--micro-batch", NULL },
    { "-t", "--seq-len", NULL },      { "-d", "--batch-tokens", NULL }, { "-x", "--steps", NULL },
    { "-k", "--schedule", NULL },     { "-l", "--lr", NULL },          { "-u", "--warmup", NULL },
    { "-q", "--lr-min-frac", NULL },  { "-c", "--weight-decay", NULL }, { "-v", "--val-every", NULL },
    { "-m", "--val-steps", NULL },    { "-s", "--sample-every", NULL }, { "-g", "--sample-tokens", NULL },
    { "-z", "--zero", NULL },         { "-n", "--ckpt-every", NULL },  { "-nk", "--keep", NULL },
    { "-e", "--init-from", NULL }, // or --model dN (below)
    { "-y", "--resume", NULL },    // 1: --resume; 0: the default
    { "-r", "--recompute", NULL }, // 0: none, 2 (GELU and LayerNorm): selective
    { "-o", NULL, "llm.c's output log directory: use --log FILE (the step log) and --ckpt-dir DIR (checkpoints)" },
    { "-lg", NULL, "GPU info logging: llm4d has none (the step lines and --log report memory per rank)" },
    { "-nm", NULL, "major checkpoints: llm4d has none (--keep K keeps the newest K)" },
    { "-yd", NULL, "a fresh data loader on resume: llm4d's data position always carries over (or --allow-data-change)" },
    { "-sl", NULL, "a loss z-score threshold: use --skip-spikes F (a factor over the mean of the last 20 steps)" },
    { "-sg", NULL, "a gradient-norm z-score threshold: use --skip-spikes F (a factor over the mean of the last 20 steps)" },
    { "-h", NULL, "HellaSwag evaluation: llm4d has none (./train eval --model FILE --val SHARDS gives the loss); -h alone is --help" },
    { "-a", NULL, "overfitting a single batch: llm4d has no such switch (use a one-sequence --train shard)" },
    { "-f", NULL, "the TF32 override: llm4d has no TF32 (--dtype fp32|bf16)" },
    { "-w", NULL, "the fp32 master-weight switch: llm4d always keeps fp32 master weights" },
    { "-ge", NULL, "GELU fusion: llm4d's CUDA GEMMs choose their epilogues themselves" },
    { "-pn", NULL, "the process count: use --nproc N, torchrun-style RANK/WORLD_SIZE variables or srun" },
    { "-pr", NULL, "the process rank: use --nproc N, torchrun-style RANK/WORLD_SIZE variables or srun" },
    { "-pg", NULL, "GPUs per node: llm4d takes them from the launcher (--nproc, torchrun-style variables, srun)" },
    { "-pi", NULL, "NCCL's init method: llm4d has its own bootstrap (MASTER_ADDR/MASTER_PORT, or srun)" },
    { "-pm", NULL, "NCCL's init method: llm4d has its own bootstrap (MASTER_ADDR/MASTER_PORT, or srun)" },
    { "-pf", NULL, "NCCL's file-system init: llm4d has its own bootstrap (MASTER_ADDR/MASTER_PORT, or srun)" },
    { "-ps", NULL, "NCCL's server address: use MASTER_ADDR (torchrun-style) or srun" },
    { "-pp", NULL, "NCCL's file-system path: llm4d has its own bootstrap (MASTER_ADDR/MASTER_PORT, or srun)" },
    { NULL, NULL, NULL },
};

// argv with llm.c's short flags as llm4d's (a new array: the strings are argv's or constants).
static char **translate_llmc(int argc, char **argv, int *out_argc) {
    char **out = xcalloc((size_t)argc + 1, sizeof(char *));
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        const LlmcFlag *l = LLMC_FLAGS;
        int hellaswag = !strcmp(f, "-h") && i + 1 < argc && (!strcmp(argv[i + 1], "0") || !strcmp(argv[i + 1], "1"));
        if (i == 0 || f[0] != '-' || f[1] == '-' || (!strcmp(f, "-h") && !hellaswag)) { // -h alone is --help
            out[n++] = argv[i];
            continue;
        }
        while (l->flag && strcmp(l->flag, f)) l++;
        if (!l->flag) {
            out[n++] = argv[i];
            continue;
        }
        if (!l->as) die("llm.c's %s has no llm4d equivalent: %s", f, l->why);
        if (i + 1 >= argc) die("%s (llm.c's, as %s) needs a value", f, l->as);
        const char *v = argv[++i];
        if (!strcmp(f, "-e") && v[0] == 'd' && v[1] >= '0' && v[1] <= '9') { // llm.c's dN: a random model of depth N
            out[n++] = "--model";
        } else if (!strcmp(f, "-y")) {
            if (!strcmp(v, "1")) out[n++] = "--resume";
            else if (strcmp(v, "0")) die("-y (llm.c's resume switch) must be 0 or 1, got '%s'", v);
            continue;
        } else if (!strcmp(f, "-r")) {
            out[n++] = "--recompute";
            if (!strcmp(v, "0")) v = "none";
            else if (!strcmp(v, "2")) v = "selective"; // GELU's and the LayerNorms' outputs rebuilt
            else die("-r %s (llm.c's recompute): llm4d has -r 0 (--recompute none) and -r 2 (--recompute selective: GELU "
                     "and LayerNorm), not GELU alone; or --recompute full", v);
        } else if ((!strcmp(f, "-x") || !strcmp(f, "-m")) && !strcmp(v, "-1")) {
            die("%s -1 (llm.c's %s): llm4d needs a count: %s N", f, !strcmp(f, "-x") ? "one epoch" : "the whole split", l->as);
        } else {
            out[n++] = (char *)l->as;
        }
        out[n++] = (char *)v;
    }
    *out_argc = n;
    return out;
}

// sample and eval: a run of no steps from --model: a model file (init_from), a checkpoint (a directory
// with a manifest.json) or a directory of checkpoints (its newest complete one), as --resume reads them.
static void model_source(Options *o) {
    const char *mode = o->mode == MODE_SAMPLE ? "sample" : "eval";
    if (!o->model_path) die("./train %s needs --model FILE (a --save-model file) or a checkpoint directory", mode);
    if (o->mode == MODE_EVAL && !o->val) die("./train eval needs --val PATTERN (the token shards to evaluate on)");
    if (o->mode == MODE_SAMPLE && o->val) die("./train sample: --val is eval's (./train eval --model FILE --val PATTERN)");
    o->steps = 0;
    if (o->mode == MODE_SAMPLE) o->sample_every = 1;
    else o->val_every = 1;
    struct stat st;
    if (stat(o->model_path, &st) != 0) die("--model %s: %s", o->model_path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        o->init_from = o->model_path;
        return;
    }
    size_t n = strlen(o->model_path) + 32;
    char *config = xmalloc(n);
    snprintf(config, n, "%s/config.json", o->model_path);
    int hf = stat(config, &st) == 0, ckpt = ckpt_is_complete(o->model_path);
    free(config);
    if (hf && !ckpt) { // a Hugging Face checkpoint (config.json, no manifest)
        o->init_from_hf = o->model_path;
        return;
    }
    o->resume = 1;
    o->model_step = -1;
    if (ckpt) {
        o->resume_path = o->model_path;
    } else { // a --ckpt-dir: its newest complete checkpoint (the ranks take rank 0's: trainer_init)
        int64_t step;
        if (!ckpt_newest_complete(o->model_path, &step))
            die("--model %s: a directory that is neither a checkpoint (no manifest.json) nor holds a complete one",
                o->model_path);
        char *path = xmalloc(SAFE_PATH_MAX);
        ckpt_path(o->model_path, step, path, SAFE_PATH_MAX);
        o->resume_path = o->owned_path = path; // lives for the run (options_free)
        o->model_step = step;
    }
}

void options_free(Options *o) {
    free(o->argv_store);
    free(o->owned_path);
    o->argv_store = NULL, o->owned_path = NULL;
}

void parse_options(Options *o, int argc_in, char **argv_in) {
    int argc;
    char **argv = translate_llmc(argc_in, argv_in, &argc); // lives for the run: options point into it
    *o = (Options){ .model_step = -1, .micro_batch = 4, .steps = 20, .val_steps = 10, .sample_tokens = 64, .lr = 3e-4f,
                    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .temperature = 1.0f,
                    .seed = 1337, .dtype = -1, .schedule = "cosine", .bucket_mb = 25,
                    .comm_timeout = 300, .tp = 1, .pp = 1, .pp_virtual = 0, .pp_schedule = -1, .cp = 1, .straggler = 0.5f,
                    .straggler_steps = 5, .ib_gid_index = -1, .arch = -1, .tie = -1 };
    o->argv_store = argv;
    int first = 1;
    if (argc >= 2 && !strcmp(argv[1], "sample")) o->mode = MODE_SAMPLE, first = 2;
    else if (argc >= 2 && !strcmp(argv[1], "eval")) o->mode = MODE_EVAL, first = 2;
    // flags that only refine another one (checked once all are read): the last of each given
    const char *sampling = NULL, *val_steps = NULL, *hf_dtype = NULL;
    for (int i = first; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--sample-tokens") || !strcmp(f, "--temperature") || !strcmp(f, "--top-k")) sampling = f;
        if (!strcmp(f, "--val-steps")) val_steps = f;
        if (!strcmp(f, "--save-hf-dtype")) hf_dtype = f;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(o->mode == MODE_SAMPLE ? SAMPLE_USAGE : o->mode == MODE_EVAL ? EVAL_USAGE : USAGE, stdout);
            exit(0);
        }
        if (o->mode != MODE_TRAIN && is_training_only(f)) die("./train %s: %s is a training flag (see ./train %s --help)", argv[1], f, argv[1]);
        if (o->mode == MODE_EVAL && (!strcmp(f, "--temperature") || !strcmp(f, "--top-k")))
            die("./train eval: %s is a sampling flag (eval scores the tokens of --val; see ./train eval --help)", f);
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
    if (o->mode == MODE_TRAIN && sampling && !o->sample_every)
        die("%s shapes the samples --sample-every N prints: it needs --sample-every (or ./train sample)", sampling);
    if (o->mode == MODE_TRAIN && val_steps && !o->val_every)
        die("--val-steps sets each validation's micro-batches: it needs --val PATTERN and --val-every N");
    if (hf_dtype && !o->save_hf) die("--save-hf-dtype sets --save-hf's element type: it needs --save-hf DIR");
    if (o->mode != MODE_TRAIN) model_source(o);
    if (o->pp_schedule == SCHED_ZBV && o->pp > 1) { // two chunks per stage in a V (schedule.h)
        if (o->pp_virtual && o->pp_virtual != 2)
            die("--pp-schedule zb-v runs two chunks per stage (a V): --pp-virtual %d does not apply", o->pp_virtual);
        o->pp_virtual = 2;
    }
    if (o->pp_schedule == SCHED_INTERLEAVED && o->pp > 1 && o->pp_virtual < 2) // (it would run 1F1B's order)
        die("--pp-schedule interleaved needs --pp-virtual V of 2 or more chunks per stage%s", o->pp_virtual ? "" : " (default 1)");
    if (!o->pp_virtual) o->pp_virtual = 1; // (0 until here: not given)
    schedule_check_times_kind(o->pp_schedule, o->pp_times_flag);
    if (o->pp_schedule == SCHED_ZBV && !o->pp_times_flag) o->pp_times_auto = 1; // (the lists for this machine's passes)
    check_options(o);
}

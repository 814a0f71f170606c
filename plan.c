// plan.c: `./train plan`, the layout planner. Given a model, a cluster and a batch, it lists every way
// of splitting the GPUs into tensor (TP), context (CP), pipeline (PP) and data (DP) parallel groups, and
// for each one the bytes per GPU, whether they fit, the pipeline bubble, the communication and the
// compute time of one optimizer step, best first. It predicts from shapes alone; nothing is allocated or
// run.
//
// The estimate is the seed's model of a mixed-precision Megatron-style run (the README walks through
// it). Symbols: N parameters, L layers, C channels, H heads, T tokens per sequence, G GPUs, batch =
// tokens per optimizer step, M micro-batches per data-parallel replica and step, e = 2 bytes per
// activation element (bf16; 4 with --dtype fp32).
//
//   parameters of one GPU's shard    P = N / (TP·PP) (context-parallel ranks hold the same weights)
//   bytes per parameter (bf16)       weights 2, gradients 2, optimizer 12 (fp32 master 4 + Adam m, v 8);
//                                    fp32: 4, 4, 8 (the weights are the master copy)
//   ZeRO                             1 divides the optimizer's bytes by DP·CP (the ranks holding the
//                                    same weights), 2 also the gradients', 3 also the weights'
//   layers per stage                 Ls = L / PP (fractional: an estimate, not a split)
//   tokens per replica and step      R = batch / DP;  per micro-batch  m = R / M (a replica is TP·CP·PP
//                                    GPUs; each GPU of a CP group holds m / CP of the micro-batch's tokens)
//   activations per token per layer  a = 17·e·C (34·C in bf16, Korthikanti et al. 2022, with sequence
//                                    parallelism, so all of it divides by TP); flash attention keeps
//                                    no T² term; --attention full adds the probabilities, 2.5·e·H·T
//                                    --recompute selective: a = 11·e·C (22·C in bf16): the two LayerNorm
//                                    outputs (2·e·C) and one of GELU's input and output (4·e·C; llm4d
//                                    rebuilds the output) are recomputed, and with --attention full the
//                                    probabilities too
//   activations, upper bound         R · Ls · a / (TP·CP)             the whole replica batch resident
//   activations, 1F1B                k · m · Ls · a / (TP·CP)         k = min(PP, M) micro-batches in
//                                                                     flight on the first stage
//   --recompute full (keep each block's input, e·C per token, rerun the block's forward before its
//   backward; one block's activations a live during it):
//     upper bound                    R · (Ls·e·C + a) / (TP·CP)       (Ls·2·C + 34·C)/(TP·CP) in bf16,
//                                                                     all M micro-batches resident
//     1F1B                           (k · m · Ls · e·C + m · a) / (TP·CP)
//   total                            weights + gradients + optimizer + activations (1F1B); fits when
//                                    total <= --gpu-mem (nothing reserved for buffers or fragmentation)
//   bubble                           (PP − 1) / (M + PP − 1); interleaved (PP − 1) / (V·M + PP − 1);
//                                    --pp-schedule zb-h1 (PP − 1) / (3M + PP − 1), zb-v (PP − 1) / (6M + PP − 1)
//                                    (V = --pp-virtual; only where PP·V <= L and M is a multiple of PP)
//   DP gradient all-reduce           f·(D − 1)/D · g·P / bw over the D = DP·CP ranks holding the same
//                                    weights, g = gradient bytes per parameter; f = 2 (a ring all-reduce,
//                                    or ZeRO-1/2's reduce-scatter of the gradients plus all-gather of the
//                                    weights), 3 with ZeRO-3 (the weights are gathered again for the
//                                    backward); bw = --intra-bw when each such group sits in one node,
//                                    else --inter-bw (per GPU)
//   TP communication                 n · Ls · M all-reduces of (m/CP)·C·e bytes per step, each
//                                    2·(TP − 1)/TP · bytes / --intra-bw (Megatron: 2 in the forward and
//                                    2 in the backward per layer, n = 4; 6 with --recompute full, whose
//                                    rerun forward repeats its 2; sequence parallelism moves the same
//                                    bytes as all-gathers and reduce-scatters)
//   CP communication                 llm4d's ring, per layer and micro-batch: each GPU's K/V block of
//                                    kv = 2·(m/CP)·(C/TP)·e bytes goes CP − 1 steps round the ring in the
//                                    forward and again in the backward (once more with --recompute full),
//                                    and the backward's fp32 dK/dV accumulators, 2·(m/CP)·(C/TP)·4 bytes,
//                                    travel CP steps (back to their owner):
//                                    Ls · M · (f·(CP − 1)·kv + CP·2·(m/CP)·(C/TP)·4) / bw, f = 2 (3 with
//                                    --recompute full); bw = --intra-bw when each CP group (CP ranks TP
//                                    apart) sits in one node, else --inter-bw; 0 for CP = 1
//   compute                          c · N · batch / G / --flops, c = 6 (forward 2, backward 4), 8 with
//                                    --recompute full (one more forward)
//   step (what the order uses)       (compute + TP + CP exposed) / (1 − bubble) + DP exposed, with the
//                                    overlap the trainer achieves: TP's all-reduces block the step (none
//                                    hidden); the CP ring hides behind the resident block's attention,
//                                    CP exposed = max(0, CP − compute · T / (12·C + T)) (attention's share
//                                    of a layer's FLOPs: causal 2·T·C against the matmuls' 24·C² per
//                                    token); the DP reduction hides behind one micro-batch's compute
//                                    (the last backward's buckets, ZeRO-1/2's gather in the next forward),
//                                    DP exposed = max(0, DP − compute / M); the bubble is the interleaved
//                                    one with --exact --interleaved where it applies
//
// The Llama family (--arch llama, a Llama --model; NKV kv heads, hs = C/H, F SwiGLU's size, r = NKV/H):
//   N                                exact from the shape (gpt2_param_layout: no biases, no position
//                                    table, an untied head its own Vp·C); with TP > NKV each kv head's
//                                    K and V weights are replicated on TP/NKV ranks, which P counts
//   activations per token per layer  Korthikanti's inventory for the Llama block (no dropout):
//                                    a = e·(6·C + 2·r·C + 3·F): the two RMSNorm inputs and outputs (4·C),
//                                    Q and GQA's narrower K and V (C + 2·r·C), the attention output (C),
//                                    SwiGLU's gate, up and SiLU product (3·F); --attention full adds
//                                    the probabilities e·H·T; --recompute selective rebuilds the two
//                                    RMSNorm outputs and the SiLU product: a = e·(4·C + 2·r·C + 2·F)
//   TP, PP, DP                       as above (the blocks' inputs and outputs are C wide as in GPT-2)
//   CP                               the ring passes each rank's kv heads only: C/TP above becomes
//                                    max(NKV/TP, 1)·hs, the K/V traffic cut by H/NKV
//   compute                          c/6 · f · batch / G / --flops, f the FLOPs per token of a forward
//                                    and backward, 3 × the forward's: per block the matmuls
//                                    2·C·((H + 2·NKV)·hs + H·hs + 3·F) and causal attention 2·T·C, and
//                                    the head 2·C·Vp: f = 6·(the matmuls' weights) + 6·L·C·T
//   CP exposed                       the attention share is 2·T·C / (2·T·C + the block's matmuls)
//   cannot run                       also when neither of TP and NKV divides the other, or TP does
//                                    not divide F
//
// Not counted: the embedding and logits activations, the pipeline's point-to-point hand-offs,
// communication buffers, and any overlap of communication with compute (the CP ring overlaps its
// transfers with attention).
//
// `./train plan comm` (its section just above plan_main) takes one layout and models its step's
// communication per traffic class (TP, PP hand-offs included, DP, CP) under each collective algorithm
// (ring, fan-in, hierarchical) from link bandwidth and latency, with the connections, staging and
// incast each needs.
//
// --exact replaces the memory model by llm4d's own buffers: for every stage of a layout it builds that
// rank (tensor-, context- and data-parallel rank 0, which hold the most) with the trainer's own code
// (layout_build_model and layout_build_state in pipeline.c) on a dry backend whose account only counts
// (mem.h), and reports the fullest stage: weights, gradients (fp32), optimizer state, activations (the
// activation sets the schedule's action lists hold, of the rank's T/CP positions: 1F1B's, with
// --interleaved or --pp-schedule zb-v a pool of chunk sets, with zb-h1 its sets; the head's buffers; the
// split backward's weight-gradient stashes; the CP ring's accumulators), recompute scratch, comm buffers (ZeRO buckets,
// gathered units and the CP ring's blocks; on --device cpu every communicator's algorithm staging under
// --algo, exact_comm_bytes), other (checkpoint staging with --ckpt, on --device cpu). Fits and the order
// use its total.
//
// Layouts: every (TP, CP, PP, DP) with TP·CP·PP·DP = G, TP <= --max-tp and every TP group (TP consecutive
// ranks) inside one node (nodes of --gpus-per-node consecutive ranks), in llm4d's rank order
// rank = ((dp·PP + pp)·CP + cp)·TP + tp.
// A layout llm4d cannot run is listed with the reason: TP not dividing the heads, more stages than
// layers, a sequence that does not cut into 2·CP equal chunks, or a batch that does not split into whole
// sequences per micro-batch. Sorted: fitting layouts first, then those that do not fit, then those that
// cannot run; inside each by the estimated step time.
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "common.h"
#include "mem.h"
#include "model.h"
#include "net.h"       // shm_inbox_bytes: plan comm's shared-memory staging
#include "net_verbs.h" // verbs_staging_slot_bytes: plan comm's registered staging
#include "pipeline.h"
#include "schedule.h"
#include "zero.h"

static const char PLAN_USAGE[] =
    "usage: ./train plan --gpus G --batch-tokens N [flags]\n"
    "       ./train plan comm --gpus G --batch-tokens N --tp T --pp P --dp D [--cp C] [flags]\n"
    "  every (TP, CP, PP, DP) with TP x CP x PP x DP = G: bytes per GPU, fits, bubble, communication and\n"
    "  compute per step, best first (the formulas: plan.c and README); rank = ((dp*PP + pp)*CP + cp)*TP + tp\n"
    "\n"
    "model (as for training; default d12):\n"
    "  --model d12|d24|d36|d48    GPT-2 124M / 350M / 774M / 1558M (maxT 1024, V 50257)\n"
    "  --model llama3-tiny|llama3.2-1b|llama3-8b|llama3-70b|llama3-405b\n"
    "                             Meta's Llama 3 shapes (the --arch llama estimate: RMSNorm, SwiGLU, GQA)\n"
    "  --layers L --channels C --heads H --vocab V --max-seq-len N\n"
    "                             a custom shape (parameters from the shape, vocab padded to 128)\n"
    "  --arch gpt2|llama          the architecture (default gpt2; a Llama --model implies llama; --arch\n"
    "                             llama alone starts from llama3.2-1b, the shape flags overriding it)\n"
    "  --kv-heads N --ffn F --tie-embeddings 0|1\n"
    "                             Llama: key/value heads (default: the preset's, or --heads), SwiGLU's\n"
    "                             hidden size (default: the preset's, or 8C/3 rounded up to 256), head tied\n"
    "                             to wte (1) or its own (0)\n"
    "  --rope-theta X --norm-eps E --rope-scaling S\n"
    "                             Llama: as for training (checked; they change no estimate)\n"
    "  --seq-len T                tokens per sequence (default: maxT)\n"
    "  --params N                 GPT-2: the parameter count instead of the shape's (with --layers and --channels;\n"
    "                             --heads defaults to C/64), e.g. 70B or 7e10\n"
    "\n"
    "cluster:\n"
    "  --gpus G                   GPUs in all (required)\n"
    "  --gpus-per-node N          default 8; each TP group (TP consecutive ranks) stays inside a node\n"
    "  --max-tp N                 largest TP considered (default 8)\n"
    "  --tp N, --cp N, --pp N, --dp N\n"
    "                             list only the layouts with this many ranks on that axis\n"
    "  --gpu-mem BYTES            memory per GPU, e.g. 80GB (1e9) or 80GiB (2^30) (default 80GB)\n"
    "  --intra-bw GB/s            per-GPU link bandwidth inside a node (default 300)\n"
    "  --inter-bw GB/s            per-GPU link bandwidth across nodes (default 50)\n"
    "  --flops F                  sustained FLOP/s per GPU, e.g. 400T or 4e14 (default 400T)\n"
    "\n"
    "training step:\n"
    "  --batch-tokens N           tokens per optimizer step (required); K, M, G are 2^10, 2^20, 2^30\n"
    "                             (4M = 4194304 = 1024 sequences of 4096)\n"
    "  --micro-batches M          micro-batches per data-parallel replica and step (default 8)\n"
    "  --pp-virtual V             chunks per stage for the interleaved bubble (default 2)\n"
    "  --pp-schedule S            the bubble column's schedule: 1f1b (default) (PP-1)/(M+PP-1), interleaved\n"
    "                             (the interleaved column's, where it applies), zb-h1 (PP-1)/(3M+PP-1), zb-v (PP-1)/(6M+PP-1) where\n"
    "                             2PP <= L (F = B = W, the zero-bubble paper's); with --exact zb-h1 keeps\n"
    "                             min(PP, M) activation sets on every stage and stage s min(s+1, M)\n"
    "                             weight-gradient stashes (what B copies for W beyond its set), and zb-v\n"
    "                             (where 2PP <= L) the V placement with the sets and stashes its lists hold\n"
    "  --pp-times auto|unit|F,B,W zb-v with --exact: count the sets and buffers its lists hold when built\n"
    "                             for these pass times (as ./train --pp-times; unit: the unit lists'; auto,\n"
    "                             the default: theirs with a gradient buffer per activation set, which a\n"
    "                             run's measured lists are kept within); the bubble column keeps the formula\n"
    "  --zero 0|1|2|3             ZeRO stage (default 0)\n"
    "  --recompute none|selective|full\n"
    "                             activation checkpointing (default none): selective recomputes the\n"
    "                             LayerNorm outputs and GELU's output, full keeps only each block's input\n"
    "  --attention flash|full     flash (default) keeps no T x T probabilities; full keeps them (the seed's\n"
    "                             model only: llm4d's attention is flash)\n"
    "  --dtype bf16|fp32          working weights, gradients and activations (default bf16)\n"
    "\n"
    "llm4d's own buffers:\n"
    "  --exact                    count llm4d's own buffers for each layout instead of the seed's model: the\n"
    "                             trainer's allocation code run dry for every pipeline stage, the fullest\n"
    "                             shown (fp32 gradients, its real activation sets, recompute scratch, ZeRO\n"
    "                             buffers, pipeline slots); fits and the order use it\n"
    "  --sp                       with --exact: sequence parallelism (the seed's model always assumes it)\n"
    "  --interleaved              with --exact: the interleaved schedule (V = --pp-virtual) where it applies,\n"
    "                             its pool of one-chunk activation sets\n"
    "  --bucket-mb F              with --exact: gradient bucket size, as for training (default 25)\n"
    "  --device cuda|cpu          with --exact: what the ranks run on, as for training (default cuda; gpu is\n"
    "                             the same); on cpu the host buffers (checkpoint staging) are the device's\n"
    "                             memory too\n"
    "  --ckpt                     with --exact: checkpoints are written (--ckpt-dir): count their staging\n"
    "  --algo auto|fanin|ring|hier\n"
    "                             with --exact: the collectives' algorithm, as for training (default auto:\n"
    "                             fan-in inside a node, hierarchical across nodes); on --device cpu comm\n"
    "                             counts every communicator's staging under it (ring 2 MiB, none at 2\n"
    "                             ranks; hierarchy 4 MiB + 4 MiB / ranks per node, + 2 MiB across\n"
    "                             nodes; host memory, so not a GPU's)\n"
    "\n"
    "communication of one layout (./train plan comm; the alpha-beta model: README, \"Communication at scale\"):\n"
    "  comm                       (first) each traffic class (TP, PP, DP, CP) under each algorithm (ring,\n"
    "                             fanin, hier): time, messages, connections, staging memory, incast\n"
    "  --intra-lat US             latency per message inside a node, microseconds (default 3)\n"
    "  --inter-lat US             latency per message across nodes, microseconds (default 5)\n"
    "\n"
    "output:\n"
    "  --top N                    print the N best layouts only (default all)\n"
    "  --json                     one JSON object (inputs, model, every layout) instead of the table\n"
    "  --plot FILE.png            memory per GPU by category for each layout, stacked bars with the limit\n"
    "                             marked (scripts/plot.py, matplotlib)\n";

typedef struct {
    GPT2Config cfg;
    int T, T_is_max; // T_is_max: no --seq-len, so T is the model's maxT
    double params;       // N
    int gpus, gpus_per_node, max_tp, micro_batches, pp_virtual, zero, top;
    int pp_schedule; // SCHED_* (schedule.h): whose formula the bubble column shows
    double pp_times[3]; // --pp-times (zeros: unit times, or auto)
    const char *pp_times_flag;
    int only_tp, only_cp, only_pp, only_dp; // 0, or the one value of that axis to list
    int recompute; // RECOMPUTE_* (model.h)
    int flash, fp32, json;
    int comm;                       // ./train plan comm: one layout's communication
    double intra_lat, inter_lat;    // seconds per message (plan comm)
    int exact, sp, interleaved, device_cpu, ckpt; // --exact and its options
    int algo;                       // --exact: the collectives' algorithm (CommAlgo), as training's --algo
    double bucket_mb;
    double gpu_mem, intra_bw, inter_bw, flops, batch_tokens; // bytes, bytes/s, bytes/s, FLOP/s, tokens
    const char *plot;
} PlanInput;

// One layout and what the estimate says of it (rank = ((dp·PP + pp)·CP + cp)·TP + tp).
typedef struct {
    int tp, pp, cp, dp;
    const char *why; // NULL, or why llm4d cannot run this layout
    double layers_per_stage, tokens_per_replica, micro_tokens, sequences_per_micro;
    double params_per_gpu;
    double weights, grads, optimizer, act_upper, act_1f1b, total, total_upper; // bytes per GPU
    int fits; // total <= --gpu-mem
    double bubble, bubble_interleaved; // the latter NaN where the interleaved schedule does not apply
    // --exact: llm4d's buffers per stage (pp of them, malloc'd) and the fullest stage
    size_t (*stage_bytes)[MEM_NCAT];
    int exact_stage;
    double exact_total;
    int dp_intra;                      // each DP x CP group (the gradient reduction's) sits inside one node
    int cp_intra;                      // each CP group sits inside one node
    double dp_allreduce_s, tp_comm_s, cp_comm_s, compute_s;
    double dp_exposed_s, cp_exposed_s, step_s; // the step estimate (top of this file)
} Candidate;

// ---------------------------------------------------------------------------------------------
// the command line: numbers with units, every error naming its flag

// The numbers and their units: common.c's parse_number and parse_int (K, M, G = 2^10.. for counts).

typedef struct { // the flags that only parse_plan's checks and the shape read
    const char *preset;
    int L, C, NH, V, maxT, T, device_given, bucket_given, algo_given;
    int arch, NKV, F, tie; // --arch, --kv-heads, --ffn, --tie-embeddings (arch and tie -1 where not given)
    double rope_theta, norm_eps; // taken as training takes them, checked; they change no estimate
    const char *rope_scaling;    // (the same)
    const char *lat_given; // --intra-lat or --inter-lat, which only `plan comm` takes
} PlanFlags;

// The checks between the flags, and the model's shape (from a preset and the shape flags, or --params).
static void resolve_plan(PlanInput *in, const PlanFlags *g) {
    const char *preset = g->preset;
    int L = g->L, C = g->C, NH = g->NH, V = g->V, maxT = g->maxT, T = g->T;
    if (!in->gpus) die("plan: --gpus is required (the number of GPUs to split the model over)");
    if (in->comm && g->algo_given) die("plan comm: --algo is for ./train plan --exact (plan comm shows every algorithm)");
    if (!in->exact && (in->sp || in->interleaved || in->ckpt || g->device_given || g->bucket_given || g->algo_given))
        die("%s describes llm4d's own buffers: it needs --exact", in->sp ? "--sp" : in->interleaved ? "--interleaved"
                                                                 : in->ckpt ? "--ckpt" : g->device_given ? "--device"
                                                                 : g->bucket_given ? "--bucket-mb" : "--algo");
    if (g->lat_given && !in->comm) die("%s is for ./train plan comm (the communication model)", g->lat_given);
    if (in->comm && (in->exact || in->plot || in->top))
        die("plan comm: %s is for the layout search (./train plan)", in->exact ? "--exact" : in->plot ? "--plot" : "--top");
    if (in->exact && !in->flash) die("--exact counts llm4d's buffers, and its attention is flash: drop --attention full");
    // --interleaved is a schedule: the bubble column's too, and no other beside it
    if (in->interleaved && in->pp_schedule != SCHED_1F1B && in->pp_schedule != SCHED_INTERLEAVED) // (1f1b: the default)
        die("--interleaved counts the interleaved schedule: drop --pp-schedule %s, or --interleaved", SCHEDULE_NAMES[in->pp_schedule]);
    if (in->interleaved) in->pp_schedule = SCHED_INTERLEAVED;
    if (in->exact && in->params > 0)
        die("--exact counts llm4d's buffers, which need the whole shape (--model, or --layers --channels --heads --vocab), "
            "not --params");
    if (!in->batch_tokens) die("plan: --batch-tokens is required (tokens per optimizer step, e.g. 4M)");
    GPT2Config probe;
    if (in->params > 0 && (g->arch == ARCH_LLAMA || (preset && llama_preset(preset, &probe)) || g->NKV || g->F || g->tie >= 0 ||
                           g->rope_theta || g->norm_eps || g->rope_scaling))
        die("--params is for GPT-2 shapes: a Llama's count comes from its shape (--kv-heads, --ffn, --tie-embeddings)");
    if (in->params > 0) {
        if (preset || V || maxT) die("--params replaces the shape's parameter count: drop --model, --vocab and --max-seq-len");
        if (!L || !C) die("--params needs --layers and --channels (the activations depend on them)");
        if (!NH && C % 64) die("--params: --heads is needed when --channels %d is not a multiple of 64", C);
        in->cfg = (GPT2Config){ .L = L, .C = C, .NH = NH ? NH : C / 64, .V = 0, .Vp = 0, .maxT = T ? T : 1024 };
        if (C % in->cfg.NH) die("bad model shape: channels (%d) must be divisible by heads (%d)", C, in->cfg.NH);
        in->T = in->cfg.maxT;
    } else {
        ShapeFlags f = { .arch = g->arch, .L = L, .C = C, .NH = NH, .NKV = g->NKV, .F = g->F, .V = V, .maxT = maxT, .tie = g->tie,
                        .rope_theta = g->rope_theta, .norm_eps = g->norm_eps, .rope_scaling = g->rope_scaling };
        in->cfg = model_shape(preset, &f, T); // the trainer's: a GPT-2 or a Llama shape
        size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
        in->params = (double)gpt2_param_layout(&in->cfg, sizes, offsets);
        in->T = T ? T : in->cfg.maxT;
        in->T_is_max = !T;
        if (in->T > in->cfg.maxT) die("--seq-len %d is above the model's maximum sequence length %d", in->T, in->cfg.maxT);
    }
    if (in->max_tp > in->gpus_per_node) in->max_tp = in->gpus_per_node;
    if (in->batch_tokens < in->T)
        die("--batch-tokens %.0f is less than one sequence of %d tokens: no layout can run (a replica takes whole "
            "sequences)", in->batch_tokens, in->T);
}

static void parse_plan(PlanInput *in, int argc, char **argv) {
    PlanFlags g = { .arch = -1, .tie = -1 };
    *in = (PlanInput){ .gpus_per_node = 8, .max_tp = 8, .micro_batches = 8, .pp_virtual = 2, .flash = 1,
                       .gpu_mem = 80e9, .intra_bw = 300e9, .inter_bw = 50e9, .flops = 400e12, .bucket_mb = 25,
                       .intra_lat = 3e-6, .inter_lat = 5e-6 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (i == 1 && !strcmp(f, "comm")) {
            in->comm = 1;
            continue;
        }
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(PLAN_USAGE, stdout);
            exit(0);
        }
        int *on = !strcmp(f, "--json") ? &in->json : !strcmp(f, "--exact") ? &in->exact : !strcmp(f, "--sp") ? &in->sp
                : !strcmp(f, "--interleaved") ? &in->interleaved : !strcmp(f, "--ckpt") ? &in->ckpt : NULL;
        if (on) {
            *on = 1;
            continue;
        }
        if (strncmp(f, "--", 2) != 0) die("plan: unexpected argument '%s' (see ./train plan --help)", f);
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(name) (!strcmp(f, name) && (v ? (i++, 1) : (die("%s needs a value", name), 0)))
#define INT(lo, hi) (int)parse_int(f, v, lo, hi)
        if (IS("--model")) g.preset = v;
        else if (IS("--layers")) g.L = INT(1, 4096);
        else if (IS("--channels")) g.C = INT(1, 65536);
        else if (IS("--heads")) g.NH = INT(1, 65536);
        else if (IS("--vocab")) g.V = INT(1, 1048448); // Vp (a multiple of 128) <= 2^20
        else if (IS("--arch")) {
            if (strcmp(v, "gpt2") && strcmp(v, "llama")) die("--arch must be gpt2 or llama, got '%s'", v);
            g.arch = !strcmp(v, "llama") ? ARCH_LLAMA : ARCH_GPT2;
        }
        else if (IS("--kv-heads")) g.NKV = INT(1, 65536);
        else if (IS("--ffn")) g.F = INT(1, 1 << 20);
        else if (IS("--tie-embeddings")) g.tie = INT(0, 1);
        else if (IS("--rope-theta")) g.rope_theta = parse_float(f, v, 1.0000001, 1e12);
        else if (IS("--norm-eps")) g.norm_eps = parse_float(f, v, 1e-12, 1);
        else if (IS("--rope-scaling")) g.rope_scaling = v;
        else if (IS("--max-seq-len")) g.maxT = INT(1, 1048576);
        else if (IS("--seq-len")) g.T = INT(1, 1048576);
        else if (IS("--params")) in->params = parse_number(f, v, COUNT_UNITS, 1, 1e16, 0);
        else if (IS("--gpus")) in->gpus = INT(1, 1 << 24);
        else if (IS("--gpus-per-node")) in->gpus_per_node = INT(1, 1 << 16);
        else if (IS("--max-tp")) in->max_tp = INT(1, 1 << 16);
        else if (IS("--gpu-mem")) {
            in->gpu_mem = parse_number(f, v, BYTE_UNITS, 1, 1e18, 0);
            int digits = (int)strspn(v, "0123456789.eE+-"); // no GPU has less than 1 MiB: a unit left out (80 for 80GB)
            if (in->gpu_mem < 1 << 20 && !v[digits])
                die("plan: --gpu-mem %s is %.0f bytes: give a unit, e.g. %sGB (1e9) or %sGiB (2^30)", v, in->gpu_mem, v, v);
            if (in->gpu_mem < 1 << 20) die("plan: --gpu-mem %s is %.0f bytes, below the 1 MiB of any GPU", v, in->gpu_mem);
        }
        else if (IS("--intra-bw")) in->intra_bw = 1e9 * parse_number(f, v, NO_UNITS, 1e-6, 1e9, 0);
        else if (IS("--inter-bw")) in->inter_bw = 1e9 * parse_number(f, v, NO_UNITS, 1e-6, 1e9, 0);
        else if (IS("--intra-lat")) in->intra_lat = 1e-6 * parse_number(f, v, NO_UNITS, 0, 1e6, 0), g.lat_given = "--intra-lat";
        else if (IS("--inter-lat")) in->inter_lat = 1e-6 * parse_number(f, v, NO_UNITS, 0, 1e6, 0), g.lat_given = "--inter-lat";
        else if (IS("--flops")) in->flops = parse_number(f, v, FLOP_UNITS, 1, 1e21, 0);
        else if (IS("--batch-tokens")) in->batch_tokens = parse_number(f, v, TOKEN_UNITS, 1, 1e15, 1);
        else if (IS("--micro-batches")) in->micro_batches = INT(1, 1 << 24);
        else if (IS("--pp-virtual")) in->pp_virtual = INT(1, MAX_CHUNKS);
        else if (IS("--pp-schedule")) {
            in->pp_schedule = schedule_parse(v);
            if (in->pp_schedule < 0) die("--pp-schedule must be 1f1b, interleaved, zb-h1 or zb-v, got '%s'", v);
        }
        else if (IS("--pp-times")) { // auto, the default: the unit lists' pool with auto's gradient buffers, as a run
            if (strcmp(v, "auto")) schedule_parse_times(f, v, in->pp_times);
            in->pp_times_flag = v;
        }
        else if (IS("--zero")) in->zero = INT(0, 3);
        else if (IS("--top")) in->top = INT(1, 1 << 30);
        else if (IS("--tp")) in->only_tp = INT(1, 1 << 24);
        else if (IS("--pp")) in->only_pp = INT(1, 1 << 24);
        else if (IS("--cp")) in->only_cp = INT(1, 1 << 24);
        else if (IS("--dp")) in->only_dp = INT(1, 1 << 24);
        else if (IS("--plot")) in->plot = v;
        else if (IS("--bucket-mb")) in->bucket_mb = parse_number(f, v, NO_UNITS, 0, 1e6, 0), g.bucket_given = 1;
        else if (IS("--algo")) {
            if ((in->algo = comm_parse_algo(v)) < 0) die("--algo must be auto, fanin, ring or hier, got '%s'", v);
            g.algo_given = 1;
        }
        else if (IS("--device")) {
            if (strcmp(v, "cuda") && strcmp(v, "gpu") && strcmp(v, "cpu")) die("--device must be cuda or cpu, got '%s'", v);
            in->device_cpu = !strcmp(v, "cpu");
            g.device_given = 1;
        }
        else if (IS("--recompute")) {
            if (!strcmp(v, "none")) in->recompute = RECOMPUTE_NONE;
            else if (!strcmp(v, "selective")) in->recompute = RECOMPUTE_SELECTIVE;
            else if (!strcmp(v, "full")) in->recompute = RECOMPUTE_FULL;
            else die("--recompute must be none, selective or full, got '%s'", v);
        } else if (IS("--attention")) {
            if (strcmp(v, "flash") && strcmp(v, "full")) die("--attention must be flash or full, got '%s'", v);
            in->flash = !strcmp(v, "flash");
        } else if (IS("--dtype")) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) die("--dtype must be bf16 or fp32, got '%s'", v);
            in->fp32 = !strcmp(v, "fp32");
        } else {
            char hint[80];
            die("plan: unknown flag %s%s (see ./train plan --help)", f, flag_hint(f, PLAN_USAGE, hint, sizeof hint));
        }
#undef INT
#undef IS
    }
    schedule_check_times_kind(in->pp_schedule, in->pp_times_flag);
    resolve_plan(in, &g);
}

// ---------------------------------------------------------------------------------------------
// the estimate

// Whether every group of `size` ranks `stride` apart lies inside one node. Ranks fill the nodes in
// order (node = rank / gpus_per_node), and the groups of one axis tile the ranks in blocks of
// stride·size consecutive ranks, so it is enough that no block crosses a node boundary.
static int group_in_node(int stride, int size, int world, int gpus_per_node) {
    long span = (long)stride * size;
    if (size == 1) return 1;
    for (long first = 0; first < world; first += span)
        if (first / gpus_per_node != (first + span - 1) / gpus_per_node) return 0;
    return 1;
}

// Whether every group of ranks sharing (pp, tp) — the DP x CP ranks that hold the same weights — lies
// inside one node, in the rank order rank = ((dp·PP + pp)·CP + cp)·TP + tp.
static int weight_group_in_node(int tp, int cp, int pp, int world, int gpus_per_node) {
    int groups = pp * tp, ok = 1;
    long *node = xmalloc(sizeof(long) * groups);
    for (int g = 0; g < groups; g++) node[g] = -1;
    for (long r = 0; r < world && ok; r++) {
        int rd, rp, rc, rt;
        layout_coords((int)r, tp, cp, pp, &rd, &rp, &rc, &rt);
        int g = rp * tp + rt;
        if (node[g] < 0) node[g] = r / gpus_per_node;
        else ok = node[g] == r / gpus_per_node;
    }
    free(node);
    return ok;
}

// The shape's per-token terms (the formulas at the top of this file). K and V channels of one TP rank:
// C/TP for GPT-2; a Llama's NKV/TP kv heads, or the one kv head a rank shares when TP > NKV.
static double kv_channels(const GPT2Config *c, int tp) {
    if (c->arch != ARCH_LLAMA) return (double)c->C / tp;
    double hs = (double)c->C / c->NH;
    return (c->NKV >= tp ? (double)c->NKV / tp : 1) * hs;
}

// Forward FLOPs per token of one block's matmuls: GPT-2 2·12·C² (biases left out), a Llama
// 2·C·((NH + 2·NKV)·hs + NH·hs + 3·F) (QKV with GQA's narrower K and V, the output projection, SwiGLU's
// gate, up and down).
static double block_matmul_flops(const GPT2Config *c) {
    double C = c->C, hs = C / c->NH;
    if (c->arch != ARCH_LLAMA) return 24 * C * C;
    return 2 * C * ((c->NH + 2.0 * c->NKV) * hs + c->NH * hs + 3.0 * c->F);
}

// Forward FLOPs per token of one block's causal attention: scores and weighted sum over T/2 keys on
// average, NH·hs = C channels each: 2·T·C, whatever NKV (every query head sees every key).
static double block_attention_flops(const GPT2Config *c, int T) { return 2.0 * T * c->C; }

// One forward and backward per token, no recompute: GPT-2 the seed's 6·N; a Llama 3·(L·(matmuls +
// attention) + the head's 2·C·Vp), which is 6·(the matmuls' weights) + 6·L·C·T.
static double flops_per_token(const GPT2Config *c, double N, int T) {
    if (c->arch != ARCH_LLAMA) return 6 * N;
    return 3 * (c->L * (block_matmul_flops(c) + block_attention_flops(c, T)) + 2.0 * c->C * c->Vp);
}

// The step time with the overlap the trainer achieves (the formula at the top of this file).
static void estimate_step(const PlanInput *in, Candidate *y) {
    double M = in->micro_batches, attn = block_attention_flops(&in->cfg, in->T);
    double bubble = in->interleaved && !isnan(y->bubble_interleaved) ? y->bubble_interleaved : y->bubble;
    double attention = y->compute_s * attn / (attn + block_matmul_flops(&in->cfg));
    y->cp_exposed_s = fmax(0, y->cp_comm_s - attention);
    y->dp_exposed_s = fmax(0, y->dp_allreduce_s - y->compute_s / M);
    y->step_s = (y->compute_s + y->tp_comm_s + y->cp_exposed_s) / (1 - bubble) + y->dp_exposed_s;
}

// The seed's model, the formulas at the top of this file.
static void estimate_seed(const PlanInput *in, Candidate *y) {
    const GPT2Config *c = &in->cfg;
    double e = in->fp32 ? 4 : 2;                                 // bytes per activation element
    double wb = in->fp32 ? 4 : 2, gb = wb, ob = in->fp32 ? 8 : 12; // bytes per parameter
    double C = c->C, M = in->micro_batches, T = in->T;
    int tp = y->tp, pp = y->pp, dp = y->dp, cp = y->cp;
    double same = (double)dp * cp; // the ranks holding the same weights: ZeRO's group

    y->why = NULL;
    if (c->NH % tp) y->why = "TP does not divide the heads";
    else if (c->arch == ARCH_LLAMA && c->NKV % tp && tp % c->NKV) y->why = "TP and the kv heads do not divide one another";
    else if (c->arch == ARCH_LLAMA && c->F % tp) y->why = "TP does not divide the SwiGLU size";
    else if (pp > c->L) y->why = "more stages than layers";
    else if (in->pp_schedule == SCHED_ZBV && pp > 1 && 2 * pp > c->L) y->why = "zb-v's two chunks a stage need 2·PP layers";
    else if (cp > 1 && in->T % (2 * cp)) y->why = "the sequence does not cut into 2·CP equal chunks";
    else if (fmod(in->batch_tokens, (double)dp * M * T) != 0)
        y->why = "the batch does not split into whole sequences per micro-batch";
    // the trainer's bounds on a step (options.c, check_layout): tokens of a micro-batch, micro-batches, tokens per rank
    else if (in->batch_tokens / ((double)dp * M) > (double)MAX_MICRO_TOKENS)
        y->why = "more tokens in a micro-batch than llm4d takes (2^24)";
    else if (M > MAX_ACCUM || in->batch_tokens / dp > (double)MAX_STEP_TOKENS)
        y->why = "more micro-batches (2^16) or tokens (2^28) a rank and step than llm4d takes";

    // a Llama with more TP ranks than kv heads replicates each kv head's K and V weights on TP/NKV ranks
    double kv_extra = 0;
    if (c->arch == ARCH_LLAMA && tp > c->NKV) kv_extra = c->L * 2.0 * c->NKV * ((double)c->C / c->NH) * c->C * ((double)tp / c->NKV - 1);
    y->params_per_gpu = (in->params + kv_extra) / ((double)tp * pp);
    double P = y->params_per_gpu;
    y->weights = wb * P / (in->zero >= 3 ? same : 1);
    y->grads = gb * P / (in->zero >= 2 ? same : 1);
    y->optimizer = ob * P / (in->zero >= 1 ? same : 1);

    double Ls = (double)c->L / pp, R = in->batch_tokens / dp, m = R / M, k = pp < M ? pp : M;
    y->layers_per_stage = Ls;
    y->tokens_per_replica = R;
    y->micro_tokens = m;
    y->sequences_per_micro = m / T;
    double a_full, a_sel; // bytes per token per layer, everything kept and under selective recompute
    if (c->arch == ARCH_LLAMA) { // Korthikanti's inventory for the Llama block, no dropout
        double r = (double)c->NKV / c->NH, F = c->F;
        a_full = e * (6 * C + 2 * r * C + 3 * F) + (in->flash ? 0 : e * c->NH * T);
        a_sel = e * (4 * C + 2 * r * C + 2 * F);
    } else {
        a_full = 17 * e * C + (in->flash ? 0 : 2.5 * e * c->NH * T); // 34·C in bf16, the probabilities
        a_sel = 11 * e * C;
    }
    double a = in->recompute == RECOMPUTE_SELECTIVE ? a_sel : a_full;
    double split = (double)tp * cp; // a micro-batch's activations are spread over the TP x CP ranks
    if (in->recompute == RECOMPUTE_FULL) {
        y->act_upper = R * (Ls * e * C + a_full) / split;
        y->act_1f1b = (k * m * Ls * e * C + m * a_full) / split;
    } else {
        y->act_upper = R * Ls * a / split;
        y->act_1f1b = k * m * Ls * a / split;
    }
    double state = y->weights + y->grads + y->optimizer;
    y->total = state + y->act_1f1b;
    y->total_upper = state + y->act_upper;
    y->fits = y->total <= in->gpu_mem; // memory only; why says whether llm4d can run it at all

    y->bubble = (pp - 1.0) / (M + pp - 1.0);
    int interleaves = pp > 1 && pp * in->pp_virtual <= c->L && in->micro_batches % pp == 0;
    y->bubble_interleaved = interleaves ? (pp - 1.0) / (in->pp_virtual * M + pp - 1.0) : NAN;
    // the zero-bubble schedules with equal F, B and W (schedule.h): zb-h1 (PP-1)(F+B-W), zb-v the first
    // chunk activation's walk down the ranks, (PP-1) chunk forwards against 6M chunk passes
    if (in->pp_schedule == SCHED_INTERLEAVED && interleaves) y->bubble = y->bubble_interleaved;
    if (in->pp_schedule == SCHED_ZBH1) y->bubble = (pp - 1.0) / (3.0 * M + pp - 1.0);
    if (in->pp_schedule == SCHED_ZBV && 2 * pp <= c->L) y->bubble = (pp - 1.0) / (6.0 * M + pp - 1.0);

    // the gradients are reduced over the DP x CP ranks holding the same weights
    y->dp_intra = weight_group_in_node(tp, cp, pp, in->gpus, in->gpus_per_node);
    double dp_bw = y->dp_intra ? in->intra_bw : in->inter_bw, f = in->zero == 3 ? 3 : 2;
    y->dp_allreduce_s = f * (same - 1.0) / same * gb * P / dp_bw;
    double n_ar = in->recompute == RECOMPUTE_FULL ? 6 : 4, mc = m / cp; // tokens of a micro-batch per GPU
    y->tp_comm_s = n_ar * Ls * M * (2.0 * (tp - 1) / tp * mc * C * e) / in->intra_bw;
    // the CP ring: K/V blocks CP - 1 steps per pass (forward, backward, full recompute's second forward),
    // fp32 dK/dV accumulators CP steps in the backward; a CP group is CP ranks TP apart
    y->cp_intra = group_in_node(tp, cp, in->gpus, in->gpus_per_node);
    double kvc = kv_channels(c, tp), kv = 2.0 * mc * kvc * e, dkv = 2.0 * mc * kvc * 4;
    double passes = in->recompute == RECOMPUTE_FULL ? 3 : 2;
    y->cp_comm_s = cp == 1 ? 0 : Ls * M * (passes * (cp - 1) * kv + cp * dkv) / (y->cp_intra ? in->intra_bw : in->inter_bw);
    double c_flops = in->recompute == RECOMPUTE_FULL ? 8 : 6;
    y->compute_s = c_flops / 6 * flops_per_token(c, in->params, in->T) * in->batch_tokens / in->gpus / in->flops;
    estimate_step(in, y);
}

#define ALGO_NAME(a) ((const char *const[]){ "auto", "fanin", "ring", "hier" })[a] // CommAlgo's, as --algo spells them

// --exact: the comm buffers of the collectives' algorithms (the ring's staging, the hierarchy's partial
// sums) on the rank at coordinates (0, l's stage, 0, 0), for every communicator layout_connect makes
// there (layout_count_memory counts them all), its members on nodes of --gpus-per-node consecutive
// ranks; host memory, so the device's figure only where the ranks run on the CPUs. -1 and *why where
// --algo cannot serve a communicator.
static double exact_comm_bytes(const PlanInput *in, const Layout *l, const char **why) {
    if (!in->device_cpu) return 0;
    enum { D = 1, P = 2, C = 4, T = 8, ENDS = 16 }; // the axes a communicator spans; ENDS: stages 0 and PP-1
    int TP = l->tp.size, CP = l->cp.size, PP = l->pp.size, DP = l->dp.size, s = l->pp.rank, spans[10], ns = 0;
    spans[ns++] = D | P | C | T;                             // world
    spans[ns++] = T;                                         // tp
    spans[ns++] = P, spans[ns++] = P, spans[ns++] = P;       // pp, its activations, its gradients
    spans[ns++] = D | C;                                     // the replicas (DP x CP)
    if (CP > 1) spans[ns++] = C, spans[ns++] = C;            // cp, its dK/dV
    if (PP > 1 && layout_head_stage(l) != 0 && (s == 0 || s == PP - 1)) spans[ns++] = P | ENDS; // the tied embedding
    int *node = xmalloc(sizeof(int) * (size_t)l->nranks);
    double total = 0;
    for (int i = 0; i < ns; i++) {
        int g = spans[i], n = 0;
        for (int dp = 0; dp < (g & D ? DP : 1); dp++)
            for (int pp = g & P ? 0 : s; pp < (g & P ? PP : s + 1); pp++)
                for (int cp = 0; cp < (g & C ? CP : 1); cp++)
                    for (int tp = 0; tp < (g & T ? TP : 1); tp++)
                        if (!(g & ENDS) || pp == 0 || pp == PP - 1) node[n++] = layout_rank(dp, pp, cp, tp, TP, CP, PP) / in->gpus_per_node;
        long long b = comm_algo_buffer_bytes(in->algo, n, node, why);
        if (b < 0) {
            total = -1;
            break;
        }
        total += (double)b;
    }
    free(node);
    return total;
}

// --exact: llm4d's buffers for every stage of the layout, counted by building the rank dry (see the top
// of this file) and adding the collectives' algorithm buffers (exact_comm_bytes); the fullest stage
// decides total and fits.
static void estimate_exact(const PlanInput *in, Candidate *y) {
    y->exact_stage = -1;
    y->exact_total = NAN;
    if (y->why) return;
    double B = y->sequences_per_micro;
    // as the trainer checks (options.c, context_split_error): each sequence's positions, and a CP rank's
    if (in->sp && (in->T % y->tp || (y->cp > 1 && (in->T / y->cp) % y->tp))) {
        y->why = "sequence parallelism needs T (and T / CP) divisible by TP";
        return;
    }
    int interleave = in->interleaved && !isnan(y->bubble_interleaved);
    // the schedule whose buffers are counted: as the bubble column's (zb-v where 2PP <= L)
    int zbv = !interleave && in->pp_schedule == SCHED_ZBV && y->pp > 1 && 2 * y->pp <= in->cfg.L;
    int zbh1 = !interleave && in->pp_schedule == SCHED_ZBH1 && y->pp > 1;
    y->stage_bytes = xcalloc((size_t)y->pp, sizeof *y->stage_bytes);
    for (int s = 0; s < y->pp; s++) {
        Layout l; // stage s's first rank (every rank of a stage holds the same buffers), unconnected
        layout_place(&l, layout_rank(0, s, 0, 0, y->tp, y->cp, y->pp), in->gpus, y->tp, y->cp, y->pp);
        l.sp = in->sp && y->tp > 1;
        l.zero = in->zero;
        l.recompute = in->recompute;
        l.bucket_mb = in->bucket_mb;
        l.B = (int)B;
        l.T = in->T;
        l.accum = in->micro_batches;
        // the sets, head buffers and stashes the schedule's action lists keep (layout_place_stages)
        l.schedule = zbv ? SCHED_ZBV : zbh1 ? SCHED_ZBH1 : y->pp > 1 && interleave ? SCHED_INTERLEAVED : SCHED_1F1B;
        memcpy(l.pp_times, in->pp_times, sizeof l.pp_times);
        l.pp_times_auto = zbv && (!in->pp_times_flag || !strcmp(in->pp_times_flag, "auto")); // (./train's default)
        layout_place_stages(&l, in->cfg.L, zbv ? 2 : y->pp > 1 && interleave ? in->pp_virtual : 1, NULL);
        GPT2 m;
        Zero z;
        Pipeline p;
        AdamWConfig acfg = { 0 };
        DType dt = in->fp32 ? DT_F32 : DT_BF16;
        StepTimes times = { 0 }; // a dry build runs nothing
        layout_build_model(&l, &in->cfg, dt, backend_dry(in->device_cpu ? MEMKIND_HOST : MEMKIND_DEVICE), &times, &m);
        layout_build_state(&l, &m, &z, &p, NULL, &acfg);
        if (in->ckpt) {
            float *snap[3];
            ckpt_alloc_staging(&m.mem, &z, snap);
        }
        memcpy(y->stage_bytes[s], m.mem.peak, sizeof y->stage_bytes[s]);
        const char *why = NULL;
        double comm = exact_comm_bytes(in, &l, &why);
        pipeline_free(&p);
        zero_free(&z);
        gpt2_free(&m);
        if (comm < 0) {
            y->why = why;
            y->exact_stage = -1;
            y->exact_total = NAN;
            y->fits = 0;
            return;
        }
        y->stage_bytes[s][MEM_COMM] += (size_t)comm;
        double total = (double)mem_sum(y->stage_bytes[s]);
        if (y->exact_stage < 0 || total > y->exact_total) y->exact_stage = s, y->exact_total = total;
    }
    y->fits = y->exact_total <= in->gpu_mem;
}

// Every (TP, CP, PP, DP) with product G, TP <= max-tp and every TP group inside one node. Returns the
// count; *out is malloc'd.
static int enumerate_layouts(const PlanInput *in, Candidate **out) {
    int cap = 16, n = 0, G = in->gpus;
    Candidate *ys = xmalloc(sizeof(Candidate) * cap);
    for (int tp = 1; tp <= in->max_tp && tp <= G; tp++) {
        if (G % tp || !group_in_node(1, tp, G, in->gpus_per_node)) continue;
        for (int cp = 1; cp <= G / tp; cp++) {
            if ((G / tp) % cp) continue;
            for (int pp = 1; pp <= G / tp / cp; pp++) {
                if ((G / tp / cp) % pp) continue;
                int dp = G / tp / cp / pp;
                if ((in->only_tp && tp != in->only_tp) || (in->only_cp && cp != in->only_cp) ||
                    (in->only_pp && pp != in->only_pp) || (in->only_dp && dp != in->only_dp))
                    continue;
                if (n == cap) ys = realloc(ys, sizeof(Candidate) * (cap *= 2));
                if (!ys) die("out of memory");
                ys[n++] = (Candidate){ .tp = tp, .pp = pp, .cp = cp, .dp = dp };
            }
        }
    }
    *out = ys;
    return n;
}

static int candidate_class(const Candidate *y) { return y->why ? 2 : y->fits ? 0 : 1; }

static int layout_order(const void *pa, const void *pb) {
    const Candidate *a = pa, *b = pb;
    if (candidate_class(a) != candidate_class(b)) return candidate_class(a) - candidate_class(b);
    if (a->step_s != b->step_s) return a->step_s < b->step_s ? -1 : 1;
    if (a->tp != b->tp) return a->tp - b->tp;
    return a->cp != b->cp ? a->cp - b->cp : a->pp - b->pp;
}

// ---------------------------------------------------------------------------------------------
// output

static void print_table(const PlanInput *in, const Candidate *ys, int n) {
    const GPT2Config *c = &in->cfg;
    char count[32];
    if (in->params >= 1e9) snprintf(count, sizeof count, "%.2f B", in->params / 1e9);
    else snprintf(count, sizeof count, "%.1f M", in->params / 1e6);
    if (in->exact)
        printf("llm4d plan: llm4d's own buffers (--exact) on the fullest pipeline stage; bytes per GPU in GB (1e9), "
               "times per optimizer step in ms\n");
    else printf("llm4d plan: an estimate from the shape (a Megatron-style mixed-precision run; README, \"Planning a layout\"); "
                "bytes per GPU in GB (1e9), times per optimizer step in ms\n");
    if (c->arch == ARCH_LLAMA)
        printf("model: Llama, L %d, C %d, H %d, KV heads %d, FFN %d, V %d (padded %d), %s head, maxT %d, T %d | %s parameters, "
               "%.4g GFLOP per token\n", c->L, c->C, c->NH, c->NKV, c->F, c->V, c->Vp, c->tie ? "tied" : "untied", c->maxT, in->T,
               count, flops_per_token(c, in->params, in->T) / 1e9);
    else if (c->V) printf("model: L %d, C %d, H %d, V %d (padded %d), maxT %d, T %d | %s parameters\n", c->L, c->C, c->NH, c->V,
                     c->Vp, c->maxT, in->T, count);
    else printf("model: L %d, C %d, H %d, T %d | %s parameters (--params)\n", c->L, c->C, c->NH, in->T, count);
    printf("cluster: %d GPUs, %d per node, %.4g GB each, TP <= %d | %.4g GB/s inside a node, %.4g GB/s across | "
           "%.4g TFLOP/s per GPU\n", in->gpus, in->gpus_per_node, in->gpu_mem / 1e9, in->max_tp, in->intra_bw / 1e9,
           in->inter_bw / 1e9, in->flops / 1e12);
    printf("step: %.0f tokens (%.6g sequences of %d), %d micro-batches per replica | ZeRO-%d | recompute %s | %s | "
           "%s attention\n", in->batch_tokens, in->batch_tokens / in->T, in->T, in->micro_batches, in->zero,
           RECOMPUTE_NAMES[in->recompute], in->fp32 ? "fp32" : "bf16", in->flash ? "flash (no T^2 term)" : "full (T^2 probabilities kept)");
    if (in->T_is_max && in->T > 8192) // long-context presets: the default is rarely what a pretraining step runs
        printf("note: no --seq-len, so T is the model's maximum, %d: every figure is for sequences that long (--seq-len T "
               "for shorter ones)\n", in->T);
    if (in->exact)
        printf("exact: %s schedule%s, %s, gradient buckets of %.4g MiB, ranks on %s%s, collectives --algo %s; the fullest "
               "stage's bytes, interleaved bubble with V = %d\n\n", in->interleaved ? "interleaved (where it applies)"
                                                  : in->pp_schedule == SCHED_ZBH1 ? "zb-h1 (with its weight-gradient stashes)"
                                                  : in->pp_schedule == SCHED_ZBV ? "zb-v (where 2PP <= L; its sets and stashes)" : "1F1B",
               in->sp ? ", sequence parallel" : "", "flash attention", in->bucket_mb, in->device_cpu ? "CPUs" : "GPUs",
               in->ckpt ? ", checkpoint staging" : "", ALGO_NAME(in->algo), in->pp_virtual);
    else
        printf("act upper: the whole replica batch resident; act 1F1B: min(PP, M) micro-batches in flight (total and fits "
               "use it); interleaved bubble with V = %d\n\n", in->pp_virtual);
    if (in->exact)
        printf("  TP   CP   PP     DP  layers/st  tok/replica stage  weights    grads    optim     act  recomp     comm    other"
               "    total  fits  bubble  interlvd   DP all-reduce    TP comm       CP comm   compute      step\n");
    else
        printf("  TP   CP   PP     DP  layers/st  tok/replica  weights    grads    optim  act upper  act 1F1B    total  fits  "
               "bubble  interlvd   DP all-reduce    TP comm       CP comm   compute      step\n");
    int rows = in->top && in->top < n ? in->top : n;
    for (int i = 0; i < rows; i++) {
        const Candidate *y = &ys[i];
        char intl[16] = "-";
        if (!isnan(y->bubble_interleaved)) snprintf(intl, sizeof intl, "%.1f%%", 100 * y->bubble_interleaved);
        printf("%4d %4d %4d %6d %10.3f %12.0f", y->tp, y->cp, y->pp, y->dp, y->layers_per_stage, y->tokens_per_replica);
        if (in->exact && y->exact_stage >= 0) {
            const size_t *b = y->stage_bytes[y->exact_stage];
            printf(" %5d %8.2f %8.2f %8.2f %7.2f %7.2f %8.2f %8.2f %8.2f", y->exact_stage, b[MEM_WEIGHTS] / 1e9,
                   b[MEM_GRADS] / 1e9, b[MEM_OPTIMIZER] / 1e9, b[MEM_ACTIVATIONS] / 1e9, b[MEM_RECOMPUTE] / 1e9,
                   b[MEM_COMM] / 1e9, b[MEM_OTHER] / 1e9, y->exact_total / 1e9);
        } else if (in->exact) {
            printf(" %5s %8s %8s %8s %7s %7s %8s %8s %8s", "-", "-", "-", "-", "-", "-", "-", "-", "-");
        } else {
            printf(" %8.2f %8.2f %8.2f %10.2f %9.2f %8.2f", y->weights / 1e9, y->grads / 1e9, y->optimizer / 1e9,
                   y->act_upper / 1e9, y->act_1f1b / 1e9, y->total / 1e9);
        }
        printf("  %-4s %6.1f%% %9s %9.1f %-5s %10.1f %7.1f %-5s %9.1f %9.1f", y->why ? "-" : y->fits ? "yes" : "no",
               100 * y->bubble, intl, 1e3 * y->dp_allreduce_s, y->dp * y->cp == 1 ? "" : y->dp_intra ? "intra" : "inter",
               1e3 * y->tp_comm_s, 1e3 * y->cp_comm_s, y->cp == 1 ? "" : y->cp_intra ? "intra" : "inter", 1e3 * y->compute_s,
               1e3 * y->step_s);
        if (y->why) printf("  (%s)", y->why);
        printf("\n");
    }
    if (rows < n) printf("... %d more layout(s) (--top)\n", n - rows);
}

static void json_num(FILE *f, const char *key, double v, const char *sep) {
    if (isnan(v)) fprintf(f, "\"%s\":null%s", key, sep);
    else fprintf(f, "\"%s\":%.17g%s", key, v, sep);
}

static void json_bytes(FILE *f, const size_t b[MEM_NCAT]) {
    for (int c = 0; c < MEM_NCAT; c++) fprintf(f, "%s\"%s\":%zu", c ? "," : "{", MEM_KEYS[c], b[c]);
    fputc('}', f);
}

static void write_json(FILE *f, const PlanInput *in, const Candidate *ys, int n) {
    const GPT2Config *c = &in->cfg;
    int llama = c->arch == ARCH_LLAMA;
    fprintf(f, "{\"model\":{\"arch\":\"%s\",\"layers\":%d,\"channels\":%d,\"heads\":%d,\"kv_heads\":%d,\"ffn\":%d,"
               "\"tied\":%s,\"vocab\":%d,\"padded_vocab\":%d,\"max_seq_len\":%d,\"seq_len\":%d,", ARCH_NAMES[llama],
            c->L, c->C, c->NH, llama ? c->NKV : c->NH, llama ? c->F : 4 * c->C, !llama || c->tie ? "true" : "false", c->V,
            c->Vp, c->maxT, in->T);
    json_num(f, "flops_per_token", flops_per_token(c, in->params, in->T), ",");
    json_num(f, "params", in->params, "},");
    fprintf(f, "\"inputs\":{\"gpus\":%d,\"gpus_per_node\":%d,\"max_tp\":%d,\"micro_batches\":%d,\"pp_virtual\":%d,"
               "\"zero\":%d,\"recompute\":\"%s\",\"attention\":\"%s\",\"dtype\":\"%s\",\"top\":%d,", in->gpus, in->gpus_per_node,
            in->max_tp, in->micro_batches, in->pp_virtual, in->zero, RECOMPUTE_NAMES[in->recompute],
            in->flash ? "flash" : "full", in->fp32 ? "fp32" : "bf16", in->top);
    json_num(f, "batch_tokens", in->batch_tokens, ",");
    json_num(f, "gpu_mem_bytes", in->gpu_mem, ",");
    json_num(f, "intra_bw_bytes_per_s", in->intra_bw, ",");
    json_num(f, "inter_bw_bytes_per_s", in->inter_bw, ",");
    json_num(f, "flops_per_s", in->flops, ",");
    fprintf(f, "\"exact\":%s", in->exact ? "true" : "false");
    if (in->exact)
        fprintf(f, ",\"sp\":%s,\"interleaved\":%s,\"device\":\"%s\",\"ckpt\":%s,\"bucket_mb\":%.17g,\"algo\":\"%s\"",
                in->sp ? "true" : "false", in->interleaved ? "true" : "false", in->device_cpu ? "cpu" : "gpu",
                in->ckpt ? "true" : "false", in->bucket_mb, ALGO_NAME(in->algo));
    fprintf(f, "},\"layouts\":[");
    for (int i = 0; i < n; i++) {
        const Candidate *y = &ys[i];
        fprintf(f, "%s{\"tp\":%d,\"pp\":%d,\"cp\":%d,\"dp\":%d,\"runs\":%s,\"why\":", i ? "," : "", y->tp, y->pp, y->cp,
                y->dp, y->why ? "false" : "true");
        if (y->why) fprintf(f, "\"%s\",", y->why);
        else fprintf(f, "null,");
        json_num(f, "layers_per_stage", y->layers_per_stage, ",");
        json_num(f, "tokens_per_replica", y->tokens_per_replica, ",");
        json_num(f, "micro_batch_tokens", y->micro_tokens, ",");
        json_num(f, "sequences_per_micro_batch", y->sequences_per_micro, ",");
        json_num(f, "params_per_gpu", y->params_per_gpu, ",");
        fprintf(f, "\"bytes\":{");
        json_num(f, "weights", y->weights, ",");
        json_num(f, "gradients", y->grads, ",");
        json_num(f, "optimizer", y->optimizer, ",");
        json_num(f, "activations_upper", y->act_upper, ",");
        json_num(f, "activations_1f1b", y->act_1f1b, ",");
        json_num(f, "total", y->total, ",");
        json_num(f, "total_upper", y->total_upper, "},");
        fprintf(f, "\"fits\":%s,", y->fits ? "true" : "false");
        json_num(f, "bubble", y->bubble, ",");
        json_num(f, "bubble_interleaved", y->bubble_interleaved, ",");
        fprintf(f, "\"dp_intra_node\":%s,", y->dp_intra ? "true" : "false");
        json_num(f, "dp_allreduce_s", y->dp_allreduce_s, ",");
        json_num(f, "tp_comm_s", y->tp_comm_s, ",");
        fprintf(f, "\"cp_intra_node\":%s,", y->cp_intra ? "true" : "false");
        json_num(f, "cp_comm_s", y->cp_comm_s, ",");
        json_num(f, "compute_s", y->compute_s, ",");
        json_num(f, "dp_exposed_s", y->dp_exposed_s, ",");
        json_num(f, "cp_exposed_s", y->cp_exposed_s, ",");
        json_num(f, "step_s", y->step_s, "");
        if (in->exact && y->exact_stage >= 0) { // llm4d's own buffers: the fullest stage, and every stage
            fprintf(f, ",\"exact\":{\"stage\":%d,\"total\":%.17g,\"bytes\":", y->exact_stage, y->exact_total);
            json_bytes(f, y->stage_bytes[y->exact_stage]);
            fprintf(f, ",\"stages\":[");
            for (int s = 0; s < y->pp; s++) {
                if (s) fputc(',', f);
                json_bytes(f, y->stage_bytes[s]);
            }
            fprintf(f, "]}");
        } else if (in->exact) {
            fprintf(f, ",\"exact\":null");
        }
        fputc('}', f);
    }
    fprintf(f, "]}\n");
}

// --plot: the JSON goes to scripts/plot.py (next to this binary) on its standard input; the script
// writes the PNG and reports errors itself. Python: $LLM4D_PYTHON, else Debian's /usr/bin/python3
// (where scripts/deps.sh installs matplotlib), else python3 on the PATH.
static int plot_layouts(const PlanInput *in, const Candidate *ys, int n) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len < 0) die("--plot: cannot find this binary's directory: %s", strerror(errno));
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    char script[4200];
    snprintf(script, sizeof script, "%s/scripts/plot.py", exe);
    struct stat st;
    if (stat(script, &st) != 0) die("--plot: %s not found (plots are drawn by scripts/plot.py next to ./train)", script);
    const char *py = getenv("LLM4D_PYTHON");
    if (!py || !*py) py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    int fd[2];
    if (pipe(fd) != 0) die("--plot: pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("--plot: fork: %s", strerror(errno));
    if (pid == 0) {
        if (dup2(fd[0], 0) < 0) die("--plot: dup2: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        execlp(py, py, script, "--plan", "-", "-o", in->plot, (char *)NULL);
        die("--plot: cannot run %s: %s", py, strerror(errno));
    }
    close(fd[0]);
    signal(SIGPIPE, SIG_IGN); // a script that fails early reports why; its exit status is what counts
    FILE *f = fdopen(fd[1], "w");
    if (!f) die("--plot: fdopen: %s", strerror(errno));
    write_json(f, in, ys, n);
    fclose(f);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die("--plot: waitpid: %s", strerror(errno));
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    die("--plot: %s %s was killed by signal %d", py, script, WTERMSIG(status));
}

// ---------------------------------------------------------------------------------------------
// ./train plan comm: one layout's communication per step, traffic class by traffic class, under each
// collective algorithm, in the alpha-beta model (a message of b bytes over a link costs α + b / bw;
// README, "Communication at scale"). Symbols as at the top of this file; for a group of n ranks that
// spans k nodes with l of them on the fullest node, a collective on a buffer of B bytes per rank:
//
//   ring   rank order, each rank sends to the next: 2·(n − 1)/n · B per rank over the slowest link of
//          the ring (across nodes when k > 1); 2·(n − 1) steps one after the other, 2·(k − 1) of
//          them across nodes (NCCL's count): latency 2·(n − k)·α_intra + 2·(k − 1)·α_inter
//   fanin  llm4d's owner fan-in: every rank sends each owner its segment at once: the same bytes, of
//          them 2·(l − 1)/n · B inside the node and 2·(n − l)/n · B across, on different links at
//          the same time (the larger counts); two rounds (reduce-scatter, all-gather): latency 2·α of
//          the slowest link; n − 1 connections per rank and n − l concurrent senders into each NIC
//   hier   fan-in reduce-scatter inside the node, a ring across the k nodes between the ranks that
//          hold the same segment (B / l bytes each, every NIC busy), fan-in all-gather inside:
//          2·(l − 1)/l · B / bw_intra + 2·α_intra (when l > 1) + 2·(k − 1)/k · B/l / bw_inter
//          + 2·(k − 1)·α_inter, the phases one after the other
//
// The traffic classes, per step and GPU of the fullest group (rank 0's):
//   TP  n_ar · Ls · M all-reduces of (m/CP)·C·e bytes over the TP group (the planner's TP term)
//   DP  f/2 all-reduces of the gradients, g·P bytes, over the DP x CP ranks holding the same weights
//       (f = 2, 3 with ZeRO-3: the planner's DP term)
//   PP  2·M hand-offs per stage boundary (activations forward, their gradients backward), each the
//       micro-batch's (m/CP)·C·e bytes split over the TP ranks (sequence parallel); sends and receives
//       overlap (full duplex), so a stage's link carries 2·M·(α + bytes / bw). Not a collective: the
//       algorithms differ only in the connections (over verbs the fan-in's communicator connects
//       every pair when it is made; shared memory and TCP open the neighbours only, on first use)
//   CP  llm4d's ring (the planner's CP term): Ls · M · (f·(CP − 1) + CP) messages, the same under every
//       algorithm except fanin's connections (every pair)
// Connections per rank (of the fullest rank): ring min(2, n − 1), fanin n − 1, hier l − 1 inside the
// node plus min(2, k − 1) across. Staging per rank: every connection across nodes registers
// 2 · VERBS_DEFAULT_SLOTS · verbs_staging_slot_bytes(connections) bytes for RDMA (net_verbs.h: send and
// receive buffers; the budget spread over the connections the algorithm holds, as the transport does), and the connections inside a node share one shared-memory inbox of shm_inbox_bytes(peers
// + 1) (net_shm.c: a 1 MiB ring per peer). Bytes in flight towards one receiving NIC: its concurrent
// senders, each with its VERBS_DEFAULT_SLOTS slots of credit. No incast penalty is modelled: the
// bytes are equal, the counts of connections, staging and senders per NIC are what differs.

enum { ALGO_RING, ALGO_FANIN, ALGO_HIER, NALGO };
static const char *const ALGO_NAMES[NALGO] = { "ring", "fanin", "hier" };
enum { CLS_TP, CLS_PP, CLS_DP, CLS_CP, NCLS };
static const char *const CLASS_NAMES[NCLS] = { "tp", "pp", "dp", "cp" };

// Where a group lies: members a·sa + b·sb (a < na, b < nb, in increasing order), nodes of gpn ranks.
typedef struct {
    int n, local, nodes; // members, members on the fullest node, nodes spanned
} GroupShape;

static GroupShape group_shape(int na, long sa, int nb, long sb, int gpn) {
    GroupShape g = { na * nb, 0, 0 };
    long last = -1;
    int run = 0;
    for (int a = 0; a < na; a++)
        for (int b = 0; b < nb; b++) {
            long node = (a * sa + b * sb) / gpn;
            if (node != last) g.nodes++, run = 0, last = node;
            if (++run > g.local) g.local = run;
        }
    return g;
}

typedef struct {
    GroupShape g;
    int intra;                   // the whole group inside one node
    double ops, bytes;           // collectives (or hand-offs) per step, bytes of each per rank
    double intra_bytes, inter_bytes; // per rank and step, by link
    double lat_s, bw_s, time_s;  // per step
    int conn_intra, conn_inter;  // connections of the fullest rank
    double slot_bytes, registered, shm; // verbs slot size, registered RDMA staging, shared-memory inbox
    int incast;                  // concurrent senders into one receiving NIC
    double inflight;             // bytes in flight towards one receiving NIC
} CommCost;

// One all-reduce of B bytes per rank over g under algorithm a, into c (per collective).
static void allreduce_cost(const PlanInput *in, int a, GroupShape g, double B, CommCost *c) {
    double n = g.n, l = g.local, k = g.nodes, ai = in->intra_lat, ae = in->inter_lat;
    double bi = in->intra_bw, be = in->inter_bw;
    if (g.n == 1) return;
    if (a == ALGO_RING) {
        double bytes = 2 * (n - 1) / n * B;
        *(k > 1 ? &c->inter_bytes : &c->intra_bytes) = bytes;
        c->bw_s = bytes / (k > 1 ? be : bi);
        c->lat_s = 2 * (n - k) * ai + 2 * (k - 1) * ae;
        int conns = g.n - 1 < 2 ? g.n - 1 : 2;
        c->conn_inter = g.nodes == 1 ? 0 : g.local == 1 ? conns : 1;
        c->conn_intra = conns - c->conn_inter;
        c->incast = g.nodes > 1;
    } else if (a == ALGO_FANIN) {
        c->intra_bytes = 2 * (l - 1) / n * B;
        c->inter_bytes = 2 * (n - l) / n * B;
        c->bw_s = fmax(c->intra_bytes / bi, c->inter_bytes / be);
        c->lat_s = 2 * (k > 1 ? ae : ai);
        c->conn_intra = g.local - 1;
        c->conn_inter = g.n - g.local;
        c->incast = g.n - g.local;
    } else {
        c->intra_bytes = 2 * (l - 1) / l * B;
        c->inter_bytes = 2 * (k - 1) / k * B / l;
        c->bw_s = c->intra_bytes / bi + c->inter_bytes / be;
        c->lat_s = (g.local > 1 ? 2 * ai : 0) + 2 * (k - 1) * ae;
        c->conn_intra = g.local - 1;
        c->conn_inter = g.nodes - 1 < 2 ? g.nodes - 1 : 2;
        c->incast = g.nodes > 1;
    }
}

// Per step: scales one collective's bytes and times by its count, and adds the staging the
// connections hold.
static void comm_finish(CommCost *c) {
    c->intra_bytes *= c->ops;
    c->inter_bytes *= c->ops;
    c->lat_s *= c->ops;
    c->bw_s *= c->ops;
    c->time_s = c->lat_s + c->bw_s;
    c->slot_bytes = c->conn_inter ? (double)verbs_staging_slot_bytes(c->conn_intra + c->conn_inter) : 0;
    c->registered = c->conn_inter * 2.0 * VERBS_DEFAULT_SLOTS * c->slot_bytes;
    c->shm = c->conn_intra ? (double)shm_inbox_bytes(c->conn_intra + 1) : 0;
    c->inflight = c->incast * (double)VERBS_DEFAULT_SLOTS * c->slot_bytes;
}

// Point-to-point over a group (PP's hand-offs, CP's ring): msgs messages of `bytes` per step to the
// next rank; connections as the algorithm's communicator holds them (fanin: every pair).
static void p2p_cost(const PlanInput *in, int a, GroupShape g, double msgs, double bytes, CommCost *c) {
    if (g.n == 1) return;
    int inter = g.nodes > 1; // the fullest group's worst boundary
    c->ops = msgs;
    *(inter ? &c->inter_bytes : &c->intra_bytes) = bytes;
    c->bw_s = bytes / (inter ? in->inter_bw : in->intra_bw);
    c->lat_s = inter ? in->inter_lat : in->intra_lat;
    int conns = a == ALGO_FANIN ? g.n - 1 : g.n - 1 < 2 ? g.n - 1 : 2;
    c->conn_inter = !inter ? 0 : a == ALGO_FANIN ? g.n - g.local : g.local == 1 ? conns : 1;
    c->conn_intra = conns - c->conn_inter;
    c->incast = inter; // one sender per link: the previous rank
}

static void comm_model(const PlanInput *in, const Candidate *y, CommCost cost[NCLS][NALGO]) {
    int tp = y->tp, cp = y->cp, pp = y->pp, dp = y->dp, gpn = in->gpus_per_node;
    double e = in->fp32 ? 4 : 2, gb = e, C = in->cfg.C, M = in->micro_batches, Ls = y->layers_per_stage;
    double mc = y->micro_tokens / cp; // a micro-batch's tokens per GPU of a CP group
    GroupShape gs[NCLS] = {
        [CLS_TP] = group_shape(tp, 1, 1, 0, gpn),
        [CLS_PP] = group_shape(pp, (long)tp * cp, 1, 0, gpn),
        [CLS_DP] = group_shape(dp, (long)pp * cp * tp, cp, tp, gpn), // the DP x CP ranks of one (pp, tp)
        [CLS_CP] = group_shape(cp, tp, 1, 0, gpn),
    };
    double n_ar = in->recompute == RECOMPUTE_FULL ? 6 : 4, passes = in->recompute == RECOMPUTE_FULL ? 3 : 2;
    for (int a = 0; a < NALGO; a++) {
        for (int k = 0; k < NCLS; k++) cost[k][a] = (CommCost){ .g = gs[k], .intra = gs[k].nodes == 1 };
        CommCost *c = &cost[CLS_TP][a];
        allreduce_cost(in, a, gs[CLS_TP], mc * C * e, c);
        c->ops = tp > 1 ? n_ar * Ls * M : 0, c->bytes = tp > 1 ? mc * C * e : 0;
        c = &cost[CLS_DP][a];
        allreduce_cost(in, a, gs[CLS_DP], gb * y->params_per_gpu, c);
        c->ops = dp * cp > 1 ? (in->zero == 3 ? 1.5 : 1) : 0, c->bytes = dp * cp > 1 ? gb * y->params_per_gpu : 0;
        c = &cost[CLS_PP][a];
        p2p_cost(in, a, gs[CLS_PP], 2 * M, mc * C * e / tp, c);
        c->bytes = pp > 1 ? mc * C * e / tp : 0;
        // CP: K/V blocks f·(CP − 1) steps, fp32 dK/dV accumulators CP steps, per layer and micro-batch
        c = &cost[CLS_CP][a];
        double kvc = kv_channels(&in->cfg, tp), kv = 2 * mc * kvc * e, dkv = 2 * mc * kvc * 4;
        double msgs = passes * (cp - 1) + cp;
        p2p_cost(in, a, gs[CLS_CP], Ls * M * msgs, (passes * (cp - 1) * kv + cp * dkv) / msgs, c);
        c->bytes = cp > 1 ? (passes * (cp - 1) * kv + cp * dkv) / msgs : 0; // the mean message
        for (int k = 0; k < NCLS; k++) comm_finish(&cost[k][a]);
    }
}

static void comm_json_cost(FILE *f, const CommCost *c) {
    fprintf(f, "{\"group\":%d,\"ranks_per_node\":%d,\"nodes\":%d,\"intra_node\":%s,", c->g.n, c->g.local, c->g.nodes,
            c->intra ? "true" : "false");
    json_num(f, "ops_per_step", c->ops, ",");
    json_num(f, "bytes_per_op", c->bytes, ",");
    json_num(f, "intra_bytes", c->intra_bytes, ",");
    json_num(f, "inter_bytes", c->inter_bytes, ",");
    json_num(f, "latency_s", c->lat_s, ",");
    json_num(f, "bandwidth_s", c->bw_s, ",");
    json_num(f, "time_s", c->time_s, ",");
    fprintf(f, "\"connections_intra\":%d,\"connections_inter\":%d,", c->conn_intra, c->conn_inter);
    json_num(f, "verbs_slot_bytes", c->slot_bytes, ",");
    json_num(f, "registered_bytes", c->registered, ",");
    json_num(f, "shm_bytes", c->shm, ",");
    fprintf(f, "\"incast_senders\":%d,", c->incast);
    json_num(f, "inflight_bytes_per_nic", c->inflight, "}");
}

static int plan_comm(const PlanInput *in) {
    Candidate *ys;
    int n = enumerate_layouts(in, &ys);
    if (n != 1)
        die("plan comm: give one layout: --tp, --pp and --dp (and --cp) with TP x CP x PP x DP = %d, TP <= %d and each "
            "TP group inside a node of %d (%d layouts match)", in->gpus, in->max_tp, in->gpus_per_node, n);
    Candidate *y = &ys[0];
    estimate_seed(in, y);
    CommCost cost[NCLS][NALGO];
    comm_model(in, y, cost);
    // the reference figures (the seed's check): the gradient ring all-reduce over either link, and the compute
    double D = (double)y->dp * y->cp, grad = (in->fp32 ? 4 : 2) * y->params_per_gpu;
    double ar_intra = 2 * (D - 1) / D * grad / in->intra_bw, ar_inter = 2 * (D - 1) / D * grad / in->inter_bw;
    double total[NALGO] = { 0 }, regd[NALGO] = { 0 }, shm[NALGO] = { 0 };
    int conns[NALGO] = { 0 };
    for (int a = 0; a < NALGO; a++)
        for (int k = 0; k < NCLS; k++) {
            const CommCost *c = &cost[k][a];
            total[a] += c->time_s, regd[a] += c->registered, shm[a] += c->shm, conns[a] += c->conn_intra + c->conn_inter;
        }
    if (in->json) {
        printf("{\"layout\":{\"tp\":%d,\"cp\":%d,\"pp\":%d,\"dp\":%d,\"gpus\":%d,\"gpus_per_node\":%d,\"why\":", y->tp, y->cp,
               y->pp, y->dp, in->gpus, in->gpus_per_node);
        if (y->why) printf("\"%s\"},", y->why);
        else printf("null},");
        printf("\"inputs\":{");
        json_num(stdout, "params", in->params, ",");
        json_num(stdout, "batch_tokens", in->batch_tokens, ",");
        printf("\"micro_batches\":%d,\"zero\":%d,\"recompute\":\"%s\",\"dtype\":\"%s\",", in->micro_batches, in->zero,
               RECOMPUTE_NAMES[in->recompute], in->fp32 ? "fp32" : "bf16");
        json_num(stdout, "intra_bw_bytes_per_s", in->intra_bw, ",");
        json_num(stdout, "inter_bw_bytes_per_s", in->inter_bw, ",");
        json_num(stdout, "intra_lat_s", in->intra_lat, ",");
        json_num(stdout, "inter_lat_s", in->inter_lat, ",");
        json_num(stdout, "flops_per_s", in->flops, "},");
        printf("\"reference\":{");
        json_num(stdout, "gradient_bytes", grad, ",");
        json_num(stdout, "dp_allreduce_intra_bw_s", ar_intra, ",");
        json_num(stdout, "dp_allreduce_inter_bw_s", ar_inter, ",");
        json_num(stdout, "compute_s", y->compute_s, "},");
        printf("\"algorithms\":{");
        for (int a = 0; a < NALGO; a++) {
            printf("%s\"%s\":{", a ? "," : "", ALGO_NAMES[a]);
            for (int k = 0; k < NCLS; k++) {
                printf("\"%s\":", CLASS_NAMES[k]);
                comm_json_cost(stdout, &cost[k][a]);
                printf(",");
            }
            json_num(stdout, "time_s", total[a], ",");
            json_num(stdout, "registered_bytes", regd[a], ",");
            json_num(stdout, "shm_bytes", shm[a], ",");
            printf("\"connections\":%d}", conns[a]);
        }
        printf("}}\n");
    } else {
        printf("llm4d plan comm: one optimizer step's communication per GPU, TP %d x CP %d x PP %d x DP %d on %d GPUs, %d per "
               "node (alpha-beta model: README, \"Communication at scale\")\n", y->tp, y->cp, y->pp, y->dp, in->gpus,
               in->gpus_per_node);
        printf("links: inside a node %.4g GB/s and %.4g us per message, across nodes %.4g GB/s and %.4g us (per GPU)\n",
               in->intra_bw / 1e9, in->intra_lat * 1e6, in->inter_bw / 1e9, in->inter_lat * 1e6);
        printf("step: %.0f tokens, %d micro-batches, %.4g parameters per GPU | ZeRO-%d | recompute %s | %s%s%s\n",
               in->batch_tokens, in->micro_batches, y->params_per_gpu, in->zero, RECOMPUTE_NAMES[in->recompute],
               in->fp32 ? "fp32" : "bf16", y->why ? " | note: " : "", y->why ? y->why : "");
        printf("reference: gradients %.3g GB per GPU, their ring all-reduce over %g ranks %.3f s at %.4g GB/s and %.3f s "
               "at %.4g GB/s (bandwidth terms); compute %.2f s\n\n", grad / 1e9, D, ar_intra, in->intra_bw / 1e9, ar_inter,
               in->inter_bw / 1e9, y->compute_s);
        printf("class algo   group/node/nodes   ops/step   MB per op  link     latency s  bandwidth s     time s  conns "
               "(in+across)  verbs MiB  shm MiB  senders/NIC  in flight MiB\n");
        for (int k = 0; k < NCLS; k++)
            for (int a = 0; a < NALGO; a++) {
                const CommCost *c = &cost[k][a];
                char shape[32];
                snprintf(shape, sizeof shape, "%d/%d/%d", c->g.n, c->g.local, c->g.nodes);
                printf("%-5s %-6s %16s %10.6g %11.2f  %-6s %11.5f %12.5f %10.5f  %6d (%d+%d) %10.2f %8.2f %12d %14.2f\n",
                       CLASS_NAMES[k], ALGO_NAMES[a], shape, c->ops, c->bytes / 1e6, c->g.n == 1 ? "-" : c->intra ? "intra" : "inter",
                       c->lat_s, c->bw_s, c->time_s, c->conn_intra + c->conn_inter, c->conn_intra, c->conn_inter,
                       c->registered / 1048576.0, c->shm / 1048576.0, c->incast, c->inflight / 1048576.0);
            }
        printf("\nper step (nothing overlapped), summed over the classes:\n");
        for (int a = 0; a < NALGO; a++)
            printf("  %-6s %8.3f s of communication, %4d connections, %8.2f MiB of registered staging, %6.2f MiB of "
                   "shared memory per rank\n", ALGO_NAMES[a], total[a], conns[a], regd[a] / 1048576.0, shm[a] / 1048576.0);
    }
    if (fflush(stdout) != 0) die("plan: cannot write the output: %s", strerror(errno));
    free(ys);
    return 0;
}

int plan_main(int argc, char **argv) {
    PlanInput in;
    parse_plan(&in, argc, argv);
    if (in.comm) return plan_comm(&in);
    Candidate *ys;
    int n = enumerate_layouts(&in, &ys);
    if (n == 0) // only --tp, --cp, --pp or --dp can exclude TP 1 x CP 1 x PP 1 x DP G
        die("plan: no layout of %d GPUs has the --tp/--cp/--pp/--dp asked for (TP <= %d, each TP group inside a node of %d)",
            in.gpus, in.max_tp, in.gpus_per_node);
    for (int i = 0; i < n; i++) {
        estimate_seed(&in, &ys[i]);
        if (in.exact) estimate_exact(&in, &ys[i]);
    }
    qsort(ys, (size_t)n, sizeof(Candidate), layout_order);
    if (in.json) write_json(stdout, &in, ys, n);
    else print_table(&in, ys, n);
    if (fflush(stdout) != 0) die("plan: cannot write the output: %s", strerror(errno));
    int rc = in.plot ? plot_layouts(&in, ys, n) : 0;
    for (int i = 0; i < n; i++) free(ys[i].stage_bytes);
    free(ys);
    return rc;
}

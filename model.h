// model.h: GPT-2 and the Llama family on one device: parameter layout, initialisation, llm.c model files, forward and
// backward over one micro-batch (whole, or in its input- and weight-gradient halves), and per-category
// memory accounting.
#ifndef LLM4D_MODEL_H
#define LLM4D_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "collectives.h"
#include "context.h"
#include "kernels.h"
#include "layout.h"
#include "mem.h"
#include "timing.h"

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_F32 3
#define MODEL_VERSION_BF16 5

// The architecture (--arch): GPT-2 (LayerNorm, learned positions, GELU MLP, biases, head tied to wte) or
// the Llama family (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases, head tied
// or its own tensor). The struct keeps GPT-2's name; the Llama fields are zero for GPT-2.
enum { ARCH_GPT2, ARCH_LLAMA };
extern const char *const ARCH_NAMES[2];

typedef struct {
    int maxT; // longest sequence the position embedding covers (Llama: the longest trained or allowed)
    int V;    // vocabulary size
    int Vp;   // vocabulary padded for efficient matmuls (≥ V); rows V..Vp-1 of wte are zero
    int L;    // blocks
    int NH;   // heads (query heads); head size C / NH
    int C;    // channels
    int arch; // ARCH_GPT2 or ARCH_LLAMA
    int NKV;  // Llama: key/value heads (NH a multiple of NKV; NKV < NH is grouped-query attention)
    int F;    // Llama: SwiGLU's hidden size (the gate and up projections' rows)
    int tie;  // Llama: 1 when the LM head is wte, 0 when it is its own tensor P_LMHEAD
    float norm_eps;  // Llama: RMSNorm's epsilon
    RopeConfig rope; // Llama: rotary embedding (theta, Llama 3.1's frequency scaling)
} GPT2Config;

// The parameter tensors, GPT-2's 16 in llm.c's file order, then the Llama family's untied head. Per-layer
// tensors are stacked over L. One table serves both architectures; a tensor an architecture lacks has
// size 0 (GPT-2: lmhead, and lmhead of a tied Llama; Llama: wpe and every bias). For Llama the slots mean:
//   wte [Vp, C]   ln1w [L, C] attention RMSNorm   qkvw [L, (NH + 2·NKV)·hs, C] q rows, then k, then v
//   attprojw [L, C, NH·hs]   ln2w [L, C] MLP RMSNorm   fcw [L, 2F, C] gate rows, then up rows
//   fcprojw [L, C, F] (down)   lnfw [C] final RMSNorm   lmhead [Vp, C] (untied only)
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B,
    P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, P_LMHEAD, NUM_PARAM_TENSORS
};
#define NUM_GPT2_TENSORS 16 // llm.c's model files hold these
extern const char *const PARAM_NAMES[NUM_PARAM_TENSORS];

// Activation recompute (--recompute): what a micro-batch keeps from its forward to its backward.
//   none       every intermediate of every block
//   selective  all but the two LayerNorm outputs and GELU's output, which the backward rebuilds from the
//              kept residual stream (a LayerNorm forward) and GELU's kept input (an elementwise GELU);
//              Llama: all but the two RMSNorm outputs (rebuilt from the kept residual stream and the kept
//              1/rms per row) and SwiGLU's output silu(gate)·up (rebuilt from the kept gate|up matmul output)
//   full       only each block's input (the residual stream between blocks); the backward reruns the
//              block's forward up to GELU into scratch shared by all blocks before the block's backward
// The kernels are deterministic, so all three give bitwise the same gradients.
enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL };
extern const char *const RECOMPUTE_NAMES[3];

// Activations of one micro-batch; each per-layer buffer is stacked over L.
typedef struct {
    // With sequence parallelism the residual stream and LayerNorm buffers (encoded, ln1, residual2, ln2,
    // residual3, lnf, their statistics, dresidual, dshard) hold this rank's 1/tp of the B·T rows.
    // Llama: ln1, ln2, lnf are RMSNorm outputs (their *_mean NULL), fch the gate|up output, fch_gelu SwiGLU's.
    void *encoded, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3, *lnf;
    void *partial; // [B·T, C] a row-parallel matmul's partial sums (or the vocab-parallel embedding's)
    void *full;    // [B·T, C] sequence parallelism: a gathered LayerNorm output or residual gradient
    void *dshard;  // sequence parallelism: the reduce-scattered input gradient of a LayerNorm
    float *ln_grad; // [2C] sequence parallelism: one LayerNorm's partial parameter gradients
    int B, T;       // shape of the last forward in this set, which the backward differentiates
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lnf_mean, *lnf_rstd;
    float *lse; // [B, NH/tp, T] per layer: attention's log-sum-exp per row
    float *ce_max, *ce_sum, *ce_target; // cross-entropy row statistics, combined over the vocabulary slices
    void *logits; // [B,T,Vp/tp] (last stage); the backward overwrites it with dlogits (or the forward does, fused)
    float dlogits_scale; // non-zero: the forward already left dlogits for this loss scale in logits
    int32_t *inputs, *targets; // first stage, last stage
    // backward scratch
    void *dresidual, *dbuf_c, *dbuf_4c, *dqkv;
    void *kv_share; // Llama with fewer kv heads than TP ranks: [B·T, NKV·2·hs], every kv head's dK and dV
    // with chunk sets (the layout's chunk_sets, zb-v) a set holds one chunk at a time: the chunk (c0) and
    // its first local block (l0) it holds now, and its head buffers borrowed from GPT2's heads; 0 and 0 else
    int c0, l0;
} Activations;

// One block's activations while they are rebuilt (--recompute), shared by every block, micro-batch and
// chunk: everything from the first LayerNorm's output to GELU's output under full recompute; under
// selective, one LayerNorm output (ln1, used for both) and GELU's output (Llama: RMSNorm's and SwiGLU's).
// Unused fields are NULL.
typedef struct {
    void *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} BlockScratch;

// Inside the trainer the parameters are laid out unit by unit, in the order the forward uses them:
// unit 0 holds the embeddings (wte, wpe), unit 1 + l block l's twelve tensors, unit L + 1 the final
// LayerNorm. Data parallelism buckets, shards and (ZeRO-3) gathers whole units; model files keep
// llm.c's tensor-by-tensor order, converted on load and save.
#define UNIT_EMBED 0

typedef struct {
    GPT2Config cfg;
    DType dt;
    const Backend *be;
    // where this rank sits (layout.h): its tensor-parallel slice, its pipeline stage's blocks, its
    // positions of each sequence under context parallelism, its activation sets; read-only
    const Layout *lay;
    int C_tp, NH_tp;      // channels and heads of this rank's attention and MLP slices (C/TP, NH/TP)
    // the widths of this rank's per-block matmuls (GPT-2: 3C/TP, 4C/TP, 4C/TP; Llama: (NH + 2·NKV)·hs/TP,
    // 2F/TP, F/TP with each kv head on every rank that shares it when NKV < TP): QKV's output rows, the
    // MLP's first matmul's output rows (Llama: gate then up), the MLP's hidden size (the second's input)
    int qkv_tp, fc_tp, mlp_tp;
    int hs, NKV_tp;           // head size; this rank's kv heads (GPT-2: NH_tp)
    int head_k;               // the LM head's tensor: P_WTE (tied) or P_LMHEAD
    int Vp_tp;            // vocabulary rows per rank: ceil(Vp/TP), padded internally
    int v_start, v_real;  // first vocabulary row of this rank, and how many of its rows are real words
    // pipeline parallelism: this stage's nl blocks, in lay->chunks runs; local block chunk_l0[c] + i is
    // global block lay->chunk_first[c] + i. The first stage holds the embedding, the last the head
    // (layout_head_stage: under zb-v the first stage holds both, in its chunks 0 and 1).
    int nl, first, last;
    int chunk_l0[MAX_CHUNKS];
    // context parallelism: this rank holds positions of chunks cp.rank and 2·CP-1-cp.rank of each sequence
    // (T below counts this rank's positions); attention runs round the ring (CP = 1: none)
    CpRing ring;
    size_t logits_bytes;  // the largest logits buffer: B·T·Vp_tp elements
    int B, T;         // largest micro-batch the activation buffers hold
    size_t param_sizes[NUM_PARAM_TENSORS];   // elements of this rank's slice, all layers
    size_t file_offsets[NUM_PARAM_TENSORS];  // offsets of the full tensors in llm.c's file order
    size_t in_unit[NUM_PARAM_TENSORS];       // offset of a tensor (one layer's slice) inside its unit
    int nunits;                              // L + 2
    size_t *unit_offset;                     // [nunits + 1] offsets of the units in the internal order
    size_t num_params;
    void *params;       // working weights in dt (internal order); NULL under ZeRO-3
    void **unit_params; // [nunits] where each unit's working weights are now
    float *grads;       // fp32, internal order, accumulated over micro-batches; NULL when streamed
    float **unit_grads; // [nunits] where each unit's gradients are now (ZeRO-2/3 stream them in buckets)
    // One activation set per micro-batch a pipeline stage keeps in flight (lay->nslots; 1 without
    // pipelining), or with chunk sets one per chunk activation; act is the one forward and backward use
    // now (gpt2_use_slot).
    Activations *slots, *act;
    Activations *heads; // with PP > 1 on the stage holding the head: lay->nheads sets of the head's buffers
    void **grad_bufs;   // lay->ngrads buffers of a stage's input gradient, sent back from (chunk sets)
    BlockScratch rc; // the block being rebuilt
    MemAccount mem;  // every buffer of this rank (zero.c, pipeline.c and ckpt.c allocate through it too)
    StepTimes *times; // the trainer's (timing.h): the model adds its op times and attention FLOPs
    // data-parallel hooks (zero.c sets them with gpt2_set_hooks); NULL when unused
    void *hook_ctx;
    void (*fetch_unit)(void *ctx, int unit); // before a unit's weights are read
    void (*grads_ready)(void *ctx, int unit); // once a unit's gradients are final for this micro-batch
    // the split backward (gpt2_backward_input_chunk): per pending B and chunk, what B kept for W; per
    // chunk, the sets waiting for W in B's order (model.c; allocated with the model when the layout's
    // schedule splits the backward, else on first use)
    struct WStash *wstash;
    struct WQueue *wqueue;
    // the LM head's weight gradient of the last B, pending until gpt2_backward_head_weight (model.c)
    struct WStash *head_now;
    // a rank holding both ends of a pipeline (zb-v's first stage): the head's gradient of its slice of the
    // tied embedding, kept apart until gpt2_join_tied_grads (NULL elsewhere)
    float *head_wte_grad;
} GPT2;

// The full shape of tensor k (llm.c's layout, per-layer tensors stacked over L): its rank (1-3), 0 when
// the architecture lacks it.
int gpt2_tensor_shape(const GPT2Config *cfg, int k, int64_t d[3]);
// Fills sizes and offsets from the shape; returns the total parameter count.
size_t gpt2_param_layout(const GPT2Config *cfg, size_t sizes[NUM_PARAM_TENSORS], size_t offsets[NUM_PARAM_TENSORS]);
// Checks a shape for consistency; on failure writes a reason and returns 0.
int gpt2_config_valid(const GPT2Config *cfg, char *why, size_t why_cap);
// The shape a command line asks for: preset d12|d24|d36|d48 (NULL: d12; GPT-2 124M to 1558M, maxT 1024,
// V 50257), each nonzero value overriding it; a custom shape (no preset) is seq_len long unless
// max_seq_len says otherwise. Vp pads V to a multiple of 128. Dies with one line on a bad preset or shape.
GPT2Config gpt2_shape(const char *preset, int L, int C, int NH, int V, int max_seq_len, int seq_len);
// The shape flags of a command line: 0 (tie -1, arch -1) where not given.
typedef struct {
    int arch, L, C, NH, NKV, F, V, maxT, tie;
    double rope_theta;
    double norm_eps;
    const char *rope_scaling; // --rope-scaling (rope_scaling_parse), NULL: the preset's (a custom shape: none)
} ShapeFlags;
// --rope-scaling none|FACTOR[,LOW,HIGH,ORIG]: Llama 3.1's frequency scaling into r (theta kept): factor
// >= 1, low_freq_factor LOW (default 1) < high_freq_factor HIGH (default 4), original context ORIG
// (default 8192), as HF's rope_type "llama3"; "none" turns it off. 0, or -1 with one line in why.
int rope_scaling_parse(const char *s, RopeConfig *r, char *why, size_t cap);
// r's scaling as --rope-scaling reads it back exactly ("none", or FACTOR,LOW,HIGH,ORIG); returns buf.
const char *rope_scaling_text(const RopeConfig *r, char *buf, size_t cap);
// The shape of either architecture: preset (a GPT-2 d12..d48 or a Llama name; NULL: d12, or llama3.2-1b
// with arch ARCH_LLAMA), each given flag overriding it. A custom Llama shape (no preset) has plain RoPE (no
// Llama 3.1 frequency scaling; a preset keeps its own). One that sets --heads
// without --kv-heads has NKV = NH (multi-head attention), --channels without --ffn has F = 8C/3 rounded up to
// a multiple of 256 (Meta's rule), and is seq_len long unless max_seq_len says otherwise. Dies with one line
// on a bad preset, a Llama flag for GPT-2, or a bad shape.
GPT2Config model_shape(const char *preset, const ShapeFlags *f, int seq_len);
// A Llama preset (llama3-tiny, llama3.2-1b, llama3-8b, llama3-70b, llama3-405b) into cfg; 0 for an
// unknown name.
int llama_preset(const char *name, GPT2Config *cfg);
// Decoupled weight decay applies to matrices only (embeddings and linear weights), never to biases
// or LayerNorm parameters.
int gpt2_param_decays(int tensor);

// GPT-2 initialisation of the full model into host fp32 memory, a pure function of (shape, seed):
// element i of tensor k is drawn from a counter-based generator keyed by (seed, k, i), so any later
// shard of the model sees exactly these values.
float *gpt2_init_params(const GPT2Config *cfg, uint64_t seed);
// llm.c model files. Load returns host fp32 parameters and fills cfg; errors name the file.
// Dies naming source, the tensor and the element when a value of the full vector p is NaN or infinite.
void gpt2_check_finite(const GPT2Config *cfg, const float *p, const char *source);
float *gpt2_load_file(const char *path, GPT2Config *cfg);
// The shape alone (the header, checked against the file's size), without reading the weights.
void gpt2_file_shape(const char *path, GPT2Config *cfg);
void gpt2_save_file(const char *path, const GPT2Config *cfg, const float *host_params);

// Builds this rank's part of the model where lay (kept, read-only, for the model's life) places it: its
// tensor-parallel slice, its stage's blocks, activation sets for micro-batches of lay->B sequences of
// lay->T / CP positions. With own_params 0 the caller (ZeRO-3) provides unit_params instead of a full
// working-weight buffer, and with own_grads 0 (ZeRO-2/3 streaming) unit_grads instead of a full
// gradient buffer. With a dry backend (mem.h) it only counts the buffers it would allocate.
// times: where this model, its ring and its owners (zero.c, pipeline.c) add the step's times.
void gpt2_build(GPT2 *m, const GPT2Config *cfg, DType dt, const Backend *be, const Layout *lay, StepTimes *times,
                int own_params, int own_grads);
// Pipeline stages: choose the activation set of a micro-batch, and the buffers that travel between
// stages (this rank's rows of the residual stream): the input a stage receives, the output it sends,
// and the gradient of its input that its backward leaves for the previous stage.
void gpt2_use_slot(GPT2 *m, int slot);
// Set `slot` holds micro-batch mb's chunk `chunk` from now (its forward comes next) and is the one in
// use, with the head's buffers of mb (the ring of them) where the chunk holds the head;
// gpt2_use_slot(slot) returns to it later.
void gpt2_bind_set(GPT2 *m, int slot, int chunk, int mb);
void *gpt2_stage_input(const GPT2 *m, int chunk);
void *gpt2_stage_output(const GPT2 *m, int chunk);
void *gpt2_stage_grad(const GPT2 *m);
void *gpt2_grad_buffer(const GPT2 *m, int k); // gradient buffer k of the layout's ngrads
size_t gpt2_stage_bytes(const GPT2 *m, int B, int T);
void gpt2_free(GPT2 *m);
int gpt2_unit_of(const GPT2 *m, int tensor, int layer);
// How many slices of a tensor this rank holds: its blocks for per-block tensors, else 1.
int gpt2_tensor_layers(const GPT2 *m, int tensor);
// Where tensor k (layer l for per-layer tensors) lies in the internal order: offset and length.
void gpt2_tensor_range(const GPT2 *m, int k, int l, size_t *off, size_t *len);
// Replicated across the tensor-parallel group (LayerNorms, position embedding, row-parallel biases):
// counted once in the global norm.
int gpt2_tensor_replicated(const GPT2 *m, int tensor);
// Whether this rank's copy of tensor k is the one that counts (in the global norm, in a checkpoint): the
// tied embedding's on the first pipeline stage, a tensor replicated across tensor parallelism on its
// rank 0 (their copies are identical).
int gpt2_tensor_counted(const GPT2 *m, int tensor);
// How many leading elements of each slice (one layer's) of tensor k count on this rank: the whole slice
// or 0 as gpt2_tensor_counted says, except a Llama's qkvw when NKV < TP: its k and v rows (the slice's
// tail) are identical on the TP/NKV ranks sharing the kv head and count on the first of them only.
size_t gpt2_counted_len(const GPT2 *m, int k, size_t slice_len);
// The parts of the tensor slices (tensor k, local layer l) that meet the range [off, off + len) of the
// internal order, tensor by tensor and layer by layer: [a, e) of the internal order, the slice starting
// at start. for (TensorSlice s = GPT2_SLICES; gpt2_next_slice(m, off, len, &s);) visits them.
typedef struct {
    int k, l;
    size_t a, e, start;
} TensorSlice;
#define GPT2_SLICES ((TensorSlice){ .k = 0, .l = -1 })
int gpt2_next_slice(const GPT2 *m, size_t off, size_t len, TensorSlice *s);
// Where unit u's working weights (gradients) are now: the model's own buffers, or zero.c's gathered
// units (streamed buckets) while it holds them; NULL when nowhere.
void gpt2_place_unit_params(GPT2 *m, int unit, void *params);
void gpt2_place_unit_grads(GPT2 *m, int unit, float *grads);
// The data-parallel hooks: fetch before a unit's weights are read, ready once a unit's gradients are
// final for the micro-batch (NULL: none), both called with ctx.
void gpt2_set_hooks(GPT2 *m, void *ctx, void (*fetch)(void *ctx, int unit), void (*ready)(void *ctx, int unit));
// Where element i of this rank's slice of tensor k (local layer l) sits in a full model file, counted
// from the file's first parameter; SIZE_MAX for the internal vocabulary padding past Vp.
size_t gpt2_file_index(const GPT2 *m, int k, int l, size_t i);
// Host fp32 arrays: the full model in file order -> this rank's slice in internal order.
void gpt2_full_to_local(const GPT2 *m, const float *file, float *local);
// The tensor-parallel group's slices -> the full model in file order (collective over the group).
void gpt2_gather_full(const GPT2 *m, const float *local, float *file);
void gpt2_upload_params(GPT2 *m, const float *host_internal); // host fp32 -> working weights (dt)

// Forward over one micro-batch of B sequences of T tokens (host arrays, copied to the device). With context
// parallelism the sequences are this rank's positions (cp_slice), T of them each.
// With targets, returns the mean loss over the B·T tokens; without, returns 0 and leaves the logits.
float gpt2_forward(GPT2 *m, const int32_t *inputs, const int32_t *targets, int B, int T);
// The same for one chunk of this stage's blocks (interleaved pipelines): chunk 0 of the first stage
// embeds, the last chunk of the last stage computes the head and the loss.
// With targets and dloss > 0 (training), the forward also leaves the gradient of loss·dloss with respect
// to the logits for gpt2_backward_chunk (fused with the loss in one pass when one rank holds the whole
// vocabulary); dloss 0 (validation, sampling) leaves the logits.
float gpt2_forward_chunk(GPT2 *m, int chunk, const int32_t *inputs, const int32_t *targets, int B, int T, float dloss);
void gpt2_backward_chunk(GPT2 *m, int chunk, float dloss_scale);
// The same backward in two halves, for zero-bubble schedules (schedule.h). gpt2_backward_input_chunk (B)
// computes the input gradient of the chunk for the micro-batch whose forward used activation set
// `slot` (matmul input gradients, attention and its context-parallel ring with dK/dV, LayerNorms'
// input gradients, the residual path, recompute), leaves it in gpt2_stage_grad for the previous stage,
// and keeps what the weight gradients need: pointers into the activation set, output gradients copied
// into regions of the set B has consumed, the rest copied into model.c's stash (the layout's nstash per
// chunk, else one per activation set); the LayerNorms' dgamma and dbeta it adds itself (they free the
// rows they read). gpt2_backward_weight_chunk (W) then adds that micro-batch's matmul weight and bias
// gradients of the chunk (the embeddings' too) and tells the data-parallel hooks the
// units are ready. B then W gives bitwise gpt2_backward_chunk's gradients (the same kernels on the same
// inputs, each parameter's additions in the same order). Order: W of a
// chunk must take the activation sets in the order their B ran (it dies otherwise), so as long as B
// runs a chunk's micro-batches in order, as every schedule does, each parameter's gradient adds the
// micro-batches in 1F1B's order, whatever the schedule puts between B and W. An activation set is busy
// from its forward to its W: its next forward must wait for W (and B of a set may not run twice
// before its W). The fetch hook runs in both halves (B reads weights, W places streamed gradients).
// The LM head's weight gradient is B's, not W's (it frees the head's buffers, the largest of a stage):
// under SP B adds it before the blocks; otherwise B leaves it pending (only a whole model on one rank,
// test_split's case, keeps it for W, before its tied embedding's):
// gpt2_backward_head_weight adds it, after the caller has sent B's input gradient and before anything
// else uses the model, so that the previous stage's wait for that gradient does not include the
// head's matmul (the largest of a stage), while the head's buffers are still free by the next F.
void gpt2_backward_input_chunk(GPT2 *m, int chunk, int slot, float dloss_scale);
void gpt2_backward_head_weight(GPT2 *m);
void gpt2_backward_weight_chunk(GPT2 *m, int chunk, int slot);
// Backward of the last forward; adds the parameter gradients of loss·dloss_scale into m->grads
// (dloss_scale = 1/(tokens in the global batch), so accumulated micro-batches sum to the batch mean).
void gpt2_backward(GPT2 *m, float dloss_scale);
void gpt2_zero_grad(GPT2 *m);
// A rank holding both ends of a pipeline (zb-v's first stage) keeps the head's gradient of the tied
// embedding apart from the embedding's, as two stages do under 1f1b; once both are final for the step
// (after the last micro-batch's W of both chunks), this adds the head's into the embedding's, as
// 1f1b's all-reduce of the two stages adds them, and tells the data-parallel hooks the unit is ready.
// A no-op on every other rank.
void gpt2_join_tied_grads(GPT2 *m);
void *gpt2_param(const GPT2 *m, int tensor, int layer); // device pointer into the working weights
float *gpt2_grad(const GPT2 *m, int tensor, int layer);  // device pointer to its gradient
// Copies the logits of position t of sequence b (fp32, V entries) to the host after a forward over
// sequences of T positions on this rank (under context parallelism t is the position in the whole
// sequence, and every rank of the group receives the logits). Collective over the tensor- and
// context-parallel groups.
void gpt2_logits_at(GPT2 *m, int b, int t, int T, float *out);

// FLOPs of one forward+backward per token (matmuls and attention, the usual 3x forward estimate; Llama:
// GQA's k and v projections, SwiGLU's three matrices).
double gpt2_flops_per_token(const GPT2Config *cfg, int T);

#endif

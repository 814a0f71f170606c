// kernels.h: every compute op of the model, forward and backward, behind one backend table.
//
// Model and training code never dereference device memory: they allocate through the backend, pass
// device pointers to its ops, and copy to or from the host with to_host/to_device. kernels_cpu.c is
// the reference backend; kernels.cu implements the same table on a CUDA device.
//
// Conventions shared by every backend:
//  - `dt` is the storage dtype of weights, activations and activation gradients (fp32 or bf16);
//    arithmetic is always fp32 (bf16 matmuls multiply bf16 operands exactly and accumulate in fp32).
//    Parameter gradients, optimizer state, LayerNorm statistics, attention log-sum-exps and
//    cross-entropy row statistics are always fp32.
//  - Linear layers follow llm.c: weight[OC][C], out[N][OC] = inp[N][C] · weightᵀ + bias.
//  - Backward ops overwrite activation gradients (dinp) unless documented as accumulating, and always
//    accumulate (+=) into parameter gradients, so micro-batches accumulate without extra copies.
//  - Results never depend on the thread count: every output element is reduced in a fixed order.
#ifndef LLM4D_KERNELS_H
#define LLM4D_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DT_F32 = 0, DT_BF16 = 1 } DType;

static inline size_t dtype_size(DType dt) { return dt == DT_BF16 ? 2 : 4; }
static inline const char *dtype_name(DType dt) { return dt == DT_BF16 ? "bf16" : "fp32"; }

// bf16 is the top half of an fp32; conversion rounds to nearest, ties to even (NaN stays NaN).
static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } x = { .f = f };
    if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40); // quiet NaN
    uint32_t rounding = 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)((x.u + rounding) >> 16);
}
static inline float bf16_to_f32(uint16_t h) {
    union { float f; uint32_t u; } x = { .u = (uint32_t)h << 16 };
    return x.f;
}

// A [B, T, heads, hs] view of queries, keys, values, attention outputs or their gradients: element
// (b, t, h, i) is at p[b*bstride + t*tstride + h*hs + i], stored in dt. Views of inputs point at const
// memory too (p is never written through then).
typedef struct {
    DType dt;
    void *p;
    size_t bstride, tstride;
} AttnView;
// Views of q, k and v (part 0, 1, 2) inside qkv[B,T,3C], of a [B,T,C] tensor, and (grouped-query
// attention) of q (part 0: NH heads), k (1) and v (2: NKV heads each) inside qkv[B, T, (NH + 2·NKV)·hs];
// every backend's attention entry points take their tensors through these.
static inline AttnView qkv_view(DType dt, const void *qkv, int part, int T, int C) {
    AttnView v = { dt, (char *)qkv + (size_t)part * C * dtype_size(dt), (size_t)T * 3 * C, 3 * (size_t)C };
    return v;
}
static inline AttnView btc_view(DType dt, const void *x, int T, int C) {
    AttnView v = { dt, (void *)x, (size_t)T * C, (size_t)C };
    return v;
}
static inline AttnView gqa_view(DType dt, const void *qkv, int part, int T, int NH, int NKV, int hs) {
    size_t row = (size_t)(NH + 2 * NKV) * hs, off = part == 0 ? 0 : part == 1 ? (size_t)NH * hs : (size_t)(NH + NKV) * hs;
    AttnView v = { dt, (char *)qkv + off * dtype_size(dt), (size_t)T * row, row };
    return v;
}

// One tensor's share of an AdamW step (see Backend.adamw).
typedef struct {
    float *master;       // fp32 master weights
    void *working;       // working weights in dt, refreshed from master; NULL when master is the working copy
    const float *grad;   // fp32 gradient
    float *m, *v;        // AdamW moments
    size_t n;
    float weight_decay;  // 0 for tensors that do not decay
} AdamWSegment;

// Where a backend's memory lives. Code that hands buffers to the collectives or copies them asks
// this, never the backend's name: host memory goes to the transports as it is; device memory is
// staged through the host until the CUDA IPC transport moves it in place.
typedef enum { MEMKIND_HOST = 0, MEMKIND_DEVICE } MemKind;

// Streams and events. A backend queues its ops in order on one of two streams, compute (the default)
// and communication; set_stream chooses where the ops that follow go (the memory ops to_device, to_host,
// copy and zero included). Ordering across the streams is explicit: record an event on the stream that
// produced a buffer, make the consuming stream wait for it; neither call waits on the host. The host
// waits only in sync, event_sync and to_host (which waits for the current stream). On the CPU every op
// has finished when it returns, so the stand-ins only keep the bookkeeping below and check the protocol:
// waiting for an event that was never recorded dies (on a GPU it would silently not wait: a race), so
// model and optimizer code that orders its streams correctly on the CPU does so on the GPU too.
typedef enum { STREAM_COMPUTE = 0, STREAM_COMM = 1, NUM_STREAMS = 2 } StreamId;
typedef struct BackendEvent {
    void *handle;      // the device's event (cudaEvent_t); NULL on the CPU
    int stream;        // the stream of the latest record; -1 before the first
    uint64_t records;  // how many times it was recorded
} BackendEvent;

// Rotary position embedding, in the rotate-half convention of Hugging Face's Llama: the head's hs
// channels are two halves, and channel pair (i, i + hs/2) of a token at position p is rotated by the
// angle p·inv_freq[i], inv_freq[i] = theta^(-2i/hs):
//   y[i] = x[i]·cos - x[i + hs/2]·sin,   y[i + hs/2] = x[i + hs/2]·cos + x[i]·sin.
// Llama 3.1's frequency scaling (factor > 0): wavelengths 2π/inv_freq longer than
// original_max_pos/low_freq_factor divide inv_freq by factor, shorter than original_max_pos/high_freq_factor
// keep it, and those between interpolate smoothly (HF's rope_type "llama3"). Angles are computed in double
// from the position and then rounded, so a token's rotation depends on its global position only (a
// context-parallel block at offset q0 rotates exactly as the whole sequence does).
typedef struct {
    double theta;            // rope_theta (Llama 3: 500000)
    double factor;           // Llama 3.1 scaling; 0: none
    double low_freq_factor, high_freq_factor;
    int original_max_pos;    // original_max_position_embeddings of the scaling
} RopeConfig;
// inv_freq[0 .. hs/2) of the config for head size hs (even); host code, shared by every backend
void rope_inv_freq(const RopeConfig *r, int hs, double *inv_freq);

typedef struct Backend {
    const char *name;
    MemKind mem_kind;
    // memory: alloc returns zeroed memory (the CPU backend's is registered host memory, hostmem.h, that
    // the other ranks of a node read in place) or NULL; the caller reports the failure. free waits
    // for the device. to_device returns once the host bytes are taken (the copy may still be queued:
    // the host buffer can be reused at once); to_host returns with the bytes, after the current
    // stream's earlier work; copy and zero are queued like the ops. sync waits for both streams.
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*to_device)(void *dst, const void *host_src, size_t bytes);
    void (*to_host)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *dst, size_t bytes);
    void (*sync)(void);
    void (*set_threads)(int n); // CPU worker threads; ignored by device backends
    // bytes of device memory the backend holds for itself, outside every alloc: grow-only workspaces
    // (GEMM packing and split-K partial sums, reduction partials), which no memory account sees
    // (reported beside the categories)
    size_t (*scratch_bytes)(void);

    // Token and position embedding over a slice of the vocabulary (tensor parallelism splits wte by
    // rows): out[b,t,:] = wte[tok - vstart,:] when vstart <= tok < vstart + vlen, else 0; plus wpe[t,:]
    // when wpe is not NULL.
    void (*encoder_fwd)(DType dt, void *out, const int32_t *tokens, const void *wte, const void *wpe,
                        int B, int T, int C, int vstart, int vlen);
    // dwte[tok - vstart,:] += dout[b,t,:] for tokens in the slice; dwpe[t,:] += dout[b,t,:] when not NULL
    void (*encoder_bwd)(DType dt, float *dwte, float *dwpe, const void *dout, const int32_t *tokens,
                        int B, int T, int C, int vstart, int vlen);
    // LayerNorm over the last dim (eps 1e-5); saves mean and 1/std per row for the backward.
    void (*layernorm_fwd)(DType dt, void *out, float *mean, float *rstd, const void *inp,
                          const void *weight, const void *bias, int N, int C);
    // Fused residual add and LayerNorm in one pass: res = a + b, then out = LayerNorm(res) as
    // layernorm_fwd. res may alias a or b.
    void (*residual_layernorm_fwd)(DType dt, void *res, void *out, float *mean, float *rstd, const void *a,
                                   const void *b, const void *weight, const void *bias, int N, int C);
    // The backward of both: accumulates dinp += ∂L/∂inp, which is the residual stream's gradient (the
    // residual add passes it on unchanged), and dweight/dbias +=, in one pass over the rows. Either half
    // alone: dinp NULL skips the input gradient (weight is then not read), dweight and dbias NULL skip
    // the parameter gradients; each half's bits do not depend on whether the other ran.
    void (*layernorm_bwd)(DType dt, void *dinp, float *dweight, float *dbias, const void *dout,
                          const void *inp, const void *weight, const float *mean, const float *rstd,
                          int N, int C);
    // out[N,OC] = inp[N,C] · weight[OC,C]ᵀ (+ bias[OC] when bias is not NULL). When pre is not NULL the
    // epilogue applies the tanh-approximation GELU: pre = inp·weightᵀ + bias (kept for the backward),
    // out = gelu(pre).
    void (*matmul_fwd)(DType dt, void *out, void *pre, const void *inp, const void *weight, const void *bias,
                       int N, int C, int OC);
    // dinp = dout · weight (overwritten; skipped when dinp is NULL), multiplied by gelu'(gelu_pre) when
    // gelu_pre is not NULL (inp was gelu(gelu_pre): dinp is then the gradient of gelu_pre);
    // dweight += doutᵀ · inp (skipped when dweight is NULL); dbias += column sums of dout (skipped when
    // dbias is NULL). The backward's input and weight halves (model.h) call it once each.
    void (*matmul_bwd)(DType dt, void *dinp, float *dweight, float *dbias, const void *dout,
                       const void *inp, const void *weight, const void *gelu_pre, int N, int C, int OC);
    // out[i] = gelu(inp[i]) (tanh approximation), bitwise what matmul_fwd's GELU epilogue stores for the same
    // stored pre-activation (selective recompute rebuilds GELU's output from its kept input)
    void (*gelu_fwd)(DType dt, void *out, const void *inp, size_t n);
    // Causal multi-head attention, flash style (no T x T buffer). qkv[B,T,3C] holds q, k, v, each
    // [NH heads][C/NH]; out[B,T,C]; lse[B,NH,T] (fp32) keeps each row's log-sum-exp of the scaled
    // scores for the backward.
    void (*attention_fwd)(DType dt, void *out, float *lse, const void *qkv, int B, int T, int C, int NH);
    // dqkv overwritten; recomputes the probabilities tile by tile from qkv and lse.
    void (*attention_bwd)(DType dt, void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int B, int T, int C, int NH);
    // The building block of both, for context parallelism: Tq queries at sequence positions q0.. against
    // Tk keys and values at positions k0.. (key s is visible to query t when k0 + s <= q0 + t), NH heads
    // of hs channels, scores scaled by 1/sqrt(hs). With merge 0 it writes the block's normalised output
    // and per-row log-sum-exp lse[B,NH,Tq] (rows that see no key: output 0, lse -inf). With merge 1 it
    // combines the block into the (out, lse) already there by the log-sum-exp rule, so that merging the
    // key blocks in any fixed order gives attention over their union (fp32 accumulators recommended).
    void (*attention_block_fwd)(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH,
                                int hs, int Tq, int q0, int Tk, int k0, int merge);
    // The matching backward of one (query block, key block) pair, given the final out and lse of the
    // query rows (after every key block was merged) and dout: dq += ∂L/∂q, dk += ∂L/∂k, dv += ∂L/∂v
    // (accumulated, so the caller sums the pairs in a fixed order).
    void (*attention_block_bwd)(AttnView dq, AttnView dk, AttnView dv, AttnView dout, AttnView out,
                                const float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int hs,
                                int Tq, int q0, int Tk, int k0);
    // ---- the Llama family (issue 27), in both backends.
    // RMSNorm over the last dim: out = inp·rstd·weight, rstd = 1/sqrt(mean(inp²) + eps), saved per row
    // (fp32) for the backward.
    void (*rmsnorm_fwd)(DType dt, void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps);
    // Fused residual add and RMSNorm: res = a + b (res may alias a or b), out = RMSNorm(res) as rmsnorm_fwd
    // of the stored res.
    void (*residual_rmsnorm_fwd)(DType dt, void *res, void *out, float *rstd, const void *a, const void *b,
                                 const void *weight, int N, int C, float eps);
    // The backward of both, as layernorm_bwd: dinp += ∂L/∂inp (the residual stream's gradient), dweight +=; either
    // half alone (dinp NULL: weight not read; dweight NULL), each half's bits independent of the other.
    void (*rmsnorm_bwd)(DType dt, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                        const float *rstd, int N, int C);
    // RoPE in place on x viewed as [B, T, nheads, hs] (AttnView): token t of every sequence is at position
    // pos[t] (pos: T int32 in the backend's memory, as tokens are) or pos0 + t when pos is NULL. rope_bwd
    // applies the transposed rotation (the gradient of the unrotated input from that of the rotated one).
    void (*rope_fwd)(AttnView x, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope);
    void (*rope_bwd)(AttnView dx, int B, int T, int nheads, int hs, const int32_t *pos, int pos0, const RopeConfig *rope);
    // SwiGLU's activation: gateup[N, 2F] holds per row the gate projection (columns 0..F-1) then the up
    // projection (F..2F-1); out[N, F] = silu(gate)·up. The backward overwrites dgateup[N, 2F] with
    // ∂L/∂gate = dout·up·silu'(gate) and ∂L/∂up = dout·silu(gate).
    void (*swiglu_fwd)(DType dt, void *out, const void *gateup, int N, int F);
    void (*swiglu_bwd)(DType dt, void *dgateup, const void *dout, const void *gateup, int N, int F);
    // Grouped-query attention: the block ops above with NH query heads sharing NKV key/value heads (NH a
    // multiple of NKV; query head h reads kv head h / (NH/NKV)); k, v (and dk, dv) are views of NKV heads.
    // K and V are read once per kv head, never copied per query head; the backward sums dK and dV over the
    // group's query heads in head order (deterministic). With rope not NULL, q and k are given unrotated
    // and rotated in the prologue at their global positions (query t at q0 + t, key s at k0 + s), and the
    // backward's dq, dk are the gradients of the unrotated inputs; so context parallelism's ring passes K
    // unrotated and every block rotates by position. NKV = NH with rope NULL is attention_block_fwd/bwd.
    void (*attention_gqa_block_fwd)(AttnView out, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int NKV,
                                    int hs, int Tq, int q0, int Tk, int k0, const RopeConfig *rope, int merge);
    void (*attention_gqa_block_bwd)(AttnView dq, AttnView dk, AttnView dv, AttnView dout, AttnView out, const float *lse,
                                    AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int Tq, int q0,
                                    int Tk, int k0, const RopeConfig *rope);
    // Whole sequences: qkv[B, T, (NH + 2·NKV)·hs] holds per token q (NH heads), k (NKV heads), v (NKV
    // heads), as one fused QKV projection writes them; out[B, T, NH·hs], lse[B, NH, T]; rope as above
    // (NULL: none); the backward overwrites dqkv.
    void (*attention_gqa_fwd)(DType dt, void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV, int hs,
                              const RopeConfig *rope);
    void (*attention_gqa_bwd)(DType dt, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int B, int T, int NH, int NKV, int hs, const RopeConfig *rope);
    // out = a + b
    void (*residual_fwd)(DType dt, void *out, const void *a, const void *b, size_t n);
    // dst += src (the residual's backward: the gradient flows unchanged into both branches)
    void (*residual_bwd)(DType dt, void *dst, const void *src, size_t n);
    // Softmax cross-entropy over a vocabulary that may be split across ranks. logits[N, Vloc] hold
    // columns vstart..vstart+Vloc-1 of the (padded) vocabulary, of which the first vreal are real words
    // (padding never counts). Per row: rowmax = max over the real local columns (-inf when none),
    // rowsum = Σ exp(x - rowmax), target = the target's logit when this slice holds it, else 0.
    // The caller combines the slices: loss = log Σ_r rowsum_r·exp(rowmax_r - M) + M - target, M = max_r rowmax_r.
    void (*crossentropy_stats)(DType dt, float *rowmax, float *rowsum, float *target, const void *logits,
                               const int32_t *targets, int N, int vstart, int vreal, int Vloc);
    // dlogits = (exp(x - gmax[n]) / gsum[n] - onehot(target)) * dloss on real columns, 0 on padding;
    // dlogits may alias logits.
    void (*crossentropy_bwd)(DType dt, void *dlogits, const void *logits, const int32_t *targets,
                             const float *gmax, const float *gsum, float dloss, int N, int vstart, int vreal,
                             int Vloc);
    // Both in one pass over the logits when one slice holds the whole vocabulary: the row statistics of
    // crossentropy_stats, and dlogits as crossentropy_bwd with gmax = rowmax, gsum = rowsum (bitwise the
    // same results); no probabilities are kept. dlogits may alias logits.
    void (*crossentropy_fused)(DType dt, void *dlogits, float *rowmax, float *rowsum, float *target,
                               const void *logits, const int32_t *targets, float dloss, int N, int vreal,
                               int Vloc);
    // AdamW over every segment in one pass, with bias-corrected moments and decoupled weight decay:
    //   g = grad*grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²
    //   master = master*(1 - lr*wd) - lr * (m/bc1) / (sqrt(v/bc2) + eps)
    // and, when working is not NULL, working = master rounded to dt. segs is host memory.
    void (*adamw)(DType dt, const AdamWSegment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                  float bc1, float bc2, float grad_scale);
    // Σ x² in double, summed in a fixed order (the same for every thread count).
    double (*sumsq)(const float *x, size_t n);
    // *acc += Σ x² on the device (acc: one double in device memory), the same sum as sumsq and bitwise
    // what `*acc += sumsq(x, n)` gives, without a read back: a step sums every tensor slice and reads
    // the total once.
    void (*sumsq_acc)(double *acc, const float *x, size_t n);
    // dst = src converted between dtypes (round to nearest even into bf16)
    void (*cast)(void *dst, DType dst_dt, const void *src, DType src_dt, size_t n);
    // The same on rows of strided matrices: dst[r·dst_stride + i] = src[r·src_stride + i] for r < rows,
    // i < n (strides in elements). Context parallelism packs K and V out of qkv with it, and writes its
    // fp32 dq, dk, dv accumulators back into dqkv.
    void (*cast_rows)(void *dst, DType dst_dt, size_t dst_stride, const void *src, DType src_dt, size_t src_stride,
                      size_t rows, size_t n);

    // streams and events (see StreamId above)
    StreamId (*set_stream)(StreamId s); // returns the stream it replaces
    BackendEvent *(*event_create)(void);
    void (*event_destroy)(BackendEvent *e);
    void (*event_record)(BackendEvent *e, StreamId s); // after the work queued on s so far
    void (*stream_wait)(StreamId s, BackendEvent *e);  // work queued on s from now on waits for e
    void (*event_sync)(BackendEvent *e);               // the host waits for e
    int (*event_done)(BackendEvent *e);                // 1 when e has completed (no waiting)
} Backend;

// The protocol checks shared by every backend's stand-ins (kernels_cpu.c): a stream id is valid, an
// event is recorded before anything waits for it. `op` names the call in the one-line error.
StreamId backend_stream_check(int s, const char *op);
void backend_event_check(const BackendEvent *e, const char *op);
// Bookkeeping of one record of e on s.
void backend_event_note(BackendEvent *e, StreamId s);

const Backend *backend_cpu(void);
// The CPU backend's instruction set for bf16 matmuls: "avx512bf16" (bf16 operands multiplied by the
// AVX512-BF16 dot-product instruction, fp32 accumulation) or "generic" (bf16 operands widened to fp32
// while packing, fp32 FMA). cpu_select_isa(NULL) takes the best this CPU has; a name forces that path.
// Returns the name now in use, or NULL (nothing changed) when the name is unknown or the CPU lacks it.
const char *cpu_select_isa(const char *name);
const char *cpu_isa(void);
// Number of usable CUDA devices: 0 when the binary was built without CUDA or no device answers.
// Creates no context on any device (it only initialises the driver), so every rank can call it before
// it has chosen its device.
int cuda_device_count(void);
void cuda_unavailable_reason(char *buf, size_t cap); // why the count is 0, for an error line
// Makes device `ordinal` this process's device (one rank per GPU) and creates the context, streams and
// scratch there; call it before the first op. Without it the first op initialises device 0. No-op
// without CUDA.
void cuda_use_device(int ordinal);
// The CUDA backend's stream s as a cudaStream_t (net_ipc.cu queues the collectives' device work on
// STREAM_COMM and records on STREAM_COMPUTE with it, from the progress threads). CUDA builds only.
void *cuda_stream_handle(StreamId s);
// The CUDA backend's table; NULL when this binary was built without CUDA. Touches no device: calling it
// before cuda_use_device creates nothing on device 0.
const Backend *backend_cuda(void);

#endif

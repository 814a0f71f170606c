// context.h: context parallelism (--cp N), the fourth axis: one sequence's positions split over N ranks.
//
// Each sequence of T tokens is cut into 2N chunks of c = T/(2N) positions; rank r of the context-parallel
// group holds chunks r and 2N-1-r (the "zigzag" split: causal attention gives late chunks more keys,
// and pairing an early chunk with a late one gives every rank the same work). A rank's local sequence is
// its two chunks, 2c = T/N positions, and everything position-wise (embeddings at their true positions,
// LayerNorms, MLPs, the loss) runs on them alone. Attention needs every earlier key: the ranks pass their
// K/V blocks round a ring, N-1 steps, each step's transfer overlapped with the attention of the block
// already present, merging the partial outputs by the log-sum-exp rule in ring order. The backward runs
// the same ring and sends each block's dK/dV accumulator along with it, so that after N steps it returns
// to its owner holding every rank's contribution, added in ring order. Every sum runs in a fixed order:
// reruns are bitwise identical.
#ifndef LLM4D_CONTEXT_H
#define LLM4D_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "collectives.h"
#include "kernels.h"
#include "layout.h"
#include "timing.h"

typedef struct {
    // the group (lay->cp) and this rank's place in it; the group twice: K/V blocks travel on lay->cp.comm,
    // dK/dV accumulators on lay->cp_grad, so that each channel carries one kind of message in ring order
    const Layout *lay;
    const Backend *be;
    DType dt;
    // scratch for the largest micro-batch (model.c allocates it): K/V blocks [B, T, 2C] in dt, the one in
    // use and the one arriving; an fp32 [B, T, C] accumulator of the output (forward) or of dq (backward);
    // fp32 [B, T, 2C] dK/dV accumulators, two travelling and one for this rank's own share of a step. They
    // come from the backend's allocator, as the pipeline's hand-off buffers do: on the CPU that is registered
    // memory (hostmem.h), which the next rank on the node reads in place (single-copy); on a GPU device
    // memory, which the ring's communicators move in place (devmem.h), each transfer starting after the
    // kernels queued before it and complete once its copies are
    void *kvbuf[2];
    float *acc, *dkv[2], *dkv_part;
    StepTimes *times; // the ring adds its waits for transfers to times->ring_wait_s
} CpRing;

// Where local chunk j (0 or 1) of rank r of n starts in its sequence, for local sequences of T positions.
static inline int cp_chunk_start(int T, int n, int r, int j) { return (j ? 2 * n - 1 - r : r) * (T / 2); }

// This rank's positions of nseq sequences: full holds nseq x T·n tokens, local receives nseq x T.
void cp_slice(const int32_t *full, int32_t *local, int nseq, int T, int n, int r);

// Query-key pairs causal attention computes between Tq queries at positions q0.. and Tk keys at k0..
double causal_pairs(int Tq, int q0, int Tk, int k0);

// Ring attention over this rank's local sequences (B x T positions, qkv [B, T, C + 2·NKV·C/NH] with NH
// query heads of C/NH channels, then NKV key heads, then NKV value heads): out [B, T, C] and lse
// [2][B][NH][T/2] (one block per local chunk) as attention_fwd leaves them, and its backward, which
// overwrites dqkv. The ring passes the NKV heads' K and V (grouped-query attention cuts its bytes by
// NH/NKV); with rope (Llama) q and k travel unrotated and every block rotates them at its chunks' global
// positions; NKV = NH with rope NULL is GPT-2's attention. Collective over the group. Each returns the
// query-key pairs it computed per sequence and head (for FLOP counts).
double cp_attention_fwd(CpRing *r, void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int NKV,
                        const RopeConfig *rope);
double cp_attention_bwd(CpRing *r, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse, int B,
                        int T, int C, int NH, int NKV, const RopeConfig *rope);

#endif

// zero.h: data parallelism and the optimizer: gradient buckets reduced across the data-parallel group
// while the backward runs, fp32 master weights and AdamW moments sharded by ZeRO stage, the global
// gradient norm and clipping, and the update. With context parallelism that group is the DP x CP ranks,
// which all hold the same weights.
//
// Buckets are contiguous ranges of whole units (see model.h), formed in backward order. Within bucket
// b of n elements, data-parallel rank d owns the segment [d·⌈n/DP⌉, (d+1)·⌈n/DP⌉) ∩ [0, n): the one a
// reduce-scatter leaves on it. The collectives add the ranks' gradients in rank order element by
// element, so every stage and every bucket size gives bitwise identical parameters for a given DP size.
//   ZeRO-0: gradients all-reduced; every rank keeps full master weights and moments.
//   ZeRO-1: gradients reduce-scattered; each rank keeps and updates only its shard of the master
//           weights and moments, then the updated working weights are all-gathered, bucket by bucket
//           in the order the next forward uses them; the forward waits for each bucket just before
//           its first unit, so the gathers overlap it.
//   ZeRO-2: as 1, and only the shard of the reduced gradient is kept (see README for its memory).
//   ZeRO-3: as 2, and the working weights are sharded too: each unit is all-gathered just before the
//           forward or backward needs it (the next one prefetched) and released afterwards.
#ifndef LLM4D_ZERO_H
#define LLM4D_ZERO_H

#include "collectives.h"
#include "model.h"

typedef struct {
    float beta1, beta2, eps, weight_decay;
    float clip; // global-norm clipping threshold; 0 disables it
} AdamWConfig;

typedef struct ZeroSlot ZeroSlot;

typedef struct {
    AdamWConfig cfg;
    GPT2 *model;
    int stage;
    Comm *dp; // the layout's replicas (layout.h): NULL when there is one
    int dp_rank, dp_size;
    // buckets
    int nbuckets;
    size_t *bstart, *blen;   // in elements of the internal order
    // A bucket is reduced once every unit of it that holds gradients on this stage has said "ready" in the
    // micro-batch: its lowest unit is not always the last (zb-v's stages hold two chunks; a unit can be
    // empty on a stage, e.g. the embedding where neither end of the model is)
    int *bucket_units;       // units of each bucket with gradients here
    int *bucket_units_left;  // of those, not ready yet in this step's last micro-batch
    int *unit_bucket;        // [nunits]
    size_t *own_off, *own_len, *shard_pos; // this rank's segment of each bucket, and where it sits in the shard
    size_t shard_elems;
    CommRequest **breq;
    CommRequest **wreq;     // ZeRO-1/2: the working weights' all-gather of each bucket, until awaited
    CommRequest *embed_req; // pipeline: the sum of the tied embedding's gradients over the end stages
    int embed_bucket;       // the bucket whose reduction waits for it (-1: none)
    // state: sharded (stage ≥ 1) or full (stage 0); master aliases the working weights for fp32 stage 0
    float *master, *m, *v;
    int master_owned;
    void *wshard; // ZeRO-3: this rank's shard of the working weights
    float *gshard; // ZeRO-2/3: this rank's shard of the reduced gradient
    // ZeRO-2/3 with one micro-batch stream gradients: each bucket's gradients live in a pool buffer
    // from its first write in the backward until its reduce-scatter has finished
    int stream, npool;
    float **pool;
    int *pool_bucket;  // bucket held by each pool buffer, -1 when free
    float **bucket_buf; // [nbuckets] pool buffer of a bucket, NULL when none
    int t;        // updates taken
    // ZeRO-3 gather slots
    int nslots;
    ZeroSlot *slots;
    int backward; // the train loop says which pass is running (prefetch direction)
    int weights_only; // a W pass apart from its B (pipeline.c): it reads no weights, so ZeRO-3 gathers none
    int gathers;  // ZeRO-3: units gathered this step (recompute adds none: see model.c)
    int last_micro; // reductions start only during the last micro-batch's backward
    uint64_t use_clock;
    int last_unit; // the unit fetched before, to tell the head's use of the embeddings from the encoder's
    // timing of the current step
    double comm_busy_at_start;
    StepTimes *times; // the model's: ZeRO adds its waits for the collectives (exposed communication)
} Zero;

// Sets up buckets and shards for the model, installs the model's hooks, and initialises the state
// from host fp32 parameters in the internal order (under ZeRO-3 this also fills the weight shards).
// Whether ZeRO stage `stage` streams gradients under layout l (then the model is built without a full
// gradient buffer): one micro-batch, several data-parallel ranks, B and W together. With several
// micro-batches the gradients accumulate locally and are reduced once, after the last, so that every
// stage computes bitwise the same step; a split schedule (zb-h1, zb-v) holds them all from B to W.
int zero_streams_gradients(int stage, const Layout *l);
// The group, the stage, the bucket size and the micro-batches per step come from the model's layout
// (model->lay->replicas: NULL communicator for one rank, or in a dry build, which only counts the
// buffers: see mem.h; host_params may then be NULL).
void zero_init(Zero *z, GPT2 *model, const float *host_params, const AdamWConfig *cfg);
void zero_free(Zero *z);
// Before the micro-batches of a step / before each backward.
void zero_begin_step(Zero *z);
void zero_begin_forward(Zero *z);
void zero_begin_backward(Zero *z, int last_micro);
// A W pass (gpt2_backward_weight_chunk) apart from its B, or the LM head's weight gradient after B's send
// (gpt2_backward_head_weight): gradients only, no weights to gather.
void zero_begin_weights(Zero *z, int last_micro);
// After the last backward: waits for the reductions; returns ‖g‖₂ of the reduced gradient.
float zero_finish_grads(Zero *z);
// AdamW at learning rate lr with clipping against grad_norm; refreshes the working weights (under
// ZeRO-1/2 asynchronously: the model's fetch hook, zero_wait_weights or the next zero_step waits).
void zero_step(Zero *z, float lr, float grad_norm);
// Waits until every working weight is current (anything that reads m->params outside a forward).
void zero_wait_weights(Zero *z);
// Milliseconds this step spent in data-parallel collectives (the waits for them: StepTimes.zero_wait_s).
double zero_comm_ms(const Zero *z);
// The full fp32 master weights in internal order, gathered onto every rank's host array.
void zero_gather_master(Zero *z, float *host);
// Checkpoints: each data-parallel rank owns, at every stage, the segment own_off[b] + [0, own_len[b])
// of each bucket b (at stage 0 the others hold copies of it), placed at shard_pos[b] of a vector of
// shard_elems. Copies this rank's segments of the fp32 master weights and AdamW moments into host
// arrays of shard_elems, in that order.
void zero_state_to_host(const Zero *z, float *master, float *m, float *v);
// Sets the AdamW moments from host arrays of this rank's whole slice (internal order; each rank keeps
// its segments) and the update count t (bias correction). The master weights come through zero_init.
void zero_set_moments(Zero *z, const float *m, const float *v, int t);
// Sums a per-rank double over the data-parallel group in rank order (the same on every rank).
double zero_sum_double(Zero *z, double x);

#endif

// zero.c: data-parallel gradient reduction, ZeRO sharding and AdamW (see zero.h).
#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct ZeroSlot {
    void *buf;    // one bucket of working weights, gathered
    int bucket;   // -1: empty
    CommRequest *req; // in-flight gather, NULL when complete
    uint64_t used;    // last use, for eviction
};

static CommType dt_comm(DType dt) { return dt == DT_BF16 ? CT_BF16 : CT_F32; }
static void *at(const void *base, size_t elems, DType dt) { return (char *)base + elems * dtype_size(dt); }

// ---------------------------------------------------------------------------------------------
// buckets and shards

static void build_buckets(Zero *z, double bucket_mb) {
    GPT2 *m = z->model;
    int nu = m->nunits;
    // ZeRO-3 gathers what the next unit needs, so its buckets are single units
    size_t limit = z->stage == 3 ? 1 : (bucket_mb <= 0 ? (size_t)-1 : (size_t)(bucket_mb * 1048576.0 / sizeof(float)));
    z->bstart = xmalloc(sizeof(size_t) * nu);
    z->blen = xmalloc(sizeof(size_t) * nu);
    z->bucket_units = xcalloc((size_t)nu, sizeof(int));
    z->bucket_units_left = xcalloc((size_t)nu, sizeof(int));
    z->unit_bucket = xmalloc(sizeof(int) * nu);
    int nb = 0;
    int hi = nu - 1;
    while (hi >= 0) { // backward order: the last units' gradients are ready first
        int lo = hi;
        while (lo > 0 && m->unit_offset[hi + 1] - m->unit_offset[lo] < limit) lo--;
        if (m->unit_offset[hi + 1] - m->unit_offset[lo] > limit && lo < hi) lo++;
        z->bstart[nb] = m->unit_offset[lo];
        z->blen[nb] = m->unit_offset[hi + 1] - m->unit_offset[lo];
        for (int u = lo; u <= hi; u++) {
            z->unit_bucket[u] = nb;
            z->bucket_units[nb] += m->unit_offset[u + 1] > m->unit_offset[u];
        }
        z->bucket_units_left[nb] = z->bucket_units[nb];
        nb++;
        hi = lo - 1;
    }
    z->nbuckets = nb;
    z->own_off = xmalloc(sizeof(size_t) * nb);
    z->own_len = xmalloc(sizeof(size_t) * nb);
    z->shard_pos = xmalloc(sizeof(size_t) * nb);
    z->breq = xcalloc((size_t)nb, sizeof(CommRequest *));
    size_t pos = 0;
    for (int b = 0; b < nb; b++) {
        size_t seg = (z->blen[b] + z->dp_size - 1) / z->dp_size;
        size_t a = (size_t)z->dp_rank * seg, e = a + seg;
        if (a > z->blen[b]) a = z->blen[b];
        if (e > z->blen[b]) e = z->blen[b];
        z->own_off[b] = z->bstart[b] + a;
        z->own_len[b] = e - a;
        z->shard_pos[b] = pos;
        pos += z->own_len[b];
    }
    z->shard_elems = pos;
}

// ---------------------------------------------------------------------------------------------
// ZeRO-3: gathering units on demand

static ZeroSlot *slot_of(Zero *z, int bucket) {
    for (int s = 0; s < z->nslots; s++)
        if (z->slots[s].bucket == bucket) return &z->slots[s];
    return NULL;
}

static void slot_wait(Zero *z, ZeroSlot *s) {
    wait_timed(&s->req, &z->times->zero_wait_s);
}

static ZeroSlot *gather_bucket(Zero *z, int b, int protect) {
    ZeroSlot *s = slot_of(z, b);
    if (s) return s;
    ZeroSlot *victim = NULL;
    for (int i = 0; i < z->nslots; i++) {
        ZeroSlot *c = &z->slots[i];
        if (c->bucket == protect && protect >= 0) continue;
        if (!victim || c->bucket < 0 || (victim->bucket >= 0 && c->used < victim->used)) victim = c;
    }
    slot_wait(z, victim);
    GPT2 *m = z->model;
    if (victim->bucket >= 0) {
        for (int u = 0; u < m->nunits; u++)
            if (z->unit_bucket[u] == victim->bucket) gpt2_place_unit_params(m, u, NULL);
    }
    victim->bucket = b;
    victim->used = ++z->use_clock;
    z->gathers++;
    victim->req = comm_iall_gather(z->dp, at(z->wshard, z->shard_pos[b], m->dt), victim->buf, z->blen[b], dt_comm(m->dt));
    return victim;
}

// ZeRO-2/3 streaming: a pool buffer for the unit's bucket, zeroed, before its first gradient write.
static void grads_acquire(Zero *z, int unit) {
    GPT2 *m = z->model;
    int b = z->unit_bucket[unit];
    if (z->bucket_buf[b]) return;
    int s = -1;
    for (int i = 0; i < z->npool && s < 0; i++)
        if (z->pool_bucket[i] < 0) s = i;
    // none free: reclaim the buffer whose reduction was issued first (buckets are issued in order)
    for (int i = 0; i < z->npool && s < 0; i++) {
        int hb = z->pool_bucket[i];
        if (z->breq[hb] == NULL) continue; // still being written by this backward
        wait_timed(&z->breq[hb], &z->times->zero_wait_s);
        s = i;
    }
    if (s < 0) die("internal: ZeRO gradient pool exhausted (%d buffers)", z->npool);
    int old = z->pool_bucket[s];
    if (old >= 0) {
        z->bucket_buf[old] = NULL;
        for (int u = 0; u < m->nunits; u++)
            if (z->unit_bucket[u] == old) gpt2_place_unit_grads(m, u, NULL);
    }
    z->pool_bucket[s] = b;
    z->bucket_buf[b] = z->pool[s];
    m->be->zero(z->pool[s], z->blen[b] * sizeof(float));
    for (int u = 0; u < m->nunits; u++)
        if (z->unit_bucket[u] == b) gpt2_place_unit_grads(m, u, z->pool[s] + (m->unit_offset[u] - z->bstart[b]));
}

static void wait_weights_of(Zero *z, int b) {
    if (z->wreq) wait_timed(&z->wreq[b], &z->times->zero_wait_s);
}

void zero_wait_weights(Zero *z) {
    for (int b = 0; z->wreq && b < z->nbuckets; b++) wait_weights_of(z, b);
}

static void fetch_unit(void *ctx, int unit) {
    Zero *z = ctx;
    if (z->stream && z->backward) grads_acquire(z, unit);
    wait_weights_of(z, z->unit_bucket[unit]); // ZeRO-1/2: the last update's gather of this bucket
    if (z->stage != 3 || z->weights_only) return;
    GPT2 *m = z->model;
    int b = z->unit_bucket[unit];
    ZeroSlot *s = gather_bucket(z, b, -1);
    slot_wait(z, s);
    s->used = ++z->use_clock;
    gpt2_place_unit_params(m, unit, at(s->buf, m->unit_offset[unit] - z->bstart[b], m->dt));
    // prefetch the unit the pass needs next, so that its gather overlaps this unit's compute. The
    // forward visits 0, 1, ..., L+1 and then 0 again for the tied head; the backward visits 0 (the
    // head), L+1, L, ..., 1 (the embedding's own gradient needs no weights).
    int L = m->nl, next;
    if (z->backward) next = unit == UNIT_EMBED ? L + 1 : unit - 1;
    else if (unit == UNIT_EMBED) next = z->last_unit == L + 1 ? L + 1 : 1;
    else next = unit == L + 1 ? UNIT_EMBED : unit + 1;
    z->last_unit = unit;
    if (next >= 0 && !(z->backward && unit == 1)) gather_bucket(z, z->unit_bucket[next], b);
}

// ---------------------------------------------------------------------------------------------
// gradient reduction, started as soon as a bucket's gradients are final

static void launch_bucket(Zero *z, int b) {
    float *g = z->stream ? z->bucket_buf[b] : z->model->grads + z->bstart[b];
    if (z->stage == 0) z->breq[b] = comm_iall_reduce(z->dp, g, g, z->blen[b], CT_F32, OP_SUM);
    else if (z->stage == 1) z->breq[b] = comm_ireduce_scatter(z->dp, g, z->model->grads + z->own_off[b], z->blen[b], CT_F32, OP_SUM);
    else z->breq[b] = comm_ireduce_scatter(z->dp, g, z->gshard + z->shard_pos[b], z->blen[b], CT_F32, OP_SUM);
}

static void grads_ready(void *ctx, int unit) {
    Zero *z = ctx;
    if (!z->last_micro) return;
    GPT2 *m = z->model;
    int b = z->unit_bucket[unit];
    if (m->unit_offset[unit + 1] == m->unit_offset[unit]) return; // no gradients of it on this stage
    int complete = z->bucket_units_left[b] > 0 && --z->bucket_units_left[b] == 0;
    if (unit == UNIT_EMBED && m->lay->embed && m->head_k == P_WTE) { // (an untied head: nothing shared)
        // the first and last stage hold the tied embedding: their gradients are summed first, without
        // blocking (the last stage still has to send its input gradient back), and the bucket's
        // data-parallel reduction waits for that sum in zero_finish_grads
        z->embed_req = comm_iall_reduce(m->lay->embed, m->unit_grads[UNIT_EMBED], m->unit_grads[UNIT_EMBED],
                                        m->unit_offset[1] - m->unit_offset[0], CT_F32, OP_SUM);
        z->embed_bucket = complete && z->dp ? b : -1;
        return;
    }
    if (!z->dp || !complete) return;
    // the embedding's bucket completed by another unit (interleaved's last stage runs the head's chunk
    // first) still waits for that sum: its reduction would read the embedding's gradients while the
    // end stages' all-reduce is still writing them in place
    if (z->embed_req && b == z->unit_bucket[UNIT_EMBED]) z->embed_bucket = b;
    else launch_bucket(z, b);
}

// ---------------------------------------------------------------------------------------------

int zero_streams_gradients(int stage, const Layout *l) {
    // B and W apart (a split schedule's stashes) keep each unit's bucket from its B (the LayerNorms' and
    // the head's gradients) to its W: the stage's every bucket at once, past any small pool
    return stage >= 2 && l->replicas.size > 1 && l->accum == 1 && l->nstash == 0;
}

// The reduced gradient of this rank's segment of bucket b.
static float *reduced_grad(const Zero *z, int b) {
    return z->stage >= 2 ? z->gshard + z->shard_pos[b] : z->model->grads + z->own_off[b];
}

void zero_init(Zero *z, GPT2 *model, const float *host, const AdamWConfig *cfg) {
    const Layout *l = model->lay;
    memset(z, 0, sizeof *z);
    z->cfg = *cfg;
    z->model = model;
    z->times = model->times;
    z->dp_size = l->replicas.size;
    z->dp_rank = l->replicas.rank;
    z->dp = layout_group(&l->replicas);
    int stage = z->stage = z->dp_size > 1 ? l->zero : 0; // one data-parallel rank: nothing to shard, gather or scatter
    int fetch = 0; // fetch: the model asks for each unit's weights before reading them
    build_buckets(z, l->bucket_mb);
    const Backend *be = model->be;
    MemAccount *a = &model->mem;
    DType dt = model->dt;
    size_t n = stage == 0 ? model->num_params : z->shard_elems;
    if (stage == 0 && dt == DT_F32) {
        z->master = model->params; // fp32 working weights are their own master copy
    } else {
        z->master = mem_alloc(a, MEM_OPTIMIZER, n * sizeof(float), "master weights");
        z->master_owned = 1;
        if (host && stage == 0) {
            be->to_device(z->master, host, n * sizeof(float));
        } else if (host) {
            for (int b = 0; b < z->nbuckets; b++)
                be->to_device(z->master + z->shard_pos[b], host + z->own_off[b], z->own_len[b] * sizeof(float));
        }
    }
    z->m = mem_alloc(a, MEM_OPTIMIZER, n * sizeof(float), "AdamW first moment");
    z->v = mem_alloc(a, MEM_OPTIMIZER, n * sizeof(float), "AdamW second moment");
    size_t biggest = 0;
    for (int b = 0; b < z->nbuckets; b++)
        if (z->blen[b] > biggest) biggest = z->blen[b];
    if (stage >= 2) z->gshard = mem_alloc(a, MEM_GRADS, (z->shard_elems + 1) * sizeof(float), "gradient shard");
    z->stream = zero_streams_gradients(stage, l);
    z->bucket_buf = xcalloc((size_t)z->nbuckets, sizeof(float *));
    if (z->stream) {
        // the bucket holding the embeddings lives through the whole backward (the head writes it first,
        // the encoder last), one is being written, and the rest carry reductions in flight
        z->npool = 4;
        z->pool = xcalloc((size_t)z->npool, sizeof(float *));
        z->pool_bucket = xmalloc(sizeof(int) * z->npool);
        for (int i = 0; i < z->npool; i++) {
            z->pool[i] = mem_alloc(a, MEM_COMM, biggest * sizeof(float), "gradient bucket");
            z->pool_bucket[i] = -1;
        }
        fetch = 1;
    }
    if (stage == 3) {
        z->wshard = mem_alloc(a, MEM_WEIGHTS, z->shard_elems * dtype_size(dt), "weight shard");
        be->cast(z->wshard, dt, z->master, DT_F32, z->shard_elems);
        z->nslots = 3; // the unit in use, the one prefetched, and the embeddings' second use
        z->slots = xcalloc((size_t)z->nslots, sizeof(ZeroSlot));
        for (int s = 0; s < z->nslots; s++) {
            z->slots[s].buf = mem_alloc(a, MEM_COMM, biggest * dtype_size(dt), "gathered unit");
            z->slots[s].bucket = -1;
        }
        fetch = 1;
    }
    if ((stage == 1 || stage == 2) && z->dp) {
        z->wreq = xcalloc((size_t)z->nbuckets, sizeof(CommRequest *));
        fetch = 1;
    }
    gpt2_set_hooks(model, z, fetch ? fetch_unit : NULL, grads_ready);
}

void zero_free(Zero *z) {
    zero_wait_weights(z);
    free(z->wreq);
    MemAccount *a = &z->model->mem;
    if (z->master_owned) mem_free(a, z->master);
    mem_free(a, z->m);
    mem_free(a, z->v);
    mem_free(a, z->wshard);
    for (int s = 0; s < z->nslots; s++) {
        slot_wait(z, &z->slots[s]);
        mem_free(a, z->slots[s].buf);
    }
    free(z->slots);
    mem_free(a, z->gshard);
    for (int i = 0; i < z->npool; i++) mem_free(a, z->pool[i]);
    free(z->pool);
    free(z->pool_bucket);
    free(z->bucket_buf);
    free(z->bstart);
    free(z->blen);
    free(z->bucket_units);
    free(z->bucket_units_left);
    free(z->unit_bucket);
    free(z->own_off);
    free(z->own_len);
    free(z->shard_pos);
    free(z->breq);
    gpt2_set_hooks(z->model, NULL, NULL, NULL);
    memset(z, 0, sizeof *z);
}

void zero_begin_step(Zero *z) {
    z->gathers = 0;
    z->comm_busy_at_start = z->dp ? comm_busy_seconds(z->dp) : 0;
    z->backward = z->weights_only = 0;
}

void zero_begin_forward(Zero *z) { z->backward = z->weights_only = 0; }

void zero_begin_backward(Zero *z, int last_micro) {
    z->backward = 1;
    z->weights_only = 0;
    z->last_micro = last_micro;
}

void zero_begin_weights(Zero *z, int last_micro) {
    zero_begin_backward(z, last_micro);
    z->weights_only = 1;
}

double zero_sum_double(Zero *z, double x) { return comm_sum_double(z->dp, x); }

// Σ g² over [off, off+len) of the internal order (gradient at grad), split by tensor so that tensors
// replicated across the tensor-parallel group count once in the global norm.
static double sumsq_range(const Zero *z, size_t off, size_t len, const float *grad) {
    const GPT2 *m = z->model;
    double sum = 0;
    for (TensorSlice s = GPT2_SLICES; gpt2_next_slice(m, off, len, &s);) {
        size_t toff, tlen;
        gpt2_tensor_range(m, s.k, s.l, &toff, &tlen);
        size_t e = s.start + gpt2_counted_len(m, s.k, tlen); // (a Llama's shared kv rows count once)
        if (e > s.e) e = s.e;
        if (e > s.a) sum += m->be->sumsq(grad + (s.a - off), e - s.a);
    }
    return sum;
}

float zero_finish_grads(Zero *z) {
    z->backward = z->weights_only = 0;
    if (z->embed_req) {
        wait_timed(&z->embed_req, &z->times->zero_wait_s);
        if (z->embed_bucket >= 0) launch_bucket(z, z->embed_bucket);
    }
    for (int b = 0; b < z->nbuckets; b++) {
        if (z->dp && z->bucket_units_left[b] > 0) die("internal: bucket %d was never complete (%d of its units not ready)", b, z->bucket_units_left[b]);
        wait_timed(&z->breq[b], &z->times->zero_wait_s);
        z->bucket_units_left[b] = z->bucket_units[b]; // the next step's last micro-batch counts again
    }
    for (int i = 0; i < z->npool; i++) { // every bucket is reduced: the pool is free for the next step
        if (z->pool_bucket[i] >= 0) z->bucket_buf[z->pool_bucket[i]] = NULL;
        z->pool_bucket[i] = -1;
    }
    if (z->stream)
        for (int u = 0; u < z->model->nunits; u++) gpt2_place_unit_grads(z->model, u, NULL);
    // every stage sums the squares of the segments this rank owns, then the ranks' sums in rank order
    double local = 0;
    for (int b = 0; b < z->nbuckets; b++) local += sumsq_range(z, z->own_off[b], z->own_len[b], reduced_grad(z, b));
    GPT2 *m = z->model;
    return (float)sqrt(comm_sum_double(layout_group(&m->lay->pp), comm_sum_double(layout_group(&m->lay->tp), comm_sum_double(z->dp, local))));
}

// The AdamW segments of [off, off+len) of the internal order, whose state sits at spos (shard or full
// vector) and whose gradient is at grad: one per tensor slice, because decay applies to matrices only.
static int adamw_segments(Zero *z, size_t off, size_t len, size_t spos, const float *grad, AdamWSegment *segs, int n) {
    GPT2 *m = z->model;
    for (TensorSlice t = GPT2_SLICES; gpt2_next_slice(m, off, len, &t);) {
        size_t s = spos + (t.a - off);
        void *working = NULL;
        if (z->stage == 3) working = at(z->wshard, s, m->dt);
        else if (!(z->stage == 0 && m->dt == DT_F32)) working = at(m->params, t.a, m->dt);
        segs[n++] = (AdamWSegment){ z->master + s, working, grad + (t.a - off), z->m + s, z->v + s, t.e - t.a,
                                    gpt2_param_decays(t.k) ? z->cfg.weight_decay : 0.0f };
    }
    return n;
}

void zero_step(Zero *z, float lr, float grad_norm) {
    const AdamWConfig *c = &z->cfg;
    GPT2 *m = z->model;
    zero_wait_weights(z); // the last gather reads this rank's segment, which the update rewrites
    z->t++;
    float bc1 = 1.0f - powf(c->beta1, (float)z->t), bc2 = 1.0f - powf(c->beta2, (float)z->t);
    float scale = 1.0f;
    if (c->clip > 0.0f && grad_norm > c->clip) scale = c->clip / (grad_norm + 1e-6f);
    // every tensor slice of a bucket this rank owns, updated in one pass
    int cap = NUM_PARAM_TENSORS * (m->nl + 1), n;
    AdamWSegment *segs = xmalloc(sizeof(AdamWSegment) * (size_t)cap);
    if (z->stage == 0) {
        n = adamw_segments(z, 0, m->num_params, 0, m->grads, segs, 0);
        m->be->adamw(m->dt, segs, n, lr, c->beta1, c->beta2, c->eps, bc1, bc2, scale);
        free(segs);
        return;
    }
    // bucket by bucket, those the next forward needs first first (the last bucket holds unit 0): under
    // ZeRO-1/2 each bucket's gather of the updated working weights starts as soon as it is updated,
    // overlapping the other buckets' updates and the next forward, which waits for each bucket just
    // before its first unit (fetch_unit)
    for (int b = z->nbuckets - 1; b >= 0; b--) {
        n = adamw_segments(z, z->own_off[b], z->own_len[b], z->shard_pos[b], reduced_grad(z, b), segs, 0);
        m->be->adamw(m->dt, segs, n, lr, c->beta1, c->beta2, c->eps, bc1, bc2, scale);
        if (z->wreq)
            z->wreq[b] = comm_iall_gather(z->dp, at(m->params, z->own_off[b], m->dt), at(m->params, z->bstart[b], m->dt),
                                          z->blen[b], dt_comm(m->dt));
    }
    free(segs);
    if (z->stage == 3) {
        // the gathered copies are stale now
        for (int s = 0; s < z->nslots; s++) {
            slot_wait(z, &z->slots[s]);
            z->slots[s].bucket = -1;
        }
        for (int u = 0; u < m->nunits; u++) gpt2_place_unit_params(m, u, NULL);
        // the next forward's first unit is gathered now, while the step ends and the next begins
        for (int u = 0; u < m->nunits; u++)
            if (m->unit_offset[u + 1] > m->unit_offset[u]) {
                gather_bucket(z, z->unit_bucket[u], -1);
                break;
            }
        return;
    }
}

double zero_comm_ms(const Zero *z) { return z->dp ? (comm_busy_seconds(z->dp) - z->comm_busy_at_start) * 1e3 : 0.0; }

void zero_gather_master(Zero *z, float *host) {
    zero_wait_weights(z);
    GPT2 *m = z->model;
    const Backend *be = m->be;
    if (z->stage == 0) {
        be->to_host(host, z->master, m->num_params * sizeof(float));
        return;
    }
    float *full = xmalloc(sizeof(float) * m->num_params), *mine = xmalloc(sizeof(float) * (z->shard_elems + 1));
    be->to_host(mine, z->master, z->shard_elems * sizeof(float));
    for (int b = 0; b < z->nbuckets; b++)
        comm_all_gather(z->dp, mine + z->shard_pos[b], full + z->bstart[b], z->blen[b], CT_F32);
    memcpy(host, full, sizeof(float) * m->num_params);
    free(full);
    free(mine);
}

void zero_state_to_host(const Zero *z, float *master, float *m, float *v) {
    const Backend *be = z->model->be;
    if (z->stage >= 1) { // the shard is this rank's segments already, in this order
        be->to_host(master, z->master, z->shard_elems * sizeof(float));
        be->to_host(m, z->m, z->shard_elems * sizeof(float));
        be->to_host(v, z->v, z->shard_elems * sizeof(float));
        return;
    }
    for (int b = 0; b < z->nbuckets; b++) {
        size_t n = z->own_len[b] * sizeof(float), at = z->shard_pos[b], from = z->own_off[b];
        be->to_host(master + at, z->master + from, n);
        be->to_host(m + at, z->m + from, n);
        be->to_host(v + at, z->v + from, n);
    }
}

void zero_set_moments(Zero *z, const float *m, const float *v, int t) {
    const Backend *be = z->model->be;
    z->t = t;
    if (z->stage == 0) {
        be->to_device(z->m, m, z->model->num_params * sizeof(float));
        be->to_device(z->v, v, z->model->num_params * sizeof(float));
        return;
    }
    for (int b = 0; b < z->nbuckets; b++) {
        size_t n = z->own_len[b] * sizeof(float), at = z->shard_pos[b], from = z->own_off[b];
        be->to_device(z->m + at, m + from, n);
        be->to_device(z->v + at, v + from, n);
    }
}

// algorithms.c: what each collective sends, receives and adds (algorithms.h; its place in the chain
// is said there). Read top to bottom: reductions and copies in the operation's memory (host, through
// reduce.h, or device); the communicator's buffers; the geometry of an operation (segments, chunks,
// transfers); small collectives through the shared-memory slots; one planner per operation; the
// owner's reduction.
//
// The algorithms move data only between pairs of ranks, through NetConn (net.h), and never learn
// which transport carries it. Reduce-scatter gives each rank a segment of the vector to own; the
// owner takes every rank's contribution to its segment, chunk by chunk, and adds them in rank order
// 0, 1, ..., n-1 into an accumulator (fp32 for bf16, rounded once at the end). Each rank sends (n-1)/n
// of the vector, as in a ring, and each output element depends on that element alone, never on
// where a segment, chunk or caller's bucket starts. All-reduce is that reduce-scatter followed by an
// all-gather of the owners' segments; a small all-reduce skips the second step: every rank sends its
// whole vector to every other and each adds all n in the same order.
#define _GNU_SOURCE
#include "algorithms.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "hostmem.h"

const char *const REQ_NAMES[] = { "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv" };

// ---------------------------------------------------------------------------------------------
// reductions and copies in the operation's memory

static void reduce_fn(const NetReduce *r, void *acc, const void *in, size_t n) {
    comm_reduce_host(acc, in, n, r->type, r->op, r->first);
}
// The same on the device, queued on its communication stream.
static void dev_reduce_fn(const NetReduce *r, void *acc, const void *in, size_t n) {
    r->dev->reduce(acc, in, n, r->type, r->op, r->first);
}

static void finish_acc(const AlgoOp *q, void *out, const void *acc, size_t n, int ranks, int streaming) {
    if (q->dev) q->dev->finish(out, acc, n, q->t, q->op, ranks);
    else comm_finish_host(out, acc, n, q->t, q->op, ranks, streaming);
}
// The accumulator of a chunk: the host's, or the device's for an operation on device memory.
static void *acc_of(AlgoComm *c, const AlgoOp *q) {
    if (!q->dev) return c->acc;
    if (!c->dacc && !(c->dacc = q->dev->alloc(c->chunk_bytes)))
        die("out of device memory: %zu bytes for the collectives' accumulator", (size_t)c->chunk_bytes);
    return c->dacc;
}
// memmove between buffers of the operation's memory kind (queued on the device for device memory).
static void move_bytes(const AlgoOp *q, void *dst, const void *src, size_t n, int stream) {
    if (q->dev) q->dev->copy(dst, src, n);
    else if (stream) copy_streaming(dst, src, n);
    else memmove(dst, src, n);
}

// ---------------------------------------------------------------------------------------------
// the communicator's buffers: the chunk accumulator, and the work area (see comm_count_memory)

void algo_init(AlgoComm *c) {
    c->slots = c->size > 1;
    for (int r = 0; r < c->size; r++)
        if (c->conn[r] && !c->conn[r]->ops->slot) c->slots = 0;
    c->chunk_bytes = CHUNK_BYTES;
    c->acc = xmalloc(c->chunk_bytes);
}

void algo_use_device(AlgoComm *c, const DevMem *dev) {
    c->dev = dev;
    c->chunk_bytes = dev ? DEV_CHUNK_BYTES : CHUNK_BYTES; // every member attaches alike, so chunks match
    free(c->acc);
    c->acc = xmalloc(c->chunk_bytes);
}

static void set_work(AlgoComm *c, size_t bytes, MemAccount *acct, const char *what) {
    if (c->work_acct) mem_free(c->work_acct, c->work);
    else hostmem_free(c->work);
    c->work = NULL;
    c->work_bytes = 0;
    c->work_acct = acct;
    if (!bytes) return;
    if (acct) {
        c->work = mem_host_alloc(acct, MEM_COMM, bytes, "collectives' work area");
    } else {
        c->work = hostmem_alloc(bytes);
        if (!c->work) die("out of memory: %zu bytes for a %s", bytes, what);
    }
    c->work_bytes = bytes;
}

// Makes the work area at least `bytes` (its contents are not kept).
static void grow_work(AlgoComm *c, size_t bytes, const char *what) {
    if (c->work_bytes < bytes) set_work(c, bytes, c->work_acct, what);
}

void algo_count_memory(AlgoComm *c, MemAccount *acct) {
    if (c->work_acct != acct) set_work(c, acct ? c->work_bytes : 0, acct, "work area");
}

void algo_free(AlgoComm *c) {
    free(c->acc);
    c->acc = NULL;
    set_work(c, 0, NULL, NULL);
    if (c->dev) {
        c->dev->free(c->dacc);
        c->dev->free(c->dwork);
    }
    c->dacc = c->dwork = NULL;
}

// ---------------------------------------------------------------------------------------------
// operations: their geometry


typedef struct {
    size_t off, len;
} Range;

// Segment k of n over count elements: [k·ceil(count/n), ...) cut at count (possibly empty).
static Range segment(size_t count, int n, int k) {
    size_t seg = (count + (size_t)n - 1) / (size_t)n, a = (size_t)k * seg, b = a + seg;
    if (a > count) a = count;
    if (b > count) b = count;
    return (Range){ a, b - a };
}
static size_t nchunks(size_t len, size_t chunk) { return (len + chunk - 1) / chunk; }
static size_t chunk_len(size_t len, size_t chunk, size_t j) { return len - j * chunk < chunk ? len - j * chunk : chunk; }
static int slot_of_peer(int me, int k) { return k < me ? k : k - 1; } // index among the n-1 others

static NetReq *alloc_reqs(AlgoOp *q, size_t n) {
    q->nnr = n;
    q->nr = n <= INLINE_REQS ? q->inline_nr : xcalloc(n, sizeof(NetReq));
    if (n <= INLINE_REQS) memset(q->nr, 0, n * sizeof(NetReq));
    return q->nr;
}

static NetReq *req(const AlgoOp *q, NetReq *r, int peer, const void *buf, size_t bytes, const NetReduce *red) {
    *r = (NetReq){ .buf = (void *)buf, .bytes = bytes, .reduce = red, .peer = peer, .dev = q->dev };
    return r;
}

// An operation too large to stay in the cache: its copies go past it (copy_streaming).
static int streaming(const AlgoOp *q) { return q->count * comm_type_size(q->t) >= STREAM_BYTES; }

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    return an && bn && (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}

// The input the peers read, as seen from the outputs this rank writes while they may still read it.
// An exact in-place all-reduce, or a reduce-scatter into its own segment, is safe: a rank writes
// another rank's segment only after that rank has read it. A small all-reduce in place waits for its
// sends before writing (hold_finish). Any other overlap reduces from a private copy.
static const void *private_input(AlgoComm *c, AlgoOp *q) {
    int n = c->size;
    size_t es = comm_type_size(q->t), bytes = q->count * es;
    Range own = q->small ? (Range){ 0, q->count } : segment(q->count, n, c->rank);
    const char *in = q->send, *out = q->kind == REQ_REDUCE_SCATTER ? (const char *)q->recv : (const char *)q->recv + own.off * es;
    int copy;
    if (q->small) {
        q->hold_finish = overlaps(out, own.len * es, in, bytes);
        return in;
    }
    if (q->kind == REQ_ALLREDUCE) copy = in != (const char *)q->recv && overlaps(q->recv, bytes, in, bytes);
    else copy = overlaps(out, own.len * es, in, own.off * es) ||
                overlaps(out, own.len * es, in + (own.off + own.len) * es, bytes - (own.off + own.len) * es);
    if (!copy) return in;
    if (q->dev) { // on the device; the peers read it only once the copy has finished
        if (c->dwork_bytes < bytes) {
            q->dev->free(c->dwork);
            if (!(c->dwork = q->dev->alloc(bytes))) die("out of device memory: %zu bytes for a %s", bytes, REQ_NAMES[q->kind]);
            c->dwork_bytes = bytes;
        }
        q->dev->copy(c->dwork, in, bytes);
        q->dev->sync();
        return c->dwork;
    }
    grow_work(c, bytes, REQ_NAMES[q->kind]);
    memcpy(c->work, in, bytes);
    return c->work;
}

// ---------------------------------------------------------------------------------------------
// small collectives through the slots: every rank writes its input once into its own slot, and each
// reads the others' in place and adds all n in rank order, so a small all-reduce costs one exchange
// of cache lines. Whether an operation goes this way depends only on the operation and the
// communicator, so every member decides alike.

static int slot_eligible(const AlgoComm *c, const AlgoOp *q, int kind, size_t count, CommType t) {
    return c->slots && !q->dev && (kind == REQ_ALLREDUCE || kind == REQ_REDUCE_SCATTER || kind == REQ_ALLGATHER) &&
           count * comm_type_size(t) <= NET_SLOT_BYTES;
}

static NetSlot *slot_of(AlgoComm *c, int rank, int parity) {
    int me = c->rank;
    NetConn *any = c->conn[me == 0 ? 1 : 0];
    return rank == me ? any->ops->slot(any, 1, parity) : c->conn[rank]->ops->slot(c->conn[rank], 0, parity);
}

static void slot_post(AlgoComm *c, AlgoOp *q) {
    size_t es = comm_type_size(q->t);
    q->seq = ++c->slot_seq;
    NetSlot *s = slot_of(c, c->rank, (int)(q->seq & 1));
    if (q->kind == REQ_ALLGATHER) {
        Range mine = segment(q->count, c->size, c->rank);
        memcpy(s->data, q->send, mine.len * es);
    } else if (q->count) {
        memcpy(s->data, q->send, q->count * es);
    }
    atomic_store_explicit(&s->seq, q->seq, memory_order_release);
    for (int r = 0; r < c->size; r++)
        if (c->conn[r]) c->conn[r]->ops->notify(c->conn[r]);
}

// 1 once every peer's slot holds this operation (then the result is written); 0 while one does not.
static int slot_try_finish(AlgoComm *c, AlgoOp *q) {
    int n = c->size, parity = (int)(q->seq & 1);
    for (int r = 0; r < n; r++)
        if (r != c->rank && atomic_load_explicit(&slot_of(c, r, parity)->seq, memory_order_acquire) != q->seq) {
            q->slot_peer = r;
            return 0;
        }
    size_t es = comm_type_size(q->t);
    if (q->kind == REQ_ALLGATHER) {
        for (int r = 0; r < n; r++) {
            Range s = segment(q->count, n, r);
            memcpy((char *)q->recv + s.off * es, slot_of(c, r, parity)->data, s.len * es);
        }
    } else {
        Range out = q->kind == REQ_REDUCE_SCATTER ? segment(q->count, n, c->rank) : (Range){ 0, q->count };
        for (int r = 0; r < n; r++) comm_reduce_host(c->acc, slot_of(c, r, parity)->data + out.off * es, out.len, q->t, q->op, r == 0);
        comm_finish_host(q->recv, c->acc, out.len, q->t, q->op, n, 0);
    }
    q->slot_done = 1;
    return 1;
}

void op_init(AlgoOp *q, int kind, const void *send, void *recv, size_t count, CommType t, CommOp op, int root, int peer) {
    memset(q, 0, offsetof(AlgoOp, inline_nr));
    q->kind = kind, q->send = send, q->recv = recv, q->count = count, q->t = t, q->op = op, q->root = root, q->peer = peer;
}

// ---------------------------------------------------------------------------------------------
// planning: one planner per operation sizes its transfers and posts those it can post at once

// Chunks of ch elements in the other ranks' segments.
static size_t others_chunks(const AlgoComm *c, const AlgoOp *q, size_t ch) {
    size_t total = 0;
    for (int p = 0; p < c->size; p++)
        if (p != c->rank) total += nchunks(segment(q->count, c->size, p).len, ch);
    return total;
}

// Posts the receives of peer p's segment of the output, chunk by chunk, into r; returns how many.
// (The all-gather posts them at its start; the all-reduce after its reduction, in the same order.)
static size_t post_segment_recvs(AlgoComm *c, AlgoOp *q, NetReq *r, int p, size_t ch) {
    size_t es = comm_type_size(q->t);
    Range s = segment(q->count, c->size, p);
    size_t k = nchunks(s.len, ch);
    for (size_t j = 0; j < k; j++) {
        NetReq *x = req(q, &r[j], p, (char *)q->recv + (s.off + j * ch) * es, chunk_len(s.len, ch, j) * es, NULL);
        x->streaming = streaming(q);
        net_post_recv(c->conn[p], x);
    }
    return k;
}

static void plan_p2p(AlgoComm *c, AlgoOp *q) {
    NetReq *r = req(q, alloc_reqs(q, 1), q->peer, q->kind == REQ_SEND ? q->send : q->recv, q->count, NULL);
    if (q->kind == REQ_SEND) net_post_send(c->conn[q->peer], r);
    else net_post_recv(c->conn[q->peer], r);
}

static void plan_broadcast(AlgoComm *c, AlgoOp *q) {
    int n = c->size, me = c->rank;
    size_t bytes = q->count * comm_type_size(q->t);
    if (n == 1 || bytes == 0) return (void)alloc_reqs(q, 0);
    if (me == q->root) { // every rank reads the root's buffer (single-copy inside a node)
        NetReq *r = alloc_reqs(q, (size_t)n - 1);
        for (int p = 0, i = 0; p < n; p++)
            if (p != me) net_post_send(c->conn[p], req(q, &r[i++], p, q->recv, bytes, NULL));
    } else {
        net_post_recv(c->conn[q->root], req(q, alloc_reqs(q, 1), q->root, q->recv, bytes, NULL));
    }
}

// This rank's segment goes into place, then to every peer, chunk by chunk; the peers' come in.
static void plan_all_gather(AlgoComm *c, AlgoOp *q) {
    int n = c->size, me = c->rank;
    size_t es = comm_type_size(q->t);
    Range mine = segment(q->count, n, me);
    char *mine_out = (char *)q->recv + mine.off * es;
    if (mine.len && (const char *)q->send != mine_out)
        move_bytes(q, mine_out, q->send, mine.len * es, streaming(q) && !overlaps(mine_out, mine.len * es, q->send, mine.len * es));
    if (n == 1) return (void)alloc_reqs(q, 0);
    size_t ch = c->chunk_bytes / es, mine_chunks = nchunks(mine.len, ch);
    NetReq *r = alloc_reqs(q, others_chunks(c, q, ch) + (size_t)(n - 1) * mine_chunks);
    size_t i = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        for (size_t j = 0; j < mine_chunks; j++)
            net_post_send(c->conn[p], req(q, &r[i++], p, (const char *)q->send + j * ch * es, chunk_len(mine.len, ch, j) * es, NULL));
        i += post_segment_recvs(c, q, &r[i], p, ch);
    }
}

// All-reduce and reduce-scatter: every rank's contribution goes to the owner of its range, all at
// once; the owner's reducing receives (and an all-reduce's all-gather) are posted as it advances.
static void plan_reduction(AlgoComm *c, AlgoOp *q) {
    int n = c->size, me = c->rank;
    size_t es = comm_type_size(q->t);
    q->small = q->kind == REQ_ALLREDUCE && q->count * es <= SMALL_BYTES;
    q->send = private_input(c, q);
    size_t ch = c->chunk_bytes / comm_acc_size(q->t);
    q->chunk = ch;
    q->red_first = (NetReduce){ es, comm_acc_size(q->t), 1, q->dev ? dev_reduce_fn : reduce_fn, q->t, q->op, q->dev };
    q->red_rest = q->red_first;
    q->red_rest.first = 0;
    Range mine = q->small ? (Range){ 0, q->count } : segment(q->count, n, me);
    q->own_off = mine.off;
    q->own_len = mine.len;
    q->rnch = nchunks(mine.len, ch);
    size_t nsend = q->small ? (size_t)(n - 1) * nchunks(q->count, ch) : others_chunks(c, q, ch);
    int gather = q->kind == REQ_ALLREDUCE && !q->small;
    size_t nag_recv = gather ? others_chunks(c, q, ch) : 0, nag_send = gather ? (size_t)(n - 1) * q->rnch : 0;
    NetReq *r = alloc_reqs(q, nsend + q->rnch * (size_t)(n - 1) + nag_send + nag_recv);
    size_t i = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        Range s = q->small ? (Range){ 0, q->count } : segment(q->count, n, p);
        for (size_t j = 0; j < nchunks(s.len, ch); j++)
            net_post_send(c->conn[p], req(q, &r[i++], p, (const char *)q->send + (s.off + j * ch) * es, chunk_len(s.len, ch, j) * es, NULL));
    }
    q->nsend = i;
    q->rrecv = r + i;
    q->ag_send = q->rrecv + q->rnch * (size_t)(n - 1);
    q->ag_recv = q->ag_send + nag_send;
    q->n_ag_send = nag_send;
    q->n_ag_recv = nag_recv;
    q->rj = 0;
    q->rk = 0;
    q->posted = 0;
    q->ag_posted = !gather;
}

void op_start(AlgoComm *c, AlgoOp *q) {
    c->op = REQ_NAMES[q->kind];
    if (slot_eligible(c, q, q->kind, q->count, q->t)) {
        q->slot = 1;
        slot_post(c, q);
        return;
    }
    switch (q->kind) {
    case REQ_SEND:
    case REQ_RECV: plan_p2p(c, q); break;
    case REQ_BROADCAST: plan_broadcast(c, q); break;
    case REQ_ALLGATHER: plan_all_gather(c, q); break;
    default: plan_reduction(c, q); break; // REQ_ALLREDUCE, REQ_REDUCE_SCATTER
    }
}

// ---------------------------------------------------------------------------------------------
// advancing: the owner's reduction

// Where the owner's finished chunk j goes.
static char *owned_out(const AlgoOp *q, size_t j) {
    size_t es = comm_type_size(q->t);
    if (q->kind == REQ_REDUCE_SCATTER) return (char *)q->recv + j * q->chunk * es;
    return (char *)q->recv + (q->own_off + j * q->chunk) * es;
}

// The owner's reduction, contribution by contribution in rank order; returns 1 when it moved.
static int advance_reduction(AlgoComm *c, AlgoOp *q) {
    int n = c->size, me = c->rank, moved = 0;
    size_t es = comm_type_size(q->t);
    while (q->rj < q->rnch) {
        size_t clen = chunk_len(q->own_len, q->chunk, q->rj);
        if (q->rk == n) { // every contribution is in: round, and pass the chunk on in an all-reduce
            if (q->hold_finish) { // in place: the peers must have the input before it is overwritten
                for (size_t i = 0; i < q->nsend; i++)
                    if (!q->nr[i].complete) return moved;
            }
            char *out = owned_out(q, q->rj);
            if (q->dev && q->n_ag_send) { // the peers gather the chunk once the device has finished it
                if (!q->fin) {
                    finish_acc(q, out, acc_of(c, q), clen, n, 0);
                    q->fin = q->dev->mark(DEV_COMM);
                }
                if (!q->dev->test(q->fin)) return moved;
                q->dev->release(q->fin);
                q->fin = NULL;
            } else {
                finish_acc(q, out, acc_of(c, q), clen, n, streaming(q));
            }
            if (q->n_ag_send)
                for (int p = 0, i = 0; p < n; p++)
                    if (p != me) {
                        NetReq *r = &q->ag_send[q->rj * (size_t)(n - 1) + (size_t)i++];
                        net_post_send(c->conn[p], req(q, r, p, out, clen * es, NULL));
                    }
            q->rj++;
            q->rk = 0;
            moved = 1;
            continue;
        }
        const NetReduce *red = q->rk == 0 ? &q->red_first : &q->red_rest;
        if (q->rk == me) {
            red->fn(red, acc_of(c, q), (const char *)q->send + (q->own_off + q->rj * q->chunk) * es, clen);
            q->rk++;
            moved = 1;
            continue;
        }
        NetReq *r = &q->rrecv[q->rj * (size_t)(n - 1) + (size_t)slot_of_peer(me, q->rk)];
        if (!q->posted) {
            net_post_recv(c->conn[q->rk], req(q, r, q->rk, acc_of(c, q), clen * es, red));
            q->posted = 1;
            int m = 0;
            c->conn[q->rk]->ops->progress(c->conn[q->rk], &m);
        }
        if (!r->complete) break;
        q->posted = 0;
        q->rk++;
        moved = 1;
    }
    if (q->rj == q->rnch && !q->ag_posted) { // the all-gather's receives follow the reduction's, in order
        q->ag_posted = 1;
        size_t i = 0;
        for (int p = 0; p < n; p++)
            if (p != me) i += post_segment_recvs(c, q, &q->ag_recv[i], p, q->chunk);
        moved = 1;
    }
    return moved;
}

int op_advance(AlgoComm *c, AlgoOp *q) {
    int moved = 0;
    if (q->slot && !q->slot_done) moved |= slot_try_finish(c, q);
    if (q->rrecv) moved |= advance_reduction(c, q);
    return moved;
}

int op_complete(AlgoOp *q) {
    if (q->slot) return q->slot_done;
    if (q->rrecv && (q->rj < q->rnch || !q->ag_posted)) return 0;
    while (q->scan < q->nnr && q->nr[q->scan].complete) q->scan++;
    // transfers planned but not yet posted count as incomplete: they are zeroed, complete == 0
    if (q->scan < q->nnr) return 0;
    if (!q->dev) return 1;
    // device memory: complete once the last work queued for it (a local copy, the last chunk's
    // rounding) has finished, so that the caller may use the result on any stream
    if (!q->last) q->last = q->dev->mark(DEV_COMM);
    return q->dev->test(q->last);
}

int op_waits_for(const AlgoOp *q) {
    if (q->slot) return q->slot_peer;
    if (q->rrecv && q->rj < q->rnch && q->posted) return q->rk;
    for (size_t i = q->scan; i < q->nnr; i++)
        if (!q->nr[i].complete && (q->nr[i].buf || q->nr[i].bytes)) return q->nr[i].peer;
    return q->kind == REQ_SEND || q->kind == REQ_RECV ? q->peer : -1;
}

void op_release(AlgoOp *q) {
    if (q->dev) {
        q->dev->release(q->ready);
        q->dev->release(q->fin);
        q->dev->release(q->last);
        q->ready = q->fin = q->last = NULL;
    }
    if (q->nr != q->inline_nr) free(q->nr);
    q->nr = NULL;
}


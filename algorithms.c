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
// whole vector to every other and each adds all n in the same order. That is the fan-in (ALGO_FANIN);
// the ring (ALGO_RING: the same order along a chain of neighbours) and the hierarchy (ALGO_HIER:
// fan-in inside each node, a ring across the nodes) follow the owner's reduction, each with its own
// section below; the planner of each operation dispatches on the communicator's algorithm.
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
    if (q->acc_out) memcpy(out, acc, n * comm_acc_size(q->t)); // inside the hierarchy: kept unrounded
    else if (q->dev) q->dev->finish(out, acc, n, q->t, q->op, ranks);
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

const char *const ALGO_NAMES[] = { "auto", "fanin", "ring", "hier" };

// Bytes of the hierarchy's buffers: the partial sums of one piece's node segment (local ranks L) and
// one piece's output (a reduce-scatter's, whose own segment is copied out of it); see hier_next.
static size_t hier_partial_bytes(int local) { return (HIER_PIECE_BYTES + (size_t)local - 1) / (size_t)local + 8; }

// Whether a ring reduces as two chains, the fan-in's reduce-scatter (see op_start_on): a ring of two
// that is a communicator of its own. The hierarchy's cross-node ring (a view, whose operations carry
// accumulators in and out) keeps its chain at any size.
static int ring_as_pair(int size, int view) { return size == 2 && !view; }

// The ring's staging: its chains' (none for a ring that reduces as a pair).
static size_t ring_staging_bytes(int size, int view, size_t chunk_bytes) {
    return size > 1 && !ring_as_pair(size, view) ? 2 * RING_DEPTH * chunk_bytes : 0;
}

size_t algo_buffer_bytes(int algo, int size, int local, int nodes, size_t chunk_bytes) {
    if (size < 2) return 0;
    if (algo == ALGO_RING) return ring_staging_bytes(size, 0, chunk_bytes);
    if (algo == ALGO_HIER) return hier_partial_bytes(local) + HIER_PIECE_BYTES + ring_staging_bytes(nodes, 1, chunk_bytes);
    return 0;
}

static void free_counted(MemAccount *acct, unsigned char **buf) {
    if (acct) mem_free(acct, *buf);
    else hostmem_free(*buf);
    *buf = NULL;
}
// The algorithm's own buffers (the ring's staging; the hierarchy's partial sums and output piece),
// made when the communicator is, from the work area's account (comm buffers in the memory report) once
// it has one: a function of the layout alone (algo_buffer_bytes counts the same), never of the
// operations that run.
static void bufs_alloc(AlgoComm *c) {
    free_counted(c->bufs_acct, &c->rbuf), free_counted(c->bufs_acct, &c->hbuf), free_counted(c->bufs_acct, &c->hout);
    c->bufs_acct = c->work_acct;
    if (c->size < 2 || (c->algo != ALGO_RING && c->algo != ALGO_HIER)) return;
    size_t bytes[2] = { ring_staging_bytes(c->size, c->to_parent != NULL, c->chunk_bytes), HIER_PIECE_BYTES };
    if (c->algo == ALGO_HIER) bytes[0] = hier_partial_bytes(c->local);
    if (!bytes[0]) return; // a ring of two
    unsigned char **buf[2] = { c->algo == ALGO_RING ? &c->rbuf : &c->hbuf, c->algo == ALGO_RING ? NULL : &c->hout };
    const char *what[2] = { c->algo == ALGO_RING ? "the ring's staging" : "the hierarchy's partial sums", "the hierarchy's output piece" };
    for (int i = 0; i < 2 && buf[i]; i++) {
        if (c->bufs_acct) *buf[i] = mem_host_alloc(c->bufs_acct, MEM_COMM, bytes[i], what[i]);
        else if (!(*buf[i] = hostmem_alloc(bytes[i]))) die("out of memory: %zu bytes for %s", bytes[i], what[i]);
    }
}

static void hier_views(AlgoComm *c);
static void view_free(AlgoComm *v);

const char *algo_choose(AlgoComm *c, int requested) {
    int n = c->size, nodes = 0, local = 0, uniform = 1;
    for (int r = 0; r < n; r++) nodes = c->node_of[r] + 1 > nodes ? c->node_of[r] + 1 : nodes;
    int *members = xcalloc((size_t)nodes + 1, sizeof(int)); // one pass: the planner asks this of 16384 ranks
    for (int r = 0; r < n; r++) members[c->node_of[r]]++;
    for (int m = 0; m < nodes; m++) {
        if (m == 0) local = members[m];
        uniform &= members[m] == local;
    }
    free(members);
    c->nodes = nodes, c->local = local;
    if (requested == ALGO_AUTO) requested = n == 1 || nodes == 1 ? ALGO_FANIN : uniform ? ALGO_HIER : ALGO_RING;
    if (requested == ALGO_HIER && !uniform) return "--algo hier needs as many members of the communicator on each node";
    c->algo = requested;
    return NULL;
}

int algo_collective_pair(const AlgoComm *c, int r) {
    int me = c->rank, n = c->size;
    if (c->algo == ALGO_RING) return r == (me + 1) % n || r == (me + n - 1) % n;
    if (c->algo == ALGO_HIER) { // the node and the cross-node ring
        int m = c->node_of[me], N = c->nodes;
        return c->node_of[r] == m ||
               (c->local_of[r] == c->local_of[me] && (c->node_of[r] == (m + 1) % N || c->node_of[r] == (m + N - 1) % N));
    }
    return 1;
}

int algo_uses_pair(const AlgoComm *c, int r) {
    int me = c->rank, n = c->size; // the hierarchy's send/recv: its neighbours in rank order too
    return algo_collective_pair(c, r) || (c->algo == ALGO_HIER && (r == (me + 1) % n || r == (me + n - 1) % n));
}

int algo_connections(const AlgoComm *c) {
    int n = c->size, ring = n - 1 < 2 ? n - 1 : 2;
    if (c->algo == ALGO_RING) return ring;
    if (c->algo == ALGO_HIER) return c->local - 1 + (c->nodes - 1 < 2 ? c->nodes - 1 : 2);
    return n - 1;
}

void algo_init(AlgoComm *c, int shared) {
    c->slots = shared && c->size > 1 && c->algo == ALGO_FANIN;
    c->chunk_bytes = CHUNK_BYTES;
    c->acc = xmalloc(c->chunk_bytes);
    bufs_alloc(c);
    if (c->algo == ALGO_HIER && c->size > 1) hier_views(c);
}

void algo_use_device(AlgoComm *c, const DevMem *dev) {
    c->dev = dev;
    c->chunk_bytes = dev ? DEV_CHUNK_BYTES : CHUNK_BYTES; // every member attaches alike, so chunks match
    free(c->acc);
    c->acc = xmalloc(c->chunk_bytes);
    if (c->rbuf) bufs_alloc(c);
    if (c->vnode) algo_use_device(c->vnode, dev), algo_use_device(c->vcross, dev);
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
    if ((c->rbuf || c->hbuf) && c->bufs_acct != acct) bufs_alloc(c);
    if (c->vnode) algo_count_memory(c->vnode, acct), algo_count_memory(c->vcross, acct);
}

void algo_free(AlgoComm *c) {
    free(c->acc);
    c->acc = NULL;
    free_counted(c->bufs_acct, &c->rbuf), free_counted(c->bufs_acct, &c->hbuf), free_counted(c->bufs_acct, &c->hout);
    c->bufs_acct = NULL;
    view_free(c->vnode), view_free(c->vcross);
    c->vnode = c->vcross = NULL;
    free(c->node_of), free(c->local_of);
    c->node_of = c->local_of = NULL;
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
// Bytes of an output and an input element (accumulators inside the hierarchy).
static size_t out_size(const AlgoOp *q) { return q->acc_out ? comm_acc_size(q->t) : comm_type_size(q->t); }
static size_t in_size(const AlgoOp *q) { return q->in_acc ? comm_acc_size(q->t) : comm_type_size(q->t); }

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
    // A reduce-scatter's output shifted inside its own segment is not safe either: the owner writes
    // output chunk j while its own input's chunk j + 1 is still to be read.
    if (q->kind == REQ_ALLREDUCE) copy = in != (const char *)q->recv && overlaps(q->recv, bytes, in, bytes);
    else copy = out != in + own.off * es && overlaps(out, own.len * es, in, bytes);
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
    r->direct = q->kind == REQ_SEND; // a hand-off: read in place where the transport can (one copy)
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

// ---------------------------------------------------------------------------------------------
// the ring (ALGO_RING): each rank talks to its two neighbours only. A reduction runs as one chain
// 0 -> 1 -> ... -> n-1 (forward), chunk by chunk: each rank adds its contribution to the partial
// sum that arrives from its left (accumulators: fp32 for bf16) and passes it right, so that every
// element is added in rank order exactly as the fan-in adds it (the same bits). Rank 0 sends its
// input as it is; each later rank's addition is the reduction of its forward receive (RingStep), one
// pass over the partial sum where it arrives. Rank n-1 rounds the sums in that pass; the finished
// chunks travel back n-1 -> n-2 -> ... (backward): all of them in an
// all-reduce, to the owners of their segments in a reduce-scatter. In an all-reduce of three ranks or
// more rank 0 takes them straight from rank n-1, its left neighbour (the link n-1 -> 0 the chain
// leaves idle), so the last rank to finish is rank 1, n-2 hops from n-1 instead of n-1 hops. Both
// directions of every link stream at once, RING_DEPTH chunks in flight each. An all-gather passes each owner's segment on
// round the ring (forward); a broadcast passes the root's buffer on from the root.

typedef struct RingOp {
    size_t nch;              // chunks, in vector order, each inside one segment
    size_t *off, *len;       // [nch] elements
    int *seg;                // [nch] the segment's owner
    NetReq *fr, *fs, *br, *bs; // [nch] each: forward receive and send, backward receive and send
    NetReq *ws;              // [nch] rank n-1 of an all-reduce (ring_wraps): the finished chunks' sends to rank 0
    size_t f_post, f_done;   // forward: receives posted below f_post; steps done below f_done
    size_t nb, b_post, b_done; // backward steps (the first nb chunks), likewise
    size_t nsend_own;        // all-gather: chunks of this rank's own segment (sent first)
    size_t nfwd;             // all-gather and broadcast: received chunks passed on
    int left, right, bfrom; // bfrom: where the finished chunks come from (the right, or ring_wraps' rank n-1)
    struct RingStep *step;   // [nch] reductions: the forward receives' steps (ranks 1..n-1)
} RingOp;

static int left_of(const AlgoComm *c) { return (c->rank + c->size - 1) % c->size; }
static int right_of(const AlgoComm *c) { return (c->rank + 1) % c->size; }

// Chunks of every segment of `n` over count elements, in vector order (segments in view order: the
// ranks `order` lists, NULL: 0..n-1), ch elements at most.
static void ring_chunks(RingOp *g, size_t count, int n, const int *order, int nseg, size_t ch, size_t extra) {
    size_t total = 0;
    for (int k = 0; k < n; k++) total += nchunks(segment(count, nseg, order ? order[k] : k).len, ch);
    g->nch = total;
    g->off = xmalloc(sizeof(size_t) * (total + 1));
    g->len = xmalloc(sizeof(size_t) * (total + 1));
    g->seg = xmalloc(sizeof(int) * (total + 1));
    size_t i = 0;
    for (int k = 0; k < n; k++) {
        Range s = segment(count, nseg, order ? order[k] : k);
        for (size_t j = 0; j < nchunks(s.len, ch); j++, i++)
            g->off[i] = s.off + j * ch, g->len[i] = chunk_len(s.len, ch, j), g->seg[i] = k;
    }
    g->fr = xcalloc(5 * total + extra + 1, sizeof(NetReq));
    g->fs = g->fr + total, g->br = g->fs + total, g->bs = g->br + total, g->ws = g->bs + total;
}

static void ring_free(RingOp *g) {
    if (!g) return;
    free(g->off), free(g->len), free(g->seg), free(g->fr), free(g->step), free(g);
}

static unsigned char *fslot(AlgoComm *c, size_t i) { return c->rbuf + (i % RING_DEPTH) * c->chunk_bytes; }
static unsigned char *bslot(AlgoComm *c, size_t i) { return c->rbuf + (RING_DEPTH + i % RING_DEPTH) * c->chunk_bytes; }

// One forward step of a chain, done by the transport as the partial sum arrives from the left: the
// receive's reduction (the transport calls r.fn with &r and a place in dst) adds this rank's
// contribution in the same pass, dst = left (op) mine, and at rank n-1 rounds it too, so the partial
// sum is read once, from where the left neighbour left it (in place inside a node), and never copied
// first into staging.
typedef struct RingStep {
    NetReduce r;              // first: the transport hands the receive's reduction back to fn
    unsigned char *dst;       // the receive's buffer: the transport's offsets into it are elements of r.acc_size
    const unsigned char *mine; // this rank's contribution to the chunk, elements of mine_size
    size_t mine_size;
    int left_acc, mine_acc;   // the partial sum and the contribution hold accumulators (else elements)
    int ranks;                // > 0: dst gets finished elements (rank n-1); 0: accumulators
} RingStep;

static void ring_step_fn(const NetReduce *r, void *dst, const void *left, size_t n) {
    const RingStep *s = (const RingStep *)r;
    size_t k = (size_t)((unsigned char *)dst - s->dst) / r->acc_size;
    comm_combine_host(dst, left, s->left_acc, s->mine + k * s->mine_size, s->mine_acc, n, r->type, r->op, s->ranks);
}

// Whether rank 0 takes the finished chunks straight from rank n-1 (above): an all-reduce of three or more.
static int ring_wraps(const AlgoComm *c, const AlgoOp *q) { return q->kind == REQ_ALLREDUCE && c->size >= 3; }

static void ring_plan_reduction(AlgoComm *c, AlgoOp *q) {
    int n = c->size, me = c->rank;
    RingOp *g = q->ring = xcalloc(1, sizeof *g);
    q->send = q->in_acc ? q->send : private_input(c, q);
    // On one node, at least RING_FILL chunks a segment where chunks stay above RING_MIN_CHUNK: the
    // chain's 2(n-1) hops wait for its first chunk, so a short operation in whole chunks is mostly
    // filling. Across nodes (and in the hierarchy's cross-node ring, a view: nodes 0) whole chunks:
    // there a chunk's fixed cost per message outweighs the filling (over TCP a quarter-size chunk
    // halved the hierarchy's busbw). The chunking changes no bit: each element's order is the chain's.
    q->chunk = c->chunk_bytes / comm_acc_size(q->t);
    size_t fill = (q->count + (size_t)(RING_FILL * n) - 1) / (size_t)(RING_FILL * n);
    if (fill < RING_MIN_CHUNK) fill = RING_MIN_CHUNK;
    if (c->nodes == 1 && fill < q->chunk) q->chunk = fill;
    ring_chunks(g, q->count, n, NULL, n, q->chunk, 0);
    Range own = segment(q->count, n, me);
    q->own_off = own.off, q->own_len = own.len;
    g->left = left_of(c), g->right = right_of(c);
    g->bfrom = me == 0 && ring_wraps(c, q) ? g->left : g->right;
    // backward: every chunk in an all-reduce; in a reduce-scatter those of the segments this rank
    // passes on or owns (segments 0..me; rank n-1 sends those of 0..n-2), which come first
    if (q->kind == REQ_ALLREDUCE) g->nb = g->nch;
    else
        for (g->nb = 0; g->nb < g->nch && g->seg[g->nb] <= me && g->seg[g->nb] < n - 1; g->nb++) {}
    size_t is = in_size(q);
    if (me == 0) { // the chain starts with rank 0's own elements: they go as they are, from the input
        for (size_t i = 0; i < g->nch; i++)
            net_post_send(c->conn[g->right], req(q, &g->fs[i], g->right, (const unsigned char *)q->send + g->off[i] * is, g->len[i] * is, NULL));
        g->f_post = g->f_done = g->nch;
        return;
    }
    g->step = xcalloc(g->nch + 1, sizeof(RingStep));
}

// Where the finished elements of chunk i go at this rank: the output, or backward staging.
static unsigned char *ring_final(AlgoComm *c, AlgoOp *q, size_t i) {
    RingOp *g = q->ring;
    if (q->kind == REQ_ALLREDUCE) return (unsigned char *)q->recv + g->off[i] * out_size(q);
    if (g->seg[i] == c->rank) return (unsigned char *)q->recv + (g->off[i] - q->own_off) * out_size(q);
    return bslot(c, i);
}

// Posts the forward receive of chunk i: into staging (ranks 1..n-2) or, finished, where rank n-1's
// result goes; its reduction adds this rank's contribution (RingStep).
static void ring_post_step(AlgoComm *c, AlgoOp *q, size_t i) {
    RingOp *g = q->ring;
    int n = c->size, me = c->rank, last = me == n - 1;
    size_t as = comm_acc_size(q->t), is = in_size(q);
    RingStep *s = &g->step[i];
    s->dst = last ? ring_final(c, q, i) : fslot(c, i);
    s->mine = (const unsigned char *)q->send + g->off[i] * is;
    s->mine_size = is;
    s->left_acc = me > 1 || q->in_acc; // rank 0 sent its elements as they are
    s->mine_acc = q->in_acc;
    s->ranks = last && !q->acc_out ? (q->ranks ? q->ranks : n) : 0;
    size_t left_size = me > 1 ? as : is;
    s->r = (NetReduce){ left_size, s->ranks ? out_size(q) : as, 0, ring_step_fn, q->t, q->op, NULL };
    net_post_recv(c->conn[g->left], req(q, &g->fr[i], g->left, s->dst, g->len[i] * left_size, &s->r));
}

static int ring_advance_reduction(AlgoComm *c, AlgoOp *q) {
    RingOp *g = q->ring;
    int n = c->size, me = c->rank, moved = 0;
    size_t as = comm_acc_size(q->t), es = out_size(q);
    int first_rank = me == 0, last_rank = me == n - 1, rs = q->kind == REQ_REDUCE_SCATTER, wraps = ring_wraps(c, q);
    // forward: post the steps' receives while their staging is free (at rank n-1: the backward
    // staging a reduce-scatter's finished chunk goes to has sent what it held RING_DEPTH chunks ago)
    while (!first_rank && g->f_post < g->nch && g->f_post < g->f_done + RING_DEPTH) {
        size_t i = g->f_post;
        if (i >= RING_DEPTH && !last_rank && !g->fs[i - RING_DEPTH].complete) break;
        if (i >= RING_DEPTH && last_rank && rs && i < g->nb && !g->bs[i - RING_DEPTH].complete) break;
        ring_post_step(c, q, i);
        g->f_post++;
        moved = 1;
    }
    while (!first_rank && g->f_done < g->f_post && g->fr[g->f_done].complete) {
        size_t i = g->f_done++;
        if (!last_rank) {
            net_post_send(c->conn[g->right], req(q, &g->fs[i], g->right, fslot(c, i), g->len[i] * as, NULL));
        } else if (i < g->nb) {
            net_post_send(c->conn[g->left], req(q, &g->bs[i], g->left, ring_final(c, q, i), g->len[i] * es, NULL));
            if (wraps) net_post_send(c->conn[g->right], req(q, &g->ws[i], g->right, ring_final(c, q, i), g->len[i] * es, NULL));
            g->b_post = g->b_done = i + 1;
        }
        moved = 1;
    }
    if (last_rank) return moved;
    // backward: finished chunks come from bfrom (the right; rank 0 of a wrapping all-reduce: rank n-1, its
    // left); this rank keeps its own and passes the others on
    while (g->b_post < g->nb && g->b_post < g->b_done + RING_DEPTH &&
           (!rs || g->b_post < RING_DEPTH || g->seg[g->b_post - RING_DEPTH] == me || g->bs[g->b_post - RING_DEPTH].complete)) {
        size_t i = g->b_post++;
        NetReq *r = req(q, &g->br[i], g->bfrom, ring_final(c, q, i), g->len[i] * es, NULL);
        r->streaming = !rs && streaming(q);
        net_post_recv(c->conn[g->bfrom], r);
        moved = 1;
    }
    while (g->b_done < g->b_post && g->br[g->b_done].complete) {
        size_t i = g->b_done++;
        if (!first_rank && !(wraps && me == 1) && (rs ? g->seg[i] < me : 1))
            net_post_send(c->conn[g->left], req(q, &g->bs[i], g->left, g->br[i].buf, g->len[i] * es, NULL));
        moved = 1;
    }
    return moved;
}

// All-gather round the ring: this rank's segment goes right, then each segment that arrives from
// the left goes on, except the one its right neighbour owns. order maps view ranks to the owners of
// the segments (NULL: itself) among nseg segments of the vector.
static void ring_plan_gather(AlgoComm *c, AlgoOp *q, const int *order, int nseg) {
    int n = c->size, me = c->rank;
    size_t es = comm_type_size(q->t);
    RingOp *g = q->ring = xcalloc(1, sizeof *g);
    g->left = left_of(c), g->right = right_of(c);
    Range mine = segment(q->count, nseg, order ? order[me] : me);
    char *mine_out = (char *)q->recv + mine.off * es;
    if (mine.len && (const char *)q->send != mine_out)
        move_bytes(q, mine_out, q->send, mine.len * es, streaming(q) && !overlaps(mine_out, mine.len * es, q->send, mine.len * es));
    // the receive order: segments me-1, me-2, ..., me+1 (of the view)
    int *rorder = xmalloc(sizeof(int) * (size_t)n);
    for (int t = 0; t < n; t++) rorder[t] = order ? order[(me - 1 - t + 2 * n) % n] : (me - 1 - t + 2 * n) % n;
    q->chunk = c->chunk_bytes / es;
    g->nsend_own = nchunks(mine.len, q->chunk);
    ring_chunks(g, q->count, n - 1, rorder, nseg, q->chunk, g->nsend_own);
    free(rorder);
    size_t last = g->nch; // the chunks of the right neighbour's segment are not passed on
    while (last > 0 && g->seg[last - 1] == n - 2) last--;
    g->nfwd = last;
    for (size_t j = 0; j < g->nsend_own; j++)
        net_post_send(c->conn[g->right], req(q, &g->fs[j], g->right, mine_out + j * q->chunk * es, chunk_len(mine.len, q->chunk, j) * es, NULL));
    for (size_t i = 0; i < g->nch; i++) {
        NetReq *r = req(q, &g->fr[i], g->left, (char *)q->recv + g->off[i] * es, g->len[i] * es, NULL);
        r->streaming = streaming(q);
        net_post_recv(c->conn[g->left], r);
    }
    g->f_post = g->nch;
}

// A broadcast from the root, chunk by chunk along the ring; the root's left neighbour ends it.
static void ring_plan_broadcast(AlgoComm *c, AlgoOp *q) {
    RingOp *g = q->ring = xcalloc(1, sizeof *g);
    g->left = left_of(c), g->right = right_of(c);
    q->chunk = c->chunk_bytes;
    size_t bytes = q->count * comm_type_size(q->t);
    g->nch = nchunks(bytes, q->chunk);
    g->fr = xcalloc(4 * g->nch + 1, sizeof(NetReq));
    g->fs = g->fr + g->nch;
    if (c->rank == q->root) {
        for (size_t j = 0; j < g->nch; j++)
            net_post_send(c->conn[g->right], req(q, &g->fs[j], g->right, (char *)q->recv + j * q->chunk, chunk_len(bytes, q->chunk, j), NULL));
        g->nsend_own = g->nch; // the sends ring_complete waits for
        return;
    }
    for (size_t j = 0; j < g->nch; j++)
        net_post_recv(c->conn[g->left], req(q, &g->fr[j], g->left, (char *)q->recv + j * q->chunk, chunk_len(bytes, q->chunk, j), NULL));
    g->f_post = g->nch;
    g->nfwd = g->right == q->root ? 0 : g->nch;
}

// All-gather and broadcast: pass on what has arrived, in order.
static int ring_advance_pass(AlgoComm *c, AlgoOp *q) {
    RingOp *g = q->ring;
    int moved = 0;
    size_t es = q->kind == REQ_BROADCAST ? 1 : comm_type_size(q->t);
    while (g->f_done < g->nfwd && g->fr[g->f_done].complete) {
        size_t i = g->f_done++, k = g->nsend_own + i;
        net_post_send(c->conn[g->right], req(q, &g->fs[k], g->right, g->fr[i].buf, q->kind == REQ_BROADCAST ? g->fr[i].bytes : g->len[i] * es, NULL));
        moved = 1;
    }
    return moved;
}

static int ring_complete(const AlgoOp *q) {
    const RingOp *g = q->ring;
    if (q->kind == REQ_ALLGATHER || q->kind == REQ_BROADCAST) {
        if (g->f_done < g->nfwd) return 0;
        for (size_t i = 0; i < g->nch; i++)
            if ((g->fr[i].bytes && !g->fr[i].complete)) return 0;
        for (size_t i = 0; i < g->nsend_own + g->nfwd; i++)
            if (g->fs[i].bytes && !g->fs[i].complete) return 0;
        return 1;
    }
    if (g->f_done < g->nch || g->b_done < g->nb) return 0;
    for (size_t i = 0; i < g->nch; i++)
        if ((g->fs[i].bytes && !g->fs[i].complete) || (g->bs[i].bytes && !g->bs[i].complete) || (g->ws[i].bytes && !g->ws[i].complete))
            return 0;
    return 1;
}

static int ring_waits_for(const AlgoOp *q) {
    const RingOp *g = q->ring;
    if (q->kind != REQ_ALLGATHER && q->kind != REQ_BROADCAST && g->b_done < g->b_post) return g->bfrom;
    return g->left;
}

// ---------------------------------------------------------------------------------------------
// the hierarchy (ALGO_HIER): nodes x local ranks. An all-reduce is a fan-in reduce-scatter inside
// the node into accumulators (this rank's node segment, local ranks added in order), a ring
// all-reduce of those accumulators across the nodes among the members of this local rank (nodes
// added in order, rounded once), and a fan-in all-gather inside the node. Each element is so
// added in an order set by the layout alone: nodes 0..N-1, each node's sum in local rank order.
// The vector goes in pieces of HIER_PIECE_BYTES of accumulators, one after another, so that the
// buffers are a function of the layout (counted when the communicator is made, whatever operations
// come); a piece changes no bit, the order of each element's additions being the same in any piece.
// A reduce-scatter is that all-reduce (each piece into hout) and a copy of this rank's segment where
// a piece holds it: the same bits as the all-reduce. An all-gather passes each segment round its local rank's ring across the
// nodes, then every rank sends the segments it holds to its node's members. A broadcast goes round
// the root's local rank's ring, then from each node's member of it to its node.
#define HIER_DONE 100

// The view's connections, as its communicator holds them now.
static void view_connect(AlgoComm *v, const AlgoComm *c) {
    for (int j = 0; j < v->size; j++) v->conn[j] = j == v->rank ? NULL : c->conn[v->to_parent[j]];
}

static AlgoComm *view_new(AlgoComm *c, int algo, int size, int rank, const int *members) {
    AlgoComm *v = xcalloc(1, sizeof *v);
    v->rank = rank, v->size = size, v->algo = algo;
    v->conn = xcalloc((size_t)size, sizeof(NetConn *));
    v->to_parent = xmalloc(sizeof(int) * (size_t)size);
    for (int j = 0; j < size; j++) v->to_parent[j] = members[j];
    view_connect(v, c); // none yet when the communicator is made: algo_connected fills them in
    algo_init(v, 0);    // the views' operations keep accumulators or read them: no slot shortcut
    return v;
}

void algo_connected(AlgoComm *c) {
    if (c->vnode) view_connect(c->vnode, c), view_connect(c->vcross, c);
}

static void view_free(AlgoComm *v) {
    if (!v) return;
    algo_free(v);
    free(v->conn);
    free(v->to_parent);
    free(v);
}

// Member (m, l) of the layout, as a communicator rank.
static int member_at(const AlgoComm *c, int m, int l) {
    for (int r = 0; r < c->size; r++)
        if (c->node_of[r] == m && c->local_of[r] == l) return r;
    die("internal: no member %d of node %d", l, m);
}

static void hier_views(AlgoComm *c) {
    int m = c->node_of[c->rank], l = c->local_of[c->rank];
    int *mem = xmalloc(sizeof(int) * (size_t)(c->local > c->nodes ? c->local : c->nodes));
    for (int j = 0; j < c->local; j++) mem[j] = member_at(c, m, j);
    c->vnode = view_new(c, ALGO_FANIN, c->local, l, mem);
    for (int j = 0; j < c->nodes; j++) mem[j] = member_at(c, j, l);
    c->vcross = view_new(c, ALGO_RING, c->nodes, m, mem);
    c->vcross->parent_size = c->size; // its all-gathers carry segments of the whole communicator
    free(mem);
}

static void op_start_on(AlgoComm *c, AlgoOp *q);

// Starts a phase on view v; in_acc, acc_out and ranks as in AlgoOp.
static void hier_child(AlgoOp *q, AlgoComm *v, int kind, const void *send, void *recv, size_t count, int root, int in_acc,
                       int acc_out, int ranks) {
    q->child_on = v;
    q->child = xmalloc(sizeof *q->child);
    op_init(q->child, kind, send, recv, count, q->t, q->op, root, 0);
    q->child->in_acc = in_acc, q->child->acc_out = acc_out, q->child->ranks = ranks;
    op_start_on(v, q->child);
}


// Posts the all-gather's exchange inside the node: the segments of this local rank's ring to every
// node member, theirs from each.
static void hier_gather_exchange(AlgoComm *c, AlgoOp *q) {
    AlgoComm *v = c->vnode;
    size_t es = comm_type_size(q->t), k = 0;
    NetReq *r = alloc_reqs(q, 2 * (size_t)(v->size - 1) * (size_t)c->nodes);
    for (int p = 0; p < v->size; p++) {
        if (p == v->rank) continue;
        for (int m = 0; m < c->nodes; m++) {
            Range mine = segment(q->count, c->size, member_at(c, m, v->rank)), theirs = segment(q->count, c->size, member_at(c, m, p));
            if (mine.len) net_post_send(v->conn[p], req(q, &r[k++], v->to_parent[p], (char *)q->recv + mine.off * es, mine.len * es, NULL));
            if (theirs.len) net_post_recv(v->conn[p], req(q, &r[k++], v->to_parent[p], (char *)q->recv + theirs.off * es, theirs.len * es, NULL));
        }
    }
    q->nnr = k;
}

// Starts phase q->phase, or the next that has work; HIER_DONE after the last.
static void hier_next(AlgoComm *c, AlgoOp *q) {
    size_t es = comm_type_size(q->t), as = comm_acc_size(q->t);
    int reduction = q->kind == REQ_ALLREDUCE || q->kind == REQ_REDUCE_SCATTER;
    for (; q->phase < HIER_DONE && !q->child; q->phase++) {
        if (reduction) { // piece [hoff, hoff + hlen) of the vector, its three phases, then the next piece
            if (q->phase == 0) q->hlen = q->count - q->hoff < HIER_PIECE_BYTES / as ? q->count - q->hoff : HIER_PIECE_BYTES / as;
            Range s = segment(q->hlen, c->local, c->vnode->rank); // this rank's node segment of the piece
            const unsigned char *in = (const unsigned char *)q->send + q->hoff * es;
            unsigned char *out = q->kind == REQ_ALLREDUCE ? (unsigned char *)q->recv + q->hoff * es : c->hout;
            if (q->phase == 0) {
                hier_child(q, c->vnode, REQ_REDUCE_SCATTER, in, c->hbuf, q->hlen, 0, 0, 1, 0);
            } else if (q->phase == 1) {
                if (c->nodes > 1) hier_child(q, c->vcross, REQ_ALLREDUCE, c->hbuf, out + s.off * es, s.len, 0, 1, 0, c->size);
                else comm_finish_host(out + s.off * es, c->hbuf, s.len, q->t, q->op, c->size, 0);
            } else if (q->phase == 2) {
                hier_child(q, c->vnode, REQ_ALLGATHER, out + s.off * es, out, q->hlen, 0, 0, 0, 0);
            } else {
                if (q->kind == REQ_REDUCE_SCATTER) { // this rank's segment of the whole vector, where the piece holds it
                    Range own = segment(q->count, c->size, c->rank);
                    size_t a = own.off > q->hoff ? own.off : q->hoff, e = own.off + own.len, pe = q->hoff + q->hlen;
                    if (pe < e) e = pe;
                    if (a < e) memmove((unsigned char *)q->recv + (a - own.off) * es, out + (a - q->hoff) * es, (e - a) * es);
                }
                q->hoff += q->hlen;
                q->phase = q->hoff < q->count ? -1 : HIER_DONE - 1; // the loop's step: phase 0 of the next piece, or done
            }
        } else if (q->kind == REQ_ALLGATHER) {
            if (q->phase == 0) {
                Range own = segment(q->count, c->size, c->rank);
                if (c->nodes > 1) hier_child(q, c->vcross, REQ_ALLGATHER, q->send, q->recv, q->count, 0, 0, 0, 0);
                else if ((char *)q->recv + own.off * es != (const char *)q->send) memmove((char *)q->recv + own.off * es, q->send, own.len * es);
            } else {
                hier_gather_exchange(c, q);
                q->phase = HIER_DONE - 1;
            }
        } else { // REQ_BROADCAST
            int m0 = c->node_of[q->root], l0 = c->local_of[q->root];
            if (q->phase == 0 && c->vnode->rank == l0) hier_child(q, c->vcross, REQ_BROADCAST, q->recv, q->recv, q->count, m0, 0, 0, 0);
            else if (q->phase == 1) hier_child(q, c->vnode, REQ_BROADCAST, q->recv, q->recv, q->count, l0, 0, 0, 0);
            else if (q->phase >= 2) q->phase = HIER_DONE - 1;
        }
    }
    if (q->child) q->phase--; // the loop's step passed the phase that runs
}

static void hier_plan(AlgoComm *c, AlgoOp *q) {
    // piece P's output may land on the input of a piece still to be read
    if (q->kind == REQ_ALLREDUCE || q->kind == REQ_REDUCE_SCATTER) q->send = private_input(c, q);
    q->hier = 1;
    q->phase = 0;
    alloc_reqs(q, 0);
    hier_next(c, q);
}

static int hier_advance(AlgoComm *c, AlgoOp *q) {
    int moved = 0;
    while (q->child) {
        moved |= op_advance(q->child_on, q->child);
        if (!op_complete(q->child)) break;
        op_release(q->child);
        free(q->child);
        q->child = NULL;
        q->phase++;
        hier_next(c, q);
        moved = 1;
    }
    return moved;
}

// ---------------------------------------------------------------------------------------------
// starting an operation: the communicator's algorithm plans it

static void op_start_on(AlgoComm *c, AlgoOp *q) {
    c->op = REQ_NAMES[q->kind];
    if (q->dev && c->algo != ALGO_FANIN && c->size > 1)
        die("%s on device memory: --algo %s runs on host memory only so far (use --algo fanin)", REQ_NAMES[q->kind], ALGO_NAMES[c->algo]);
    if (op_is_p2p(q)) {
        if (!c->conn[q->peer])
            die("internal: %s to rank %d: --algo %s connects this rank only to %s", REQ_NAMES[q->kind], q->peer, ALGO_NAMES[c->algo],
                c->algo == ALGO_RING ? "its ring neighbours" : "its node, its cross-node ring and its neighbours in rank order");
        return plan_p2p(c, q);
    }
    if (slot_eligible(c, q, q->kind, q->count, q->t)) {
        q->slot = 1;
        slot_post(c, q);
        return;
    }
    if (c->algo == ALGO_HIER && c->size > 1) return hier_plan(c, q);
    // Two ranks are each other's only neighbour, and the ring's reduction is then two chains, one
    // ending at each segment's owner: the fan-in's reduce-scatter, whose first addition x0 + x1 is
    // the chain's (commutative), so the same bits with each rank adding half, where one chain
    // 0 -> 1 left every addition to rank 1 (ring_as_pair).
    int pair = ring_as_pair(c->size, c->to_parent != NULL) && (q->kind == REQ_ALLREDUCE || q->kind == REQ_REDUCE_SCATTER);
    if (pair && (q->in_acc || q->acc_out)) die("internal: accumulators in a ring of two's reduction outside the hierarchy");
    if (c->algo == ALGO_RING && c->size > 1 && !pair) {
        switch (q->kind) {
        case REQ_BROADCAST: ring_plan_broadcast(c, q); break;
        case REQ_ALLGATHER: ring_plan_gather(c, q, c->to_parent && c->parent_size ? c->to_parent : NULL, c->parent_size ? c->parent_size : c->size); break;
        default: ring_plan_reduction(c, q); break;
        }
        return;
    }
    switch (q->kind) {
    case REQ_BROADCAST: plan_broadcast(c, q); break;
    case REQ_ALLGATHER: plan_all_gather(c, q); break;
    default: plan_reduction(c, q); break; // REQ_ALLREDUCE, REQ_REDUCE_SCATTER
    }
}

void op_start(AlgoComm *c, AlgoOp *q) { op_start_on(c, q); }

// ---------------------------------------------------------------------------------------------
// advancing: the owner's reduction

// Where the owner's finished chunk j goes.
static char *owned_out(const AlgoOp *q, size_t j) {
    size_t es = out_size(q);
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
    if (q->hier) return hier_advance(c, q);
    if (q->ring) return q->kind == REQ_ALLREDUCE || q->kind == REQ_REDUCE_SCATTER ? ring_advance_reduction(c, q) : ring_advance_pass(c, q);
    if (q->slot && !q->slot_done) moved |= slot_try_finish(c, q);
    if (q->rrecv) moved |= advance_reduction(c, q);
    return moved;
}

int op_complete(AlgoOp *q) {
    if (q->slot) return q->slot_done;
    if (q->hier && q->phase != HIER_DONE) return 0;
    if (q->ring) return ring_complete(q);
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
    if (q->child) {
        int w = op_waits_for(q->child);
        return w >= 0 ? q->child_on->to_parent[w] : -1;
    }
    if (q->ring) return ring_waits_for(q);
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
    ring_free(q->ring);
    q->ring = NULL;
    if (q->child) {
        op_release(q->child);
        free(q->child);
        q->child = NULL;
    }
}


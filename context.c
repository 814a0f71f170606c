// context.c: context parallelism: the zigzag split and ring attention (see context.h).
//
// Step s of the ring (s = 0 .. N-1) holds the K/V block of rank owner = (rank - s) mod N: its own at step 0,
// then each block from the previous rank while this rank's current one goes to the next. A rank's two
// query chunks meet the two key chunks of the block present in a fixed order (its first chunk, then its
// second; for each, the block's first key chunk, then its second); a key chunk entirely after a query
// chunk (every pair masked) is skipped. With the zigzag split every step but the first computes exactly
// two whole chunk pairs, and the first one whole pair and two diagonal ones, so every rank computes the
// same number of query-key pairs: 2N·c² + c per sequence and head, c = T/(2N).
#include "context.h"

#include <string.h>

#include "common.h"

void cp_slice(const int32_t *full, int32_t *local, int nseq, int T, int n, int r) {
    int c = T / 2;
    for (int i = 0; i < nseq; i++)
        for (int j = 0; j < 2; j++)
            memcpy(local + (size_t)i * T + (size_t)j * c, full + (size_t)i * T * n + cp_chunk_start(T, n, r, j),
                   sizeof(int32_t) * (size_t)c);
}

double causal_pairs(int Tq, int q0, int Tk, int k0) {
    double pairs = 0;
    for (int t = 0; t < Tq; t++) {
        int seen = q0 + t - k0 + 1;
        pairs += seen < 0 ? 0 : seen > Tk ? Tk : seen;
    }
    return pairs;
}

// Views of local chunk j of [B, T, width] rows (part: channel offset of the C-wide piece viewed).
static AttnView chunk_view(DType dt, const void *base, int T, int width, int j, int part, int C) {
    size_t off = (size_t)j * (T / 2) * width + (size_t)part * C;
    AttnView v = { dt, (char *)base + off * dtype_size(dt), (size_t)T * width, (size_t)width };
    return v;
}

static void wait_ring(CpRing *r, CommRequest **q) { wait_timed(q, &r->times->ring_wait_s); }

// Passes the block at cur to the next rank and receives the previous rank's into nxt (step s of n).
static void pass_kv(CpRing *r, int s, void *cur, void *nxt, size_t bytes, CommRequest **send, CommRequest **recv) {
    *send = *recv = NULL;
    int n = r->lay->cp.size, rank = r->lay->cp.rank;
    if (s + 1 >= n) return;
    *send = comm_isend(r->lay->cp.comm, cur, bytes, (rank + 1) % n);
    r->times->ring_sent_bytes += (double)bytes;
    *recv = comm_irecv(r->lay->cp.comm, nxt, bytes, (rank + n - 1) % n);
}

// One (query chunk, key chunk) pair: GPT-2's block op, or grouped-query attention with RoPE at the chunks'
// global positions (rope not NULL).
static void block_fwd(const CpRing *r, AttnView o, float *lse, AttnView q, AttnView k, AttnView v, int B, int NH, int NKV,
                      int hs, int c, int q0, int k0, const RopeConfig *rope, int merge) {
    if (rope) r->be->attention_gqa_block_fwd(o, lse, q, k, v, B, NH, NKV, hs, c, q0, c, k0, rope, merge);
    else r->be->attention_block_fwd(o, lse, q, k, v, B, NH, hs, c, q0, c, k0, merge);
}
static void block_bwd(const CpRing *r, AttnView dq, AttnView dk, AttnView dv, AttnView g, AttnView o, const float *lse,
                      AttnView q, AttnView k, AttnView v, int B, int NH, int NKV, int hs, int c, int q0, int k0,
                      const RopeConfig *rope) {
    if (rope) r->be->attention_gqa_block_bwd(dq, dk, dv, g, o, lse, q, k, v, B, NH, NKV, hs, c, q0, c, k0, rope);
    else r->be->attention_block_bwd(dq, dk, dv, g, o, lse, q, k, v, B, NH, hs, c, q0, c, k0);
}

double cp_attention_fwd(CpRing *r, void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int NKV,
                        const RopeConfig *rope) {
    const Backend *be = r->be;
    DType dt = r->dt;
    int n = r->lay->cp.size, rank = r->lay->cp.rank, c = T / 2, hs = C / NH, K = NKV * hs, W = C + 2 * K;
    size_t es = dtype_size(dt), rows = (size_t)B * T, kv_bytes = rows * 2 * K * es, lse_chunk = (size_t)B * NH * c;
    be->cast_rows(r->kvbuf[0], dt, 2 * (size_t)K, (const char *)qkv + (size_t)C * es, dt, (size_t)W, rows, 2 * (size_t)K);
    int started[2] = { 0, 0 };
    double pairs = 0;
    for (int s = 0; s < n; s++) {
        void *cur = r->kvbuf[s % 2];
        CommRequest *send, *recv;
        pass_kv(r, s, cur, r->kvbuf[(s + 1) % 2], kv_bytes, &send, &recv); // overlaps the block's attention
        int owner = (rank + n - s) % n;
        for (int jq = 0; jq < 2; jq++)
            for (int jk = 0; jk < 2; jk++) {
                int q0 = cp_chunk_start(T, n, rank, jq), k0 = cp_chunk_start(T, n, owner, jk);
                if (k0 > q0) continue; // the whole key chunk comes after the query chunk
                AttnView o = chunk_view(DT_F32, r->acc, T, C, jq, 0, C), q = chunk_view(dt, qkv, T, W, jq, 0, C);
                AttnView k = chunk_view(dt, cur, T, 2 * K, jk, 0, K), v = chunk_view(dt, cur, T, 2 * K, jk, 1, K);
                block_fwd(r, o, lse + jq * lse_chunk, q, k, v, B, NH, NKV, hs, c, q0, k0, rope, started[jq]);
                started[jq] = 1;
                pairs += causal_pairs(c, q0, c, k0);
            }
        wait_ring(r, &send);
        wait_ring(r, &recv);
    }
    be->cast(out, dt, r->acc, DT_F32, rows * C);
    return pairs;
}

double cp_attention_bwd(CpRing *r, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse, int B,
                        int T, int C, int NH, int NKV, const RopeConfig *rope) {
    const Backend *be = r->be;
    DType dt = r->dt;
    int n = r->lay->cp.size, rank = r->lay->cp.rank, c = T / 2, hs = C / NH, next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int K = NKV * hs, W = C + 2 * K;
    size_t es = dtype_size(dt), rows = (size_t)B * T, kv_bytes = rows * 2 * K * es, lse_chunk = (size_t)B * NH * c;
    size_t dkv_n = rows * 2 * K, dkv_bytes = dkv_n * sizeof(float);
    be->cast_rows(r->kvbuf[0], dt, 2 * (size_t)K, (const char *)qkv + (size_t)C * es, dt, (size_t)W, rows, 2 * (size_t)K);
    be->zero(r->acc, rows * C * sizeof(float));
    CommRequest *dsend[2] = { NULL, NULL }; // the accumulator each dkv buffer is sending
    double pairs = 0;
    for (int s = 0; s < n; s++) {
        void *cur = r->kvbuf[s % 2];
        CommRequest *send, *recv, *drecv = NULL;
        pass_kv(r, s, cur, r->kvbuf[(s + 1) % 2], kv_bytes, &send, &recv);
        // the block's accumulator arrives from the previous rank while this rank computes its share apart
        float *acc = r->dkv[s % 2], *mine = s == 0 ? acc : r->dkv_part;
        if (s > 0) {
            wait_ring(r, &dsend[s % 2]); // that buffer's send, two steps ago
            drecv = comm_irecv(r->lay->cp_grad, acc, dkv_bytes, prev);
        }
        be->zero(mine, dkv_bytes);
        int owner = (rank + n - s) % n;
        for (int jq = 0; jq < 2; jq++)
            for (int jk = 0; jk < 2; jk++) {
                int q0 = cp_chunk_start(T, n, rank, jq), k0 = cp_chunk_start(T, n, owner, jk);
                if (k0 > q0) continue;
                AttnView dq = chunk_view(DT_F32, r->acc, T, C, jq, 0, C);
                AttnView dk = chunk_view(DT_F32, mine, T, 2 * K, jk, 0, K), dv = chunk_view(DT_F32, mine, T, 2 * K, jk, 1, K);
                AttnView g = chunk_view(dt, dout, T, C, jq, 0, C), o = chunk_view(dt, out, T, C, jq, 0, C);
                AttnView q = chunk_view(dt, qkv, T, W, jq, 0, C);
                AttnView k = chunk_view(dt, cur, T, 2 * K, jk, 0, K), v = chunk_view(dt, cur, T, 2 * K, jk, 1, K);
                block_bwd(r, dq, dk, dv, g, o, lse + jq * lse_chunk, q, k, v, B, NH, NKV, hs, c, q0, k0, rope);
                pairs += causal_pairs(c, q0, c, k0);
            }
        if (s > 0) { // the ranks before this one, then this one: the same order for every block
            wait_ring(r, &drecv);
            be->residual_bwd(DT_F32, acc, mine, dkv_n);
        }
        wait_ring(r, &dsend[(s + 1) % 2]); // one send at a time on the channel: the previous step's has left
        dsend[s % 2] = comm_isend(r->lay->cp_grad, acc, dkv_bytes, next);
        r->times->ring_sent_bytes += (double)dkv_bytes;
        wait_ring(r, &send);
        wait_ring(r, &recv);
    }
    // this rank's own block returns from the previous rank with every rank's share
    CommRequest *home = comm_irecv(r->lay->cp_grad, r->dkv[n % 2], dkv_bytes, prev);
    wait_ring(r, &home);
    wait_ring(r, &dsend[(n + 1) % 2]);
    be->cast_rows(dqkv, dt, (size_t)W, r->acc, DT_F32, (size_t)C, rows, (size_t)C);
    be->cast_rows((char *)dqkv + (size_t)C * es, dt, (size_t)W, r->dkv[n % 2], DT_F32, 2 * (size_t)K, rows, 2 * (size_t)K);
    return pairs;
}

// llama_check: runs the CPU backend's Llama-family ops on random inputs and writes inputs and results as
// raw float32 files for test/llama_ref.py, which checks them against PyTorch autograd.
//
//   build/llama_check DIR rmsnorm fp32|bf16 SEED N C EPS
//   build/llama_check DIR swiglu  fp32|bf16 SEED N F
//   build/llama_check DIR rope    fp32|bf16 SEED B T NHEADS HS THETA FACTOR LOW HIGH ORIGMAX POS0
//   build/llama_check DIR gqa     fp32|bf16 SEED B T NH NKV HS ROPE THETA FACTOR LOW HIGH ORIGMAX
//
// rmsnorm: x, b, w, dy, d0 (the gradient dinp held before the backward, which accumulates) ->
//   out, rstd = rmsnorm(x); res, rout, rrstd = residual_rmsnorm(x, b); dinp = d0 + ∂/∂x, dw (both from out).
// swiglu: gu [N,2F], dy [N,F] -> out [N,F], dgu [N,2F].
// rope: x, dy [B,T,NHEADS,HS] with positions pos[t] = POS0 + 3t (a per-token array, not contiguous) ->
//   out = rope_fwd(x), dx = rope_bwd(dy); offset: the same x at positions POS0 + t through pos = NULL.
// gqa: qkv [B,T,(NH+2NKV)HS], dout [B,T,NH·HS] -> out, lse [B,NH,T], dqkv (whole sequence, RoPE fused when
//   ROPE is 1); blocks as context parallelism over two ranks with the zigzag split runs them (chunks of
//   T/4, rank 0 holding 0 and 3, rank 1 holding 1 and 2, key chunks in ring order merged into fp32, then
//   every pair's backward accumulated in fp32): bout, blse, bdq [B,T,NH·HS], bdk, bdv [B,T,NKV·HS].
// gqa also checks that 3 threads give the bits of 1, and with NH = NKV and ROPE 0 that the result is
// bitwise attention_fwd/bwd's (GPT-2's).
// bf16 inputs are written as the stored values widened to fp32.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

static const char *g_dir;

static void write_f32(const char *name, const float *x, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", g_dir, name);
    SafeFile sf;
    safe_open_or_die(&sf, path);
    safe_write_or_die(&sf, x, sizeof(float) * n);
    safe_commit_or_die(&sf);
}

// a tensor in dt with its values widened to fp32 (what the file holds)
typedef struct {
    void *p;
    float *f;
} Ten;

static Ten ten(DType dt, size_t n, uint64_t *rng, float scale) {
    Ten t = { xcalloc(n ? n : 1, dtype_size(dt)), xcalloc(n ? n : 1, sizeof(float)) };
    for (size_t i = 0; i < n; i++) {
        *rng = mix64(*rng);
        float v = scale * (float)((double)(*rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        if (dt == DT_BF16) {
            ((uint16_t *)t.p)[i] = f32_to_bf16(v);
            t.f[i] = bf16_to_f32(((uint16_t *)t.p)[i]);
        } else {
            ((float *)t.p)[i] = v;
            t.f[i] = v;
        }
    }
    return t;
}

// the dt buffer p widened and written
static void write_dt(const char *name, DType dt, const void *p, size_t n) {
    float *f = xcalloc(n ? n : 1, sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = dt == DT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
    write_f32(name, f, n);
    free(f);
}

static int arg_int(char **argv, int i) { return atoi(argv[i]); }

int main(int argc, char **argv) {
    if (argc < 5) die("usage: llama_check DIR rmsnorm|swiglu|rope|gqa fp32|bf16 SEED ARGS... (see the opening comment)");
    g_dir = argv[1];
    const char *op = argv[2];
    DType dt = !strcmp(argv[3], "bf16") ? DT_BF16 : DT_F32;
    uint64_t rng = (uint64_t)atoll(argv[4]);
    const Backend *be = backend_cpu();
    size_t es = dtype_size(dt);
    if (!strcmp(op, "rmsnorm") && argc == 8) {
        int N = arg_int(argv, 5), C = arg_int(argv, 6);
        float eps = (float)atof(argv[7]);
        size_t n = (size_t)N * C;
        Ten x = ten(dt, n, &rng, 2.0f), b = ten(dt, n, &rng, 1.0f), w = ten(dt, C, &rng, 1.5f), dy = ten(dt, n, &rng, 1.0f);
        Ten d0 = ten(dt, n, &rng, 0.5f);
        void *out = xcalloc(n, es), *res = xcalloc(n, es), *rout = xcalloc(n, es);
        float *rstd = xcalloc(N, 4), *rrstd = xcalloc(N, 4), *dw = xcalloc(C, 4);
        be->rmsnorm_fwd(dt, out, rstd, x.p, w.p, N, C, eps);
        be->residual_rmsnorm_fwd(dt, res, rout, rrstd, x.p, b.p, w.p, N, C, eps);
        for (int c = 0; c < C; c++) dw[c] = 0.25f; // accumulated into
        be->rmsnorm_bwd(dt, d0.p, dw, dy.p, x.p, w.p, rstd, N, C);
        write_f32("x", x.f, n); write_f32("b", b.f, n); write_f32("w", w.f, C); write_f32("dy", dy.f, n);
        write_f32("d0", d0.f, n);
        write_dt("out", dt, out, n); write_f32("rstd", rstd, N);
        write_dt("res", dt, res, n); write_dt("rout", dt, rout, n); write_f32("rrstd", rrstd, N);
        write_dt("dinp", dt, d0.p, n); write_f32("dw", dw, C);
    } else if (!strcmp(op, "swiglu") && argc == 7) {
        int N = arg_int(argv, 5), F = arg_int(argv, 6);
        size_t n = (size_t)N * F;
        Ten gu = ten(dt, 2 * n, &rng, 6.0f), dy = ten(dt, n, &rng, 1.0f);
        void *out = xcalloc(n, es), *dgu = xcalloc(2 * n, es);
        be->swiglu_fwd(dt, out, gu.p, N, F);
        be->swiglu_bwd(dt, dgu, dy.p, gu.p, N, F);
        write_f32("gu", gu.f, 2 * n); write_f32("dy", dy.f, n);
        write_dt("out", dt, out, n); write_dt("dgu", dt, dgu, 2 * n);
    } else if (!strcmp(op, "rope") && argc == 15) {
        int B = arg_int(argv, 5), T = arg_int(argv, 6), NHd = arg_int(argv, 7), hs = arg_int(argv, 8);
        RopeConfig rc = { atof(argv[9]), atof(argv[10]), atof(argv[11]), atof(argv[12]), arg_int(argv, 13) };
        int pos0 = arg_int(argv, 14);
        size_t n = (size_t)B * T * NHd * hs;
        Ten x = ten(dt, n, &rng, 2.0f), dy = ten(dt, n, &rng, 1.0f);
        int32_t *pos = xcalloc(T, sizeof(int32_t));
        for (int t = 0; t < T; t++) pos[t] = pos0 + 3 * t;
        write_f32("x", x.f, n); write_f32("dy", dy.f, n);
        AttnView vx = { dt, x.p, (size_t)T * NHd * hs, (size_t)NHd * hs }, vd = vx;
        vd.p = dy.p;
        void *x2 = xcalloc(n, es);
        memcpy(x2, x.p, n * es);
        be->rope_fwd(vx, B, T, NHd, hs, pos, 0, &rc);
        be->rope_bwd(vd, B, T, NHd, hs, pos, 0, &rc);
        write_dt("out", dt, x.p, n); write_dt("dx", dt, dy.p, n);
        vx.p = x2;
        be->rope_fwd(vx, B, T, NHd, hs, NULL, pos0, &rc);
        write_dt("out_offset", dt, x2, n);
        double *inv = xcalloc(hs / 2 + 1, sizeof(double));
        rope_inv_freq(&rc, hs, inv);
        float *invf = xcalloc(hs / 2 + 1, sizeof(float));
        for (int i = 0; i < hs / 2; i++) invf[i] = (float)inv[i];
        write_f32("inv_freq", invf, hs / 2);
        free(pos); free(x2); free(inv); free(invf);
    } else if (!strcmp(op, "gqa") && argc == 16) {
        int B = arg_int(argv, 5), T = arg_int(argv, 6), NH = arg_int(argv, 7), NKV = arg_int(argv, 8), hs = arg_int(argv, 9);
        int use_rope = arg_int(argv, 10);
        RopeConfig rc = { atof(argv[11]), atof(argv[12]), atof(argv[13]), atof(argv[14]), arg_int(argv, 15) };
        const RopeConfig *rope = use_rope ? &rc : NULL;
        if (B <= 0 || T <= 0 || T % 4 || NH <= 0 || NKV <= 0 || NH % NKV || hs <= 0)
            die("bad shape: B=%d T=%d (a multiple of 4) NH=%d NKV=%d (dividing NH) hs=%d", B, T, NH, NKV, hs);
        int W = (NH + 2 * NKV) * hs, Cq = NH * hs, Ck = NKV * hs, cs = T / 4;
        size_t n3 = (size_t)B * T * W, nq = (size_t)B * T * Cq, nk = (size_t)B * T * Ck, nl = (size_t)B * NH * T;
        Ten qkv = ten(dt, n3, &rng, 2.0f), dout = ten(dt, nq, &rng, 1.0f);
        write_f32("qkv", qkv.f, n3); write_f32("dout", dout.f, nq);
        void *out = xcalloc(nq, es), *dqkv = xcalloc(n3, es);
        float *lse = xcalloc(nl, 4);
        be->set_threads(1);
        be->attention_gqa_fwd(dt, out, lse, qkv.p, B, T, NH, NKV, hs, rope);
        be->attention_gqa_bwd(dt, dqkv, dout.p, qkv.p, out, lse, B, T, NH, NKV, hs, rope);
        write_dt("out", dt, out, nq); write_f32("lse", lse, nl); write_dt("dqkv", dt, dqkv, n3);
        { // the same bits for another thread count (every output reduced in a fixed order)
            void *out3 = xcalloc(nq, es), *dqkv3 = xcalloc(n3, es);
            float *lse3 = xcalloc(nl, 4);
            be->set_threads(3);
            be->attention_gqa_fwd(dt, out3, lse3, qkv.p, B, T, NH, NKV, hs, rope);
            be->attention_gqa_bwd(dt, dqkv3, dout.p, qkv.p, out3, lse3, B, T, NH, NKV, hs, rope);
            be->set_threads(1);
            if (memcmp(out, out3, nq * es) || memcmp(lse, lse3, nl * 4) || memcmp(dqkv, dqkv3, n3 * es))
                die("gqa: 3 threads give other bits than 1");
            printf("gqa: 1 and 3 threads bitwise equal\n");
            free(out3); free(dqkv3); free(lse3);
        }
        if (NH == NKV && !rope) { // multi-head attention: bitwise what the GPT-2 ops give on the same qkv
            void *out2 = xcalloc(nq, es), *dqkv2 = xcalloc(n3, es);
            float *lse2 = xcalloc(nl, 4);
            be->attention_fwd(dt, out2, lse2, qkv.p, B, T, Cq, NH);
            be->attention_bwd(dt, dqkv2, dout.p, qkv.p, out2, lse2, B, T, Cq, NH);
            if (memcmp(out, out2, nq * es) || memcmp(lse, lse2, nl * 4) || memcmp(dqkv, dqkv2, n3 * es))
                die("gqa with NKV = NH and no RoPE differs from attention_fwd/bwd");
            printf("gqa with NKV = NH: bitwise attention_fwd/bwd\n");
            free(out2); free(dqkv2); free(lse2);
        }

        float *bout = xcalloc(nq, 4), *blse = xcalloc(nl, 4), *chunk_lse = xcalloc(nl, 4);
        float *dq = xcalloc(nq, 4), *dk = xcalloc(nk, 4), *dv = xcalloc(nk, 4);
        static const int ranks[2][2] = { { 0, 3 }, { 1, 2 } };
        size_t s3 = (size_t)T * W, sq = (size_t)T * Cq, sk = (size_t)T * Ck;
        for (int pass = 0; pass < 2; pass++)
            for (int r = 0; r < 2; r++)
                for (int a = 0; a < 2; a++) {
                    int qc = ranks[r][a];
                    AttnView q = { dt, (char *)qkv.p + (size_t)qc * cs * W * es, s3, (size_t)W };
                    AttnView o = { DT_F32, bout + (size_t)qc * cs * Cq, sq, (size_t)Cq };
                    AttnView g = { dt, (char *)dout.p + (size_t)qc * cs * Cq * es, sq, (size_t)Cq };
                    AttnView vq = { DT_F32, dq + (size_t)qc * cs * Cq, sq, (size_t)Cq };
                    float *l = chunk_lse + (size_t)qc * B * NH * cs;
                    for (int j = 0; j < 4; j++) { // ring order: this rank's chunks, then the other rank's
                        int kc = ranks[(r + j / 2) % 2][j % 2];
                        AttnView k = { dt, (char *)qkv.p + ((size_t)kc * cs * W + Cq) * es, s3, (size_t)W }, v = k;
                        v.p = (char *)k.p + (size_t)Ck * es;
                        if (pass == 0) {
                            be->attention_gqa_block_fwd(o, l, q, k, v, B, NH, NKV, hs, cs, qc * cs, cs, kc * cs, rope, j > 0);
                        } else {
                            AttnView vk = { DT_F32, dk + (size_t)kc * cs * Ck, sk, (size_t)Ck }, vv = vk;
                            vv.p = dv + (size_t)kc * cs * Ck;
                            be->attention_gqa_block_bwd(vq, vk, vv, g, o, l, q, k, v, B, NH, NKV, hs, cs, qc * cs, cs,
                                                        kc * cs, rope);
                        }
                    }
                }
        for (int c = 0; c < 4; c++) // chunk-major [chunk][B][NH][cs] to [B][NH][T]
            for (int bh = 0; bh < B * NH; bh++)
                memcpy(blse + (size_t)bh * T + (size_t)c * cs, chunk_lse + ((size_t)c * B * NH + bh) * cs, sizeof(float) * cs);
        write_f32("bout", bout, nq); write_f32("blse", blse, nl);
        write_f32("bdq", dq, nq); write_f32("bdk", dk, nk); write_f32("bdv", dv, nk);
        free(out); free(dqkv); free(lse); free(bout); free(blse); free(chunk_lse); free(dq); free(dk); free(dv);
    } else {
        die("llama_check: unknown op %s or wrong argument count %d (see the opening comment)", op, argc);
    }
    printf("wrote %s: %s %s\n", g_dir, op, dtype_name(dt));
    return 0;
}

// attention_check: runs the CPU backend's attention on random inputs and writes inputs and results as
// raw float32 files for test/attention_ref.py, which checks them against PyTorch.
//
//   build/attention_check DIR fp32|bf16 B T C NH SEED
//
// Whole sequence: attention_fwd and attention_bwd. Blocks, as context parallelism with two ranks and a
// zigzag split uses them: the sequence in four chunks of T/4, rank 0 holding chunks 0 and 3 and rank 1
// chunks 1 and 2; each query chunk meets the key chunks in ring order (its own rank's two first, then the
// other rank's), merged into fp32 accumulators; then the backward of every pair, accumulated in fp32.
// Files (row-major float32): qkv [B,T,3C], dout [B,T,C] (the stored values: bf16 widened), out, lse
// [B,NH,T], dqkv (whole); bout, blse [B,NH,T], bdq, bdk, bdv [B,T,C] (blocks).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

static void write_f32(const char *dir, const char *name, const float *x, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
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
    Ten t = { xcalloc(n, dtype_size(dt)), xcalloc(n, sizeof(float)) };
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

static void widen(DType dt, const void *p, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = dt == DT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

int main(int argc, char **argv) {
    if (argc != 8) die("usage: attention_check DIR fp32|bf16 B T C NH SEED");
    const char *dir = argv[1];
    DType dt = !strcmp(argv[2], "bf16") ? DT_BF16 : DT_F32;
    int B = atoi(argv[3]), T = atoi(argv[4]), C = atoi(argv[5]), NH = atoi(argv[6]);
    uint64_t rng = (uint64_t)atoll(argv[7]);
    if (B <= 0 || T <= 0 || T % 4 || NH <= 0 || C % NH) die("bad shape: B=%d T=%d (a multiple of 4) C=%d NH=%d", B, T, C, NH);
    const Backend *be = backend_cpu();
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T, es = dtype_size(dt);
    int hs = C / NH, cs = T / 4;
    Ten qkv = ten(dt, n3, &rng, 2.0f), dout = ten(dt, n1, &rng, 1.0f);
    write_f32(dir, "qkv", qkv.f, n3);
    write_f32(dir, "dout", dout.f, n1);

    void *out = xcalloc(n1, es), *dqkv = xcalloc(n3, es);
    float *lse = xcalloc(nl, sizeof(float)), *f = xcalloc(n3, sizeof(float));
    be->attention_fwd(dt, out, lse, qkv.p, B, T, C, NH);
    be->attention_bwd(dt, dqkv, dout.p, qkv.p, out, lse, B, T, C, NH);
    widen(dt, out, f, n1);
    write_f32(dir, "out", f, n1);
    write_f32(dir, "lse", lse, nl);
    widen(dt, dqkv, f, n3);
    write_f32(dir, "dqkv", f, n3);

    float *bout = xcalloc(n1, 4), *blse = xcalloc(nl, 4), *chunk_lse = xcalloc(nl, 4);
    float *dq = xcalloc(n1, 4), *dk = xcalloc(n1, 4), *dv = xcalloc(n1, 4);
    static const int ranks[2][2] = { { 0, 3 }, { 1, 2 } };
    size_t s3 = (size_t)T * 3 * C, s1 = (size_t)T * C;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < 2; r++)
            for (int a = 0; a < 2; a++) {
                int qc = ranks[r][a];
                AttnView q = { dt, (char *)qkv.p + (size_t)qc * cs * 3 * C * es, s3, 3 * (size_t)C };
                AttnView o = { DT_F32, bout + (size_t)qc * cs * C, s1, (size_t)C };
                AttnView g = { dt, (char *)dout.p + (size_t)qc * cs * C * es, s1, (size_t)C };
                AttnView vq = { DT_F32, dq + (size_t)qc * cs * C, s1, (size_t)C };
                float *l = chunk_lse + (size_t)qc * B * NH * cs;
                for (int j = 0; j < 4; j++) { // ring order: this rank's chunks, then the other rank's
                    int kc = ranks[(r + j / 2) % 2][j % 2];
                    AttnView k = { dt, (char *)qkv.p + ((size_t)kc * cs * 3 * C + C) * es, s3, 3 * (size_t)C }, v = k;
                    v.p = (char *)k.p + (size_t)C * es;
                    if (pass == 0) {
                        be->attention_block_fwd(o, l, q, k, v, B, NH, hs, cs, qc * cs, cs, kc * cs, j > 0);
                    } else {
                        AttnView vk = { DT_F32, dk + (size_t)kc * cs * C, s1, (size_t)C }, vv = vk;
                        vv.p = dv + (size_t)kc * cs * C;
                        be->attention_block_bwd(vq, vk, vv, g, o, l, q, k, v, B, NH, hs, cs, qc * cs, cs, kc * cs);
                    }
                }
            }
    for (int c = 0; c < 4; c++) // chunk-major [chunk][B][NH][cs] to [B][NH][T]
        for (int bh = 0; bh < B * NH; bh++)
            memcpy(blse + (size_t)bh * T + (size_t)c * cs, chunk_lse + ((size_t)c * B * NH + bh) * cs, sizeof(float) * cs);
    write_f32(dir, "bout", bout, n1);
    write_f32(dir, "blse", blse, nl);
    write_f32(dir, "bdq", dq, n1);
    write_f32(dir, "bdk", dk, n1);
    write_f32(dir, "bdv", dv, n1);
    printf("wrote %s: %s B=%d T=%d C=%d NH=%d\n", dir, dtype_name(dt), B, T, C, NH);
    free(qkv.p); free(qkv.f); free(dout.p); free(dout.f); free(out); free(dqkv); free(lse); free(f);
    free(bout); free(blse); free(chunk_lse); free(dq); free(dk); free(dv);
    return 0;
}

// model.c: GPT-2 and the Llama family on one device. All device memory goes through the backend; the host only touches
// parameters when they are initialised, loaded or saved, and the losses and logits it reads back.
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives.h"
#include "common.h"

const char *const PARAM_NAMES[NUM_PARAM_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb", "lmhead",
};
const char *const ARCH_NAMES[2] = { "gpt2", "llama" };
const char *const RECOMPUTE_NAMES[3] = { "none", "selective", "full" };

int gpt2_tensor_shape(const GPT2Config *c, int k, int64_t d[3]) {
    int64_t C = c->C, L = c->L, hs = c->C / c->NH, F = c->F, llama = c->arch == ARCH_LLAMA;
    int64_t qkv = llama ? (c->NH + 2 * (int64_t)c->NKV) * hs : 3 * C, inner = llama ? c->NH * hs : C;
    int bias = k == P_QKVB || k == P_ATTPROJB || k == P_LN1B || k == P_LN2B || k == P_FCB || k == P_FCPROJB || k == P_LNFB;
    if (llama && (bias || k == P_WPE)) return 0;
    if (k == P_LMHEAD && (!llama || c->tie)) return 0;
    switch (k) {
    case P_WTE: case P_LMHEAD: d[0] = c->Vp, d[1] = C; return 2;
    case P_WPE: d[0] = c->maxT, d[1] = C; return 2;
    case P_QKVW: d[0] = L, d[1] = qkv, d[2] = C; return 3;
    case P_QKVB: d[0] = L, d[1] = qkv; return 2;
    case P_ATTPROJW: d[0] = L, d[1] = C, d[2] = inner; return 3;
    case P_FCW: d[0] = L, d[1] = llama ? 2 * F : 4 * C, d[2] = C; return 3;
    case P_FCB: d[0] = L, d[1] = 4 * C; return 2;
    case P_FCPROJW: d[0] = L, d[1] = C, d[2] = llama ? F : 4 * C; return 3;
    case P_LNFW: case P_LNFB: d[0] = C; return 1;
    default: d[0] = L, d[1] = C; return 2; // ln1w ln1b attprojb ln2w ln2b fcprojb
    }
}

size_t gpt2_param_layout(const GPT2Config *cfg, size_t sizes[NUM_PARAM_TENSORS], size_t offsets[NUM_PARAM_TENSORS]) {
    size_t total = 0;
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        int64_t d[3];
        int nd = gpt2_tensor_shape(cfg, k, d);
        size_t n = nd ? 1 : 0;
        for (int i = 0; i < nd; i++) n *= (size_t)d[i];
        sizes[k] = n;
        offsets[k] = total;
        total += n;
    }
    return total;
}

// Llama 3.1's frequency scaling as --rope-scaling takes it: factor 1 to 1e6, 0 < low < high, an original
// context of 1 to 1e9 (one place for the flag, config.json and a checkpoint's manifest).
static int rope_scaling_in_range(double factor, double low, double high, double orig) {
    return factor >= 1 && factor <= 1e6 && low > 0 && high > low && orig >= 1 && orig <= 1e9;
}

int gpt2_config_valid(const GPT2Config *cfg, char *why, size_t cap) {
    if (cfg->L <= 0 || cfg->C <= 0 || cfg->NH <= 0 || cfg->V <= 0 || cfg->maxT <= 0)
        return snprintf(why, cap, "layers, channels, heads, vocab and max sequence length must be positive"), 0;
    if (cfg->C % cfg->NH != 0)
        return snprintf(why, cap, "channels (%d) must be divisible by heads (%d)", cfg->C, cfg->NH), 0;
    if (cfg->Vp < cfg->V)
        return snprintf(why, cap, "padded vocab (%d) is smaller than vocab (%d)", cfg->Vp, cfg->V), 0;
    if (cfg->arch == ARCH_LLAMA) {
        if (cfg->NKV <= 0 || cfg->NH % cfg->NKV)
            return snprintf(why, cap, "heads (%d) must be a positive multiple of kv heads (%d)", cfg->NH, cfg->NKV), 0;
        if ((cfg->C / cfg->NH) % 2)
            return snprintf(why, cap, "rotary embeddings need an even head size (channels %d / heads %d)", cfg->C, cfg->NH), 0;
        if (cfg->F <= 0) return snprintf(why, cap, "the SwiGLU size (--ffn) must be positive, got %d", cfg->F), 0;
        // the flags' ranges (options.c, rope_scaling_parse), for every source of a shape: flags, config.json,
        // a checkpoint's manifest
        // (norm_eps is a float: 1e-12f, which is just below the double 1e-12)
        if (!(cfg->norm_eps >= 1e-12f && cfg->norm_eps <= 1) || !(cfg->rope.theta > 1 && cfg->rope.theta <= 1e12))
            return snprintf(why, cap, "the norm epsilon (%g) must be from 1e-12 to 1 and the rope theta (%g) above 1 and at most "
                            "1e12", cfg->norm_eps, cfg->rope.theta), 0;
        const RopeConfig *r = &cfg->rope;
        if (r->factor != 0 && !rope_scaling_in_range(r->factor, r->low_freq_factor, r->high_freq_factor, r->original_max_pos))
            return snprintf(why, cap, "rope scaling (factor %g, low %g, high %g, original context %d) needs a factor from 1 to 1e6, "
                            "0 < low < high and a context of at least 1", r->factor, r->low_freq_factor, r->high_freq_factor,
                            r->original_max_pos), 0;
    } else if (cfg->arch != ARCH_GPT2) {
        return snprintf(why, cap, "unknown architecture %d", cfg->arch), 0;
    }
    if (cfg->L > 4096 || cfg->C > 65536 || cfg->maxT > 1048576 || cfg->Vp > 1048576)
        return snprintf(why, cap, "shape out of range (L=%d C=%d maxT=%d Vp=%d)", cfg->L, cfg->C, cfg->maxT, cfg->Vp), 0;
    return 1;
}

GPT2Config gpt2_shape(const char *preset, int L, int C, int NH, int V, int max_seq_len, int seq_len) {
    GPT2Config cfg;
    memset(&cfg, 0, sizeof cfg);
    const char *name = preset ? preset : "d12";
    int depth;
    if (!strcmp(name, "d12")) depth = 12;
    else if (!strcmp(name, "d24")) depth = 24;
    else if (!strcmp(name, "d36")) depth = 36;
    else if (!strcmp(name, "d48")) depth = 48;
    else die("--model must be d12, d24, d36 or d48 (GPT-2), or llama3-tiny, llama3.2-1b, llama3-8b, llama3-70b or llama3-405b, got '%s'", name);
    static const int channels[] = { 768, 1024, 1280, 1600 }, heads[] = { 12, 16, 20, 25 };
    cfg.L = L ? L : depth;
    cfg.C = C ? C : channels[depth / 12 - 1];
    cfg.NH = NH ? NH : heads[depth / 12 - 1];
    cfg.V = V ? V : 50257;
    cfg.maxT = 1024;
    if (!preset && (L || C || NH || V || max_seq_len) && seq_len) cfg.maxT = seq_len; // a custom shape is as long as asked
    if (max_seq_len) cfg.maxT = max_seq_len;
    cfg.Vp = (cfg.V + 127) / 128 * 128;
    char why[256];
    if (!gpt2_config_valid(&cfg, why, sizeof why)) die("bad model shape: %s", why);
    return cfg;
}

// The Llama family's presets, from Meta's published configurations (HF config.json): layers, channels,
// heads, kv heads, SwiGLU size, vocabulary, context, RoPE (Llama 3.1's scaling: factor 8 for 405B, 32 for
// the 3.2 models; low 1, high 4, original context 8192), RMSNorm epsilon 1e-5, and whether the head is
// tied. llama3-tiny is for tests: byte vocabulary, GQA with 2 kv heads for 4 query heads.
int llama_preset(const char *name, GPT2Config *cfg) {
    static const struct {
        const char *name;
        int L, C, NH, NKV, F, V, maxT, tie;
        double theta, factor;
    } P[] = {
        { "llama3-tiny", 2, 64, 4, 2, 160, 256, 256, 0, 500000, 0 },
        { "llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, 1, 500000, 32 },
        { "llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 0, 500000, 0 },
        { "llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 0, 500000, 0 },
        { "llama3-405b", 126, 16384, 128, 8, 53248, 128256, 131072, 0, 500000, 8 },
    };
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
        if (strcmp(P[i].name, name)) continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->arch = ARCH_LLAMA;
        cfg->L = P[i].L, cfg->C = P[i].C, cfg->NH = P[i].NH, cfg->NKV = P[i].NKV, cfg->F = P[i].F;
        cfg->V = P[i].V, cfg->Vp = (P[i].V + 127) / 128 * 128, cfg->maxT = P[i].maxT, cfg->tie = P[i].tie;
        cfg->norm_eps = 1e-5f;
        cfg->rope.theta = P[i].theta;
        if (P[i].factor > 0) {
            cfg->rope.factor = P[i].factor;
            cfg->rope.low_freq_factor = 1, cfg->rope.high_freq_factor = 4, cfg->rope.original_max_pos = 8192;
        }
        return 1;
    }
    return 0;
}

const char *rope_scaling_text(const RopeConfig *r, char *buf, size_t cap) {
    if (r->factor == 0) snprintf(buf, cap, "none");
    else snprintf(buf, cap, "%.17g,%.17g,%.17g,%d", r->factor, r->low_freq_factor, r->high_freq_factor, r->original_max_pos);
    return buf;
}

int rope_scaling_parse(const char *s, RopeConfig *r, char *why, size_t cap) {
    double theta = r->theta;
    if (!strcmp(s, "none")) {
        memset(r, 0, sizeof *r);
        r->theta = theta;
        return 0;
    }
    double v[4] = { 0, 1, 4, 8192 };
    int n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || n == 4) break;
        v[n++] = x;
        if (*end == 0) {
            p = end;
            break;
        }
        if (*end != ',') break;
        p = end + 1;
    }
    if (*p || n == 0)
        return snprintf(why, cap, "'%s': expected none or FACTOR[,LOW,HIGH,ORIG] (e.g. 8 or 32,1,4,8192)", s), -1;
    if (!rope_scaling_in_range(v[0], v[1], v[2], v[3]) || v[3] != (int)v[3])
        return snprintf(why, cap, "'%s': needs FACTOR >= 1, 0 < LOW < HIGH and a whole ORIG context >= 1", s), -1;
    *r = (RopeConfig){ .theta = theta, .factor = v[0], .low_freq_factor = v[1], .high_freq_factor = v[2],
                       .original_max_pos = (int)v[3] };
    return 0;
}

GPT2Config model_shape(const char *preset, const ShapeFlags *f, int seq_len) {
    GPT2Config cfg;
    int is_llama = preset && llama_preset(preset, &cfg);
    if (f->arch == ARCH_GPT2 && is_llama) die("--model %s is a Llama: drop --arch gpt2 (or give --arch llama)", preset);
    if (f->arch == ARCH_LLAMA && preset && !is_llama)
        die("--arch llama: --model must be llama3-tiny, llama3.2-1b, llama3-8b, llama3-70b or llama3-405b, got '%s'", preset);
    if (!is_llama && f->arch != ARCH_LLAMA) {
        if (f->NKV || f->F || f->tie >= 0 || f->rope_theta || f->norm_eps || f->rope_scaling)
            die("--kv-heads, --ffn, --tie-embeddings, --rope-theta, --rope-scaling and --norm-eps are the Llama family's: give --arch llama "
                "or a Llama --model");
        return gpt2_shape(preset, f->L, f->C, f->NH, f->V, f->maxT, seq_len);
    }
    if (!preset) {
        llama_preset("llama3.2-1b", &cfg);
        memset(&cfg.rope, 0, sizeof cfg.rope); // a custom shape: plain RoPE, no pretrained model's context scaling
        cfg.rope.theta = 500000;
    }
    int custom = !preset && (f->L || f->C || f->NH || f->V || f->maxT);
    if (f->L) cfg.L = f->L;
    if (f->C) cfg.C = f->C;
    if (f->NH) cfg.NH = f->NH, cfg.NKV = f->NH; // (--kv-heads below overrides)
    if (f->NKV) cfg.NKV = f->NKV;
    if (f->C && !preset) cfg.F = (8 * f->C / 3 + 255) / 256 * 256;
    if (f->F) cfg.F = f->F;
    if (f->V) cfg.V = f->V, cfg.Vp = (f->V + 127) / 128 * 128;
    if (custom && seq_len) cfg.maxT = seq_len;
    if (f->maxT) cfg.maxT = f->maxT;
    if (f->tie >= 0) cfg.tie = f->tie;
    if (f->rope_theta) cfg.rope.theta = f->rope_theta;
    char err[256];
    if (f->rope_scaling && rope_scaling_parse(f->rope_scaling, &cfg.rope, err, sizeof err) != 0) die("--rope-scaling %s", err);
    if (f->norm_eps) cfg.norm_eps = (float)f->norm_eps;
    char why[256];
    if (!gpt2_config_valid(&cfg, why, sizeof why)) die("bad model shape: %s", why);
    return cfg;
}

int gpt2_param_decays(int k) {
    return k == P_WTE || k == P_WPE || k == P_QKVW || k == P_ATTPROJW || k == P_FCW || k == P_FCPROJW || k == P_LMHEAD;
}

// ---------------------------------------------------------------------------------------------
// initialisation

// Standard normal from a counter: Box-Muller on two 53-bit uniforms derived from (key, i).
static double normal_at(uint64_t key, uint64_t i) {
    uint64_t a = mix64(key ^ mix64(2 * i)), b = mix64(key ^ mix64(2 * i + 1));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0; // (0, 1]
    double u2 = (b >> 11) / 9007199254740992.0;         // [0, 1)
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float *gpt2_init_params(const GPT2Config *cfg, uint64_t seed) {
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    size_t n = gpt2_param_layout(cfg, sizes, offsets);
    float *p = xmalloc(sizeof(float) * n);
    double resid_std = 0.02 / sqrt(2.0 * cfg->L);
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        float *t = p + offsets[k];
        size_t sz = sizes[k];
        int is_ln_weight = (k == P_LN1W || k == P_LN2W || k == P_LNFW);
        int is_bias = (k == P_LN1B || k == P_LN2B || k == P_LNFB || k == P_QKVB || k == P_ATTPROJB ||
                       k == P_FCB || k == P_FCPROJB);
        if (is_ln_weight || is_bias) {
            float v = is_ln_weight ? 1.0f : 0.0f;
            for (size_t i = 0; i < sz; i++) t[i] = v;
            continue;
        }
        double std = (k == P_ATTPROJW || k == P_FCPROJW) ? resid_std : 0.02;
        uint64_t key = mix64(mix64(seed) + (uint64_t)k);
        // padded vocabulary rows stay zero so that their logits are exactly 0 and never trained
        size_t live = (k == P_WTE || k == P_LMHEAD) ? (size_t)cfg->V * cfg->C : sz;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < sz; i++) t[i] = i < live ? (float)(std * normal_at(key, i)) : 0.0f;
    }
    return p;
}

// ---------------------------------------------------------------------------------------------
// llm.c model files

// The header of an llm.c model file, checked against the file's size; returns the open file and its
// version (3 fp32, 5 bf16).
static FILE *open_model_file(const char *path, GPT2Config *cfg, int *version) {
    FILE *f = xfopen(path, "rb");
    int32_t h[256];
    xfread(h, sizeof(int32_t), 256, f, path);
    memset(cfg, 0, sizeof *cfg); // GPT-2: the Llama fields zero
    if (h[0] != MODEL_MAGIC) die("%s: bad magic %d (expected %d for an llm.c model file)", path, h[0], MODEL_MAGIC);
    memset(cfg, 0, sizeof *cfg); // GPT-2: the Llama fields are zero
    if (h[1] != MODEL_VERSION_F32 && h[1] != MODEL_VERSION_BF16)
        die("%s: unsupported model file version %d (expected 3 = fp32 or 5 = bf16)", path, h[1]);
    cfg->maxT = h[2];
    cfg->V = h[3];
    cfg->L = h[4];
    cfg->NH = h[5];
    cfg->C = h[6];
    cfg->Vp = h[7];
    char why[256];
    if (!gpt2_config_valid(cfg, why, sizeof why)) die("%s: inconsistent model header: %s", path, why);
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    size_t n = gpt2_param_layout(cfg, sizes, offsets);
    size_t esize = h[1] == MODEL_VERSION_F32 ? 4 : 2;
    if (fseek(f, 0, SEEK_END) != 0) die("cannot seek %s: %s", path, strerror(errno));
    long fsize = ftell(f);
    if (fsize < 0) die("cannot size %s: %s", path, strerror(errno));
    size_t expect = 256 * sizeof(int32_t) + n * esize;
    if ((size_t)fsize != expect)
        die("%s: inconsistent model header: the shape needs %zu bytes but the file has %ld", path, expect, fsize);
    *version = h[1];
    return f;
}

void gpt2_file_shape(const char *path, GPT2Config *cfg) {
    int version;
    fclose(open_model_file(path, cfg, &version));
}

void gpt2_check_finite(const GPT2Config *cfg, const float *p, const char *source) {
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS];
    gpt2_param_layout(cfg, sizes, off);
    for (int k = 0; k < NUM_PARAM_TENSORS; k++)
        for (size_t i = 0; i < sizes[k]; i++)
            if (!isfinite(p[off[k] + i]))
                die("%s: %s element %zu of %zu is %g: not a model to start from", source, PARAM_NAMES[k], i, sizes[k],
                    (double)p[off[k] + i]);
}

float *gpt2_load_file(const char *path, GPT2Config *cfg) {
    int version;
    FILE *f = open_model_file(path, cfg, &version);
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    size_t n = gpt2_param_layout(cfg, sizes, offsets);
    size_t esize = version == MODEL_VERSION_F32 ? 4 : 2;
    if (fseek(f, 256 * sizeof(int32_t), SEEK_SET) != 0) die("cannot seek %s: %s", path, strerror(errno));
    float *p = xmalloc(sizeof(float) * n);
    if (esize == 4) {
        xfread(p, sizeof(float), n, f, path);
    } else {
        uint16_t *tmp = xmalloc(2 * n);
        xfread(tmp, 2, n, f, path);
        for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(tmp[i]);
        free(tmp);
    }
    fclose(f);
    gpt2_check_finite(cfg, p, path);
    return p;
}

void gpt2_save_file(const char *path, const GPT2Config *cfg, const float *host_params) {
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    size_t n = gpt2_param_layout(cfg, sizes, offsets);
    int32_t h[256] = { 0 };
    h[0] = MODEL_MAGIC;
    h[1] = MODEL_VERSION_F32;
    h[2] = cfg->maxT;
    h[3] = cfg->V;
    h[4] = cfg->L;
    h[5] = cfg->NH;
    h[6] = cfg->C;
    h[7] = cfg->Vp;
    SafeFile sf;
    safe_open_or_die(&sf, path);
    safe_write_or_die(&sf, h, sizeof h);
    safe_write_or_die(&sf, host_params, sizeof(float) * n);
    safe_commit_or_die(&sf);
}

// ---------------------------------------------------------------------------------------------
// buffers

static void *at(const void *base, size_t elems, DType dt) { return (char *)base + elems * dtype_size(dt); }

static int is_final_tensor(int k) { return k == P_LNFW || k == P_LNFB || k == P_LMHEAD; } // the last unit
static int is_layer_tensor(int k) { return k != P_WTE && k != P_WPE && !is_final_tensor(k); }

int gpt2_tensor_replicated(const GPT2 *m, int k) {
    if (m->lay->tp.size == 1) return 0;
    return k == P_WPE || k == P_LN1W || k == P_LN1B || k == P_LN2W || k == P_LN2B || k == P_ATTPROJB ||
           k == P_FCPROJB || k == P_LNFW || k == P_LNFB;
}

int gpt2_tensor_counted(const GPT2 *m, int k) {
    if ((k == P_WTE || k == P_WPE) && !m->first) return 0;
    return !(gpt2_tensor_replicated(m, k) && m->lay->tp.rank != 0);
}

size_t gpt2_counted_len(const GPT2 *m, int k, size_t len) {
    if (!gpt2_tensor_counted(m, k)) return 0;
    int TP = m->lay->tp.size;
    if (k == P_QKVW && m->cfg.arch == ARCH_LLAMA && m->cfg.NKV < TP && m->lay->tp.rank % (TP / m->cfg.NKV))
        return (size_t)m->NH_tp * m->hs * m->cfg.C;
    return len;
}

int gpt2_tensor_layers(const GPT2 *m, int k) { return is_layer_tensor(k) ? m->nl : 1; }

int gpt2_next_slice(const GPT2 *m, size_t off, size_t len, TensorSlice *s) {
    for (;;) {
        if (++s->l >= gpt2_tensor_layers(m, s->k)) {
            s->l = -1;
            if (++s->k >= NUM_PARAM_TENSORS) return 0;
            continue;
        }
        size_t toff, tlen;
        gpt2_tensor_range(m, s->k, s->l, &toff, &tlen);
        s->start = toff;
        s->a = toff > off ? toff : off;
        s->e = toff + tlen < off + len ? toff + tlen : off + len;
        if (s->a < s->e) return 1;
    }
}

void gpt2_place_unit_params(GPT2 *m, int unit, void *params) { m->unit_params[unit] = params; }
void gpt2_place_unit_grads(GPT2 *m, int unit, float *grads) { m->unit_grads[unit] = grads; }

void gpt2_set_hooks(GPT2 *m, void *ctx, void (*fetch)(void *ctx, int unit), void (*ready)(void *ctx, int unit)) {
    m->hook_ctx = ctx;
    m->fetch_unit = fetch;
    m->grads_ready = ready;
}

int gpt2_unit_of(const GPT2 *m, int k, int l) {
    if (k == P_WTE || k == P_WPE) return UNIT_EMBED;
    if (is_final_tensor(k)) return m->nl + 1;
    return 1 + l;
}

void gpt2_tensor_range(const GPT2 *m, int k, int l, size_t *off, size_t *len) {
    *len = is_layer_tensor(k) ? m->param_sizes[k] / m->nl : m->param_sizes[k];
    *off = m->unit_offset[gpt2_unit_of(m, k, l)] + m->in_unit[k];
}

// This rank's tensor sizes: the tensor-parallel splits of Megatron-LM. QKV and the MLP's first matmul
// are split by output rows (whole heads), the two output projections by input columns, the token
// embedding by vocabulary rows; the rest is replicated.
static void local_sizes(GPT2 *m) {
    size_t C = m->cfg.C, L = (size_t)m->nl, Ct = (size_t)m->C_tp;
    size_t *s = m->param_sizes;
    // per-layer tensors: this pipeline stage's blocks; the embeddings live on the first stage and (for
    // the tied head) on the last; the final LayerNorm on the last
    for (int k = 0; k < NUM_PARAM_TENSORS; k++)
        if (is_layer_tensor(k)) s[k] = s[k] / m->cfg.L * L;
    int llama = m->cfg.arch == ARCH_LLAMA, embed = m->first || (m->last && m->head_k == P_WTE);
    s[P_WTE] = embed ? (size_t)m->Vp_tp * C : 0;
    s[P_WPE] = embed && !llama ? s[P_WPE] : 0;
    s[P_LNFW] = m->last ? C : 0;
    s[P_LNFB] = m->last && !llama ? C : 0;
    s[P_LMHEAD] = m->last && m->head_k == P_LMHEAD ? (size_t)m->Vp_tp * C : 0; // the untied head: vocabulary rows
    s[P_QKVW] = L * (size_t)m->qkv_tp * C;
    s[P_QKVB] = llama ? 0 : L * (size_t)m->qkv_tp;
    s[P_ATTPROJW] = L * C * Ct;
    s[P_ATTPROJB] = llama ? 0 : s[P_ATTPROJB];
    s[P_FCW] = L * (size_t)m->fc_tp * C;
    s[P_FCB] = llama ? 0 : L * (size_t)m->fc_tp;
    s[P_FCPROJW] = L * C * (size_t)m->mlp_tp;
}

// Unit-major layout: unit offsets and each tensor's place inside its unit.
static void build_units(GPT2 *m) {
    int L = m->nl;
    m->nunits = L + 2;
    m->unit_offset = xmalloc(sizeof(size_t) * (m->nunits + 1));
    size_t embed = 0, layer = 0, fin = 0;
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        size_t *acc = (k == P_WTE || k == P_WPE) ? &embed : is_final_tensor(k) ? &fin : &layer;
        m->in_unit[k] = *acc;
        *acc += is_layer_tensor(k) ? m->param_sizes[k] / L : m->param_sizes[k];
    }
    m->unit_offset[0] = 0;
    m->unit_offset[1] = embed;
    for (int l = 0; l < L; l++) m->unit_offset[2 + l] = m->unit_offset[1 + l] + layer;
    m->unit_offset[L + 2] = m->unit_offset[L + 1] + fin;
    m->num_params = m->unit_offset[L + 2];
}

// Llama: the first kv head of tensor-parallel rank r (ranks sharing a kv head when NKV < TP)
static size_t kv_first_of(const GPT2 *m, int r) {
    int TP = m->lay->tp.size, NKV = m->cfg.NKV;
    return NKV >= TP ? (size_t)r * (NKV / TP) : (size_t)(r / (TP / NKV));
}

// Index in the full model file of element i of this rank's slice of tensor k, layer l (tensor-
// parallel rank r); SIZE_MAX for the internal vocabulary padding past Vp.
static size_t full_index(const GPT2 *m, int r, int k, int l, size_t i) {
    size_t C = m->cfg.C, Ct = (size_t)m->C_tp, base = m->file_offsets[k];
    if (m->cfg.arch == ARCH_LLAMA && (k == P_QKVW || k == P_FCW || k == P_FCPROJW)) {
        size_t hs = (size_t)m->hs, NH = (size_t)m->cfg.NH, NKV = (size_t)m->cfg.NKV, F = (size_t)m->cfg.F;
        size_t Ft = (size_t)m->mlp_tp, row = i / C, col = i % C, q = (size_t)m->NH_tp * hs, kv = (size_t)m->NKV_tp * hs;
        if (k == P_QKVW) { // this rank's query heads, then its kv heads' k rows, then their v rows
            size_t full_row = row < q ? (size_t)r * q + row
                            : row < q + kv ? NH * hs + kv_first_of(m, r) * hs + (row - q)
                                           : NH * hs + NKV * hs + kv_first_of(m, r) * hs + (row - q - kv);
            return base + (size_t)l * (NH + 2 * NKV) * hs * C + full_row * C + col;
        }
        if (k == P_FCW) { // this rank's gate rows, then its up rows
            size_t full_row = row < Ft ? (size_t)r * Ft + row : F + (size_t)r * Ft + (row - Ft);
            return base + (size_t)l * 2 * F * C + full_row * C + col;
        }
        return base + (size_t)l * C * F + (i / Ft) * F + (size_t)r * Ft + i % Ft; // down: columns
    }
    switch (k) {
    case P_WTE: case P_LMHEAD: {
        size_t row = (size_t)r * m->Vp_tp + i / C;
        return row < (size_t)m->cfg.Vp ? base + row * C + i % C : SIZE_MAX;
    }
    case P_QKVW: case P_QKVB: {
        size_t width = k == P_QKVW ? C : 1, row = i / width, part = row / Ct;
        size_t full_row = part * C + (size_t)r * Ct + row % Ct;
        return base + (size_t)l * 3 * C * width + full_row * width + i % width;
    }
    case P_ATTPROJW: return base + (size_t)l * C * C + (i / Ct) * C + (size_t)r * Ct + i % Ct;
    case P_FCW: return base + (size_t)l * 4 * C * C + (size_t)r * 4 * Ct * C + i;
    case P_FCB: return base + (size_t)l * 4 * C + (size_t)r * 4 * Ct + i;
    case P_FCPROJW: return base + (size_t)l * C * 4 * C + (i / (4 * Ct)) * 4 * C + (size_t)r * 4 * Ct + i % (4 * Ct);
    default: { // replicated
        size_t per_layer = is_layer_tensor(k) ? m->param_sizes[k] / m->nl : 0;
        return base + (size_t)l * per_layer + i;
    }
    }
}

static int chunk_of(const GPT2 *m, int l) {
    int c = 0;
    while (c + 1 < m->lay->chunks && l >= m->chunk_l0[c + 1]) c++;
    return c;
}
static int layer_global(const GPT2 *m, int l) {
    int c = chunk_of(m, l);
    return m->lay->chunk_first[c] + l - m->chunk_l0[c];
}

// Copies between a full model in file order and a tensor-parallel rank's slice in internal order.
static void map_slice(const GPT2 *m, int r, float *full, float *local, int to_local) {
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        // the last stage's copy of the tied embedding is the first stage's: written out once
        if (!to_local && (k == P_WTE || k == P_WPE) && !m->first) continue;
        int layers = gpt2_tensor_layers(m, k);
        for (int l = 0; l < layers; l++) {
            size_t off, len;
            gpt2_tensor_range(m, k, l, &off, &len);
            int gl = is_layer_tensor(k) ? layer_global(m, l) : 0;
            for (size_t i = 0; i < len; i++) {
                size_t f = full_index(m, r, k, gl, i);
                if (to_local) local[off + i] = f == SIZE_MAX ? 0.0f : full[f];
                else if (f != SIZE_MAX) full[f] = local[off + i];
            }
        }
    }
}
size_t gpt2_file_index(const GPT2 *m, int k, int l, size_t i) {
    return full_index(m, m->lay->tp.rank, k, is_layer_tensor(k) ? layer_global(m, l) : 0, i);
}

void gpt2_full_to_local(const GPT2 *m, const float *file, float *local) { map_slice(m, m->lay->tp.rank, (float *)file, local, 1); }

void gpt2_gather_full(const GPT2 *m, const float *local, float *file) {
    size_t full_sizes[NUM_PARAM_TENSORS], full_offsets[NUM_PARAM_TENSORS];
    size_t full_n = gpt2_param_layout(&m->cfg, full_sizes, full_offsets);
    memset(file, 0, sizeof(float) * full_n);
    if (m->lay->tp.size == 1) {
        map_slice(m, 0, file, (float *)local, 0);
    } else {
        float *all = xmalloc(sizeof(float) * (m->num_params * m->lay->tp.size + 1));
        comm_all_gather(layout_group(&m->lay->tp), local, all, m->num_params * m->lay->tp.size, CT_F32);
        for (int r = 0; r < m->lay->tp.size; r++) map_slice(m, r, file, all + (size_t)r * m->num_params, 0);
        free(all);
    }
    // each stage wrote its own blocks and zeros elsewhere: a sum over the stages assembles the model exactly
    if (m->lay->pp.size > 1) comm_all_reduce(layout_group(&m->lay->pp), file, file, full_n, CT_F32, OP_SUM);
}

// One rank holds both ends of a pipeline (zb-v's first stage): the head's gradient of the tied embedding
// is added apart (head_wte_grad) and joined once per step (gpt2_join_tied_grads), as the all-reduce of
// the two stages that hold them under 1f1b adds it: the same sums, the same bits.
static int tied_apart(const GPT2 *m) { return m->first && m->last && m->lay->pp.size > 1 && m->head_k == P_WTE; }
// Where the head's weight gradient waits for W: on one stage holding both ends with the tied embedding
// (a split backward there is test_split's alone; training splits only with PP > 1, where such a stage
// adds the head's part apart, tied_apart), whose embedding gradient, added in W, goes into the same
// tensor: the head's in W too keeps the fused backward's order (head, embedding, per micro-batch).
static int head_in_w(const GPT2 *m) { return m->first && m->last && m->head_k == P_WTE && !tied_apart(m); }
// Dies if the head's weight gradient of the last split B has not run (gpt2_backward_head_weight).
static void head_weight_done(const GPT2 *m);

// The shape of this rank's slice and stage, from the layout.
static void place(GPT2 *m, const GPT2Config *cfg, DType dt, const Backend *be, const Layout *lay, StepTimes *times) {
    memset(m, 0, sizeof *m);
    m->lay = lay;
    m->times = times;
    int B = lay->B, T = lay->T / lay->cp.size, TP = lay->tp.size;
    m->nl = 0;
    for (int k = 0; k < lay->chunks; k++) {
        m->chunk_l0[k] = m->nl;
        m->nl += lay->chunk_len[k];
    }
    m->first = lay->pp.rank == 0;
    m->last = lay->pp.rank == layout_head_stage(lay); // zb-v: the first stage holds the head too
    m->cfg = *cfg;
    m->dt = dt;
    m->be = be;
    m->B = B;
    m->T = T;
    mem_init(&m->mem, be);
    if (cfg->NH % TP) die("internal: tensor parallelism %d does not divide %d heads", TP, cfg->NH);
    if (lay->sp && ((size_t)B * T) % TP) die("internal: sequence parallelism needs B*T divisible by %d", TP);
    if (lay->cp.size > 1 && T % 2) die("internal: context parallelism needs an even number of local positions, got %d", T);
    m->ring = (CpRing){ .lay = lay, .times = times, .be = be, .dt = dt };
    m->C_tp = cfg->C / TP;
    m->NH_tp = cfg->NH / TP;
    m->hs = cfg->C / cfg->NH;
    m->head_k = cfg->arch == ARCH_LLAMA && !cfg->tie ? P_LMHEAD : P_WTE;
    if (cfg->arch == ARCH_LLAMA) {
        if (cfg->NKV >= TP ? cfg->NKV % TP : TP % cfg->NKV)
            die("internal: tensor parallelism %d and %d kv heads: one must divide the other", TP, cfg->NKV);
        if (cfg->F % TP) die("internal: tensor parallelism %d does not divide the SwiGLU size %d", TP, cfg->F);
        m->NKV_tp = cfg->NKV >= TP ? cfg->NKV / TP : 1;
        m->qkv_tp = (m->NH_tp + 2 * m->NKV_tp) * m->hs;
        m->mlp_tp = cfg->F / TP;
        m->fc_tp = 2 * m->mlp_tp;
    } else {
        m->NKV_tp = m->NH_tp;
        m->qkv_tp = 3 * m->C_tp;
        m->fc_tp = m->mlp_tp = 4 * m->C_tp;
    }
    m->Vp_tp = (cfg->Vp + TP - 1) / TP; // padded internally when the ranks do not divide Vp
    m->v_start = lay->tp.rank * m->Vp_tp;
    m->v_real = cfg->V - m->v_start;
    if (m->v_real > m->Vp_tp) m->v_real = m->Vp_tp;
    if (m->v_real < 0) m->v_real = 0;
}

// Activation set s: what a micro-batch keeps from its forward to its backward, and (set 0, shared by
// the others) the scratch that lives only inside one forward or backward.
// The head's buffers (the last stage's): in the activation set with one stage, else in GPT2's heads, a
// ring of the layout's nheads (micro-batch mb's in mb % nheads, from its F to its B: gpt2_bind_set).
static void alloc_head(GPT2 *m, Activations *x) {
    size_t C = m->cfg.C, BT = (size_t)m->B * m->T, R = m->lay->sp ? BT / m->lay->tp.size : BT, ds = dtype_size(m->dt);
    MemAccount *a = &m->mem;
#define ACT(field, elems, esize) x->field = mem_alloc(a, MEM_ACTIVATIONS, (elems) * (esize), #field)
    ACT(lnf, R * C, ds);
    if (m->cfg.arch != ARCH_LLAMA) ACT(lnf_mean, R, 4);
    ACT(lnf_rstd, R, 4);
    ACT(logits, BT * m->Vp_tp, ds);
    ACT(ce_max, BT, 4);
    ACT(ce_sum, BT, 4);
    ACT(ce_target, BT, 4);
    ACT(targets, BT, 4);
#undef ACT
}

// The blocks an activation set holds room for: the stage's, or with chunk sets the longest chunk's.
static int set_blocks(const GPT2 *m) {
    if (!m->lay->chunk_sets) return m->nl;
    int n = 0;
    for (int c = 0; c < m->lay->chunks; c++) n = m->lay->chunk_len[c] > n ? m->lay->chunk_len[c] : n;
    return n;
}

static void alloc_slot(GPT2 *m, int s) {
    const GPT2Config *cfg = &m->cfg;
    size_t L = (size_t)set_blocks(m), C = cfg->C, Ct = (size_t)m->C_tp, BT = (size_t)m->B * m->T, lse = (size_t)m->B * m->NH_tp * m->T;
    size_t R = m->lay->sp ? BT / m->lay->tp.size : BT; // rows of the residual stream on this rank
    size_t ds = dtype_size(m->dt);
    MemAccount *a = &m->mem;
    // what a micro-batch keeps per block: the block's output (the next block's input) always; the
    // matmul inputs that are expensive to rebuild unless full recompute reruns the block; the LayerNorm
    // outputs and GELU's output only without recompute
    int keep_block = m->lay->recompute != RECOMPUTE_FULL, keep_cheap = m->lay->recompute == RECOMPUTE_NONE;
    int ln = m->cfg.arch != ARCH_LLAMA; // RMSNorm keeps no mean
    size_t QKV = (size_t)m->qkv_tp, FC = (size_t)m->fc_tp, MLP = (size_t)m->mlp_tp;
    Activations *x = &m->slots[s];
#define ACT(field, elems, esize) x->field = mem_alloc(a, MEM_ACTIVATIONS, (elems) * (esize), #field)
    ACT(encoded, (m->lay->chunk_sets ? 1 : m->lay->chunks) * R * C, ds); // each chunk's input
    ACT(residual3, L * R * C, ds);        // each block's output
    if (keep_block) {
        if (ln) ACT(ln1_mean, L * R, 4);
        ACT(ln1_rstd, L * R, 4);
        ACT(qkv, L * BT * QKV, ds);
        ACT(atty, L * BT * Ct, ds);
        ACT(lse, L * lse, 4); // attention keeps one log-sum-exp per row, never the T x T probabilities
        ACT(residual2, L * R * C, ds);
        if (ln) ACT(ln2_mean, L * R, 4);
        ACT(ln2_rstd, L * R, 4);
        ACT(fch, L * BT * FC, ds); // GELU's input (Llama: gate|up, SwiGLU's input)
    }
    if (keep_cheap) {
        ACT(ln1, L * R * C, ds);
        ACT(ln2, L * R * C, ds);
        ACT(fch_gelu, L * BT * MLP, ds);
    }
    if (m->last && !m->lay->nheads) alloc_head(m, x); // (else the set borrows one of GPT2's heads)
    if (m->first) ACT(inputs, BT, 4);
    ACT(dresidual, R * C, ds); // also what a pipeline stage sends back, so one per micro-batch
    if (s > 0) { // scratch lives only inside one forward or backward: shared
        Activations *x0 = &m->slots[0];
        x->partial = x0->partial, x->dbuf_c = x0->dbuf_c, x->dbuf_4c = x0->dbuf_4c, x->dqkv = x0->dqkv;
        x->full = x0->full, x->dshard = x0->dshard, x->ln_grad = x0->ln_grad, x->kv_share = x0->kv_share;
        return;
    }
    ACT(partial, BT * C, ds);
    ACT(dbuf_c, BT * C, ds);
    ACT(dbuf_4c, BT * (FC + (ln ? 0 : MLP)), ds); // Llama: dgate|dup, then SwiGLU's output gradient
    ACT(dqkv, BT * QKV, ds);
    if (!ln && m->cfg.NKV < m->lay->tp.size) ACT(kv_share, BT * 2 * (size_t)m->cfg.NKV * m->hs, ds);
    if (m->lay->sp) {
        ACT(full, BT * C, ds);
        ACT(dshard, R * C, ds);
        ACT(ln_grad, 2 * C, 4);
    }
#undef ACT
    if (m->lay->cp.size > 1) { // the ring's blocks in flight count as communication buffers, its accumulators as activations
        CpRing *r = &m->ring;
        size_t KV = 2 * (size_t)m->NKV_tp * m->hs; // a token's k and v: GQA's NKV heads travel, not NH
        for (int i = 0; i < 2; i++) {
            r->kvbuf[i] = mem_alloc(a, MEM_COMM, BT * KV * ds, "context-parallel K/V block");
            r->dkv[i] = mem_alloc(a, MEM_COMM, BT * KV * 4, "context-parallel dK/dV accumulator");
        }
        r->acc = mem_alloc(a, MEM_ACTIVATIONS, BT * Ct * 4, "context-parallel attention accumulator");
        r->dkv_part = mem_alloc(a, MEM_ACTIVATIONS, BT * KV * 4, "context-parallel dK/dV share");
    }
}

// The one block being rebuilt before its backward (--recompute).
static void alloc_recompute(GPT2 *m) {
    const GPT2Config *cfg = &m->cfg;
    size_t C = cfg->C, Ct = (size_t)m->C_tp, BT = (size_t)m->B * m->T, lse = (size_t)m->B * m->NH_tp * m->T;
    size_t R = m->lay->sp ? BT / m->lay->tp.size : BT; // rows of the residual stream on this rank
    size_t ds = dtype_size(m->dt);
    MemAccount *a = &m->mem;
    BlockScratch *r = &m->rc;
#define RC(field, elems, esize) r->field = mem_alloc(a, MEM_RECOMPUTE, (elems) * (esize), "recompute " #field)
    int ln = cfg->arch != ARCH_LLAMA; // RMSNorm keeps no mean
    if (m->lay->recompute != RECOMPUTE_NONE) {
        RC(ln1, R * C, ds); // selective: either norm's output, each rebuilt just before its use
        RC(fch_gelu, BT * (size_t)m->mlp_tp, ds);
    }
    if (m->lay->recompute == RECOMPUTE_FULL) {
        if (ln) RC(ln1_mean, R, 4);
        RC(ln1_rstd, R, 4);
        RC(qkv, BT * (size_t)m->qkv_tp, ds);
        RC(atty, BT * Ct, ds);
        RC(lse, lse, 4);
        RC(residual2, R * C, ds);
        RC(ln2, R * C, ds);
        if (ln) RC(ln2_mean, R, 4);
        RC(ln2_rstd, R, 4);
        RC(fch, BT * (size_t)m->fc_tp, ds);
    }
#undef RC
}

static void wstash_alloc(GPT2 *m); // the split backward's stashes (below)
void gpt2_build(GPT2 *m, const GPT2Config *cfg, DType dt, const Backend *be, const Layout *lay, StepTimes *times,
                int own_params, int own_grads) {
    place(m, cfg, dt, be, lay, times);
    gpt2_param_layout(cfg, m->param_sizes, m->file_offsets);
    local_sizes(m);
    build_units(m);
    size_t ds = dtype_size(dt);
    MemAccount *a = &m->mem;
    m->unit_params = xcalloc((size_t)m->nunits, sizeof(void *));
    if (own_params) {
        m->params = mem_alloc(a, MEM_WEIGHTS, m->num_params * ds, "weights");
        for (int u = 0; u < m->nunits; u++) m->unit_params[u] = at(m->params, m->unit_offset[u], dt);
    }
    m->unit_grads = xcalloc((size_t)m->nunits, sizeof(float *));
    if (own_grads) {
        m->grads = mem_alloc(a, MEM_GRADS, m->num_params * sizeof(float), "gradients");
        for (int u = 0; u < m->nunits; u++) m->unit_grads[u] = m->grads + m->unit_offset[u];
    }

    m->slots = xcalloc((size_t)lay->nslots, sizeof(Activations));
    for (int s = 0; s < lay->nslots; s++) alloc_slot(m, s);
    if (m->last && lay->nheads > 0) {
        m->heads = xcalloc((size_t)lay->nheads, sizeof(Activations));
        for (int h = 0; h < lay->nheads; h++) alloc_head(m, &m->heads[h]);
    }
    m->grad_bufs = xcalloc((size_t)lay->ngrads + 1, sizeof(void *));
    for (int g = 0; g < lay->ngrads; g++)
        m->grad_bufs[g] = mem_alloc(a, MEM_ACTIVATIONS, gpt2_stage_bytes(m, m->B, m->T), "input gradient sent back");
    alloc_recompute(m);
    layout_count_memory(m->lay, a); // every communicator's staging (the ring's, the hierarchy's) is comm buffers
    m->act = &m->slots[0];
    m->logits_bytes = m->last ? (size_t)m->B * m->T * m->Vp_tp * ds : 0;
    if (tied_apart(m)) m->head_wte_grad = mem_alloc(a, MEM_GRADS, m->param_sizes[P_WTE] * sizeof(float), "head's embedding gradient");
    if (lay->nstash > 0) wstash_alloc(m); // a split schedule's stashes, counted from the start
}

static void wstash_free(GPT2 *m); // the split backward's stash (below)
void gpt2_free(GPT2 *m) {
    MemAccount *a = &m->mem;
    wstash_free(m);
    layout_count_memory(m->lay, NULL);
    for (int h = 0; m->heads && h < m->lay->nheads; h++) {
        Activations *x = &m->heads[h];
        void *own[] = { x->lnf, x->lnf_mean, x->lnf_rstd, x->logits, x->ce_max, x->ce_sum, x->ce_target, x->targets };
        for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) mem_free(a, own[i]);
    }
    free(m->heads);
    for (int g = 0; m->grad_bufs && g < m->lay->ngrads; g++) mem_free(a, m->grad_bufs[g]);
    free(m->grad_bufs);
    for (int s = 0; s < m->lay->nslots; s++) {
        Activations *x = &m->slots[s];
        if (m->heads) // the head's buffers it borrowed are freed above
            x->lnf = x->lnf_mean = x->lnf_rstd = x->logits = NULL, x->ce_max = x->ce_sum = x->ce_target = NULL, x->targets = NULL;
        void *own[] = { x->encoded, x->ln1, x->ln1_mean, x->ln1_rstd, x->qkv, x->atty, x->lse, x->residual2, x->ln2,
                        x->ln2_mean, x->ln2_rstd, x->fch, x->fch_gelu, x->residual3, x->lnf, x->lnf_mean, x->lnf_rstd,
                        x->logits, x->ce_max, x->ce_sum, x->ce_target, x->inputs, x->targets, x->dresidual };
        for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) mem_free(a, own[i]);
        if (s > 0) continue;
        void *scratch[] = { x->partial, x->dbuf_c, x->dbuf_4c, x->dqkv, x->full, x->dshard, x->ln_grad, x->kv_share };
        for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) mem_free(a, scratch[i]);
    }
    BlockScratch *r = &m->rc;
    void *rc[] = { r->ln1, r->qkv, r->atty, r->residual2, r->ln2, r->fch, r->fch_gelu, r->ln1_mean, r->ln1_rstd,
                   r->ln2_mean, r->ln2_rstd, r->lse };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) mem_free(a, rc[i]);
    free(m->slots);
    mem_free(a, m->params);
    mem_free(a, m->grads);
    mem_free(a, m->head_wte_grad);
    void *ring[] = { m->ring.kvbuf[0], m->ring.kvbuf[1], m->ring.dkv[0], m->ring.dkv[1], m->ring.acc, m->ring.dkv_part };
    for (size_t i = 0; i < sizeof ring / sizeof ring[0]; i++) mem_free(a, ring[i]);
    free(m->unit_offset);
    free(m->unit_params);
    free(m->unit_grads);
    mem_destroy(a);
    memset(m, 0, sizeof *m);
}

void gpt2_upload_params(GPT2 *m, const float *host) {
    if (m->dt == DT_F32) {
        m->be->to_device(m->params, host, m->num_params * sizeof(float));
        return;
    }
    uint16_t *tmp = xmalloc(2 * m->num_params);
    for (size_t i = 0; i < m->num_params; i++) tmp[i] = f32_to_bf16(host[i]);
    m->be->to_device(m->params, tmp, 2 * m->num_params);
    free(tmp);
}

void *gpt2_param(const GPT2 *m, int k, int l) {
    return at(m->unit_params[gpt2_unit_of(m, k, l)], m->in_unit[k], m->dt);
}
float *gpt2_grad(const GPT2 *m, int k, int l) { return m->unit_grads[gpt2_unit_of(m, k, l)] + m->in_unit[k]; }

static void fetch(GPT2 *m, int unit) {
    if (m->fetch_unit && m->unit_offset[unit + 1] > m->unit_offset[unit]) m->fetch_unit(m->hook_ctx, unit);
}

void gpt2_use_slot(GPT2 *m, int slot) { m->act = &m->slots[slot % m->lay->nslots]; }
void gpt2_bind_set(GPT2 *m, int slot, int chunk, int mb) {
    gpt2_use_slot(m, slot);
    if (chunk < 0 || chunk >= m->lay->chunks) die("internal: chunk %d out of range", chunk);
    Activations *x = m->act;
    if (m->lay->chunk_sets) x->c0 = chunk, x->l0 = m->chunk_l0[chunk];
    if (m->heads && chunk == m->lay->chunks - 1) { // the head's buffers of this micro-batch
        const Activations *h = &m->heads[mb % m->lay->nheads];
        x->lnf = h->lnf, x->lnf_mean = h->lnf_mean, x->lnf_rstd = h->lnf_rstd, x->logits = h->logits;
        x->ce_max = h->ce_max, x->ce_sum = h->ce_sum, x->ce_target = h->ce_target, x->targets = h->targets;
    }
}
// A chunk's place in the set in use: its input (chunk - c0), its blocks (local block - l0).
static void check_holds(const GPT2 *m, int chunk) {
    if (m->lay->chunk_sets && m->act->c0 != chunk) die("internal: the activation set holds chunk %d, not %d", m->act->c0, chunk);
}
void *gpt2_stage_input(const GPT2 *m, int chunk) {
    check_holds(m, chunk);
    size_t sRC = (size_t)m->B * m->T / (m->lay->sp ? m->lay->tp.size : 1) * m->cfg.C;
    return at(m->act->encoded, (size_t)(chunk - m->act->c0) * sRC, m->dt);
}
void *gpt2_stage_output(const GPT2 *m, int chunk) {
    check_holds(m, chunk);
    size_t sRC = (size_t)m->B * m->T / (m->lay->sp ? m->lay->tp.size : 1) * m->cfg.C;
    return at(m->act->residual3, (size_t)(m->chunk_l0[chunk] + m->lay->chunk_len[chunk] - 1 - m->act->l0) * sRC, m->dt);
}
void *gpt2_stage_grad(const GPT2 *m) { return m->act->dresidual; }
void *gpt2_grad_buffer(const GPT2 *m, int k) {
    if (k < 0 || k >= m->lay->ngrads) die("internal: gradient buffer %d of %d", k, m->lay->ngrads);
    return m->grad_bufs[k];
}
size_t gpt2_stage_bytes(const GPT2 *m, int B, int T) {
    return (size_t)B * T / (m->lay->sp ? m->lay->tp.size : 1) * m->cfg.C * dtype_size(m->dt);
}
static void ready(GPT2 *m, int unit) {
    if (m->grads_ready) m->grads_ready(m->hook_ctx, unit);
}

enum { TP_SUM, TP_GATHER, TP_SCATTER };

// Tensor-parallel collectives on activations: TP_SUM all-reduces n elements in place; TP_GATHER
// all-gathers the rows of n elements (this rank's shard at send) into recv; TP_SCATTER reduce-
// scatters n elements of partial sums at send into this rank's shard at recv. On a GPU the buffers
// are device memory, which the communicator moves in place (devmem.h: CUDA IPC inside a node).
static void tp_collective(GPT2 *m, int kind, const void *send, void *recv, size_t n) {
    if (m->lay->tp.size == 1) return;
    CommType t = m->dt == DT_BF16 ? CT_BF16 : CT_F32;
    if (kind == TP_SUM) comm_all_reduce(layout_group(&m->lay->tp), send, recv, n, t, OP_SUM);
    else if (kind == TP_GATHER) comm_all_gather(layout_group(&m->lay->tp), send, recv, n, t);
    else comm_reduce_scatter(layout_group(&m->lay->tp), send, recv, n, t, OP_SUM);
}
static void tp_sum(GPT2 *m, void *buf, size_t n) { tp_collective(m, TP_SUM, buf, buf, n); }

// A row-parallel matmul's partial sums (in x->partial, n elements) become this rank's rows of the
// residual stream: reduce-scattered under sequence parallelism, all-reduced otherwise. Returns where.
static void *tp_finish_partial(GPT2 *m, void *shard_scratch, size_t n) {
    if (m->lay->sp) {
        tp_collective(m, TP_SCATTER, m->act->partial, shard_scratch, n);
        return shard_scratch;
    }
    tp_sum(m, m->act->partial, n);
    return m->act->partial;
}

// A column-parallel matmul's input: the whole rows, gathered under sequence parallelism.
static void *tp_full_rows(GPT2 *m, void *shard, size_t n) {
    if (!m->lay->sp) return shard;
    tp_collective(m, TP_GATHER, shard, m->act->full, n);
    return m->act->full;
}

// LayerNorm backward; under sequence parallelism each rank saw only its rows, so the parameter
// gradients are summed over the group before they join the accumulated gradients.
static void norm_bwd(GPT2 *m, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                     const float *mean, const float *rstd, int rows);
static void layernorm_bwd_tp(GPT2 *m, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                             const float *mean, const float *rstd, int rows) {
    size_t n = (m->cfg.arch == ARCH_LLAMA ? 1 : 2) * (size_t)m->cfg.C; // weight (and bias)
    if (!m->lay->sp) {
        norm_bwd(m, dinp, dweight, dout, inp, weight, mean, rstd, rows);
        return;
    }
    m->be->zero(m->act->ln_grad, n * sizeof(float));
    norm_bwd(m, dinp, m->act->ln_grad, dout, inp, weight, mean, rstd, rows);
    comm_all_reduce(layout_group(&m->lay->tp), m->act->ln_grad, m->act->ln_grad, n, CT_F32, OP_SUM);
    m->be->residual_bwd(DT_F32, dweight, m->act->ln_grad, n);
}

// ---------------------------------------------------------------------------------------------
// forward and backward

static int llama(const GPT2 *m) { return m->cfg.arch == ARCH_LLAMA; }
// A bias of a tensor, or NULL: the Llama family has none (lead 0: not this rank's to add)
static const void *bias_of(const GPT2 *m, int k, int l, int lead) { return lead && !llama(m) ? gpt2_param(m, k, l) : NULL; }

// The block's norms, tensor kw (ln1w, ln2w, lnfw; its bias follows it): LayerNorm (GPT-2) or RMSNorm
// (Llama, no mean) of R rows; and the same fused with the residual add res = a + b before it.
static void norm_fwd(GPT2 *m, void *out, float *mean, float *rstd, const void *inp, int kw, int l, int R) {
    if (llama(m)) m->be->rmsnorm_fwd(m->dt, out, rstd, inp, gpt2_param(m, kw, l), R, m->cfg.C, m->cfg.norm_eps);
    else m->be->layernorm_fwd(m->dt, out, mean, rstd, inp, gpt2_param(m, kw, l), gpt2_param(m, kw + 1, l), R, m->cfg.C);
}
static void residual_norm_fwd(GPT2 *m, void *res, void *out, float *mean, float *rstd, const void *a, const void *b, int kw,
                              int l, int R) {
    if (llama(m))
        m->be->residual_rmsnorm_fwd(m->dt, res, out, rstd, a, b, gpt2_param(m, kw, l), R, m->cfg.C, m->cfg.norm_eps);
    else
        m->be->residual_layernorm_fwd(m->dt, res, out, mean, rstd, a, b, gpt2_param(m, kw, l), gpt2_param(m, kw + 1, l), R,
                                      m->cfg.C);
}
// Its backward: dinp += (NULL: skipped), dweight (and GPT-2's dbias after it) += (NULL: skipped)
static void norm_bwd(GPT2 *m, void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                     const float *mean, const float *rstd, int rows) {
    int C = m->cfg.C;
    if (llama(m)) m->be->rmsnorm_bwd(m->dt, dinp, dweight, dout, inp, weight, rstd, rows, C);
    else m->be->layernorm_bwd(m->dt, dinp, dweight, dweight ? dweight + C : NULL, dout, inp, weight, mean, rstd, rows, C);
}

// Per-op timer: the start of a timed op, and its end charged to a category (no-ops unless profiling).
static double prof_begin(GPT2 *m) {
    if (!m->times->profile) return 0.0;
    m->be->sync();
    return now_seconds();
}
static void prof_end(GPT2 *m, int cat, double t0) {
    if (!m->times->profile) return;
    m->be->sync();
    m->times->op_s[cat] += now_seconds() - t0;
}
#define TIMED(m, cat, call)                                                                                \
    do {                                                                                                   \
        double t0_ = prof_begin(m);                                                                        \
        call;                                                                                              \
        prof_end(m, cat, t0_);                                                                             \
    } while (0)

// Token and position embedding of B local sequences of T positions into out. With context parallelism
// each local sequence is two chunks from different places of the full one: each chunk is embedded with
// its own positions.
static void embed_fwd(GPT2 *m, void *out, const void *wpe, int B, int T) {
    const Backend *be = m->be;
    const void *wte = gpt2_param(m, P_WTE, 0);
    int C = m->cfg.C;
    if (m->lay->cp.size == 1) {
        be->encoder_fwd(m->dt, out, m->act->inputs, wte, wpe, B, T, C, m->v_start, m->Vp_tp);
        return;
    }
    for (int b = 0; b < B; b++)
        for (int j = 0, c = T / 2; j < 2; j++) {
            size_t row = (size_t)b * T + (size_t)j * c, pos = (size_t)cp_chunk_start(T, m->lay->cp.size, m->lay->cp.rank, j);
            be->encoder_fwd(m->dt, at(out, row * C, m->dt), m->act->inputs + row, wte, wpe ? at(wpe, pos * C, m->dt) : NULL,
                            1, c, C, m->v_start, m->Vp_tp);
        }
}
static void embed_bwd(GPT2 *m, const void *dout, int B, int T) {
    const Backend *be = m->be;
    float *dwte = gpt2_grad(m, P_WTE, 0), *dwpe = m->param_sizes[P_WPE] ? gpt2_grad(m, P_WPE, 0) : NULL;
    int C = m->cfg.C;
    if (m->lay->cp.size == 1) {
        be->encoder_bwd(m->dt, dwte, dwpe, dout, m->act->inputs, B, T, C, m->v_start, m->Vp_tp);
        return;
    }
    for (int b = 0; b < B; b++) // (b, t) in order, as on one rank
        for (int j = 0, c = T / 2; j < 2; j++) {
            size_t row = (size_t)b * T + (size_t)j * c, pos = (size_t)cp_chunk_start(T, m->lay->cp.size, m->lay->cp.rank, j);
            be->encoder_bwd(m->dt, dwte, dwpe ? dwpe + pos * C : NULL, at(dout, row * C, m->dt), m->act->inputs + row, 1, c, C, m->v_start,
                            m->Vp_tp);
        }
}

// The attention of one block over this rank's positions: the whole sequences here, or ring attention over
// the context-parallel group. lse holds one block's log-sum-exps (laid out per chunk under context
// parallelism).
static void attention_forward(GPT2 *m, void *atty, float *lse, const void *qkv, int B, int T) {
    int Ct = m->C_tp, NH = m->NH_tp;
    double pairs;
    if (m->lay->cp.size > 1) {
        pairs = cp_attention_fwd(&m->ring, atty, lse, qkv, B, T, Ct, NH, m->NKV_tp, llama(m) ? &m->cfg.rope : NULL);
    } else if (llama(m)) {
        m->be->attention_gqa_fwd(m->dt, atty, lse, qkv, B, T, NH, m->NKV_tp, m->hs, &m->cfg.rope);
        pairs = causal_pairs(T, 0, T, 0);
    } else {
        m->be->attention_fwd(m->dt, atty, lse, qkv, B, T, Ct, NH);
        pairs = causal_pairs(T, 0, T, 0);
    }
    m->times->attention_flops += 4.0 * (Ct / NH) * B * NH * pairs;
}
static void attention_backward(GPT2 *m, void *dqkv, const void *datty, const void *qkv, const void *atty, const float *lse, int B,
                          int T) {
    int Ct = m->C_tp, NH = m->NH_tp;
    double pairs;
    if (m->lay->cp.size > 1) {
        pairs = cp_attention_bwd(&m->ring, dqkv, datty, qkv, atty, lse, B, T, Ct, NH, m->NKV_tp,
                                 llama(m) ? &m->cfg.rope : NULL);
    } else if (llama(m)) {
        m->be->attention_gqa_bwd(m->dt, dqkv, datty, qkv, atty, lse, B, T, NH, m->NKV_tp, m->hs, &m->cfg.rope);
        pairs = causal_pairs(T, 0, T, 0);
    } else {
        m->be->attention_bwd(m->dt, dqkv, datty, qkv, atty, lse, B, T, Ct, NH);
        pairs = causal_pairs(T, 0, T, 0);
    }
    m->times->attention_flops += 10.0 * (Ct / NH) * B * NH * pairs;
}

// Cross-entropy over the vocabulary slices of the tensor-parallel group: each rank's row statistics
// are gathered and combined in rank order (so every rank gets the same bits); returns the mean loss
// and leaves the global row max and sum on the device for the backward. With dloss > 0 and the whole
// vocabulary on this rank, the same pass over the logits also leaves dlogits in their place.
static float vocab_parallel_loss(GPT2 *m, int N, float dloss) {
    const Backend *be = m->be;
    Activations *x = m->act;
    if (m->lay->tp.size == 1 && dloss > 0.0f) {
        be->crossentropy_fused(m->dt, x->logits, x->ce_max, x->ce_sum, x->ce_target, x->logits, x->targets, dloss, N,
                               m->v_real, m->Vp_tp);
        x->dlogits_scale = dloss;
    } else {
        be->crossentropy_stats(m->dt, x->ce_max, x->ce_sum, x->ce_target, x->logits, x->targets, N, m->v_start,
                               m->v_real, m->Vp_tp);
    }
    float *mine = xmalloc(sizeof(float) * 3 * N), *all = xmalloc(sizeof(float) * 3 * N * m->lay->tp.size);
    be->to_host(mine, x->ce_max, sizeof(float) * N);
    be->to_host(mine + N, x->ce_sum, sizeof(float) * N);
    be->to_host(mine + 2 * N, x->ce_target, sizeof(float) * N);
    if (m->lay->tp.size > 1) comm_all_gather(layout_group(&m->lay->tp), mine, all, (size_t)3 * N * m->lay->tp.size, CT_F32);
    else memcpy(all, mine, sizeof(float) * 3 * N);
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float gmax = -INFINITY, gsum = 0.0f, target = 0.0f;
        for (int r = 0; r < m->lay->tp.size; r++)
            if (all[(size_t)r * 3 * N + n] > gmax) gmax = all[(size_t)r * 3 * N + n];
        for (int r = 0; r < m->lay->tp.size; r++) {
            const float *s = all + (size_t)r * 3 * N;
            if (s[N + n] > 0.0f) gsum += s[N + n] * expf(s[n] - gmax);
            target += s[2 * N + n];
        }
        mine[n] = gmax;
        mine[N + n] = gsum;
        total += logf(gsum) + gmax - target;
    }
    be->to_device(x->ce_max, mine, sizeof(float) * N);
    be->to_device(x->ce_sum, mine + N, sizeof(float) * N);
    free(mine);
    free(all);
    return (float)(total / N);
}

float gpt2_forward(GPT2 *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    return gpt2_forward_chunk(m, 0, inputs, targets, B, T, 0.0f);
}

// Where block l's activations are during this pass: in the activation set (kept from the forward to the
// backward) or, what recompute does not keep, in the block scratch (BlockScratch).
typedef struct {
    void *ln1, *qkv, *atty, *r2, *ln2, *fch, *fchg, *r3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} BlockActs;

// per-layer strides of the activation sets use the allocated B·T, so buffers stay where the backward
// expects them whatever the micro-batch's shape
static size_t rows_alloc(const GPT2 *m) { return (size_t)m->B * m->T / (m->lay->sp ? m->lay->tp.size : 1); }

static BlockActs block_acts(const GPT2 *m, int l) {
    const Activations *x = m->act;
    const BlockScratch *s = &m->rc;
    DType dt = m->dt;
    size_t sR = rows_alloc(m), sRC = sR * m->cfg.C, sBTCt = (size_t)m->B * m->T * m->C_tp;
    size_t sLse = (size_t)m->B * m->NH_tp * m->T;
    l -= x->l0; // (chunk sets: the set holds the chunk's blocks from its first)
    BlockActs a = { .r3 = at(x->residual3, l * sRC, dt) };
    if (m->lay->recompute == RECOMPUTE_FULL) {
        a.ln1 = s->ln1, a.qkv = s->qkv, a.atty = s->atty, a.r2 = s->residual2, a.ln2 = s->ln2, a.fch = s->fch;
        a.fchg = s->fch_gelu, a.ln1_mean = s->ln1_mean, a.ln1_rstd = s->ln1_rstd, a.ln2_mean = s->ln2_mean;
        a.ln2_rstd = s->ln2_rstd, a.lse = s->lse;
        return a;
    }
    size_t sBT = (size_t)m->B * m->T;
    a.qkv = at(x->qkv, l * sBT * m->qkv_tp, dt), a.atty = at(x->atty, l * sBTCt, dt), a.r2 = at(x->residual2, l * sRC, dt);
    a.fch = at(x->fch, l * sBT * m->fc_tp, dt), a.lse = x->lse + l * sLse;
    if (x->ln1_mean) a.ln1_mean = x->ln1_mean + l * sR, a.ln2_mean = x->ln2_mean + l * sR; // (RMSNorm: none)
    a.ln1_rstd = x->ln1_rstd + l * sR, a.ln2_rstd = x->ln2_rstd + l * sR;
    if (m->lay->recompute == RECOMPUTE_SELECTIVE) {
        a.ln1 = a.ln2 = s->ln1; // one buffer: each norm's output is rebuilt just before its use
        a.fchg = s->fch_gelu;
    } else {
        a.ln1 = at(x->ln1, l * sRC, dt), a.ln2 = at(x->ln2, l * sRC, dt), a.fchg = at(x->fch_gelu, l * sBT * m->mlp_tp, dt);
    }
    return a;
}

// The input of block l (the residual stream): its chunk's input for the chunk's first block, else the
// output of the block before it.
static void *block_input(const GPT2 *m, int l) {
    int c = chunk_of(m, l);
    size_t sRC = rows_alloc(m) * m->cfg.C;
    if (l == m->chunk_l0[c]) return at(m->act->encoded, (size_t)(c - m->act->c0) * sRC, m->dt);
    return at(m->act->residual3, (size_t)(l - 1 - m->act->l0) * sRC, m->dt);
}

// Block l from its first LayerNorm's output (a->ln1, written by the end of the block before it or the
// start of the chunk) to GELU's output: QKV, attention, the attention projection, its residual add
// fused with the second LayerNorm, the MLP's first matmul with GELU. The forward runs it, and full
// recompute reruns it before the block's backward (the MLP's second matmul, whose output is the kept
// block output, is not rerun). res is the block's input. The block's weights must be fetched.
static void block_forward_to_gelu(GPT2 *m, int l, const BlockActs *a, const void *res, int B, int T) {
    const Backend *be = m->be;
    DType dt = m->dt;
    int C = m->cfg.C, Ct = m->C_tp, N = B * T, R = m->lay->sp ? N / m->lay->tp.size : N;
    size_t BTC = (size_t)N * C;
    int lead = m->lay->tp.rank == 0; // adds what must be added once: the row-parallel biases
    (void)Ct;
    const void *in = tp_full_rows(m, a->ln1, BTC);
    TIMED(m, PROF_MATMUL, be->matmul_fwd(dt, a->qkv, NULL, in, gpt2_param(m, P_QKVW, l), bias_of(m, P_QKVB, l, 1), N, C, m->qkv_tp));
    TIMED(m, PROF_ATTENTION, attention_forward(m, a->atty, a->lse, a->qkv, B, T));
    TIMED(m, PROF_MATMUL, be->matmul_fwd(dt, m->act->partial, NULL, a->atty, gpt2_param(m, P_ATTPROJW, l),
                                         bias_of(m, P_ATTPROJB, l, lead), N, Ct, C));
    void *proj = tp_finish_partial(m, a->r2, BTC);
    residual_norm_fwd(m, a->r2, a->ln2, a->ln2_mean, a->ln2_rstd, res, proj, P_LN2W, l, R);
    in = tp_full_rows(m, a->ln2, BTC);
    if (llama(m)) { // gate|up, then SwiGLU: fch keeps both projections for the backward
        TIMED(m, PROF_MATMUL, be->matmul_fwd(dt, a->fch, NULL, in, gpt2_param(m, P_FCW, l), NULL, N, C, m->fc_tp));
        be->swiglu_fwd(dt, a->fchg, a->fch, N, m->mlp_tp);
        return;
    }
    // bias and GELU in the matmul's epilogue: fch keeps the input of the GELU for its backward
    TIMED(m, PROF_MATMUL, be->matmul_fwd(dt, a->fchg, a->fch, in, gpt2_param(m, P_FCW, l), gpt2_param(m, P_FCB, l), N, C, 4 * Ct));
}

float gpt2_forward_chunk(GPT2 *m, int chunk, const int32_t *inputs, const int32_t *targets, int B, int T, float dloss) {
    if (B > m->B || T > m->T || B <= 0 || T <= 0)
        die("internal: micro-batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    if (m->lay->sp && ((size_t)B * T) % m->lay->tp.size) die("internal: sequence parallelism needs B*T divisible by %d", m->lay->tp.size);
    check_holds(m, chunk);
    head_weight_done(m);
    const Backend *be = m->be;
    const GPT2Config *cfg = &m->cfg;
    DType dt = m->dt;
    Activations *x = m->act;
    int C = cfg->C, N = B * T, R = m->lay->sp ? N / m->lay->tp.size : N;
    size_t BTC = (size_t)N * C, RC = (size_t)R * C;
    int lead = m->lay->tp.rank == 0; // adds what must be added once: position embedding, row-parallel biases

    x->B = B;
    x->T = T;
    x->dlogits_scale = 0.0f;
    int head = m->last && chunk == m->lay->chunks - 1;
    if (m->first && chunk == 0) { // other chunks find their input in place, received from the previous stage
        be->to_device(x->inputs, inputs, sizeof(int32_t) * N);
        fetch(m, UNIT_EMBED);
        embed_fwd(m, x->partial, bias_of(m, P_WPE, 0, lead), B, T); // (Llama: no position table)
        void *embedded = tp_finish_partial(m, x->encoded, BTC);
        if (embedded != x->encoded) be->copy(x->encoded, embedded, RC * dtype_size(dt));
    }
    int l0 = m->chunk_l0[chunk], l1 = l0 + m->lay->chunk_len[chunk]; // every chunk holds at least one block
    fetch(m, 1 + l0);
    // each block's first LayerNorm is fused with the residual add that ends the block before it
    BlockActs a = block_acts(m, l0);
    norm_fwd(m, a.ln1, a.ln1_mean, a.ln1_rstd, block_input(m, l0), P_LN1W, l0, R);
    for (int l = l0; l < l1; l++) {
        a = block_acts(m, l);
        fetch(m, 1 + l);
        block_forward_to_gelu(m, l, &a, block_input(m, l), B, T);
        TIMED(m, PROF_MATMUL, be->matmul_fwd(dt, x->partial, NULL, a.fchg, gpt2_param(m, P_FCPROJW, l),
                                             bias_of(m, P_FCPROJB, l, lead), N, m->mlp_tp, C));
        void *proj = tp_finish_partial(m, a.r3, BTC);
        if (l + 1 < l1) {
            fetch(m, 2 + l);
            BlockActs next = block_acts(m, l + 1);
            residual_norm_fwd(m, a.r3, next.ln1, next.ln1_mean, next.ln1_rstd, a.r2, proj, P_LN1W, l + 1, R);
        } else if (head) {
            fetch(m, m->nl + 1);
            residual_norm_fwd(m, a.r3, x->lnf, x->lnf_mean, x->lnf_rstd, a.r2, proj, P_LNFW, 0, R);
        } else {
            be->residual_fwd(dt, a.r3, a.r2, proj, RC);
        }
    }
    if (!head) return 0.0f; // the output (the chunk's last residual) goes to the next stage
    fetch(m, gpt2_unit_of(m, m->head_k, 0)); // the LM head: tied (wte) or the final unit's lmhead
    const void *in = tp_full_rows(m, x->lnf, BTC);
    TIMED(m, PROF_MATMUL, be->matmul_fwd(dt, x->logits, NULL, in, gpt2_param(m, m->head_k, 0), NULL, N, C, m->Vp_tp));
    if (!targets) return 0.0f;
    be->to_device(x->targets, targets, sizeof(int32_t) * N);
    return vocab_parallel_loss(m, N, dloss);
}

// What recompute did not keep of block l, rebuilt from what it kept (bitwise as the forward made it: the
// same kernels on the same stored inputs). Full: the whole block up to GELU, from its input. Selective:
// GELU's output from its input, and the second LayerNorm's output from the residual stream it
// normalises; the first LayerNorm's output comes later (rebuild_ln1), into the same buffer.
static void rebuild_block(GPT2 *m, int l, const BlockActs *a, const void *res, int B, int T) {
    const Backend *be = m->be;
    int C = m->cfg.C, N = B * T, R = m->lay->sp ? N / m->lay->tp.size : N;
    (void)C;
    if (m->lay->recompute == RECOMPUTE_FULL) {
        norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, res, P_LN1W, l, R);
        block_forward_to_gelu(m, l, a, res, B, T);
    } else if (m->lay->recompute == RECOMPUTE_SELECTIVE) {
        if (llama(m)) be->swiglu_fwd(m->dt, a->fchg, a->fch, N, m->mlp_tp);
        else be->gelu_fwd(m->dt, a->fchg, a->fch, (size_t)N * 4 * m->C_tp);
        norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->r2, P_LN2W, l, R);
    }
}
static void rebuild_ln1(GPT2 *m, int l, const BlockActs *a, const void *res, int R) {
    if (m->lay->recompute != RECOMPUTE_SELECTIVE) return;
    norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, res, P_LN1W, l, R);
}

void gpt2_backward(GPT2 *m, float dloss_scale) { gpt2_backward_chunk(m, 0, dloss_scale); }

// ---------------------------------------------------------------------------------------------
// The backward in two halves. B (backward_input) computes the input gradient; each matmul's weight
// gradient it meets is a WOp: run at once (stash NULL: the fused kernels, bitwise as ever), or recorded
// for W (gpt2_backward_weight_chunk) to run later. The LayerNorms' dgamma and dbeta are added in B, fused
// with their input gradient as in the one-piece backward: they are reductions over the rows, a small
// share of the work, and adding them in B frees the rows they read (a block's residual2, its input and
// their statistics), which is where B leaves W's output gradients. B runs a chunk's micro-batches in the
// order W does, so each parameter still adds them in 1F1B's order. So does the LM head's matmul: its
// weight gradient reads the logits (dlogits in place), the largest buffer of a stage, and added by B
// (just after B's send: gpt2_backward_head_weight) it frees the head's buffers at B instead of W.
// What a WOp reads:
//   - left in place: what stays in the activation set untouched until the set's next forward (the
//     layer inputs recompute does not rebuild into scratch, rows not gathered into scratch);
//   - copied into a region of the same set that B has consumed and nothing reads again before the set's
//     next forward (WPlan below): the gradient of residual3 into residual3, of residual2 into residual2
//     (the LayerNorms that read them ran in B), the pre-GELU gradient into fch (GELU's backward ran),
//     dqkv into qkv (attention's backward ran), the embedding's gradient into the chunk's input;
//   - copied into the stash's arena: the rest (recompute's rebuilt inputs, gathered rows under SP),
//     sized for exactly that (wstash_bytes).
// So without recompute or SP a pending W costs no memory beyond the set it already holds. The same
// kernel on the same inputs gives the same bits, whenever it runs.

enum { WOP_MATMUL, WOP_EMBED };
typedef struct {
    int kind, kw, kb, l;             // the weight (and bias, matmul: -1 none) tensors, local layer
    int unit, ready_after;           // the unit whose gradients it adds to; ready() after it (-1: no)
    const void *dout, *inp;          // matmul: dweight += doutᵀ·inp; embedding: dout alone
    int N, C, OC;
} WOp;

// Where B leaves each thing W reads (one place for backward_input and wstash_bytes, which must agree to
// the byte): 1 in place (or in a consumed region of the set), 0 in the arena.
typedef struct {
    int fchg;   // the MLP's second matmul's input: in the set without recompute
    int norms;  // the LayerNorm outputs (the first matmuls' inputs): in the set without recompute or SP
    int atty;   // attention's output: in the set unless full recompute
    int sets;   // fch and qkv in the set (unless full recompute): they take the pre-GELU gradient and dqkv
    int rows;   // the residual-stream gradients fit the set's rows (no SP): residual3, residual2 (unless
                // full recompute: then residual2 is scratch) and the chunk's input take them
} WPlan;
static WPlan wplan(const GPT2 *m) {
    int none = m->lay->recompute == RECOMPUTE_NONE, block = m->lay->recompute != RECOMPUTE_FULL, sp = m->lay->sp;
    return (WPlan){ .fchg = none, .norms = none && !sp, .atty = block, .sets = block, .rows = !sp };
}

// What B copies into a stash's arena for one micro-batch of N rows (of all ranks: gathered) of chunk c,
// in keep()'s 256-byte pieces.
static size_t piece(size_t bytes) { return (bytes + 255) & ~(size_t)255; }
static size_t wstash_bytes(const GPT2 *m, int chunk, size_t N) {
    WPlan w = wplan(m);
    size_t ds = dtype_size(m->dt), NC = N * m->cfg.C * ds, block = 0, n = 0;
    block += w.rows ? 0 : piece(NC);                                  // the MLP's output gradient (dy)
    block += w.fchg ? 0 : piece(N * m->mlp_tp * ds);                  // GELU's output
    block += w.sets ? 0 : piece(N * m->fc_tp * ds);                   // the pre-GELU gradient
    block += w.norms ? 0 : piece(NC);                                 // LayerNorm 2's output
    block += w.rows && w.sets ? 0 : piece(NC);                        // attention's output gradient (dy)
    block += w.atty ? 0 : piece(N * m->C_tp * ds);                    // attention's output
    block += w.sets ? 0 : piece(N * m->qkv_tp * ds);                  // dqkv
    block += w.norms ? 0 : piece(NC);                                 // LayerNorm 1's output
    n = (size_t)m->lay->chunk_len[chunk] * block;
    if (head_in_w(m) && chunk == m->lay->chunks - 1 && !w.rows) n += piece(NC); // the head's input, gathered
    if (m->first && chunk == 0 && !w.rows) n += piece(NC);                 // the embedding's gradient
    return n;
}

// What B keeps for W, for one pending B of a chunk: an arena of wstash_bytes and the recorded ops.
struct WStash {
    char *arena;
    size_t cap, used;
    WOp *ops;
    int nops, cap_ops;
};

// Per chunk, the activation sets whose B has run and W not, in B's order (entry i uses stash i of the
// ring): W must take the oldest, so each parameter's gradient adds the micro-batches in the order their
// B ran (1F1B's order).
struct WQueue {
    int *q, head, n;
};

// src as W will read it: in place (kept), copied into `into` (a region of the set B has consumed), or
// copied into the arena (into NULL).
static void *keep(GPT2 *m, struct WStash *st, const void *src, size_t bytes, int kept, void *into) {
    if (kept) return (void *)src;
    if (into) {
        m->be->copy(into, src, bytes);
        return into;
    }
    if (st->used + piece(bytes) > st->cap) die("internal: the weight-gradient stash is too small");
    void *dst = st->arena + st->used;
    m->be->copy(dst, src, bytes);
    st->used += piece(bytes);
    return dst;
}

static WOp *wop_new(struct WStash *st) {
    if (st->nops == st->cap_ops) die("internal: too many weight-gradient ops for one chunk");
    WOp *w = &st->ops[st->nops++];
    memset(w, 0, sizeof *w);
    w->ready_after = -1;
    return w;
}

// Where a matmul's weight gradient goes: the tensor's, but the head's own buffer for the tied embedding
// on a rank that holds both ends (tied_apart).
static float *dweight_of(GPT2 *m, int kw, int l) { return kw == P_WTE && m->head_wte_grad ? m->head_wte_grad : gpt2_grad(m, kw, l); }

// A matmul's backward: dinp (NULL: none), and dweight/dbias of tensors kw/kb (kb -1: no bias) of layer l.
// dout_to: where dout goes for W when not kept (a consumed region of the set; NULL: the arena).
static void bwd_matmul(GPT2 *m, struct WStash *st, void *dinp, int kw, int kb, int l, const void *dout, int dout_kept,
                       void *dout_to, const void *inp, int inp_kept, const void *weight, const void *gelu_pre, int N, int C,
                       int OC) {
    const Backend *be = m->be;
    if (!st) {
        TIMED(m, PROF_MATMUL, be->matmul_bwd(m->dt, dinp, dweight_of(m, kw, l), kb >= 0 ? gpt2_grad(m, kb, l) : NULL, dout, inp,
                                             weight, gelu_pre, N, C, OC));
        return;
    }
    size_t ds = dtype_size(m->dt);
    WOp *w = wop_new(st);
    *w = (WOp){ .kind = WOP_MATMUL, .kw = kw, .kb = kb, .l = l, .unit = gpt2_unit_of(m, kw, l), .ready_after = -1,
                .inp = keep(m, st, inp, (size_t)N * C * ds, inp_kept, NULL), .N = N, .C = C, .OC = OC };
    if (dinp) TIMED(m, PROF_MATMUL, be->matmul_bwd(m->dt, dinp, NULL, NULL, dout, inp, weight, gelu_pre, N, C, OC));
    w->dout = keep(m, st, dout, (size_t)N * OC * ds, dout_kept, dout_to); // after dinp: dout_to may be gelu_pre
}

// A LayerNorm's backward over `rows` rows: dinp +=, and the gradients of tensor kw of layer l and of the
// bias after it, in B whether or not the backward is split (above).
static void bwd_layernorm(GPT2 *m, void *dinp, int kw, int l, const void *dout, const void *inp, const void *weight,
                          const float *mean, const float *rstd, int rows) {
    layernorm_bwd_tp(m, dinp, gpt2_grad(m, kw, l), dout, inp, weight, mean, rstd, rows);
}

static void wop_run(GPT2 *m, const WOp *w, int B, int T) {
    const Backend *be = m->be;
    if (w->kind == WOP_MATMUL)
        TIMED(m, PROF_MATMUL, be->matmul_bwd(m->dt, NULL, dweight_of(m, w->kw, w->l), w->kb >= 0 ? gpt2_grad(m, w->kb, w->l) : NULL,
                                             w->dout, w->inp, NULL, NULL, w->N, w->C, w->OC));
    else
        embed_bwd(m, w->dout, B, T);
}

// Llama with NKV < TP: the dK, dV columns of dqkv [N, qkv_tp] (this rank's one kv head) summed over the
// ranks sharing that kv head: each rank places its share at its kv head's columns of a zeroed [N, NKV·2·hs],
// the tensor-parallel group sums it (in rank order: the same bits on every rank), and each takes its head's.
static void kv_share_sum(GPT2 *m, void *dqkv, int N) {
    const Backend *be = m->be;
    DType dt = m->dt;
    size_t ds = dtype_size(dt), hs = (size_t)m->hs, W = 2 * (size_t)m->cfg.NKV * hs, q = (size_t)m->NH_tp * hs;
    size_t g = kv_first_of(m, m->lay->tp.rank);
    char *buf = m->act->kv_share, *kv = (char *)dqkv + q * ds;
    be->zero(buf, (size_t)N * W * ds);
    be->cast_rows(buf + g * 2 * hs * ds, dt, W, kv, dt, (size_t)m->qkv_tp, (size_t)N, 2 * hs);
    tp_sum(m, buf, (size_t)N * W);
    be->cast_rows(kv, dt, (size_t)m->qkv_tp, buf + g * 2 * hs * ds, dt, W, (size_t)N, 2 * hs);
}

// Whether a chunk's backward finishes this rank's embedding gradients: the first stage's first chunk, and
// the tied head's chunk on the last stage (an untied head's gradient is in the final unit).
static int embed_done(const GPT2 *m, int chunk) {
    int head = m->last && chunk == m->lay->chunks - 1;
    return (m->first && chunk == 0) || (head && !m->first && m->head_k == P_WTE);
}

// B of one chunk (and, with st NULL, W with it): today's backward, op for op.
static void backward_input(GPT2 *m, int chunk, float dloss_scale, struct WStash *st) {
    check_holds(m, chunk);
    const Backend *be = m->be;
    const GPT2Config *cfg = &m->cfg;
    DType dt = m->dt;
    Activations *x = m->act;
    int B = x->B, T = x->T;
    int C = cfg->C, Ct = m->C_tp, N = B * T, R = m->lay->sp ? N / m->lay->tp.size : N;
    size_t BTC = (size_t)N * C, RC = (size_t)R * C;
    // the input gradient of a column-parallel matmul is partial: all-reduced, or reduce-scattered to rows
    void *dln; // a LayerNorm's output gradient, this rank's rows
    const void *in, *dy;
    // where W's inputs stay (WPlan; with st NULL nothing is kept and the flags do not matter)
    WPlan w = wplan(m);
    size_t ds = dtype_size(dt);

    int head = m->last && chunk == m->lay->chunks - 1;
    if (head) {
        // LM head: dlogits in place (unless the forward's fused loss left them), then into the final
        // LayerNorm; its input gradient starts the residual stream. Earlier stages find that gradient in
        // x->dresidual, received from the next stage.
        if (x->dlogits_scale != dloss_scale) {
            if (x->dlogits_scale != 0.0f) die("internal: the forward's dlogits were scaled for another loss");
            be->crossentropy_bwd(dt, x->logits, x->logits, x->targets, x->ce_max, x->ce_sum, dloss_scale, N, m->v_start,
                                 m->v_real, m->Vp_tp);
        }
        x->dlogits_scale = 0.0f;
        fetch(m, gpt2_unit_of(m, m->head_k, 0));
        in = tp_full_rows(m, x->lnf, BTC);
        // the head's weight gradient in B, split or not: then nothing reads the head's buffers after B,
        // which frees them for the next micro-batch (a ring of its own, gpt2_bind_set) where a pending W
        // would hold a micro-batch's logits until its W (head_in_w: below). Split, it runs just after B's
        // input gradient has been sent (head_now, gpt2_backward_head_weight) where its input is in place
        // (under SP the gathered rows are scratch the blocks' backward reuses)
        struct WStash *hst = head_in_w(m) ? st : st && w.rows ? m->head_now : NULL; // (head_now: empty, head_weight_done)
        bwd_matmul(m, hst, x->partial, m->head_k, -1, 0, x->logits, 1, NULL, in, w.rows, gpt2_param(m, m->head_k, 0), NULL, N,
                   C, m->Vp_tp);
        dln = tp_finish_partial(m, x->dshard, BTC);
        be->zero(x->dresidual, RC * ds);
        fetch(m, m->nl + 1);
        bwd_layernorm(m, x->dresidual, P_LNFW, 0, dln, block_acts(m, m->nl - 1).r3, gpt2_param(m, P_LNFW, 0), x->lnf_mean,
                      x->lnf_rstd, R);
        // the final LayerNorm's unit (the untied head's too) is complete once the head's matmul has run
        if (hst) hst->ops[hst->nops - 1].ready_after = m->nl + 1;
        else ready(m, m->nl + 1);
    }
    int l0 = m->chunk_l0[chunk];
    for (int l = l0 + m->lay->chunk_len[chunk] - 1; l >= l0; l--) {
        BlockActs a = block_acts(m, l);
        const void *res = block_input(m, l);
        fetch(m, 1 + l); // recompute needs the block's weights too: no extra ZeRO-3 gather
        rebuild_block(m, l, &a, res, B, T);
        // MLP: dresidual is the gradient of residual3 = residual2 + fcproj (every row: gathered under SP);
        // GELU's backward runs in the epilogue of the matmul that produces its output's gradient
        dy = tp_full_rows(m, x->dresidual, BTC);
        if (llama(m)) { // down, SwiGLU, gate|up
            void *dh = at(x->dbuf_4c, (size_t)N * m->fc_tp, dt);
            bwd_matmul(m, st, dh, P_FCPROJW, -1, l, dy, 0, w.rows ? a.r3 : NULL, a.fchg, w.fchg, gpt2_param(m, P_FCPROJW, l),
                       NULL, N, m->mlp_tp, C);
            be->swiglu_bwd(dt, x->dbuf_4c, dh, a.fch, N, m->mlp_tp);
        } else {
            bwd_matmul(m, st, x->dbuf_4c, P_FCPROJW, P_FCPROJB, l, dy, 0, w.rows ? a.r3 : NULL, a.fchg, w.fchg,
                       gpt2_param(m, P_FCPROJW, l), a.fch, N, 4 * Ct, C);
        }
        // from here on fch (GELU's or SwiGLU's input, read above) and residual3 are W's
        int nob = llama(m); // the Llama family has no biases
        in = tp_full_rows(m, a.ln2, BTC);
        bwd_matmul(m, st, x->partial, P_FCW, nob ? -1 : P_FCB, l, x->dbuf_4c, 0, w.sets ? a.fch : NULL, in, w.norms,
                   gpt2_param(m, P_FCW, l), NULL, N, C, m->fc_tp);
        dln = tp_finish_partial(m, x->dshard, BTC);
        bwd_layernorm(m, x->dresidual, P_LN2W, l, dln, a.r2, gpt2_param(m, P_LN2W, l), a.ln2_mean, a.ln2_rstd, R);
        // attention: dresidual is now the gradient of residual2 = residual + attproj (residual2 is W's now)
        dy = tp_full_rows(m, x->dresidual, BTC);
        bwd_matmul(m, st, x->dbuf_c, P_ATTPROJW, nob ? -1 : P_ATTPROJB, l, dy, 0, w.rows && w.sets ? a.r2 : NULL, a.atty, w.atty,
                   gpt2_param(m, P_ATTPROJW, l), NULL, N, Ct, C);
        TIMED(m, PROF_ATTENTION, attention_backward(m, x->dqkv, x->dbuf_c, a.qkv, a.atty, a.lse, B, T));
        rebuild_ln1(m, l, &a, res, R);
        in = tp_full_rows(m, a.ln1, BTC);
        if (x->kv_share) { // kv heads shared by TP/NKV ranks: each rank's dK, dV hold only its query heads' share
            // the input gradient takes the shares (the tensor-parallel sum below adds them), the weight
            // gradient the sum, so that every rank sharing a kv head takes the same step
            TIMED(m, PROF_MATMUL, be->matmul_bwd(dt, x->partial, NULL, NULL, x->dqkv, in, gpt2_param(m, P_QKVW, l), NULL, N, C,
                                                 m->qkv_tp));
            kv_share_sum(m, x->dqkv, N);
            bwd_matmul(m, st, NULL, P_QKVW, -1, l, x->dqkv, 0, w.sets ? a.qkv : NULL, in, w.norms, gpt2_param(m, P_QKVW, l), NULL,
                       N, C, m->qkv_tp);
        } else { // (attention's backward has read qkv: it takes dqkv)
            bwd_matmul(m, st, x->partial, P_QKVW, nob ? -1 : P_QKVB, l, x->dqkv, 0, w.sets ? a.qkv : NULL, in, w.norms,
                       gpt2_param(m, P_QKVW, l), NULL, N, C, m->qkv_tp);
        }
        dln = tp_finish_partial(m, x->dshard, BTC);
        bwd_layernorm(m, x->dresidual, P_LN1W, l, dln, res, gpt2_param(m, P_LN1W, l), a.ln1_mean, a.ln1_rstd, R);
        // the block's unit is complete once its last matmul's W has run (LayerNorms' gradients: above)
        if (st) st->ops[st->nops - 1].ready_after = 1 + l;
        else ready(m, 1 + l);
    }
    if (m->first && chunk == 0) {
        fetch(m, UNIT_EMBED); // its weights are not read, but ZeRO-2/3 streaming places its gradients here
        dy = tp_full_rows(m, x->dresidual, BTC);
        if (st) {
            WOp *e = wop_new(st); // its gradient into the chunk's input, which block 0's LayerNorm has read
            *e = (WOp){ .kind = WOP_EMBED, .kw = P_WTE, .kb = -1, .unit = UNIT_EMBED, .ready_after = -1,
                        .dout = keep(m, st, dy, BTC * ds, 0, w.rows ? gpt2_stage_input(m, 0) : NULL) };
        } else {
            embed_bwd(m, dy, B, T);
        }
    }
    // x->dresidual now holds the gradient of the chunk's input, for the previous stage
    if (!st && embed_done(m, chunk) && !tied_apart(m)) ready(m, UNIT_EMBED);
}

void gpt2_backward_chunk(GPT2 *m, int chunk, float dloss_scale) { backward_input(m, chunk, dloss_scale, NULL); }

// The stashes of every chunk, a ring per chunk in B's order (W takes the oldest): the layout's nstash
// for a split schedule (what its action lists keep pending at once, allocated with the model so that
// the memory report and plan --exact count them), else one per activation set, on the split API's
// first use. Each arena holds exactly what B copies there (wstash_bytes): nothing without recompute or
// SP, where no arena is allocated.
static int wstash_count(const GPT2 *m) { return m->lay->nstash > 0 ? m->lay->nstash : m->lay->nslots; }
static void wstash_alloc(GPT2 *m) {
    int n = wstash_count(m);
    m->wstash = xcalloc((size_t)n * m->lay->chunks, sizeof(struct WStash));
    m->wqueue = xcalloc((size_t)m->lay->chunks, sizeof(struct WQueue));
    for (int c = 0; c < m->lay->chunks; c++) m->wqueue[c].q = xcalloc((size_t)n, sizeof(int));
    for (int s = 0; s < n; s++)
        for (int c = 0; c < m->lay->chunks; c++) {
            struct WStash *st = &m->wstash[s * m->lay->chunks + c];
            st->cap = wstash_bytes(m, c, (size_t)m->B * m->T);
            st->arena = st->cap ? mem_alloc(&m->mem, MEM_ACTIVATIONS, st->cap, "weight-gradient stash") : NULL;
            st->cap_ops = 4 * m->lay->chunk_len[c] + 2; // four matmuls a block; the head's (head_in_w), the embedding's
            st->ops = xcalloc((size_t)st->cap_ops, sizeof(WOp));
        }
    if (m->last) { // the head's op alone, its inputs in place: no arena
        m->head_now = xcalloc(1, sizeof *m->head_now);
        m->head_now->cap_ops = 1;
        m->head_now->ops = xcalloc(1, sizeof(WOp));
    }
}

void gpt2_backward_input_chunk(GPT2 *m, int chunk, int slot, float dloss_scale) {
    if (!m->wstash) wstash_alloc(m);
    if (slot < 0 || slot >= m->lay->nslots || chunk < 0 || chunk >= m->lay->chunks)
        die("internal: activation set %d, chunk %d out of range", slot, chunk);
    head_weight_done(m);
    int n = wstash_count(m);
    struct WQueue *q = &m->wqueue[chunk];
    for (int i = 0; i < q->n; i++)
        if (q->q[(q->head + i) % n] == slot) die("internal: B of activation set %d, chunk %d again before its W", slot, chunk);
    if (q->n == n) die("internal: more than %d weight-gradient passes of chunk %d pending (the schedule's bound)", n, chunk);
    int at = (q->head + q->n) % n;
    struct WStash *st = &m->wstash[at * m->lay->chunks + chunk];
    gpt2_use_slot(m, slot);
    st->used = 0;
    st->nops = 0;
    backward_input(m, chunk, dloss_scale, st);
    size_t want = wstash_bytes(m, chunk, (size_t)m->act->B * m->act->T);
    if (st->used != want) die("internal: B copied %zu bytes for W, wstash_bytes says %zu", st->used, want);
    q->q[at] = slot;
    q->n++;
}

// What a stash's ops add, in order, each unit told "ready" where B marked it.
static void wops_run(GPT2 *m, struct WStash *st) {
    int unit = -1;
    for (int i = 0; i < st->nops; i++) {
        const WOp *w = &st->ops[i];
        if (w->unit != unit) fetch(m, unit = w->unit); // where streamed ZeRO-2/3 gradients go
        wop_run(m, w, m->act->B, m->act->T);
        if (w->ready_after >= 0) ready(m, w->ready_after);
    }
    st->nops = 0;
}

static void head_weight_done(const GPT2 *m) {
    if (m->head_now && m->head_now->nops) die("internal: the LM head's weight gradient of the last B is pending (gpt2_backward_head_weight)");
}

void gpt2_backward_head_weight(GPT2 *m) {
    if (m->head_now) wops_run(m, m->head_now);
}

void gpt2_backward_weight_chunk(GPT2 *m, int chunk, int slot) {
    if (!m->wstash) wstash_alloc(m);
    head_weight_done(m);
    if (chunk < 0 || chunk >= m->lay->chunks) die("internal: chunk %d out of range", chunk);
    struct WQueue *q = &m->wqueue[chunk];
    if (q->n == 0 || q->q[q->head] != slot)
        die("internal: W of activation set %d, chunk %d out of B's order (next: set %d)", slot, chunk, q->n ? q->q[q->head] : -1);
    struct WStash *st = &m->wstash[q->head * m->lay->chunks + chunk];
    gpt2_use_slot(m, slot);
    wops_run(m, st);
    if (embed_done(m, chunk) && !tied_apart(m)) ready(m, UNIT_EMBED);
    q->head = (q->head + 1) % wstash_count(m);
    q->n--;
}

static void wstash_free(GPT2 *m) {
    for (int i = 0; m->wstash && i < wstash_count(m) * m->lay->chunks; i++) {
        mem_free(&m->mem, m->wstash[i].arena);
        free(m->wstash[i].ops);
    }
    for (int c = 0; m->wqueue && c < m->lay->chunks; c++) free(m->wqueue[c].q);
    free(m->wstash);
    free(m->wqueue);
    if (m->head_now) free(m->head_now->ops);
    free(m->head_now);
    m->wstash = NULL;
    m->wqueue = NULL;
    m->head_now = NULL;
}

void gpt2_zero_grad(GPT2 *m) {
    if (m->grads) m->be->zero(m->grads, m->num_params * sizeof(float)); // streamed buckets start zeroed
    if (m->head_wte_grad) m->be->zero(m->head_wte_grad, m->param_sizes[P_WTE] * sizeof(float));
}

void gpt2_join_tied_grads(GPT2 *m) {
    if (!tied_apart(m)) return;
    fetch(m, UNIT_EMBED); // where streamed ZeRO-2/3 gradients are
    float *g = gpt2_grad(m, P_WTE, 0);
    m->be->residual_fwd(DT_F32, g, g, m->head_wte_grad, m->param_sizes[P_WTE]); // embedding's + head's
    ready(m, UNIT_EMBED);
}

void gpt2_logits_at(GPT2 *m, int b, int t, int T, float *out) {
    int owner = 0;
    if (m->lay->cp.size > 1) { // the rank holding position t, and where it sits among that rank's positions
        int c = T / 2, chunk = t / c, j = chunk >= m->lay->cp.size;
        owner = j ? 2 * m->lay->cp.size - 1 - chunk : chunk;
        t = j * c + t % c;
        if (owner != m->lay->cp.rank) {
            comm_broadcast(m->lay->cp.comm, out, (size_t)m->cfg.V, CT_F32, owner);
            return;
        }
    }
    size_t row = ((size_t)b * T + t) * m->Vp_tp, n = (size_t)m->Vp_tp;
    float *mine = xmalloc(sizeof(float) * n), *all = xmalloc(sizeof(float) * n * m->lay->tp.size);
    if (m->dt == DT_F32) {
        m->be->to_host(mine, at(m->act->logits, row, DT_F32), n * sizeof(float));
    } else {
        uint16_t *tmp = xmalloc(2 * n);
        m->be->to_host(tmp, at(m->act->logits, row, DT_BF16), n * 2);
        for (size_t i = 0; i < n; i++) mine[i] = bf16_to_f32(tmp[i]);
        free(tmp);
    }
    if (m->lay->tp.size > 1) comm_all_gather(layout_group(&m->lay->tp), mine, all, n * m->lay->tp.size, CT_F32);
    else memcpy(all, mine, n * sizeof(float));
    memcpy(out, all, sizeof(float) * m->cfg.V); // slices are consecutive: the real words come first
    free(mine);
    free(all);
    if (m->lay->cp.size > 1) comm_broadcast(m->lay->cp.comm, out, (size_t)m->cfg.V, CT_F32, owner);
}

double gpt2_flops_per_token(const GPT2Config *cfg, int T) {
    double C = cfg->C, L = cfg->L;
    double matmul = 2.0 * L * 12.0 * C * C + 2.0 * C * cfg->Vp; // qkv 3C², proj C², fc 4C², fcproj 4C²; head
    if (cfg->arch == ARCH_LLAMA) { // qkv C·(NH + 2·NKV)·hs (GQA's smaller k, v), proj C², gate|up 2·C·F, down F·C
        double hs = C / cfg->NH;
        matmul = 2.0 * L * (C * (cfg->NH + 2.0 * cfg->NKV) * hs + C * C + 3.0 * C * cfg->F) + 2.0 * C * cfg->Vp;
    }
    double attention = 2.0 * 2.0 * L * C * T;                    // scores and weighted sum over T keys
    return 3.0 * (matmul + attention);
}

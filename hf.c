// hf.c: Hugging Face Llama checkpoints in and out (hf.h): config.json, safetensors files (through
// safetensors.c, shared with ckpt.c) and the sharded layout's index; a checkpoint as llm4d's model (the
// shape and the full fp32 parameter vector that --init-from-hf trains and --save-hf writes) and back.
#define _GNU_SOURCE
#include "hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "safetensors.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

// ---------------------------------------------------------------------------------------------
// config.json

// Integer member key in [lo, hi]: its value, or def when absent and def_ok; dies naming the field.
static long long cfg_int(json_t *r, const char *path, const char *key, long long lo, long long hi, int def_ok, long long def) {
    json_t *v = json_object_get(r, key);
    if (!v || json_is_null(v)) {
        if (def_ok) return def;
        die("%s: %s: missing (an integer is required)", path, key);
    }
    if (!json_is_integer(v)) die("%s: %s: not an integer", path, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) die("%s: %s: %lld is outside [%lld, %lld]", path, key, x, lo, hi);
    return x;
}
// Number member in (lo, hi] (lo exclusive: every number here must be positive)
static double cfg_num(json_t *r, const char *path, const char *key, double lo, double hi, int def_ok, double def) {
    json_t *v = json_object_get(r, key);
    if (!v || json_is_null(v)) {
        if (def_ok) return def;
        die("%s: %s: missing (a number is required)", path, key);
    }
    if (!json_is_number(v)) die("%s: %s: not a number", path, key);
    double x = json_number_value(v);
    if (!(x > lo && x <= hi)) die("%s: %s: %g is outside (%g, %g]", path, key, x, lo, hi);
    return x;
}

// A JSON file of at most limit bytes (config.json, the shard index), or one line naming the problem.
static json_t *load_json(const char *path, size_t limit) {
    char why[SAFE_PATH_MAX + 256];
    unsigned char *buf;
    size_t len;
    if (st_read_file(path, &buf, &len, limit, why, sizeof why) != 0) die("%s", why);
    json_error_t jerr;
    json_t *r = json_loadb((const char *)buf, len, 0, &jerr);
    free(buf);
    if (!r) die("%s: malformed JSON at line %d: %s", path, jerr.line, jerr.text);
    return r;
}

void hf_config_read(const char *dir, HFConfig *c) {
    char path[SAFE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *r = load_json(path, (size_t)16 << 20);
    if (!json_is_object(r)) die("%s: not a JSON object", path);
    memset(c, 0, sizeof *c);
    const char *s = json_string_value(json_object_get(r, "model_type"));
    if (json_object_get(r, "model_type") && (!s || strcmp(s, "llama")))
        die("%s: model_type: \"%s\" is not \"llama\"", path, s ? s : "(not a string)");
    s = json_string_value(json_object_get(r, "hidden_act"));
    if (json_object_get(r, "hidden_act") && (!s || strcmp(s, "silu")))
        die("%s: hidden_act: \"%s\" is not \"silu\" (llm4d's Llama MLP is SwiGLU)", path, s ? s : "(not a string)");
    static const char *const biases[] = { "attention_bias", "mlp_bias" };
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(r, biases[i]);
        if (v && !json_is_false(v) && !json_is_null(v)) die("%s: %s: llm4d's Llama has no biases (must be false)", path, biases[i]);
    }
    c->hidden_size = (int)cfg_int(r, path, "hidden_size", 1, 1 << 20, 0, 0);
    c->intermediate_size = (int)cfg_int(r, path, "intermediate_size", 1, 1 << 22, 0, 0);
    c->num_attention_heads = (int)cfg_int(r, path, "num_attention_heads", 1, c->hidden_size, 0, 0);
    if (c->hidden_size % c->num_attention_heads)
        die("%s: num_attention_heads: %d does not divide hidden_size %d", path, c->num_attention_heads, c->hidden_size);
    c->head_dim = c->hidden_size / c->num_attention_heads;
    if (json_object_get(r, "head_dim") && !json_is_null(json_object_get(r, "head_dim")) &&
        cfg_int(r, path, "head_dim", 1, 1 << 16, 0, 0) != c->head_dim)
        die("%s: head_dim: %lld is not hidden_size / num_attention_heads = %d (llm4d needs them equal)", path,
            (long long)json_integer_value(json_object_get(r, "head_dim")), c->head_dim);
    if (c->head_dim % 2) die("%s: num_attention_heads: head size %d is odd (RoPE rotates channel pairs)", path, c->head_dim);
    c->num_key_value_heads = (int)cfg_int(r, path, "num_key_value_heads", 1, c->num_attention_heads, 1, c->num_attention_heads);
    if (c->num_attention_heads % c->num_key_value_heads)
        die("%s: num_key_value_heads: %d does not divide num_attention_heads %d", path, c->num_key_value_heads,
            c->num_attention_heads);
    c->num_hidden_layers = (int)cfg_int(r, path, "num_hidden_layers", 1, 100000, 0, 0);
    c->vocab_size = (int)cfg_int(r, path, "vocab_size", 1, 1 << 24, 0, 0);
    c->max_position_embeddings = (int)cfg_int(r, path, "max_position_embeddings", 1, 1 << 24, 1, 2048);
    c->rms_norm_eps = cfg_num(r, path, "rms_norm_eps", 0, 1, 1, 1e-6);
    c->rope_theta = cfg_num(r, path, "rope_theta", 0, 1e12, 1, 10000.0);
    json_t *tie = json_object_get(r, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie)) die("%s: tie_word_embeddings: not true or false", path);
    c->tie_word_embeddings = tie ? json_is_true(tie) : 0;
    json_t *dtv = json_object_get(r, "torch_dtype");
    const char *dtkey = "torch_dtype";
    if (!dtv) dtv = json_object_get(r, "dtype"), dtkey = "dtype"; // newer transformers' name
    s = dtv ? json_string_value(dtv) : "float32";
    if (!s || (strcmp(s, "float32") && strcmp(s, "bfloat16") && strcmp(s, "float16")))
        die("%s: %s: \"%s\" is not float32, bfloat16 or float16", path, dtkey, s ? s : "(not a string)");
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", s);
    json_t *rs = json_object_get(r, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) die("%s: rope_scaling: not an object or null", path);
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rs, "type"));
        if (!type || strcmp(type, "llama3"))
            die("%s: rope_scaling: rope_type \"%s\" is not supported (only \"llama3\")", path, type ? type : "(missing)");
        c->rope_llama3 = 1;
        char rpath[sizeof path + 32]; // errors name "config.json: rope_scaling: FIELD"
        snprintf(rpath, sizeof rpath, "%s: rope_scaling", path);
        c->rope_factor = cfg_num(rs, rpath, "factor", 0, 1e6, 0, 0);
        c->rope_low_freq_factor = cfg_num(rs, rpath, "low_freq_factor", 0, 1e6, 0, 0);
        c->rope_high_freq_factor = cfg_num(rs, rpath, "high_freq_factor", 0, 1e6, 0, 0);
        if (c->rope_factor < 1) // as --rope-scaling: the scaling divides the low frequencies by it
            die("%s: rope_scaling: factor %g is below 1", path, c->rope_factor);
        if (c->rope_high_freq_factor <= c->rope_low_freq_factor)
            die("%s: rope_scaling: high_freq_factor %g must exceed low_freq_factor %g", path, c->rope_high_freq_factor,
                c->rope_low_freq_factor);
        c->rope_original_max_pos = (int)cfg_int(rs, rpath, "original_max_position_embeddings", 1, 1 << 24, 0, 0);
    }
    json_decref(r);
}

RopeConfig hf_rope(const HFConfig *c) {
    RopeConfig r = { c->rope_theta, 0, 0, 0, 0 };
    if (c->rope_llama3) {
        r.factor = c->rope_factor;
        r.low_freq_factor = c->rope_low_freq_factor;
        r.high_freq_factor = c->rope_high_freq_factor;
        r.original_max_pos = c->rope_original_max_pos;
    }
    return r;
}

static json_t *config_json(const HFConfig *c, DType dt) {
    json_t *r = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("LlamaForCausalLM"));
    json_object_set_new(r, "architectures", arch);
    json_object_set_new(r, "model_type", json_string("llama"));
    json_object_set_new(r, "hidden_act", json_string("silu"));
    json_object_set_new(r, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(r, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(r, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(r, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(r, "head_dim", json_integer(c->head_dim));
    json_object_set_new(r, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(r, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(r, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(r, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(r, "rope_theta", json_real(c->rope_theta));
    if (c->rope_llama3) {
        json_t *rs = json_object();
        json_object_set_new(rs, "rope_type", json_string("llama3"));
        json_object_set_new(rs, "factor", json_real(c->rope_factor));
        json_object_set_new(rs, "low_freq_factor", json_real(c->rope_low_freq_factor));
        json_object_set_new(rs, "high_freq_factor", json_real(c->rope_high_freq_factor));
        json_object_set_new(rs, "original_max_position_embeddings", json_integer(c->rope_original_max_pos));
        json_object_set_new(r, "rope_scaling", rs);
    } else {
        json_object_set_new(r, "rope_scaling", json_null());
    }
    json_object_set_new(r, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(r, "attention_bias", json_false());
    json_object_set_new(r, "mlp_bias", json_false());
    json_object_set_new(r, "torch_dtype", json_string(dt == DT_BF16 ? "bfloat16" : "float32"));
    return r;
}

// ---------------------------------------------------------------------------------------------
// tensor names and shapes

static const char *const LAYER_TENSORS[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};
#define NLAYER_TENSORS 9

int hf_tensor_count(const HFConfig *c) { return 2 + NLAYER_TENSORS * c->num_hidden_layers + !c->tie_word_embeddings; }

void hf_tensor_name(const HFConfig *c, int i, char *buf, size_t cap) {
    if (i == 0) snprintf(buf, cap, "model.embed_tokens.weight");
    else if (i <= NLAYER_TENSORS * c->num_hidden_layers)
        snprintf(buf, cap, "model.layers.%d.%s", (i - 1) / NLAYER_TENSORS, LAYER_TENSORS[(i - 1) % NLAYER_TENSORS]);
    else if (i == NLAYER_TENSORS * c->num_hidden_layers + 1) snprintf(buf, cap, "model.norm.weight");
    else snprintf(buf, cap, "lm_head.weight");
}

int hf_tensor_shape(const HFConfig *c, const char *name, int64_t shape[2]) {
    int64_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size, hd = c->head_dim;
    int64_t Q = c->num_attention_heads * hd, KV = c->num_key_value_heads * hd;
    if (!strcmp(name, "model.embed_tokens.weight") || (!strcmp(name, "lm_head.weight") && !c->tie_word_embeddings))
        return shape[0] = V, shape[1] = C, 2;
    if (!strcmp(name, "model.norm.weight")) return shape[0] = C, 1;
    int layer, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= c->num_hidden_layers)
        return 0;
    char want[32];
    snprintf(want, sizeof want, "%d", layer);
    if (strncmp(name + 13, want, strlen(want)) || name[13 + strlen(want)] != '.') return 0; // "model.layers.07." is not layer 7
    const char *t = name + used;
    int64_t dims[NLAYER_TENSORS][2] = { { C, 0 }, { Q, C }, { KV, C }, { KV, C }, { C, Q }, { C, 0 }, { F, C }, { F, C }, { C, F } };
    for (int k = 0; k < NLAYER_TENSORS; k++)
        if (!strcmp(t, LAYER_TENSORS[k])) {
            shape[0] = dims[k][0];
            shape[1] = dims[k][1];
            return dims[k][1] ? 2 : 1;
        }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// reading

typedef struct {
    char name[SAFE_PATH_MAX];
    unsigned char *map;
    size_t len;
    StFile st;
} HFFile;

struct HFCheckpoint {
    char dir[SAFE_PATH_MAX];
    int nfiles;
    HFFile *files;
    json_t *weight_map; // name -> file name (sharded); NULL for one file
};

static void map_file(const char *dir, const char *name, HFFile *f) {
    char path[2 * SAFE_PATH_MAX], why[2 * SAFE_PATH_MAX + 256];
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) die("%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) die("%s: not a regular file", path);
    f->len = (size_t)sb.st_size;
    f->map = f->len ? mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    if (f->len && f->map == MAP_FAILED) die("%s: cannot map: %s", path, strerror(errno));
    close(fd);
    static const unsigned char empty[1] = { 0 };
    if (st_parse(path, f->len ? f->map : empty, f->len, &f->st, why, sizeof why) != 0) die("%s", why);
    if (!json_is_object(f->st.header)) die("%s: malformed header: not a JSON object", path);
}

HFCheckpoint *hf_open(const char *dir) {
    HFCheckpoint *h = xcalloc(1, sizeof *h);
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    char path[SAFE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, SINGLE_NAME);
    if (access(path, F_OK) == 0) {
        h->nfiles = 1;
        h->files = xcalloc(1, sizeof(HFFile));
        map_file(dir, SINGLE_NAME, &h->files[0]);
        return h;
    }
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
    if (access(path, F_OK) != 0) die("%s: neither %s nor %s", dir, SINGLE_NAME, INDEX_NAME);
    json_t *r = load_json(path, (size_t)256 << 20);
    json_t *wm = json_object_get(r, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) die("%s: weight_map: missing or empty", path);
    h->weight_map = json_incref(wm);
    json_decref(r);
    // the distinct shard files, in the order first named
    h->files = xcalloc(json_object_size(wm), sizeof(HFFile));
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *file = json_string_value(v);
        if (!file || !*file || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
            die("%s: weight_map: %s: not a file name in the directory", path, key);
        int known = 0;
        for (int i = 0; i < h->nfiles && !known; i++) known = !strcmp(h->files[i].name, file);
        if (!known) map_file(dir, file, &h->files[h->nfiles++]);
    }
    return h;
}

void hf_close(HFCheckpoint *h) {
    if (!h) return;
    for (int i = 0; i < h->nfiles; i++) {
        st_free(&h->files[i].st);
        if (h->files[i].len && munmap(h->files[i].map, h->files[i].len) != 0) die("munmap: %s", strerror(errno));
    }
    free(h->files);
    json_decref(h->weight_map);
    free(h);
}

int hf_nfiles(const HFCheckpoint *h) { return h->nfiles; }

// the file that holds name (NULL: not in the index)
static const HFFile *file_of(const HFCheckpoint *h, const char *name) {
    if (!h->weight_map) return &h->files[0];
    const char *file = json_string_value(json_object_get(h->weight_map, name));
    if (!file) return NULL;
    for (int i = 0; i < h->nfiles; i++)
        if (!strcmp(h->files[i].name, file)) return &h->files[i];
    return NULL;
}

static int find(const HFCheckpoint *h, const char *name, StTensor *t, const HFFile **fp) {
    const HFFile *f = file_of(h, name);
    if (!f) return -1;
    char why[2 * SAFE_PATH_MAX + 256], path[2 * SAFE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", h->dir, f->name);
    int rc = st_tensor(&f->st, path, name, t, why, sizeof why);
    if (rc < 0) die("%s", why);
    if (rc > 0 && h->weight_map) die("%s: tensor %s is missing (the index names this file for it)", path, name);
    *fp = f;
    return rc == 0 ? 0 : -1;
}

int hf_info(const HFCheckpoint *h, const char *name, char dtype[8], int *ndim, int64_t shape[8]) {
    StTensor t;
    const HFFile *f;
    if (find(h, name, &t, &f) != 0) return -1;
    snprintf(dtype, 8, "%s", t.dtype);
    *ndim = t.ndim;
    for (int i = 0; i < t.ndim; i++) shape[i] = t.shape[i];
    return 0;
}

// IEEE half to float: subnormals, infinities and NaN included
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), (int)e - 25);
    union { float f; uint32_t u; } x = { .f = v };
    x.u |= sign;
    return x.f;
}

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape) {
    int w = snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && (size_t)w < cap; i++) w += snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if ((size_t)w < cap) snprintf(buf + w, cap - w, "]");
}

void hf_read(const HFCheckpoint *h, const char *name, int ndim, const int64_t *shape, float *dst) {
    StTensor t;
    const HFFile *f;
    if (find(h, name, &t, &f) != 0) die("%s: tensor %s is missing", h->dir, name);
    char path[2 * SAFE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", h->dir, f->name);
    int same = t.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t.shape[i] == shape[i];
    if (!same) {
        char a[128], b[128];
        shape_text(a, sizeof a, t.ndim, t.shape);
        shape_text(b, sizeof b, ndim, shape);
        die("%s: tensor %s has shape %s, the config needs %s", path, name, a, b);
    }
    const unsigned char *p = t.p;
    if (!strcmp(t.dtype, "F32")) {
        memcpy(dst, p, t.numel * 4);
    } else if (!strcmp(t.dtype, "BF16") || !strcmp(t.dtype, "F16")) {
        int bf = t.dtype[0] == 'B';
        for (uint64_t i = 0; i < t.numel; i++) {
            uint16_t x;
            memcpy(&x, p + 2 * i, 2);
            dst[i] = bf ? bf16_to_f32(x) : f16_to_f32(x);
        }
    } else {
        die("%s: tensor %s: dtype %s is not F32, BF16 or F16", path, name, t.dtype);
    }
}

// ---------------------------------------------------------------------------------------------
// writing

static void write_json(const char *path, json_t *j) {
    // 9 significant digits: every real written comes from a float (shortest_float: 1e-05, not jansson's
    // 17-digit 1.0000000000000001e-05), and 9 read back to the same float
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    if (!text) die("out of memory");
    SafeFile sf;
    safe_open_or_die(&sf, path);
    safe_write_or_die(&sf, text, strlen(text));
    safe_write_or_die(&sf, "\n", 1);
    safe_commit_or_die(&sf);
    free(text);
}

static void remove_stale(const char *dir, const char *name) {
    char path[SAFE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) != 0 && errno != ENOENT) die("cannot remove the stale %s: %s", path, strerror(errno));
}

// tensors [a, b) as one safetensors file
static void write_shard(const char *path, const HFTensor *t, int a, int b, DType dt) {
    size_t es = dtype_size(dt);
    json_t *h = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt")); // what transformers expects of its files
    json_object_set_new(h, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = a; i < b; i++) {
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        uint64_t n = 1;
        for (int d = 0; d < t[i].ndim; d++) n *= (uint64_t)t[i].shape[d], json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(e, "dtype", json_string(dt == DT_BF16 ? "BF16" : "F32"));
        json_object_set_new(e, "shape", shape);
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + n * es)));
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(h, t[i].name, e);
        off += n * es;
    }
    size_t hl;
    char *text = st_header_text(h, &hl);
    json_decref(h);
    SafeFile sf;
    safe_open_or_die(&sf, path);
    uint64_t hl64 = hl;
    safe_write_or_die(&sf, &hl64, 8);
    safe_write_or_die(&sf, text, hl);
    free(text);
    enum { CHUNK = 1 << 16 };
    uint16_t *tmp = dt == DT_BF16 ? xmalloc(sizeof(uint16_t) * CHUNK) : NULL;
    for (int i = a; i < b; i++) {
        uint64_t n = 1;
        for (int d = 0; d < t[i].ndim; d++) n *= (uint64_t)t[i].shape[d];
        if (dt == DT_F32) {
            safe_write_or_die(&sf, t[i].data, n * 4);
            continue;
        }
        for (uint64_t s = 0; s < n; s += CHUNK) {
            size_t m = n - s < CHUNK ? (size_t)(n - s) : CHUNK;
            for (size_t j = 0; j < m; j++) tmp[j] = f32_to_bf16(t[i].data[s + j]);
            safe_write_or_die(&sf, tmp, m * 2);
        }
    }
    free(tmp);
    safe_commit_or_die(&sf);
}

void hf_save(const char *dir, const HFConfig *c, const HFTensor *t, int n, DType dt, uint64_t max_shard_bytes) {
    char err[SAFE_PATH_MAX + 256], path[SAFE_PATH_MAX + 64];
    if (ensure_dir("--save-hf", dir, err, sizeof err) != 0) die("%s", err);
    size_t es = dtype_size(dt);
    // shard i holds tensors [first[i], first[i+1]): a new shard when the next tensor would overflow it
    int *first = xcalloc((size_t)n + 2, sizeof(int)), nshards = 0;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = es;
        for (int d = 0; d < t[i].ndim; d++) bytes *= (uint64_t)t[i].shape[d];
        if (i == 0 || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) first[nshards++] = i, in_shard = 0;
        in_shard += bytes;
        total += bytes;
    }
    first[nshards] = n;
    json_t *cfg = config_json(c, dt);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_json(path, cfg);
    json_decref(cfg);
    if (nshards <= 1) {
        snprintf(path, sizeof path, "%s/%s", dir, SINGLE_NAME);
        write_shard(path, t, 0, n, dt);
        remove_stale(dir, INDEX_NAME);
    } else {
        json_t *idx = json_object(), *meta = json_object(), *wm = json_object();
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        for (int s = 0; s < nshards; s++) {
            char name[64];
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
            snprintf(path, sizeof path, "%s/%s", dir, name);
            write_shard(path, t, first[s], first[s + 1], dt);
            for (int i = first[s]; i < first[s + 1]; i++) json_object_set_new(wm, t[i].name, json_string(name));
        }
        json_object_set_new(idx, "metadata", meta);
        json_object_set_new(idx, "weight_map", wm);
        snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
        write_json(path, idx);
        json_decref(idx);
        remove_stale(dir, SINGLE_NAME); // transformers would take it over the index
    }
    free(first);
}

// ---------------------------------------------------------------------------------------------
// the checkpoint as llm4d's model

GPT2Config hf_model_config(const HFConfig *c, const char *dir) {
    GPT2Config m;
    memset(&m, 0, sizeof m);
    m.arch = ARCH_LLAMA;
    m.L = c->num_hidden_layers, m.C = c->hidden_size, m.NH = c->num_attention_heads, m.NKV = c->num_key_value_heads;
    m.F = c->intermediate_size, m.V = c->vocab_size, m.Vp = (c->vocab_size + 127) / 128 * 128;
    m.maxT = c->max_position_embeddings, m.tie = c->tie_word_embeddings;
    m.norm_eps = (float)c->rms_norm_eps;
    m.rope = hf_rope(c);
    char why[256];
    if (!gpt2_config_valid(&m, why, sizeof why)) die("%s/config.json: not a shape llm4d trains: %s", dir, why);
    return m;
}

// The shortest decimal that rounds to the float x: 1e-5f is written 1e-05, not 9.99999974737875e-06,
// so a config read and written again keeps its text.
static double shortest_float(float x) {
    char buf[32];
    for (int d = 1; d < 10; d++) {
        snprintf(buf, sizeof buf, "%.*g", d, (double)x);
        if ((float)strtod(buf, NULL) == x) return strtod(buf, NULL);
    }
    return (double)x;
}

void hf_config_of_model(const GPT2Config *m, HFConfig *c) {
    memset(c, 0, sizeof *c);
    c->hidden_size = m->C, c->intermediate_size = m->F, c->num_attention_heads = m->NH, c->num_key_value_heads = m->NKV;
    c->num_hidden_layers = m->L, c->head_dim = m->C / m->NH, c->vocab_size = m->V, c->max_position_embeddings = m->maxT;
    c->tie_word_embeddings = m->tie;
    c->rms_norm_eps = shortest_float(m->norm_eps);
    c->rope_theta = m->rope.theta;
    if (m->rope.factor > 0) {
        c->rope_llama3 = 1;
        c->rope_factor = m->rope.factor;
        c->rope_low_freq_factor = m->rope.low_freq_factor;
        c->rope_high_freq_factor = m->rope.high_freq_factor;
        c->rope_original_max_pos = m->rope.original_max_pos;
    }
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
}

size_t hf_model_offset(const GPT2Config *m, int i) {
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS];
    gpt2_param_layout(m, sizes, off);
    size_t C = (size_t)m->C, hs = C / (size_t)m->NH, Q = (size_t)m->NH * hs, KV = (size_t)m->NKV * hs, F = (size_t)m->F;
    if (i == 0) return off[P_WTE];
    int nl = NLAYER_TENSORS * m->L;
    if (i == nl + 1) return off[P_LNFW];
    if (i == nl + 2) return off[P_LMHEAD];
    size_t l = (size_t)(i - 1) / NLAYER_TENSORS, qkv = (Q + 2 * KV) * C;
    switch ((i - 1) % NLAYER_TENSORS) { // LAYER_TENSORS' order
    case 0: return off[P_LN1W] + l * C;
    case 1: return off[P_QKVW] + l * qkv;
    case 2: return off[P_QKVW] + l * qkv + Q * C;
    case 3: return off[P_QKVW] + l * qkv + (Q + KV) * C;
    case 4: return off[P_ATTPROJW] + l * C * Q;
    case 5: return off[P_LN2W] + l * C;
    case 6: return off[P_FCW] + l * 2 * F * C;
    case 7: return off[P_FCW] + l * 2 * F * C + F * C;
    default: return off[P_FCPROJW] + l * C * F;
    }
}

// Tensors config.json has no place for would be left unread: a disagreement between the two, refused.
// A layer past num_hidden_layers; an lm_head.weight under tie_word_embeddings that is not the embedding
// (written tied, it is; transformers would drop it). Other names (such as rotary_emb.inv_freq buffers)
// are not weights llm4d has, and are left as transformers leaves unexpected keys.
static void check_unplaced(const HFCheckpoint *h, const HFConfig *c, const GPT2Config *cfg, const float *wte) {
    for (int i = 0; i < h->nfiles; i++) {
        const char *key;
        json_t *v;
        json_object_foreach(h->files[i].st.header, key, v) {
            int k;
            if (sscanf(key, "model.layers.%d.", &k) == 1 && k >= c->num_hidden_layers)
                die("%s/%s holds %s, but config.json's num_hidden_layers is %d: the two disagree", h->dir, h->files[i].name, key,
                    c->num_hidden_layers);
        }
    }
    StTensor t;
    const HFFile *f;
    if (!c->tie_word_embeddings || find(h, "lm_head.weight", &t, &f) != 0) return;
    size_t n = (size_t)cfg->V * (size_t)cfg->C;
    float *head = xmalloc(sizeof(float) * n);
    int64_t shape[2];
    int nd = hf_tensor_shape(c, "model.embed_tokens.weight", shape);
    hf_read(h, "lm_head.weight", nd, shape, head);
    int same = !memcmp(head, wte, sizeof(float) * n);
    free(head);
    if (!same)
        die("%s: config.json ties the embeddings (tie_word_embeddings true), but lm_head.weight differs from "
            "model.embed_tokens.weight: the two disagree", h->dir);
}

float *hf_load_model(const char *dir, GPT2Config *cfg) {
    HFConfig c;
    hf_config_read(dir, &c);
    *cfg = hf_model_config(&c, dir);
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS];
    size_t n = gpt2_param_layout(cfg, sizes, off);
    float *p = xcalloc(n, sizeof(float)); // the vocabulary's padding rows stay zero
    HFCheckpoint *h = hf_open(dir);
    for (int i = 0; i < hf_tensor_count(&c); i++) {
        char name[128];
        int64_t shape[2];
        hf_tensor_name(&c, i, name, sizeof name);
        int nd = hf_tensor_shape(&c, name, shape);
        hf_read(h, name, nd, shape, p + hf_model_offset(cfg, i));
    }
    check_unplaced(h, &c, cfg, p + hf_model_offset(cfg, 0));
    gpt2_check_finite(cfg, p, dir);
    hf_close(h);
    return p;
}

void hf_save_model(const char *dir, const GPT2Config *cfg, const float *params, DType dt, uint64_t max_shard_bytes) {
    if (cfg->arch != ARCH_LLAMA) die("--save-hf %s: the model is GPT-2; Hugging Face checkpoints are written for --arch llama", dir);
    HFConfig c;
    hf_config_of_model(cfg, &c);
    int n = hf_tensor_count(&c);
    HFTensor *t = xcalloc((size_t)n, sizeof(HFTensor));
    char (*names)[128] = xcalloc((size_t)n, 128);
    for (int i = 0; i < n; i++) {
        hf_tensor_name(&c, i, names[i], 128);
        int64_t shape[2] = { 0, 0 };
        int nd = hf_tensor_shape(&c, names[i], shape);
        t[i] = (HFTensor){ names[i], nd, { shape[0], shape[1] }, params + hf_model_offset(cfg, i) };
    }
    hf_save(dir, &c, t, n, dt, max_shard_bytes);
    free(t);
    free(names);
}

// ---------------------------------------------------------------------------------------------
// train hf-inspect

int hf_inspect_main(int argc, char **argv) {
    const char *dir = NULL, *dump = NULL, *save = NULL, *via = NULL;
    DType dt = DT_F32;
    uint64_t max_shard = HF_MAX_SHARD_BYTES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs("usage: ./train hf-inspect DIR [--dump OUT] [--via-model RAW] [--save-hf OUT2 [--dtype fp32|bf16] [--max-shard-bytes N]]\n"
                  "  reads a Hugging Face Llama checkpoint (config.json, one safetensors file or shards with the index),\n"
                  "  checks every tensor's shape against the config and prints the config and the tensors\n"
                  "  --dump OUT                 write the tensors, converted to fp32, raw into OUT\n"
                  "  --via-model RAW            convert the checkpoint into llm4d's full fp32 parameter vector (what\n"
                  "                             --init-from-hf trains; llm.c's tensor order), write it raw into RAW,\n"
                  "                             and write --save-hf from that vector (as training's --save-hf does)\n"
                  "  --save-hf OUT2             write the checkpoint again into OUT2 (a Hugging Face directory)\n"
                  "  --dtype fp32|bf16          OUT2's element type (default fp32)\n"
                  "  --max-shard-bytes N        the largest shard of OUT2 in bytes (default 5 GB, transformers')\n"
                  "  -h, --help                 this text\n", stdout);
            exit(0);
        }
        if (!strcmp(a, "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(a, "--via-model") && i + 1 < argc) via = argv[++i];
        else if (!strcmp(a, "--save-hf") && i + 1 < argc) save = argv[++i];
        else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "fp32")) dt = DT_F32;
            else if (!strcmp(v, "bf16")) dt = DT_BF16;
            else die("hf-inspect: --dtype %s: expected fp32 or bf16", v);
        } else if (!strcmp(a, "--max-shard-bytes") && i + 1 < argc) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (errno || *end || v == 0 || argv[i][0] == '-') die("hf-inspect: --max-shard-bytes %s: expected a positive integer", argv[i]);
            max_shard = v;
        } else if (a[0] == '-' || dir) die("hf-inspect: unknown argument %s (usage: train hf-inspect DIR [--dump OUT] [--via-model RAW] [--save-hf OUT2 [--dtype fp32|bf16] [--max-shard-bytes N]])", a);
        else dir = a;
    }
    if (!dir) die("hf-inspect: usage: train hf-inspect DIR [--dump OUT] [--via-model RAW] [--save-hf OUT2 [--dtype fp32|bf16] [--max-shard-bytes N]]");
    HFConfig c;
    hf_config_read(dir, &c);
    printf("config: hidden_size %d intermediate_size %d num_attention_heads %d num_key_value_heads %d head_dim %d "
           "num_hidden_layers %d vocab_size %d max_position_embeddings %d rms_norm_eps %g rope_theta %g",
           c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
           c.num_hidden_layers, c.vocab_size, c.max_position_embeddings, c.rms_norm_eps, c.rope_theta);
    if (c.rope_llama3)
        printf(" rope_scaling llama3(factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d)",
               c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_pos);
    else printf(" rope_scaling none");
    printf(" tie_word_embeddings %s torch_dtype %s\n", c.tie_word_embeddings ? "true" : "false", c.torch_dtype);
    if (via) hf_model_config(&c, dir); // a shape llm4d cannot hold is said before any tensor is read
    HFCheckpoint *h = hf_open(dir);
    printf("files: %d\n", hf_nfiles(h));
    int n = hf_tensor_count(&c);
    HFTensor *ts = xcalloc((size_t)n, sizeof(HFTensor));
    char (*names)[128] = xcalloc((size_t)n, 128);
    char err[SAFE_PATH_MAX + 256];
    if (dump && ensure_dir("hf-inspect --dump", dump, err, sizeof err) != 0) die("%s", err);
    for (int i = 0; i < n; i++) {
        hf_tensor_name(&c, i, names[i], 128);
        int64_t shape[2];
        int nd = hf_tensor_shape(&c, names[i], shape);
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (uint64_t)shape[d];
        float *x = xmalloc(sizeof(float) * (numel ? numel : 1));
        hf_read(h, names[i], nd, shape, x);
        char dtype[8], st[128];
        int ndim;
        int64_t fs[8];
        hf_info(h, names[i], dtype, &ndim, fs);
        shape_text(st, sizeof st, nd, shape);
        printf("tensor %s %s %s\n", names[i], dtype, st);
        if (dump) {
            char path[2 * SAFE_PATH_MAX];
            snprintf(path, sizeof path, "%s/%s.bin", dump, names[i]);
            SafeFile sf;
            safe_open_or_die(&sf, path);
            safe_write_or_die(&sf, x, numel * 4);
            safe_commit_or_die(&sf);
        }
        ts[i] = (HFTensor){ names[i], nd, { shape[0], nd > 1 ? shape[1] : 0 }, x };
    }
    if (via) {
        GPT2Config m;
        float *p = hf_load_model(dir, &m);
        SafeFile sf;
        safe_open_or_die(&sf, via);
        safe_write_or_die(&sf, p, sizeof(float) * gpt2_param_layout(&m, (size_t[NUM_PARAM_TENSORS]){ 0 }, (size_t[NUM_PARAM_TENSORS]){ 0 }));
        safe_commit_or_die(&sf);
        printf("model: arch llama L %d C %d NH %d NKV %d F %d V %d Vp %d maxT %d tie %d\n", m.L, m.C, m.NH, m.NKV, m.F, m.V,
               m.Vp, m.maxT, m.tie);
        if (save) hf_save_model(save, &m, p, dt, max_shard);
        free(p);
    } else if (save) {
        hf_save(save, &c, ts, n, dt, max_shard);
    }
    for (int i = 0; i < n; i++) free((void *)ts[i].data);
    free(ts);
    free(names);
    hf_close(h);
    return 0;
}

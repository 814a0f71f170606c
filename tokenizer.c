// tokenizer.c: GPT-2's byte-level BPE and BPE training (see tokenizer.h for the rules).
#define _GNU_SOURCE
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "data.h"

// GPT-2's pattern, \s spelled as the White_Space property: PCRE2's \s under UCP leaves out U+0085,
// which Python's regex module and Rust's regex crate (tiktoken) count as space.
#define WS "\\x{09}-\\x{0d}\\x{85}\\p{Z}"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS
                                   "])|[" WS "]+";

struct Bpe {
    int vocab, eot, nmerges;
    uint8_t **tok;
    int *toklen;
    int byte_id[256];
    int32_t (*merge)[3];     // rank -> left, right, result
    uint64_t *pkey;          // (left << 32 | right) -> rank: open addressing, UINT64_MAX empty
    uint32_t *prank;
    size_t pmask;
    pcre2_code *re;
    uint8_t cls[256]; // the ASCII fast path's classes (C_L, C_N, C_S, C_O; C_U for bytes >= 0x80)
};

// ---------------------------------------------------------------------------------------------
// GPT-2's byte <-> unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100.. in byte order. Token ids 0-255 follow the order of `order` (GPT-2's encoder.json does).

static void byte_map(uint32_t cp_of[256], uint8_t order[256]) {
    int k = 0, extra = 0;
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) order[k++] = (uint8_t)b, cp_of[b] = (uint32_t)b;
    for (int b = 0; b < 256; b++)
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) order[k++] = (uint8_t)b, cp_of[b] = 256u + (uint32_t)extra++;
}

static size_t put_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    return o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63)), o[2] = (char)(0x80 | (cp & 63)), 3;
}

// Length of the well-formed UTF-8 sequence at s (Unicode's table 3-7), 0 when there is none.
static inline size_t utf8_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xc2 || c > 0xf4) return 0;
    if (c < 0xe0) return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
    if (c < 0xf0) {
        if (c == 0xe0 && s[1] < 0xa0) return 0; // overlong
        if (c == 0xed && s[1] > 0x9f) return 0; // surrogates
        return 3;
    }
    if (n < 4 || (s[3] & 0xc0) != 0x80) return 0;
    if (c == 0xf0 && s[1] < 0x90) return 0;
    if (c == 0xf4 && s[1] > 0x8f) return 0;
    return 4;
}

// The code points of a token string in GPT-2's alphabet back to bytes; -1 when one is outside it.
static int unmap(const char *s, const int16_t *byte_of_cp, uint8_t *out, int cap) {
    int n = 0;
    const uint8_t *p = (const uint8_t *)s;
    while (*p) {
        size_t l = utf8_len(p, strlen((const char *)p));
        if (!l) return -1;
        uint32_t cp = l == 1 ? p[0] : l == 2 ? (uint32_t)(p[0] & 31) << 6 | (p[1] & 63) : 0x110000;
        if (cp >= 324 || byte_of_cp[cp] < 0 || n >= cap) return -1;
        out[n++] = (uint8_t)byte_of_cp[cp];
        p += l;
    }
    return n;
}

static inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }
static inline size_t hash64(uint64_t k) { return (size_t)mix64(k); }

static void pairs_alloc(Bpe *b, int merges) {
    size_t cap = 64;
    while (cap < (size_t)merges * 2 + 2) cap <<= 1;
    b->pmask = cap - 1;
    b->pkey = xmalloc(cap * sizeof(uint64_t));
    b->prank = xmalloc(cap * sizeof(uint32_t));
    memset(b->pkey, 0xff, cap * sizeof(uint64_t));
}

// Enters merge r into the pair table; 0 when its pair already has a (lower) rank, which it keeps.
static int pair_insert(Bpe *b, int r) {
    uint64_t k = pair_key((uint32_t)b->merge[r][0], (uint32_t)b->merge[r][1]);
    size_t i = hash64(k) & b->pmask;
    while (b->pkey[i] != UINT64_MAX && b->pkey[i] != k) i = (i + 1) & b->pmask;
    if (b->pkey[i] == k) return 0;
    b->pkey[i] = k;
    b->prank[i] = (uint32_t)r;
    return 1;
}

static void pairs_build(Bpe *b) {
    pairs_alloc(b, b->nmerges);
    for (int r = 0; r < b->nmerges; r++) pair_insert(b, r); // a repeated merge keeps its first (lowest) rank
}

static inline int pair_rank(const Bpe *b, int l, int r) {
    uint64_t k = pair_key((uint32_t)l, (uint32_t)r);
    for (size_t i = hash64(k) & b->pmask;; i = (i + 1) & b->pmask) {
        if (b->pkey[i] == k) return (int)b->prank[i];
        if (b->pkey[i] == UINT64_MAX) return -1;
    }
}

static void compile_pattern(Bpe *b) {
    int ec;
    PCRE2_SIZE off;
    b->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec, &off, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        die("internal: GPT-2's pattern does not compile in PCRE2 at %zu: %s", (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); // without JIT (unsupported CPU) the interpreter matches the same
    for (int c = 0; c < 256; c++)
        b->cls[c] = c >= 0x80 ? 0 : ((c | 32) >= 'a' && (c | 32) <= 'z') ? 1 : (c >= '0' && c <= '9') ? 2
                  : (c == ' ' || (c >= 9 && c <= 13)) ? 3 : 4;
}

static Bpe *bpe_alloc(int vocab) {
    Bpe *b = xcalloc(1, sizeof *b);
    b->vocab = vocab;
    b->eot = -1;
    b->tok = xcalloc((size_t)vocab, sizeof(uint8_t *));
    b->toklen = xcalloc((size_t)vocab, sizeof(int));
    return b;
}

Bpe *bpe_bytes(void) {
    uint32_t cp_of[256];
    uint8_t order[256];
    byte_map(cp_of, order);
    Bpe *b = bpe_alloc(256);
    for (int i = 0; i < 256; i++) {
        b->tok[i] = xmalloc(1);
        b->tok[i][0] = order[i];
        b->toklen[i] = 1;
        b->byte_id[order[i]] = i;
    }
    pairs_build(b);
    compile_pattern(b);
    return b;
}

void bpe_free(Bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->vocab; i++) free(b->tok[i]);
    free(b->tok);
    free(b->toklen);
    free(b->merge);
    free(b->pkey);
    free(b->prank);
    if (b->re) pcre2_code_free(b->re);
    free(b);
}

int bpe_vocab(const Bpe *b) { return b->vocab; }
int bpe_eot(const Bpe *b) { return b->eot; }
int bpe_merges(const Bpe *b) { return b->nmerges; }
const uint8_t *bpe_token(const Bpe *b, int id, int *len) {
    *len = b->toklen[id];
    return b->tok[id];
}

#define FAIL(...) (snprintf(err, cap, __VA_ARGS__), bpe_free(b), b = NULL)

Bpe *bpe_load_gpt2(const char *encoder_json, const char *merges, char *err, size_t cap) {
    uint32_t cp_of[256];
    uint8_t order[256];
    byte_map(cp_of, order);
    int16_t byte_of_cp[324];
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    for (int i = 0; i < 256; i++) byte_of_cp[cp_of[i]] = (int16_t)i;

    json_error_t je;
    json_t *root = json_load_file(encoder_json, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 1) snprintf(err, cap, "--bpe-encoder %s: %s", encoder_json, je.text); // (no position: not opened)
        else snprintf(err, cap, "--bpe-encoder %s: line %d, column %d: %s", encoder_json, je.line, je.column, je.text);
        return NULL;
    }
    Bpe *b = NULL;
    if (!json_is_object(root)) {
        snprintf(err, cap, "--bpe-encoder %s: not a JSON object of token strings to ids", encoder_json);
        json_decref(root);
        return NULL;
    }
    size_t V = json_object_size(root);
    if (V < 256 || V > BPE_MAX_VOCAB) {
        snprintf(err, cap, "--bpe-encoder %s: %zu tokens (need 256 to %d)", encoder_json, V, BPE_MAX_VOCAB);
        json_decref(root);
        return NULL;
    }
    b = bpe_alloc((int)V);
    const char *key;
    json_t *val;
    uint8_t buf[BPE_MAX_TOKEN_BYTES];
    json_object_foreach(root, key, val) {
        if (!b) break;
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= (json_int_t)V) {
            FAIL("--bpe-encoder %s: token \"%s\" has id %s, not an integer in [0, %zu)", encoder_json, key,
                 json_is_integer(val) ? "out of range" : "that is not an integer", V);
            break;
        }
        if (b->tok[id]) {
            FAIL("--bpe-encoder %s: id %lld is given to two tokens", encoder_json, (long long)id);
            break;
        }
        int n = unmap(key, byte_of_cp, buf, (int)sizeof buf);
        if (n <= 0) {
            FAIL("--bpe-encoder %s: token \"%s\" is empty, longer than %d bytes or has a character outside GPT-2's byte alphabet",
                 encoder_json, key, BPE_MAX_TOKEN_BYTES);
            break;
        }
        b->tok[id] = xmalloc((size_t)n);
        memcpy(b->tok[id], buf, (size_t)n);
        b->toklen[id] = n;
    }
    if (b) {
        json_t *e = json_object_get(root, "<|endoftext|>");
        b->eot = e ? (int)json_integer_value(e) : -1;
        for (int i = 0; i < 256 && b; i++) {
            char s[4] = { 0 };
            put_utf8(cp_of[i], s);
            json_t *v = json_object_get(root, s);
            if (!v) FAIL("--bpe-encoder %s: the byte 0x%02x (\"%s\") has no token", encoder_json, i, s);
            else b->byte_id[i] = (int)json_integer_value(v);
        }
    }
    if (!b) {
        json_decref(root);
        return NULL;
    }

    FILE *f = fopen(merges, "rb");
    if (!f) {
        FAIL("--bpe-merges %s: %s", merges, strerror(errno));
        json_decref(root);
        return NULL;
    }
    b->merge = xmalloc(sizeof *b->merge * V);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int lineno = 0;
    while (b && (len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0 || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
        char *sp = strchr(line, ' ');
        if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ')) {
            FAIL("--bpe-merges %s: line %d is not two tokens separated by one space", merges, lineno);
            break;
        }
        *sp = 0;
        json_t *l = json_object_get(root, line), *r = json_object_get(root, sp + 1);
        size_t ll = strlen(line), rl = strlen(sp + 1);
        char *cat = xmalloc(ll + rl + 1);
        memcpy(cat, line, ll);
        memcpy(cat + ll, sp + 1, rl + 1);
        json_t *m = json_object_get(root, cat);
        if (!l || !r) FAIL("--bpe-merges %s: line %d merges \"%s\", which --bpe-encoder %s does not have (the two files disagree)",
                           merges, lineno, !l ? line : sp + 1, encoder_json);
        else if (!m) FAIL("--bpe-merges %s: line %d merges \"%s\" and \"%s\" into \"%s\", which --bpe-encoder %s does not have (the two files disagree)",
                          merges, lineno, line, sp + 1, cat, encoder_json);
        else if (b->nmerges >= (int)V) FAIL("--bpe-merges %s: more merges than --bpe-encoder %s has tokens", merges, encoder_json);
        // tokenizer.bin (llm.c's file, ids and bytes only) gives the merges back by the order of the ids
        // (bpe_from_tokenizer): with ids out of merge order it would encode otherwise than these files
        else if (b->nmerges && json_integer_value(m) <= b->merge[b->nmerges - 1][2])
            FAIL("--bpe-merges %s: line %d makes \"%s\", id %lld in --bpe-encoder %s, not above the id %d the merge before it "
                 "makes: the ids must follow the merge order (GPT-2's merge r makes id 256 + r), which the tokenizer.bin "
                 "written with the shards records", merges, lineno, cat, (long long)json_integer_value(m), encoder_json,
                 b->merge[b->nmerges - 1][2]);
        else {
            b->merge[b->nmerges][0] = (int32_t)json_integer_value(l);
            b->merge[b->nmerges][1] = (int32_t)json_integer_value(r);
            b->merge[b->nmerges][2] = (int32_t)json_integer_value(m);
            b->nmerges++;
        }
        free(cat);
    }
    if (b && ferror(f)) FAIL("--bpe-merges %s: %s", merges, strerror(errno));
    free(line);
    fclose(f);
    json_decref(root);
    if (!b) return NULL;
    if (b->nmerges == 0) {
        FAIL("--bpe-merges %s: no merges in it", merges);
        return NULL;
    }
    pairs_build(b);
    compile_pattern(b);
    return b;
}

static size_t merge_long(const Bpe *b, int32_t *sym, size_t n);

Bpe *bpe_from_tokenizer(const Tokenizer *tk, char *err, size_t cap) {
    if (tk->vocab < 256 || tk->vocab > BPE_MAX_VOCAB) {
        snprintf(err, cap, "the tokenizer has %d tokens; a byte-level BPE has 256 to %d", tk->vocab, BPE_MAX_VOCAB);
        return NULL;
    }
    Bpe *b = bpe_alloc(tk->vocab);
    b->eot = tk->eot;
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
    for (int id = 0; id < tk->vocab; id++) {
        int n = tk->lengths[id];
        b->tok[id] = xmalloc(n ? (size_t)n : 1);
        memcpy(b->tok[id], tk->pieces[id], (size_t)n);
        b->toklen[id] = n;
        if (n == 1 && b->byte_id[(uint8_t)tk->pieces[id][0]] < 0) b->byte_id[(uint8_t)tk->pieces[id][0]] = id;
    }
    for (int i = 0; i < 256; i++)
        if (b->byte_id[i] < 0) {
            snprintf(err, cap, "the tokenizer has no token for the byte 0x%02x, so it is not a byte-level BPE", i);
            bpe_free(b);
            return NULL;
        }
    // Merge ranks follow the ids (GPT-2's merge r made token 256 + r; bpe_train numbers its tokens in
    // merge order): token t's merge is the last step of encoding its own bytes with the merges below it.
    b->merge = xmalloc(sizeof *b->merge * (size_t)tk->vocab);
    pairs_alloc(b, tk->vocab);
    int32_t *sym = xmalloc(sizeof(int32_t) * BPE_MAX_TOKEN_BYTES);
    for (int t = 0; t < tk->vocab; t++) {
        int n = b->toklen[t];
        if (t == b->eot || n < 2) continue;
        for (int i = 0; i < n; i++) sym[i] = b->byte_id[b->tok[t][i]];
        if (merge_long(b, sym, (size_t)n) != 2) continue; // not reachable by one merge: never produced
        b->merge[b->nmerges][0] = sym[0], b->merge[b->nmerges][1] = sym[1], b->merge[b->nmerges][2] = t;
        if (pair_insert(b, b->nmerges)) b->nmerges++;
    }
    free(sym);
    compile_pattern(b);
    return b;
}

// ---------------------------------------------------------------------------------------------
// pre-tokenizer

struct BpeEncoder {
    const Bpe *b;
    pcre2_match_data *md;
    // cache of encoded pieces up to CACHE_PIECE bytes: open addressing over (hash, offset, length)
    uint64_t *ckey;      // hash of the piece, 0 = empty
    uint32_t *cpos;      // piece bytes at cbytes + cpos, ids at cids + cidx
    uint32_t *cidx;
    uint8_t *clen, *cn;  // piece length, number of ids
    uint8_t *cbytes;
    uint16_t *cids;
    size_t cused, cbytes_used, cids_used;
    // scratch
    uint8_t *clean;      // a segment with invalid bytes: U+FFFD for each, and where each clean byte came from
    uint32_t *from;
    size_t clean_cap;
    int32_t *sym;
    size_t sym_cap;
};

enum { CACHE_SLOTS = 1 << 16, CACHE_PIECE = 48, CACHE_BYTES = CACHE_SLOTS * 16 };

BpeEncoder *bpe_encoder_new(const Bpe *b) {
    BpeEncoder *e = xcalloc(1, sizeof *e);
    e->b = b;
    e->md = pcre2_match_data_create(1, NULL);
    if (!e->md) die("out of memory (PCRE2 match data)");
    e->ckey = xcalloc(CACHE_SLOTS, sizeof(uint64_t));
    e->cpos = xmalloc(CACHE_SLOTS * sizeof(uint32_t));
    e->cidx = xmalloc(CACHE_SLOTS * sizeof(uint32_t));
    e->clen = xmalloc(CACHE_SLOTS);
    e->cn = xmalloc(CACHE_SLOTS);
    e->cbytes = xmalloc(CACHE_BYTES);
    e->cids = xmalloc(CACHE_BYTES * sizeof(uint16_t));
    return e;
}

void bpe_encoder_free(BpeEncoder *e) {
    if (!e) return;
    pcre2_match_data_free(e->md);
    free(e->ckey);
    free(e->cpos);
    free(e->cidx);
    free(e->clen);
    free(e->cn);
    free(e->cbytes);
    free(e->cids);
    free(e->clean);
    free(e->from);
    free(e->sym);
    free(e);
}

// ASCII classes: letter, number, White_Space, other; bytes >= 0x80 are left to PCRE2.
enum { C_U = 0, C_L = 1, C_N = 2, C_S = 3, C_O = 4 };

// Length of the piece at s[p] for ASCII text, 0 when a byte it depends on is not ASCII (PCRE2 decides).
static inline size_t ascii_piece(const uint8_t *s, size_t p, size_t n, const uint8_t *cls) {
    uint8_t c = s[p];
    if (c == '\'' && p + 1 < n) {
        uint8_t d = s[p + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
        if (p + 2 < n && ((d == 'r' && s[p + 2] == 'e') || (d == 'v' && s[p + 2] == 'e') || (d == 'l' && s[p + 2] == 'l'))) return 3;
    }
    size_t q = p;
    uint8_t k = cls[c];
    if (c == ' ') {
        if (p + 1 == n) return 1;
        uint8_t k1 = cls[s[p + 1]];
        if (k1 == C_U) return 0;
        if (k1 != C_S) q = p + 1, k = k1;
    }
    if (k == C_U) return 0;
    size_t e = q + 1;
    while (e < n && cls[s[e]] == k) e++;
    if (e < n && cls[s[e]] == C_U) return 0; // the run might go on in a non-ASCII letter, digit or space
    if (k != C_S) return e - p;
    if (e == n || e - p == 1) return e - p;  // \s+(?!\S) to the end, or a lone \s+
    return e - 1 - p;                        // the last space goes with what follows
}

static size_t pcre_piece(BpeEncoder *e, const uint8_t *s, size_t p, size_t n) {
    int rc = pcre2_match(e->b->re, (PCRE2_SPTR)s, n, p, PCRE2_NO_UTF_CHECK, e->md, NULL);
    if (rc < 0) die("internal: GPT-2's pattern matched nothing at byte %zu (PCRE2 error %d)", p, rc);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    if (ov[0] != p || ov[1] <= p) die("internal: GPT-2's pattern matched an empty piece at byte %zu", p);
    return ov[1] - p;
}

// Whether s[0, n) is well-formed UTF-8 (8 ASCII bytes at a time where it can).
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        size_t l = utf8_len(s + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

static void pieces_valid(BpeEncoder *e, const uint8_t *s, size_t n, const uint32_t *from, const uint8_t *orig,
                         void (*fn)(const uint8_t *, size_t, void *), void *ctx) {
    const uint8_t *cls = e->b->cls;
    for (size_t p = 0; p < n;) {
        size_t l = ascii_piece(s, p, n, cls);
        if (!l) l = pcre_piece(e, s, p, n);
        if (from) fn(orig + from[p], from[p + l] - from[p], ctx);
        else fn(s + p, l, ctx);
        p += l;
    }
}

void bpe_pieces(BpeEncoder *e, const uint8_t *s, size_t n, void (*fn)(const uint8_t *, size_t, void *), void *ctx) {
    if (utf8_valid(s, n)) {
        pieces_valid(e, s, n, NULL, NULL, fn, ctx);
        return;
    }
    // Each invalid byte becomes U+FFFD (like it, neither letter, number nor space) in a clean copy that
    // the pattern can read; the pieces are cut from the original bytes through `from`.
    if (e->clean_cap < 3 * n + 1) {
        free(e->clean);
        free(e->from);
        e->clean_cap = 3 * n + 1;
        e->clean = xmalloc(e->clean_cap);
        e->from = xmalloc(sizeof(uint32_t) * e->clean_cap);
    }
    if (n > UINT32_MAX / 4) die("a segment of %zu bytes with invalid UTF-8 is too long (at most 1 GiB)", n);
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len(s + i, n - i);
        if (l) {
            for (size_t k = 0; k < l; k++) e->from[m] = (uint32_t)i, e->clean[m++] = s[i + k];
            i += l;
        } else {
            static const uint8_t fffd[3] = { 0xef, 0xbf, 0xbd };
            for (int k = 0; k < 3; k++) e->from[m] = (uint32_t)i, e->clean[m++] = fffd[k];
            i++;
        }
    }
    e->from[m] = (uint32_t)n;
    pieces_valid(e, e->clean, m, e->from, s, fn, ctx);
}

// ---------------------------------------------------------------------------------------------
// merges within one piece

typedef struct {
    uint32_t rank, pos;
} HeapItem;

static inline int heap_less(HeapItem a, HeapItem b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(HeapItem *h, size_t *n, HeapItem x) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(x, h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = x;
}

static HeapItem heap_pop(HeapItem *h, size_t *n) {
    HeapItem top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c], i = c;
    }
    if (*n) h[i] = x;
    return top;
}

// Long pieces: symbols in a linked list, candidate pairs in a heap keyed by (rank, position of the
// left symbol's first byte), stale entries skipped: the same lowest-rank-leftmost order in O(n log n).
static size_t merge_long(const Bpe *b, int32_t *sym, size_t n) {
    size_t *next = xmalloc(sizeof(size_t) * n), *prev = xmalloc(sizeof(size_t) * n);
    HeapItem *h = xmalloc(sizeof(HeapItem) * 2 * n); // n - 1 pairs, then each merge adds at most one more
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) next[i] = i + 1, prev[i] = i - 1; // prev[0] wraps to SIZE_MAX: none
    for (size_t i = 0; i + 1 < n; i++) {
        int r = pair_rank(b, sym[i], sym[i + 1]);
        if (r >= 0) heap_push(h, &hn, (HeapItem){ (uint32_t)r, (uint32_t)i });
    }
    while (hn) {
        HeapItem it = heap_pop(h, &hn);
        size_t i = it.pos, j = next[i];
        if (sym[i] < 0 || j >= n) continue;
        int r = pair_rank(b, sym[i], sym[j]);
        if (r < 0 || (uint32_t)r != it.rank) continue; // stale
        sym[i] = b->merge[r][2];
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] < n) prev[next[j]] = i;
        if (prev[i] != SIZE_MAX) {
            int rl = pair_rank(b, sym[prev[i]], sym[i]);
            if (rl >= 0) heap_push(h, &hn, (HeapItem){ (uint32_t)rl, (uint32_t)prev[i] });
        }
        if (next[i] < n) {
            int rr = pair_rank(b, sym[i], sym[next[i]]);
            if (rr >= 0) heap_push(h, &hn, (HeapItem){ (uint32_t)rr, (uint32_t)i });
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (sym[i] >= 0) sym[m++] = sym[i];
    free(next);
    free(prev);
    free(h);
    return m;
}

// The ids of one piece into e->sym; returns their number.
static size_t merge_piece(BpeEncoder *e, const uint8_t *p, size_t n) {
    const Bpe *b = e->b;
    if (e->sym_cap < n) {
        free(e->sym);
        e->sym_cap = n < 256 ? 256 : n;
        e->sym = xmalloc(sizeof(int32_t) * e->sym_cap);
    }
    int32_t *sym = e->sym;
    for (size_t i = 0; i < n; i++) sym[i] = b->byte_id[p[i]];
    if (n > 128) return merge_long(b, sym, n);
    // short pieces: rescan for the lowest rank, merge its leftmost occurrence, repeat
    int rank[128];
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(b, sym[i], sym[i + 1]);
    while (n > 1) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] >= 0 && (best < 0 || rank[i] < best)) best = rank[i], at = i;
        if (best < 0) break;
        sym[at] = b->merge[best][2];
        memmove(sym + at + 1, sym + at + 2, sizeof(int32_t) * (n - at - 2));
        memmove(rank + at, rank + at + 1, sizeof(int) * (n - at - 2));
        n--;
        if (at + 1 < n) rank[at] = pair_rank(b, sym[at], sym[at + 1]);
        if (at > 0) rank[at - 1] = pair_rank(b, sym[at - 1], sym[at]);
    }
    return n;
}

typedef struct {
    BpeEncoder *e;
    uint16_t **out;
    size_t *len, *cap;
} EncodeCtx;

static inline void push_ids(EncodeCtx *c, const uint16_t *ids, size_t k) {
    if (*c->len + k > *c->cap) {
        size_t nc = *c->cap ? *c->cap * 2 : 4096;
        while (nc < *c->len + k) nc *= 2;
        uint16_t *o = realloc(*c->out, nc * sizeof(uint16_t));
        if (!o) die("out of memory growing the token buffer to %zu tokens", nc);
        *c->out = o;
        *c->cap = nc;
    }
    memcpy(*c->out + *c->len, ids, k * sizeof(uint16_t));
    *c->len += k;
}

static inline uint64_t piece_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, p + i, n - i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    return h | 1; // 0 marks an empty slot
}

static void encode_piece(const uint8_t *p, size_t n, void *vctx) {
    EncodeCtx *c = vctx;
    BpeEncoder *e = c->e;
    if (n == 1) {
        uint16_t id = (uint16_t)e->b->byte_id[p[0]];
        push_ids(c, &id, 1);
        return;
    }
    size_t slot = 0;
    uint64_t h = 0;
    if (n <= CACHE_PIECE) {
        h = piece_hash(p, n);
        for (slot = h & (CACHE_SLOTS - 1);; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            if (!e->ckey[slot]) break;
            if (e->ckey[slot] == h && e->clen[slot] == n && !memcmp(e->cbytes + e->cpos[slot], p, n)) {
                push_ids(c, e->cids + e->cidx[slot], e->cn[slot]);
                return;
            }
        }
    }
    size_t k = merge_piece(e, p, n);
    uint16_t small[CACHE_PIECE];
    uint16_t *ids = k <= CACHE_PIECE ? small : xmalloc(sizeof(uint16_t) * k);
    for (size_t i = 0; i < k; i++) ids[i] = (uint16_t)e->sym[i];
    push_ids(c, ids, k);
    if (n <= CACHE_PIECE) {
        if (e->cused * 2 >= CACHE_SLOTS || e->cbytes_used + n > CACHE_BYTES || e->cids_used + k > CACHE_BYTES) {
            // full: start over (the ids never depend on the cache, only the speed does)
            memset(e->ckey, 0, CACHE_SLOTS * sizeof(uint64_t));
            e->cused = e->cbytes_used = e->cids_used = 0;
            for (slot = h & (CACHE_SLOTS - 1); e->ckey[slot]; slot = (slot + 1) & (CACHE_SLOTS - 1)) {}
        }
        e->ckey[slot] = h;
        e->clen[slot] = (uint8_t)n;
        e->cn[slot] = (uint8_t)k;
        e->cpos[slot] = (uint32_t)e->cbytes_used;
        e->cidx[slot] = (uint32_t)e->cids_used;
        memcpy(e->cbytes + e->cbytes_used, p, n);
        memcpy(e->cids + e->cids_used, ids, k * sizeof(uint16_t));
        e->cbytes_used += n;
        e->cids_used += k;
        e->cused++;
    }
    if (ids != small) free(ids);
}

void bpe_encode(BpeEncoder *e, const uint8_t *s, size_t n, uint16_t **out, size_t *len, size_t *cap) {
    EncodeCtx c = { e, out, len, cap };
    bpe_pieces(e, s, n, encode_piece, &c);
}

size_t bpe_decode_bound(const Bpe *b, size_t n) {
    (void)b;
    return n * BPE_MAX_TOKEN_BYTES;
}

size_t bpe_decode(const Bpe *b, const uint16_t *ids, size_t n, uint8_t *out) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= b->vocab) die("internal: token %u is not below the vocabulary %d", ids[i], b->vocab);
        memcpy(out + w, b->tok[ids[i]], (size_t)b->toklen[ids[i]]);
        w += (size_t)b->toklen[ids[i]];
    }
    return w;
}

// ---------------------------------------------------------------------------------------------
// training

struct BpeCounter {
    uint64_t *hash;  // 0 empty
    uint32_t *off, *len;
    uint64_t *count;
    uint8_t *bytes;
    size_t used, cap, nbytes, bcap;
};

BpeCounter *bpe_counter_new(void) {
    BpeCounter *c = xcalloc(1, sizeof *c);
    c->cap = 1 << 12;
    c->hash = xcalloc(c->cap, sizeof(uint64_t));
    c->off = xmalloc(c->cap * sizeof(uint32_t));
    c->len = xmalloc(c->cap * sizeof(uint32_t));
    c->count = xmalloc(c->cap * sizeof(uint64_t));
    c->bcap = 1 << 16;
    c->bytes = xmalloc(c->bcap);
    return c;
}

void bpe_counter_free(BpeCounter *c) {
    if (!c) return;
    free(c->hash);
    free(c->off);
    free(c->len);
    free(c->count);
    free(c->bytes);
    free(c);
}

size_t bpe_counter_types(const BpeCounter *c) { return c->used; }

static void counter_add(BpeCounter *c, const uint8_t *p, size_t n, uint64_t k, uint64_t h);

static void counter_grow(BpeCounter *c) {
    BpeCounter old = *c;
    c->cap *= 2;
    c->used = 0;
    c->hash = xcalloc(c->cap, sizeof(uint64_t));
    c->off = xmalloc(c->cap * sizeof(uint32_t));
    c->len = xmalloc(c->cap * sizeof(uint32_t));
    c->count = xmalloc(c->cap * sizeof(uint64_t));
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.hash[i]) continue;
        size_t j = old.hash[i] & (c->cap - 1);
        while (c->hash[j]) j = (j + 1) & (c->cap - 1);
        c->hash[j] = old.hash[i];
        c->off[j] = old.off[i];
        c->len[j] = old.len[i];
        c->count[j] = old.count[i];
        c->used++;
    }
    free(old.hash);
    free(old.off);
    free(old.len);
    free(old.count);
}

static void counter_add(BpeCounter *c, const uint8_t *p, size_t n, uint64_t k, uint64_t h) {
    if ((c->used + 1) * 2 > c->cap) counter_grow(c);
    size_t j = h & (c->cap - 1);
    for (; c->hash[j]; j = (j + 1) & (c->cap - 1))
        if (c->hash[j] == h && c->len[j] == n && !memcmp(c->bytes + c->off[j], p, n)) {
            c->count[j] += k;
            return;
        }
    if (c->nbytes + n > c->bcap) {
        while (c->nbytes + n > c->bcap) c->bcap *= 2;
        uint8_t *nb = realloc(c->bytes, c->bcap);
        if (!nb) die("out of memory counting pre-tokens (%zu bytes of distinct pieces)", c->bcap);
        c->bytes = nb;
    }
    if (c->nbytes + n > UINT32_MAX) die("bpe: more than 4 GiB of distinct pre-tokens to count");
    memcpy(c->bytes + c->nbytes, p, n);
    c->hash[j] = h;
    c->off[j] = (uint32_t)c->nbytes;
    c->len[j] = (uint32_t)n;
    c->count[j] = k;
    c->nbytes += n;
    c->used++;
}

static void count_piece(const uint8_t *p, size_t n, void *ctx) { counter_add(ctx, p, n, 1, piece_hash(p, n)); }

void bpe_count(BpeCounter *c, BpeEncoder *e, const uint8_t *s, size_t n) { bpe_pieces(e, s, n, count_piece, c); }

void bpe_counter_merge(BpeCounter *dst, const BpeCounter *src) {
    for (size_t i = 0; i < src->cap; i++)
        if (src->hash[i]) counter_add(dst, src->bytes + src->off[i], src->len[i], src->count[i], src->hash[i]);
}

// Pair statistics: open addressing from (left, right) to an entry with its count and the words it
// occurs in (a list that may hold words it has left since: checked when used).
typedef struct {
    uint64_t key;
    int64_t count;
    uint32_t *words;
    uint32_t nwords, cwords;
} PairStat;

typedef struct {
    PairStat *t;
    size_t cap, used;
} PairMap;

static PairStat *pair_get(PairMap *m, uint64_t key, int create) {
    if (create && (m->used + 1) * 2 > m->cap) {
        PairMap o = *m;
        m->cap = o.cap ? o.cap * 2 : 1 << 14;
        m->t = xcalloc(m->cap, sizeof(PairStat));
        m->used = 0;
        for (size_t i = 0; i < o.cap; i++) {
            if (o.t[i].key == 0) continue;
            size_t j = hash64(o.t[i].key) & (m->cap - 1);
            while (m->t[j].key) j = (j + 1) & (m->cap - 1);
            m->t[j] = o.t[i];
            m->used++;
        }
        free(o.t);
    }
    if (!m->cap) return NULL;
    for (size_t j = hash64(key) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        if (m->t[j].key == key) return &m->t[j];
        if (m->t[j].key == 0) {
            if (!create) return NULL;
            m->t[j].key = key;
            m->used++;
            return &m->t[j];
        }
    }
}

// pair keys are stored + 1 so that 0 stays the empty slot
static inline uint64_t pkey(int32_t a, int32_t b) { return pair_key((uint32_t)a, (uint32_t)b) + 1; }

static void pair_note_word(PairStat *p, uint32_t w) {
    if (p->nwords && p->words[p->nwords - 1] == w) return;
    if (p->nwords == p->cwords) {
        p->cwords = p->cwords ? p->cwords * 2 : 4;
        uint32_t *nw = realloc(p->words, sizeof(uint32_t) * p->cwords);
        if (!nw) die("out of memory in BPE training");
        p->words = nw;
    }
    p->words[p->nwords++] = w;
}

typedef struct {
    int64_t count;
    uint64_t key; // pkey
} Cand;

// the heap's order: higher count first, then the smaller (left, right)
static inline int cand_before(Cand a, Cand b) { return a.count > b.count || (a.count == b.count && a.key < b.key); }

typedef struct {
    Cand *h;
    size_t n, cap;
} CandHeap;

static void cand_push(CandHeap *q, Cand x) {
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 1024;
        Cand *nh = realloc(q->h, sizeof(Cand) * q->cap);
        if (!nh) die("out of memory in BPE training");
        q->h = nh;
    }
    size_t i = q->n++;
    while (i > 0 && cand_before(x, q->h[(i - 1) / 2])) q->h[i] = q->h[(i - 1) / 2], i = (i - 1) / 2;
    q->h[i] = x;
}

static Cand cand_pop(CandHeap *q) {
    Cand top = q->h[0], x = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && cand_before(q->h[c + 1], q->h[c])) c++;
        if (!cand_before(q->h[c], x)) break;
        q->h[i] = q->h[c], i = c;
    }
    if (q->n) q->h[i] = x;
    return top;
}

typedef struct {
    const uint8_t *bytes;
    uint32_t len;
    uint64_t count;
} WordRef;

static int word_cmp(const void *a, const void *b) {
    const WordRef *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->bytes, y->bytes, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

Bpe *bpe_train(const BpeCounter *c, int vocab) {
    Bpe *base = bpe_bytes();
    int target = vocab - 257; // merges: the bytes and <|endoftext|> take the rest
    // words in byte order, so that every list below is built the same way on every run
    size_t nw = c->used;
    WordRef *refs = xmalloc(sizeof(WordRef) * (nw ? nw : 1));
    size_t k = 0;
    for (size_t i = 0; i < c->cap; i++)
        if (c->hash[i]) refs[k++] = (WordRef){ c->bytes + c->off[i], c->len[i], c->count[i] };
    qsort(refs, nw, sizeof(WordRef), word_cmp);
    int32_t **w = xmalloc(sizeof(int32_t *) * (nw ? nw : 1));
    uint32_t *wl = xmalloc(sizeof(uint32_t) * (nw ? nw : 1));
    int64_t *wc = xmalloc(sizeof(int64_t) * (nw ? nw : 1));
    PairMap pm = { 0 };
    for (size_t i = 0; i < nw; i++) {
        w[i] = xmalloc(sizeof(int32_t) * refs[i].len);
        wl[i] = refs[i].len;
        wc[i] = (int64_t)refs[i].count;
        for (uint32_t j = 0; j < refs[i].len; j++) w[i][j] = base->byte_id[refs[i].bytes[j]];
        for (uint32_t j = 0; j + 1 < wl[i]; j++) {
            PairStat *p = pair_get(&pm, pkey(w[i][j], w[i][j + 1]), 1);
            p->count += wc[i];
            pair_note_word(p, (uint32_t)i);
        }
    }
    free(refs);
    CandHeap q = { 0 };
    for (size_t i = 0; i < pm.cap; i++)
        if (pm.t[i].key && pm.t[i].count > 0) cand_push(&q, (Cand){ pm.t[i].count, pm.t[i].key });

    int V = 256 + (target > 0 ? target : 0);
    uint8_t **tok = xcalloc((size_t)V + 1, sizeof(uint8_t *));
    int *toklen = xcalloc((size_t)V + 1, sizeof(int));
    for (int i = 0; i < 256; i++) {
        tok[i] = xmalloc(1);
        tok[i][0] = base->tok[i][0];
        toklen[i] = 1;
    }
    int32_t (*merge)[3] = xmalloc(sizeof *merge * (size_t)(target > 0 ? target : 1));
    int nm = 0;
    uint32_t *stamp = xcalloc(nw ? nw : 1, sizeof(uint32_t)); // the merge that last rewrote a word
    uint64_t *touched = NULL;
    size_t ntouched = 0, ctouched = 0;
    while (nm < target && q.n) {
        Cand top = cand_pop(&q);
        PairStat *p = pair_get(&pm, top.key, 0);
        if (!p || p->count <= 0) continue;
        if (p->count != top.count) { // stale: its count fell since
            cand_push(&q, (Cand){ p->count, top.key });
            continue;
        }
        int32_t a = (int32_t)((top.key - 1) >> 32), bb = (int32_t)((top.key - 1) & 0xffffffffu);
        int newlen = toklen[a] + toklen[bb];
        if (newlen > BPE_MAX_TOKEN_BYTES) { // never merged: drop the pair from the candidates
            p->count = 0;
            continue;
        }
        int32_t id = 256 + nm;
        tok[id] = xmalloc((size_t)newlen);
        memcpy(tok[id], tok[a], (size_t)toklen[a]);
        memcpy(tok[id] + toklen[a], tok[bb], (size_t)toklen[bb]);
        toklen[id] = newlen;
        merge[nm][0] = a, merge[nm][1] = bb, merge[nm][2] = id;
        nm++;
        // rewrite every word holding the pair: left to right, non-overlapping; counts move from the old
        // pairs to the new ones
        uint32_t *list = p->words, nlist = p->nwords;
        p->words = NULL, p->nwords = p->cwords = 0;
        ntouched = 0;
        for (uint32_t li = 0; li < nlist; li++) {
            uint32_t wi = list[li];
            if (stamp[wi] == (uint32_t)nm) continue;
            int32_t *s = w[wi];
            uint32_t n = wl[wi], j = 0, o = 0;
            int found = 0;
            for (uint32_t t = 0; t + 1 < n; t++)
                if (s[t] == a && s[t + 1] == bb) { found = 1; break; }
            if (!found) continue;
            stamp[wi] = (uint32_t)nm;
            for (uint32_t t = 0; t + 1 < n; t++) pair_get(&pm, pkey(s[t], s[t + 1]), 0)->count -= wc[wi];
            while (j < n) {
                if (j + 1 < n && s[j] == a && s[j + 1] == bb) s[o++] = id, j += 2;
                else s[o++] = s[j++];
            }
            wl[wi] = n = o;
            for (uint32_t t = 0; t + 1 < n; t++) {
                PairStat *np = pair_get(&pm, pkey(s[t], s[t + 1]), 1);
                np->count += wc[wi];
                if (s[t] == id || s[t + 1] == id) {
                    pair_note_word(np, wi);
                    if (ntouched == ctouched) {
                        ctouched = ctouched ? 2 * ctouched : 256;
                        uint64_t *nt = realloc(touched, sizeof(uint64_t) * ctouched);
                        if (!nt) die("out of memory in BPE training");
                        touched = nt;
                    }
                    touched[ntouched++] = pkey(s[t], s[t + 1]);
                }
            }
        }
        free(list);
        pair_get(&pm, top.key, 0)->count = 0;
        // the new token's pairs enter the candidates with their final counts (a repeat is harmless:
        // the stale check drops it)
        for (size_t t = 0; t < ntouched; t++) {
            PairStat *np = pair_get(&pm, touched[t], 0);
            if (np->count > 0) cand_push(&q, (Cand){ np->count, touched[t] });
        }
    }
    free(touched);
    free(stamp);
    free(q.h);
    for (size_t i = 0; i < pm.cap; i++) free(pm.t[i].words);
    free(pm.t);
    for (size_t i = 0; i < nw; i++) free(w[i]);
    free(w);
    free(wl);
    free(wc);

    Bpe *b = bpe_alloc(256 + nm + 1);
    for (int i = 0; i < 256 + nm; i++) b->tok[i] = tok[i], b->toklen[i] = toklen[i];
    free(tok);
    free(toklen);
    memcpy(b->byte_id, base->byte_id, sizeof b->byte_id);
    b->eot = 256 + nm;
    b->tok[b->eot] = xmalloc(13);
    memcpy(b->tok[b->eot], "<|endoftext|>", 13);
    b->toklen[b->eot] = 13;
    b->merge = merge;
    b->nmerges = nm;
    bpe_free(base);
    pairs_build(b);
    compile_pattern(b);
    return b;
}

// ---------------------------------------------------------------------------------------------
// writing

// A token in GPT-2's alphabet (each byte one code point), NUL-terminated, into out (>= 3 * len + 1).
static void map_token(const uint8_t *t, int len, char *out) {
    uint32_t cp_of[256];
    uint8_t order[256];
    byte_map(cp_of, order);
    size_t w = 0;
    for (int i = 0; i < len; i++) w += put_utf8(cp_of[t[i]], out + w);
    out[w] = 0;
}

static int write_all(const char *path, const void *data, size_t n, char *err, size_t cap) {
    SafeFile sf;
    if (safe_open(&sf, path) != 0 || safe_write(&sf, data, n) != 0 || safe_commit(&sf) != 0) {
        snprintf(err, cap, "%s", sf.err);
        return -1;
    }
    return 0;
}

int bpe_write_gpt2(const Bpe *b, const char *encoder_json, const char *merges, char *err, size_t cap) {
    json_t *root = json_object();
    char s[3 * BPE_MAX_TOKEN_BYTES + 1];
    for (int i = 0; i < b->vocab; i++) {
        if (i == b->eot) snprintf(s, sizeof s, "<|endoftext|>");
        else map_token(b->tok[i], b->toklen[i], s);
        if (json_object_set_new(root, s, json_integer(i)) != 0) die("out of memory writing %s", encoder_json);
    }
    char *text = json_dumps(root, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(root);
    if (!text) die("out of memory writing %s", encoder_json);
    int rc = write_all(encoder_json, text, strlen(text), err, cap);
    free(text);
    if (rc) return rc;
    size_t mcap = 64 + (size_t)b->nmerges * (6 * BPE_MAX_TOKEN_BYTES + 4), w = 0;
    char *m = xmalloc(mcap);
    w += (size_t)snprintf(m, mcap, "#version: 0.2\n");
    for (int r = 0; r < b->nmerges; r++) {
        map_token(b->tok[b->merge[r][0]], b->toklen[b->merge[r][0]], m + w);
        w += strlen(m + w);
        m[w++] = ' ';
        map_token(b->tok[b->merge[r][1]], b->toklen[b->merge[r][1]], m + w);
        w += strlen(m + w);
        m[w++] = '\n';
    }
    rc = write_all(merges, m, w, err, cap);
    free(m);
    return rc;
}

int bpe_write_llmc(const Bpe *b, const char *path, char *err, size_t cap) {
    return tokenizer_write(path, b->vocab, b->eot < 0 ? 0 : b->eot, (const uint8_t *const *)b->tok, b->toklen, err, cap);
}

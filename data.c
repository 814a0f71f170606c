// data.c: token shards, the global-batch order and tokenizer files.
#define _GNU_SOURCE
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"

static void pread_all(int fd, void *dst, size_t n, off_t off, const char *path) {
    char *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("cannot read %s: %s", path, strerror(errno));
        }
        if (r == 0) die("%s is truncated (unexpected end of file)", path);
        p += r;
        n -= (size_t)r;
        off += r;
    }
}

static void shard_open(Shard *s, const char *path) {
    s->path = strdup(path);
    if (!s->path) die("out of memory");
    // O_NONBLOCK: a FIFO or device named here would otherwise block the open until a writer comes
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (s->fd < 0) die("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0) die("cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) die("%s is not a regular file: a token shard is read at offsets", path);
    if (st.st_size < 1024) die("%s is truncated: %lld bytes is shorter than the 1024-byte shard header", path, (long long)st.st_size);
    int32_t h[256];
    pread_all(s->fd, h, sizeof h, 0, path);
    if (h[0] != SHARD_MAGIC && h[0] != SHARD_MAGIC_U32)
        die("%s: bad magic %d (expected %d for an llm.c token shard, or %d for its Llama 3 variant)", path, h[0],
            SHARD_MAGIC, SHARD_MAGIC_U32);
    int want = h[0] == SHARD_MAGIC ? SHARD_VERSION : SHARD_VERSION_U32;
    if (h[1] != want) die("%s: unsupported token shard version %d (expected %d with magic %d)", path, h[1], want, h[0]);
    s->tok_bytes = h[0] == SHARD_MAGIC ? 2 : 4;
    if (h[2] < 0) die("%s: negative token count %d in header", path, h[2]);
    s->ntokens = (uint64_t)h[2];
    uint64_t need = 1024 + (uint64_t)s->tok_bytes * s->ntokens;
    if ((uint64_t)st.st_size < need)
        die("%s is truncated: header says %llu tokens (%llu bytes) but the file has %lld bytes", path,
            (unsigned long long)s->ntokens, (unsigned long long)need, (long long)st.st_size);
    if ((uint64_t)st.st_size > need)
        die("%s: %lld bytes is more than the %llu tokens its header declares", path, (long long)st.st_size,
            (unsigned long long)s->ntokens);
}

// n tokens of the shard from its token `local` on, widened to uint32
static void shard_tokens(const Shard *s, uint64_t local, size_t n, uint32_t *out) {
    off_t off = (off_t)(1024 + (uint64_t)s->tok_bytes * local);
    if (s->tok_bytes == 4) {
        pread_all(s->fd, out, n * 4, off, s->path);
        return;
    }
    uint16_t *narrow = xmalloc(sizeof(uint16_t) * (n ? n : 1));
    pread_all(s->fd, narrow, n * 2, off, s->path);
    for (size_t j = 0; j < n; j++) out[j] = narrow[j];
    free(narrow);
}

// One pass over a shard's tokens: the first one at or above the vocabulary is reported with its file
// and place, when the data is opened rather than when (or if) its window is read.
static void shard_validate(const Shard *s, int vocab) {
    enum { CHUNK = 1 << 20 };
    uint32_t *buf = xmalloc(sizeof(uint32_t) * CHUNK);
    for (uint64_t at = 0; at < s->ntokens; at += CHUNK) {
        size_t n = s->ntokens - at < CHUNK ? (size_t)(s->ntokens - at) : CHUNK;
        shard_tokens(s, at, n, buf);
        for (size_t j = 0; j < n; j++)
            if (buf[j] >= (uint32_t)vocab)
                die("%s: token %u at position %llu (byte offset %llu) is not below the vocabulary size %d", s->path, buf[j],
                    (unsigned long long)(at + j), (unsigned long long)(1024 + (uint64_t)s->tok_bytes * (at + j)), vocab);
    }
    free(buf);
}

// One shard's part of the fingerprint (data.h), continuing crc: the tokens' bytes as stored (2 or 4 a
// token, by the shard's header).
static uint32_t shard_fingerprint(const Shard *s, uint32_t crc) {
    size_t w = (size_t)s->tok_bytes;
    unsigned char *buf = xmalloc(w * FP_BLOCK > 1024 ? w * FP_BLOCK : 1024);
    pread_all(s->fd, buf, 1024, 0, s->path);
    crc = (uint32_t)crc32(crc, buf, 1024);
    uint64_t n = s->ntokens;
    if (n <= (uint64_t)FP_BLOCKS * FP_BLOCK) { // small: every token
        for (uint64_t at = 0; at < n; at += FP_BLOCK) {
            size_t take = n - at < FP_BLOCK ? (size_t)(n - at) : FP_BLOCK;
            pread_all(s->fd, buf, w * take, (off_t)(1024 + w * at), s->path);
            crc = (uint32_t)crc32(crc, buf, (uInt)(w * take));
        }
    } else {
        for (uint64_t j = 0; j < FP_BLOCKS; j++) {
            uint64_t at = j * (n - FP_BLOCK) / (FP_BLOCKS - 1);
            pread_all(s->fd, buf, w * FP_BLOCK, (off_t)(1024 + w * at), s->path);
            crc = (uint32_t)crc32(crc, buf, (uInt)(w * FP_BLOCK));
        }
    }
    free(buf);
    return crc;
}

static char *fingerprint_of(const TokenSet *ts) {
    char *out = xmalloc((size_t)FP_SHARDS * 9 + 1);
    size_t w = 0;
    out[0] = 0;
    for (int i = 0; i < ts->nshards && i < FP_SHARDS; i++) {
        uint32_t crc = shard_fingerprint(&ts->shards[i], (uint32_t)crc32(0L, Z_NULL, 0));
        if (i == FP_SHARDS - 1)
            for (int j = i + 1; j < ts->nshards; j++) crc = shard_fingerprint(&ts->shards[j], crc);
        w += (size_t)sprintf(out + w, "%s%08x", i ? " " : "", crc);
    }
    return out;
}

const char *tokenset_fingerprint(const TokenSet *ts) { return ts->fingerprint; }

int tokenset_fingerprint_check(const TokenSet *ts, const char *fp, char *why, size_t cap) {
    if (!*fp) return 1;
    const char *a = ts->fingerprint, *b = fp;
    int na = *a ? 1 : 0, nb = 1;
    for (const char *p = a; *p; p++) na += *p == ' ';
    for (const char *p = b; *p; p++) nb += *p == ' ';
    if (na != nb)
        return snprintf(why, cap, "the training data holds %d shard(s) (the first %s), the checkpoint's held %d", ts->nshards,
                        ts->shards[0].path, nb), -1;
    for (int i = 0; i < na; i++, a += 9, b += 9)
        if (strncmp(a, b, 8) != 0) {
            if (i == FP_SHARDS - 1 && ts->nshards > FP_SHARDS)
                return snprintf(why, cap, "%s or one of the %d shards after it differs from the checkpoint's training data "
                                "(content fingerprint %.8s, the checkpoint's %.8s)", ts->shards[i].path,
                                ts->nshards - FP_SHARDS, a, b), -1;
            return snprintf(why, cap, "%s differs from the shard the checkpoint was trained on (content fingerprint %.8s, "
                            "the checkpoint's %.8s)", ts->shards[i].path, a, b), -1;
        }
    return 0;
}

void tokenset_open(TokenSet *ts, const char *pattern, const char *flag, int vocab, int T, int shuffle, uint64_t seed) {
    memset(ts, 0, sizeof *ts);
    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g); // glob sorts its matches
    if (rc == GLOB_NOMATCH) die("%s: no file matches %s", flag, pattern);
    if (rc != 0) die("%s: cannot expand %s", flag, pattern);
    ts->nshards = (int)g.gl_pathc;
    ts->shards = xcalloc(g.gl_pathc, sizeof(Shard));
    for (size_t i = 0; i < g.gl_pathc; i++) {
        shard_open(&ts->shards[i], g.gl_pathv[i]);
        shard_validate(&ts->shards[i], vocab);
        ts->shards[i].first = ts->ntokens;
        ts->ntokens += ts->shards[i].ntokens;
    }
    globfree(&g);
    ts->vocab = vocab;
    ts->T = T;
    if (ts->ntokens < (uint64_t)T + 1)
        die("%s: %s holds %llu tokens, fewer than one sequence of %d + 1", flag, pattern,
            (unsigned long long)ts->ntokens, T);
    ts->windows = (ts->ntokens - 1) / (uint64_t)T;
    if (shuffle && ts->windows > UINT32_MAX) die("%s: too many windows to shuffle", flag);
    ts->shuffle = shuffle;
    ts->seed = seed;
    ts->perm_epoch = UINT64_MAX;
    ts->fingerprint = fingerprint_of(ts);
}

void tokenset_close(TokenSet *ts) {
    for (int i = 0; i < ts->nshards; i++) {
        close(ts->shards[i].fd);
        free(ts->shards[i].path);
    }
    free(ts->shards);
    free(ts->perm);
    free(ts->fingerprint);
    memset(ts, 0, sizeof *ts);
}

void tokenset_read(const TokenSet *ts, uint64_t pos, size_t n, uint32_t *out) {
    size_t done = 0;
    for (int i = 0; i < ts->nshards && done < n; i++) {
        const Shard *s = &ts->shards[i];
        uint64_t p = pos + done;
        if (p >= s->first + s->ntokens) continue;
        uint64_t local = p - s->first;
        size_t take = n - done;
        if (local + take > s->ntokens) take = (size_t)(s->ntokens - local);
        shard_tokens(s, local, take, out + done);
        for (size_t j = 0; j < take; j++)
            if (out[done + j] >= (uint32_t)ts->vocab)
                die("%s: token %u at position %llu is not below the vocabulary size %d", s->path, out[done + j],
                    (unsigned long long)(local + j), ts->vocab);
        done += take;
    }
    if (done != n) die("internal: read past the end of the token set");
}

uint64_t tokenset_window(TokenSet *ts, uint64_t g) {
    uint64_t w = g % ts->windows;
    if (!ts->shuffle) return w;
    uint64_t epoch = g / ts->windows;
    if (epoch != ts->perm_epoch) {
        // Fisher-Yates with a generator keyed by (seed, epoch): the same for every layout and rank
        if (!ts->perm) ts->perm = xmalloc(sizeof(uint32_t) * ts->windows);
        for (uint64_t i = 0; i < ts->windows; i++) ts->perm[i] = (uint32_t)i;
        uint64_t key = mix64(mix64(ts->seed) ^ (epoch + 1));
        for (uint64_t i = ts->windows - 1; i > 0; i--) {
            uint64_t j = mix64(key ^ i) % (i + 1);
            uint32_t tmp = ts->perm[i];
            ts->perm[i] = ts->perm[j];
            ts->perm[j] = tmp;
        }
        ts->perm_epoch = epoch;
    }
    return ts->perm[w];
}

void tokenset_sequence(TokenSet *ts, uint64_t g, int32_t *inputs, int32_t *targets) {
    int T = ts->T;
    uint32_t *buf = xmalloc(sizeof(uint32_t) * (T + 1));
    tokenset_read(ts, tokenset_window(ts, g) * (uint64_t)T, (size_t)T + 1, buf);
    for (int t = 0; t < T; t++) { // below the vocabulary (checked), so they fit int32
        inputs[t] = (int32_t)buf[t];
        targets[t] = (int32_t)buf[t + 1];
    }
    free(buf);
}

static void shard_write_as(const char *path, int magic, int version, const void *tokens, size_t n, size_t tok_bytes) {
    if (n > INT32_MAX) die("%s: %zu tokens do not fit one shard (at most %d)", path, n, INT32_MAX);
    int32_t h[256] = { 0 };
    h[0] = magic;
    h[1] = version;
    h[2] = (int32_t)n;
    SafeFile sf;
    safe_open_or_die(&sf, path);
    safe_write_or_die(&sf, h, sizeof h);
    safe_write_or_die(&sf, tokens, tok_bytes * n);
    safe_commit_or_die(&sf);
}
void shard_write(const char *path, const uint16_t *tokens, size_t n) {
    shard_write_as(path, SHARD_MAGIC, SHARD_VERSION, tokens, n, 2);
}
void shard_write_u32(const char *path, const uint32_t *tokens, size_t n) {
    shard_write_as(path, SHARD_MAGIC_U32, SHARD_VERSION_U32, tokens, n, 4);
}

int shard_begin(SafeFile *sf, const char *path, size_t n) {
    if (n > INT32_MAX) {
        memset(sf, 0, sizeof *sf);
        snprintf(sf->err, sizeof sf->err, "%s: %zu tokens do not fit one shard (at most %d)", path, n, INT32_MAX);
        return -1;
    }
    int32_t h[256] = { 0 };
    h[0] = SHARD_MAGIC;
    h[1] = SHARD_VERSION;
    h[2] = (int32_t)n;
    if (safe_open(sf, path) != 0) return -1;
    return safe_write(sf, h, sizeof h);
}

// ---------------------------------------------------------------------------------------------
// tokenizer files: 256 int32 header (magic, version 2, vocab, end-of-text id), then per token a
// uint8 length and its bytes.

int tokenizer_write(const char *path, int vocab, int eot, const uint8_t *const *pieces, const int *lengths, char *err,
                    size_t cap) {
    int32_t h[256] = { 0 };
    h[0] = TOKENIZER_MAGIC;
    h[1] = 2;
    h[2] = vocab;
    h[3] = eot;
    SafeFile sf;
    int ok = safe_open(&sf, path) == 0 && safe_write(&sf, h, sizeof h) == 0;
    for (int i = 0; i < vocab && ok; i++) {
        if (lengths[i] < 0 || lengths[i] > 255) die("internal: token %d of %s has %d bytes (at most 255)", i, path, lengths[i]);
        unsigned char len = (unsigned char)lengths[i];
        ok = safe_write(&sf, &len, 1) == 0 && safe_write(&sf, pieces[i], len) == 0;
    }
    if (ok && safe_commit(&sf) == 0) return 0;
    snprintf(err, cap, "%s", sf.err);
    return -1;
}

void tokenizer_write_bytes(const char *path) {
    uint8_t bytes[256];
    const uint8_t *pieces[256];
    int lengths[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, pieces[i] = &bytes[i], lengths[i] = 1;
    char err[2 * SAFE_PATH_MAX + 256];
    // byte-level text never contains NUL, so byte 0 serves as the end-of-text id
    if (tokenizer_write(path, 256, 0, pieces, lengths, err, sizeof err) != 0) die("%s", err);
}

void tokenizer_load(Tokenizer *tk, const char *path) {
    FILE *f = xfopen(path, "rb");
    int32_t h[256];
    xfread(h, sizeof(int32_t), 256, f, path);
    if (h[0] != TOKENIZER_MAGIC) die("%s: bad magic %d (expected %d for an llm.c tokenizer)", path, h[0], TOKENIZER_MAGIC);
    if (h[1] != 1 && h[1] != 2) die("%s: unsupported tokenizer version %d", path, h[1]);
    if (h[2] <= 0 || h[2] > 1 << 20) die("%s: bad vocabulary size %d", path, h[2]);
    tk->vocab = h[2];
    tk->eot = h[1] == 2 ? h[3] : -1;
    if (tk->eot < -1 || tk->eot >= tk->vocab) // -1: none recorded
        die("%s: the end-of-text id %d is not a token of its vocabulary of %d", path, tk->eot, tk->vocab);
    tk->pieces = xcalloc((size_t)tk->vocab, sizeof(char *));
    tk->lengths = xcalloc((size_t)tk->vocab, sizeof(int));
    for (int i = 0; i < tk->vocab; i++) {
        unsigned char len;
        xfread(&len, 1, 1, f, path);
        tk->pieces[i] = xmalloc((size_t)len + 1);
        xfread(tk->pieces[i], 1, len, f, path);
        tk->pieces[i][len] = 0;
        tk->lengths[i] = len;
    }
    fclose(f);
}

void tokenizer_free(Tokenizer *tk) {
    for (int i = 0; i < tk->vocab; i++) free(tk->pieces[i]);
    free(tk->pieces);
    free(tk->lengths);
    memset(tk, 0, sizeof *tk);
}

int tokenizer_encode(const Tokenizer *tk, const char *text, int *out, int cap) {
    size_t len = strlen(text), pos = 0;
    int n = 0;
    while (pos < len && n < cap) {
        int best = -1, best_len = 0;
        for (int i = 0; i < tk->vocab; i++) // a linear scan: prompts are short
            if (tk->lengths[i] > best_len && (size_t)tk->lengths[i] <= len - pos &&
                !memcmp(tk->pieces[i], text + pos, (size_t)tk->lengths[i]))
                best = i, best_len = tk->lengths[i];
        if (best < 0) return -(int)pos - 1;
        out[n++] = best;
        pos += (size_t)best_len;
    }
    return n;
}

// Length of the well-formed UTF-8 sequence starting s[0] (Unicode's table 3-7: no overlongs, surrogates
// or code points above U+10FFFF), 0 when the bytes present already rule one out, -1 when they are a
// valid start that needs more than n bytes.
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xbf; // the second byte's range
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 0;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xbf)) return 0;
    }
    return len;
}

static void escape_byte(unsigned char c, FILE *f) { fprintf(f, "\\x%02x", c); }

void text_out(TextOut *t, const void *bytes, size_t n, FILE *f) {
    unsigned char buf[4 + 256];
    const unsigned char *in = bytes;
    while (n > 0 || t->npend > 0) {
        // the pending start of a character, then as much of the input as fits
        size_t m = (size_t)t->npend, take = n < sizeof buf - m ? n : sizeof buf - m;
        memcpy(buf, t->pend, m);
        memcpy(buf + m, in, take);
        in += take, n -= take, m += take;
        t->npend = 0;
        size_t i = 0;
        while (i < m) {
            int len = utf8_seq(buf + i, m - i);
            if (len < 0) {
                if (n == 0) { // wait for the next token's bytes
                    t->npend = (int)(m - i);
                    memcpy(t->pend, buf + i, m - i);
                    return;
                }
                break; // more input first: refill behind these bytes
            }
            if (len == 0 || (len == 1 && ((buf[i] < 32 && buf[i] != '\n') || buf[i] == 127))) {
                escape_byte(buf[i], f);
                i++;
            } else {
                fwrite(buf + i, 1, (size_t)len, f);
                i += (size_t)len;
            }
        }
        if (i < m) { // an incomplete character at the end of the buffer: carry it into the next round
            t->npend = (int)(m - i);
            memcpy(t->pend, buf + i, m - i);
        }
        if (n == 0 && t->npend == 0) return;
    }
}

void text_out_token(TextOut *t, const Tokenizer *tk, int token, FILE *f) {
    if (token < 0 || token >= tk->vocab) {
        text_out_flush(t, f);
        fprintf(f, "<%d>", token);
        return;
    }
    text_out(t, tk->pieces[token], (size_t)tk->lengths[token], f);
}

void text_out_flush(TextOut *t, FILE *f) {
    for (int i = 0; i < t->npend; i++) escape_byte(t->pend[i], f);
    t->npend = 0;
}

// prepare.c: `./train prepare [OPTIONS] INPUT... DIR`: text files, directories, globs, JSON Lines or
// standard input to llm.c token shards and tokenizer file, byte-level, with GPT-2's BPE, or with a BPE
// learned on the input (tokenizer.c).
//
// Streaming: the input is read in chunks of about 1 MiB, cut only where GPT-2's pattern is known to cut
// (so a chunk's pieces are the whole text's), encoded by --threads threads a batch at a time and
// written in input order: the tokens are the same bytes for any --threads. They go to one temporary
// file first (the split into validation and training tokens needs their number), which is then copied
// into the shards; every output stays a temporary until all of them are written, and any failure
// (a bad input line found half-way, a full disk) removes them all.
#define _GNU_SOURCE
#include "prepare.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "data.h"
#include "tokenizer.h"

static const char USAGE[] =
    "usage: ./train prepare [OPTIONS] INPUT... DIR\n"
    "Writes llm.c token shards (header 20240520, uint16 tokens) and DIR/tokenizer.bin (llm.c's tokenizer file,\n"
    "version 2 with the end-of-text id) from text. INPUT: a text file, a directory (its files, recursively, in\n"
    "name order; names starting with '.' left out), a glob pattern, or - for standard input. Each file (each\n"
    "JSON Lines record) is one document; with a BPE tokenizer every document starts with <|endoftext|>.\n"
    "  --tokenizer byte|gpt2|bpe:N  byte: V = 256, token i is byte i (the default);\n"
    "                             gpt2: GPT-2's BPE from --bpe-encoder and --bpe-merges (V = 50257);\n"
    "                             bpe:N: learn a byte-level BPE of N tokens (257-65535) on the input, written\n"
    "                             as DIR/encoder.json and DIR/vocab.bpe (GPT-2's form) too;\n"
    "                             FILE: the byte-level BPE of an llm.c tokenizer file (GPT-2's, or one bpe:N\n"
    "                             wrote; its merges are recovered from the ids), to tokenize more text as the\n"
    "                             model's own was\n"
    "  --bpe-encoder FILE         GPT-2's encoder.json (token -> id)\n"
    "  --bpe-merges FILE          GPT-2's vocab.bpe (the ranked merges)\n"
    "  --text-field NAME          the inputs are JSON Lines: each line an object whose string field NAME is\n"
    "                             a document\n"
    "  --skip-bad-lines           skip a JSON Lines line that is not an object with the field (a warning\n"
    "                             each) instead of stopping\n"
    "  --val-tokens N             the first N tokens are the validation split (llm.c's convention)\n"
    "  --val-frac F               the last fraction F of the tokens are the validation split (default 0.1)\n"
    "  --shard-tokens N           at most N tokens a shard (llm.c writes 100M), named DIR/NAME_val_000000.bin,\n"
    "                             DIR/NAME_train_000001.bin, ... in token order (default: DIR/train.bin and\n"
    "                             DIR/val.bin)\n"
    "  --name NAME                the shards' name with --shard-tokens (default data)\n"
    "  --threads N                encoding threads (default: the CPUs online); the output is the same for any N\n"
    "A progress line (MB read, MB/s, tokens, ETA) is shown when standard error is a terminal.\n";

typedef enum { TK_BYTE, TK_GPT2, TK_BPE, TK_FILE } TkKind;

typedef struct {
    TkKind kind;
    int bpe_vocab;
    const char *encoder, *merges, *text_field, *name, *dir;
    const char *tokenizer_file; // --tokenizer FILE
    int skip_bad, threads, have_val_tokens;
    uint64_t val_tokens, shard_tokens;
    double val_frac;
    char **inputs; // expanded: file paths, "-" for standard input
    int ninputs, cinputs, has_stdin;
    uint64_t input_bytes; // of the files (standard input's size is not known)
} Prep;

// What a failure must remove: die() exits the process, so an atexit hook is the only way back to it;
// this one pointer is that hook's state.
typedef struct {
    SafeFile tokens; // the token stream's temporary (never committed)
    SafeFile *files; // the outputs, written and not yet committed
    int nfiles;
    char dir[SAFE_PATH_MAX];
    int made_dir;
} Outputs;
static Outputs *pending;

static void remove_pending(void) {
    if (!pending) return;
    safe_abort(&pending->tokens);
    for (int i = 0; i < pending->nfiles; i++) safe_abort(&pending->files[i]);
    if (pending->made_dir) rmdir(pending->dir);
    pending = NULL;
}

// ---------------------------------------------------------------------------------------------
// options and inputs

static uint64_t parse_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-' || x < lo || x > hi)
        die("prepare: %s %s: expected an integer from %llu to %llu", flag, v, (unsigned long long)lo, (unsigned long long)hi);
    return x;
}

static void add_input(Prep *p, const char *path) {
    if (p->ninputs == p->cinputs) {
        p->cinputs = p->cinputs ? 2 * p->cinputs : 16;
        char **n = realloc(p->inputs, sizeof(char *) * (size_t)p->cinputs);
        if (!n) die("out of memory");
        p->inputs = n;
    }
    p->inputs[p->ninputs] = strdup(path);
    if (!p->inputs[p->ninputs]) die("out of memory");
    p->ninputs++;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void add_path(Prep *p, const char *path, int top);

static void add_dir(Prep *p, const char *path) {
    DIR *d = opendir(path);
    if (!d) die("prepare: cannot read the directory %s: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, c = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == c) {
            c = c ? 2 * c : 64;
            char **nn = realloc(names, sizeof(char *) * c);
            if (!nn) die("out of memory");
            names = nn;
        }
        size_t l = strlen(path) + strlen(e->d_name) + 2;
        names[n] = xmalloc(l);
        snprintf(names[n], l, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof(char *), name_cmp);
    for (size_t i = 0; i < n; i++) {
        add_path(p, names[i], 0);
        free(names[i]);
    }
    free(names);
}

static void add_path(Prep *p, const char *path, int top) {
    struct stat st;
    if (stat(path, &st) != 0) die("prepare: cannot open %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        int before = p->ninputs;
        add_dir(p, path);
        if (top && p->ninputs == before) die("prepare: %s is a directory, not a regular file, and has no files in it", path);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        if (top) die("prepare: %s is a special file, not a regular file of text", path);
        return; // sockets and FIFOs inside a directory are not text
    }
    if (st.st_size == 0) die("prepare: %s is empty", path);
    if (access(path, R_OK) != 0) die("prepare: cannot open %s: %s", path, strerror(errno));
    p->input_bytes += (uint64_t)st.st_size;
    add_input(p, path);
}

static void expand_input(Prep *p, const char *arg) {
    if (!strcmp(arg, "-")) {
        if (p->has_stdin) die("prepare: - (standard input) is given twice");
        p->has_stdin = 1;
        add_input(p, arg);
        return;
    }
    struct stat st;
    if (stat(arg, &st) == 0 || !strpbrk(arg, "*?[")) {
        add_path(p, arg, 1);
        return;
    }
    glob_t g;
    int rc = glob(arg, GLOB_ERR, NULL, &g); // sorted
    if (rc == GLOB_NOMATCH) die("prepare: no file matches %s", arg);
    if (rc != 0) die("prepare: cannot expand %s", arg);
    for (size_t i = 0; i < g.gl_pathc; i++) add_path(p, g.gl_pathv[i], 1);
    globfree(&g);
}

static void parse(Prep *p, int argc, char **argv) {
    memset(p, 0, sizeof *p);
    p->kind = TK_BYTE;
    p->val_frac = 0.1;
    p->name = "data";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    p->threads = ncpu > 0 ? (int)ncpu : 1;
    int have_frac = 0;
    const char **pos = xmalloc(sizeof(char *) * (size_t)(argc + 1));
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            pos[npos++] = a;
            continue;
        }
        if (!strcmp(a, "--skip-bad-lines")) {
            p->skip_bad = 1;
            continue;
        }
        static const char *const with_value[] = { "--tokenizer", "--bpe-encoder", "--bpe-merges", "--text-field", "--val-tokens",
                                                  "--val-frac", "--shard-tokens", "--name", "--threads" };
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(a, with_value[k]);
        if (!known) die("prepare: unknown option %s (./train prepare --help lists them)", a);
        if (i + 1 >= argc) die("prepare: %s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--tokenizer")) {
            if (!strcmp(v, "byte")) p->kind = TK_BYTE;
            else if (!strcmp(v, "gpt2")) p->kind = TK_GPT2;
            else if (!strncmp(v, "bpe:", 4)) {
                char *end;
                errno = 0;
                long n = strtol(v + 4, &end, 10);
                if (!v[4] || *end || errno) die("prepare: --tokenizer %s: expected bpe:N with N a number of tokens", v);
                if (n > 65535) die("prepare: --tokenizer %s: at most 65535 tokens (ids are stored as uint16)", v);
                if (n < 257) die("prepare: --tokenizer %s: at least 257 tokens (the 256 bytes and <|endoftext|>)", v);
                p->kind = TK_BPE;
                p->bpe_vocab = (int)n;
            } else if (access(v, F_OK) == 0) {
                p->kind = TK_FILE;
                p->tokenizer_file = v;
            } else die("prepare: --tokenizer %s: expected byte, gpt2, bpe:N or an llm.c tokenizer file (no such file)", v);
        } else if (!strcmp(a, "--bpe-encoder")) p->encoder = v;
        else if (!strcmp(a, "--bpe-merges")) p->merges = v;
        else if (!strcmp(a, "--text-field")) {
            if (!*v) die("prepare: --text-field needs a field name");
            p->text_field = v;
        } else if (!strcmp(a, "--val-tokens")) p->val_tokens = parse_u64(a, v, 1, UINT64_MAX / 2), p->have_val_tokens = 1;
        else if (!strcmp(a, "--val-frac")) {
            char *end;
            errno = 0;
            double f = strtod(v, &end);
            if (!*v || *end || errno || !(f > 0 && f < 1)) die("prepare: --val-frac %s: expected a fraction between 0 and 1", v);
            p->val_frac = f;
            have_frac = 1;
        } else if (!strcmp(a, "--shard-tokens")) p->shard_tokens = parse_u64(a, v, 1, INT32_MAX);
        else if (!strcmp(a, "--name")) {
            if (!*v || strchr(v, '/')) die("prepare: --name %s: expected a file name prefix without '/'", v);
            p->name = v;
        } else if (!strcmp(a, "--threads")) p->threads = (int)parse_u64(a, v, 1, 1024);
    }
    if (have_frac && p->have_val_tokens) die("prepare: --val-tokens and --val-frac both choose the validation split; give one");
    if (npos < 2) die("prepare: expected INPUT... DIR (./train prepare --help)");
    if (p->kind == TK_GPT2 && (!p->encoder || !p->merges))
        die("prepare: --tokenizer gpt2 needs --bpe-encoder encoder.json and --bpe-merges vocab.bpe (GPT-2's two files)");
    if (p->kind != TK_GPT2 && (p->encoder || p->merges))
        die("prepare: %s is for --tokenizer gpt2", p->encoder ? "--bpe-encoder" : "--bpe-merges");
    p->dir = pos[npos - 1];
    for (int i = 0; i < npos - 1; i++) expand_input(p, pos[i]);
    if (p->kind == TK_BPE && p->has_stdin)
        die("prepare: --tokenizer bpe:N reads the input twice (to learn, then to encode): give files, not - (standard input)");
    free(pos);
}

// ---------------------------------------------------------------------------------------------
// the pipeline: documents -> segments -> chunks -> batches encoded in parallel -> the token stream

enum { CHUNK = 1 << 20 };

typedef struct {
    size_t off, len;
    int doc; // the first segment of a document (gets the end-of-text token before it)
} Seg;

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    Seg *seg;
    int nseg, cseg;
    uint16_t *ids;
    size_t nids, cids;
} Chunk;

typedef struct {
    const Prep *p;
    const Bpe *bpe;      // NULL: byte-level
    BpeEncoder **enc;    // one per thread
    BpeCounter **count;  // one per thread while learning a BPE
    int counting;
    Chunk *chunks;
    int nchunks, batch;
    uint8_t *pend; // the current document's bytes not yet in a chunk
    size_t plen, pcap, nosplit; // no safe cut before pend[nosplit]
    int pend_doc;
    Outputs *out;
    uint64_t tokens, bytes_read;
    double t0, shown;
    int tty, printed;
    const char *pass;
} Pipe;

static void progress(Pipe *P, int last) {
    if (!P->tty) return;
    double t = now_seconds();
    if (!last && t - P->shown < 0.5) return;
    P->shown = t;
    double el = t - P->t0, mb = P->bytes_read / 1e6, rate = el > 0 ? mb / el : 0;
    char eta[32] = "";
    if (!P->p->has_stdin && rate > 0 && P->p->input_bytes) {
        double left = (P->p->input_bytes / 1e6 - mb) / rate;
        snprintf(eta, sizeof eta, ", ETA %.0f s", left > 0 ? left : 0);
    }
    fprintf(stderr, "\rprepare (%s): %.1f MB read, %.1f MB/s, %llu tokens%s   ", P->pass, mb, rate, (unsigned long long)P->tokens, eta);
    if (last) fputc('\n', stderr);
    P->printed = 1;
}

static void ids_push(Chunk *c, uint16_t id) {
    if (c->nids == c->cids) {
        c->cids = c->cids ? 2 * c->cids : 1 << 16;
        uint16_t *n = realloc(c->ids, sizeof(uint16_t) * c->cids);
        if (!n) die("out of memory");
        c->ids = n;
    }
    c->ids[c->nids++] = id;
}

static void encode_chunk(Pipe *P, Chunk *c, int th) {
    c->nids = 0;
    for (int s = 0; s < c->nseg; s++) {
        const uint8_t *b = c->buf + c->seg[s].off;
        size_t n = c->seg[s].len;
        if (P->counting) {
            bpe_count(P->count[th], P->enc[th], b, n);
            continue;
        }
        if (!P->bpe) { // byte-level: no separator (V = 256 has no spare id), token i is byte i
            for (size_t i = 0; i < n; i++) ids_push(c, b[i]);
            continue;
        }
        if (c->seg[s].doc) ids_push(c, (uint16_t)bpe_eot(P->bpe));
        bpe_encode(P->enc[th], b, n, &c->ids, &c->nids, &c->cids);
    }
}

static void run_batch(Pipe *P) {
    int n = P->nchunks;
    if (!n) return;
#pragma omp parallel for num_threads(P->p->threads) schedule(dynamic, 1)
    for (int i = 0; i < n; i++) encode_chunk(P, &P->chunks[i], omp_get_thread_num());
    for (int i = 0; i < n; i++) {
        Chunk *c = &P->chunks[i];
        if (!P->counting) safe_write_or_die(&P->out->tokens, c->ids, sizeof(uint16_t) * c->nids);
        P->tokens += c->nids;
        c->len = 0;
        c->nseg = 0;
    }
    P->nchunks = 0;
    progress(P, 0);
}

static void emit_seg(Pipe *P, const uint8_t *b, size_t n, int doc) {
    Chunk *c = &P->chunks[P->nchunks];
    if (c->len + n > c->cap) {
        c->cap = c->len + n > CHUNK + CHUNK / 2 ? c->len + n : CHUNK + CHUNK / 2;
        uint8_t *nb = realloc(c->buf, c->cap);
        if (!nb) die("out of memory (a piece of text of %zu bytes)", c->len + n);
        c->buf = nb;
    }
    if (c->nseg == c->cseg) {
        c->cseg = c->cseg ? 2 * c->cseg : 64;
        Seg *ns = realloc(c->seg, sizeof(Seg) * (size_t)c->cseg);
        if (!ns) die("out of memory");
        c->seg = ns;
    }
    memcpy(c->buf + c->len, b, n);
    c->seg[c->nseg++] = (Seg){ c->len, n, doc };
    c->len += n;
    if (c->len >= CHUNK && ++P->nchunks == P->batch) run_batch(P);
}

static inline int ascii_alnum(uint8_t c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'); }
static inline int ascii_graph(uint8_t c) { return c > 0x20 && c < 0x7f; }

// A cut at s where GPT-2's pattern cuts whatever follows: between an ASCII letter or digit and a space
// followed by one (the letter/number piece ends at the space, " word" starts there), or after a lone
// "\n" between printable ASCII characters ("\n" is a piece of its own, at the end of a chunk too).
static inline int cut_at(const uint8_t *b, size_t s) {
    return (b[s] == ' ' && ascii_alnum(b[s - 1]) && ascii_alnum(b[s + 1])) ||
           (b[s - 1] == '\n' && ascii_graph(b[s - 2]) && ascii_graph(b[s]));
}

// The document's pending bytes go out in segments of about CHUNK bytes, each ending at a cut.
static void doc_feed(Pipe *P, const uint8_t *b, size_t n) {
    if (P->plen + n > P->pcap) {
        while (P->plen + n > P->pcap) P->pcap = P->pcap ? 2 * P->pcap : 2 * CHUNK;
        uint8_t *np = realloc(P->pend, P->pcap);
        if (!np) die("out of memory (a piece of text of %zu bytes)", P->plen + n);
        P->pend = np;
    }
    memcpy(P->pend + P->plen, b, n);
    P->plen += n;
    while (P->plen >= CHUNK + 2) {
        // cuts at s in [2, plen - 2]: the last one up to CHUNK, else the first one after it; positions
        // up to P->nosplit are known to have none
        size_t s = 0, lo = P->nosplit > 2 ? P->nosplit : 2;
        for (size_t t = CHUNK; t >= lo && t > 1; t--)
            if (cut_at(P->pend, t)) { s = t; break; }
        if (!s)
            for (size_t t = CHUNK + 1 > lo ? CHUNK + 1 : lo; t + 2 <= P->plen; t++)
                if (cut_at(P->pend, t)) { s = t; break; }
        if (!s) { // no cut yet (a very long word or run of symbols): wait for more text
            P->nosplit = P->plen - 2;
            return;
        }
        emit_seg(P, P->pend, s, P->pend_doc);
        P->pend_doc = 0;
        memmove(P->pend, P->pend + s, P->plen - s);
        P->plen -= s;
        P->nosplit = 0;
    }
}

static void doc_begin(Pipe *P) {
    P->plen = 0;
    P->nosplit = 0;
    P->pend_doc = 1;
}

static void doc_end(Pipe *P) {
    if (P->plen || P->pend_doc) emit_seg(P, P->pend, P->plen, P->pend_doc);
    P->plen = 0;
    P->pend_doc = 0;
}

static void bad_line(const Pipe *P, const char *path, long line, const char *why, long *skipped) {
    if (!P->p->skip_bad) die("prepare: %s:%ld: %s (--skip-bad-lines goes on without it)", path, line, why);
    if (!P->counting) {
        if (*skipped < 10) warn("prepare: %s:%ld: %s: skipped", path, line, why);
        else if (*skipped == 10) warn("prepare: more bad lines: skipped without a warning each");
    }
    (*skipped)++;
}

static void read_jsonl(Pipe *P, FILE *f, const char *path, long *skipped) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    const char *field = P->p->text_field;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        P->bytes_read += (uint64_t)len;
        size_t l = (size_t)len;
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) l--;
        size_t k = 0;
        while (k < l && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == l) continue; // blank lines separate nothing
        json_error_t je;
        json_t *o = json_loadb(line, l, JSON_ALLOW_NUL, &je);
        char why[256 + 64];
        if (!o) {
            snprintf(why, sizeof why, "not JSON (column %d: %s)", je.column, je.text);
            bad_line(P, path, lineno, why, skipped);
            continue;
        }
        json_t *v = json_is_object(o) ? json_object_get(o, field) : NULL;
        if (!json_is_object(o)) bad_line(P, path, lineno, "not a JSON object", skipped);
        else if (!v) snprintf(why, sizeof why, "no field \"%s\"", field), bad_line(P, path, lineno, why, skipped);
        else if (!json_is_string(v)) snprintf(why, sizeof why, "field \"%s\" is not a string", field), bad_line(P, path, lineno, why, skipped);
        else {
            doc_begin(P);
            doc_feed(P, (const uint8_t *)json_string_value(v), json_string_length(v));
            doc_end(P);
        }
        json_decref(o);
    }
    if (ferror(f)) die("prepare: cannot read %s: %s", path, strerror(errno));
    free(line);
}

static void read_text(Pipe *P, int fd, const char *path) {
    uint8_t *buf = xmalloc(CHUNK);
    uint64_t total = 0;
    doc_begin(P);
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("prepare: cannot read %s: %s", path, strerror(errno));
        }
        if (r == 0) break;
        total += (uint64_t)r;
        P->bytes_read += (uint64_t)r;
        doc_feed(P, buf, (size_t)r);
    }
    if (!total) die("prepare: %s is empty", path);
    doc_end(P);
    free(buf);
}

static void read_inputs(Pipe *P) {
    long skipped = 0;
    for (int i = 0; i < P->p->ninputs; i++) {
        const char *path = P->p->inputs[i];
        int is_stdin = !strcmp(path, "-");
        const char *name = is_stdin ? "standard input" : path;
        int fd = is_stdin ? 0 : open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) die("prepare: cannot open %s: %s", path, strerror(errno));
        if (P->p->text_field) {
            FILE *f = fdopen(fd, "rb");
            if (!f) die("prepare: cannot read %s: %s", name, strerror(errno));
            read_jsonl(P, f, name, &skipped);
            if (!is_stdin) fclose(f);
        } else {
            read_text(P, fd, name);
            if (!is_stdin) close(fd);
        }
    }
    if (P->nchunks < P->batch && (P->chunks[P->nchunks].len || P->chunks[P->nchunks].nseg)) P->nchunks++;
    run_batch(P);
    if (skipped && !P->counting) warn("prepare: %ld bad line%s skipped (--skip-bad-lines)", skipped, skipped == 1 ? "" : "s");
}

// ---------------------------------------------------------------------------------------------
// outputs

// An output must be a safe place to write (safe_check) and none of the text inputs: prepare DIR DIR a
// second time, or prepare DIR/train.bin DIR, would read the earlier outputs as text and replace them.
static void check_output(const Prep *p, const char *path) {
    char target[SAFE_PATH_MAX], err[2 * SAFE_PATH_MAX + 256];
    if (safe_check("prepare:", path, target, sizeof target, err, sizeof err) < 0) die("%s", err);
    struct stat out, in;
    if (stat(path, &out) != 0) return;
    for (int i = 0; i < p->ninputs; i++)
        if (strcmp(p->inputs[i], "-") && stat(p->inputs[i], &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
            die("prepare: the input %s is %s, an output of this run: writing it would destroy that input (give the text "
                "files, or another output directory)", p->inputs[i], path);
}

static char *out_path(const char *dir, const char *name) {
    size_t l = strlen(dir) + strlen(name) + 2;
    char *s = xmalloc(l);
    snprintf(s, l, "%s/%s", dir, name);
    return s;
}

static void prepare_dir(const Prep *p, Outputs *o) {
    struct stat st;
    if (strlen(p->dir) + 64 >= sizeof o->dir) die("prepare: %s: path too long", p->dir);
    snprintf(o->dir, sizeof o->dir, "%s", p->dir);
    if (stat(p->dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) die("prepare: the output directory %s is a file", p->dir);
    } else if (errno == ENOENT) {
        char err[2 * SAFE_PATH_MAX + 256]; // its missing parents first: a new data directory, data/mine in a fresh checkout
        if (make_parents("prepare: output directory", p->dir, err, sizeof err) < 0) die("%s", err);
        if (mkdir(p->dir, 0755) != 0) die("prepare: cannot create the output directory %s: %s", p->dir, strerror(errno));
        o->made_dir = 1;
    } else {
        die("prepare: %s: %s", p->dir, strerror(errno));
    }
    char err[2 * SAFE_PATH_MAX + 256];
    if (ensure_dir("prepare: output directory", p->dir, err, sizeof err) < 0) die("%s", err);
    const char *fixed[5] = { "tokenizer.bin" };
    int nfixed = 1;
    if (p->kind == TK_BPE) fixed[nfixed++] = "encoder.json", fixed[nfixed++] = "vocab.bpe";
    if (!p->shard_tokens) fixed[nfixed++] = "train.bin", fixed[nfixed++] = "val.bin";
    for (int i = 0; i < nfixed; i++) {
        char *s = out_path(p->dir, fixed[i]);
        check_output(p, s);
        free(s);
    }
    if (p->shard_tokens) { // shards of an earlier run past this run's last would be read with it
        DIR *d = opendir(p->dir);
        if (!d) die("prepare: cannot read %s: %s", p->dir, strerror(errno));
        struct dirent *e;
        size_t nl = strlen(p->name);
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, p->name, nl) && (!strncmp(e->d_name + nl, "_train_", 7) || !strncmp(e->d_name + nl, "_val_", 5)))
                die("prepare: %s already holds %s from an earlier run: remove its %s_*.bin shards or choose another --name",
                    p->dir, e->d_name, p->name);
        closedir(d);
    }
}

typedef struct {
    char *path;
    uint64_t first, n;
    int val;
} ShardPlan;

static void write_outputs(const Prep *p, Pipe *P, const Bpe *bpe, uint64_t total) {
    Outputs *o = P->out;
    uint64_t nval = p->have_val_tokens ? p->val_tokens : (uint64_t)((double)total * p->val_frac);
    if (total < 20 || nval < 1 || nval >= total)
        die("prepare: the input gives %llu tokens, too few for a validation split of %llu and a training split (need at least 20 tokens)",
            (unsigned long long)total, (unsigned long long)nval);
    uint64_t val_first = p->have_val_tokens ? 0 : total - nval, ntrain = total - nval;
    uint64_t train_first = p->have_val_tokens ? nval : 0;
    // shards in token order
    ShardPlan *plan = xmalloc(sizeof(ShardPlan) * 2);
    int np = 0, cp = 2, index = 0;
    for (int part = 0; part < 2; part++) {
        int val = p->have_val_tokens ? part == 0 : part == 1;
        uint64_t first = val ? val_first : train_first, n = val ? nval : ntrain;
        uint64_t per = p->shard_tokens ? p->shard_tokens : n;
        for (uint64_t at = 0; at < n; at += per) {
            if (np == cp) {
                cp *= 2;
                ShardPlan *pl = realloc(plan, sizeof(ShardPlan) * (size_t)cp);
                if (!pl) die("out of memory");
                plan = pl;
            }
            char name[512];
            if (p->shard_tokens) snprintf(name, sizeof name, "%s_%s_%06d.bin", p->name, val ? "val" : "train", index++);
            else snprintf(name, sizeof name, "%s", val ? "val.bin" : "train.bin");
            plan[np++] = (ShardPlan){ out_path(p->dir, name), first + at, n - at < per ? n - at : per, val };
        }
    }
    if (fflush(o->tokens.f) != 0) die("prepare: cannot write %s: %s", o->tokens.tmp, strerror(errno));
    int fd = open(o->tokens.tmp, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("prepare: cannot read back %s: %s", o->tokens.tmp, strerror(errno));
    o->files = xcalloc((size_t)np + 3, sizeof(SafeFile));
    enum { BLOCK = 1 << 20 };
    uint16_t *buf = xmalloc(sizeof(uint16_t) * BLOCK);
    for (int i = 0; i < np; i++) {
        SafeFile *sf = &o->files[o->nfiles++];
        if (shard_begin(sf, plan[i].path, (size_t)plan[i].n) != 0) die("%s", sf->err);
        for (uint64_t at = 0; at < plan[i].n;) {
            size_t take = plan[i].n - at < BLOCK ? (size_t)(plan[i].n - at) : BLOCK;
            size_t got = 0;
            while (got < take * 2) {
                ssize_t r = pread(fd, (char *)buf + got, take * 2 - got, (off_t)(2 * (plan[i].first + at) + got));
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) die("prepare: cannot read back %s: %s", o->tokens.tmp, r < 0 ? strerror(errno) : "short file");
                got += (size_t)r;
            }
            safe_write_or_die(sf, buf, take * 2);
            at += take;
        }
    }
    free(buf);
    close(fd);
    // the small tokenizer files, then the shards' commits (renames) last: a failure before this point
    // leaves nothing (a tokenizer file that fails after another was written leaves that one)
    char err[2 * SAFE_PATH_MAX + 256];
    char *tk = out_path(p->dir, "tokenizer.bin");
    int rc = 0;
    if (!bpe) tokenizer_write_bytes(tk);
    else rc = bpe_write_llmc(bpe, tk, err, sizeof err);
    if (rc == 0 && p->kind == TK_BPE) {
        char *ej = out_path(p->dir, "encoder.json"), *vb = out_path(p->dir, "vocab.bpe");
        rc = bpe_write_gpt2(bpe, ej, vb, err, sizeof err);
        free(ej);
        free(vb);
    }
    if (rc) die("%s", err);
    for (int i = 0; i < o->nfiles; i++) safe_commit_or_die(&o->files[i]);
    int V = bpe ? bpe_vocab(bpe) : 256;
    int ntr = 0, nva = 0, ftr = -1, fva = -1;
    for (int i = 0; i < np; i++) {
        if (plan[i].val && !nva++) fva = i;
        if (!plan[i].val && !ntr++) ftr = i;
    }
    printf("prepared %d input%s (%.1f MB): %llu tokens (V = %d): %llu training tokens in %s%s, %llu validation tokens in %s%s, "
           "tokenizer in %s\n", p->ninputs, p->ninputs == 1 ? "" : "s", P->bytes_read / 1e6, (unsigned long long)total, V,
           (unsigned long long)ntrain, plan[ftr].path, ntr > 1 ? " and the shards after it" : "", (unsigned long long)nval,
           plan[fva].path, nva > 1 ? " and the shards after it" : "", tk);
    free(tk);
    for (int i = 0; i < np; i++) free(plan[i].path);
    free(plan);
}

int prepare_main(int argc, char **argv) {
    Prep p;
    parse(&p, argc, argv);
    Bpe *bpe = NULL;
    char err[1024];
    if (p.kind == TK_GPT2) {
        bpe = bpe_load_gpt2(p.encoder, p.merges, err, sizeof err);
        if (!bpe) die("prepare: %s", err);
        if (bpe_eot(bpe) < 0) die("prepare: --bpe-encoder %s has no <|endoftext|> token to start documents with", p.encoder);
    } else if (p.kind == TK_FILE) {
        Tokenizer tk;
        tokenizer_load(&tk, p.tokenizer_file);
        int bytes = tk.vocab == 256; // the byte tokenizer's file (token i is byte i): its documents have no eot
        for (int i = 0; i < tk.vocab && bytes; i++) bytes = tk.lengths[i] == 1 && (unsigned char)tk.pieces[i][0] == i;
        if (bytes) {
            p.kind = TK_BYTE;
        } else {
            bpe = bpe_from_tokenizer(&tk, err, sizeof err);
            if (!bpe) die("prepare: --tokenizer %s: %s", p.tokenizer_file, err);
            if (bpe_eot(bpe) < 0) die("prepare: --tokenizer %s records no end-of-text id to start documents with", p.tokenizer_file);
        }
        tokenizer_free(&tk);
    }
    Outputs out; // lives until exit: die() leaves this frame in place for remove_pending
    memset(&out, 0, sizeof out);
    prepare_dir(&p, &out);
    pending = &out;
    atexit(remove_pending);
    char *tokpath = out_path(p.dir, "tokens.bin");
    safe_open_or_die(&out.tokens, tokpath);
    free(tokpath);

    Pipe P = { 0 };
    P.p = &p;
    P.out = &out;
    P.batch = 4 * p.threads;
    P.chunks = xcalloc((size_t)P.batch, sizeof(Chunk));
    P.tty = isatty(2);
    P.enc = xcalloc((size_t)p.threads, sizeof(BpeEncoder *));
    if (p.kind == TK_BPE) { // learn: count the pre-token types, then merge
        Bpe *base = bpe_bytes();
        P.count = xcalloc((size_t)p.threads, sizeof(BpeCounter *));
        for (int t = 0; t < p.threads; t++) P.enc[t] = bpe_encoder_new(base), P.count[t] = bpe_counter_new();
        P.counting = 1;
        P.pass = "counting";
        P.t0 = P.shown = now_seconds();
        read_inputs(&P);
        if (P.printed) progress(&P, 1);
        for (int t = 1; t < p.threads; t++) bpe_counter_merge(P.count[0], P.count[t]);
        double t1 = now_seconds();
        bpe = bpe_train(P.count[0], p.bpe_vocab);
        double t2 = now_seconds();
        printf("learned %d merges in %.2f s: %zu distinct pre-tokens counted in %.2f s, merged in %.2f s (V = %d)\n",
               bpe_merges(bpe), t2 - P.t0, bpe_counter_types(P.count[0]), t1 - P.t0, t2 - t1, bpe_vocab(bpe));
        if (bpe_vocab(bpe) < p.bpe_vocab)
            warn("prepare: the input has pairs for only %d merges: the vocabulary is %d tokens, not %d", bpe_merges(bpe),
                 bpe_vocab(bpe), p.bpe_vocab);
        for (int t = 0; t < p.threads; t++) bpe_encoder_free(P.enc[t]), bpe_counter_free(P.count[t]);
        free(P.count);
        P.count = NULL;
        bpe_free(base);
        P.counting = 0;
        P.tokens = P.bytes_read = 0;
        P.printed = 0;
    }
    P.bpe = bpe;
    if (bpe)
        for (int t = 0; t < p.threads; t++) P.enc[t] = bpe_encoder_new(bpe);
    P.pass = "encoding";
    P.t0 = P.shown = now_seconds();
    read_inputs(&P);
    double secs = now_seconds() - P.t0;
    if (P.printed) progress(&P, 1);
    write_outputs(&p, &P, bpe, P.tokens);
    safe_abort(&out.tokens);
    pending = NULL;
    printf("encoded %.1f MB in %.2f s (%.1f MB/s, %d thread%s)\n", P.bytes_read / 1e6, secs, secs > 0 ? P.bytes_read / 1e6 / secs : 0,
           p.threads, p.threads == 1 ? "" : "s");
    for (int t = 0; t < p.threads; t++) bpe_encoder_free(P.enc[t]);
    free(P.enc);
    for (int i = 0; i < P.batch; i++) free(P.chunks[i].buf), free(P.chunks[i].seg), free(P.chunks[i].ids);
    free(P.chunks);
    free(P.pend);
    bpe_free(bpe);
    for (int i = 0; i < p.ninputs; i++) free(p.inputs[i]);
    free(p.inputs);
    free(out.files);
    return 0;
}

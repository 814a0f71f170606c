// safetensors.c: the safetensors framing, header and tensor entries (safetensors.h).
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

int st_read_file(const char *path, unsigned char **buf, size_t *len, size_t limit, char *why, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return snprintf(why, cap, "%s: %s", path, strerror(errno)), -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > limit) {
        close(fd);
        return snprintf(why, cap, "%s: not a regular file of at most %zu bytes", path, limit), -1;
    }
    *len = (size_t)st.st_size;
    *buf = xmalloc(*len + 1);
    size_t got = 0;
    while (got < *len) {
        ssize_t r = read(fd, *buf + got, *len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            free(*buf);
            return snprintf(why, cap, "%s: %s", path, strerror(e)), -1;
        }
        got += (size_t)r;
    }
    close(fd);
    (*buf)[*len] = 0;
    return 0;
}

typedef struct {
    json_int_t begin, end;
    const char *name;
} Span;
static int by_begin(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}
// No two tensors share a byte of the data (each tensor's own offsets st_tensor checks when it is read):
// one tensor's bytes read as another's is a damaged file, as the safetensors package says.
static int no_overlap(StFile *st, const char *file, char *why, size_t cap) {
    if (!json_is_object(st->header)) return 0; // st_tensor finds no tensor in it
    size_t n = 0, cap_n = json_object_size(st->header);
    Span *sp = xmalloc(sizeof(Span) * (cap_n ? cap_n : 1));
    const char *k;
    json_t *e;
    json_object_foreach(st->header, k, e) {
        json_t *off = json_object_get(e, "data_offsets");
        if (!strcmp(k, "__metadata__") || !json_is_array(off) || json_array_size(off) != 2) continue;
        json_t *a = json_array_get(off, 0), *b = json_array_get(off, 1);
        if (json_is_integer(a) && json_is_integer(b) && json_integer_value(b) > json_integer_value(a))
            sp[n++] = (Span){ json_integer_value(a), json_integer_value(b), k };
    }
    qsort(sp, n, sizeof(Span), by_begin);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (sp[i].begin < sp[i - 1].end)
            rc = -1, snprintf(why, cap, "%s: tensors %s and %s overlap in the data (data_offsets [%lld, %lld] and [%lld, %lld])", file,
                          sp[i - 1].name, sp[i].name, (long long)sp[i - 1].begin, (long long)sp[i - 1].end, (long long)sp[i].begin,
                          (long long)sp[i].end);
    free(sp);
    if (rc) st_free(st);
    return rc;
}

int st_parse(const char *file, const unsigned char *buf, size_t len, StFile *st, char *why, size_t cap) {
    memset(st, 0, sizeof *st);
    uint64_t hl;
    if (len < 8) return snprintf(why, cap, "%s: shorter than a safetensors header", file), -1;
    memcpy(&hl, buf, 8);
    if (hl > len - 8) return snprintf(why, cap, "%s: header length %llu past the end of the file", file, (unsigned long long)hl), -1;
    json_error_t jerr;
    // a name given twice would leave which tensor counts to the reader (the safetensors package refuses it)
    json_t *h = json_loadb((const char *)buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &jerr);
    if (!h) return snprintf(why, cap, "%s: malformed header: %s", file, jerr.text), -1;
    st->header = h;
    st->data = buf + 8 + hl;
    st->data_len = len - 8 - hl;
    return no_overlap(st, file, why, cap);
}

void st_free(StFile *st) {
    json_decref(st->header);
    memset(st, 0, sizeof *st);
}

static size_t dtype_bytes(const char *dt) {
    static const struct { const char *name; size_t bytes; } known[] = {
        { "F64", 8 }, { "F32", 4 }, { "F16", 2 }, { "BF16", 2 }, { "I64", 8 }, { "I32", 4 }, { "I16", 2 },
        { "I8", 1 }, { "U8", 1 }, { "BOOL", 1 },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(dt, known[i].name)) return known[i].bytes;
    return 0;
}

int st_tensor(const StFile *st, const char *file, const char *name, StTensor *t, char *why, size_t cap) {
    memset(t, 0, sizeof *t);
    json_t *e = json_object_get(st->header, name);
    if (!e) return 1;
    json_t *shape = json_object_get(e, "shape"), *off = json_object_get(e, "data_offsets");
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    if (!dt || strlen(dt) >= sizeof t->dtype || !json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS ||
        !json_is_array(off) || json_array_size(off) != 2)
        return snprintf(why, cap, "%s: malformed tensor %s (dtype, shape and data_offsets)", file, name), -1;
    snprintf(t->dtype, sizeof t->dtype, "%s", dt);
    t->elem = dtype_bytes(dt);
    t->ndim = (int)json_array_size(shape);
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(shape, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return snprintf(why, cap, "%s: malformed tensor %s (shape)", file, name), -1;
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] && t->numel > UINT64_MAX / 16 / (uint64_t)t->shape[i])
            return snprintf(why, cap, "%s: malformed tensor %s (shape too large)", file, name), -1;
        t->numel *= (uint64_t)t->shape[i];
    }
    json_t *a = json_array_get(off, 0), *b = json_array_get(off, 1);
    if (!json_is_integer(a) || !json_is_integer(b))
        return snprintf(why, cap, "%s: malformed tensor %s (data_offsets)", file, name), -1;
    json_int_t begin = json_integer_value(a), end = json_integer_value(b);
    if (begin < 0 || end < begin || (uint64_t)end > st->data_len)
        return snprintf(why, cap, "%s: tensor %s: data_offsets [%lld, %lld] outside the %llu data bytes (truncated?)", file,
                        name, (long long)begin, (long long)end, (unsigned long long)st->data_len), -1;
    if (t->elem && (uint64_t)(end - begin) != t->numel * t->elem)
        return snprintf(why, cap, "%s: tensor %s: %lld bytes for %llu elements of %s", file, name,
                        (long long)(end - begin), (unsigned long long)t->numel, dt), -1;
    t->p = st->data + begin;
    return 0;
}

char *st_header_text(json_t *h, size_t *len) {
    char *text = json_dumps(h, JSON_COMPACT);
    if (!text) die("out of memory");
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *out = xmalloc(padded + 1);
    memcpy(out, text, n);
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    free(text);
    *len = padded;
    return out;
}

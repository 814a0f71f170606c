// common.c: error reporting and checked system calls.
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

FILE *xfopen(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    return f;
}

void xfread(void *dst, size_t size, size_t n, FILE *f, const char *path) {
    if (fread(dst, size, n, f) != n) {
        if (ferror(f)) die("cannot read %s: %s", path, strerror(errno));
        die("%s is truncated (unexpected end of file)", path);
    }
}

void xfwrite(const void *src, size_t size, size_t n, FILE *f, const char *path) {
    if (fwrite(src, size, n, f) != n) die("cannot write %s: %s", path, strerror(errno));
}

void xfclose(FILE *f, const char *path) {
    if (fclose(f) != 0) die("cannot write %s: %s", path, strerror(errno));
}

FILE *atomic_open(const char *path, char *tmp_path, size_t tmp_cap) {
    int n = snprintf(tmp_path, tmp_cap, "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= tmp_cap) die("path too long: %s", path);
    return xfopen(tmp_path, "wb");
}

void atomic_commit(FILE *f, const char *tmp_path, const char *path) {
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        int e = errno;
        fclose(f);
        unlink(tmp_path);
        die("cannot write %s: %s", path, strerror(e));
    }
    if (fclose(f) != 0) {
        int e = errno;
        unlink(tmp_path);
        die("cannot write %s: %s", path, strerror(e));
    }
    if (rename(tmp_path, path) != 0) {
        int e = errno;
        unlink(tmp_path);
        die("cannot rename %s to %s: %s", tmp_path, path, strerror(e));
    }
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

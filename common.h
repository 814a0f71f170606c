// common.h: error reporting and checked system calls shared by every file.
#ifndef LLM4D_COMMON_H
#define LLM4D_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Prints "error: <message>" on one line to stderr and exits with status 1.
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void *xmalloc(size_t bytes);  // dies on failure
void *xcalloc(size_t n, size_t size);
FILE *xfopen(const char *path, const char *mode); // dies naming the file
void xfread(void *dst, size_t size, size_t n, FILE *f, const char *path); // dies on short read
void xfwrite(const void *src, size_t size, size_t n, FILE *f, const char *path);
void xfclose(FILE *f, const char *path); // checks buffered write errors too
// Writes a file atomically: data goes to PATH.tmp, is flushed and fsynced, then renamed over PATH,
// so a crash never leaves a half-written file under the final name.
FILE *atomic_open(const char *path, char *tmp_path, size_t tmp_cap);
void atomic_commit(FILE *f, const char *tmp_path, const char *path);
double now_seconds(void); // monotonic clock

// The splitmix64 finaliser: a counter-based hash behind initialisation, shuffling and communicator ids.
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}


#endif

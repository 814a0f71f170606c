// common.h: error reporting and checked system calls shared by every file (the bottom of every
// chain: it includes nothing of llm4d).
#ifndef LLM4D_COMMON_H
#define LLM4D_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Prints "error: <message>" on one line to stderr (one write, so that ranks sharing a terminal never
// interleave) and exits with status 1.
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
// "warning: <message>", one line, one write.
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// "error: <message>", one line, one write, without exiting (the launcher reporting on its ranks).
void error_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Ranks that share one stderr (under the --nproc launcher) print an error line that every rank
// detects alike (a bad flag value, shape or file) once: die() asks claim whether to print the line;
// on 0 another rank has printed it, and this one exits quietly with the same status. printed is
// called once the line is out.
typedef struct {
    int (*claim)(const char *line, void *ctx);
    void (*printed)(void *ctx);
    void *ctx;
} DieFilter;
void die_set_filter(const DieFilter *f); // NULL removes it
void *xmalloc(size_t bytes);  // dies on failure
void *xcalloc(size_t n, size_t size);
FILE *xfopen(const char *path, const char *mode); // dies naming the file
void xfread(void *dst, size_t size, size_t n, FILE *f, const char *path); // dies on short read
void xfclose(FILE *f, const char *path); // checks buffered write errors too

// The one safe-write path for every file the trainer writes (model files, token shards, checkpoint
// shards and manifests, test dumps). Data goes to PATH.tmp.PID in the same directory, is flushed and
// fsynced, renamed over PATH, and the directory is fsynced, so a crash never leaves a half-written file
// under the final name. Only a regular file is ever replaced: a directory, device node, FIFO or socket
// at PATH is refused; a symlink is written through (its target is replaced, the link stays). Every
// failure removes the temporary, and opening removes the stale temporaries of PATH (safe_clean_stale).
// Calls that return int give 0 on success and -1 with the reason (one line naming the file) in sf->err.
#define SAFE_PATH_MAX 4096
typedef struct {
    FILE *f;
    char path[SAFE_PATH_MAX];     // where the file lands: PATH, or the target of the symlink at PATH
    char tmp[SAFE_PATH_MAX + 32]; // the temporary, PATH.tmp.PID
    uint32_t crc;                 // zlib crc32 of the bytes written so far
    uint64_t bytes;
    char err[2 * SAFE_PATH_MAX + 256];
} SafeFile;
int safe_open(SafeFile *sf, const char *path);
int safe_write(SafeFile *sf, const void *data, size_t n);
int safe_commit(SafeFile *sf); // flush, fsync, rename, fsync the directory
void safe_abort(SafeFile *sf); // close and remove the temporary
// The same, dying with the one-line reason (the temporary removed first).
void safe_open_or_die(SafeFile *sf, const char *path);
void safe_write_or_die(SafeFile *sf, const void *data, size_t n);
void safe_commit_or_die(SafeFile *sf);
// Whether PATH can take a file through the safe-write path, checked before any work starts: an
// existing PATH must be a regular file or a symlink to one, its directory must exist and accept a new
// file (probed by creating and removing the temporary). Also removes stale temporaries of PATH (see
// safe_clean_stale). Returns 0 (target = PATH), 1 (PATH is a symlink; target = the file written), or -1
// with the reason in err, which names PATH after `what` (e.g. "--save-model").
int safe_check(const char *what, const char *path, char *target, size_t target_cap, char *err, size_t err_cap);
// Removes PATH.tmp.PID files left by processes that no longer run (kill -9 or a crash mid-write);
// returns how many. Temporaries of live processes are left alone.
int safe_clean_stale(const char *path);
// Creates the missing directories above dir (mkdir -p of its parents); -1 with err naming `what`.
int make_parents(const char *what, const char *dir, char *err, size_t err_cap);
// Makes directory DIR when missing (its parent must exist) and checks that it accepts new files.
int ensure_dir(const char *what, const char *dir, char *err, size_t err_cap);
// fsync of a directory, so that a rename or unlink inside it is durable.
int fsync_dir(const char *dir);
// The directory part of PATH ("." when it has none, "/" for a file in the root), in out.
void dir_of(const char *path, char *out, size_t cap);
double now_seconds(void); // monotonic clock

// Number parsing, the one parser of every flag (the trainer's, the planner's): a decimal number
// ([+-]digits[.digits][e[+-]digits]; no hex, octal, inf or nan), optionally followed by one of the
// units, checked whole and against [lo, hi]; every error is one line naming the flag (exit 1).
// Token and other counts: K, M, G = 2^10, 2^20, 2^30 (TOKEN_UNITS, what parse_int takes).
typedef struct {
    const char *suffix;
    double mult;
} NumUnit;
extern const NumUnit NO_UNITS[], TOKEN_UNITS[], COUNT_UNITS[], FLOP_UNITS[], BYTE_UNITS[];
// whole: the value (after its unit) must be an integer; the limits are then printed as integers.
double parse_number(const char *flag, const char *s, const NumUnit *units, double lo, double hi, int whole);
// An integer (exact up to 2^63 - 1) with an optional K/M/G (2^10, 2^20, 2^30) in [lo, hi].
long long parse_int(const char *flag, const char *s, long long lo, long long hi);
// For an unknown flag: ": did you mean --X?" naming the flag of the usage text `usage` nearest to it (at
// most two edits, and fewer than half its letters; not the flag itself), else "".
const char *flag_hint(const char *flag, const char *usage, char *buf, size_t cap);
// A finite number without units in [lo, hi].
float parse_float(const char *flag, const char *s, double lo, double hi);

// The splitmix64 finaliser: a counter-based hash behind initialisation, shuffling and communicator ids.
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}


#endif

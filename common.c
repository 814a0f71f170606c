// common.c: error reporting and checked system calls.
#define _GNU_SOURCE
#include "common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static DieFilter die_filter; // process-wide, like stderr itself

void die_set_filter(const DieFilter *f) {
    if (f) die_filter = *f;
    else memset(&die_filter, 0, sizeof die_filter);
}

static void write_line(const char *prefix, const char *fmt, va_list ap, int is_error) {
    char line[2048];
    size_t n = (size_t)snprintf(line, sizeof line, "%s", prefix);
    int k = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    n = k < 0 ? n : n + (size_t)k < sizeof line - 2 ? n + (size_t)k : sizeof line - 2;
    line[n++] = '\n';
    line[n] = 0;
    if (is_error && die_filter.claim && !die_filter.claim(line, die_filter.ctx)) exit(1);
    for (size_t off = 0; off < n;) {
        ssize_t w = write(2, line + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    if (is_error && die_filter.printed) die_filter.printed(die_filter.ctx);
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    write_line("error: ", fmt, ap, 1);
    va_end(ap);
    exit(1);
}

void error_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    write_line("error: ", fmt, ap, 0);
    va_end(ap);
}

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    write_line("warning: ", fmt, ap, 0);
    va_end(ap);
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

void xfclose(FILE *f, const char *path) {
    if (fclose(f) != 0) die("cannot write %s: %s", path, strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// the safe-write path

void dir_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISREG(m)) return "a file";
    return "not a regular file";
}

// Where a write to path lands: path itself, or the target of the symlink at path. Fills mode with the
// existing file's permissions (0666 for a new file). Returns 0, 1 for a symlink, -1 with err.
static int resolve_target(const char *path, char *target, size_t cap, mode_t *mode, char *err, size_t ecap) {
    struct stat st;
    *mode = 0666;
    if (strlen(path) + 32 >= cap) return snprintf(err, ecap, "path too long: %s", path), -1;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT) return snprintf(err, ecap, "cannot access %s: %s", path, strerror(errno)), -1;
        snprintf(target, cap, "%s", path);
        return 0;
    }
    int link = S_ISLNK(st.st_mode);
    if (link) {
        char *real = realpath(path, NULL);
        if (!real) return snprintf(err, ecap, "%s is a symlink to a missing file or directory (%s)", path, strerror(errno)), -1;
        int fits = strlen(real) + 32 < cap;
        if (fits) snprintf(target, cap, "%s", real);
        free(real);
        if (!fits) return snprintf(err, ecap, "path too long: %s", path), -1;
        if (stat(target, &st) != 0) return snprintf(err, ecap, "cannot access %s: %s", target, strerror(errno)), -1;
    } else {
        snprintf(target, cap, "%s", path);
    }
    if (!S_ISREG(st.st_mode))
        return snprintf(err, ecap, "%s%s%s is %s: refusing to replace it (only regular files are written)", path,
                        link ? " -> " : "", link ? target : "", file_kind(st.st_mode)), -1;
    *mode = st.st_mode & 07777;
    return link;
}

static void fail(SafeFile *sf, const char *what, int e) {
    snprintf(sf->err, sizeof sf->err, "cannot write %s: %s%s", sf->path, what, strerror(e));
    safe_abort(sf);
}

int safe_open(SafeFile *sf, const char *path) {
    memset(sf, 0, sizeof *sf);
    mode_t mode;
    if (resolve_target(path, sf->path, sizeof sf->path, &mode, sf->err, sizeof sf->err) < 0) return -1;
    safe_clean_stale(sf->path); // what a killed writer of this path left
    snprintf(sf->tmp, sizeof sf->tmp, "%s.tmp.%d", sf->path, (int)getpid());
    int fd = open(sf->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        snprintf(sf->err, sizeof sf->err, "cannot write %s: cannot create its temporary file: %s", sf->path, strerror(errno));
        sf->tmp[0] = 0;
        return -1;
    }
    if (mode != 0666 && fchmod(fd, mode) != 0) { // keep a replaced file's permissions
        int e = errno;
        close(fd);
        unlink(sf->tmp);
        snprintf(sf->err, sizeof sf->err, "cannot write %s: %s", sf->path, strerror(e));
        return -1;
    }
    sf->f = fdopen(fd, "wb");
    if (!sf->f) {
        int e = errno;
        close(fd);
        unlink(sf->tmp);
        snprintf(sf->err, sizeof sf->err, "cannot write %s: %s", sf->path, strerror(e));
        return -1;
    }
    sf->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    return 0;
}

int safe_write(SafeFile *sf, const void *data, size_t n) {
    if (!sf->f) return -1;
    if (n && fwrite(data, 1, n, sf->f) != n) return fail(sf, "", errno), -1;
    // zlib's crc32 takes at most UINT_MAX bytes at a time
    const unsigned char *p = data;
    for (size_t done = 0; done < n;) {
        size_t take = n - done < (1u << 30) ? n - done : (1u << 30);
        sf->crc = (uint32_t)crc32(sf->crc, p + done, (uInt)take);
        done += take;
    }
    sf->bytes += n;
    return 0;
}

int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int safe_commit(SafeFile *sf) {
    if (!sf->f) return -1;
    if (fflush(sf->f) != 0) return fail(sf, "", errno), -1;
    if (fsync(fileno(sf->f)) != 0) return fail(sf, "fsync: ", errno), -1;
    FILE *f = sf->f;
    sf->f = NULL;
    if (fclose(f) != 0) return fail(sf, "", errno), -1;
    if (rename(sf->tmp, sf->path) != 0) return fail(sf, "rename: ", errno), -1;
    sf->tmp[0] = 0;
    char dir[SAFE_PATH_MAX];
    dir_of(sf->path, dir, sizeof dir);
    if (fsync_dir(dir) != 0) {
        snprintf(sf->err, sizeof sf->err, "cannot write %s: fsync of %s: %s", sf->path, dir, strerror(errno));
        return -1;
    }
    return 0;
}

void safe_abort(SafeFile *sf) {
    if (sf->f) fclose(sf->f);
    sf->f = NULL;
    if (sf->tmp[0]) unlink(sf->tmp);
    sf->tmp[0] = 0;
}

void safe_open_or_die(SafeFile *sf, const char *path) {
    if (safe_open(sf, path) != 0) die("%s", sf->err);
}
void safe_write_or_die(SafeFile *sf, const void *data, size_t n) {
    if (safe_write(sf, data, n) != 0) die("%s", sf->err);
}
void safe_commit_or_die(SafeFile *sf) {
    if (safe_commit(sf) != 0) die("%s", sf->err);
}

int safe_clean_stale(const char *path) {
    char dir[SAFE_PATH_MAX];
    dir_of(path, dir, sizeof dir);
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t blen = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0) continue;
        const char *digits = n + blen + 5;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (end == digits || *end || errno || pid <= 0 || pid > INT32_MAX) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; // its writer still runs
        char full[2 * SAFE_PATH_MAX];
        snprintf(full, sizeof full, "%s/%s", dir, n);
        if (unlink(full) == 0) removed++;
    }
    closedir(d);
    return removed;
}

int safe_check(const char *what, const char *path, char *target, size_t tcap, char *err, size_t ecap) {
    mode_t mode;
    char why[2 * SAFE_PATH_MAX + 256];
    int link = resolve_target(path, target, tcap, &mode, why, sizeof why);
    if (link < 0) return snprintf(err, ecap, "%s %s", what, why), -1;
    char dir[SAFE_PATH_MAX];
    dir_of(target, dir, sizeof dir);
    struct stat st;
    if (stat(dir, &st) != 0)
        return snprintf(err, ecap, "%s %s: directory %s %s", what, path, dir,
                        errno == ENOENT ? "does not exist" : strerror(errno)), -1;
    if (!S_ISDIR(st.st_mode)) return snprintf(err, ecap, "%s %s: %s is not a directory", what, path, dir), -1;
    safe_clean_stale(target);
    char probe[SAFE_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s.tmp.%d", target, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return snprintf(err, ecap, "%s %s: cannot create files in %s: %s", what, path, dir, strerror(errno)), -1;
    close(fd);
    unlink(probe);
    return link;
}

int make_parents(const char *what, const char *dir, char *err, size_t ecap) {
    char part[SAFE_PATH_MAX];
    if (snprintf(part, sizeof part, "%s", dir) >= (int)sizeof part) return snprintf(err, ecap, "%s: the path is too long", what), -1;
    for (char *p = part + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(part, 0755) != 0 && errno != EEXIST)
            return snprintf(err, ecap, "%s %s: cannot create the directory %s: %s", what, dir, part, strerror(errno)), -1;
        *p = '/';
    }
    return 0;
}

int ensure_dir(const char *what, const char *dir, char *err, size_t ecap) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT) return snprintf(err, ecap, "%s %s: %s", what, dir, strerror(errno)), -1;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return snprintf(err, ecap, "%s %s: cannot create the directory: %s", what, dir, strerror(errno)), -1;
        if (stat(dir, &st) != 0) return snprintf(err, ecap, "%s %s: %s", what, dir, strerror(errno)), -1;
    }
    if (!S_ISDIR(st.st_mode)) return snprintf(err, ecap, "%s %s is %s, not a directory", what, dir, file_kind(st.st_mode)), -1;
    char probe[SAFE_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.llm4d-probe.%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return snprintf(err, ecap, "%s %s: cannot create files in it: %s", what, dir, strerror(errno)), -1;
    close(fd);
    unlink(probe);
    return 0;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---------------------------------------------------------------------------------------------
// number parsing (common.h)

const NumUnit NO_UNITS[] = { { NULL, 0 } };
const NumUnit TOKEN_UNITS[] = { { "K", 1024.0 }, { "M", 1048576.0 }, { "G", 1073741824.0 }, { NULL, 0 } };
const NumUnit COUNT_UNITS[] = { { "K", 1e3 }, { "M", 1e6 }, { "B", 1e9 }, { "T", 1e12 }, { NULL, 0 } };
const NumUnit FLOP_UNITS[] = { { "G", 1e9 }, { "T", 1e12 }, { "P", 1e15 }, { NULL, 0 } };
const NumUnit BYTE_UNITS[] = { { "B", 1 },           { "KB", 1e3 },          { "MB", 1e6 },
                            { "GB", 1e9 },        { "TB", 1e12 },         { "KiB", 1024.0 },
                            { "MiB", 1048576.0 }, { "GiB", 1073741824.0 }, { "TiB", 1099511627776.0 },
                            { NULL, 0 } };

// The length of the decimal number at the start of s (0: none), and whether it has a fraction or an
// exponent. strtod alone would also take hex ("0x10"), "inf" and "nan".
static size_t decimal_prefix(const char *s, int *real) {
    size_t i = 0, digits = 0;
    *real = 0;
    if (s[i] == '+' || s[i] == '-') i++;
    while (s[i] >= '0' && s[i] <= '9') i++, digits++;
    if (s[i] == '.') {
        *real = 1;
        i++;
        while (s[i] >= '0' && s[i] <= '9') i++, digits++;
    }
    if (!digits) return 0;
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1;
        if (s[j] == '+' || s[j] == '-') j++;
        if (s[j] >= '0' && s[j] <= '9') {
            while (s[j] >= '0' && s[j] <= '9') j++;
            *real = 1;
            i = j;
        }
    }
    return i;
}

static const NumUnit *find_unit(const char *flag, const char *s, const char *suffix, const NumUnit *units, int whole) {
    if (!*suffix) return NULL;
    const NumUnit *u = units;
    while (u->suffix && strcmp(suffix, u->suffix)) u++;
    if (u->suffix) return u;
    if (units == NO_UNITS) die("%s expects %s, got '%s'", flag, whole ? "an integer" : "a number", s);
    char list[128] = "";
    for (u = units; u->suffix; u++) snprintf(list + strlen(list), sizeof list - strlen(list), " %s", u->suffix);
    die("%s: unknown unit '%s' in '%s' (units:%s)", flag, suffix, s, list);
}

static void die_range(const char *flag, const char *s, double lo, double hi, int whole) {
    if (whole && fabs(lo) < 9e18 && fabs(hi) < 9e18)
        die("%s must be between %lld and %lld, got '%s'", flag, (long long)lo, (long long)hi, s);
    die("%s must be between %g and %g, got '%s'", flag, lo, hi, s);
}

double parse_number(const char *flag, const char *s, const NumUnit *units, double lo, double hi, int whole) {
    int real;
    size_t n = decimal_prefix(s, &real);
    if (!n) die("%s expects %s, got '%s'", flag, whole ? "an integer" : "a number", s);
    char num[64];
    if (n >= sizeof num) die("%s: '%s' is too long a number", flag, s);
    memcpy(num, s, n);
    num[n] = 0;
    const NumUnit *u = find_unit(flag, s, s + n, units, whole);
    errno = 0;
    double v = strtod(num, NULL);
    if (errno || !isfinite(v)) die("%s: '%s' is out of range", flag, s);
    if (u) v *= u->mult;
    if (whole && v != floor(v)) die("%s expects a whole number, got '%s'", flag, s);
    if (v < lo || v > hi) die_range(flag, s, lo, hi, whole);
    return v;
}

// Edits (insert, delete, substitute, swap two neighbours) from a[0..n) to b[0..m), both under 64.
static int edits(const char *a, int n, const char *b, int m) {
    int d[65][65];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v) v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *flag_hint(const char *flag, const char *usage, char *buf, size_t cap) {
    int n = (int)strlen(flag), best = 3, len = 0;
    const char *at = NULL;
    if (n >= 64 || strncmp(flag, "--", 2)) return "";
    for (const char *p = strstr(usage, "--"); p; p = strstr(p + 2, "--")) {
        int m = 2;
        while (p[m] && (islower((unsigned char)p[m]) || isdigit((unsigned char)p[m]) || p[m] == '-')) m++;
        if (m < 3 || m >= 64 || (p > usage && (isalnum((unsigned char)p[-1]) || p[-1] == '-'))) continue;
        int e = edits(flag + 2, n - 2, p + 2, m - 2);
        if (e > 0 && e < best && 2 * e < n - 2) best = e, at = p, len = m; // (0: the flag itself, of another mode)
    }
    if (!at) return "";
    snprintf(buf, cap, ": did you mean %.*s?", len, at);
    return buf;
}

long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
    int real;
    size_t n = decimal_prefix(s, &real);
    if (!n || real) { // a fraction or exponent: through the double path, which checks that it is whole
        double v = parse_number(flag, s, TOKEN_UNITS, (double)lo, (double)hi, 1);
        return (long long)v;
    }
    const NumUnit *u = find_unit(flag, s, s + n, TOKEN_UNITS, 1);
    char num[64];
    if (n >= sizeof num) die("%s: '%s' is too long a number", flag, s);
    memcpy(num, s, n);
    num[n] = 0;
    errno = 0;
    long long v = strtoll(num, NULL, 10); // exact: seeds use all 63 bits
    long long mult = u ? (long long)u->mult : 1;
    if (errno || (v > 0 && v > LLONG_MAX / mult) || (v < 0 && v < LLONG_MIN / mult) || v * mult < lo || v * mult > hi)
        die("%s must be between %lld and %lld, got '%s'", flag, lo, hi, s);
    return v * mult;
}

float parse_float(const char *flag, const char *s, double lo, double hi) {
    return (float)parse_number(flag, s, NO_UNITS, lo, hi, 0);
}

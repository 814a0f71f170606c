// ckpt.c: checkpoints (see ckpt.h): the directory's lock, the runs each rank owns, the writer thread, the
// manifest, and the reader that checks every manifest field and that the shards' runs tile each tensor,
// and assembles any layout's slice from any other layout's shards.
#define _GNU_SOURCE
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"
#include "safetensors.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint tensors are little-endian and written in host order"
#endif

#define FORMAT "llm4d-checkpoint"
#define FORMAT_VERSION 1
#define MANIFEST "manifest.json"
#define CRC_KEY "\"manifest_crc32\""

// A run: len consecutive elements at `state` of a rank's vector that are elements [full, full + len) of
// one flattened full tensor.
typedef struct {
    uint64_t state, full, len;
} Run;
typedef struct {
    Run *r;
    size_t n, cap;
    uint64_t elems;
} Runs;

static void runs_add(Runs *rs, uint64_t state, uint64_t full) {
    if (rs->n) {
        Run *l = &rs->r[rs->n - 1];
        if (l->state + l->len == state && l->full + l->len == full) {
            l->len++;
            rs->elems++;
            return;
        }
    }
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 16;
        rs->r = realloc(rs->r, rs->cap * sizeof(Run));
        if (!rs->r) die("out of memory");
    }
    rs->r[rs->n++] = (Run){ state, full, 1 };
    rs->elems++;
}

static void runs_free(Runs rs[NUM_PARAM_TENSORS]) {
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) free(rs[k].r);
    memset(rs, 0, sizeof(Runs) * NUM_PARAM_TENSORS);
}

// The runs of internal elements [a0, e0), which sit at state0 + (x - a0) of the rank's vector. Every
// element of the full model is written by one rank (owned_only): the one whose copy counts.
static void collect_runs(const GPT2 *m, size_t a0, size_t e0, uint64_t state0, int owned_only, Runs rs[NUM_PARAM_TENSORS]) {
    for (TensorSlice s = GPT2_SLICES; gpt2_next_slice(m, a0, e0 - a0, &s);) {
        size_t e = s.e;
        if (owned_only) { // the slice's counted prefix (a tensor replicated over TP: none but on its rank 0)
            size_t off, len;
            gpt2_tensor_range(m, s.k, s.l, &off, &len);
            if (s.start + gpt2_counted_len(m, s.k, len) < e) e = s.start + gpt2_counted_len(m, s.k, len);
        }
        for (size_t x = s.a; x < e; x++) {
            size_t f = gpt2_file_index(m, s.k, s.l, x - s.start);
            if (f != SIZE_MAX) runs_add(&rs[s.k], state0 + (x - a0), f - m->file_offsets[s.k]);
        }
    }
}

static int by_full(const void *a, const void *b) {
    const Run *x = a, *y = b;
    return x->full < y->full ? -1 : x->full > y->full;
}


void ckpt_path(const char *dir, int64_t step, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/ckpt_%08lld", dir, (long long)step);
    if (n < 0 || (size_t)n >= cap) die("path too long: %s", dir);
}

// ---------------------------------------------------------------------------------------------
// the lock: one run at a time in a checkpoint directory

#define LOCK_FILE "llm4d.lock"

// Who holds a lock, from what ckpt_lock wrote into its file ("pid P host H").
static void lock_holder(const char *path, char *out, size_t cap) {
    char buf[320] = "", host[256];
    long pid;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) buf[n] = 0;
    if (n > 0 && sscanf(buf, "pid %ld host %255s", &pid, host) == 2) snprintf(out, cap, "PID %ld on host %s", pid, host);
    else snprintf(out, cap, "a process that has not written its PID and host yet");
}

// The directory a checkpoint path lies in.
static void parent_dir(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = 0;
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, cap, ".");
    else if (s == out) s[1] = 0;
    else *s = 0;
}

int ckpt_lock(const char *dir, const char *resume, const char *flag, int *fd, char *err, size_t cap) {
    char path[SAFE_PATH_MAX + 32], who[320];
    *fd = -1;
    if (resume) { // tested, not taken: F_OFD_GETLK reports a conflicting lock without acquiring one
        char parent[SAFE_PATH_MAX];
        parent_dir(resume, parent, sizeof parent);
        snprintf(path, sizeof path, "%s/" LOCK_FILE, parent);
        int pfd = open(path, O_RDONLY | O_CLOEXEC);
        if (pfd >= 0) {
            struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
            int r = fcntl(pfd, F_OFD_GETLK, &fl);
            close(pfd);
            if (r == 0 && fl.l_type != F_UNLCK) {
                lock_holder(path, who, sizeof who);
                return snprintf(err, cap, "%s %s: its directory %s is in use by another run (%s holds %s): wait for "
                                "it to end, or copy the checkpoint elsewhere", flag, resume, parent, who, path), -1;
            }
        }
    }
    if (!dir) return 0;
    snprintf(path, sizeof path, "%s/" LOCK_FILE, dir);
    int f = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f < 0) return snprintf(err, cap, "--ckpt-dir %s: cannot open its lock file %s: %s", dir, path, strerror(errno)), -1;
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET }; // the whole file
    if (fcntl(f, F_OFD_SETLK, &fl) != 0) {
        int e = errno;
        close(f);
        if (e == EAGAIN || e == EACCES) {
            lock_holder(path, who, sizeof who);
            return snprintf(err, cap, "--ckpt-dir %s is in use by another run (%s holds %s): wait for it to end, or "
                            "choose another directory", dir, who, path), -1;
        }
        if (e == ENOLCK || e == EINVAL || e == EOPNOTSUPP) { // a file system without locks: the run goes on, unguarded
            fprintf(stderr, "warning: --ckpt-dir %s: cannot lock %s (%s): a second run into it would not be refused\n", dir,
                    path, strerror(e));
            return 0;
        }
        return snprintf(err, cap, "--ckpt-dir %s: cannot lock %s: %s", dir, path, strerror(e)), -1;
    }
    char host[256] = "", text[320];
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "unknown");
    int n = snprintf(text, sizeof text, "pid %ld host %s\n", (long)getpid(), host);
    if (ftruncate(f, 0) != 0 || pwrite(f, text, (size_t)n, 0) != n) {
        int e = errno;
        close(f);
        return snprintf(err, cap, "--ckpt-dir %s: cannot write %s: %s", dir, path, strerror(e)), -1;
    }
    *fd = f;
    return 0;
}

// Checkpoint directories in dir (ckpt_<digits>), newest first.
static int list_steps(const char *dir, int64_t **out) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "ckpt_", 5) != 0) continue;
        const char *s = e->d_name + 5;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || *end || errno || v < 0) continue;
        // only what ckpt_path names, and a directory (or a link to one: a checkpoint moved to other
        // storage and linked back is read; remove_dir removes such a link, never what it points to)
        char name[64], p[2 * SAFE_PATH_MAX];
        snprintf(name, sizeof name, "%08lld", v);
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (strcmp(name, s) != 0 || stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *out = realloc(*out, sizeof(int64_t) * cap);
            if (!*out) die("out of memory");
        }
        (*out)[n++] = v;
    }
    closedir(d);
    for (int i = 1; i < n; i++) // newest first
        for (int j = i; j > 0 && (*out)[j] > (*out)[j - 1]; j--) {
            int64_t t = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = t;
        }
    return n;
}

int ckpt_is_complete(const char *ckdir) {
    char p[SAFE_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/" MANIFEST, ckdir);
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

const char *ckpt_named_problem(const char *path, char *buf, size_t cap) {
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT ? "does not exist" : strerror(errno);
    if (!S_ISDIR(st.st_mode)) return "is not a directory (a checkpoint is one)";
    if (!ckpt_is_complete(path)) {
        int64_t *steps, newest;
        int n = list_steps(path, &steps);
        newest = n ? steps[0] : 0;
        free(steps);
        if (n) // the directory of them (a --ckpt-dir), not one
            return snprintf(buf, cap, "is a directory of %d checkpoint(s), not one: name one (%s/ckpt_%08lld is the newest), or "
                            "pass --ckpt-dir %s --resume", n, path, (long long)newest, path), buf;
        return snprintf(buf, cap, "%s/" MANIFEST ": missing (an incomplete checkpoint)", path), buf;
    }
    return NULL;
}

int ckpt_newest_complete(const char *dir, int64_t *step) {
    int64_t *steps;
    int n = list_steps(dir, &steps), found = 0;
    for (int i = 0; i < n && !found; i++) {
        char d[SAFE_PATH_MAX];
        ckpt_path(dir, steps[i], d, sizeof d);
        if ((found = ckpt_is_complete(d))) *step = steps[i];
    }
    free(steps);
    return found;
}

// Removes a checkpoint directory and the files in it.
static int remove_dir(const char *path) {
    struct stat st; // a link is removed, not followed: what it points to is not ours to empty
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (S_ISLNK(st.st_mode)) return unlink(path);
    if (!S_ISDIR(st.st_mode)) return errno = ENOTDIR, -1;
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[2 * SAFE_PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (unlink(p) != 0) rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0) rc = -1;
    return rc;
}

// Removes temporaries (NAME.tmp.PID) left in a checkpoint directory by processes that no longer run.
static void clean_stale_in(const char *ckdir) {
    DIR *d = opendir(ckdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t) continue;
        char p[2 * SAFE_PATH_MAX];
        snprintf(p, sizeof p, "%s/%.*s", ckdir, (int)(t - e->d_name), e->d_name);
        safe_clean_stale(p);
    }
    closedir(d);
}

int ckpt_prepare_dir(const char *dir, int64_t start, int resumed, int remove_newer, const char *resume_how, char *err, size_t cap) {
    int64_t *steps;
    int n = list_steps(dir, &steps), rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char d[SAFE_PATH_MAX];
        ckpt_path(dir, steps[i], d, sizeof d);
        if (!ckpt_is_complete(d)) {
            if (remove_dir(d) == 0) printf("removed the incomplete checkpoint %s\n", d);
            continue;
        }
        if (!resumed) {
            snprintf(err, cap, "--ckpt-dir %s already holds checkpoints (the newest of step %lld): %s to continue from it, or "
                     "choose another directory", dir, (long long)steps[0], resume_how ? resume_how : "pass --resume");
            rc = -1;
        } else if (steps[i] > start) {
            if (!remove_newer) {
                snprintf(err, cap, "--ckpt-dir %s holds a checkpoint (step %lld) newer than the one resumed from (step %lld), "
                         "which training on would overwrite: move it away or choose another --ckpt-dir", dir,
                         (long long)steps[i], (long long)start);
                rc = -1;
            } else if (remove_dir(d) == 0) {
                printf("removed the unusable checkpoint %s\n", d);
            }
        } else {
            clean_stale_in(d);
        }
    }
    free(steps);
    fflush(stdout);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// the writer

enum { JOB_SHARD, JOB_MANIFEST, JOB_REMOVE };
typedef struct {
    int kind;
    int64_t step;
    char *text; // the manifest
    size_t text_len;
    uint64_t bytes;
    double write_s;
} Job;

#define QUEUE 8

struct Ckpt {
    char dir[SAFE_PATH_MAX];
    GPT2 *model;
    Zero *zero;
    Comm *world;
    int rank, nranks, keep;
    Runs own[NUM_PARAM_TENSORS]; // state = position in the shard vector (zero.h)
    size_t shard_elems;
    float *snap_master, *snap_m, *snap_v; // the staged copy the writer thread reads
    int64_t kill_step;
    int inflight; // a checkpoint is staged and not yet finalized (every rank agrees)
    CkptMeta meta; // its description
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Job queue[QUEUE];
    int qlen, busy, stop;
    // the shard job's outcome (under mu)
    int shard_done, shard_failed;
    uint64_t shard_bytes;
    uint32_t shard_crc;
    double shard_s;
    char shard_err[512];
    // rank 0: finished checkpoints, for the log (under mu)
    CkptEvent events[QUEUE];
    int nevents;
};

static void push_event(Ckpt *c, const CkptEvent *ev) {
    pthread_mutex_lock(&c->mu);
    if (c->nevents < QUEUE) c->events[c->nevents++] = *ev;
    pthread_mutex_unlock(&c->mu);
}

// The safetensors header of this rank's shard, padded with spaces to a multiple of 8 bytes.
static char *shard_header(const Ckpt *c, int64_t step, size_t *len) {
    json_t *h = json_object(), *meta = json_object();
    char buf[96];
    json_object_set_new(meta, "format", json_string(FORMAT));
    snprintf(buf, sizeof buf, "%d", FORMAT_VERSION);
    json_object_set_new(meta, "version", json_string(buf));
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    json_object_set_new(meta, "step", json_string(buf));
    snprintf(buf, sizeof buf, "%d", c->rank);
    json_object_set_new(meta, "rank", json_string(buf));
    snprintf(buf, sizeof buf, "%d", c->nranks);
    json_object_set_new(meta, "ranks", json_string(buf));
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        int64_t d[3];
        int nd = gpt2_tensor_shape(&c->model->cfg, k, d);
        if (!nd) continue; // a tensor the architecture lacks
        int w = snprintf(buf, sizeof buf, "[%lld", (long long)d[0]);
        for (int i = 1; i < nd; i++) w += snprintf(buf + w, sizeof buf - w, ", %lld", (long long)d[i]);
        snprintf(buf + w, sizeof buf - w, "]");
        char key[32];
        snprintf(key, sizeof key, "shape.%s", PARAM_NAMES[k]);
        json_object_set_new(meta, key, json_string(buf));
    }
    json_object_set_new(h, "__metadata__", meta);
    uint64_t off = 0;
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        const Runs *rs = &c->own[k];
        if (!rs->n) continue;
        static const char *const what[] = { "runs", "master", "m", "v" };
        for (int q = 0; q < 4; q++) {
            uint64_t bytes = q == 0 ? rs->n * 16 : rs->elems * 4;
            json_t *t = json_object();
            json_object_set_new(t, "dtype", json_string(q == 0 ? "I64" : "F32"));
            json_t *shape = json_array();
            json_array_append_new(shape, json_integer(q == 0 ? (json_int_t)rs->n : (json_int_t)rs->elems));
            if (q == 0) json_array_append_new(shape, json_integer(2));
            json_object_set_new(t, "shape", shape);
            json_t *offs = json_array();
            json_array_append_new(offs, json_integer((json_int_t)off));
            json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
            json_object_set_new(t, "data_offsets", offs);
            char key[32];
            snprintf(key, sizeof key, "%s.%s", PARAM_NAMES[k], what[q]);
            json_object_set_new(h, key, t);
            off += bytes;
        }
    }
    char *out = st_header_text(h, len);
    json_decref(h);
    return out;
}

static void write_shard(Ckpt *c, int64_t step) {
    double t0 = now_seconds();
    char d[SAFE_PATH_MAX], path[SAFE_PATH_MAX + 64];
    ckpt_path(c->dir, step, d, sizeof d);
    snprintf(path, sizeof path, "%s/rank_%05d.safetensors", d, c->rank);
    SafeFile sf;
    memset(&sf, 0, sizeof sf);
    int ok = !(mkdir(d, 0755) != 0 && errno != EEXIST);
    if (!ok) snprintf(sf.err, sizeof sf.err, "cannot create %s: %s", d, strerror(errno));
    else ok = safe_open(&sf, path) == 0;
    size_t hlen;
    char *header = shard_header(c, step, &hlen);
    uint64_t hl = hlen;
    ok = ok && safe_write(&sf, &hl, 8) == 0 && safe_write(&sf, header, hlen) == 0;
    free(header);
    float *src[3] = { c->snap_master, c->snap_m, c->snap_v };
    int64_t pairs[2 * 256];
    for (int k = 0; k < NUM_PARAM_TENSORS && ok; k++) {
        const Runs *rs = &c->own[k];
        for (size_t i = 0; i < rs->n && ok; i += 256) { // the runs, as (start, length) pairs
            size_t m = rs->n - i < 256 ? rs->n - i : 256;
            for (size_t j = 0; j < m; j++) {
                pairs[2 * j] = (int64_t)rs->r[i + j].full;
                pairs[2 * j + 1] = (int64_t)rs->r[i + j].len;
            }
            ok = safe_write(&sf, pairs, m * 16) == 0;
        }
        for (int q = 0; q < 3 && ok; q++)
            for (size_t i = 0; i < rs->n && ok; i++) ok = safe_write(&sf, src[q] + rs->r[i].state, rs->r[i].len * 4) == 0;
        if (step == c->kill_step && ok) { // testing aid: die mid-write, leaving the temporary behind
            fflush(sf.f);
            raise(SIGKILL);
        }
    }
    ok = ok && safe_commit(&sf) == 0;
    if (!ok) safe_abort(&sf);
    pthread_mutex_lock(&c->mu);
    c->shard_done = 1;
    c->shard_failed = !ok;
    c->shard_bytes = sf.bytes;
    c->shard_crc = sf.crc;
    c->shard_s = now_seconds() - t0;
    snprintf(c->shard_err, sizeof c->shard_err, "%.500s", ok ? "" : sf.err);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

// --keep: removes the oldest complete checkpoints beyond the newest `keep`.
static void prune(Ckpt *c) {
    if (c->keep <= 0) return;
    int64_t *steps;
    int n = list_steps(c->dir, &steps), kept = 0;
    for (int i = 0; i < n; i++) {
        char d[SAFE_PATH_MAX];
        ckpt_path(c->dir, steps[i], d, sizeof d);
        if (!ckpt_is_complete(d)) continue;
        if (++kept > c->keep && remove_dir(d) != 0)
            fprintf(stderr, "warning: --keep: cannot remove %s: %s\n", d, strerror(errno));
    }
    free(steps);
}

static void write_manifest(Ckpt *c, const Job *j) {
    CkptEvent ev = { .step = j->step, .bytes = j->bytes, .write_s = j->write_s };
    char d[SAFE_PATH_MAX], path[SAFE_PATH_MAX + 32];
    ckpt_path(c->dir, j->step, d, sizeof d);
    snprintf(path, sizeof path, "%s/" MANIFEST, d);
    snprintf(ev.path, sizeof ev.path, "%s", d);
    SafeFile sf;
    ev.ok = safe_open(&sf, path) == 0 && safe_write(&sf, j->text, j->text_len) == 0 && safe_commit(&sf) == 0;
    if (ev.ok && fsync_dir(c->dir) != 0) { // the checkpoint's directory entry, too
        snprintf(sf.err, sizeof sf.err, "fsync of %s: %s", c->dir, strerror(errno));
        ev.ok = 0;
    }
    if (ev.ok) {
        prune(c);
    } else {
        snprintf(ev.msg, sizeof ev.msg, "%.500s", sf.err);
        remove_dir(d); // an incomplete checkpoint only takes space
    }
    push_event(c, &ev);
}

static void *writer_main(void *arg) {
    Ckpt *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->qlen && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->qlen) break;
        Job j = c->queue[0];
        memmove(c->queue, c->queue + 1, sizeof(Job) * (size_t)(--c->qlen));
        c->busy = 1;
        pthread_mutex_unlock(&c->mu);
        if (j.kind == JOB_SHARD) {
            write_shard(c, j.step);
        } else if (j.kind == JOB_MANIFEST) {
            write_manifest(c, &j);
        } else {
            char d[SAFE_PATH_MAX];
            ckpt_path(c->dir, j.step, d, sizeof d);
            remove_dir(d);
        }
        free(j.text);
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void enqueue(Ckpt *c, const Job *j) {
    pthread_mutex_lock(&c->mu);
    while (c->qlen == QUEUE) pthread_cond_wait(&c->cv, &c->mu);
    c->queue[c->qlen++] = *j;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void ckpt_alloc_staging(MemAccount *a, const Zero *z, float *snap[3]) {
    static const char *const what[3] = { "checkpoint staging (master)", "checkpoint staging (m)", "checkpoint staging (v)" };
    for (int i = 0; i < 3; i++) snap[i] = mem_host_alloc(a, MEM_OTHER, sizeof(float) * (z->shard_elems + 1), what[i]);
}

Ckpt *ckpt_open(const char *dir, GPT2 *model, Zero *zero, Comm *world, int keep) {
    Ckpt *c = xcalloc(1, sizeof(Ckpt));
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    c->model = model;
    c->zero = zero;
    c->world = world;
    c->rank = world ? comm_rank(world) : 0;
    c->nranks = world ? comm_size(world) : 1;
    c->keep = keep;
    c->kill_step = -1;
    for (int b = 0; b < zero->nbuckets; b++)
        collect_runs(model, zero->own_off[b], zero->own_off[b] + zero->own_len[b], zero->shard_pos[b], 1, c->own);
    c->shard_elems = zero->shard_elems;
    // touched now, so that the first checkpoint's stall does not include the page faults
    float *snap[3];
    ckpt_alloc_staging(&model->mem, zero, snap);
    c->snap_master = snap[0], c->snap_m = snap[1], c->snap_v = snap[2];
    memset(c->snap_master, 0, sizeof(float) * c->shard_elems);
    memset(c->snap_m, 0, sizeof(float) * c->shard_elems);
    memset(c->snap_v, 0, sizeof(float) * c->shard_elems);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int e = pthread_create(&c->thread, NULL, writer_main, c);
    if (e) die("cannot start the checkpoint writer thread: %s", strerror(e));
    return c;
}

size_t ckpt_staging_bytes(const Ckpt *c) { return 3 * sizeof(float) * c->shard_elems; }

void ckpt_kill_during_write(Ckpt *c, int64_t step) { c->kill_step = step; }

int32_t ckpt_writing(Ckpt *c) {
    if (!c->inflight) return 0;
    pthread_mutex_lock(&c->mu);
    int done = c->shard_done;
    pthread_mutex_unlock(&c->mu);
    return !done;
}

static void wait_own_shard(Ckpt *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->shard_done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

// ---------------------------------------------------------------------------------------------
// CkptMeta in the manifest: its field list, written once. The manifest holds the root members in this
// order, then each section as an object in order of first appearance; manifest_text and parse_meta
// add what is not a plain field (format and version, data.next_sequence, the --skip-spikes history).

// an integer of the field's size, a boolean, a real, a string, an architecture (an int written as its name)
enum { MF_INT, MF_BOOL, MF_REAL, MF_STR, MF_ARCH };
typedef struct {
    const char *section; // NULL: a member of the manifest itself
    const char *key;
    int kind;
    size_t off, size;
    int optional; // missing: read as dflt (written before the member existed), else the manifest is refused
    double dflt;
} MetaField;
#define MF(section, key, kind, field) { section, key, kind, offsetof(CkptMeta, field), sizeof(((CkptMeta *)0)->field), 0, 0 }
// the Llama family's fields, written since issue 27: missing in older manifests, which hold GPT-2 (zeros)
#define MF0(section, key, kind, field) { section, key, kind, offsetof(CkptMeta, field), sizeof(((CkptMeta *)0)->field), 1, 0 }
static const MetaField META_FIELDS[] = {
    MF(NULL, "step", MF_INT, step), MF(NULL, "adam_t", MF_INT, adam_t), MF(NULL, "seed", MF_INT, seed),
    MF(NULL, "shuffle", MF_BOOL, shuffle),
    MF("model", "layers", MF_INT, model.L), MF("model", "channels", MF_INT, model.C), MF("model", "heads", MF_INT, model.NH),
    MF("model", "vocab", MF_INT, model.V), MF("model", "padded_vocab", MF_INT, model.Vp),
    MF("model", "max_seq_len", MF_INT, model.maxT),
    MF0("model", "arch", MF_ARCH, model.arch), MF0("model", "kv_heads", MF_INT, model.NKV), MF0("model", "ffn", MF_INT, model.F),
    MF0("model", "tie_embeddings", MF_BOOL, model.tie), MF0("model", "norm_eps", MF_REAL, model.norm_eps),
    MF0("model", "rope_theta", MF_REAL, model.rope.theta), MF0("model", "rope_factor", MF_REAL, model.rope.factor),
    MF0("model", "rope_low_freq_factor", MF_REAL, model.rope.low_freq_factor),
    MF0("model", "rope_high_freq_factor", MF_REAL, model.rope.high_freq_factor),
    MF0("model", "rope_original_max_pos", MF_INT, model.rope.original_max_pos),
    MF("layout", "ranks", MF_INT, ranks), MF("layout", "dp", MF_INT, dp), MF("layout", "tp", MF_INT, tp),
    MF("layout", "pp", MF_INT, pp),
    { "layout", "cp", MF_INT, offsetof(CkptMeta, cp), sizeof(int), 1, 1 }, // before context parallelism: 1
    MF("layout", "pp_virtual", MF_INT, pp_virtual), MF("layout", "zero", MF_INT, zero), MF("layout", "sp", MF_BOOL, sp),
    MF("layout", "bucket_mb", MF_REAL, bucket_mb), MF("layout", "dtype", MF_STR, dtype),
    MF("layout", "micro_batch", MF_INT, micro_batch), MF("layout", "seq_len", MF_INT, seq_len),
    MF("layout", "batch_tokens", MF_INT, batch_tokens),
    MF("data", "train", MF_STR, train), MF("data", "tokens", MF_INT, train_tokens),
    { "data", "fingerprint", MF_STR, offsetof(CkptMeta, train_fp), sizeof(((CkptMeta *)0)->train_fp), 1, 0 }, // before fingerprints: ""
    MF("optimizer", "schedule", MF_STR, schedule), MF("optimizer", "lr", MF_REAL, lr),
    MF("optimizer", "lr_min_frac", MF_REAL, lr_min_frac), MF("optimizer", "warmup", MF_INT, warmup),
    MF("optimizer", "steps", MF_INT, steps), MF("optimizer", "beta1", MF_REAL, beta1), MF("optimizer", "beta2", MF_REAL, beta2),
    MF("optimizer", "eps", MF_REAL, eps), MF("optimizer", "weight_decay", MF_REAL, weight_decay),
    MF("optimizer", "clip", MF_REAL, clip),
    MF("skip_spikes", "threshold", MF_REAL, skip_spikes), MF("skip_spikes", "skipped", MF_INT, skipped),
    // before these were written a resumed run took its first boundary as evaluated: 1
    { "boundary", "validated", MF_BOOL, offsetof(CkptMeta, validated), sizeof(int), 1, 1 },
    { "boundary", "sampled", MF_BOOL, offsetof(CkptMeta, sampled), sizeof(int), 1, 1 },
};
#undef MF
#define N_META_FIELDS (sizeof META_FIELDS / sizeof META_FIELDS[0])

// A field's value as JSON: integers of 4 or 8 bytes (signed or not: the bits of an int64), floats and
// doubles, strings.
static json_t *meta_value(const CkptMeta *mt, const MetaField *f) {
    const char *p = (const char *)mt + f->off;
    int64_t i = 0;
    switch (f->kind) {
    case MF_INT:
    case MF_BOOL:
        if (f->size == 4) i = *(const int32_t *)p;
        else memcpy(&i, p, sizeof i);
        return f->kind == MF_BOOL ? json_boolean(i) : json_integer((json_int_t)i);
    case MF_REAL: return json_real(f->size == 4 ? (double)*(const float *)p : *(const double *)p);
    case MF_ARCH: return json_string(ARCH_NAMES[*(const int *)p]);
    default: return json_string(p);
    }
}

// The object for a section of r: created (and added to r, so in table order) on first use.
static json_t *meta_section(json_t *r, const char *section) {
    if (!section) return r;
    json_t *o = json_object_get(r, section);
    if (!o) {
        o = json_object();
        json_object_set_new(r, section, o);
    }
    return o;
}

static void meta_to_json(const CkptMeta *mt, json_t *r) {
    for (size_t i = 0; i < N_META_FIELDS; i++)
        json_object_set_new(meta_section(r, META_FIELDS[i].section), META_FIELDS[i].key, meta_value(mt, &META_FIELDS[i]));
    json_object_set_new(json_object_get(r, "data"), "next_sequence", json_integer(mt->step * (mt->batch_tokens / mt->seq_len)));
    json_t *sk = json_object_get(r, "skip_spikes"), *hl = json_array(), *hn = json_array();
    for (int i = 0; i < mt->nhist; i++) {
        json_array_append_new(hl, json_real(mt->hist_loss[i]));
        json_array_append_new(hn, json_real(mt->hist_norm[i]));
    }
    json_object_set_new(sk, "loss", hl);
    json_object_set_new(sk, "norm", hn);
}

// The manifest: the description, then every shard's file, size and crc32, then manifest_crc32.
static char *manifest_text(const Ckpt *c, const int64_t *all, size_t *len) {
    const CkptMeta *mt = &c->meta;
    json_t *r = json_object();
    json_object_set_new(r, "format", json_string(FORMAT));
    json_object_set_new(r, "version", json_integer(FORMAT_VERSION));
    meta_to_json(mt, r);
    json_t *sh = json_array();
    for (int q = 0; q < c->nranks; q++) {
        json_t *s = json_object();
        char name[32];
        snprintf(name, sizeof name, "rank_%05d.safetensors", q);
        json_object_set_new(s, "file", json_string(name));
        json_object_set_new(s, "rank", json_integer(q));
        json_object_set_new(s, "bytes", json_integer(all[4 * q]));
        json_object_set_new(s, "crc32", json_integer(all[4 * q + 1]));
        json_array_append(sh, s);
        json_decref(s);
    }
    json_object_set_new(r, "shards", sh);
    char *body = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(r);
    if (!body) die("out of memory");
    size_t n = strlen(body);
    while (n && body[n - 1] != '}') n--; // reopen the object for its last member
    n--;
    while (n && (body[n - 1] == '\n' || body[n - 1] == ' ')) n--;
    char *out = xmalloc(n + 64);
    memcpy(out, body, n);
    n += (size_t)sprintf(out + n, ",\n  ");
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)out, (uInt)n);
    n += (size_t)sprintf(out + n, CRC_KEY ": %u\n}\n", crc);
    free(body);
    *len = n;
    return out;
}

// Every rank's shard of the checkpoint in flight is written (or failed): rank 0 writes the manifest,
// or gives the checkpoint up. Collective.
static void finalize(Ckpt *c) {
    int64_t mine[4];
    char err[512];
    pthread_mutex_lock(&c->mu);
    mine[0] = (int64_t)c->shard_bytes;
    mine[1] = c->shard_crc;
    mine[2] = (int64_t)(c->shard_s * 1e9);
    mine[3] = c->shard_failed;
    snprintf(err, sizeof err, "%s", c->shard_err);
    pthread_mutex_unlock(&c->mu);
    int64_t *all = xmalloc(sizeof(int64_t) * 4 * c->nranks);
    if (c->world) comm_all_gather(c->world, mine, all, 4 * (size_t)c->nranks, CT_I64);
    else memcpy(all, mine, sizeof mine);
    int failed = -1;
    uint64_t bytes = 0;
    double slowest = 0;
    for (int q = 0; q < c->nranks; q++) {
        if (all[4 * q + 3] && failed < 0) failed = q;
        bytes += (uint64_t)all[4 * q];
        if (all[4 * q + 2] * 1e-9 > slowest) slowest = all[4 * q + 2] * 1e-9;
    }
    if (failed >= 0) { // the failing rank's reason, for rank 0's one line
        char *msgs = xmalloc(sizeof err * c->nranks);
        if (c->world) comm_all_gather(c->world, err, msgs, sizeof err / 4 * c->nranks, CT_I32);
        else memcpy(msgs, err, sizeof err);
        if (c->rank == 0) {
            CkptEvent ev = { .step = c->meta.step };
            ckpt_path(c->dir, c->meta.step, ev.path, sizeof ev.path);
            snprintf(ev.msg, sizeof ev.msg, "rank %d: %.400s", failed, msgs + sizeof err * failed);
            fprintf(stderr, "warning: the checkpoint of step %lld was not written (%s); training goes on, and the "
                    "previous complete checkpoint stays the newest\n", (long long)c->meta.step, ev.msg);
            push_event(c, &ev);
            enqueue(c, &(Job){ .kind = JOB_REMOVE, .step = c->meta.step });
        }
        free(msgs);
    } else if (c->rank == 0) {
        Job j = { .kind = JOB_MANIFEST, .step = c->meta.step, .bytes = bytes, .write_s = slowest };
        j.text = manifest_text(c, all, &j.text_len);
        enqueue(c, &j);
    }
    free(all);
    c->inflight = 0;
}

void ckpt_advance(Ckpt *c, int32_t any_writing) {
    if (c->inflight && !any_writing) finalize(c);
}

static void settle(Ckpt *c) { // the checkpoint in flight, finalized
    if (!c->inflight) return;
    wait_own_shard(c);
    finalize(c);
}

double ckpt_save(Ckpt *c, const CkptMeta *meta) {
    double t0 = now_seconds();
    settle(c);
    zero_state_to_host(c->zero, c->snap_master, c->snap_m, c->snap_v);
    c->meta = *meta;
    pthread_mutex_lock(&c->mu);
    c->shard_done = c->shard_failed = 0;
    pthread_mutex_unlock(&c->mu);
    c->inflight = 1;
    enqueue(c, &(Job){ .kind = JOB_SHARD, .step = meta->step });
    return now_seconds() - t0;
}

void ckpt_finish(Ckpt *c) {
    settle(c);
    pthread_mutex_lock(&c->mu); // rank 0: its manifest written
    while (c->qlen || c->busy) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

int ckpt_event(Ckpt *c, CkptEvent *ev) {
    pthread_mutex_lock(&c->mu);
    int got = c->nevents > 0;
    if (got) {
        *ev = c->events[0];
        memmove(c->events, c->events + 1, sizeof(CkptEvent) * (size_t)(--c->nevents));
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}

void ckpt_close(Ckpt *c) {
    ckpt_finish(c);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    runs_free(c->own);
    mem_free(&c->model->mem, c->snap_master);
    mem_free(&c->model->mem, c->snap_m);
    mem_free(&c->model->mem, c->snap_v);
    free(c);
}

// ---------------------------------------------------------------------------------------------
// the reader

enum { LOAD_OK, LOAD_INCOMPLETE, LOAD_UNUSABLE, LOAD_INCOMPATIBLE };

static uint32_t crc_of(const unsigned char *p, size_t n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < n;) {
        size_t take = n - done < (1u << 30) ? n - done : (1u << 30);
        crc = crc32(crc, p + done, (uInt)take);
        done += take;
    }
    return (uint32_t)crc;
}

// Numbers and strings of the manifest: 0 when a member is missing or of the wrong type.
static int get_int(json_t *o, const char *key, long long *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return 0;
    *out = json_integer_value(v);
    return 1;
}
static int get_num(json_t *o, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}
static int get_str(json_t *o, const char *key, char *out, size_t cap) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return 0;
    snprintf(out, cap, "%s", json_string_value(v));
    return 1;
}

// One field from the manifest's section o into mt: 0 when it is missing or of the wrong type.
static int meta_field(json_t *o, const MetaField *f, CkptMeta *mt) {
    char *p = (char *)mt + f->off;
    long long i;
    double d;
    switch (f->kind) {
    case MF_BOOL: { // written as a boolean; missing reads as false, anything else is refused
        json_t *v = json_object_get(o, f->key);
        if (v && !json_is_boolean(v)) return 0;
        *(int *)p = !v && f->optional ? (int)f->dflt : json_is_true(v); // optional: dflt when written before it
        return 1;
    }
    case MF_INT:
        if (!get_int(o, f->key, &i)) {
            if (!f->optional || json_object_get(o, f->key)) return 0;
            i = (long long)f->dflt;
        }
        if (f->size == 4 && (i < INT32_MIN || i > INT32_MAX)) return 0; // never truncated (2^32 + 4 is not 4)
        if (f->size == 4) *(int32_t *)p = (int32_t)i;
        else memcpy(p, &(int64_t){ (int64_t)i }, 8);
        return 1;
    case MF_REAL:
        if (!get_num(o, f->key, &d)) {
            if (!f->optional || json_object_get(o, f->key)) return 0;
            d = f->dflt;
        }
        if (f->size == 4) *(float *)p = (float)d;
        else *(double *)p = d;
        return 1;
    case MF_ARCH: { // by name: gpt2 when missing
        json_t *v = json_object_get(o, f->key);
        const char *name = v ? json_string_value(v) : ARCH_NAMES[ARCH_GPT2];
        if (!name) return 0;
        for (int a = 0; a < 2; a++)
            if (!strcmp(name, ARCH_NAMES[a])) return *(int *)p = a, 1;
        return 0;
    }
    default:
        if (f->optional && !json_object_get(o, f->key)) {
            *p = 0;
            return 1;
        }
        if (!json_is_string(json_object_get(o, f->key)) || strlen(json_string_value(json_object_get(o, f->key))) >= f->size)
            return 0;
        return get_str(o, f->key, p, f->size);
    }
}

// The --skip-spikes history: 0 when it is malformed.
static int parse_history(json_t *sk, CkptMeta *mt) {
    json_t *hl = json_object_get(sk, "loss"), *hn = json_object_get(sk, "norm");
    if (!json_is_array(hl) || !json_is_array(hn) || json_array_size(hl) != json_array_size(hn) ||
        json_array_size(hl) > SPIKE_WINDOW)
        return 0;
    mt->nhist = (int)json_array_size(hl);
    for (int k = 0; k < mt->nhist; k++) {
        if (!json_is_number(json_array_get(hl, k)) || !json_is_number(json_array_get(hn, k))) return 0;
        mt->hist_loss[k] = (float)json_number_value(json_array_get(hl, k));
        mt->hist_norm[k] = (float)json_number_value(json_array_get(hn, k));
    }
    return 1;
}

// The manifest's description of the run into meta; returns the member that is missing, or NULL. The
// manifest's own members first, then that every section is there, then the sections' members.
static const char *parse_meta(json_t *r, CkptMeta *mt) {
    long long i;
    memset(mt, 0, sizeof *mt);
    char s[64];
    if (!get_str(r, "format", s, sizeof s) || strcmp(s, FORMAT)) return "format";
    if (!get_int(r, "version", &i) || i != FORMAT_VERSION) return "version";
    for (size_t k = 0; k < N_META_FIELDS; k++)
        if (!META_FIELDS[k].section && !meta_field(r, &META_FIELDS[k], mt)) return META_FIELDS[k].key;
    for (size_t k = 0; k < N_META_FIELDS; k++) // (a section of optional members alone may be missing: older manifests)
        if (META_FIELDS[k].section && !META_FIELDS[k].optional && !json_is_object(json_object_get(r, META_FIELDS[k].section)))
            return META_FIELDS[k].section;
    for (size_t k = 0; k < N_META_FIELDS; k++) {
        const MetaField *f = &META_FIELDS[k];
        if (f->section && !meta_field(json_object_get(r, f->section), f, mt)) return f->key;
    }
    if (!parse_history(json_object_get(r, "skip_spikes"), mt)) return "skip_spikes";
    return NULL;
}

// The ranges of the fields parse_meta read (their types it checked): 0, or -1 with one line naming the
// first field out of range. What a writer could not have produced is refused before anything uses it.
static int validate_meta(const CkptMeta *mt, char *why, size_t cap) {
#define RANGE(name, x, lo, hi) \
    if ((x) < (lo) || (x) > (hi)) \
        return snprintf(why, cap, "%s = %lld is out of range (%lld to %lld)", name, (long long)(x), (long long)(lo), \
                        (long long)(hi)), -1;
#define REAL(name, x, lo, hi) \
    if (!((x) >= (lo) && (x) <= (hi))) return snprintf(why, cap, "%s = %g is out of range (%g to %g)", name, (double)(x), \
                                                       (double)(lo), (double)(hi)), -1;
    const GPT2Config *m = &mt->model;
    RANGE("step", mt->step, 0, INT32_MAX);
    RANGE("adam_t", mt->adam_t, 0, mt->step); // an update per step at most
    RANGE("model.layers", m->L, 1, INT32_MAX);
    RANGE("model.channels", m->C, 1, INT32_MAX);
    RANGE("model.heads", m->NH, 1, m->C);
    if (m->C % m->NH)
        return snprintf(why, cap, "model.heads = %d does not divide model.channels = %d", m->NH, m->C), -1;
    RANGE("model.vocab", m->V, 1, INT32_MAX);
    RANGE("model.padded_vocab", m->Vp, m->V, INT32_MAX);
    RANGE("model.max_seq_len", m->maxT, 1, INT32_MAX);
    char bad[256];
    if (!gpt2_config_valid(m, bad, sizeof bad)) return snprintf(why, cap, "model: %.200s", bad), -1;
    RANGE("layout.ranks", mt->ranks, 1, 1 << 24);
    RANGE("layout.dp", mt->dp, 1, mt->ranks);
    RANGE("layout.tp", mt->tp, 1, mt->ranks);
    RANGE("layout.pp", mt->pp, 1, mt->ranks);
    RANGE("layout.cp", mt->cp, 1, mt->ranks);
    if ((long long)mt->dp * mt->tp * mt->pp * mt->cp != mt->ranks) // each at most 2^24: the product fits
        return snprintf(why, cap, "layout: dp x tp x pp x cp = %d x %d x %d x %d is not layout.ranks = %d", mt->dp, mt->tp,
                        mt->pp, mt->cp, mt->ranks), -1;
    RANGE("layout.pp_virtual", mt->pp_virtual, 1, m->L);
    RANGE("layout.zero", mt->zero, 0, 3);
    REAL("layout.bucket_mb", mt->bucket_mb, 0, 1e6);
    if (strcmp(mt->dtype, "fp32") && strcmp(mt->dtype, "bf16"))
        return snprintf(why, cap, "layout.dtype = '%s' is not fp32 or bf16", mt->dtype), -1;
    RANGE("layout.micro_batch", mt->micro_batch, 1, 1 << 20);
    RANGE("layout.seq_len", mt->seq_len, 1, m->maxT);
    RANGE("layout.batch_tokens", mt->batch_tokens, mt->seq_len, (long long)1 << 40);
    if (mt->batch_tokens % mt->seq_len)
        return snprintf(why, cap, "layout.batch_tokens = %lld is not a multiple of layout.seq_len = %d", mt->batch_tokens,
                        mt->seq_len), -1;
    if (mt->train_tokens > (uint64_t)INT64_MAX) // read as a signed integer: a negative one
        return snprintf(why, cap, "data.tokens = %lld is negative", (long long)mt->train_tokens), -1;
    size_t nfp = strlen(mt->train_fp); // "" or 8 hex digits per shard, separated by one space
    for (size_t i = 0; i < nfp || (nfp && (nfp + 1) % 9); i++)
        if (i >= nfp || !strchr(i % 9 == 8 ? " " : "0123456789abcdef", mt->train_fp[i]))
            return snprintf(why, cap, "data.fingerprint is not 8 hexadecimal digits per shard, separated by spaces"), -1;
    if (strcmp(mt->schedule, "cosine") && strcmp(mt->schedule, "linear") && strcmp(mt->schedule, "constant"))
        return snprintf(why, cap, "optimizer.schedule = '%s' is not cosine, linear or constant", mt->schedule), -1;
    REAL("optimizer.lr", mt->lr, 0, 1e3);
    REAL("optimizer.lr_min_frac", mt->lr_min_frac, 0, 1);
    RANGE("optimizer.warmup", mt->warmup, 0, INT32_MAX);
    RANGE("optimizer.steps", mt->steps, 0, INT32_MAX);
    REAL("optimizer.beta1", mt->beta1, 0, 1);
    REAL("optimizer.beta2", mt->beta2, 0, 1);
    REAL("optimizer.eps", mt->eps, 0, 1);
    REAL("optimizer.weight_decay", mt->weight_decay, 0, 1e3);
    REAL("optimizer.clip", mt->clip, 0, 1e30);
    REAL("skip_spikes.threshold", mt->skip_spikes, 0, 1e30);
    RANGE("skip_spikes.skipped", mt->skipped, 0, mt->step);
    for (int k = 0; k < mt->nhist; k++) {
        REAL("skip_spikes.loss", mt->hist_loss[k], -FLT_MAX, FLT_MAX); // the applied steps': finite
        REAL("skip_spikes.norm", mt->hist_norm[k], 0, FLT_MAX);
    }
#undef RANGE
#undef REAL
    return 0;
}

// What a run cannot change and still continue the checkpoint: the model and the data order.
static int compatible(const char *d, const CkptMeta *a, const CkptMeta *now, char *why, size_t cap) {
    const GPT2Config *x = &a->model, *y = &now->model;
    char sx[96], sy[96];
    if (x->V != y->V)
        return snprintf(why, cap, "checkpoint %s holds a model with a vocabulary of %d, this run's has %d", d, x->V, y->V), 0;
    if (x->L != y->L || x->C != y->C || x->NH != y->NH || x->maxT != y->maxT || x->Vp != y->Vp)
        return snprintf(why, cap, "checkpoint %s holds another model shape (layers %d, channels %d, heads %d, max seq len %d, "
                        "padded vocabulary %d; this run: %d, %d, %d, %d, %d)", d, x->L, x->C, x->NH, x->maxT, x->Vp, y->L, y->C,
                        y->NH, y->maxT, y->Vp), 0;
    if (x->arch != y->arch || x->NKV != y->NKV || x->F != y->F || x->tie != y->tie || x->norm_eps != y->norm_eps ||
        x->rope.theta != y->rope.theta || x->rope.factor != y->rope.factor || x->rope.low_freq_factor != y->rope.low_freq_factor ||
        x->rope.high_freq_factor != y->rope.high_freq_factor || x->rope.original_max_pos != y->rope.original_max_pos)
        return snprintf(why, cap, "checkpoint %s holds another model (%s, kv heads %d, ffn %d, tied %d, norm eps %g, rope theta "
                        "%g, rope scaling %s; this run: %s, %d, %d, %d, %g, %g, %s)", d, ARCH_NAMES[x->arch], x->NKV, x->F, x->tie,
                        x->norm_eps, x->rope.theta, rope_scaling_text(&x->rope, sx, sizeof sx), ARCH_NAMES[y->arch], y->NKV, y->F,
                        y->tie, y->norm_eps, y->rope.theta, rope_scaling_text(&y->rope, sy, sizeof sy)), 0;
    if (a->seq_len != now->seq_len || a->batch_tokens != now->batch_tokens)
        return snprintf(why, cap, "checkpoint %s was trained with --seq-len %d --batch-tokens %lld, this run has %d and %lld: "
                        "the data position would not carry over", d, a->seq_len, a->batch_tokens, now->seq_len,
                        now->batch_tokens), 0;
    if (a->shuffle != now->shuffle)
        return snprintf(why, cap, "checkpoint %s was trained %s --shuffle, this run %s it: the data order would not carry "
                        "over", d, a->shuffle ? "with" : "without", now->shuffle ? "has" : "lacks"), 0;
    if (a->shuffle && a->seed != now->seed)
        return snprintf(why, cap, "checkpoint %s was shuffled with --seed %llu, this run has %llu: the data order would not "
                        "carry over", d, (unsigned long long)a->seed, (unsigned long long)now->seed), 0;
    if (now->train_tokens && a->train_tokens != now->train_tokens)
        return snprintf(why, cap, "checkpoint %s was trained on %llu tokens of --train data, this run's has %llu", d,
                        (unsigned long long)a->train_tokens, (unsigned long long)now->train_tokens), 0;
    return 1;
}

// One tensor's values from a shard: src holds len values of each of the runs rs (full coordinates), in
// run order; need holds this rank's runs of the same tensor, sorted by full position.
static uint64_t scatter(const Runs *need, const int64_t *pairs, size_t nruns, const unsigned char *src[3], float *dst[3]) {
    uint64_t copied = 0, pos = 0;
    for (size_t i = 0; i < nruns; i++) {
        uint64_t fs = (uint64_t)pairs[2 * i], len = (uint64_t)pairs[2 * i + 1], fe = fs + len;
        size_t lo = 0, hi = need->n; // the first needed run that ends after fs
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (need->r[mid].full + need->r[mid].len <= fs) lo = mid + 1;
            else hi = mid;
        }
        for (size_t j = lo; j < need->n && need->r[j].full < fe; j++) {
            const Run *n = &need->r[j];
            uint64_t a = n->full > fs ? n->full : fs, e = n->full + n->len < fe ? n->full + n->len : fe;
            for (int q = 0; q < 3; q++)
                memcpy(dst[q] + n->state + (a - n->full), src[q] + 4 * (pos + (a - fs)), 4 * (e - a));
            copied += e - a;
        }
        pos += len;
    }
    return copied;
}

// Every shard's runs of one tensor, to check that together they tile it: each element in exactly one.
typedef struct {
    uint64_t full, len;
    int rank;
} Tile;
typedef struct {
    Tile *t;
    size_t n, cap;
} Tiles;

static void tiles_add(Tiles *ts, uint64_t full, uint64_t len, int rank) {
    if (ts->n == ts->cap) {
        ts->cap = ts->cap ? 2 * ts->cap : 64;
        ts->t = realloc(ts->t, ts->cap * sizeof(Tile));
        if (!ts->t) die("out of memory");
    }
    ts->t[ts->n++] = (Tile){ full, len, rank };
}

static int by_tile(const void *a, const void *b) {
    const Tile *x = a, *y = b;
    if (x->full != y->full) return x->full < y->full ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

// 0 when the runs of tensor k (full elements) cover it without gap or overlap, else -1 with why.
static int check_tiling(const char *d, int k, Tiles *ts, uint64_t full, char *why, size_t cap) {
    if (ts->n) qsort(ts->t, ts->n, sizeof(Tile), by_tile);
    uint64_t pos = 0;
    int prev = -1;
    for (size_t i = 0; i < ts->n; i++) {
        const Tile *t = &ts->t[i];
        if (!t->len) continue;
        if (t->full < pos)
            return snprintf(why, cap, "%s: the runs of %s overlap: element %llu is in rank_%05d.safetensors and in "
                            "rank_%05d.safetensors", d, PARAM_NAMES[k], (unsigned long long)t->full, prev, t->rank), -1;
        if (t->full > pos) break;
        pos = t->full + t->len;
        prev = t->rank;
    }
    if (pos < full) {
        uint64_t e = full;
        for (size_t i = 0; i < ts->n; i++)
            if (ts->t[i].len && ts->t[i].full > pos) {
                e = ts->t[i].full;
                break;
            }
        return snprintf(why, cap, "%s: elements [%llu, %llu) of %s are in no shard", d, (unsigned long long)pos,
                        (unsigned long long)e, PARAM_NAMES[k]), -1;
    }
    return 0;
}

// Tensor k of a shard (header h, data of dlen bytes): its runs and values into this rank's arrays;
// returns 0 (also when the shard holds none of it), or -1 with why (naming the file).
static int read_tensor(const char *file, json_t *h, const unsigned char *data, uint64_t dlen, int k, const GPT2Config *cfg,
                       const Runs need[NUM_PARAM_TENSORS], float *dst[3], uint64_t copied[NUM_PARAM_TENSORS], Tiles *tiles,
                       int rank, char *why, size_t cap) {
    static const char *const what[] = { "runs", "master", "m", "v" };
    const unsigned char *p[4];
    uint64_t n[4];
    int present = 0;
    for (int q = 0; q < 4; q++) {
        char key[32];
        snprintf(key, sizeof key, "%s.%s", PARAM_NAMES[k], what[q]);
        json_t *t = json_object_get(h, key), *off = json_object_get(t, "data_offsets");
        if (!t) continue;
        present++;
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        json_t *shape = json_object_get(t, "shape");
        json_int_t a = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
        json_int_t n0 = json_integer_value(json_array_get(shape, 0));
        size_t es = q == 0 ? 16 : 4;
        if (!dt || strcmp(dt, q == 0 ? "I64" : "F32") || json_array_size(shape) != (q == 0 ? 2u : 1u) || a < 0 ||
            e < a || (uint64_t)e > dlen || n0 < 0 || (uint64_t)n0 > dlen / es || (uint64_t)(e - a) != (uint64_t)n0 * es) {
            snprintf(why, cap, "%s: malformed tensor %s", file, key);
            return -1;
        }
        p[q] = data + a;
        n[q] = (uint64_t)n0;
    }
    if (present == 0) return 0;
    if (present != 4) {
        snprintf(why, cap, "%s: tensor %s lacks some of runs, master, m and v", file, PARAM_NAMES[k]);
        return -1;
    }
    int64_t d[3];
    int nd = gpt2_tensor_shape(cfg, k, d);
    uint64_t full = nd ? 1 : 0, total = 0;
    for (int i = 0; i < nd; i++) full *= (uint64_t)d[i];
    int64_t *pairs = xmalloc(n[0] * 16 + 16);
    memcpy(pairs, p[0], n[0] * 16);
    for (uint64_t i = 0; i < n[0]; i++) {
        if (pairs[2 * i] < 0 || pairs[2 * i + 1] < 0 || (uint64_t)pairs[2 * i] + (uint64_t)pairs[2 * i + 1] > full) {
            free(pairs);
            snprintf(why, cap, "%s: run %llu of %s lies outside the tensor", file, (unsigned long long)i, PARAM_NAMES[k]);
            return -1;
        }
        total += (uint64_t)pairs[2 * i + 1];
        tiles_add(tiles, (uint64_t)pairs[2 * i], (uint64_t)pairs[2 * i + 1], rank);
    }
    if (total != n[1] || total != n[2] || total != n[3]) {
        free(pairs);
        snprintf(why, cap, "%s: the runs of %s cover %llu elements, its values %llu", file, PARAM_NAMES[k],
                 (unsigned long long)total, (unsigned long long)n[1]);
        return -1;
    }
    const unsigned char *src[3] = { p[1], p[2], p[3] };
    copied[k] += scatter(&need[k], pairs, n[0], src, dst);
    free(pairs);
    return 0;
}

// Reads one shard into this rank's arrays; returns 0, or -1 with why (naming the file).
static int read_shard(const char *file, const unsigned char *buf, size_t len, const CkptMeta *mt, int rank,
                      const GPT2Config *cfg, const Runs need[NUM_PARAM_TENSORS], float *dst[3],
                      uint64_t copied[NUM_PARAM_TENSORS], Tiles tiles[NUM_PARAM_TENSORS], char *why, size_t cap) {
    StFile sf;
    if (st_parse(file, buf, len, &sf, why, cap) != 0) return -1;
    json_t *h = sf.header;
    const unsigned char *data = sf.data;
    uint64_t dlen = sf.data_len;

    int rc = -1;
    json_t *meta = json_object_get(h, "__metadata__");
    char s[64] = "", want[32];
    snprintf(want, sizeof want, "%lld", (long long)mt->step);
    if (!get_str(meta, "format", s, sizeof s) || strcmp(s, FORMAT)) {
        snprintf(why, cap, "%s: not an llm4d checkpoint shard", file);
        goto out;
    }
    if (!get_str(meta, "step", s, sizeof s) || strcmp(s, want)) {
        snprintf(why, cap, "%s: holds step %s, the manifest says %s", file, s, want);
        goto out;
    }
    snprintf(want, sizeof want, "%d", rank);
    if (!get_str(meta, "rank", s, sizeof s) || strcmp(s, want)) {
        snprintf(why, cap, "%s: holds rank %s, the manifest says %s", file, s, want);
        goto out;
    }
    for (int k = 0; k < NUM_PARAM_TENSORS; k++)
        if (read_tensor(file, h, data, dlen, k, cfg, need, dst, copied, &tiles[k], rank, why, cap) != 0) goto out;
    rc = 0;
out:
    json_decref(h);
    return rc;
}

// Every shard of the manifest's list (at path, in directory d) into this rank's arrays, their runs into
// tiles: 0, or -1 with why.
static int load_shards(const char *d, const char *path, json_t *shards, const CkptMeta *mt, const GPT2 *model,
                       const Runs need[NUM_PARAM_TENSORS], float *dst[3], Tiles tiles[NUM_PARAM_TENSORS], char *why,
                       size_t cap) {
    struct stat st;
    unsigned char *buf;
    size_t len;
    uint64_t copied[NUM_PARAM_TENSORS] = { 0 };
    for (int q = 0; q < mt->ranks; q++) {
        json_t *s = json_array_get(shards, (size_t)q);
        char name[256], file[SAFE_PATH_MAX + 300];
        long long bytes, scrc, srank;
        if (!get_str(s, "file", name, sizeof name) || strchr(name, '/') || !get_int(s, "bytes", &bytes) ||
            !get_int(s, "crc32", &scrc) || scrc < 0 || scrc > UINT32_MAX || !get_int(s, "rank", &srank) || srank != q) {
            snprintf(why, cap, "%s: malformed shard entry %d", path, q);
            return -1;
        }
        snprintf(file, sizeof file, "%s/%s", d, name);
        if (stat(file, &st) != 0) {
            snprintf(why, cap, "%s: %s (a missing shard)", file, strerror(errno));
            return -1;
        }
        if ((long long)st.st_size != bytes) {
            snprintf(why, cap, "%s: %s: %lld bytes, the manifest says %lld", file,
                     (long long)st.st_size < bytes ? "truncated" : "too long", (long long)st.st_size, bytes);
            return -1;
        }
        if (st_read_file(file, &buf, &len, SIZE_MAX, why, cap) != 0) return -1;
        uint32_t got = crc_of(buf, len);
        if (got != (uint32_t)scrc) {
            free(buf);
            snprintf(why, cap, "%s: checksum mismatch (crc32 %08x, the manifest says %08x)", file, got, (uint32_t)scrc);
            return -1;
        }
        int rc = read_shard(file, buf, len, mt, q, &model->cfg, need, dst, copied, tiles, why, cap);
        free(buf);
        if (rc != 0) return -1;
    }
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        int64_t dim[3];
        int nd = gpt2_tensor_shape(&model->cfg, k, dim);
        uint64_t full = nd ? 1 : 0;
        for (int i = 0; i < nd; i++) full *= (uint64_t)dim[i];
        if (check_tiling(d, k, &tiles[k], full, why, cap) != 0) return -1;
    }
    for (int k = 0; k < NUM_PARAM_TENSORS; k++)
        if (copied[k] != need[k].elems) {
            snprintf(why, cap, "%s: the shards hold %llu of the %llu elements of %s this rank needs", d,
                     (unsigned long long)copied[k], (unsigned long long)need[k].elems, PARAM_NAMES[k]);
            return -1;
        }
    return 0;
}

// Loads checkpoint directory d; returns a LOAD_ code with why.
// Reads, verifies (checksum, types, ranges) and parses checkpoint d's manifest: the JSON root in *root
// (the caller's to free) and its fields in mt; LOAD_OK, or LOAD_INCOMPLETE / LOAD_UNUSABLE with why.
static int read_manifest(const char *d, CkptMeta *mt, json_t **root, char *why, size_t cap) {
    char path[SAFE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/" MANIFEST, d);
    *root = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return snprintf(why, cap, "%s/" MANIFEST ": missing (an incomplete checkpoint)", d), LOAD_INCOMPLETE;
    unsigned char *buf;
    size_t len;
    if (st_read_file(path, &buf, &len, (size_t)64 << 20, why, cap) != 0) return LOAD_UNUSABLE;
    const char *key = NULL;
    for (const char *p = (const char *)buf; (p = strstr(p, CRC_KEY)); p++) key = p;
    if (!key) {
        free(buf);
        return snprintf(why, cap, "%s: no manifest_crc32 (%s)", path, len ? "truncated, or not a manifest" : "empty"), LOAD_UNUSABLE;
    }
    uint32_t crc = crc_of(buf, (size_t)(key - (const char *)buf));
    json_error_t jerr;
    json_t *r = json_loadb((const char *)buf, len, 0, &jerr);
    free(buf);
    if (!r) return snprintf(why, cap, "%s: not valid JSON (line %d: %s)", path, jerr.line, jerr.text), LOAD_UNUSABLE;
    long long want = -1;
    const char *bad;
    char range[256];
    if (!get_int(r, "manifest_crc32", &want) || want < 0 || want > UINT32_MAX || (uint32_t)want != crc)
        snprintf(why, cap, "%s: checksum mismatch (crc32 %08x, manifest_crc32 says %08x)", path, crc, (uint32_t)want);
    else if ((bad = parse_meta(r, mt)))
        snprintf(why, cap, "%s: missing or malformed '%s' (not of its type, or beyond its type's range)", path, bad);
    else if (validate_meta(mt, range, sizeof range) != 0)
        snprintf(why, cap, "%s: %s", path, range);
    else
        return *root = r, LOAD_OK;
    json_decref(r);
    return LOAD_UNUSABLE;
}

int ckpt_read_meta(const char *d, CkptMeta *mt, char *why, size_t cap) {
    json_t *r;
    int code = read_manifest(d, mt, &r, why, cap);
    json_decref(r);
    return code == LOAD_OK ? 0 : -1;
}

static int load_one(const char *d, const GPT2 *model, const Runs need[NUM_PARAM_TENSORS], const CkptMeta *now, CkptMeta *mt,
                    float *dst[3], char *why, size_t cap) {
    char path[SAFE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/" MANIFEST, d);
    json_t *r;
    int code = read_manifest(d, mt, &r, why, cap);
    if (code != LOAD_OK) return code;
    code = LOAD_UNUSABLE;
    Tiles tiles[NUM_PARAM_TENSORS] = { 0 };
    if (!compatible(d, mt, now, why, cap)) {
        code = LOAD_INCOMPATIBLE;
        goto out;
    }
    json_t *shards = json_object_get(r, "shards");
    if (!json_is_array(shards) || json_array_size(shards) != (size_t)mt->ranks) {
        snprintf(why, cap, "%s: the shard list does not hold the %d ranks", path, mt->ranks);
        goto out;
    }
    if (load_shards(d, path, shards, mt, model, need, dst, tiles, why, cap) != 0) goto out;
    // a crc that verifies says the bytes are the writer's, not that they are a state to train on
    const char *what[3] = { "master weight", "first moment", "second moment" };
    for (int q = 0; q < 3; q++)
        for (size_t i = 0; i < model->num_params; i++)
            if (!isfinite(dst[q][i]) || (q == 2 && dst[q][i] < 0)) {
                snprintf(why, cap, "%s: a %s of this rank's state is %g (element %zu of %zu): not a state to train from", d, what[q],
                         (double)dst[q][i], i, model->num_params);
                goto out;
            }
    code = LOAD_OK;
out:
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) free(tiles[k].t);
    json_decref(r);
    return code;
}

static int32_t reduce_i32(Comm *world, int32_t x, CommOp op) {
    if (!world) return x;
    int32_t y;
    comm_all_reduce(world, &x, &y, 1, CT_I32, op);
    return y;
}
// The lowest rank for which `yes` holds, -1 for none: the one that reports, in one line (no OP_MIN).
static int lowest_rank_where(Comm *world, int rank, int yes) {
    int32_t minus = reduce_i32(world, yes ? -rank : INT32_MIN, OP_MAX);
    return minus == INT32_MIN ? -1 : -minus;
}

// Moves an unusable checkpoint out of the way (ckpt_S to ckpt_S.bad, or .bad.1, .bad.2, ... when that
// exists), so that the resumed run can write its own checkpoint of step S; kept, not removed: it is
// evidence, and perhaps repairable. Rank 0, under the directory's lock.
static void move_aside(const char *d) {
    char to[SAFE_PATH_MAX + 32];
    for (int i = 0; i < 1000; i++) {
        if (i) snprintf(to, sizeof to, "%s.bad.%d", d, i);
        else snprintf(to, sizeof to, "%s.bad", d);
        struct stat st;
        if (lstat(to, &st) == 0) continue; // rename would replace an empty directory
        if (rename(d, to) == 0) printf("moved the unusable checkpoint %s aside to %s\n", d, to);
        else fprintf(stderr, "warning: cannot move the unusable checkpoint %s aside to %s: %s\n", d, to, strerror(errno));
        fflush(stdout);
        return;
    }
    fprintf(stderr, "warning: the unusable checkpoint %s stays: %s.bad to .bad.999 all exist\n", d, d);
}

int ckpt_resume(const char *dir, const char *path, const char *flag, const GPT2 *model, Comm *world, const CkptMeta *now, CkptMeta *meta,
                float *master, float *m, float *v, char *from, size_t from_cap) {
    int rank = world ? comm_rank(world) : 0;
    int64_t *steps = NULL, n = 1;
    if (path) { // a checkpoint named: it must be a directory (what is in it, load_one checks)
        char buf[SAFE_PATH_MAX + 64];
        const char *bad = ckpt_named_problem(path, buf, sizeof buf);
        int lowest = lowest_rank_where(world, rank, bad != NULL);
        if (lowest >= 0) {
            if (rank == lowest) die("%s %s: %s", flag, path, bad);
            exit(1);
        }
    }
    if (!path) { // rank 0 lists, so that every rank tries the same checkpoints in the same order
        int cnt = rank == 0 ? list_steps(dir, &steps) : 0;
        n = cnt;
        if (world) comm_broadcast(world, &n, 1, CT_I64, 0);
        if (rank != 0) steps = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
        if (world && n) comm_broadcast(world, steps, (size_t)n, CT_I64, 0);
    }
    Runs need[NUM_PARAM_TENSORS] = { 0 };
    if (n) {
        collect_runs(model, 0, model->num_params, 0, 0, need);
        for (int k = 0; k < NUM_PARAM_TENSORS; k++)
            if (need[k].n) qsort(need[k].r, need[k].n, sizeof(Run), by_full); // none for a tensor the arch lacks
    }
    int found = 0, any_complete = 0;
    char why[2 * SAFE_PATH_MAX], d[SAFE_PATH_MAX];
    // the unusable ones, moved aside only once one before them is usable: with none usable they stay
    // where they are, so that a relaunch (--max-restarts, a Slurm job step's --resume) finds them and
    // refuses again, where with them moved it would find nothing and start from step 0
    int64_t *unusable = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
    int nunusable = 0;
    for (int64_t i = 0; i < n && !found; i++) {
        if (path) snprintf(d, sizeof d, "%s", path);
        else ckpt_path(dir, steps[i], d, sizeof d);
        size_t bytes = sizeof(float) * model->num_params;
        memset(master, 0, bytes); // internal padding stays zero
        memset(m, 0, bytes);
        memset(v, 0, bytes);
        float *dst[3] = { master, m, v };
        int code = load_one(d, model, need, now, meta, dst, why, sizeof why);
        int worst = reduce_i32(world, code, OP_MAX);
        if (worst == LOAD_OK) {
            found = 1;
            break;
        }
        int lowest = lowest_rank_where(world, rank, code == worst); // it says why
        any_complete |= worst != LOAD_INCOMPLETE;
        if (worst == LOAD_INCOMPATIBLE || path) {
            if (rank == lowest) die("%s%s%s", worst == LOAD_INCOMPATIBLE ? "" : flag, worst == LOAD_INCOMPATIBLE ? "" : ": ", why);
            exit(1);
        }
        if (rank == lowest)
            fprintf(stderr, "warning: checkpoint unusable: %s; %s\n", why, i + 1 < n ? "trying the one before it" : "there is none before it");
        if (worst == LOAD_UNUSABLE) unusable[nunusable++] = steps[i];
    }
    runs_free(need);
    if (!found && any_complete) {
        if (rank == 0)
            die("--resume: none of the %lld checkpoint(s) in %s is usable (see above); they stay where they are", (long long)n, dir);
        exit(1);
    }
    for (int k = 0; found && rank == 0 && k < nunusable; k++) { // every rank has finished reading them
        char u[SAFE_PATH_MAX];
        ckpt_path(dir, unusable[k], u, sizeof u);
        move_aside(u);
    }
    free(unusable);
    if (found) snprintf(from, from_cap, "%s", d);
    free(steps);
    return found;
}

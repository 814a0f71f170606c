// mem.c: the counting allocator (see mem.h).
#include "mem.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "hostmem.h"

const char *const MEM_NAMES[MEM_NCAT] = { "weights", "gradients", "optimizer", "activations", "recompute scratch",
                                          "comm buffers", "other" };
const char *const MEM_KEYS[MEM_NCAT] = { "weights", "gradients", "optimizer", "activations", "recompute", "comm", "other" };

void mem_init(MemAccount *a, const Backend *be) {
    memset(a, 0, sizeof *a);
    a->be = be;
    a->dry = be == backend_dry(MEMKIND_HOST) || be == backend_dry(MEMKIND_DEVICE);
    a->host_is_device = be->mem_kind == MEMKIND_HOST;
    a->next_fake = (uintptr_t)1 << 32;
    if (pthread_mutex_init(&a->mu, NULL) != 0) die("pthread_mutex_init failed");
}

void mem_destroy(MemAccount *a) {
    free(a->blocks);
    pthread_mutex_destroy(&a->mu);
    a->blocks = NULL;
    a->nblocks = a->cap = 0;
}

size_t mem_sum(const size_t bytes[MEM_NCAT]) {
    size_t s = 0;
    for (int c = 0; c < MEM_NCAT; c++) s += bytes[c];
    return s;
}

// The table: linear probing on a hash of the address, deletion by backward shift (no tombstones).
static size_t home(const MemAccount *a, const void *p) { return (size_t)(mix64((uintptr_t)p) & (a->cap - 1)); }

static void table_put(MemAccount *a, MemBlock b) {
    if (2 * (a->nblocks + 1) > a->cap) { // keep the load at most 1/2
        MemBlock *old = a->blocks;
        size_t oldcap = a->cap;
        a->cap = oldcap ? 2 * oldcap : 64;
        a->blocks = xcalloc(a->cap, sizeof(MemBlock));
        a->nblocks = 0;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].p) table_put(a, old[i]);
        free(old);
    }
    size_t i = home(a, b.p);
    while (a->blocks[i].p) i = (i + 1) & (a->cap - 1);
    a->blocks[i] = b;
    a->nblocks++;
}

static int table_take(MemAccount *a, const void *p, MemBlock *out) {
    if (!a->cap) return 0;
    size_t i = home(a, p);
    while (a->blocks[i].p && a->blocks[i].p != p) i = (i + 1) & (a->cap - 1);
    if (!a->blocks[i].p) return 0;
    *out = a->blocks[i];
    // shift later members of the cluster back into the hole when their home allows it
    size_t hole = i, j = i;
    for (;;) {
        j = (j + 1) & (a->cap - 1);
        if (!a->blocks[j].p) break;
        size_t h = home(a, a->blocks[j].p);
        int movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
        if (movable) {
            a->blocks[hole] = a->blocks[j];
            hole = j;
        }
    }
    a->blocks[hole] = (MemBlock){ 0 };
    a->nblocks--;
    return 1;
}

static void count(MemAccount *a, const MemBlock *b, int sign) {
    if (b->host && !a->host_is_device) return; // host memory beside a GPU is not the device's
    if (sign > 0) {
        a->cur[b->cat] += b->bytes;
        a->cur_total += b->bytes;
        if (a->cur[b->cat] > a->peak[b->cat]) a->peak[b->cat] = a->cur[b->cat];
        if (a->cur_total > a->peak_total) a->peak_total = a->cur_total;
    } else {
        a->cur[b->cat] -= b->bytes;
        a->cur_total -= b->bytes;
    }
}

static void *take_memory(MemAccount *a, int cat, size_t bytes, const char *what, int host) {
    if (cat < 0 || cat >= MEM_NCAT) die("internal: memory category %d for %s", cat, what);
    pthread_mutex_lock(&a->mu);
    void *p;
    if (a->dry) {
        p = (void *)a->next_fake;
        a->next_fake += (bytes + 127) / 64 * 64; // distinct, 64-byte aligned, never adjacent
    } else if (host) {
        p = hostmem_alloc(bytes);
        if (!p) die("out of host memory allocating %zu bytes for %s", bytes, what);
    } else {
        p = a->be->alloc(bytes);
        if (!p) die("out of %s memory allocating %zu bytes for %s", a->be->name, bytes, what);
    }
    MemBlock b = { p, bytes, cat, host };
    table_put(a, b);
    count(a, &b, 1);
    pthread_mutex_unlock(&a->mu);
    return p;
}

void *mem_alloc(MemAccount *a, int cat, size_t bytes, const char *what) { return take_memory(a, cat, bytes, what, 0); }
void *mem_host_alloc(MemAccount *a, int cat, size_t bytes, const char *what) { return take_memory(a, cat, bytes, what, 1); }

void mem_free(MemAccount *a, void *p) {
    if (!p) return;
    pthread_mutex_lock(&a->mu);
    MemBlock b;
    if (!table_take(a, p, &b)) die("internal: freeing memory this account did not allocate");
    count(a, &b, -1);
    pthread_mutex_unlock(&a->mu);
    if (a->dry) return;
    if (b.host) hostmem_free(p);
    else a->be->free(p);
}

// ---------------------------------------------------------------------------------------------
// the dry backend

static void *dry_alloc(size_t bytes) {
    (void)bytes;
    die("internal: the dry backend allocates through a dry account only");
}
static void dry_free(void *p) { (void)p; }
static void dry_copy(void *dst, const void *src, size_t bytes) { (void)dst, (void)src, (void)bytes; }
static void dry_zero(void *dst, size_t bytes) { (void)dst, (void)bytes; }
static void dry_sync(void) {}
static void dry_set_threads(int n) { (void)n; }
static size_t dry_scratch_bytes(void) { return 0; }
static void dry_cast(void *dst, DType dst_dt, const void *src, DType src_dt, size_t n) {
    (void)dst, (void)dst_dt, (void)src, (void)src_dt, (void)n;
}

static const Backend DRY_HOST = { .name = "dry (cpu)", .mem_kind = MEMKIND_HOST, .alloc = dry_alloc, .free = dry_free,
                                  .to_device = dry_copy, .to_host = dry_copy, .copy = dry_copy, .zero = dry_zero,
                                  .sync = dry_sync, .set_threads = dry_set_threads, .scratch_bytes = dry_scratch_bytes,
                                  .cast = dry_cast };
static const Backend DRY_DEVICE = { .name = "dry (gpu)", .mem_kind = MEMKIND_DEVICE, .alloc = dry_alloc, .free = dry_free,
                                    .to_device = dry_copy, .to_host = dry_copy, .copy = dry_copy, .zero = dry_zero,
                                    .sync = dry_sync, .set_threads = dry_set_threads, .scratch_bytes = dry_scratch_bytes,
                                    .cast = dry_cast };

const Backend *backend_dry(MemKind kind) { return kind == MEMKIND_HOST ? &DRY_HOST : &DRY_DEVICE; }

// mem.h: a rank's memory by category, as allocated: a counting allocator with current and peak bytes
// per category.
//
// Every buffer of the model, the optimizer, the pipeline, the checkpoint writer and the collectives'
// work areas is allocated through one MemAccount, which records its category. Device memory comes from
// the backend (mem_alloc; on the CPU, registered host memory: hostmem.h); host buffers that play a
// device buffer's part (checkpoint staging, the collectives' work areas) come from mem_host_alloc,
// registered host memory too, so that the ranks of a node read them in place, and count where the
// device is the host (the CPU backend), not on a GPU.
//
// A dry account allocates nothing: it hands out distinct fake addresses and only counts. With the dry
// backend (whose copies are no-ops) the trainer's own builders then describe a layout that is not
// running: this is how `./train plan --exact` counts llm4d's buffers, so its figures cannot drift from
// the code that allocates them. A dry address must never be dereferenced.
#ifndef LLM4D_MEM_H
#define LLM4D_MEM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

enum { MEM_WEIGHTS, MEM_GRADS, MEM_OPTIMIZER, MEM_ACTIVATIONS, MEM_RECOMPUTE, MEM_COMM, MEM_OTHER, MEM_NCAT };
extern const char *const MEM_NAMES[MEM_NCAT]; // for people: "weights", ..., "recompute scratch", "comm buffers"
extern const char *const MEM_KEYS[MEM_NCAT];  // for JSON: "weights", ..., "recompute", "comm", "other"

typedef struct {
    const void *p;
    size_t bytes;
    int cat, host; // host: from mem_host_alloc
} MemBlock;

typedef struct {
    const Backend *be;
    int dry;            // count only (see above)
    int host_is_device; // host buffers count: the backend's memory is host memory
    size_t cur[MEM_NCAT], peak[MEM_NCAT];
    size_t cur_total, peak_total; // all categories together (peak_total <= the sum of the peaks)
    MemBlock *blocks;             // open-addressing table of the live blocks, keyed by address
    size_t nblocks, cap;
    uintptr_t next_fake; // dry: the next fake address
    pthread_mutex_t mu;  // the collectives' progress threads may grow their buffers
} MemAccount;

// be: the backend whose memory this account hands out; with a dry backend (backend_dry) the account is
// dry: it counts only.
void mem_init(MemAccount *a, const Backend *be);
void mem_destroy(MemAccount *a); // forgets the table; frees nothing
// Zeroed device memory of the backend; dies naming `what` when the device is out of memory.
void *mem_alloc(MemAccount *a, int cat, size_t bytes, const char *what);
// Zeroed registered host memory (hostmem.h); counted in cat where host_is_device, tracked apart otherwise.
void *mem_host_alloc(MemAccount *a, int cat, size_t bytes, const char *what);
void mem_free(MemAccount *a, void *p); // either kind; NULL is ignored
size_t mem_sum(const size_t bytes[MEM_NCAT]);

// A backend for dry accounts: copies, zeroing, casts and syncs do nothing, and nothing else may be
// called. kind says which kind of device it stands for (MEMKIND_HOST: the CPU, MEMKIND_DEVICE: a GPU).
const Backend *backend_dry(MemKind kind);

#endif

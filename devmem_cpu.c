// devmem_cpu.c: the CPU stand-in for device memory in the collectives (devmem.h), for tests. Below
// the transports that use a DevMem; it reduces with the host's reductions (reduce.h) and takes its
// marks from the CPU backend's events (kernels.h).
//
// Its memory is registered host memory (hostmem.h), so that peers on the node can open it the way
// CUDA IPC opens a device allocation, but the pointers it hands out are the host addresses plus
// 2^62: not canonical x86-64 addresses, so any host load or store through one faults at once. Only
// the stand-in's own operations (copy, reduce, finish) translate them back. A test that passes with
// it shows that the collectives never touch device bytes on the host.
//
// Its marks follow the backend's event protocol (the CPU backend's event stand-ins: recorded before
// anything asks about them) and pass only on the second look, so every path that must wait for queued
// device work (a peer's read before the step flag, a finished chunk before the peers gather it, the
// compute stream before an operation starts) is taken in every run, deterministically.
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "devmem.h"
#include "hostmem.h"
#include "kernels.h"
#include "reduce.h"

#define FAKE_BIT ((uintptr_t)1 << 62)

struct DevMark {
    BackendEvent *e;
    int looks;
};

static _Atomic long g_marks, g_released;

static int fake_owns(const void *p) { return ((uintptr_t)p & FAKE_BIT) != 0; }
static void *real(const void *p) { return (void *)((uintptr_t)p & ~FAKE_BIT); }
static void *fake(const void *p) { return (void *)((uintptr_t)p | FAKE_BIT); }

static void *fake_alloc(size_t bytes) {
    void *p = hostmem_alloc(bytes);
    return p ? fake(p) : NULL;
}
static void fake_free(void *p) {
    if (p) hostmem_free(real(p));
}
static void *fake_host_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) return NULL;
    return p;
}

static int fake_export(const void *p, size_t bytes, DevHandle *h) {
    HostMemHandle hh;
    if (!fake_owns(p) || !hostmem_find(real(p), bytes, &hh)) return 0;
    memset(h, 0, sizeof *h);
    h->id = hh.seg_id;
    h->alloc_bytes = hh.seg_bytes;
    h->offset = hh.offset;
    memcpy(h->blob, &hh, sizeof hh);
    return 1;
}

static const void *fake_open(pid_t owner, const DevHandle *h, char *why, size_t cap) {
    HostMemHandle hh;
    memcpy(&hh, h->blob, sizeof hh);
    const void *p = hostmem_peer_view(owner, &hh, why, cap);
    return p ? fake(p) : NULL;
}

static void fake_copy(void *dst, const void *src, size_t n) {
    if (n) memmove(real(dst), real(src), n);
}
static void fake_reduce(void *acc, const void *in, size_t n, int type, int op, int first) {
    comm_reduce_host(real(acc), real(in), n, type, op, first);
}
static void fake_finish(void *out, const void *acc, size_t n, int type, int op, int ranks) {
    comm_finish_host(real(out), real(acc), n, type, op, ranks, 0);
}

static DevMark *fake_mark(int stream) {
    const Backend *be = backend_cpu();
    DevMark *m = xcalloc(1, sizeof *m);
    m->e = be->event_create();
    be->event_record(m->e, (StreamId)stream);
    atomic_fetch_add(&g_marks, 1);
    return m;
}
static int fake_test(DevMark *m) { return ++m->looks >= 2 && backend_cpu()->event_done(m->e); }
static void fake_release(DevMark *m) {
    if (!m) return;
    backend_cpu()->event_destroy(m->e);
    free(m);
    atomic_fetch_add(&g_released, 1);
}
static void fake_sync(void) {}

static const DevMem FAKE = {
    .name = "cpu stand-in",
    .owns = fake_owns,
    .alloc = fake_alloc,
    .free = fake_free,
    .host_alloc = fake_host_alloc,
    .host_free = free,
    .export_range = fake_export,
    .open_range = fake_open,
    .forget_peers = hostmem_forget_peers,
    .copy = fake_copy,
    .reduce = fake_reduce,
    .finish = fake_finish,
    .mark = fake_mark,
    .test = fake_test,
    .release = fake_release,
    .sync = fake_sync,
};

const DevMem *devmem_cpu(void) { return &FAKE; }

void devmem_cpu_counts(long *marks, long *released) {
    *marks = atomic_load(&g_marks);
    *released = atomic_load(&g_released);
}

#ifndef LLM4D_CUDA
const DevMem *devmem_cuda(void) { return NULL; }
#endif

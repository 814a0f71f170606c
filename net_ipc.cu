// net_ipc.cu: device memory in the collectives on CUDA (devmem.h): CUDA IPC handles, the reduction
// kernels, and marks (events) on the backend's streams (kernels.h). net_shm.c carries the protocol
// (the handle in a ring record, the step flag in host shared memory); this file only moves bytes.
//
//   export   the allocation holding a range (cuMemGetAddressRange, reached through the runtime's
//            driver entry point, so ./train links only cudart) gets one cudaIpcGetMemHandle, kept
//            for the process's life; a range is (allocation, offset).
//   open     a peer's allocation is opened once (cudaIpcOpenMemHandle) and kept until the last
//            communicator goes. Ranks on one GPU and ranks on two GPUs open alike; a kernel reads a
//            peer's memory directly where the devices can access each other, and through a copy
//            (cudaMemcpyAsync, which stages where they cannot) otherwise.
//   queue    copies, reductions and finishing (rounding) run on the communication stream, in order.
//   marks    events recorded on the compute stream (an operation's input is written) or on the
//            communication stream (a read of a peer's buffer, a finished chunk); the progress
//            threads poll them (cudaEventQuery) and never wait for the device.
//
// The progress threads are not the thread that chose the device: every entry point first makes
// this process's device current on the calling thread.
//
// Nothing here has run on a GPU yet (see README, "GPU collectives").
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common.h"
#include "devmem.h"
#include "kernels.h"
#include "reduce.h"
}
#include "common.cuh"

namespace {

typedef CUresult (*AddressRangeFn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);

struct Exported {
    uintptr_t base;
    size_t bytes;
    uint64_t id;
    cudaIpcMemHandle_t handle;
};
struct Opened {
    pid_t pid;
    uint64_t id;
    char *base;
    size_t bytes;
    int direct; // this device's kernels can read it
};

// A GPU is named by its UUID: ordinals are per process (CUDA_VISIBLE_DEVICES, Slurm's
// --gpus-per-task: every rank may see its own GPU as device 0).
struct Uuid {
    unsigned char b[16];
};

struct IpcState {
    pthread_mutex_t mu;
    int ordinal, ready;
    Uuid uuid; // this process's device
    AddressRangeFn range;
    Exported *ex;
    size_t nex, capex;
    uint64_t next_id;
    Opened *op;
    size_t nop, capop;
    // A peer chunk that this device cannot read directly is copied here first. bounce_mu is held from
    // the copy into it until the kernel reading it is queued, so that no other progress thread's copy
    // lands in between or frees the buffer under an in-flight copy (all share one stream).
    pthread_mutex_t bounce_mu;
    void *bounce;
    size_t bounce_bytes;
};
IpcState g_ipc = { PTHREAD_MUTEX_INITIALIZER, -1, 0, {}, NULL, NULL, 0, 0, 1, NULL, 0, 0, PTHREAD_MUTEX_INITIALIZER, NULL, 0 };
__thread int t_bound = -1; // the device this thread last made current

// The process's device current on this thread.
void bind(void) {
    if (t_bound == g_ipc.ordinal) return;
    CK(cudaSetDevice, (g_ipc.ordinal));
    t_bound = g_ipc.ordinal;
}

cudaStream_t stream_of(int s) { return (cudaStream_t)cuda_stream_handle(s == DEV_COMPUTE ? STREAM_COMPUTE : STREAM_COMM); }
cudaStream_t comm_stream(void) { return stream_of(DEV_COMM); }

template <class T> void grow(T **a, size_t *cap, size_t n) {
    if (n < *cap) return;
    *cap = *cap ? 2 * *cap : 16;
    T *p = (T *)realloc(*a, *cap * sizeof(T));
    if (!p) die("out of memory (CUDA IPC tables)");
    *a = p;
}

// ---------------------------------------------------------------------------------------------
// the reduction kernels: bitwise what reduce.c comm_reduce_host / comm_finish_host compute

enum { T_F32 = CT_F32, T_BF16 = CT_BF16, T_I32 = CT_I32, T_I64 = CT_I64 }; // CommType (reduce.h)
enum { O_SUM = OP_SUM, O_AVG = OP_AVG, O_MAX = OP_MAX };                  // CommOp

__device__ __forceinline__ float bf16_in(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t bf16_out(float f) { // nearest, ties to even; NaN stays NaN (kernels.h)
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class A, class X> __device__ __forceinline__ A widen(X x) { return (A)x; }
template <> __device__ __forceinline__ float widen<float, uint16_t>(uint16_t x) { return bf16_in(x); }

// sums: integers wrap (unsigned arithmetic), as on the host
__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ int32_t add(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
__device__ __forceinline__ int64_t add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

// acc = in (first) or acc (op)= in
template <class A, class X> __global__ void reduce_kernel(A *acc, const X *in, size_t n, int op, int first) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        A x = widen<A, X>(in[i]);
        if (first) acc[i] = x;
        else if (op == O_MAX) acc[i] = x > acc[i] ? x : acc[i];
        else acc[i] = add(acc[i], x);
    }
}

template <class A> __device__ __forceinline__ A finish_one(A a, int avg, int ranks) { return avg ? a / (A)ranks : a; }

template <class A> __global__ void finish_kernel(A *out, const A *acc, size_t n, int avg, int ranks) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = finish_one(acc[i], avg, ranks);
}
__global__ void finish_bf16_kernel(uint16_t *out, const float *acc, size_t n, int avg, int ranks) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bf16_out(avg ? acc[i] / (float)ranks : acc[i]);
}

unsigned blocks_for(size_t n) {
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

// ---------------------------------------------------------------------------------------------
// the DevMem table

int ipc_owns(const void *p) {
    bind();
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); // an address CUDA has never seen: host memory
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void *ipc_alloc(size_t bytes) {
    bind();
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}
// Forgets the exports of allocations overlapping [a, a + bytes): an address freed and allocated
// again must get a new handle and id, never the old allocation's (a peer would read freed memory).
void forget_exports(uintptr_t a, size_t bytes) {
    size_t k = 0;
    for (size_t i = 0; i < g_ipc.nex; i++)
        if (g_ipc.ex[i].base + g_ipc.ex[i].bytes <= a || a + bytes <= g_ipc.ex[i].base) g_ipc.ex[k++] = g_ipc.ex[i];
    g_ipc.nex = k;
}
void ipc_free(void *p) {
    if (!p) return;
    bind();
    CK(cudaStreamSynchronize, (comm_stream()));
    pthread_mutex_lock(&g_ipc.mu);
    forget_exports((uintptr_t)p, 1);
    pthread_mutex_unlock(&g_ipc.mu);
    CK(cudaFree, (p));
}
void *ipc_host_alloc(size_t bytes) {
    bind();
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}
void ipc_host_free(void *p) {
    if (p) CK(cudaFreeHost, (p));
}

int ipc_export(const void *p, size_t bytes, DevHandle *h) {
    bind();
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_ipc.mu);
    // the allocation holding the range now: a cached export of another allocation that held these
    // addresses once (freed outside ipc_free) is dropped
    CUdeviceptr base = 0;
    size_t size = 0;
    if (!g_ipc.range || g_ipc.range(&base, &size, (CUdeviceptr)a) != CUDA_SUCCESS || a + bytes > base + size) {
        pthread_mutex_unlock(&g_ipc.mu);
        return 0;
    }
    Exported *x = NULL;
    for (size_t i = 0; i < g_ipc.nex && !x; i++)
        if (a >= g_ipc.ex[i].base && a + bytes <= g_ipc.ex[i].base + g_ipc.ex[i].bytes) x = &g_ipc.ex[i];
    if (x && (x->base != (uintptr_t)base || x->bytes != size)) {
        forget_exports((uintptr_t)base, size);
        x = NULL;
    }
    if (!x) {
        grow(&g_ipc.ex, &g_ipc.capex, g_ipc.nex);
        x = &g_ipc.ex[g_ipc.nex++];
        x->base = (uintptr_t)base;
        x->bytes = size;
        x->id = g_ipc.next_id++;
        cudaError_t e = cudaIpcGetMemHandle(&x->handle, (void *)base);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            g_ipc.nex--;
            pthread_mutex_unlock(&g_ipc.mu);
            return 0;
        }
    }
    memset(h, 0, sizeof *h);
    h->id = x->id;
    h->alloc_bytes = x->bytes;
    h->offset = a - x->base;
    h->device = g_ipc.ordinal;
    static_assert(sizeof h->uuid == sizeof g_ipc.uuid.b, "a device UUID fits the record");
    memcpy(h->uuid, g_ipc.uuid.b, sizeof h->uuid);
    static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof h->blob, "an IPC handle fits the record");
    memcpy(h->blob, &x->handle, sizeof x->handle);
    pthread_mutex_unlock(&g_ipc.mu);
    return 1;
}

// Whether this device's kernels can read memory on the GPU named uuid: the same GPU, or one this
// process sees (by UUID, not by ordinal) with peer access. Otherwise reads go through a copy
// (cudaMemcpyAsync stages through the host where no peer path exists).
int can_read_directly(const unsigned char uuid[16]) {
    if (!memcmp(uuid, g_ipc.uuid.b, 16)) return 1;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    for (int d = 0; d < n; d++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (memcmp(p.uuid.bytes, uuid, 16)) continue;
        int ok = 0;
        if (cudaDeviceCanAccessPeer(&ok, g_ipc.ordinal, d) != cudaSuccess) {
            (void)cudaGetLastError();
            ok = 0;
        }
        return ok;
    }
    return 0; // a GPU this process cannot see
}

const void *ipc_open(pid_t owner, const DevHandle *h, char *why, size_t cap) {
    bind();
    pthread_mutex_lock(&g_ipc.mu);
    for (size_t i = 0; i < g_ipc.nop; i++)
        if (g_ipc.op[i].pid == owner && g_ipc.op[i].id == h->id) {
            char *p = g_ipc.op[i].base + h->offset;
            pthread_mutex_unlock(&g_ipc.mu);
            return p;
        }
    cudaIpcMemHandle_t handle;
    memcpy(&handle, h->blob, sizeof handle);
    void *base = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, cap, "cudaIpcOpenMemHandle: %s", cudaGetErrorString(e));
        pthread_mutex_unlock(&g_ipc.mu);
        return NULL;
    }
    int direct = can_read_directly(h->uuid);
    grow(&g_ipc.op, &g_ipc.capop, g_ipc.nop);
    g_ipc.op[g_ipc.nop++] = Opened{ owner, h->id, (char *)base, (size_t)h->alloc_bytes, direct };
    pthread_mutex_unlock(&g_ipc.mu);
    return (char *)base + h->offset;
}

void ipc_forget_peers(void) {
    if (g_ipc.ordinal < 0) return;
    bind();
    CK(cudaStreamSynchronize, (comm_stream())); // nothing may still read them
    pthread_mutex_lock(&g_ipc.mu);
    for (size_t i = 0; i < g_ipc.nop; i++) CK(cudaIpcCloseMemHandle, (g_ipc.op[i].base));
    g_ipc.nop = 0;
    pthread_mutex_unlock(&g_ipc.mu);
}

void ipc_copy(void *dst, const void *src, size_t n) {
    bind();
    if (n) CK(cudaMemcpyAsync, (dst, src, n, cudaMemcpyDefault, comm_stream()));
}

// Whether this device's kernels can read `in` where it is (this device's memory, or a peer's that it
// reaches directly).
int directly_readable(const void *in) {
    uintptr_t a = (uintptr_t)in;
    int direct = 1;
    pthread_mutex_lock(&g_ipc.mu);
    for (size_t i = 0; i < g_ipc.nop; i++)
        if (a >= (uintptr_t)g_ipc.op[i].base && a < (uintptr_t)g_ipc.op[i].base + g_ipc.op[i].bytes) {
            direct = g_ipc.op[i].direct;
            break;
        }
    pthread_mutex_unlock(&g_ipc.mu);
    return direct;
}

// The bounce buffer holding a copy of `in`, queued on the stream; the caller holds bounce_mu until it
// has queued the kernel that reads it.
const void *bounced(const void *in, size_t bytes) {
    if (g_ipc.bounce_bytes < bytes) {
        if (g_ipc.bounce) {
            CK(cudaStreamSynchronize, (comm_stream())); // every queued reader of the old buffer is done
            CK(cudaFree, (g_ipc.bounce));
            g_ipc.bounce = NULL, g_ipc.bounce_bytes = 0;
        }
        CK(cudaMalloc, (&g_ipc.bounce, bytes));
        g_ipc.bounce_bytes = bytes;
    }
    CK(cudaMemcpyAsync, (g_ipc.bounce, in, bytes, cudaMemcpyDefault, comm_stream()));
    return g_ipc.bounce;
}

void ipc_reduce(void *acc, const void *in, size_t n, int type, int op, int first) {
    if (n == 0) return;
    bind();
    cudaStream_t s = comm_stream();
    unsigned g = blocks_for(n);
    static const size_t width[] = { 4, 2, 4, 8 }; // bytes of an input element per CommType
    if (type < T_F32 || type > T_I64) die("internal: bad comm type %d", type);
    int direct = directly_readable(in);
    if (!direct) {
        pthread_mutex_lock(&g_ipc.bounce_mu);
        in = bounced(in, n * width[type]);
    }
    switch (type) {
    case T_F32: CUDA_LAUNCH(g, 256, 0, s, reduce_kernel<float, float>)((float *)acc, (const float *)in, n, op, first); break;
    case T_BF16: CUDA_LAUNCH(g, 256, 0, s, reduce_kernel<float, uint16_t>)((float *)acc, (const uint16_t *)in, n, op, first); break;
    case T_I32: CUDA_LAUNCH(g, 256, 0, s, reduce_kernel<int32_t, int32_t>)((int32_t *)acc, (const int32_t *)in, n, op, first); break;
    default: CUDA_LAUNCH(g, 256, 0, s, reduce_kernel<int64_t, int64_t>)((int64_t *)acc, (const int64_t *)in, n, op, first); break;
    }
    cuda_launched("reduce_kernel", s);
    if (!direct) pthread_mutex_unlock(&g_ipc.bounce_mu);
}

void ipc_finish(void *out, const void *acc, size_t n, int type, int op, int ranks) {
    if (n == 0) return;
    bind();
    cudaStream_t s = comm_stream();
    unsigned g = blocks_for(n);
    int avg = op == O_AVG;
    switch (type) {
    case T_F32: CUDA_LAUNCH(g, 256, 0, s, finish_kernel<float>)((float *)out, (const float *)acc, n, avg, ranks); break;
    case T_BF16: CUDA_LAUNCH(g, 256, 0, s, finish_bf16_kernel)((uint16_t *)out, (const float *)acc, n, avg, ranks); break;
    case T_I32: CUDA_LAUNCH(g, 256, 0, s, finish_kernel<int32_t>)((int32_t *)out, (const int32_t *)acc, n, avg, ranks); break;
    case T_I64: CUDA_LAUNCH(g, 256, 0, s, finish_kernel<int64_t>)((int64_t *)out, (const int64_t *)acc, n, avg, ranks); break;
    default: die("internal: bad comm type %d", type);
    }
    cuda_launched("finish_kernel", s);
}

} // namespace

struct DevMark {
    cudaEvent_t e;
};

namespace {

DevMark *ipc_mark(int stream) {
    bind();
    DevMark *m = (DevMark *)xcalloc(1, sizeof *m);
    CK(cudaEventCreateWithFlags, (&m->e, cudaEventDisableTiming));
    CK(cudaEventRecord, (m->e, stream_of(stream)));
    return m;
}
int ipc_test(DevMark *m) {
    bind();
    cudaError_t e = cudaEventQuery(m->e);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    if (e != cudaSuccess) cuda_fail("cudaEventQuery", e);
    return 1;
}
void ipc_release(DevMark *m) {
    if (!m) return;
    bind();
    CK(cudaEventDestroy, (m->e));
    free(m);
}
void ipc_sync(void) {
    bind();
    CK(cudaStreamSynchronize, (comm_stream()));
}

const DevMem IPC = {
    "CUDA IPC", ipc_owns, ipc_alloc, ipc_free, ipc_host_alloc, ipc_host_free, ipc_export, ipc_open, ipc_forget_peers,
    ipc_copy, ipc_reduce, ipc_finish, ipc_mark, ipc_test, ipc_release, ipc_sync,
};

} // namespace

// The table for this process's device: call after cuda_use_device (the device current on the calling
// thread is the one every progress thread will use).
extern "C" const DevMem *devmem_cuda(void) {
    pthread_mutex_lock(&g_ipc.mu);
    if (!g_ipc.ready) {
        CK(cudaGetDevice, (&g_ipc.ordinal));
        cudaDeviceProp p;
        CK(cudaGetDeviceProperties, (&p, g_ipc.ordinal));
        memcpy(g_ipc.uuid.b, p.uuid.bytes, sizeof g_ipc.uuid.b);
        // export then fails without it, and the error names the buffer
        g_ipc.range = (AddressRangeFn)cuda_driver_entry("cuMemGetAddressRange");
        g_ipc.ready = 1;
    }
    pthread_mutex_unlock(&g_ipc.mu);
    return &IPC;
}

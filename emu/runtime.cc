// emu/runtime.cc: the CUDA runtime API subset llm4d uses, on the emulated GPU.
//
// Device memory is one memfd-backed arena (so another process can map an allocation: CUDA IPC) that
// is PROT_NONE except while the device works: a host load or store through a device pointer faults at
// once, as devmem_cpu.c's stand-in makes it. Allocations are never reused (freed bytes stay
// unaddressable) and a shadow byte per 8 bytes says which bytes belong to a live allocation; the
// kernels' accesses are checked against it (exec.cc).
//
// Streams run their work in order, lazily: queued work runs when something waits for it (a stream,
// event or device synchronisation, a synchronous copy, cudaFree, a second look at an event), on the
// thread that waits, one launch at a time. So work is never done early: a host read that does not
// wait, or a stream that does not wait for another's event, sees the old bytes. An event's first
// cudaEventQuery says cudaErrorNotReady (and leaves it as the thread's last error, as the runtime
// does); the second runs the stream up to it.
//
// The emulated device: LLM4D_EMU_GPU=h100 (default), h200 or a100 chooses the properties (sm_90 with
// 227 KiB of shared memory per block, or sm_80 with 163 KiB; 48 KiB without cudaFuncSetAttribute);
// LLM4D_EMU_DEVICES=N emulates N of them (default 1).
#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "cuda.h"
#include "cuda_runtime.h"
#include "emu_internal.h"

namespace {

struct Model {
    const char *key, *name;
    int major, minor, sms, l2, optin, per_sm;
    size_t mem;
};
const Model MODELS[] = {
    { "h100", "NVIDIA H100 80GB HBM3 (emulated)", 9, 0, 132, 50 << 20, 227 * 1024, 228 * 1024, (size_t)80 << 30 },
    { "h200", "NVIDIA H200 (emulated)", 9, 0, 132, 60 << 20, 227 * 1024, 228 * 1024, (size_t)141 << 30 },
    { "a100", "NVIDIA A100-SXM4-80GB (emulated)", 8, 0, 108, 40 << 20, 163 * 1024, 164 * 1024, (size_t)80 << 30 },
};
const size_t DEFAULT_SMEM = 48 * 1024;

struct Alloc {
    size_t size;
    int device;
    bool freed;
};

enum OpKind { OP_KERNEL, OP_COPY, OP_SET, OP_EVENT, OP_WAIT };
struct Op {
    OpKind kind;
    std::shared_ptr<EmuLaunch> launch;
    void *dst;
    const void *src;
    size_t n;
    int value;
    std::shared_ptr<std::vector<uint8_t>> snapshot;
    cudaEventRec *ev;
    uint64_t ev_gen;
    cudaStreamRec *wait_s;
    uint64_t wait_seq;
};

} // namespace

struct cudaStreamRec {
    std::deque<Op> q;
    uint64_t enq = 0, done = 0;
    int device = 0;
    bool blocking = true;
};
struct cudaEventRec {
    cudaStreamRec *s = nullptr;
    uint64_t seq = 0, gen = 0, done_gen = 0;
    bool recorded = false;
    int looks = 0;
    double ms = 0;
};

namespace {

struct Emu {
    std::recursive_mutex mu;
    const Model *model = nullptr;
    int ndev = 1;
    int gpu_id[16] = { 0 }; // the physical GPU behind each visible ordinal (LLM4D_EMU_GPU_IDS)
    int driver = CUDART_VERSION; // the CUDA version the emulated driver supports (LLM4D_EMU_DRIVER)
    int memfd = -1;
    uintptr_t lo = 0, top = 0;
    size_t cap = 0;
    uint8_t *shadow = nullptr;
    std::map<uintptr_t, Alloc> allocs;
    std::map<uintptr_t, size_t> pinned;
    std::map<const void *, int> func_smem;
    std::set<cudaStreamRec *> streams;
    cudaStreamRec legacy;
    cudaError_t sticky = cudaSuccess;
    int open = 0; // device bytes accessible (work running)
    struct Peer {
        void *base;
        size_t size;
    };
    std::vector<Peer> peers;
};
Emu &E() {
    static Emu *e = new Emu(); // never destroyed: progress threads may still call at exit
    return *e;
}
thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;

cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess && t_last == cudaSuccess) t_last = e;
    return e;
}

void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emu_vreport("emu: ", fmt, ap);
    va_end(ap);
}

void init_locked() {
    Emu &e = E();
    if (e.model) return;
    const char *g = getenv("LLM4D_EMU_GPU");
    e.model = &MODELS[0];
    if (g && *g) {
        e.model = nullptr;
        for (const Model &m : MODELS)
            if (!strcmp(g, m.key)) e.model = &m;
        if (!e.model) {
            fprintf(stderr, "error: LLM4D_EMU_GPU=%s: expected h100, h200 or a100\n", g);
            exit(1);
        }
    }
    const char *n = getenv("LLM4D_EMU_DEVICES");
    if (n && *n) {
        char *end;
        long v = strtol(n, &end, 10);
        if (*end || v < 1 || v > 16) {
            fprintf(stderr, "error: LLM4D_EMU_DEVICES=%s: expected 1..16\n", n);
            exit(1);
        }
        e.ndev = (int)v;
    }
    // Which physical GPUs this process sees, as CUDA_VISIBLE_DEVICES or Slurm's --gpus-per-task would
    // make them: every rank may see its own GPU as device 0; the UUID tells them apart.
    for (int d = 0; d < 16; d++) e.gpu_id[d] = d;
    const char *ids = getenv("LLM4D_EMU_GPU_IDS");
    if (ids && !strcmp(ids, "local-rank")) { // one GPU a rank, each seen as device 0 (Slurm's --gpus-per-task)
        const char *lr = getenv("LOCAL_RANK");
        e.ndev = 1;
        e.gpu_id[0] = lr ? atoi(lr) : 0;
    } else if (ids && *ids) {
        const char *c = ids;
        for (int d = 0; d < e.ndev; d++) {
            char *end;
            long v = strtol(c, &end, 10);
            if (end == c || v < 0 || v > 255 || (d + 1 < e.ndev ? *end != ',' : *end != 0)) {
                fprintf(stderr, "error: LLM4D_EMU_GPU_IDS=%s: expected %d comma-separated ids 0..255\n", ids, e.ndev);
                exit(1);
            }
            e.gpu_id[d] = (int)v;
            c = end + 1;
        }
    }
    const char *drv = getenv("LLM4D_EMU_DRIVER"); // e.g. 11040: a driver older than the runtime
    if (drv && *drv) e.driver = atoi(drv);
    e.cap = (size_t)64 << 30;
    e.memfd = memfd_create("llm4d-emu-device", MFD_CLOEXEC);
    if (e.memfd < 0 || ftruncate(e.memfd, (off_t)e.cap) != 0) {
        perror("emu: memfd for device memory");
        exit(1);
    }
    void *p = mmap(NULL, e.cap, PROT_NONE, MAP_SHARED | MAP_NORESERVE, e.memfd, 0);
    void *s = mmap(NULL, e.cap / 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || s == MAP_FAILED) {
        perror("emu: mmap of device memory");
        exit(1);
    }
    e.lo = e.top = (uintptr_t)p;
    e.shadow = (uint8_t *)s;
    emu_install_fault_handler();
}

Emu &emu() {
    Emu &e = E();
    init_locked();
    return e;
}

void protect(int prot) {
    Emu &e = E();
    const size_t pg = 4096, len = (e.top - e.lo + pg - 1) / pg * pg;
    if (len && mprotect((void *)e.lo, len, prot) != 0) {
        perror("emu: mprotect of device memory");
        abort();
    }
    for (auto &pe : e.peers)
        if (mprotect(pe.base, pe.size, prot) != 0) {
            perror("emu: mprotect of a peer's device memory");
            abort();
        }
}
struct Open {
    Open() {
        if (E().open++ == 0) protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
        if (--E().open == 0) protect(PROT_NONE);
    }
};

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

cudaStreamRec *S(cudaStream_t s) { return s ? s : &emu().legacy; }

void flush(cudaStreamRec *s, uint64_t upto);

void run(cudaStreamRec *s, Op &op) {
    Emu &e = E();
    if (e.sticky != cudaSuccess && op.kind != OP_EVENT) return; // a failed context does no more work
    switch (op.kind) {
    case OP_KERNEL: {
        Open o;
        if (emu_exec(*op.launch)) e.sticky = cudaErrorLaunchFailure;
        break;
    }
    case OP_COPY: {
        Open o;
        memmove(op.dst, op.snapshot ? op.snapshot->data() : op.src, op.n);
        break;
    }
    case OP_SET: {
        Open o;
        memset(op.dst, op.value, op.n);
        break;
    }
    case OP_EVENT:
        if (op.ev->gen == op.ev_gen) {
            op.ev->done_gen = op.ev_gen;
            op.ev->ms = now_ms();
        }
        break;
    case OP_WAIT: flush(op.wait_s, op.wait_seq); break;
    }
    (void)s;
}

void flush(cudaStreamRec *s, uint64_t upto) {
    while (s->done < upto && !s->q.empty()) {
        Op op = s->q.front();
        s->q.pop_front();
        run(s, op);
        s->done++;
    }
}
void flush_all(cudaStreamRec *s) { flush(s, s->enq); }
void flush_device() {
    Emu &e = emu();
    flush_all(&e.legacy);
    for (cudaStreamRec *s : e.streams) flush_all(s);
}

void enqueue(cudaStreamRec *s, Op op) {
    Emu &e = emu();
    if (s == &e.legacy) // the legacy stream waits for the blocking streams' earlier work
        for (cudaStreamRec *o : e.streams)
            if (o->blocking && o->enq > o->done) {
                Op w{};
                w.kind = OP_WAIT;
                w.wait_s = o;
                w.wait_seq = o->enq;
                s->q.push_back(w);
                s->enq++;
            }
    s->q.push_back(op);
    s->enq++;
}

const Alloc *find_alloc(uintptr_t a, uintptr_t *base) {
    Emu &e = E();
    auto it = e.allocs.upper_bound(a);
    if (it == e.allocs.begin()) return nullptr;
    --it;
    *base = it->first;
    return &it->second;
}

// device memory: this process's arena or a peer's allocation opened through IPC
bool is_dev(const void *p) {
    Emu &e = E();
    if ((uintptr_t)p >= e.lo && (uintptr_t)p < e.lo + e.cap) return true;
    for (auto &pe : e.peers)
        if ((uintptr_t)p - (uintptr_t)pe.base < pe.size) return true;
    return false;
}
bool is_pinned(const void *p, size_t n) {
    Emu &e = E();
    auto it = e.pinned.upper_bound((uintptr_t)p);
    if (it == e.pinned.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

} // namespace

// ---- for exec.cc ----

bool emu_dev_in_arena(uintptr_t a) {
    Emu &e = E();
    return a - e.lo < e.cap;
}

bool emu_dev_ok(uintptr_t a, size_t n, char *why, size_t cap) {
    Emu &e = E();
    bool ok = n > 0;
    for (uintptr_t x = a; ok && x < a + n;) {
        const uintptr_t off = x - e.lo;
        if ((off & 7) >= e.shadow[off >> 3]) ok = false;
        x = (x | 7) + 1;
        if (x > a + n - 1 && ok) { // the last byte
            const uintptr_t l = a + n - 1 - e.lo;
            ok = (l & 7) < e.shadow[l >> 3];
            break;
        }
    }
    if (ok) return true;
    uintptr_t base = 0;
    const Alloc *al = find_alloc(a, &base);
    if (!al) snprintf(why, cap, "below every device allocation");
    else if (a < base + al->size && al->freed) snprintf(why, cap, "inside a freed %zu-byte allocation at %#lx", al->size, (unsigned long)base);
    else if (a < base + al->size)
        snprintf(why, cap, "runs %zu bytes past the end of the %zu-byte allocation at %#lx", (size_t)(a + n - base - al->size), al->size,
                 (unsigned long)base);
    else
        snprintf(why, cap, "%zu bytes past the end of the %s%zu-byte allocation at %#lx", (size_t)(a - base - al->size),
                 al->freed ? "freed " : "", al->size, (unsigned long)base);
    return false;
}

int emu_cc_major(void) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    return emu().model->major;
}

int emu_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               std::function<void()> body) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    if (e.sticky) return ret(e.sticky);
    const unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (!threads || threads > 1024 || block.z > 64 || !grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535) {
        report("launch of %s: grid (%u,%u,%u) of blocks (%u,%u,%u) is not a valid configuration", name, grid.x, grid.y, grid.z, block.x,
               block.y, block.z);
        return ret(cudaErrorInvalidConfiguration);
    }
    auto it = e.func_smem.find(func);
    const size_t limit = it != e.func_smem.end() ? (size_t)it->second : DEFAULT_SMEM;
    if (smem > limit) {
        report("launch of %s: %zu bytes of dynamic shared memory, above the kernel's limit of %zu bytes (%s)", name, smem, limit,
               it != e.func_smem.end() ? "its cudaFuncAttributeMaxDynamicSharedMemorySize" : "48 KiB: no cudaFuncSetAttribute");
        return ret(cudaErrorInvalidValue);
    }
    Op op{};
    op.kind = OP_KERNEL;
    op.launch = std::make_shared<EmuLaunch>(EmuLaunch{ name, func, grid, block, smem, std::move(body) });
    enqueue(S(stream), op);
    return 0;
}

// ---- the API ----
extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaError";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure (the emulator's report is above)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    cudaError_t r = E().sticky ? E().sticky : t_last;
    t_last = cudaSuccess;
    return r;
}
cudaError_t cudaPeekAtLastError(void) { return E().sticky ? E().sticky : t_last; }

cudaError_t cudaGetDeviceCount(int *n) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (emu().driver < CUDART_VERSION) return ret(cudaErrorInsufficientDriver); // as the real runtime does
    *n = emu().ndev;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    *v = emu().driver;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (d < 0 || d >= emu().ndev) return ret(cudaErrorInvalidDevice);
    t_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = t_device;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    const Model *m = emu().model;
    if (dev < 0 || dev >= E().ndev) return ret(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)DEFAULT_SMEM; break;
    case cudaDevAttrMultiProcessorCount: *v = m->sms; break;
    case cudaDevAttrL2CacheSize: *v = m->l2; break;
    case cudaDevAttrComputeCapabilityMajor: *v = m->major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = m->minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = m->optin; break;
    default: return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    const Model *m = emu().model;
    if (dev < 0 || dev >= E().ndev) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", m->name);
    p->totalGlobalMem = m->mem;
    p->sharedMemPerBlock = DEFAULT_SMEM;
    p->sharedMemPerBlockOptin = (size_t)m->optin;
    p->sharedMemPerMultiprocessor = (size_t)m->per_sm;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->major = m->major;
    p->minor = m->minor;
    p->multiProcessorCount = m->sms;
    p->l2CacheSize = m->l2;
    p->pciBusID = 0x10 + E().gpu_id[dev];
    snprintf(p->uuid.bytes, sizeof p->uuid.bytes, "emu-gpu-%03d", E().gpu_id[dev]);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    flush_device();
    return ret(E().sticky);
}
cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (dev < 0 || dev >= emu().ndev || peer < 0 || peer >= E().ndev) return ret(cudaErrorInvalidDevice);
    *can = E().gpu_id[dev] != E().gpu_id[peer];
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    *p = NULL;
    if (e.sticky) return ret(e.sticky);
    const size_t sz = bytes ? bytes : 1;
    const uintptr_t a = (e.top + 255) & ~(uintptr_t)255;
    // 256 bytes of unaddressable gap after each allocation: an overrun lands in nobody's bytes
    const uintptr_t end = a + ((sz + 255) & ~(size_t)255) + 256;
    if (end - e.lo > e.cap) return ret(cudaErrorMemoryAllocation);
    e.top = end;
    if (e.open) protect(PROT_READ | PROT_WRITE);
    const uintptr_t off = a - e.lo;
    memset(e.shadow + (off >> 3), 8, sz >> 3);
    if (sz & 7) e.shadow[(off >> 3) + (sz >> 3)] = (uint8_t)(sz & 7);
    e.allocs[a] = Alloc{ sz, t_device, false };
    *p = (void *)a;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    flush_device(); // as the runtime: cudaFree waits for the device
    if (!p) return ret(e.sticky);
    auto it = e.allocs.find((uintptr_t)p);
    if (it == e.allocs.end() || it->second.freed) {
        report("cudaFree(%p): not the start of a live device allocation", p);
        return ret(cudaErrorInvalidValue);
    }
    Alloc &a = it->second;
    a.freed = true;
    const uintptr_t off = (uintptr_t)p - e.lo;
    memset(e.shadow + (off >> 3), 0, (a.size + 7) >> 3);
    // give the pages back (the address range stays reserved and unaddressable)
    const uintptr_t pg = 4096, b0 = (off + pg - 1) & ~(pg - 1), b1 = (off + a.size) & ~(pg - 1);
    if (b1 > b0 && fallocate(e.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b0, (off_t)(b1 - b0)) != 0) {
        perror("emu: fallocate");
        abort();
    }
    return ret(e.sticky);
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    (void)flags;
    *p = NULL;
    if (posix_memalign(p, 4096, bytes ? bytes : 1) != 0) return ret(cudaErrorMemoryAllocation);
    emu().pinned[(uintptr_t)*p] = bytes ? bytes : 1;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void *p) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    flush_device();
    if (!p) return cudaSuccess;
    if (!emu().pinned.erase((uintptr_t)p)) return ret(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

static cudaError_t check_range(const void *p, size_t n, const char *what) {
    if (!emu_dev_in_arena((uintptr_t)p) || !n) return cudaSuccess; // (a peer's allocation: its mapping bounds it)
    char why[256];
    if (!emu_dev_ok((uintptr_t)p, n, why, sizeof why)) {
        report("%s of %zu bytes at %p: %s", what, n, p, why);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    if (e.sticky) return ret(e.sticky);
    // a kind that contradicts the pointers is an error (the runtime's result would be undefined)
    const bool dd = is_dev(dst), sd = is_dev(src);
    const bool kind_ok = k == cudaMemcpyDefault || (k == cudaMemcpyHostToDevice && dd && !sd) ||
                         (k == cudaMemcpyDeviceToHost && !dd && sd) || (k == cudaMemcpyDeviceToDevice && dd && sd) ||
                         (k == cudaMemcpyHostToHost && !dd && !sd);
    if (!kind_ok) {
        static const char *kinds[] = { "HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default" };
        report("cudaMemcpy%s(%p <- %p, %zu bytes) with cudaMemcpy%s: the destination is %s memory, the source %s memory",
               stream ? "Async" : "", dst, src, n, (unsigned)k < 5 ? kinds[k] : "?", dd ? "device" : "host", sd ? "device" : "host");
        return ret(cudaErrorInvalidValue);
    }
    cudaError_t r;
    if ((r = check_range(dst, n, "copy to device memory")) || (r = check_range(src, n, "copy from device memory"))) return ret(r);
    if (!n) return cudaSuccess;
    cudaStreamRec *s = S(stream);
    Op op{};
    op.kind = OP_COPY;
    op.dst = dst;
    op.src = src;
    op.n = n;
    if (!is_dev(src) && !is_pinned(src, n)) // pageable source: the runtime stages it before returning
        op.snapshot = std::make_shared<std::vector<uint8_t>>((const uint8_t *)src, (const uint8_t *)src + n);
    enqueue(s, op);
    if (!is_dev(dst) && !is_pinned(dst, n)) flush_all(s); // pageable destination: synchronous
    return ret(e.sticky);
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    cudaError_t r = cudaMemcpyAsync(dst, src, n, k, 0);
    if (r) return r;
    flush_all(&E().legacy);
    return ret(E().sticky);
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    if (e.sticky) return ret(e.sticky);
    if (!emu_dev_in_arena((uintptr_t)p) && n) {
        report("cudaMemset(%p): not this process's device memory", p);
        return ret(cudaErrorInvalidValue);
    }
    if (cudaError_t r = check_range(p, n, "memset")) return ret(r);
    if (!n) return cudaSuccess;
    Op op{};
    op.kind = OP_SET;
    op.dst = p;
    op.n = n;
    op.value = v;
    enqueue(S(stream), op);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    cudaError_t r = cudaMemsetAsync(p, v, n, 0);
    if (r) return r;
    flush_all(&E().legacy);
    return ret(E().sticky);
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    memset(a, 0, sizeof *a);
    uintptr_t base;
    const Alloc *al = is_dev(p) ? find_alloc((uintptr_t)p, &base) : nullptr;
    if (al && !al->freed && (uintptr_t)p < base + al->size) {
        a->type = cudaMemoryTypeDevice;
        a->device = al->device;
        a->devicePointer = (void *)p;
    } else if (is_pinned(p, 1)) {
        a->type = cudaMemoryTypeHost;
        a->hostPointer = (void *)p;
    }
    for (auto &pe : e.peers)
        if ((uintptr_t)p - (uintptr_t)pe.base < pe.size) {
            a->type = cudaMemoryTypeDevice;
            a->devicePointer = (void *)p;
        }
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    cudaStreamRec *r = new cudaStreamRec();
    r->device = t_device;
    r->blocking = !(flags & cudaStreamNonBlocking);
    emu().streams.insert(r);
    *s = r;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (!s || !emu().streams.count(s)) return ret(cudaErrorInvalidResourceHandle);
    flush_all(s);
    E().streams.erase(s);
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    cudaStreamRec *r = S(s);
    if (r == &E().legacy) flush_device();
    else flush_all(r);
    return ret(E().sticky);
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    cudaStreamRec *r = S(s);
    if (r->done < r->enq) return ret(cudaErrorNotReady);
    return ret(E().sticky);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    (void)flags;
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    if (!e->recorded) return cudaSuccess; // an event never recorded: nothing to wait for
    Op op{};
    op.kind = OP_WAIT;
    op.wait_s = e->s;
    op.wait_seq = e->seq;
    enqueue(S(s), op);
    return ret(E().sticky);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    *e = new cudaEventRec();
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    // queued records of it must not write freed memory: run them first
    if (e->recorded && e->done_gen != e->gen) flush(e->s, e->seq);
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    cudaStreamRec *r = S(s);
    Op op{};
    op.kind = OP_EVENT;
    op.ev = e;
    op.ev_gen = ++e->gen;
    enqueue(r, op);
    e->s = r;
    e->seq = r->enq;
    e->recorded = true;
    e->looks = 0;
    return ret(E().sticky);
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    if (!e->recorded || e->done_gen == e->gen) return ret(E().sticky);
    if (++e->looks < 2) return ret(cudaErrorNotReady);
    flush(e->s, e->seq);
    return ret(E().sticky);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    if (e->recorded) flush(e->s, e->seq);
    return ret(E().sticky);
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    if (!a || !b || !a->recorded || !b->recorded || a->done_gen != a->gen || b->done_gen != b->gen) return ret(cudaErrorNotReady);
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}

cudaError_t emu_func_set_attribute(const void *func, int attr, int value) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return ret(cudaErrorInvalidValue);
    if (value < 0 || value > e.model->optin) {
        report("cudaFuncSetAttribute: %d bytes of dynamic shared memory asked for, the %s allows %d per block", value, e.model->name,
               e.model->optin);
        return ret(cudaErrorInvalidValue);
    }
    e.func_smem[func] = value;
    return cudaSuccess;
}

// ---- IPC: a handle names the owner's memfd and the allocation's offset in it ----
struct IpcHandle {
    uint32_t magic;
    int32_t pid, fd, device;
    uint64_t off, size;
};
static const uint32_t IPC_MAGIC = 0x454d5531;

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    auto it = e.allocs.find((uintptr_t)p);
    if (it == e.allocs.end() || it->second.freed) {
        report("cudaIpcGetMemHandle(%p): not the start of a live device allocation", p);
        return ret(cudaErrorInvalidValue);
    }
    IpcHandle x{ IPC_MAGIC, (int32_t)getpid(), e.memfd, it->second.device, (uint64_t)((uintptr_t)p - e.lo), it->second.size };
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &x, sizeof x);
    return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    (void)flags;
    IpcHandle x;
    memcpy(&x, h.reserved, sizeof x);
    if (x.magic != IPC_MAGIC) return ret(cudaErrorInvalidValue);
    if (x.pid == getpid()) return ret(cudaErrorInvalidValue); // the runtime refuses a process's own handle too
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", x.pid, x.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        report("cudaIpcOpenMemHandle: %s: %s", path, strerror(errno));
        return ret(cudaErrorMapBufferObjectFailed);
    }
    const uint64_t pg = 4096, a0 = x.off & ~(pg - 1), len = (x.off + x.size - a0 + pg - 1) / pg * pg;
    void *m = mmap(NULL, len, e.open ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED, fd, (off_t)a0);
    close(fd);
    if (m == MAP_FAILED) return ret(cudaErrorMapBufferObjectFailed);
    e.peers.push_back(Emu::Peer{ m, len });
    *p = (uint8_t *)m + (x.off - a0);
    return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void *p) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    flush_device();
    for (size_t i = 0; i < e.peers.size(); i++)
        if ((uintptr_t)p - (uintptr_t)e.peers[i].base < e.peers[i].size) {
            munmap(e.peers[i].base, e.peers[i].size);
            e.peers.erase(e.peers.begin() + (long)i);
            return cudaSuccess;
        }
    return ret(cudaErrorInvalidValue);
}

// ---- the driver ----
CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    std::lock_guard<std::recursive_mutex> g(E().mu);
    Emu &e = emu();
    uintptr_t b;
    const Alloc *al = is_dev((void *)p) ? find_alloc(p, &b) : nullptr;
    if (!al || al->freed || p >= b + al->size) return CUDA_ERROR_INVALID_VALUE;
    (void)e;
    if (base) *base = b;
    if (size) *size = al->size;
    return CUDA_SUCCESS;
}

#ifdef LLM4D_EMU_SM90
// the driver's signature over the sm_90a module's validation (emu/sm90.h)
static CUresult encode_tiled(CUtensorMap *map, CUtensorMapDataType dt, cuuint32_t rank, void *base, const cuuint64_t *dims,
                             const cuuint64_t *strides, const cuuint32_t *box, const cuuint32_t *estrides, CUtensorMapInterleave il,
                             CUtensorMapSwizzle sw, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
    return emu_tensor_map_encode_tiled(map, (int)dt, rank, base, dims, strides, box, estrides, (int)il, (int)sw, (int)l2, (int)oob)
               ? CUDA_ERROR_INVALID_VALUE
               : CUDA_SUCCESS;
}
#endif

cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned version, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult *q) {
    (void)flags;
    *fn = NULL;
    if (q) *q = cudaDriverEntryPointSymbolNotFound;
    if (!strcmp(sym, "cuMemGetAddressRange") && version >= 3020) *fn = (void *)cuMemGetAddressRange;
#ifdef LLM4D_EMU_SM90
    if (!strcmp(sym, "cuTensorMapEncodeTiled") && version >= 12000) *fn = (void *)encode_tiled;
#endif
    if (*fn && q) *q = cudaDriverEntryPointSuccess;
    return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags, cudaDriverEntryPointQueryResult *q) {
    return cudaGetDriverEntryPointByVersion(sym, fn, 12000, flags, q);
}

} // extern "C"

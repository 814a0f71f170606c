// emu/exec.cc: how the emulated GPU runs a launch. Blocks run one after another; a block's threads are
// fibers on one OS thread, switched by emu_ctx_switch below (callee-saved registers, the stack pointer
// and the floating-point control words: no system call, unlike swapcontext). A fiber runs until it
// waits (a barrier, a warp-collective instruction, a spin on an mbarrier), then the next one runs.
//
// What it checks, each failure reported as "kernel NAME block (x,y,z) thread T: reason" and the
// launch ended as failed (a sticky error, as a GPU fault is):
//  - barriers (__syncthreads, bar.sync id, n, __syncwarp): when no thread can run and not all have
//    exited, a deadlock, with where each group of threads waits;
//  - warp collectives (mma.sync, ldmatrix, shfl, __syncwarp; the sm_90a module's warpgroup ones):
//    executed once every lane of the group has reached the same call; a lane at another call, at a
//    barrier or exited is reported as divergence;
//  - cp.async: the bytes land at the cp.async.wait_group that covers their group; until then the
//    destination holds a NaN pattern and a shadow "pending" state, and any access is reported;
//  - shared-memory races: a shadow per byte of the last writer and reader (thread, barrier generation);
//    an access by another thread that no barrier orders after it is reported (read after write, write
//    after write, write after read);
//  - dynamic shared memory past the launch's size, and global memory outside live allocations.
// The kernels' loads and stores reach the checker because the CUDA sources are compiled with
// -fsanitize=kernel-address and every access an outlined call (__asan_loadN_noabort and friends,
// defined here; no sanitizer runtime is linked).
#include <elf.h>
#include <execinfo.h>
#include <unistd.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <xmmintrin.h>

#include <map>
#include <string>
#include <vector>

#include "emu_internal.h"

extern "C" void emu_ctx_switch(void **save_sp, void *to_sp);
asm(R"(
.text
.globl emu_ctx_switch
.type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_ctx_switch, .-emu_ctx_switch
)");

// the dynamic shared memory (extern __shared__ ... smem[] / smem_raw[] in the kernels)
thread_local __attribute__((aligned(1024))) uint8_t smem[EMU_SMEM_MAX];
extern thread_local uint8_t smem_raw[EMU_SMEM_MAX] __attribute__((alias("smem")));

namespace {

enum { RUN, BAR, COLL, DONE };
enum : uint16_t { NOBODY = 0xffff, MANY = 0xfffe };

struct Pend {
    uint32_t dst;
    const void *src;
    int bytes;
    int group;
};

struct Fiber {
    void *sp;
    unsigned rank;
    EmuThreadIds ids;
    int state;
    int bar_id;
    char where[128];
    // a collective in progress
    const char *op;
    void *args;
    // cp.async
    std::vector<Pend> pend;
    int committed;
};

struct Shadow {
    uint32_t blk;
    uint16_t wt, rt;
    uint32_t wgen, rgen;
    uint8_t pending;
};

struct BarState {
    unsigned count, expected;
    char where[128];
};

struct Block {
    const EmuLaunch *L;
    uint3 bid;
    unsigned n;
    std::vector<Fiber> f;
    void *sched_sp;
    jmp_buf jb;
    int failed;
    Fiber *cur;
    unsigned serial;
    uint32_t gen, last_full_gen;
    BarState bars[16];
    std::vector<unsigned> coll_arrived;
    std::vector<uint32_t> seen; // seen[u * n + t]: the latest barrier generation u and t passed together
    bool partial;
    uintptr_t win_lo, win_size, dyn_lo, dynoff; // dynoff: where shared address 0 sits in the TLS block
    size_t dyn_bytes;
    long long clock;
    std::map<std::string, std::pair<void *, void (*)(void *)>> data;
};

thread_local Block *t_blk;
// LLM4D_EMU_REVERSE=1: the scheduler visits a block's threads from the last to the first, so that a
// result that depends on the order threads run in without a barrier between shows as a difference
int g_reverse;
std::vector<Shadow> g_shadow;
unsigned g_serial;
std::vector<void *> g_stacks;
const size_t STACK = 256 * 1024;

// the running block (the scheduler may ask too, e.g. the sm_90a module's spin test), and the thread
Block *blk() {
    if (!t_blk) {
        fprintf(stderr, "emu: a device function was called outside a kernel\n");
        abort();
    }
    return t_blk;
}
Fiber *me() {
    Block *b = blk();
    if (!b->cur) {
        fprintf(stderr, "emu: a thread's device function was called outside the block's threads\n");
        abort();
    }
    return b->cur;
}

[[noreturn]] void vfail(const char *fmt, va_list ap) {
    Block *b = t_blk;
    if (!b) {
        emu_vreport("emu: ", fmt, ap);
        abort();
    }
    char prefix[512];
    if (b->cur)
        snprintf(prefix, sizeof prefix, "emu: kernel %s block (%u,%u,%u) thread %u: ", b->L->name.c_str(), b->bid.x, b->bid.y,
                 b->bid.z, b->cur->rank);
    else
        snprintf(prefix, sizeof prefix, "emu: kernel %s block (%u,%u,%u): ", b->L->name.c_str(), b->bid.x, b->bid.y, b->bid.z);
    emu_vreport(prefix, fmt, ap);
    b->failed = 1;
    if (b->cur) {
        Fiber *f = b->cur;
        emu_ctx_switch(&f->sp, b->sched_sp);
    }
    longjmp(b->jb, 1);
}

void to_sched(Fiber *f) { emu_ctx_switch(&f->sp, t_blk->sched_sp); }

// the TLS block of the executable on this thread (variant II: it ends at the thread pointer)
size_t g_tls_memsz;
int tls_phdr(struct dl_phdr_info *info, size_t, void *) {
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            size_t align = info->dlpi_phdr[i].p_align ? info->dlpi_phdr[i].p_align : 1;
            g_tls_memsz = (info->dlpi_phdr[i].p_memsz + align - 1) / align * align;
        }
    return 1; // the first object is the executable
}

void *stack_for(unsigned i) {
    while (g_stacks.size() <= i) {
        void *p = mmap(NULL, STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            perror("emu: mmap of a fiber stack");
            abort();
        }
        if (mprotect(p, 4096, PROT_NONE) != 0) { // guard page below the stack
            perror("emu: mprotect");
            abort();
        }
        g_stacks.push_back(p);
    }
    return g_stacks[i];
}

void land(Block *b, Fiber *f, const Pend &p);

void fiber_exit_checks(Block *b, Fiber *f) {
    // copies it never waited for still land (nobody may read them without a barrier it can no longer reach)
    for (const Pend &p : f->pend) land(b, f, p);
    f->pend.clear();
    const unsigned w0 = f->rank / 32 * 32;
    for (unsigned i = w0; i < w0 + 32 && i < b->n; i++)
        if (b->f[i].state == COLL) emu_fail("exited while lane %u of its warp waits at %s (divergence)", i % 32, b->f[i].op);
}

void fiber_entry() {
    Block *b = t_blk;
    Fiber *f = b->cur;
    b->L->body();
    fiber_exit_checks(b, f);
    f->state = DONE;
    for (;;) to_sched(f);
}

__attribute__((noinline)) void start_fiber(Fiber *f, unsigned i) {
    uintptr_t top = ((uintptr_t)stack_for(i) + 4096 + STACK) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                     // alignment: the entry sees rsp = 8 mod 16, as after a call
    *--sp = (uint64_t)fiber_entry; // emu_ctx_switch returns here
    for (int r = 0; r < 6; r++) *--sp = 0;
    uint32_t ctl[2] = { _mm_getcsr(), 0x37f };
    memcpy(--sp, ctl, 8);
    f->sp = sp;
}

std::string ranks(const std::vector<unsigned> &v) {
    std::string s;
    for (size_t i = 0; i < v.size();) {
        size_t j = i;
        while (j + 1 < v.size() && v[j + 1] == v[j] + 1) j++;
        char buf[48];
        if (j == i) snprintf(buf, sizeof buf, "%s%u", s.empty() ? "" : ",", v[i]);
        else snprintf(buf, sizeof buf, "%s%u-%u", s.empty() ? "" : ",", v[i], v[j]);
        s += buf;
        i = j + 1;
    }
    return s;
}

// every thread that can run spins on an mbarrier (or setmaxnreg.inc) that has not changed: nothing can
bool all_spinning(Block *b) {
#ifdef LLM4D_EMU_SM90
    bool any = false;
    for (unsigned i = 0; i < b->n; i++)
        if (b->f[i].state == RUN) {
            if (!emu_sm90_thread_spinning(i)) return false;
            any = true;
        }
    return any;
#else
    (void)b;
    return false;
#endif
}

[[noreturn]] void deadlock(Block *b) {
    std::map<std::string, std::vector<unsigned>> at;
    for (unsigned i = 0; i < b->n; i++) {
        const Fiber &f = b->f[i];
        std::string k = f.state == DONE   ? "exited"
                        : f.state == COLL ? std::string("wait at ") + f.op
                        : f.state == RUN  ? std::string("spin on an mbarrier")
                                          : std::string("wait at ") + f.where;
        at[k].push_back(i);
    }
    std::string msg;
    for (auto &kv : at) msg += "; threads " + ranks(kv.second) + " " + kv.first;
#ifdef LLM4D_EMU_SM90
    char sm90[512];
    sm90[0] = 0;
    emu_sm90_describe(sm90, sizeof sm90);
    if (sm90[0]) msg += std::string(" (") + sm90 + ")";
#endif
    emu_fail("deadlock: no thread can continue%s", msg.c_str());
}

// ---- the shared-memory checker ----

bool ordered(Block *b, unsigned t, uint32_t g, unsigned u) {
    if (b->last_full_gen > g) return true;
    return b->partial && t < b->n && b->seen[(size_t)u * b->n + t] > g;
}

void sh_access(Block *b, unsigned u, uintptr_t off, size_t n, bool write) {
    if (off + n > g_shadow.size()) return;
    for (size_t k = 0; k < n; k++) {
        Shadow &e = g_shadow[off + k];
        if (e.blk != b->serial) e = Shadow{ b->serial, NOBODY, NOBODY, 0, 0, 0 };
        if (e.pending)
            emu_fail("%s shared byte %#lx while the cp.async that thread %u issued into it is in flight (no "
                     "cp.async.wait_group has covered its group)",
                     write ? "writes" : "reads", (unsigned long)(off + k), e.wt);
        if (e.wt != NOBODY && e.wt != u && !ordered(b, e.wt, e.wgen, u))
            emu_fail("race on shared memory: %s byte %#lx that thread %u wrote, with no barrier between", write ? "writes" : "reads",
                     (unsigned long)(off + k), e.wt);
        if (write) {
            if (e.rt == MANY) {
                if (b->last_full_gen <= e.rgen && !b->partial)
                    emu_fail("race on shared memory: writes byte %#lx that other threads read, with no barrier between",
                             (unsigned long)(off + k));
            } else if (e.rt != NOBODY && e.rt != u && !ordered(b, e.rt, e.rgen, u)) {
                emu_fail("race on shared memory: writes byte %#lx that thread %u read, with no barrier between", (unsigned long)(off + k),
                         e.rt);
            }
            e.wt = (uint16_t)u;
            e.wgen = b->gen;
            e.rt = NOBODY;
        } else if (e.rt == NOBODY || e.rt == u || (e.rt != MANY && ordered(b, e.rt, e.rgen, u)) ||
                   (e.rt == MANY && b->last_full_gen > e.rgen)) {
            e.rt = (uint16_t)u;
            e.rgen = b->gen;
        } else {
            e.rt = MANY;
            e.rgen = b->gen;
        }
    }
}

inline bool in_window(Block *b, uintptr_t a) { return a - b->win_lo < b->win_size; }

void check_dyn(Block *b, uintptr_t a, size_t n) {
    if (a + n > b->dyn_lo && a < b->dyn_lo + EMU_SMEM_MAX && a + n > b->dyn_lo + b->dyn_bytes)
        emu_fail("%zu bytes at offset %zu of dynamic shared memory: the launch gave %zu bytes", n, (size_t)(a - b->dyn_lo),
                 b->dyn_bytes);
}

inline void access(uintptr_t a, size_t n, bool write) {
    Block *b = t_blk;
    if (!b || !b->cur) return;
    if (in_window(b, a)) {
        check_dyn(b, a, n);
        sh_access(b, b->cur->rank, a - b->win_lo, n, write);
        return;
    }
    if (emu_dev_in_arena(a)) {
        char why[256];
        if (!emu_dev_ok(a, n, why, sizeof why)) emu_fail("%s of %zu bytes at %p: %s", write ? "store" : "load", n, (void *)a, why);
    }
}

void barrier_done(Block *b, const std::vector<unsigned> &who, bool full) {
    b->gen++;
    if (full) {
        b->last_full_gen = b->gen;
        return;
    }
    if (!b->partial) {
        b->seen.assign((size_t)b->n * b->n, 0);
        b->partial = true;
    }
    for (unsigned u : who)
        for (unsigned t : who) b->seen[(size_t)u * b->n + t] = b->gen;
}

void land(Block *b, Fiber *f, const Pend &p) {
    uint8_t *dst = (uint8_t *)(b->dyn_lo + p.dst);
    if (p.bytes > 0) memcpy(dst, p.src, (size_t)p.bytes);
    memset(dst + p.bytes, 0, 16 - (size_t)p.bytes);
    for (unsigned k = 0; k < 16; k++) {
        Shadow &e = g_shadow[b->dynoff + p.dst + k];
        e.pending = 0;
        e.wt = (uint16_t)f->rank;
        e.wgen = b->gen;
        e.rt = NOBODY;
    }
}

// the group of `width` threads that f belongs to, and how many of them exist
void group_of(Block *b, Fiber *f, unsigned width, unsigned *g0, unsigned *cnt) {
    *g0 = f->rank / width * width;
    *cnt = b->n - *g0 < width ? b->n - *g0 : width;
}

// A fault inside a kernel (an address that is neither device, shared nor host memory the kernel may
// use) is reported as the kernel's failure, as the GPU reports an illegal address; elsewhere it stays
// the crash it is.
struct sigaction g_old_segv, g_old_bus;
void on_fault(int sig, siginfo_t *si, void *uc) {
    Block *b = t_blk;
    if (b && b->cur) {
        char msg[160];
        snprintf(msg, sizeof msg, "illegal address %p (signal %d: not device memory)", si->si_addr, sig);
        emu_fail("%s", msg);
    }
    {
        // async-signal-safe enough for a process about to die: the report, then the host's stack
        char msg[200];
        int n = snprintf(msg, sizeof msg, "emu: %s at %p outside any kernel; host stack:\n",
                         emu_dev_in_arena((uintptr_t)si->si_addr) ? "host access to device memory" : "fault", si->si_addr);
        if (write(2, msg, (size_t)n) < 0) _exit(1);
        void *bt[32];
        backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
    }
    struct sigaction *old = sig == SIGSEGV ? &g_old_segv : &g_old_bus;
    if (old->sa_flags & SA_SIGINFO) old->sa_sigaction(sig, si, uc);
    else if (old->sa_handler != SIG_IGN && old->sa_handler != SIG_DFL) old->sa_handler(sig);
    else {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}
} // namespace
int emu_install_fault_handler() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER; // the handler leaves by switching to the scheduler
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &g_old_segv) != 0 || sigaction(SIGBUS, &sa, &g_old_bus) != 0) {
        perror("emu: sigaction");
        abort();
    }
    return 0;
}
namespace {
} // namespace

void emu_vreport(const char *prefix, const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fprintf(stderr, "%s%s\n", prefix, msg);
    fflush(stderr);
}

// ---- the instrumented loads and stores (-fsanitize=kernel-address) ----
extern "C" {
#define EMU_HOOK(n)                                                                                                    \
    void __asan_load##n##_noabort(uintptr_t a) { access(a, n, false); }                                                \
    void __asan_store##n##_noabort(uintptr_t a) { access(a, n, true); }                                                \
    void __asan_report_load##n##_noabort(uintptr_t a) { access(a, n, false); }                                         \
    void __asan_report_store##n##_noabort(uintptr_t a) { access(a, n, true); }
EMU_HOOK(1)
EMU_HOOK(2)
EMU_HOOK(4)
EMU_HOOK(8)
EMU_HOOK(16)
void __asan_loadN_noabort(uintptr_t a, size_t n) { access(a, n, false); }
void __asan_storeN_noabort(uintptr_t a, size_t n) { access(a, n, true); }
void __asan_report_load_n_noabort(uintptr_t a, size_t n) { access(a, n, false); }
void __asan_report_store_n_noabort(uintptr_t a, size_t n) { access(a, n, true); }
void __asan_handle_no_return(void) {}
}

// ---- the launch ----

int emu_exec(const EmuLaunch &L) {
    static int once = (dl_iterate_phdr(tls_phdr, NULL), g_reverse = getenv("LLM4D_EMU_REVERSE") && !strcmp(getenv("LLM4D_EMU_REVERSE"), "1"), 0);
    (void)once;
    const unsigned n = L.block.x * L.block.y * L.block.z;
    Block *b = new Block();
    b->L = &L;
    b->n = n;
    b->f.resize(n);
    b->coll_arrived.assign((n + 31) / 32 + (n + 127) / 128, 0);
    b->dyn_lo = (uintptr_t)smem;
    b->dynoff = 0;
    b->dyn_bytes = L.smem;
    const uintptr_t tp = (uintptr_t)__builtin_thread_pointer();
    b->win_lo = tp - g_tls_memsz;
    b->win_size = g_tls_memsz;
    if (!(b->dyn_lo >= b->win_lo && b->dyn_lo + EMU_SMEM_MAX <= tp)) {
        fprintf(stderr, "emu: the dynamic shared memory is not in the executable's TLS block\n");
        abort();
    }
    b->dynoff = b->dyn_lo - b->win_lo;
    if (g_shadow.size() < g_tls_memsz) g_shadow.resize(g_tls_memsz, Shadow{ 0, NOBODY, NOBODY, 0, 0, 0 });
    t_blk = b;
    int failed = 0;
    for (unsigned bz = 0; bz < L.grid.z && !failed; bz++)
        for (unsigned by = 0; by < L.grid.y && !failed; by++)
            for (unsigned bx = 0; bx < L.grid.x && !failed; bx++) {
                b->bid = uint3{ bx, by, bz };
                b->serial = ++g_serial;
                if (b->serial == 0) { // wrapped: forget every old entry
                    for (Shadow &e : g_shadow) e.blk = 0;
                    b->serial = g_serial = 1;
                }
                b->gen = b->last_full_gen = 0;
                b->partial = false;
                b->clock = 0;
                memset(b->bars, 0, sizeof b->bars);
                std::fill(b->coll_arrived.begin(), b->coll_arrived.end(), 0);
                memset(smem, 0xff, L.smem); // uninitialised shared memory reads as NaN
                for (unsigned i = 0; i < n; i++) {
                    Fiber &f = b->f[i];
                    f.rank = i;
                    f.ids.tid = uint3{ i % L.block.x, i / L.block.x % L.block.y, i / (L.block.x * L.block.y) };
                    f.ids.bid = b->bid;
                    f.ids.bdim = L.block;
                    f.ids.gdim = L.grid;
                    f.state = RUN;
                    f.where[0] = 0;
                    f.op = NULL;
                    f.pend.clear();
                    f.committed = 0;
                    start_fiber(&f, i);
                }
                b->failed = 0;
                b->cur = NULL;
                if (setjmp(b->jb) == 0) {
                    for (;;) {
                        bool ran = false, all_done = true;
                        for (unsigned k = 0; k < n && !b->failed; k++) {
                            Fiber &f = b->f[g_reverse ? n - 1 - k : k];
                            if (f.state == RUN) {
                                b->cur = &f;
                                emu_ctx_switch(&b->sched_sp, f.sp);
                                b->cur = NULL;
                                ran = true;
                            }
                            if (f.state != DONE) all_done = false;
                        }
                        if (b->failed || all_done) break;
                        if (!ran || all_spinning(b)) deadlock(b);
                    }
                }
                b->cur = NULL;
                for (auto &kv : b->data) {
                    if (kv.second.second) kv.second.second(kv.second.first);
                    free(kv.second.first);
                }
                b->data.clear();
                failed = b->failed;
            }
    t_blk = NULL;
    delete b;
    return failed;
}

// ---- the hooks ----

void emu_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(fmt, ap);
}

void emu_yield(void) { to_sched(me()); }
unsigned emu_thread_rank(void) { return me()->rank; }
unsigned emu_block_threads(void) { return blk()->n; }
const EmuThreadIds &emu_ids(void) { return me()->ids; }
int emu_regs_per_thread_limit(void) {
    const unsigned n = blk()->n;
    const int r = (int)(65536 / n);
    return r > 255 ? 255 : r;
}

// Shared addresses (what __cvta_generic_to_shared gives) count from the start of the dynamic shared
// memory, as a block's window starts at its shared memory on the GPU (the kernels that take shared
// addresses have no static __shared__ arrays).
unsigned char *emu_smem(uint32_t addr, size_t bytes) {
    Block *b = blk();
    if ((uintptr_t)addr + bytes > EMU_SMEM_MAX) emu_fail("shared address %#x (%zu bytes) outside shared memory", addr, bytes);
    check_dyn(b, b->dyn_lo + addr, bytes);
    return (unsigned char *)(b->dyn_lo + addr);
}
void emu_smem_pending(uint32_t addr, size_t bytes) {
    Block *b = blk();
    me();
    emu_smem(addr, bytes);
    sh_access(b, b->cur->rank, b->dynoff + addr, bytes, true);
    for (size_t k = 0; k < bytes; k++) {
        g_shadow[b->dynoff + addr + k].pending = 1;
        g_shadow[b->dynoff + addr + k].wt = (uint16_t)b->cur->rank;
    }
}
void emu_smem_ready(uint32_t addr, size_t bytes) {
    Block *b = blk();
    me();
    emu_smem(addr, bytes);
    for (size_t k = 0; k < bytes; k++) {
        Shadow &e = g_shadow[b->dynoff + addr + k];
        e.pending = 0;
        e.wt = (uint16_t)b->cur->rank;
        e.wgen = b->gen;
        e.rt = NOBODY;
    }
}

void *emu_block_data(const char *key, size_t bytes, void (*fini)(void *)) {
    Block *b = blk();
    auto it = b->data.find(key);
    if (it != b->data.end()) return it->second.first;
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) emu_fail("out of host memory for block data %s", key);
    b->data[key] = { p, fini };
    return p;
}

void emu_collective(unsigned width, const char *op, void *my_args, void (*exec)(void **args, unsigned n, void *ctx), void *ctx) {
    Block *b = blk();
    Fiber *f = me();
    unsigned g0, cnt;
    group_of(b, f, width, &g0, &cnt);
    for (unsigned i = g0; i < g0 + cnt; i++) {
        const Fiber &o = b->f[i];
        if (i == f->rank) continue;
        if (o.state == COLL && strcmp(o.op, op) != 0)
            emu_fail("divergence: reaches %s while thread %u of its %s waits at %s", op, i, width == 32 ? "warp" : "group", o.op);
        if (o.state == BAR)
            emu_fail("divergence: reaches %s while thread %u of its %s waits at %s", op, i, width == 32 ? "warp" : "group", o.where);
        if (o.state == DONE) emu_fail("divergence: reaches %s but thread %u of its %s has exited", op, i, width == 32 ? "warp" : "group");
    }
    if (width != 32 && width != 128) emu_fail("a collective over %u threads (32 or 128 only)", width);
    // one arrival counter per warp, then one per warpgroup
    const size_t slot = width == 32 ? g0 / 32 : (b->n + 31) / 32 + g0 / 128;
    f->state = COLL;
    f->op = op;
    f->args = my_args;
    unsigned &arrived = b->coll_arrived[slot];
    if (++arrived < cnt) {
        to_sched(f);
        return;
    }
    arrived = 0;
    void *args[1024];
    for (unsigned i = 0; i < cnt; i++) args[i] = b->f[g0 + i].args;
    exec(args, cnt, ctx);
    for (unsigned i = g0; i < g0 + cnt; i++) b->f[i].state = RUN;
}

void emu_bar_sync(unsigned id, unsigned count, const char *where) {
    Block *b = blk();
    Fiber *f = me();
    if (id >= 16) emu_fail("bar.sync %u: barrier ids are 0..15", id);
    if (count == 0) count = b->n;
    if (count % 32 != 0 && count != b->n) emu_fail("bar.sync %u, %u: the thread count must be a multiple of 32", id, count);
    if (count > b->n) emu_fail("bar.sync %u, %u: more threads than the block's %u", id, count, b->n);
    const unsigned w0 = f->rank / 32 * 32;
    for (unsigned i = w0; i < w0 + 32 && i < b->n; i++)
        if (b->f[i].state == COLL) emu_fail("divergence: reaches %s while lane %u of its warp waits at %s", where, i % 32, b->f[i].op);
    BarState &s = b->bars[id];
    if (s.count == 0) {
        s.expected = count;
        snprintf(s.where, sizeof s.where, "%s", where);
    } else if (s.expected != count) {
        emu_fail("barrier %u used with %u threads at %s and %u at %s", id, s.expected, s.where, count, where);
    }
    snprintf(f->where, sizeof f->where, "%s", where);
    f->state = BAR;
    f->bar_id = (int)id;
    if (++s.count < count) {
        to_sched(f);
        return;
    }
    std::vector<unsigned> who;
    for (unsigned i = 0; i < b->n; i++)
        if (b->f[i].state == BAR && b->f[i].bar_id == (int)id) who.push_back(i);
    s.count = 0;
    s.expected = 0;
    barrier_done(b, who, count == b->n);
    for (unsigned i : who) {
        b->f[i].state = RUN;
        b->f[i].where[0] = 0;
    }
}

void emu_syncthreads(const char *file, int line) {
    char w[128];
    const char *base = strrchr(file, '/');
    snprintf(w, sizeof w, "__syncthreads at %s:%d", base ? base + 1 : file, line);
    emu_bar_sync(0, 0, w);
}

namespace {
struct SyncwarpCtx {
    Block *b;
};
void syncwarp_exec(void **, unsigned n, void *ctx) {
    Block *b = ((SyncwarpCtx *)ctx)->b;
    std::vector<unsigned> who;
    const unsigned g0 = b->cur->rank / 32 * 32;
    for (unsigned i = 0; i < n; i++) who.push_back(g0 + i);
    barrier_done(b, who, false);
}
} // namespace

void emu_syncwarp(unsigned mask, const char *file, int line) {
    Block *b = blk();
    if (mask != 0xffffffffu) emu_fail("__syncwarp with mask %#x at %s:%d: the emulator takes whole warps only", mask, file, line);
    SyncwarpCtx c{ b };
    emu_collective(32, "__syncwarp", NULL, syncwarp_exec, &c);
}

void emu_trap(const char *file, int line) {
    const char *base = strrchr(file, '/');
    emu_fail("__trap() at %s:%d", base ? base + 1 : file, line);
}
// Advances 2^12 per read: a spin loop that gives up after 2^35 cycles (gemm.cu's mbar_wait) traps after
// 2^23 looks, later than the sm_90a module's own report of a wait that nothing changes.
long long emu_clock64(void) { return blk()->clock += 1 << 12; }

uint64_t emu_cvta_shared(const void *p) {
    Block *b = blk();
    if ((uintptr_t)p - b->dyn_lo >= EMU_SMEM_MAX)
        emu_fail("__cvta_generic_to_shared(%p): not in the dynamic shared memory (the emulator's shared window)", p);
    return (uintptr_t)p - b->dyn_lo;
}

// ---- warp collectives ----
namespace {
struct ShflArgs {
    unsigned mask;
    void *val;
    size_t bytes;
    int lane_mask, width;
};
void shfl_exec(void **args, unsigned n, void *) {
    uint64_t in[32];
    for (unsigned i = 0; i < n; i++) {
        ShflArgs *a = (ShflArgs *)args[i];
        if (a->mask != 0xffffffffu) emu_fail("shfl.sync with member mask %#x: the emulator takes whole warps only", a->mask);
        if (a->width != 32) emu_fail("shfl.sync width %d: the emulator takes 32 only", a->width);
        memcpy(&in[i], a->val, a->bytes);
    }
    for (unsigned i = 0; i < n; i++) {
        ShflArgs *a = (ShflArgs *)args[i];
        const unsigned src = i ^ (unsigned)(a->lane_mask & 31);
        memcpy(a->val, &in[src < n ? src : i], a->bytes);
    }
}

struct LdsmArgs {
    uint32_t addr;
    uint32_t *r;
    int trans;
};
struct LdsmCtx {
    Block *b;
    unsigned g0;
};
void ldsm_exec(void **args, unsigned n, void *ctx) {
    LdsmCtx *c = (LdsmCtx *)ctx;
    if (n != 32) emu_fail("ldmatrix in a warp of %u threads", n);
    uint16_t m[4][8][8];
    for (unsigned l = 0; l < 32; l++) {
        LdsmArgs *a = (LdsmArgs *)args[l];
        if (a->trans != ((LdsmArgs *)args[0])->trans) emu_fail("ldmatrix: lanes disagree on .trans");
        if (a->addr & 15) emu_fail("ldmatrix: lane %u's row address %#x is not 16-byte aligned", l, a->addr);
        const unsigned char *p = emu_smem(a->addr, 16);
        sh_access(c->b, c->g0 + l, c->b->dynoff + a->addr, 16, false);
        memcpy(m[l / 8][l % 8], p, 16);
    }
    for (unsigned l = 0; l < 32; l++) {
        LdsmArgs *a = (LdsmArgs *)args[l];
        for (int j = 0; j < 4; j++) {
            uint16_t lo, hi;
            if (!a->trans) {
                lo = m[j][l >> 2][2 * (l & 3)];
                hi = m[j][l >> 2][2 * (l & 3) + 1];
            } else {
                lo = m[j][2 * (l & 3)][l >> 2];
                hi = m[j][2 * (l & 3) + 1][l >> 2];
            }
            a->r[j] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

struct MmaArgs {
    float *d;
    const uint32_t *a;
    uint32_t b0, b1;
};
float bf(uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }
void mma_exec(void **args, unsigned n, void *) {
    if (n != 32) emu_fail("mma.sync in a warp of %u threads", n);
    float A[16][16], B[16][8], C[16][8];
    for (unsigned l = 0; l < 32; l++) {
        MmaArgs *x = (MmaArgs *)args[l];
        const unsigned g = l >> 2, c = l & 3;
        for (int h = 0; h < 2; h++) {
            A[g][2 * c + h] = bf(x->a[0] >> (16 * h));
            A[g + 8][2 * c + h] = bf(x->a[1] >> (16 * h));
            A[g][2 * c + 8 + h] = bf(x->a[2] >> (16 * h));
            A[g + 8][2 * c + 8 + h] = bf(x->a[3] >> (16 * h));
            B[2 * c + h][g] = bf(x->b0 >> (16 * h));
            B[2 * c + 8 + h][g] = bf(x->b1 >> (16 * h));
        }
        C[g][2 * c] = x->d[0];
        C[g][2 * c + 1] = x->d[1];
        C[g + 8][2 * c] = x->d[2];
        C[g + 8][2 * c + 1] = x->d[3];
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float s = C[i][j];
            for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j]; // bf16 products are exact in fp32
            C[i][j] = s;
        }
    for (unsigned l = 0; l < 32; l++) {
        MmaArgs *x = (MmaArgs *)args[l];
        const unsigned g = l >> 2, c = l & 3;
        x->d[0] = C[g][2 * c];
        x->d[1] = C[g][2 * c + 1];
        x->d[2] = C[g + 8][2 * c];
        x->d[3] = C[g + 8][2 * c + 1];
    }
}
} // namespace

void emu_shfl_xor(unsigned mask, void *val, size_t bytes, int lane_mask, int width) {
    ShflArgs a{ mask, val, bytes, lane_mask, width };
    emu_collective(32, "shfl.sync.bfly", &a, shfl_exec, NULL);
}

void emu_ldmatrix_x4(uint32_t addr, uint32_t (&r)[4], int trans) {
    Block *b = blk();
    LdsmArgs a{ addr, r, trans };
    LdsmCtx c{ b, b->cur->rank / 32 * 32 };
    emu_collective(32, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", &a, ldsm_exec, &c);
}

void emu_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    MmaArgs x{ d, a, b0, b1 };
    emu_collective(32, "mma.sync.m16n8k16", &x, mma_exec, NULL);
}

uint32_t emu_cvt_bf16x2(float hi, float lo) {
    auto rn = [](float f) -> uint32_t {
        uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu; // cvt's canonical NaN
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    };
    return rn(hi) << 16 | rn(lo);
}

// ---- cp.async ----

void emu_cp_async16(uint32_t dst, const void *src, int src_bytes) {
    Block *b = blk();
    Fiber *f = me();
    if (dst & 15) emu_fail("cp.async to shared address %#x: not 16-byte aligned", dst);
    if ((uintptr_t)src & 15) emu_fail("cp.async from %p: not 16-byte aligned", src);
    if (src_bytes < 0 || src_bytes > 16) emu_fail("cp.async with src-size %d (0..16)", src_bytes);
    emu_smem(dst, 16);
    if (src_bytes > 0 && emu_dev_in_arena((uintptr_t)src)) {
        char why[256];
        if (!emu_dev_ok((uintptr_t)src, (size_t)src_bytes, why, sizeof why))
            emu_fail("cp.async reads %d bytes at %p: %s", src_bytes, src, why);
    }
    sh_access(b, f->rank, b->dynoff + dst, 16, true);
    memset((void *)(b->dyn_lo + dst), 0xff, 16);
    for (unsigned k = 0; k < 16; k++) {
        g_shadow[b->dynoff + dst + k].pending = 1;
        g_shadow[b->dynoff + dst + k].wt = (uint16_t)f->rank;
    }
    f->pend.push_back(Pend{ dst, src, src_bytes, f->committed });
}

void emu_cp_async_commit(void) { me()->committed++; }

void emu_cp_async_wait(int n) {
    Block *b = blk();
    Fiber *f = me();
    std::vector<Pend> keep;
    for (const Pend &p : f->pend)
        if (p.group < f->committed - n) land(b, f, p);
        else keep.push_back(p);
    f->pend.swap(keep);
}

void emu_no_sm90(void) {
    emu_fail("an sm_90a instruction, but this emulator was built without emu/sm90.h (the sm_90a module)");
}

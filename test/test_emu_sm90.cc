// test/test_emu_sm90.cc: unit tests of the emulator's sm_90a instructions (emu/sm90.cc) on a mock of
// emu-core's hooks: the block's threads are OS threads of which exactly one runs at a time (a baton
// passed round-robin at every emu_yield and collective, as emu-core's fibers do), collectives run
// their exec when the whole group has arrived, and a deadlock detector built on
// emu_sm90_thread_spinning stands in for emu-core's (threads rather than one: a collective's callers
// pass pointers into their own frames, which must live until the last one arrives). Each operation is checked against an
// independent reference, and each check is shown to fail on a broken input with its reason:
//  - cuTensorMapEncodeTiled: maps the GEMM builds pass; each documented rule broken once fails;
//  - TMA boxes in every swizzle mode, out of bounds on all sides (zero and NaN fill, element strides),
//    against direct indexing and CuTe's Swizzle<B,4,3> formula; the destination pending until the
//    phase completes;
//  - mbarrier phase sequences (parity waits, arrival counts, tx-count before and after arrivals) and
//    the errors: uninitialised, overwritten, tx-count overflow and underflow, expect_tx too small or too
//    large (a deadlock), too many arrivals, TMA without fence.mbarrier_init;
//  - wgmma m64nNk16 for every swizzle mode, K- and MN-major A and B, n = 8..256, scale-d and
//    imm-scale, laid out by the PTX ISA's canonical CuTe layouts (evaluated generically here), against
//    a double-precision product; poison before the wait; the errors: wrong swizzle bit, missing
//    wgmma.fence, operands overwritten in flight, pending TMA bytes, wait without commit;
//  - setmaxnreg budgets, values and convergence;
//  - gemm.cu's sm_90a pipeline (TMA + mbarrier + wgmma + setmaxnreg, with gemm.h's tensor-map plans,
//    box coordinates and descriptors) on ragged shapes and all operand layouts against a double
//    product, and its broken variants (expect_tx, swizzle bit, wgmma.fence, setmaxnreg).
// Prints "N passed, N failed"; exits non-zero on any failure.
#include "../emu/sm90.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../gemm.h"
#include "check.h"

// ------------------------------------------------------------------------------------------------
// the mock of emu-core

namespace mock {

struct Fail {
    std::string msg;
};

enum St { RUN, BLOCKED, EXITED };
const unsigned NONE = ~0u;

std::mutex mu;
std::vector<std::unique_ptr<std::condition_variable>> cvs;
std::vector<St> st;
unsigned nthreads, turn;
bool failed;
std::string msg;
int regs_limit;
std::vector<unsigned char> smem, pend;
struct Group {
    std::vector<void *> args;
    unsigned count = 0;
    std::string op;
};
std::map<std::pair<unsigned, unsigned>, Group> groups;
struct Data {
    std::vector<unsigned char> bytes;
    void (*fini)(void *);
};
std::map<std::string, Data> data;
thread_local unsigned rank;
thread_local std::unique_lock<std::mutex> *lk;

void wake_all() {
    for (auto &c : cvs) c->notify_all();
}

[[noreturn]] void fail_now(const std::string &m) {
    if (!failed) {
        failed = true;
        msg = m;
    }
    wake_all();
    throw Fail{ m };
}

void check_failed() {
    if (failed) throw Fail{ "(another thread failed)" };
}

// the next runnable thread after `from` gets the baton
void pass_turn(unsigned from) {
    for (unsigned i = 1; i <= nthreads; i++) {
        unsigned t = (from + i) % nthreads;
        if (st[t] == RUN) {
            turn = t;
            cvs[t]->notify_one();
            return;
        }
    }
    turn = NONE;
    for (unsigned t = 0; t < nthreads; t++)
        if (st[t] == BLOCKED && !failed) {
            failed = true;
            msg = "mock: a collective that never completes (thread " + std::to_string(t) + " waits in it)";
        }
    wake_all();
}

void wait_turn(unsigned me) {
    cvs[me]->wait(*lk, [&] { return failed || (turn == me && st[me] == RUN); });
    check_failed();
}

// Runs a block of n threads; returns "" or the failure message.
std::string run_block(unsigned n, size_t smem_bytes, const std::function<void(unsigned)> &body, int regs = 0) {
    nthreads = n;
    cvs.clear();
    for (unsigned i = 0; i < n; i++) cvs.emplace_back(new std::condition_variable);
    st.assign(n, RUN);
    failed = false;
    msg.clear();
    regs_limit = regs ? regs : 65536 / (int)n;
    smem.assign(smem_bytes, 0xA5); // stale contents
    pend.assign(smem_bytes, 0);
    groups.clear();
    data.clear();
    turn = 0;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < n; t++)
        th.emplace_back([t, &body] {
            std::unique_lock<std::mutex> l(mu);
            lk = &l;
            rank = t;
            try {
                wait_turn(t);
                body(t);
            } catch (Fail &) {
            }
            st[t] = EXITED;
            if (!failed) pass_turn(t);
        });
    for (auto &x : th) x.join();
    for (auto &d : data) d.second.fini(d.second.bytes.data());
    data.clear();
    return failed ? msg : std::string();
}

} // namespace mock

[[noreturn]] void emu_fail(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mock::fail_now(buf);
}

void emu_yield(void) {
    using namespace mock;
    check_failed();
    // emu-core's deadlock detector: every thread that can run is spinning on a state it has seen
    bool all = true, any = false;
    for (unsigned t = 0; t < nthreads && all; t++)
        if (st[t] == RUN) {
            if (emu_sm90_thread_spinning(t))
                any = true;
            else
                all = false;
        }
    if (all && any) {
        char d[1024];
        emu_sm90_describe(d, sizeof d);
        emu_fail("mock deadlock detector: %s", d);
    }
    pass_turn(rank);
    wait_turn(rank);
}

unsigned emu_thread_rank(void) { return mock::rank; }
unsigned emu_block_threads(void) { return mock::nthreads; }

unsigned char *emu_smem(uint32_t addr, size_t bytes) {
    if ((size_t)addr + bytes > mock::smem.size())
        emu_fail("shared memory [0x%x, 0x%zx) past the launch's %zu bytes", addr, addr + bytes, mock::smem.size());
    return &mock::smem[addr];
}
void emu_smem_pending(uint32_t addr, size_t bytes) { memset(&mock::pend[addr], 1, bytes); }
void emu_smem_ready(uint32_t addr, size_t bytes) { memset(&mock::pend[addr], 0, bytes); }

void emu_collective(unsigned width, const char *op, void *my_args, void (*exec)(void **, unsigned, void *), void *ctx) {
    using namespace mock;
    check_failed();
    const unsigned me = rank;
    Group &g = groups[{ width, me / width }];
    if (g.count == 0) {
        g.op = op;
        g.args.assign(width, nullptr);
    } else if (g.op != op) {
        emu_fail("divergence: thread %u executes %s while its group executes %s", me, op, g.op.c_str());
    }
    g.args[me % width] = my_args;
    if (++g.count == width) {
        std::vector<void *> args = g.args;
        g.count = 0;
        exec(args.data(), width, ctx);
        for (unsigned i = 0; i < width; i++) {
            unsigned t = (me / width) * width + i;
            if (t != me && st[t] == BLOCKED) st[t] = RUN;
        }
        return;
    }
    st[me] = BLOCKED;
    pass_turn(me);
    wait_turn(me);
}

void *emu_block_data(const char *key, size_t bytes, void (*fini)(void *)) {
    auto it = mock::data.find(key);
    if (it == mock::data.end()) it = mock::data.emplace(key, mock::Data{ std::vector<unsigned char>(bytes, 0), fini }).first;
    return it->second.bytes.data();
}

int emu_regs_per_thread_limit(void) { return mock::regs_limit; }

// a __syncthreads for the test kernels
static void syncthreads() {
    int dummy = 0;
    emu_collective(mock::nthreads, "bar.sync 0", &dummy, [](void **, unsigned, void *) {}, nullptr);
}

static bool has(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

// ------------------------------------------------------------------------------------------------
// bf16 helpers (values k/8, |k| <= 16: products and sums of 16 of them are exact in float)

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); // exact for the values used
}
static float float_of(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static std::mt19937 rng(12345);
static float small_value() { return (float)((int)(rng() % 33) - 16) / 8.0f; }

// CuTe's Swizzle<B,M,S> (cute/swizzle.hpp: offset ^ ((offset & yyy_mask) >> S), yyy_mask = ((1<<B)-1)
// << (M+S)) on byte addresses with M = 4, S = 3, which the PTX ISA names for its canonical layouts.
static uint32_t cute_swizzle(uint32_t x, int B) {
    const uint32_t yyy = ((1u << B) - 1) << (4 + 3);
    return x ^ ((x & yyy) >> 3);
}
static int swizzle_bits(unsigned span) { return span == 128 ? 3 : span == 64 ? 2 : span == 32 ? 1 : 0; }

// ------------------------------------------------------------------------------------------------
// tensor maps

struct MapArgs {
    int dtype = EMU_TM_BFLOAT16;
    uint32_t rank = 2;
    uintptr_t addr = 0x10000;
    uint64_t dim[5] = { 768, 1000, 1, 1, 1 };
    uint64_t stride[4] = { 768 * 2, 0, 0, 0 };
    uint32_t box[5] = { 64, 128, 1, 1, 1 };
    uint32_t es[5] = { 1, 1, 1, 1, 1 };
    int interleave = EMU_TM_INTERLEAVE_NONE, swizzle = EMU_TM_SWIZZLE_128B, l2 = EMU_TM_L2_256B, oob = EMU_TM_OOB_FILL_NONE;
};

alignas(64) static unsigned char g_map[EMU_TENSOR_MAP_BYTES];

static int encode(const MapArgs &a, std::string *why, void *map = g_map) {
    char w[256];
    int r = emu_tensor_map_check(map, a.dtype, a.rank, (void *)a.addr, a.dim, a.stride, a.box, a.es, a.interleave, a.swizzle,
                                 a.l2, a.oob, w, sizeof w);
    if (why) *why = w;
    return r;
}

static void test_tensor_map_rules() {
    // the maps gemm.cu builds (gemm_tma_plan), for both operand layouts and ragged shapes
    struct {
        int kmajor;
        long long mn, k, ld;
        int tile;
    } ok[] = { { 1, 1000, 768, 768, 128 }, { 1, 77, 40, 48, 256 }, { 0, 300, 100, 304, 128 }, { 0, 5, 3, 8, 256 } };
    for (auto &c : ok) {
        GemmTmaPlan pl;
        gemm_tma_plan(&pl, c.kmajor, c.mn, c.k, c.ld, c.tile);
        MapArgs a;
        a.dim[0] = pl.dims[0];
        a.dim[1] = pl.dims[1];
        a.stride[0] = pl.stride1;
        a.box[0] = pl.box[0];
        a.box[1] = pl.box[1];
        std::string why;
        CHECK(encode(a, &why) == 0, "gemm's map (kmajor %d, %lld x %lld, ld %lld) rejected: %s", c.kmajor, c.mn, c.k, c.ld, why.c_str());
    }
    // each documented rule broken once: the map is refused with the reason
    struct Bad {
        const char *what, *expect;
        std::function<void(MapArgs &)> f;
    } bad[] = {
        { "global address 8-byte aligned", "16-byte aligned", [](MapArgs &a) { a.addr += 8; } },
        { "stride of 100 bf16 (200 bytes)", "multiple of 16", [](MapArgs &a) { a.stride[0] = 200; } },
        { "stride 2^40", "less than 2^40", [](MapArgs &a) { a.stride[0] = 1ULL << 40; } },
        { "stride below the row", "smaller than the dimension", [](MapArgs &a) { a.stride[0] = 768; } },
        { "box 257 rows", "1 to 256", [](MapArgs &a) { a.box[1] = 257; } },
        { "box row of 8 bytes", "multiple of 16", [](MapArgs &a) { a.box[0] = 4; a.swizzle = EMU_TM_SWIZZLE_NONE; } },
        { "box row of 256 bytes with 128B swizzle", "exceeds the 128-byte swizzle", [](MapArgs &a) { a.box[0] = 128; } },
        { "box row of 128 bytes with 64B swizzle", "exceeds the 64-byte swizzle", [](MapArgs &a) { a.swizzle = EMU_TM_SWIZZLE_64B; } },
        { "rank 0", "tensorRank", [](MapArgs &a) { a.rank = 0; } },
        { "rank 6", "tensorRank", [](MapArgs &a) { a.rank = 6; } },
        { "interleave with rank 2", "at least 3", [](MapArgs &a) { a.interleave = EMU_TM_INTERLEAVE_16B; } },
        { "interleave 32B with swizzle 128B", "requires swizzle 32B",
          [](MapArgs &a) { a.rank = 3; a.stride[1] = a.stride[0] * 1000; a.interleave = EMU_TM_INTERLEAVE_32B; a.box[0] = 16; } },
        { "element stride 0", "elementStrides", [](MapArgs &a) { a.es[1] = 0; } },
        { "element stride 9", "elementStrides", [](MapArgs &a) { a.es[0] = 9; } },
        { "zero extent", "globalDim", [](MapArgs &a) { a.dim[1] = 0; } },
        { "extent 2^32+1", "globalDim", [](MapArgs &a) { a.dim[1] = (1ULL << 32) + 1; } },
        { "NaN fill on an integer type", "floating-point", [](MapArgs &a) { a.dtype = EMU_TM_INT32; a.box[0] = 32; a.stride[0] = 768 * 4; a.oob = EMU_TM_OOB_FILL_NAN_REQUEST_ZERO_FMA; } },
        { "unknown data type", "CUtensorMapDataType", [](MapArgs &a) { a.dtype = 99; } },
        { "unknown swizzle", "CUtensorMapSwizzle", [](MapArgs &a) { a.swizzle = 7; } },
    };
    for (auto &c : bad) {
        MapArgs a;
        c.f(a);
        std::string why;
        int r = encode(a, &why);
        CHECK(r == 1 && has(why, c.expect), "%s: result %d, reason \"%s\" (expected one naming \"%s\")", c.what, r, why.c_str(), c.expect);
    }
    // the map itself must be 64-byte aligned
    std::string why;
    CHECK(encode(MapArgs(), &why, g_map + 16) == 1 && has(why, "64 bytes"), "misaligned tensor map accepted: %s", why.c_str());
}

// ------------------------------------------------------------------------------------------------
// TMA boxes

static void test_tma_boxes() {
    // a 40 x 70 (rows x columns) matrix of distinct bf16 bit patterns, row stride 80 elements
    const int R = 40, C = 70, LD = 80;
    alignas(16) static uint16_t g[R * LD];
    for (int i = 0; i < R * LD; i++) g[i] = (uint16_t)(0x3000 + i);
    const unsigned spans[] = { 0, 32, 64, 128 };
    const int modes[] = { EMU_TM_SWIZZLE_NONE, EMU_TM_SWIZZLE_32B, EMU_TM_SWIZZLE_64B, EMU_TM_SWIZZLE_128B };
    for (int mi = 0; mi < 4; mi++) {
        const unsigned span = spans[mi], row_bytes = span ? span : 48;
        MapArgs a;
        a.addr = (uintptr_t)g;
        a.dim[0] = C;
        a.dim[1] = R;
        a.stride[0] = LD * 2;
        a.box[0] = row_bytes / 2;
        a.box[1] = 24;
        a.swizzle = modes[mi];
        alignas(64) unsigned char map[EMU_TENSOR_MAP_BYTES];
        std::string why;
        CHECK(encode(a, &why, map) == 0, "box map rejected: %s", why.c_str());
        const int coords[][2] = { { 0, 0 }, { -8, -5 }, { 40, 30 }, { 64, 0 }, { -64, 100 } };
        for (auto &cc : coords) {
            const uint32_t dst = 2048, bar = 64, bytes = a.box[0] * a.box[1] * 2;
            bool pending_before = false, ready_after = false;
            std::string err = mock::run_block(1, 16384, [&](unsigned) {
                emu_mbar_init(bar, 1);
                emu_fence_mbarrier_init();
                emu_tma_load_2d(dst, map, cc[0], cc[1], bar);
                pending_before = mock::pend[dst] && mock::pend[dst + bytes - 1];
                CHECK(!emu_mbar_try_wait_parity(bar, 0), "phase complete before the arrival");
                emu_mbar_arrive_expect_tx(bar, bytes);
                CHECK(emu_mbar_try_wait_parity(bar, 0), "phase not complete after the arrival and the box's bytes");
                ready_after = !mock::pend[dst] && !mock::pend[dst + bytes - 1];
            }, 255);
            CHECK(err.empty(), "TMA box run failed: %s", err.c_str());
            CHECK(pending_before && ready_after, "destination pending %d before / ready %d after the phase", pending_before, ready_after);
            int bad = 0;
            for (uint32_t i1 = 0; i1 < a.box[1]; i1++)
                for (uint32_t i0 = 0; i0 < a.box[0]; i0++) {
                    const long x = cc[0] + (long)i0, y = cc[1] + (long)i1;
                    const uint16_t want = x >= 0 && y >= 0 && x < C && y < R ? g[y * LD + x] : 0;
                    const uint32_t at = cute_swizzle(dst + (i1 * a.box[0] + i0) * 2, swizzle_bits(span));
                    uint16_t got;
                    memcpy(&got, &mock::smem[at], 2);
                    bad += got != want;
                }
            CHECK(bad == 0, "swizzle %u B, box at (%d, %d): %d elements differ from direct indexing", span, cc[0], cc[1], bad);
        }
    }
    // every second row (elementStrides[1] = 2: ceil(24 / 2) rows land) and NaN out-of-bounds fill
    MapArgs a;
    a.addr = (uintptr_t)g;
    a.dim[0] = C;
    a.dim[1] = R;
    a.stride[0] = LD * 2;
    a.box[0] = 64;
    a.box[1] = 24;
    a.es[1] = 2;
    a.oob = EMU_TM_OOB_FILL_NAN_REQUEST_ZERO_FMA;
    alignas(64) unsigned char map[EMU_TENSOR_MAP_BYTES];
    CHECK(encode(a, nullptr, map) == 0, "strided map rejected");
    const uint32_t rows = 12, bytes = rows * 128;
    std::string err = mock::run_block(1, 16384, [&](unsigned) {
        emu_mbar_init(64, 1);
        emu_fence_mbarrier_init();
        emu_mbar_arrive_expect_tx(64, bytes);
        emu_tma_load_2d(2048, map, 30, 10, 64);
        CHECK(emu_mbar_try_wait_parity(64, 0), "strided box: %u bytes did not complete the phase", bytes);
    });
    CHECK(err.empty(), "strided box: %s", err.c_str());
    int bad = 0;
    for (uint32_t i1 = 0; i1 < rows; i1++)
        for (uint32_t i0 = 0; i0 < 64; i0++) {
            const long x = 30 + (long)i0, y = 10 + 2 * (long)i1;
            const uint32_t at = cute_swizzle(2048 + (i1 * 64 + i0) * 2, 3);
            uint16_t got;
            memcpy(&got, &mock::smem[at], 2);
            if (x < C && y < R)
                bad += got != g[y * LD + x];
            else
                bad += !isnan(float_of(got));
        }
    CHECK(bad == 0, "strided box with NaN fill: %d elements wrong", bad);
}

// ------------------------------------------------------------------------------------------------
// mbarrier

static void test_mbarrier_phases() {
    // three threads arrive on a count-3 barrier; thread 3 watches the phases
    std::vector<int> seen;
    std::string err = mock::run_block(4, 4096, [&](unsigned t) {
        const uint32_t bar = 8;
        if (t == 0) {
            emu_mbar_init(bar, 3);
            emu_fence_mbarrier_init();
        }
        syncthreads();
        if (t == 3) {
            // a fresh barrier: the phase before phase 0 (parity 1) counts as complete
            seen.push_back(emu_mbar_try_wait_parity(bar, 1));
            seen.push_back(emu_mbar_try_wait_parity(bar, 0));
        }
        syncthreads();
        for (int phase = 0; phase < 5; phase++) {
            if (t < 3) emu_mbar_arrive(bar);
            if (t == 2 && phase == 1) seen.push_back(100); // marker
            while (!emu_mbar_try_wait_parity(bar, phase & 1)) {
            }
            if (t == 3) {
                seen.push_back(emu_mbar_try_wait_parity(bar, phase & 1));
                seen.push_back(emu_mbar_try_wait_parity(bar, (phase + 1) & 1));
            }
            syncthreads();
        }
    });
    CHECK(err.empty(), "phase sequence failed: %s", err.c_str());
    std::vector<int> want = { 1, 0 };
    for (int phase = 0; phase < 5; phase++) {
        if (phase == 1) want.push_back(100);
        want.push_back(1);
        want.push_back(0);
    }
    CHECK(seen == want, "parity waits seen %zu values, expected %zu", seen.size(), want.size());

    // the state lives in the barrier's 8 bytes: init(5) and two arrivals change them, and the phase bit
    // flips when the phase completes
    uint64_t w0 = 0, w1 = 0, w2 = 0;
    err = mock::run_block(1, 4096, [&](unsigned) {
        emu_mbar_init(16, 2);
        memcpy(&w0, &mock::smem[16], 8);
        emu_mbar_arrive(16);
        memcpy(&w1, &mock::smem[16], 8);
        emu_mbar_arrive(16);
        memcpy(&w2, &mock::smem[16], 8);
    });
    CHECK(err.empty() && w0 != w1 && (w2 >> 63) == 1 && (w0 >> 63) == 0, "barrier bytes %llx %llx %llx (%s)",
          (unsigned long long)w0, (unsigned long long)w1, (unsigned long long)w2, err.c_str());

    // tx-count before the arrival (copies may complete first: the count goes negative, PTX ISA range
    // -(2^20-1)), and several copies on one phase
    alignas(16) static uint16_t g[64 * 64];
    MapArgs a;
    a.addr = (uintptr_t)g;
    a.dim[0] = 64;
    a.dim[1] = 64;
    a.stride[0] = 128;
    a.box[0] = 64;
    a.box[1] = 16; // 2048 bytes
    alignas(64) unsigned char map[EMU_TENSOR_MAP_BYTES];
    CHECK(encode(a, nullptr, map) == 0, "map");
    err = mock::run_block(1, 65536, [&](unsigned) {
        emu_mbar_init(8, 1);
        emu_fence_mbarrier_init();
        for (int p = 0; p < 3; p++) {
            emu_tma_load_2d(1024, map, 0, 0, 8);
            emu_tma_load_2d(4096, map, 0, 16, 8);
            CHECK(!emu_mbar_try_wait_parity(8, p & 1), "phase %d complete before its arrival", p);
            emu_mbar_arrive_expect_tx(8, 4096);
            CHECK(emu_mbar_try_wait_parity(8, p & 1), "phase %d not complete", p);
        }
    });
    CHECK(err.empty(), "copies before the arrival: %s", err.c_str());
}

static std::string run1(const std::function<void()> &f, unsigned threads = 1) {
    return mock::run_block(threads, 1 << 17, [&](unsigned t) {
        if (t == 0) f();
    });
}

static void test_mbarrier_errors() {
    alignas(16) static uint16_t g[256 * 64];
    MapArgs a;
    a.addr = (uintptr_t)g;
    a.dim[0] = 64;
    a.dim[1] = 256;
    a.stride[0] = 128;
    a.box[0] = 64;
    a.box[1] = 128; // 16384 bytes
    alignas(64) static unsigned char map[EMU_TENSOR_MAP_BYTES];
    CHECK(encode(a, nullptr, map) == 0, "map");
    struct Case {
        const char *what, *expect;
        std::function<void()> f;
        unsigned threads;
    } cases[] = {
        { "arrive on an uninitialised barrier", "never initialised", [] { emu_mbar_arrive(64); }, 1 },
        { "wait on an uninitialised barrier", "never initialised", [] { emu_mbar_try_wait_parity(64, 0); }, 1 },
        { "barrier overwritten by a store", "overwritten", [] { emu_mbar_init(64, 1); mock::smem[66] ^= 1; emu_mbar_arrive(64); }, 1 },
        { "misaligned barrier", "8-byte aligned", [] { emu_mbar_init(68, 1); }, 1 },
        { "count 0", "2^20-1", [] { emu_mbar_init(64, 0); }, 1 },
        { "tx-count overflow", "exceeds", [] { emu_mbar_init(64, 2); emu_mbar_arrive_expect_tx(64, 1u << 20); }, 1 },
        { "tx-count underflow", "below", [] {
              emu_mbar_init(64, 2);
              emu_fence_mbarrier_init();
              for (int i = 0; i < 70; i++) emu_tma_load_2d(1024, map, 0, 0, 64);
          }, 1 },
        { "expect_tx too small", "expect_tx too small", [] {
              emu_mbar_init(64, 1);
              emu_fence_mbarrier_init();
              emu_mbar_arrive_expect_tx(64, 16384 - 16);
              emu_tma_load_2d(1024, map, 0, 0, 64);
          }, 1 },
        { "expect_tx too small, copy first", "expect_tx too small", [] {
              emu_mbar_init(64, 1);
              emu_fence_mbarrier_init();
              emu_tma_load_2d(1024, map, 0, 0, 64);
              emu_mbar_arrive_expect_tx(64, 16384 - 16);
          }, 1 },
        { "expect_tx too large: the phase never completes", "tx-count 16", [] {
              emu_mbar_init(64, 1);
              emu_fence_mbarrier_init();
              emu_mbar_arrive_expect_tx(64, 16384 + 16);
              emu_tma_load_2d(1024, map, 0, 0, 64);
              while (!emu_mbar_try_wait_parity(64, 0)) {
              }
          }, 1 },
        { "more arrivals than the count", "already happened", [] {
              emu_mbar_init(64, 1);
              emu_mbar_arrive_expect_tx(64, 128);
              emu_mbar_arrive(64);
          }, 1 },
        { "TMA without fence.mbarrier_init", "fence.mbarrier_init", [] {
              emu_mbar_init(64, 1);
              emu_tma_load_2d(1024, map, 0, 0, 64);
          }, 1 },
        { "TMA to a misaligned destination", "128-byte aligned", [] {
              emu_mbar_init(64, 1);
              emu_fence_mbarrier_init();
              emu_tma_load_2d(1024 + 64, map, 0, 0, 64);
          }, 1 },
        { "TMA to an address no sm_90 block has", "beyond 256 KiB", [] {
              emu_mbar_init(64, 1);
              emu_fence_mbarrier_init();
              emu_tma_load_2d(1u << 18, map, 0, 0, 64);
          }, 1 },
        { "TMA past the shared memory", "past the launch", [] {
              emu_mbar_init(64, 1);
              emu_fence_mbarrier_init();
              emu_tma_load_2d((1 << 17) - 8192, map, 0, 0, 64);
          }, 1 },
    };
    for (auto &c : cases) {
        std::string err = run1(c.f, c.threads);
        CHECK(has(err, c.expect), "%s: reported \"%s\" (expected \"%s\")", c.what, err.c_str(), c.expect);
    }
    // a deadlock among threads while others have exited: found through emu_sm90_thread_spinning (the
    // block's own check needs every thread spinning)
    std::string err = mock::run_block(8, 4096, [&](unsigned t) {
        if (t == 0) emu_mbar_init(8, 4);
        syncthreads();
        if (t >= 3) return; // exit
        emu_mbar_arrive(8);
        while (!emu_mbar_try_wait_parity(8, 0)) {
        }
    });
    CHECK(has(err, "mock deadlock detector") && has(err, "1 of 4 arrivals pending"), "deadlock with exited threads: \"%s\"", err.c_str());
    // every thread spinning: the block's own check
    err = mock::run_block(3, 4096, [&](unsigned t) {
        if (t == 0) emu_mbar_init(8, 4);
        syncthreads();
        emu_mbar_arrive(8);
        while (!emu_mbar_try_wait_parity(8, 0)) {
        }
    });
    CHECK(has(err, "deadlock") && has(err, "arrivals pending"), "deadlock of all threads: \"%s\"", err.c_str());
}

// ------------------------------------------------------------------------------------------------
// wgmma: operands laid out by the PTX ISA's canonical layouts ("Canonical Layouts" table, CuTe
// notation, T = 8 for 16-bit elements), evaluated here by a generic layout function

struct Mode { // one CuTe mode: shape and stride tuples (strides in elements)
    int n;
    long shape[3], stride[3];
};

static long eval(const Mode &m, long x) {
    long off = 0;
    for (int i = 0; i < m.n; i++) {
        const long c = i + 1 < m.n ? x % m.shape[i] : x; // the last mode takes what is left
        off += c * m.stride[i];
        x = i + 1 < m.n ? x / m.shape[i] : 0;
    }
    return off;
}

struct Layout {
    Mode mn, k;
    uint32_t lbo, sbo; // bytes, for the descriptor
    unsigned span;
    uint32_t bytes;    // extent
};

// rows: the operand's M or N extent (K = 16)
static Layout canonical(bool mn_major, unsigned span, unsigned rows) {
    const long T = 8;
    const long w = span / 16; // 16-byte chunks per swizzle row
    Layout L;
    L.span = span;
    if (!mn_major) {
        if (!span) { // ((8,m),(T,2k)):((1T,SBO),(1,LBO)), core matrices 8 rows x 16 bytes
            L.lbo = 128;
            L.sbo = 256;
            L.mn = { 2, { 8, 0 }, { T, L.sbo / 2 } };
            L.k = { 2, { T, 0 }, { 1, L.lbo / 2 } };
            L.bytes = rows / 8 * L.sbo;
        } else { // ((8,m),(T,2k)):((wT,SBO),(1,T)); LBO unused ("assumed 1")
            L.lbo = 16;
            L.sbo = 8 * span;
            L.mn = { 2, { 8, 0 }, { w * T, L.sbo / 2 } };
            L.k = { 2, { T, 0 }, { 1, T } };
            L.bytes = rows / 8 * L.sbo;
        }
    } else {
        if (!span) { // ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
            L.sbo = 128;
            L.lbo = rows / 8 * 128;
            L.mn = { 3, { T, 1, 0 }, { 1, T, L.sbo / 2 } };
            L.k = { 2, { 8, 0 }, { T, L.lbo / 2 } };
            L.bytes = 2 * L.lbo;
        } else { // ((T,w,m),(8,k)):((1,T,LBO),(wT,SBO))
            L.sbo = 8 * span;
            L.lbo = 16 * span;
            L.mn = { 3, { T, w, 0 }, { 1, T, L.lbo / 2 } };
            L.k = { 2, { 8, 0 }, { w * T, L.sbo / 2 } };
            L.bytes = (rows * 2 + span - 1) / span * L.lbo;
        }
    }
    return L;
}

static void place(const Layout &L, uint32_t start, unsigned rows, const std::vector<float> &v /* rows x 16 */) {
    for (unsigned r = 0; r < rows; r++)
        for (unsigned k = 0; k < 16; k++) {
            const uint32_t a = cute_swizzle(start + 2 * (uint32_t)(eval(L.mn, r) + eval(L.k, k)), swizzle_bits(L.span));
            const uint16_t h = bf16_of(v[r * 16 + k]);
            memcpy(&mock::smem[a], &h, 2);
        }
}

static uint64_t make_desc(uint32_t start, const Layout &L) {
    const uint64_t sw = L.span == 128 ? 1 : L.span == 64 ? 2 : L.span == 32 ? 3 : 0;
    return (uint64_t)((start & 0x3FFFF) >> 4) | (uint64_t)((L.lbo & 0x3FFFF) >> 4) << 16 | (uint64_t)((L.sbo & 0x3FFFF) >> 4) << 32 |
           sw << 62;
}

// Which thread and register hold D(row, col) of m64nNk16 (PTX ISA figure of the accumulator fragment:
// warp w has rows 16w..16w+15; lane 4r+c holds columns 2c, 2c+1 of each 8 in rows r and r+8).
static void holder(unsigned row, unsigned col, unsigned *thread, unsigned *reg) {
    *thread = (row / 16) * 32 + (row % 8) * 4 + (col % 8) / 2;
    *reg = (col / 8) * 4 + ((row % 16) / 8) * 2 + col % 2;
}

struct WgCase {
    unsigned n, span_a, span_b;
    int ta, tb;
    int scale_d, scale_a;
    unsigned desc_span_b; // the swizzle the B descriptor claims (normally span_b)
};

// Runs fence; two wgmma (A1 B1, A2 B2) on an accumulator preset to C; commit; wait; returns the number
// of wrong elements (-1: the run failed, message in *err).
static int run_wgmma(const WgCase &c, std::string *err, bool *poisoned) {
    const unsigned N = c.n;
    std::vector<float> A1(64 * 16), A2(64 * 16), B1(N * 16), B2(N * 16), C(64 * N);
    for (auto &x : A1) x = small_value();
    for (auto &x : A2) x = small_value();
    for (auto &x : B1) x = small_value();
    for (auto &x : B2) x = small_value();
    for (auto &x : C) x = small_value();
    const Layout LA = canonical(c.ta, c.span_a, 64), LB = canonical(c.tb, c.span_b, N);
    Layout LBd = LB;
    LBd.span = c.desc_span_b;
    const uint32_t a1 = 1024, a2 = a1 + ((LA.bytes + 1023) / 1024) * 1024, b1 = a2 + ((LA.bytes + 1023) / 1024) * 1024,
                   b2 = b1 + ((LB.bytes + 1023) / 1024) * 1024;
    const uint32_t end = b2 + LB.bytes;
    std::vector<std::vector<float>> out(128, std::vector<float>(N / 2));
    bool nan_before = true;
    *err = mock::run_block(128, end + 65536, [&](unsigned t) {
        if (t == 0) {
            place(LA, a1, 64, A1);
            place(LA, a2, 64, A2);
            place(LB, b1, N, B1);
            place(LB, b2, N, B2);
        }
        float acc[128];
        for (unsigned i = 0; i < N / 2; i++) acc[i] = 0;
        for (unsigned r = 0; r < 64; r++)
            for (unsigned col = 0; col < N; col++) {
                unsigned th, reg;
                holder(r, col, &th, &reg);
                if (th == t) acc[reg] = C[r * N + col];
            }
        emu_wgmma_fence();
        emu_wgmma_m64nNk16_f32_bf16(acc, N, make_desc(a1, LA), make_desc(b1, LBd), c.scale_d, c.scale_a, 1, c.ta, c.tb);
        emu_wgmma_m64nNk16_f32_bf16(acc, N, make_desc(a2, LA), make_desc(b2, LBd), 1, 1, 1, c.ta, c.tb);
        emu_wgmma_commit();
        for (unsigned i = 0; i < N / 2; i++) nan_before = nan_before && isnan(acc[i]);
        emu_wgmma_wait(0);
        for (unsigned i = 0; i < N / 2; i++) out[t][i] = acc[i];
    });
    if (poisoned) *poisoned = nan_before;
    if (!err->empty()) return -1;
    int bad = 0;
    for (unsigned r = 0; r < 64; r++)
        for (unsigned col = 0; col < N; col++) {
            double ref = c.scale_d ? C[r * N + col] : 0.0;
            for (unsigned k = 0; k < 16; k++)
                ref += (double)c.scale_a * A1[r * 16 + k] * B1[col * 16 + k] + (double)A2[r * 16 + k] * B2[col * 16 + k];
            unsigned th, reg;
            holder(r, col, &th, &reg);
            bad += (double)out[th][reg] != ref;
        }
    return bad;
}

static void test_wgmma_layouts() {
    const unsigned spans[] = { 0, 32, 64, 128 };
    for (unsigned sa : spans)
        for (unsigned sb : spans)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    if (sa != sb && (ta || tb)) continue; // mixed swizzles: K-major only, to keep the run short
                    const unsigned n = sa == 128 && sb == 128 ? 256 : sb == 0 ? 8 : 64;
                    WgCase c = { n, sa, sb, ta, tb, 1, 1, sb };
                    std::string err;
                    bool poisoned = false;
                    int bad = run_wgmma(c, &err, &poisoned);
                    CHECK(bad == 0, "wgmma n%u A %s-major %uB, B %s-major %uB: %d wrong (%s)", n, ta ? "M" : "K", sa, tb ? "N" : "K", sb, bad,
                          err.c_str());
                    CHECK(poisoned, "accumulators readable before wgmma.wait_group (n%u)", n);
                }
    // scale-d = 0 and imm-scale-a = -1
    std::string err;
    WgCase c = { 128, 128, 64, 1, 0, 0, -1, 64 };
    CHECK(run_wgmma(c, &err, nullptr) == 0, "scale-d 0 / imm-scale-a -1: %s", err.c_str());
    // a wrong swizzle bit in B's descriptor (64 B for a 128 B layout): the product is wrong
    c = { 64, 128, 128, 0, 0, 1, 1, 64 };
    int bad = run_wgmma(c, &err, nullptr);
    CHECK(bad != 0, "wgmma with a wrong descriptor swizzle computed the right product (%d wrong, %s)", bad, err.c_str());
    c = { 64, 128, 128, 0, 1, 1, 1, 0 };
    bad = run_wgmma(c, &err, nullptr);
    CHECK(bad != 0, "wgmma with swizzle bits cleared computed the right product (%d wrong, %s)", bad, err.c_str());
}

static void test_wgmma_errors() {
    const Layout L = canonical(false, 128, 64);
    const uint64_t d = make_desc(1024, L), db = make_desc(1024 + 8192, L);
    struct Case {
        const char *what, *expect;
        std::function<void(unsigned, float *)> f;
    } cases[] = {
        { "no wgmma.fence before the first wgmma", "no wgmma.fence",
          [&](unsigned, float *acc) { emu_wgmma_m64nNk16_f32_bf16(acc, 64, d, db, 1, 1, 1, 0, 0); } },
        { "accumulators written without wgmma.fence", "without a wgmma.fence", [&](unsigned, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, d, db, 1, 1, 1, 0, 0);
              emu_wgmma_commit();
              emu_wgmma_wait(0);
              for (int i = 0; i < 32; i++) acc[i] = 0; // the next tile's zeroing
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, d, db, 1, 1, 1, 0, 0);
          } },
        { "operand overwritten before the wait", "changed before", [&](unsigned t, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, d, db, 1, 1, 1, 0, 0);
              emu_wgmma_commit();
              if (t == 5) mock::smem[1024 + 8192 + 2] ^= 0x40;
              emu_wgmma_wait(0);
          } },
        { "wait without commit", "not yet committed", [&](unsigned, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, d, db, 1, 1, 1, 0, 0);
              emu_wgmma_wait(0);
          } },
        { "descriptor with a base offset", "base offset", [&](unsigned, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, d | 1ULL << 49, db, 1, 1, 1, 0, 0);
          } },
        { "start address overflowing its field", "outside its fields", [&](unsigned, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, d + 0x3FFF, db, 1, 1, 1, 0, 0);
          } },
        { "threads disagree on the descriptor", "different operands", [&](unsigned t, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 64, t == 77 ? d + 2 : d, db, 1, 1, 1, 0, 0);
          } },
        { "n not a multiple of 8", "multiple of 8", [&](unsigned, float *acc) {
              emu_wgmma_fence();
              emu_wgmma_m64nNk16_f32_bf16(acc, 60, d, db, 1, 1, 1, 0, 0);
          } },
        { "divergence: part of the warpgroup skips the wgmma", "divergence", [&](unsigned t, float *acc) {
              emu_wgmma_fence();
              if (t < 64) emu_wgmma_m64nNk16_f32_bf16(acc, 64, d, db, 1, 1, 1, 0, 0);
              emu_wgmma_commit();
          } },
    };
    for (auto &c : cases) {
        std::string err = mock::run_block(128, 32768, [&](unsigned t) {
            float acc[128] = { 0 };
            c.f(t, acc);
        });
        CHECK(has(err, c.expect), "%s: reported \"%s\" (expected \"%s\")", c.what, err.c_str(), c.expect);
    }

    // TMA and wgmma together: a wgmma reading bytes whose phase has not completed, and one reading them
    // through a descriptor with another swizzle than the TMA copy's
    alignas(16) static uint16_t g[64 * 64];
    for (int i = 0; i < 64 * 64; i++) g[i] = bf16_of(small_value());
    MapArgs a;
    a.addr = (uintptr_t)g;
    a.dim[0] = 64;
    a.dim[1] = 64;
    a.stride[0] = 128;
    a.box[0] = 64;
    a.box[1] = 64; // 8192 bytes: A 64 x 64 k-major, B 64 rows
    alignas(64) static unsigned char map[EMU_TENSOR_MAP_BYTES];
    CHECK(encode(a, nullptr, map) == 0, "map");
    for (int variant = 0; variant < 3; variant++) {
        std::string err = mock::run_block(128, 32768, [&](unsigned t) {
            const uint32_t bar = 64;
            if (t == 0) {
                emu_mbar_init(bar, 2); // two arrivals: the producer's and (variant 0) nobody else's
                emu_fence_mbarrier_init();
                emu_mbar_arrive_expect_tx(bar, 16384);
                emu_tma_load_2d(1024, map, 0, 0, bar);
                emu_tma_load_2d(1024 + 8192, map, 0, 0, bar);
                if (variant) emu_mbar_arrive(bar);
            }
            syncthreads();
            if (variant) while (!emu_mbar_try_wait_parity(bar, 0)) {
                }
            float acc[128] = { 0 };
            Layout Lb = L;
            if (variant == 2) Lb.span = 64;
            emu_wgmma_fence();
            emu_wgmma_m64nNk16_f32_bf16(acc, 64, make_desc(1024, L), make_desc(1024 + 8192, Lb), 1, 1, 1, 0, 0);
            emu_wgmma_commit();
            emu_wgmma_wait(0);
        });
        const char *expect = variant == 0 ? "still writing" : variant == 2 ? "64-byte swizzle" : "";
        if (variant == 1)
            CHECK(err.empty(), "wgmma after the phase completed: %s", err.c_str());
        else
            CHECK(has(err, expect), "variant %d: reported \"%s\" (expected \"%s\")", variant, err.c_str(), expect);
    }
}

// ------------------------------------------------------------------------------------------------
// setmaxnreg

static std::string run_regs(const std::function<unsigned(unsigned, int *)> &value, int limit = 0) {
    return mock::run_block(384, 4096, [&](unsigned t) {
        int inc = 0;
        unsigned regs = value(t, &inc);
        emu_setmaxnreg(inc, regs);
    }, limit);
}

static void test_setmaxnreg() {
    // gemm.cu's split: 384 threads under __launch_bounds__(384, 1) get 65536/384 -> 168 registers; the
    // producer warpgroup goes to 40, the two consumers to 232: 40*128 + 2*232*128 = 64512 = 168*384
    auto gemm = [](unsigned t, int *inc) {
        *inc = t >= 128;
        return t >= 128 ? 232u : 40u;
    };
    std::string err = run_regs(gemm);
    CHECK(err.empty(), "gemm's setmaxnreg split rejected: %s", err.c_str());
    // consumers first: they wait for the producer's release
    err = mock::run_block(384, 4096, [&](unsigned t) {
        if (t < 128)
            for (int i = 0; i < 3; i++) emu_yield();
        emu_setmaxnreg(t >= 128, t >= 128 ? 232 : 40);
    });
    CHECK(err.empty(), "consumers' setmaxnreg.inc before the producer's .dec: %s", err.c_str());
    struct Case {
        const char *what, *expect;
        std::function<unsigned(unsigned, int *)> f;
    } cases[] = {
        { "over budget (240)", "over budget", [](unsigned t, int *inc) { *inc = t >= 128; return t >= 128 ? 240u : 40u; } },
        { "not a multiple of 8", "multiple of 8", [](unsigned t, int *inc) { *inc = t >= 128; return t >= 128 ? 236u : 40u; } },
        { "below 24", "multiple of 8 from 24", [](unsigned t, int *inc) { *inc = t >= 128; return t >= 128 ? 232u : 16u; } },
        { "different values in a warpgroup", "same setmaxnreg", [](unsigned t, int *inc) { *inc = t >= 128; return t >= 128 ? (t == 200 ? 224u : 232u) : 40u; } },
        { "dec above the current count", "above the warpgroup's current", [](unsigned t, int *inc) { *inc = t >= 128; return t >= 128 ? 200u : 176u; } },
        { "inc below the current count", "below the warpgroup's current", [](unsigned t, int *inc) { *inc = 1; return t >= 128 ? 200u : 160u; } },
    };
    for (auto &c : cases) {
        err = run_regs(c.f);
        CHECK(has(err, c.expect), "%s: reported \"%s\" (expected \"%s\")", c.what, err.c_str(), c.expect);
    }
    // a warpgroup that never releases: the consumers wait forever, a deadlock
    err = mock::run_block(384, 4096, [&](unsigned t) {
        if (t >= 128) emu_setmaxnreg(1, 232);
    });
    CHECK(has(err, "deadlock") && has(err, "setmaxnreg.inc"), "inc with nobody releasing: \"%s\"", err.c_str());
}

// ------------------------------------------------------------------------------------------------
// gemm.cu's sm_90a pipeline (gemm_wgmma_kernel, one block walking every tile), with gemm.h's plans

struct GemmBroken {
    int tx_delta = 0;        // added to the producer's expect_tx
    int desc_swizzle = GEMM_DESC_SWIZZLE_128B;
    bool no_fence = false;   // wgmma.fence left out
    unsigned consumer_regs = 232;
};

static std::string run_gemm(int M, int N, int K, int a_kmajor, int b_kmajor, const GemmBroken &br, int *wrong) {
    const int BM = GEMM_WG_BM, BN = GEMM_WG_BN, BK = GEMM_WG_BK, S = 2;
    const int lda = a_kmajor ? (K + 7) / 8 * 8 + 8 : (M + 7) / 8 * 8, ldb = b_kmajor ? (K + 7) / 8 * 8 : (N + 7) / 8 * 8 + 8;
    std::vector<uint16_t> A((size_t)(a_kmajor ? M : K) * lda + 8), B((size_t)(b_kmajor ? N : K) * ldb + 8);
    for (auto &x : A) x = bf16_of(small_value());
    for (auto &x : B) x = bf16_of(small_value());
    auto Aat = [&](int m, int k) { return float_of(a_kmajor ? A[(size_t)m * lda + k] : A[(size_t)k * lda + m]); };
    auto Bat = [&](int k, int n) { return float_of(b_kmajor ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n]); };
    GemmTmaPlan pa, pb;
    gemm_tma_plan(&pa, a_kmajor, M, K, lda, BM);
    gemm_tma_plan(&pb, b_kmajor, N, K, ldb, BN);
    alignas(64) static unsigned char ma[EMU_TENSOR_MAP_BYTES], mb[EMU_TENSOR_MAP_BYTES];
    // as gemm.cu's make_tensor_map
    for (int op = 0; op < 2; op++) {
        const GemmTmaPlan &pl = op ? pb : pa;
        uint64_t dims[2] = { pl.dims[0], pl.dims[1] }, strides[1] = { pl.stride1 };
        uint32_t box[2] = { pl.box[0], pl.box[1] }, es[2] = { 1, 1 };
        if (emu_tensor_map_encode_tiled(op ? mb : ma, EMU_TM_BFLOAT16, 2, op ? (void *)B.data() : (void *)A.data(), dims, strides, box, es,
                                        EMU_TM_INTERLEAVE_NONE, EMU_TM_SWIZZLE_128B, EMU_TM_L2_256B, EMU_TM_OOB_FILL_NONE))
            return "tensor map refused";
    }
    std::vector<float> Cout((size_t)M * N, NAN);
    const uint32_t A_STAGE = BM * BK * 2, B_STAGE = BN * BK * 2;
    const uint32_t base = 1024, sA = base, sB = sA + S * A_STAGE, bars = sB + S * B_STAGE;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, k_tiles = (K + BK - 1) / BK;
    std::string err = mock::run_block(384, bars + 1024, [&](unsigned t) {
        auto full = [&](int s) { return bars + 8u * s; };
        auto empty = [&](int s) { return bars + 8u * (S + s); };
        if (t == 0) {
            for (int s = 0; s < S; s++) {
                emu_mbar_init(full(s), 1);
                emu_mbar_init(empty(s), 8);
            }
            emu_fence_mbarrier_init();
        }
        syncthreads();
        const unsigned wg = t / 128;
        if (wg == 0) {
            emu_setmaxnreg(0, 40);
            if (t != 0) return;
            int stage = 0;
            uint32_t phase = 0;
            for (int tm = 0; tm < tiles_m; tm++)
                for (int tn = 0; tn < tiles_n; tn++) {
                    const int m0 = tm * BM, n0 = tn * BN;
                    const int nba = a_kmajor ? 1 : std::min(pa.boxes, (M - m0 + 63) / 64);
                    const int nbb = b_kmajor ? 1 : std::min(pb.boxes, (N - n0 + 63) / 64);
                    const uint32_t tx = nba * pa.box_bytes + nbb * pb.box_bytes + br.tx_delta;
                    for (int kt = 0; kt < k_tiles; kt++) {
                        while (!emu_mbar_try_wait_parity(empty(stage), phase ^ 1)) {
                        }
                        emu_mbar_arrive_expect_tx(full(stage), tx);
                        for (int b = 0; b < nba; b++) {
                            int c0, c1;
                            gemm_tma_box_coords(&pa, b, m0, kt * BK, &c0, &c1);
                            emu_tma_load_2d(sA + stage * A_STAGE + b * pa.box_bytes, ma, c0, c1, full(stage));
                        }
                        for (int b = 0; b < nbb; b++) {
                            int c0, c1;
                            gemm_tma_box_coords(&pb, b, n0, kt * BK, &c0, &c1);
                            emu_tma_load_2d(sB + stage * B_STAGE + b * pb.box_bytes, mb, c0, c1, full(stage));
                        }
                        if (++stage == S) stage = 0, phase ^= 1;
                    }
                }
            return;
        }
        emu_setmaxnreg(1, br.consumer_regs);
        const int cw = wg - 1, tt = t & 127, lane = tt & 31;
        const uint32_t a_off = gemm_tma_mn_offset(&pa, 64 * cw);
        int stage = 0;
        uint32_t phase = 0;
        float acc[128];
        for (int tm = 0; tm < tiles_m; tm++)
            for (int tn = 0; tn < tiles_n; tn++) {
                const int m0 = tm * BM, n0 = tn * BN;
                for (int i = 0; i < 128; i++) acc[i] = 0.0f;
                int prev = -1;
                for (int kt = 0; kt < k_tiles; kt++) {
                    while (!emu_mbar_try_wait_parity(full(stage), phase)) {
                    }
                    if (!br.no_fence) emu_wgmma_fence();
                    const uint64_t da = gemm_wgmma_desc(sA + stage * A_STAGE + a_off, pa.lbo, pa.sbo, br.desc_swizzle);
                    const uint64_t db = gemm_wgmma_desc(sB + stage * B_STAGE, pb.lbo, pb.sbo, br.desc_swizzle);
                    for (int k16 = 0; k16 < BK / 16; k16++)
                        emu_wgmma_m64nNk16_f32_bf16(acc, 256, da + ((k16 * pa.k16_bytes) >> 4), db + ((k16 * pb.k16_bytes) >> 4), 1, 1,
                                                    1, a_kmajor ? 0 : 1, b_kmajor ? 0 : 1);
                    emu_wgmma_commit();
                    emu_wgmma_wait(1);
                    if (prev >= 0 && lane == 0) emu_mbar_arrive(empty(prev));
                    prev = stage;
                    if (++stage == S) stage = 0, phase ^= 1;
                }
                emu_wgmma_wait(0);
                if (prev >= 0 && lane == 0) emu_mbar_arrive(empty(prev));
                // the epilogue's fragment positions (gemm.cu wg_stage_chunk)
                const int r = 16 * (tt >> 5) + (lane >> 2), c = 2 * (lane & 3);
                for (int j = 0; j < 32; j++)
                    for (int q = 0; q < 4; q++) {
                        const int row = m0 + 64 * cw + r + (q >= 2 ? 8 : 0), col = n0 + 8 * j + c + (q & 1);
                        if (row < M && col < N) Cout[(size_t)row * N + col] = acc[4 * j + q];
                    }
            }
    });
    int bad = 0;
    if (err.empty())
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double ref = 0;
                for (int k = 0; k < K; k++) ref += (double)Aat(m, k) * Bat(k, n);
                bad += !(fabs(Cout[(size_t)m * N + n] - ref) <= 1e-6 * (1 + fabs(ref)));
            }
    *wrong = bad;
    return err;
}

static void test_gemm_pipeline() {
    const int layouts[4][2] = { { 1, 1 }, { 1, 0 }, { 0, 0 }, { 0, 1 } };
    for (auto &l : layouts) {
        int wrong = 0;
        std::string err = run_gemm(200, 300, 100, l[0], l[1], GemmBroken(), &wrong);
        CHECK(err.empty() && wrong == 0, "gemm pipeline a_kmajor %d b_kmajor %d, 200x300x100: %d wrong (%s)", l[0], l[1], wrong, err.c_str());
    }
    struct Case {
        const char *what, *expect;
        GemmBroken br;
    } cases[4];
    cases[0] = { "expect_tx 16 bytes too many", "tx-count 16", GemmBroken() };
    cases[0].br.tx_delta = 16;
    cases[1] = { "expect_tx 16 bytes too few", "expect_tx too small", GemmBroken() };
    cases[1].br.tx_delta = -16;
    cases[2] = { "descriptor swizzle 64B (bit 63) for 128B tiles", "64-byte swizzle", GemmBroken() };
    cases[2].br.desc_swizzle = 2;
    cases[3] = { "no wgmma.fence", "no wgmma.fence", GemmBroken() };
    cases[3].br.no_fence = true;
    for (auto &c : cases) {
        int wrong = 0;
        std::string err = run_gemm(100, 60, 70, 1, 0, c.br, &wrong);
        CHECK(has(err, c.expect), "gemm %s: reported \"%s\" (expected \"%s\")", c.what, err.c_str(), c.expect);
    }
    GemmBroken br;
    br.consumer_regs = 240;
    int wrong = 0;
    std::string err = run_gemm(100, 60, 70, 1, 1, br, &wrong);
    CHECK(has(err, "over budget"), "gemm setmaxnreg.inc 240: reported \"%s\"", err.c_str());
}

int main(void) {
    test_tensor_map_rules();
    test_tma_boxes();
    test_mbarrier_phases();
    test_mbarrier_errors();
    test_wgmma_layouts();
    test_wgmma_errors();
    test_setmaxnreg();
    test_gemm_pipeline();
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}

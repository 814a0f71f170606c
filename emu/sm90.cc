// emu/sm90.cc: the sm_90a instructions of the emulator (see sm90.h for what each function is and what
// it reports). Facts are the PTX ISA's (mbarrier 9.7.13.15, cp.async.bulk.tensor, wgmma
// 9.7.15, setmaxnreg) and the CUDA driver API's (cuTensorMapEncodeTiled); each rule cites its source.
#include "sm90.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------------
// per-block state

struct Copy { // a TMA copy whose bytes stay pending until its barrier's phase completes
    uint32_t dst, bytes;
};

struct Landed { // the last TMA copy that wrote a range of shared memory
    uint32_t bytes;
    unsigned span; // its swizzle span in bytes (0: none)
};

struct Barrier {
    uint64_t word;        // what the last mbarrier operation left in the 8 bytes of shared memory
    unsigned init_thread; // who ran mbarrier.init
    bool fenced;          // init published by fence.mbarrier_init / fence.proxy.async
    uint64_t phases;      // phases completed so far (diagnostics)
    uint64_t expected_tx; // bytes this phase was told to expect, and bytes its copies completed
    uint64_t completed_tx;
    std::vector<Copy> copies;
};

struct Wgmma {
    uint64_t id;
    int group; // -1 until wgmma.commit_group
    uint64_t da, db;
    unsigned n;
    int trans_a, trans_b;
    float *key;                  // thread 0's accumulator pointer: the accumulator's identity
    std::vector<float> a, b, out; // operands as read at issue (64x16, 16xn) and the result (64xn)
};

struct Acc { // one accumulator (a set of registers in each of the 128 threads)
    unsigned n = 0;
    std::vector<float *> d;       // per thread
    std::vector<uint32_t> bits;   // what the emulator last left in them, per thread n/2 words
    uint64_t fence_gen = 0;       // the warpgroup's fence count when the emulator last wrote them
    uint64_t inflight = 0;        // id of the latest wgmma in flight on it (0: none)
};

struct WarpGroup {
    uint64_t fence_gen = 0; // wgmma.fence executed so far
    std::vector<Wgmma> inflight;
    std::map<float *, Acc> accs;
    int next_group = 0;
    unsigned regs = 0;    // current setmaxnreg value (0: as launched)
    bool reg_done = false; // has executed a setmaxnreg
    unsigned reg_want = 0; // a setmaxnreg.inc waiting for the pool (0: none)
};

struct Thread {
    bool spinning = false; // last operation was a failed wait ...
    uint64_t spin_epoch = 0; // ... when the block's state was at this epoch ...
    unsigned spin_calls = 0; // ... in this many calls (2 or more: a spin loop)
    uint32_t spin_bar = 0, spin_parity = 0;
    bool spin_regs = false;
};

struct Block {
    unsigned threads;
    std::map<uint32_t, Barrier> bars;
    std::map<uint32_t, Landed> landed; // by start address, not overlapping
    std::vector<Thread> th;
    std::vector<WarpGroup> wg;
    uint64_t epoch = 1;      // advances with every change another thread could be waiting for
    uint64_t stale_waits = 0; // failed waits since the last change
    unsigned stuck = 0;       // threads spinning that have seen the current epoch
    uint64_t next_wgmma = 1;
    long reg_pool = 0;       // registers the block's pool holds (released by .dec, not yet taken)
    unsigned reg_launch = 0; // per-thread registers reserved at launch
    explicit Block(unsigned n) : threads(n), th(n), wg((n + 127) / 128) {}
};

struct BlockSlot {
    Block *b;
};

void block_fini(void *p) {
    BlockSlot *s = static_cast<BlockSlot *>(p);
    delete s->b;
    s->b = nullptr;
}

Block &blk() {
    BlockSlot *s = static_cast<BlockSlot *>(emu_block_data("sm90", sizeof(BlockSlot), block_fini));
    if (!s->b) s->b = new Block(emu_block_threads());
    return *s->b;
}

void changed(Block &b) {
    b.epoch++;
    b.stale_waits = 0;
    b.stuck = 0;
}

bool stuck(const Block &b, const Thread &th) { return th.spinning && th.spin_epoch == b.epoch && th.spin_calls >= 2; }

void unspin(Block &b, unsigned t) {
    Thread &th = b.th[t];
    if (stuck(b, th)) b.stuck--;
    th.spinning = false;
}

// ------------------------------------------------------------------------------------------------
// mbarrier. The 8 bytes hold: bits 0-20 pending arrivals, 21-41 expected arrivals, 42-62 tx-count
// (two's complement, 21 bits), 63 phase parity. The PTX ISA ("Contents of the mbarrier object") gives
// the ranges: expected arrivals 1 .. 2^20-1, pending 0 .. 2^20-1, tx-count -(2^20-1) .. 2^20-1.

const long kMaxCount = (1L << 20) - 1;

struct MbarState {
    long pending, expected, tx;
    unsigned parity;
};

uint64_t mbar_encode(const MbarState &s) {
    return (uint64_t)(s.pending & 0x1FFFFF) | (uint64_t)(s.expected & 0x1FFFFF) << 21 |
           (uint64_t)(s.tx & 0x1FFFFF) << 42 | (uint64_t)(s.parity & 1) << 63;
}

MbarState mbar_decode(uint64_t w) {
    MbarState s;
    s.pending = (long)(w & 0x1FFFFF);
    s.expected = (long)((w >> 21) & 0x1FFFFF);
    long tx = (long)((w >> 42) & 0x1FFFFF);
    s.tx = tx >= (1L << 20) ? tx - (1L << 21) : tx;
    s.parity = (unsigned)(w >> 63);
    return s;
}

// Shared-window addresses on sm_90 lie below 227 KiB (the most a block can have); wgmma descriptors
// encode 18 bits of them. An address at or above 256 KiB cannot be a real one.
void check_window(uint32_t addr, size_t bytes, const char *op) {
    if ((uint64_t)addr + bytes > (1u << 18))
        emu_fail("%s at shared address 0x%x: beyond 256 KiB, which no sm_90 block has (227 KiB at most) and a wgmma matrix "
                 "descriptor cannot encode (18 bits); the shared window must start at the block's shared memory", op, addr);
}

uint64_t *mbar_word(uint32_t bar) {
    check_window(bar, 8, "mbarrier");
    if (bar & 7) emu_fail("mbarrier at shared address 0x%x is not 8-byte aligned (PTX ISA: mbarrier objects are 8-byte aligned)", bar);
    return reinterpret_cast<uint64_t *>(emu_smem(bar, 8));
}

// The barrier's record, after checking that it was initialised and that nothing but mbarrier
// operations has touched its bytes since.
Barrier &mbar_get(Block &b, uint32_t bar, const char *op) {
    uint64_t *w = mbar_word(bar);
    auto it = b.bars.find(bar);
    if (it == b.bars.end()) emu_fail("%s on the mbarrier at shared address 0x%x, which was never initialised (mbarrier.init)", op, bar);
    uint64_t now;
    memcpy(&now, w, 8);
    if (now != it->second.word)
        emu_fail("%s on the mbarrier at shared address 0x%x: its 8 bytes were overwritten by an ordinary store since its last mbarrier operation", op, bar);
    return it->second;
}

void mbar_store(uint32_t bar, Barrier &r, const MbarState &s) {
    r.word = mbar_encode(s);
    memcpy(mbar_word(bar), &r.word, 8);
}

// Phase completion (PTX ISA "Phase Completion of the mbarrier object"): pending arrivals and tx-count
// both zero; the barrier moves to the next phase and pending is reloaded with the expected count. The
// copies of the completed phase become readable.
void mbar_maybe_complete(Block &b, uint32_t bar, Barrier &r, MbarState &s) {
    if (s.pending != 0 || s.tx != 0) return;
    for (const Copy &c : r.copies) emu_smem_ready(c.dst, c.bytes);
    r.copies.clear();
    s.parity ^= 1;
    s.pending = s.expected;
    r.phases++;
    r.expected_tx = r.completed_tx = 0;
    (void)bar;
    changed(b);
}

void mbar_arrive_common(uint32_t bar, uint32_t tx, const char *op) {
    Block &b = blk();
    unspin(b, emu_thread_rank());
    Barrier &r = mbar_get(b, bar, op);
    MbarState s = mbar_decode(r.word);
    if (tx) {
        // expect-tx operation: tx-count += bytes, within the ISA's range
        if (s.tx + (long)tx > kMaxCount)
            emu_fail("%s of %u bytes on the mbarrier at 0x%x (phase %llu): tx-count %ld + %u exceeds the PTX ISA's maximum 2^20-1",
                     op, tx, bar, (unsigned long long)r.phases, s.tx, tx);
        s.tx += tx;
        r.expected_tx += tx;
    }
    if (s.pending == 0)
        emu_fail("%s on the mbarrier at 0x%x (phase %llu): all %ld expected arrivals of this phase have already happened "
                 "(the phase waits for %ld tx bytes)", op, bar, (unsigned long long)r.phases, s.expected, s.tx);
    s.pending--;
    changed(b);
    if (s.pending == 0 && s.tx < 0)
        emu_fail("%s on the mbarrier at 0x%x (phase %llu): the phase's copies completed %llu bytes but its arrivals expected "
                 "only %llu (expect_tx too small)", op, bar, (unsigned long long)r.phases,
                 (unsigned long long)r.completed_tx, (unsigned long long)r.expected_tx);
    mbar_maybe_complete(b, bar, r, s);
    mbar_store(bar, r, s);
}

// complete-tx by the async proxy (a TMA copy of `bytes` bytes landing). A phase whose arrivals are all in
// while its tx-count is below zero could only be completed by a standalone mbarrier.expect_tx, which the
// sources do not use (and this module does not model): reported as an expect_tx too small.
void mbar_complete_tx(Block &b, uint32_t bar, Barrier &r, uint32_t bytes) {
    MbarState s = mbar_decode(r.word);
    if (s.tx - (long)bytes < -kMaxCount)
        emu_fail("TMA copy of %u bytes completing on the mbarrier at 0x%x: tx-count %ld - %u is below the PTX ISA's minimum -(2^20-1)",
                 bytes, bar, s.tx, bytes);
    s.tx -= bytes;
    r.completed_tx += bytes;
    changed(b);
    if (s.pending == 0 && s.tx < 0)
        emu_fail("TMA copy completing on the mbarrier at 0x%x (phase %llu): its copies completed %llu bytes, more than the %llu "
                 "its arrive.expect_tx announced (expect_tx too small)", bar, (unsigned long long)r.phases,
                 (unsigned long long)r.completed_tx, (unsigned long long)r.expected_tx);
    mbar_maybe_complete(b, bar, r, s);
    mbar_store(bar, r, s);
}

std::string describe(Block &b) {
    std::string out;
    char line[512];
    std::map<uint32_t, std::vector<unsigned>> waiters;
    std::vector<unsigned> reg_waiters;
    for (unsigned t = 0; t < b.threads; t++)
        if (b.th[t].spinning) {
            if (b.th[t].spin_regs)
                reg_waiters.push_back(t);
            else
                waiters[b.th[t].spin_bar].push_back(t);
        }
    for (auto &w : waiters) {
        auto it = b.bars.find(w.first);
        if (it == b.bars.end()) continue;
        MbarState s = mbar_decode(it->second.word);
        snprintf(line, sizeof line,
                 "%s%zu thread(s) (first %u) wait for parity %u of the mbarrier at 0x%x: phase %llu (parity %u) has %ld of %ld "
                 "arrivals pending and tx-count %ld (expected %llu bytes, copies completed %llu)",
                 out.empty() ? "" : "; ", w.second.size(), w.second[0], b.th[w.second[0]].spin_parity, w.first,
                 (unsigned long long)it->second.phases, s.parity, s.pending, s.expected, s.tx,
                 (unsigned long long)it->second.expected_tx, (unsigned long long)it->second.completed_tx);
        out += line;
    }
    if (!reg_waiters.empty()) {
        snprintf(line, sizeof line, "%s%zu thread(s) (first %u) wait in setmaxnreg.inc for registers the pool (%ld free) does not have",
                 out.empty() ? "" : "; ", reg_waiters.size(), reg_waiters[0], b.reg_pool);
        out += line;
    }
    return out;
}

// A failed wait by the calling thread: it has seen the current state. A thread that fails again at the
// same state in a later call is spinning. When every thread of the block spins on a state that has
// not changed, or 2^18 waits have failed in a row without any change, no thread can make progress:
// a deadlock, reported with what everybody waits for.
void note_spin(Block &b, unsigned t, uint32_t bar, uint32_t parity, bool regs) {
    Thread &th = b.th[t];
    if (!(th.spinning && th.spin_epoch == b.epoch && th.spin_bar == bar && th.spin_regs == regs)) {
        if (stuck(b, th)) b.stuck--;
        th.spin_calls = 0;
    }
    th.spinning = true;
    th.spin_epoch = b.epoch;
    th.spin_bar = bar;
    th.spin_parity = parity;
    th.spin_regs = regs;
    if (++th.spin_calls == 2) b.stuck++;
    if (b.stuck == b.threads) emu_fail("deadlock: every thread of the block waits and none can proceed: %s", describe(b).c_str());
    if (++b.stale_waits > (1u << 18))
        emu_fail("deadlock: %llu waits failed without any mbarrier or register-pool change: %s",
                 (unsigned long long)b.stale_waits, describe(b).c_str());
}

// ------------------------------------------------------------------------------------------------
// tensor maps

const uint32_t kMapMagic = 0x4d414d54; // "TMAM"

struct TensorMap {
    uint32_t magic;
    uint8_t dtype, rank, interleave, swizzle, l2, oob, elsize, pad;
    uint64_t addr;
    uint64_t dim[5];
    uint64_t stride[4]; // bytes, dimensions 1..rank-1
    uint16_t box[5];
    uint8_t estride[5];
};
static_assert(sizeof(TensorMap) <= EMU_TENSOR_MAP_BYTES, "the tensor map must fit a CUtensorMap");

int elem_bytes(int dtype) {
    switch (dtype) {
    case EMU_TM_UINT8: return 1;
    case EMU_TM_UINT16: case EMU_TM_FLOAT16: case EMU_TM_BFLOAT16: return 2;
    case EMU_TM_UINT32: case EMU_TM_INT32: case EMU_TM_FLOAT32: case EMU_TM_FLOAT32_FTZ: case EMU_TM_TFLOAT32:
    case EMU_TM_TFLOAT32_FTZ: return 4;
    case EMU_TM_UINT64: case EMU_TM_INT64: case EMU_TM_FLOAT64: return 8;
    default: return 0; // the packed sub-byte types: validated, not emulated
    }
}

bool is_float(int dtype) {
    return dtype == EMU_TM_FLOAT16 || dtype == EMU_TM_FLOAT32 || dtype == EMU_TM_FLOAT64 || dtype == EMU_TM_BFLOAT16 ||
           dtype == EMU_TM_FLOAT32_FTZ || dtype == EMU_TM_TFLOAT32 || dtype == EMU_TM_TFLOAT32_FTZ;
}

// The swizzle span in bytes of a tensor-map swizzle mode (0: none).
unsigned swizzle_span(int swizzle) {
    switch (swizzle) {
    case EMU_TM_SWIZZLE_32B: return 32;
    case EMU_TM_SWIZZLE_64B: return 64;
    case EMU_TM_SWIZZLE_NONE: return 0;
    default: return 128;
    }
}

// The 16-byte-chunk swizzles (CuTe's Swizzle<B,4,3> on byte addresses: bits 4..4+B-1 ^= bits 7..7+B-1),
// as TMA writes and wgmma reads them; B = 3, 2, 1 for 128, 64, 32 bytes. The pattern repeats every
// 1024, 512, 256 bytes (PTX ISA "Matrix Descriptor Format", base offset table).
uint32_t swizzle_addr(uint32_t a, unsigned span) {
    switch (span) {
    case 128: return a ^ (((a >> 7) & 7) << 4);
    case 64: return a ^ (((a >> 7) & 3) << 4);
    case 32: return a ^ (((a >> 7) & 1) << 4);
    default: return a;
    }
}

#define WHY(...)                                                                                                  \
    do {                                                                                                          \
        snprintf(why, n, __VA_ARGS__);                                                                            \
        return 1;                                                                                                 \
    } while (0)

} // namespace

// The rules are the CUDA driver API's, "Tensor Map Object Management", cuTensorMapEncodeTiled.
int emu_tensor_map_check(void *map, int dtype, uint32_t rank, void *global_address, const uint64_t *global_dim,
                         const uint64_t *global_strides, const uint32_t *box_dim, const uint32_t *element_strides,
                         int interleave, int swizzle, int l2_promotion, int oob_fill, char *why, size_t n) {
    if (n) why[0] = 0;
    if (!map || (uintptr_t)map % 64) WHY("tensorMap address %p must be aligned to 64 bytes", map);
    if (dtype < EMU_TM_UINT8 || dtype > EMU_TM_16U6_ALIGN16B) WHY("tensorDataType %d is not a CUtensorMapDataType", dtype);
    if (interleave < EMU_TM_INTERLEAVE_NONE || interleave > EMU_TM_INTERLEAVE_32B) WHY("interleave %d is not a CUtensorMapInterleave", interleave);
    if (swizzle < EMU_TM_SWIZZLE_NONE || swizzle > EMU_TM_SWIZZLE_128B_ATOM_64B) WHY("swizzle %d is not a CUtensorMapSwizzle", swizzle);
    if (l2_promotion < EMU_TM_L2_NONE || l2_promotion > EMU_TM_L2_256B) WHY("l2Promotion %d is not a CUtensorMapL2promotion", l2_promotion);
    if (oob_fill < EMU_TM_OOB_FILL_NONE || oob_fill > EMU_TM_OOB_FILL_NAN_REQUEST_ZERO_FMA) WHY("oobFill %d is not a CUtensorMapFloatOOBfill", oob_fill);
    // "tensorRank must be non-zero and less than or equal to the maximum supported dimensionality of 5.
    // If interleave is not CU_TENSOR_MAP_INTERLEAVE_NONE, then tensorRank must additionally be >= 3."
    if (rank < 1 || rank > 5) WHY("tensorRank %u must be 1 to 5", rank);
    if (interleave != EMU_TM_INTERLEAVE_NONE && rank < 3) WHY("tensorRank %u must be at least 3 with interleave %d", rank, interleave);
    const bool packed16 = dtype == EMU_TM_16U4_ALIGN16B || dtype == EMU_TM_16U6_ALIGN16B;
    // "globalAddress ... must be 16 byte aligned"; 32 with INTERLEAVE_32B or the 16-byte packed types
    const uintptr_t ga = (uintptr_t)global_address;
    if (ga % 16) WHY("globalAddress %p must be 16-byte aligned", global_address);
    if ((interleave == EMU_TM_INTERLEAVE_32B || packed16) && ga % 32) WHY("globalAddress %p must be 32-byte aligned here", global_address);
    // "globalDim ... must be non-zero and less than or equal to 2^32"
    for (uint32_t i = 0; i < rank; i++)
        if (global_dim[i] == 0 || global_dim[i] > (1ULL << 32)) WHY("globalDim[%u] = %llu must be 1 to 2^32", i, (unsigned long long)global_dim[i]);
    if (packed16 && global_dim[0] % 128) WHY("globalDim[0] = %llu must be a multiple of 128 for this packed type", (unsigned long long)global_dim[0]);
    if (dtype == EMU_TM_16U4_ALIGN8B && global_dim[0] % 2) WHY("globalDim[0] = %llu must be even for 16U4_ALIGN8B", (unsigned long long)global_dim[0]);
    // "globalStrides ... must be a multiple of 16 and less than 2^40"; 32 with INTERLEAVE_32B or the
    // 16-byte packed types; each includes the previous dimension: stride[0] >= dim[0] * elementsize,
    // stride[i] >= stride[i-1] * dim[i] (the documented formula with padding >= 0)
    const int es = elem_bytes(dtype);
    for (uint32_t i = 0; i + 1 < rank; i++) {
        const uint64_t s = global_strides[i];
        if (s % 16 || s >= (1ULL << 40)) WHY("globalStrides[%u] = %llu must be a multiple of 16 and less than 2^40", i, (unsigned long long)s);
        if ((interleave == EMU_TM_INTERLEAVE_32B || packed16) && s % 32) WHY("globalStrides[%u] = %llu must be a multiple of 32 here", i, (unsigned long long)s);
        const uint64_t inner = i == 0 ? global_dim[0] * (uint64_t)(es ? es : 1) : global_strides[i - 1] * global_dim[i];
        if (es && s < inner)
            WHY("globalStrides[%u] = %llu is smaller than the dimension it includes (%llu bytes)", i, (unsigned long long)s, (unsigned long long)inner);
    }
    // "boxDim ... must be non-zero and less than or equal to 256"; with INTERLEAVE_NONE boxDim[0] *
    // elementSize a multiple of 16 bytes; 128 for the 16-byte packed types
    for (uint32_t i = 0; i < rank; i++)
        if (box_dim[i] == 0 || box_dim[i] > 256) WHY("boxDim[%u] = %u must be 1 to 256", i, box_dim[i]);
    if (interleave == EMU_TM_INTERLEAVE_NONE && es && (box_dim[0] * es) % 16)
        WHY("boxDim[0] * element size = %u bytes must be a multiple of 16", box_dim[0] * es);
    if (packed16 && box_dim[0] != 128) WHY("boxDim[0] = %u must be 128 for this packed type", box_dim[0]);
    // "elementStrides ... must be non-zero and less than or equal to 8"
    for (uint32_t i = 0; i < rank; i++)
        if (element_strides[i] == 0 || element_strides[i] > 8) WHY("elementStrides[%u] = %u must be 1 to 8", i, element_strides[i]);
    // With INTERLEAVE_NONE and a swizzle, "the bounding box inner dimension (boxDim[0] multiplied by
    // element size) must be less than or equal to the swizzle size"
    if (interleave == EMU_TM_INTERLEAVE_NONE && swizzle != EMU_TM_SWIZZLE_NONE && es && box_dim[0] * es > swizzle_span(swizzle))
        WHY("boxDim[0] * element size = %u bytes exceeds the %u-byte swizzle", box_dim[0] * es, swizzle_span(swizzle));
    if (dtype == EMU_TM_16U6_ALIGN16B && interleave != EMU_TM_INTERLEAVE_NONE) WHY("16U6_ALIGN16B requires INTERLEAVE_NONE");
    // "When interleave is CU_TENSOR_MAP_INTERLEAVE_32B, swizzle must be CU_TENSOR_MAP_SWIZZLE_32B."
    if (interleave == EMU_TM_INTERLEAVE_32B && swizzle != EMU_TM_SWIZZLE_32B) WHY("interleave 32B requires swizzle 32B (swizzle %d)", swizzle);
    if (dtype == EMU_TM_16U6_ALIGN16B && swizzle != EMU_TM_SWIZZLE_NONE && swizzle != EMU_TM_SWIZZLE_128B &&
        swizzle != EMU_TM_SWIZZLE_128B_ATOM_32B && swizzle != EMU_TM_SWIZZLE_128B_ATOM_64B)
        WHY("swizzle %d is not supported for 16U6_ALIGN16B", swizzle);
    if (dtype == EMU_TM_16U4_ALIGN16B && swizzle != EMU_TM_SWIZZLE_NONE && swizzle != EMU_TM_SWIZZLE_128B &&
        swizzle != EMU_TM_SWIZZLE_128B_ATOM_32B)
        WHY("swizzle %d is not supported for 16U4_ALIGN16B", swizzle);
    // "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA can only be used when tensorDataType represents
    // a floating-point data type"
    if (oob_fill == EMU_TM_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float(dtype)) WHY("NaN out-of-bounds fill needs a floating-point type (%d)", dtype);

    TensorMap m;
    memset(&m, 0, sizeof m);
    m.magic = kMapMagic;
    m.dtype = (uint8_t)dtype;
    m.rank = (uint8_t)rank;
    m.interleave = (uint8_t)interleave;
    m.swizzle = (uint8_t)swizzle;
    m.l2 = (uint8_t)l2_promotion;
    m.oob = (uint8_t)oob_fill;
    m.elsize = (uint8_t)es;
    m.addr = ga;
    for (uint32_t i = 0; i < rank; i++) {
        m.dim[i] = global_dim[i];
        m.box[i] = (uint16_t)box_dim[i];
        m.estride[i] = (uint8_t)element_strides[i];
        if (i + 1 < rank) m.stride[i] = global_strides[i];
    }
    memset(map, 0, EMU_TENSOR_MAP_BYTES);
    memcpy(map, &m, sizeof m);
    return 0;
}

int emu_tensor_map_encode_tiled(void *map, int dtype, uint32_t rank, void *global_address, const uint64_t *global_dim,
                                const uint64_t *global_strides, const uint32_t *box_dim,
                                const uint32_t *element_strides, int interleave, int swizzle, int l2_promotion,
                                int oob_fill) {
    char why[256];
    int r = emu_tensor_map_check(map, dtype, rank, global_address, global_dim, global_strides, box_dim, element_strides,
                                 interleave, swizzle, l2_promotion, oob_fill, why, sizeof why);
    if (r) fprintf(stderr, "emu: cuTensorMapEncodeTiled: %s\n", why);
    return r;
}

#ifdef LLM4D_EMU_CUDA_H
CUresult emu_cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType dtype, cuuint32_t rank, void *global_address,
                                    const cuuint64_t *global_dim, const cuuint64_t *global_strides,
                                    const cuuint32_t *box_dim, const cuuint32_t *element_strides,
                                    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
    static_assert(sizeof(CUtensorMap) == EMU_TENSOR_MAP_BYTES, "CUtensorMap is 128 bytes");
    return emu_tensor_map_encode_tiled(map, (int)dtype, rank, global_address, global_dim, global_strides, box_dim,
                                       element_strides, (int)interleave, (int)swizzle, (int)l2_promotion, (int)oob_fill)
               ? CUDA_ERROR_INVALID_VALUE
               : CUDA_SUCCESS;
}
#endif

// ------------------------------------------------------------------------------------------------
// mbarrier entry points

void emu_mbar_init(uint32_t bar, uint32_t count) {
    Block &b = blk();
    uint64_t *w = mbar_word(bar);
    if (count < 1 || count > (uint32_t)kMaxCount)
        emu_fail("mbarrier.init of the mbarrier at 0x%x with count %u (PTX ISA: 1 to 2^20-1)", bar, count);
    auto it = b.bars.find(bar);
    if (it != b.bars.end() && !it->second.copies.empty())
        emu_fail("mbarrier.init of the mbarrier at 0x%x while %zu TMA copies on it are still in flight", bar, it->second.copies.size());
    Barrier &r = b.bars[bar];
    r.init_thread = emu_thread_rank();
    r.fenced = false;
    r.phases = r.expected_tx = r.completed_tx = 0;
    r.copies.clear();
    MbarState s = { (long)count, (long)count, 0, 0 };
    r.word = mbar_encode(s);
    memcpy(w, &r.word, 8);
    unspin(b, r.init_thread);
    changed(b);
}

void emu_mbar_arrive(uint32_t bar) { mbar_arrive_common(bar, 0, "mbarrier.arrive"); }

void emu_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    if (bytes == 0) {
        mbar_arrive_common(bar, 0, "mbarrier.arrive.expect_tx");
        return;
    }
    mbar_arrive_common(bar, bytes, "mbarrier.arrive.expect_tx");
}

bool emu_mbar_try_wait_parity(uint32_t bar, uint32_t parity) {
    parity &= 1;
    uint64_t seen = 0;
    for (int look = 0; look < 2; look++) {
        Block &b = blk();
        const unsigned t = emu_thread_rank();
        Barrier &r = mbar_get(b, bar, "mbarrier.try_wait.parity");
        // the phase with this parity is complete when the current phase has the other parity
        if (mbar_decode(r.word).parity != parity) {
            unspin(b, t);
            return true;
        }
        if (look == 0 || b.epoch != seen) note_spin(b, t, bar, parity, false); // one call counts once per state
        seen = b.epoch;
        if (look == 0) emu_yield();
    }
    return false;
}

void emu_fence_mbarrier_init(void) {
    Block &b = blk();
    const unsigned t = emu_thread_rank();
    for (auto &kv : b.bars)
        if (kv.second.init_thread == t) kv.second.fenced = true;
}

void emu_fence_proxy_async(void) { emu_fence_mbarrier_init(); }

// ------------------------------------------------------------------------------------------------
// TMA

void emu_tma_load_2d(uint32_t dst, const void *tensor_map, int c0, int c1, uint32_t bar) {
    Block &b = blk();
    unspin(b, emu_thread_rank());
    // PTX ISA (cp.async.bulk.tensor): the tensor map is 64-byte aligned; the shared-memory destination
    // 128-byte aligned
    if ((uintptr_t)tensor_map % 64) emu_fail("cp.async.bulk.tensor: tensor map at %p is not 64-byte aligned", tensor_map);
    TensorMap m;
    memcpy(&m, tensor_map, sizeof m);
    if (m.magic != kMapMagic) emu_fail("cp.async.bulk.tensor: %p is not a tensor map made by cuTensorMapEncodeTiled", tensor_map);
    if (m.rank != 2) emu_fail("cp.async.bulk.tensor.2d with a tensor map of rank %u", m.rank);
    if (m.elsize == 0 || m.interleave != EMU_TM_INTERLEAVE_NONE || m.swizzle > EMU_TM_SWIZZLE_128B)
        emu_fail("cp.async.bulk.tensor: the emulator does not model tensor maps with data type %u, interleave %u or swizzle %u",
                 m.dtype, m.interleave, m.swizzle);
    if (dst % 128) emu_fail("cp.async.bulk.tensor: shared-memory destination 0x%x is not 128-byte aligned", dst);
    check_window(dst, (size_t)m.box[0] * m.box[1] * m.elsize, "cp.async.bulk.tensor destination");
    Barrier &r = mbar_get(b, bar, "cp.async.bulk.tensor (complete_tx)");
    if (!r.fenced)
        emu_fail("cp.async.bulk.tensor completes on the mbarrier at 0x%x, whose mbarrier.init (thread %u) was not made visible "
                 "to the async proxy by fence.mbarrier_init or fence.proxy.async", bar, r.init_thread);
    // Elements loaded along each dimension: ceil(box / elementStride); dimension 0 ignores its stride
    // without interleave (driver API, elementStrides).
    const uint32_t n0 = m.box[0], n1 = (m.box[1] + m.estride[1] - 1) / m.estride[1];
    const uint32_t es = m.elsize, row = n0 * es, bytes = row * n1;
    const unsigned span = swizzle_span(m.swizzle);
    unsigned char *base = emu_smem(dst, bytes); // fails past the launch's shared memory
    (void)base;
    emu_smem_pending(dst, bytes);
    unsigned char fill[8];
    memset(fill, 0, sizeof fill);
    if (m.oob == EMU_TM_OOB_FILL_NAN_REQUEST_ZERO_FMA) {
        const uint16_t h = m.dtype == EMU_TM_BFLOAT16 ? 0x7FC0 : 0x7E00;
        const uint32_t f = 0x7FC00000u;
        const uint64_t d = 0x7FF8000000000000ULL;
        if (es == 2) memcpy(fill, &h, 2);
        else if (es == 4) memcpy(fill, &f, 4);
        else memcpy(fill, &d, 8);
    }
    const unsigned char *g = reinterpret_cast<const unsigned char *>((uintptr_t)m.addr);
    for (uint32_t i1 = 0; i1 < n1; i1++) {
        const long long y = (long long)c1 + (long long)i1 * m.estride[1];
        for (uint32_t i0 = 0; i0 < n0; i0++) {
            const long long x = (long long)c0 + i0;
            const uint32_t a = swizzle_addr(dst + i1 * row + i0 * es, span);
            unsigned char *p = emu_smem(a, es);
            if (x < 0 || y < 0 || (uint64_t)x >= m.dim[0] || (uint64_t)y >= m.dim[1])
                memcpy(p, fill, es);
            else
                memcpy(p, g + (uint64_t)y * m.stride[0] + (uint64_t)x * es, es);
        }
    }
    // what wgmma later reads here must be described with this copy's swizzle
    auto lo = b.landed.lower_bound(dst);
    if (lo != b.landed.begin() && std::prev(lo)->first + std::prev(lo)->second.bytes > dst) --lo;
    while (lo != b.landed.end() && lo->first < dst + bytes) lo = b.landed.erase(lo);
    b.landed[dst] = { bytes, span };
    r.copies.push_back({ dst, bytes });
    mbar_complete_tx(b, bar, r, bytes);
}

// ------------------------------------------------------------------------------------------------
// wgmma

namespace {

const uint32_t kPoison = 0x7FC0DEADu; // a quiet NaN: accumulators read before their wait_group

float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

const char *span_name(unsigned span) {
    switch (span) {
    case 128: return "128-byte";
    case 64: return "64-byte";
    case 32: return "32-byte";
    default: return "no";
    }
}

struct Desc {
    uint32_t start, lbo, sbo;
    unsigned base_offset, swizzle_mode, span;
};

// PTX ISA "Matrix Descriptor Format": bits 13-0 start address, 29-16 leading-dimension byte offset,
// 45-32 stride-dimension byte offset (each (x & 0x3FFFF) >> 4), 51-49 base offset, 63-62 swizzle
// (0 none, 1 128 B, 2 64 B, 3 32 B).
Desc decode_desc(uint64_t d, const char *which) {
    Desc r;
    r.start = (uint32_t)(d & 0x3FFF) << 4;
    r.lbo = (uint32_t)((d >> 16) & 0x3FFF) << 4;
    r.sbo = (uint32_t)((d >> 32) & 0x3FFF) << 4;
    r.base_offset = (unsigned)((d >> 49) & 7);
    r.swizzle_mode = (unsigned)(d >> 62);
    static const unsigned spans[4] = { 0, 128, 64, 32 };
    r.span = spans[r.swizzle_mode];
    if (d & (3ULL << 14 | 3ULL << 30 | 7ULL << 46 | 0x3FFULL << 52))
        emu_fail("wgmma: descriptor %s 0x%016llx sets bits outside its fields (14-15, 30-31, 46-48, 52-61): a field overflowed",
                 which, (unsigned long long)d);
    if (r.base_offset)
        emu_fail("wgmma: descriptor %s 0x%016llx has base offset %u; the emulator models only patterns that start on their "
                 "repeat boundary (base offset 0)", which, (unsigned long long)d, r.base_offset);
    return r;
}

// Byte address (before the swizzle) of element (mn, k) of a 16-bit operand with k < 16, in the
// canonical layouts of the PTX ISA ("Canonical Layouts", T = 8 elements of 16 bits per 16 bytes):
//   K-major, none:   ((8,m),(T,2k)):((1T,SBO),(1,LBO))   K-major, 32/64/128 B: ((8,m),(T,2k)):((wT,SBO),(1,T))
//   MN-major, none:  ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) MN-major, swizzled: ((T,w,m),(8,k)):((1,T,LBO),(wT,SBO))
// with w = span / 16 16-byte chunks per swizzled row.
uint32_t operand_addr(const Desc &d, bool mn_major, unsigned mn, unsigned k) {
    if (!mn_major) {
        if (d.span == 0) return d.start + (mn % 8) * 16 + (mn / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo;
        return d.start + (mn % 8) * d.span + (mn / 8) * d.sbo + k * 2;
    }
    if (d.span == 0) return d.start + (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
    const unsigned per_row = d.span / 2; // elements per swizzled row
    return d.start + (mn % per_row) * 2 + (mn / per_row) * d.lbo + (k % 8) * d.span + (k / 8) * d.sbo;
}

// Reads an operand (rows x 16, row = m or n) through its descriptor; reports bytes that a TMA copy is
// still writing (its barrier's phase has not completed).
void read_operand(Block &b, const Desc &d, bool mn_major, unsigned rows, const char *which, std::vector<float> &out) {
    out.resize((size_t)rows * 16);
    std::vector<Copy> pend;
    for (auto &kv : b.bars)
        for (const Copy &c : kv.second.copies) pend.push_back(c);
    for (unsigned r = 0; r < rows; r++)
        for (unsigned k = 0; k < 16; k++) {
            const uint32_t a = swizzle_addr(operand_addr(d, mn_major, r, k), d.span);
            for (const Copy &c : pend)
                if (a + 2 > c.dst && a < c.dst + c.bytes)
                    emu_fail("wgmma reads %s element (%u, %u) at shared address 0x%x, which a TMA copy to [0x%x, 0x%x) is still writing "
                             "(its mbarrier phase has not completed)", which, r, k, a, c.dst, c.dst + c.bytes);
            auto it = b.landed.upper_bound(a);
            if (it != b.landed.begin() && a < std::prev(it)->first + std::prev(it)->second.bytes &&
                std::prev(it)->second.span != d.span)
                emu_fail("wgmma reads %s through a descriptor with %s swizzle (mode %u) from shared memory [0x%x, 0x%x) that a "
                         "TMA copy wrote with %s swizzle", which, span_name(d.span), d.swizzle_mode, std::prev(it)->first,
                         std::prev(it)->first + std::prev(it)->second.bytes, span_name(std::prev(it)->second.span));
            uint16_t h;
            memcpy(&h, emu_smem(a, 2), 2);
            out[(size_t)r * 16 + k] = bf16_to_float(h);
        }
}

struct WgmmaArgs {
    unsigned thread;
    float *d;
    unsigned n;
    uint64_t da, db;
    int scale_d, scale_a, scale_b, trans_a, trans_b;
};

// Accumulator fragment of m64nNk16 with f32 D (PTX ISA figure "WGMMA .m64nNk16 register fragment
// layout for accumulator matrix D"): thread t (warp w = t/32, lane l) holds, for each 8 columns j,
// d[4j], d[4j+1] at row 16w + l/4, columns 8j + 2(l%4) + {0,1}, and d[4j+2], d[4j+3] at row +8.
void frag_pos(unsigned t, unsigned i, unsigned *row, unsigned *col) {
    const unsigned w = t / 32, l = t % 32, j = i / 4, q = i % 4;
    *row = 16 * w + l / 4 + (q >= 2 ? 8 : 0);
    *col = 8 * j + 2 * (l % 4) + (q & 1);
}

WarpGroup &my_wg(Block &b, unsigned thread) { return b.wg[thread / 128]; }

void check_group(void **args, unsigned n, const char *op) {
    if (n != 128) emu_fail("%s executed by %u threads, not a warpgroup of 128", op, n);
    const unsigned t0 = static_cast<WgmmaArgs *>(args[0])->thread;
    if (t0 % 128) emu_fail("%s: warpgroup starts at thread %u, not a multiple of 128", op, t0);
}

void exec_wgmma(void **args, unsigned n, void *) {
    check_group(args, n, "wgmma.mma_async");
    Block &b = blk();
    const WgmmaArgs &a0 = *static_cast<WgmmaArgs *>(args[0]);
    WarpGroup &wg = my_wg(b, a0.thread);
    for (unsigned i = 1; i < n; i++) {
        const WgmmaArgs &ai = *static_cast<WgmmaArgs *>(args[i]);
        if (ai.n != a0.n || ai.da != a0.da || ai.db != a0.db || ai.scale_d != a0.scale_d || ai.scale_a != a0.scale_a ||
            ai.scale_b != a0.scale_b || ai.trans_a != a0.trans_a || ai.trans_b != a0.trans_b)
            emu_fail("wgmma.mma_async: thread %u passes different operands than thread %u of its warpgroup (descriptors "
                     "0x%016llx/0x%016llx vs 0x%016llx/0x%016llx): .aligned requires the same instruction", ai.thread, a0.thread,
                     (unsigned long long)ai.da, (unsigned long long)ai.db, (unsigned long long)a0.da, (unsigned long long)a0.db);
    }
    const unsigned N = a0.n;
    if (N < 8 || N > 256 || N % 8) emu_fail("wgmma.mma_async.m64n%uk16: n must be a multiple of 8 from 8 to 256", N);
    if ((a0.scale_a != 1 && a0.scale_a != -1) || (a0.scale_b != 1 && a0.scale_b != -1))
        emu_fail("wgmma.mma_async: imm-scale-a %d / imm-scale-b %d must be 1 or -1", a0.scale_a, a0.scale_b);
    if ((a0.trans_a & ~1) || (a0.trans_b & ~1)) emu_fail("wgmma.mma_async: imm-trans-a %d / imm-trans-b %d must be 0 or 1", a0.trans_a, a0.trans_b);
    const unsigned nreg = N / 2;

    // wgmma.fence (PTX ISA, wgmma.fence): required before the first wgmma.mma_async of the warpgroup and
    // between a register access and a wgmma.mma_async that accesses the same registers, except across
    // wgmma.mma_async of the same shape on the same accumulators. Checked: a first wgmma without any
    // fence, and accumulator registers that differ from what the emulator last left there (written by
    // the thread) with no fence since.
    if (wg.fence_gen == 0)
        emu_fail("wgmma.mma_async with no wgmma.fence before it in warpgroup %u (PTX ISA: required before the first wgmma.mma_async)", a0.thread / 128);
    Acc &acc = wg.accs[a0.d];
    if (acc.n == 0) {
        acc.n = N;
        acc.d.resize(128);
        for (unsigned i = 0; i < 128; i++) acc.d[i] = static_cast<WgmmaArgs *>(args[i])->d;
        acc.bits.assign((size_t)128 * nreg, 0);
        acc.fence_gen = 0; // never written by the emulator: the fence before this wgmma covers the thread's writes
    } else {
        if (acc.n != N) emu_fail("wgmma.mma_async: accumulator of m64n%uk16 reused by m64n%uk16 while known to the emulator", acc.n, N);
        for (unsigned i = 0; i < 128; i++) {
            float *di = static_cast<WgmmaArgs *>(args[i])->d;
            if (di == acc.d[i]) continue;
            if (acc.inflight)
                emu_fail("wgmma.mma_async: thread %u names other accumulator registers than the wgmma in flight on thread %u's",
                         static_cast<WgmmaArgs *>(args[i])->thread, a0.thread);
            acc.d[i] = di; // a new accumulator at the same place: the fence rule cannot be checked on it
            acc.fence_gen = ~0ULL;
        }
        if (acc.fence_gen == wg.fence_gen)
            for (unsigned i = 0; i < 128; i++) {
                const WgmmaArgs &ai = *static_cast<WgmmaArgs *>(args[i]);
                if (memcmp(ai.d, &acc.bits[(size_t)i * nreg], nreg * 4))
                    emu_fail("wgmma.mma_async: thread %u wrote its accumulator registers since the last wgmma on them without a "
                             "wgmma.fence in between (PTX ISA: wgmma.fence is required between a register access and a "
                             "wgmma.mma_async that accesses the same registers)", ai.thread);
            }
    }

    Wgmma w;
    w.id = b.next_wgmma++;
    w.group = -1;
    w.da = a0.da;
    w.db = a0.db;
    w.n = N;
    w.trans_a = a0.trans_a;
    w.trans_b = a0.trans_b;
    w.key = a0.d;
    const Desc dA = decode_desc(a0.da, "A"), dB = decode_desc(a0.db, "B");
    read_operand(b, dA, a0.trans_a, 64, "A", w.a);
    read_operand(b, dB, a0.trans_b, N, "B", w.b);
    // The accumulator's input: the result of the wgmma in flight on it (same-shape wgmma are ordered),
    // else the registers.
    std::vector<float> in((size_t)64 * N, 0.0f);
    if (a0.scale_d) {
        const Wgmma *prev = nullptr;
        for (const Wgmma &o : wg.inflight)
            if (o.id == acc.inflight) prev = &o;
        if (prev)
            in = prev->out;
        else
            for (unsigned t = 0; t < 128; t++)
                for (unsigned i = 0; i < nreg; i++) {
                    unsigned r, c;
                    frag_pos(t, i, &r, &c);
                    in[(size_t)r * N + c] = acc.d[t][i];
                }
    }
    // D = scale_a*A . scale_b*B (+ D): products of bf16 are exact in double; one rounding to float.
    const double sab = (double)a0.scale_a * a0.scale_b;
    w.out.resize((size_t)64 * N);
    for (unsigned m = 0; m < 64; m++)
        for (unsigned c = 0; c < N; c++) {
            double s = 0;
            for (unsigned k = 0; k < 16; k++) s += (double)w.a[m * 16 + k] * (double)w.b[(size_t)c * 16 + k];
            w.out[(size_t)m * N + c] = (float)((double)in[(size_t)m * N + c] + sab * s);
        }
    // until the covering wait_group the registers hold poison
    for (unsigned t = 0; t < 128; t++) {
        for (unsigned i = 0; i < nreg; i++) memcpy(&acc.d[t][i], &kPoison, 4);
        memcpy(&acc.bits[(size_t)t * nreg], acc.d[t], nreg * 4);
    }
    acc.fence_gen = wg.fence_gen;
    acc.inflight = w.id;
    wg.inflight.push_back(std::move(w));
}

struct GroupArgs {
    unsigned thread;
    int n;
};

void exec_fence(void **args, unsigned n, void *) {
    check_group(args, n, "wgmma.fence");
    my_wg(blk(), static_cast<GroupArgs *>(args[0])->thread).fence_gen++;
}

void exec_commit(void **args, unsigned n, void *) {
    check_group(args, n, "wgmma.commit_group");
    WarpGroup &wg = my_wg(blk(), static_cast<GroupArgs *>(args[0])->thread);
    const int g = wg.next_group++;
    for (Wgmma &w : wg.inflight)
        if (w.group < 0) w.group = g;
}

void exec_wait(void **args, unsigned n, void *) {
    check_group(args, n, "wgmma.wait_group");
    Block &b = blk();
    const GroupArgs &a0 = *static_cast<GroupArgs *>(args[0]);
    for (unsigned i = 1; i < n; i++)
        if (static_cast<GroupArgs *>(args[i])->n != a0.n)
            emu_fail("wgmma.wait_group: thread %u waits for %d groups, thread %u for %d", static_cast<GroupArgs *>(args[i])->thread,
                     static_cast<GroupArgs *>(args[i])->n, a0.thread, a0.n);
    if (a0.n < 0 || a0.n > 7) emu_fail("wgmma.wait_group %d: N must be 0 to 7", a0.n);
    WarpGroup &wg = my_wg(b, a0.thread);
    for (const Wgmma &w : wg.inflight)
        if (w.group < 0)
            emu_fail("wgmma.wait_group %d with a wgmma.mma_async not yet committed (wgmma.commit_group): its result would never arrive", a0.n);
    // complete every group but the newest n
    const int keep_from = wg.next_group - a0.n;
    std::vector<Wgmma> still;
    for (Wgmma &w : wg.inflight) {
        if (w.group >= keep_from) {
            still.push_back(std::move(w));
            continue;
        }
        // the operands are read asynchronously until now: they must not have changed since the issue
        std::vector<float> a2, b2;
        read_operand(b, decode_desc(w.da, "A"), w.trans_a, 64, "A", a2);
        read_operand(b, decode_desc(w.db, "B"), w.trans_b, w.n, "B", b2);
        if (memcmp(a2.data(), w.a.data(), a2.size() * 4) || memcmp(b2.data(), w.b.data(), b2.size() * 4))
            emu_fail("shared memory that a wgmma.mma_async reads (descriptors 0x%016llx, 0x%016llx) changed before the "
                     "wgmma.wait_group that covers it", (unsigned long long)w.da, (unsigned long long)w.db);
        Acc &acc = wg.accs[w.key];
        if (acc.inflight == w.id) { // no later wgmma on these registers: the result becomes visible
            const unsigned nreg = w.n / 2;
            for (unsigned t = 0; t < 128; t++) {
                for (unsigned i = 0; i < nreg; i++) {
                    unsigned r, c;
                    frag_pos(t, i, &r, &c);
                    acc.d[t][i] = w.out[(size_t)r * w.n + c];
                }
                memcpy(&acc.bits[(size_t)t * nreg], acc.d[t], nreg * 4);
            }
            acc.inflight = 0;
            acc.fence_gen = wg.fence_gen;
        }
    }
    wg.inflight = std::move(still);
}

} // namespace

void emu_wgmma_fence(void) {
    GroupArgs a = { emu_thread_rank(), 0 };
    emu_collective(128, "wgmma.fence", &a, exec_fence, nullptr);
}

void emu_wgmma_commit(void) {
    GroupArgs a = { emu_thread_rank(), 0 };
    emu_collective(128, "wgmma.commit_group", &a, exec_commit, nullptr);
}

void emu_wgmma_wait(int n) {
    GroupArgs a = { emu_thread_rank(), n };
    emu_collective(128, "wgmma.wait_group", &a, exec_wait, nullptr);
}

void emu_wgmma_m64nNk16_f32_bf16(float *d, unsigned n, uint64_t desc_a, uint64_t desc_b, int scale_d, int imm_scale_a,
                                 int imm_scale_b, int imm_trans_a, int imm_trans_b) {
    WgmmaArgs a = { emu_thread_rank(), d, n, desc_a, desc_b, scale_d != 0, imm_scale_a, imm_scale_b, imm_trans_a, imm_trans_b };
    emu_collective(128, "wgmma.mma_async", &a, exec_wgmma, nullptr);
}

void emu_wgmma(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d, int imm_trans_a, int imm_trans_b) {
    if (n <= 0) emu_fail("wgmma.mma_async.m64n%dk16: n must be a multiple of 8 from 8 to 256", n);
    emu_wgmma_m64nNk16_f32_bf16(d, (unsigned)n, desc_a, desc_b, scale_d, 1, 1, imm_trans_a, imm_trans_b);
}

// ------------------------------------------------------------------------------------------------
// setmaxnreg (PTX ISA "setmaxnreg"): imm-reg-count a multiple of 8 in 24..256; .dec lowers the
// warp's per-thread maximum to the value and releases the rest to the CTA's pool, .inc raises it,
// blocking until the pool has enough; every warp of the warpgroup executes the same instruction.

namespace {

struct RegArgs {
    unsigned thread;
    int inc;
    unsigned regs;
};

unsigned launch_regs() {
    int l = emu_regs_per_thread_limit();
    if (l > 256) l = 256;
    return l < 8 ? 8u : (unsigned)(l / 8 * 8); // registers are allocated to warps in units of 8 per thread
}

bool try_grant(Block &b, WarpGroup &wg) {
    const long need = ((long)wg.reg_want - (long)wg.regs) * 128;
    if (need > b.reg_pool) return false;
    b.reg_pool -= need;
    wg.regs = wg.reg_want;
    wg.reg_want = 0;
    changed(b);
    return true;
}

void exec_setmaxnreg(void **args, unsigned n, void *) {
    check_group(args, n, "setmaxnreg");
    Block &b = blk();
    const RegArgs &a0 = *static_cast<RegArgs *>(args[0]);
    for (unsigned i = 1; i < n; i++) {
        const RegArgs &ai = *static_cast<RegArgs *>(args[i]);
        if (ai.inc != a0.inc || ai.regs != a0.regs)
            emu_fail("setmaxnreg: thread %u executes setmaxnreg.%s %u, thread %u setmaxnreg.%s %u: all warps of a warpgroup must "
                     "execute the same setmaxnreg", ai.thread, ai.inc ? "inc" : "dec", ai.regs, a0.thread, a0.inc ? "inc" : "dec", a0.regs);
    }
    const char *op = a0.inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
    if (a0.regs < 24 || a0.regs > 256 || a0.regs % 8) emu_fail("%s %u: the count must be a multiple of 8 from 24 to 256", op, a0.regs);
    if (!b.reg_launch) b.reg_launch = launch_regs();
    WarpGroup &wg = my_wg(b, a0.thread);
    if (!wg.regs) wg.regs = b.reg_launch;
    if (a0.inc && a0.regs < wg.regs) emu_fail("%s %u below the warpgroup's current %u registers per thread", op, a0.regs, wg.regs);
    if (!a0.inc && a0.regs > wg.regs) emu_fail("%s %u above the warpgroup's current %u registers per thread", op, a0.regs, wg.regs);
    wg.reg_done = true;
    if (!a0.inc) {
        b.reg_pool += ((long)wg.regs - (long)a0.regs) * 128;
        wg.regs = a0.regs;
        changed(b);
    } else {
        wg.reg_want = a0.regs;
        try_grant(b, wg);
    }
    for (WarpGroup &o : b.wg)
        if (o.reg_want) try_grant(b, o);
    // A request that can never be granted: the pool is short and every warpgroup has already made its
    // setmaxnreg (nobody is left to release registers).
    long held = 0;
    bool all_done = true;
    for (WarpGroup &o : b.wg) {
        held += (long)(o.regs ? o.regs : b.reg_launch) * 128;
        all_done = all_done && o.reg_done;
    }
    for (WarpGroup &o : b.wg)
        if (o.reg_want && all_done)
            emu_fail("setmaxnreg.inc %u over budget: the launch reserved %u registers per thread (%ld for the block's %zu "
                     "warpgroups); the warpgroups hold %ld and the increase needs %ld more than the pool's %ld",
                     o.reg_want, b.reg_launch, (long)b.reg_launch * 128 * (long)b.wg.size(), b.wg.size(), held,
                     ((long)o.reg_want - (long)o.regs) * 128, b.reg_pool);
}

} // namespace

void emu_setmaxnreg(int inc, unsigned regs) {
    RegArgs a = { emu_thread_rank(), inc != 0, regs };
    emu_collective(128, inc ? "setmaxnreg.inc" : "setmaxnreg.dec", &a, exec_setmaxnreg, nullptr);
    // setmaxnreg.inc blocks until the pool has the registers
    for (;;) {
        Block &b = blk();
        const unsigned t = emu_thread_rank();
        WarpGroup &wg = my_wg(b, t);
        if (!wg.reg_want || try_grant(b, wg)) {
            unspin(b, t);
            return;
        }
        note_spin(b, t, 0, 0, true);
        emu_yield();
    }
}

// ------------------------------------------------------------------------------------------------

bool emu_sm90_thread_spinning(unsigned thread) {
    Block &b = blk();
    return thread < b.threads && stuck(b, b.th[thread]);
}

void emu_sm90_describe(char *buf, size_t n) {
    if (!n) return;
    std::string s = describe(blk());
    snprintf(buf, n, "%s", s.empty() ? "no thread waits on an mbarrier or setmaxnreg" : s.c_str());
}

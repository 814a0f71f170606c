// emu/sm90.h: the sm_90a part of the CPU emulator of the CUDA sources (test-only, never linked into
// ./train): mbarriers, TMA 2-D tensor loads and cuTensorMapEncodeTiled, wgmma.mma_async with
// shared-memory matrix descriptors, setmaxnreg, and the fences the PTX ISA requires around them.
// common.cuh's / gemm.cu's PTX wrappers call these functions under LLM4D_EMU (emu-core owns that
// switch); each function stands for one PTX instruction executed by the calling emulated thread.
//
// Everything the hardware would not forgive ends the launch through emu_fail with the reason: an
// operation on an uninitialised or overwritten mbarrier, a tx-count beyond its range, more bytes
// completed than a phase expects, a phase no thread can complete (deadlock), TMA on a barrier whose
// init was never fenced, a tensor map the driver would reject, a wgmma reading bytes a TMA copy has
// not finished, a wgmma descriptor the emulator cannot decode, a missing wgmma.fence, operands
// overwritten while a wgmma is in flight, setmaxnreg values or budgets the ISA forbids.
//
// State lives per block in emu_block_data("sm90"); each mbarrier's state is also kept, encoded, in its
// 8 bytes of shared memory (an ordinary store to them is then caught at the next mbarrier operation).
//
// Hooks this module needs from emu-core: emu/hooks.h (the unit test's single-threaded mock defines
// them itself).
#ifndef LLM4D_EMU_SM90_H
#define LLM4D_EMU_SM90_H

#include <stddef.h>
#include <stdint.h>

#include "hooks.h"

// emu-core's driver types (emu/cuda.h), when this header sits next to them
#if __has_include("emu.h") && __has_include("cuda.h")
#include "cuda.h"
#endif

// ---- mbarrier (PTX ISA 9.7.13.15) ---------------------------------------------------------------
// bar: the shared-window address of the 8-byte, 8-aligned barrier object.

// mbarrier.init.shared::cta.b64 [bar], count: phase 0, pending = expected = count (1 .. 2^20-1), tx 0.
void emu_mbar_init(uint32_t bar, uint32_t count);
// mbarrier.arrive.shared::cta.b64 _, [bar]: one arrival on the current phase.
void emu_mbar_arrive(uint32_t bar);
// mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes: tx-count += bytes, then one arrival.
void emu_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes);
// mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity: whether the phase with this parity (the
// current one or the one before) has completed. When it has not, the call first lets the block's other
// threads run (emu_yield), as the real instruction waits a while, and looks again. A wait that no thread
// can ever satisfy is reported as a deadlock (see emu_sm90_thread_spinning).
bool emu_mbar_try_wait_parity(uint32_t bar, uint32_t parity);
// fence.mbarrier_init.release.cluster: the calling thread's earlier mbarrier.init become visible to
// the other threads and the async proxy (TMA's complete_tx needs that).
void emu_fence_mbarrier_init(void);
// fence.proxy.async (any state space): orders the calling thread's generic and async-proxy accesses;
// it also publishes the thread's earlier mbarrier.init to the async proxy.
void emu_fence_proxy_async(void);

// ---- TMA (PTX ISA, cp.async.bulk.tensor) and the driver's tensor maps ------------------

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0, c1}],
// [bar]: the box at coordinates (c0, c1) (c0 along dimension 0, the contiguous one; negative or past
// the extent: filled with zeros, or NaN with ..._NAN_REQUEST_ZERO_FMA) lands in shared memory at dst
// through the map's swizzle, and completes its full box size in bytes on bar's tx-count. The bytes are
// written at once but stay pending (emu_smem_pending) until the barrier's phase completes.
void emu_tma_load_2d(uint32_t dst, const void *tensor_map, int c0, int c1, uint32_t bar);

// The driver API's enums, with the driver's values (cuda.h).
enum {
    EMU_TM_UINT8 = 0, EMU_TM_UINT16, EMU_TM_UINT32, EMU_TM_INT32, EMU_TM_UINT64, EMU_TM_INT64, EMU_TM_FLOAT16,
    EMU_TM_FLOAT32, EMU_TM_FLOAT64, EMU_TM_BFLOAT16, EMU_TM_FLOAT32_FTZ, EMU_TM_TFLOAT32, EMU_TM_TFLOAT32_FTZ,
    EMU_TM_16U4_ALIGN8B, EMU_TM_16U4_ALIGN16B, EMU_TM_16U6_ALIGN16B
};
enum { EMU_TM_INTERLEAVE_NONE = 0, EMU_TM_INTERLEAVE_16B, EMU_TM_INTERLEAVE_32B };
enum {
    EMU_TM_SWIZZLE_NONE = 0, EMU_TM_SWIZZLE_32B, EMU_TM_SWIZZLE_64B, EMU_TM_SWIZZLE_128B, EMU_TM_SWIZZLE_128B_ATOM_32B,
    EMU_TM_SWIZZLE_128B_ATOM_32B_FLIP_8B, EMU_TM_SWIZZLE_128B_ATOM_64B
};
enum { EMU_TM_L2_NONE = 0, EMU_TM_L2_64B, EMU_TM_L2_128B, EMU_TM_L2_256B };
enum { EMU_TM_OOB_FILL_NONE = 0, EMU_TM_OOB_FILL_NAN_REQUEST_ZERO_FMA };
enum { EMU_TENSOR_MAP_BYTES = 128 }; // sizeof(CUtensorMap); the map must be 64-byte aligned

// cuTensorMapEncodeTiled with the driver's arguments (pointers to its cuuint64_t / cuuint32_t arrays,
// enums as ints): validates every rule the driver API documents and writes the emulator's opaque
// 128-byte map into `map`. Returns 0 (CUDA_SUCCESS) or 1 (CUDA_ERROR_INVALID_VALUE), and then prints
// the reason on stderr as "emu: cuTensorMapEncodeTiled: REASON" (the driver says nothing more).
int emu_tensor_map_encode_tiled(void *map, int dtype, uint32_t rank, void *global_address, const uint64_t *global_dim,
                                const uint64_t *global_strides, const uint32_t *box_dim,
                                const uint32_t *element_strides, int interleave, int swizzle, int l2_promotion,
                                int oob_fill);
#ifdef LLM4D_EMU_CUDA_H
// The same with the driver's own types: what cuGetProcAddress / cudaGetDriverEntryPoint hand out for
// "cuTensorMapEncodeTiled" (PFN_cuTensorMapEncodeTiled_v12000).
CUresult emu_cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType dtype, cuuint32_t rank, void *global_address,
                                    const cuuint64_t *global_dim, const cuuint64_t *global_strides,
                                    const cuuint32_t *box_dim, const cuuint32_t *element_strides,
                                    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill);
#endif
// The same check without printing: 0 with an empty reason, or 1 with the reason in why[0..n).
int emu_tensor_map_check(void *map, int dtype, uint32_t rank, void *global_address, const uint64_t *global_dim,
                         const uint64_t *global_strides, const uint32_t *box_dim, const uint32_t *element_strides,
                         int interleave, int swizzle, int l2_promotion, int oob_fill, char *why, size_t n);

// ---- wgmma (PTX ISA 9.7.15) ---------------------------------------------------------------------
// All are warpgroup-collective (.sync.aligned): the 128 threads 128k..128k+127 call them together.

// wgmma.fence.sync.aligned: orders the warpgroup's earlier register accesses before later wgmma.
void emu_wgmma_fence(void);
// wgmma.commit_group.sync.aligned: the warpgroup's uncommitted wgmma.mma_async become one group.
void emu_wgmma_commit(void);
// wgmma.wait_group.sync.aligned n: waits until at most n committed groups are in flight; the
// accumulators of the completed ones then hold their results (until then: NaN poison).
void emu_wgmma_wait(int n);
// wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {d}, desc_a, desc_b, scale_d, imm_scale_a,
// imm_scale_b, imm_trans_a, imm_trans_b: D[64 x n] = A[64 x 16] B[16 x n] (+ D when scale_d), both
// operands in shared memory described by 64-bit matrix descriptors; trans 0: K-major, 1: M/N-major;
// imm_scale +1 or -1. d: this thread's n/2 accumulator registers in the ISA's fragment order.
void emu_wgmma_m64nNk16_f32_bf16(float *d, unsigned n, uint64_t desc_a, uint64_t desc_b, int scale_d,
                                 int imm_scale_a, int imm_scale_b, int imm_trans_a, int imm_trans_b);

// common.cuh's wgmma_m64n256k16<TA, TB>(d, da, db) under the emulator: emu_wgmma(d, 256, da, db, 1, TA,
// TB), i.e. the call above with imm-scale-a = imm-scale-b = 1 (what gemm.cu's PTX passes).
void emu_wgmma(float *d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d, int imm_trans_a, int imm_trans_b);

// ---- setmaxnreg (PTX ISA, setmaxnreg) ------------------------------------------------------------
// setmaxnreg.{inc,dec}.sync.aligned.u32 regs (warpgroup-collective). The launch reserves
// emu_regs_per_thread_limit() (rounded down to the allocation unit of 8) for every thread; .dec gives
// registers to the block's pool, .inc takes them and waits while the pool is short.
void emu_setmaxnreg(int inc, unsigned regs);

// ---- for emu-core's deadlock detector -----------------------------------------------------------
// Whether thread `thread` of the current block is spinning on an mbarrier (or a setmaxnreg.inc) and has
// already seen the current state: when every thread that has neither exited nor blocked at a barrier
// is spinning, nothing can change any more and the block is deadlocked. (This module also reports on
// its own when every thread of the block spins, and after 2^18 failed waits without any change.)
bool emu_sm90_thread_spinning(unsigned thread);
// One line on what the spinning threads wait for: barriers, their phases, pending arrivals, tx-count.
void emu_sm90_describe(char *buf, size_t n);

#endif

// common.cuh: what the CUDA files (kernels.cu, gemm.cu, attention.cu, net_ipc.cu) share: checked CUDA
// calls, the check after every kernel launch, the launch itself (CUDA_LAUNCH), and every inline PTX
// statement of the sources as a wrapper: the sm_80 warp-level tensor-core and copy instructions and
// gemm.cu's sm_90a ones (mbarrier, TMA, wgmma, setmaxnreg). Fragment layouts are the PTX ISA's,
// modelled on the host in test/test_gemm.c and test/test_attention.c. Under -DLLM4D_EMU the wrappers
// and the launch call the emulated GPU instead (emu/emu.h; "The emulated GPU" in the README).
#ifndef LLM4D_COMMON_CUH
#define LLM4D_COMMON_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common.h"
}
#ifdef LLM4D_EMU
#include "emu.h"
#endif

// Errors that a kernel leaves behind (sticky: every later call reports them too). Without
// LLM4D_CUDA_SYNC=1 they surface at the next call that waits, which cannot know the kernel.
static inline int cuda_kernel_error(cudaError_t e) {
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorIllegalInstruction ||
           e == cudaErrorMisalignedAddress || e == cudaErrorInvalidAddressSpace || e == cudaErrorInvalidPc ||
           e == cudaErrorAssert || e == cudaErrorHardwareStackError || e == cudaErrorLaunchTimeout;
}

static inline void cuda_fail(const char *call, cudaError_t e) {
    die("CUDA %s: %s%s", call, cudaGetErrorString(e),
        cuda_kernel_error(e) ? " (an earlier kernel failed; LLM4D_CUDA_SYNC=1 names it)" : "");
}

// Every CUDA runtime call goes through CK: a failure is one line naming the call, and exit status 1.
#define CK(fn, args)                                                                                        \
    do {                                                                                                    \
        cudaError_t e_ = fn args;                                                                           \
        if (e_ != cudaSuccess) cuda_fail(#fn, e_);                                                          \
    } while (0)

// LLM4D_CUDA_SYNC=1: wait for every kernel as it is launched, so that a failure names its kernel.
static inline int cuda_sync_each(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("LLM4D_CUDA_SYNC");
        v = s && !strcmp(s, "1");
    }
    return v;
}

// After every launch: a bad launch configuration is reported at once; with LLM4D_CUDA_SYNC=1 the
// kernel's own failure too, by name.
static inline void cuda_launched(const char *kernel, cudaStream_t stream) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) die("CUDA launch of %s: %s", kernel, cudaGetErrorString(e));
    if (cuda_sync_each()) {
        e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) die("CUDA kernel %s failed: %s (LLM4D_CUDA_SYNC=1)", kernel, cudaGetErrorString(e));
    }
}

// A CUDA driver function by name through the runtime (so nothing links libcuda directly), or NULL
// when the driver lacks it. cudaGetDriverEntryPointByVersion exists from CUDA 12.5 on (the
// unversioned call is deprecated in CUDA 13); older runtimes have only the unversioned one.
static inline void *cuda_driver_entry(const char *name) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return fn;
}
// Every kernel launch: CUDA_LAUNCH(grid, block, shared bytes, stream, kernel)(arguments). Under nvcc
// it is the <<<...>>> launch itself, token for token; under the emulator (LLM4D_EMU, emu/emu.h) the
// emulator's launch of the named kernel (the kernel is last because a template's commas would split
// a macro argument).
#ifdef LLM4D_EMU
#define CUDA_LAUNCH(grid, block, smem, stream, ...) emu_launcher(#__VA_ARGS__, __VA_ARGS__, grid, block, smem, stream)
#else
#define CUDA_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

// Every inline PTX statement of the CUDA files is one of the wrappers below: under nvcc the asm
// itself, under the emulator a call of its model of the instruction (emu/emu.h; the sm_90a ones in
// emu/sm90.h).

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes from global to shared memory, asynchronously; bytes past src_bytes are zero-filled, which is
// how tiles at the edges of a matrix read zeros
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
#ifdef LLM4D_EMU
    emu_cp_async16(dst, src, src_bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef LLM4D_EMU
    emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// waits until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifdef LLM4D_EMU
    emu_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
#ifdef LLM4D_EMU
    emu_ldmatrix_x4(addr, r, 0);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
#ifdef LLM4D_EMU
    emu_ldmatrix_x4(addr, r, 1);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
// d += a·b for one m16n8k16 block: bf16 operands, fp32 accumulators
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef LLM4D_EMU
    emu_mma_16816(d, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// two fp32 values into a bf16 pair register, round to nearest even: hi in the high half
__device__ __forceinline__ uint32_t cvt_bf16x2(float hi, float lo) {
#ifdef LLM4D_EMU
    return emu_cvt_bf16x2(hi, lo);
#else
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// ---- sm_90a (gemm.cu's wgmma kernel): mbarriers, TMA, wgmma, setmaxnreg, named barriers ----
// Under the emulator these need emu/sm90.h (LLM4D_EMU_SM90); without it the wgmma kernel's body is
// compiled out (as for sm_80) and the GEMM probe reports no wgmma, so the mma.sync kernel runs.

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef LLM4D_EMU
    EMU_SM90(emu_mbar_init(bar, count));
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef LLM4D_EMU
    EMU_SM90(emu_mbar_arrive_expect_tx(bar, bytes));
#else
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef LLM4D_EMU
    EMU_SM90(emu_mbar_arrive(bar));
#else
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
// Whether the phase with this parity has completed (one try; the caller spins).
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
#ifdef LLM4D_EMU
    bool done = false;
    EMU_SM90(done = emu_mbar_try_wait_parity(bar, parity));
    return done;
#else
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
#endif
}
// mbarrier initialisation made visible to the async proxy (TMA)
__device__ __forceinline__ void fence_mbarrier_init() {
#ifdef LLM4D_EMU
    EMU_SM90(emu_fence_mbarrier_init());
#else
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
#ifdef LLM4D_EMU
    EMU_SM90(emu_tma_load_2d(dst, map, c0, c1, bar));
#else
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
#endif
}
// One warpgroup's barrier (ids 1, 2; 0 is __syncthreads)
__device__ __forceinline__ void wg_bar(int id) {
#ifdef LLM4D_EMU
    emu_bar_sync((unsigned)id, 128, "bar.sync id, 128");
#else
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// a warpgroup gives registers away (dec) or takes them (inc): the count is an immediate
template <int REGS> __device__ __forceinline__ void setmaxnreg_dec() {
#ifdef LLM4D_EMU
    emu_setmaxnreg(0, REGS);
#else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
#endif
}
template <int REGS> __device__ __forceinline__ void setmaxnreg_inc() {
#ifdef LLM4D_EMU
    emu_setmaxnreg(1, REGS);
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#ifdef LLM4D_EMU
    emu_wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef LLM4D_EMU
    emu_wgmma_commit();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
#ifdef LLM4D_EMU
    emu_wgmma_wait(N);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Tells the compiler the accumulators may change here, so that it reads them after a wgmma wait and
// not before (the asm statements above do not name them). The emulator writes them in wgmma_wait.
__device__ __forceinline__ void acc_fence(float (&d)[128]) {
#ifdef LLM4D_EMU
    (void)d;
#else
#pragma unroll
    for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// D[64x256] += A[64x16] B[16x256]; operands described by shared-memory descriptors; TA/TB: 1 when the
// operand is stored m- or n-major (transposed) rather than k-major.
template <int TA, int TB> __device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
#ifdef LLM4D_EMU
    emu_wgmma_m64nNk16_f32_bf16(d, 256, da, db, 1, 1, 1, TA, TB);
#else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
                 "%128, %129, p, 1, 1, %131, %132;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
#endif
}
#endif

#endif

// common.cuh: what the CUDA files (kernels.cu, gemm.cu, attention.cu) share: checked CUDA calls, the
// check after every kernel launch, and the sm_80 warp-level tensor-core and copy instructions as inline
// PTX (fragment layouts are the PTX ISA's, modelled on the host in test/test_gemm.c and
// test/test_attention.c).
#ifndef LLM4D_COMMON_CUH
#define LLM4D_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common.h"
}

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

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes from global to shared memory, asynchronously; bytes past src_bytes are zero-filled, which is
// how tiles at the edges of a matrix read zeros
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// waits until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// d += a·b for one m16n8k16 block: bf16 operands, fp32 accumulators
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif

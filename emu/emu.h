// emu/emu.h: the emulated GPU's interface to the CUDA sources compiled by g++ with -DLLM4D_EMU (test
// only; nothing of emu/ is linked into ./train). Included by emu/cuda_runtime.h under C++.
//
// What the CUDA sources see: the keywords (__global__, __shared__, ...), threadIdx and friends, the
// intrinsics they call (__syncthreads, __shfl_xor_sync, ...), the launch (CUDA_LAUNCH in common.cuh
// becomes emu_launcher), and the models of the inline PTX that common.cuh's wrappers call. A block's
// threads are fibers (emu/exec.cc); the runtime API is emu/runtime.cc. The contract with the sm_90a
// module (emu/sm90.h) is emu/hooks.h: what the core gives the module.
#ifndef LLM4D_EMU_H
#define LLM4D_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- the hooks (for the sm_90a module) ----
#include "hooks.h"

// ---- the sm_90a module: present when emu/sm90.h is ----
#if __has_include("sm90.h")
#include "sm90.h"
#define LLM4D_EMU_SM90 1
#define EMU_SM90(x) x
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#define __CUDA_ARCH__ 900
#else
#define __CUDA_ARCH__ 800
[[noreturn]] void emu_no_sm90(void);
#define EMU_SM90(x) emu_no_sm90()
#endif

// ---- keywords and types ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
// Shared memory is thread-local storage of the OS thread that runs the block (a block's fibers share
// it; blocks run one at a time): __shared__ arrays are thread_local statics, and the dynamic array
// (`extern __shared__ T smem[]` or `smem_raw[]`) is emu's `smem`, whose bytes past the launch's size
// are reported. The checker tells shared from other memory by the executable's TLS block (exec.cc).
#define __shared__ thread_local
#define EMU_SMEM_MAX (228 * 1024)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
struct __attribute__((aligned(16))) uint4_ {
    unsigned x, y, z, w;
};
static inline float2 make_float2(float x, float y) { return float2{ x, y }; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{ x, y, z, w }; }

struct EmuThreadIds {
    uint3 tid, bid;
    dim3 bdim, gdim;
};
const EmuThreadIds &emu_ids(void);
#define threadIdx (emu_ids().tid)
#define blockIdx (emu_ids().bid)
#define blockDim (emu_ids().bdim)
#define gridDim (emu_ids().gdim)
static const int warpSize = 32;

// ---- intrinsics ----
void emu_bar_sync(unsigned id, unsigned count, const char *where);
void emu_syncthreads(const char *file, int line);
void emu_syncwarp(unsigned mask, const char *file, int line);
#define __syncthreads() emu_syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) emu_syncwarp(0xffffffffu, __FILE__, __LINE__)
[[noreturn]] void emu_trap(const char *file, int line);
#define __trap() emu_trap(__FILE__, __LINE__)
long long emu_clock64(void);
#define clock64() emu_clock64()
uint64_t emu_cvta_shared(const void *p);
#define __cvta_generic_to_shared(p) emu_cvta_shared(p)

static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
static inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

// shfl.sync.bfly over the whole warp (the only mask the sources use; another is reported)
void emu_shfl_xor(unsigned mask, void *val, size_t bytes, int lane_mask, int width);
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffled value");
    emu_shfl_xor(mask, &v, sizeof v, lane_mask, width);
    return v;
}

// ---- models of the PTX that common.cuh's wrappers call ----
void emu_cp_async16(uint32_t dst, const void *src, int src_bytes);
void emu_cp_async_commit(void);
void emu_cp_async_wait(int n);
void emu_ldmatrix_x4(uint32_t addr, uint32_t (&r)[4], int trans);
void emu_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
uint32_t emu_cvt_bf16x2(float hi, float lo);

// ---- launches ----
struct cudaStreamRec;
typedef struct cudaStreamRec *cudaStream_t;
int emu_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               std::function<void()> body);

template <typename... P> struct EmuLauncher {
    const char *name;
    void (*k)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... A> void operator()(A &&...args) const {
        // the arguments are copied at the launch, as the driver copies kernel parameters
        auto tup = std::make_shared<std::tuple<typename std::decay<P>::type...>>(std::forward<A>(args)...);
        void (*fn)(P...) = k;
        emu_launch(name, (const void *)k, grid, block, smem, stream, [fn, tup]() { std::apply(fn, *tup); });
    }
};
template <typename... P>
EmuLauncher<P...> emu_launcher(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
    return EmuLauncher<P...>{ name, k, grid, block, smem, stream };
}
template <typename... P>
EmuLauncher<P...> emu_launcher(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem, int stream) {
    return EmuLauncher<P...>{ name, k, grid, block, smem, (cudaStream_t)(intptr_t)stream };
}

#endif

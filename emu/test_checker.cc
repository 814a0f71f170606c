// emu/test_checker.cc: the emulator's checker against broken variants of the real kernels (test only).
//
//   test_checker VARIANT gemm|attention
//   test_checker none deadlock|diverge|runtime
//
// compiles gemm.cu and attention.cu into this program with one defect switched on at run time:
//   none     the kernels as they are (the checker must stay silent: exit 0)
//   nosync   each thread skips its second __syncthreads (the main loop's barrier in its second k-tile)
//   waitlow  every cp.async.wait_group waits for one group fewer than the source says (N + 1)
//   noattr   cudaFuncSetAttribute(MaxDynamicSharedMemorySize) is not called
//   swizzle  (sm_90a) the wgmma descriptors say 64-byte swizzle where TMA wrote 128-byte
//   expect_tx (sm_90a) the full barrier expects 16 bytes more than the TMA boxes bring
// and runs one GEMM (mma.sync, or wgmma with "wgmma", 128 x 128 x 128) or one flash-attention forward (head
// size 64, 256 queries and keys: four key tiles). Exit status: 0 when the run reported no failure, 2
// when the device reported one (the emulator's report, naming the kernel and the reason, is on stderr).
// deadlock and diverge run small kernels of this file (half a block at a __syncthreads; half a warp at
// a shuffle); runtime checks the emulated runtime itself (exit 0 when every check holds).
#include <cuda_runtime.h>

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

enum { V_NONE, V_NOSYNC, V_WAITLOW, V_NOATTR, V_SWIZZLE, V_EXPECT_TX };
static int g_variant;

#include "../common.cuh"
extern "C" {
#include "../kernels.h"
}

// the broken variants, switched in before the kernels' sources are read
static void test_syncthreads(const char *file, int line) {
    int *calls = (int *)emu_block_data("test_checker.calls", 1024 * sizeof(int), NULL);
    if (g_variant == V_NOSYNC && ++calls[emu_thread_rank()] == 2) return;
    emu_syncthreads(file, line);
}
#undef __syncthreads
#define __syncthreads() test_syncthreads(__FILE__, __LINE__)

template <int N> static void test_cp_async_wait() { emu_cp_async_wait(g_variant == V_WAITLOW ? N + 1 : N); }
#define cp_async_wait test_cp_async_wait

template <typename T> static cudaError_t test_set_attribute(T *f, cudaFuncAttribute a, int v) {
    return g_variant == V_NOATTR ? cudaSuccess : emu_func_set_attribute((const void *)f, (int)a, v);
}
#define cudaFuncSetAttribute test_set_attribute

// sm_90a: the wgmma descriptors' swizzle mode 64 B (2) instead of 128 B (1); an mbarrier expecting 16
// bytes more than the TMA boxes bring
extern "C" {
#include "../gemm.h"
}
#define GEMM_DESC_SWIZZLE_128B (g_variant == V_SWIZZLE ? 2 : 1)
#define mbar_expect_tx(bar, bytes) mbar_expect_tx((bar), (bytes) + (g_variant == V_EXPECT_TX ? 16u : 0u))

#include "../attention.cu"
#include "../gemm.cu"

// threads 0..63 of 128 wait at a barrier the others never reach
__global__ void half_barrier_kernel(int *out) {
    if (threadIdx.x < 64) __syncthreads();
    out[threadIdx.x] = 1;
}
// lanes 0..15 shuffle, lanes 16..31 do not
__global__ void half_shuffle_kernel(float *out) {
    float v = (float)threadIdx.x;
    if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
__global__ void store_kernel(int *out, int v) { out[threadIdx.x] = v; }

static int g_bad;
static void expect(bool ok, const char *what) {
    printf("%s %s\n", ok ? "ok" : "FAIL", what);
    g_bad += !ok;
}

// the emulated runtime: device memory faults on the host, stream order, late events, the shared-memory
// limits of the device LLM4D_EMU_GPU names
static int runtime_checks() {
    int *d = NULL, h[32];
    expect(cudaMalloc(&d, 32 * sizeof(int)) == cudaSuccess, "cudaMalloc");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        volatile int x = *(volatile int *)d; // must fault
        (void)x;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "a host load from device memory faults");
    cudaStream_t s;
    cudaEvent_t e;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess && cudaEventCreate(&e) == cudaSuccess, "stream, event");
    CUDA_LAUNCH(1, 32, 0, s, store_kernel)(d, 7);
    expect(cudaEventRecord(e, s) == cudaSuccess, "cudaEventRecord");
    expect(cudaEventQuery(e) == cudaErrorNotReady, "an event is not done at its first look");
    expect(cudaGetLastError() == cudaErrorNotReady, "... and cudaErrorNotReady is the thread's last error");
    expect(cudaEventQuery(e) == cudaSuccess, "... and done at the second");
    expect(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 7 && h[31] == 7, "the kernel's stores");
    expect(cudaMemcpy(h, d, sizeof h, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "a copy whose kind contradicts its pointers");
    (void)cudaGetLastError();
    CUDA_LAUNCH(1, 32, 0, s, store_kernel)(d, 9);
    // the legacy stream does not wait for a non-blocking one: the copy sees the old values
    expect(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 7, "no wait for a non-blocking stream");
    expect(cudaStreamSynchronize(s) == cudaSuccess && cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 9,
           "after cudaStreamSynchronize");
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    const int optin = p.major == 9 ? 227 * 1024 : 163 * 1024;
    expect((int)p.sharedMemPerBlockOptin == optin && p.sharedMemPerBlock == 48 * 1024, "shared memory per block of the device");
    expect(cudaFuncSetAttribute(store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) == cudaSuccess, "the opt-in limit");
    expect(cudaFuncSetAttribute(store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1) == cudaErrorInvalidValue,
           "above the opt-in limit: refused");
    (void)cudaGetLastError();
    CUdeviceptr base = 0;
    size_t size = 0;
    expect(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(d + 5)) == CUDA_SUCCESS && base == (CUdeviceptr)d && size == 32 * sizeof(int),
           "cuMemGetAddressRange");
    expect(cudaFree(d) == cudaSuccess && cudaFree(d) == cudaErrorInvalidValue, "cudaFree twice: refused");
    printf("%s\n", g_bad ? "runtime: FAILED" : "runtime: every check holds");
    return g_bad ? 1 : 0;
}

static uint16_t *random_bf16(size_t n, uint32_t seed) {
    uint16_t *h = (uint16_t *)malloc(n * 2), *d = NULL;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = f32_to_bf16((float)((seed >> 8) % 2001) / 1000.0f - 1.0f);
    }
    if (cudaMalloc(&d, n * 2) != cudaSuccess || cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice) != cudaSuccess) exit(1);
    free(h);
    return d;
}

int main(int argc, char **argv) {
    static const char *names[] = { "none", "nosync", "waitlow", "noattr", "swizzle", "expect_tx" };
    g_variant = -1;
    for (int i = 0; argc == 3 && i < 6; i++)
        if (!strcmp(argv[1], names[i])) g_variant = i;
    const char *ops[] = { "gemm", "attention", "deadlock", "diverge", "runtime", "wgmma" };
    int op = -1;
    for (int i = 0; g_variant >= 0 && i < 6; i++)
        if (!strcmp(argv[2], ops[i])) op = i;
    if (op < 0 || (op >= 2 && op <= 4 && g_variant != V_NONE)) {
        fprintf(stderr, "usage: test_checker none|nosync|waitlow|noattr|swizzle|expect_tx gemm|attention|wgmma, or none "
                        "deadlock|diverge|runtime\n");
        return 1;
    }
#ifndef LLM4D_EMU_SM90
    if (op == 5) {
        printf("no sm_90a module (emu/sm90.h): skipped\n");
        return 77;
    }
#endif
    if (op == 4) return runtime_checks();
    cudaError_t e;
    if (op == 2 || op == 3) {
        void *out = NULL;
        if (cudaMalloc(&out, 128 * 4) != cudaSuccess) return 1;
        if (op == 2) CUDA_LAUNCH(1, 128, 0, 0, half_barrier_kernel)((int *)out);
        else CUDA_LAUNCH(1, 32, 0, 0, half_shuffle_kernel)((float *)out);
    } else if (op == 0 || op == 5) {
        const int M = 128, N = 128, K = 128;
        GemmProblem p;
        memset(&p, 0, sizeof p);
        p.M = M, p.N = N, p.K = K;
        p.A = random_bf16((size_t)M * K, 1), p.lda = K, p.a_kmajor = 1;
        p.B = random_bf16((size_t)N * K, 2), p.ldb = K, p.b_kmajor = 1;
        float *c = NULL;
        if (cudaMalloc(&c, (size_t)M * N * 4) != cudaSuccess) return 1;
        p.C = c, p.ldc = N, p.store = GEMM_ACCUM_F32;
        GemmOptions o;
        memset(&o, 0, sizeof o);
        o.kernel = op == 5 ? GEMM_KERNEL_WGMMA : GEMM_KERNEL_MMA;
        if (gemm_bf16(&p, &o) != o.kernel) {
            fprintf(stderr, "test_checker: the %s GEMM refused the problem\n", gemm_kernel_name(o.kernel));
            return 1;
        }
    } else if (op == 1) {
        const int T = 256, C = 64;
        FaArgs a;
        memset(&a, 0, sizeof a);
        a.q = FaView{ random_bf16((size_t)T * C, 3), (long long)T * C, C, 0 };
        a.k = FaView{ random_bf16((size_t)T * C, 4), (long long)T * C, C, 0 };
        a.v = FaView{ random_bf16((size_t)T * C, 5), (long long)T * C, C, 0 };
        void *out = NULL;
        float *lse = NULL;
        if (cudaMalloc(&out, (size_t)T * C * 4) != cudaSuccess || cudaMalloc(&lse, (size_t)T * 4) != cudaSuccess) return 1;
        a.out = FaView{ out, (long long)T * C, C, 1 };
        a.lse = lse;
        a.d = FaShape{ 1, 1, C, T, 0, T, 0 };
        if (fa_forward(&a, NULL) != 0) {
            fprintf(stderr, "test_checker: the flash kernels refused the problem\n");
            return 1;
        }
    }
    e = cudaDeviceSynchronize();
    printf("%s %s: %s\n", argv[1], argv[2], e == cudaSuccess ? "no failure reported" : cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 2;
}

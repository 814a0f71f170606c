// devmem.h: device memory in the collectives (an interface below the transports, which take a
// DevMem in each posted transfer; it includes nothing of llm4d). A communicator given a DevMem
// (comm_use_device) moves and reduces the buffers that DevMem owns without the host touching their
// bytes:
//
//   inside a node  the single-copy protocol of net_shm.c, with a device handle in the record: the
//                  sender exports its buffer once (a CUDA IPC handle), the receiver opens it once and
//                  copies or reduces the peer's chunk straight into its own buffer with the device's
//                  copy and reduction kernels, then bumps the same step flag in host shared memory;
//   across nodes   net_tcp.c stages the bytes through pinned host buffers.
//
// Everything a DevMem queues goes on the device's communication stream, in order; the host learns
// that queued work has finished through marks (events), never by waiting for the whole device. An
// operation on device buffers starts only once a mark recorded on the compute stream when it was
// submitted has passed (the kernels that wrote its input are done), and it completes only once its
// last queued copy or reduction has, so the caller may use the result on any stream.
//
// Two implementations: net_ipc.cu (CUDA: IPC handles, reduction kernels, events on the backend's
// streams) and devmem_cpu.c, a stand-in whose "device pointers" are not host addresses at all (any
// host access to them faults), so that `make test` checks, without a GPU, that the collectives never
// touch device bytes on the host and that every read of a peer's buffer is ordered by a mark.
#ifndef LLM4D_DEVMEM_H
#define LLM4D_DEVMEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// Where an exported range lives in its owner: the allocation (id, never reused by the owner; its
// size), the range's offset in it, the owner's device, and the device's own handle for the allocation.
typedef struct {
    uint64_t id;
    uint64_t alloc_bytes;
    uint64_t offset;
    int32_t device; // the owner's device ordinal, for messages only (ordinals differ between processes)
    int32_t pad;
    unsigned char uuid[16]; // the owner's GPU (cudaDeviceProp.uuid); the stand-in: zeros
    unsigned char blob[64]; // cudaIpcMemHandle_t; the stand-in: its HostMemHandle
} DevHandle;

typedef struct DevMark DevMark;
enum { DEV_COMPUTE = 0, DEV_COMM = 1 }; // the streams a mark can follow (kernels.h StreamId)

typedef struct DevMem {
    const char *name;
    // 1 when p is this device's memory (a pointer query: the collectives classify each operation's
    // buffers by it, as CUDA-aware MPI does)
    int (*owns)(const void *p);
    // device memory for the collectives' own buffers (accumulators, private copies); NULL when out
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    // pinned host memory for staging (TCP); NULL when out
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    // Exporting and opening: 1 and h filled when [p, p + bytes) can be exported. open returns where
    // the peer's range is readable here (opened on first use and kept), or NULL with the reason.
    int (*export_range)(const void *p, size_t bytes, DevHandle *h);
    const void *(*open_range)(pid_t owner, const DevHandle *h, char *why, size_t cap);
    void (*forget_peers)(void); // closes every opened peer allocation (the last communicator is gone)
    // Queued on the communication stream: a copy between any two of device, peer device and host
    // memory; acc = in (first) or acc (op)= in for n elements of CommType `type` (acc in fp32 for
    // bf16), in device, peer or pinned host memory; out = acc rounded to `type` (divided by ranks for
    // OP_AVG). Bitwise what the host reduction gives (reduce.h comm_reduce_host).
    void (*copy)(void *dst, const void *src, size_t n);
    void (*reduce)(void *acc, const void *in, size_t n, int type, int op, int first);
    void (*finish)(void *out, const void *acc, size_t n, int type, int op, int ranks);
    // A mark after the work queued on the stream so far; test is 1 once it has passed (no waiting);
    // release frees it. sync waits (the host) for the communication stream.
    DevMark *(*mark)(int stream);
    int (*test)(DevMark *m);
    void (*release)(DevMark *m);
    void (*sync)(void);
} DevMem;

// The CPU stand-in (devmem_cpu.c). Its pointers must be filled and read through copy.
const DevMem *devmem_cpu(void);
// How many marks the stand-in has created and released (tests: every mark is released).
void devmem_cpu_counts(long *marks, long *released);
// CUDA (net_ipc.cu): the device of cuda_use_device, its communication stream and IPC handles. NULL
// without CUDA.
const DevMem *devmem_cuda(void);

#endif

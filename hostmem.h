// hostmem.h: host memory that the other ranks of a node can read in place ("registered" memory).
//
// The CPU backend allocates everything from here: weights, gradients, ZeRO shards, activations and
// the pipeline's hand-off buffers live in a few large memfd segments of this process. A peer on the
// same node opens a segment once (through /proc/PID/fd/N: no name in /dev/shm, nothing to unlink,
// nothing left behind however the process ends), maps it read-only and from then on reads any
// buffer in it directly. This is the host twin of a CUDA IPC handle: an exported handle, a mapped
// peer buffer, and (in net_shm.c) step flags that say when the bytes may be read.
#ifndef LLM4D_HOSTMEM_H
#define LLM4D_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// Where a registered range lives in its owner: segment id (never reused within a process), the
// segment's descriptor number and size, and the range's offset in it.
typedef struct {
    uint64_t seg_id;
    uint64_t seg_bytes;
    uint64_t offset;
    int32_t fd;
    int32_t pad;
} HostMemHandle;

// Zeroed, 64-byte aligned registered memory; NULL when out of memory. Falls back to ordinary
// (unregistered) memory where memfd_create is unavailable.
void *hostmem_alloc(size_t bytes);
void hostmem_free(void *p);
// 1 when [p, p + bytes) lies inside one registered segment of this process; fills h.
int hostmem_find(const void *p, size_t bytes, HostMemHandle *h);
// Where a peer's registered range is readable in this process: its segment is mapped read-only on
// first use and kept. NULL (with the reason in why) when the segment cannot be opened.
const void *hostmem_peer_view(pid_t pid, const HostMemHandle *h, char *why, size_t why_cap);
// Unmaps every peer segment (when the last communicator goes).
void hostmem_forget_peers(void);
// memcpy for large transfers whose destination will not be read again soon: non-temporal stores skip
// reading the destination's lines into the cache first, a third of the memory traffic of a copy. The
// bytes are visible to other processes once it returns (it ends with a store fence).
void copy_streaming(void *dst, const void *src, size_t n);

#endif

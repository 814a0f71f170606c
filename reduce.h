// reduce.h: the collectives' element types and operations (CommType, CommOp) and the host's
// reductions (reduce.c), the reference that every device reduction must equal bitwise. Below the
// communication chain's algorithms (algorithms.c adds the ranks' contributions with these) and below
// the device-memory implementations (devmem_cpu.c reduces with them; net_ipc.cu's kernels follow the
// same numbering and arithmetic); it uses only common.h, hostmem.h and kernels.h's bf16 conversions.
#ifndef LLM4D_REDUCE_H
#define LLM4D_REDUCE_H

#include <stddef.h>

typedef enum { CT_F32 = 0, CT_BF16, CT_I32, CT_I64, CT_NTYPES } CommType;
typedef enum { OP_SUM = 0, OP_AVG, OP_MAX, CT_NOPS } CommOp;

size_t comm_type_size(CommType t);
const char *comm_type_name(CommType t);
const char *comm_op_name(CommOp op);
size_t comm_acc_size(CommType t); // bytes of an accumulator element: fp32 for bf16

// acc = in (first) or acc (op)= in over n elements of `type`, fp32 accumulators for bf16; integer sums
// wrap. out = acc rounded once (divided by ranks for OP_AVG), past the cache when streaming.
void comm_reduce_host(void *acc, const void *in, size_t n, int type, int op, int first);
void comm_finish_host(void *out, const void *acc, size_t n, int type, int op, int ranks, int streaming);
// Both steps of a chain in one pass (the ring: a partial sum from the left, this rank's contribution):
// out = left (op) in, bitwise what comm_reduce_host gives for acc = left, then in, and, when ranks > 0,
// comm_finish_host after it. left and in hold elements of `type` (left_acc, in_acc: accumulators
// instead); out holds accumulators (ranks == 0) or finished elements (ranks > 0, avg divides by it).
// out may be left or in exactly (in place), never partly overlap them.
void comm_combine_host(void *out, const void *left, int left_acc, const void *in, int in_acc, size_t n, int type, int op,
                       int ranks);

#endif

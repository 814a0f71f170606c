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

#endif

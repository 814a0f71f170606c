// emu/cudaTypedefs.h: the driver entry points' function types that llm4d names.
#ifndef LLM4D_EMU_CUDA_TYPEDEFS_H
#define LLM4D_EMU_CUDA_TYPEDEFS_H
#include "cuda.h"
typedef CUresult (*PFN_cuTensorMapEncodeTiled_v12000)(CUtensorMap *map, CUtensorMapDataType dt, cuuint32_t rank, void *base,
                                                      const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                                      const cuuint32_t *estrides, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                                      CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob);
typedef CUresult (*PFN_cuMemGetAddressRange_v3020)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
#endif

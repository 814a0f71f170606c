# llm4d. `make` builds ./train: with CUDA kernels when nvcc is found, CPU-only otherwise.
CC ?= gcc
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# GPU code: sm_90a for Hopper (wgmma and setmaxnreg need the "a" target; written as -gencode because
# nvcc 13.0's -arch=sm_90a shorthand is reported to run a plain sm_90 pass that rejects them), sm_80
# machine code for Ampere and Ada, and compute_80 PTX that the driver compiles for anything newer.
CUDA_GENCODE ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=[sm_80,compute_80]
NVCCFLAGS = -O3 -std=c++17 $(CUDA_GENCODE) -Xcompiler -Wall,-Wextra,-Werror -DLLM4D_CUDA
CFLAGS ?= -O3 -march=native
CFLAGS += -std=gnu11 -Wall -Wextra -Werror -fopenmp -fno-math-errno -MMD -MP
LDLIBS = -lm -fopenmp -lpthread -lz -ljansson
SAN = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

HOST_SRC = train.c model.c context.c mem.c zero.c pipeline.c data.c ckpt.c common.c hostmem.c kernels_cpu.c launch.c \
           bootstrap.c collectives.c algorithms.c net_shm.c net_tcp.c devmem_cpu.c bench_comm.c plan.c schedule.c
HOST_OBJ = $(HOST_SRC:%.c=build/%.o)
LIB_OBJ = $(filter-out build/train.o build/bench_comm.o build/plan.o,$(HOST_OBJ))

# RDMA verbs: net_verbs.c is compiled where libibverbs' headers are installed (libibverbs-dev); the
# library itself is opened at run time (dlopen), so ./train never links it and runs without rdma-core.
ifeq ($(shell $(CC) -E -include infiniband/verbs.h -x c /dev/null -o /dev/null 2>/dev/null && echo yes),yes)
HOST_SRC += net_verbs.c
CFLAGS += -DLLM4D_VERBS
TRANSPORTS = shm, tcp, verbs (libibverbs loaded at run time)
VERBS_BIN = build/verbs_pair build/verbs_pair-asan build/train-portable build/test_comm-portable
else
TRANSPORTS = shm, tcp (no verbs: <infiniband/verbs.h> not found; scripts/deps.sh installs libibverbs-dev)
VERBS_BIN =
endif

ifeq ($(NVCC),)
BACKENDS = cpu
CUDA_OBJ =
else
BACKENDS = cpu+cuda
CFLAGS += -DLLM4D_CUDA
CUDA_OBJ = build/kernels_cu.o build/gemm_cu.o build/attention_cu.o build/net_ipc_cu.o
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lstdc++
endif

.PHONY: all deps demo test test-bins test-gpu bench clean
all: train
	@echo "built ./train with backends: $(BACKENDS); transports: $(TRANSPORTS)"

train: $(HOST_OBJ) $(CUDA_OBJ)
	$(CC) $(filter %.o,$^) -o $@ $(LDLIBS)

build/%.o: %.c | build
	$(CC) $(CFLAGS) -c $< -o $@

build/kernels_cu.o: kernels.cu kernels.h gemm.h attention.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/net_ipc_cu.o: net_ipc.cu devmem.h kernels.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/attention_cu.o: attention.cu attention.h gemm.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/gemm_cu.o: gemm.cu gemm.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The tensor-core GEMM's check and benchmark (scripts/gpu_check.sh builds it; never part of ./train).
# cuBLAS is linked here only, as the benchmark's comparator, and left out when the toolkit lacks it.
CUBLAS_LIB = $(wildcard $(CUDA_HOME)/lib64/libcublas.so)
GEMM_CHECK_CUBLAS = $(if $(CUBLAS_LIB),-DGEMM_CHECK_CUBLAS -lcublas)
build/gemm_check: test/gemm_check.cu build/gemm_cu.o build/common.o gemm.h | build
	$(NVCC) $(NVCCFLAGS) -I. -Xcompiler -fopenmp test/gemm_check.cu build/gemm_cu.o build/common.o -o $@ \
		$(GEMM_CHECK_CUBLAS) -lgomp -lz -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64

# AddressSanitizer + UBSan builds (CPU only) for the unit tests and the bad-input tests
build/asan/%.o: %.c | build
	@mkdir -p build/asan
	$(CC) $(filter-out -O3 -DLLM4D_CUDA,$(CFLAGS)) $(SAN) -c $< -o $@

build/train-asan: $(HOST_SRC:%.c=build/asan/%.o)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson

build/test_unit: build/asan/test_unit.o $(LIB_OBJ:build/%=build/asan/%)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson

build/asan/test_unit.o: test/test_unit.c | build
	@mkdir -p build/asan
	$(CC) $(filter-out -O3 -DLLM4D_CUDA,$(CFLAGS)) -I. $(SAN) -c $< -o $@

# the pipeline schedules' action lists against their definitions (schedule.h), no model needed
build/test_schedule: test/test_schedule.c schedule.c common.c schedule.h common.h | build
	$(CC) $(filter-out -O3 -DLLM4D_CUDA -fopenmp -MMD -MP,$(CFLAGS)) -I. $(SAN) $(filter %.c,$^) -o $@ -lz -lm

# the backward's input and weight halves against the fused backward, bitwise (model.h)
# (optimised, not sanitised: it runs many small training steps)
build/test_split: test/test_split.c $(LIB_OBJ)
	$(CC) $(filter-out -DLLM4D_CUDA,$(CFLAGS)) -I. $(filter %.c %.o,$^) -o $@ $(filter-out -L% -Wl% -lcudart -lstdc++,$(LDLIBS))

# the GEMM's host-side index arithmetic (gemm.h), no GPU needed
build/test_gemm: test/test_gemm.c test/check.h gemm.h | build
	$(CC) $(filter-out -O3 -DLLM4D_CUDA -fopenmp,$(CFLAGS)) -I. $(SAN) $< -o $@

# the flash-attention kernels' index arithmetic and fragment layouts (attention.h), emulated, no GPU needed
build/test_attention: test/test_attention.c test/check.h attention.h gemm.h | build
	$(CC) $(filter-out -O3 -DLLM4D_CUDA -fopenmp,$(CFLAGS)) -I. $(SAN) $< -o $@ -lm

build/test_comm: build/asan/test_comm.o $(LIB_OBJ:build/%=build/asan/%)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson

build/asan/test_comm.o: test/test_comm.c | build
	@mkdir -p build/asan
	$(CC) $(filter-out -O3 -DLLM4D_CUDA,$(CFLAGS)) -I. $(SAN) -c $< -o $@

# Binaries for the QEMU guest (test/verbs_vm.sh): software emulation has no AVX-512, so these are
# built for the baseline x86-64 instruction set instead of -march=native.
PORTABLE_CFLAGS = $(filter-out -march=native -O3 -DLLM4D_CUDA,$(CFLAGS)) -O2
build/portable/%.o: %.c | build
	@mkdir -p build/portable
	$(CC) $(PORTABLE_CFLAGS) -c $< -o $@

# ./train for the guest: CPU backend only, baseline x86-64
build/train-portable: $(HOST_SRC:%.c=build/portable/%.o)
	$(CC) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson

# the collective tests for the guest (test_comm without sanitizers: emulation is slow enough)
build/test_comm-portable: build/portable/test_comm.o $(LIB_OBJ:build/%=build/portable/%)
	$(CC) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson

build/portable/test_comm.o: test/test_comm.c | build
	@mkdir -p build/portable
	$(CC) $(PORTABLE_CFLAGS) -I. -c $< -o $@

# two processes over one RDMA device through net_verbs.c (test/run.sh runs it inside a QEMU guest)
# (the byte stream alone: net_verbs.c without its transport table, which needs the whole library)
build/verbs_pair: test/verbs_pair.c net_verbs.c build/portable/common.o net_verbs.h common.h | build
	$(CC) $(filter-out -fopenmp -MMD -MP,$(PORTABLE_CFLAGS)) -DVERBS_CORE_ONLY -I. $(filter %.c %.o,$^) -o $@ -lz

build/verbs_pair-asan: test/verbs_pair.c net_verbs.c common.c net_verbs.h common.h | build
	$(CC) $(filter-out -fopenmp -O2 -MMD -MP,$(PORTABLE_CFLAGS)) $(SAN) -DVERBS_CORE_ONLY -I. $(filter %.c,$^) -o $@ -lz

# the collectives' tests on device memory (scripts/gpu_check_multi.sh: test_comm --device cuda)
build/test_comm-cuda: test/test_comm.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

build/test_cuda: test/test_cuda.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. -I$(CUDA_HOME)/include $(filter %.c %.o,$^) -o $@ $(LDLIBS)

# attention on the GPU, flash against simple kernels (scripts/gpu_check.sh)
build/bench_attention: test/bench_attention.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

build/bench_matmul: test/bench_matmul.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

build/attention_check: test/attention_check.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

build:
	@mkdir -p build

deps:
	bash scripts/deps.sh

# Trains the default small model on the Debian license texts (always on a Debian machine).
demo: deps train
	bash scripts/demo.sh

# deps first, then a fresh make: what deps installed (libibverbs-dev) decides what gets built
test: deps
	@$(MAKE) --no-print-directory test-bins
	bash test/run.sh $(if $(T),'$(T)')

test-bins: train build/train-asan build/test_unit build/test_comm build/test_gemm build/test_schedule build/test_split build/test_attention build/attention_check $(VERBS_BIN)

test-gpu:
	bash scripts/gpu_check.sh

bench: train build/bench_matmul
	bash scripts/bench.sh

clean:
	rm -rf build train

-include $(wildcard build/*.d build/asan/*.d build/portable/*.d)

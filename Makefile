# llm4d. `make` builds ./train: with CUDA kernels when nvcc is found, CPU-only otherwise. `make test` runs
# every test, `make test T=GROUP` one group, `make test T='^t_name$'` one test (test/run.sh --list).
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
LDLIBS = -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8
SAN = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# The build packages, checked before anything is built: a clone without them stops at one line naming
# what is missing and what installs it, not at the compiler's "fatal error: jansson.h". Each entry is
# HEADER:DEBIAN-PACKAGE. deps, clean, demo and test skip the check: they install first (scripts/deps.sh)
# and then run a make that checks.
BUILD_HEADERS = jansson.h:libjansson-dev zlib.h:zlib1g-dev pcre2.h:libpcre2-dev
NO_CHECK_GOALS = deps clean demo test
ifneq ($(filter-out $(NO_CHECK_GOALS),$(or $(MAKECMDGOALS),all)),)
ifeq ($(shell command -v $(firstword $(CC)) 2>/dev/null),)
$(error the C compiler '$(firstword $(CC))' is not installed: scripts/deps.sh (or `make deps`, as root) installs gcc)
endif
have_header = $(shell $(CC) -E -DPCRE2_CODE_UNIT_WIDTH=8 -include $(1) -x c /dev/null -o /dev/null 2>/dev/null && echo yes)
MISSING_BUILD = $(strip $(foreach h,$(BUILD_HEADERS),$(if $(call have_header,$(word 1,$(subst :, ,$(h)))),,$(h))))
ifneq ($(MISSING_BUILD),)
$(error missing build headers: $(foreach h,$(MISSING_BUILD),$(word 1,$(subst :, ,$(h)))) (Debian: $(foreach h,$(MISSING_BUILD),$(word 2,$(subst :, ,$(h))))); scripts/deps.sh (or `make deps`, as root) installs them)
endif
endif

HOST_SRC = train.c options.c report.c layout.c model.c context.c mem.c zero.c pipeline.c data.c tokenizer.c prepare.c ckpt.c safetensors.c hf.c common.c hostmem.c kernels_cpu.c launch.c \
           bootstrap.c collectives.c algorithms.c net_shm.c net_tcp.c devmem_cpu.c bench_comm.c plan.c schedule.c
# the communication chain's files below the collectives: sockets, host reductions, the transports' shared part
HOST_SRC += sock.c reduce.c net.c
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

# The emulated GPU (emu/, test only): the CUDA sources compiled by g++ with -DLLM4D_EMU against emu's
# headers, every load and store outlined (-fsanitize=kernel-address, no sanitizer runtime: emu/exec.cc
# defines the calls and checks shared and device memory). Nothing of it is linked into ./train.
CXX ?= g++
HAVE_CXX := $(shell command -v $(CXX) >/dev/null 2>&1 && echo yes)
EMU_CXXFLAGS = -O2 -g -std=c++17 -Wall -Wextra -Werror -Iemu -I. -DLLM4D_EMU -DLLM4D_CUDA -MMD -MP
EMU_KASAN = -fsanitize=kernel-address --param asan-instrumentation-with-call-threshold=0 --param asan-stack=0 --param asan-globals=0
# (-fno-extern-tls-init: the dynamic shared array is thread-local and needs no initialiser call; the
# warnings: the CUDA sources' #pragma unroll, and parameters of kernels whose body is compiled out)
EMU_CU_FLAGS = $(EMU_CXXFLAGS) $(EMU_KASAN) -fno-extern-tls-init -Wno-unknown-pragmas -Wno-unused-parameter
EMU_CORE = build/emu/runtime.o build/emu/exec.o $(patsubst emu/%.cc,build/emu/%.o,$(filter-out emu/test_%.cc,$(filter-out emu/runtime.cc emu/exec.cc,$(wildcard emu/*.cc))))
EMU_CU_OBJ = build/emu/kernels_cu.o build/emu/gemm_cu.o build/emu/attention_cu.o build/emu/net_ipc_cu.o
# the host objects that differ with the CUDA backend present
EMU_HOST_OBJ = build/emu/kernels_cpu.o build/emu/devmem_cpu.o
EMU_LIB_OBJ = $(filter-out build/kernels_cpu.o build/devmem_cpu.o,$(LIB_OBJ)) $(EMU_HOST_OBJ) $(EMU_CU_OBJ) $(EMU_CORE)
EMU_LDLIBS = -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8 -lstdc++
EMU_BIN = $(if $(HAVE_CXX),build/train-emu build/test_cuda-emu build/gemm_check-emu build/test_checker-emu)

.PHONY: all deps demo test test-bins test-gpu bench clean
all: train $(EMU_BIN)
	@echo "built ./train with backends: $(BACKENDS); transports: $(TRANSPORTS)"

train: $(HOST_OBJ) $(CUDA_OBJ)
	$(CC) $(filter %.o,$^) -o $@ $(LDLIBS)

build/%.o: %.c | build
	$(CC) $(CFLAGS) -c $< -o $@

build/kernels_cu.o: kernels.cu kernels.h gemm.h attention.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/net_ipc_cu.o: net_ipc.cu devmem.h kernels.h reduce.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/attention_cu.o: attention.cu attention.h gemm.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/gemm_cu.o: gemm.cu gemm.h common.cuh common.h | build
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The tensor-core GEMM's check and benchmark (scripts/gpu/: scripts/gpu_check.sh builds and runs it;
# never part of ./train).
# cuBLAS is linked here only, as the benchmark's comparator, and left out when the toolkit lacks it.
CUBLAS_LIB = $(wildcard $(CUDA_HOME)/lib64/libcublas.so)
GEMM_CHECK_CUBLAS = $(if $(CUBLAS_LIB),-DGEMM_CHECK_CUBLAS -lcublas)
build/gemm_check: scripts/gpu/gemm_check.cu build/gemm_cu.o build/common.o gemm.h | build
	$(NVCC) $(NVCCFLAGS) -I. -Xcompiler -fopenmp scripts/gpu/gemm_check.cu build/gemm_cu.o build/common.o -o $@ \
		$(GEMM_CHECK_CUBLAS) -lgomp -lz -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64

# AddressSanitizer + UBSan builds (CPU only) for the unit tests and the bad-input tests
build/asan/%.o: %.c | build
	@mkdir -p build/asan
	$(CC) $(filter-out -O3 -DLLM4D_CUDA,$(CFLAGS)) $(SAN) -c $< -o $@

build/train-asan: $(HOST_SRC:%.c=build/asan/%.o)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8

build/test_unit: build/asan/test_unit.o $(LIB_OBJ:build/%=build/asan/%)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8

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

# the emulator's sm_90a instructions (emu/sm90.cc: mbarrier, TMA, wgmma, setmaxnreg) on a mock of the
# emulator core, C++17, test-only; built when a C++ compiler is found
CXX ?= g++
ifneq ($(shell command -v $(CXX) 2>/dev/null),)
EMU_SM90_TEST = build/test_emu_sm90
endif
build/test_emu_sm90: test/test_emu_sm90.cc emu/sm90.cc emu/sm90.h emu/hooks.h gemm.h test/check.h | build
	$(CXX) -std=c++17 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
	    -fno-sanitize-recover=undefined -pthread test/test_emu_sm90.cc emu/sm90.cc -o $@

build/test_comm: build/asan/test_comm.o $(LIB_OBJ:build/%=build/asan/%)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8

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
	$(CC) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8

# the collective tests for the guest (test_comm without sanitizers: emulation is slow enough)
build/test_comm-portable: build/portable/test_comm.o $(LIB_OBJ:build/%=build/portable/%)
	$(CC) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8

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

# attention on the GPU, flash against simple kernels (scripts/gpu/; scripts/gpu_check.sh runs it)
build/bench_attention: scripts/gpu/bench_attention.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

# the CPU matmul kernels on the model's shapes against the measured FMA peak (scripts/bench/; make bench)
build/bench_matmul: scripts/bench/bench_matmul.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

# attention's inputs and results for test/attention_ref.py (t_attention_torch)
build/bench_llama: scripts/bench/bench_llama.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

build/attention_check: test/attention_check.c $(LIB_OBJ) $(CUDA_OBJ)
	$(CC) $(CFLAGS) -I. $(filter %.c %.o,$^) -o $@ $(LDLIBS)

# the Llama family's CPU ops on random inputs, for test/llama_ref.py (PyTorch); ASan+UBSan, CPU only
build/llama_check: build/asan/llama_check.o $(LIB_OBJ:build/%=build/asan/%)
	$(CC) $(SAN) $^ -o $@ -lm -fopenmp -lpthread -lz -ljansson -lpcre2-8

build/asan/llama_check.o: test/llama_check.c | build
	@mkdir -p build/asan
	$(CC) $(filter-out -O3 -DLLM4D_CUDA,$(CFLAGS)) -I. $(SAN) -c $< -o $@
# the emulated GPU's rules (its variables are above)
build/emu/%.o: emu/%.cc | build
	@mkdir -p build/emu
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

build/emu/%_cu.o: %.cu | build
	@mkdir -p build/emu
	$(CXX) -x c++ $(EMU_CU_FLAGS) -c $< -o $@

build/emu/%.o: %.c | build
	@mkdir -p build/emu
	$(CC) $(filter-out -DLLM4D_CUDA,$(CFLAGS)) -DLLM4D_CUDA -c $< -o $@

build/train-emu: build/train.o build/bench_comm.o build/plan.o $(EMU_LIB_OBJ)
	$(CC) $^ -o $@ $(EMU_LDLIBS)

build/test_cuda-emu: test/test_cuda.c $(EMU_LIB_OBJ)
	$(CC) $(filter-out -DLLM4D_CUDA,$(CFLAGS)) -DLLM4D_CUDA -I. $(filter %.c %.o,$^) -o $@ $(EMU_LDLIBS)

# the checker against broken variants of the real kernels (test/emu.sh)
build/test_checker-emu: emu/test_checker.cc gemm.cu attention.cu common.cuh $(EMU_CORE) build/common.o
	$(CXX) $(EMU_CU_FLAGS) emu/test_checker.cc $(EMU_CORE) build/common.o -o $@ $(EMU_LDLIBS)

build/gemm_check-emu: scripts/gpu/gemm_check.cu $(EMU_LIB_OBJ)
	$(CXX) -x c++ $(EMU_CU_FLAGS) -fopenmp -c scripts/gpu/gemm_check.cu -o build/emu/gemm_check.o
	$(CXX) build/emu/gemm_check.o $(EMU_LIB_OBJ) -o $@ $(EMU_LDLIBS)

build:
	@mkdir -p build

deps:
	bash scripts/deps.sh

# Trains the default small model on the Debian license texts (always on a Debian machine). deps first,
# then a make of ./train: it builds with what deps installed.
demo: deps
	@$(MAKE) --no-print-directory train
	bash scripts/demo.sh

# deps first, then a fresh make: what deps installed (libibverbs-dev) decides what gets built. T is passed
# on unexpanded ($(value T)), so a pattern's $ reaches test/run.sh.
test: deps
	@$(MAKE) --no-print-directory test-bins
	bash test/run.sh $(if $(value T),'$(value T)')

test-bins: train $(EMU_BIN) build/train-asan build/test_unit build/test_comm build/test_gemm build/test_attention build/attention_check \
           build/llama_check build/test_schedule build/test_split $(VERBS_BIN) $(EMU_SM90_TEST)

test-gpu:
	bash scripts/gpu_check.sh

bench: train build/bench_matmul build/bench_llama
	bash scripts/bench.sh

clean:
	rm -rf build train

-include $(wildcard build/*.d build/asan/*.d build/portable/*.d build/emu/*.d)

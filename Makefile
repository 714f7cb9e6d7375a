# fp8train — build, test, demo.
#   make            build/libfp8train.a, build/fp8train (with the CUDA backend when nvcc exists)
#   make test       install missing packages, build, run the whole CPU test suite
#   make demo       train `tiny` in BF16 then FP8 on the synthetic corpus and compare
#   make gpu-test   CUDA backend against the CPU backend (needs an NVIDIA Hopper GPU)
#   make test-sanitize   the test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make bench      CPU benchmarks (bench/)
#   make deps       check by linking that the libraries the build needs are there; install the
#                   missing Debian packages, saying which and why (scripts/install-deps.sh --check
#                   only reports)

CC      ?= gcc
CXX     ?= g++
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
BUILD   ?= build
OPT     ?= -O2 -march=x86-64-v2 -mtune=native
SAN     ?=
CFLAGS  += -std=c11 $(OPT) -g -Wall -Wextra -fopenmp -Iinclude -Isrc -D_GNU_SOURCE $(SAN)
CXXFLAGS+= -std=c++17 $(OPT) -g -Wall -Wextra -fopenmp -Iinclude -Isrc $(SAN)
LDLIBS  += -lopenblas -lcjson -lpcre2-8 -lm -fopenmp $(SAN)
NVFLAGS ?= -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
           -Xcompiler -Wall,-Wextra -lineinfo
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++

LIB_SRC  := $(wildcard src/util/*.c src/numerics/*.c src/io/*.c src/backend/*.c \
                       src/backend/cpu/*.c src/model/*.c src/train/*.c src/debug/*.c)
CLI_SRC  := $(wildcard src/cli/*.c)
CU_SRC   := $(wildcard src/backend/cuda/*.cu)
TEST_C   := $(wildcard tests/test_*.c)
TEST_CXX := $(wildcard tests/test_*.cpp)
TEST_SH  := $(wildcard tests/test_*.sh)
BENCH_C  := $(wildcard bench/*.c)

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o)
TEST_BIN := $(TEST_C:tests/%.c=$(BUILD)/tests/%) $(TEST_CXX:tests/%.cpp=$(BUILD)/tests/%)
BENCH_BIN:= $(BENCH_C:bench/%.c=$(BUILD)/bench/%)

ifneq ($(NVCC),)
ifeq ($(NO_CUDA),)
HAVE_CUDA := 1
endif
endif

# Data parallel (src/backend/dist.c): MPI when OpenMPI's mpicc is there (NO_MPI=1: a build
# that runs one process only); NCCL for the CUDA backend's collectives when nccl.h is there.
MPICC   ?= $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
ifeq ($(NO_MPI),)
MPI_CFLAGS := -DFP8T_HAVE_MPI $(shell $(MPICC) --showme:compile 2>/dev/null)
LDLIBS  += $(shell $(MPICC) --showme:link 2>/dev/null)
$(BUILD)/src/backend/dist.o: CFLAGS += $(MPI_CFLAGS)
endif
endif
ifeq ($(HAVE_CUDA),1)
ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
NVFLAGS   += -DFP8T_HAVE_NCCL
CUDA_LIBS += -lnccl
endif
endif

ifeq ($(HAVE_CUDA),1)
FP8TRAIN_LINK = $(CU_OBJ) $(CUDA_LIBS)
CLI_DEPS = $(CU_OBJ)
# dev/cuda: kernel ladders (standalone, CUDA runtime only), built so they keep compiling
DEV_CU_BIN := $(patsubst dev/cuda/%.cu,$(BUILD)/dev/cuda/%,$(wildcard dev/cuda/*.cu))
endif

DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all deps test test-sanitize demo demo-debug gpu-test bench clean report-screenshot
all: $(BUILD)/libfp8train.a $(BUILD)/fp8train $(DEV_CU_BIN)

# The packages the build links, checked by linking (scripts/install-deps.sh installs what is
# missing and says why). Checked again when the script or this Makefile (its LDLIBS) changes,
# with the compiler the build uses; the stamp is written only when the check passed.
$(DEPS_STAMP): scripts/install-deps.sh Makefile
	@mkdir -p $(BUILD)
	@CC="$(CC)" scripts/install-deps.sh
	@touch $@
deps: $(DEPS_STAMP)

$(BUILD)/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/src/backend/cuda/%.o: src/backend/cuda/%.cu $(wildcard src/backend/cuda/*.cuh) include/fp8train/backend.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/dev/cuda/%: dev/cuda/%.cu $(wildcard src/backend/cuda/*.cu*)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $<

$(BUILD)/libfp8train.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fp8train: $(CLI_OBJ) $(BUILD)/libfp8train.a $(CLI_DEPS)
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libfp8train.a $(FP8TRAIN_LINK) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/test.h $(BUILD)/libfp8train.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libfp8train.a $(LDLIBS)

# C++ tests may use the CUDA toolkit's host-side headers (cuda_fp8.h) as a reference.
$(BUILD)/tests/%: tests/%.cpp tests/test.h $(BUILD)/libfp8train.a
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -I$(CUDA_HOME)/include -o $@ $< $(BUILD)/libfp8train.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libfp8train.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libfp8train.a $(LDLIBS)

test: $(DEPS_STAMP) $(BUILD)/fp8train $(TEST_BIN)
	@FP8TRAIN_BIN=$(abspath $(BUILD)/fp8train) tests/run.sh $(TEST_BIN) $(TEST_SH)

# The same suite built with ASan + UBSan in build-san/ (CPU only).
test-sanitize:
	$(MAKE) BUILD=build-san NO_CUDA=1 OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# BF16 then FP8 on the synthetic language, curves side by side (scripts/demo.sh).
demo: $(DEPS_STAMP) $(BUILD)/fp8train
	@scripts/demo.sh $(BUILD)/fp8train

# The seeds' case study: a Dgrad fault injected into layers 1-2 of tiny, found by
# `fp8train bisect` (scripts/demo-debug.sh; report in runs/demo-debug/bisect/).
demo-debug: $(DEPS_STAMP) $(BUILD)/fp8train
	@scripts/demo-debug.sh $(BUILD)/fp8train

bench: $(BENCH_BIN) $(BUILD)/fp8train
	@for b in $(BENCH_BIN); do echo "== $$b"; $$b || exit 1; done

# gpu-test: the CUDA backend against the CPU backend, op by op and whole training steps
# (tests/gpu/; needs an NVIDIA Hopper GPU). `make gpu-test GPU_TEST_ARGS=--quick` skips the
# exhaustive 2^32-input conversion check.
GPU_TEST_C   := $(wildcard tests/gpu/*.c)
GPU_TEST_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard tests/gpu/*.cu))
ifeq ($(HAVE_CUDA),1)
$(BUILD)/tests/gpu/%.o: tests/gpu/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/gpu_test: $(GPU_TEST_C) $(GPU_TEST_OBJ) $(BUILD)/libfp8train.a $(CU_OBJ)
	$(CC) $(CFLAGS) -o $@ $(GPU_TEST_C) $(GPU_TEST_OBJ) $(BUILD)/libfp8train.a $(CU_OBJ) \
	    $(CUDA_LIBS) $(LDLIBS)

gpu-test: $(BUILD)/gpu_test
	$(BUILD)/gpu_test $(GPU_TEST_ARGS)
else
gpu-test:
	@echo "gpu-test needs the CUDA toolkit (nvcc) and an NVIDIA Hopper GPU"; exit 1
endif

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

clean:
	rm -rf build build-san

# Render an HTML report (fp8train compare --report FILE) in headless Chromium and save a PNG,
# to look at what a browser shows: make report-screenshot REPORT=runs/report.html
# [PNG=report.png] [HEIGHT=2400]. Installs Debian's chromium if missing.
REPORT ?=
PNG    ?= $(basename $(REPORT)).png
HEIGHT ?= 2400
report-screenshot:
	@test -n "$(REPORT)" && test -f "$(REPORT)" || { echo "usage: make report-screenshot REPORT=path/to/report.html [PNG=out.png] [HEIGHT=2400] (write one with: fp8train compare RUN_A RUN_B --report FILE)"; exit 2; }
	@scripts/install-deps.sh --with-browser
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
	  --screenshot=$(abspath $(PNG)) --window-size=1200,$(HEIGHT) file://$(abspath $(REPORT))
	@echo "screenshot: $(PNG)"

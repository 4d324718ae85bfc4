# coda - build with plain make. `make help` lists the targets.
#
# Everything builds on a machine without a GPU. Where the CUDA toolkit is
# found (CUDA_HOME, default /usr/local/cuda) the CUDA backend is built too:
# its kernels are compiled at run time with NVRTC, and the CUDA driver is
# opened with dlopen, so the library still loads and runs (CPU backend) on a
# machine with no driver.

CC        ?= cc
BUILD     := build
CUDA_HOME ?= /usr/local/cuda
PYTHON    ?= /usr/bin/python3

# CFLAGS (optimisation, debug, sanitizers) may be set on the command line; the
# flags the code needs are appended even then ("override").
CFLAGS   ?= -O2 -g
override CFLAGS   += -std=c11 -Wall -Wextra -Wno-unused-parameter -fPIC -pthread -D_GNU_SOURCE \
                     -Werror=implicit-function-declaration
override CPPFLAGS += -Iinclude -Isrc
override LDLIBS   += -lm -lpthread -ldl

ifneq ($(wildcard $(CUDA_HOME)/include/nvrtc.h),)
WITH_CUDA ?= 1
else
WITH_CUDA ?= 0
endif

LIB_SRC := $(wildcard src/core/*.c src/api/*.c src/program/*.c src/codegen/*.c src/cpu/*.c src/layer/*.c)
ifeq ($(WITH_CUDA),1)
LIB_SRC  += $(wildcard src/cuda/*.c)
override CPPFLAGS += -DCODA_WITH_CUDA=1 -I$(CUDA_HOME)/include -I$(BUILD)/gen
override LDLIBS   += -L$(CUDA_HOME)/lib64 -lnvrtc -Wl,-rpath,$(CUDA_HOME)/lib64
endif

# CUDA C kernel sources are embedded into the library as strings (for NVRTC);
# so is the code generator's device prelude (with or without CUDA: the
# generated text is the same).
KERNEL_SRC := $(wildcard src/cuda/kernels/*.cuh)
CODEGEN_SRC := $(wildcard src/codegen/*.cuh)
LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/codegen_src.o
ifeq ($(WITH_CUDA),1)
LIB_OBJ    += $(BUILD)/gen/kernels.o
endif

# libcoda.so exports the functions coda.h declares (CODA_API) and nothing
# else: the library's own objects are compiled with hidden visibility.
# tests/check_exports.py (make test-c) holds the two lists equal.
$(LIB_OBJ): override CFLAGS += -fvisibility=hidden

# The test oracles: the plain unfused reference layer and the check of coda's
# layer against it (tests/oracle/). They are not part of the library: the C
# tests, the GPU tests and the CLI (`coda demo`) link liboracle.a beside
# libcoda.a, and the Python tests load the reference from liboracle.so.
ORACLE_SRC := $(wildcard tests/oracle/*.c)
ORACLE_OBJ := $(ORACLE_SRC:%.c=$(BUILD)/%.o)
ORACLE_A   := $(BUILD)/tests/liboracle.a
ORACLE_SO  := $(BUILD)/tests/liboracle.so
# Sizes and offsets of the C structures the Python binding mirrors, for
# tests/test_binding_layout.py.
LAYOUT_BIN := $(BUILD)/tests/print_layouts

TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
GPU_SRC   := $(wildcard tests/gpu/*.c bench/*.c)
GPU_BIN   := $(GPU_SRC:%.c=$(BUILD)/%)

# A recipe that fails leaves no half-written target (e.g. build/gen/kernels.c).
.DELETE_ON_ERROR:

.PHONY: all lib test test-c test-py test-sanitize demo docs fuzz gpu-test bench clean help
all: lib $(BUILD)/coda $(TEST_BIN) $(BUILD)/tools/op_docs $(ORACLE_SO) $(LAYOUT_BIN)

help:
	@echo "make            library (static + shared), the coda CLI, the tests"
	@echo "make lib        the library alone (build/libcoda.a, build/libcoda.so)"
	@echo "make test       run the C tests, then the PyTorch cross-check"
	@echo "make test-c     the C tests alone"
	@echo "make test-py    the PyTorch cross-check alone (PYTHON=/absolute/path/to/python for another torch)"
	@echo "make demo       run 'coda demo' (GPU if present, else CPU backend)"
	@echo "make docs       the op tables of docs/programs.md, from src/program/ops.def"
	@echo "make fuzz       libFuzzer on the program parser/verifier (clang, 60 s)"
	@echo "make test-sanitize  the C tests again under AddressSanitizer + UBSan (build-asan/)"
	@echo "make gpu-test   GPU test suite (needs an sm_90a GPU)"
	@echo "make bench      GPU benchmarks (needs an sm_90a GPU)"
	@echo "make clean      remove the build directory"

lib: $(BUILD)/libcoda.a $(BUILD)/libcoda.so

$(BUILD)/%.o: %.c include/coda.h $(wildcard src/*/*.h src/*/*.def)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/tools/embed: tools/embed.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -o $@ $<

# The op tables of docs/programs.md are made from the op table (ops.def).
$(BUILD)/tools/op_docs: tools/op_docs.c src/program/ops.def
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -Isrc -o $@ $<

docs: $(BUILD)/tools/op_docs
	$(BUILD)/tools/op_docs --write docs/programs.md

$(BUILD)/gen/kernels.c: $(KERNEL_SRC) $(BUILD)/tools/embed
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed $@ $(KERNEL_SRC)

$(BUILD)/gen/kernels.o: $(BUILD)/gen/kernels.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/gen/codegen_src.c: $(CODEGEN_SRC) $(BUILD)/tools/embed
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed -t coda_codegen_sources $@ $(CODEGEN_SRC)

$(BUILD)/gen/codegen_src.o: $(BUILD)/gen/codegen_src.c
	$(CC) $(CFLAGS) -c $< -o $@

# Nothing else rebuilds the embedded sources when the flags above change
# (the visibility of their symbols, say); the other objects follow coda.h.
$(BUILD)/gen/kernels.o $(BUILD)/gen/codegen_src.o: Makefile

$(BUILD)/libcoda.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libcoda.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(ORACLE_OBJ): override CPPFLAGS += -Itests
$(ORACLE_OBJ): $(wildcard tests/oracle/*.h)

$(ORACLE_A): $(ORACLE_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The reference layer alone, with the part of libcoda it calls linked in and
# kept to itself (--exclude-libs): it exports only coda__ref_*.
$(ORACLE_SO): $(BUILD)/tests/oracle/reference.o $(BUILD)/libcoda.a
	$(CC) -shared -o $@ $< $(BUILD)/libcoda.a -Wl,--exclude-libs,ALL $(LDLIBS)

CLI_SRC := tools/coda.c $(wildcard tools/cli_*.c)
$(BUILD)/coda: $(CLI_SRC) $(wildcard tools/*.h tests/oracle/*.h) $(ORACLE_A) $(BUILD)/libcoda.a
	$(CC) $(CPPFLAGS) -Itools -Itests $(CFLAGS) -o $@ $(CLI_SRC) $(ORACLE_A) $(BUILD)/libcoda.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h tests/oracle/*.h) $(ORACLE_A) $(BUILD)/libcoda.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -o $@ $< $(ORACLE_A) $(BUILD)/libcoda.a $(LDLIBS)

# GPU tests and benchmarks (not the library) link the CUDA runtime and cuBLAS.
GPU_LDLIBS := -L$(CUDA_HOME)/lib64 -lcudart -lcublas -Wl,-rpath,$(CUDA_HOME)/lib64

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(wildcard tests/*.h tests/gpu/*.h tests/oracle/*.h) $(ORACLE_A) $(BUILD)/libcoda.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -o $@ $< $(ORACLE_A) $(BUILD)/libcoda.a $(LDLIBS) $(GPU_LDLIBS)

$(BUILD)/bench/%: bench/%.c tests/harness.h $(BUILD)/libcoda.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -o $@ $< $(BUILD)/libcoda.a $(LDLIBS) $(GPU_LDLIBS)

test: test-c test-py

test-c: $(TEST_BIN) $(BUILD)/coda $(BUILD)/tools/op_docs $(BUILD)/libcoda.so
	@echo "== tests/check_exports.py $(BUILD)/libcoda.so"; $(PYTHON) tests/check_exports.py $(BUILD)/libcoda.so include/coda.h
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; $$t; done
	@echo "== tests/test_cli.sh $(BUILD)/coda"; sh tests/test_cli.sh $(BUILD)/coda
	@echo "== the op tables of docs/programs.md"; $(BUILD)/tools/op_docs --check docs/programs.md include/coda.h
	@echo "== all C tests passed"

# the benchmark's peers too: its eager formulas and coda's programs agree
# (on the CPU; on the GPU where there is one)
test-py: lib $(BUILD)/coda $(ORACLE_SO) $(LAYOUT_BIN)
	@set -e; export CODA_ORACLE_LIB=$(abspath $(ORACLE_SO)) CODA_PRINT_LAYOUTS=$(abspath $(LAYOUT_BIN)); \
	    for t in $(wildcard tests/test_*.py); do echo "== $$t"; $(PYTHON) $$t; done
	@echo "== tests/test_install.sh"; sh tests/test_install.sh $(PYTHON)
	@echo "== bench/bench_vs_torch.py --check"; $(PYTHON) bench/bench_vs_torch.py --check
	@echo "== bench/trace_gaps.py --selftest"; $(PYTHON) bench/trace_gaps.py --selftest
	@echo "== bench/step_timer.py --selftest"; $(PYTHON) bench/step_timer.py --selftest
	@echo "== bench/train_cli_curve.py --check"; $(PYTHON) bench/train_cli_curve.py --check
	@echo "== bench/bench_vs_torch_train.py --check"; $(PYTHON) bench/bench_vs_torch_train.py --check

# The C tests again with AddressSanitizer (leaks included) and UBSan, in a
# build directory of their own.
test-sanitize:
	$(MAKE) BUILD=$(BUILD)-asan CC="$(CC) -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    CFLAGS="-O1 -g -fno-omit-frame-pointer" test-c

demo: $(BUILD)/coda
	$(BUILD)/coda demo

# Only what the parser needs: src/api calls into the backends.
FUZZ_SRC := src/core/status.c src/core/tensor.c $(wildcard src/program/*.c)
$(BUILD)/fuzz/fuzz_program: fuzz/fuzz_program.c $(FUZZ_SRC)
	@mkdir -p $(dir $@)
	clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $(CPPFLAGS) -o $@ $^ -lm

fuzz: $(BUILD)/fuzz/fuzz_program
	@mkdir -p $(BUILD)/fuzz/corpus
	cp -n fuzz/corpus/* $(BUILD)/fuzz/corpus/ 2>/dev/null || true
	$(BUILD)/fuzz/fuzz_program -max_total_time=$${FUZZ_SECONDS:-60} -max_len=4096 $(BUILD)/fuzz/corpus

gpu-test: $(GPU_BIN)
	@set -e; for t in $(filter $(BUILD)/tests/gpu/%,$(GPU_BIN)); do echo "== $$t"; $$t; done

bench: $(GPU_BIN)
	@set -e; for t in $(filter $(BUILD)/bench/%,$(GPU_BIN)); do echo "== $$t"; $$t; done

clean:
	rm -rf $(BUILD)

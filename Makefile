# lockstep: the two commands a new machine needs are `make demo` and `make test`.
# Both install what is missing (from Debian's archive), build, and run.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps deps-demo configure build demo demo-build test test-unit test-sanitize bench fuzz clean cuda-check cuda-test cuda-compile gpu-kit kit-proof fresh-demo

all: build

# Every part of scripts/install-deps.sh; the demo installs its own part only
# (Note [What make demo installs]).
deps:
	@if [ -z "$$LOCKSTEP_SKIP_INSTALL" ]; then scripts/install-deps.sh; fi
deps-demo:
	@if [ -z "$$LOCKSTEP_SKIP_INSTALL" ]; then scripts/install-deps.sh demo; fi

# Note [clang for the test build]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `make build` and `make test` compile a new folder with clang (and Ninja)
# where they are installed, as the demo's quick build does: on 2 cores gcc 12
# spent 23 min on build/ and clang 14 spends about 10, at the same -O2 -g1.
# Every translation unit instantiates the templates torch's headers leave
# pending; gcc does it in each one (7-10 s even for an empty file), clang's
# precompiled header does it once (-fpch-instantiate-templates, which CMake
# passes). The time is lockstep's compile, not its run: its steps are
# libtorch's kernels. GCC stays tested: CI's 2.14 leg builds the whole tree
# with forky's GCC 16 (that root has no clang). COMPILER=gcc builds with the default compiler instead; a folder
# keeps the compiler (and generator) it was first configured with.
# Where libtorch's CMake package enables CUDA, CMake hands nvcc clang++ as its
# host compiler, which nvcc refuses past its supported versions (12.4: clang
# 17, gcc 13): CUDA_HOST_CXX names the one nvcc takes (CUDAHOSTCXX).
COMPILER ?= clang
CUDA_HOST_CXX ?=
CLANG_ENV = CC=$$(command -v clang || echo cc) CXX=$$(command -v clang++ || echo c++) \
	$(if $(CUDA_HOST_CXX),CUDAHOSTCXX=$(CUDA_HOST_CXX))
# -G Ninja for a folder configured for the first time, where Ninja is installed.
NEW_FOLDER_GENERATOR = $$([ ! -f $(1)/CMakeCache.txt ] && command -v ninja >/dev/null && echo -G Ninja)
CONFIGURE = $(if $(filter clang,$(COMPILER)),$(CLANG_ENV)) cmake -S . -B $(BUILD_DIR) \
	$(call NEW_FOLDER_GENERATOR,$(BUILD_DIR)) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null
configure: deps
	@$(CONFIGURE)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Trains the Fashion-MNIST CNN on 2 processes with lockstep's DDP, prints its
# test accuracy and where its checkpoints are, and draws its curves
# (work_dirs/demo/curves.svg).
DEMO_NPROC ?= 2
DEMO_BUILD_DIR ?= build-demo
# Note [The demo's quick build]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A newcomer's first command spends most of its time compiling: gcc at -O2
# takes 8.6 min on 2 cores for the library and bin/lockstep, while training
# takes 3. The demo's time is libtorch's kernels, not lockstep's code, so the
# demo builds its own folder (build-demo/) with clang (installed with the
# demo's packages), which parses torch's headers faster and takes its
# precompiled header's template instantiations once, and at -O0 (build type
# Quick, in unity batches of 16): under 2 min, and 12% slower steps, the
# same loss. `make build` and `make test` build the optimised build/ (with
# clang too, at -O2: Note [clang for the test build]); README's commands use
# that one. Measured in BENCHMARKS.md ("make demo on a new machine").
#
# With Ninja (installed with the demo's packages; a folder configured
# before keeps its generator), the CLI's sources and the precompiled header's
# anchor compile beside the library's batches instead of after them: make's
# recursive build leaves one core idle for about 20 s of them.
#
# demo-build builds only the CLI (the library and bin/lockstep), not the
# tests. CI builds the whole tree in this build type against libtorch 2.14
# and 2.6 (Note [The version legs build Quick]), so its batches cannot break
# unseen.
demo-build: deps-demo
	@$(CLANG_ENV) cmake -S . -B $(DEMO_BUILD_DIR) -DCMAKE_BUILD_TYPE=Quick \
		$(call NEW_FOLDER_GENERATOR,$(DEMO_BUILD_DIR)) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(DEMO_BUILD_DIR) -j $(JOBS) --target lockstep_cli
demo: demo-build
	$(DEMO_BUILD_DIR)/bin/lockstep train examples/fashion_mnist/cnn_ddp.yaml --nproc $(DEMO_NPROC) --work-dir work_dirs/demo
	@$(DEMO_BUILD_DIR)/bin/lockstep plot work_dirs/demo --keys loss,lr,accuracy/top1 -o work_dirs/demo/curves.svg
	@echo "make demo: this was the quick build, $(DEMO_BUILD_DIR)/bin/lockstep; make build (or make test) makes the optimised build/bin/lockstep"

# Tests run $(JOBS) at a time, multi-process ones included (Note [Multi-process
# tests side by side], tests/CMakeLists.txt), multinode scenarios included.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --no-tests=error --timeout 900 -j $(JOBS) $(CTEST_FLAGS)

test-unit: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L unit -j $(JOBS) $(CTEST_FLAGS)

# Every test (unit, multi-process, end-to-end) built with AddressSanitizer and
# UndefinedBehaviorSanitizer in its own build folder. Workers started by the
# launcher inherit the options. Every report (invalid access, leak, undefined
# behaviour) is also written under sanitizer-reports/ there, and any report
# fails the target, even one from a process a test expected to fail.
SANITIZE_BUILD_DIR ?= build-sanitize
SANITIZE_REPORTS = $(abspath $(SANITIZE_BUILD_DIR))/sanitizer-reports
SANITIZE_ENV = ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=0:log_path=$(SANITIZE_REPORTS)/asan \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(SANITIZE_REPORTS)/ubsan
test-sanitize: deps
	@cmake -S . -B $(SANITIZE_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_SANITIZE=ON \
		-DLOCKSTEP_BUILD_BENCH=OFF $(CMAKE_FLAGS) >/dev/null
	@rm -rf $(SANITIZE_REPORTS) && mkdir -p $(SANITIZE_REPORTS)
	@$(SANITIZE_ENV) cmake --build $(SANITIZE_BUILD_DIR) -j $(JOBS)
	@cd $(SANITIZE_BUILD_DIR) && $(SANITIZE_ENV) ctest --output-on-failure --timeout 1800 -j $(JOBS) $(CTEST_FLAGS); \
	status=$$?; \
	if [ -n "$$(ls -A $(SANITIZE_REPORTS))" ]; then \
	  echo "test-sanitize: sanitizer reports in $(SANITIZE_REPORTS):"; head -n 60 $(SANITIZE_REPORTS)/*; exit 1; \
	fi; \
	echo "test-sanitize: no sanitizer reports"; exit $$status

# lockstep against a CUDA build of libtorch, on a machine without a GPU:
# Debian trixie's libtorch-cuda-dev 2.6, CUDA 12.4 and NCCL 2.22 in a root of
# their own (scripts/trixie-root.sh --cuda, about 7 GB).
#   cuda-check: every source whose code depends on CUDA compiles, with GCC 14 (CI's
#               2.6 leg does the same with clang 19, LOCKSTEP_REQUIRE_CUDA);
#   cuda-test:  everything builds and links, and the whole suite runs (CUDA tests skip).
# cuda-compile is cuda-check's work, for any machine whose libtorch has CUDA.
CUDA_BUILD_DIR ?= build-cuda

# The offline kit for GPU hosts without network (scripts/gpu-kit.sh), and its
# proof: lockstep built from the kit alone, in a bookworm root that has
# libtorch but none of the -dev packages, passes its unit tests.
# `make demo` as on a new machine, timed, in a bare bookworm root (scripts/fresh-demo.sh).
fresh-demo:
	scripts/trixie-root.sh --fresh scripts/fresh-demo.sh

gpu-kit:
	scripts/gpu-kit.sh
kit-proof: gpu-kit
	scripts/trixie-root.sh --kit-proof scripts/kit-proof.sh

cuda-check:
	scripts/trixie-root.sh --cuda make cuda-compile CUDA_BUILD_DIR=$(CUDA_BUILD_DIR)
cuda-compile: deps
	@cmake -S . -B $(CUDA_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DLOCKSTEP_REQUIRE_CUDA=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(CUDA_BUILD_DIR) -j $(JOBS) --target lockstep_cuda_dependent
cuda-test:
	scripts/trixie-root.sh --cuda make test BUILD_DIR=$(CUDA_BUILD_DIR) \
	  "CMAKE_FLAGS=-DLOCKSTEP_REQUIRE_CUDA=ON $(CMAKE_FLAGS)"

bench: build
	@for b in $(BUILD_DIR)/bench/bench_*; do echo "== $$b"; $$b || exit 1; done

# libFuzzer targets (clang, ASan+UBSan) for the config parser, IDX reader and checkpoint readers.
FUZZ_SECONDS ?= 600
fuzz:
	@if [ -z "$$LOCKSTEP_SKIP_INSTALL" ]; then scripts/install-deps.sh --extra; fi
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

clean:
	rm -rf $(BUILD_DIR) $(DEMO_BUILD_DIR)

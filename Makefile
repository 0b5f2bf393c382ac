# lockstep: the two commands a new machine needs are `make demo` and `make test`.
# Both install what is missing (from Debian's archive), build, and run.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps configure build demo test test-unit bench fuzz clean

all: build

deps:
	@if [ -z "$$LOCKSTEP_SKIP_INSTALL" ]; then scripts/install-deps.sh; fi

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Trains the Fashion-MNIST CNN on 2 processes with lockstep's DDP and prints its test accuracy.
DEMO_NPROC ?= 2
demo: build
	$(BUILD_DIR)/bin/lockstep train examples/fashion_mnist/cnn_ddp.yaml --nproc $(DEMO_NPROC) --work-dir work_dirs/demo

# Unit tests run in parallel; multi-process tests are RUN_SERIAL (they use every core).
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 900 -j $(JOBS) $(CTEST_FLAGS)

test-unit: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L unit -j $(JOBS) $(CTEST_FLAGS)

bench: build
	@for b in $(BUILD_DIR)/bench/bench_*; do echo "== $$b"; $$b || exit 1; done

# libFuzzer targets (clang, ASan+UBSan) for the config parser, IDX reader and checkpoint readers.
FUZZ_SECONDS ?= 600
fuzz:
	@if [ -z "$$LOCKSTEP_SKIP_INSTALL" ]; then scripts/install-deps.sh --extra; fi
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

clean:
	rm -rf $(BUILD_DIR)

# Thin wrapper over CMake/CTest; the README's two commands are
#   ./scripts/setup && make demo      and      ./scripts/setup && make test
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build demo test test-slow test-gpu test-multigpu fuzz clean

all: build

setup:
	./scripts/setup

configure:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: the numerics self-check, then the default sweep (both tiny fixtures,
# the v2 contract pair, reference + emulated layouts, every path, gradients). It
# builds only the CLI and its libraries; `make test` builds the rest.
demo: configure
	cmake --build $(BUILD) --target bitparity -j $(JOBS)
	$(BUILD)/harness/bitparity selfcheck
	OMP_WAIT_POLICY=passive $(BUILD)/harness/bitparity sweep

# Every CPU test (CTest label cpu; gpu and multigpu tests report skipped without their GPUs), then the numerics core rebuilt with clang and
# at -O0 against the same golden digests (scripts/check-variants).
test: build
	cd $(BUILD) && ctest -L 'cpu|gpu|multigpu' --output-on-failure -j $(JOBS)
	JOBS=$(JOBS) ./scripts/check-variants $(BUILD)

test-slow: build
	cd $(BUILD) && ctest -L slow --output-on-failure

test-gpu: build
	cd $(BUILD) && ctest -L gpu --output-on-failure

test-multigpu: build
	cd $(BUILD) && ctest -L multigpu --output-on-failure

# libFuzzer on the input parsers in a separate clang build, $(BUILD)-fuzz (tests/fuzz/README.md).
FUZZ_SECONDS ?= 60
fuzz:
	BP_FUZZ_BUILD=$(BUILD)-fuzz JOBS=$(JOBS) ./scripts/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BUILD)-variant-* $(BUILD)-fuzz

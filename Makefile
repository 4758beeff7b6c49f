# Thin wrapper over CMake/CTest; the README's two commands are
#   ./scripts/setup && make demo      and      ./scripts/setup && make test
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build demo test test-slow test-gpu clean

all: build

setup:
	./scripts/setup

configure:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: today the numerics self-check; the default sweep once it exists.
demo: build
	$(BUILD)/harness/bitparity selfcheck

# Every CPU test (CTest label cpu; gpu tests report skipped without a GPU), then the numerics core rebuilt with clang and
# at -O0 against the same golden digests (scripts/check-variants).
test: build
	cd $(BUILD) && ctest -L 'cpu|gpu' --output-on-failure -j $(JOBS)
	JOBS=$(JOBS) ./scripts/check-variants $(BUILD)

test-slow: build
	cd $(BUILD) && ctest -L slow --output-on-failure

test-gpu: build
	cd $(BUILD) && ctest -L gpu --output-on-failure

clean:
	rm -rf $(BUILD) $(BUILD)-variant-*

# The two entry points of a fresh Debian 12 machine:
#   make run    install what is missing, build (release), run `moe run` on the default preset
#   make test   install what is missing, build (release), run every test
# Other presets: `make test PRESET=asan`, `make build PRESET=debug`.

PRESET ?= release
BUILD_DIR := build/$(PRESET)
JOBS ?= $(shell nproc)

.PHONY: deps configure build run test clean

deps:
	bash scripts/install-deps

configure: deps
	cmake --preset $(PRESET)

build: configure
	cmake --build --preset $(PRESET) -j $(JOBS)

run: build
	$(BUILD_DIR)/src/tools/moe/moe run

test: build
	ctest --preset $(PRESET)

clean:
	rm -rf build

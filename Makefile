# The two entry points of a fresh Debian 12 machine:
#   make run    install what is missing, build (release), run `moe run` on the default preset
#   make test   install what is missing, build (release), run every test: ctest, then the
#               Python package's tests (python-test)
# Other presets: `make test PRESET=asan`, `make build PRESET=debug`. The Python package always
# builds in Release, in build/python, against the venv in build/venv.

PRESET ?= release

# The CUDA toolkit's usual home, for CMake to find nvcc when a login shell did not put it on PATH
# (the CUDA backend builds wherever nvcc is found; see MOE_WITH_CUDA).
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export PATH := $(PATH):/usr/local/cuda/bin
endif
BUILD_DIR := build/$(PRESET)
JOBS ?= $(shell nproc)
VENV := build/venv

.PHONY: deps configure build run test clean python-deps python-build python-test

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
	$(MAKE) --no-print-directory python-test

python-deps: deps
	bash scripts/install-python-deps

# No build isolation: the venv already holds the build backend, so a rebuild downloads nothing
# and reuses build/python (incremental).
python-build: python-deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(VENV)/bin/python -m pip install --no-build-isolation \
	    --no-deps -q -Cbuild-dir=build/python .

python-test: python-build
	$(VENV)/bin/python -m pytest python/tests -q

clean:
	rm -rf build

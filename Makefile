# Front-end over CMake. `make demo` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PRESET ?= release
BUILD := build/$(PRESET)
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 300

# The Python extension (_qkv) is built in the same CMake tree as the library, with
# the .venv's Python and nanobind (release and debug presets; docs/python.md).
PYTHON_EXT := $(if $(filter release debug,$(PRESET)),ON,OFF)
PYTHON_FLAGS := -DQKV_BUILD_PYTHON=$(PYTHON_EXT) $(if $(filter ON,$(PYTHON_EXT)),-DPython_EXECUTABLE=$(abspath $(PY)))

.PHONY: all deps venv configure build demo test test-cuda ctest python pytest asan fuzz fixtures fixtures-venv test-torch bench fresh-check clean

all: build

# Debian packages (apt, non-interactive; only what is missing).
deps:
	@scripts/install-deps.sh

# Python tools for the tests (numpy, pytest, safetensors) and the extension's
# build tools (nanobind, scikit-build-core) in .venv.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements-dev.txt | deps
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

configure: deps $(if $(filter ON,$(PYTHON_EXT)),venv)
	cmake --preset $(PRESET) $(PYTHON_FLAGS) >/dev/null

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/qkv demo

# GPU tests (label cuda) only where a GPU is: `make test-cuda` (docs/cuda.md).
ctest: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE cuda $(CTEST_ARGS)

test-cuda: build
	ctest --test-dir $(BUILD) --output-on-failure -L cuda

# Installs the qkv package into .venv from the tree `make build` made: scikit-build-core
# reconfigures $(BUILD), finds every target up to date (nothing is compiled again) and
# packs _qkv and python/qkv into the wheel that pip installs.
python: build venv
	$(PY) -m pip install --quiet --no-build-isolation --no-deps --force-reinstall \
	    -Cbuild-dir=$(BUILD) .

pytest: python
	QKV_CLI=$(abspath $(BUILD))/bin/qkv $(PY) -m pytest -q tests/python --ignore=tests/python/test_qkv_torch.py -m "not cuda"

test: ctest pytest

# The whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer, but for the two
# tests that make a real std::bad_alloc from a terabyte-sized `new`: ASan's operator new
# reports out of memory and aborts instead of throwing (allocator_may_return_null does not
# change that for non-nothrow new), so they cannot run under it (docs/testing.md).
# (The ctest avx2.machine, one test running all of qkv_tests, leaves the same two out under ASan: CMakeLists.txt.)
ASAN_UNRUNNABLE = AttentionOutOfMemory.BadAllocOfTheReferenceIsNamedWhereItIsCaught|Size.BadAllocLeavingItsScopesIsNamedByTheInnermostOne
asan:
	$(MAKE) ctest PRESET=asan CTEST_ARGS="-E '$(ASAN_UNRUNNABLE)'"

# Every libFuzzer target (fuzz/*_fuzzer.cc) and the atheris harness over the Python API
# (fuzz/python/api_fuzzer.py, on an ASan + UBSan build of _qkv) for FUZZ_SECONDS each, from
# the committed corpora. Only the targets are built: the stubs step cannot import a sanitized _qkv.
FUZZ_TARGETS = $(notdir $(basename $(wildcard fuzz/*_fuzzer.cc)))
fuzz: deps venv
	$(PY) -m pip install --quiet -r fuzz/requirements.txt
	cmake --preset fuzz -DQKV_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	cmake --build build/fuzz -j $(JOBS) --target $(FUZZ_TARGETS) _qkv
	FUZZ_PYTHON=$(abspath $(PY)) scripts/fuzz.sh build/fuzz $(FUZZ_SECONDS)

# Regenerates the framework-made fixtures under tests/fixtures and the fuzz seed corpora (needs PyPI; CI does not run this).
fixtures: build fixtures-venv
	.venv-fixtures/bin/python tests/attention/make_sdpa_fixtures.py tests/fixtures/sdpa
	.venv-fixtures/bin/python tests/attention/make_sdpa_nonfinite_fixtures.py tests/fixtures/sdpa_nonfinite
	.venv-fixtures/bin/python tests/attention/make_sdpa_grad_fixtures.py tests/fixtures/sdpa_grad
	.venv-fixtures/bin/python tests/attention/make_flex_fixtures.py tests/fixtures/flex
	.venv-fixtures/bin/python tests/attention/make_lsh_fixtures.py tests/fixtures/lsh
	.venv-fixtures/bin/python tests/attention/make_hf_sparse_fixtures.py tests/fixtures/hf_sparse
	.venv-fixtures/bin/python tests/attention/make_sdpa_half_fixtures.py tests/fixtures/sdpa_half
	.venv-fixtures/bin/python tests/attention/make_gqa_fixtures.py tests/fixtures/gqa
	.venv-fixtures/bin/python tests/io/make_io_fixtures.py
	.venv-fixtures/bin/python tests/io/make_keras_tf_fixtures.py
	.venv-fixtures/bin/python tests/io/make_h5_outside_fixtures.py
	.venv-fixtures/bin/python tests/seed001/train_seed001.py
	KERAS_BACKEND=tensorflow .venv-fixtures/bin/python tests/seed001/train_seed001_history.py tests/fixtures/seed001_train
	KERAS_BACKEND=tensorflow .venv-fixtures/bin/python tests/seed001/continue_seed001.py tests/fixtures/seed001_train
	.venv-fixtures/bin/python tests/nn/make_torch_mha_fixtures.py tests/fixtures/mha_torch
	.venv-fixtures/bin/python tests/nn/make_torch_mha_grad_fixtures.py tests/fixtures/mha_grad
	.venv-fixtures/bin/python tests/python/make_torch_interop_fixtures.py tests/fixtures/torch_interop
	.venv-fixtures/bin/python tests/python/make_torch_nn_fixtures.py tests/fixtures/torch_interop
	.venv-fixtures/bin/python tests/nn/make_seed_fixtures.py tests/fixtures/mha_torch/seeds
	.venv-fixtures/bin/python tests/nn/make_seed_grad_fixtures.py tests/fixtures/seed_grad
	KERAS_BACKEND=jax .venv-fixtures/bin/python tests/nn/make_keras_mha_fixtures.py tests/fixtures/mha_keras
	KERAS_BACKEND=jax .venv-fixtures/bin/python tests/nn/make_keras_mha_grad_fixtures.py tests/fixtures/mha_keras_grad
	KERAS_BACKEND=jax .venv-fixtures/bin/python tests/nn/make_optim_fixtures.py tests/fixtures/optim
	KERAS_BACKEND=jax .venv-fixtures/bin/python tests/nn/make_keras_attention_fixtures.py tests/fixtures/keras_attention
	.venv-fixtures/bin/python tests/io/check_writers_with_tf.py $(BUILD)/bin/qkv --update

# qkv.torch's tests (tests/python/test_qkv_torch.py) need torch, which .venv does not carry
# (the CPU wheel's index is not reachable from CI, PyPI's wheel brings 2.5 GB of CUDA), so
# `make pytest` leaves that file out and this target runs it in the fixtures venv against this
# tree's build (_qkv is built for the same system Python). Not part of CI (docs/testing.md).
TORCH_STAGE := $(BUILD)/torch_stage
test-torch: build
	test -x .venv-fixtures/bin/python || $(MAKE) fixtures-venv
	rm -rf $(TORCH_STAGE) && mkdir -p $(TORCH_STAGE)/qkv
	cp python/qkv/*.py $(BUILD)/python/_qkv*.so $(TORCH_STAGE)/qkv/
	PYTHONPATH=$(abspath $(TORCH_STAGE)) .venv-fixtures/bin/python -m pytest -q -p no:cacheprovider tests/python/test_qkv_torch.py

fixtures-venv:
	python3 -m venv .venv-fixtures
	.venv-fixtures/bin/pip install --quiet -r tests/requirements-fixtures.txt

# `make demo` and `make test` of the committed HEAD in a fresh Debian 12 root
# (debootstrap, chroot; needs root; docs/testing.md "Fresh machine"). CI runs this.
# Warnings are errors there by default, as in CI (.ci/run): a warning that a plain local build
# lets through once failed CI after a green local fresh-check (QKV_WERROR=OFF to relax it).
fresh-check:
	QKV_WERROR=$${QKV_WERROR:-ON} scripts/fresh-check.sh

bench: build
	@for b in $(BUILD)/*_bench; do echo "== $$b"; $$b --benchmark_min_time=0.2; done

clean:
	rm -rf build

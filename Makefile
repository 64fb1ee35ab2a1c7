# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hf_tpu-installed
PYTEST_ARGS ?=

.PHONY: install native test test-python-path test-latest soak test-unit test-multichip test-upstream constraints test-all demo opinfo opinfo-modes bench bench-eager bench-modes bench-load bench-generate bench-first-call bench-sharding bench-diffusers bench-dist lint format fuzz-long

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch lies on disk; install it first so the range below pulls nothing else
	$(PY) -m pip install --quiet torch==2.13.0
	# constraints.txt pins every dependency to the versions CI tests (make test-upstream tries newer ones)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,dev]"
	touch $(STAMP)

# the C++ extension (pinned memory, tpu generators, events); without a compiler hf_tpu runs its
# pure-Python path (build.py says so and exits 0). A no-op when the library matches its source and torch.
native: $(STAMP)
	$(PY) hf_tpu/runtime/native/build.py

install: $(STAMP) native

# one device for the suite; the multi-chip tests in a process of their own with 8 forced host devices
MULTICHIP_FLAGS := --xla_force_host_platform_device_count=8

# the tests whose behaviour depends on the C++ extension, again on the pure-Python path
PYTHON_PATH_TESTS := tests/runtime/test_native.py tests/runtime/test_lazy.py tests/runtime/test_native_recording.py tests/runtime/test_pinned.py tests/runtime/test_rng.py \
	tests/runtime/test_graph_inputs.py \
	tests/runtime/test_host_copies.py tests/runtime/test_device.py tests/runtime/test_storage_resize.py \
	tests/integrations/test_generate_paths.py::test_watermarked_generate_matches_cpu \
	tests/integrations/test_generate_paths.py::test_synthid_watermark_processor_matches_cpu \
	tests/integrations/test_diffusers_bad_input.py::test_a_generator_made_for_tpu_draws_cpus_numbers

# --durations: the slowest tests in every CI log, to keep the run short
test: install
	$(PY) -m pytest -q --durations=30 $(PYTEST_ARGS)
	HF_TPU_NATIVE=0 $(PY) -m pytest -q -p no:cacheprovider $(PYTHON_PATH_TESTS) $(PYTEST_ARGS)
	XLA_FLAGS=$(MULTICHIP_FLAGS) $(PY) -m pytest -q tests/multichip $(PYTEST_ARGS)

# the whole suite on the pure-Python path (no C++ extension)
test-python-path: install
	HF_TPU_NATIVE=0 $(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-multichip: install
	XLA_FLAGS=$(MULTICHIP_FLAGS) $(PY) -m pytest -q tests/multichip $(PYTEST_ARGS)

# the newest transformers/diffusers/accelerate releases, on purpose, in a venv of their own
UPSTREAM_VENV ?= .venv-upstream
test-upstream:
	test -x $(UPSTREAM_VENV)/bin/python || $(PYTHON) -m venv $(UPSTREAM_VENV)
	$(UPSTREAM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(UPSTREAM_VENV)/bin/python -m pip install --quiet -e ".[test]"
	$(UPSTREAM_VENV)/bin/python -m pip install --quiet --upgrade transformers diffusers accelerate safetensors huggingface_hub
	$(UPSTREAM_VENV)/bin/python hf_tpu/runtime/native/build.py
	$(UPSTREAM_VENV)/bin/python -m pip list 2>/dev/null | grep -iE "^(transformers|diffusers|accelerate) "
	$(UPSTREAM_VENV)/bin/python -m pytest -q tests/integrations $(PYTEST_ARGS)

test-latest: test-upstream

# 1,000-step training loops (Strict and DeferAndFuse) with flat device memory and host RSS, threads loading models
soak: install
	$(PY) -m pytest -q -m "slow or not slow" tests/soak $(PYTEST_ARGS)

# after an upgrade that passes `make test`: pin what is installed
constraints: install
	{ sed -n '1,3p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^torch=='; echo 'torch==2.13.0'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

test-all: install
	$(PY) -m pytest -q -m "slow or not slow" $(PYTEST_ARGS)
	XLA_FLAGS=$(MULTICHIP_FLAGS) $(PY) -m pytest -q -m "slow or not slow" tests/multichip $(PYTEST_ARGS)

demo: install
	$(PY) -m compat nightly --sample smoke --device tpu

opinfo: install
	$(PY) -m tests.opinfo_report --out reports/opinfo

# the whole op_db under DeferAndFuse and inside torch.compile(backend="tpu"): float32, first 4 samples
opinfo-modes: install
	$(PY) -m tests.opinfo_report --mode defer_and_fuse --dtypes float32 --max-samples 4 --out reports/opinfo-defer_and_fuse
	$(PY) -m tests.opinfo_report --mode compiled --dtypes float32 --max-samples 4 --out reports/opinfo-compiled

bench-eager: install
	$(PY) benchmarks/bench_eager.py --out reports/bench

bench-modes: install
	$(PY) benchmarks/bench_modes.py --out reports/bench

# the C++ kernels' Strict and DeferAndFuse fast paths on and off in one process, against torch eager
bench-native: install
	$(PY) benchmarks/bench_native.py --out reports/bench

bench-first-call: install
	$(PY) benchmarks/bench_first_call.py --out reports/bench

bench-load: install
	$(PY) benchmarks/bench_load.py --out reports/bench

bench-generate: install
	$(PY) benchmarks/bench_generate.py --out reports/bench

# 1 vs 2 vs 8 forced host chips, each in its own process (the script sets XLA_FLAGS per case)
bench-sharding: install
	$(PY) benchmarks/bench_sharding.py --out reports/bench

bench-diffusers: install
	$(PY) benchmarks/bench_diffusers.py --out reports/bench

# tpu_dist all_reduce/all_gather bus bandwidth vs gloo on CPU tensors, 2 and 4 ranks, in one run
bench-dist: install
	$(PY) benchmarks/bench_dist.py --out reports/bench

bench: bench-eager bench-modes bench-native bench-first-call bench-load bench-generate bench-sharding bench-diffusers

lint: install
	$(PY) -m ruff format --check hf_tpu compat tests benchmarks
	$(PY) -m ruff check hf_tpu compat tests benchmarks

format: install
	$(PY) -m ruff format hf_tpu compat tests benchmarks
	$(PY) -m ruff check --fix hf_tpu compat tests benchmarks

# the randomized programs of tests/fuzz with many more examples and fresh seeds (CI runs a fixed-seed budget);
# HF_TPU_FUZZ_SEED=<n> replays one run
FUZZ_EXAMPLES ?= 1000
fuzz-long: install
	HF_TPU_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider --timeout 0 tests/fuzz $(PYTEST_ARGS)

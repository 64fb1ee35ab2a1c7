# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hf_tpu-installed
PYTEST_ARGS ?=

.PHONY: install test test-all demo opinfo opinfo-modes bench bench-eager bench-modes bench-load bench-generate bench-first-call lint format

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch lies on disk; install it first so the range below pulls nothing else
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test,dev]"
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-all: install
	$(PY) -m pytest -q -m "slow or not slow" $(PYTEST_ARGS)

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

bench-first-call: install
	$(PY) benchmarks/bench_first_call.py --out reports/bench

bench-load: install
	$(PY) benchmarks/bench_load.py --out reports/bench

bench-generate: install
	$(PY) benchmarks/bench_generate.py --out reports/bench

bench: bench-eager bench-modes bench-first-call bench-load bench-generate

lint: install
	$(PY) -m ruff format --check hf_tpu compat tests benchmarks
	$(PY) -m ruff check hf_tpu compat tests benchmarks

format: install
	$(PY) -m ruff format hf_tpu compat tests benchmarks
	$(PY) -m ruff check --fix hf_tpu compat tests benchmarks

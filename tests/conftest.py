"""Shared test setup: 8 forced host devices (multi-chip on CPU) unless the caller chose otherwise."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# No persistent XLA cache in the test process (tests/runtime/test_compilation_cache.py tests it in child
# processes with their own folders): with a cold folder, a serial run segfaulted inside JAX's executable
# serialization (compilation_cache.put_executable_and_time, test_rng's randperm), see the issue note
os.environ.setdefault("HF_TPU_COMPILATION_CACHE", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

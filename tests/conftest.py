"""Shared test setup: 8 forced host devices (multi-chip on CPU) unless the caller chose otherwise."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _unload_executables_between_modules():
    """A serial run compiles tens of thousands of programs: unload them between modules when the memory
    mappings passed half their budget, so the runtime's own unloading (hf_tpu/runtime/executables.py)
    never lands inside a test that counts recompiles."""
    yield
    from hf_tpu.runtime import executables, platform

    if platform.is_initialized():
        executables.unload_if_over(0.5)

"""Shared test setup: one device, offline Hub.

The multi-chip tests (`tests/multichip`) need 8 forced host devices, set before JAX starts, so they run in
a process of their own (`make test` runs `XLA_FLAGS=--xla_force_host_platform_device_count=8 pytest
tests/multichip` after the suite); a run without that flag leaves them out, saying so.
"""

import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402

MULTICHIP_DEVICES = 8
_MULTICHIP_DIR = Path(__file__).parent / "multichip"


def forced_host_devices() -> int:
    """The host-device count XLA_FLAGS forces in this process (1 when it forces none)."""
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else 1


def pytest_ignore_collect(collection_path, config):
    if forced_host_devices() == MULTICHIP_DEVICES:
        return None
    path = Path(collection_path)
    if path == _MULTICHIP_DIR or _MULTICHIP_DIR in path.parents:
        config._hf_tpu_multichip_skipped = True
        return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if getattr(config, "_hf_tpu_multichip_skipped", False):
        terminalreporter.write_line(
            f"tests/multichip left out: they need XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{MULTICHIP_DEVICES} in a process of their own (make test-multichip)"
        )


@pytest.fixture(autouse=True, scope="module")
def _unload_executables_between_modules():
    """A serial run compiles tens of thousands of programs: unload them between modules when the memory
    mappings passed half their budget, so the runtime's own unloading (hf_tpu/runtime/buffers/executables.py)
    never lands inside a test that counts recompiles."""
    yield
    from hf_tpu.runtime.buffers import executables, platform

    if platform.is_initialized():
        executables.unload_if_over(0.5)

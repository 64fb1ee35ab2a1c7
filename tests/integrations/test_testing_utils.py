"""TRANSFORMERS_TEST_DEVICE=tpu: transformers.testing_utils picks tpu and its backend tables work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = """
import torch
from transformers import testing_utils as tu

assert tu.torch_device == "tpu", tu.torch_device
tu.backend_manual_seed(tu.torch_device, 123)
a = torch.randn(4, device="tpu").cpu()
tu.backend_manual_seed(tu.torch_device, 123)
b = torch.randn(4, device="tpu").cpu()
assert torch.equal(a, b), "manual_seed does not seed the tpu generator"

x = torch.ones(256, 256, device="tpu") * 2
tu.backend_synchronize(tu.torch_device)
assert tu.backend_device_count(tu.torch_device) == 1  # one logical device
assert tu.backend_memory_allocated(tu.torch_device) >= 256 * 256 * 4
tu.backend_reset_peak_memory_stats(tu.torch_device)
peak = tu.backend_max_memory_allocated(tu.torch_device)
del x
tu.backend_empty_cache(tu.torch_device)
assert tu.backend_memory_allocated(tu.torch_device) < peak
assert tu.backend_torch_accelerator_module(tu.torch_device) is torch.tpu
print("OK")
"""


def test_transformers_testing_utils_with_tpu():
    env = {**os.environ, "TRANSFORMERS_TEST_DEVICE": "tpu"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stderr[-3000:]

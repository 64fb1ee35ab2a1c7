"""FlexAttention in eager mode on tpu: `torch.nn.attention.flex_attention` refuses every device outside
a fixed list (cuda, cpu, xpu, hpu, mps) before it runs, although its eager path is plain tensor math that
our lowerings run (forward and backward match the CPU's masked SDPA). That check alone made diffusers'
`set_attention_backend("flex")` (and any eager `flex_attention` call) fail on tpu; we let tpu through
and leave every other device to PyTorch's own check.
"""

from __future__ import annotations

import functools
from types import ModuleType

from hf_tpu.integrations.patching import patch


def allow_tpu(module: ModuleType) -> None:
    """`_validate_device` lets tpu through; every other device keeps PyTorch's own check."""

    def make(original):
        @functools.wraps(original)
        def _validate_device(query, key, value):
            if query.device.type == "tpu":
                return None
            return original(query, key, value)

        return _validate_device

    patch(module, "_validate_device", make)

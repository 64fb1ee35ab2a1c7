"""FlexAttention in eager mode on tpu: `torch.nn.attention.flex_attention` refuses every device outside
a fixed list (cuda, cpu, xpu, hpu, mps) before it runs, although its eager path is plain tensor math that
our lowerings run (forward and backward match the CPU's masked SDPA). That check alone made diffusers'
`set_attention_backend("flex")` (and any eager `flex_attention` call) fail on tpu; we let tpu through
and leave every other device to PyTorch's own check.
"""

from __future__ import annotations

import functools
from types import ModuleType


def allow_tpu(module: ModuleType) -> None:
    original = getattr(module, "_validate_device", None)
    if original is None or getattr(original, "__hf_tpu__", False):
        return

    @functools.wraps(original)
    def _validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return original(query, key, value)

    _validate_device.__hf_tpu__ = True
    module._validate_device = _validate_device

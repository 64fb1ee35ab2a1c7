"""Device-side assertions (`torch._assert_async`): what `F.one_hot`, `torch.multinomial` checks and
traced graphs emit to check a value without a host sync.

On CUDA they fail later, asynchronously. hf_tpu follows its rule for value checks (arg_checks/values.py):
Strict and DeferAndFuse do not read values to check them, Debug mode does and raises CPU's error, and a
compiled graph cannot raise at all (an XLA program has no assert), so there the assertion is dropped,
as `_linalg_check_errors` is.
"""

from __future__ import annotations

import torch

from hf_tpu.runtime.launch import modes
from hf_tpu.runtime.lowerings.table import lowers


@lowers("aten::_assert_async", "aten::_assert_async.msg", kind="host")
def assert_async(condition: torch.Tensor, assert_msg: str | None = None) -> None:
    if not modes.launch_blocking():
        return None
    cpu = condition.detach().cpu()  # Debug mode: read it, and fail as CPU does
    if assert_msg is None:
        torch._assert_async(cpu)
    else:
        torch._assert_async(cpu, assert_msg)
    return None


@lowers("aten::_assert_async", "aten::_assert_async.msg", graph=True)
def assert_async_in_graph(condition, assert_msg=None):
    return None


@lowers("aten::_functional_assert_async.msg", graph=True)
def functional_assert_async_in_graph(condition, assert_msg, dep_token):
    return dep_token

"""`constrain(tensor, spec)`: a layout for an intermediate tensor that holds inside compiled graphs too.

`hf_tpu.shard` runs in the runtime, which TorchDynamo never traces: inside `torch.compile` it would break
the graph. This is a custom op, `hf_tpu::sharding_constraint`, that Dynamo keeps in the graph and the `tpu`
backend lowers to `jax.lax.with_sharding_constraint` (GSPMD then moves the data, e.g. the all-to-all of
Ulysses attention); run eagerly it returns a new tensor laid out by `spec`. A spec entry "*" leaves that dim
as GSPMD likes it (PartitionSpec.UNCONSTRAINED; eagerly: as it is), "" keeps it whole, else axis names
joined by ","; the op takes the entries joined by "|" (custom ops take no list of strings). Its gradient is
the incoming gradient unchanged (a layout changes no value).
"""

from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_defined: list = []


def _entries(spec: str, current: tuple | None = None) -> tuple:
    out = []
    for i, entry in enumerate(spec.split("|")):
        if entry == "*":
            out.append(current[i] if current is not None else _unconstrained())
        elif entry == "":
            out.append(None)
        else:
            names = tuple(entry.split(","))
            out.append(names[0] if len(names) == 1 else names)
    return tuple(out)


def _unconstrained():
    from jax.sharding import PartitionSpec

    return PartitionSpec.UNCONSTRAINED


def _lower(x, spec):
    """Graph lowering: the constraint on the current mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from hf_tpu.runtime.buffers import placement

    sharding = NamedSharding(placement.mesh(), PartitionSpec(*_entries(spec)))
    return jax.lax.with_sharding_constraint(x, sharding)


def define():
    """Define the op and its graph lowering (once); returns the op."""
    with _lock:
        if _defined:
            return _defined[0]

        @torch.library.custom_op("hf_tpu::sharding_constraint", mutates_args=())
        def sharding_constraint(x: torch.Tensor, spec: str) -> torch.Tensor:
            from hf_tpu.runtime.tensors.sharding import shard, sharding

            out = x.clone()
            if out.device.type != "tpu":
                return out
            return shard(out, _entries(spec, sharding(x)))

        @sharding_constraint.register_fake
        def _(x, spec):
            return torch.empty_like(x)

        # a layout changes no value: the gradient passes through as it is (training with context parallel)
        sharding_constraint.register_autograd(lambda ctx, grad: (grad, None))

        from hf_tpu.runtime.lowerings.table import lowers

        lowers("hf_tpu::sharding_constraint.default", graph=True)(_lower)
        _defined.append(torch.ops.hf_tpu.sharding_constraint.default)
        return _defined[0]


def constrain(tensor: torch.Tensor, spec: list[str]) -> torch.Tensor:
    """`tensor` laid out by `spec` (entries, see the module docstring), eagerly or inside a compiled graph."""
    return define()(tensor, "|".join(spec))

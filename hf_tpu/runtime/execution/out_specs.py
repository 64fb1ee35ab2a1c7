"""What an op returns, as PyTorch says: each cache entry asks the op's meta kernel once for its outputs'
shapes, dtypes and memory layout (`out_spec`, `out_layout`), and results are cast/broadcast/transposed to
match (`cast_like`, `lay_out`, `fit_fn`). Shared by the eager kernels and the compiled graphs."""

from __future__ import annotations

import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import convert, to_jax_dtype
from hf_tpu.runtime.execution.signature import GENERATOR, Signature
from hf_tpu.runtime.tensors.strided import memory_order

META = torch.device("meta")


def meta_of(value):
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and value.dim() == 0:
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=META)
    if isinstance(value, list | tuple):
        return type(value)(meta_of(v) for v in value)
    if isinstance(value, torch.device):
        return META
    return value


def out_spec(result):
    """(shape, dtype) per output tensor of a meta run, None where unknown."""
    if isinstance(result, torch.Tensor):
        return (tuple(result.shape), result.dtype)
    if isinstance(result, list | tuple):
        return tuple(out_spec(r) for r in result)
    return None


def out_layout(result):
    """How PyTorch lays out the outputs of a meta run: per output, its memory order where that is a dense
    permutation other than row-major (`strided.memory_order`: `(x.t() * 2)` keeps the transposed layout,
    as TensorIterator does), else None; None when every output is row-major (the common case)."""
    if isinstance(result, torch.Tensor):
        return memory_order(tuple(result.shape), result.stride()) if result.dim() > 1 else None
    if isinstance(result, list | tuple):
        orders = tuple(out_layout(r) if isinstance(r, torch.Tensor) else None for r in result)
        return orders if any(o is not None for o in orders) else None
    return None


UNKNOWN = object()  # a meta run that could not say


def meta_call(op, sig: Signature, full: list):
    """PyTorch's meta kernel's result for `op`; UNKNOWN where it cannot say (data-dependent etc.)."""
    pos, kw = sig.split([meta_of(v) if k != GENERATOR else None for v, k in zip(full, sig.kinds)])
    if "device" in kw and kw["device"] is not None:
        kw["device"] = META
    try:
        return op(*pos, **kw)
    except (NotImplementedError, torch._subclasses.fake_tensor.DataDependentOutputException):
        return UNKNOWN
    # a meta kernel that breaks on optional arguments (_thnn_fused_lstm_cell's on no bias)
    except (AttributeError, TypeError):
        return UNKNOWN
    except RuntimeError as exc:
        text = str(exc)
        if "meta" in text.lower() and ("not implemented" in text.lower() or "could not run" in text.lower()):
            return UNKNOWN
        if "data-dependent" in text or "Cannot copy out of meta tensor" in text:
            return UNKNOWN
        raise


def meta_run(op, sig: Signature, full: list):
    """Ask PyTorch's meta kernel what `op` returns (`out_spec`); None where it cannot say."""
    result = meta_call(op, sig, full)
    return None if result is UNKNOWN else out_spec(result)


class LaidOut(tuple):
    """The spec of a functional kernel whose outputs PyTorch lays out permuted: (the `out_spec`, the
    `out_layout`). Its executable returns such an output transposed into memory order, and the output
    tensor is that buffer permuted back (`wrap_laid_out`), so its strides are PyTorch's. Item 1 is no
    dtype, so the common case's check in `_wrap` stays one test."""

    __slots__ = ()


def lay_out(jnp, result, layout):
    """The executable's results with each laid-out output transposed into its memory order (an output the
    op did not compute, a backward's masked-out gradient, stays None whatever its meta layout)."""
    if type(layout[0]) is int:  # one output
        return jnp.transpose(result, layout)
    return type(result)(r if o is None or r is None else jnp.transpose(r, o) for r, o in zip(result, layout))


def cast_like(jnp, result, spec):
    if spec is None:
        return result
    if isinstance(result, list | tuple):
        return type(result)(cast_like(jnp, r, s) for r, s in zip(result, spec))
    if not hasattr(result, "dtype"):  # a Python value among graph outputs
        return result
    shape, dtype = spec
    jdt = to_jax_dtype(dtype)
    if result.dtype != jdt:
        result = convert(result, jdt)
    if shape is not None and tuple(result.shape) != shape:
        result = jnp.broadcast_to(result, shape) if result.size != prod(shape) else result.reshape(shape)
    return result


_fit_cache: dict = {}


def fit_fn(shape: tuple, jdt):
    """A jitted cast + broadcast to (shape, dtype): how results are stored into a destination."""
    fn = _fit_cache.get((shape, jdt))
    if fn is None:
        jax = platform.jax()
        fn = _fit_cache[(shape, jdt)] = jax.jit(lambda x: jax.numpy.broadcast_to(x.astype(jdt), shape))
    return fn


def prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n

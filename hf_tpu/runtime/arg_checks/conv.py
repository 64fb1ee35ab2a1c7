"""CPU's convolution argument checks, run before the meta kernel and the JAX lowering.

`aten::convolution` (what `F.conv*d` and `F.conv_transpose*d` reach on tpu) and `aten::_convolution`
check their arguments in `at::_convolution`: the parameter lists' lengths, then `check_shape_forward`
(negative padding, non-positive stride, weight rank, groups, channels, bias, kernel vs padded input).
The meta kernel skips most of these: negative padding computed a result, a zero stride raised
ZeroDivisionError and a 3-D weight for a 4-D input IndexError. CPU then picks a backend (oneDNN or its
own "slow" kernels) whose checks word some errors differently (mixed dtypes, a zero dilation, transposed
output padding); `_cpu_backend` makes the same choice so the message is CPU's on this machine.

One-dimensional convolutions are run by CPU as two-dimensional ones with a leading unit dimension;
backend messages show those 2-D sizes, and so do ours.
"""

from __future__ import annotations

import functools

import torch

from hf_tpu.runtime.arg_checks import checks
from hf_tpu.runtime.arg_checks.dtypes import expected_scalar_type, not_implemented, tensor_type_name


def _sizes(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _expand(name: str, values, dim: int) -> list:
    """One value per spatial dimension (`expand_param_if_needed`)."""
    if len(values) == 1:
        return [values[0]] * dim
    if len(values) != dim:
        raise RuntimeError(
            f"expected {name} to be a single integer value or a list of {dim} values to match the "
            f"convolution dimensions, but got {name}={_sizes(values)}"
        )
    return list(values)


# argument signatures already found valid: the checks below cost a few microseconds in Python, a lookup
# ~0.5 us, and a model calls each convolution with the same signature every step
_VALID: set = set()
_MAX_VALID = 4096


@checks("aten::convolution", "aten::_convolution")
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_):
    key = (
        input.shape,
        weight.shape,
        input.dtype,
        weight.dtype,
        None if bias is None else (bias.shape, bias.dtype),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        transposed,
        tuple(output_padding),
        groups,
    )
    if key in _VALID:
        return
    _check_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if len(_VALID) >= _MAX_VALID:
        _VALID.clear()
    _VALID.add(key)


def _check_convolution(
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
) -> None:
    """`at::_convolution`'s checks in its order, then those of the backend CPU would pick."""
    dim = weight.dim() - 2
    if dim <= 0:
        raise RuntimeError("weight should have at least three dimensions")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    stride = _expand("stride", stride, dim)
    padding = _expand("padding", padding, dim)
    dilation = _expand("dilation", dilation, dim)
    output_padding = _expand("output_padding", output_padding, dim)
    _check_shape_forward(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    shape = tuple(input.shape)
    if shape[0] == 0 or shape[1] == 0:
        return  # CPU's "empty" backend returns an empty result without further checks
    if dim == 1:  # the backends run 1-d convolutions as 2-d ones
        shape = (shape[0], shape[1], 1, shape[2])
        stride, padding, dilation, output_padding = (
            [1, *stride],
            [0, *padding],
            [1, *dilation],
            [0, *output_padding],
        )
    if 0 in shape:
        raise RuntimeError(
            f"Only zero batch or zero channel inputs are supported, but got input shape: {_sizes(shape)}"
        )
    dtype = input.dtype
    if (
        weight.dtype is dtype
        and (bias is None or bias.dtype is dtype)
        and dtype is not torch.bool
        and not transposed
        and 0 not in dilation
    ):
        return  # the common case: nothing the backends check can fail
    _check_backend(input, weight, bias, shape, stride, padding, dilation, transposed, output_padding, groups)


def _check_shape_forward(
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
) -> None:
    """CPU's `check_shape_forward`, in its order."""
    if min(padding) < 0:
        raise RuntimeError("negative padding is not supported")
    if min(output_padding) < 0:
        raise RuntimeError("negative output_padding is not supported")
    if min(stride) <= 0:
        raise RuntimeError("non-positive stride is not supported")
    if min(dilation) < 0:
        raise RuntimeError("dilation should be greater than zero")
    wshape = tuple(weight.shape)
    k = input.dim()
    if len(wshape) != k:
        raise RuntimeError(
            f"Expected {len(wshape)}-dimensional input for {len(wshape)}-dimensional weight {_sizes(wshape)}, "
            f"but got {k}-dimensional input of size {_sizes(input.shape)} instead"
        )
    if wshape[0] < groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got weight "
            f"of size {_sizes(wshape)} instead"
        )
    if wshape[0] % groups != 0:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got weight "
            f"of size [{_sizes(wshape)}] instead"
        )
    channels = input.shape[1]
    if transposed:
        _check_transposed_shapes(input, bias, wshape, channels, groups)
        return
    if channels != wshape[1] * groups:
        raise RuntimeError(
            f"Given groups={groups}, weight of size {_sizes(wshape)}, expected input{_sizes(input.shape)} to have "
            f"{wshape[1] * groups} channels, but got {channels} channels instead"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != wshape[0]):
        raise RuntimeError(
            f"Given weight of size {_sizes(wshape)}, expected bias to be 1-dimensional with {wshape[0]} elements, "
            f"but got bias of size {_sizes(bias.shape)} instead"
        )
    padded = [s + 2 * p for s, p in zip(input.shape[2:], padding)]
    kernel = [d * (w - 1) + 1 for d, w in zip(dilation, wshape[2:])]
    if any(p < w for p, w in zip(padded, kernel)):
        raise RuntimeError(
            f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
            f"({' x '.join(map(str, kernel))}). Kernel size can't be greater than actual input size"
        )


def _check_transposed_shapes(input, bias, wshape, channels, groups) -> None:
    if channels != wshape[0]:
        raise RuntimeError(
            f"Given transposed=1, weight of size {_sizes(wshape)}, expected input{_sizes(input.shape)} to have "
            f"{wshape[0]} channels, but got {channels} channels instead"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != wshape[1] * groups):
        raise RuntimeError(
            f"Given transposed=1, weight of size {_sizes(wshape)}, expected bias to be 1-dimensional with "
            f"{wshape[1] * groups} elements, but got bias of size {_sizes(bias.shape)} instead"
        )


# -- the backend CPU would run, and its checks ------------------------------------------------------------
@functools.cache
def _onednn_takes(dtype: torch.dtype) -> bool:
    """Does CPU's oneDNN run convolutions of a bf16/f16 input on this machine?"""
    if dtype is torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def _cpu_backend(input, weight, shape, stride, dilation, transposed, output_padding, groups) -> str:
    """ "onednn" or "slow": the choice of CPU's `_select_conv_backend` (`ConvParams::use_mkldnn`)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return "slow"
    if transposed and any(o >= s for o, s in zip(output_padding, stride)):
        return "slow"
    if input.dtype is torch.bfloat16 or input.dtype is torch.float16:
        return "onednn" if _onednn_takes(input.dtype) else "slow"
    if input.dtype is not torch.float32:
        return "slow"
    kw, kh = weight.shape[-1], (weight.shape[-2] if weight.dim() > 3 else 1)
    n, c, h, w = shape[:4]
    worth = any(s != 1 for s in stride) or any(d != 1 for d in dilation) or n >= 16 or kw != 1 or kh != 1
    worth = worth or torch.get_num_threads() > 1
    big = groups > 1 or (kw > 3 and kh > 3) or n > 1 or n * c * h * w > 20480
    return "onednn" if worth and big else "slow"


def _check_backend(input, weight, bias, shape, stride, padding, dilation, transposed, output_padding, groups):
    backend = _cpu_backend(input, weight, shape, stride, dilation, transposed, output_padding, groups)
    if backend == "onednn":
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and p.dtype != input.dtype:
                raise RuntimeError(
                    f"Input type ({tensor_type_name(input.dtype)}) and {name} type ({tensor_type_name(p.dtype)}) "
                    f"should be the same or input should be a MKLDNN tensor and {name} is a dense tensor"
                )
        if 0 in dilation:
            raise RuntimeError("non-positive dilation is not supported")
        return
    if transposed:
        _check_slow_transposed(shape, weight, stride, padding, dilation, output_padding)
    elif 0 in dilation:
        raise RuntimeError(f"dilation should be greater than zero, but got {_sizes(dilation)}")
    if input.dtype is torch.bool:
        raise not_implemented(_slow_kernel(len(shape), dilation, transposed), torch.bool)
    if weight.dtype != input.dtype:
        raise expected_scalar_type(input.dtype, weight.dtype)


def _slow_kernel(rank: int, dilation, transposed: bool) -> str:
    """The name CPU's slow convolution kernel gives in its "not implemented for" error."""
    if transposed:
        return f"slow_conv_transpose{rank - 2}d_out_cpu"
    if any(d != 1 for d in dilation):
        return "slow_conv_dilated<>"
    return "compute_columns3d" if rank == 5 else "slow_conv2d_cpu"


_AXES = {2: ("height", "width"), 3: ("depth", "height", "width")}


def _check_slow_transposed(shape, weight, stride, padding, dilation, output_padding) -> None:
    """`slow_conv_transpose{2,3}d_shape_check`: dilation, output padding, output size."""
    axes = _AXES[len(stride)]
    if 0 in dilation:
        got = ", ".join(f"dilation_{a}: {d}" for a, d in zip(axes, dilation))
        raise RuntimeError(f"dilation should be greater than zero, but got {got}")
    if any(o >= s and o >= d for o, s, d in zip(output_padding, stride, dilation)):
        got = " ".join(
            f"{name}_{a}: {v}"
            for name, values in (
                ("output_padding", output_padding),
                ("stride", stride),
                ("dilation", dilation),
            )
            for a, v in zip(axes, values)
        )
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got {got}")
    kernel = weight.shape[2:] if weight.dim() == len(shape) else (1, *weight.shape[2:])
    sizes = shape[2:]
    out = [
        (i - 1) * s - 2 * p + (d * (k - 1) + 1) + o
        for i, s, p, d, k, o in zip(sizes, stride, padding, dilation, kernel, output_padding)
    ]
    if any(o < 1 for o in out):
        raise RuntimeError(
            f"Given input size per channel: ({' x '.join(map(str, sizes))}). Calculated output size per channel: "
            f"({' x '.join(map(str, out))}). Output size is too small"
        )

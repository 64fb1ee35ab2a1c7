"""Convolutions (1D/2D/3D, strided, dilated, grouped, transposed), their backward, im2col/col2im.

Everything is one `jax.lax.conv_general_dilated`, written channels-last (PyTorch's channels-first operands
transposed around it: `_conv`). XLA:CPU rewrites a channels-first convolution into that form itself at the top
level of a program, but not inside a while loop's body, where the channels-first one runs as a naive loop
nest: 28x slower, measured on a 3x3 conv in `lax.fori_loop` (a compiled scan's or whole-loop pipeline's
denoiser). Written channels-last, it is the same program at the top level and the fast one in loops (it is
also Flax's layout, the one TPUs are tuned for). A transposed
convolution is the input-gradient of a regular one: dilate the input by the stride, pad by
`dilation * (k - 1) - padding` (plus `output_padding` at the end) and convolve with the spatially
flipped kernel whose in/out channels are swapped per group. Backward passes are the VJPs of these
forward functions, so they always agree with the forward math.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hf_tpu.runtime.lowerings.linalg import accumulation_type, operands, precision
from hf_tpu.runtime.lowerings.table import lowers

_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _conv(x, weight, **kwargs):
    """`conv_general_dilated` of channels-first `x` (N, C, *spatial) and `weight` (O, I, *k), computed
    channels-last (see the module docstring); the result is channels-first."""
    spatial = x.ndim - 2
    s = _SPATIAL[spatial]
    to_last = (0, *range(2, 2 + spatial), 1)
    y = jax.lax.conv_general_dilated(
        jnp.transpose(x, to_last),
        jnp.transpose(weight, (*range(2, 2 + spatial), 1, 0)),
        dimension_numbers=("N" + s + "C", s + "IO", "N" + s + "C"),
        **kwargs,
    )
    return jnp.transpose(y, (0, spatial + 1, *range(1, spatial + 1)))


def _transposed_kernel(weight, groups: int):
    """(C_in, C_out/g, *k) transposed-conv weight -> the (C_out, C_in/g, *k) regular kernel, flipped."""
    c_in, c_out_g, *k = weight.shape
    w = weight.reshape(groups, c_in // groups, c_out_g, *k)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_g, c_in // groups, *k)
    return jnp.flip(w, axis=tuple(range(2, 2 + len(k))))


def conv(x, weight, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's convolution without bias, in the accumulation dtype (f32 for half inputs)."""
    spatial = x.ndim - 2
    acc = accumulation_type(x.dtype)
    x, weight = operands(x, weight)
    if transposed:
        k = weight.shape[2:]
        w = _transposed_kernel(weight, groups)
        pads = [
            (d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding)
        ]
        return _conv(
            x,
            w,
            window_strides=(1,) * spatial,
            padding=pads,
            lhs_dilation=tuple(stride),
            rhs_dilation=tuple(dilation),
            feature_group_count=groups,
            precision=precision(),
            preferred_element_type=acc,
        )
    return _conv(
        x,
        weight,
        window_strides=tuple(stride),
        padding=[(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        feature_group_count=groups,
        precision=precision(),
        preferred_element_type=acc,
    )


def _expand(values, spatial: int) -> tuple:
    """PyTorch accepts a single value for every spatial dim (`stride=[2]` for a 2D conv)."""
    values = tuple(values)
    return values * spatial if len(values) == 1 else values


def _args(x, stride, padding, dilation, output_padding):
    n = x.ndim - 2
    return _expand(stride, n), _expand(padding, n), _expand(dilation, n), _expand(output_padding, n)


def _with_bias(out, bias):
    if bias is None:
        return out
    return out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))


@lowers("aten::convolution", "aten::_convolution", "aten::convolution_overrideable")
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_flags):
    """aten::convolution; also _convolution (whose benchmark/cudnn flags mean nothing here) and the
    PrivateUse1 hook convolution_overrideable, in case a caller enters below `convolution`."""
    unbatched = x.ndim == weight.ndim - 1
    if unbatched:
        x = x[None]
    stride, padding, dilation, output_padding = _args(x, stride, padding, dilation, output_padding)
    out = _with_bias(conv(x, weight, stride, padding, dilation, transposed, output_padding, groups), bias)
    return out[0] if unbatched else out


@lowers("aten::convolution_backward")
def convolution_backward(
    grad_output,
    x,
    weight,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    """Gradients w.r.t. input, weight and bias (None where output_mask says they are not needed)."""
    stride, padding, dilation, output_padding = _args(x, stride, padding, dilation, output_padding)

    def forward(inp, w):
        return conv(inp, w, stride, padding, dilation, transposed, output_padding, groups)

    out, vjp = jax.vjp(forward, x, weight)
    grad_input, grad_weight = vjp(grad_output.astype(out.dtype))
    grad_bias = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(grad_output, axis=axes, dtype=accumulation_type(grad_output.dtype))
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )


@lowers("aten::convolution_backward_overrideable")
def convolution_backward_overrideable(
    grad_output, x, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    return convolution_backward(
        grad_output,
        x,
        weight,
        None,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        output_mask,
    )


# -- im2col / col2im (nn.Unfold / nn.Fold) ------------------------------------------------------------
def _im2col(x, kernel_size, dilation, padding, stride):
    """(N, C, H, W) -> (N, C*kh*kw, L): the sliding blocks, channel-major as PyTorch orders them."""
    patches = jax.lax.conv_general_dilated_patches(
        x,
        filter_shape=tuple(kernel_size),
        window_strides=tuple(stride),
        padding=[(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jax.lax.Precision.HIGHEST,
    )
    n, ckk, *blocks = patches.shape
    return patches.reshape(n, ckk, math.prod(blocks))


@lowers("aten::im2col")
def im2col(x, kernel_size, dilation, padding, stride):
    unbatched = x.ndim == 3
    x = x[None] if unbatched else x
    cols = _im2col(x, kernel_size, dilation, padding, stride)
    return cols[0] if unbatched else cols


@lowers("aten::col2im")
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    """The adjoint of im2col: overlapping blocks are summed back into the image."""
    unbatched = cols.ndim == 2
    cols = cols[None] if unbatched else cols
    n, ckk, _ = cols.shape
    c = ckk // (kernel_size[0] * kernel_size[1])
    image = jnp.zeros((n, c, *output_size), cols.dtype)
    _, vjp = jax.vjp(lambda img: _im2col(img, kernel_size, dilation, padding, stride), image)
    (out,) = vjp(cols)
    return out[0] if unbatched else out

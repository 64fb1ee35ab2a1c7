"""Activation functions and the backward ops autograd calls for them, with PyTorch's formulas.

Everything is computed in opmath (float32 for bfloat16/float16 inputs) and rounded once, as PyTorch
CPU does. Backward ops take `self` (the forward input) or `result` (the forward output) exactly as
their schemas say; the formulas mirror PyTorch's CPU kernels so gradients match bit-for-bit where
possible (e.g. the tanh-approximated GELU derivative).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from hf_tpu.runtime.lowerings.comparisons import clamp_values, maximum
from hf_tpu.runtime.lowerings.elementwise import category, promote, to_float
from hf_tpu.runtime.lowerings.table import lowers

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_INV_SQRT_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_GELU_KAPPA = 0.044715


def _zero(x):
    return jnp.zeros_like(x)


# -- ReLU family ----------------------------------------------------------------------------------------
@lowers("aten::relu")
def relu(x):
    """max(x, 0), NaN-propagating (relu(nan) is nan)."""
    if x.dtype == jnp.bool_:
        raise RuntimeError("Boolean inputs not supported for relu")
    return maximum(x, 0)


@lowers("aten::threshold")
def threshold(x, threshold, value):
    x, threshold, value = promote(x, threshold, value)
    return jnp.where(x <= threshold, value, x)


@lowers("aten::threshold_backward")
def threshold_backward(grad_output, x, threshold):
    grad_output, x, threshold = promote(grad_output, x, threshold)
    return jnp.where(x <= threshold, _zero(grad_output), grad_output)


@lowers("aten::hardtanh")
def hardtanh(x, min_val=-1, max_val=1):
    return clamp_values(x, min_val, max_val)


@lowers("aten::hardtanh_backward")
def hardtanh_backward(grad_output, x, min_val, max_val):
    grad_output, x, min_val, max_val = promote(grad_output, x, min_val, max_val)
    return jnp.where((x <= min_val) | (x >= max_val), _zero(grad_output), grad_output)


@lowers("aten::leaky_relu")
def leaky_relu(x, negative_slope=0.01):
    x, negative_slope = promote(x, negative_slope)
    return jnp.where(x > 0, x, x * negative_slope)


@lowers("aten::leaky_relu_backward")
def leaky_relu_backward(grad_output, x, negative_slope, self_is_result):
    grad_output, x, negative_slope = promote(grad_output, x, negative_slope)
    return jnp.where(x > 0, grad_output, grad_output * negative_slope)


@lowers("aten::_prelu_kernel")
def prelu(x, weight):
    x, weight = promote(x, weight)
    return jnp.where(x > 0, x, weight * x)


@lowers("aten::_prelu_kernel_backward")
def prelu_backward(grad_output, x, weight):
    """(grad_input, grad_weight) at the broadcast shape; autograd sums grad_weight to weight's shape."""
    grad_output, x, weight = promote(grad_output, x, weight)
    positive = x > 0
    grad_input = jnp.where(positive, grad_output, weight * grad_output)
    grad_weight = jnp.where(positive, _zero(grad_output), x * grad_output)
    return grad_input, grad_weight


# -- smooth gates --------------------------------------------------------------------------------------
def _gelu(x, approximate: str):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + _GELU_KAPPA * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    # PyTorch's formula (1 + erf), not erfc(-x/sqrt2): XLA:CPU's erfc is ~7x slower than erf here, and
    # the cancellation erf has in the far negative tail is the one PyTorch's CPU kernel has too
    return x * 0.5 * (1 + lax.erf(x * _INV_SQRT_2))


@lowers("aten::gelu")
def gelu(x, approximate="none"):
    (x,) = to_float(x)
    return _gelu(x, approximate)


@lowers("aten::gelu_backward")
def gelu_backward(grad_output, x, approximate="none"):
    grad_output, x = to_float(grad_output, x)
    if approximate == "tanh":
        x_sq = x * x
        inner = _SQRT_2_OVER_PI * (x + _GELU_KAPPA * x_sq * x)
        tanh_inner = jnp.tanh(inner)
        left_derivative = 0.5 * (1 + tanh_inner)
        right_derivative = (
            0.5 * x * (1 - tanh_inner * tanh_inner) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_KAPPA * x_sq)
        )
        return grad_output * (left_derivative + right_derivative)
    cdf = 0.5 * (1 + lax.erf(x * _INV_SQRT_2))
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return grad_output * (cdf + x * pdf)


@lowers("aten::silu")
def silu(x):
    (x,) = to_float(x)
    return x / (1 + jnp.exp(-x))


def silu_backward(grad_output, x):
    grad_output, x = to_float(grad_output, x)
    s = 1 / (1 + jnp.exp(-x))
    return grad_output * s * (1 + x * (1 - s))


@lowers("aten::mish")
def mish(x):
    (x,) = to_float(x)
    return x * jnp.tanh(jax.nn.softplus(x))


def mish_backward(grad_output, x):
    grad_output, x = to_float(grad_output, x)
    s = 1 / (1 + jnp.exp(-x))
    tanh_softplus = jnp.tanh(jax.nn.softplus(x))
    return grad_output * (tanh_softplus + x * s * (1 - tanh_softplus * tanh_softplus))


@lowers("aten::sigmoid_backward")
def sigmoid_backward(grad_output, output):
    grad_output, output = promote(grad_output, output)
    if category(output.dtype) == 3:
        return grad_output * jnp.conj((1 - output) * output)
    return grad_output * (1 - output) * output


@lowers("aten::tanh_backward")
def tanh_backward(grad_output, output):
    grad_output, output = promote(grad_output, output)
    if category(output.dtype) == 3:
        return grad_output * jnp.conj(1 - output * output)
    return grad_output * (1 - output * output)


@lowers("aten::logit_backward")
def logit_backward(grad_output, x, eps=None):
    grad_output, x = to_float(grad_output, x)
    grad = grad_output / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, grad)
    return jnp.where((x < eps) | (x > 1 - eps), _zero(grad), grad)


# -- hard gates ----------------------------------------------------------------------------------------
def _relu6(x):
    return jnp.minimum(jnp.maximum(x, 0), 6)


@lowers("aten::hardsigmoid")
def hardsigmoid(x):
    (x,) = to_float(x)
    return _relu6(x + 3) / 6


@lowers("aten::hardsigmoid_backward")
def hardsigmoid_backward(grad_output, x):
    grad_output, x = to_float(grad_output, x)
    return jnp.where((x > -3) & (x < 3), grad_output / 6, _zero(grad_output))


@lowers("aten::hardswish")
def hardswish(x):
    (x,) = to_float(x)
    return x * _relu6(x + 3) / 6


@lowers("aten::hardswish_backward")
def hardswish_backward(grad_output, x):
    grad_output, x = to_float(grad_output, x)
    middle = grad_output * (x / 3 + 0.5)
    return jnp.where(x <= -3, _zero(grad_output), jnp.where(x < 3, middle, grad_output))


@lowers("aten::hardshrink")
def hardshrink(x, lambd=0.5):
    x, lambd = promote(x, lambd)
    return jnp.where((x >= -lambd) & (x <= lambd), _zero(x), x)


@lowers("aten::hardshrink_backward")
def hardshrink_backward(grad_out, x, lambd):
    grad_out, x, lambd = promote(grad_out, x, lambd)
    return jnp.where((x >= -lambd) & (x <= lambd), _zero(grad_out), grad_out)


@lowers("aten::softshrink")
def softshrink(x, lambd=0.5):
    x, lambd = promote(x, lambd)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))  # nan stays nan


@lowers("aten::softshrink_backward")
def softshrink_backward(grad_output, x, lambd):
    grad_output, x, lambd = promote(grad_output, x, lambd)
    return jnp.where((x >= -lambd) & (x <= lambd), _zero(grad_output), grad_output)


# -- exponential linear units, softplus, log-sigmoid ------------------------------------------------------
@lowers("aten::elu")
def elu(x, alpha=1, scale=1, input_scale=1):
    x, alpha, scale, input_scale = to_float(x, alpha, scale, input_scale)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * (alpha * scale))


@lowers("aten::elu_backward")
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    grad_output, alpha, scale, input_scale, y = to_float(
        grad_output, alpha, scale, input_scale, self_or_result
    )
    negcoef = alpha * scale
    if is_result:
        negative = grad_output * input_scale * (y + negcoef)
    else:
        negative = grad_output * input_scale * negcoef * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, grad_output * scale)


@lowers("aten::celu")
def celu(x, alpha=1.0):
    x, alpha = to_float(x, alpha)
    return jnp.where(x > 0, x, jnp.expm1(x / alpha) * alpha)


@lowers("aten::softplus")
def softplus(x, beta=1, threshold=20):
    x, beta, threshold = to_float(x, beta, threshold)
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lowers("aten::softplus_backward")
def softplus_backward(grad_output, x, beta, threshold):
    grad_output, x, beta, threshold = to_float(grad_output, x, beta, threshold)
    bx = x * beta
    z = jnp.exp(bx)
    return jnp.where(bx > threshold, grad_output, grad_output * z / (z + 1))


@lowers("aten::log_sigmoid_forward")
def log_sigmoid_forward(x):
    """(output, buffer): PyTorch CPU keeps exp(-|x|) in the buffer; the backward recomputes it anyway."""
    (x,) = to_float(x)
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(z), z


@lowers("aten::log_sigmoid_backward")
def log_sigmoid_backward(grad_output, x, buffer):
    grad_output, x = to_float(grad_output, x)
    negative = x < 0
    z = jnp.exp(-jnp.abs(x))
    max_deriv = negative.astype(x.dtype)
    sign = jnp.where(negative, 1, -1).astype(x.dtype)
    return grad_output * (max_deriv - sign * (z / (1 + z)))


# -- gated linear unit ---------------------------------------------------------------------------------
@lowers("aten::glu")
def glu(x, dim=-1):
    (x,) = to_float(x)
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lowers("aten::glu_backward")
def glu_backward(grad_output, x, dim):
    grad_output, x = to_float(grad_output, x)
    a, b = jnp.split(x, 2, axis=dim)
    s = jax.nn.sigmoid(b)
    grad_a = grad_output * s
    grad_b = grad_output * a * s * (1 - s)
    return jnp.concatenate([grad_a, grad_b], axis=dim)

"""Random ops drawn from the device PRNG (`hf_tpu.runtime.launch.rng`, seeded by `torch.manual_seed`).

Every lowering here is `random=True`: its first argument is a fresh `jax.random` key, so a seeded
program draws the same numbers on every run (not the same numbers as CPU PyTorch: the generators
differ). An op given a CPU `generator=` never reaches these functions: the dispatcher draws on CPU
with that generator and copies the result, so it equals CPU PyTorch exactly.

Transformations follow PyTorch's CPU kernels (ATen `TransformationHelper.h`): uniform floats carry
only as many random bits as the target dtype's mantissa holds, so `[from, to)` stays half-open even
in bfloat16; reduced-precision results are computed in float32 and rounded once.

The functional overloads (`uniform`, `random.from`, `bernoulli.p`, ...) are lowered; the dispatcher
derives their in-place forms (`uniform_`, `random_`, `bernoulli_`, ...). `normal_` has no
same-named functional overload (it is `normal_functional`), so it is wired up explicitly below.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hf_tpu.runtime.buffers.dtypes import to_jax_dtype, to_torch_dtype
from hf_tpu.runtime.lowerings.factories import as_torch_dtype
from hf_tpu.runtime.lowerings.table import TABLE, eager_kernel, lowers, resolve


# -- helpers -----------------------------------------------------------------------------------------
def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _is_complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _compute_dtype(dtype):
    """float64 stays float64; everything else (bf16, f16, f32, ints) is computed in float32."""
    if dtype == jnp.float64 or dtype == jnp.complex128:
        return jnp.float64
    return jnp.float32


def _digits(dtype) -> int:
    """Mantissa bits incl. the implicit one (std::numeric_limits<T>::digits)."""
    return int(jnp.finfo(dtype).nmant) + 1


def _uniform01(key, shape, dtype):
    """Uniform floats in [0, 1) on a grid of 2**-digits(dtype), like ATen's uniform_real.

    Each value is exactly representable in `dtype`, so rounding never reaches 1.0; the result is
    returned in the compute dtype (float32, or float64 for float64). Samplers that only transform
    or compare u (bernoulli, exponential, ...) pass the compute dtype: a bf16 grid (2**-8) would
    clip tails and small probabilities.
    """
    cdt = _compute_dtype(dtype)
    digits = _digits(dtype if _is_float(dtype) else cdt)
    if cdt == jnp.float64:
        bits = jax.random.bits(key, shape, jnp.uint64) & jnp.uint64((1 << digits) - 1)
    else:
        bits = jax.random.bits(key, shape, jnp.uint32) & jnp.uint32((1 << digits) - 1)
    return bits.astype(cdt) * cdt(2.0**-digits)


def _standard_normal(key, shape, dtype):
    cdt = _compute_dtype(dtype)
    if _is_complex(dtype):  # real and imaginary parts each N(0, 1/2), as PyTorch does
        parts = jax.random.normal(key, tuple(shape) + (2,), cdt) * cdt(math.sqrt(0.5))
        return jax.lax.complex(parts[..., 0], parts[..., 1])
    return jax.random.normal(key, shape, cdt)


def _check_generator_free(generator) -> None:
    # A CPU generator is handled by the dispatcher before tracing; anything else reaching a lowering
    # would be a core bug, so say so instead of silently ignoring it.
    if generator is not None:
        raise RuntimeError("hf_tpu: a generator reached a device random lowering (dispatcher bug)")


# -- normal ------------------------------------------------------------------------------------------
@lowers("aten::normal_functional", random=True)
def normal_functional(key, x, mean=0.0, std=1.0, generator=None):
    """x.normal_(mean, std) without the write: mean + std * N(0, 1) in x's shape."""
    _check_generator_free(generator)
    return mean + std * _standard_normal(key, x.shape, x.dtype)


def _normal_broadcast(key, mean, std):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = jnp.result_type(mean, std)
    if not (_is_float(dtype) or _is_complex(dtype)):
        dtype = jnp.float32
    return mean + std * _standard_normal(key, shape, dtype)


@lowers("aten::normal.Tensor_float", "aten::normal.float_Tensor", "aten::normal.Tensor_Tensor", random=True)
def normal_tensor(key, mean, std, generator=None):
    """torch.normal(mean, std) with tensor mean and/or std, broadcast like PyTorch."""
    _check_generator_free(generator)
    return _normal_broadcast(key, mean, std)


def _default_dtype(dtype):
    return to_jax_dtype(dtype if dtype is not None else torch.get_default_dtype())


@lowers("aten::normal.float_float", random=True)
def normal_float_float(
    key, mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None
):
    """torch.normal(mean, std, size): a fresh tensor of N(mean, std**2) samples."""
    _check_generator_free(generator)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {float(std)}")
    return mean + std * _standard_normal(key, tuple(size), _default_dtype(dtype))


@lowers("aten::normal_", kind="host")
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    """x.normal_(): normal_functional written back in place.

    The dispatcher derives `op_` from a functional overload of the same name; normal_'s functional
    twin is named `normal_functional`, so the in-place kernel is built here (CPU generators included).
    """
    return eager_kernel(
        "aten::normal_", TABLE[resolve("aten::normal_functional")], inplace_of="aten::normal_functional"
    )(self, mean, std, generator=generator)


# -- uniform and integers ----------------------------------------------------------------------------
@lowers("aten::uniform", random=True)
def uniform(key, x, from_=0.0, to=1.0, generator=None):
    """Uniform on [from, to): from + (to - from) * u, u on the dtype's mantissa grid."""
    _check_generator_free(generator)
    if from_ > to:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={_fmt(from_)} > to={_fmt(to)}"
        )
    if not (_is_float(x.dtype) or _is_complex(x.dtype)):
        raise NotImplementedError(f"uniform_ is not implemented for {x.dtype} (a floating-point op)")
    u = _uniform01(key, x.shape, x.dtype)
    if _is_complex(x.dtype):
        v = _uniform01(jax.random.fold_in(key, 1), x.shape, x.dtype)
        return jax.lax.complex(u * (to - from_) + from_, v * (to - from_) + from_)
    return u * (to - from_) + from_


def _fmt(v) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _int_limits(dtype) -> tuple[int, int]:
    """The integers `dtype` can hold exactly: ints by iinfo, floats up to 2**digits, bool 0..1."""
    if dtype == jnp.bool_:
        return 0, 1
    if _is_complex(dtype):
        raise RuntimeError("check_random_bounds handles only integral, floating-point and boolean types")
    if _is_float(dtype):
        top = 1 << _digits(dtype)
        return -top, top
    info = jnp.iinfo(dtype)
    return int(info.min), int(info.max)


def _torch_type_name(dtype) -> str:
    return {
        jnp.uint8: "unsigned char",
        jnp.int8: "signed char",
        jnp.int16: "short",
        jnp.int32: "int",
        jnp.int64: "long",
        jnp.bool_: "bool",
        jnp.float16: "c10::Half",
        jnp.float32: "float",
        jnp.float64: "double",
    }.get(np.dtype(dtype).type, str(dtype))


def _random_range(key, shape, low: int, span: int, dtype):
    """`low + bits % span` (ATen's random_from_to); span may be up to 2**64.

    The sum is formed with 64-bit wrap-around, which is exact because every result lies in the
    target dtype's range (checked by the callers).
    """
    if span <= (1 << 32):
        r = jax.random.bits(key, shape, jnp.uint32)
        r = r if span == (1 << 32) else r % jnp.uint32(span)
    else:
        r = jax.random.bits(key, shape, jnp.uint64)
        r = r if span == (1 << 64) else r % jnp.uint64(span)
    value = r.astype(jnp.uint64) + jnp.uint64(low % (1 << 64))
    if dtype == jnp.bool_:
        return value != 0
    if dtype != jnp.uint64:
        value = jax.lax.bitcast_convert_type(value, jnp.int64)
    return value.astype(dtype)


@lowers("aten::random.from", random=True)
def random_from(key, x, from_, to=None, generator=None):
    """Integers on [from, to), or [from, dtype's top] when `to` is None."""
    _check_generator_free(generator)
    lo, hi = _int_limits(x.dtype)
    name = _torch_type_name(x.dtype)
    if to is None:
        if not lo <= from_ <= hi:
            raise RuntimeError(f"from is out of bounds for {name}")
        return _random_range(key, x.shape, from_, hi - from_ + 1, x.dtype)
    if from_ >= to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    if not lo <= from_ <= hi:
        raise RuntimeError(f"from is out of bounds for {name}")
    if not lo <= to - 1 <= hi:
        raise RuntimeError(f"to - 1 is out of bounds for {name}")
    return _random_range(key, x.shape, from_, to - from_, x.dtype)


@lowers("aten::random.to", random=True)
def random_to(key, x, to, generator=None):
    """Integers on [0, to)."""
    return random_from(key, x, 0, to, generator)


@lowers("aten::random", random=True)
def random_default(key, x, generator=None):
    """random_(): [0, 2**digits] for floats, [0, max] for integers, {0, 1} for bool."""
    _check_generator_free(generator)
    _, hi = _int_limits(x.dtype)
    return _random_range(key, x.shape, 0, hi + 1, x.dtype)


# -- bernoulli and dropout ---------------------------------------------------------------------------
def _bernoulli_mask(key, shape, p, dtype):
    """u < p with u uniform on [0, 1): True with probability p."""
    if _is_complex(dtype):
        raise NotImplementedError(f"bernoulli is not implemented for {dtype}")
    return _uniform01(key, shape, _compute_dtype(dtype)) < p


@lowers("aten::bernoulli", random=True)
def bernoulli(key, probs, generator=None):
    """torch.bernoulli(p): each element 1 with probability p[i], in p's dtype."""
    _check_generator_free(generator)
    return _bernoulli_mask(key, probs.shape, probs, probs.dtype)


@lowers("aten::bernoulli.p", random=True)
def bernoulli_p(key, x, p=0.5, generator=None):
    """x.bernoulli_(p) with a float p: x's shape and dtype, rate p."""
    _check_generator_free(generator)
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={_fmt(p)}")
    return _bernoulli_mask(key, x.shape, p, x.dtype)


@lowers("aten::bernoulli.Tensor", random=True)
def bernoulli_tensor(key, x, p, generator=None):
    """x.bernoulli_(p) with a tensor p broadcast to x's shape."""
    _check_generator_free(generator)
    dtype = x.dtype if _is_float(x.dtype) or _is_complex(x.dtype) else jnp.float32
    return _bernoulli_mask(key, x.shape, jnp.broadcast_to(p, x.shape), dtype)


@lowers("aten::native_dropout", random=True)
def native_dropout(key, x, p, train):
    """(x * mask / (1 - p), mask) with mask ~ Bernoulli(1 - p); identity when train is False."""
    keep = jnp.ones(x.shape, jnp.bool_)
    if train is False:
        return x, keep
    if p >= 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    mask = _bernoulli_mask(key, x.shape, 1.0 - p, x.dtype)
    scale = 1.0 / (1.0 - p)
    cdt = _compute_dtype(x.dtype)
    return (x.astype(cdt) * mask * cdt(scale)).astype(x.dtype), mask


@lowers("aten::native_dropout_backward")
def native_dropout_backward(grad, mask, scale):
    """grad * mask * scale, rounded once for reduced precision (as CPU's float opmath does).

    A bool/integer grad promotes with the float `scale` (True * 2.0 = 2.0), so it computes in float."""
    cdt = _compute_dtype(grad.dtype)
    result = grad.astype(cdt) * mask.astype(cdt) * cdt(scale)
    return result.astype(grad.dtype) if jnp.issubdtype(grad.dtype, jnp.floating) else result


# -- other distributions -----------------------------------------------------------------------------
def _open_uniform(key, x):
    """u on (0, 1]: 1 - [0, 1), safe under log."""
    return 1 - _uniform01(key, x.shape, _compute_dtype(x.dtype))


@lowers("aten::exponential", random=True)
def exponential(key, x, lambd=1.0, generator=None):
    """-log(1 - u) / lambda."""
    _check_generator_free(generator)
    return -jnp.log(_open_uniform(key, x)) / lambd


@lowers("aten::geometric", random=True)
def geometric(key, x, p, generator=None):
    """Trials until the first success (support 1, 2, ...): ceil(log(u) / log1p(-p))."""
    _check_generator_free(generator)
    u = _open_uniform(key, x)
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(jnp.asarray(-p, u.dtype))), 1)


@lowers("aten::log_normal", random=True)
def log_normal(key, x, mean=1.0, std=2.0, generator=None):
    """exp(N(mean, std**2))."""
    _check_generator_free(generator)
    return jnp.exp(mean + std * _standard_normal(key, x.shape, x.dtype))


@lowers("aten::cauchy", random=True)
def cauchy(key, x, median=0.0, sigma=1.0, generator=None):
    """median + sigma * tan(pi * (u - 1/2))."""
    _check_generator_free(generator)
    u = _uniform01(key, x.shape, _compute_dtype(x.dtype))
    return median + sigma * jnp.tan(jnp.pi * (u - 0.5))


# -- sampling indices --------------------------------------------------------------------------------
@lowers("aten::multinomial", random=True)
def multinomial(key, probs, num_samples, replacement=False, generator=None):
    """Category indices drawn from unnormalized non-negative weights (1-D or batched 2-D).

    With replacement: independent categorical draws. Without: the Gumbel top-k trick (perturb
    log-weights with Gumbel noise, keep the k largest), which samples without replacement exactly.
    """
    _check_generator_free(generator)
    if probs.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    categories = probs.shape[-1]
    if not replacement and num_samples > categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    cdt = _compute_dtype(probs.dtype)
    logits = jnp.log(probs.astype(cdt))
    if replacement:
        batch = probs.shape[:-1]
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples,) + batch)
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    gumbel = -jnp.log(-jnp.log(_uniform01(key, probs.shape, cdt) + jnp.finfo(cdt).tiny))
    _, idx = jax.lax.top_k(logits + gumbel, num_samples)
    return idx.astype(jnp.int64)


@lowers("aten::randperm", random=True)
def randperm(key, n, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    """A random permutation of 0..n-1."""
    return jax.random.permutation(key, n).astype(to_jax_dtype(as_torch_dtype(dtype)))


@lowers("aten::randperm.generator", random=True)
def randperm_generator(key, n, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    _check_generator_free(generator)
    return randperm(key, n, dtype)


@lowers("aten::randperm.generator_out", kind="host")
def randperm_generator_out(n, *, generator=None, out):
    """torch.randperm(n, out=t): draw with the functional overload, then resize and copy into `out`."""
    result = torch.ops.aten.randperm.generator(n, generator=generator, dtype=out.dtype, device=out.device)
    if tuple(out.shape) != (n,):
        out.resize_((n,))
    return out.copy_(result)


@lowers("aten::_standard_gamma", random=True)
def standard_gamma(key, alpha, generator=None):
    """Gamma(alpha, 1) samples in alpha's shape (Gamma, Beta and Dirichlet distributions sample with it);
    half types draw in float32."""
    _check_generator_free(generator)
    ct = jnp.float32 if alpha.dtype in (jnp.bfloat16, jnp.float16) else alpha.dtype
    return jax.random.gamma(key, alpha.astype(ct), dtype=ct).astype(alpha.dtype)


@lowers("aten::_standard_gamma_grad")
def standard_gamma_grad(alpha, sample):
    """d sample / d alpha of a Gamma(alpha, 1) sample (the reparameterized gradient of rsample)."""
    ct = jnp.float32 if alpha.dtype in (jnp.bfloat16, jnp.float16) else alpha.dtype
    return jax.lax.random_gamma_grad(alpha.astype(ct), sample.astype(ct)).astype(alpha.dtype)


@lowers("aten::_sample_dirichlet", random=True)
def sample_dirichlet(key, alpha, generator=None):
    """Dirichlet(alpha) samples over the last dim: Gamma(alpha_i, 1) draws normalized to sum to 1."""
    _check_generator_free(generator)
    ct = jnp.float32 if alpha.dtype in (jnp.bfloat16, jnp.float16) else alpha.dtype
    g = jax.random.gamma(key, alpha.astype(ct), dtype=ct)
    return (g / jnp.sum(g, axis=-1, keepdims=True)).astype(alpha.dtype)


# -- random factories in traced graphs -------------------------------------------------------------
# Eager reaches these as `empty` + an in-place draw (their CompositeExplicit kernels); aot_autograd keeps
# them whole in a graph (core ATen), so without these the whole graph would run op by op. Each draws
# what the in-place form draws on a fresh tensor of the result's shape and dtype.
def _fresh(size, dtype, default):
    return jnp.zeros(tuple(size), to_jax_dtype(as_torch_dtype(dtype, default)))


@lowers("aten::rand", graph=True, random=True)
def rand_graph(key, size, dtype=None, *rest):
    return uniform(key, _fresh(size, dtype, torch.get_default_dtype()))


@lowers("aten::randn", graph=True, random=True)
def randn_graph(key, size, dtype=None, *rest):
    return normal_functional(key, _fresh(size, dtype, torch.get_default_dtype()))


@lowers("aten::rand_like", graph=True, random=True)
def rand_like_graph(key, x, dtype=None, *rest):
    return uniform(key, _fresh(x.shape, dtype, _torch_dtype(x)))


@lowers("aten::randn_like", graph=True, random=True)
def randn_like_graph(key, x, dtype=None, *rest):
    return normal_functional(key, _fresh(x.shape, dtype, _torch_dtype(x)))


@lowers("aten::randint", graph=True, random=True)
def randint_graph(key, high, size, dtype=None, *rest):
    return random_from(key, _fresh(size, dtype, torch.int64), 0, high)


@lowers("aten::randint.low", graph=True, random=True)
def randint_low_graph(key, low, high, size, dtype=None, *rest):
    return random_from(key, _fresh(size, dtype, torch.int64), low, high)


@lowers("aten::randint_like", graph=True, random=True)
def randint_like_graph(key, x, high, dtype=None, *rest):
    return random_from(key, _fresh(x.shape, dtype, _torch_dtype(x)), 0, high)


@lowers("aten::randint_like.low_dtype", graph=True, random=True)
def randint_like_low_graph(key, x, low, high, dtype=None, *rest):
    return random_from(key, _fresh(x.shape, dtype, _torch_dtype(x)), low, high)


def _torch_dtype(x) -> torch.dtype:
    return to_torch_dtype(x.dtype)

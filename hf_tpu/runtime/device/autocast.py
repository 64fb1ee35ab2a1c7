"""`torch.autocast("tpu")`: the AutocastPrivateUse1 dispatch key, with CUDA's casting policy.

PyTorch ships autocast kernels for CPU, CUDA, XPU, MPS, MTIA and MAIA only; on a PrivateUse1 device the
first op inside `torch.autocast` (which accelerate enters for `mixed_precision="bf16"`, so `Trainer(bf16=True)`
does too) failed with "Could not run 'aten::matmul' ... from the 'Autocasttpu' backend". Every op falls
through the key, except the ones CUDA's autocast casts (aten/src/ATen/autocast_mode.cpp):

- lower precision: matmuls, convolutions, linear, attention run in the autocast dtype;
- fp32: ops that lose too much in 16 bits (exp/log/pow, norms, losses, upsampling) run in float32;
  `cross_entropy_loss` too, as in CPU's and torch_xla's autocast (CUDA's leaves it to ATen, which calls
  `log_softmax(x, dim, dtype=x.dtype)` explicitly, so bf16 logits got a bf16 log-softmax);
- fp32 unless a dtype is given: softmax, log_softmax, sum, prod, cumsum, cumprod, vector/matrix norms;
- promote: ops mixing several inputs (cat, stack, addcmul, index_put, ...) run in the widest input dtype;
- refused: binary_cross_entropy (use the `_with_logits` form), with CUDA's message.

Only floating tpu tensors other than float64 are cast, as on CUDA. Casts are not cached across ops (CUDA
caches the casts of parameters inside an autocast region): a parameter is cast again at each use.
"""

from __future__ import annotations

import torch

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER_PRECISION = (
    "_convolution",
    "_convolution.deprecated",
    "conv1d",
    "conv1d.padding",
    "conv2d",
    "conv2d.padding",
    "conv3d",
    "conv3d.padding",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "scaled_dot_product_attention",
)

FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cross_entropy_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)

FP32_UNLESS_DTYPE = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)

PROMOTE = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
    "cat",
    "stack",
)

# unsafe in 16 bits: refused inside autocast, as CUDA does
BANNED = ("binary_cross_entropy",)

_libs: list = []


def _eligible(value) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
        and value.device.type == "tpu"
    )


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.dtype is not dtype and _eligible(value) else value
    if isinstance(value, list | tuple):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _tensors(args, kwargs):
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, list | tuple):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _run(op, args, kwargs, dtype):
    with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
        if dtype is not None:
            args = _cast(args, dtype)
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        return op(*args, **kwargs)


def _lower_precision(op):
    def kernel(*args, **kwargs):
        return _run(op, args, kwargs, torch.get_autocast_dtype("tpu"))

    return kernel


def _fp32(op):
    def kernel(*args, **kwargs):
        return _run(op, args, kwargs, torch.float32)

    return kernel


def _fp32_unless_dtype(op):
    at = [a.name for a in op._schema.arguments].index("dtype")

    def kernel(*args, **kwargs):
        first = next(_tensors(args, kwargs), None)
        if first is not None and _eligible(first):
            if len(args) > at:
                if args[at] is None:
                    args = (*args[:at], torch.float32, *args[at + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return _run(op, args, kwargs, None)

    return kernel


def _promote(op):
    def kernel(*args, **kwargs):
        widest = None
        for t in _tensors(args, kwargs):
            if _eligible(t):
                widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
        return _run(op, args, kwargs, widest)

    return kernel


def _banned(op):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"torch.nn.functional.{op._schema.name.removeprefix('aten::')} and torch.nn.BCELoss are unsafe to "
            "autocast. Many models use a sigmoid layer right before the binary cross entropy layer. In this "
            "case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits or "
            "torch.nn.BCEWithLogitsLoss. binary_cross_entropy_with_logits and BCEWithLogits are safe to "
            "autocast."
        )

    return kernel


def _overload(name: str):
    packet, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def register() -> None:
    """Install the AutocastPrivateUse1 kernels (once; cheap: no JAX, ~120 registrations)."""
    if _libs:
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    impl = torch.library.Library("aten", "IMPL")
    for names, policy in (
        (LOWER_PRECISION, _lower_precision),
        (FP32, _fp32),
        (FP32_UNLESS_DTYPE, _fp32_unless_dtype),
        (PROMOTE, _promote),
        (BANNED, _banned),
    ):
        for name in names:
            op = _overload(name)
            if op is not None:  # an op this torch build does not have keeps falling through
                impl.impl(name, policy(op), _KEY)
    _libs.extend((fallback, impl))

"""The one tolerance table of the OpInfo conformance suite (tpu vs CPU PyTorch).

`tolerance(op_key, dtype)` gives (atol, rtol) for `torch.testing.assert_close`: the default for the
dtype unless OVERRIDES names the OpInfo (`name` or `name.variant_test_name`). Every override says why:
a looser bound is only acceptable where CPU PyTorch itself computes differently (other summation
order, other libm), never to hide a wrong lowering.

bfloat16/float16 outputs that miss CPU's result get a second chance (`closer_to_fp64` in
tests/opinfo_report.py): the sample is rerun on CPU in float64, and each element passes when
|tpu - fp64| <= atol + rtol * |fp64| + 2 * |cpu - fp64|. CPU rounds intermediates to bf16 in composite
kernels (addbmm, conv_transpose, interpolate, instance_norm...) where our lowerings keep f32, so the tpu
result is often closer to the true value than CPU's; a lowering that loses precision still fails.

RANDOM ops draw from a different generator on tpu, so they are compared on shape, dtype and a
value-range invariant only; SKIPS lists OpInfos not run at all, each with its reason.
"""

from __future__ import annotations

import torch

# (atol, rtol) per dtype. float32: a few ulps more than torch's own default (1e-5, 1.3e-6) because XLA's
# exp/log/tanh/erf and its reduction order differ from ATen's vectorized CPU kernels by a few ulps.
# bfloat16: torch's rtol (1.6e-2 ~ 4 ulps of an 8-bit mantissa); atol 1e-2 because CPU rounds bf16
# intermediates in places where XLA keeps f32 (and vice versa), which shows near zero.
DEFAULT: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
    torch.complex64: (1e-5, 1e-5),
}
EXACT = (0.0, 0.0)  # integer and bool outputs must match bit for bit

# name or name.variant -> {dtype (None: every dtype) -> (atol, rtol)}; each with the reason.
OVERRIDES: dict[str, dict[torch.dtype | None, tuple[float, float]]] = {
    # matmul family: XLA:CPU's dot uses another blocking/summation order than MKL/oneDNN; the error grows
    # with K (samples go up to K~100), so allow ~1e-4 relative in f32.
    "matmul": {torch.float32: (1e-4, 1e-4)},
    # e^A of a batch with norm ~40 cancels in float32: CPU's own result is 2.4e-3 (relative) from the
    # float64 one and ours 1.6e-3, on different elements
    "matrix_exp": {torch.float32: (1e-5, 5e-3)},
    "mm": {torch.float32: (1e-4, 1e-4)},
    "bmm": {torch.float32: (1e-4, 1e-4)},
    "addmm": {torch.float32: (1e-4, 1e-4)},
    "addmm.decomposed": {torch.float32: (1e-4, 1e-4)},
    "baddbmm": {torch.float32: (1e-4, 1e-4)},
    "addbmm": {torch.float32: (1e-4, 1e-4)},
    "addmv": {torch.float32: (1e-4, 1e-4)},
    "mv": {torch.float32: (1e-4, 1e-4)},
    "inner": {torch.float32: (1e-4, 1e-4)},
    "tensordot": {torch.float32: (1e-4, 1e-4)},
    "einsum": {torch.float32: (1e-4, 1e-4)},
    "linalg.multi_dot": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.linear": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.bilinear": {torch.float32: (1e-4, 1e-4)},
    # convolutions: XLA's conv algorithm sums in another order than oneDNN's; same reason as matmul.
    "nn.functional.conv1d": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.conv2d": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.conv3d": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.conv_transpose1d": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.conv_transpose2d": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.conv_transpose3d": {torch.float32: (1e-4, 1e-4)},
    # attention = two matmuls and a softmax: the matmul reason, compounded; multi-head attention adds the
    # in/out projections (outputs reach ~1e3 in its samples).
    "nn.functional.scaled_dot_product_attention": {torch.float32: (1e-4, 1e-4)},
    "nn.functional.multi_head_attention_forward": {torch.float32: (1e-4, 1e-4)},
    # bf16 reductions over long rows: CPU accumulates in f32 then rounds once, as we do, but the sum of
    # ~100 bf16 terms in a different order still moves the last bit of the result.
    "sum": {torch.bfloat16: (5e-2, 1.6e-2)},
    "nansum": {torch.bfloat16: (5e-2, 1.6e-2)},
    "cumsum": {torch.bfloat16: (5e-2, 1.6e-2)},
}


def _lookup(table: dict, name: str, variant: str):
    """The entry for `name.variant` if there is one, else for `name` (OpInfo names contain dots)."""
    if variant and f"{name}.{variant}" in table:
        return table[f"{name}.{variant}"]
    return table.get(name)


def tolerance(name: str, variant: str, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for the OpInfo `name` (variant_test_name `variant`) at `dtype`."""
    table = _lookup(OVERRIDES, name, variant)
    if table is not None:
        if dtype in table:
            return table[dtype]
        if None in table:
            return table[None]
    if dtype.is_floating_point or dtype.is_complex:
        return DEFAULT.get(dtype, (1e-5, 1e-5))
    return EXACT


# Random and uninitialized-memory ops: the tpu stream differs from CPU's, so only shape, dtype and the
# named invariant are checked (see `check_random` in tests/opinfo_report.py). Value: the invariant.
RANDOM: dict[str, str] = {
    "bernoulli": "binary",  # values in {0, 1}
    "cauchy": "any",
    "exponential": "nonnegative",
    "geometric": "positive",
    "log_normal": "positive",
    "multinomial": "index",  # indices into the last dim of the input
    "normal": "any",
    "normal.number_mean": "any",
    "uniform": "any",
    "rand_like": "any",  # PyTorch's OpInfo named rand_like calls randn_like
    "randn_like": "any",
    "randint": "any",
    "randint_like": "any",
    "randn": "any",
    "nn.functional.dropout": "dropout",  # every element is 0 or input / (1 - p)
    "nn.functional.dropout2d": "dropout",
    "nn.functional.dropout3d": "dropout",
    "nn.functional.alpha_dropout": "any",
    "nn.functional.feature_alpha_dropout": "any",
    "nn.functional.feature_alpha_dropout.with_train": "any",
    "nn.functional.feature_alpha_dropout.without_train": "any",
    "nn.functional.rrelu": "any",
    "nn.functional.fractional_max_pool2d": "any",
    "nn.functional.fractional_max_pool3d": "any",
    # randomized algorithms (a random projection inside): U diag(S) V^H must rebuild CPU's matrix
    "svd_lowrank": "lowrank",
    "pca_lowrank": "lowrank",
    # uninitialized memory: any values are right
    "empty": "any",
    "empty_like": "any",
    "empty_permuted": "any",
    "empty_strided": "any",
    "new_empty": "any",
    "new_empty_strided": "any",
}


# Ops returning (values, indices) where equal values make the indices implementation-defined: CPU's
# quickselect (kthvalue, topk) or unstable sort may pick another of the tied elements than XLA. Their
# values are compared as usual; their indices must point at elements equal to the values. Value: a
# function of the sample giving (dim, keepdim); `sort`/`argsort` with stable=True stay exact.
def _arg(sample, pos: int, name: str, default):
    if len(sample.args) > pos:
        return sample.args[pos]
    return sample.kwargs.get(name, default)


TIED_INDICES: dict[str, object] = {
    "topk": lambda s: (_arg(s, 1, "dim", -1), True),
    "kthvalue": lambda s: (_arg(s, 1, "dim", -1), _arg(s, 2, "keepdim", False)),
    "mode": lambda s: (_arg(s, 0, "dim", -1), _arg(s, 1, "keepdim", False)),
    "median": lambda s: (_arg(s, 0, "dim", None), _arg(s, 1, "keepdim", False)),
    "nanmedian": lambda s: (_arg(s, 0, "dim", None), _arg(s, 1, "keepdim", False)),
    "sort": lambda s: None if _arg(s, 2, "stable", False) else (_arg(s, 0, "dim", -1), True),
    "argsort": lambda s: None if _arg(s, 2, "stable", False) else (_arg(s, 0, "dim", -1), True),
}


def tied_indices(name: str, variant: str, sample) -> tuple[int, bool] | None:
    """(dim, keepdim) when `sample`'s index output may legitimately differ from CPU's on ties."""
    spec = _lookup(TIED_INDICES, name, variant)
    if spec is None:
        return None
    found = spec(sample)
    return None if found is None or found[0] is None else found


# Factorizations whose factors are unique only up to sign/phase (and rotation inside degenerate
# subspaces): LAPACK and XLA legitimately return different factors. Compared on the values plus a
# reconstruction of the input from the tpu factors. Value: the check in tests/opinfo_report.py.
FACTORIZATIONS: dict[str, str] = {
    "svd": "svd",  # (U, S, V): A = U diag(S) V^H
    "linalg.svd": "linalg.svd",  # (U, S, Vh): A = U diag(S) Vh
    "linalg.eigh": "eigh",  # (L, Q): A = Q diag(L) Q^H
}


def factorization(name: str, variant: str) -> str | None:
    return _lookup(FACTORIZATIONS, name, variant)


# Outputs whose dtype PyTorch defines per device: for bf16/f16 inputs CPU returns the saved statistics
# of these normalizations in the input dtype, every other device in float32 (CUDA's kernels, the meta
# kernels that fake tensors and torch.compile use, torch._refs/_decomp, which special-case
# `device.type == "cpu"`). The tpu dispatcher casts every output to the meta kernel's dtype, so tpu
# follows the device rule. tests/opinfo_report.py compares these outputs by value in CPU's dtype.
# Value: output positions.
DEVICE_DTYPE_OUTPUTS: dict[str, tuple[int, ...]] = {
    "native_layer_norm": (1, 2),  # mean, rstd
    "native_batch_norm": (1, 2),  # save_mean, save_invstd
    "_native_batch_norm_legit": (1, 2),
    "_batch_norm_with_update": (1, 2),
}


def device_dtype_outputs(name: str, variant: str) -> tuple[int, ...]:
    return _lookup(DEVICE_DTYPE_OUTPUTS, name, variant) or ()


# Tensor arguments PyTorch requires on CPU even when the op runs on a device (positions in sample.args).
CPU_ARGS: dict[str, tuple[int, ...]] = {
    "tensor_split": (0,),  # tensor_indices_or_sections must be a CPU tensor
}


def cpu_args(name: str, variant: str) -> tuple[int, ...]:
    return _lookup(CPU_ARGS, name, variant) or ()


# OpInfos never run, with the reason.
SKIPS: dict[str, str] = {
    "chalf": "complex32 (chalf) has no XLA dtype; the tpu device supports complex64 only",
}


# OpInfos whose samples are random only sometimes: name -> (when, predicate on the SampleInput).
RANDOM_SAMPLES: dict[str, tuple[str, object]] = {
    # args: key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
    # add_zero_attn, dropout_p, ...
    "nn.functional.multi_head_attention_forward": (
        "training with dropout_p > 0",
        lambda s: s.kwargs.get("training", True) and len(s.args) > 9 and s.args[9] > 0,
    ),
    "nn.functional.scaled_dot_product_attention": (
        "dropout_p > 0",
        lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    ),
}


def random_invariant(name: str, variant: str, sample=None) -> str | None:
    """The invariant a random op (or random sample) is checked on, or None for deterministic ones."""
    invariant = _lookup(RANDOM, name, variant)
    if invariant is None and sample is not None:
        when = _lookup(RANDOM_SAMPLES, name, variant)
        if when is not None and when[1](sample):
            return "any"
    return invariant


def skip_reason(name: str, variant: str) -> str | None:
    return _lookup(SKIPS, name, variant)

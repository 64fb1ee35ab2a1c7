"""Dtype checks CPU's kernels make and meta kernels skip: mixed dtypes and integer/bool inputs.

Meta kernels compute a result dtype without asking whether CPU has a kernel for it, so on tpu
`torch.mm(f32, bf16)` returned float32, `F.gelu(int64)` returned int64 and `F.layer_norm` ignored a
weight of another dtype. Each check here raises what CPU raises instead: the same exception type and
CPU's own message, with dtypes named the way c10 prints them (`scalar_type_name`: "Float", "BFloat16";
`type_meta_name`: "float", "c10::BFloat16"). Texts that name CPU ("mixed dtype (CPU): ...",
"topk does not support bool dtypes on CPU") are kept as they are, so code written against CPU PyTorch
matches them on tpu too.

The checks are static (dtypes, shapes, argument values; never tensor contents) and run on every call,
so each is a couple of attribute reads on the valid path. Families of ops that fail the same way share
one check built from a table (`_INTEGER_INPUT_KERNELS`, `_BOOL_INPUT_KERNELS`, `_INTEGRAL_ONLY_KERNELS`, ...).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hf_tpu.runtime.arg_checks import checks

# -- how c10 names dtypes in messages -----------------------------------------------------------------
_SCALAR_TYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}
_TYPE_META_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
    torch.int16: "short int",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.bool: "bool",
    torch.uint16: "short unsigned int",
    torch.uint32: "unsigned int",
    torch.uint64: "long unsigned int",
    torch.complex32: "c10::complex<c10::Half>",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}
# dtypes whose `Tensor::toString()` Python's error translation rewrites to the legacy "torch.FloatTensor"
_LEGACY_TENSOR_TYPES = frozenset(
    (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    )
)


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's ScalarType name, as in "expected scalar type Float but found BFloat16"."""
    name = _SCALAR_TYPE_NAMES.get(dtype)
    if name is not None:
        return name
    base = str(dtype).removeprefix("torch.")  # float8_e4m3fn -> Float8_e4m3fn, uint16 -> UInt16
    return "U" + base[1:].capitalize() if base.startswith("uint") else base[0].upper() + base[1:]


def type_meta_name(dtype: torch.dtype) -> str:
    """caffe2's TypeMeta name, as in "expected m1 and m2 to have the same dtype, but got: float != double"."""
    name = _TYPE_META_NAMES.get(dtype)
    return name if name is not None else "c10::" + scalar_type_name(dtype)


def tensor_type_name(dtype: torch.dtype) -> str:
    """A CPU tensor's type as CPU's messages print it: "torch.FloatTensor", "CPUBFloat16Type"."""
    name = scalar_type_name(dtype)
    return f"torch.{name}Tensor" if dtype in _LEGACY_TENSOR_TYPES else f"CPU{name}Type"


def not_implemented(kernel: str, dtype: torch.dtype) -> NotImplementedError:
    """CPU's error for a dtype its kernel `kernel` was not compiled for."""
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(dtype)}'")


def expected_scalar_type(expected: torch.dtype, found: torch.dtype) -> RuntimeError:
    """CPU's error when a kernel reads one argument with another argument's dtype."""
    return RuntimeError(
        f"expected scalar type {scalar_type_name(expected)} but found {scalar_type_name(found)}"
    )


INTEGRAL = frozenset(
    (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    )
)
# what CPU's AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16) kernels (the norms) accept
FLOATING = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))
_REDUCED_FLOATING = frozenset((torch.float16, torch.bfloat16))


def _integral_result(*args) -> torch.dtype | None:
    """The promoted dtype of elementwise `args` when it is integral (or bool), else None.

    A wrapped number (`torch.hypot(t, 2)`) arrives as a Python number: an int or bool keeps the result
    integral, a float or complex does not. The exact promotion runs only on that error path.
    """
    for a in args:
        kind = type(a)
        if kind is int or kind is bool:
            continue
        if kind is float or kind is complex or a.dtype not in INTEGRAL:
            return None
    return torch.result_type(*args)


# -- integer/bool inputs CPU's floating-point kernels reject -------------------------------------------
def _integer_input(kernel: str) -> Callable:
    """A check that rejects an integer or bool first argument, as CPU's float-only kernel `kernel` does."""

    def check(self, *_):
        if self.dtype in INTEGRAL:
            raise not_implemented(kernel, self.dtype)

    return check


def _bool_input(kernel: str) -> Callable:
    """A check that rejects a bool first argument (`kernel` takes every other real dtype)."""

    def check(self, *_):
        if self.dtype is torch.bool:
            raise not_implemented(kernel, self.dtype)

    return check


def _integer_result(kernel: str) -> Callable:
    """A check for an elementwise op of two tensors: CPU's kernel runs in their promoted dtype, which
    must not be integral (`torch.hypot(int, float)` is fine, `torch.hypot(int, int)` is not)."""

    def check(self, other, *_):
        dtype = _integral_result(self, other)
        if dtype is not None:
            raise not_implemented(kernel, dtype)

    return check


# op -> the name CPU's kernel gives in `"<kernel>" not implemented for 'Long'`
_INTEGER_INPUT_KERNELS = {
    "aten::gelu": "GeluKernelImpl",
    "aten::silu": "silu_cpu",
    "aten::mish": "mish_cpu",
    "aten::elu": "elu_cpu",
    "aten::celu": "elu_cpu",
    "aten::leaky_relu": "leaky_relu_cpu",
    "aten::hardswish": "hardswish_cpu",
    "aten::hardsigmoid": "hardsigmoid_cpu",
    "aten::softplus": "softplus_cpu",
    "aten::softshrink": "softshrink_check",
    "aten::hardshrink": "hardshrink_cpu",
    "aten::log_sigmoid_forward": "log_sigmoid_cpu",
    "aten::glu": "glu_cpu",
    "aten::_prelu_kernel": "prelu_cpu",
    "aten::frac": "frac_cpu",
    "aten::logcumsumexp": "logcumsumexp_out_cpu",
    "aten::_fused_rms_norm": "rms_norm",
    # binary_cross_entropy_with_logits decomposes on CPU; log_sigmoid(input) is what fails there
    "aten::binary_cross_entropy_with_logits": "log_sigmoid_cpu",
}
_BOOL_INPUT_KERNELS = {
    "aten::threshold": "threshold_cpu",
    "aten::ceil": "ceil_vml_cpu",
    "aten::round.default": "round_vml_cpu",
    "aten::trunc": "trunc_vml_cpu",
    "aten::abs": "abs_cpu",
    "aten::median.default": "median_cpu",
}
_INTEGER_RESULT_KERNELS = {
    "aten::hypot": "hypot_cpu",
    "aten::nextafter": "nextafter_cpu",
    "aten::logaddexp": "logaddexp_cpu",
    "aten::mse_loss": "mse_cpu",
    "aten::smooth_l1_loss": "smooth_l1_cpu",
    "aten::huber_loss": "huber_cpu",
}


def _integral_only(kernel: str) -> Callable:
    """A check for a bitwise op (a tensor and a tensor or a number): CPU's kernel runs in their promoted
    dtype, which must be integral or bool (`float_tensor | 1` fails, as `int_tensor | bool_tensor` does not)."""

    def check(self, other, *_):
        kind = type(other)
        if self.dtype in INTEGRAL and (
            kind is int or kind is bool or (kind is not float and other.dtype in INTEGRAL)
        ):
            return
        dtype = torch.result_type(self, other)
        if dtype not in INTEGRAL:
            raise not_implemented(kernel, dtype)

    return check


# the fuzz (tests/fuzz) found these running into JAX's TypeError on float inputs
_INTEGRAL_ONLY_KERNELS = {
    "aten::bitwise_and.Tensor": "bitwise_and_cpu",
    "aten::bitwise_and.Scalar": "bitwise_and_cpu",
    "aten::bitwise_or.Tensor": "bitwise_or_cpu",
    "aten::bitwise_or.Scalar": "bitwise_or_cpu",
    "aten::bitwise_xor.Tensor": "bitwise_xor_cpu",
    "aten::bitwise_xor.Scalar": "bitwise_xor_cpu",
    "aten::__rshift__.Tensor": "rshift_cpu",
    "aten::__rshift__.Scalar": "rshift_cpu",
    "aten::__lshift__.Tensor": "lshift_cpu",
    "aten::__lshift__.Scalar": "lshift_cpu",
}


def _register_tables() -> None:
    for table, make in (
        (_INTEGER_INPUT_KERNELS, _integer_input),
        (_BOOL_INPUT_KERNELS, _bool_input),
        (_INTEGER_RESULT_KERNELS, _integer_result),
        (_INTEGRAL_ONLY_KERNELS, _integral_only),
    ):
        for op, kernel in table.items():
            checks(op)(make(kernel))


_register_tables()


def _softmax(kernel: str) -> Callable:
    """CPU's (log_)softmax kernels are floating-only and named for whether `dim` is the last one; an
    empty input returns before reaching them."""

    def check(self, dim, half_to_float):
        if self.dtype in INTEGRAL and self.numel() != 0:
            rank = max(self.dim(), 1)
            lastdim = "_lastdim" if dim % rank == rank - 1 else ""
            raise not_implemented(f"{kernel}{lastdim}_kernel_impl", self.dtype)

    return check


checks("aten::_softmax")(_softmax("softmax"))
checks("aten::_log_softmax")(_softmax("log_softmax"))


@checks("aten::std.correction", "aten::var.correction")
def _std_var(self, *_):
    if self.dtype in INTEGRAL:
        raise RuntimeError("std and var only support floating point and complex dtypes")


@checks("aten::std_mean.correction")
def _std_mean(self, *_):
    if self.dtype in INTEGRAL:
        raise RuntimeError("std_mean only support floating point and complex dtypes")


@checks("aten::var_mean.correction")
def _var_mean(self, *_):
    if self.dtype in INTEGRAL:
        raise RuntimeError("var_mean only support floating point and complex dtypes")


@checks("aten::lerp.Scalar", "aten::lerp.Tensor")
def _lerp(self, end, weight):
    """lerp takes one dtype for all three arguments (a 0-d tensor weight excepted) and floats only."""
    if end.dtype != self.dtype:
        raise RuntimeError(
            f"expected dtype {type_meta_name(self.dtype)} for `end` but got dtype {type_meta_name(end.dtype)}"
        )
    weighted = isinstance(weight, torch.Tensor)
    if weighted and weight.dtype != self.dtype and weight.dim() != 0:
        raise RuntimeError(
            f"expected dtype {type_meta_name(self.dtype)} for `weight` but got dtype {type_meta_name(weight.dtype)}"
        )
    if self.dtype in INTEGRAL:
        raise not_implemented("lerp_kernel_tensor" if weighted else "lerp_kernel_scalar", self.dtype)


@checks("aten::addcmul")
def _addcmul(self, tensor1, tensor2, value):
    if self.dtype is torch.bool and tensor1.dtype is torch.bool and tensor2.dtype is torch.bool:
        raise not_implemented("addcmul_cpu_out", torch.bool)


@checks("aten::addcdiv")
def _addcdiv(self, tensor1, tensor2, value):
    if tensor1.dtype in INTEGRAL and tensor2.dtype in INTEGRAL:
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will "
            "perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented "
            "as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
            "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the "
            "latter implementation: (input + value * tensor1 / tensor2), for all dtypes."
        )


@checks("aten::rrelu_with_noise_functional")
def _rrelu(self, noise, lower, upper, training, generator):
    """CPU's rrelu samples its slopes in training and is a leaky_relu in eval."""
    if self.dtype in INTEGRAL:
        raise not_implemented("rrelu_with_noise_out_cpu" if training else "leaky_relu_cpu", self.dtype)


@checks("aten::mean.default")
def _mean(self, dtype=None):
    _mean_dtype(self, dtype)


@checks("aten::mean.dim")
def _mean_dim(self, dim, keepdim=False, dtype=None):
    _mean_dtype(self, dtype)


def _mean_dtype(self, dtype) -> None:
    if dtype is None and self.dtype in INTEGRAL:
        raise RuntimeError(
            "mean(): could not infer output dtype. Input dtype must be either a floating point or complex "
            f"dtype. Got: {scalar_type_name(self.dtype)}"
        )
    if dtype is not None and dtype in INTEGRAL:
        raise RuntimeError(
            "mean(): could not infer output dtype. Optional dtype must be either a floating point or complex "
            f"dtype. Got: {scalar_type_name(dtype)}"
        )


@checks("aten::linalg_vector_norm")
def _vector_norm(self, ord, dim, keepdim, dtype):
    if self.dtype in INTEGRAL:
        raise RuntimeError(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. "
            f"Got {scalar_type_name(self.dtype)}"
        )
    if dtype is not None and dtype in INTEGRAL:
        raise RuntimeError(
            f"linalg.vector_norm: dtype should be floating point or complex, but got {scalar_type_name(dtype)}"
        )


@checks("aten::argmax")
def _argmax(self, dim, keepdim):
    if self.dtype is torch.bool:
        raise RuntimeError("argmax(): does not support bool input")


@checks("aten::topk")
def _topk(self, *_):
    if self.dtype is torch.bool:
        raise RuntimeError("topk does not support bool dtypes on CPU")


@checks("aten::polar", "aten::complex")
def _polar(a, b):
    """torch.complex/polar build a complex number from two tensors of one floating dtype."""
    if a.dtype not in _HALF_FLOAT_DOUBLE or b.dtype not in _HALF_FLOAT_DOUBLE:
        raise RuntimeError(
            "Expected both inputs to be Half, Float or Double tensors but got "
            f"{scalar_type_name(a.dtype)} and {scalar_type_name(b.dtype)}"
        )
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {scalar_type_name(a.dtype)} but got scalar type "
            f"{scalar_type_name(b.dtype)} for second argument"
        )


_HALF_FLOAT_DOUBLE = frozenset((torch.float16, torch.float32, torch.float64))


# -- matrix products: one dtype for all operands, and no bool -------------------------------------------
def _same_dtype_mm(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"expected m1 and m2 to have the same dtype, but got: {type_meta_name(a.dtype)} != "
            f"{type_meta_name(b.dtype)}"
        )


def _same_dtype_addmm(self, mat1: torch.Tensor, mat2: torch.Tensor) -> None:
    if self.dtype != mat2.dtype:
        raise RuntimeError(
            f"self and mat2 must have the same dtype, but got {scalar_type_name(self.dtype)} and "
            f"{scalar_type_name(mat2.dtype)}"
        )
    if mat1.dtype != mat2.dtype:
        raise RuntimeError(
            f"mat1 and mat2 must have the same dtype, but got {scalar_type_name(mat1.dtype)} and "
            f"{scalar_type_name(mat2.dtype)}"
        )


@checks("aten::mm")
def _mm(self, mat2):
    _same_dtype_mm(self, mat2)
    # an empty product returns before the kernel's dtype dispatch
    if self.dtype is torch.bool and self.numel() != 0 and mat2.numel() != 0:
        raise not_implemented("addmm_impl_cpu_", torch.bool)


@checks("aten::addmm")
def _addmm(self, mat1, mat2, beta, alpha):
    _same_dtype_addmm(self, mat1, mat2)
    if self.dtype is torch.bool and mat1.numel() != 0 and mat2.numel() != 0:
        raise not_implemented("addmm_impl_cpu_", torch.bool)


@checks("aten::addbmm")
def _addbmm(self, batch1, batch2, beta, alpha):
    """addbmm runs addmm per batch (none when the batch is empty)."""
    if batch1.dim() == 3 and batch1.shape[0] != 0:
        _same_dtype_addmm(self, batch1, batch2)
        if self.dtype is torch.bool and batch1.numel() != 0 and batch2.numel() != 0:
            raise not_implemented("addmm_impl_cpu_", torch.bool)


@checks("aten::bmm")
def _bmm(self, mat2):
    # an empty result or reduction returns before the kernel reads its operands
    if self.numel() == 0 or mat2.numel() == 0:
        return
    if self.dtype is torch.bool:
        raise not_implemented("bmm", torch.bool)
    if self.dtype != mat2.dtype:
        raise expected_scalar_type(self.dtype, mat2.dtype)


@checks("aten::baddbmm")
def _baddbmm(self, batch1, batch2, beta, alpha):
    if self.dtype != batch1.dtype:
        raise RuntimeError(
            f"Input dtypes must be the same, got: input {type_meta_name(self.dtype)}, batch1: "
            f"{type_meta_name(batch1.dtype)}, batch2: {type_meta_name(batch2.dtype)}"
        )
    if batch1.numel() == 0 or batch2.numel() == 0:
        return
    if self.dtype is torch.bool:
        raise not_implemented("baddbmm", torch.bool)
    if batch1.dtype != batch2.dtype:
        raise expected_scalar_type(batch1.dtype, batch2.dtype)


def _same_dtype_addmv(self, mat, vec) -> None:
    if not self.dtype == mat.dtype == vec.dtype:
        raise RuntimeError(
            "addmv input tensors must have the same dtype, but got "
            f"{scalar_type_name(self.dtype)}, {scalar_type_name(mat.dtype)}, and {scalar_type_name(vec.dtype)}"
        )


@checks("aten::addmv")
def _addmv(self, mat, vec, beta, alpha):
    _same_dtype_addmv(self, mat, vec)
    if mat.dtype is torch.bool and mat.numel() != 0:
        raise not_implemented("addmv_impl_cpu", torch.bool)


@checks("aten::mv")
def _mv(self, vec):
    """CPU's mv is addmv into a result of `vec`'s dtype."""
    _same_dtype_addmv(vec, self, vec)
    if self.dtype is torch.bool and self.numel() != 0:
        raise not_implemented("addmv_impl_cpu", torch.bool)


@checks("aten::dot", "aten::vdot")
def _dot(self, tensor):
    if self.dtype != tensor.dtype:
        raise RuntimeError(
            "dot : expected both vectors to have same dtype, but found "
            f"{scalar_type_name(self.dtype)} and {scalar_type_name(tensor.dtype)}"
        )
    if self.dtype is torch.bool:
        raise not_implemented("dot", torch.bool)


# -- normalization: CPU mixes dtypes only as a reduced-precision input with float32 parameters ----------
def _norm_params(kernel: str, input: torch.Tensor, weight, bias) -> None:
    """CPU's layer/group norm rule (`is_mixed_type`/`check_mixed_data_type`): parameters whose dtype
    differs from the input's must all be float32 and the input bf16 or f16; otherwise the kernel runs
    in the input's dtype, which must be floating, and reads the bias in it."""
    first = weight if weight is not None else bias
    if first is not None and first.dtype != input.dtype:
        for p in (weight, bias):
            if p is not None and p.dtype is not torch.float32:
                raise RuntimeError("mixed dtype (CPU): expect parameter to have scalar type of Float")
        if input.dtype not in _REDUCED_FLOATING:
            raise RuntimeError("mixed dtype (CPU): all inputs must share same datatype.")
        return
    if input.dtype not in FLOATING:
        raise not_implemented(kernel, input.dtype)
    if bias is not None and bias.dtype != input.dtype:
        raise expected_scalar_type(input.dtype, bias.dtype)


@checks("aten::native_layer_norm")
def _layer_norm(input, normalized_shape, weight, bias, eps):
    _norm_params("LayerNormKernelImpl", input, weight, bias)


@checks("aten::native_group_norm")
def _group_norm(input, weight, bias, N, C, HxW, group, eps):
    _norm_params("GroupNormKernelImpl", input, weight, bias)


# -- attention ----------------------------------------------------------------------------------------
@checks("aten::scaled_dot_product_attention")
def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """CPU's `validate_sdpa_input`, then its math path's matmuls, which take floating inputs only."""
    if not query.dtype == key.dtype == value.dtype:
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{type_meta_name(query.dtype)} key.dtype: {type_meta_name(key.dtype)} and value.dtype: "
            f"{type_meta_name(value.dtype)} instead."
        )
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
            f"{query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead."
        )
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
            f"{type_meta_name(attn_mask.dtype)} and  query.dtype: {type_meta_name(query.dtype)} instead."
        )
    if query.dtype in INTEGRAL and query.numel() and key.numel() and value.numel():
        # the math path scales q and k by a float, then multiplies the float scores by `value`
        raise expected_scalar_type(torch.float32, value.dtype)


# -- losses -------------------------------------------------------------------------------------------
def _nll_loss(kernel: str) -> Callable:
    """nll_loss(2d): integer class targets (int64 or uint8), a floating input, a weight of its dtype."""

    def check(self, target, weight, reduction, ignore_index):
        if target.dtype is not torch.int64 and target.dtype is not torch.uint8:
            raise RuntimeError(
                f"expected target dtype to be Long or Byte, but got {scalar_type_name(target.dtype)}"
            )
        if self.dtype in INTEGRAL:
            raise not_implemented(kernel, self.dtype)
        if weight is not None and weight.dtype != self.dtype:
            raise expected_scalar_type(self.dtype, weight.dtype)

    return check


checks("aten::nll_loss_forward")(_nll_loss("nll_loss_out_frame"))
checks("aten::nll_loss2d_forward")(_nll_loss("nll_loss2d_forward_out_frame"))


@checks("aten::binary_cross_entropy")
def _binary_cross_entropy(self, target, weight, reduction):
    if target.dtype != self.dtype:
        raise RuntimeError(
            f"Found dtype {scalar_type_name(target.dtype)} but expected {scalar_type_name(self.dtype)}"
        )
    if self.dtype in INTEGRAL:
        raise not_implemented("binary_cross_entropy", self.dtype)


# -- indexed writes: the source must have the destination's dtype ---------------------------------------
@checks("aten::index_add")
def _index_add(self, dim, index, source, alpha):
    if source.dtype != self.dtype:
        raise RuntimeError(
            f"index_add_(): self ({scalar_type_name(self.dtype)}) and source "
            f"({scalar_type_name(source.dtype)}) must have the same scalar type"
        )


@checks("aten::index_copy")
def _index_copy(self, dim, index, source):
    if source.dtype != self.dtype:
        raise RuntimeError(
            "index_copy_(): self and source expected to have the same dtype, but got (self) "
            f"{scalar_type_name(self.dtype)} and (source) {scalar_type_name(source.dtype)}"
        )


@checks("aten::index_put")
def _index_put(self, indices, values, accumulate):
    if values.dtype != self.dtype:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(self.dtype)} for the destination and {scalar_type_name(values.dtype)} for the source."
        )


@checks("aten::put")
def _put(self, index, source, accumulate):
    if source.dtype != self.dtype:
        raise RuntimeError(
            "put_(): self and source expected to have the same dtype, but got self.dtype = "
            f"{scalar_type_name(self.dtype)} and source.dtype = {scalar_type_name(source.dtype)}"
        )


# -- sampling and distances: a second tensor read in the first one's dtype -------------------------------
@checks("aten::grid_sampler_2d")
def _grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    if input.dtype in INTEGRAL:
        raise not_implemented("grid_sampler_2d_cpu_kernel_impl", input.dtype)
    if grid.dtype != input.dtype:
        raise expected_scalar_type(input.dtype, grid.dtype)


@checks("aten::_cdist_forward")
def _cdist(x1, x2, p, compute_mode):
    for name, x in (("X1", x1), ("X2", x2)):
        if x.dtype in INTEGRAL:
            raise RuntimeError(
                f"cdist only supports floating-point dtypes, {name} got: {scalar_type_name(x.dtype)}"
            )
    if x2.dtype != x1.dtype:
        raise expected_scalar_type(x1.dtype, x2.dtype)


@checks("aten::_embedding_bag", "aten::_embedding_bag_forward_only")
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, *_):
    if weight.dtype not in FLOATING:
        raise RuntimeError(
            "Expected tensor for argument #1 'weight' to have one of the following scalar types: Half, BFloat16, "
            f"Float, Double; but got {tensor_type_name(weight.dtype)} instead (while checking arguments for "
            "embedding_bag)"
        )
    if per_sample_weights is not None and per_sample_weights.dtype != weight.dtype:
        raise RuntimeError(
            "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
            f"'per_sample_weights'; but type {tensor_type_name(weight.dtype)} does not equal "
            f"{tensor_type_name(per_sample_weights.dtype)} (while checking arguments for embedding_bag)"
        )


# -- batch norm: CPU's kernel is floating-only, and its parameters' dtypes must match the input's ------
def _batch_norm_dtypes(input, weight, bias, running_mean=None, running_var=None) -> None:
    """CPU's `batch_norm_cpu` checks: a floating input, and weight/bias/running stats of the input's dtype
    (or all float32 for a bfloat16/float16 input, the one mixed case its kernel has). The message depends
    on which argument differs, as CPU's does."""
    if input.dtype not in FLOATING:
        raise not_implemented("batch_norm", input.dtype)
    affine = [p for p in (weight, bias) if isinstance(p, torch.Tensor)]
    stats = [p for p in (running_mean, running_var) if isinstance(p, torch.Tensor)]
    defined = affine + stats
    if all(p.dtype == input.dtype for p in defined):
        return
    if input.dtype in _REDUCED_FLOATING and all(p.dtype == torch.float32 for p in defined):
        return
    if all(p.dtype == input.dtype for p in affine):  # only a running stat differs: read as the input's
        found = next(p.dtype for p in stats if p.dtype != input.dtype)
        raise expected_scalar_type(input.dtype, found)
    if all(p.dtype == torch.float32 for p in defined):  # a float64 input with float32 parameters
        raise RuntimeError("mixed dtype (CPU): all inputs must share same datatype.")
    raise RuntimeError("mixed dtype (CPU): expect parameter to have scalar type of Float")


@checks(
    "aten::native_batch_norm",
    "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_functional",
    "aten::_native_batch_norm_legit_no_training",
    "aten::_batch_norm_with_update",
    "aten::_batch_norm_no_update",
)
def _batch_norm(input, weight, bias, running_mean, running_var, *_):
    _batch_norm_dtypes(input, weight, bias, running_mean, running_var)


@checks("aten::_native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(input, weight, bias, *_):
    _batch_norm_dtypes(input, weight, bias)

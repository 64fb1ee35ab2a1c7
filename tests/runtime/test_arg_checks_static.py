"""Static argument checks (`hf_tpu.runtime.arg_checks.dtypes`, `.conv`): tpu raises what CPU raises.

Every error case runs on CPU first; the test asserts that CPU raises and that tpu raises the same
exception type with CPU's message. Valid neighbours of each case (bf16 with bf16 weights, float64,
empty tensors, 0-d, mixed precision CPU allows) must keep working and match CPU's result.
"""

import re

import pytest
import torch
import torch.nn.functional as F

from hf_tpu.runtime import arg_checks

f32, f64, f16, bf16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
i64, i32, u8, b8 = torch.int64, torch.int32, torch.uint8, torch.bool
conv = torch.ops.aten.convolution.default


def t(*shape, dtype=f32, seed=0):
    """A deterministic CPU tensor (moved to the device by each case)."""
    g = torch.Generator().manual_seed(seed + sum(shape))
    if dtype is b8:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(0, 4, shape, generator=g).to(dtype)
    return torch.randn(*shape, generator=g).to(dtype)


def cpu_error(fn) -> BaseException:
    try:
        fn("cpu")
    except Exception as exc:  # noqa: BLE001 - the error under comparison
        return exc
    raise AssertionError("CPU accepted these arguments; the case is not an error case")


def assert_same_error(fn) -> None:
    expected = cpu_error(fn)
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        out = fn("tpu")
        if isinstance(out, torch.Tensor):
            out.cpu()  # a deferred computation must not hide a missing error


def assert_same_result(fn) -> None:
    expected = fn("cpu")
    actual = fn("tpu")
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(expected, actual):
        assert a.device.type == "tpu"
        tol = {"atol": 2e-2, "rtol": 2e-2} if e.dtype in (bf16, f16) else {}
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)


def on(d, *tensors):
    return [x.to(d) if isinstance(x, torch.Tensor) else x for x in tensors]


# -- 1. mixed dtypes ----------------------------------------------------------------------------------
A, B16, B64 = t(3, 4), t(4, 5, dtype=bf16), t(4, 5, dtype=f64)
MIXED = {
    "mm f32@bf16": lambda d: torch.mm(*on(d, A, B16)),
    "mm f32@f64": lambda d: torch.mm(*on(d, A, B64)),
    "mm i32@i64": lambda d: torch.mm(*on(d, A.int(), B64.long())),
    "mm complex64@complex128": lambda d: torch.mm(*on(d, A.cfloat(), B64.cdouble())),
    "mm empty rows, mixed": lambda d: torch.mm(*on(d, t(0, 4), B64)),
    "matmul f32@bf16": lambda d: A.to(d) @ B16.to(d),
    "matmul 3d@2d": lambda d: A[None].to(d) @ B16.to(d),
    "matmul 1d@2d": lambda d: A[0].to(d) @ B16.to(d),
    "linear bf16 weight": lambda d: F.linear(*on(d, A, B16.t())),
    "linear bf16 weight and bias": lambda d: F.linear(*on(d, A, B16.t(), t(5, dtype=bf16))),
    "linear bf16 bias": lambda d: F.linear(*on(d, A, B64.float().t(), t(5, dtype=bf16))),
    "linear 3d input, bf16 weight": lambda d: F.linear(*on(d, A[None], B16.t(), t(5, dtype=bf16))),
    "addmm bf16 self": lambda d: torch.addmm(*on(d, t(5, dtype=bf16), A, B64.float())),
    "addmm bf16 mat1": lambda d: torch.addmm(*on(d, t(5), A.bfloat16(), B64.float())),
    "addmm bf16 mat2": lambda d: torch.addmm(*on(d, t(5), A, B16)),
    "bmm f32@bf16": lambda d: torch.bmm(*on(d, A[None], B16[None])),
    "bmm i64@f32": lambda d: torch.bmm(*on(d, A[None].long(), B64[None].float())),
    "baddbmm bf16 self": lambda d: torch.baddbmm(*on(d, t(1, 3, 5, dtype=bf16), A[None], B64[None].float())),
    "baddbmm bf16 batch1": lambda d: torch.baddbmm(*on(d, t(1, 3, 5), A[None].bfloat16(), B64[None].float())),
    "baddbmm bf16 batch2": lambda d: torch.baddbmm(*on(d, t(1, 3, 5), A[None], B16[None])),
    "addbmm bf16 self": lambda d: torch.addbmm(*on(d, t(3, 5, dtype=bf16), A[None], B64[None].float())),
    "addbmm bf16 batch2": lambda d: torch.addbmm(*on(d, t(3, 5), A[None], B16[None])),
    "mv bf16 vec": lambda d: torch.mv(*on(d, A, t(4, dtype=bf16))),
    "mv bf16 mat": lambda d: torch.mv(*on(d, A.bfloat16(), t(4))),
    "addmv bf16 self": lambda d: torch.addmv(*on(d, t(3, dtype=bf16), A, t(4))),
    "dot f32 f64": lambda d: torch.dot(*on(d, t(4), t(4, dtype=f64))),
    "vdot i64 i32": lambda d: torch.vdot(*on(d, t(4, dtype=i64), t(4, dtype=i32))),
    "layer_norm bf16 weight": lambda d: F.layer_norm(*on(d, A, (4,), t(4, dtype=bf16))),
    "layer_norm f64 weight": lambda d: F.layer_norm(*on(d, A, (4,), t(4, dtype=f64))),
    "layer_norm bf16 bias": lambda d: F.layer_norm(*on(d, A, (4,), t(4), t(4, dtype=bf16))),
    "layer_norm bf16 bias only": lambda d: F.layer_norm(*on(d, A, (4,), None, t(4, dtype=bf16))),
    "layer_norm f64 input f32 weight": lambda d: F.layer_norm(*on(d, A.double(), (4,), t(4))),
    "layer_norm bf16 input, f32 weight, bf16 bias": lambda d: F.layer_norm(
        *on(d, A.bfloat16(), (4,), t(4), t(4, dtype=bf16))
    ),
    "layer_norm bf16 input and weight, f32 bias": lambda d: F.layer_norm(
        *on(d, A.bfloat16(), (4,), t(4, dtype=bf16), t(4))
    ),
    "layer_norm f16 input bf16 weight": lambda d: F.layer_norm(*on(d, A.half(), (4,), t(4, dtype=bf16))),
    "group_norm bf16 weight": lambda d: F.group_norm(*on(d, t(2, 4, 3), 2, t(4, dtype=bf16))),
    "group_norm bf16 bias": lambda d: F.group_norm(*on(d, t(2, 4, 3), 2, t(4), t(4, dtype=bf16))),
    "group_norm f64 input f32 weight": lambda d: F.group_norm(*on(d, t(2, 4, 3, dtype=f64), 2, t(4))),
    "conv2d f32 input, bf16 weight": lambda d: F.conv2d(*on(d, t(1, 2, 5, 5), t(3, 2, 3, 3, dtype=bf16))),
    "conv2d bf16 input, f32 weight": lambda d: F.conv2d(*on(d, t(1, 2, 5, 5, dtype=bf16), t(3, 2, 3, 3))),
    "conv1d f16 input, f32 weight": lambda d: F.conv1d(*on(d, t(1, 2, 5, dtype=f16), t(3, 2, 3))),
    "conv1d bf16 input and weight, f32 bias": lambda d: F.conv1d(
        *on(d, t(1, 2, 5, dtype=bf16), t(3, 2, 3, dtype=bf16), t(3))
    ),
    "conv2d grouped f32 input, f64 weight": lambda d: F.conv2d(
        *on(d, t(1, 4, 5, 5), t(4, 2, 2, 2, dtype=f64)), groups=2
    ),
    "conv2d batch 20 f32 input, f64 bias": lambda d: F.conv2d(
        *on(d, t(20, 3, 6, 6), t(2, 3, 2, 2), t(2, dtype=f64))
    ),
    "conv_transpose1d f32 input, bf16 weight": lambda d: F.conv_transpose1d(
        *on(d, t(1, 3, 6), t(3, 2, 2, dtype=bf16))
    ),
    "conv_transpose1d bf16 input, f32 weight": lambda d: F.conv_transpose1d(
        *on(d, t(1, 3, 6, dtype=bf16), t(3, 2, 2))
    ),
    "lerp bf16 end": lambda d: torch.lerp(*on(d, A, A.bfloat16()), 0.5),
    "lerp f64 weight": lambda d: torch.lerp(*on(d, A, A, A.double())),
    "index_add bf16 source": lambda d: (
        t(4, 3).to(d).index_add(0, *on(d, torch.tensor([0, 2]), t(2, 3, dtype=bf16)))
    ),
    "index_copy bf16 source": lambda d: (
        t(4, 3).to(d).index_copy(0, *on(d, torch.tensor([0, 2]), t(2, 3, dtype=bf16)))
    ),
    "index_put bf16 values": lambda d: (
        t(4, 3).to(d).index_put(*on(d, (torch.tensor([0, 2]).to(d),), t(2, 3, dtype=bf16)))
    ),
    "setitem bf16 values": lambda d: (
        t(4, 3).to(d).__setitem__(*on(d, torch.tensor([0, 2]), t(2, 3, dtype=bf16)))
    ),
    "put bf16 source": lambda d: t(4, 3).to(d).put(*on(d, torch.tensor([0, 2]), t(2, dtype=bf16))),
    "nll_loss f64 weight": lambda d: F.nll_loss(
        *on(d, t(4, 3), torch.tensor([0, 1, 2, 0])), weight=t(3, dtype=f64).to(d)
    ),
    "nll_loss bf16 input, f32 weight": lambda d: F.nll_loss(
        *on(d, t(4, 3, dtype=bf16), torch.tensor([0, 1, 2, 0])), weight=t(3).to(d)
    ),
    "nll_loss int32 target": lambda d: F.nll_loss(*on(d, t(4, 3), torch.tensor([0, 1, 2, 0], dtype=i32))),
    "nll_loss float target": lambda d: F.nll_loss(*on(d, t(4, 3), torch.tensor([0.0, 1, 2, 0]))),
    "nll_loss2d f64 weight": lambda d: F.nll_loss(
        *on(d, t(1, 4, 3, 2), torch.zeros(1, 3, 2, dtype=i64)), weight=t(4, dtype=f64).to(d)
    ),
    "cross_entropy bf16 weight": lambda d: F.cross_entropy(
        *on(d, t(4, 3), torch.tensor([0, 1, 2, 0])), weight=t(3, dtype=bf16).to(d)
    ),
    "binary_cross_entropy f64 target": lambda d: F.binary_cross_entropy(
        *on(d, t(4).sigmoid(), t(4, dtype=f64).sigmoid())
    ),
    "grid_sample f64 grid": lambda d: F.grid_sample(
        *on(d, t(1, 1, 4, 3), torch.zeros(1, 1, 1, 2, dtype=f64)), align_corners=False
    ),
    "cdist f32 f64": lambda d: torch.cdist(*on(d, t(4, 3), t(4, 3, dtype=f64))),
    "embedding_bag f64 per_sample_weights": lambda d: F.embedding_bag(
        *on(d, torch.tensor([0, 2]), t(4, 3), torch.tensor([0])),
        per_sample_weights=t(2, dtype=f64).to(d),
        mode="sum",
    ),
    "polar f32 f64": lambda d: torch.polar(*on(d, t(3), t(3, dtype=f64))),
    "complex f32 f64": lambda d: torch.complex(*on(d, t(3), t(3, dtype=f64))),
}


@pytest.mark.parametrize("case", MIXED, ids=list(MIXED))
def test_mixed_dtypes_raise_like_cpu(case):
    assert_same_error(MIXED[case])


@pytest.mark.parametrize(
    "dtype", [f64, f16, bf16, i64, i32, torch.int16, torch.int8, u8, b8, torch.complex64]
)
def test_dtype_names_match_cpu(dtype):
    """Both c10 spellings ("c10::BFloat16" from TypeMeta, "BFloat16" from ScalarType) match CPU's."""
    other = f32 if dtype is not f32 else f64
    assert_same_error(lambda d: torch.mm(*on(d, t(2, 2, dtype=other), t(2, 2, dtype=dtype))))
    assert_same_error(
        lambda d: torch.addmm(*on(d, t(2, 2, dtype=other), t(2, 2, dtype=other), t(2, 2, dtype=dtype)))
    )


# -- 2. integer and bool inputs CPU's kernels reject -----------------------------------------------------
X = t(2, 3)
UNARY = {
    "std": lambda x: x.std(),
    "std dim": lambda x: x.std(0),
    "var correction=0": lambda x: x.var(1, correction=0),
    "std_mean": lambda x: torch.std_mean(x),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "softmax last dim": lambda x: F.softmax(x, 1),
    "softmax dim 0": lambda x: F.softmax(x, 0),
    "softmax 0-d": lambda x: F.softmax(x[0, 0], 0),
    "log_softmax": lambda x: F.log_softmax(x, 1),
    "log_softmax dim 0": lambda x: F.log_softmax(x, 0),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([0, 1], device=x.device)),
    "gelu": F.gelu,
    "gelu tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "elu": F.elu,
    "selu": F.selu,
    "celu": F.celu,
    "leaky_relu": F.leaky_relu,
    "rrelu eval": lambda x: F.rrelu(x, training=False),
    "rrelu train": lambda x: F.rrelu(x, training=True),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "softplus": F.softplus,
    "softshrink": F.softshrink,
    "hardshrink": F.hardshrink,
    "logsigmoid": F.logsigmoid,
    "glu": lambda x: F.glu(x.reshape(3, 2)),
    "prelu": lambda x: F.prelu(x, torch.ones(1, dtype=x.dtype, device=x.device)),
    "lerp scalar weight": lambda x: torch.lerp(x, x, 0.5),
    "lerp tensor weight": lambda x: torch.lerp(x, x, x),
    "frac": torch.frac,
    "logcumsumexp": lambda x: x.logcumsumexp(0),
    "hypot": lambda x: torch.hypot(x, x),
    "nextafter": lambda x: torch.nextafter(x, x),
    "logaddexp": lambda x: torch.logaddexp(x, x),
    "mean": lambda x: x.mean(),
    "mean dim": lambda x: x.mean(0),
    "vector_norm": lambda x: torch.linalg.vector_norm(x),
    "layer_norm": lambda x: F.layer_norm(x, (3,)),
    "group_norm": lambda x: F.group_norm(x[None], 1),
    "rms_norm": lambda x: F.rms_norm(x, (3,)),
    "mse_loss": lambda x: F.mse_loss(x, x),
    "smooth_l1_loss": lambda x: F.smooth_l1_loss(x, x),
    "huber_loss": lambda x: F.huber_loss(x, x),
    "binary_cross_entropy": lambda x: F.binary_cross_entropy(x, x),
    "binary_cross_entropy_with_logits": lambda x: F.binary_cross_entropy_with_logits(x, x),
    "nll_loss": lambda x: F.nll_loss(x, torch.tensor([0, 1], device=x.device)),
    "grid_sample": lambda x: F.grid_sample(
        x[None, None], torch.zeros(1, 1, 1, 2, device=x.device), align_corners=False
    ),
    "cdist": lambda x: torch.cdist(x, x),
    "embedding_bag weight": lambda x: F.embedding_bag(
        torch.tensor([0, 1], device=x.device), x, torch.tensor([0], device=x.device)
    ),
    "polar": lambda x: torch.polar(x, x),
    "addcdiv": lambda x: torch.addcdiv(x, x, x),
}
INTEGER_CASES = {f"{name} {str(dtype)[6:]}": (fn, dtype) for name, fn in UNARY.items() for dtype in (i64, b8)}
INTEGER_CASES.update(
    {
        f"{name} {str(dtype)[6:]}": (UNARY[name], dtype)
        for name in ("gelu", "softmax dim 0", "std")
        for dtype in (i32, u8)
    }
)


@pytest.mark.parametrize("case", INTEGER_CASES, ids=list(INTEGER_CASES))
def test_integer_and_bool_inputs_raise_like_cpu(case):
    fn, dtype = INTEGER_CASES[case]
    x = X.to(dtype)
    assert_same_error(lambda d: fn(x.to(d)))


BOOL_ONLY = {
    "mm": lambda x: x @ x.t(),
    "matmul 1-d": lambda x: x[0] @ x[0],
    "addmm": lambda x: torch.addmm(x[:, :2], x, x.t()),
    "linear": lambda x: F.linear(x, x),
    "bmm": lambda x: torch.bmm(x[None], x.t()[None]),
    "baddbmm": lambda x: torch.baddbmm(x[None, :, :2], x[None], x.t()[None]),
    "addbmm": lambda x: torch.addbmm(x[:, :2], x[None], x.t()[None]),
    "mv": lambda x: torch.mv(x, x[0]),
    "addmv": lambda x: torch.addmv(x[:, 0], x, x[0]),
    "dot": lambda x: torch.dot(x[0], x[0]),
    "vdot": lambda x: torch.vdot(x[0], x[0]),
    "dot empty": lambda x: torch.dot(x[0, :0], x[0, :0]),
    "threshold": lambda x: F.threshold(x, 0, 1),
    "ceil": torch.ceil,
    "round": torch.round,
    "trunc": torch.trunc,
    "abs": torch.abs,
    "median": lambda x: x.median(),
    "argmax": lambda x: x.argmax(),
    "topk": lambda x: x.topk(1),
    "addcmul": lambda x: torch.addcmul(x, x, x),
    "complex": lambda x: torch.complex(x, x),
}

DTYPE_ARGUMENT = {
    "mean int dtype": lambda d: t(3).to(d).mean(dtype=i64),
    "mean dim int dtype": lambda d: t(3, dtype=i64).to(d).mean(0, dtype=i32),
    "vector_norm int input, float dtype": lambda d: torch.linalg.vector_norm(
        t(3, dtype=i64).to(d), dtype=f32
    ),
    "vector_norm int dtype": lambda d: torch.linalg.vector_norm(t(3).to(d), dtype=i64),
}


@pytest.mark.parametrize("case", DTYPE_ARGUMENT, ids=list(DTYPE_ARGUMENT))
def test_integer_dtype_arguments_raise_like_cpu(case):
    assert_same_error(DTYPE_ARGUMENT[case])


@pytest.mark.parametrize("case", BOOL_ONLY, ids=list(BOOL_ONLY))
def test_bool_inputs_raise_like_cpu(case):
    x = X.to(b8)
    assert_same_error(lambda d: BOOL_ONLY[case](x.to(d)))


# -- 3. convolution arguments --------------------------------------------------------------------------
def cv(
    x, w, b=None, stride=(1,), padding=(0,), dilation=(1,), transposed=False, output_padding=(0,), groups=1
):
    """aten::convolution on device d, with list arguments as given (no expansion by F.conv*)."""
    return lambda d: conv(
        *on(d, x, w, b), list(stride), list(padding), list(dilation), transposed, list(output_padding), groups
    )


X1, W1, X2, W2 = t(1, 3, 6), t(2, 3, 2), t(1, 3, 5, 5), t(4, 3, 2, 2)
WT1 = W1.transpose(0, 1).contiguous()  # (in=3, out/groups=2, k=2)
TWO = {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "output_padding": (0, 0)}
THREE = {"stride": (1, 1, 1), "padding": (0, 0, 0), "dilation": (1, 1, 1), "output_padding": (0, 0, 0)}
CONV = {
    "conv1d padding=-1": lambda d: F.conv1d(*on(d, X1, W1), padding=-1),
    "conv2d padding=(-1, 0)": lambda d: F.conv2d(*on(d, X2, W2), padding=(-1, 0)),
    "conv2d padding=(0, -2)": lambda d: F.conv2d(*on(d, X2, W2), padding=(0, -2)),
    "conv_transpose1d padding=-1": lambda d: F.conv_transpose1d(*on(d, X1, WT1), padding=-1),
    "conv_transpose1d output_padding=-1": lambda d: F.conv_transpose1d(
        *on(d, X1, WT1), stride=2, output_padding=-1
    ),
    "conv output_padding=-1 (not transposed)": cv(X1, W1, output_padding=(-1,)),
    "conv1d stride=0": lambda d: F.conv1d(*on(d, X1, W1), stride=0),
    "conv1d stride=-1": lambda d: F.conv1d(*on(d, X1, W1), stride=-1),
    "conv2d stride=(1, 0)": lambda d: F.conv2d(*on(d, X2, W2), stride=(1, 0)),
    "conv_transpose1d stride=0": lambda d: F.conv_transpose1d(*on(d, X1, WT1), stride=0),
    "conv1d dilation=-1": lambda d: F.conv1d(*on(d, X1, W1), dilation=-1),
    "conv1d dilation=0": lambda d: F.conv1d(*on(d, X1, W1), dilation=0),
    "conv1d dilation=0, batch 20 (oneDNN)": lambda d: F.conv1d(*on(d, t(20, 3, 6), W1), dilation=0),
    "conv2d dilation=(1, 0) grouped (oneDNN)": lambda d: F.conv2d(
        *on(d, t(1, 4, 5, 5), t(2, 2, 2, 2)), dilation=(1, 0), groups=2
    ),
    "conv3d dilation=(1, 0, 1)": lambda d: F.conv3d(
        *on(d, t(1, 3, 5, 5, 5), t(2, 3, 2, 2, 2)), dilation=(1, 0, 1)
    ),
    "conv_transpose1d dilation=0": lambda d: F.conv_transpose1d(*on(d, X1, WT1), dilation=0),
    "conv_transpose3d dilation=(1, 0, 1)": cv(
        t(1, 3, 4, 4, 4), t(3, 2, 2, 2, 2), transposed=True, **{**THREE, "dilation": (1, 0, 1)}
    ),
    "conv_transpose1d output_padding >= stride": lambda d: F.conv_transpose1d(
        *on(d, X1, WT1), output_padding=1
    ),
    "conv_transpose1d output_padding >= stride and dilation": lambda d: F.conv_transpose1d(
        *on(d, X1, WT1), stride=2, dilation=2, output_padding=2
    ),
    "conv_transpose2d output_padding (1, 1), stride (2, 1)": lambda d: F.conv_transpose2d(
        *on(d, X2, W2.transpose(0, 1).contiguous()), stride=(2, 1), output_padding=(1, 1)
    ),
    "conv_transpose3d output_padding": lambda d: F.conv_transpose3d(
        *on(d, t(1, 3, 3, 3, 3), t(3, 2, 2, 2, 2)), output_padding=(0, 0, 1)
    ),
    "conv_transpose2d output_padding, batch 32": cv(
        t(32, 3, 16, 16), t(3, 2, 5, 5), transposed=True, **{**TWO, "output_padding": (1, 0)}
    ),
    "conv_transpose output_padding with mixed dtypes": cv(
        X1, WT1.bfloat16(), transposed=True, output_padding=(1,)
    ),
    "conv_transpose2d output too small": cv(
        t(1, 3, 2, 2), t(3, 2, 2, 2), transposed=True, **{**TWO, "padding": (3, 0)}
    ),
    "conv_transpose1d output too small": lambda d: F.conv_transpose1d(*on(d, X1, WT1), padding=5),
    "conv1d groups=0": lambda d: F.conv1d(*on(d, X1, W1), groups=0),
    "conv1d groups=-1": lambda d: F.conv1d(*on(d, X1, W1), groups=-1),
    "conv1d groups > out channels": lambda d: F.conv1d(*on(d, X1, W1), groups=3),
    "conv1d groups not dividing out channels": lambda d: F.conv1d(*on(d, t(1, 4, 5), t(3, 2, 2)), groups=2),
    "conv1d groups not dividing in channels": lambda d: F.conv1d(*on(d, t(1, 4, 5), t(4, 2, 2)), groups=3),
    "conv_transpose1d groups not dividing": lambda d: F.conv_transpose1d(*on(d, X1, WT1), groups=2),
    "conv1d input channels": lambda d: F.conv1d(*on(d, t(1, 4, 5), W1)),
    "conv_transpose1d input channels": lambda d: F.conv_transpose1d(*on(d, X1, W1)),
    "conv1d bias size": lambda d: F.conv1d(*on(d, X1, W1, t(3))),
    "conv 2-d bias": cv(X1, W1, t(2, 1)),
    "conv 0-d bias": cv(X1, W1, torch.tensor(1.0)),
    "conv_transpose1d bias size": lambda d: F.conv_transpose1d(*on(d, X1, WT1, t(3))),
    "conv1d kernel larger than input": lambda d: F.conv1d(*on(d, t(1, 3, 2), t(2, 3, 3))),
    "conv1d dilated kernel larger than input": lambda d: F.conv1d(*on(d, t(1, 3, 4), t(2, 3, 3)), dilation=2),
    "conv2d kernel larger than padded input": lambda d: F.conv2d(
        *on(d, t(1, 3, 2, 5), t(2, 3, 5, 3)), padding=(1, 0)
    ),
    "conv2d with 3-d weight": lambda d: F.conv2d(*on(d, X2, W1)),
    "conv2d with 5-d weight": lambda d: F.conv2d(*on(d, X2, t(2, 3, 1, 1, 1))),
    "conv1d with 2-d weight": lambda d: F.conv1d(*on(d, X1, t(2, 3))),
    "conv with 1-d weight": cv(X1, t(2)),
    "conv 3-d weight, 4-d input": cv(X2, W1),
    "conv 4-d weight, 3-d input": cv(X1, W2, **TWO),
    "conv 2-d input": cv(t(3, 6), W1),
    "conv2d with 2-d input": lambda d: F.conv2d(*on(d, t(5, 5), W2)),
    "conv1d stride list of 2": lambda d: F.conv1d(*on(d, X1, W1), stride=(1, 1)),
    "conv1d padding list of 2": lambda d: F.conv1d(*on(d, X1, W1), padding=(1, 1)),
    "conv empty stride list": cv(X1, W1, stride=()),
    "conv output_padding list of 2": cv(X1, W1, output_padding=(0, 0)),
    "conv spatial size 0": cv(t(1, 3, 0), t(2, 3, 1), padding=(1,)),
    "conv_transpose spatial size 0": cv(t(1, 3, 0), WT1, transposed=True),
    "conv1d padding='same' with stride": lambda d: F.conv1d(*on(d, X1, W1), padding="same", stride=2),
    "conv bool": cv(X1.bool(), W1.bool()),
    "conv2d dilated bool": cv(X2.bool(), W2.bool(), **{**TWO, "dilation": (2, 2)}),
    "conv3d bool": cv(t(1, 3, 4, 4, 4, dtype=b8), t(2, 3, 2, 2, 2, dtype=b8), **THREE),
    "conv_transpose1d bool": cv(X1.bool(), WT1.bool(), transposed=True),
    "conv i64 input f32 weight": cv(X1.long(), W1),
    "conv3d dilated f32 input f64 weight": cv(
        t(1, 3, 5, 5, 5), t(2, 3, 2, 2, 2, dtype=f64), **{**THREE, "dilation": (2, 1, 1)}
    ),
    "conv2d batch 20 f32 input, f64 weight (oneDNN)": cv(t(20, 3, 6, 6), t(2, 3, 2, 2, dtype=f64), **TWO),
    "conv2d batch 1, 4x4 kernel, f64 weight (oneDNN)": cv(t(1, 3, 8, 8), t(2, 3, 4, 4, dtype=f64), **TWO),
    "conv_transpose2d batch 20, f64 weight (oneDNN)": cv(
        t(20, 3, 2, 2), t(3, 2, 2, 2, dtype=f64), transposed=True, **TWO
    ),
}


@pytest.mark.parametrize("case", CONV, ids=list(CONV))
def test_convolution_arguments_raise_like_cpu(case):
    assert_same_error(CONV[case])


# -- valid inputs: no false positives ------------------------------------------------------------------
VALID = {
    "mm bf16": lambda d: torch.mm(*on(d, A.bfloat16(), B16)),
    "mm f64": lambda d: torch.mm(*on(d, A.double(), B64)),
    "mm int64": lambda d: torch.mm(*on(d, A.long(), B64.long())),
    "mm complex64": lambda d: torch.mm(*on(d, A.cfloat(), B64.cfloat())),
    "mm empty": lambda d: torch.mm(*on(d, t(0, 4), t(4, 5))),
    "mm bool, empty product": lambda d: torch.mm(*on(d, t(2, 0, dtype=b8), t(0, 2, dtype=b8))),
    "mm bool, no rows": lambda d: torch.mm(*on(d, t(0, 3, dtype=b8), t(3, 2, dtype=b8))),
    "bmm bool, empty batch": lambda d: torch.bmm(*on(d, t(0, 2, 3, dtype=b8), t(0, 3, 2, dtype=b8))),
    "mv bool, no rows": lambda d: torch.mv(*on(d, t(0, 3, dtype=b8), t(3, dtype=b8))),
    "addmv bool, no rows": lambda d: torch.addmv(*on(d, t(0, dtype=b8), t(0, 3, dtype=b8), t(3, dtype=b8))),
    "matmul batched bf16": lambda d: t(2, 3, 4, dtype=bf16).to(d) @ t(2, 4, 5, dtype=bf16).to(d),
    "linear bf16 with bf16 weights": lambda d: F.linear(*on(d, A.bfloat16(), B16.t(), t(5, dtype=bf16))),
    "linear f64": lambda d: F.linear(*on(d, A.double(), B64.t(), t(5, dtype=f64))),
    "addmm bf16": lambda d: torch.addmm(*on(d, t(5, dtype=bf16), A.bfloat16(), B16)),
    "baddbmm f64": lambda d: torch.baddbmm(*on(d, t(1, 3, 5, dtype=f64), A[None].double(), B64[None])),
    "addbmm empty batch, mixed": lambda d: torch.addbmm(*on(d, t(3, 5, dtype=bf16), t(0, 3, 4), t(0, 4, 5))),
    "addmv int": lambda d: torch.addmv(*on(d, t(3, dtype=i64), A.long(), t(4, dtype=i64))),
    "addr mixed": lambda d: torch.addr(*on(d, t(3, 3), t(3, dtype=bf16), t(3))),
    "dot f64": lambda d: torch.dot(*on(d, t(4, dtype=f64), t(4, dtype=f64))),
    "outer mixed": lambda d: torch.outer(*on(d, t(4), t(4, dtype=f64))),
    "layer_norm bf16 input, f32 params": lambda d: F.layer_norm(*on(d, A.bfloat16(), (4,), t(4), t(4))),
    "layer_norm f16 input, f32 weight": lambda d: F.layer_norm(*on(d, A.half(), (4,), t(4))),
    "layer_norm bf16 with bf16 params": lambda d: F.layer_norm(
        *on(d, A.bfloat16(), (4,), t(4, dtype=bf16), t(4, dtype=bf16))
    ),
    "layer_norm f64": lambda d: F.layer_norm(*on(d, A.double(), (4,), t(4, dtype=f64), t(4, dtype=f64))),
    "layer_norm no params": lambda d: F.layer_norm(A.to(d), (4,)),
    "layer_norm empty": lambda d: F.layer_norm(t(0, 4).to(d), (4,)),
    "group_norm bf16 input, f32 params": lambda d: F.group_norm(
        *on(d, t(2, 4, 3, dtype=bf16), 2, t(4), t(4))
    ),
    "rms_norm f32 input, bf16 weight": lambda d: F.rms_norm(*on(d, A, (4,), t(4, dtype=bf16))),
    "rms_norm bf16": lambda d: F.rms_norm(*on(d, A.bfloat16(), (4,), t(4, dtype=bf16))),
    "softmax int input with float dtype": lambda d: F.softmax(X.long().to(d), 1, dtype=f32),
    "softmax empty int": lambda d: torch._softmax(t(0, 3, dtype=i64).to(d), 1, False),
    "softmax bf16": lambda d: F.softmax(X.bfloat16().to(d), 0),
    "log_softmax 0-d": lambda d: F.log_softmax(torch.tensor(2.0).to(d), 0),
    "std complex": lambda d: t(3, dtype=torch.complex64).to(d).std(),
    "var f64": lambda d: torch.var_mean(X.double().to(d), 1),
    "mean int with float dtype": lambda d: X.long().to(d).mean(dtype=f32),
    "mean bool with f64 dtype": lambda d: X.bool().to(d).mean(dtype=f64),
    "vector_norm bf16 with f32 dtype": lambda d: torch.linalg.vector_norm(X.bfloat16().to(d), dtype=f32),
    "gelu bf16": lambda d: F.gelu(X.bfloat16().to(d)),
    "silu f64": lambda d: F.silu(X.double().to(d)),
    "hypot int and float": lambda d: torch.hypot(*on(d, X.long(), X)),
    "hypot float and int 0-d": lambda d: torch.hypot(*on(d, X, torch.tensor(2))),
    "logaddexp f16": lambda d: torch.logaddexp(*on(d, X.half(), X.half())),
    "mse_loss float input, int target": lambda d: F.mse_loss(*on(d, X, X.long())),
    "lerp 0-d f64 weight": lambda d: torch.lerp(*on(d, A, A, torch.tensor(0.5, dtype=f64))),
    "lerp bf16": lambda d: torch.lerp(*on(d, A.bfloat16(), A.bfloat16(), 0.25)),
    "addcmul int": lambda d: torch.addcmul(*on(d, X.long(), X.long(), X.long())),
    "addcdiv float": lambda d: torch.addcdiv(*on(d, X, X, X.abs() + 1)),
    "abs int": lambda d: torch.abs(X.long().to(d)),
    "ceil int": lambda d: torch.ceil(X.long().to(d)),
    "argmax int": lambda d: X.long().to(d).argmax(),
    "threshold int": lambda d: F.threshold(X.long().to(d), 0, 1),
    "index_add f64": lambda d: (
        t(4, 3, dtype=f64).to(d).index_add(0, *on(d, torch.tensor([0, 2]), t(2, 3, dtype=f64)))
    ),
    "index_put bool mask": lambda d: t(4, 3).to(d).index_put(*on(d, (t(4, 3).to(d) > 0,), torch.tensor(1.0))),
    "index_copy bf16": lambda d: (
        t(4, 3, dtype=bf16).to(d).index_copy(0, *on(d, torch.tensor([0, 2]), t(2, 3, dtype=bf16)))
    ),
    "cross_entropy probabilities bf16": lambda d: F.cross_entropy(
        *on(d, t(4, 3), t(4, 3, dtype=bf16).softmax(1))
    ),
    "binary_cross_entropy_with_logits f64 target": lambda d: F.binary_cross_entropy_with_logits(
        *on(d, t(4), t(4, dtype=f64).sigmoid())
    ),
    "embedding int32 indices": lambda d: F.embedding(*on(d, torch.tensor([1, 2], dtype=i32), A)),
    "embedding_bag per_sample_weights": lambda d: F.embedding_bag(
        *on(d, torch.tensor([0, 2]), t(4, 3), torch.tensor([0])), per_sample_weights=t(2).to(d), mode="sum"
    ),
    "grid_sample f64": lambda d: F.grid_sample(
        *on(d, t(1, 1, 4, 3, dtype=f64), torch.zeros(1, 1, 1, 2, dtype=f64)), align_corners=False
    ),
    "complex f64": lambda d: torch.complex(*on(d, t(3, dtype=f64), t(3, dtype=f64))),
    "conv1d": lambda d: F.conv1d(*on(d, X1, W1, t(2)), padding=1),
    "conv1d unbatched": lambda d: F.conv1d(*on(d, X1[0], W1)),
    "conv1d padding='same'": lambda d: F.conv1d(*on(d, X1, W1), padding="same"),
    "conv2d bf16 with bf16 weights": lambda d: F.conv2d(
        *on(d, t(2, 3, 8, 8, dtype=bf16), t(4, 3, 3, 3, dtype=bf16), t(4, dtype=bf16)), padding=1
    ),
    "conv2d f64 strided dilated": lambda d: F.conv2d(
        *on(d, t(2, 3, 9, 9, dtype=f64), t(4, 3, 3, 3, dtype=f64)), stride=2, dilation=2
    ),
    "conv2d depthwise": lambda d: F.conv2d(*on(d, t(1, 4, 6, 6), t(8, 1, 3, 3)), padding=1, groups=4),
    "conv2d stride given once": cv(
        t(1, 3, 6, 6), t(2, 3, 3, 3), stride=(2,), padding=(1,), dilation=(1,), output_padding=(0,)
    ),
    "conv3d": lambda d: F.conv3d(
        *on(d, t(1, 2, 4, 4, 4), t(2, 2, 2, 2, 2), t(2)), stride=(1, 2, 1), padding=1
    ),
    "conv int64": cv(X1.long(), W1.long()),
    "conv complex64": lambda d: F.conv1d(*on(d, X1.cfloat(), W1.cfloat())),
    "conv f32 with f64 bias (CPU's slow path allows it)": cv(X1, W1, t(2, dtype=f64)),
    "conv nonzero output_padding, not transposed": cv(X1, W1, output_padding=(1,)),
    "conv empty batch": cv(t(0, 3, 6), W1),
    "conv_transpose1d": lambda d: F.conv_transpose1d(
        *on(d, t(2, 3, 6), WT1, t(2)), stride=2, padding=1, output_padding=1, dilation=2
    ),
    "conv_transpose1d output_padding < dilation": lambda d: F.conv_transpose1d(
        *on(d, X1, WT1), dilation=2, output_padding=1
    ),
    "conv_transpose2d grouped": lambda d: F.conv_transpose2d(
        *on(d, t(2, 4, 5, 5), t(4, 3, 3, 3), t(6)),
        stride=(2, 1),
        padding=(1, 0),
        output_padding=(1, 0),
        groups=2,
        dilation=(1, 2),
    ),
    "conv_transpose2d bf16": lambda d: F.conv_transpose2d(
        *on(d, t(1, 3, 4, 4, dtype=bf16), t(3, 2, 2, 2, dtype=bf16)), stride=2
    ),
    "conv_transpose empty batch, big output_padding": cv(
        t(0, 3, 6), WT1, transposed=True, output_padding=(1,)
    ),
    "conv_transpose1d f32 with bf16 bias": cv(X1, WT1, t(2, dtype=bf16), transposed=True),
}


@pytest.mark.parametrize("case", VALID, ids=list(VALID))
def test_valid_inputs_match_cpu(case):
    assert_same_result(VALID[case])


def test_checks_run_in_every_eager_mode():
    """The checks run before the meta kernel, so DeferAndFuse raises at the call, not at the flush."""
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        a, b = A.to("tpu"), B16.to("tpu")
        with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
            torch.mm(a, b)
        with pytest.raises(RuntimeError, match="negative padding is not supported"):
            F.conv1d(*on("tpu", X1, W1), padding=-1)
        assert_same_result(lambda d: torch.mm(*on(d, A, B64.float())))
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def test_in_place_and_out_variants_run_the_functional_checks():
    assert_same_error(lambda d: torch.zeros(3, 5, device=d).addmm_(*on(d, A, B16)))
    assert_same_error(lambda d: torch.mm(*on(d, A, B16), out=torch.empty(3, 5, device=d)))
    assert_same_error(lambda d: F.silu(X.long().to(d), inplace=True))
    assert_same_error(
        lambda d: torch.ones(2, 3, dtype=i64, device=d).hypot_(torch.ones(2, 3, dtype=i64, device=d))
    )


# -- scaled_dot_product_attention ------------------------------------------------------------------------
Q = t(1, 2, 3, 4)
SDPA = {
    "key bf16": (Q, Q.bfloat16(), Q, None),
    "value f64": (Q, Q, Q.double(), None),
    "3-d, query bf16": (Q[0].bfloat16(), Q[0], Q[0], None),
    "mask bf16 with f32 query": (Q, Q, Q, t(3, 3, dtype=bf16)),
    "mask int64": (Q, Q, Q, t(3, 3, dtype=i64)),
    "mask f16 with bf16 query": (Q.bfloat16(), Q.bfloat16(), Q.bfloat16(), t(3, 3, dtype=f16)),
    "int64": (Q.long(), Q.long(), Q.long(), None),
    "bool": (Q.bool(), Q.bool(), Q.bool(), None),
    "1-d": (Q[0, 0, 0], Q[0, 0, 0], Q[0, 0, 0], None),
}
SDPA_OK = {
    "bf16 query, f32 mask": (Q.bfloat16(), Q.bfloat16(), Q.bfloat16(), t(3, 3)),
    "bool mask": (Q, Q, Q, t(3, 3, dtype=b8)),
    "f64": (Q.double(), Q.double(), Q.double(), None),
    "empty int64": (Q[:0].long(), Q[:0].long(), Q[:0].long(), None),
}


def _sdpa_checks():
    arg_checks.load_all()
    return arg_checks.for_op(torch.ops.aten.scaled_dot_product_attention.default)[0]


@pytest.mark.parametrize("case", SDPA, ids=list(SDPA))
def test_sdpa_check_raises_like_cpu(case):
    """The registered check itself, called as the tpu kernel of F.scaled_dot_product_attention would."""
    (check,) = _sdpa_checks()
    q, k, v, mask = SDPA[case]

    def run(d):
        args = on(d, q, k, v, mask)
        if d == "tpu":
            check(*args, 0.0, False, None, False)
        return F.scaled_dot_product_attention(*args)

    assert_same_error(run)


@pytest.mark.parametrize("case", SDPA_OK, ids=list(SDPA_OK))
def test_sdpa_check_accepts_what_cpu_accepts(case):
    (check,) = _sdpa_checks()
    q, k, v, mask = SDPA_OK[case]
    check(*on("tpu", q, k, v, mask), 0.0, False, None, False)
    F.scaled_dot_product_attention(*on("cpu", q, k, v, mask))


@pytest.mark.parametrize("case", ["key bf16", "mask bf16 with f32 query", "int64"])
def test_sdpa_raises_like_cpu(case):
    q, k, v, mask = SDPA[case]
    assert_same_error(lambda d: F.scaled_dot_product_attention(*on(d, q, k, v, mask)))


# -- batch norm: host kernels run the checks too (dispatch.host_kernel) ----------------------------------
def _bn(x_dtype, affine_dtype, stats_dtype, training):
    def run(d):
        x = t(4, 3, 5, dtype=x_dtype).to(d)
        w, b = (t(3, dtype=affine_dtype, seed=s).to(d) for s in (1, 2)) if affine_dtype else (None, None)
        stats = (
            (torch.zeros(3, dtype=stats_dtype), torch.ones(3, dtype=stats_dtype))
            if stats_dtype
            else (None,) * 2
        )
        return F.batch_norm(x, *on(d, *stats), weight=w, bias=b, training=training)

    return run


BN_ERRORS = {
    "int64 input": _bn(i64, None, None, True),
    "bool input": _bn(b8, None, None, True),
    "f32 input, bf16 weight": _bn(f32, bf16, None, True),
    "f32 input, f64 weight and stats, eval": _bn(f32, f64, f64, False),
    "f64 input, f32 weight": _bn(f64, f32, None, True),
    "f64 input, f32 weight and stats": _bn(f64, f32, f32, True),
    "bf16 input, f16 weight": _bn(bf16, f16, None, True),
    "f32 input and weight, f64 stats": _bn(f32, f32, f64, True),
    "bf16 input and weight, f32 stats, eval": _bn(bf16, bf16, f32, False),
    "instance_norm int64": lambda d: F.instance_norm(t(4, 3, 5, dtype=i64).to(d)),
    "instance_norm f32 input, bf16 weight": lambda d: F.instance_norm(
        t(4, 3, 5).to(d), weight=t(3, dtype=bf16).to(d)
    ),
}
BN_VALID = {
    "bf16 input, f32 weight and stats": _bn(bf16, f32, f32, True),
    "f16 input, f32 weight, eval": _bn(f16, f32, f32, False),
    "f64 throughout": _bn(f64, f64, f64, True),
    "f32 no affine": _bn(f32, None, f32, False),
}


@pytest.mark.parametrize("case", BN_ERRORS, ids=list(BN_ERRORS))
def test_batch_norm_dtypes_raise_like_cpu(case):
    assert_same_error(BN_ERRORS[case])


@pytest.mark.parametrize("case", BN_VALID, ids=list(BN_VALID))
def test_batch_norm_mixed_precision_cpu_allows_matches_cpu(case):
    assert_same_result(BN_VALID[case])

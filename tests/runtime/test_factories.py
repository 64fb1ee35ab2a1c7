"""Factory ops on the tpu device compared with CPU PyTorch: values, dtypes, shapes, errors, out=."""

from __future__ import annotations

import pytest
import torch

DEV = "tpu"


def check(fn, exact: bool = False):
    """fn(device) on tpu equals fn on cpu (dtype, shape, values)."""
    want = fn("cpu")
    got = fn(DEV)
    assert got.device.type == DEV
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        assert torch.equal(got.cpu(), want)
    else:
        torch.testing.assert_close(got.cpu(), want)


ARANGE = {
    "end_int": lambda d: torch.arange(5, device=d),
    "end_float": lambda d: torch.arange(5.0, device=d),
    "start_end": lambda d: torch.arange(2, 7, device=d),
    "int_start_float_end": lambda d: torch.arange(0, 5.0, device=d),  # dtype from the scalars
    "float_step": lambda d: torch.arange(1, 2.5, 0.1, device=d),
    "negative_step": lambda d: torch.arange(5, 0, -1.5, device=d),
    "empty": lambda d: torch.arange(0, device=d),
    "int32": lambda d: torch.arange(-3, 3, dtype=torch.int32, device=d),
    "bf16": lambda d: torch.arange(0, 3, 0.25, dtype=torch.bfloat16, device=d),
    "f16": lambda d: torch.arange(10, dtype=torch.float16, device=d),
    "f64": lambda d: torch.arange(0, 1, 0.1, dtype=torch.float64, device=d),
    "int_dtype_float_bounds": lambda d: torch.arange(0.5, 7.9, 2, dtype=torch.int64, device=d),
    "long": lambda d: torch.arange(2**40, 2**40 + 5, device=d),
}


@pytest.mark.parametrize("name", sorted(ARANGE))
def test_arange_matches_cpu(name):
    check(ARANGE[name], exact=name not in ("float_step", "f64"))


def test_arange_errors_match_cpu():
    for args in [(0, 5, 0), (0, 5, -1)]:
        with pytest.raises(RuntimeError) as cpu_err:
            torch.arange(*args)
        with pytest.raises(RuntimeError) as tpu_err:
            torch.arange(*args, device=DEV)
        assert str(cpu_err.value).split("\n")[0] in str(tpu_err.value)


def test_arange_out():
    out = torch.empty(0, device=DEV)
    res = torch.arange(0, 4, out=out)
    assert res is out and torch.equal(out.cpu(), torch.arange(0.0, 4.0))
    out = torch.empty(9, dtype=torch.int32, device=DEV)
    torch.arange(3, out=out)
    assert out.shape == (3,) and torch.equal(out.cpu(), torch.arange(3, dtype=torch.int32))


LINSPACE = {
    "unit": lambda d: torch.linspace(0, 1, 5, device=d),
    "wide": lambda d: torch.linspace(-2, 10, 7, device=d),
    "reversed": lambda d: torch.linspace(10, 0, 6, device=d),
    "many": lambda d: torch.linspace(-1.5, 3.25, 1001, device=d),
    "one": lambda d: torch.linspace(3, 10, 1, device=d),
    "zero": lambda d: torch.linspace(3, 10, 0, device=d),
    "int64": lambda d: torch.linspace(0, 10, 4, dtype=torch.int64, device=d),
    "int32_neg": lambda d: torch.linspace(-7, 8, 6, dtype=torch.int32, device=d),
    "bf16": lambda d: torch.linspace(0, 1, 50, dtype=torch.bfloat16, device=d),
    "f16": lambda d: torch.linspace(-3, 3, 9, dtype=torch.float16, device=d),
    "f64": lambda d: torch.linspace(0, 1, 7, dtype=torch.float64, device=d),
    "tensor_bounds": lambda d: torch.linspace(torch.tensor(0.5, device=d), torch.tensor(2.0, device=d), 4),
}


@pytest.mark.parametrize("name", sorted(LINSPACE))
def test_linspace_matches_cpu(name):
    # linspace steps from both ends, like PyTorch: the endpoints are exact
    check(LINSPACE[name], exact=name in ("unit", "one", "zero", "int64", "int32_neg", "bf16", "f16"))
    got = LINSPACE[name](DEV).cpu()
    if got.numel() > 1:
        assert got[-1] == LINSPACE[name]("cpu")[-1]


LOGSPACE = {
    "base10": lambda d: torch.logspace(0, 3, 4, device=d),
    "base2": lambda d: torch.logspace(0, 3, 4, base=2, device=d),
    "f64": lambda d: torch.logspace(-1, 1, 5, dtype=torch.float64, device=d),
    "int64": lambda d: torch.logspace(0, 2, 3, dtype=torch.int64, device=d),
    "one": lambda d: torch.logspace(2, 5, 1, device=d),
    "bf16": lambda d: torch.logspace(0, 1, 6, dtype=torch.bfloat16, device=d),
}


@pytest.mark.parametrize("name", sorted(LOGSPACE))
def test_logspace_matches_cpu(name):
    check(LOGSPACE[name])


def test_linspace_logspace_out():
    out = torch.empty(2, device=DEV)
    torch.linspace(0, 1, 5, out=out)
    assert torch.equal(out.cpu(), torch.linspace(0, 1, 5))
    out = torch.empty(0, dtype=torch.float64, device=DEV)
    torch.logspace(0, 2, 3, out=out)
    assert torch.equal(out.cpu(), torch.logspace(0, 2, 3, dtype=torch.float64))


EYE = {
    "square": lambda d: torch.eye(3, device=d),
    "rect": lambda d: torch.eye(2, 4, device=d),
    "tall": lambda d: torch.eye(4, 2, device=d),
    "bool": lambda d: torch.eye(3, dtype=torch.bool, device=d),
    "int32": lambda d: torch.eye(3, dtype=torch.int32, device=d),
    "bf16": lambda d: torch.eye(2, dtype=torch.bfloat16, device=d),
    "empty": lambda d: torch.eye(0, device=d),
}


@pytest.mark.parametrize("name", sorted(EYE))
def test_eye_matches_cpu(name):
    check(EYE[name], exact=True)


def test_eye_out():
    out = torch.empty(1, device=DEV)
    torch.eye(2, out=out)
    assert torch.equal(out.cpu(), torch.eye(2))
    out = torch.empty(1, dtype=torch.int64, device=DEV)
    torch.eye(2, 3, out=out)
    assert torch.equal(out.cpu(), torch.eye(2, 3, dtype=torch.int64))


TRI = [(3, 4, 1), (4, 3, -1), (3, 3, 0), (0, 3, 0), (3, 4, 10), (3, 4, -10), (5, 5, 2)]


@pytest.mark.parametrize("row,col,offset", TRI)
@pytest.mark.parametrize("which", ["tril_indices", "triu_indices"])
def test_triangle_indices_match_cpu(which, row, col, offset):
    fn = getattr(torch, which)
    check(lambda d: fn(row, col, offset, device=d), exact=True)


def test_triangle_indices_dtype():
    check(lambda d: torch.tril_indices(4, 4, dtype=torch.int32, device=d), exact=True)


def test_complex_and_polar():
    re = torch.tensor([1.0, -2.0, 0.5])
    im = torch.tensor([0.0, 3.0, -1.5])
    check(lambda d: torch.complex(re.to(d), im.to(d)), exact=True)
    check(lambda d: torch.complex(re.double().to(d), im.double().to(d)), exact=True)
    check(lambda d: torch.polar(re.abs().to(d), im.to(d)))
    out = torch.empty(3, dtype=torch.complex64, device=DEV)
    torch.complex(re.to(DEV), im.to(DEV), out=out)
    assert torch.equal(out.cpu(), torch.complex(re, im))


BASE = torch.arange(6.0).reshape(2, 3)
COMPOSITES = {
    "full_float": lambda d: torch.full((2, 3), 2.5, device=d),
    "full_int": lambda d: torch.full((4,), 7, device=d),
    "full_bool": lambda d: torch.full((2,), True, device=d),
    "full_bf16": lambda d: torch.full((3,), 1.1, dtype=torch.bfloat16, device=d),
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_int": lambda d: torch.ones(4, dtype=torch.int32, device=d),
    "scalar_tensor": lambda d: torch.scalar_tensor(3.5, device=d),
    "scalar_tensor_int": lambda d: torch.scalar_tensor(3, dtype=torch.int64, device=d),
    "zeros_like": lambda d: torch.zeros_like(BASE.to(d)),
    "ones_like": lambda d: torch.ones_like(BASE.to(d), dtype=torch.int32),
    "full_like": lambda d: torch.full_like(BASE.to(d), -1.25),
    "new_full": lambda d: BASE.to(d).new_full((3,), 4),
    "new_zeros": lambda d: BASE.to(d).new_zeros((2, 2)),
    "new_ones": lambda d: BASE.to(d).new_ones((5,), dtype=torch.float16),
    "tensor": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "tensor_bf16": lambda d: torch.tensor([1.5, -2.25], dtype=torch.bfloat16, device=d),
    "tensor_bool": lambda d: torch.tensor([True, False], device=d),
    "tensor_scalar": lambda d: torch.tensor(3.0, device=d),
    "as_tensor": lambda d: torch.as_tensor([1.0, 2.0], device=d),
    "lift_fresh_copy": lambda d: torch.ops.aten.lift_fresh_copy(BASE.to(d)),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_factories_match_cpu(name):
    check(COMPOSITES[name], exact=True)


def test_empty_factories_shape_and_dtype():
    base = torch.zeros(2, 3, device=DEV, dtype=torch.float16)
    for t, shape, dtype in [
        (torch.empty_like(base), (2, 3), torch.float16),
        (base.new_empty((4,)), (4,), torch.float16),
        (torch.empty(3, 2, device=DEV, dtype=torch.int8), (3, 2), torch.int8),
    ]:
        assert t.device.type == DEV and t.shape == shape and t.dtype == dtype


def test_lift_fresh_returns_the_same_tensor():
    t = torch.ones(3, device=DEV)
    assert torch.ops.aten.lift_fresh(t) is t


def test_default_dtype_change_reaches_cached_factories():
    torch.linspace(0, 1, 3, device=DEV)  # cached under the float32 default
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.linspace(0, 1, 3, device=DEV).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)

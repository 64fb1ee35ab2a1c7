"""linspace/logspace lowerings reproduce CPU PyTorch's range kernels bit for bit.

tests/runtime/test_factories.py covers the factories broadly; these are the arithmetic details that
once differed: XLA's `x / c -> x * (1 / c)` rewrite (one ulp off, enough to truncate an integer linspace
to the wrong value), and logspace computing its step and power in double from ends rounded to the output
dtype (bf16, integers), as CPU's kernel does.
"""

from __future__ import annotations

import random

import pytest
import torch


def check_exact(fn):
    """fn(device) gives the same dtype, shape and bits on tpu as on CPU."""
    want = fn("cpu")
    got = fn("tpu")
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want), f"{got.cpu().tolist()} != {want.tolist()}"


# integer linspace truncates start + step * i: exactly representable steps must stay exact
LINSPACE_INT = [(50, 1, 50), (1, 50, 50), (0, 98, 50), (-7, 8, 6), (3, 40, 38), (100, -1, 102)]


@pytest.mark.parametrize("start, end, steps", LINSPACE_INT)
def test_integer_linspace_is_exact(start, end, steps):
    check_exact(lambda d: torch.linspace(start, end, steps, dtype=torch.int64, device=d))
    check_exact(lambda d: torch.linspace(start, end, steps, dtype=torch.int32, device=d))


def test_linspace_tensor_bounds_integer():
    def fn(d):
        return torch.linspace(torch.tensor(50, device=d), torch.tensor(1, device=d), 50, dtype=torch.int64)

    check_exact(fn)


LOGSPACE = [
    (0, 4, 4, 10.0),  # step 4/3 in double, not rounded to bf16
    (4.3, 1.2, 4, 10.0),  # ends rounded to bf16 first, then subtracted in bf16
    (4.3, 4, 4, 5.0),
    (-2.5, 1.75, 7, 2.0),
    (0, 3, 7, 10.0),
]


@pytest.mark.parametrize("start, end, steps, base", LOGSPACE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.int32])
def test_logspace_matches_cpu_kernel(start, end, steps, base, dtype):
    check_exact(lambda d: torch.logspace(start, end, steps, base, dtype=dtype, device=d))


def test_logspace_tensor_bounds_and_complex():
    def fn(d):
        return torch.logspace(torch.tensor(0.0, device=d), 4, 4, dtype=torch.bfloat16, device=d)

    check_exact(fn)
    want = torch.logspace(0, 2, 5, dtype=torch.complex64)
    got = torch.logspace(0, 2, 5, dtype=torch.complex64, device="tpu").cpu()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_linspace_rounds_once_as_cpu(dtype):
    """CPU's float32/float64 kernels round start + step*i once (fused): two roundings are one ulp off at
    about half of random ranges (linspace(-1, 2, 18) at indices 5, 6, 7, 10)."""
    check_exact(lambda d: torch.linspace(-1.0, 2.0, 18, dtype=dtype, device=d))
    rng = random.Random(0)
    for _ in range(60):
        start, end = rng.uniform(-100, 100), rng.uniform(-100, 100)
        steps = rng.randint(2, 300)
        check_exact(lambda d, a=start, b=end, n=steps: torch.linspace(a, b, n, dtype=dtype, device=d))

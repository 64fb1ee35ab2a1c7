"""CPU's data-dependent errors (arg_checks/values.py): raised in Debug mode, XLA semantics in Strict.

Each bad input is run on CPU first: the test asserts CPU raises the stated exception with the stated
text, then that tpu in Debug mode raises the same type with CPU's message (plus the op's name where CPU's
text lacks it), and that Strict mode does not raise but clamps/drops as XLA does (the values asserted
are what the lowerings give today, so a change in that behaviour is noticed).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

DEBUG = torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
STRICT = torch.tpu.EagerMode.DEFER_NEVER
NAN = float("nan")


def _x(d):
    return torch.arange(12.0, device=d).reshape(4, 3)


def _t(values, d, **kw):
    return torch.tensor(values, **kw).to(d)


def _z(*shape, d):
    return torch.zeros(*shape, device=d)


def _scatter_into(method, shape, *args):
    """An in-place op applied to a zero tensor of `shape`, returning that tensor."""

    def run(d):
        out = torch.zeros(*shape, device=d)
        getattr(out, method)(*[a(d) if callable(a) else a for a in args])
        return out

    return run


def _i(values):
    return lambda d: _t(values, d)


def _ones(*shape):
    return lambda d: torch.ones(*shape, device=d)


_ZERO_FLOAT = torch.zeros(4)
_ZERO_3x3 = torch.zeros(3, 3)


def _is(expected):
    """Strict result equals `expected` (NaN equal to NaN)."""

    def check(result):
        torch.testing.assert_close(result, expected, equal_nan=True)

    return check


def _shape(*shape, low=None, high=None):
    """Strict result of a random op: its shape, and its range where the sampler guarantees one."""

    def check(result):
        assert tuple(result.shape) == shape
        if low is not None:
            assert bool((result >= low).all()) and bool((result <= high).all()), result

    return check


# (id, fn(device), CPU's exception type, CPU's key text, Strict behaviour on tpu)
# fmt: off
BAD = [
    # -- indices along a dim: XLA clamps gathers and drops scatters; the lowerings wrap negatives ------
    ("index_select", lambda d: _x(d).index_select(0, _t([0, 7], d)), IndexError,
     "index out of range in self", _is(_x("cpu")[[0, 3]])),
    ("index_select_negative", lambda d: _x(d).index_select(0, _t([-1], d)), IndexError,
     "index out of range in self", _is(_x("cpu")[[3]])),
    ("index_select_dim1", lambda d: _x(d).index_select(1, _t([3], d)), RuntimeError,
     "INDICES element is out of DATA bounds, id=3 axis_dim=3", _is(_x("cpu")[:, [2]])),
    ("index_select_0d_index", lambda d: torch.arange(4.0, device=d).index_select(0, _t(4, d)), IndexError,
     "index out of range in self", _is(torch.tensor([3.0]))),
    ("gather", lambda d: _x(d).gather(0, _t([[0, 5, 1]], d)), RuntimeError,
     "index 5 is out of bounds for dimension 0 with size 4", _is(torch.tensor([[0.0, 10.0, 5.0]]))),
    ("gather_negative", lambda d: _x(d).gather(0, _t([[0, -1, 1]], d)), RuntimeError,
     "index -1 is out of bounds for dimension 0 with size 4", _is(torch.tensor([[0.0, 10.0, 5.0]]))),
    ("scatter_", _scatter_into("scatter_", (4,), 0, _i([9]), 1.0), RuntimeError,
     "index 9 is out of bounds for dimension 0 with size 4", _is(_ZERO_FLOAT)),
    ("scatter_negative", lambda d: _z(4, d=d).scatter(0, _t([-1], d), 1.0), RuntimeError,
     "index -1 is out of bounds for dimension 0 with size 4", _is(torch.tensor([0.0, 0, 0, 1]))),
    ("scatter_src", lambda d: _z(3, 3, d=d).scatter(1, _t([[5]], d), torch.ones(1, 1, device=d)),
     RuntimeError, "index 5 is out of bounds for dimension 1 with size 3", _is(_ZERO_3x3)),
    ("scatter_value_reduce", lambda d: _z(3, 3, d=d).scatter(1, _t([[5]], d), 2.0, reduce="multiply"),
     RuntimeError, "index 5 is out of bounds for dimension 1 with size 3", _is(_ZERO_3x3)),
    ("scatter_add", lambda d: _z(3, 3, d=d).scatter_add(1, _t([[5]], d), torch.ones(1, 1, device=d)),
     RuntimeError, "index 5 is out of bounds for dimension 1 with size 3", _is(_ZERO_3x3)),
    ("scatter_reduce",
     lambda d: _z(3, 3, d=d).scatter_reduce(1, _t([[5]], d), torch.ones(1, 1, device=d), "amax"),
     RuntimeError, "index 5 is out of bounds for dimension 1 with size 3", _is(_ZERO_3x3)),
    ("index_add_1d", lambda d: _z(3, d=d).index_add(0, _t([3], d), torch.ones(1, device=d)), IndexError,
     "index out of range in self", _is(torch.zeros(3))),
    ("index_add_2d", lambda d: _z(3, 4, d=d).index_add(0, _t([3], d), torch.ones(1, 4, device=d)),
     RuntimeError, "index 3 is out of bounds for dimension 0 with size 3", _is(torch.zeros(3, 4))),
    ("index_add__alpha",
     lambda d: _z(3, 4, d=d).index_add_(0, _t([3], d), torch.ones(1, 4, device=d), alpha=2),
     IndexError, "index out of range in self", _is(torch.zeros(3, 4))),
    ("index_copy", lambda d: _z(3, d=d).index_copy(0, _t([3], d), torch.ones(1, device=d)), IndexError,
     "index_copy_(): index 3 is out of bounds for dimension 0 with size 3", _is(torch.zeros(3))),
    ("index_copy__negative", _scatter_into("index_copy_", (2, 3), 1, _i([-1]), _ones(2, 1)),
     IndexError, "index_copy_(): index -1 is out of bounds for dimension 1 with size 3",
     _is(torch.tensor([[0.0, 0, 1], [0, 0, 1]]))),
    ("index_fill", lambda d: _z(3, d=d).index_fill(0, _t([4], d), 1.0), IndexError,
     "index 4 is out of bounds for dimension 0 with size 3", _is(torch.zeros(3))),
    ("index_fill__negative", _scatter_into("index_fill_", (3,), 0, _i([-4]), 1.0), IndexError,
     "index -4 is out of bounds for dimension 0 with size 3", _is(torch.tensor([0.0, 0, 1]))),
    ("index_fill_tensor_value", lambda d: _z(2, 3, d=d).index_fill(1, _t([4], d), _t(1.0, d)), IndexError,
     "index 4 is out of bounds for dimension 1 with size 3", _is(torch.zeros(2, 3))),
    ("index_reduce", lambda d: _z(3, d=d).index_reduce(0, _t([4], d), torch.ones(1, device=d), "prod"),
     IndexError, "index out of range in self", _is(torch.zeros(3))),
    # -- advanced indexing (aten::index.Tensor / index_put) -----------------------------------------
    ("getitem", lambda d: _x(d)[_t([5], d)], IndexError,
     "index 5 is out of bounds for dimension 0 with size 4", _is(_x("cpu")[[3]])),
    ("getitem_negative", lambda d: _x(d)[_t([-5], d)], IndexError,
     "index -5 is out of bounds for dimension 0 with size 4", _is(_x("cpu")[[0]])),
    ("getitem_dim1", lambda d: _x(d)[:, _t([3], d)], IndexError,
     "index 3 is out of bounds for dimension 0 with size 3", _is(_x("cpu")[:, [2]])),
    ("getitem_cpu_index", lambda d: _x(d)[torch.tensor([4])], IndexError,
     "index 4 is out of bounds for dimension 0 with size 4", _is(_x("cpu")[[3]])),
    ("getitem_mask_and_index", lambda d: _x(d)[_t([True, False, True, True], d), _t([3], d)], IndexError,
     "index 3 is out of bounds for dimension 1 with size 3", _is(torch.tensor([2.0, 8, 11]))),
    ("index_put_", _scatter_into("index_put_", (4,), lambda d: (_t([9], d),), _i(1.0)), IndexError,
     "index 9 is out of bounds for dimension 0 with size 4", _is(_ZERO_FLOAT)),
    ("index_put_accumulate", lambda d: _z(4, d=d).index_put((_t([9], d),), _t(1.0, d), accumulate=True),
     IndexError, "index 9 is out of bounds for dimension 0 with size 4", _is(_ZERO_FLOAT)),
    ("setitem", _scatter_into("__setitem__", (4, 3), lambda d: (_t([1], d), _t([3], d)), 1.0), IndexError,
     "index 3 is out of bounds for dimension 1 with size 3", _is(torch.zeros(4, 3))),
    # -- flat indices -------------------------------------------------------------------------------
    ("take", lambda d: _x(d).take(_t([12], d)), IndexError,
     "out of range: tried to access index 12 on a tensor of 12 elements.", _is(torch.tensor([11.0]))),
    ("take_negative", lambda d: _x(d).take(_t([-13], d)), IndexError,
     "out of range: tried to access index -13 on a tensor of 12 elements.", _is(torch.tensor([11.0]))),
    ("put_", _scatter_into("put_", (4,), _i([7]), _ones(1)), IndexError,
     "out of range: tried to access index 7 on a tensor of 4 elements.", _is(_ZERO_FLOAT)),
    ("put__accumulate", _scatter_into("put_", (4,), _i([7]), _ones(1), True), IndexError,
     "out of range: tried to access index 7 on a tensor of 4 elements.", _is(_ZERO_FLOAT)),
    ("masked_scatter",
     lambda d: _z(4, d=d).masked_scatter(_t([True, True, True, False], d), torch.ones(2, device=d)),
     RuntimeError, "Number of elements of source < number of ones in mask",
     _is(torch.tensor([1.0, 1, 1, 0]))),
    # -- embeddings ---------------------------------------------------------------------------------
    ("embedding", lambda d: F.embedding(_t([0, 10], d), _x(d)), IndexError,
     "index out of range in self", _is(_x("cpu")[[0, 3]])),
    ("embedding_negative", lambda d: F.embedding(_t([0, -1], d), _x(d)), IndexError,
     "index out of range in self", _is(_x("cpu")[[0, 0]])),
    ("embedding_max_norm", lambda d: F.embedding(_t([0, 9], d), _x(d), max_norm=100.0), IndexError,
     "select(): index 9 out of range for tensor of size [4, 3] at dimension 0", _is(_x("cpu")[[0, 3]])),
    ("embedding_bag", lambda d: F.embedding_bag(_t([[0, 9]], d), _x(d)),
     RuntimeError, "Index 1 of input takes value 9 which is not in the valid range [0, 4)",
     _is(torch.tensor([[4.5, 5.5, 6.5]]))),
    ("embedding_bag_negative", lambda d: F.embedding_bag(_t([[0, -1]], d), _x(d)),
     RuntimeError, "Index 1 of input takes value -1 which is not in the valid range [0, 4)",
     _is(torch.tensor([[0.0, 1.0, 2.0]]))),
    ("embedding_bag_offsets_start", lambda d: F.embedding_bag(_t([0, 2, 1], d), _x(d), _t([1, 2], d)),
     RuntimeError, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
     "position 0. However, got 1",
     _is(torch.tensor([[6.0, 7, 8], [3, 4, 5]]))),
    ("embedding_bag_offsets_end", lambda d: F.embedding_bag(_t([0, 2, 1], d), _x(d), _t([0, 5], d)),
     RuntimeError, "offsets[-1] can not be greater than input's length 3 but got offsets[-1] of 5",
     _is(torch.tensor([[3.0, 4, 5], [0, 0, 0]]))),
    # -- loss targets -------------------------------------------------------------------------------
    ("nll_loss", lambda d: F.nll_loss(_x(d), _t([0, 4, 1, 0], d)), IndexError,
     "Target 4 is out of bounds.", _is(torch.tensor(NAN))),
    ("nll_loss_negative", lambda d: F.nll_loss(_x(d), _t([0, -5, 1, 0], d)), IndexError,
     "Target -5 is out of bounds.", _is(torch.tensor(NAN))),
    ("nll_loss_none", lambda d: F.nll_loss(_x(d), _t([0, 4, 1, 0], d), reduction="none"), IndexError,
     "Target 4 is out of bounds.", _is(torch.tensor([-0.0, NAN, -7, -9]))),
    ("nll_loss_1d", lambda d: F.nll_loss(torch.arange(3.0, device=d), _t(4, d)), IndexError,
     "Target 4 is out of bounds.", _is(torch.tensor(NAN))),
    ("nll_loss2d", lambda d: F.nll_loss(torch.zeros(2, 3, 2, 2, device=d), _t([[[0, 1], [5, 0]]] * 2, d)),
     IndexError, "Target 5 is out of bounds.", _is(torch.tensor(NAN))),
    ("cross_entropy", lambda d: F.cross_entropy(_x(d), _t([0, 7, 1, 0], d)), IndexError,
     "Target 7 is out of bounds.", _is(torch.tensor(NAN))),
    ("cross_entropy_label_smoothing",
     lambda d: F.cross_entropy(_x(d), _t([0, 7, 1, 0], d), label_smoothing=0.1),
     IndexError, "Target 7 is out of bounds.", _is(torch.tensor(NAN))),
    ("cross_entropy_3d",
     lambda d: F.cross_entropy(torch.zeros(2, 3, 5, device=d), _t([[0, 1, 2, 3, 0]] * 2, d)),
     IndexError, "Target 3 is out of bounds.", _is(torch.tensor(NAN))),
    ("binary_cross_entropy_input", lambda d: F.binary_cross_entropy(_t([0.5, 1.5], d), _t([1.0, 0.0], d)),
     RuntimeError, "all elements of input should be between 0 and 1", _is(torch.tensor(NAN))),
    ("binary_cross_entropy_nan", lambda d: F.binary_cross_entropy(_t([0.5, NAN], d), _t([1.0, 0.0], d)),
     RuntimeError, "all elements of input should be between 0 and 1", _is(torch.tensor(NAN))),
    ("binary_cross_entropy_target", lambda d: F.binary_cross_entropy(_t([0.5, 0.5], d), _t([1.0, 2.0], d)),
     RuntimeError, "all elements of target should be between 0 and 1", _is(torch.tensor(0.6931471805599453))),
    # -- probabilities of random ops ----------------------------------------------------------------
    ("multinomial_negative", lambda d: torch.multinomial(_t([-1.0, 2.0], d), 1), RuntimeError,
     "probability tensor contains either `inf`, `nan` or element < 0", _shape(1, low=0, high=1)),
    ("multinomial_nan", lambda d: torch.multinomial(_t([NAN, 2.0], d), 1), RuntimeError,
     "probability tensor contains either `inf`, `nan` or element < 0", _shape(1, low=0, high=1)),
    ("multinomial_inf", lambda d: torch.multinomial(_t([float("inf"), 2.0], d), 1), RuntimeError,
     "probability tensor contains either `inf`, `nan` or element < 0", _shape(1, low=0, high=1)),
    ("multinomial_all_zero", lambda d: torch.multinomial(_t([[0.0, 1.0], [0.0, 0.0]], d), 1), RuntimeError,
     "invalid multinomial distribution (sum of probabilities <= 0)", _shape(2, 1, low=0, high=1)),
    ("bernoulli_above_1", lambda d: torch.bernoulli(_t([0.0, 1.5], d)), RuntimeError,
     "Expected p_in >= 0 && p_in <= 1 to be true, but got false.", _is(torch.tensor([0.0, 1.0]))),
    ("bernoulli__tensor_p", lambda d: torch.empty(2, device=d).bernoulli_(_t([1.0, -1.5], d)), RuntimeError,
     "Expected p_in >= 0 && p_in <= 1 to be true, but got false.", _is(torch.tensor([1.0, 0.0]))),
    ("normal_negative_std", lambda d: torch.normal(_t([0.0, 0.0], d), _t([1.0, -1.0], d)), RuntimeError,
     "normal expects all elements of std >= 0.0", _shape(2)),
    ("poisson_negative", lambda d: torch.poisson(_t([0.0, -1.0], d)), RuntimeError,
     "invalid Poisson rate, expected rate to be non-negative", _is(torch.tensor([0.0, NAN]))),
    ("histc_nan_range", lambda d: torch.histc(_t([1.0, NAN], d), bins=4), RuntimeError,
     "torch.histc: range of [-nan, -nan] is not finite", _is(torch.zeros(4))),
    ("searchsorted_sorter",
     lambda d: torch.searchsorted(_t([1.0, 2.0], d), _t([1.5], d), sorter=_t([0, 5], d)),
     RuntimeError, "torch.searchsorted(): sorter index out of range", _is(torch.tensor([1]))),
    # -- integer division by zero (XLA gives -1 / all ones for the quotient, x for the remainder) -----
    ("floor_divide", lambda d: _t([7], d) // _t([0], d), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([-1]))),
    ("floor_divide_scalar", lambda d: _t([7], d) // 0, RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([-1]))),
    ("floor_divide_", lambda d: _t([7], d).floor_divide_(_t([0], d)), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([-1]))),
    ("rfloordiv", lambda d: 7 // _t([0], d), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([-1]))),
    ("floor_divide_uint8", lambda d: _t([7], d, dtype=torch.uint8) // _t([0], d, dtype=torch.uint8),
     RuntimeError, "ZeroDivisionError", _is(torch.tensor([255], dtype=torch.uint8))),
    ("div_trunc", lambda d: torch.div(_t([7], d), _t([0], d), rounding_mode="trunc"), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([-1]))),
    ("div_floor_scalar", lambda d: torch.div(_t([7], d), 0, rounding_mode="floor"), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([-1]))),
    ("remainder", lambda d: _t([7], d) % _t([0], d), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([7]))),
    ("remainder_scalar", lambda d: _t([7], d) % 0, RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([7]))),
    ("rremainder", lambda d: 7 % _t([0], d), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([7]))),
    ("fmod", lambda d: torch.fmod(_t([7], d), _t([0], d)), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([7]))),
    ("fmod__scalar", lambda d: _t([7], d).fmod_(0), RuntimeError,
     "ZeroDivisionError", _is(torch.tensor([7]))),
    # -- linear algebra: the _ex variants with check_errors=True, torch.cholesky, cholesky_inverse -----
    ("inv_ex_check_errors", lambda d: torch.linalg.inv_ex(_z(2, 2, d=d), check_errors=True).info,
     torch.linalg.LinAlgError, "linalg.inv_ex: The diagonal element 1 is zero",
     _is(torch.tensor(1, dtype=torch.int32))),
    ("solve_ex_check_errors",
     lambda d: torch.linalg.solve_ex(_z(2, 2, d=d), torch.ones(2, device=d), check_errors=True).info,
     torch.linalg.LinAlgError, "torch.linalg.solve_ex: The solver failed because the input matrix is singular.",
     _is(torch.tensor(1, dtype=torch.int32))),
    ("cholesky_ex_check_errors",
     lambda d: torch.linalg.cholesky_ex(_t([[1.0, 2], [2, 1]], d), check_errors=True).L,
     torch.linalg.LinAlgError, "linalg.cholesky_ex: The factorization could not be completed because the input "
     "is not positive-definite (the leading minor of order 2 is not positive-definite).",
     _is(torch.tensor([[NAN, 0], [NAN, NAN]]))),
    ("lu_factor_ex_check_errors", lambda d: torch.linalg.lu_factor_ex(_z(2, 2, d=d), check_errors=True).LU,
     RuntimeError, "torch.linalg.lu_factor_ex: U[1,1] is zero", _is(torch.zeros(2, 2))),
    ("torch_cholesky", lambda d: torch.cholesky(_t([[1.0, 2], [2, 1]], d)),
     torch.linalg.LinAlgError,
     "cholesky: The factorization could not be completed because the input is not positive-definite",
     _is(torch.tensor([[NAN, 0], [NAN, NAN]]))),
    ("cholesky_inverse", lambda d: torch.cholesky_inverse(_z(2, 2, d=d)), torch.linalg.LinAlgError,
     "cholesky_inverse: The diagonal element 1 is zero", _is(torch.full((2, 2), NAN))),
]
# fmt: on


def _cases(rows):
    return [pytest.param(*row[1:], id=row[0]) for row in rows]


def _run(fn, device):
    # torch.cholesky, index_reduce, scatter(reduce=) warn; so does DeferAndFuse, compiling each case anew
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(device)
        return out.cpu() if isinstance(out, torch.Tensor) else out


def _cpu_error(fn, exc, text) -> BaseException:
    with pytest.raises(exc, match=re.escape(text)) as info:
        _run(fn, "cpu")
    return info.value


@pytest.mark.parametrize("fn, exc, text, strict", _cases(BAD))
def test_debug_mode_raises_cpus_error(fn, exc, text, strict):
    cpu = _cpu_error(fn, exc, text)
    with torch.tpu.eager_mode(DEBUG):
        with pytest.raises(exc, match=re.escape(text)) as info:
            _run(fn, "tpu")
    assert type(info.value) is type(cpu)
    message = str(info.value)
    # CPU's message first (regexes written for CPU match), then the op where CPU's text names none
    assert message == str(cpu) or re.fullmatch(re.escape(str(cpu)) + r" \(aten::\w+ on tpu\)", message), (
        message
    )


@pytest.mark.parametrize(
    "mode", [STRICT, torch.tpu.EagerMode.DEFER_AND_FUSE], ids=["strict", "defer_and_fuse"]
)
@pytest.mark.parametrize("fn, exc, text, strict", _cases(BAD))
def test_other_modes_keep_xla_semantics(fn, exc, text, strict, mode):
    """No sync, no error: out-of-range gathers clamp, scatters drop, as on torch_xla; the `_ex`
    factorizations return LAPACK's info without raising."""
    with torch.tpu.eager_mode(mode):
        result = _run(fn, "tpu")
    strict(result)


# -- valid edge cases: no false positives, the same results as CPU in Debug mode ----------------------
# fmt: off
VALID = [
    ("index_select_empty", lambda d: _x(d).index_select(0, _t([], d, dtype=torch.long))),
    ("index_select_0d_self", lambda d: _t(5.0, d).index_select(0, _t([0], d))),
    ("index_select_last", lambda d: _x(d).index_select(1, _t([2, 0], d))),
    ("gather_0d", lambda d: torch.arange(3.0, device=d).gather(0, _t(2, d))),
    ("gather_empty", lambda d: _x(d).gather(0, torch.zeros(0, 3, dtype=torch.long, device=d))),
    ("scatter_last", lambda d: _z(3, 3, d=d).scatter(1, _t([[2], [0], [1]], d), 5.0)),
    ("scatter_add_empty", lambda d: _z(3, d=d).scatter_add(0, _t([], d, dtype=torch.long), _z(0, d=d))),
    ("getitem_negative", lambda d: _x(d)[_t([-1, -4], d)]),
    ("getitem_negative_dim1", lambda d: _x(d)[:, _t([-3], d)]),
    ("getitem_0d_index", lambda d: _x(d)[_t(-1, d)]),
    ("getitem_empty", lambda d: _x(d)[_t([], d, dtype=torch.long)]),
    ("getitem_mask", lambda d: _x(d)[_x(d) > 5]),
    ("getitem_mask_and_negative", lambda d: _x(d)[_t([True, False, True, True], d), _t([-1], d)]),
    ("index_put_negative", _scatter_into("index_put_", (4,), lambda d: (_t([-1, -4], d),), _i(1.0))),
    ("index_put_mask",
     _scatter_into("index_put_", (4,), lambda d: (_t([True, False, True, False], d),), _i(2.0))),
    ("setitem_negative", _scatter_into("__setitem__", (4, 3), lambda d: (_t([-1], d), _t([-3], d)), 1.0)),
    ("index_put_empty", lambda d: _z(4, d=d).index_put((_t([], d, dtype=torch.long),), _t(1.0, d))),
    ("take_negative", lambda d: _x(d).take(_t([-1, -12, 0], d))),
    ("take_0d", lambda d: _x(d).take(_t(11, d))),
    ("put__negative", _scatter_into("put_", (4,), _i([-1, -4]), _ones(2))),
    ("index_fill_negative", lambda d: _z(3, d=d).index_fill(0, _t([-1, -3], d), 1.0)),
    ("index_add_in_range", lambda d: _z(3, 4, d=d).index_add(0, _t([2, 0, 2], d), torch.ones(3, 4, device=d))),
    ("index_copy_0d", lambda d: _z(3, d=d).index_copy(0, _t(2, d), _t(1.0, d))),
    ("index_copy_empty", lambda d: _z(3, d=d).index_copy(0, _t([], d, dtype=torch.long), _z(0, d=d))),
    ("masked_scatter_more_source",
     lambda d: _z(4, d=d).masked_scatter(_t([True, False, True, False], d), torch.arange(1.0, 4.0, device=d))),
    ("masked_scatter_broadcast_mask",
     lambda d: _z(2, 3, d=d).masked_scatter(_t([True, False, True], d), torch.arange(1.0, 5.0, device=d))),
    ("embedding_last_row", lambda d: F.embedding(_t([[3, 0]], d), _x(d))),
    ("embedding_padding_idx", lambda d: F.embedding(_t([3, 1], d), _x(d), padding_idx=-1)),
    ("embedding_empty", lambda d: F.embedding(_t([], d, dtype=torch.long), _x(d))),
    ("embedding_bag_offsets",
     lambda d: F.embedding_bag(_t([0, 3, 1, 2], d), _x(d), _t([0, 1, 1], d), mode="sum")),
    ("embedding_bag_last_offset",
     lambda d: F.embedding_bag(_t([0, 3, 1], d), _x(d), _t([0, 2, 3], d), mode="max", include_last_offset=True)),
    ("nll_loss_ignore_index", lambda d: F.nll_loss(_x(d), _t([0, -100, 2, -100], d))),
    ("nll_loss_custom_ignore_index", lambda d: F.nll_loss(_x(d), _t([0, 7, 2, 1], d), ignore_index=7)),
    ("nll_loss_all_ignored_none", lambda d: F.nll_loss(_x(d), _t([-100] * 4, d), reduction="none")),
    ("nll_loss_1d", lambda d: F.nll_loss(torch.arange(3.0, device=d), _t(2, d))),
    ("nll_loss_weight", lambda d: F.nll_loss(_x(d), _t([0, 2, 2, 1], d), weight=_t([1.0, 2.0, 0.5], d))),
    ("cross_entropy_ignore_index",
     lambda d: F.cross_entropy(_x(d), _t([0, -100, 2, 1], d), label_smoothing=0.1)),
    ("cross_entropy_3d",
     lambda d: F.cross_entropy(torch.arange(30.0, device=d).reshape(2, 3, 5), _t([[0, 1, 2, -100, 0]] * 2, d))),
    ("cross_entropy_probabilities", lambda d: F.cross_entropy(_x(d), torch.full((4, 3), 1 / 3, device=d))),
    ("one_hot", lambda d: F.one_hot(_t([0, 2, 1], d), 3)),
    ("binary_cross_entropy_bounds",
     lambda d: F.binary_cross_entropy(_t([0.0, 1.0, 0.5], d), _t([0.0, 1.0, 1.0], d))),
    ("floor_divide_nonzero", lambda d: _t([7, -7], d) // _t([2, 2], d)),
    ("floor_divide_float_by_zero", lambda d: _t([7.0, -7.0], d) // _t([0.0, 0.0], d)),
    ("floor_divide_int_by_float_zero", lambda d: _t([7], d) // 0.0),
    ("div_true_int_by_zero", lambda d: _t([7], d) / _t([0], d)),
    ("div_trunc_float_by_zero", lambda d: torch.div(_t([7.0], d), 0.0, rounding_mode="trunc")),
    ("remainder_nonzero", lambda d: _t([7, -7], d) % _t([3, 3], d)),
    ("fmod_float_by_zero", lambda d: torch.fmod(_t([7.0], d), 0)),
    ("histc_explicit_range", lambda d: torch.histc(_t([1.0, 3.0], d), bins=4, min=0, max=4)),
    ("searchsorted_sorter",
     lambda d: torch.searchsorted(_t([2.0, 1.0], d), _t([1.5], d), sorter=_t([1, 0], d))),
    ("inv_ex_regular", lambda d: torch.linalg.inv_ex(_t([[2.0, 1], [1, 3]], d)).inverse),
    ("cholesky_ex_pd", lambda d: torch.linalg.cholesky_ex(_t([[2.0, 1], [1, 3]], d), check_errors=True).L),
    ("torch_cholesky_pd", lambda d: torch.cholesky(_t([[2.0, 1], [1, 3]], d))),
    ("cholesky_inverse_pd", lambda d: torch.cholesky_inverse(_t([[2.0, 0], [1, 3]], d))),
]
# fmt: on


@pytest.mark.parametrize("fn", _cases(VALID))
def test_debug_mode_accepts_valid_inputs_like_cpu(fn):
    expected = _run(fn, "cpu")
    with torch.tpu.eager_mode(DEBUG):
        result = _run(fn, "tpu")
    torch.testing.assert_close(result, expected, equal_nan=True)


def test_ex_variants_return_instead_of_raising_in_debug_mode():
    """check_errors=False (the default) never raises, on CPU or tpu; `info` is LAPACK's, as on CPU."""
    singular = torch.zeros(2, 2)
    with torch.tpu.eager_mode(DEBUG):
        assert torch.linalg.inv_ex(singular).info == 1
        assert torch.linalg.inv_ex(singular.to("tpu")).info.cpu() == 1
        assert torch.linalg.cholesky_ex(singular.to("tpu") - 1).info.cpu() == 1
        assert torch.linalg.solve_ex(singular.to("tpu"), torch.ones(2, device="tpu")).result.shape == (2,)
        assert torch.linalg.cholesky_ex(singular.to("tpu") - 1).L.shape == (2, 2)


def test_random_ops_accept_valid_probabilities_in_debug_mode():
    with torch.tpu.eager_mode(DEBUG):
        picks = torch.multinomial(_t([[0.0, 1.0], [2.0, 0.0]], "tpu"), 1).cpu()
        assert picks.tolist() == [[1], [0]]
        assert torch.bernoulli(_t([0.0, 1.0], "tpu")).cpu().tolist() == [0.0, 1.0]
        assert torch.empty(2, device="tpu").bernoulli_(_t([1.0, 0.0], "tpu")).cpu().tolist() == [1.0, 0.0]
        assert torch.normal(_t([3.0], "tpu"), _t([0.0], "tpu")).cpu().tolist() == [3.0]
        assert torch.poisson(_t([0.0], "tpu")).cpu().tolist() == [0.0]


def test_failing_check_leaves_cpus_generator_alone():
    """The CPU run that words the error must not advance torch's CPU generator."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with torch.tpu.eager_mode(DEBUG), pytest.raises(RuntimeError, match="probability tensor"):
        torch.multinomial(_t([-1.0, 2.0], "tpu"), 1)
    torch.testing.assert_close(torch.rand(3), expected)


def test_dtype_cpu_lacks_gets_the_checks_own_message():
    """uint16 index_select has no CPU kernel: the check's CPU-worded error, naming the op."""
    x = torch.zeros(4, dtype=torch.uint16, device="tpu")
    with torch.tpu.eager_mode(DEBUG):
        with pytest.raises(IndexError, match=r"index 7 is out of bounds .* \(aten::index_select on tpu\)"):
            x.index_select(0, _t([7], "tpu"))


def test_every_value_checked_overload_has_a_tpu_kernel():
    """A check registered on an overload that never reaches OpKernel would be dead code."""
    from hf_tpu.runtime import arg_checks
    from hf_tpu.runtime.lowerings.table import TABLE

    torch.zeros(1, device="tpu") + 1  # registers the kernels and loads every check module
    checked = [op for op, (_, by_value) in arg_checks.CHECKS.items() if by_value]
    assert len(checked) >= 40
    assert [op for op in checked if op not in TABLE] == []


# -- CPU errors tpu does not reproduce yet (listed in arg_checks/values.py's docstring) --------------
@pytest.mark.xfail(
    strict=True, reason="one_hot decomposes to scatter_ on tpu: Debug raises scatter's message"
)
def test_one_hot_out_of_range_uses_cpus_message():
    _cpu_error(
        lambda d: F.one_hot(_t([0, 5], d), 3), RuntimeError, "Class values must be smaller than num_classes."
    )
    with torch.tpu.eager_mode(DEBUG):
        with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
            F.one_hot(_t([0, 5], "tpu"), 3)


def test_one_hot_out_of_range_raises_scatters_error_in_debug_mode():
    with torch.tpu.eager_mode(DEBUG):
        with pytest.raises(
            RuntimeError, match=r"index 5 is out of bounds for dimension 1 with size 3 \(aten::scatter"
        ):
            F.one_hot(_t([0, 5], "tpu"), 3)
        with pytest.raises(RuntimeError, match=r"index -1 is out of bounds for dimension 1 with size 3"):
            F.one_hot(_t([0, -1], "tpu"), 3)


def test_assert_async_checks_in_debug_mode_only():
    """`torch._assert_async` (emitted by torch for value checks that must not sync): Strict does not
    read the value, Debug mode raises CPU's error."""
    torch._assert_async(_t([0.0], "tpu"))
    torch._assert_async(_t([0.0], "tpu"), "custom message")
    for args, text in (((), "single nonzero value, but got zero"), (("custom message",), "custom message")):
        _cpu_error(lambda d, args=args: torch._assert_async(_t([0.0], d), *args), RuntimeError, text)
        with torch.tpu.eager_mode(DEBUG):
            torch._assert_async(_t([2.0], "tpu"), *args)
            with pytest.raises(RuntimeError, match=text):
                torch._assert_async(_t([0.0], "tpu"), *args)


def test_repeat_interleave_negative_repeats():
    """Checked in every mode by the host kernel, which reads the repeats anyway."""
    _cpu_error(lambda d: torch.repeat_interleave(_t([1, -1], d)), RuntimeError, "repeats can not be negative")
    with torch.tpu.eager_mode(DEBUG):
        with pytest.raises(RuntimeError, match="repeats can not be negative"):
            torch.repeat_interleave(_t([1, -1], "tpu"))


@pytest.mark.parametrize(
    "fn, text",
    [
        (lambda d: torch.linalg.inv(_z(2, 2, d=d)), "linalg.inv: The diagonal element 1 is zero"),
        (
            lambda d: torch.linalg.solve(_z(2, 2, d=d), torch.ones(2, device=d)),
            "torch.linalg.solve: The solver failed",
        ),
        (
            lambda d: torch.linalg.cholesky(_t([[1.0, 2], [2, 1]], d)),
            "linalg.cholesky: The factorization could not",
        ),
    ],
    ids=["inv", "solve", "cholesky"],
)
def test_linalg_singular_raises_linalg_error(fn, text):
    """The factorizations report LAPACK's info, so ATen raises from it in every mode, as on CPU."""
    _cpu_error(fn, torch.linalg.LinAlgError, text)
    with torch.tpu.eager_mode(DEBUG):
        with pytest.raises(torch.linalg.LinAlgError, match=re.escape(text)):
            _run(fn, "tpu")
    with pytest.raises(torch.linalg.LinAlgError, match=re.escape(text)):
        _run(fn, "tpu")

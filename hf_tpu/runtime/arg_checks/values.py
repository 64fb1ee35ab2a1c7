"""Checks that read tensor values: CPU's data-dependent errors, raised in Debug mode only.

XLA clamps out-of-range gathers and drops out-of-range scatters, divides integers by zero without
complaint and returns NaN where LAPACK reports a singular matrix. CPU raises instead, and Debug mode
(`DEFER_NEVER_AND_LAUNCH_BLOCKING`) is where users look for such bugs, so there each check below reads the
values it needs on the host (a sync) and, when they look wrong, raises CPU's own error.

Each check is a cheap detector that may over-approximate (a NaN, a value at a boundary): when it fires,
`_fail_like_cpu` runs the same functional overload on CPU copies of the arguments and raises exactly
what CPU raises (its exception type and message, with the op named where CPU's text does not name it;
CPU's message depends on its kernel's path, e.g. `index_add` on a 1-D tensor or with alpha != 1 words it
differently). When CPU accepts the arguments nothing is raised; when CPU has no kernel for them (a dtype
only tpu supports) the check's own CPU-worded error is raised. The CPU run happens only on that error
path, so valid inputs cost one host read of the index/target/probability values per op; the exceptions
are `torch.cholesky` and the `_ex` factorizations with check_errors=True, whose detector is CPU's
factorization itself (run on every call in Debug mode).

Raised outside this module, in every mode: `repeat_interleave` with negative repeats (its host kernel
reads the repeats anyway), mismatched boolean masks (a shape check in the indexing kernels), and
`torch.linalg.inv` / `solve` / `cholesky` / `lu_factor` of singular or non-PD matrices (ATen raises from
the factorization's LAPACK info, which the linalg lowerings report).
Not reproduced: `F.one_hot` out of range is CompositeImplicit and reaches tpu as `zero_` + `scatter_`,
so Debug mode raises scatter's RuntimeError ("index 5 is out of bounds for dimension 1 with size 3
(aten::scatter on tpu)") instead of CPU's "Class values must be smaller than num_classes.".
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import torch

from hf_tpu.runtime.arg_checks import checks
from hf_tpu.runtime.lowerings.table import resolve

_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_LAPACK_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


# -- shared helpers -----------------------------------------------------------------------------------
def _host(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values on the host (the sync a value check costs)."""
    return t.detach().cpu()


def _cpu(value):
    """An argument as CPU's kernel takes it: tensors copied to CPU, generators dropped."""
    if isinstance(value, torch.Tensor):
        return _host(value)
    if isinstance(value, list | tuple):
        return type(value)(_cpu(v) for v in value)
    if isinstance(value, torch.Generator):
        return None
    return value


def _names_op(message: str, op: torch._ops.OpOverload) -> bool:
    """Does CPU's message start from the op's name (`index_copy_(): ...`, `linalg.inv: ...`, `normal
    expects ...`)? A mere word ("index 5 is out of bounds") does not count."""
    base = op._schema.name.split("::")[-1].strip("_").removesuffix("_ex").replace("_", ".")
    pattern = rf"(?<!\w){re.escape(base)}(?:\.ex)?\.?(?:\(|:| expects)"
    return re.search(pattern, message.replace("_", ".")) is not None


def _fail_like_cpu(op: torch._ops.OpOverload, args: tuple, fallback: BaseException | None = None) -> None:
    """Raise what CPU raises for `op(*args)`, naming `op` where CPU's message does not.

    Returns when CPU accepts the arguments (the detector was conservative); raises `fallback` (when
    given) when CPU has no kernel for them.
    """
    pos, kw = _split(op, [_cpu(a) for a in args])
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CPU's deprecation/beta warnings are not the user's
            op(*pos, **kw)
    except NotImplementedError:
        if fallback is not None:
            raise _as_tpu_error(fallback, op) from None
        return
    except Exception as exc:  # noqa: BLE001 - re-raised as CPU's own type
        raise _as_tpu_error(exc, op) from None


def _split(op: torch._ops.OpOverload, full: list) -> tuple[list, dict]:
    """Schema-ordered arguments -> (positional, keyword-only)."""
    arguments = op._schema.arguments
    pos = [v for a, v in zip(arguments, full) if not a.kwarg_only]
    kw = {a.name: v for a, v in zip(arguments, full) if a.kwarg_only}
    return pos, kw


def _as_tpu_error(exc: BaseException, op: torch._ops.OpOverload) -> BaseException:
    message = str(exc) if _names_op(str(exc), op) else f"{exc} ({op._schema.name} on tpu)"
    try:
        return type(exc)(message)
    except TypeError:  # an exception type whose constructor wants more than a message
        return exc


def _dim_size(t: torch.Tensor, dim: int) -> int | None:
    """Size of `t` along `dim` as the index ops see it (a 0-d tensor has one element), None if `dim` is
    invalid (the meta kernel raises that error)."""
    n = t.dim()
    if n == 0:
        return 1 if dim in (0, -1) else None
    return t.shape[dim] if -n <= dim < n else None


def _first_outside(index: torch.Tensor, low: int, high: int) -> int | None:
    """The first value of integer tensor `index` outside [low, high), or None."""
    if index.numel() == 0 or index.dtype not in _INDEX_DTYPES:
        return None
    values = _host(index).reshape(-1)
    bad = values[(values < low) | (values >= high)]
    return int(bad[0]) if bad.numel() else None


def _any_outside_unit(p: torch.Tensor) -> bool:
    """Is some value of `p` outside [0, 1] (NaN included)?"""
    if p.numel() == 0 or not p.dtype.is_floating_point:
        return False
    h = _host(p)
    return not bool(((h >= 0) & (h <= 1)).all())


def _register(names: tuple[str, ...], make: Callable[[torch._ops.OpOverload], Callable]) -> None:
    """Register `make(op)` as the value check of each named overload (a check that knows its op)."""
    for name in names:
        checks(name, values=True)(make(resolve(name)))


# -- indices along one dimension: index_select / index_* / gather / scatter ----------------------------
def _along_dim(negative_wraps: bool) -> Callable[[torch._ops.OpOverload], Callable]:
    def make(op):
        def check(self, dim, index, *rest):
            size = _dim_size(self, dim)
            if size is None:
                return
            bad = _first_outside(index, -size if negative_wraps else 0, size)
            if bad is not None:
                d = dim % max(self.dim(), 1)
                fallback = IndexError(f"index {bad} is out of bounds for dimension {d} with size {size}")
                _fail_like_cpu(op, (self, dim, index, *rest), fallback)

        return check

    return make


_register(
    (
        "aten::index_select",
        "aten::index_add",
        "aten::index_copy",
        "aten::index_reduce",
        "aten::gather",
        "aten::scatter.src",
        "aten::scatter.value",
        "aten::scatter.reduce",
        "aten::scatter.value_reduce",
        "aten::scatter_add",
        "aten::scatter_reduce.two",
    ),
    _along_dim(negative_wraps=False),
)
_register(("aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor"), _along_dim(negative_wraps=True))


# -- advanced indexing: x[i, j], x[i, j] = v ---------------------------------------------------------
def _bad_index_list(self: torch.Tensor, indices) -> tuple[int, int, int] | None:
    """(value, dim, size) of the first integer index outside [-size, size), walking `indices` over the
    dims of `self` (a bool mask spans as many dims as it has)."""
    dim = 0
    for index in indices:
        if index is None:
            dim += 1
            continue
        if index.dtype in (torch.bool, torch.uint8):
            dim += index.dim()
            continue
        size = _dim_size(self, dim)
        if size is None:
            return None
        bad = _first_outside(index, -size, size)
        if bad is not None:
            return bad, dim, size
        dim += 1
    return None


def _index_list(op):
    def check(self, indices, *rest):
        found = _bad_index_list(self, indices)
        if found is not None:
            bad, dim, size = found
            fallback = IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
            _fail_like_cpu(op, (self, indices, *rest), fallback)

    return check


_register(("aten::index.Tensor", "aten::index_put", "aten::_index_put_impl"), _index_list)


# -- flat indices: take / put ------------------------------------------------------------------------
def _flat(op):
    def check(self, index, *rest):
        n = self.numel()
        bad = _first_outside(index, -n, n)
        if bad is not None:
            fallback = IndexError(f"out of range: tried to access index {bad} on a tensor of {n} elements.")
            _fail_like_cpu(op, (self, index, *rest), fallback)

    return check


_register(("aten::take", "aten::put"), _flat)


# -- embedding lookups -------------------------------------------------------------------------------
def _rows(op):
    """embedding(weight, indices, ...) / embedding_renorm(weight, indices, ...): rows in [0, num_rows)."""

    def check(weight, indices, *rest):
        if weight.dim() == 0:
            return
        if _first_outside(indices, 0, weight.shape[0]) is not None:
            _fail_like_cpu(op, (weight, indices, *rest), IndexError("index out of range in self"))

    return check


_register(("aten::embedding", "aten::embedding_renorm"), _rows)


def _offsets_invalid(offsets: torch.Tensor, n: int) -> bool:
    """Bags must start at 0, never step back, and end within the n indices."""
    if offsets.numel() == 0 or offsets.dtype not in _INDEX_DTYPES:
        return False
    o = _host(offsets).reshape(-1)
    return int(o[0]) != 0 or int(o[-1]) > n or bool((o[1:] < o[:-1]).any())


def _bags(op):
    def check(weight, indices, offsets, *rest):
        if weight.dim() == 0:
            return
        rows = weight.shape[0]
        bad = _first_outside(indices, 0, rows)
        if bad is not None:
            fallback = RuntimeError(
                f"Index of input takes value {bad} which is not in the valid range [0, {rows})"
            )
        elif _offsets_invalid(offsets, indices.numel()):
            fallback = RuntimeError(
                "offsets[0] has to be 0, offsets must not decrease nor exceed input's length"
            )
        else:
            return
        _fail_like_cpu(op, (weight, indices, offsets, *rest), fallback)

    return check


_register(("aten::_embedding_bag", "aten::_embedding_bag_forward_only"), _bags)


def _sorter(op):
    """searchsorted's `sorter` permutes the last dim of the sorted sequence."""

    def check(sorted_sequence, value, *rest):
        sorter = rest[-1]
        if sorter is None or sorted_sequence.dim() == 0:
            return
        if _first_outside(sorter, 0, sorted_sequence.shape[-1]) is not None:
            fallback = RuntimeError("torch.searchsorted(): sorter index out of range")
            _fail_like_cpu(op, (sorted_sequence, value, *rest), fallback)

    return check


_register(("aten::searchsorted.Tensor", "aten::searchsorted.Scalar"), _sorter)


def _masked_scatter(op):
    """source must hold at least as many elements as the (broadcast) mask selects."""

    def check(self, mask, source):
        try:
            shape = torch.broadcast_shapes(self.shape, mask.shape)
        except RuntimeError:
            return  # the meta kernel words this error
        if int(_host(mask).expand(shape).sum()) > source.numel():
            fallback = RuntimeError("Number of elements of source < number of ones in mask")
            _fail_like_cpu(op, (self, mask, source), fallback)

    return check


_register(("aten::masked_scatter",), _masked_scatter)


# -- loss targets and probabilities ------------------------------------------------------------------
def _nll_targets(op):
    """Class targets in [0, C) except ignore_index (cross_entropy reaches nll_loss_forward too)."""

    def check(self, target, weight, reduction, ignore_index):
        if self.dim() == 0 or target.numel() == 0 or target.dtype not in _INDEX_DTYPES:
            return
        classes = self.shape[0] if self.dim() == 1 else self.shape[1]
        t = _host(target).reshape(-1)
        bad = t[(t != ignore_index) & ((t < 0) | (t >= classes))]
        if bad.numel():
            fallback = IndexError(f"Target {int(bad[0])} is out of bounds.")
            _fail_like_cpu(op, (self, target, weight, reduction, ignore_index), fallback)

    return check


_register(("aten::nll_loss_forward", "aten::nll_loss2d_forward"), _nll_targets)


def _binary_cross_entropy(op):
    def check(self, target, *rest):
        if _any_outside_unit(self) or _any_outside_unit(target):
            fallback = RuntimeError("all elements of input should be between 0 and 1")
            _fail_like_cpu(op, (self, target, *rest), fallback)

    return check


_register(("aten::binary_cross_entropy",), _binary_cross_entropy)


def _multinomial(op):
    """Probabilities finite and >= 0, each row with a positive sum."""

    def check(self, *rest):
        if self.numel() == 0 or not self.dtype.is_floating_point:
            return
        p = _host(self).float()
        if not bool((torch.isfinite(p) & (p >= 0)).all()):
            fallback = RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        elif not bool((p.sum(-1) > 0).all()):
            fallback = RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        else:
            return
        _fail_like_cpu(op, (self, *rest), fallback)

    return check


_register(("aten::multinomial",), _multinomial)


def _bernoulli(op):
    """bernoulli(p) with p = self (bernoulli.default) or a tensor p (bernoulli.Tensor, bernoulli_(p))."""

    def check(self, *rest):
        p = rest[0] if rest and isinstance(rest[0], torch.Tensor) else self
        if _any_outside_unit(p):
            fallback = RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
            _fail_like_cpu(op, (self, *rest), fallback)

    return check


_register(("aten::bernoulli", "aten::bernoulli.Tensor"), _bernoulli)


def _poisson(op):
    def check(self, *rest):
        if self.numel() and self.dtype.is_floating_point and not bool((_host(self) >= 0).all()):
            fallback = RuntimeError("invalid Poisson rate, expected rate to be non-negative")
            _fail_like_cpu(op, (self, *rest), fallback)

    return check


_register(("aten::poisson",), _poisson)


def _normal_std(op):
    """normal(mean, std) with a tensor std: every std >= 0."""

    def check(mean, std, *rest):
        if isinstance(std, torch.Tensor) and std.numel() and not bool((_host(std) >= 0).all()):
            fallback = RuntimeError("normal expects all elements of std >= 0.0")
            _fail_like_cpu(op, (mean, std, *rest), fallback)

    return check


_register(("aten::normal.float_Tensor", "aten::normal.Tensor_Tensor"), _normal_std)


def _histc(op):
    """histc with min == max takes its range from the data, which must then be finite."""

    def check(self, bins, min, max):  # noqa: A002 - the schema's names
        if min == max and self.numel() and self.dtype.is_floating_point:
            if not bool(torch.isfinite(_host(self)).all()):
                fallback = RuntimeError("torch.histc: range of [nan, nan] is not finite")
                _fail_like_cpu(op, (self, bins, min, max), fallback)

    return check


_register(("aten::histc",), _histc)


# -- integer division by zero ------------------------------------------------------------------------
def _has_zero(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() > 0 and bool((_host(value) == 0).any())
    return value == 0


def _integer_division(op):
    """Integer floor/trunc division and remainder by zero: CPU raises 'ZeroDivisionError'."""

    def check(self, other, *rest):
        rounding_mode = rest[0] if rest else "floor"
        if rounding_mode is None:  # true division: a float result, inf/nan as on CPU
            return
        dtype = torch.result_type(self, other)
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            return
        if _has_zero(other):
            _fail_like_cpu(op, (self, other, *rest), RuntimeError("ZeroDivisionError"))

    return check


_register(
    (
        "aten::floor_divide",
        "aten::floor_divide.Scalar",
        "aten::div.Tensor_mode",
        "aten::div.Scalar_mode",
        "aten::remainder.Tensor",
        "aten::remainder.Scalar",
        "aten::remainder.Scalar_Tensor",
        "aten::fmod.Tensor",
        "aten::fmod.Scalar",
    ),
    _integer_division,
)


# -- linear algebra: singular / not positive-definite inputs --------------------------------------------
def _check_errors(op):
    """The `_ex` factorizations with `check_errors=True` raise CPU's LinAlgError (the default
    check_errors=False returns `info` instead and never raises)."""

    def check(*args):
        if args[-1] and args[0].dtype in _LAPACK_DTYPES:  # check_errors: each schema's last argument
            _fail_like_cpu(op, args)

    return check


_register(
    (
        "aten::linalg_inv_ex",
        "aten::_linalg_solve_ex",
        "aten::linalg_cholesky_ex",
        "aten::linalg_lu_factor_ex",
    ),
    _check_errors,
)


def _legacy_cholesky(op):
    """torch.cholesky raises on a matrix that is not positive-definite (XLA returns NaNs)."""

    def check(self, upper):
        if self.numel() and self.dtype in _LAPACK_DTYPES:
            _fail_like_cpu(op, (self, upper))

    return check


def _cholesky_inverse(op):
    """cholesky_inverse of a factor with an exactly-zero diagonal element (a singular matrix)."""

    def check(self, upper):
        if self.dim() >= 2 and self.numel() and bool((_host(self).diagonal(0, -2, -1) == 0).any()):
            _fail_like_cpu(op, (self, upper))

    return check


_register(("aten::cholesky",), _legacy_cholesky)
_register(("aten::cholesky_inverse",), _cholesky_inverse)

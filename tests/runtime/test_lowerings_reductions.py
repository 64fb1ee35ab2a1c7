"""Reductions, scans, softmax, sorting and data-dependent ops on tpu match CPU PyTorch.

Each case runs the same function on a CPU tensor and on its tpu copy and compares values, dtypes and
shapes. Index outputs are compared exactly where PyTorch defines them (max/argmax: first occurrence;
stable sort; cummax: last occurrence) and, where the CPU kernel's tie choice is unspecified (topk,
kthvalue, median), checked to point at the returned values.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

FLOATS = [torch.float32, torch.bfloat16]
ALL = [torch.float32, torch.bfloat16, torch.int64]
NAN = float("nan")
INF = float("inf")


def _input(dtype, shape=(4, 6), nan=False, ties=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randint(-2, 3, shape, generator=g).float() if ties else torch.randn(shape, generator=g)
        x = x.to(dtype)
        if nan and x.numel() > 7:
            x.view(-1)[[1, 7]] = NAN
        return x
    return torch.randint(-3, 4, shape, generator=g).to(dtype)  # small range: plenty of ties


# (dtype, values) combinations for ops with tie/NaN rules: float32 gets every case, bf16 NaN, int64 ties
CASES = [
    (torch.float32, "plain"),
    (torch.float32, "ties"),
    (torch.float32, "nan"),
    (torch.bfloat16, "nan"),
    (torch.int64, "ties"),
]
CASE_IDS = [f"{str(d).removeprefix('torch.')}-{c}" for d, c in CASES]


def _case_input(dtype, case, shape=(4, 6)):
    return _input(dtype, shape, ties=case == "ties", nan=case == "nan")


def _tol(dtype):
    return (2e-2, 2e-2) if dtype in (torch.bfloat16, torch.float16) else (1e-5, 1e-5)


def _as_tuple(out):
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def _check(fn, x, *, indices="exact", tol=None):
    """fn(x) on CPU vs fn(x on tpu): dtypes, shapes and values (NaN == NaN) agree."""
    expected = _as_tuple(fn(x))
    got = _as_tuple(fn(x.to("tpu")))
    assert len(got) == len(expected)
    atol, rtol = tol or _tol(x.dtype)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.device.type == "tpu", f"output {i} is on {g.device}"
        g = g.cpu()
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"output {i}: shape {tuple(g.shape)} != {tuple(e.shape)}"
        is_index = e.dtype == torch.int64 and i > 0
        if is_index and indices == "gather":
            continue
        if is_index or not e.dtype.is_floating_point:
            assert torch.equal(g, e), f"output {i}:\n{g}\n!=\n{e}"
        else:
            torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True)
    if indices == "gather":
        return expected, got
    return None


def _gathers(fn, x, dim, keepdim=False):
    """(values, indices) from tpu: indices select the values along dim."""
    values, idx = fn(x.to("tpu"))
    values, idx = values.cpu(), idx.cpu()
    if not keepdim and x.dim():
        values, idx = values.unsqueeze(dim), idx.unsqueeze(dim)
    torch.testing.assert_close(x.gather(dim, idx) if x.dim() else x, values, equal_nan=True, atol=0, rtol=0)


# -- sums, means, products ----------------------------------------------------------------------
SUMS = {
    "sum": lambda t: t.sum(),
    "sum_dim": lambda t: t.sum(1),
    "sum_neg_keepdim": lambda t: t.sum(-1, keepdim=True),
    "sum_dims": lambda t: t.sum((0, 1)),
    "sum_empty_list": lambda t: torch.sum(t, dim=[]),
    "sum_dtype": lambda t: t.sum(0, dtype=torch.float32),
    "sum_bool": lambda t: (t > 0).sum(0),
    "nansum": lambda t: t.nansum(1),
    "prod": lambda t: t.prod(),
    "prod_dim_keepdim": lambda t: t.prod(-1, keepdim=True),
    "cumsum": lambda t: t.cumsum(1),
    "cumsum_neg": lambda t: t.cumsum(-2),
    "cumprod": lambda t: t.cumprod(1),
    "count_nonzero": lambda t: torch.count_nonzero(t, 1),
    "count_nonzero_all": lambda t: torch.count_nonzero(t),
}


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("name", SUMS)
def test_sums(name, dtype):
    _check(SUMS[name], _input(dtype))


def test_integer_sum_upcasts_to_int64():
    x = torch.full((3, 1000), 2**30, dtype=torch.int32)
    out = x.to("tpu").sum(1)
    assert out.dtype == torch.int64
    assert torch.equal(out.cpu(), x.sum(1))
    _check(lambda t: t.cumsum(1), x)


def test_bf16_sum_accumulates_in_f32():
    # 4096 ones then many small values: a bf16 accumulator would stall at 256
    x = torch.ones(4096, dtype=torch.bfloat16)
    assert x.to("tpu").sum().cpu().item() == x.sum().item() == 4096


MEANS = {
    "mean": lambda t: t.mean(),
    "mean_dim": lambda t: t.mean(1),
    "mean_neg_keepdim": lambda t: t.mean(-2, keepdim=True),
    "mean_dims": lambda t: t.mean((0, 1)),
    "nanmean": lambda t: t.nanmean(1),
    "mean_dtype": lambda t: t.mean(1, dtype=torch.float32),
}


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", MEANS)
def test_means(name, dtype, nan):
    _check(MEANS[name], _input(dtype, nan=nan))


EMPTY_AND_SCALAR = {
    "sum_empty_dim": lambda t: t.sum(0),
    "sum_empty_all": lambda t: t.sum(),
    "mean_empty": lambda t: t.mean(0),
    "prod_empty": lambda t: t.prod(0),
    "any_empty": lambda t: t.any(0),
    "all_empty": lambda t: t.all(),
    "cumsum_empty": lambda t: t.cumsum(0),
    "softmax_empty": lambda t: t.softmax(0),
    "sort_empty": lambda t: t.sort(0),
    "amax_nonempty_dim": lambda t: t.amax(1),
}


@pytest.mark.parametrize("name", EMPTY_AND_SCALAR)
def test_empty_dims(name):
    _check(EMPTY_AND_SCALAR[name], torch.empty(0, 3))


ZERO_DIM = {
    "sum": lambda t: t.sum(0),
    "sum_keepdim": lambda t: t.sum(-1, keepdim=True),
    "max_dim": lambda t: t.max(0),
    "argmax": lambda t: t.argmax(0),
    "cumsum": lambda t: t.cumsum(0),
    "cummax": lambda t: t.cummax(0),
    "softmax": lambda t: t.softmax(0),
    "sort": lambda t: t.sort(0),
    "topk": lambda t: t.topk(1, 0),
    "var": lambda t: t.var(0, correction=0),
    "norm": lambda t: t.norm(),
    "median": lambda t: t.median(0),
}


@pytest.mark.parametrize("name", ZERO_DIM)
def test_zero_dim(name):
    _check(ZERO_DIM[name], torch.tensor(1.5))


# -- max / min ----------------------------------------------------------------------------------
EXTREMES = {
    "amax": lambda t: t.amax(1),
    "amax_dims_keepdim": lambda t: t.amax((0, 1), keepdim=True),
    "amin_neg": lambda t: t.amin(-1),
    "amax_empty_list": lambda t: torch.amax(t, dim=[]),
    "max": lambda t: t.max(),
    "min": lambda t: t.min(),
    "max_dim": lambda t: t.max(1),
    "min_dim_keepdim": lambda t: t.min(0, keepdim=True),
    "max_neg": lambda t: t.max(-1),
    "argmax": lambda t: t.argmax(),
    "argmax_dim": lambda t: t.argmax(1),
    "argmin_keepdim": lambda t: t.argmin(-1, keepdim=True),
    "argmax_none_keepdim": lambda t: t.argmax(keepdim=True),
    "aminmax": lambda t: torch.aminmax(t),
    "aminmax_dim": lambda t: torch.aminmax(t, dim=1, keepdim=True),
    "cummax": lambda t: t.cummax(1),
    "cummin": lambda t: t.cummin(0),
}


@pytest.mark.parametrize(("dtype", "case"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", EXTREMES)
def test_max_min_first_occurrence_and_nan(name, dtype, case):
    _check(EXTREMES[name], _case_input(dtype, case))


def test_bool_reductions():
    x = torch.tensor([[True, False, True], [True, True, True]])
    for fn in (lambda t: t.amax(1), lambda t: t.max(1), lambda t: t.any(1), lambda t: t.sum(1)):
        _check(fn, x)


# -- variance, norms, logsumexp -----------------------------------------------------------------
VARIANCES = {
    "var": lambda t: t.var(),
    "var_dim": lambda t: t.var(1),
    "var_dims_keepdim": lambda t: t.var((0, 1), keepdim=True),
    "var_corr0": lambda t: t.var(-1, correction=0),
    "var_corr2": lambda t: torch.var(t, 0, correction=2),
    "std": lambda t: t.std(1),
    "std_unbiased_false": lambda t: t.std(0, unbiased=False),
    "var_mean": lambda t: torch.var_mean(t, 1),
    "std_mean": lambda t: torch.std_mean(t, (0, 1), correction=0, keepdim=True),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", VARIANCES)
def test_variance(name, dtype):
    _check(VARIANCES[name], _input(dtype))


def test_var_more_correction_than_elements_is_nan():
    x = torch.tensor([[1.0], [2.0]])
    with pytest.warns(UserWarning):
        expected = torch.var(x, 1, correction=2)
    got = torch.var(x.to("tpu"), 1, correction=2).cpu()
    torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("ord", [0, 1, 2, INF, -INF, 3, 0.5])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_vector_norm(ord, dtype):
    x = _input(dtype)
    x.view(-1)[3] = 0
    _check(lambda t: torch.linalg.vector_norm(t, ord), x)
    _check(lambda t: torch.linalg.vector_norm(t, ord, dim=1, keepdim=True), x)


NORMS = {
    "norm": lambda t: t.norm(),
    "norm_p1_dim": lambda t: t.norm(p=1, dim=1),
    "norm_fro_dims": lambda t: torch.norm(t, dim=(0, 1)),
    "norm_inf_keepdim": lambda t: t.norm(p=INF, dim=-1, keepdim=True),
    "linalg_norm": lambda t: torch.linalg.norm(t, dim=1),
    "vector_norm_dtype": lambda t: torch.linalg.vector_norm(t, dtype=torch.float32),
    "logsumexp": lambda t: t.logsumexp(1),
    "logsumexp_dims_keepdim": lambda t: torch.logsumexp(t, (0, 1), keepdim=True),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", NORMS)
def test_norms_and_logsumexp(name, dtype):
    _check(NORMS[name], _input(dtype))


def test_logsumexp_infinities_and_ints():
    x = torch.tensor([[-INF, -INF], [INF, 1.0], [0.0, -INF]])
    _check(lambda t: t.logsumexp(1), x)
    _check(lambda t: t.logsumexp(0), torch.tensor([1, 2, 3]))


# -- boolean reductions -------------------------------------------------------------------------
BOOLEANS = {
    "any": lambda t: t.any(),
    "any_dim": lambda t: t.any(1),
    "any_dims_keepdim": lambda t: torch.any(t, dim=(0, 1), keepdim=True),
    "all": lambda t: t.all(),
    "all_dim_neg": lambda t: t.all(-1),
    "all_dims": lambda t: torch.all(t, dim=(0,)),
    "any_empty_list": lambda t: torch.any(t, dim=()),
}


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.uint8], ids=str)
@pytest.mark.parametrize("name", BOOLEANS)
def test_any_all(name, dtype):
    x = torch.tensor([[0, 1, 2], [0, 0, 0], [3, 4, 5]]).to(dtype)
    if dtype == torch.float32:
        x[1, 1] = NAN  # NaN is truthy
    _check(BOOLEANS[name], x)


# -- scans --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "case"), CASES[:4], ids=CASE_IDS[:4])
def test_logcumsumexp_and_cummax(dtype, case):
    x = _case_input(dtype, case)
    _check(lambda t: t.logcumsumexp(1), x)
    _check(lambda t: torch.cummax(t, 1), x)
    _check(lambda t: torch.cummin(t, -1), x)


def test_logcumsumexp_infinities():
    _check(lambda t: t.logcumsumexp(0), torch.tensor([-INF, -INF, 0.0, INF, 1.0]))


# -- softmax ------------------------------------------------------------------------------------
SOFTMAXES = {
    "softmax": lambda t: t.softmax(1),
    "softmax_neg": lambda t: t.softmax(-2),
    "log_softmax": lambda t: t.log_softmax(1),
    "softmax_to_f32": lambda t: F.softmax(t, 1, dtype=torch.float32),
    "log_softmax_to_f32": lambda t: F.log_softmax(t, -1, dtype=torch.float32),
    "safe_softmax": lambda t: torch.ops.aten._safe_softmax(t, -1),
}


@pytest.mark.parametrize("dtype", FLOATS + [torch.float16], ids=str)
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax(name, dtype):
    _check(SOFTMAXES[name], _input(dtype))


def test_softmax_half_to_float():
    """CUDA's fused fp16 -> fp32 softmax (CPU refuses it): same as upcasting first."""
    x = _input(torch.float16)
    for op in (torch.ops.aten._softmax, torch.ops.aten._log_softmax):
        got = op(x.to("tpu"), 1, True).cpu()
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, op(x.float(), 1, False), atol=1e-5, rtol=1e-5)


def test_safe_softmax_masked_rows_are_zero():
    x = torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]])
    got = torch.ops.aten._safe_softmax(x.to("tpu"), -1).cpu()
    torch.testing.assert_close(got, torch.ops.aten._safe_softmax(x, -1))
    assert torch.equal(got[1], torch.zeros(3))
    # plain softmax of a fully masked row is NaN, as on CPU
    assert torch.isnan(x.to("tpu").softmax(-1).cpu()[1]).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_softmax_backward_data(dtype):
    g, y = _input(dtype, seed=1), _input(dtype).softmax(1)
    _check(lambda t: torch.ops.aten._softmax_backward_data(t, y.to(t.device), 1, dtype), g)
    ly = _input(dtype).log_softmax(1)
    _check(lambda t: torch.ops.aten._log_softmax_backward_data(t, ly.to(t.device), 1, dtype), g)


# -- sorting ------------------------------------------------------------------------------------
SORTS = {
    "sort": lambda t: t.sort(1),
    "sort_dim0": lambda t: t.sort(0),
    "sort_desc": lambda t: t.sort(-1, descending=True),
    "sort_stable": lambda t: torch.sort(t, dim=1, stable=True),
    "sort_stable_desc": lambda t: torch.sort(t, dim=0, descending=True, stable=True),
    "argsort": lambda t: t.argsort(dim=1, stable=True),
    "argsort_desc": lambda t: torch.argsort(t, dim=0, descending=True, stable=True),
    "msort": lambda t: torch.msort(t),
}


@pytest.mark.parametrize(("dtype", "case"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", SORTS)
def test_sort_stable_nan_largest(name, dtype, case):
    _check(SORTS[name], _case_input(dtype, case))


def test_sort_signed_zero_and_bool():
    _check(lambda t: t.sort(stable=True), torch.tensor([0.0, -0.0, NAN, 1.0, -NAN, -0.0]))
    _check(lambda t: t.sort(descending=True, stable=True), torch.tensor([0.0, -0.0, NAN, 1.0, -0.0]))
    _check(lambda t: t.sort(stable=True), torch.tensor([True, False, True, False]))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(("dtype", "case"), CASES, ids=CASE_IDS)
def test_topk(dtype, case, largest):
    x = _case_input(dtype, case)
    fn = lambda t: t.topk(3, 1, largest=largest)
    _check(fn, x, indices="gather")
    _gathers(fn, x, 1, keepdim=True)
    fn0 = lambda t: torch.topk(t, 2, dim=0, largest=largest, sorted=True)
    _check(fn0, x, indices="gather")
    _gathers(fn0, x, 0, keepdim=True)


def test_topk_ties_prefer_lower_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    values, idx = x.to("tpu").topk(2, 1)
    assert idx.cpu().tolist() == [[1, 2]] and values.cpu().tolist() == [[3.0, 3.0]]


SELECTIONS = {
    "kthvalue": (lambda t: t.kthvalue(2, 1), 1, False),
    "kthvalue_keepdim": (lambda t: t.kthvalue(3, 0, keepdim=True), 0, True),
    "median_dim": (lambda t: t.median(1), 1, False),
    "median_dim0_keepdim": (lambda t: t.median(0, keepdim=True), 0, True),
    "nanmedian_dim": (lambda t: t.nanmedian(-1), 1, False),
    "mode": (lambda t: t.mode(1), 1, False),
}


@pytest.mark.parametrize(("dtype", "case"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", SELECTIONS)
def test_selection(name, dtype, case):
    if name == "mode" and case == "nan":
        pytest.skip("mode with NaN is unspecified")
    fn, dim, keepdim = SELECTIONS[name]
    x = _case_input(dtype, case)
    _check(fn, x, indices="gather")
    _gathers(fn, x, dim, keepdim)


def test_median_nan_index_and_mode_tie_rules():
    x = torch.tensor([[1.0, NAN, 2.0, NAN], [NAN, NAN, NAN, NAN], [3.0, 1.0, 2.0, 0.0]])
    _check(lambda t: t.median(1), x)  # NaN at the first NaN's index
    # all-NaN row: CPU's index is an nth_element artifact; ours points at a NaN too
    _check(lambda t: t.nanmedian(1), x, indices="gather")
    _gathers(lambda t: t.nanmedian(1), x, 1)
    _check(lambda t: t.median(), x[2])
    _check(lambda t: t.nanmedian(), x[0])
    # equal counts: the smallest value wins, indexed at its last occurrence
    _check(lambda t: t.mode(0), torch.tensor([3, 1, 3, 1, 2]))


# -- searching and histograms -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_searchsorted_and_bucketize(dtype):
    seq = torch.tensor([-2, -1, 0, 0, 1, 3]).to(dtype)
    values = _input(dtype, (3, 4))
    for right in (False, True):
        _check(lambda t, r=right: torch.searchsorted(seq.to(t.device), t, right=r), values)
        _check(lambda t, r=right: torch.bucketize(t, seq.to(t.device), right=r), values)
        _check(lambda t, r=right: torch.bucketize(t, seq.to(t.device), right=r, out_int32=True), values)
    _check(lambda t: torch.searchsorted(t, 0, side="right"), seq)
    # batched sequences and a sorter
    rows = torch.sort(_input(dtype, (3, 5)), dim=1).values
    _check(lambda t: torch.searchsorted(t, values.to(t.device)[:, :2].contiguous()), rows)
    unsorted = _input(dtype, (6,), seed=3)
    sorter = unsorted.argsort(stable=True)
    _check(
        lambda t: torch.searchsorted(t, values.to(t.device), sorter=sorter.to(t.device), out_int32=True),
        unsorted,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_histc_float(dtype):
    """Exact counts, bf16 included: the bin is computed with CPU's bf16 rounding after each step."""

    def check(x, *args, **kwargs):
        got = x.to("tpu").histc(*args, **kwargs).cpu()
        expected = x.histc(*args, **kwargs)
        assert got.dtype == dtype
        assert torch.equal(got, expected), f"{got} != {expected}"

    x = _input(dtype, (50,))
    check(x, 7)  # range taken from the data
    check(x, 5, min=-1, max=1)  # out-of-range values dropped
    check(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 4.0]).to(dtype), 4, min=0, max=4)  # top edge: last bin
    check(torch.full((4,), 2.0, dtype=dtype), 3)  # min == max: widened by 1
    check(torch.empty(0, dtype=dtype), 3)
    check(torch.tensor([NAN, 1.0, 2.0]).to(dtype), 2, min=0, max=2)  # NaN dropped
    if dtype == torch.float32:
        _check(lambda t: t.histc(7), x)
    # values on and one ulp either side of every edge: CPU truncates (v - min) * bins / (max - min)
    # without correcting against the edges, so some land in the neighbouring bin; so must ours
    edges = torch.linspace(-10, 0, 101, dtype=dtype)
    up, down = torch.tensor(100.0, dtype=dtype), torch.tensor(-100.0, dtype=dtype)
    near = torch.cat([edges, torch.nextafter(edges, up), torch.nextafter(edges, down)])
    near = near[near.abs() > 1e-30]  # XLA flushes denormals to zero (the one past 0 would count)
    check(near, 100, min=-10, max=0)
    check(near, 33, min=-7.1, max=-0.3)


def test_histc_int32_moe_expert_counts():
    """MoE on tpu calls histc on int32 expert ids (bins=experts, min=0, max=experts-1)."""
    experts = 8
    ids = torch.randint(0, experts, (64, 2), generator=torch.Generator().manual_seed(0)).int()
    got = torch.histc(ids.to("tpu"), bins=experts, min=0, max=experts - 1).cpu()
    assert got.dtype == torch.int32
    assert torch.equal(got, torch.bincount(ids.flatten(), minlength=experts).int())


def test_bincount():
    x = torch.tensor([0, 3, 3, 1, 5])
    _check(lambda t: t.bincount(), x)
    _check(lambda t: t.bincount(minlength=9), x)
    _check(lambda t: torch.bincount(t, minlength=4), torch.tensor([], dtype=torch.int64))
    for wdtype in (torch.float32, torch.bfloat16):
        w = torch.tensor([0.5, 1.0, 2.0, -1.0, 0.25]).to(wdtype)
        _check(lambda t, w=w: t.bincount(w.to(t.device)), x, tol=(1e-6, 1e-6))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.tensor([1, -1]).to("tpu").bincount()


# -- data-dependent shapes ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_nonzero_family(dtype):
    x = _input(dtype, (3, 4, 5)) if dtype != torch.bool else _input(torch.int64, (3, 4, 5)) > 0
    _check(lambda t: t.nonzero(), x)
    _check(lambda t: torch.argwhere(t), x)
    _check(lambda t: torch.where(t), x)
    _check(lambda t: t.nonzero(as_tuple=True), x)
    _check(lambda t: torch.nonzero_static(t, size=200), x)
    _check(lambda t: torch.nonzero_static(t, size=5, fill_value=-7), x)
    _check(lambda t: t.nonzero(), torch.zeros(0, 3, dtype=dtype))
    _check(lambda t: t.nonzero(), torch.zeros(2, 3, dtype=dtype))
    _check(lambda t: t.nonzero(), torch.tensor(1, dtype=dtype))


def test_host_ops_out_variants():
    x = _input(torch.float32, (3, 4))
    out = torch.empty(0, dtype=torch.int64, device="tpu")
    assert torch.nonzero(x.to("tpu") > 0, out=out) is out
    assert torch.equal(out.cpu(), torch.nonzero(x > 0))
    values = torch.empty(0, device="tpu")
    torch.masked_select(x.to("tpu"), x.to("tpu") > 0, out=values)
    assert torch.equal(values.cpu(), x[x > 0])


def test_masked_select():
    x = _input(torch.float32, (3, 4))
    mask = x > 0
    _check(lambda t: t.masked_select(mask.to(t.device)), x)
    _check(lambda t: t.masked_select(mask.to(t.device)[0]), x)  # broadcast mask
    _check(lambda t: torch.masked_select(t, torch.zeros(3, 4, dtype=torch.bool, device=t.device)), x)


UNIQUES = {
    "unique": lambda t: torch.unique(t),
    "unique_inverse_counts": lambda t: torch.unique(t, return_inverse=True, return_counts=True),
    "unique_unsorted_flags": lambda t: torch.ops.aten._unique2(t, True, False, True),
    "_unique": lambda t: torch.ops.aten._unique(t, True, True),
    "unique_consecutive": lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True),
    "unique_consecutive_plain": lambda t: torch.unique_consecutive(t),
    "unique_dim0": lambda t: torch.unique(t, dim=0, return_inverse=True, return_counts=True),
    "unique_dim1": lambda t: torch.unique(t, dim=1),
    "unique_consecutive_dim": lambda t: torch.unique_consecutive(t, dim=0, return_counts=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", UNIQUES)
def test_unique(name, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (6, 3), generator=g)
    x[3] = x[2]  # repeated consecutive rows
    x = (x > 0) if dtype == torch.bool else x.to(dtype)
    _check(UNIQUES[name], x)


def test_zero_size_inputs():
    _check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), torch.empty(0))
    _check(lambda t: torch.unique(t, dim=1), torch.empty(5, 0, 5))
    _check(lambda t: torch.unique_consecutive(t, dim=0), torch.empty(0, 3))
    _check(lambda t: torch.searchsorted(t, t), torch.empty(0, 0))
    _check(lambda t: torch.nonzero_static(t, size=3), torch.empty(5, 0, 5, dtype=torch.int64))
    _check(lambda t: t.masked_select(t > 0), torch.empty(0, 4))


# -- autograd through reductions ----------------------------------------------------------------
def _grad_matches(loss_fn, x, atol=1e-5):
    cpu = x.clone().requires_grad_()
    dev = x.to("tpu").requires_grad_()
    loss_fn(cpu).backward()
    loss_fn(dev).backward()
    assert dev.grad is not None and dev.grad.device.type == "tpu"
    torch.testing.assert_close(dev.grad.cpu(), cpu.grad, atol=atol, rtol=1e-4)


def _weights(t):
    return torch.linspace(-1.0, 2.0, t.shape[-1]).to(t.device)


GRADS = {
    "sum": lambda t: t.sum(),
    "sum_dim": lambda t: (t.sum(1, keepdim=True) * t).sum(),
    "mean": lambda t: (t.mean(0) * _weights(t)).sum(),
    "softmax": lambda t: (t.softmax(-1) * _weights(t)).sum(),
    "log_softmax": lambda t: (t.log_softmax(-1) * _weights(t)).sum(),
    "var": lambda t: t.var(1).sum(),
    "std_mean": lambda t: sum(o.sum() for o in torch.std_mean(t, 0, correction=0)),
    "logsumexp": lambda t: t.logsumexp(1).sum(),
    "norm": lambda t: t.norm(),
    "vector_norm_dim": lambda t: torch.linalg.vector_norm(t, 2, dim=1).sum(),
    "max_dim": lambda t: (t.max(1).values * _weights(t)[:4]).sum(),
    "amax": lambda t: t.amax(0).sum(),
    "prod": lambda t: t.prod(1).sum(),
    "cumsum": lambda t: (t.cumsum(1) * _weights(t)).sum(),
    "logcumsumexp": lambda t: t.logcumsumexp(1).sum(),
    "sort": lambda t: (t.sort(1).values * _weights(t)).sum(),
    "topk": lambda t: (t.topk(2, 0).values * _weights(t)).sum(),
}


@pytest.mark.parametrize("name", GRADS)
def test_autograd_matches_cpu(name):
    _grad_matches(GRADS[name], _input(torch.float32, (4, 6)))


def test_autograd_softmax_bf16():
    x = _input(torch.bfloat16, (3, 8))
    _grad_matches(lambda t: (t.softmax(-1).float() * _weights(t)).sum(), x, atol=2e-2)

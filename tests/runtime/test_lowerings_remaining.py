"""Histograms (histogram, histogramdd), segment_reduce, fractional max pooling and rrelu on tpu vs CPU
PyTorch: values, edge cases, errors and gradients, plus their OpInfo samples."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests import opinfo_report as rep

HALF_TOL = {"atol": 1e-2, "rtol": 1.6e-2}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tpu(v):
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, list | tuple):
        return type(v)(_tpu(x) for x in v)
    if isinstance(v, dict):
        return {k: _tpu(x) for k, x in v.items()}
    return v


def _cpu(v):
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, list | tuple):
        return type(v)(_cpu(x) for x in v)
    return v


def _both(fn, *args, **kwargs):
    """(CPU result, tpu result moved back to CPU) of fn on the same inputs."""
    want = fn(*args, **kwargs)
    got = _cpu(fn(*_tpu(args), **{k: _tpu(v) for k, v in kwargs.items()}))
    return want, got


def _errors_on_both(fn, *args, match: str | None = None, **kwargs) -> None:
    """CPU raises for these inputs, and so does tpu (with CPU's words when `match` is given)."""
    with pytest.raises((RuntimeError, NotImplementedError, IndexError)):
        fn(*args, **kwargs)
    with pytest.raises((RuntimeError, NotImplementedError, IndexError), match=match):
        fn(*_tpu(args), **{k: _tpu(v) for k, v in kwargs.items()})


# -- histogram --------------------------------------------------------------------------------------------
def _check_histogram(want, got, exact_counts: bool) -> None:
    # the edges are torch.linspace values: tpu's linspace may differ from CPU's FMA-rounded one by an ulp
    torch.testing.assert_close(got.bin_edges, want.bin_edges)
    if exact_counts:
        assert torch.equal(got.hist, want.hist), (got.hist, want.hist)
    else:
        torch.testing.assert_close(got.hist, want.hist)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rng", [None, (-1.0, 2.0), (0.25, 0.25)], ids=["data_range", "range", "point_range"])
@pytest.mark.parametrize("bins", [1, 7, 40])
def test_histogram_bin_count_matches_cpu(dtype, rng, bins):
    x = torch.randn(300, generator=_gen(bins), dtype=dtype) * 2
    want, got = _both(torch.histogram, x, bins, range=rng)
    _check_histogram(want, got, exact_counts=True)
    assert got.hist.dtype == got.bin_edges.dtype == dtype


@pytest.mark.parametrize("density", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_histogram_weights_and_density_match_cpu(density, weighted):
    g = _gen(1)
    x = torch.randn(4, 50, generator=g).round()  # many values on edges
    weight = torch.rand(4, 50, generator=g) if weighted else None
    for bins in (5, torch.tensor([-3.0, -1.0, 0.0, 0.5, 4.0])):
        want, got = _both(torch.histogram, x, bins, weight=weight, density=density)
        _check_histogram(want, got, exact_counts=not (weighted or density))
    # a weight with the input's number of elements but another shape is accepted, as on CPU
    want, got = _both(torch.histogram, x, 6, weight=torch.rand(200, generator=g), density=density)
    _check_histogram(want, got, exact_counts=False)


def test_histogram_counts_agree_with_the_returned_edges():
    """Each element lands in the bin its returned edges say (the CPU edge-tensor path as referee)."""
    x = torch.randn(2000, generator=_gen(2)) * 7
    got = _cpu(torch.histogram(x.to("tpu"), 37))
    assert torch.equal(got.hist, torch.histogram(x, got.bin_edges).hist)
    assert got.hist.sum() == x.numel()


def test_histogram_drops_out_of_range_and_nan_keeps_the_top_edge():
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, float("nan"), float("inf"), -float("inf")])
    want, got = _both(torch.histogram, x, 4, range=(0.0, 2.0))
    _check_histogram(want, got, exact_counts=True)
    assert got.hist.tolist() == [1.0, 1.0, 1.0, 2.0]  # 2.0 counts in the last bin


def test_histogram_edge_tensor_outside_values_and_density():
    x = torch.randn(100, generator=_gen(3))
    edges = torch.tensor([-0.5, 0.0, 0.1, 2.0])
    for density in (False, True):
        want, got = _both(torch.histogram, x, edges, density=density)
        # same counts and widths: density is count / total / width, two IEEE divisions as on CPU
        _check_histogram(want, got, exact_counts=True)


def test_histogram_empty_and_zero_dim_inputs():
    for x in (torch.empty(0), torch.empty(3, 0), torch.tensor(1.5)):
        for density in (False, True):
            want, got = _both(torch.histogram, x, 3, density=density)
            torch.testing.assert_close(got.bin_edges, want.bin_edges)
            torch.testing.assert_close(got.hist, want.hist, equal_nan=True)  # empty + density: NaN


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_histogram_half_precision_with_range_matches_cpu(dtype):
    x = (torch.randn(120, generator=_gen(4)) * 2).to(dtype)
    want, got = _both(torch.histogram, x, 9, range=(-2.0, 3.0))
    _check_histogram(want, got, exact_counts=True)


def test_histogram_out_variant():
    x = torch.randn(64, generator=_gen(5))
    hist, edges = torch.empty(0, device="tpu"), torch.empty(0, device="tpu")
    torch.histogram(x.to("tpu"), 6, range=(-1.0, 1.0), out=(hist, edges))
    want = torch.histogram(x, 6, range=(-1.0, 1.0))
    assert torch.equal(hist.cpu(), want.hist)
    torch.testing.assert_close(edges.cpu(), want.bin_edges)


def test_histogram_bad_input_raises_like_cpu():
    x = torch.randn(10)
    _errors_on_both(torch.histogram, torch.tensor([1.0, float("inf")]), 4, match="is not finite")
    _errors_on_both(torch.histogram, torch.tensor([1.0, float("nan")]), 4, match="is not finite")
    _errors_on_both(torch.histogram, x, 4, range=(1.0, 0.0), match="min should not exceed max")
    _errors_on_both(torch.histogram, x, 4, range=(0.0, float("inf")), match="is not finite")
    _errors_on_both(torch.histogram, x, 0, match="bins must be > 0")
    _errors_on_both(torch.histogram, torch.arange(5), 4, match="floating-point")
    _errors_on_both(torch.histogram, x, 3, weight=torch.ones(10, dtype=torch.float64), match="same dtype")
    _errors_on_both(torch.histogram, x, 3, weight=torch.ones(9), match="same shape")
    _errors_on_both(torch.histogram, x, torch.arange(3), match="same dtype")
    _errors_on_both(torch.histogram, x, torch.zeros(2, 2), match="one dimension")
    _errors_on_both(torch.histogram, x, torch.zeros(1), match="bins must be > 0")


# -- histogramdd ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("density", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "bins,rng",
    [([2, 3, 4], None), (5, None), ([3, 1, 2], [-1.0, 1.0, 0.0, 0.0, -3.0, 3.0])],
    ids=["per_dim", "int", "range"],
)
def test_histogramdd_matches_cpu(bins, rng, weighted, density):
    g = _gen(6)
    x = torch.randn(5, 8, 3, generator=g)
    weight = torch.rand(5, 8, generator=g) if weighted else None
    want, got = _both(torch.histogramdd, x, bins, range=rng, weight=weight, density=density)
    for w, t in zip(want.bin_edges, got.bin_edges):
        torch.testing.assert_close(t, w)
    if weighted or density:
        torch.testing.assert_close(got.hist, want.hist)
    else:
        assert torch.equal(got.hist, want.hist)


def test_histogramdd_edge_tensors_and_empty_input():
    g = _gen(7)
    x = torch.randn(40, 2, generator=g)
    edges = [torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-2.0, -0.5, 0.0, 0.5, 1.0])]
    for density in (False, True):
        want, got = _both(torch.histogramdd, x, edges, weight=torch.rand(40, generator=g), density=density)
        torch.testing.assert_close(got.hist, want.hist)
    want, got = _both(torch.histogramdd, torch.empty(0, 2), [2, 3])
    assert torch.equal(got.hist, want.hist)
    for w, t in zip(want.bin_edges, got.bin_edges):
        torch.testing.assert_close(t, w)


def test_histogramdd_bad_input_raises_like_cpu():
    x = torch.randn(4, 2)
    _errors_on_both(torch.histogramdd, x, [3, 3], range=[0.0, 1.0], match="range should have 4 elements")
    _errors_on_both(torch.histogramdd, x, [0, 3], match="bins must be > 0")
    _errors_on_both(torch.histogramdd, x, [3, 3], weight=torch.ones(3), match="same shape")
    _errors_on_both(torch.histogramdd, torch.tensor([[0.0, float("nan")]]), [2, 2], match="is not finite")


# -- segment_reduce ----------------------------------------------------------------------------------------
LENGTHS = torch.tensor([[2, 0, 5], [7, 0, 0], [1, 2, 4]])
OFFSETS = torch.tensor([[0, 2, 2, 7], [0, 7, 7, 7], [1, 2, 4, 6]])  # the last row leaves 0 and 6 out


def _segment_data(dtype, seed=8):
    data = torch.randn(3, 7, 4, generator=_gen(seed))
    data[0, 1, 0] = float("nan")
    data[2, 3, 1] = 0.0
    return data.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "max", "min", "amax", "amin"])
@pytest.mark.parametrize("initial", [None, 2.5])
@pytest.mark.parametrize("how", ["lengths", "offsets"])
def test_segment_reduce_matches_cpu(dtype, reduce, initial, how):
    data = _segment_data(dtype)
    index = {"lengths": LENGTHS, "offsets": OFFSETS}[how]
    want, got = _both(torch.segment_reduce, data, reduce, **{how: index}, axis=1, initial=initial)
    tol = HALF_TOL if dtype in (torch.bfloat16, torch.float16) else {}
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    assert got.dtype == dtype


def test_segment_reduce_1d_int32_lengths_and_empty_data():
    data = torch.randn(7, generator=_gen(9))
    for reduce in ("sum", "mean", "max"):
        want, got = _both(
            torch.segment_reduce, data, reduce, lengths=torch.tensor([3, 0, 4], dtype=torch.int32)
        )
        torch.testing.assert_close(got, want, equal_nan=True)
        want, got = _both(torch.segment_reduce, torch.empty(0), reduce, lengths=torch.tensor([0, 0]))
        torch.testing.assert_close(got, want, equal_nan=True)  # empty mean: NaN
    want, got = _both(torch.segment_reduce, data, "sum", lengths=torch.tensor([2, 2]), unsafe=True)
    torch.testing.assert_close(got, want)  # unsafe: unchecked lengths, the rest ignored


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "max", "min"])
@pytest.mark.parametrize("case", ["plain", "ties_and_zeros", "nan_offsets"])
def test_segment_reduce_backward_matches_cpu(dtype, reduce, case):
    data = torch.randn(3, 7, 4, generator=_gen(10), dtype=torch.float64)
    kwargs = {"lengths": LENGTHS, "axis": 1, "initial": 2.0 if case == "plain" else None}
    if case == "ties_and_zeros":
        data = data.round()
        data[0, 0, 0] = data[0, 1, 0] = 0.0  # two zeros in one prod segment
    if case == "nan_offsets":
        data[1, 2, 1] = float("nan")
        data[2, 3, 2] = 0.0
        kwargs = {"offsets": OFFSETS, "axis": 1}
    data = data.to(dtype)
    grad = torch.randn(3, 3, 4, generator=_gen(11), dtype=dtype)
    a = data.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.segment_reduce(a, reduce, **kwargs), a, grad)
    b = data.to("tpu").requires_grad_()
    (got,) = torch.autograd.grad(torch.segment_reduce(b, reduce, **_tpu(kwargs)), b, grad.to("tpu"))
    tol = HALF_TOL if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **tol)


def test_segment_reduce_bad_input_raises_like_cpu():
    data = torch.randn(5)
    sr = torch.segment_reduce
    _errors_on_both(sr, data, "sum", lengths=torch.tensor([2, 2]), match="to sum to data.size")
    _errors_on_both(sr, data, "sum", lengths=torch.tensor([6, -1]), match="negative value")
    _errors_on_both(sr, data, "foo", lengths=torch.tensor([2, 3]), match="reduce argument must be")
    _errors_on_both(sr, data, "sum", match="Either lengths or offsets")
    _errors_on_both(sr, data, "sum", lengths=torch.tensor([2.0, 3.0]), match="int32 or int64")
    _errors_on_both(sr, torch.arange(5), "sum", lengths=torch.tensor([2, 3]), match="floating-point")
    _errors_on_both(
        sr, torch.randn(3, 4), "sum", lengths=torch.tensor([2, 2]), axis=1, match="last dimension"
    )


# -- fractional max pooling ---------------------------------------------------------------------------------
def _fmp(n):
    return torch.ops.aten.fractional_max_pool2d if n == 2 else torch.ops.aten.fractional_max_pool3d


def _check_fmp(n, x, kernel, output, samples) -> None:
    want, got = _both(_fmp(n), x, kernel, output, samples)
    assert torch.equal(got[1], want[1]), "indices differ"
    torch.testing.assert_close(got[0], want[0], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape,kernel,output",
    [
        ((2, 3, 11, 9), [2, 3], [4, 5]),
        ((3, 13, 10), [3, 2], [5, 9]),  # unbatched; 9 + 2 - 1 == 10 fills the width
        ((1, 2, 7, 8), [1, 1], [7, 1]),  # output 1: the only window ends at the edge
        ((2, 1, 25, 31), [3, 3], [10, 12]),
    ],
)
def test_fractional_max_pool2d_matches_cpu(dtype, shape, kernel, output):
    g = _gen(12)
    x = torch.randn(shape, generator=g).to(dtype)
    x.view(-1)[::17] = x.view(-1)[3]  # ties: the first maximum wins
    x.view(-1)[5] = float("nan")
    planes = (shape[0], shape[1]) if len(shape) == 4 else (1, shape[0])
    samples = torch.rand(*planes, 2, generator=g).to(dtype)
    _check_fmp(2, x, kernel, output, samples)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,kernel,output",
    [
        ((2, 3, 7, 8, 9), [2, 2, 3], [3, 4, 5]),
        ((2, 6, 5, 7), [1, 2, 2], [5, 3, 2]),
        ((1, 1, 4, 4, 4), [2, 2, 2], [1, 2, 2]),
    ],
)
def test_fractional_max_pool3d_matches_cpu(dtype, shape, kernel, output):
    g = _gen(13)
    x = torch.randn(shape, generator=g).to(dtype)
    x.view(-1)[7] = float("nan")
    planes = (shape[0], shape[1]) if len(shape) == 5 else (1, shape[0])
    samples = torch.rand(*planes, 3, generator=g).to(dtype)
    _check_fmp(3, x, kernel, output, samples)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fractional_max_pool_half_intervals_round_like_cpu(dtype):
    """ATen computes the window starts in the input dtype: at sizes in the hundreds bf16/f16 rounding
    moves them, so float32 arithmetic would pick other windows."""
    g = _gen(14)
    compared = 0
    for _ in range(12):
        h, w = torch.randint(60, 160, (2,), generator=g).tolist()
        output = [
            int(torch.randint(20, h - 2, (), generator=g)),
            int(torch.randint(20, w - 3, (), generator=g)),
        ]
        x = torch.randn(1, 2, h, w, generator=g).to(dtype)
        samples = torch.rand(1, 2, 2, generator=g).to(dtype)
        try:
            torch.ops.aten.fractional_max_pool2d(x, [2, 3], output, samples)
        except RuntimeError:  # CPU's own bf16 windows can leave the input (an internal assert there)
            continue
        _check_fmp(2, x, [2, 3], output, samples)
        compared += 1
    assert compared >= 6


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fractional_max_pool_backward_matches_cpu(n, dtype):
    g = _gen(15 + n)
    shape = (2, 3, 11, 9) if n == 2 else (2, 2, 7, 7, 8)
    x = torch.randn(shape, generator=g, dtype=dtype).round(decimals=1)  # ties between overlapping windows
    samples = torch.rand(2, shape[1], n, generator=g, dtype=dtype)
    pool = F.fractional_max_pool2d if n == 2 else F.fractional_max_pool3d
    kwargs = {"kernel_size": 3, "output_size": 4, "_random_samples": samples}
    a = x.clone().requires_grad_()
    out = pool(a, **kwargs)
    grad = torch.randn(out.shape, generator=g, dtype=dtype)
    (want,) = torch.autograd.grad(out, a, grad)
    b = x.to("tpu").requires_grad_()
    out_t = pool(b, **_tpu(kwargs))
    (got,) = torch.autograd.grad(out_t, b, grad.to("tpu"))
    torch.testing.assert_close(out_t.detach().cpu(), out.detach(), atol=0, rtol=0)
    torch.testing.assert_close(got.cpu(), want)


def test_fractional_max_pool_draws_samples_on_tpu_and_indices_point_at_maxima():
    x = torch.randn(2, 3, 12, 10, generator=_gen(17))
    torch.manual_seed(0)
    out, idx = F.fractional_max_pool2d(x.to("tpu"), 2, output_ratio=(0.5, 0.5), return_indices=True)
    out, idx = out.cpu(), idx.cpu()
    assert out.shape == idx.shape == (2, 3, 6, 5)
    assert torch.equal(out, x.flatten(2).gather(2, idx.flatten(2)).view_as(out))
    assert idx.min() >= 0 and idx.max() < 120


def test_fractional_max_pool_empty_batch_and_bad_input():
    for n in (2, 3):
        x = torch.randn((0, 2) + (6,) * n)
        want, got = _both(_fmp(n), x, [2] * n, [3] * n, torch.rand(0, 2, n))
        assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
        ok = torch.randn((1, 2) + (6,) * n)
        _errors_on_both(
            _fmp(n), ok.long(), [2] * n, [3] * n, torch.rand(1, 2, n).long(), match="floating-point"
        )
        _errors_on_both(_fmp(n), ok, [2] * n, [3] * n, torch.rand(1, 2, n).double(), match="same dtype")
        _errors_on_both(_fmp(n), ok, [4] * n, [5] * n, torch.rand(1, 2, n), match="too large")
        _errors_on_both(_fmp(n), ok.expand((2, 2) + (6,) * n), [2] * n, [3] * n, torch.rand(1, 2, n))
    _errors_on_both(
        _fmp(3), torch.randn(1, 0, 5, 5, 5), [2] * 3, [2] * 3, torch.rand(1, 0, 3), match="non-zero"
    )


# -- rrelu -------------------------------------------------------------------------------------------------
def _rrelu_input(dtype):
    x = torch.randn(6, 50, generator=_gen(18))
    x[0, :3] = torch.tensor([0.0, -0.0, float("nan")])
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rrelu_training_writes_the_noise_it_used(dtype):
    x = _rrelu_input(dtype)
    noise = torch.zeros_like(x, device="tpu")
    out = torch.ops.aten.rrelu_with_noise(x.to("tpu"), noise, 0.1, 0.3, True).cpu()
    noise = noise.cpu()
    neg = x <= 0
    assert torch.equal(noise[~neg], torch.ones_like(noise[~neg]))  # x > 0 and NaN
    assert noise[neg].min() >= 0.1 and noise[neg].max() <= 0.3
    want = torch.where(neg, (x.double() * noise.double()).to(dtype), x)  # exact product, one rounding
    torch.testing.assert_close(out, want, equal_nan=True, atol=0, rtol=0)
    assert out[0, 1].item() == 0.0 and torch.isnan(out[0, 2])


def test_rrelu_slopes_are_uniform_and_seeded():
    x = -torch.ones(20000, device="tpu")
    torch.manual_seed(1)
    noise = torch.empty_like(x)
    torch.ops.aten.rrelu_with_noise(x, noise, 0.2, 0.6, True)
    torch.manual_seed(1)
    again = torch.empty_like(x)
    torch.ops.aten.rrelu_with_noise(x, again, 0.2, 0.6, True)
    n = noise.cpu()
    assert torch.equal(n, again.cpu())
    assert abs(n.mean().item() - 0.4) < 0.005 and abs(n.std().item() - 0.4 / 12**0.5) < 0.005


def test_rrelu_with_a_cpu_generator_equals_cpu():
    x = _rrelu_input(torch.float32)
    n_cpu, n_tpu = torch.zeros_like(x), torch.zeros_like(x, device="tpu")
    want = torch.ops.aten.rrelu_with_noise(x, n_cpu, 0.1, 0.3, True, _gen(3))
    got = torch.ops.aten.rrelu_with_noise(x.to("tpu"), n_tpu, 0.1, 0.3, True, _gen(3))
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=0, rtol=0)
    assert torch.equal(n_tpu.cpu(), n_cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rrelu_eval_is_leaky_relu_and_leaves_noise_alone(dtype):
    x = _rrelu_input(dtype)
    want, got = _both(F.rrelu, x, 0.1, 0.4, training=False)
    torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=0)
    noise = torch.full(x.shape, 7.0, dtype=dtype, device="tpu")
    torch.ops.aten.rrelu_with_noise(x.to("tpu"), noise, 0.1, 0.4, False)
    assert (noise.cpu() == 7).all()


@pytest.mark.parametrize("training", [True, False])
def test_rrelu_backward_matches_cpu_given_the_noise(training):
    x = _rrelu_input(torch.float64)
    grad = torch.randn(x.shape, generator=_gen(19), dtype=torch.float64)
    xt = x.to("tpu").requires_grad_()
    noise = torch.zeros_like(xt).detach()
    out = torch.ops.aten.rrelu_with_noise(xt, noise, 0.1, 0.3, training)
    (got,) = torch.autograd.grad(out, xt, grad.to("tpu"))
    want = torch.ops.aten.rrelu_with_noise_backward(grad, x, noise.cpu(), 0.1, 0.3, training, False)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    if not training:  # deterministic: autograd on CPU too
        a = x.clone().requires_grad_()
        (cpu_grad,) = torch.autograd.grad(F.rrelu(a, 0.1, 0.3, training=False), a, grad)
        torch.testing.assert_close(got.cpu(), cpu_grad)


def test_rrelu_in_place_and_out_variants():
    x = _rrelu_input(torch.float32)
    y = x.to("tpu")
    noise = torch.zeros_like(y)
    assert torch.ops.aten.rrelu_with_noise_(y, noise, 0.1, 0.3, True) is y
    neg = x <= 0
    torch.testing.assert_close(y.cpu(), torch.where(neg, x * noise.cpu(), x), equal_nan=True, atol=0, rtol=0)
    z = x.to("tpu")
    torch.rrelu_(z, 0.1, 0.3, training=False)
    torch.testing.assert_close(z.cpu(), F.rrelu(x, 0.1, 0.3), equal_nan=True)
    out = torch.empty(0, device="tpu")
    torch.ops.aten.rrelu_with_noise.out(x.to("tpu"), torch.zeros_like(y), 0.1, 0.3, False, out=out)
    torch.testing.assert_close(out.cpu(), F.rrelu(x, 0.1, 0.3), equal_nan=True)


def test_rrelu_bad_input_raises():
    x = -torch.ones(3)
    op = torch.ops.aten.rrelu_with_noise
    _errors_on_both(op, x, torch.ones(4), 0.1, 0.3, True, match="noise tensor shape must match")
    _errors_on_both(op, x.long(), x.long(), 0.1, 0.3, True, match="not implemented for 'Long'")
    _errors_on_both(op, x, x.double(), 0.1, 0.3, True, match="noise of dtype")
    _errors_on_both(op, x, torch.ones(3), 0.5, 0.3, True, match="must not exceed upper")


# -- compiled graphs and OpInfo samples -----------------------------------------------------------------------
def test_compiled_histogram_and_segment_reduce_match_cpu():
    """Inside torch.compile the bin-count histogram and segment_reduce use their jitted graph bodies."""
    x = torch.randn(100, generator=_gen(20))

    def fn(t):
        lengths = torch.tensor([30, 0, 70], device=t.device)
        return torch.histogram(t, 6), torch.segment_reduce(t, "max", lengths=lengths)

    (hist, edges), seg = _cpu(torch.compile(fn, backend="tpu")(x.to("tpu")))
    (w_hist, w_edges), w_seg = fn(x)
    assert torch.equal(hist, w_hist)
    torch.testing.assert_close(edges, w_edges)
    torch.testing.assert_close(seg, w_seg)


OPINFO_KEYS = [
    "histogram",
    "histogramdd",
    "_segment_reduce.lengths",
    "_segment_reduce.offsets",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "nn.functional.rrelu",
]


@pytest.mark.parametrize("key", OPINFO_KEYS)
def test_opinfo_samples_pass(key):
    """Every float32 OpInfo sample runs on tpu and matches CPU (random ops: shape/dtype/invariant)."""
    res = rep.run_opinfo(rep.opinfos()[key], dtypes=(torch.float32,), budget_s=300)
    assert res.status == "lowered", (res.status, res.missing, res.top_error)
    assert res.samples > 0 and res.passed == res.samples, (res.passed, res.samples, res.top_error)

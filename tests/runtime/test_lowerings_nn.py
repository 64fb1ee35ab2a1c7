"""Matmuls, convolutions, normalization, pooling, resampling, losses and attention on tpu match CPU PyTorch.

Each case runs the same function on CPU tensors and on their tpu copies and compares values, dtypes and
shapes; autograd cases also compare every input gradient. Tolerances: float32 1e-5 (1e-4 where the
two sides sum in different orders over long reductions or use different factorizations); bfloat16
2e-2 absolute and relative — PyTorch CPU and we both accumulate in float32 and round once, so results
differ by at most about one bf16 ulp (2^-8 relative) plus float32 summation-order noise.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

import hf_tpu.runtime.lowerings.attention as attention

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=_gen(seed)).to(dtype)


def _tpu(v):
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, list | tuple):
        return type(v)(_tpu(x) for x in v)
    return v


def _as_tuple(out):
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def check(fn, *args, atol=1e-5, rtol=1e-5, **kwargs):
    """fn on CPU vs fn on tpu copies of every tensor argument (kwargs included)."""
    expected = _as_tuple(fn(*args, **kwargs))
    got = _as_tuple(fn(*_tpu(args), **{k: _tpu(v) for k, v in kwargs.items()}))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if not isinstance(e, torch.Tensor):
            assert g == e
            continue
        assert g.device.type == "tpu"
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, atol=atol, rtol=rtol, equal_nan=True)
    return got


def check_grad(fn, inputs, *, constants=(), atol=1e-4, rtol=1e-4):
    """Forward values and gradients of every floating input agree between CPU and tpu."""
    cpu = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    dev = [x.to("tpu").requires_grad_(x.is_floating_point()) for x in inputs]
    out_cpu = fn(*cpu, *constants)
    out_dev = fn(*dev, *_tpu(list(constants)))
    torch.testing.assert_close(out_dev.detach().cpu(), out_cpu.detach(), atol=atol, rtol=rtol)
    cotangent = randn(*out_cpu.shape, seed=99)
    out_cpu.backward(cotangent)
    out_dev.backward(cotangent.to("tpu"))
    for c, d in zip(cpu, dev):
        if c.requires_grad:
            assert d.grad is not None and d.grad.device.type == "tpu"
            torch.testing.assert_close(d.grad.cpu(), c.grad, atol=atol, rtol=rtol)


# -- matrix products --------------------------------------------------------------------------------
def test_matrix_products_float32():
    a, b = randn(4, 6), randn(6, 5, seed=1)
    check(torch.mm, a, b)
    check(torch.addmm, randn(5, seed=2), a, b, beta=0.5, alpha=2)
    check(torch.bmm, randn(3, 4, 6), randn(3, 6, 5, seed=1))
    check(torch.baddbmm, randn(3, 4, 5), randn(3, 4, 6, seed=1), randn(3, 6, 5, seed=2), beta=0.3, alpha=1.5)
    check(torch.addbmm, randn(4, 5), randn(3, 4, 6, seed=1), randn(3, 6, 5, seed=2), beta=0.3, alpha=1.5)
    check(torch.dot, randn(6), randn(6, seed=1))
    check(torch.vdot, randn(6), randn(6, seed=1))
    check(torch.mv, a, randn(6, seed=3))
    check(torch.addmv, randn(4), a, randn(6, seed=3), beta=2, alpha=0.5)
    check(torch.addr, randn(4, 6), randn(4, seed=1), randn(6, seed=2))
    check(torch.outer, randn(4), randn(6, seed=1))
    check(
        torch.mm,
        torch.randint(-5, 5, (3, 4), generator=_gen()),
        torch.randint(-5, 5, (4, 2), generator=_gen(1)),
    )


def test_addmm_beta_zero_ignores_self_nan():
    """PyTorch: with beta=0 the `self` term is not evaluated, so its NaNs do not propagate."""
    out = check(torch.addmm, torch.full((4, 5), float("nan")), randn(4, 6), randn(6, 5, seed=1), beta=0)[0]
    assert not torch.isnan(out.cpu()).any()


@pytest.mark.parametrize("beta, alpha", [(0.6, 0.2), (2, 3), (1.5, 2.5)])
def test_integer_products_truncate_beta_and_alpha(beta, alpha):
    """CPU casts Scalar beta/alpha to the integer dtype first: 0.6 -> 0 (and `self` is dropped)."""
    ints = lambda *shape, seed=0: torch.randint(-9, 9, shape, generator=_gen(seed))  # noqa: E731
    kw = {"beta": beta, "alpha": alpha}
    check(torch.addmv, ints(5), ints(5, 10, seed=1), ints(10, seed=2), **kw)
    check(torch.addmm, ints(1), ints(5, 10, seed=1), ints(10, 3, seed=2), **kw)
    check(torch.baddbmm, ints(5, 3, 4), ints(5, 3, 2, seed=1), ints(5, 2, 4, seed=2), **kw)
    check(torch.addbmm, ints(3, 4), ints(5, 3, 2, seed=1), ints(5, 2, 4, seed=2), **kw)
    if isinstance(beta, int) and isinstance(alpha, int):  # addr rejects float scalars for integers
        check(torch.addr, ints(3, 4), ints(3, seed=1), ints(4, seed=2), **kw)


def test_matmul_bfloat16():
    a, b = randn(8, 32, dtype=torch.bfloat16), randn(32, 16, seed=1, dtype=torch.bfloat16)
    check(torch.mm, a, b, **BF16_TOL)
    check(torch.nn.functional.linear, a, b.T, randn(16, seed=2, dtype=torch.bfloat16), **BF16_TOL)
    check(torch.bmm, a.reshape(2, 4, 32), b.expand(2, 32, 16), **BF16_TOL)


# -- grouped matmul (MoE) ---------------------------------------------------------------------------
OFFS = torch.tensor([8, 8, 16, 24], dtype=torch.int32)  # an empty group included


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_grouped_mm_layouts(dtype):
    tol = BF16_TOL if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    # 2D x 3D: rows grouped by offs, one weight per group (the MoE forward)
    check(torch._grouped_mm, randn(24, 8, dtype=dtype), randn(4, 8, 16, seed=1, dtype=dtype), OFFS, **tol)
    # 2D x 2D: the contracted dim grouped (weight gradients) -> (G, M, N)
    check(torch._grouped_mm, randn(6, 24, dtype=dtype), randn(24, 16, seed=1, dtype=dtype), OFFS, **tol)
    # 3D x 2D: output columns grouped
    check(torch._grouped_mm, randn(4, 6, 8, dtype=dtype), randn(8, 24, seed=1, dtype=dtype), OFFS, **tol)
    # 3D x 3D: batched, no offsets
    check(torch._grouped_mm, randn(4, 6, 8, dtype=dtype), randn(4, 8, 16, seed=1, dtype=dtype), **tol)


def test_grouped_mm_rows_past_last_offset_are_zero():
    out = torch._grouped_mm(
        randn(6, 8).to("tpu"), randn(3, 8, 16).to("tpu"), torch.tensor([2, 2, 5]).int().to("tpu")
    )
    assert out.shape == (6, 16)
    assert torch.equal(out[5].cpu(), torch.zeros(16))


def test_grouped_mm_autograd():
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)
    check_grad(
        lambda a, b, o: torch._grouped_mm(a, b, o), [randn(6, 8), randn(3, 8, 16, seed=1)], constants=[offs]
    )


# -- dense linear algebra -----------------------------------------------------------------------------
def test_linalg_basics():
    a = randn(3, 4, 4) + 4 * torch.eye(4)
    spd = a @ a.mT
    check(torch.linalg.inv, a, atol=1e-4, rtol=1e-4)
    check(torch.linalg.det, a, atol=1e-3, rtol=1e-4)
    check(torch.linalg.slogdet, a, atol=1e-4, rtol=1e-4)
    check(torch.linalg.cholesky, spd, atol=1e-4, rtol=1e-4)
    check(torch.linalg.solve, a, randn(3, 4, 2, seed=1), atol=1e-4, rtol=1e-4)
    check(torch.linalg.solve, a, randn(3, 2, 4, seed=1), left=False, atol=1e-4, rtol=1e-4)
    check(torch.linalg.solve_triangular, a.triu(), randn(3, 4, 2, seed=1), upper=True, atol=1e-4, rtol=1e-4)


def test_linalg_autograd():
    a = randn(4, 4) + 4 * torch.eye(4)
    check_grad(torch.linalg.det, [a], atol=1e-3)
    check_grad(torch.linalg.inv, [a])


def test_native_dropout_backward_promotes_like_cpu():
    """grad * mask * scale: a bool/int grad promotes with the float scale (True * 2.0 = 2.0)."""
    mask = torch.rand(4, 5, generator=_gen()) > 0.5
    op = torch.ops.aten.native_dropout_backward
    check(op, mask.logical_not(), mask, 2.0)
    check(op, randn(4, 5), mask, 1.25)
    check(op, randn(4, 5, dtype=torch.bfloat16), mask, 3.0, **BF16_TOL)


# -- pairwise distances -------------------------------------------------------------------------------
P_NORMS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")]
CDIST_MODES = [
    "use_mm_for_euclid_dist_if_necessary",
    "use_mm_for_euclid_dist",
    "donot_use_mm_for_euclid_dist",
]


def _with_ties(a, b):
    """Some exactly equal rows and coordinates: zero distances and zero differences (subgradients)."""
    rows = a.reshape(-1, a.shape[-1])
    b = b.clone()
    b[..., 0, :] = rows[0]
    b[..., 1, :2] = rows[1, :2]
    return a, b


def _p_params():
    quick = (0.0, 1.5, 2.0, float("inf"))
    return [pytest.param(p, marks=() if p in quick else pytest.mark.slow) for p in P_NORMS]


@pytest.mark.parametrize("p", _p_params())
def test_cdist_values_and_grads(p):
    # batch dims broadcast (2,) x (1,), with zero distances and zero coordinate differences
    a, b = _with_ties(randn(2, 5, 4), randn(1, 6, 4, seed=1))
    check_grad(lambda u, v: torch.cdist(u, v, p), [a, b])


def test_cdist_euclidean_compute_modes():
    """p=2 past 25 rows (or when asked) goes through the matmul form, like CPU: same values, grads."""
    check_grad(lambda u, v: torch.cdist(u, v), [randn(30, 3), randn(27, 3, seed=1)])
    mm, direct = CDIST_MODES[1:]
    check_grad(lambda u, v: torch.cdist(u, v, compute_mode=mm), [randn(2, 4, 3), randn(2, 5, 3, seed=1)])
    check_grad(lambda u, v: torch.cdist(u, v, compute_mode=direct), [randn(30, 3), randn(27, 3, seed=1)])


def test_cdist_empty_and_featureless():
    check(torch.cdist, randn(0, 3), randn(4, 3))
    check(torch.cdist, randn(2, 0), randn(4, 0), p=1.0)
    check(torch.cdist, randn(3, 2, 5), randn(3, 0, 5), p=3.0)


@pytest.mark.parametrize("p", _p_params())
def test_pdist_values_and_grads(p):
    x = randn(6, 3)
    x[3] = x[1]  # a zero distance
    check_grad(lambda v: torch.pdist(v, p), [x])


# -- grid sampling ----------------------------------------------------------------------------------
def _grid(*shape, seed=1):
    """Points inside and outside [-1, 1], with some exactly on the border (clip/reflect edges)."""
    g = torch.rand(shape, generator=_gen(seed)) * 2.6 - 1.3
    g.view(-1)[[0, 1, 5, 7]] = torch.tensor([1.0, -1.0, 0.0, -1.0])
    return g


GRID_CASES = [
    (mode, padding, align)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for align in (False, True)
]
# the default run: every mode, padding and align_corners value at least once in 2-d and 3-d, with the
# edge-sensitive pairs (border/reflection with align_corners: grid = +-1 lands on the clip limits)
GRID_QUICK = {
    2: [("bilinear", "border", True), ("nearest", "zeros", False), ("bicubic", "reflection", True)],
    3: [("bilinear", "reflection", True), ("nearest", "border", False)],
}


def _grid_params(cases, nd):
    return [pytest.param(*c, marks=() if c in GRID_QUICK[nd] else pytest.mark.slow) for c in cases]


@pytest.mark.parametrize("mode, padding, align", _grid_params(GRID_CASES, 2))
def test_grid_sample_2d(mode, padding, align):
    kw = {"mode": mode, "padding_mode": padding, "align_corners": align}
    check_grad(lambda x, g: F.grid_sample(x, g, **kw), [randn(2, 3, 5, 6), _grid(2, 4, 3, 2)])


@pytest.mark.parametrize(
    "mode, padding, align", _grid_params([c for c in GRID_CASES if c[0] != "bicubic"], 3)
)
def test_grid_sample_3d(mode, padding, align):
    kw = {"mode": mode, "padding_mode": padding, "align_corners": align}
    check_grad(lambda x, g: F.grid_sample(x, g, **kw), [randn(2, 3, 5, 6, 4), _grid(2, 4, 3, 2, 3)])


def test_grid_sample_bfloat16_and_input_grad_only():
    x, g = randn(1, 2, 6, 5, dtype=torch.bfloat16), _grid(1, 3, 4, 2).bfloat16()
    # CPU's bf16 kernel rounds every coordinate step to bf16, we keep them in f32: compare to f32 math
    got = F.grid_sample(x.to("tpu"), g.to("tpu"), align_corners=False).cpu()
    expected = F.grid_sample(x.float(), g.float(), align_corners=False)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, **BF16_TOL)
    # the grid needs no gradient: grid_sampler_2d_backward is asked for the input's only
    xc, xt = randn(1, 2, 6, 5).requires_grad_(), randn(1, 2, 6, 5).to("tpu").requires_grad_()
    grid = _grid(1, 3, 4, 2)
    F.grid_sample(xc, grid, align_corners=True).sum().backward()
    F.grid_sample(xt, grid.to("tpu"), align_corners=True).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, atol=1e-5, rtol=1e-5)


# -- convolution ------------------------------------------------------------------------------------
CONV_CASES = {
    # the convolutions of a diffusers UNet / VAE
    "3x3_pad1": dict(w=(16, 8, 3, 3), padding=1),
    "3x3_stride2_downsample": dict(w=(16, 8, 3, 3), stride=2, padding=1),
    "1x1_shortcut": dict(w=(4, 8, 1, 1)),
    "grouped": dict(w=(16, 2, 3, 3), padding=1, groups=4),
    "depthwise_dilated": dict(w=(8, 1, 3, 3), padding=2, dilation=2, groups=8),
    "same": dict(w=(16, 8, 3, 3), padding="same"),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d(case):
    spec = dict(CONV_CASES[case])
    w = randn(*spec.pop("w"), seed=1)
    check(F.conv2d, randn(2, 8, 9, 9), w, randn(w.shape[0], seed=2), **spec, atol=1e-4, rtol=1e-4)


def test_conv_1d_3d_transposed_unbatched():
    check(F.conv1d, randn(2, 4, 10), randn(6, 4, 3, seed=1), None, stride=2, padding=1, atol=1e-4)
    check(F.conv3d, randn(1, 2, 5, 6, 7), randn(4, 2, 3, 3, 3, seed=1), None, padding=1, atol=1e-4)
    check(F.conv2d, randn(8, 9, 9), randn(4, 8, 3, 3, seed=1), None, padding=1, atol=1e-4)
    x = randn(2, 8, 5, 5)
    check(
        F.conv_transpose2d,
        x,
        randn(8, 6, 3, 3, seed=1),
        randn(6, seed=2),
        stride=2,
        padding=1,
        output_padding=1,
        atol=1e-4,
    )
    check(
        F.conv_transpose2d,
        x,
        randn(8, 3, 3, 3, seed=1),
        None,
        stride=2,
        padding=1,
        groups=2,
        dilation=2,
        atol=1e-4,
    )
    check(F.conv_transpose1d, randn(2, 4, 10), randn(4, 6, 4, seed=1), None, stride=3, atol=1e-4)


def test_conv2d_bfloat16():
    x, w = randn(2, 8, 9, 9, dtype=torch.bfloat16), randn(16, 8, 3, 3, seed=1, dtype=torch.bfloat16)
    check(F.conv2d, x, w, None, padding=1, atol=5e-2, rtol=2e-2)


def test_conv2d_autograd():
    check_grad(
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        [randn(2, 4, 9, 9), randn(6, 4, 3, 3, seed=1), randn(6, seed=2)],
    )
    check_grad(
        lambda x, w: F.conv2d(x, w, None, padding=1, groups=2), [randn(2, 4, 7, 7), randn(6, 2, 3, 3, seed=1)]
    )
    check_grad(
        lambda x, w: F.conv_transpose2d(x, w, None, stride=2, padding=1, output_padding=1),
        [randn(2, 4, 5, 5), randn(4, 3, 3, 3, seed=1)],
    )


def test_unfold_fold():
    check(F.unfold, randn(2, 8, 9, 9), (2, 3), padding=1, stride=2)
    check(F.fold, randn(2, 48, 30), (9, 11), (2, 3), padding=1, stride=2)


# -- normalization ----------------------------------------------------------------------------------
def test_layer_norm():
    check(F.layer_norm, randn(3, 5, 8), [8], randn(8, seed=1), randn(8, seed=2))
    check(F.layer_norm, randn(3, 5, 8), [5, 8])
    check(F.layer_norm, randn(3, 5, 64, dtype=torch.bfloat16), [64], **BF16_TOL)


def test_group_norm_32_groups():
    x = randn(2, 64, 8, 8) * 3 + 1
    check(F.group_norm, x, 32, randn(64, seed=1), randn(64, seed=2))
    check(F.group_norm, x.bfloat16(), 32, randn(64, seed=1, dtype=torch.bfloat16), None, **BF16_TOL)
    stats = check(torch.native_group_norm, x, None, None, 2, 64, 64, 32, 1e-5)  # mean, rstd (N, G)
    assert stats[1].shape == (2, 32)


def test_norm_autograd():
    check_grad(
        lambda x, w, b: F.layer_norm(x, [8], w, b), [randn(3, 5, 8), randn(8, seed=1), randn(8, seed=2)]
    )
    check_grad(lambda x: F.layer_norm(x, [5, 8]), [randn(3, 5, 8)])
    check_grad(
        lambda x, w, b: F.group_norm(x, 32, w, b), [randn(2, 64, 4, 4), randn(64, seed=1), randn(64, seed=2)]
    )


def test_rms_norm_fused():
    """F.rms_norm reaches the fused `_fused_rms_norm` lowering (and its backward) on tpu."""
    check(F.rms_norm, randn(3, 5, 8), [8], randn(8, seed=1))
    check(F.rms_norm, randn(3, 5, 8), [5, 8], None, 1e-3)
    check(
        F.rms_norm,
        randn(3, 5, 64, dtype=torch.bfloat16),
        [64],
        randn(64, seed=1, dtype=torch.bfloat16),
        **BF16_TOL,
    )
    check_grad(lambda x, w: F.rms_norm(x, [8], w), [randn(3, 5, 8), randn(8, seed=1)])


def test_batch_norm_train_updates_running_stats_and_grads():
    def fn(x, w, b):
        mean, var = torch.zeros(4, device=x.device), torch.ones(4, device=x.device)
        out = F.batch_norm(x, mean, var, w, b, training=True, momentum=0.1)
        fn.stats.append((mean.cpu(), var.cpu()))
        return out

    fn.stats = []
    check_grad(fn, [randn(3, 4, 5, 5) * 2 + 1, randn(4, seed=1), randn(4, seed=2)])
    (cpu_mean, cpu_var), (tpu_mean, tpu_var) = fn.stats
    assert not torch.equal(cpu_mean, torch.zeros(4))
    torch.testing.assert_close(tpu_mean, cpu_mean)
    torch.testing.assert_close(tpu_var, cpu_var)


def test_batch_norm_eval():
    mean, var = randn(4, seed=3), torch.rand(4, generator=_gen(4)) + 0.5
    check(F.batch_norm, randn(2, 4, 5, 5), mean, var, randn(4, seed=1), randn(4, seed=2), False)
    check_grad(
        lambda x, w: F.batch_norm(x, mean.to(x.device), var.to(x.device), w, None, False),
        [randn(2, 4, 3, 3), randn(4, seed=1)],
    )


# -- pooling ----------------------------------------------------------------------------------------
def test_max_pool_with_indices():
    x = randn(2, 3, 9, 9)
    check(F.max_pool2d, x, 3, 2, 1, return_indices=True)
    check(F.max_pool2d, x, 2, 2, 0, 1, True, True)  # ceil_mode
    check(F.max_pool2d, x, 3, 1, 1, 2, False, True)  # dilation
    check(F.max_pool1d, randn(2, 3, 11), 3, 2, 1, return_indices=True)
    check(F.max_pool3d, randn(1, 2, 5, 6, 7), 2, return_indices=True)


def test_avg_and_adaptive_pool():
    x = randn(2, 3, 9, 9)
    check(F.avg_pool2d, x, 3, 2, 1)
    check(F.avg_pool2d, x, 3, 2, 1, True, False)  # ceil_mode, count_include_pad=False
    check(F.avg_pool2d, x, 3, 2, 1, False, True, 5)  # divisor_override
    check(F.avg_pool1d, randn(2, 3, 11), 3, 2, 1)
    check(F.adaptive_avg_pool2d, x, (4, 3))
    check(F.adaptive_avg_pool2d, x, 1)
    check(F.adaptive_max_pool2d, x, (4, 3), True)


def test_pool_autograd():
    x = randn(2, 3, 9, 9)
    check_grad(lambda v: F.max_pool2d(v, 3, 2, 1), [x])
    check_grad(lambda v: F.avg_pool2d(v, 3, 2, 1, True, False), [x])
    check_grad(lambda v: F.adaptive_avg_pool2d(v, (4, 3)), [x])
    check_grad(lambda v: F.adaptive_max_pool2d(v, (4, 3)), [x])


# -- resampling -------------------------------------------------------------------------------------
def test_upsample_nearest():
    x = randn(2, 3, 5, 4)
    check(F.interpolate, x, scale_factor=2, mode="nearest")  # the UNet/VAE upsampler
    check(F.interpolate, x, size=(13, 5), mode="nearest")
    check(F.interpolate, x, size=(13, 5), mode="nearest-exact")
    check(F.interpolate, randn(2, 3, 7), size=12, mode="nearest")
    check(F.interpolate, randn(1, 2, 3, 4, 5), scale_factor=1.5, mode="nearest")


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_interpolating(align_corners):
    x = randn(2, 3, 5, 4)
    check(F.interpolate, x, size=(13, 7), mode="bilinear", align_corners=align_corners)
    check(F.interpolate, x, scale_factor=1.7, mode="bilinear", align_corners=align_corners)
    check(F.interpolate, x, size=(13, 7), mode="bicubic", align_corners=align_corners, atol=1e-4)
    check(F.interpolate, randn(2, 3, 7), size=12, mode="linear", align_corners=align_corners)
    big = randn(1, 2, 20, 17)
    for mode in ("bilinear", "bicubic"):
        check(
            F.interpolate, big, size=(7, 9), mode=mode, align_corners=align_corners, antialias=True, atol=1e-4
        )


def test_upsample_autograd():
    x = randn(2, 3, 5, 4)
    check_grad(lambda v: F.interpolate(v, scale_factor=2), [x])
    check_grad(lambda v: F.interpolate(v, size=(7, 9), mode="bilinear"), [x])
    check_grad(lambda v: F.interpolate(v, size=(7, 9), mode="bicubic", align_corners=True), [x])


def test_pixel_shuffle():
    check(F.pixel_shuffle, randn(2, 12, 3, 4), 2)
    check(F.pixel_unshuffle, randn(2, 3, 6, 4), 2)


# -- losses -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_losses(reduction):
    logp = randn(5, 7).log_softmax(-1)
    target = torch.tensor([1, 0, 6, -100, 3])
    check(F.nll_loss, logp, target, reduction=reduction)
    check(F.nll_loss, logp, target, torch.rand(7, generator=_gen(1)), reduction=reduction)
    check(
        F.nll_loss, randn(2, 4, 3, 5), torch.randint(0, 4, (2, 3, 5), generator=_gen()), reduction=reduction
    )
    a, b = randn(4, 5), randn(4, 5, seed=1)
    check(F.mse_loss, a, b, reduction=reduction)
    check(F.smooth_l1_loss, a, b, reduction=reduction, beta=0.5)
    check(F.huber_loss, a, b, reduction=reduction, delta=0.7)
    p, t, w = (torch.rand(4, 5, generator=_gen(s)) for s in range(3))
    check(F.binary_cross_entropy, p, t, w, reduction=reduction)
    check(
        F.binary_cross_entropy_with_logits,
        a,
        t,
        w,
        reduction=reduction,
        pos_weight=torch.rand(5, generator=_gen(4)),
    )


def test_loss_autograd():
    target = torch.tensor([1, 0, 6, -100, 3, 2])
    check_grad(F.cross_entropy, [randn(6, 7)], constants=[target])
    check_grad(
        lambda x, t, w: F.cross_entropy(x, t, weight=w, label_smoothing=0.1),
        [randn(6, 7)],
        constants=[target, torch.rand(7, generator=_gen(1))],
    )
    check_grad(
        F.cross_entropy, [randn(2, 4, 3, 5)], constants=[torch.randint(0, 4, (2, 3, 5), generator=_gen())]
    )
    check_grad(F.mse_loss, [randn(4, 5), randn(4, 5, seed=1)])
    check_grad(
        lambda a, t: F.binary_cross_entropy(torch.sigmoid(a), t),
        [randn(4, 5)],
        constants=[torch.rand(4, 5, generator=_gen())],
    )
    check_grad(F.binary_cross_entropy_with_logits, [randn(4, 5), torch.rand(4, 5, generator=_gen())])
    check_grad(lambda a, b: F.huber_loss(a, b, delta=0.5), [randn(4, 5), randn(4, 5, seed=1)])


MULTILABEL_TARGET = torch.tensor([[3, 0, -1, 1, 1], [1, 2, 4, -1, 0], [0, 1, 2, 3, 4], [-1, 1, 2, 3, 4]])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_stops_at_the_first_minus_one(reduction):
    """torch._decomp's multilabel_margin_loss_forward (what tpu ran) also counted the slots after a row's
    first -1, as target 0: a row with no targets got a loss, others too much (upstream pytorch#141017)."""
    check_grad(
        lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction).sum(),
        [randn(4, 5)],
        constants=[MULTILABEL_TARGET],
    )
    check(torch.ops.aten.multilabel_margin_loss_forward, randn(4, 5), MULTILABEL_TARGET, 0)  # is_target too
    check_grad(  # .sum(): the meta kernel (that decomposition) says [1] where CPU gives [] for 1-D "none"
        lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction).sum(),
        [randn(5)],
        constants=[MULTILABEL_TARGET[1]],
    )


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multi_margin_loss_backward(reduction):
    target = torch.tensor([0, 4, 2, 2])
    weight = torch.rand(5, generator=_gen(1)) + 0.5
    check_grad(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), [randn(4, 5)], constants=[target])
    check_grad(
        lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.7, weight=w, reduction=reduction),
        [randn(4, 5)],
        constants=[target, weight],
    )
    check_grad(  # 1-D "none": the decomposition's meta says [1] where CPU says [], as for multilabel
        lambda x, t: F.multi_margin_loss(x, t, reduction=reduction).sum(), [randn(5)], constants=[target[1]]
    )
    ties = torch.tensor(
        [[0.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]
    )  # hinge exactly 0: no gradient
    check_grad(lambda x, t: F.multi_margin_loss(x, t), [ties], constants=[torch.tensor([0, 0])])


# -- scaled dot-product attention -----------------------------------------------------------------------
@pytest.fixture
def fused_calls(monkeypatch):
    """Counts calls of the fused tpu attention kernel (proves SDPA did not take the math path)."""
    calls = []
    original_fn = attention._forward_fn

    def spy_fn(dropout_p, is_causal, scale, views, layout=None):
        fn = original_fn(dropout_p, is_causal, scale, views, layout)

        def run(*args):
            calls.append({"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale})
            return fn(*args)

        return run

    monkeypatch.setattr(attention, "_forward_fn", spy_fn)
    return calls


def _qkv(heads_q=4, heads_kv=4, lq=5, lk=7, dtype=torch.float32):
    return (
        randn(2, heads_q, lq, 8, dtype=dtype),
        randn(2, heads_kv, lk, 8, seed=1, dtype=dtype),
        randn(2, heads_kv, lk, 8, seed=2, dtype=dtype),
    )


SDPA_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "bool_mask_broadcast": dict(attn_mask=torch.rand(5, 7, generator=_gen()) > 0.3),
    "float_mask_per_batch": dict(attn_mask=randn(2, 1, 5, 7, seed=5)),
    "fully_masked_row": dict(attn_mask=torch.arange(5)[:, None].expand(5, 7) != 2),
    "scale": dict(scale=0.3),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_matches_cpu(case, fused_calls):
    check(F.scaled_dot_product_attention, *_qkv(), **SDPA_CASES[case])
    assert len(fused_calls) == 1


def test_sdpa_gqa_and_bf16(fused_calls):
    check(F.scaled_dot_product_attention, *_qkv(heads_kv=2), is_causal=True, enable_gqa=True)
    check(F.scaled_dot_product_attention, *_qkv(dtype=torch.bfloat16), is_causal=True, **BF16_TOL)
    check(F.scaled_dot_product_attention, *(t[0] for t in _qkv()))  # 3D, no head dim
    assert len(fused_calls) == 3


@pytest.mark.parametrize("shape", [(5, 8), (2, 2, 3, 5, 8)])
def test_sdpa_of_other_ranks_takes_the_math_path_like_cpu(shape, fused_calls):
    q, k, v = (randn(*shape, seed=s) for s in (1, 2, 3))
    check(F.scaled_dot_product_attention, q, k, v, is_causal=True)
    assert fused_calls == []  # the fused kernel's schema is 3-D or 4-D only
    assert torch.ops.aten._fused_sdp_choice(*_tpu((q, k, v))) == int(SDPBackend.MATH)


def test_sdpa_errors_like_pytorch():
    q, k, v = _tpu(_qkv(heads_kv=2))
    with pytest.raises(RuntimeError, match="enable_gqa"):
        F.scaled_dot_product_attention(q, k, v)
    q, k, v = _tpu(_qkv())
    with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal"):
        F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool, device="tpu"), is_causal=True
        )


def test_fused_sdp_choice_answers_overrideable():
    q, k, v = _tpu(_qkv())
    assert torch.ops.aten._fused_sdp_choice(q, k, v) == int(SDPBackend.OVERRIDEABLE)


def test_sdpa_autograd(fused_calls):
    check_grad(F.scaled_dot_product_attention, list(_qkv()))
    check_grad(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), list(_qkv(heads_kv=4))
    )
    check_grad(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [*_qkv(), randn(1, 4, 5, 7, seed=6)],
    )
    mask = torch.rand(5, 7, generator=_gen()) > 0.3
    check_grad(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        list(_qkv(heads_kv=2)),
        constants=[mask],
    )
    assert len(fused_calls) == 4


def test_sdpa_dropout_is_seeded_and_backward_reuses_the_mask():
    q, k, v = (t.to("tpu") for t in _qkv())
    v.requires_grad_(True)
    torch.manual_seed(3)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    again = F.scaled_dot_product_attention(q, k, v.detach(), dropout_p=0.5)
    assert torch.equal(out.detach().cpu(), again.cpu())
    plain = F.scaled_dot_product_attention(q, k, v.detach())
    assert not torch.allclose(out.detach().cpu(), plain.cpu())
    # out is linear in v for a fixed dropout mask: <out, g> == <v, dL/dv> only if backward used that mask
    g = randn(*out.shape, seed=7).to("tpu")
    (out * g).sum().backward()
    torch.testing.assert_close((out * g).sum().cpu(), (v * v.grad).sum().cpu(), atol=1e-4, rtol=1e-4)

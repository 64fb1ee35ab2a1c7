"""Extra linalg (lstsq, lu, lu_unpack, eig, matrix_exp, householder_product, cholesky_solve), counting
samplers (poisson, binomial) and the fused Adagrad step on tpu vs CPU PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

TOL = {"atol": 1e-4, "rtol": 1e-4}
LSTSQ_FIELDS = ("solution", "residuals", "rank", "singular_values")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cpu(x):
    return tuple(t.cpu() for t in x)


# -- least squares ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((5, 3), (5, 2)), ((3, 5), (3, 2)), ((4, 4), (4, 1)), ((2, 5, 3), (1, 5, 2)), ((2, 5, 3), (2, 5))],
    ids=["tall", "wide", "square", "batched_broadcast", "batched_vector"],
)
def test_lstsq_default_driver_matches_cpu(a_shape, b_shape):
    g = _gen()
    a, b = torch.randn(a_shape, generator=g), torch.randn(b_shape, generator=g)
    want = torch.linalg.lstsq(a, b)
    got = _cpu(torch.linalg.lstsq(a.to("tpu"), b.to("tpu")))
    torch.testing.assert_close(got[0], want.solution, **TOL)
    for name, w, x in zip(LSTSQ_FIELDS, want, got):
        assert (x.shape, x.dtype) == (w.shape, w.dtype), name
    assert torch.equal(got[2], want.rank)  # gelsy: rank, but no residuals and no singular values


def test_lstsq_rank_deficient_gives_the_minimum_norm_solution():
    g = _gen(1)
    a = torch.randn(6, 4, generator=g)
    a[:, 3] = a[:, 1] + a[:, 2]  # rank 3
    b = torch.randn(6, 2, generator=g)
    for driver in (None, "gelsd", "gelss"):
        want = torch.linalg.lstsq(a, b, driver=driver)
        got = _cpu(torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver))
        torch.testing.assert_close(got[0], want.solution, **TOL)
        assert int(got[2]) == int(want.rank) == 3
        assert got[1].shape == want.residuals.shape == (0,)  # rank-deficient: no residuals


@pytest.mark.parametrize("driver", ["gels", "gelsd", "gelss"])
def test_lstsq_other_drivers_report_residuals_and_singular_values_like_cpu(driver):
    g = _gen(2)
    a, b = torch.randn(2, 6, 3, generator=g), torch.randn(2, 6, 2, generator=g)
    want = torch.linalg.lstsq(a, b, driver=driver)
    got = _cpu(torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver))
    for name, w, x in zip(LSTSQ_FIELDS, want, got):
        assert (x.shape, x.dtype) == (w.shape, w.dtype), f"{driver}: {name}"
        torch.testing.assert_close(x, w, **TOL, msg=f"{driver}: {name}")
    assert want.residuals.shape == (2, 2)


def test_lstsq_out_and_autograd_match_cpu():
    g = _gen(3)
    a, b = torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g)
    outs = (torch.empty(0), torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0))
    dev_outs = tuple(t.to("tpu") for t in outs)
    torch.linalg.lstsq(a, b, out=outs)
    torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), out=dev_outs)
    torch.testing.assert_close(dev_outs[0].cpu(), outs[0], **TOL)
    assert int(dev_outs[2].cpu()) == int(outs[2]) == 3

    a_cpu, a_dev = a.clone().requires_grad_(), a.to("tpu").requires_grad_()
    torch.linalg.lstsq(a_cpu, b).solution.square().sum().backward()
    torch.linalg.lstsq(a_dev, b.to("tpu")).solution.square().sum().backward()
    torch.testing.assert_close(a_dev.grad.cpu(), a_cpu.grad, **TOL)


def test_lstsq_rejects_mismatched_rows():
    with pytest.raises(RuntimeError, match="should match"):
        torch.linalg.lstsq(torch.randn(5, 3, device="tpu"), torch.randn(4, 2, device="tpu"))


# -- LU ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3), (2, 4, 4)])
def test_linalg_lu_matches_cpu(shape):
    a = torch.randn(shape, generator=_gen(4))
    want = torch.linalg.lu(a)
    got = _cpu(torch.linalg.lu(a.to("tpu")))
    for name, w, x in zip(("P", "L", "U"), want, got):
        assert x.shape == w.shape, name
        torch.testing.assert_close(x, w, **TOL, msg=name)
    torch.testing.assert_close(got[0] @ got[1] @ got[2], a, **TOL)


def test_linalg_lu_out_variant():
    a = torch.randn(5, 3, generator=_gen(5))
    outs = tuple(torch.empty(0, device="tpu") for _ in range(3))
    torch.linalg.lu(a.to("tpu"), out=outs)
    for w, x in zip(torch.linalg.lu(a), outs):
        torch.testing.assert_close(x.cpu(), w, **TOL)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3), (5, 3)])
def test_lu_factor_solve_and_unpack_match_cpu(shape):
    g = _gen(6)
    a = torch.randn(shape, generator=g)
    lu, piv = torch.linalg.lu_factor(a)
    lu_d, piv_d = torch.linalg.lu_factor(a.to("tpu"))
    torch.testing.assert_close(lu_d.cpu(), lu, **TOL)
    assert torch.equal(piv_d.cpu(), piv)
    for flags in [(True, True), (True, False), (False, True)]:
        want = torch.lu_unpack(lu, piv, *flags)
        got = _cpu(torch.lu_unpack(lu_d, piv_d, *flags))
        for name, w, x in zip(("P", "L", "U"), want, got):
            assert x.shape == w.shape, (flags, name)
            torch.testing.assert_close(x, w, **TOL, msg=f"{flags} {name}")
    if shape[-1] == shape[-2]:
        b = torch.randn(*shape[:-1], 2, generator=g)
        want = torch.linalg.lu_solve(lu, piv, b)
        got = torch.linalg.lu_solve(lu_d, piv_d, b.to("tpu")).cpu()
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(a @ got, b, **TOL)


# -- eig ---------------------------------------------------------------------------------------------------
def _sorted(w):
    """Eigenvalues as a set: sorted by (real, imag) after rounding away last-ulp noise."""
    key = torch.round(w.real * 1e4) * 1e6 + torch.round(w.imag * 1e4)
    return torch.gather(w, -1, torch.argsort(key, dim=-1))


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3)])
def test_linalg_eig_matches_cpu(shape):
    a = torch.randn(shape, generator=_gen(7))
    w_cpu, v_cpu = torch.linalg.eig(a)
    w, v = _cpu(torch.linalg.eig(a.to("tpu")))
    assert w.dtype == v.dtype == torch.complex64 and v.shape == v_cpu.shape
    torch.testing.assert_close(_sorted(w), _sorted(w_cpu), **TOL)
    ac = a.to(torch.complex64)
    torch.testing.assert_close(ac @ v, v * w.unsqueeze(-2), **TOL)  # A V = V diag(L)
    torch.testing.assert_close(torch.linalg.vector_norm(v, dim=-2), torch.ones(w.shape), **TOL)
    torch.testing.assert_close(_sorted(torch.linalg.eigvals(a.to("tpu")).cpu()), _sorted(w_cpu), **TOL)


# -- matrix_exp, householder_product, cholesky_solve -------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_exp_matches_cpu(dtype):
    g = _gen(8)
    # one matrix per regime: tiny norm, moderate, large (several squarings), and a rotation generator
    a = torch.randn(4, 3, 3, generator=g, dtype=dtype) * torch.tensor(
        [0.01, 0.5, 3.0, 1.0], dtype=dtype
    ).view(-1, 1, 1)
    a[3] = torch.tensor([[0.0, -20.0, 0.0], [20.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=dtype)
    want = torch.linalg.matrix_exp(a)
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(torch.linalg.matrix_exp(a[1].to("tpu")).cpu(), want[1], **TOL)  # unbatched
    t = torch.tensor(20.0, dtype=dtype)
    torch.testing.assert_close(got[3, 0, :2], torch.stack([torch.cos(t), -torch.sin(t)]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape,k", [((5, 3), 3), ((2, 6, 4), 2)])
def test_householder_product_matches_cpu(shape, k):
    g = _gen(9)
    a = torch.randn(shape, generator=g)
    tau = torch.rand(*shape[:-2], k, generator=g) + 0.5
    want = torch.linalg.householder_product(a, tau)
    got = torch.linalg.householder_product(a.to("tpu"), tau.to("tpu")).cpu()
    torch.testing.assert_close(got, want, **TOL)
    # orthogonal columns when the taus come from a QR (geqrf)
    qr_a, qr_tau = torch.geqrf(a)
    q = torch.linalg.householder_product(qr_a.to("tpu"), qr_tau.to("tpu")).cpu()
    eye = torch.eye(shape[-1]).expand(*shape[:-2], -1, -1)
    torch.testing.assert_close(q.mT @ q, eye, **TOL)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_matches_cpu(upper):
    g = _gen(10)
    m = torch.randn(2, 4, 4, generator=g)
    spd = m @ m.mT + 4 * torch.eye(4)
    factor = torch.linalg.cholesky(spd, upper=upper)
    b = torch.randn(4, 3, generator=g)  # broadcast over the batch
    want = torch.cholesky_solve(b, factor, upper=upper)
    got = torch.cholesky_solve(b.to("tpu"), factor.to("tpu"), upper=upper).cpu()
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(spd @ got, b.expand(2, 4, 3), **TOL)


# -- sampling ------------------------------------------------------------------------------------------------
N = 20000


def _assert_moments(draws, mean, var, what):
    """Sample mean within 5 standard errors; sample variance within 10%."""
    m, v = draws.double().mean(0), draws.double().var(0)
    se = (torch.as_tensor(var, dtype=torch.float64) / draws.shape[0]).sqrt()
    assert torch.all((m - mean).abs() <= 5 * se + 1e-12), f"{what}: mean {m} vs {mean}"
    assert torch.allclose(v, torch.as_tensor(var, dtype=torch.float64), rtol=0.1, atol=1e-12), (
        f"{what}: var {v} vs {var}"
    )


def test_poisson_moments_and_edge_cases():
    rates = torch.tensor([0.0, 0.5, 3.0, 40.0])
    torch.manual_seed(0)
    draws = torch.poisson(rates.to("tpu").expand(N, 4)).cpu()
    assert draws.dtype == torch.float32 and draws.shape == (N, 4)
    assert torch.equal(draws, draws.round()) and bool((draws >= 0).all())
    assert bool((draws[:, 0] == 0).all())  # rate 0
    _assert_moments(draws[:, 1:], rates[1:].double(), rates[1:].double(), "poisson")
    torch.manual_seed(0)
    again = torch.poisson(rates.to("tpu").expand(N, 4)).cpu()
    assert torch.equal(again, draws)  # seeded like every device random op

    dist = torch.distributions.Poisson(torch.tensor([2.0, 7.0], device="tpu"))
    sample = dist.sample((N,))
    assert sample.device.type == "tpu" and sample.shape == (N, 2)
    _assert_moments(sample.cpu(), torch.tensor([2.0, 7.0]), torch.tensor([2.0, 7.0]), "Poisson.sample")


def test_binomial_moments_and_edge_cases():
    count = torch.tensor([10.0, 10.0, 0.0, 5.0, 7.0, 200.0])
    prob = torch.tensor([0.3, 1.0, 0.5, 0.0, 0.9, 0.05])
    torch.manual_seed(0)
    draws = torch.binomial(count.to("tpu").expand(N, 6), prob.to("tpu").expand(N, 6)).cpu()
    assert draws.dtype == torch.float32 and draws.shape == (N, 6)
    assert torch.equal(draws, draws.round()) and bool((draws >= 0).all()) and bool((draws <= count).all())
    assert (
        bool((draws[:, 1] == 10).all()) and bool((draws[:, 2] == 0).all()) and bool((draws[:, 3] == 0).all())
    )
    keep = [0, 4, 5]
    n, p = count[keep].double(), prob[keep].double()
    _assert_moments(draws[:, keep], n * p, n * p * (1 - p), "binomial")
    # broadcasting count against prob, as CPU does
    assert torch.binomial(
        torch.tensor([5.0], device="tpu"), torch.tensor([0.5, 1.0], device="tpu")
    ).shape == (2,)

    dist = torch.distributions.Binomial(total_count=12, probs=torch.tensor([0.25, 0.75], device="tpu"))
    sample = dist.sample((N,))
    assert sample.device.type == "tpu" and sample.shape == (N, 2)
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    _assert_moments(sample.cpu(), 12 * p, 12 * p * (1 - p), "Binomial.sample")


# -- fused Adagrad ----------------------------------------------------------------------------------------------
ADAGRAD = {
    "plain": {"lr": 0.05},
    "decay": {"lr": 0.05, "lr_decay": 0.1, "weight_decay": 0.01, "eps": 1e-8},
    "maximize": {"lr": 0.02, "initial_accumulator_value": 0.1, "maximize": True},
}


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(device)


def _train(model, opt, device, steps=4):
    g = _gen(11)
    for _ in range(steps):
        x, y = torch.randn(5, 6, generator=g).to(device), torch.randn(5, 3, generator=g).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("name", sorted(ADAGRAD))
def test_fused_adagrad_matches_cpu(name):
    kw = ADAGRAD[name]
    cpu, dev = _model("cpu"), _model("tpu")
    opt_cpu = torch.optim.Adagrad(cpu.parameters(), **kw)  # the reference: CPU's for-loop Adagrad
    opt_dev = torch.optim.Adagrad(dev.parameters(), fused=True, **kw)
    _train(cpu, opt_cpu, "cpu")
    _train(dev, opt_dev, "tpu")
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-5, atol=1e-6)
    for s_cpu, s_dev in zip(opt_cpu.state.values(), opt_dev.state.values()):
        torch.testing.assert_close(s_dev["sum"].cpu(), s_cpu["sum"], rtol=1e-5, atol=1e-6)
        assert float(s_dev["step"].cpu()) == float(s_cpu["step"]) == 4
    from hf_tpu.runtime.lowerings.table import TABLE

    assert TABLE[torch.ops.aten._fused_adagrad_.default].fn.cache  # the fused kernel ran


def test_functional_fused_adagrad_graph_lowering_matches_cpu():
    """`_fused_adagrad` (what traced graphs hold) returns the updated lists, as CPU's functional op."""
    import jax.numpy as jnp

    from hf_tpu.runtime.lowerings.table import GRAPH_TABLE

    g = _gen(13)
    lists = [[torch.randn(3, 2, generator=g)] for _ in range(3)] + [[torch.tensor(2.0)]]
    lists[2][0] = lists[2][0].abs()
    kw = {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1, "eps": 1e-10, "maximize": True}
    want = torch.ops.aten._fused_adagrad.default(*lists, **kw)
    fn = GRAPH_TABLE[torch.ops.aten._fused_adagrad.default].fn
    got = fn(*[[jnp.asarray(t.numpy()) for t in lst] for lst in lists], *kw.values())
    for w_list, g_list in zip(want, got):
        for w, x in zip(w_list, g_list):
            torch.testing.assert_close(torch.from_numpy(np.array(x)), w, rtol=1e-6, atol=1e-7)


def test_fused_adagrad_grad_scale_found_inf_and_tensor_lr_match_cpu_kernel():
    shapes = [(3, 4), (5,)]

    def state(device):
        params = [torch.randn(s, generator=_gen(1)).to(device) for s in shapes]
        grads = [torch.randn(s, generator=_gen(2)).to(device) for s in shapes]
        sums = [torch.full(s, 0.1).to(device) for s in shapes]
        steps = [torch.tensor(3.0).to(device) for _ in shapes]
        return params, grads, sums, steps

    kw = {"lr_decay": 0.05, "weight_decay": 0.02, "eps": 1e-10, "maximize": False}
    for found in (0.0, 1.0):
        ref = state("cpu")
        dev = state("tpu")
        torch._fused_adagrad_(
            *ref, lr=0.1, grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found), **kw
        )  # fmt: skip
        torch._fused_adagrad_(
            *dev, lr=torch.tensor(0.1, device="tpu"), grad_scale=torch.tensor(4.0, device="tpu"),
            found_inf=torch.tensor(found, device="tpu"), **kw,
        )  # fmt: skip
        for lst_cpu, lst_dev in zip(ref, dev):
            for a, b in zip(lst_cpu, lst_dev):
                torch.testing.assert_close(b.cpu(), a, rtol=1e-6, atol=1e-7)
        moved = not torch.equal(dev[0][0].cpu(), state("cpu")[0][0])
        assert moved == (found == 0.0)  # found_inf skips the step


def test_int_mm_is_exact_int32_as_cpu():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (64, 48), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (48, 40), dtype=torch.int8, generator=g)
    got = torch._int_mm(a.to("tpu"), b.to("tpu"))
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), torch._int_mm(a, b))
    compiled = torch.compile(lambda x, y: torch._int_mm(x, y), backend="tpu")
    assert torch.equal(compiled(a.to("tpu"), b.to("tpu")).cpu(), torch._int_mm(a, b))


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3)])
def test_factorizations_of_empty_matrices(shape):
    a = torch.eye(shape[-1]).expand(shape).clone()
    for fn in (
        torch.linalg.inv,
        torch.linalg.cholesky,
        lambda m: torch.linalg.lu_factor(m)[0],
        lambda m: torch.linalg.solve(m, torch.ones(m.shape[:-1], device=m.device)),
    ):
        torch.testing.assert_close(fn(a.to("tpu")).cpu(), fn(a))

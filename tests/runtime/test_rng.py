"""The device PRNG: seeding through torch.manual_seed, reproducibility, distributions, CPU generators."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hf_tpu.runtime import native

DEV = "tpu"
N = 10_000


def cpu(t: torch.Tensor) -> torch.Tensor:
    assert t.device.type == DEV
    return t.cpu()


# -- seeding and state ---------------------------------------------------------------------------------
def test_manual_seed_reaches_device_generator():
    """torch.manual_seed -> torch._seed_custom_device -> torch.tpu.manual_seed_all."""
    torch.tpu.manual_seed(1234)
    via_device_module = torch.tpu.get_rng_state()
    torch.tpu.manual_seed(99)
    torch.manual_seed(1234)
    assert torch.equal(torch.tpu.get_rng_state(), via_device_module)
    assert torch.tpu.initial_seed() == 1234


def test_same_seed_same_numbers_across_ops():
    def draw():  # the same calls (shapes, parameters) as the statistics tests below: compiled once
        return [
            cpu(torch.randn(N, device=DEV)),
            cpu(torch.rand(N, device=DEV)),
            cpu(torch.randint(3, 10, (N,), device=DEV)),
            cpu(torch.randperm(1000, device=DEV)),
            cpu(torch.empty(N, device=DEV).normal_(3.0, 0.5)),
            cpu(F.dropout(torch.ones(N, device=DEV), 0.25)),
            cpu(torch.multinomial(torch.ones(200, 6, device=DEV), 4)),
        ]

    torch.manual_seed(0)
    first = draw()
    torch.manual_seed(0)
    second = draw()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    torch.manual_seed(1)
    third = draw()
    assert not torch.equal(first[0], third[0])
    assert not torch.equal(first[1], third[1])


def test_successive_draws_differ():
    torch.manual_seed(0)
    a, b = cpu(torch.randn(N, device=DEV)), cpu(torch.randn(N, device=DEV))
    assert not torch.equal(a, b)


def test_rng_state_round_trip():
    torch.manual_seed(5)
    torch.randn(N, device=DEV)  # advance
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = cpu(torch.randn(N, device=DEV))
    torch.tpu.set_rng_state(state)
    b = cpu(torch.randn(N, device=DEV))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="16 bytes"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_fork_rng_restores_device_state():
    torch.manual_seed(11)
    # the default walks range(device_count()) = chips; every chip index maps to the one generator
    with torch.random.fork_rng(device_type=DEV):
        inside = cpu(torch.randn(N, device=DEV))
    after = cpu(torch.randn(N, device=DEV))
    assert torch.equal(inside, after)


@pytest.mark.skipif(native.active(), reason="pure-Python path only (native: tests/runtime/test_native.py)")
def test_a_tpu_generator_is_a_cpu_generator_drawing_cpus_numbers():
    """torch's Python hooks cannot create a PrivateUse1 generator (torch raised, naming getNewGenerator):
    `torch.Generator("tpu")`, the diffusers idiom, gives a CPU generator, whose draws on tpu are CPU's."""
    from diffusers.utils.torch_utils import randn_tensor

    for spec in ("tpu", "tpu:0", torch.device("tpu")):
        g = torch.Generator(device=spec).manual_seed(5)
        assert g.device.type == "cpu" and isinstance(g, torch.Generator)
        got = torch.randn(6, generator=g, device=DEV)
        assert got.device.type == "tpu"
        assert torch.equal(got.cpu(), torch.randn(6, generator=torch.Generator().manual_seed(5)))
    latents = randn_tensor((2, 3), generator=torch.Generator("tpu").manual_seed(3), device=torch.device(DEV))
    assert torch.equal(latents.cpu(), randn_tensor((2, 3), generator=torch.Generator().manual_seed(3)))
    # every other generator is what it was
    assert isinstance(torch.default_generator, torch.Generator)
    assert issubclass(torch._C.Generator, torch.Generator) and type(torch.Generator()) is torch._C.Generator
    with pytest.raises(ValueError, match="tpu:1 does not exist"):
        torch.Generator("tpu:1")


# -- CPU generators: exact CPU streams --------------------------------------------------------------------
def _pair(seed=3):
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


CPU_GENERATOR_CASES = {
    "randn": lambda g, d: torch.randn(40, generator=g, device=d),
    "rand_bf16": lambda g, d: torch.rand(40, generator=g, device=d, dtype=torch.bfloat16),
    "randint": lambda g, d: torch.randint(-5, 50, (40,), generator=g, device=d),
    "randperm": lambda g, d: torch.randperm(30, generator=g, device=d),
    "normal_": lambda g, d: torch.empty(6, 7, device=d).normal_(2.0, 0.5, generator=g),
    "uniform_": lambda g, d: torch.empty(40, device=d).uniform_(-1, 3, generator=g),
    "random_": lambda g, d: torch.empty(40, device=d, dtype=torch.int32).random_(generator=g),
    "bernoulli_float": lambda g, d: torch.empty(40, device=d).bernoulli_(0.3, generator=g),
    "bernoulli": lambda g, d: torch.bernoulli(torch.full((40,), 0.6, device=d), generator=g),
    "exponential_": lambda g, d: torch.empty(40, device=d).exponential_(2.0, generator=g),
    "geometric_": lambda g, d: torch.empty(40, device=d).geometric_(0.2, generator=g),
    "log_normal_": lambda g, d: torch.empty(40, device=d).log_normal_(generator=g),
    "cauchy_": lambda g, d: torch.empty(40, device=d).cauchy_(generator=g),
    "normal_tensor": lambda g, d: torch.normal(
        torch.arange(8.0, device=d), torch.ones(8, device=d), generator=g
    ),
    "normal_float_float": lambda g, d: torch.normal(1.0, 2.0, (9,), generator=g, device=d),
    "multinomial": lambda g, d: torch.multinomial(torch.ones(3, 12, device=d), 5, generator=g),
    "multinomial_repl": lambda g, d: torch.multinomial(torch.ones(12, device=d), 20, True, generator=g),
}


@pytest.mark.parametrize("name", sorted(CPU_GENERATOR_CASES))
def test_cpu_generator_draws_the_cpu_stream(name):
    fn = CPU_GENERATOR_CASES[name]
    g_tpu, g_cpu = _pair()
    got = fn(g_tpu, DEV)
    want = fn(g_cpu, "cpu")
    assert got.device.type == DEV
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)
    # the generator advanced exactly as on CPU: a second draw matches too
    assert torch.equal(fn(g_tpu, DEV).cpu(), fn(g_cpu, "cpu"))


def test_cpu_generator_in_place_through_a_view():
    g_tpu, g_cpu = _pair(9)
    t = torch.zeros(4, 6, device=DEV)
    c = torch.zeros(4, 6)
    t[:, 1::2].uniform_(generator=g_tpu)
    c[:, 1::2].uniform_(generator=g_cpu)
    assert torch.equal(t.cpu(), c)


def test_cpu_generator_does_not_touch_device_stream():
    torch.manual_seed(21)
    a = cpu(torch.randn(N, device=DEV))
    torch.manual_seed(21)
    torch.randn(N, generator=torch.Generator().manual_seed(0), device=DEV)
    b = cpu(torch.randn(N, device=DEV))
    assert torch.equal(a, b)


# -- distributions --------------------------------------------------------------------------------------
def test_normal_statistics():
    torch.manual_seed(0)
    x = cpu(torch.randn(N, device=DEV)).double()
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05
    y = cpu(torch.empty(N, device=DEV).normal_(3.0, 0.5)).double()
    assert abs(y.mean() - 3) < 0.03 and abs(y.std() - 0.5) < 0.03
    z = cpu(torch.normal(-2.0, 4.0, (N,), device=DEV)).double()
    assert abs(z.mean() + 2) < 0.2 and abs(z.std() - 4) < 0.2


def test_normal_tensor_overloads_broadcast():
    torch.manual_seed(0)
    mean = torch.tensor([[-100.0], [100.0]], device=DEV)
    std = torch.full((N // 2,), 0.1, device=DEV)
    out = cpu(torch.normal(mean, std))
    assert out.shape == (2, N // 2)
    assert (out[0] + 100).abs().max() < 1 and (out[1] - 100).abs().max() < 1
    out = cpu(torch.normal(mean, 1.0))
    assert out.shape == (2, 1)
    out = cpu(torch.normal(5.0, std))
    assert abs(out.double().mean() - 5) < 0.01
    dest = torch.empty(N // 2, device=DEV)
    torch.normal(5.0, std, out=dest)
    assert abs(cpu(dest).double().std() - 0.1) < 0.01


def test_uniform_range_and_mean():
    torch.manual_seed(0)
    u = cpu(torch.empty(N, device=DEV).uniform_(-2.0, 3.0))
    assert u.min() >= -2 and u.max() < 3
    assert abs(u.double().mean() - 0.5) < 0.1
    r = cpu(torch.rand(N, device=DEV))
    assert r.min() >= 0 and r.max() < 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_rand_randn_dtypes(dtype):
    torch.manual_seed(0)
    r = torch.rand(N, device=DEV, dtype=dtype)
    n = torch.randn(N, device=DEV, dtype=dtype)
    assert r.dtype == dtype and n.dtype == dtype
    r, n = r.cpu(), n.cpu()
    # [0, 1) even where rounding float32 to bf16/f16 could reach 1.0
    assert r.min() >= 0 and r.max() < 1 and len(r.unique()) > 50
    assert abs(n.double().mean()) < 0.05 and abs(n.double().std() - 1) < 0.05
    assert torch.isfinite(n).all()


def test_random_int_dtypes_match_cpu_errors():
    for fn in (
        lambda d: torch.rand(3, device=d, dtype=torch.int64),
        lambda d: torch.randn(3, device=d, dtype=torch.int32),
    ):
        with pytest.raises((RuntimeError, NotImplementedError)):
            fn("cpu")
        with pytest.raises((RuntimeError, NotImplementedError)):
            fn(DEV)


def test_randint_bounds_and_dtypes():
    torch.manual_seed(0)
    x = cpu(torch.randint(3, 10, (N,), device=DEV))
    assert x.dtype == torch.int64
    assert x.min() == 3 and x.max() == 9
    assert set(x.tolist()) == set(range(3, 10))
    y = cpu(torch.randint(-7, 0, (N,), device=DEV, dtype=torch.int32))
    assert y.dtype == torch.int32 and y.min() == -7 and y.max() == -1
    z = cpu(torch.randint(256, (N,), device=DEV, dtype=torch.uint8))
    assert z.min() == 0 and z.max() == 255
    big = cpu(torch.randint(0, 2**40, (N,), device=DEV))
    assert big.min() >= 0 and big.max() < 2**40 and big.max() > 2**39
    like = torch.randint_like(torch.zeros(5, 7, device=DEV, dtype=torch.float16), 2, 6)
    assert like.dtype == torch.float16 and like.shape == (5, 7)
    assert set(cpu(like).tolist()[0]) <= {2.0, 3.0, 4.0, 5.0}


def test_random_default_ranges():
    torch.manual_seed(0)
    f = cpu(torch.empty(N, device=DEV).random_())
    assert f.min() >= 0 and f.max() <= 2**24 and f.max() > 2**23
    assert torch.equal(f, f.round())
    i8 = cpu(torch.empty(N, device=DEV, dtype=torch.int8).random_())
    assert i8.min() >= 0 and i8.max() == 127
    b = cpu(torch.empty(N, device=DEV, dtype=torch.bool).random_())
    assert 0.4 < b.float().mean() < 0.6
    top = cpu(torch.empty(N, device=DEV, dtype=torch.int8).random_(100, None))
    assert top.min() == 100 and top.max() == 127
    to = cpu(torch.empty(N, device=DEV, dtype=torch.int16).random_(5))
    assert to.min() == 0 and to.max() == 4


def test_random_bounds_errors_match_cpu():
    for args, match in [((5, 5), "from' to be less than 'to'"), ((0, 500), "to - 1 is out of bounds")]:
        with pytest.raises(RuntimeError, match=match):
            torch.empty(3, dtype=torch.uint8).random_(*args)
        with pytest.raises(RuntimeError, match=match):
            torch.empty(3, dtype=torch.uint8, device=DEV).random_(*args)
    with pytest.raises(RuntimeError, match=r"\[from, to\) range"):
        torch.empty(3, device=DEV).uniform_(2, -2)
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.empty(3, device=DEV).normal_(0, -1)


def test_bernoulli_rates():
    torch.manual_seed(0)
    probs = torch.full((N,), 0.3, device=DEV)
    b = cpu(torch.bernoulli(probs))
    assert b.dtype == torch.float32 and set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean() - 0.3) < 0.03
    b = cpu(torch.empty(N, device=DEV).bernoulli_(0.8))
    assert abs(b.mean() - 0.8) < 0.03
    b = cpu(torch.bernoulli(torch.empty(N, device=DEV), 0.1))
    assert abs(b.mean() - 0.1) < 0.02
    p = torch.tensor([0.0, 1.0]).repeat(N // 2).to(DEV)
    b = cpu(torch.empty(N, device=DEV, dtype=torch.int64).bernoulli_(p))
    assert b.dtype == torch.int64 and torch.equal(b, torch.tensor([0, 1]).repeat(N // 2))
    with pytest.raises(RuntimeError, match=r"p to be in \[0, 1\]"):
        torch.empty(3, device=DEV).bernoulli_(2.0)


def test_other_distributions():
    torch.manual_seed(0)
    e = cpu(torch.empty(N, device=DEV).exponential_(4.0)).double()
    assert e.min() >= 0 and abs(e.mean() - 0.25) < 0.02
    g = cpu(torch.empty(N, device=DEV).geometric_(0.25)).double()
    assert g.min() >= 1 and torch.equal(g, g.round()) and abs(g.mean() - 4) < 0.25
    # reduced precision keeps float32 randomness underneath: the tail is not cut at -log(2**-8) = 5.5
    eb = cpu(torch.empty(N, device=DEV, dtype=torch.bfloat16).exponential_())
    assert eb.dtype == torch.bfloat16 and eb.max() > 6.5 and eb.min() >= 0
    gi = torch.empty(N, device=DEV, dtype=torch.int64).geometric_(0.5)
    assert gi.dtype == torch.int64 and cpu(gi).min() >= 1
    ln = cpu(torch.empty(N, device=DEV).log_normal_(1.0, 0.5)).double()
    assert ln.min() > 0 and abs(ln.log().mean() - 1) < 0.03 and abs(ln.log().std() - 0.5) < 0.03
    c = cpu(torch.empty(N, device=DEV).cauchy_(2.0, 1.0)).double()
    assert abs(c.median() - 2) < 0.1
    # a quarter of a Cauchy(2, 1) lies on each side of 2 +- 1
    assert abs(((c > 1) & (c < 3)).double().mean() - 0.5) < 0.03


def test_randperm_is_a_permutation():
    torch.manual_seed(0)
    p = cpu(torch.randperm(1000, device=DEV))
    assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(1000))
    assert not torch.equal(p, torch.arange(1000))
    p32 = torch.randperm(50, device=DEV, dtype=torch.int32)
    assert p32.dtype == torch.int32
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    torch.randperm(7, out=out)
    assert torch.equal(cpu(out).sort().values, torch.arange(7))


def test_multinomial_without_replacement():
    torch.manual_seed(0)
    weights = torch.tensor([[0.0, 1.0, 2.0, 0.0, 4.0, 1.0]] * 200, device=DEV)  # (200, 6)
    s = cpu(torch.multinomial(weights, 4))
    assert s.shape == (200, 4) and s.dtype == torch.int64
    for row in s.tolist():
        assert len(set(row)) == 4 and not {0, 3} & set(row)
    first = torch.multinomial(torch.tensor([1.0, 2.0, 7.0], device=DEV).expand(N, 3), 1)
    freq = torch.bincount(cpu(first).flatten(), minlength=3).double() / N
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=0.02)
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(3, device=DEV), 5)


def test_multinomial_with_replacement():
    torch.manual_seed(0)
    s = cpu(torch.multinomial(torch.tensor([1.0, 0.0, 3.0], device=DEV), N, replacement=True))
    assert s.shape == (N,)
    freq = torch.bincount(s, minlength=3).double() / N
    assert freq[1] == 0 and abs(freq[2] - 0.75) < 0.02


# -- dropout ----------------------------------------------------------------------------------------------
class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_dropout_train_reaches_native_dropout_and_scales():
    torch.manual_seed(0)
    x = torch.ones(N, device=DEV)
    with _Ops() as seen:
        y = F.dropout(x, 0.25, training=True)
    assert "aten.native_dropout.default" in seen.ops
    y = cpu(y)
    kept = y[y != 0]
    assert torch.equal(kept, torch.full_like(kept, 1 / 0.75))
    assert abs((y == 0).double().mean() - 0.25) < 0.02
    with _Ops() as seen:
        z = torch.nn.Dropout(0.5).train()(torch.ones(64, device=DEV))
    assert "aten.native_dropout.default" in seen.ops
    assert set(cpu(z).unique().tolist()) <= {0.0, 2.0}


def test_dropout_eval_is_identity():
    x = torch.randn(8, 8, device=DEV)
    m = torch.nn.Dropout(0.5).eval()
    with _Ops() as seen:
        y = m(x)
    assert not [op for op in seen.ops if "dropout" in op or "bernoulli" in op]
    assert torch.equal(cpu(y), cpu(x))


@pytest.mark.parametrize("p,train", [(0.0, True), (1.0, True), (0.5, False), (0.5, None)])
def test_native_dropout_edge_cases_match_cpu(p, train):
    x = torch.arange(1.0, 9.0)
    out, mask = torch.ops.aten.native_dropout(x.to(DEV), p, train)
    want_out, want_mask = torch.ops.aten.native_dropout(x, p, train)
    assert out.dtype == want_out.dtype and mask.dtype == want_mask.dtype == torch.bool
    if p in (0.0, 1.0) or train is False:
        assert torch.equal(cpu(out), want_out) and torch.equal(cpu(mask), want_mask)
    else:  # random, but consistent: out == x * mask * 2
        assert torch.equal(cpu(out), x * cpu(mask) * 2)


def test_dropout_bf16_and_backward():
    torch.manual_seed(0)
    x = torch.randn(256, device=DEV, dtype=torch.bfloat16)
    out, mask = torch.ops.aten.native_dropout(x, 0.3, True)
    want = (x.cpu().float() * mask.cpu() * (1 / 0.7)).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(cpu(out), want)
    leaf = torch.ones(64, device=DEV, requires_grad=True)
    y = F.dropout(leaf, 0.5)
    y.backward(torch.full((64,), 3.0, device=DEV))
    grad, y = cpu(leaf.grad), cpu(y.detach())
    assert torch.equal(grad, (y != 0).float() * 6)
    g = torch.ops.aten.native_dropout_backward(
        torch.ones(4, device=DEV), torch.tensor([True, False, True, False], device=DEV), 2.0
    )
    assert torch.equal(cpu(g), torch.tensor([2.0, 0.0, 2.0, 0.0]))


def test_rand_like_family():
    torch.manual_seed(0)
    base = torch.zeros(3, 4, device=DEV, dtype=torch.float64)
    for fn in (torch.rand_like, torch.randn_like):
        out = fn(base)
        assert out.device.type == DEV and out.dtype == torch.float64 and out.shape == (3, 4)
        assert len(cpu(out).unique()) == 12
    assert math.isfinite(cpu(torch.randn_like(base, dtype=torch.float16)).float().sum().item())


def test_gamma_family_sampling_on_tpu():
    """Gamma, Beta and Dirichlet sample through `_standard_gamma`/`_sample_dirichlet`: seeded draws repeat,
    moments match the distributions, and Gamma's rsample gradient equals CPU's formula."""
    torch.manual_seed(0)
    first = torch.distributions.Gamma(
        torch.tensor(3.0, device="tpu"), torch.tensor(1.0, device="tpu")
    ).sample((20000,))
    torch.manual_seed(0)
    again = torch.distributions.Gamma(
        torch.tensor(3.0, device="tpu"), torch.tensor(1.0, device="tpu")
    ).sample((20000,))
    assert torch.equal(first.cpu(), again.cpu())
    assert abs(first.mean().item() - 3.0) < 0.1 and abs(first.var().item() - 3.0) < 0.2
    beta = torch.distributions.Beta(torch.tensor(2.0, device="tpu"), torch.tensor(5.0, device="tpu"))
    assert abs(beta.sample((20000,)).mean().item() - 2 / 7) < 0.01
    dirichlet = torch.distributions.Dirichlet(torch.tensor([1.0, 2.0, 3.0], device="tpu")).sample((20000,))
    torch.testing.assert_close(dirichlet.sum(-1).cpu(), torch.ones(20000))
    torch.testing.assert_close(dirichlet.mean(0).cpu(), torch.tensor([1.0, 2.0, 3.0]) / 6, atol=0.01, rtol=0)
    alpha, sample = torch.tensor([0.5, 1.0, 2.5, 7.0]), torch.tensor([0.3, 1.2, 2.0, 6.5])
    torch.testing.assert_close(
        torch._standard_gamma_grad(alpha.to("tpu"), sample.to("tpu")).cpu(),
        torch._standard_gamma_grad(alpha, sample),
        atol=1e-4,
        rtol=1e-4,
    )


def test_compiled_attention_without_dropout_draws_as_eager():
    """SDPA with dropout_p=0 takes no key in eager, nor in a compiled graph: the draws after it (in the
    graph and after the call) are eager's. (Each graph SDPA took one, so a seeded `generate` sampled
    other tokens once its decode step was compiled.)"""

    def f(q):
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return a + torch.rand_like(a)

    q = torch.randn(1, 2, 4, 8, device=DEV)

    def run(fn):
        torch.manual_seed(7)
        out = fn(q)
        return out.cpu(), torch.rand(3, device=DEV).cpu()

    eager, compiled = run(f), run(torch.compile(f, backend="tpu"))
    torch.testing.assert_close(compiled[0], eager[0])
    assert torch.equal(compiled[1], eager[1])

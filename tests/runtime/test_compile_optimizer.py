"""torch.compile(optimizer.step, backend="tpu"): the foreach optimizer math compiles to one program.

aot_autograd hands the backend functional `_foreach_*` ops; each needs a graph lowering or the whole
region would run op by op in eager. Compared with the same optimizer steps on CPU.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hf_tpu.runtime.compile import backend as tpu_compile
from hf_tpu.runtime.lowerings.table import graph_lowering

STEPS = 3


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def graphs(monkeypatch):
    """Every graph the backend compiles: (foreach ops it holds, ops it lacks a lowering for)."""
    monkeypatch.setenv("HF_TPU_COMPILE_STRICT", "1")  # a missing lowering fails the compile
    seen = []
    init = tpu_compile.GraphProgram.__init__

    def record(self, gm, *args, **kwargs):
        init(self, gm, *args, **kwargs)
        ops = {
            str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "_foreach_" in str(n.target)
        }
        seen.append((ops, list(self.missing)))

    monkeypatch.setattr(tpu_compile.GraphProgram, "__init__", record)
    return seen


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _grads(model, x, y):
    model.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _state(opt) -> list:
    return [v for s in opt.state.values() for _, v in sorted(s.items()) if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True), id="adamw"),
        pytest.param(lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True), id="sgd_momentum"),
    ],
)
def test_compiled_optimizer_step_matches_cpu_without_eager_fallback(make, graphs):
    ref = _mlp()
    dev = _mlp().to("tpu")
    opt_ref, opt_dev = make(ref.parameters()), make(dev.parameters())
    step = torch.compile(opt_dev.step, backend="tpu")
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    xd, yd = x.to("tpu"), y.to("tpu")
    compiled_before_last = None
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*pure-JAX lowering.*")
        for i in range(STEPS):
            _grads(ref, x, y)
            opt_ref.step()
            _grads(dev, xd, yd)
            if i == STEPS - 1:
                compiled_before_last = tpu_compile._counter[0]
            step()
    assert tpu_compile._counter[0] == compiled_before_last, "step 3 recompiled"
    assert any(ops for ops, _ in graphs), "no compiled graph held the foreach math"
    assert all(not missing for _, missing in graphs), graphs
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_ref.detach(), atol=1e-6, rtol=1e-5)
    state_ref, state_dev = _state(opt_ref), _state(opt_dev)
    assert len(state_dev) == len(state_ref) > 0
    for s_ref, s_dev in zip(state_ref, state_dev):
        torch.testing.assert_close(s_dev.cpu(), s_ref, atol=1e-6, rtol=1e-5)


def test_compiled_training_step_with_backward_and_adamw_matches_cpu():
    ref, dev = _mlp(), _mlp().to("tpu")
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, foreach=True)
    x, y = torch.randn(5, 6), torch.randn(5, 3)

    def train(model, opt, a, b):
        _grads(model, a, b)  # backward() breaks the graph; forward and step compile
        opt.step()

    compiled = torch.compile(train, backend="tpu")
    for _ in range(STEPS):
        train(ref, opt_ref, x, y)
        compiled(dev, opt_dev, x.to("tpu"), y.to("tpu"))
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_ref.detach(), atol=1e-6, rtol=1e-5)


def _foreach_variants(xs, ys, zs, weight):
    """The overload kinds: Scalar, List, ScalarList, 0-d Tensor, Scalar-first, reductions."""
    out = []
    out += torch._foreach_addcdiv(xs, ys, zs, 0.5)
    out += torch._foreach_addcmul(xs, ys, zs, [0.5, -2.0, 3.0])
    out += torch._foreach_lerp(xs, ys, 0.3)
    out += torch._foreach_lerp(xs, ys, [0.1, 0.6, 0.9])
    out += torch._foreach_mul(xs, weight)
    out += torch._foreach_div(xs, [2.0, 3.0, 4.0])
    out += torch._foreach_sub(xs, ys, alpha=0.5)
    out += torch._foreach_pow(2.0, xs)
    out += torch._foreach_pow(zs, 2.0)
    out += torch._foreach_maximum(xs, ys)
    out += torch._foreach_clamp_min(xs, 0.0)
    out += torch._foreach_sqrt(zs)
    out += torch._foreach_reciprocal(zs)
    out += torch._foreach_neg(xs)
    out += torch._foreach_norm(xs)
    out += torch._foreach_norm(ys, float("inf"))
    return out


def test_compiled_foreach_overloads_match_cpu(graphs):
    torch.manual_seed(1)
    shapes = [(3, 4), (5,), ()]
    xs = [torch.randn(s) for s in shapes]
    ys = [torch.randn(s) for s in shapes]
    zs = [torch.rand(s) + 0.5 for s in shapes]
    weight = torch.tensor(1.5)
    ref = _foreach_variants(xs, ys, zs, weight)

    def dev(ts):
        return [t.to("tpu") for t in ts]

    fn = torch.compile(_foreach_variants, backend="tpu")
    out = fn(dev(xs), dev(ys), dev(zs), weight.to("tpu"))
    assert graphs and all(not missing for _, missing in graphs), graphs
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        assert o.device.type == "tpu"
        torch.testing.assert_close(o.cpu(), r, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["addcdiv", "addcmul"])
def test_scalars_tensor_overload_graph_lowering_matches_cpu(name):
    """`.Tensor` overloads (one scalar per element, as a 1-D CPU tensor): FakeTensor cannot trace them
    (their meta check wants a CPU tensor), so the graph lowering is checked on arrays directly."""
    op = getattr(torch.ops.aten, f"_foreach_{name}").Tensor
    lowering = graph_lowering(op)
    assert lowering is not None
    torch.manual_seed(2)
    shapes = [(2, 3), (4,)]
    xs, ys = [torch.randn(s) for s in shapes], [torch.randn(s) for s in shapes]
    zs = [torch.rand(s) + 0.5 for s in shapes]
    scalars = torch.tensor([0.25, -3.0])
    ref = op(xs, ys, zs, scalars)
    arrays = [[jnp.asarray(t.numpy()) for t in ts] for ts in (xs, ys, zs)]
    out = lowering.fn(*arrays, jnp.asarray(scalars.numpy()))
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        torch.testing.assert_close(torch.from_numpy(np.asarray(o)), r, atol=1e-6, rtol=1e-5)

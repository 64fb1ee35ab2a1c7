"""torch.compile(backend="tpu") used the ways PyTorch users write it: control-flow operators
(`torch.cond`, `while_loop`, `map`, `scan`, `nested_compile_region`) compiled whole, other higher-order
ops (mutating custom ops, `print`) run op by op, `torch.tpu` queries folded under fullgraph; each
compared with CPU eager."""

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from functorch.experimental.control_flow import map as control_flow_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _tpu(*tensors, requires_grad=False):
    return [t.detach().to("tpu").requires_grad_(requires_grad) for t in tensors]


def _assert_compiled_whole(record):
    fallbacks = [str(w.message) for w in record if "runs op by op" in str(w.message)]
    assert not fallbacks, fallbacks


def _cond_fn(p, x):
    return torch.cond(x.sum() > 0, lambda a: a.sin() * 2, lambda a: a.cos() - 1, (x * p,))


@pytest.mark.parametrize("sign", [1, -1], ids=["true", "false"])
def test_torch_cond_compiles_whole_and_matches_cpu(sign):
    p, x = torch.tensor(1.5), torch.randn(4).abs() * sign
    compiled = torch.compile(_cond_fn, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(*_tpu(p, x)).cpu(), _cond_fn(p, x))


def test_torch_cond_backward_matches_cpu():
    def f(x, w):
        return torch.cond(x.sum() > 0, lambda a, b: (a * b).sin(), lambda a, b: a.cos() * b, (x, w)).sum()

    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    for sign in (1, -1):
        x, w = (torch.randn(4).abs() * sign).requires_grad_(), torch.randn(4, requires_grad=True)
        f(x, w).backward()
        xt, wt = _tpu(x, w, requires_grad=True)
        compiled(xt, wt).backward()
        torch.testing.assert_close(xt.grad.cpu(), x.grad)
        torch.testing.assert_close(wt.grad.cpu(), w.grad)


def test_torch_cond_with_dynamic_sizes_and_nested_conds_matches_cpu():
    def f(x):
        def inner(a):
            return torch.cond(
                a.mean() > 0.5,
                lambda b: b[: b.shape[0] // 2] * 3,
                lambda b: b[1:][: b.shape[0] // 2] + 3,
                (a,),
            )

        return torch.cond(x.sum() > 0, inner, lambda a: -a[: a.shape[0] // 2], (x,))

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (4, 6):
        for x in (torch.rand(n) + 0.6, torch.rand(n) * 0.1, -torch.rand(n)):
            torch.testing.assert_close(compiled(*_tpu(x)).cpu(), f(x))


def test_random_ops_in_cond_branches_are_seeded():
    def f(x):
        return torch.cond(
            x.sum() > 0,
            lambda a: torch.nn.functional.dropout(a, 0.5),
            lambda a: a * 0 + torch.rand_like(a),
            (x,),
        )

    compiled = torch.compile(f, backend="tpu")
    x = torch.ones(1000, device="tpu")
    torch.manual_seed(0)
    first = compiled(x).cpu()
    torch.manual_seed(0)
    assert torch.equal(compiled(x).cpu(), first)
    assert 0.4 < (first == 0).float().mean() < 0.6
    uniform = compiled(-x).cpu()
    assert 0.4 < uniform.mean() < 0.6 and uniform.min() >= 0 and uniform.max() < 1


def test_while_loop_compiles_whole_and_matches_cpu():
    def f(i, x, w):
        return while_loop(lambda i, x: (i < 4) & (x.sum() < 100), lambda i, x: (i + 1, x @ w + 1.0), (i, x))

    i, x, w = torch.tensor(0), torch.randn(3), torch.randn(3, 3) * 0.5
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="tpu", fullgraph=True)(*_tpu(i, x, w))
    _assert_compiled_whole(record)
    want = f(i, x, w)
    assert got[0].dtype == torch.int64 and got[0].item() == want[0].item()
    torch.testing.assert_close(got[1].cpu(), want[1])


def test_while_loop_carrying_a_python_number_runs_op_by_op_and_matches_cpu():
    """A Python int among the carried values has no fixed-type JAX carry: op by op, as aot_eager gives."""

    def f(x):
        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2), (0, x))

    x = torch.ones(3)
    with pytest.warns(UserWarning, match=r"while_loop \(Python numbers among its carried values\)"):
        got = torch.compile(f, backend="tpu")(x.to("tpu"))
    want = f(x)
    assert got[0] == want[0] == 5
    torch.testing.assert_close(got[1].cpu(), want[1])


def _loops_drawing_random_rows():
    """Three loops whose body draws a row of uniform numbers: a while_loop writing row i, a map and a scan."""

    def with_while(i, x):
        def body(i, x):
            return i + 1, x.index_put((i,), torch.rand_like(x[0]))

        return while_loop(lambda i, x: i < x.shape[0], body, (i, x))[1]

    def with_map(x):
        return control_flow_map(lambda row: torch.rand_like(row), x)

    def with_scan(x):
        return scan(lambda c, row: (c + 1, torch.rand_like(row)), torch.zeros(()), x)[1]

    return {"while_loop": with_while, "map": with_map, "scan": with_scan}


@pytest.mark.parametrize("loop", ["while_loop", "map", "scan"])
def test_random_op_in_a_loop_body_compiles_whole_with_new_numbers_every_iteration(loop):
    """The body is traced once and runs per iteration: its draws fold in the iteration number, so the
    graph stays one program and no two iterations repeat their numbers."""
    f = _loops_drawing_random_rows()[loop]
    x = torch.zeros(6, 400, device="tpu")
    args = (torch.tensor(0, device="tpu"), x) if loop == "while_loop" else (x,)
    torch.tpu.manual_seed(0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rows = torch.compile(f, backend="tpu", fullgraph=True)(*args).cpu()
    _assert_compiled_whole(record)
    assert rows.shape == (6, 400)
    assert 0.0 <= rows.min().item() and rows.max().item() < 1.0
    assert abs(rows.mean().item() - 0.5) < 0.05
    distinct = {tuple(r[:8].tolist()) for r in rows}
    assert len(distinct) == 6, "two iterations drew the same numbers"


def test_map_forward_and_backward_match_cpu():
    def f(xs, y):
        return control_flow_map(lambda x, y: (x * y).sin(), xs, y).sum()

    xs, y = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    f(xs, y).backward()
    xt, yt = _tpu(xs, y, requires_grad=True)
    torch.compile(f, backend="tpu")(xt, yt).backward()
    torch.testing.assert_close(xt.grad.cpu(), xs.grad)
    torch.testing.assert_close(yt.grad.cpu(), y.grad)


def test_scan_forward_and_backward_match_cpu():
    def f(init, xs, w):
        c, ys = scan(lambda c, x: (c * w + x, (c * x).sin()), init, xs)
        return c.sum() + ys.sum()

    tensors = [torch.randn(3), torch.randn(5, 3), torch.randn(3)]
    ref = [t.clone().requires_grad_() for t in tensors]
    want = f(*ref)
    want.backward()
    dev = _tpu(*tensors, requires_grad=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="tpu", fullgraph=True)(*dev)
        got.backward()
    _assert_compiled_whole(record)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-5, rtol=1e-5)
    for d, r in zip(dev, ref):
        torch.testing.assert_close(d.grad.cpu(), r.grad, atol=1e-5, rtol=1e-5)


def _compiled_whole_equals_cpu(f, *tensors) -> list:
    """Compile `f` with fullgraph, check it ran as one program and equals CPU; the programs it built."""
    import hf_tpu

    want = f(*tensors)
    before = {p.name for p in hf_tpu.compiled_programs()}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="tpu", fullgraph=True)(*_tpu(*tensors))
    _assert_compiled_whole(record)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    return [p for p in hf_tpu.compiled_programs() if p.name not in before]


def test_a_convolution_in_a_scan_body_is_written_channels_last_and_matches_cpu():
    """XLA:CPU makes a channels-first convolution channels-last only at a program's top level; in a loop
    body it runs as a naive loop nest (28x slower on a 3x3 conv). The lowering writes it channels-last."""

    def f(x, ws):
        return scan(lambda c, w: (torch.tanh(F.conv2d(c, w, padding=1)), c.sum()), x, ws)

    programs = _compiled_whole_equals_cpu(f, torch.randn(2, 4, 8, 8), torch.randn(3, 4, 4, 3, 3) * 0.2)
    (text,) = [t for t in (p.compiled_text() for p in programs) if "while(" in t]
    labels = re.findall(r"dim_labels=([\w>-]+)", text)
    assert labels and set(labels) == {"b01f_01io->b01f"}, labels


def test_attention_in_a_scan_body_is_the_fused_op_and_matches_cpu():
    """A scan body is traced below autograd, where the tpu kernel of F.scaled_dot_product_attention is not
    consulted: without the graph decomposition it became CPU's math path (bmm, _safe_softmax, bmm)."""

    def f(q, xs):
        return scan(lambda c, x: ((F.scaled_dot_product_attention(c, c, c) + x).tanh(), c.sum()), q, xs)

    programs = _compiled_whole_equals_cpu(f, torch.randn(2, 4, 16, 8), torch.randn(3, 2, 4, 16, 8))
    targets = {
        str(n.target)
        for p in programs
        for gm in p.gm.modules()
        if isinstance(gm, torch.fx.GraphModule)
        for n in gm.graph.nodes
    }
    assert "aten._scaled_dot_product_fused_attention_overrideable.default" in targets, targets
    assert "aten._safe_softmax.default" not in targets, targets


def test_nested_compile_region_matches_cpu():
    @torch.compiler.nested_compile_region
    def block(x, w):
        return (x @ w).relu()

    def f(x, w):
        return block(block(x, w), w).sum()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3)
    want = f(x, w)
    want.backward()
    xt, wt = _tpu(x, w)
    xt.requires_grad_()
    got = torch.compile(f, backend="tpu", fullgraph=True)(xt, wt)
    got.backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach())
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


def test_control_flow_with_an_op_without_graph_lowering_runs_op_by_op(monkeypatch):
    from hf_tpu.runtime.compile import backend as tpu_compile

    lowering = tpu_compile.graph_lowering
    monkeypatch.setattr(
        tpu_compile, "graph_lowering", lambda op: None if op is torch.ops.aten.sin.default else lowering(op)
    )
    x = torch.rand(4)
    with pytest.warns(UserWarning, match=r"aten\.sin\.default.*op by op"):
        got = torch.compile(_cond_fn, backend="tpu")(*_tpu(torch.tensor(1.0), x))
    torch.testing.assert_close(got.cpu(), _cond_fn(torch.tensor(1.0), x))
    torch._dynamo.reset()  # Dynamo would reuse the graph compiled without fullgraph
    with pytest.raises(Exception, match=r"no graph lowering for aten\.sin\.default"):
        torch.compile(_cond_fn, backend="tpu", fullgraph=True)(*_tpu(torch.tensor(2.0), x))


@torch.library.custom_op("hf_tpu_test::scale_", mutates_args=("x",))
def _scale_(x: torch.Tensor, k: float) -> None:
    x.mul_(k)


def test_a_custom_op_mutating_its_input_runs_op_by_op_and_mutates_it():
    """aot_autograd wraps a mutating custom op in the `auto_functionalized_v2` higher-order op: it has no
    graph lowering, so the graph runs op by op (naming it) instead of failing inside the jit."""

    def f(x):
        _scale_(x, 2.0)
        return x.sum()

    x = torch.randn(4)
    want_x = x.clone()
    want = f(want_x)
    xt = x.to("tpu")
    with pytest.warns(UserWarning, match="auto_functionalized"):
        got = torch.compile(f, backend="tpu")(xt)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(xt.cpu(), want_x)


def test_tpu_device_queries_fold_to_constants_under_fullgraph_from_the_first_compile():
    """`torch.tpu.is_available()`, `device_count()`, `current_device()` in compiled code fold to constants
    as their `torch.cuda` counterparts do, rather than breaking the graph (an error under fullgraph=True),
    already in the first compile of a process (Dynamo's modules load then)."""
    code = """
import torch

def f(x):
    if torch.tpu.is_available() and torch.tpu.device_count() >= 1:
        return x * 2 + torch.tpu.current_device()
    return x

out = torch.compile(f, backend="tpu", fullgraph=True)(torch.ones(3, device="tpu"))
assert torch.equal(out.cpu(), torch.full((3,), 2.0)), out
print("ok")
"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_the_print_higher_order_op_runs_op_by_op_and_prints(capfd):
    """`torch._higher_order_ops.print` reaches the graph inside `with_effects`: no graph lowering, so the
    graph runs op by op (naming it) and prints, instead of failing inside the jit."""

    def f(x):
        y = x * 2
        torch._higher_order_ops.print("value {}", y)
        return y + 1

    with pytest.warns(UserWarning, match=r"\(print\).*op by op"):
        got = torch.compile(f, backend="tpu")(torch.ones(2, device="tpu"))
    torch.testing.assert_close(got.cpu(), torch.full((2,), 3.0))
    assert "value tensor([2., 2.]" in capfd.readouterr().out

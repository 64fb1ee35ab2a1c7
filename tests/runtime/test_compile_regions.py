"""torch.compile(backend="tpu") on checkpointed regions (with and without dropout) and on graphs whose
tensors live on the CPU, the tpu, or both: each compared with CPU eager."""

import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_tpu.runtime.compile import backend as tpu_compile


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Region(nn.Module):
    """Linear -> Dropout -> Linear, checkpointed; also returns the dropout output, so a test can read
    the mask the forward drew and check the backward recomputed with the same one."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(8, 32), nn.Dropout(p), nn.Linear(32, 4)

    def body(self, x):
        d = self.drop(self.a(x))
        return self.b(d), d

    def forward(self, x):
        y, d = checkpoint(self.body, x, use_reentrant=False)
        return y.tanh(), d  # outside the region: only the forward graph runs tanh


def _pair(**kwargs):
    torch.manual_seed(0)
    ref = Region(**kwargs)
    dev = Region(**kwargs)
    dev.load_state_dict(ref.state_dict())
    return ref, dev.to("tpu")


def _grads(module) -> dict:
    return {name: p.grad.cpu() for name, p in module.named_parameters()}


def _masked_reference(ref: Region, x: torch.Tensor, keep: torch.Tensor, p: float):
    """CPU eager with the dropout mask fixed to `keep`: the values and grads a correct replay gives."""
    x = x.clone().requires_grad_(True)
    d = ref.a(x) * keep / (1 - p)
    y = ref.b(d).tanh()
    (y.sum() + (d * d).sum()).backward()
    return y.detach(), d.detach(), x.grad, _grads(ref)


def _train_step(model, x):
    x = x.clone().requires_grad_(True)
    y, d = model(x)
    (y.sum() + (d * d).sum()).backward()
    return y.detach(), d.detach(), x.grad


def _check_dropout_replay(compiled, dev: Region, ref: Region, x: torch.Tensor) -> torch.Tensor:
    y, d, x_grad = _train_step(compiled, x.to("tpu"))
    keep = d.cpu() != 0
    assert 0 < keep.sum() < keep.numel(), "dropout(0.5) drew a trivial mask: the test would prove nothing"
    y_ref, d_ref, x_grad_ref, grads_ref = _masked_reference(ref, x, keep, 0.5)
    torch.testing.assert_close(d.cpu(), d_ref)
    torch.testing.assert_close(y.cpu(), y_ref)
    torch.testing.assert_close(x_grad.cpu(), x_grad_ref)
    for name, g in _grads(dev).items():
        torch.testing.assert_close(g, grads_ref[name], msg=name)
    # a dropped unit contributes nothing: its column of a's weight gets zero gradient from every row
    dropped_everywhere = ~keep.any(0)
    assert torch.all(dev.a.weight.grad.cpu()[dropped_everywhere] == 0)
    return keep


def test_checkpointed_dropout_backward_replays_the_forward_mask():
    ref, dev = _pair()
    dev.train()
    x = torch.randn(6, 8)
    compiled = torch.compile(dev, backend="tpu")
    keep1 = _check_dropout_replay(compiled, dev, ref, x)
    for m in (ref, dev):
        m.zero_grad()
    keep2 = _check_dropout_replay(compiled, dev, ref, x)
    assert not torch.equal(keep1, keep2), "the generator did not advance between steps"


def test_checkpointed_dropout_is_reproducible_under_manual_seed():
    _, dev = _pair()
    compiled = torch.compile(dev, backend="tpu")
    x = torch.randn(6, 8, device="tpu")
    torch.manual_seed(123)
    first = compiled(x)[1].cpu()
    torch.manual_seed(123)
    assert torch.equal(compiled(x)[1].cpu(), first)


@pytest.mark.parametrize(
    "hidden, op_by_op",
    [
        (("tanh", "native_dropout_backward"), {"forward", "backward"}),  # the wrappers in tpu eager
        (("native_dropout_backward",), {"backward"}),  # a compiled forward's state, replayed op by op
        (("tanh",), {"forward"}),  # an op-by-op forward's state (a CPU tensor), replayed compiled
    ],
)
def test_checkpointed_dropout_replays_across_compiled_and_op_by_op_graphs(monkeypatch, hidden, op_by_op):
    """A graph holding an op without a graph lowering runs op by op; the RNG state one graph saves must
    replay the same key in the other, whichever way each runs. (`tanh` is outside the region, so only
    the forward graph has it; `native_dropout_backward` only the backward.)"""
    real = tpu_compile.graph_lowering
    ops = {getattr(torch.ops.aten, name).default for name in hidden}
    monkeypatch.setattr(tpu_compile, "graph_lowering", lambda o: None if o in ops else real(o))
    monkeypatch.setattr(tpu_compile, "_warned", set())
    ref, dev = _pair()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check_dropout_replay(torch.compile(dev, backend="tpu"), dev, ref, torch.randn(6, 8))
    ran = {
        kind
        for w in caught
        if "op by op" in str(w.message)
        for kind in ("forward", "backward")
        if f"graph {kind}" in str(w.message)
    }
    assert ran == op_by_op


def test_checkpointed_dropout_eval_matches_cpu():
    ref, dev = _pair()
    ref.eval()
    dev.eval()
    x = torch.randn(6, 8)
    y_ref, d_ref = ref(x)
    y, d = torch.compile(dev, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(y.cpu(), y_ref.detach())
    torch.testing.assert_close(d.cpu(), d_ref.detach())


def test_checkpointed_region_without_dropout_matches_cpu():
    ref, dev = _pair(p=0.0)
    x = torch.randn(6, 8)
    y_ref, d_ref, x_grad_ref = _train_step(ref, x)
    y, d, x_grad = _train_step(torch.compile(dev, backend="tpu"), x.to("tpu"))
    torch.testing.assert_close(y.cpu(), y_ref)
    torch.testing.assert_close(d.cpu(), d_ref)
    torch.testing.assert_close(x_grad.cpu(), x_grad_ref)
    grads_ref = _grads(ref)
    for name, g in _grads(dev).items():
        torch.testing.assert_close(g, grads_ref[name], msg=name)


def test_checkpointed_dropout_on_cpu_is_left_to_pytorch():
    """A CPU-only region compiled with backend="tpu" draws from the CPU generator, as eager does."""
    torch.manual_seed(0)
    model = Region()
    x = torch.randn(6, 8)
    torch.manual_seed(7)
    y_ref, d_ref, x_grad_ref = _train_step(model, x)
    torch.manual_seed(7)
    y, d, x_grad = _train_step(torch.compile(model, backend="tpu"), x)
    assert y.device.type == d.device.type == x_grad.device.type == "cpu"
    torch.testing.assert_close(d, d_ref)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x_grad, x_grad_ref)


# --- where outputs live ---------------------------------------------------------------------------


def _assert_same_outputs(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device == w.device, (g.device, w.device)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w.cpu())


def _compare(fn, *args) -> None:
    _assert_same_outputs(torch.compile(fn, backend="tpu")(*args), fn(*args))


def test_cpu_results_of_a_tpu_graph_stay_on_cpu():
    def f(x):
        return (x * 2).cpu(), torch.ones(3), torch.arange(4), (x > 0).cpu(), x.to(torch.int32).cpu(), x + 1

    _compare(f, torch.randn(3, device="tpu"))


def test_cpu_only_graph_returns_cpu_tensors():
    def f(a):
        return a.sin() * 2, a.sum(), a.argmax()

    _compare(f, torch.randn(4, 5))


def test_cpu_input_mixed_with_tpu_inputs_matches_eager():
    def f(x, y):
        return x * 2 + y.to("tpu"), y + 1, (y * x.cpu()).sum()

    _compare(f, torch.randn(3, device="tpu"), torch.randn(3))


def test_cpu_scalar_tensor_with_a_tpu_tensor_matches_eager():
    _compare(lambda x, s: (x * s, s + 1), torch.randn(3, device="tpu"), torch.tensor(2.5))


def test_cpu_non_scalar_with_a_tpu_tensor_is_refused_like_eager():
    def f(x, y):
        return x + y

    x, y = torch.randn(3, device="tpu"), torch.randn(3)
    with pytest.raises(RuntimeError, match="same device"):
        f(x, y)
    with pytest.raises(RuntimeError, match="same device"):
        torch.compile(f, backend="tpu")(x, y)


def test_cpu_input_mutated_by_a_tpu_graph_matches_eager():
    def f(x, y):
        y.add_(1)
        return x * y.to("tpu")

    x, y_ref = torch.randn(3, device="tpu"), torch.randn(3)
    y = y_ref.clone()
    out_ref = f(x, y_ref)
    out = torch.compile(f, backend="tpu")(x, y)
    _assert_same_outputs([out, y], [out_ref, y_ref])


def test_grads_through_a_cpu_output_land_where_eager_puts_them():
    def f(x, w):
        return (x * w.to("tpu")).cpu().sum()

    x_ref, w_ref = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    x = x_ref.detach().to("tpu").requires_grad_(True)
    w = w_ref.detach().clone().requires_grad_(True)
    loss_ref = f(x_ref.detach().to("tpu").requires_grad_(True), w_ref)
    loss_ref.backward()
    loss = torch.compile(f, backend="tpu")(x, w)
    loss.backward()
    _assert_same_outputs([loss, w.grad], [loss_ref, w_ref.grad])
    assert x.grad.device.type == "tpu"
    torch.testing.assert_close(x.grad.cpu(), w_ref.detach())


def test_dropouts_inside_and_around_a_checkpoint_draw_as_tpu_eager_does():
    """Same seed, same draws: the compiled graph takes its keys in the order eager takes them, and
    eager checkpointing replays through torch.tpu's RNG state, so values and grads agree exactly."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
            self.d0, self.d1, self.d2 = nn.Dropout(0.5), nn.Dropout(0.3), nn.Dropout(0.6)

        def body(self, x):
            return self.b(self.d2(self.d1(self.a(x)).relu()))

        def forward(self, x):
            return self.c(self.d0(checkpoint(self.body, self.d0(x), use_reentrant=False)))

    torch.manual_seed(0)
    net = Net().to("tpu")
    x = torch.randn(5, 8, device="tpu")

    def step(fn):
        net.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        y = fn(x)
        y.pow(2).sum().backward()
        return [y.detach().cpu()] + [p.grad.cpu() for p in net.parameters()]

    eager, compiled = step(net), step(torch.compile(net, backend="tpu"))
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e)
    assert (eager[0] != 0).any()


def test_cpu_input_saved_for_the_backward_matches_eager():
    def f(x, y):
        return (x.cpu() * y).sin().sum(), x * 3

    y = torch.randn(4, requires_grad=True)
    x_cpu = torch.randn(4)
    results = []
    for fn in (f, torch.compile(f, backend="tpu")):
        x = x_cpu.to("tpu").requires_grad_(True)
        y.grad = None
        loss, z = fn(x, y)
        (loss + z.sum().cpu()).backward()
        results.append([loss, z, x.grad, y.grad])
    _assert_same_outputs(results[1], results[0])


# --- sizes Dynamo made dynamic ------------------------------------------------------------------------


def _linear_step(model, x):
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out = model(x)
    out.pow(2).sum().backward()
    return [out.detach().cpu(), x.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]


def test_compiled_training_with_a_changing_batch_size_matches_cpu():
    """The second batch size makes Dynamo compile a dynamic graph: its forward returns the symbolic batch
    size for the backward, which aot_autograd needs back as a Python int (not a tensor)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    dev = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    dev.load_state_dict(ref.state_dict())
    compiled = torch.compile(dev.to("tpu"), backend="tpu")
    for batch in (1, 2, 3):
        x = torch.randn(batch, 4)
        for got, want in zip(_linear_step(compiled, x.to("tpu")), _linear_step(ref, x)):
            torch.testing.assert_close(got, want)


def test_compiled_sizes_come_back_as_python_numbers():
    def f(x):
        return x * 2, x.shape[0] * 3, x.shape[0] / 2, x.shape[0] > 2

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (3, 5):
        out = compiled(torch.arange(float(n), device="tpu"))
        assert [type(v) for v in out[1:]] == [int, float, bool]
        assert out[1:] == (3 * n, n / 2, n > 2)
        torch.testing.assert_close(out[0].cpu(), torch.arange(float(n)) * 2)


def test_compiled_llama_training_with_a_changing_sequence_length_matches_cpu():
    from tests.integrations import zoo

    ref, _ = zoo.build("llama")
    ref.train()
    dev, _ = zoo.build("llama")
    dev.load_state_dict(ref.state_dict())
    dev.train()
    compiled = torch.compile(dev.to("tpu"), backend="tpu")
    for length in (8, 12, 6):
        ids = torch.randint(3, zoo.VOCAB, (2, length), generator=torch.Generator().manual_seed(length))
        results = []
        for model, fn, device in ((ref, ref, "cpu"), (dev, compiled, "tpu")):
            model.zero_grad(set_to_none=True)
            loss = fn(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            results.append([loss.detach().cpu()] + [p.grad.cpu() for p in model.parameters()])
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


# --- outputs that alias each other or an input --------------------------------------------------------


def _views_of_an_output(x):
    y = x + 1
    return y, y.view(-1), y[1], y.t(), y[:, 1:], y[0].expand(3, 2)


def _views_of_an_intermediate(x):
    y = x * 2
    return y.view(-1), y[1], y.t()


def _view_before_its_base(x):
    y = x + 1
    return y.view(-1), y


def _the_same_output_twice(x):
    y = x + 1
    return y, y, y.detach()


def _the_input_and_its_views(x):
    return x, x.view(-1), x[0], x * 2


def _views_of_a_cpu_result(x):
    y = (x + 1).cpu()
    return y, y.view(-1), y[1]


def _aliasing(x: torch.Tensor, outs) -> tuple:
    """What eager promises about aliasing: which tensors share a storage, which are the very same
    object, each output's view metadata and the tensor its `_base` is (an index into [x, *outs])."""
    tensors = [x, *outs]

    def storage(t):
        return t.device.type, t.untyped_storage().data_ptr()

    shares = [[storage(a) == storage(b) for b in tensors] for a in tensors]
    same = [[a is b for b in tensors] for a in tensors]
    meta = [(tuple(o.shape), o.stride(), o.storage_offset(), o.device.type, o.requires_grad) for o in outs]
    bases = [
        next((i for i, t in enumerate(tensors) if o._base is t), "other") if o._is_view() else None
        for o in outs
    ]
    return shares, same, meta, bases


def _run_and_mutate(fn, requires_grad: bool, rows: int = 3) -> tuple:
    x = torch.arange(rows * 2.0, device="tpu").reshape(rows, 2).requires_grad_(requires_grad)
    outs = fn(x)
    aliasing = _aliasing(x, outs)
    first = outs[0] if outs[0] is not x else outs[1]
    with torch.no_grad():
        first.add_(100)  # every output sharing its storage must see it
    return aliasing, [o.detach().cpu() for o in outs]


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize(
    "fn",
    [
        _views_of_an_output,
        _views_of_an_intermediate,
        _view_before_its_base,
        _the_same_output_twice,
        _the_input_and_its_views,
        _views_of_a_cpu_result,
    ],
)
def test_compiled_outputs_alias_as_in_eager(fn, requires_grad):
    if requires_grad and fn is _views_of_a_cpu_result:
        pytest.skip("an in-place write to a CPU view of a tensor that requires grad is refused in eager too")
    want_aliasing, want_values = _run_and_mutate(fn, requires_grad)
    got_aliasing, got_values = _run_and_mutate(torch.compile(fn, backend="tpu"), requires_grad)
    assert got_aliasing == want_aliasing
    for got, want in zip(got_values, want_values):
        torch.testing.assert_close(got, want)


def test_compiled_views_with_dynamic_sizes_alias_as_in_eager():
    def f(x):
        y = x * 2
        return y, y.view(-1), y[x.shape[0] - 1], y.reshape(x.shape[0], -1)[:, :1]

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for rows in (3, 4):
        want_aliasing, want_values = _run_and_mutate(f, False, rows)
        got_aliasing, got_values = _run_and_mutate(compiled, False, rows)
        assert got_aliasing == want_aliasing
        for got, want in zip(got_values, want_values):
            torch.testing.assert_close(got, want)


def test_an_input_saved_for_the_backward_is_the_input_itself():
    """The forward returns an input it saves for the backward as that very tensor (as eager and
    aot_eager save it), not a fresh copy: it keeps its autograd identity and needs no new storage."""

    def f(x):
        return (x.sin() * x**3).sum()

    x_ref = torch.linspace(-1, 1, 5, requires_grad=True)
    (want,) = torch.autograd.grad(f(x_ref), x_ref, create_graph=True)
    x = x_ref.detach().to("tpu").requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = torch.compile(f, backend="tpu")(x)
    assert any(t is x for t in saved)
    (got,) = torch.autograd.grad(loss, x, create_graph=True)
    torch.testing.assert_close(got.detach().cpu(), want.detach())


def test_double_backward_through_a_compiled_function_says_it_is_unsupported():
    """aot_autograd does not support double backward; the error must say so (as with aot_eager), not
    that the input was unused."""
    f = torch.compile(lambda x: (x.sin() * x**3).sum(), backend="tpu")
    x = torch.linspace(-1, 1, 5, device="tpu").requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        torch.autograd.grad(g.sum(), x)

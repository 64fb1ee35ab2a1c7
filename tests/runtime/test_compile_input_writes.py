"""Inputs a compiled graph overwrites, and weights changed between compiled calls.

aot_autograd keeps an inference graph's data mutations of its inputs in the graph
(`keep_inference_input_mutations=True`); the backend returns their new values and stores them into the
inputs itself (`backend._in_graph_mutations`), donating the buffers where safe, instead of aot_autograd's
`copy_` per input after the call. Every result is compared with the same code on CPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.compile import backend as tpu_compile


def _address(t) -> int:
    return REGISTRY.payload(t.untyped_storage().data_ptr()).array.unsafe_buffer_pointer()


def _step(buf, x):
    buf.add_(x)
    return buf * 2


def test_an_input_the_graph_overwrites_is_updated_in_place():
    torch._dynamo.reset()
    step = torch.compile(_step, backend="tpu")
    buf_cpu, buf = torch.zeros(4, 5), torch.zeros(4, 5, device="tpu")
    addresses = []
    with torch.no_grad():
        for i in range(4):
            x = torch.full((4, 5), float(i + 1))
            before = _address(buf)
            out = step(buf, x.to("tpu"))
            addresses.append(_address(buf) == before)
            ref = _step(buf_cpu, x)
            torch.testing.assert_close(out.cpu(), ref)
            torch.testing.assert_close(buf.cpu(), buf_cpu)
    assert any(p._written and not p.missing for p in tpu_compile.PROGRAMS)
    assert addresses[1:] == [True] * 3, addresses  # donated (the first buffer came from the host)


def test_an_overwritten_input_that_is_a_view_or_a_cpu_tensor():
    def fn(a, counter, x):
        a.mul_(x)
        counter.add_(1)
        return a.sum() + x.sum()

    torch._dynamo.reset()
    step = torch.compile(fn, backend="tpu")
    base_cpu = torch.arange(12.0).reshape(3, 4)
    base = base_cpu.to("tpu")
    counter, counter_cpu = torch.zeros(2), torch.zeros(2)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4)
            out = step(base[1], counter, x.to("tpu"))
            ref = fn(base_cpu[1], counter_cpu, x)
            torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(base.cpu(), base_cpu)
    torch.testing.assert_close(counter, counter_cpu)


def test_an_overwritten_input_when_the_graph_runs_op_by_op(monkeypatch):
    real = tpu_compile.graph_lowering
    hidden = torch.ops.aten.tanh.default
    monkeypatch.setattr(tpu_compile, "graph_lowering", lambda op: None if op is hidden else real(op))
    monkeypatch.setattr(tpu_compile, "_warned", set())

    def fn(buf, x):
        buf.add_(torch.tanh(x))
        return buf + 1

    torch._dynamo.reset()
    buf, buf_cpu = torch.ones(3, device="tpu"), torch.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = torch.compile(fn, backend="tpu")
        with torch.no_grad():
            for _ in range(2):
                x = torch.randn(3)
                out = step(buf, x.to("tpu"))
                torch.testing.assert_close(out.cpu(), fn(buf_cpu, x))
    torch.testing.assert_close(buf.cpu(), buf_cpu)
    assert any(p._written and p.missing for p in tpu_compile.PROGRAMS)  # it did run op by op


@pytest.mark.parametrize("change", ["in_place", "data_copy", "optimizer", "load_state_dict", "replaced"])
def test_weights_changed_between_compiled_calls(change):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.GELU(), torch.nn.Linear(6, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.GELU(), torch.nn.Linear(6, 3))
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    torch._dynamo.reset()
    fwd = torch.compile(dev, backend="tpu")
    x = torch.randn(2, 5)
    with torch.no_grad():
        torch.testing.assert_close(fwd(x.to("tpu")).cpu(), ref(x), atol=1e-5, rtol=1e-5)
    if change == "in_place":
        with torch.no_grad():
            for m in (ref, dev):
                m[0].weight.mul_(2)
                m[2].bias.add_(1)
    elif change == "data_copy":
        w = torch.randn(6, 5)
        ref[0].weight.data.copy_(w)
        dev[0].weight.data.copy_(w.to("tpu"))
    elif change == "optimizer":
        for m in (ref, dev):
            opt = torch.optim.SGD(m.parameters(), lr=0.5)
            inp = x if m is ref else x.to("tpu")
            m(inp).square().sum().backward()
            opt.step()
    elif change == "load_state_dict":
        new = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.GELU(), torch.nn.Linear(6, 3))
        ref.load_state_dict(new.state_dict())
        dev.load_state_dict(new.state_dict())
    else:
        w = torch.randn(3, 6)
        ref[2].weight = torch.nn.Parameter(w)
        dev[2].weight = torch.nn.Parameter(w.to("tpu"))
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fwd(x.to("tpu")).cpu(), ref(x), atol=1e-5, rtol=1e-5)

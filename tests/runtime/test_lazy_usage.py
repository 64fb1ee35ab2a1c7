"""DeferAndFuse under everyday PyTorch usage: results match CPU PyTorch, and the recorder's caches stay right
over a long-running process."""

import gc

import pytest
import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.launch import lazy


def test_recorded_output_shapes_do_not_come_from_a_dead_kernel(defer, monkeypatch):
    """Output shapes are cached per kernel: a kernel that died (its program dropped from the cache, as
    DeferAndFuse drops per-offset view readers) must not hand its shapes to a new kernel that CPython
    placed at the same address."""
    monkeypatch.setattr(lazy, "MAX_PROGRAMS", 1)
    monkeypatch.setitem(lazy._streak, "warned", True)  # every flush here compiles, on purpose
    jax = platform.jax()
    x = jax.numpy.zeros(64)
    stale = []
    for n in range(1, 40):
        fn = jax.jit(lambda a, n=n: a[:n])
        value = lazy.call(fn, (x,))
        if value.shape != (n,):
            stale.append((n, value.shape))
        del fn, value
        lazy.flush()
    assert not stale, f"recorded shapes of another kernel: {stale[:3]}"


def test_forward_mode_transforms_match_cpu(defer):
    """torch.func's forward-mode transforms (jacfwd, hessian, jvp under vmap) create their zero tangents
    with aten::_efficientzerotensor."""
    from torch.func import hessian, jacfwd, jvp, vmap

    x = torch.randn(4)
    t = x.to("tpu")

    def f(a):
        return a.sin() * a.exp()

    def loss(a):
        return (a**3 * a.cos()).sum()

    basis = torch.eye(4)
    results = {
        "jacfwd": (jacfwd(f)(x), jacfwd(f)(t)),
        "hessian": (hessian(loss)(x), hessian(loss)(t)),
        "vmap(jvp)": (
            vmap(lambda v: jvp(f, (x,), (v,))[1])(basis),
            vmap(lambda v: jvp(f, (t,), (v,))[1])(basis.to("tpu")),
        ),
    }
    for name, (ref, out) in results.items():
        torch.testing.assert_close(out.cpu(), ref, msg=lambda m, name=name: f"{name}: {m}")
    assert torch.ops.aten._efficientzerotensor([2, 3], device="tpu").cpu().eq(0).all()


def test_leaving_the_mode_leaves_it_even_when_the_last_flush_fails():
    """`with torch.tpu.eager_mode(...)` restores the previous mode on exit; a recorded op that fails in
    the flush on the way out raises, naming it, and does not keep the process in DeferAndFuse."""
    from tests.runtime.test_lazy import _failing_exp

    w = torch.randn(3, 3, device="tpu")
    kernel = _failing_exp([10**9])
    with pytest.raises(RuntimeError, match=r"aten\.exp\.default"):
        with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            _kept = kernel(w) * 2
    try:
        assert torch.tpu.get_eager_mode() is torch.tpu.EagerMode.DEFER_NEVER
        assert not lazy.enabled()
        assert lazy.pending_ops() == 0
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    y = kernel(w)
    with pytest.raises(RuntimeError, match=r"aten\.exp\.default"):
        torch.tpu.set_eager_mode("defer_never")
    del y
    assert torch.tpu.get_eager_mode() is torch.tpu.EagerMode.DEFER_NEVER and not lazy.enabled()


def test_set_without_a_source_empties_the_tensor(defer):
    """`x.set_()` gives x an empty tpu storage (views keep the old one), and x grows again by `resize_`."""
    x_cpu = torch.randn(4)
    x = x_cpu.to("tpu") * 1
    view = x[1:]
    x.set_()
    assert x.shape == (0,) and x.device.type == "tpu" and x.untyped_storage().nbytes() == 0
    x.resize_(3).fill_(2.0)
    view.mul_(3)
    torch.testing.assert_close(x.cpu(), torch.full((3,), 2.0))
    torch.testing.assert_close(view.cpu(), x_cpu[1:] * 3)


def test_a_tensor_made_by_the_op_that_hits_the_graph_size_limit_is_counted(defer, monkeypatch):
    """The op that reaches the graph-size limit flushes the trace before its output is stored: that
    output is stored as the computed buffer it is, so memory_allocated counts it like every other."""
    monkeypatch.setattr(lazy, "MAX_OPS", 4)
    x = torch.randn(1024, device="tpu")
    gc.collect()  # garbage an earlier test left (a traceback's tensors) must not be freed mid-measurement
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    kept = [x * (i + 1) for i in range(12)]
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() - base == 12 * x.nbytes
    torch.testing.assert_close(kept[-1].cpu(), x.cpu() * 12)

"""The eager kernel cache: scalars baked into executables, and the switch to traced scalars."""

from __future__ import annotations

import math

import torch

from hf_tpu.runtime.device import registration
from hf_tpu.runtime.execution import dispatch
from hf_tpu.runtime.lowerings.table import TABLE


def _kernel(op) -> dispatch.OpKernel:
    """A fresh kernel (own cache) for `op`, as registration builds it."""
    registration.ensure_kernels()
    return dispatch.OpKernel(op, TABLE[op])


def test_scalar_values_do_not_share_an_executable():
    """0.0 and -0.0, 5 and 5.0, NaN: each gives PyTorch's answer, not a cached neighbour's."""
    kernel = _kernel(torch.ops.aten.mul.Tensor)
    x = torch.tensor([1.0, -2.0, 3.0])
    d = x.to("tpu")
    for s in (0.0, -0.0, 5, 5.0, math.nan, math.inf, -math.inf, 0.5):
        got = kernel(d, s).cpu()
        want = x * s
        torch.testing.assert_close(got, want, equal_nan=True)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), s


def test_many_scalar_values_switch_to_traced_scalars():
    kernel = _kernel(torch.ops.aten.add.Tensor)
    x = torch.arange(6, dtype=torch.float32)
    d = x.to("tpu")
    for i in range(dispatch._MAX_STATIC_SCALAR_BUILDS + 10):
        torch.testing.assert_close(kernel(d, float(i) / 3).cpu(), x + float(i) / 3)
    assert kernel.dynamic_scalars
    # once traced, new values reuse the one traced-scalar executable
    n = len(kernel.cache)
    for i in range(5):
        torch.testing.assert_close(kernel(d, 100.0 + i).cpu(), x + 100.0 + i)
    assert len(kernel.cache) == n <= dispatch._MAX_STATIC_SCALAR_BUILDS + 2


def test_one_value_at_many_shapes_stays_baked():
    """Builds at new shapes with the same value are not new values: `add(x, 1)` over a growing length
    keeps its baked-in 1 (counting builds switched it to traced scalars after 16 lengths)."""
    kernel = _kernel(torch.ops.aten.add.Tensor)
    for n in range(1, dispatch._MAX_STATIC_SCALAR_BUILDS + 10):
        x = torch.arange(n, dtype=torch.float32)
        torch.testing.assert_close(kernel(x.to("tpu"), 1).cpu(), x + 1)
    assert not kernel.dynamic_scalars


def test_a_repeated_growing_loop_reuses_every_defer_and_fuse_program():
    """A decode-like loop (a sequence growing by one each step, `+ 1` on it, a sync per step) run twice
    under DeferAndFuse: the second run records the same kernels, so every program is a cache hit
    (before, the first run's 17th length switched `add` to traced scalars and the second run compiled
    17 programs again)."""
    from hf_tpu.runtime.launch import lazy

    def loop():
        seq = torch.zeros(1, 1, device="tpu")
        for _ in range(dispatch._MAX_STATIC_SCALAR_BUILDS + 6):
            nxt = seq[:, -1:] + 1
            seq = torch.cat([seq, nxt], dim=1)
            assert seq[0, -1].item() == seq.shape[1] - 1  # a sync point, as generate's stop check
        return seq.cpu()

    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        first = loop()
        before = dict(lazy.stats)
        again = loop()
        misses = lazy.stats["cache_misses"] - before["cache_misses"]
        hits = lazy.stats["cache_hits"] - before["cache_hits"]
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    assert torch.equal(first, again)
    assert torch.equal(first, torch.arange(first.shape[1], dtype=torch.float32)[None])
    assert misses == 0 and hits >= dispatch._MAX_STATIC_SCALAR_BUILDS + 6


def test_large_int_scalar_is_exact():
    """An int beyond int32 travels as a traced int64 (baking it into int32 math would overflow)."""
    x = torch.tensor([1, 2, 3], dtype=torch.int64)
    big = (1 << 40) + 7
    torch.testing.assert_close((x.to("tpu") + big).cpu(), x + big)
    torch.testing.assert_close((x.to("tpu") * big).cpu(), x * big)


def test_output_storages_are_unique_and_freed():
    """Outputs get distinct fake pointers with the right byte size, and dead ones are swept."""
    from hf_tpu.runtime.buffers.storage import REGISTRY

    a = torch.ones(4, 4, device="tpu")
    outs = [a + i for i in range(10)]
    ptrs = {o.untyped_storage().data_ptr() for o in outs}
    assert len(ptrs) == 10
    assert all(o.untyped_storage().nbytes() == 64 for o in outs)
    assert all(REGISTRY.payload(o.untyped_storage().data_ptr()) is not None for o in outs)
    live = REGISTRY.live_count()
    del outs
    assert REGISTRY.live_count() <= live - 10


def test_threads_switching_a_kernel_to_traced_scalars_agree_on_its_inputs():
    """A build in another thread may switch a kernel to traced scalars between this call's cache key
    and its own build: both must use the same decision (it once raised StopIteration)."""
    import threading

    errors = []

    def work(i):
        try:
            x = torch.ones(4, device="tpu")
            for k in range(60):
                x = x + 0.001 * (k * 4 + i)  # a new Python float every call
            x.cpu()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]

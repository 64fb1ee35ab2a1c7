"""Non-blocking tpu -> host copies into pinned (async-target) tensors: CUDA's contract, checked against CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_tpu.runtime.buffers import host_copies


def _slow_value(n: int = 1200) -> tuple[torch.Tensor, torch.Tensor]:
    """A tpu scalar that takes tens of milliseconds to compute, and the same value computed on CPU."""
    torch.manual_seed(0)
    a = torch.randn(n, n) / n**0.5
    ref = ((a @ a) @ a).sum()  # first: the device result must still be in flight when this returns
    x = a.to("tpu")
    return ((x @ x) @ x).sum(), ref


def _pinned(*shape, dtype=torch.float32) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.zeros(*shape, dtype=dtype).pin_memory()


def test_pin_memory_marks_an_async_target():
    t = _pinned(3)
    assert host_copies.is_async_target(t)
    assert not host_copies.is_async_target(torch.zeros(3))
    with pytest.raises(ValueError, match="host"):
        host_copies.mark_async_target(torch.zeros(3, device="tpu"))


def test_non_blocking_copy_into_pinned_lands_by_event_synchronize():
    value, ref = _slow_value()
    dst = _pinned(())
    dst.copy_(value, non_blocking=True)
    pending = host_copies.newest_pending()
    event = torch.tpu.Event()
    event.record()
    event.synchronize()
    assert event.query()
    torch.testing.assert_close(dst, ref, rtol=1e-4, atol=1e-4)
    assert pending is None or host_copies.newest_pending() is None or host_copies.newest_pending() > pending


def test_non_blocking_copy_returns_before_the_value_is_computed():
    """The copy is queued, not waited for: the host is free while the device computes."""
    value, ref = _slow_value(1600)
    dst = _pinned(())
    dst.copy_(value, non_blocking=True)
    assert host_copies.newest_pending() is not None  # still in flight (the matmuls take ~0.1 s here)
    torch.tpu.synchronize()
    assert host_copies.newest_pending() is None
    torch.testing.assert_close(dst, ref, rtol=1e-4, atol=1e-4)


def test_copies_land_in_order_and_a_later_synchronous_copy_wins():
    dst = _pinned(4)
    for k in range(5):
        dst.copy_(torch.full((4,), float(k), device="tpu"), non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(dst, torch.full((4,), 4.0))
    value, _ = _slow_value()
    dst.copy_(value.expand(4), non_blocking=True)  # pending...
    dst.copy_(torch.arange(4.0, device="tpu"))  # ...then a synchronous copy: it lands after the pending one
    assert torch.equal(dst, torch.arange(4.0))


def test_copy_into_unpinned_host_tensor_stays_synchronous():
    value, ref = _slow_value()
    dst = torch.zeros(())
    dst.copy_(value, non_blocking=True)
    torch.testing.assert_close(dst, ref, rtol=1e-4, atol=1e-4)  # no synchronize needed


def test_non_blocking_copy_casts_and_broadcasts_like_copy_():
    dst = _pinned(2, 3, dtype=torch.int64)
    dst.copy_(torch.tensor([1.7, -2.2, 3.0], device="tpu"), non_blocking=True)
    torch.tpu.synchronize()
    expected = torch.zeros(2, 3, dtype=torch.int64)
    expected.copy_(torch.tensor([1.7, -2.2, 3.0]))
    assert torch.equal(dst, expected)


def test_events_recorded_without_copies_and_never_recorded():
    torch.tpu.Event().synchronize()  # never recorded: nothing to wait for (as on CUDA)
    x = torch.ones(8, device="tpu") * 3
    event = torch.tpu.Event(blocking=True)
    event.record()
    event.synchronize()  # no copies behind it: waits for all work
    assert event.query()
    assert torch.equal(x.cpu(), torch.full((8,), 3.0))


def test_a_copy_back_to_tpu_waits_for_a_pending_copy_into_the_pinned_tensor():
    """Stream order, as on CUDA: D2H into a staging buffer, then H2D from it, sees the first copy's data."""
    value, ref = _slow_value()
    stage = _pinned(())
    stage.copy_(value, non_blocking=True)
    back = stage.to("tpu")
    into = torch.zeros((), device="tpu")
    into.copy_(stage, non_blocking=True)
    as_scalar = torch.ones((), device="tpu") * stage  # a 0-dim host tensor as an operand
    for got in (back, into, as_scalar):
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_event_query_true_means_the_data_is_there():
    value, ref = _slow_value()
    dst = _pinned(())
    dst.copy_(value, non_blocking=True)
    event = torch.tpu.Event()
    event.record()
    while not event.query():
        pass
    torch.testing.assert_close(dst, ref, rtol=1e-4, atol=1e-4)  # read without synchronize()

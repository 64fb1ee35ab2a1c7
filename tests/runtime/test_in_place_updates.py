"""In-place ops and writes through views update the device buffer in place (XLA donation) when nothing
else can see it, and never when something can: values always as on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_tpu.runtime.storage import REGISTRY


def _buffer(t: torch.Tensor) -> int:
    return REGISTRY.payload(t.untyped_storage().data_ptr()).array.unsafe_buffer_pointer()


@pytest.fixture(autouse=True)
def _no_unusable_donation():
    """XLA warns when a donated buffer cannot be reused: that would be a copy we claim not to make."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*[Dd]onat.*")
        yield


def _written(*shape, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    ref = torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape)
    x = ref.to("tpu")
    x.add_(0)  # a buffer computed on the device (a host transfer may alias host memory on CPU)
    return x, ref.clone()


def test_writes_through_views_keep_the_buffer():
    x, ref = _written(64, 32)
    before = _buffer(x)
    for i in range(5):
        x[i] = float(-i)
        ref[i] = float(-i)
        x[:, 3 + i] = torch.full((64,), 7.0 + i, device="tpu")
        ref[:, 3 + i] = 7.0 + i
    x.t()[2, 10:20] = 1.5  # strided
    ref.t()[2, 10:20] = 1.5
    assert _buffer(x) == before
    assert torch.equal(x.cpu(), ref)


def test_in_place_ops_on_a_whole_tensor_keep_the_buffer():
    cache, ref = _written(1, 4, 16, 8)
    before = _buffer(cache)
    for pos in (3, 7, 0):
        k = torch.randn(1, 4, 1, 8)
        cache.index_copy_(2, torch.tensor([pos], device="tpu"), k.to("tpu"))
        ref.index_copy_(2, torch.tensor([pos]), k)
    cache.mul_(0.5).add_(1.0).masked_fill_(cache.cpu().gt(3).to("tpu"), -1.0)
    ref.mul_(0.5).add_(1.0).masked_fill_(ref.gt(3), -1.0)
    assert _buffer(cache) == before
    assert torch.equal(cache.cpu(), ref)


def test_random_in_place_ops_keep_the_stream():
    """(Their result does not read the old values, so XLA drops the donated input: no buffer to keep.)"""
    x, _ = _written(256)
    torch.manual_seed(3)
    x.normal_()
    first = x.cpu()
    torch.manual_seed(3)
    x.normal_()
    assert torch.equal(x.cpu(), first)
    assert not torch.equal(first, torch.arange(256.0))


def test_optimizer_step_updates_parameters_in_place_and_matches_cpu():
    torch.manual_seed(0)
    w_cpu = torch.randn(32, 16, requires_grad=True)
    w_tpu = w_cpu.detach().to("tpu").requires_grad_()
    opts = [torch.optim.AdamW([w], lr=0.1, foreach=False) for w in (w_cpu, w_tpu)]
    before = None
    for _ in range(3):
        for w, opt in zip((w_cpu, w_tpu), opts):
            opt.zero_grad()
            (w.sin() * 2).sum().backward()
            opt.step()
        # from the second step on (the first may copy a buffer that aliases host memory it came from)
        assert before is None or _buffer(w_tpu) == before
        before = _buffer(w_tpu)
    torch.testing.assert_close(w_tpu.detach().cpu(), w_cpu.detach(), atol=1e-6, rtol=1e-5)


def test_an_array_shared_with_another_storage_is_not_overwritten():
    x, _ = _written(128)
    y = torch.empty(128, device="tpu")
    y.copy_(x)  # y's payload is x's array itself
    x.add_(1)
    x[0] = -5.0
    assert torch.equal(y.cpu(), torch.arange(128.0))
    assert x[0].item() == -5.0 and x[1].item() == 2.0


def test_an_argument_reading_the_same_storage_is_not_overwritten():
    x, ref = _written(10)
    x.add_(x.view(2, 5).t().reshape(-1))
    ref.add_(ref.view(2, 5).t().reshape(-1))
    assert torch.equal(x.cpu(), ref)


def test_host_copies_and_pending_async_copies_keep_their_values():
    x, ref = _written(1 << 12)
    host = x.cpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pinned = torch.zeros(1 << 12).pin_memory()
    pinned.copy_(x, non_blocking=True)
    x.mul_(3)
    x[0] = 42.0
    torch.tpu.synchronize()
    assert torch.equal(host, ref)
    assert torch.equal(pinned, ref)
    expected = ref * 3
    expected[0] = 42.0
    assert torch.equal(x.cpu(), expected)


def test_writes_through_a_reinterpreting_view():
    x, _ = _written(16)
    as_int = x.view(torch.int32)
    as_int[5] = 7
    expected = torch.arange(16.0)
    expected.view(torch.int32)[5] = 7
    assert torch.equal(x.cpu(), expected)


def test_a_pending_reader_sees_the_old_values():
    """XLA waits for computations still reading a donated buffer before reusing it."""
    x, ref = _written(1 << 20)
    before = _buffer(x)
    readers = [(x * 2).sum(), x[:5] + 1]
    x.index_copy_(0, torch.arange(1 << 10, device="tpu"), torch.full((1 << 10,), -1.0, device="tpu"))
    x[7] = 3.0
    assert _buffer(x) == before
    assert readers[0].item() == (ref * 2).sum().item()
    assert torch.equal(readers[1].cpu(), ref[:5] + 1)
    ref[: 1 << 10] = -1.0
    ref[7] = 3.0
    assert torch.equal(x.cpu(), ref)


def test_another_thread_reading_while_one_updates_in_place():
    """A second thread using tpu tensors turns donation off (it could take an array about to be donated)."""
    import threading

    from hf_tpu.runtime import tensor

    w, _ = _written(1 << 16)
    errors, reads, stop = [], [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                reads.append(float(w.detach().cpu()[0]))
            except Exception as exc:  # noqa: BLE001 - collected and asserted on
                errors.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(1000):
            w.add_(1)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert reads and all(0 <= r <= 1000 for r in reads)
    assert w[0].item() == 1000 and w[-1].item() == (1 << 16) - 1 + 1000
    assert tensor._one_device_thread()  # the reader has ended: forgotten, and updates are in place again
    before = _buffer(w)
    w.add_(1)
    assert _buffer(w) == before

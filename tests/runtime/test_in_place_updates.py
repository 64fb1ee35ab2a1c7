"""In-place ops and writes through views update the device buffer in place (XLA donation) when nothing
else can see it, and never when something can: values always as on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_tpu.runtime.buffers.storage import REGISTRY


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
    """A reader thread never gets an array that is being donated: it reads payloads under the donation
    lock, and the reference it holds meanwhile makes that update copy instead."""
    import threading

    from hf_tpu.runtime.buffers import threads

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
    assert threads._one_device_thread()  # the reader has ended: forgotten, and updates are in place again
    before = _buffer(w)
    w.add_(1)
    assert _buffer(w) == before


def _thread_reusing_the_ident_of(ended, target):
    """A started thread running `target` that CPython gave `ended`'s ident (it reuses the idents of
    ended threads, usually at once), or None after a few tries."""
    import threading

    for _ in range(50):
        go, chosen = threading.Event(), []

        def run(go=go, chosen=chosen):
            go.wait()
            if chosen:
                target()

        thread = threading.Thread(target=run)
        thread.start()
        if thread.ident == ended.ident:
            chosen.append(True)
        go.set()
        if chosen:
            return thread
        thread.join()
    return None


def test_a_thread_given_an_ended_device_threads_ident_is_not_a_device_thread():
    """A thread that never used tpu tensors (tqdm's monitor) but got the ident of one that did and
    ended must not count as a second device thread: that would keep generate from deferring and compiled
    executables from unloading for as long as it lives."""
    import threading

    from hf_tpu.runtime.buffers import threads

    x, _ = _written(1 << 12)
    worker = threading.Thread(target=lambda: (x + 1).cpu())
    worker.start()
    worker.join()
    release = threading.Event()
    idle = _thread_reusing_the_ident_of(worker, release.wait)
    if idle is None:
        release.set()
        pytest.skip("CPython gave no new thread the ended thread's ident")
    try:
        assert threads.one_device_thread()
    finally:
        release.set()
        idle.join()


def test_a_thread_given_an_ended_device_threads_ident_is_noted_when_it_uses_tpu():
    """The ended thread was the last to use tpu tensors; the new one with its ident must still be seen
    as a second device thread, so no buffer it reads is donated."""
    import threading

    from hf_tpu.runtime.buffers import threads

    x, ref = _written(1 << 12)
    worker = threading.Thread(target=lambda: (x + 1).cpu())
    worker.start()
    worker.join()
    release, read, reads, errors = threading.Event(), threading.Event(), [], []

    def reader():
        try:
            reads.append(x.cpu())
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(repr(exc))
        finally:
            read.set()
        release.wait()

    second = _thread_reusing_the_ident_of(worker, reader)
    if second is None:
        release.set()
        pytest.skip("CPython gave no new thread the ended thread's ident")
    try:
        assert read.wait(60) and errors == []
        assert not threads._one_device_thread()
        assert torch.equal(reads[0], ref)
    finally:
        release.set()
        second.join()


def test_a_worker_thread_updates_in_place_while_the_thread_that_made_the_tensor_lives():
    """Continuous batching decodes in a thread of its own while the thread that loaded the model waits:
    its cache writes must still update buffers in place (and match CPU), with concurrent readers too."""
    import threading

    x, ref = _written(1 << 12, 16)
    before = _buffer(x)
    pointers, errors, reads, stop = [], [], [], threading.Event()

    def decode():
        try:
            for i in range(200):
                x[i] = float(i)  # a cache slot write
                x.add_(1)
                pointers.append(_buffer(x))
        except Exception as exc:  # noqa: BLE001 - asserted on below
            errors.append(repr(exc))

    def read():
        while not stop.is_set():
            try:
                reads.append(float(x[5, 0].cpu()))
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))

    worker = threading.Thread(target=decode)
    worker.start()
    worker.join()
    assert errors == [] and set(pointers) == {before}

    reader, worker = threading.Thread(target=read), threading.Thread(target=decode)
    reader.start()
    worker.start()
    worker.join()
    stop.set()
    reader.join()
    assert errors == [] and reads
    for _ in range(2):
        for i in range(200):
            ref[i] = float(i)
            ref.add_(1)
    assert torch.equal(x.cpu(), ref)


@pytest.mark.parametrize(
    "write",
    [
        lambda m: m[:, :, :3, :5].fill_(-1.0),  # a box whose last row ends before the buffer's rows do
        lambda m: m[..., 2:6, 1:7].triu_(1),
        lambda m: m[0, 1, :, 7].fill_(2.0),  # a column
        lambda m: m[:, :, 1::2, ::3].mul_(3.0),
        lambda m: m.transpose(2, 3)[:, :, 4:9, 2:4].copy_(torch.ones(2, 5, 2, device=m.device)),
        lambda m: m.as_strided((2, 4), (24, 1), 21).fill_(5.0),  # rows that wrap: not a box of the grid
    ],
)
def test_box_writes_into_a_large_buffer_match_cpu_and_keep_the_buffer(write):
    """Writes through views that are rectangles of the buffer update it in place at the view's cost (one
    dynamic_update_slice): no copy of the buffer, no pass over the elements between the view's rows."""
    x, ref = _written(2, 2, 12, 24)
    before = _buffer(x)
    write(x)
    write(ref)
    assert torch.equal(x.cpu(), ref)
    assert _buffer(x) == before
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        write(x)
        write(ref)
    assert torch.equal(x.cpu(), ref)


def test_box_writes_cost_the_view_not_the_buffer():
    """The strided write's program touches only the view: XLA's cost analysis counts a few KB moved for
    an 800-element box of a 32 MB buffer (the segment-and-pad path moved all of it)."""
    import jax.numpy as jnp

    from hf_tpu.runtime.tensors import strided, tensor

    base_shape, view = (1, 1, 128, 1 << 16), torch.empty(1, 1, 128, 1 << 16, device="meta")[:, :, :8, :100]
    plan = strided.box_plan(tuple(view.shape), view.stride(), for_write=True)
    starts = strided.grid_starts(1 << 23, tuple(view.shape), view.stride(), 0, plan)
    put = tensor._write_grid(base_shape, tuple(view.shape), view.stride())
    donating = tensor._donating(put, 0)  # as write() runs it on a buffer only its storage holds
    compiled = donating.lower(jnp.zeros(base_shape), jnp.ones((1, 1, 8, 100)), starts).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["bytes accessed"] < 1 << 16, cost["bytes accessed"]


def test_a_reader_thread_threading_does_not_list_never_gets_a_donated_buffer():
    """Threads started by C code (or `_thread`) are not in threading.enumerate(); they still read payloads
    under the lock, so the main thread's donations never hand them a deleted buffer."""
    import _thread
    import sys
    import threading

    x, _ = _written(1 << 14)
    errors, stop, done = [], [False], threading.Event()

    def reader():
        try:
            while not stop[0]:
                (x * 2).sum().item()
        except Exception as exc:  # noqa: BLE001 - asserted on below
            errors.append(repr(exc))
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _thread.start_new_thread(reader, ())
        for _ in range(3000):
            x.add_(1)
    finally:
        stop[0] = True
        done.wait(30)
        sys.setswitchinterval(interval)
    assert errors == []
    assert x[0].item() == 3000


def test_threads_writing_one_tensor_lose_no_write():
    """Two threads writing their own rows of one tensor, and both incrementing it: every write lands, as
    with CPU tensors (each update reads, changes and stores the buffer as one step)."""
    import sys
    import threading

    n = 400
    buf = torch.zeros(2, n, device="tpu")
    counter = torch.zeros(4, device="tpu")

    def work(row):
        for i in range(n):
            buf[row, i] = float(i + 1)
            counter.add_(1)
            if i % 3 == 0:
                buf[1 - row].sum()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        sys.setswitchinterval(interval)
    assert torch.equal(buf.cpu(), torch.arange(1, n + 1, dtype=torch.float32).expand(2, n))
    assert counter.cpu().tolist() == [2.0 * n] * 4

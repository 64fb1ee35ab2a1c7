"""Several Python threads using tpu tensors at once (serving code): results equal CPU's, no update is
lost, nothing hangs (every join has a timeout)."""

import sys
import threading

import pytest
import torch

import hf_tpu  # noqa: F401

JOIN_S = 120


def _run_threads(target, n: int) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    [t.start() for t in threads]
    [t.join(JOIN_S) for t in threads]
    assert not any(t.is_alive() for t in threads), "a thread hung"


def test_threads_incrementing_a_shared_tensor_under_defer_and_fuse_lose_no_update():
    """Each thread's first in-place op must not compute from the buffer unlocked and store it after the
    other thread's updates (it decided on no lock before it was counted as a device thread)."""
    x = torch.zeros(4, device="tpu")
    n = 50
    barrier = threading.Barrier(2, timeout=JOIN_S)

    def work(_):
        barrier.wait()
        for _ in range(n):
            x.add_(1)

    with torch.tpu.eager_mode("defer_and_fuse"):
        _run_threads(work, 2)
        assert x.cpu().tolist() == [2.0 * n] * 4


@pytest.mark.parametrize("donate", ["1", "0"])
def test_threads_calling_a_compiled_module_that_updates_a_buffer_lose_no_update(donate, monkeypatch):
    """A compiled graph's input mutation (`self.count += 1`) is read and stored as one step with several
    threads, like eager in-place ops (it was read before the lock and written back by aot_autograd's
    `copy_` after it: two threads' calls from one old value counted once)."""

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, a):
            self.count += 1
            return a * 2

    monkeypatch.setenv("HF_TPU_DONATE", donate)
    module = Counter().to("tpu")
    compiled = torch.compile(module, backend="tpu")
    a = torch.ones(3, device="tpu")
    compiled(a)
    n = 50
    barrier = threading.Barrier(2, timeout=JOIN_S)

    def work(_):
        barrier.wait()
        for _ in range(n):
            compiled(a)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _run_threads(work, 2)
    finally:
        sys.setswitchinterval(interval)
    assert module.count.item() == 2 * n + 1
    assert compiled(a).cpu().tolist() == [2.0] * 3


@pytest.mark.parametrize("mode", ["defer_never", "defer_and_fuse"])
def test_threads_writing_a_shared_tensor_through_out_lose_no_update(mode):
    """`torch.add(x, 1, out=x)` reads and stores its destination as one step with several threads, as on
    CPU (the out= path took no lock: half the updates were lost)."""
    x = torch.zeros(4, device="tpu")
    n = 100
    barrier = threading.Barrier(2, timeout=JOIN_S)

    def work(_):
        barrier.wait()
        for _ in range(n):
            torch.add(x, 1, out=x)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with torch.tpu.eager_mode(mode):
            _run_threads(work, 2)
            assert x.cpu().tolist() == [2.0 * n] * 4
    finally:
        sys.setswitchinterval(interval)

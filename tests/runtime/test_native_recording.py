"""The C++ recorder (native/csrc/recorder.cpp, execution/native_recording.py): DeferAndFuse ops recorded
without Python give what the Python path gives, and whatever changes after an op was recorded (a
write, new tensor metadata, another dtype, data-dependent shapes) never changes what it computed.

Values are compared with CPU PyTorch; the counters show the ops really were recorded natively. Skipped on
the pure-Python path (`HF_TPU_NATIVE=0`), where the same ops take the Python kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_tpu.runtime.execution import native_recording

pytestmark = pytest.mark.skipif(not native_recording.ENABLED, reason="the C++ recorder is not in use")
ROOT = Path(__file__).resolve().parents[2]


def _hits() -> int:
    return native_recording.stats()["hits"]


def _block(x, y):
    return torch.tanh(torch.maximum(x * y, y.neg())) / torch.exp(y.abs()) * 0.5 + 1.0


def test_a_repeated_step_is_recorded_natively_and_matches_cpu(defer):
    xc, yc = torch.randn(8, 16), torch.randn(8, 16)
    x, y = xc.to("tpu"), yc.to("tpu")
    _block(x, y).cpu()  # the first time the Python kernels run and teach the recorder
    before = _hits()
    out = _block(x, y)
    for _ in range(20):
        out = _block(out, y)
    hits = _hits() - before
    assert hits >= 21 * 9, f"only {hits} ops recorded natively"
    expected = _block(xc, yc)
    for _ in range(20):
        expected = _block(expected, yc)
    torch.testing.assert_close(out.cpu(), expected)


def test_outputs_read_by_python_kernels_and_views_are_handed_over_first(defer):
    xc = torch.randn(6, 4)
    x = xc.to("tpu")
    (x * 2.0).cpu()
    y = x * 2.0  # recorded natively, no payload yet
    torch.testing.assert_close(y[1:3].t().contiguous().cpu(), (xc * 2.0)[1:3].t().contiguous())
    torch.testing.assert_close(y.sum(0).cpu(), (xc * 2.0).sum(0))
    torch.testing.assert_close(torch.cat([y, y]).cpu(), torch.cat([xc * 2.0, xc * 2.0]))


def test_a_write_after_a_recorded_read_does_not_change_what_it_read(defer):
    xc = torch.randn(5)
    x = xc.to("tpu")
    (x * 3.0).cpu()
    y = x * 3.0
    x.add_(100.0)
    x.copy_(torch.zeros(5))
    torch.testing.assert_close(y.cpu(), xc * 3.0)
    torch.testing.assert_close(x.cpu(), torch.zeros(5))


def test_new_metadata_after_the_op_changes_nothing_it_computed(defer):
    """`t.data = u` and `set_` give a recorded input another storage and shape; the op read the old."""
    xc = torch.randn(4)
    x = xc.to("tpu")
    (x + 1.0).cpu()
    y = x + 1.0
    x.data = torch.zeros(4, 4, device="tpu")
    z = x + 1.0
    w = torch.ones(3, device="tpu")
    v = w + 1.0
    w.set_(torch.full((2, 2), 7.0, device="tpu"))
    torch.testing.assert_close(y.cpu(), xc + 1.0)
    torch.testing.assert_close(z.cpu(), torch.ones(4, 4))
    torch.testing.assert_close(v.cpu(), torch.full((3,), 2.0))
    torch.testing.assert_close((w + 1.0).cpu(), torch.full((2, 2), 8.0))


def test_numbers_that_change_every_step_are_recorded_with_their_values(defer):
    """A kernel that has seen many values of a number traces it (dispatch.py): the recorder keys such an op
    by the number's type and passes each record's own value to the executable."""
    xc = torch.randn(8, 16)
    x = xc.to("tpu")
    for start in (0, 40):  # the first pass switches mul.Tensor/add.Tensor to traced numbers
        before = _hits()
        out, expected = x, xc
        for i in range(start, start + 40):
            out = out * (1.0 + i / 100) + i  # wrapped numbers: a float, then an int
            expected = expected * (1.0 + i / 100) + i
        torch.testing.assert_close(out.cpu(), expected)
    assert _hits() - before == 80
    ic = torch.arange(6)
    i = ic.to("tpu")
    (i + (1 << 40)).cpu()  # an int outside int32 is always an input of the executable
    before = _hits()
    outs = [i + ((1 << 40) + k) for k in range(3)]
    for k, out in enumerate(outs):
        torch.testing.assert_close(out.cpu(), ic + ((1 << 40) + k))
    assert _hits() - before == 3


def test_only_outputs_alive_after_the_hand_over_get_a_payload(defer):
    """An output read only by later ops of the same native trace is handed to them directly; it gets a
    payload only if a tensor still holds it once they are in."""
    xc = torch.randn(16)
    x = xc.to("tpu")
    (x + x).cpu()
    before = native_recording.stats()
    kept, y = [], x
    for i in range(200):
        y = y + x
        if i % 10 == 0:
            kept.append(y)
    native_recording.drain()
    after = native_recording.stats()
    assert after["hits"] - before["hits"] == 200
    assert after["adopted"] - before["adopted"] == 21  # the 20 kept and the last
    assert after["dropped"] - before["dropped"] == 179
    expected, yc = [], xc
    for i in range(200):
        yc = yc + xc
        if i % 10 == 0:
            expected.append(yc)
    for t, e in zip(kept, expected):
        torch.testing.assert_close(t.cpu(), e)
    torch.testing.assert_close(y.cpu(), yc)


def test_tensor_lists_are_recorded_natively(defer):
    ac, bc = torch.randn(4, 3), torch.randn(2, 3)
    a, b = ac.to("tpu"), bc.to("tpu")

    def step(a, b):
        return torch.cat([a * 2.0, b]), torch.stack([a, a.exp()], 1), torch.cat([a[1:3], b.t().t()], 1)

    [t.cpu() for t in step(a, b)]
    before = _hits()
    outs = [step(a, b) for _ in range(3)]
    assert _hits() - before == 3 * 5
    for got in outs:
        for g, e in zip(got, step(ac, bc)):
            torch.testing.assert_close(g.cpu(), e)
    cc = torch.randn(2, 3)  # another storage, same metadata: handed over with its own value
    torch.testing.assert_close(torch.cat([a[1:3], cc.to("tpu")], 1).cpu(), torch.cat([ac[1:3], cc], 1))


def test_value_dependent_result_types_are_keyed_by_the_value(defer):
    """The result dtype of `int + number` depends on the number's type: each is its own cache entry."""
    ic = torch.arange(6, dtype=torch.int64)
    i = ic.to("tpu")
    for _ in range(2):
        for number in (2, 2.5, True, -3):
            out = i + number
            ref = ic + number
            assert out.dtype == ref.dtype, number
            torch.testing.assert_close(out.cpu(), ref)
    f16 = torch.randn(4).half()
    for _ in range(2):
        torch.testing.assert_close((f16.to("tpu") * 1e5).cpu(), f16 * 1e5)


def test_data_dependent_shapes_are_never_recorded_with_a_stale_shape(defer):
    for _ in range(2):
        for n in (1, 3, 6):
            mc = torch.zeros(8, dtype=torch.bool)
            mc[:n] = True
            xc = torch.randn(8)
            x, m = xc.to("tpu"), mc.to("tpu")
            out = x[m] * 2.0
            assert out.shape == (n,)
            torch.testing.assert_close(out.cpu(), xc[mc] * 2.0)
            torch.testing.assert_close(torch.nonzero(m).cpu(), torch.nonzero(mc))


def test_backward_on_autograds_device_thread_matches_cpu(defer):
    wc = torch.randn(8, 8, requires_grad=True)
    xc = torch.randn(4, 8)
    w = wc.detach().to("tpu").requires_grad_()
    x = xc.to("tpu")
    for _ in range(3):
        w.grad = None
        loss = ((x @ w).tanh() * 0.5 + 1.0).pow(2).mean()
        loss.backward()
    wc.grad = None
    ((xc @ wc).tanh() * 0.5 + 1.0).pow(2).mean().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_forward_mode_transforms_record_what_they_compute(defer):
    from torch.func import hessian

    xc = torch.randn(4)
    x = xc.to("tpu")

    def loss(a):
        return (a**3 * a.cos()).sum()

    for _ in range(3):
        torch.testing.assert_close(hessian(loss)(x).cpu(), hessian(loss)(xc), rtol=1e-4, atol=1e-4)


_ERRORS = """
import torch, hf_tpu
from hf_tpu.runtime.execution import native_recording as nr

def errors():
    a, b = torch.randn(3, device="tpu"), torch.randn(4, device="tpu")
    ints = torch.arange(3, device="tpu")
    found = []
    for mode in ("defer_and_fuse", "defer_never"):
        with torch.tpu.eager_mode(mode):
            for _ in range(2):  # the second time, the C++ kernels have the ops' entries cached
                (a + a).cpu(), (ints + 1).cpu()
                for bad in (lambda: a + b, lambda: ints.add_(0.5), lambda: a.view(2, 2)):
                    try:
                        bad()
                    except Exception as exc:
                        found.append(f"{type(exc).__name__}: {exc}")
    return found
"""


def test_errors_are_the_python_paths_and_hf_tpu_native_record_0_turns_it_off():
    """The same error types and messages with and without the recorder; `HF_TPU_NATIVE_RECORD=0`
    registers the Python kernels directly (nothing recorded natively)."""
    scope: dict = {}
    exec(_ERRORS, scope)
    here = scope["errors"]()
    assert len(here) == 12, here
    code = _ERRORS + "import json; print(json.dumps([nr.ENABLED, nr.stats().get('hits', 0), errors()]))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_TPU_NATIVE_RECORD": "0"},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    enabled, hits, there = json.loads(done.stdout.strip().splitlines()[-1])
    assert (enabled, hits) == (False, 0)
    assert here == there


def test_an_op_replayed_through_its_python_kernel_teaches_nothing(defer):
    """Handing over a record whose input no longer reads as taught (here: a never-written storage) runs its
    Python kernel; that run must not be cached under the key of the op whose miss caused the hand-over."""
    e = torch.empty(4, device="tpu")
    _ = e + 1
    y = e + 1  # recorded natively; replayed through the Python kernel (no array behind `e`)
    a = y + 2  # a miss whose Python kernel reads y: the hand-over happens inside it
    torch.testing.assert_close(a.cpu(), torch.full((4,), 3.0))
    w = torch.ones(4, device="tpu")
    for _ in range(2):
        torch.testing.assert_close((w + 2).cpu(), torch.full((4,), 3.0))


def test_another_thread_waits_for_a_hand_over_in_progress(defer):
    """While one thread replays a long native trace, another thread's write to an input of a record not
    yet replayed, or its read of such a record's output, waits for the hand-over to finish."""
    import threading

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        for action in ("write", "read"):
            x = torch.ones(4, device="tpu")
            (x * 2).cpu()
            ys = [x * 2 for _ in range(1500)]
            go = threading.Event()
            seen = {}

            def other(action=action, x=x, ys=ys, go=go, seen=seen):
                go.wait()
                if action == "write":
                    x.copy_(torch.full((4,), 5.0))
                else:
                    seen["read"] = (ys[-1] - 1).cpu()

            t = threading.Thread(target=other)
            t.start()
            go.set()
            first = ys[0].cpu()
            t.join(timeout=120)
            assert not t.is_alive()
            torch.testing.assert_close(first, torch.full((4,), 2.0))
            torch.testing.assert_close(ys[-1].cpu(), torch.full((4,), 2.0))
            if action == "read":
                torch.testing.assert_close(seen["read"], torch.full((4,), 1.0))
    finally:
        sys.setswitchinterval(switch)


def test_a_list_output_of_one_tensor(defer):
    """`unbind` of a size-1 dim returns a one-tensor list (its spec a 1-tuple: no single output)."""
    x = torch.randn(1, 3, device="tpu")
    for _ in range(2):
        parts = torch.unbind_copy(x)
        assert len(parts) == 1
        torch.testing.assert_close(parts[0].cpu(), x.cpu()[0])


def _strict_ops(x, w, i):
    """Ops the Strict fast path runs: several outputs, permuted layouts, views at an offset (a traced
    offset in Strict), numbers, tensor lists, integer math."""
    mean, rstd = torch.ops.aten.native_layer_norm(x, [8], w, w * 0.5, 1e-5)[1:]
    y = x.t().contiguous() * 2.0 + x[1:3].sum()
    z = torch.cat([x[2:], x[:2]]) - x.mean(0, keepdim=True)
    return mean, rstd, y, z, torch.stack([x, x.exp()], 2).amax(1), (i * 3 + 1) // 2, x.permute(1, 0).tanh()


def test_strict_ops_run_from_cpp_and_match_cpu():
    """Strict (the default mode): an op the C++ kernel has an entry for runs the entry's executable from
    C++ and makes its outputs there; values, dtypes and layouts are CPU's."""
    xc, wc, ic = torch.randn(4, 8), torch.randn(8), torch.arange(12).reshape(3, 4)
    x, w, i = xc.to("tpu"), wc.to("tpu"), ic.to("tpu")
    _strict_ops(x, w, i)
    before = native_recording.stats()["strict"]
    for _ in range(3):
        got = _strict_ops(x, w, i)
    assert native_recording.stats()["strict"] - before >= 3 * 15
    for g, e in zip(got, _strict_ops(xc, wc, ic)):
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        torch.testing.assert_close(g.cpu(), e)


def test_debug_mode_and_other_threads_keep_their_guarantees():
    """Debug (launch blocking) runs every op through its Python kernel (value checks, blocking); with a
    second thread using tpu tensors the fast path reads payloads under the donation lock, and values
    stay right while that thread updates a tensor in place."""
    import threading

    x = torch.ones(4, device="tpu")
    (x + 1).cpu()
    before = native_recording.stats()["strict"]
    with torch.tpu.eager_mode("defer_never_and_launch_blocking"):
        for _ in range(3):
            torch.testing.assert_close((x + 1).cpu(), torch.full((4,), 2.0))
    assert native_recording.stats()["strict"] == before
    acc = torch.zeros(4, device="tpu")

    def bump():
        for _ in range(200):
            acc.add_(1.0)

    t = threading.Thread(target=bump)
    t.start()
    outs = [x + 1 for _ in range(200)]
    t.join(timeout=120)
    assert not t.is_alive()
    torch.testing.assert_close(acc.cpu(), torch.full((4,), 200.0))
    for o in outs:
        torch.testing.assert_close(o.cpu(), torch.full((4,), 2.0))


@pytest.mark.parametrize("mode", ["defer_never", "defer_and_fuse"])
def test_a_view_read_as_a_computed_value_is_never_taught_as_a_plain_read(mode):
    """A view of a never-written storage reads as zeros the kernel computes in the view's own shape; the
    C++ kernels must not take that for a plain read of the payload (a transpose would be lost once the
    storage is written)."""
    with torch.tpu.eager_mode(mode):
        base = torch.empty(2, 2, device="tpu")
        t = base.t()
        torch.testing.assert_close((t + 1).cpu(), torch.ones(2, 2))
        values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        base.copy_(values)
        for _ in range(2):
            torch.testing.assert_close((t + 1).cpu(), values.t() + 1)


def test_a_full_cache_starts_again_and_keeps_recording(defer):
    """An op seen at more argument layouts than its cache holds (512; a long process, a decode loop over
    growing lengths) keeps being recorded natively at its current ones."""
    for n in range(1, 530):
        torch.neg(torch.ones(n, device="tpu"))
    torch.tpu.flush()
    x = torch.ones(777, device="tpu")
    torch.neg(x).cpu()  # taught
    before = _hits()
    torch.testing.assert_close(torch.neg(x).cpu(), -torch.ones(777))
    assert _hits() - before == 1

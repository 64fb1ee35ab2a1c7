"""The C++ extension (hf_tpu.runtime.native): pinned host memory, tpu generators, generic events.

The native-path tests skip on the pure-Python path (`HF_TPU_NATIVE=0`, which `make test` also runs);
the path switch and the build itself are tested in subprocesses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.utils.data as data

from hf_tpu.runtime import native
from hf_tpu.runtime.native import artifact

ROOT = Path(__file__).resolve().parents[2]
needs_native = pytest.mark.skipif(not native.active(), reason="the C++ extension is not in use")


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
        cwd=ROOT,
    )


def test_the_extension_is_in_use_wherever_a_compiler_is():
    """`make install` builds it; a machine with a C++ compiler that ended up on the Python path would
    silently lose pinned memory, generators and events."""
    if os.environ.get("HF_TPU_NATIVE") == "0":
        assert not native.active()
    elif shutil.which("c++") or shutil.which("g++"):
        assert artifact.is_current(), "run `make install` (hf_tpu/runtime/native/build.py)"
        assert native.active()


# -- pinned host memory ----------------------------------------------------------------------------------
@needs_native
def test_pinned_allocations_are_pinned_and_freed():
    ext = native.load()
    before = ext.pinned_bytes()
    a = torch.empty(1000, pin_memory=True)
    assert a.is_pinned() and a.device.type == "cpu"
    assert ext.pinned_bytes() >= before + a.nbytes
    assert a[10:20].is_pinned() and a.view(10, 100).t().is_pinned()  # views of pinned memory are pinned
    assert not torch.empty(1000).is_pinned()
    del a
    assert ext.pinned_bytes() == before


@needs_native
def test_pin_memory_copies_into_pinned_memory():
    x = torch.arange(12.0).reshape(3, 4)
    y = x.pin_memory()
    assert y.is_pinned() and not x.is_pinned()
    assert torch.equal(y, x) and y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert y.pin_memory().untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # already pinned
    z = torch.zeros(3, pin_memory=True)
    z.add_(1)
    assert torch.equal(z, torch.ones(3))


@needs_native
def test_dataloader_pins_batches_and_they_reach_the_device():
    ds = data.TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8))
    loader = data.DataLoader(ds, batch_size=4, pin_memory=True)
    total = []
    for features, labels in loader:
        assert features.is_pinned() and labels.is_pinned()
        total.append((features.to("tpu", non_blocking=True) * 2).cpu())
    torch.testing.assert_close(torch.cat(total), torch.arange(16.0).reshape(8, 2) * 2)


@needs_native
def test_non_blocking_copy_into_pinned_memory_lands_by_synchronize():
    src = torch.randn(256, 256, device="tpu")
    expected = src.cpu()
    dst = torch.empty(256, 256, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    event = torch.Event(device="tpu")
    event.record()
    event.synchronize()
    assert torch.equal(dst, expected)
    dst2 = torch.empty(256, 256, pin_memory=True)
    dst2.copy_(src * 2, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(dst2, expected * 2)


@needs_native
def test_pinning_a_device_tensor_raises_pytorchs_error():
    with pytest.raises(RuntimeError, match="(?i)pin"):
        torch.ones(2, device="tpu").pin_memory()


# -- generators ------------------------------------------------------------------------------------------
@needs_native
def test_tpu_generator_is_a_real_device_generator():
    for spec in ("tpu", "tpu:0", torch.device("tpu")):
        g = torch.Generator(device=spec)
        assert g.device == torch.device("tpu", 0) and type(g) is torch._C.Generator
    with pytest.raises(ValueError, match="tpu:1 does not exist"):
        torch.Generator("tpu:1")


@needs_native
def test_seeded_tpu_generator_reproduces_and_leaves_the_default_stream_alone():
    torch.tpu.manual_seed(7)
    reference = torch.randn(5, device="tpu").cpu()
    torch.tpu.manual_seed(7)
    g = torch.Generator("tpu").manual_seed(3)
    a = torch.randn(1000, device="tpu", generator=g).cpu()
    b = torch.rand(4, device="tpu", generator=g).cpu()
    # the default stream did not move while g drew
    assert torch.equal(torch.randn(5, device="tpu").cpu(), reference)
    g.manual_seed(3)
    assert torch.equal(torch.randn(1000, device="tpu", generator=g).cpu(), a)
    assert torch.equal(torch.rand(4, device="tpu", generator=g).cpu(), b)
    assert abs(a.mean().item()) < 0.15 and 0.85 < a.std().item() < 1.15
    other = torch.randn(1000, device="tpu", generator=torch.Generator("tpu").manual_seed(4)).cpu()
    assert not torch.equal(other, a)


@needs_native
def test_generator_state_round_trips_and_clones():
    g = torch.Generator("tpu").manual_seed(11)
    torch.randn(3, device="tpu", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16 and g.get_offset() == 1
    first = torch.randn(8, device="tpu", generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.randn(8, device="tpu", generator=g).cpu(), first)
    h = torch.Generator("tpu")
    h.set_state(state)
    assert h.initial_seed() == 11 and torch.equal(torch.randn(8, device="tpu", generator=h).cpu(), first)
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(4, dtype=torch.uint8))


@needs_native
def test_in_place_random_ops_take_the_generator():
    g = torch.Generator("tpu").manual_seed(5)
    x = torch.empty(64, device="tpu").normal_(generator=g).cpu()
    y = torch.empty(64, device="tpu").uniform_(generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(torch.empty(64, device="tpu").normal_(generator=g).cpu(), x)
    assert torch.equal(torch.empty(64, device="tpu").uniform_(generator=g).cpu(), y)
    perm = torch.randperm(50, device="tpu", generator=g).cpu()
    assert torch.equal(perm.sort().values, torch.arange(50))


@needs_native
def test_defer_and_fuse_draws_what_strict_draws():
    def draw():
        g = torch.Generator("tpu").manual_seed(9)
        return (torch.randn(16, device="tpu", generator=g) + torch.rand(16, device="tpu", generator=g)).cpu()

    strict = draw()
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        deferred = draw()
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    assert torch.equal(strict, deferred)


@needs_native
def test_default_generator_is_the_device_prng():
    """torch.tpu's RNG functions, torch.manual_seed and tpu's default torch.Generator share one state."""
    (gen,) = torch.tpu.default_generators
    assert gen.device == torch.device("tpu", 0)
    torch.manual_seed(21)
    assert gen.initial_seed() == 21 and torch.tpu.initial_seed() == 21
    torch.randn(2, device="tpu")
    assert torch.equal(torch.tpu.get_rng_state(), gen.get_state())
    state = torch.tpu.get_rng_state()
    a = torch.randn(4, device="tpu").cpu()
    gen.set_state(state)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)
    with torch.random.fork_rng(device_type="tpu"):
        torch.randn(100, device="tpu")
    gen.set_state(state)
    torch.randn(4, device="tpu")
    assert torch.equal(torch.tpu.get_rng_state(), gen.get_state())


@needs_native
def test_threads_drawing_from_one_generator_never_share_an_offset():
    g = torch.Generator("tpu").manual_seed(1)
    ext = native.load()
    offsets: list[int] = []
    lock = threading.Lock()

    def work():
        got = [ext.draw(g, 2)[1] for _ in range(500)]
        with lock:
            offsets.extend(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(offsets) == list(range(0, 4000, 2))


@needs_native
def test_diffusers_randn_tensor_with_a_tpu_generator():
    from diffusers.utils.torch_utils import randn_tensor

    latents = randn_tensor(
        (2, 4, 8, 8), generator=torch.Generator("tpu").manual_seed(0), device=torch.device("tpu")
    )
    again = randn_tensor(
        (2, 4, 8, 8), generator=torch.Generator("tpu").manual_seed(0), device=torch.device("tpu")
    )
    assert latents.device.type == "tpu" and torch.equal(latents.cpu(), again.cpu())
    batch = [torch.Generator("tpu").manual_seed(0), torch.Generator("tpu").manual_seed(1)]
    per_item = randn_tensor((2, 4, 8, 8), generator=batch, device=torch.device("tpu"))
    torch.testing.assert_close(per_item[0].cpu(), latents[0].cpu())


# -- events and streams ----------------------------------------------------------------------------------
@needs_native
def test_generic_event_and_stream_on_tpu():
    start = torch.Event(device="tpu", enable_timing=True)
    end = torch.Event(device="tpu", enable_timing=True)
    start.record()
    y = torch.randn(512, 512, device="tpu") @ torch.randn(512, 512, device="tpu")
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) > 0
    plain = torch.Event(device="tpu")
    assert plain.query()  # never recorded: nothing to wait for
    plain.synchronize()
    plain.record()
    plain.wait()
    stream = torch.Stream(device="tpu")
    assert stream.device_type == torch._C._get_privateuse1_backend_name() or stream.device.type == "tpu"
    stream.synchronize()
    assert stream.query()
    assert torch.accelerator.current_stream().device.type == "tpu"
    torch.accelerator.synchronize()
    assert y.shape == (512, 512)


@needs_native
def test_elapsed_time_without_timing_says_so():
    a, b = torch.Event(device="tpu"), torch.Event(device="tpu")
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


# -- the path switch and the build ----------------------------------------------------------------------
def test_hf_tpu_native_0_keeps_the_python_path():
    done = _python(
        "import warnings; warnings.filterwarnings('error', message='.*C[+][+] extension');"
        "import torch;"
        "from hf_tpu.runtime import native;"
        "print(native.active(), torch.Generator('tpu').device, torch.empty(2).pin_memory().is_pinned())",
        HF_TPU_NATIVE="0",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "cpu", "False"]


@pytest.mark.skipif(not artifact.is_current(), reason="the extension is not built here")
def test_hf_tpu_native_1_requires_it_and_uses_it():
    done = _python(
        "import torch; from hf_tpu.runtime import native;"
        "print(native.active(), torch.Generator('tpu').device, torch.empty(2, pin_memory=True).is_pinned())",
        HF_TPU_NATIVE="1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "tpu:0", "True"]


def test_a_failed_build_says_so_and_keeps_the_library(tmp_path):
    before = artifact.library_path().read_bytes() if artifact.library_path().exists() else None
    build = ROOT / "hf_tpu" / "runtime" / "native" / "build.py"
    failing = tmp_path / "failing-cxx"
    failing.write_text("#!/bin/sh\necho 'error: no compiler here' >&2\nexit 1\n")
    failing.chmod(0o755)
    soft = subprocess.run(
        [sys.executable, str(build), "--force"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CXX": str(failing)},
    )
    assert soft.returncode == 0 and "pure-Python path" in soft.stderr and "no compiler here" in soft.stderr
    hard = subprocess.run(
        [sys.executable, str(build), "--force", "--require"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CXX": str(failing)},
    )
    assert hard.returncode == 1
    after = artifact.library_path().read_bytes() if artifact.library_path().exists() else None
    assert after == before  # a failed rebuild never replaces or deletes a working library

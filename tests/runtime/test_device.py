"""Registration, the torch.tpu module, torch.accelerator, import order, and the TorchTPU conflict."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


def test_import_torch_alone_registers_tpu():
    r = run_python(
        """
        import torch
        assert torch.accelerator.current_accelerator().type == "tpu"
        x = torch.ones(2, device="tpu")
        assert x.is_tpu and x.device == torch.device("tpu:0")
        assert (x + 1).cpu().tolist() == [2.0, 2.0]
        import hf_tpu, hf_tpu  # idempotent
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_import_hf_tpu_without_autoload():
    r = run_python(
        """
        import torch
        try:
            torch.device("tpu")
            raise SystemExit("tpu registered although autoload was disabled")
        except RuntimeError:
            pass
        import hf_tpu
        assert torch.ones(1, device="tpu").device.type == "tpu"
        print("ok")
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("first", ["transformers", "hf_tpu", "diffusers"])
def test_upstream_caches_whatever_the_import_order(first):
    r = run_python(
        f"""
        import {first}
        import transformers, diffusers, hf_tpu, torch
        from transformers.utils.import_utils import is_torch_tpu_available
        assert is_torch_tpu_available(), "transformers does not see tpu"
        from diffusers.pipelines.pipeline_utils import SUPPORTED_DEVICE_MAP
        assert "tpu" in SUPPORTED_DEVICE_MAP, SUPPORTED_DEVICE_MAP
        print("ok")
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0" if first != "hf_tpu" else "1",
    )
    assert r.returncode == 0, r.stderr


def test_torch_tpu_conflict_names_the_way_out():
    # A foreign backend already owns torch.tpu with no device: importing hf_tpu must say what to do.
    r = run_python(
        """
        import types, torch
        torch.utils.rename_privateuse1_backend("tpu")
        foreign = types.ModuleType("torch_tpu_fake")
        foreign.is_available = lambda: False
        foreign.device_count = lambda: 0
        torch._register_device_module("tpu", foreign)
        try:
            import hf_tpu
        except Exception as exc:
            print(type(exc).__name__, exc)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert "TorchTPUConflictError" in r.stdout, r.stdout + r.stderr
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in r.stdout


def test_unknown_platform_names_valid_ones():
    r = run_python("import torch; torch.ones(1, device='tpu')", HF_TPU_PLATFORM="quantum")
    assert r.returncode != 0
    assert "HF_TPU_PLATFORM='quantum'" in r.stderr and "tpu, gpu" in r.stderr


def test_torch_tpu_module_api():
    tpu = torch.tpu
    assert tpu.is_available()
    import jax

    assert tpu.device_count() == len(jax.devices()) == 1  # one device outside tests/multichip (conftest)
    assert tpu.current_device() == 0
    tpu.set_device(0)
    tpu.set_device("tpu:0")
    with pytest.raises(ValueError, match="tpu:3 does not exist"):
        tpu.set_device(3)
    torch.ones(1, device="tpu")
    assert tpu.is_initialized()
    tpu.synchronize()
    assert torch.bfloat16 in tpu.get_amp_supported_dtype()
    free, total = tpu.mem_get_info()
    assert 0 < free <= total
    s = tpu.Stream()
    assert tpu.current_stream() == s
    e1, e2 = tpu.Event(enable_timing=True), tpu.Event(enable_timing=True)
    e1.record()
    torch.ones(100, device="tpu").sum()
    e2.record()
    e2.synchronize()
    assert e1.elapsed_time(e2) >= 0
    assert isinstance(tpu.get_device_name(), str)


def test_torch_accelerator_api():
    acc = torch.accelerator
    assert acc.current_accelerator() == torch.device("tpu")
    assert acc.is_available()
    assert acc.device_count() >= 1
    x = torch.ones(1000, device="tpu") * 2
    acc.synchronize()
    acc.synchronize(0)
    assert acc.memory_allocated() >= 1000 * 4
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    acc.reset_peak_memory_stats()
    acc.empty_cache()
    del x


def test_rng_state_roundtrip_and_manual_seed():
    torch.manual_seed(123)
    state = torch.tpu.get_rng_state()
    a = torch.randn(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.randn(5, device="tpu").cpu()
    assert torch.equal(a, b)
    torch.manual_seed(123)
    assert torch.equal(torch.randn(5, device="tpu").cpu(), a)
    assert torch.tpu.initial_seed() == 123
    torch.tpu.seed()
    assert torch.tpu.initial_seed() != 123


def test_tensor_methods_generated():
    x = torch.ones(2).tpu()
    assert x.is_tpu
    m = torch.nn.Linear(2, 2).to("tpu")
    assert m.weight.device.type == "tpu"
    assert isinstance(m.weight, torch.nn.Parameter)
    m.cpu()
    assert m.weight.device.type == "cpu"


def test_mem_get_info_on_host_memory_is_bounded_by_what_the_host_has():
    """On JAX's CPU platform device memory is host RAM shared with everything else."""
    import psutil

    from hf_tpu.runtime.buffers import memory

    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    if memory.host_backed():
        assert free <= psutil.virtual_memory().available + (64 << 20)  # it may have grown since


def test_tensors_record_streams():
    x = torch.ones(3, device="tpu")
    x.record_stream(
        torch.Stream(device="tpu")
    )  # nothing to record: JAX keeps buffers alive while work reads them
    assert (x * 2).cpu().tolist() == [2.0] * 3


def test_tensors_record_torch_tpu_streams_as_on_cuda():
    """`t.record_stream(torch.cuda.current_stream())` is the CUDA idiom (diffusers' group offloading with
    `record_stream=True`); `torch.tpu.Stream` is no `torch.Stream`, which the C++ argument parser refused."""
    x = torch.ones(3, device="tpu")
    x.record_stream(torch.tpu.current_stream())
    x.data.record_stream(torch.tpu.Stream())
    assert (x * 2).cpu().tolist() == [2.0] * 3
    with pytest.raises(NotImplementedError, match="record_stream"):  # as CPU answers for a CPU tensor
        torch.ones(3).record_stream(torch.tpu.current_stream())


def test_torch_equal_on_tpu_matches_cpu():
    cases = [
        (torch.tensor([1, 2]), torch.tensor([1.0, 2.0])),
        (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")])),
        (torch.ones(2, 3), torch.ones(3, 2)),
        (torch.arange(6.0).reshape(2, 3).t(), torch.arange(6.0).reshape(2, 3).t().contiguous()),
        (torch.tensor([True, False]), torch.tensor([True, True])),
    ]
    for a, b in cases:
        assert torch.equal(a.to("tpu"), b.to("tpu")) == torch.equal(a, b), (a, b)


def test_cuda_style_memory_and_device_helpers():
    import torch.tpu as tpu

    props = tpu.get_device_properties()
    assert props.total_memory == tpu.mem_get_info()[1] and props.chip_count == tpu.device_count()
    x = torch.ones(1024, 256, device="tpu")
    summary = tpu.memory_summary()
    assert "Allocated memory" in summary and "Device capacity" in summary
    with tpu.device_of(x):
        assert tpu.current_device() == 0
    tpu.ipc_collect()
    tpu.reset_accumulated_memory_stats()
    assert tpu.max_memory_allocated() == tpu.memory_allocated()
    assert tpu.OutOfMemoryError is torch.OutOfMemoryError


def test_per_process_memory_fraction_caps_every_allocation():
    import torch.tpu as tpu

    big = torch.ones(1 << 20, device="tpu")  # 4 MB
    for _ in range(2):  # an op the C++ kernel runs itself from now on (native_recording.py)
        (big + big).cpu()
    limit = (torch.tpu.memory_allocated() + (1 << 20)) / torch.tpu.mem_get_info()[1]
    tpu.set_per_process_memory_fraction(limit)
    try:
        assert tpu.get_per_process_memory_fraction() == limit
        small = torch.ones(1024, device="tpu")  # 4 KB fits
        for make in (
            lambda: torch.empty(1 << 20, device="tpu"),  # 4 MB
            lambda: torch.ones(1 << 20).to("tpu"),
            lambda: small.repeat(1024),
            lambda: big + big,
        ):
            with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
                make()
        with pytest.raises(ValueError, match="fraction"):
            tpu.set_per_process_memory_fraction(1.5)
    finally:
        tpu.set_per_process_memory_fraction(1.0)
    assert torch.empty(1 << 20, device="tpu").numel() == 1 << 20

"""Bad input gets a clear error: missing lowerings, device mismatch, OOM, Debug mode, CPU fallback."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

# an op with a CPU kernel only (no lowering, no decomposition): exercises the missing-lowering path, and
# stays unlowered whatever the lowering table gains
_LIB_SOURCE = """
import torch
_lib = torch.library.Library("hf_tpu_test_errors", "DEF")
_lib.define("unlowered(Tensor x) -> Tensor")
_lib.impl("unlowered", lambda x: x.sin() + 1, "CPU")
"""
exec(_LIB_SOURCE)
UNLOWERED = "hf_tpu_test_errors::unlowered"


def test_missing_lowering_names_op_shapes_and_fallback():
    x = torch.full((3, 2), 0.5, device="tpu")
    with pytest.raises(NotImplementedError) as info:
        torch.ops.hf_tpu_test_errors.unlowered(x)
    msg = str(info.value)
    assert UNLOWERED in msg
    assert "[3, 2]" in msg and "float32" in msg
    assert "HF_TPU_CPU_FALLBACK=1" in msg


def test_cpu_fallback_runs_on_cpu_and_warns_once():
    code = (
        _LIB_SOURCE
        + """
import warnings
x = torch.rand(3, 2)
op = torch.ops.hf_tpu_test_errors.unlowered
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = op(x.to("tpu"))
    b = op(x.to("tpu"))
assert a.device.type == "tpu"
torch.testing.assert_close(a.cpu(), x.sin() + 1)
msgs = [str(i.message) for i in w if "unlowered" in str(i.message) and "no tpu lowering" in str(i.message)]
assert len(msgs) == 1, msgs
print("ok")
"""
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_TPU_CPU_FALLBACK": "1"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_mixing_devices_uses_pytorchs_message():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, 2, device="tpu") + torch.ones(2, 2)
    # a CPU 0-dim scalar tensor is allowed, as on CUDA
    out = torch.ones(2, device="tpu") * torch.tensor(3.0)
    assert out.cpu().tolist() == [3.0, 3.0]


def test_shape_errors_are_pytorchs_own():
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        torch.ones(2, 3, device="tpu") @ torch.ones(2, 3, device="tpu")


def test_out_of_memory_is_torch_oom_with_size():
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(1 << 45, dtype=torch.uint8, device="tpu")
    assert str(1 << 45) in str(info.value)


def test_debug_mode_blocks_and_names_op_and_user_frame():
    code = """
        import torch
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING)
        assert torch.tpu.get_eager_mode() == torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        x = torch.ones(4, device="tpu")
        y = (x * 2).sum()
        assert y.item() == 8.0
        from hf_tpu.runtime.execution import dispatch
        from hf_tpu.runtime.lowerings.table import TABLE, Lowering, resolve
        def broken(x):
            raise ValueError("boom inside the lowering")
        k = dispatch.OpKernel(resolve("aten::exp"), Lowering(broken))
        try:
            k(x)
        except RuntimeError as exc:
            print("ERR", exc)
    """
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "aten.exp" in r.stdout and "Tensor[4]:float32" in r.stdout
    assert "<string>" in r.stdout and "boom inside the lowering" in r.stdout


def test_launch_blocking_env_selects_debug_mode():
    r = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.tpu.get_eager_mode().name)"],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_TPU_LAUNCH_BLOCKING": "1"},
        timeout=300,
    )
    assert r.stdout.strip() == "DEFER_NEVER_AND_LAUNCH_BLOCKING", r.stderr


def test_unsupported_dtype_is_clear():
    with pytest.raises(TypeError, match="not supported on the tpu device"):
        torch.empty(2, dtype=torch.complex32, device="tpu")


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(1, device="tpu:1"),
        lambda: torch.empty(2, 2, device="tpu:2"),
        lambda: torch.ones(1).to("tpu:1"),
        lambda: torch.tensor([1.0], device="tpu:1"),
    ],
)
def test_a_device_index_other_than_0_is_refused(make):
    """Like CUDA's "invalid device ordinal": tpu:0 is the one logical device (it spans the chips)."""
    with pytest.raises(ValueError, match=r"tpu:\d does not exist.*Use 'tpu' or 'tpu:0'"):
        make()


def test_cpu_fallback_copies_back_written_tensor_lists():
    """A fallback op that writes a list argument (`_foreach_*_`, AMP's unscale) updates the tpu tensors."""
    from hf_tpu.runtime.execution import fallback

    xs = [torch.ones(3, device="tpu"), torch.full((2,), 2.0, device="tpu")]
    fallback.cpu_fallback(torch.ops.aten._foreach_mul_.Scalar, (xs, 3.0), {})
    assert xs[0].cpu().tolist() == [3.0] * 3 and xs[1].cpu().tolist() == [6.0] * 2

"""The tensor API a PyTorch user expects of an accelerator, compared with CPU: storages, serialization,
torch.accelerator."""

from __future__ import annotations

import io

import pytest
import torch


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def _bytes(t: torch.Tensor) -> list[int]:
    return t.detach().cpu().contiguous().view(torch.uint8).flatten().tolist()


def test_accelerator_reset_accumulated_memory_stats_and_capability():
    # both reached torch's C++ allocator / hooks: an INTERNAL ASSERT and "Backend doesn't support ..."
    torch.accelerator.reset_accumulated_memory_stats()
    torch.accelerator.memory.reset_accumulated_memory_stats()
    cap = torch.accelerator.get_device_capability()
    assert torch.float32 in cap["supported_dtypes"] and torch.bfloat16 in cap["supported_dtypes"]
    assert torch.accelerator.get_device_capability("tpu:0")["supported_dtypes"] == cap["supported_dtypes"]
    assert torch.tpu.get_device_capability()["chips"] == torch.tpu.device_count()


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.int16,
        torch.bfloat16,
        torch.uint8,
        torch.complex64,
    ],
)
def test_storage_byteswap_matches_cpu(dtype):
    # UntypedStorage.byteswap dereferenced the storage's fake pointer on the host: SIGSEGV
    cpu = (torch.arange(6) * 1000 + 7).to(dtype)
    tpu = cpu.to("tpu")
    cpu.untyped_storage().byteswap(dtype)
    tpu.untyped_storage().byteswap(dtype)
    assert _bytes(tpu) == _bytes(cpu)
    view = torch.arange(4.0, device="tpu")[1:3]  # the whole storage is swapped, as on CPU
    view.untyped_storage().byteswap(torch.float32)
    expect = torch.arange(4.0)
    expect.untyped_storage().byteswap(torch.float32)
    assert _bytes(view._base if view._base is not None else view) == _bytes(expect)


def test_storage_byteswap_rejects_a_ragged_storage():
    with pytest.raises(RuntimeError, match="not a multiple"):
        torch.ones(3, dtype=torch.uint8, device="tpu").untyped_storage()._byteswap(2)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("saved_on", ["cpu", "tpu"])
def test_load_complex_keeps_infinite_parts(dtype, saved_on):
    # bytes -> complex went through `re + 1j * im`: an infinite imaginary part made the real part NaN.
    # (Subnormal parts are not compared: XLA's CPU threads flush them to zero, and TPUs always do.)
    x = torch.tensor([complex(1, float("inf")), complex(1e-30, 2), complex(float("-inf"), -0.0)], dtype=dtype)
    loaded = _roundtrip(x.to(saved_on), map_location="tpu")
    assert loaded.device.type == "tpu"
    assert _bytes(loaded) == _bytes(x)


def test_write_through_a_real_view_of_a_complex_tensor():
    for device in ("cpu", "tpu"):
        z = torch.tensor([1 + 1j, 2 + 2j], dtype=torch.complex64, device=device)
        z.imag.copy_(torch.tensor([float("inf"), 3.0]))
        torch.view_as_real(z)[1, 0] = 1e-30
        if device == "cpu":
            expect = z
    assert _bytes(z) == _bytes(expect)


def test_from_dlpack_of_a_tpu_tensor():
    # Tensor.__dlpack_device__ raised "Unknown device type tpu for Dlpack" (it only knew "privateuse1")
    import numpy as np

    x = torch.arange(4.0, device="tpu")
    alias = torch.from_dlpack(x)
    assert alias.device == x.device
    alias[0] = 7.0  # shares memory, as on CUDA
    assert x.tolist() == [7.0, 1.0, 2.0, 3.0]
    assert torch.from_dlpack(torch.utils.dlpack.to_dlpack(x)).tolist() == x.tolist()
    on_host = torch.from_dlpack(x, device="cpu")
    assert on_host.device.type == "cpu" and on_host.tolist() == x.tolist()
    assert np.from_dlpack(x, device="cpu").tolist() == x.tolist()
    assert torch.from_dlpack(torch.nn.Parameter(x, requires_grad=False)).device == x.device
    with pytest.raises(BufferError, match="require gradient"):
        x.clone().requires_grad_().__dlpack__()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: torch.eye(3).to_sparse().to("tpu"), "sparse COO tensors .*to_dense"),
        (
            lambda: torch.sparse_coo_tensor(
                torch.tensor([[0], [0]]), torch.tensor([1.0]), (2, 2), device="tpu"
            ),
            "sparse COO tensors",
        ),
        (
            lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8).to("tpu"),
            "quantized tensors .*dequantize",
        ),
        (
            lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]).to("tpu"),
            "nested tensors with layout=torch.strided .*layout=torch.jagged",
        ),
    ],
)
def test_unsupported_layouts_say_what_to_do(make, match):
    # was: "Could not run 'aten::...' with arguments from the 'Sparsetpu' backend ... custom build"
    with pytest.raises(NotImplementedError, match=f"hf_tpu: {match}"):
        make()


def test_jagged_nested_tensors_still_work():
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged, device="tpu")
    assert nt.cos().values().cpu().tolist() == pytest.approx([0.5403023] * 5)


def test_storage_resize_works_as_on_cpu():
    # was: "You should register `PrivateUse1HooksInterface` ... implement `resizePrivateUse1Bytes`"; then a
    # refusal; now it resizes (FSDP2 frees and re-allocates parameter storages this way)
    x = torch.arange(4.0, device="tpu")
    assert x.untyped_storage().resize_(16).nbytes() == 16  # same size: nothing to do
    s = x.untyped_storage()
    s.resize_(0)
    assert s.nbytes() == 0 and x.untyped_storage().nbytes() == 0
    y = torch.arange(4.0, device="tpu")
    y.storage().resize_(8)
    assert y.untyped_storage().nbytes() == 32
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0]  # the first bytes are kept when growing
    assert torch.arange(4.0, device="tpu").resize_(10).shape == (10,)  # the tensor-level resize


def _both(fn):
    return fn("cpu"), fn("tpu")


def test_real_negative_views_read_negated():
    cpu, tpu = _both(lambda d: torch.tensor([1 + 2j, 3 - 4j], device=d).conj().imag)
    assert tpu.is_neg() and tpu.tolist() == cpu.tolist() == [-2.0, 4.0]
    cpu, tpu = _both(lambda d: torch._neg_view(torch.tensor([1.0, 2.0], device=d)) * 2)
    assert tpu.tolist() == cpu.tolist()


@pytest.mark.parametrize(
    "update",
    [
        lambda z: z.conj().copy_(torch.tensor([5 + 6j, 7 + 8j], device=z.device)),
        lambda z: z.conj().mul_(2),
        lambda z: z.conj().__setitem__(0, 9 + 9j),
        lambda z: torch._neg_view(z).add_(1),
        lambda z: z.conj().imag.add_(1),
    ],
)
def test_writes_through_conjugate_and_negative_views(update):
    def run(device):
        z = torch.tensor([1 + 2j, 3 - 4j], device=device)
        update(z)
        return z.tolist()

    cpu, tpu = _both(run)
    assert tpu == cpu

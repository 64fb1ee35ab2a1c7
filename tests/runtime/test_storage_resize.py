"""`UntypedStorage.resize_` on tpu, against CPU: FSDP2 frees an unsharded parameter's storage with
`resize_(0)` and reallocates it with `resize_(n)` before all-gathering into it, through views made before.

Both routes are covered: torch's Python `resize_` (routed by hf_tpu's storage patch) and, with the C++
extension, torch's C++ storage method reaching `resizePrivateUse1Bytes`.
"""

from __future__ import annotations

import functools

import pytest
import torch

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers.storage import REGISTRY

_c_resize = torch._C.StorageBase.resize_  # torch's own method: on tpu, the C++ hook


def _routes():
    routes = [pytest.param(lambda s, n: s.resize_(n), id="python")]
    routes.append(
        pytest.param(
            _c_resize,
            id="cxx-hook",
            marks=pytest.mark.skipif(not native.active(), reason="the C++ extension is not in use"),
        )
    )
    return routes


ROUTES = _routes()


def _both(fn):
    return fn("cpu"), fn("tpu")


def _bytes(storage: torch.UntypedStorage) -> list[int]:
    return list(storage.cpu()) if storage.nbytes() else []


@pytest.mark.parametrize("resize", ROUTES)
def test_resize_to_zero_frees_and_keeps_the_tensor(resize):
    for device in ("cpu", "tpu"):
        x = torch.arange(12.0, device=device).reshape(3, 4)
        view = x[1]
        storage = x.untyped_storage()
        assert resize(storage, 0) is storage
        assert storage.nbytes() == 0 and x.untyped_storage().nbytes() == 0
        assert view.untyped_storage().nbytes() == 0
        assert x.shape == (3, 4) and view.shape == (4,) and view.storage_offset() == 4


@pytest.mark.parametrize("resize", ROUTES)
def test_regrow_then_write_through_a_view_made_before(resize):
    """FSDP2's unsharded parameter is a view of the all-gather output made once; after free and
    reallocation, the copy-out writes the output through another view and the parameter must see it."""

    def run(device):
        out = torch.zeros(8, device=device)
        param = torch.as_strided(out, (2, 4), (4, 1), 0)
        storage = out.untyped_storage()
        resize(storage, 0)
        resize(storage, 32)
        out.view(2, -1).copy_(torch.arange(8.0).reshape(2, 4).to(device))
        return param.clone().cpu(), out.cpu()

    (cpu_param, cpu_out), (tpu_param, tpu_out) = _both(run)
    torch.testing.assert_close(tpu_param, cpu_param)
    torch.testing.assert_close(tpu_out, cpu_out)
    torch.testing.assert_close(tpu_param, torch.arange(8.0).reshape(2, 4))


def _resized(resize, src: torch.Tensor, sizes: list[int], device: str) -> torch.UntypedStorage:
    storage = src.clone().to(device).untyped_storage()
    for n in sizes:
        resize(storage, n)
    return storage


@pytest.mark.parametrize("resize", ROUTES)
def test_growing_and_shrinking_keep_the_leading_bytes(resize):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        src = (torch.randn(3, 4) * 5).to(dtype)
        nbytes = src.numel() * dtype.itemsize

        for sizes in ([nbytes * 2], [nbytes // 2], [nbytes // 2, nbytes], [nbytes - 3], [nbytes + 5]):
            cpu, tpu = _both(functools.partial(_resized, resize, src, sizes))
            keep = min([nbytes, *sizes])  # the bytes every step kept; beyond them torch's are uninitialized
            assert tpu.nbytes() == cpu.nbytes() == sizes[-1]
            assert _bytes(tpu)[:keep] == _bytes(cpu)[:keep], (dtype, sizes)


@pytest.mark.parametrize("resize", ROUTES)
def test_a_resized_storage_reads_through_tensors_of_any_shape(resize):
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    storage = x.untyped_storage()
    resize(storage, 96)  # 24 floats: the first 12 kept
    y = torch.empty(0, device="tpu").set_(storage, 0, (4, 6), (6, 1))
    assert y[:2].reshape(-1).tolist() == list(range(12))
    assert x.tolist() == torch.arange(12.0).reshape(3, 4).tolist()  # x still reads its elements
    x.mul_(2)
    assert y.reshape(-1)[:12].tolist() == [2.0 * i for i in range(12)]
    resize(storage, 10)  # not a whole number of floats: the payload becomes bytes
    b = torch.empty(0, dtype=torch.uint8, device="tpu").set_(storage, 0, (10,), (1,))
    assert b.tolist() == list(torch.tensor([0.0, 2.0, 4.0]).view(torch.uint8)[:10].tolist())
    z = torch.empty(0, device="tpu").set_(storage, 0, (2,), (1,))
    assert z.tolist() == [0.0, 2.0]


@pytest.mark.parametrize("resize", ROUTES)
def test_data_pointers(resize):
    """PyTorch reallocates on resize (CPU: a new address, null when freed); it guarantees no address
    stability. On tpu each size change gives a fresh fake pointer (unique: tied-weight detection compares
    them), never null; a resize to the same size changes nothing."""
    cpu = torch.ones(4).untyped_storage()
    resize(cpu, 0)
    assert cpu.data_ptr() == 0  # what CPU does (not promised for tpu)

    x = torch.ones(4, device="tpu")
    other = torch.ones(4, device="tpu")
    storage = x.untyped_storage()
    seen = {storage.data_ptr(), other.untyped_storage().data_ptr()}
    resize(storage, 16)
    assert storage.data_ptr() in seen
    for n in (0, 32, 8, 0, 64):
        resize(storage, n)
        ptr = storage.data_ptr()
        assert ptr != 0 and ptr not in seen and x.untyped_storage().data_ptr() == ptr
        seen.add(ptr)
    assert other.tolist() == [1.0] * 4


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_typed_storage_resize_counts_elements():
    for device in ("cpu", "tpu"):
        x = torch.arange(6.0, device=device)
        x.storage().resize_(3)
        assert x.untyped_storage().nbytes() == 12
        assert torch.empty(0, device=device).set_(x.untyped_storage(), 0, (3,), (1,)).tolist() == [
            0.0,
            1.0,
            2.0,
        ]


def test_freed_bytes_leave_memory_allocated():
    x = torch.randn(256, 1024, device="tpu") + 1  # a computed buffer, counted
    before = torch.tpu.memory_allocated()
    x.untyped_storage().resize_(0)
    assert torch.tpu.memory_allocated() == before - (1 << 20)
    x.untyped_storage().resize_(1 << 20)
    x.fill_(1.0)
    assert torch.tpu.memory_allocated() == before
    assert x.sum().item() == 256 * 1024


def test_resize_a_pending_value(defer):
    x = torch.arange(8.0, device="tpu") * 3  # pending under DeferAndFuse
    storage = x.untyped_storage()
    storage.resize_(64)
    y = torch.empty(0, device="tpu").set_(storage, 0, (16,), (1,))
    assert y[:8].tolist() == [3.0 * i for i in range(8)]
    storage.resize_(0)
    storage.resize_(32)
    x.copy_(torch.ones(8))
    assert x.tolist() == [1.0] * 8


def test_live_storage_count_is_unchanged_by_resizing():
    x = torch.ones(16, device="tpu")
    live = REGISTRY.live_count()
    for n in (0, 64, 0, 128, 64):
        x.untyped_storage().resize_(n)
    assert REGISTRY.live_count() == live
    del x
    assert REGISTRY.live_count() == live - 1


def test_negative_size_is_refused():
    with pytest.raises(RuntimeError):
        torch.ones(2, device="tpu").untyped_storage().resize_(-1)


@pytest.mark.skipif(not native.active(), reason="the C++ extension is not in use")
def test_inductor_resize_op_reaches_the_hook():
    """`torch.ops.inductor.resize_storage_bytes_` (FSDP2's resize once traced by torch.compile) resizes
    in C++ (the pure-Python path has no hook for it)."""
    x = torch.arange(4.0, device="tpu")
    view = x[2:]
    torch.ops.inductor.resize_storage_bytes_(x, 0)
    assert x.untyped_storage().nbytes() == 0
    torch.ops.inductor.resize_storage_bytes_(x, 16)
    view.copy_(torch.tensor([5.0, 6.0]))
    assert x.tolist() == [0.0, 0.0, 5.0, 6.0]

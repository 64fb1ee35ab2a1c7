"""Tensors with PyTorch semantics: views alias, writes go through views, storages, lifetime, threads."""

import gc
import threading

import pytest
import torch

from hf_tpu.runtime.buffers.storage import REGISTRY


def tpu(x):
    return x.to("tpu")


def test_write_through_index_and_view():
    x = torch.arange(12.0).reshape(3, 4)
    t = tpu(x)
    t[0] = 1
    x[0] = 1
    t.view(-1)[3] = 2
    x.view(-1)[3] = 2
    t.t().mul_(2)
    x.t().mul_(2)
    torch.testing.assert_close(t.cpu(), x)


def test_views_share_storage_with_correct_layout():
    t = tpu(torch.arange(24.0).reshape(2, 3, 4))
    v = t.permute(2, 0, 1)
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert v.stride() == (1, 12, 4)
    s = t[1, :, 1:3]
    assert s.storage_offset() == 13
    torch.testing.assert_close(s.cpu(), torch.arange(24.0).reshape(2, 3, 4)[1, :, 1:3])
    s.fill_(-1)
    assert (t.cpu()[1, :, 1:3] == -1).all()
    assert t.cpu()[1, :, 0].tolist() == [12.0, 16.0, 20.0]


def test_out_variants_and_set_():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(3, 4, device="tpu")
    torch.add(tpu(a), tpu(b), out=out)
    torch.testing.assert_close(out.cpu(), a + b)
    # out= with a view as destination
    big = torch.zeros(6, 4, device="tpu")
    torch.mul(tpu(a), 2, out=big[3:])
    torch.testing.assert_close(big.cpu()[3:], a * 2)
    assert (big.cpu()[:3] == 0).all()
    # set_ makes two tensors share a storage
    y = torch.empty(0, device="tpu")
    y.set_(big.untyped_storage(), 4, (2, 2), (4, 1))
    y.add_(1)
    assert big.cpu()[1, :2].tolist() == [1.0, 1.0]


def test_index_copy_and_index_put_alias_a_static_cache():
    cache = torch.zeros(1, 2, 8, 4, device="tpu")
    key_view = cache[0]  # a view, like StaticCache.layers[i].keys
    new = torch.randn(1, 2, 3, 4)
    pos = torch.tensor([2, 3, 4])
    cache.index_copy_(2, tpu(pos), tpu(new))
    ref = torch.zeros(1, 2, 8, 4)
    ref.index_copy_(2, pos, new)
    torch.testing.assert_close(cache.cpu(), ref)
    torch.testing.assert_close(key_view.cpu(), ref[0])
    cache[0, :, tpu(torch.tensor([0]))] = 5.0
    ref[0, :, torch.tensor([0])] = 5.0
    torch.testing.assert_close(cache.cpu(), ref)


def test_parameter_is_real_and_data_ptrs_unique():
    w = torch.nn.Parameter(torch.randn(3, 3, device="tpu"))
    assert type(w) is torch.nn.Parameter
    assert w.device.type == "tpu" and w.requires_grad
    tensors = [torch.empty(10, device="tpu") for _ in range(20)]
    ptrs = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(ptrs) == 20
    # tied weights are detected through the storage pointer (save_pretrained relies on it)
    emb = torch.nn.Embedding(10, 4).to("tpu")
    head = torch.nn.Linear(4, 10, bias=False).to("tpu")
    head.weight = emb.weight
    assert head.weight.untyped_storage().data_ptr() == emb.weight.untyped_storage().data_ptr()


def test_empty_allocates_nothing_until_written():
    before = torch.tpu.memory_allocated()
    t = torch.empty(1 << 28, dtype=torch.float16, device="tpu")  # 512 MiB, never written
    assert torch.tpu.memory_allocated() == before
    t[:10].fill_(1.0)
    assert torch.tpu.memory_allocated() >= before + t.nbytes
    del t
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == before


def test_no_growth_over_a_long_loop():
    w = torch.randn(32, 32, device="tpu")
    x = torch.randn(8, 32, device="tpu")
    torch.tpu.empty_cache()
    start_live = REGISTRY.live_count()
    start_bytes = torch.tpu.memory_allocated()
    for _ in range(1000):
        x = torch.tanh(x @ w) + 0.0
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    assert REGISTRY.live_count() <= start_live + 2
    assert torch.tpu.memory_allocated() <= start_bytes + 2 * x.nbytes


def test_dead_buffers_are_dropped_as_the_loop_runs():
    """Without anyone calling empty_cache: the payloads of dead storages are swept every few hundred
    allocations, so their buffers do not pile up (nor linger into the cyclic GC's oldest generation,
    whose full collections then took ~180 ms each and a third of a long loop's time)."""
    w = torch.randn(32, 32, device="tpu")
    x = torch.randn(8, 32, device="tpu")
    gc.collect()  # storages only garbage cycles hold are dead, not live
    REGISTRY.sweep()
    live = len(REGISTRY._payloads)  # what earlier tests keep alive (Dynamo's caches hold compiled models)
    most = 0
    for _ in range(3000):
        x = torch.tanh(x @ w) + 0.0
        most = max(most, len(REGISTRY._payloads))
    # the policy (storage.py): a sweep once the allocations since the last one pass 256 and the payloads
    # it left live, so dead payloads stay under max(256, live) plus one iteration's outputs
    assert most - live <= max(256, live) + 32, (most, live)


def test_host_device_roundtrip_dtypes():
    for dtype in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.float64,
    ):
        x = (torch.randn(3, 5) * 10).to(dtype)
        t = x.to("tpu")
        assert t.dtype == dtype
        assert torch.equal(t.cpu(), x), dtype
    assert torch.tensor([1.5, 2.5], device="tpu").tolist() == [1.5, 2.5]
    assert torch.tensor(3, device="tpu").item() == 3
    assert torch.tensor([1, 2], device="tpu").to(torch.float32).dtype == torch.float32
    x = torch.randn(4, 4)
    assert torch.equal(x.to("tpu", non_blocking=True).cpu(), x)


def test_float64_keeps_full_precision_on_cpu_platform():
    x = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
    t = x.to("tpu")
    assert (t - 1.0).item() == pytest.approx(1e-12, rel=1e-3)


def test_strided_and_reinterpreted_views_read_and_write():
    x = torch.randn(4, 6)
    t = tpu(x)
    torch.testing.assert_close(t[:, ::2].cpu(), x[:, ::2])
    t[:, ::2] = 0
    x[:, ::2] = 0
    torch.testing.assert_close(t.cpu(), x)
    bits = t.view(torch.int32)
    torch.testing.assert_close(bits.cpu(), x.view(torch.int32))


def test_concurrent_copies_from_8_threads():
    arrays = [torch.randn(64, 64) + i for i in range(64)]
    results: dict = {}
    errors: list = []

    def worker(k):
        try:
            for i in range(k, 64, 8):
                t = arrays[i].to("tpu").to(torch.bfloat16)
                results[i] = t
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for i, t in results.items():
        assert torch.equal(t.cpu(), arrays[i].to(torch.bfloat16))
    assert len({t.untyped_storage().data_ptr() for t in results.values()}) == 64


def test_printing_shows_values_and_device():
    t = torch.tensor([1.0, 2.0], device="tpu")
    assert "device='tpu:0'" in repr(t) and "1." in repr(t)


def test_host_copy_does_not_alias_the_cpu_tensor():
    # JAX's CPU platform may alias numpy buffers in device_put; a later CPU write must not leak through
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    x.mul_(2)
    assert t.cpu()[1].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_conjugate_views_of_complex_tensors():
    z = torch.randn(3, dtype=torch.complex64)
    t = z.to("tpu")
    torch.testing.assert_close(t.conj().cpu(), z.conj())
    torch.testing.assert_close((t.conj() * 2).cpu(), z.conj() * 2)


def _writes_through_complex_views(dev):
    x = torch.arange(8, dtype=torch.float32).to(dev) * 1.5
    x.view(torch.complex64).mul_(torch.tensor(1j, device=dev))  # a complex view of float storage
    c = torch.view_as_complex(x.view(4, 2))
    c[1] = 5 + 7j
    torch.view_as_real(c)[2, 0] = -1
    return x


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_writes_through_complex_views_of_real_storage(mode):
    """Writing complex values into float storage bitcasts their (real, imag) pairs: XLA bitcasts no
    complex type."""
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    try:
        assert torch.equal(_writes_through_complex_views("tpu").cpu(), _writes_through_complex_views("cpu"))
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def test_inplace_result_type_is_checked():
    a = torch.ones(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        a.mul_(1.5)


def test_real_and_imag_views_of_complex_tensors():
    """`.real`/`.imag` reinterpret complex storage as floats: reads and writes go through (real, imag) pairs."""
    z = torch.randn(3, 4, dtype=torch.complex64)
    d = z.to("tpu")
    assert torch.equal(d.real.cpu(), z.real) and torch.equal(d.imag.cpu(), z.imag)
    d.real.mul_(2)
    z.real.mul_(2)
    d.imag[1] = 5
    z.imag[1] = 5
    assert torch.equal(d.cpu(), z)
    r = torch.randn(3, 4, 2)
    assert torch.equal(torch.view_as_complex(r.to("tpu")).cpu(), torch.view_as_complex(r))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 16, 4, 8).transpose(1, 2),
        lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        lambda: torch.randn(3, 5).t(),
        lambda: torch.randn(4, 6)[:, ::2],
        lambda: torch.randn(3, 1).expand(3, 4),
    ],
    ids=["heads_transposed", "channels_last", "t", "sliced", "expanded"],
)
def test_copies_keep_pytorchs_layout(make):
    """`.to` keeps a dense permuted layout (preserve_format), as CPU and CUDA copies do: code that
    `view`s a copy after undoing the permutation works on tpu too. Non-dense layouts become row-major."""
    x = make()
    want = torch.empty_like(x).stride()
    for _ in range(2):  # the first copy once took another path
        t = x.to("tpu")
        assert t.stride() == want
        assert t.to(torch.bfloat16).stride() == want
        back = t.cpu()
        assert back.stride() == want and torch.equal(back, x)
    if x.dim() == 4 and x.shape[1] == 4:  # the heads case: undo the transpose, merge heads by a view
        torch.testing.assert_close(
            t.transpose(1, 2).view(2, 16, 32).cpu(), x.transpose(1, 2).reshape(2, 16, 32)
        )
    assert x.to("tpu", memory_format=torch.contiguous_format).is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_float8_conversions_saturate_as_cpu(dtype, source):
    """float8_e4m3fn has no infinity: PyTorch saturates overflow and inf to +-448 (XLA gives NaN), through
    every path a conversion takes (`.to`, `copy_`, an op's output, a compiled graph, DeferAndFuse)."""
    values = [448.0, 470.0, 1000.0, -600.0, 1e6, 3.3, 1e-10, 0.0]
    if source.is_floating_point:
        values += [float("inf"), float("-inf"), float("nan")]
    x = torch.tensor(values).to(source)
    want = x.to(dtype).float()
    t = x.to("tpu")
    copied = torch.empty(x.shape, dtype=dtype, device="tpu")
    copied.copy_(t)
    compiled = torch.compile(lambda a: a.to(dtype), backend="tpu")
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        deferred = t.to(dtype).float().cpu()
    for got in (t.to(dtype), copied, compiled(t), deferred):
        torch.testing.assert_close(got.cpu().float(), want, equal_nan=True, rtol=0, atol=0)

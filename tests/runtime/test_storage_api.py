"""Storages torch allocates itself on tpu: torch.load, copy.deepcopy, pickle (they crashed the process)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from hf_tpu.runtime.buffers.storage import REGISTRY

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool]


def _sample(dtype):
    return (torch.randn(3, 5) * 10).to(dtype)


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def _payload_dtype(t: torch.Tensor):
    return REGISTRY.payload(t.untyped_storage().data_ptr()).dtype


def test_a_new_untyped_storage_is_zeros_and_writable():
    s = torch.UntypedStorage(16, device="tpu")
    assert s.device == torch.device("tpu:0") and s.nbytes() == 16
    assert list(s.cpu()) == [0] * 16
    s.copy_(torch.UntypedStorage.from_buffer(bytes(range(16)), dtype=torch.uint8))
    assert list(s.cpu()) == list(range(16))
    with pytest.raises(ValueError, match="tpu:1 does not exist"):
        torch.UntypedStorage(4, device="tpu:1")


@pytest.mark.parametrize("dtype", DTYPES + [torch.complex64])
def test_save_on_tpu_load_on_tpu(dtype):
    x = _sample(dtype) if dtype != torch.complex64 else torch.randn(3, 5, dtype=dtype)
    loaded = _roundtrip({"x": x.to("tpu"), "tail": x.to("tpu")[1:, 2:]})
    assert loaded["x"].device.type == "tpu" and loaded["x"].dtype == dtype
    assert torch.equal(loaded["x"].cpu(), x)
    assert torch.equal(loaded["tail"].cpu(), x[1:, 2:])
    assert _payload_dtype(loaded["x"]) == dtype  # its values, not bytes reinterpreted at every read


@pytest.mark.parametrize("dtype", DTYPES)
def test_save_on_cpu_load_with_map_location_tpu(dtype):
    x = _sample(dtype)
    shared = {"a": x, "b": x[1]}  # a view: one storage in the file
    for where in ("tpu", torch.device("tpu:0"), lambda storage, loc: storage.tpu()):
        loaded = _roundtrip(shared, map_location=where)
        assert loaded["a"].device.type == "tpu"
        assert torch.equal(loaded["a"].cpu(), x) and torch.equal(loaded["b"].cpu(), x[1])
        loaded["b"].fill_(1)  # still a view of "a" after loading
        expected = x.clone()
        expected[1] = 1
        assert torch.equal(loaded["a"].cpu(), expected)


def test_deepcopy_of_tensors_modules_with_buffers_state_dicts_and_optimizers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4, device="tpu")).sum().backward()
    opt.step()
    x = torch.randn(4, 4, device="tpu")
    x_copy = copy.deepcopy(x)
    model_copy = copy.deepcopy(model)
    state_copy = copy.deepcopy(model.state_dict())
    opt_copy = copy.deepcopy(opt.state_dict())
    assert torch.equal(x_copy.cpu(), x.cpu())
    for (name, a), b in zip(model.state_dict().items(), model_copy.state_dict().values()):
        assert b.device.type == "tpu" and torch.equal(a.cpu(), b.cpu()), name
    for name, t in model.state_dict().items():
        assert torch.equal(state_copy[name].cpu(), t.cpu()), name
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(opt_copy["state"][0][k].cpu(), v.cpu()), k
    before = x.cpu()
    x_copy.add_(1)  # the copy is independent of the original
    model_copy[1].running_mean.add_(1)
    assert torch.equal(x.cpu(), before)
    assert not torch.equal(model[1].running_mean.cpu(), model_copy[1].running_mean.cpu())


def test_pickle_roundtrip():
    x = torch.randn(3, 4, device="tpu")
    y = pickle.loads(pickle.dumps(x))
    assert y.device.type == "tpu" and torch.equal(y.cpu(), x.cpu())

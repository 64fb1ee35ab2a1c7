"""pin_memory while tpu is the accelerator. With the C++ extension: real pinned host memory
(tests/runtime/test_native.py); on the pure-Python path: the tensor itself (an async copy target),
keeping DataLoader(pin_memory=True) working. `make test` runs this file on both paths."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.data as data

from hf_tpu.runtime import native


@pytest.mark.skipif(native.active(), reason="pure-Python path only (the C++ extension pins for real)")
def test_pin_memory_returns_the_host_tensor_unpinned():
    x = torch.arange(6.0).reshape(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = x.pin_memory()
    assert y.device.type == "cpu" and torch.equal(y, x)
    assert not y.is_pinned()


def test_dataloader_with_pin_memory_feeds_the_device():
    ds = data.TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8))
    loader = data.DataLoader(ds, batch_size=4, pin_memory=True)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for features, labels in loader:
            moved = features.to("tpu", non_blocking=True) * 2
            seen.append((moved.cpu(), labels))
    assert len(seen) == 2
    torch.testing.assert_close(torch.cat([f for f, _ in seen]), torch.arange(16.0).reshape(8, 2) * 2)
    assert torch.equal(torch.cat([lab for _, lab in seen]), torch.arange(8))


def test_other_pin_memory_errors_are_not_swallowed():
    t = torch.ones(2, device="tpu")
    try:
        t.pin_memory()
    except Exception as exc:  # noqa: BLE001 - any error is fine, as long as it is PyTorch's own
        assert "no-op" not in str(exc)
    else:  # PyTorch pins only dense CPU tensors: a device tensor must not come back "pinned"
        raise AssertionError("pin_memory() of a tpu tensor should raise as it does in PyTorch")

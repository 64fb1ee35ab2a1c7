"""Untrusted files loaded onto tpu keep the protections and the errors they have on CPU."""

from __future__ import annotations

import io
import os
import pickle

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class _RunsCode:
    """A pickle that would run a command when loaded without weights_only."""

    def __reduce__(self):
        return (os.system, ("echo this-must-never-run",))


def test_torch_load_onto_tpu_keeps_weights_only():
    buf = io.BytesIO()
    weights = {"w": torch.randn(3, 4)}
    torch.save(weights, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="tpu", weights_only=True)
    assert loaded["w"].device.type == "tpu"
    assert torch.equal(loaded["w"].cpu(), weights["w"])

    buf = io.BytesIO()
    torch.save({"x": _RunsCode()}, buf)
    for device in ("cpu", "tpu"):
        buf.seek(0)
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            torch.load(buf, map_location=device, weights_only=True)


@pytest.fixture
def broken_files(tmp_path):
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.randn(8, 8)}, str(good))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-10])
    bad_header = tmp_path / "bad_header.safetensors"
    bad_header.write_bytes(data[:8] + b"{not json" + data[17:])
    return {"truncated": truncated, "bad_header": bad_header}


@pytest.mark.parametrize("kind", ["truncated", "bad_header"])
def test_a_broken_safetensors_file_gives_cpus_error_on_tpu(broken_files, kind):
    path = str(broken_files[kind])
    with pytest.raises(SafetensorError) as on_cpu:
        load_file(path, device="cpu")
    with pytest.raises(SafetensorError) as on_tpu:
        load_file(path, device="tpu")
    assert str(on_tpu.value) == str(on_cpu.value)


def test_a_truncated_checkpoint_fails_from_pretrained_on_tpu_as_on_cpu(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(Exception) as on_cpu:
        AutoModelForCausalLM.from_pretrained(tmp_path, device_map="cpu")
    with pytest.raises(Exception) as on_tpu:
        AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert type(on_tpu.value) is type(on_cpu.value)
    assert "incomplete metadata" in str(on_tpu.value) or "model.safetensors" in str(on_tpu.value)

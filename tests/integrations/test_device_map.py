"""from_pretrained(..., device_map=...) onto tpu: every form, max_memory splits, context devices, bad input."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.integrations.conftest import all_on

FORMS = [
    "tpu",
    "tpu:0",
    torch.device("tpu"),
    torch.device("tpu", 0),
    0,
    {"": "tpu"},
    {"": 0},
    "auto",
    "balanced",
    "balanced_low_0",
    "sequential",
]


def _logits(model, ids):
    with torch.no_grad():
        return model(ids.to(model.device)).logits.cpu()


@pytest.mark.parametrize("device_map", FORMS, ids=repr)
def test_every_form_puts_weights_on_tpu(llama_cpu, device_map):
    model, path, ids = llama_cpu
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map=device_map)
    assert all_on(loaded, "tpu"), {n: p.device for n, p in loaded.named_parameters()}
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids), atol=1e-5, rtol=1e-5)


def test_load_keeps_ties_buffers_and_no_warmup_allocation(llama_cpu):
    model, path, _ = llama_cpu
    torch.tpu.empty_cache()
    before = torch.tpu.memory_allocated()
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
    # tied weights stay one Parameter (one storage) on tpu
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    # the non-persistent RoPE buffer is rebuilt on tpu with CPU's values
    inv_freq = loaded.model.rotary_emb.inv_freq
    assert inv_freq.device.type == "tpu"
    torch.testing.assert_close(inv_freq.cpu(), model.model.rotary_emb.inv_freq)
    # transformers' allocator warm-up (torch.empty of model size) must not stay allocated
    torch.tpu.empty_cache()
    grown = torch.tpu.memory_allocated() - before
    weights = sum(p.numel() * p.element_size() for p in loaded.parameters())
    buffers = sum(b.numel() * b.element_size() for b in loaded.buffers())
    assert weights <= grown <= 1.1 * (weights + buffers) + 4096, (grown, weights)


def test_dtype_conversion_on_the_way(llama_cpu):
    _, path, ids = llama_cpu
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="tpu", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and p.device.type == "tpu" for p in loaded.parameters())
    for (name, p), q in zip(loaded.named_parameters(), ref.parameters()):
        assert torch.equal(p.cpu(), q), name


def test_max_memory_splits_between_tpu_and_cpu(llama4_cpu):
    model, path = llama4_cpu
    ids = torch.randint(3, 128, (2, 8))
    loaded = AutoModelForCausalLM.from_pretrained(
        path, device_map="auto", max_memory={0: "100KB", "cpu": "1GB"}
    )
    placed = set(loaded.hf_device_map.values())
    assert 0 in placed and "cpu" in placed, loaded.hf_device_map
    assert loaded.model.embed_tokens.weight.device.type == "tpu"
    out = loaded(ids.to("tpu")).logits
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.detach().cpu(), _logits(model, ids), atol=1e-5, rtol=1e-5)


def test_max_memory_accepts_tpu_keys(llama4_cpu):
    _, path = llama4_cpu
    by_name = AutoModelForCausalLM.from_pretrained(
        path, device_map="auto", max_memory={"tpu": "100KB", "cpu": "1GB"}
    ).hf_device_map
    by_index = AutoModelForCausalLM.from_pretrained(
        path, device_map="auto", max_memory={0: "100KB", "cpu": "1GB"}
    ).hf_device_map
    assert by_name == by_index


def test_mixed_dict_offloads_to_cpu(llama4_cpu):
    model, path = llama4_cpu
    ids = torch.randint(3, 128, (2, 8))
    device_map = {
        "model.embed_tokens": "tpu",
        "model.rotary_emb": "tpu",
        "model.layers.0": "tpu",
        "model.layers.1": "cpu",
        "model.layers.2": "cpu",
        "model.layers.3": "tpu:0",
        "model.norm": 0,
        "lm_head": "cpu",
    }
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map=device_map)
    assert loaded.model.layers[0].mlp.up_proj.weight.device.type == "tpu"
    assert loaded.model.layers[3].mlp.up_proj.weight.device.type == "tpu"
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids), atol=1e-5, rtol=1e-5)


def test_device_context_manager_and_default_device(llama_cpu):
    _, path, _ = llama_cpu
    with torch.device("tpu"):
        in_context = AutoModelForCausalLM.from_pretrained(path)
    assert all_on(in_context, "tpu")
    torch.set_default_device("tpu")
    try:
        by_default = AutoModelForCausalLM.from_pretrained(path)
    finally:
        torch.set_default_device(None)
    assert all_on(by_default, "tpu")


def test_get_max_memory_reports_the_tpu():
    from accelerate.utils import get_max_memory
    from transformers.integrations.accelerate import get_max_memory as hf_get_max_memory

    for fn in (get_max_memory, hf_get_max_memory):
        memory = fn()
        assert list(memory)[0] == 0 and memory[0] > 0, memory
        assert "cpu" in memory
    assert get_max_memory({"tpu:0": "1GB", "cpu": "2GB"}) == {0: 10**9, "cpu": 2 * 10**9}


# -- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device_map", ["tpu:7", 7, torch.device("tpu", 3), {"": "tpu:1"}], ids=repr)
def test_device_index_beyond_the_logical_device(llama_cpu, device_map):
    _, path, _ = llama_cpu
    with pytest.raises(ValueError, match=r"one logical device, tpu:0") as info:
        AutoModelForCausalLM.from_pretrained(path, device_map=device_map)
    assert "device_map='tpu'" in str(info.value)


def test_max_memory_key_beyond_the_logical_device(llama_cpu):
    _, path, _ = llama_cpu
    with pytest.raises(ValueError, match=r"max_memory key 2 asks for tpu:2"):
        AutoModelForCausalLM.from_pretrained(path, device_map="auto", max_memory={2: "1GB"})


@pytest.mark.parametrize("max_memory", [{0: "1KB", "cpu": "1GB"}, {"tpu": "1KB"}], ids=repr)
def test_auto_with_max_memory_too_small_fails_before_loading(llama_cpu, max_memory):
    _, path, _ = llama_cpu
    torch.tpu.empty_cache()
    before = torch.tpu.memory_allocated()
    with pytest.raises(ValueError, match=r"could not place any part of LlamaForCausalLM .* on tpu") as info:
        AutoModelForCausalLM.from_pretrained(path, device_map="auto", max_memory=max_memory)
    assert "Raise the tpu entry of max_memory" in str(info.value)
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == before  # nothing half-loaded


def test_unsupported_dtype_fails_before_loading(llama_cpu):
    from hf_tpu.runtime.buffers.dtypes import UnsupportedDtypeError

    _, path, _ = llama_cpu
    with pytest.raises(UnsupportedDtypeError, match=r"float8_e4m3fnuz.*cannot load onto the tpu"):
        AutoModelForCausalLM.from_pretrained(path, device_map="tpu", dtype=torch.float8_e4m3fnuz)


def test_corrupt_checkpoint_names_the_checkpoint(llama_cpu, tmp_path):
    import shutil

    _, path, _ = llama_cpu
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    weights = broken / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) - 1000)
    with pytest.raises(Exception, match=r"incomplete metadata|not fully covered") as info:
        AutoModelForCausalLM.from_pretrained(str(broken), device_map="tpu")
    assert str(broken) in "\n".join(getattr(info.value, "__notes__", []))


def test_missing_shard_is_an_error(llama_cpu, tmp_path):
    model, _, _ = llama_cpu
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(p for p in tmp_path.iterdir() if p.suffix == ".safetensors")
    assert len(shards) > 1
    shards[1].unlink()
    with pytest.raises(FileNotFoundError, match=shards[1].name):
        AutoModelForCausalLM.from_pretrained(str(tmp_path), device_map="tpu")


def test_missing_tensor_is_reported_and_initialized_on_tpu(llama_cpu, tmp_path):
    """transformers' documented behaviour (as on CUDA): the key is reported missing and initialized — on tpu."""
    from safetensors.torch import load_file, save_file

    model, _, _ = llama_cpu
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded, info = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), device_map="tpu", output_loading_info=True
    )
    assert info["missing_keys"] == {"model.layers.1.mlp.up_proj.weight"}
    weight = loaded.model.layers[1].mlp.up_proj.weight
    assert weight.device.type == "tpu" and torch.isfinite(weight.cpu()).all()

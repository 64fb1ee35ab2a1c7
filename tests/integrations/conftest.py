"""Shared tiny checkpoints for the integration tests: built from configs, saved to a tmp dir, no Hub."""

from __future__ import annotations

import pytest
import torch


def tiny_llama_config(layers: int = 2, tie: bool = True):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


@pytest.fixture(scope="session")
def llama_cpu(tmp_path_factory):
    """(model on CPU, saved checkpoint dir, input_ids): a tied-embedding 2-layer Llama."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    path = str(tmp_path_factory.mktemp("llama"))
    model.save_pretrained(path)
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, path, ids


@pytest.fixture(scope="session")
def llama_tpu(llama_cpu):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama_cpu[1], device_map="tpu").eval()


@pytest.fixture(scope="session")
def llama4_cpu(tmp_path_factory):
    """(model on CPU, saved checkpoint dir): an untied 4-layer Llama, for splitting across tpu and cpu."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4, tie=False)).eval()
    path = str(tmp_path_factory.mktemp("llama4"))
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="session", autouse=True)
def _quiet_loading():
    from transformers.utils import logging

    logging.disable_progress_bar()
    yield


def all_on(model, device_type: str) -> bool:
    return all(t.device.type == device_type for t in list(model.parameters()) + list(model.buffers()))

"""generate_batch (continuous batching, paged KV cache) on tpu: sized from tpu memory, tokens as on CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

import hf_tpu.integrations.transformers as integ
from hf_tpu.runtime.buffers import memory

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


def _generate_batch(model, **cb):
    config = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    out = model.generate_batch(
        inputs=PROMPTS, generation_config=config, continuous_batching_config=ContinuousBatchingConfig(**cb)
    )
    assert all(r.error is None for r in out.values()), {k: r.error for k, r in out.items()}
    return {k: r.generated_tokens for k, r in out.items()}


def test_tpu_memory_breakdown_reports_the_tpu():
    device, total, reserved, allocated = integ.tpu_memory_breakdown()
    free, capacity = torch.tpu.mem_get_info()
    assert device.type == "tpu" and total == capacity
    budget = total - max(reserved, allocated)
    share = integ.HOST_BACKED_CACHE_SHARE if memory.host_backed() else 1.0
    # on CPU `free` is the host's available RAM, read again here: other processes move it a little between
    # the two reads (a 30 KB difference failed a strict bound)
    assert 0 < budget <= free * share * 1.02 + 1


def test_generate_batch_sizes_its_cache_from_tpu_memory_and_matches_cpu(llama_cpu, llama_tpu, monkeypatch):
    model, _, _ = llama_cpu
    asked = []
    breakdown = integ.tpu_memory_breakdown

    def observed():
        asked.append(True)
        return breakdown()

    monkeypatch.setattr(integ, "tpu_memory_breakdown", observed)
    # a small share of free memory and few batch tokens: the memory planner runs, the cache stays small
    cb = {"max_batch_tokens": 64, "max_memory_percent": 0.002}
    on_tpu = _generate_batch(llama_tpu, **cb)
    assert asked, "the paged cache for tpu was sized without asking the tpu's memory"
    assert on_tpu == _generate_batch(model, **cb)


@pytest.mark.parametrize("num_blocks", [8])
def test_generate_batch_with_an_explicit_cache_size(llama_cpu, llama_tpu, num_blocks):
    model, _, _ = llama_cpu
    cb = {"num_blocks": num_blocks, "max_batch_tokens": 32}
    assert _generate_batch(llama_tpu, **cb) == _generate_batch(model, **cb)

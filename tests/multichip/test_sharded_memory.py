"""Memory over many chips, in processes of their own (HF_TPU_MEMORY_LIMIT is read once per process):
a model bigger than one chip loads sharded, no chip ever holds a whole sharded weight, `device_map="auto"`
plans for the sum of the chips, and a model bigger than all of them fails before any weight is read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a Llama whose embedding and head are 2 MiB each (vocab 8192 x 64, fp32); the whole model ~4.4 MiB
SAVE = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
LlamaForCausalLM(cfg).save_pretrained({path!r})
"""


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full, timeout=600
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_8k")
    r = _run(SAVE.format(path=str(path)))
    assert r.returncode == 0, r.stderr
    return path


LOAD = """
import torch, hf_tpu
from transformers import LlamaForCausalLM
torch.tpu.set_per_process_memory_fraction(0.999)  # every new buffer >= 1 MiB is checked against its chip
model = LlamaForCausalLM.from_pretrained({path!r}, device_map={device_map!r})
per_chip = torch.tpu.memory_allocated_per_chip()
print("PER_CHIP", max(per_chip), min(per_chip))
print("DEVICES", *sorted({{p.device.type for p in model.parameters()}}))
ids = torch.randint(0, 8192, (1, 8))
ref = LlamaForCausalLM.from_pretrained({path!r})
with torch.no_grad():
    diff = (model(ids.to("tpu")).logits.cpu() - ref(ids).logits).abs().max().item()
print("DIFF", diff)
"""


def _values(stdout: str, key: str) -> list[str]:
    return next(line.split()[1:] for line in stdout.splitlines() if line.startswith(key))


@pytest.mark.parametrize("device_map", ["tpu", "auto"])
def test_a_model_bigger_than_one_chip_loads_sharded_without_a_whole_copy_on_any_chip(checkpoint, device_map):
    # each chip holds 1.5 MiB: the 2 MiB embedding would not fit one whole, its 256 KiB share does
    r = _run(LOAD.format(path=str(checkpoint), device_map=device_map), HF_TPU_MEMORY_LIMIT=str(3 << 19))
    assert r.returncode == 0, r.stderr[-3000:]
    high, low = map(int, _values(r.stdout, "PER_CHIP"))
    assert high <= 3 << 19 and high - low < 1 << 16
    assert _values(r.stdout, "DEVICES") == ["tpu"]  # "auto" planned for all chips: nothing offloaded
    assert float(_values(r.stdout, "DIFF")[0]) < 1e-5


def test_a_model_bigger_than_every_chip_together_fails_before_reading_a_weight(checkpoint):
    code = """
    import torch, hf_tpu
    from transformers import LlamaForCausalLM
    try:
        LlamaForCausalLM.from_pretrained({path!r}, device_map="tpu")
    except torch.OutOfMemoryError as exc:
        print("OOM", exc)
    print("ALLOCATED", torch.tpu.memory_allocated())
    """
    # 256 KiB a chip: the model's 4.4 MiB do not fit 8 of them, whatever the placement
    r = _run(code.format(path=str(checkpoint)), HF_TPU_MEMORY_LIMIT=str(1 << 18))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OOM" in r.stdout and "on the fullest chip" in r.stdout and "Nothing was loaded" in r.stdout
    assert "each chip holds 256.00 KiB" in r.stdout
    assert _values(r.stdout, "ALLOCATED") == ["0"]


def test_replicating_a_model_bigger_than_one_chip_is_refused_with_the_per_chip_figure(checkpoint):
    code = """
    import torch, hf_tpu
    from transformers import LlamaForCausalLM
    with hf_tpu.sharding_policy("replicate"):
        try:
            LlamaForCausalLM.from_pretrained({path!r}, device_map="tpu")
        except torch.OutOfMemoryError as exc:
            print("OOM", exc)
    """
    r = _run(code.format(path=str(checkpoint)), HF_TPU_MEMORY_LIMIT=str(3 << 19))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OOM" in r.stdout and "sharding policy 'replicate'" in r.stdout

"""A checkpoint's mapped pages are given back once copied to tpu (runtime/buffers/file_pages.py), and
nothing a page held is ever lost: written pages, anonymous memory and torch's own storages stay as they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import safe_open, save_file

from hf_tpu.runtime.buffers import file_pages

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux /proc only")
REPO = Path(__file__).resolve().parents[2]


def _rss_file_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.fixture
def checkpoint(tmp_path):
    tensors = {"big": torch.randn(2048, 2048), "other": torch.randn(1024, 1024), "small": torch.randn(8, 8)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def test_a_copied_checkpoint_tensor_gives_its_pages_back(checkpoint):
    path, expected = checkpoint
    torch.ones(4, device="tpu").cpu()  # device started, its libraries mapped
    with safe_open(str(path), "pt") as f:
        big = f.get_tensor("big")
        big.sum()  # every page read: mapped and counted
        touched = _rss_file_mib()
        on_tpu = big.to("tpu")
        released = touched - _rss_file_mib()
        # 16 MiB tensor: its pages leave the process (page cache keeps them)
        assert released > 12, released
        # the device copy and the CPU tensor (mapped back on reading) both hold the checkpoint's values
        assert torch.equal(on_tpu.cpu(), expected["big"])
        assert torch.equal(big, expected["big"])


def test_a_written_page_is_never_dropped(checkpoint):
    path, expected = checkpoint
    with safe_open(str(path), "pt") as f:
        other = f.get_tensor("other")
        other[100, 5] = 1234.5  # a private copy of that file page: dropping it would lose the write
        on_tpu = other.to("tpu")
        assert file_pages.release(other) == 0
        assert other[100, 5].item() == 1234.5
        assert on_tpu[100, 5].item() == 1234.5
        assert torch.equal(other.view(-1)[: 100 * 1024], expected["other"].view(-1)[: 100 * 1024])


def test_anonymous_memory_is_left_alone():
    from_torch = torch.randn(1024, 1024)
    from_numpy = torch.from_numpy(np.random.default_rng(0).standard_normal((1024, 1024)))  # not resizable
    for t in (from_torch, from_numpy):
        before = t.clone()
        t.to("tpu")
        assert file_pages.release(t) == 0
        assert torch.equal(t, before)


_LOAD = """
import json, os, sys, torch, hf_tpu
from transformers import AutoModelForCausalLM
torch.ones(4, device="tpu").cpu()
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
base = status("VmRSS")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="tpu")
print(json.dumps({"peak_delta": status("VmHWM") - base}))
"""


def _peak_load_delta(path: Path, release: bool) -> int:
    env = dict(os.environ, HF_TPU_RELEASE_FILE_PAGES="1" if release else "0", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LOAD), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_delta"]


def test_from_pretrained_onto_tpu_peaks_lower_without_the_mapped_checkpoint(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    checkpoint = (tmp_path / "model.safetensors").stat().st_size  # ~84 MiB
    kept = _peak_load_delta(tmp_path, release=False)
    given_back = _peak_load_delta(tmp_path, release=True)
    # with the pages kept, the peak holds the model on the device plus (most of) the mapped checkpoint
    assert kept - given_back > 0.4 * checkpoint, (kept, given_back, checkpoint)

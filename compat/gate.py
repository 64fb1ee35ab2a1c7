"""``compat gate DIR``: fail a CI job on regressions, after the report has been published.

``compat report`` already exits 1 on regressions, but a nightly job must publish the report that shows
them before it fails; the gate re-reads the written summary so those two steps can be apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class GateResult:
    """Exit code (0 pass, 1 regressions, 2 no report) and the line that says why."""

    exit_code: int
    message: str


def check(report_dir: str | Path) -> GateResult:
    """Read ``summary.json`` and decide; a night with no previous report has nothing to regress from."""
    path = Path(report_dir) / "summary.json"
    if not path.exists():
        return GateResult(2, f"no summary.json in {report_dir}: run `compat report {report_dir}` first")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        return GateResult(2, f"{path}: unreadable ({e})")
    changes = summary.get("regressions")
    if changes is None:
        return GateResult(0, f"gate: {summary.get('date')}: no previous report to compare with; passes")
    failing = int(changes.get("newly_failing") or 0)
    prev = summary.get("previous")
    if failing:
        return GateResult(
            1, f"gate: FAIL: {failing} regressions vs {prev} (listed in {Path(report_dir) / 'report.md'})"
        )
    return GateResult(
        0, f"gate: pass: 0 regressions vs {prev} ({int(changes.get('newly_passing') or 0)} newly passing)"
    )

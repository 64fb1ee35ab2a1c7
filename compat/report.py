"""Nightly report: `python -m compat report <results_dir> [--previous <dir>]`.

Reads `<dir>/results.jsonl` (one record per model and mode, written by the runner) and writes
`summary.json`, `report.md` and a self-contained `index.html` next to it. With a previous night it lists
newly failing / newly passing models and exits 1 on regressions, for CI gating.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat import report_html, report_pages
from compat.jsonl import read_jsonl
from compat.records import MODES, NOT_BACKEND_STATUSES, STATUSES

log = logging.getLogger("compat")

DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# A regression: a model that passed and now ends in one of these (a new explicit skip is not one).
REGRESSION_STATUSES = frozenset(STATUSES) - {"pass", "skipped"}
TOP_OPS = 25


@dataclass
class ReportResult:
    """What `generate` wrote and how the command should exit (1 = regressions, for CI)."""

    out_dir: Path
    summary: dict[str, Any]
    regressions: list[dict] = field(default_factory=list)
    exit_code: int = 0
    message: str = ""


# ------------------------------------------------------------------------------------------------ input


def load_results(results_dir: Path) -> list[dict]:
    """Result records of a run; malformed lines are warned about and skipped; the last line per key wins."""
    path = Path(results_dir) / "results.jsonl"
    if not path.exists():
        raise FileNotFoundError(
            f"no results.jsonl in {results_dir}: run `python -m compat run --out {results_dir}`"
        )
    latest: dict[tuple, dict] = {}
    for rec in read_jsonl(path, "result"):
        if not rec.get("model_id") or not rec.get("mode") or not rec.get("status"):
            log.warning("%s: a result without model_id/mode/status skipped: %.120s", path, json.dumps(rec))
            continue
        if rec["status"] not in STATUSES:
            log.warning(
                "%s: %s has unknown status %r; counted as harness_error", path, rec["model_id"], rec["status"]
            )
            rec = {**rec, "status": "harness_error"}
        latest[(rec["model_id"], rec.get("architecture"), rec["mode"], rec.get("device"))] = rec
    return list(latest.values())


def covered_ids(rec: dict) -> list[str]:
    """The model ids a (deduplicated) result answers for: its own and those attributed to it."""
    ids = [rec["model_id"]]
    ids += [i for i in rec.get("attributed_ids") or [] if i not in ids]
    return ids


# ------------------------------------------------------------------------------------------------ stats


def _rate(n_pass: int, n: int) -> float | None:
    return round(n_pass / n, 4) if n else None


def tally(records: Iterable[dict]) -> dict[str, Any]:
    """Counts for a group of results: by status, pass rates over results and over attributed models.

    `rate` counts only results that reached the backend (harness errors, skips and a nondeterministic
    reference say nothing about it); `rate_all` counts every result except explicit skips.
    """
    by_status: Counter[str] = Counter()
    models_by_status: Counter[str] = Counter()
    upstream = 0
    for r in records:
        by_status[r["status"]] += 1
        models_by_status[r["status"]] += len(covered_ids(r))
        upstream += is_upstream(r)
    n = sum(by_status.values())
    n_models = sum(models_by_status.values())
    backend = n - sum(by_status[s] for s in NOT_BACKEND_STATUSES)
    backend_models = n_models - sum(models_by_status[s] for s in NOT_BACKEND_STATUSES)
    return {
        "results": n,
        "models": n_models,
        "reached": backend,
        "pass": by_status["pass"],
        "pass_models": models_by_status["pass"],
        "rate": _rate(by_status["pass"], backend),
        "rate_models": _rate(models_by_status["pass"], backend_models),
        "rate_all": _rate(by_status["pass"], n - by_status["skipped"]),
        # failures that reproduce on CPU without hf_tpu (compat.attribution) are counted apart from ours
        "upstream": upstream,
        "ours": backend - by_status["pass"] - upstream,
        "rate_without_upstream": _rate(by_status["pass"], backend - upstream),
        "by_status": dict(sorted(by_status.items())),
    }


def is_upstream(rec: dict) -> bool:
    """A backend failure attributed upstream: it fails the same way on CPU without hf_tpu."""
    return rec.get("cause") == "upstream" and rec.get("status") not in NOT_BACKEND_STATUSES | {"pass"}


def upstream_failures(records: list[dict]) -> list[dict]:
    """Every failure attributed upstream, with the CPU re-run that reproduced it."""
    out = []
    for r in sorted(records, key=lambda r: (r["model_id"], str(r.get("architecture")), r["mode"])):
        if is_upstream(r):
            att = r.get("attribution") or {}
            out.append(
                {
                    "model_id": r["model_id"],
                    "architecture": r.get("architecture"),
                    "mode": r["mode"],
                    "status": r["status"],
                    "models": len(covered_ids(r)),
                    "rerun": att.get("rerun"),
                    "detail": (att.get("detail") or "")[:300],
                    "error": (r.get("error") or "")[:300],
                }
            )
    return out


def group_by_mode(records: list[dict], key: str) -> dict[str, dict[str, dict]]:
    """{group value: {mode: tally}} for one field (model_type, task, modality, architecture)."""
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        groups[str(r.get(key) or "unknown")][r["mode"]].append(r)
    return {g: {m: tally(modes[m]) for m in order_modes(modes)} for g, modes in sorted(groups.items())}


def top_missing_ops(records: list[dict], limit: int = TOP_OPS) -> list[dict]:
    """Ops whose absence made models fail, most models first, with the modes and an example model."""
    ops: dict[str, dict] = {}
    for r in records:
        op = r.get("missing_op")
        if not op or r["status"] == "pass":
            continue
        o = ops.setdefault(
            op, {"op": op, "results": 0, "models": 0, "modes": set(), "example": r["model_id"]}
        )
        o["results"] += 1
        o["models"] += len(covered_ids(r))
        o["modes"].add(r["mode"])
    out = sorted(ops.values(), key=lambda o: (-o["models"], o["op"]))[:limit]
    return [{**o, "modes": sorted(o["modes"])} for o in out]


def report_date(results_dir: Path, records: list[dict]) -> str:
    """The night a report is for: its directory name when dated, else the newest record's date."""
    if DATE_RE.match(Path(results_dir).name):
        return Path(results_dir).name
    dates = sorted(str(r.get("date"))[:10] for r in records if r.get("date"))
    return dates[-1] if dates else dt.date.today().isoformat()


def coverage(records: list[dict], architectures: Path | None) -> dict[str, Any]:
    """Registry coverage: architectures known, with a model in the snapshot, and run tonight."""
    run = sorted({r.get("architecture") for r in records if r.get("architecture")})
    out: dict[str, Any] = {"run": len(run)}
    if architectures and Path(architectures).exists():
        reg = [e for e in read_jsonl(architectures, "architecture") if "name" in e]
        models = [e for e in reg if e.get("kind", "model") == "model"]
        out.update(
            registry=len(reg),
            registry_models=len(models),
            with_models=sum(1 for e in reg if e.get("n_models")),
            without_models=sorted(e["name"] for e in reg if not e.get("n_models")),
            not_run=sum(1 for e in models if e.get("n_models") and e["name"] not in set(run)),
        )
    return out


def summarize(records: list[dict], results_dir: Path, architectures: Path | None = None) -> dict[str, Any]:
    """Everything summary.json holds (no timestamps of its own: the same results give the same file)."""
    modes = order_modes({r["mode"] for r in records})
    return {
        "date": report_date(results_dir, records),
        "devices": sorted({str(r.get("device")) for r in records if r.get("device")}),
        "modes": modes,
        "totals": {
            "results": len(records),
            "unique_configs": len(
                {r.get("dedup_key") or (r["model_id"], r.get("architecture")) for r in records}
            ),
            "attributed_models": len({(i, r.get("architecture")) for r in records for i in covered_ids(r)}),
            "model_ids": len({i for r in records for i in covered_ids(r)}),
            "architectures": len({r.get("architecture") for r in records if r.get("architecture")}),
        },
        "overall": tally(records),
        "per_mode": {m: tally([r for r in records if r["mode"] == m]) for m in modes},
        "per_model_type": group_by_mode(records, "model_type"),
        "per_task": group_by_mode(records, "task"),
        "per_modality": group_by_mode(records, "modality"),
        "per_architecture": group_by_mode(records, "architecture"),
        "top_missing_ops": top_missing_ops(records),
        "upstream_failures": upstream_failures(records),
        "failure_causes": report_pages.failure_causes(records, modes),
        "reach": reach(records, modes),
        "graph_breaks": sum(int(r.get("graph_breaks") or 0) for r in records),
        "coverage": coverage(records, architectures),
    }


def reach(records: list[dict], modes: list[str]) -> dict[str, dict[str, Any]]:
    """Per mode: configs planned (every result but explicit skips), how many reached the backend, and the
    architectures that reached it out of those planned: the coverage a pass rate must be read with."""
    out: dict[str, dict[str, Any]] = {}
    for m in modes:
        recs = [r for r in records if r["mode"] == m and r["status"] != "skipped"]
        reached = [r for r in recs if r["status"] not in NOT_BACKEND_STATUSES]
        archs = {r.get("architecture") for r in recs if r.get("architecture")}
        archs_reached = {r.get("architecture") for r in reached if r.get("architecture")}
        out[m] = {
            "planned": len(recs),
            "reached": len(reached),
            "rate": _rate(len(reached), len(recs)),
            "architectures": len(archs),
            "architectures_reached": len(archs_reached),
            "architectures_rate": _rate(len(archs_reached), len(archs)),
        }
    return out


# ------------------------------------------------------------------------------------------------- diff


def _expanded(records: list[dict]) -> dict[tuple[str, str | None, str], dict]:
    out = {}
    for r in records:
        for mid in covered_ids(r):
            out[(mid, r.get("architecture"), r["mode"])] = r
    return out


def diff(previous: list[dict], current: list[dict]) -> dict[str, list[dict]]:
    """Per (model, architecture, mode): newly failing (was pass), newly passing, and models gone."""
    before, after = _expanded(previous), _expanded(current)

    def item(key: tuple, old: dict | None, new: dict | None) -> dict:
        src = new or old or {}
        return {
            "model_id": key[0],
            "architecture": key[1],
            "mode": key[2],
            "before": old["status"] if old else None,
            "after": new["status"] if new else None,
            "error_class": src.get("error_class"),
            "error": (src.get("error") or "")[:500] or None,
            "missing_op": src.get("missing_op"),
        }

    failing, passing, gone = [], [], []
    for key in sorted(set(before) | set(after), key=lambda k: (k[0], str(k[1]), k[2])):
        old, new = before.get(key), after.get(key)
        if old and new:
            if old["status"] == "pass" and new["status"] in REGRESSION_STATUSES:
                failing.append(item(key, old, new))
            elif old["status"] != "pass" and new["status"] == "pass":
                passing.append(item(key, old, new))
        elif old and not new:
            gone.append(item(key, old, None))
    return {"newly_failing": failing, "newly_passing": passing, "missing": gone}


# ------------------------------------------------------------------------------------------------ trend


def trend(results_dir: Path, summary: dict[str, Any]) -> list[dict]:
    """Per-night pass rates from sibling dated report dirs (reports/YYYY-MM-DD/summary.json) and tonight."""
    points: dict[str, dict] = {}
    parent = Path(results_dir).resolve().parent
    for d in sorted(parent.iterdir()) if parent.is_dir() else []:
        if not (d.is_dir() and DATE_RE.match(d.name) and (d / "summary.json").exists()):
            continue
        if d.resolve() == Path(results_dir).resolve():
            continue
        try:
            s = json.loads((d / "summary.json").read_text(encoding="utf-8"))
            points[d.name] = {m: t.get("rate") for m, t in (s.get("per_mode") or {}).items()}
        except (OSError, ValueError, AttributeError) as e:
            log.warning("%s: unreadable summary.json skipped in the trend (%s)", d, e)
    points[summary["date"]] = {m: t["rate"] for m, t in summary["per_mode"].items()}
    return [{"date": k, "rates": v} for k, v in sorted(points.items())]


# ------------------------------------------------------------------------------------------------ write


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _cell(t: dict) -> str:
    """'pass/reached (rate)', plus how many never reached the backend (harness errors, skips)."""
    text = f"{t['pass']}/{t['reached']} ({_pct(t['rate'])})"
    if t["results"] > t["reached"]:
        text += f" +{t['results'] - t['reached']} not run"
    return text


def order_modes(modes: Iterable[str]) -> list[str]:
    """eager, compiled, defer_and_fuse, train first (the records' order), then any other mode by name."""
    known = [m for m in MODES if m in set(modes)]
    return known + sorted(set(modes) - set(known))


def _md_group_table(
    title: str, groups: dict[str, dict[str, dict]], modes: list[str], limit: int | None = None
) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| " + " | ".join([title.split()[-1], *modes]) + " |",
        "|---" * (len(modes) + 1) + "|",
    ]
    rows = sorted(groups.items(), key=lambda kv: (-max(t["results"] for t in kv[1].values()), kv[0]))
    for g, per in rows[:limit] if limit else rows:
        cells = [_cell(per[m]) if m in per else "" for m in modes]
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    if limit and len(rows) > limit:
        lines.append(
            f"| … {len(rows) - limit} more in summary.json | " + " | ".join("" for _ in modes) + " |"
        )
    return [*lines, ""]


def render_markdown(
    summary: dict[str, Any], changes: dict[str, list[dict]] | None, previous: str | None
) -> str:
    """report.md: the numbers a maintainer reads first, then the breakdowns."""
    s, t, modes = summary, summary["totals"], summary["modes"]
    o = s["overall"]
    lines = [
        f"# Compatibility report {s['date']}",
        "",
        f"Devices: {', '.join(s['devices']) or '–'}; modes: {', '.join(modes)}.",
        "",
        f"- **{t['results']} results** for **{t['unique_configs']} unique configs**, attributed to "
        f"**{t['attributed_models']} models** ({t['model_ids']} model ids, {t['architectures']} architectures).",
        f"- Pass rate: {_pct(o['rate'])} of results that reached the backend ({_pct(o['rate_models'])} of "
        f"attributed models); {_pct(o['rate_all'])} of all non-skipped results.",
        "- Reached the backend (of the configs planned; architectures in brackets): "
        + (
            ", ".join(
                f"{m} {c['reached']}/{c['planned']} ({_pct(c['rate'])}) "
                f"[{c['architectures_reached']}/{c['architectures']}]"
                for m, c in s.get("reach", {}).items()
            )
            or "–"
        )
        + ".",
        f"- Failures on the backend: **{o['ours']} ours**, **{o['upstream']} upstream** (fail the same way on "
        f"CPU without hf_tpu: "
        + (", ".join(f"{m} {t['upstream']}" for m, t in s["per_mode"].items()) or "–")
        + f"); pass rate without the upstream ones: {_pct(o['rate_without_upstream'])}.",
        "- Statuses: "
        + ", ".join(f"{k} {v}" for k, v in sorted(o["by_status"].items(), key=lambda kv: -kv[1]))
        + ".",
        f"- Graph breaks (compiled): {s['graph_breaks']}.",
        f"- {report_html.REMOTE_CODE_NOTE}",
    ]
    cov = s.get("coverage") or {}
    if "registry" in cov:
        lines.append(
            f"- Registry: {cov['registry']} architectures, {cov['with_models']} with at least one Hub model, "
            f"{len(cov['without_models'])} with none; {cov['run']} run tonight."
        )
    lines += [
        "",
        "## Pass rate per mode",
        "",
        "rate: pass / results that reached the backend; rate (models): the same over attributed models.",
        "",
        "| mode | results | reached backend | models | pass | rate | rate (models) | failures: ours / upstream | statuses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, tm in s["per_mode"].items():
        statuses = ", ".join(f"{k} {v}" for k, v in tm["by_status"].items())
        lines.append(
            f"| {m} | {tm['results']} | {tm['reached']} | {tm['models']} | {tm['pass']} | {_pct(tm['rate'])} "
            f"| {_pct(tm['rate_models'])} | {tm['ours']} / {tm['upstream']} | {statuses} |"
        )
    lines.append("")
    if changes is not None:
        lines += [f"## Regressions against {previous}", ""]
        if not changes["newly_failing"]:
            lines.append("No regressions.")
        else:
            lines += ["| model | architecture | mode | before → after | error |", "|---|---|---|---|---|"]
            for c in changes["newly_failing"]:
                err = (
                    (c["missing_op"] or f"{c['error_class'] or ''}: {c['error'] or ''}")
                    .replace("|", "\\|")
                    .replace("\n", " ")[:200]
                )
                lines.append(
                    f"| {c['model_id']} | {c['architecture']} | {c['mode']} | {c['before']} → {c['after']} | {err} |"
                )
        lines += ["", f"Newly passing: {len(changes['newly_passing'])}."]
        for c in changes["newly_passing"][:50]:
            lines.append(f"- {c['model_id']} ({c['architecture']}, {c['mode']}): {c['before']} → pass")
        if changes["missing"]:
            lines.append(f"\nNot run tonight but run before: {len(changes['missing'])}.")
        lines.append("")
    causes = s.get("failure_causes") or []
    lines += ["## Failure causes", ""]
    if causes:
        lines += [
            "| cause | " + " | ".join(modes) + " | models | examples |",
            "|---|" + "---|" * len(modes) + "---|---|",
        ]
        for c in causes:
            ex = "; ".join(f"{e['model_id']} ({e['mode']}): {e['detail']}" for e in c["examples"])
            if c["phases"]:
                ex = "phases: " + ", ".join(f"{k} {v}" for k, v in c["phases"].items()) + ". " + ex
            ex = ex.replace("|", "\\|")[:400]
            lines.append(
                f"| {c['label']} | "
                + " | ".join(str(c["per_mode"].get(m, 0)) for m in modes)
                + f" | {c['models']} | {ex} |"
            )
    else:
        lines.append("Nothing failed.")
    lines.append("")
    lines += [
        "## Upstream failures",
        "",
        'Failures that reproduce on CPU without hf_tpu: compiled ones under `torch.compile(backend="aot_eager")`, '
        "eager exceptions with each op's meta kernel checked first (see `compat/attribution.py`).",
        "",
    ]
    ups = s.get("upstream_failures") or []
    if ups:
        lines += ["| model | architecture | mode | status | CPU re-run | why |", "|---|---|---|---|---|---|"]
        for u in ups[:100]:
            why = (u["detail"] or "").replace("|", "\\|").replace("\n", " ")[:200]
            lines.append(
                f"| {u['model_id']} | {u['architecture']} | {u['mode']} | {u['status']} | {u['rerun']} | {why} |"
            )
    else:
        lines.append("No failure was attributed upstream.")
    lines.append("")
    lines += ["## Top missing ops", ""]
    if s["top_missing_ops"]:
        lines += ["| op | models | results | modes | example |", "|---|---|---|---|---|"]
        lines += [
            f"| `{o['op']}` | {o['models']} | {o['results']} | {', '.join(o['modes'])} | {o['example']} |"
            for o in s["top_missing_ops"]
        ]
    else:
        lines.append("No failure named a missing op.")
    lines.append("")
    lines += _md_group_table("Per modality", s["per_modality"], modes)
    lines += _md_group_table("Per task", s["per_task"], modes)
    lines += _md_group_table("Per model_type", s["per_model_type"], modes, limit=200)
    if cov.get("without_models"):
        names = cov["without_models"]
        lines += [
            "## Architectures with no model at all",
            "",
            ", ".join(names[:300]) + (" …" if len(names) > 300 else ""),
            "",
        ]
    return "\n".join(lines)


def generate(
    results_dir: Path, previous: Path | None = None, architectures: Path | None = None
) -> ReportResult:
    """Write summary.json, report.md, index.html into results_dir; diff against `previous` when given."""
    from compat.report_html import render_html

    results_dir = Path(results_dir)
    records = load_results(results_dir)
    summary = summarize(records, results_dir, architectures)
    changes = None
    prev_note = None
    if previous is not None:
        previous = Path(previous)
        try:
            changes = diff(load_results(previous), records)
            summary["regressions"] = {k: len(v) for k, v in changes.items()}
            summary["previous"] = previous.name
        except FileNotFoundError:
            prev_note = f"previous report {previous} has no results.jsonl: nothing to diff against"
            log.warning("%s", prev_note)
    points = trend(results_dir, summary)
    (results_dir / "summary.json").write_text(
        json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (results_dir / "report.md").write_text(
        render_markdown(summary, changes, previous.name if previous else None), encoding="utf-8"
    )
    links = report_pages.write_pages(results_dir, summary, records)
    (results_dir / "index.html").write_text(
        render_html(
            summary,
            records,
            points,
            changes,
            links,
            lookup=report_pages.lookup_json(records),
            csv_name=report_pages.CSV_NAME,
        ),
        encoding="utf-8",
    )
    regressions = changes["newly_failing"] if changes else []
    rates = ", ".join(f"{m} {_pct(t['rate'])}" for m, t in summary["per_mode"].items()) or "– (no results)"
    msg = f"report {summary['date']}: {len(records)} results ({summary['totals']['attributed_models']} models); pass {rates}"
    if changes is not None:
        msg += f"; {len(regressions)} regressions, {len(changes['newly_passing'])} newly passing vs {previous.name}"
    if prev_note:
        msg += f"; {prev_note}"
    msg += f" → {results_dir / 'index.html'}"
    return ReportResult(results_dir, summary, regressions, 1 if regressions else 0, msg)

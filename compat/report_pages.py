"""What a nightly report offers its readers beyond the headline page: failure causes grouped, a
downloadable CSV, one page per architecture, and the lookup that answers "does my model work?".

The lookup covers every model id a result stands for (`attributed_ids`): most users' ids were never run as
themselves but share a deduplicated config with one that was, and the answer for them is that config's.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import jinja2

from compat.records import NOT_BACKEND_STATUSES

# failure cause groups, in the order a reader triages them; `cause_of` decides which one a result is in
CAUSES = {
    "missing_op": "missing op (hf_tpu has no lowering)",
    "upstream": "upstream (fails the same way on CPU without hf_tpu)",
    "accuracy": "wrong numbers (outputs differ from the CPU reference)",
    "compile": "compile failure",
    "runtime": "runtime error on tpu",
    "resources": "timeout, out of memory or crash",
    "harness": "harness (the model never reached the backend)",
}
ARCH_DIR = "architectures"
CSV_NAME = "results.csv"
CSV_FIELDS = (
    "model_id", "attributed_ids", "architecture", "model_type", "task", "modality", "library", "mode",
    "device", "status", "cause", "phase", "missing_op", "error_class", "error", "load_s", "first_call_s",
    "steady_s", "peak_mem_mb", "graph_breaks", "dedup_key",
)  # fmt: skip


def cause_of(rec: dict) -> str | None:
    """The cause group of a result that did not pass (None for a pass or an explicit skip)."""
    status = rec["status"]
    if status in ("pass", "skipped"):
        return None
    if status in NOT_BACKEND_STATUSES:
        return "harness"
    if rec.get("cause") == "upstream":
        return "upstream"
    if rec.get("missing_op"):
        return "missing_op"
    if status == "fail_accuracy":
        return "accuracy"
    if status == "compile_fail":
        return "compile"
    if status in ("timeout", "oom", "crash"):
        return "resources"
    return "runtime"


def _example(rec: dict) -> str:
    text = rec.get("missing_op") or ": ".join(x for x in (rec.get("error_class"), rec.get("error")) if x)
    return re.sub(r"\s+", " ", text or "")[:200]


def failure_causes(records: list[dict], modes: list[str], examples: int = 3) -> list[dict]:
    """One row per cause group with failures: counts per mode, models covered, a few examples; harness
    errors also split by the phase they stopped in (plan, materialize, inputs, reference, ...)."""
    groups: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: (r["model_id"], str(r.get("architecture")), r["mode"])):
        cause = cause_of(r)
        if cause is None:
            continue
        g = groups.setdefault(
            cause,
            {"cause": cause, "label": CAUSES[cause], "per_mode": dict.fromkeys(modes, 0), "results": 0,
             "models": 0, "phases": defaultdict(int), "examples": []},
        )  # fmt: skip
        g["per_mode"][r["mode"]] = g["per_mode"].get(r["mode"], 0) + 1
        g["results"] += 1
        g["models"] += len({r["model_id"], *(r.get("attributed_ids") or [])})
        if cause == "harness":
            g["phases"][r.get("phase") or "unknown"] += 1
        if len(g["examples"]) < examples:
            g["examples"].append({"model_id": r["model_id"], "mode": r["mode"], "detail": _example(r)})
    out = [groups[c] for c in CAUSES if c in groups]
    for g in out:
        g["phases"] = dict(sorted(g["phases"].items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def csv_text(records: list[dict]) -> str:
    """Every result as one CSV row (attributed ids joined by spaces), for spreadsheets and pandas."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in sorted(records, key=lambda r: (r["model_id"], str(r.get("architecture")), r["mode"])):
        times = r.get("times") or {}
        mem = r.get("peak_mem_bytes")
        w.writerow(
            {
                **{k: r.get(k) for k in CSV_FIELDS},
                "attributed_ids": " ".join(i for i in r.get("attributed_ids") or [] if i != r["model_id"]),
                "cause": cause_of(r) or "",
                "load_s": times.get("load_s"),
                "first_call_s": times.get("first_call_s"),
                "steady_s": times.get("steady_s"),
                "peak_mem_mb": round(mem / 2**20, 1) if isinstance(mem, int | float) else None,
            }
        )
    return buf.getvalue()


def arch_slug(name: str) -> str:
    """A file name for an architecture's page (class names are already safe; anything else is replaced)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name or "unknown") or "unknown"


def lookup_index(records: list[dict]) -> dict[str, list[list[str]]]:
    """model id (lower case) -> [[mode, status, architecture, id it ran as], ...] over every id a result
    covers, so a search finds models that were attributed to another id's run."""
    index: dict[str, list[list[str]]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r["model_id"], str(r.get("architecture")), r["mode"])):
        for mid in dict.fromkeys([r["model_id"], *(r.get("attributed_ids") or [])]):
            index[mid.lower()].append(
                [r["mode"], r["status"], str(r.get("architecture") or ""), r["model_id"]]
            )
    return dict(index)


ARCH_TEMPLATE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{{ arch }} · compatibility {{ date }}</title>
<style>
 body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
 table { border-collapse: collapse; } th, td { border-bottom: 1px solid #eee; padding: 3px 8px; text-align: left; vertical-align: top; }
 th { background: #fafafa; } td.err { font-family: ui-monospace, monospace; font-size: 12px; color: #555; max-width: 560px; }
 .status { padding: 1px 6px; border-radius: 4px; color: #fff; font-size: 12px; }
</style></head>
<body>
<p><a href="../index.html">← report {{ date }}</a></p>
<h1>{{ arch }}</h1>
<table id="arch-modes"><tr><th>mode</th><th>results</th><th>reached the backend</th><th>pass</th><th>pass rate</th></tr>
{% for m, t in per_mode.items() %}<tr><td>{{ m }}</td><td>{{ t.results }}</td><td>{{ t.reached }}</td><td>{{ t.pass }}</td><td>{{ pct(t.rate) }}</td></tr>{% endfor %}
</table>
<h2>Models</h2>
<table id="arch-models"><tr><th>model</th><th>also answers for</th><th>mode</th><th>status</th><th>cause</th><th>missing op / error</th></tr>
{% for r in rows %}<tr data-status="{{ r.status }}"><td>{{ r.model_id }}</td><td>{{ r.attributed }}</td><td>{{ r.mode }}</td><td><span class="status" style="background:{{ r.color }}">{{ r.status }}</span></td><td>{{ r.cause }}</td><td class="err">{{ r.detail }}</td></tr>
{% endfor %}</table>
</body></html>
"""


def write_pages(out_dir: Path, summary: dict[str, Any], records: list[dict]) -> dict[str, str]:
    """Write results.csv and one page per architecture under out_dir; returns {architecture: relative
    link}. Pages of architectures no longer in the results are removed (a report folder is rewritten)."""
    from compat.report_html import STATUS_COLORS, _pct

    out_dir = Path(out_dir)
    (out_dir / CSV_NAME).write_text(csv_text(records), encoding="utf-8")
    by_arch: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_arch[str(r.get("architecture") or "unknown")].append(r)
    pages = out_dir / ARCH_DIR
    pages.mkdir(exist_ok=True)
    env = jinja2.Environment(autoescape=True)
    template = env.from_string(ARCH_TEMPLATE)
    links: dict[str, str] = {}
    for arch, recs in sorted(by_arch.items()):
        rows = [
            {
                "model_id": r["model_id"],
                "attributed": ", ".join(i for i in r.get("attributed_ids") or [] if i != r["model_id"]),
                "mode": r["mode"],
                "status": r["status"],
                "color": STATUS_COLORS.get(r["status"], "#666"),
                "cause": CAUSES.get(cause_of(r) or "", ""),
                "detail": _example(r),
            }
            for r in sorted(recs, key=lambda r: (r["model_id"], r["mode"]))
        ]
        name = f"{arch_slug(arch)}.html"
        html = template.render(
            arch=arch,
            date=summary["date"],
            per_mode=summary["per_architecture"].get(arch, {}),
            rows=rows,
            pct=_pct,
        )
        (pages / name).write_text(html, encoding="utf-8")
        links[arch] = f"{ARCH_DIR}/{name}"
    keep = {Path(v).name for v in links.values()}
    for old in pages.glob("*.html"):
        if old.name not in keep:
            old.unlink()
    return links


def lookup_json(records: list[dict]) -> str:
    """The lookup index as JSON safe to inline in a <script> element."""
    text = json.dumps(lookup_index(records), separators=(",", ":"), ensure_ascii=True)
    return text.replace("</", "<\\/")

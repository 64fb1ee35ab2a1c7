"""index.html of a nightly report: one self-contained file (inline CSS, JS and SVG charts, no CDN).

Charts are drawn here as SVG strings so the page needs no script to show them; the only script filters
the model table.
"""

from __future__ import annotations

from html import escape
from typing import Any

import jinja2

MODE_COLORS = {"eager": "#4e79a7", "compiled": "#f28e2b", "defer_and_fuse": "#59a14f", "train": "#b07aa1"}
STATUS_COLORS = {
    "pass": "#1a9850", "fail_accuracy": "#fdae61", "fail_to_run": "#d73027", "compile_fail": "#f46d43",
    "timeout": "#9e0142", "oom": "#762a83", "crash": "#40004b", "harness_error": "#969696",
    "skipped": "#d9d9d9", "eager_nondeterministic": "#bababa",
}  # fmt: skip


# the harness never passes trust_remote_code (transformers' default, False): said in every report
REMOTE_CODE_NOTE = (
    "No code from a model repository was executed: models load with trust_remote_code off, so an "
    "architecture that needs a repository's own code fails to load (a harness error) instead of running it."
)


def _mode_color(mode: str, i: int) -> str:
    return MODE_COLORS.get(mode, ["#76b7b2", "#e15759", "#edc948", "#b07aa1"][i % 4])


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def rate_color(rate: float | None) -> str:
    """Red (0%) → yellow (50%) → green (100%); grey when nothing reached the backend."""
    if rate is None:
        return "#e0e0e0"
    stops = [(0.0, (215, 48, 39)), (0.5, (254, 224, 139)), (1.0, (26, 152, 80))]
    for (x0, c0), (x1, c1) in zip(stops, stops[1:], strict=False):
        if rate <= x1:
            f = (rate - x0) / (x1 - x0)
            r, g, b = (round(a + (b_ - a) * f) for a, b_ in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#1a9850"


def bar_chart(
    chart_id: str, rows: list[tuple[str, dict[str, dict]]], series: list[str], label_w: int = 230
) -> str:
    """Horizontal grouped bars of pass rate: one group per row, one bar per series (mode)."""
    bar_h, gap, width = 14, 10, 420
    group_h = bar_h * len(series) + gap
    height = 30 + group_h * len(rows) + 20
    out = [
        f'<svg id="{escape(chart_id)}" class="chart" xmlns="http://www.w3.org/2000/svg" '
        f'width="{label_w + width + 90}" height="{height}" role="img">'
    ]
    for i, s in enumerate(series):
        x = label_w + i * 130
        out.append(f'<rect x="{x}" y="4" width="12" height="12" fill="{_mode_color(s, i)}"/>')
        out.append(f'<text x="{x + 16}" y="14" class="legend">{escape(s)}</text>')
    for tick in (0, 0.5, 1):
        x = label_w + tick * width
        out.append(f'<line x1="{x}" y1="24" x2="{x}" y2="{height - 16}" class="grid"/>')
        out.append(
            f'<text x="{x}" y="{height - 4}" class="tick" text-anchor="middle">{int(tick * 100)}%</text>'
        )
    for gi, (label, per) in enumerate(rows):
        y0 = 30 + gi * group_h
        out.append(
            f'<text x="{label_w - 6}" y="{y0 + group_h / 2}" class="label" text-anchor="end">{escape(label[:40])}</text>'
        )
        for si, s in enumerate(series):
            t = per.get(s)
            y = y0 + si * bar_h
            if not t:
                continue
            rate = t.get("rate")
            w = (rate or 0) * width
            tip = f"{label} · {s}: {t['pass']}/{t['reached']} pass ({_pct(rate)}); {t['results']} results"
            out.append(
                f'<rect class="bar" x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" '
                f'fill="{_mode_color(s, si)}"><title>{escape(tip)}</title></rect>'
            )
            out.append(
                f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 4}" class="value">{_pct(rate)}</text>'
            )
    out.append("</svg>")
    return "".join(out)


def heat_map(
    per_arch: dict[str, dict[str, dict]],
    modes: list[str],
    label_w: int = 300,
    links: dict[str, str] | None = None,
) -> str:
    """Architecture × mode: each cell coloured by pass rate, the counts in its tooltip; each label links
    to the architecture's page when `links` has one."""
    cell_w, cell_h = 90, 14
    archs = sorted(per_arch)
    height = 24 + cell_h * len(archs)
    out = [
        f'<svg id="heatmap" class="heatmap" xmlns="http://www.w3.org/2000/svg" '
        f'width="{label_w + cell_w * len(modes) + 10}" height="{height}" role="img">'
    ]
    for j, m in enumerate(modes):
        out.append(
            f'<text x="{label_w + j * cell_w + cell_w / 2}" y="16" class="label" text-anchor="middle">{escape(m)}</text>'
        )
    for i, arch in enumerate(archs):
        y = 24 + i * cell_h
        label = f'<text x="{label_w - 6}" y="{y + cell_h - 3}" class="small" text-anchor="end">{escape(arch)}</text>'
        href = (links or {}).get(arch)
        out.append(f'<a class="arch-link" href="{escape(href)}">{label}</a>' if href else label)
        for j, m in enumerate(modes):
            t = per_arch[arch].get(m)
            x = label_w + j * cell_w
            if t is None:
                out.append(
                    f'<rect class="cell" x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="#f5f5f5"/>'
                )
                continue
            statuses = ", ".join(f"{k} {v}" for k, v in t["by_status"].items())
            tip = f"{arch} · {m}: {t['pass']}/{t['reached']} pass ({_pct(t['rate'])}); {statuses}"
            out.append(
                f'<rect class="cell" x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" '
                f'fill="{rate_color(t["rate"])}" data-arch="{escape(arch)}" data-mode="{escape(m)}">'
                f"<title>{escape(tip)}</title></rect>"
            )
    out.append("</svg>")
    return "".join(out)


def line_chart(points: list[dict], modes: list[str]) -> str:
    """Pass rate per mode over the nights found next to this report."""
    width, height, left, top, bottom = 640, 220, 50, 24, 40
    plot_w, plot_h = width - left - 50, height - top - bottom
    n = len(points)
    out = [
        f'<svg id="trend" class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1):
        y = top + plot_h * (1 - tick)
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + plot_w}" y2="{y}" class="grid"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4}" class="tick" text-anchor="end">{int(tick * 100)}%</text>'
        )

    def x_of(i: int) -> float:
        return left + (plot_w / 2 if n == 1 else plot_w * i / (n - 1))

    for i, p in enumerate(points):
        if n <= 12 or i % max(1, n // 12) == 0 or i == n - 1:
            out.append(
                f'<text x="{x_of(i):.1f}" y="{height - 20}" class="tick" text-anchor="middle">{escape(p["date"])}</text>'
            )
    for mi, m in enumerate(modes):
        color = _mode_color(m, mi)
        pts = [(x_of(i), p["rates"].get(m)) for i, p in enumerate(points)]
        coords = [f"{x:.1f},{top + plot_h * (1 - r):.1f}" for x, r in pts if r is not None]
        if len(coords) > 1:
            out.append(
                f'<polyline class="line" points="{" ".join(coords)}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        for (x, r), p in zip(pts, points, strict=True):
            if r is not None:
                out.append(
                    f'<circle cx="{x:.1f}" cy="{top + plot_h * (1 - r):.1f}" r="3.5" fill="{color}">'
                    f"<title>{escape(p['date'])} · {escape(m)}: {_pct(r)}</title></circle>"
                )
        out.append(f'<rect x="{left + mi * 130}" y="{height - 12}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{left + mi * 130 + 14}" y="{height - 3}" class="legend">{escape(m)}</text>')
    out.append("</svg>")
    return "".join(out)


TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Compatibility report {{ s.date }}</title>
<style>
 body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
 h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
 .muted { color: #666; }
 .cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
 .card { border: 1px solid #ddd; border-radius: 8px; padding: 10px 14px; min-width: 150px; }
 .card b { display: block; font-size: 22px; }
 .grid-2 { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
 svg text { font: 11px system-ui, sans-serif; fill: #333; } svg .small { font-size: 10px; }
 svg .grid { stroke: #e5e5e5; } svg .legend { font-size: 12px; }
 .scroll { max-height: 520px; overflow: auto; border: 1px solid #eee; display: inline-block; }
 table { border-collapse: collapse; } th, td { border-bottom: 1px solid #eee; padding: 3px 8px; text-align: left; vertical-align: top; }
 th { background: #fafafa; position: sticky; top: 0; }
 #models td { white-space: nowrap; } #models td.err { white-space: normal; min-width: 260px; max-width: 420px; font-family: ui-monospace, monospace; font-size: 12px; color: #555; }
 .status { padding: 1px 6px; border-radius: 4px; color: #fff; font-size: 12px; white-space: nowrap; }
 .controls { margin: 8px 0; display: flex; gap: 8px; align-items: center; }
 .controls input { width: 320px; padding: 4px 6px; }
 .regress td { background: #fff1f0; }
</style>
</head>
<body>
<h1>Compatibility report {{ s.date }}</h1>
<div class="muted">devices: {{ s.devices|join(", ") or "–" }} · modes: {{ s.modes|join(", ") }}{% if s.previous %} · compared with {{ s.previous }}{% endif %}</div>
<div class="muted" id="remote-code">{{ remote_code_note }}</div>

<div class="cards">
 <div class="card"><b>{{ pct(s.overall.rate) }}</b>pass rate (reached the backend)</div>
 {% for m, c in s.reach.items() %}<div class="card reach" data-mode="{{ m }}"><b>{{ c.reached }} / {{ c.planned }}</b>{{ m }}: configs that reached the backend ({{ pct(c.rate) }}; architectures {{ c.architectures_reached }} / {{ c.architectures }})</div>
 {% endfor %} <div class="card"><b id="n-upstream">{{ s.overall.upstream }}</b>failures upstream (fail on CPU too), {{ s.overall.ours }} ours</div>
 <div class="card"><b>{{ s.totals.results }}</b>results</div>
 <div class="card"><b>{{ s.totals.unique_configs }}</b>unique configs</div>
 <div class="card"><b>{{ s.totals.attributed_models }}</b>attributed models</div>
 <div class="card"><b>{{ s.totals.architectures }}</b>architectures</div>
 {% if changes is not none %}<div class="card"><b id="n-regressions">{{ changes.newly_failing|length }}</b>regressions</div>
 <div class="card"><b>{{ changes.newly_passing|length }}</b>newly passing</div>{% endif %}
 {% if s.coverage.registry is defined %}<div class="card"><b>{{ s.coverage.without_models|length }}</b>of {{ s.coverage.registry }} architectures have no model</div>{% endif %}
</div>

<h2>Does my model work?</h2>
<div class="controls">
 <input id="lookup" type="search" placeholder="a Hub model id, e.g. org/name" autocomplete="off">
 <a id="csv" href="{{ csv_name }}" download>download every result (CSV)</a>
</div>
<div id="lookup-result" class="muted">Type a model id: the answer covers models that share a tested config with another id.</div>
<script id="lookup-data" type="application/json">{{ lookup|safe }}</script>

<div class="grid-2">
 <section><h2>Pass rate per mode</h2>{{ mode_chart|safe }}</section>
 <section><h2>Trend</h2>{{ trend_chart|safe }}</section>
</div>

<h2>Pass rate per task</h2>
{{ task_chart|safe }}

<h2>Pass rate per modality</h2>
{{ modality_chart|safe }}

{% if changes is not none %}
<h2>Regressions</h2>
{% if changes.newly_failing %}
<table id="regressions"><tr><th>model</th><th>architecture</th><th>mode</th><th>before → after</th><th>error</th></tr>
{% for c in changes.newly_failing %}<tr class="regress"><td>{{ c.model_id }}</td><td>{{ c.architecture }}</td><td>{{ c.mode }}</td><td>{{ c.before }} → {{ c.after }}</td><td>{{ c.missing_op or ((c.error_class or "") ~ ": " ~ (c.error or ""))|truncate(240) }}</td></tr>
{% endfor %}</table>
{% else %}<p>No regressions.</p>{% endif %}
{% if changes.newly_passing %}<details><summary>{{ changes.newly_passing|length }} newly passing</summary><ul>
{% for c in changes.newly_passing %}<li>{{ c.model_id }} ({{ c.architecture }}, {{ c.mode }}): {{ c.before }} → pass</li>{% endfor %}
</ul></details>{% endif %}
{% endif %}

<h2>Failure causes</h2>
{% if s.failure_causes %}
<table id="causes"><tr><th>cause</th>{% for m in s.modes %}<th>{{ m }}</th>{% endfor %}<th>models</th><th>examples</th></tr>
{% for c in s.failure_causes %}<tr data-cause="{{ c.cause }}"><td>{{ c.label }}</td>{% for m in s.modes %}<td>{{ c.per_mode.get(m, 0) }}</td>{% endfor %}<td>{{ c.models }}</td><td class="muted">{% if c.phases %}phases: {% for k, v in c.phases.items() %}{{ k }} {{ v }}{% if not loop.last %}, {% endif %}{% endfor %}<br>{% endif %}{% for e in c.examples %}{{ e.model_id }} ({{ e.mode }}): {{ e.detail|truncate(160) }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>
{% endfor %}</table>
{% else %}<p class="muted">Nothing failed.</p>{% endif %}

<h2>Top missing ops</h2>
{% if s.top_missing_ops %}
<table id="missing-ops"><tr><th>op</th><th>models</th><th>results</th><th>modes</th><th>example</th></tr>
{% for o in s.top_missing_ops %}<tr><td><code>{{ o.op }}</code></td><td>{{ o.models }}</td><td>{{ o.results }}</td><td>{{ o.modes|join(", ") }}</td><td>{{ o.example }}</td></tr>{% endfor %}
</table>
{% else %}<p class="muted">No failure named a missing op.</p>{% endif %}

<h2>Architecture × mode</h2>
<div class="muted">cell colour: pass rate (red 0% → green 100%; grey: nothing reached the backend). Hover for counts.</div>
<div class="scroll">{{ heat|safe }}</div>

<h2>Models</h2>
<div class="controls">
 <input id="filter" type="search" placeholder="filter: model id, type, architecture, task, error…" autocomplete="off">
 <select id="status-filter"><option value="">all statuses</option>{% for st in statuses %}<option value="{{ st }}">{{ st }}</option>{% endfor %}</select>
 <select id="mode-filter"><option value="">all modes</option>{% for m in s.modes %}<option value="{{ m }}">{{ m }}</option>{% endfor %}</select>
 <span id="shown" class="muted">{{ rows|length }} rows</span>
</div>
<div class="scroll" style="display:block">
<table id="models">
<thead><tr><th>model</th><th>+attributed</th><th>model_type</th><th>architecture</th><th>task</th><th>modality</th><th>mode</th><th>status</th><th>missing op / error</th><th>load s</th><th>1st call s</th><th>steady s</th><th>peak MB</th></tr></thead>
<tbody>
{% for r in rows %}<tr data-status="{{ r.status }}" data-mode="{{ r.mode }}"><td>{{ r.model_id }}</td><td>{{ r.n_attr }}</td><td>{{ r.model_type or "" }}</td><td>{% if links.get(r.architecture) %}<a href="{{ links[r.architecture] }}">{{ r.architecture }}</a>{% else %}{{ r.architecture or "" }}{% endif %}</td><td>{{ r.task or "" }}</td><td>{{ r.modality or "" }}</td><td>{{ r.mode }}</td><td><span class="status" style="background:{{ r.color }}">{{ r.status }}</span></td><td class="err">{{ r.detail }}</td><td>{{ r.load }}</td><td>{{ r.first }}</td><td>{{ r.steady }}</td><td>{{ r.mem }}</td></tr>
{% endfor %}</tbody>
</table>
</div>

<script>
(function () {
  var input = document.getElementById("filter"), st = document.getElementById("status-filter"),
      md = document.getElementById("mode-filter"), shown = document.getElementById("shown");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#models tbody tr"));
  var text = rows.map(function (r) { return r.textContent.toLowerCase(); });
  function apply() {
    var q = input.value.trim().toLowerCase().split(/\\s+/).filter(Boolean), s = st.value, m = md.value, n = 0;
    rows.forEach(function (r, i) {
      var ok = (!s || r.dataset.status === s) && (!m || r.dataset.mode === m) &&
               q.every(function (w) { return text[i].indexOf(w) !== -1; });
      r.style.display = ok ? "" : "none"; if (ok) n++;
    });
    shown.textContent = n + " of " + rows.length + " rows";
  }
  input.addEventListener("input", apply); st.addEventListener("change", apply); md.addEventListener("change", apply);
  var h = new URLSearchParams(location.search).get("q"); if (h) { input.value = h; apply(); }
})();
(function () {
  var data = JSON.parse(document.getElementById("lookup-data").textContent);
  var input = document.getElementById("lookup"), out = document.getElementById("lookup-result");
  function esc(s) { var d = document.createElement("div"); d.textContent = s; return d.innerHTML; }
  function answer() {
    var id = input.value.trim().toLowerCase();
    if (!id) { return; }
    var hits = data[id];
    if (!hits) {
      out.className = "muted"; out.setAttribute("data-found", "0");
      out.innerHTML = esc(input.value.trim()) + " is not in tonight's sample.";
      return;
    }
    var ok = hits.filter(function (h) { return h[1] === "pass"; }).length;
    out.className = ""; out.setAttribute("data-found", String(hits.length)); out.setAttribute("data-pass", String(ok));
    out.innerHTML = "<b>" + esc(input.value.trim()) + "</b>: " + ok + " of " + hits.length + " runs pass<ul>" +
      hits.map(function (h) {
        return "<li>" + esc(h[0]) + ": <b>" + esc(h[1]) + "</b> (" + esc(h[2]) +
               (h[3].toLowerCase() !== id ? ", tested as " + esc(h[3]) : "") + ")</li>";
      }).join("") + "</ul>";
  }
  input.addEventListener("input", answer);
  var m = new URLSearchParams(location.search).get("model"); if (m) { input.value = m; answer(); }
})();
</script>
</body>
</html>
"""


def _fmt(x: Any) -> str:
    return "" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)


def table_rows(records: list[dict]) -> list[dict]:
    """Model-table rows, sorted by model, architecture and mode."""
    out = []
    for r in sorted(records, key=lambda r: (r["model_id"], str(r.get("architecture")), r["mode"])):
        times = r.get("times") or {}
        detail = r.get("missing_op") or ": ".join(x for x in (r.get("error_class"), r.get("error")) if x)
        if r.get("cause") == "upstream":
            detail = f"[upstream: fails on CPU too] {detail or ''}"
        mem = r.get("peak_mem_bytes")
        out.append(
            {
                **{
                    k: r.get(k)
                    for k in ("model_id", "model_type", "architecture", "task", "modality", "mode", "status")
                },
                "n_attr": len([i for i in r.get("attributed_ids") or [] if i != r["model_id"]]),
                "color": STATUS_COLORS.get(r["status"], "#666"),
                "detail": (detail or "")[:300],
                "load": _fmt(times.get("load_s")),
                "first": _fmt(times.get("first_call_s")),
                "steady": _fmt(times.get("steady_s")),
                "mem": f"{mem / 2**20:.0f}" if isinstance(mem, (int, float)) else "",
            }
        )
    return out


def render_html(
    summary: dict[str, Any],
    records: list[dict],
    points: list[dict],
    changes: dict[str, list[dict]] | None,
    links: dict[str, str] | None = None,
    lookup: str = "{}",
    csv_name: str = "results.csv",
) -> str:
    """The whole page as one string; `links` maps architectures to their pages, `lookup` is the model-id
    index as JSON and `csv_name` the CSV beside the page (all from compat.report_pages)."""
    from compat.records import STATUSES

    modes = summary["modes"]

    def labelled(groups: dict[str, dict[str, dict]]) -> list[tuple[str, dict[str, dict]]]:
        return [
            (f"{k} ({max(t['results'] for t in per.values())})", per) for k, per in sorted(groups.items())
        ]

    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined)
    return env.from_string(TEMPLATE).render(
        s=summary,
        pct=_pct,
        changes=changes,
        statuses=STATUSES,
        rows=table_rows(records),
        mode_chart=bar_chart(
            "chart-modes", [(m, {m: t}) for m, t in summary["per_mode"].items()], modes, label_w=120
        ),
        task_chart=bar_chart("chart-tasks", labelled(summary["per_task"]), modes),
        modality_chart=bar_chart("chart-modalities", labelled(summary["per_modality"]), modes, label_w=140),
        heat=heat_map(summary["per_architecture"], modes, links=links),
        links=links or {},
        lookup=lookup,
        csv_name=csv_name,
        trend_chart=line_chart(points, modes),
        remote_code_note=REMOTE_CODE_NOTE,
    )

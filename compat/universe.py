"""The universe of Hub models: `python -m compat snapshot`.

Merges, by model id and in a fixed priority, (a) Hub API pages stored by `--refresh`, (b) the Hub model
lists copied into `model_lists/sources/` (see PROVENANCE.md there), (c) the checkpoint ids named in the
installed transformers/diffusers sources. Writes `model_lists/snapshot.jsonl` (sorted by id, one fixed
field order: the same inputs give the same bytes) and the architecture registry
`model_lists/architectures.jsonl` with each architecture's model count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compat import docscan, registry, sources
from compat.entries import entries_for_record
from compat.jsonl import iter_jsonl, write_jsonl

log = logging.getLogger("compat")

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_LISTS = REPO_ROOT / "model_lists"
SOURCES_DIR = MODEL_LISTS / "sources"
SNAPSHOT = MODEL_LISTS / "snapshot.jsonl"
ARCHITECTURES = MODEL_LISTS / "architectures.jsonl"
HUB_API_FILE = "hub_api.jsonl"

FIELDS = [
    "id", "model_type", "architectures", "task", "library", "downloads", "likes", "created_at",
    "last_modified", "params", "source", "sources", "doc_architectures", "subfolders",
]  # fmt: skip

# (source name, file in model_lists/sources/, reader) in merge priority: newer and richer first.
SOURCE_FILES: list[tuple[str, str, str]] = [
    ("hub-api", HUB_API_FILE, "hub_api"),
    ("hub-2026-04", "hub_models_2026-04_top5000.csv", "hub_2026"),
    ("torchtpu-2026", "torchtpu_bench_models_2026.csv", "torchtpu"),
    ("hub-2022-02", "hub_models_2022-02.csv", "hub_2022"),
    ("openvino-tests", "openvino_model_hub_tests.csv", "openvino"),
    ("shark-tests", "shark_task_model_lists.csv", "shark"),
]
DOC_SOURCES = ["transformers-docs", "diffusers-docs"]
PRIORITY = [s[0] for s in SOURCE_FILES] + DOC_SOURCES


def known_model_types() -> set[str]:
    """Every model_type the installed transformers knows (CONFIG_MAPPING_NAMES)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return set(CONFIG_MAPPING_NAMES)


def read_sources(sources_dir: Path, known_types: set[str]) -> Iterator[dict]:
    """Partial records of every input file present, in priority order; a missing file is a warning."""
    readers: dict[str, Callable[..., Iterator[dict]]] = {
        "hub_api": lambda p, s: sources.read_hub_api(p, s),
        "hub_2026": lambda p, s: sources.read_hub_2026(p, known_types, s),
        "torchtpu": lambda p, s: sources.read_torchtpu(p, s),
        "hub_2022": lambda p, s: sources.read_hub_2022(p, s),
        "openvino": lambda p, s: sources.read_openvino(p, s),
        "shark": lambda p, s: sources.read_shark(p, s),
    }
    for name, filename, kind in SOURCE_FILES:
        path = sources_dir / filename
        if not path.exists():
            if name != "hub-api":  # only present after a --refresh
                log.warning("%s: input missing; the snapshot is built without %s", path, name)
            continue
        yield from readers[kind](path, name)


# ------------------------------------------------------------------------------------------- doc records


@dataclass
class DocScan:
    """Everything the installed packages' sources say (docscan), ready to turn into records."""

    configs: dict[str, docscan.ConfigDoc] = field(default_factory=dict)
    classes: dict[str, docscan.ClassDoc] = field(default_factory=dict)
    pipeline_ids: dict[str, list[str]] = field(default_factory=dict)
    model_ids: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)


def doc_records(scan: DocScan, arch_entries: Iterable[dict]) -> list[dict]:
    """Records for ids the packages name: each registry class gets its own checkpoint, else its type's."""
    type_ids: dict[str, list[str]] = {}
    type_fields: dict[str, dict] = {}
    for c in scan.configs.values():
        type_ids.setdefault(c.model_type, []).extend(c.checkpoints)
        type_fields.setdefault(c.model_type, {}).update(c.fields)

    recs: dict[str, dict] = {}

    def add(
        model_id: str, source: str, arch: str, model_type: str | None, subfolder: str | None = None
    ) -> None:
        r = recs.setdefault(
            model_id,
            {"id": model_id, "source": source, "library": None, "doc_architectures": [], "_types": []},
        )
        r["library"] = r["library"] or ("diffusers" if source == "diffusers-docs" else "transformers")
        if arch not in r["doc_architectures"]:
            r["doc_architectures"].append(arch)
        if model_type:
            r["_types"].append(model_type)
        if subfolder:
            r.setdefault("subfolders", {})[arch] = subfolder

    for e in sorted(arch_entries, key=lambda e: e["name"]):
        name = e["name"]
        if e["library"] == "transformers":
            doc = scan.classes.get(name)
            ids = (doc.checkpoints or doc.module_checkpoints) if doc else []
            ids = ids or type_ids.get(e["model_type"], [])
            if ids:
                add(ids[0], "transformers-docs", name, e["model_type"])
        elif e["kind"] == "pipeline" and scan.pipeline_ids.get(name):
            add(scan.pipeline_ids[name][0], "diffusers-docs", name, None)
        elif e["kind"] == "model" and scan.model_ids.get(name):
            model_id, sub = scan.model_ids[name][0]
            add(model_id, "diffusers-docs", name, None, sub)

    out = []
    for r in recs.values():
        types = sorted(set(r.pop("_types")), key=lambda t: (len(t), t))
        r["model_type"] = types[0] if types else None
        r["params"] = (
            docscan.estimate_params(type_fields.get(r["model_type"], {})) if r["model_type"] else None
        )
        r["doc_architectures"] = sorted(r["doc_architectures"])
        out.append(r)
    return out


# ------------------------------------------------------------------------------------------------- merge


def merge(partials: Iterable[dict]) -> dict[str, dict]:
    """Records by id: the first (highest-priority) non-empty value of each field wins; lists of docs union."""
    out: dict[str, dict] = {}
    for p in partials:
        rec = out.get(p["id"])
        if rec is None:
            rec = out[p["id"]] = {k: None for k in FIELDS}
            rec.update(id=p["id"], architectures=[], sources=[], doc_architectures=[], subfolders={})
        for k in (
            "model_type",
            "task",
            "library",
            "downloads",
            "likes",
            "created_at",
            "last_modified",
            "params",
        ):
            if rec[k] in (None, "") and p.get(k) not in (None, ""):
                rec[k] = p[k]
        if not rec["architectures"] and p.get("architectures"):
            rec["architectures"] = list(dict.fromkeys(p["architectures"]))
        if p.get("source") and p["source"] not in rec["sources"]:
            rec["sources"].append(p["source"])
        for a in p.get("doc_architectures") or []:
            if a not in rec["doc_architectures"]:
                rec["doc_architectures"].append(a)
        rec["subfolders"].update(p.get("subfolders") or {})
    for rec in out.values():
        rec["sources"].sort(key=lambda s: PRIORITY.index(s) if s in PRIORITY else len(PRIORITY))
        rec["source"] = rec["sources"][0] if rec["sources"] else None
        rec["doc_architectures"] = sorted(rec["doc_architectures"])
        # no source names a library: a config model_type means transformers can read it
        rec["library"] = rec["library"] or ("transformers" if rec["model_type"] else "other")
    return out


def infer_missing_architectures(records: dict[str, dict], arch_entries: list[dict]) -> int:
    """Give a record with a model_type but no class the class its pipeline tag implies; returns how many."""
    types = registry.by_model_type(arch_entries)
    n = 0
    for rec in records.values():
        if rec["architectures"] or not rec["model_type"] or rec["library"] == "diffusers":
            continue
        arch = registry.infer_architecture(rec["model_type"], rec["task"], types)
        if arch:
            rec["architectures"] = [arch]
            n += 1
    return n


def count_models(records: Iterable[dict], arch_entries: list[dict]) -> list[dict]:
    """Registry entries with `n_models`: distinct ids that can exercise each architecture."""
    reg = {e["name"]: e for e in arch_entries}
    ids: dict[str, set[str]] = {name: set() for name in reg}
    for rec in records:
        for name in (rec.get("architectures") or []) + (rec.get("doc_architectures") or []):
            if name in ids and reg[name]["kind"] == "pipeline":
                ids[name].add(rec["id"])
        for e in entries_for_record(rec, reg):
            ids[e["architecture"]].add(rec["id"])
    return [{**e, "n_models": len(ids[e["name"]])} for e in arch_entries]


# ------------------------------------------------------------------------------------------------- build


@dataclass
class Universe:
    """A built snapshot: records (sorted by id), the registry with model counts, and build statistics."""

    records: list[dict]
    architectures: list[dict]
    stats: dict[str, Any]


def scan_packages(with_diffusers: bool = True) -> tuple[DocScan, tuple[dict, dict] | None]:
    """Read checkpoint ids and config defaults from the installed transformers (and diffusers)."""
    root = docscan.transformers_models_root()
    scan = DocScan(docscan.scan_configs(root), docscan.scan_model_classes(root))
    diff = None
    if with_diffusers:
        diff = registry.diffusers_classes()
        scan.pipeline_ids = docscan.diffusers_pipeline_ids(diff[1])
        scan.model_ids = docscan.diffusers_model_ids(diff[0], diff[1])
    return scan, diff


def build_universe(
    sources_dir: Path = SOURCES_DIR,
    scan: DocScan | None = None,
    diffusers: tuple[dict, dict] | None = None,
    known_types: set[str] | None = None,
    arch_entries: list[dict] | None = None,
) -> Universe:
    """Merge every input into the snapshot; pass `scan`/`arch_entries` to build from fixtures."""
    known_types = known_model_types() if known_types is None else known_types
    scan = scan or DocScan()
    if arch_entries is None:
        arch_entries = registry.build_registry(scan.configs, scan.classes, diffusers)
    partials = list(read_sources(Path(sources_dir), known_types))
    partials += doc_records(scan, arch_entries)
    partials.sort(key=lambda p: PRIORITY.index(p["source"]) if p["source"] in PRIORITY else len(PRIORITY))
    records = merge(partials)
    inferred = infer_missing_architectures(records, arch_entries)
    ordered = [{k: records[i][k] for k in FIELDS} for i in sorted(records)]
    archs = count_models(ordered, arch_entries)
    stats = {
        "models": len(ordered),
        "by_source": _count(s for r in ordered for s in r["sources"]),
        "by_library": _count(r["library"] for r in ordered),
        "with_model_type": sum(1 for r in ordered if r["model_type"]),
        "architectures_inferred": inferred,
        "architectures": len(archs),
        "architectures_with_models": sum(1 for a in archs if a["n_models"]),
        "model_types": len({r["model_type"] for r in ordered if r["model_type"]}),
    }
    return Universe(ordered, archs, stats)


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def refresh_hub(sources_dir: Path, limit: int, api: Any = None) -> Path:
    """Fetch Hub API pages and store them as `sources/hub_api.jsonl` (+ .meta.json) for reproducible builds."""
    rows = sources.fetch_hub(limit, api=api)
    path = Path(sources_dir) / HUB_API_FILE
    write_jsonl(path, rows)
    meta = {
        "fetched_at": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "query": {"libraries": list(sources.LIBRARIES), "sort": "downloads", "limit_per_library": limit},
        "expand": sources.HUB_EXPAND,
        "rows": len(rows),
        "sha256": sha256(path),
    }
    path.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return path


def sha256(path: str | os.PathLike) -> str:
    """Hex digest of a file (PROVENANCE.md records one per input)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_universe(u: Universe, out: Path = SNAPSHOT, arch_out: Path | None = None) -> tuple[Path, Path]:
    """Write snapshot.jsonl and architectures.jsonl (next to it unless told otherwise)."""
    out = Path(out)
    arch_out = Path(arch_out) if arch_out else out.with_name("architectures.jsonl")
    write_jsonl(out, u.records)
    write_jsonl(arch_out, u.architectures)
    return out, arch_out


def load_snapshot(path: str | os.PathLike = SNAPSHOT) -> dict[str, dict]:
    """Snapshot records by id; malformed lines are warned about (file:line) and skipped."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"snapshot {path} not found: run `python -m compat snapshot` first")
    out = {}
    for lineno, rec in iter_jsonl(path, "snapshot"):
        if isinstance(rec.get("id"), str) and rec["id"]:
            out[rec["id"]] = rec
        else:
            log.warning("%s:%d: snapshot record without an id skipped", path, lineno)
    return out

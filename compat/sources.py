"""Readers for the snapshot's inputs: the copied Hub model lists and recorded Hub API pages.

Every reader yields partial records with the snapshot's fields (see universe.FIELDS) plus `tags`, which
the merge uses and then drops. A row that cannot be read is a warning naming file and line, then skipped.
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compat.jsonl import iter_jsonl

log = logging.getLogger("compat")

LIBRARIES = ("transformers", "diffusers", "sentence-transformers", "timm")
# Formats transformers/diffusers cannot load as-is (a repo holding only these is not runnable here).
NON_TORCH_FORMATS = {
    "gguf", "mlx", "ctranslate2", "llama.cpp", "llama-cpp", "ggml", "onnx", "coreml", "mlc-llm",
    "tensorrt", "litert-lm", "openvino", "tflite", "keras", "tf", "jax", "rust", "whisperkit",
}  # fmt: skip
TORCH_FORMATS = {"safetensors", "pytorch"}
# Model types that are also language codes or common words used as tags (DESIGN data README).
AMBIGUOUS_TYPES = {"rag", "blt", "git"}
# "-7B", "_1.5b", "-350M", "-8x7B" (not "4k": that is a context length more often than a size)
SIZE_RE = re.compile(r"(?:^|[-_/.\s])(?:(\d+)[xX])?(\d+(?:\.\d+)?)\s*([bBmM])(?=$|[-_.\s])")


class RowError(ValueError):
    """A row of an input file that cannot be read."""


def norm_time(value: Any) -> str | None:
    """ISO 8601 UTC with seconds ('2022-03-02T23:29:05+00:00'); the inputs spell times three ways."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip().replace(" ", "T", 1))
        except ValueError as e:
            raise RowError(f"bad timestamp {value!r}") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).replace(microsecond=0).isoformat()


def to_int(value: Any, name: str) -> int | None:
    """An optional non-negative count; '' → None, anything non-numeric is a row error naming the column."""
    if value in (None, ""):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError) as e:
        raise RowError(f"{name} is not a number: {value!r}") from e
    if f < 0 or f != f:
        raise RowError(f"{name} is negative or NaN: {value!r}")
    return int(f)


def params_from_name(model_id: str) -> int | None:
    """A size the id states ('Llama-3.2-1B', 'gpt-neo-125M', 'Mixtral-8x7B': experts × size), else None."""
    name = model_id.rsplit("/", 1)[-1]
    m = SIZE_RE.search(name)
    if not m:
        return None
    scale = {"b": 1e9, "m": 1e6}[m.group(3).lower()]
    n = int(int(m.group(1) or 1) * float(m.group(2)) * scale)
    return n if n >= 1_000_000 else None


def normalize_library(library_name: str | None, tags: Iterable[str]) -> str | None:
    """transformers / diffusers / sentence-transformers / timm / other: what can load the repo's weights.

    None when the row does not say (no library name, no library tag): another source may know.
    """
    tags = {t.lower() for t in tags}
    lib = (library_name or "").strip().lower()
    if not (tags & TORCH_FORMATS) and ("gguf" in tags or lib in NON_TORCH_FORMATS):
        return "other"
    if lib in LIBRARIES:
        return lib
    if not lib:
        for candidate in LIBRARIES:
            if candidate in tags:
                return candidate
        return None
    return "other"


def loadable_library(library: str | None, model_type: str | None, tags: Iterable[str]) -> str | None:
    """A repo with torch weights and a config model_type loads with transformers, whatever its card says.

    (Cards name vllm, mistral-common, nemo, ... as the library of plain transformers checkpoints; the Hub
    only tags a model_type it read from config.json.)
    """
    if library == "other" and model_type and {t.lower() for t in tags} & TORCH_FORMATS:
        return "transformers"
    return library


def model_type_from_tags(tags: list[str], library: str | None, known: set[str]) -> str | None:
    """The config's model_type among a 2026 record's tags.

    The Hub puts it among the first tags (after library and weight formats); language codes come later
    and some collide with type names (`rag`, `blt`, `git`). The first known type wins; an ambiguous one
    only counts for a transformers library among the leading tags.
    """
    if library == "timm" and "timm_wrapper" in known:
        return "timm_wrapper"
    for i, tag in enumerate(tags):
        if tag not in known:
            continue
        ambiguous = tag in AMBIGUOUS_TYPES or (len(tag) <= 3 and tag.isalpha())
        if ambiguous and not (library in ("transformers", "sentence-transformers") and i < 12):
            continue
        return tag
    return None


def read_csv_rows(path: Path, required: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV; a row with a missing column or the wrong width is warned and skipped."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            log.warning("%s: header lacks columns %s; file skipped", path, ", ".join(missing))
            return
        width = len(reader.fieldnames or [])
        for row in reader:
            lineno = reader.line_num
            if None in row or any(v is None for v in row.values()) or len(row) != width:
                log.warning("%s:%d: malformed row skipped (expected %d columns)", path, lineno, width)
                continue
            yield lineno, row


def _guarded(
    path: Path, rows: Iterator[tuple[int, Any]], parse: Callable[[Any], dict | None]
) -> Iterator[dict]:
    for lineno, row in rows:
        try:
            rec = parse(row)
        except RowError as e:
            log.warning("%s:%d: malformed row skipped (%s)", path, lineno, e)
            continue
        if rec is not None:
            if str(rec.get("task") or "").lower() in ("unknown", "none", "null"):
                rec["task"] = None
            yield rec


def _base(model_id: str, source: str) -> dict:
    model_id = (model_id or "").strip()
    if not model_id:
        raise RowError("empty model id")
    return {"id": model_id, "source": source}


def read_hub_2026(path: Path, known_types: set[str], source: str = "hub-2026-04") -> Iterator[dict]:
    """The 2026 top-downloads list: model_type from tags, diffusers pipeline from `diffusers:X` tags."""

    def parse(row: dict[str, str]) -> dict:
        rec = _base(row["model_id"], source)
        tags = [t.strip() for t in row["tags"].split(",") if t.strip()]
        lib = normalize_library(row["library_name"], tags)
        pipes = [t.split(":", 1)[1] for t in tags if t.startswith("diffusers:")]
        model_type = model_type_from_tags(tags, lib, known_types) if lib != "diffusers" else None
        rec.update(
            model_type=model_type,
            architectures=pipes[:1],
            task=row["pipeline_tag"] or None,
            library=loadable_library(lib, model_type, tags),
            downloads=to_int(row["downloads"], "downloads"),
            likes=to_int(row["likes"], "likes"),
            created_at=norm_time(row["created_at"]),
            last_modified=norm_time(row["last_modified"]),
            params=params_from_name(rec["id"]),
            tags=tags,
        )
        return rec

    cols = [
        "model_id",
        "downloads",
        "likes",
        "pipeline_tag",
        "library_name",
        "created_at",
        "last_modified",
        "tags",
    ]
    return _guarded(path, read_csv_rows(path, cols), parse)


def read_hub_2022(path: Path, source: str = "hub-2022-02") -> Iterator[dict]:
    """The 2022 full listing: model_type and architectures straight from each config.json."""

    def parse(row: dict[str, str]) -> dict:
        rec = _base(row["model_id"], source)
        tags = [t for t in row["tags"].split("|") if t]
        rec.update(
            model_type=row["model_type"] or None,
            architectures=[a for a in row["architectures"].split("|") if a],
            task=row["pipeline_tag"] or None,
            library=normalize_library(row["library_name"], tags),
            downloads=to_int(row["downloads"], "downloads"),
            likes=to_int(row["likes"], "likes"),
            created_at=None,
            last_modified=norm_time(row["last_modified"]),
            params=params_from_name(rec["id"]),
            tags=tags,
        )
        return rec

    cols = ["model_id", "last_modified", "pipeline_tag", "library_name", "downloads", "likes", "model_type"]
    return _guarded(path, read_csv_rows(path, [*cols, "architectures", "tags"]), parse)


def read_torchtpu(path: Path, source: str = "torchtpu-2026") -> Iterator[dict]:
    """TorchTPU's benchmark list: model_type (a pipeline class for diffusers) and a parameter estimate."""

    def parse(row: dict[str, str]) -> dict:
        rec = _base(row["model_id"], source)
        lib = normalize_library(row["provider"], [])
        mt = row["model_type"] or None
        rec.update(
            model_type=None if lib == "diffusers" else mt,
            architectures=[mt] if lib == "diffusers" and mt else [],
            task=row["pipeline_tag"] or None,
            library=lib,
            downloads=to_int(row["downloads"], "downloads"),
            likes=to_int(row["likes"], "likes"),
            created_at=norm_time(row["created_at"]),
            last_modified=None,
            params=to_int(row["params_est"], "params_est") or params_from_name(rec["id"]),
            tags=[],
        )
        return rec

    cols = [
        "model_id",
        "provider",
        "model_type",
        "pipeline_tag",
        "downloads",
        "likes",
        "created_at",
        "params_est",
    ]
    return _guarded(path, read_csv_rows(path, cols), parse)


def read_openvino(path: Path, source: str = "openvino-tests") -> Iterator[dict]:
    """OpenVINO's model-hub test list: about one transformers id per model_type (first row per id)."""
    seen: set[str] = set()

    def parse(row: dict[str, str]) -> dict | None:
        rec = _base(row["model_id"], source)
        if rec["id"] in seen:
            return None
        seen.add(rec["id"])
        rec.update(model_type=row["model_type"] or None, library="transformers", tags=[])
        return rec

    return _guarded(path, read_csv_rows(path, ["model_id", "model_type"]), parse)


def read_shark(path: Path, source: str = "shark-tests") -> Iterator[dict]:
    """SHARK's per-task lists: ids and tasks only (other sources supply the rest)."""
    seen: set[str] = set()

    def parse(row: dict[str, str]) -> dict | None:
        rec = _base(row["model_id"], source)
        if rec["id"] in seen:
            return None
        seen.add(rec["id"])
        rec.update(task=row["task"] or None, tags=[])
        return rec

    return _guarded(path, read_csv_rows(path, ["task", "model_id"]), parse)


# ------------------------------------------------------------------------------------------------ Hub API

HUB_EXPAND = [
    "config", "createdAt", "downloads", "lastModified", "library_name", "likes", "pipeline_tag",
    "safetensors", "tags",
]  # fmt: skip


def hub_record(info: Any) -> dict:
    """A normalized `hub_api.jsonl` line from a huggingface_hub ModelInfo (what `--refresh` stores)."""
    config = getattr(info, "config", None) or {}
    st = getattr(info, "safetensors", None)
    total = getattr(st, "total", None) if st is not None else None
    diff = config.get("diffusers") if isinstance(config.get("diffusers"), dict) else {}
    archs = config.get("architectures") or []
    if diff.get("_class_name"):
        archs = [diff["_class_name"]]
    return {
        "id": info.id,
        "model_type": config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        "architectures": [a for a in archs if isinstance(a, str)],
        "task": getattr(info, "pipeline_tag", None),
        "library_name": getattr(info, "library_name", None),
        "downloads": getattr(info, "downloads", None),
        "likes": getattr(info, "likes", None),
        "created_at": norm_time(getattr(info, "created_at", None)),
        "last_modified": norm_time(getattr(info, "last_modified", None)),
        "params": total,
        "tags": sorted(getattr(info, "tags", None) or []),
    }


def fetch_hub(limit: int, libraries: Iterable[str] = LIBRARIES, api: Any = None) -> list[dict]:
    """The `limit` most downloaded models of each library from the Hub API, normalized and sorted by id."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    by_id: dict[str, dict] = {}
    for lib in libraries:
        # a library is a filter tag (huggingface_hub 1.x dropped list_models' `library=`)
        for info in api.list_models(filter=lib, sort="downloads", limit=limit, expand=HUB_EXPAND):
            by_id.setdefault(info.id, hub_record(info))
    return [by_id[k] for k in sorted(by_id)]


def read_hub_api(path: Path, source: str = "hub-api") -> Iterator[dict]:
    """A `hub_api.jsonl` written by `compat snapshot --refresh`."""

    def parse(obj: dict) -> dict:
        rec = _base(obj.get("id") or "", source)
        tags = obj.get("tags") or []
        archs = obj.get("architectures") or []
        if not isinstance(tags, list) or not isinstance(archs, list):
            raise RowError("tags/architectures are not lists")
        lib = normalize_library(obj.get("library_name"), tags)
        model_type = obj.get("model_type") if lib != "diffusers" else None
        rec.update(
            model_type=model_type,
            architectures=archs,
            task=obj.get("task"),
            library=loadable_library(lib, model_type, tags),
            downloads=to_int(obj.get("downloads"), "downloads"),
            likes=to_int(obj.get("likes"), "likes"),
            created_at=norm_time(obj.get("created_at")),
            last_modified=norm_time(obj.get("last_modified")),
            params=to_int(obj.get("params"), "params") or params_from_name(rec["id"]),
            tags=tags,
        )
        return rec

    return _guarded(path, iter_jsonl(path, "Hub API"), parse)

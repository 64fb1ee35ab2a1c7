"""``compat merge DIR... --out OUT``: the shards of one night, as the one run they split.

CI runs ``compat run --shard i/N`` on N machines; each shard's directory holds its ``results.jsonl`` and
``run.json``. Merging refuses shards of different runs (sample, night, modes, device, tier) or different
splits, and missing shards unless asked, because a report over a mixed or partial set would publish
numbers no run produced. Records are deduplicated: the same (model, mode) twice (a retried shard
uploaded twice) keeps the last; one shrunk config that two shards each ran (its models hashed apart)
becomes one record attributed to all of them when both agree on the status, as an unsharded run records it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat import manifest
from compat.records import Record
from compat.results import read_records, set_aside

log = logging.getLogger("compat")


class MergeError(ValueError):
    """The directories are not the shards of one run (the message says how they differ)."""


@dataclass
class MergeResult:
    """What ``merge_shards`` wrote."""

    out_dir: Path
    records: list[dict[str, Any]]
    manifest: dict[str, Any]
    duplicates: int = 0
    folded: int = 0
    missing_shards: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        m = self.manifest
        text = (
            f"merged {len(m['merged_from'])} shard(s) of {m['sample']} ({m['date']}): "
            f"{len(self.records)} results ({self.duplicates} duplicates dropped, {self.folded} shared "
            f"configs folded) → {self.out_dir / 'results.jsonl'}"
        )
        if self.missing_shards:
            text += f"; PARTIAL: shards {', '.join(self.missing_shards)} missing"
        return text


def _load_shard(d: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if not d.is_dir():
        raise MergeError(f"{d}: not a directory")
    if not (d / "results.jsonl").exists():
        raise MergeError(f"{d}: no results.jsonl (not the output of `compat run`)")
    man = manifest.read(d)
    if man is None:
        raise MergeError(
            f"{d}: no {manifest.MANIFEST}: only directories written by `compat run` can be merged"
        )
    return man, read_records(d / "results.jsonl")


def _check_same_run(shards: list[tuple[Path, dict[str, Any]]]) -> None:
    first_dir, first = shards[0]
    for d, man in shards[1:]:
        bad = manifest.differences(first, man)
        if not bad:
            continue
        if "sample_sha256" in bad:
            raise MergeError(
                f"refusing to merge shards of different samples: {first.get('sample')!r} "
                f"({str(first.get('sample_sha256'))[:12]}, {first.get('entries')} entries) in {first_dir}, "
                f"{man.get('sample')!r} ({str(man.get('sample_sha256'))[:12]}, {man.get('entries')} entries) in {d}"
            )
        what = "; ".join(f"{f} {first.get(f)!r} in {first_dir}, {man.get(f)!r} in {d}" for f in bad)
        noun = "nights" if bad == ["date"] else "runs"
        raise MergeError(f"refusing to merge shards of different {noun}: {what}")


def _split(shards: list[tuple[Path, dict[str, Any]]]) -> tuple[int, set[int]]:
    """N and the shard indices present; every shard must come from the same N-way split."""
    ns: dict[int, Path] = {}
    present: set[int] = set()
    for d, man in shards:
        spec = man.get("shard") or "0/1"
        i, n = (int(x) for x in str(spec).split("/"))
        ns.setdefault(n, d)
        present.add(i)
    if len(ns) > 1:
        listed = ", ".join(f"{n}-way ({d})" for n, d in sorted(ns.items()))
        raise MergeError(f"refusing to merge shards of different splits: {listed}")
    return next(iter(ns)), present


def _dedup(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The last record per (model, architecture, mode, device), in first-seen order."""
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:
        latest[(r.get("model_id"), r.get("architecture"), r.get("mode"), r.get("device"))] = r
    return list(latest.values()), len(records) - len(latest)


def _fold(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """One record per shared config and mode when the shards agree on its status."""
    out: list[dict[str, Any]] = []
    by_key: dict[tuple, dict[str, Any]] = {}
    folded = 0
    for r in records:
        key = (r.get("dedup_key"), r.get("architecture"), r.get("mode"), r.get("device"), r.get("status"))
        keep = by_key.get(key) if r.get("dedup_key") else None
        if keep is None:
            r = {**r, "attributed_ids": list(r.get("attributed_ids") or [])}
            by_key[key] = r
            out.append(r)
            continue
        ids = keep["attributed_ids"] or [keep["model_id"]]
        for mid in [r["model_id"], *(r.get("attributed_ids") or [])]:
            if mid not in ids:
                ids.append(mid)
        keep["attributed_ids"] = ids
        folded += 1
    return out, folded


def merge_shards(
    dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str], allow_partial: bool = False
) -> MergeResult:
    """Merge shard directories into ``out_dir/results.jsonl`` (+ run.json); MergeError when they don't fit."""
    paths = list(dict.fromkeys(Path(d).resolve() for d in dirs))
    if not paths:
        raise MergeError("nothing to merge: name the shard directories")
    out = Path(out_dir).resolve()
    if out in paths:
        raise MergeError(f"--out {out_dir} is one of the shards: merge into a directory of its own")
    loaded = [(d, *_load_shard(d)) for d in paths]
    loaded.sort(key=lambda t: (str(t[1].get("shard") or ""), str(t[0])))
    shards = [(d, man) for d, man, _ in loaded]
    _check_same_run(shards)
    n, present = _split(shards)
    missing = [f"{i}/{n}" for i in range(n) if i not in present]
    if missing and not allow_partial:
        raise MergeError(
            f"shards {', '.join(missing)} of {n} are missing: a partial night would report numbers no run "
            "produced (pass --allow-partial to merge what is here, marked partial)"
        )
    records, duplicates = _dedup([r for _, _, recs in loaded for r in recs])
    records, folded = _fold(records)
    first = shards[0][1]
    merged = {
        "sample": first.get("sample"),
        **{k: first.get(k) for k in manifest.RUN_IDENTITY},
        "entries": first.get("entries"),
        "shard": None,
        "merged_from": [{"dir": str(d), "shard": man.get("shard")} for d, man in shards],
        "missing_shards": missing,
    }
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    set_aside(results)
    lines = [Record.from_dict(r).to_json() for r in records]  # the runner's schema, whatever the input
    tmp = results.with_name(results.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, results)
    records = [json.loads(line) for line in lines]
    manifest.write(out, merged)
    return MergeResult(out, records, merged, duplicates, folded, missing)

"""``run.json``: what a results directory is a run *of* (sample, night, shard, modes, device, tier).

Results records say what happened to each model; they cannot say which sample or night they belong to.
``compat merge`` needs that to refuse shards of different runs, and ``--resume`` needs it to keep a
resumed run on the night (and sample) it started with, even after midnight.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MANIFEST = "run.json"
# the fields every shard of one night must share (the shard itself and the counts differ by design); the
# sample is compared by its fingerprint, so `--sample 5000` and the same file by path are one sample
RUN_IDENTITY = ("sample_sha256", "date", "modes", "device", "tier")


def sample_fingerprint(entries: Sequence[dict[str, Any]]) -> str:
    """A digest of the planned entries (before sharding): equal for every shard of one sample."""
    canon = [[str(e.get("id")), e.get("architecture"), e.get("task")] for e in entries]
    return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()


def shard_text(shard: tuple[int, int] | None) -> str | None:
    return f"{shard[0]}/{shard[1]}" if shard else None


def build(
    *,
    sample: str,
    entries: Sequence[dict[str, Any]],
    date: str,
    shard: tuple[int, int] | None,
    modes: Sequence[str],
    device: str,
    tier: str,
) -> dict[str, Any]:
    """The manifest of one run (or one shard of a run)."""
    return {
        "sample": sample,
        "sample_sha256": sample_fingerprint(entries),
        "entries": len(entries),
        "date": date,
        "shard": shard_text(shard),
        "modes": list(modes),
        "device": device,
        "tier": tier,
    }


def read(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a results directory, or None when it has none."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: unreadable run manifest ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a run manifest must be a JSON object")
    return data


def write(run_dir: str | os.PathLike[str], manifest: dict[str, Any]) -> Path:
    """Write atomically (temp + rename): a killed run never leaves half a manifest."""
    path = Path(run_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def differences(a: dict[str, Any], b: dict[str, Any], fields: Sequence[str] = RUN_IDENTITY) -> list[str]:
    """The identity fields on which two manifests disagree."""
    return [f for f in fields if a.get(f) != b.get(f)]

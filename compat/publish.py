"""``compat publish DIR --hub-dataset REPO``: one night's results as one config of a Hub dataset.

Optional by design: it runs only when ``HF_TOKEN`` is set (CI secrets), and ``datasets`` is imported only
then, so the harness and its tests never touch the Hub. Each night is its own config (named by date), so
the dataset's viewer lists nights and ``load_dataset(repo, "2026-12-02")`` reads one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from compat.jsonl import read_jsonl


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat, typed rows: nested dicts (times, rmse) as JSON text, so every night has one schema."""
    out = []
    for r in records:
        row = {}
        for k, v in r.items():
            row[k] = json.dumps(v) if isinstance(v, dict) else v
        out.append(row)
    return out


def night_of(results_dir: Path) -> str:
    """The config name: the manifest's date, else the directory name."""
    man = Path(results_dir) / "run.json"
    if man.exists():
        date = json.loads(man.read_text(encoding="utf-8")).get("date")
        if date:
            return str(date)
    return Path(results_dir).name


def push(results_dir: str | Path, repo_id: str, config: str | None = None) -> str:
    """Push when HF_TOKEN is set; returns what happened (a skip is not an error)."""
    token = os.environ.get("HF_TOKEN")
    if not token:
        return "HF_TOKEN is not set: Hub dataset upload skipped"
    path = Path(results_dir) / "results.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no results.jsonl in {results_dir}")
    try:
        import datasets
    except ImportError:
        raise RuntimeError(
            "publishing to the Hub needs the datasets package (pip install datasets)"
        ) from None
    name = config or night_of(Path(results_dir))
    ds = datasets.Dataset.from_list(rows(read_jsonl(path, "result")))
    ds.push_to_hub(repo_id, config_name=name, split="train", token=token)
    return f"pushed {len(ds)} results to https://huggingface.co/datasets/{repo_id} (config {name})"

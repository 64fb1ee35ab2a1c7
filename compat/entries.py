"""Snapshot records → runnable entries: one per (model id, architecture class).

A record names a repo; an entry names what the runner builds: the architecture class, its task, modality,
size bucket and stratum. The sampler, `compat run --models` and the registry's model counts all expand
records the same way, here.
"""

from __future__ import annotations

import math

SIZE_BUCKETS: list[tuple[float, str]] = [
    (1e8, "<100M"),
    (1e9, "100M-1B"),
    (1e10, "1B-10B"),
    (math.inf, ">=10B"),
]
UNKNOWN_SIZE = "unknown"
RUNNABLE_LIBRARIES = ("transformers", "sentence-transformers", "timm", "diffusers")

ENTRY_FIELDS = [
    "id", "model_type", "architecture", "task", "library", "modality", "downloads", "params",
    "size_bucket", "stratum", "source", "pipeline", "subfolder",
]  # fmt: skip


def size_bucket(params: int | None) -> str:
    """Coarse size class of a parameter count; unknown sizes are a bucket of their own."""
    if not params:
        return UNKNOWN_SIZE
    for limit, name in SIZE_BUCKETS:
        if params < limit:
            return name
    return SIZE_BUCKETS[-1][1]


def stratum_key(architecture: str, task: str | None, bucket: str) -> str:
    """The sampling stratum: architecture class × task × size bucket."""
    return f"{architecture}|{task or '-'}|{bucket}"


def _entry(rec: dict, arch: dict, task: str | None, pipeline: str | None, subfolder: str | None) -> dict:
    model_type = rec.get("model_type")
    if arch["library"] == "diffusers" or model_type not in (arch.get("model_types") or []):
        model_type = arch.get("model_type")
    bucket = size_bucket(rec.get("params"))
    task = task or arch.get("task")
    values = {
        "id": rec["id"],
        "model_type": model_type,
        "architecture": arch["name"],
        "task": task,
        "library": rec.get("library") or arch["library"],
        "modality": arch.get("modality") or "other",
        "downloads": rec.get("downloads"),
        "params": rec.get("params"),
        "size_bucket": bucket,
        "stratum": stratum_key(arch["name"], task, bucket),
        "source": rec.get("source"),
        "pipeline": pipeline,
        "subfolder": subfolder,
    }
    return {k: values[k] for k in ENTRY_FIELDS}


def entries_for_record(rec: dict, registry: dict[str, dict], include_docs: bool = True) -> list[dict]:
    """Every architecture of the registry this record can exercise, as entries.

    transformers: the record's own architectures, plus (include_docs) the classes whose docstrings name
    this id. diffusers: each model component of its pipelines (subfolder = component name), plus model
    classes whose docstrings load this id directly. Architectures unknown to the registry are dropped.
    """
    own = [a for a in rec.get("architectures") or [] if a in registry]
    docs = (
        [a for a in rec.get("doc_architectures") or [] if a in registry and a not in own]
        if include_docs
        else []
    )
    subfolders = rec.get("subfolders") or {}
    # A repo holds one pipeline's components: its own pipeline, else the plainest pipeline whose docs
    # load it (the ControlNet variants that reuse a base repo bring their ControlNet from elsewhere).
    pipes = [a for a in own if registry[a].get("kind") == "pipeline"]
    doc_pipes = sorted((a for a in docs if registry[a].get("kind") == "pipeline"), key=lambda a: (len(a), a))
    pipeline = pipes[0] if pipes else (doc_pipes[0] if doc_pipes else None)
    out: dict[str, dict] = {}
    for name in [*own, *docs]:
        arch = registry[name]
        task = rec.get("task") if name in own else None
        if arch.get("kind") == "pipeline":
            if name != pipeline:
                continue
            for comp, model_name in (arch.get("components") or {}).items():
                model = registry.get(model_name)
                if model is not None and model_name not in out:
                    out[model_name] = _entry(rec, model, task or arch.get("task"), name, comp)
        elif name not in out:
            out[name] = _entry(rec, arch, task, None, subfolders.get(name))
    return list(out.values())

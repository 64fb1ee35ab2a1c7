"""Synthetic inputs for the harness's data-side tests: result records and small registries/snapshots."""

from __future__ import annotations

import json
from pathlib import Path

ARCHS = [
    ("BertForMaskedLM", "bert", "fill-mask", "text"),
    ("GPT2LMHeadModel", "gpt2", "text-generation", "text"),
    ("ViTForImageClassification", "vit", "image-classification", "vision"),
    ("WhisperForConditionalGeneration", "whisper", "automatic-speech-recognition", "audio"),
    ("CLIPModel", "clip", "zero-shot-image-classification", "multimodal"),
    ("UNet2DConditionModel", "UNet2DConditionModel", "text-to-image", "diffusion"),
]


def result(model_id: str, arch: tuple, mode: str, status: str, **kw) -> dict:
    """One results.jsonl record in the runner's schema."""
    name, model_type, task, modality = arch
    rec = {
        "model_id": model_id,
        "mode": mode,
        "device": "cpu",
        "status": status,
        "model_type": model_type,
        "architecture": name,
        "task": task,
        "modality": modality,
        "error_class": None,
        "error": None,
        "missing_op": None,
        "graph_breaks": 0 if mode == "compiled" else None,
        "times": {"load_s": 0.5, "first_call_s": 1.25, "steady_s": 0.01},
        "peak_mem_bytes": 50 * 2**20,
        "dedup_key": f"{name}-{model_id}",
        "attributed_ids": [model_id],
        "date": "2026-01-02T03:00:00+00:00",
    }
    rec.update(kw)
    return rec


def night(
    fail: set[tuple[str, str]] = frozenset(), modes: tuple[str, ...] = ("eager", "compiled")
) -> list[dict]:
    """12 models × modes; (model_id, mode) pairs in `fail` fail to run on a missing op."""
    out = []
    for i, arch in enumerate(ARCHS):
        for k in range(2):
            mid = f"org{k}/{arch[1].lower()}-{i}"
            for mode in modes:
                if (mid, mode) in fail:
                    out.append(
                        result(
                            mid, arch, mode, "fail_to_run", error_class="NotImplementedError",
                            error="hf_tpu has no lowering for aten::_fft_r2c", missing_op="aten::_fft_r2c",
                        )
                    )  # fmt: skip
                else:
                    extra = {"attributed_ids": [mid, f"{mid}-dup"]} if k == 0 else {}
                    out.append(result(mid, arch, mode, "pass", **extra))
    out.append(result("org9/broken-builder", ARCHS[0], "eager", "harness_error", error="cannot shrink"))
    out.append(result("org9/skipped", ARCHS[1], "eager", "skipped", error="too big"))
    return out


def write_results(d: Path, records: list[dict], bad_line: bool = False) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in records]
    if bad_line:
        lines.insert(
            1,
            '{"model_id": "truncated',
        )
    (d / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def registry(n_arch: int = 60) -> dict[str, dict]:
    """A synthetic registry of transformers-like classes (6 model types × tasks)."""
    out = {}
    tasks = [
        "fill-mask",
        "text-classification",
        "token-classification",
        "text-generation",
        "feature-extraction",
    ]
    for i in range(n_arch):
        mt = f"type{i % 12}"
        name = f"Arch{i:03d}"
        out[name] = {
            "name": name,
            "library": "transformers",
            "kind": "model",
            "model_type": mt,
            "model_types": [mt],
            "task": tasks[i % len(tasks)],
            "tasks": [tasks[i % len(tasks)]],
            "modality": "text",
        }
    return out


def snapshot(reg: dict[str, dict], per_arch: int = 40) -> dict[str, dict]:
    """Records over the registry: popularity skewed towards the first architectures, sizes varied."""
    recs = {}
    names = sorted(reg)
    for i, name in enumerate(names):
        for j in range(per_arch if i % 7 else 2):  # some architectures have only two models
            mid = f"user{j}/{name.lower()}-{j}"
            recs[mid] = {
                "id": mid,
                "model_type": reg[name]["model_type"],
                "architectures": [name],
                "task": reg[name]["task"],
                "library": "transformers",
                "downloads": (10**7 // (i + 1)) // (j + 1),
                "likes": j,
                "params": [None, 5 * 10**7, 3 * 10**8, 7 * 10**9][j % 4],
                "source": "synthetic",
            }
    return recs

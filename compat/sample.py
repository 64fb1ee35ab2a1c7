"""Stratified, deterministic samples of the universe: `python -m compat sample -n 5000 --seed S`.

Popularity is extremely skewed (DESIGN §5), so a downloads-proportional draw would spend most of the
sample on ten model types. Instead: strata are architecture class × task × size bucket; every
architecture with a model gets one entry (its most downloaded); the rest is a weighted draw without
replacement with weight sqrt(downloads) (Efraimidis–Spirakis keys from a stable hash of seed and id),
skipping entries whose stratum or model type is full. Same snapshot + seed → the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compat.entries import RUNNABLE_LIBRARIES, entries_for_record
from compat.jsonl import iter_jsonl, write_jsonl

log = logging.getLogger("compat")

# The smoke sample: small, popular architectures across every modality, for CI and the demo.
SMOKE_ARCHITECTURES: list[str] = [
    # text
    "BertForMaskedLM", "BertForSequenceClassification", "DistilBertForQuestionAnswering",
    "RobertaForTokenClassification", "AlbertForMultipleChoice", "ElectraForPreTraining",
    "DebertaV2ForSequenceClassification", "XLMRobertaModel", "ModernBertForMaskedLM",
    "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Gemma3ForCausalLM", "PhiForCausalLM", "OPTForCausalLM", "GPTNeoXForCausalLM", "MixtralForCausalLM",
    "MambaForCausalLM", "T5ForConditionalGeneration", "BartForConditionalGeneration", "MarianMTModel",
    # vision
    "ViTForImageClassification", "ResNetForImageClassification", "ConvNextForImageClassification",
    "SwinForImageClassification", "Dinov2Model", "DetrForObjectDetection",
    "SegformerForSemanticSegmentation", "DPTForDepthEstimation", "MobileViTForImageClassification",
    # audio
    "WhisperForConditionalGeneration", "Wav2Vec2ForCTC", "HubertModel", "ASTForAudioClassification",
    "WavLMForXVector", "SpeechT5ForTextToSpeech",
    # video
    "VideoMAEForVideoClassification", "VivitForVideoClassification",
    # multimodal
    "CLIPModel", "SiglipModel", "BlipForConditionalGeneration", "LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "PaliGemmaForConditionalGeneration", "OwlViTForObjectDetection",
    "ClapModel",
    # time series
    "PatchTSTForRegression", "TimeSeriesTransformerModel",
    # diffusion
    "UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "SD3Transformer2DModel",
]  # fmt: skip


def stable_hash(seed: int | str, *parts: str) -> bytes:
    """sha256 of seed and parts: the same on every run and machine (Python's hash() is salted)."""
    return hashlib.sha256("\0".join([str(seed), *parts]).encode("utf-8")).digest()


def _uniform(h: bytes) -> float:
    return (int.from_bytes(h[:8], "big") + 1) / (2**64 + 2)


def weight(entry: dict) -> float:
    """Draw weight: sqrt of downloads (+1 so the long tail without counts can still be drawn)."""
    return math.sqrt(max(entry.get("downloads") or 0, 0) + 1)


def candidates(
    snapshot: dict[str, dict] | Iterable[dict],
    registry: dict[str, dict],
    libraries: Iterable[str] = RUNNABLE_LIBRARIES,
) -> list[dict]:
    """Every runnable (id, architecture) entry of the snapshot, sorted by (architecture, id)."""
    recs = snapshot.values() if isinstance(snapshot, dict) else snapshot
    libs = set(libraries)
    out: dict[tuple[str, str], dict] = {}
    for rec in recs:
        if rec.get("library") not in libs:
            continue
        for e in entries_for_record(rec, registry):
            out.setdefault((e["architecture"], e["id"]), e)
    return [out[k] for k in sorted(out)]


def default_caps(n: int) -> tuple[int, int]:
    """(per-stratum cap, per-model-type cap): ~0.5% and ~2.5% of the sample."""
    return max(3, math.ceil(n / 200)), max(10, math.ceil(n / 40))


def draw(
    cands: list[dict],
    n: int,
    seed: int,
    cap_stratum: int | None = None,
    cap_model_type: int | None = None,
) -> list[dict]:
    """The stratified sample: floor of one per architecture, the rest ∝ sqrt(downloads) under caps."""
    if n <= 0:
        raise ValueError(f"sample size must be positive, got {n}")
    d_stratum, d_type = default_caps(n)
    cap_stratum = cap_stratum or d_stratum
    cap_model_type = cap_model_type or d_type

    def tiebreak(e: dict) -> bytes:
        return stable_hash(seed, e["id"], e["architecture"])

    by_arch: dict[str, list[dict]] = {}
    for e in cands:
        by_arch.setdefault(e["architecture"], []).append(e)
    floors = [min(lst, key=lambda e: (-(e.get("downloads") or 0), tiebreak(e))) for lst in by_arch.values()]
    if len(floors) > n:
        log.warning(
            "sample of %d cannot hold one model per architecture (%d); keeping the most downloaded",
            n,
            len(floors),
        )
        floors = sorted(floors, key=lambda e: (-(e.get("downloads") or 0), tiebreak(e)))[:n]

    chosen = {(e["id"], e["architecture"]) for e in floors}
    per_stratum = Counter(e["stratum"] for e in floors)
    per_type = Counter(e["model_type"] or e["architecture"] for e in floors)
    picked = list(floors)

    def es_key(e: dict) -> tuple[float, bytes]:
        h = tiebreak(e)
        return (-math.log(_uniform(h)) / weight(e), h)

    rest = sorted((e for e in cands if (e["id"], e["architecture"]) not in chosen), key=es_key)
    for e in rest:
        if len(picked) >= n:
            break
        mt = e["model_type"] or e["architecture"]
        if per_stratum[e["stratum"]] >= cap_stratum or per_type[mt] >= cap_model_type:
            continue
        picked.append(e)
        per_stratum[e["stratum"]] += 1
        per_type[mt] += 1
    if len(picked) < n:
        log.warning(
            "only %d entries fit under the caps (stratum %d, model type %d); asked for %d",
            len(picked),
            cap_stratum,
            cap_model_type,
            n,
        )
    return sorted(picked, key=lambda e: (e["architecture"], e["id"]))


def _smoke_key(e: dict) -> tuple:
    params = e.get("params")
    size_rank = 0 if params and params < 1e9 else (1 if not params else 2)
    return (size_rank, -(e.get("downloads") or 0), stable_hash(0, e["id"], e["architecture"]))


def smoke(cands: list[dict], architectures: Iterable[str] = SMOKE_ARCHITECTURES) -> list[dict]:
    """One entry per smoke architecture: the most downloaded under 1B parameters (else of unknown size)."""
    by_arch: dict[str, list[dict]] = {}
    for e in cands:
        by_arch.setdefault(e["architecture"], []).append(e)
    out = []
    for arch in architectures:
        lst = by_arch.get(arch)
        if not lst:
            log.warning("smoke architecture %s has no model in the snapshot; left out", arch)
            continue
        out.append(min(lst, key=_smoke_key))
    return out


# ------------------------------------------------------------------------------------------------ files


def sample_path(model_lists: Path, n: int | None = None, seed: int = 0, smoke_sample: bool = False) -> Path:
    """Where a frozen sample lives: sample-<n>-<seed>.jsonl, or sample-smoke.jsonl."""
    return Path(model_lists) / ("sample-smoke.jsonl" if smoke_sample else f"sample-{n}-{seed}.jsonl")


def write_sample(path: Path, entries: list[dict], meta: dict[str, Any]) -> None:
    """The sample (one entry per line) and a sidecar .meta.json saying how it was drawn."""
    write_jsonl(path, entries)
    Path(path).with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def resolve_sample(spec: str, model_lists: Path, seed: int | None = None) -> Path:
    """`smoke` → sample-smoke.jsonl; `5000` → sample-5000-<seed>.jsonl (the only one if no seed); else a path."""
    model_lists = Path(model_lists)
    if spec == "smoke":
        path = model_lists / "sample-smoke.jsonl"
    elif re.fullmatch(r"\d+", spec):
        if seed is not None:
            path = model_lists / f"sample-{spec}-{seed}.jsonl"
        else:
            found = sorted(model_lists.glob(f"sample-{spec}-*.jsonl"))
            if len(found) > 1:
                names = ", ".join(p.name for p in found)
                raise FileNotFoundError(f"several samples of {spec} ({names}): pass --seed to choose one")
            path = found[0] if found else model_lists / f"sample-{spec}-0.jsonl"
    else:
        path = Path(spec)
    if not path.exists():
        have = ", ".join(p.name for p in sorted(model_lists.glob("sample-*.jsonl"))) or "none"
        raise FileNotFoundError(
            f"sample {spec!r} not found at {path} (samples in {model_lists}: {have}); "
            "create it with `python -m compat sample`"
        )
    return path


def load_sample(path: str | os.PathLike) -> list[dict]:
    """Entries of a frozen sample; malformed lines and entries without an id are warned about and skipped."""
    out = []
    for lineno, e in iter_jsonl(path, "sample"):
        if isinstance(e.get("id"), str) and e["id"]:
            out.append(e)
        else:
            log.warning("%s:%d: sample entry without an id skipped", path, lineno)
    return out


# ------------------------------------------------------------------------------------------------ table


def summarize(entries: list[dict]) -> dict[str, Any]:
    """Counts that say whether a sample is balanced: architectures, model types, strata, modalities."""
    return {
        "entries": len(entries),
        "model_ids": len({e["id"] for e in entries}),
        "architectures": len({e["architecture"] for e in entries}),
        "model_types": len({e["model_type"] for e in entries if e.get("model_type")}),
        "strata": len({e["stratum"] for e in entries}),
        "by_modality": dict(sorted(Counter(e["modality"] for e in entries).items())),
        "by_library": dict(sorted(Counter(e["library"] for e in entries).items())),
        "by_size_bucket": dict(sorted(Counter(e["size_bucket"] for e in entries).items())),
    }


def print_table(entries: list[dict], top: int = 40, console: Any = None) -> None:
    """The stratum table (largest strata first) and the sample's summary, with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    counts = Counter(e["stratum"] for e in entries)
    downloads = Counter()
    for e in entries:
        downloads[e["stratum"]] += e.get("downloads") or 0
    table = Table(title=f"strata (architecture × task × size): top {min(top, len(counts))} of {len(counts)}")
    for col in ("architecture", "task", "size", "models", "downloads"):
        table.add_column(col, justify="right" if col in ("models", "downloads") else "left")
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
        arch, task, size = key.split("|")
        table.add_row(arch, task, size, str(n), f"{downloads[key]:,}")
    console.print(table)
    s = summarize(entries)
    summary = Table(title="sample summary", show_header=False)
    summary.add_column("what")
    summary.add_column("count", justify="right")
    for k in ("entries", "model_ids", "architectures", "model_types", "strata"):
        summary.add_row(k.replace("_", " "), str(s[k]))
    for group in ("by_modality", "by_library", "by_size_bucket"):
        for k, v in s[group].items():
            summary.add_row(f"{group[3:].replace('_', ' ')}: {k}", str(v))
    console.print(summary)

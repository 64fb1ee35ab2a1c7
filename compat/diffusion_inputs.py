"""Forward inputs for diffusers models (denoisers, VAEs, ControlNets, adapters): latents shaped by the
config and the forward's docstring, timesteps in the range the model's pipeline passes, conditioning by
argument name, and one trial CPU forward that rebuilds an input the model reports as mis-sized."""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import torch

from compat.diffusion_family_inputs import FAMILY_BUILDERS
from compat.input_basics import (
    TEXT_COND_LEN,
    forward_params,
    refit_rank,
    strip_private,
)
from compat.materialize import Plan


def _timestep_scale(model: Any) -> float:
    """The factor a model multiplies its timesteps by itself: diffusers' `Timesteps(scale=1000)` in flow-
    matching DiTs (QwenImage, AuraFlow, NucleusMoE), whose pipelines pass sigmas in [0, 1]. Given 500 they
    take sin/cos of ~5e5 in float32, where a 1-ulp difference in `exp` moves the embedding by 1e-2."""
    scales = [
        m.scale for m in model.modules() if type(m).__name__ == "Timesteps" and getattr(m, "scale", 1) > 1
    ]
    return float(max(scales)) if scales else 1.0


def build_diffusion_inputs(model: Any, plan: Plan, gen: torch.Generator, batch: int) -> dict[str, Any]:
    cfg = dict(model.config)
    params = forward_params(model)
    name = plan.model_class
    if name in FAMILY_BUILDERS:  # what the model's own pipeline passes, where no generic rule can infer it
        return FAMILY_BUILDERS[name](model, cfg, gen, batch)
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
        # no config key names the text width: a guess the trial forward corrects (fit_by_trial)
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
    fit_by_trial(model, plan, out)
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


def fit_by_trial(model: Any, plan: Plan, kwargs: dict[str, Any]) -> None:
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
            if not (_refit_width(kwargs, exc) or refit_rank(model, plan, kwargs, exc)):
                return

"""What every input builder of the harness shares: a forward's parameters, config lookups, and the
refits that answer a forward's own complaint about an input's rank."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from compat.materialize import Plan

TEXT_COND_LEN = 8  # tokens of the text conditioning given to text-to-image/video models


def forward_params(model: Any) -> dict[str, inspect.Parameter]:
    """The named parameters of ``model.forward`` (self and */** excluded)."""
    sig = inspect.signature(model.forward)
    return {
        k: p
        for k, p in sig.parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and k != "self"
    }


def documented_rank(model: Any, name: str) -> int | None:
    """The rank of forward argument ``name`` as its docstring documents it (transformers' auto_docstring
    writes ``name (`torch.Tensor` of shape `(batch_size, num_tiles)`)``); None when undocumented."""
    doc = getattr(model.forward, "__doc__", None) or ""
    m = re.search(rf"\b{re.escape(name)} \(`[^`]*` of shape `\(([^)]*)\)`", doc)
    return len([d for d in m.group(1).split(",") if d.strip()]) if m else None


def required_params(params: dict[str, inspect.Parameter]) -> list[str]:
    return [k for k, p in params.items() if p.default is inspect.Parameter.empty]


def config_get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


_RANK = re.compile(r"not enough values to unpack \(expected 5, got 4\)")


def refit_rank(model: Any, plan: Plan, kwargs: dict[str, Any], error: BaseException) -> bool:
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
            frames = config_get(cfg, "num_frames") if plan.library != "diffusers" else None
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


def strip_private(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs without builder bookkeeping (keys starting with '_')."""
    return {k: v for k, v in kwargs.items() if not k.startswith("_")}

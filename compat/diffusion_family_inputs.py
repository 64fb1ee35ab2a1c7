"""Forward inputs for the diffusers classes whose pipeline passes something the generic builder
(compat.diffusion_inputs) cannot infer from the config and the signature: position ids, rotary tables,
packed-sequence layouts, channels-last latents, lists of per-sample tensors. One builder per family, keyed
by class name in FAMILY_BUILDERS; each builds what that model's diffusers pipeline passes to its forward,
at the shrunk config's sizes. The generic builder consults this registry first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from compat.input_basics import TEXT_COND_LEN

Builder = Callable[[Any, dict[str, Any], torch.Generator, int], dict[str, Any]]
FAMILY_BUILDERS: dict[str, Builder] = {}


def family(*names: str) -> Callable[[Builder], Builder]:
    """Register a builder for the diffusers classes ``names``."""

    def register(fn: Builder) -> Builder:
        for n in names:
            FAMILY_BUILDERS[n] = fn
        return fn

    return register


def _steps(batch: int) -> torch.Tensor:
    """DDPM / flow-matching timesteps on the [0, 1000] scale, one per sample."""
    return torch.tensor([10.0, 500.0][:batch] + [250.0] * max(0, batch - 2))


def _sigmas(batch: int) -> torch.Tensor:
    """Flow-matching times in [0, 1], one per sample."""
    return torch.tensor([0.25, 0.75][:batch] + [0.5] * max(0, batch - 2))


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


# ------------------------------------------------------------------------------------------ text-to-image


@family("Ideogram4Transformer2DModel")
def ideogram4(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """One packed [text | image] sequence with per-token MRoPE (t, h, w) ids, segment ids and a text/image
    role indicator (pipeline `_prepare_ids`): the packing is the pipeline's, no config key describes it."""
    from diffusers.models.transformers.transformer_ideogram4 import (
        IMAGE_POSITION_OFFSET,
        LLM_TOKEN_INDICATOR,
        OUTPUT_IMAGE_INDICATOR,
    )

    text, side = TEXT_COND_LEN, 4
    n_img = side * side
    seq = text + n_img
    h = torch.arange(side).view(-1, 1).expand(side, side).reshape(-1)
    w = torch.arange(side).view(1, -1).expand(side, side).reshape(-1)
    image_pos = torch.stack([torch.zeros_like(h), h, w], dim=1) + IMAGE_POSITION_OFFSET
    t = torch.arange(text)
    pos = torch.cat([torch.stack([t, t, t], dim=1), image_pos]).expand(batch, -1, -1).clone()
    indicator = torch.full((batch, seq), OUTPUT_IMAGE_INDICATOR, dtype=torch.long)
    indicator[:, :text] = LLM_TOKEN_INDICATOR
    latents = _randn(gen, batch, seq, cfg["in_channels"])
    latents[:, :text] = 0.0  # the pipeline pads the text region of the latents with zeros
    return {
        "hidden_states": latents,
        "timestep": _sigmas(batch),
        "encoder_hidden_states": _randn(gen, batch, seq, cfg["llm_features_dim"]),
        "position_ids": pos,
        "segment_ids": torch.ones(batch, seq, dtype=torch.long),
        "indicator": indicator,
    }


@family("LuminaNextDiT2DModel")
def lumina_next(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """A 2-D complex RoPE table the pipeline computes (get_2d_rotary_pos_embed_lumina over the head dim)
    and a caption mask; time runs in [0, 1] (the pipeline reverses 1 - t / 1000)."""
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    size, p = cfg.get("sample_size") or 16, cfg.get("patch_size") or 2
    rope = get_2d_rotary_pos_embed_lumina(model.head_dim, size // p, size // p)
    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], size, size),
        "timestep": _sigmas(batch),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["cross_attention_dim"]),
        "encoder_mask": torch.ones(batch, TEXT_COND_LEN, dtype=torch.long),
        "image_rotary_emb": rope,
        "cross_attention_kwargs": {},  # splatted unguarded into the attention; the pipeline passes {}
    }


@family("OmniGenTransformer2DModel")
def omnigen(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Text token ids, no input images, and the processor's mask and positions over [text | time | image]:
    causal over the text and the time token, bidirectional over the image (OmniGenProcessor.create_mask)."""
    size, p = 16, cfg.get("patch_size") or 2
    n_img = (size // p) ** 2
    text = TEXT_COND_LEN
    seq = text + 1 + n_img
    mask = torch.zeros(seq, seq)
    mask[: text + 1, : text + 1] = torch.tril(torch.ones(text + 1, text + 1))
    mask[text + 1 :, :] = 1.0
    vocab = min(cfg.get("vocab_size") or 1000, cfg.get("pad_token_id") or 1000)
    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], size, size),
        "timestep": _steps(batch),
        "input_ids": torch.randint(0, vocab, (batch, text), generator=gen),
        "input_img_latents": [],
        "input_image_sizes": {},
        "attention_mask": mask.expand(batch, -1, -1).clone(),
        "position_ids": torch.arange(seq).expand(batch, -1).clone(),
    }


@family("ZImageTransformer2DModel")
def z_image(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Lists, one entry per sample: latents (C, 1, H, W) and unpadded caption features of each prompt's own
    length (the pipeline drops the padding); time in [0, 1] ((1000 - t) / 1000)."""
    lengths = [TEXT_COND_LEN, TEXT_COND_LEN - 2][:batch] + [TEXT_COND_LEN] * max(0, batch - 2)
    return {
        "x": [_randn(gen, cfg["in_channels"], 1, 16, 16) for _ in range(batch)],
        "t": _sigmas(batch),
        "cap_feats": [_randn(gen, n, cfg["cap_feat_dim"]) for n in lengths],
    }


def _hunyuan_dit_common(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    size, p = cfg.get("sample_size") or 16, cfg.get("patch_size") or 2
    grid = size // p
    head = cfg["attention_head_dim"]  # the pipeline's inner_dim // num_heads
    crops = get_resize_crop_region_for_grid((grid, grid), 512 // 8 // p)
    rope = get_2d_rotary_pos_embed(head, crops, (grid, grid), output_type="pt")
    n1, n2 = cfg["text_len"], cfg["text_len_t5"]
    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], size, size),
        "timestep": _steps(batch),
        "encoder_hidden_states": _randn(gen, batch, n1, cfg["cross_attention_dim"]),
        "text_embedding_mask": torch.ones(batch, n1, dtype=torch.long),
        "encoder_hidden_states_t5": _randn(gen, batch, n2, cfg["cross_attention_dim_t5"]),
        "text_embedding_mask_t5": torch.ones(batch, n2, dtype=torch.long),
        "image_meta_size": torch.tensor([[size * 8.0, size * 8.0, size * 8.0, size * 8.0, 0.0, 0.0]] * batch),
        "style": torch.zeros(batch, dtype=torch.long),
        "image_rotary_emb": rope,
    }


@family("HunyuanDiT2DModel")
def hunyuan_dit(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Two text encoders' states at their fixed lengths (text_len, text_len_t5) with masks, image meta
    sizes, a style id, and the pipeline's 2-D RoPE (cos, sin) over the cropped grid: all optional in the
    signature, all read unguarded by the forward."""
    return _hunyuan_dit_common(model, cfg, gen, batch)


@family("HunyuanDiT2DControlNetModel")
def hunyuan_dit_controlnet(
    model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int
) -> dict[str, Any]:
    """HunyuanDiT's inputs plus the control image as VAE latents shaped like the denoiser's."""
    out = _hunyuan_dit_common(model, cfg, gen, batch)
    out["controlnet_cond"] = _randn(gen, *out["hidden_states"].shape)
    return out


# ---------------------------------------------------------------------------------------------- video


def _kandinsky_rope(frames: int, h: int, w: int) -> list[torch.Tensor]:
    return [torch.arange(frames), torch.arange(h), torch.arange(w)]


@family("Kandinsky5Transformer3DModel")
def kandinsky5(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Channels-last latents (B, T, H, W, C; C = 2 * in_visual_dim + 1 with visual_cond), per-axis RoPE
    positions over the patched grid and text RoPE positions: the pipeline builds all three."""
    pt, ph, pw = cfg.get("patch_size") or [1, 2, 2]
    c = cfg["in_visual_dim"]
    c = 2 * c + 1 if cfg.get("visual_cond") else c
    frames, side = 2 * pt, 8 * ph
    return {
        "hidden_states": _randn(gen, batch, frames, side, side, c),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["in_text_dim"]),
        "timestep": _steps(batch),
        "pooled_projections": _randn(gen, batch, cfg["in_text_dim2"]),
        "visual_rope_pos": _kandinsky_rope(frames // pt, side // ph, side // pw),
        "text_rope_pos": torch.arange(TEXT_COND_LEN),
    }


@family("Kandinsky6Transformer3DModel")
def kandinsky6(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Channels-last latents with the [latent | conditioning latent | mask] channels the pipeline concatenates
    when visual_cond is set (2 * in_visual_dim + 1), text states and the pooled text embedding."""
    pt, ph, _ = cfg.get("patch_size") or [1, 2, 2]
    c = cfg["in_visual_dim"]
    cond = bool(cfg.get("visual_cond"))
    frames, side = 2 * pt, 8 * ph
    x = _randn(gen, batch, frames, side, side, c)
    if cond:  # the pipeline's text-to-video path: zero conditioning latent, zero mask
        x = torch.cat([x, torch.zeros_like(x), torch.zeros(*x.shape[:-1], 1)], dim=-1)
    return {
        "hidden_states": x,
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["in_text_dim"]),
        "pooled_projections": _randn(gen, batch, cfg["in_text_dim2"]),
        "timestep": _steps(batch),
    }


@family("Kandinsky6SRTransformer3DModel")
def kandinsky6_sr(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Channels-last latent tiles [noisy | anchor | anchor mask] whose token grid NABLA attention splits
    into 8x8 blocks: height and width a multiple of 8 patches, which no config key says."""
    pt, ph, pw = cfg.get("patch_size") or [1, 1, 1]
    c = cfg["in_visual_dim"]
    x = _randn(gen, batch, 2 * pt, 8 * ph, 8 * pw, c)
    anchor = _randn(gen, *x.shape)
    mask = torch.ones(*x.shape[:-1], 1)
    return {"hidden_states": torch.cat([x, anchor, mask], dim=-1), "timestep": _steps(batch)}


def _grid_ids(h: int, w: int, plane: float = 0.0) -> torch.Tensor:
    """Flux-style (plane, row, column) ids of an h x w latent grid, flattened: the pipelines'
    `_prepare_latent_image_ids`."""
    ids = torch.zeros(h, w, 3)
    ids[..., 0] = plane
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(-1, 3)


@family("BriaFiboTransformer2DModel")
def bria_fibo(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Flux-style packed latents with image/text ids, plus one text-encoder hidden state per block
    (text_encoder_layers: num_layers + num_single_layers of them, each text_encoder_dim wide), which the
    forward injects block by block; the pipeline takes them from the text encoder's layers."""
    side = 8
    n_blocks = cfg["num_layers"] + cfg["num_single_layers"]
    return {
        "hidden_states": _randn(gen, batch, side * side, cfg["in_channels"]),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["joint_attention_dim"]),
        "text_encoder_layers": [
            _randn(gen, batch, TEXT_COND_LEN, cfg["text_encoder_dim"]) for _ in range(n_blocks)
        ],
        "timestep": _steps(batch),
        "img_ids": _grid_ids(side, side),
        "txt_ids": torch.zeros(TEXT_COND_LEN, 3),
    }


@family("BriaFibo2Transformer2DModel")
def bria_fibo2(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Text features as bundles, (batch, 1 + len(injection_layer_ids), text_len, cap_feat_dim): the
    Perceiver's bundle and one per injection block, a rank no generic rule guesses; time in [0, 1]."""
    bundles = 1 + len(cfg.get("injection_layer_ids") or [])
    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], 16, 16),
        "timestep": _sigmas(batch),
        "encoder_hidden_states": _randn(gen, batch, bundles, TEXT_COND_LEN, cfg["cap_feat_dim"]),
        "encoder_attention_mask": torch.ones(batch, TEXT_COND_LEN, dtype=torch.bool),
    }


@family("QwenImageControlNetModel")
def qwen_image_controlnet(
    model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int
) -> dict[str, Any]:
    """2x2-packed latents and control latents as token sequences with the (frames, rows, columns) grid of
    each image in img_shapes (the RoPE reads it, no shape says it), the text mask, sigmas in [0, 1]."""
    side = 8
    cond_ch = cfg["in_channels"] + (cfg.get("extra_condition_channels") or 0)
    return {
        "hidden_states": _randn(gen, batch, side * side, cfg["in_channels"]),
        "controlnet_cond": _randn(gen, batch, side * side, cond_ch),
        "timestep": _sigmas(batch),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["joint_attention_dim"]),
        "encoder_hidden_states_mask": torch.ones(batch, TEXT_COND_LEN, dtype=torch.long),
        "img_shapes": [(1, side, side)] * batch,
    }


@family("HunyuanVideoFramepackTransformer3DModel")
def framepack(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """FramePack's history: clean latents (first frame + 1x history) and 2x / 4x-compressed history latents,
    each with its own 1-D frame indices (the pipeline's vanilla sampling split), a CLIP image embedding
    and the guidance scale x 1000; the frame indices are 1-D, which the forward's own default is not."""
    c, side, window = cfg["in_channels"], 16, 2
    sizes = [1, 2, 16]  # the pipeline's history_sizes: 1x, 2x, 4x
    idx = torch.arange(1 + sum(sizes) + window)
    prefix, h4, h2, h1, latents_idx = idx.split([1, sizes[2], sizes[1], sizes[0], window])
    return {
        "hidden_states": _randn(gen, batch, c, window, side, side),
        "timestep": _steps(batch),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["text_embed_dim"]),
        "encoder_attention_mask": torch.ones(batch, TEXT_COND_LEN, dtype=torch.long),
        "pooled_projections": _randn(gen, batch, cfg["pooled_projection_dim"]),
        "image_embeds": _randn(gen, batch, TEXT_COND_LEN, cfg["image_proj_dim"]),
        "indices_latents": latents_idx,
        "guidance": torch.full((batch,), 10.0 * 1000.0),
        "latents_clean": _randn(gen, batch, c, 2, side, side),
        "indices_latents_clean": torch.cat([prefix, h1]),
        "latents_history_2x": _randn(gen, batch, c, sizes[1], side, side),
        "indices_latents_history_2x": h2,
        "latents_history_4x": _randn(gen, batch, c, sizes[2], side, side),
        "indices_latents_history_4x": h4,
    }


@family("I2VGenXLUNet")
def i2vgen_xl(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """The first frame's VAE latents followed by zero frames (the pipeline's frame-position mask), its CLIP
    image embedding as one token, fps; image_embeddings is optional in the signature but read unguarded."""
    c, frames, side = cfg["in_channels"], 2, 16
    first = _randn(gen, batch, c, 1, side, side)
    return {
        "sample": _randn(gen, batch, c, frames, side, side),
        "timestep": _steps(batch),
        "fps": torch.full((batch,), 16),
        "image_latents": torch.cat([first, torch.zeros(batch, c, frames - 1, side, side)], dim=2),
        "image_embeddings": _randn(gen, batch, 1, cfg["cross_attention_dim"]),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["cross_attention_dim"]),
    }


@family("WanAnimateTransformer3DModel")
def wan_animate(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Wan-Animate's three streams: (2C + 4)-channel latents over T + 1 frames, pose latents over T frames,
    and the face video in pixels at the motion encoder's own resolution, 4T - 3 frames (its two stride-2
    convolutions give T, plus the reference frame); plus the reference image's CLIP tokens."""
    frames, side = 2, 16
    face = cfg.get("motion_encoder_size") or 512
    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], frames + 1, side, side),
        "timestep": _steps(batch),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["text_dim"]),
        "encoder_hidden_states_image": _randn(gen, batch, TEXT_COND_LEN, cfg["image_dim"]),
        "pose_hidden_states": _randn(gen, batch, cfg["latent_channels"], frames, side, side),
        "face_pixel_values": torch.rand(batch, 3, 4 * frames - 3, face, face, generator=gen) * 2 - 1,
    }


@family("JoyImageEditPlusTransformer3DModel")
def joyimage_edit_plus(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Latents pre-patchified by the pipeline, (batch, patches, C, pt, ph, pw), for the target and a reference
    image, with each component's (t, h, w) grid in shape_list (the RoPE offsets its frames)."""
    pt, ph, pw = cfg.get("patch_size") or [1, 2, 2]
    grid = (1, 4, 4)
    shapes = [grid, grid]  # the image to generate, one reference image
    n = sum(t * h * w for t, h, w in shapes)
    return {
        "hidden_states": _randn(gen, batch, n, cfg["in_channels"], pt, ph, pw),
        "timestep": _steps(batch),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["text_dim"]),
        "encoder_hidden_states_mask": torch.ones(batch, TEXT_COND_LEN, dtype=torch.long),
        "shape_list": [list(shapes) for _ in range(batch)],
    }


def _per_frame(values: torch.Tensor, frames: int) -> torch.Tensor:
    return values.unsqueeze(-1).repeat(1, frames)


@family("AnyFlowTransformer3DModel")
def anyflow(
    model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int, frames: int = 2
) -> dict[str, Any]:
    """Frames-first latents (B, F, C, H, W) with per-frame flow-map times t and the target time r <= t,
    both (B, F) (the pipeline repeats them over the frames): the forward unpacks (batch, frames) from them."""
    t = _steps(batch)
    return {
        "hidden_states": _randn(gen, batch, frames, cfg["in_channels"], 16, 16),
        "timestep": _per_frame(t, frames),
        "r_timestep": _per_frame(t * 0.5, frames),
        "encoder_hidden_states": _randn(gen, batch, TEXT_COND_LEN, cfg["text_dim"]),
    }


@family("AnyFlowFARTransformer3DModel")
def anyflow_far(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """AnyFlow's inputs over a chunked clip: chunk_partition (frames per causal chunk) must sum to the
    latent frames; without a KV cache the forward runs its whole-clip causal path (the pipeline's cache
    is built by this same path chunk by chunk)."""
    partition = [1, 2]
    return {**anyflow(model, cfg, gen, batch, frames=sum(partition)), "chunk_partition": partition}


@family("AceStepTransformer1DModel")
def ace_step(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Acoustic latents (B, T, audio_acoustic_hidden_dim) and the context latents the patchify conv takes
    beside them (source latents + chunk mask: in_channels minus the acoustic width); t = r in [0, 1]."""
    width = cfg["audio_acoustic_hidden_dim"]
    frames = 16
    t = _sigmas(batch)
    return {
        "hidden_states": _randn(gen, batch, frames, width),
        "timestep": t,
        "timestep_r": t.clone(),
        "encoder_hidden_states": _randn(
            gen, batch, TEXT_COND_LEN, cfg.get("encoder_hidden_size") or cfg["hidden_size"]
        ),
        "context_latents": _randn(gen, batch, frames, cfg["in_channels"] - width),
    }


@family("CogVideoXTransformer3DModel")
def cogvideox(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Frames-first latents at the sample size its sinusoidal position table is built for, and text at
    exactly max_text_seq_length tokens (the table spans text + video); ofs for CogVideoX 1.5 I2V."""
    tcr = cfg.get("temporal_compression_ratio") or 4
    frames = ((cfg.get("sample_frames") or 49) - 1) // tcr + 1
    pt = cfg.get("patch_size_t") or 1
    frames = -(-frames // pt) * pt
    out = {
        "hidden_states": _randn(
            gen, batch, frames, cfg["in_channels"], cfg["sample_height"], cfg["sample_width"]
        ),
        "encoder_hidden_states": _randn(gen, batch, cfg["max_text_seq_length"], cfg["text_embed_dim"]),
        "timestep": _steps(batch),
    }
    if cfg.get("ofs_embed_dim"):
        out["ofs"] = torch.full((batch,), 2.0)
    return out


@family("HunyuanVideo15Transformer3DModel")
def hunyuan_video15(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Three conditioning streams the forward always reads, with masks: the MLLM text, the ByT5 glyph text
    (`encoder_hidden_states_2`) and image embeddings, all zeros for text-to-video as the pipeline passes
    them (the model then masks the image stream out); each mask has padding so the forward's valid/padding
    reordering is exercised."""
    pt, p = cfg.get("patch_size_t") or 1, cfg.get("patch_size") or 1
    text, glyph, image_tokens = TEXT_COND_LEN, 6, 4

    def mask(n: int) -> torch.Tensor:
        m = torch.ones(batch, n, dtype=torch.long)
        m[:, n - 2 :] = 0
        return m

    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], 2 * pt, 4 * p, 4 * p),
        "timestep": _steps(batch),
        "encoder_hidden_states": _randn(gen, batch, text, cfg["text_embed_dim"]),
        "encoder_attention_mask": mask(text),
        "encoder_hidden_states_2": _randn(gen, batch, glyph, cfg["text_embed_2_dim"]),
        "encoder_attention_mask_2": mask(glyph),
        "image_embeds": torch.zeros(batch, image_tokens, cfg["image_embed_dim"]),
    }


@family("SanaWMTransformer3DModel")
def sana_wm(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """SANA-WM's camera conditioning from the pipeline's own prepare_camera (a raymap per latent frame and
    Plucker rays packed by VAE chunk) for a short forward-moving trajectory, per-frame (B, 1, T) timesteps
    with the first (conditioning) frame at 0, and (B, 1, L, D) text with its mask."""
    import numpy as np
    from diffusers.pipelines.sana_wm.cam_utils import prepare_camera

    t_stride = (cfg.get("chunk_plucker_channels") or 48) // 6
    s_stride, frames, side = 32, 2, 8
    n_px = t_stride * (frames - 1) + 1
    c2w = np.tile(np.eye(4, dtype=np.float32), (n_px, 1, 1))
    c2w[:, 2, 3] = np.linspace(0.0, 0.5, n_px)
    px = side * s_stride
    intr = np.tile(np.array([px * 0.8, px * 0.8, px / 2, px / 2], dtype=np.float32), (n_px, 1))
    cam = prepare_camera(c2w, intr, target_size=(px, px), vae_stride=(t_stride, s_stride, s_stride))
    t = _steps(batch)
    steps = _per_frame(t, frames)
    steps[:, 0] = 0.0
    return {
        "hidden_states": _randn(gen, batch, cfg["in_channels"], frames, side, side),
        "timestep": steps.unsqueeze(1),
        "encoder_hidden_states": _randn(gen, batch, 1, TEXT_COND_LEN, cfg["caption_channels"]),
        "mask": torch.ones(batch, TEXT_COND_LEN, dtype=torch.long),
        "data_info": {"img_hw": torch.tensor([[float(px), float(px)]])},
        "camera_conditions": cam["raymap"].unsqueeze(0).expand(batch, -1, -1).clone(),
        "chunk_plucker": cam["chunk_plucker"].unsqueeze(0).expand(batch, *cam["chunk_plucker"].shape).clone(),
    }


# ----------------------------------------------------------------------------------------------- VAEs


@family("AutoencoderKLMochi")
def mochi_vae(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """RGB video: in_channels (15) counts the Fourier features the encoder adds to 3 pixel channels, and
    the causal temporal compression (prod of temporal_expansions, 6) takes 6k + 1 frames."""
    t = 1
    for e in cfg.get("temporal_expansions") or [1, 2, 3]:
        t *= e
    s = 1
    for e in cfg.get("spatial_expansions") or [2, 2, 2]:
        s *= e
    return {"sample": torch.rand(batch, 3, t + 1, 2 * s, 2 * s, generator=gen) * 2 - 1}


@family("AutoencoderKLHunyuanVideo15")
def hunyuan_video15_vae(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """A clip of 1 + temporal_compression_ratio frames (causal: the first frame alone, then groups) at two
    spatial_compression_ratio tiles a side; one clip, since the mid-block attention's (batch, N, N) causal
    mask broadcasts against (batch, 1, N, N) only for a batch of one (diffusers 0.42)."""
    t, s = cfg.get("temporal_compression_ratio") or 4, cfg.get("spatial_compression_ratio") or 16
    return {"sample": torch.rand(1, cfg["in_channels"], t + 1, 2 * s, 2 * s, generator=gen) * 2 - 1}


@family("AutoencoderKLTemporalDecoder")
def svd_vae(model: Any, cfg: dict[str, Any], gen: torch.Generator, batch: int) -> dict[str, Any]:
    """Stable Video Diffusion's VAE: frames stacked into the batch of 2-D images, (batch x frames, C, H, W),
    with num_frames telling the temporal decoder how to regroup them (the pipeline's decode_latents)."""
    frames, size = 2, cfg.get("sample_size") or 32
    return {
        "sample": torch.rand(batch * frames, cfg["in_channels"], size, size, generator=gen) * 2 - 1,
        "num_frames": frames,
    }

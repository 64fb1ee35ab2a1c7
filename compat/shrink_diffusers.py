"""Shrink a diffusers model config (the __init__ signature of the model class) to a CPU-sized one:
UNet-style models keep two stages and one layer per block, transformer denoisers keep heads x head_dim
with fewer heads and layers, VAEs keep the stages their compression ratio needs. The limits (HEADS,
MAX_LAYERS) are compat.shrink's, read at call time so that ``compat.shrink.harder()`` applies here too."""

from __future__ import annotations

import copy
from typing import Any

from compat import shrink as _s
from compat.shrink import _int, _round_to

DIFFUSERS_WIDTH_KEYS = (
    "joint_attention_dim",
    "pooled_projection_dim",
    "caption_channels",
    "text_dim",
    "text_embed_dim",
    "encoder_hid_dim",
    "caption_projection_dim",
    "cross_attention_dim",
    "image_dim",
    "added_kv_proj_dim",
)


# GroupNorm group counts: the shrunk stages have 32-64 channels (Kandinsky 3 calls it "groups")
GROUP_KEYS = (
    "norm_num_groups",
    "attn_norm_num_groups",
    "groups",
    "num_groups",
    "resnet_groups",
    "norm_groups",
)
# transformer denoisers that name their core outside diffusers' num_attention_heads x attention_head_dim
# (Z-Image, Bria Fibo, PRX, Kandinsky 5/6, LongCat-AudioDiT): width, heads and depth under these names
DIFFUSERS_CORE_WIDTH_KEYS = ("dim", "hidden_size", "model_dim", "dit_dim")
DIFFUSERS_CORE_HEAD_KEYS = ("n_heads", "num_heads", "dit_heads", "num_attention_heads")
DIFFUSERS_CORE_KV_KEYS = ("n_kv_heads", "num_kv_heads", "num_key_value_heads")
# derived sizes that follow the width by ratio
DIFFUSERS_FFN_KEYS = ("ff_dim", "ffn_dim", "intermediate_size", "mlp_dim", "ffn_hidden_size")


def shrink_diffusers_config(config: dict[str, Any], model: str = "?") -> dict[str, Any]:
    """A shrunk copy of a diffusers model config (init kwargs); UNets keep 2 blocks, transformers 2 layers."""
    d = copy.deepcopy(config)
    for k in ("_class_name", "_diffusers_version", "_name_or_path", "_use_default_values"):
        d.pop(k, None)
    # __init__ defaults of None that the constructor computes with (real checkpoints set them): latent
    # channels, patch size, key/value heads (plain multi-head attention)
    if "in_channels" in d and d["in_channels"] is None:
        d["in_channels"] = 4
        if "patch_size" in d and d["patch_size"] is None:  # (a None patch_size alone means "no patching")
            d["patch_size"] = 2
    if "num_kv_heads" in d and d["num_kv_heads"] is None and _int(d.get("num_attention_heads")):
        d["num_kv_heads"] = d["num_attention_heads"]
    blocks = d.get("block_out_channels")
    unet_like = isinstance(blocks, list | tuple) and len(blocks) > 0
    if unet_like:
        n = len(blocks)
        keep = [0, n - 1] if n > 2 else list(range(n))
        if _int(d.get("spatial_compression_ratio")):
            # video/image VAEs that downsample once per stage up to a stated ratio (HunyuanVideo 1.5,
            # HunyuanImage): every stage stays, narrower
            keep = list(range(n))
        widths = ([32] + [64] * (len(keep) - 1))[: len(keep)]
        for key, value in list(d.items()):
            if key == "conditioning_embedding_out_channels" and isinstance(value, list | tuple):
                # the ControlNet's pixel-space stem: its stage count sets the 8x downsampling to the
                # latent grid (not one entry per UNet block, though both have 4): keep it, narrower
                d[key] = [min(i, 32) for i in value]
            elif isinstance(value, list | tuple) and len(value) == n and key != "block_out_channels":
                d[key] = [value[i] for i in keep]
        d["block_out_channels"] = widths
        for key in ("attention_head_dim", "num_attention_heads"):
            v = d.get(key)
            if _int(v):
                d[key] = min(v, _s.HEADS)
            elif isinstance(v, list | tuple):
                d[key] = [min(i, _s.HEADS) if _int(i) else i for i in v]
        if _int(d.get("layers_per_block")):
            d["layers_per_block"] = 1
        elif isinstance(d.get("layers_per_block"), list | tuple):
            d["layers_per_block"] = [1 for _ in d["layers_per_block"]]
        tl = d.get("transformer_layers_per_block")
        if isinstance(tl, list | tuple):
            d["transformer_layers_per_block"] = [1 for _ in tl]
        for key in GROUP_KEYS:
            if _int(d.get(key)):
                d[key] = min(d[key], 8)
        for key in DIFFUSERS_WIDTH_KEYS:
            if _int(d.get(key)) and d[key] > 32:
                d[key] = 32
        if d.get("sample_size") is None or _int(d.get("sample_size")):
            d["sample_size"] = 16 if d.get("in_channels", 3) > 3 else 32
        for key in ("encoder_block_out_channels", "decoder_block_out_channels"):
            v = d.get(key)
            if isinstance(v, list | tuple):
                d[key] = [min(i, 32) for i in v]
        if "groups" in d and "encoder_hid_dim" in d and "down_block_types" not in d:
            # Kandinsky 3's up blocks pair channels as [(in + skip, in), ..., (in, out)] over
            # layers_per_block resnets: with one, the (in, out) step is dropped and the widths disagree
            d["layers_per_block"] = 2
        if d.get("time_embedding_type") == "fourier" and d.get("use_timestep_embedding") is False:
            # 1-D UNets (Dance Diffusion) concatenate the Fourier time features to the input as channels:
            # extra_in_channels must count them (2 x block_out_channels[0] unless time_embedding_dim says)
            d["extra_in_channels"] = d.get("time_embedding_dim") or 2 * widths[0]
        if _int(d.get("num_trans_channel")):
            # ControlNet-Union adds its control-type features to the first stage's channels: the same
            # width (320 = SDXL's block_out_channels[0] in the class defaults)
            d["num_trans_channel"] = d["num_proj_channel"] = widths[0]
            d["num_trans_head"] = min(d.get("num_trans_head") or _s.HEADS, _s.HEADS)
        _fill_diffusers_nones(d)
        return d
    # transformer-style denoisers: heads x head_dim, layer counts, text/pooled conditioning widths
    if not _int(d.get("attention_head_dim")):
        _shrink_diffusers_core(d)
    heads, head_dim = d.get("num_attention_heads"), d.get("attention_head_dim")
    old_inner = heads * head_dim if _int(heads) and _int(head_dim) else None
    new_heads = min(heads, _s.HEADS) if _int(heads) else None
    new_inner = new_heads * head_dim if new_heads and _int(head_dim) else None
    if new_heads:
        d["num_attention_heads"] = new_heads
    ch, cd = d.get("num_cross_attention_heads"), d.get("cross_attention_head_dim")
    old_cross = ch * cd if _int(ch) and _int(cd) else None
    if _int(ch):
        d["num_cross_attention_heads"] = min(ch, _s.HEADS)
    for key in ("num_layers", "num_single_layers", "num_refiner_layers", "num_encoder_layers"):
        if _int(d.get(key)) and d[key] > 1:
            d[key] = 1 if key != "num_layers" else min(d[key], _s.MAX_LAYERS)
    for key in DIFFUSERS_WIDTH_KEYS:
        v = d.get(key)
        if not _int(v) or v <= 64:
            continue
        if old_inner and v == old_inner and new_inner:
            d[key] = new_inner
        elif old_cross and v == old_cross and _int(cd):
            d[key] = min(ch, _s.HEADS) * cd
        else:
            d[key] = 64
    if "cross_attention_dim_t5" in d and new_inner and _int(d.get("hidden_size")):
        # HunyuanDiT embeds patches at hidden_size and runs its blocks at heads x head_dim: one width in
        # real checkpoints (1408 = 16 x 88), not in the class defaults (1152)
        d["hidden_size"] = new_inner
    if _int(d.get("ffn_dim")) and old_inner and new_inner:
        d["ffn_dim"] = _round_to(d["ffn_dim"] * new_inner / old_inner, 16)
    if _int(d.get("sample_size")) and d["sample_size"] > 16:
        d["sample_size"] = 16
    for key in ("sample_width", "sample_height"):
        if _int(d.get(key)) and d[key] > 16:
            d[key] = 16
    if _int(d.get("sample_frames")) and d["sample_frames"] > 5:
        d["sample_frames"] = 5
    if _int(d.get("max_text_seq_length")) and d["max_text_seq_length"] > 16:
        d["max_text_seq_length"] = 16
    if isinstance(d.get("dual_attention_layers"), list | tuple):
        d["dual_attention_layers"] = [i for i in d["dual_attention_layers"] if _int(i) and i < _s.MAX_LAYERS]
    for key in ("base_dim", "decoder_base_dim"):  # Wan/Qwen-Image VAEs (2.1 widens the decoder)
        if _int(d.get(key)) and d[key] > 32:
            d[key] = 32
    if _int(d.get("num_res_blocks")) and d["num_res_blocks"] > 1:
        d["num_res_blocks"] = 1
    _shrink_diffusers_extras(d)
    _fit_diffusers_heads(d)
    fit_rope_factors(d)
    _fit_layer_lists(d)
    _fill_diffusers_nones(d)
    return d


def _shrink_diffusers_core(d: dict[str, Any]) -> None:
    """Width x heads x depth of transformer denoisers without attention_head_dim: the head size stays
    (width / heads, or the rope axes' sum when no head count is given, as Kandinsky 5/6 derive it), the
    heads drop to HEADS, the width follows, FFN sizes follow by ratio, block/layer counts drop to
    MAX_LAYERS."""
    wkey = next((k for k in DIFFUSERS_CORE_WIDTH_KEYS if _int(d.get(k)) and d[k] > 0), None)
    hkey = next((k for k in DIFFUSERS_CORE_HEAD_KEYS if _int(d.get(k)) and d[k] > 0), None)
    if wkey:
        width = d[wkey]
        axes = next((d[k] for k in ("axes_dims", "axes_dim", "axes_dims_rope") if _axes(d.get(k))), None)
        if hkey and width % d[hkey] == 0:
            head_dim, heads = width // d[hkey], min(d[hkey], _s.HEADS)
        elif axes and width % sum(axes) == 0:
            head_dim, heads = sum(axes), 1 if not hkey else min(d[hkey], _s.HEADS)
        else:
            head_dim, heads = min(width, 64), 1
        new = min(width, head_dim * heads)
        if hkey:
            d[hkey] = heads
        for key in DIFFUSERS_CORE_KV_KEYS:
            if _int(d.get(key)) and d[key] > heads:
                d[key] = heads
        for key in DIFFUSERS_FFN_KEYS:
            if _int(d.get(key)) and d[key] > new:
                d[key] = max(16, _round_to(d[key] * new / width, 16))
        d[wkey] = new
    for key, v in list(d.items()):
        if isinstance(key, str) and _int(v) and v > _s.MAX_LAYERS and _is_depth_key(key):
            d[key] = _s.MAX_LAYERS


def _axes(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_int(i) and i > 0 for i in v)


def _is_depth_key(key: str) -> bool:
    """Counts of stacked blocks: n_layers, num_visual_blocks, dit_depth, num_pre_blocks..."""
    if key in ("depth",) or key.endswith("_depth"):
        return True
    return key.startswith(("n_", "num_")) and key.endswith(("layers", "blocks"))


def _fit_diffusers_heads(d: dict[str, Any]) -> None:
    """A width capped by the side-size rules must still split into the heads (PRX: hidden_size 256 over
    28 heads); key/value heads never exceed the heads (OmniGen's 32 over the shrunk 2, Lumina's)."""
    width = next((d[k] for k in DIFFUSERS_CORE_WIDTH_KEYS if _int(d.get(k))), None)
    hkey = next((k for k in DIFFUSERS_CORE_HEAD_KEYS if _int(d.get(k)) and d[k] > 0), None)
    if hkey and width and width % d[hkey]:
        d[hkey] = next(h for h in range(min(d[hkey], _s.HEADS), 0, -1) if width % h == 0)
    heads = d.get(hkey) if hkey else None
    for key in DIFFUSERS_CORE_KV_KEYS:
        if _int(heads) and _int(d.get(key)) and d[key] > heads:
            d[key] = heads


def fit_rope_factors(d: dict[str, Any]) -> None:
    """LongRoPE's per-frequency factors (OmniGen's rope_scaling short_factor / long_factor) hold one entry
    per rotary frequency, head_dim / 2: cut to the shrunk head size (also after a config patch that
    sets them, compat.overrides)."""
    rs = d.get("rope_scaling")
    width = next((d[k] for k in DIFFUSERS_CORE_WIDTH_KEYS if _int(d.get(k))), None)
    hkey = next((k for k in DIFFUSERS_CORE_HEAD_KEYS if _int(d.get(k)) and d[k] > 0), None)
    if not (isinstance(rs, dict) and width and hkey) or width % d[hkey]:
        return
    n = width // d[hkey] // 2
    for key in ("short_factor", "long_factor"):
        v = rs.get(key)
        if isinstance(v, list) and len(v) > n:
            rs[key] = v[:n]


def _fit_layer_lists(d: dict[str, Any]) -> None:
    """Lists of layer indices (WAN VACE's vace_layers, Bria Fibo's injection_layer_ids) must name layers
    the shrunk stack has: the ones still in range, else the first."""
    n = next((d[k] for k in ("num_layers", "n_layers", "num_hidden_layers", "depth") if _int(d.get(k))), None)
    if not n:
        return
    for key, v in list(d.items()):
        if not (isinstance(key, str) and "layer" in key and isinstance(v, list) and v):
            continue
        if all(_int(i) for i in v) and any(i >= n for i in v) and key != "dual_attention_layers":
            d[key] = [i for i in v if 0 <= i < n] or [0]


def _fill_diffusers_nones(d: dict[str, Any]) -> None:
    """Fields whose None default the constructor multiplies with (real checkpoints set them): PixArt-style
    caption projections (Latte's caption_channels), the ControlNet-Union control-type embedding; parts
    the forward needs that the class defaults leave out (FramePack's)."""
    if _int(d.get("inject_face_latents_blocks")) and _int(d.get("num_layers")):
        # Wan-Animate builds num_layers // inject_face_latents_blocks face adapters and calls one at block 0
        d["inject_face_latents_blocks"] = min(d["inject_face_latents_blocks"], d["num_layers"])
    if _int(d.get("motion_encoder_size")) and d["motion_encoder_size"] > 16:
        # Wan-Animate's face motion encoder halves a motion_encoder_size-square face crop down to 4x4, one
        # 512-channel stage per halving at the class defaults: 16 pixels, 32 channels keep two stages
        d["motion_encoder_size"] = 16
        if d.get("motion_encoder_channel_sizes") is None:
            d["motion_encoder_channel_sizes"] = {str(2**i): 32 for i in range(2, 11)}
    if d.get("has_clean_x_embedder") is False:
        # FramePack's forward calls its history-latent embedder and image projection unconditionally; the
        # class defaults leave both out (the released checkpoint has them)
        d["has_clean_x_embedder"] = d["has_image_proj"] = True
    if "caption_channels" in d and d["caption_channels"] is None:
        d["caption_channels"] = 64
    if "addition_time_embed_dim" in d and d["addition_time_embed_dim"] is None and "num_control_type" in d:
        d["addition_time_embed_dim"] = 8


def _shrink_diffusers_extras(d: dict[str, Any]) -> None:
    """Sizes outside the heads x head_dim core of a transformer denoiser or a VAE without
    block_out_channels: side MLPs (Chroma's 5120-wide guidance approximator), plain transformer stacks
    (aMUSEd's UVit), per-stage channel lists of deep-compression autoencoders (DC-AE). Capped, with
    their structure (stage count, which stages have attention) kept."""
    heads = d.get("num_attention_heads")
    for key, v in list(d.items()):
        if not (isinstance(key, str) and _int(v)):
            continue
        if key.endswith(("hidden_dim", "hidden_size", "intermediate_size")) and v > 256:
            d[key] = 256 if not _int(heads) or 256 % heads == 0 else 64 * heads
        elif key in ("num_hidden_layers", "approximator_layers") and v > _s.MAX_LAYERS:
            d[key] = _s.MAX_LAYERS
    for key, v in list(d.items()):
        if not (isinstance(key, str) and isinstance(v, list | tuple) and v and all(_int(i) for i in v)):
            continue
        if key.endswith("block_out_channels") and max(v) > 64:
            d[key] = [min(i, 64) for i in v]
        elif key.endswith("stage_channels") and max(v) > 64:  # Kandinsky 6's latent upscaler stages
            d[key] = [max(16, _round_to(i * 64 / max(v), 16)) for i in v]
        elif key.endswith("layers_per_block") and max(v) > 1:
            d[key] = [min(i, 1) for i in v]

"""Shrink a full-size model config to a CPU-sized one that keeps the architecture's constraints.

The rules are generic over config *keys* (hidden/heads/layers/experts/vocab/image sizes under their many
names) and keep what the modeling code ties together: head_dim stays as it is (rotary sections, partial
rotary, mrope sections depend on it) while the number of heads drops, so the width follows heads x head_dim;
GQA/MQA stays GQA/MQA; per-layer lists (hybrid layer patterns) keep one layer of each kind; special token
ids are remapped into the smaller vocabulary consistently across sub-configs.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

VOCAB = 1000
MAX_LAYERS = 2
MAX_PATTERN_LAYERS = 4
HEADS = 2
MAX_POSITIONS = 512
MAX_SOURCE_POSITIONS = 64
PATCHES_PER_SIDE = 4
EXPERTS = 4
TOP_K = 2
SLIDING_WINDOW = 8


# the second pass for configs whose shrunk checkpoint is still over the cap (compat.materialize)
HARDER = {
    "VOCAB": 256, "MAX_LAYERS": 1, "MAX_PATTERN_LAYERS": 2, "HEADS": 1, "MAX_POSITIONS": 128,
    "PATCHES_PER_SIDE": 2, "EXPERTS": 2, "TOP_K": 1,
}  # fmt: skip


@contextlib.contextmanager
def harder():
    """Shrink with the HARDER limits inside the block (one model at a time per worker process)."""
    g = globals()
    saved = {k: g[k] for k in HARDER}
    g.update(HARDER)
    try:
        yield
    finally:
        g.update(saved)


class ShrinkError(ValueError):
    """A config the generic rules cannot shrink; the message names the field."""


LAYER_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "depth",
    "decoder_num_layers",
    "num_text_layers",
    "num_vision_layers",
)
HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "attention_heads",
    "decoder_num_attention_heads",
)
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "n_head_kv")
WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim", "hidden_dim")
HEAD_DIM_KEYS = ("head_dim", "d_kv", "attention_head_size", "dim_head", "kv_channels", "attention_head_dim")
# Sizes that follow the width by ratio (FFN and expert MLPs) ...
FFN_KEYS = (
    "intermediate_size",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "d_ff",
    "n_inner",
    "mlp_dim",
    "decoder_intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "shared_intermediate_size",
    "linear_units",
    "ffn_hidden_size",
    "expert_intermediate_size",
    "intermediate_size_mlp",
    "encoder_intermediate_size",
)
# ... and other widths, often equal to another sub-config's width (then they follow that one).
WIDTH_LIKE_KEYS = (
    "embedding_size",
    "word_embed_proj_dim",
    "projection_dim",
    "out_hidden_size",
    "projector_hidden_size",
    "text_hidden_size",
    "vision_hidden_size",
    "decoder_hidden_size",
    "encoder_hidden_size",
    "fusion_hidden_size",
    "output_hidden_size",
    "hidden_size_per_layer_input",
    "text_embed_dim",
    "vision_embed_dim",
    "query_hidden_size",
    "cross_attention_hidden_size",
    "encoder_hidden_dim",
    "d_inner",
    "pooler_output_size",
    "adapter_out_dim",
    "projection_size",
    "reassemble_hidden_size",  # DPT-style necks (Depth Anything): the backbone width
    "pooler_hidden_size",  # DeBERTa's ContextPooler: a square dense over the hidden state
    "condition_dim",  # flow/diffusion heads conditioned on a backbone's hidden state (PocketTTS)
)
STAGE_CHANNEL_KEYS = (
    "hidden_sizes",
    "stem_channels",
    "stage_in_channels",
    "stage_mid_channels",
    "stage_out_channels",
)
# The first-stage width of hierarchical (Swin-style) models, which doubles at every stage.
STEM_WIDTH_KEYS = ("embed_dim", "patch_embeds_hidden_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "moe_k", "num_selected_experts", "top_k_experts")
SHARED_EXPERT_KEYS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "max_sequence_length")
# Lists of layer indices: remapped onto the kept layers.
LAYER_INDEX_KEYS = (
    "global_attn_indexes",
    "mlp_only_layers",
    "fullatt_block_indexes",
    "deepstack_visual_indexes",
    "attn_layer_indices",
    "full_attn_idxs",
    "global_attention_layers",
    "no_rope_layer_indices",
    "sliding_window_layers",
)
# Lists of layer indices whose hidden states each feed a module of their own (DPT's reassemble stage has
# one per index, sized by neck_hidden_sizes): every named layer is kept, so the count of features stays.
FEATURE_LAYER_KEYS = ("backbone_out_indices",)
# Keyed by class index, not layer index (they look alike: {0: "LABEL_0", 1: "LABEL_1"}).
LABEL_KEYS = ("id2label", "label2id")
# Derived by the config class from the layer/stage counts: drop them and let it recompute.
DERIVED_KEYS = ("stage_names", "out_features", "out_indices", "transformers_version", "_name_or_path")
DROP_KEYS = ("quantization_config", "_commit_hash", "auto_map", "_attn_implementation_autoset")
SUBCONFIG_NAMES = ("encoder", "decoder", "generator", "question_encoder")


@dataclass
class _Ctx:
    model: str
    width_map: dict[int, int] = field(default_factory=dict)
    token_map: dict[int, int] = field(default_factory=dict)
    vocab: int = VOCAB


def shrink_config_dict(config: dict[str, Any], model: str = "?") -> dict[str, Any]:
    """A shrunk copy of a transformers config dict (``config.to_dict()``); raises ShrinkError naming the field."""
    out = copy.deepcopy(config)
    ctx = _Ctx(model=model)
    vision = out.get("vision_config") if isinstance(out.get("vision_config"), dict) else {}
    old_image = vision.get("image_size")
    levels = list(_levels(out, ""))
    plans: dict[str, _WidthPlan] = {}
    for path, level in levels:
        with _naming(path):
            plans[path] = _plan_width(level, ctx, path)
    for path, level in levels:
        with _naming(path):
            _shrink_level(level, ctx, path, plans[path])
    _remap_tokens(out, ctx)
    _fit_feature_layers(out)
    _scale_pinpoints(out, old_image, vision.get("image_size"))
    _tie_merger_width(out)
    _tie_backbone_channels(out)
    # VLM configs that leave the image placeholder unset (the processor sets it on real checkpoints)
    for key in ("image_token_id", "image_token_index"):
        if key in out and out[key] is None:
            out[key] = VOCAB - 100
    return out


@contextlib.contextmanager
def _naming(path: str):
    """Turn an unexpected failure of a rule into a ShrinkError naming the config level."""
    try:
        yield
    except ShrinkError:
        raise
    except Exception as exc:
        raise ShrinkError(f"config level {path or '<root>'!r}: {type(exc).__name__}: {exc}") from None


def _tie_backbone_channels(node: dict[str, Any]) -> None:
    """Detectors whose encoder takes the backbone's feature maps (RT-DETR, D-FINE, DEIMv2, PP-DocLayout):
    encoder_in_channels are the channels of the stages the backbone hands out, which shrank with it."""
    for v in node.values():
        if isinstance(v, dict):
            _tie_backbone_channels(v)
    bb, enc = node.get("backbone_config"), node.get("encoder_in_channels")
    if not (isinstance(bb, dict) and isinstance(enc, list) and enc and all(_int(i) for i in enc)):
        return
    sizes, idx = bb.get("stage_out_channels") or bb.get("hidden_sizes"), bb.get("out_indices")
    if not (isinstance(sizes, list) and isinstance(idx, list) and idx and all(_int(i) for i in sizes + idx)):
        return
    if not all(1 <= i <= len(sizes) for i in idx):
        return
    # PP-DocLayoutV3 takes one map more than its encoder: the first (stride 4) feeds its mask branch,
    # whose lateral convolution takes x4_feat_dim channels
    if len(idx) == len(enc) + 1 and _int(node.get("x4_feat_dim")):
        node["x4_feat_dim"], idx = sizes[idx[0] - 1], idx[1:]
    if len(idx) == len(enc):
        node["encoder_in_channels"] = [sizes[i - 1] for i in idx]  # index 0 is the stem


def _tie_merger_width(out: dict[str, Any]) -> None:
    """Qwen-VL-style vision towers end in a merger whose output (vision_config.out_hidden_size) replaces
    image-token embeddings in the text model: it must be the text width. Config-class defaults do not
    always agree (Qwen2.5-VL, Qwen3-VL derivatives pair a 3584-wide merger with a 4096-wide text model)."""
    vision, text = out.get("vision_config"), out.get("text_config")
    if not (isinstance(vision, dict) and _int(vision.get("out_hidden_size"))):
        return
    width = text.get("hidden_size") if isinstance(text, dict) else out.get("hidden_size")
    if _int(width) and width > 0:
        vision["out_hidden_size"] = width


def _scale_pinpoints(out: dict[str, Any], old: Any, new: Any) -> None:
    """Anyres grids (LLaVA-NeXT/OneVision image_grid_pinpoints) are multiples of the vision tower's image
    size: they follow it when it shrinks, so each resolution stays a grid of whole tiles."""
    pins = out.get("image_grid_pinpoints")
    if not (_int(old) and _int(new) and 0 < new < old and isinstance(pins, list) and pins):
        return
    if all(isinstance(p, list | tuple) and len(p) == 2 and all(_int(i) for i in p) for p in pins):
        out["image_grid_pinpoints"] = [
            [max(1, round(h / old)) * new, max(1, round(w / old)) * new] for h, w in pins
        ]


FEATURE_LAYER_NAMES = ("vision_feature_layer", "vision_feature_layers", "vit_layers", "select_layer")


def _fit_feature_layers(out: dict[str, Any]) -> None:
    """Vision feature taps named outside the vision config (Molmo2's adapter_config.vision_feature_layer
    [24, 18]) must index the shrunk vision tower: out-of-range taps become distinct layers counted from the
    end (-1, -2, ...), the count of taps (the projector's input width) unchanged."""
    vcfg = out.get("vision_config")
    n = next((vcfg[k] for k in LAYER_KEYS if isinstance(vcfg, dict) and _int(vcfg.get(k))), None)
    if not n:
        return

    def fit(node: dict[str, Any]) -> None:
        for k, v in node.items():
            if isinstance(v, dict) and v is not vcfg:
                fit(v)
            elif k in FEATURE_LAYER_NAMES:
                if _int(v) and not -n <= v < n:
                    node[k] = -1
                elif isinstance(v, list) and v and all(_int(i) for i in v):
                    if any(not -n <= i < n for i in v):
                        node[k] = [-(1 + j % n) for j in range(len(v))]

    fit(out)


def _is_subconfig(key: str, value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    if "model_type" in value:
        return True
    return (
        isinstance(key, str) and key.endswith("_config") and any(k in value for k in WIDTH_KEYS + LAYER_KEYS)
    )


def _levels(d: dict[str, Any], path: str):
    """Every (path, dict) config level, deepest first so children are shrunk before their parents."""
    for k, v in d.items():
        if _is_subconfig(k, v) or (k in SUBCONFIG_NAMES and isinstance(v, dict)):
            yield from _levels(v, f"{path}.{k}" if path else k)
    yield path, d


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _round_to(v: float, m: int) -> int:
    return max(m, int(round(v / m)) * m)


@dataclass
class _WidthPlan:
    width_key: str | None = None
    old_width: int | None = None
    new_width: int | None = None
    new_heads: int | None = None
    head_dim: int | None = None
    ratio: float = 1.0


def _plan_width(d: dict[str, Any], ctx: _Ctx, path: str) -> _WidthPlan:
    """Decide the level's new width (heads x head_dim) and record it so other levels can follow it."""
    plan = _WidthPlan()
    heads = next((d[k] for k in HEAD_KEYS if _int(d.get(k)) and d[k] > 0), None)
    width_key = next((k for k in WIDTH_KEYS if _int(d.get(k)) and d[k] > 0), None)
    if width_key is None:
        return plan
    # distilbert-style "dim" + "hidden_dim": hidden_dim is the FFN there.
    if width_key == "hidden_dim" and heads is None:
        return plan
    width = d[width_key]
    plan.width_key, plan.old_width = width_key, width
    explicit_hd = next((d[k] for k in HEAD_DIM_KEYS if _int(d.get(k)) and d[k] > 0), None)
    if heads is not None:
        new_heads = min(heads, HEADS)
        head_dim = explicit_hd or (width // heads if width % heads == 0 else None)
        if head_dim is None:
            new_width = min(width, 64 * new_heads)
            new_width -= new_width % new_heads
        else:
            new_width = new_heads * head_dim
        plan.new_heads, plan.head_dim = new_heads, head_dim
    else:
        new_width = min(width, 64)
    new_width = min(new_width, width)
    plan.new_width = new_width
    plan.ratio = new_width / width
    ctx.width_map.setdefault(width, new_width)
    return plan


def _shrink_level(d: dict[str, Any], ctx: _Ctx, path: str, plan: _WidthPlan) -> None:
    where = f"{ctx.model}:{path or '<root>'}"
    staged = isinstance(d.get("depths"), list) and bool(d["depths"])
    taps = d.get("out_indices") if not staged and "stage_names" in d else None
    for k in DROP_KEYS + DERIVED_KEYS:
        # stage-based backbones keep their stage count, so the stages they hand out stay valid (RT-DETR
        # takes three feature maps; recomputed, the class would default to the last stage only)
        if not (staged and k in ("out_features", "out_indices")):
            d.pop(k, None)
    if isinstance(taps, list) and taps and all(_int(i) and i >= 0 for i in taps):
        d[BACKBONE_TAPS] = taps  # layer-based backbones (ViT/DINOv2 under DPT): remapped by _shrink_layers
    _shrink_layers(d, where)
    _shrink_heads(d, plan, where)
    _shrink_widths(d, ctx, plan)
    _shrink_experts(d)
    _shrink_mamba(d)
    _shrink_vocab(d, ctx)
    _shrink_positions(d)
    _shrink_vision(d)
    _shrink_audio(d)
    _shrink_video(d)


def _shrink_layers(d: dict[str, Any], where: str) -> None:
    chosen: dict[int, list[int]] = {}
    counts = [d[k] for k in LAYER_KEYS if _int(d.get(k)) and d[k] > MAX_LAYERS]
    for key in LAYER_KEYS:
        n = d.get(key)
        if not _int(n) or n <= MAX_LAYERS:
            continue
        if n not in chosen:
            chosen[n] = _choose_layers(d, n, _feature_layers(d, n) if n == max(counts) else set())
        d[key] = len(chosen[n])
    for n, idx in chosen.items():
        for key, value in list(d.items()):
            if _per_layer(key, value, n):
                d[key] = "".join(value[i] for i in idx) if isinstance(value, str) else [value[i] for i in idx]
            elif _layer_dict(value, n) and key not in LABEL_KEYS:
                # {"05": {...}}: overrides keyed by layer index (gemma4)
                d[key] = {
                    (str(idx.index(int(k))) if isinstance(k, str) else idx.index(k)): v
                    for k, v in value.items()
                    if int(k) in idx
                }
    if chosen:
        n_old, idx = max(chosen.items())
        for key in LAYER_INDEX_KEYS:
            v = d.get(key)
            if isinstance(v, list) and all(_int(i) for i in v):
                kept = [idx.index(i) for i in v if i in idx]
                d[key] = kept or [len(idx) - 1]
        for key in FEATURE_LAYER_KEYS:
            v = d.get(key)
            if isinstance(v, list) and v and all(_int(i) and -n_old <= i < n_old for i in v):
                d[key] = [idx.index(i % n_old) for i in v]  # every named layer was kept
        v = d.get(BACKBONE_TAPS)
        if not isinstance(d.get("depths"), list) and isinstance(v, list) and v:
            if all(_int(i) and 0 <= i <= n_old for i in v):  # stage i is layer i - 1; 0 is the stem
                d[BACKBONE_TAPS] = [idx.index(i - 1) + 1 if i > 0 else 0 for i in v]
            else:
                d.pop(BACKBONE_TAPS)
        if _int(d.get("first_k_dense_replace")) and d["first_k_dense_replace"] > 0:
            d["first_k_dense_replace"] = 1
        for key in ("vision_feature_layer", "select_layer", "feature_layer"):
            v = d.get(key)
            n_new = len(idx)
            if _int(v) and not -n_new <= v < n_new:
                d[key] = -1
            elif isinstance(v, list) and all(_int(i) for i in v):
                d[key] = [i if -n_new <= i < n_new else -1 for i in v]
    # stage lists of hierarchical vision models: one block per stage
    for key in ("depths", "blocks_per_stage", "stage_num_blocks", "num_layers_per_stage"):
        v = d.get(key)
        if isinstance(v, list) and all(_int(i) for i in v):
            d[key] = [min(i, 1) if i > 0 else i for i in v]


BACKBONE_TAPS = "out_indices"


def _layer_dict(value: Any, n: int) -> bool:
    """A dict keyed by layer indices (ints or digit strings) below n."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all((_int(k) or (isinstance(k, str) and k.isdigit())) and int(k) < n for k in value)
    )


def _per_layer(key: Any, value: Any, n: int) -> bool:
    """A per-layer sequence of length n: a list, or a pattern string ("M-M*-"), never a word that
    happens to have n letters (big_bird's attention_type "block_sparse" has 12)."""
    if not isinstance(key, str) or key in LAYER_INDEX_KEYS:
        return False
    if isinstance(value, list):
        return len(value) == n
    return isinstance(value, str) and len(value) == n and ("pattern" in key or "block_type" in key)


def _feature_layers(d: dict[str, Any], n: int) -> set[int]:
    """The layers a FEATURE_LAYER_KEYS list names (of n layers): the shrunk model must keep all of them."""
    out: set[int] = set()
    for key in FEATURE_LAYER_KEYS:
        v = d.get(key)
        if isinstance(v, list) and v and all(_int(i) and -n <= i < n for i in v):
            out.update(i % n for i in v)
    v = d.get(BACKBONE_TAPS)
    if (
        not isinstance(d.get("depths"), list)
        and isinstance(v, list)
        and all(_int(i) and 0 <= i <= n for i in v)
    ):
        out.update(i - 1 for i in v if i > 0)
    return out


def _choose_layers(d: dict[str, Any], n: int, required: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Indices of the layers to keep: the first layer of each distinct per-layer signature, at least 2;
    with ``required`` (feature taps), those layers plus the first of each per-layer signature."""
    per_layer = [v for k, v in d.items() if _per_layer(k, v, n)]
    idx: list[int] = []
    seen: set[str] = set()
    for i in range(n):
        sig = repr([seq[i] for seq in per_layer])
        if sig not in seen:
            seen.add(sig)
            idx.append(i)
    idx = idx[:MAX_PATTERN_LAYERS]
    if required:
        idx = sorted(set(required) | (set(idx) if per_layer else set()))
    for i in range(n):
        if len(idx) >= min(n, MAX_LAYERS):
            break
        if i not in idx:
            idx.append(i)
    return sorted(idx)


def _shrink_heads(d: dict[str, Any], plan: _WidthPlan, where: str) -> None:
    old_heads = next((d[k] for k in HEAD_KEYS if _int(d.get(k)) and d[k] > 0), None)
    for key in HEAD_KEYS:
        v = d.get(key)
        if _int(v) and v > 0:
            d[key] = plan.new_heads or min(v, HEADS)
        elif isinstance(v, list) and v and all(_int(i) for i in v):
            d[key] = [max(1, min(i, HEADS)) for i in v]
    new_heads = plan.new_heads or (min(old_heads, HEADS) if old_heads else None)
    for key in KV_HEAD_KEYS:
        kv = d.get(key)
        if _int(kv) and kv > 0 and old_heads and new_heads:
            d[key] = new_heads if kv >= old_heads else 1
    # Fields some config classes leave None by default though their modeling code reads them directly
    # (real checkpoints always set them): head_dim = width / heads, key/value heads = heads (plain MHA),
    # the values the other config classes derive.
    if new_heads and plan.width_key and plan.new_width and "head_dim" in d and d["head_dim"] is None:
        if plan.new_width % new_heads == 0:
            d["head_dim"] = plan.new_width // new_heads
    if new_heads and "num_key_value_heads" in d and d["num_key_value_heads"] is None:
        d["num_key_value_heads"] = new_heads


def _shrink_widths(d: dict[str, Any], ctx: _Ctx, plan: _WidthPlan) -> None:
    ratio = plan.ratio
    if plan.width_key and plan.new_width:
        d[plan.width_key] = plan.new_width
    ffn_keys = FFN_KEYS + (("hidden_dim",) if plan.width_key in ("dim",) else ())
    for key in ffn_keys:
        v = d.get(key)
        if _int(v) and v > 0 and key != plan.width_key:
            d[key] = min(v, _round_to(v * ratio, 16)) if ratio < 1 else min(v, 256)
    for key in WIDTH_LIKE_KEYS:
        v = d.get(key)
        if _int(v) and v > 0 and key != plan.width_key:
            d[key] = ctx.width_map.get(v) or min(v, _round_to(v * ratio, 8) if ratio < 1 else 64)
    _tie_pixel_shuffle(d)
    # LayoutLMv2/v3 spatial embeddings: x0, y0, x1, y1 (coordinate_size each) and h, w (shape_size each)
    # are concatenated into the hidden width
    c, sz, w = d.get("coordinate_size"), d.get("shape_size"), plan.new_width
    if _int(c) and _int(sz) and _int(w) and 4 * c + 2 * sz != w and w % 2 == 0:
        d["coordinate_size"] = w // 6
        d["shape_size"] = (w - 4 * (w // 6)) // 2
    # per-level widths that are another width of the model (RT-DETR's decoder_in_channels are the hybrid
    # encoder's encoder_hidden_dim at every level): they follow it
    for key in ("decoder_in_channels",):
        v = d.get(key)
        if isinstance(v, list) and v and all(_int(i) for i in v):
            d[key] = [ctx.width_map.get(i, i) for i in v]
    # list-valued widths of hierarchical/conv models: keep stage ratios, cap the largest at 256
    # HGNetV2-style stage channel lists chain into each other (stage_in[i + 1] == stage_out[i], the stem
    # ends at stage_in[0]) and feed hidden_sizes' consumers: one factor for the whole group keeps them tied
    group = [
        k for k in STAGE_CHANNEL_KEYS if isinstance(d.get(k), list) and d[k] and all(_int(i) for i in d[k])
    ]
    top = max((max(d[k]) for k in group), default=0)
    if "stage_out_channels" in group and top > 256:
        f = 256 / top
        for key in group:
            keep = 1 if key == "stem_channels" else 0  # the stem's first entry is the image's channels
            d[key] = d[key][:keep] + [max(8, _round_to(i * f, 8)) for i in d[key][keep:]]
    for key in ("hidden_sizes", "embed_dims", "embed_dim_per_stage", "dims", "neck_hidden_sizes", "channels"):
        v = d.get(key)
        if isinstance(v, list) and v and all(_int(i) for i in v) and max(v) > 256:
            f = 256 / max(v)
            d[key] = [max(8, _round_to(i * f, 8)) for i in v]
            # group norms over the now narrower channels (BiT: GroupNorm(32) over 8 channels)
            if _int(d.get("num_groups")) and d["num_groups"] > 8:
                d["num_groups"] = 8
    # list-valued heads with a scalar stem width (Swin-style): the stem follows heads[0]; it doubles per
    # stage, and a width that was the last stage's (Swin's hidden_size, CLAP's audio hidden_size that
    # its projection takes) stays the last stage's
    heads = next((d[k] for k in HEAD_KEYS if isinstance(d.get(k), list) and d.get(k)), None)
    stages = d.get("depths")
    for key in STEM_WIDTH_KEYS:
        stem = d.get(key)
        if not (heads and _int(stem) and plan.new_heads is None):
            continue
        d[key] = 32 * heads[0]
        if key != plan.width_key and plan.width_key and isinstance(stages, list) and stages:
            if plan.old_width == stem * 2 ** (len(stages) - 1):
                d[plan.width_key] = d[key] * 2 ** (len(stages) - 1)


def _tie_pixel_shuffle(d: dict[str, Any]) -> None:
    """Pixel-shuffle vision adapters (Llama 4): the shuffle folds 1 / ratio**2 patches into one, so the
    adapter's first linear takes hidden_size / ratio**2 (its intermediate_size) and maps it to
    projector_input_dim; the second is square over projector_output_dim, which the multimodal projector
    then takes as vision_output_dim. The config-class defaults break all three ties (768 / 0.25 != 5632,
    4096 != 7680); checkpoints keep them. Tie them to the shrunk width."""
    r, width = d.get("pixel_shuffle_ratio"), d.get("hidden_size")
    if not (isinstance(r, float | int) and 0 < r < 1 and _int(width) and "projector_input_dim" in d):
        return
    inner = width / (r * r)
    if inner != int(inner):
        return
    d["intermediate_size"] = int(inner)
    for key in ("projector_input_dim", "projector_output_dim", "vision_output_dim"):
        if _int(d.get(key)):
            d[key] = width


def _shrink_mamba(d: dict[str, Any]) -> None:
    """Mamba2 mixers in hybrid models (Bamba, GraniteMoeHybrid, ...): n_heads x d_head must equal
    expand x hidden_size. The head size stays (its kernels tile by it), the head count follows the
    shrunk width; groups must divide the heads."""
    for prefix in ("mamba_", "ssm_", "linear_"):
        n, hd, ex = d.get(prefix + "n_heads"), d.get(prefix + "d_head"), d.get(prefix + "expand")
        width = next((d[k] for k in WIDTH_KEYS if _int(d.get(k)) and d[k] > 0), None)
        if not (_int(n) and _int(hd) and _int(ex) and width):
            continue
        inner = ex * width
        if n * hd == inner:
            continue
        if inner % hd == 0:
            d[prefix + "n_heads"] = inner // hd
        g = d.get(prefix + "n_groups")
        if _int(g) and d[prefix + "n_heads"] % g:
            d[prefix + "n_groups"] = 1
        chunk = d.get(prefix + "chunk_size")
        if _int(chunk) and chunk > 64:
            d[prefix + "chunk_size"] = 64


def _shrink_experts(d: dict[str, Any]) -> None:
    n_exp = None
    for key in EXPERT_KEYS:
        v = d.get(key)
        if _int(v) and v > EXPERTS:
            d[key] = EXPERTS
        if _int(d.get(key)) and d[key] > 0:
            n_exp = d[key]
    for key in TOP_K_KEYS:
        v = d.get(key)
        if _int(v) and v > 0:
            d[key] = min(v, TOP_K, n_exp or TOP_K)
    for key in SHARED_EXPERT_KEYS:
        v = d.get(key)
        if _int(v) and v > 1:
            d[key] = 1
    if _int(d.get("n_group")) and d["n_group"] > 1:
        d["n_group"] = 1
    if _int(d.get("topk_group")) and d["topk_group"] > 1:
        d["topk_group"] = 1


def _shrink_vocab(d: dict[str, Any], ctx: _Ctx) -> None:
    for key, v in list(d.items()):
        if not isinstance(key, str):
            continue
        if key.endswith("vocab_size") and key != "type_vocab_size" and _int(v) and v > VOCAB:
            d[key] = VOCAB
        elif key in ("vocab_size_per_layer_input", "unpadded_vocab_size") and _int(v) and v > VOCAB:
            d[key] = VOCAB


def _is_token_key(key: Any) -> bool:
    return (
        isinstance(key, str)
        and key.endswith(("_token_id", "_token_index", "_token_ids", "token_id"))
        or key
        in (
            "image_token_id",
            "video_token_id",
        )
    )


def _remap_tokens(d: dict[str, Any], ctx: _Ctx) -> None:
    """Move special token ids that fall outside the shrunk vocabulary to distinct ids at its top."""
    ids: set[int] = set()

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if _is_token_key(k):
                    for i in v if isinstance(v, list) else [v]:
                        if _int(i) and i >= VOCAB:
                            ids.add(i)
                elif isinstance(v, dict):
                    collect(v)

    collect(d)
    for n, orig in enumerate(sorted(ids)):
        ctx.token_map[orig] = VOCAB - 1 - n

    def apply(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if _is_token_key(k):
                    if isinstance(v, list):
                        node[k] = [ctx.token_map.get(i, i) if _int(i) else i for i in v]
                    elif _int(v):
                        node[k] = ctx.token_map.get(v, v)
                elif isinstance(v, dict):
                    apply(v)

    apply(d)


def _shrink_positions(d: dict[str, Any]) -> None:
    for key in POSITION_KEYS:
        v = d.get(key)
        if _int(v) and v > MAX_POSITIONS:
            d[key] = MAX_POSITIONS
    if _int(d.get("max_source_positions")) and d["max_source_positions"] > MAX_SOURCE_POSITIONS:
        d["max_source_positions"] = MAX_SOURCE_POSITIONS
    if _int(d.get("max_target_positions")) and d["max_target_positions"] > 128:
        d["max_target_positions"] = 128
    for key in ("sliding_window", "sliding_window_size", "attention_window_size"):
        v = d.get(key)
        if _int(v) and v > SLIDING_WINDOW:
            d[key] = SLIDING_WINDOW
    # query-based detectors that pick their queries by top-k over the encoder's anchors (RT-DETR,
    # Grounding DINO): a tiny image has fewer anchors (8x8 + 4x4 + 2x2) than the 300-900 queries
    top_k = "two_stage" in d or "anchor_image_size" in d
    if top_k and _int(d.get("num_queries")) and d["num_queries"] > 32:
        d["num_queries"] = 32
    if _int(d.get("attention_window")) and d["attention_window"] > 8:
        d["attention_window"] = 8  # longformer: even, sequence gets padded to a multiple
    elif isinstance(d.get("attention_window"), list):
        d["attention_window"] = [min(w, 8) for w in d["attention_window"]]


def _shrink_vision(d: dict[str, Any]) -> None:
    image, patch = d.get("image_size"), d.get("patch_size")
    if image is None or patch is None:
        return
    p = patch if _int(patch) else (max(patch) if isinstance(patch, list) and patch else None)
    if not p:
        return
    per_side = PATCHES_PER_SIDE
    stages = d.get("depths")
    if isinstance(stages, list) and len(stages) > 1:
        per_side = max(per_side, 2 ** len(stages))
        # windowed hierarchies (Swin): a window that tiles every stage's (tiny) resolution
        if _int(d.get("window_size")) and d["window_size"] > 2:
            d["window_size"] = 2
    merge = d.get("spatial_merge_size")
    if _int(merge) and merge > 1:
        per_side = max(per_side, merge * 2)
    size = p * per_side
    if _int(image):
        d["image_size"] = min(image, size)
    elif isinstance(image, list) and len(image) == 2:
        d["image_size"] = [min(image[0], size), min(image[1], size)]


def _shrink_audio(d: dict[str, Any]) -> None:
    conv = d.get("conv_dim")
    if isinstance(conv, list) and conv and all(_int(i) for i in conv):
        d["conv_dim"] = [min(i, 32) for i in conv]
    if _int(d.get("num_conv_pos_embeddings")) and d["num_conv_pos_embeddings"] > 16:
        d["num_conv_pos_embeddings"] = 16
    if _int(d.get("conv_channels")) and d["conv_channels"] > 64:
        d["conv_channels"] = 64
    # spectrogram transformers (AST) take exactly max_length frames
    if "num_mel_bins" in d and _int(d.get("max_length")) and d["max_length"] > 64:
        d["max_length"] = 64


def _shrink_video(d: dict[str, Any]) -> None:
    frames = d.get("num_frames")
    if not _int(frames) or frames <= 4:
        return
    tubelet = d.get("tubelet_size")
    t = tubelet if _int(tubelet) else (tubelet[0] if isinstance(tubelet, list) and tubelet else 1)
    d["num_frames"] = max(t, 4 - 4 % max(t, 1))
    if isinstance(tubelet, list) and len(tubelet) == 3 and _int(d.get("image_size")):
        d["image_size"] = min(d["image_size"], tubelet[1] * PATCHES_PER_SIDE)

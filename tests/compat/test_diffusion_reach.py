"""Issue 19 part 5 / issue 20 (reach): builder rules that take the harness's diffusion configs to the
backend. Each test builds a diffusers class from its own __init__ defaults (diffusers 0.42, nothing
downloaded), shrinks it, builds its inputs and runs the real CPU forward; each names the rule and the
sampled architectures it was written for, and fails without that rule."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from compat.accuracy import exactly_equal, to_cpu  # noqa: E402
from compat.diffusion_inputs import documented_shape  # noqa: E402
from compat.input_basics import strip_private  # noqa: E402
from compat.inputs import build_inputs  # noqa: E402
from compat.materialize import (  # noqa: E402
    build_model,
    checkpoint_bytes,
    diffusers_default_config,
    materialize,
    plan_entry,
)
from compat.shrink_diffusers import shrink_diffusers_config  # noqa: E402

CAP = 200 * 2**20  # COMPAT_MAX_CHECKPOINT_MB's default


def _plan(arch: str):
    return plan_entry({"id": f"t/{arch}", "architecture": arch, "library": "diffusers"})


def _run(arch: str):
    """Plan, build, inputs, two CPU forwards: the path the worker takes before the device run."""
    plan = _plan(arch)
    torch.manual_seed(0)
    model = build_model(plan)
    kwargs = build_inputs(model, plan)
    with torch.no_grad():
        first = model(**strip_private(kwargs))
        second = model(**strip_private(kwargs))
    same, why = exactly_equal(to_cpu(first), to_cpu(second))
    assert same, why  # deterministic, so the device run has a reference
    out = first if isinstance(first, torch.Tensor) else first[0]  # a tuple or a diffusers BaseOutput
    return model, plan, kwargs, out


def _defaults(arch: str) -> dict:
    import diffusers

    return diffusers_default_config(getattr(diffusers, arch))


# ------------------------------------------------------------------------------------------------ shrink


def test_transformer_core_without_attention_head_dim_is_shrunk():
    # Z-Image (dim 3840 / n_heads 30), LongCat-AudioDiT (dit_dim / dit_heads / dit_depth), Kandinsky 5
    # (model_dim with the head size from the rope axes): multi-GB at their class defaults
    z = shrink_diffusers_config(_defaults("ZImageTransformer2DModel"))
    assert z["dim"] == 2 * 128 and z["n_heads"] == 2 and z["n_kv_heads"] == 2 and z["n_layers"] == 2
    k5 = shrink_diffusers_config(_defaults("Kandinsky5Transformer3DModel"))
    assert k5["model_dim"] == sum(k5["axes_dims"]) and k5["num_visual_blocks"] == 2
    assert k5["ff_dim"] < 5120
    for arch in ("ZImageTransformer2DModel", "BriaFibo2Transformer2DModel", "Kandinsky5Transformer3DModel"):
        size = checkpoint_bytes(_plan(arch))
        assert size is not None and size < CAP, (arch, size)
    _, _, _, out = _run("LongCatAudioDiTTransformer")
    assert torch.isfinite(out).all()


def test_capped_width_still_splits_into_the_heads():
    # PRX: hidden_size capped to 256 while 28 heads stayed -> "must be divisible by num_heads"
    small = shrink_diffusers_config(_defaults("PRXTransformer2DModel"))
    assert small["hidden_size"] % small["num_heads"] == 0
    _run("PRXTransformer2DModel")


def test_layer_index_lists_name_kept_layers():
    # WAN VACE: vace_layers [0, 5, ..., 35] over the 2 kept layers
    small = shrink_diffusers_config(_defaults("WanVACETransformer3DModel"))
    assert small["vace_layers"] == [0]
    _, _, kwargs, _ = _run("WanVACETransformer3DModel")
    assert kwargs["control_hidden_states"].shape[1] == small["vace_in_channels"]


def test_vae_keeps_every_stage_its_compression_ratio_needs_and_required_args_get_values():
    # HunyuanImage 2.1's VAE declares seven __init__ args without defaults; HunyuanImage-Refiner and
    # HunyuanVideo 1.5 index block_out_channels[i + 1] once per downsampling stage
    cfg = _plan("AutoencoderKLHunyuanImage").config
    assert cfg["block_out_channels"] and cfg["spatial_compression_ratio"]
    _run("AutoencoderKLHunyuanImage")
    refiner = _plan("AutoencoderKLHunyuanImageRefiner").config
    assert len(refiner["block_out_channels"]) == len(
        _defaults("AutoencoderKLHunyuanImageRefiner")["block_out_channels"]
    )
    _run("AutoencoderKLHunyuanImageRefiner")


def test_group_norm_counts_and_none_widths_are_filled():
    # Kandinsky 3 calls its GroupNorm count "groups" (32 over 16 channels); Latte's caption projection
    # is built from caption_channels, None by default
    assert shrink_diffusers_config(_defaults("Kandinsky3UNet"))["groups"] <= 8
    assert build_model(_plan("Kandinsky3UNet")) is not None
    _run("LatteTransformer3DModel")


def test_wide_vae_decoders_and_upscaler_stages_fit_the_cap():
    # Qwen-Image 2.1's VAE widens its decoder (decoder_base_dim 144, 800 MB); Kandinsky 6's latent upscaler
    # has 2048-channel stages (8 GB)
    assert checkpoint_bytes(_plan("AutoencoderKLQwenImage21")) < CAP
    model, _, kwargs, _ = _run("Kandinsky6SRLatentUpscalerBank")
    assert kwargs["scale"] in model.config.scales


# ------------------------------------------------------------------------------------------------ inputs


def test_size_conditioning_and_named_timesteps():
    # CogView 3/4: original_size / target_size / crop_coords (SDXL-style micro-conditioning)
    _, _, kwargs, _ = _run("CogView3PlusTransformer2DModel")
    assert kwargs["original_size"].shape == (2, 2) and kwargs["crop_coords"].shape == (2, 2)
    # Stable Cascade: timestep_ratio in [0, 1] and a (batch, 1, width) pooled CLIP text embedding
    _, _, kwargs, _ = _run("StableCascadeUNet")
    assert ((kwargs["timestep_ratio"] > 0) & (kwargs["timestep_ratio"] < 1)).all()
    assert kwargs["clip_text_pooled"].dim() == 3


def test_models_that_scale_their_timesteps_get_sigmas():
    # NucleusMoE, QwenImage, AuraFlow multiply the timestep by 1000 themselves (Timesteps(scale=1000)):
    # their pipelines pass sigmas in [0, 1]; 500 made float32 sin/cos arguments of ~5e5 (ill-conditioned)
    for arch in ("NucleusMoEImageTransformer2DModel", "AuraFlowTransformer2DModel"):
        _, _, kwargs, _ = _run(arch)
        assert ((kwargs["timestep"] > 0) & (kwargs["timestep"] <= 1)).all(), arch
    _, _, kwargs, _ = _run("UNet2DConditionModel")  # DDPM-style: timesteps in [0, 1000)
    assert kwargs["timestep"].max() > 1


def test_text_width_from_other_config_names_and_the_text_mask():
    # Lumina 2 names its text width cap_feat_dim and needs encoder_attention_mask
    model, _, kwargs, _ = _run("Lumina2Transformer2DModel")
    assert kwargs["encoder_hidden_states"].shape[-1] == model.config.cap_feat_dim
    assert kwargs["encoder_attention_mask"].shape == kwargs["encoder_hidden_states"].shape[:2]


def test_trial_forward_refits_an_unnamed_text_width():
    # Allegro / SANA-Video: the width the text projection takes is named by no config key we know; the
    # trial forward's "mat1 and mat2 shapes cannot be multiplied" says it
    model, _, kwargs, _ = _run("AllegroTransformer3DModel")
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.in_features == 64)
    assert first is not None and kwargs["encoder_hidden_states"].shape[-1] != 0


def test_documented_layouts_are_followed():
    # unCLIP's PriorTransformer: hidden_states (batch_size, embedding_dim) and num_embeddings text tokens,
    # both from the forward docstring
    model, _, kwargs, _ = _run("PriorTransformer")
    assert documented_shape(model, "hidden_states") == ["batch_size", "embedding_dim"]
    assert kwargs["hidden_states"].shape == (2, model.config.embedding_dim)
    assert kwargs["encoder_hidden_states"].shape[1] == model.config.num_embeddings


def test_token_image_models_get_codes_and_micro_conditions():
    # aMUSEd's UVit2DModel takes VQ codes (input_ids), a pooled text embedding and 5 micro-conditions
    model, _, kwargs, _ = _run("UVit2DModel")
    assert "hidden_states" not in kwargs and kwargs["input_ids"].max() < model.config.codebook_size
    assert kwargs["micro_conds"].shape == (2, 5)


def test_video_controlnet_takes_a_condition_and_mask_per_frame():
    # SparseCtrl: latent-sized condition (simplified embedding) plus a one-channel mask, per frame
    _, _, kwargs, _ = _run("SparseControlNetModel")
    cond, mask = kwargs["controlnet_cond"], kwargs["conditioning_mask"]
    assert cond.dim() == 5 and mask.shape == (cond.shape[0], 1, *cond.shape[2:])


def test_deep_compression_vae_gets_an_image_its_stages_can_halve():
    # DC-AE halves the image once per encoder stage and pixel-unshuffles the rest by 2
    model, _, kwargs, _ = _run("AutoencoderDC")
    assert kwargs["sample"].shape[-1] >= 2 ** len(model.config.encoder_block_out_channels)


# ---------------------------------------------------------------------------------------------- caching


def test_cached_checkpoint_is_not_sized_again(tmp_path, monkeypatch):
    # review finding: fit_checkpoint_cap built the model on the meta device on every cache hit
    import compat.materialize as mat

    plan = _plan("PRXTransformer2DModel")
    plan.dedup_key = "k" * 24
    path = materialize(plan, tmp_path)
    written = dict(plan.config)

    def boom(_plan):
        raise AssertionError("sized again")

    monkeypatch.setattr(mat, "checkpoint_bytes", boom)
    again = _plan("PRXTransformer2DModel")
    again.dedup_key = "k" * 24
    assert materialize(again, tmp_path) == path
    assert again.config == written  # the config the folder was written with
    with pytest.raises(AssertionError, match="sized again"):
        fresh = _plan("PRXTransformer2DModel")
        fresh.dedup_key = "j" * 24
        materialize(fresh, tmp_path)


# ------------------------------------------------------------------------------ per-family input builders
# Issue 20: classes whose pipeline passes inputs no generic rule infers (compat.diffusion_family_inputs).
# Each test runs the real CPU forward twice on the registered builder's inputs and checks the piece of
# the pipeline's layout the generic builder got wrong.


def test_family_registry_is_consulted_first_and_documented():
    from compat.diffusion_family_inputs import FAMILY_BUILDERS

    assert len(FAMILY_BUILDERS) >= 24
    for name, fn in FAMILY_BUILDERS.items():
        assert fn.__doc__ and len(fn.__doc__.strip()) > 40, name
    _, _, kwargs, _ = _run("ZImageTransformer2DModel")
    assert set(kwargs) >= {"x", "t", "cap_feats"}  # the registry's, not the generic "hidden_states"


def test_ideogram4_packed_sequence_roles():
    model, _, kwargs, out = _run("Ideogram4Transformer2DModel")
    from diffusers.models.transformers.transformer_ideogram4 import (
        LLM_TOKEN_INDICATOR,
        OUTPUT_IMAGE_INDICATOR,
    )

    ind = kwargs["indicator"]
    assert (ind == LLM_TOKEN_INDICATOR).any() and (ind == OUTPUT_IMAGE_INDICATOR).any()
    assert kwargs["position_ids"].shape == (*ind.shape, 3)
    assert out.shape == kwargs["hidden_states"].shape and torch.isfinite(out).all()


def test_kandinsky5_channels_last_with_rope_positions():
    model, _, kwargs, out = _run("Kandinsky5Transformer3DModel")
    x = kwargs["hidden_states"]
    assert x.dim() == 5 and x.shape[-1] == model.config.in_visual_dim
    assert [len(p) for p in kwargs["visual_rope_pos"]] == [x.shape[1], x.shape[2] // 2, x.shape[3] // 2]
    assert out.shape[:-1] == x.shape[:-1]


def test_kandinsky6_visual_cond_channels():
    model, _, kwargs, _ = _run("Kandinsky6Transformer3DModel")
    assert model.config.visual_cond
    assert kwargs["hidden_states"].shape[-1] == 2 * model.config.in_visual_dim + 1


def test_kandinsky6_sr_token_grid_fits_nabla_blocks():
    model, _, kwargs, _ = _run("Kandinsky6SRTransformer3DModel")
    _, _, h, w, c = kwargs["hidden_states"].shape
    assert h % 8 == 0 and w % 8 == 0 and c == 2 * model.config.in_visual_dim + 1


def test_lumina_next_rope_table_and_kwargs():
    model, _, kwargs, _ = _run("LuminaNextDiT2DModel")
    rope = kwargs["image_rotary_emb"]
    assert rope.is_complex() and rope.shape[-1] == model.head_dim // 2
    assert kwargs["cross_attention_kwargs"] == {}


def test_omnigen_mask_positions_and_rope_factors():
    model, plan, kwargs, _ = _run("OmniGenTransformer2DModel")
    seq = kwargs["attention_mask"].shape[-1]
    n_img = (16 // model.config.patch_size) ** 2
    assert seq == kwargs["input_ids"].shape[1] + 1 + n_img and kwargs["position_ids"].shape[1] == seq
    head = plan.config["hidden_size"] // plan.config["num_attention_heads"]
    assert len(plan.config["rope_scaling"]["short_factor"]) == head // 2  # patched factors follow the heads


def test_z_image_lists_per_sample():
    model, _, kwargs, out = _run("ZImageTransformer2DModel")
    assert isinstance(kwargs["x"], list) and kwargs["x"][0].shape[1] == 1
    assert len({c.shape[0] for c in kwargs["cap_feats"]}) == 2  # unpadded, one length per prompt
    assert ((kwargs["t"] >= 0) & (kwargs["t"] <= 1)).all()


def test_hunyuan_dit_and_controlnet_text_lengths_and_width():
    for arch in ("HunyuanDiT2DModel", "HunyuanDiT2DControlNetModel"):
        model, plan, kwargs, _ = _run(arch)
        assert kwargs["encoder_hidden_states"].shape[1] == model.config.text_len, arch
        assert kwargs["encoder_hidden_states_t5"].shape[1] == model.config.text_len_t5, arch
        assert len(kwargs["image_rotary_emb"]) == 2 and kwargs["image_meta_size"].shape == (2, 6)
        # one width for the patch embedding and the blocks
        assert (
            plan.config["hidden_size"]
            == plan.config["num_attention_heads"] * plan.config["attention_head_dim"]
        )


def test_bria_fibo_text_encoder_layers_per_block():
    model, _, kwargs, _ = _run("BriaFiboTransformer2DModel")
    n = model.config.num_layers + model.config.num_single_layers
    assert len(kwargs["text_encoder_layers"]) == n
    assert kwargs["img_ids"].shape == (kwargs["hidden_states"].shape[1], 3)


def test_bria_fibo2_text_bundles():
    model, _, kwargs, _ = _run("BriaFibo2Transformer2DModel")
    ehs = kwargs["encoder_hidden_states"]
    assert ehs.dim() == 4 and ehs.shape[1] == 1 + len(model.config.injection_layer_ids)
    assert ((kwargs["timestep"] > 0) & (kwargs["timestep"] < 1)).all()


def test_framepack_history_latents_and_1d_indices():
    model, plan, kwargs, out = _run("HunyuanVideoFramepackTransformer3DModel")
    assert plan.config["has_clean_x_embedder"] and plan.config["has_image_proj"]
    for k in ("indices_latents", "indices_latents_clean", "indices_latents_history_2x"):
        assert kwargs[k].dim() == 1, k
    assert kwargs["indices_latents"].numel() == kwargs["hidden_states"].shape[2]
    assert out.shape == kwargs["hidden_states"].shape


def test_hunyuan_video15_reads_three_masked_condition_streams():
    """The forward reads the ByT5 stream and image embeddings whatever the task (the generic builder left
    them None: `layer_norm` given None); text-to-video passes zero image embeddings, as the pipeline."""
    model, plan, kwargs, out = _run("HunyuanVideo15Transformer3DModel")
    assert kwargs["encoder_hidden_states_2"].shape[-1] == plan.config["text_embed_2_dim"]
    assert kwargs["image_embeds"].shape[-1] == plan.config["image_embed_dim"]
    assert not kwargs["image_embeds"].any()
    for k in ("encoder_attention_mask", "encoder_attention_mask_2"):
        assert kwargs[k].any() and not kwargs[k].all(), k  # valid tokens and padding
    assert out.shape[2:] == kwargs["hidden_states"].shape[2:]


def test_i2vgen_xl_image_latents_and_embedding():
    _, _, kwargs, _ = _run("I2VGenXLUNet")
    img = kwargs["image_latents"]
    assert img.shape == kwargs["sample"].shape and (img[:, :, 1:] == 0).all()
    assert kwargs["image_embeddings"].dim() == 3


def test_qwen_image_controlnet_packed_with_img_shapes():
    _, _, kwargs, _ = _run("QwenImageControlNetModel")
    f, h, w = kwargs["img_shapes"][0]
    assert kwargs["hidden_states"].shape[1] == f * h * w == kwargs["controlnet_cond"].shape[1]


def test_controlnet_union_control_width_follows_first_stage():
    model, plan, kwargs, _ = _run("ControlNetUnionModel")
    assert plan.config["num_trans_channel"] == plan.config["block_out_channels"][0]
    assert isinstance(kwargs["controlnet_cond"], list) and kwargs["control_type"].sum(-1).eq(1).all()


def test_wan_animate_pose_and_face_streams():
    model, plan, kwargs, out = _run("WanAnimateTransformer3DModel")
    x, pose, face = kwargs["hidden_states"], kwargs["pose_hidden_states"], kwargs["face_pixel_values"]
    assert pose.shape[2] + 1 == x.shape[2] and face.shape[2] == 4 * pose.shape[2] - 3
    assert face.shape[-1] == plan.config["motion_encoder_size"] <= 16
    assert plan.config["num_layers"] // plan.config["inject_face_latents_blocks"] >= 1


def test_joyimage_edit_plus_prepatchified_with_shape_list():
    _, _, kwargs, _ = _run("JoyImageEditPlusTransformer3DModel")
    n = sum(t * h * w for t, h, w in kwargs["shape_list"][0])
    assert kwargs["hidden_states"].dim() == 6 and kwargs["hidden_states"].shape[1] == n


def test_anyflow_per_frame_times():
    for arch in ("AnyFlowTransformer3DModel", "AnyFlowFARTransformer3DModel"):
        _, _, kwargs, _ = _run(arch)
        frames = kwargs["hidden_states"].shape[1]
        assert kwargs["timestep"].shape == (2, frames) and (kwargs["r_timestep"] <= kwargs["timestep"]).all()
        if "chunk_partition" in kwargs:
            assert sum(kwargs["chunk_partition"]) == frames


def test_ace_step_context_latents_complete_the_input_width():
    model, _, kwargs, _ = _run("AceStepTransformer1DModel")
    width = kwargs["hidden_states"].shape[-1] + kwargs["context_latents"].shape[-1]
    assert width == model.config.in_channels
    assert torch.equal(kwargs["timestep"], kwargs["timestep_r"])


def test_cogvideox_text_at_max_length():
    model, _, kwargs, _ = _run("CogVideoXTransformer3DModel")
    assert kwargs["encoder_hidden_states"].shape[1] == model.config.max_text_seq_length
    assert kwargs["hidden_states"].shape[-1] == model.config.sample_width


def test_sana_wm_camera_conditioning():
    model, _, kwargs, out = _run("SanaWMTransformer3DModel")
    frames = kwargs["hidden_states"].shape[2]
    assert kwargs["camera_conditions"].shape == (2, frames, 20)
    assert kwargs["chunk_plucker"].shape[1] == model.config.chunk_plucker_channels
    assert (kwargs["timestep"][:, :, 0] == 0).all()
    assert out.shape == kwargs["hidden_states"].shape


def test_video_vaes_get_clips_their_compression_takes():
    _, _, kwargs, out = _run("AutoencoderKLMochi")
    x = kwargs["sample"]
    assert x.shape[1] == 3 and (x.shape[2] - 1) % 6 == 0 and out.shape == x.shape
    model, _, kwargs, out = _run("AutoencoderKLHunyuanVideo15")
    assert (kwargs["sample"].shape[2] - 1) % model.config.temporal_compression_ratio == 0
    _, _, kwargs, out = _run("AutoencoderKLTemporalDecoder")
    assert kwargs["sample"].dim() == 4 and kwargs["num_frames"] == 2 and out.shape == kwargs["sample"].shape


def test_unet1d_and_kandinsky3_shrunk_configs_run():
    cfg = _plan("UNet1DModel").config
    assert cfg["extra_in_channels"] == 2 * cfg["block_out_channels"][0]
    _run("UNet1DModel")
    assert _plan("Kandinsky3UNet").config["layers_per_block"] >= 2
    _run("Kandinsky3UNet")

"""Issue 20 (reach): generic builder rules that turned harness errors of the 5,000-model run into models
that reach the backend. Configs come from transformers/diffusers classes (nothing downloaded); each test
names the rule and the architectures it was written for."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from compat.input_basics import strip_private  # noqa: E402
from compat.inputs import build_inputs, refit_image_tokens  # noqa: E402
from compat.materialize import Plan, build_model, plan_entry  # noqa: E402
from compat.shrink import shrink_config_dict  # noqa: E402
from compat.shrink_diffusers import shrink_diffusers_config  # noqa: E402
from tests.compat.in_process import run_plan  # noqa: E402


def _cfg(model_type: str) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type).to_dict()


def _model(arch: str, library: str = "transformers", **entry):
    plan = plan_entry({"id": f"t/{arch}", "architecture": arch, "library": library, **entry})
    torch.manual_seed(0)
    return build_model(plan), plan


def _forward(model, plan, kwargs):
    with torch.no_grad():
        for _ in range(3):
            try:
                return model(**strip_private(kwargs))
            except Exception as exc:
                if not refit_image_tokens(model, plan, kwargs, exc):
                    raise
    raise AssertionError("no fit after 3 tries")


# ------------------------------------------------------------------------------------------------ shrink


def test_head_dim_and_kv_heads_left_none_by_the_config_class_are_derived():
    # HunYuan, Ministral, LFM2: the class defaults leave head_dim None, the modeling code reads it
    small = shrink_config_dict(_cfg("hunyuan_v1_dense"))
    assert small["head_dim"] == small["hidden_size"] // small["num_attention_heads"]
    small = shrink_config_dict({"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": None})
    assert small["num_key_value_heads"] == small["num_attention_heads"]  # MHA, as other classes derive
    # set head_dims are never touched
    assert (
        shrink_config_dict({"hidden_size": 512, "num_attention_heads": 8, "head_dim": 32})["head_dim"] == 32
    )


@pytest.mark.parametrize("model_type", ["granitemoehybrid", "bamba"])
def test_mamba_heads_follow_the_shrunk_width(model_type):
    from transformers import AutoConfig

    small = shrink_config_dict(_cfg(model_type))
    assert small["mamba_n_heads"] * small["mamba_d_head"] == small["mamba_expand"] * small["hidden_size"]
    assert small["mamba_d_head"] == _cfg(model_type)["mamba_d_head"]  # the head size stays
    cls = type(AutoConfig.for_model(model_type))
    cls.from_dict({k: v for k, v in small.items() if k != "model_type"})  # the strict validator accepts it


def test_vision_feature_taps_outside_the_vision_config_index_the_shrunk_tower():
    # Molmo2: adapter_config.vision_feature_layer [24, 18] over a 2-layer tower
    full = {
        "vision_config": {"model_type": "x", "hidden_size": 64, "num_hidden_layers": 27},
        "adapter_config": {"model_type": "y", "hidden_size": 64, "vision_feature_layer": [24, 18]},
    }
    small = shrink_config_dict(full)
    assert small["vision_config"]["num_hidden_layers"] == 2
    assert small["adapter_config"]["vision_feature_layer"] == [-1, -2]  # two distinct taps, as before
    ok = shrink_config_dict({**full, "adapter_config": {"model_type": "y", "vision_feature_layer": -2}})
    assert ok["adapter_config"]["vision_feature_layer"] == -2  # in range: kept


def test_anyres_pinpoints_follow_the_vision_image_size():
    small = shrink_config_dict(_cfg("llava_next"))
    size = small["vision_config"]["image_size"]
    assert size < 336
    assert all(h % size == 0 and w % size == 0 for h, w in small["image_grid_pinpoints"])
    assert small["image_grid_pinpoints"][0] == [size, 2 * size]  # [336, 672] keeps its 1x2 grid


def test_merger_output_is_the_text_width():
    full = {
        "vision_config": {"model_type": "v", "hidden_size": 1152, "num_heads": 16, "out_hidden_size": 3584},
        "text_config": {"model_type": "t", "hidden_size": 4096, "num_attention_heads": 32},
    }
    small = shrink_config_dict(full)
    assert small["vision_config"]["out_hidden_size"] == small["text_config"]["hidden_size"]


def test_diffusers_side_mlps_stacks_and_stage_lists_are_capped():
    chroma = {"num_attention_heads": 24, "attention_head_dim": 128, "approximator_hidden_dim": 5120}
    chroma |= {"approximator_layers": 5, "num_layers": 19}
    small = shrink_diffusers_config(chroma)
    assert small["approximator_hidden_dim"] <= 256 and small["approximator_layers"] == 2
    dcae = {
        "encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024],
        "encoder_layers_per_block": [2] * 6,
    }
    small = shrink_diffusers_config(dcae)
    assert small["encoder_block_out_channels"] == [64] * 6  # every stage kept
    assert small["encoder_layers_per_block"] == [1] * 6


def test_diffusers_none_defaults_are_filled_and_controlnet_stem_keeps_its_stages():
    small = shrink_diffusers_config({"in_channels": None, "patch_size": None, "num_attention_heads": 16})
    assert small["in_channels"] == 4 and small["patch_size"] == 2
    vae = shrink_diffusers_config({"in_channels": 12, "patch_size": None})
    assert vae["patch_size"] is None  # None alone means "no patching" (Wan VAE)
    cn = shrink_diffusers_config(
        {
            "block_out_channels": [320, 640, 1280, 1280],
            "down_block_types": ["a", "b", "c", "d"],
            "conditioning_embedding_out_channels": [16, 32, 96, 256],
        }
    )
    assert len(cn["conditioning_embedding_out_channels"]) == 4  # 8x down to the latent grid
    assert len(cn["down_block_types"]) == 2


# ------------------------------------------------------------------------------------ plan and inputs


def test_decoder_only_classifier_gets_a_pad_token_and_runs_batched():
    model, plan = _model("GPT2ForSequenceClassification")
    assert isinstance(plan.config["pad_token_id"], int)
    kwargs = build_inputs(model, plan)
    assert not (kwargs["input_ids"] == plan.config["pad_token_id"]).any()
    assert _forward(model, plan, kwargs).logits.shape[0] == 2


def test_naflex_patches_for_siglip2():
    model, plan = _model("Siglip2ForImageClassification")
    kwargs = build_inputs(model, plan)
    b, n, d = kwargs["pixel_values"].shape
    assert kwargs["spatial_shapes"].tolist() == [[4, 4]] * b and n == 16
    assert kwargs["pixel_attention_mask"].shape == (b, n)
    assert _forward(model, plan, kwargs).logits.shape[0] == b


def test_flux_style_denoisers_get_packed_latents():
    model, plan = _model("BriaTransformer2DModel", library="diffusers")
    kwargs = build_inputs(model, plan)
    assert kwargs["hidden_states"].dim() == 3
    assert kwargs["hidden_states"].shape[-1] == model.config.in_channels
    _forward(model, plan, kwargs)


def test_transformer_controlnet_cond_is_latent():
    model, plan = _model("SD3ControlNetModel", library="diffusers")
    kwargs = build_inputs(model, plan)
    assert kwargs["controlnet_cond"].shape == kwargs["hidden_states"].shape
    _forward(model, plan, kwargs)


def test_anyres_llava_next_gets_tiles_and_image_sizes():
    model, plan = _model("LlavaNextForConditionalGeneration")
    kwargs = build_inputs(model, plan)
    assert kwargs["pixel_values"].dim() == 5 and kwargs["image_sizes"].shape == (2, 2)
    _forward(model, plan, kwargs)


def test_video_towers_masked_positions_and_qformer_ids():
    model, plan = _model("VJEPA2ForVideoClassification")
    assert "pixel_values_videos" in build_inputs(model, plan)
    model, plan = _model("VideoMAEForPreTraining")
    kwargs = build_inputs(model, plan)
    mask = kwargs["bool_masked_pos"]
    assert mask.dtype == torch.bool and len(set(mask.sum(1).tolist())) == 1  # same count per sample
    _forward(model, plan, kwargs)
    model, plan = _model("InstructBlipForConditionalGeneration")
    kwargs = build_inputs(model, plan)
    assert kwargs["qformer_input_ids"].max() < model.config.qformer_config.vocab_size


def test_mel_first_conv_encoders_get_channels_first_features():
    model, plan = _model("GlmAsrEncoder")
    kwargs = build_inputs(model, plan)
    assert kwargs["input_features"].shape[1] == model.config.num_mel_bins
    _forward(model, plan, kwargs)


def test_a_forward_that_wants_a_frames_axis_gets_one():
    plan = Plan("t/x", "diffusers", "AutoencoderKLX", "AutoencoderKLX", {})
    kwargs = {"sample": torch.zeros(2, 3, 8, 8)}
    err = ValueError("not enough values to unpack (expected 5, got 4)")
    assert refit_image_tokens(None, plan, kwargs, err)
    assert kwargs["sample"].shape == (2, 3, 1, 8, 8)  # diffusers: (batch, C, frames, H, W)
    plan = Plan("t/y", "transformers", "XCLIPModel", "AutoModel", {})

    class _M:
        config = type("C", (), {"num_frames": 4})()

    kwargs = {"pixel_values": torch.zeros(2, 3, 8, 8)}
    assert refit_image_tokens(_M(), plan, kwargs, err)
    assert kwargs["pixel_values"].shape == (2, 4, 3, 8, 8)  # transformers: (batch, frames, C, H, W)
    assert not refit_image_tokens(_M(), plan, kwargs, ValueError("something else"))


def test_detector_backbone_stages_and_query_count_stay_consistent():
    # RT-DETR: three feature maps from a stage-based backbone, encoder/decoder channels follow the shrink,
    # top-k query selection over a tiny image's anchors
    small = shrink_config_dict(_cfg("rt_detr_v2"))
    bb = small["backbone_config"]
    assert bb["out_indices"] == [2, 3, 4]  # kept: the stage count did not change
    assert small["encoder_in_channels"] == [bb["hidden_sizes"][i - 1] for i in bb["out_indices"]]
    assert set(small["decoder_in_channels"]) == {small["encoder_hidden_dim"]}
    assert small["num_queries"] <= 32
    assert shrink_config_dict(_cfg("detr"))["num_queries"] == 100  # no top-k: untouched
    model, plan = _model("RTDetrV2ForObjectDetection")
    _forward(model, plan, build_inputs(model, plan))


def test_loader_takes_the_saved_config_class():
    # Emu3ForCausalLM saves an "emu3_text" config that AutoModelForCausalLM does not map; Evolla's
    # AutoModel entry rejects its own config class: both load by their class
    assert plan_entry({"id": "t/e", "architecture": "Emu3ForCausalLM", "task": "text-generation"}).loader == (
        "Emu3ForCausalLM"
    )
    assert plan_entry({"id": "t/v", "architecture": "EvollaModel"}).loader == "EvollaModel"
    assert plan_entry({"id": "t/g", "architecture": "GPT2LMHeadModel", "task": "text-generation"}).loader == (
        "AutoModelForCausalLM"
    )


def test_layer_based_backbone_taps_are_kept_and_renumbered():
    # Depth Anything: a DINOv2 backbone hands out stages 9..12 of 12 to a 4-level neck
    small = shrink_config_dict(_cfg("depth_anything"))
    bb = small["backbone_config"]
    assert len(bb["out_indices"]) == 4 and bb["num_hidden_layers"] == 4
    assert bb["out_indices"] == [1, 2, 3, 4]  # stage i is layer i - 1: every tapped layer kept
    assert small["reassemble_hidden_size"] == bb["hidden_size"]
    model, plan = _model("DepthAnythingForDepthEstimation")
    _forward(model, plan, build_inputs(model, plan))


def test_layoutlmv3_spatial_embeddings_fill_the_width():
    small = shrink_config_dict(_cfg("layoutlmv3"))
    assert 4 * small["coordinate_size"] + 2 * small["shape_size"] == small["hidden_size"]


def test_hgnetv2_stage_channels_stay_chained():
    small = shrink_config_dict(_cfg("d_fine"))
    bb = small["backbone_config"]
    assert max(bb["stage_out_channels"]) <= 256 and bb["stem_channels"][0] == 3
    assert bb["stage_in_channels"][1:] == bb["stage_out_channels"][:-1]
    assert bb["stage_in_channels"][0] == bb["stem_channels"][-1]
    assert small["encoder_in_channels"] == [bb["stage_out_channels"][i - 1] for i in bb["out_indices"]]


def test_retrieval_wrappers_size_inputs_from_the_vlm_config():
    model, plan = _model("ColPaliForRetrieval")
    kwargs = build_inputs(model, plan)
    assert (kwargs["input_ids"] == model.config.vlm_config.image_token_index).any()
    _forward(model, plan, kwargs)


@pytest.mark.parametrize("arch", ["BartForSequenceClassification", "T5ForSequenceClassification"])
def test_seq2seq_classifiers_pool_at_a_final_eos(arch):
    model, plan = _model(arch)
    kwargs = build_inputs(model, plan)
    assert (kwargs["input_ids"][:, -1] == model.config.eos_token_id).all()
    assert kwargs["decoder_input_ids"].shape == kwargs["input_ids"].shape  # what the head pools over
    assert _forward(model, plan, kwargs).logits.shape[0] == 2


# ------------------------------------------------- shard 7/40 of the 5,000 sample: its six harness errors


def test_flow_head_condition_dim_follows_the_backbone_width():
    # PocketTTS validates flow_head_config.condition_dim == hidden_size (it conditions on the backbone)
    model, plan = _model("PocketTTSForConditionalGeneration")
    assert plan.config["flow_head_config"]["condition_dim"] == plan.config["hidden_size"]
    assert _forward(model, plan, build_inputs(model, plan)).logits.shape[0] == 2


def test_pixel_shuffle_adapter_widths_are_tied():
    # Llama 4: the class defaults break the adapter's ties (768 / 0.25 != 5632, 4096 != 7680)
    vis = shrink_config_dict(_cfg("llama4"))["vision_config"]
    r = vis["pixel_shuffle_ratio"]
    assert vis["intermediate_size"] == vis["hidden_size"] / (r * r)
    assert vis["projector_input_dim"] == vis["projector_output_dim"] == vis["vision_output_dim"]
    model, plan = _model("Llama4ForConditionalGeneration", task="image-text-to-text")
    assert plan.config["return_dict"] is False  # the override around the ModelOutput branch's bug
    kwargs = build_inputs(model, plan)
    assert kwargs["return_dict"] is True and "pixel_values" in kwargs
    out = _forward(model, plan, kwargs)
    assert isinstance(out, tuple) and out[0].shape[:2] == kwargs["input_ids"].shape


def test_encoder_only_class_of_an_encoder_decoder_type():
    model, plan = _model("T5GemmaEncoderModel")  # refuses is_encoder_decoder=True, the class default
    assert plan.config["is_encoder_decoder"] is False
    assert _forward(model, plan, build_inputs(model, plan)).last_hidden_state.shape[0] == 2
    model, plan = _model("T5EncoderModel")  # T5-style encoders clear the flag themselves: unchanged
    assert _forward(model, plan, build_inputs(model, plan)).last_hidden_state.shape[0] == 2


def test_splinter_text_carries_a_question_token():
    model, plan = _model("SplinterForPreTraining")
    kwargs = build_inputs(model, plan)
    assert (kwargs["input_ids"] == model.config.question_token_id).any(dim=-1).all()
    assert _forward(model, plan, kwargs).start_logits.shape[0] == 2


def test_towers_the_config_leaves_out_get_no_inputs():
    # Gemma 4's class defaults have no vision or audio config: the model builds no tower for them
    model, plan = _model("Gemma4ForConditionalGeneration", task="text-generation")
    assert model.config.vision_config is None and model.config.audio_config is None
    kwargs = build_inputs(model, plan)
    assert not {"pixel_values", "input_features"} & set(kwargs)
    assert _forward(model, plan, kwargs).logits.shape[0] == 2


def test_omni_thinker_gets_a_vision_start_token():
    # get_rope_index reads vision_start_token_id, which the config class does not declare (an override)
    model, plan = _model("Qwen2_5OmniThinkerModel")
    start = plan.config["vision_start_token_id"]
    assert start < plan.config["text_config"]["vocab_size"]
    kwargs = build_inputs(model, plan)
    assert (kwargs["input_ids"][:, 0] == start).all() and "image_grid_thw" in kwargs
    assert _forward(model, plan, kwargs).last_hidden_state.shape[0] == 2


# ----------------------------------------------- shard 23/40 of the 5,000 sample: its three harness errors


def _on_tpu(plan, tmp_path) -> dict:
    """The worker's own run of ``plan``: materialize, from_pretrained, CPU reference, then tpu eager."""
    (rec,) = run_plan(plan, tmp_path, device="tpu")
    return rec


def test_doge_runs_where_flex_attention_is_reported_unavailable(tmp_path):
    # transformers answers is_torch_flex_attn_available() False with a tpu accelerator, so modeling_doge
    # never imports BlockMask, which its attention reads unguarded: a NameError, on CPU too (hf_tpu's
    # integrations bind it when the module is imported)
    from transformers.models.doge import modeling_doge

    plan = plan_entry({"id": "t/doge", "architecture": "DogeForCausalLM", "task": "text-generation"})
    rec = _on_tpu(plan, tmp_path)
    assert rec["status"] == "pass", rec["error"]
    assert modeling_doge.BlockMask is torch.nn.attention.flex_attention.BlockMask


def test_per_tile_pixel_mask_where_the_forward_documents_one(tmp_path):
    # GraniteDocling picks real tiles with a (batch, tiles) mask; Idefics3 and kin mask pixels
    model, plan = _model("GraniteDoclingForConditionalGeneration", task="image-text-to-text")
    kwargs = build_inputs(model, plan)
    b, n = kwargs["pixel_values"].shape[:2]
    assert kwargs["pixel_attention_mask"].shape == (b, n)
    rec = _on_tpu(plan, tmp_path)
    assert rec["status"] == "pass", rec["error"]
    model, plan = _model("Idefics3ForConditionalGeneration", task="image-text-to-text")
    kwargs = build_inputs(model, plan)
    b, n, _, h, w = kwargs["pixel_values"].shape
    assert kwargs["pixel_attention_mask"].shape == (b, n, h, w)


def test_videollama3_images_carry_their_merge_sizes(tmp_path):
    # VideoLLaMA 3 takes each image's merge size (its processor's) beside image_grid_thw; so does its tower
    model, plan = _model("VideoLlama3ForConditionalGeneration", task="image-text-to-text")
    kwargs = build_inputs(model, plan)
    assert kwargs["image_merge_sizes"].tolist() == [1] * len(kwargs["image_grid_thw"])
    rec = _on_tpu(plan, tmp_path)
    assert rec["status"] == "pass", rec["error"]
    model, plan = _model("VideoLlama3VisionModel")
    kwargs = build_inputs(model, plan)
    assert kwargs["merge_sizes"].shape == (len(kwargs["grid_thw"]),)
    _forward(model, plan, kwargs)


# --------------------------------------------- shard 24/40 of the 5,000 sample: its two harness errors


def test_glm4v_rotates_half_a_head_over_its_mrope_sections():
    # the rotary embedding splits head_dim * partial_rotary_factor / 2 frequencies into [8, 12, 12]
    model, plan = _model("Glm4vForConditionalGeneration", task="image-text-to-text")
    text = plan.config["text_config"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert head_dim * text["rope_parameters"]["partial_rotary_factor"] // 2 == sum([8, 12, 12])
    assert _forward(model, plan, build_inputs(model, plan)).logits.shape[0] == 2


@pytest.mark.parametrize("arch", ["LongformerForQuestionAnswering", "LongformerForMultipleChoice"])
def test_longformer_pair_heads_find_the_question_by_three_separators(arch):
    model, plan = _model(arch)
    kwargs = build_inputs(model, plan)
    seps = (kwargs["input_ids"] == model.config.sep_token_id).sum(-1)
    assert (seps == 3).all()  # question </s></s> context </s>, in every sample (and every choice)
    assert _forward(model, plan, kwargs)[0].shape[0] == 2  # start logits, or one score per choice


@pytest.mark.parametrize("arch", ["PPDocLayoutV3ForObjectDetection", "PPDocLayoutV4ForObjectDetection"])
def test_pp_doclayout_query_selection_is_not_a_tie(arch):
    # with its 0.01 BatchNorm init the shrunk backbone's features vanish and all anchors score the same:
    # top-k then picks queries by tie-breaking, which differs between devices (a failed compare, not a bug)
    model, plan = _model(arch, task="object-detection")
    scores = []
    model.model.enc_score_head.register_forward_hook(lambda m, a, out: scores.append(out.max(-1).values))
    _forward(model, plan, build_inputs(model, plan))
    for per_anchor in scores[0]:
        assert len(set(per_anchor.tolist())) == len(per_anchor)  # every anchor scores differently


def test_vits_decodes_its_means():
    # VITS draws its durations and latents in every forward: with the noise scales at 0 it is deterministic
    model, plan = _model("VitsModel")
    assert plan.config["noise_scale"] == plan.config["noise_scale_duration"] == 0.0
    kwargs = build_inputs(model, plan)
    first, second = _forward(model, plan, kwargs), _forward(model, plan, kwargs)
    assert torch.equal(first.waveform, second.waveform)


# ------------------------------- the last harness errors of the 5,000 sample: Glm4vMoe, GlmImage, PP-DocLayoutV3


@pytest.mark.parametrize(
    ("arch", "task"),
    [
        ("Glm4vMoeForConditionalGeneration", "image-text-to-text"),
        ("Glm4vMoeTextModel", "feature-extraction"),  # the text config at the root: the same patch
        ("Glm46VForConditionalGeneration", "image-text-to-text"),  # a glm4v_text config under glm46v
    ],
)
def test_glm_mrope_sections_fit_the_rotated_half_of_a_head(arch, task):
    # the M-RoPE sections [8, 12, 12] split head_dim * partial_rotary_factor / 2 = 32 frequencies: GLM-4.5V
    # keeps its checkpoints' 128-dim heads (4096 / 96 heads is no whole head), GLM-4.1V's text model rotates
    # half of each head wherever its config sits (overrides patch sub-configs by their own model_type)
    model, plan = _model(arch, task=task)
    text = plan.config.get("text_config", plan.config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    assert head_dim * text["rope_parameters"]["partial_rotary_factor"] // 2 == sum([8, 12, 12])
    _forward(model, plan, build_inputs(model, plan))


def test_glm4v_moe_runs_on_tpu(tmp_path):
    plan = plan_entry({"id": "t/glm4v_moe", "architecture": "Glm4vMoeForConditionalGeneration"})
    rec = _on_tpu(plan, tmp_path)
    assert rec["status"] == "pass", rec["error"]


def test_glm_image_encodes_its_source_images_into_vq_tokens(tmp_path):
    # image-to-image: per sample a source grid, then the grid to generate (images_per_sample counts both);
    # the sources' VQ codes replace the image tokens, so they must be text ids below the special ids
    model, plan = _model("GlmImageModel", task="feature-extraction")
    kwargs = build_inputs(model, plan)
    assert kwargs["images_per_sample"].tolist() == [2, 2] and len(kwargs["image_grid_thw"]) == 4
    cfg = model.config
    assert cfg.vq_config.latent_channels == cfg.vision_config.hidden_size
    assert cfg.vq_config.num_embeddings <= min(cfg.image_start_token_id, cfg.image_end_token_id)
    codes = []
    model.vqmodel.quantize.register_forward_hook(lambda m, a, out: codes.append(out[2]))
    out = _forward(model, plan, kwargs)
    assert sum(c.numel() for c in codes) == (kwargs["input_ids"] == cfg.image_token_id).sum()
    assert out.last_hidden_state.shape[:2] == kwargs["input_ids"].shape
    rec = _on_tpu(plan, tmp_path)
    assert rec["status"] == "pass", rec["error"]


def test_pp_doclayout_v3_mask_branch_takes_the_first_backbone_map():
    # the backbone hands out four maps: the first (stride 4) feeds the mask branch (x4_feat_dim channels),
    # the other three the encoder (encoder_in_channels); both follow the shrunk stage widths
    small = shrink_config_dict(_cfg("pp_doclayout_v3"))
    out = small["backbone_config"]["stage_out_channels"]
    assert small["x4_feat_dim"] == out[0]
    assert small["encoder_in_channels"] == out[1:]
    model, plan = _model("PPDocLayoutV3ForObjectDetection", task="object-detection")
    assert _forward(model, plan, build_inputs(model, plan)).logits.shape[0] == 2


def test_pp_doclayout_v3_masks_stay_within_float32_reach():
    # the init std draws every conv, linear and BatchNorm weight, so activations scale like std**(2 x depth):
    # at 0.5 out_masks reach ~400 and float32's own rounding noise on them (RMSE 5e-4..8e-3 against fp64
    # between equally valid CPU runs: 1 vs 2 threads, 1-ulp input changes) decides the 2 x RMSE(ref) rule
    # by the reference's luck. Kept O(1), that noise sits far under the suite's floor (tol / 10 = 1e-4).
    import copy

    model, plan = _model("PPDocLayoutV3ForObjectDetection", task="object-detection")
    kwargs = build_inputs(model, plan)
    kwargs64 = {
        k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kwargs.items()
    }
    masks = _forward(model, plan, kwargs).out_masks
    masks64 = _forward(copy.deepcopy(model).double(), plan, kwargs64).out_masks
    assert masks64.abs().max() < 100
    assert (masks.double() - masks64).pow(2).mean().sqrt() < 1e-5

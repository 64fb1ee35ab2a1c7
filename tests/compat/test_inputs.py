"""Input building: per-modality shapes from config and signature, placeholder tokens, labels, overrides,
determinism, and clear harness errors for inputs we cannot build."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from compat.input_basics import strip_private  # noqa: E402
from compat.inputs import (  # noqa: E402
    InputError,
    build_inputs,
    cast_floating,
    image_token_id,
    refit_image_tokens,
    special_token_ids,
)
from compat.materialize import Plan, build_model, plan_entry  # noqa: E402


def _model(arch: str, library: str = "transformers", **entry):
    plan = plan_entry({"id": f"t/{arch}", "architecture": arch, "library": library, **entry})
    torch.manual_seed(0)
    return build_model(plan), plan


def _run(model, kwargs):
    with torch.no_grad():
        return model(**strip_private(kwargs))


def test_text_inputs_are_deterministic_and_avoid_special_ids():
    model, plan = _model("LlavaForConditionalGeneration")
    a, b = build_inputs(model, plan), build_inputs(model, plan)
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    tok = image_token_id(model.config)
    ids = a["input_ids"]
    n_img = int((ids == tok).sum(dim=1)[0])
    assert n_img == a["_image_tokens"] > 0
    text = ids[:, n_img:]
    assert not any(int(t) in special_token_ids(model.config) for t in text.flatten())
    assert model.config.text_config.use_cache is False  # set in the effective config for **kwargs forwards


def test_vlm_placeholder_count_matches_vision_features():
    model, plan = _model("LlavaForConditionalGeneration")
    kwargs = build_inputs(model, plan)
    v = model.config.vision_config
    assert kwargs["_image_tokens"] == (v.image_size // v.patch_size) ** 2  # 'default' strategy drops CLS
    assert kwargs["pixel_values"].shape == (2, 3, v.image_size, v.image_size)
    out = _run(model, kwargs)
    assert out.logits.shape[:2] == kwargs["input_ids"].shape


def test_refit_image_tokens_uses_the_models_feature_count():
    model, plan = _model("LlavaForConditionalGeneration")
    kwargs = build_inputs(model, plan)
    n = kwargs["_image_tokens"]
    err = ValueError(
        f"Image features and image tokens do not match, tokens: {2 * n}, features: {2 * (n + 3)}"
    )
    assert refit_image_tokens(model, plan, kwargs, err)
    assert kwargs["_image_tokens"] == n + 3
    assert int((kwargs["input_ids"][0] == image_token_id(model.config)).sum()) == n + 3
    assert not refit_image_tokens(model, plan, kwargs, ValueError("unrelated"))


def test_multiple_choice_shape():
    model, plan = _model("BertForMultipleChoice")
    kwargs = build_inputs(model, plan)
    assert kwargs["input_ids"].dim() == 3 and kwargs["input_ids"].shape[:2] == (2, 2)
    assert _run(model, kwargs).logits.shape == (2, 2)


def test_encoder_decoder_gets_decoder_ids():
    model, plan = _model("T5ForConditionalGeneration")
    kwargs = build_inputs(model, plan)
    assert {"input_ids", "attention_mask", "decoder_input_ids"} <= kwargs.keys()


def test_whisper_features_follow_max_source_positions():
    model, plan = _model("WhisperForConditionalGeneration")
    kwargs = build_inputs(model, plan)
    cfg = model.config
    assert kwargs["input_features"].shape == (2, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    assert "decoder_input_ids" in kwargs
    _run(model, kwargs)


def test_waveform_audio_and_video_shapes():
    model, plan = _model("Wav2Vec2ForCTC")
    kwargs = build_inputs(model, plan)
    assert kwargs["input_values"].dim() == 2 and kwargs["input_values"].shape[1] >= 1600
    model, plan = _model("VideoMAEForVideoClassification")
    kwargs = build_inputs(model, plan)
    cfg = model.config
    assert kwargs["pixel_values"].shape == (
        2,
        cfg.num_frames,
        cfg.num_channels,
        cfg.image_size,
        cfg.image_size,
    )


def test_time_series_inputs_follow_config():
    model, plan = _model("TimeSeriesTransformerForPrediction")
    kwargs = build_inputs(model, plan)
    cfg = model.config
    hist = cfg.context_length + max(cfg.lags_sequence)
    assert kwargs["past_values"].shape == (2, hist)
    assert kwargs["past_observed_mask"].shape == (2, hist)
    assert kwargs["future_values"].shape == (2, cfg.prediction_length)
    _run(model, kwargs)


def test_diffusion_inputs():
    model, plan = _model("UNet2DConditionModel", library="diffusers")
    kwargs = build_inputs(model, plan)
    cfg = model.config
    assert kwargs["sample"].shape == (2, cfg.in_channels, cfg.sample_size, cfg.sample_size)
    assert kwargs["encoder_hidden_states"].shape[-1] == cfg.cross_attention_dim
    assert kwargs["timestep"].shape == (2,)
    assert _run(model, kwargs).sample.shape == kwargs["sample"].shape
    model, plan = _model("FluxTransformer2DModel", library="diffusers")
    kwargs = build_inputs(model, plan)
    assert (
        kwargs["hidden_states"].dim() == 3 and kwargs["img_ids"].shape[0] == kwargs["hidden_states"].shape[1]
    )


@pytest.mark.parametrize(
    "arch",
    [
        "BertForSequenceClassification",
        "GPT2LMHeadModel",
        "T5ForConditionalGeneration",
        "ViTForImageClassification",
    ],
)
def test_labels_give_a_training_step(arch):
    model, plan = _model(arch)
    model.train()
    kwargs = build_inputs(model, plan, with_labels=True)
    out = model(**strip_private(kwargs))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert any(p.grad is not None for p in model.parameters())


def test_cast_floating_keeps_integer_ids():
    kw = {"input_ids": torch.tensor([[1, 2]]), "x": torch.ones(2), "nested": {"y": torch.zeros(1)}}
    out = cast_floating(kw, torch.float64)
    assert out["input_ids"].dtype == torch.long and out["x"].dtype == torch.float64
    assert out["nested"]["y"].dtype == torch.float64


class _WeirdModel(torch.nn.Module):
    config = None

    def forward(self, mystery_tensor):  # nothing knows how to build this
        return mystery_tensor


def test_unbuildable_input_is_a_harness_error_naming_the_argument():
    plan = Plan("org/weird", "transformers", "WeirdModel", "WeirdModel", {}, model_type="weird")
    with pytest.raises(InputError, match=r"org/weird.*(mystery_tensor|cannot build inputs)"):
        build_inputs(_WeirdModel(), plan)


def test_override_tolerance_and_inputs(monkeypatch):
    from compat import overrides

    monkeypatch.setitem(
        overrides.OVERRIDES, "bert", overrides.Override(inputs={"output_hidden_states": True}, tolerance=1e-2)
    )
    model, plan = _model("BertModel")
    kwargs = build_inputs(model, plan)
    assert kwargs["output_hidden_states"] is True
    assert overrides.override_for("bert").tolerance == 1e-2
    assert overrides.override_for("no-such-type") == overrides.Override()


def test_apply_config_patch_reaches_subconfigs():
    from compat.overrides import apply_config_patch

    cfg = {"vision_config": {"image_size": 224}}
    apply_config_patch(cfg, {"vision_config.image_size": 56, "new.key": 1})
    assert cfg == {"vision_config": {"image_size": 56}, "new": {"key": 1}}


def test_config_patches_reach_subconfigs_by_their_own_model_type():
    # a patch keyed by a sub-config's model_type applies to it wherever it sits, relative to it; the root
    # takes the entry's model_type
    from compat.overrides import OVERRIDES, patch_config

    cfg = {
        "model_type": "glm46v",
        "text_config": {"model_type": "glm4v_text", "rope_parameters": {"rope_theta": 1.0}},
        "vision_config": {"model_type": "glm4v_vision"},
    }
    patch_config(cfg, "glm46v")
    assert cfg["text_config"]["rope_parameters"] == {"rope_theta": 1.0, "partial_rotary_factor": 0.5}
    assert "rope_parameters" not in cfg and cfg["vision_config"] == {"model_type": "glm4v_vision"}
    root = {"model_type": "glm4v_text", "rope_parameters": {}}
    assert patch_config(root, "glm4v_text")["rope_parameters"] == {"partial_rotary_factor": 0.5}
    assert "glm4v_text" in OVERRIDES

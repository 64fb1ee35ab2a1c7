"""Smoke-sample entries whose CPU reference the harness itself used to break (a shrunk config that
disagrees with itself, or inputs the forward cannot take): each is planned from its recorded sample entry
and run through the worker's real per-model pipeline on CPU, which must pass bitwise."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from compat.cli import MODEL_LISTS  # noqa: E402
from compat.input_basics import strip_private  # noqa: E402
from compat.inputs import DEC_LEN, build_inputs  # noqa: E402
from compat.materialize import Plan, build_model, plan_entry  # noqa: E402
from compat.sample import load_sample, sample_path  # noqa: E402
from tests.compat.in_process import run_plan  # noqa: E402


def _entry(model_id: str) -> dict:
    """The entry as recorded in model_lists/sample-smoke.jsonl (what `make demo` runs)."""
    entries = [e for e in load_sample(sample_path(MODEL_LISTS, smoke_sample=True)) if e["id"] == model_id]
    assert len(entries) == 1, f"{model_id} is not (once) in the smoke sample"
    return entries[0]


def _built(plan: Plan):
    torch.manual_seed(0)
    model = build_model(plan)
    return model, build_inputs(model, plan)


def _cpu_reference(plan: Plan, tmp_path) -> dict:
    """The worker's pipeline (materialize, from_pretrained, inputs, CPU reference twice, eager on CPU)."""
    (rec,) = run_plan(plan, tmp_path)
    return rec


def _assert_passes(plan: Plan, tmp_path) -> None:
    rec = _cpu_reference(plan, tmp_path)
    assert rec["status"] == "pass", (rec["phase"], rec["error"])
    assert rec["max_abs_diff"] == 0.0


def test_prompt_guard_deberta_pooler_follows_the_shrunk_width(tmp_path):
    """DeBERTa's ContextPooler is a square dense over the hidden state: pooler_hidden_size shrinks with it
    (it stayed 1536 against a 128-wide model: 'mat1 and mat2 shapes cannot be multiplied')."""
    plan = plan_entry(_entry("meta-llama/Prompt-Guard-86M"))
    assert plan.config["hidden_size"] < 1536
    assert plan.config["pooler_hidden_size"] == plan.config["hidden_size"]
    model, kwargs = _built(plan)
    with torch.no_grad():
        out = model(**strip_private(kwargs))
    assert out.logits.shape == (kwargs["input_ids"].shape[0], model.config.num_labels)
    _assert_passes(plan, tmp_path)


def test_dpt_large_keeps_one_layer_per_feature_tap(tmp_path):
    """DPT reassembles one feature map per backbone_out_indices entry (sized by neck_hidden_sizes): the
    tapped layers must survive the layer cut and be renumbered (2 kept layers left none of [2, 5, 8, 11])."""
    plan = plan_entry(_entry("Intel/dpt-large"))
    cfg = plan.config
    taps = cfg["backbone_out_indices"]
    assert len(taps) == len(set(taps)) == len(cfg["neck_hidden_sizes"]) == len(cfg["reassemble_factors"])
    assert all(0 <= i < cfg["num_hidden_layers"] for i in taps)
    assert cfg["num_hidden_layers"] < 12  # still shrunk
    # id2label ({0: "LABEL_0", ...}) looks like a per-layer dict but is not one: no label is lost
    assert sorted(int(i) for i in cfg["id2label"]) == sorted(cfg["label2id"].values())
    _assert_passes(plan, tmp_path)


def test_speecht5_tts_gets_decoder_mel_frames_and_a_speaker(tmp_path):
    """Text-to-speech decodes mel frames (decoder_input_values), not token ids: without them the forward
    handed its speech prenet None. Its prenet's always-on dropout is off (override), so two runs agree."""
    plan = plan_entry(_entry("microsoft/speecht5_tts"))
    assert plan.config["speech_decoder_prenet_dropout"] == 0.0
    model, kwargs = _built(plan)
    batch = kwargs["input_ids"].shape[0]
    assert kwargs["decoder_input_values"].shape == (batch, DEC_LEN, model.config.num_mel_bins)
    assert kwargs["speaker_embeddings"].shape == (batch, model.config.speaker_embedding_dim)
    with torch.no_grad():
        out = model(**strip_private(kwargs))
    assert out.spectrogram.shape[-1] == model.config.num_mel_bins
    _assert_passes(plan, tmp_path)


def test_clap_gets_htsat_mel_crops_and_a_consistent_audio_width(tmp_path):
    """CLAP's HTSAT tower takes (batch, crops, frames, mel) and the text's attention_mask must stay the
    text's; its audio hidden_size (what the projection takes) is the last Swin stage's width."""
    plan = plan_entry(_entry("laion/clap-htsat-fused"))
    audio = plan.config["audio_config"]
    stages = len(audio["depths"])
    assert audio["hidden_size"] == audio["patch_embeds_hidden_size"] * 2 ** (stages - 1)
    model, kwargs = _built(plan)
    assert kwargs["input_features"].dim() == 4 and kwargs["input_features"].shape[-1] == audio["num_mel_bins"]
    assert kwargs["attention_mask"].shape == kwargs["input_ids"].shape
    _assert_passes(plan, tmp_path)


def test_clap_fused_audio_takes_four_crops_and_is_longer():
    """The fused checkpoint's layout (enable_fusion, aff_2d): a global and 3 local crops, is_longer
    marking which clips have them; one clip of each kind runs, deterministically."""
    from transformers import ClapConfig

    full = ClapConfig(audio_config={"enable_fusion": True, "fusion_type": "aff_2d"}).to_dict()
    entry = _entry("laion/clap-htsat-fused") | {"config": full}
    model, kwargs = _built(plan_entry(entry))
    assert kwargs["input_features"].shape[1] == 4
    assert kwargs["is_longer"].flatten().tolist() == [True, False]
    with torch.no_grad():
        a = model(**strip_private(kwargs))
        b = model(**strip_private(kwargs))
    assert torch.equal(a.logits_per_audio, b.logits_per_audio)
    assert torch.isfinite(a.logits_per_audio).all()


@pytest.mark.parametrize("arch", ["SwinForImageClassification", "DonutSwinModel"])
def test_swin_hidden_size_is_the_last_stage_width(arch):
    """The same rule on Swin: hidden_size (read by encoder-decoder wrappers) is embed_dim x 2^(stages-1)."""
    cfg = plan_entry({"id": f"t/{arch}", "architecture": arch}).config
    assert cfg["hidden_size"] == cfg["embed_dim"] * 2 ** (len(cfg["depths"]) - 1)

"""Shrinking, planning, dedup, materialization, the hub tier (offline, monkeypatched), and a forward
pass that matches on CPU for architectures across every modality."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from compat.materialize import HarnessError, Plan, load_model, materialize, plan_entry  # noqa: E402
from compat.shrink import shrink_config_dict  # noqa: E402
from tests.compat.in_process import run_plan  # noqa: E402

# --------------------------------------------------------------------------------------------- shrinking


def _cfg(model_type: str) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type).to_dict()


def test_shrink_keeps_head_dim_and_gqa():
    full = _cfg("llama") | {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    small = shrink_config_dict(full, "t/llama")
    assert small["num_attention_heads"] == 2 and small["num_key_value_heads"] == 1  # still grouped-query
    assert small["hidden_size"] // small["num_attention_heads"] == 4096 // 32  # head_dim kept
    assert small["num_hidden_layers"] <= 2 and small["vocab_size"] == 1000
    assert small["intermediate_size"] < full["intermediate_size"]
    mha = shrink_config_dict(_cfg("llama") | {"num_key_value_heads": 32}, "t/llama-mha")
    assert mha["num_key_value_heads"] == mha["num_attention_heads"]  # MHA stays MHA


def test_shrink_keeps_hybrid_layer_pattern_consistent():
    small = shrink_config_dict(_cfg("gemma3_text"), "t/gemma3")
    types_ = small["layer_types"]
    assert len(types_) == small["num_hidden_layers"]
    assert {"sliding_attention", "full_attention"} <= set(types_)  # one layer of each kind survives


def test_shrink_experts_and_groups():
    mixtral = shrink_config_dict(_cfg("mixtral"), "t/mixtral")
    assert mixtral["num_local_experts"] == 4 and mixtral["num_experts_per_tok"] <= 2
    ds = shrink_config_dict(_cfg("deepseek_v3"), "t/ds")
    assert ds["n_routed_experts"] == 4 and ds["num_experts_per_tok"] <= ds["n_routed_experts"]
    assert ds["n_group"] == 1 and ds["topk_group"] == 1
    assert ds["first_k_dense_replace"] == 1 < ds["num_hidden_layers"]  # a dense and an MoE layer


def test_shrink_remaps_special_tokens_into_vocab_consistently():
    small = shrink_config_dict(_cfg("llava"), "t/llava")
    img = small["image_token_index"]
    assert img < small["text_config"]["vocab_size"]
    specials = [small["text_config"].get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")]
    assert img not in specials


def test_shrink_subconfigs():
    small = shrink_config_dict(_cfg("clip"), "t/clip")
    for sub in ("text_config", "vision_config"):
        assert small[sub]["num_hidden_layers"] <= 2
        assert small[sub]["hidden_size"] <= 128
    v = small["vision_config"]
    assert v["image_size"] % v["patch_size"] == 0 and v["image_size"] // v["patch_size"] == 4


def test_shrink_diffusers_unet_blocks_stay_paired():
    import diffusers

    from compat.materialize import diffusers_default_config
    from compat.shrink_diffusers import shrink_diffusers_config

    small = shrink_diffusers_config(diffusers_default_config(diffusers.UNet2DConditionModel))
    n = len(small["block_out_channels"])
    assert n == 2 and len(small["down_block_types"]) == n == len(small["up_block_types"])
    assert small["down_block_types"][0].startswith("CrossAttn") and small["up_block_types"][-1].startswith(
        "CrossAttn"
    )


# -------------------------------------------------------------------------------------- planning & dedup


def test_plan_picks_auto_loader_and_dedups_by_effective_config():
    a = plan_entry({"id": "org/bert-a", "architecture": "BertForMaskedLM", "task": "fill-mask"})
    b = plan_entry({"id": "org/bert-b", "architecture": "BertForMaskedLM"})
    assert a.loader == "AutoModelForMaskedLM" and a.model_class == "BertForMaskedLM"
    assert a.dedup_key == b.dedup_key  # same effective config + class: runs once
    c = plan_entry({"id": "org/bert-c", "architecture": "BertForSequenceClassification"})
    assert c.dedup_key != a.dedup_key
    d = plan_entry({"id": "org/bert-d", "architecture": "BertForMaskedLM", "config": {"hidden_act": "relu"}})
    assert (
        d.config_source == "entry-config" and d.config["hidden_act"] == "relu" and d.dedup_key != a.dedup_key
    )


def test_plan_from_model_type_and_task_without_architecture():
    p = plan_entry({"id": "org/x", "model_type": "gpt2", "task": "text-generation"})
    assert p.model_class == "GPT2LMHeadModel" and p.loader == "AutoModelForCausalLM"


def test_bad_entries_are_harness_errors_naming_the_model():
    with pytest.raises(HarnessError, match="org/unknown.*NoSuchModelClass"):
        plan_entry({"id": "org/unknown", "architecture": "NoSuchModelClass"})
    with pytest.raises(HarnessError, match="org/empty.*neither a model_type"):
        plan_entry({"id": "org/empty"})
    with pytest.raises(HarnessError, match="sample entry without an id"):
        plan_entry({"architecture": "BertModel"})


def test_unshrinkable_config_names_model_and_field():
    bad = {"layer_types": ["full_attention"] * 3, "num_hidden_layers": 28}
    with pytest.raises(
        HarnessError, match=r"org/bad-qwen.*field '(layer_types|num_hidden_layers)'.*layer_types"
    ):
        plan_entry({"id": "org/bad-qwen", "architecture": "Qwen3ForCausalLM", "config": bad})


def test_a_failing_shrink_rule_names_the_config_level(monkeypatch):
    import compat.shrink as shrink

    def broken(d):
        if "patch_size" in d:
            raise KeyError("image_size")

    monkeypatch.setattr(shrink, "_shrink_vision", broken)
    with pytest.raises(
        HarnessError, match=r"org/clip: cannot shrink the config: config level 'vision_config'.*image_size"
    ):
        plan_entry({"id": "org/clip", "architecture": "CLIPModel"})


def test_pipeline_entry_runs_its_denoiser():
    p = plan_entry({"id": "org/sd", "architecture": "StableDiffusionPipeline", "library": "diffusers"})
    assert p.library == "diffusers" and p.model_class == "UNet2DConditionModel"
    assert any("unet" in n for n in p.notes)


def test_override_skip_reason():
    p = plan_entry({"id": "org/timm", "architecture": "TimmWrapperForImageClassification"})
    assert p.skip and "timm" in p.skip


def test_materialize_writes_once_and_loads_through_from_pretrained(tmp_path):
    plan = plan_entry({"id": "org/bert", "architecture": "BertForMaskedLM"})
    path = materialize(plan, tmp_path)
    assert os.path.exists(os.path.join(path, "config.json")) and os.path.exists(
        os.path.join(path, ".complete")
    )
    mtime = os.path.getmtime(os.path.join(path, "config.json"))
    assert (
        materialize(plan, tmp_path) == path and os.path.getmtime(os.path.join(path, "config.json")) == mtime
    )
    model = load_model(plan, path, "cpu")
    assert type(model).__name__ == "BertForMaskedLM" and next(model.parameters()).device.type == "cpu"
    again = load_model(plan, path, None)
    import torch

    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    )


def test_hub_tier_without_the_hub(monkeypatch):
    """What the hub tier decides before or without a Hub answer (the Hub itself: tests/compat/test_hub_tier.py)."""
    from huggingface_hub import constants

    # the sample's own estimate is enough to skip: no Hub request (HF_HUB_OFFLINE=1 here would refuse one)
    pre = plan_entry({"id": "org/pre", "architecture": "BertModel", "params": 5e9}, tier="hub")
    assert pre.skip and "exceed the hub-tier cap" in pre.skip and pre.model_type is None
    assert constants.HF_HUB_OFFLINE
    # a Hub that cannot be asked is a harness error naming the URL, never an exception out of planning
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(
        HarnessError, match=r"org/small: cannot resolve on the Hub: .*127\.0\.0\.1:9/api/models/org/small"
    ):
        plan_entry({"id": "org/small", "architecture": "BertForMaskedLM"}, tier="hub")


# ------------------------------------------------------------------ architectures that run and match on CPU

# (architecture, library, modality). The first block runs by default; the rest is marked slow.
FAST_CASES = [
    ("BertForMaskedLM", "transformers", "text-encoder"),
    ("LlamaForCausalLM", "transformers", "text-decoder"),
    ("Qwen3ForCausalLM", "transformers", "text-decoder"),
    ("MixtralForCausalLM", "transformers", "text-decoder-moe"),
    ("T5ForConditionalGeneration", "transformers", "encoder-decoder"),
    ("ViTForImageClassification", "transformers", "vision"),
    ("Wav2Vec2ForCTC", "transformers", "audio"),
    ("WhisperForConditionalGeneration", "transformers", "audio-seq2seq"),
    ("VideoMAEForVideoClassification", "transformers", "video"),
    ("LlavaForConditionalGeneration", "transformers", "multimodal"),
    ("PatchTSTForPrediction", "transformers", "time-series"),
    ("UNet2DConditionModel", "diffusers", "diffusion"),
    ("SD3Transformer2DModel", "diffusers", "diffusion"),
]
SLOW_CASES = [
    ("GPT2LMHeadModel", "transformers", "text-decoder"),
    ("MistralForCausalLM", "transformers", "text-decoder"),
    ("Qwen2ForCausalLM", "transformers", "text-decoder"),
    ("Gemma2ForCausalLM", "transformers", "text-decoder"),
    ("Gemma3ForCausalLM", "transformers", "text-decoder-hybrid"),
    ("Phi3ForCausalLM", "transformers", "text-decoder"),
    ("OPTForCausalLM", "transformers", "text-decoder"),
    ("FalconForCausalLM", "transformers", "text-decoder"),
    ("GPTNeoXForCausalLM", "transformers", "text-decoder"),
    ("BloomForCausalLM", "transformers", "text-decoder"),
    ("Qwen2MoeForCausalLM", "transformers", "text-decoder-moe"),
    ("DeepseekV3ForCausalLM", "transformers", "text-decoder-moe"),
    ("MambaForCausalLM", "transformers", "text-decoder-ssm"),
    ("Mamba2ForCausalLM", "transformers", "text-decoder-ssm"),
    ("JambaForCausalLM", "transformers", "text-decoder-hybrid"),
    ("BartForConditionalGeneration", "transformers", "encoder-decoder"),
    ("MarianMTModel", "transformers", "encoder-decoder"),
    ("PegasusForConditionalGeneration", "transformers", "encoder-decoder"),
    ("MBartForConditionalGeneration", "transformers", "encoder-decoder"),
    ("RobertaForSequenceClassification", "transformers", "text-encoder"),
    ("DistilBertForSequenceClassification", "transformers", "text-encoder"),
    ("AlbertForMaskedLM", "transformers", "text-encoder"),
    ("ElectraForTokenClassification", "transformers", "text-encoder"),
    ("DebertaV2ForQuestionAnswering", "transformers", "text-encoder"),
    ("XLMRobertaModel", "transformers", "text-encoder"),
    ("MPNetModel", "transformers", "text-encoder"),
    ("BertForMultipleChoice", "transformers", "text-encoder"),
    ("LayoutLMForTokenClassification", "transformers", "text-encoder"),
    ("ConvNextForImageClassification", "transformers", "vision"),
    ("SwinForImageClassification", "transformers", "vision"),
    ("ResNetForImageClassification", "transformers", "vision"),
    ("DeiTForImageClassification", "transformers", "vision"),
    ("BeitForImageClassification", "transformers", "vision"),
    ("Dinov2Model", "transformers", "vision"),
    ("SegformerForSemanticSegmentation", "transformers", "vision"),
    ("DetrForObjectDetection", "transformers", "vision"),
    ("CLIPModel", "transformers", "multimodal"),
    ("SiglipModel", "transformers", "multimodal"),
    ("HubertModel", "transformers", "audio"),
    ("ASTForAudioClassification", "transformers", "audio"),
    ("Speech2TextForConditionalGeneration", "transformers", "audio-seq2seq"),
    ("Wav2Vec2BertModel", "transformers", "audio"),
    ("TimesformerForVideoClassification", "transformers", "video"),
    ("Qwen2VLForConditionalGeneration", "transformers", "multimodal"),
    ("PaliGemmaForConditionalGeneration", "transformers", "multimodal"),
    ("Gemma3ForConditionalGeneration", "transformers", "multimodal"),
    ("Blip2ForConditionalGeneration", "transformers", "multimodal"),
    ("TimeSeriesTransformerForPrediction", "transformers", "time-series"),
    ("InformerForPrediction", "transformers", "time-series"),
    ("AutoformerForPrediction", "transformers", "time-series"),
    ("PatchTSMixerForPrediction", "transformers", "time-series"),
    ("Qwen2_5_VLForConditionalGeneration", "transformers", "multimodal"),
    ("Idefics3ForConditionalGeneration", "transformers", "multimodal"),
    ("Mistral3ForConditionalGeneration", "transformers", "multimodal"),
    ("SmolVLMForConditionalGeneration", "transformers", "multimodal"),
    ("Qwen2AudioForConditionalGeneration", "transformers", "multimodal-audio"),
    ("Glm4vVisionModel", "transformers", "vision"),
    ("DacModel", "transformers", "audio"),
    ("CanineModel", "transformers", "text-encoder"),
    ("BigBirdModel", "transformers", "text-encoder"),
    ("BitModel", "transformers", "vision"),
    ("AutoencoderKL", "diffusers", "diffusion"),
    ("FluxTransformer2DModel", "diffusers", "diffusion"),
    ("PixArtTransformer2DModel", "diffusers", "diffusion"),
    ("DiTTransformer2DModel", "diffusers", "diffusion"),
    ("UNet2DModel", "diffusers", "diffusion"),
]
ALL_CASES = FAST_CASES + SLOW_CASES


def run_in_process(arch: str, library: str, tmp_path, modes=("eager",)) -> list[dict]:
    """The worker's real per-model pipeline, in this process (no subprocess): returns its records."""
    plan = plan_entry({"id": f"test/{arch}", "architecture": arch, "library": library})
    return run_plan(plan, tmp_path, modes)


def test_case_list_covers_every_modality_and_40_architectures():
    kinds = {m.split("-")[0] if not m.startswith("text") else m for _, _, m in ALL_CASES}
    for needed in (
        "text-decoder",
        "text-encoder",
        "encoder",
        "vision",
        "audio",
        "video",
        "multimodal",
        "time",
        "diffusion",
    ):
        assert any(k.startswith(needed) for k in kinds), needed
    assert len({a for a, _, _ in ALL_CASES}) >= 40


@pytest.mark.parametrize(("arch", "library", "modality"), FAST_CASES, ids=[c[0] for c in FAST_CASES])
def test_architecture_runs_and_matches_on_cpu(arch, library, modality, tmp_path):
    (rec,) = run_in_process(arch, library, tmp_path)
    assert rec["status"] == "pass", rec["error"]
    assert rec["max_abs_diff"] == 0.0  # same device, same weights, same inputs: bitwise
    assert rec["times"]["first_call_s"] is not None and rec["times"]["steady_s"] is not None


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "library", "modality"), SLOW_CASES, ids=[c[0] for c in SLOW_CASES])
def test_architecture_runs_and_matches_on_cpu_slow(arch, library, modality, tmp_path):
    (rec,) = run_in_process(arch, library, tmp_path)
    assert rec["status"] == "pass", rec["error"]


COMPILED_CASES = [
    pytest.param(
        *c,
        id=c[0],
        marks=pytest.mark.xfail(
            reason="aot_eager: view on a non-contiguous tensor fails under compile (a real finding, not ours)"
        ),
    )
    if c[0] == "PatchTSTForPrediction"
    else pytest.param(*c, id=c[0])
    for c in FAST_CASES
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "library", "modality"), COMPILED_CASES)
def test_architecture_compiles_and_matches_on_cpu(arch, library, modality, tmp_path):
    (rec,) = run_in_process(arch, library, tmp_path, modes=("compiled",))
    assert rec["status"] == "pass", rec["error"]
    assert rec["compile_backend"] == "aot_eager" and rec["graph_breaks"] is not None


def test_plan_round_trips_through_json():
    import json

    p = plan_entry({"id": "org/gpt2", "architecture": "GPT2LMHeadModel"})
    back = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert json.dumps(back.to_dict(), sort_keys=True) == json.dumps(p.to_dict(), sort_keys=True)


def test_shrink_remaps_layer_index_dicts():
    """gemma4's per_layer_config is keyed by layer index ("05"): kept layers are renumbered, the rest go."""
    from transformers import CONFIG_MAPPING

    from compat import shrink

    cfg = CONFIG_MAPPING["gemma4_text"]()
    small = shrink.shrink_config_dict(cfg.to_dict(), "google/gemma-4-E2B-it")
    n = small["num_hidden_layers"]
    assert n < cfg.num_hidden_layers
    keys = [int(k) for k in small["per_layer_config"]]
    assert keys and all(0 <= k < n for k in keys)
    CONFIG_MAPPING["gemma4_text"](**{k: v for k, v in small.items() if k != "model_type"})  # valid


def test_worker_drops_the_run_cache_checkpoint_after_its_task(tmp_path):
    """A full-sample run writes thousands of checkpoints: each is deleted once its model has run."""
    plan = plan_entry({"id": "test/BertModel", "architecture": "BertModel", "library": "transformers"})
    records = run_plan(plan, tmp_path, keep_model=False)
    assert [r["status"] for r in records] == ["pass"]
    assert not any(p.is_dir() for p in tmp_path.iterdir())

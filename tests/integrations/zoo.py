"""Tiny models of ~60 architectures, built from configs (no Hub access), with inputs and a kind.

Every model shares the same small sizes (width 32, 4 heads of 8, 2 layers, sequence 8, vocab 128) so the
tpu's per-shape kernel cache is shared between architectures and the suite stays fast. `build(name)`
returns a fresh fp32 model in eval mode and CPU inputs, deterministic for a given seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as tf

VOCAB = 128
WIDTH = 32
HEADS = 4
HEAD_DIM = WIDTH // HEADS
FFN = 64
LAYERS = 2
SEQ = 8
BATCH = 2
IMAGE = 32
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

# kinds: "causal" (greedy compared), "seq2seq" (greedy compared), "encoder", "vision", "audio",
# "multimodal", "vlm" (greedy compared)
GENERATIVE = ("causal", "seq2seq", "vlm")


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    kind: str
    make: Callable[[], tuple[torch.nn.Module, dict]]


CASES: dict[str, Case] = {}


def case(name: str, family: str, kind: str):
    def register(fn):
        CASES[name] = Case(name, family, kind, fn)
        return fn

    return register


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def text_inputs(vocab: int = VOCAB, seq: int = SEQ) -> dict:
    ids = torch.randint(3, vocab, (BATCH, seq), generator=_gen(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def pixels(channels: int = 3, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=_gen(2))


def audio(samples: int = 1600) -> torch.Tensor:
    return torch.randn(BATCH, samples, generator=_gen(3))


LLAMA_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    intermediate_size=FFN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=2,
    head_dim=HEAD_DIM,
    max_position_embeddings=64,
    **TOKENS,
)


def _llama_like(config_cls, model_cls, drop=(), **extra):
    kwargs = {k: v for k, v in LLAMA_LIKE.items() if k not in drop}
    kwargs.update(extra)
    return model_cls(config_cls(**kwargs)), text_inputs()


# -- decoder-only --------------------------------------------------------------------------------------------
@case("llama", "decoder", "causal")
def _llama():
    return _llama_like(tf.LlamaConfig, tf.LlamaForCausalLM)


@case("doge", "decoder", "causal")
def _doge():
    # reads flex attention's BlockMask unguarded in every forward (hf_tpu binds it: integrations table)
    return _llama_like(tf.DogeConfig, tf.DogeForCausalLM, drop=("head_dim",))


@case("qwen2", "decoder", "causal")
def _qwen2():
    return _llama_like(tf.Qwen2Config, tf.Qwen2ForCausalLM, drop=("head_dim",))


@case("qwen3", "decoder", "causal")
def _qwen3():
    return _llama_like(tf.Qwen3Config, tf.Qwen3ForCausalLM)


@case("mistral", "decoder", "causal")
def _mistral():
    return _llama_like(tf.MistralConfig, tf.MistralForCausalLM, sliding_window=None)


@case("gemma", "decoder", "causal")
def _gemma():
    return _llama_like(tf.GemmaConfig, tf.GemmaForCausalLM)


@case("gemma2", "decoder", "causal")
def _gemma2():
    return _llama_like(tf.Gemma2Config, tf.Gemma2ForCausalLM, sliding_window=4)


@case("gemma3", "decoder", "causal")
def _gemma3():
    return _llama_like(tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, sliding_window=4)


@case("phi", "decoder", "causal")
def _phi():
    return _llama_like(tf.PhiConfig, tf.PhiForCausalLM, drop=("head_dim",))


@case("phi3", "decoder", "causal")
def _phi3():
    return _llama_like(tf.Phi3Config, tf.Phi3ForCausalLM, drop=("head_dim",))


@case("gpt2", "decoder", "causal")
def _gpt2():
    cfg = tf.GPT2Config(
        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=64, **TOKENS
    )
    return tf.GPT2LMHeadModel(cfg), text_inputs()


@case("gpt_neox", "decoder", "causal")
def _gpt_neox():
    return _llama_like(tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM, drop=("head_dim", "num_key_value_heads"))


@case("gptj", "decoder", "causal")
def _gptj():
    cfg = tf.GPTJConfig(
        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, rotary_dim=4, n_positions=64, **TOKENS
    )
    return tf.GPTJForCausalLM(cfg), text_inputs()


@case("opt", "decoder", "causal")
def _opt():
    cfg = tf.OPTConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        ffn_dim=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        word_embed_proj_dim=WIDTH,
        max_position_embeddings=64,
        **TOKENS,
    )
    return tf.OPTForCausalLM(cfg), text_inputs()


@case("falcon", "decoder", "causal")
def _falcon():
    cfg = tf.FalconConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS, **TOKENS
    )
    return tf.FalconForCausalLM(cfg), text_inputs()


@case("bloom", "decoder", "causal")
def _bloom():
    cfg = tf.BloomConfig(vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS, n_head=HEADS, **TOKENS)
    return tf.BloomForCausalLM(cfg), text_inputs()


@case("stablelm", "decoder", "causal")
def _stablelm():
    return _llama_like(tf.StableLmConfig, tf.StableLmForCausalLM, drop=("head_dim",))


@case("starcoder2", "decoder", "causal")
def _starcoder2():
    return _llama_like(tf.Starcoder2Config, tf.Starcoder2ForCausalLM, drop=("head_dim",))


@case("cohere", "decoder", "causal")
def _cohere():
    return _llama_like(tf.CohereConfig, tf.CohereForCausalLM, drop=("head_dim",))


@case("olmo2", "decoder", "causal")
def _olmo2():
    return _llama_like(tf.Olmo2Config, tf.Olmo2ForCausalLM, drop=("head_dim",))


@case("gpt_bigcode", "decoder", "causal")
def _gpt_bigcode():
    cfg = tf.GPTBigCodeConfig(
        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=64, **TOKENS
    )
    return tf.GPTBigCodeForCausalLM(cfg), text_inputs()


@case("codegen", "decoder", "causal")
def _codegen():
    cfg = tf.CodeGenConfig(
        vocab_size=VOCAB,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        rotary_dim=4,
        n_positions=64,
        n_ctx=64,
        **TOKENS,
    )
    return tf.CodeGenForCausalLM(cfg), text_inputs()


@case("granite", "decoder", "causal")
def _granite():
    return _llama_like(tf.GraniteConfig, tf.GraniteForCausalLM, drop=("head_dim",))


@case("smollm3", "decoder", "causal")
def _smollm3():
    return _llama_like(tf.SmolLM3Config, tf.SmolLM3ForCausalLM, drop=("head_dim",))


# -- mixture of experts ----------------------------------------------------------------------------------------
@case("qwen3_moe", "moe", "causal")
def _qwen3_moe():
    return _llama_like(
        tf.Qwen3MoeConfig,
        tf.Qwen3MoeForCausalLM,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
    )


@case("mixtral", "moe", "causal")
def _mixtral():
    return _llama_like(tf.MixtralConfig, tf.MixtralForCausalLM, num_local_experts=4, num_experts_per_tok=2)


@case("qwen2_moe", "moe", "causal")
def _qwen2_moe():
    return _llama_like(
        tf.Qwen2MoeConfig,
        tf.Qwen2MoeForCausalLM,
        drop=("head_dim",),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    )


@case("olmoe", "moe", "causal")
def _olmoe():
    return _llama_like(
        tf.OlmoeConfig, tf.OlmoeForCausalLM, drop=("head_dim",), num_experts=4, num_experts_per_tok=2
    )


@case("phimoe", "moe", "causal")
def _phimoe():
    return _llama_like(
        tf.PhimoeConfig, tf.PhimoeForCausalLM, drop=("head_dim",), num_local_experts=4, num_experts_per_tok=2
    )


# -- encoders ----------------------------------------------------------------------------------------------------
BERT_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    max_position_embeddings=64,
    pad_token_id=0,
)


def _bert_like(config_cls, model_cls, **extra):
    return model_cls(config_cls(**{**BERT_LIKE, **extra})), text_inputs()


@case("bert", "encoder", "encoder")
def _bert():
    return _bert_like(tf.BertConfig, tf.BertForMaskedLM)


@case("roberta", "encoder", "encoder")
def _roberta():
    return _bert_like(tf.RobertaConfig, tf.RobertaForMaskedLM, pad_token_id=1)


@case("xlm_roberta", "encoder", "encoder")
def _xlm_roberta():
    return _bert_like(tf.XLMRobertaConfig, tf.XLMRobertaModel, pad_token_id=1)


@case("deberta_v2", "encoder", "encoder")
def _deberta_v2():
    return _bert_like(tf.DebertaV2Config, tf.DebertaV2Model, relative_attention=True, position_buckets=8)


@case("deberta", "encoder", "encoder")
def _deberta():
    return _bert_like(tf.DebertaConfig, tf.DebertaModel, relative_attention=True)


@case("distilbert", "encoder", "encoder")
def _distilbert():
    cfg = tf.DistilBertConfig(vocab_size=VOCAB, dim=WIDTH, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN)
    return tf.DistilBertModel(cfg), text_inputs()


@case("albert", "encoder", "encoder")
def _albert():
    return _bert_like(tf.AlbertConfig, tf.AlbertModel, embedding_size=16)


@case("electra", "encoder", "encoder")
def _electra():
    return _bert_like(tf.ElectraConfig, tf.ElectraModel, embedding_size=16)


@case("mpnet", "encoder", "encoder")
def _mpnet():
    return _bert_like(tf.MPNetConfig, tf.MPNetModel, pad_token_id=1)


@case("modernbert", "encoder", "encoder")
def _modernbert():
    return _bert_like(
        tf.ModernBertConfig, tf.ModernBertModel, global_attn_every_n_layers=2, local_attention=4
    )


# -- encoder-decoder -------------------------------------------------------------------------------------------------
def _s2s_inputs() -> dict:
    inputs = text_inputs()
    inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (BATCH, 4), generator=_gen(4))
    return inputs


@case("t5", "encoder-decoder", "seq2seq")
def _t5():
    cfg = tf.T5Config(
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_kv=HEAD_DIM,
        d_ff=FFN,
        num_layers=LAYERS,
        num_heads=HEADS,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=2,
    )
    return tf.T5ForConditionalGeneration(cfg), _s2s_inputs()


@case("mt5", "encoder-decoder", "seq2seq")
def _mt5():
    cfg = tf.MT5Config(
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_kv=HEAD_DIM,
        d_ff=FFN,
        num_layers=LAYERS,
        num_heads=HEADS,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=2,
    )
    return tf.MT5ForConditionalGeneration(cfg), _s2s_inputs()


BART_LIKE = dict(
    vocab_size=VOCAB,
    d_model=WIDTH,
    encoder_layers=LAYERS,
    decoder_layers=LAYERS,
    encoder_attention_heads=HEADS,
    decoder_attention_heads=HEADS,
    encoder_ffn_dim=FFN,
    decoder_ffn_dim=FFN,
    max_position_embeddings=64,
    decoder_start_token_id=2,
    **TOKENS,
)


@case("bart", "encoder-decoder", "seq2seq")
def _bart():
    return tf.BartForConditionalGeneration(tf.BartConfig(**BART_LIKE)), _s2s_inputs()


@case("pegasus", "encoder-decoder", "seq2seq")
def _pegasus():
    return tf.PegasusForConditionalGeneration(tf.PegasusConfig(**BART_LIKE)), _s2s_inputs()


@case("marian", "encoder-decoder", "seq2seq")
def _marian():
    return tf.MarianMTModel(tf.MarianConfig(**BART_LIKE)), _s2s_inputs()


@case("whisper", "encoder-decoder", "seq2seq")
def _whisper():
    cfg = tf.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        d_model=WIDTH,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_source_positions=16,
        max_target_positions=32,
        decoder_start_token_id=1,
        begin_suppress_tokens=None,
        suppress_tokens=None,
        **TOKENS,
    )
    features = torch.randn(BATCH, 16, 32, generator=_gen(5))
    decoder_ids = torch.randint(3, VOCAB, (BATCH, 4), generator=_gen(4))
    return tf.WhisperForConditionalGeneration(cfg), {
        "input_features": features,
        "decoder_input_ids": decoder_ids,
    }


# -- vision ------------------------------------------------------------------------------------------------------------
VIT_LIKE = dict(
    image_size=IMAGE,
    patch_size=8,
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
)


@case("vit", "vision", "vision")
def _vit():
    return tf.ViTForImageClassification(tf.ViTConfig(**VIT_LIKE, num_labels=3)), {"pixel_values": pixels()}


@case("deit", "vision", "vision")
def _deit():
    return tf.DeiTForImageClassification(tf.DeiTConfig(**VIT_LIKE, num_labels=3)), {"pixel_values": pixels()}


@case("beit", "vision", "vision")
def _beit():
    return tf.BeitModel(tf.BeitConfig(**VIT_LIKE, use_relative_position_bias=True)), {
        "pixel_values": pixels()
    }


@case("dinov2", "vision", "vision")
def _dinov2():
    cfg = tf.Dinov2Config(**{**VIT_LIKE, "image_size": IMAGE}, mlp_ratio=2)
    return tf.Dinov2Model(cfg), {"pixel_values": pixels()}


@case("convnext", "vision", "vision")
def _convnext():
    cfg = tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)
    return tf.ConvNextForImageClassification(cfg), {"pixel_values": pixels()}


@case("resnet", "vision", "vision")
def _resnet():
    cfg = tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)
    return tf.ResNetForImageClassification(cfg), {"pixel_values": pixels()}


@case("swin", "vision", "vision")
def _swin():
    cfg = tf.SwinConfig(
        image_size=IMAGE,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 4],
        window_size=4,
        num_labels=3,
    )
    return tf.SwinForImageClassification(cfg), {"pixel_values": pixels()}


@case("segformer", "vision", "vision")
def _segformer():
    cfg = tf.SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[8, 16],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        decoder_hidden_size=16,
        num_labels=3,
    )
    return tf.SegformerForSemanticSegmentation(cfg), {"pixel_values": pixels()}


@case("yolos", "vision", "vision")
def _yolos():
    cfg = tf.YolosConfig(**{**VIT_LIKE, "image_size": [IMAGE, IMAGE]}, num_detection_tokens=4, num_labels=3)
    return tf.YolosForObjectDetection(cfg), {"pixel_values": pixels()}


@case("detr", "vision", "vision")
def _detr():
    backbone = tf.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], out_features=["stage4"]
    )
    cfg = tf.DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=WIDTH,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        num_queries=4,
        num_labels=3,
    )
    return tf.DetrForObjectDetection(cfg), {"pixel_values": pixels(size=64)}


# -- audio -------------------------------------------------------------------------------------------------------------
W2V_LIKE = dict(
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    conv_dim=(16, 16),
    conv_stride=(5, 4),
    conv_kernel=(10, 8),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)


@case("wav2vec2", "audio", "audio")
def _wav2vec2():
    return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(**W2V_LIKE, vocab_size=16)), {"input_values": audio()}


@case("hubert", "audio", "audio")
def _hubert():
    return tf.HubertModel(tf.HubertConfig(**W2V_LIKE)), {"input_values": audio()}


@case("wavlm", "audio", "audio")
def _wavlm():
    return tf.WavLMModel(tf.WavLMConfig(**W2V_LIKE, num_buckets=16, max_bucket_distance=32)), {
        "input_values": audio()
    }


@case("data2vec_audio", "audio", "audio")
def _data2vec_audio():
    return tf.Data2VecAudioModel(tf.Data2VecAudioConfig(**W2V_LIKE)), {"input_values": audio()}


# -- multimodal ----------------------------------------------------------------------------------------------------------
CLIP_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    intermediate_size=FFN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    max_position_embeddings=SEQ,
)
CLIP_VISION = dict(
    hidden_size=WIDTH,
    intermediate_size=FFN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    image_size=IMAGE,
    patch_size=8,
)


@case("clip", "multimodal", "multimodal")
def _clip():
    cfg = tf.CLIPConfig(text_config=CLIP_TEXT, vision_config=CLIP_VISION, projection_dim=16)
    return tf.CLIPModel(cfg), {**text_inputs(), "pixel_values": pixels()}


@case("siglip", "multimodal", "multimodal")
def _siglip():
    cfg = tf.SiglipConfig(text_config=CLIP_TEXT, vision_config=CLIP_VISION)
    return tf.SiglipModel(cfg), {**text_inputs(), "pixel_values": pixels()}


IMAGE_TOKEN = VOCAB - 1


@case("llava", "multimodal", "vlm")
def _llava():
    text = tf.LlamaConfig(**{**LLAMA_LIKE, "vocab_size": VOCAB})
    vision = tf.CLIPVisionConfig(**CLIP_VISION)
    cfg = tf.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    # (32/8)^2 = 16 patches; "default" drops CLS: 16 image tokens per image
    n_image = (IMAGE // 8) ** 2
    text_ids = torch.randint(3, VOCAB - 1, (BATCH, SEQ), generator=_gen(1))
    ids = torch.cat([torch.full((BATCH, n_image), IMAGE_TOKEN), text_ids], dim=1)
    return tf.LlavaForConditionalGeneration(cfg), {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": pixels(),
    }


@case("paligemma", "multimodal", "vlm")
def _paligemma():
    text = tf.GemmaConfig(**LLAMA_LIKE)
    vision = tf.SiglipVisionConfig(**CLIP_VISION)
    n_image = (IMAGE // 8) ** 2
    cfg = tf.PaliGemmaConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN, projection_dim=WIDTH
    )
    cfg.vision_config.num_image_tokens = n_image
    text_ids = torch.randint(3, VOCAB - 1, (BATCH, SEQ), generator=_gen(1))
    ids = torch.cat([torch.full((BATCH, n_image), IMAGE_TOKEN), text_ids], dim=1)
    return tf.PaliGemmaForConditionalGeneration(cfg), {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": pixels(),
    }


# The fast default CI set: one or two per family.
DEFAULT = ("llama", "qwen3", "gpt2", "qwen3_moe", "bert", "t5", "vit", "wav2vec2", "clip", "llava", "doge")


def build(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(seed)
    model, inputs = CASES[name].make()
    return model.eval(), inputs


def tensors(output) -> list[torch.Tensor]:
    """Every floating tensor in a model output (ModelOutput, tuple, tensor), in a stable order."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        return [t for v in output.values() for t in tensors(v)]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in tensors(v)]
    return []


def to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def generate_kwargs(kind: str, inputs: dict, max_new_tokens: int = 3) -> dict:
    """Greedy generation inputs: the forward inputs minus decoder ids (generate builds those itself)."""
    kwargs = {k: v for k, v in inputs.items() if k != "decoder_input_ids"}
    return {**kwargs, "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens, "do_sample": False}

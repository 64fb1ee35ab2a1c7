"""Tiny models whose weights divide over 8 chips (built from configs, saved locally: nothing from the Hub)."""

from __future__ import annotations

import torch


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


def qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=8,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    return Qwen3MoeForCausalLM(cfg)


def gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=8,
    )
    return Gemma2ForCausalLM(cfg)


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=256, d_model=64, d_kv=8, d_ff=128, num_layers=2, num_heads=8, decoder_start_token_id=0
    )
    return T5ForConditionalGeneration(cfg)


def bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return BertModel(cfg)


MODELS = {"llama": llama, "qwen3_moe": qwen3_moe, "gemma2": gemma2, "t5": t5, "bert": bert}
DECODERS = ("llama", "qwen3_moe", "gemma2")


def inputs(name: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (2, 12), generator=g)
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": torch.randint(0, 256, (2, 6), generator=g)}
    if name == "bert":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {"input_ids": ids}


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return MODELS[name]().eval()


def output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state


def on(device: str, batch: dict) -> dict:
    return {k: v.to(device) for k, v in batch.items()}

"""Tiny Hugging Face models built from configs (no Hub access): shared by smoke tests and benchmarks."""

from __future__ import annotations

import torch


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(cfg), {"input_ids": torch.randint(0, 256, (2, 16))}


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    return GPT2LMHeadModel(cfg), {"input_ids": torch.randint(0, 256, (2, 16))}


def tiny_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    ids = torch.randint(0, 256, (2, 16))
    return BertModel(cfg), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def tiny_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0
    )
    return T5ForConditionalGeneration(cfg), {
        "input_ids": torch.randint(0, 256, (2, 12)),
        "decoder_input_ids": torch.randint(0, 256, (2, 8)),
    }


def tiny_unet(sample_size: int = 16, batch: int = 1, cross_attention_dim: int = 32, tokens: int = 4):
    """A 2-level UNet2DConditionModel (one cross-attention block each way); sizes for benchmarks."""
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=8,
        norm_num_groups=16,
    )
    return model, {
        "sample": torch.randn(batch, 4, sample_size, sample_size),
        "timestep": torch.tensor([10] * batch),
        "encoder_hidden_states": torch.randn(batch, tokens, cross_attention_dim),
    }


MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "bert": tiny_bert, "t5": tiny_t5, "unet": tiny_unet}


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model, inputs = MODELS[name]()
    return model.eval(), inputs


def first_tensor(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "sample"):
        return output.sample
    if hasattr(output, "logits"):
        return output.logits
    return output[0]

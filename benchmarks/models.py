"""Benchmark models: a size ladder of Hugging Face architectures built from configs (no Hub access).

`tiny` are the test-suite configs (hidden 64, 2 layers, ~1 ms of torch eager: per-op dispatch
dominates). `small` are sized like the models behind DESIGN §3.5's baselines (0.8–12 M parameters,
10–60 ms of torch eager: where compute starts to matter). Same seed, same inputs for every mode.
"""

from __future__ import annotations

import torch

from tests.hf_models import MODELS as TINY
from tests.hf_models import build as build_tiny
from tests.hf_models import tiny_unet

SIZES = ("tiny", "small")


def _text_ids(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg), {"input_ids": _text_ids(2048, 2, 128)}


def small_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=8192, n_embd=256, n_layer=6, n_head=8, n_positions=512, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(cfg), {"input_ids": _text_ids(8192, 2, 128)}


def small_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=4096,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        intermediate_size=512,
        max_position_embeddings=512,
    )
    ids = _text_ids(4096, 2, 128)
    return BertModel(cfg), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def small_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=4096,
        d_model=256,
        d_kv=32,
        d_ff=512,
        num_layers=4,
        num_heads=8,
        decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(cfg), {
        "input_ids": _text_ids(4096, 2, 96),
        "decoder_input_ids": _text_ids(4096, 2, 32),
    }


def _vit(hidden: int, layers: int, heads: int, image: int, patch: int, batch: int):
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden * 2,
        image_size=image,
        patch_size=patch,
    )
    return ViTModel(cfg, add_pooling_layer=False), {"pixel_values": torch.randn(batch, 3, image, image)}


def tiny_vit():
    return _vit(64, 2, 4, 32, 8, 2)


def small_vit():
    return _vit(256, 4, 8, 128, 16, 2)


def small_unet():
    return tiny_unet(sample_size=32, batch=2, cross_attention_dim=64, tokens=16)


SMALL = {
    "llama": small_llama,
    "gpt2": small_gpt2,
    "bert": small_bert,
    "t5": small_t5,
    "vit": small_vit,
    "unet": small_unet,
}
NAMES = tuple(SMALL)


def build(name: str, size: str = "tiny", seed: int = 0):
    """(model in eval mode, inputs on CPU) for `name` at `size`; same seed, same weights every call."""
    if size == "tiny" and name in TINY:
        return build_tiny(name, seed)
    table = {"tiny": {"vit": tiny_vit}, "small": SMALL}.get(size)
    if table is None or name not in table:
        raise ValueError(f"no benchmark model {name!r} at size {size!r}; sizes {SIZES}, models {NAMES}")
    torch.manual_seed(seed)
    model, inputs = table[name]()
    return model.eval(), inputs


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def llama_100m_config(heads: int = 12):
    """~110M parameters: Llama, width 768, 12 layers, vocab 32000 (tied); `heads` attention heads (16 divide
    over 8 chips)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )

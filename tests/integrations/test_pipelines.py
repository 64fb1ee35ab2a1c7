"""pipeline(task, model=<local tiny checkpoint>, device_map="tpu") for four tasks, compared with CPU.

Tokenizers and processors are built offline: a WordPiece vocab file for BERT-style tokenizers, a
ViTImageProcessor, and a Wav2Vec2 feature extractor + CTC tokenizer from a vocab.json.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import pipeline

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
] + "the a cat dog sat on mat is red blue big and ran".split()


def _bert_tokenizer(tmp_path):
    from transformers import BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(WORDS + list("abcdefghijklmnopqrstuvwxyz")) + "\n")
    return BertTokenizerFast(str(vocab))


def _save(tmp_path, name, model, *processors) -> str:
    path = tmp_path / name
    model.save_pretrained(path)
    for p in processors:
        p.save_pretrained(path)
    return str(path)


def _both(task, path, *args, **kwargs):
    cpu = pipeline(task, model=path, device_map="cpu")
    tpu = pipeline(task, model=path, device_map="tpu")
    assert tpu.device.type == "tpu" and tpu.model.device.type == "tpu"
    assert all(p.device.type == "tpu" for p in tpu.model.parameters())
    return cpu(*args, **kwargs), tpu(*args, **kwargs)


def _close_scores(a, b, key="score"):
    assert [x["label" if "label" in x else "token"] for x in a] == [
        x["label" if "label" in x else "token"] for x in b
    ]
    np.testing.assert_allclose([x[key] for x in a], [x[key] for x in b], atol=1e-5)


def test_fill_mask(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    tok = _bert_tokenizer(tmp_path)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    path = _save(tmp_path, "bert", BertForMaskedLM(cfg).eval(), tok)
    cpu, tpu = _both("fill-mask", path, "the cat [MASK] on the mat")
    _close_scores(cpu, tpu)


@pytest.mark.slow
def test_text_generation(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _bert_tokenizer(tmp_path)
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=tok.vocab_size,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=2,
        eos_token_id=3,
    )
    model = GPT2LMHeadModel(cfg).eval()
    model.generation_config.pad_token_id = 0
    path = _save(tmp_path, "gpt2", model, tok)
    kwargs = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "return_tensors": True}
    cpu, tpu = _both("text-generation", path, "the cat sat", **kwargs)
    assert cpu[0]["generated_token_ids"] == tpu[0]["generated_token_ids"]
    assert len(tpu[0]["generated_token_ids"]) == len(tok("the cat sat")["input_ids"]) + 4


def test_image_classification(tmp_path):
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
    )
    processor = ViTImageProcessor(size={"height": 32, "width": 32})
    path = _save(tmp_path, "vit", ViTForImageClassification(cfg).eval(), processor)
    image = Image.fromarray((np.random.RandomState(0).rand(40, 48, 3) * 255).astype("uint8"))
    cpu, tpu = _both("image-classification", path, image)
    _close_scores(cpu, tpu)


@pytest.mark.slow
def test_automatic_speech_recognition(tmp_path):
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    letters = ["<pad>", "<s>", "</s>", "<unk>", "|", *"abcdefghij"]
    (tmp_path / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(letters)}))
    processor = Wav2Vec2Processor(
        feature_extractor=Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, do_normalize=True),
        tokenizer=Wav2Vec2CTCTokenizer(str(tmp_path / "vocab.json")),
    )
    torch.manual_seed(0)
    cfg = Wav2Vec2Config(
        vocab_size=len(letters),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 4),
        conv_kernel=(10, 8),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
    )
    path = _save(tmp_path, "w2v", Wav2Vec2ForCTC(cfg).eval(), processor)
    speech = np.random.RandomState(0).randn(4000).astype("float32")
    cpu, tpu = _both("automatic-speech-recognition", path, speech)
    assert cpu["text"] == tpu["text"]
    assert len(tpu["text"]) > 0


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

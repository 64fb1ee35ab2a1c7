"""Tiny Llama, GPT-2, BERT, T5 and a diffusers UNet, built from configs, moved to tpu: forward matches CPU."""

import pytest
import torch

from tests.hf_models import MODELS, build, first_tensor


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_matches_cpu(name):
    model, inputs = build(name)
    with torch.no_grad():
        ref = first_tensor(model(**inputs))
        model.to("tpu")
        assert all(p.device.type == "tpu" for p in model.parameters())
        out = first_tensor(model(**{k: v.to("tpu") for k, v in inputs.items()}))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)

"""LoRA on tpu pipelines (PEFT backend): `load_lora_weights` from a local safetensors file, `set_adapters` with
weights, `fuse_lora`/`unfuse_lora`, and hot-swapping an adapter into a compiled denoiser without a
recompile. Each result equals the CPU pipeline with the same adapters. A UNet (SD) and a DiT (Flux)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integrations.diffusion_zoo import FAMILIES, output_of

pytest.importorskip("peft")

TARGETS = {
    "sd": ("unet", ["to_q", "to_k", "to_v", "to_out.0"]),
    "flux": ("transformer", ["to_q", "to_k", "to_v"]),
}


def _lora_file(name: str, folder, seed: int, rank: int = 4) -> str:
    """A random LoRA for family `name`'s denoiser, saved with the pipeline's own `save_lora_weights`."""
    from peft import LoraConfig, get_peft_model_state_dict

    fam = FAMILIES[name]
    pipe = fam.build()
    attr, targets = TARGETS[name]
    model = getattr(pipe, attr)
    torch.manual_seed(seed)
    model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False))
    for n, p in model.named_parameters():  # visible effect at these tiny sizes
        if "lora_B" in n:
            p.data.mul_(4.0)
    layers = get_peft_model_state_dict(model)
    type(pipe).save_lora_weights(str(folder), **{f"{attr}_lora_layers": layers}, safe_serialization=True)
    return str(folder)


@pytest.fixture(scope="module", params=["sd", "flux"])
def lora_setup(request, tmp_path_factory):
    name = request.param
    a = _lora_file(name, tmp_path_factory.mktemp(f"{name}_lora_a"), seed=1)
    b = _lora_file(name, tmp_path_factory.mktemp(f"{name}_lora_b"), seed=2)
    return name, a, b


def _generate(name, pipe) -> np.ndarray:
    fam = FAMILIES[name]
    return output_of(fam, pipe(**fam.inputs()))


def _with_adapters(pipe, a, b):
    pipe.load_lora_weights(a, weight_name="pytorch_lora_weights.safetensors", adapter_name="a")
    pipe.load_lora_weights(b, weight_name="pytorch_lora_weights.safetensors", adapter_name="b")
    return pipe


def test_lora_load_set_adapters_fuse_unfuse_on_tpu_match_cpu(lora_setup):
    name, a, b = lora_setup
    fam = FAMILIES[name]
    cpu = fam.build()
    base = _generate(name, cpu)
    _with_adapters(cpu, a, b)
    cpu.set_adapters(["a"])
    only_a = _generate(name, cpu)
    cpu.set_adapters(["a", "b"], adapter_weights=[0.5, 1.0])
    mixed = _generate(name, cpu)
    assert np.abs(only_a - base).max() > 1e-3  # the adapter changes the image
    assert np.abs(mixed - only_a).max() > 1e-3

    tpu = _with_adapters(fam.build().to("tpu"), a, b)
    attr = TARGETS[name][0]
    assert all(p.device.type == "tpu" for p in getattr(tpu, attr).parameters())
    tpu.set_adapters(["a"])
    np.testing.assert_allclose(_generate(name, tpu), only_a, atol=1e-4, rtol=0)
    tpu.set_adapters(["a", "b"], adapter_weights=[0.5, 1.0])
    np.testing.assert_allclose(_generate(name, tpu), mixed, atol=1e-4, rtol=0)
    tpu.fuse_lora(adapter_names=["a", "b"])
    np.testing.assert_allclose(_generate(name, tpu), mixed, atol=1e-4, rtol=0)
    tpu.unfuse_lora()
    tpu.disable_lora()
    np.testing.assert_allclose(_generate(name, tpu), base, atol=1e-4, rtol=0)


def test_lora_hotswap_into_a_compiled_denoiser_matches_cpu_without_recompiling(lora_setup, request):
    """diffusers' hot-swap: `enable_lora_hotswap` before the first load, compile, then
    `load_lora_weights(..., hotswap=True)` replaces the weights in place, and the compiled graphs stay."""
    from torch._dynamo.utils import counters

    import hf_tpu

    name, a, b = lora_setup
    if name == "sd" and "slow" not in request.config.getoption("-m", ""):
        pytest.skip("the UNet hot-swap runs with -m slow (the DiT one in the default suite)")
    fam = FAMILIES[name]
    cpu = fam.build()
    cpu.load_lora_weights(b, weight_name="pytorch_lora_weights.safetensors", adapter_name="x")
    expected_b = _generate(name, cpu)
    cpu.load_lora_weights(a, weight_name="pytorch_lora_weights.safetensors", adapter_name="x", hotswap=True)
    expected_a = _generate(name, cpu)

    tpu = fam.build().to("tpu")
    tpu.enable_lora_hotswap(target_rank=8)
    tpu.load_lora_weights(b, weight_name="pytorch_lora_weights.safetensors", adapter_name="x")
    hf_tpu.compile_pipeline(tpu, text_encoders=False, vae=False)
    np.testing.assert_allclose(_generate(name, tpu), expected_b, atol=1e-4, rtol=0)
    graphs = counters["stats"]["unique_graphs"]
    tpu.load_lora_weights(a, weight_name="pytorch_lora_weights.safetensors", adapter_name="x", hotswap=True)
    np.testing.assert_allclose(_generate(name, tpu), expected_a, atol=1e-4, rtol=0)
    assert counters["stats"]["unique_graphs"] == graphs  # the swap recompiled nothing

"""Bad input to tpu pipelines: the error diffusers gives on CPU (same type, same message) or a clearer one
naming the argument, never a JAX traceback, and nothing left half-moved or half-compiled."""

from __future__ import annotations

import pytest
import torch

import hf_tpu
from tests.integrations.diffusion_zoo import FAMILIES


@pytest.fixture(scope="module")
def sd_pair():
    fam = FAMILIES["sd"]
    return fam.build(), fam.build().to("tpu")


def _error(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _assert_same_error(cpu_fn, tpu_fn) -> BaseException:
    expected, got = _error(cpu_fn), _error(tpu_fn)
    assert type(got) is type(expected), (got, expected)
    assert str(got) == str(expected)
    _not_jax(got)
    return got


def _not_jax(exc: BaseException) -> None:
    chain = [exc]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    for e in chain:
        assert not type(e).__module__.startswith(("jax", "jaxlib")), f"a JAX error reached the user: {e!r}"


def _params(pipe) -> dict:
    return {n: p.detach().cpu().clone() for n, p in pipe.unet.named_parameters()}


@pytest.mark.parametrize(
    "overrides",
    [
        {"height": 20, "width": 16},  # not divisible by the VAE factor (8)
        {"generator": "two"},  # a list of generators for a batch of one
        {"prompt": None},  # neither prompt nor prompt_embeds
    ],
    ids=["resolution", "generator_list", "no_prompt"],
)
def test_bad_call_arguments_raise_cpus_error(sd_pair, overrides):
    cpu, tpu = sd_pair
    fam = FAMILIES["sd"]

    def call(pipe):
        inputs = {**fam.inputs(), **overrides}
        if inputs["generator"] == "two":
            inputs["generator"] = [torch.Generator().manual_seed(0)] * 2
        return lambda: pipe(**inputs)

    _assert_same_error(call(cpu), call(tpu))


def test_a_generator_made_for_tpu_draws_cpus_numbers(sd_pair):
    """`torch.Generator("tpu")` (diffusers' docs idiom; README, *Random numbers*). With the C++ extension
    it is a real tpu generator: the latents are the device's draws (as CUDA's differ from CPU's), the
    same image for the same seed, and the CPU pipeline given those latents gives that image. On the
    pure-Python path it is a CPU generator: the tpu pipeline gives the image a CPU generator gives."""
    import numpy as np

    from hf_tpu.runtime import native

    cpu, tpu = sd_pair
    fam = FAMILIES["sd"]
    got = tpu(**{**fam.inputs(), "generator": torch.Generator("tpu").manual_seed(0)}).images
    if not native.active():
        np.testing.assert_allclose(got, cpu(**fam.inputs()).images, atol=1e-4, rtol=0)
        return
    again = tpu(**{**fam.inputs(), "generator": torch.Generator("tpu").manual_seed(0)}).images
    np.testing.assert_array_equal(got, again)
    inputs = {k: v for k, v in fam.inputs().items() if k != "generator"}
    scale = tpu.vae_scale_factor
    shape = (1, tpu.unet.config.in_channels, inputs["height"] // scale, inputs["width"] // scale)
    latents = torch.randn(shape, generator=torch.Generator("tpu").manual_seed(0), device="tpu")
    expected = cpu(**inputs, latents=latents.cpu()).images
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_scheduler_incompatible_with_the_pipeline_raises_cpus_error():
    from diffusers import DDIMScheduler

    fam = FAMILIES["flux"]
    cpu, tpu = fam.build(), fam.build().to("tpu")
    cpu.scheduler = DDIMScheduler()
    tpu.scheduler = DDIMScheduler()
    err = _assert_same_error(lambda: cpu(**fam.inputs()), lambda: tpu(**fam.inputs()))
    assert "scheduler" in str(err)


def test_lora_for_another_architecture_behaves_as_on_cpu_and_changes_nothing(sd_pair, tmp_path):
    """diffusers 0.42 loads a Flux LoRA into an SD pipeline without an error (it finds no UNet keys and
    warns): on tpu the same, and the UNet is left exactly as it was, on tpu."""
    from peft import LoraConfig, get_peft_model_state_dict

    flux = FAMILIES["flux"].build()
    flux.transformer.add_adapter(LoraConfig(r=2, target_modules=["to_q", "to_k"], init_lora_weights=False))
    type(flux).save_lora_weights(
        str(tmp_path), transformer_lora_layers=get_peft_model_state_dict(flux.transformer)
    )
    cpu, tpu = sd_pair
    before = _params(tpu)

    def load(pipe):
        try:
            pipe.load_lora_weights(str(tmp_path), weight_name="pytorch_lora_weights.safetensors")
        except Exception as exc:  # noqa: BLE001 - compared below
            return exc
        return None

    expected, got = load(cpu), load(tpu)
    assert type(got) is type(expected) and str(got) == str(expected)
    if got is not None:
        _not_jax(got)
    after = _params(tpu)
    assert after.keys() == before.keys()  # no LoRA layers were injected
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert all(p.device.type == "tpu" for p in tpu.unet.parameters())


def test_moving_to_a_device_index_that_does_not_exist_moves_nothing():
    pipe = FAMILIES["sd"].build()
    with pytest.raises(ValueError, match=r"tpu:1 does not exist.*Use 'tpu' or 'tpu:0'"):
        pipe.to("tpu:1")
    devices = {
        t.device.type
        for m in pipe.components.values()
        if isinstance(m, torch.nn.Module)
        for t in m.parameters()
    }
    assert devices == {"cpu"}


def test_compile_pipeline_with_a_component_on_cpu_names_it_and_compiles_nothing():
    pipe = FAMILIES["sd"].build()
    pipe.unet.to("tpu")
    pipe.text_encoder.to("tpu")
    with pytest.raises(ValueError, match=r"pipe\.vae on cpu; move the pipeline first .*Nothing was compiled"):
        hf_tpu.compile_pipeline(pipe)
    modules = [m for c in pipe.components.values() if isinstance(c, torch.nn.Module) for m in c.modules()]
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in modules)


def test_whole_loop_mode_for_an_unsupported_pipeline_says_so():
    pipe = FAMILIES["sd3"].build().to("tpu")
    with pytest.raises(
        ValueError, match=r"no whole-loop mode for StableDiffusion3Pipeline .*without loop=True"
    ):
        hf_tpu.compile_pipeline(pipe, loop=True)

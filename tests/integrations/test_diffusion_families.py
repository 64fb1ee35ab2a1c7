"""Every diffusers pipeline family of `diffusion_zoo.py` on tpu gives CPU's output for the same CPU generator:
Strict, DeferAndFuse, and with `hf_tpu.compile_pipeline` (denoiser, text encoders and image VAE decoders
compiled with the `tpu` backend). Each family is built on CPU, saved, and reloaded onto tpu with
`from_pretrained(..., device_map="tpu")` or `.to("tpu")`.

Families marked `fast` in the zoo run Strict + DeferAndFuse in the default suite; the rest, and every
family compiled, with `-m slow` (the default suite covers compiled SD, SD3 and Flux against CPU in
test_diffusers_compile.py, with their compile counts). fp32, atol 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integrations.diffusion_zoo import FAMILIES, KandinskyPriorDecoder, output_of


def _params(fast=lambda f: f.fast):
    return [
        pytest.param(name, marks=() if fast(f) else pytest.mark.slow, id=name) for name, f in FAMILIES.items()
    ]


_references: dict = {}


def reference(name: str, tmp_path_factory):
    """(saved folder, CPU output) for a family, computed once per session."""
    if name not in _references:
        fam = FAMILIES[name]
        pipe = fam.build()
        expected = output_of(fam, pipe(**fam.inputs()))
        path = tmp_path_factory.mktemp(name.replace("+", "_"))
        pipe.save_pretrained(path)
        _references[name] = (path, expected)
    return _references[name]


def load_on_tpu(name: str, path):
    from diffusers import DiffusionPipeline

    fam = FAMILIES[name]
    cls = KandinskyPriorDecoder if name == "kandinsky22_prior_decoder" else DiffusionPipeline
    if fam.load == "device_map":
        pipe = cls.from_pretrained(path, device_map="tpu")
    else:
        pipe = cls.from_pretrained(path).to("tpu")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(name: str, pipe) -> np.ndarray:
    fam = FAMILIES[name]
    return output_of(fam, pipe(**fam.inputs()))


def assert_matches(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape, name
    assert np.isfinite(expected).all(), f"{name}: the CPU reference is not finite"
    np.testing.assert_allclose(got, expected, atol=FAMILIES[name].atol, rtol=0, err_msg=name)


def _on_tpu(pipe) -> bool:
    return all(
        p.device.type == "tpu"
        for m in pipe.components.values()
        if isinstance(m, torch.nn.Module)
        for p in m.parameters()
    )


@pytest.mark.parametrize("name", _params())
def test_family_on_tpu_matches_cpu_in_strict_and_defer_and_fuse(name, tmp_path_factory):
    path, expected = reference(name, tmp_path_factory)
    pipe = load_on_tpu(name, path)
    assert _on_tpu(pipe)
    assert_matches(name, run(name, pipe), expected)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        assert_matches(name, run(name, pipe), expected)


@pytest.mark.parametrize("name", _params(fast=lambda f: False))
def test_family_compiled_matches_cpu(name, tmp_path_factory):
    import hf_tpu

    path, expected = reference(name, tmp_path_factory)
    pipe = load_on_tpu(name, path)
    if isinstance(pipe, KandinskyPriorDecoder):
        hf_tpu.compile_pipeline(pipe.prior)
        hf_tpu.compile_pipeline(pipe.decoder)
    else:
        hf_tpu.compile_pipeline(pipe)
    assert_matches(name, run(name, pipe), expected)


# images in [0, 1]; bf16 keeps 8 bits of mantissa (steps of 0.002-0.004 near 0.5) and XLA:CPU accumulates
# in another order than torch's CPU kernels. Measured 2026-12-01: mean |diff| 0.0045 (SD), max < 3e-2
BF16_ATOL, BF16_MEAN = 3e-2, 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd", "flux"])
def test_family_in_bfloat16_matches_cpu_bfloat16(name, tmp_path_factory):
    """The same pipeline loaded in bfloat16 on CPU and on tpu: the images agree to BF16_ATOL (mean error
    under BF16_MEAN), the dtype is kept on tpu."""
    from diffusers import DiffusionPipeline

    path, _ = reference(name, tmp_path_factory)
    cpu = DiffusionPipeline.from_pretrained(path, torch_dtype=torch.bfloat16)
    cpu.set_progress_bar_config(disable=True)
    expected = run(name, cpu)
    tpu = DiffusionPipeline.from_pretrained(path, torch_dtype=torch.bfloat16, device_map="tpu")
    tpu.set_progress_bar_config(disable=True)
    denoiser = getattr(tpu, FAMILIES[name].denoiser)
    assert {p.dtype for p in denoiser.parameters()} == {torch.bfloat16}
    got = run(name, tpu)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=BF16_ATOL, rtol=0)
    assert np.abs(got - expected).mean() < BF16_MEAN

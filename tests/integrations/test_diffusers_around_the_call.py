"""What users do around a pipeline call, on tpu against CPU: offloading onto tpu in the DiT families (model,
sequential, group offloading), VAE tiling and slicing, `callback_on_step_end`, `output_type="latent"`,
reusing prompt embeddings, and one training step of a tiny UNet and a tiny DiT with
`diffusers.training_utils` (loss and gradients equal CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integrations.diffusion_zoo import FAMILIES, output_of


def _expected(name: str, **overrides) -> np.ndarray:
    fam = FAMILIES[name]
    return output_of(fam, fam.build()(**{**fam.inputs(), **overrides}))


def _close(got, expected, atol=1e-4):
    np.testing.assert_allclose(got, expected, atol=atol, rtol=0)


@pytest.mark.parametrize(
    "how",
    [
        "model",
        "sequential",
        pytest.param("group_block", marks=pytest.mark.slow),
        "group_leaf_stream",
    ],
)
def test_flux_offloaded_to_tpu_matches_cpu(how):
    fam = FAMILIES["flux"]
    expected = _expected("flux")
    pipe = fam.build()
    if how == "model":
        pipe.enable_model_cpu_offload(device="tpu")
    elif how == "sequential":
        pipe.enable_sequential_cpu_offload(device="tpu")
    elif how == "group_block":
        pipe.enable_group_offload(
            onload_device=torch.device("tpu"), offload_type="block_level", num_blocks_per_group=1
        )
    else:
        pipe.enable_group_offload(
            onload_device=torch.device("tpu"), offload_type="leaf_level", use_stream=True
        )
    _close(output_of(fam, pipe(**fam.inputs())), expected)
    assert pipe.transformer.x_embedder.weight.device.type in ("cpu", "meta")  # offloaded again afterwards


def test_sd3_group_offloading_matches_cpu():
    fam = FAMILIES["sd3"]
    expected = _expected("sd3")
    pipe = fam.build()
    pipe.enable_group_offload(onload_device=torch.device("tpu"), offload_type="leaf_level")
    _close(output_of(fam, pipe(**fam.inputs())), expected)


@pytest.mark.slow
def test_vae_tiling_and_slicing_on_tpu_match_cpu():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    ).eval()
    vae.enable_tiling()  # tiles of 16 pixels / 8 latents, blended: 32 x 32 images take 3 x 3 tiles
    vae.enable_slicing()
    latents = torch.randn(2, 4, 16, 16)
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        expected = vae.decode(latents).sample
        expected_mean = vae.encode(images).latent_dist.mean
        tpu = vae.to("tpu")
        got = tpu.decode(latents.to("tpu")).sample
        got_mean = tpu.encode(images.to("tpu")).latent_dist.mean
    assert got.shape == expected.shape == (2, 3, 32, 32)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_mean.cpu(), expected_mean, atol=1e-4, rtol=1e-4)


def test_callback_on_step_end_latent_output_and_prompt_embeds_reuse_on_tpu():
    fam = FAMILIES["flux"]
    cpu = fam.build()
    expected_latents = cpu(**{**fam.inputs(), "output_type": "latent"}).images
    pipe = fam.build().to("tpu")
    seen = []

    def callback(pipe, i, t, kwargs):
        seen.append((i, kwargs["latents"].device.type, tuple(kwargs["latents"].shape)))
        kwargs["latents"] = kwargs["latents"] * 1.0  # a value the pipeline takes back
        return kwargs

    out = pipe(**{**fam.inputs(), "output_type": "latent"}, callback_on_step_end=callback)
    latents = out.images
    assert latents.device.type == "tpu"
    torch.testing.assert_close(latents.cpu(), expected_latents, atol=1e-5, rtol=1e-5)
    assert [s[0] for s in seen] == [0, 1] and {s[1] for s in seen} == {"tpu"}

    # prompt embeddings computed once on tpu, reused for a second call without the prompt
    embeds, pooled, _ = pipe.encode_prompt(
        prompt=fam.inputs()["prompt"], prompt_2=None, max_sequence_length=8
    )
    assert embeds.device.type == "tpu"
    inputs = fam.inputs()
    inputs.pop("prompt")
    reused = pipe(**inputs, prompt_embeds=embeds, pooled_prompt_embeds=pooled)
    _close(output_of(fam, reused), _expected("flux"))


def _train_step(model, batch, device):
    """One diffusers-style training step: DDPM noise, SNR-weighted MSE (training_utils.compute_snr),
    backward, then an EMA update (training_utils.EMAModel). Returns (loss, grads, ema params)."""
    from diffusers import DDPMScheduler
    from diffusers.training_utils import EMAModel, compute_snr

    scheduler = DDPMScheduler(num_train_timesteps=100)
    model = model.to(device).train()
    ema = EMAModel(model.parameters(), decay=0.9)
    latents, noise, timesteps, cond = (v.to(device) for v in batch)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    if hasattr(model, "conv_in"):
        pred = model(noisy, timesteps, encoder_hidden_states=cond).sample
    else:
        pred = model(noisy, timestep=timesteps, encoder_hidden_states=cond).sample
    snr = compute_snr(scheduler, timesteps)
    weights = torch.stack([snr, 5.0 * torch.ones_like(snr)], dim=1).min(dim=1)[0] / snr
    loss = torch.nn.functional.mse_loss(pred.float(), noise.float(), reduction="none")
    loss = (loss.mean(dim=list(range(1, loss.ndim))) * weights).mean()
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    ema.step(model.parameters())
    return loss.detach().cpu(), grads, [p.detach().cpu() for p in ema.shadow_params]


def _tiny_models():
    from diffusers import DiTTransformer2DModel, UNet2DConditionModel

    from tests.integrations.diffusion_zoo import sd_unet

    torch.manual_seed(0)
    unet = sd_unet()
    torch.manual_seed(0)
    dit = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=100,
    )
    return {"unet": (UNet2DConditionModel, unet), "dit": (DiTTransformer2DModel, dit)}


@pytest.mark.parametrize("kind", [pytest.param("unet", marks=pytest.mark.slow), "dit"])
def test_training_step_with_training_utils_on_tpu_matches_cpu(kind):
    cls, model = _tiny_models()[kind]
    g = torch.Generator().manual_seed(3)
    batch = (
        torch.randn(2, 4, 8, 8, generator=g),
        torch.randn(2, 4, 8, 8, generator=g),
        torch.tensor([10, 70]),
        torch.randn(2, 4, 32, generator=g),
    )
    if kind == "dit":  # DiT is class-conditional: its "condition" is the class label
        batch = batch[:3] + (torch.tensor([1, 2]),)

    def step(m, device):
        if kind == "dit":
            return _dit_step(m, batch, device)
        return _train_step(m, batch, device)

    import copy

    cpu_loss, cpu_grads, cpu_ema = step(copy.deepcopy(model), "cpu")
    tpu_loss, tpu_grads, tpu_ema = step(copy.deepcopy(model), "tpu")
    torch.testing.assert_close(tpu_loss, cpu_loss, atol=1e-5, rtol=1e-5)
    assert tpu_grads.keys() == cpu_grads.keys() and len(cpu_grads) > 10
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(tpu_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    for a, b in zip(tpu_ema, cpu_ema):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _dit_step(model, batch, device):
    from diffusers import DDPMScheduler
    from diffusers.training_utils import EMAModel, compute_snr

    scheduler = DDPMScheduler(num_train_timesteps=100)
    model = model.to(device).train()
    for module in model.modules():  # classifier-free label dropout draws from the device's own RNG
        if hasattr(module, "dropout_prob"):
            module.dropout_prob = 0.0
    ema = EMAModel(model.parameters(), decay=0.9)
    latents, noise, timesteps, labels = (v.to(device) for v in batch)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    pred = model(noisy, timestep=timesteps, class_labels=labels).sample
    snr = compute_snr(scheduler, timesteps)
    loss = torch.nn.functional.mse_loss(pred, noise, reduction="none").mean(dim=(1, 2, 3))
    loss = (loss * (snr.clamp(max=5.0) / snr)).mean()
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    ema.step(model.parameters())
    return loss.detach().cpu(), grads, [p.detach().cpu() for p in ema.shadow_params]

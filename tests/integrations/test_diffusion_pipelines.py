"""diffusers pipelines run on tpu and give CPU's images: Strict, DeferAndFuse, a compiled UNet/VAE, and
accelerate's offloading onto tpu. A tiny Stable Diffusion (CLIP text encoder, cross-attention UNet, VAE,
DDIM, classifier-free guidance) is built from configs and saved locally: nothing comes from the Hub."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.hf_models import tiny_unet

PROMPT = "a photo of a red cat"
WORDS = ["<pad>", "<unk>", "<s>", "</s>", "a", "photo", "of", "cat", "dog", "red"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=8,
    )


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    """(folder of a saved tiny Stable Diffusion pipeline, CPU images for PROMPT)."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(WORDS),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=8,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
    )
    unet = tiny_unet(sample_size=8, cross_attention_dim=32)[0]  # 16 x 16 images: 8 x 8 latents
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text,
        tokenizer=_tokenizer(),
        unet=unet,
        scheduler=DDIMScheduler(num_train_timesteps=100, clip_sample=False, steps_offset=1),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    path = tmp_path_factory.mktemp("sd_tiny")
    pipe.save_pretrained(path)
    return path, _generate(pipe)


def _generate(pipe) -> np.ndarray:
    generator = torch.Generator("cpu").manual_seed(0)  # the latents are drawn on CPU, as users do for parity
    return pipe(
        PROMPT,
        generator=generator,
        num_inference_steps=3,
        guidance_scale=7.5,
        height=16,
        width=16,
        output_type="np",
    ).images


def _load(path, **kwargs):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(path, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _assert_images_match(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape == (1, 16, 16, 3)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0)


def test_stable_diffusion_on_tpu_matches_cpu_in_strict_and_defer_and_fuse(sd):
    path, expected = sd
    pipe = _load(path).to("tpu")
    assert {pipe.unet.device.type, pipe.vae.device.type, pipe.text_encoder.device.type} == {"tpu"}
    _assert_images_match(_generate(pipe), expected)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _assert_images_match(_generate(pipe), expected)


def test_stable_diffusion_with_compiled_unet_and_vae_matches_cpu_without_recompiling(sd):
    from torch._dynamo.utils import counters

    path, expected = sd
    pipe = _load(path, device_map="tpu")
    pipe.unet = torch.compile(pipe.unet, backend="tpu", fullgraph=True)
    pipe.vae.decode = torch.compile(pipe.vae.decode, backend="tpu", fullgraph=True)
    _assert_images_match(_generate(pipe), expected)
    graphs = counters["stats"]["unique_graphs"]
    _assert_images_match(_generate(pipe), expected)
    assert counters["stats"]["unique_graphs"] == graphs  # the second generation reuses every graph


@pytest.mark.parametrize("offload", ["enable_model_cpu_offload", "enable_sequential_cpu_offload"])
def test_stable_diffusion_offloaded_to_tpu_matches_cpu(sd, offload):
    path, expected = sd
    pipe = _load(path)
    getattr(pipe, offload)(device="tpu")
    _assert_images_match(_generate(pipe), expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"offload_type": "block_level", "num_blocks_per_group": 1},
        {"offload_type": "leaf_level", "use_stream": True},
        {"offload_type": "leaf_level", "use_stream": True, "record_stream": True},
        {"offload_type": "block_level", "num_blocks_per_group": 1, "offload_to_disk_path": "disk"},
    ],
    ids=["block_level", "leaf_level_stream", "leaf_level_record_stream", "block_level_disk"],
)
def test_stable_diffusion_group_offloaded_to_tpu_matches_cpu(sd, kwargs, tmp_path):
    """Group offloading moves each weight with `param.data = param.data.to(onload_device)`: refused
    between CPU and tpu until the backend answered `_has_compatible_shallow_copy_type`. With
    `record_stream=True` it calls `tensor.data.record_stream(torch.tpu.current_stream())`."""
    path, expected = sd
    pipe = _load(path)
    if "offload_to_disk_path" in kwargs:
        kwargs = {**kwargs, "offload_to_disk_path": str(tmp_path / kwargs["offload_to_disk_path"])}
    pipe.enable_group_offload(onload_device=torch.device("tpu"), **kwargs)
    _assert_images_match(_generate(pipe), expected)
    assert pipe.unet.conv_in.weight.device.type == "cpu"  # offloaded again after the forward


def test_unconditional_ddim_with_a_compiled_unet_matches_cpu():
    from diffusers import DDIMPipeline, DDIMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )

    def generate(pipe):
        pipe.set_progress_bar_config(disable=True)
        g = torch.Generator("cpu").manual_seed(0)
        return pipe(batch_size=2, generator=g, num_inference_steps=4, output_type="np").images

    expected = generate(DDIMPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=50)))
    pipe = DDIMPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=50)).to("tpu")
    pipe.unet = torch.compile(pipe.unet, backend="tpu", fullgraph=True)
    got = generate(pipe)
    assert got.shape == expected.shape == (2, 8, 8, 3)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0)

"""Tiny diffusers pipelines, one per family, built from configs with random weights (nothing from the Hub).

Each `Family` builds its pipeline on CPU (`build()`, seeded, so two builds hold the same weights) and the
call arguments of one short generation (`inputs()`: a fresh CPU generator each time, so every run draws
the same latents). Text encoders are a few layers wide; tokenizers are word-level ones made here. Sizes
are the smallest each architecture accepts, so that a family's CPU reference, its Strict and
DeferAndFuse runs and its compiled run all fit in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "a", "photo", "of", "cat", "dog", "red", "blue", "sky", "sea"]
PROMPT = "a photo of a red cat"
NEGATIVE = "a blue dog"
VOCAB = 32  # embedding rows: more than WORDS, so special ids other tokenizers use stay in range


def tokenizer(max_length: int = 8, padding_side: str = "right"):
    """A word-level fast tokenizer over WORDS (CLIP, T5, Gemma, Llama and BERT slots all take it)."""
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
        model_max_length=max_length,
        padding_side=padding_side,
    )


def clip_text(hidden: int = 32, projection: bool = False, positions: int = 8):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=positions,
        projection_dim=hidden,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def t5_encoder(d_model: int = 32, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kwargs = dict(
        vocab_size=VOCAB,
        d_model=d_model,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
    )
    if umt5:
        return UMT5EncoderModel(UMT5Config(**kwargs)).eval()
    return T5EncoderModel(T5Config(**kwargs)).eval()


def gemma2(hidden: int = 32):
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return Gemma2Model(config).eval()


def llama(hidden: int = 32):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return LlamaModel(config).eval()


def bert(hidden: int = 32):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=80,  # HunyuanDiT pads its BERT prompt to 77 tokens
    )
    return BertModel(config).eval()


def vae_kl(latent: int = 4, blocks=(8, 16), **kwargs):
    from diffusers import AutoencoderKL

    n = len(blocks)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=blocks,
        latent_channels=latent,
        norm_num_groups=8,
        sample_size=16,
        **kwargs,
    ).eval()


def image(size: int = 16, seed: int = 1):
    """A deterministic RGB PIL image (img2img, inpainting, image-to-video, control inputs)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((size, size, 3)) * 255).astype(np.uint8))


def mask(size: int = 16):
    from PIL import Image

    m = np.zeros((size, size), dtype=np.uint8)
    m[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 255
    return Image.fromarray(m)


@dataclass
class Family:
    """One pipeline family: `build()` -> CPU pipeline, `call()` -> kwargs for one generation."""

    name: str
    build: Callable
    call: Callable[[], dict]
    output: str = "images"  # attribute of the pipeline output to compare
    denoiser: str = "transformer"
    fast: bool = False  # also in the default (not -m slow) suite
    load: str = "device_map"  # how the tpu copy is made: reloaded with device_map="tpu", or .to("tpu")
    atol: float = 1e-4
    tags: tuple = field(default_factory=tuple)

    def inputs(self) -> dict:
        return {"generator": torch.Generator("cpu").manual_seed(0), **self.call()}


FAMILIES: dict[str, Family] = {}


def family(name: str, **kwargs):
    def register(fn):
        call = kwargs.pop("call")
        FAMILIES[name] = Family(name=name, build=fn, call=call, **kwargs)
        return fn

    return register


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        pipe = fn()
        pipe.set_progress_bar_config(disable=True)
        return pipe

    return build


# ---- UNet families -------------------------------------------------------------------------------


def sd_unet(in_channels: int = 4, cross: int = 32, **kwargs):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8,
        in_channels=in_channels,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=cross,
        attention_head_dim=8,
        norm_num_groups=8,
        **kwargs,
    ).eval()


def _sd_components(scheduler, in_channels: int = 4):
    return dict(
        vae=vae_kl(),
        text_encoder=clip_text(),
        tokenizer=tokenizer(),
        unet=sd_unet(in_channels),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _ddim():
    from diffusers import DDIMScheduler

    return DDIMScheduler(num_train_timesteps=100, clip_sample=False, steps_offset=1)


def _sd_call(**extra):
    return lambda: dict(
        prompt=PROMPT,
        num_inference_steps=2,
        guidance_scale=7.5,
        height=16,
        width=16,
        output_type="np",
        **extra,
    )


@family("sd", call=_sd_call(), denoiser="unet", fast=True, tags=("ddim",))
@_seeded
def _sd():
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline(**_sd_components(_ddim()))


@family("sd_dpmsolver++", call=_sd_call(), denoiser="unet", load="to", tags=("dpm-solver++",))
@_seeded
def _sd_dpm():
    from diffusers import DPMSolverMultistepScheduler, StableDiffusionPipeline

    scheduler = DPMSolverMultistepScheduler(num_train_timesteps=100, algorithm_type="dpmsolver++")
    return StableDiffusionPipeline(**_sd_components(scheduler))


@family("sd_img2img", call=_sd_call(image=image(), strength=0.75), denoiser="unet", load="to")
@_seeded
def _sd_img2img():
    from diffusers import StableDiffusionImg2ImgPipeline

    return StableDiffusionImg2ImgPipeline(**_sd_components(_ddim()))


@family("sd_inpaint", call=_sd_call(image=image(), mask_image=mask()), denoiser="unet")
@_seeded
def _sd_inpaint():
    from diffusers import StableDiffusionInpaintPipeline

    return StableDiffusionInpaintPipeline(**_sd_components(_ddim(), in_channels=9))


@family("sd2_vpred", call=_sd_call(), denoiser="unet", load="to")
@_seeded
def _sd2():
    """SD 2.x: v-prediction, linear-projection transformer blocks, an OpenCLIP-style penultimate layer."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    components = _sd_components(
        DDIMScheduler(num_train_timesteps=100, clip_sample=False, prediction_type="v_prediction")
    )
    components["unet"] = sd_unet(use_linear_projection=True)
    return StableDiffusionPipeline(**components)


@family(
    "controlnet_sd",
    call=_sd_call(image=image()),
    denoiser="unet",
    tags=("controlnet",),
)
@_seeded
def _controlnet_sd():
    from diffusers import ControlNetModel, StableDiffusionControlNetPipeline

    components = _sd_components(_ddim())
    controlnet = ControlNetModel(
        block_out_channels=(16, 32),
        layers_per_block=1,
        in_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
        conditioning_embedding_out_channels=(8, 16),
    ).eval()
    return StableDiffusionControlNetPipeline(controlnet=controlnet, image_encoder=None, **components)


def sdxl_unet(in_channels: int = 4, text_embeds: int = 64, refiner: bool = False):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8,
        in_channels=in_channels,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=(5 if refiner else 6) * 8 + text_embeds,
        cross_attention_dim=32 if refiner else 64,
        norm_num_groups=8,
    ).eval()


def _sdxl_call(**extra):
    return lambda: dict(
        prompt=PROMPT,
        num_inference_steps=2,
        guidance_scale=5.0,
        height=16,
        width=16,
        output_type="np",
        **extra,
    )


@family("sdxl_euler", call=_sdxl_call(), denoiser="unet", fast=True, tags=("euler",))
@_seeded
def _sdxl():
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    return StableDiffusionXLPipeline(
        vae=vae_kl(),
        text_encoder=clip_text(),
        text_encoder_2=clip_text(projection=True),
        tokenizer=tokenizer(),
        tokenizer_2=tokenizer(),
        unet=sdxl_unet(text_embeds=32),
        scheduler=EulerDiscreteScheduler(num_train_timesteps=100, steps_offset=1),
    )


@family("sdxl_refiner_img2img", call=_sdxl_call(image=image(), strength=0.6), denoiser="unet", load="to")
@_seeded
def _sdxl_refiner():
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline

    return StableDiffusionXLImg2ImgPipeline(
        vae=vae_kl(),
        text_encoder=None,
        text_encoder_2=clip_text(projection=True),
        tokenizer=None,
        tokenizer_2=tokenizer(),
        unet=sdxl_unet(text_embeds=32, refiner=True),
        scheduler=EulerDiscreteScheduler(num_train_timesteps=100, steps_offset=1),
        requires_aesthetics_score=True,
    )


@family("kandinsky22_prior_decoder", call=lambda: {}, denoiser="unet", output="images")
@_seeded
def _kandinsky():
    return KandinskyPriorDecoder()


class KandinskyPriorDecoder:
    """Kandinsky 2.2: a prior pipeline (text -> CLIP image embedding) feeding a decoder pipeline (a
    UNet on image embeddings, MoVQ decoder). Two pipelines, called as users do, as one object."""

    def __init__(self, prior=None, decoder=None):
        if prior is None:
            prior, decoder = _kandinsky_parts()
        self.prior, self.decoder = prior, decoder

    def set_progress_bar_config(self, **kwargs):
        self.prior.set_progress_bar_config(**kwargs)
        self.decoder.set_progress_bar_config(**kwargs)

    def save_pretrained(self, path):
        self.prior.save_pretrained(f"{path}/prior")
        self.decoder.save_pretrained(f"{path}/decoder")

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        from diffusers import KandinskyV22Pipeline, KandinskyV22PriorPipeline

        prior = KandinskyV22PriorPipeline.from_pretrained(f"{path}/prior", **kwargs)
        decoder = KandinskyV22Pipeline.from_pretrained(f"{path}/decoder", **kwargs)
        pipe = cls(prior, decoder)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def to(self, device):
        self.prior.to(device)
        self.decoder.to(device)
        return self

    @property
    def components(self):
        return {**{f"prior_{k}": v for k, v in self.prior.components.items()}, **self.decoder.components}

    @property
    def unet(self):
        return self.decoder.unet

    def __call__(self, generator=None, **kwargs):
        embeds = self.prior(PROMPT, negative_prompt=NEGATIVE, generator=generator, num_inference_steps=2)
        return self.decoder(
            image_embeds=embeds.image_embeds,
            negative_image_embeds=embeds.negative_image_embeds,
            generator=generator,
            num_inference_steps=2,
            height=16,
            width=16,
            output_type="np",
            **kwargs,
        )


def _kandinsky_parts():
    from diffusers import (
        DDPMScheduler,
        KandinskyV22Pipeline,
        KandinskyV22PriorPipeline,
        PriorTransformer,
        UnCLIPScheduler,
        UNet2DConditionModel,
        VQModel,
    )
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    embed = 32
    prior = PriorTransformer(
        num_attention_heads=2,
        attention_head_dim=16,
        embedding_dim=embed,
        num_layers=1,
        num_embeddings=8,
    ).eval()
    image_encoder = CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=embed,
            image_size=16,
            projection_dim=embed,
            intermediate_size=37,
            num_attention_heads=4,
            num_channels=3,
            num_hidden_layers=2,
            patch_size=8,
        )
    ).eval()
    processor = CLIPImageProcessor(
        crop_size=16,
        do_center_crop=True,
        do_normalize=True,
        do_resize=True,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
        resample=3,
        size=16,
    )
    prior_pipe = KandinskyV22PriorPipeline(
        prior=prior,
        image_encoder=image_encoder,
        text_encoder=clip_text(hidden=embed, projection=True),
        tokenizer=tokenizer(),
        scheduler=UnCLIPScheduler(
            variance_type="fixed_small_log",
            prediction_type="sample",
            num_train_timesteps=100,
            clip_sample=True,
            clip_sample_range=10.0,
        ),
        image_processor=processor,
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=8,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
        up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
        mid_block_type="UNetMidBlock2DSimpleCrossAttn",
        encoder_hid_dim=embed,
        encoder_hid_dim_type="image_proj",
        addition_embed_type="image",
        attention_head_dim=8,
        resnet_time_scale_shift="scale_shift",
        class_embed_type=None,
        norm_num_groups=8,
    ).eval()
    movq = VQModel(
        block_out_channels=[32, 32],  # the decoder's SpatialNorm has 32 groups
        down_block_types=["DownEncoderBlock2D", "AttnDownEncoderBlock2D"],
        in_channels=3,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=32,
        norm_type="spatial",
        num_vq_embeddings=12,
        out_channels=3,
        up_block_types=["AttnUpDecoderBlock2D", "UpDecoderBlock2D"],
        vq_embed_dim=4,
    ).eval()
    decoder = KandinskyV22Pipeline(
        unet=unet,
        scheduler=DDPMScheduler(num_train_timesteps=100, clip_sample=False, prediction_type="epsilon"),
        movq=movq,
    )
    return prior_pipe, decoder


# ---- DiT families --------------------------------------------------------------------------------


def _flow_call(size: int = 16, **extra):
    return lambda: dict(
        prompt=PROMPT,
        num_inference_steps=2,
        height=size,
        width=size,
        output_type="np",
        **extra,
    )


def flux_transformer(in_channels: int = 4, out_channels: int | None = None):
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=in_channels,
        out_channels=out_channels,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    ).eval()


def flux_transformer_inputs() -> dict:
    """Inputs of `flux_transformer()`: 64 image and 8 text tokens (even splits over 2, 4 or 8 chips/ranks)."""
    g = torch.Generator().manual_seed(0)
    return dict(
        hidden_states=torch.randn(1, 64, 4, generator=g),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.tensor([0.5]),
        img_ids=torch.randn(64, 3, generator=g),
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )


def _flux_components(transformer=None, latent: int = 1):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return dict(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=clip_text(),
        text_encoder_2=t5_encoder(),
        tokenizer=tokenizer(),
        tokenizer_2=tokenizer(),
        transformer=transformer or flux_transformer(),
        vae=vae_kl(
            latent=latent,
            blocks=(8,),
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        ),
    )


@family("flux", call=_flow_call(guidance_scale=3.5, max_sequence_length=8), fast=True, tags=("flowmatch",))
@_seeded
def _flux():
    from diffusers import FluxPipeline

    return FluxPipeline(image_encoder=None, feature_extractor=None, **_flux_components())


@family(
    "flux_kontext",
    call=_flow_call(
        image=image(), guidance_scale=3.5, max_sequence_length=8, _auto_resize=False, max_area=256
    ),
    load="to",
)
@_seeded
def _flux_kontext():
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(image_encoder=None, feature_extractor=None, **_flux_components())


@family(
    "flux_fill", call=_flow_call(image=image(), mask_image=mask(), guidance_scale=30.0, max_sequence_length=8)
)
@_seeded
def _flux_fill():
    from diffusers import FluxFillPipeline

    # packed latents (1 channel x 2 x 2) + packed masked-image latents (4) + packed mask (4)
    components = _flux_components(flux_transformer(in_channels=4 + 4 + 4, out_channels=4))
    return FluxFillPipeline(**components)


@family(
    "controlnet_flux",
    call=_flow_call(control_image=image(), guidance_scale=3.5, max_sequence_length=8),
    tags=("controlnet",),
)
@_seeded
def _controlnet_flux():
    from diffusers import FluxControlNetModel, FluxControlNetPipeline

    controlnet = FluxControlNetModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    ).eval()
    return FluxControlNetPipeline(controlnet=controlnet, **_flux_components())


@family("sd3", call=_flow_call(guidance_scale=5.0, max_sequence_length=8), tags=("flowmatch",))
@_seeded
def _sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=1,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
    ).eval()
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=clip_text(projection=True),
        text_encoder_2=clip_text(projection=True),
        text_encoder_3=t5_encoder(),
        tokenizer=tokenizer(),
        tokenizer_2=tokenizer(),
        tokenizer_3=tokenizer(),
        transformer=transformer,
        vae=vae_kl(blocks=(8,), use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609),
        image_encoder=None,
        feature_extractor=None,
    )


@family("sd35", call=_flow_call(guidance_scale=5.0, max_sequence_length=8), load="to")
@_seeded
def _sd35():
    """SD 3.5: dual attention layers and qk RMS norm in the MMDiT."""
    from diffusers import SD3Transformer2DModel

    pipe = FAMILIES["sd3"].build()
    pipe.transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=1,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
        qk_norm="rms_norm",
        dual_attention_layers=(0,),
    ).eval()
    return pipe


def _t5_pipeline_call(**extra):
    return _flow_call(max_sequence_length=8, **extra)


@family("pixart_alpha", call=_t5_pipeline_call(guidance_scale=4.5, use_resolution_binning=False))
@_seeded
def _pixart_alpha():
    from diffusers import DDIMScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel

    transformer = PixArtTransformer2DModel(
        sample_size=8,
        num_layers=2,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=3,
        caption_channels=32,
        in_channels=4,
        cross_attention_dim=24,
        out_channels=8,
        attention_bias=True,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_single",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    ).eval()
    return PixArtAlphaPipeline(
        transformer=transformer,
        vae=vae_kl(),
        scheduler=DDIMScheduler(num_train_timesteps=100),
        text_encoder=t5_encoder(),
        tokenizer=tokenizer(),
    )


@family("pixart_sigma", call=_t5_pipeline_call(guidance_scale=4.5, use_resolution_binning=False), load="to")
@_seeded
def _pixart_sigma():
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline

    alpha = FAMILIES["pixart_alpha"].build()
    return PixArtSigmaPipeline(
        transformer=alpha.transformer,
        vae=alpha.vae,
        scheduler=DPMSolverMultistepScheduler(num_train_timesteps=100),
        text_encoder=alpha.text_encoder,
        tokenizer=alpha.tokenizer,
    )


@family(
    "sana",
    call=_flow_call(
        size=32,
        guidance_scale=4.5,
        max_sequence_length=8,
        use_resolution_binning=False,
        complex_human_instruction=None,
    ),
)
@_seeded
def _sana():
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel

    transformer = SanaTransformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        num_attention_heads=2,
        attention_head_dim=4,
        num_cross_attention_heads=2,
        cross_attention_head_dim=4,
        cross_attention_dim=8,
        caption_channels=32,
        sample_size=8,
    ).eval()
    vae = AutoencoderDC(
        in_channels=3,
        latent_channels=4,
        attention_head_dim=2,
        encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8),
        encoder_qkv_multiscales=((), (5,)),
        decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1),
        decoder_layers_per_block=[1, 1],
        downsample_block_type="conv",
        upsample_block_type="interpolate",
        decoder_norm_types="rms_norm",
        decoder_act_fns="silu",
        scaling_factor=0.41407,
    ).eval()
    return SanaPipeline(
        tokenizer=tokenizer(padding_side="right"),
        text_encoder=gemma2(),
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


@family("auraflow", call=_t5_pipeline_call(guidance_scale=3.5), load="to")
@_seeded
def _auraflow():
    from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel, FlowMatchEulerDiscreteScheduler

    transformer = AuraFlowTransformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_mmdit_layers=1,
        num_single_dit_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        out_channels=4,
        pos_embed_max_size=64,
    ).eval()
    return AuraFlowPipeline(
        tokenizer=tokenizer(),
        text_encoder=t5_encoder(umt5=True),
        vae=vae_kl(),
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )


@family(
    "hunyuandit",
    call=lambda: dict(
        prompt=PROMPT,
        num_inference_steps=2,
        height=16,
        width=16,
        guidance_scale=5.0,
        output_type="np",
        use_resolution_binning=False,
    ),
)
@_seeded
def _hunyuandit():
    from diffusers import DDPMScheduler, HunyuanDiT2DModel, HunyuanDiTPipeline

    transformer = HunyuanDiT2DModel(
        sample_size=8,
        num_layers=2,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=3,
        in_channels=4,
        cross_attention_dim=32,
        cross_attention_dim_t5=32,
        pooled_projection_dim=16,
        hidden_size=24,  # attention heads x head dim
        activation_fn="gelu-approximate",
        text_len=77,  # the pipeline's fixed prompt lengths
        text_len_t5=256,
    ).eval()
    return HunyuanDiTPipeline(
        vae=vae_kl(),
        text_encoder=bert(),
        tokenizer=tokenizer(),
        transformer=transformer,
        scheduler=DDPMScheduler(num_train_timesteps=100),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
        text_encoder_2=t5_encoder(),
        tokenizer_2=tokenizer(),
    )


# ---- video and audio -----------------------------------------------------------------------------


def _video_call(frames: int = 5, size: int = 16, **extra):
    return lambda: dict(
        prompt=PROMPT,
        num_inference_steps=2,
        height=size,
        width=size,
        num_frames=frames,
        output_type="np",
        max_sequence_length=8,
        **extra,
    )


@family("cogvideox", call=_video_call(guidance_scale=6.0), output="frames")
@_seeded
def _cogvideox():
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=4,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        time_embed_dim=2,
        text_embed_dim=32,
        num_layers=1,
        sample_width=2,
        sample_height=2,
        sample_frames=9,
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=8,
    ).eval()
    vae = AutoencoderKLCogVideoX(
        in_channels=3,
        out_channels=3,
        down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=2,
        temporal_compression_ratio=4,
    ).eval()
    return CogVideoXPipeline(
        tokenizer=tokenizer(),
        text_encoder=t5_encoder(),
        vae=vae,
        transformer=transformer,
        scheduler=CogVideoXDDIMScheduler(),
    )


def _wan_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=3,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.05, 0.0],
        latents_std=[1.5, 2.0, 1.2, 1.8],
    ).eval()


def _wan_transformer(**kwargs):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=kwargs.pop("in_channels", 4),
        out_channels=4,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        **kwargs,
    ).eval()


@family("wan_t2v", call=_video_call(guidance_scale=5.0), output="frames")
@_seeded
def _wan():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    return WanPipeline(
        transformer=_wan_transformer(),
        vae=_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=t5_encoder(umt5=True),
        tokenizer=tokenizer(),
    )


@family("wan_i2v", call=_video_call(guidance_scale=5.0, image=image()), output="frames", load="to")
@_seeded
def _wan_i2v():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    image_encoder = CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=4,
            projection_dim=4,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            intermediate_size=16,
            patch_size=1,
        )
    ).eval()
    return WanImageToVideoPipeline(
        transformer=_wan_transformer(in_channels=4 + 4 + 4, image_dim=4),
        vae=_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=t5_encoder(umt5=True),
        tokenizer=tokenizer(),
        image_encoder=image_encoder,
        image_processor=CLIPImageProcessor(crop_size=32, size=32),
    )


@family(
    "ltx_video",
    call=_video_call(frames=9, size=32, guidance_scale=3.0, decode_timestep=0.05, decode_noise_scale=0.025),
    output="frames",
)
@_seeded
def _ltx():
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    transformer = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=1,
        caption_channels=32,
    ).eval()
    vae = AutoencoderKLLTXVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=8,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False),
        upsample_residual=(False, False, False, False),
        upsample_factor=(1, 1, 1, 1),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    ).eval()
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    return LTXPipeline(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=t5_encoder(),
        tokenizer=tokenizer(),
    )


@family(
    "hunyuan_video",
    call=_video_call(guidance_scale=4.5, prompt_template={"template": "{}", "crop_start": 0}),
    output="frames",
)
@_seeded
def _hunyuan_video():
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )

    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=32,
        pooled_projection_dim=32,
        rope_axes_dim=(2, 4, 4),
    ).eval()
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        act_fn="silu",
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        mid_block_add_attention=True,
    ).eval()
    return HunyuanVideoPipeline(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=llama(),
        tokenizer=tokenizer(max_length=16),
        text_encoder_2=clip_text(positions=77),  # the pipeline pads its CLIP prompt to 77 tokens
        tokenizer_2=tokenizer(),
    )


@family(
    "stable_audio",
    call=lambda: dict(prompt=PROMPT, num_inference_steps=2, guidance_scale=7.0, output_type="np"),
    output="audios",
)
@_seeded
def _stable_audio():
    from diffusers import (
        AutoencoderOobleck,
        EDMDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
        StableAudioProjectionModel,
    )

    transformer = StableAudioDiTModel(
        sample_size=4,
        in_channels=3,
        num_layers=2,
        attention_head_dim=4,
        num_key_value_attention_heads=2,
        out_channels=3,
        cross_attention_dim=4,
        time_proj_dim=8,
        global_states_input_dim=8,
        cross_attention_input_dim=4,
    ).eval()
    vae = AutoencoderOobleck(
        encoder_hidden_size=6,
        downsampling_ratios=[1, 2],
        decoder_channels=3,
        decoder_input_channels=3,
        audio_channels=2,
        channel_multiples=[2, 4],
        sampling_rate=4,
    ).eval()
    projection = StableAudioProjectionModel(
        text_encoder_dim=32, conditioning_dim=4, min_value=0, max_value=32
    ).eval()
    return StableAudioPipeline(
        transformer=transformer,
        # the Hub checkpoints use CosineDPMSolverMultistepScheduler, which needs torchsde: its EDM sibling
        scheduler=EDMDPMSolverMultistepScheduler(
            solver_order=2, prediction_type="v_prediction", sigma_data=1.0, sigma_schedule="exponential"
        ),
        vae=vae,
        text_encoder=t5_encoder(),
        tokenizer=tokenizer(),
        projection_model=projection,
    )


def output_of(family: Family, result) -> np.ndarray:
    """The compared array of a pipeline output (images, video frames or audio), as float32 numpy."""
    value = getattr(result, family.output)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)

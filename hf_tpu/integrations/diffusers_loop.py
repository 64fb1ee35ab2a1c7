"""Whole-loop generation (`hf_tpu.compile_pipeline(pipe, loop=True)`): the denoising loop as one program.

A pipeline's own `__call__` runs the denoiser once per step from Python, with the scheduler's update and
classifier-free guidance as eager ops in between. For a fixed-step schedule every step's scalars (the
timestep, the sigma or alpha increments) are known before the loop starts, so the loop is a scan over
them: `torch._higher_order_ops.scan` of (denoiser + guidance + scheduler update), compiled with the `tpu`
backend, which lowers it to one `lax.scan`. Prompt encoding, latent preparation and VAE decoding stay the
pipeline's own code (so the result equals the step-by-step pipeline's).

Supported: Flux-style flow matching (`FluxPipeline` + `FlowMatchEulerDiscreteScheduler`) and Stable
Diffusion with DDIM (`StableDiffusionPipeline` + `DDIMScheduler`, eta 0). A call this mode does not cover
(callbacks, IP-adapters, true CFG, another scheduler, eta > 0, guidance rescale...) runs the pipeline's own
step-by-step loop, as without `loop=True`.
"""

from __future__ import annotations

import inspect
import logging

import numpy as np
import torch

log = logging.getLogger("hf_tpu.diffusers")


def _scan(body, init, xs):
    from torch._higher_order_ops.scan import scan

    return scan(body, init, xs)


class _Looped:
    """Mixin put in front of the pipeline's class: `__call__` takes the whole-loop route when it can."""

    _hf_tpu_loop_runner = None

    def __call__(self, *args, **kwargs):
        runner = type(self)._hf_tpu_loop_runner
        bound = _bind(type(self).__mro__[2].__call__, self, args, kwargs)
        why = runner.unsupported(self, bound)
        if why is not None:
            log.debug("hf_tpu loop=True: %s; running the step-by-step loop", why)
            return super().__call__(*args, **kwargs)
        with torch.no_grad():  # as the pipelines' own __call__
            return runner.run(self, bound)


def _bind(call, pipe, args, kwargs) -> dict:
    signature = inspect.signature(call)
    bound = signature.bind(pipe, *args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    values.pop("self", None)
    values.update(values.pop("kwargs", {}) or {})
    return values


def _only_defaults(bound: dict, names: dict) -> str | None:
    for name, default in names.items():
        if name in bound and bound[name] is not default and bound[name] != default:
            return f"{name}={bound[name]!r} is not covered by the whole-loop mode"
    return None


class FluxLoop:
    """FluxPipeline with FlowMatchEulerDiscreteScheduler: prev = sample + (sigma_next - sigma) * velocity."""

    unsupported_args = {
        "negative_prompt": None,
        "true_cfg_scale": 1.0,
        "ip_adapter_image": None,
        "ip_adapter_image_embeds": None,
        "negative_ip_adapter_image": None,
        "negative_ip_adapter_image_embeds": None,
        "timesteps": None,
        "callback_on_step_end": None,
    }

    def unsupported(self, pipe, bound: dict) -> str | None:
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = pipe.scheduler
        if type(scheduler) is not FlowMatchEulerDiscreteScheduler:
            return f"scheduler {type(scheduler).__name__}"
        config = scheduler.config
        if (
            config.get("stochastic_sampling")
            or config.get("invert_sigmas")
            or config.get("use_karras_sigmas")
        ):
            return "a stochastic, inverted or Karras flow-matching schedule"
        if config.get("use_exponential_sigmas") or config.get("use_beta_sigmas"):
            return "exponential/beta sigmas"
        return _only_defaults(bound, self.unsupported_args)

    def run(self, pipe, a: dict):
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
        from diffusers.pipelines.flux.pipeline_output import FluxPipelineOutput

        height = a["height"] or pipe.default_sample_size * pipe.vae_scale_factor
        width = a["width"] or pipe.default_sample_size * pipe.vae_scale_factor
        pipe.check_inputs(
            a["prompt"],
            a["prompt_2"],
            height,
            width,
            prompt_embeds=a["prompt_embeds"],
            pooled_prompt_embeds=a["pooled_prompt_embeds"],
            max_sequence_length=a["max_sequence_length"],
        )
        pipe._guidance_scale = a["guidance_scale"]
        pipe._joint_attention_kwargs = a["joint_attention_kwargs"]
        pipe._current_timestep = None
        pipe._interrupt = False
        prompt = a["prompt"]
        if prompt is not None and isinstance(prompt, str):
            batch_size = 1
        elif prompt is not None:
            batch_size = len(prompt)
        else:
            batch_size = a["prompt_embeds"].shape[0]
        device = pipe._execution_device
        lora_scale = (a["joint_attention_kwargs"] or {}).get("scale")
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=prompt,
            prompt_2=a["prompt_2"],
            prompt_embeds=a["prompt_embeds"],
            pooled_prompt_embeds=a["pooled_prompt_embeds"],
            device=device,
            num_images_per_prompt=a["num_images_per_prompt"],
            max_sequence_length=a["max_sequence_length"],
            lora_scale=lora_scale,
        )
        channels = pipe.transformer.config.in_channels // 4
        latents, image_ids = pipe.prepare_latents(
            batch_size * a["num_images_per_prompt"],
            channels,
            height,
            width,
            prompt_embeds.dtype,
            device,
            a["generator"],
            a["latents"],
        )
        steps = a["num_inference_steps"]
        sigmas = np.linspace(1.0, 1 / steps, steps) if a["sigmas"] is None else a["sigmas"]
        if hasattr(pipe.scheduler.config, "use_flow_sigmas") and pipe.scheduler.config.use_flow_sigmas:
            sigmas = None
        config = pipe.scheduler.config
        mu = calculate_shift(
            latents.shape[1],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        timesteps, steps = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        pipe._num_timesteps = len(timesteps)
        guidance = None
        if pipe.transformer.config.guidance_embeds:
            guidance = torch.full([1], a["guidance_scale"], device=device, dtype=torch.float32)
            guidance = guidance.expand(latents.shape[0])
        if pipe.transformer.is_cache_enabled if hasattr(pipe.transformer, "is_cache_enabled") else False:
            raise ValueError("hf_tpu loop=True: a transformer cache context is not supported")
        sig = pipe.scheduler.sigmas.to(device=latents.device, dtype=torch.float32)
        xs = torch.stack([timesteps.to(torch.float32), sig[1:] - sig[:-1]], dim=1)
        program = _program(pipe, "flux")
        latents = program(latents, xs, guidance, pooled, prompt_embeds, text_ids, image_ids)
        pipe.scheduler._step_index = len(timesteps)
        output_type = a["output_type"]
        if output_type == "latent":
            image = latents
        else:
            latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor)
            latents = (latents / pipe.vae.config.scaling_factor) + pipe.vae.config.shift_factor
            image = pipe.vae.decode(latents, return_dict=False)[0]
            image = pipe.image_processor.postprocess(image, output_type=output_type)
        pipe.maybe_free_model_hooks()
        if not a["return_dict"]:
            return (image,)
        return FluxPipelineOutput(images=image)

    @staticmethod
    def build(pipe):
        transformer = pipe.transformer

        def loop(latents, xs, guidance, pooled, prompt_embeds, text_ids, image_ids):
            def body(sample, x):
                timestep = x[0].expand(sample.shape[0]).to(sample.dtype)
                velocity = transformer(
                    hidden_states=sample,
                    timestep=timestep / 1000,
                    guidance=guidance,
                    pooled_projections=pooled,
                    encoder_hidden_states=prompt_embeds,
                    txt_ids=text_ids,
                    img_ids=image_ids,
                    return_dict=False,
                )[0]
                prev = (sample.to(torch.float32) + x[1] * velocity).to(velocity.dtype)
                return prev, prev.new_zeros(())

            final, _ = _scan(body, latents, xs)
            return final

        return loop


class DDIMLoop:
    """StableDiffusionPipeline with DDIMScheduler (eta 0), classifier-free guidance inside the loop."""

    unsupported_args = {
        "eta": 0.0,
        "guidance_rescale": 0.0,
        "ip_adapter_image": None,
        "ip_adapter_image_embeds": None,
        "timesteps": None,
        "sigmas": None,
        "callback_on_step_end": None,
        "cross_attention_kwargs": None,
    }

    def unsupported(self, pipe, bound: dict) -> str | None:
        from diffusers import DDIMScheduler

        scheduler = pipe.scheduler
        if type(scheduler) is not DDIMScheduler:
            return f"scheduler {type(scheduler).__name__}"
        config = scheduler.config
        if config.clip_sample or config.thresholding or config.prediction_type != "epsilon":
            return "DDIM with clipping, thresholding or a prediction type other than epsilon"
        if pipe.unet.config.time_cond_proj_dim is not None:
            return "a guidance-embedding UNet (LCM)"
        return _only_defaults(bound, self.unsupported_args)

    def run(self, pipe, a: dict):
        from diffusers.pipelines.stable_diffusion.pipeline_output import StableDiffusionPipelineOutput

        height = a["height"] or pipe.unet.config.sample_size * pipe.vae_scale_factor
        width = a["width"] or pipe.unet.config.sample_size * pipe.vae_scale_factor
        pipe.check_inputs(
            a["prompt"],
            height,
            width,
            None,
            a["negative_prompt"],
            a["prompt_embeds"],
            a["negative_prompt_embeds"],
        )
        pipe._guidance_scale = a["guidance_scale"]
        pipe._guidance_rescale = 0.0
        pipe._clip_skip = a["clip_skip"]
        pipe._cross_attention_kwargs = None
        pipe._interrupt = False
        prompt = a["prompt"]
        if prompt is not None and isinstance(prompt, str):
            batch_size = 1
        elif prompt is not None:
            batch_size = len(prompt)
        else:
            batch_size = a["prompt_embeds"].shape[0]
        device = pipe._execution_device
        cfg = pipe.do_classifier_free_guidance
        prompt_embeds, negative = pipe.encode_prompt(
            prompt,
            device,
            a["num_images_per_prompt"],
            cfg,
            a["negative_prompt"],
            prompt_embeds=a["prompt_embeds"],
            negative_prompt_embeds=a["negative_prompt_embeds"],
            clip_skip=a["clip_skip"],
        )
        if cfg:
            prompt_embeds = torch.cat([negative, prompt_embeds])
        scheduler = pipe.scheduler
        scheduler.set_timesteps(a["num_inference_steps"], device=device)
        timesteps = scheduler.timesteps
        latents = pipe.prepare_latents(
            batch_size * a["num_images_per_prompt"],
            pipe.unet.config.in_channels,
            height,
            width,
            prompt_embeds.dtype,
            device,
            a["generator"],
            a["latents"],
        )
        pipe._num_timesteps = len(timesteps)
        # the DDIM update's scalars per step, in the order DDIMScheduler.step computes them
        ratio = scheduler.config.num_train_timesteps // scheduler.num_inference_steps
        alphas = scheduler.alphas_cumprod.to(torch.float32)
        rows = []
        for t in timesteps.cpu().tolist():
            prev = t - ratio
            a_t = alphas[t]
            a_prev = alphas[prev] if prev >= 0 else scheduler.final_alpha_cumprod.to(torch.float32)
            rows.append(torch.stack([torch.tensor(float(t)), a_t, a_prev]))
        xs = torch.stack(rows).to(device)
        program = _program(pipe, "ddim", guidance_scale=float(a["guidance_scale"]), cfg=cfg)
        latents = program(latents, xs, prompt_embeds)
        output_type = a["output_type"]
        if output_type == "latent":
            image, nsfw = latents, None
        else:
            image = pipe.vae.decode(
                latents / pipe.vae.config.scaling_factor, return_dict=False, generator=a["generator"]
            )[0]
            image, nsfw = pipe.run_safety_checker(image, device, prompt_embeds.dtype)
            denormalize = [True] * image.shape[0] if nsfw is None else [not x for x in nsfw]
            image = pipe.image_processor.postprocess(
                image, output_type=output_type, do_denormalize=denormalize
            )
        pipe.maybe_free_model_hooks()
        if not a["return_dict"]:
            return (image, nsfw)
        return StableDiffusionPipelineOutput(images=image, nsfw_content_detected=nsfw)

    @staticmethod
    def build(pipe, guidance_scale: float, cfg: bool):
        unet = pipe.unet

        def loop(latents, xs, prompt_embeds):
            def body(sample, x):
                t, alpha_t, alpha_prev = x[0], x[1], x[2]
                model_input = torch.cat([sample] * 2) if cfg else sample
                eps = unet(model_input, t, encoder_hidden_states=prompt_embeds, return_dict=False)[0]
                if cfg:
                    uncond, text = eps.chunk(2)
                    eps = uncond + guidance_scale * (text - uncond)
                beta_t = 1 - alpha_t
                x0 = (sample - beta_t ** (0.5) * eps) / alpha_t ** (0.5)
                direction = (1 - alpha_prev) ** (0.5) * eps
                prev = alpha_prev ** (0.5) * x0 + direction
                return prev, prev.new_zeros(())

            final, _ = _scan(body, latents, xs)
            return final

        return loop


_RUNNERS = {"FluxPipeline": FluxLoop, "StableDiffusionPipeline": DDIMLoop}


def _program(pipe, kind: str, **static):
    """The compiled whole-loop function for this pipeline (one per static setting; Dynamo caches the
    graph per input shapes, so a second generation at the same size compiles nothing)."""
    cache = pipe.__dict__.setdefault("_hf_tpu_loop_programs", {})
    key = (kind, tuple(sorted(static.items())))
    if key not in cache:
        runner = type(pipe)._hf_tpu_loop_runner
        fn = runner.build(pipe, **static)
        cache[key] = torch.compile(fn, backend=pipe._hf_tpu_loop_backend, fullgraph=True)
    return cache[key]


def enable_loop(pipe, backend: str = "tpu"):
    """Give `pipe` the whole-loop `__call__` (its class becomes a subclass of its own class, same name)."""
    base = type(pipe)
    if issubclass(base, _Looped):
        pipe._hf_tpu_loop_backend = backend
        return pipe
    runner = next((r for cls in base.__mro__ for name, r in _RUNNERS.items() if cls.__name__ == name), None)
    if runner is None:
        supported = ", ".join(_RUNNERS)
        raise ValueError(
            f"hf_tpu.compile_pipeline(loop=True): no whole-loop mode for {base.__name__} (supported: "
            f"{supported}); compile it without loop=True"
        )
    looped = type(base.__name__, (_Looped, base), {"_hf_tpu_loop_runner": runner()})
    looped.__module__ = base.__module__
    looped.__qualname__ = base.__qualname__
    pipe.__class__ = looped
    pipe._hf_tpu_loop_backend = backend
    return pipe

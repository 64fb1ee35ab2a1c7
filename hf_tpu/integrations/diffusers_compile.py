"""`hf_tpu.compile_pipeline(pipe)`: compile a diffusers pipeline's denoisers, text encoders and VAE decoder.

Each component is compiled in place with `nn.Module.compile` (the module stays the object the pipeline
holds, so `pipe.transformer.config`, hooks and LoRA loading keep working), with TorchDynamo's default
static shapes: the first generation at a resolution compiles each component once, and every later
denoising step and every later generation at that resolution runs the same executables. `loop=True` also
runs the denoising loop of supported pipelines as one program (`diffusers_loop.py`).

Video VAEs (Wan, CogVideoX, LTX, HunyuanVideo) decode frame chunks through Python-side feature caches,
so compiling their decoder would recompile per chunk: they stay eager unless `vae=True` forces it.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("hf_tpu.diffusers")

# VAE classes whose `decoder` is one stateless module call per decode
_IMAGE_VAES = ("AutoencoderKL", "AutoencoderDC", "VQModel", "AutoencoderTiny", "AutoencoderOobleck")
_VAE_NAMES = ("vae", "movq", "vqvae", "vqgan", "vocoder")


def _modules(pipe) -> dict[str, torch.nn.Module]:
    components = getattr(pipe, "components", None)
    if components is None:
        raise TypeError(
            f"hf_tpu.compile_pipeline expects a diffusers pipeline (with .components), got {type(pipe).__name__}"
        )
    return {k: v for k, v in components.items() if isinstance(v, torch.nn.Module)}


def _is_text_encoder(name: str, module: torch.nn.Module) -> bool:
    return "encoder" in name and not _is_vae(name, module)


def _is_vae(name: str, module: torch.nn.Module) -> bool:
    return name in _VAE_NAMES or type(module).__name__.startswith(("Autoencoder", "VQModel"))


def _devices(module: torch.nn.Module) -> set[str]:
    return {t.device.type for t in (*module.parameters(), *module.buffers())}


def _offloaded(module: torch.nn.Module) -> bool:
    """accelerate/diffusers offload hooks move the module at call time: its device now says nothing."""
    return any(hasattr(m, "_hf_hook") or hasattr(m, "_diffusers_hook") for m in module.modules())


def check_on_tpu(pipe, modules: dict[str, torch.nn.Module]) -> None:
    """A compile for tpu of a component left on another device would trace a CPU graph (run by inductor,
    not hf_tpu): refuse before compiling anything, naming the component and what to do."""
    wrong = {}
    for name, module in modules.items():
        devices = _devices(module)
        if devices and devices != {"tpu"} and not _offloaded(module):
            wrong[name] = sorted(devices)
    if wrong:
        listed = ", ".join(f"pipe.{k} on {'+'.join(v)}" for k, v in wrong.items())
        raise ValueError(
            f"hf_tpu.compile_pipeline: {listed}; move the pipeline first (pipe.to('tpu'), "
            "from_pretrained(..., device_map='tpu') or enable_model_cpu_offload(device='tpu')). Nothing was compiled."
        )


def compile_pipeline(
    pipe,
    *,
    backend: str = "tpu",
    fullgraph: bool = False,
    dynamic: bool | None = False,
    mode: str | None = None,
    options: dict | None = None,
    text_encoders: bool = True,
    vae: bool | str = "auto",
    loop: bool = False,
):
    """Compile `pipe`'s denoisers (UNet/transformer/prior/controlnet), text encoders and VAE decoder.

    Returns `pipe` (compiled in place). `dynamic=False` (default): one executable per resolution, so a
    second generation at the same size compiles nothing. `vae="auto"` compiles image VAEs' decoders and
    leaves video VAEs (chunked decoding with Python caches) eager. `loop=True` runs the denoising loop of
    supported pipelines (flow matching: Flux; DDIM: Stable Diffusion) as one program on top.
    """
    modules = _modules(pipe)
    check_on_tpu(pipe, modules)
    kwargs = {"backend": backend, "fullgraph": fullgraph, "dynamic": dynamic}
    if mode is not None:
        kwargs["mode"] = mode
    if options is not None:
        kwargs["options"] = options
    compiled = []
    for name, module in modules.items():
        if _is_vae(name, module):
            decoder = getattr(module, "decoder", None)
            wanted = vae is True or (vae == "auto" and type(module).__name__ in _IMAGE_VAES)
            if wanted and isinstance(decoder, torch.nn.Module):
                decoder.compile(**kwargs)
                compiled.append(f"{name}.decoder")
            continue
        if _is_text_encoder(name, module) and not text_encoders:
            continue
        module.compile(**kwargs)
        compiled.append(name)
    log.debug("hf_tpu.compile_pipeline(%s): compiled %s", type(pipe).__name__, compiled)
    pipe._hf_tpu_compiled = tuple(compiled)
    if loop:
        from hf_tpu.integrations.diffusers_loop import enable_loop

        enable_loop(pipe, backend=backend)
    return pipe

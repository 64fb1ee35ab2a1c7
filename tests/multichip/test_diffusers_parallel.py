"""One diffusers generation over 8 chips in one process: weights placed while they load, data (CFG batch),
tensor and context (ring / Ulysses / both) parallel; each output equal to the CPU pipeline with the same
generator. And a training step with context parallel equal to the CPU one.

Tiny Flux (has `_tp_plan` and `_cp_plan`) and Stable Diffusion (UNet: `fsdp`) from
tests/integrations/diffusion_zoo.py, saved locally and reloaded with `device_map="tpu"`.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch

import hf_tpu
from hf_tpu.runtime.tensors.sharding import placed_on_mesh
from tests.integrations import diffusion_zoo as zoo

ATOL = 1e-4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (CPU reference output, checkpoint folder)."""
    out = {}
    for name in ("flux", "sd"):
        family = zoo.FAMILIES[name]
        pipe = family.build()
        path = tmp_path_factory.mktemp(name)
        pipe.save_pretrained(path)
        out[name] = (zoo.output_of(family, pipe(**family.inputs())), path)
    return out


def _load(saved, name: str):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(saved[name][1], device_map="tpu")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run_matches_cpu(saved, name: str, pipe) -> None:
    family = zoo.FAMILIES[name]
    got = zoo.output_of(family, pipe(**family.inputs()))
    np.testing.assert_allclose(got, saved[name][0], atol=ATOL, rtol=0)


def _ways(t: torch.Tensor) -> int:
    sizes = dict(hf_tpu.mesh().shape)
    entries = [e for e in hf_tpu.sharding(t) if e is not None]
    return math.prod(sizes[n] for e in entries for n in ((e,) if isinstance(e, str) else e))


def _share(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes each chip holds of `model`'s tensors by their placement, bytes of the whole model)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    share = sum(t.numel() * t.element_size() // _ways(t) for t in tensors)
    return share, sum(t.numel() * t.element_size() for t in tensors)


def _record_inputs(module: torch.nn.Module, seen: list):
    """Record the placement of `module`'s first tensor input at each call (after the parallel hooks); returns
    the hook's handle (removed before compiling: it would break the graph)."""

    def hook(mod, args, kwargs):
        first = kwargs.get("hidden_states", kwargs.get("sample", args[0] if args else None))
        seen.append(hf_tpu.sharding(first))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def test_flux_transformer_loads_split_by_its_tp_plan_and_saves_full_tensors(saved, tmp_path):
    from diffusers import FluxTransformer2DModel

    gc.collect()
    before = torch.tpu.memory_allocated_per_chip()
    model = FluxTransformer2DModel.from_pretrained(saved["flux"][1] / "transformer", device_map="tpu")
    after = torch.tpu.memory_allocated_per_chip()
    block = model.transformer_blocks[0]
    assert hf_tpu.sharding(block.attn.to_q.weight) == ("model", None)  # colwise
    assert hf_tpu.sharding(block.attn.to_out[0].weight) == (None, "model")  # rowwise
    assert hf_tpu.sharding(block.attn.to_out[0].bias) == (None,)  # rowwise bias: added after the reduction
    # PackedRowwiseParallel(): the fused attention+MLP output projection, split by its input features
    assert hf_tpu.sharding(model.single_transformer_blocks[0].proj_out.weight) == (None, "model")
    assert hf_tpu.sharding(block.norm1.linear.weight) == (None, None)  # AdaLN modulation: not in the plan
    assert all(placed_on_mesh(t) for t in [*model.parameters(), *model.buffers()])
    share, total = _share(model)
    assert [a - b for a, b in zip(after, before)] == [share] * 8
    planned = sum(p.numel() * p.element_size() for p in model.parameters() if _ways(p) == 8)
    assert planned > 0.5 * total and share < 0.6 * total, (planned, share, total)
    model.save_pretrained(tmp_path)
    reloaded = FluxTransformer2DModel.from_pretrained(tmp_path).state_dict()
    for name, tensor in (
        FluxTransformer2DModel.from_pretrained(saved["flux"][1] / "transformer").state_dict().items()
    ):
        assert torch.equal(reloaded[name], tensor), name


def test_flux_pipeline_device_map_tp_equals_cpu(saved):
    """(Compiled with these weights: the context-parallel tests below.)"""
    pipe = _load(saved, "flux")
    assert hf_tpu.sharding(pipe.transformer.transformer_blocks[0].ff.net[2].weight) == (None, "model")
    _run_matches_cpu(saved, "flux", pipe)


def test_sd_unet_loads_split_by_fsdp_and_equals_cpu(saved):
    pipe = _load(saved, "sd")
    share, total = _share(pipe.unet)
    assert share < 0.5 * total, (share, total)
    assert all(placed_on_mesh(t) for t in pipe.unet.parameters())
    _run_matches_cpu(saved, "sd", pipe)


def test_sd_data_parallel_cfg_batch_on_a_2d_mesh_eager_and_compiled(saved):
    family = zoo.FAMILIES["sd"]
    with hf_tpu.use_mesh((2, 4), ("data", "model")):
        pipe = family.build().to("tpu")  # the `.to("tpu")` route: parallelize_pipeline places the weights
        hf_tpu.parallelize_pipeline(pipe, data="data")
        share, total = _share(pipe.unet)
        assert share < 0.5 * total, (share, total)  # fsdp over both axes
        seen: list = []
        recording = _record_inputs(pipe.unet, seen)
        _run_matches_cpu(saved, "sd", pipe)
        # CFG's doubled batch (2) split over "data": each step's UNet input
        assert seen and all(spec[0] == "data" for spec in seen), seen
        recording.remove()
        pipe.unet.compile(backend="tpu")
        _run_matches_cpu(saved, "sd", pipe)


def test_flux_context_parallel_ring_eager_and_defer_and_fuse(saved):
    pipe = _load(saved, "flux")
    hf_tpu.parallelize_pipeline(pipe, context="model")
    seen: list = []
    recording = _record_inputs(pipe.transformer.transformer_blocks[0], seen)
    _run_matches_cpu(saved, "flux", pipe)
    assert seen and all(spec == (None, "model", None) for spec in seen), seen  # the sequence split 8 ways
    recording.remove()
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _run_matches_cpu(saved, "flux", pipe)


@pytest.mark.slow
def test_flux_context_parallel_ring_compiled(saved):
    """(Compiled context parallel runs in the default suite through the Ulysses test.)"""
    pipe = _load(saved, "flux")
    hf_tpu.parallelize_pipeline(pipe, context="model")
    pipe.transformer.compile(backend="tpu")
    _run_matches_cpu(saved, "flux", pipe)


def test_flux_enable_parallelism_ulysses_without_process_group_eager_and_compiled(saved, monkeypatch):
    from diffusers import ContextParallelConfig

    with hf_tpu.use_mesh((2, 4), ("context", "model")):
        pipe = _load(saved, "flux")  # weights: tp over "model"
        assert hf_tpu.sharding(pipe.transformer.transformer_blocks[0].attn.to_q.weight) == ("model", None)
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
        layouts = _record_attention(monkeypatch)
        _run_matches_cpu(saved, "flux", pipe)
        # Ulysses: attention sees (batch, seq, heads, dim) split by heads, the all-to-all done by XLA
        assert layouts and all(spec[2] == "context" and spec[1] is None for spec in layouts), layouts
        before = {p.name for p in hf_tpu.compiled_programs()}
        pipe.transformer.compile(backend="tpu")
        _run_matches_cpu(saved, "flux", pipe)
        # compiled, the same layout reaches XLA as sharding constraints around each attention
        texts = [p.compiled_text() for p in hf_tpu.compiled_programs() if p.name not in before]
        assert any("sharding_constraint" in t for t in texts), [len(t) for t in texts]
        with pytest.raises(RuntimeError, match="already applied"):
            pipe.transformer.enable_parallelism(config=ContextParallelConfig(ring_degree=2))


def _record_attention(monkeypatch) -> list:
    """The layout of the query each attention call receives (diffusers' native op)."""
    from diffusers.models import attention_dispatch

    layouts: list = []
    original = attention_dispatch._native_attention_forward_op

    def forward_op(ctx, query, *args, **kwargs):
        layouts.append(hf_tpu.sharding(query))
        return original(ctx, query, *args, **kwargs)

    monkeypatch.setattr(attention_dispatch, "_native_attention_forward_op", forward_op)
    return layouts


def test_flux_ring_and_ulysses_together_without_process_group_eager_and_compiled(saved, monkeypatch):
    """`ContextParallelConfig(ring_degree=2, ulysses_degree=2)` (diffusers' unified attention) over a mesh with
    a "ring" and a "ulysses" axis: the sequence is split over both (4 ways); each attention re-lays query, key
    and value out to the sequence over "ring" and the heads over "ulysses" (Ulysses' all-to-all within each
    pair of chips), GSPMD gathers keys/values over "ring", and the output goes back to the sequence split."""
    from diffusers import ContextParallelConfig

    with hf_tpu.use_mesh((2, 2, 2), ("ring", "ulysses", "model")):
        pipe = _load(saved, "flux")  # weights: tp over "model"
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ring_degree=2, ulysses_degree=2))
        seen: list = []
        recording = _record_inputs(pipe.transformer.transformer_blocks[0], seen)
        layouts = _record_attention(monkeypatch)
        _run_matches_cpu(saved, "flux", pipe)
        assert seen and all(spec[1] == ("ring", "ulysses") for spec in seen), seen
        assert layouts and all(spec[1:3] == ("ring", "ulysses") for spec in layouts), layouts
        recording.remove()
        monkeypatch.undo()
        before = {p.name for p in hf_tpu.compiled_programs()}
        pipe.transformer.compile(backend="tpu")
        _run_matches_cpu(saved, "flux", pipe)
        texts = [p.compiled_text() for p in hf_tpu.compiled_programs() if p.name not in before]
        assert any("sharding_constraint" in t for t in texts), [len(t) for t in texts]


def test_flux_parallelize_pipeline_over_a_ring_and_a_ulysses_axis(saved, monkeypatch):
    """`parallelize_pipeline(context=("ring", "ulysses"), ulysses=True)`: the same unified attention."""
    with hf_tpu.use_mesh((2, 2, 2), ("ring", "ulysses", "model")):
        pipe = _load(saved, "flux")
        hf_tpu.parallelize_pipeline(pipe, context=("ring", "ulysses"), ulysses=True)
        layouts = _record_attention(monkeypatch)
        _run_matches_cpu(saved, "flux", pipe)
        assert layouts and all(spec[1:3] == ("ring", "ulysses") for spec in layouts), layouts


_CONTEXT_PARALLEL = {  # name -> (mesh shape, axis names, ContextParallelConfig arguments)
    "ring": ((8,), ("model",), {"ring_degree": 8}),
    "ulysses": ((2, 4), ("context", "model"), {"ulysses_degree": 2}),
    "unified": ((2, 2, 2), ("ring", "ulysses", "model"), {"ring_degree": 2, "ulysses_degree": 2}),
}


def _train_step(model, inputs: dict, target) -> list:
    """[loss, {name: gradient}, {name: weight after the step}] of one AdamW step, on CPU."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = torch.nn.functional.mse_loss(model(**inputs)[0], target)
    loss.backward()
    grads = {n: p.grad.cpu() for n, p in model.named_parameters()}
    optimizer.step()
    return [{"loss": loss.detach().cpu()}, grads, {n: p.detach().cpu() for n, p in model.named_parameters()}]


def _check_training_step(config: str, compiled: bool = False) -> None:
    from diffusers import ContextParallelConfig

    torch.manual_seed(0)
    cpu = zoo.flux_transformer().train()
    inputs = zoo.flux_transformer_inputs()
    target = torch.randn(1, 64, 4, generator=torch.Generator().manual_seed(1))
    model = zoo.flux_transformer().train()
    model.load_state_dict(cpu.state_dict())
    expected = _train_step(cpu, inputs, target)
    shape, names, degrees = _CONTEXT_PARALLEL[config]
    with hf_tpu.use_mesh(shape, names):
        model.to("tpu").enable_parallelism(config=ContextParallelConfig(**degrees))
        seen: list = []
        before = {p.name for p in hf_tpu.compiled_programs()}
        if compiled:
            model.compile(backend="tpu")
        else:
            _record_inputs(model.transformer_blocks[0], seen)
        on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        got = _train_step(model, on_tpu, target.to("tpu"))
    split = names[:-1] if config == "unified" else names[0]
    if compiled:  # the split reaches XLA as sharding constraints (forward and backward graphs)
        texts = [p.compiled_text() for p in hf_tpu.compiled_programs() if p.name not in before]
        assert any("sharding_constraint" in t for t in texts), [len(t) for t in texts]
    else:
        assert seen and seen[0][1] == split, seen  # the image tokens entered the block split
    for tensors, wanted in zip(got, expected, strict=True):
        for name, tensor in tensors.items():
            torch.testing.assert_close(
                tensor, wanted[name], atol=ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}"
            )


@pytest.mark.parametrize(
    "config",
    ["unified", "ulysses", pytest.param("ring", marks=pytest.mark.slow)],
)
def test_flux_training_step_with_context_parallel_equals_cpu(config):
    """Forward, MSE loss, backward and an AdamW step of the tiny Flux transformer with context parallel (one
    process: the sequence split over the mesh, the re-layouts differentiable): loss, every gradient and every
    updated weight equal the CPU step without parallelism. (Unified covers both mechanisms, keys/values gathered
    by GSPMD and Ulysses' re-layout; ring alone, 8 ways, runs with -m slow: ~25 s here.)"""
    _check_training_step(config)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["ring", "ulysses", "unified"])
def test_flux_training_step_with_context_parallel_compiled_equals_cpu(config):
    _check_training_step(config, compiled=True)


def test_parallel_config_needs_a_mesh_axis_of_its_size_and_a_cp_plan(saved):
    from diffusers import ContextParallelConfig, FluxTransformer2DModel

    from hf_tpu.integrations.diffusers_parallel import context_parallel

    model = FluxTransformer2DModel.from_pretrained(saved["flux"][1] / "transformer", device_map="tpu")
    with pytest.raises(ValueError, match="mesh axis of size 3"):
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=3))
    with pytest.raises(ValueError, match="mesh axis of size 2"):  # ring x Ulysses: an axis for each
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=2, ulysses_degree=2))
    assert model._parallel_config is None  # nothing applied: it can be called again
    with pytest.raises(ValueError, match="no `_cp_plan`"):
        context_parallel(zoo.sd_unet(), "model")


def test_tensor_parallel_config_without_process_group_is_the_tp_placement(saved):
    from diffusers import FluxTransformer2DModel, TensorParallelConfig

    path = saved["flux"][1] / "transformer"
    cpu = FluxTransformer2DModel.from_pretrained(path)
    loaded = FluxTransformer2DModel.from_pretrained(path, parallel_config=TensorParallelConfig(tp_degree=8))
    moved = FluxTransformer2DModel.from_pretrained(path).to("tpu")
    moved.enable_parallelism(config=TensorParallelConfig(tp_degree=8))
    for model in (loaded, moved):
        assert model._parallel_config.tensor_parallel_config is not None
        assert hf_tpu.sharding(model.transformer_blocks[0].attn.add_k_proj.weight) == ("model", None)
        assert hf_tpu.sharding(model.transformer_blocks[0].attn.to_add_out.weight) == (None, "model")
    inputs = zoo.flux_transformer_inputs()
    with torch.no_grad():
        expected = cpu(**inputs)[0]
        for model in (loaded, moved):
            on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            torch.testing.assert_close(model(**on_tpu)[0].cpu(), expected, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="'model' axis has 4"):
        FluxTransformer2DModel.from_pretrained(path).to("tpu").enable_parallelism(
            config=TensorParallelConfig(tp_degree=4)
        )


@pytest.mark.slow
def test_wan_context_parallel_splits_rope_outputs_on_a_2d_mesh():
    """Wan's `_cp_plan` splits the RoPE module's outputs (`split_output=True`) and the first block's input."""
    family = zoo.FAMILIES["wan_t2v"]
    pipe = family.build()
    expected = zoo.output_of(family, pipe(**family.inputs()))
    with hf_tpu.use_mesh((4, 2), ("model", "context")):
        pipe.to("tpu")
        hf_tpu.parallelize_pipeline(pipe, context="context")
        seen: list = []
        _record_inputs(pipe.transformer.blocks[0], seen)
        rope: list = []
        pipe.transformer.rope.register_forward_hook(lambda m, a, out: rope.append(hf_tpu.sharding(out[0])))
        got = zoo.output_of(family, pipe(**family.inputs()))
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
    assert seen and all(spec[1] == "context" for spec in seen), seen
    assert rope and all(spec[1] == "context" for spec in rope), rope

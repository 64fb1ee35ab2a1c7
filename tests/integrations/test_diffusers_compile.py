"""Compiling diffusers models and pipelines on tpu.

- `torch.compile(model)` and `model.compile_repeated_blocks(fullgraph=True)` with no backend argument (what
  diffusers' docs write) run on hf_tpu's compiler for tpu graphs (torch's inductor has a `tpu` device of
  its own that needs `torch_tpu`), keep `fullgraph`/`dynamic`/`mode`/`options`, and leave CPU graphs to
  inductor.
- `hf_tpu.compile_pipeline(pipe)`: after the first denoising step, later steps and a second generation at
  the same resolution compile nothing (TorchDynamo graphs and XLA executables counted).
- `loop=True`: the whole denoising loop as one program, equal to the step-by-step pipeline.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import hf_tpu
from tests.integrations.diffusion_zoo import FAMILIES, output_of


class XlaCompiles:
    """Counts the XLA executables JAX builds or loads from its persistent cache (its backend-compile event,
    sent on every miss of its in-memory caches): any mode, compiled graph or eager op."""

    def __init__(self):
        import jax

        self.count = 0
        self.names: list[str] = []  # the jitted function of each, in order (`interpret`: a compiled graph)
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1
            self.names.append(str(kwargs.get("fun_name")))

    @staticmethod
    def clears() -> int:
        """How often hf_tpu unloaded JAX's in-memory executables (HF_TPU_MAP_BUDGET, in long runs): the
        programs in use then load again (from the persistent cache), which JAX reports as compiles."""
        from hf_tpu.runtime.buffers import executables

        return executables.stats["clears"]


@pytest.fixture(scope="module")
def xla_compiles():
    return XlaCompiles()


def _small_dit(dim: int = 16):
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        caption_projection_dim=dim,
        joint_attention_dim=dim,
        pooled_projection_dim=8,
        out_channels=4,
    ).eval()
    model._repeated_blocks = ["JointTransformerBlock"]  # diffusers leaves it empty for SD3
    inputs = dict(
        hidden_states=torch.randn(1, 4, 8, 8),
        encoder_hidden_states=torch.randn(1, 5, dim),
        pooled_projections=torch.randn(1, 8),
        timestep=torch.tensor([3.0]),
    )
    return model, inputs


def _tpu(inputs: dict) -> dict:
    return {k: v.to("tpu") for k, v in inputs.items()}


def test_torch_compile_with_no_backend_runs_tpu_graphs_on_hf_tpu():
    """The default backend (inductor) used to fail with `No module named 'torch_tpu'`."""
    model, inputs = _small_dit()
    with torch.no_grad():
        expected = model(**inputs).sample
        model = model.to("tpu")
        compiled = torch.compile(model, fullgraph=True, mode="max-autotune-no-cudagraphs")
        got = compiled(**_tpu(inputs)).sample
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_compile_repeated_blocks_with_no_backend_on_tpu_matches_cpu():
    model, inputs = _small_dit()
    with torch.no_grad():
        expected = model(**inputs).sample
        model = model.to("tpu")
        model.compile_repeated_blocks(fullgraph=True)
        got = model(**_tpu(inputs)).sample
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert all(getattr(block, "_compiled_call_impl", None) is not None for block in model.transformer_blocks)


def test_default_backend_dynamic_shapes_on_tpu_and_cpu_graphs_stay_with_inductor():
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    tpu_net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    tpu_net.load_state_dict(net.state_dict())
    tpu_net = tpu_net.to("tpu")
    compiled = torch.compile(tpu_net, dynamic=True, options={"max_autotune": False})
    with torch.no_grad():
        for rows in (2, 3, 5):  # new shapes: one symbolic graph, each shape its own XLA executable
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), net(x), atol=1e-5, rtol=1e-5)
        before = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
        cpu_compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()))
        assert cpu_compiled(torch.randn(2, 3)).device.type == "cpu"
        after = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
    assert after > before  # the CPU graph went through inductor


def test_backend_tpu_on_transformer_and_regional_compile_match_cpu():
    model, inputs = _small_dit()
    with torch.no_grad():
        expected = model(**inputs).sample
        whole = model.to("tpu")
        whole.compile(backend="tpu", fullgraph=True)
        torch.testing.assert_close(whole(**_tpu(inputs)).sample.cpu(), expected, atol=1e-5, rtol=1e-5)
    regional, _ = _small_dit()
    regional = regional.to("tpu")
    regional.compile_repeated_blocks(backend="tpu", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(regional(**_tpu(inputs)).sample.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["sd", "sd3", "flux"])
def test_compile_pipeline_later_steps_and_second_generation_compile_nothing(name, xla_compiles):
    """Counts after step 1 (a `callback_on_step_end`): TorchDynamo compiles no new graph and XLA builds no
    new executable of a compiled graph in the later steps; the second generation compiles nothing at all."""
    fam = FAMILIES[name]
    expected = output_of(fam, fam.build()(**fam.inputs()))
    pipe = fam.build().to("tpu")
    hf_tpu.compile_pipeline(pipe)
    seen = []

    def after_step(pipe, i, t, kwargs):
        seen.append((i, counters["stats"]["unique_graphs"], _compiled_graph_executables()))
        return kwargs

    inputs = {**fam.inputs(), "num_inference_steps": 3, "callback_on_step_end": after_step}
    before = xla_compiles.count
    first = output_of(fam, pipe(**inputs))
    assert xla_compiles.count > before  # the counter sees the first generation's compiles
    assert [s[0] for s in seen] == [0, 1, 2]
    assert len({s[1:] for s in seen}) == 1, f"steps 2-3 compiled: {seen}"
    graphs, xla, clears = counters["stats"]["unique_graphs"], xla_compiles.count, xla_compiles.clears()
    executables = _compiled_graph_executables()
    seen.clear()
    second = output_of(
        fam, pipe(**{**fam.inputs(), "num_inference_steps": 3, "callback_on_step_end": after_step})
    )
    assert counters["stats"]["unique_graphs"] == graphs
    assert _compiled_graph_executables() == executables  # no compiled graph built a new executable
    if xla_compiles.clears() == clears:  # else executables were unloaded meanwhile and loaded again
        # 0 when run alone. After many other tests in one process, one eager kernel (`jit(call)`,
        # dispatch.py) was seen building one executable in the second generation of Flux (once; a third
        # and fourth generation built none): process history in the eager op cache, never a compiled
        # graph (`jit(interpret)`)
        new = xla_compiles.names[xla:]
        assert "jit(interpret)" not in new and len(new) <= 1, f"the second generation compiled {new}"
    np.testing.assert_array_equal(first, second)
    reference = fam.build()
    expected = output_of(fam, reference(**{**fam.inputs(), "num_inference_steps": 3}))
    np.testing.assert_allclose(first, expected, atol=1e-4, rtol=0)


def _scan_programs() -> list:
    """The compiled tpu graphs alive now whose graph holds a `scan` (lowered to one `lax.scan`)."""
    import gc

    from hf_tpu.runtime.compile.backend import GraphProgram

    scan = torch.ops.higher_order.scan
    return [
        obj
        for obj in gc.get_objects()
        if type(obj) is GraphProgram and any(n.target is scan for n in obj.gm.graph.nodes)
    ]


def _compiled_graph_executables() -> int:
    """XLA executables held by every compiled tpu graph (GraphProgram) alive now."""
    import gc

    from hf_tpu.runtime.compile.backend import GraphProgram, _compiled_count

    total = 0
    for obj in gc.get_objects():
        if type(obj) is GraphProgram:  # not isinstance: gc also lists dead weak proxies
            total += sum(_compiled_count(f) for f in (obj._jitted, *obj._donating.values()))
    return total


@pytest.mark.parametrize("name", ["flux", pytest.param("sd", marks=pytest.mark.slow)])
def test_whole_loop_mode_equals_the_step_by_step_pipeline(name, xla_compiles):
    fam = FAMILIES[name]
    pipe = fam.build().to("tpu")
    hf_tpu.compile_pipeline(pipe)
    stepwise = output_of(fam, pipe(**{**fam.inputs(), "num_inference_steps": 3}))
    looped = fam.build().to("tpu")
    hf_tpu.compile_pipeline(looped, loop=True)
    assert type(looped).__name__ == type(pipe).__name__ and isinstance(looped, type(pipe))
    got = output_of(fam, looped(**{**fam.inputs(), "num_inference_steps": 3}))
    np.testing.assert_allclose(got, stepwise, atol=1e-5, rtol=0)
    assert len(looped._hf_tpu_loop_programs) == 1
    scans = _scan_programs()
    assert scans and all(not p.missing for p in scans)  # the loop is one jitted program holding a lax.scan
    xla, clears = xla_compiles.count, xla_compiles.clears()
    again = output_of(fam, looped(**{**fam.inputs(), "num_inference_steps": 3}))
    np.testing.assert_array_equal(again, got)
    if xla_compiles.clears() == clears:
        assert xla_compiles.count == xla  # the second generation reuses the loop program
    # a call the loop does not cover (a callback) takes the pipeline's own loop, same result
    calls = []
    inputs = {**fam.inputs(), "num_inference_steps": 3}
    inputs["callback_on_step_end"] = lambda p, i, t, kw: calls.append(i) or kw
    np.testing.assert_allclose(output_of(fam, looped(**inputs)), stepwise, atol=1e-5, rtol=0)
    assert calls == [0, 1, 2]

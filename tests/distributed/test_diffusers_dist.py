"""diffusers' own `enable_parallelism` under torchrun on tpu_dist: 2 ranks (4 for ring and Ulysses together;
launcher.run_job, torchrun's env on 127.0.0.1), each `init_process_group("tpu_dist")` +
`torch.tpu.set_device(local_rank)`, the same tiny Flux from tests/integrations/diffusion_zoo.py on every rank,
then `ContextParallelConfig(ring_degree=2)`, `ContextParallelConfig(ulysses_degree=2)`,
`ContextParallelConfig(ring_degree=2, ulysses_degree=2)` or `TensorParallelConfig(tp_degree=2)`. The worker
(workers/diffusers_cp.py) compares each rank's output with one CPU process (fp32, atol 1e-4) and checks that
diffusers' path ran, not hf_tpu's single-process mapping (`diffusers_parallel.py` defers once a process group
exists): context parallel hands each rank half of the image tokens as a plain tpu tensor (diffusers' `_cp_plan`
hooks, then ring attention's all_gather or Ulysses' all_to_all_single through `_functional_collectives`);
tensor parallel turns the attention weights into DTensors sharded over the ranks (`parallelize_module`).
"""

from __future__ import annotations

import re

import pytest

from tests.distributed.launcher import report, run_job

# per config: the eager transformer forward (a run check, the output, rank 0's output), the compiled one (the
# same + a second call) and the pipeline generation (a run check)
_CHECKS_PER_CONFIG = 3 + 4 + 1


def _passed(results) -> list[int]:
    assert all(r.returncode == 0 for r in results), report(results)
    counts = [re.search(r"(\d+) checks passed, 0 failed", r.output) for r in results]
    assert all(counts), report(results)
    return [int(m.group(1)) for m in counts]


# ring in the default run (it exercises hf_tpu's logsumexp answer and the ring's all_gather); Ulysses and tp
# run with -m slow (make test-all), and their loaded forms in the default run below
@pytest.mark.parametrize(
    "config",
    ["ring", pytest.param("ulysses", marks=pytest.mark.slow), pytest.param("tp", marks=pytest.mark.slow)],
)
def test_enable_parallelism_under_torchrun_matches_one_cpu_process(config):
    """The transformer forward, eager and after `model.compile(backend="tpu")` (one graph, no break, its
    collectives inside one SPMD program over the ranks, compiled once for two calls), and a whole 2-step
    FluxPipeline generation (CPU generator) with the transformer under `config`: every rank's output equals the
    CPU one. Ring attention merges its steps by logsumexp, which diffusers' native op gives on tpu only
    (hf_tpu's patch of `_native_attention_forward_op`)."""
    configs = f"{config},{config}-compiled,{config}-pipe"
    results = run_job("diffusers_cp", 2, args=(configs,), timeout=300, extra_env={"HF_HUB_OFFLINE": "1"})
    assert _passed(results) == [_CHECKS_PER_CONFIG] * 2, report(results)


def test_from_pretrained_with_parallel_config_under_torchrun_matches_one_cpu_process():
    """`from_pretrained(path, parallel_config=...)`: TensorParallelConfig streams each rank's slice of every
    planned weight straight into a DTensor on its tpu (diffusers' sharded load); ring and Ulysses load with
    device_map="tpu" and apply the config. Each forward equals the CPU one on every rank."""
    results = run_job(
        "diffusers_cp",
        2,
        args=("tp-load,ring-load,ulysses-load",),
        timeout=300,
        extra_env={"HF_HUB_OFFLINE": "1"},
    )
    assert _passed(results) == [3 * 3] * 2, report(results)


@pytest.mark.slow
def test_ring_and_ulysses_together_on_4_ranks_match_one_cpu_process():
    """diffusers' unified attention (`ContextParallelConfig(ring_degree=2, ulysses_degree=2)`: Ulysses'
    all-to-all inside each group of 2, the ring's all_gather across the groups): the transformer forward eager
    and compiled, and a FluxPipeline generation, equal the CPU ones on every rank. Compiled, the graph's
    collectives span two groups, the rows and columns of a 2x2 grid of ranks: one SPMD program over the grid
    (~2.5 min here)."""
    results = run_job(
        "diffusers_cp",
        4,
        args=("unified,unified-compiled,unified-pipe",),
        timeout=600,
        extra_env={"HF_HUB_OFFLINE": "1"},
    )
    assert _passed(results) == [_CHECKS_PER_CONFIG] * 4, report(results)


@pytest.mark.slow
@pytest.mark.parametrize(("configs", "ranks"), [("ring-train,ulysses-train", 2), ("unified-train", 4)])
def test_context_parallel_training_step_under_torchrun_matches_one_cpu_step(configs, ranks):
    """One training step (forward, loss, backward, gradients summed over the ranks, AdamW step) of the tiny
    Flux under diffusers' ring, Ulysses and unified attention: loss, gradients and updated weights equal one
    CPU step (fp32, atol 1e-4) on every rank. Ring needs hf_tpu's native backward op (diffusers' own
    differentiates every ring step against the local keys/values: wrong gradients)."""
    results = run_job("diffusers_cp", ranks, args=(configs,), timeout=600, extra_env={"HF_HUB_OFFLINE": "1"})
    assert _passed(results) == [len(configs.split(","))] * ranks, report(results)

"""FSDP2 (`fully_shard`) on tpu_dist: training equals one CPU process. Each test launches its own ranks on
127.0.0.1 (free ports, bounded wall time, see launcher.py); the workers are in workers/.

FSDP2 frees each unsharded parameter's storage with `untyped_storage().resize_(0)` after use and
reallocates it with `resize_(n)` before all-gathering into it (hf_tpu.runtime.tensors.storages).
"""

from __future__ import annotations

import re

import pytest

from tests.distributed.launcher import report, run_job

# checks per (model, reshard_after_forward): one per step (global loss), one per parameter, one for the run
_PARAMS = {"mlp": 18, "mlp-seq": 18, "llama": 21}


def _expect(models: list[str], steps: int, configs: int = 2) -> int:
    return sum(configs * (steps + _PARAMS[m] + 1) for m in models)


def _run(world_size: int, models: list[str], steps: int, timeout: float, extra_env=None, worker="fsdp2"):
    results = run_job(
        worker, world_size, args=(",".join(models), steps), timeout=timeout, extra_env=extra_env
    )
    assert all(r.returncode == 0 for r in results), report(results)
    return results


def _passed(results) -> list[int]:
    counts = []
    for r in results:
        m = re.search(r"(\d+) checks passed, 0 failed", r.output)
        assert m, report(results)
        counts.append(int(m.group(1)))
    return counts


@pytest.mark.parametrize(
    "world_size, models, steps, env",
    [
        pytest.param(2, ["mlp", "llama"], 3, None, id="2ranks"),
        pytest.param(2, ["mlp", "llama"], 2, {"HF_TPU_NATIVE": "0"}, id="2ranks-python-path"),
        pytest.param(4, ["mlp", "llama"], 2, None, id="4ranks"),
    ],
)
def test_fully_shard_training_matches_one_cpu_process(world_size, models, steps, env):
    """An MLP (one output dim of 3: uneven shards) and a tiny Llama built from `LlamaConfig` (nothing
    downloaded), `fully_shard` per block and at the root on `init_device_mesh("tpu", (N,))`,
    reshard_after_forward True and False, AdamW steps on each rank's slice of the global batches: every
    step's global loss and the final parameters (`full_tensor()`) equal a CPU run on whole batches
    (fp32, rtol/atol 1e-5)."""
    results = _run(world_size, models, steps, timeout=600 if world_size > 2 else 420, extra_env=env)
    assert _passed(results) == [_expect(models, steps)] * world_size, report(results)


def test_fully_shard_under_torch_compile_matches_one_cpu_process():
    """The same training with the sharded model under `torch.compile(backend="tpu")` (2 ranks): FSDP2's
    hooks break the graph where they run, the blocks between them compile; every step's loss and the final
    parameters equal the CPU run (parameters at 1e-4: XLA's fused rounding, see the worker)."""
    models, steps = ["mlp", "llama"], 2
    results = _run(2, models, steps, timeout=600, extra_env={"FSDP2_COMPILE": "1"})
    assert _passed(results) == [_expect(models, steps)] * 2, report(results)
    for r in results:
        graphs = re.search(r"compiled graphs: (\d+)", r.output)
        assert graphs and int(graphs.group(1)) >= 2, report(results)


def test_fully_shard_on_dp_and_tensor_parallel_on_tp_of_a_2d_mesh():
    """`init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))` on 4 ranks: `parallelize_module` on
    the "tp" sub-mesh, then `fully_shard` per block and at the root on "dp" (2-D DTensor parameters).
    The tiny Llama: q/k/v/gate/up column-wise, o/down row-wise. The MLP with a sequence dim: sequence
    parallel (the residual stream split along the sequence between blocks, the norm a `SequenceParallel`).
    Every step's global loss and the final parameters equal a CPU run on whole batches."""
    models, steps = ["mlp-seq", "llama"], 2
    results = _run(4, models, steps, timeout=600, worker="fsdp2_tp")
    assert _passed(results) == [_expect(models, steps, configs=1)] * 4, report(results)

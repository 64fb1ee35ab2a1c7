"""transformers' tensor parallelism (`tp_plan="auto"`, `DistributedConfig(tp_size=N)`, `device_mesh=`) and
`Trainer` on a tp model under a torchrun-style tpu_dist job, against one CPU process. Each test launches its
own ranks on 127.0.0.1 (free ports, bounded wall time, see launcher.py); the worker is
workers/transformers_tp.py. The checkpoints are tiny models built from configs (nothing downloaded)."""

from __future__ import annotations

import re

import pytest

from tests.distributed.launcher import report, run_job

# checks per family: logits, generate, one per step (loss), one per parameter (gradient, then trained
# weight), and the family's run itself
_PARAMS = {"llama": 21, "qwen2": 27, "mixtral": 21}


def _expect(families: list[str], steps: int, trainer: bool = False, load: str = "") -> int:
    families = [f.partition(":")[0] for f in families]  # "family:load" loads that family its own way
    if trainer:  # the logged losses, the trained weights, the run (fsdp2: and the saved checkpoint)
        return sum(steps + _PARAMS[f] + 1 + (load == "fsdp2") for f in families)
    return sum(2 + steps + 2 * _PARAMS[f] + 1 for f in families)


def _run(
    tmp_path, world_size: int, families: list[str], load: str, steps: int, timeout: float, trainer=False
):
    args = (tmp_path, ",".join(families), load, steps, *(("trainer",) if trainer else ()))
    results = run_job(
        "transformers_tp", world_size, args=args, timeout=timeout, extra_env={"HF_HUB_OFFLINE": "1"}
    )
    assert all(r.returncode == 0 for r in results), report(results)
    expected = _expect(families, steps, trainer, load)
    for r in results:
        m = re.search(r"(\d+) checks passed, 0 failed", r.output)
        assert m and int(m.group(1)) == expected, report(results)


def test_tp_plan_auto_matches_one_cpu_process(tmp_path):
    """2 ranks, `from_pretrained(path, tp_plan="auto")` of a tiny Llama and a tiny Mixtral (experts: packed
    column-wise gate_up, row-wise down, `moe_tp_experts`), and a tiny Qwen2 (q/k/v biases) loaded with a user
    `device_mesh=init_device_mesh("tpu", (2,), mesh_dim_names=("tp",))`: q_proj (and the experts) are split
    across the ranks, and the logits, a greedy `generate`, two AdamW steps (loss, gradients, weights) equal
    the same checkpoint on CPU."""
    _run(tmp_path, 2, ["llama", "mixtral", "qwen2:mesh"], "auto", steps=2, timeout=600)


@pytest.mark.slow  # the 2-rank test above covers the user mesh in the default run
def test_tp_with_a_user_device_mesh_on_4_ranks(tmp_path):
    """4 ranks, `tp_plan="auto", device_mesh=init_device_mesh("tpu", (4,), mesh_dim_names=("tp",))` on a
    tiny Qwen2 (q/k/v biases, one head per rank): the same checks as above (one step)."""
    _run(tmp_path, 4, ["qwen2"], "mesh", steps=1, timeout=600)


@pytest.mark.parametrize("load", ["config", "ddp", "fsdp2"])
def test_trainer_matches_one_cpu_process(tmp_path, load):
    """2 ranks, `Trainer.train()` for two steps: accelerate's state is a 2-process `tpu_dist` job on tpu, and
    the logged losses and trained weights equal a CPU AdamW loop on the whole batch. config: the model is
    loaded with `DistributedConfig(tp_size=2)`; ddp: the whole model on each rank, `Trainer` wraps it in
    DDP and each rank trains on half the batch; fsdp2: `TrainingArguments(fsdp=True, fsdp_config={"version":
    2, "transformer_layer_cls_to_wrap": [...]})` on a model loaded on CPU, accelerate `fully_shard`s each
    decoder layer and the root onto tpu (weights split across the ranks), each rank trains on half the
    batch, and `save_model` writes the full trained checkpoint."""
    _run(tmp_path, 2, ["llama"], load, steps=2, timeout=420, trainer=True)

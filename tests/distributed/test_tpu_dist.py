"""tpu_dist (torch.distributed on tpu) end to end: each test launches its own processes on 127.0.0.1.

Workers live in workers/; the launcher gives them torchrun's env (or none, for mp.spawn and bad-input
cases), free ports and a bounded wall time. Collectives are compared with values computed on CPU.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.distributed.launcher import WORKERS, assert_ok, child_env, free_port_pair, report, run_job


def _checks_passed(results) -> int:
    counts = [
        int(m.group(1)) for r in results for m in [re.search(r"(\d+) checks passed, 0 failed", r.output)] if m
    ]
    assert len(counts) == len(results), report(results)
    return min(counts)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_collective_every_dtype(world_size):
    """all_reduce (every op), reduce, all_gather(+_into_tensor), reduce_scatter(+_tensor), all_to_all(+_single,
    uneven), broadcast, gather, scatter, send/recv, isend/irecv, batch_isend_irecv, async work, a view as
    the tensor, subgroups, object collectives, bad reduce ops and cpu tensors, tpu:local_rank: float32,
    bfloat16, int64, bool, against CPU."""
    results = run_job("collectives", world_size, timeout=200)
    assert_ok(results)
    assert _checks_passed(results) >= 100, report(results)


def test_ddp_dtensor_tensor_parallel_functional_collectives():
    """Under torchrun a tpu tensor may exist before init_process_group (the device joins the JAX job
    itself); then DDP (broadcast weights, averaged grads), DTensor (distribute_tensor, redistribute, ops),
    parallelize_module (colwise + rowwise MLP), functional collectives eager and under
    torch.compile(backend="tpu"): against CPU."""
    results = run_job("parallel", 2, timeout=200)
    assert_ok(results)
    assert _checks_passed(results) >= 18, report(results)


def test_mp_spawn():
    """torch.multiprocessing.spawn: rank/world_size and device_id=tpu:rank passed to init_process_group;
    rank 0 finds the store through MASTER_ADDR/MASTER_PORT, rank 1 through init_method='tcp://...' with
    nothing in its env (both must derive the same JAX coordinator)."""
    env = child_env(0, 2, free_port_pair(), torchrun=False)
    cmd = [sys.executable, str(WORKERS / "spawn_job.py"), "2", str(free_port_pair())]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "spawn ok" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    for line in ("env rank 0 ok", "tcp rank 1 ok"):
        assert line in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]


def _errors(results) -> dict[str, str]:
    assert all(r.returncode == 0 for r in results), report(results)
    errors = {}
    for r in results:
        for line in r.output.splitlines():
            if line.startswith(("ERROR", "NO ERROR")):
                assert not line.startswith("NO ERROR"), report(results)
                case = line.split()[1]
                errors[case] = errors.get(case, "") + line + "\n"
    return errors


def test_bad_init_gives_clear_errors_in_bounded_time():
    """In one process, one after another: init_process_group without any launcher env (torch's error
    names RANK); WORLD_SIZE=2 without MASTER_ADDR; rank 1 of 2 whose rank 0 (JAX's coordinator) never
    starts: an error naming the address after HF_TPU_DIST_INIT_TIMEOUT, not a hang nor JAX aborting."""
    results = run_job(
        "bad_init",
        2,
        args=("no_env", "no_master_addr", "no_coordinator"),
        ranks=[1],
        extra_env={"HF_TPU_DIST_INIT_TIMEOUT": "3"},
        timeout=90,
    )
    errors = _errors(results)
    assert "RANK" in errors["no_env"], errors
    assert "MASTER_ADDR is not set" in errors["no_master_addr"], errors
    err = errors["no_coordinator"]
    assert "DistributedInitError" in err and "127.0.0.1:" in err and "did not answer within 3 s" in err, err
    assert float(re.search(r"after ([\d.]+)s", err).group(1)) < 20, err


def test_init_after_the_device_started_single_process():
    """mp.spawn style (no launcher env): a tpu tensor before init_process_group gives an error saying
    what to do, on every rank."""
    errors = _errors(run_job("bad_init", 2, args=("late_init",), torchrun=False, timeout=90))
    assert errors["late_init"].count("before the first tpu tensor") == 2, errors


def test_backend_registered_at_import_without_starting_jax():
    code = (
        "import torch, torch.distributed as dist, sys\n"
        "assert 'tpu_dist' in dist.Backend.backend_list\n"
        "assert dist.Backend.default_device_backend_map['tpu'] == 'tpu_dist'\n"
        "assert dist.Backend.backend_capability['tpu_dist'] == ['tpu']\n"
        "jax_started = 'jax' in sys.modules and sys.modules['jax']._src.xla_bridge.backends_are_initialized()\n"
        "assert not jax_started\n"
        "print('ok')\n"
    )
    env = child_env(0, 1, 1, torchrun=False)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def test_single_process_device_index_unchanged(monkeypatch):
    """Outside a multi-process job tpu:1 still does not exist."""
    import torch

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="tpu:1 does not exist"):
        torch.tpu.set_device(1)

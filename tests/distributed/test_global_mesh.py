"""`HF_TPU_MESH=global`: one mesh over every process of a tpu_dist job (multi-controller SPMD, as JAX runs a
TPU slice), tested as 2 processes x 4 forced host devices forming one 8-device mesh on 127.0.0.1.

Each process runs the same worker (workers/global_mesh.py) and checks its own view against CPU PyTorch.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.distributed.launcher import assert_ok, child_env, report, run_job

FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "HF_TPU_MESH": "global"}


def _job(tmp_path, extras: str) -> None:
    results = run_job("global_mesh", 2, args=(tmp_path, extras), extra_env=FOUR_DEVICES, timeout=240)
    assert_ok(results)
    counts = [re.search(r"(\d+) checks passed, 0 failed", r.output) for r in results]
    assert all(counts) and min(int(m.group(1)) for m in counts) >= 20, report(results)


def test_one_mesh_over_two_processes(tmp_path):
    """8 global chips / 4 local (a mesh over half of them is refused); a tensor split over all 8 has local
    shards only and reads back whole; elementwise, matmul, reductions, item/tolist/print, DeferAndFuse, a
    tp-sharded Linear pair forward and backward, a (2, 4) mesh; a tiny Llama loaded with device_map="tpu"
    (every weight split over both processes' chips) gives CPU's logits, eager and under
    torch.compile(backend="tpu"); save_pretrained from every process (rank 0 writes) gives CPU's weights, with
    and without a process group; tp_plan="auto" under a process group is hf_tpu's placement; tpu_dist
    collectives refuse a global tensor by name."""
    _job(tmp_path, "compiled")


@pytest.mark.slow
def test_generate_over_two_processes(tmp_path):
    """The same job, with the tiny Llama's greedy `generate` (the decode loop in every process) instead of
    the compiled forward: the tokens equal CPU's."""
    _job(tmp_path, "generate")


def test_opt_in_without_a_job_says_what_to_do():
    """HF_TPU_MESH=global in a process that is not part of a job, and an unknown HF_TPU_MESH value: clear
    errors at the first use of the mesh, not a JAX traceback."""
    code = (
        "import os, torch, hf_tpu\n"
        "from hf_tpu.runtime.buffers.global_mesh import GlobalMeshError\n"
        "for value in ('everywhere', 'global'):\n"
        "    os.environ['HF_TPU_MESH'] = value\n"
        "    try:\n"
        "        hf_tpu.shard(torch.ones(4), ('model',))\n"
        "    except GlobalMeshError as exc:\n"
        "        print('ERROR', value, exc)\n"
        "    else:\n"
        "        print('NO ERROR', value)\n"
    )
    env = child_env(0, 1, 1, torchrun=False)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "NO ERROR" not in out, out
    assert "ERROR everywhere HF_TPU_MESH='everywhere' is not a mesh scope: use 'global'" in out, out
    assert "ERROR global HF_TPU_MESH=global asks for one mesh over every process" in out, out
    assert "torchrun" in out and "unset HF_TPU_MESH for a single process" in out, out

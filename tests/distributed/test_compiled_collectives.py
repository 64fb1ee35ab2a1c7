"""Functional collectives inside `torch.compile(backend="tpu")` under real processes: one SPMD program.

The worker compiles a function mixing all_reduce (sum/avg/max), all_gather_tensor, reduce_scatter_tensor,
all_to_all_single and broadcast with ordinary ops, compares every rank's result with CPU and with the eager
functional collectives, and checks it ran as one executable (compiled once, one call per step, no eager
collective program, the collectives inside its HLO); ranks passing different shapes get a clear error.
"""

from __future__ import annotations

import re

import pytest

from tests.distributed.launcher import assert_ok, report, run_job


@pytest.mark.parametrize("world_size", [2, 3])
def test_compiled_functional_collectives_are_one_program(world_size):
    results = run_job(
        "compiled_collectives", world_size, extra_env={"HF_TPU_DIST_TIMEOUT": "60"}, timeout=240
    )
    assert_ok(results)
    for r in results:
        m = re.search(r"(\d+) checks passed, 0 failed", r.output)
        assert m and int(m.group(1)) >= 21, report(results)
        assert f"MISMATCH ERROR rank {r.rank}" in r.output, report(results)

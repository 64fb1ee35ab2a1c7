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


def test_collectives_over_the_rows_and_columns_of_a_grid_are_one_program():
    """A graph with collectives over both dimensions of a 2x2 DeviceMesh (4 processes) compiles to one
    program over the grid (no op-by-op fallback) and gives the CPU values on every rank."""
    results = run_job(
        "compiled_collectives", 4, args=("grid",), extra_env={"HF_TPU_DIST_TIMEOUT": "60"}, timeout=240
    )
    assert_ok(results)
    for r in results:
        m = re.search(r"(\d+) checks passed, 0 failed", r.output)
        assert m and int(m.group(1)) >= 4, report(results)


def test_grid_of_finds_the_mesh_whose_lines_are_a_graphs_groups():
    """The grid a graph's groups come from (as a row-major DeviceMesh lays them out), seen from one rank;
    groups that are no grid's lines are refused with a reason (the graph then runs op by op)."""
    from hf_tpu.runtime.distributed.compiled import grid_of

    # 2x2 from rank 3: its row (stride 1), its column (stride 2) and the whole world (both axes)
    grid, axes, why = grid_of(((2, 3), (1, 3), (0, 1, 2, 3)), 3, 4)
    assert why is None and grid.shape == (2, 2) and grid.axes == ("stride2", "stride1")
    assert axes == {(2, 3): "stride1", (1, 3): "stride2", (0, 1, 2, 3): ("stride2", "stride1")}
    # 2x4 from rank 5: the row {4..7}, the column {1, 5}
    grid, axes, why = grid_of(((4, 5, 6, 7), (1, 5)), 5, 8)
    assert why is None and grid.shape == (2, 4) and grid.ranks == tuple(range(8))
    assert axes == {(4, 5, 6, 7): "stride1", (1, 5): "stride4"}
    for groups, me, world, reason in [
        (((0, 1), (0, 3)), 0, 4, "not the rows and columns"),  # stride 3 after an axis of 2
        (((1, 2), (0, 2)), 2, 4, "not a line"),  # {1, 2} is no row of a 2x2 grid
        (((0, 1), (0, 2)), 0, 8, "not the rows and columns"),  # 4 of 8 ranks: no axis of stride 4
        (((0, 1), (0, 2)), 0, 3, "does not hold exactly"),  # a 2x2 grid is not 3 ranks
        (((0, 2, 3), (0, 1)), 0, 4, "one stride"),
        (((0, 1), (0, 2), (0, 3)), 0, 4, "does not cover whole axes"),  # stride 3 starts no axis
    ]:
        grid, axes, why = grid_of(groups, me, world)
        assert grid is None and reason in why, (groups, why)

"""Sharding for CI matrices, the local pool with several workers, and a Ray local-cluster run."""

from __future__ import annotations

import pytest

from compat.executors import parse_shard, select_shard, shard_of
from compat.runner import run_models


def test_shards_partition_the_entries_stably():
    entries = [{"id": f"org/model-{i}"} for i in range(200)]
    parts = [select_shard(entries, (i, 4)) for i in range(4)]
    ids = [e["id"] for p in parts for e in p]
    assert sorted(ids) == sorted(e["id"] for e in entries)  # disjoint and covering
    assert all(20 < len(p) < 80 for p in parts)  # roughly balanced
    assert select_shard(entries, "1/4") == parts[1]
    assert shard_of("org/model-0", 4) == 2  # fixed: sha256, not hash()
    assert select_shard(entries, None) == entries


@pytest.mark.parametrize("bad", ["4/4", "-1/2", "a/b", "1-2", (0, 0)])
def test_bad_shard_specs(bad):
    with pytest.raises(ValueError, match="shard"):
        parse_shard(bad)


def test_ray_local_cluster(monkeypatch, tmp_path):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("COMPAT_ENABLE_FAKES", "1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        recs = run_models(
            ["fake/pass", "fake/mismatch", "fake/raise"],
            tmp_path,
            modes=("eager",),
            executor="ray",
            progress=False,
        )
    finally:
        ray.shutdown()
    got = {r["model_id"]: r["status"] for r in recs}
    assert got == {"fake/pass": "pass", "fake/mismatch": "fail_accuracy", "fake/raise": "fail_to_run"}
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 3


def test_unknown_executor(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPAT_ENABLE_FAKES", "1")
    with pytest.raises(ValueError, match="unknown executor"):
        run_models(["fake/pass"], tmp_path, executor="slurm", progress=False)

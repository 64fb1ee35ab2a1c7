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
    from ray._private import ray_constants

    # loopback only (Ray otherwise advertises the host's interface address)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_on_a_ray_cluster_by_address(tmp_path):
    """`compat run --executor ray --address HOST:PORT` runs on a cluster started apart (`ray start --head`,
    here on 127.0.0.1), as on a real cluster; a wrong address is one clear error, not a traceback."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("ray")
    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the ray command line is not installed")
    port = _free_port()
    # loopback only: Ray otherwise advertises the host's interface address (it resolves 127.0.0.1 away);
    # token auth off for this throwaway cluster, which nothing outside 127.0.0.1 can reach
    env = {**os.environ, "COMPAT_ENABLE_FAKES": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env |= {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    import tempfile

    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit in 107 bytes
    head = [ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1"]
    head += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=180)
    if started.returncode != 0:
        pytest.fail(f"ray start failed: {started.stderr[-2000:]}")
    try:
        sample = tmp_path / "sample.jsonl"
        sample.write_text("".join(json.dumps({"id": i}) + "\n" for i in ("fake/pass", "fake/raise")))
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "compat", "run", "--sample", str(sample), "--device", "cpu"]
        cmd += ["--modes", "eager", "--executor", "ray", "--address", f"127.0.0.1:{port}", "--out", str(out)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = {
            (r := json.loads(line))["model_id"]: r["status"]
            for line in (out / "results.jsonl").read_text().splitlines()
        }
        assert got == {"fake/pass": "pass", "fake/raise": "fail_to_run"}
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
    bad = cmd[:-1] + [str(tmp_path / "out2")]
    bad[bad.index("--address") + 1] = f"127.0.0.1:{_free_port()}"
    proc = subprocess.run(bad, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "no Ray cluster answers at" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_address_needs_the_ray_executor(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPAT_ENABLE_FAKES", "1")
    with pytest.raises(ValueError, match="needs --executor ray"):
        run_models(["fake/pass"], tmp_path, executor="local", address="127.0.0.1:1", progress=False)

"""The harness under faults: the whole run SIGKILLed again and again, a worker SIGKILLed mid-model, and a
results file that cannot grow (a full disk). Each time `--resume` finishes the rest, losing nothing and
running nothing twice."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from compat.results import read_records
from tests.compat.test_interrupt import _covered

ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp_path: Path, n: int, behaviour: str = "slow-0.3") -> tuple[list[dict], list[str], dict, Path]:
    entries = [{"id": f"fake/{behaviour}#{i}"} for i in range(n)]
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps(e) + "\n" for e in entries))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "compat", "run", "--sample", str(sample), "--device", "cpu"]
    argv += ["--modes", "eager", "--out", str(out), "--date", "2026-12-01"]
    env = dict(os.environ, COMPAT_ENABLE_FAKES="1", PYTHONPATH=str(ROOT))
    return entries, argv, env, out / "results.jsonl"


def _wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_repeated_sigkill_of_the_whole_run_then_resume_loses_and_duplicates_nothing(tmp_path):
    n = 8
    entries, argv, env, results = _setup(tmp_path, n)
    done_before = 0
    for round_ in range(3):
        cmd = argv + (["--resume"] if round_ else [])
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            grew = _wait_for(
                lambda seen=done_before: results.exists() and len(read_records(results)) > seen,
                timeout=120,
                proc=proc,
            )
            assert grew, f"round {round_}: no new result within 120 s"
        finally:
            _kill_group(proc)  # parent and workers at once, as an OOM killer or a lost VM does
        records = read_records(results)
        assert all(count == 1 for count in _covered(records).values()), "a model/mode was recorded twice"
        done_before = len(records)
        if done_before == n:
            break
    final = subprocess.run(
        argv + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert final.returncode == 0, final.stderr[-2000:]
    records = read_records(results)
    assert _covered(records) == {(e["id"], "eager"): 1 for e in entries}
    assert {r["status"] for r in records} == {"pass"}


def test_a_worker_killed_mid_model_is_recorded_and_the_run_goes_on(tmp_path):
    n = 4
    entries, argv, env, results = _setup(tmp_path, n, behaviour="slow-1.5")
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # once the first model is recorded the worker is warm and inside the next one (1.5 s per call)
        assert _wait_for(lambda: results.exists() and len(read_records(results)) >= 1, 120, proc)
        time.sleep(0.5)
        victims = psutil.Process(proc.pid).children(recursive=True)
        for child in victims:
            child.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]
    records = read_records(results)
    assert _covered(records) == {(e["id"], "eager"): 1 for e in entries}
    statuses = [r["status"] for r in records]
    assert statuses.count("pass") >= n - 1
    crashed = [r for r in records if r["status"] != "pass"]
    for r in crashed:  # the model in flight when its worker died names the death, not a vague error
        assert "worker process died" in json.dumps(r), r


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_gives_a_clear_error_and_a_resumable_state(tmp_path):
    n = 6
    entries, argv, env, results = _setup(tmp_path, n, behaviour="slow-0.1")
    # let the run start (files up to 2 KB can be written), then the results file cannot grow further
    full = subprocess.run(
        argv,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size(2048),
    )
    assert full.returncode != 0
    tail = full.stderr[-3000:]
    assert "Traceback" not in tail, tail
    assert "results" in tail.lower() and ("no space" in tail.lower() or "file too large" in tail.lower()), (
        tail
    )
    kept = read_records(results) if results.exists() else []
    assert len(kept) < n
    if results.exists():
        assert results.read_bytes() == b"" or results.read_bytes().endswith(b"\n")  # whole lines only
    resumed = subprocess.run(
        argv + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _covered(read_records(results)) == {(e["id"], "eager"): 1 for e in entries}

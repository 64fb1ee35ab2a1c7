"""Ctrl-C stops `compat run` cleanly: workers end, results stay whole, a line says how to resume, and the
resumed run finishes the rest with nothing lost or run twice. Plus the live progress line's contents."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from compat.progress import RunProgress
from compat.results import read_records

ROOT = Path(__file__).resolve().parents[2]
N_MODELS = 8


def _covered(records: list[dict]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for r in records:
        for mid in dict.fromkeys([r["model_id"], *(r.get("attributed_ids") or [])]):
            out[(mid, r["mode"])] = out.get((mid, r["mode"]), 0) + 1
    return out


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with_group = os.getpgid(proc.pid) == proc.pid
        (os.killpg if with_group else os.kill)(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_ctrl_c_stops_cleanly_and_resume_finishes_the_rest(tmp_path: Path) -> None:
    entries = [{"id": f"fake/slow-0.3#{i}"} for i in range(N_MODELS)]
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps(e) + "\n" for e in entries))
    out = tmp_path / "run"
    results = out / "results.jsonl"
    argv = ["run", "--sample", str(sample), "--device", "cpu", "--modes", "eager", "--out", str(out)]
    env = dict(os.environ, COMPAT_ENABLE_FAKES="1", PYTHONPATH=str(ROOT))
    # a session of its own, so the signal goes to the whole process group, as a terminal's Ctrl-C does
    proc = subprocess.Popen(
        [sys.executable, "-m", "compat", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if results.exists() and read_records(results):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert read_records(results), "no result within 120 s"
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers, "the run should have a worker process"
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=30)
        stopped_in = time.monotonic() - t0
    finally:
        _stop(proc)
    assert proc.returncode == 130, stderr[-2000:]
    assert stopped_in < 30
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, "workers outlived the interrupted run"
    # results: whole lines only, each valid JSON, nothing recorded for the model that was cut short
    data = results.read_bytes()
    assert data.endswith(b"\n")
    before = [json.loads(line) for line in data.decode().splitlines()]
    assert 1 <= len(before) < N_MODELS, "the interrupt should land mid-run"
    assert {r["status"] for r in before} == {"pass"}
    assert "SIGINT: stopping workers" in stderr
    # (no check of the progress line here: the signal may land between the first result's write and its
    # progress line; test_progress_line_counts_configs_eta_and_pass_rate_per_mode covers the line)
    hint = [line for line in stderr.splitlines() if line.startswith("To resume: ")]
    assert len(hint) == 1 and hint[0].endswith("--resume"), stderr[-2000:]
    assert f"{N_MODELS - len(before)} model/mode pairs left" in stderr

    # resume with the printed command line
    cmd = shlex.split(hint[0][len("To resume: ") :])
    assert cmd[:3] == ["python", "-m", "compat"] and "--date" in cmd  # pinned to the night it started
    done = subprocess.run(
        [sys.executable, *cmd[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    final = read_records(results)
    assert results.read_bytes().startswith(data)  # nothing written before was touched
    assert len(final) == N_MODELS
    assert _covered(final) == {(e["id"], "eager"): 1 for e in entries}
    assert {r["status"] for r in final} == {"pass"}


def test_progress_line_counts_configs_eta_and_pass_rate_per_mode() -> None:
    now = [100.0]
    lines: list[str] = []

    class Stream:
        def write(self, s: str) -> None:
            lines.append(s)

        def flush(self) -> None:
            pass

    p = RunProgress(["eager", "compiled"], stream=Stream(), interval=10.0, clock=lambda: now[0])
    p.record({"mode": "eager", "status": "harness_error"})  # at plan time: reached nothing
    p.start(4)
    assert p.line() == "compat: 0/4 configs · 0s elapsed · ETA ? · pass eager – · compiled –"
    now[0] += 30
    p.record({"mode": "eager", "status": "pass"})
    p.record({"mode": "compiled", "status": "compile_fail"})
    p.config_done()
    assert p.line() == (
        "compat: 1/4 configs · 30s elapsed · ETA 1m30s · pass eager 100% (1/1) · compiled 0% (0/1)"
    )
    now[0] += 5  # within the interval: no second line
    p.record({"mode": "eager", "status": "fail_accuracy"})
    p.config_done()
    assert len([x for x in lines if x.strip()]) == 1
    now[0] += 25
    p.config_done()
    p.config_done()  # the last config always prints
    printed = [x.strip() for x in lines if x.strip()]
    assert len(printed) == 3 and printed[-1].startswith("compat: 4/4 configs · 1m00s elapsed · ETA 0s")
    assert "eager 50% (1/2)" in printed[-1]

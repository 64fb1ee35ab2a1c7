"""The runner end to end: worker subprocesses, injected failures (raise, hang, abort, memory, accuracy),
recycling after a crash, dedup attribution, SIGKILL + resume, real models in eager and compiled mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from compat.results import read_records
from compat.runner import run_models

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setenv("COMPAT_ENABLE_FAKES", "1")


def _by_id(records):
    return {(r["model_id"], r["mode"]): r for r in records}


def _covered(records):
    """(id, mode) -> how many records answer for it (directly or through attributed_ids)."""
    c: Counter = Counter()
    for r in records:
        for mid in dict.fromkeys([r["model_id"], *r.get("attributed_ids", [])]):
            c[(mid, r["mode"])] += 1
    return c


def test_injected_failures_each_get_their_status_and_the_run_goes_on(fakes, tmp_path):
    ids = [
        "fake/pass",
        "fake/raise",
        "fake/missing-op",
        "fake/hang",
        "fake/abort",
        "fake/pass#after-abort",
        "fake/oom",
        "fake/mismatch",
        "fake/nondeterministic",
        "fake/bad-inputs",
    ]
    entries = [{"id": i} for i in ids] + [{"id": "org/unknown", "architecture": "NoSuchModelClass"}]
    t0 = time.monotonic()
    recs = run_models(entries, tmp_path, modes=("eager",), timeout_s=6, mem_limit_mb=1200, progress=False)
    elapsed = time.monotonic() - t0
    got = {mid: r["status"] for (mid, _), r in _by_id(recs).items()}
    assert got == {
        "fake/pass": "pass",
        "fake/raise": "fail_to_run",
        "fake/missing-op": "fail_to_run",
        "fake/hang": "timeout",
        "fake/abort": "crash",
        "fake/pass#after-abort": "pass",  # a recycled worker picked up the next model
        "fake/oom": "oom",
        "fake/mismatch": "fail_accuracy",
        "fake/nondeterministic": "eager_nondeterministic",
        "fake/bad-inputs": "harness_error",
        "org/unknown": "harness_error",
    }
    r = _by_id(recs)
    assert r[("fake/missing-op", "eager")]["missing_op"] == "aten::fake_op.Tensor"
    assert r[("fake/raise", "eager")]["error_class"] == "RuntimeError"
    assert "SIGABRT" in r[("fake/abort", "eager")]["error"]
    assert "cap" in r[("fake/oom", "eager")]["error"]
    assert "6s" in r[("fake/hang", "eager")]["error"]
    assert r[("fake/mismatch", "eager")]["rmse"]["out_vs_fp64"] > 0.5
    assert "NoSuchModelClass" in r[("org/unknown", "eager")]["error"]
    assert r[("fake/pass", "eager")]["times"]["steady_s"] is not None
    # the file holds exactly what was returned, one line per record
    assert [json.dumps(x, sort_keys=True) for x in read_records(tmp_path / "results.jsonl")] == [
        json.dumps(x, sort_keys=True) for x in recs
    ]
    assert elapsed < 90


def test_missing_compile_backend_is_compile_fail_and_defer_and_fuse_skips_on_cpu(fakes):
    """In-process (no worker): the mode runner's own verdicts for an unusable backend or eager mode."""
    import torch

    from compat.modes import run_mode

    model = torch.nn.Linear(2, 2)
    inputs = {"input": torch.ones(1, 2)}
    ref = model(**inputs).detach()
    res = run_mode(
        lambda dev: model, inputs, "compiled", "cpu", ref, None, 1e-3, compile_backend="no_such_backend"
    )
    assert res.status == "compile_fail" and "'no_such_backend' is not registered" in res.error
    res = run_mode(lambda dev: model, inputs, "defer_and_fuse", "cpu", ref, None, 1e-3)
    assert res.status == "skipped" and "DeferAndFuse" in res.error
    res = run_mode(lambda dev: model, inputs, "eager", "cpu", ref, None, 1e-3)
    assert res.status == "pass" and res.times["steady_s"] is not None


DRIVER = textwrap.dedent(
    """
    import json, sys
    from compat.runner import run_models
    entries = json.loads(sys.argv[2])
    run_models(entries, sys.argv[1], modes=("eager", "defer_and_fuse"), jobs=2, resume=True, progress=False)
    """
)


def test_sigkill_mid_run_then_resume_keeps_every_model_exactly_once(fakes, tmp_path):
    entries = [{"id": f"fake/slow-0.15#{i}"} for i in range(10)]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(driver), str(out), json.dumps(entries)], env=env, cwd=ROOT)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if results.exists() and len(read_records(results)) >= 4:
            break
        time.sleep(0.05)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_records(results)
    assert 4 <= len(before) < 20, "the kill should land mid-run"
    # workers die with their parent: nothing keeps running (or writing) behind our back
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    recs = run_models(entries, out, modes=("eager", "defer_and_fuse"), jobs=2, resume=True, progress=False)
    final = read_records(results)
    assert len(final) == len(before) + len(recs)
    cov = _covered(final)
    expected = {(e["id"], m) for e in entries for m in ("eager", "defer_and_fuse")}
    assert set(cov) == expected and set(cov.values()) == {1}
    assert all(r["status"] in ("pass", "skipped") for r in final)
    slots = {p.name.split("-")[1] for p in (out / "_work" / "logs").glob("worker-*.log")}
    assert slots == {"0", "1"}  # -j 2: two workers, each reused across models


def test_real_models_eager_and_compiled_with_dedup(tmp_path):
    entries = [
        {"id": "org/bert-a", "architecture": "BertForMaskedLM", "task": "fill-mask"},
        {"id": "org/bert-b", "architecture": "BertForMaskedLM", "task": "fill-mask"},
        {"id": "org/tiny-llama", "architecture": "LlamaForCausalLM", "task": "text-generation"},
        {"id": "org/timm", "architecture": "TimmWrapperForImageClassification"},
    ]
    recs = run_models(entries, tmp_path, modes=("eager", "compiled"), timeout_s=240, progress=False)
    r = _by_id(recs)
    for mid in ("org/bert-a", "org/tiny-llama"):
        for mode in ("eager", "compiled"):
            rec = r[(mid, mode)]
            assert rec["status"] == "pass", rec["error"]
            assert (
                rec["times"]["load_s"] > 0
                and rec["times"]["first_call_s"] > 0
                and rec["times"]["steady_s"] > 0
            )
            assert rec["peak_mem_bytes"] is not None
        assert (
            r[(mid, "compiled")]["graph_breaks"] == 0
            and r[(mid, "compiled")]["compile_backend"] == "aot_eager"
        )
    # bert-b has the same effective config: it ran once, attributed to both
    assert ("org/bert-b", "eager") not in r
    assert r[("org/bert-a", "eager")]["attributed_ids"] == ["org/bert-a", "org/bert-b"]
    assert r[("org/timm", "eager")]["status"] == "skipped"
    cov = _covered(recs)
    assert set(cov.values()) == {1} and len(cov) == 4 * 2


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown mode"):
        run_models(["x"], tmp_path, modes=("fast",))
    with pytest.raises(ValueError, match="unknown tier"):
        run_models(["x"], tmp_path, tier="cloud")
    with pytest.raises(ValueError, match="shard"):
        run_models(["x"], tmp_path, shard="3/2")

"""Attribution (compat/attribution.py): a failure on tpu is re-run on CPU without hf_tpu; one that fails the
same way there is `upstream` and the report counts it apart from ours.

The end-to-end tests run real models through the real runner on the real tpu device (JAX's CPU platform):
UDOP's encoder indexes a bool mask with 0-d index tensors, which Dynamo's fake tensors cannot run on any
device (a compile failure PyTorch gives on CPU under aot_eager too); PaliGemma's tiny Gemma with
bidirectional attention computes wrong logits under torch.compile on CPU too; `fake/hash-tensor` is a real
module using `torch.hash_tensor`, which CPU runs and hf_tpu has no lowering for: it fails on tpu only.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from compat.attribution import attribute, normalize_message, same_way, signature
from compat.report import generate
from compat.runner import run_models

UDOP = {
    "id": "microsoft/udop-large",
    "architecture": "UdopForConditionalGeneration",
    "task": "image-text-to-text",
}
PALIGEMMA = {
    "id": "google/paligemma-3b-mix-224",
    "architecture": "PaliGemmaForConditionalGeneration",
    "task": "image-text-to-text",
}


def _raise(exc: BaseException):
    try:
        raise exc
    except BaseException as e:
        return e


def _wrapped(outer: type, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer("wrapper: " + str(e)) from e
    except BaseException as e:
        return e


def test_same_way_takes_devices_out_and_nothing_else():
    tpu = signature(
        _wrapped(ValueError, RuntimeError("Expected all on device='tpu:0', got tensor at 0x7f12"))
    )
    cpu = signature(_wrapped(ValueError, RuntimeError("Expected all on device='cpu', got tensor at 0x55aa")))
    assert tpu["outer"] == "ValueError" and tpu["root"] == "RuntimeError"
    assert same_way(tpu, cpu)[0]
    # another message, another root type, another outer type: not the same failure
    other_msg = signature(_wrapped(ValueError, RuntimeError("shape mismatch on cpu")))
    assert same_way(tpu, other_msg) == (False, same_way(tpu, other_msg)[1])
    assert "message differs" in same_way(tpu, other_msg)[1]
    other_root = signature(_wrapped(ValueError, TypeError("Expected all on device='cpu', got tensor at 0x1")))
    assert not same_way(tpu, other_root)[0] and "root cause type" in same_way(tpu, other_root)[1]
    other_outer = signature(
        _wrapped(KeyError, RuntimeError("Expected all on device='cpu', got tensor at 0x1"))
    )
    assert not same_way(tpu, other_outer)[0]
    assert normalize_message("FakeTensor(..., device='tpu:0', size=(2,))") == "FakeTensor(..., size=(2,))"
    assert normalize_message("a tensor on tpu:0") == normalize_message("a tensor on cpu")


def test_a_cpu_rerun_that_runs_too_long_is_killed_and_says_so(monkeypatch):
    monkeypatch.setenv("COMPAT_ENABLE_FAKES", "1")
    from compat.materialize import plan_entry

    plan = plan_entry({"id": "fake/hash-tensor"})
    t0 = time.monotonic()
    got = attribute(
        plan=plan,
        path=plan.model_id,
        kwargs={"x": torch.randn(2, 8)},
        mode="compiled",
        status="fail_to_run",
        exception=_raise(RuntimeError("boom")),
        device_output=None,
        ref={"logits": torch.zeros(2, 8)},
        fp64=None,
        tol=1e-3,
        timeout_s=0.2,  # less than the child needs to import torch
    )
    assert time.monotonic() - t0 < 15
    assert got["verdict"] == "inconclusive" and "did not finish within 0.2s" in got["detail"]
    # modes and statuses without a meaningful CPU re-run are not attributed at all
    for mode, status in (("eager", "fail_accuracy"), ("train", "fail_to_run"), ("compiled", "timeout")):
        assert (
            attribute(
                plan=plan, path=plan.model_id, kwargs={}, mode=mode, status=status, exception=None,
                device_output=None, ref=None, fp64=None, tol=1e-3,
            )
            is None
        )  # fmt: skip


def _by(records):
    return {(r["model_id"], r["mode"]): r for r in records}


def test_a_real_upstream_compile_failure_is_upstream_and_a_tpu_only_one_is_ours(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPAT_ENABLE_FAKES", "1")
    recs = run_models(
        [UDOP, {"id": "fake/hash-tensor"}],
        tmp_path,
        device="tpu",
        modes=("eager", "compiled"),
        timeout_s=400,
        progress=False,
    )
    r = _by(recs)
    udop = r[(UDOP["id"], "compiled")]
    assert udop["status"] == "compile_fail", udop["error"]
    assert udop["cause"] == "upstream", udop["attribution"]
    att = udop["attribution"]
    assert att["verdict"] == "upstream" and "aot_eager" in att["rerun"] and att["seconds"] > 0
    assert "TorchRuntimeError" in att["cpu_error"]  # the CPU re-run's own exception, kept as evidence
    assert r[(UDOP["id"], "eager")]["status"] == "pass"
    assert r[(UDOP["id"], "eager")]["attribution"] is None

    for mode, rerun in (("eager", "meta kernel"), ("compiled", "aot_eager")):
        h = r[("fake/hash-tensor", mode)]
        assert h["status"] in ("fail_to_run", "compile_fail") and "hash_tensor" in h["error"], h
        assert h["cause"] is None
        assert h["attribution"]["verdict"] == "ours", h["attribution"]
        assert rerun in h["attribution"]["rerun"]

    # the report counts the upstream failure apart from ours: per mode, in the headline, in its own table
    rep = generate(tmp_path)
    compiled = rep.summary["per_mode"]["compiled"]
    assert (compiled["upstream"], compiled["ours"], compiled["pass"]) == (1, 1, 0)
    assert rep.summary["per_mode"]["eager"]["upstream"] == 0
    assert rep.summary["overall"]["upstream"] == 1
    assert [u["model_id"] for u in rep.summary["upstream_failures"]] == [UDOP["id"]]
    md = (tmp_path / "report.md").read_text()
    assert "**1 upstream**" in md and "**2 ours**" in md
    section = md.split("## Upstream failures", 1)[1].split("\n## ", 1)[0]
    assert UDOP["id"] in section and "fake/hash-tensor" not in section
    assert json.loads((tmp_path / "summary.json").read_text())["overall"]["upstream"] == 1


@pytest.mark.slow
def test_a_real_upstream_accuracy_failure_under_compile_is_upstream(tmp_path):
    """PaliGemma (tiny Gemma, bidirectional attention): wrong under torch.compile on CPU too, and the tpu
    output is as wrong as CPU's (it passes the accuracy rule against the CPU aot_eager output)."""
    recs = run_models([PALIGEMMA], tmp_path, device="tpu", modes=("compiled",), timeout_s=400, progress=False)
    (rec,) = recs
    assert rec["status"] == "fail_accuracy", rec["error"]
    assert rec["cause"] == "upstream", rec["attribution"]
    assert "wrong on CPU too" in rec["attribution"]["detail"]

"""A shrunk checkpoint stays under the size cap: shrunk harder when over it, a clear harness error when it
cannot get under (issue: a run's disk and memory stay bounded; ACE-Step and a GPTQ model hit the worker's
memory cap while materializing in the 5,000 run)."""

from __future__ import annotations

import json

import pytest

from compat.materialize import HarnessError, checkpoint_bytes, fit_checkpoint_cap, plan_entry
from tests.compat.in_process import run_plan

GPT2 = {
    "id": "openai-community/gpt2",
    "model_type": "gpt2",
    "architecture": "GPT2LMHeadModel",
    "task": "text-generation",
}


def test_over_the_cap_the_config_is_shrunk_harder_and_the_model_still_runs(tmp_path, monkeypatch):
    plan = plan_entry(GPT2)
    size = checkpoint_bytes(plan)
    assert size and size > 2**20  # the normal shrink: two layers, a 1,000-token vocabulary
    monkeypatch.setenv("COMPAT_MAX_CHECKPOINT_MB", str(size / 2 / 2**20))
    records = run_plan(plan, tmp_path, modes=("eager",))
    assert [r["status"] for r in records] == ["pass"], records
    # the worker wrote the harder config, and ran it (inputs built for its vocabulary) against CPU
    (saved,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/config.json")]
    assert saved["n_layer"] == 1 and saved["vocab_size"] == 256
    assert any("shrunk harder" in n for n in records[0].get("notes") or []), records[0].get("notes")
    fit_checkpoint_cap(plan, cap_bytes=int(size / 2))
    assert checkpoint_bytes(plan) <= size / 2


def test_under_the_cap_nothing_changes():
    plan = plan_entry(GPT2)
    before = dict(plan.config)
    fit_checkpoint_cap(plan, cap_bytes=checkpoint_bytes(plan))
    assert plan.config == before and not any("harder" in n for n in plan.notes)


def test_still_over_the_cap_is_a_harness_error_naming_sizes_and_knob():
    plan = plan_entry(GPT2)
    before = dict(plan.config)
    with pytest.raises(
        HarnessError, match=r"over the 0\.0 MB cap, and shrunk harder it is still .*COMPAT_MAX_CHECKPOINT_MB"
    ):
        fit_checkpoint_cap(plan, cap_bytes=1000)
    assert plan.config == before  # nothing half-changed

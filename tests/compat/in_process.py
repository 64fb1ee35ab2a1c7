"""The worker's real per-model pipeline (materialize, from_pretrained, inputs, references, modes), run in
this process instead of a supervised subprocess: for tests that check what one model's run records."""

from __future__ import annotations


def run_plan(plan, tmp_path, modes=("eager",), **task) -> list[dict]:
    """The records `compat.worker.run_task` emits for `plan` on CPU (`task`: extra task fields)."""
    from compat.worker import run_task

    records: list[dict] = []
    spec = {
        "plan": plan.to_dict(),
        "modes": list(modes),
        "device": "cpu",
        "base": {"model_id": plan.model_id, "attributed_ids": [plan.model_id], "dedup_key": plan.dedup_key},
        "cache_dir": str(tmp_path),
        **task,
    }
    run_task(spec, lambda kind, payload: records.append(payload) if kind == "record" else None)
    return records

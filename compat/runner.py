"""``run_models``: plan, deduplicate, resume, execute and record a set of sample entries.

The parent plans every entry (cheap: configs only) so that models with an identical effective config run
once and the record is attributed to all of them; planning failures and skips are recorded right here; the
rest goes to an executor whose workers run each model in its own process. Every record is appended to
``out_dir/results.jsonl`` the moment it exists.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from compat.attribution import ATTRIBUTION_TIMEOUT_S
from compat.executors import make_executor, select_shard
from compat.interrupt import RunInterrupted, stop_on_signals
from compat.materialize import DEFAULT_HUB_MAX_PARAMS, TIERS, HarnessError, plan_entry
from compat.progress import RunProgress
from compat.records import MODES, record_for
from compat.results import ResultsWriter, load_done, set_aside
from compat.supervise import WorkerConfig


def normalize_entries(entries: Iterable[dict[str, Any] | str]) -> list[dict[str, Any]]:
    """Sample entries as dicts with an ``id``; bare strings become ``{"id": ...}``; repeated ids run once."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for e in entries:
        entry = {"id": e} if isinstance(e, str) else dict(e)
        if "id" not in entry and "model_id" in entry:
            entry["id"] = entry["model_id"]
        mid = str(entry.get("id") or "")
        if mid in seen:
            continue
        seen.add(mid)
        out.append(entry)
    return out


def run_models(
    entries: Sequence[dict[str, Any] | str],
    out_dir: str | os.PathLike[str],
    device: str = "cpu",
    modes: Sequence[str] = ("eager", "compiled"),
    jobs: int = 1,
    executor: str = "local",
    address: str | None = None,
    resume: bool = False,
    shard: tuple[int, int] | str | None = None,
    timeout_s: float = 300,
    mem_limit_mb: int = 4096,
    tier: str = "offline",
    compile_backend: str | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    hub_max_params: int = DEFAULT_HUB_MAX_PARAMS,
    threads_per_worker: int | None = None,
    stop: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """Run every entry in every mode on ``device``; returns the records written by this call.

    ``resume`` skips (model_id, mode) pairs already in ``out_dir/results.jsonl``; without it an existing
    results file is set aside (renamed ``*.bak``) and the run starts afresh. ``compile_backend`` None means
    ``tpu`` on the tpu device and ``aot_eager`` elsewhere. ``shard`` is ``(i, N)`` or ``"i/N"``, 0 <= i < N.
    Workers default to one torch thread each: shrunk models are tiny, parallelism comes from ``jobs``.

    SIGINT/SIGTERM (or setting ``stop``) ends the run cleanly: workers are killed, nothing is recorded for
    the models in flight, the results file is closed, and ``RunInterrupted`` says how many are left for
    ``resume=True``.
    """
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {bad}; expected a subset of {MODES}")
    if not modes:
        raise ValueError("no modes to run")
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; expected one of {', '.join(TIERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    work = out / "_work"
    cache = Path(cache_dir) if cache_dir else work / "models"
    keep_models = cache_dir is not None
    todo_entries = select_shard(normalize_entries(entries), shard)
    if resume:
        done = load_done(results_path)
    else:
        set_aside(results_path)
        done = set()

    collected: list[dict[str, Any]] = []
    pending = [(e, [m for m in modes if (str(e.get("id")), m) not in done]) for e in todo_entries]
    pending = [(e, needed) for e, needed in pending if needed]
    bar = RunProgress(modes, enabled=progress)
    writer = ResultsWriter(results_path)
    stop = stop or threading.Event()

    def on_record(rec: dict[str, Any]) -> None:
        writer.append(rec)
        collected.append(rec)
        bar.record(rec)

    try:
        with stop_on_signals(stop):
            bar.planning(len(pending))
            tasks = _plan_tasks(
                pending, device, tier, hub_max_params, str(cache), compile_backend, on_record, stop
            )
            for t in tasks:
                # the run's own work cache is dropped model by model (a 5,000-model run's checkpoints
                # filled a disk); an explicit cache_dir is kept for reuse
                t["keep_model"] = keep_models
                # a failure's CPU re-run (compat.attribution) is bounded like a model, never longer
                t["attribution_timeout_s"] = min(ATTRIBUTION_TIMEOUT_S, timeout_s)
                t["mem_limit_mb"] = mem_limit_mb  # the re-run's process counts against the worker's cap
            if tasks and not stop.is_set():
                config = WorkerConfig(
                    tier=tier,
                    device=device,
                    threads=threads_per_worker or 1,
                    mem_limit_mb=mem_limit_mb,
                    log_dir=str(work / "logs"),
                    preload=_preload_for(tasks, modes),
                )
                ex = make_executor(executor, jobs, config, timeout_s, address)
                bar.start(len(tasks))
                ex.run(tasks, on_record, lambda t: bar.config_done(), stop=stop)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            bar.close()
    if stop.is_set():
        covered = {(m, r["mode"]) for r in collected for m in [r["model_id"], *r.get("attributed_ids", [])]}
        left = sum(1 for e, needed in pending for m in needed if (str(e.get("id")), m) not in covered)
        raise RunInterrupted(collected, left, str(results_path))
    return collected


def _plan_tasks(
    pending: list[tuple[dict[str, Any], list[str]]],
    device: str,
    tier: str,
    hub_max_params: int,
    cache: str,
    compile_backend: str | None,
    on_record: Any,
    stop: threading.Event,
) -> list[dict[str, Any]]:
    """Plan entries, record planning failures and skips, group duplicates into one task each."""
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[dict[str, Any], Any]]] = {}
    for entry, needed in pending:
        if stop.is_set():
            return []
        try:
            plan = plan_entry(entry, tier=tier, hub_max_params=hub_max_params)
        except Exception as exc:
            msg = (
                str(exc)
                if isinstance(exc, HarnessError)
                else f"{entry.get('id')}: {type(exc).__name__}: {exc}"
            )
            for m in needed:
                on_record(
                    record_for(
                        entry,
                        m,
                        device,
                        "harness_error",
                        phase="plan",
                        error_class=type(exc).__name__,
                        error=msg,
                        tier=tier,
                    ).to_dict()
                )
            continue
        groups.setdefault((plan.dedup_key, tuple(needed)), []).append((entry, plan))
    tasks = []
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    for (_key, needed), members in groups.items():
        entry, plan = members[0]
        ids = [str(e["id"]) for e, _ in members]
        base = {
            "model_id": str(entry["id"]),
            "model_type": entry.get("model_type") or plan.model_type,
            "architecture": entry.get("architecture") or plan.architecture,
            "task": plan.task,
            "modality": plan.modality,
            "library": plan.library,
            "model_class": plan.model_class,
            "dedup_key": plan.dedup_key,
            "attributed_ids": ids,
            "tier": tier,
        }
        if plan.skip:
            for m in needed:
                on_record(
                    record_for(
                        entry, m, device, "skipped", phase="plan", error=plan.skip, **_extra(base)
                    ).to_dict()
                )
            continue
        tasks.append(
            {
                "plan": plan.to_dict(),
                "modes": list(needed),
                "device": device,
                "base": base,
                "cache_dir": cache,
                "compile_backend": compile_backend,
                "n_models": len(ids),
                "queued_at": now,
            }
        )
    return tasks


def _preload_for(tasks: list[dict[str, Any]], modes: Sequence[str]) -> tuple[str, ...]:
    """Modules a worker imports before it says ready, so imports never count against a model's timeout."""
    libs = {t["plan"]["library"] for t in tasks}
    mods = [lib for lib in ("transformers", "diffusers") if lib in libs]
    if "compiled" in modes:
        mods.append("torch._dynamo")
    return tuple(mods)


def _extra(base: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in base.items()
        if k not in ("model_id", "model_type", "architecture", "task", "modality", "library")
    }

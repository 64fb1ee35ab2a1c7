"""The worker process: runs one model at a time, reporting phases and records over a pipe.

Per model: build (materialize), load on CPU, build inputs, CPU reference twice (must agree bitwise), fp64
reference, then each requested mode on the target device (``train``: a training step against a CPU
training-step reference of its own, see ``run_train``). The parent (compat.supervise) owns timeouts,
the memory cap and recycling; this side only reports what happened. Anything the harness itself cannot
do (config, inputs, a CPU reference that fails) is ``harness_error``, never a backend failure.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Emit = Callable[[str, dict[str, Any]], None]


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the parent: PR_SET_PDEATHSIG plus a ppid watcher (the kill/resume guarantee)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def main(conn: Any, config: dict[str, Any]) -> None:
    """The worker loop: announce readiness, then run tasks until told to stop or the pipe closes."""
    _die_with_parent(config["parent_pid"])
    # Ctrl-C reaches the whole process group: the parent alone decides (it kills us and records nothing
    # for the model in flight); a KeyboardInterrupt here would be recorded as the model failing
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if config.get("tier", "offline") in ("offline", "real"):  # nothing may reach the Hub
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    for k, v in (config.get("env") or {}).items():
        os.environ[k] = str(v)
    import torch

    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    if config.get("device"):
        # an out-of-tree device registers before transformers/diffusers build their import-time caches
        from compat.modes import ensure_device

        with contextlib.suppress(Exception):
            ensure_device(config["device"])
    for mod in config.get("preload", ()):
        with contextlib.suppress(Exception):
            __import__(mod)
    # Imported modules live forever: keep them out of every later collection (a full gc.collect()
    # over transformers' object graph costs ~0.5 s, once per model otherwise).
    gc.collect()
    gc.freeze()
    conn.send(("ready", {"pid": os.getpid()}))
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if kind == "stop":
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # skip interpreter teardown (seconds with torch + transformers loaded)

        def emit(k: str, p: dict[str, Any]) -> None:
            conn.send((k, p))

        try:
            run_task(payload, emit)
        except BaseException as exc:  # the task loop itself failed: report and keep the worker alive
            emit("error", {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        gc.collect()
        emit("done", {"rss": _rss()})


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def run_task(task: dict[str, Any], emit: Emit) -> None:
    """Run one model (a dedup group's representative) in every requested mode, emitting a record per mode;
    then delete its materialized checkpoint unless the task says to keep it."""
    try:
        _run_task(task, emit)
    finally:
        if not task.get("keep_model", True):
            _drop_checkpoint(task)


def _drop_checkpoint(task: dict[str, Any]) -> None:
    key = str(task.get("plan", {}).get("dedup_key") or "")
    if key and task.get("cache_dir"):
        import shutil

        shutil.rmtree(Path(task["cache_dir"]) / key[:24], ignore_errors=True)


def _run_task(task: dict[str, Any], emit: Emit) -> None:
    import torch

    from compat import fakes
    from compat.accuracy import exactly_equal, to_cpu
    from compat.attribution import ATTRIBUTION_TIMEOUT_S, attribute, attribution_mb, rerun_for
    from compat.input_basics import strip_private
    from compat.inputs import build_inputs, cast_floating, refit_image_tokens
    from compat.materialize import HarnessError, Plan, load_model, materialize
    from compat.modes import device_type as device_type_of
    from compat.modes import ensure_device, run_mode
    from compat.overrides import override_for
    from compat.records import Record, exception_chain_text

    plan = Plan.from_dict(task["plan"])
    modes: list[str] = list(task["modes"])
    device: str = task["device"]
    base = dict(task["base"])
    is_fake = plan.library == "fake"

    def record(mode: str, status: str, **kw: Any) -> None:
        fields = dict(base)
        fields.update(kw)
        emit("record", Record(mode=mode, device=device, status=status, **fields).to_dict())

    def all_modes(status: str, **kw: Any) -> None:
        for m in modes:
            record(m, status, **kw)

    def phase(name: str, mode: str | None = None) -> None:
        emit("phase", {"phase": name, "mode": mode})

    if plan.skip:
        all_modes("skipped", phase="plan", error=plan.skip)
        return
    tol = override_for(plan.model_type).tolerance or task.get("tolerance") or 1e-3
    stage = "download" if plan.tier == "hub" and not is_fake else "materialize"
    try:
        phase(stage)
        if is_fake:
            fakes.set_phase("reference")
        torch.manual_seed(0)
        path = materialize(plan, task["cache_dir"])
        stage = "reference_load"
        ref_model = load_model(plan, path)
        stage = "inputs"
        phase(stage)
        kwargs = build_inputs(ref_model, plan)
        stage = "reference"
        phase(stage)
        with torch.no_grad():
            for _attempt in range(3):
                try:
                    ref1 = to_cpu(ref_model(**strip_private(kwargs)))
                    break
                except Exception as exc:
                    if not refit_image_tokens(ref_model, plan, kwargs, exc):
                        raise
            ref2 = to_cpu(ref_model(**strip_private(kwargs)))
    except HarnessError as exc:
        all_modes("harness_error", phase=stage, error_class=type(exc).__name__, error=str(exc))
        return
    except ImportError as exc:  # an optional library the model needs (timm, natten, ...) is not installed
        all_modes(
            "skipped", phase=stage, error_class=type(exc).__name__, error=" ".join(str(exc).split())[:500]
        )
        return
    except MemoryError as exc:
        all_modes("oom", phase=stage, error_class=type(exc).__name__, error=f"during the CPU {stage}: {exc}")
        return
    except Exception as exc:
        msg = (
            f"the CPU {stage} failed (a harness/builder problem, not the backend's): "
            + exception_chain_text(exc)
        )
        all_modes("harness_error", phase=stage, error_class=type(exc).__name__, error=msg)
        return
    same, why = exactly_equal(ref1, ref2)
    if not same:
        all_modes("eager_nondeterministic", phase="reference", error=why)
        return
    notes: list[str] = list(plan.notes)
    try:
        ensure_device(device)
    except RuntimeError as exc:
        all_modes("harness_error", phase="device", error_class=type(exc).__name__, error=str(exc))
        return
    fp64 = None
    with contextlib.suppress(Exception):
        del ref2
    try:
        phase("fp64_reference")
        m64 = copy.deepcopy(ref_model).to(torch.float64)
        with torch.no_grad():
            fp64 = to_cpu(m64(**cast_floating(strip_private(kwargs), torch.float64)))
        del m64
    except Exception as exc:
        notes.append(f"fp64 reference unavailable ({type(exc).__name__}: {str(exc)[:200]}); allclose only")
    del ref_model

    for mode in modes:
        if is_fake:
            fakes.set_phase("target")

        def load(dev: str, _plan: Plan = plan, _path: str = path) -> Any:
            return load_model(_plan, _path, dev)

        if mode == "train":
            res = run_train(plan, path, kwargs, device, tol, on_phase=lambda p: phase(p, "train"))
        else:
            res = run_mode(
                load,
                kwargs,
                mode,
                device,
                ref1,
                fp64,
                tol,
                task.get("compile_backend"),
                on_phase=lambda p, _m=mode: phase(p, _m),
            )
        attribution = None
        real = not is_fake or plan.config.get("behaviour") in fakes.REAL_BEHAVIOURS
        if real and device_type_of(device) != "cpu" and rerun_for(mode, res.status):
            # the same model and inputs on CPU without hf_tpu: does PyTorch fail this way too?
            budget = float(task.get("attribution_timeout_s") or ATTRIBUTION_TIMEOUT_S)
            cap_mb = float(task.get("mem_limit_mb") or 0)
            held_mb, need_mb = _rss() / 2**20, attribution_mb(path)
            if cap_mb and held_mb + need_mb > 0.9 * cap_mb:
                # the re-run's process counts against the worker's cap: past it, a mode that merely
                # failed would be recorded as oom
                attribution = {
                    "verdict": "inconclusive",
                    "rerun": None,
                    "detail": f"not re-run on CPU: the worker holds {held_mb:.0f} MiB and the re-run needs "
                    f"about {need_mb:.0f} MiB more, over 90% of the {cap_mb:.0f} MiB cap",
                    "seconds": 0.0,
                }
            else:
                emit("phase", {"phase": "attribution", "mode": mode, "extend_s": budget + 30})
                attribution = attribute(
                    plan=plan,
                    path=path,
                    kwargs=kwargs,
                    mode=mode,
                    status=res.status,
                    exception=res.exception,
                    device_output=res.output,
                    ref=ref1,
                    fp64=fp64,
                    tol=res.tolerance or tol,
                    timeout_s=budget,
                )
        res.exception = res.output = None
        cmp = res.comparison
        record(
            mode,
            res.status,
            phase=res.phase,
            error_class=res.error_class,
            error=res.error,
            missing_op=res.missing_op,
            graph_breaks=res.graph_breaks,
            times=res.times,
            peak_mem_bytes=res.peak_mem_bytes,
            max_abs_diff=cmp.max_abs_diff if cmp else None,
            rmse=cmp.rmse if cmp else None,
            tolerance=res.tolerance or tol,
            compile_backend=res.compile_backend,
            notes=notes + res.notes,
            cause="upstream" if attribution and attribution["verdict"] == "upstream" else None,
            attribution=attribution,
        )
        if is_fake:
            fakes.set_phase("reference")


def run_train(
    plan: Any,
    path: str,
    kwargs: dict[str, Any],
    device: str,
    tol: float,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> Any:
    """The ``train`` mode of one model: labels, the CPU training-step reference, then the device step.

    A head without a loss is ``skipped``; labels we cannot build or a CPU step that fails are
    ``harness_error`` (ours, not the backend's); a CPU step that is random is ``eager_nondeterministic``.
    The tolerance is the suite's training one (at least ``TRAIN_TOL``).
    """
    from compat.inputs import NoLoss, label_kwargs
    from compat.materialize import load_model
    from compat.modes import (
        TRAIN_TOL,
        ModeResult,
        NondeterministicReference,
        run_train_mode,
        train_reference,
    )
    from compat.records import exception_chain_text

    ttol = max(tol, TRAIN_TOL)
    stage = "train_inputs"
    try:
        on_phase(stage)
        cpu_model = load_model(plan, path)
        train_kwargs = {**kwargs, **label_kwargs(cpu_model, plan, kwargs)}
        del cpu_model
        stage = "train_reference"
        on_phase(stage)
        ref = train_reference(lambda: load_model(plan, path), train_kwargs)
    except NoLoss as exc:
        return ModeResult("skipped", phase=stage, error=str(exc), tolerance=ttol)
    except NondeterministicReference as exc:
        return ModeResult("eager_nondeterministic", phase=stage, error=str(exc), tolerance=ttol)
    except MemoryError as exc:
        return ModeResult("oom", phase=stage, error_class=type(exc).__name__, error=f"during the CPU {stage}")
    except Exception as exc:
        msg = (
            f"the CPU {stage} failed (a harness/builder problem, not the backend's): "
            + exception_chain_text(exc)
        )
        return ModeResult(
            "harness_error", phase=stage, error_class=type(exc).__name__, error=msg, tolerance=ttol
        )
    return run_train_mode(
        lambda dev: load_model(plan, path, dev), train_kwargs, device, ref, ttol, on_phase=on_phase
    )


if __name__ == "__main__":
    import json
    from multiprocessing.connection import Connection

    _cfg = json.loads(sys.argv[1])
    main(Connection(_cfg["fd"]), _cfg)

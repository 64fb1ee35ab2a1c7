"""Run a loaded model in one mode (eager / compiled / defer_and_fuse) on a device and measure it.

Device-agnostic: the device is a string for ``from_pretrained(device_map=...)`` and ``.to()``; anything
device-specific (synchronize, peak memory, eager modes, the dynamo backend) is looked up on
``torch.<device type>`` and skipped when the device module lacks it.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from compat.accuracy import Comparison, compare, to_cpu
from compat.inputs import strip_private, to_device
from compat.records import exception_chain_text, parse_missing_op

STEADY_CALLS = 3


class ModeUnavailable(Exception):
    """The mode cannot run on this device/runtime (recorded as ``skipped``, not as a failure)."""


@dataclass
class ModeResult:
    """What one mode produced; the worker turns it into a Record."""

    status: str
    phase: str | None = None
    error_class: str | None = None
    error: str | None = None
    missing_op: str | None = None
    graph_breaks: int | None = None
    times: dict[str, float | None] = field(
        default_factory=lambda: {"load_s": None, "first_call_s": None, "steady_s": None}
    )
    peak_mem_bytes: int | None = None
    comparison: Comparison | None = None
    compile_backend: str | None = None


def device_type(device: str) -> str:
    return torch.device(device).type


def device_module(device: str) -> Any:
    return getattr(torch, device_type(device), None)


def synchronize(device: str) -> None:
    mod = device_module(device)
    sync = getattr(mod, "synchronize", None)
    if callable(sync):
        with contextlib.suppress(Exception):
            sync()


@contextlib.contextmanager
def eager_mode(device: str, mode: str) -> Iterator[None]:
    """DeferAndFuse for the span of a run when the device runtime offers it (``torch.<dev>.set_eager_mode``)."""
    if mode != "defer_and_fuse":
        yield
        return
    mod = device_module(device)
    modes = getattr(mod, "EagerMode", None)
    setter = getattr(mod, "set_eager_mode", None)
    if modes is None or setter is None or not hasattr(modes, "DEFER_AND_FUSE"):
        raise ModeUnavailable(
            f"device {device!r} has no DeferAndFuse eager mode (torch.{device_type(device)})"
        )
    getter = getattr(mod, "get_eager_mode", None)
    previous = getter() if callable(getter) else getattr(modes, "DEFER_NEVER", None)
    setter(modes.DEFER_AND_FUSE)
    try:
        yield
    finally:
        if previous is not None:
            setter(previous)


def compile_backend_for(device: str, requested: str | None) -> str:
    """The backend asked for; else ``tpu`` on the tpu device and ``aot_eager`` elsewhere (inductor takes
    minutes per model on a 2-core CI machine)."""
    if requested:
        return requested
    return "tpu" if device_type(device) == "tpu" else "aot_eager"


def ensure_device(device: str) -> None:
    """Make sure ``device`` parses; an out-of-tree device may need its runtime imported first.

    With the project installed, torch's device-backend autoload registers ``tpu`` on ``import torch``;
    from a source checkout we import the runtime once. A device that still does not exist is a harness
    error for every mode (the environment's problem, not the model's).
    """
    try:
        torch.device(device)
        return
    except RuntimeError:
        pass
    with contextlib.suppress(ImportError):
        __import__("hf_tpu")
    try:
        torch.device(device)
    except RuntimeError as exc:
        raise RuntimeError(f"device {device!r} is not available in this environment: {exc}") from None


def check_backend(name: str) -> None:
    """Raise a clear error when the TorchDynamo backend is not registered (e.g. 'tpu' before hf_tpu)."""
    from torch._dynamo.backends.registry import lookup_backend

    try:
        lookup_backend(name)
    except Exception as exc:
        raise RuntimeError(
            f"TorchDynamo backend {name!r} is not registered ({type(exc).__name__}); "
            f"is the runtime that provides it installed and imported?"
        ) from None


class PeakMemory:
    """Peak memory of a span: the device allocator's counter when it has one, else a CPU RSS sampler."""

    def __init__(self, device: str) -> None:
        self.mod = device_module(device)
        self.use_device = device_type(device) != "cpu" and hasattr(self.mod, "max_memory_allocated")
        self._stop = threading.Event()
        self._peak = 0
        self._base = 0
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.use_device:
            for name in ("reset_peak_memory_stats", "reset_max_memory_allocated"):
                reset = getattr(self.mod, name, None)
                if callable(reset):
                    with contextlib.suppress(Exception):
                        reset()
                    break
        proc = psutil.Process()
        self._base = self._peak = proc.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.005):
                self._peak = max(self._peak, proc.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    @property
    def bytes(self) -> int | None:
        if self.use_device:
            with contextlib.suppress(Exception):
                return int(self.mod.max_memory_allocated())
        return max(0, self._peak - self._base)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(torch, "OutOfMemoryError", None)
    return oom is not None and isinstance(exc, oom)


def _is_compile_error(exc: BaseException) -> bool:
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, TorchDynamoException)


def run_mode(
    load: Callable[[str], Any],
    inputs: dict[str, Any],
    mode: str,
    device: str,
    ref: Any,
    fp64_ref: Any,
    tol: float,
    compile_backend: str | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> ModeResult:
    """Load on the device, call once (timed), 3 more times (median), compare with the reference."""
    res = ModeResult(status="pass")
    phase = "load"
    model = fn = out = None
    try:
        with eager_mode(device, mode), torch.no_grad(), PeakMemory(device) as mem:
            on_phase(phase)
            t0 = time.perf_counter()
            model = load(device)
            dev_inputs = to_device(strip_private(inputs), device)
            synchronize(device)
            res.times["load_s"] = time.perf_counter() - t0
            fn = model
            if mode == "compiled":
                phase = "compile"
                backend = compile_backend_for(device, compile_backend)
                res.compile_backend = backend
                check_backend(backend)
                torch._dynamo.reset()
                torch._dynamo.utils.counters.clear()
                fn = torch.compile(model, backend=backend)
            phase = "first_call"
            on_phase(phase)
            t0 = time.perf_counter()
            out = to_cpu(fn(**dev_inputs))
            res.times["first_call_s"] = time.perf_counter() - t0
            phase = "steady"
            on_phase(phase)
            steady = []
            for _ in range(STEADY_CALLS):
                t0 = time.perf_counter()
                fn(**dev_inputs)
                synchronize(device)
                steady.append(time.perf_counter() - t0)
            res.times["steady_s"] = statistics.median(steady)
        res.peak_mem_bytes = mem.bytes
        if mode == "compiled":
            res.graph_breaks = int(sum(torch._dynamo.utils.counters["graph_break"].values()))
        phase = "compare"
        cmp = compare(ref, out, fp64_ref, tol)
        res.comparison = cmp
        if not cmp.ok:
            res.status, res.phase, res.error = "fail_accuracy", phase, cmp.detail
    except ModeUnavailable as exc:
        res.status, res.phase, res.error = "skipped", phase, str(exc)
    except Exception as exc:  # every backend failure is data, never a crash of the harness
        text = exception_chain_text(exc)
        res.phase, res.error_class, res.error = phase, type(exc).__name__, text
        res.missing_op = parse_missing_op(text)
        if _is_oom(exc):
            res.status = "oom"
        elif mode == "compiled" and (phase == "compile" or _is_compile_error(exc)):
            res.status = "compile_fail"
        else:
            res.status = "fail_to_run"
        if mode == "compiled":
            with contextlib.suppress(Exception):
                res.graph_breaks = int(sum(torch._dynamo.utils.counters["graph_break"].values()))
    finally:
        del model, fn, out
        if mode == "compiled":
            with contextlib.suppress(Exception):
                torch._dynamo.reset()
    return res

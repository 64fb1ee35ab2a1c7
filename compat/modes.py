"""Run a loaded model in one mode (eager / compiled / defer_and_fuse / train) on a device and measure it.

Device-agnostic: the device is a string for ``from_pretrained(device_map=...)`` and ``.to()``; anything
device-specific (synchronize, peak memory, eager modes, the dynamo backend) is looked up on
``torch.<device type>`` and skipped when the device module lacks it.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from compat.accuracy import Comparison, compare, exactly_equal, to_cpu
from compat.input_basics import strip_private
from compat.inputs import NoLoss, cast_floating, to_device
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
    tolerance: float | None = None  # set when the mode used its own (train: the suite's training tol)
    notes: list[str] = field(default_factory=list)
    # for attribution (compat.attribution), never recorded: the exception itself, the CPU copy of a wrong output
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    output: Any = field(default=None, repr=False, compare=False)


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


def record_failure(res: ModeResult, exc: BaseException, phase: str, mode: str) -> None:
    """A backend exception as data: oom / compile_fail / fail_to_run, the message and the missing op."""
    text = exception_chain_text(exc)
    res.phase, res.error_class, res.error = phase, type(exc).__name__, text
    res.exception = exc
    res.missing_op = parse_missing_op(text)
    if _is_oom(exc):
        res.status = "oom"
    elif mode == "compiled" and (phase == "compile" or _is_compile_error(exc)):
        res.status = "compile_fail"
    else:
        res.status = "fail_to_run"


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
            res.output = out
    except ModeUnavailable as exc:
        res.status, res.phase, res.error = "skipped", phase, str(exc)
    except Exception as exc:  # every backend failure is data, never a crash of the harness
        record_failure(res, exc, phase, mode)
        if mode == "compiled":
            with contextlib.suppress(Exception):
                res.graph_breaks = int(sum(torch._dynamo.utils.counters["graph_break"].values()))
    finally:
        del model, fn, out
        if mode == "compiled":
            with contextlib.suppress(Exception):
                torch._dynamo.reset()
    return res


# -------------------------------------------------------------------------------------------- train mode

TRAIN_TOL = 1e-2  # the TorchDynamo HF suite's training tolerance (1e-3 is its inference one)
TRAIN_LR = 0.1
MAX_GRADS = 16  # gradients compared: the largest-norm ones, all of them when the model has fewer

# Float settings that make a training step random (dropout and its relatives). Zeroed so the step is a
# deterministic function of weights and inputs, on CPU and on the device alike.
_RANDOM_IN_TRAINING = re.compile(
    r"dropout|drop_path|drop_prob|layerdrop|layer_drop|jitter|mask_time_prob|mask_feature_prob", re.I
)


class NondeterministicReference(Exception):
    """Two CPU training steps under different seeds disagree: the step draws random numbers."""


@dataclass
class TrainReference:
    """The CPU training step the device is held to: loss, chosen gradients, updated parameters."""

    ref: dict[str, Any]
    fp64: dict[str, Any] | None
    names: list[str]
    n_grads: int
    notes: list[str] = field(default_factory=list)


def _zero_random_floats(obj: Any, seen: set[int]) -> None:
    if id(obj) in seen or not hasattr(obj, "__dict__"):
        return
    seen.add(id(obj))
    for name, value in list(vars(obj).items()):
        if isinstance(value, float) and value and _RANDOM_IN_TRAINING.search(name):
            with contextlib.suppress(Exception):
                setattr(obj, name, 0.0)
        elif hasattr(value, "to_dict") and not isinstance(value, torch.nn.Module):  # sub-configs
            _zero_random_floats(value, seen)


def disable_dropout(model: Any) -> Any:
    """``model.train()`` with every dropout-like probability at 0: eval semantics for dropout only.

    BatchNorm and friends keep their training behaviour (batch statistics). ``nn.Dropout`` modules get
    p = 0, and float attributes of modules and configs named like dropout / layerdrop / drop_path / jitter /
    SpecAugment mask probabilities are zeroed, since many models read those at forward time.
    """
    model.train()
    seen: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd):
            mod.p = 0.0
        _zero_random_floats(mod, seen)
        cfg = getattr(mod, "config", None)
        if cfg is not None and not isinstance(cfg, dict):
            _zero_random_floats(cfg, seen)
    return model


def loss_of(out: Any) -> torch.Tensor | None:
    """The ``loss`` of a model output (ModelOutput or dict), or None when the head computed none."""
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _sgd(model: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)


def _backward(model: Any, inputs: dict[str, Any], opt: torch.optim.Optimizer, at: Callable[[str], None]):
    opt.zero_grad(set_to_none=True)
    at("forward")
    loss = loss_of(model(**inputs))
    if loss is None:
        raise NoLoss("no loss for this head (its output has no loss)")
    at("backward")
    (loss if loss.dim() == 0 else loss.mean()).backward()
    return loss


def train_step(
    model: Any,
    inputs: dict[str, Any],
    opt: torch.optim.Optimizer,
    keep: set[str] | None = None,
    at: Callable[[str], None] = lambda phase: None,
) -> dict[str, Any]:
    """Forward with labels, backward of the loss, one optimizer step; CPU copies of the loss, the
    gradients and the updated parameters (only those named in ``keep`` when given)."""
    loss = _backward(model, inputs, opt, at)
    named = [(n, p) for n, p in model.named_parameters() if keep is None or n in keep]
    grads = {n: _host(p.grad) for n, p in named if p.grad is not None}
    at("optimizer_step")
    opt.step()
    params = {n: _host(p) for n, p in named if n in grads}
    return {"loss": _host(loss), "grads": grads, "params": params}


def select_gradients(grads: dict[str, torch.Tensor], n: int = MAX_GRADS) -> list[str]:
    """Names of the ``n`` largest-norm gradients (non-finite ones first), in model order."""
    if len(grads) <= n:
        return list(grads)

    def norm(g: torch.Tensor) -> float:
        v = float(torch.linalg.vector_norm(g.double()))
        return v if math.isfinite(v) else math.inf

    top = set(sorted(grads, key=lambda k: (-norm(grads[k]), k))[:n])
    return [k for k in grads if k in top]


def _subset(step: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {
        "loss": step["loss"],
        "grads": {k: step["grads"][k] for k in names if k in step["grads"]},
        "params": {k: step["params"][k] for k in names if k in step["params"]},
    }


def train_reference(
    load_cpu: Callable[[], Any],
    inputs: dict[str, Any],
    max_grads: int = MAX_GRADS,
    lr: float = TRAIN_LR,
) -> TrainReference:
    """The CPU fp32 step twice on fresh models under seeds 0 and 1 (must agree bitwise, else the step is
    random), the gradients to compare, and the fp64 step for the accuracy rule's arbitration.

    Raises NoLoss when the head computes no loss, NondeterministicReference when the two steps differ.
    """
    inputs = strip_private(inputs)
    runs = []
    for seed in (0, 1):
        model = disable_dropout(load_cpu())
        torch.manual_seed(seed)
        runs.append(train_step(model, inputs, _sgd(model, lr)))
        del model
    same, why = exactly_equal(runs[0], runs[1])
    if not same:
        raise NondeterministicReference(f"two CPU training steps (seeds 0 and 1) differ: {why}")
    ref = runs[0]
    names = select_gradients(ref["grads"], max_grads)
    notes = [
        f"train: loss, {len(names)} of {len(ref['grads'])} gradients (largest norm) and those parameters "
        f"after one SGD step (lr {lr:g})"
    ]
    fp64 = None
    try:
        m64 = disable_dropout(load_cpu().to(torch.float64))
        torch.manual_seed(0)
        fp64 = train_step(m64, cast_floating(inputs, torch.float64), _sgd(m64, lr), keep=set(names))
        del m64
    except Exception as exc:
        notes.append(
            f"train fp64 reference unavailable ({type(exc).__name__}: {str(exc)[:200]}); allclose only"
        )
    return TrainReference(_subset(ref, names), fp64, names, len(ref["grads"]), notes)


def run_train_mode(
    load: Callable[[str], Any],
    inputs: dict[str, Any],
    device: str,
    ref: TrainReference,
    tol: float = TRAIN_TOL,
    lr: float = TRAIN_LR,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> ModeResult:
    """Load on the device, ``train()`` with dropout off, one SGD step (timed) compared with ``ref`` by
    the same accuracy rule as inference, then STEADY_CALLS more steps (median)."""
    res = ModeResult(status="pass", tolerance=tol, notes=list(ref.notes))
    phase = "load"
    model = opt = out = None

    def at(p: str) -> None:
        nonlocal phase
        phase = p
        on_phase(p)

    try:
        with torch.enable_grad(), PeakMemory(device) as mem:
            at("load")
            t0 = time.perf_counter()
            model = disable_dropout(load(device))
            dev_inputs = to_device(strip_private(inputs), device)
            opt = _sgd(model, lr)
            synchronize(device)
            res.times["load_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            torch.manual_seed(0)
            out = train_step(model, dev_inputs, opt, set(ref.names), at)
            res.times["first_call_s"] = time.perf_counter() - t0
            at("steady")
            steady = []
            for _ in range(STEADY_CALLS):
                t0 = time.perf_counter()
                _backward(model, dev_inputs, opt, lambda p: None)
                opt.step()
                synchronize(device)
                steady.append(time.perf_counter() - t0)
            res.times["steady_s"] = statistics.median(steady)
        res.peak_mem_bytes = mem.bytes
        phase = "compare"
        cmp = compare(ref.ref, out, ref.fp64, tol)
        res.comparison = cmp
        if not cmp.ok:
            res.status, res.phase, res.error = "fail_accuracy", phase, cmp.detail
    except Exception as exc:  # a backend failure (forward, backward or optimizer step) is data
        record_failure(res, exc, phase, "train")
    finally:
        del model, opt, out
    return res

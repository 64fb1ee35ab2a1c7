"""Attribution: is a failure on the device ours, or does plain PyTorch/transformers fail the same way on CPU?

A failed mode is re-run once on CPU, in a fresh subprocess that never imports hf_tpu (the device-backend
autoload is off), with the same checkpoint and the same inputs, under a time limit:

- ``compiled`` failures (``compile_fail``, ``fail_to_run``, ``fail_accuracy``) re-run under
  ``torch.compile(backend="aot_eager")``: Dynamo's tracing, fake tensors and AOTAutograd exactly as the
  device's backend gets them, with PyTorch's own eager kernels behind the graph.
- ``eager`` and ``defer_and_fuse`` exceptions (``fail_to_run``) re-run in CPU eager with every aten op
  first evaluated by its meta kernel on meta copies of its arguments. That is the step an out-of-tree
  device's eager path takes for every op (hf_tpu asks each op's meta kernel for the output's shape and
  dtype), so a broken meta kernel or shape rule in PyTorch fails this run as it failed on the device, while
  CPU's own eager kernels never consult it. Eager *accuracy* failures are not re-run: the accuracy rule
  already measures the device against a float64 CPU run, so a second CPU run in float64 says nothing new.

The subprocess keeps hf_tpu out on purpose: hf_tpu patches parts of torch process-wide (a meta kernel,
Dynamo's trace rules), so a CPU re-run in the worker's own process could fail, or pass, because of us.
It also bounds the time: a hung re-run is killed, and the attribution says so.

"The same way" (``same_way``):
- an exception: the outermost exception type (the record's ``error_class``) and the root cause's type are
  equal, the root cause's message is equal once device names (``tpu:0``, ``cpu``, ``device='...'``) and
  memory addresses are taken out, and the innermost frame of model code (transformers/diffusers) named by
  the traceback or by Dynamo's "from user code" is the same file, line and function. For Dynamo's
  fake-tensor failures torch words the root message per device (a FakeTensor's data-pointer check says
  "Cannot access data pointer" for a tpu tensor, "data is not allocated yet" for a CPU one): there the
  failing FX node (op and argument shapes and dtypes, devices taken out) stands in for the message;
- an accuracy failure: the CPU ``aot_eager`` output also fails the accuracy rule against the same CPU
  eager reference, and the device output passes that rule when the CPU ``aot_eager`` output is taken as
  the reference (the device is wrong exactly as much as PyTorch's own compile path, not more).

Verdicts: ``upstream`` (reproduced), ``ours`` (the CPU re-run ran and passed), ``inconclusive`` (it failed
differently, timed out, crashed, or could not start). Only ``upstream`` sets the record's ``cause``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ATTRIBUTION_TIMEOUT_S = 180.0
CHILD_BASE_MB = 900  # a CPU process with torch and transformers imported, before the model
EXCEPTION_STATUSES = ("compile_fail", "fail_to_run")
MODEL_CODE = re.compile(r"[/\\]((?:transformers|diffusers)[/\\].+)$")

_DEVICE_RE = re.compile(
    r",\s*device='[a-z0-9_]+(?::\d+)?'"  # FakeTensor(..., device='tpu:0', ...): CPU ones omit it
    r"|device\(type='[a-z0-9_]+'(?:,\s*index=\d+)?\)"
    r"|\b(?:tpu|cpu|meta|privateuse1)(?::\d+)?\b",
    re.IGNORECASE,
)
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")
_USER_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in ([\w<>.]+)')
_FX_NODE_RE = re.compile(r"Dynamo failed to run FX node with fake tensors: (.*?) got \w+\(", re.DOTALL)


def rerun_for(mode: str, status: str) -> str | None:
    """The CPU re-run that can reproduce this failure, or None when none is meaningful."""
    if mode == "compiled" and status in (*EXCEPTION_STATUSES, "fail_accuracy"):
        return "aot_eager"
    if mode in ("eager", "defer_and_fuse") and status == "fail_to_run":
        return "meta_checked"
    return None


RERUN_NAMES = {
    "aot_eager": 'CPU torch.compile(backend="aot_eager")',
    "meta_checked": "CPU eager with every op's meta kernel checked first",
}


# ------------------------------------------------------------------------------------------- signatures


def normalize_message(text: str, limit: int = 2000) -> str:
    """A message with device names and addresses taken out and whitespace collapsed."""
    text = _DEVICE_RE.sub(lambda m: "" if m.group(0).startswith(",") else "<dev>", str(text))
    text = _ADDR_RE.sub("<addr>", text)
    return " ".join(text.split())[:limit]


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _model_frame(chain: list[BaseException]) -> str | None:
    """The innermost frame in model code: traceback frames first, then Dynamo's "from user code" ones
    (which sit below every traceback frame: the compiled function's own code)."""
    found: str | None = None
    for e in chain:
        for fr in traceback.extract_tb(e.__traceback__):
            m = MODEL_CODE.search(fr.filename.replace("\\", "/"))
            if m:
                found = f"{m.group(1)}:{fr.lineno} in {fr.name}"
    for e in chain:
        for path, line, name in _USER_FRAME_RE.findall(str(e)):
            m = MODEL_CODE.search(path.replace("\\", "/"))
            if m:
                found = f"{m.group(1)}:{line} in {name}"
    return found


def signature(exc: BaseException) -> dict[str, Any]:
    """What `same_way` compares: outer type, root type, root message (normalized), model-code frame."""
    chain = _chain(exc)
    root = chain[-1]
    node = next((m.group(1) for e in chain for m in [_FX_NODE_RE.search(str(e))] if m), None)
    return {
        "outer": type(exc).__name__,
        "root": type(root).__name__,
        "message": normalize_message(str(root)),
        "where": _model_frame(chain),
        "fx_node": normalize_message(node) if node else None,
    }


def same_way(device: dict[str, Any], cpu: dict[str, Any]) -> tuple[bool, str]:
    """Whether two failure signatures are the same failure; the first difference when not."""
    for key, what in (("outer", "exception type"), ("root", "root cause type")):
        if device.get(key) != cpu.get(key):
            return False, f"{what} differs: {device.get(key)} on the device, {cpu.get(key)} on CPU"
    if device.get("where") != cpu.get("where"):
        return False, f"raised at {device.get('where')} on the device, at {cpu.get('where')} on CPU"
    if device.get("message") == cpu.get("message"):
        return True, "same exception types, root cause message and model-code frame"
    if device.get("fx_node") and device.get("fx_node") == cpu.get("fx_node"):
        # torch words some fake-tensor errors per device (a data-pointer check): the failing node decides
        return True, "same exception types, model-code frame and failing FX node under fake tensors"
    return False, (
        f"root cause message differs: {str(device.get('message'))[:160]!r} on the device, "
        f"{str(cpu.get('message'))[:160]!r} on CPU"
    )


# ------------------------------------------------------------------------------------ meta-checked eager


def _meta_mode():
    """A TorchDispatchMode that runs each aten op's meta kernel on meta copies of its arguments before the
    op itself; errors from the meta kernel propagate. What the meta kernel cannot say (no meta kernel,
    data-dependent outputs) is skipped, as an out-of-tree device's dispatcher skips it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    meta = torch.device("meta")
    data_dependent = torch._subclasses.fake_tensor.DataDependentOutputException

    def to_meta(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=meta)
        if isinstance(v, torch.device):
            return meta
        return v

    class MetaChecked(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                margs, mkwargs = tree_map(to_meta, (args, kwargs))
                if "device" in mkwargs and mkwargs["device"] is not None:
                    mkwargs["device"] = meta
                func(*margs, **mkwargs)
            except (NotImplementedError, data_dependent, AttributeError, TypeError):
                pass
            except RuntimeError as exc:
                # what the meta device cannot do (no kernel, data-dependent values, sparse layouts) is not
                # a shape rule saying no: skipped, as hf_tpu's dispatcher skips it
                text = str(exc).lower()
                skip = ("meta" in text and ("not implemented" in text or "could not run" in text)) or any(
                    s in text for s in ("data-dependent", "meta tensor", "do not have strides")
                )
                if not skip:
                    raise
            return func(*args, **kwargs)

    return MetaChecked()


def attribution_mb(path: str) -> float:
    """About how much memory the re-run takes: the interpreter, plus the weights three times over (the
    model, its load, the compiled graph's copies) when ``path`` is a checkpoint folder."""
    weights = 0
    folder = Path(path)
    if folder.is_dir():
        weights = sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".bin"))
    return CHILD_BASE_MB + 3 * weights / 2**20


# ------------------------------------------------------------------------------- the subprocess (child)


def _child(workdir: Path) -> dict[str, Any]:
    import torch

    from compat.accuracy import compare, to_cpu
    from compat.materialize import Plan, load_model

    spec = json.loads((workdir / "spec.json").read_text())
    torch.set_num_threads(max(1, int(spec.get("threads", 1))))
    data = torch.load(workdir / "data.pt", weights_only=False)
    plan = Plan.from_dict(spec["plan"])
    out: dict[str, Any] = {"ran": False}
    t0 = time.perf_counter()
    try:
        model = load_model(plan, spec["path"])
        with torch.no_grad():
            if spec["rerun"] == "aot_eager":
                torch._dynamo.reset()
                result = to_cpu(torch.compile(model, backend="aot_eager")(**data["kwargs"]))
            else:
                with _meta_mode():
                    result = to_cpu(model(**data["kwargs"]))
        out["ran"] = True
        cmp = compare(data["ref"], result, data.get("fp64"), spec["tol"])
        out["accuracy_ok"], out["accuracy_detail"] = cmp.ok, cmp.detail
        if data.get("out") is not None:
            dev = compare(result, data["out"], data.get("fp64"), spec["tol"])
            out["device_vs_rerun_ok"], out["device_vs_rerun_detail"] = dev.ok, dev.detail
    except Exception as exc:
        from compat.records import exception_chain_text

        out["signature"] = signature(exc)
        out["error"] = exception_chain_text(exc, limit=1500)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    out["hf_tpu_imported"] = any(m == "hf_tpu" or m.startswith("hf_tpu.") for m in sys.modules)
    return out


def main(argv: list[str]) -> None:
    workdir = Path(argv[0])
    try:
        result = _child(workdir)
    except BaseException as exc:  # setup failed (unreadable spec or data): say so, never hang the parent
        result = {"ran": False, "setup_error": f"{type(exc).__name__}: {exc}"}
    (workdir / "result.json").write_text(json.dumps(result, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown


# --------------------------------------------------------------------------------- the worker's side


def child_env() -> dict[str, str]:
    """The worker's environment with hf_tpu kept out of the child (no device-backend autoload)."""
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env["HF_TPU_AUTOLOAD"] = "0"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def attribute(
    *,
    plan: Any,
    path: str,
    kwargs: dict[str, Any],
    mode: str,
    status: str,
    exception: BaseException | None,
    device_output: Any,
    ref: Any,
    fp64: Any,
    tol: float,
    timeout_s: float = ATTRIBUTION_TIMEOUT_S,
    threads: int = 1,
) -> dict[str, Any] | None:
    """Re-run a failed mode on CPU and decide; None when no re-run applies to this mode and status."""
    rerun = rerun_for(mode, status)
    if rerun is None:
        return None
    if status in EXCEPTION_STATUSES and exception is None:
        return None
    import torch

    from compat.input_basics import strip_private

    name = RERUN_NAMES[rerun]
    verdict: dict[str, Any] = {"verdict": "inconclusive", "rerun": name, "detail": "", "seconds": None}
    workdir = Path(tempfile.mkdtemp(prefix="compat-attr-"))
    t0 = time.monotonic()
    try:
        (workdir / "spec.json").write_text(
            json.dumps(
                {"plan": plan.to_dict(), "path": path, "rerun": rerun, "tol": tol, "threads": threads},
                default=str,
            )
        )
        data = {"kwargs": strip_private(kwargs), "ref": ref, "fp64": fp64}
        if status == "fail_accuracy":
            data["out"] = device_output
        torch.save(data, workdir / "data.pt")
        proc = subprocess.Popen(
            [sys.executable, "-m", "compat.attribution", str(workdir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env(),
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            verdict["detail"] = f"the CPU re-run did not finish within {timeout_s:g}s"
            return verdict
        result_path = workdir / "result.json"
        if not result_path.exists():
            tail = " | ".join((err or b"").decode(errors="replace").strip().splitlines()[-5:])
            verdict["detail"] = (
                f"the CPU re-run died (exit code {proc.returncode}){': ' + tail if tail else ''}"
            )
            return verdict
        child = json.loads(result_path.read_text())
        verdict.update(_decide(status, exception, child))
        if child.get("error"):
            verdict["cpu_error"] = child["error"][:1000]
        return verdict
    except Exception as exc:  # attribution never fails the record it annotates
        verdict["detail"] = f"could not re-run on CPU: {type(exc).__name__}: {exc}"
        return verdict
    finally:
        verdict["seconds"] = round(time.monotonic() - t0, 3)
        shutil.rmtree(workdir, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    import contextlib
    import signal

    with contextlib.suppress(Exception):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _decide(status: str, exception: BaseException | None, child: dict[str, Any]) -> dict[str, str]:
    if child.get("setup_error"):
        return {
            "verdict": "inconclusive",
            "detail": f"the CPU re-run could not start: {child['setup_error']}",
        }
    if child.get("hf_tpu_imported"):
        return {"verdict": "inconclusive", "detail": "hf_tpu was imported into the CPU re-run"}
    if status in EXCEPTION_STATUSES:
        if not child.get("ran"):
            same, why = same_way(signature(exception), child.get("signature") or {})
            if same:
                return {"verdict": "upstream", "detail": f"fails the same way on CPU: {why}"}
            return {"verdict": "inconclusive", "detail": f"fails on CPU too, differently: {why}"}
        if child.get("accuracy_ok"):
            return {"verdict": "ours", "detail": "runs on CPU and matches the reference"}
        return {
            "verdict": "ours",
            "detail": f"runs on CPU without this exception (its output: {child.get('accuracy_detail')})",
        }
    # fail_accuracy
    if not child.get("ran"):
        return {"verdict": "inconclusive", "detail": "the CPU re-run raised where the device ran"}
    if child.get("accuracy_ok"):
        return {"verdict": "ours", "detail": "the CPU re-run matches the reference"}
    if child.get("device_vs_rerun_ok"):
        return {
            "verdict": "upstream",
            "detail": f"wrong on CPU too ({child.get('accuracy_detail')}), and the device output passes "
            f"the accuracy rule against the CPU re-run's",
        }
    return {
        "verdict": "inconclusive",
        "detail": f"wrong on CPU too ({child.get('accuracy_detail')}), but the device output differs from "
        f"the CPU re-run's ({child.get('device_vs_rerun_detail')})",
    }


if __name__ == "__main__":
    main(sys.argv[1:])

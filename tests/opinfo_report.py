"""OpInfo conformance: run PyTorch's OpInfo samples on tpu and compare them with CPU PyTorch.

`python -m tests.opinfo_report --out reports/opinfo` runs every OpInfo of
`torch.testing._internal.common_methods_invocations.op_db` whose op we lower and writes
`summary.json` (per op: samples, passed, failed, top error) and `README.md` (pass rates, per-op table).
`tests/runtime/test_opinfo.py` runs a fixed subset in CI with the same code.

Which OpInfos are "lowered": each sample is first traced on CPU under a TorchDispatchMode that follows
what the tpu dispatcher would do with every ATen overload it meets: a PrivateUse1 kernel (a lowering in
`lowering_table.TABLE`, a derived in-place/out= variant, a view/metadata kernel) is a leaf; a
CompositeExplicitAutograd(NonFunctional) kernel runs on tpu as is, so the trace follows it into the ops
it calls; an op reaching the boxed fallback is a derived variant, else a `torch._decomp` decomposition
(followed too, and marked), else missing. An OpInfo is

- `lowered`      every sample reaches only lowered leaves, through kernels and composites;
- `decomposed`   the same, but some sample needs one of torch's decompositions in the fallback;
- `partial`      some samples reach a missing op, others don't;
- `not_lowered`  every sample reaches a missing op (not run on tpu; the missing ops are listed).

A sample passes when `torch.testing.assert_close(tpu_out.cpu(), cpu_out, equal_nan=True)` holds with the
tolerance of `tests/runtime/opinfo_tolerances.py`; it fails on a mismatch or an exception (class and
first line recorded). Skipped: samples whose CPU run raises, sparse samples, and samples where no tensor
reaches the device (shape functions of Python numbers). Inputs keep their strides and storage offsets on
tpu. Random ops are checked on shape, dtype and an invariant; bf16 outputs that miss CPU may still pass
when they are as close to the float64 result as CPU's (see opinfo_tolerances). The full run uses worker processes, so one op crashing (even a segfault) or hanging
never stops the run; each op also has a time budget.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch._C import DispatchKey
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._python_dispatch import TorchDispatchMode

from tests.runtime import opinfo_tolerances as tol

ROOT = Path(__file__).resolve().parent.parent
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
DTYPE_NAMES = {str(d).removeprefix("torch."): d for d in DTYPES}
MAX_ERRORS_KEPT = 5  # distinct error lines kept per op and dtype


# -- the OpInfo database ----------------------------------------------------------------------------
_OPS: dict[str, object] | None = None


def op_key(op) -> str:
    """A unique name per OpInfo: `name` or `name.variant_test_name`."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def opinfos() -> dict[str, object]:
    """op key -> OpInfo, for every entry of op_db (imported once, ~4 s)."""
    global _OPS
    if _OPS is None:
        from torch.testing._internal.common_methods_invocations import op_db

        _OPS = {op_key(op): op for op in op_db}
    return _OPS


def dtypes_for(op, wanted=DTYPES) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in wanted if d in supported]


# -- which ATen overloads the tpu device covers -----------------------------------------------------
def _ensure_device() -> None:
    from hf_tpu.runtime.device import registration

    registration.register()
    registration.ensure_kernels()


_handling_cache: dict = {}

LEAF, COMPOSITE, DECOMP, MISSING = "leaf", "composite", "decomp", "missing"


def handling(func) -> tuple[str, object]:
    """How the tpu dispatcher runs `func`: (LEAF, None), (COMPOSITE, key), (DECOMP, fn) or (MISSING, None).

    Mirrors PyTorch's dispatch-table precedence for PrivateUse1 (a direct kernel, then the
    CompositeExplicitAutogradNonFunctional and CompositeExplicitAutograd kernels, then the boxed
    fallback) and the fallback's own order (derived in-place/out=, table, decompositions)."""
    cached = _handling_cache.get(func)
    if cached is not None:
        return cached
    from hf_tpu.runtime.execution import fallback
    from hf_tpu.runtime.lowerings.table import TABLE

    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(name, "PrivateUse1"):
        result = (LEAF, None)
    elif has(name, "CompositeExplicitAutogradNonFunctional"):
        result = (COMPOSITE, DispatchKey.CompositeExplicitAutogradNonFunctional)
    elif has(name, "CompositeExplicitAutograd"):
        result = (COMPOSITE, DispatchKey.CompositeExplicitAutograd)
    elif func in TABLE or _derived(func):
        result = (LEAF, None)
    else:
        decomp = fallback._decomposition(func)
        result = (DECOMP, decomp) if decomp is not None else (MISSING, None)
    _handling_cache[func] = result
    return result


def _derived(func) -> bool:
    from hf_tpu.runtime.execution import dispatch

    try:
        return dispatch.derived_kernel(func) is not None
    except Exception:  # noqa: BLE001 - an odd schema is simply not derived
        return False


class CoverageTrace(TorchDispatchMode):
    """Runs a CPU sample while recording the ATen overloads the tpu device would reach (see `handling`)."""

    def __init__(self) -> None:
        super().__init__()
        self.leaves: set[str] = set()
        self.missing: set[str] = set()
        self.decomposed: set[str] = set()
        self._active: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        how, detail = handling(func)
        if how == LEAF:
            self.leaves.add(str(func))
            return func(*args, **kwargs)
        if how == MISSING or func in self._active:  # the tpu fallback refuses re-entrant decompositions
            self.missing.add(str(func))
            return func(*args, **kwargs)
        if how == DECOMP:
            self.decomposed.add(str(func))
        self._active.add(func)
        try:
            with self:
                if how == COMPOSITE:
                    return func._op_dk(detail, *args, **kwargs)
                return detail(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the composite can't run here: count the op itself
            (self.leaves if how == COMPOSITE else self.missing).add(str(func))
            return func(*args, **kwargs)
        finally:
            self._active.discard(func)


# -- running one sample -----------------------------------------------------------------------------
# with several chips: lay sample inputs out over the current mesh (tests/multichip), see `sharded_inputs`
_SHARD_INPUTS: list = [None]  # the counts of the active `sharded_inputs` block, or None


@contextlib.contextmanager
def sharded_inputs():
    """Inside the block, every tpu input tensor of a sample is split over the current mesh's one axis along
    its first dim that divides (dim 0, else the last, else any), or left unsharded when none does. Yields
    counts: input tensors seen ("tensors") and split ("sharded")."""
    counts = collections.Counter()
    _SHARD_INPUTS[0] = counts
    try:
        yield counts
    finally:
        _SHARD_INPUTS[0] = None


def split_dim(t: torch.Tensor, ways: int) -> int | None:
    """The dim `sharded_inputs` splits `t` along over `ways` chips (dim 0, else the last, else any that
    divides), or None when `t` stays whole (a scalar, an empty or non-contiguous tensor, no dim divides)."""
    if t.dim() == 0 or not t.is_contiguous() or t.numel() == 0:
        return None
    return next((d for d in [0, t.dim() - 1, *range(1, t.dim() - 1)] if t.shape[d] % ways == 0), None)


def splits_over(sample, ways: int) -> bool:
    """Whether any tensor of OpInfo `sample` would be split over `ways` chips inside `sharded_inputs`."""
    values = [sample.input, *sample.args, *sample.kwargs.values()]
    flat = [x for v in values for x in (v if isinstance(v, (list, tuple)) else [v])]
    return any(isinstance(t, torch.Tensor) and split_dim(t, ways) is not None for t in flat)


def _shard_input(t: torch.Tensor) -> torch.Tensor:
    import hf_tpu

    counts = _SHARD_INPUTS[0]
    counts["tensors"] += 1
    axis = hf_tpu.mesh().axis_names[0]
    dim = split_dim(t, hf_tpu.mesh().shape[axis])
    if dim is None:
        return t
    counts["sharded"] += 1
    return hf_tpu.shard(t, tuple(axis if d == dim else None for d in range(t.dim())))


def _to_device(value, device: str):
    """Copy every tensor of a sample to `device`; 'cpu' devices in arguments (factories) follow."""
    if isinstance(value, torch.Tensor):
        moved = _same_layout(value.detach(), device)
        return _shard_input(moved) if _SHARD_INPUTS[0] is not None and device == "tpu" else moved
    if isinstance(value, torch.device):
        return torch.device(device) if value.type == "cpu" else value
    if isinstance(value, str):
        return device if value == "cpu" else value
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _same_layout(t: torch.Tensor, device: str) -> torch.Tensor:
    """`t` on `device` with its strides, storage offset and whole storage: OpInfo samples include
    non-contiguous tensors and partial views of larger storages, which a plain `.to()` would compact."""
    copy = (lambda x: x.clone()) if device == "cpu" else (lambda x: x.to(device))
    if t.layout != torch.strided or t.is_conj() or t.is_neg() or t.numel() == 0:
        return copy(t)
    n = t.untyped_storage().nbytes() // t.element_size()
    if t.is_contiguous() and t.storage_offset() == 0 and n == t.numel():
        return copy(t)
    whole = copy(t.as_strided((n,), (1,), 0))
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def _on_device(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "tpu"
    if isinstance(value, list | tuple):
        return any(_on_device(v) for v in value)
    if isinstance(value, dict):
        return any(_on_device(v) for v in value.values())
    return False


def _clone(value):
    if isinstance(value, torch.Tensor):
        return _same_layout(value.detach(), "cpu")
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu() if value.device.type != "cpu" else value
    if isinstance(value, list | tuple):
        return (
            type(value)(*map(_to_cpu, value))
            if hasattr(value, "_fields")
            else type(value)(map(_to_cpu, value))
        )
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


# how a sample runs on tpu: op by op, recorded and fused, or captured whole by torch.compile
MODES = ("strict", "defer_and_fuse", "compiled")


class Uncapturable(Exception):
    """torch.compile cannot take this sample whole, whatever the device: Dynamo cannot trace it as one
    graph (a data-dependent output shape, an unsupported Python construct), or aot_autograd fails on it
    on plain CPU too (`aot_eager`, the same pipeline without our lowerings). Nothing of ours to test."""


def _compile_whole(op, backend: str):
    fn = op.op

    def whole(x, *a, **k):
        return fn(x, *a, **k)

    torch._dynamo.reset()  # one code object for every sample: a fresh cache, never the eager fallback
    return torch.compile(whole, backend=backend, fullgraph=True, dynamic=False)


def _run_on_device(op, inp, args, kwargs, mode: str, sample=None):
    """`op(inp, *args, **kwargs)` on tpu tensors under `mode`; `sample` (the CPU sample) lets compiled mode
    tell torch's own limits from ours."""
    if mode == "strict":
        return op(inp, *args, **kwargs)
    if mode == "defer_and_fuse":
        with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            return op(inp, *args, **kwargs)  # materialized by the copy to CPU after the context
    if mode == "compiled":
        try:
            return _compile_whole(op, "tpu")(inp, *args, **kwargs)
        except torch._dynamo.exc.Unsupported as exc:  # raised while tracing, before any backend runs
            raise Uncapturable(error_line(exc)) from exc
        except Exception:
            if sample is not None:
                cpu = _clone([sample.input, list(sample.args), sample.kwargs])
                try:
                    _compile_whole(op, "aot_eager")(cpu[0], *cpu[1], **cpu[2])
                except Exception as cpu_exc:  # noqa: BLE001 - torch's own pipeline fails on CPU too
                    raise Uncapturable(f"aot_eager on CPU: {error_line(cpu_exc)}") from cpu_exc
            raise
    raise ValueError(f"unknown mode {mode!r}; one of {MODES}")


def error_line(exc: BaseException) -> str:
    """`Class: first line`, with the bulky input descriptions of hf_tpu errors cut; a backend's error
    wrapped by Dynamo (`BackendCompilerFailed`) is reported as itself."""
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException):
        exc = inner
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.sub(r" \(inputs: .*", "", text)
    text = re.sub(r" failed on \(.*?\) at \S+ in \S+:", " failed:", text)
    return f"{type(exc).__name__}: {text}"[:300]


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def check_random(invariant: str, actual, expected, sample) -> None:
    """Random/uninitialized ops: same structure, shapes and dtypes, plus the op's value invariant."""
    got, want = _tensors(actual), _tensors(expected)
    assert len(got) == len(want), f"{len(got)} outputs, CPU gave {len(want)}"
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"shape {tuple(g.shape)} != CPU {tuple(w.shape)}"
        assert g.dtype == w.dtype, f"dtype {g.dtype} != CPU {w.dtype}"
    if not got or got[0].numel() == 0:
        return
    out = got[0].double()
    if invariant == "binary":
        assert bool(((out == 0) | (out == 1)).all()), "bernoulli drew values outside {0, 1}"
    elif invariant == "unit":
        assert bool(((out >= 0) & (out < 1)).all()), "values outside [0, 1)"
    elif invariant == "nonnegative":
        assert bool((out >= 0).all()), "negative values"
    elif invariant == "positive":
        assert bool((out > 0).all()), "non-positive values"
    elif invariant == "index":
        n = sample.input.shape[-1]
        assert bool(((out >= 0) & (out < n)).all()), f"indices outside [0, {n})"
    elif invariant == "lowrank":
        # randomized low-rank SVD: the range finder's projection is random, so U, S and V are compared
        # through the matrix they rebuild, U diag(S) V^H, which does not depend on the projection when q
        # covers the samples' rank
        def rebuild(u, s, v):
            return (u.double() * s.double().unsqueeze(-2)) @ v.double().mH

        u, sv, v = (t.double() for t in got[:3])
        if sample.kwargs.get("M") is None:
            torch.testing.assert_close(rebuild(*got[:3]), rebuild(*want[:3]), atol=1e-4, rtol=1e-4)
        else:  # A - M has full rank: a rank-q approximation of it depends on the projection; check its form
            tol = 1e-4 if got[0].dtype in (torch.float32, torch.float64) else 5e-2
            for m in (u, v):
                eye = torch.eye(m.shape[-1], dtype=m.dtype).expand(m.mH.shape[:-1] + (m.shape[-1],))
                torch.testing.assert_close(m.mH @ m, eye, atol=tol, rtol=0)
            assert bool((sv >= 0).all()) and bool((sv[..., :-1] >= sv[..., 1:] - tol).all()), (
                "singular values"
            )
    elif invariant == "dropout":
        inp = sample.input.double()
        p = sample.kwargs.get("p", 0.5)
        training = sample.kwargs.get("training", True)
        if not training or p == 0:
            torch.testing.assert_close(out, inp, equal_nan=True, atol=1e-5, rtol=1e-3)
        elif p < 1:
            kept = torch.isclose(out, inp / (1 - p), rtol=1e-2, atol=1e-3, equal_nan=True)
            assert bool(((out == 0) | kept).all()), "dropout output is neither 0 nor input / (1 - p)"


@dataclass
class SampleResult:
    index: int
    status: str  # traced | skipped (the CPU run raised, or a sparse input)
    error: str = ""
    missing: tuple[str, ...] = ()
    decomposed: tuple[str, ...] = ()
    leaves: tuple[str, ...] = ()
    expected: object = None
    pristine: object = None  # a copy of the sample taken before the CPU run


def trace_sample(op, sample, index: int) -> SampleResult:
    """The CPU reference output of `sample` and the ATen overloads it would reach on tpu."""
    if any(
        t.layout != torch.strided for t in _tensors([sample.input, sample.args, list(sample.kwargs.values())])
    ):
        return SampleResult(index, "skipped", "sparse input: the tpu device has dense (strided) tensors only")
    try:
        # the tpu run gets a copy taken before CPU runs anything (ops like batch_norm write their inputs)
        inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs))
        pristine = SampleInput(inp, args=tuple(args), kwargs=kwargs)
        trace_input = _clone((sample.input, sample.args, sample.kwargs))
        expected = _call(op, sample)
    except Exception as exc:  # noqa: BLE001 - a failing CPU run means the sample is skipped
        return SampleResult(index, "skipped", error_line(exc))
    trace = CoverageTrace()
    try:
        with trace:
            op(trace_input[0], *trace_input[1], **trace_input[2])
    except Exception:  # noqa: BLE001 - the trace only informs the classification
        pass
    return SampleResult(
        index,
        "traced",
        missing=tuple(sorted(trace.missing)),
        decomposed=tuple(sorted(trace.decomposed)),
        leaves=tuple(sorted(trace.leaves)),
        expected=expected,
        pristine=pristine,
    )


def assert_matches(actual, expected, name: str, variant: str) -> None:
    """assert_close output by output, each tensor with the tolerance of its (CPU) dtype."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        atol, rtol = tol.tolerance(name, variant, expected.dtype)
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    elif isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        assert len(actual) == len(expected), f"{len(actual)} outputs, CPU gave {len(expected)}"
        for a, e in zip(actual, expected):
            assert_matches(a, e, name, variant)
    else:
        torch.testing.assert_close(actual, expected, equal_nan=True)


def assert_tied_indices(actual, expected, sample, dim: int, keepdim: bool, name: str, variant: str) -> None:
    """Values as usual; each index must select an element equal to its value (ties may pick any)."""
    x = sample.input
    if x.dim() == 0:
        assert_matches(actual, expected, name, variant)
        return
    if isinstance(expected, torch.Tensor):  # argsort: indices only, values are what they select
        values_e, idx_a = x.take_along_dim(expected, dim), actual
        assert idx_a.shape == expected.shape and idx_a.dtype == expected.dtype, "indices shape/dtype differ"
    else:
        assert_matches(actual[0], expected[0], name, variant)
        values_e, idx_a = expected[0], actual[1]
        assert idx_a.shape == expected[1].shape and idx_a.dtype == expected[1].dtype, (
            "indices shape/dtype differ"
        )
    if idx_a.numel() == 0:
        torch.testing.assert_close(idx_a, expected if isinstance(expected, torch.Tensor) else expected[1])
        return
    if not keepdim:
        idx_a, values_e = idx_a.unsqueeze(dim), values_e.unsqueeze(dim)
    assert bool(((idx_a >= 0) & (idx_a < x.shape[dim])).all()), "indices out of range"
    picked = x.take_along_dim(idx_a, dim)
    torch.testing.assert_close(
        picked, values_e, atol=0, rtol=0, equal_nan=True, msg="indices select other values"
    )


def assert_factorization(kind: str, actual, expected, sample, name: str, variant: str) -> None:
    """Factors unique only up to sign/phase: the values match CPU's, the tpu factors rebuild the input."""
    values, e_values = (actual[1], expected[1]) if kind != "eigh" else (actual[0], expected[0])
    assert_matches(values, e_values, name, variant)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype, (
            f"factor {tuple(a.shape)}:{a.dtype} vs CPU {tuple(e.shape)}:{e.dtype}"
        )
    a_in = sample.input
    if kind == "eigh":
        lam, q = actual
        lower = sample.kwargs.get("UPLO", sample.args[0] if sample.args else "L") == "L"
        tri = a_in.tril() if lower else a_in.triu()
        target = tri + (tri.tril(-1) if lower else tri.triu(1)).mH
        rebuilt = (q * lam.unsqueeze(-2).to(q.dtype)) @ q.mH
    else:
        u, s, v = actual
        if u.numel() and not u.any() and expected[0].numel() and not expected[0].any():
            return  # compute_uv=False: zero-filled factors, compared above by shape
        k = s.shape[-1]
        vh = v.mH if kind == "svd" else v
        target = a_in
        rebuilt = (u[..., :, :k] * s.unsqueeze(-2).to(u.dtype)) @ vh[..., :k, :]
    scale = float(target.abs().max()) if target.numel() else 1.0
    torch.testing.assert_close(
        rebuilt, target, atol=1e-4 * max(scale, 1.0), rtol=1e-4, msg="factors do not rebuild A"
    )


def compare_sample(
    op, sample, expected, stats: collections.Counter | None = None, mode: str = "strict"
) -> str:
    """Run `sample` on tpu (under `mode`, one of MODES) and compare with CPU's `expected`: '' when it
    passes, else the error line. `stats["fp64"]` counts the samples that passed by the float64 rule (see
    `closer_to_fp64`), `stats["host_only"]` those that never touched the device (shape functions of
    Python numbers), `stats["uncapturable"]` those Dynamo cannot capture whole (compiled mode)."""
    try:
        keep = tol.cpu_args(op.name, op.variant_test_name)
        args = tuple(a if i in keep else _to_device(a, "tpu") for i, a in enumerate(sample.args))
        tpu_input = (_to_device(sample.input, "tpu"), args, _to_device(sample.kwargs, "tpu"))
        try:
            raw = _run_on_device(op, tpu_input[0], tpu_input[1], tpu_input[2], mode, sample)
        except Uncapturable as exc:
            if stats is not None:
                stats["uncapturable"] += 1
            return f"Uncapturable: {exc}"
        if stats is not None and not _on_device([tpu_input, raw]):
            stats["host_only"] += 1  # no tensor went to or came from the device: nothing was tested
        actual = _device_dtype_as_cpu(op, _to_cpu(raw), expected)
        invariant = tol.random_invariant(op.name, op.variant_test_name, sample)
        tied = tol.tied_indices(op.name, op.variant_test_name, sample)
        if invariant is not None:
            check_random(invariant, actual, expected, sample)
        elif tied is not None:
            assert_tied_indices(actual, expected, sample, *tied, op.name, op.variant_test_name)
        elif tol.factorization(op.name, op.variant_test_name):
            kind = tol.factorization(op.name, op.variant_test_name)
            assert_factorization(kind, actual, expected, sample, op.name, op.variant_test_name)
        else:
            try:
                assert_matches(actual, expected, op.name, op.variant_test_name)
            except AssertionError:
                if not closer_to_fp64(op, sample, actual, expected):
                    raise
                if stats is not None:
                    stats["fp64"] += 1
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the run
        return error_line(exc)
    return ""


LOW_PRECISION = (torch.bfloat16, torch.float16)


def _device_dtype_as_cpu(op, actual, expected):
    """Outputs whose dtype PyTorch defines per device (float32 stats of bf16 norms off CPU): compare the
    values in CPU's dtype; only a float32 tpu output against a low-precision CPU one is cast."""
    positions = tol.device_dtype_outputs(op.name, op.variant_test_name)
    if not positions or not isinstance(actual, tuple) or not isinstance(expected, tuple):
        return actual
    out = list(actual)
    for i in positions:
        a, e = out[i], expected[i]
        if isinstance(a, torch.Tensor) and a.dtype == torch.float32 and e.dtype in LOW_PRECISION:
            out[i] = a.to(e.dtype)
    return tuple(out)


def _upcast(value):
    if isinstance(value, torch.Tensor):
        return value.double() if value.dtype in (*LOW_PRECISION, torch.float32) else value
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_upcast(v) for v in value)
    if isinstance(value, dict):
        return {k: _upcast(v) for k, v in value.items()}
    return value


def _leaves(value) -> list:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _leaves(v)]
    return [value]


def closer_to_fp64(op, sample, actual, expected) -> bool:
    """The bf16/f16 rule of opinfo_tolerances: every low-precision output element is within tolerance
    of the float64 result, allowing twice CPU's own error (CPU rounds intermediates to bf16 where our
    lowerings keep f32); every other output still matches CPU exactly as usual."""
    exp_leaves, act_leaves = _leaves(expected), _leaves(actual)
    if len(exp_leaves) != len(act_leaves) or not any(
        isinstance(e, torch.Tensor) and e.dtype in LOW_PRECISION for e in exp_leaves
    ):
        return False
    try:
        ref_leaves = _leaves(op(_upcast(sample.input), *_upcast(sample.args), **_upcast(sample.kwargs)))
    except Exception:  # noqa: BLE001 - no float64 reference: the plain comparison stands
        return False
    if len(ref_leaves) != len(exp_leaves):
        return False
    for a, e, r in zip(act_leaves, exp_leaves, ref_leaves):
        if not (isinstance(e, torch.Tensor) and e.dtype in LOW_PRECISION):
            try:
                assert_matches(a, e, op.name, op.variant_test_name)
            except AssertionError:
                return False
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype or r.shape != e.shape:
            return False
        atol, rtol = tol.tolerance(op.name, op.variant_test_name, e.dtype)
        a64, e64, r64 = a.double(), e.double(), r.double()
        # CPU's own error, doubled; none where CPU's result is not finite but the true one is (bf16
        # matrix_exp on CPU returns NaN): there the tpu value must match float64 within plain tolerance
        cpu_error = (e64 - r64).abs()
        cpu_error = torch.where(cpu_error.isfinite(), cpu_error, torch.zeros_like(cpu_error))
        bound = atol + rtol * r64.abs() + 2 * cpu_error
        ok = ((a64 - r64).abs() <= bound) | (a64 == e64) | (a64.isnan() & e64.isnan())
        if not bool(ok.all()):
            return False
    return True


# -- running one OpInfo -----------------------------------------------------------------------------
@dataclass
class DtypeResult:
    samples: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0  # the CPU run raised, a sparse input, or nothing touched the device
    skipped_budget: int = 0
    passed_vs_fp64: int = 0  # bf16/f16 samples that passed by the float64 rule
    errors: dict[str, int] = field(default_factory=dict)
    failing_samples: list[int] = field(default_factory=list)


@dataclass
class OpResult:
    op: str
    status: str = "lowered"  # lowered | decomposed | partial | not_lowered | skipped | crashed | timeout
    reason: str = ""
    samples: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    skipped_budget: int = 0
    passed_vs_fp64: int = 0
    top_error: str = ""
    missing: list[str] = field(default_factory=list)
    decomposed: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    dtypes: dict[str, DtypeResult] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def pass_rate(self) -> float:
        return self.passed / self.samples if self.samples else math.nan


def _family(overload: str) -> str:
    """The module that lowers an overload ('elementwise', 'copy', 'views', ...) for the report."""
    from hf_tpu.runtime.execution import view_kernels as views
    from hf_tpu.runtime.lowerings.table import TABLE, resolve

    try:
        func = resolve(overload.removeprefix("aten."))
    except AttributeError:
        return "?"
    if func in TABLE:
        return TABLE[func].fn.__module__.rsplit(".", 1)[-1]
    base = func._schema.name.removeprefix("aten::")
    if base in views.METADATA_OPS or f"{base}.{func._overloadname}" in views.METADATA_OPS:
        return "views"
    from hf_tpu.runtime.execution import dispatch

    functional = dispatch.functional_of(func)
    if functional is not None and functional in TABLE:
        return TABLE[functional].fn.__module__.rsplit(".", 1)[-1]
    return "?"


def run_opinfo(
    op,
    dtypes=DTYPES,
    budget_s: float = 60.0,
    max_samples: int | None = None,
    run_unlowered: bool = False,
    mode: str = "strict",
    keep=None,
) -> OpResult:
    """All samples of `op` at each supported dtype, within `budget_s` seconds (the rest is skipped),
    run on tpu under `mode` (MODES). Samples Dynamo cannot capture whole count as skipped. `keep`
    (sample -> bool), when given, selects the samples before `max_samples` counts them."""
    _ensure_device()
    key = op_key(op)
    res = OpResult(key)
    start = time.perf_counter()
    reason = tol.skip_reason(op.name, op.variant_test_name)
    if reason:
        res.status, res.reason = "skipped", reason
        return res
    # pass 1: CPU references and the coverage trace of every sample
    plan: list[tuple[DtypeResult, list, list[SampleResult]]] = []
    for dtype in dtypes_for(op, dtypes):
        dres = DtypeResult()
        res.dtypes[str(dtype).removeprefix("torch.")] = dres
        try:
            torch.manual_seed(0)
            samples = list(op.sample_inputs("cpu", dtype))
        except Exception as exc:  # noqa: BLE001
            dres.errors[f"sample_inputs: {error_line(exc)}"] = 1
            continue
        if keep is not None:
            samples = [s for s in samples if keep(s)]
        if max_samples is not None:
            samples = samples[:max_samples]
        traced = []
        for i, sample in enumerate(samples):
            if time.perf_counter() - start > budget_s / 2:
                dres.skipped_budget += len(samples) - i
                break
            r = trace_sample(op, sample, i)
            if r.status == "skipped":
                dres.skipped += 1
            else:
                traced.append(r)
        plan.append((dres, samples, traced))
    everything = [r for *_, traced in plan for r in traced]
    res.decomposed = sorted({d for r in everything for d in r.decomposed})
    res.families = sorted({_family(leaf) for r in everything for leaf in r.leaves} - {"?"})
    predicted_missing = sorted({m for r in everything for m in r.missing})
    if everything and all(r.missing for r in everything) and not run_unlowered:
        # predicted unlowered: confirm on tpu with the first sample (the trace follows CPU's dispatch,
        # which can differ), and skip the rest when the device indeed lacks an op
        dres, samples, traced = next(p for p in plan if p[2])
        error = compare_sample(op, traced[0].pristine, traced[0].expected, mode=mode)
        if missing_op(error):
            res.status = "not_lowered"
            res.missing = sorted(set(predicted_missing) | {missing_op(error)})
            for dres, _, traced in plan:
                dres.samples = len(traced)
            res.seconds = time.perf_counter() - start
            return _totals(res)
    # pass 2: the same samples on tpu; a sample that reaches an op with no lowering counts as missing
    missing: set[str] = set()
    confirmed: dict[str, str] = {}  # missing overload -> the error line it gave
    n_missing = n_run = 0
    for dres, _, traced in plan:
        for n, r in enumerate(traced):
            if time.perf_counter() - start > budget_s:
                dres.skipped_budget += len(traced) - n
                break
            seen = [confirmed[m] for m in r.missing if m in confirmed]
            # a sample predicted to reach an op already seen missing on tpu fails the same way: not rerun
            stats: collections.Counter = collections.Counter()
            error = seen[0] if seen else compare_sample(op, r.pristine, r.expected, stats, mode)
            if (stats["host_only"] and not error) or stats["uncapturable"]:
                dres.skipped += 1
                continue
            dres.samples += 1
            n_run += 1
            dres.passed_vs_fp64 += stats["fp64"]
            if not error:
                dres.passed += 1
                continue
            if missing_op(error):
                missing.add(missing_op(error))
                confirmed.setdefault(missing_op(error), error)
                n_missing += 1
            dres.failed += 1
            dres.failing_samples.append(r.index)
            if error in dres.errors or len(dres.errors) < MAX_ERRORS_KEPT:
                dres.errors[error] = dres.errors.get(error, 0) + 1
    res.missing = sorted(missing)
    if not res.dtypes:
        res.status = "no_dtype"  # supports none of the dtypes run here (e.g. complex only)
    elif not n_run:
        res.status = "no_samples"  # every sample was skipped or over budget
    elif n_missing == n_run:
        res.status = "not_lowered"
    elif n_missing:
        res.status = "partial"
    elif res.decomposed:
        res.status = "decomposed"
    res.seconds = time.perf_counter() - start
    return _totals(res)


def missing_op(error: str) -> str | None:
    """The overload named by a 'no lowering' error line, else None."""
    m = re.search(r"has no lowering for (aten::\S+)", error)
    return m.group(1).replace("aten::", "aten.") if m else None


def _totals(res: OpResult) -> OpResult:
    errors: collections.Counter = collections.Counter()
    for d in res.dtypes.values():
        res.samples += d.samples
        res.passed += d.passed
        res.failed += d.failed
        res.skipped += d.skipped
        res.skipped_budget += d.skipped_budget
        res.passed_vs_fp64 += d.passed_vs_fp64
        errors.update(d.errors)
    if errors:
        res.top_error = errors.most_common(1)[0][0]
    if res.status == "not_lowered" and res.missing and not res.top_error:
        res.top_error = "missing: " + ", ".join(res.missing[:4])
    res.seconds = round(res.seconds, 2)
    return res


# -- the full report: worker processes --------------------------------------------------------------
def _worker_main(args) -> None:
    """Read op keys on stdin, answer one JSON line per op on the original stdout."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library prints must not corrupt the protocol
    sys.stdout = sys.stderr
    dtypes = [DTYPE_NAMES[d] for d in args.dtypes.split(",")]
    ops = opinfos()
    _ensure_device()
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        try:
            res = run_opinfo(
                ops[key],
                dtypes,
                args.budget,
                args.max_samples,
                run_unlowered=args.run_unlowered,
                mode=args.mode,
            )
            payload = asdict(res)
        except BaseException as exc:  # noqa: BLE001 - report and keep serving
            payload = asdict(OpResult(key, status="crashed", top_error=error_line(exc)))
            traceback.print_exc()
        proto.write(json.dumps(payload) + "\n")
        proto.flush()


class _Worker:
    def __init__(self, args, log) -> None:
        cmd = [
            sys.executable,
            "-m",
            "tests.opinfo_report",
            "--worker",
            "--dtypes",
            args.dtypes,
            "--budget",
            str(args.budget),
        ]
        if args.max_samples is not None:
            cmd += ["--max-samples", str(args.max_samples)]
        cmd += ["--mode", args.mode]
        if args.run_unlowered:
            cmd.append("--run-unlowered")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
        )
        self.op: str | None = None
        self.started = 0.0
        self.done = 0

    def send(self, key: str) -> None:
        self.op, self.started, self.done = key, time.monotonic(), self.done + 1
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()


def run_all(args, keys: list[str], sink=None) -> list[dict]:
    """Run `keys` over `args.jobs` workers; a crashed or hung worker is replaced and its op recorded.
    `sink(payload)` sees each result as it arrives (the partial file); on an interrupt the results so
    far are returned (the workers are stopped)."""
    log_path = Path(args.log) if args.log else Path(os.devnull)
    log = open(log_path, "a")  # noqa: SIM115 - shared by every worker until the end
    hard_timeout = args.budget * 2 + 120  # the budget is checked between samples; compiles can be long
    pending = collections.deque(keys)
    results: list[dict] = []
    sel = selectors.DefaultSelector()
    workers: list[_Worker] = []

    def start_worker() -> None:
        w = _Worker(args, log)
        workers.append(w)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        feed(w)

    def feed(w: _Worker) -> None:
        if not pending or w.done >= args.recycle:
            retire(w)
            if pending and len(workers) < args.jobs:
                start_worker()
            return
        w.send(pending.popleft())

    def retire(w: _Worker) -> None:
        sel.unregister(w.proc.stdout)
        workers.remove(w)
        w.stop()

    def record(payload: dict) -> None:
        results.append(payload)
        if sink is not None:
            sink(payload)
        n = len(results)
        print(
            f"[{n}/{len(keys)}] {payload['op']}: {payload['status']} "
            f"{payload['passed']}/{payload['samples']} {payload['seconds']:.1f}s {payload['top_error'][:100]}",
            flush=True,
        )

    retried: set[str] = set()

    def lost(w: _Worker, status: str, why: str) -> None:
        # a crash may come from state an earlier op left behind: give the op one fresh worker
        if status == "crashed" and w.op is not None and w.op not in retried:
            retried.add(w.op)
            pending.appendleft(w.op)
        else:
            record(asdict(OpResult(w.op or "?", status=status, top_error=why)))
        sel.unregister(w.proc.stdout)
        workers.remove(w)
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()
        if pending:
            start_worker()

    try:
        for _ in range(min(args.jobs, len(pending))):
            start_worker()
        while workers:
            for sk, _ in sel.select(timeout=5):
                w = sk.data
                line = w.proc.stdout.readline()
                if not line:
                    w.proc.wait()
                    lost(w, "crashed", f"worker died (exit {w.proc.returncode}) while running this op")
                    continue
                record(json.loads(line))
                w.op = None
                feed(w)
            now = time.monotonic()
            for w in list(workers):
                if w.op is not None and now - w.started > hard_timeout:
                    lost(w, "timeout", f"no result after {hard_timeout:.0f} s")
    except KeyboardInterrupt:
        print(f"interrupted: {len(results)} of {len(keys)} OpInfos done", flush=True)
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()
        log.close()
    return results


# -- writing the report -----------------------------------------------------------------------------
HEADLINE = ("lowered",)
WIDE = ("lowered", "decomposed")


def _rate(rows: list[dict], statuses) -> tuple[int, int, int]:
    sel = [r for r in rows if r["status"] in statuses]
    samples = sum(r["samples"] for r in sel)
    return len(sel), samples, sum(r["passed"] for r in sel)


def _lowering_target(overload: str) -> str:
    """The functional overload whose lowering would cover `overload` (itself unless it is out=/in-place)."""
    from hf_tpu.runtime.execution import dispatch
    from hf_tpu.runtime.lowerings.table import resolve

    try:
        functional = dispatch.functional_of(resolve(overload.removeprefix("aten.")))
    except Exception:  # noqa: BLE001 - an unknown name is shown as is
        return overload
    return str(functional) if functional is not None else overload


_PLUMBING = {"copy", "views", "factories", "graph_views"}


def _blame(r: dict) -> str:
    """Which lowering family a failing OpInfo most likely points at (see the README section)."""
    if r["status"] in ("crashed", "timeout"):
        return r["status"]
    m = re.search(r"hf_tpu: (aten\.\S+) failed", r["top_error"])
    if m:
        return _family(m.group(1))
    if missing_op(r["top_error"]) or r["top_error"].startswith("LoweringMissing"):
        return "missing lowering"
    fams = [f for f in r["families"] if f not in _PLUMBING] or r["families"]
    return " + ".join(fams) or "?"


def write_report(results: list[dict], out: Path, meta: dict) -> None:
    from hf_tpu.runtime.lowerings.table import TABLE

    _ensure_device()

    out.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: r["op"])
    summary = {
        "meta": meta,
        "lowered_overloads": len(TABLE),
        "ops": {
            r["op"]: {
                "status": r["status"],
                "samples": r["samples"],
                "passed": r["passed"],
                "failed": r["failed"],
                "skipped": r["skipped"],
                "skipped_budget": r["skipped_budget"],
                "passed_vs_fp64": r.get("passed_vs_fp64", 0),
                "top_error": r["top_error"],
                "missing": r["missing"],
                "decomposed": r["decomposed"],
                "families": r["families"],
                "seconds": r["seconds"],
                "dtypes": {d: {k: v for k, v in x.items() if v} for d, x in r["dtypes"].items()},
                **({"reason": r["reason"]} if r.get("reason") else {}),
            }
            for r in results
        },
    }
    counts = collections.Counter(r["status"] for r in results)
    n_l, s_l, p_l = _rate(results, HEADLINE)
    n_w, s_w, p_w = _rate(results, WIDE)
    n_a, s_a, p_a = _rate(results, ("lowered", "decomposed", "partial"))
    summary["totals"] = {
        "opinfos": len(results),
        "by_status": dict(counts),
        "lowered": {"ops": n_l, "samples": s_l, "passed": p_l, "pass_rate": p_l / s_l if s_l else None},
        "lowered_or_decomposed": {
            "ops": n_w,
            "samples": s_w,
            "passed": p_w,
            "pass_rate": p_w / s_w if s_w else None,
        },
        "run_on_tpu": {"ops": n_a, "samples": s_a, "passed": p_a, "pass_rate": p_a / s_a if s_a else None},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=False) + "\n")

    lowered_rows = [r for r in results if r["status"] in HEADLINE and r["samples"]]
    full = sum(1 for r in lowered_rows if r["passed"] == r["samples"])
    mean_rate = sum(r["passed"] / r["samples"] for r in lowered_rows) / max(len(lowered_rows), 1)

    def pct(p, s):
        return f"{100 * p / s:.1f}%" if s else "n/a"

    lines = [
        "# OpInfo conformance: tpu vs CPU PyTorch",
        "",
        "Generated by `python -m tests.opinfo_report --out reports/opinfo` (`make opinfo`); do not edit.",
        f"torch {meta['torch']}, jax {meta['jax']}, dtypes {meta['dtypes']}, per-op budget {meta['budget_s']} s, "
        f"{len(TABLE)} lowered ATen overloads, run {meta['date']} in {meta['seconds']:.0f} s.",
        f"Mode: {meta.get('mode', 'strict')}"
        + (f", first {meta['max_samples']} samples per dtype." if meta.get("max_samples") else "."),
        "",
        *(
            []
            if meta.get("complete", True)
            else ["**Incomplete run** (interrupted): continue it with `--resume`.", ""]
        ),
        "How an OpInfo is classified and compared: see the docstring of `tests/opinfo_report.py`; "
        "tolerances: `tests/runtime/opinfo_tolerances.py`.",
        "",
        "## Pass rate",
        "",
        "| OpInfos | ops | samples | passed | pass rate |",
        "|---|---:|---:|---:|---:|",
        f"| **lowered** (headline; target ≥ 90%, moonshot 95%) | {n_l} | {s_l} | {p_l} | **{pct(p_l, s_l)}** |",
        f"| lowered + via torch decompositions | {n_w} | {s_w} | {p_w} | {pct(p_w, s_w)} |",
        f"| everything run on tpu (+ partially lowered) | {n_a} | {s_a} | {p_a} | {pct(p_a, s_a)} |",
        "",
        f"Per OpInfo: {full} of {n_l} lowered OpInfos pass every sample; their mean pass rate is "
        f"{100 * mean_rate:.1f}% (the sample-weighted rate above counts ops with thousands of samples, "
        "like logspace, more).",
        "",
        "OpInfos by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ".",
        f"{sum(r.get('passed_vs_fp64', 0) for r in results)} bf16 samples passed by the float64 rule "
        "(tpu within tolerance of the float64 result, allowing twice CPU's own error) rather than by "
        "matching CPU within tolerance.",
        "",
        "## Failed samples by lowering family",
        "",
        "Blame: the op named in the error when the device raised, 'missing lowering' for ops with no "
        "lowering, else the families (lowering modules) of the overloads the OpInfo reaches.",
        "",
        "| family | failed samples | OpInfos |",
        "|---|---:|---|",
    ]
    run = [r for r in results if r["status"] in ("lowered", "decomposed", "partial", "crashed", "timeout")]
    run.sort(key=lambda r: (-r["failed"], r["status"] != "crashed", r["op"]))
    blame: dict[str, list] = collections.defaultdict(list)
    for r in run:
        if r["failed"] or r["status"] in ("crashed", "timeout"):
            blame[_blame(r)].append(r)
    for fam, rs in sorted(blame.items(), key=lambda kv: -sum(r["failed"] for r in kv[1])):
        names = ", ".join(f"`{r['op']}` ({r['failed']})" for r in rs[:12]) + (" …" if len(rs) > 12 else "")
        lines.append(f"| {fam} | {sum(r['failed'] for r in rs)} | {names} |")
    lines += [
        "",
        "## Per op (run on tpu), most failures first",
        "",
        "| op | status | samples | passed | failed | pass rate | families | top error |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in run:
        err = r["top_error"].replace("|", "\\|").replace("\n", " ")[:160]
        lines.append(
            f"| `{r['op']}` | {r['status']} | {r['samples']} | {r['passed']} | {r['failed']} | "
            f"{pct(r['passed'], r['samples'])} | {', '.join(r['families'])} | {err} |"
        )
    missing: collections.Counter = collections.Counter()
    for r in results:
        if r["status"] in ("not_lowered", "partial"):
            missing.update(r["missing"])
    lines += [
        "",
        "## Missing overloads that block the most OpInfos",
        "",
        "An out= overload is reached through a composite of its functional form: lowering the functional "
        "overload (in the second column) derives the out= one.",
        "",
        "| ATen overload | lower this | OpInfos blocked |",
        "|---|---|---:|",
    ]
    lines += [f"| `{m}` | `{_lowering_target(m)}` | {n} |" for m, n in missing.most_common(60)]
    skipped = [r for r in results if r["status"] == "skipped"]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- `{r['op']}`: {r['reason']}" for r in skipped]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/opinfo")
    p.add_argument("--ops", default="", help="comma-separated OpInfo keys or regexes (default: all)")
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES))
    p.add_argument("--budget", type=float, default=60.0, help="seconds per OpInfo (all dtypes)")
    p.add_argument("--max-samples", type=int, default=None, help="per dtype")
    p.add_argument("--mode", choices=MODES, default="strict", help="how samples run on tpu")
    p.add_argument("--jobs", type=int, default=max(1, min(os.cpu_count() or 1, 4)))
    p.add_argument("--recycle", type=int, default=40, help="ops per worker before it is restarted")
    p.add_argument("--run-unlowered", action="store_true", help="also run not-lowered OpInfos on tpu")
    p.add_argument("--log", default="", help="append worker stderr here")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker_main(args)
        return 0
    keys = list(opinfos())
    if args.ops:
        pats = [re.compile(f"^(?:{s.strip()})$") for s in args.ops.split(",") if s.strip()]
        keys = [k for k in keys if any(pt.match(k) for pt in pats)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / ".partial.jsonl"  # every result as it arrives: --resume continues an interrupted run
    done: list[dict] = []
    if args.resume and partial.exists():
        done = [json.loads(line) for line in partial.read_text().splitlines() if line.strip()]
        finished = {r["op"] for r in done}
        keys = [k for k in keys if k not in finished]
        print(f"resuming: {len(done)} OpInfos already done, {len(keys)} to go", flush=True)
    elif partial.exists():
        partial.unlink()
    start = time.time()
    # SIGTERM stops the run like Ctrl-C: the report is still written, marked incomplete
    signal.signal(signal.SIGTERM, _interrupt)
    with open(partial, "a") as fh:

        def sink(payload: dict) -> None:
            fh.write(json.dumps(payload) + "\n")
            fh.flush()

        results = done + run_all(args, keys, sink)
    import jax

    meta = {
        "torch": torch.__version__,
        "jax": jax.__version__,
        "dtypes": args.dtypes,
        "budget_s": args.budget,
        "mode": args.mode,
        "max_samples": args.max_samples,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.time() - start, 1),
        "ops_filter": args.ops,
        "complete": len(results) == len(keys) + len(done),
    }
    write_report(results, out, meta)
    if meta["complete"]:
        partial.unlink()
    totals = json.loads((Path(args.out) / "summary.json").read_text())["totals"]
    print(json.dumps(totals, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

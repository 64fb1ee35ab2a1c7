"""From the PyTorch dispatcher to JAX: one kernel per lowered overload (the boxed fallback for the rest
is `fallback.py`).

Each lowered overload gets a PrivateUse1 kernel that unwraps tpu tensors into jax.Arrays, looks up a
jitted executable cached per (op, static args, shapes, dtypes), runs it, and wraps the results. The
in-place (`add_`) and out= (`add.out`) variants of a lowered op are derived from it: compute
functionally, then write into the destination through its views. Output dtypes follow PyTorch exactly
because each cache entry asks the op's meta kernel once what PyTorch would return. Everything not in
the table reaches the boxed fallback (`fallback.py`): torch's decompositions, then (opt-in) CPU, then a
clear error.
"""

from __future__ import annotations

import functools
import threading
import traceback
from collections.abc import Callable

import torch

from hf_tpu.runtime import arg_checks
from hf_tpu.runtime.buffers import executables, memory, placement, platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype, to_torch_dtype
from hf_tpu.runtime.buffers.platform import MULTI_CHIP
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import DONATION_LOCK, update_lock
from hf_tpu.runtime.execution import native_recording, write_plans
from hf_tpu.runtime.execution.out_specs import (
    UNKNOWN,
    LaidOut,
    cast_like,
    fit_fn,
    lay_out,
    meta_call,
    meta_run,
    out_layout,
    out_spec,
)
from hf_tpu.runtime.execution.signature import GENERATOR, NUMBER, TENSOR, TENSOR_LIST, Signature
from hf_tpu.runtime.launch import lazy, modes, rng
from hf_tpu.runtime.launch.lazy import LazyValue
from hf_tpu.runtime.lowerings.table import TABLE, Lowering, provide_kernel_factory
from hf_tpu.runtime.tensors import overlap
from hf_tpu.runtime.tensors.tensor import (
    View,
    can_update_in_place,
    op_input,
    read_input,
    run_donating,
    wrap,
    wrap_laid_out,
    wrap_spec,
    write,
)

_payloads = REGISTRY._payloads

_DTYPE = torch.dtype
_PY_NUMBERS = (int, float, bool, complex)
# distinct baked-in scalar values (per kernel) before it switches to traced scalars: in Strict a new
# value costs one op's executable; under DeferAndFuse it costs a whole new program around it, so fewer
_MAX_STATIC_SCALAR_BUILDS = 16
_MAX_STATIC_SCALAR_BUILDS_DEFERRED = 4


# distinct baked-in storage offsets of one argument layout before a kernel traces offsets (DeferAndFuse)
_MAX_BAKED_OFFSETS = 4


def _without_offsets(key):
    """A kernel cache key with its views' storage offsets blanked out."""
    if type(key) is View:
        return key._replace(offset=None) if key.offset else key
    if type(key) is tuple:
        return tuple(_without_offsets(k) for k in key)
    return key


_set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame


def outside_dynamo(kernel: Callable) -> Callable:
    """`kernel` run with TorchDynamo's frame hook off (33 ns). Code between a compiled function's graphs
    runs eagerly with the hook on, and Dynamo skips our runtime's and JAX's files but not the code they
    generate: a dataclass `__init__` JAX builds (file "<string>") was traced from inside our kernel and
    failed ("you set no_dispatch()", Qwen2-VL compiled on tpu)."""

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        prior = _set_eval_frame(None)
        try:
            return kernel(*args, **kwargs)
        finally:
            _set_eval_frame(prior)

    return run


def host_kernel(op, fn: Callable) -> Callable:
    """The PrivateUse1 kernel of host-kind lowering `fn` of `op`: outside Dynamo, and running CPU's
    argument checks (`arg_checks`) first when `op` has any, as `OpKernel` does for the others."""
    entry = arg_checks.for_op(op)
    if entry is None:
        return outside_dynamo(fn)
    sig = Signature(op)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        run_checks(entry, sig.normalize(args, kwargs))
        return fn(*args, **kwargs)

    return outside_dynamo(checked)


def run_checks(entry: tuple, fargs: list) -> None:
    """CPU's argument checks of one op (`arg_checks.for_op`) on its arguments in schema order: static
    ones always, value-reading ones in Debug mode only (they need a sync)."""
    static, by_value = entry
    for check in static:
        check(*fargs)
    if by_value and modes.launch_blocking():
        for check in by_value:
            check(*fargs)


class LoweringMissing(NotImplementedError):
    pass


def _freeze(value):
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


class _Entry:
    __slots__ = ("fn", "spec", "lazy_avals", "op", "native_spec")

    def __init__(self, fn, spec, op):
        self.fn = fn
        self.spec = spec
        self.lazy_avals = None  # output avals, filled by DeferAndFuse's first recording
        self.op = op  # the overload, named when a DeferAndFuse flush fails in it
        self.native_spec = None  # its outputs as the C++ recorder makes them (native_recording.out_spec)


_VALUE = object()  # template entry of a tensor passed as its own value


def _placeholder(value, kind, views):
    """An argument as the executable's template holds it (no tensors: the cache must not keep their
    storages alive). `views` yields, per tensor in order, the `View` `run` passed it through (or None)."""
    if kind == TENSOR and type(value) not in _PY_NUMBERS:
        return None if value is None else next(views) or _VALUE
    if kind == TENSOR_LIST:
        return [None if x is None else next(views) or _VALUE for x in value]
    if kind == NUMBER and isinstance(value, torch.Tensor):
        return True
    return value


def _scalar_key(v):
    """Cache-key part of a baked-in value: 5 and 5.0 (and True and 1) differ, so do 0.0 and -0.0; NaN
    keys by its repr (it never equals itself)."""
    tv = type(v)
    if (tv is float or tv is int) and not (v == v and v != 0):
        return (tv, repr(v))
    return (tv, v)


_LEAF, _LEAVES, _BAKED, _BAKED_ARRAY = "leaf", "leaves", "baked", "baked_array"


def _user_frame() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = frame.filename
        if (
            "/torch/" in f
            or "/hf_tpu/runtime/" in f
            or "/jax/" in f
            or "/jaxlib/" in f
            or f.startswith("<frozen")
        ):
            continue
        return f"{f}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def _describe(full: list, kinds) -> str:
    parts = []
    for v, k in zip(full, kinds):
        if k == TENSOR and isinstance(v, torch.Tensor):
            parts.append(f"Tensor{list(v.shape)}:{str(v.dtype).removeprefix('torch.')}@{v.device}")
        elif k == TENSOR_LIST and v is not None:
            parts.append(
                "["
                + ", ".join(
                    f"Tensor{list(x.shape)}:{str(x.dtype).removeprefix('torch.')}"
                    if x is not None
                    else "None"
                    for x in v
                )
                + "]"
            )
    return ", ".join(parts) or "no tensor inputs"


def op_failure(op, full, kinds, exc: BaseException) -> BaseException:
    """A clear error naming the op, its inputs and the user's frame; OOM becomes torch.OutOfMemoryError."""
    where = _user_frame()
    if memory.is_jax_oom(exc):
        return memory.oom_from_jax(exc, f"{op} on {_describe(full, kinds)} (at {where})")
    mismatch = placement.mesh_mismatch(exc, f"{op} on ({_describe(full, kinds)}) at {where}")
    if mismatch is not None:
        return mismatch
    return RuntimeError(
        f"hf_tpu: {op} failed on ({_describe(full, kinds)}) at {where}: {type(exc).__name__}: {exc}"
    )


class OpKernel:
    """The PrivateUse1 kernel of one overload: functional, in-place (`mode='inplace'`) or out=."""

    def __init__(self, op, lowering: Lowering, mode: str = "functional", functional=None) -> None:
        self.op = op
        self.lowering = lowering
        self.mode = mode
        self.sig = Signature(op)
        # in-place/out=: the functional overload whose schema the lowering is written for
        self.functional = functional or op
        self.fsig = Signature(self.functional) if functional is not None else self.sig
        self.cache: dict = {}
        self.lock = threading.Lock()
        self.dynamic_scalars = False
        # the baked-in scalar values this kernel has been built with (`_count_scalar_values`)
        self.baked_scalar_values: set = set()
        # under DeferAndFuse, views' storage offsets are baked into executables until one argument
        # layout has been seen at too many offsets (`_offsets_vary`); then they are traced
        self.dynamic_offsets = False
        self.baked_offset_layouts: dict = {}
        # the argument checks CPU makes and the meta kernel skips (arg_checks), or None
        self.checks = arg_checks.for_op(self.functional)
        # in-place/out=: CPU's memory-overlap checks of the destination (overlap.policy), or None
        self.overlap = None if mode == "functional" else overlap.policy(op, self.functional)
        # the C++ recorder can record it (one fresh output, no random draw): native_recording.py
        self.teachable = native_recording.teach is not None and mode == "functional" and not lowering.random

    # -- entry point from the dispatcher --------------------------------------------------------
    def __call__(self, *args, **kwargs):
        prior = _set_eval_frame(None)  # see `outside_dynamo`
        try:
            return self._call(args, kwargs)
        finally:
            _set_eval_frame(prior)

    def _call(self, args: tuple, kwargs: dict):
        full = self.sig.normalize(args, kwargs)
        if self.mode == "functional":
            results, spec = self.run(full, full)
            return self._wrap(results, spec)
        if self.mode == "inplace":
            dest = full[0]
            if _whole_storage_in_place(dest):
                with DONATION_LOCK:  # from the check until the payload holds the result (tensor.py)
                    results, _ = self.run(full, full, _whole_storage_in_place(dest))
                    self._store(dest, results, dest.shape, dest.dtype, full)
                return dest
            # several threads: compute from the destination and store into it as one step (as one stream
            # orders two threads' `x.add_(1)` on CUDA), so neither update is lost
            with update_lock():
                results, _ = self.run(full, full)
                self._store(dest, results, dest.shape, dest.dtype, full)
            return dest
        # out=: as one step too with several threads (`torch.add(x, 1, out=x)` reads its destination)
        outs = [full[i] for i in self.sig.mutable]
        fargs = [v for i, v in enumerate(full) if i not in self.sig.mutable]
        with update_lock():
            results, spec = self.run(fargs, full)
            if len(outs) == 1:
                self._store_out(outs[0], results, spec, full)
                return outs[0]
            for o, r, s in zip(outs, results, spec or [None] * len(outs)):
                self._store_out(o, r, s, full)
        return tuple(outs)

    def _store(self, dest, value, shape, dtype, full):
        jdt = to_jax_dtype(dtype)
        if value.dtype != jdt or tuple(value.shape) != tuple(shape):
            value = lazy.maybe_call(fit_fn(tuple(shape), jdt), (value,))
        try:
            if not dest.is_contiguous() and 0 in dest.stride():
                # a view repeating elements: the positions the op writes, as CPU does (write_plans.py)
                write(
                    dest, value, write_plans.write_plan(self.functional, dest, full, self.mode == "inplace")
                )
            else:
                write(dest, value)
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise op_failure(self.op, full, self.sig.kinds, exc) from exc

    def _store_out(self, out, value, spec, full):
        dtype = spec[1] if spec else to_torch_dtype(value.dtype)
        if not torch.can_cast(dtype, out.dtype):
            raise RuntimeError(
                f"result type {_dtype_name(dtype)} can't be cast to the desired output type {_dtype_name(out.dtype)}"
            )
        shape = tuple(value.shape)
        if tuple(out.shape) != shape:
            stride = self._resized_strides(out, full)
            out.resize_(shape)
            if stride is not None and tuple(out.stride()) != stride and tuple(out.shape) == shape:
                out.as_strided_(shape, stride)
        self._store(out, value, shape, out.dtype, full)

    def _resized_strides(self, out, full) -> tuple | None:
        """The strides PyTorch gives `out` when this out= op resizes it: its meta kernel's, which follow
        the result's layout (`torch.mul(x.t(), 2, out=empty)` is transposed, a channels-last input
        gives a channels-last out), not row-major. None where the meta kernel cannot say. Only runs when
        an out= tensor is resized."""
        outs = [full[i] for i in self.sig.mutable]
        k = next((n for n, o in enumerate(outs) if o is out), None)
        try:
            if torch.Tag.pointwise in self.op.tags or torch.Tag.pointwise in self.functional.tags:
                # TensorIterator restrides a resized out= like its functional result; the meta kernels
                # of pointwise out= overloads (Python references) resize row-major instead
                fargs = [v for i, v in enumerate(full) if i not in self.sig.mutable]
                meta = meta_call(self.functional, self.fsig, fargs)
            else:
                meta = meta_call(self.op, self.sig, full)
        except Exception:  # noqa: BLE001 - the op itself reports bad arguments; keep row-major then
            return None
        if meta is UNKNOWN or k is None:
            return None
        if isinstance(meta, list | tuple):
            meta = meta[k] if k < len(meta) else None
        return tuple(meta.stride()) if isinstance(meta, torch.Tensor) else None

    def _wrap(self, results, spec):
        if spec is not None and type(spec[-1]) is _DTYPE:
            return wrap_spec(results, spec)  # one output of known shape and dtype: the common case
        if type(spec) is LaidOut:
            spec, layout = spec
            if type(spec[-1]) is _DTYPE:
                return wrap_laid_out(results, spec[1], layout)
            return type(results)(
                None
                if r is None
                else wrap(r, s[1] if s else None)
                if o is None
                else wrap_laid_out(r, s[1], o)
                for r, s, o in zip(results, spec, layout)
            )
        if isinstance(results, list | tuple):
            return type(results)(
                None if r is None else wrap(r, s[1] if s else None)  # None: an undefined tensor
                for r, s in zip(results, spec or [None] * len(results))
            )
        return wrap(results, spec[1] if spec else None)

    # -- the cached, jitted computation -----------------------------------------------------------
    def _scalar_is_leaf(self, v, dynamic: bool) -> bool:
        """Is Python number `v` (a Scalar argument) a traced input rather than baked into the executable?

        Baked in by default: a scalar leaf costs ~1.5 us more per call than an array and most scalars
        (alpha=1, eps, scales) never change. A kernel that has seen many distinct values switches to
        traced scalars for good; ints outside int32 always travel as leaves (x64 promotion rules).
        """
        if self.lowering.static_scalars or type(v) is bool or type(v) is complex:  # complex: always baked
            return False
        if dynamic:
            return True
        return type(v) is int and not -(1 << 31) <= v < (1 << 31)

    def _offsets_vary(self, key: tuple) -> bool:
        """Has this argument layout (`key` without its views' offsets) been built at more than
        _MAX_BAKED_OFFSETS offsets? Under DeferAndFuse an offset is a constant of the executable (a
        static slice, which fuses), so a view that moves every step (`x[i * b:(i + 1) * b]`, a cache
        read at `pos`) would make every step's program new; such a kernel traces its offsets instead."""
        layout = _without_offsets(key)
        if layout == key:
            return False
        n = self.baked_offset_layouts[layout] = self.baked_offset_layouts.get(layout, 0) + 1
        return n > _MAX_BAKED_OFFSETS

    def _count_scalar_values(self, values: tuple) -> None:
        """Switch to traced scalars once this kernel has been built for more than
        _MAX_STATIC_SCALAR_BUILDS (DeferAndFuse: _MAX_STATIC_SCALAR_BUILDS_DEFERRED) distinct baked-in
        values. Values, not builds: `add(x, 1)` over a growing decode length builds once per shape with
        the one value 1, and counting those builds switched it to traced scalars mid-`generate`, so the
        next identical call recorded other kernels and every DeferAndFuse program around its compiled
        step compiled again."""
        seen = self.baked_scalar_values
        if values not in seen:
            seen.add(values)
            limit = _MAX_STATIC_SCALAR_BUILDS_DEFERRED if lazy._enabled else _MAX_STATIC_SCALAR_BUILDS
            if len(seen) > limit:
                self.dynamic_scalars = True  # many distinct values: stop compiling one executable per value
                seen.clear()

    def run(self, fargs: list, full: list, donate_first: bool = False):
        """Execute the lowering on `fargs` (the functional op's arguments); returns (arrays, meta spec).

        `donate_first`: fargs[0] is an in-place op's destination that may be updated in place (see
        `_whole_storage_in_place`): its buffer is donated unless another argument reads the same array.
        """
        if self.checks is not None:
            run_checks(self.checks, fargs)
        leaves = []
        key = []
        views = []  # per tensor argument, the View it is read through (None: its value); for _build
        append = key.append
        bake = lazy._enabled and not self.dynamic_offsets
        # read once: the key and the executable must agree on which scalars are inputs even when another
        # thread's build switches this kernel to traced scalars in between
        dynamic = self.dynamic_scalars
        generator = None
        for v, k in zip(fargs, self.fsig.kinds):
            if k == TENSOR:
                if v is None:
                    append(None)
                elif type(v) in _PY_NUMBERS:  # a wrapped number (x * 0.5) arrives as a Python scalar
                    if self._scalar_is_leaf(v, dynamic):
                        leaves.append(v)
                        append(type(v))
                    else:
                        append(_scalar_key(v))
                else:
                    a, view, offset = op_input(v, bake)
                    leaves.append(a)
                    views.append(view)
                    if view is None:
                        append(a.shape)
                    else:
                        append(view)
                        if offset is not None:
                            leaves.append(offset)
                    append(a.dtype)
            elif k == NUMBER:
                tv = type(v)
                if (tv is float or tv is int) and self._scalar_is_leaf(v, dynamic):
                    leaves.append(v)
                    append(tv)
                else:
                    append(_scalar_key(v))
            elif k == TENSOR_LIST:
                sub = []
                for x in v:
                    if x is None:
                        sub.append(None)
                    else:
                        a, view, offset = op_input(x, bake)
                        leaves.append(a)
                        views.append(view)
                        if offset is not None:
                            leaves.append(offset)
                        sub.append((a.shape if view is None else view, a.dtype))
                append(tuple(sub))
            elif k == GENERATOR:
                if v is not None:
                    if v.device.type != "tpu":
                        return self._run_with_cpu_generator(fargs, full)
                    generator = v  # a tpu generator (native path): its state drives the draw
                append(None)
            else:
                append(_freeze(v))
        if self.overlap is not None:
            self._check_overlap(fargs, full, leaves, views)
        for i in self.fsig.optional_dtypes:
            if fargs[i] is None:
                append(torch.get_default_dtype())
                break
        if generator is not None:  # drawn below from its state; the executable never sees it
            fargs = [None if x is generator else x for x in fargs]
        key = tuple(key)
        entry = self.cache.get(key)
        if entry is None:
            executables.collect_if_due()  # a safe point: no JAX call under way
            if bake and self._offsets_vary(key):
                self.dynamic_offsets = True
            entry = self._build(fargs, full, views, dynamic)
            with self.lock:
                self.cache[key] = entry
        if self.lowering.random:
            leaves.insert(0, rng.next_material() if generator is None else rng.material_of(generator))
        try:
            if self.teachable and not MULTI_CHIP[0]:
                # the C++ kernel may record (DeferAndFuse) or run (Strict) this op from now on
                # (native_recording.py); it checks the rest (the tensors it keyed, where each leaf comes
                # from). Numbers' values leave its key with traced scalars, unless a static check may
                # read them.
                spec = entry.native_spec
                if spec is None:
                    spec = entry.native_spec = native_recording.out_spec(entry.spec)
                if spec:
                    traced = dynamic and self.checks is None
                    native_recording.teach(self, entry, spec, fargs, views, leaves, traced)
            if lazy._enabled:
                return lazy.call(entry.fn, leaves, entry), entry.spec
            if bake:  # another thread left DeferAndFuse during this op: its inputs may still be pending
                leaves = [lazy.concrete(x) if type(x) is LazyValue else x for x in leaves]
            first = 1 if self.lowering.random else 0
            if donate_first and sum(x is leaves[first] for x in leaves) == 1:
                results = run_donating(entry.fn, first, *leaves)
            else:
                results = entry.fn(*leaves)
            platform.last_launched[0] = results
            if modes.launch_blocking():
                platform.jax().block_until_ready(results)
        except Exception as exc:  # noqa: BLE001 - JAX errors become op-named errors
            # an input a failed DeferAndFuse flush never computed (JAX would say "not a valid JAX type")
            gone = next((x for x in leaves if type(x) is LazyValue and x.concrete is None), None)
            cause = exc if gone is None else lazy.lost(gone)
            raise op_failure(self.op, full, self.sig.kinds, cause) from cause
        return results, entry.spec

    def _check_overlap(self, fargs: list, full: list, leaves: list, views: list) -> None:
        """CPU's memory-overlap errors for this write (`overlap.py`). In place, the destination is
        fargs[0] and its storage's array leaves[0]: the full check runs only when its view repeats
        elements (a stride 0) or another input was read from the same array (almost never), so the common
        path costs two tests."""
        internal, inputs = self.overlap
        if self.mode == "inplace":
            dest = fargs[0]
            view = views[0] if views else None
            if internal and view is not None and view.stride is not None and 0 in view.stride:
                overlap.assert_no_internal_overlap(dest)
            if inputs is not None and leaves:
                first = leaves[0]
                for i in range(1, len(leaves)):
                    if leaves[i] is first:
                        overlap.assert_inputs_apart(dest, overlap.tensors_of(fargs[1:]), inputs)
                        break
            return
        for i in self.sig.mutable:
            out = full[i]
            if not isinstance(out, torch.Tensor):
                continue
            if internal and not out.is_contiguous():
                overlap.assert_no_internal_overlap(out)
            if inputs is not None:
                overlap.assert_inputs_apart(out, overlap.tensors_of(fargs), inputs)

    def _build(self, fargs: list, full: list, views: list, dynamic: bool) -> _Entry:
        # what PyTorch would return (dtype, shape); the in-place/out= op itself validates its arguments
        layout = None
        if self.mode == "inplace":
            spec = meta_run(self.op, self.sig, full)
            # some in-place meta kernels (mul_) skip PyTorch's result-type check: apply it here
            fspec = meta_run(self.functional, self.fsig, fargs)
            dest = full[0]
            if fspec and isinstance(fspec[1], torch.dtype) and not torch.can_cast(fspec[1], dest.dtype):
                raise RuntimeError(
                    f"result type {_dtype_name(fspec[1])} can't be cast to the desired output type "
                    f"{_dtype_name(dest.dtype)}"
                )
        else:
            meta = meta_call(self.functional, self.fsig, fargs)
            spec = None if meta is UNKNOWN else out_spec(meta)
            # outputs PyTorch lays out permuted are computed in memory order (functional kernels only: an
            # in-place or out= result is stored into its destination's own layout)
            if self.mode == "functional" and meta is not UNKNOWN:
                layout = out_layout(meta)
        kinds = self.fsig.kinds
        # how each argument reaches the lowering: a traced leaf, a list of leaves, or a baked-in value
        how = []
        baked = []  # the baked-in numbers' cache keys
        for v, k in zip(fargs, kinds):
            number = type(v) in _PY_NUMBERS and k in (TENSOR, NUMBER)
            if number:
                leaf = self._scalar_is_leaf(v, dynamic)
                if not leaf:
                    baked.append(_scalar_key(v))
                how.append(_LEAF if leaf else _BAKED_ARRAY if k == TENSOR else _BAKED)
            elif k == TENSOR:
                how.append(_BAKED if v is None else _LEAF)
            elif k == TENSOR_LIST:
                how.append(_LEAVES)
            else:
                how.append(_BAKED)
        if baked and not self.lowering.static_scalars:
            self._count_scalar_values(tuple(baked))
        # never capture the tensors themselves: the cache would keep their storages alive
        view_iter = iter(views)
        template = [_placeholder(v, k, view_iter) for v, k in zip(fargs, kinds)]
        fn = self.lowering.fn
        is_random = self.lowering.random
        jax = platform.jax()
        jnp = jax.numpy

        def take(v, it):
            """The next input: a value (a tensor's or a traced number), or a view read from its
            storage's array (fused into this executable)."""
            return read_input(jax, v if type(v) is View else None, it)

        def call(*leaves):
            it = iter(leaves)
            args = [rng.key_from(next(it))] if is_random else []
            for v, h in zip(template, how):
                if h is _LEAF:
                    args.append(take(v, it))
                elif h is _LEAVES:
                    args.append([None if x is None else take(x, it) for x in v])
                elif h is _BAKED_ARRAY:  # a wrapped number stays an (weakly typed) array for the lowering
                    args.append(jnp.asarray(v))
                else:
                    args.append(v)
            out = cast_like(jnp, fn(*args), spec)
            return out if layout is None else lay_out(jnp, out, layout)

        return _Entry(jax.jit(call), spec if layout is None else LaidOut((spec, layout)), self.op)

    def _run_with_cpu_generator(self, fargs, full):
        """A CPU `torch.Generator` was passed: draw on CPU with it (exact CPU stream), then copy over."""
        cpu_args = [_to_cpu(v) for v in fargs]
        pos, kw = self.fsig.split(cpu_args)
        result = self.functional(*pos, **kw)
        jax = platform.jax()
        from hf_tpu.runtime.buffers.placement import host_to_jax

        if isinstance(result, torch.Tensor):
            return host_to_jax(result), (tuple(result.shape), result.dtype)
        arrays = tuple(host_to_jax(r) for r in result)
        del jax
        return arrays, tuple((tuple(r.shape), r.dtype) for r in result)


def _whole_storage_in_place(dest: torch.Tensor) -> bool:
    """Whether in-place op destination `dest` is its storage's whole array, in its dtype, and nothing but
    the storage references that array, so the op's executable may write it in place (`can_update_in_place`):
    `param.add_(...)`, `cache.index_copy_(...)`, `x.masked_fill_(...)` on a large tensor then cost their
    result, not a copy of the buffer plus a second live buffer."""
    p = _payloads.get(dest.untyped_storage().data_ptr())
    if p is None or dest.dtype != p.dtype or dest.storage_offset() != 0 or tuple(dest.shape) != p.shape:
        return False
    return dest.is_contiguous() and can_update_in_place(p)


def _dtype_name(dtype: torch.dtype) -> str:
    return {
        torch.float32: "Float",
        torch.float64: "Double",
        torch.int64: "Long",
        torch.int32: "Int",
        torch.bool: "Bool",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.complex64: "ComplexFloat",
    }.get(dtype, str(dtype))


def _to_cpu(v):
    if isinstance(v, torch.Tensor) and v.device.type == "tpu":
        return v.cpu()
    if isinstance(v, list | tuple):
        return type(v)(_to_cpu(x) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("cpu")
    return v


# -- deriving in-place and out= variants ---------------------------------------------------------
def _arg_names(op) -> list[tuple[str, str]]:
    """(name, type) per argument: overloads like bernoulli.p/.Tensor share names, not types."""
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def functional_of(op) -> torch._ops.OpOverload | None:
    """The functional overload an in-place/out= overload computes (add_.Tensor -> add.Tensor)."""
    schema = op._schema
    name = schema.name.removeprefix("aten::")
    sig = Signature(op)
    if not sig.mutable:
        return None
    if sig.mutable == [0] and name.endswith("_") and not schema.arguments[0].kwarg_only:
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is None:
            return None
        target = _arg_names(op)
        for ov in packet.overloads():
            cand = getattr(packet, ov)
            if Signature(cand).mutable:
                continue
            if _arg_names(cand) == target:
                return cand
        return None
    # out= variant: same packet, same arguments minus the written ones
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    target = [n for i, n in enumerate(_arg_names(op)) if i not in sig.mutable]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if cand is op or Signature(cand).mutable:
            continue
        if _arg_names(cand) == target:
            return cand
    return None


def derived_kernel(op) -> OpKernel | None:
    if any(str(op._schema.arguments[i].type).startswith("List") for i in Signature(op).mutable):
        return None  # list outputs (_foreach_*_, *.List_out) are lowered explicitly
    func = functional_of(op)
    if func is None or func not in TABLE or TABLE[func].kind != "jit":
        return None
    mode = "inplace" if op._schema.name.endswith("_") and Signature(op).mutable == [0] else "out"
    return OpKernel(op, TABLE[func], mode=mode, functional=func)


provide_kernel_factory(OpKernel)

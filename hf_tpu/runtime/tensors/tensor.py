"""tpu tensors <-> JAX arrays: create a tensor around a buffer, read a (strided) view, write through one."""

from __future__ import annotations

import functools
import math
import sys
from functools import cache
from typing import NamedTuple

import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers import storage as storage_module
from hf_tpu.runtime.buffers.dtypes import check_platform_dtype, to_jax_dtype, to_torch_dtype
from hf_tpu.runtime.buffers.memory import _fraction as _FRACTION
from hf_tpu.runtime.buffers.memory import check_capacity
from hf_tpu.runtime.buffers.placement import is_sharded, keep_placement
from hf_tpu.runtime.buffers.platform import MULTI_CHIP
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import (
    DONATION_LOCK,
    _device_thread,
    _device_threads,
    _get_ident,
    array_of,
    note_device_thread,
    update_lock,
)
from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.launch.lazy import LazyValue
from hf_tpu.runtime.tensors import nd_views, repeating
from hf_tpu.runtime.tensors.strided import box_plan, grid_shape, grid_starts, read_box, write_box, write_grid

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed
_create = torch._C._acc.create_empty_tensor
_payloads = REGISTRY._payloads
_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
_NATIVE_NEW = storage_module._new_device_tensor is not None  # the C++ extension makes output tensors


class DeviceMismatchError(RuntimeError):
    pass


@cache
def contiguous_strides(shape: tuple) -> tuple:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def new_tensor(shape, dtype: torch.dtype, array=None) -> torch.Tensor:
    """A fresh contiguous tpu tensor; `array` (a jax.Array of that shape/dtype) or nothing allocated yet."""
    if type(shape) is not tuple:
        shape = tuple(shape)
    nbytes = _numel(shape) * dtype.itemsize
    if array is None:
        check_capacity(nbytes)
        check_platform_dtype(dtype)
    elif _FRACTION[0] != 1.0:  # set_per_process_memory_fraction: every new buffer counts
        check_capacity(nbytes, array)
    if _NATIVE_NEW:
        return REGISTRY.new_tensor(shape, dtype, nbytes, array)
    t = _create(shape, dtype)
    if _SWAP:
        REGISTRY.adopt(t.untyped_storage(), nbytes, shape, dtype, array)
    else:  # torch without UntypedStorage._swap_data_ptr_
        storage = REGISTRY.new_storage(nbytes, shape, dtype, array)
        _set_storage(_CPU_KEYS, t, storage, 0, shape, contiguous_strides(shape))
    return t


@cache
def _numel(shape: tuple) -> int:
    return math.prod(shape)


def new_strided(shape, stride, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tpu tensor with explicit strides (payload kept flat over the storage)."""
    shape, stride = tuple(shape), tuple(stride)
    if stride == contiguous_strides(shape):
        return new_tensor(shape, dtype)
    numel = 0 if 0 in shape else 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    nbytes = numel * dtype.itemsize
    check_capacity(nbytes)
    t = _create(shape, dtype)
    storage = REGISTRY.new_storage(nbytes, (numel,), dtype)
    _set_storage(_CPU_KEYS, t, storage, 0, shape, stride)
    return t


def wrap(array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tpu tensor owning `array`."""
    return new_tensor(array.shape, dtype or to_torch_dtype(array.dtype), array)


def wrap_spec(array, spec: tuple) -> torch.Tensor:
    """A new tpu tensor owning `array`, whose (shape tuple, torch dtype) `spec` is known: the op path's
    `wrap` (once per op output), minus the conversions."""
    shape, dtype = spec
    if _NATIVE_NEW and _FRACTION[0] == 1.0:
        return REGISTRY.new_tensor(shape, dtype, _numel(shape) * dtype.itemsize, array)
    if _SWAP and _FRACTION[0] == 1.0:
        t = _create(shape, dtype)
        REGISTRY.adopt(t.untyped_storage(), _numel(shape) * dtype.itemsize, shape, dtype, array)
        return t
    return new_tensor(shape, dtype, array)


def wrap_laid_out(array, dtype: torch.dtype, order: tuple) -> torch.Tensor:
    """A new tpu tensor whose value is `array` transposed into memory order `order` (outermost dim first,
    `strided.memory_order`): a tensor owning `array` (its storage's payload, row-major) with the sizes and
    strides of that buffer permuted back to the logical order, as `empty_strided` would lay it out."""
    laid = tuple(array.shape)
    t = wrap_spec(array, (laid, dtype))
    shape, stride = _permuted_back(laid, order)
    _set_storage(_CPU_KEYS, t, t.untyped_storage(), 0, shape, stride)  # metadata only, no Python kernel
    return t


@cache
def _permuted_back(laid: tuple, order: tuple) -> tuple:
    """(sizes, strides) of a row-major buffer of shape `laid` seen in logical order: logical dim `order[i]`
    is the buffer's dim i."""
    laid_stride = contiguous_strides(laid)
    shape, stride = [0] * len(order), [0] * len(order)
    for i, d in enumerate(order):
        shape[d], stride[d] = laid[i], laid_stride[i]
    return tuple(shape), tuple(stride)


def _foreign(t: torch.Tensor):
    """A tensor with no tpu payload: a CPU 0-dim scalar becomes a constant, anything else is an error."""
    if t.device.type != "tpu":
        if t.dim() == 0 and t.device.type == "cpu":
            from hf_tpu.runtime.buffers import host_copies

            host_copies.complete_into(t)
            jnp = platform.jax().numpy
            return jnp.asarray(t.item(), dtype=to_jax_dtype(t.dtype))
        raise DeviceMismatchError(
            f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and {t.device}!"
        )
    if t.device.type == "tpu" and t.untyped_storage().nbytes() == 0:
        jnp = platform.jax().numpy
        return jnp.zeros(tuple(t.shape), dtype=to_jax_dtype(t.dtype))
    raise RuntimeError(
        "hf_tpu: this tpu tensor has no device storage (was it created by a foreign extension?)"
    )


def to_jax(t: torch.Tensor):
    """The value of tpu tensor `t` as a computed jax.Array (a view is gathered from its storage's buffer).

    Under DeferAndFuse this is a sync point: pending work is flushed first.
    """
    value = to_jax_lazy(t)
    if type(value) is LazyValue:
        return lazy.concrete(value)
    return value


def to_jax_lazy(t: torch.Tensor):
    """Like `to_jax`, but may return a pending `LazyValue` (the op path under DeferAndFuse)."""
    array, view, _ = op_input(t, bake_offset=True)
    if view is None:
        return array
    if view.nd:
        read = _read_nd(view.base_shape, view.shape, view.stride)
        if not lazy._enabled and _split(array):
            return fixed_offset(read, view.offset)(array)  # static starts: XLA moves only the view's part
    elif view.stride is None:
        read = _read_contiguous(view.base_shape, view.shape)
    else:
        read = _read_strided(view.base_shape, view.shape, view.stride)
    return _call(read, array, view.offset, shape=view.shape)


class View(NamedTuple):
    """How an op's executable reads a view of its argument's storage: the op's cache key holds this and
    the storage's whole array is the traced input, so reading the view fuses into the op instead of
    running as an executable of its own (`weight.t()` into `mm`, head transposes into attention)."""

    base_shape: tuple
    shape: tuple
    stride: tuple | None  # None: contiguous (flat reads)
    offset: int | tuple | None  # None: traced (an extra input follows the array); N-D: one start per dim
    # read in N-D (nd_views.py): the view's strides, and per refined dim of the base where it starts
    nd: bool = False


def op_input(t: torch.Tensor, bake_offset: bool):
    """(array, view, offset) for tpu tensor `t` as an op's input: `view` None means `array` is t's value;
    else the executable reads `view` of `array` (t's storage payload), at `offset` when `view.offset`
    is None. Offsets are baked in under DeferAndFuse (like recorded view reads) or when zero.

    Values that are not a plain read of the storage's array (conj/neg bits, never written, another
    dtype's bytes, no tpu payload) are computed here and come back without a view."""
    if _get_ident() != _device_thread[0]:
        note_device_thread()
    if t.is_neg() or (t.dtype.is_complex and t.is_conj()):  # a real tensor's neg view: `z.conj().imag`
        return _resolve_lazy_bits(t), None, None
    p = _payloads.get(t.untyped_storage().data_ptr())
    if p is None:
        p = REGISTRY.payload(t.untyped_storage().data_ptr())  # an output of the C++ recorder, if any
        if p is None:
            return _foreign(t), None, None
    array = p.array if len(_device_threads) <= 1 else array_of(p)
    shape = t.shape
    offset = t.storage_offset()
    if array is None:  # never written (torch.empty): reads as zeros
        return _zeros(tuple(shape), t.dtype), None, None
    if t.dtype != p.dtype:
        read = _read_reinterpret(p.shape, p.dtype, tuple(shape), t.stride(), t.dtype)
        return _call(read, array, offset), None, None
    contiguous = t.is_contiguous()
    if offset == 0 and contiguous and shape == p.shape:
        return array, None, None
    if MULTI_CHIP[0]:  # a sharded base stays sharded through an N-D read (nd_views.py)
        stride = t.stride()
        starts = _nd_starts(p.shape, tuple(shape), stride, offset)
        if starts is not None:
            if bake_offset or not any(starts) or _split(array):
                return array, View(p.shape, tuple(shape), stride, starts, True), None
            return array, View(p.shape, tuple(shape), stride, None, True), starts
    stride = None if contiguous else t.stride()
    if bake_offset or offset == 0:
        return array, View(p.shape, tuple(shape), stride, offset), None
    return array, View(p.shape, tuple(shape), stride, None), offset


def op_inputs(tensors, bake_offset: bool) -> tuple[list, tuple]:
    """`op_input` over several tensors: (the executable's inputs, one view per tensor)."""
    leaves = []
    views = []
    for t in tensors:
        array, view, offset = op_input(t, bake_offset)
        leaves.append(array)
        if offset is not None:
            leaves.append(offset)
        views.append(view)
    return leaves, tuple(views)


def read_input(jax, view: View | None, it):
    """Traceable: the next op input from iterator `it` (the inputs `op_input` produced), read through
    `view` when it has one."""
    x = next(it)
    if view is None:
        return x
    offset = next(it) if view.offset is None else view.offset
    if view.nd:
        return nd_views.read(jax, x, offset, nd_views.nd_plan(view.base_shape, view.shape, view.stride))
    return read_view(jax, x, offset, view.shape, view.stride)


def _resolve_lazy_bits(t: torch.Tensor):
    """Conjugate/negative views of complex tensors carry a bit instead of data: apply it."""
    jnp = platform.jax().numpy
    base = t
    conj, neg = t.is_conj(), t.is_neg()
    if conj:
        base = base.conj()  # the conj of a conj view clears the bit
    if neg:
        base = base._neg_view()
    value = to_jax_lazy(base)
    value = lazy.concrete(value)
    if conj:
        value = jnp.conj(value)
    if neg:
        value = -value
    return value


def _call(fn, *args, shape: tuple | None = None):
    """Run a jitted view kernel now, or record it (DeferAndFuse, or a still-pending argument).

    `shape`: the result's shape when its dtype is the base's (reads and writes through same-dtype
    views), so a recording needs no abstract evaluation.
    """
    if lazy._enabled or type(args[0]) is LazyValue or type(args[1]) is LazyValue:
        fn, args = _recorded_offset(fn, args)
        if shape is not None:
            return lazy.call(fn, args, avals=(False, None, ((shape, args[0].dtype),)))
        return lazy.call(fn, args)
    return fn(*args)


# view kernels recorded under DeferAndFuse: the storage offsets each was recorded with, until it has seen
# more than _MAX_BAKED_OFFSETS of them; then its offsets are traced (`_traced_offset_fns`)
_MAX_BAKED_OFFSETS = 4
_baked_offsets: dict = {}
_traced_offset_fns: set = set()
_offset_fns: dict = {}


def _recorded_offset(fn, args: tuple) -> tuple:
    """The kernel and arguments to record for view kernel `fn` (storage offset last in `args`).

    The offset becomes a constant of the fused program: XLA turns the dynamic slice into a static one,
    which fuses, and the program has one input less. A kernel whose offset changes from step to step
    (`x[i * b:(i + 1) * b]` in a loop, a cache written at `pos`) would then make every step a new
    program to compile; after a few distinct offsets its offset is traced instead (a program input).
    """
    offset = args[-1]
    if fn not in _traced_offset_fns:
        fixed = _offset_fns.get((fn, offset))
        if fixed is not None:
            return fixed, args[:-1]
        seen = _baked_offsets.setdefault(fn, set())
        seen.add(offset)
        if len(seen) <= _MAX_BAKED_OFFSETS:
            return _at_offset(fn, offset), args[:-1]
        _traced_offset_fns.add(fn)
        for old in seen:
            _offset_fns.pop((fn, old), None)
        _baked_offsets.pop(fn, None)
    if type(offset) is tuple:  # a grid write's start per dimension: one traced scalar each
        return _spread_last(fn, len(offset)), args[:-1] + offset
    return fn, args


def _at_offset(fn, offset):
    """`fixed_offset`, remembered for the DeferAndFuse bookkeeping above."""
    fixed = _offset_fns[(fn, offset)] = fixed_offset(fn, offset)
    return fixed


@functools.lru_cache(maxsize=4096)
def fixed_offset(fn, offset):
    """View kernel `fn` (taking the storage offset, or N-D starts, last) with `offset` fixed: one program
    per distinct position. The kernel's own function is traced with the offset as a constant (through the
    jitted kernel it would be traced again as an input: an N-D read of a split dim would then be a dynamic
    slice, which GSPMD gathers whole first; a static one moves only the view's part between chips)."""
    jax = platform.jax()
    inner = getattr(fn, "__wrapped__", fn)
    return jax.jit(lambda *args: inner(*args, offset))


@cache
def _spread_last(fn, n: int):
    """`fn` taking its last argument (a tuple of `n` numbers) as `n` separate arguments."""
    jax = platform.jax()
    return jax.jit(lambda *args: fn(*args[:-n], tuple(args[-n:])))


def write(t: torch.Tensor, value, plan: tuple | None = None) -> None:
    """Store `value` (an array with t's shape and dtype) into tpu tensor `t`, through views. A view that
    repeats elements (a stride 0) is written as CPU would (`repeating.py`), following `plan` (how, order)
    when the op writes only part of it."""
    if _get_ident() != _device_thread[0]:
        note_device_thread()
    if t.is_neg() or t.is_conj():  # a bit view stores the inverse of what it reads (_resolve_lazy_bits)
        if t.is_conj():
            value = lazy.maybe_call(_conj_fn(), (value,))
        if t.is_neg():
            value = lazy.maybe_call(_neg_fn(), (value,))
    ptr = t.untyped_storage().data_ptr()
    p = REGISTRY.payload(ptr)
    if p is None:
        raise RuntimeError(f"hf_tpu: cannot write into a tensor on {t.device} without a tpu payload")
    shape = tuple(t.shape)
    offset = t.storage_offset()
    extra = ()  # inputs of `put` between the value and the offset
    if t.dtype == p.dtype:
        if offset == 0 and t.is_contiguous() and math.prod(shape) == math.prod(p.shape):
            value = value if shape == p.shape else _reshaped(value, p.shape)
            if MULTI_CHIP[0] and type(value) is not LazyValue:
                value = keep_placement(p.array, value)
            REGISTRY.set_array(ptr, value)
            return
        if not t.is_contiguous() and 0 in (stride := t.stride()) and repeating.repeats(shape, stride):
            how, order = plan or (repeating.ALL, None)
            put = repeating.write_kernel(p.shape, shape, stride, how)
            if order is not None:
                extra = (lazy.concrete(order) if type(order) is LazyValue and not lazy._enabled else order,)
        else:
            # N-D, so a sharded buffer stays sharded (nd_views.py)
            nd = _nd_write(p.shape, shape, t.stride(), offset) if MULTI_CHIP[0] else None
            if nd is not None:
                put, offset = nd
                if type(value) is not LazyValue and not lazy._enabled and _split(p.array):
                    put, offset = fixed_offset(put, offset), _FIXED
            elif t.is_contiguous():
                put = _write_contiguous(p.shape, shape)
            else:
                stride = t.stride()
                box = _write_plan(shape, stride)
                starts = None if box is None else grid_starts(_numel(p.shape), shape, stride, offset, box)
                if starts is None:
                    put = _write_strided(p.shape, shape, stride)
                else:  # a rectangle of the buffer's grid: written in place at `starts` (strided.py)
                    put, offset = _write_grid(p.shape, shape, stride), starts
    else:
        put = _write_reinterpret(p.shape, p.dtype, shape, t.stride(), t.dtype)
    tail = (value,) if offset is _FIXED else (value, *extra, offset)
    if type(value) is not LazyValue and can_update_in_place(p):
        with DONATION_LOCK:
            if can_update_in_place(p):  # still (another thread may have appeared)
                old = p.array
                result = run_donating(put, 0, old, *tail)
                REGISTRY.set_array(ptr, keep_placement(old, result) if MULTI_CHIP[0] else result)
                return
    shape = p.shape if t.dtype == p.dtype else None
    # with several threads, read the buffer, write the view into a copy and store it as one step: two
    # threads writing different elements of one tensor must not lose either write
    with update_lock():
        base = p.array if p.array is not None else _zeros(p.shape, p.dtype)
        result = _call(put, base, *tail, shape=shape)
        if MULTI_CHIP[0] and type(result) is not LazyValue:
            result = keep_placement(base, result)
        REGISTRY.set_array(ptr, result)


_FIXED = object()  # in place of an offset: the writer has its offset fixed (`fixed_offset`)


def _split(array) -> bool:
    """Whether payload `array` is split over chips: its views then read and write at static starts (a
    slice at traced starts along a split dim makes GSPMD gather the whole buffer to every chip first)."""
    return type(array) is not LazyValue and array is not None and is_sharded(array)


def _nd_starts(base_shape: tuple, shape: tuple, stride: tuple, offset: int) -> tuple | None:
    """Where an N-D read of view (shape, stride, offset) of a base of `base_shape` starts, or None when
    the view has no N-D plan (the flat read serves it)."""
    plan = nd_views.nd_plan(base_shape, shape, stride)
    return None if plan is None else nd_views.starts(plan, base_shape, offset)


def _nd_write(base_shape: tuple, shape: tuple, stride: tuple, offset: int):
    """(jitted writer, starts) for an N-D write through view (shape, stride, offset), or None."""
    plan = nd_views.nd_plan(base_shape, shape, stride)
    if not nd_views.writable(plan):
        return None
    starts = nd_views.starts(plan, base_shape, offset)
    return None if starts is None else (_write_nd(base_shape, shape, stride), starts)


@cache
def _read_nd(base_shape: tuple, shape: tuple, stride: tuple):
    jax = platform.jax()
    plan = nd_views.nd_plan(base_shape, shape, stride)
    return jax.jit(lambda base, starts: nd_views.read(jax, base, starts, plan))


@cache
def _write_nd(base_shape: tuple, shape: tuple, stride: tuple):
    jax = platform.jax()
    plan = nd_views.nd_plan(base_shape, shape, stride)
    return jax.jit(lambda base, value, starts: nd_views.write(jax, base, value, starts, plan))


def _reshaped(value, shape: tuple):
    return lazy.reshape(value, shape) if type(value) is LazyValue else value.reshape(shape)


# -- updating a storage's buffer in place ----------------------------------------------------------------
class RefProbe:
    """Holds one object the way a storage payload holds its array: calibrates `sys.getrefcount`
    (here and in compile.py's donation check) instead of assuming how CPython counts."""

    __slots__ = ("array",)


_probe = RefProbe()
_probe.array = object()
_PAYLOAD_ONLY = sys.getrefcount(_probe.array)  # references to an array only a payload holds, as counted below
del _probe


def can_update_in_place(p) -> bool:
    """Whether XLA may overwrite payload `p`'s buffer (donate it) instead of writing a new one.

    Call it holding DONATION_LOCK, and keep holding it until the payload has the result (readers in
    other threads take the lock to read a payload's array, `array_of`). In Strict mode only (a
    recording holds its inputs), and only when nothing but the payload references the array: not
    another storage (`copy_` and same-dtype `.to` share arrays), a pending async copy to host, a
    DeferAndFuse recording, another thread's op, or user code. The newest launch's record
    (`platform.last_launched`) may hold it too: `run_donating` replaces that record. A partial write
    into a large tensor (`x[i] = v`, a KV-cache slot) then costs the slice, not a copy of the whole
    buffer.
    """
    if p.array is None or lazy._enabled or type(p.array) is LazyValue:
        return False
    last = platform.last_launched[0]
    extra = 1 if last is p.array else sum(x is p.array for x in last) if type(last) in (list, tuple) else 0
    del last  # a reference of its own
    return sys.getrefcount(p.array) - extra == _PAYLOAD_ONLY


def run_donating(fn, index: int, *args):
    """Call jitted `fn` with argument `index` donated (its buffer becomes the result's)."""
    result = _donating(fn, index)(*args)
    platform.last_launched[0] = result  # the record may have held the donated (now deleted) array
    return result


@cache
def _donating(fn, index: int):
    return platform.jax().jit(fn.__wrapped__, donate_argnums=(index,))


def _zeros(shape: tuple, dtype: torch.dtype):
    """Zeros of (shape, dtype): one cached executable (an eager `jnp.zeros` costs ~30 us), recorded
    under DeferAndFuse so it fuses into the consumer."""
    return lazy.maybe_call(_zeros_fn(shape, to_jax_dtype(dtype)), ())


@cache
def _zeros_fn(shape: tuple, jdt):
    jax = platform.jax()
    return jax.jit(lambda: jax.numpy.zeros(shape, dtype=jdt))


# -- jitted view kernels, one per (base layout, view layout); the offset stays dynamic ---------------
def _flat_index(shape, stride, offset):
    jnp = platform.jax().numpy
    idx = jnp.asarray(offset, dtype=jnp.int64)
    for dim, (size, st) in enumerate(zip(shape, stride)):
        ar = jnp.arange(size, dtype=jnp.int64) * st
        idx = idx + ar.reshape((1,) * dim + (size,) + (1,) * (len(shape) - dim - 1))
    return jnp.broadcast_to(idx, shape)


def read_view(jax, base, offset, shape: tuple, stride: tuple | None):
    """Traceable: view (shape, stride; None = contiguous) of `base` (same dtype) at storage `offset`."""
    if stride is None:
        flat = base.reshape(-1)
        return jax.lax.dynamic_slice(flat, (offset,), (math.prod(shape),)).reshape(shape)
    plan = _box_plan(shape, stride)
    if plan is not None:  # slices/transposes (almost every view): see strided.py
        return read_box(jax, base, offset, shape, plan)
    return base.reshape(-1)[_flat_index(shape, stride, offset)]


@cache
def _box_plan(shape: tuple, stride: tuple):
    return box_plan(shape, stride)


@cache
def _read_contiguous(base_shape, shape):
    jax = platform.jax()
    return jax.jit(lambda base, offset: read_view(jax, base, offset, shape, None))


@cache
def _read_strided(base_shape, shape, stride):
    jax = platform.jax()
    return jax.jit(lambda base, offset: read_view(jax, base, offset, shape, stride))


@cache
def _write_contiguous(base_shape, shape):
    jax = platform.jax()

    def put(base, value, offset):
        flat = base.reshape(-1)
        return jax.lax.dynamic_update_slice(flat, value.reshape(-1), (offset,)).reshape(base_shape)

    return jax.jit(put)


@cache
def _write_plan(shape: tuple, stride: tuple):
    return box_plan(shape, stride, for_write=True)


@cache
def _write_grid(base_shape, shape, stride):
    jax = platform.jax()
    plan = _write_plan(shape, stride)
    grid = grid_shape(_numel(base_shape), stride, plan)
    return jax.jit(lambda base, value, starts: write_grid(jax, base, value, starts, plan, grid))


@cache
def _write_strided(base_shape, shape, stride):
    jax = platform.jax()
    plan = _write_plan(shape, stride)

    def put(base, value, offset):
        if plan is not None:
            return write_box(jax, base, value, offset, plan)
        flat = base.reshape(-1)
        return flat.at[_flat_index(shape, stride, offset)].set(value).reshape(base_shape)

    return jax.jit(put)


def _as_bytes(jax, base):
    jnp = jax.numpy
    flat = base.reshape(-1)
    if flat.dtype == jnp.bool_:
        flat = flat.astype(jnp.uint8)
    if jnp.issubdtype(flat.dtype, jnp.complexfloating):  # XLA bitcasts no complex: (real, imag) pairs
        flat = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
    b = jax.lax.bitcast_convert_type(flat, jnp.uint8)
    return b.reshape(-1)


@cache
def _conj_fn():
    jax = platform.jax()
    return jax.jit(jax.numpy.conj)


@cache
def _neg_fn():
    jax = platform.jax()
    return jax.jit(jax.numpy.negative)


def _from_bytes(jax, b, dtype):
    """uint8 bytes (..., itemsize) -> dtype values."""
    jnp = jax.numpy
    if dtype == jnp.bool_:
        return b[..., 0] != 0
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.float32 if dtype == jnp.complex64 else jnp.float64
        half = b.shape[-1] // 2
        pairs = jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], 2, half), part)
        # lax.complex, not re + 1j * im: 0 * inf would make a NaN real part
        return jax.lax.complex(pairs[..., 0], pairs[..., 1]).astype(dtype)
    if dtype.itemsize == 1:
        return jax.lax.bitcast_convert_type(b[..., 0], dtype)
    return jax.lax.bitcast_convert_type(b, dtype)


@cache
def _read_reinterpret(base_shape, base_dtype, shape, stride, dtype):
    """A view whose dtype differs from its storage's (x.view(torch.int32)): go through bytes."""
    jax = platform.jax()
    jdt = to_jax_dtype(dtype)
    size = dtype.itemsize

    def read(base, offset):
        b = _as_bytes(jax, base)
        elem = _flat_index(shape, stride, offset)[..., None] * size + jax.numpy.arange(size)
        return _from_bytes(jax, b[elem], jdt)

    return jax.jit(read)


@cache
def _write_reinterpret(base_shape, base_dtype, shape, stride, dtype):
    jax = platform.jax()
    jnp = jax.numpy
    jbase = to_jax_dtype(base_dtype)
    size = dtype.itemsize

    def put(base, value, offset):
        b = _as_bytes(jax, base)
        vb = _as_bytes(jax, value).reshape(shape + (size,))
        elem = _flat_index(shape, stride, offset)[..., None] * size + jnp.arange(size)
        b = b.at[elem].set(vb)
        isz = jbase.itemsize
        return _from_bytes(jax, b.reshape(-1, isz) if isz > 1 else b.reshape(-1, 1), jbase).reshape(
            base_shape
        )

    return jax.jit(put)

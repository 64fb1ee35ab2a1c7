"""`torch.tpu`: the device module, shaped like `torch.cuda` and named like TorchTPU's.

`tpu:0` is one logical device spanning all local chips; `device_count()` reports chips (DESIGN §3.3).
Functions that need JAX initialize it lazily; `is_available()` does not import JAX.
"""

from __future__ import annotations

import contextlib
import random as _random
import time

import torch

from hf_tpu.runtime.buffers import host_copies as _host_copies
from hf_tpu.runtime.buffers import memory as _memory
from hf_tpu.runtime.buffers import platform as _platform
from hf_tpu.runtime.buffers.storage import REGISTRY as _REGISTRY
from hf_tpu.runtime.launch.modes import EagerMode, eager_mode, get_eager_mode, set_eager_mode
from hf_tpu.runtime.launch.rng import GENERATOR as _GENERATOR

__all__ = [
    "EagerMode",
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "eager_mode",
    "flush",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "ipc_collect",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "set_per_process_memory_fraction",
    "device_of",
    "OutOfMemoryError",
    "get_eager_mode",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated_per_chip",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_eager_mode",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_initial_seed = _GENERATOR.seed


def is_available() -> bool:
    """True: the device always has a backing JAX platform (TPU, else GPU, else CPU)."""
    return True


def is_initialized() -> bool:
    return _platform.is_initialized()


def __getattr__(name: str):
    # `torch.tpu._initialized`, like `torch.cuda._initialized`: torch.utils.checkpoint saves and restores
    # the device RNG state only when it is True (else dropout in a recomputed block draws a new mask)
    if name == "_initialized":
        return is_initialized()
    if name == "default_generators" and hasattr(_GENERATOR, "generator"):
        # like torch.cuda.default_generators; only with the C++ extension (real tpu generators)
        return (_GENERATOR.generator,)
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")


def _lazy_init() -> None:
    _platform.devices()


def init() -> None:
    _lazy_init()


def device_count() -> int:
    """Number of local chips behind the one logical `tpu:0` device."""
    return len(_platform.devices())


def current_device() -> int:
    return 0


_check_index = _platform.check_index


def set_device(device) -> None:
    _check_index(device)


class device:  # noqa: N801 - mirrors torch.cuda.device
    """Context manager selecting the tpu device (only index 0 exists)."""

    def __init__(self, device) -> None:
        _check_index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


def get_device_name(device=None) -> str:
    _check_index(device)
    d = _platform.default_device()
    return f"{getattr(d, 'device_kind', d.platform)} ({d.platform}, {device_count()} chip(s))"


def get_device_capability(device=None) -> dict:
    """`supported_dtypes` as `torch.accelerator.get_device_capability` reports it, plus platform and chips."""
    from hf_tpu.runtime.buffers.dtypes import _TORCH_TO_NUMPY

    _check_index(device)
    return {
        "supported_dtypes": set(_TORCH_TO_NUMPY),
        "platform": _platform.platform_name(),
        "chips": device_count(),
    }


def synchronize(device=None) -> None:
    """Wait until every buffer of every live tpu tensor is computed."""
    _check_index(device)
    if not _platform.is_initialized():
        return
    from hf_tpu.runtime.buffers.threads import note_device_thread
    from hf_tpu.runtime.launch import lazy

    note_device_thread()  # it reads every payload's array: no donation behind its back (tensor.py)
    lazy.flush("synchronize")
    jax = _platform.jax()
    # like CUDA, wait for all queued work, not just live results: the newest launch stands for the
    # work whose outputs were dropped already (so dead storages can be swept first, not waited on)
    _REGISTRY.sweep()
    arrays = [p.array for p in list(_REGISTRY._payloads.values()) if p.array is not None]
    arrays.append(_platform.last_launched[0])
    arrays = [a for a in arrays if a is not None]
    try:
        jax.block_until_ready(arrays)
    except Exception:  # noqa: BLE001 - another thread's compiled step donated one of them meanwhile
        _wait_for_live(arrays)
    _host_copies.complete()


def _wait_for_live(arrays) -> None:
    """Wait for each array that still exists (a donated one's work is its successor's, waited on by whoever
    donated it); any other error is raised."""
    for a in arrays:
        for leaf in a if isinstance(a, list | tuple) else (a,):
            if getattr(leaf, "is_deleted", None) is None or leaf.is_deleted():
                continue
            try:
                leaf.block_until_ready()
            except Exception:
                if not leaf.is_deleted():
                    raise


def flush() -> None:
    """DeferAndFuse: run the ops recorded so far now (as one compiled program), without waiting for them."""
    from hf_tpu.runtime.launch import lazy

    lazy.flush("explicit flush")


# -- RNG ---------------------------------------------------------------------------------------------
def manual_seed(seed: int) -> None:
    global _initial_seed
    _initial_seed = int(seed)
    _GENERATOR.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    manual_seed(_random.getrandbits(63))


seed_all = seed


def initial_seed() -> int:
    return _initial_seed


def _check_rng_index(device) -> None:
    """RNG helpers (torch.random.fork_rng) walk range(device_count()): every chip shares one generator."""
    if isinstance(device, int) and 0 <= device < device_count():
        return
    _check_index(device)


def get_rng_state(device="tpu") -> torch.Tensor:
    _check_rng_index(device)
    return _GENERATOR.get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _check_rng_index(device)
    _GENERATOR.set_state(new_state)


def set_rng_state_all(new_states) -> None:
    set_rng_state(new_states[0])


# -- AMP ---------------------------------------------------------------------------------------------
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# -- memory --------------------------------------------------------------------------------------------
def empty_cache() -> None:
    """Drop the buffers of dead storages now (XLA frees device memory when buffers die)."""
    _REGISTRY.sweep()


def memory_allocated(device=None) -> int:
    _check_index(device)
    _REGISTRY.sweep()
    return _REGISTRY.allocated


def max_memory_allocated(device=None) -> int:
    _check_index(device)
    return _REGISTRY.peak


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None) -> None:
    _check_index(device)
    _REGISTRY.reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    _check_index(device)
    _REGISTRY.sweep()
    return {
        "allocated_bytes.all.current": _REGISTRY.allocated,
        "allocated_bytes.all.peak": _REGISTRY.peak,
        "reserved_bytes.all.current": _REGISTRY.allocated,
        "active.all.current": len(_REGISTRY._payloads),
        "bytes_limit": _memory.capacity(),
    }


def reset_accumulated_memory_stats(device=None) -> None:
    reset_peak_memory_stats(device)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap what tpu tensors may allocate at `fraction` of the device's capacity: a larger allocation
    raises torch.OutOfMemoryError, as the CUDA caching allocator does past its fraction."""
    _check_index(device)
    if not isinstance(fraction, float | int) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _memory.set_fraction(float(fraction))


def get_per_process_memory_fraction(device=None) -> float:
    _check_index(device)
    return _memory.fraction()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A short human-readable report of tpu memory (what torch.cuda.memory_summary reports, in brief)."""
    _check_index(device)
    _REGISTRY.sweep()
    free, total = mem_get_info(device)
    rows = [
        ("Allocated memory (live tensors)", _memory._human(_REGISTRY.allocated)),
        ("Peak allocated memory", _memory._human(_REGISTRY.peak)),
        ("Live storages", str(len(_REGISTRY._payloads))),
        (
            "Device capacity",
            f"{_memory._human(total)} ({device_count()} chip(s) of {_memory._human(_memory.chip_capacity())})",
        ),
        ("Allocated per chip", ", ".join(_memory._human(b) for b in _memory.allocated_per_chip())),
        ("Allocation limit (memory fraction)", f"{_memory._human(_memory.limit())} ({_memory.fraction():g})"),
        ("Free", _memory._human(free)),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"|  tpu:0 memory summary ({get_device_name()})", "|" + "-" * (width + 20)]
    lines += [f"|  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines) + "\n"


def ipc_collect() -> None:
    """Nothing to collect: tpu tensors are not shared between processes through IPC handles."""
    _REGISTRY.sweep()


class _DeviceProperties:
    """What `get_device_properties` returns: the fields torch.cuda's device properties share with a TPU."""

    def __init__(self) -> None:
        d = _platform.default_device()
        self.name = getattr(d, "device_kind", d.platform)
        self.type = "tpu"
        self.platform = d.platform
        self.chip_count = device_count()
        self.total_memory = _memory.capacity()

    def __repr__(self) -> str:
        return (
            f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
            f"chip_count={self.chip_count}, total_memory={self.total_memory // (1 << 20)}MB)"
        )


def get_device_properties(device=None) -> _DeviceProperties:
    _check_index(device)
    return _DeviceProperties()


@contextlib.contextmanager
def device_of(obj):
    """Like torch.cuda.device_of: the device of a tpu tensor as the current device (there is only tpu:0)."""
    yield


OutOfMemoryError = torch.OutOfMemoryError


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device: all chips together, i.e. what a model sharded over them can use
    (each chip's limit minus what it holds); on JAX's CPU platform free is also bounded by the host's
    available memory."""
    _check_index(device)
    _REGISTRY.sweep()
    return _memory.free(), _memory.capacity()


def memory_allocated_per_chip(device=None) -> list[int]:
    """Bytes of live tpu tensors on each chip: a replicated tensor counts on every chip, a sharded one its
    part on each, an unsharded one on the first chip. `memory_allocated()` is the total of distinct bytes."""
    _check_index(device)
    return _memory.allocated_per_chip()


# -- streams and events: valid objects with synchronous semantics ----------------------------------------
class Stream:
    """A tpu stream. JAX orders work itself; synchronize() waits for everything in flight. (Not a
    `torch.Stream` subclass: TorchDynamo recursed without end tracing code that used one.)"""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("tpu", _check_index(device))
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        synchronize()
        return True

    def wait_stream(self, stream: Stream) -> None:
        stream.synchronize()

    def wait_event(self, event: Event) -> None:
        event.synchronize()

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return hash(("tpu-stream", 0))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __repr__(self) -> str:
        return "<torch.tpu.Stream device=tpu:0>"


class Event:
    """A tpu event. A timing event synchronizes on record(); any other marks the non-blocking copies to
    host issued before it (see host_copies.py), and synchronize() waits for those, or for all work if
    there were none (JAX has no per-stream markers: waiting for more than was recorded is the safe side).
    """

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None
        self._recorded = False
        self._copies: int | None = None  # ticket of the newest async copy to host before record()

    def record(self, stream: Stream | None = None) -> None:
        self._recorded = True
        if self.enable_timing:
            synchronize()
            self._time = time.perf_counter()
            self._copies = None
        else:
            self._copies = _host_copies.newest_pending()

    def synchronize(self) -> None:
        if not self._recorded:
            return  # like CUDA: an event never recorded has nothing to wait for
        if self._copies is not None:
            _host_copies.complete(self._copies)
        else:
            synchronize()

    def wait(self, stream: Stream | None = None) -> None:
        self.synchronize()

    def query(self) -> bool:
        if self._copies is not None:
            return _host_copies.is_complete(self._copies)
        self.synchronize()
        return True

    def elapsed_time(self, end_event: Event) -> float:
        if self._time is None or end_event._time is None:
            raise RuntimeError("both events must be recorded with enable_timing=True before elapsed_time()")
        return (end_event._time - self._time) * 1000.0


_DEFAULT_STREAM = None


def default_stream(device=None) -> Stream:
    global _DEFAULT_STREAM
    if _DEFAULT_STREAM is None:
        _DEFAULT_STREAM = Stream()
    return _DEFAULT_STREAM


def current_stream(device=None) -> Stream:
    return default_stream(device)


def set_stream(stream: Stream) -> None:
    pass


@contextlib.contextmanager
def stream(s: Stream | None):
    yield s


def _is_in_bad_fork() -> bool:
    return False

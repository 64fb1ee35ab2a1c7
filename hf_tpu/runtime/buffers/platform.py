"""Which JAX platform backs the `tpu` device, initialized lazily on first use.

The autoload hook runs at every `import torch`, so nothing here touches JAX until a tensor needs it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from functools import cache

import torch

VALID_PLATFORMS = ("tpu", "gpu", "cuda", "rocm", "cpu")
_lock = threading.Lock()
# callbacks run once JAX is imported and before its backends start (tpu_dist joins `jax.distributed` there)
BEFORE_BACKEND_INIT: list = []
# set by tpu_dist: whether a non-zero device index names this process's device in a multi-process job
LOCAL_INDEX_OK: list = [None]


class PlatformError(RuntimeError):
    """The requested JAX platform is unknown or unavailable."""


def requested_platform() -> str | None:
    """The platform forced through `HF_TPU_PLATFORM`, validated (None: let JAX choose)."""
    value = os.environ.get("HF_TPU_PLATFORM", "").strip().lower()
    if not value:
        return None
    if value not in VALID_PLATFORMS:
        raise PlatformError(
            f"HF_TPU_PLATFORM={value!r} is not a known JAX platform; valid values: {', '.join(VALID_PLATFORMS)} "
            "(or unset it to let JAX pick TPU, then GPU, then CPU)."
        )
    return value


@cache
def jax():
    """Import and configure JAX once: 64-bit types on (PyTorch semantics need int64/float64), and the
    persistent compilation cache."""
    with _lock:
        import jax as _jax

        _jax.config.update("jax_enable_x64", True)
        configure_compilation_cache(_jax)
        from hf_tpu.runtime.buffers import executables

        executables.install(_jax)
        for hook in BEFORE_BACKEND_INIT:
            hook(_jax)
        return _jax


_OFF = ("0", "off", "false", "no", "none")


def compilation_cache_dir() -> str | None:
    """Where compiled XLA executables persist across processes (None: not persisted).

    `HF_TPU_COMPILATION_CACHE` names the folder, or turns the cache off with 0; by default it is
    `$XDG_CACHE_HOME/hf_tpu/xla` (`~/.cache/hf_tpu/xla`), the way inductor keeps its own cache by
    default. A folder the user gave JAX itself (`JAX_COMPILATION_CACHE_DIR`) wins.
    """
    setting = os.environ.get("HF_TPU_COMPILATION_CACHE", "").strip()
    if setting.lower() in _OFF:
        return None
    if setting:
        return os.path.expanduser(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hf_tpu", "xla" + _host_devices_suffix())


def _host_devices_suffix() -> str:
    """A separate folder per forced host-device count: JAX leaves
    `--xla_force_host_platform_device_count` out of its cache key, so a process with 8 host devices
    would load executables a 1-device process compiled (a serial test run that shared its cache with
    1-device benchmarks crashed in JAX's cache read)."""
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return f"-host{match.group(1)}" if match and match.group(1) != "1" else ""


def configure_compilation_cache(j) -> None:
    """Persist every executable (a new process then loads instead of recompiling: first-call time).

    JAX caches only compiles slower than 1 s by default; eager executables take 10-100 ms each and a
    model needs hundreds, so everything is kept (`HF_TPU_COMPILATION_CACHE_MIN_SECS` raises the bar).
    The folder is capped at `HF_TPU_COMPILATION_CACHE_MAX_GB` (default 4) by pruning the oldest entries
    at most once a day: JAX's own size cap re-lists the whole folder on every write.
    """
    if j.config.jax_compilation_cache_dir:  # the user configured JAX's cache: leave it as it is
        return
    path = compilation_cache_dir()
    if path is None:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return  # read-only home etc.: run without a persistent cache
    j.config.update("jax_compilation_cache_dir", path)
    j.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ.get("HF_TPU_COMPILATION_CACHE_MIN_SECS", "0")),
    )
    limit = int(float(os.environ.get("HF_TPU_COMPILATION_CACHE_MAX_GB", "4")) * (1 << 30))
    _prune_daily(path, limit)


_PRUNE_STAMP = ".hf_tpu_pruned"


def _prune_daily(path: str, limit_bytes: int) -> None:
    """Prune at most once a day, in this thread (~0.2 s for 30,000 entries). Not in a background
    thread: its per-file syscalls fight the main thread for the GIL (measured: Strict ops 60% slower
    while it ran)."""
    stamp = os.path.join(path, _PRUNE_STAMP)
    try:
        if time.time() - os.stat(stamp).st_mtime < 86400:
            return
    except OSError:
        pass
    prune_cache(path, limit_bytes)
    try:
        with open(stamp, "w"):
            pass
    except OSError:
        pass


def prune_cache(path: str, limit_bytes: int) -> int:
    """Delete the least recently modified entries until the folder holds at most 80% of `limit_bytes`
    (when it holds more than the limit); returns how many were deleted."""
    try:
        entries = []
        total = 0
        with os.scandir(path) as it:
            for e in it:
                if e.is_file(follow_symlinks=False) and e.name != _PRUNE_STAMP:
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime, st.st_size, e.path))
                    total += st.st_size
        if total <= limit_bytes:
            return 0
        entries.sort()
        removed = 0
        for _, size, file in entries:
            if total <= limit_bytes * 0.8:
                break
            try:
                os.remove(file)
            except OSError:
                continue
            total -= size
            removed += 1
        return removed
    except OSError:
        return 0


@cache
def devices() -> tuple:
    """The local chips behind `tpu:0` (one logical device spanning all of them); in a multi-process job
    (tpu_dist) this process's chips only."""
    j = jax()
    forced = requested_platform()
    try:
        devs = j.local_devices(backend=forced) if forced else j.local_devices()
    except RuntimeError as exc:
        raise PlatformError(
            f"HF_TPU_PLATFORM={forced!r}: JAX has no such backend on this machine ({exc}). "
            f"Unset HF_TPU_PLATFORM or choose one of: {', '.join(VALID_PLATFORMS)}."
        ) from exc
    if devs and devs[0].platform == "cpu":
        tune_host_allocator()
    if forced and devs and devs[0] != j.local_devices()[0]:
        # unsharded arrays are uncommitted: they go to JAX's default device, which must be ours
        j.config.update("jax_default_device", devs[0])
    set_multi_chip(len(devs) > 1)
    return tuple(devs)


# more than one local chip (hot paths check this list's only element: N-D view reads, accounting)
MULTI_CHIP = [False]


def set_multi_chip(on: bool) -> None:
    """Note whether arrays may be sharded over several chips: the C++ kernels then leave every op to
    the Python kernels (their cached entries know one chip's layouts only)."""
    MULTI_CHIP[0] = on
    from hf_tpu.runtime import native  # the lowest layer: no cycle

    ext = native.load()
    if ext is not None and hasattr(ext, "set_multi_chip"):
        ext.set_multi_chip(on)


# glibc mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_host_allocator() -> bool:
    """On JAX's CPU platform device buffers are host `malloc`s: keep freed memory for reuse.

    By default glibc serves blocks >= 128 KiB with a fresh `mmap` and returns a freed heap top to the
    OS, so a new op output touches new pages and page-faults on every write: measured here, a 2x128x256
    fp32 multiply took 122 us in Strict, 32 us with freed memory kept (and 18.5 -> 9.6 us at 2x16x64).
    This is what a caching allocator does on an accelerator. `HF_TPU_HOST_ALLOC_TUNING=0` leaves
    malloc as it is. Returns whether the tuning was applied (glibc only).
    """
    if os.environ.get("HF_TPU_HOST_ALLOC_TUNING", "1").strip().lower() in _OFF:
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt): nothing to tune
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # 32 MiB is glibc's largest mmap threshold; memory freed below the heap top stays mapped up to 1 GiB
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def default_device():
    """The first chip: where unsharded buffers live."""
    return devices()[0]


def check_index(device) -> int:
    """The index a tpu device names: only 0 exists (one logical device spans the chips)."""
    if device is None:
        return 0
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        index = device.index or 0
    else:
        index = int(device)
    if index != 0 and LOCAL_INDEX_OK[0] is not None and LOCAL_INDEX_OK[0](index):
        return 0  # multi-process job: `tpu:local_rank` names this process's device, which is tpu:0
    if index != 0:
        raise ValueError(
            f"tpu:{index} does not exist: hf_tpu exposes all {len(devices())} local chip(s) as one logical device "
            "tpu:0 (weights are sharded across chips by placement, not by device index). Use 'tpu' or 'tpu:0' "
            "(in a multi-process tpu_dist job, WORLD_SIZE > 1, tpu:local_rank also names this process's device)."
        )
    return index


def platform_name() -> str:
    """'tpu', 'gpu' or 'cpu' — the JAX platform of the chips."""
    return default_device().platform


def is_initialized() -> bool:
    return jax.cache_info().currsize > 0 and devices.cache_info().currsize > 0


def supports_float64() -> bool:
    """XLA on TPU has no float64; CPU and GPU do."""
    return platform_name() != "tpu"


# The most recently launched executable's results, kept alive so `torch.tpu.synchronize()` can wait for
# work whose outputs were already dropped (a benchmark's discarded forward): later work mostly depends
# on earlier work, so waiting on the newest results waits on the queue behind them.
last_launched: list = [None]

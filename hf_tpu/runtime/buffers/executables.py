"""Keeping the loaded XLA executables within what the operating system allows a process.

On JAX's CPU platform every loaded executable maps its machine code into the process (about three
memory mappings each), and it stays loaded while a jitted function or one of JAX's caches holds it:
every lowering, DeferAndFuse program and compiled graph keeps its executables. Linux caps the mappings
of a process (`vm.max_map_count`, 65,530 by default); past the cap the code loader's `mmap` fails and
the process dies with a segfault inside JAX, not an error (measured: the serial test suite crashed at
about 65,000 mappings, in `compilation_cache.get_executable_and_time`). Any long-lived process that
compiles many programs gets there: the compatibility harness, the test suite, a server seeing many
shapes.

So every compile JAX reports is counted, and every `_CHECK_EVERY` compiles the process's mappings are
counted too. Past the budget (`HF_TPU_MAP_BUDGET` mappings; default half of `vm.max_map_count`) the
in-memory executable caches are cleared at the next safe point: the start of a tpu op that needs a new
kernel, of a DeferAndFuse flush, or of a compiled graph's call, where this thread is inside no JAX
call. Programs still in use then compile again, from the persistent compilation cache when it is on.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("hf_tpu.executables")

_CHECK_EVERY = 64  # compiles between two counts of the mappings (a count of 30,000 takes ~5 ms)
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # a compile or a persistent-cache load
# the stages of one compile, timed for DeferAndFuse's flush log (trace, lower to MLIR, XLA compile)
_COMPILE_STAGES = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    _COMPILE_EVENT,
)
_MAPS = "/proc/self/maps"
_MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"

stats = {"compiles": 0, "clears": 0, "mappings_at_last_clear": 0, "compile_seconds": 0.0}
_due = [False]  # set by the compile listener, served at the next safe point
_lock = threading.Lock()
_installed = [False]
_jax: list = [None]  # the JAX module `install` was given
_watch_maps = [False]  # the OS lists mappings and a budget is known


def map_count() -> int | None:
    """The process's memory mappings now, or None where the OS does not list them."""
    try:
        with open(_MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def map_budget() -> int | None:
    """Mappings the process may reach before executables are unloaded (None: no limit known)."""
    value = os.environ.get("HF_TPU_MAP_BUDGET", "").strip()
    if value:
        try:
            return max(int(value), 1)
        except ValueError:
            raise ValueError(f"HF_TPU_MAP_BUDGET={value!r} is not a number of memory mappings") from None
    try:
        with open(_MAX_MAP_COUNT) as f:
            return int(f.read()) // 2
    except (OSError, ValueError):
        return None


def install(jax) -> None:
    """Count JAX's compiles and their time from now on (once per process; `platform.jax()` calls it)."""
    with _lock:
        if _installed[0]:
            return
        _installed[0] = True
        _jax[0] = jax
        _watch_maps[0] = map_count() is not None and map_budget() is not None
        jax.monitoring.register_event_duration_secs_listener(_on_event)


def compile_seconds() -> float:
    """Seconds this process has spent compiling (tracing, lowering and XLA compiles, persistent-cache
    loads included) since `install`."""
    return stats["compile_seconds"]


def _on_event(event: str, duration: float, **kwargs) -> None:
    if event not in _COMPILE_STAGES:
        return
    stats["compile_seconds"] += duration
    if event != _COMPILE_EVENT:
        return
    stats["compiles"] += 1
    if not _watch_maps[0]:
        return
    if stats["compiles"] % _CHECK_EVERY == 0 and not _due[0]:
        try:
            budget = map_budget()
        except ValueError:  # a bad HF_TPU_MAP_BUDGET set after JAX started: `install` reports it at start
            return
        count = map_count()
        if count is not None and budget is not None and count > budget:
            _due[0] = True


def collect_if_due() -> None:
    """At a safe point: unload the compiled executables when the mappings passed their budget."""
    if _due[0]:
        _collect()


def unload_if_over(fraction: float = 0.5) -> bool:
    """Unload the compiled executables now when the mappings passed `fraction` of the budget (a caller
    at a quiet point: a test runner between modules, a server between requests). True when it did."""
    count, budget = map_count(), map_budget()
    if count is None or budget is None or count <= budget * fraction:
        return False
    _due[0] = True
    _collect()
    return not _due[0]


def _collect() -> None:
    from hf_tpu.runtime.buffers.threads import one_device_thread

    if not one_device_thread():  # another thread may be inside a JAX compile: wait for a quieter moment
        return
    with _lock:
        if not _due[0]:
            return
        _due[0] = False
        before = map_count() or 0
        _jax[0].clear_caches()
        stats["clears"] += 1
        stats["mappings_at_last_clear"] = before
    message = (
        "hf_tpu: %d memory mappings (budget %d, from vm.max_map_count or HF_TPU_MAP_BUDGET) after %d "
        "compiles: unloaded the compiled executables; programs still in use compile again"
    )
    level = logging.WARNING if stats["clears"] == 1 else logging.INFO
    log.log(level, message, before, map_budget() or 0, stats["compiles"])

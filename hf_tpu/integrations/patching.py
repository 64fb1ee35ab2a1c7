"""The one way hf_tpu replaces an upstream attribute: `patch(owner, name, make)`.

Every patch in `hf_tpu.integrations` goes through here (the list of them is `table.PATCHES`), so each one
keeps the upstream original (`original(owner, name)`), applies once however often it is asked to (the
registry below, not a marker on the wrapper: a second call while our replacement is in place does nothing,
and a module re-executed by `importlib.reload` gets patched again), and, with `rebind=`, also replaces
the copies other modules imported by value (`from accelerate.utils import get_max_memory` made five).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

_lock = threading.RLock()


@dataclass
class _Record:
    owner: Any  # kept alive, so its id is never reused for another owner
    original: Any  # what `make` received: the upstream function (unwrapped from classmethod/staticmethod)
    installed: Any  # what we set on the owner (re-wrapped in classmethod/staticmethod as the original was)


_PATCHED: dict[tuple[int, str], _Record] = {}


def _lookup(owner: Any, name: str) -> Any:
    """The attribute as stored: for a class, the raw entry of the first class in its MRO that has it
    (a classmethod object, a property), else `getattr`. Raises AttributeError when it is missing."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        raise AttributeError(f"{owner.__qualname__} has no attribute {name!r}")
    return getattr(owner, name)


def _current(owner: Any, name: str) -> Any:
    try:
        return _lookup(owner, name)
    except AttributeError:
        return None


def patch(
    owner: Any,
    name: str,
    make: Callable[[Any], Any],
    *,
    rebind: Iterable[str] = (),
) -> Any:
    """Replace `owner.name` by `make(original)` once; returns what is installed now.

    `make` receives the upstream value (a classmethod's or staticmethod's function, re-wrapped the same way
    after; a property as is) and returns its replacement. Calling again while that replacement is in place
    is a no-op. `rebind` names module attributes that may hold the original by value (`from m import f`,
    `import f as g`): in every loaded module where one of them is the original, it becomes the replacement.
    """
    with _lock:
        raw = _lookup(owner, name)
        key = (id(owner), name)
        record = _PATCHED.get(key)
        if record is not None and raw is record.installed:
            return record.installed
        wrapper = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        original = raw.__func__ if wrapper is not None else raw
        replacement = make(original)
        installed = wrapper(replacement) if wrapper is not None else replacement
        setattr(owner, name, installed)
        _PATCHED[key] = _Record(owner, original, installed)
        names = tuple(rebind)
        if names:
            entry = (owner, names, original, replacement)
            pending = getattr(_deferred, "pending", None)
            if pending is not None:
                pending.append(entry)
            else:
                _rebind([entry])
        return installed


@contextlib.contextmanager
def rebinding_once() -> Iterator[None]:
    """Patches this thread makes inside rebind their copies in one scan of `sys.modules` on exit, not one
    scan each (the torch surface patched at `import torch` rebinds a dozen functions)."""
    outer = getattr(_deferred, "pending", None)
    if outer is None:
        _deferred.pending = []
    try:
        yield
    finally:
        if outer is None:
            pending, _deferred.pending = _deferred.pending, None
            with _lock:
                _rebind(pending)


# per thread: the (owner, names, original, replacement) an open `rebinding_once` will rebind, else None
_deferred = threading.local()


def _rebind(pending: list[tuple[Any, tuple[str, ...], Any, Any]]) -> None:
    """Point every loaded module's attributes named in `pending` that hold an original at its replacement
    (each module's own dict only: lazy modules such as transformers' would import on attribute access)."""
    by_name: dict[str, list[tuple[Any, Any, Any]]] = {}
    for owner, names, orig, replacement in pending:
        for attr in names:
            by_name.setdefault(attr, []).append((owner, orig, replacement))
    if not by_name:
        return
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, candidates in by_name.items():
            value = namespace.get(attr)
            if value is None:
                continue
            for owner, orig, replacement in candidates:
                if value is orig and module is not owner:
                    namespace[attr] = replacement
                    break


def original(owner: Any, name: str) -> Any:
    """The upstream value hf_tpu's patch of `owner.name` replaced (the current value when unpatched)."""
    record = _PATCHED.get((id(owner), name))
    if record is not None and _current(owner, name) is record.installed:
        return record.original
    raw = _lookup(owner, name)
    return raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw


def is_patched(owner: Any, name: str) -> bool:
    """Whether `owner.name` is hf_tpu's replacement now."""
    record = _PATCHED.get((id(owner), name))
    return record is not None and _current(owner, name) is record.installed


def has_params(fn: Any, names: Iterable[str]) -> bool:
    """Whether `fn`'s signature still has the parameters a patch relies on (False when it has none to read:
    missing, or a builtin without a signature)."""
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(name in params for name in names)


__all__ = ["has_params", "is_patched", "original", "patch", "rebinding_once"]

"""The upstream versions hf_tpu's patches were verified with, and a one-time warning outside them.

A patch written against one release can silently stop applying in the next (a renamed function, a moved
cache). Each package's range is the (major, minor) releases the test suite passed with (CI pins the
exact versions in constraints.txt; README "Tested with"). Outside the range hf_tpu still patches, and
says once which package and range, so a wrong result can be traced to the upgrade.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import threading
import warnings

# package -> (oldest, newest) (major, minor) release the suite passed with
VERIFIED: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "torch": ((2, 13), (2, 13)),
    "transformers": ((5, 23), (5, 24)),
    "diffusers": ((0, 42), (0, 42)),
    "accelerate": ((1, 15), (1, 15)),
    "safetensors": ((0, 8), (0, 8)),
}

_warned: set[str] = set()
_lock = threading.Lock()


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string ('5.24.0', '2.13.0+cpu', '5.25.0.dev0'), None if unparsable."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def outside_message(package: str, version: str) -> str | None:
    """The warning for `package` at `version`, or None when it is inside the verified range."""
    span = VERIFIED.get(package)
    got = release(version)
    if span is None or got is None or span[0] <= got <= span[1]:
        return None
    low, high = (".".join(map(str, v)) for v in span)
    verified = low if low == high else f"{low}-{high}"
    return (
        f"hf_tpu: {package} {version} is outside the releases hf_tpu's patches were verified with "
        f"({package} {verified}); they may not apply as intended. The tested versions are listed in "
        "hf_tpu's README (Tested with); please report problems with this version."
    )


def installed_version(package: str) -> str | None:
    """The installed version: the imported module's `__version__` when it has one (reading package
    metadata costs ~20 ms, too much for `import torch`, where torch's surface is patched), else metadata."""
    version = getattr(sys.modules.get(package), "__version__", None)
    if isinstance(version, str):
        return str(version)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check(package: str) -> None:
    """Warn once per process when the installed `package` is outside its verified range."""
    if package in _warned or package not in VERIFIED:
        return
    with _lock:
        if package in _warned:
            return
        _warned.add(package)
    version = installed_version(package)
    message = outside_message(package, version) if version else None
    if message:
        warnings.warn(message, stacklevel=3)

"""Where the built C++ library lives and whether it matches this source, torch and Python."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "csrc" / "tpu_native.cpp", HERE / "csrc" / "recorder.cpp")
HEADERS = (HERE / "csrc" / "device_tensor.h",)
MODULE = "_hf_tpu_native"


def library_path() -> Path:
    return HERE / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def _stamp_path() -> Path:
    return HERE / f"{MODULE}.stamp"


def fingerprint() -> str:
    """What a build depends on: the sources, torch's version and ABI, and the Python ABI."""
    import torch

    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(str(torch._C._GLIBCXX_USE_CXX11_ABI).encode())
    digest.update((sysconfig.get_config_var("SOABI") or "").encode())
    return digest.hexdigest()


def write_stamp() -> None:
    _stamp_path().write_text(fingerprint() + "\n")


def is_built() -> bool:
    return library_path().exists()


def is_current() -> bool:
    """Built, and from this source for this torch (a stale library would not match torch's ABI)."""
    stamp = _stamp_path()
    if not (library_path().exists() and stamp.exists()):
        return False
    return stamp.read_text().strip() == fingerprint()

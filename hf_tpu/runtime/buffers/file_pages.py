"""Give back a checkpoint's mapped pages once a tensor read from it has been copied to the device.

`from_pretrained` reads safetensors through a file mapping: every tensor copied to tpu leaves its pages
mapped, and counted in the process's RSS, until the whole checkpoint is closed. Loading a 418 MiB
checkpoint then peaked at 1.33x its size beyond the model itself, 438 MiB of it those pages.

After `host_to_jax` has copied a tensor, `release` unmaps the whole pages inside it with
`madvise(MADV_DONTNEED)`, but only where that loses nothing: every page must be a clean file (or shared)
page or never touched (Linux's `/proc/self/pagemap` says which). A page the process wrote to (a private
copy of a file page, or anonymous memory) or one swapped out keeps its contents and stays as it is. The
released pages stay in the page cache; reading the tensor again maps them back with the same bytes.
Linux only; elsewhere, or with `HF_TPU_RELEASE_FILE_PAGES=0`, nothing is released.
"""

from __future__ import annotations

import ctypes
import os
import struct
from functools import cache

import torch

# tensors smaller than this keep their pages: the check costs more than the pages are worth
MIN_BYTES = 1 << 20
_MADV_DONTNEED = 4
_PRESENT = 1 << 63
_SWAPPED = 1 << 62
_FILE_OR_SHARED = 1 << 61


@cache
def _pagemap() -> int | None:
    """A descriptor of /proc/self/pagemap (kept open), None where pages cannot be inspected."""
    if os.environ.get("HF_TPU_RELEASE_FILE_PAGES", "1") == "0" or not os.path.exists("/proc/self/pagemap"):
        return None
    try:
        return os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None


@cache
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _safe_to_drop(entry: int) -> bool:
    """A page whose contents survive MADV_DONTNEED: a present file/shared page, or one never touched."""
    if entry & _PRESENT:
        return bool(entry & _FILE_OR_SHARED)
    return not entry & _SWAPPED


def release(t: torch.Tensor) -> int:
    """Unmap the whole pages of CPU tensor `t` that hold clean file-backed data; the bytes released."""
    nbytes = t.numel() * t.element_size()
    if nbytes < MIN_BYTES or t.device.type != "cpu" or not t.is_contiguous():
        return 0
    # storages torch allocated itself (resizable) are anonymous memory: nothing to give back
    if t.untyped_storage().resizable():
        return 0
    fd = _pagemap()
    if fd is None:
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + nbytes) // page * page
    if end <= start:
        return 0
    count = (end - start) // page
    try:
        raw = os.pread(fd, 8 * count, (start // page) * 8)
    except OSError:
        return 0
    if len(raw) != 8 * count or not all(_safe_to_drop(e) for e in struct.unpack(f"{count}Q", raw)):
        return 0
    if _madvise()(start, end - start, _MADV_DONTNEED) != 0:
        return 0
    return end - start


__all__ = ["MIN_BYTES", "release"]

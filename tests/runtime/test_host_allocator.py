"""The host allocator tuning applied on JAX's CPU platform (device buffers are host mallocs there)."""

from __future__ import annotations

import ctypes
import platform as host

import pytest

from hf_tpu.runtime.buffers import platform


def _is_glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "mallopt") and host.libc_ver()[0] == "glibc"
    except OSError:
        return False


@pytest.mark.skipif(not _is_glibc(), reason="mallopt is glibc's")
def test_tuning_applies_on_glibc():
    assert platform.tune_host_allocator() is True


def test_tuning_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("HF_TPU_HOST_ALLOC_TUNING", "0")
    assert platform.tune_host_allocator() is False

"""The PrivateUse1 hooks and device guard written in Python (the pure-Python path; the C++ extension in
hf_tpu.runtime.native registers fuller ones: pinned allocator, generators, events)."""

from __future__ import annotations

import torch


class TpuHooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class TpuDeviceGuard(torch._C._acc.DeviceGuard):
    """One logical device (index 0) spanning every chip (DESIGN §3.3)."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1

"""Test-only fake models that misbehave on purpose, so every failure status can be exercised.

Enabled only when the environment has COMPAT_ENABLE_FAKES=1; an entry ``{"id": "fake/<behaviour>"}`` then
runs a tiny linear model through the very same worker path (reference runs, device runs, comparison),
misbehaving only while the worker runs it on the target ("target" phase):

    pass          behaves
    raise         RuntimeError                       -> fail_to_run
    missing-op    NotImplementedError naming an op   -> fail_to_run with missing_op
    hang          sleeps forever                     -> timeout
    abort         os.abort()                         -> crash
    oom           allocates until the cap hits       -> oom
    mismatch      returns different numbers          -> fail_accuracy
    nondeterministic  differs between reference runs -> eager_nondeterministic
    bad-inputs    input builder fails                -> harness_error
    slow-<sec>    sleeps <sec> seconds per target call, then passes (for kill/resume tests)

and, unlike those, real modules that behave the same wherever they run (nothing injected; attribution
re-runs them on CPU like any model):

    hash-tensor   returns torch.hash_tensor of its input beside the logits: CPU has the op, hf_tpu has
                  no lowering for it (a failure on tpu only)

A ``#suffix`` makes distinct ids with the same behaviour: ``fake/slow-0.1#3``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from compat.errors import InputError

PHASE = "reference"
REAL_BEHAVIOURS = ("hash-tensor",)
_NONDET_CALLS = [0]


def set_phase(phase: str) -> None:
    """The worker says whether it runs the CPU reference or the target device."""
    global PHASE
    PHASE = phase


class FakeModel(torch.nn.Module):
    def __init__(self, behaviour: str) -> None:
        super().__init__()
        self.behaviour = behaviour
        g = torch.Generator().manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(8, 8, generator=g))
            self.linear.bias.copy_(torch.randn(8, generator=g))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        b = self.behaviour
        if b == "hash-tensor":
            return {"logits": self.linear(x), "hash": torch.hash_tensor(x, dim=-1)}
        if b.startswith("slow-") and PHASE == "target":
            time.sleep(float(b.split("-", 1)[1]))
        elif b == "nondeterministic" and PHASE == "reference":
            _NONDET_CALLS[0] += 1
            return {"logits": self.linear(x) + _NONDET_CALLS[0]}
        elif PHASE == "target":
            _misbehave(b)
            if b == "mismatch":
                return {"logits": self.linear(x) + 1.0}
        return {"logits": self.linear(x)}


def _misbehave(b: str) -> None:
    if b == "raise":
        raise RuntimeError("injected failure from fake model")
    if b == "missing-op":
        raise NotImplementedError(
            "hf_tpu has no lowering for aten::fake_op.Tensor (injected by a fake model)"
        )
    if b == "hang":
        time.sleep(10_000)
    if b == "abort":
        os.abort()
    if b == "oom":
        hold = []
        for _ in range(80):  # at most ~8 GB: the watchdog must stop it long before
            hold.append(torch.ones(100 * 1024 * 1024 // 4))
            time.sleep(0.02)
        time.sleep(10_000)


def build_model(behaviour: str) -> FakeModel:
    return FakeModel(behaviour).eval()


def build_inputs(plan: Any, gen: torch.Generator) -> dict[str, Any]:
    if plan.config.get("behaviour") == "bad-inputs":
        raise InputError(f"{plan.model_id}: injected input-builder failure")
    return {"x": torch.randn(2, 8, generator=gen)}

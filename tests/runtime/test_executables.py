"""Loaded executables stay within the process's memory-mapping budget (executables.py).

Each loaded XLA CPU executable maps its code into the process; a run that compiles tens of thousands
of programs used to pass Linux's vm.max_map_count and segfault inside JAX.
"""

import pytest
import torch

import hf_tpu  # noqa: F401
from hf_tpu.runtime.buffers import executables

pytestmark = pytest.mark.skipif(executables.map_count() is None, reason="the OS does not list mappings")


def test_executables_are_unloaded_past_the_mapping_budget(monkeypatch):
    torch.ones(1, device="tpu").add_(1)  # JAX initialized, the compile listener installed
    assert executables._installed[0]
    monkeypatch.setenv("HF_TPU_MAP_BUDGET", str(executables.map_count() + 200))
    clears = executables.stats["clears"]
    peak = 0
    for n in range(1, 2 * executables._CHECK_EVERY + 2):  # a new shape: a new executable each
        got = torch.arange(n, device="tpu", dtype=torch.float32).mul(3).add(1)
        assert torch.equal(got.cpu(), torch.arange(n, dtype=torch.float32).mul(3).add(1))
        peak = max(peak, executables.stats["mappings_at_last_clear"])
    assert executables.stats["clears"] > clears
    assert executables.map_count() < peak  # the unloaded executables' mappings are gone
    # kernels compiled before the clear still work: they compile again
    x = torch.arange(5, device="tpu", dtype=torch.float32)
    assert torch.equal(x.mul(3).add(1).cpu(), torch.arange(5, dtype=torch.float32).mul(3).add(1))


def test_a_bad_budget_names_the_variable(monkeypatch):
    monkeypatch.setenv("HF_TPU_MAP_BUDGET", "lots")
    with pytest.raises(ValueError, match="HF_TPU_MAP_BUDGET"):
        executables.map_budget()


def test_unload_if_over_unloads_only_past_its_fraction(monkeypatch):
    torch.ones(2, device="tpu").add_(1)
    monkeypatch.setenv("HF_TPU_MAP_BUDGET", str(10 * executables.map_count()))
    assert not executables.unload_if_over(0.5)  # far under the budget: nothing unloaded
    clears = executables.stats["clears"]
    monkeypatch.setenv("HF_TPU_MAP_BUDGET", str(executables.map_count() // 2))
    assert executables.unload_if_over(0.5)
    assert executables.stats["clears"] == clears + 1
    x = torch.arange(4, device="tpu", dtype=torch.float32)
    assert torch.equal(x.add(1).cpu(), torch.arange(4, dtype=torch.float32).add(1))

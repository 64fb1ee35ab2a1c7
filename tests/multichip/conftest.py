"""Multi-chip tests: this process has 8 forced host devices (tests/conftest.py collects this folder only then)."""

import pytest

from tests.conftest import MULTICHIP_DEVICES


@pytest.fixture(autouse=True, scope="session")
def _eight_chips():
    import torch

    assert torch.tpu.device_count() == MULTICHIP_DEVICES, (
        "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    )

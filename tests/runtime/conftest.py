"""Fixtures shared by the runtime tests."""

import pytest
import torch


@pytest.fixture
def defer():
    """DeferAndFuse for the test, Strict again after it."""
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        yield
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)

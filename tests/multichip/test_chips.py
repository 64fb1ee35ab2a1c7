"""The device sees every forced host chip."""

import torch


def test_device_count_reports_every_chip():
    assert torch.tpu.device_count() == 8
    assert torch.tpu.get_device_capability()["chips"] == 8

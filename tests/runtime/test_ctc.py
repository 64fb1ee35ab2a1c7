"""F.ctc_loss on tpu (what Wav2Vec2ForCTC/HuBERT train with): losses and gradients as on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.mark.parametrize("targets_kind", ["padded", "concatenated"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_and_gradients_match_cpu(targets_kind, reduction, zero_infinity):
    torch.manual_seed(0)
    steps, batch, classes = 12, 3, 6
    logits = torch.randn(steps, batch, classes, requires_grad=True)
    input_lengths = torch.tensor([12, 9, 3])  # the last is too short for its target: an infinite loss
    target_lengths = torch.tensor([4, 2, 3])
    padded = torch.randint(1, classes, (batch, 4))
    targets = (
        padded
        if targets_kind == "padded"
        else torch.cat([padded[b, : target_lengths[b]] for b in range(batch)])
    )
    dev_logits = logits.detach().to("tpu").requires_grad_()
    loss = F.ctc_loss(
        logits.log_softmax(-1), targets, input_lengths, target_lengths, reduction=reduction,
        zero_infinity=zero_infinity,
    )  # fmt: skip
    dev_loss = F.ctc_loss(
        dev_logits.log_softmax(-1), targets.to("tpu"), input_lengths.to("tpu"), target_lengths.to("tpu"),
        reduction=reduction, zero_infinity=zero_infinity,
    )  # fmt: skip
    torch.testing.assert_close(dev_loss.detach().cpu(), loss.detach(), atol=1e-4, rtol=1e-4)
    loss.sum().backward()
    dev_loss.sum().backward()
    # an infinite loss gives NaN gradients on CPU (without zero_infinity): the same here
    torch.testing.assert_close(dev_logits.grad.cpu(), logits.grad, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_ctc_loss_with_integer_lengths():
    torch.manual_seed(1)
    log_probs = torch.randn(8, 2, 5).log_softmax(-1)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0]])
    loss = F.ctc_loss(log_probs, targets, [8, 6], [3, 2])
    dev = F.ctc_loss(log_probs.to("tpu"), targets.to("tpu"), [8, 6], [3, 2])
    torch.testing.assert_close(dev.cpu(), loss, atol=1e-5, rtol=1e-5)

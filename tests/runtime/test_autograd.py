"""Autograd and optimizers on tpu match CPU."""

import copy

import pytest
import torch


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )


def test_backward_fills_grad_on_tpu_leaves():
    x = torch.randn(5, 3)
    w = torch.randn(3, 2, requires_grad=True)
    tw = w.detach().to("tpu").requires_grad_()
    (x @ w).tanh().sum().backward()
    (x.to("tpu") @ tw).tanh().sum().backward()
    assert tw.grad is not None and tw.grad.device.type == "tpu"
    torch.testing.assert_close(tw.grad.cpu(), w.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_optimizer_steps_match_cpu(opt_name):
    ref = _mlp()
    dev = copy.deepcopy(ref).to("tpu")
    kwargs = {"lr": 0.1, "momentum": 0.9} if opt_name == "SGD" else {"lr": 1e-2, "weight_decay": 0.01}
    opt_ref = getattr(torch.optim, opt_name)(ref.parameters(), **kwargs)
    opt_dev = getattr(torch.optim, opt_name)(dev.parameters(), **kwargs)
    torch.manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(6, 8), torch.randn(6, 4)
        for model, opt, xx, yy in ((ref, opt_ref, x, y), (dev, opt_dev, x.to("tpu"), y.to("tpu"))):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xx), yy)
            loss.backward()
            opt.step()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.device.type == "tpu"
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_recomputes_dropout_with_the_same_mask(reentrant):
    """torch.utils.checkpoint saves/restores the device RNG only when `torch.tpu._initialized` is True."""
    from torch.utils.checkpoint import checkpoint

    grads = []
    for use_checkpoint in (True, False):
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 8).to("tpu")
        x = torch.randn(4, 8, device="tpu", requires_grad=True)
        torch.manual_seed(1)

        def block(t, lin=lin):
            return torch.nn.functional.dropout(lin(t), 0.5)

        y = checkpoint(block, x, use_reentrant=reentrant) if use_checkpoint else block(x)
        y.sum().backward()
        grads.append((lin.weight.grad.cpu(), x.grad.cpu()))
    assert torch.tpu._initialized
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)

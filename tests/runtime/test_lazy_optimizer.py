"""DeferAndFuse: a whole training step (forward, backward, grad clipping, foreach optimizer) is one flush."""

import pytest
import torch

from hf_tpu.runtime.launch import lazy


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, foreach=True),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True),
}


def _step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
    opt.step()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_step_with_foreach_optimizer_is_one_flush(name):
    torch.manual_seed(0)
    ref, dev = _mlp(), _mlp()
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    opt_ref, opt_dev = OPTIMIZERS[name](ref.parameters()), OPTIMIZERS[name](dev.parameters())
    x, y = torch.randn(5, 8), torch.randn(5, 2)
    xd, yd = x.to("tpu"), y.to("tpu")
    flushes, misses = [], []
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        torch.tpu.flush()
        for _ in range(3):
            before = dict(lazy.stats)
            _step(dev, opt_dev, xd, yd)
            torch.tpu.flush()
            flushes.append(lazy.stats["flushes"] - before["flushes"])
            misses.append(lazy.stats["cache_misses"] - before["cache_misses"])
            _step(ref, opt_ref, x, y)
    # the _foreach_* kernels used to flush the trace and run eagerly: 7 flushes per AdamW step
    assert max(flushes) <= 2, f"flushes per step: {flushes}"
    assert misses[-1] == 0, "the third identical step recompiled"
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-5)

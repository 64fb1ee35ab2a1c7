"""torch.optim's fused kernels (`fused=True`, Trainer's default AdamW) on tpu match PyTorch's CPU ones."""

from __future__ import annotations

import pytest
import torch


def _model_pair(seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dtype)
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dtype)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to("tpu")


def _train(model, opt, device, steps: int = 4, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 8, generator=gen).to(device, dtype)
        y = torch.randn(5, 4, generator=gen).to(device, dtype)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return loss


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, fused=True),
    "adam_decay_maximize": lambda p: torch.optim.Adam(
        p, lr=1e-2, weight_decay=0.05, maximize=True, fused=True
    ),
    "adam_no_decay": lambda p: torch.optim.Adam(p, lr=3e-3, betas=(0.8, 0.9), fused=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, fused=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, fused=True),
    "sgd_plain": lambda p: torch.optim.SGD(p, lr=0.1, fused=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_step_matches_cpu(name):
    cpu, dev = _model_pair()
    make = OPTIMIZERS[name]
    opt_cpu, opt_dev = make(cpu.parameters()), make(dev.parameters())
    loss_cpu = _train(cpu, opt_cpu, "cpu")
    loss_dev = _train(dev, opt_dev, "tpu")
    torch.testing.assert_close(loss_dev.cpu(), loss_cpu, rtol=1e-5, atol=1e-6)
    for (n, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-5, atol=1e-6, msg=f"{name}: {n}")
    for s_cpu, s_dev in zip(opt_cpu.state.values(), opt_dev.state.values()):
        for key, v in s_cpu.items():
            torch.testing.assert_close(s_dev[key].cpu(), v, rtol=1e-5, atol=1e-6, msg=f"{name}: state {key}")


@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float_lr", "tensor_lr"])
def test_lr_schedule_does_not_recompile(tensor_lr):
    from hf_tpu.runtime.device.registration import ensure_kernels
    from hf_tpu.runtime.lowerings.table import TABLE

    ensure_kernels()
    op = torch.ops.aten._fused_adamw_.tensor_lr if tensor_lr else torch.ops.aten._fused_adamw_.default
    cache = TABLE[op].fn.cache
    cpu, dev = _model_pair()
    lr_cpu = torch.tensor(1e-2) if tensor_lr else 1e-2
    lr_dev = torch.tensor(1e-2, device="tpu") if tensor_lr else 1e-2
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=lr_cpu, fused=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=lr_dev, fused=True)
    sched_dev = torch.optim.lr_scheduler.StepLR(opt_dev, step_size=1, gamma=0.5)
    sched_cpu = torch.optim.lr_scheduler.StepLR(opt_cpu, step_size=1, gamma=0.5)
    sizes = []
    for _ in range(3):
        _train(dev, opt_dev, "tpu", steps=1)
        _train(cpu, opt_cpu, "cpu", steps=1)
        sched_dev.step()
        sched_cpu.step()
        sizes.append(len(cache))
    assert sizes[0] >= 1 and sizes[-1] == sizes[0], sizes  # new learning rates, same executable
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-5, atol=1e-6)


def test_grad_scale_unscales_and_found_inf_skips():
    torch.manual_seed(0)
    params = [torch.randn(6), torch.randn(3, 2)]
    grads = [torch.randn(6), torch.randn(3, 2)]

    def run(device, found):
        ps = [p.clone().to(device) for p in params]
        gs = [g.clone().to(device) * 4 for g in grads]
        m = [torch.zeros_like(p) for p in ps]
        v = [torch.zeros_like(p) for p in ps]
        steps = [torch.tensor(1.0, device=device) for _ in ps]
        torch._fused_adamw_(
            ps, gs, m, v, [], steps, lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8,
            amsgrad=False, maximize=False, grad_scale=torch.tensor(4.0, device=device),
            found_inf=torch.tensor(found, device=device),
        )  # fmt: skip
        return [t.cpu() for t in ps + gs + m + v]

    for found in (0.0, 1.0):
        for got, want in zip(run("tpu", found), run("cpu", found)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    skipped = run("tpu", 1.0)
    torch.testing.assert_close(skipped[0], params[0])  # the step was skipped


def test_bf16_params_step_in_float32_like_cpu():
    cpu, dev = _model_pair(dtype=torch.bfloat16)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, fused=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, fused=True)
    _train(cpu, opt_cpu, "cpu", steps=2, dtype=torch.bfloat16)
    _train(dev, opt_dev, "tpu", steps=2, dtype=torch.bfloat16)
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        assert p_dev.dtype == torch.bfloat16
        torch.testing.assert_close(p_dev.cpu().float(), p_cpu.float(), rtol=2e-2, atol=2e-2)


def test_fused_step_under_defer_and_fuse_is_one_recording():
    from hf_tpu.runtime.launch import lazy

    cpu, dev = _model_pair()
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, fused=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, fused=True)
    _train(cpu, opt_cpu, "cpu", steps=2)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        before = lazy.stats["flushes"]
        _train(dev, opt_dev, "tpu", steps=2)
        torch.tpu.synchronize()
        assert lazy.stats["flushes"] - before <= 2
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-5, atol=1e-6)


def test_compiled_step_runs_the_fused_kernel_and_matches_cpu():
    """PyTorch never traces fused optimizers (`torch.compiler.disable`): the step runs our eager kernel."""
    ref, dev = _model_pair()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    step = torch.compile(opt_dev.step, backend="tpu")
    _train(ref, opt_ref, "cpu", steps=3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(5, 8, generator=gen).to("tpu"), torch.randn(5, 4, generator=gen).to("tpu")
        opt_dev.zero_grad()
        torch.nn.functional.mse_loss(dev(x), y).backward()
        step()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_functional_graph_lowering_matches_cpu_functional_op(amsgrad):
    import jax.numpy as jnp

    from hf_tpu.runtime.device.registration import ensure_kernels
    from hf_tpu.runtime.lowerings.table import GRAPH_TABLE

    ensure_kernels()
    torch.manual_seed(0)
    lists = [[torch.randn(4, 3), torch.randn(5)] for _ in range(5)]
    lists[3] = [t.abs() for t in lists[3]]  # second moments are non-negative
    lists[4] = [t.abs() for t in lists[4]]
    if not amsgrad:
        lists[4] = []
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    hyper = dict(lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.02, eps=1e-8, amsgrad=amsgrad, maximize=False)
    want = torch.ops.aten._fused_adamw(*lists, steps, **hyper)
    lowering = GRAPH_TABLE[torch.ops.aten._fused_adamw.default].fn
    as_jax = [[jnp.asarray(t.numpy()) for t in lst] for lst in [*lists, steps]]
    got = lowering(*as_jax, *hyper.values(), None, None)
    for got_list, want_list in zip(got, want):
        assert len(got_list) == len(want_list)
        for g, w in zip(got_list, want_list):
            torch.testing.assert_close(
                torch.from_numpy(__import__("numpy").asarray(g)), w, rtol=1e-6, atol=1e-7
            )

"""torch.autocast("tpu"): CUDA's casting policy on the AutocastPrivateUse1 key, values as CPU computes them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _pair(*shape, dtype=torch.float32):
    x = torch.randn(*shape, dtype=dtype)
    return x, x.to("tpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmuls_run_in_the_autocast_dtype_with_cpu_values(dtype):
    (a, ta), (b, tb), (w, tw) = _pair(4, 8), _pair(8, 6), _pair(6, 8)
    (x3, tx3), (y3, ty3) = _pair(2, 4, 8), _pair(2, 8, 3)
    with torch.autocast("tpu", dtype=dtype):
        outs = {
            "matmul": ta @ tb,
            "mm": torch.mm(ta, tb),
            "linear": F.linear(ta, tw),
            "bmm": torch.bmm(tx3, ty3),
            "addmm": torch.addmm(torch.zeros(6, device="tpu"), ta, tb),
        }
    refs = {
        "matmul": a.to(dtype) @ b.to(dtype),
        "mm": a.to(dtype) @ b.to(dtype),
        "linear": F.linear(a.to(dtype), w.to(dtype)),
        "bmm": torch.bmm(x3.to(dtype), y3.to(dtype)),
        "addmm": torch.addmm(torch.zeros(6, dtype=dtype), a.to(dtype), b.to(dtype)),
    }
    for name, out in outs.items():
        assert out.dtype == dtype, name
        torch.testing.assert_close(out.cpu(), refs[name], msg=name)


def test_precision_sensitive_ops_run_in_float32_and_mixed_inputs_promote():
    (_, tx), (h, th) = _pair(3, 8), _pair(3, 8, dtype=torch.bfloat16)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.exp(th).dtype == torch.float32
        assert F.layer_norm(th, (8,)).dtype == torch.float32
        assert torch.softmax(th, -1).dtype == torch.float32  # no dtype given: computed in float32
        assert torch.softmax(th, -1, dtype=torch.bfloat16).dtype == torch.bfloat16  # given: kept
        assert th.sum().dtype == torch.float32
        assert F.mse_loss(th, th).dtype == torch.float32
        assert torch.cat([th, tx]).dtype == torch.float32  # promoted to the widest input
        assert torch.stack([th, th]).dtype == torch.bfloat16
        assert (th + 1).dtype == torch.bfloat16  # not in any list: falls through
        assert (tx @ tx.T).dtype == torch.bfloat16
        normed = F.layer_norm(th, (8,))
    torch.testing.assert_close(normed.cpu(), F.layer_norm(h.float(), (8,)))


def test_only_tpu_floating_tensors_inside_an_enabled_region_are_cast():
    (a, ta), (_, td) = _pair(4, 4), _pair(4, 4, dtype=torch.float64)
    assert (ta @ ta).dtype == torch.float32  # outside autocast
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert (td @ td).dtype == torch.float64  # float64 is never cast
        assert (a @ a).dtype == torch.float32  # a CPU tensor: CPU autocast is not enabled
        with torch.autocast("tpu", enabled=False):
            assert (ta @ ta).dtype == torch.float32
        assert (ta @ ta).dtype == torch.bfloat16


def test_training_step_under_autocast_matches_cpu_autocast():
    """Linear/ReLU follow the same policy on CPU autocast: same losses and float32 gradients."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    x = torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ref(x)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        dev_out = dev(x.to("tpu"))
    assert dev_out.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(dev_out.cpu(), out)
    out.float().square().mean().backward()
    dev_out.float().square().mean().backward()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.grad.dtype == torch.float32
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad, atol=1e-2, rtol=1e-2)


def _scaled_training(device: str, overflow_at=(2,)):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    history = []
    for step in range(6):
        loss = model(torch.randn(5, 4).to(device)).square().mean()
        if step in overflow_at:
            loss = loss * float("inf")
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        history.append((scaler.get_scale(), int(scaler._growth_tracker.item())))
    return history, [p.detach().cpu() for p in model.parameters()]


def test_grad_scaler_unscales_skips_overflows_and_updates_the_scale_as_on_cpu():
    cpu_history, cpu_params = _scaled_training("cpu")
    history, params = _scaled_training("tpu")
    assert history == cpu_history  # the overflow step backs the scale off and is skipped, then it grows
    assert (1024.0, 0) in history and (2048.0, 0) in history
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a, b)


def test_rms_norm_runs_in_float32_and_binary_cross_entropy_is_refused_as_on_cuda():
    x = torch.rand(4, 3, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert F.rms_norm(x.bfloat16(), (3,)).dtype == torch.float32
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(x, x)
        assert F.binary_cross_entropy_with_logits(x, x).dtype == torch.float32


def test_cross_entropy_runs_in_float32_as_cpu_autocast():
    """ATen's cross_entropy calls log_softmax with an explicit dtype (the logits'): listed as fp32 (CPU
    and torch_xla do), bf16 logits give CPU autocast's loss, not a bf16 log-softmax's."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 10, generator=g) * 2).bfloat16()
    target = torch.randint(0, 10, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.nn.functional.cross_entropy(logits, target, label_smoothing=0.1)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = torch.nn.functional.cross_entropy(logits.to("tpu"), target.to("tpu"), label_smoothing=0.1)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)

"""Training paths on tpu beyond the Trainer basics: accelerate state round trips, optimizers, scalers."""

from __future__ import annotations

import torch


def test_accelerator_save_state_and_load_state_restore_a_prepared_model(tmp_path):
    """`load_state` reads the model with `safetensors.torch.load_model`, which passes `backend=` to
    `load_file` (safetensors 0.8): hf_tpu's tpu-aware `load_file` dropped unknown keywords and raised
    TypeError, for every device."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator()
    assert accelerator.device.type == "tpu"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 4, device=accelerator.device)).square().sum())
    optimizer.step()
    saved = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"].cpu().clone()
    accelerator.save_state(str(tmp_path))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(2, 4, device=accelerator.device)).sum())
    optimizer.step()
    accelerator.load_state(str(tmp_path))
    for name, value in model.state_dict().items():
        assert value.device.type == "tpu"
        torch.testing.assert_close(value.cpu(), saved[name], atol=0, rtol=0, msg=name)
    torch.testing.assert_close(optimizer.state_dict()["state"][0]["exp_avg"].cpu(), exp_avg, atol=0, rtol=0)


def test_compiled_attention_on_cpu_tensors_has_eager_gradients():
    """`torch.compile(backend="tpu")` of a CPU model (`Trainer(use_cpu=True, torch_compile_backend="tpu")`):
    torch's core decomposition of `_scaled_dot_product_flash_attention_for_cpu` hands its backward the
    attention weights as the logsumexp, so q/k/v gradients were wrong (losses drifted from step 2)."""
    import torch._dynamo

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    f(q, k, v).backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    torch.compile(f, backend="tpu")(q, k, v).backward()
    for want, t in zip(expected, (q, k, v)):
        torch.testing.assert_close(t.grad, want, atol=1e-5, rtol=1e-5)


def test_find_executable_batch_size_retries_after_a_tpu_out_of_memory():
    """accelerate (and `Trainer(auto_find_batch_size=True)`) halve the batch only when the error says
    " out of memory." as CUDA/XPU do; tpu said "tpu out of memory: ..." and the first OOM escaped."""
    from accelerate.utils import find_executable_batch_size

    fraction = (64 << 20) / torch.tpu.get_device_properties(0).total_memory  # a 64 MiB device
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def step(batch_size):
        tried.append(batch_size)
        torch.ones(batch_size, 3 << 19, dtype=torch.uint8, device="tpu")  # 64 x 1.5 MiB do not fit
        return batch_size

    torch.tpu.set_per_process_memory_fraction(fraction)
    try:
        found = step()
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert tried[0] == 64 and found == tried[-1] < 64  # it retried with smaller batches until one fit

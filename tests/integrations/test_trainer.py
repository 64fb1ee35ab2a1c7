"""Trainer on tpu (use_cpu=False): it picks the tpu device, and the losses of a few steps match CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class _Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 128, (16, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(tmp_path, use_cpu: bool, tie: bool = False, dropout: float = 0.0, resume=None, **extra):
    torch.manual_seed(0)
    config = LlamaConfig(
        attention_dropout=dropout,
        tie_word_embeddings=tie,
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)
    kwargs = dict(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "tpu")),
        use_cpu=use_cpu,
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    args = TrainingArguments(**{**kwargs, **extra})
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens())
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, model, losses


def test_trainer_runs_on_tpu_and_matches_cpu(tmp_path):
    _, cpu_model, cpu_losses = _train(tmp_path, use_cpu=True)
    trainer, model, losses = _train(tmp_path, use_cpu=False)
    assert trainer.args.device.type == "tpu"
    assert trainer.accelerator.device.type == "tpu"  # accelerate's PartialState picks tpu, not cpu
    assert all(p.device.type == "tpu" for p in model.parameters())
    assert len(losses) == 3
    assert losses == pytest.approx(cpu_losses, abs=1e-4)
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-4, rtol=1e-4, msg=name)


def test_training_arguments_on_tpu(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert args.device.type == "tpu"
    assert args.dataloader_pin_memory is False  # pinning is a no-op on tpu: no pinning thread
    assert str(getattr(args.optim, "value", args.optim)) == "adamw_torch_fused"  # runs aten::_fused_adamw_
    assert TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True).device.type == "cpu"


def test_trainer_with_bf16_mixed_precision_matches_cpu(tmp_path):
    """accelerate enters torch.autocast("tpu", bfloat16) for bf16=True: it runs, with CPU's losses."""
    _, _, cpu_losses = _train(tmp_path, use_cpu=True, bf16=True)
    trainer, _, losses = _train(tmp_path, use_cpu=False, bf16=True)
    assert trainer.accelerator.mixed_precision == "bf16" and trainer.args.device.type == "tpu"
    assert losses == pytest.approx(cpu_losses, abs=1e-3)


def test_trainer_with_torch_compile_uses_the_tpu_backend_and_matches_cpu(tmp_path):
    """`torch_compile=True` defaults to inductor, which cannot generate tpu code: on tpu it picks the
    `tpu` backend (accelerate's DynamoBackend enum gets a TPU member). The model ties its LM head to the
    embedding, which must stay tied when Trainer moves it to tpu."""
    import torch._dynamo

    _, _, cpu_losses = _train(tmp_path, use_cpu=True, tie=True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    trainer, model, losses = _train(tmp_path, use_cpu=False, tie=True, torch_compile=True)
    assert trainer.args.torch_compile_backend == "tpu"
    assert trainer.accelerator.state.dynamo_plugin.backend.value == "TPU"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert losses == pytest.approx(cpu_losses, abs=1e-4)


def test_trainer_under_defer_and_fuse_matches_cpu(tmp_path):
    """A user who sets DeferAndFuse and calls Trainer: accumulation, clipping and checkpointing fuse, and
    the losses are CPU's."""
    from hf_tpu.runtime.launch import lazy

    extra = dict(gradient_accumulation_steps=2, max_grad_norm=0.5, activation_checkpointing=True)
    _, cpu_model, cpu_losses = _train(tmp_path, use_cpu=True, **extra)
    flushes = lazy.stats["flushes"]
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _, model, losses = _train(tmp_path, use_cpu=False, **extra)
    assert lazy.stats["flushes"] > flushes  # the steps really ran deferred
    assert losses == pytest.approx(cpu_losses, abs=1e-4)
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-4, rtol=1e-4, msg=name)


def test_resumed_trainer_with_dropout_continues_like_an_uninterrupted_run(tmp_path):
    """Checkpoints hold the tpu generator's state and `resume_from_checkpoint` restores it: transformers
    saves only cpu/cuda/npu/... states, so the resumed steps drew other dropout masks (other losses)."""
    extra = dict(max_steps=4, save_strategy="steps", save_steps=2, dropout=0.3)
    _, full_model, full_losses = _train(tmp_path / "full", use_cpu=False, **extra)
    checkpoint = tmp_path / "full" / "tpu" / "checkpoint-2"
    assert "tpu" in torch.load(checkpoint / "rng_state.pth", weights_only=False)
    _, model, losses = _train(tmp_path / "resumed", use_cpu=False, resume=str(checkpoint), **extra)
    assert losses[-2:] == pytest.approx(full_losses[-2:], abs=1e-6)
    for (name, p), q in zip(model.named_parameters(), full_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), atol=1e-6, rtol=1e-6, msg=name)


def test_accelerator_load_state_restores_the_tpu_generator(tmp_path):
    """`Accelerator.save_state`/`load_state` keep the tpu generator's state with the cpu/cuda ones."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # accelerate's state is a process-wide singleton: a `use_cpu=True` TrainingArguments built by an
    # earlier test would otherwise decide this Accelerator's device
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator()
    assert accelerator.device.type == "tpu"
    dropout = torch.nn.Dropout(0.5)
    x = torch.ones(64, device=accelerator.device)
    accelerator.save_state(str(tmp_path))
    first = dropout(x).cpu()
    accelerator.load_state(str(tmp_path))
    torch.testing.assert_close(dropout(x).cpu(), first, atol=0, rtol=0)

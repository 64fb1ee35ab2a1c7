"""transformers' own tensor parallelism on tpu_dist against one CPU process (argv: rank world_size ckpt_dir
families load steps [trainer]; families: a comma list of llama, qwen2, mixtral, each optionally
`family:load` to load that one its own way; load: auto (`tp_plan="auto"`), config
(`DistributedConfig(tp_size=N)`), mesh (`tp_plan="auto", device_mesh=init_device_mesh("tpu", ...)`) or, with
"trainer" only, ddp (no tp: the whole model on each rank, each rank trains on its half of the batch) or fsdp2
(`TrainingArguments(fsdp=True, fsdp_config={"version": 2, ...})`: accelerate's `fully_shard` of a CPU-loaded
model, each rank trains on its half of the batch, then `save_model` gathers the full checkpoint)).

The script is what a CUDA user would run under torchrun with "cuda" -> "tpu" and "nccl" -> "tpu_dist":
`torch.tpu.set_device(local_rank)`, `init_process_group("tpu_dist")`, then `from_pretrained(path, ...)`.
Rank 0 saves each tiny model (built from a config and a seed, nothing downloaded) to `ckpt_dir`; every rank
loads the same checkpoint once on CPU without tp (the reference) and once with transformers' tp plan on tpu.
Checks: the forward logits, a short greedy `generate`, then `steps` AdamW steps on the tp model (each
step's loss, the first step's gradients and the updated weights, gathered with `full_tensor()`) equal the
CPU run (fp32). With "trainer", the steps are `Trainer.train()` instead of a plain loop.
Exits 1 listing every failed check."""

from __future__ import annotations

import functools
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message=".*tp_plan.*deprecated.*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checks import Checker  # noqa: E402

rank, world = int(sys.argv[1]), int(sys.argv[2])
ckpt_root = sys.argv[3]
families = (sys.argv[4] if len(sys.argv) > 4 else "llama").split(",")
default_load = sys.argv[5] if len(sys.argv) > 5 else "auto"
load = default_load  # the family's own (see the loop at the end)
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 1
trainer = len(sys.argv) > 7 and sys.argv[7] == "trainer"
local_rank = int(os.environ["LOCAL_RANK"])
check = Checker(rank)
torch.tpu.set_device(local_rank)
dist.init_process_group("tpu_dist")

TOL = {"rtol": 1e-4, "atol": 1e-4}
# Adam's step is about lr * sign(grad) wherever |grad| >> eps, so a gradient that is ~0 in fp32 (summed in
# another order by tp) can move its weight by up to ~lr differently: lr 1e-3 keeps that under TOL's atol
# scale while a wrong gradient (sign or size) still moves a weight by ~2e-3.
LR = 1e-3


def tiny_config(family: str):
    """A small config whose every sharded dim divides by 2 and 4 (heads, kv heads, intermediate, vocab)."""
    import transformers

    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, use_sliding_window=False)
    if family == "mixtral":  # experts: packed_colwise gate_up, rowwise down, moe_tp_experts
        return transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(family)


def save_checkpoint(family: str) -> str:
    """Rank 0 writes the seeded model; the others wait for it."""
    import transformers

    path = os.path.join(ckpt_root, family)
    if rank == 0:
        torch.manual_seed(1234)
        model = transformers.AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.float32)
        model.save_pretrained(path)
    dist.barrier()
    return path


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The same token batch on every rank (tp: every rank sees the whole batch)."""
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, 128, (2, 12), generator=g)
    return ids, torch.ones_like(ids)


def load_tp(path: str):
    """transformers' own tp loading, the way the user asked for it."""
    from transformers import AutoModelForCausalLM

    if load == "auto":
        return AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.float32)
    if load == "config":
        from transformers.distributed import DistributedConfig

        return AutoModelForCausalLM.from_pretrained(
            path, distributed_config=DistributedConfig(tp_size=world), dtype=torch.float32
        )
    if load == "mesh":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
        return AutoModelForCausalLM.from_pretrained(
            path, tp_plan="auto", device_mesh=mesh, dtype=torch.float32
        )
    if load == "ddp":  # no tp: every rank holds the whole model (Trainer wraps it in DDP)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("tpu")
    if load == "fsdp2":  # loaded on CPU, as a CUDA user would: accelerate's fully_shard moves it to tpu
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    raise ValueError(load)


def close(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """checks.Checker.close with tp's tolerance (sharded matmuls sum in another order): the result must be a
    tpu tensor of the CPU dtype, within rtol/atol 1e-4 (integers: exact)."""
    try:
        assert actual.device.type == "tpu", f"result is on {actual.device}"
        got = actual.cpu()
        assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
        torch.testing.assert_close(
            got, expected, **(TOL if expected.is_floating_point() else {"rtol": 0, "atol": 0})
        )
        check.passed += 1
    except Exception as exc:  # noqa: BLE001 - collected, reported at the end
        check.failures.append(f"[rank {rank}] {name}: {exc}")


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (a plain tensor as is)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """`steps` AdamW steps on next-token loss; returns each step's loss and the first step's gradients
    (global values). foreach=False: a tp model mixes DTensor (sharded) and plain (norm) parameters, and
    torch's foreach AdamW puts them in one group and raises "got mixed torch.Tensor and DTensor" on every
    device (gloo on CPU too)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, foreach=False)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        if step == 0:
            grads = {n: full(p.grad) for n, p in model.named_parameters()}
        opt.step()
        losses.append(full(loss.detach()))
    return losses, grads


def tp_matches_cpu(family: str) -> None:
    from transformers import AutoModelForCausalLM

    path = save_checkpoint(family)
    ids, mask = batch()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        ref_logits = ref(input_ids=ids, attention_mask=mask).logits
    ref_gen = ref.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)

    model = load_tp(path)
    assert model.tp_size == world, f"tp_size {model.tp_size} != {world}"
    assert model.device.type == "tpu", f"model on {model.device}"
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.to_local().shape[0] * world == q.shape[0], f"q_proj not split: {q.to_local().shape} of {q.shape}"
    if family == "mixtral":
        experts = model.model.layers[0].mlp.experts.gate_up_proj
        assert experts.to_local().numel() * world == experts.numel(), (
            f"experts not split: {experts.placements}"
        )
    tids, tmask = ids.to("tpu"), mask.to("tpu")
    with torch.no_grad():
        logits = full(model(input_ids=tids, attention_mask=tmask).logits)
    close(f"{family} {load} logits", logits, ref_logits)
    gen = model.generate(tids, attention_mask=tmask, max_new_tokens=6, do_sample=False)
    close(f"{family} {load} generate", full(gen), ref_gen)

    ref_losses, ref_grads = train(ref, ids, mask)
    losses, grads = train(model, tids, tmask)
    for step, (got, want) in enumerate(zip(losses, ref_losses)):
        close(f"{family} {load} step {step} loss", got, want)
    for name, grad in grads.items():
        close(f"{family} {load} step 0 grad {name}", grad, ref_grads[name])
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        close(f"{family} {load} trained {name}", full(p.detach()), ref_params[name].detach())


def trainer_matches_cpu(family: str) -> None:
    """`Trainer` on the loaded model (accelerate's state on tpu_dist, AdamW, constant lr, no clipping): the
    logged loss of each step and the trained weights equal the plain CPU loop of `train`. The global batch
    is the whole dataset, so the sampler's shuffling only reorders its rows (ddp: splits them between the
    ranks). Trainer groups the optimizer's parameters by mesh, so its foreach AdamW does not hit the mixed
    DTensor/Tensor error `train` avoids with foreach=False."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    path = save_checkpoint(family)
    ids, mask = batch()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref_losses, _ = train(ref, ids, mask)
    model = load_tp(path)
    data_parallel = load in ("ddp", "fsdp2")  # each rank trains on its share of the batch
    fsdp = {}
    if load == "fsdp2":  # FSDP2 through accelerate: each decoder layer, then the root, fully_shard-ed
        layer = type(model.model.layers[0]).__name__
        fsdp = dict(
            fsdp=True,
            fsdp_config={
                "version": 2,
                "transformer_layer_cls_to_wrap": [layer],
                "reshard_after_forward": True,
            },
        )
    rows = [{"input_ids": i, "attention_mask": m, "labels": i} for i, m in zip(ids, mask)]
    args = TrainingArguments(
        output_dir=os.path.join(ckpt_root, f"trainer-{family}"),
        ddp_find_unused_parameters=False,
        per_device_train_batch_size=len(rows) // world if data_parallel else len(rows),
        max_steps=steps,
        learning_rate=LR,
        weight_decay=0.01,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        **fsdp,
    )
    t = Trainer(model=model, args=args, train_dataset=rows)
    acc = t.accelerator
    assert t.args.device.type == "tpu", f"Trainer's device is {t.args.device}"
    assert (acc.num_processes, acc.process_index) == (world, rank), (acc.num_processes, acc.process_index)
    assert acc.state.backend == "tpu_dist", acc.state.backend
    t.train()
    if load == "ddp":
        wrapped = type(t.model_wrapped).__name__
        assert wrapped == "DistributedDataParallel", f"Trainer did not wrap the model in DDP: {wrapped}"
    if load == "fsdp2":
        from torch.distributed.fsdp import FSDPModule

        assert isinstance(t.model_wrapped, FSDPModule), (
            f"not fully_shard-ed: {type(t.model_wrapped).__name__}"
        )
        assert acc.distributed_type.value == "FSDP", acc.distributed_type
        w = t.model.model.layers[0].self_attn.q_proj.weight
        assert w.to_local().shape[0] * world == w.shape[0], f"q_proj not sharded: {w.placements}"
    logged = [h["loss"] for h in t.state.log_history if "loss" in h]
    assert len(logged) == steps, t.state.log_history
    for step, (got, want) in enumerate(zip(logged, ref_losses)):
        close(f"{family} trainer step {step} logged loss", torch.tensor(got, device="tpu"), want)
    ref_params = dict(ref.named_parameters())
    for name, p in t.model.named_parameters():
        close(f"{family} trainer trained {name}", full(p.detach()), ref_params[name].detach())
    if (
        load == "fsdp2"
    ):  # Trainer.save_model gathers the full state dict: the saved checkpoint is the CPU result
        saved = os.path.join(ckpt_root, f"trainer-{family}", "final")
        t.save_model(saved)
        dist.barrier()

        def saved_matches() -> None:
            back = dict(AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).named_parameters())
            assert back.keys() == ref_params.keys(), sorted(back.keys() ^ ref_params.keys())
            for name, p in back.items():
                torch.testing.assert_close(p.detach(), ref_params[name].detach(), **TOL)

        check.run(f"{family} fsdp2 save_model", saved_matches)


for spec in families:
    family, _, own = spec.partition(":")
    load = own or default_load
    fn = trainer_matches_cpu if trainer else tp_matches_cpu
    check.run(f"transformers tp {family} ({load}, {fn.__name__})", functools.partial(fn, family))
dist.barrier()
dist.destroy_process_group()
sys.exit(check.finish())

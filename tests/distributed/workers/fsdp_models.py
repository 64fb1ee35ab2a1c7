"""Models, data and CPU reference training shared by the FSDP2 workers: built from a seed on CPU, so
every rank (and the CPU reference) starts from the same weights."""

from __future__ import annotations

import copy

import torch

# Adam divides each update by the gradient's running RMS, so rounding differences in tiny gradients
# move a parameter by up to ~lr per step: a small lr keeps that under the 1e-5 tolerance
LR = 1e-3
WEIGHT_DECAY = 0.1


class MLP(torch.nn.Module):
    def __init__(self, dim: int = 16, layers: int = 3) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, dim)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
            for _ in range(layers)
        )
        self.norm = torch.nn.LayerNorm(dim)
        self.out = torch.nn.Linear(dim, 3)  # 3 rows: uneven shards (padded by FSDP2)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.out(self.norm(h))


def make_mlp(parts: int, steps: int, seq: tuple = ()):
    """(model, `steps` global batches of 4 * `parts` rows, loss function); `seq`: a sequence
    dim for every row (the batches are then (rows, *seq, features))."""
    torch.manual_seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(4 * parts, *seq, 8, generator=g), torch.randn(4 * parts, *seq, 3, generator=g))
        for _ in range(steps)
    ]

    def loss_fn(model, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    return model, data, loss_fn


def make_llama(parts: int, steps: int):
    """A tiny Llama from `LlamaConfig` (nothing downloaded), as `make_mlp`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float()
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 64, (2 * parts, 12), generator=g) for _ in range(steps)]

    def loss_fn(model, ids):
        return model(input_ids=ids, labels=ids).loss

    return model, data, loss_fn


MODELS = {
    "mlp": make_mlp,
    "mlp-seq": lambda parts, steps: make_mlp(parts, steps, seq=(6,)),
    "llama": make_llama,
}


def blocks_of(model) -> list:
    """The modules `fully_shard` wraps one by one (then the root)."""
    return list(model.layers) if isinstance(model, MLP) else list(model.model.layers)


def cpu_reference(model, data, loss_fn) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A copy of `model` trained on whole batches in this process: (the trained copy, loss per step)."""
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for batch in data:
        opt.zero_grad()
        loss = loss_fn(ref, batch)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return ref, losses


def local(batch, index: int, parts: int):
    """Part `index` of `parts` of a global batch (every tensor split along dim 0)."""
    if isinstance(batch, tuple):
        return tuple(local(b, index, parts) for b in batch)
    n = batch.shape[0] // parts
    return batch[index * n : (index + 1) * n]


def to_tpu(batch):
    return tuple(to_tpu(b) for b in batch) if isinstance(batch, tuple) else batch.to("tpu")

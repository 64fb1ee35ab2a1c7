"""Which weight is split how over the chips: the sharding policies (`tp`, `fsdp`, `replicate`).

- `tp`: transformers' tensor-parallel plan (`base_model_tp_plan`, a model's `_tp_plan`), or a diffusers
  model's `_tp_plan` (its `PackedColwiseParallel`/`PackedRowwiseParallel` objects read as the packed styles), read as
  PartitionSpecs over the mesh's "model" axis: `colwise` splits a linear layer's output features
  (weight dim 0, bias), `rowwise` its input features (weight's last dim; bias replicated), embeddings
  by vocabulary (`embedding_rowwise`) or hidden size (`embedding_colwise`), packed gate/up projections and
  experts along their packed dim. One process drives every chip: GSPMD computes the same math whatever
  the split, so each style only decides where the bytes live and which collectives XLA inserts (for
  packed projections, a split that keeps gate and up of one shard together would save a reshuffle;
  the plain split is correct). Weights the plan does not name are replicated.
- `fsdp`: every weight with at least `FSDP_MIN_NUMEL` elements split along its largest dim that divides
  over the whole mesh (GSPMD gathers it where it is used); small ones replicated.
- `replicate`: a full copy of every weight on every chip.

A weight whose dim does not divide over the axis is replicated, and named once in a log line.
`HF_TPU_SHARDING=tp|fsdp|replicate` or `with hf_tpu.sharding_policy("fsdp"):` picks the policy; by
default `tp` when the model has a plan, else `fsdp`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
from collections.abc import Iterator

import torch

log = logging.getLogger("hf_tpu.sharding")

POLICIES = ("tp", "fsdp", "replicate")
FSDP_MIN_NUMEL = 1 << 12
_state = threading.local()

# tp styles -> which dim of a parameter they split ("last": its last dim); None: replicated
_SPLIT_OUTPUT = ("colwise", "colwise_rep", "colwise_gather_output", "packed_colwise")
_SPLIT_INPUT = ("rowwise", "rowwise_split_input", "rowwise_rep", "packed_rowwise")


class ShardingPolicyError(ValueError):
    """An unknown sharding policy name."""


def _check(policy: str) -> str:
    if policy not in POLICIES:
        raise ShardingPolicyError(
            f"unknown sharding policy {policy!r}: use one of {', '.join(POLICIES)} "
            "(HF_TPU_SHARDING or hf_tpu.sharding_policy)"
        )
    return policy


def requested_policy() -> str | None:
    """The policy chosen by `sharding_policy(...)` or HF_TPU_SHARDING (None: the default for the model)."""
    chosen = getattr(_state, "policy", None)
    if chosen is not None:
        return chosen
    env = os.environ.get("HF_TPU_SHARDING", "").strip().lower()
    return _check(env) if env else None


@contextlib.contextmanager
def sharding_policy(policy: str) -> Iterator[None]:
    """Load and shard models with `policy` ("tp", "fsdp" or "replicate") inside the block."""
    previous = getattr(_state, "policy", None)
    _state.policy = _check(policy)
    try:
        yield
    finally:
        _state.policy = previous


def _axis(mesh) -> str:
    """The mesh axis tensor parallelism splits over: "model", else the mesh's last axis."""
    names = tuple(mesh.axis_names)
    return "model" if "model" in names else names[-1]


def tp_dim(style: str, param_name: str, ndim: int) -> int | None:
    """The dim of a parameter (its short name, e.g. "weight", and rank) that tp style `style` splits."""
    if ndim == 0:
        return None
    if style in _SPLIT_OUTPUT:
        if ndim == 1:  # a bias (or a packed 1-D weight): its only dim
            return 0
        return ndim - 2
    if style in _SPLIT_INPUT:
        return None if ndim == 1 else ndim - 1
    if style == "embedding_rowwise":
        return 0
    if style == "embedding_colwise":
        return 1 if ndim > 1 else None
    return None  # replicated styles, module hooks (moe_tp_experts, sequence_parallel, ...)


def _plan_regex(plan: dict[str, str]) -> list[tuple[re.Pattern, str]]:
    """Plan keys ("model.layers.*.mlp.up_proj") as full-name patterns, most specific first."""
    compiled = []
    for key, style in plan.items():
        pattern = re.escape(key).replace(r"\*", r"\d+")
        compiled.append((re.compile(pattern), style))
    return sorted(compiled, key=lambda kv: -len(kv[0].pattern))


# diffusers' `_tp_plan` holds style objects next to strings (PackedRowwiseParallel() for Flux's fused proj_out)
_STYLE_CLASSES = {
    "ColwiseParallel": "colwise",
    "RowwiseParallel": "rowwise",
    "PackedColwiseParallel": "packed_colwise",
    "PackedRowwiseParallel": "packed_rowwise",
}


def style_name(style) -> str:
    """A plan entry as a style string: transformers' strings as they are, diffusers'/torch's style objects
    by their class (`PackedRowwiseParallel()` -> "packed_rowwise"); unknown objects replicate."""
    if isinstance(style, str):
        return style
    return _STYLE_CLASSES.get(type(style).__name__, "replicate")


def model_tp_plan(model) -> dict[str, str]:
    """The model's full tensor-parallel plan (keys relative to the model), or {} when it has none: transformers'
    `base_model_tp_plan` and `_tp_plan`, or a diffusers model's `_tp_plan` (same glob keys)."""
    plan = getattr(model, "tp_plan", None)
    if isinstance(plan, dict) and plan:
        return {key: style_name(style) for key, style in plan.items()}
    plan = {key: style_name(style) for key, style in (getattr(type(model), "_tp_plan", None) or {}).items()}
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    inner = getattr(model, prefix, None) if prefix else None
    for key, style in base.items():
        plan[f"{prefix}.{key}" if inner is not None and inner is not model else key] = style
    return plan


class Placement:
    """The spec of every parameter/buffer of one model under one policy, on the current mesh."""

    def __init__(self, model: torch.nn.Module | None, policy: str | None = None, plan: dict | None = None):
        from hf_tpu.runtime.buffers import placement

        self.mesh = placement.mesh()
        if plan is None and model is not None:
            plan = model_tp_plan(model)
        self.plan = {key: style_name(style) for key, style in (plan or {}).items()}
        self.policy = _check(policy) if policy else ("tp" if self.plan else "fsdp")
        self._patterns = _plan_regex(self.plan)
        self.axis = _axis(self.mesh)
        self.sizes = dict(self.mesh.shape)
        self.replicated_names: list[str] = []
        self._logged = False

    def style_of(self, name: str) -> str | None:
        """The tp style that applies to parameter `name` (its own entry, else its module's)."""
        module = name.rpartition(".")[0]
        for pattern, style in self._patterns:
            if pattern.fullmatch(name):
                return style
        for pattern, style in self._patterns:
            if pattern.fullmatch(module):
                return style
        return None

    def spec_for(self, name: str, shape: tuple) -> tuple:
        """How to lay out tensor `name` of `shape`: a spec tuple (all None: replicated)."""
        ndim = len(shape)
        if self.policy == "replicate" or ndim == 0 or math.prod(self.sizes.values()) == 1:
            return (None,) * ndim
        if self.policy == "tp":
            style = self.style_of(name)
            dim = None if style is None else tp_dim(style, name.rpartition(".")[2], ndim)
            if dim is None:
                return (None,) * ndim
            ways = self.sizes[self.axis]
            if shape[dim] % ways:
                self._replicated(name, f"dim {dim} ({shape[dim]}) does not divide over {ways} chips")
                return (None,) * ndim
            return tuple(self.axis if d == dim else None for d in range(ndim))
        # fsdp: the largest dim that divides over the whole mesh (else over the tp axis alone)
        if math.prod(shape) < FSDP_MIN_NUMEL:
            return (None,) * ndim
        axes = tuple(self.mesh.axis_names)
        for names in (axes, (self.axis,)):
            ways = math.prod(self.sizes[n] for n in names)
            for dim in sorted(range(ndim), key=lambda d: -shape[d]):
                if shape[dim] % ways == 0:
                    entry = names[0] if len(names) == 1 else names
                    return tuple(entry if d == dim else None for d in range(ndim))
        self._replicated(name, f"no dim of {tuple(shape)} divides over the chips")
        return (None,) * ndim

    def _replicated(self, name: str, why: str) -> None:
        self.replicated_names.append(name)
        if len(self.replicated_names) <= 8:
            log.info("hf_tpu: %s is replicated on every chip (%s)", name, why)

    def chip_bytes(self, shapes: dict[str, tuple[tuple, int]]) -> int:
        """Bytes the largest chip would hold for tensors {name: (shape, itemsize)} placed by this policy."""
        total = 0
        for name, (shape, itemsize) in shapes.items():
            spec = self.spec_for(name, shape)
            ways = 1
            for entry in spec:
                if entry is not None:
                    names = (entry,) if isinstance(entry, str) else entry
                    ways *= math.prod(self.sizes[n] for n in names)
            total += math.prod(shape) * itemsize // ways
        return total


def place_tensor(tensor: torch.Tensor, spec: tuple) -> torch.Tensor:
    """`tensor` (cpu or tpu) laid out by `spec` on the mesh (a tpu tensor; in place when it is one)."""
    from hf_tpu.runtime.tensors.sharding import shard

    return shard(tensor, spec)


def shard_module(module: torch.nn.Module, policy: str | None = None, plan: dict | None = None):
    """Lay every tpu parameter and buffer of `module` out over the chips by `policy` (default: `tp` when
    the module has a tensor-parallel plan, else `fsdp`); tensors keep their identity (`nn.Parameter`s
    stay the same objects, tied weights stay tied). Returns `module`."""
    if policy is None:
        policy = requested_policy()
    placement = Placement(module, policy, plan)
    seen: set[int] = set()
    for name, tensor in list(module.named_parameters(remove_duplicate=False)) + list(
        module.named_buffers(remove_duplicate=False)
    ):
        if tensor is None or tensor.device.type != "tpu" or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        place_tensor(tensor, placement.spec_for(name, tuple(tensor.shape)))
    return module

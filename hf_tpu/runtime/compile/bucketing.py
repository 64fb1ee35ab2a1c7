"""`hf_tpu.compile(model, buckets=...)`: pad variable sequence lengths to a few sizes so a compiled
model sees a handful of shapes instead of recompiling for every new length."""

from __future__ import annotations

import bisect
import inspect
import logging
from collections.abc import Sequence

import torch
from torch.utils import _pytree as pytree

log = logging.getLogger("hf_tpu.compile")

# what padding must hold so that it changes nothing: ignored by the loss, masked out of attention
_DEFAULT_PADS = {"labels": -100, "attention_mask": 0}
_TOKENS = ("input_ids", "inputs_embeds")


class BucketedModule(torch.nn.Module):
    """Calls `compiled` with tensor inputs padded along `dim` to the next bucket; slices outputs back.

    Padding values default to 0, -100 for `labels` (the loss ignores them) and 0 for `attention_mask`
    (ids: use `pad_values={"input_ids": pad_token_id}`). A model that takes an `attention_mask` and is
    called without one gets one that masks the padding out (ones over the true length), so a
    bidirectional encoder attends to the same tokens as unpadded. Outputs that have the padded length
    along `dim` because they follow the sequence (not a hidden size that happens to equal the bucket)
    are cut back to the true length: which ones is found once per bucket by tracing the model with fake
    tensors one token longer.
    """

    def __init__(
        self, model: torch.nn.Module, compiled, buckets: Sequence[int], dim: int, pad_values: dict
    ) -> None:
        super().__init__()
        self.model = model
        self._compiled = compiled
        self.buckets = sorted(int(b) for b in buckets)
        self.dim = dim
        self.pad_values = {**_DEFAULT_PADS, **dict(pad_values)}
        self._names, self._takes_mask = _parameters(model)
        self._follows_length: dict = {}  # (padded length, outputs' structure) -> outputs to cut, or None

    def bucket_for(self, length: int) -> int:
        i = bisect.bisect_left(self.buckets, length)
        if i == len(self.buckets):
            raise ValueError(
                f"sequence length {length} exceeds the largest bucket {self.buckets[-1]}; "
                "pass larger buckets to hf_tpu.compile(model, buckets=...)"
            )
        return self.buckets[i]

    def forward(self, *args, **kwargs):
        lengths = [
            v.shape[self.dim]
            for v in list(args) + list(kwargs.values())
            if isinstance(v, torch.Tensor) and v.dim() > self.dim
        ]
        if not lengths:
            return self._compiled(*args, **kwargs)
        length = max(lengths)
        target = self.bucket_for(length)
        if target == length:
            return self._compiled(*args, **kwargs)
        args, kwargs = self._padded(args, kwargs, length, target)
        out = self._compiled(*args, **kwargs)
        return self._cut(out, args, kwargs, length, target)

    def _padded(self, args, kwargs, length: int, target: int) -> tuple[list, dict]:
        """The inputs padded to `target`; an attention mask added when the model takes one and the
        caller gave none."""
        names = [self._names[i] if i < len(self._names) else None for i in range(len(args))]
        given = dict(zip(names, args, strict=True)) | kwargs
        tokens = next((given[n] for n in _TOKENS if isinstance(given.get(n), torch.Tensor)), None)
        if self._takes_mask and given.get("attention_mask") is None and self.dim == 1 and tokens is not None:
            if tokens.dim() > 1 and tokens.shape[1] == length:
                kwargs = {
                    **kwargs,
                    "attention_mask": torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device),
                }
                if "attention_mask" in names:  # passed positionally as None
                    args = list(args)
                    args[names.index("attention_mask")] = kwargs.pop("attention_mask")

        def pad(name, v):
            if not isinstance(v, torch.Tensor) or v.dim() <= self.dim or v.shape[self.dim] != length:
                return v
            widths = [0, 0] * (v.dim() - self.dim - 1) + [0, target - length]
            return torch.nn.functional.pad(v, widths, value=self.pad_values.get(name, 0))

        return [pad(n, a) for n, a in zip(names, args, strict=True)], {
            k: pad(k, v) for k, v in kwargs.items()
        }

    def _cut(self, out, args, kwargs, length: int, padded: int):
        leaves, spec = pytree.tree_flatten(out)
        key = (padded, spec)
        if key in self._follows_length:
            follows = self._follows_length[key]
        else:
            follows = self._follows_length[key] = self._probe(args, kwargs, padded, leaves, spec)
        cut = []
        for i, leaf in enumerate(leaves):
            if (
                isinstance(leaf, torch.Tensor)
                and leaf.dim() > self.dim
                and leaf.shape[self.dim] == padded
                and (follows is None or i in follows)
            ):
                leaf = leaf.narrow(self.dim, 0, length)
            cut.append(leaf)
        if isinstance(out, dict):  # a ModelOutput: update it in place (it is a fresh object per call)
            new = pytree.tree_unflatten(cut, spec)
            for k in list(out.keys()):
                out[k] = new[k]
            return out
        return pytree.tree_unflatten(cut, spec)

    def _probe(self, args, kwargs, padded: int, leaves: list, spec) -> set | None:
        """Which flattened outputs follow the padded length along `dim`: those whose size there becomes
        `padded + 1` when the model is traced with fake inputs one step longer. None when that trace
        fails (then every output of the padded length is cut)."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        def longer(v):
            if not isinstance(v, torch.Tensor) or v.dim() <= self.dim or v.shape[self.dim] != padded:
                return v
            shape = list(v.shape)
            shape[self.dim] += 1
            return torch.zeros(shape, dtype=v.dtype, device=v.device)

        try:
            with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
                out = self.model(*[longer(a) for a in args], **{k: longer(v) for k, v in kwargs.items()})
                probe, probe_spec = pytree.tree_flatten(out)
        except Exception as exc:  # noqa: BLE001 - data-dependent code and the like: fall back to shapes
            log.debug("bucketing: fake trace of the model failed (%s); cutting outputs by shape", exc)
            return None
        if probe_spec != spec:
            return None
        return {
            i
            for i, (leaf, fake) in enumerate(zip(leaves, probe, strict=True))
            if isinstance(leaf, torch.Tensor)
            and isinstance(fake, torch.Tensor)
            and fake.dim() > self.dim
            and fake.shape[self.dim] == padded + 1
        }


def _parameters(model: torch.nn.Module) -> tuple[list[str], bool]:
    """The names of `model.forward`'s positional parameters, and whether it takes an `attention_mask`."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return [], False
    positional = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        positional.append(p.name)
    return positional, any(p.name == "attention_mask" for p in params)


def compile(
    model: torch.nn.Module,
    *,
    buckets: Sequence[int] | None = None,
    dim: int = 1,
    pad_values: dict | None = None,
    **compile_kwargs,
):  # noqa: A001 - mirrors torch.compile
    """`torch.compile(model, backend="tpu")`, optionally with sequence-length bucketing."""
    compiled = torch.compile(model, backend="tpu", dynamic=False, **compile_kwargs)
    if not buckets:
        return compiled
    return BucketedModule(model, compiled, buckets, dim, pad_values or {})

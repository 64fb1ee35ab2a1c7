"""`hf_tpu.compile(model, buckets=...)`: pad variable sequence lengths to a few sizes so a compiled
model sees a handful of shapes instead of recompiling for every new length."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch


class BucketedModule(torch.nn.Module):
    """Calls `compiled` with tensor inputs padded along `dim` to the next bucket; slices outputs back.

    Padding values default to 0 (ids: use `pad_values={"input_ids": pad_token_id}`); a padded attention
    mask must be 0 in the padding, which the default gives. Outputs whose `dim` equals the padded length
    are cut back to the true length.
    """

    def __init__(
        self, model: torch.nn.Module, compiled, buckets: Sequence[int], dim: int, pad_values: dict
    ) -> None:
        super().__init__()
        self.model = model
        self._compiled = compiled
        self.buckets = sorted(int(b) for b in buckets)
        self.dim = dim
        self.pad_values = dict(pad_values)

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

        def pad(name, v):
            if (
                not isinstance(v, torch.Tensor)
                or v.dim() <= self.dim
                or v.shape[self.dim] != length
                or target == length
            ):
                return v
            widths = [0, 0] * (v.dim() - self.dim - 1) + [0, target - length]
            return torch.nn.functional.pad(v, widths, value=self.pad_values.get(name, 0))

        args = [pad(None, a) for a in args]
        kwargs = {k: pad(k, v) for k, v in kwargs.items()}
        out = self._compiled(*args, **kwargs)
        return _cut(out, self.dim, target, length)


def _cut(out, dim, padded, length):
    if padded == length:
        return out
    if isinstance(out, torch.Tensor):
        return out.narrow(dim, 0, length) if out.dim() > dim and out.shape[dim] == padded else out
    if isinstance(out, dict):  # ModelOutput is a dict subclass
        for k in list(out.keys()):
            out[k] = _cut(out[k], dim, padded, length)
        return out
    if isinstance(out, list | tuple):
        return type(out)(_cut(o, dim, padded, length) for o in out)
    return out


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

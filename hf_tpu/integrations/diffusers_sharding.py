"""diffusers models loaded onto several chips: `ModelMixin.from_pretrained(..., device_map="tpu")` places each
weight as its shards while it loads, by the same policies as transformers' loads (`sharding.py`).

diffusers reads a checkpoint file into a (mmap'd) CPU state dict, then `load_model_dict_into_meta` sets each
tensor into the meta-initialized model through accelerate's `set_module_tensor_to_device`. During a sharded
load, that state dict is read lazily: each tensor headed for tpu is narrowed on the host to the load's dtype
and copied straight into its parts on the chips (no chip holds the whole of a split weight), then set as
diffusers would set it. `tp` is the default policy for a model with a `_tp_plan` (Flux, Flux2, QwenImage:
diffusers' colwise/rowwise/Packed*Parallel styles map onto PartitionSpecs like transformers'), `fsdp` for
the rest (UNets, VAEs, most DiTs); `HF_TPU_SHARDING` / `hf_tpu.sharding_policy` choose another. After the
load, what the checkpoint did not hold (non-persistent buffers, missing keys) is placed by the same policy.

`DiffusionPipeline.from_pretrained(..., device_map="tpu")` loads each diffusers component through this path
(transformers components through `transformers_sharding.py`). `from_pretrained(..., parallel_config=...)`
without a torch.distributed process group means the same single-controller placement (`diffusers_parallel.py`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from types import ModuleType

import torch

from hf_tpu.integrations import sharding as policies
from hf_tpu.integrations.patching import patch

_local = threading.local()


class DiffusersShardedLoad:
    """One diffusers `from_pretrained` that places weights over the chips by `policy` (None: the default)."""

    def __init__(self, policy: str | None) -> None:
        self.policy = policy
        self.placement: policies.Placement | None = None

    def begin(self, model: torch.nn.Module, device_map: dict | None) -> None:
        """The model is built on meta: decide the placement and refuse a model the chips cannot hold."""
        from hf_tpu.integrations.transformers_sharding import check_fits

        self.placement = policies.Placement(model, self.policy)
        shapes = {
            name: (tuple(t.shape), t.dtype.itemsize)
            for name, t in model.state_dict().items()
            if _to_tpu(name, device_map)
        }
        check_fits(type(model).__name__, self.placement, shapes)


def active() -> DiffusersShardedLoad | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def sharded_load(policy: str | None) -> Iterator[DiffusersShardedLoad]:
    stack = _local.__dict__.setdefault("stack", [])
    load = DiffusersShardedLoad(policy)
    stack.append(load)
    try:
        yield load
    finally:
        stack.pop()


def _to_tpu(name: str, device_map: dict | None) -> bool:
    from diffusers.models.model_loading_utils import _determine_param_device

    from hf_tpu.integrations.accelerate import tpu_index

    if not device_map:
        return False
    try:
        return tpu_index(_determine_param_device(name, device_map)) is not None
    except (ValueError, KeyError):
        return False


class _PlacingStateDict(dict):
    """A state dict whose `items()` yields each tpu-bound tensor already placed as its shards (one at a time)."""

    def __init__(self, state_dict, load, model, device_map, dtype, keep_in_fp32_modules) -> None:
        super().__init__(state_dict)
        self._load = load
        self._shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        self._device_map = device_map
        self._dtype = dtype
        self._fp32 = keep_in_fp32_modules or ()

    def _target_dtype(self, name: str, tensor: torch.Tensor) -> torch.dtype | None:
        if self._dtype is None or not torch.is_floating_point(tensor):
            return None
        if any(module in name.split(".") for module in self._fp32):
            return torch.float32
        return self._dtype

    def items(self):
        for name, tensor in super().items():
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.device.type == "cpu"
                and self._shapes.get(name) == tuple(tensor.shape)
                and _to_tpu(name, self._device_map)
            ):
                dtype = self._target_dtype(name, tensor)
                if dtype is not None and tensor.dtype != dtype:
                    tensor = tensor.to(dtype)  # on the host, before the copy: the chips get the final bytes
                tensor = policies.place_tensor(
                    tensor, self._load.placement.spec_for(name, tuple(tensor.shape))
                )
            yield name, tensor


def _wrap_load_model_dict_into_meta(original):
    @functools.wraps(original)
    def load_model_dict_into_meta(model, state_dict, *args, **kwargs):
        load = active()
        device_map = kwargs.get("device_map")
        # `_load_shard_file` passes everything by keyword; other callers (IP-adapter loaders) are left alone
        if load is None or args or kwargs.get("hf_quantizer") is not None or not device_map:
            return original(model, state_dict, *args, **kwargs)
        if load.placement is None:
            load.begin(model, device_map)
        placing = _PlacingStateDict(
            state_dict, load, model, device_map, kwargs.get("dtype"), kwargs.get("keep_in_fp32_modules")
        )
        return original(model, placing, *args, **kwargs)

    return load_model_dict_into_meta


def patch_model_loading_utils(module: ModuleType) -> None:
    """diffusers.models.model_loading_utils: `_load_shard_file` sets weights through `load_model_dict_into_meta`."""
    if hasattr(module, "load_model_dict_into_meta") and hasattr(module, "_determine_param_device"):
        patch(module, "load_model_dict_into_meta", _wrap_load_model_dict_into_meta)


def _targets_tpu(device_map) -> bool:
    from hf_tpu.integrations.accelerate import tpu_index, tpu_is_accelerator

    if device_map is None:
        return False
    if isinstance(device_map, str) and device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        return tpu_is_accelerator()
    if isinstance(device_map, dict):
        return any(tpu_index(v) is not None for v in device_map.values())
    return tpu_index(device_map) is not None


def _wrap_from_pretrained(original):
    @functools.wraps(original)
    def from_pretrained(klass, *args, **kwargs):
        from hf_tpu.integrations import diffusers_parallel
        from hf_tpu.runtime.buffers import placement

        policy, after = diffusers_parallel.single_controller_parallel_config(kwargs)
        if not _targets_tpu(kwargs.get("device_map")) or not placement.several_chips():
            model = original(klass, *args, **kwargs)
        else:
            with sharded_load(policy or policies.requested_policy()) as load:
                model = original(klass, *args, **kwargs)
            policies.shard_module(model, load.policy)  # buffers and keys the checkpoint did not hold
        if after is not None:
            after(model)
        return model

    return from_pretrained


def patch_modeling_utils(module: ModuleType) -> None:
    """diffusers.models.modeling_utils: `ModelMixin.from_pretrained` on several chips loads sharded."""
    model_mixin = getattr(module, "ModelMixin", None)
    if model_mixin is not None and isinstance(vars(model_mixin).get("from_pretrained"), classmethod):
        patch(model_mixin, "from_pretrained", _wrap_from_pretrained)

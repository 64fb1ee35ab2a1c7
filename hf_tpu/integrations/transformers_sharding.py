"""`from_pretrained(..., device_map="tpu")` on several chips: each weight is placed as its shards while it loads.

transformers reads every checkpoint tensor from the safetensors mmap in a thread pool and copies it to its
device (`spawn_materialize`), hands it to its key's weight transform (`add_tensor`), then sets it into
the module (`set_param_for_module`). With more than one chip, the copy is held back until `add_tensor`
names the parameter; the worker then reads the tensor and copies it straight into its shards on the
chips (no chip, and no step of the load, holds the whole of a sharded weight; the host holds one tensor
at a time per worker). Tensors that a conversion merges or splits first (fused MoE experts, packed
projections) are converted on the host and placed when they are set. Before any weight is read, the
largest chip's share of the placed model is compared with what that chip has free: a model that does
not fit raises `torch.OutOfMemoryError` with the per-chip figures. After the load, every parameter and
buffer the plan did not reach (missing keys, non-persistent buffers) is placed too.

Which weight goes where is `hf_tpu.integrations.sharding` (policies `tp`, `fsdp`, `replicate`).
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
_ORIGINALS: dict[str, object] = {}


class ShardedLoad:
    """One `from_pretrained` call that places weights over the chips."""

    def __init__(self, policy: str | None, plan: dict | None) -> None:
        self.policy = policy
        self.plan = plan
        self.placement: policies.Placement | None = None
        self.device_map = None
        self.meta_shapes: dict[str, tuple] = {}

    def begin(self, model, device_map) -> None:
        """The model is built (on meta) and its device map known: decide every placement, check memory."""
        self.placement = policies.Placement(model, self.policy, self.plan)
        self.device_map = device_map
        shapes = {}
        for name, tensor in model.state_dict().items():
            if self.on_tpu(name):
                shapes[name] = (tuple(tensor.shape), tensor.dtype.itemsize)
                self.meta_shapes[name] = tuple(tensor.shape)
        check_fits(type(model).__name__, self.placement, shapes)

    def on_tpu(self, name: str) -> bool:
        from hf_tpu.integrations.accelerate import tpu_index

        device_map = self.device_map
        if not device_map:
            return True
        if "" in device_map and len(device_map) == 1:
            return tpu_index(device_map[""]) is not None
        from transformers.integrations.accelerate import get_device

        try:
            return tpu_index(get_device(device_map, name)) is not None
        except (KeyError, ValueError):
            return False

    def spec_for(self, name: str, shape: tuple) -> tuple:
        return self.placement.spec_for(name, shape)

    def finish(self, model) -> None:
        """Place what the load did not (missing keys re-initialized on one chip, non-persistent buffers)."""
        if self.placement is None:
            return
        from hf_tpu.runtime.tensors.sharding import placed_on_mesh, sharding

        seen: set[int] = set()
        named = list(model.named_parameters(remove_duplicate=False)) + list(
            model.named_buffers(remove_duplicate=False)
        )
        for name, tensor in named:
            if tensor is None or tensor.device.type != "tpu" or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            spec = self.spec_for(name, tuple(tensor.shape))
            if placed_on_mesh(tensor) and sharding(tensor) == spec:
                continue
            placed = policies.place_tensor(tensor, spec)
            if placed is not tensor:  # a view: the module gets the placed tensor
                _set_tensor(model, name, placed)
        if self.placement.replicated_names:
            from transformers.utils import logging

            names = self.placement.replicated_names
            logging.get_logger("transformers.hf_tpu").info(
                f"hf_tpu: {len(names)} weight(s) of {type(model).__name__} are replicated on every chip because no "
                f"dim divides over the mesh: {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}"
            )


def _set_tensor(model, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    if attr in module._parameters:
        module._parameters[attr] = torch.nn.Parameter(
            value, requires_grad=module._parameters[attr].requires_grad
        )
    else:
        module._buffers[attr] = value


def check_fits(what: str, placement: policies.Placement, shapes: dict) -> None:
    """Refuse a model whose placed weights exceed what the fullest chip has free (before reading any)."""
    from hf_tpu.runtime.buffers import memory

    need = placement.chip_bytes(shapes)
    free = memory.chip_limit() - max(memory.allocated_per_chip())
    if need <= free:
        return
    chips = len(memory.platform.devices())
    raise torch.OutOfMemoryError(
        f"tpu out of memory. {what} needs {memory._human(need)} on the fullest chip with sharding policy "
        f"{placement.policy!r} over {chips} chip(s), which has {memory._human(max(free, 0))} free (each chip holds "
        f"{memory._human(memory.chip_limit())}). Nothing was loaded. Use a smaller dtype, the 'fsdp' policy "
        "(hf_tpu.sharding_policy), more chips, or device_map='auto' with max_memory to offload part to cpu."
    )


def active() -> ShardedLoad | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def sharded_load(policy: str | None, plan: dict | None) -> Iterator[ShardedLoad]:
    """Within the block, transformers' loads place weights by `policy` (see the module docstring)."""
    stack = _local.__dict__.setdefault("stack", [])
    load = ShardedLoad(policy, plan)
    stack.append(load)
    try:
        yield load
    finally:
        stack.pop()


# -- the patches (applied to transformers.core_model_loading by hf_tpu.integrations' HOOKS) ---------------
class PendingPlacement:
    """A checkpoint tensor whose copy to tpu waits until its parameter is known (`add_tensor`)."""

    __slots__ = ("pool", "tensor", "dtype")

    def __init__(self, pool, tensor, dtype) -> None:
        self.pool = pool
        self.tensor = tensor
        self.dtype = dtype

    def shape(self) -> tuple:
        get_shape = getattr(self.tensor, "get_shape", None)
        return tuple(get_shape() if get_shape is not None else self.tensor.shape)

    def submit(self, spec: tuple | None):
        """Start the copy: into shards laid out by `spec`, or (None) to the host for a conversion."""
        job = functools.partial(materialize, self.tensor, self.dtype, spec)
        return self.pool.submit(job) if self.pool is not None else job


def materialize(tensor, dtype: torch.dtype | None, spec: tuple | None) -> torch.Tensor:
    """Read one checkpoint tensor and place it: a tpu tensor laid out by `spec`, or (None) a CPU tensor."""
    host = tensor[...]  # reads the mmap'd bytes
    if spec is None:
        return host.to(dtype) if dtype is not None and host.dtype != dtype else host
    if dtype is not None and host.dtype != dtype and dtype.itemsize < host.dtype.itemsize:
        host = host.to(dtype)  # narrower on the host: fewer bytes to copy
    placed = policies.place_tensor(host, spec)
    del host
    if dtype is not None and placed.dtype != dtype:
        placed = placed.to(dtype)  # on the chips, shard by shard
    return placed


def _wrap_spawn_materialize(original):
    @functools.wraps(original)
    def spawn_materialize(thread_pool, tensor, device=None, dtype=None, sharding_op=None, tensor_idx=None):
        if active() is not None and sharding_op is None and _is_tpu(device):
            return PendingPlacement(thread_pool, tensor, dtype)
        return original(thread_pool, tensor, device, dtype, sharding_op=sharding_op, tensor_idx=tensor_idx)

    return spawn_materialize


def _is_tpu(device) -> bool:
    from hf_tpu.integrations.accelerate import tpu_index

    return device is not None and tpu_index(device) is not None


def _wrap_add_tensor(renaming_cls):
    def make(original):
        @functools.wraps(original)
        def add_tensor(self, target_key, source_key, source_pattern, future):
            if type(future) is PendingPlacement:
                load = active()
                plain = (
                    isinstance(self, renaming_cls) and getattr(self, "quantization_operation", None) is None
                )
                spec = load.spec_for(target_key, future.shape()) if plain and load is not None else None
                future = future.submit(spec)
            return original(self, target_key, source_key, source_pattern, future)

        return add_tensor

    return make


def _wrap_set_param_for_module(original):
    @functools.wraps(original)
    def set_param_for_module(model, target_name, param_value, *args, **kwargs):
        load = active()
        if (
            load is not None
            and load.placement is not None
            and isinstance(param_value, torch.Tensor)
            and param_value.device.type in ("cpu", "tpu")
            and load.on_tpu(target_name)
            and tuple(param_value.shape) == load.meta_shapes.get(target_name, tuple(param_value.shape))
        ):
            from hf_tpu.runtime.tensors.sharding import placed_on_mesh, sharding

            spec = load.spec_for(target_name, tuple(param_value.shape))
            if (
                param_value.device.type == "cpu"
                or not placed_on_mesh(param_value)
                or sharding(param_value) != spec
            ):
                param_value = policies.place_tensor(param_value.detach(), spec)
        return original(model, target_name, param_value, *args, **kwargs)

    return set_param_for_module


def _wrap_convert_and_load(original):
    @functools.wraps(original)
    def convert_and_load_state_dict_in_model(model, state_dict, load_config, *args, **kwargs):
        load = active()
        if load is not None:
            load.begin(model, getattr(load_config, "device_map", None))
        return original(model, state_dict, load_config, *args, **kwargs)

    return convert_and_load_state_dict_in_model


def patch_core_model_loading(module: ModuleType) -> None:
    """transformers.core_model_loading: place each weight as its shards while it loads (see above)."""
    needed = (
        "spawn_materialize",
        "set_param_for_module",
        "convert_and_load_state_dict_in_model",
        "WeightTransform",
    )
    if not all(hasattr(module, n) for n in needed):
        return  # upstream changed its loader: loads stay unsharded (placed after loading)
    patch(module, "spawn_materialize", _wrap_spawn_materialize)
    patch(module, "set_param_for_module", _wrap_set_param_for_module)
    # modeling_utils and modeling_layers import the loader by name
    patch(
        module,
        "convert_and_load_state_dict_in_model",
        _wrap_convert_and_load,
        rebind=("convert_and_load_state_dict_in_model",),
    )
    if "add_tensor" in vars(module.WeightTransform):
        patch(module.WeightTransform, "add_tensor", _wrap_add_tensor(module.WeightRenaming))


def skip_allocator_warmup(module: ModuleType) -> None:
    """transformers.modeling_utils' caching allocator warm-up (one `empty` the size of the whole model per
    device) is skipped for a sharded load: tpu's `empty` allocates nothing, and a model spread over the
    chips fits no single one of them (the load's own check, `check_fits`, compares each chip's share with
    what it has free)."""
    if not hasattr(module, "caching_allocator_warmup"):
        return

    def make(warmup):
        @functools.wraps(warmup)
        def caching_allocator_warmup(*args, **kwargs):
            if active() is not None:
                return None
            return warmup(*args, **kwargs)

        return caching_allocator_warmup

    patch(module, "caching_allocator_warmup", make)


# -- the KV cache of a sharded model ---------------------------------------------------------------------
def shard_static_layer(original):
    """StaticLayer.lazy_initialization, then the KV buffers split by heads like the keys that fill them."""

    @functools.wraps(original)
    def lazy_initialization(self, key_states, value_states, *args, **kwargs):
        result = original(self, key_states, value_states, *args, **kwargs)
        keys = getattr(self, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.device.type == "tpu" and key_states.dim() == 4:
            _shard_kv_by_heads(self, key_states)
        return result

    return lazy_initialization


def _shard_kv_by_heads(layer, key_states: torch.Tensor) -> None:
    from hf_tpu.runtime.buffers import placement
    from hf_tpu.runtime.tensors.sharding import placed_on_mesh, shard

    if not placement.MULTI_CHIP[0] or not placed_on_mesh(key_states):
        return  # an unsharded model keeps an unsharded cache
    mesh = placement.mesh()
    axis = policies._axis(mesh)
    ways = dict(mesh.shape)[axis]
    for attr in ("keys", "values"):
        buffer = getattr(layer, attr, None)
        if isinstance(buffer, torch.Tensor) and buffer.dim() == 4:
            spec = (None, axis, None, None) if buffer.shape[1] % ways == 0 else ()
            shard(buffer, spec)  # in place: the static address the compiled step donates stays the same

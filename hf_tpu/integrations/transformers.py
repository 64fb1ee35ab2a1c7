"""transformers on tpu: device_map checks, chip memory for "auto", dtype checks, compiled decode, Trainer, tests.

What transformers already does right for `tpu` (5.2x): `device_map="tpu" | "tpu:0" | 0 | torch.device`
become `{"": tpu}`, the model is built on meta, safetensors are mmap'd on CPU and each tensor is copied
(and cast) to tpu; generate auto-compiles the decode step with `CompileConfig(backend="tpu")` for a
compileable cache; `TrainingArguments.device` is `tpu:0`; testing_utils fills its backend tables from
`torch.tpu`. What this module adds:

- `device_map` naming `tpu:N` with N > 0 (or `max_memory` keyed by it) fails up front: there is one
  logical device spanning every chip.
- `"auto" | "balanced" | "balanced_low_0" | "sequential"` see the chip memory (see `accelerate.py`); when
  that strategy cannot put anything on tpu the load stops with an error that names `max_memory`,
  instead of silently running on CPU. Partial offload to cpu/disk (accelerate's documented behaviour when
  `max_memory` budgets them) is kept and logged.
- a dtype the platform cannot hold (float64 on TPU, formats XLA lacks) fails before any weight is read.
- the compiled decode step degrades to eager with a one-time warning if the compile path fails, and a
  user's `CompileConfig` naming inductor (its default backend, which has no tpu code generator) compiles
  with the `tpu` backend.
- offloaded KV caches (`cache_implementation="offloaded" | "offloaded_static"`) skip upstream's CUDA-only
  stream handshake on tpu.
- the decode loop does not stall the host every token: transformers' `DeferredStopCheck` (upstream: mps
  only) reads the stop flag one step late through async copies to host, and around a compiled step the
  loop's own eager ops run deferred and fused, so step N+1 is queued while step N runs.
- continuous batching (`generate_batch`) sizes its paged KV cache from tpu memory, not the host's.
- `Trainer` (with accelerate's `PartialState` now picking tpu, see `accelerate.py`): `dataloader_pin_memory`
  is turned off on tpu (there is nothing to pin, see torch_tensor.py: no pinning thread is needed), as
  transformers does for `use_cpu`; the default `adamw_torch_fused` runs the runtime's `_fused_adamw_`
  (it becomes `adamw_torch` only on a runtime without that kernel). Checkpoints (`save_steps`) also hold
  the tpu generator's state under "tpu" and `resume_from_checkpoint` restores it (transformers saves only
  the cuda/npu/hpu/... ones), so a resumed run with dropout draws the masks an uninterrupted one would.
- testing_utils' memory tables point at `torch.tpu`, and its device count is 1 (tests address devices by
  index; every chip is behind `tpu:0`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
import threading
from types import ModuleType

import torch

from hf_tpu.integrations import accelerate as _acc
from hf_tpu.integrations.accelerate import logical_device_error, tpu_index, tpu_is_accelerator
from hf_tpu.integrations.patching import has_params, patch

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _logger():
    from transformers.utils import logging

    return logging.get_logger("transformers.hf_tpu")


# -- device_map -------------------------------------------------------------------------------------------
def check_tpu_device_map(device_map) -> None:
    """Refuse `tpu:N` (N > 0) anywhere in a device_map, before transformers builds anything."""
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    for value in values:
        index = tpu_index(value)
        if index is not None and index != 0:
            raise logical_device_error(f"device_map={device_map!r}", index)


def targets_tpu(device_map) -> bool:
    """Does this (user-given) device_map put any weight on tpu?"""
    if device_map is None:
        device = torch.tensor([]).device  # what a `with torch.device(...)` / set_default_device gives
        return device.type == "tpu"
    if isinstance(device_map, str) and device_map in STRATEGIES:
        return tpu_is_accelerator()
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    return any(tpu_index(v) is not None for v in values)


def _wrap_check_and_set_device_map(original):
    @functools.wraps(original)
    def check_and_set_device_map(device_map):
        check_tpu_device_map(device_map)
        result = original(device_map)
        if isinstance(result, dict):  # the context-manager / default-device form is only known now
            check_tpu_device_map(result)
        return result

    return check_and_set_device_map


def _wrap_get_device_map(original):
    @functools.wraps(original)
    def _get_device_map(model, device_map, max_memory, hf_quantizer):
        strategy = device_map if isinstance(device_map, str) else None
        result = original(model, device_map, max_memory, hf_quantizer)
        if strategy is not None and tpu_is_accelerator():
            _acc.check_strategy_result(model, strategy, result, max_memory, _logger().warning)
        return result

    return _get_device_map


# -- dtype --------------------------------------------------------------------------------------------------
def check_tpu_dtype(dtype) -> None:
    """A dtype the tpu cannot hold on this platform: fail now, naming the fix, not halfway through a load."""
    from hf_tpu.runtime.buffers import dtypes, platform

    if isinstance(dtype, dict):
        for value in dtype.values():
            check_tpu_dtype(value)
        return
    if isinstance(dtype, str):
        if dtype == "auto":
            return
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype):
        return
    try:
        dtypes.to_jax_dtype(dtype)
        if dtype in (torch.float64, torch.complex128) and not platform.supports_float64():
            raise dtypes.UnsupportedDtypeError(f"{dtype} has no XLA:TPU support (no 64-bit floating point).")
    except dtypes.UnsupportedDtypeError as exc:
        raise dtypes.UnsupportedDtypeError(
            f"from_pretrained(..., dtype={dtype}) cannot load onto the tpu device: {exc} "
            "Pass dtype=torch.bfloat16 or torch.float32, or device_map='cpu' to stay on CPU."
        ) from None


def _wrap_from_pretrained(original):
    @functools.wraps(original)
    def from_pretrained(klass, *args, **kwargs):
        plan = _single_controller_tp_plan(kwargs)
        device_map = kwargs.get("device_map")
        check_tpu_device_map(device_map)
        if not targets_tpu(device_map):
            return original(klass, *args, **kwargs)
        check_tpu_dtype(kwargs.get("dtype", kwargs.get("torch_dtype")))
        try:
            from hf_tpu.runtime.buffers import placement

            if not placement.several_chips():
                return original(klass, *args, **kwargs)
            from hf_tpu.integrations import sharding, transformers_sharding

            policy = "tp" if plan is not None else sharding.requested_policy()
            with transformers_sharding.sharded_load(policy, plan if isinstance(plan, dict) else None) as load:
                model = original(klass, *args, **kwargs)
                load.finish(model)
            return model
        except Exception as exc:
            if type(exc).__name__ == "SafetensorError":  # safetensors says what broke, not which checkpoint
                where = args[0] if args else kwargs.get("pretrained_model_name_or_path")
                exc.add_note(
                    f"hf_tpu: a safetensors file of {where!r} is corrupt or truncated; nothing was kept on "
                    "tpu. Re-save or re-download the checkpoint."
                )
            raise

    return from_pretrained


def _global_mesh() -> bool:
    """HF_TPU_MESH=global: one program over every process's chips, so a tp plan is a placement on that mesh
    (not transformers' DTensor tensor parallelism over the process group)."""
    from hf_tpu.runtime.buffers import global_mesh

    return global_mesh.enabled()


def _single_controller_tp_plan(kwargs: dict):
    """`tp_plan="auto"` (or a plan dict) without a torch.distributed process group, or with one under
    HF_TPU_MESH=global: one program drives every chip, so the plan becomes hf_tpu's `tp` placement over the
    mesh (no DTensor, no process group needed).
    Returns the plan ("auto" or the dict), or None when the call leaves tensor parallelism to transformers."""
    plan = kwargs.get("tp_plan")
    if plan is None:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not _global_mesh():
        return None  # torchrun: transformers' own DTensor tensor parallelism
    if kwargs.get("device_map") not in (None, "tpu", "tpu:0", 0, "auto") and not targets_tpu(
        kwargs.get("device_map")
    ):
        return None
    if not tpu_is_accelerator():
        return None
    kwargs.pop("tp_plan")
    kwargs.pop("tp_size", None)
    if kwargs.get("device_map") in (None, "auto"):
        kwargs["device_map"] = "tpu"
    return plan


# -- compiled decode ------------------------------------------------------------------------------------------
_compile_notice = threading.Event()


class _EagerFallback:
    """The compiled forward generate uses for tpu; if compiling or running it fails, eager from then on."""

    def __init__(self, model, compiled) -> None:
        self._model = model
        self._compiled = compiled

    def __call__(self, *args, **kwargs):
        model = self._model
        if not getattr(model, "_hf_tpu_eager_decode", False):
            try:
                return self._compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - any compile-path failure: eager gives the same result
                fall_back_to_eager(model, exc)
        return model.__call__(*args, **kwargs)


def fall_back_to_eager(model, exc: BaseException) -> None:
    model._hf_tpu_eager_decode = True
    if not _compile_notice.is_set():
        _compile_notice.set()
        _logger().warning(
            f"hf_tpu: the compiled decode step (torch.compile backend='tpu') failed for {type(model).__name__} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); generating in eager mode "
            "instead. Pass generation_config.disable_compile=True to skip the attempt. (shown once)"
        )


def tpu_compile_config(compile_config):
    """A user's `CompileConfig` for a tpu model, with the `tpu` backend where it names inductor.

    `CompileConfig()`'s backend defaults to "inductor" (transformers picks "tpu" only when no config is
    given), and inductor has no tpu code generator: `generate(..., compile_config=CompileConfig(
    fullgraph=True))` failed to compile and decoded eagerly. Its other fields (fullgraph, dynamic, mode,
    options) are kept: the tpu backend accepts the mode and options transformers passes."""
    if compile_config is None or compile_config.backend != "inductor":
        return compile_config
    routed = copy.copy(compile_config)  # keeps an instance-level `_compile_all_devices`, unlike replace()
    routed.backend = "tpu"
    return routed


def _wrap_get_compiled_call(original):
    @functools.wraps(original)
    def get_compiled_call(self, compile_config):
        if self.device.type != "tpu":
            return original(self, compile_config)
        if getattr(self, "_hf_tpu_eager_decode", False):
            return self.__call__
        compile_config = tpu_compile_config(compile_config)
        try:
            compiled = original(self, compile_config)
        except Exception as exc:  # noqa: BLE001 - e.g. the backend is not registered
            fall_back_to_eager(self, exc)
            return self.__call__
        wrapper = getattr(self, "_hf_tpu_compiled_wrapper", None)
        if wrapper is None or wrapper._compiled is not compiled:
            wrapper = _EagerFallback(self, compiled)
            self._hf_tpu_compiled_wrapper = wrapper
        self._hf_tpu_compiled_step = (
            True  # this generate call decodes with it (_wrap_optimize_model_for_decode)
        )
        return wrapper

    return get_compiled_call


# -- decode loop without a host stall per token ---------------------------------------------------------------
def _deferred_stop_check_for_tpu(original: type) -> type:
    """transformers' `DeferredStopCheck` (read the stop flag one step late, so the host queues step N+1
    while the device runs step N) for tpu too; upstream enables it only for mps.

    Its stop-flag and token slots become async copy targets (pinned, in CUDA's terms: host_copies.py)
    and its events `torch.tpu.Event`s, since `torch.Event` cannot synchronize a Python-defined backend.
    The last, extra step is undone by upstream's own `finish()`, so tokens are the same as CPU's.
    """

    class DeferredStopCheck(original):
        @staticmethod
        def is_supported(device, cache, cache_is_returned: bool, is_assistant: bool) -> bool:
            # upstream's own cache/assistant conditions, with tpu admitted like mps
            if torch.device(device).type == "tpu":
                device = torch.device("mps")
            return original.is_supported(device, cache, cache_is_returned, is_assistant)

        def __init__(self, input_ids, *args, **kwargs) -> None:
            super().__init__(input_ids, *args, **kwargs)
            self.cache = _croppable_part(self.cache)
            if input_ids.device.type == "tpu":
                from hf_tpu.runtime.buffers.host_copies import mark_async_target

                self.slots = type(self.slots)(
                    (mark_async_target(flag), mark_async_target(tokens), torch.tpu.Event(blocking=True))
                    for flag, tokens, _ in self.slots
                )

    DeferredStopCheck.__qualname__ = original.__qualname__
    DeferredStopCheck.__module__ = original.__module__
    return DeferredStopCheck


def _croppable_part(cache):
    """The cache the deferred stop check rolls back. An encoder-decoder cache over static caches says it is
    croppable (its self-attention StaticCache is) but its own `crop` accepts only dynamic caches; what it
    would crop is the self-attention cache alone (the cross-attention one never grows), so crop that."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    if isinstance(cache, EncoderDecoderCache) and not isinstance(cache.self_attention_cache, DynamicCache):
        return cache.self_attention_cache
    return cache


def _wrap_generate(original):
    """Forget the previous call's compiled-step note (a beam search compiles without a decode loop)."""

    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        self.__dict__.pop("_hf_tpu_compiled_step", None)
        return original(self, *args, **kwargs)

    return generate


def _wrap_optimize_model_for_decode(original):
    """The decode loop around a compiled step runs its eager ops deferred and fused (DeferAndFuse).

    Between two compiled steps transformers runs ~50 small eager ops (logits slice and cast, logits
    processors, argmax, `cat`, stopping criteria, cache positions). Op by op they are ~50 device
    executions per token; XLA's CPU client keeps at most 32 executions in flight, so the host stalls
    on the running step every token even with the stop check deferred. Recorded, they are two fused
    executions per token, and the host queues step N+1 while step N runs. Only in Strict mode (Debug
    keeps blocking op by op) and only when this generate call compiled the step: an eager forward
    under DeferAndFuse would be recorded whole, one new program per length.
    """

    @contextlib.contextmanager
    def _optimize_model_for_decode(self):
        with original(self):
            compiled = self.__dict__.pop("_hf_tpu_compiled_step", False)
            if compiled and not getattr(self, "_hf_tpu_eager_decode", False):
                with _deferred_decode_loop():
                    yield
            else:
                yield

    return _optimize_model_for_decode


@contextlib.contextmanager
def _deferred_decode_loop():
    """DeferAndFuse for the loop when the mode is Strict and this is the one Python thread using tpu
    tensors (the mode is process-wide: another thread's ops would be deferred too). A thread that starts
    using tpu tensors during the loop turns it back to Strict (hf_tpu.runtime.launch.modes)."""
    from hf_tpu.runtime.buffers.threads import one_device_thread
    from hf_tpu.runtime.launch import modes

    with modes.deferred_in_this_thread(one_device_thread()):
        yield


def patch_generation_utils(module: ModuleType) -> None:
    """transformers.generation.utils: on tpu the decode loop neither reads its stop flag nor runs its
    bookkeeping ops in lockstep with the device."""
    if hasattr(getattr(module, "DeferredStopCheck", None), "is_supported"):
        patch(module, "DeferredStopCheck", _deferred_stop_check_for_tpu)
    mixin = getattr(module, "GenerationMixin", None)
    if mixin is not None:
        if "generate" in vars(mixin):
            patch(mixin, "generate", _wrap_generate)
        if "_optimize_model_for_decode" in vars(mixin):
            patch(mixin, "_optimize_model_for_decode", _wrap_optimize_model_for_decode)


# -- offloaded KV caches -------------------------------------------------------------------------------------
def patch_cache_utils(module: ModuleType) -> None:
    """Offloaded caches on tpu (`_patch_offloaded_update`), and static KV buffers of a sharded model split by
    heads like the keys that fill them (`transformers_sharding.shard_static_layer`)."""
    from hf_tpu.integrations import transformers_sharding

    layer = getattr(module, "StaticLayer", None)
    if layer is not None and "lazy_initialization" in vars(layer):
        patch(layer, "lazy_initialization", transformers_sharding.shard_static_layer)
    _patch_offloaded_update(module)


def _patch_offloaded_update(module: ModuleType) -> None:
    """`cache_implementation="offloaded" | "offloaded_static"` on tpu: `Cache.update` orders its layer
    prefetch against `torch.cuda.default_stream(device)` (CUDA only: it failed with "Torch not compiled with
    CUDA enabled"). tpu's copies to and from the host are queued in program order, so a tpu cache prefetches
    the next layer and offloads this one without the stream handshake; the rest is upstream's update."""
    cls = getattr(module, "Cache", None)
    if cls is None or not (
        has_params(cls.__init__, ("layer_class_to_replicate", "offloading", "offload_only_non_sliding"))
        and has_params(getattr(cls, "prefetch", None), ("layer_idx", "only_non_sliding"))
        and has_params(getattr(cls, "offload", None), ("layer_idx", "only_non_sliding"))
        and has_params(getattr(cls, "update", None), ("key_states", "value_states", "layer_idx"))
    ):
        return  # upstream changed how it offloads: leave it alone (test_patch_targets says so)

    def make(original):
        @functools.wraps(original)
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if not (getattr(self, "offloading", False) and key_states.device.type == "tpu"):
                return original(self, key_states, value_states, layer_idx, *args, **kwargs)
            if self.layer_class_to_replicate is not None:
                while len(self.layers) <= layer_idx:
                    self.layers.append(self.layer_class_to_replicate())
            self.prefetch(layer_idx + 1, self.only_non_sliding)
            keys, values = self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)
            self.offload(layer_idx, self.only_non_sliding)
            return keys, values

        return update

    patch(cls, "update", make)


# -- continuous batching: size the paged KV cache from tpu memory ---------------------------------------------
_building_cache_for = threading.local()

# On host-backed memory (JAX's CPU platform) the "device" is the host's RAM, shared with everything else, and
# XLA zero-fills what it allocates (torch's CPU allocator commits pages lazily): continuous batching's default
# of ~90% of free device memory would take the machine's RAM. It gets this share of the free memory instead.
HOST_BACKED_CACHE_SHARE = 0.1


def tpu_memory_breakdown() -> tuple[torch.device, int, int, int]:
    """(device, total, reserved, allocated) bytes of the tpu, in continuous batching's terms."""
    from hf_tpu.runtime.buffers import memory

    free, total = torch.tpu.mem_get_info()
    if memory.host_backed():
        free = int(free * HOST_BACKED_CACHE_SHARE)
    used = total - free
    return torch.device("tpu"), total, used, used


def patch_continuous_batching_cache(module: ModuleType) -> None:
    """transformers' paged cache asks `get_device_and_memory_breakdown()` for free memory without naming a
    device; it answers for cuda/xpu/mps and else for the host. A cache being built for tpu gets the tpu's
    numbers (else the host's RAM would size a tpu cache: on the CPU platform ~90% of it, zero-filled)."""
    cache_cls = getattr(module, "PagedAttentionCache", None)
    if cache_cls is None or not hasattr(module, "get_device_and_memory_breakdown"):
        return

    def make_breakdown(original_breakdown):
        @functools.wraps(original_breakdown)
        def get_device_and_memory_breakdown(*args, **kwargs):
            if getattr(_building_cache_for, "tpu", False):
                return tpu_memory_breakdown()
            return original_breakdown(*args, **kwargs)

        return get_device_and_memory_breakdown

    def make_init(original_init):
        signature = inspect.signature(original_init)

        @functools.wraps(original_init)
        def __init__(self, *args, **kwargs):
            device = signature.bind_partial(self, *args, **kwargs).arguments.get("device")
            previous = getattr(_building_cache_for, "tpu", False)
            _building_cache_for.tpu = device is not None and torch.device(device).type == "tpu"
            try:
                original_init(self, *args, **kwargs)
            finally:
                _building_cache_for.tpu = previous

        return __init__

    patch(module, "get_device_and_memory_breakdown", make_breakdown)
    patch(cache_cls, "__init__", make_init)


# -- patches (applied by hf_tpu.integrations' import hook) -----------------------------------------------------
def patch_integrations_accelerate(module: ModuleType) -> None:
    """transformers.integrations.accelerate: the device-map helpers (and modeling_utils' copies of them).
    Its own copy of accelerate's get_max_memory (`accelerate_max_memory`) is rebound by
    `accelerate.patch_modeling`."""
    patch(
        module,
        "check_and_set_device_map",
        _wrap_check_and_set_device_map,
        rebind=("check_and_set_device_map",),
    )
    patch(module, "_get_device_map", _wrap_get_device_map, rebind=("_get_device_map",))


def patch_modeling_utils(module: ModuleType) -> None:
    """transformers.modeling_utils: PreTrainedModel gets the tpu checks and the compiled-decode fallback."""
    cls = module.PreTrainedModel
    patch(cls, "from_pretrained", _wrap_from_pretrained)
    if "get_compiled_call" in vars(cls):
        patch(cls, "get_compiled_call", _wrap_get_compiled_call)


def patch_training_args(module: ModuleType) -> None:
    """TrainingArguments on tpu: no pinned host memory (DataLoader would ask the tpu for a pinned
    allocator), and `torch_compile=True` compiles with the `tpu` backend unless another is named."""
    cls = module.TrainingArguments
    if "__post_init__" in vars(cls):
        patch(cls, "__post_init__", _wrap_post_init)


def _wrap_post_init(original):
    @functools.wraps(original)
    def __post_init__(self, *args, **kwargs):
        backend_given = self.torch_compile_backend is not None
        original(self, *args, **kwargs)
        if self.use_cpu or not tpu_is_accelerator():
            return
        self.dataloader_pin_memory = False
        if self.torch_compile and not backend_given:
            # transformers defaults to inductor, which has no tpu code generator here
            self.torch_compile_backend = "tpu"
        if str(getattr(self.optim, "value", self.optim)) == "adamw_torch_fused" and not _has_lowering(
            "aten::_fused_adamw_"
        ):
            _logger().info(
                "hf_tpu: the tpu device has no fused AdamW kernel (aten::_fused_adamw_) yet; using "
                "optim='adamw_torch' (same math, one op per tensor)."
            )
            self.optim = type(self.optim)("adamw_torch") if hasattr(self.optim, "value") else "adamw_torch"

    return __post_init__


def _rng_state_file(trainer, directory: str) -> str:
    """Where `Trainer._save_rng_state`/`_load_rng_state` keep the generator states of this process."""
    name = "rng_state.pth" if trainer.args.world_size <= 1 else f"rng_state_{trainer.args.process_index}.pth"
    return os.path.join(directory, name)


def _load_rng_states(module: ModuleType, path: str) -> dict:
    safe = getattr(module, "safe_globals", contextlib.nullcontext)  # allowlists numpy's random state
    with safe():
        return torch.load(path, weights_only=True)


def patch_trainer(module: ModuleType) -> None:
    """transformers.trainer: checkpoints save and restore the tpu generator (key "tpu") next to the
    cpu/cuda/npu/... states Trainer keeps; without it a resumed run drew other dropout masks."""
    cls = module.Trainer
    if "_save_rng_state" not in vars(cls) or "_load_rng_state" not in vars(cls):
        return

    def make_save(save):
        @functools.wraps(save)
        def _save_rng_state(self, output_dir: str) -> None:
            state = torch.tpu.get_rng_state() if self.args.device.type == "tpu" else None
            save(self, output_dir)
            path = _rng_state_file(self, output_dir)
            if state is None or not os.path.isfile(path):
                return
            states = _load_rng_states(module, path)
            states["tpu"] = state
            torch.save(states, path)

        return _save_rng_state

    def make_load(load):
        @functools.wraps(load)
        def _load_rng_state(self, checkpoint: str | None) -> None:
            load(self, checkpoint)
            if checkpoint is None or self.args.device.type != "tpu":
                return
            path = _rng_state_file(self, checkpoint)
            if not os.path.isfile(path):
                return
            state = _load_rng_states(module, path).get("tpu")
            if state is not None:
                torch.tpu.set_rng_state(state)

        return _load_rng_state

    patch(cls, "_save_rng_state", make_save)
    patch(cls, "_load_rng_state", make_load)


def _has_lowering(op: str) -> bool:
    """Whether the tpu runtime registered a kernel for `op` (e.g. "aten::_fused_adamw_")."""
    from hf_tpu.runtime.device.registration import ensure_kernels

    ensure_kernels()
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")


def _one_logical_device() -> int:
    return 1


def patch_testing_utils(module: ModuleType) -> None:
    """TRANSFORMERS_TEST_DEVICE=tpu: fill the memory tables testing_utils leaves at their defaults for tpu."""
    if not tpu_is_accelerator():
        return
    tpu = torch.tpu
    # transformers' multi-device tests address devices by index (`f"{torch_device}:1"`, device_map over
    # 0..n-1); every chip sits behind the one index 0, so the count of addressable devices is 1.
    module.BACKEND_DEVICE_COUNT["tpu"] = _one_logical_device
    tables = {
        "BACKEND_MANUAL_SEED": tpu.manual_seed,
        "BACKEND_SYNCHRONIZE": torch.accelerator.synchronize,
        "BACKEND_EMPTY_CACHE": tpu.empty_cache,
        "BACKEND_TORCH_ACCELERATOR_MODULE": tpu,
        "BACKEND_MEMORY_ALLOCATED": tpu.memory_allocated,
        "BACKEND_MAX_MEMORY_ALLOCATED": tpu.max_memory_allocated,
        "BACKEND_RESET_PEAK_MEMORY_STATS": tpu.reset_peak_memory_stats,
        "BACKEND_RESET_MAX_MEMORY_ALLOCATED": tpu.reset_peak_memory_stats,
    }
    for name, fn in tables.items():
        table = getattr(module, name, None)
        if isinstance(table, dict):
            table.setdefault("tpu", fn)


def bind_block_mask(module: ModuleType) -> None:
    """A modeling module that imports flex attention's `BlockMask` only where flex attention is available
    (never on a tpu host) but reads the name in every forward gets the class bound (its masks are then
    never BlockMasks, as on any device without flex attention)."""
    if not hasattr(module, "BlockMask"):
        from torch.nn.attention.flex_attention import BlockMask

        module.BlockMask = BlockMask


def refresh_device_caches(module: ModuleType) -> None:
    """transformers.utils.import_utils: device facts cached once (lru_cache) see the registered `tpu` device,
    whatever the import order (DESIGN §3.1): a cache computed before registration is cleared."""
    for name in ("is_torch_tpu_available", "is_torch_flex_attn_available", "is_torch_accelerator_available"):
        fn = getattr(module, name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()

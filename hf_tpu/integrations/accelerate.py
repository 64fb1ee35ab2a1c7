"""accelerate on tpu: report chip memory to `get_max_memory`, make `PartialState` pick the tpu device, and
keep the tpu generator's state in `Accelerator.save_state`/`load_state` checkpoints.

accelerate lists accelerators by probing cuda/npu/xpu/... one by one and never asks
`torch.accelerator`, so without this `device_map="auto"` puts every weight on CPU and `Accelerator()`
(hence `Trainer`) runs on CPU. Index 0 in a `max_memory` dict means the one logical `tpu:0` device
(`torch.device(0)` is `tpu:0` while tpu is the current accelerator).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

from hf_tpu.integrations import patching
from hf_tpu.integrations.patching import patch

# max_memory keys accelerate understands besides accelerator indices, in its placement order
_HOST_KEYS = ("mps", "cpu", "disk")


def tpu_is_accelerator() -> bool:
    """True when `tpu` is torch's current accelerator (hf_tpu registered and no CUDA build in the way)."""
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu"


def logical_device_error(what: str, index: int) -> ValueError:
    """The error for any tpu index but 0: there is one logical device spanning every chip."""
    try:
        chips = torch.tpu.device_count()
    except Exception:  # noqa: BLE001 - the count is only decoration for the message
        chips = "all"
    return ValueError(
        f"{what} asks for tpu:{index}, but hf_tpu exposes all {chips} local chip(s) as one logical device, "
        "tpu:0 (a model is spread over chips by sharding, not by device index). Use device_map='tpu' "
        "(or 'tpu:0', 0, {'': 'tpu'}, 'auto'), and key max_memory by 0 or 'tpu'."
    )


def tpu_index(value) -> int | None:
    """The tpu index `value` (a device_map value or max_memory key) names, or None if it is not tpu."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if tpu_is_accelerator() else None
    if isinstance(value, str):
        if value in ("auto", "balanced", "balanced_low_0", "sequential", "disk", "cpu", "meta", "mps"):
            return None
        try:
            value = torch.device(value)
        except (RuntimeError, ValueError):
            return None
    if isinstance(value, torch.device) and value.type == "tpu":
        return value.index or 0
    return None


def _original_get_max_memory():
    """accelerate's own `get_max_memory` (importing accelerate.utils.modeling patches it)."""
    modeling = sys.modules.get("accelerate.utils.modeling")
    if modeling is None:
        import accelerate.utils.modeling as modeling  # noqa: F811 - patched by our import hook
    return patching.original(modeling, "get_max_memory")


def _to_bytes(value) -> int:
    if isinstance(value, str):
        from accelerate.utils import convert_file_size_to_int

        return convert_file_size_to_int(value)
    return int(value)


def _normalize(max_memory: dict) -> dict:
    """User max_memory -> accelerate's form: tpu keys ('tpu', 'tpu:0', device, 0) become 0, sizes ints.

    Like accelerate, sizes given as strings are converted in the caller's dict too: transformers compares
    the caller's values with ours afterwards.
    """
    out: dict = {}
    for key, value in list(max_memory.items()):
        if isinstance(value, str):
            max_memory[key] = value = _to_bytes(value)
        index = tpu_index(key)
        if index is not None:
            if index != 0:
                raise logical_device_error(f"max_memory key {key!r}", index)
            out[0] = _to_bytes(value)
        elif key in _HOST_KEYS:
            out[key] = _to_bytes(value)
        else:
            raise ValueError(
                f"max_memory key {key!r} is not a device here: use 0 or 'tpu' for the tpu, and 'cpu'/'disk' "
                "for offloading."
            )
    return {k: out[k] for k in [0, *_HOST_KEYS] if k in out}


def get_max_memory(max_memory: dict | None = None) -> dict:
    """accelerate's `get_max_memory`, plus the tpu: free device bytes under key 0 (first, so it fills first)."""
    original = _original_get_max_memory()
    if not tpu_is_accelerator():
        return original(max_memory)
    if max_memory is not None:
        return _normalize(max_memory)
    host = original(None)
    free, _total = torch.tpu.mem_get_info()
    return {0: free, **{k: v for k, v in host.items() if not isinstance(k, int)}}


# -- device_map strategies ---------------------------------------------------------------------------------
def _model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )


def check_strategy_result(model, strategy: str, device_map: dict, max_memory, warn) -> None:
    """After accelerate's planner: nothing on tpu is an error; partial offload is logged, not silent."""
    devices = set(device_map.values())
    if not any(tpu_index(d) is not None for d in devices):
        budget = get_max_memory(dict(max_memory) if max_memory else None).get(0, 0)
        raise ValueError(
            f"device_map={strategy!r} could not place any part of {type(model).__name__} "
            f"({_model_bytes(model) / 2**20:.1f} MiB) on tpu: the tpu budget is {budget / 2**20:.1f} MiB "
            f"(max_memory={max_memory!r}). Raise the tpu entry of max_memory (key 0 or 'tpu'), or pass "
            "device_map='cpu' if you want the model on CPU."
        )
    offloaded = sorted(k for k, d in device_map.items() if d in ("cpu", "disk"))
    if offloaded:
        warn(
            f"hf_tpu: device_map={strategy!r} with max_memory={max_memory!r} keeps {len(offloaded)} module(s) "
            f"off the tpu ({', '.join(offloaded[:4])}{', ...' if len(offloaded) > 4 else ''}): their weights "
            "live on cpu/disk and are streamed to tpu for each forward (accelerate offload). Raise max_memory "
            "for the tpu to keep everything on the device."
        )


def patch_modeling(module: ModuleType) -> None:
    """accelerate.utils.modeling: `infer_auto_device_map` and `get_balanced_memory` call it by module global;
    the copies imported by value (accelerate.utils, diffusers' loaders, transformers' `accelerate_max_memory`)
    are rebound, and modules imported later import ours."""
    patch(
        module, "get_max_memory", lambda _: get_max_memory, rebind=("get_max_memory", "accelerate_max_memory")
    )


def patch_dataclasses(module: ModuleType) -> None:
    """accelerate.utils.dataclasses: `DynamoBackend` is a closed enum of the backends accelerate knew, so
    `TorchDynamoPlugin(backend="tpu")` (what `Trainer(torch_compile=True)` builds on tpu) raised
    "'TPU' is not a valid DynamoBackend". Add the member; accelerate passes `backend.value.lower()`."""
    enum_cls = getattr(module, "DynamoBackend", None)
    if enum_cls is None or "TPU" in enum_cls._member_map_:
        return
    member = str.__new__(enum_cls, "TPU")
    member._name_ = member._value_ = "TPU"
    member.__objclass__ = enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    enum_cls._member_map_["TPU"] = member
    enum_cls._value2member_map_["TPU"] = member
    enum_cls._member_names_.append("TPU")


def patch_state(module: ModuleType) -> None:
    """`PartialState.default_device` probes cuda, xpu, npu... but never tpu: add it (before the CPU default)."""

    def make(prop: property) -> property:
        fget = prop.fget

        @functools.wraps(fget)
        def default_device(self) -> torch.device:
            device = fget(self)
            if device.type == "cpu" and tpu_is_accelerator():
                return torch.device("tpu", 0)
            return device

        return property(default_device, doc=prop.__doc__)

    patch(module.PartialState, "default_device", make)


def _torchrun_on_tpu(cpu: bool) -> bool:
    """A launcher started this process (LOCAL_RANK set), the user did not ask for CPU, and tpu is current."""
    return not cpu and int(os.environ.get("LOCAL_RANK", -1)) != -1 and tpu_is_accelerator()


def patch_state_distributed(module: ModuleType) -> None:
    """`PartialState._prepare_backend` probes mlu/npu/hpu/cuda/xpu/neuron for a torchrun process and finds
    none on tpu, so a `tpu_dist` job ran as `DistributedType.NO` with one process (`Trainer` on a tp model
    then failed: "ParallelismConfig total_size (2) does not match num_processes (1)"). Map it to
    `MULTI_GPU`, accelerate's generic "one accelerator per process over torch.distributed" type (DDP
    wrapping, sampler sharding, barriers, rng sync), with backend `tpu_dist`; `set_device` then names
    `tpu:local_rank` with `torch.tpu.set_device` (not `torch.cuda`, which MULTI_GPU would call)."""
    distributed_type = module.DistributedType

    def make_prepare(original):
        @functools.wraps(original)
        def _prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend: str | None = None):
            chosen, kind = original(self, cpu, sagemaker_dp, backend)
            if kind == distributed_type.NO and backend in (None, "tpu_dist") and _torchrun_on_tpu(cpu):
                return "tpu_dist", distributed_type.MULTI_GPU
            return chosen, kind

        return _prepare_backend

    def make_set_device(original):
        @functools.wraps(original)
        def set_device(self) -> None:
            if self.device is None and self.backend == "tpu_dist":
                torch.tpu.set_device(self.local_process_index)
                self.device = torch.device("tpu", torch.tpu.current_device())
                return
            original(self)

        return set_device

    patch(module.PartialState, "_prepare_backend", make_prepare)
    patch(module.PartialState, "set_device", make_set_device)


_TPU_RNG_KEY = "torch_tpu_manual_seed"


def _rng_states_file(module: ModuleType, directory, fn, args: tuple, kwargs: dict) -> Path | None:
    """The generator-state file `save_accelerator_state`/`load_accelerator_state` use for this call."""
    try:
        index = inspect.signature(fn).bind_partial(directory, *args, **kwargs).arguments.get("process_index")
    except TypeError:
        return None
    path = Path(directory).joinpath(f"{module.RNG_STATE_NAME}_{index}.pkl")
    return path if index is not None and path.is_file() else None


def patch_checkpointing(module: ModuleType) -> None:
    """accelerate.checkpointing: `save_accelerator_state` keeps the cpu/cuda/xpu/... generator states but
    not tpu's, so after `Accelerator.load_state` dropout drew other masks than the saved run would have.
    Add the tpu states (key "torch_tpu_manual_seed") and restore them. `accelerate.accelerator` imported
    both functions by name: rebind them there too."""

    def make_save(original_save):
        @functools.wraps(original_save)
        def save_accelerator_state(output_dir, *args, **kwargs):
            states = torch.tpu.get_rng_state_all() if tpu_is_accelerator() else None
            result = original_save(output_dir, *args, **kwargs)
            path = _rng_states_file(module, output_dir, original_save, args, kwargs)
            if states is not None and path is not None:
                saved = module.load(path)
                saved[_TPU_RNG_KEY] = states
                torch.save(saved, path)
            return result

        return save_accelerator_state

    def make_load(original_load):
        @functools.wraps(original_load)
        def load_accelerator_state(input_dir, *args, **kwargs):
            result = original_load(input_dir, *args, **kwargs)
            path = _rng_states_file(module, input_dir, original_load, args, kwargs)
            if tpu_is_accelerator() and path is not None:
                states = module.load(path).get(_TPU_RNG_KEY)
                if states is not None:
                    torch.tpu.set_rng_state_all(states)
            return result

        return load_accelerator_state

    patch(module, "save_accelerator_state", make_save, rebind=("save_accelerator_state",))
    patch(module, "load_accelerator_state", make_load, rebind=("load_accelerator_state",))

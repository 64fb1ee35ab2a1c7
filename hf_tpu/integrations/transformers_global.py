"""transformers under `HF_TPU_MESH=global`: `save_pretrained` gathers split weights in every process.

Reading a weight split over other processes' chips is a collective (every process must read it, in the
same order), while transformers reads the weights only in the process that writes them
(`is_main_process`, and rank 0 once a process group exists): the writer would wait for the others forever.
`gather_sharded_state_dict_for_save` runs in every process before that split, so there every tpu weight
is read to the host, in the state dict's order, in every process; the ones that do not write drop the
copies.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch


def _global_mesh() -> bool:
    from hf_tpu.runtime.buffers import global_mesh

    return global_mesh.enabled()


def host_state_dict(state_dict: dict) -> dict:
    """`state_dict` with every tpu tensor read to the host (tensors sharing a view share one host copy, so
    tied weights stay tied for transformers' tie detection)."""
    copies: dict = {}
    out = {}
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            key = (
                value.untyped_storage().data_ptr(),
                value.storage_offset(),
                tuple(value.shape),
                value.stride(),
                value.dtype,
            )
            if key not in copies:
                copies[key] = value.detach().cpu()
            value = copies[key]
        out[name] = value
    return out


def _wrap_gather(original):
    @functools.wraps(original)
    def gather_sharded_state_dict_for_save(self, model_to_save, state_dict, distributed_config, **kwargs):
        state_dict = original(self, model_to_save, state_dict, distributed_config, **kwargs)
        if not _global_mesh():
            return state_dict
        if getattr(self, "_hf_peft_config_loaded", False):
            # the saving rank reads the adapter's weights, the others the whole model's: every process must
            # read the same tensors in the same order, or the gathers wait on each other forever
            raise NotImplementedError(
                "hf_tpu: save_pretrained of a model with PEFT adapters under HF_TPU_MESH=global is not "
                "supported (the processes would read different weights). Save the adapter with "
                "peft's get_peft_model_state_dict(model) read to cpu in every process, then write it from rank 0"
            )
        gathered = host_state_dict(state_dict)
        return gathered if kwargs.get("save_on_this_rank", True) else {}

    return gather_sharded_state_dict_for_save


def patch_distributed_mixin(module: ModuleType) -> None:
    """transformers.distributed.mixin: every process reads the weights before one of them writes."""
    cls = getattr(module, "DistributedMixin", None)
    if cls is None or "gather_sharded_state_dict_for_save" not in vars(cls):
        return  # an older transformers: save from every process (README, "Many hosts")
    patch(cls, "gather_sharded_state_dict_for_save", _wrap_gather)

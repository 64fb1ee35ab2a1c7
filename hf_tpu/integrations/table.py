"""Every patch hf_tpu applies to code it does not own, in one table: what, by which function, why, and
whose verified version range (versions.VERIFIED) it depends on.

`hf_tpu.integrations.HOOKS` (which function runs when which module finishes importing) is derived from it,
and tests/integrations/test_patch_targets.py checks each row against the installed releases: the target
still exists, still takes the parameters the patch relies on, and is patched exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

# `Patch.on` for torch's own Python surface: applied by `import hf_tpu` (hence at `import torch`), right
# after the device is registered, and only when hf_tpu owns the `tpu` device
AT_IMPORT = "hf_tpu"


@dataclass(frozen=True)
class Patch:
    """One upstream attribute hf_tpu replaces (kind "replace", through `patching.patch`: the original stays
    reachable with `patching.original`) or extends in place (kind "extend": an entry added to an upstream
    registry, enum, list or cache)."""

    target: str  # "module:attribute.path"
    by: str  # "file:function" in hf_tpu.integrations; called with the target's module (or `on`'s)
    why: str
    package: str  # whose verified range applies (versions.VERIFIED)
    params: tuple[str, ...] | None = None  # parameters of the upstream callable the patch relies on
    on: str = ""  # the module whose import applies it ("": the target's module; AT_IMPORT: `import hf_tpu`)
    kind: str = "replace"
    only: str = ""  # when it is applied at all, if not always (the function decides)
    # False: what the patch installs calls into the runtime, so TorchDynamo must run it as it runs the
    # runtime (never traced); `by`'s whole module is added to Dynamo's skip rules
    traced: bool = True

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.target.partition(":")[2]

    @property
    def trigger(self) -> str:
        """The module whose import applies the patch (AT_IMPORT for torch's own surface)."""
        return self.on or self.module


_PURE_PYTHON = "pure-Python path only (HF_TPU_NATIVE=0 or no C++ extension): the extension's hooks do it"
_TPU_CURRENT = "only while tpu is torch's current accelerator"
_ROUTE = (
    "the C++ path needs an allocator/guard a Python backend lacks: answered by torch.tpu while tpu is current"
)

PATCHES: tuple[Patch, ...] = (
    # -- accelerate ----------------------------------------------------------------------------------------
    Patch(
        "accelerate.utils.modeling:get_max_memory",
        "accelerate:patch_modeling",
        "accelerate probes cuda/npu/xpu/... and never torch.accelerator: report the tpu's free memory under key 0 "
        "(copies imported by value in accelerate.utils, diffusers and transformers are rebound)",
        "accelerate",
        ("max_memory",),
    ),
    Patch(
        "accelerate.utils.dataclasses:DynamoBackend",
        "accelerate:patch_dataclasses",
        "a closed enum: add TPU so TorchDynamoPlugin(backend='tpu') (Trainer(torch_compile=True)) validates",
        "accelerate",
        kind="extend",
    ),
    Patch(
        "accelerate.state:PartialState.default_device",
        "accelerate:patch_state",
        "probes cuda/xpu/npu/... but never tpu: Accelerator() (hence Trainer) ran on CPU",
        "accelerate",
    ),
    Patch(
        "accelerate.state:PartialState._prepare_backend",
        "accelerate:patch_state_distributed",
        "a torchrun job on tpu ran as one process (no probe for tpu): MULTI_GPU with backend tpu_dist",
        "accelerate",
        ("cpu", "sagemaker_dp", "backend"),
    ),
    Patch(
        "accelerate.state:PartialState.set_device",
        "accelerate:patch_state_distributed",
        "with backend tpu_dist, name tpu:local_rank through torch.tpu.set_device (MULTI_GPU would call torch.cuda)",
        "accelerate",
    ),
    Patch(
        "accelerate.checkpointing:save_accelerator_state",
        "accelerate:patch_checkpointing",
        "Accelerator.save_state keeps the tpu generator's state too (rebound in accelerate.accelerator)",
        "accelerate",
        ("output_dir", "process_index"),
    ),
    Patch(
        "accelerate.checkpointing:load_accelerator_state",
        "accelerate:patch_checkpointing",
        "Accelerator.load_state restores the tpu generator's state (rebound in accelerate.accelerator)",
        "accelerate",
        ("input_dir", "process_index"),
    ),
    # -- transformers --------------------------------------------------------------------------------------
    Patch(
        "transformers.utils.import_utils:is_torch_tpu_available",
        "transformers:refresh_device_caches",
        "an lru_cache computed before the device was registered would say no tpu: cleared",
        "transformers",
        kind="extend",
    ),
    Patch(
        "transformers.utils.import_utils:is_torch_flex_attn_available",
        "transformers:refresh_device_caches",
        "an lru_cache computed before the device was registered: cleared",
        "transformers",
        kind="extend",
    ),
    Patch(
        "transformers.models.doge.modeling_doge:BlockMask",
        "transformers:bind_block_mask",
        "imported only if is_torch_flex_attn_available(), which is False on a tpu host, yet read unguarded "
        "(isinstance(attention_mask, BlockMask)) in every forward: a NameError for every Doge model, CPU ones "
        "too; bound to flex attention's class, the sdpa/eager path runs as on CUDA",
        "transformers",
        kind="extend",
    ),
    Patch(
        "transformers.utils.import_utils:is_torch_accelerator_available",
        "transformers:refresh_device_caches",
        "an lru_cache computed before the device was registered: cleared",
        "transformers",
        kind="extend",
    ),
    Patch(
        "transformers.integrations.accelerate:check_and_set_device_map",
        "transformers:patch_integrations_accelerate",
        "refuse tpu:N (N > 0) up front: one logical device spans every chip (rebound in modeling_utils)",
        "transformers",
        ("device_map",),
    ),
    Patch(
        "transformers.integrations.accelerate:_get_device_map",
        "transformers:patch_integrations_accelerate",
        "a device_map strategy that puts nothing on tpu is an error, partial offload is logged",
        "transformers",
        ("model", "device_map", "max_memory", "hf_quantizer"),
    ),
    Patch(
        "transformers.core_model_loading:spawn_materialize",
        "transformers_sharding:patch_core_model_loading",
        "on several chips each checkpoint tensor is read once and placed as its shards",
        "transformers",
        ("thread_pool", "tensor", "device", "dtype", "sharding_op", "tensor_idx"),
    ),
    Patch(
        "transformers.core_model_loading:set_param_for_module",
        "transformers_sharding:patch_core_model_loading",
        "a weight set during a sharded load is laid out by the sharding policy",
        "transformers",
        ("model", "target_name", "param_value"),
    ),
    Patch(
        "transformers.core_model_loading:convert_and_load_state_dict_in_model",
        "transformers_sharding:patch_core_model_loading",
        "a sharded load learns the model and device_map first (rebound in modeling_utils, modeling_layers)",
        "transformers",
        ("model", "state_dict", "load_config"),
    ),
    Patch(
        "transformers.core_model_loading:WeightTransform.add_tensor",
        "transformers_sharding:patch_core_model_loading",
        "pending tpu placements start as their shards once the target key is known",
        "transformers",
        ("self", "target_key", "source_key", "source_pattern", "future"),
    ),
    Patch(
        "transformers.modeling_utils:PreTrainedModel.from_pretrained",
        "transformers:patch_modeling_utils",
        "device_map/dtype checks for tpu, sharded loads on several chips, single-controller tp_plan",
        "transformers",
        ("pretrained_model_name_or_path",),
    ),
    Patch(
        "transformers.modeling_utils:PreTrainedModel.get_compiled_call",
        "transformers:patch_modeling_utils",
        "the compiled decode step uses the tpu backend and falls back to eager if compiling fails",
        "transformers",
        ("self", "compile_config"),
    ),
    Patch(
        "transformers.modeling_utils:caching_allocator_warmup",
        "transformers_sharding:skip_allocator_warmup",
        "a sharded load skips the whole-model warm-up allocation (fits no single chip)",
        "transformers",
        ("model", "expanded_device_map", "hf_quantizer"),
    ),
    Patch(
        "transformers.distributed.mixin:DistributedMixin.gather_sharded_state_dict_for_save",
        "transformers_global:patch_distributed_mixin",
        "HF_TPU_MESH=global: every process reads the split weights (a collective) before one writes them",
        "transformers",
        ("self", "model_to_save", "state_dict", "distributed_config"),
    ),
    Patch(
        "transformers.training_args:TrainingArguments.__post_init__",
        "transformers:patch_training_args",
        "no pinned memory on tpu; torch_compile uses the tpu backend; fused AdamW only where lowered",
        "transformers",
        ("self",),
    ),
    Patch(
        "transformers.trainer:Trainer._save_rng_state",
        "transformers:patch_trainer",
        "checkpoints keep the tpu generator's state",
        "transformers",
        ("self", "output_dir"),
    ),
    Patch(
        "transformers.trainer:Trainer._load_rng_state",
        "transformers:patch_trainer",
        "resume_from_checkpoint restores the tpu generator's state",
        "transformers",
        ("self", "checkpoint"),
    ),
    Patch(
        "transformers.generation.utils:DeferredStopCheck",
        "transformers:patch_generation_utils",
        "read the stop flag one step late on tpu too (upstream: mps only): no host stall per token",
        "transformers",
        ("input_ids", "max_length", "cache", "cache_is_returned"),
    ),
    Patch(
        "transformers.generation.utils:GenerationMixin.generate",
        "transformers:patch_generation_utils",
        "forget the previous call's compiled-step note",
        "transformers",
        ("self",),
    ),
    Patch(
        "transformers.generation.utils:GenerationMixin._optimize_model_for_decode",
        "transformers:patch_generation_utils",
        "the eager ops around a compiled decode step run deferred and fused",
        "transformers",
        ("self",),
    ),
    Patch(
        "transformers.cache_utils:StaticLayer.lazy_initialization",
        "transformers:patch_cache_utils",
        "a sharded model's static KV buffers split by heads like the keys that fill them",
        "transformers",
        ("self", "key_states", "value_states"),
    ),
    Patch(
        "transformers.cache_utils:Cache.update",
        "transformers:patch_cache_utils",
        "offloaded caches on tpu skip the CUDA-only stream handshake (applied only while Cache's offloading "
        "API, prefetch/offload/only_non_sliding, is the one it was written against)",
        "transformers",
        ("self", "key_states", "value_states", "layer_idx"),
    ),
    Patch(
        "transformers.generation.continuous_batching.cache:get_device_and_memory_breakdown",
        "transformers:patch_continuous_batching_cache",
        "a paged KV cache built for tpu is sized from tpu memory, not the host's",
        "transformers",
        (),
    ),
    Patch(
        "transformers.generation.continuous_batching.cache:PagedAttentionCache.__init__",
        "transformers:patch_continuous_batching_cache",
        "marks the cache being built as a tpu one (for get_device_and_memory_breakdown)",
        "transformers",
        ("self", "device"),
    ),
    Patch(
        "transformers.testing_utils:BACKEND_DEVICE_COUNT",
        "transformers:patch_testing_utils",
        "TRANSFORMERS_TEST_DEVICE=tpu: testing_utils' backend tables point at torch.tpu, device count 1",
        "transformers",
        kind="extend",
        only=_TPU_CURRENT,
    ),
    # -- diffusers -----------------------------------------------------------------------------------------
    Patch(
        "diffusers.utils.torch_utils:TorchDeviceBackend._detect_device_type",
        "diffusers:refresh_device_detection",
        "an lru_cache computed before the device was registered would not see tpu: cleared",
        "diffusers",
        kind="extend",
    ),
    Patch(
        "diffusers.models.model_loading_utils:_determine_device_map",
        "diffusers:patch_model_loading_utils",
        "a device_map strategy that puts nothing on tpu is an error (rebound in modeling_utils, single_file_model)",
        "diffusers",
        ("model", "device_map", "max_memory"),
    ),
    Patch(
        "diffusers.models.model_loading_utils:load_model_dict_into_meta",
        "diffusers_sharding:patch_model_loading_utils",
        "on several chips weights are placed as their shards while they load",
        "diffusers",
        ("model", "state_dict", "dtype", "device_map", "hf_quantizer", "keep_in_fp32_modules"),
    ),
    Patch(
        "diffusers.pipelines.pipeline_utils:SUPPORTED_DEVICE_MAP",
        "diffusers:patch_pipeline_utils",
        "computed at import from diffusers' device detection: device_map='tpu' is accepted",
        "diffusers",
        kind="extend",
        only=_TPU_CURRENT,
    ),
    Patch(
        "diffusers.models.modeling_utils:ModelMixin.from_pretrained",
        "diffusers_sharding:patch_modeling_utils",
        "on several chips a model loads sharded; parallel_config without a process group",
        "diffusers",
        ("pretrained_model_name_or_path",),
    ),
    Patch(
        "diffusers.models.modeling_utils:ModelMixin.enable_parallelism",
        "diffusers_parallel:patch_modeling_utils",
        "enable_parallelism without a process group runs on the mesh (single controller)",
        "diffusers",
        ("self", "config", "cp_plan"),
    ),
    Patch(
        "diffusers.models.attention_dispatch:_templated_context_parallel_attention",
        "diffusers_parallel:patch_attention_dispatch",
        "single-controller context-parallel attention (ring by GSPMD, Ulysses by all-to-all)",
        "diffusers",
        (
            "query",
            "key",
            "value",
            "attn_mask",
            "dropout_p",
            "is_causal",
            "scale",
            "enable_gqa",
            "return_lse",
            "forward_op",
            "backward_op",
            "_parallel_config",
        ),
    ),
    Patch(
        "diffusers.models.attention_dispatch:_native_attention_forward_op",
        "diffusers_parallel:patch_native_attention_forward_op",
        "ring attention under a process group asks the native op for its logsumexp: on tpu it gives it",
        "diffusers",
        (
            "ctx",
            "query",
            "key",
            "value",
            "attn_mask",
            "dropout_p",
            "is_causal",
            "scale",
            "enable_gqa",
            "return_lse",
            "_save_ctx",
            "_parallel_config",
        ),
    ),
    Patch(
        "diffusers.models.attention_dispatch:_native_attention_backward_op",
        "diffusers_parallel:patch_native_attention_backward_op",
        "ring attention's backward passes each step's key/value and the whole output/logsumexp, which the "
        "native op ignores (wrong gradients): on tpu it uses them",
        "diffusers",
        ("ctx", "grad_out"),
    ),
    # -- safetensors ---------------------------------------------------------------------------------------
    Patch(
        "safetensors:safe_open",
        "safetensors_torch:patch_safe_open",
        "safetensors parses the device itself and knows no 'tpu': read on CPU, copy each tensor (rebound "
        "in accelerate's modeling and offload utilities)",
        "safetensors",
        ("filename", "framework", "device"),
    ),
    Patch(
        "safetensors.torch:load_file",
        "safetensors_torch:patch_safetensors_torch",
        "load_file(path, device='tpu') (diffusers' group offloading to disk)",
        "safetensors",
        ("filename", "device"),
    ),
    # -- TorchDynamo, inductor, FlexAttention --------------------------------------------------------------
    Patch(
        "torch._dynamo.backends.registry:register_backend",
        "torch_dynamo:register_tpu_backend",
        "the `tpu` backend, registered once as the registry loads (concurrent first lookups raced)",
        "torch",
        ("compiler_fn", "name"),
        kind="extend",
    ),
    Patch(
        "torch._meta_registrations:meta_grouped_mm",
        "torch_dynamo:register_tpu_backend",
        "its CUDA-only bf16 check rejected float32 MoE matmuls in fake tensors: computed in bf16 instead",
        "torch",
        ("mat_a", "mat_b", "offs", "bias", "out_dtype"),
        on="torch._dynamo.backends.registry",
        kind="extend",
    ),
    Patch(
        "torch._dynamo.trace_rules:add",
        "torch_dynamo:keep_out_of_the_runtime",
        "Dynamo never traces hf_tpu's runtime, JAX or jaxlib, whichever backend compiles",
        "torch",
        ("import_name",),
        kind="extend",
    ),
    Patch(
        "torch._dynamo.trace_rules:_allowed_callable_ids",
        "torch_dynamo:allow_tpu_device_queries",
        "torch.tpu.is_available()/device_count()/current_device() may be called while tracing",
        "torch",
        kind="extend",
    ),
    Patch(
        "torch._dynamo.variables.torch:constant_fold_functions",
        "torch_dynamo:fold_tpu_device_queries",
        "those torch.tpu queries fold to constants while tracing, as torch.cuda's do",
        "torch",
        kind="extend",
    ),
    Patch(
        "torch._inductor.compile_fx:compile_fx",
        "torch_dynamo:route_tpu_graphs_from_inductor",
        "inductor's own tpu device needs torch_tpu: graphs with tpu tensors go to hf_tpu's compiler",
        "torch",
        ("model_", "example_inputs_"),
    ),
    Patch(
        "torch.nn.attention.flex_attention:_validate_device",
        "torch_flex_attention:allow_tpu",
        "eager FlexAttention refused every device outside a fixed list; its math runs on tpu",
        "torch",
        ("query", "key", "value"),
    ),
    # -- torch's own Python surface (applied at `import hf_tpu`, after registration) ------------------------
    Patch(
        "torch._tensor_str:_tensor_str",
        "torch_tensor:format_on_host",
        "printing a tpu tensor formats one host copy",
        "torch",
        ("self", "indent"),
        on=AT_IMPORT,
    ),
    Patch(
        "torch._tensor:Tensor.pin_memory",
        "torch_tensor:pin_memory_without_allocator",
        "Python hooks have no pinned allocator: DataLoader(pin_memory=True) gets the tensor itself",
        "torch",
        on=AT_IMPORT,
        only=_PURE_PYTHON,
    ),
    Patch(
        "torch._tensor:Tensor.record_stream",
        "torch_tensor:record_stream_of_tpu_streams",
        "the C++ parser takes only torch.Stream: a torch.tpu.Stream is passed as one",
        "torch",
        on=AT_IMPORT,
    ),
    Patch(
        "torch._tensor:Tensor.__dlpack_device__",
        "torch_tensor:dlpack_device_of_tpu",
        "compares device.type with 'privateuse1', never true for a renamed backend",
        "torch",
        ("self",),
        on=AT_IMPORT,
    ),
    Patch(
        "torch.storage:UntypedStorage.__new__",
        "torch_storage:route_tpu_storages",
        "torch.load/deepcopy/pickle allocate through a C++ allocator a Python backend lacks (SIGSEGV)",
        "torch",
        on=AT_IMPORT,
    ),
    Patch(
        "torch.storage:UntypedStorage.clone",
        "torch_storage:route_tpu_storages",
        "a tpu storage clone shares its immutable device array",
        "torch",
        ("self",),
        on=AT_IMPORT,
    ),
    Patch(
        "torch.storage:UntypedStorage._byteswap",
        "torch_storage:route_tpu_storages",
        "byte-swapping a tpu storage (big-endian checkpoints) runs on the device array",
        "torch",
        on=AT_IMPORT,
    ),
    Patch(
        "torch.storage:UntypedStorage.resize_",
        "torch_storage:route_tpu_storages",
        "resizes the registry storage (FSDP2 frees/reallocates with it) instead of a C++ allocator call",
        "torch",
        on=AT_IMPORT,
    ),
    Patch(
        "torch.nn.modules.module:Module._apply",
        "torch_module:keep_tied_tensors_tied",
        "Module.to('tpu') keeps tensors shared between submodules shared (tied weights)",
        "torch",
        ("self", "fn", "recurse"),
        on=AT_IMPORT,
    ),
    Patch(
        "torch:Generator",
        "torch_generator:cpu_generator_for_tpu",
        "Python hooks cannot make a device generator: torch.Generator('tpu') is a CPU one",
        "torch",
        on=AT_IMPORT,
        only=_PURE_PYTHON,
    ),
    Patch(
        "torch.distributed.distributed_c10d:init_process_group",
        "torch_distributed:publish_world_size",
        "torch checks device_id=tpu:rank against device_count() inside the call: the job's size is published "
        "while it runs (torch.distributed's re-export is rebound)",
        "torch",
        ("backend", "world_size", "device_id"),
        on=AT_IMPORT,
    ),
    Patch(
        "torch.accelerator:device_count",
        "torch_accelerator:count_job_devices",
        "in a multi-process tpu_dist job, count the job's local device indices",
        "torch",
        (),
        on=AT_IMPORT,
    ),
    *(
        Patch(
            f"torch.accelerator:{name}",
            "torch_accelerator:route_to_torch_tpu",
            _ROUTE,
            "torch",
            (),
            on=AT_IMPORT,
            traced=False,
        )
        for name in ("synchronize", "current_stream", "set_stream", "get_device_capability")
    ),
    *(
        Patch(
            f"torch.accelerator.memory:{name}",
            "torch_accelerator:route_memory_to_torch_tpu",
            _ROUTE + " (torch.accelerator's re-export is rebound)",
            "torch",
            (),
            on=AT_IMPORT,
            traced=False,
        )
        for name in (
            "empty_cache",
            "memory_allocated",
            "max_memory_allocated",
            "memory_reserved",
            "max_memory_reserved",
            "reset_peak_memory_stats",
            "reset_accumulated_memory_stats",
            "memory_stats",
            "get_memory_info",
        )
    ),
)


def hooks() -> dict[str, tuple[str, ...]]:
    """module -> the functions applied (in table order, each once) when it finishes importing."""
    out: dict[str, list[str]] = {}
    for row in PATCHES:
        if row.trigger != AT_IMPORT:
            refs = out.setdefault(row.trigger, [])
            if row.by not in refs:
                refs.append(row.by)
    return {module: tuple(refs) for module, refs in out.items()}


def at_import() -> tuple[tuple[str, str], ...]:
    """(module, function) pairs applied at `import hf_tpu`, in table order, each once."""
    out: list[tuple[str, str]] = []
    for row in PATCHES:
        if row.trigger == AT_IMPORT and (row.module, row.by) not in out:
            out.append((row.module, row.by))
    return tuple(out)


def untraced_modules() -> tuple[str, ...]:
    """hf_tpu.integrations modules that TorchDynamo must skip as it skips the runtime (rows traced=False)."""
    return tuple(
        sorted({f"hf_tpu.integrations.{row.by.partition(':')[0]}" for row in PATCHES if not row.traced})
    )


__all__ = ["AT_IMPORT", "PATCHES", "Patch", "at_import", "hooks", "untraced_modules"]

"""One diffusers generation over many chips, in one process: data, tensor and context parallel on the mesh.

One mechanism: placement. Weights are placed by the sharding policies (`sharding.py`: `tp` from a model's
`_tp_plan`, else `fsdp`); the activations a denoiser receives are placed by forward hooks; XLA's GSPMD then
partitions every op and inserts the collectives, so each result is the unsplit computation's.

- data parallel (`data=axis`): every tensor argument of a component call whose leading dim is the call's
  batch (latents, prompt embeddings, timesteps, CFG's doubled batch) is split over `axis`.
- context parallel (`context=axis`): a denoiser's `_cp_plan` read as placements: each `ContextParallelInput`
  splits that module input (or output, `split_output=True`) along `split_dim` over `axis`, each
  `ContextParallelOutput` lays its output out whole along `gather_dim` again. `ulysses=True` re-lays
  query/key/value out by heads around each attention (the all-to-all of Ulysses attention) and the output
  back by sequence (inside a compiled graph: sharding constraints, `sharding_constraint.py`); otherwise they
  stay split by sequence and GSPMD gathers keys/values (the all-gather of ring attention with
  rotate_method="allgather"). The hooks at module boundaries run outside a compiled graph
  (`torch._dynamo.disable`: a graph break each).
- diffusers' own API without a process group: `model.enable_parallelism(config=ContextParallelConfig(
  ring_degree=N | ulysses_degree=N))` and `TensorParallelConfig(tp_degree=N)` (also as
  `from_pretrained(..., parallel_config=...)`) map onto the above over the mesh axis of size N, the way
  transformers' `tp_plan="auto"` maps onto the `tp` placement.
- under torchrun with a process group (`tpu_dist`), none of the above: `enable_parallelism` and
  `from_pretrained(parallel_config=)` run diffusers' own path (its device mesh, `_cp_plan` hooks, ring/Ulysses
  attention over functional collectives, DTensor tensor parallel; tests/distributed/test_diffusers_dist.py).
  One addition: ring attention asks the attention op for each step's logsumexp, which diffusers' native op
  refuses; on tpu it gives it (`patch_native_attention_forward_op`), so ring runs on the native backend.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from types import ModuleType

import torch

from hf_tpu.integrations import sharding as policies
from hf_tpu.integrations.patching import patch
from hf_tpu.runtime.buffers import placement
from hf_tpu.runtime.tensors.sharding import shard

log = logging.getLogger("hf_tpu.diffusers")

_HANDLES = "_hf_tpu_parallel_hooks"
_VAE_NAMES = ("vae", "movq", "vqvae", "vqgan", "vocoder")


# -- placing one tensor ---------------------------------------------------------------------------------
def _spec(tensor: torch.Tensor) -> list:
    from hf_tpu.runtime.tensors.sharding import sharding

    return list(sharding(tensor))


def _ways(axis: str) -> int:

    sizes = dict(placement.mesh().shape)
    if axis not in sizes:
        raise ValueError(
            f"hf_tpu: the mesh has no axis {axis!r} (axes: {tuple(sizes)}); "
            f"set one with hf_tpu.set_mesh(shape, axis_names)"
        )
    return sizes[axis]


_skipped: set = set()


def split_along(tensor, dim: int, axis: str, what: str = "tensor"):
    """`tensor` (a tpu tensor) split along `dim` over mesh `axis`, keeping how its other dims are split."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu" or tensor.dim() == 0:
        return tensor
    dim = dim % tensor.dim()
    spec = _spec(tensor)
    if spec[dim] == axis or axis in spec:
        return tensor
    ways = _ways(axis)
    if spec[dim] is not None or tensor.shape[dim] % ways:
        if (what, dim) not in _skipped:
            _skipped.add((what, dim))
            log.warning(
                "hf_tpu: %s of shape %s is not split along dim %d over %r (%d chips): the dim does not divide "
                "or is split already; it runs unsplit there (same result).",
                what,
                tuple(tensor.shape),
                dim,
                axis,
                ways,
            )
        return tensor
    spec[dim] = axis

    return shard(tensor, tuple(spec))


def whole_along(tensor, dim: int, axis: str):
    """`tensor` with dim `dim` no longer split over `axis` (the gather of context parallelism)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu" or tensor.dim() == 0:
        return tensor
    spec = _spec(tensor)
    dim = dim % tensor.dim()
    if spec[dim] != axis:
        return tensor
    spec[dim] = None

    return shard(tensor, tuple(spec))


# -- data parallel --------------------------------------------------------------------------------------
def _batch_size(args: tuple, kwargs: dict) -> int | None:
    for name in ("hidden_states", "sample", "input_ids", "x"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return None


def data_parallel(module: torch.nn.Module, axis: str = "data") -> torch.nn.Module:
    """Split the batch of every call of `module` over mesh `axis`: each tensor argument whose leading dim is
    the batch (the first tensor argument's) is laid out split along it. Returns `module`."""
    ways = _ways(axis)

    @torch._dynamo.disable
    def split_batch(mod, args, kwargs):
        batch = _batch_size(args, kwargs)
        if batch is None or batch % ways:
            return None

        def place(value):
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
                return split_along(value, 0, axis, f"{type(mod).__name__} input")
            return value

        return tuple(place(a) for a in args), {k: place(v) for k, v in kwargs.items()}

    _keep(module, module.register_forward_pre_hook(split_batch, with_kwargs=True))
    return module


# -- context parallel -----------------------------------------------------------------------------------
def _submodules(model: torch.nn.Module, name: str) -> list[torch.nn.Module]:
    """Modules a `_cp_plan` key names ("" the model, "blocks.0", "transformer_blocks.*")."""
    if name == "":
        return [model]
    head, _, rest = name.partition(".")
    if head == "*":
        if not isinstance(model, torch.nn.ModuleList):
            raise ValueError(
                f"_cp_plan: '*' must stand for the items of a ModuleList, got {type(model).__name__}"
            )
        return [m for item in model for m in _submodules(item, rest)]
    if not hasattr(model, head):
        raise ValueError(f"_cp_plan names {head!r}, which is not a submodule of {type(model).__name__}")
    return _submodules(getattr(model, head), rest)


def _split(value, how, axis: str, what: str):
    """A module input/output laid out by a ContextParallelInput (or a list of them for a list of tensors)."""
    if isinstance(value, torch.Tensor):
        if how.expected_dims is not None and value.dim() != how.expected_dims:
            return value  # as diffusers: a tensor of another rank is not split
        return split_along(value, how.split_dim, axis, what)
    if isinstance(value, (list, tuple)) and isinstance(how, (list, tuple)):
        return type(value)(_split(v, h, axis, what) for v, h in zip(value, how, strict=False))
    return value


def _input_hook(module: torch.nn.Module, inputs: dict, axis: str) -> Callable:
    names = list(inspect.signature(type(module).forward).parameters)[1:]

    @torch._dynamo.disable
    def split_inputs(mod, args, kwargs):
        args = list(args)
        for name, how in inputs.items():
            if name in kwargs:
                kwargs[name] = _split(kwargs[name], how, axis, f"{type(mod).__name__}.{name}")
            elif name in names and names.index(name) < len(args):
                i = names.index(name)
                args[i] = _split(args[i], how, axis, f"{type(mod).__name__}.{name}")
        return tuple(args), kwargs

    return split_inputs


def _output_split_hook(module: torch.nn.Module, outputs: dict, axis: str) -> Callable:
    @torch._dynamo.disable
    def split_outputs(mod, args, output):
        single = isinstance(output, torch.Tensor)
        values = [output] if single else list(output)
        for index, how in outputs.items():
            values[index] = _split(values[index], how, axis, f"{type(mod).__name__} output {index}")
        return values[0] if single else type(output)(values)

    return split_outputs


def _gather_hook(gathers: list, axis: str) -> Callable:
    @torch._dynamo.disable
    def gather_outputs(mod, args, output):
        single = isinstance(output, torch.Tensor)
        values = [output] if single else list(output)
        for i, how in enumerate(gathers):
            if how is not None and i < len(values):
                if how.expected_dims is None or values[i].dim() == how.expected_dims:
                    values[i] = whole_along(values[i], how.gather_dim, axis)
        return values[0] if single else type(output)(values)

    return gather_outputs


def context_parallel(
    model: torch.nn.Module, axis: str = "context", plan: dict | None = None, ulysses: bool = False
) -> torch.nn.Module:
    """Split `model`'s sequence over mesh `axis` by its `_cp_plan` (or `plan`): see the module docstring.
    Returns `model`."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    plan = plan if plan is not None else getattr(type(model), "_cp_plan", None)
    if not plan:
        raise ValueError(
            f"{type(model).__name__} has no `_cp_plan`, so hf_tpu cannot tell which tensors carry the sequence; "
            "pass plan= (diffusers' ContextParallelInput/ContextParallelOutput format) or use data parallelism"
        )
    _ways(axis)
    for module_id, entry in plan.items():
        for module in _submodules(model, module_id):
            if isinstance(entry, dict):
                inputs = {k: v for k, v in entry.items() if not _splits_output(v, ContextParallelInput)}
                outputs = {k: v for k, v in entry.items() if _splits_output(v, ContextParallelInput)}
                if inputs:
                    hook = _input_hook(module, inputs, axis)
                    _keep(model, module.register_forward_pre_hook(hook, with_kwargs=True))
                if outputs:
                    _keep(model, module.register_forward_hook(_output_split_hook(module, outputs, axis)))
            else:
                gathers = [entry] if isinstance(entry, ContextParallelOutput) else list(entry)
                _keep(model, module.register_forward_hook(_gather_hook(gathers, axis)))
    if ulysses:
        _set_attention_layout(model, axis)
    return model


def _splits_output(how, input_cls) -> bool:
    first = how[0] if isinstance(how, (list, tuple)) and how else how
    return isinstance(first, input_cls) and first.split_output


def _set_attention_layout(model: torch.nn.Module, axis: str) -> None:
    """Processors get a ContextParallelConfig marked with the mesh axis: diffusers' native attention then calls
    `_templated_context_parallel_attention`, which `patch_attention_dispatch` routes to `ulysses_attention`."""
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    from hf_tpu.integrations.sharding_constraint import define

    define()  # before any trace: Dynamo keeps the custom op in the graph
    ways = _ways(axis)
    config = ParallelConfig(context_parallel_config=ContextParallelConfig(ulysses_degree=ways))
    config.context_parallel_config._hf_tpu_axis = axis
    config.context_parallel_config._hf_tpu_ways = ways
    _mark_processors(model, config)


def _mark_processors(model: torch.nn.Module, config) -> None:
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_parallel_config"):
            processor._parallel_config = config


def _keep(module: torch.nn.Module, handle) -> None:
    module.__dict__.setdefault(_HANDLES, []).append(handle)


def remove_parallel_hooks(module: torch.nn.Module) -> None:
    """Undo `data_parallel`/`context_parallel` (and a single-controller `enable_parallelism`) on `module`; placed
    weights stay where they are."""
    handles = module.__dict__.pop(_HANDLES, [])
    for handle in handles:
        handle.remove()
    if handles:
        _mark_processors(module, None)
        if getattr(module, "_parallel_config", None) is not None:
            module._parallel_config = None


# -- the attention of Ulysses, single-controller ------------------------------------------------------------
def ulysses_attention(
    query,
    key,
    value,
    attn_mask,
    dropout_p,
    is_causal,
    scale,
    enable_gqa,
    return_lse,
    forward_op,
    axis: str,
    ways: int,
):
    """(B, S, H, D) query/key/value split by sequence -> split by heads, attention, output split by sequence.
    Eagerly each tensor is re-laid out; inside a compiled graph a sharding constraint says the same to GSPMD."""

    def by(t, from_dim, to_dim):
        if not isinstance(t, torch.Tensor) or t.shape[from_dim] % ways or t.shape[to_dim] % ways:
            return t
        if torch.compiler.is_compiling():
            spec = ["*"] * t.dim()
            spec[from_dim], spec[to_dim] = "", axis
            return torch.ops.hf_tpu.sharding_constraint(t, "|".join(spec))
        spec = _spec(t)
        if spec[from_dim] != axis:
            return t
        spec[from_dim], spec[to_dim] = None, axis

        return shard(t, tuple(spec))

    query, key, value = (by(t, 1, 2) for t in (query, key, value))
    out = forward_op(
        None,
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        _save_ctx=False,
        _parallel_config=None,
    )
    if isinstance(out, tuple):
        return (by(out[0], 2, 1), *out[1:])
    return by(out, 2, 1)


def _wrap_templated(original):
    @functools.wraps(original)
    def _templated_context_parallel_attention(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
        return_lse=False,
        *,
        forward_op,
        backward_op,
        _parallel_config=None,
    ):
        cp = getattr(_parallel_config, "context_parallel_config", None)
        axis = getattr(cp, "_hf_tpu_axis", None)
        if axis is None:
            return original(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                return_lse,
                forward_op=forward_op,
                backward_op=backward_op,
                _parallel_config=_parallel_config,
            )
        if cp.ulysses_degree > 1:
            return ulysses_attention(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                return_lse,
                forward_op,
                axis,
                cp._hf_tpu_ways,
            )
        # ring: keys/values stay split by sequence; GSPMD gathers them (rotate_method="allgather")
        return forward_op(
            None,
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            return_lse,
            _save_ctx=False,
            _parallel_config=None,
        )

    return _templated_context_parallel_attention


# -- ring attention's per-step logsumexp, multi-process --------------------------------------------------------
def _wrap_native_forward_op(original):
    """diffusers' ring attention (TemplatedRingAttention, under a process group) merges each step's partial output
    by its logsumexp, asking the backend's forward op for `return_lse=True`; the native op refuses (on CUDA one
    picks a flash backend, which tpu has not). On tpu the fused SDPA entry returns the logsumexp anyway, so the
    native op gives it: out (B, S, H, D) as before and lse (B, S, H) in float32, the layout the ring expects."""

    @functools.wraps(original)
    def _native_attention_forward_op(
        ctx,
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
        return_lse=False,
        _save_ctx=True,
        _parallel_config=None,
    ):
        if not (return_lse and query.device.type == "tpu" and not enable_gqa):
            return original(
                ctx,
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                return_lse,
                _save_ctx=_save_ctx,
                _parallel_config=_parallel_config,
            )
        if _save_ctx:  # what the native backward op reads
            ctx.save_for_backward(query, key, value)
            ctx.attn_mask, ctx.dropout_p, ctx.is_causal = attn_mask, dropout_p, is_causal
            ctx.scale, ctx.enable_gqa = scale, enable_gqa
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        out, lse = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
            q, k, v, attn_mask, dropout_p, is_causal, False, scale=scale
        )[:2]
        return out.permute(0, 2, 1, 3), lse.transpose(1, 2)

    return _native_attention_forward_op


def patch_native_attention_forward_op(module: ModuleType) -> None:
    """diffusers.models.attention_dispatch: the native forward op returns the logsumexp on tpu (ring attention)."""
    if hasattr(module, "_native_attention_forward_op"):
        patch(module, "_native_attention_forward_op", _wrap_native_forward_op)


def patch_attention_dispatch(module: ModuleType) -> None:
    """diffusers.models.attention_dispatch: single-controller context parallel attention (see above)."""
    if hasattr(module, "_templated_context_parallel_attention"):
        patch(module, "_templated_context_parallel_attention", _wrap_templated)


# -- diffusers' ParallelConfig without a process group ---------------------------------------------------------
def _single_controller() -> bool:
    import torch.distributed as dist

    from hf_tpu.integrations.accelerate import tpu_is_accelerator

    return not (dist.is_available() and dist.is_initialized()) and tpu_is_accelerator()


def _axis_of_size(size: int, preferred: tuple[str, ...], what: str) -> str:

    sizes = dict(placement.mesh().shape)
    for name in (*preferred, *sizes):
        if sizes.get(name) == size:
            return name
    raise ValueError(
        f"hf_tpu: {what} needs a mesh axis of size {size}, but the mesh is {sizes}. In one process, set a mesh "
        f"with such an axis first, e.g. hf_tpu.set_mesh(({size},), ('context',)) (chips: {torch.tpu.device_count()})"
    )


def _split_config(config):
    from diffusers.models._modeling_parallel import ContextParallelConfig, TensorParallelConfig

    if isinstance(config, ContextParallelConfig):
        return config, None
    if isinstance(config, TensorParallelConfig):
        return None, config
    return getattr(config, "context_parallel_config", None), getattr(config, "tensor_parallel_config", None)


def apply_parallel_config(model: torch.nn.Module, config, cp_plan: dict | None = None) -> None:
    """diffusers' ParallelConfig in one process: tp -> the `tp` placement over the axis of size tp_degree (it must
    be the axis the policy splits, "model" or the mesh's last); cp -> `context_parallel` over the axis of size
    ring_degree x ulysses_degree, with Ulysses attention when ulysses_degree > 1."""
    from diffusers.models._modeling_parallel import ParallelConfig

    cp, tp = _split_config(config)
    if tp is not None:
        degree = tp.mesh.size() if tp.mesh is not None else tp.tp_degree

        axis = policies._axis(placement.mesh())
        if _ways(axis) != degree:
            raise ValueError(
                f"hf_tpu: TensorParallelConfig(tp_degree={degree}) in one process splits weights over the mesh axis "
                f"{axis!r}, which has {_ways(axis)} chips; set a mesh whose 'model' axis has {degree}"
            )
        policies.shard_module(model, "tp")
    if cp is not None:
        if cp.ring_degree > 1 and cp.ulysses_degree > 1:
            raise NotImplementedError("hf_tpu: ring_degree and ulysses_degree both > 1 (unified attention)")
        size = cp.ring_degree * cp.ulysses_degree
        axis = _axis_of_size(size, ("context", "ring", "ulysses", "model"), "ContextParallelConfig")
        context_parallel(model, axis, cp_plan, ulysses=False)
        from hf_tpu.integrations.sharding_constraint import define

        define()
        cp._hf_tpu_axis, cp._hf_tpu_ways = axis, size
        _mark_processors(model, ParallelConfig(context_parallel_config=cp))
    model._parallel_config = (
        config
        if isinstance(config, ParallelConfig)
        else ParallelConfig(context_parallel_config=cp, tensor_parallel_config=tp)
    )


def _wrap_enable_parallelism(original):
    @functools.wraps(original)
    def enable_parallelism(self, *, config, cp_plan=None):
        on_tpu = any(p.device.type == "tpu" for p in self.parameters())
        if not (on_tpu and _single_controller()):
            return original(self, config=config, cp_plan=cp_plan)
        if self._parallel_config is not None:
            raise RuntimeError(
                f"Parallelism is already applied to this {type(self).__name__}; enable_parallelism cannot be called twice."
            )
        apply_parallel_config(self, config, cp_plan)

    return enable_parallelism


def patch_modeling_utils(module: ModuleType) -> None:
    """diffusers.models.modeling_utils: `enable_parallelism` without a process group runs on the mesh."""
    model_mixin = getattr(module, "ModelMixin", None)
    if model_mixin is not None and "enable_parallelism" in model_mixin.__dict__:
        patch(model_mixin, "enable_parallelism", _wrap_enable_parallelism)


def single_controller_parallel_config(kwargs: dict) -> tuple[str | None, Callable | None]:
    """`from_pretrained(..., parallel_config=...)` without a process group: load with `device_map="tpu"` (the
    `tp` policy for a TensorParallelConfig) and apply the config afterwards. Returns (policy, after-load step)."""
    config = kwargs.get("parallel_config")
    if config is None or not _single_controller():
        return None, None
    kwargs.pop("parallel_config")
    if kwargs.get("device_map") is None:
        kwargs["device_map"] = "tpu"
    cp, tp = _split_config(config)
    return ("tp" if tp is not None else None), (lambda model: apply_parallel_config(model, config))


# -- one call for a pipeline ----------------------------------------------------------------------------------
def _denoisers(pipe) -> dict[str, torch.nn.Module]:
    modules = {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}
    return {
        k: v
        for k, v in modules.items()
        if k in ("transformer", "transformer_2", "unet", "prior", "controlnet")
    }


def parallelize_pipeline(
    pipe,
    *,
    data: str | None = None,
    context: str | None = None,
    ulysses: bool = False,
    policy: str | None = None,
):
    """Spread one generation of a diffusers pipeline (already on tpu) over the mesh, in place; returns `pipe`.

    Every model component's weights are placed by `policy` (default: `tp` for a model with a `_tp_plan`, else
    `fsdp`; a no-op for weights `from_pretrained(device_map="tpu")` placed so already). `data="data"` splits the
    batch (prompts x images per prompt, and CFG's doubled batch) of every component call but the VAE's over
    that mesh axis; `context="context"` splits the denoisers' sequence by their `_cp_plan` (`ulysses=True`:
    Ulysses attention). Axes may be combined on a 2-D mesh, e.g. `hf_tpu.set_mesh((2, 4), ("data", "model"))`.
    """
    modules = {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}
    off = sorted(k for k, m in modules.items() if any(p.device.type != "tpu" for p in m.parameters()))
    if off:
        raise ValueError(
            f"hf_tpu.parallelize_pipeline: pipe.{', pipe.'.join(off)} not on tpu; pipe.to('tpu') first"
        )
    for name in (data, context):
        if name is not None:
            _ways(name)
    for module in modules.values():
        remove_parallel_hooks(module)
        policies.shard_module(module, policy)
    if data is not None:
        for name, module in modules.items():
            if name not in _VAE_NAMES:
                data_parallel(module, data)
    if context is not None:
        for module in _denoisers(pipe).values():
            context_parallel(module, context, ulysses=ulysses)
    return pipe

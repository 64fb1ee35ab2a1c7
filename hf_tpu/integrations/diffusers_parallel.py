"""One diffusers generation over many chips, in one process: data, tensor and context parallel on the mesh.

One mechanism: placement. Weights are placed by the sharding policies (`sharding.py`: `tp` from a model's
`_tp_plan`, else `fsdp`); the activations a denoiser receives are placed by forward hooks; XLA's GSPMD then
partitions every op and inserts the collectives, so each result is the unsplit computation's.

- data parallel (`data=axis`): every tensor argument of a component call whose leading dim is the call's
  batch (latents, prompt embeddings, timesteps, CFG's doubled batch) is split over `axis`.
- context parallel (`context=axis`, or a tuple of axes): a denoiser's `_cp_plan` read as placements: each
  `ContextParallelInput` splits that module input (or output, `split_output=True`) along `split_dim` over
  `axis`, each `ContextParallelOutput` lays its output out whole along `gather_dim` again. `ulysses=True`
  re-lays query/key/value out by heads (over the last context axis) around each attention (the all-to-all of
  Ulysses attention) and the output back by sequence (inside a compiled graph: sharding constraints,
  `sharding_constraint.py`); otherwise they stay split by sequence and GSPMD gathers keys/values (the
  all-gather of ring attention with rotate_method="allgather"). Both at once (two axes, Ulysses on the last):
  diffusers' unified attention, the sequence left split over the ring axis inside each attention. The hooks
  at module boundaries run outside a compiled graph (`torch._dynamo.disable`: a graph break each). Every
  re-layout of a tensor that needs a gradient is the differentiable sharding-constraint op, so a training
  step sees one autograd graph.
- diffusers' own API without a process group: `model.enable_parallelism(config=ContextParallelConfig(
  ring_degree=N | ulysses_degree=N))` and `TensorParallelConfig(tp_degree=N)` (also as
  `from_pretrained(..., parallel_config=...)`) map onto the above over the mesh axis of size N, the way
  transformers' `tp_plan="auto"` maps onto the `tp` placement; `ring_degree=R, ulysses_degree=U` together
  need two axes sized R and U (preferably named "ring" and "ulysses").
- under torchrun with a process group (`tpu_dist`), none of the above: `enable_parallelism` and
  `from_pretrained(parallel_config=)` run diffusers' own path (its device mesh, `_cp_plan` hooks, ring/Ulysses
  attention over functional collectives, DTensor tensor parallel; tests/distributed/test_diffusers_dist.py).
  Two additions: ring attention asks the attention op for each step's logsumexp, which diffusers' native op
  refuses; on tpu it gives it (`patch_native_attention_forward_op`), so ring runs on the native backend. And
  ring attention's backward hands the backward op each step's keys/values and the whole output/logsumexp,
  which diffusers' native op ignores (wrong gradients wherever the forward is answered, e.g. on CPU with the
  same logsumexp answer); on tpu it uses them (`patch_native_attention_backward_op`), so ring (and unified)
  training is right.
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
Axis = str | tuple[str, ...]  # a mesh axis, or several splitting one dim together (major first)


def _spec(tensor: torch.Tensor) -> list:
    from hf_tpu.runtime.tensors.sharding import sharding

    return list(sharding(tensor))


def _names(entry) -> tuple[str, ...]:
    """The axis names of a spec entry (None, a name or a tuple of names)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(names: tuple[str, ...]):
    """A spec entry for `names`: None, one name, or the tuple."""
    return None if not names else names[0] if len(names) == 1 else tuple(names)


def _ways(axis: Axis) -> int:
    sizes = dict(placement.mesh().shape)
    ways = 1
    for name in _names(axis):
        if name not in sizes:
            raise ValueError(
                f"hf_tpu: the mesh has no axis {name!r} (axes: {tuple(sizes)}); "
                f"set one with hf_tpu.set_mesh(shape, axis_names)"
            )
        ways *= sizes[name]
    return ways


def _lay_out(tensor: torch.Tensor, spec: list) -> torch.Tensor:
    """`tensor` laid out by `spec`. `shard` re-lays a whole buffer out in place but gives a view a new tensor
    outside autograd; a tensor that needs its gradient goes through the sharding-constraint op instead (a
    copy laid out by `spec`, whose gradient passes through unchanged), so training sees one graph."""
    if tensor.requires_grad and torch.is_grad_enabled():
        from hf_tpu.integrations.sharding_constraint import constrain

        return constrain(tensor, [",".join(_names(e)) for e in spec])
    return shard(tensor, tuple(spec))


_skipped: set = set()


def split_along(tensor, dim: int, axis: Axis, what: str = "tensor"):
    """`tensor` (a tpu tensor) split along `dim` over mesh `axis` (or axes), keeping how its other dims are
    split."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu" or tensor.dim() == 0:
        return tensor
    dim = dim % tensor.dim()
    spec = _spec(tensor)
    used = {n for e in spec for n in _names(e)}
    if _names(spec[dim]) == _names(axis) or used & set(_names(axis)):
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
    spec[dim] = _entry(_names(axis))
    return _lay_out(tensor, spec)


def whole_along(tensor, dim: int, axis: Axis):
    """`tensor` with dim `dim` no longer split over `axis` (the gather of context parallelism)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu" or tensor.dim() == 0:
        return tensor
    spec = _spec(tensor)
    dim = dim % tensor.dim()
    if _names(spec[dim]) != _names(axis):
        return tensor
    spec[dim] = None
    return _lay_out(tensor, spec)


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


def _split(value, how, axis: Axis, what: str):
    """A module input/output laid out by a ContextParallelInput (or a list of them for a list of tensors)."""
    if isinstance(value, torch.Tensor):
        if how.expected_dims is not None and value.dim() != how.expected_dims:
            return value  # as diffusers: a tensor of another rank is not split
        return split_along(value, how.split_dim, axis, what)
    if isinstance(value, (list, tuple)) and isinstance(how, (list, tuple)):
        return type(value)(_split(v, h, axis, what) for v, h in zip(value, how, strict=False))
    return value


def _input_hook(module: torch.nn.Module, inputs: dict, axis: Axis) -> Callable:
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


def _output_split_hook(module: torch.nn.Module, outputs: dict, axis: Axis) -> Callable:
    @torch._dynamo.disable
    def split_outputs(mod, args, output):
        single = isinstance(output, torch.Tensor)
        values = [output] if single else list(output)
        for index, how in outputs.items():
            values[index] = _split(values[index], how, axis, f"{type(mod).__name__} output {index}")
        return values[0] if single else type(output)(values)

    return split_outputs


def _gather_hook(gathers: list, axis: Axis) -> Callable:
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
    model: torch.nn.Module, axis: Axis = "context", plan: dict | None = None, ulysses: bool = False
) -> torch.nn.Module:
    """Split `model`'s sequence over mesh `axis` (or a tuple of axes, major first) by its `_cp_plan` (or `plan`):
    see the module docstring. `ulysses=True`: Ulysses attention over `axis`'s last axis, ring over the others
    (diffusers' unified attention when there are two). Returns `model`."""
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
    if ulysses:  # (ring alone needs no mark: the attention's plain op sees keys/values split, GSPMD gathers)
        _set_attention_layout(model, axis, _names(axis)[-1])
    return model


def _splits_output(how, input_cls) -> bool:
    first = how[0] if isinstance(how, (list, tuple)) and how else how
    return isinstance(first, input_cls) and first.split_output


def _set_attention_layout(model: torch.nn.Module, axis: Axis, ulysses: str | None, config=None) -> None:
    """Processors get a ContextParallelConfig (`config`'s, else a new one) marked with the mesh axes: diffusers'
    native attention then calls `_templated_context_parallel_attention`, which `patch_attention_dispatch` routes
    to `ulysses_attention` (`ulysses`: the axis of the all-to-all) or to the plain op (ring: GSPMD gathers)."""
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    from hf_tpu.integrations.sharding_constraint import define

    define()  # before any trace: Dynamo keeps the custom op in the graph
    if config is None:
        degree = _ways(ulysses) if ulysses else 1
        cp = ContextParallelConfig(ring_degree=_ways(axis) // degree, ulysses_degree=degree)
        config = ParallelConfig(context_parallel_config=cp)
    config.context_parallel_config._hf_tpu_axis = _names(axis)
    config.context_parallel_config._hf_tpu_ulysses = ulysses
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
def _move(t, entries: tuple, spec_from: tuple, ulysses: str):
    """`t` (B, S, H, D) re-laid out with dims 1 and 2 split by `entries` (names per dim), from `spec_from`
    (eagerly: only if the dim that holds the `ulysses` axis is split as `spec_from` says; inside a compiled
    graph: a sharding constraint saying the same to GSPMD)."""
    ways = _ways(ulysses)
    if not isinstance(t, torch.Tensor) or t.shape[1] % ways or t.shape[2] % ways:
        return t
    if torch.compiler.is_compiling():
        spec = ["*"] * t.dim()
        spec[1], spec[2] = (",".join(names) for names in entries)
        return torch.ops.hf_tpu.sharding_constraint(t, "|".join(spec))
    spec = _spec(t)
    dim = 1 if ulysses in spec_from[0] else 2
    if _names(spec[dim]) != spec_from[dim - 1]:
        return t
    spec[1], spec[2] = (_entry(names) for names in entries)
    return _lay_out(t, spec)


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
    axis: Axis,
    ulysses: str,
):
    """(B, S, H, D) query/key/value with S split over `axis` -> S split over the ring axes (`axis` but `ulysses`)
    and H over `ulysses`, attention (GSPMD gathers keys/values over the ring axes), output back to S over `axis`.
    One axis: Ulysses attention; a ring axis and a Ulysses axis: diffusers' unified attention."""
    seq = _names(axis)
    ring = tuple(n for n in seq if n != ulysses)
    split_seq, split_heads = (seq, ()), (ring, (ulysses,))
    query, key, value = (_move(t, split_heads, split_seq, ulysses) for t in (query, key, value))
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
        return (_move(out[0], split_seq, split_heads, ulysses), *out[1:])
    return _move(out, split_seq, split_heads, ulysses)


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
        if cp._hf_tpu_ulysses is not None:
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
                cp._hf_tpu_ulysses,
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


def ring_step_grads(grad_out, query, key, value, out, lse, scale=None):
    """Gradients of one ring step's query/key/value, (B, S, H, D) each, from the ring's whole output and
    logsumexp (B, Sq, H): the step's probabilities are exp(q k^T * scale - lse), so dV = P^T dO and
    dS = P * (dO V^T - rowsum(dO * O)) give dQ = dS K * scale and dK = dS^T Q * scale (flash attention's
    backward). Computed in float32, returned in each input's dtype."""
    dtype = query.dtype
    q, k, v, o, do = (x.transpose(1, 2).float() for x in (query, key, value, out, grad_out))
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    probs = torch.exp(q @ k.transpose(-1, -2) * scale - lse.transpose(1, 2).float().unsqueeze(-1))
    grad_v = probs.transpose(-1, -2) @ do
    grad_s = probs * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    grad_q = grad_s @ k * scale
    grad_k = grad_s.transpose(-1, -2) @ q * scale
    return tuple(g.transpose(1, 2).to(dtype) for g in (grad_q, grad_k, grad_v))


def _wrap_native_backward_op(original):
    """diffusers' ring attention backward calls the backward op once per ring step with that step's key/value
    and the ring's whole output and logsumexp; the native op ignores them and differentiates attention over the
    saved local chunk again, which gives wrong gradients (upstream this never runs: its forward op refuses the
    logsumexp ring needs). On tpu, given them, the step's gradients are computed from them."""

    @functools.wraps(original)
    def _native_attention_backward_op(ctx, grad_out, *args, **kwargs):
        ring = {"query", "key", "value", "out", "lse"} <= kwargs.keys()
        plain = ctx.attn_mask is None and not ctx.is_causal and not ctx.dropout_p
        plain = plain and not getattr(
            ctx, "enable_gqa", False
        )  # ring_step_grads: equal heads, no mask/dropout
        if not (ring and plain and grad_out.device.type == "tpu"):
            return original(ctx, grad_out, *args, **kwargs)
        names = ("query", "key", "value", "out", "lse")
        return ring_step_grads(grad_out, *(kwargs[n] for n in names), scale=ctx.scale)

    return _native_attention_backward_op


def patch_native_attention_backward_op(module: ModuleType) -> None:
    """diffusers.models.attention_dispatch: the native backward op computes ring steps' gradients on tpu."""
    if hasattr(module, "_native_attention_backward_op"):
        patch(module, "_native_attention_backward_op", _wrap_native_backward_op)


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


def _axis_of_size(size: int, preferred: tuple[str, ...], what: str, taken: tuple[str, ...] = ()) -> str:
    sizes = dict(placement.mesh().shape)
    for name in (*preferred, *sizes):
        if sizes.get(name) == size and name not in taken:
            return name
    raise ValueError(
        f"hf_tpu: {what} needs a mesh axis of size {size}, but the mesh is {sizes}. In one process, set a mesh "
        f"with such an axis first, e.g. hf_tpu.set_mesh(({size},), ('context',)) (chips: {torch.tpu.device_count()})"
    )


def _context_axes(cp) -> tuple[Axis, str | None]:
    """(the axis or axes a ContextParallelConfig splits the sequence over, the Ulysses axis or None). Ring and
    Ulysses together need two axes, sized ring_degree and ulysses_degree (preferably named "ring" and "ulysses")."""
    if cp.ring_degree > 1 and cp.ulysses_degree > 1:
        what = "ContextParallelConfig(ulysses_degree=...) with ring_degree > 1"
        ulysses = _axis_of_size(cp.ulysses_degree, ("ulysses",), what)
        what = "ContextParallelConfig(ring_degree=...) with ulysses_degree > 1"
        ring = _axis_of_size(cp.ring_degree, ("ring", "context"), what, taken=(ulysses,))
        return (ring, ulysses), ulysses
    size = cp.ring_degree * cp.ulysses_degree
    axis = _axis_of_size(size, ("context", "ring", "ulysses", "model"), "ContextParallelConfig")
    return axis, (axis if cp.ulysses_degree > 1 else None)


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
    ring_degree x ulysses_degree, with Ulysses attention when ulysses_degree > 1; both > 1: over two axes, sized
    ring_degree and ulysses_degree, Ulysses on the second (unified attention)."""
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
        axis, ulysses = _context_axes(cp)
        context_parallel(model, axis, cp_plan)
        _set_attention_layout(model, axis, ulysses, ParallelConfig(context_parallel_config=cp))
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
    context: Axis | None = None,
    ulysses: bool = False,
    policy: str | None = None,
):
    """Spread one generation of a diffusers pipeline (already on tpu) over the mesh, in place; returns `pipe`.

    Every model component's weights are placed by `policy` (default: `tp` for a model with a `_tp_plan`, else
    `fsdp`; a no-op for weights `from_pretrained(device_map="tpu")` placed so already). `data="data"` splits the
    batch (prompts x images per prompt, and CFG's doubled batch) of every component call but the VAE's over
    that mesh axis; `context="context"` splits the denoisers' sequence by their `_cp_plan` (`ulysses=True`:
    Ulysses attention; a tuple of axes splits it over all of them, and with `ulysses=True` the last one is the
    Ulysses axis and the others ring, e.g. `context=("ring", "ulysses")`). Axes may be combined on a 2-D mesh,
    e.g. `hf_tpu.set_mesh((2, 4), ("data", "model"))`.
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

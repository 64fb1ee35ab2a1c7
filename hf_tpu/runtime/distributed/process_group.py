"""`ProcessGroupTPU`: torch.distributed's collectives on tpu tensors, as JAX programs over a global mesh.

Each call reads the caller's tpu tensors as JAX arrays, runs one cached program (`programs.py`) whose
collective spans the group's processes, and writes the result back into the caller's tensors in place
(through views, as torch expects). Dispatch is asynchronous, as every tpu op is: `Work.wait()` blocks on
the results. Point-to-point ops run on a helper thread per (sender, receiver) direction, so a rank may
post a send and a receive (a ring, `batch_isend_irecv`) without either blocking the other; each
direction keeps program order, which is how sends match receives.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.distributed import programs, reduce_ops
from hf_tpu.runtime.distributed.launch_env import BACKEND_NAME
from hf_tpu.runtime.distributed.work import TpuWork, block_on, join_future
from hf_tpu.runtime.tensors.tensor import to_jax, write


class NotATpuTensorError(TypeError):
    """A tpu_dist collective was given a tensor that is not on the tpu device."""


def _check(tensors, collective: str) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tpu_dist {collective}: argument {i} is a {type(t).__name__}, not a tensor")
        if t.device.type != "tpu":
            raise NotATpuTensorError(
                f"tpu_dist {collective}: tensor {i} (shape {tuple(t.shape)}, {t.dtype}) is on {t.device}; "
                "tpu_dist collectives take tpu tensors: move it with .to('tpu'), or run cpu tensors through "
                "a gloo group (dist.new_group(backend='gloo'))"
            )


def _same_shapes(tensors, shape: tuple, collective: str, what: str) -> None:
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape:
            raise ValueError(
                f"tpu_dist {collective}: {what} {i} has shape {tuple(t.shape)}, expected {shape} (tensors of "
                "one collective must have equal shapes)"
            )


_executors: dict[tuple[int, int], ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _direction(sender: int, receiver: int) -> ThreadPoolExecutor:
    """One thread per (sender, receiver): messages of a direction keep their order."""
    with _executors_lock:
        ex = _executors.get((sender, receiver))
        if ex is None:
            ex = _executors[(sender, receiver)] = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"tpu_dist_p2p_{sender}_{receiver}"
            )
        return ex


class _BackendInfo:
    """What torch reads off a group's backend object: tpu_dist splits nothing and coalesces nothing."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_tensor_alloc = False

    def name(self) -> str:
        return BACKEND_NAME

    def eager_connect_single_device(self, device) -> None:
        return None


_BACKEND_INFO = _BackendInfo()


class ProcessGroupTPU(dist.ProcessGroup):
    """The tpu_dist process group of `ranks` (global ranks, in group-rank order)."""

    def __init__(self, group_rank: int, ranks: tuple[int, ...]) -> None:
        super().__init__(group_rank, len(ranks))
        self._group_rank = group_rank
        self._ranks = tuple(ranks)

    # -- identity --------------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    @property
    def _device_types(self) -> list[torch.device]:
        # object collectives and barrier move their bytes on this device (torch's _get_object_coll_device)
        return [torch.device("tpu")]

    # c10d keeps a group's name and description on its backends; this group has no C++ backend
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", "")

    def _get_backend(self, device) -> _BackendInfo:
        # torch asks the group's per-device backend what it supports (splitting, coalescing); this group
        # is its own backend, written in Python (a C++ `Backend` cannot be subclassed from Python)
        return _BACKEND_INFO

    def __repr__(self) -> str:
        return f"ProcessGroupTPU(rank {self._group_rank} of ranks {list(self._ranks)})"

    # -- helpers ---------------------------------------------------------------------------------------
    def _run(self, body, *arrays):
        return programs.run(self._ranks, body, *arrays)

    def _kind(self, dtype: torch.dtype) -> str:
        return reduce_ops.kind(dtype)

    def _work(self, arrays: list, outputs: list, what: str) -> TpuWork:
        return TpuWork(block_on(arrays), outputs, what)

    def _check_root(self, root: int, collective: str) -> None:
        if not 0 <= root < len(self._ranks):
            raise ValueError(
                f"tpu_dist {collective}: root {root} is not a rank of this group of {len(self._ranks)}"
            )

    # -- reductions ------------------------------------------------------------------------------------
    def _all_reduce(self, t: torch.Tensor, op, collective: str):
        name, factor = reduce_ops.resolve(op, t.dtype, collective)
        return self._run(
            programs.all_reduce_body(name, self._kind(t.dtype), len(self._ranks), factor), to_jax(t)
        )

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        _check(tensors, "all_reduce")
        results = []
        for t in tensors:
            y = self._all_reduce(t, opts.reduceOp, "all_reduce")
            write(t, y)
            results.append(y)
        return self._work(results, list(tensors), "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        _check(tensors, "reduce")
        self._check_root(opts.rootRank, "reduce")
        results = []
        for t in tensors:
            y = self._all_reduce(t, opts.reduceOp, "reduce")
            if self._group_rank == opts.rootRank:
                write(t, y)
            results.append(y)
        return self._work(results, list(tensors), "reduce")

    def _reduce_scatter(self, stacked, like: torch.Tensor, op, collective: str):
        name, factor = reduce_ops.resolve(op, like.dtype, collective)
        body = programs.reduce_scatter_body(name, self._kind(like.dtype), len(self._ranks), factor)
        return self._run(body, stacked)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        jnp = platform.jax().numpy
        results = []
        for out, inputs in zip(outputs, input_lists):
            _check([out, *inputs], "reduce_scatter")
            self._check_count(inputs, "reduce_scatter", "input_list")
            _same_shapes(inputs, tuple(out.shape), "reduce_scatter", "input")
            stacked = jnp.stack([to_jax(t) for t in inputs])
            y = self._reduce_scatter(stacked, out, opts.reduceOp, "reduce_scatter")
            y = y.reshape(tuple(out.shape))
            write(out, y)
            results.append(y)
        return self._work(results, list(outputs), "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        opts = opts or dist.ReduceScatterOptions()
        _check([output, input], "reduce_scatter_tensor")
        g = len(self._ranks)
        if input.numel() != output.numel() * g:
            raise ValueError(
                f"tpu_dist reduce_scatter_tensor: input has {input.numel()} elements, output "
                f"{output.numel()}: the input must hold world_size ({g}) times the output"
            )
        x = to_jax(input).reshape((g, *tuple(output.shape)))
        y = self._reduce_scatter(x, output, opts.reduceOp, "reduce_scatter_tensor").reshape(
            tuple(output.shape)
        )
        write(output, y)
        return self._work([y], [output], "reduce_scatter_tensor")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    # -- gathers ---------------------------------------------------------------------------------------
    def _check_count(self, tensors, collective: str, what: str) -> None:
        if len(tensors) != len(self._ranks):
            raise ValueError(
                f"tpu_dist {collective}: {what} has {len(tensors)} tensors; the group has {len(self._ranks)} ranks"
            )

    def _gathered(self, t: torch.Tensor):
        return self._run(programs.all_gather_body(), to_jax(t))

    def allgather(self, output_lists, inputs, opts=None):
        results = []
        for outs, t in zip(output_lists, inputs):
            _check([t, *outs], "all_gather")
            self._check_count(outs, "all_gather", "tensor_list")
            _same_shapes(outs, tuple(t.shape), "all_gather", "output")
            y = self._gathered(t)
            for j, o in enumerate(outs):
                write(o, y[j])
            results.append(y)
        return self._work(results, [o for outs in output_lists for o in outs], "all_gather")

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        _check([output, input], "all_gather_into_tensor")
        g = len(self._ranks)
        if output.numel() != input.numel() * g:
            raise ValueError(
                f"tpu_dist all_gather_into_tensor: output has {output.numel()} elements, input {input.numel()}: "
                f"the output must hold world_size ({g}) times the input"
            )
        y = self._gathered(input).reshape(tuple(output.shape))
        write(output, y)
        return self._work([y], [output], "all_gather_into_tensor")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    def gather(self, output_lists, inputs, opts=None):
        opts = opts or dist.GatherOptions()
        self._check_root(opts.rootRank, "gather")
        (t,) = inputs
        _check([t], "gather")
        is_root = self._group_rank == opts.rootRank
        y = self._gathered(t)
        if is_root:
            (outs,) = output_lists
            _check(outs, "gather")
            self._check_count(outs, "gather", "gather_list")
            _same_shapes(outs, tuple(t.shape), "gather", "gather_list entry")
            for j, o in enumerate(outs):
                write(o, y[j])
        return self._work([y], [o for outs in output_lists for o in outs], "gather")

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        _check(tensors, "broadcast")
        self._check_root(opts.rootRank, "broadcast")
        results = []
        for t in tensors:
            y = self._run(programs.pick_body(opts.rootRank), to_jax(t))
            if self._group_rank != opts.rootRank:
                write(t, y)
            results.append(y)
        return self._work(results, list(tensors), "broadcast")

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ScatterOptions()
        self._check_root(opts.rootRank, "scatter")
        (out,) = outputs
        _check([out], "scatter")
        jnp = platform.jax().numpy
        g = len(self._ranks)
        if self._group_rank == opts.rootRank:
            (inputs,) = input_lists
            _check(inputs, "scatter")
            self._check_count(inputs, "scatter", "scatter_list")
            _same_shapes(inputs, tuple(out.shape), "scatter", "scatter_list entry")
            x = jnp.stack([to_jax(t) for t in inputs])
        else:
            x = jnp.zeros((g, *tuple(out.shape)), to_jax_dtype(out.dtype))
        y = self._run(programs.scatter_body(opts.rootRank), x).reshape(tuple(out.shape))
        write(out, y)
        return self._work([y], [out], "scatter")

    # -- all-to-all ------------------------------------------------------------------------------------
    def alltoall(self, outputs, inputs, opts=None):
        _check([*outputs, *inputs], "all_to_all")
        self._check_count(outputs, "all_to_all", "output_tensor_list")
        self._check_count(inputs, "all_to_all", "input_tensor_list")
        shapes = {tuple(t.shape) for t in (*outputs, *inputs)}
        dtypes = {t.dtype for t in (*outputs, *inputs)}
        if len(dtypes) > 1:
            raise ValueError(f"tpu_dist all_to_all: tensors of several dtypes {sorted(map(str, dtypes))}")
        jnp = platform.jax().numpy
        if len(shapes) == 1:
            y = self._run(programs.all_to_all_body(), jnp.stack([to_jax(t) for t in inputs]))
            for j, o in enumerate(outputs):
                write(o, y[j])
            return self._work([y], list(outputs), "all_to_all")
        # chunks of different sizes: as one uneven all_to_all_single of the flattened chunks
        flat_in = jnp.concatenate([to_jax(t).reshape(-1) for t in inputs])
        y = self._uneven(flat_in, [t.numel() for t in inputs], [t.numel() for t in outputs], "all_to_all")
        start = 0
        for o in outputs:
            write(o, y[start : start + o.numel()].reshape(tuple(o.shape)))
            start += o.numel()
        return self._work([y], list(outputs), "all_to_all")

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        _check([output, input], "all_to_all_single")
        g = len(self._ranks)
        if output.dtype != input.dtype:
            raise ValueError(
                f"tpu_dist all_to_all_single: output is {output.dtype} but input is {input.dtype}"
            )
        if not output_split_sizes and not input_split_sizes:
            if input.shape[0] % g or output.shape != input.shape:
                raise ValueError(
                    f"tpu_dist all_to_all_single: without split sizes, input {tuple(input.shape)} and output "
                    f"{tuple(output.shape)} must be equal and dim 0 divisible by world_size ({g})"
                )
            x = to_jax(input).reshape((g, input.shape[0] // g, *tuple(input.shape[1:])))
            y = self._run(programs.all_to_all_body(), x).reshape(tuple(output.shape))
            write(output, y)
            return self._work([y], [output], "all_to_all_single")
        in_splits = list(input_split_sizes) or _even(input.shape[0], g, "input", "all_to_all_single")
        out_splits = list(output_split_sizes) or _even(output.shape[0], g, "output", "all_to_all_single")
        for name, splits, t in (("input", in_splits, input), ("output", out_splits, output)):
            if len(splits) != g or sum(splits) != t.shape[0] or min(splits) < 0:
                raise ValueError(
                    f"tpu_dist all_to_all_single: {name}_split_sizes {splits} must be {g} sizes >= 0 adding up to "
                    f"the {name}'s dim 0 ({t.shape[0]})"
                )
        row = tuple(input.shape[1:])
        y = self._uneven(to_jax(input), in_splits, out_splits, "all_to_all_single", row)
        write(output, y)
        return self._work([y], [output], "all_to_all_single")

    def _uneven(self, x, in_splits: list[int], out_splits: list[int], collective: str, row: tuple = ()):
        """all_to_all with chunks of different lengths along dim 0: pad every chunk to the longest chunk
        of any rank (agreed with one tiny pmax), exchange, cut the padding off."""
        jnp = platform.jax().numpy
        local_max = max([0, *in_splits, *out_splits])
        longest = int(self._run(programs.max_body(), jnp.asarray([local_max], dtype=jnp.int64))[0])
        if longest == 0:
            return jnp.zeros((0, *row), x.dtype)
        packed = _pack(tuple(in_splits), longest)(x)
        y = self._run(programs.all_to_all_body(), packed)
        return _unpack(tuple(out_splits))(y)

    # -- synchronization and point-to-point ------------------------------------------------------------
    def barrier(self, opts=None):
        jnp = platform.jax().numpy
        y = self._run(programs.all_reduce_body("sum", "int", len(self._ranks)), jnp.zeros((1,), jnp.int32))
        y.block_until_ready()
        return self._work([y], [], "barrier")

    def _peer(self, peer: int, collective: str) -> int:
        if not 0 <= peer < len(self._ranks) or peer == self._group_rank:
            raise ValueError(
                f"tpu_dist {collective}: peer {peer} must be another rank of this group of {len(self._ranks)}"
            )
        return self._ranks[peer]

    def send(self, tensors, dst: int, tag: int = 0):
        (t,) = tensors
        _check([t], "send")
        me, peer = self._ranks[self._group_rank], self._peer(dst, "send")
        x = to_jax(t)
        future = _direction(me, peer).submit(programs.run, (me, peer), programs.send_body(), x)
        return TpuWork(join_future(future), [t], "send")

    def recv(self, tensors, src: int, tag: int = 0):
        (t,) = tensors
        _check([t], "recv")
        me, peer = self._ranks[self._group_rank], self._peer(src, "recv")
        jnp = platform.jax().numpy
        x = jnp.zeros(tuple(t.shape), to_jax_dtype(t.dtype))
        future = _direction(peer, me).submit(programs.run, (peer, me), programs.send_body(), x)
        return TpuWork(join_future(future, lambda y: write(t, y)), [t], "recv")

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError(
            "tpu_dist recv: a receive from any source (src=None) is not supported; name the sender rank"
        )


def _even(n: int, g: int, what: str, collective: str) -> list[int]:
    if n % g:
        raise ValueError(
            f"tpu_dist {collective}: the {what}'s dim 0 ({n}) does not divide by world_size ({g})"
        )
    return [n // g] * g


@functools.cache
def _pack(splits: tuple, longest: int):
    """(sum(splits), ...) -> (G, longest, ...): chunk j padded with zeros to `longest` rows."""
    jax = platform.jax()
    jnp = jax.numpy

    def pack(x):
        chunks, start = [], 0
        for s in splits:
            chunk = x[start : start + s]
            pad = [(0, longest - s)] + [(0, 0)] * (x.ndim - 1)
            chunks.append(jnp.pad(chunk, pad))
            start += s
        return jnp.stack(chunks)

    return jax.jit(pack)


@functools.cache
def _unpack(splits: tuple):
    """(G, longest, ...) -> the first splits[j] rows of chunk j, concatenated."""
    jax = platform.jax()
    jnp = jax.numpy

    def unpack(y):
        return jnp.concatenate([y[j, :s] for j, s in enumerate(splits)])

    return jax.jit(unpack)

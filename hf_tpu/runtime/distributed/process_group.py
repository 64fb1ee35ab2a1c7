"""`ProcessGroupTPU`: torch.distributed's collectives on tpu tensors, as JAX programs over a global mesh.

Each call reads the caller's tpu tensors as JAX arrays, runs one cached program (`programs.py`) whose
collective spans the group's processes, and writes the result back into the caller's tensors in place
(through views, as torch expects). Dispatch is asynchronous, as every tpu op is: `Work.wait()` blocks on
the results. Point-to-point ops are in `p2p.py`.
"""

from __future__ import annotations

import functools
import json

import torch
import torch.distributed as dist

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.distributed import programs, reduce_ops
from hf_tpu.runtime.distributed.agreement import Agreement, peer_failure
from hf_tpu.runtime.distributed.arguments import (
    check_tensors,
    dtype_name,
    same_shapes,
    signature,
)
from hf_tpu.runtime.distributed.launch_env import BACKEND_NAME
from hf_tpu.runtime.distributed.p2p import PointToPoint
from hf_tpu.runtime.distributed.work import TpuWork, block_on
from hf_tpu.runtime.tensors.tensor import to_jax, write


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


class ProcessGroupTPU(PointToPoint, dist.ProcessGroup):
    """The tpu_dist process group of `ranks` (global ranks, in group-rank order)."""

    def __init__(self, group_rank: int, ranks: tuple[int, ...], store=None, timeout=None) -> None:
        super().__init__(group_rank, len(ranks))
        self._group_rank = group_rank
        self._ranks = tuple(ranks)
        # every collective first agrees on its arguments with the other ranks (agreement.py)
        self._agreement = Agreement(store, self._ranks, group_rank, timeout)
        self._current = "collective"  # the collective under way, for errors

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
        try:
            return programs.run(self._ranks, body, *arrays)
        except Exception as exc:  # noqa: BLE001 - a peer that died inside the exchange
            raise peer_failure(self._current, self._ranks, exc) from exc

    def _agree(self, collective: str, validate, consistent=None) -> list[dict] | None:
        """Run this rank's own checks (`validate()`, which returns its signature) and agree with the other
        ranks before anything is sent: a rank whose arguments fail, or signatures that do not fit together
        (`consistent(sigs)` returns why not; default: all equal), raise on every rank. Returns every rank's
        signature (None when the exchange is off: HF_TPU_DIST_CHECK=0 or a group of one)."""
        self._current = collective
        try:
            mine, local_error = validate(), None
        except (TypeError, ValueError) as exc:
            mine, local_error = {"error": f"{type(exc).__name__}: {exc}"}, exc
        if not self._agreement.active:
            if local_error is not None:
                raise local_error
            return None
        sigs = self._agreement.exchange(collective, mine)
        if local_error is not None:
            raise local_error
        mismatch = self._agreement.mismatch
        if len({s["op_name"] for s in sigs}) > 1:
            names = ", ".join(f"rank {self._ranks[r]} called {s['op_name']}" for r, s in enumerate(sigs))
            raise mismatch(collective, sigs, f"they called different collectives: {names}")
        failed = [self._ranks[r] for r, s in enumerate(sigs) if "error" in s]
        if failed:
            raise mismatch(
                collective,
                sigs,
                f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} passed bad arguments",
            )
        why = consistent(sigs) if consistent is not None else _all_equal(sigs)
        if why:
            raise mismatch(collective, sigs, why)
        return sigs

    def _kind(self, dtype: torch.dtype) -> str:
        return reduce_ops.kind(dtype)

    def _work(self, arrays: list, outputs: list, what: str) -> TpuWork:
        return TpuWork(block_on(arrays, lambda exc: peer_failure(what, self._ranks, exc)), outputs, what)

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

    def _reduce_sig(self, tensors, op, collective: str, **extra) -> dict:
        check_tensors(tensors, collective)
        names = {reduce_ops.resolve(op, t.dtype, collective)[0] for t in tensors}
        return signature(tensors, op=",".join(sorted(names)).upper(), **extra)

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        self._agree("all_reduce", lambda: self._reduce_sig(tensors, opts.reduceOp, "all_reduce"))
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

        def validate():
            self._check_root(opts.rootRank, "reduce")
            return self._reduce_sig(tensors, opts.reduceOp, "reduce", root=opts.rootRank)

        self._agree("reduce", validate)
        results = []
        for t in tensors:
            y = self._all_reduce(t, opts.reduceOp, "reduce")
            if self._group_rank == opts.rootRank:
                write(t, y)
            results.append(y)
        return self._work(results, list(tensors), "reduce")

    def _reduce_scatter(self, stacked, like: torch.Tensor, op, collective: str, in_shape=None):
        """`stacked` (G, *like.shape), or with `in_shape` (G, *like.shape) any array of as many elements,
        reduced over the ranks: this rank's part, shaped like `like`."""
        name, factor = reduce_ops.resolve(op, like.dtype, collective)
        body = programs.reduce_scatter_body(name, self._kind(like.dtype), len(self._ranks), factor)
        return self._run(programs.reshaped(body, in_shape, tuple(like.shape)), stacked)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()

        def validate():
            for out, inputs in zip(outputs, input_lists):
                check_tensors([out, *inputs], "reduce_scatter")
                self._check_count(inputs, "reduce_scatter", "input_list")
                same_shapes(inputs, tuple(out.shape), "reduce_scatter", "input")
                _same_dtypes([out, *inputs], "reduce_scatter")
            return self._reduce_sig(list(outputs), opts.reduceOp, "reduce_scatter")

        self._agree("reduce_scatter", validate)
        jnp = platform.jax().numpy
        results = []
        for out, inputs in zip(outputs, input_lists):
            stacked = jnp.stack([to_jax(t) for t in inputs])
            y = self._reduce_scatter(stacked, out, opts.reduceOp, "reduce_scatter")
            write(out, y)
            results.append(y)
        return self._work(results, list(outputs), "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        opts = opts or dist.ReduceScatterOptions()
        g = len(self._ranks)

        def validate():
            check_tensors([output, input], "reduce_scatter_tensor")
            _same_dtypes([output, input], "reduce_scatter_tensor")
            if input.numel() != output.numel() * g:
                raise ValueError(
                    f"tpu_dist reduce_scatter_tensor: input has {input.numel()} elements, output "
                    f"{output.numel()}: the input must hold world_size ({g}) times the output"
                )
            sig = self._reduce_sig([output], opts.reduceOp, "reduce_scatter_tensor")
            return {"input_shape": list(input.shape), "output_shape": sig.pop("shape"), **sig}

        self._agree("reduce_scatter_tensor", validate, _equal_except("input_shape"))
        y = self._reduce_scatter(
            to_jax(input), output, opts.reduceOp, "reduce_scatter_tensor", in_shape=(g, *tuple(output.shape))
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
        def validate():
            for outs, t in zip(output_lists, inputs):
                check_tensors([t, *outs], "all_gather")
                self._check_count(outs, "all_gather", "tensor_list")
                same_shapes(outs, tuple(t.shape), "all_gather", "output")
                _same_dtypes([t, *outs], "all_gather")
            return signature(list(inputs))

        self._agree("all_gather", validate)
        results = []
        for outs, t in zip(output_lists, inputs):
            y = self._gathered(t)
            for j, o in enumerate(outs):
                write(o, y[j])
            results.append(y)
        return self._work(results, [o for outs in output_lists for o in outs], "all_gather")

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        g = len(self._ranks)

        def validate():
            check_tensors([output, input], "all_gather_into_tensor")
            _same_dtypes([output, input], "all_gather_into_tensor")
            if output.numel() != input.numel() * g:
                raise ValueError(
                    f"tpu_dist all_gather_into_tensor: output has {output.numel()} elements (shape "
                    f"{tuple(output.shape)}), input {input.numel()} (shape {tuple(input.shape)}): the output "
                    f"must hold world_size ({g}) times the input"
                )
            return signature([input])

        self._agree("all_gather_into_tensor", validate)
        body = programs.reshaped(programs.all_gather_body(), None, tuple(output.shape))
        y = self._run(body, to_jax(input))
        write(output, y)
        return self._work([y], [output], "all_gather_into_tensor")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    def gather(self, output_lists, inputs, opts=None):
        opts = opts or dist.GatherOptions()
        is_root = self._group_rank == opts.rootRank

        def validate():
            self._check_root(opts.rootRank, "gather")
            (t,) = inputs
            check_tensors([t], "gather")
            if is_root:
                (outs,) = output_lists
                check_tensors(outs, "gather")
                self._check_count(outs, "gather", "gather_list")
                same_shapes(outs, tuple(t.shape), "gather", "gather_list entry")
                _same_dtypes([t, *outs], "gather")
            return signature([t], root=opts.rootRank)

        self._agree("gather", validate)
        (t,) = inputs
        y = self._gathered(t)
        if is_root:
            (outs,) = output_lists
            for j, o in enumerate(outs):
                write(o, y[j])
        return self._work([y], [o for outs in output_lists for o in outs], "gather")

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()

        def validate():
            check_tensors(tensors, "broadcast")
            self._check_root(opts.rootRank, "broadcast")
            return signature(tensors, root=opts.rootRank)

        self._agree("broadcast", validate)
        results = []
        for t in tensors:
            y = self._run(programs.pick_body(opts.rootRank), to_jax(t))
            if self._group_rank != opts.rootRank:
                write(t, y)
            results.append(y)
        return self._work(results, list(tensors), "broadcast")

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ScatterOptions()
        is_root = self._group_rank == opts.rootRank

        def validate():
            self._check_root(opts.rootRank, "scatter")
            (out,) = outputs
            check_tensors([out], "scatter")
            if is_root:
                (inputs,) = input_lists
                check_tensors(inputs, "scatter")
                self._check_count(inputs, "scatter", "scatter_list")
                same_shapes(inputs, tuple(out.shape), "scatter", "scatter_list entry")
                _same_dtypes([out, *inputs], "scatter")
            return signature([out], root=opts.rootRank)

        self._agree("scatter", validate)
        (out,) = outputs
        jnp = platform.jax().numpy
        g = len(self._ranks)
        if is_root:
            (inputs,) = input_lists
            x = jnp.stack([to_jax(t) for t in inputs])
        else:
            x = jnp.zeros((g, *tuple(out.shape)), to_jax_dtype(out.dtype))
        y = self._run(programs.scatter_body(opts.rootRank), x).reshape(tuple(out.shape))
        write(out, y)
        return self._work([y], [out], "scatter")

    # -- all-to-all ------------------------------------------------------------------------------------
    def alltoall(self, outputs, inputs, opts=None):
        def validate():
            check_tensors([*outputs, *inputs], "all_to_all")
            self._check_count(outputs, "all_to_all", "output_tensor_list")
            self._check_count(inputs, "all_to_all", "input_tensor_list")
            _same_dtypes([*outputs, *inputs], "all_to_all")
            return {
                "input_shapes": [list(t.shape) for t in inputs],
                "output_shapes": [list(t.shape) for t in outputs],
                "dtype": dtype_name(inputs[0].dtype),
            }

        sigs = self._agree("all_to_all", validate, self._exchange_fits("input_shapes", "output_shapes"))
        jnp = platform.jax().numpy
        if sigs is None:
            shapes = {tuple(t.shape) for t in (*outputs, *inputs)}
        else:
            shapes = {tuple(s) for sig in sigs for s in (*sig["input_shapes"], *sig["output_shapes"])}
        if len(shapes) == 1:
            y = self._run(programs.all_to_all_body(), jnp.stack([to_jax(t) for t in inputs]))
            for j, o in enumerate(outputs):
                write(o, y[j])
            return self._work([y], list(outputs), "all_to_all")
        # chunks of different sizes: as one uneven all_to_all_single of the flattened chunks
        flat_in = jnp.concatenate([to_jax(t).reshape(-1) for t in inputs])
        longest = None
        if sigs is not None:
            longest = max(_numel(s) for sig in sigs for s in (*sig["input_shapes"], *sig["output_shapes"]))
        y = self._uneven(
            flat_in, [t.numel() for t in inputs], [t.numel() for t in outputs], "all_to_all", longest=longest
        )
        start = 0
        for o in outputs:
            write(o, y[start : start + o.numel()].reshape(tuple(o.shape)))
            start += o.numel()
        return self._work([y], list(outputs), "all_to_all")

    def _exchange_fits(self, sent: str, received: str):
        """Consistency of an all-to-all: equal dtypes (and rows), and what rank i sends rank j (its
        `sent`[j]) is what rank j expects from rank i (its `received`[i])."""

        def consistent(sigs: list[dict]) -> str | None:
            why = _equal_except(sent, received)(sigs)
            if why:
                return why
            bad = []
            for i, si in enumerate(sigs):
                for j, sj in enumerate(sigs):
                    a, b = si[sent][j], sj[received][i]
                    if (_numel(a) if isinstance(a, list) else a) != (_numel(b) if isinstance(b, list) else b):
                        bad.append(
                            f"rank {self._ranks[i]} sends rank {self._ranks[j]} {_size(a)} but rank "
                            f"{self._ranks[j]} expects {_size(b)} from rank {self._ranks[i]}"
                        )
            return "; ".join(bad[:6]) if bad else None

        return consistent

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        g = len(self._ranks)

        def validate():
            check_tensors([output, input], "all_to_all_single")
            if output.dtype != input.dtype:
                raise ValueError(
                    f"tpu_dist all_to_all_single: output is {output.dtype} but input is {input.dtype}"
                )
            if tuple(output.shape[1:]) != tuple(input.shape[1:]):
                raise ValueError(
                    f"tpu_dist all_to_all_single: input {tuple(input.shape)} and output {tuple(output.shape)} "
                    "must have equal sizes past dim 0"
                )
            if not output_split_sizes and not input_split_sizes and output.shape != input.shape:
                raise ValueError(
                    f"tpu_dist all_to_all_single: without split sizes, input {tuple(input.shape)} and output "
                    f"{tuple(output.shape)} must have equal shapes"
                )
            in_splits = list(input_split_sizes) or _even(input.shape[0], g, "input", "all_to_all_single")
            out_splits = list(output_split_sizes) or _even(output.shape[0], g, "output", "all_to_all_single")
            for name, splits, t in (("input", in_splits, input), ("output", out_splits, output)):
                if len(splits) != g or sum(splits) != t.shape[0] or min(splits) < 0:
                    raise ValueError(
                        f"tpu_dist all_to_all_single: {name}_split_sizes {splits} must be {g} sizes >= 0 adding "
                        f"up to the {name}'s dim 0 ({t.shape[0]})"
                    )
            return {
                "input_split_sizes": in_splits,
                "output_split_sizes": out_splits,
                "row_shape": list(input.shape[1:]),
                "dtype": dtype_name(input.dtype),
            }

        sigs = self._agree(
            "all_to_all_single", validate, self._exchange_fits("input_split_sizes", "output_split_sizes")
        )
        in_splits = list(input_split_sizes) or [input.shape[0] // g] * g
        out_splits = list(output_split_sizes) or [output.shape[0] // g] * g
        if sigs is None:
            even = not output_split_sizes and not input_split_sizes
        else:  # one path for every rank: even only when every chunk of every rank has one length
            even = len({n for s in sigs for n in (*s["input_split_sizes"], *s["output_split_sizes"])}) == 1
        if even:
            blocks = (g, input.shape[0] // g, *tuple(input.shape[1:]))
            y = self._run(
                programs.reshaped(programs.all_to_all_body(), blocks, tuple(output.shape)), to_jax(input)
            )
            write(output, y)
            return self._work([y], [output], "all_to_all_single")
        longest = None
        if sigs is not None:
            longest = max(n for s in sigs for n in (*s["input_split_sizes"], *s["output_split_sizes"]))
        row = tuple(input.shape[1:])
        y = self._uneven(to_jax(input), in_splits, out_splits, "all_to_all_single", row, longest)
        write(output, y)
        return self._work([y], [output], "all_to_all_single")

    def _uneven(
        self,
        x,
        in_splits: list[int],
        out_splits: list[int],
        collective: str,
        row: tuple = (),
        longest: int | None = None,
    ):
        """all_to_all with chunks of different lengths along dim 0: pad every chunk to the longest chunk
        of any rank (known from the agreement, else agreed with one tiny pmax), exchange, cut the padding
        off."""
        jnp = platform.jax().numpy
        if longest is None:
            local_max = max([0, *in_splits, *out_splits])
            longest = int(self._run(programs.max_body(), jnp.asarray([local_max], dtype=jnp.int64))[0])
        if longest == 0:
            return jnp.zeros((0, *row), x.dtype)
        packed = _pack(tuple(in_splits), longest)(x)
        y = self._run(programs.all_to_all_body(), packed)
        return _unpack(tuple(out_splits))(y)

    # -- synchronization and point-to-point ------------------------------------------------------------
    def barrier(self, opts=None):
        self._agree("barrier", dict)
        jnp = platform.jax().numpy
        y = self._run(programs.all_reduce_body("sum", "int", len(self._ranks)), jnp.zeros((1,), jnp.int32))
        y.block_until_ready()
        return self._work([y], [], "barrier")


def _all_equal(sigs: list[dict]) -> str | None:
    return _equal_except()(sigs)


def _equal_except(*free: str):
    """A consistency check: every rank's signature equal, but for the fields `free`."""

    def consistent(sigs: list[dict]) -> str | None:
        keys = sorted({k for s in sigs for k in s if k not in free and k != "op_name"})
        differ = [k.replace("_", " ") for k in keys if len({json.dumps(s.get(k)) for s in sigs}) > 1]
        return f"{' and '.join(differ)} differ{'s' if len(differ) == 1 else ''}" if differ else None

    return consistent


def _same_dtypes(tensors, collective: str) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(
            f"tpu_dist {collective}: tensors of several dtypes ({', '.join(sorted(map(dtype_name, dtypes)))}); "
            "the tensors of one collective must share one dtype"
        )


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _size(x) -> str:
    return f"shape {tuple(x)}" if isinstance(x, list) else f"{x} rows"


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

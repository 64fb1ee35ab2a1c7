"""`torch.compile(model, backend="tpu")`: ATen FX graphs -> the same lowerings -> one `jax.jit`.

TorchDynamo captures the graph, `aot_autograd` lowers it to functional ATen (forward and backward),
and each graph is interpreted with the lowering table inside a single `jax.jit`, cached per input
shapes/dtypes. Parameters enter as the device buffers they already are (no per-call copies). A graph
that holds an op without a pure-JAX lowering runs op by op in tpu eager instead (one warning naming the
op; an error under `HF_TPU_COMPILE_STRICT=1`).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings

import torch
from torch._dynamo.backends.common import aot_autograd

from hf_tpu.runtime import platform, rng
from hf_tpu.runtime.dispatch import _cast_like, _Signature, op_failure
from hf_tpu.runtime.lowering_table import graph_lowering
from hf_tpu.runtime.tensor import to_jax, wrap

log = logging.getLogger("hf_tpu.compile")
_warned: set = set()
_lock = threading.Lock()
_RECOMPILE_WARN_AT = 8


class GraphLoweringMissing(NotImplementedError):
    pass


def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # keep ops we lower whole (one fused XLA op beats its decomposition)
    from hf_tpu.runtime.lowering_table import GRAPH_TABLE, TABLE

    for op in list(table):
        if op in TABLE or op in GRAPH_TABLE:
            del table[op]
    return table


def _spec(node) -> tuple | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return (tuple(int(s) for s in val.shape), val.dtype)
    if isinstance(val, list | tuple):
        return tuple(_spec_of(v) for v in val)
    return None


def _spec_of(val):
    if isinstance(val, torch.Tensor):
        return (tuple(int(s) for s in val.shape), val.dtype)
    return None


class GraphProgram:
    """One ATen FX graph interpreted with the lowering table; `run(*tensors)` executes it jitted."""

    def __init__(self, gm: torch.fx.GraphModule, name: str) -> None:
        self.gm = gm
        self.name = name
        self.missing = self._find_missing()
        self.n_random = sum(
            1
            for n in gm.graph.nodes
            if n.op == "call_function" and (lw := graph_lowering(n.target)) is not None and lw.random
        )
        self._jitted = None
        self._shapes_seen: set = set()
        if self.missing:
            self._views_to_reshapes()

    def _views_to_reshapes(self) -> None:
        """For op-by-op execution: eager outputs are contiguous where the traced fake tensors may not
        have been, so a `view` the graph planned on fake strides becomes a `reshape` (view when it can)."""
        aten = torch.ops.aten
        for node in self.gm.graph.nodes:
            if node.op == "call_function" and node.target in (aten.view.default, aten._unsafe_view.default):
                node.target = aten.reshape.default
        self.gm.recompile()

    def _find_missing(self) -> list[str]:
        missing = []
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            if not isinstance(target, torch._ops.OpOverload):
                continue  # Python arithmetic on sizes, getitem: evaluated as is
            if graph_lowering(target) is not None:
                continue
            missing.append(str(target))
        return missing

    def interpret(self, keys, *arrays):
        """Evaluate the graph on JAX values (traced under jit)."""
        jnp = platform.jax().numpy
        env = {}
        args = iter(arrays)
        key_iter = iter(keys)

        def fetch(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, list | tuple):
                return [fetch(x) for x in a]
            return a

        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(args)
            elif node.op == "call_function":
                target = node.target
                if not isinstance(target, torch._ops.OpOverload):
                    env[node] = target(
                        *(fetch(a) for a in node.args), **{k: fetch(v) for k, v in node.kwargs.items()}
                    )
                    continue
                lowering = graph_lowering(target)
                sig = _Signature(target)
                full = sig.normalize(
                    tuple(fetch(a) for a in node.args), {k: fetch(v) for k, v in node.kwargs.items()}
                )
                full = [_devicefree(v) for v in full]
                if lowering.random:
                    full = [next(key_iter), *full]
                try:
                    out = lowering.fn(*full)
                except Exception as exc:  # noqa: BLE001 - name the node
                    raise RuntimeError(
                        f"hf_tpu compile: lowering {target} failed in graph {self.name}: {exc}"
                    ) from exc
                env[node] = _cast_like(jnp, out, _spec(node))
            elif node.op == "output":
                outs = node.args[0]
                return tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outs)
            elif node.op == "get_attr":
                env[node] = to_jax(getattr(self.gm, node.target))
        raise RuntimeError("graph without output")

    def __call__(self, *args):
        if self.missing:
            return self.gm(*args)  # tpu eager, op by op
        jax = platform.jax()
        if self._jitted is None:
            self._jitted = jax.jit(self.interpret)
        arrays = []
        for a in args:
            if isinstance(a, torch.Tensor):
                arrays.append(to_jax(a) if a.device.type == "tpu" else _host(a))
            else:
                arrays.append(a)
        self._note_shapes(arrays)
        keys = [rng.next_key() for _ in range(self.n_random)]
        try:
            outs = self._jitted(keys, *arrays)
        except Exception as exc:  # noqa: BLE001
            raise op_failure(f"compiled graph {self.name}", list(args), [0] * len(args), exc) from exc
        out_specs = [_spec_of(v) for v in self._output_vals()]
        return [
            wrap(o, s[1] if s else None) if hasattr(o, "dtype") and hasattr(o, "shape") else o
            for o, s in zip(outs, out_specs)
        ]

    def _output_vals(self):
        for node in self.gm.graph.nodes:
            if node.op == "output":
                return [o.meta.get("val") if isinstance(o, torch.fx.Node) else None for o in node.args[0]]
        return []

    def _note_shapes(self, arrays) -> None:
        sig = tuple((tuple(a.shape), str(a.dtype)) for a in arrays if hasattr(a, "shape"))
        if sig in self._shapes_seen:
            return
        self._shapes_seen.add(sig)
        if len(self._shapes_seen) == _RECOMPILE_WARN_AT:
            warnings.warn(
                f"hf_tpu compile: graph {self.name} has been compiled for {_RECOMPILE_WARN_AT} different input "
                f"shapes (latest: {[s for s, _ in sig][:4]}...). Every new shape recompiles; pad inputs to a few "
                "bucket sizes (hf_tpu.compile(model, buckets=...)) to avoid a recompile storm.",
                stacklevel=3,
            )


def _devicefree(v):
    if isinstance(v, torch.device):
        return None
    return v


def _host(t: torch.Tensor):
    from hf_tpu.runtime.copy import host_to_jax

    return host_to_jax(t)


_counter = [0]


def _make_compiler(kind: str):
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        with _lock:
            _counter[0] += 1
            name = f"{kind}{_counter[0]}"
        program = GraphProgram(gm, name)
        if program.missing:
            missing = sorted(set(program.missing))
            if os.environ.get("HF_TPU_COMPILE_STRICT", "") == "1":
                raise GraphLoweringMissing(
                    f"hf_tpu compile: no graph lowering for {', '.join(missing)} in graph {name}"
                )
            key = tuple(missing)
            if key not in _warned:
                _warned.add(key)
                warnings.warn(
                    f"hf_tpu compile: graph {name} contains ops without a pure-JAX lowering ({', '.join(missing[:8])}); "
                    "this region runs op by op in tpu eager instead of as one compiled program.",
                    stacklevel=2,
                )
        return program

    return compiler


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The TorchDynamo backend registered as "tpu" (accepts the options transformers/diffusers pass)."""
    from torch._functorch.aot_autograd import make_boxed_func

    fw = _make_compiler("forward")
    bw = _make_compiler("backward")

    def boxed(compiler):
        def inner(gm, example_inputs):
            return make_boxed_func(compiler(gm, example_inputs))

        return inner

    return aot_autograd(
        fw_compiler=boxed(fw),
        bw_compiler=boxed(bw),
        decompositions=_decompositions(),
        keep_inference_input_mutations=False,
    )(gm, example_inputs)


def register_backend() -> None:
    from torch._dynamo import list_backends
    from torch._dynamo import register_backend as _register

    if "tpu" not in list_backends(exclude_tags=()):
        _register(name="tpu")(tpu_backend)

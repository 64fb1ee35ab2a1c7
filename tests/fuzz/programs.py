"""Random torch programs as Python source, run on CPU and on tpu, and the comparison of their results.

A `Program` is plain code: `repr(program)` is a runnable snippet (inputs from a seeded CPU generator, then
the ops, one a line), so a failing example that hypothesis shrinks reads as the program to paste into a
regression test. The same source runs on CPU (while generating, and as the reference) and on
tpu in Strict, DeferAndFuse and under `torch.compile(backend="tpu")`.
"""

from __future__ import annotations

import itertools
import linecache
from dataclasses import dataclass

import torch

_DTYPE_NAMES = {
    torch.float32: "torch.float32",
    torch.int64: "torch.int64",
    torch.int32: "torch.int32",
    torch.bool: "torch.bool",
}
_counter = itertools.count()


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def source(self) -> str:
        shape = repr(tuple(self.shape))
        if self.dtype == torch.float32:
            return f"torch.randn({shape}, generator=g)"
        if self.dtype == torch.bool:
            return f"torch.randint(0, 2, {shape}, generator=g).bool()"
        return f"torch.randint(-5, 6, {shape}, generator=g, dtype={_DTYPE_NAMES[self.dtype]})"


class Program:
    """Inputs made on CPU from `seed`, then `lines` (the body of `program`); `raises`: the last line raises.

    Not a dataclass on purpose: hypothesis prints a falsifying example with `repr`, which is the code."""

    def __init__(
        self, inputs: list[Input], seed: int, lines: list[str], outputs: list[str], raises: bool = False
    ):
        self.inputs = inputs
        self.seed = seed
        self.lines = lines
        self.outputs = outputs
        self.raises = raises

    def source(self) -> str:
        names = ", ".join(i.name for i in self.inputs)
        out = [
            "def make_inputs(device):",
            f"    g = torch.Generator().manual_seed({self.seed})",
            *(f"    {i.name} = {i.source()}" for i in self.inputs),
            f"    return [t.to(device) for t in ({names},)]",
            "",
            "",
            f"def program({names}):",
            f"    dev = {self.inputs[0].name}.device",
            *(f"    {line}" for line in self.lines),
            f"    return [{', '.join(self.outputs)}]",
        ]
        if self.raises:
            out.insert(len(out) - 2, "    # the next line raises on CPU")
        return "\n".join(out) + "\n"

    def __repr__(self) -> str:
        return "\n" + self.source()

    def compile(self):
        """(make_inputs, program) as functions; the source is registered with linecache for tracebacks."""
        return load(self.source())


def load(source: str):
    """(make_inputs, program) from a program's source (what `Program.source` prints)."""
    filename = f"<fuzz-program-{next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["make_inputs"], namespace["program"]


# ---------------------------------------------------------------------------------------------- running


class Raised:
    """A run that raised: the exception, kept for the report."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __repr__(self) -> str:
        return f"Raised({type(self.exc).__name__}: {str(self.exc).splitlines()[0] if str(self.exc) else ''})"


@dataclass
class Result:
    outputs: list[torch.Tensor]  # the returned tensors, then the inputs after the run, all on CPU
    strides: list[tuple[int, ...]]
    offsets: list[int]
    aliases: list[int]  # per tensor: the index of the first tensor sharing its storage (-1: empty storage)


def _storage_key(t: torch.Tensor):
    storage = t.untyped_storage()
    return None if storage.nbytes() == 0 else storage.data_ptr()


def _result(tensors: list[torch.Tensor]) -> Result:
    keys = [_storage_key(t) for t in tensors]
    first: dict = {}
    aliases = []
    for i, key in enumerate(keys):
        aliases.append(-1 if key is None else first.setdefault(key, i))
    return Result(
        outputs=[t.detach().cpu() for t in tensors],
        strides=[tuple(t.stride()) for t in tensors],
        offsets=[t.storage_offset() for t in tensors],
        aliases=aliases,
    )


def run(functions, device: str, mode: str = "strict"):
    """Run a loaded program on `device`: mode "strict", "defer" (DeferAndFuse) or "compiled"
    (`torch.compile` with backend "tpu"; on CPU with "aot_eager", PyTorch's own reference for what a
    compiled program raises).

    Returns a `Result`, or `Raised` when the program raised."""
    make_inputs, program = functions
    inputs = make_inputs(device)
    fn = program
    if mode == "compiled":
        backend = "tpu" if device == "tpu" else "aot_eager"
        fn = torch.compile(program, backend=backend, dynamic=False, fullgraph=False)
    try:
        if mode == "defer":
            with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                outputs = fn(*inputs)
                return _result(list(outputs) + inputs)
        outputs = fn(*inputs)
        return _result(list(outputs) + inputs)
    except Exception as exc:  # noqa: BLE001 - the property compares raising itself
        return Raised(exc)


# ------------------------------------------------------------------------------------------- comparing

FLOAT_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _defined_strides(t: torch.Tensor, strides) -> tuple:
    """Strides PyTorch defines: those of the dims longer than 1 (none for an empty tensor)."""
    if t.numel() == 0:
        return ()
    return tuple((d, s) for d, (n, s) in enumerate(zip(t.shape, strides)) if n > 1)


def assert_same(expected: Result, actual: Result, *, layout: bool = True, aliasing: bool = True) -> None:
    """Values, shapes and dtypes of every output; with `layout`, strides and storage offsets too; with
    `aliasing`, which outputs share a storage."""
    assert len(expected.outputs) == len(actual.outputs)
    for i, (e, a) in enumerate(zip(expected.outputs, actual.outputs)):
        where = f"output {i}"
        assert a.shape == e.shape, f"{where}: shape {tuple(a.shape)} != CPU {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"{where}: dtype {a.dtype} != CPU {e.dtype}"
        if e.dtype.is_floating_point:
            torch.testing.assert_close(
                a, e, equal_nan=True, msg=lambda m, w=where: f"{w}: {m}", **FLOAT_TOLERANCE
            )
        else:
            torch.testing.assert_close(a, e, rtol=0, atol=0, msg=lambda m, w=where: f"{w}: {m}")
        if layout:
            e_strides = _defined_strides(e, expected.strides[i])
            a_strides = _defined_strides(a, actual.strides[i])
            assert a_strides == e_strides, (
                f"{where}: strides {actual.strides[i]} != CPU {expected.strides[i]} (shape {tuple(e.shape)})"
            )
            if e.numel():
                assert actual.offsets[i] == expected.offsets[i], (
                    f"{where}: storage_offset {actual.offsets[i]} != CPU {expected.offsets[i]}"
                )
    if aliasing:
        assert actual.aliases == expected.aliases, (
            f"storage sharing differs (index of the first output on the same storage): "
            f"{actual.aliases} != CPU {expected.aliases}"
        )

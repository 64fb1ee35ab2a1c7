"""Hypothesis strategies for random torch programs (see `programs.Program`).

Each op is drawn from a family (views, elementwise and broadcasting, reductions, shape ops, in-place
writes through views, index ops), written as one line of Python, and run at once on the program's CPU
inputs: the CPU results give the shapes, dtypes and layouts the next ops are drawn against, and an op
that raises there is dropped (or, in a program drawn to end with an error, kept as its last line).
Choices shrink towards the most recent variable, the first op of a family and small sizes, so a shrunk
program stays short.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.fuzz.programs import Input, Program

# Computed outputs keep the layout PyTorch gives them (`(x.t() * 2).stride()` is (1, 4), as CPU's
# TensorIterator follows its input's layout; issue 22 part 5), so the generator leaves them as they are and
# everything downstream (a later `view`, aliasing of `reshape`) is compared. False makes such an output
# contiguous on the spot (`(...).contiguous()`).
FOLLOW_META_STRIDES = True

# CPU's memory-overlap errors ("unsupported operation: some elements of the input tensor and the written-to
# tensor refer to a single memory location", "... more than one element of the written-to tensor ..."):
# tpu makes the same checks (hf_tpu/runtime/tensors/overlap.py), so a program may end with one like any
# other error, and `inplace_op` sometimes writes into an expanded view (`_REPEATING_KINDS`).

DTYPES = [torch.float32, torch.int64, torch.bool, torch.int32]
DTYPE_WEIGHTS = [14, 3, 2, 1]
FLOAT_LITERALS = [0.5, -1.5, 2.0, 0.0, 3.25]
INT_LITERALS = [1, -2, 3, 0, 2]


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype)


class _State:
    """The variables so far (name -> CPU tensor), the program's lines and the namespace running them."""

    def __init__(self, draw, inputs: list[Input], seed: int):
        self.draw = draw
        self.inputs = inputs
        self.env: dict = {"torch": torch, "dev": torch.device("cpu")}
        make_inputs, _ = Program(inputs, seed, [], []).compile()
        for i, t in zip(inputs, make_inputs("cpu")):
            self.env[i.name] = t
        self.names = [i.name for i in inputs]
        self.lines: list[str] = []
        self.outputs: list[str] = []

    # -- drawing helpers ------------------------------------------------------------------------------

    def var(self, pred=lambda t: True):
        """A variable name satisfying `pred`, shrinking towards the newest one; None when there is none."""
        names = [n for n in reversed(self.names) if pred(self.env[n])]
        if not names:
            return None
        return names[self.draw(st.integers(0, len(names) - 1))]

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    def int(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def flag(self, p_true_in=4):
        """True about once in `p_true_in` draws (shrinks to False)."""
        return self.draw(st.integers(0, p_true_in - 1)) == p_true_in - 1

    def dim(self, t, extra=0):
        n = t.dim() + extra
        if n == 0:
            return None
        d = self.int(0, n - 1)
        return d - n if self.flag(5) else d

    def scalar(self, t):
        if t.dtype.is_floating_point:
            return repr(self.pick(FLOAT_LITERALS))
        if t.dtype == torch.bool:
            return self.pick(["True", "False"])
        return repr(self.pick(INT_LITERALS))

    def index_list(self, size, n, unique=False):
        if unique:
            n = min(n, size)
            perm = self.draw(st.permutations(list(range(size))))
            return list(perm[:n])
        return [self.int(0, size - 1) for _ in range(n)]

    def tensor_literal(self, values, dtype="torch.int64"):
        return f"torch.tensor({values!r}, device=dev, dtype={dtype})"

    def new_name(self):
        return f"v{len(self.names) - len(self.inputs)}"


# ---------------------------------------------------------------------------------------------- views


def _basic_index(s: _State, t):
    """An index expression of ints, slices, None and Ellipsis (a view of `t`)."""
    parts = []
    dims = list(range(t.dim()))
    use_ellipsis = t.dim() > 0 and s.flag(5)
    n = s.int(0, t.dim()) if dims else 0
    for d in dims[:n]:
        size = t.shape[d]
        kind = s.pick(["slice", "int", "full", "none"])
        if kind == "int" and size > 0:
            i = s.int(-size, size - 1)
            parts.append(str(i))
        elif kind == "slice":
            start = s.int(-size, size) if size else 0
            stop = s.int(-size, size) if size else 0
            step = s.int(1, 3)
            parts.append(f"{start}:{stop}" + (f":{step}" if step > 1 else ""))
        elif kind == "none":
            parts.append("None")
            parts.append(":")
        else:
            parts.append(":")
    if use_ellipsis:
        parts.append("...")
        if s.flag(3):
            parts.append("None")
    if not parts:
        parts = ["..."]
    return ", ".join(parts)


def _shape_of_numel(s: _State, numel: int, max_dims=4):
    """A random shape with `numel` elements (a -1 sometimes)."""
    if numel == 0:
        return [0, s.int(1, 3)]
    shape = []
    rest = numel
    for _ in range(s.int(0, max_dims - 1)):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = s.pick(divisors)
        shape.append(d)
        rest //= d
    shape.append(rest)
    if s.flag(3):
        shape[s.int(0, len(shape) - 1)] = -1
    return shape


def view_op(s: _State):
    a = s.var()
    t = s.env[a]
    nd = t.dim()
    kind = s.pick(
        [
            "index",
            "transpose",
            "permute",
            "unsqueeze",
            "expand",
            "narrow",
            "select",
            "view",
            "as_strided",
            "squeeze",
            "reshape",
            "flatten",
            "diagonal",
            "chunk",
            "unfold",
            "unbind",
            "t",
            "view_dtype",
        ]
    )
    if kind == "index":
        return f"{a}[{_basic_index(s, t)}]"
    if kind == "transpose" and nd >= 2:
        return f"{a}.transpose({s.dim(t)}, {s.dim(t)})"
    if kind == "t" and nd <= 2:
        return f"{a}.t()" if s.flag(2) else f"{a}.T" if nd == 2 else f"{a}.t()"
    if kind == "permute" and nd >= 2:
        return f"{a}.permute{tuple(s.draw(st.permutations(list(range(nd)))))}"
    if kind == "unsqueeze":
        return f"{a}.unsqueeze({s.int(-nd - 1, nd)})"
    if kind == "squeeze":
        return f"{a}.squeeze({s.dim(t)})" if nd and s.flag(2) else f"{a}.squeeze()"
    if kind == "expand":
        new = [s.int(1, 4) if n == 1 else (-1 if s.flag(2) else n) for n in t.shape]
        lead = [s.int(1, 3) for _ in range(s.int(0, 2 if nd < 4 else 0))]
        return f"{a}.expand({', '.join(map(str, lead + new))})" if lead + new else f"{a}.expand(())"
    if kind == "narrow" and nd:
        d = s.dim(t)
        size = t.shape[d]
        start = s.int(0, size)
        return f"{a}.narrow({d}, {start}, {s.int(0, size - start)})"
    if kind == "select" and nd and t.numel():
        d = s.dim(t)
        return f"{a}.select({d}, {s.int(-t.shape[d], t.shape[d] - 1)})"
    if kind in ("view", "reshape"):
        shape = _shape_of_numel(s, t.numel())
        return f"{a}.{kind}({', '.join(map(str, shape))})" if shape else f"{a}.{kind}(())"
    if kind == "flatten" and nd:
        start = s.int(0, nd - 1)
        return f"{a}.flatten({start}, {s.int(start, nd - 1)})" if s.flag(2) else f"{a}.flatten()"
    if kind == "as_strided":
        storage = t.untyped_storage().nbytes() // t.element_size()
        if storage == 0:
            return None
        ndim = s.int(0, 3)
        size = [s.int(1, 4) for _ in range(ndim)]
        stride = [s.int(0, 5) for _ in range(ndim)]
        offset = s.int(0, storage - 1)
        if offset + sum((n - 1) * st_ for n, st_ in zip(size, stride)) >= storage:
            return None
        return f"{a}.as_strided({tuple(size)}, {tuple(stride)}, {offset})"
    if kind == "diagonal" and nd >= 2:
        d0 = s.dim(t)
        d1 = s.dim(t)
        return f"{a}.diagonal({s.int(-2, 2)}, {d0}, {d1})"
    if kind == "chunk" and nd:
        d = s.dim(t)
        k = s.int(1, 3)
        n = len(t.chunk(k, d)) if t.shape[d] else 1
        return f"{a}.chunk({k}, {d})[{s.int(0, n - 1)}]"
    if kind == "unbind" and nd and t.shape[0]:
        d = s.dim(t)
        if not t.shape[d]:
            return None
        return f"{a}.unbind({d})[{s.int(0, t.shape[d] - 1)}]"
    if kind == "unfold" and nd:
        d = s.dim(t)
        n = t.shape[d]
        size, step = s.int(1, max(1, n)), s.int(1, 2)
        if n and (n - size) % step:
            # windows that leave elements out: PyTorch's own compiled programs (aot_eager, inductor)
            # zero those elements when a write goes through the view, where eager keeps them
            step = 1
        return f"{a}.unfold({d}, {size}, {step})"
    if kind == "view_dtype" and t.dtype == torch.int32:
        # int32 -> float32 only: float bits read as ints would turn a 1-ulp difference into a mismatch
        return f"{a}.view(torch.float32)"
    return None


# ---------------------------------------------------------------------------------------- computations

_FLOAT_UNARY = [
    "torch.tanh({a})",
    "{a}.sigmoid()",
    "{a}.relu()",
    "-{a}",
    "{a}.abs()",
    "torch.sin({a})",
    "{a}.cos()",
    "{a}.clamp(-1.5, 2.0)",
    "{a}.clamp(max=3.0).exp()",
    "{a}.abs().sqrt()",
    "{a}.square()",
    "torch.floor({a})",
    "{a}.sign()",
    "(({a}) * 4).round()",
    "torch.nn.functional.gelu({a})",
    "({a}.abs() + 1).log()",
    "({a}.abs() + 1).reciprocal()",
    "{a}.clone()",
    "{a}.contiguous()",
    "{a}.nan_to_num().clamp(-1e6, 1e6).long()",
    "{a}.bool()",
    "{a}.nan_to_num().clamp(-1e6, 1e6).to(torch.int32)",
    "{a} * 0.5",
    "{a} + 1",
    "torch.nan_to_num({a}.log())",
]
_INT_UNARY = [
    "-{a}",
    "{a}.abs()",
    "{a} * 3",
    "{a} // 2",
    "{a} % 3",
    "{a}.clamp(-2, 2)",
    "~{a}",
    "{a}.sign()",
    "{a} + 1",
    "{a}.float()",
    "{a}.bool()",
    "{a} + 0.5",
    "{a}.clone()",
    "{a}.to(torch.int64)",
    "{a} >> 1",
]
_BOOL_UNARY = ["~{a}", "{a}.logical_not()", "{a}.int()", "{a}.float()", "{a} + 1", "{a}.clone()"]
_BINARY_SCALAR = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "{a} > {b}", "{a} == {b}", "{a} <= {b}", "{a} ** 2"]
_BINARY = [
    "{a} + {b}",
    "{a} * {b}",
    "{a} - {b}",
    "torch.maximum({a}, {b})",
    "torch.minimum({a}, {b})",
    "{a} > {b}",
    "{a} == {b}",
    "{a} != {b}",
    "torch.where({a} > 0, {a}, {b})",
    "{a} / ({b}.abs() + 1)",
    "{a} & {b}",
    "{a} | {b}",
    "torch.logical_and({a}, {b})",
    "{a}.add({b}, alpha=2)",
]


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return False
    return True


def unary_op(s: _State):
    a = s.var()
    t = s.env[a]
    table = (
        _FLOAT_UNARY if t.dtype.is_floating_point else _BOOL_UNARY if t.dtype == torch.bool else _INT_UNARY
    )
    return s.pick(table).format(a=a)


def binary_op(s: _State):
    a = s.var()
    t = s.env[a]
    if s.flag(6):
        b = s.scalar(t) if s.flag(2) else repr(s.pick(FLOAT_LITERALS + INT_LITERALS))
        return s.pick(_BINARY_SCALAR).format(a=a, b=f"({b})" if b.startswith("-") else b)
    if s.flag(8):
        b = s.var()  # anything: often not broadcastable, an error to share with CPU
    else:
        b = s.var(lambda u: _broadcasts(t, u))
    return s.pick(_BINARY).format(a=a, b=b)


def reduction_op(s: _State):
    a = s.var()
    t = s.env[a]
    d = s.dim(t)
    keep = ", keepdim=True" if s.flag(3) else ""
    if d is None:
        return s.pick([f"{a}.sum()", f"{a}.amax()" if t.numel() else f"{a}.sum()", f"{a}.any()"])
    nonempty = t.shape[d] > 0
    options = [f"{a}.sum({d}{keep})", f"{a}.sum()", f"{a}.cumsum({d})", f"{a}.any({d}{keep})"]
    if nonempty:
        options += [f"{a}.amax({d}{keep})", f"{a}.amin({d})", f"{a}.max({d}{keep}).values", f"{a}.all()"]
        if t.dtype != torch.bool:
            options += [f"{a}.argmax({d}{keep})", f"{a}.argmin({d})"]
    if t.dtype.is_floating_point:
        options += [f"{a}.mean({d}{keep})", f"{a}.softmax({d})", f"{a}.log_softmax({d})", f"{a}.norm()"]
        if t.shape[d] > 1:
            options += [f"{a}.std({d})", f"{a}.var({d}, keepdim=True)"]
    if nonempty and t.dtype != torch.bool:
        options += [f"{a}.sort({d}).values", f"{a}.topk({s.int(1, t.shape[d])}, {d}).values"]
    return s.pick(options)


def shape_op(s: _State):
    a = s.var()
    t = s.env[a]
    nd = t.dim()
    kind = s.pick(["cat", "stack", "flip", "roll", "tril", "pad", "repeat", "matmul", "where", "masked_fill"])
    if kind == "cat" and nd:
        d = s.dim(t)
        shape = list(t.shape)
        b = s.var(
            lambda u: (
                u.dim() == nd
                and [n for i, n in enumerate(u.shape) if i != d % nd] == shape[: d % nd] + shape[d % nd + 1 :]
            )
        )
        return f"torch.cat([{a}, {b}], {d})"
    if kind == "stack":
        b = s.var(lambda u: u.shape == t.shape)
        return f"torch.stack([{a}, {b}], {s.int(-nd - 1, nd)})"
    if kind == "flip" and nd:
        return f"{a}.flip({s.dim(t)})"
    if kind == "roll" and nd:
        return f"{a}.roll({s.int(-3, 3)}, {s.dim(t)})"
    if kind == "tril" and nd >= 2:
        return f"{a}.{s.pick(['tril', 'triu'])}({s.int(-1, 1)})"
    if kind == "pad" and nd and t.dtype != torch.bool:
        return f"torch.nn.functional.pad({a}, ({s.int(0, 2)}, {s.int(0, 2)}), value={s.scalar(t)})"
    if kind == "repeat":
        reps = [s.int(1, 2) for _ in range(nd + s.int(0, 1))]
        return f"{a}.repeat({', '.join(map(str, reps))})" if reps else f"{a}.repeat(())"
    if kind == "matmul" and nd and t.dtype.is_floating_point:
        if nd >= 2 and s.flag(2):
            return f"{a} @ {a}.mT"
        b = s.var(
            lambda u: (
                u.dtype == t.dtype and u.dim() >= 1 and u.shape[-2 if u.dim() >= 2 else 0] == t.shape[-1]
            )
        )
        return f"{a} @ {b}" if b else None
    if kind == "where":
        b = s.var(lambda u: _broadcasts(t, u))
        return f"torch.where({a} > 0, {a}, {b})" if t.dtype != torch.bool else f"torch.where({a}, {b}, 0)"
    if kind == "masked_fill":
        m = s.var(
            lambda u: (
                u.dtype == torch.bool
                and _broadcasts(t, u)
                and torch.broadcast_shapes(t.shape, u.shape) == t.shape
            )
        )
        if m is None:
            return f"{a}.masked_fill({a} > 0, {s.scalar(t)})" if t.dtype != torch.bool else None
        return f"{a}.masked_fill({m}, {s.scalar(t)})"
    return None


def index_op(s: _State):
    """Advanced indexing: index_select, gather, a[tensor], take_along_dim."""
    a = s.var(lambda u: u.dim() > 0 and u.numel() > 0)
    if a is None:
        return None
    t = s.env[a]
    d = s.dim(t)
    size = t.shape[d]
    idx = s.tensor_literal(s.index_list(size, s.int(1, 4)))
    kind = s.pick(["index_select", "getitem", "gather", "getitem2"])
    if kind == "index_select":
        return f"{a}.index_select({d}, {idx})"
    if kind == "getitem":
        if d % t.dim() == 1 and 1 in t.shape and not t.is_contiguous():
            return (
                None  # its output strides differ from CPU's (test_regressions: INDEX_LAYOUT_AT_SIZE_ONE_DIMS)
            )
        return f"{a}[{idx}]" if d % t.dim() == 0 else f"{a}[:, {idx}]" if d % t.dim() == 1 else None
    if kind == "getitem2" and t.dim() >= 2:
        i0 = s.index_list(t.shape[0], 2)
        i1 = s.index_list(t.shape[1], 2)
        return f"{a}[{s.tensor_literal(i0)}, {s.tensor_literal(i1)}]"
    if kind == "gather":
        shape = [s.int(1, n) for n in t.shape]
        values = torch.randint(0, size, shape, generator=torch.Generator().manual_seed(s.int(0, 99))).tolist()
        return f"{a}.gather({d}, {s.tensor_literal(values)})"
    return None


# ------------------------------------------------------------------------------------------- in place


def _cast_source(s: _State, dest, b: str) -> str:
    """Variable `b` as the source of a write into `dest`: NaN, inf and huge floats written into an integer
    tensor are undefined (CPU gives INT64_MIN, XLA 0), so such a source is made finite and small first."""
    if s.env[b].dtype.is_floating_point and not dest.dtype.is_floating_point and dest.dtype != torch.bool:
        return f"{b}.nan_to_num().clamp(-1e6, 1e6)"
    return b


def _writable(t) -> bool:
    """In-place writes are defined: no two elements share memory."""
    return t.numel() > 0 and torch._debug_has_internal_overlap(t) == 0


def _repeats(t) -> bool:
    """Some elements share memory (an expanded view): CPU refuses most writes into it."""
    return t.numel() > 0 and torch._debug_has_internal_overlap(t) == 1


# writes into a destination that repeats elements: CPU refuses most (an overlap error); fill_/zero_ write one
# value; setitem, masked_fill_, index_fill_ and index_put_ write only the positions they select, the last
# write to a shared element winning, which tpu follows (hf_tpu/runtime/tensors/repeating.py; issue 22)
_REPEATING_KINDS = [
    "add_",
    "mul_",
    "copy_",
    "setitem",
    "fill_",
    "unary_",
    "index_add_",
    "index_copy_",
    "index_fill_",
    "masked_fill_",
    "scatter_",
    "sub_",
    "index_put_",
]


def inplace_op(s: _State):
    """A write into an existing variable (an input, a view, a result): returns the statement."""
    a = s.var(_repeats) if s.flag(8) else None
    repeating = a is not None
    if not repeating:
        a = s.var(_writable)
    if a is None:
        return None
    t = s.env[a]
    nd = t.dim()
    kinds = [
        "add_",
        "mul_",
        "copy_",
        "setitem",
        "fill_",
        "unary_",
        "index_add_",
        "index_copy_",
        "index_fill_",
        "masked_fill_",
        "scatter_",
        "sub_",
        "index_put_",
    ]
    kind = s.pick(_REPEATING_KINDS if repeating else kinds)

    def operand():
        if s.flag(5):
            return s.scalar(t)
        if s.flag(10):
            return s.var()  # anything: maybe not broadcastable or of a wider dtype, an error to share
        return s.var(lambda u: _broadcasts(t, u) and torch.broadcast_shapes(t.shape, u.shape) == t.shape)

    if kind in ("add_", "mul_", "sub_"):
        b = operand()
        return f"{a}.{kind}({b})" if b else None
    if kind == "copy_":
        b = operand()
        return f"{a}.copy_({_cast_source(s, t, b)})" if b in s.env else None
    if kind == "fill_":
        return f"{a}.fill_({s.scalar(t)})" if s.flag(2) else f"{a}.zero_()"
    if kind == "unary_":
        if t.dtype.is_floating_point:
            return f"{a}.{s.pick(['relu_', 'neg_', 'abs_', 'tanh_', 'sigmoid_'])}()"
        if t.dtype == torch.bool:
            return f"{a}.logical_not_()"
        return f"{a}.{s.pick(['neg_', 'abs_'])}()" if s.flag(2) else f"{a}.clamp_(-1, 2)"
    if kind == "setitem":
        index = _basic_index(s, t)
        try:
            target = eval(f"{a}[{index}]", s.env)
        except Exception:  # noqa: BLE001 - not a valid index: let the statement raise
            return f"{a}[{index}] = {s.scalar(t)}"
        if s.flag(3):
            return f"{a}[{index}] = {s.scalar(t)}"
        b = s.var(
            lambda u: _broadcasts(target, u) and torch.broadcast_shapes(target.shape, u.shape) == target.shape
        )
        return f"{a}[{index}] = {_cast_source(s, t, b) if b else s.scalar(t)}"
    if nd == 0:
        return None
    d = s.dim(t)
    size = t.shape[d]
    if kind in ("index_add_", "index_copy_"):
        idx = s.index_list(size, s.int(1, 3), unique=kind == "index_copy_")
        shape = list(t.shape)
        shape[d] = len(idx)
        src = s.var(lambda u: list(u.shape) == shape and u.dtype == t.dtype)
        if src is None:
            src = f"torch.full({tuple(shape)}, {s.scalar(t)}, device=dev, dtype={_dtype(t)})"
        if kind == "index_add_" and t.dtype == torch.bool:
            return None
        return f"{a}.{kind}({d}, {s.tensor_literal(idx)}, {src})"
    if kind == "index_fill_":
        return f"{a}.index_fill_({d}, {s.tensor_literal(s.index_list(size, s.int(1, 3)))}, {s.scalar(t)})"
    if kind == "masked_fill_":
        m = s.var(
            lambda u: (
                u.dtype == torch.bool
                and _broadcasts(t, u)
                and torch.broadcast_shapes(t.shape, u.shape) == t.shape
            )
        )
        return f"{a}.masked_fill_({m}, {s.scalar(t)})" if m else None
    if kind == "scatter_":
        shape = [s.int(1, n) for n in t.shape]
        values = torch.randint(0, size, shape, generator=torch.Generator().manual_seed(s.int(0, 99))).tolist()
        return f"{a}.scatter_({d}, {s.tensor_literal(values)}, {s.scalar(t)})"
    if kind == "index_put_" and t.dim() >= 1:
        idx = s.index_list(t.shape[0], s.int(1, 3), unique=True)
        return f"{a}[{s.tensor_literal(idx)}] = {s.scalar(t)}"
    return None


FAMILIES = {
    "view": (view_op, True),
    "unary": (unary_op, False),
    "binary": (binary_op, False),
    "inplace": (inplace_op, None),
    "reduction": (reduction_op, False),
    "shape": (shape_op, False),
    "index": (index_op, False),
}
FAMILY_ORDER = ["view", "binary", "inplace", "unary", "reduction", "shape", "index"]


# ----------------------------------------------------------------------------------------- programs


@st.composite
def inputs(draw, name: str):
    dtype = draw(st.sampled_from(sum(([d] * w for d, w in zip(DTYPES, DTYPE_WEIGHTS)), [])))
    # small sizes from a small set: the per-op executables repeat across programs (compile time rules)
    ndim = draw(st.integers(0, 3)) + (draw(st.integers(0, 7)) == 7)
    shape = tuple(draw(st.integers(1, 4)) if draw(st.integers(0, 15)) else 0 for _ in range(ndim))
    return Input(name, shape, dtype)


def _run_line(s: _State, line: str):
    exec(compile(line, "<fuzz-line>", "exec"), s.env)


@st.composite
def programs(draw, min_ops: int = 5, max_ops: int = 40, errors: bool = True):
    """A `Program` of `min_ops`..`max_ops` ops; with `errors`, about one in eight ends with a line that
    raises on CPU (`program.raises`)."""
    n_inputs = draw(st.integers(1, 3))
    ins = [draw(inputs(f"x{i}")) for i in range(n_inputs)]
    seed = draw(st.integers(0, 2**16))
    s = _State(draw, ins, seed)
    n_ops = draw(st.integers(min_ops, max_ops))
    end_with_error = errors and draw(st.integers(0, 7)) == 7
    raises = False
    attempts = 0
    while len(s.lines) < n_ops and attempts < 4 * n_ops:
        attempts += 1
        family = draw(st.sampled_from(FAMILY_ORDER))
        make, is_view = FAMILIES[family]
        expr = make(s)
        if expr is None:
            continue
        statement = family == "inplace"
        name = s.new_name()
        line = expr if statement else f"{name} = {expr}"
        try:
            _run_line(s, line)
        except Exception:  # noqa: BLE001 - invalid on CPU: drop it, or end the program with it
            if end_with_error:
                s.lines.append(line)
                raises = True
                break
            continue
        if not statement:
            result = s.env[name]
            if not isinstance(result, torch.Tensor):
                continue
            if not is_view and not FOLLOW_META_STRIDES and not result.is_contiguous():
                line = f"{name} = ({expr}).contiguous()"
                _run_line(s, line)
            s.names.append(name)
            s.outputs.append(name)
        s.lines.append(line)
    if len(s.lines) < min_ops and not raises:
        # too few valid ops drawn: pad with simple ones that always apply
        while len(s.lines) < min_ops:
            name = s.new_name()
            line = f"{name} = {s.names[-1]}.clone()"
            _run_line(s, line)
            s.names.append(name)
            s.outputs.append(name)
            s.lines.append(line)
    return Program(inputs=ins, seed=seed, lines=s.lines, outputs=s.outputs, raises=raises)

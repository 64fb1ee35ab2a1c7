"""`as_strided` in a compiled graph reads the storage its input lies on, as on CPU
(hf_tpu/runtime/compile/strided_reads.py). Before, the lowering gathered from the view's own values:
`x[1:].as_strided((2,), (1,), 0)` gave x[1, 0:2] instead of x[0, 0:2], silently."""

from __future__ import annotations

import warnings

import pytest
import torch

X = torch.arange(16.0).reshape(4, 4)

CASES = {
    "slice": lambda x: x[1:].as_strided((2,), (1,), 0) * 1,
    "transpose": lambda x: x.t().as_strided((2, 2), (1, 4), 1) + 0,
    "column_slice": lambda x: x[:, 1:].as_strided((3,), (5,), 1) * 1,
    "empty_diagonal": lambda x: x[:1, :1].diagonal(-1).as_strided((), (), 0) + 0,
    "view_of_a_result": lambda x: (x * 2).t()[1:].as_strided((3,), (4,), 1) + 0,
    "chain_of_as_strided": lambda x: x[2:].as_strided((2, 2), (4, 1), 1).as_strided((3,), (1,), 2) * 1,
    "fresh_value": lambda x: (x + 1).as_strided((2, 3), (3, 1), 2) * 1,
}


@pytest.mark.parametrize("name", CASES)
def test_compiled_as_strided_of_a_view_equals_cpu(name):
    fn = CASES[name]
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one program: no op-by-op fallback warning
        out = torch.compile(fn, backend="tpu", fullgraph=True)(X.to("tpu"))
    torch.testing.assert_close(out.cpu(), fn(X), rtol=0, atol=0)


@pytest.mark.parametrize(
    "make_input",
    [lambda x: x.view(-1)[4:], lambda x: x.t()],
    ids=["input_is_an_offset_view", "input_is_transposed"],
)
@pytest.mark.parametrize("offset", [0, 5])
def test_as_strided_of_a_graph_input_view_reads_its_storage(make_input, offset):
    """Reads outside the input's values (offset 0 of a view starting at 4) run op by op, with the
    warning that says so; reads inside are one program."""

    def fn(v):
        return v.as_strided((2,), (1,), offset) * 1

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(fn, backend="tpu")(make_input(X.to("tpu")))
    torch.testing.assert_close(out.cpu(), fn(make_input(X)), rtol=0, atol=0)
    outside = any("reading storage outside" in str(w.message) for w in caught)
    offset_view = make_input(X).storage_offset() > 0
    assert outside == (offset_view and offset == 0), [str(w.message) for w in caught]

"""A compiled graph's input arrays (`tensors/graph_inputs.py`): with the C++ extension the arguments that
read a whole payload are answered in one call; every other kind takes `to_jax`'s path. Either way each
array holds the argument's value (compared with the same tensor on CPU)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.tensors import graph_inputs


def _args():
    """(tpu arguments, their CPU values): whole tensors, every kind of view, and non-tensors."""
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    ints = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    complex_ = torch.randn(3, dtype=torch.complex64)
    cpu = [
        base,
        ints,
        base.t(),  # not contiguous
        base[1:],  # offset
        base.view(6, 4),  # another shape of the whole storage
        base.view(torch.int32),  # another dtype of the storage's bytes
        torch.randn(0, 3),
        complex_,
    ]
    tpu = [t.to("tpu") for t in (base, ints)]
    tpu += [tpu[0].t(), tpu[0][1:], tpu[0].view(6, 4), tpu[0].view(torch.int32), cpu[6].to("tpu")]
    tpu.append(complex_.to("tpu").conj())  # a conj bit: its value is computed
    cpu[-1] = complex_.conj().resolve_conj()
    tpu.append(torch.ones(2, 2))  # a CPU tensor: copied to the device
    cpu.append(torch.ones(2, 2))
    tpu += [3, 2.5, None]
    cpu += [3, 2.5, None]
    return tpu, cpu


def _check(arrays, cpu):
    assert len(arrays) == len(cpu)
    for got, want in zip(arrays, cpu):
        if isinstance(want, torch.Tensor):
            np.testing.assert_array_equal(np.asarray(got), want.numpy())
            assert tuple(got.shape) == tuple(want.shape)
        else:
            assert got == want


def test_each_argument_kind_has_its_value():
    tpu, cpu = _args()
    _check(graph_inputs.arrays_of(tuple(tpu)), cpu)


def test_whole_tensors_pass_their_payload_itself():
    """No copy and no read: a parameter's array is its storage's payload (what donation relies on)."""
    tpu, _ = _args()
    arrays = graph_inputs.arrays_of(tuple(tpu))
    for i in (0, 1):
        payload = REGISTRY._payloads[tpu[i].untyped_storage().data_ptr()]
        assert arrays[i] is payload.array


def test_never_written_and_pending_values():
    """torch.empty (no array yet) reads as zeros; a DeferAndFuse value still pending is computed."""
    empty = torch.empty(3, device="tpu")
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        pending = torch.ones(2, device="tpu") * 3
        arrays = graph_inputs.arrays_of((pending,))
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    np.testing.assert_array_equal(np.asarray(arrays[0]), np.full(2, 3.0, np.float32))
    assert np.asarray(graph_inputs.arrays_of((empty,))[0]).shape == (3,)


@pytest.mark.skipif(not native.active(), reason="the C++ extension is not in use")
def test_the_native_path_answers_whole_payloads_and_nothing_else():
    tpu, _ = _args()
    answered = graph_inputs._whole_payload_arrays(tuple(tpu), graph_inputs._payloads)
    whole = {0, 1, 6}  # the two whole tensors and the empty one
    assert [a is not None for a in answered] == [i in whole for i in range(len(tpu))]


def test_compiled_model_with_views_and_buffers_matches_cpu():
    """A compiled forward whose inputs mix parameters, a buffer, a transposed view and a CPU scalar tensor."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)).eval()
    model = copy.deepcopy(ref).to("tpu")
    x = torch.randn(6, 5)

    def f(m, xt, scale):
        return m(xt.t()) * scale

    compiled = torch.compile(f, backend="tpu")
    with torch.no_grad():
        got = compiled(model, x.to("tpu"), torch.tensor(2.0))
        want = f(ref, x, torch.tensor(2.0))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)

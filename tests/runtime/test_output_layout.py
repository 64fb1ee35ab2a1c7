"""Outputs keep the layout PyTorch gives them, and in-place writes make CPU's memory-overlap checks.

Issue 22 part 5: `(x.t() * 2).stride()` follows the meta kernel's strides (a dense permutation is computed
in memory order, `out_specs.out_layout`), in Strict, DeferAndFuse and compiled; writes whose destination
repeats elements or overlaps a source raise CPU's error (`tensors/overlap.py`).
"""

import contextlib
import warnings

import pytest
import torch

import hf_tpu  # noqa: F401

MODES = ["strict", "defer"]


def _mode(mode):
    if mode == "defer":
        return torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    return contextlib.nullcontext()


def _cases():
    return {
        "mul": lambda x: x.transpose(0, 2) * 2,
        "add-tensors": lambda x: x.permute(2, 0, 1) + x.permute(2, 0, 1),
        "where": lambda x: torch.where(x.transpose(1, 2) > 0, x.transpose(1, 2), 0.0),
        "clone": lambda x: x.transpose(0, 1).clone(),
        "to-int": lambda x: x.transpose(0, 1).to(torch.int32),
        "contiguous": lambda x: x.transpose(0, 1).contiguous(),
        "sort": lambda x: x.transpose(0, 2).sort(1),
        "softmax": lambda x: x.transpose(0, 2).softmax(1),
        "sum": lambda x: x.transpose(0, 2).sum(1),
        "slice-mul": lambda x: x[:, ::2].transpose(0, 1) * 3,
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(_cases()))
def test_outputs_have_cpus_strides(name, mode):
    fn = _cases()[name]
    x = torch.randn(2, 3, 4)
    expected = fn(x)
    with _mode(mode):
        actual = fn(x.to("tpu"))
        if isinstance(expected, torch.Tensor):
            expected, actual = (expected,), (actual,)
        for e, a in zip(expected, actual):
            assert a.stride() == e.stride()
            torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize("mode", MODES)
def test_view_of_a_permuted_result_works_as_on_cpu(mode):
    x = torch.randn(3, 4)
    with _mode(mode):
        y = (x.to("tpu").t() * 2).t().view(-1)
        assert y.stride() == (1,)
        torch.testing.assert_close(y.cpu(), (x * 2).view(-1))


def test_compiled_outputs_have_the_graphs_strides():
    def f(x):
        y = x.t() * 2
        return y, y.t().view(-1), torch.sin(x.permute(1, 0)) + 1

    x = torch.randn(3, 4)
    expected = f(x)
    torch._dynamo.reset()
    actual = torch.compile(f, backend="tpu")(x.to("tpu"))
    for e, a in zip(expected, actual):
        assert a.stride() == e.stride()
        torch.testing.assert_close(a.cpu(), e)
    # the second output views the first, as in eager
    assert actual[1].untyped_storage().data_ptr() == actual[0].untyped_storage().data_ptr()


# -------------------------------------------------------------------------------------- memory overlap


def _raising_writes():
    long = torch.long
    return {
        "add_-partial": lambda a: a[1:].add_(a[:-1]),
        "mul_-transposed-same-range": lambda a: a.view(2, 3).mul_(a.view(3, 2).t()),
        "add_-expanded": lambda a: a[:1].expand(3).add_(1.5),
        "relu_-expanded": lambda a: a[:1].expand(3).relu_(),
        "copy_-partial": lambda a: a[1:].copy_(a[:-1]),
        "copy_-expanded": lambda a: a[:1].expand(3).copy_(a[3:]),
        "setitem-partial": lambda a: a.__setitem__(slice(1, None), a[:-1]),
        "index_copy_-itself": lambda a: a.index_copy_(0, torch.arange(6, device=a.device), a),
        "index_add_-itself": lambda a: a.index_add_(0, torch.zeros(6, dtype=long, device=a.device), a),
        "index_put_-itself": lambda a: a.index_put_((torch.arange(6, device=a.device),), a),
        "scatter_-expanded": lambda a: (
            a[:1].expand(3).scatter_(0, torch.zeros(3, dtype=long, device=a.device), 1.0)
        ),
        "add-out-partial": lambda a: torch.add(a[:-1], 1, out=a[1:]),
    }


def _allowed_writes():
    return {
        "add_-itself": lambda a: a.add_(a),
        "copy_-itself": lambda a: a.copy_(a),
        "add_-disjoint": lambda a: a[:3].add_(a[3:]),
        "add_-expanded-source": lambda a: a[0:3].add_(a[:1].expand(3)),
        "fill_-expanded": lambda a: a[:1].expand(3).fill_(2.0),
        "zero_-expanded": lambda a: a[:1].expand(3).zero_(),
        "masked_fill_-expanded": lambda a: (
            a[:1].expand(3).masked_fill_(torch.ones(3, dtype=torch.bool, device=a.device), 1.0)
        ),
        # (index_put_ of some elements of an expanded view: CPU writes only those, tpu writes the whole
        # view back, aliases included, so which value a shared element keeps differs; not checked here)
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(_raising_writes()))
def test_overlapping_write_raises_cpus_error(name, mode):
    fn = _raising_writes()[name]
    with pytest.raises(RuntimeError) as on_cpu:
        fn(torch.arange(6.0))
    a = torch.arange(6.0, device="tpu")
    with _mode(mode), pytest.raises(RuntimeError) as on_tpu:
        fn(a)
    assert str(on_tpu.value) == str(on_cpu.value)
    assert a.cpu().tolist() == list(range(6))  # nothing written


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(_allowed_writes()))
def test_allowed_writes_run_as_on_cpu(name, mode):
    fn = _allowed_writes()[name]
    expected = torch.arange(6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU warns about index_put_ on an expanded tensor
        fn(expected)
        a = torch.arange(6.0, device="tpu")
        with _mode(mode):
            fn(a)
            assert a.cpu().tolist() == expected.tolist()


def test_an_output_the_op_did_not_compute_keeps_none_under_a_permuted_layout():
    """A backward's masked-out gradient is None while its meta kernel still gives it a permuted layout
    (CLAP's batch-norm backward on a (2, 64, 1024, 1) input with no input gradient failed in transpose)."""
    import jax.numpy as jnp

    from hf_tpu.runtime.execution.out_specs import lay_out

    arr = jnp.arange(6.0).reshape(2, 3)
    out = lay_out(jnp, (None, arr), ((1, 0), (1, 0)))
    assert out[0] is None and out[1].shape == (3, 2)

"""Indexing and shape lowerings against CPU PyTorch: values, in-place writes through views, autograd."""

import re

import pytest
import torch
import torch.nn.functional as F

from hf_tpu.runtime.lowerings.table import TABLE

aten = torch.ops.aten


def tpu(x):
    if isinstance(x, torch.Tensor):
        return x.to("tpu")
    if isinstance(x, list | tuple):
        return type(x)(tpu(v) for v in x)
    return x


def cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, list | tuple):
        return type(x)(cpu(v) for v in x)
    return x


def check(fn, *args, atol=None, rtol=None):
    """fn on CPU tensors vs fn on their tpu copies."""
    expected = fn(*args)
    actual = fn(*tpu(args))
    for a in actual if isinstance(actual, list | tuple) else [actual]:
        assert a.device.type == "tpu"
    torch.testing.assert_close(cpu(actual), expected, atol=atol, rtol=rtol, equal_nan=True)
    return actual


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_ops_reach_these_lowerings():
    torch.zeros(1, device="tpu") + 1  # loads the table
    owned = {
        "hf_tpu.runtime.lowerings.indexing": [
            aten.index.Tensor,
            aten.index_put.default,
            aten.index_put_.default,
            aten._index_put_impl_.default,
            aten.gather.default,
            aten.scatter_add.default,
            aten.scatter_reduce.two,
            aten.index_select.default,
            aten.embedding_dense_backward.default,
            aten.masked_scatter.default,
        ],
        "hf_tpu.runtime.lowerings.shape": [
            aten.cat.default,
            aten.constant_pad_nd.default,
            aten.slice_scatter.default,
            aten.view_copy.default,
            aten.clone.default,
        ],
    }
    for module, ops in owned.items():
        for op in ops:
            assert TABLE[op].fn.__module__ == module, op


# -- cat / stack ------------------------------------------------------------------------------------
def test_cat_dims_promotion_and_legacy_empty():
    a, b = randn(2, 3), randn(4, 3)
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda a, b: torch.cat([a.t(), b.t()], dim=-1), a, b)
    i = torch.arange(6).reshape(2, 3)
    out = check(lambda a, i: torch.cat([a, i]), a, i)
    assert out.dtype == torch.float32
    check(lambda a, e: torch.cat([a, e, a], 1), a, torch.empty(0))
    check(
        lambda a, b: torch.cat([a, b]), randn(2, 3, dtype=torch.bfloat16), randn(1, 3, dtype=torch.bfloat16)
    )


def test_stack():
    a, b = randn(2, 3), randn(2, 3)
    check(lambda a, b: torch.stack([a, b]), a, b)
    check(lambda a, b: torch.stack([a, b], dim=-1), a, b)
    check(lambda a, b: torch.stack([a, b], dim=1), a, torch.arange(6).reshape(2, 3))


# -- advanced indexing ------------------------------------------------------------------------------
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_index_integer_arrays(idx_dtype):
    x = randn(5, 6, 7)
    i = torch.tensor([0, -1, 3, 3], dtype=idx_dtype)
    j = torch.tensor([[1], [-5]], dtype=idx_dtype)
    check(lambda x, i: x[i], x, i)
    check(lambda x, i: x[:, i], x, i)
    check(lambda x, i: x[..., i], x, i)
    check(lambda x, i, j: x[j, i], x, i, j)  # broadcast to [2, 4]
    check(lambda x, i, j: x[j, :, i], x, i, j)  # separated: advanced block goes first
    check(lambda x, i, j: x[:, j, i], x, i, j)
    check(lambda x, i: x[i, 2], x, i)
    check(lambda x, i: aten.index.Tensor(x, [None, i]), x, i)
    check(lambda x, i: aten._unsafe_index.Tensor(x, [i, None, i]), x, i)


def test_index_with_bool_masks():
    x = randn(4, 5, 3)
    m = x[..., 0] > 0
    check(lambda x, m: x[m], x, m)
    check(lambda x, m: x[m[0]], x.transpose(0, 1).contiguous(), m)  # 1-D mask on dim 0
    check(lambda x, m: x[:, m[0]], x, m)
    check(lambda x, m: x[x > 0.5], x, m)
    check(lambda x, m: x[m, 1], x, m)
    check(lambda x: x[torch.zeros(4, 5, dtype=torch.bool, device=x.device)], x)  # nothing selected


def test_index_with_cpu_index_tensors():
    x = randn(6, 4)
    t = tpu(x)
    idx = torch.tensor([5, 0, 2])
    torch.testing.assert_close(t[idx].cpu(), x[idx])
    torch.testing.assert_close(t[x[:, 0] > 0].cpu(), x[x[:, 0] > 0])
    t[idx] = 1.5
    x[idx] = 1.5
    torch.testing.assert_close(t.cpu(), x)


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_index_put_accumulate_duplicates(idx_dtype):
    x = randn(5, 4)
    i = torch.tensor([0, 2, 0, -1, 2, 2], dtype=idx_dtype)
    v = randn(6, 4)
    check(lambda x, i, v: x.index_put((i,), v, accumulate=True), x, i, v)
    check(lambda x, i, v: x.clone().index_put_((i,), v, accumulate=True), x, i, v)
    j = torch.tensor([1, 3, 1, 0, 3, 3], dtype=idx_dtype)
    check(lambda x, i, j, v: x.index_put((i, j), v[:, 0], accumulate=True), x, i, j, v)
    check(lambda x, i, v: aten.index_put(x, [None, i[:4]], v[:5, :4], accumulate=True), x, i, v)


def test_index_put_unique_and_broadcast_values():
    x = randn(5, 4, 3)
    i = torch.tensor([3, 0, -2])
    check(lambda x, i: x.index_put((i,), torch.tensor(2.0, device=x.device)), x, i)
    check(lambda x, i: x.index_put((i,), randn(4, 3).to(x.device) * 0 + 1), x, i)
    check(lambda x, i: aten.index_put(x, [None, i[:2]], torch.ones(5, 2, 3, device=x.device)), x, i)
    j = torch.tensor([[0], [3]])
    check(lambda x, i, j: x.index_put((j, i[None, :2]), torch.full((2, 2, 3), 7.0, device=x.device)), x, i, j)


def test_index_put_with_bool_masks():
    x = randn(4, 5)
    m = x > 0
    nnz = int(m.sum())
    check(lambda x, m: x.index_put((m,), torch.tensor(0.0, device=x.device)), x, m)
    check(lambda x, m: x.index_put((m,), torch.tensor(1.0, device=x.device), accumulate=True), x, m)
    vals = torch.arange(nnz, dtype=torch.float32)
    check(lambda x, m, v: x.index_put((m,), v), x, m, vals)
    check(lambda x, m, v: x.index_put((m,), v, accumulate=True), x, m, vals)
    rows = m[:, 0]
    r = int(rows.sum())
    check(lambda x, rows, v: x.index_put((rows,), v), x, rows, randn(r, 5))
    check(lambda x, rows: x.index_put((rows,), torch.ones(5, device=x.device)), x, rows)
    cols = m[0]
    check(lambda x, cols: aten.index_put(x, [None, cols], torch.ones(4, 1, device=x.device) * 3), x, cols)
    # a mask together with an integer index (pairs up with the mask's nonzero positions)
    y = randn(3, 4)
    mk = torch.tensor([True, False, True])
    check(
        lambda y, mk, j: y.index_put((mk, j), torch.tensor([5.0, 6.0], device=y.device)),
        y,
        mk,
        torch.tensor([1, 3]),
    )
    check(lambda y, mk, j: y.index_put((mk, j), torch.tensor(9.0, device=y.device)), y, mk, torch.tensor([2]))


def test_setitem_getitem_through_views():
    x = torch.zeros(4, 6)
    t = tpu(x)
    for ref in (x, t):
        ref[:, 1] = 5
        ref[1:3][torch.tensor([1], device=ref.device)] = 2.0
        ref[ref > 4] = -1.0
        ref.t()[torch.tensor([5, 4], device=ref.device)] += 3.0
        view = ref[:, 2:]
        view[view == 0] = torch.arange(int((view == 0).sum()), dtype=ref.dtype).to(ref.device)
        ref[torch.tensor([0, 3], device=ref.device), torch.tensor([0, 0], device=ref.device)] = 8
    torch.testing.assert_close(t.cpu(), x)
    assert t[1:3, 1:].cpu().tolist() == x[1:3, 1:].tolist()


def test_index_copy_static_cache_aliases():
    """StaticCache writes keys with index_copy_ along dim 2 of a [batch, heads, max_len, dim] buffer."""
    ref = torch.zeros(2, 3, 8, 4)
    cache = tpu(ref)
    layer_view = cache[1]
    for positions in ([0, 1, 2], [3], [4]):
        new = randn(2, 3, len(positions), 4)
        pos = torch.tensor(positions)
        ref.index_copy_(2, pos, new)
        cache.index_copy_(2, tpu(pos), tpu(new))
        torch.testing.assert_close(cache.cpu(), ref)
        torch.testing.assert_close(layer_view.cpu(), ref[1])
    # through a view, with int32 positions
    sub_ref, sub = ref[:, 1], cache[:, 1]
    pos = torch.tensor([7, 5], dtype=torch.int32)
    new = randn(2, 2, 4)
    sub_ref.index_copy_(1, pos.long(), new)
    sub.index_copy_(1, tpu(pos.long()), tpu(new))
    torch.testing.assert_close(cache.cpu(), ref)
    check(lambda x, i, s: x.index_copy(-1, i, s), randn(3, 5), torch.tensor([4, 0]), randn(3, 2))


def test_index_select_add_fill():
    x = randn(5, 6)
    i = torch.tensor([4, 0, 4, 1])
    check(lambda x, i: x.index_select(0, i), x, i)
    check(lambda x, i: x.index_select(-1, i.int()), x, i)
    check(lambda x, i: x.index_select(1, i[0]), x, i)  # 0-d index
    check(lambda x: x.index_select(0, torch.tensor([0], device=x.device)), torch.tensor(3.0))
    src = randn(4, 6)
    check(lambda x, i, s: x.index_add(0, i, s), x, i, src)
    check(lambda x, i, s: x.index_add(0, i, s, alpha=-2.5), x, i, src)
    check(lambda x, i, s: x.index_add(1, i, s.t().contiguous()), x, i, randn(4, 5))
    check(
        lambda x, i, s: x.index_add(0, i, s),
        x.to(torch.bfloat16),
        i,
        src.to(torch.bfloat16),
        atol=0.05,
        rtol=0.02,
    )
    check(lambda x, i: x.index_fill(1, i, -3.0), x, i)
    check(lambda x, i: x.index_fill(0, i, torch.tensor(2.0, device=x.device)), x, i)
    check(lambda x, i: x.index_fill(0, i, 1), torch.arange(30).reshape(5, 6), i)

    def inplace_on_view(x, i):
        y = x.clone()
        y[1:].index_fill_(1, i, 0.0)
        y.t().index_add_(0, i[:2], torch.ones(2, 5, device=x.device))
        return y

    check(inplace_on_view, x, i)


REDUCE_CASES = [(r, inc) for r in ("prod", "mean", "amax", "amin") for inc in (True, False)]


def _index_reduce_case(reduce, include_self, dtype):
    i = torch.tensor([0, 4, 0, 2])
    if dtype.is_floating_point:
        x, s = randn(5, 3, dtype=dtype), randn(4, 3, dtype=dtype)
    else:
        x, s = torch.randint(-5, 5, (5, 3), dtype=dtype), torch.randint(-5, 5, (4, 3), dtype=dtype)
    check(lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self), x, i, s)


@pytest.mark.parametrize("reduce,include_self", REDUCE_CASES)
def test_index_reduce(reduce, include_self):
    _index_reduce_case(reduce, include_self, torch.float32)


@pytest.mark.parametrize("reduce,include_self", [("mean", True), ("mean", False), ("amin", False)])
def test_index_reduce_integers(reduce, include_self):
    _index_reduce_case(reduce, include_self, torch.int64)


@pytest.mark.slow
@pytest.mark.parametrize("reduce,include_self", REDUCE_CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bfloat16])
def test_index_reduce_dtypes(reduce, include_self, dtype):
    _index_reduce_case(reduce, include_self, dtype)


# -- gather / scatter -------------------------------------------------------------------------------
def test_gather():
    x = randn(4, 5, 6)
    idx = torch.randint(0, 5, (3, 4, 2))  # smaller than x in the other dims
    check(lambda x, i: torch.gather(x, 1, i), x, idx)
    check(lambda x, i: torch.gather(x, -1, i.int()), x, idx)
    check(lambda x, i: torch.take_along_dim(x, i, dim=1), x, torch.randint(0, 5, (4, 1, 6)))
    check(lambda x: torch.gather(x, 0, torch.tensor(0, device=x.device)), torch.tensor(3.0))


def test_scatter_variants():
    x = randn(4, 5)
    idx = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])  # unique per column
    src = randn(3, 5)  # larger than index
    check(lambda x, i, s: x.scatter(1, i, s), x, idx, src)
    check(lambda x, i: x.scatter(1, i, 2.5), x, idx)
    check(lambda x, i, s: x.scatter(0, i, s), x, idx, src)
    dup = torch.tensor([[0, 0, 1, 1, 0], [1, 0, 0, 1, 1]])
    check(lambda x, i, s: x.scatter(0, i, s, reduce="add"), x, dup, src)
    check(lambda x, i, s: x.scatter(0, i, s, reduce="multiply"), x, dup, src)
    check(lambda x, i: x.scatter(0, i, 2.0, reduce="multiply"), x, dup)
    check(lambda x, i, s: x.scatter_add(0, i, s), x, dup, src)
    check(lambda x, i, s: x.scatter_add(-1, i, s), x, torch.tensor([[4, 4, 0]]), src)
    bf = check(
        lambda x, i, s: x.scatter_add(0, i, s), x.bfloat16(), dup, src.bfloat16(), atol=0.05, rtol=0.02
    )
    assert bf.dtype == torch.bfloat16

    def inplace_on_view(x, i, s):
        y = x.clone()
        y[1:].scatter_(0, i, s)
        y.t().scatter_add_(1, i.t().contiguous(), s.t().contiguous())
        return y

    check(inplace_on_view, x, idx % 3, src)


SCATTER_REDUCE_CASES = [(r, inc) for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)]


def _scatter_reduce_case(reduce, include_self, dtype):
    idx = torch.tensor([[0, 0, 2, 5, 5, 5, 1], [4, 4, 4, 0, 3, 3, 3]])
    if dtype.is_floating_point:
        x, s = randn(3, 6, dtype=dtype), randn(2, 7, dtype=dtype)
    else:
        x, s = torch.randint(1, 9, (3, 6), dtype=dtype), torch.randint(1, 9, (2, 7), dtype=dtype)
    tol = {"atol": 0.05, "rtol": 0.02} if dtype == torch.bfloat16 else {}
    check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), x, idx, s, **tol)


@pytest.mark.parametrize("reduce,include_self", SCATTER_REDUCE_CASES)
def test_scatter_reduce(reduce, include_self):
    _scatter_reduce_case(reduce, include_self, torch.float32)


@pytest.mark.parametrize("reduce,include_self", [("mean", True), ("mean", False), ("sum", False)])
def test_scatter_reduce_integers(reduce, include_self):
    _scatter_reduce_case(reduce, include_self, torch.int64)


@pytest.mark.slow
@pytest.mark.parametrize("reduce,include_self", SCATTER_REDUCE_CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bfloat16])
def test_scatter_reduce_dtypes(reduce, include_self, dtype):
    _scatter_reduce_case(reduce, include_self, dtype)


# -- masked ops, embedding, take ------------------------------------------------------------------
def test_masked_fill_and_scatter():
    x = randn(3, 4, 5)
    m = torch.rand(4, 5) > 0.5  # broadcasts over dim 0
    check(lambda x, m: x.masked_fill(m, -1e9), x, m)
    check(lambda x, m: x.masked_fill(m, float("-inf")), x.half(), m)
    check(lambda x, m: x.masked_fill(m, torch.tensor(3.0, device=x.device)), x, m)
    check(lambda x, m: x.masked_fill(m, 7), torch.arange(60).reshape(3, 4, 5), m)
    check(lambda x, m: x.masked_fill(m, True), torch.zeros(3, 4, 5, dtype=torch.bool), m)

    def inplace_on_view(x, m):
        y = x.clone()
        y[:, 1:].masked_fill_(m[1:], 0.5)
        return y

    check(inplace_on_view, x, m)
    src = torch.arange(200, dtype=torch.float32)
    check(lambda x, m, s: x.masked_scatter(m, s), x, m, src)
    check(lambda x, m, s: x.clone().masked_scatter_(m.expand(3, 4, 5), s), x, m, src)
    check(lambda x, m, s: x.masked_scatter(m, s), x, torch.zeros_like(m), torch.empty(0))


def test_embedding_and_backward():
    w = randn(10, 4)
    ids = torch.tensor([[1, 3, 3, 0], [9, 1, 1, 1]])
    check(lambda w, i: F.embedding(i, w), w, ids)
    check(lambda w, i: F.embedding(i.int(), w), w, ids)
    grad = randn(2, 4, 4)
    check(lambda g, i: aten.embedding_dense_backward(g, i, 10, -1, False), grad, ids)
    check(lambda g, i: aten.embedding_dense_backward(g, i, 10, 1, False), grad, ids)
    check(lambda g, i: aten.embedding_dense_backward(g, i, 10, 0, True), grad, ids)
    check(
        lambda g, i: aten.embedding_dense_backward(g, i, 10, -1, False),
        grad.bfloat16(),
        ids,
        atol=0.05,
        rtol=0.02,
    )
    for kwargs in ({}, {"padding_idx": 1}, {"scale_grad_by_freq": True}):
        wc = w.clone().requires_grad_()
        wt = tpu(w).requires_grad_()
        F.embedding(ids, wc, **kwargs).pow(2).sum().backward()
        F.embedding(tpu(ids), wt, **kwargs).pow(2).sum().backward()
        torch.testing.assert_close(wt.grad.cpu(), wc.grad)


def test_embedding_max_norm_renormalizes_weight_in_place():
    w = randn(10, 4) * 3
    ids = torch.tensor([[1, 3, 3], [9, 1, 0]])
    wt = tpu(w)
    out = F.embedding(tpu(ids), wt, max_norm=1.5)
    expected = F.embedding(ids, w, max_norm=1.5)  # renormalizes w in place too
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(wt.cpu(), w)


def test_bool_accumulation_and_empty_index():
    x = torch.rand(4, 5) > 0.7
    src = torch.rand(2, 5) > 0.5
    idx = torch.tensor([[0, 1, 2, 3, 0], [3, 3, 3, 0, 1]])
    check(lambda x, i, s: x.scatter_add(0, i, s), x, idx, src)
    check(lambda x, i, s: x.index_add(0, i[0, :2], s), x, idx, src)
    check(lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), x, idx, src)
    check(lambda x, i, s: x.index_put((i[0, :2],), s, accumulate=True), x, idx, src)
    check(lambda x, m: x.index_put((m,), torch.tensor(True, device=x.device), accumulate=True), x, src[0, :4])
    check(lambda x, i: torch.gather(x, 0, i), randn(5), torch.empty(2, 0, dtype=torch.long))
    check(lambda x, i: x.scatter(0, i, 1.0), randn(5), torch.empty(0, dtype=torch.long))


def test_take_and_one_hot():
    x = randn(3, 4)
    check(lambda x, i: torch.take(x, i), x, torch.tensor([[0, -1], [11, 5]]))
    i = torch.tensor([[0, -1], [11, 0]])
    check(lambda x, i: x.put(i, torch.ones(2, 2, device=x.device), accumulate=True), x, i)
    check(lambda x, i: x.clone().put_(i[:1], torch.full((2,), 5.0, device=x.device)), x, i)
    check(lambda i: F.one_hot(i, 6), torch.tensor([0, 5, 2, 2]))


# -- shape ops ------------------------------------------------------------------------------------
def test_constant_pad():
    x = randn(2, 3, 4)
    check(lambda x: F.pad(x, (1, 2)), x)
    check(lambda x: F.pad(x, (1, 2, 0, 1, 2, 0), value=-1.5), x)
    check(lambda x: F.pad(x, (-1, 2, 1, -2)), x)  # negative pads crop
    check(lambda x: F.pad(x, (2, 2), value=3), torch.arange(6).reshape(2, 3))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_reflect_replicate_pad_and_backward(mode, dims):
    shape = (2, 3) + (5,) * dims
    pad = (2, 1, 1, 3, 1, 2)[: 2 * dims]
    x = randn(*shape)
    check(lambda x: F.pad(x, pad, mode=mode), x)
    if dims == 2:
        check(lambda x: F.pad(x, pad, mode=mode), x[0])  # unbatched
        check(lambda x: F.pad(x, (-1, 1, -2, 1), mode=mode), x)  # negative widths crop
    xc = x.clone().requires_grad_()
    xt = tpu(x).requires_grad_()
    g = randn(*F.pad(x, pad, mode=mode).shape)
    F.pad(xc, pad, mode=mode).backward(g)
    F.pad(xt, pad, mode=mode).backward(tpu(g))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)


def test_flip_roll_repeat():
    x = randn(3, 4, 5)
    check(lambda x: x.flip(0, -1), x)
    check(lambda x: x.roll(2, 1), x)
    check(lambda x: x.roll((1, -2), (0, 2)), x)
    check(lambda x: x.roll(7), x)  # flattened
    check(lambda x: x.repeat(2, 1, 3), x)
    check(lambda x: x.repeat(2, 1, 1, 2), x)
    check(lambda x: x.tile((2,)), x)


def test_repeat_interleave():
    x = randn(3, 2)
    check(lambda x: x.repeat_interleave(2, dim=0), x)
    check(lambda x: x.repeat_interleave(3), x)
    check(lambda r: torch.repeat_interleave(r), torch.tensor([2, 0, 3]))
    check(lambda x, r: x.repeat_interleave(r, dim=0), x, torch.tensor([1, 0, 2]))
    check(lambda r: torch.repeat_interleave(r, output_size=5), torch.tensor([2, 0, 3]))


def test_tril_triu_diag():
    x = randn(2, 4, 5)
    for k in (-1, 0, 2):
        check(lambda x, k=k: x.tril(k), x)
        check(lambda x, k=k: x.triu(k), x)
    check(lambda x: torch.ones(4, 4, dtype=torch.bool, device=x.device).tril() & x, torch.rand(4, 4) > 0.5)
    v = randn(2, 3)
    check(lambda v: torch.diag_embed(v), v)
    check(lambda v: torch.diag_embed(v, offset=1, dim1=0, dim2=2), v)
    check(lambda v: torch.diag_embed(v, offset=-2, dim1=-1, dim2=0), v)
    check(lambda v: torch.diag(v[0]), v)
    check(lambda v: torch.diag(v, 1), v)
    check(lambda x: torch.diagonal(x, 1, 1, 2).clone(), x)


def test_scatter_into_slices_and_diagonals():
    x = randn(4, 5, 6)
    check(lambda x, s: torch.slice_scatter(x, s, dim=1, start=1, end=5, step=2), x, randn(4, 2, 6))
    check(lambda x, s: torch.slice_scatter(x, s, dim=-1, start=-3), x, randn(4, 5, 3))
    check(lambda x, s: torch.select_scatter(x, s, 0, -1), x, randn(5, 6))
    check(lambda x, s: torch.diagonal_scatter(x, s, 1, 1, 2), x, randn(4, 5))
    check(lambda x, s: torch.diagonal_scatter(x, s, -2, 0, 2), x, randn(5, 2))
    check(lambda x, s: torch.as_strided_scatter(x, s, (3, 2), (6, 2), 1), x, randn(3, 2))


def test_copy_variants_match_their_views():
    x = randn(2, 3, 4)
    check(lambda x: aten.view_copy(x, [6, -1]), x)
    check(lambda x: aten._reshape_copy(x, [4, 6]), x)
    check(lambda x: aten.unsqueeze_copy(x, -1), x)
    check(lambda x: aten.squeeze_copy(x.reshape(2, 1, 12)), x)
    check(lambda x: aten.squeeze_copy.dim(x.reshape(2, 1, 12), 1), x)
    check(lambda x: aten.squeeze_copy.dims(x.reshape(1, 2, 1, 12), [0, 1, 2]), x)
    check(lambda x: aten.t_copy(x[0]), x)
    check(lambda x: aten.transpose_copy(x, 0, -1), x)
    check(lambda x: aten.permute_copy(x, [2, 0, 1]), x)
    check(lambda x: aten.expand_copy(x[:, :1], [5, 2, -1, 4]), x)
    check(lambda x: aten.slice_copy(x, 2, 1, -1, 2), x)
    check(lambda x: aten.slice_copy(x, 1, -10, 100), x)
    check(lambda x: aten.select_copy(x, 1, -1), x)
    check(lambda x: aten.split_copy(x, 3, 2), x)
    check(lambda x: aten.split_with_sizes_copy(x, [1, 3], -1), x)
    check(lambda x: aten.unbind_copy(x, 1), x)
    check(lambda x: aten.alias_copy(x), x)
    check(lambda x: aten.detach_copy(x), x)
    check(lambda x: aten.diagonal_copy(x, 0, 1, 2), x)
    check(lambda x: aten.as_strided_copy(x, [3, 3], [4, 1], 2), x)
    check(lambda x: aten.narrow_copy(x, 2, -3, 2), x)
    check(lambda x: aten.view_copy.dtype(x, torch.int32), x)
    check(lambda x: aten.view_copy.dtype(x, torch.bfloat16), x)


def test_clone_keeps_layout_and_does_not_alias():
    x = randn(3, 4)
    t = tpu(x)
    c = t.clone()
    c.add_(1)
    torch.testing.assert_close(t.cpu(), x)
    torch.testing.assert_close(c.cpu(), x + 1)
    ct = t.t().clone()
    assert ct.stride() == x.t().clone().stride()
    torch.testing.assert_close(ct.cpu(), x.t())
    cc = t.t().clone(memory_format=torch.contiguous_format)
    assert cc.is_contiguous()
    torch.testing.assert_close(cc.cpu(), x.t())
    img = randn(2, 3, 4, 5)
    cl = tpu(img).clone(memory_format=torch.channels_last)
    assert cl.stride() == img.clone(memory_format=torch.channels_last).stride()
    torch.testing.assert_close(cl.cpu(), img)


def test_unfold_backward_and_composites():
    x = randn(2, 9)
    xc = x.clone().requires_grad_()
    xt = tpu(x).requires_grad_()
    (xc.unfold(1, 3, 2) ** 2).sum().backward()
    (xt.unfold(1, 3, 2) ** 2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    check(lambda g: aten.unfold_backward(g, [2, 9], 1, 4, 1), randn(2, 6, 4))
    a, b = torch.arange(3), torch.arange(4)
    check(lambda a, b: torch.meshgrid(a, b, indexing="ij"), a, b)
    check(lambda a, b: torch.meshgrid(a, b, indexing="xy"), a, b)
    check(lambda x: x.split([3, 6], dim=1), x)
    check(lambda x: x.chunk(3, dim=1), x)


# -- autograd ---------------------------------------------------------------------------------------
def _grads(fn, *inputs):
    leaves = [x.clone().requires_grad_() for x in inputs]
    fn(*leaves).sum().backward()
    return [x.grad for x in leaves]


@pytest.mark.parametrize(
    "name,fn,shapes",
    [
        ("index", lambda x: x[torch.tensor([0, 2, 2], device=x.device)] ** 2, [(4, 3)]),
        ("index_bool", lambda x: x[x > 0] * 3, [(4, 3)]),
        (
            "index_2d",
            lambda x: x[
                :, torch.tensor([[1], [0]], device=x.device), torch.tensor([2, 2, 0], device=x.device)
            ],
            [(3, 2, 4)],
        ),
        (
            "gather",
            lambda x: torch.gather(x, 1, torch.tensor([[0, 0], [2, 1]], device=x.device)) ** 2,
            [(2, 3)],
        ),
        ("cat", lambda a, b: torch.cat([a * 2, b], dim=1) ** 2, [(2, 3), (2, 1)]),
        ("stack", lambda a, b: torch.stack([a, b]).sin(), [(2, 3), (2, 3)]),
        ("masked_fill", lambda x: x.masked_fill(x > 0, 0.0) * x, [(3, 3)]),
        (
            "index_put",
            lambda x, v: x.index_put((torch.tensor([1, 1], device=x.device),), v, accumulate=True) ** 2,
            [(3, 2), (2, 2)],
        ),
        (
            "index_select",
            lambda x: x.index_select(0, torch.tensor([2, 0, 2], device=x.device)) ** 2,
            [(3, 2)],
        ),
        (
            "scatter_add",
            lambda x, s: x.scatter_add(0, torch.tensor([[0, 1], [0, 0]], device=x.device), s) ** 2,
            [(2, 2), (2, 2)],
        ),
        ("pad", lambda x: F.pad(x, (1, 1), value=2.0) ** 2, [(2, 3)]),
        ("flip_roll", lambda x: x.flip(0).roll(1, 1) * torch.arange(3.0, device=x.device), [(2, 3)]),
    ],
)
def test_autograd_matches_cpu(name, fn, shapes):
    inputs = [randn(*s) for s in shapes]
    expected = _grads(fn, *inputs)
    actual = _grads(fn, *tpu(inputs))
    for a, e in zip(actual, expected):
        assert a.device.type == "tpu"
        torch.testing.assert_close(a.cpu(), e)


# -- embedding_bag --------------------------------------------------------------------------------------
BAG_INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0, 7])
BAG_OFFSETS = torch.tensor([0, 2, 2, 5, 8])  # bag 1 is empty


def _bag_run(device, weight, indices, offsets=None, psw=None, **kwargs):
    """Output of F.embedding_bag and the gradients of weight (and per_sample_weights) on `device`."""
    w = weight.detach().clone().to(device).requires_grad_()
    p = None if psw is None else psw.detach().clone().to(device).requires_grad_()
    off = None if offsets is None else offsets.to(device)
    out = F.embedding_bag(indices.to(device), w, off, per_sample_weights=p, **kwargs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * cotangent.to(device)).sum().backward()
    return [out.detach().cpu(), w.grad.cpu()] + ([] if p is None else [p.grad.cpu()])


BAG_CASES = {
    "sum": dict(mode="sum"),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
    "sum_padding": dict(mode="sum", padding_idx=4),
    "mean_padding": dict(mode="mean", padding_idx=0),
    "max_padding": dict(mode="max", padding_idx=4),
    "mean_last_offset": dict(mode="mean", include_last_offset=True),
    "max_last_offset": dict(mode="max", include_last_offset=True, padding_idx=0),
    "per_sample_weights": dict(mode="sum", psw=True, padding_idx=2),
    "per_sample_weights_last_offset": dict(mode="sum", psw=True, include_last_offset=True),
}


@pytest.mark.parametrize(
    "name, layout",
    [(n, "offsets") for n in BAG_CASES] + [(n, "2d") for n in BAG_CASES if "last_offset" not in n],
)
def test_embedding_bag_matches_cpu(name, layout):
    kwargs = dict(BAG_CASES[name])
    weight = randn(10, 4)
    if layout == "2d":  # fixed-size bags: a (bags, n) input and no offsets
        indices, offsets = BAG_INDICES[:10].reshape(2, 5), None
    else:
        indices, offsets = BAG_INDICES, BAG_OFFSETS
        if kwargs.get("include_last_offset"):
            offsets = torch.cat([offsets, torch.tensor([indices.numel()])])
    psw = torch.linspace(0.5, 2, indices.numel()).reshape(indices.shape) if kwargs.pop("psw", False) else None
    expected = _bag_run("cpu", weight, indices, offsets, psw, **kwargs)
    got = _bag_run("tpu", weight, indices, offsets, psw, **kwargs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_embedding_bag_forward_only_and_bfloat16():
    weight = randn(10, 4, dtype=torch.bfloat16)
    for mode in ("sum", "mean", "max"):  # no grad needed: _embedding_bag_forward_only
        check(lambda w, i, o, m=mode: F.embedding_bag(i, w, o, mode=m), weight, BAG_INDICES, BAG_OFFSETS)
    out = aten._embedding_bag_forward_only(tpu(weight.float()), tpu(BAG_INDICES), tpu(BAG_OFFSETS), mode=2)
    offset2bag, bag_size, max_indices = cpu(out[1:])
    assert offset2bag.tolist() == [0, 0, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert bag_size.tolist() == [2, 0, 3, 3, 3]
    assert max_indices[1].tolist() == [-1] * 4  # the empty bag points nowhere


def test_embedding_bag_scale_grad_by_freq():
    """Each row's gradient is divided by how often it was looked up, as F.embedding does. (CPU's
    _embedding_bag backward divides by the count of another index, a PyTorch bug: compare with the
    embedding-then-bag reference instead.)"""
    weight = randn(10, 4)
    bag = torch.searchsorted(BAG_OFFSETS, torch.arange(BAG_INDICES.numel()), right=True) - 1
    cotangent = randn(5, 4)
    ref = weight.clone().requires_grad_()
    rows = F.embedding(BAG_INDICES, ref, scale_grad_by_freq=True)
    (torch.zeros(5, 4).index_add(0, bag, rows) * cotangent).sum().backward()
    w = tpu(weight).requires_grad_()
    out = F.embedding_bag(tpu(BAG_INDICES), w, tpu(BAG_OFFSETS), mode="sum", scale_grad_by_freq=True)
    (out * tpu(cotangent)).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), ref.grad)


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.zeros(4, device=d)[torch.tensor([True, False, True, True, True], device=d)],
        lambda d: torch.zeros(2, 3, device=d)[torch.ones(2, 4, dtype=torch.bool, device=d)],
        lambda d: torch.zeros(2, 3, device=d)[:, torch.ones(2, dtype=torch.bool, device=d)],
        lambda d: torch.zeros(2, 3, device=d).index_put_(
            (torch.ones(3, dtype=torch.bool, device=d),), torch.tensor(1.0, device=d)
        ),
        lambda d: torch.repeat_interleave(torch.tensor([1, -1], device=d)),
    ],
)
def test_mismatched_masks_and_negative_repeats_raise_as_cpu_in_every_mode(fn):
    """Shape-only and already-synced checks: XLA would clamp a mismatched mask's indices silently."""
    with pytest.raises((IndexError, RuntimeError)) as cpu:
        fn("cpu")
    with pytest.raises(type(cpu.value), match=re.escape(str(cpu.value))):
        fn("tpu")

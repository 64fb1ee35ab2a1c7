"""CPU's memory-overlap errors for writes into tpu tensors.

PyTorch refuses a write whose destination repeats memory (`x.expand(3).add_(1)`: "more than one element
of the written-to tensor refers to a single memory location") or whose source overlaps the destination
partially (`x[1:].add_(x[:-1])`) or, for index writes, at all (`x.index_copy_(0, i, x)`: "some elements
of the input tensor and the written-to tensor refer to a single memory location"): the result would
depend on the order the kernel visits elements. The same rules here, on sizes, strides and storage
offsets only (ATen's MemoryOverlap semantics):

- internal overlap: YES when some dim of size > 1 has stride 0 (and the tensor is not dense), NO when
  the tensor is non-overlapping and dense, else TOO_HARD (not refused);
- overlap of two tensors: none unless they share a storage; FULL when they are the same tensor or cover
  the same bytes with the same strides, PARTIAL when their byte ranges intersect otherwise; TOO_HARD (not
  refused) when either is not non-overlapping and dense.

Which op makes which check is `policy`: most writes refuse an internal overlap, elementwise ones (ops
tagged pointwise, `copy_`) a partial overlap with an input too, index writes any overlap with their
inputs.
"""

from __future__ import annotations

import torch

INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory "
    "location. Please clone() the tensor before performing the operation."
)
PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
    "memory location. Please clone() the tensor before performing the operation."
)

NO, YES, TOO_HARD = "no", "yes", "too hard"  # internal overlap
FULL, PARTIAL = "full", "partial"  # overlap of two tensors (or NO, TOO_HARD)

# what an input may share with the destination: PARTIAL_OK (the same tensor, not part of it: elementwise
# ops) or NONE_OK (nothing: index writes)
PARTIAL_OK, NONE_OK = "partial", "any"

# per functional op name: (refuse an internal overlap of the destination, what inputs may share with it)
_POLICIES = {
    "index_copy": (True, NONE_OK),
    "index_add": (True, NONE_OK),
    "index_reduce": (True, NONE_OK),
    "scatter": (True, NONE_OK),
    "scatter_add": (True, NONE_OK),
    "scatter_reduce": (True, NONE_OK),
    "cumsum": (True, PARTIAL_OK),
    "cumprod": (True, PARTIAL_OK),
    "sort": (True, PARTIAL_OK),
    # an expanded destination only warns on CPU ("Use of index_put_ on expanded tensors is deprecated")
    "index_put": (False, NONE_OK),
    "_index_put_impl": (False, NONE_OK),
    "index_fill": (False, NONE_OK),
    "masked_fill": (False, PARTIAL_OK),
}
# ops CPU lets write into an expanded destination (fills, reductions' TensorIterator, triangles, bmm):
# measured with torch 2.13 on CPU; every other in-place or out= op refuses it, as most do there
_INTERNAL_OK = frozenset(
    "fill zero full threshold sum nansum prod amax amin any all norm linalg_vector_norm var std var_mean "
    "std_mean argmax argmin triu tril bmm".split()
)


def policy(op: torch._ops.OpOverload, functional: torch._ops.OpOverload):
    """(internal, inputs) for in-place or out= overload `op` computing `functional`, or None: no check.
    `internal`: refuse a destination whose elements share memory; `inputs`: what an input may share with
    the destination (None: not checked)."""
    name = functional._schema.name.removeprefix("aten::")
    if name in _POLICIES:
        return _POLICIES[name]
    internal = name not in _INTERNAL_OK
    pointwise = torch.Tag.pointwise in op.tags or torch.Tag.pointwise in functional.tags
    inputs = PARTIAL_OK if pointwise else None  # TensorIterator's check
    return (internal, inputs) if internal or inputs else None


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    if t.is_contiguous():
        return True
    shape, stride = t.shape, t.stride()
    expected = 1
    for d in sorted(range(len(shape)), key=stride.__getitem__):
        size = shape[d]
        if size == 1:
            continue
        if stride[d] != expected:
            return False
        expected *= size
    return True


def internal_overlap(t: torch.Tensor) -> str:
    if non_overlapping_and_dense(t):
        return NO
    if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        return YES
    return TOO_HARD


def assert_no_internal_overlap(t: torch.Tensor) -> None:
    if internal_overlap(t) is YES:
        raise RuntimeError(INTERNAL_OVERLAP)


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def overlap_status(a: torch.Tensor, b: torch.Tensor) -> str:
    if a is b:
        return FULL
    if a.numel() == 0 or b.numel() == 0:
        return NO
    if not non_overlapping_and_dense(a) or not non_overlapping_and_dense(b):
        return TOO_HARD
    if _storage_ptr(a) != _storage_ptr(b):
        return NO
    a_begin = a.storage_offset() * a.element_size()
    a_end = a_begin + a.numel() * a.element_size()
    b_begin = b.storage_offset() * b.element_size()
    b_end = b_begin + b.numel() * b.element_size()
    if a_begin == b_begin and a_end == b_end:
        return FULL if a.stride() == b.stride() else PARTIAL
    if a_begin < b_end and b_begin < a_end:
        return PARTIAL
    return NO


def assert_inputs_apart(dest: torch.Tensor, inputs, allowed: str) -> None:
    """Refuse, as CPU does, an input that overlaps `dest` more than `allowed` (PARTIAL_OK: only a full
    overlap, the same tensor, is fine; NONE_OK: no overlap is)."""
    for x in inputs:
        if not isinstance(x, torch.Tensor) or x.device != dest.device:
            continue
        status = overlap_status(dest, x)
        if status is PARTIAL or (status is FULL and allowed is NONE_OK):
            raise RuntimeError(PARTIAL_OVERLAP)


def tensors_of(args) -> list:
    """The tensors among an op's arguments (in lists too)."""
    found = []
    for v in args:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, list | tuple):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


def check_write(dest: torch.Tensor, src: torch.Tensor | None, internal: bool = True) -> None:
    """`copy_`'s checks (TensorIterator's): no internal overlap in `dest`, no partial overlap with `src`."""
    if internal and not dest.is_contiguous():
        assert_no_internal_overlap(dest)
    if src is not None and src.device == dest.device and _storage_ptr(src) == _storage_ptr(dest):
        assert_inputs_apart(dest, (src,), PARTIAL_OK)

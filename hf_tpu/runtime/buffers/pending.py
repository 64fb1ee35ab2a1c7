"""A value a DeferAndFuse trace will produce: what a storage's payload holds until the trace runs.

The placement layer only needs to know that such a value has a shape and dtype but no buffer yet (it
occupies no device memory, and becomes `concrete` when its trace is flushed); the recorder that makes
them is `hf_tpu.runtime.launch.lazy`.
"""

from __future__ import annotations


class LazyValue:
    """A value the current trace will produce: shape and dtype known, data not yet computed."""

    __slots__ = ("shape", "dtype", "ref", "trace", "concrete", "failed_op")

    def __init__(self, shape, dtype, ref, trace):
        self.shape = shape  # a tuple
        self.dtype = dtype
        self.ref = ref  # ("v", node, index): how the trace names this value
        self.trace = trace
        self.concrete = None
        # the op (its name) whose failure at a flush left this value uncomputed: a name, not the error,
        # whose traceback would keep the failed trace's inputs and intermediates alive
        self.failed_op = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

"""The OpInfo CI subset with inputs split over the chips, in Strict, DeferAndFuse and compiled mode.

Each op runs only its samples that have a tensor dividing over the mesh (tests/opinfo_report.py,
`sharded_inputs` and `splits_over`); outputs must equal CPU's as on one chip. OpInfo's sample sizes are
multiples of 5 and 2 (S=5, M=10, L=20): a run names the mesh size it prefers, and takes the other one for
an op none of whose samples split over the preferred size (e.g. `masked_fill`'s are all 5×5).
"""

import pytest
import torch

import hf_tpu
from tests import opinfo_report as rep
from tests.runtime.test_opinfo import CI_OPS, MODE_SAMPLES, _check, ci_dtype

# (mode, preferred chips in the mesh, samples per op): every mode on 2 chips, Strict on 5 too
RUNS = [
    ("strict", 2, 6),
    ("strict", 5, 3),
    ("defer_and_fuse", 2, MODE_SAMPLES["defer_and_fuse"] // 2),
    ("compiled", 2, 2),
]
MESH_SIZES = (2, 5)

# ops without a tensor input that could be split (factories)
UNSPLITTABLE = {"arange", "full"}


@pytest.fixture(scope="module")
def ops():
    return rep.opinfos()


def _mesh_size(op, preferred: int) -> int:
    """`preferred`, or the other mesh size when none of `op`'s samples split over `preferred` chips."""
    torch.manual_seed(0)
    samples = list(op.sample_inputs("cpu", ci_dtype(op)))
    for ways in (preferred, *(n for n in MESH_SIZES if n != preferred)):
        if any(rep.splits_over(s, ways) for s in samples):
            return ways
    return preferred


@pytest.mark.filterwarnings("ignore:hf_tpu DeferAndFuse.*each compiled a new program")
@pytest.mark.parametrize("mode,chips,samples", RUNS, ids=[f"{m}-{c}chips" for m, c, _ in RUNS])
@pytest.mark.parametrize("key", CI_OPS)
def test_opinfo_with_sharded_inputs(ops, key, mode, chips, samples):
    op = ops[key]
    chips = _mesh_size(op, chips)
    keep = None if key in UNSPLITTABLE else (lambda s: rep.splits_over(s, chips))
    with hf_tpu.use_mesh((chips,), ("model",)), rep.sharded_inputs() as counts:
        _check(op, key, ci_dtype(op), mode=mode, max_samples=samples, keep=keep)
    assert counts["tensors"] == 0 or counts["sharded"] > 0 or key in UNSPLITTABLE, (
        f"{key}: none of its {counts['tensors']} input tensors divided over {chips} chips: nothing was tested"
    )

"""The OpInfo CI subset with inputs split over the chips, in Strict, DeferAndFuse and compiled mode.

Each sample's tpu inputs are split along a dim that divides over the mesh (tests/opinfo_report.py,
`sharded_inputs`); outputs must equal CPU's as on one chip. OpInfo's sample sizes are multiples of 5
and 2 (S=5, M=10, L=20), so meshes of 2 and 5 chips split most inputs.
"""

import pytest

import hf_tpu
from tests import opinfo_report as rep
from tests.runtime.test_opinfo import CI_OPS, MODE_SAMPLES, _check, ci_dtype

# (mode, chips in the mesh, samples per op): every mode on 2 chips, Strict on 5 too
RUNS = [
    ("strict", 2, 6),
    ("strict", 5, 3),
    ("defer_and_fuse", 2, MODE_SAMPLES["defer_and_fuse"] // 2),
    ("compiled", 2, 2),
]


@pytest.fixture(scope="module")
def ops():
    return rep.opinfos()


@pytest.mark.filterwarnings("ignore:hf_tpu DeferAndFuse.*each compiled a new program")
@pytest.mark.parametrize("mode,chips,samples", RUNS, ids=[f"{m}-{c}chips" for m, c, _ in RUNS])
@pytest.mark.parametrize("key", CI_OPS)
def test_opinfo_with_sharded_inputs(ops, key, mode, chips, samples):
    with hf_tpu.use_mesh((chips,), ("model",)), rep.sharded_inputs() as counts:
        _check(ops[key], key, ci_dtype(ops[key]), mode=mode, max_samples=samples)
    assert counts["tensors"] == 0 or counts["sharded"] > 0 or key in UNSPLITTABLE, (
        f"{key}: none of its {counts['tensors']} input tensors divided over {chips} chips: nothing was tested"
    )


# ops whose samples have no input dim divisible by 2 or 5 (scalars, odd sizes) or no tensor inputs
UNSPLITTABLE = {"arange", "full"}

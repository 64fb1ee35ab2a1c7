"""The OpInfo CI subset with inputs split over the chips, in Strict, DeferAndFuse and compiled mode.

Each sample's tpu inputs are split along a dim that divides over the mesh (tests/opinfo_report.py,
`sharded_inputs`); outputs must equal CPU's as on one chip. OpInfo's sample sizes are multiples of 5
and 2 (S=5, M=10, L=20), so meshes of 2 and 5 chips split most inputs.
"""

import pytest

from tests import opinfo_report as rep
from tests.runtime.test_opinfo import CI_OPS, MODE_SAMPLES, _check, ci_dtype

import hf_tpu

MESHES = {"2chips": 2, "5chips": 5}
SAMPLES = {"strict": 6, **MODE_SAMPLES}


@pytest.fixture(scope="module")
def ops():
    return rep.opinfos()


@pytest.mark.filterwarnings("ignore:hf_tpu DeferAndFuse.*each compiled a new program")
@pytest.mark.parametrize("chips", list(MESHES))
@pytest.mark.parametrize("mode", list(SAMPLES))
@pytest.mark.parametrize("key", CI_OPS)
def test_opinfo_with_sharded_inputs(ops, key, mode, chips):
    with hf_tpu.use_mesh((MESHES[chips],), ("model",)), rep.sharded_inputs():
        _check(ops[key], key, ci_dtype(ops[key]), mode=mode, max_samples=SAMPLES[mode])

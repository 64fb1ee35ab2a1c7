"""Random programs of 5-40 torch ops run on tpu (Strict, DeferAndFuse, compiled) and compared with CPU.

A fixed-seed budget runs in CI (`HF_TPU_FUZZ_EXAMPLES` unset: `CI_EXAMPLES` per mode, derandomized);
`make fuzz-long` sets `HF_TPU_FUZZ_EXAMPLES` for a much longer run with fresh random seeds
(`HF_TPU_FUZZ_SEED` replays one). A failure prints the shrunk program as Python code; keep it as a test in
tests/fuzz/test_regressions.py.
"""

import os

import torch
from hypothesis import HealthCheck, Phase, assume, given, note, seed, settings

from tests.fuzz.programs import Raised, assert_same, run
from tests.fuzz.strategies import programs

CI_EXAMPLES = {"strict": 48, "defer": 40, "compiled": 24}
_LONG = int(os.environ.get("HF_TPU_FUZZ_EXAMPLES", "0") or 0)
_SEED = os.environ.get("HF_TPU_FUZZ_SEED")


def _settings(mode: str):
    def apply(test):
        test = settings(
            max_examples=_LONG or CI_EXAMPLES[mode],
            derandomize=not _LONG and _SEED is None,
            database=None,
            deadline=None,
            print_blob=False,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
        )(test)
        if _SEED is not None:
            test = seed(int(_SEED))(test)
        return test

    return apply


def check(program, mode: str) -> None:
    functions = program.compile()
    expected = run(functions, "cpu")
    if isinstance(expected, Raised) and mode == "compiled":
        # AOT autograd drops some of eager's errors (`bool_tensor.mul_(long_tensor)` runs): compiled on
        # tpu must raise where PyTorch's own compiled CPU program (aot_eager) raises
        expected = run(functions, "cpu", "compiled")
        assume(isinstance(expected, Raised))
    if isinstance(expected, Raised):
        # CPU rejects the program: tpu must reject it too (then the example is discarded)
        note(f"CPU raised {expected!r}")
        actual = run(functions, "tpu", mode)
        assert isinstance(actual, Raised), f"CPU raised {expected!r} but tpu ({mode}) ran the program"
        if mode != "compiled":  # Dynamo wraps what tracing raises in its own exception types
            assert isinstance(actual.exc, type(expected.exc)), (
                f"tpu ({mode}) raised {actual!r}, CPU {expected!r}"
            )
        assume(False)
    assume(not program.raises)  # raised while generating, not now: nothing defined to compare
    actual = run(functions, "tpu", mode)
    if isinstance(actual, Raised) and mode == "compiled":
        # torch.compile itself refuses some programs eager runs (functionalization bans a write into a
        # tensor whose view overlaps): fine where PyTorch's own compiled CPU program raises too
        assume(not isinstance(run(functions, "cpu", "compiled"), Raised))
    if isinstance(actual, Raised):
        raise AssertionError(f"tpu ({mode}) raised where CPU ran the program") from actual.exc
    if mode == "compiled":
        try:
            assert_same(expected, actual)
        except AssertionError:
            # torch.compile's functionalization writes an expanded view back unlike eager (`b.expand(3,
            # 4).fill_(2)` adds the rows' writes into `b`, on CPU too): then the reference is PyTorch's own
            # compiled CPU program
            reference = run(functions, "cpu", "compiled")
            if isinstance(reference, Raised):
                raise
            note("differs from eager CPU; compared with CPU's compiled program (aot_eager)")
            assert_same(reference, actual)
        return
    assert_same(expected, actual)


@_settings("strict")
@given(programs())
def test_strict_matches_cpu(program):
    check(program, "strict")


@_settings("defer")
@given(programs())
def test_defer_and_fuse_matches_cpu(program):
    check(program, "defer")


@_settings("compiled")
@given(programs())
def test_compiled_matches_cpu(program):
    torch._dynamo.reset()
    check(program, "compiled")

"""tpu_dist bad input across ranks: collectives whose ranks disagree, and ranks that die mid-job.

Before each collective the ranks agree on it through the c10d store (hf_tpu/runtime/distributed/
agreement.py); without that, JAX's gloo aborts the processes ("Received data size doesn't match") or
waits forever. Real processes on 127.0.0.1, bounded by the launcher's wall time.
"""

from __future__ import annotations

import re

from tests.distributed.launcher import report, run_job


def _lines(results, prefix: str) -> dict[int, dict[str, str]]:
    """{rank: {case: the rest of its `ERROR <case> ...` line}}."""
    found: dict[int, dict[str, str]] = {}
    for r in results:
        for line in r.output.splitlines():
            if line.startswith(prefix + " "):
                case, _, rest = line[len(prefix) + 1 :].partition(" ")
                found.setdefault(r.rank, {})[case] = rest
    return found


def test_mismatched_collectives_fail_on_every_rank_naming_ranks_shapes_dtypes():
    cases = (
        "shape",
        "dtype",
        "gather_size",
        "splits",
        "different_collectives",
        "p2p",
        "p2p_any",
        "any_nobody",
        "healthy",
    )
    results = run_job("bad_collectives", 2, args=cases, extra_env={"HF_TPU_DIST_TIMEOUT": "60"}, timeout=150)
    assert all(r.returncode == 0 for r in results), report(results)
    assert not _lines(results, "NO ERROR"), report(results)
    errors = _lines(results, "ERROR")
    assert set(errors) == {0, 1}, report(results)
    for rank in (0, 1):
        e = errors[rank]
        # all_reduce of (4,) vs (5,): both ranks name the collective and every rank's shape
        assert e["shape"].startswith("CollectiveMismatchError"), e["shape"]
        assert "tpu_dist all_reduce" in e["shape"] and "shape differs" in e["shape"], e["shape"]
        assert "rank 0: shape (4,), dtype float32" in e["shape"], e["shape"]
        assert "rank 1: shape (5,), dtype float32" in e["shape"], e["shape"]
        assert "dtype differs" in e["dtype"], e["dtype"]
        assert "rank 0: shape (4,), dtype float32" in e["dtype"], e["dtype"]
        assert "rank 1: shape (4,), dtype int64" in e["dtype"], e["dtype"]
        # rank 1's wrong output size: its own ValueError there, the same reason on rank 0
        assert "all_gather_into_tensor" in e["gather_size"], e["gather_size"]
        assert "output has 9 elements (shape (3, 3))" in e["gather_size"], e["gather_size"]
        # all_to_all_single: rank 0 sends rank 1 three rows, rank 1 expects two
        assert e["splits"].startswith("CollectiveMismatchError"), e["splits"]
        assert "all_to_all_single" in e["splits"], e["splits"]
        assert "rank 0 sends rank 1 3 rows but rank 1 expects 2 rows from rank 0" in e["splits"], e["splits"]
        assert "rank 0 called all_reduce, rank 1 called broadcast" in e["different_collectives"]
        # send of (4,) into a recv of (5,): both sides name the message and both shapes
        assert e["p2p"].startswith("CollectiveMismatchError"), e["p2p"]
        assert "from rank 0 to rank 1 does not fit" in e["p2p"], e["p2p"]
        assert "rank 0 sends shape (4,), dtype float32" in e["p2p"], e["p2p"]
        assert "rank 1 receives into shape (5,), dtype float32" in e["p2p"], e["p2p"]
        # the same through a recv from any source: the receiver found rank 0 as the sender
        assert e["p2p_any"].startswith("CollectiveMismatchError"), e["p2p_any"]
        assert "from rank 0 to rank 1 does not fit" in e["p2p_any"], e["p2p_any"]
        assert "rank 1 receives into shape (5,), dtype float32" in e["p2p_any"], e["p2p_any"]
    # a recv from any source that nobody sends to ends with PeerGoneError once its timeout (3 s) has passed
    nobody = errors[1]["any_nobody"]
    assert nobody.startswith("PeerGoneError") and "recv from any source" in nobody, nobody
    assert "no rank sent to rank 1 within" in nobody and "(now 3 s)" in nobody, nobody
    assert 3 <= float(re.search(r"after ([\d.]+)s", nobody).group(1)) < 30, nobody
    assert errors[1]["gather_size"].startswith("ValueError"), errors[1]
    assert errors[0]["gather_size"].startswith("CollectiveMismatchError"), errors[0]
    assert "rank 1 passed bad arguments" in errors[0]["gather_size"], errors[0]
    # nothing was sent by the failed calls: the job still computes a right all_reduce afterwards
    for r in results:
        assert f"HEALTHY rank {r.rank}" in r.output and f"DONE rank {r.rank}" in r.output, report(results)
    for rank in (0, 1):
        for case, rest in errors[rank].items():
            assert float(re.search(r"after ([\d.]+)s", rest).group(1)) < 30, (case, rest)


def test_a_rank_that_dies_fails_the_others_within_the_timeout_naming_it():
    """Rank 1 of 3 exits after one all_reduce; ranks 0 and 2 then call all_reduce: each gets a
    PeerGoneError naming rank 1 and HF_TPU_DIST_TIMEOUT once it has passed, not a hang. (At exit JAX's
    shutdown barrier then gives up on the dead rank within the same timeout.)"""
    results = run_job(
        "bad_collectives", 3, args=("die1",), extra_env={"HF_TPU_DIST_TIMEOUT": "6"}, timeout=120
    )
    assert "DYING rank 1" in results[1].output and results[1].returncode == 3, report(results)
    errors = _lines(results, "ERROR")
    for rank in (0, 2):
        err = errors.get(rank, {}).get("die1", "")
        assert err.startswith("PeerGoneError"), report(results)
        assert "tpu_dist all_reduce" in err and "rank 1 did not reach it" in err, err
        assert "HF_TPU_DIST_TIMEOUT" in err and "(now 6 s)" in err, err
        assert 6 <= float(re.search(r"after ([\d.]+)s", err).group(1)) < 40, err
        assert f"DONE rank {rank}" in results[rank].output, report(results)
        # the process ended by itself (the launcher kills only after its 120 s)
        assert "killed after" not in results[rank].output, report(results)


def test_when_rank_0_dies_the_others_end_instead_of_hanging():
    """Rank 0 hosts the c10d store and JAX's coordinator: when it dies, the survivor either fails its
    next collective with PeerGoneError (store gone) or JAX's coordination agent ends it ("another task
    died"); either way it ends well inside the launcher's bound."""
    results = run_job(
        "bad_collectives", 2, args=("die0",), extra_env={"HF_TPU_DIST_TIMEOUT": "6"}, timeout=120
    )
    assert "DYING rank 0" in results[0].output, report(results)
    survivor = results[1]
    assert "killed after" not in survivor.output, report(results)
    assert "PeerGoneError" in survivor.output or "another task died" in survivor.output, report(results)

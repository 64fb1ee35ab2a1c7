"""`compat merge`: shards of one night become the run they split; shards of different runs are refused.

The end-to-end test runs 4 shards and one unsharded run of a small fake sample on tpu through the CLI,
as the nightly workflow does, and checks that the merged night has the same statuses; then the rest of
the workflow's merge job: report with no previous night (the first night), the gate passing, and the gate
failing on a regression.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compat import manifest
from compat.cli import main
from compat.executors import shard_of
from compat.merge import MergeError, merge_shards
from compat.results import read_records
from tests.compat import synth

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = [{"id": "s"}]


def _shard_dir(
    d: Path, records: list[dict], shard: str | None, date: str = "2026-01-02", sample=SAMPLE, **kw
) -> Path:
    synth.write_results(d, records)
    man = manifest.build(
        sample="smoke",
        entries=sample,
        date=date,
        shard=tuple(int(x) for x in shard.split("/")) if shard else None,
        modes=["eager"],
        device="cpu",
        tier="offline",
    )
    man.update(kw)
    manifest.write(d, man)
    return d


def _rec(mid: str, status: str = "pass", key: str | None = None, **kw) -> dict:
    return synth.result(mid, synth.ARCHS[0], "eager", status, dedup_key=key or f"k-{mid}", **kw)


def _statuses(records: list[dict]) -> dict[tuple[str, str], str]:
    """(model id, mode) -> status, for every id a record answers for; an id answered twice fails."""
    out: dict[tuple[str, str], str] = {}
    for r in records:
        for mid in dict.fromkeys([r["model_id"], *(r.get("attributed_ids") or [])]):
            assert (mid, r["mode"]) not in out, f"{mid} {r['mode']} has two records"
            out[(mid, r["mode"])] = r["status"]
    return out


def test_merge_dedups_folds_shared_configs_and_writes_a_manifest(tmp_path: Path) -> None:
    a = _shard_dir(tmp_path / "a", [_rec("m/a"), _rec("m/shared-1", key="K")], "0/2")
    b = _shard_dir(
        tmp_path / "b",
        [_rec("m/b", "fail_to_run"), _rec("m/shared-2", key="K"), _rec("m/shared-3", "timeout", key="K")],
        "1/2",
    )
    again = _shard_dir(tmp_path / "b-retry", [_rec("m/b", "pass")], "1/2")  # a retried shard, uploaded too
    res = merge_shards([a, b, again], tmp_path / "night")
    recs = read_records(tmp_path / "night" / "results.jsonl")
    assert recs == res.records
    assert _statuses(recs) == {
        ("m/a", "eager"): "pass",
        ("m/b", "eager"): "pass",  # the retry's record is the later one
        ("m/shared-1", "eager"): "pass",
        ("m/shared-2", "eager"): "pass",
        ("m/shared-3", "eager"): "timeout",  # same config, another status: kept as its own record
    }
    shared = [r for r in recs if r["dedup_key"] == "K" and r["status"] == "pass"]
    assert len(shared) == 1 and shared[0]["attributed_ids"] == ["m/shared-1", "m/shared-2"]
    assert res.duplicates == 1 and res.folded == 1 and not res.missing_shards
    man = manifest.read(tmp_path / "night")
    assert man["shard"] is None and man["date"] == "2026-01-02" and len(man["merged_from"]) == 3
    # merging again replaces the night (the earlier file set aside), same result
    merge_shards([a, b, again], tmp_path / "night")
    assert read_records(tmp_path / "night" / "results.jsonl") == recs


def test_merge_refuses_shards_of_other_runs_with_a_clear_error(tmp_path: Path) -> None:
    a = _shard_dir(tmp_path / "a", [_rec("m/a")], "0/2")
    b = _shard_dir(tmp_path / "b", [_rec("m/b")], "1/2")
    other_sample = _shard_dir(tmp_path / "s", [_rec("m/b")], "1/2", sample=[{"id": "t"}])
    other_night = _shard_dir(tmp_path / "n", [_rec("m/b")], "1/2", date="2026-01-03")
    other_modes = _shard_dir(tmp_path / "mo", [_rec("m/b")], "1/2", modes=["eager", "compiled"])
    other_split = _shard_dir(tmp_path / "x", [_rec("m/b")], "1/3")
    with pytest.raises(MergeError, match="different samples: 'smoke'"):
        merge_shards([a, other_sample], tmp_path / "o")
    with pytest.raises(MergeError, match="different nights: date '2026-01-02' in .*, '2026-01-03' in"):
        merge_shards([a, other_night], tmp_path / "o")
    with pytest.raises(MergeError, match="different runs: modes"):
        merge_shards([a, other_modes], tmp_path / "o")
    with pytest.raises(MergeError, match="different splits: 2-way .*3-way"):
        merge_shards([a, other_split], tmp_path / "o")
    with pytest.raises(MergeError, match="shards 1/2 of 2 are missing"):
        merge_shards([a], tmp_path / "o")
    assert not (tmp_path / "o" / "results.jsonl").exists()  # a refused merge writes nothing
    res = merge_shards([a], tmp_path / "o", allow_partial=True)
    assert res.missing_shards == ["1/2"] and "PARTIAL" in res.message
    with pytest.raises(MergeError, match="is one of the shards"):
        merge_shards([a, b], a)
    (tmp_path / "bare").mkdir()
    synth.write_results(tmp_path / "bare", [_rec("m/c")])
    with pytest.raises(MergeError, match="no run.json"):
        merge_shards([a, tmp_path / "bare"], tmp_path / "o")
    with pytest.raises(MergeError, match="missing: not a directory"):
        merge_shards([a, tmp_path / "missing"], tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeError, match="no results.jsonl"):
        merge_shards([a, tmp_path / "empty"], tmp_path / "o")


def test_merge_cli_exit_codes(tmp_path: Path, capsys) -> None:
    a = _shard_dir(tmp_path / "a", [_rec("m/a")], "0/2")
    b = _shard_dir(tmp_path / "b", [_rec("m/b")], "1/2", date="2026-01-03")
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "o")]) == 2
    assert "error: refusing to merge shards of different nights" in capsys.readouterr().err
    b = _shard_dir(tmp_path / "b", [_rec("m/b")], "1/2")
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    assert "merged 2 shard(s) of smoke (2026-01-02): 2 results" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- end to end (tpu)

BEHAVIOURS = ["raise", "mismatch", "missing-op", "bad-inputs", "nondeterministic"]


def _fake_sample() -> list[dict]:
    """Misbehaving fakes plus passing ones until each of 4 shards holds at least one entry."""
    entries = [{"id": f"fake/{b}"} for b in BEHAVIOURS] + [
        {"id": "org/unknown", "architecture": "NoSuchClass"}
    ]
    k = 0
    while min(sum(shard_of(e["id"], 4) == i for e in entries) for i in range(4)) < 1:
        entries.append({"id": f"fake/pass#{k}"})
        k += 1
    return entries


def _run_all(cmds: list[list[str]], timeout: float) -> list[subprocess.CompletedProcess]:
    """Start every command at once (as the workflow's matrix does), wait with a deadline, clean up."""
    env = dict(os.environ, COMPAT_ENABLE_FAKES="1", PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in cmds
    ]
    deadline = time.monotonic() + timeout
    out = []
    try:
        for p, c in zip(procs, cmds):
            stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append(subprocess.CompletedProcess(c, p.returncode, stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return out


def test_four_shards_merged_give_the_statuses_of_one_unsharded_run(tmp_path: Path, capsys) -> None:
    entries = _fake_sample()
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps(e) + "\n" for e in entries))
    base = [sys.executable, "-m", "compat", "run", "--sample", str(sample), "--device", "tpu"]
    base += ["--modes", "eager", "--date", "2026-01-02", "--timeout", "120"]
    cmds = [[*base, "--shard", f"{i}/4", "--out", str(tmp_path / f"shard-{i}")] for i in range(4)]
    cmds.append([*base, "--out", str(tmp_path / "whole")])
    for res in _run_all(cmds, timeout=240):
        assert res.returncode == 0, res.stdout[-3000:]

    shards = [tmp_path / f"shard-{i}" for i in range(4)]
    per_shard = [len(read_records(d / "results.jsonl")) for d in shards]
    assert all(n >= 1 for n in per_shard), per_shard  # every shard really ran part of the sample
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "site" / "2026-01-02")]) == 0
    merged = read_records(tmp_path / "site" / "2026-01-02" / "results.jsonl")
    whole = read_records(tmp_path / "whole" / "results.jsonl")
    assert sum(per_shard) == len(merged) == len(whole) == len(entries)
    assert _statuses(merged) == _statuses(whole)
    got = _statuses(merged)
    assert got[("fake/raise", "eager")] == "fail_to_run" and got[("fake/pass#0", "eager")] == "pass"
    assert got[("org/unknown", "eager")] == "harness_error"
    assert {r["device"] for r in merged} == {"tpu"}

    # the merge job, first night: no earlier report in the site; the report and the gate pass
    night = tmp_path / "site" / "2026-01-02"
    capsys.readouterr()
    assert main(["report", str(night), "--previous-in", str(tmp_path / "site")]) == 0
    assert "nothing to diff against (first night)" in capsys.readouterr().out
    assert main(["gate", str(night)]) == 0
    assert "no previous report" in capsys.readouterr().out

    # the next night fake/pass#0 regresses: the report exits 1 and the gate fails the job
    nxt = tmp_path / "site" / "2026-01-03"
    worse = [{**r, "status": "fail_to_run"} if r["model_id"] == "fake/pass#0" else r for r in merged]
    synth.write_results(nxt, worse)
    assert main(["report", str(nxt), "--previous-in", str(tmp_path / "site")]) == 1
    assert main(["gate", str(nxt)]) == 1
    assert "gate: FAIL: 1 regressions vs 2026-01-02" in capsys.readouterr().out

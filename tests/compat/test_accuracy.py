"""The TorchDynamo-suite accuracy rule, the results file (durability, torn lines), and the record schema."""

from __future__ import annotations

import json

import pytest
import torch

from compat.accuracy import compare, exactly_equal, flatten_outputs
from compat.records import Record, parse_missing_op
from compat.results import ResultsWriter, load_done, read_records


def test_allclose_passes():
    ref = {"logits": torch.ones(4, 4)}
    assert compare(ref, {"logits": torch.ones(4, 4) + 1e-5}).ok


def test_rmse_rule_arbitrates_with_fp64():
    torch.manual_seed(0)
    exact = torch.randn(64, 64, dtype=torch.float64)
    ref = (exact + 1e-2 * torch.randn(64, 64, dtype=torch.float64)).float()  # CPU is itself 1e-2 off
    near = (exact + 1.2e-2 * torch.randn(64, 64, dtype=torch.float64)).float()  # device: as far, not allclose
    far = (exact + 1e-1 * torch.randn(64, 64, dtype=torch.float64)).float()
    ok = compare({"x": ref}, {"x": near}, {"x": exact})
    assert ok.ok and ok.rmse["multiplier"] == 2.0 and ok.max_abs_diff > 1e-3
    bad = compare({"x": ref}, {"x": far}, {"x": exact})
    assert not bad.ok and "RMSE" in bad.detail
    assert not compare({"x": ref}, {"x": near}).ok  # without fp64 only allclose can pass


def test_tiny_tensors_get_the_larger_multiplier():
    exact = torch.zeros(4, dtype=torch.float64)
    ref = torch.full((4,), 0.01)
    out = torch.full((4,), 0.025)  # 2.5x the CPU error: fails with k=2, passes with k=3
    res = compare({"x": ref}, {"x": out}, {"x": exact})
    assert res.ok and res.rmse["multiplier"] == 3.0


def test_integer_and_structure_mismatches_fail():
    assert not compare({"ids": torch.tensor([1, 2])}, {"ids": torch.tensor([1, 3])}).ok
    res = compare({"a": torch.ones(1), "b": torch.ones(1)}, {"a": torch.ones(1)})
    assert not res.ok and "structure" in res.detail
    assert not compare({"a": torch.ones(2)}, {"a": torch.ones(3)}).ok


def test_nan_equal_and_exact_equality():
    a = {"x": torch.tensor([1.0, float("nan")])}
    assert exactly_equal(a, {"x": torch.tensor([1.0, float("nan")])})[0]
    same, why = exactly_equal(a, {"x": torch.tensor([1.5, float("nan")])})
    assert not same and "differs between two CPU runs" in why
    assert compare(a, {"x": torch.tensor([1.0, float("nan")])}).ok


def test_flatten_handles_model_outputs_and_drops_none():
    from transformers.modeling_outputs import BaseModelOutput

    out = BaseModelOutput(last_hidden_state=torch.ones(1), hidden_states=(torch.zeros(1), torch.zeros(2)))
    flat = flatten_outputs(out)
    assert set(flat) == {"out.last_hidden_state", "out.hidden_states[0]", "out.hidden_states[1]"}


@pytest.mark.parametrize(
    ("msg", "op"),
    [
        (
            "NotImplementedError: hf_tpu has no lowering for aten::_fft_r2c.default (shapes ...)",
            "aten::_fft_r2c.default",
        ),
        (
            "Could not run 'aten::index_put_' with arguments from the 'PrivateUse1' backend.",
            "aten::index_put_",
        ),
        (
            "The operator 'aten::upsample_bicubic2d.out' is not currently implemented for the tpu device",
            "aten::upsample_bicubic2d.out",
        ),
        ("RuntimeError: shapes do not match", None),
        (None, None),
    ],
)
def test_parse_missing_op(msg, op):
    assert parse_missing_op(msg) == op


def test_record_schema_and_json():
    rec = Record(model_id="org/m", mode="eager", device="cpu", status="pass", max_abs_diff=float("nan"))
    line = rec.to_json()
    data = json.loads(line)
    assert data["max_abs_diff"] is None and "\n" not in line
    assert set(data["times"]) == {"load_s", "first_call_s", "steady_s"}
    for key in (
        "model_type",
        "architecture",
        "task",
        "modality",
        "error_class",
        "missing_op",
        "graph_breaks",
        "peak_mem_bytes",
        "rmse",
        "dedup_key",
        "attributed_ids",
        "tier",
        "date",
    ):
        assert key in data
    assert Record.from_dict(data | {"unknown_future_field": 1}).model_id == "org/m"
    with pytest.raises(ValueError, match="org/m.*unknown status"):
        Record(model_id="org/m", mode="eager", device="cpu", status="great")
    with pytest.raises(ValueError, match="unknown mode"):
        Record(model_id="org/m", mode="turbo", device="cpu", status="pass")


def test_results_file_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as w:
        w.append(Record(model_id="a", mode="eager", device="cpu", status="pass"))
        w.append(Record(model_id="b", mode="eager", device="cpu", status="oom", attributed_ids=["b", "c"]))
    with open(path, "ab") as f:
        f.write(b'{"model_id": "d", "mode": "eag')  # killed mid-write
    assert load_done(path) == {("a", "eager"), ("b", "eager"), ("c", "eager")}
    assert path.read_bytes().endswith(b"\n")  # the torn tail is cut so appends stay line-aligned
    with ResultsWriter(path) as w:
        w.append(Record(model_id="d", mode="eager", device="cpu", status="pass"))
    assert [r["model_id"] for r in read_records(path)] == ["a", "b", "d"]

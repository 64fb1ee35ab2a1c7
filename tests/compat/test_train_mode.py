"""The ``train`` mode: one training step (loss, gradients, SGD update) on the target device against a CPU
training-step reference, judged by the same accuracy rule as inference; on ``cpu`` and on ``tpu``."""

from __future__ import annotations

import json

import pytest
import torch

from compat.accuracy import compare
from compat.inputs import NoLoss, build_inputs, label_kwargs
from compat.materialize import load_model, materialize, plan_entry
from compat.modes import (
    TRAIN_TOL,
    NondeterministicReference,
    disable_dropout,
    run_train_mode,
    train_reference,
)
from compat.runner import run_models
from compat.worker import run_train
from tests.compat.test_cli import fake_runner, model_lists  # noqa: F401 - pytest fixtures

DEVICES = ["cpu", "tpu"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread, as in the harness's workers: tiny models, and intra-op threads only contend
    with the tpu runtime's own threads on a 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny models built from shrunk configs, materialized once: {architecture: (plan, path, inputs)}."""
    cache = tmp_path_factory.mktemp("models")
    out = {}
    for arch in ("BertForSequenceClassification", "BertModel"):
        plan = plan_entry({"id": f"org/{arch}", "architecture": arch})
        path = materialize(plan, cache)
        out[arch] = (plan, path, build_inputs(load_model(plan, path), plan))
    return out


@pytest.fixture(scope="module")
def bert_ref(tiny):
    """The classifier's training inputs (with labels) and its CPU training-step reference."""
    plan, path, kwargs = tiny["BertForSequenceClassification"]
    kwargs = {**kwargs, **label_kwargs(load_model(plan, path), plan, kwargs)}
    assert kwargs["labels"].shape == (2,)
    return kwargs, train_reference(lambda: load_model(plan, path), kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_classifier_step_passes_and_a_head_without_loss_is_skipped(tiny, device):
    plan, path, kwargs = tiny["BertForSequenceClassification"]
    res = run_train(plan, path, kwargs, device, 1e-3)
    assert res.status == "pass", res.error
    assert res.tolerance == TRAIN_TOL
    # loss + 16 gradients + the same 16 parameters after the SGD step
    assert res.comparison.compared == 33 and res.comparison.max_abs_diff < 1e-4
    assert all(res.times[k] > 0 for k in ("load_s", "first_call_s", "steady_s"))
    assert res.notes and "16 of 41 gradients" in res.notes[0]

    plan, path, kwargs = tiny["BertModel"]
    res = run_train(plan, path, kwargs, device, 1e-3)
    assert res.status == "skipped" and res.error.startswith("no loss for this head")
    assert res.phase == "train_inputs"


@pytest.mark.parametrize("device", DEVICES)
def test_a_wrong_gradient_is_caught(tiny, bert_ref, device):
    """A backend whose gradient of one parameter is 1.5x too large fails the accuracy rule, naming it."""
    plan, path, _ = tiny["BertForSequenceClassification"]
    kwargs, ref = bert_ref
    victim = _largest(ref)

    def load_broken(dev: str):
        model = load_model(plan, path, dev)
        dict(model.named_parameters())[victim].register_hook(lambda g: g * 1.5)
        return model

    res = run_train_mode(load_broken, kwargs, device, ref, TRAIN_TOL)
    assert res.status == "fail_accuracy" and res.phase == "compare"
    assert f"grads.{victim}" in res.error and "RMSE" in res.error


def _largest(ref) -> str:
    return max(ref.names, key=lambda n: float(ref.ref["grads"][n].norm()))


def test_comparison_of_perturbed_gradients(bert_ref):
    """Straight through the comparison function: the reference passes itself, perturbed grads fail."""
    _, ref = bert_ref
    assert ref.fp64 is not None and len(ref.names) == 16 and ref.n_grads == 41
    assert compare(ref.ref, ref.ref, ref.fp64, TRAIN_TOL).ok
    bad = {**ref.ref, "grads": dict(ref.ref["grads"])}
    name = _largest(ref)
    bad["grads"][name] = bad["grads"][name] * 1.5
    cmp = compare(ref.ref, bad, ref.fp64, TRAIN_TOL)
    assert not cmp.ok and name in cmp.detail
    missing = {**ref.ref, "grads": {k: v for k, v in ref.ref["grads"].items() if k != name}}
    assert not compare(ref.ref, missing, ref.fp64, TRAIN_TOL).ok  # a gradient the device never made


class _Noisy(torch.nn.Module):
    """Draws random numbers in its forward that no dropout setting controls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x, labels=None, noise=True):
        h = self.drop(self.lin(x))
        if noise:
            h = h + torch.rand_like(h)
        return {"loss": ((h.squeeze(-1) - labels) ** 2).mean()}


def test_dropout_is_off_and_other_randomness_is_nondeterministic():
    torch.manual_seed(0)
    base = _Noisy()
    inputs = {"x": torch.randn(3, 4), "labels": torch.zeros(3)}
    model = disable_dropout(_Noisy())
    assert model.training and model.drop.p == 0.0
    with pytest.raises(NondeterministicReference, match="seeds 0 and 1"):
        train_reference(lambda: _copy(base), inputs)
    # without the extra noise (dropout alone is switched off) the reference is deterministic
    ref = train_reference(lambda: _copy(base), {**inputs, "noise": False})
    assert set(ref.ref["grads"]) == {"lin.weight", "lin.bias"}
    # a head whose output has no loss
    with pytest.raises(NoLoss, match="no loss for this head"):
        train_reference(lambda: torch.nn.Linear(4, 1), {"input": torch.randn(2, 4)})


def _copy(m: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(m)


def test_bert_config_dropouts_are_zeroed(tiny):
    plan, path, _ = tiny["BertForSequenceClassification"]
    model = load_model(plan, path)
    assert model.config.hidden_dropout_prob > 0
    disable_dropout(model)
    assert model.config.hidden_dropout_prob == 0 and model.config.attention_probs_dropout_prob == 0
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


@pytest.mark.parametrize("arch", ["ElectraForPreTraining", "SegformerForSemanticSegmentation"])
def test_labels_for_pretraining_and_segmentation_heads(arch, tmp_path):
    plan = plan_entry({"id": f"org/{arch}", "architecture": arch})
    model = load_model(plan, materialize(plan, tmp_path))
    kwargs = build_inputs(model, plan)
    labels = label_kwargs(model, plan, kwargs)
    assert set(labels) == {"labels"}
    out = disable_dropout(model)(**{**kwargs, **labels})
    assert torch.isfinite(out.loss)


def test_runner_train_mode_end_to_end(tmp_path):
    """Through the worker subprocess: a causal LM passes, a base model is skipped, records say train."""
    entries = [
        {"id": "org/tiny-llama", "architecture": "LlamaForCausalLM", "task": "text-generation"},
        {"id": "org/bert-base", "architecture": "BertModel", "task": "feature-extraction"},
    ]
    recs = run_models(entries, tmp_path, modes=("train",), timeout_s=240, progress=False)
    r = {x["model_id"]: x for x in recs}
    assert {x["mode"] for x in recs} == {"train"}
    llama = r["org/tiny-llama"]
    assert llama["status"] == "pass", llama["error"]
    assert llama["tolerance"] == TRAIN_TOL and llama["times"]["steady_s"] > 0
    assert any(n.startswith("train: loss") for n in llama["notes"])
    assert r["org/bert-base"]["status"] == "skipped"
    assert "no loss for this head" in r["org/bert-base"]["error"]


def test_cli_accepts_train_mode_and_reports_show_it(model_lists, fake_runner, tmp_path, capsys):  # noqa: F811
    from compat.cli import build_parser, main

    assert build_parser().parse_args(["run"]).modes == "eager,compiled"  # defaults unchanged
    reports = tmp_path / "reports"
    args = ["nightly", "--sample", "smoke", "--model-lists", str(model_lists), "--reports-dir", str(reports)]
    assert main([*args, "--date", "2026-01-02", "--modes", "eager,train"]) == 0
    assert fake_runner["modes"] == ["eager", "train"]
    night = reports / "2026-01-02"
    summary = json.loads((night / "summary.json").read_text())
    assert summary["modes"] == ["eager", "train"] and summary["per_mode"]["train"]["pass"] == 1
    assert "| train |" in (night / "report.md").read_text()
    assert ">train<" in (night / "index.html").read_text()
    assert main(["run", "--sample", "smoke", "--model-lists", str(model_lists), "--modes", "fit"]) == 2
    assert "train" in capsys.readouterr().err

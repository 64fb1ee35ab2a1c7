"""Universe build: fixture sources, recorded Hub API pages, docstring ids, malformed lines, determinism."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.hf_api import ModelInfo

from compat import docscan, registry, sources, universe
from compat.cli import main
from compat.entries import entries_for_record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KNOWN_TYPES = {
    "bert",
    "git",
    "blt",
    "led",
    "rag",
    "mixtral",
    "llama",
    "timm_wrapper",
    "gpt2",
    "electra",
    "blip-2",
}


def _arch(name: str, model_type: str, task: str, modality: str = "text", **kw) -> dict:
    return {
        "name": name, "library": "transformers", "kind": "model", "model_type": model_type,
        "model_types": [model_type], "task": task, "tasks": [task], "modality": modality, **kw,
    }  # fmt: skip


ARCH_ENTRIES = [
    _arch("BertForMaskedLM", "bert", "fill-mask"),
    _arch("BertForSequenceClassification", "bert", "text-classification"),
    _arch("BertModel", "bert", "feature-extraction"),
    _arch("GitForCausalLM", "git", "image-text-to-text", "multimodal"),
    _arch("MixtralForCausalLM", "mixtral", "text-generation"),
    _arch("LlamaForCausalLM", "llama", "text-generation"),
    _arch("GPT2LMHeadModel", "gpt2", "text-generation"),
    _arch("TimmWrapperForImageClassification", "timm_wrapper", "image-classification", "vision"),
    {"name": "StableDiffusionPipeline", "library": "diffusers", "kind": "pipeline", "model_type": None,
     "model_types": [], "task": "text-to-image", "tasks": ["text-to-image"], "modality": "diffusion",
     "components": {"vae": "AutoencoderKL", "unet": "UNet2DConditionModel"}},
    {"name": "UNet2DConditionModel", "library": "diffusers", "kind": "model", "model_type": "UNet2DConditionModel",
     "model_types": ["UNet2DConditionModel"], "task": "text-to-image", "tasks": ["text-to-image"], "modality": "diffusion"},
    {"name": "AutoencoderKL", "library": "diffusers", "kind": "model", "model_type": "AutoencoderKL",
     "model_types": ["AutoencoderKL"], "task": "text-to-image", "tasks": ["text-to-image"], "modality": "diffusion"},
]  # fmt: skip

SCAN = universe.DocScan(
    configs={
        "BertConfig": docscan.ConfigDoc(
            "BertConfig", "bert", "bert", ["google-bert/bert-base-uncased"],
            {"hidden_size": 768, "num_hidden_layers": 12, "vocab_size": 30522, "intermediate_size": 3072},
        )
    },
    classes={
        "BertForSequenceClassification": docscan.ClassDoc(
            "BertForSequenceClassification", "bert", "BertConfig", ["textattack/bert-base-uncased-yelp-polarity"]
        )
    },
    pipeline_ids={"StableDiffusionPipeline": ["stable-diffusion-v1-5/stable-diffusion-v1-5"]},
)  # fmt: skip


def _fake_list_models(self, *, filter=None, sort=None, limit=None, expand=None):
    """HfApi.list_models replayed from the recorded pages (one JSON file per library); the signature is
    the real one's subset (tests/compat/test_hub_tier.py runs the real one against a local Hub)."""
    assert sort == "downloads" and expand and "config" in expand
    page = FIXTURES / "hub_api" / f"{filter}.json"
    items = json.loads(page.read_text()) if page.exists() else []
    for item in items[:limit]:
        yield ModelInfo(**item)


@pytest.fixture
def sources_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sources"
    shutil.copytree(FIXTURES / "compat_sources", d)
    return d


@pytest.fixture
def built(sources_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setattr(huggingface_hub.HfApi, "list_models", _fake_list_models)
    universe.refresh_hub(sources_dir, limit=100)
    with caplog.at_level(logging.WARNING, logger="compat"):
        u = universe.build_universe(
            sources_dir, scan=SCAN, known_types=KNOWN_TYPES, arch_entries=ARCH_ENTRIES
        )
    return u, {r["id"]: r for r in u.records}, caplog.text


def test_refresh_stores_recorded_pages(sources_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.HfApi, "list_models", _fake_list_models)
    path = universe.refresh_hub(sources_dir, limit=100)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    bert = next(r for r in rows if r["id"] == "google-bert/bert-base-uncased")
    assert bert["architectures"] == ["BertForMaskedLM"] and bert["params"] == 110106428
    assert bert["created_at"] == "2022-03-02T23:29:04+00:00"
    sd = next(r for r in rows if r["id"] == "stabilityai/sd-turbo")
    assert sd["architectures"] == ["StableDiffusionPipeline"] and sd["model_type"] is None
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    assert meta["rows"] == 3 and len(meta["sha256"]) == 64


def test_merge_priorities_and_sources(built) -> None:
    u, recs, _ = built
    bert = recs["google-bert/bert-base-uncased"]
    assert bert["source"] == "hub-api"  # the Hub API wins over the copied lists
    assert bert["downloads"] == 60123456 and bert["params"] == 110106428
    assert bert["sources"] == [
        "hub-api",
        "hub-2026-04",
        "torchtpu-2026",
        "hub-2022-02",
        "shark-tests",
        "transformers-docs",
    ]
    # docs: the config's checkpoint exercises every bert class without its own documented id
    assert bert["doc_architectures"] == ["BertForMaskedLM", "BertModel"]
    yelp = recs["textattack/bert-base-uncased-yelp-polarity"]
    assert yelp["architectures"] == ["BertForSequenceClassification"]
    assert yelp["doc_architectures"] == ["BertForSequenceClassification"]
    assert recs["HuggingFaceTB/SmolLM2-135M"]["source"] == "hub-api"
    assert recs["deepset/roberta-base-squad2"]["task"] == "question-answering"
    assert recs["google/electra-base-discriminator"]["task"] is None  # "unknown" is not a task
    assert list(recs) == sorted(recs)


def test_model_type_from_tags_and_library(built) -> None:
    _, recs, _ = built
    assert recs["cis-lmu/glotlid"]["model_type"] is None  # 'blt', 'led' are language codes here
    assert recs["cis-lmu/glotlid"]["library"] == "other"
    git = recs["microsoft/git-base"]
    assert git["model_type"] == "git" and git["architectures"] == ["GitForCausalLM"]
    mixtral = recs["mistralai/Mixtral-8x7B-v0.1"]  # card says vllm; weights and config are transformers'
    assert mixtral["library"] == "transformers" and mixtral["architectures"] == ["MixtralForCausalLM"]
    assert mixtral["params"] == 56 * 10**9  # 8x7B: an upper bound, right bucket
    timm = recs["timm/resnet18.a1_in1k"]
    assert (timm["library"], timm["model_type"]) == ("timm", "timm_wrapper")
    assert timm["architectures"] == ["TimmWrapperForImageClassification"]
    assert recs["someone/Llama-3.2-3B-Instruct-GGUF"]["library"] == "other"
    assert recs["someone/old-gpt2"]["library"] == "transformers"  # 2022: no library name, a transformers tag
    assert recs["meta-llama/Llama-3.2-1B"]["params"] == 10**9


def test_diffusers_records_expand_to_components(built) -> None:
    u, recs, _ = built
    reg = {e["name"]: e for e in u.architectures}
    sd = recs["stable-diffusion-v1-5/stable-diffusion-v1-5"]
    assert sd["architectures"] == ["StableDiffusionPipeline"] and "diffusers-docs" in sd["sources"]
    entries = entries_for_record(sd, reg)
    assert {(e["architecture"], e["subfolder"], e["pipeline"]) for e in entries} == {
        ("UNet2DConditionModel", "unet", "StableDiffusionPipeline"),
        ("AutoencoderKL", "vae", "StableDiffusionPipeline"),
    }
    assert all(e["modality"] == "diffusion" and e["task"] == "text-to-image" for e in entries)
    counts = {e["name"]: e["n_models"] for e in u.architectures}
    assert counts["UNet2DConditionModel"] == 2 and counts["StableDiffusionPipeline"] == 2
    assert counts["BertForSequenceClassification"] == 1


def test_malformed_lines_are_named_and_skipped(built) -> None:
    _, recs, log = built
    assert (
        "hub_models_2026-04_top5000.csv:9: malformed row skipped (downloads is not a number: 'lots')" in log
    )
    assert "hub_models_2026-04_top5000.csv:10: malformed row skipped (expected 9 columns)" in log
    assert "hub_models_2026-04_top5000.csv:11: malformed row skipped (bad timestamp 'yesterday')" in log
    assert "hub_models_2022-02.csv:6: malformed row skipped" in log
    for bad in ("bad/downloads", "bad/short-row", "bad/timestamp", "someone/extra-column"):
        assert bad not in recs
    assert "meta-llama/Llama-3.2-1B" in recs  # the rows after a bad one are read


def test_build_is_deterministic(sources_dir: Path, tmp_path: Path) -> None:
    outs = []
    for i in range(2):
        u = universe.build_universe(
            sources_dir, scan=SCAN, known_types=KNOWN_TYPES, arch_entries=ARCH_ENTRIES
        )
        snap, arch = universe.write_universe(u, tmp_path / f"run{i}" / "snapshot.jsonl")
        outs.append((snap.read_bytes(), arch.read_bytes()))
    assert outs[0] == outs[1]
    first = json.loads(outs[0][0].splitlines()[0])
    assert list(first) == universe.FIELDS


def test_missing_input_file_is_a_warning(sources_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    (sources_dir / "shark_task_model_lists.csv").unlink()
    with caplog.at_level(logging.WARNING, logger="compat"):
        u = universe.build_universe(
            sources_dir, scan=SCAN, known_types=KNOWN_TYPES, arch_entries=ARCH_ENTRIES
        )
    assert "shark_task_model_lists.csv: input missing" in caplog.text
    assert u.stats["models"] > 10


def test_refresh_failure_is_a_clear_error(sources_dir: Path, monkeypatch, capsys) -> None:
    def offline(self, **kwargs):
        raise OSError("Hub unreachable")
        yield  # pragma: no cover

    monkeypatch.setattr(huggingface_hub.HfApi, "list_models", offline)
    rc = main(["snapshot", "--refresh", "--sources", str(sources_dir), "--out", str(sources_dir / "x.jsonl")])
    assert rc == 1
    assert "could not read the Hub API (OSError: Hub unreachable)" in capsys.readouterr().err
    assert not (sources_dir / "hub_api.jsonl").exists()


def test_load_snapshot_skips_malformed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "snapshot.jsonl"
    p.write_text('{"id": "a/b", "architectures": []}\n{"id": "broken\n[1, 2]\n{"id": "c/d"}\n')
    with caplog.at_level(logging.WARNING, logger="compat"):
        snap = universe.load_snapshot(p)
    assert set(snap) == {"a/b", "c/d"}
    assert f"{p}:2: malformed snapshot line skipped" in caplog.text
    assert f"{p}:3: malformed snapshot line skipped (not a JSON object)" in caplog.text


# --------------------------------------------------------------------------------------- package scans


def test_docscan_reads_checkpoints_from_source(tmp_path: Path) -> None:
    models = tmp_path / "models" / "foo"
    models.mkdir(parents=True)
    (models / "configuration_foo.py").write_text(
        "from ...utils import auto_docstring\n\n"
        '@auto_docstring(checkpoint="acme/foo-base")\n'
        "class FooConfig(PreTrainedConfig):\n"
        '    """See [acme/foo-large](https://huggingface.co/acme/foo-large) and '
        '[docs](https://huggingface.co/docs/transformers)."""\n'
        '    model_type = "foo"\n'
        "    hidden_size: int = 64\n    num_hidden_layers: int = 2\n    vocab_size: int = 100\n"
        "    sub_config: dict | None = None\n"
    )
    (models / "modeling_foo.py").write_text(
        '_CHECKPOINT_FOR_DOC = "acme/foo-doc"\n'
        "class FooPreTrainedModel(PreTrainedModel):\n    config: FooConfig\n\n"
        "class FooModel(FooPreTrainedModel):\n    pass\n\n"
        "class FooForMaskedLM(FooPreTrainedModel):\n"
        "    def forward(self):\n"
        '        """>>> model = FooForMaskedLM.from_pretrained(\n        ...     "acme/foo-mlm")\n'
        '        >>> tok = AutoTokenizer.from_pretrained("username/other")"""\n'
    )
    configs = docscan.scan_configs(tmp_path / "models")
    assert configs["FooConfig"].model_type == "foo"
    assert configs["FooConfig"].checkpoints == ["acme/foo-base", "acme/foo-large"]
    assert configs["FooConfig"].fields["hidden_size"] == 64 and "sub_config" in configs["FooConfig"].fields
    classes = docscan.scan_model_classes(tmp_path / "models")
    assert classes["FooForMaskedLM"].checkpoints == ["acme/foo-mlm"]
    assert classes["FooModel"].checkpoints == [] and classes["FooModel"].module_checkpoints == [
        "acme/foo-doc"
    ]
    assert classes["FooModel"].config_class == "FooConfig"
    assert docscan.estimate_params(configs["FooConfig"].fields) == 100 * 64 + 2 * (4 * 64 * 64 + 2 * 64 * 256)


def test_from_pretrained_calls_follow_variables() -> None:
    text = (
        '>>> model_id = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"\n'
        '>>> vae = AutoencoderKLWan.from_pretrained(model_id, subfolder="vae")\n'
        ">>> pipe = WanPipeline.from_pretrained(model_id, vae=vae)\n"
        '>>> cn = ControlNetModel.from_pretrained("lllyasviel/sd-controlnet-canny")\n'
    )
    assert docscan.from_pretrained_calls(text) == [
        ("AutoencoderKLWan", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "vae"),
        ("WanPipeline", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", None),
        ("ControlNetModel", "lllyasviel/sd-controlnet-canny", None),
    ]


def test_transformers_registry_from_auto_mappings() -> None:
    entries = {e["name"]: e for e in registry.transformers_architectures()}
    assert len(entries) >= 1000
    expect = {
        "BertForMaskedLM": ("bert", "fill-mask", "text"),
        "WhisperForConditionalGeneration": ("whisper", "automatic-speech-recognition", "audio"),
        "CLIPModel": ("clip", "zero-shot-image-classification", "multimodal"),
        "VideoMAEForVideoClassification": ("videomae", "video-classification", "video"),
        "PatchTSTForRegression": ("patchtst", "time-series-regression", "time-series"),
        "ViTForImageClassification": ("vit", "image-classification", "vision"),
    }
    for name, (mt, task, modality) in expect.items():
        e = entries[name]
        assert (e["model_type"], e["task"], e["modality"]) == (mt, task, modality), name
    by_type = registry.by_model_type(entries.values())
    assert registry.infer_architecture("bert", "fill-mask", by_type) == "BertForMaskedLM"
    assert registry.infer_architecture("bert", "sentence-similarity", by_type) == "BertModel"
    assert registry.infer_architecture("whisper", "automatic-speech-recognition", by_type) == (
        "WhisperForConditionalGeneration"
    )
    assert registry.infer_architecture("no_such_type", "fill-mask", by_type) is None


def test_pipeline_components_and_tasks() -> None:
    class Unet:  # stand-ins for diffusers classes
        pass

    class Vae:
        pass

    class FakePipeline:
        @staticmethod
        def _get_signature_types():
            return {"vae": (Vae,), "text_encoder": (object,), "unet": (Unet,), "scheduler": (int,)}

    models = {"UNetX": Unet, "VaeX": Vae}
    assert registry.pipeline_components(FakePipeline, models) == {"vae": "VaeX", "unet": "UNetX"}
    entries = {
        e["name"]: e for e in registry.diffusers_architectures(models, {"FakeImg2ImgPipeline": FakePipeline})
    }
    assert entries["FakeImg2ImgPipeline"]["task"] == "image-to-image"
    assert entries["UNetX"]["kind"] == "model" and entries["UNetX"]["modality"] == "diffusion"
    assert registry.pipeline_task("WanImageToVideoPipeline") == "image-to-video"


def test_params_from_name() -> None:
    assert sources.params_from_name("meta-llama/Llama-3.2-1B-Instruct") == 10**9
    assert sources.params_from_name("EleutherAI/gpt-neo-125M") == 125 * 10**6
    assert sources.params_from_name("x/Qwen3.6-35B-A3B") == 35 * 10**9
    assert sources.params_from_name("microsoft/Phi-3-mini-4k-instruct") is None
    assert sources.params_from_name("google-bert/bert-base-uncased") is None

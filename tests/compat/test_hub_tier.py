"""The hub tier for real, without the internet: `compat run --tier hub` against a local Hub on 127.0.0.1.

The server (tests/compat/hub_server.py) serves recorded Hub API answers and real repository files
(tests/fixtures/hub_server/) in the Hub's URL layout. Each run is the real CLI in a subprocess whose
huggingface_hub talks only to it: `HF_ENDPOINT` is the server, `HF_HOME` a temp folder, no token, and any
proxied request (a client ignoring `HF_ENDPOINT`) would land on the server's proxy trap, which the tests
check stayed empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from compat.report import generate
from tests.compat.hub_server import FIXTURES, HubServer

ROOT = Path(__file__).resolve().parents[2]
BERT = "hf-tpu-test/tiny-bert"
LLAMA = "hf-tpu-test/big-llama"
WIDE = "hf-tpu-test/wide-bert"  # built by the test (12.8 MB: too big to commit)
BERT_SHA = json.loads((FIXTURES / "api" / "hf-tpu-test--tiny-bert.json").read_text())["sha"]
ATTEMPTS = 3


def _env(server: HubServer, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY")}
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(k, None)
    env.update(
        HF_ENDPOINT=server.url,
        HF_HOME=str(home),
        HF_HUB_OFFLINE="0",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HUB_ETAG_TIMEOUT="2",
        HF_HUB_DOWNLOAD_TIMEOUT="2",
        # anything not for 127.0.0.1 goes to the server's proxy trap instead of the internet
        HTTP_PROXY=server.url,
        HTTPS_PROXY=server.url,
        ALL_PROXY=server.url,
        NO_PROXY="127.0.0.1",
        COMPAT_HUB_TIMEOUT_S="1",
        COMPAT_HUB_ATTEMPTS=str(ATTEMPTS),
        COMPAT_HUB_BACKOFF_S="0.2",
        COMPAT_HUB_BACKOFF_MAX_S="1",
    )
    return env


def _run(server: HubServer, home: Path, out: Path, ids: list[str], *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "compat", "run", "--models", ",".join(ids), "--tier", "hub"]
    cmd += ["--device", "cpu", "--modes", "eager", "--out", str(out), "--timeout", "120", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(server, home), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def _by_id(records: list[dict]) -> dict[str, dict]:
    return {r["model_id"]: r for r in records}


def _wide_bert(root: Path) -> str:
    """A 12.8 MB tiny-depth BERT (vocabulary 32,000 x 96) built into `root` with its API answer, in the
    recorded shape (tests/fixtures/hub_server/make_fixtures.py) but without the safetensors metadata, so the
    harness sizes it from its files. Big enough that huggingface_hub has written a 10 MiB chunk when the
    injected break comes: that download resumes with a Range request."""
    import importlib.util

    import torch
    from transformers import BertConfig, BertForMaskedLM

    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    repo = root / "repos" / WIDE
    config = BertConfig(
        vocab_size=32000,
        hidden_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        architectures=["BertForMaskedLM"],
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(repo)
    info = make.model_info(
        WIDE,
        repo,
        {
            "pipeline_tag": "fill-mask",
            "tags": ["transformers", "safetensors", "bert", "fill-mask"],
            "config": {"architectures": ["BertForMaskedLM"], "model_type": "bert"},
        },
    )
    (root / "api").mkdir(parents=True)
    (root / "api" / f"{WIDE.replace('/', '--')}.json").write_text(json.dumps(info))
    return info["sha"]


def test_resolve_download_under_the_cap_cache_resume_and_report(tmp_path):
    home = tmp_path / "hf_home"
    wide_sha = _wide_bert(tmp_path / "generated")
    cap = ("--hub-max-params", "5000000")
    ids = [BERT, WIDE, LLAMA]
    with HubServer(tmp_path / "generated") as server:
        # the wide model's weights break off after 11,000,000 of ~12.8 MB: the download must resume there
        server.faults[(WIDE, "model.safetensors")] = {"drop_after": 11_000_000, "times": 1}
        recs = _by_id(_run(server, home, tmp_path / "run1", ids, *cap))

        for mid, sha in ((BERT, BERT_SHA), (WIDE, wide_sha)):
            r = recs[mid]
            assert r["status"] == "pass", r["error"]
            assert r["tier"] == "hub" and r["architecture"] == "BertForMaskedLM"
            assert f"hub revision {sha}; parameters" in " ".join(r["notes"])
        # config.json came at planning; the worker fetched the weights and the tokenizer files
        assert "hub files: 4 downloaded, 1 from the Hub cache" in recs[BERT]["notes"]
        assert "hub files: 1 downloaded, 1 from the Hub cache" in recs[WIDE]["notes"]
        gets = server.requests("GET", WIDE, "model.safetensors")
        assert [g["range"] for g in gets] == [None, f"bytes={10 * 2**20}-"]  # one 10 MiB chunk was kept
        for mid, sha, names in (
            (
                BERT,
                BERT_SHA,
                ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"),
            ),
            (WIDE, wide_sha, ("config.json", "model.safetensors")),
        ):
            snap = home / "hub" / f"models--{mid.replace('/', '--')}" / "snapshots" / sha
            for name in names:
                served = server._find("repos", mid, name).read_bytes()
                assert (snap / name).read_bytes() == served, (mid, name)
        assert not list((home / "hub").rglob("*.incomplete"))

        # the 7B model is over the cap: skipped before any weight was asked for
        llama = recs[LLAMA]
        assert llama["status"] == "skipped" and "exceed the hub-tier cap of 5e+06" in llama["error"]
        assert not [r for r in server.requests(repo=LLAMA) if r["kind"].endswith(".safetensors")]
        assert server.proxied == []

        # a second run finds everything in the cache: API calls only, no file request at all
        server.clear()
        again = _by_id(_run(server, home, tmp_path / "run2", ids, *cap))
        assert again[BERT]["status"] == again[WIDE]["status"] == "pass"
        assert "hub files: 0 downloaded, 5 from the Hub cache" in again[BERT]["notes"]
        assert {r["kind"] for r in server.requests()} == {"api"}

        # a run stopped before its last model resumes: only that model runs, once, from the cache
        results = tmp_path / "run2" / "results.jsonl"
        lines = results.read_text().splitlines()
        results.write_text("".join(line + "\n" for line in lines if json.loads(line)["model_id"] != WIDE))
        server.clear()
        _run(server, home, tmp_path / "run2", ids, *cap, "--resume")
        final = [json.loads(line) for line in results.read_text().splitlines()]
        assert sorted(r["model_id"] for r in final) == sorted(ids)
        assert {r["model_id"] for r in final if r["status"] == "pass"} == {BERT, WIDE}
        assert {r["repo"] for r in server.requests()} == {WIDE} and {
            r["kind"] for r in server.requests()
        } == {"api"}
        assert server.proxied == []

    rep = generate(tmp_path / "run2")
    assert rep.summary["per_mode"]["eager"]["by_status"] == {"pass": 2, "skipped": 1}
    assert WIDE in (tmp_path / "run2" / "index.html").read_text()


def test_a_hub_that_fails_is_retried_then_a_harness_error_naming_the_url(tmp_path):
    attempts = ATTEMPTS
    broken = {
        "broken/api-503": ({"status": 503}, "HTTP 503", attempts),
        "broken/api-429": ({"status": 429, "retry_after": 0}, "HTTP 429", attempts),
        "broken/api-404": ({}, "HTTP 404 (not retried)", 1),  # no such repository: an answer, not retried
        "broken/api-timeout": ({"delay": 2.5}, "timed out after 1s", attempts),
    }
    with HubServer() as server:
        for repo, (fault, _, _) in broken.items():
            if fault:
                server.faults[(repo, "api")] = fault
        server.faults[(BERT, "model.safetensors")] = {"status": 503}  # the weights fail in the worker
        recs = _by_id(_run(server, tmp_path / "hf_home", tmp_path / "out", [*broken, BERT]))

        for repo, (_, reason, tries) in broken.items():
            r = recs[repo]
            assert r["status"] == "harness_error" and r["phase"] == "plan", r
            assert f"{server.url}/api/models/{repo}" in r["error"] and reason in r["error"], r["error"]
            if tries > 1:
                assert f"after {tries} attempts" in r["error"]
            assert len(server.requests("GET", repo, "api")) == tries, repo

        bert = recs[BERT]
        assert bert["status"] == "harness_error" and bert["phase"] == "download", bert
        assert f"{server.url}/{BERT}/resolve/{BERT_SHA}/model.safetensors" in bert["error"]
        assert f"HTTP 503 (after {attempts} attempts)" in bert["error"]
        heads = server.requests("HEAD", BERT, "model.safetensors")
        assert len(heads) == attempts and not server.requests("GET", BERT, "model.safetensors")
        assert server.proxied == []
    # the run itself went on to the end: every model has its record, nothing crashed
    assert set(recs) == {*broken, BERT}


def test_the_list_endpoint_feeds_snapshot_refresh(tmp_path):
    """`compat snapshot --refresh`'s reader (compat.sources.fetch_hub, huggingface_hub's list_models)
    against the recorded `GET /api/models?...` page."""
    code = "import json; from compat.sources import fetch_hub; print(json.dumps(fetch_hub(10, ['transformers'])))"
    with HubServer() as server:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=_env(server, tmp_path / "hf_home"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = {r["id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
        (req,) = server.requests("GET")
        assert server.proxied == []
    assert req["path"].startswith("/api/models?") and "filter=transformers" in req["path"]
    assert "expand" in req["path"] and "sort=downloads" in req["path"]
    assert sorted(recs) == [LLAMA, BERT]
    assert recs[LLAMA]["params"] == 6738415616 and recs[LLAMA]["architectures"] == ["LlamaForCausalLM"]
    assert recs[BERT]["task"] == "fill-mask" and recs[BERT]["model_type"] == "bert"
    assert recs[BERT]["created_at"].startswith("2026-11-20")

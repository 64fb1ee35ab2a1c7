"""`.github/workflows/nightly.yml` parses, and every `compat` command it runs exists with those flags.

Commands are read out of each step's shell, with the workflow's own expressions and environment
substituted, and handed to compat's argparse parser: a renamed flag or verb fails here, not at 02:17.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from compat.cli import build_parser, main
from tests.compat import synth

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "nightly.yml"
NIGHT = "2026-01-02"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
SHELL_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _expression(expr: str, job: dict) -> str:
    """A value for a GitHub expression, as a scheduled run would see it."""
    m = re.fullmatch(r".*\|\|\s*'([^']*)'", expr)
    if m:  # `inputs.x || 'default'`: a scheduled run has no inputs
        return m.group(1)
    if expr.startswith("matrix."):
        return str(job["strategy"]["matrix"][expr.split(".", 1)[1]][0])
    if expr == "needs.plan.outputs.night":
        return NIGHT
    if expr.split(".")[0] in ("secrets", "vars", "github", "steps"):
        return "x"
    pytest.fail(f"the test does not know the expression ${{{{ {expr} }}}}: add it to _expression")


def _expand(text: str, job: dict, env: dict[str, str]) -> str:
    text = EXPR.sub(lambda m: _expression(m.group(1), job), text)
    return SHELL_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def compat_commands(workflow: dict) -> list[tuple[str, list[str]]]:
    """(job name, argv after `compat`) for every `python -m compat ...` in every step."""
    out = []
    top_env = workflow.get("env") or {}
    for name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            if "run" not in step:
                continue
            env: dict[str, str] = {}
            for scope in (top_env, job.get("env") or {}, step.get("env") or {}):
                env.update({k: _expand(str(v), job, env) for k, v in scope.items()})
            script = step["run"].replace("\\\n", " ")
            for line in script.splitlines():
                if "-m compat " not in line:
                    continue
                lex = shlex.shlex(_expand(line, job, env), posix=True, punctuation_chars=True)
                lex.whitespace_split = True
                tokens = list(lex)
                start = tokens.index("compat") + 1
                argv = []
                for t in tokens[start:]:
                    if t in ("||", "&&", "|", ";", ">", ">>"):
                        break
                    argv.append(t)
                out.append((name, argv))
    return out


def test_workflow_triggers_jobs_and_shard_matrix(workflow: dict) -> None:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on
    jobs = workflow["jobs"]
    n = int(workflow["env"]["SHARDS"])
    assert n > 1 and jobs["shards"]["strategy"]["matrix"]["shard"] == list(range(n))
    assert jobs["shards"]["strategy"]["fail-fast"] is False
    uploads = [
        s for s in jobs["shards"]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")
    ]
    assert len(uploads) == 1 and "shard/results.jsonl" in uploads[0]["with"]["path"]
    assert set(jobs["merge"]["needs"]) >= {"shards", "plan"}
    downloads = [
        s for s in jobs["merge"]["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact")
    ]
    assert downloads and downloads[0]["with"]["pattern"] == "shard-*"
    hub = [s for s in jobs["merge"]["steps"] if "compat publish" in s.get("run", "")]
    assert len(hub) == 1 and "HF_TOKEN" in hub[0]["if"]  # the Hub push runs only with a token
    assert jobs["merge"]["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    names = [s.get("name", "") for s in jobs["merge"]["steps"]]
    # the gates fail the job only after publishing
    assert names[-2:] == ["Regression gate", "Regression gate (real tier)"]
    assert "real" in jobs["merge"]["needs"]


def test_every_compat_command_parses_with_the_harness_parser(workflow: dict) -> None:
    commands = compat_commands(workflow)
    verbs = [argv[0] for _, argv in commands]
    assert verbs == ["run", "run", "merge", "report", "report", "publish", "gate", "gate"]
    parser = build_parser()
    for job, argv in commands:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"job {job}: `compat {shlex.join(argv)}` does not parse")
        if args.command == "run" and job == "real":  # the trained checkpoints, every mode, a night apart
            assert args.tier == "real" and args.sample is None and args.models is None
            assert (
                args.date == NIGHT
                and args.out == "real"
                and args.modes == "eager,compiled,defer_and_fuse,train"
            )
        elif args.command == "run":
            assert args.shard == (0, 4) and args.date == NIGHT and args.device == "tpu"
            assert args.sample == "5000" and args.modes == "eager,compiled,defer_and_fuse,train"
            assert args.out == "shard" and args.tier == "offline"
        if args.command == "merge":
            assert args.dirs == ["shards/shard-*"] and args.out == f"site/{NIGHT}"
        if args.command == "report":
            assert (args.results_dir, args.previous_in) in {
                (f"site/{NIGHT}", "site"),
                (f"site/real/{NIGHT}", "site/real"),
            }


def test_the_parser_check_is_not_vacuous() -> None:
    """A flag compat does not have makes the parser refuse, which is what the test above relies on."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["merge", "a", "--out", "b", "--no-such-flag"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--sample", "smoke", "--shard", "4/4"])


def test_publish_skips_without_hf_token_and_gate_needs_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The Hub push is never exercised here: without HF_TOKEN it is a skip, with one a missing night fails
    before `datasets` is imported."""
    night = synth.write_results(tmp_path / NIGHT, synth.night())
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["publish", str(night), "--hub-dataset", "org/compat"]) == 0
    assert "HF_TOKEN is not set: Hub dataset upload skipped" in capsys.readouterr().out
    monkeypatch.setenv("HF_TOKEN", "not-a-token")
    assert main(["publish", str(tmp_path / "nowhere"), "--hub-dataset", "org/compat"]) == 2
    assert "no results.jsonl" in capsys.readouterr().err
    assert main(["gate", str(night)]) == 2  # no summary.json yet
    assert "run `compat report" in capsys.readouterr().err

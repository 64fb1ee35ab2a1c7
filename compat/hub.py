"""The hub tier's traffic with the Hub: resolve a model, fetch its files into the Hub cache, bounded.

- ``resolve(model_id)``: ``GET {HF_ENDPOINT}/api/models/{id}`` (``/revision/{rev}`` when a revision is
  asked for) with file sizes (``blobs=True``): the commit sha the run pins, the files, the parameter count.
- ``fetch(model_id, sha, files)``: each file through ``huggingface_hub.hf_hub_download`` at that commit,
  into the Hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``). A file already in the cache at that commit
  costs no request at all, so a second run downloads nothing. Before a download a HEAD request (bounded
  timeout) checks it is there and how big it is; the download itself resumes an interrupted transfer with a
  Range request (huggingface_hub's own resume).

Every request has a timeout. A timeout, a dropped connection, a 5xx or a 429 is retried with exponential
backoff (a 429's ``Retry-After`` is honoured up to the backoff cap); then, and at once for any other error
(404, 401, ...: an answer, not a failure to answer), a ``HarnessError`` names the model and the URL. The
run records it as ``harness_error`` and goes on.

Environment (read at call time, so a test or a job can point it anywhere): ``HF_ENDPOINT``, ``HF_HOME`` /
``HF_HUB_CACHE``, ``HF_TOKEN``; ``COMPAT_HUB_TIMEOUT_S`` (per request, default 30),
``COMPAT_HUB_ATTEMPTS`` (default 4), ``COMPAT_HUB_BACKOFF_S`` (first wait, doubled each time, default 2),
``COMPAT_HUB_BACKOFF_MAX_S`` (default 30).
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from compat.errors import HarnessError

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# what a run needs from a repository: config, weights (safetensors when there are any), tokenizer/processor
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
)
SAFETENSORS = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json")
PYTORCH_BIN = ("pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def timeout_s() -> float:
    return _env_float("COMPAT_HUB_TIMEOUT_S", 30.0)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def file_url(model_id: str, filename: str, revision: str) -> str:
    return f"{endpoint()}/{model_id}/resolve/{quote(revision, safe='')}/{quote(filename)}"


def api_url(model_id: str, revision: str | None = None) -> str:
    url = f"{endpoint()}/api/models/{model_id}"
    return url + (f"/revision/{quote(revision, safe='')}" if revision else "")


# ------------------------------------------------------------------------------------------------ retries


def _failure(exc: BaseException, url: str) -> tuple[str, bool, float | None, str]:
    """(what went wrong, transient?, Retry-After seconds, the URL it happened on)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    with_url = url
    for holder in (response, exc):
        try:
            req = getattr(holder, "request", None)
            if req is not None and getattr(req, "url", None) is not None:
                with_url = str(req.url)
                break
        except RuntimeError:  # httpx: .request not set
            continue
    if isinstance(status, int):
        retry_after = None
        try:
            retry_after = float(response.headers.get("Retry-After"))
        except (TypeError, ValueError, AttributeError):
            pass
        return f"HTTP {status}", status in TRANSIENT_STATUS, retry_after, with_url
    name = type(exc).__name__
    if name == "OfflineModeIsEnabled":  # HF_HUB_OFFLINE=1: a setting, not a network failure
        return f"HF_HUB_OFFLINE is set ({exc})", False, None, with_url
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out after {timeout_s():g}s ({name})", True, None, with_url
    if isinstance(exc, httpx2.TransportError | ConnectionError | TimeoutError):
        return f"connection failed ({name}: {exc})", True, None, with_url
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return f"incomplete download ({exc})", True, None, with_url
    return f"{name}: {' '.join(str(exc).split())[:300]}", False, None, with_url


def with_retries(what: str, url: str, fn: Callable[[], T], sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried with backoff on transient failures; a HarnessError naming ``url`` when it gives up."""
    attempts = max(1, int(_env_float("COMPAT_HUB_ATTEMPTS", 4)))
    delay = _env_float("COMPAT_HUB_BACKOFF_S", 2.0)
    cap = _env_float("COMPAT_HUB_BACKOFF_MAX_S", 30.0)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except HarnessError:
            raise
        except Exception as exc:
            reason, transient, retry_after, where = _failure(exc, url)
            if not transient or attempt == attempts:
                tries = f"after {attempt} attempts" if attempt > 1 else "not retried"
                raise HarnessError(f"{what}: {where}: {reason} ({tries})") from None
            sleep(min(cap, retry_after if retry_after is not None else delay))
            delay *= 2
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------------ resolve


@dataclass
class Resolved:
    """What the Hub says about a model at the time of the run."""

    model_id: str
    sha: str
    files: dict[str, int | None] = field(default_factory=dict)  # repo file -> size in bytes (None: unknown)
    parameters: int | None = None  # safetensors metadata, when the Hub has it
    architecture: str | None = None  # config.architectures[0] as the Hub reads it
    model_type: str | None = None
    pipeline_tag: str | None = None

    def weight_bytes(self, names: list[str]) -> int:
        return sum(self.files.get(n) or 0 for n in names if n.endswith((".safetensors", ".bin")))


def resolve(model_id: str, revision: str | None = None) -> Resolved:
    """The model's commit, files and size from the Hub API (retried; HarnessError naming the URL)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint())
    info = with_retries(
        f"{model_id}: cannot resolve on the Hub",
        api_url(model_id, revision) + "?blobs=True",
        lambda: api.model_info(model_id, revision=revision, files_metadata=True, timeout=timeout_s()),
    )
    sha = getattr(info, "sha", None)
    if not sha:
        raise HarnessError(
            f"{model_id}: the Hub's answer at {api_url(model_id, revision)} names no commit sha"
        )
    files = {}
    for s in getattr(info, "siblings", None) or []:
        size = getattr(s, "size", None)
        lfs = getattr(s, "lfs", None)
        if size is None and lfs is not None:
            size = getattr(lfs, "size", None)
        files[str(s.rfilename)] = size
    total = getattr(getattr(info, "safetensors", None), "total", None)
    config = getattr(info, "config", None) or {}
    archs = config.get("architectures") or [None]
    return Resolved(
        model_id,
        sha,
        files,
        int(total) if total else None,
        architecture=archs[0],
        model_type=config.get("model_type"),
        pipeline_tag=getattr(info, "pipeline_tag", None),
    )


def files_to_fetch(resolved: Resolved) -> list[str]:
    """Config, weights (safetensors when the repo has any, else PyTorch .bin) and tokenizer/processor files."""
    names = list(resolved.files)

    def matching(patterns: tuple[str, ...]) -> list[str]:
        return sorted(n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns))

    weights = matching(SAFETENSORS) or matching(PYTORCH_BIN)
    return [n for n in CONFIG_FILES if n in resolved.files] + weights + matching(TOKENIZER_FILES)


# -------------------------------------------------------------------------------------------------- fetch


def cached(model_id: str, filename: str, sha: str) -> str | None:
    """The file's path in the Hub cache at commit ``sha``, or None (no request made)."""
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(model_id, filename, cache_dir=cache_dir(), revision=sha)
    return hit if isinstance(hit, str) else None


def fetch(
    model_id: str, sha: str, files: list[str], max_bytes: int | None = None
) -> tuple[str, dict[str, int]]:
    """Every file at commit ``sha`` into the Hub cache; returns (the snapshot folder, {"downloaded": n,
    "cached": n}). Files over ``max_bytes`` in all (by the HEAD answers) are refused before any download."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download

    todo = [f for f in files if cached(model_id, f, sha) is None]
    counts = {"downloaded": 0, "cached": len(files) - len(todo)}
    sizes: dict[str, int] = {}
    for f in todo:  # HEAD first: the file is there, and its size counts against the cap before any GET
        url = file_url(model_id, f, sha)
        meta = with_retries(
            f"{model_id}: cannot reach {f} on the Hub",
            url,
            lambda url=url: get_hf_file_metadata(url, timeout=timeout_s()),
        )
        sizes[f] = int(meta.size or 0)
    if max_bytes is not None and sum(sizes.values()) > max_bytes:
        raise HarnessError(
            f"{model_id}: its files are {sum(sizes.values()) / 2**20:.1f} MiB, over the hub-tier cap of "
            f"{max_bytes / 2**20:.1f} MiB: not downloaded"
        )
    for f in todo:
        url = file_url(model_id, f, sha)
        with_retries(
            f"{model_id}: cannot download {f} from the Hub",
            url,
            lambda f=f: hf_hub_download(
                model_id,
                f,
                revision=sha,
                cache_dir=cache_dir(),
                endpoint=endpoint(),
                etag_timeout=timeout_s(),
            ),
        )
        counts["downloaded"] += 1
    folder = None
    for f in files:
        path = cached(model_id, f, sha)
        if path is None:
            raise HarnessError(f"{model_id}: {f} is not in the Hub cache after its download")
        folder = Path(path).parents[len(Path(f).parts) - 1]
    if folder is None:
        raise HarnessError(f"{model_id}: nothing to download (the Hub lists no config or weights)")
    return str(folder), counts


def local_config_dir(model_id: str, sha: str) -> str:
    """config.json at ``sha`` fetched (or found) in the Hub cache; its snapshot folder."""
    folder, _ = fetch(model_id, sha, ["config.json"])
    return folder

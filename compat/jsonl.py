"""JSON Lines I/O shared by the harness: deterministic writes, tolerant reads that name the bad line."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("compat")


def dumps(obj: Any) -> str:
    """One canonical line: same object, same bytes (keys keep their insertion order)."""
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write rows atomically (temp file + rename) so a killed writer never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(dumps(row) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def iter_jsonl(path: str | os.PathLike, what: str = "record") -> Iterator[tuple[int, dict]]:
    """Yield (line number, object); a malformed line is a warning naming file and line, then skipped."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                log.warning("%s:%d: malformed %s line skipped (%s)", path, lineno, what, e.msg)
                continue
            if not isinstance(obj, dict):
                log.warning("%s:%d: malformed %s line skipped (not a JSON object)", path, lineno, what)
                continue
            yield lineno, obj


def read_jsonl(path: str | os.PathLike, what: str = "record") -> list[dict]:
    """All well-formed objects of a JSONL file (see iter_jsonl for bad lines)."""
    return [obj for _, obj in iter_jsonl(path, what)]

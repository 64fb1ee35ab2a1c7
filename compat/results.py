"""``results.jsonl``: append one record per line, durably; read back what is finished for ``--resume``.

Each line is written with a single ``write`` on an O_APPEND descriptor followed by fsync, so a kill at
any moment leaves at most one torn last line; ``load_done`` drops it (and truncates it away) before the
resumed run appends, so nothing finished is lost and nothing is written twice.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from compat.records import Record


class ResultsWriteError(OSError):
    """The results file cannot take another line (disk full, file-size limit, read-only folder)."""


class ResultsWriter:
    """Thread-safe, fsync'ed JSONL appender."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, record: dict[str, Any] | Record) -> None:
        rec = record if isinstance(record, Record) else Record.from_dict(record)
        line = (rec.to_json() + "\n").encode()
        with self._lock:
            size = os.fstat(self._fd).st_size
            try:
                if os.write(self._fd, line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync(self._fd)
            except OSError as exc:
                try:  # a line cut short by the failure goes: the file keeps whole lines only
                    os.ftruncate(self._fd, size)
                except OSError:
                    pass  # read_records(repair=True) drops a torn last line on --resume anyway
                raise ResultsWriteError(
                    exc.errno, f"cannot append to {self.path}: {exc.strerror or exc}"
                ) from exc

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_records(path: str | os.PathLike[str], repair: bool = False) -> list[dict[str, Any]]:
    """Every complete record in the file; a torn last line is skipped (and cut off when ``repair``)."""
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    records: list[dict[str, Any]] = []
    good_end = 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # torn last line (no newline): the writer was killed mid-line
        line = data[pos:nl].strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a corrupt line is not a result; the model reruns
        pos = nl + 1
        good_end = pos
    if repair and good_end < len(data):
        with open(p, "r+b") as f:
            f.truncate(good_end)
    return records


def load_done(path: str | os.PathLike[str]) -> set[tuple[str, str]]:
    """The finished (model_id, mode) pairs, counting ids a deduplicated record is attributed to."""
    done: set[tuple[str, str]] = set()
    for rec in read_records(path, repair=True):
        mode = rec.get("mode")
        ids = [rec.get("model_id")] + list(rec.get("attributed_ids") or [])
        for mid in ids:
            if mid and mode:
                done.add((str(mid), str(mode)))
    return done


def set_aside(path: str | os.PathLike[str]) -> Path | None:
    """Move an existing results file out of the way for a fresh (non-resumed) run."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return None
    dest = p.with_name(f"{p.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
    os.replace(p, dest)
    return dest

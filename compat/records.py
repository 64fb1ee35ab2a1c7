"""The result record: one line of ``results.jsonl`` per (model, mode).

Every consumer (resume, report, regression diff) reads these lines, so the schema lives in one place and
every status a run can end in is named here.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

MODES = ("eager", "compiled", "defer_and_fuse", "train")

STATUSES = (
    "pass",
    "fail_accuracy",
    "fail_to_run",
    "compile_fail",
    "timeout",
    "oom",
    "crash",
    "harness_error",
    "skipped",
    "eager_nondeterministic",
)

# Statuses that say nothing about the backend: the harness (or the reference) could not run the model.
NOT_BACKEND_STATUSES = frozenset({"harness_error", "skipped", "eager_nondeterministic"})

CAUSES = ("upstream",)  # a failure's cause when it is not ours (see compat.attribution)

ENTRY_FIELDS = ("model_type", "architecture", "task", "modality")


@dataclass
class Record:
    """Outcome of one model in one mode on one device."""

    model_id: str
    mode: str
    device: str
    status: str
    model_type: str | None = None
    architecture: str | None = None
    task: str | None = None
    modality: str | None = None
    library: str | None = None
    model_class: str | None = None
    phase: str | None = None  # where it stopped: plan, materialize, inputs, reference, load, first_call, ...
    error_class: str | None = None
    error: str | None = None
    missing_op: str | None = None
    graph_breaks: int | None = None
    times: dict[str, float | None] = field(
        default_factory=lambda: {"load_s": None, "first_call_s": None, "steady_s": None}
    )
    peak_mem_bytes: int | None = None
    max_abs_diff: float | None = None
    rmse: dict[str, float | None] | None = None  # {"out_vs_fp64", "ref_vs_fp64", "multiplier"}
    tolerance: float | None = None
    compile_backend: str | None = None
    dedup_key: str | None = None
    attributed_ids: list[str] = field(default_factory=list)
    tier: str = "offline"
    date: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    notes: list[str] = field(default_factory=list)
    # "upstream" when the failure reproduces on CPU without hf_tpu (compat.attribution), else None
    cause: str | None = None
    # the CPU re-run behind it: {"verdict": upstream|ours|inconclusive, "rerun", "detail", "seconds", ...}
    attribution: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"model {self.model_id!r}: unknown status {self.status!r}; expected one of {STATUSES}"
            )
        if self.mode not in MODES:
            raise ValueError(f"model {self.model_id!r}: unknown mode {self.mode!r}; expected one of {MODES}")
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(
                f"model {self.model_id!r}: unknown cause {self.cause!r}; expected one of {CAUSES}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """One JSON line, no newline; non-finite floats become null so every reader can parse it."""
        return json.dumps(_finite(self.to_dict()), sort_keys=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def covered_ids(self) -> list[str]:
        """Every model id this record answers for (itself plus the duplicates attributed to it)."""
        ids = [self.model_id]
        ids += [i for i in self.attributed_ids if i != self.model_id]
        return ids


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def record_for(entry: dict[str, Any], mode: str, device: str, status: str, **kw: Any) -> Record:
    """A record pre-filled from a sample entry (id, model_type, architecture, task, modality, library)."""
    base = {k: entry.get(k) for k in ENTRY_FIELDS}
    base["library"] = entry.get("library")
    base.update(kw)
    return Record(model_id=str(entry.get("id")), mode=mode, device=device, status=status, **base)


_MISSING_OP_PATTERNS = (
    # hf_tpu's own message: "hf_tpu has no lowering for aten::<op>.<overload> ..."
    re.compile(r"no lowering for (aten::[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)"),
    # torch's dispatcher: "Could not run 'aten::x' with arguments from the 'PrivateUse1' backend"
    re.compile(r"Could not run '(aten::[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)' with arguments from the"),
    # "The operator 'aten::x' is not currently implemented for the tpu device"
    re.compile(r"operator '(aten::[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)' is not currently implemented"),
)


def parse_missing_op(message: str | None) -> str | None:
    """The ``aten::op[.overload]`` a NotImplementedError names, or None when the message names none."""
    if not message:
        return None
    for pattern in _MISSING_OP_PATTERNS:
        m = pattern.search(message)
        if m:
            return m.group(1)
    return None


def exception_chain_text(exc: BaseException, limit: int = 4000) -> str:
    """The message of an exception and of its causes: backends wrap the real error (e.g. dynamo)."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or cur.__context__
    text = "\n  caused by ".join(parts)
    return text if len(text) <= limit else text[: limit - 20] + " ...[truncated]"

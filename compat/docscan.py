"""Real checkpoint ids named by the installed transformers/diffusers sources.

Config docstrings (`@auto_docstring(checkpoint=...)`, `[org/name](https://huggingface.co/org/name)`),
`_CHECKPOINT_FOR_DOC`, `X.from_pretrained("org/name")` examples: a current, offline list of real Hub ids
for the long tail of architectures. The transformers side is read with `ast` (no model module is
imported: importing ~600 modeling modules would take minutes); diffusers pipelines are imported because
their component classes come from signatures.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("compat")

_ID = r"[A-Za-z0-9][\w.\-]*/[\w.\-]*[A-Za-z0-9]"
LINK_RE = re.compile(r"https?://huggingface\.co/(" + _ID + r")")
# `X.from_pretrained("org/name", ..., subfolder="unet")` or `X.from_pretrained(model_id, ...)`, also when
# the arguments continue on a doctest `...` line.
FROM_PRETRAINED_RE = re.compile(
    r"(\w+)\.from_pretrained\(\s*(?:\.\.\.\s*)?(?:[\"'](" + _ID + r")[\"']|([A-Za-z_]\w*)\b)"
    r"(?:[^()]*?subfolder\s*=\s*[\"'](\w+)[\"'])?"
)
ASSIGN_RE = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*[\"'](" + _ID + r")[\"']")


def from_pretrained_calls(text: str) -> list[tuple[str, str, str | None]]:
    """(caller, id, subfolder) of every `from_pretrained` call in text; `model_id = "..."` is followed."""
    variables: dict[str, str] = {}
    for name, value in ASSIGN_RE.findall(text):
        variables.setdefault(name, value)
    out = []
    for caller, literal, var, sub in FROM_PRETRAINED_RE.findall(text):
        model_id = literal or variables.get(var)
        if model_id:
            out.append((caller, model_id, sub or None))
    return out


# Path segments of huggingface.co that are not model owners, and placeholder owners used in examples.
NOT_OWNERS = {
    "docs", "papers", "datasets", "spaces", "blog", "models", "course", "learn", "tasks", "settings",
    "transformers", "organizations", "join", "pricing", "api", "new", "collections", "chat", "posts",
    "username", "user", "your-username", "your_username", "path", "my-org", "org", "your-org",
    "your_org", "my-username", "my_username", "repo", "your-repo",
}  # fmt: skip


def valid_id(model_id: str) -> bool:
    """A plausible Hub model id: owner/name, no placeholder owner, no path traversal."""
    owner, _, name = model_id.partition("/")
    return bool(owner and name) and owner.lower() not in NOT_OWNERS and ".." not in model_id


def _unique(ids: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for i in ids:
        if valid_id(i):
            seen.setdefault(i, None)
    return list(seen)


@dataclass
class ConfigDoc:
    """What a configuration class's source says: its model_type, checkpoints and field defaults."""

    class_name: str
    model_type: str
    directory: str
    checkpoints: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClassDoc:
    """What a modeling class's source says: its config class and checkpoints named for it."""

    class_name: str
    directory: str
    config_class: str | None
    checkpoints: list[str] = field(default_factory=list)
    module_checkpoints: list[str] = field(default_factory=list)


def _decorator_checkpoint(node: ast.ClassDef) -> list[str]:
    out = []
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call):
            name = dec.func.id if isinstance(dec.func, ast.Name) else getattr(dec.func, "attr", "")
            if name == "auto_docstring":
                for kw in dec.keywords:
                    if kw.arg == "checkpoint" and isinstance(kw.value, ast.Constant):
                        out.append(str(kw.value.value))
    return out


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _class_fields(node: ast.ClassDef) -> dict[str, Any]:
    """Class-body defaults (`hidden_size: int = 768`, `model_type = "bert"`); non-constants → None."""
    out: dict[str, Any] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            val = stmt.value
            out[stmt.target.id] = val.value if isinstance(val, ast.Constant) else None
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name) and isinstance(stmt.value, ast.Constant):
                    out[t.id] = stmt.value.value
    return out


def _config_ref(node: ast.ClassDef) -> str | None:
    for stmt in node.body:
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id == "config"
            and isinstance(stmt.annotation, ast.Name)
        ):
            return stmt.annotation.id
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name):
            if any(isinstance(t, ast.Name) and t.id == "config_class" for t in stmt.targets):
                return stmt.value.id
    return None


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError) as e:
        log.warning("%s: cannot parse (%s); its checkpoints are skipped", path, e)
        return None


def scan_configs(models_root: Path) -> dict[str, ConfigDoc]:
    """Config class name → ConfigDoc, for every `models/*/configuration_*.py`."""
    out: dict[str, ConfigDoc] = {}
    for path in sorted(models_root.glob("*/configuration_*.py")):
        tree = _parse(path)
        if tree is None:
            continue
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            fields = _class_fields(node)
            model_type = fields.pop("model_type", None)
            if not isinstance(model_type, str):
                continue
            ids = _decorator_checkpoint(node)
            for s in _strings(node):
                ids += LINK_RE.findall(s)
            out[node.name] = ConfigDoc(node.name, model_type, path.parent.name, _unique(ids), fields)
    return out


def scan_model_classes(models_root: Path) -> dict[str, ClassDoc]:
    """Model class name → ClassDoc, for every `models/*/modeling_*.py` (config resolved via in-file bases)."""
    out: dict[str, ClassDoc] = {}
    for path in sorted(models_root.glob("*/modeling_*.py")):
        tree = _parse(path)
        if tree is None:
            continue
        module_ids: list[str] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                if any(isinstance(t, ast.Name) and t.id == "_CHECKPOINT_FOR_DOC" for t in stmt.targets):
                    module_ids.append(str(stmt.value.value))
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        for name, node in classes.items():
            ids = _decorator_checkpoint(node)
            for s in _strings(node):
                ids += [m[1] for m in from_pretrained_calls(s) if m[0] == name]
            config = _resolve_config(name, classes)
            out[name] = ClassDoc(name, path.parent.name, config, _unique(ids), _unique(module_ids))
    return out


def _resolve_config(name: str, classes: dict[str, ast.ClassDef], depth: int = 0) -> str | None:
    """The config class a model class declares, itself or through its bases in the same file."""
    node = classes.get(name)
    if node is None or depth > 8:
        return None
    ref = _config_ref(node)
    if ref:
        return ref
    for base in node.bases:
        if isinstance(base, ast.Name) and (r := _resolve_config(base.id, classes, depth + 1)):
            return r
    return None


def transformers_models_root() -> Path:
    """The installed transformers' `models/` directory (found without importing any model)."""
    import transformers

    return Path(transformers.__file__).parent / "models"


def estimate_params(fields: dict[str, Any]) -> int | None:
    """Rough parameter count of a config's defaults: embeddings + L·(attention 4h² + MLP 2·h·ff·experts).

    Good to an order of magnitude, which is all the size buckets need; None when the config does not
    say its width and depth.
    """

    def first(*names: str) -> int | None:
        for n in names:
            v = fields.get(n)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return None

    h = first("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim")
    layers = first("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if layers is None:
        enc, dec = (
            first("encoder_layers", "num_encoder_layers"),
            first("decoder_layers", "num_decoder_layers"),
        )
        layers = (enc or 0) + (dec or 0) or None
    if h is None or layers is None:
        return None
    ff = first("intermediate_size", "d_ff", "ffn_dim", "n_inner", "encoder_ffn_dim") or 4 * h
    experts = first("num_local_experts", "num_experts", "n_routed_experts") or 1
    vocab = first("vocab_size") or 0
    return int(vocab * h + layers * (4 * h * h + 2 * h * ff * experts))


# ---------------------------------------------------------------------------------------------- diffusers


def diffusers_pipeline_ids(pipelines: dict[str, type]) -> dict[str, list[str]]:
    """Pipeline class name → ids its module's examples load (its own `X.from_pretrained` first)."""
    out: dict[str, list[str]] = {}
    texts: dict[str, str] = {}
    for name, cls in sorted(pipelines.items()):
        try:
            src = inspect.getsourcefile(cls)
        except TypeError:
            src = None
        if not src:
            continue
        if src not in texts:
            texts[src] = Path(src).read_text(encoding="utf-8")
        calls = from_pretrained_calls(texts[src])
        own = [c[1] for c in calls if c[0] == name]
        generic = [
            c[1] for c in calls if c[0].endswith("Pipeline") or c[0].startswith(("AutoPipeline", "Diffusion"))
        ]
        ids = _unique(own + generic)
        if ids:
            out[name] = ids
    return out


def diffusers_model_ids(
    models: dict[str, type], pipelines: dict[str, type] | None = None
) -> dict[str, list[tuple[str, str | None]]]:
    """Model class name → (id, subfolder) pairs from `ModelClass.from_pretrained(...)` examples.

    Read from the model modules and the pipeline modules (pipeline examples load their ControlNets,
    adapters and VAEs this way).
    """
    files: set[str] = set()
    for cls in [*models.values(), *(pipelines or {}).values()]:
        try:
            src = inspect.getsourcefile(cls)
        except TypeError:
            src = None
        if src:
            files.add(src)
    calls: list[tuple[str, str, str | None]] = []
    for src in sorted(files):
        calls += from_pretrained_calls(Path(src).read_text(encoding="utf-8"))
    out: dict[str, list[tuple[str, str | None]]] = {}
    for caller, model_id, sub in calls:
        if caller in models and valid_id(model_id):
            pairs = out.setdefault(caller, [])
            if (model_id, sub) not in pairs:
                pairs.append((model_id, sub))
    return out

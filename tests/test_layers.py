"""The package layout is the architecture: imports point down the layers, and nothing imports in a cycle.

hf_tpu/runtime's sub-packages, bottom to top: buffers (placement) < launch < tensors < lowerings and
arg_checks < execution < compile and distributed < device; above the runtime, hf_tpu.integrations, then the harness
(compat), which knows nothing of JAX. Function-level imports count as much as module-level ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_LAYERS = {
    "native": 0,
    "buffers": 1,
    "launch": 2,
    "tensors": 3,
    "lowerings": 4,
    "arg_checks": 4,
    "execution": 5,
    "compile": 6,
    "distributed": 6,
    "device": 7,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for top in ("hf_tpu", "compat"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of one of `mods` by another, anywhere in a file."""
    edges = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges += [(name, t, node.lineno) for t in targets if t in mods and t != name]
    return edges


def _rank(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "compat":
        return 30
    if module == "hf_tpu":
        return 20  # the package's API: installs the integrations, exposes the runtime
    if parts[:2] == ["hf_tpu", "integrations"]:
        return 10
    if parts[:2] == ["hf_tpu", "runtime"] and len(parts) > 2:
        return RUNTIME_LAYERS[parts[2]]
    return 0  # hf_tpu.runtime itself


def test_runtime_sub_packages_are_the_known_layers():
    found = {p.name for p in (ROOT / "hf_tpu" / "runtime").iterdir() if (p / "__init__.py").exists()}
    assert found == set(RUNTIME_LAYERS), "a new runtime sub-package needs a place in RUNTIME_LAYERS"


def test_imports_point_down_the_layers():
    mods = _modules()
    upward = [
        f"{a}:{line} imports {b}"
        for a, b, line in _imports(mods)
        if _rank(a) < _rank(b) and not (a == "hf_tpu" and b.startswith("hf_tpu.integrations"))
    ]
    assert not upward, "\n".join(sorted(set(upward)))


def test_no_import_cycles():
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for a, b, _ in _imports(mods):
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in graph:
        if m not in index:
            visit(m)
    assert not cycles, cycles


def test_the_harness_knows_nothing_of_jax():
    for path in (ROOT / "compat").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                assert n.split(".")[0] not in ("jax", "jaxlib"), f"{path}: imports {n}"
                assert not n.startswith("hf_tpu.runtime"), f"{path}: imports {n} (use hf_tpu's API)"

"""Every patch in hf_tpu's table (hf_tpu.integrations.table.PATCHES) still has its target, with the
parameters the patch relies on, in the installed versions; each applies exactly once, keeps the original
reachable, and rebinds copies imported by value; every hooked module takes its patches without a warning;
the installed versions are inside the verified ranges; outside them hf_tpu says so once, naming the
package and the range."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from hf_tpu.integrations import AT_IMPORT, HOOKS, apply_patches, install, patching, versions
from hf_tpu.integrations.table import AT_IMPORT as ON_IMPORT
from hf_tpu.integrations.table import PATCHES, Patch

ROOT = Path(__file__).resolve().parents[2]


def test_every_hooked_module_imports_and_is_patched_without_a_warning():
    """In a fresh process: import each HOOKS target; a patch that fails (a renamed or moved upstream
    function) would warn 'could not patch'; each module must then carry every one of its patches."""
    code = (
        "import importlib, json, warnings\n"
        "warnings.simplefilter('always')\n"
        "import torch\n"
        "from hf_tpu.integrations import HOOKS, applied\n"
        "out = {}\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    for name in HOOKS:\n"
        "        module = importlib.import_module(name)\n"
        "        out[name] = sorted(applied(module))\n"
        "bad = [str(w.message) for w in caught if 'hf_tpu' in str(w.message) and 'patch' in str(w.message)]\n"
        "print(json.dumps({'patched': out, 'warnings': bad}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["warnings"] == []
    for name, refs in HOOKS.items():
        assert result["patched"][name] == sorted(refs), name


def test_installed_versions_are_inside_the_verified_ranges():
    """Moving constraints.txt to a new release fails here until versions.VERIFIED (and README's Tested
    with) say the suite passed with it."""
    for package in versions.VERIFIED:
        installed = versions.installed_version(package)
        assert installed is not None, package
        assert versions.outside_message(package, installed) is None, (package, installed)


@pytest.mark.parametrize("version", ["5.30.0", "4.57.1", "6.0.0.dev0"])
def test_outside_the_range_the_message_names_package_and_range(version):
    message = versions.outside_message("transformers", version)
    assert message is not None
    assert f"transformers {version}" in message and "5.23-5.24" in message


def test_inside_the_range_or_unknown_there_is_nothing_to_say():
    assert versions.outside_message("transformers", "5.24.3") is None
    assert versions.outside_message("transformers", "5.23.0+local") is None
    assert versions.outside_message("some-other-package", "1.0") is None
    assert versions.outside_message("transformers", "not-a-version") is None


def test_the_warning_comes_once_per_package(monkeypatch):
    monkeypatch.setattr(versions, "_warned", set())
    monkeypatch.setitem(versions.VERIFIED, "transformers", ((1, 0), (1, 0)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.check("transformers")
        versions.check("transformers")
    texts = [str(w.message) for w in caught]
    assert len(texts) == 1 and "transformers" in texts[0] and "(transformers 1.0)" in texts[0]


# -- the patch table --------------------------------------------------------------------------------------------
def _owner_and_name(row: Patch):
    """(object holding the attribute, attribute name) of a row's target, importing its module."""
    owner = importlib.import_module(row.module)
    *path, name = row.attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _ids(rows):
    return [row.target for row in rows]


def test_the_table_is_well_formed():
    targets = [row.target for row in PATCHES]
    assert len(targets) == len(set(targets)), "one row per target"
    for row in PATCHES:
        assert row.kind in ("replace", "extend"), row
        assert row.package in versions.VERIFIED, row
        assert row.why and ":" in row.by and row.attribute, row
        file, function = row.by.split(":")
        assert callable(getattr(importlib.import_module(f"hf_tpu.integrations.{file}"), function)), row.by
    # HOOKS and AT_IMPORT are derived from it: every hook function is some row's
    assert {ref for refs in HOOKS.values() for ref in refs} | {ref for _, ref in AT_IMPORT} == {
        row.by for row in PATCHES
    }


def test_every_routed_torch_accelerator_function_is_a_row():
    from hf_tpu.integrations import torch_accelerator

    targets = {row.target for row in PATCHES}
    for name in torch_accelerator.ROUTED:
        assert f"torch.accelerator:{name}" in targets, name
    for name in torch_accelerator.ROUTED_MEMORY:
        assert f"torch.accelerator.memory:{name}" in targets, name
        # torch.accelerator re-exports them by value: rebound to the same replacement
        assert getattr(torch.accelerator, name) is getattr(torch.accelerator.memory, name), name


@pytest.mark.parametrize("row", PATCHES, ids=_ids(PATCHES))
def test_the_target_still_exists_with_the_parameters_the_patch_relies_on(row):
    """For the installed release: the attribute is there, and (for rows that record them) the upstream
    callable's signature still has every parameter the replacement passes on or reads."""
    owner, name = _owner_and_name(row)
    assert hasattr(owner, name), (
        f"{row.target} is gone in {row.package} {versions.installed_version(row.package)}"
    )
    if row.params is None:
        return
    upstream = patching.original(owner, name) if row.kind == "replace" else getattr(owner, name)
    assert patching.has_params(upstream, row.params), (
        f"{row.target} no longer takes {row.params} in {row.package} {versions.installed_version(row.package)}: "
        f"{inspect.signature(upstream)}"
    )


REPLACED = tuple(row for row in PATCHES if row.kind == "replace")


@pytest.mark.parametrize("row", REPLACED, ids=_ids(REPLACED))
def test_each_replacement_is_applied_once_and_keeps_the_original(row):
    """The row's function ran (the attribute is hf_tpu's, unless the row says when it is not applied), the
    upstream original is reachable, and running the function again changes nothing."""
    owner, name = _owner_and_name(row)
    trigger = importlib.import_module(row.module if row.trigger == ON_IMPORT else row.trigger)
    if row.only and not patching.is_patched(owner, name):
        return  # e.g. the pure-Python-only patches while the C++ extension is active
    assert patching.is_patched(owner, name), row.target
    before = inspect.getattr_static(owner, name)
    upstream = patching.original(owner, name)
    assert upstream is not before and upstream is not None
    file, function = row.by.split(":")
    getattr(importlib.import_module(f"hf_tpu.integrations.{file}"), function)(trigger)
    apply_patches(trigger)
    install()
    assert inspect.getattr_static(owner, name) is before, f"{row.by} patched {row.target} twice"
    assert patching.original(owner, name) is upstream


def test_the_get_max_memory_copies_imported_by_value_are_rebound():
    import accelerate.utils
    import accelerate.utils.modeling
    import diffusers.models.model_loading_utils
    import diffusers.pipelines.pipeline_loading_utils
    import transformers.integrations.accelerate

    from hf_tpu.integrations import accelerate as ours

    assert accelerate.utils.modeling.get_max_memory is ours.get_max_memory
    assert accelerate.utils.get_max_memory is ours.get_max_memory
    assert diffusers.models.model_loading_utils.get_max_memory is ours.get_max_memory
    assert diffusers.pipelines.pipeline_loading_utils.get_max_memory is ours.get_max_memory
    assert transformers.integrations.accelerate.accelerate_max_memory is ours.get_max_memory
    assert (
        patching.original(accelerate.utils.modeling, "get_max_memory").__module__
        == "accelerate.utils.modeling"
    )


@pytest.fixture
def modules(monkeypatch):
    """A module `fake_upstream` defining f, and `fake_user` that imported it by value."""
    upstream = types.ModuleType("fake_upstream")

    def f(x, scale=1):
        return x * scale

    upstream.f = f
    user = types.ModuleType("fake_user")
    user.f = user.renamed = f
    monkeypatch.setitem(sys.modules, "fake_upstream", upstream)
    monkeypatch.setitem(sys.modules, "fake_user", user)
    return upstream, user, f


def _plus_one(original):
    def f(x, scale=1):
        return original(x, scale) + 1

    return f


def test_patch_rebinds_copies_and_is_idempotent(modules):
    upstream, user, f = modules
    installed = patching.patch(upstream, "f", _plus_one, rebind=("f", "renamed"))
    assert upstream.f is installed and upstream.f(2) == 3
    assert user.f is installed and user.renamed is installed
    assert patching.original(upstream, "f") is f and patching.is_patched(upstream, "f")
    again = patching.patch(upstream, "f", _plus_one, rebind=("f",))
    assert again is installed and upstream.f(2) == 3  # not wrapped twice


def test_a_reexecuted_module_is_patched_again(modules):
    upstream, _, f = modules
    patching.patch(upstream, "f", _plus_one)

    def fresh(x, scale=1):  # what `importlib.reload` leaves: the upstream definition again
        return x * scale

    upstream.f = fresh
    assert not patching.is_patched(upstream, "f") and patching.original(upstream, "f") is fresh
    patching.patch(upstream, "f", _plus_one)
    assert patching.original(upstream, "f") is fresh and upstream.f(2) == 3


def test_patch_keeps_classmethods_and_staticmethods_what_they_were():
    class Upstream:
        @classmethod
        def make(cls, value):
            return (cls, value)

        @staticmethod
        def plain(value):
            return value

    def wrap(original):
        def replacement(*args):
            return ("patched", original(*args))

        return replacement

    patching.patch(Upstream, "make", wrap)
    patching.patch(Upstream, "plain", wrap)
    assert isinstance(vars(Upstream)["make"], classmethod) and isinstance(
        vars(Upstream)["plain"], staticmethod
    )
    assert Upstream.make(1) == ("patched", (Upstream, 1)) and Upstream.plain(2) == ("patched", 2)
    assert patching.original(Upstream, "make")(Upstream, 3) == (Upstream, 3)


def test_rebinding_once_rebinds_in_one_scan_at_the_end(modules):
    upstream, user, f = modules
    with patching.rebinding_once():
        installed = patching.patch(upstream, "f", _plus_one, rebind=("f",))
        assert user.f is f  # not yet: one scan when the block ends
    assert user.f is installed and user.renamed is f  # only the names asked for


def test_untraced_rows_keep_compiled_graphs_whole():
    """Rows with traced=False install code that calls into the runtime: Dynamo must skip their module, or
    its read of `torch.accelerator.current_stream()` at each frame breaks the graph."""
    import torch._dynamo
    from torch._dynamo import trace_rules

    from hf_tpu.integrations.table import untraced_modules

    assert "hf_tpu.integrations.torch_accelerator" in untraced_modules()
    for name in untraced_modules():
        assert trace_rules.check_file(importlib.import_module(name).__file__).skipped, name

    from torch._dynamo.utils import counters

    linear = torch.nn.Linear(4, 4).to("tpu")

    def f(x):
        return torch.relu(linear(x)) * 2 + 1

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, backend="tpu")
    for rows in (2, 3):  # a recompile too
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x.to("tpu")).cpu())
    assert not counters["graph_break"], list(counters["graph_break"])

"""Every upstream module hf_tpu patches still exists and takes its patches without a warning, for the
installed versions; the installed versions are inside the verified ranges; outside them hf_tpu says so
once, naming the package and the range."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from hf_tpu.integrations import HOOKS, versions

ROOT = Path(__file__).resolve().parents[2]


def test_every_hooked_module_imports_and_is_patched_without_a_warning():
    """In a fresh process: import each HOOKS target; a patch that fails (a renamed or moved upstream
    function) would warn 'could not patch'; each module must then carry every one of its patches."""
    code = (
        "import importlib, json, warnings\n"
        "warnings.simplefilter('always')\n"
        "import torch\n"
        "from hf_tpu.integrations import HOOKS\n"
        "out = {}\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    for name in HOOKS:\n"
        "        module = importlib.import_module(name)\n"
        "        out[name] = sorted(getattr(module, '__hf_tpu_patched__', ()))\n"
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

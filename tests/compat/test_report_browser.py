"""The HTML report renders in headless Chromium (Debian's `chromium`, installed here when missing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compat import report
from tests.compat import synth

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _install_chromium() -> str | None:
    """Debian's chromium via apt (as root); None with the reason printed when that is not possible."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        pytest.skip("chromium is not installed and apt-get needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                pytest.skip(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"apt-get could not install chromium: {e}")
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or _install_chromium()
    if not path:
        pytest.skip("apt-get installed chromium but it is not on PATH")
    return path


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reports")
    synth.write_results(root / "2026-01-01", synth.night())
    report.generate(root / "2026-01-01")
    synth.write_results(
        root / "2026-01-02", synth.night(fail={("org0/gpt2-1", "compiled"), ("org1/vit-2", "eager")})
    )
    report.generate(root / "2026-01-02", previous=root / "2026-01-01")
    return root / "2026-01-02" / "index.html"


def _chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [binary, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_dom_has_tables_charts_and_heatmap(chromium: str, page: Path, tmp_path: Path) -> None:
    proc = _chromium(chromium, tmp_path, "--dump-dom", page.as_uri() + "?q=bert")
    dom = proc.stdout
    assert proc.returncode == 0 and "<html" in dom, proc.stderr[-2000:]
    assert dom.count('<tr data-status="') == 26  # the model table
    assert re.search(r'<svg id="chart-modes"[^>]*>.*<rect class="bar"', dom, re.S)
    assert re.search(r'<svg id="chart-tasks"[^>]*>.*<rect class="bar"', dom, re.S)
    assert len(re.findall(r'<rect class="cell"[^>]*data-arch=', dom)) == 12  # 6 architectures × 2 modes
    assert re.search(r'<svg id="trend"[^>]*>.*<polyline class="line"', dom, re.S)
    assert 'id="regressions"' in dom and "org1/vit-2" in dom
    # the filter script ran on ?q=bert: only the bert rows (2 models × 2 modes + 1 harness error) stay
    m = re.search(r'<span id="shown"[^>]*>(\d+) of (\d+) rows</span>', dom)
    assert m and m.groups() == ("5", "26"), dom[dom.find('id="shown"') - 50 : dom.find('id="shown"') + 80]


def test_screenshot(chromium: str, page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    proc = _chromium(chromium, tmp_path, "--window-size=1300,2200", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_lookup_answers_for_attributed_ids(chromium: str, page: Path, tmp_path: Path) -> None:
    """ "Does my model work?": an id that only shares a tested config with another one gets that answer."""
    proc = _chromium(chromium, tmp_path, "--dump-dom", page.as_uri() + "?model=org0/vit-2-dup")
    dom = proc.stdout
    assert proc.returncode == 0 and "<html" in dom, proc.stderr[-2000:]
    m = re.search(
        r'<div id="lookup-result"[^>]*data-found="(\d+)"[^>]*data-pass="(\d+)"[^>]*>(.*?)</div>', dom, re.S
    )
    assert m, dom[dom.find('id="lookup-result"') - 50 : dom.find('id="lookup-result"') + 400]
    assert m.group(1, 2) == ("2", "2") and "tested as org0/vit-2" in m.group(3)
    proc = _chromium(chromium, tmp_path, "--dump-dom", page.as_uri() + "?model=nobody/nothing")
    assert 'data-found="0"' in proc.stdout and "is not in tonight" in proc.stdout
    arch = page.parent / "architectures" / "ViTForImageClassification.html"
    proc = _chromium(chromium, tmp_path, "--dump-dom", arch.as_uri())
    assert proc.returncode == 0 and proc.stdout.count('<tr data-status="') == 4

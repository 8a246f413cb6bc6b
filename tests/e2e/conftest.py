"""Fixtures of the end-to-end tests: a venv with physai-flows installed from a wheel.

The fresh venv borrows the test venv's dependencies through the same ``.pth`` line the clone's
venv uses (the shared dependency venv: the dependencies are not under test, and downloading
them again would cost minutes); physai-flows itself comes only from the wheel, since the shared
venv holds no copy of the project.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import run_captured as run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding physai-flows from a freshly built wheel; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"  # a copy, so no build output left in the checkout is reused
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for name in ("physai_core", "stages", "flows", "edge", "sim_scenes"):
        shutil.copytree(ROOT / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheel = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                 "--no-build-isolation", "-w", str(tmp / "dist"), str(source)])
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
                    ).stdout.strip())
    # The test venv's own .pth names the shared dependency venv (Makefile); a venv without one
    # holds its dependencies in its own site-packages.
    own = Path(sysconfig.get_path("purelib"))
    deps = own / "physai-deps.pth"
    (site / "physai-deps.pth").write_text(deps.read_text() if deps.is_file() else f"{own}\n")
    # The venv's bundled setuptools predates SPDX license strings: build with the borrowed one.
    run([str(python), "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
    (whl,) = (tmp / "dist").glob("physai_flows-*.whl")
    install = run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                   str(whl)])
    assert install.returncode == 0, install.stderr[-2000:]
    return venv / "bin"

"""The tests of this folder run in the lerobot stage environment (``make lerobot``,
``.venv-lerobot``), where LeRobot 0.6.1 is installed and this project is not: they are run by
tests/e2e/test_lerobot_venv.py, or by hand::

    PYTHONPATH=. .venv-lerobot/bin/python -m pytest -q -p no:cacheprovider \\
        --confcutdir=tests/lerobot tests/lerobot

Where LeRobot is not importable (the project's own venv) they are not collected. The project's
side of a test runs in the project's interpreter, ``$PHYSAI_PROJECT_PYTHON`` (default: the
clone's ``.venv/bin/python``), by subprocess (tests/lerobot/project_side.py, ``flows``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("lerobot") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # No hub: every dataset of these tests is a local folder.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

Project = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def project_python() -> Path:
    """The project's interpreter (its venv's ``python``)."""
    python = Path(os.environ.get("PHYSAI_PROJECT_PYTHON") or ROOT / ".venv" / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.skip(f"the project's venv is not built ({python}): make setup")
    return python


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture
def project(project_python: Path, tmp_path: Path) -> Project:
    """``project(verb, *args)``: tests/lerobot/project_side.py in the project's interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PHYSAI_HOME": str(tmp_path / "physai")}

    def run(*args: object) -> subprocess.CompletedProcess[str]:
        return _run([str(project_python), str(ROOT / "tests/lerobot/project_side.py"),
                     *map(str, args)], env)

    return run


@pytest.fixture
def flows(project_python: Path, tmp_path: Path) -> Project:
    """``flows(*args)``: the project's command line, its state in the test's own folder."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "PREFECT_", "PHYSAI_STORE"))}
    env["PHYSAI_HOME"] = str(tmp_path / "physai")

    def run(*args: object) -> subprocess.CompletedProcess[str]:
        return _run([str(project_python.parent / "flows"), *map(str, args)], env)

    return run

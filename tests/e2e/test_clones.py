"""Two clones of the repository on one machine, at different commits, each run their own code.

Both clones set up with ``make setup`` against the same shared dependency venv (the Makefile's
``CACHE``, the one this test run's venv came from), one after the other; each clone's ``python``
and ``flows`` then import that clone's own ``stages/``, and a plugin installed into one clone is
not seen by the other.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import run_captured as run

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "fixtures" / "plugin-probe"
pytestmark = pytest.mark.e2e

MARKER = '\n\ndef clone_marker() -> str:\n    """Which clone this is."""\n    return {name!r}\n'


def _clean_env() -> dict[str, str]:
    """The environment without this run's venv, make's job server or an import path."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTEST_XDIST_WORKER"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _clone_at_own_commit(tmp: Path, name: str) -> Path:
    """A clone of this repository with one commit of its own: ``stages.clone_marker()``."""
    clone = tmp / name
    done = run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)])
    assert done.returncode == 0, done.stderr
    with open(clone / "stages" / "__init__.py", "a") as f:
        f.write(MARKER.format(name=name))
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = run([*git, "commit", "-q", "-am", f"marker {name}"])
    assert done.returncode == 0, done.stderr
    return clone


def _make_setup(clone: Path) -> None:
    done = subprocess.run(["make", "--no-print-directory", "setup"], cwd=clone, env=_clean_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_each_clone_imports_its_own_code(tmp_path: Path) -> None:
    a = _clone_at_own_commit(tmp_path, "a")
    b = _clone_at_own_commit(tmp_path, "b")
    heads = {run(["git", "-C", str(c), "rev-parse", "HEAD"]).stdout for c in (a, b)}
    assert len(heads) == 2
    _make_setup(a)
    _make_setup(b)  # the clone set up last must not re-point the first one
    for clone in (a, b):
        code = "import stages, flows.cli; print(stages.clone_marker(), flows.cli.__file__)"
        out = run([str(clone / ".venv" / "bin" / "python"), "-c", code], cwd=tmp_path,
                  env=_clean_env())
        assert out.returncode == 0, out.stderr[-2000:]
        marker, cli_file = out.stdout.split()
        assert marker == clone.name, out.stdout
        assert Path(cli_file).resolve().is_relative_to(clone.resolve()), out.stdout
        # The clone's own `flows` script runs its own code too.
        flows = run([str(clone / ".venv" / "bin" / "flows"), "plugins"], cwd=tmp_path,
                    env=_clean_env())
        assert flows.returncode == 0, flows.stderr[-2000:]
    # A plugin installed into one clone's venv stays in that clone.
    wheel_dir = tmp_path / "plugin"
    built = run([str(a / ".venv" / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps",
                 "--no-build-isolation", "-w", str(wheel_dir), str(PROBE)], env=_clean_env())
    assert built.returncode == 0, built.stderr[-2000:]
    (whl,) = wheel_dir.glob("*.whl")
    added = run([str(a / ".venv" / "bin" / "pip"), "install", "-q", "--no-deps", str(whl)],
                env=_clean_env())
    assert added.returncode == 0, added.stderr[-2000:]
    probe = "import importlib.util as u; print(u.find_spec('physai_probe') is not None)"
    listed = {c.name: run([str(c / ".venv" / "bin" / "python"), "-c", probe],
                          env=_clean_env()).stdout.strip() for c in (a, b)}
    assert listed == {"a": "True", "b": "False"}, listed

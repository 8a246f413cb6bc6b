"""The simulator-backend registry: what a suite's ``backend`` may name, and the version that
pins its results in the suite digest and the sim report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mujoco
import pytest

from stages.errors import BackendUnavailableError, ConfigError, DuplicateNameError
from stages.sim import backends
from stages.sim.backends import BackendSpec, backend_names, backend_version, register_backend
from stages.sim.scene import load_suite

ROOT = Path(__file__).resolve().parents[3]
SUITE = """\
name: s
task: reach-v0
backend: {backend}
scenes:
  - {{scene: {scene}, episodes: 10, seed: 1}}
"""


@pytest.fixture
def other_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[BackendSpec]:
    """A plugin's backend, registered for one test; its package is pytest itself."""
    monkeypatch.setattr(backends.BACKENDS, "_items", dict(backends.BACKENDS._items))
    yield register_backend(BackendSpec("other", "pytest", "other", "a second simulator"))


def _suite(tmp_path: Path, backend: str) -> Path:
    scene = ROOT / "sim_scenes" / "reach" / "nominal.yaml"
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(backend=backend, scene=scene))
    return path


def test_mujoco_is_the_default_and_its_version_is_the_installed_one() -> None:
    assert "mujoco" in backend_names()
    assert backend_version("mujoco") == mujoco.__version__


def test_an_unknown_backend_is_one_line_listing_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_suite(_suite(tmp_path, "bullet"))
    (problem,) = info.value.problems
    assert problem.field == "backend" and problem.value == "bullet"
    assert "unknown simulator backend 'bullet'; valid: mujoco" in problem.message


def test_a_registered_backend_is_accepted_and_its_version_enters_the_digest(
    tmp_path: Path, other_backend: BackendSpec
) -> None:
    (tmp_path / "ours").mkdir()
    ours = load_suite(_suite(tmp_path / "ours", "mujoco"))
    theirs = load_suite(_suite(tmp_path, "other"))
    assert theirs.config.backend == "other"
    assert ours.digest != theirs.digest
    assert backend_version("other") == pytest.__version__


def test_a_missing_backend_package_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends.BACKENDS, "_items", dict(backends.BACKENDS._items))
    register_backend(BackendSpec("ghost", "no-such-simulator", "ghost", "not installed"))
    with pytest.raises(BackendUnavailableError, match=r"physai-flows\[ghost\]"):
        backend_version("ghost")


def test_a_second_backend_under_one_name_is_refused() -> None:
    with pytest.raises(DuplicateNameError, match="mujoco"):
        register_backend(BackendSpec("mujoco", "mujoco", None, "again"))

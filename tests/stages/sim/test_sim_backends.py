"""The simulator-backend registry: what a suite's ``backend`` may name, and the version that
pins its results in the suite digest and the sim report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mujoco
import pytest

from physai_core.errors import BackendUnavailableError, ConfigError, DuplicateNameError
from stages.sim.backends import catalog as backends
from stages.sim.backends.catalog import (
    BackendSpec,
    backend_names,
    backend_version,
    register_backend,
)
from stages.sim.suites.loading import load_suite
from stages.sim.tasks.catalog import get_task

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
    yield register_backend(BackendSpec("other", "pytest", "other", "a second simulator",
                                       tasks={"reach-v0": "stages.sim.tasks.reach:ReachEnv"}))


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
    assert ("unknown simulator backend 'bullet'; valid: gymnasium-robotics, isaaclab, "
            "metaworld, mujoco") in problem.message


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


def test_a_backend_that_does_not_run_the_task_and_a_repeated_compare_backend_are_refused(
    tmp_path: Path, other_backend: BackendSpec
) -> None:
    path = _suite(tmp_path, "isaaclab")
    path.write_text(path.read_text().replace("reach-v0", "gymnasium:InvertedPendulum-v5")
                    .replace("reach/nominal", "pendulum/nominal") + "compare_backend: isaaclab\n")
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    found = {(p.field, p.value): p.message for p in info.value.problems}
    assert found[("backend", "isaaclab")] == (
        "does not run task 'gymnasium:InvertedPendulum-v5'; it runs: locomotion-v0, reach-v0, "
        "isaaclab:<id>")
    assert found[("compare_backend", "isaaclab")] == "is the suite's backend; name a second one"


def test_a_second_backend_runs_every_scene_again_and_enters_the_digest(
    tmp_path: Path, other_backend: BackendSpec
) -> None:
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.tasks.reach import ReachEnv

    (tmp_path / "one").mkdir()
    one = load_suite(_suite(tmp_path / "one", "mujoco"))
    path = _suite(tmp_path, "mujoco")
    path.write_text(path.read_text() + "compare_backend: other\n")
    two = load_suite(path)
    assert two.backends == ("mujoco", "other") and two.runs == 2 and one.runs == 1
    assert two.run(1) == ("other", two.scenes[0]) and two.run(0)[0] == "mujoco"
    assert one.digest != two.digest
    backend, (scene, _, seed) = two.run(1)
    env = make_backend_env(backend, get_task("reach-v0"), scene, 2, seed)
    assert isinstance(env, ReachEnv) and env.num_worlds == 2


def test_isaaclab_versions_come_from_its_environment_or_name_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.core.environments import EnvironmentMissingError, get_environment

    monkeypatch.setattr(backends, "_version_there", backends._version_there.__wrapped__)
    monkeypatch.setenv("PHYSAI_ENV_ISAACLAB_PYTHON", str(tmp_path / "none" / "python"))
    with pytest.raises(EnvironmentMissingError) as info:
        load_suite(_suite(tmp_path, "isaaclab"))
    assert str(info.value).startswith(f"{tmp_path / 'suite.yaml'}: backend: simulator backend "
                                      "'isaaclab': stage environment 'isaaclab' is not built")
    assert "`make isaaclab`" in str(info.value)
    monkeypatch.delenv("PHYSAI_ENV_ISAACLAB_PYTHON")
    if not get_environment("isaaclab").python().exists():
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    first, newton, warp = backend_version("isaaclab").split(" ")
    assert first.startswith("3.") and newton.startswith("newton-") and warp.startswith(
        "warp-lang-")

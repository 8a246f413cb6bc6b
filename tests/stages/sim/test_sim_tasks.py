"""The task registry, and every registered task built, reset and stepped in every scene it has
on the default backend, and in its first scene on every other backend that runs it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from physai_core.errors import DuplicateNameError, UnknownNameError
from stages.core.environments import runs_here
from stages.sim.backends.catalog import DEFAULT, backend_names, get_backend, make_backend_env
from stages.sim.backends.gymnasium_tasks import is_gym_task
from stages.sim.backends.isaaclab_family import is_isaaclab_task
from stages.sim.env.batched import BatchedEnv
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task, register_task, task_names
from stages.sim.tasks.template import register_task_file

SIM_SCENES = Path(__file__).resolve().parents[3] / "sim_scenes"

for task_file in sorted(SIM_SCENES.glob("*/task.yaml")):  # tasks made from a template
    register_task_file(task_file)


def scene_files() -> list[tuple[str, Path]]:
    """(task id, path) of every scene YAML under sim_scenes/<task dir>/; suites and task files
    are skipped."""
    found = []
    for path in sorted(SIM_SCENES.glob("*/*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "scenes" not in data and "template" not in data:
            found.append((str(data.get("task")), path))
    return found


def shipped_tasks() -> set[str]:
    """Tasks this project registers itself (a plugin's tasks are its own to test)."""
    return {t for t in task_names()
            if ":" not in t and get_task(t).make_env.__module__.startswith("stages.")}


def resolves(task: str) -> bool:
    """Whether the registry knows ``task`` (family ids are made on lookup)."""
    try:
        get_task(task)
    except UnknownNameError:
        return False
    return True


ELSEWHERE = pytest.mark.skipif(
    not runs_here("isaaclab"),
    reason="an isaaclab: task runs in the isaaclab stage environment "
    "(tests/stages/sim/test_sim_isaaclab_tasks.py there, tests/e2e/test_isaaclab_task.py here)")

def owner(task: str) -> str:
    """The backend whose family ``task`` is (``isaaclab:<gym id>``), else the default."""
    return next((name for name in backend_names() if get_backend(name).owns(task)), DEFAULT)


def backend_scenes() -> list[tuple[str, str, Path]]:
    """(backend, task id, path): every scene of every task on the backend it belongs to (the
    default one for all but a family's), and the first scene of each task another backend
    also runs (Isaac Lab's reach-v0 and locomotion-v0)."""
    found = [(owner(task), task, path) for task, path in scene_files()]
    for name in backend_names():
        spec = get_backend(name)
        for task in sorted(spec.tasks):
            path = next(p for t, p in scene_files() if t == task)
            found.append((name, task, path))
    return found


BENCHMARK_ELSEWHERE = pytest.mark.skip(
    reason="a benchmark's task runs in its stage environment (tests/e2e/test_benchmarks_e2e.py "
    "builds, steps and validates it there)")


def marks(backend: str, task: str) -> list[pytest.MarkDecorator]:
    """Skip, here, what runs in a stage environment of its own."""
    environment = get_backend(backend).environment
    if is_isaaclab_task(task) or environment == "isaaclab":
        return [ELSEWHERE]
    return [BENCHMARK_ELSEWHERE] if environment is not None else []


TASK_SCENES = [
    pytest.param(backend, task, path, id=f"{backend}-{task}:{path.parent.name}/{path.name}",
                 marks=marks(backend, task))
    for backend, task, path in backend_scenes()
]


def random_rollout(
    backend: str, task: str, path: Path, seed: int, steps: int = 5
) -> list[tuple[np.ndarray, ...]]:
    """Build ``task`` on ``backend`` for the scene at ``path`` with 4 worlds, reset, and take
    ``steps`` random steps (actions from a fixed generator); check shapes, dtypes and
    finiteness on the way.

    Returns:
        The reset observation, then ``(obs, reward, done)`` of every step.
    """
    spec = get_task(task)
    scene = load_scene(path)
    env = make_backend_env(backend, spec, scene, 4, seed, device="cpu")
    try:
        return checked_rollout(env, task, spec.obs_dim, spec.act_dim, scene.config.episode_steps,
                               steps)
    finally:
        env.close()


def checked_rollout(env: BatchedEnv, task: str, obs_dim: int, act_dim: int, episode_steps: int,
                    steps: int) -> list[tuple[np.ndarray, ...]]:
    """Reset ``env`` and take ``steps`` random steps, checking what it returns."""
    spec = get_task(task)
    assert isinstance(env, BatchedEnv)
    assert (env.num_worlds, env.obs_dim, env.act_dim) == (4, spec.obs_dim, spec.act_dim)
    assert env.episode_steps == episode_steps
    assert (obs_dim, act_dim) == (spec.obs_dim, spec.act_dim)

    obs = env.reset()
    assert obs.shape == (4, spec.obs_dim)
    assert obs.dtype == np.float32
    assert np.isfinite(obs).all()
    out: list[tuple[np.ndarray, ...]] = [(obs,)]

    rng = np.random.default_rng(0)
    for _ in range(steps):
        obs, reward, done = env.step(rng.uniform(-1.0, 1.0, size=(4, spec.act_dim)))
        assert obs.shape == (4, spec.obs_dim)
        assert obs.dtype == np.float32
        assert reward.shape == (4,)
        assert reward.dtype == np.float32
        assert done.shape == (4,)
        assert done.dtype == np.bool_
        assert np.isfinite(obs).all()
        assert np.isfinite(reward).all()
        out.append((obs, reward, done))

    success = env.success()
    assert success.shape == (4,)
    assert success.dtype == np.bool_
    if is_gym_task(task):  # a Gymnasium environment has no scripted expert
        return out
    expert = env.expert_action()
    assert expert.shape == (4, spec.act_dim)
    assert expert.dtype == np.float32
    assert np.isfinite(expert).all()
    assert np.abs(expert).max() <= 1.0
    return out


@pytest.mark.parametrize(("backend", "task", "path"), TASK_SCENES)
def test_every_task_scene_builds_resets_steps_and_is_deterministic(
    backend: str, task: str, path: Path
) -> None:
    first = random_rollout(backend, task, path, seed=3)
    again = random_rollout(backend, task, path, seed=3)
    other = random_rollout(backend, task, path, seed=4)
    for a, b in zip(first, again, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[-1][0], other[-1][0])


def test_every_task_directory_is_a_registered_task() -> None:
    for task_dir in sorted(p for p in SIM_SCENES.iterdir() if p.is_dir()):
        tasks_here = {task for task, path in scene_files() if path.parent == task_dir}
        assert len(tasks_here) == 1, task_dir
        # a Gymnasium task is probed with the make_kwargs of its first scene loaded
        load_scene(next(path for _, path in scene_files() if path.parent == task_dir))
        assert all(resolves(t) for t in tasks_here), tasks_here


def test_every_shipped_task_has_a_scene() -> None:
    tasks_with_scenes = {task for task, _ in scene_files()}
    assert shipped_tasks() <= tasks_with_scenes
    assert {"reach-v0", "locomotion-v0", "pusher-reach-v0"} <= shipped_tasks()


def test_every_scene_file_names_a_registered_task() -> None:
    assert [t for t, _ in scene_files() if not resolves(t)] == []


def test_task_specs_are_consistent() -> None:
    for name in task_names():
        spec = get_task(name)
        assert spec.name == name
        assert len(spec.obs_names) == len(set(spec.obs_names)) == spec.obs_dim
        assert len(spec.action_names) == len(set(spec.action_names)) == spec.act_dim
        assert spec.control_hz > 0
        assert spec.success_tolerance
        for asset in spec.asset_files:
            assert asset.is_file(), asset


def test_unknown_task_lists_valid_names_and_closest() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_task("reach-v1")
    message = str(info.value)
    assert "'reach-v1'" in message
    assert "reach-v0" in message
    assert "did you mean 'reach-v0'" in message


def test_duplicate_registration_is_rejected() -> None:
    before = task_names()
    with pytest.raises(DuplicateNameError, match="reach-v0"):
        register_task(get_task("reach-v0"))
    assert task_names() == before


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"name": "reach"}, "versioned id"),
        ({"name": "Reach-V0"}, "versioned id"),
        ({"obs_dim": 22}, "obs_names"),
        ({"action_units": ("rad",)}, "action_units"),
        ({"workspace_low": (1.0, 0.0, 0.0)}, "workspace_low"),
    ],
)
def test_malformed_task_spec_is_rejected(change: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(get_task("reach-v0"), **change)  # type: ignore[arg-type]

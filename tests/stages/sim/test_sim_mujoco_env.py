"""What every MuJoCo task shares: threaded stepping, the thread setting, and rendering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.sim.env.batched import THREADS_ENV, default_num_threads
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task, task_names

ROOT = Path(__file__).resolve().parents[3]
SIM_SCENES = ROOT / "sim_scenes"
COLLECT_SCENES = {"reach-v0": "reach/collect.yaml", "locomotion-v0": "locomotion/collect.yaml",
                  "reach-vision-v0": "reach_vision/collect.yaml", "lift-v0": "lift/collect.yaml",
                  "pick-place-v0": "pick_place/collect.yaml",
                  "pick-place-vision-v0": "pick_place_vision/collect.yaml"}


def shipped_mujoco_tasks() -> set[str]:
    """The MuJoCo tasks this project writes in Python: not a plugin's (its own to test), not
    one made from a template, by Gymnasium or by Isaac Lab (tested with their modules)."""
    made_elsewhere = ("stages.sim.tasks.template", "stages.sim.backends.gymnasium_tasks",
                      "stages.sim.backends.isaaclab_family")
    return {t for t in task_names() if get_task(t).make_env.__module__.startswith("stages.")
            and get_task(t).make_env.__module__ not in made_elsewhere}


@pytest.mark.parametrize("task", sorted(COLLECT_SCENES))
def test_results_do_not_depend_on_the_thread_count(task: str) -> None:
    scene = load_scene(SIM_SCENES / COLLECT_SCENES[task])
    spec = get_task(task)
    envs = [spec.make_env(scene, 5, 9, num_threads=n) for n in (1, 2, 3)]
    observations = [env.reset() for env in envs]
    rng = np.random.default_rng(0)
    for _ in range(10):
        actions = rng.uniform(-1.0, 1.0, size=(5, spec.act_dim))
        observations = [env.step(actions)[0] for env in envs]
        for other in observations[1:]:
            np.testing.assert_array_equal(observations[0], other)


def test_thread_count_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert default_num_threads() == (os.cpu_count() or 1)
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_num_threads() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ConfigError, match=f"environment: {THREADS_ENV}: must be a number"):
            default_num_threads()


def test_bad_construction_is_rejected() -> None:
    locomotion = get_task("locomotion-v0")
    with pytest.raises(ValueError, match="cannot run scene"):
        locomotion.make_env(load_scene(SIM_SCENES / "reach" / "nominal.yaml"), 2, 0)
    scene = load_scene(SIM_SCENES / "locomotion" / "flat.yaml")
    with pytest.raises(ValueError, match="num_worlds"):
        locomotion.make_env(scene, 0, 0)
    with pytest.raises(ValueError, match="num_threads"):
        locomotion.make_env(scene, 2, 0, num_threads=0)


def test_render_checks_its_arguments_before_drawing() -> None:
    env = get_task("locomotion-v0").make_env(
        load_scene(SIM_SCENES / "locomotion" / "flat.yaml"), 2, 0
    )
    with pytest.raises(RuntimeError, match="reset"):
        env.render([0], 32, 24, "track")
    env.reset()
    with pytest.raises(ValueError, match="unknown camera 'top'; valid: track"):
        env.render([0], 32, 24, "top")
    with pytest.raises(ValueError, match=r"worlds must be in \[0, 2\)"):
        env.render([0, 2], 32, 24, "track")


RENDER_EVERY_TASK = """
import json
import numpy as np
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task

scenes = json.loads({scenes!r})
out = {{}}
for name in scenes:
    spec = get_task(name)
    env = spec.make_env(load_scene(scenes[name]), 2, 0)
    env.reset()
    for _ in range(3):
        env.step(env.expert_action())
    frames = env.render([1], 96, 64, spec.camera)
    again = env.render([0, 1], 96, 64, spec.camera)
    out[name] = {{
        "shape": list(frames.shape),
        "dtype": str(frames.dtype),
        "std": float(frames.std()),
        "same_frame": bool(np.array_equal(frames[0], again[1])),
        "shape_two": list(again.shape),
    }}
print(json.dumps(out))
"""


def test_render_one_frame_of_every_task_offscreen() -> None:
    scenes = {task: str(SIM_SCENES / path) for task, path in COLLECT_SCENES.items()}
    assert set(scenes) == shipped_mujoco_tasks()
    script = RENDER_EVERY_TASK.format(scenes=json.dumps(scenes))
    env = os.environ | {"MUJOCO_GL": "egl", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for task, frame in results.items():
        assert frame["shape"] == [1, 64, 96, 3], task
        assert frame["shape_two"] == [2, 64, 96, 3], task
        assert frame["dtype"] == "uint8", task
        assert frame["std"] > 5.0, task
        assert frame["same_frame"], task


RENDER_WITHOUT_OPENGL = """
import numpy as np
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task

spec = get_task("locomotion-v0")
for attempt in range(2):
    env = spec.make_env(load_scene({scene!r}), 2, 0)
    env.reset()
    try:
        env.render([0], 32, 24, spec.camera)
    except RuntimeError as exc:
        print("failed:", "MUJOCO_GL=egl" in str(exc))
    env.step(np.zeros((2, spec.act_dim)))
print("alive")
"""


def test_render_without_opengl_fails_cleanly_every_time() -> None:
    script = RENDER_WITHOUT_OPENGL.format(scene=str(SIM_SCENES / "locomotion" / "flat.yaml"))
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["failed:", "True", "failed:", "True", "alive"]

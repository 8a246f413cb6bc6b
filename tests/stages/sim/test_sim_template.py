"""The reach template: Gymnasium's pusher arm made a task by a task file, checked and reached."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from physai_core.errors import ConfigError
from stages.core.resources import resolve_file
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.sim.tasks.template import register_task_file

ROOT = Path(__file__).resolve().parents[3]
PUSHER = ROOT / "sim_scenes" / "pusher_reach"
TASK_FILE = PUSHER / "task.yaml"
PUSHER_XML = "pkg:gymnasium/envs/mujoco/assets/pusher_v5.xml"


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    """pusher-reach-v0, registered from its task file."""
    return register_task_file(TASK_FILE)


def task_file(folder: Path, name: str, /, **changes: object) -> Path:
    """A copy of the pusher task file under the id ``name`` with some fields replaced."""
    data = yaml.safe_load(TASK_FILE.read_text()) | {"name": name} | changes
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("scene", ["collect", "nominal", "heavy_payload", "noisy_sensors"])
def test_builds_resets_and_steps_every_scene_on_cpu(spec: TaskSpec, scene: str) -> None:
    env = spec.make_env(load_scene(PUSHER / f"{scene}.yaml"), 3, 0, num_threads=1)
    obs = env.reset()
    assert (spec.obs_dim, spec.act_dim) == (23, 7) == (env.obs_dim, env.act_dim)
    assert len(spec.obs_names) == len(spec.obs_units) == 23
    assert spec.obs_names[0] == "r_shoulder_pan_joint.pos" and spec.obs_units[7] == "rad/s"
    assert obs.shape == (3, 23) and obs.dtype == np.float32
    actions = np.random.default_rng(0).uniform(-1, 1, size=(5, 3, 7))
    for action in actions:
        obs, reward, done = env.step(action)
        assert obs.shape == (3, 23) and reward.shape == (3,) and done.shape == (3,)
        assert np.isfinite(obs).all() and np.isfinite(reward).all()
    assert env.expert_action().shape == (3, 7) and env.success().shape == (3,)
    clean = env.clean_observation()
    np.testing.assert_allclose(clean[:, 20:23], clean[:, 17:20] - clean[:, 14:17], atol=1e-6)


def test_the_edited_model_is_only_the_servoed_arm(spec: TaskSpec) -> None:
    from stages.sim.tasks.template import load_template
    from stages.sim.tasks.template_config import TARGET_BODY

    model = load_template(TASK_FILE).edited_spec().compile()
    bodies = [model.body(i).name for i in range(model.nbody)]
    assert model.nq == model.nv == model.nu == 7
    assert "object" not in bodies and "goal" not in bodies and bodies[-1] == TARGET_BODY
    assert (model.actuator_biasprm[:, 1] == -100).all() and model.body_gravcomp[1:-1].all()
    assert model.body_mocapid[model.body(TARGET_BODY).id] == 0 and model.ncam == 1
    assert model.opt.timestep * 20 * spec.control_hz == pytest.approx(1.0)
    assert resolve_file(PUSHER_XML, ROOT) in spec.asset_files and TASK_FILE in spec.asset_files


def test_expert_reaches_nominal_targets(spec: TaskSpec) -> None:
    env = spec.make_env(load_scene(PUSHER / "nominal.yaml"), 100, 1000, num_threads=1)
    env.reset()
    done = np.zeros(100, dtype=bool)
    while not done.all():
        _, _, done = env.step(env.expert_action())
    assert env.success().mean() >= 0.95


def test_gravity_is_compensated_with_nominal_masses(spec: TaskSpec) -> None:
    def sag(scene: str) -> float:
        env = spec.make_env(load_scene(PUSHER / f"{scene}.yaml"), 8, 3, num_threads=1)
        start = env.reset()[:, 14:17]
        for _ in range(25):
            obs, _, _ = env.step(np.zeros((8, 7)))
        return float(np.linalg.norm(obs[:, 14:17] - start, axis=1).mean())

    assert sag("nominal") < 1e-3 < sag("heavy_payload")


def test_the_same_file_twice_is_one_task_and_a_second_file_cannot_take_its_id(
    spec: TaskSpec, tmp_path: Path
) -> None:
    assert register_task_file(TASK_FILE) is spec is get_task("pusher-reach-v0")
    for name in ("pusher-reach-v0", "reach-v0"):
        with pytest.raises(ConfigError, match="already registered") as info:
            register_task_file(task_file(tmp_path, name))
        assert info.value.problems[0].field == "name"


def test_a_model_path_relative_to_the_task_file(tmp_path: Path) -> None:
    model = tmp_path / "models" / "arm.xml"
    model.parent.mkdir()
    shutil.copy(resolve_file(PUSHER_XML, ROOT), model)
    spec = register_task_file(task_file(tmp_path, "pusher-copy-v0", model="models/arm.xml"))
    assert model.resolve() in spec.asset_files
    scene = tmp_path / "scene.yaml"
    scene.write_text(yaml.safe_dump({
        "name": "s", "task": "pusher-copy-v0", "episode_steps": 5,
        "randomization": {"target_low": [0.5, -0.6, 0.0], "target_high": [0.5, -0.6, 0.0]}}))
    env = spec.make_env(load_scene(scene), 2, 0, num_threads=1)
    assert np.isfinite(env.reset()).all()


def test_a_model_site_can_be_the_end_effector(tmp_path: Path) -> None:
    model = tmp_path / "arm.xml"
    xml = resolve_file(PUSHER_XML, ROOT).read_text()
    model.write_text(xml.replace('<body name="tips_arm" pos="0 0 0">',
                                 '<body name="tips_arm" pos="0 0 0"><site name="tip" '
                                 'pos="0.1 0 0"/>'))
    spec = register_task_file(task_file(tmp_path, "pusher-site-v0", model=str(model),
                                        end_effector={"site": "tip"}))
    assert spec.act_dim == 7


BAD = {
    "unknown joint": ({"joints": ["r_shoulder_pan_joint", "r_elbow_joint"]}, "joints.1",
                      "r_elbow_joint"),
    "unknown site": ({"end_effector": {"site": "gripper"}}, "end_effector.site", "gripper"),
    "unknown body": ({"end_effector": {"body": "hand"}}, "end_effector.body", "hand"),
    "missing model": ({"model": "no_such_arm.xml"}, "model", "no_such_arm.xml"),
    "missing package": ({"model": "pkg:no_such_package/arm.xml"}, "model", "no_such_package"),
    "bad field": ({"control_hz": -25}, "control_hz", "-25"),
    "unknown field": ({"gains": 5}, "gains", "unknown field"),
    "odd control rate": ({"control_hz": 30}, "control_hz", "not a whole number"),
    "site and body": ({"end_effector": {"site": "a", "body": "b"}}, "end_effector",
                      "exactly one"),
    "gains per joint": ({"servo": {"kp": [1, 2]}}, "servo.kp", "one per joint"),
    "bad id": ({"name": "Pusher"}, "name", "Pusher"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_task_file_is_one_line_naming_file_and_field(tmp_path: Path, case: str) -> None:
    changes, field, needle = BAD[case]
    path = task_file(tmp_path, "pusher-bad-v0", **changes)
    with pytest.raises(ConfigError) as info:
        register_task_file(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and needle in message, message
    assert field in {p.field for p in info.value.problems}, message
    with pytest.raises(KeyError):
        get_task("pusher-bad-v0")


def pipeline_config(folder: Path, **changes: object) -> Path:
    """A small copy of configs/pusher_reach.yaml in ``folder``, paths made absolute."""
    data = yaml.safe_load((ROOT / "configs" / "pusher_reach.yaml").read_text())
    suite = folder / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "pusher-tiny", "task": "pusher-reach-v0",
                                     "scenes": [{"scene": str(PUSHER / "nominal.yaml"),
                                                 "episodes": 30, "seed": 11}]}))
    data.update(name="pusher-tiny", tasks=[str(TASK_FILE)])
    data["collect"].update(scene=str(PUSHER / "collect.yaml"), episodes=60, num_worlds=30)
    data["train"].update(epochs=20, hidden=[128, 128], lr=0.003, device="cpu")
    data["validate"].update(suite=str(suite), min_success=0.5, video_episodes=0)
    data["package"]["latency_iters"] = 200
    data["promote"]["model_name"] = "pusher-tiny"
    data.update(changes)
    path = folder / "pusher_tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_pipeline_config_registers_its_task_files(tmp_path: Path) -> None:
    from stages.pipeline.config import load_pipeline

    pipeline = load_pipeline(ROOT / "configs" / "pusher_reach.yaml")
    assert pipeline.config.task == "pusher-reach-v0" and len(pipeline.suite.scenes) == 3
    assert load_suite(PUSHER / "suite.yaml").digest == pipeline.suite_digest
    for tasks, needle in ((["missing.yaml"], "task file not found"),
                          (["pkg:no_such_package/task.yaml"], "not installed")):
        with pytest.raises(ConfigError) as info:
            load_pipeline(pipeline_config(tmp_path, tasks=tasks))
        message = str(info.value)
        assert "\n" not in message and needle in message and "tasks.0" in message, message
    bad = task_file(tmp_path, "pusher-broken-v0", joints=["nope"])
    with pytest.raises(ConfigError, match=re.escape(f"{bad}: joints.0")):
        load_pipeline(pipeline_config(tmp_path, tasks=[str(bad)], task="pusher-broken-v0"))


@pytest.mark.e2e
def test_pusher_pipeline_through_the_cli_reaches_and_promotes(
    tmp_path: Path, cli_env: Callable[..., dict[str, str]]
) -> None:
    from tests.support import run_flows

    path = pipeline_config(tmp_path)
    start = time.perf_counter()
    result = run_flows("run", str(path), env=cli_env(tmp_path / "home"), cwd=tmp_path,
                       timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    row = re.search(r"nominal\s*│\s*30\s*│\s*([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", result.stdout)
    assert row is not None, result.stdout[-3000:]
    rate, low, _ = map(float, row.groups())
    assert rate >= 0.9, result.stdout[-3000:]
    assert "models:/pusher-tiny/1 -> @champion" in result.stdout, result.stdout[-3000:]
    print(f"pusher reach pipeline: nominal {rate:.2f} (CI low {low:.3f}) in {seconds:.0f} s")

"""Gymnasium environments as tasks (``gymnasium:<EnvId>``): spec, batched stepping, scenes,
success predicates against oracle policies, module-prefixed ids, and PPO end to end."""

from __future__ import annotations

import re
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from physai_core.errors import ConfigError, PhysaiError, UnknownNameError
from stages.evaluation.suite import evaluate_scene
from stages.sim.backends.gymnasium_env import GymBatchedEnv
from stages.sim.backends.gymnasium_tasks import env_provenance, space_names
from stages.sim.env.batched import BatchedEnv
from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks.catalog import get_task

ROOT = Path(__file__).resolve().parents[3]
PENDULUM = ROOT / "sim_scenes" / "pendulum"
TASK = "gymnasium:InvertedPendulum-v5"
PD_GAINS = np.array([1.0, 20.0, 1.0, 2.0])
"""PLATFORM.md's oracle: a = clip(K @ obs, -3, 3) balances the pole for 1000 steps."""

Policy = Callable[[np.ndarray], np.ndarray]


def pd_policy(obs: np.ndarray) -> np.ndarray:
    """The PD balance policy in normalized actions (the Box is [-3, 3])."""
    return (np.clip(obs @ PD_GAINS, -3.0, 3.0) / 3.0)[:, None]


def zero_policy(obs: np.ndarray) -> np.ndarray:
    """No force at all: the pole falls."""
    return np.zeros((len(obs), 1))


DICT_MODULE = '''\
"""A tiny Dict-observation environment for the tests: a point steered to a goal."""
import gymnasium
import numpy as np
from gymnasium import spaces


class DictPoint(gymnasium.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None, goal_radius=0.8):
        self.render_mode = render_mode
        self.goal_radius = goal_radius
        self.observation_space = spaces.Dict({
            "position": spaces.Box(-5.0, 5.0, (2,), np.float64),
            "goal": spaces.Box(-5.0, 5.0, (2,), np.float64),
            "stage": spaces.Discrete(2),
        })
        self.action_space = spaces.Box(-0.5, 0.5, (2,), np.float32)

    def _obs(self):
        return {"position": self.pos.copy(), "goal": self.goal.copy(), "stage": np.int64(0)}

    def _info(self):
        distance = float(np.linalg.norm(self.goal - self.pos))
        return {"distance": distance, "is_success": distance < 0.05}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2)
        angle = self.np_random.uniform(0, 2 * np.pi)
        self.goal = self.goal_radius * np.array([np.cos(angle), np.sin(angle)])
        return self._obs(), self._info()

    def step(self, action):
        self.pos = self.pos + np.clip(action, -0.5, 0.5)
        info = self._info()
        return self._obs(), -info["distance"], info["is_success"], False, info

    def render(self):
        image = np.zeros((8, 8, 3), np.uint8)
        image[..., 0] = int(min(255, 255 * np.linalg.norm(self.pos)))
        return image


gymnasium.register("{id}", entry_point=DictPoint)
'''


@pytest.fixture(scope="module")
def dict_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two importable modules that register the Dict env on import: ``physai_gymtest``
    (namespaced id ``physai_gymtest/DictPoint-v0``) and ``physai_gymtest_colon`` (plain id
    ``PhysaiColonPoint-v0``, named ``physai_gymtest_colon:PhysaiColonPoint-v0``)."""
    folder = tmp_path_factory.mktemp("gym_modules")
    (folder / "physai_gymtest.py").write_text(DICT_MODULE.replace("{id}",
                                                                  "physai_gymtest/DictPoint-v0"))
    (folder / "physai_gymtest_colon.py").write_text(DICT_MODULE.replace("{id}",
                                                                        "PhysaiColonPoint-v0"))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def scene_file(folder: Path, task: str, success: str, steps: int = 1000, extra: str = "",
               name: str = "s") -> Path:
    """A Gymnasium scene YAML in ``folder``."""
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\ntask: {task}\nepisode_steps: {steps}\n"
                    f"success: {success}\n{extra}")
    return path


def episode(scene: Scene, policy: Policy, worlds: int = 10, seed: int = 0) -> np.ndarray:
    """Success of one episode per world with ``policy``, through the validate stage's rollout."""
    env = get_task(scene.config.task).make_env(scene, worlds, seed)
    result, _ = evaluate_scene(env, policy, scene.name, worlds)
    env.close()
    return np.array([result.successes, result.episodes])


def test_the_repository_suite_loads_as_written() -> None:
    suite = load_suite(PENDULUM / "suite.yaml")
    (entry,) = suite.scenes
    assert entry.scene.config.task == TASK
    assert (entry.episodes, entry.seed, entry.scene.config.episode_steps) == (50, 0, 1000)
    assert entry.scene.config.success is not None and entry.scene.config.success.survive
    assert len(suite.digest) == 64


def test_spec_comes_from_the_spaces() -> None:
    spec = get_task(TASK)
    assert (spec.obs_dim, spec.act_dim) == (4, 1)
    assert spec.obs_names == ("obs[0]", "obs[1]", "obs[2]", "obs[3]")
    assert spec.control_hz == pytest.approx(25.0)
    assert [p.name for p in spec.asset_files] == ["inverted_pendulum.xml"]


@pytest.mark.parametrize("env_id", ["InvertedPendulum-v5", "Hopper-v5", "Reacher-v5",
                                    "Pusher-v5"])
def test_build_reset_step_shapes_and_no_nan(env_id: str, tmp_path: Path) -> None:
    task = f"gymnasium:{env_id}"
    spec = get_task(task)
    scene = load_scene(scene_file(tmp_path, task, "{min_return: 0.0}", steps=30))
    env = spec.make_env(scene, 3, 0)
    assert isinstance(env, BatchedEnv)
    obs = env.reset()
    assert obs.shape == (3, spec.obs_dim) and obs.dtype == np.float32
    rng = np.random.default_rng(0)
    for t in range(30):
        obs, reward, done = env.step(rng.uniform(-1, 1, (3, spec.act_dim)))
        assert obs.shape == (3, spec.obs_dim) and obs.dtype == np.float32
        assert reward.shape == (3,) and reward.dtype == np.float32
        assert done.shape == (3,) and done.all() == (t == 29)
        assert np.isfinite(obs).all() and np.isfinite(reward).all()
    assert env.success().shape == (3,)
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(np.zeros((3, spec.act_dim)))
    env.close()


def test_survive_passes_the_pd_policy_and_fails_the_zero_policy() -> None:
    scene = load_scene(PENDULUM / "nominal.yaml")
    assert episode(scene, pd_policy).tolist() == [10, 10]
    assert episode(scene, zero_policy).tolist() == [0, 10]


@pytest.mark.parametrize(
    ("success", "pd", "zero"),
    [
        ("{info: reward_survive}", 10, 0),
        ("{info: reward_survive, min: 1.0}", 10, 0),
        ("{info: reward_survive, max: 0.5}", 0, 10),
        ("{info: reward_survive, min: 0.5, max: 1.5}", 10, 0),
        ("{min_return: 250}", 10, 0),
        ("{min_return: 5}", 10, 10),
    ],
)
def test_every_predicate_form_judges_the_oracles(
    success: str, pd: int, zero: int, tmp_path: Path
) -> None:
    scene = load_scene(scene_file(tmp_path, TASK, success, steps=300))
    assert episode(scene, pd_policy)[0] == pd
    assert episode(scene, zero_policy)[0] == zero


def test_an_ended_world_waits_frozen_and_earns_nothing() -> None:
    scene = load_scene(PENDULUM / "nominal.yaml")
    env = get_task(TASK).make_env(scene, 2, 0)
    obs = env.reset()
    rewards = []
    for _ in range(200):
        act = pd_policy(obs)
        act[0] = 0.0
        obs, reward, _ = env.step(act)
        rewards.append(reward)
    frozen = obs[0].copy()
    obs, reward, _ = env.step(np.zeros((2, 1)))
    assert np.array_equal(obs[0], frozen) and reward[0] == 0.0 and reward[1] == 1.0
    assert np.array(rewards)[:, 0].sum() < 50
    assert env.success().tolist() == [False, True]
    env.close()


def test_restart_fallen_gives_per_world_episodes_for_training() -> None:
    from stages.training.rl_env import RslRlEnv

    scene = load_scene(PENDULUM / "nominal.yaml")
    env = get_task(TASK).make_env(scene, 4, 0)
    assert isinstance(env, GymBatchedEnv)
    env.reset()
    restarts = 0
    for _ in range(100):
        _, reward, _ = env.step(np.zeros((4, 1)), restart_fallen=True)
        restarts += int(env.restarted.sum())
        assert (reward[env.restarted] == 0.0).all()
    assert restarts >= 8 and not env.fallen().any()
    venv = RslRlEnv(env)
    import torch

    for _ in range(60):
        _, _, _, extras = venv.step(torch.zeros(4, 1))
    returns, lengths, falls, _ = venv.pop_episode_stats()
    assert falls and all(falls) and not extras["time_outs"].any()
    assert all(1 <= n <= 60 for n in lengths) and len(returns) == len(lengths)


def test_expert_action_says_collect_needs_a_policy() -> None:
    env = get_task(TASK).make_env(load_scene(PENDULUM / "nominal.yaml"), 1, 0)
    env.reset()
    with pytest.raises(PhysaiError, match=r"no scripted expert.*models:/"):
        env.expert_action()
    env.close()


def test_render_gives_rgb_frames_and_an_ended_world_its_last_frame(
    dict_modules: Path, tmp_path: Path
) -> None:
    task = "gymnasium:physai_gymtest/DictPoint-v0"
    scene = load_scene(scene_file(tmp_path, task, "{info: is_success}", steps=10,
                                  extra="make_kwargs: {goal_radius: 0.3}"))
    env = get_task(task).make_env(scene, 2, 0)
    env.reset()
    frames = env.render([0, 1], 16, 12, "rgb_array")
    assert frames.shape == (2, 12, 16, 3) and frames.dtype == np.uint8
    goal = env.clean_observation()[0, :2]
    env.step(np.stack([goal / 0.5, np.zeros(2)]))
    assert env.success().tolist() == [True, False]
    final = env.render([0], 16, 12, "rgb_array")
    env.step(np.ones((2, 2)))
    assert np.array_equal(env.render([0], 16, 12, "rgb_array"), final)
    with pytest.raises(ValueError, match="valid: rgb_array"):
        env.render([0], 16, 12, "track")
    env.close()


def test_a_dict_observation_env_validates(dict_modules: Path, tmp_path: Path) -> None:
    import gymnasium
    from gymnasium import spaces

    task = "gymnasium:physai_gymtest/DictPoint-v0"
    spec = get_task(task)
    space = gymnasium.make("physai_gymtest/DictPoint-v0").observation_space
    assert spec.obs_names == tuple(space_names(space, "")) == (
        "goal[0]", "goal[1]", "position[0]", "position[1]", "stage[0]", "stage[1]")
    assert list(space.spaces) == ["goal", "position", "stage"]
    sample = space.sample()
    assert spec.obs_dim == spaces.flatdim(space) == len(spaces.flatten(space, sample))

    def steer(obs: np.ndarray) -> np.ndarray:
        return np.clip((obs[:, 0:2] - obs[:, 2:4]) / 0.5, -1.0, 1.0)

    scene = load_scene(scene_file(tmp_path, task, "{info: is_success}", steps=6))
    assert episode(scene, steer, worlds=8).tolist() == [8, 8]
    assert episode(scene, lambda o: np.zeros((len(o), 2)), worlds=8).tolist() == [0, 8]
    near = load_scene(scene_file(tmp_path, task, "{info: distance, max: 0.3}", steps=6,
                                 extra="make_kwargs: {goal_radius: 0.2}", name="near"))
    assert episode(near, lambda o: np.zeros((len(o), 2)), worlds=8).tolist() == [8, 8]


def test_module_prefixed_ids_import_their_module(dict_modules: Path) -> None:
    import gymnasium

    assert "physai_gymtest_colon" not in sys.modules
    spec = get_task("gymnasium:physai_gymtest_colon:PhysaiColonPoint-v0")
    assert "physai_gymtest_colon" in sys.modules and spec.obs_dim == 6
    assert get_task("gymnasium:physai_gymtest/DictPoint-v0").act_dim == 2
    assert "physai_gymtest/DictPoint-v0" in gymnasium.registry
    provenance = env_provenance("gymnasium:physai_gymtest/DictPoint-v0")
    assert provenance["package"] == "physai_gymtest" and provenance["version"] == "unversioned"
    with pytest.raises(UnknownNameError, match=r"'no_such_gym_module'.*does not import"):
        get_task("gymnasium:no_such_gym_module:Env-v0")


def test_unknown_id_lists_close_matches_on_one_line(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError) as info:
        get_task("gymnasium:InvertedPendulm-v5")
    message = str(info.value)
    assert "\n" not in message
    assert "close matches: InvertedPendulum-v5" in message
    path = scene_file(tmp_path, "gymnasium:InvertedPendulm-v5", "{survive: true}")
    with pytest.raises(ConfigError) as error:
        load_scene(path)
    assert "\n" not in str(error.value) and "InvertedPendulum-v5" in str(error.value)
    assert [(p.file, p.field) for p in error.value.problems] == [(str(path), "task")]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ("success: {survive: true}\nrandomization: {target_low: [0, 0, 0], target_high: "
         "[0, 0, 0]}", "randomization", "takes no MuJoCo randomization"),
        ("", "success", "needs the scene's success predicate"),
        ("success: {survive: true, min_return: 3}", "success", "exactly one predicate"),
        ("success: {survive: false}", "success.survive", "True"),
        ("success: {min: 3}", "success", "exactly one predicate"),
        ("success: {min_return: 3, max: 4}", "success", "add info"),
        ("success: {info: x, min: 4, max: 3}", "success", "min <= max"),
        ("success: {min_return: .nan}", "success.min_return", "finite"),
        ("success: {survive: true}\nmake_kwargs: {max_episode_steps: 5}",
         "make_kwargs.max_episode_steps", "set by the pipeline"),
        ("success: {survive: true}\nmake_kwargs: {no_such_kwarg: 1}", "make_kwargs",
         "no_such_kwarg"),
        ("success: {survive: true}\nmake_kwargs: {xml_file: /no/such/model.xml}", "make_kwargs",
         "cannot be made"),
    ],
)
def test_bad_gym_scene_is_one_line_naming_file_field_and_value(
    body: str, field: str, words: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: s\ntask: {TASK}\nepisode_steps: 10\n{body}\n")
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    message = str(info.value)
    assert "\n" not in message and f"{path}: {field}:" in message and "(value: " in message
    assert words in message, message


def test_a_mujoco_task_refuses_gym_fields_and_still_needs_randomization(tmp_path: Path) -> None:
    path = tmp_path / "reach.yaml"
    path.write_text("name: s\ntask: reach-v0\nepisode_steps: 10\nsuccess: {survive: true}\n"
                    "make_kwargs: {a: 1}\n")
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    assert {p.field for p in info.value.problems} == {"success", "make_kwargs", "randomization"}
    reach = load_scene(ROOT / "sim_scenes" / "reach" / "nominal.yaml")
    assert reach.config.success is None and reach.config.randomization.obs_noise_std >= 0


def test_suite_digest_covers_make_kwargs_and_the_providing_package(tmp_path: Path) -> None:
    import gymnasium

    def digest(kwargs: str) -> str:
        folder = tmp_path / str(abs(hash(kwargs)))
        folder.mkdir()
        (folder / "suite.yaml").write_text(
            f"name: p\ntask: {TASK}\nscenes:\n  - {{scene: s.yaml, episodes: 5, seed: 0}}\n")
        scene_file(folder, TASK, "{survive: true}", extra=kwargs)
        return load_suite(folder / "suite.yaml").digest

    assert digest("") != digest("make_kwargs: {reset_noise_scale: 0.05}")
    from stages.pipeline.config import scene_digest
    from stages.sim.suites.digest import scene_provenance

    nominal = PENDULUM / "nominal.yaml"
    assert scene_provenance(nominal)["gymnasium"]["version"] == gymnasium.__version__
    assert scene_provenance(ROOT / "sim_scenes" / "reach" / "nominal.yaml") == {}
    assert len(scene_digest(nominal, get_task(TASK).asset_files)) == 64
    provenance = env_provenance(TASK)
    assert provenance == {"env_id": "InvertedPendulum-v5", "package": "gymnasium",
                          "version": gymnasium.__version__, "gymnasium": gymnasium.__version__}


@pytest.mark.e2e
def test_ppo_pipeline_through_the_cli_keeps_the_pole_up(
    tmp_path: Path, cli_env: Callable[..., dict[str, str]]
) -> None:
    from tests.support import run_flows

    config = yaml.safe_load((ROOT / "configs" / "pendulum.yaml").read_text())
    config["name"] = "pendulum-e2e"
    config["train"]["iterations"] = 40
    config["train"]["scene"] = str(PENDULUM / "nominal.yaml")
    config["validate"].update(suite=str(PENDULUM / "suite.yaml"), video_episodes=0)
    config["package"]["latency_iters"] = 200
    config["promote"]["model_name"] = "pendulum-e2e"
    path = tmp_path / "pendulum.yaml"
    path.write_text(yaml.safe_dump(config))
    start = time.perf_counter()
    result = run_flows("run", str(path), env=cli_env(tmp_path / "home"), cwd=tmp_path)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    row = re.search(r"nominal\s*│\s*50\s*│\s*([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", result.stdout)
    assert row is not None, result.stdout[-3000:]
    rate, low, _ = map(float, row.groups())
    assert rate >= 0.9, result.stdout[-3000:]
    assert "models:/pendulum-e2e/1 -> @champion" in result.stdout
    print(f"pendulum PPO pipeline: nominal {rate:.2f} (CI low {low:.3f}) in {seconds:.0f} s")


def test_collect_records_a_policy_from_the_store_as_expert(
    physai_home: Path, tmp_path: Path
) -> None:
    from stages.orchestration.context import NullProgress
    from stages.pipeline.config import load_pipeline
    from stages.pipeline.run import run_direct

    base = yaml.safe_load((ROOT / "configs" / "pendulum.yaml").read_text())
    base["train"].update(scene=str(PENDULUM / "nominal.yaml"), iterations=2, num_worlds=8,
                         steps_per_iteration=8)
    short = scene_file(tmp_path, TASK, "{survive: true}", steps=50, name="short")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "short", "task": TASK, "scenes": [
        {"scene": str(short), "episodes": 4, "seed": 0}]}))
    base["validate"].update(suite=str(suite), video_episodes=0, min_success=0.0)
    base["package"]["latency_iters"] = 100
    teacher_cfg = tmp_path / "teacher.yaml"
    teacher_cfg.write_text(yaml.safe_dump({**base, "name": "pendulum-teacher"}))
    teacher = run_direct(load_pipeline(teacher_cfg), NullProgress()).policy
    student = {**base, "name": "pendulum-student",
               "collect": {"scene": str(short), "episodes": 6, "num_worlds": 3,
                           "exploration_noise": 0.0, "expert": teacher.digest},
               "train": {"algorithm": "bc", "epochs": 1, "hidden": [16], "device": "cpu"},
               "promote": {"model_name": "pendulum-student"}}
    student_cfg = tmp_path / "student.yaml"
    student_cfg.write_text(yaml.safe_dump(student))
    result = run_direct(load_pipeline(student_cfg), NullProgress())
    assert result.dataset is not None
    assert result.dataset.expert == teacher.digest
    assert result.dataset.parents == (teacher.digest,)
    assert (result.dataset.episodes, result.dataset.transitions) == (6, 300)
    assert result.policy.task == TASK and result.report.scenes[0].episodes == 4


def test_importing_the_registry_does_not_import_gymnasium() -> None:
    import subprocess

    code = textwrap.dedent("""
        import sys
        import stages.sim.tasks.catalog
        import stages.sim.scenes.scene
        print("gymnasium" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_collect_with_the_scripted_expert_says_a_policy_is_needed(
    physai_home: Path, tmp_path: Path
) -> None:
    from stages.orchestration.context import NullProgress
    from stages.pipeline.config import load_pipeline
    from stages.pipeline.run import run_direct

    short = scene_file(tmp_path, TASK, "{survive: true}", steps=5, name="short")
    config = yaml.safe_load((ROOT / "configs" / "pendulum.yaml").read_text())
    config.update(
        name="pendulum-scripted",
        collect={"scene": str(short), "episodes": 2, "num_worlds": 2},
        train={"algorithm": "bc", "epochs": 1, "device": "cpu"},
        validate={"suite": str(PENDULUM / "suite.yaml"), "min_success": 0.0},
    )
    path = tmp_path / "scripted.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(PhysaiError, match="no scripted expert"):
        run_direct(load_pipeline(path), NullProgress())

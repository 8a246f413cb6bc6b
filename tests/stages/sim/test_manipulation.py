"""lift-v0 and pick-place-v0 (stages/sim/tasks/manipulation.py): the scripted expert grasps,
failed episodes say why, the object's factors are drawn and recorded, and a planted failure is
ranked by the factor that causes it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from stages.evaluation.episodes import episode_table
from stages.evaluation.rollout import rollout
from stages.evaluation.suite import evaluate_scene
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task
from stages.sim.tasks.manipulation import ManipulationEnv

SCENES = Path(__file__).resolve().parents[3] / "sim_scenes" / "pick_place"


def scene_file(tmp_path: Path, task: str = "pick-place-v0", steps: int = 175,
               **randomization: object) -> Path:
    """A scene of ``task`` with the object near the middle of the table, and ``randomization``
    over it."""
    import yaml

    rand = {"target_low": [0.45, -0.05], "target_high": [0.55, 0.05],
            "object_yaw": [-0.3, 0.3], **randomization}
    path = tmp_path / f"{task}-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "task": task, "episode_steps": steps,
                                    "randomization": rand}))
    return path


def make(path: Path, worlds: int, seed: int = 0) -> ManipulationEnv:
    scene = load_scene(path)
    env = get_task(scene.config.task).make_env(scene, worlds, seed, num_threads=1)
    assert isinstance(env, ManipulationEnv)
    return env


def run(env: ManipulationEnv, policy=None) -> tuple[np.ndarray, Counter[str]]:
    """One episode of every world; each world's success and the failure modes."""
    env.reset()
    for _ in range(env.episode_steps):
        env.step(policy(env) if policy else env.expert_action())
    success = env.success()
    columns, _ = episode_table(env, success, np.zeros(env.num_worlds), None)
    return success, Counter(str(f) for f in columns["failure"] if f)


@pytest.mark.parametrize(("task", "steps"), [("lift-v0", 100), ("pick-place-v0", 175)])
def test_the_expert_grasps_in_nearly_every_nominal_episode(tmp_path: Path, task: str,
                                                           steps: int) -> None:
    success, modes = run(make(scene_file(tmp_path, task, steps), 24))
    assert success.mean() >= 0.95, modes


def test_same_seed_same_episode_and_the_object_draws_are_recorded(tmp_path: Path) -> None:
    path = scene_file(tmp_path, object_mass=[0.1, 0.5], object_size_scale=[0.8, 1.2],
                      gripper_force_scale=[0.5, 1.0])
    a, b = make(path, 4, seed=3), make(path, 4, seed=3)
    np.testing.assert_array_equal(a.reset(), b.reset())
    for _ in range(10):
        act = a.expert_action()
        np.testing.assert_array_equal(act, b.expert_action())
        np.testing.assert_array_equal(a.step(act)[0], b.step(act)[0])
    cond, units = a.episode_conditions(), a.condition_units()
    assert units["object_mass"] == "kg" and units["target_object_x"] == "m"
    assert ((cond["object_mass"] >= 0.1) & (cond["object_mass"] <= 0.5)).all()
    assert cond["object_mass"].std() > 0 and cond["object_size_scale"].std() > 0
    # the drawn mass and size are the simulated ones
    model = a.batch.get_model(1)
    obj = model.body("object").id
    assert model.body_mass[obj] == pytest.approx(cond["object_mass"][1])
    assert model.geom_size[model.geom("object").id][0] == pytest.approx(
        0.02 * cond["object_size_scale"][1])


def test_a_gripper_that_never_closes_misses_every_grasp(tmp_path: Path) -> None:
    def never_close(env: ManipulationEnv) -> np.ndarray:
        act = env.expert_action()
        act[:, -1] = 1.0
        return act

    success, modes = run(make(scene_file(tmp_path), 6), never_close)
    assert not success.any() and modes == Counter(missed_grasp=6)


def test_letting_go_beside_the_bin_is_placed_wrong_and_far_from_it_dropped(
        tmp_path: Path) -> None:
    path = scene_file(tmp_path)

    def let_go_within(radius: float):
        gone = np.zeros(4, bool)  # a world lets go once, then stays open and still

        def policy(env: ManipulationEnv) -> np.ndarray:
            act = env.expert_action()
            lifted = env._obj_pos[:, 2] > env._table_top + 0.06
            off = np.linalg.norm(env._obj_pos[:, :2] - env._place[:2], axis=1)
            gone[lifted & (off < radius)] = True
            act[gone, :-1] = 0.0
            act[gone, -1] = 1.0
            return act
        return policy

    # the object rises at the middle of the table, 0.28 m from the bin: let go at once
    assert run(make(path, 4), let_go_within(1.0))[1] == Counter(dropped=4)
    # carried toward the bin and let go 0.09-0.12 m short of its centre: beside it
    assert run(make(path, 4), let_go_within(0.14))[1] == Counter(placed_wrong=4)


def test_a_short_episode_times_out_holding_the_object(tmp_path: Path) -> None:
    success, modes = run(make(scene_file(tmp_path, steps=60), 4))
    assert not success.any() and modes == Counter(timed_out=4)


def test_an_object_pushed_off_the_table_is_knocked_off(tmp_path: Path) -> None:
    env = make(scene_file(tmp_path, steps=20), 2)
    env.reset()
    q = env._object_q
    env.batch.bind("qpos")[0, q:q + 3] = [0.95, 0.0, 0.3]  # past the table's far edge
    for _ in range(env.episode_steps):
        env.step(np.zeros((2, 8), np.float32))
    assert list(env.episode_failures()) == ["knocked_off", "missed_grasp"]


def test_a_policy_that_lets_heavy_objects_go_ranks_object_mass_first(tmp_path: Path) -> None:
    """The planted failure: open the gripper whenever the object is heavier than 0.3 kg."""
    env = make(scene_file(tmp_path, object_mass=[0.05, 0.55],
                          object_size_scale=[0.9, 1.1]), 40, seed=5)

    def act(obs: np.ndarray) -> np.ndarray:
        action = env.expert_action()
        heavy = env.episode_conditions()["object_mass"] > 0.3
        action[heavy, -1] = 1.0
        return action

    result, _ = evaluate_scene(env, act, "planted", 40)
    assert 0.2 < result.success_rate < 0.8
    assert result.failure_modes.get("missed_grasp", 0) > 0
    first = result.factors[0]
    assert first.name == "object_mass" and first.ci_low > 0, result.factors[:3]


def test_object_fields_are_refused_for_a_task_without_an_object(tmp_path: Path) -> None:
    from physai_core.errors import PhysaiError

    path = tmp_path / "reach.yaml"
    path.write_text("name: s\ntask: reach-v0\nepisode_steps: 10\nrandomization:\n"
                    "  target_low: [0.3, 0, 0.3]\n  target_high: [0.4, 0.1, 0.4]\n"
                    "  object_mass: [0.1, 0.2]\n")
    with pytest.raises(PhysaiError, match=r"randomization.object_mass.*no object to grasp"):
        load_scene(path)


def test_the_shipped_suite_has_scenes_where_the_expert_fails_sometimes() -> None:
    """heavy.yaml: the expert (a good policy) drops some objects, and says so."""
    scene = load_scene(SCENES / "heavy.yaml")
    env = get_task(scene.config.task).make_env(scene, 30, 2000, num_threads=1)
    out = rollout(env, lambda obs: env.expert_action())
    rate = out.success.mean()
    assert 0.2 <= rate <= 0.9, rate
    assert out.episodes is not None and "dropped" in set(out.episodes["failure"])


def test_the_task_that_sees_observes_its_own_state_and_both_cameras(tmp_path: Path) -> None:
    env = make(scene_file(tmp_path, task="pick-place-vision-v0", steps=5), 2)
    obs = env.reset()
    assert obs.shape == (2, 18)
    images = env.camera_images()
    assert {k: v.shape for k, v in images.items()} == {
        "front_image": (2, 64, 64, 3), "wrist_image": (2, 64, 64, 3)}
    # two cameras of one size, drawn in tiles, are each their own (they once shared a canvas
    # and both showed the last drawn), and are what one world at a time draws
    assert not np.array_equal(images["front_image"], images["wrist_image"])
    env.tile_cameras("off")
    one_by_one = env.camera_images()
    for key, frames in images.items():
        np.testing.assert_array_equal(frames, one_by_one[key])


def test_a_mass_sweep_holds_each_mass_and_the_grip_gives_way_above_a_kilogram(
        tmp_path: Path) -> None:
    from stages.sim.scenes.scene import sweep_variant

    path = scene_file(tmp_path)
    path.write_text(path.read_text() + "sweep:\n  object_mass: [0.3, 1.4]\n")
    scene = load_scene(path)
    rates = {}
    for point in scene.config.sweep_points():
        variant = sweep_variant(scene, point)
        env = get_task(variant.config.task).make_env(variant, 8, 0, num_threads=1)
        out = rollout(env, lambda obs, env=env: env.expert_action())
        assert out.episodes is not None
        np.testing.assert_allclose(out.episodes["object_mass"], point["object_mass"])
        rates[point["object_mass"]] = out.success.mean()
    assert rates == {0.3: 1.0, 1.4: 0.0}, rates

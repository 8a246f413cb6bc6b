"""USD rollouts: the filmed worlds' body poses at every step, written as a stage pxr reads back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stages.core.hashing import sha256_file
from stages.evaluation.rollout import VideoSpec, rollout
from stages.evaluation.usd import EPISODE_SPACING, write_rollout_usd
from stages.sim.env.bodies import mujoco_layout
from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_scene
from stages.sim.tasks import reach

ROOT = Path(__file__).resolve().parents[2]
NOMINAL = ROOT / "sim_scenes" / "reach" / "nominal.yaml"

pxr = pytest.importorskip("pxr")


def _expert_rollout(episodes: int, worlds: int = 3):  # type: ignore[no-untyped-def]
    env = reach.ReachEnv(load_scene(NOMINAL), worlds, 5, num_threads=1)
    video = VideoSpec(episodes, 32, 24, 50, "overview")
    out = rollout(env, lambda obs: env.expert_action(), video)
    return env, out


def test_rollout_records_every_step_of_the_filmed_worlds_as_the_model_has_them() -> None:
    import mujoco

    env, out = _expert_rollout(episodes=2)
    assert out.poses is not None and out.layout is not None
    nbody = len(out.layout.names)
    assert out.poses.shape == (env.episode_steps + 1, 2, nbody, 7)
    assert {"world", "base", "link7", "target"} <= set(out.layout.names)
    # The last recorded pose is the final state: recompute world 1's from its own MjData.
    model = mujoco.MjModel.from_xml_path(str(reach.ARM7_XML))
    data = mujoco.MjData(model)
    env.batch.get_data(1, data)
    mujoco.mj_kinematics(model, data)
    np.testing.assert_allclose(out.poses[-1, 1, :, :3], data.xpos)
    np.testing.assert_allclose(out.poses[-1, 1, :, 3:], data.xquat)
    hand = out.layout.names.index("link7")
    assert np.linalg.norm(out.poses[-1, 0, hand, :3] - out.poses[0, 0, hand, :3]) > 0.01


def test_unfilmed_rollout_records_nothing_and_filming_changes_no_outcome() -> None:
    env = reach.ReachEnv(load_scene(NOMINAL), 3, 5, num_threads=1)
    plain = rollout(env, lambda obs: env.expert_action())
    _, filmed = _expert_rollout(episodes=2)
    assert plain.poses is None and plain.layout is None
    np.testing.assert_array_equal(plain.returns, filmed.returns)


def test_gymnasium_mujoco_env_is_recorded_without_touching_its_state() -> None:
    pytest.importorskip("gymnasium")
    from stages.sim.tasks.catalog import get_task

    pendulum = ROOT / "sim_scenes" / "pendulum" / "nominal.yaml"
    nominal = load_scene(pendulum)
    scene = Scene(config=nominal.config.model_copy(update={"episode_steps": 60}),
                  path=nominal.path)
    spec = get_task("gymnasium:InvertedPendulum-v5")

    def push(obs: np.ndarray) -> np.ndarray:
        return np.clip(3.0 * obs[:, 1:2] + 0.3 * obs[:, 3:4], -1, 1).astype(np.float32)

    plain = rollout(spec.make_env(scene, 2, 9), push)
    filmed = rollout(spec.make_env(scene, 2, 9), push, VideoSpec(1, 32, 24, 1000, "rgb_array"))
    assert filmed.poses is not None and filmed.layout is not None
    assert filmed.poses.shape[:2] == (61, 1) and "pole" in filmed.layout.names
    np.testing.assert_array_equal(plain.returns, filmed.returns)
    pole = filmed.layout.names.index("pole")
    assert np.ptp(filmed.poses[:, 0, pole, 3:], axis=0).max() > 1e-4  # the pole swings


def test_usd_stage_plays_the_poses_back_at_the_control_rate(tmp_path: Path) -> None:
    from pxr import Usd, UsdGeom

    env, out = _expert_rollout(episodes=2)
    assert out.poses is not None and out.layout is not None
    path = tmp_path / "rollout.usda"
    write_rollout_usd(path, out.layout, out.poses, fps=reach.CONTROL_HZ)
    stage = Usd.Stage.Open(str(path))
    assert stage.GetTimeCodesPerSecond() == reach.CONTROL_HZ
    assert (stage.GetStartTimeCode(), stage.GetEndTimeCode()) == (0, env.episode_steps)
    assert UsdGeom.GetStageUpAxis(stage) == UsdGeom.Tokens.z
    hand = out.layout.names.index("link7")
    for k in range(2):
        prim = stage.GetPrimAtPath(f"/World/episode_{k}/link7")
        move, turn = UsdGeom.Xformable(prim).GetOrderedXformOps()
        assert move.GetTimeSamples() == [float(t) for t in range(env.episode_steps + 1)]
        for t in (0, 37, env.episode_steps):
            np.testing.assert_allclose(move.Get(t), out.poses[t, k, hand, :3])
            q = turn.Get(t)
            np.testing.assert_allclose([q.GetReal(), *q.GetImaginary()], out.poses[t, k, hand, 3:])
        world = UsdGeom.Xformable(prim).ComputeLocalToWorldTransform(37).ExtractTranslation()
        np.testing.assert_allclose(world, out.poses[37, k, hand, :3] + [0, k * EPISODE_SPACING, 0])
    shapes = [p for p in stage.Traverse() if p.IsA(UsdGeom.Gprim)]
    assert len(shapes) == 2 * len(out.layout.shapes) > 0
    assert {p.GetTypeName() for p in shapes} >= {"Capsule", "Sphere"}


def test_same_poses_same_bytes_and_a_wrong_shape_is_refused(tmp_path: Path) -> None:
    _, out = _expert_rollout(episodes=1)
    assert out.poses is not None and out.layout is not None
    write_rollout_usd(tmp_path / "a.usda", out.layout, out.poses, fps=25)
    write_rollout_usd(tmp_path / "b.usda", out.layout, out.poses, fps=25)
    assert sha256_file(tmp_path / "a.usda") == sha256_file(tmp_path / "b.usda")
    with pytest.raises(ValueError, match="do not fit"):
        write_rollout_usd(tmp_path / "c.usda", out.layout, out.poses[:, :, 1:], fps=25)


def test_layout_keeps_visible_shapes_of_each_kind() -> None:
    import mujoco

    model = mujoco.MjModel.from_xml_string("""
    <mujoco><worldbody>
      <geom type="plane" size="0 0 1"/>
      <body name="b"><freejoint/>
        <geom type="box" size="0.1 0.2 0.3" rgba="1 0 0 1"/>
        <geom type="sphere" size="0.1" rgba="0 0 0 0"/>
        <geom type="cylinder" size="0.05 0.2"/>
      </body>
    </worldbody></mujoco>""")
    layout = mujoco_layout(model)
    assert layout.names == ("world", "b")
    assert [(s.kind, s.body) for s in layout.shapes] == [("plane", 0), ("box", 1), ("cylinder", 1)]
    assert layout.shapes[0].size[:2] == (5.0, 5.0)
    assert layout.shapes[1].size == pytest.approx((0.1, 0.2, 0.3))

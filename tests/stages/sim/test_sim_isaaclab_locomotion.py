"""The Isaac Lab locomotion-v0 backend against the MuJoCo one; skipped without Isaac Lab.

Isaac Lab's simulation context is a process singleton: the test that builds its own
environment runs (and closes it) before the module's shared flat-ground environment is built.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("isaaclab")

from stages.sim.backends.isaaclab_locomotion import (
    QUADRUPED_USD,
    IsaacLabLocomotionEnv,
    write_quadruped_usd,
)
from stages.sim.env.batched import BatchedEnv
from stages.sim.suites.loading import load_scene
from stages.sim.tasks import locomotion as loco

SCENES = Path(__file__).resolve().parents[3] / "sim_scenes" / "locomotion"
WORLDS = 4
SEED = 1000


def test_usd_matches_mjcf() -> None:
    """The committed USD is what write_quadruped_usd writes from the committed MJCF."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "quadruped.usda"
        write_quadruped_usd(loco.QUADRUPED_XML, out)
        assert out.read_text() == QUADRUPED_USD.read_text()


def test_randomization_reaches_the_solver_as_mujoco_draws_it() -> None:
    """Payload, masses and contact friction are MuJoCo's draws for the same scene and seed."""
    scene = load_scene(SCENES / "collect.yaml")
    env = IsaacLabLocomotionEnv(scene, 2, 7)
    try:
        ref = loco.LocomotionEnv(scene, 2, 7, num_threads=1)
        obs, ref_obs = env.reset(), ref.reset()
        np.testing.assert_allclose(obs, ref_obs, atol=1e-5)
        env.step(env.expert_action())
        mass = env._robot.data.body_mass.torch.cpu().numpy()[:, env._body_order]
        np.testing.assert_allclose(mass, ref.batch.expand("body_mass")[:, 1:], rtol=1e-5)
        solver = env._sim.physics_manager._solver
        colliders = [
            ref._model.geom(name).id for name in ("torso", *(f"{leg}_foot" for leg in loco.LEGS))
        ]
        friction = solver.mjw_model.geom_friction.numpy()[:, 1:, 0]  # floor, torso, feet
        np.testing.assert_allclose(
            friction, ref.batch.expand("geom_friction")[:, colliders, 0], rtol=1e-5
        )
    finally:
        env.close()


@pytest.fixture(scope="module")
def flat_env() -> Iterator[IsaacLabLocomotionEnv]:
    """Four worlds of the flat scene, seed 1000."""
    env = IsaacLabLocomotionEnv(load_scene(SCENES / "flat.yaml"), WORLDS, SEED)
    yield env
    env.close()


def test_expert_walks_on_the_floor_as_on_mujoco(flat_env: IsaacLabLocomotionEnv) -> None:
    """Same first observation as MuJoCo; the trot keeps every robot up, carried by the floor,
    and tracks the commanded speed as well as on MuJoCo."""
    env = flat_env
    assert isinstance(env, BatchedEnv)
    ref = loco.LocomotionEnv(load_scene(SCENES / "flat.yaml"), WORLDS, SEED, num_threads=1)
    obs, ref_obs = env.reset(), ref.reset()
    assert obs.shape == (WORLDS, 50) and obs.dtype == np.float32
    np.testing.assert_allclose(obs, ref_obs, atol=1e-5)
    lowest = np.full(WORLDS, np.inf)
    done = np.zeros(WORLDS, dtype=bool)
    for _ in range(env.episode_steps):
        obs, reward, done = env.step(env.expert_action())
        ref.step(ref.expert_action())
        lowest = np.minimum(lowest, env.body_poses(list(range(WORLDS)))[:, 1, 2])
    assert done.all() and reward.shape == (WORLDS,) and np.isfinite(obs).all()
    assert lowest.min() > 0.2, f"torso sank to {lowest.min():.3f} m: no floor contact"
    assert not env.fallen().any()
    assert ref.success().sum() >= WORLDS - 1, "the scripted trot should walk on MuJoCo"
    assert abs(int(env.success().sum()) - int(ref.success().sum())) <= 1
    np.testing.assert_allclose(env.forward_speed_error(), ref.forward_speed_error(), atol=0.03)
    with pytest.raises(RuntimeError):
        env.step(np.zeros((WORLDS, 12)))


def test_body_poses_are_mujoco_kinematics_of_the_state(flat_env: IsaacLabLocomotionEnv) -> None:
    """Body poses have one row per MJCF body; each is where MuJoCo's forward kinematics puts
    it for Isaac Lab's torso pose and joint positions, within 1 mm."""
    import mujoco

    env = flat_env
    env.reset()
    for _ in range(20):
        env.step(env.expert_action())
    poses = env.body_poses([1, 3])
    model = mujoco.MjModel.from_xml_path(str(loco.QUADRUPED_XML))
    assert poses.shape == (2, model.nbody, 7)
    assert env.body_layout().names == tuple(model.body(b).name for b in range(model.nbody))
    data = mujoco.MjData(model)
    for k, world in enumerate((1, 3)):
        data.qpos[:7] = poses[k, model.body("torso").id]
        data.qpos[7:] = env.clean_observation()[world, 12:24]
        mujoco.mj_kinematics(model, data)
        np.testing.assert_allclose(poses[k, :, :3], data.xpos, atol=1e-3)
        same_turn = np.abs((poses[k, :, 3:] * data.xquat).sum(-1))
        assert same_turn.min() > 0.999
    with pytest.raises(RuntimeError):
        env.render([0], 32, 24, "track")

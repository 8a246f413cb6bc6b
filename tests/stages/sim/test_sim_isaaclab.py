"""The Isaac Lab reach-v0 backend against the MuJoCo one; skipped without Isaac Lab."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("isaaclab")

from stages.sim.backends.isaaclab_robot import ARM7_USD, IsaacLabReachEnv, write_arm7_usd
from stages.sim.env.batched import BatchedEnv
from stages.sim.suites.loading import load_scene
from stages.sim.tasks import reach

SCENES = Path(__file__).resolve().parents[3] / "sim_scenes" / "reach"


@pytest.fixture(scope="module")
def nominal_env() -> Iterator[IsaacLabReachEnv]:
    """Four worlds of the nominal scene, seed 1000."""
    env = IsaacLabReachEnv(load_scene(SCENES / "nominal.yaml"), 4, 1000)
    yield env
    env.close()


def test_usd_matches_mjcf() -> None:
    """The committed USD is what write_arm7_usd writes from the committed MJCF."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "arm7.usda"
        write_arm7_usd(reach.ARM7_XML, out)
        assert out.read_text() == ARM7_USD.read_text()


def test_api_and_expert_match_mujoco(nominal_env: IsaacLabReachEnv) -> None:
    """Same first observation as MuJoCo; the expert succeeds and ends within 1 mm of MuJoCo."""
    env = nominal_env
    assert isinstance(env, BatchedEnv)
    scene = load_scene(SCENES / "nominal.yaml")
    ref = reach.ReachEnv(scene, 4, 1000, num_threads=1)
    obs = env.reset()
    ref_obs = ref.reset()
    assert obs.shape == (4, 23) and obs.dtype == np.float32
    np.testing.assert_allclose(obs, ref_obs, atol=1e-5)
    done = np.zeros(4, dtype=bool)
    for _ in range(env.episode_steps):
        obs, reward, done = env.step(env.expert_action())
        ref_obs, _, _ = ref.step(ref.expert_action())
    assert done.all() and reward.shape == (4,)
    assert env.success().all()
    np.testing.assert_allclose(obs[:, 14:17], ref_obs[:, 14:17], atol=1e-3)
    with pytest.raises(RuntimeError):
        env.step(np.zeros((4, 7)))


def test_validates_a_cloned_policy_as_mujoco_does(nominal_env: IsaacLabReachEnv) -> None:
    """A policy cloned from MuJoCo demonstrations gets the same per-episode outcome on both."""
    import torch

    from stages.evaluation.suite import evaluate_scene
    from stages.policies.local import build_policy, policy_fn

    scene = load_scene(SCENES / "nominal.yaml")
    demo = reach.ReachEnv(load_scene(SCENES / "collect.yaml"), 64, 7, num_threads=1)
    obs, pairs = demo.reset(), []
    for _ in range(demo.episode_steps):
        action = demo.expert_action()
        pairs.append((obs, action))
        obs, _, _ = demo.step(action)
    x = torch.from_numpy(np.concatenate([o for o, _ in pairs]))
    y = torch.from_numpy(np.concatenate([a for _, a in pairs]))
    torch.manual_seed(0)
    module = build_policy(x.shape[1], y.shape[1], (128, 128), x.mean(0).numpy(),
                          x.std(0).clamp_min(1e-3).numpy())
    optim = torch.optim.Adam(module.parameters(), lr=3e-3)
    for step in range(600):
        idx = torch.randint(0, len(x), (512,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.mse_loss(module(x[idx]), y[idx])
        optim.zero_grad()
        loss.backward()
        optim.step()
    act = policy_fn(module.eval())

    isaac, _ = evaluate_scene(nominal_env, act, "nominal", 4)
    mujoco, _ = evaluate_scene(reach.ReachEnv(scene, 4, 1000, num_threads=1), act, "nominal", 4)
    assert mujoco.successes >= 3, "the cloned policy should reach on MuJoCo"
    assert isaac.successes == mujoco.successes
    assert abs(isaac.mean_final_reward - mujoco.mean_final_reward) < 5e-3


def test_usd_rollout_from_isaac_lab_is_mujoco_kinematics_of_its_joints(
    nominal_env: IsaacLabReachEnv, tmp_path: Path
) -> None:
    """The expert's filmed rollout on Isaac Lab records every MJCF body at every step (no
    renderer here: the GIF is skipped, the poses are not): each body where MuJoCo's forward
    kinematics puts it for the joint positions Isaac Lab reported, within 1 mm; the stage plays
    back from its USD file."""
    import mujoco
    from pxr import Usd, UsdGeom

    from stages.evaluation.rollout import VideoSpec, rollout
    from stages.evaluation.usd import write_rollout_usd

    seen: list[np.ndarray] = []

    def expert(obs: np.ndarray) -> np.ndarray:
        seen.append(obs[:2].astype(np.float64))
        return nominal_env.expert_action()

    out = rollout(nominal_env, expert, VideoSpec(2, 32, 24, 50, "overview"))
    assert out.frames == [] and out.poses is not None and out.layout is not None
    assert out.poses.shape == (nominal_env.episode_steps + 1, 2, len(out.layout.names), 7)
    model = mujoco.MjModel.from_xml_path(str(reach.ARM7_XML))
    data = mujoco.MjData(model)
    assert out.layout.names == tuple(model.body(b).name for b in range(model.nbody))
    for t in (0, 30, nominal_env.episode_steps - 1):
        for k in range(2):
            data.qpos[:] = seen[t][k, :7]
            data.mocap_pos[0] = seen[t][k, 17:20]
            mujoco.mj_kinematics(model, data)
            np.testing.assert_allclose(out.poses[t, k, :, :3], data.xpos, atol=1e-3)
            same_turn = np.abs((out.poses[t, k, :, 3:] * data.xquat).sum(-1))  # |<q, q'>|
            assert same_turn.min() > 0.999, (t, k, same_turn)
    path = tmp_path / "nominal.usda"
    write_rollout_usd(path, out.layout, out.poses, fps=reach.CONTROL_HZ)
    stage = Usd.Stage.Open(str(path))
    move = UsdGeom.Xformable(stage.GetPrimAtPath("/World/episode_1/link7")).GetOrderedXformOps()[0]
    assert move.GetTimeSamples()[-1] == nominal_env.episode_steps == stage.GetEndTimeCode()


def test_device_auto_simulates_on_a_gpu_when_torch_sees_one(
    nominal_env: IsaacLabReachEnv,
) -> None:
    import torch

    from stages.sim.backends.isaaclab_robot import sim_device

    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert sim_device("auto") == expected and sim_device("cpu") == "cpu"
    assert sim_device("cuda") == "cuda:0"
    assert nominal_env._device == expected  # the fixture's env was built with device auto
    assert nominal_env._tensor(np.zeros(3)).device.type == expected.split(":")[0]

"""The scripted trot: inverse kinematics against MuJoCo, and foot paths without jumps."""

from __future__ import annotations

import mujoco
import numpy as np

from stages.sim.tasks import locomotion
from stages.sim.tasks.gait import foot_targets, leg_ik, leg_phases, trot_joint_targets


def feet_from_mujoco(angles: np.ndarray) -> np.ndarray:
    """Foot centres relative to their hips, torso frame, for joint angles of all legs.

    Args:
        angles: Joint angles (rad). Shape: (K, 12).

    Returns:
        Foot centres (m). Shape: (K, 4, 3).
    """
    model = mujoco.MjModel.from_xml_path(str(locomotion.QUADRUPED_XML))
    data = mujoco.MjData(model)
    out = np.empty((len(angles), 4, 3))
    for k, q in enumerate(angles):
        data.qpos[:7] = [0, 0, 1, 1, 0, 0, 0]
        data.qpos[7:] = q
        mujoco.mj_kinematics(model, data)
        for i, leg in enumerate(locomotion.LEGS):
            out[k, i] = data.geom(f"{leg}_foot").xpos - data.body(f"{leg}_hip").xpos
    return out


def test_leg_ik_inverts_the_model_kinematics() -> None:
    rng = np.random.default_rng(0)
    per_leg = np.stack(
        [
            rng.uniform(-0.4, 0.4, 50),
            rng.uniform(-0.6, 1.4, 50),
            rng.uniform(-2.4, -0.3, 50),
        ],
        axis=-1,
    )
    angles = np.tile(per_leg, 4)
    feet = feet_from_mujoco(angles)
    solved = leg_ik(feet, locomotion.GAIT.thigh, locomotion.GAIT.shank)
    np.testing.assert_allclose(solved.reshape(50, 12), angles, atol=1e-6)


def test_feet_reach_their_ik_targets_in_the_model() -> None:
    rng = np.random.default_rng(1)
    targets = np.stack(
        [rng.uniform(-0.1, 0.1, 40), rng.uniform(-0.05, 0.05, 40), rng.uniform(-0.33, -0.2, 40)],
        axis=-1,
    )
    feet = np.repeat(targets[:, None, :], 4, axis=1)
    angles = leg_ik(feet, locomotion.GAIT.thigh, locomotion.GAIT.shank).reshape(40, 12)
    np.testing.assert_allclose(feet_from_mujoco(angles), feet, atol=1e-9)


def test_foot_paths_are_continuous_and_lift_only_in_swing() -> None:
    gait = locomotion.GAIT
    stride = np.array([[[0.08, -0.02]]])
    placement = np.array([[[0.01, 0.03]]])
    phases = np.linspace(0.0, 2.0, 2001)[:-1] % 1.0
    path = np.concatenate(
        [foot_targets(gait, np.array([p]), stride, placement)[0] for p in phases]
    )
    assert np.abs(np.diff(path, axis=0)).max() < 2e-3
    in_stance = phases < gait.duty
    np.testing.assert_allclose(path[in_stance, 2], -gait.stance_height)
    assert np.isclose(path[~in_stance, 2].max(), -gait.stance_height + gait.lift)
    touchdown = foot_targets(gait, np.array([0.0]), stride, placement)[0, 0, :2]
    np.testing.assert_allclose(touchdown, stride[0, 0] / 2 + placement[0, 0])


def test_trot_moves_diagonal_legs_together() -> None:
    phases = leg_phases(0.37, locomotion.GAIT.period, locomotion.TROT_OFFSETS)
    front_left, front_right, rear_left, rear_right = phases
    assert front_left == rear_right
    assert front_right == rear_left
    assert abs(front_left - front_right) == 0.5


def test_trot_targets_follow_the_command_direction() -> None:
    gait = locomotion.GAIT
    hips = np.array([[0.18, 0.1, 0], [0.18, -0.1, 0], [-0.18, 0.1, 0], [-0.18, -0.1, 0]])
    still = np.zeros((2, 3))
    level = np.array([[0.0, 0.0, -1.0]] * 2)
    command = np.array([[0.4, 0.0, 0.0], [-0.4, 0.0, 0.0]])
    at_touchdown = trot_joint_targets(
        gait, 0.0, locomotion.TROT_OFFSETS, hips, command, still, level, still
    )
    stand = leg_ik(np.array([0.0, 0.0, -gait.stance_height]), gait.thigh, gait.shank)
    front_left_hip = at_touchdown[:, 1]
    assert front_left_hip[0] < stand[1] < front_left_hip[1]

"""reach-v0 on MuJoCo: move the end effector of a 7-DOF arm to a randomized target point.

Model: ``sim_scenes/reach/arm7.xml``: position-servoed joints, gravity compensated by the
robot's controller. The compensation always uses the nominal link masses, so randomized heavier
links sag until the servos (and the policy) push back. Physics runs at 500 Hz; one control step
holds the servo targets for 20 physics steps, so the policy runs at 25 Hz.

Action (7, normalized to [-1, 1]): change of each joint's servo target, 1.0 = 0.1 rad per
control step. Targets accumulate from the previous step's targets and stay inside the joint
ranges; an action of zero holds the arm where it was commanded.

Observation (23, float32): joint positions (7, rad), joint velocities (7, rad/s), end-effector
position (3, m), target position (3, m), target minus end effector (3, m); all in the world
frame, with the scene's Gaussian noise added.

Reward: minus the end-effector-to-target distance (m), every step. Success: that distance is
below 0.03 m at the current state.
"""

from __future__ import annotations

import copy
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

import mujoco
import numpy as np

if TYPE_CHECKING:
    from stages.sim.scene import Scene

ARM7_XML = Path(__file__).resolve().parents[2] / "sim_scenes" / "reach" / "arm7.xml"
"""The MJCF model of the arm, the target marker, the floor and the overview camera."""

TASK_NAME = "reach-v0"
"""Registered id of this task."""

NUM_JOINTS = 7
"""Actuated joints of the arm (count)."""

FRAME_SKIP = 20
"""Physics steps (count) per control step."""

CONTROL_HZ = 25.0
"""Control rate (Hz): 1 / (timestep 0.002 s * FRAME_SKIP)."""

ACTION_SCALE = 0.1
"""Servo-target change (rad) per control step for an action of 1.0."""

SUCCESS_DISTANCE = 0.03
"""Success tolerance (m) on the end-effector-to-target distance."""

SUCCESS_TOLERANCE = "end effector within 0.03 m (Euclidean) of the target at the current state"
"""The success predicate in words."""

WORKSPACE_LOW = (0.2, -0.5, 0.08)
"""Lower corner (m) of the box in which the expert reaches every point."""

WORKSPACE_HIGH = (0.65, 0.5, 0.65)
"""Upper corner (m) of the box in which the expert reaches every point."""

HOME_NOISE = 0.1
"""Half-width (rad) of the uniform noise added to every joint of the home pose at reset."""

EXPERT_GAIN = 0.2
"""Fraction (per control step) of the end-effector error the expert asks to close."""

EXPERT_DAMPING = 0.05
"""Damping (m) of the expert's damped-least-squares inverse kinematics."""

EXPERT_NULL_GAIN = 0.1
"""Fraction (per control step) of the distance to the home pose the expert closes in the
null space of the end-effector task."""

_JOINTS = tuple(f"joint{i}" for i in range(1, NUM_JOINTS + 1))

OBS_NAMES: tuple[str, ...] = (
    *(f"{j}.pos" for j in _JOINTS),
    *(f"{j}.vel" for j in _JOINTS),
    "ee.x",
    "ee.y",
    "ee.z",
    "target.x",
    "target.y",
    "target.z",
    "target_minus_ee.x",
    "target_minus_ee.y",
    "target_minus_ee.z",
)
"""Name of every observation entry, in order."""

OBS_UNITS: tuple[str, ...] = ("rad",) * NUM_JOINTS + ("rad/s",) * NUM_JOINTS + ("m",) * 9
"""Unit of every observation entry, in order."""

ACTION_NAMES: tuple[str, ...] = tuple(f"{j}.target_delta" for j in _JOINTS)
"""Name of every action entry, in order."""

ACTION_UNITS: tuple[str, ...] = (f"{ACTION_SCALE} rad",) * NUM_JOINTS
"""What an action of 1.0 means for every action entry."""


class ReachEnv:
    """N worlds of reach-v0, each with its own ``MjData`` (and ``MjModel`` when randomized).

    Randomization (masses, damping, friction, actuator gains, target, initial pose) is drawn
    per world at every :meth:`reset` from ``np.random.default_rng(seed)``, so the same scene,
    world count and seed give identical observations.
    """

    def __init__(self, scene: Scene, num_worlds: int, seed: int) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next."""
        if scene.config.task != TASK_NAME:
            raise ValueError(
                f"{TASK_NAME} cannot run scene {scene.path} of task {scene.config.task!r}"
            )
        if num_worlds < 1:
            raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
        self._rand = scene.config.randomization
        self._num_worlds = num_worlds
        self._episode_steps = scene.config.episode_steps
        self._rng = np.random.default_rng(seed)

        model = mujoco.MjModel.from_xml_path(str(ARM7_XML))
        if model.nq != NUM_JOINTS or model.nv != NUM_JOINTS or model.nu != NUM_JOINTS:
            raise ValueError(f"{ARM7_XML}: expected {NUM_JOINTS} joints and actuators")
        if abs(model.opt.timestep * FRAME_SKIP * CONTROL_HZ - 1.0) > 1e-9:
            raise ValueError(f"{ARM7_XML}: timestep {model.opt.timestep} s != 1 / (25 Hz * 20)")
        self._nominal = model
        self._ee = model.site("ee").id
        self._mocap = int(model.body_mocapid[model.body("target").id])
        self._links = np.flatnonzero(model.body_dofnum > 0)
        self._home = model.key("home").qpos.copy()
        self._joint_low = model.jnt_range[:, 0].copy()
        self._joint_high = model.jnt_range[:, 1].copy()
        self._ctrl_low = model.actuator_ctrlrange[:, 0].copy()
        self._ctrl_high = model.actuator_ctrlrange[:, 1].copy()

        rand = self._rand
        self._randomizes_model = any(
            scale != (1.0, 1.0)
            for scale in (rand.mass_scale, rand.damping_scale, rand.friction_scale, rand.gain_scale)
        )
        self._models = [
            copy.copy(model) if self._randomizes_model else model for _ in range(num_worlds)
        ]
        self._datas = [mujoco.MjData(m) for m in self._models]

        self._qpos = np.zeros((num_worlds, NUM_JOINTS))
        self._qvel = np.zeros((num_worlds, NUM_JOINTS))
        self._ee_pos = np.zeros((num_worlds, 3))
        self._target = np.zeros((num_worlds, 3))
        self._ctrl = np.zeros((num_worlds, NUM_JOINTS))
        self._jac = np.zeros((num_worlds, 3, NUM_JOINTS))
        self._pending: deque[np.ndarray] = deque()
        self._steps_done = -1

    @property
    def num_worlds(self) -> int:
        """Number of worlds N stepped together."""
        return self._num_worlds

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector (23)."""
        return len(OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector (7)."""
        return NUM_JOINTS

    @property
    def episode_steps(self) -> int:
        """Control steps in every episode."""
        return self._episode_steps

    def reset(self) -> np.ndarray:
        """Draw randomization, target and initial pose per world and start a new episode.

        Returns:
            Observations. Shape: (num_worlds, 23), float32.
        """
        n, rand, rng = self._num_worlds, self._rand, self._rng
        self._target = rng.uniform(rand.target_low, rand.target_high, size=(n, 3))
        noise = rng.uniform(-HOME_NOISE, HOME_NOISE, size=(n, NUM_JOINTS))
        qpos0 = np.clip(self._home + noise, self._joint_low, self._joint_high)
        if self._randomizes_model:
            self._randomize_models()
        for i, (m, d) in enumerate(zip(self._models, self._datas, strict=True)):
            mujoco.mj_resetData(m, d)
            d.qpos[:] = qpos0[i]
            d.ctrl[:] = qpos0[i]
            d.mocap_pos[self._mocap] = self._target[i]
            mujoco.mj_forward(m, d)
        self._ctrl = qpos0.copy()
        self._pending = deque(
            np.zeros((n, NUM_JOINTS)) for _ in range(self._rand.action_delay_steps)
        )
        self._steps_done = 0
        self._read_state()
        return self._observe()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply one control step (20 physics steps) in every world.

        Args:
            actions: Normalized servo-target changes, clipped to [-1, 1].
                Shape: (num_worlds, 7).

        Returns:
            ``(obs, reward, done)``: shape (num_worlds, 23) float32, (num_worlds,) float32
            (minus the end-effector-to-target distance, m) and (num_worlds,) bool.
        """
        self._require_episode()
        if self._steps_done >= self._episode_steps:
            raise RuntimeError("the episode is over; call reset() first")
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape != (self._num_worlds, NUM_JOINTS):
            raise ValueError(
                f"actions must have shape ({self._num_worlds}, {NUM_JOINTS}), got {actions.shape}"
            )
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or infinity")
        applied = np.clip(actions, -1.0, 1.0)
        if self._pending:
            self._pending.append(applied)
            applied = self._pending.popleft()
        self._ctrl = np.clip(self._ctrl + ACTION_SCALE * applied, self._ctrl_low, self._ctrl_high)
        for i, (m, d) in enumerate(zip(self._models, self._datas, strict=True)):
            d.ctrl[:] = self._ctrl[i]
            mujoco.mj_step(m, d, FRAME_SKIP)
            mujoco.mj_kinematics(m, d)
        self._steps_done += 1
        self._read_state()
        reward = -self._distance().astype(np.float32)
        done = np.full(self._num_worlds, self._steps_done >= self._episode_steps)
        return self._observe(), reward, done

    def success(self) -> np.ndarray:
        """Whether each end effector is within 0.03 m of its target. Shape: (num_worlds,), bool."""
        self._require_episode()
        return self._distance() < SUCCESS_DISTANCE

    def expert_action(self) -> np.ndarray:
        """Damped-least-squares inverse kinematics toward the true target.

        The expert asks for ``dq = J^T (J J^T + d^2 I)^-1 (g e) + (I - J# J) (h (q_home - q))``
        with ``e`` the true end-effector error (m), ``J`` the end-effector position Jacobian
        (3 x 7), ``g`` = EXPERT_GAIN, ``d`` = EXPERT_DAMPING, ``h`` = EXPERT_NULL_GAIN, then
        divides by ACTION_SCALE and shrinks the whole vector until it lies in [-1, 1].

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, 7), float32.
        """
        self._require_episode()
        for i, (m, d) in enumerate(zip(self._models, self._datas, strict=True)):
            mujoco.mj_comPos(m, d)
            mujoco.mj_jacSite(m, d, self._jac[i], None, self._ee)
        jac = self._jac
        jac_t = jac.transpose(0, 2, 1)
        gram = jac @ jac_t + EXPERT_DAMPING**2 * np.eye(3)
        pinv = jac_t @ np.linalg.inv(gram)
        error = EXPERT_GAIN * (self._target - self._ee_pos)
        dq = (pinv @ error[:, :, None])[:, :, 0]
        null = np.eye(NUM_JOINTS) - pinv @ jac
        pull = EXPERT_NULL_GAIN * (self._home - self._qpos)
        dq += (null @ pull[:, :, None])[:, :, 0]
        action = dq / ACTION_SCALE
        action /= np.maximum(1.0, np.abs(action).max(axis=1, keepdims=True))
        return action.astype(np.float32)

    def _require_episode(self) -> None:
        """Fail unless reset() has started an episode."""
        if self._steps_done < 0:
            raise RuntimeError("no episode has started; call reset() first")

    def _randomize_models(self) -> None:
        """Draw per-world scale factors and write them into each world's model copy."""
        n, rand, rng, base = self._num_worlds, self._rand, self._rng, self._nominal
        links = self._links
        mass = rng.uniform(*rand.mass_scale, size=(n, links.size))
        damping = rng.uniform(*rand.damping_scale, size=(n, NUM_JOINTS))
        friction = rng.uniform(*rand.friction_scale, size=(n, NUM_JOINTS))
        gain = rng.uniform(*rand.gain_scale, size=(n, NUM_JOINTS))
        kp = base.actuator_gainprm[:, 0]
        for i, (m, d) in enumerate(zip(self._models, self._datas, strict=True)):
            m.body_mass[links] = base.body_mass[links] * mass[i]
            m.body_inertia[links] = base.body_inertia[links] * mass[i][:, None]
            m.body_gravcomp[links] = base.body_gravcomp[links] / mass[i]
            m.dof_damping[:] = base.dof_damping * damping[i]
            m.dof_frictionloss[:] = base.dof_frictionloss * friction[i]
            m.actuator_gainprm[:, 0] = kp * gain[i]
            m.actuator_biasprm[:, 1] = -kp * gain[i]
            mujoco.mj_setConst(m, d)

    def _read_state(self) -> None:
        """Copy joint state and end-effector position out of every world."""
        for i, d in enumerate(self._datas):
            self._qpos[i] = d.qpos
            self._qvel[i] = d.qvel
            self._ee_pos[i] = d.site_xpos[self._ee]

    def _distance(self) -> np.ndarray:
        """End-effector-to-target distance (m). Shape: (num_worlds,)."""
        return np.linalg.norm(self._target - self._ee_pos, axis=1)

    def _observe(self) -> np.ndarray:
        """The observation of every world, noise included. Shape: (num_worlds, 23), float32."""
        obs = np.concatenate(
            [self._qpos, self._qvel, self._ee_pos, self._target, self._target - self._ee_pos],
            axis=1,
        )
        if self._rand.obs_noise_std > 0.0:
            obs += self._rng.normal(0.0, self._rand.obs_noise_std, size=obs.shape)
        return obs.astype(np.float32)

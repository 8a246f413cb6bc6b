"""locomotion-v0 on MuJoCo: a quadruped tracks a commanded base velocity.

Model: ``sim_scenes/locomotion/quadruped.xml``: a 10.2 kg torso-and-four-legs robot, three
position-servoed hinges per leg (abduction, hip, knee), feet with friction on a flat floor, and
a camera ``track`` that follows the torso. Physics runs at 200 Hz; one control step holds the
servo targets for 4 physics steps, so the policy runs at 50 Hz. A scene's payload is added to
the torso.

Command: forward speed vx (m/s), lateral speed vy (m/s) and yaw rate (rad/s), drawn once per
episode from the scene's target box and held for the whole episode.

Action (12, normalized to [-1, 1]): servo target of each joint as an offset from the standing
pose, 1.0 = 0.4 rad (abduction) or 0.8 rad (hip, knee).

Observation (50, float32): torso linear velocity (3, m/s) and angular velocity (3, rad/s) in
the torso frame, gravity direction in the torso frame (3, unit vector), the command (3), joint
positions (12, rad), joint velocities (12, rad/s), the previous action (12, normalized) and a
gait clock (sin and cos of 2 pi t / 0.3 s, t the time since the robot was placed); with the
scene's Gaussian noise added. The clock gives a learned policy a rhythm to step to: without
it, PPO's deterministic policy tends to stand still where its noisy version walked.

Reward per control step: ``exp(-|v_xy - c_xy|^2 / 0.1) + 0.5 exp(-(w_z - c_w)^2 / 0.1)
+ 0.3 G - 0.01 |a - a_prev|^2 - 0.0005 P - 10 [fell this step]``, with torso velocities in the
torso frame, P the mechanical power of the actuators (W, summed absolute) and G the trot
rhythm: the mean over legs of how far each foot is lifted (its lowest point's height over 4 cm,
clipped to [0, 1]) while the gait clock has the leg in swing, or of 1 minus that in stance,
with diagonal legs in step (the phases of the scripted trot). The rhythm term rewards stepping
in time with the observed clock rather than shuffling on exploration noise.

Fall: the torso centre below 0.15 m, or the torso tilted more than 60 degrees from upright, at
any control step. Success: no fall in the whole episode, and over the second half of the
episode the mean absolute error between the forward speed (the torso's displacement over each
control step in its heading frame, divided by the step's duration) and the commanded vx is
below 0.15 m/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.sim.env.batched import RobotEpisodes
from stages.sim.env.bodies import BodyLayout, mujoco_layout
from stages.sim.env.mujoco_env import MujocoBatchedEnv
from stages.sim.tasks.gait import TrotGait, trot_joint_targets

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

QUADRUPED_XML = Path(__file__).resolve().parents[3] / "sim_scenes" / "locomotion" / "quadruped.xml"
"""The MJCF model of the quadruped, the floor and the tracking camera."""

TASK_NAME = "locomotion-v0"
"""Registered id of this task."""

LEGS = ("FL", "FR", "RL", "RR")
"""Legs in order: front left, front right, rear left, rear right."""

LEG_JOINTS = ("abduction", "hip", "knee")
"""Joints of one leg, from the torso outwards."""

JOINTS = tuple(f"{leg}_{joint}" for leg in LEGS for joint in LEG_JOINTS)
"""Actuated joints in order, as named in the model."""

NUM_JOINTS = len(JOINTS)
"""Actuated joints (count)."""

FRAME_SKIP = 4
"""Physics steps (count) per control step."""

CONTROL_HZ = 50.0
"""Control rate (Hz): 1 / (timestep 0.005 s * FRAME_SKIP)."""

ACTION_SCALE = np.tile([0.4, 0.8, 0.8], len(LEGS))
"""Servo-target offset (rad) from the standing pose for an action of 1.0, per joint."""

INIT_JOINT_NOISE = 0.05
"""Half-width (rad) of the uniform noise added to every joint of the standing pose at reset."""

FALL_HEIGHT = 0.15
"""Torso-centre height (m) below which the robot has fallen."""

FALL_TILT_COS = 0.5
"""Cosine of the largest torso tilt from upright (60 degrees) before the robot has fallen."""

SUCCESS_SPEED_ERROR = 0.15
"""Success tolerance (m/s) on the mean absolute forward-speed error over the episode's second
half."""

SUCCESS_TOLERANCE = (
    "no fall (torso centre above 0.15 m and tilt below 60 degrees at every control step) and "
    "mean |forward speed - commanded vx| below 0.15 m/s over the second half of the episode"
)
"""The success predicate in words."""

TRACKING_SIGMA2 = 0.1
"""Squared width ((m/s)^2 or (rad/s)^2) of the exponential velocity-tracking rewards: narrow
enough that standing still earns little when a walk is commanded."""

YAW_WEIGHT = 0.5
"""Weight of the yaw-rate tracking reward."""

ACTION_RATE_WEIGHT = 0.01
"""Penalty per squared change of the normalized action between control steps."""

POWER_WEIGHT = 0.0005
"""Penalty per watt of summed absolute actuator power."""

GAIT_WEIGHT = 0.3
"""Weight of the trot-rhythm reward."""

FOOT_CLEARANCE = 0.04
"""Foot lift (m, lowest point over the floor) that counts as fully lifted."""

FOOT_RADIUS = 0.025
"""Radius (m) of the spherical feet."""

FALL_PENALTY = 10.0
"""Penalty on the control step the robot falls."""

TARGET_NAMES = ("vx", "vy", "yaw_rate")
"""What each axis of a scene's target box is: the velocity command, torso frame."""

TARGET_UNITS = ("m/s", "m/s", "rad/s")
"""Unit of each axis of a scene's target box."""

WORKSPACE_LOW = (-0.2, -0.2, -0.5)
"""Lowest command the scripted gait is meant to follow."""

WORKSPACE_HIGH = (0.6, 0.2, 0.5)
"""Highest command the scripted gait is meant to follow."""

GAIT = TrotGait(
    period=0.3,
    duty=0.5,
    stance_height=0.29,
    lift=0.06,
    thigh=0.2,
    shank=0.2,
    velocity_gain=0.75,
    placement_gain=0.1,
    plumb_gain=0.5,
    max_stride=0.16,
)
"""The scripted expert's trot."""

TROT_OFFSETS = np.array([0.0, 0.5, 0.5, 0.0])
"""Gait phase offset of each leg: diagonal pairs (FL, RR) and (FR, RL) move together."""

OBS_NAMES: tuple[str, ...] = (
    "base_lin_vel.x",
    "base_lin_vel.y",
    "base_lin_vel.z",
    "base_ang_vel.x",
    "base_ang_vel.y",
    "base_ang_vel.z",
    "projected_gravity.x",
    "projected_gravity.y",
    "projected_gravity.z",
    "command.vx",
    "command.vy",
    "command.yaw_rate",
    *(f"{j}.pos" for j in JOINTS),
    *(f"{j}.vel" for j in JOINTS),
    *(f"{j}.last_action" for j in JOINTS),
    "gait_clock.sin",
    "gait_clock.cos",
)
"""Name of every observation entry, in order."""

OBS_UNITS: tuple[str, ...] = (
    ("m/s",) * 3
    + ("rad/s",) * 3
    + ("1",) * 3
    + ("m/s", "m/s", "rad/s")
    + ("rad",) * NUM_JOINTS
    + ("rad/s",) * NUM_JOINTS
    + ("1",) * NUM_JOINTS
    + ("1", "1")
)
"""Unit of every observation entry, in order ("1": dimensionless)."""

ACTION_NAMES: tuple[str, ...] = tuple(f"{j}.target_offset" for j in JOINTS)
"""Name of every action entry, in order."""

ACTION_UNITS: tuple[str, ...] = tuple(f"{scale:g} rad" for scale in ACTION_SCALE)
"""What an action of 1.0 means for every action entry."""


def rotation_matrices(quat: np.ndarray) -> np.ndarray:
    """Rotation matrices of unit quaternions (w, x, y, z).

    Args:
        quat: Quaternions. Shape: (N, 4).

    Returns:
        Matrices R with world = R @ body. Shape: (N, 3, 3).
    """
    w, x, y, z = quat.T
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        axis=1,
    )


@dataclass(frozen=True)
class QuadrupedState:
    """What locomotion-v0 reads of the simulator after every step, per world (SI units).

    A backend fills it (:meth:`LocomotionTask._read_quadruped`); the task's observation,
    reward, fall rule, success and expert are functions of it and of the task's own record.
    """

    base_pos: np.ndarray
    """Torso centre (m) in the world's own frame. Shape: (N, 3)."""
    rot: np.ndarray
    """Torso orientation: matrices R with world = R @ torso. Shape: (N, 3, 3)."""
    lin_vel: np.ndarray
    """Torso linear velocity (m/s) in the torso frame. Shape: (N, 3)."""
    ang_vel: np.ndarray
    """Torso angular velocity (rad/s) in the torso frame. Shape: (N, 3)."""
    joint_pos: np.ndarray
    """Joint positions (rad), :data:`JOINTS` order. Shape: (N, 12)."""
    joint_vel: np.ndarray
    """Joint velocities (rad/s), :data:`JOINTS` order. Shape: (N, 12)."""
    joint_torque: np.ndarray
    """Actuator torques (N m) of the step just taken, :data:`JOINTS` order. Shape: (N, 12)."""
    foot_height: np.ndarray
    """Height (m) of each foot's centre over the floor, :data:`LEGS` order. Shape: (N, 4)."""


class QuadrupedParams:
    """The quadruped's nominal parameters as its MJCF compiles them (SI units): what the task
    and every backend read of the model."""

    def __init__(self, model: Any) -> None:
        """Read ``model`` (``quadruped.xml`` compiled), refusing one whose base is not free or
        whose actuators are not :data:`JOINTS`, in order."""
        names = tuple(model.actuator(i).name for i in range(model.nu))
        if names != JOINTS or model.nq != 7 + NUM_JOINTS or model.nv != 6 + NUM_JOINTS:
            raise ValueError(f"{QUADRUPED_XML}: expected a free base and actuators {JOINTS}")
        joints = [model.joint(name).id for name in JOINTS]
        dofs = model.jnt_dofadr[joints]
        self.kp = model.actuator_gainprm[:, 0].copy()
        self.kv = -model.actuator_biasprm[:, 2].copy()
        self.force_limit = model.actuator_forcerange[:, 1].copy()
        self.ctrl_low = model.actuator_ctrlrange[:, 0].copy()
        self.ctrl_high = model.actuator_ctrlrange[:, 1].copy()
        self.armature = model.dof_armature[dofs].copy()
        self.damping = model.dof_damping[dofs].copy()
        self.frictionloss = model.dof_frictionloss[dofs].copy()
        stand = model.key("stand")
        self.stand_qpos = stand.qpos.copy()
        self.default = stand.ctrl.copy()
        self.hips = np.array([model.body(f"{leg}_hip").pos for leg in LEGS])
        self.body_names = tuple(model.body(b).name for b in range(1, model.nbody))
        self.body_mass = model.body_mass[1:].copy()
        self.links = np.flatnonzero(model.body_dofnum[1:] > 0)
        """Bodies (index into body_names) whose mass the scene's mass scale draws, in order."""
        self.torso = self.body_names.index("torso")
        self.shanks = np.array([self.body_names.index(f"{leg}_shank") for leg in LEGS])
        self.foot_offset = np.array(
            [model.geom_pos[model.geom(f"{leg}_foot").id] for leg in LEGS]
        )
        self.num_dofs = model.nv
        self.layout: BodyLayout = mujoco_layout(model)
        """The MJCF's bodies and shapes."""


class LocomotionTask(RobotEpisodes):
    """locomotion-v0 on any backend: command draws, action semantics, observation, reward,
    fall rule, success and the scripted trot, as functions of a :class:`QuadrupedState`.

    A backend's environment derives from this and from its own episode backend, sets
    ``self._p`` (:class:`QuadrupedParams`), calls :meth:`_start_task` and defines
    :meth:`_place`, :meth:`_send_servo_targets` and :meth:`_read_quadruped`.
    """

    _p: QuadrupedParams
    _state: QuadrupedState

    def _start_task(self) -> None:
        """Zero the task's record of every world."""
        n = self._num_worlds
        self._command = np.zeros((n, 3))
        self._last_action = np.zeros((n, NUM_JOINTS))
        self._prev_action = np.zeros((n, NUM_JOINTS))
        self._prev_xy = np.zeros((n, 2))
        self._fallen = np.zeros(n, dtype=bool)
        self._fell_now = np.zeros(n, dtype=bool)
        self._speed_error_sum = np.zeros(n)
        self._speed_samples = 0
        self._clock = np.zeros(n)

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector (50)."""
        return len(OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector (12)."""
        return NUM_JOINTS

    @property
    def command(self) -> np.ndarray:
        """This episode's command: vx (m/s), vy (m/s), yaw rate (rad/s). Shape: (N, 3)."""
        return self._command.copy()

    def success(self) -> np.ndarray:
        """No fall so far, and the mean absolute forward-speed error over the second half of
        the episode so far is below 0.15 m/s (False until the second half has begun).

        Returns:
            Shape: (num_worlds,), bool.
        """
        return ~self._fallen & (self.forward_speed_error() < SUCCESS_SPEED_ERROR)

    def forward_speed_error(self) -> np.ndarray:
        """Mean absolute forward-speed error (m/s) over the second half so far; NaN before.

        Returns:
            Shape: (num_worlds,), float64.
        """
        self._require_episode()
        if self._speed_samples == 0:
            return np.full(self._num_worlds, np.nan)
        return self._speed_error_sum / self._speed_samples

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """The mean absolute forward-speed error over the second half (m/s; NaN before it).
        Shape: (num_worlds,)."""
        return self.forward_speed_error(), "m/s"

    def _episode_target(self) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
        """The velocity command drawn for each world."""
        return self._command, TARGET_NAMES, TARGET_UNITS

    def _fallen_worlds(self) -> np.ndarray:
        """Robots down in this episode (restarted by ``step(..., restart_fallen=True)``)."""
        return self._fallen

    def expert_action(self) -> np.ndarray:
        """A trot from the true state (see :mod:`stages.sim.tasks.gait` and :data:`GAIT`).

        The gait clock runs from the episode's start. Stance feet sweep at the true command plus
        0.75 times the true velocity error; touchdown points move 0.1 m per m/s of velocity
        error towards the excess motion, and half-way to the plumb line under each hip when
        the torso pitches or rolls. Joint targets are turned into offsets from the standing
        pose, divided by ACTION_SCALE and clipped to [-1, 1].

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, 12), float32.
        """
        self._require_episode()
        state = self._state
        targets = trot_joint_targets(
            GAIT,
            (self._steps_done + 1) * self._control_dt,
            TROT_OFFSETS,
            self._p.hips,
            self._command,
            state.lin_vel,
            -state.rot[:, 2, :],
            state.ang_vel,
        )
        action = (targets - self._p.default) / ACTION_SCALE
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def trot_rhythm(self) -> np.ndarray:
        """How well the feet follow the gait clock's trot, in [0, 1] (see the module doc).

        Returns:
            Shape: (num_worlds,), float64.
        """
        self._require_episode()
        phases = np.mod(self._clock[:, None] / GAIT.period + TROT_OFFSETS, 1.0)
        swing = phases >= GAIT.duty
        height = self._state.foot_height - FOOT_RADIUS
        lifted = np.clip(height / FOOT_CLEARANCE, 0.0, 1.0)
        return np.asarray(np.where(swing, lifted, 1.0 - lifted).mean(axis=1))

    def _reset_worlds(self) -> None:
        """Draw commands and a standing pose with noisy joints at the origin of every world."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        self._start_task()
        self._command = rng.uniform(rand.target_low, rand.target_high, size=(n, 3))
        noise = rng.uniform(-INIT_JOINT_NOISE, INIT_JOINT_NOISE, size=(n, NUM_JOINTS))
        xy = np.tile(self._p.stand_qpos[0:2], (n, 1))
        self._place(np.arange(n), xy, noise)
        self._prev_xy = xy

    def _respawn_worlds(self, worlds: np.ndarray) -> None:
        """A new command and a standing pose with noisy joints for ``worlds``, where they
        stand."""
        rand, rng, k = self._rand, self._rng, worlds.size
        self._command[worlds] = rng.uniform(rand.target_low, rand.target_high, size=(k, 3))
        noise = rng.uniform(-INIT_JOINT_NOISE, INIT_JOINT_NOISE, size=(k, NUM_JOINTS))
        xy = self._state.base_pos[worlds, 0:2].copy()
        self._place(worlds, xy, noise)
        self._last_action[worlds] = 0.0
        self._prev_action[worlds] = 0.0
        self._prev_xy[worlds] = xy
        self._fallen[worlds] = False
        self._fell_now[worlds] = False
        self._clock[worlds] = 0.0
        self._settle(worlds)
        self._sense()

    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Servo targets: the standing pose plus ACTION_SCALE * action, in the control range."""
        self._prev_action = self._last_action
        self._last_action = chosen
        self._prev_xy = self._state.base_pos[:, 0:2].copy()
        p = self._p
        self._send_servo_targets(
            np.clip(p.default + ACTION_SCALE * applied, p.ctrl_low, p.ctrl_high))

    def _sense(self) -> None:
        """Read the quadruped's state from the backend."""
        self._state = self._read_quadruped()

    def _after_step(self) -> None:
        """Record falls and, in the episode's second half, the forward-speed error."""
        self._clock += self._control_dt
        state = self._state
        rot = state.rot
        down = (state.base_pos[:, 2] < FALL_HEIGHT) | (rot[:, 2, 2] < FALL_TILT_COS)
        self._fell_now = down & ~self._fallen
        self._fallen |= down
        if 2 * self._steps_done > self._episode_steps:
            heading = np.arctan2(rot[:, 1, 0], rot[:, 0, 0])
            moved = state.base_pos[:, 0:2] - self._prev_xy
            speed = (moved[:, 0] * np.cos(heading) + moved[:, 1] * np.sin(heading)) / (
                self._control_dt
            )
            self._speed_error_sum += np.abs(speed - self._command[:, 0])
            self._speed_samples += 1

    def _reward(self) -> np.ndarray:
        """Velocity tracking and trot rhythm minus action-rate, power and fall penalties.
        Shape: (N,)."""
        state = self._state
        planar = np.sum((state.lin_vel[:, :2] - self._command[:, :2]) ** 2, axis=1)
        yaw = (state.ang_vel[:, 2] - self._command[:, 2]) ** 2
        power = np.abs(state.joint_torque * state.joint_vel).sum(axis=1)
        rate = np.sum((self._last_action - self._prev_action) ** 2, axis=1)
        return (
            np.exp(-planar / TRACKING_SIGMA2)
            + YAW_WEIGHT * np.exp(-yaw / TRACKING_SIGMA2)
            + GAIT_WEIGHT * self.trot_rhythm()
            - ACTION_RATE_WEIGHT * rate
            - POWER_WEIGHT * power
            - FALL_PENALTY * self._fell_now
        )

    def _clean_observation(self) -> np.ndarray:
        """Torso velocities, gravity, command, joints, last action, clock. Shape: (N, 50)."""
        state = self._state
        phase = 2.0 * np.pi * self._clock / GAIT.period
        return np.concatenate(
            [
                state.lin_vel,
                state.ang_vel,
                -state.rot[:, 2, :],
                self._command,
                state.joint_pos,
                state.joint_vel,
                self._last_action,
                np.sin(phase)[:, None],
                np.cos(phase)[:, None],
            ],
            axis=1,
        )

    def _place(self, worlds: np.ndarray, xy: np.ndarray, joint_noise: np.ndarray) -> None:
        """Backend: stand ``worlds``' robots upright at ``xy`` (m, each world's frame; shape
        (k, 2)), joints at the standing pose plus ``joint_noise`` (rad, :data:`JOINTS` order;
        shape (k, 12)), still, servos holding the standing pose."""
        raise NotImplementedError

    def _send_servo_targets(self, targets: np.ndarray) -> None:
        """Backend: set every servo's target (rad, :data:`JOINTS` order). Shape: (N, 12)."""
        raise NotImplementedError

    def _read_quadruped(self) -> QuadrupedState:
        """Backend: the quadruped's state now."""
        raise NotImplementedError


class LocomotionEnv(LocomotionTask, MujocoBatchedEnv):
    """N worlds of locomotion-v0 on MuJoCo, stepped together in C (see
    :mod:`stages.sim.env.mujoco_env`).

    Randomization (masses, payload, damping, friction, actuator gains, contact friction,
    pushes, command, initial pose) is drawn per world at every :meth:`reset` from
    ``np.random.default_rng(seed)``, so the same scene, world count and seed give identical
    observations.
    """

    def __init__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next.

        ``num_threads`` C threads step the worlds (default: every CPU).
        """
        import mujoco

        MujocoBatchedEnv.__init__(
            self,
            scene,
            num_worlds,
            seed,
            task_name=TASK_NAME,
            model_path=QUADRUPED_XML,
            frame_skip=FRAME_SKIP,
            control_hz=CONTROL_HZ,
            payload_body="torso",
            step_stage=mujoco.mjtStage.mjSTAGE_POS,
            num_threads=num_threads,
        )
        self._p = QuadrupedParams(self._model)
        self._actuator_force = self._batch.bind("actuator_force")
        self._geom_xpos = self._batch.bind("geom_xpos")
        self._feet = np.array([self._model.geom(f"{leg}_foot").id for leg in LEGS])
        self._start_task()
        self._sense()

    def _place(self, worlds: np.ndarray, xy: np.ndarray, joint_noise: np.ndarray) -> None:
        """Write the standing pose plus ``joint_noise`` at ``xy`` into ``worlds``, still."""
        qpos = np.tile(self._p.stand_qpos, (worlds.size, 1))
        qpos[:, 0:2] = xy
        qpos[:, 7:] += joint_noise
        self._qpos[worlds] = qpos
        self._qvel[worlds] = 0.0
        self._ctrl[worlds] = self._p.default

    def _send_servo_targets(self, targets: np.ndarray) -> None:
        """Write the servo targets into the batch's controls."""
        self._ctrl[:] = targets

    def _read_quadruped(self) -> QuadrupedState:
        """The torso's pose and velocities (torso frame), joints, torques and feet."""
        qpos, qvel = np.array(self._qpos), np.array(self._qvel)
        rot = rotation_matrices(qpos[:, 3:7])
        return QuadrupedState(
            base_pos=qpos[:, 0:3],
            rot=rot,
            lin_vel=np.einsum("nji,nj->ni", rot, qvel[:, 0:3]),
            ang_vel=qvel[:, 3:6],
            joint_pos=qpos[:, 7:],
            joint_vel=qvel[:, 6:],
            joint_torque=np.array(self._actuator_force),
            foot_height=np.array(self._geom_xpos[:, self._feet, 2]),
        )

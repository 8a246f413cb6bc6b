"""Manipulation with a parallel-jaw gripper on MuJoCo: lift-v0 and pick-place-v0, written once.

Model: ``sim_scenes/pick_place/arm7_gripper.xml``: reach-v0's 7-DOF arm with two fingers on
slides, a table, a cube (the object, on a free joint) and a bin; cameras ``front`` (fixed, facing
the arm across the table) and ``wrist`` (on the hand, looking down between the fingers). Physics
runs at 500 Hz; one control step holds the servo targets for 20 physics steps (25 Hz).

Action (8, normalized to [-1, 1]): the change of each arm joint's servo target, 1.0 = 0.1 rad
per control step (reach-v0's), then the gripper: an absolute opening command, -1 closed, +1 open
(:data:`MAX_OPENING` m between the fingers), held by the fingers' servo up to the gripper's
force limit.

Observation (float64 before noise, SI units, world frame): joint positions (7, rad), joint
velocities (7, rad/s), the gripper's opening (m), end effector (3, m), the object's position
(3, m) and orientation (a unit quaternion w, x, y, z), the goal (3, m), the object minus the
end effector (3, m) and the goal minus the object (3, m). A task that sees (pick-place-vision-v0)
observes only the first 18 (the robot's own state) and its two cameras.

Goal: lift-v0's is the point :data:`LIFT_HEIGHT` above where the object started; pick-place-v0's
is the bin's place target. Success (at the current state): lift-v0, the object's centre at least
:data:`LIFT_HEIGHT` above its start and between the fingers; pick-place-v0, the object inside the
bin's walls and below its rim. The scene's target box is where the object starts (x, y on the
table); its manipulation fields draw the object's mass, size, friction and yaw, the gripper's
force and the table's friction (:class:`~stages.sim.scenes.scene.RandomizationConfig`).

Every failed episode says why (:meth:`ManipulationEnv.episode_failures`), from what the object
did during it: ``dropped`` (it slid out of the closed fingers, or was let go of away from the
goal), ``placed_wrong`` (pick-place-v0: let go of near the bin, it did not land inside),
``knocked_off`` (it left the table without being held), ``timed_out`` (the fingers still on it
when the episode ended, short of the goal) and ``missed_grasp`` (the fingers never closed on
it). The scripted expert (:meth:`ManipulationEnv.expert_action`)
approaches above the object, descends, closes, lifts, carries and releases, each phase decided
from the true state at every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stages.sim.env.cameras import CameraSpec
from stages.sim.env.capabilities import EnvCapabilities
from stages.sim.env.mujoco_env import MujocoBatchedEnv
from stages.sim.tasks.grasp import ExpertGains, clipped_rows, face_yaw, wrap_angle
from stages.sim.tasks.reach_arm import dls_joint_step

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

GRIPPER_XML = (Path(__file__).resolve().parents[3] / "sim_scenes" / "pick_place"
               / "arm7_gripper.xml")
"""The MJCF model: the arm and its gripper, the table, the object, the bin and the cameras."""

NUM_JOINTS = 7
"""Arm joints (count); the gripper is one more action."""

FRAME_SKIP = 20
"""Physics steps (count) per control step."""

CONTROL_HZ = 25.0
"""Control rate (Hz): 1 / (timestep 0.002 s * FRAME_SKIP)."""

ACTION_SCALE = 0.1
"""Servo-target change (rad) per control step for an arm action of 1.0."""

MAX_OPENING = 0.08
"""Distance (m) between the fingers at a gripper action of +1."""

LIFT_HEIGHT = 0.1
"""How far (m) lift-v0's object must rise above where it started."""

HELD_DISTANCE = 0.03
"""Largest distance (m) from the end effector to the object's centre at which it counts as
between the fingers."""

OFF_TABLE_DROP = 0.05
"""How far (m) below the table's top the object's centre must fall to count as off the table."""

SLID = 0.012
"""How far (m) the object's centre may sink below the grasp point between closed fingers
before it counts as sliding out of them."""

PLACE_NEAR = 0.15
"""Largest horizontal distance (m) from the place target at which letting go of the object
counts as placing it (wrong, if it does not land in the bin); farther, it is dropped."""

HOME_NOISE = 0.05
"""Half-width (rad) of the uniform noise added to every arm joint of the home pose at reset."""

TARGET_NAMES = ("object_x", "object_y")
"""What each axis of a scene's target box is: where the object starts on the table."""

TARGET_UNITS = ("m", "m")
"""Unit of each axis of a scene's target box."""

_JOINTS = tuple(f"joint{i}" for i in range(1, NUM_JOINTS + 1))

STATE_NAMES: tuple[str, ...] = (
    *(f"{j}.pos" for j in _JOINTS), *(f"{j}.vel" for j in _JOINTS), "gripper.opening",
    "ee.x", "ee.y", "ee.z")
"""The robot's own state: what every manipulation task observes, a seeing one only this."""

STATE_UNITS: tuple[str, ...] = ("rad",) * NUM_JOINTS + ("rad/s",) * NUM_JOINTS + ("m",) * 4
"""Unit of every entry of the robot's own state."""

OBS_NAMES: tuple[str, ...] = (
    *STATE_NAMES, "object.x", "object.y", "object.z", "object.qw", "object.qx", "object.qy",
    "object.qz", "goal.x", "goal.y", "goal.z", "object_minus_ee.x", "object_minus_ee.y",
    "object_minus_ee.z", "goal_minus_object.x", "goal_minus_object.y", "goal_minus_object.z")
"""Name of every observation entry of a state task, in order."""

OBS_UNITS: tuple[str, ...] = (*STATE_UNITS, "m", "m", "m", "", "", "", "", *("m",) * 9)
"""Unit of every observation entry of a state task, in order."""

ACTION_NAMES: tuple[str, ...] = (*(f"{j}.target_delta" for j in _JOINTS), "gripper.opening")
"""Name of every action entry, in order."""

ACTION_UNITS: tuple[str, ...] = (
    *(f"{ACTION_SCALE} rad",) * NUM_JOINTS,
    f"opening command: -1 closed, +1 open ({MAX_OPENING} m)")
"""What an action of 1.0 means for every action entry."""

FAILURE_MODES = ("missed_grasp", "dropped", "knocked_off", "placed_wrong", "timed_out")
"""Why a manipulation episode fails, in the words its episode table and report use."""


@dataclass(frozen=True)
class Gripper:
    """The names of a manipulation model's parts and the task's goal (the expert's gains are
    :class:`~stages.sim.tasks.grasp.ExpertGains`)."""

    goal: str
    """``lift`` (raise the object :data:`LIFT_HEIGHT`) or ``place`` (put it in the bin)."""
    joints: tuple[str, ...] = _JOINTS
    """Arm joints (hinges), in observation and action order, each driven by the position
    servo of the same name."""
    gripper_actuator: str = "gripper"
    """Position servo of the fingers' opening (m between the fingers)."""
    fingers: tuple[str, str] = ("finger_left", "finger_right")
    """The fingers' slide joints; each opens by half the opening."""
    end_effector_site: str = "ee"
    """Site between the fingertips: the grasp point."""
    object_body: str = "object"
    """The object's body (a free joint); its geom has the same name."""
    table_geom: str = "table"
    """The table's top."""
    place_site: str = "place_target"
    """Where pick-place-v0 puts the object (inside the bin)."""
    bin_inner_half: tuple[float, float] = (0.075, 0.075)
    """Half the bin's inner width (m) along x and y, around the place target."""
    bin_rim_height: float = 0.07
    """Height (m) of the bin's walls above the table."""


class ManipulationEnv(MujocoBatchedEnv):
    """N worlds of a manipulation task (module doc) on MuJoCo, stepped together in C.

    Randomization is drawn per world at every :meth:`reset` from ``default_rng(seed)``: the
    model's (masses, damping, friction, gains, contact friction), then the object's mass, size
    and friction, the gripper's force and the table's friction, then the object's start (the
    target box) and yaw and the arm's pose; the same scene, world count and seed give the same
    episodes.
    """

    def __init__(self, scene: Scene, num_worlds: int, seed: int, *, task_name: str,
                 gripper: Gripper, model_path: Path = GRIPPER_XML, sees: bool = False,
                 cameras: tuple[CameraSpec, ...] = (), expert: ExpertGains | None = None,
                 num_threads: int | None = None) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next.

        Args:
            scene: A scene of task ``task_name``.
            num_worlds: Worlds N stepped together (>= 1).
            seed: Seed of every random draw.
            task_name: The task id.
            gripper: The model's names and the goal.
            model_path: The MJCF file.
            sees: Whether the policy observes only the robot's own state (and its cameras).
            cameras: The task's cameras.
            expert: The scripted expert's gains; None: :class:`ExpertGains`' defaults.
            num_threads: C threads stepping the worlds; None: every CPU.
        """
        import mujoco

        super().__init__(scene, num_worlds, seed, task_name=task_name, model_path=model_path,
                         frame_skip=FRAME_SKIP, control_hz=CONTROL_HZ, payload_body="link7",
                         step_stage=mujoco.mjtStage.mjSTAGE_POS, num_threads=num_threads,
                         cameras=cameras)
        model = self._model
        self._gripper = gripper
        self._gains = expert or ExpertGains()
        self._sees = sees
        # -- the model's parts, by name
        joints = [model.joint(j).id for j in gripper.joints]
        self._qpos_idx = model.jnt_qposadr[joints].copy()
        self._dof_idx = model.jnt_dofadr[joints].copy()
        self._arm_act = np.array([model.actuator(j).id for j in gripper.joints])
        self._grip_act = model.actuator(gripper.gripper_actuator).id
        fingers = [model.joint(f).id for f in gripper.fingers]
        self._finger_q = model.jnt_qposadr[fingers].copy()
        self._finger_v = model.jnt_dofadr[fingers].copy()
        self._ee = model.site(gripper.end_effector_site).id
        self._hand = int(model.site_bodyid[self._ee])
        self._object = model.body(gripper.object_body).id
        self._object_geom = model.geom(gripper.object_body).id
        self._object_q = int(model.jnt_qposadr[model.joint(gripper.object_body).id])
        self._table = model.geom(gripper.table_geom).id
        self._table_top = float(model.geom_pos[self._table, 2] + model.geom_size[self._table, 2])
        self._half = float(model.geom_size[self._object_geom, 0])
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        self._place = data.site_xpos[model.site(gripper.place_site).id].copy()
        self._home = model.key("home").qpos[self._qpos_idx].copy()
        self._joint_low = model.jnt_range[joints, 0].copy()
        self._joint_high = model.jnt_range[joints, 1].copy()
        self._ctrl_low = model.actuator_ctrlrange[self._arm_act, 0].copy()
        self._ctrl_high = model.actuator_ctrlrange[self._arm_act, 1].copy()
        self._max_opening = float(model.actuator_ctrlrange[self._grip_act, 1])
        # -- what the episode keeps
        n = num_worlds
        self._randomizes_model = True  # the object's draws are per world in every episode
        self._servo = np.zeros((n, len(joints)))
        self._start = np.zeros((n, 3))
        self._goal = np.zeros((n, 3))
        self._size = np.ones(n)
        self._grip_cmd = np.ones(n)
        self._objects: dict[str, np.ndarray] = {}
        self._track = {k: np.zeros(n, bool) for k in
                       ("grasp", "grasped", "carried", "sliding", "dropped", "released",
                        "off_table")}
        self._site_xpos = self._batch.bind("site_xpos")
        self._xpos = self._batch.bind("xpos")
        self._xmat = self._batch.bind("xmat")

    @property
    def capabilities(self) -> EnvCapabilities:
        """A MuJoCo robot's, and it says why each failed episode failed."""
        from dataclasses import replace

        return replace(super().capabilities, failure_modes=True)

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector: 34 (18, the robot's own state, for a task that
        sees)."""
        return len(STATE_NAMES) if self._sees else len(OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector: the arm's joints and the gripper (8)."""
        return len(self._gripper.joints) + 1

    # -- the model's randomization and the object's
    def _randomize_model(self) -> None:
        """The model's draws (:class:`MujocoBatchedEnv`), then, per world and in this order,
        the object's mass (kg; its nominal mass, scaled by the model's draw, when the scene
        sets none), size factor and friction factor, the gripper's force factor and the table's
        friction factor, written over the model's draws."""
        super()._randomize_model()
        n, rand, rng, model, b = self._num_worlds, self._rand, self._rng, self._model, self._batch
        body_mass = b.expand("body_mass")
        mass = (rng.uniform(*rand.object_mass, size=n) if rand.object_mass is not None
                else np.array(body_mass[:, self._object]))
        size = rng.uniform(*rand.object_size_scale, size=n)
        friction = rng.uniform(*rand.object_friction_scale, size=n)
        force = rng.uniform(*rand.gripper_force_scale, size=n)
        table = rng.uniform(*rand.table_friction_scale, size=n)
        half = self._half * size
        body_mass[:, self._object] = mass
        b.expand("body_inertia")[:, self._object] = (mass * (2 * half) ** 2 / 6)[:, None]
        b.expand("geom_size")[:, self._object_geom] = half[:, None]
        geom_friction = b.expand("geom_friction")
        geom_friction[:, self._object_geom, 0] *= friction
        geom_friction[:, self._table, 0] *= table
        b.expand("actuator_forcerange")[:, self._grip_act] = (
            model.actuator_forcerange[self._grip_act] * force[:, None])
        b.set_const()
        self._size = size
        self._objects = {"object_mass": mass, "object_size_scale": size,
                         "object_friction_scale": friction, "gripper_force_scale": force,
                         "table_friction_scale": table}

    # -- the episode
    def _reset_worlds(self) -> None:
        """Draw where the object starts (the target box) and its yaw, and the arm's pose near
        home; the gripper starts open, the object resting on the table."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        xy = rng.uniform(rand.target_low, rand.target_high, size=(n, 2))
        yaw = rng.uniform(*rand.object_yaw, size=n)
        noise = rng.uniform(-HOME_NOISE, HOME_NOISE, size=(n, len(self._home)))
        qpos0 = np.clip(self._home + noise, self._joint_low, self._joint_high)
        z = self._table_top + self._half * self._size
        self._start = np.column_stack([xy, z])
        self._goal = (self._start + np.array([0.0, 0.0, LIFT_HEIGHT])
                      if self._gripper.goal == "lift" else np.tile(self._place, (n, 1)))
        self._objects["object_yaw"] = yaw
        q = self._object_q
        self._qpos[:, self._qpos_idx] = qpos0
        self._qpos[:, self._finger_q] = self._max_opening / 2
        self._qpos[:, q:q + 3] = self._start
        self._qpos[:, q + 3:q + 7] = np.column_stack(
            [np.cos(yaw / 2), np.zeros(n), np.zeros(n), np.sin(yaw / 2)])
        self._servo = qpos0.copy()
        self._ctrl[:, self._arm_act] = qpos0
        self._ctrl[:, self._grip_act] = self._max_opening
        self._grip_cmd = np.ones(n)
        for flags in self._track.values():
            flags[:] = False

    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Move the arm's servo targets by action_scale * action, inside their ranges; set the
        gripper's opening target from its absolute command."""
        arm = applied[:, :-1]
        self._servo = np.clip(self._servo + ACTION_SCALE * arm, self._ctrl_low, self._ctrl_high)
        self._ctrl[:, self._arm_act] = self._servo
        self._grip_cmd = applied[:, -1].copy()
        self._ctrl[:, self._grip_act] = 0.5 * self._max_opening * (self._grip_cmd + 1.0)

    def _sense(self) -> None:
        """Read the state the task uses: the arm, the fingers, the grasp point, the hand's
        orientation and the object's pose."""
        q = self._object_q
        self._joint_pos = np.array(self._qpos[:, self._qpos_idx])
        self._joint_vel = np.array(self._qvel[:, self._dof_idx])
        self._opening = np.array(self._qpos[:, self._finger_q].sum(axis=1))
        self._finger_speed = np.array(np.abs(self._qvel[:, self._finger_v]).sum(axis=1))
        self._ee_pos = np.array(self._site_xpos[:, self._ee])
        self._hand_rot = np.array(self._xmat[:, self._hand]).reshape(-1, 3, 3)
        self._obj_pos = np.array(self._qpos[:, q:q + 3])
        self._obj_quat = np.array(self._qpos[:, q + 3:q + 7])

    def _between(self) -> np.ndarray:
        """Whether the object's centre is between the fingers. Shape: (N,), bool."""
        return np.linalg.norm(self._obj_pos - self._ee_pos, axis=1) < HELD_DISTANCE

    def _in_bin(self) -> np.ndarray:
        """Whether the object's centre is inside the bin's walls, below its rim."""
        g = self._gripper
        inside = np.all(np.abs(self._obj_pos[:, :2] - self._place[:2]) < g.bin_inner_half, axis=1)
        return inside & (self._obj_pos[:, 2] < self._table_top + g.bin_rim_height)

    def _after_step(self) -> None:
        """Track what the object did: grasped (the fingers closed on it), carried (held above
        where it rested); slipped out of the closed fingers, or lost while carried: let go of
        near the goal (placed) or anywhere else (both dropped); and off the table."""
        t = self._track
        rested = self._table_top + self._half * self._size
        width = 2 * self._half * self._size
        on = self._between() & (self._opening > 0.75 * width) & (self._opening < width + 0.006)
        lost = t["carried"] & ~on
        # out of closed fingers, or lost once it had slid down between them
        slipped = t["grasp"] & ~on & ((self._grip_cmd < 0.0) | t["sliding"])
        near = (np.linalg.norm(self._obj_pos[:, :2] - self._goal[:, :2], axis=1)
                < PLACE_NEAR) if self._gripper.goal == "place" else np.zeros_like(lost)
        placed = lost & (self._grip_cmd >= 0.0) & near
        t["released"] |= placed & ~self.success()
        t["dropped"] |= slipped | (lost & ~placed)
        t["grasped"] |= on
        t["grasp"] = on
        t["sliding"] = on & (self._ee_pos[:, 2] - self._obj_pos[:, 2] > SLID)
        t["carried"] = on & (self._obj_pos[:, 2] > rested + 0.01)
        t["off_table"] |= self._obj_pos[:, 2] < self._table_top - OFF_TABLE_DROP

    def success(self) -> np.ndarray:
        """lift-v0: the object at least LIFT_HEIGHT above where it started, between the
        fingers; pick-place-v0: the object in the bin, the gripper open. Shape: (N,), bool."""
        self._require_episode()
        if self._gripper.goal == "lift":
            return (self._obj_pos[:, 2] >= self._goal[:, 2]) & self._between()
        return self._in_bin() & (self._opening > 0.75 * self._max_opening)

    def episode_failures(self) -> np.ndarray:
        """Why each world's episode has failed so far (module doc), ``""`` where it meets the
        success predicate. Shape: (N,), str."""
        t = self._track
        mode = np.select(
            [self.success(), t["carried"], t["released"], t["dropped"], t["off_table"],
             t["grasp"], t["grasped"]],
            ["", "timed_out", "placed_wrong", "dropped", "knocked_off", "timed_out", "dropped"],
            default="missed_grasp")
        return mode.astype(str)

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """The object's distance to its goal (m): lift-v0, how far below the lift height it
        is; pick-place-v0, from the place target. Shape: (N,)."""
        self._require_episode()
        if self._gripper.goal == "lift":
            return np.maximum(0.0, self._goal[:, 2] - self._obj_pos[:, 2]), "m"
        return np.linalg.norm(self._obj_pos - self._goal, axis=1), "m"

    def episode_conditions(self) -> dict[str, np.ndarray]:
        """The model's draws and the object's: its mass (kg), size, friction and yaw (rad),
        the gripper's force and the table's friction, and where the object started."""
        out = super().episode_conditions()
        out.update({k: np.asarray(v, np.float64).copy() for k, v in self._objects.items()})
        return out

    def condition_units(self) -> dict[str, str]:
        """The unit of every factor of :meth:`episode_conditions`."""
        return {**super().condition_units(), "object_mass": "kg", "object_size_scale": "factor",
                "object_friction_scale": "factor", "object_yaw": "rad",
                "gripper_force_scale": "factor", "table_friction_scale": "factor"}

    def _episode_target(self) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
        """Where the object started (m), x and y."""
        return self._start[:, :2], TARGET_NAMES, TARGET_UNITS

    def _reward(self) -> np.ndarray:
        """Minus the grasp point's distance to the object and the object's to its goal (m);
        1 more while the fingers hold it. Shape: (N,)."""
        reach = np.linalg.norm(self._obj_pos - self._ee_pos, axis=1)
        carry = np.linalg.norm(self._goal - self._obj_pos, axis=1)
        return -reach - carry + self._track["grasp"].astype(np.float64)

    def _clean_observation(self) -> np.ndarray:
        """The robot's own state, then (a state task) the object, the goal and their
        differences. Shape: (N, 34), or (N, 18) for a task that sees."""
        own = np.column_stack([self._joint_pos, self._joint_vel, self._opening, self._ee_pos])
        if self._sees:
            return own
        return np.column_stack([own, self._obj_pos, self._obj_quat, self._goal,
                                self._obj_pos - self._ee_pos, self._goal - self._obj_pos])

    # -- the scripted expert
    def expert_action(self) -> np.ndarray:
        """The scripted grasp expert's action for the true state, its phase chosen per world
        at every step (so it runs batched and tries again after a failed grasp):

        1. release (pick-place-v0: the object in the bin, let go of or lowered): open, then
           rise above the bin;
        2. held (the object between the fingers, the gripper closed on it and still): close;
           lift-v0 raises the grasp point to ``lift_height``; pick-place-v0 raises the object
           to ``carry_clear``, carries it at ``carry_height`` over the place target and lowers
           it until it nearly rests there;
        3. closing (the object between the fingers, the gripper closing or the grasp point at
           grasp height): close and hold the grasp pose;
        4. otherwise open: above the object at ``pregrasp_height`` until aligned (horizontally
           within ``xy_tolerance``, the fingers with a face within ``yaw_tolerance``), then
           down to grasp height.

        The arm follows by damped-least-squares inverse kinematics on the grasp point's
        position and the hand's orientation (fingers pointing down, closing across the face of
        the object nearest the world's y axis), with a pull toward home in the null space
        (:func:`dls_joint_step`); the action is the joint step over ``ACTION_SCALE``, shrunk
        into [-1, 1].

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, 8), float32.
        """
        self._require_episode()
        g, n = self._gains, self._num_worlds
        ee, obj, rot, opening = self._ee_pos, self._obj_pos, self._hand_rot, self._opening
        rel = np.einsum("nji,nj->ni", rot, obj - ee)  # the object in the hand's frame
        yaw = face_yaw(self._obj_quat)
        closing_axis = rot[:, :, 1]
        yaw_err = np.abs(wrap_angle(np.arctan2(closing_axis[:, 1], closing_axis[:, 0])
                               - (np.pi / 2 + yaw)))
        width = 2 * self._half * self._size
        between = ((np.abs(rel[:, 0]) < 0.012) & (np.abs(rel[:, 1]) < 0.03)
                   & (np.abs(rel[:, 2]) < 0.015))
        held = (between & (opening > 0.75 * width) & (opening < width + 0.006)
                & (self._finger_speed < 0.02))
        grasp_z = obj[:, 2] + g.grasp_offset
        xy_err = np.linalg.norm(obj[:, :2] - ee[:, :2], axis=1)
        top = self._table_top
        # -- 4. approach, then descend
        aligned = (xy_err < g.xy_tolerance) & (yaw_err < g.yaw_tolerance) & (
            opening > 0.875 * self._max_opening)
        target = np.column_stack([obj[:, 0], obj[:, 1],
                                  np.where(aligned, grasp_z, obj[:, 2] + g.pregrasp_height)])
        grip = np.ones(n)
        # -- 3. closing
        closing = between & ~held & ((opening < 0.875 * self._max_opening) | (
            (xy_err < g.xy_tolerance) & (np.abs(ee[:, 2] - grasp_z) < 0.006)))
        target[closing] = np.column_stack([obj[:, 0], obj[:, 1], grasp_z])[closing]
        grip[closing] = -1.0
        # -- 2. held: lift, or raise, carry and lower
        grip[held] = -1.0
        if self._gripper.goal == "lift":
            target[held] = np.column_stack([ee[:, 0], ee[:, 1],
                                            np.full(n, top + g.lift_height)])[held]
        else:
            goal_xy = self._place[:2] + (ee[:, :2] - obj[:, :2])
            far = np.linalg.norm(goal_xy - ee[:, :2], axis=1) > 0.015
            low = obj[:, 2] < top + g.carry_clear
            raise_ = np.column_stack([ee[:, :2], np.full(n, top + g.carry_height)])
            carry = np.column_stack([goal_xy, np.full(n, top + g.carry_height)])
            lower = np.column_stack([goal_xy, self._place[2] + 0.005 + ee[:, 2] - obj[:, 2]])
            moved = np.where((far & low)[:, None], raise_, np.where(far[:, None], carry, lower))
            target[held] = moved[held]
            # -- 1. release in the bin
            release = self._in_bin() & (~held | (obj[:, 2] < self._place[2] + 0.015))
            up = np.column_stack([np.tile(self._place[:2], (n, 1)),
                                  np.full(n, top + self._gripper.bin_rim_height + 0.1)])
            target[release] = np.where((opening > 0.875 * self._max_opening)[:, None], up,
                                       ee)[release]
            grip[release] = 1.0
        dq = self._ik_step(target, yaw)
        action = dq / ACTION_SCALE
        action /= np.maximum(1.0, np.abs(action).max(axis=1, keepdims=True))
        return np.column_stack([action, grip]).astype(np.float32)

    def _ik_step(self, target: np.ndarray, yaw: np.ndarray) -> np.ndarray:
        """The joint step (rad) that moves the grasp point toward ``target`` (m; shape (N, 3))
        and turns the hand to point down, closing across the face at ``yaw`` (rad)."""
        g = self._gains
        rot = self._hand_rot
        y_d = np.column_stack([-np.sin(yaw), np.cos(yaw), np.zeros_like(yaw)])
        z_d = np.tile([0.0, 0.0, -1.0], (len(yaw), 1))
        rot_d = np.stack([np.cross(y_d, z_d), y_d, z_d], axis=2)
        e_rot = 0.5 * np.cross(rot, rot_d, axis=1).sum(axis=2)
        e_pos = clipped_rows(target - self._ee_pos, g.max_position_error)
        e_rot = clipped_rows(e_rot, g.max_rotation_error)
        jacp, jacr = self._batch.jac(self._hand, self._ee_pos)
        jac = np.concatenate([jacp, jacr], axis=1)[:, :, self._dof_idx]
        error = np.column_stack([g.position_gain * e_pos, g.rotation_gain * e_rot])
        return dls_joint_step(jac, error, g.null_gain * (self._home - self._joint_pos),
                              g.damping)


CAMERAS = (CameraSpec("front", "front", 64, 64), CameraSpec("wrist", "wrist", 64, 64))
"""pick-place-vision-v0's cameras: 64 x 64 RGB from the fixed ``front`` camera and the hand's
``wrist`` camera."""

LIFT = Gripper(goal="lift")
"""lift-v0's parts and goal."""

PLACE = Gripper(goal="place")
"""pick-place-v0's parts and goal."""

WORKSPACE_LOW = (0.40, -0.10)
"""Lower corner (m) of the box of object starts the expert is known to grasp from."""

WORKSPACE_HIGH = (0.60, 0.10)
"""Upper corner (m) of the box of object starts the expert is known to grasp from."""

LIFT_SUCCESS = (f"the object's centre at least {LIFT_HEIGHT:g} m above where it started and "
                f"within {HELD_DISTANCE:g} m of the grasp point, at the current state")
"""lift-v0's success predicate in words."""

PLACE_SUCCESS = ("the object's centre inside the bin's walls and below its rim, the gripper "
                 "open, at the current state")
"""pick-place-v0's success predicate in words."""


def lift_env(scene: Scene, num_worlds: int, seed: int, *,
             num_threads: int | None = None) -> ManipulationEnv:
    """N worlds of lift-v0."""
    return ManipulationEnv(scene, num_worlds, seed, task_name="lift-v0", gripper=LIFT,
                           num_threads=num_threads)


def pick_place_env(scene: Scene, num_worlds: int, seed: int, *,
                   num_threads: int | None = None) -> ManipulationEnv:
    """N worlds of pick-place-v0."""
    return ManipulationEnv(scene, num_worlds, seed, task_name="pick-place-v0", gripper=PLACE,
                           num_threads=num_threads)


def pick_place_vision_env(scene: Scene, num_worlds: int, seed: int, *,
                          num_threads: int | None = None) -> ManipulationEnv:
    """N worlds of pick-place-vision-v0: pick-place-v0 seen through the front and wrist
    cameras, the object's pose in no state entry."""
    return ManipulationEnv(scene, num_worlds, seed, task_name="pick-place-vision-v0",
                           gripper=PLACE, sees=True, num_threads=num_threads, cameras=CAMERAS)

#!/usr/bin/env python
"""Prototype of the scripted grasp expert for lift-v0 and pick-place-v0 (numpy + mujoco only).

Model: ``sim_scenes/pick_place/arm7_gripper.xml``. Control interface (what the tasks expose):
25 Hz control (frame_skip 20 at 500 Hz physics); action (8) in [-1, 1]: seven joint servo-target
deltas, 1.0 = 0.1 rad per control step (targets accumulate, as in reach-v0), then one absolute
gripper command: -1 closed, +1 fully open (opening target 0.04 * (a + 1) m, 0 .. 0.08 m).

The expert decides its phase from the TRUE state at every step (it keeps no memory), so it
runs batched and recovers when a grasp fails:

  lift-v0
    held    (cube between the pads, opening 0.03 .. 0.046 m, fingers at rest): close, raise the
            grasp point to table + 0.17 m (cube ~0.165 m above the table).
    closing (cube between the pads and either the gripper already partly closed or the grasp
            point at grasp height over the cube): close, hold the grasp pose.
    else    open; grasp point over the cube at cube + 0.10 m; once within 0.01 m (xy) of the
            cube, with the fingers aligned to a cube face (yaw error < 0.1 rad) and the gripper
            open (> 0.07 m), descend to grasp height (cube centre + 0.005 m).
  pick-place-v0: as lift-v0, but
    release (cube over the bin floor, below the rim, and either not held or within 0.015 m of
            the place height): open; stay until the opening exceeds 0.07 m, then rise above
            the bin.
    held    raise straight up until the cube is 0.12 m above the table, then carry at grasp
            point = table + 0.2 m over place_target (offset by where the cube sits in the hand),
            then lower until the cube is 0.005 m above its resting height in the bin.

Arm motion: damped-least-squares IK on the site ``ee`` over position (3) and the hand's
orientation (3: hand z axis to world -z, hand y axis (the closing direction) to the cube face
normal nearest world +y, i.e. the cube's yaw modulo pi/2, so joint7 turns at most pi/4; while
holding or releasing the cube the hand keeps its own yaw instead of chasing the cube's). Per step the expert asks for
``dq = J^T (J J^T + d^2 I)^-1 e + (I - J# J) h (q_home - q)`` with ``e`` = (gain_pos * position
error clipped to 0.04 m, gain_rot * rotation error clipped to 0.5 rad), d = 0.05, h = 0.05; the
action is dq / 0.1, shrunk into [-1, 1].

Randomization per episode: cube xy uniform +-0.08 m around (0.5, 0) m, cube yaw uniform
+-0.5 rad, every arm joint's home angle +-0.05 rad (servo targets start at the pose).
Success at the end of the episode (lift 100 control steps = 4 s, pick-place 175 = 7 s; the
expert needs about 29 and 67): lift: cube centre >= table + 0.1 m and within 0.03 m of "ee";
pick-place: cube centre over the bin's inner floor (|xy - bin xy| < 0.075 m) and below the rim
(z < 0.27 m), gripper open (> 0.06 m).

Conditions: nominal (0.1 kg, friction x1), 0.5 kg, friction x0.3 (every geom's sliding
friction), and two "heavy / slippery" scenes drawn per episode where the 4 N-per-finger
gripper (2 * 1.2 * 4 / 9.81 = 0.98 kg holding limit) loses some cubes: mass U(0.5, 1.5) kg,
and 0.3 kg with friction x U(0.2, 0.6). --sweep adds fixed masses and frictions near the limit.

Run:  MUJOCO_GL=egl python scripts/prototype_grasp_expert.py [--episodes 100] [--sweep]
Prints JSON: success rates per task and condition (episode seeds 1000 ..), mean steps to first
success, control steps per second of plain stepping (one world, zero action); renders
/tmp/grasp_front.png and /tmp/grasp_wrist.png (128 x 128) at the moment of the grasp.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mujoco
import numpy as np

XML = Path(__file__).resolve().parents[1] / "sim_scenes" / "pick_place" / "arm7_gripper.xml"

FRAME_SKIP = 20
ACTION_SCALE = 0.1          # rad per control step for an arm action of 1.0
OPEN_WIDTH = 0.08           # m, gripper opening at action +1
TABLE_TOP = 0.2             # m
CUBE_HALF = 0.02            # m
NOMINAL_OBJ = np.array([0.5, 0.0, TABLE_TOP + CUBE_HALF])
OBJ_XY_RANGE = 0.08         # m, +- around nominal
OBJ_YAW_RANGE = 0.5         # rad, +-
HOME_NOISE = 0.05           # rad, +- per joint
BIN_INNER_HALF = 0.075      # m
BIN_RIM = TABLE_TOP + 0.07  # m
EPISODE_STEPS = {"lift": 100, "pick_place": 175}

# Expert gains.
GAIN_POS = 0.35             # fraction of the position error asked per control step
GAIN_ROT = 0.35             # fraction of the orientation error asked per control step
MAX_POS_ERR = 0.04          # m, position error clip
MAX_ROT_ERR = 0.5           # rad, orientation error clip
DAMPING = 0.05
NULL_GAIN = 0.05
PREGRASP_HEIGHT = 0.10      # m above the cube centre
GRASP_OFFSET = 0.005        # m, grasp point above the cube centre
LIFT_EE_HEIGHT = 0.17       # m above the table (lift-v0)
CARRY_EE_HEIGHT = 0.20      # m above the table (pick-place-v0)
CARRY_CLEAR = 0.12          # m, cube above the table before moving sideways
XY_TOL = 0.01               # m, alignment before descending
YAW_TOL = 0.1               # rad


class Sim:
    """One world of the scene with the task's control interface."""

    def __init__(self, mass: float | tuple[float, float] = 0.1,
                 friction_scale: float | tuple[float, float] = 1.0,
                 force_limit: float | None = None) -> None:
        """mass (kg) and friction_scale (factor on every geom's sliding friction): a value, or
        a (low, high) range drawn uniformly per episode at reset."""
        self.m = mujoco.MjModel.from_xml_path(str(XML))
        m = self.m
        self.d = mujoco.MjData(m)
        self.mass, self.friction_scale = mass, friction_scale
        self.friction0 = m.geom_friction[:, 0].copy()
        if force_limit is not None:
            m.actuator_forcerange[m.actuator("gripper").id] = (-force_limit, force_limit)
        self.key = m.key("home").id
        self.home = m.key_qpos[self.key][:7].copy()
        self.ee = m.site("ee").id
        self.hand = m.body("link7").id
        self.obj_body = m.body("object").id
        jnt = m.joint("object")
        self.obj_qadr, self.obj_vadr = jnt.qposadr[0], jnt.dofadr[0]
        self.fl = m.joint("finger_left").qposadr[0]
        self.fr = m.joint("finger_right").qposadr[0]
        self.fl_v = m.joint("finger_left").dofadr[0]
        self.fr_v = m.joint("finger_right").dofadr[0]
        self.place = None
        self.bin_xy = m.body_pos[m.body("bin").id][:2].copy()
        self.lo = m.actuator_ctrlrange[:7, 0].copy()
        self.hi = m.actuator_ctrlrange[:7, 1].copy()
        self.jlo = m.jnt_range[:7, 0].copy()
        self.jhi = m.jnt_range[:7, 1].copy()
        self.jp = np.zeros((3, m.nv))
        self.jr = np.zeros((3, m.nv))

    def reset(self, rng: np.random.Generator) -> None:
        m, d = self.m, self.d
        mass = self.mass if np.isscalar(self.mass) else rng.uniform(*self.mass)
        fric = (self.friction_scale if np.isscalar(self.friction_scale)
                else rng.uniform(*self.friction_scale))
        m.body_mass[self.obj_body] = mass
        # keep the cube's inertia consistent with its mass (uniform solid cube)
        m.body_inertia[self.obj_body] = mass * (2 * CUBE_HALF) ** 2 / 6
        m.geom_friction[:, 0] = self.friction0 * fric
        mujoco.mj_resetDataKeyframe(m, d, self.key)
        q = np.clip(self.home + rng.uniform(-HOME_NOISE, HOME_NOISE, 7), self.jlo, self.jhi)
        d.qpos[:7] = q
        d.ctrl[:7] = q
        xy = NOMINAL_OBJ[:2] + rng.uniform(-OBJ_XY_RANGE, OBJ_XY_RANGE, 2)
        yaw = rng.uniform(-OBJ_YAW_RANGE, OBJ_YAW_RANGE)
        a = self.obj_qadr
        d.qpos[a:a + 3] = (xy[0], xy[1], NOMINAL_OBJ[2])
        d.qpos[a + 3:a + 7] = (np.cos(yaw / 2), 0, 0, np.sin(yaw / 2))
        mujoco.mj_forward(m, d)
        self.place = self.d.site("place_target").xpos.copy()

    def step(self, action: np.ndarray) -> None:
        d = self.d
        d.ctrl[:7] = np.clip(d.ctrl[:7] + ACTION_SCALE * np.clip(action[:7], -1, 1),
                             self.lo, self.hi)
        d.ctrl[7] = 0.5 * OPEN_WIDTH * (np.clip(action[7], -1, 1) + 1)
        mujoco.mj_step(self.m, self.d, nstep=FRAME_SKIP)

    # --- state read-outs --------------------------------------------------------------------
    def obj_pos(self) -> np.ndarray:
        return self.d.xpos[self.obj_body].copy()

    def ee_pos(self) -> np.ndarray:
        return self.d.site_xpos[self.ee].copy()

    def opening(self) -> float:
        return float(self.d.qpos[self.fl] + self.d.qpos[self.fr])

    def finger_speed(self) -> float:
        return float(abs(self.d.qvel[self.fl_v]) + abs(self.d.qvel[self.fr_v]))

    def lift_success(self) -> bool:
        o = self.obj_pos()
        return bool(o[2] >= TABLE_TOP + 0.1 and np.linalg.norm(o - self.ee_pos()) < 0.03)

    def in_bin(self, o: np.ndarray) -> bool:
        return bool(np.all(np.abs(o[:2] - self.bin_xy) < BIN_INNER_HALF) and o[2] < BIN_RIM)

    def place_success(self) -> bool:
        return self.in_bin(self.obj_pos()) and self.opening() > 0.06


def cube_face_yaw(quat: np.ndarray) -> float:
    """Yaw (rad) of the cube face normal nearest world +y, as a hand yaw (0 = home)."""
    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, quat)
    x_axis = mat.reshape(3, 3)[:, 0]
    yaw = np.arctan2(x_axis[1], x_axis[0])
    return float((yaw + np.pi / 4) % (np.pi / 2) - np.pi / 4)


def expert(sim: Sim, task: str) -> tuple[np.ndarray, str]:
    """The expert's action (8,) and phase name, from the true state only."""
    d = sim.d
    ee, obj = sim.ee_pos(), sim.obj_pos()
    rot = d.xmat[sim.hand].reshape(3, 3)
    rel = rot.T @ (obj - ee)                    # cube centre in the hand frame
    opening, fspeed = sim.opening(), sim.finger_speed()
    yaw = cube_face_yaw(d.qpos[sim.obj_qadr + 3:sim.obj_qadr + 7])
    between = abs(rel[0]) < 0.012 and abs(rel[1]) < 0.03 and abs(rel[2]) < 0.015
    held = between and 0.03 < opening < 0.046 and fspeed < 0.02
    hand_yaw_y = rot[:, 1]
    yaw_err = abs(np.arctan2(hand_yaw_y[1], hand_yaw_y[0]) - (np.pi / 2 + yaw))
    grasp_z = obj[2] + GRASP_OFFSET
    xy_err = np.linalg.norm(obj[:2] - ee[:2])

    grip = 1.0
    target = ee.copy()
    if task == "pick_place" and sim.in_bin(obj) and (
            not held or obj[2] < sim.place[2] + 0.015):
        phase = "release"
        if opening > 0.07:
            target = np.array([sim.place[0], sim.place[1], BIN_RIM + 0.1])
    elif held:
        grip = -1.0
        if task == "lift":
            phase = "lift"
            target = np.array([ee[0], ee[1], TABLE_TOP + LIFT_EE_HEIGHT])
        else:
            goal_xy = sim.place[:2] + (ee[:2] - obj[:2])
            if obj[2] < TABLE_TOP + CARRY_CLEAR and np.linalg.norm(goal_xy - ee[:2]) > 0.015:
                phase = "raise"
                target = np.array([ee[0], ee[1], TABLE_TOP + CARRY_EE_HEIGHT])
            elif np.linalg.norm(goal_xy - ee[:2]) > 0.015:
                phase = "carry"
                target = np.array([goal_xy[0], goal_xy[1], TABLE_TOP + CARRY_EE_HEIGHT])
            else:
                phase = "lower"
                target = np.array([goal_xy[0], goal_xy[1],
                                   sim.place[2] + 0.005 + (ee[2] - obj[2])])
    elif between and (opening < 0.07 or (xy_err < XY_TOL and abs(ee[2] - grasp_z) < 0.006)):
        phase = "close"
        grip = -1.0
        target = np.array([obj[0], obj[1], grasp_z])
    else:
        if xy_err < XY_TOL and yaw_err < YAW_TOL and opening > 0.07:
            phase = "descend"
            target = np.array([obj[0], obj[1], grasp_z])
        else:
            phase = "approach"
            target = np.array([obj[0], obj[1], obj[2] + PREGRASP_HEIGHT])

    if phase in ("lift", "raise", "carry", "lower", "release"):
        # holding (or letting go of) the cube: keep the hand's own yaw, do not chase the cube
        yaw = float(np.arctan2(hand_yaw_y[1], hand_yaw_y[0]) - np.pi / 2)
    # desired hand frame: z down, y (closing direction) along the chosen cube face normal
    y_d = np.array([-np.sin(yaw), np.cos(yaw), 0.0])
    z_d = np.array([0.0, 0.0, -1.0])
    x_d = np.cross(y_d, z_d)
    rot_d = np.stack([x_d, y_d, z_d], axis=1)
    e_rot = 0.5 * sum(np.cross(rot[:, i], rot_d[:, i]) for i in range(3))
    e_pos = target - ee
    n = np.linalg.norm(e_pos)
    if n > MAX_POS_ERR:
        e_pos *= MAX_POS_ERR / n
    n = np.linalg.norm(e_rot)
    if n > MAX_ROT_ERR:
        e_rot *= MAX_ROT_ERR / n
    mujoco.mj_jacSite(sim.m, d, sim.jp, sim.jr, sim.ee)
    jac = np.vstack([sim.jp[:, :7], sim.jr[:, :7]])
    err = np.concatenate([GAIN_POS * e_pos, GAIN_ROT * e_rot])
    pinv = jac.T @ np.linalg.inv(jac @ jac.T + DAMPING ** 2 * np.eye(6))
    dq = pinv @ err + (np.eye(7) - pinv @ jac) @ (NULL_GAIN * (sim.home - d.qpos[:7]))
    act = dq / ACTION_SCALE
    act /= max(1.0, float(np.abs(act).max()))
    return np.append(act, grip), phase


def run_episode(sim: Sim, task: str, seed: int, trace: bool = False,
                on_grasp=None) -> tuple[bool, int | None, list[str]]:
    rng = np.random.default_rng(seed)
    sim.reset(rng)
    first = None
    phases = []
    grasped_seen = False
    ok = sim.lift_success if task == "lift" else sim.place_success
    for t in range(EPISODE_STEPS[task]):
        act, phase = expert(sim, task)
        if trace:
            phases.append(phase)
        if on_grasp is not None and not grasped_seen and phase in ("lift", "raise"):
            grasped_seen = True
            on_grasp(sim)
        sim.step(act)
        if first is None and ok():
            first = t + 1
    return ok(), first, phases


def evaluate(task: str, episodes: int, **cond) -> dict:
    sim = Sim(**cond)
    wins, firsts = 0, []
    for ep in range(episodes):
        success, first, _ = run_episode(sim, task, seed=1000 + ep)
        wins += success
        if success and first is not None:
            firsts.append(first)
    return {"success_rate": wins / episodes,
            "mean_steps_to_success": float(np.mean(firsts)) if firsts else None}


def render_grasp(path_front: str, path_wrist: str) -> None:
    sim = Sim()
    renderer = mujoco.Renderer(sim.m, 128, 128)

    def shoot(s: Sim) -> None:
        for cam, path in (("front", path_front), ("wrist", path_wrist)):
            renderer.update_scene(s.d, camera=cam)
            img = renderer.render()
            _save_png(path, img)

    run_episode(sim, "pick_place", seed=7, on_grasp=shoot)
    renderer.close()


def _save_png(path: str, img: np.ndarray) -> None:
    import struct
    import zlib
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    Path(path).write_bytes(png)


def stepping_rate(steps: int = 500) -> float:
    sim = Sim()
    sim.reset(np.random.default_rng(0))
    zero = np.zeros(8)
    t0 = time.perf_counter()
    for _ in range(steps):
        sim.step(zero)
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--sweep", action="store_true", help="also sweep mass and friction")
    ap.add_argument("--force", type=float, default=None, help="override gripper force limit")
    ap.add_argument("--no-render", action="store_true")
    ap.add_argument("--tasks", default="lift,pick_place")
    args = ap.parse_args()
    f = {} if args.force is None else {"force_limit": args.force}
    out: dict = {"episode_steps": EPISODE_STEPS, "gripper_force_limit_N":
                 args.force if args.force is not None else
                 float(Sim().m.actuator_forcerange[7, 1])}
    conditions = {"nominal": {}, "mass_0.5": {"mass": 0.5}, "friction_0.3": {"friction_scale": 0.3},
                  # heavy / slippery scenes: drawn per episode, the expert fails on some
                  "mass_U(0.5,1.5)": {"mass": (0.5, 1.5)},
                  "mass_0.3_friction_U(0.2,0.6)": {"mass": 0.3, "friction_scale": (0.2, 0.6)}}
    if args.sweep:
        for mass in (0.75, 0.9, 1.0, 1.1, 1.25):
            conditions[f"mass_{mass}"] = {"mass": mass}
        for fr in (0.1, 0.05):
            conditions[f"friction_{fr}"] = {"friction_scale": fr}
        conditions["mass_0.5_friction_0.5"] = {"mass": 0.5, "friction_scale": 0.5}
    for task in args.tasks.split(","):
        out[task] = {name: evaluate(task, args.episodes, **cond, **f)
                     for name, cond in conditions.items()}
    out["control_steps_per_s"] = stepping_rate()
    if not args.no_render:
        render_grasp("/tmp/grasp_front.png", "/tmp/grasp_wrist.png")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

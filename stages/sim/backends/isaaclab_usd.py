"""USD articulations written from MJCF models, for the Isaac Lab backend (needs ``pxr``).

The Isaac Lab robots (:mod:`stages.sim.backends.isaaclab_robot`'s arm,
:mod:`stages.sim.backends.isaaclab_locomotion`'s quadruped) are USD files written from the
MuJoCo backend's MJCF: an articulation root, each hinge a revolute joint with its position
servo's drive, each geom a gprim. ``pxr`` and ``mujoco`` are imported inside the functions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

_AXES = ("X", "Y", "Z")
"""USD's names of the x, y and z axes."""


def articulation_stage(out: Path, root_path: str) -> tuple[Any, Any]:
    """A new USD stage at ``out`` (z up, metres, kilograms) whose default prim, an Xform at
    ``root_path``, is an articulation root; returns the stage and that Xform."""
    from pxr import Usd, UsdGeom, UsdPhysics

    stage = Usd.Stage.CreateNew(str(out))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdPhysics.SetStageKilogramsPerUnit(stage, 1.0)
    root = UsdGeom.Xform.Define(stage, root_path)
    stage.SetDefaultPrim(root.GetPrim())
    UsdPhysics.ArticulationRootAPI.Apply(root.GetPrim())
    return stage, root


def write_revolute(stage: Any, model: Any, joint: int, body_path: dict[int, str], mjcf: Path,
                   root: str) -> None:
    """Write MJCF hinge ``joint`` as a USD revolute joint under ``root``/joints: its bodies,
    frames, axis and limits (degrees), and a force drive with its position servo's gains per
    degree and force limit. The hinge must lie along +x, +y or +z of its body."""
    from pxr import Gf, Sdf, UsdPhysics

    def quat(wxyz: np.ndarray) -> Gf.Quatf:
        return Gf.Quatf(float(wxyz[0]), Gf.Vec3f(*(float(v) for v in wxyz[1:])))

    axis = np.flatnonzero(model.jnt_axis[joint])
    if axis.size != 1 or model.jnt_axis[joint][axis[0]] != 1.0:
        raise ValueError(f"{mjcf}: joint {model.joint(joint).name!r} is not along +x, +y or +z")
    child = int(model.jnt_bodyid[joint])
    parent = int(model.body_parentid[child])
    rev = UsdPhysics.RevoluteJoint.Define(stage, f"{root}/joints/{model.joint(joint).name}")
    rev.CreateBody0Rel().SetTargets([Sdf.Path(body_path[parent])])
    rev.CreateBody1Rel().SetTargets([Sdf.Path(body_path[child])])
    rev.CreateLocalPos0Attr(Gf.Vec3f(*(float(v) for v in model.body_pos[child])))
    rev.CreateLocalRot0Attr(quat(model.body_quat[child]))
    rev.CreateLocalPos1Attr(Gf.Vec3f(0.0, 0.0, 0.0))
    rev.CreateLocalRot1Attr(Gf.Quatf(1.0))
    rev.CreateAxisAttr(_AXES[int(axis[0])])
    rev.CreateLowerLimitAttr(float(np.degrees(model.jnt_range[joint][0])))
    rev.CreateUpperLimitAttr(float(np.degrees(model.jnt_range[joint][1])))
    actuator = int(np.flatnonzero(model.actuator_trnid[:, 0] == joint)[0])
    drive = UsdPhysics.DriveAPI.Apply(rev.GetPrim(), "angular")
    drive.CreateTypeAttr("force")
    per_degree = math.pi / 180.0
    drive.CreateStiffnessAttr(float(model.actuator_gainprm[actuator][0]) * per_degree)
    drive.CreateDampingAttr(float(-model.actuator_biasprm[actuator][2]) * per_degree)
    drive.CreateMaxForceAttr(float(model.actuator_forcerange[actuator][1]))


def write_geom(stage: Any, model: Any, geom: int, path: str, place: Any) -> None:
    """Write MJCF geom ``geom`` (capsule, cylinder or box) as a USD gprim at ``path``."""
    import mujoco
    from pxr import Gf, UsdGeom, UsdPhysics

    kind = model.geom_type[geom]
    size = model.geom_size[geom]
    if kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
        prim = UsdGeom.Capsule.Define(stage, path)
    elif kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
        prim = UsdGeom.Cylinder.Define(stage, path)
    elif kind == mujoco.mjtGeom.mjGEOM_BOX:
        prim = UsdGeom.Cube.Define(stage, path)
    else:
        raise ValueError(f"geom {model.geom(geom).name!r}: unsupported type {kind}")
    place(prim, model.geom_pos[geom], model.geom_quat[geom])
    if kind == mujoco.mjtGeom.mjGEOM_BOX:
        prim.CreateSizeAttr(1.0)
        prim.AddScaleOp().Set(Gf.Vec3f(*(float(2.0 * s) for s in size)))
    else:
        prim.CreateRadiusAttr(float(size[0]))
        prim.CreateHeightAttr(float(2.0 * size[1]))
        prim.CreateAxisAttr("Z")
    prim.CreateDisplayColorAttr([Gf.Vec3f(*(float(c) for c in model.geom_rgba[geom][:3]))])
    if model.geom_contype[geom] or model.geom_conaffinity[geom]:
        UsdPhysics.CollisionAPI.Apply(prim.GetPrim())

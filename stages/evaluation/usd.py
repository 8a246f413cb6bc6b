"""Validation rollouts as USD stages, for Isaac Sim, Omniverse and usdview.

One stage per filmed scene: ``/World/episode_<k>`` holds one filmed episode, each of its
bodies an ``Xform`` whose translation and orientation are sampled at every control step
(time code = step, ``timeCodesPerSecond`` = the control rate) and whose shapes are static
children in the body frame. Episodes sit side by side along +y, as in the rollout GIF. The
fixed world body (the floor) is not sampled. Written with ``usd-core`` (``pxr``); the same
poses give the same bytes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from physai_core.errors import PhysaiError
from stages.sim.env.bodies import BodyLayout, Shape

EPISODE_SPACING = 1.5
"""Metres between the filmed episodes along +y."""


def _pxr() -> Any:
    try:
        import pxr
        from pxr import Gf, Sdf, Tf, Usd, UsdGeom, Vt  # noqa: F401
    except ImportError as exc:
        raise PhysaiError(
            f"USD rollouts need usd-core, a dependency of physai-flows ({exc}); `make setup` "
            "installs it, or `pip install usd-core`") from exc
    return pxr


_USD_LOCK = threading.Lock()
"""One USD write at a time in a process: two threads in pxr at once can deadlock (seen with
two scenes validated side by side, both waiting in ``Sdf.Layer.CreateAnonymous``)."""


def write_rollout_usd(path: Path, layout: BodyLayout, poses: np.ndarray, fps: float) -> None:
    """Write a rollout's body poses as a USD stage at ``path`` (``.usda``: text).

    Safe to call from several threads: the writes take turns.

    Args:
        path: Where to write; its suffix picks the format (``.usda`` or ``.usdc``).
        layout: The scene's bodies and shapes.
        poses: World pose of every body at every step: position (m) and orientation
            (w, x, y, z). Shape: (steps, episodes, bodies, 7).
        fps: Control steps per second.
    """
    if poses.ndim != 4 or poses.shape[2:] != (len(layout.names), 7):
        raise ValueError(f"poses of shape {poses.shape} do not fit {len(layout.names)} bodies")
    with _USD_LOCK:
        _write(path, layout, poses, fps)


def _write(path: Path, layout: BodyLayout, poses: np.ndarray, fps: float) -> None:
    pxr = _pxr()
    Gf, Sdf, Tf, Usd, UsdGeom = pxr.Gf, pxr.Sdf, pxr.Tf, pxr.Usd, pxr.UsdGeom
    steps, episodes = poses.shape[:2]
    layer = Sdf.Layer.CreateAnonymous(path.suffix)
    stage = Usd.Stage.Open(layer)
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    stage.SetTimeCodesPerSecond(fps)
    stage.SetFramesPerSecond(fps)
    stage.SetStartTimeCode(0)
    stage.SetEndTimeCode(max(steps - 1, 0))
    world = UsdGeom.Xform.Define(stage, "/World")
    stage.SetDefaultPrim(world.GetPrim())
    names = _prim_names(layout.names, Tf)
    for k in range(episodes):
        root = UsdGeom.Xform.Define(stage, f"/World/episode_{k}")
        root.AddTranslateOp().Set(Gf.Vec3d(0.0, k * EPISODE_SPACING, 0.0))
        for b, name in enumerate(names):
            body = UsdGeom.Xform.Define(stage, f"{root.GetPath()}/{name}")
            move, turn = body.AddTranslateOp(), body.AddOrientOp(UsdGeom.XformOp.PrecisionDouble)
            if b == 0:
                move.Set(Gf.Vec3d(0.0, 0.0, 0.0))
                turn.Set(Gf.Quatd(1.0, 0.0, 0.0, 0.0))
                continue
            for t in range(steps):
                p, q = poses[t, k, b, :3], poses[t, k, b, 3:]
                move.Set(Gf.Vec3d(*p.tolist()), float(t))
                turn.Set(Gf.Quatd(float(q[0]), Gf.Vec3d(*q[1:].tolist())), float(t))
        for i, shape in enumerate(layout.shapes):
            _define_shape(stage, f"{root.GetPath()}/{names[shape.body]}/shape_{i}", shape, pxr)
    layer.Export(str(path))


def _prim_names(names: tuple[str, ...], tf: Any) -> list[str]:
    """Valid, distinct USD prim names for the bodies, in order."""
    out: list[str] = []
    for i, name in enumerate(names):
        valid = tf.MakeValidIdentifier(name)
        out.append(valid if valid not in out else f"{valid}_{i}")
    return out


def _define_shape(stage: Any, path: str, shape: Shape, pxr: Any) -> None:
    """One shape as a USD gprim under its body, placed and coloured as in the model."""
    Gf, UsdGeom, Vt = pxr.Gf, pxr.UsdGeom, pxr.Vt
    sx, sy, sz = shape.size
    scale: tuple[float, float, float] | None = None
    if shape.kind == "sphere":
        prim = UsdGeom.Sphere.Define(stage, path)
        prim.GetRadiusAttr().Set(sx)
    elif shape.kind in ("capsule", "cylinder"):
        kind = UsdGeom.Capsule if shape.kind == "capsule" else UsdGeom.Cylinder
        prim = kind.Define(stage, path)
        prim.GetRadiusAttr().Set(sx)
        prim.GetHeightAttr().Set(2.0 * sy)
        prim.GetAxisAttr().Set(UsdGeom.Tokens.z)
    elif shape.kind == "ellipsoid":
        prim = UsdGeom.Sphere.Define(stage, path)
        prim.GetRadiusAttr().Set(1.0)
        scale = (sx, sy, sz)
    elif shape.kind in ("box", "plane"):
        prim = UsdGeom.Cube.Define(stage, path)
        prim.GetSizeAttr().Set(2.0)
        scale = (sx, sy, sz if shape.kind == "box" else 1e-3)
    else:
        prim = UsdGeom.Mesh.Define(stage, path)
        faces = shape.faces if shape.faces is not None else np.zeros((0, 3), np.int64)
        points = shape.points if shape.points is not None else np.zeros((0, 3))
        prim.GetPointsAttr().Set(Vt.Vec3fArray.FromNumpy(points.astype(np.float32)))
        prim.GetFaceVertexCountsAttr().Set(Vt.IntArray([3] * len(faces)))
        prim.GetFaceVertexIndicesAttr().Set(Vt.IntArray(faces.reshape(-1).tolist()))
    prim.AddTranslateOp().Set(Gf.Vec3d(*shape.pos))
    w, x, y, z = shape.quat
    prim.AddOrientOp(UsdGeom.XformOp.PrecisionDouble).Set(Gf.Quatd(w, Gf.Vec3d(x, y, z)))
    if scale is not None:
        prim.AddScaleOp().Set(Gf.Vec3f(*scale))
    r, g, b, a = shape.rgba
    prim.CreateDisplayColorAttr(Vt.Vec3fArray([Gf.Vec3f(r, g, b)]))
    if a < 1.0:
        prim.CreateDisplayOpacityAttr(Vt.FloatArray([a]))

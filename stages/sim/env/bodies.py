"""A scene's rigid bodies and their shapes, read from a MuJoCo model, and their poses over time.

Validation records the filmed worlds' body poses at every control step, and
:mod:`stages.evaluation.usd` writes them as a USD stage that Isaac Sim, Omniverse and usdview play
back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import mujoco


@dataclass(frozen=True)
class Shape:
    """A shape fixed to a body, in the body's frame (metres).

    ``kind`` is one of ``box`` (``size``: half-extents), ``sphere`` (radius), ``capsule`` and
    ``cylinder`` (radius, half-length along z), ``ellipsoid`` (semi-axes), ``plane``
    (half-extents in x and y) or ``mesh`` (``points`` and triangle ``faces``).
    """

    body: int
    kind: str
    size: tuple[float, float, float]
    pos: tuple[float, float, float]
    quat: tuple[float, float, float, float]
    """Orientation in the body frame, (w, x, y, z)."""
    rgba: tuple[float, float, float, float]
    points: np.ndarray | None = None
    faces: np.ndarray | None = None


@dataclass(frozen=True)
class BodyLayout:
    """The bodies of a scene (index 0: the fixed world) and the shapes on them."""

    names: tuple[str, ...]
    shapes: tuple[Shape, ...]


@runtime_checkable
class RecordsBodies(Protocol):
    """An environment whose worlds' body poses can be read (see :func:`mujoco_layout`)."""

    def body_layout(self) -> BodyLayout | None:
        """The bodies and their shapes, the same in every world; None where this environment's
        bodies cannot be read (a Gymnasium environment that is not MuJoCo's)."""
        ...

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every body's pose in each of ``worlds`` now, in the world frame.

        Returns:
            Position (m) and orientation (w, x, y, z). Shape: (len(worlds), bodies, 7), float64.
        """
        ...


_KINDS = {"mjGEOM_PLANE": "plane", "mjGEOM_SPHERE": "sphere", "mjGEOM_CAPSULE": "capsule",
          "mjGEOM_ELLIPSOID": "ellipsoid", "mjGEOM_CYLINDER": "cylinder", "mjGEOM_BOX": "box",
          "mjGEOM_MESH": "mesh"}
PLANE_HALF_EXTENT = 5.0
"""Half-extent (m) given to a MuJoCo plane of size 0, which is infinite."""


def mujoco_layout(model: mujoco.MjModel) -> BodyLayout:
    """The bodies of ``model`` and its visible geoms (height fields are left out)."""
    import mujoco

    kinds = {int(getattr(mujoco.mjtGeom, name)): kind for name, kind in _KINDS.items()}
    names = tuple(model.body(i).name or f"body_{i}" for i in range(model.nbody))
    shapes = []
    for g in range(model.ngeom):
        kind = kinds.get(int(model.geom_type[g]))
        rgba = tuple(float(v) for v in model.geom_rgba[g])
        if kind is None or rgba[3] == 0.0:
            continue
        size = tuple(float(v) for v in model.geom_size[g])
        points = faces = None
        if kind == "plane":
            size = (size[0] or PLANE_HALF_EXTENT, size[1] or PLANE_HALF_EXTENT, 0.0)
        elif kind == "mesh":
            mesh = int(model.geom_dataid[g])
            v0, nv = int(model.mesh_vertadr[mesh]), int(model.mesh_vertnum[mesh])
            f0, nf = int(model.mesh_faceadr[mesh]), int(model.mesh_facenum[mesh])
            points = np.array(model.mesh_vert[v0:v0 + nv], dtype=np.float64)
            faces = np.array(model.mesh_face[f0:f0 + nf], dtype=np.int64)
        shapes.append(Shape(
            body=int(model.geom_bodyid[g]), kind=kind, size=(size[0], size[1], size[2]),
            pos=(float(model.geom_pos[g][0]), float(model.geom_pos[g][1]),
                 float(model.geom_pos[g][2])),
            quat=(float(model.geom_quat[g][0]), float(model.geom_quat[g][1]),
                  float(model.geom_quat[g][2]), float(model.geom_quat[g][3])),
            rgba=(rgba[0], rgba[1], rgba[2], rgba[3]), points=points, faces=faces))
    return BodyLayout(names, tuple(shapes))


def mujoco_poses(model: mujoco.MjModel, data: mujoco.MjData,
                 scratch: mujoco.MjData | None = None) -> np.ndarray:
    """Every body's world pose for ``data``'s joint and mocap positions. Shape: (bodies, 7).

    Kinematics run in ``scratch`` when given (``data`` is then only read: an environment's own
    state stays as its step left it), else in ``data``.
    """
    import mujoco

    if scratch is not None:
        scratch.qpos[:] = data.qpos
        scratch.mocap_pos[:] = data.mocap_pos
        scratch.mocap_quat[:] = data.mocap_quat
        data = scratch
    mujoco.mj_kinematics(model, data)
    return np.concatenate([data.xpos, data.xquat], axis=1).astype(np.float64)

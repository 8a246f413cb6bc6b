"""Cameras as observations: what a task declares it sees, and the names its images travel under.

A task declares its cameras beside its state entries (:attr:`TaskSpec.cameras
<stages.sim.tasks.catalog.TaskSpec.cameras>`). A policy's observation is then a set of named
tensors:

- ``obs``: the state vector, (N, obs_dim) float32, as for every policy;
- ``<camera>_image``: each rgb camera's frame, (N, height, width, 3) uint8, HWC, RGB;
- ``<camera>_depth``: each depth camera's frame, (N, height, width, 1) float32, metres.

The same names are the ONNX graph's inputs, the bundle manifest's, and the dataset keys
(robomimic's ``obs/<camera>_image``). A backend that renders cameras implements
:class:`SeesCameras`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["MAX_PIXELS", "CameraSpec", "Observation", "SeesCameras", "check_cameras",
           "image_keys", "image_shapes"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

MAX_PIXELS = 1024 * 1024
"""Most pixels (width x height) one declared camera may have."""


@dataclass(frozen=True)
class CameraSpec:
    """One camera a task observes through."""

    name: str
    """The camera's name in the observation (lower case, digits, underscores)."""
    camera: str
    """The model's camera it renders from (an MJCF ``<camera>`` name)."""
    width: int
    """Image width (pixels)."""
    height: int
    """Image height (pixels)."""
    rgb: bool = True
    """Whether the policy reads the camera's colour image (``<name>_image``)."""
    depth: bool = False
    """Whether the policy reads the camera's depth image (``<name>_depth``, metres)."""

    def __post_init__(self) -> None:
        """Refuse a bad name, a size outside 1..MAX_PIXELS or a camera that gives nothing."""
        if not _NAME.match(self.name):
            raise ValueError(f"camera name {self.name!r} must be lower case letters, digits "
                             "and underscores, starting with a letter")
        if self.width < 1 or self.height < 1 or self.width * self.height > MAX_PIXELS:
            raise ValueError(f"camera {self.name!r}: size {self.width} x {self.height} is "
                             f"outside 1 .. {MAX_PIXELS} pixels")
        if not (self.rgb or self.depth):
            raise ValueError(f"camera {self.name!r} gives neither rgb nor depth")

    @property
    def image_key(self) -> str:
        """Name of the colour image among the observation's tensors: ``<name>_image``."""
        return f"{self.name}_image"

    @property
    def depth_key(self) -> str:
        """Name of the depth image among the observation's tensors: ``<name>_depth``."""
        return f"{self.name}_depth"

    def tensors(self) -> tuple[str, ...]:
        """Every observation tensor this camera gives, colour first."""
        return ((self.image_key,) if self.rgb else ()) + ((self.depth_key,) if self.depth else ())

    def shape(self, key: str) -> tuple[int, int, int]:
        """Shape of one world's tensor ``key``: (height, width, 3) colour, (.., 1) depth."""
        return (self.height, self.width, 3 if key == self.image_key else 1)

    def dtype(self, key: str) -> np.dtype:
        """Element type of tensor ``key``: uint8 colour, float32 depth."""
        return np.dtype(np.uint8 if key == self.image_key else np.float32)


def image_keys(cameras: Sequence[CameraSpec]) -> tuple[str, ...]:
    """Every image tensor ``cameras`` give, in declaration order."""
    return tuple(key for cam in cameras for key in cam.tensors())


def image_shapes(cameras: Sequence[CameraSpec]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each image tensor's per-world shape and dtype name, e.g. ``{"front_image": ((64, 64,
    3), "uint8")}``."""
    return {key: (cam.shape(key), cam.dtype(key).name) for cam in cameras for key in cam.tensors()}


def check_cameras(cameras: Sequence[CameraSpec], task: str) -> None:
    """Refuse two cameras of one task under one name."""
    names = [cam.name for cam in cameras]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"task {task!r}: camera names {twice} are declared twice")


@runtime_checkable
class SeesCameras(Protocol):
    """A batched environment that renders its task's cameras."""

    @property
    def cameras(self) -> tuple[CameraSpec, ...]:
        """The cameras the task declares."""
        ...

    def camera_images(self) -> dict[str, np.ndarray]:
        """Every declared camera of every world at the current state, by tensor name.

        Shapes: ``<name>_image`` (N, height, width, 3) uint8; ``<name>_depth`` (N, height,
        width, 1) float32 (m).
        """
        ...


Observation = Mapping[str, np.ndarray]
"""A policy's named inputs: ``obs`` and the image tensors it reads."""

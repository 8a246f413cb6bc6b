"""Camera images of an imported policy: what each image input of the graph wants, checked
against the task's camera, and the nodes that turn the task's frames into it.

This project hands a policy each camera's frame as ``<camera>_image``, uint8 (batch, H, W, 3),
RGB, 0..255 (:mod:`stages.sim.env.cameras`). A graph exported elsewhere may want another name,
the channels first (CHW, as torchvision and robomimic's encoders take them) and floats in 0..1.
:func:`image_input` reads the layout and element type from the graph's declared input (or
takes them as stated where the graph cannot say, e.g. a 3 x 3 image or symbolic sizes) and
checks them against the camera in one line; :func:`wrap_seeing` wraps the graph, its network
untouched, so that it reads ``obs`` and ``<camera>_image`` like a vision policy trained here:
a ``Transpose`` for CHW, a ``Cast`` to the graph's float type and a ``Div`` by 255 for 0..1.
:func:`source_frames` does the same in numpy, for the parity check against the graph as given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stages.sim.env.observation import STATE_KEY
from stages.training.import_sources import Where

if TYPE_CHECKING:
    import onnx

    from edge.export import GraphPort
    from stages.sim.tasks.catalog import TaskSpec

ImageLayout = Literal["hwc", "chw"]
"""Where an image's channels are: last, (batch, H, W, 3), or first, (batch, 3, H, W)."""

ImageRange = Literal["0..1", "0..255"]
"""The values of an image's pixels: floats in 0..1, or 0..255 (uint8, or floats as stated)."""

LAYOUTS: tuple[ImageLayout, ...] = ("hwc", "chw")
"""Every image layout, as the config and the command line name them."""

RANGES: tuple[ImageRange, ...] = ("0..1", "0..255")
"""Every pixel range, as the config and the command line name them."""

_DTYPES = {"UINT8": np.uint8, "FLOAT": np.float32, "FLOAT16": np.float16, "DOUBLE": np.float64}
"""ONNX element types an image input may have, and their numpy types."""

_TO_CHW = (0, 3, 1, 2)
"""The permutation from the task's (batch, H, W, 3) frames to (batch, 3, H, W)."""


@dataclass(frozen=True)
class ImageInput:
    """One image input of an imported graph and the task camera frame it is fed."""

    name: str
    """The graph's input tensor."""
    key: str
    """The task's image tensor it receives, ``<camera>_image``."""
    layout: ImageLayout
    """Where the graph wants the channels."""
    dtype: str
    """The graph's element type, as ONNX names it (``UINT8``, ``FLOAT``, ...)."""
    range: ImageRange
    """The pixel values the graph wants."""
    size: tuple[int, int]
    """The camera's (height, width) in pixels."""

    @property
    def as_given(self) -> bool:
        """Whether the graph reads the task's frame unchanged, under its own name."""
        return self.name == self.key and self.layout == "hwc" and self.dtype == "UINT8"


def camera_keys(spec: TaskSpec) -> dict[str, tuple[int, int]]:
    """Each colour image the task's cameras give, ``<camera>_image``, and its (H, W)."""
    return {cam.image_key: (cam.height, cam.width) for cam in spec.cameras if cam.rgb}


def _fits(shape: tuple[int | str | None, ...], want: tuple[int, int, int]) -> bool:
    """Whether declared dims ``shape`` admit ``want``; a symbolic or unknown dim admits any."""
    return len(shape) == 3 and all(not isinstance(d, int) or d == w
                                   for d, w in zip(shape, want, strict=True))


def image_input(
    port: GraphPort, key: str, spec: TaskSpec, layout: ImageLayout | None,
    value_range: ImageRange | None, where: Where,
) -> ImageInput:
    """The graph input ``port`` fed the task's image ``key``, its layout and pixel range read
    from the graph or as stated (``layout``, ``value_range``), checked against the camera;
    ``where`` is where the source is named (errors name the fields beside it).

    A uint8 input takes 0..255; a float one 0..1 unless stated. The layout is the one the
    declared shape admits, HWC (batch, H, W, 3) or CHW (batch, 3, H, W); where both do
    (symbolic sizes) it must be stated. A mismatch is one line naming the input, the camera
    and the sizes."""
    height, width = camera_keys(spec)[key]
    camera = key.removesuffix("_image")
    shown = f"{port.dtype} {list(port.shape)}"
    if port.dtype not in _DTYPES or len(port.shape) != 4:
        raise where.beside("inputs").error(shown, f"image input {port.name!r} must be a uint8 "
                                           "or float tensor (batch, H, W, 3) or (batch, 3, H, W)")
    layouts: dict[ImageLayout, tuple[int, int, int]] = {"hwc": (height, width, 3),
                                                         "chw": (3, height, width)}
    fits = [name for name, want in layouts.items() if _fits(port.shape[1:], want)]
    gives = (f"camera {camera} of task {spec.name} gives {height} x {width} RGB: HWC "
             f"{list(layouts['hwc'])} or CHW {list(layouts['chw'])}")
    if layout is not None and layout not in fits:
        raise where.beside("image_layout").error(
            layout, f"image input {port.name!r} is {shown}, which is not {layout.upper()}; "
            f"{gives}")
    if not fits:
        raise where.beside("inputs").error(shown, f"image input {port.name!r} fits neither "
                                           f"layout; {gives}")
    if layout is None and len(fits) > 1:
        raise where.beside("image_layout").error(
            shown, f"the graph does not say where image input {port.name!r} has its channels; "
            f"state it: image_layout: {{{port.name}: hwc|chw}} (on the command line: "
            f"--image-layout {port.name}=hwc|chw)")
    if port.dtype == "UINT8" and value_range == "0..1":
        raise where.beside("image_range").error(value_range, f"image input {port.name!r} is "
                                                "uint8: its pixels are 0..255")
    return ImageInput(port.name, key, layout or fits[0], port.dtype,
                      value_range or ("0..255" if port.dtype == "UINT8" else "0..1"),
                      (height, width))


def suggested_mapping(ports: Sequence[GraphPort], spec: TaskSpec) -> dict[str, str]:
    """A likely mapping of ``ports`` to the task's tensors, for a message: a rank-2 input to
    ``obs``, a rank-4 one to the first camera whose size its shape admits."""
    out = {}
    for port in ports:
        if len(port.shape) == 2:
            out[port.name] = STATE_KEY
        elif len(port.shape) == 4:
            for key, (h, w) in camera_keys(spec).items():
                if _fits(port.shape[1:], (h, w, 3)) or _fits(port.shape[1:], (3, h, w)):
                    out[port.name] = key
                    break
    return out


def probe_frames(images: Sequence[ImageInput], rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Frames for the probe observations, by image key: all black, then uniform random
    pixels. Shape of each: (rows, H, W, 3), uint8."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for image in images:
        if image.key not in out:
            frames = rng.integers(0, 256, (rows, *image.size, 3), dtype=np.uint8)
            frames[0] = 0
            out[image.key] = frames
    return out


def source_frames(image: ImageInput, frames: np.ndarray) -> np.ndarray:
    """The task's ``frames`` (N, H, W, 3) uint8 as the graph wants them, in numpy: the
    reference the wrapped graph's own conversion is held to."""
    out = frames.transpose(_TO_CHW) if image.layout == "chw" else frames
    dtype = _DTYPES[image.dtype]
    if dtype is np.uint8:
        return np.ascontiguousarray(out)
    converted = out.astype(dtype)
    return converted / np.asarray(255.0, dtype) if image.range == "0..1" else converted


def _image_nodes(image: ImageInput, target: str) -> tuple[list[onnx.NodeProto],
                                                           list[onnx.TensorProto]]:
    """The nodes that turn the frame ``image.key`` into the tensor ``target`` the graph reads
    as ``image.name``, and their constants."""
    import onnx
    from onnx import helper, numpy_helper

    prefix = f"io/image/{image.name}"
    steps: list[tuple[str, dict[str, Any]]] = []
    if image.layout == "chw":
        steps.append(("Transpose", {"perm": list(_TO_CHW)}))
    if image.dtype != "UINT8":
        steps.append(("Cast", {"to": getattr(onnx.TensorProto, image.dtype)}))
        if image.range == "0..1":
            steps.append(("Div", {}))
    steps = steps or [("Identity", {})]
    nodes, weights, current = [], [], image.key
    for i, (op, attrs) in enumerate(steps):
        out = target if i == len(steps) - 1 else f"{prefix}/{op.lower()}"
        args = [current]
        if op == "Div":  # by 255 in the graph's own float type, as exporters write x / 255
            args.append(f"{prefix}/255")
            weights.append(numpy_helper.from_array(np.asarray(255.0, _DTYPES[image.dtype]),
                                                   args[-1]))
        nodes.append(helper.make_node(op, args, [out], name=f"{prefix}/{op.lower()}", **attrs))
        current = out
    return nodes, weights


def wrap_seeing(
    model: onnx.ModelProto, inputs: Mapping[str, Sequence[int]], images: Sequence[ImageInput],
    outputs: Sequence[tuple[str, Sequence[int]]], obs_dim: int, act_dim: int, path: Path,
) -> onnx.ModelProto:
    """``model`` inside a graph with this project's I/O for a policy that sees: ``obs``
    (batch, obs_dim) float32 and each camera's ``<camera>_image`` (batch, H, W, 3) uint8 ->
    ``actions`` (batch, act_dim), the network's nodes and weights left as they are
    (:func:`edge.export.wrap_io`); each of ``images`` is fed its camera's frame, transposed,
    cast and scaled as it says (:func:`_image_nodes`). Raises
    :class:`~edge.errors.EdgeError` naming ``path`` when the wrapped graph fails the ONNX
    checker."""
    from edge.export import ImageFeed, wrap_io

    feeds = []
    for image in images:
        made, consts = _image_nodes(image, f"src/{image.name}")
        feeds.append(ImageFeed(image.key, image.size, made, consts))
    return wrap_io(model, inputs, outputs, obs_dim, act_dim, path, feeds)

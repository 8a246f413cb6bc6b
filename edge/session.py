"""ONNX Runtime sessions over exported policies: the fixed I/O names and CPU session setup.

A state policy's graph maps one float tensor ``obs`` (batch, obs_dim) to ``actions``
(batch, act_dim). A policy that sees also takes one uint8 tensor per camera image,
``<camera>_image`` (batch, height, width, 3), RGB, HWC; its image scaling is inside the graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edge.errors import EdgeError
from physai_core.errors import one_line

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime

INPUT_NAME = "obs"
"""Name of the policy graph's state input. Shape: (batch, obs_dim), float32."""

OUTPUT_NAME = "actions"
"""Name of the policy graph's single output. Shape: (batch, act_dim), float32; for a policy
that emits chunks of k actions, (batch, k, act_dim)."""

IMAGE_SUFFIX = "_image"
"""Ending of every image input's name, ``<camera>_image``. Shape: (batch, H, W, 3), uint8."""

CPU_PROVIDER = "CPUExecutionProvider"
"""ONNX Runtime execution provider used off the robot."""


@dataclass(frozen=True)
class PolicySession:
    """An ONNX Runtime session over an exported policy, with its feature and image sizes."""

    session: onnxruntime.InferenceSession
    obs_dim: int
    act_dim: int
    provider: str
    images: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    """Image input name -> one sample's shape (height, width, 3), uint8 RGB HWC, in the
    graph's input order; empty for a state policy."""
    chunk_size: int | None = None
    """k of a graph whose output is a chunk of k actions, (batch, k, act_dim); None for one
    action, (batch, act_dim)."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every input the graph reads: ``obs``, then the image inputs."""
        return (INPUT_NAME, *self.images)

    def run(self, obs: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
        """Actions for a batch of observations: the state alone, (batch, obs_dim) float32, or
        a mapping of every input by name (images (batch, H, W, 3) uint8).
        Shape: -> (batch, act_dim), or (batch, k, act_dim) for a chunk of k actions."""
        if isinstance(obs, Mapping):
            missing = [name for name in self.inputs if name not in obs]
            if missing:
                raise EdgeError(f"policy inputs {missing} are missing (given: {sorted(obs)})")
            feed = {name: obs[name] for name in self.inputs}
        elif self.images:
            raise EdgeError(f"the policy reads {list(self.inputs)}; pass them by name")
        else:
            feed = {INPUT_NAME: obs}
        actions: np.ndarray = self.session.run([OUTPUT_NAME], feed)[0]
        return actions


def open_session(onnx_path: Path, *, threads: int = 1) -> PolicySession:
    """Open ``onnx_path`` on the CPU provider with ``threads`` intra-op threads, run sequentially.

    Raises :class:`EdgeError` when the file is missing, cannot be loaded, or does not map one
    float tensor ``obs`` of shape (batch, obs_dim), and any uint8 images ``<camera>_image``
    of shape (batch, H, W, 3), to one float tensor ``actions`` of shape (batch, act_dim) or,
    for a chunk of k actions, (batch, k, act_dim), with fixed feature, chunk and image sizes.
    """
    import onnxruntime

    if threads < 1:
        raise EdgeError(f"{onnx_path}: threads must be at least 1 (value: {threads})")
    if not onnx_path.is_file():
        raise EdgeError(f"{onnx_path}: ONNX file not found")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    try:
        session = onnxruntime.InferenceSession(
            str(onnx_path), sess_options=options, providers=[CPU_PROVIDER]
        )
    except Exception as exc:  # ONNX Runtime's error types derive from Exception directly.
        raise EdgeError(f"{onnx_path}: ONNX Runtime cannot load it: {one_line(exc)}") from exc
    inputs = session.get_inputs()
    images = {arg.name: _image_shape(onnx_path, arg) for arg in inputs if arg.name != INPUT_NAME}
    state = [arg for arg in inputs if arg.name == INPUT_NAME]
    obs_dim = _feature_dim(onnx_path, state, INPUT_NAME, "input")
    outputs = session.get_outputs()
    chunk = _chunk_size(onnx_path, outputs)
    act_dim = _feature_dim(onnx_path, outputs, OUTPUT_NAME, "output", chunked=chunk is not None)
    return PolicySession(session, obs_dim, act_dim, session.get_providers()[0], images, chunk)


def _feature_dim(onnx_path: Path, args: list[onnxruntime.NodeArg], name: str, kind: str,
                 *, chunked: bool = False) -> int:
    """Fixed last dimension of the single graph ``kind`` named ``name``, checked for type: of
    shape (batch, features), or with ``chunked`` (batch, k, features)."""
    names = [arg.name for arg in args]
    if names != [name]:
        raise EdgeError(f"{onnx_path}: graph {kind}s must be [{name!r}] (value: {names})")
    arg = args[0]
    if arg.type != "tensor(float)":
        raise EdgeError(f"{onnx_path}: {kind} {name!r} must be tensor(float) (value: {arg.type})")
    shape = arg.shape
    if len(shape) != (3 if chunked else 2) or not isinstance(shape[-1], int):
        raise EdgeError(
            f"{onnx_path}: {kind} {name!r} must have shape (batch, features) with a fixed "
            f"feature size (value: {shape})"
        )
    return shape[-1]


def _chunk_size(onnx_path: Path, outputs: list[onnxruntime.NodeArg]) -> int | None:
    """k of an output ``actions`` of shape (batch, k, act_dim) (a fixed k); None for any other
    rank, which :func:`_feature_dim` checks."""
    if len(outputs) != 1 or len(outputs[0].shape) != 3:
        return None
    k = outputs[0].shape[1]
    if not isinstance(k, int) or k < 1:
        raise EdgeError(f"{onnx_path}: output {OUTPUT_NAME!r} of a chunk of actions must have "
                        f"shape (batch, k, act_dim) with a fixed k (value: {outputs[0].shape})")
    return k


def _image_shape(onnx_path: Path, arg: onnxruntime.NodeArg) -> tuple[int, int, int]:
    """One sample's (height, width, 3) of the image input ``arg``, checked for name and type."""
    if not arg.name.endswith(IMAGE_SUFFIX) or arg.name == IMAGE_SUFFIX:
        raise EdgeError(f"{onnx_path}: graph input {arg.name!r} is neither {INPUT_NAME!r} nor "
                        f"a camera image '<camera>{IMAGE_SUFFIX}'")
    if arg.type != "tensor(uint8)":
        raise EdgeError(f"{onnx_path}: input {arg.name!r} must be tensor(uint8) (value: "
                        f"{arg.type})")
    shape = arg.shape
    if len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]) \
            or shape[3] != 3:
        raise EdgeError(f"{onnx_path}: input {arg.name!r} must have shape (batch, height, "
                        f"width, 3) with a fixed image size (value: {shape})")
    return (shape[1], shape[2], shape[3])

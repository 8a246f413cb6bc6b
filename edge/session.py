"""ONNX Runtime sessions over exported policies: the fixed I/O names and CPU session setup.

A state policy's graph maps one float tensor ``obs`` (batch, obs_dim) to ``actions``
(batch, act_dim). A policy that sees also takes one uint8 tensor per camera image,
``<camera>_image`` (batch, height, width, 3), RGB, HWC; its image scaling is inside the graph.

A diffusion policy's graph (its metadata ``physai.diffusion``,
:data:`edge.runtime.DIFFUSION_METADATA`) reads the last n observations, ``obs`` (batch, n,
obs_dim) and each image (batch, n, H, W, 3), with its ``noise`` and ``schedule``, and emits a
chunk; it runs through :meth:`PolicySession.sampler` (:class:`edge.runtime.DiffusionSampler`),
not :meth:`PolicySession.run`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.errors import EdgeError
from edge.runtime import (
    DIFFUSION_METADATA,
    NOISE_NAME,
    SCHEDULE_NAME,
    DiffusionSampler,
    diffusion_problem,
)
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
    diffusion: Mapping[str, Any] | None = None
    """A diffusion policy's sampling (the graph's ``physai.diffusion`` metadata); None for any
    other policy."""

    @property
    def history(self) -> int:
        """Observations one query reads: a diffusion policy's ``n_obs_steps``, else 1."""
        return int(self.diffusion["n_obs_steps"]) if self.diffusion is not None else 1

    def sampler(self, steps: int | None = None) -> DiffusionSampler:
        """A diffusion policy's sampler over this session, with ``steps`` denoising steps
        (default: its own); a fresh history and a freshly seeded generator each call."""
        if self.diffusion is None:
            raise EdgeError("the policy is not a diffusion policy: call run")
        session = self.session
        try:
            return DiffusionSampler(lambda feed: session.run([OUTPUT_NAME], feed)[0],
                                    self.diffusion, self.act_dim, steps)
        except ValueError as exc:
            raise EdgeError(str(exc)) from None

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every input the graph reads: ``obs``, then the image inputs."""
        return (INPUT_NAME, *self.images)

    def run(self, obs: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
        """Actions for a batch of observations: the state alone, (batch, obs_dim) float32, or
        a mapping of every input by name (images (batch, H, W, 3) uint8).
        Shape: -> (batch, act_dim), or (batch, k, act_dim) for a chunk of k actions."""
        if self.diffusion is not None:
            raise EdgeError("a diffusion policy keeps a history and draws noise: run it "
                            "through sampler()")
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
    diffusion = _diffusion(onnx_path, session)
    history = diffusion is not None
    inputs = [arg for arg in session.get_inputs()
              if not (history and arg.name in (NOISE_NAME, SCHEDULE_NAME))]
    images = {arg.name: _image_shape(onnx_path, arg, history) for arg in inputs
              if arg.name != INPUT_NAME}
    state = [arg for arg in inputs if arg.name == INPUT_NAME]
    obs_dim = _feature_dim(onnx_path, state, INPUT_NAME, "input", chunked=history)
    outputs = session.get_outputs()
    chunk = _chunk_size(onnx_path, outputs)
    act_dim = _feature_dim(onnx_path, outputs, OUTPUT_NAME, "output", chunked=chunk is not None)
    if diffusion is not None and chunk != diffusion["n_action_steps"]:
        raise EdgeError(f"{onnx_path}: a diffusion graph's actions must be (batch, "
                        f"n_action_steps {diffusion['n_action_steps']}, act_dim) (value: "
                        f"{outputs[0].shape})")
    return PolicySession(session, obs_dim, act_dim, session.get_providers()[0], images, chunk,
                         diffusion)


def _diffusion(onnx_path: Path, session: onnxruntime.InferenceSession) -> dict[str, Any] | None:
    """The graph's diffusion metadata, checked (:func:`edge.runtime.diffusion_problem`) with
    its ``noise`` and ``schedule`` inputs; None for a graph without it."""
    raw = session.get_modelmeta().custom_metadata_map.get(DIFFUSION_METADATA)
    if raw is None:
        return None
    try:
        spec = json.loads(raw)
    except ValueError:
        spec = None
    problem = diffusion_problem(spec)
    if problem:
        raise EdgeError(f"{onnx_path}: metadata {DIFFUSION_METADATA}: {problem}")
    names = {arg.name for arg in session.get_inputs()}
    if not {NOISE_NAME, SCHEDULE_NAME} <= names:
        raise EdgeError(f"{onnx_path}: a diffusion graph reads {NOISE_NAME!r} and "
                        f"{SCHEDULE_NAME!r} (value: {sorted(names)})")
    return dict(spec)


def _feature_dim(onnx_path: Path, args: list[onnxruntime.NodeArg], name: str, kind: str,
                 *, chunked: bool = False) -> int:
    """Fixed last dimension of the single graph ``kind`` named ``name``, checked for type: of
    shape (batch, features), or with ``chunked`` (batch, k, features) (a chunk of actions, or
    a diffusion policy's history of observations)."""
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


def _image_shape(onnx_path: Path, arg: onnxruntime.NodeArg, history: bool = False
                 ) -> tuple[int, int, int]:
    """One frame's (height, width, 3) of the image input ``arg``, checked for name and type:
    of shape (batch, H, W, 3), or with ``history`` (batch, n, H, W, 3)."""
    if not arg.name.endswith(IMAGE_SUFFIX) or arg.name == IMAGE_SUFFIX:
        raise EdgeError(f"{onnx_path}: graph input {arg.name!r} is neither {INPUT_NAME!r} nor "
                        f"a camera image '<camera>{IMAGE_SUFFIX}'")
    if arg.type != "tensor(uint8)":
        raise EdgeError(f"{onnx_path}: input {arg.name!r} must be tensor(uint8) (value: "
                        f"{arg.type})")
    shape = arg.shape[1:] if history else arg.shape
    if len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]) \
            or shape[3] != 3:
        raise EdgeError(f"{onnx_path}: input {arg.name!r} must have shape (batch, height, "
                        f"width, 3) with a fixed image size (value: {shape})")
    return (shape[1], shape[2], shape[3])

"""Policies: this project's MLP with the observation normalizer inside, and ONNX policies.

A policy trained here is an ``.npz`` file (one array per parameter and a JSON ``__meta__``
entry): byte-identical for identical weights, so its digest is reproducible, and loaded with
``allow_pickle=False``. Its metadata's ``kind`` says which network it holds: the state MLP
(no ``kind``) or a policy that sees (``"vision"``, :mod:`stages.vision`). A policy trained
elsewhere (:mod:`stages.imported`) is stored as an ONNX graph ``obs`` (batch, obs_dim) ->
``actions`` (batch, act_dim), or, for one that sees, with a uint8 (batch, H, W, 3) input per
camera image beside ``obs``. Both are data: loading either runs no code from the file.
:func:`load_actor` runs any of them.
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stages.errors import ConfigError, PhysaiError
from stages.sim.cameras import STATE_KEY

if TYPE_CHECKING:
    import torch
    from torch import nn


PolicyFn = Callable[[np.ndarray], np.ndarray]
"""A policy as a numpy function. Shape: obs (N, obs_dim) float32 -> actions (N, act_dim).
A policy that sees (:class:`SeeingPolicy`) takes the mapping of its named inputs instead."""

PolicyFormat = Literal["npz", "onnx"]
"""How a stored policy is written: this project's network (``npz``) or an ONNX graph."""


@dataclass(frozen=True)
class SeeingPolicy:
    """A policy that reads named tensors: ``act({"obs": ..., "<camera>_image": ...}) ->
    actions`` (N, act_dim) float32 (:mod:`stages.observation`).

    Shapes: ``obs`` (N, obs_dim) float32; each image (N, H, W, 3) uint8.
    """

    inputs: tuple[str, ...]
    """The tensors it reads, the state first: e.g. ``("obs", "front_image")``."""
    run: Callable[[Sequence[np.ndarray]], np.ndarray]
    """The network on the tensors in :attr:`inputs` order."""

    def __call__(self, observation: Any) -> np.ndarray:
        """Actions for ``observation``, a mapping holding every tensor of :attr:`inputs`.

        Raises :class:`~stages.errors.PhysaiError` (one line) for a missing tensor or an image
        that is not uint8.
        """
        if isinstance(observation, np.ndarray):
            raise PhysaiError(f"the policy reads {', '.join(self.inputs)}, not one array")
        missing = [name for name in self.inputs if name not in observation]
        if missing:
            raise PhysaiError(f"the policy reads {', '.join(self.inputs)}; the observation "
                              f"lacks {', '.join(missing)}")
        arrays = [np.ascontiguousarray(observation[STATE_KEY], dtype=np.float32)]
        for name in self.inputs[1:]:
            image = np.ascontiguousarray(observation[name])
            if image.dtype != np.uint8:
                raise PhysaiError(f"image {name!r} must be uint8 (value: {image.dtype})")
            arrays.append(image)
        return self.run(arrays)


OUTPUTS = ("tanh", "clip")
"""How a policy bounds its actions to [-1, 1]: a tanh layer (behaviour cloning) or clipping of
a linear output (PPO's Gaussian mean, which the simulator clips the same way)."""


def build_policy(
    obs_dim: int,
    act_dim: int,
    hidden: tuple[int, ...],
    mean: np.ndarray,
    std: np.ndarray,
    output: str = "tanh",
) -> nn.Module:
    """An MLP ``obs -> actions`` whose first op normalizes with ``mean`` and ``std``.

    Hidden layers use ELU; ``output`` (one of :data:`OUTPUTS`) bounds the last layer.
    Shape: obs (batch, obs_dim) float32 -> actions (batch, act_dim) float32 in [-1, 1].
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    import torch
    from torch import nn

    from stages.vision import elu_mlp

    class NormalizedMLP(nn.Module):
        """MLP with fixed observation normalization and a bounded output."""

        def __init__(self) -> None:
            super().__init__()
            self.obs_mean: torch.Tensor
            self.obs_std: torch.Tensor
            self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
            self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float32))
            self.net = elu_mlp(obs_dim, hidden, act_dim, tanh=output == "tanh")

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net((obs - self.obs_mean) / self.obs_std)
            if output == "clip":
                out = out.clamp(-1.0, 1.0)
            return out

    return NormalizedMLP()


META_KEY = "__meta__"


def save_policy(module: nn.Module, path: Path, meta: dict[str, Any]) -> None:
    """Save weights and architecture metadata as npz: ``obs_dim``, ``act_dim``, ``hidden`` and,
    for a clipped output, ``output``; for a policy that sees, :func:`stages.vision.vision_meta`
    (``kind`` ``"vision"``, ``cameras``, ``encoder_channels``)."""
    arrays = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    arrays[META_KEY] = np.array(json.dumps(meta, sort_keys=True))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_policy(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a policy saved by :func:`save_policy`; no pickle is ever executed."""
    import torch

    try:
        with np.load(path, allow_pickle=False) as blob:
            arrays = {k: blob[k] for k in blob.files}
        meta = json.loads(str(arrays.pop(META_KEY)))
        module = _network(meta, arrays["obs_mean"], arrays["obs_std"])
        module.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, zipfile.BadZipFile) as exc:
        raise ConfigError.one(path, "", path.name, f"not a policy file: {exc}") from None
    module.eval()
    return module, meta


def _network(meta: dict[str, Any], mean: np.ndarray, std: np.ndarray) -> nn.Module:
    """The untrained network ``meta`` describes (by its ``kind``), normalizing with ``mean``
    and ``std``. Raises KeyError, TypeError or ValueError for metadata that describes none."""
    kind = meta.get("kind")
    if kind == "vision":
        from stages.vision import vision_from_meta

        return vision_from_meta(meta, mean, std)
    if kind is not None:
        raise ValueError(f"unknown policy kind {kind!r}")
    return build_policy(int(meta["obs_dim"]), int(meta["act_dim"]),
                        tuple(int(h) for h in meta["hidden"]), mean, std,
                        str(meta.get("output", "tanh")))


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Run the block on one torch thread, without autograd; the thread count is restored."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(threads)


def policy_fn(module: nn.Module) -> Any:
    """Wrap ``module`` as a numpy function ``obs (N, obs_dim) -> actions (N, act_dim)``; a
    module that sees (an ``inputs`` attribute beyond ``obs``, :mod:`stages.vision`) as a
    :class:`SeeingPolicy` of the mapping of those tensors.

    Runs on one torch thread: the simulator's stepping threads own the other cores, and torch's
    spinning worker threads next to them slow a rollout several times over.
    """
    import torch

    inputs = tuple(getattr(module, "inputs", None) or (STATE_KEY,))
    if inputs != (STATE_KEY,):

        def run(arrays: Sequence[np.ndarray]) -> np.ndarray:
            with _one_torch_thread():
                out: torch.Tensor = module(*(torch.from_numpy(a) for a in arrays))
            return out.numpy()

        return SeeingPolicy(inputs, run)

    def act(obs: np.ndarray) -> np.ndarray:
        with _one_torch_thread():
            out: torch.Tensor = module(torch.from_numpy(np.asarray(obs, dtype=np.float32)))
        return out.numpy()

    return act


_ZIP_MAGIC = b"PK\x03\x04"


def policy_format(path: Path) -> PolicyFormat:
    """Whether the policy file at ``path`` is an ``.npz`` MLP (a zip archive) or ONNX."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "npz" if head == _ZIP_MAGIC else "onnx"


def load_actor(path: Path) -> PolicyFn:
    """Any stored policy as ``obs (N, obs_dim) -> actions (N, act_dim)`` (numpy, float32); one
    that sees as a :class:`SeeingPolicy` of its named inputs.

    An ``.npz`` MLP runs in torch (:func:`policy_fn`), an ONNX graph in ONNX Runtime on the CPU
    with one thread. Neither runs code from the file; a file that is neither is a one-line
    :class:`~stages.errors.ConfigError`.
    """
    if policy_format(path) == "npz":
        return policy_fn(load_policy(path)[0])
    return onnx_actor(path)


def onnx_actor(path: Path) -> PolicyFn:
    """An ONNX policy ``obs`` -> ``actions`` run by ONNX Runtime (CPU, one thread, sequential);
    a graph that also reads camera images (uint8 (batch, H, W, 3) inputs) as a
    :class:`SeeingPolicy` whose ``inputs`` are ``obs`` and the graph's image inputs.

    A graph whose batch dimension is fixed (Isaac Lab exports batch 1) is run one observation
    at a time. Shape: obs (N, obs_dim) -> actions (N, act_dim), float32.
    """
    from edge.errors import EdgeError
    from edge.session import OUTPUT_NAME, open_session

    try:
        policy = open_session(path, threads=1)
    except EdgeError as exc:
        raise ConfigError.one(path, "", path.name, f"not a policy file: {exc}") from None
    fixed = policy.session.get_inputs()[0].shape[0]
    rows = fixed if isinstance(fixed, int) else None
    session = policy.session
    names = policy.inputs

    def run(arrays: Sequence[np.ndarray]) -> np.ndarray:
        feed = dict(zip(names, arrays, strict=True))
        if rows is None or len(arrays[0]) == rows:
            out: np.ndarray = session.run([OUTPUT_NAME], feed)[0]
            return out
        parts = [session.run([OUTPUT_NAME], {k: v[i : i + rows] for k, v in feed.items()})[0]
                 for i in range(0, len(arrays[0]), rows)]
        return np.concatenate(parts)

    if policy.images:
        return SeeingPolicy(names, run)

    def act(obs: np.ndarray) -> np.ndarray:
        return run([np.ascontiguousarray(obs, dtype=np.float32)])

    return act

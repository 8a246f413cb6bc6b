"""Policies: this project's MLP with the observation normalizer inside, and ONNX policies.

A policy trained here is an ``.npz`` file (one array per parameter and a JSON ``__meta__``
entry): byte-identical for identical weights, so its digest is reproducible, and loaded with
``allow_pickle=False``. A policy trained elsewhere (:mod:`stages.imported`) is stored as an
ONNX graph ``obs`` (batch, obs_dim) -> ``actions`` (batch, act_dim). Both are data: loading
either runs no code from the file. :func:`load_actor` runs any of them.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stages.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn


PolicyFn = Callable[[np.ndarray], np.ndarray]
"""A policy as a numpy function. Shape: obs (N, obs_dim) float32 -> actions (N, act_dim)."""

PolicyFormat = Literal["npz", "onnx"]
"""How a stored policy is written: this project's MLP (``npz``) or an ONNX graph."""


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

    class NormalizedMLP(nn.Module):
        """MLP with fixed observation normalization and a bounded output."""

        def __init__(self) -> None:
            super().__init__()
            self.obs_mean: torch.Tensor
            self.obs_std: torch.Tensor
            self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
            self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float32))
            layers: list[nn.Module] = []
            width = obs_dim
            for h in hidden:
                layers += [nn.Linear(width, h), nn.ELU()]
                width = h
            layers.append(nn.Linear(width, act_dim))
            if output == "tanh":
                layers.append(nn.Tanh())
            self.net = nn.Sequential(*layers)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net((obs - self.obs_mean) / self.obs_std)
            if output == "clip":
                out = out.clamp(-1.0, 1.0)
            return out

    return NormalizedMLP()


META_KEY = "__meta__"


def save_policy(module: nn.Module, path: Path, meta: dict[str, Any]) -> None:
    """Save weights and architecture metadata (``obs_dim``, ``act_dim``, ``hidden`` and, for
    a clipped output, ``output``) as npz."""
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
        module = build_policy(int(meta["obs_dim"]), int(meta["act_dim"]),
                              tuple(int(h) for h in meta["hidden"]),
                              arrays["obs_mean"], arrays["obs_std"],
                              str(meta.get("output", "tanh")))
        module.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, zipfile.BadZipFile) as exc:
        raise ConfigError.one(path, "", path.name, f"not a policy file: {exc}") from None
    module.eval()
    return module, meta


def policy_fn(module: nn.Module) -> Any:
    """Wrap ``module`` as a numpy function ``obs (N, obs_dim) -> actions (N, act_dim)``.

    Runs on one torch thread: the simulator's stepping threads own the other cores, and torch's
    spinning worker threads next to them slow a rollout several times over.
    """
    import torch

    def act(obs: np.ndarray) -> np.ndarray:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                out: torch.Tensor = module(torch.from_numpy(np.asarray(obs, dtype=np.float32)))
        finally:
            torch.set_num_threads(threads)
        return out.numpy()

    return act


_ZIP_MAGIC = b"PK\x03\x04"


def policy_format(path: Path) -> PolicyFormat:
    """Whether the policy file at ``path`` is an ``.npz`` MLP (a zip archive) or ONNX."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "npz" if head == _ZIP_MAGIC else "onnx"


def load_actor(path: Path) -> PolicyFn:
    """Any stored policy as ``obs (N, obs_dim) -> actions (N, act_dim)`` (numpy, float32).

    An ``.npz`` MLP runs in torch (:func:`policy_fn`), an ONNX graph in ONNX Runtime on the CPU
    with one thread. Neither runs code from the file; a file that is neither is a one-line
    :class:`~stages.errors.ConfigError`.
    """
    if policy_format(path) == "npz":
        return policy_fn(load_policy(path)[0])
    return onnx_actor(path)


def onnx_actor(path: Path) -> PolicyFn:
    """An ONNX policy ``obs`` -> ``actions`` run by ONNX Runtime (CPU, one thread, sequential).

    A graph whose batch dimension is fixed (Isaac Lab exports batch 1) is run one observation
    at a time. Shape: obs (N, obs_dim) -> actions (N, act_dim), float32.
    """
    from edge.errors import EdgeError
    from edge.session import INPUT_NAME, OUTPUT_NAME, open_session

    try:
        policy = open_session(path, threads=1)
    except EdgeError as exc:
        raise ConfigError.one(path, "", path.name, f"not a policy file: {exc}") from None
    fixed = policy.session.get_inputs()[0].shape[0]
    rows = fixed if isinstance(fixed, int) else None
    session = policy.session

    def act(obs: np.ndarray) -> np.ndarray:
        batch = np.ascontiguousarray(obs, dtype=np.float32)
        if rows is None or len(batch) == rows:
            out: np.ndarray = session.run([OUTPUT_NAME], {INPUT_NAME: batch})[0]
            return out
        parts = [session.run([OUTPUT_NAME], {INPUT_NAME: batch[i : i + rows]})[0]
                 for i in range(0, len(batch), rows)]
        return np.concatenate(parts)

    return act

"""The policy network: an MLP with the observation normalizer inside, saved without pickle."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn


def build_policy(
    obs_dim: int, act_dim: int, hidden: tuple[int, ...], mean: np.ndarray, std: np.ndarray
) -> nn.Module:
    """An MLP ``obs -> actions`` whose first op normalizes with ``mean`` and ``std``.

    Shape: obs (batch, obs_dim) float32 -> actions (batch, act_dim) float32 in [-1, 1].
    """
    import torch
    from torch import nn

    class NormalizedMLP(nn.Module):
        """MLP with fixed observation normalization and a tanh output."""

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
            layers += [nn.Linear(width, act_dim), nn.Tanh()]
            self.net = nn.Sequential(*layers)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net((obs - self.obs_mean) / self.obs_std)
            return out

    return NormalizedMLP()


def save_policy(module: nn.Module, path: Path, meta: dict[str, Any]) -> None:
    """Save weights and architecture metadata as tensors and plain types only."""
    import torch

    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    torch.save({"state_dict": state, "meta": meta}, path)


def load_policy(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a policy saved by :func:`save_policy` (``weights_only``: no pickle execution)."""
    import torch

    blob = torch.load(path, map_location="cpu", weights_only=True)
    meta = blob["meta"]
    state = blob["state_dict"]
    module = build_policy(
        meta["obs_dim"],
        meta["act_dim"],
        tuple(meta["hidden"]),
        state["obs_mean"].numpy(),
        state["obs_std"].numpy(),
    )
    module.load_state_dict(state)
    module.eval()
    return module, meta


def policy_fn(module: nn.Module) -> Any:
    """Wrap ``module`` as a numpy function ``obs (N, obs_dim) -> actions (N, act_dim)``."""
    import torch

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out: torch.Tensor = module(torch.from_numpy(np.asarray(obs, dtype=np.float32)))
        return out.numpy()

    return act

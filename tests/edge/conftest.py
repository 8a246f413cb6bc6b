"""Shared fixtures: a tiny normalised MLP policy, observations drawn around its data, its export.

Tests get everything through fixtures, so they import nothing from this file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.export import export_onnx

OBS_DIM = 11
ACT_DIM = 3


class NormalizedMLP(torch.nn.Module):
    """Observation normaliser (mean/std buffers) followed by a small tanh MLP."""

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(self, mean: np.ndarray, std: np.ndarray, hidden: int = 32) -> None:
        super().__init__()
        self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float32))
        self.net = torch.nn.Sequential(
            torch.nn.Linear(OBS_DIM, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, ACT_DIM),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Shape: (batch, OBS_DIM) -> (batch, ACT_DIM)."""
        return self.net((obs - self.obs_mean) / self.obs_std)


@pytest.fixture(scope="session")
def dataset_obs() -> np.ndarray:
    """Observations with per-dimension offsets and scales. Shape: (512, OBS_DIM)."""
    rng = np.random.default_rng(7)
    mean = rng.uniform(-3.0, 3.0, OBS_DIM)
    std = rng.uniform(0.1, 4.0, OBS_DIM)
    return (mean + std * rng.standard_normal((512, OBS_DIM))).astype(np.float32)


@pytest.fixture(scope="session")
def obs_dim() -> int:
    """Observation size of every policy here."""
    return OBS_DIM


@pytest.fixture(scope="session")
def act_dim() -> int:
    """Action size of every policy here."""
    return ACT_DIM


@pytest.fixture(scope="session")
def make_policy(dataset_obs: np.ndarray) -> Callable[[int], torch.nn.Module]:
    """Factory of fresh policies normalised with the statistics of ``dataset_obs``, by seed."""

    def make(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return NormalizedMLP(dataset_obs.mean(axis=0), dataset_obs.std(axis=0) + 1e-6)

    return make


@pytest.fixture(scope="session")
def policy(make_policy: Callable[[int], torch.nn.Module]) -> torch.nn.Module:
    """The shared policy; tests must not change its weights."""
    return make_policy(0)


@pytest.fixture(scope="session")
def onnx_path(policy: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared policy exported once for the session."""
    return export_onnx(policy, OBS_DIM, tmp_path_factory.mktemp("export") / "policy.onnx")


@pytest.fixture(scope="session")
def manifest_fields(policy: torch.nn.Module) -> dict[str, object]:
    """Every manifest field the package stage writes (but files, format and engine), for the
    shared policy on Jetson AGX Orin."""
    from tests.support import policy_manifest_fields

    state = policy.state_dict()
    return policy_manifest_fields(state["obs_mean"].tolist(), state["obs_std"].tolist(), ACT_DIM)


@pytest.fixture(scope="session")
def policy_bundle(
    onnx_path: Path,
    dataset_obs: np.ndarray,
    manifest_fields: dict[str, object],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The shared policy packed as the package stage packs it (all members, Orin target)."""
    from edge.calibration import draw_calibration_set
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target

    out = tmp_path_factory.mktemp("bundle") / "policy.bundle.tar"
    pack_policy_bundle(out, onnx_path, draw_calibration_set(dataset_obs, 256), "dataset "
                       "observations", manifest_fields, get_target("jetson-agx-orin"))
    return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Two signing key pairs, ``ours`` and ``foreign``: (private PEM, public PEM) each."""
    from tests.support import keypair

    folder = tmp_path_factory.mktemp("keys")
    return {name: keypair(folder, name) for name in ("ours", "foreign")}


@pytest.fixture
def pack(onnx_path: Path, dataset_obs: np.ndarray, manifest_fields: dict[str, object],
         tmp_path: Path) -> Callable[..., Path]:
    """``pack(name, key=None, **manifest_fields)``: the policy packed as ``NAME.tar``, signed
    with the private key ``key`` when given."""
    from edge.calibration import draw_calibration_set
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target

    def make(name: str, key: Path | None = None, **fields: object) -> Path:
        out = tmp_path / f"{name}.tar"
        pack_policy_bundle(out, onnx_path, draw_calibration_set(dataset_obs, 64), "dataset",
                           {**manifest_fields, **fields}, get_target("jetson-agx-orin"),
                           signing_key=key)
        return out

    return make


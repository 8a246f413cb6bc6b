"""Parity between torch and ONNX Runtime, on dataset and out-of-distribution observations."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.errors import EdgeError
from edge.verify import ParityReport, check_parity, ood_probes

TOLERANCE = 1e-5


def test_parity_on_dataset_observations(
    policy: torch.nn.Module, onnx_path: Path, dataset_obs: np.ndarray
) -> None:
    report = check_parity(policy, onnx_path, dataset_obs, tolerance=TOLERANCE, batch_size=100)
    assert report.passed and report.samples == len(dataset_obs)
    assert 0.0 <= report.mean_abs_diff <= report.max_abs_diff <= TOLERANCE


def test_parity_on_ood_probes(
    policy: torch.nn.Module, onnx_path: Path, dataset_obs: np.ndarray
) -> None:
    probes = ood_probes(dataset_obs, 256, seed=3)
    report = check_parity(policy, onnx_path, probes, tolerance=TOLERANCE)
    assert report.passed and report.max_abs_diff <= TOLERANCE


def test_parity_catches_different_weights(
    policy: torch.nn.Module, onnx_path: Path, dataset_obs: np.ndarray
) -> None:
    drifted = copy.deepcopy(policy)
    with torch.no_grad():
        last = drifted.get_submodule("net.4")
        assert isinstance(last, torch.nn.Linear)
        last.bias.add_(1e-3)
    report = check_parity(drifted, onnx_path, dataset_obs, tolerance=TOLERANCE)
    assert not report.passed and report.max_abs_diff == pytest.approx(1e-3, rel=1e-2)
    assert report == ParityReport(
        report.max_abs_diff, report.mean_abs_diff, len(dataset_obs), TOLERANCE, False
    )


def test_non_finite_actions_fail_parity(
    policy: torch.nn.Module, onnx_path: Path, obs_dim: int
) -> None:
    obs = np.full((2, obs_dim), np.nan, dtype=np.float32)
    report = check_parity(policy, onnx_path, obs, tolerance=TOLERANCE)
    assert report.max_abs_diff == float("inf") and not report.passed


def test_parity_leaves_training_flag(
    policy: torch.nn.Module, onnx_path: Path, dataset_obs: np.ndarray
) -> None:
    policy.train()
    try:
        check_parity(policy, onnx_path, dataset_obs[:4], tolerance=TOLERANCE)
        assert policy.training
    finally:
        policy.eval()


@pytest.mark.parametrize(
    ("obs_shape", "tolerance", "fragment"),
    [
        ((4, 5), TOLERANCE, "must have shape (samples >= 1, 11)"),
        ((0, 11), TOLERANCE, "must have shape"),
        ((11,), TOLERANCE, "must have shape"),
        ((4, 11), -1.0, "tolerance must be finite and >= 0"),
        ((4, 11), float("nan"), "tolerance must be finite and >= 0"),
    ],
)
def test_parity_refuses_bad_arguments(
    policy: torch.nn.Module,
    onnx_path: Path,
    obs_shape: tuple[int, ...],
    tolerance: float,
    fragment: str,
) -> None:
    with pytest.raises(EdgeError, match=re.escape(fragment)):
        check_parity(policy, onnx_path, np.zeros(obs_shape), tolerance=tolerance)


def test_parity_refuses_missing_model(
    policy: torch.nn.Module, dataset_obs: np.ndarray, tmp_path: Path
) -> None:
    with pytest.raises(EdgeError, match="ONNX file not found"):
        check_parity(policy, tmp_path / "absent.onnx", dataset_obs, tolerance=TOLERANCE)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(EdgeError, match="ONNX Runtime cannot load it") as caught:
        check_parity(policy, garbage, dataset_obs, tolerance=TOLERANCE)
    assert "\n" not in str(caught.value)


def test_ood_probes_lie_outside_the_data_range(dataset_obs: np.ndarray) -> None:
    probes = ood_probes(dataset_obs, 500, seed=11)
    assert probes.shape == (500, dataset_obs.shape[1]) and probes.dtype == np.float32
    low, high = dataset_obs.min(axis=0), dataset_obs.max(axis=0)
    centre, half = (low + high) / 2, (high - low) / 2
    distance = np.abs(probes - centre) / half
    assert distance.min() >= 3.0 - 1e-4 and distance.max() <= 5.0 + 1e-4
    assert ((probes < low) | (probes > high)).all()
    assert (probes < centre).any(axis=0).all() and (probes > centre).any(axis=0).all()


def test_ood_probes_are_seeded(dataset_obs: np.ndarray) -> None:
    first = ood_probes(dataset_obs, 8, seed=5)
    np.testing.assert_array_equal(first, ood_probes(dataset_obs, 8, seed=5))
    assert not np.array_equal(first, ood_probes(dataset_obs, 8, seed=6))


def test_ood_probes_on_a_constant_dimension() -> None:
    obs = np.zeros((4, 2), dtype=np.float32)
    obs[:, 1] = [0.0, 1.0, 2.0, 3.0]
    probes = ood_probes(obs, 64, seed=0)
    assert (np.abs(probes[:, 0]) >= 3.0).all() and (np.abs(probes[:, 0]) <= 5.0).all()


@pytest.mark.parametrize(
    ("obs", "n"),
    [
        (np.zeros((0, 3)), 4),
        (np.zeros(3), 4),
        (np.array([[np.inf, 0.0]]), 4),
        (np.zeros((2, 3)), 0),
    ],
)
def test_ood_probes_refuse_bad_input(obs: np.ndarray, n: int) -> None:
    with pytest.raises(EdgeError):
        ood_probes(obs, n, seed=0)

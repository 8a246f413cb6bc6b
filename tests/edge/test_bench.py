"""Latency reports for ONNX Runtime and torch eager at batch 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edge.bench import LatencyReport, onnx_latency, torch_latency
from edge.errors import EdgeError


def _sane(report: LatencyReport, iters: int) -> None:
    assert report.iters == iters
    assert 0.0 < report.p50_us <= report.p99_us
    assert report.mean_us > 0.0


def test_onnx_latency_report(onnx_path: Path, obs_dim: int) -> None:
    report = onnx_latency(onnx_path, obs_dim, iters=300, warmup=20)
    _sane(report, 300)
    assert report.provider == "CPUExecutionProvider"


def test_torch_latency_report_restores_threads(policy: torch.nn.Module, obs_dim: int) -> None:
    before = torch.get_num_threads()
    report = torch_latency(policy, obs_dim, iters=300, warmup=20, threads=1)
    _sane(report, 300)
    assert report.provider == "torch-eager:cpu"
    assert torch.get_num_threads() == before


def test_latency_refuses_bad_arguments(
    onnx_path: Path, policy: torch.nn.Module, obs_dim: int
) -> None:
    with pytest.raises(EdgeError, match="model takes obs_dim 11"):
        onnx_latency(onnx_path, obs_dim + 1, iters=1)
    with pytest.raises(EdgeError, match="iters >= 1"):
        onnx_latency(onnx_path, obs_dim, iters=0)
    with pytest.raises(EdgeError, match="threads must be at least 1"):
        onnx_latency(onnx_path, obs_dim, threads=0)
    with pytest.raises(EdgeError, match="warmup >= 0"):
        torch_latency(policy, obs_dim, warmup=-1)
    with pytest.raises(EdgeError, match="threads must be at least 1"):
        torch_latency(policy, obs_dim, threads=0)

"""ONNX export: signature, checker, dynamic batch, determinism and refusals."""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edge.errors import EdgeError
from edge.export import export_onnx
from edge.session import open_session


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_export_has_fixed_names_and_dynamic_batch(onnx_path: Path, obs_dim: int) -> None:
    model = onnx.load(onnx_path)
    onnx.checker.check_model(model, full_check=True)
    (graph_input,) = model.graph.input
    (graph_output,) = model.graph.output
    assert (graph_input.name, graph_output.name) == ("obs", "actions")
    dims = [(d.dim_param, d.dim_value) for d in graph_input.type.tensor_type.shape.dim]
    assert dims == [("batch", 0), ("", obs_dim)]
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.opset_import[0].version == 17


def test_export_runs_any_batch_size(
    onnx_path: Path, dataset_obs: np.ndarray, obs_dim: int, act_dim: int
) -> None:
    session = open_session(onnx_path)
    assert (session.obs_dim, session.act_dim) == (obs_dim, act_dim)
    for batch in (1, 7, 300):
        assert session.run(dataset_obs[:batch]).shape == (batch, act_dim)


def test_export_is_byte_deterministic(
    policy: torch.nn.Module, onnx_path: Path, obs_dim: int, tmp_path: Path
) -> None:
    again = export_onnx(policy, obs_dim, tmp_path / "again.onnx")
    clone = export_onnx(copy.deepcopy(policy), obs_dim, tmp_path / "clone.onnx")
    assert _sha256(again) == _sha256(onnx_path) == _sha256(clone)


def test_different_weights_give_different_bytes(
    make_policy: Callable[[int], torch.nn.Module], onnx_path: Path, obs_dim: int, tmp_path: Path
) -> None:
    other = export_onnx(make_policy(1), obs_dim, tmp_path / "other.onnx")
    assert _sha256(other) != _sha256(onnx_path)


def test_export_restores_training_flags(
    make_policy: Callable[[int], torch.nn.Module], obs_dim: int, tmp_path: Path
) -> None:
    module = make_policy(0)
    module.train()
    first_layer = module.get_submodule("net.0")
    first_layer.eval()
    export_onnx(module, obs_dim, tmp_path / "p.onnx")
    assert module.training and not first_layer.training
    assert all(p.requires_grad for p in module.parameters())


class _Flat(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.sum(dim=1)


class _Double(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.double()


class _Broken(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom\nsecond line")


@pytest.mark.parametrize(
    ("module", "fragment"),
    [
        (_Flat(), "float32 of shape (batch, act_dim) (value: torch.float32 (2,)"),
        (_Double(), "(value: torch.float64 (2, "),
        (_Broken(), "policy forward failed: boom"),
    ],
)
def test_bad_policy_is_refused_and_nothing_written(
    module: torch.nn.Module, fragment: str, obs_dim: int, tmp_path: Path
) -> None:
    target = tmp_path / "bad.onnx"
    with pytest.raises(EdgeError, match=re.escape(fragment)) as caught:
        export_onnx(module, obs_dim, target)
    assert "\n" not in str(caught.value) and str(target) in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_bad_obs_dim_is_refused(policy: torch.nn.Module, obs_dim: int, tmp_path: Path) -> None:
    with pytest.raises(EdgeError, match="obs_dim must be at least 1"):
        export_onnx(policy, 0, tmp_path / "p.onnx")
    with pytest.raises(EdgeError, match="policy forward failed"):
        export_onnx(policy, obs_dim + 1, tmp_path / "p.onnx")

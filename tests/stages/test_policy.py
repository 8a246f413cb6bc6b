from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from physai_core.errors import ConfigError
from stages.core.hashing import sha256_file
from stages.policies.local import build_policy, load_policy, policy_fn, save_policy

META = {"obs_dim": 5, "act_dim": 2, "hidden": [16, 16], "task": "reach-v0"}


def make() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_policy(5, 2, (16, 16), np.arange(5, dtype=np.float32), np.full(5, 2.0, np.float32))


def test_round_trip_keeps_outputs(tmp_path: Path) -> None:
    module = make()
    save_policy(module, tmp_path / "p.npz", META)
    loaded, meta = load_policy(tmp_path / "p.npz")
    obs = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    np.testing.assert_array_equal(policy_fn(module)(obs), policy_fn(loaded)(obs))
    assert meta == META


def test_same_weights_give_identical_bytes(tmp_path: Path) -> None:
    save_policy(make(), tmp_path / "a.npz", META)
    save_policy(make(), tmp_path / "b.npz", META)
    assert sha256_file(tmp_path / "a.npz") == sha256_file(tmp_path / "b.npz")


def test_normalizer_is_inside_the_network() -> None:
    module = make()
    obs = np.arange(5, dtype=np.float32)[None]
    shifted = build_policy(5, 2, (16, 16), np.zeros(5, np.float32), np.ones(5, np.float32))
    shifted.load_state_dict({**module.state_dict(), "obs_mean": torch.zeros(5),
                             "obs_std": torch.ones(5)})
    assert not np.allclose(policy_fn(module)(obs), policy_fn(shifted)(obs))
    assert np.abs(policy_fn(module)(obs)).max() <= 1.0


@pytest.mark.parametrize("content", [b"not a zip", b"PK\x03\x04garbage"])
def test_garbage_file_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"bad\.npz"):
        load_policy(path)

"""Demonstration datasets in robomimic-style HDF5, the layout Isaac Lab records and Mimic reads.

::

    data/                      attrs: total (transitions), env_args (JSON), task
      demo_0/                  attrs: num_samples, success, seed
        obs/policy             (T, obs_dim) float32, attr names
        actions                (T, act_dim) float32, attr names
        rewards                (T,) float32
        dones                  (T,) uint8
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stages.errors import ConfigError

OBS_KEY = "policy"


@dataclass(frozen=True)
class Episode:
    """One recorded episode. Shapes: obs (T, obs_dim), actions (T, act_dim), rewards/dones (T,)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    success: bool
    seed: int


def write_dataset(
    path: Path,
    episodes: Sequence[Episode],
    task: str,
    obs_names: Sequence[str],
    action_names: Sequence[str],
    env_args: dict[str, object],
) -> int:
    """Write ``episodes`` to ``path``; returns the number of transitions. Deterministic bytes."""
    import h5py

    total = 0
    with h5py.File(path, "w", track_order=True) as f:
        data = f.create_group("data", track_order=True)
        for i, ep in enumerate(episodes):
            g = data.create_group(f"demo_{i}", track_order=True)
            obs = g.create_group("obs")
            d = obs.create_dataset(OBS_KEY, data=ep.obs.astype(np.float32), track_times=False)
            d.attrs["names"] = json.dumps(list(obs_names))
            a = g.create_dataset("actions", data=ep.actions.astype(np.float32), track_times=False)
            a.attrs["names"] = json.dumps(list(action_names))
            g.create_dataset("rewards", data=ep.rewards.astype(np.float32), track_times=False)
            g.create_dataset("dones", data=ep.dones.astype(np.uint8), track_times=False)
            g.attrs["num_samples"] = len(ep.actions)
            g.attrs["success"] = bool(ep.success)
            g.attrs["seed"] = int(ep.seed)
            total += len(ep.actions)
        data.attrs["total"] = total
        data.attrs["task"] = task
        data.attrs["env_args"] = json.dumps(env_args, sort_keys=True)
    return total


@dataclass(frozen=True)
class Transitions:
    """All transitions of a dataset stacked. Shapes: obs (N, obs_dim), actions (N, act_dim)."""

    obs: np.ndarray
    actions: np.ndarray
    episode_index: np.ndarray


def read_transitions(path: Path, obs_dim: int, act_dim: int) -> Transitions:
    """Read every demo of a dataset, checking the layout; bad files raise :class:`ConfigError`."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise ConfigError.one(path, "", str(path), f"not an HDF5 file: {exc}") from None
    obs_parts, act_parts, idx_parts = [], [], []
    with f:
        if "data" not in f:
            raise ConfigError.one(path, "data", None, "missing group")
        demos = sorted(f["data"].keys(), key=_demo_number)
        if not demos:
            raise ConfigError.one(path, "data", [], "dataset holds no demos")
        for i, name in enumerate(demos):
            g = f["data"][name]
            obs = _read(g, f"obs/{OBS_KEY}", path, name, (obs_dim,))
            act = _read(g, "actions", path, name, (act_dim,))
            if len(obs) != len(act):
                raise ConfigError.one(
                    path, f"data/{name}/actions", act.shape, f"length differs from obs {obs.shape}"
                )
            obs_parts.append(obs)
            act_parts.append(act)
            idx_parts.append(np.full(len(act), i, dtype=np.int64))
    return Transitions(
        np.concatenate(obs_parts), np.concatenate(act_parts), np.concatenate(idx_parts)
    )


def _demo_number(name: str) -> int:
    _, _, n = name.partition("_")
    return int(n) if n.isdigit() else -1


def _read(
    group: object, key: str, path: Path, demo: str, tail: tuple[int, ...]
) -> np.ndarray:
    import h5py

    field = f"data/{demo}/{key}"
    if not isinstance(group, h5py.Group) or key not in group:
        raise ConfigError.one(path, field, None, "missing")
    node = group[key]
    if not isinstance(node, h5py.Dataset):
        raise ConfigError.one(path, field, type(node).__name__, "expected a dataset")
    arr = np.asarray(node[()], dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1:] != tail:
        raise ConfigError.one(path, field, arr.shape, f"expected shape (T, {tail[0]})")
    if not np.isfinite(arr).all():
        raise ConfigError.one(path, field, "NaN/inf", "non-finite values")
    return arr

"""Isaac Lab's own HDF5DatasetFileHandler against this project's ``isaaclab`` format, both ways.

Runs in the Isaac Lab venv (``make test-isaaclab``); skipped where Isaac Lab does not import.
The handler imports kit-less (it needs torch and h5py, not Isaac Sim). Widths are reach-v0's
(23 observations, 7 actions), given as numbers: the task registry is not needed here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("isaaclab")
torch = pytest.importorskip("torch")
datasets = pytest.importorskip("isaaclab.utils.datasets",
                               reason="HDF5DatasetFileHandler does not import kit-less here")

from stages.data import Episode  # noqa: E402
from stages.datasets.formats import Export, check_recording, get_format  # noqa: E402

OBS_DIM, ACT_DIM, STEPS = 23, 7, 12
TERMS = {"joint_pos": 7, "joint_vel": 7, "target": 9}


def recorded(path: Path, episodes: int) -> list[dict[str, np.ndarray]]:
    """Record ``episodes`` episodes the way Isaac Lab's recorder manager does: per step, the
    policy group's terms (``obs/policy/<term>``, not concatenated) and the actions."""
    rng = np.random.default_rng(0)
    handler = datasets.HDF5DatasetFileHandler()
    handler.create(str(path), env_name="Isaac-Reach-Franka-v0")
    written = []
    for i in range(episodes):
        ep = datasets.EpisodeData()
        arrays = {k: rng.normal(size=(STEPS, w)).astype(np.float32) for k, w in TERMS.items()}
        arrays["actions"] = rng.uniform(-1, 1, (STEPS, ACT_DIM)).astype(np.float32)
        for t in range(STEPS):
            ep.add("obs", {"policy": {k: torch.from_numpy(arrays[k][t]) for k in TERMS}})
            ep.add("actions", torch.from_numpy(arrays["actions"][t]))
        ep.seed = 100 + i
        ep.success = i == 0
        ep.pre_export()
        handler.write_episode(ep)
        written.append(arrays)
    handler.flush()
    handler.close()
    return written


def test_handler_recording_imports(tmp_path: Path) -> None:
    path = tmp_path / "teleop.hdf5"
    written = recorded(path, episodes=2)
    keys = ("policy/target", "policy/joint_pos", "policy/joint_vel")
    rec = get_format("isaaclab").read(path, keys)
    episodes = check_recording(path, rec, OBS_DIM, ACT_DIM)
    assert len(episodes) == 2 and rec.obs_keys == keys
    for ep, arrays in zip(episodes, written, strict=True):
        np.testing.assert_array_equal(
            ep.obs, np.concatenate([arrays["target"], arrays["joint_pos"], arrays["joint_vel"]],
                                   axis=1))
        np.testing.assert_array_equal(ep.actions, arrays["actions"])
        assert ep.dones.tolist() == [False] * (STEPS - 1) + [True]
    assert [ep.success for ep in episodes] == [True, False]
    assert [ep.seed for ep in episodes] == [100, 101]


def test_export_loads_with_the_handler(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    episodes = tuple(
        Episode(rng.normal(size=(STEPS, OBS_DIM)).astype(np.float32),
                rng.uniform(-1, 1, (STEPS, ACT_DIM)).astype(np.float32),
                rng.normal(size=STEPS).astype(np.float32), np.arange(STEPS) == STEPS - 1,
                i == 1, 7 + i)
        for i in range(2))
    out = tmp_path / "export.hdf5"
    get_format("isaaclab").write(out, Export(
        episodes, "reach-v0", tuple(f"o{i}" for i in range(OBS_DIM)),
        tuple(f"a{i}" for i in range(ACT_DIM)), 25.0))
    handler = datasets.HDF5DatasetFileHandler()
    handler.open(str(out))
    assert handler.get_num_episodes() == 2 and handler.get_env_name() == "reach-v0"
    assert not handler.is_legacy_quaternion_format()
    for i, ep in enumerate(episodes):
        loaded = handler.load_episode(f"demo_{i}", device="cpu")
        assert loaded is not None
        np.testing.assert_array_equal(loaded.data["obs"]["policy"].numpy(), ep.obs)
        np.testing.assert_array_equal(loaded.data["actions"].numpy(), ep.actions)
        assert bool(loaded.success) == ep.success and int(loaded.seed) == ep.seed
    handler.close()

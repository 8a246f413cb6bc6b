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

from stages.datasets.demonstrations import Episode  # noqa: E402
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


ROOT = Path(__file__).resolve().parents[3]
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"
DEMOS = '''
import sys
import numpy as np
from tests.stages.datasets.demos import reach_gym
env, rng, out = reach_gym(0), np.random.default_rng(0), {}
for i in range(40):
    obs, _ = env.reset(seed=i)
    rows, acts, done = [], [], False
    while not done:
        label = env.expert()
        rows.append(obs)
        acts.append(label)
        obs, _, terminated, truncated, _ = env.step(np.clip(label + rng.normal(0, 0.2, 7), -1, 1))
        done = terminated or truncated
    out[f"obs_{i}"], out[f"actions_{i}"] = np.array(rows), np.array(acts)
np.savez(sys.argv[1], **out)
'''
"""Expert demonstrations of reach-v0 from the project's own venv (MuJoCo 4), where this venv's
MuJoCo cannot run the task: observations (T, 23) and expert labels (T, 7) per episode."""


def test_a_handler_recording_trains_validates_and_promotes_through_flows_run(
    tmp_path: Path,
) -> None:
    """Demonstrations written by Isaac Lab's own handler, observations as the policy group's
    separate terms, go through ``flows run`` of the project: imported, cloned, validated,
    packaged, promoted."""
    import os
    import subprocess

    import yaml

    if not PROJECT_PYTHON.is_file():
        pytest.skip("needs the project's venv (make setup)")
    demos = tmp_path / "demos.npz"
    subprocess.run([str(PROJECT_PYTHON), "-c", DEMOS, str(demos)], cwd=ROOT, check=True,
                   timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    terms = {"joint_pos": slice(0, 7), "joint_vel": slice(7, 14), "task": slice(14, 23)}
    handler = datasets.HDF5DatasetFileHandler()
    handler.create(str(tmp_path / "teleop.hdf5"), env_name="Isaac-Reach-Arm7-v0")
    with np.load(demos) as recorded:
        for i in range(40):
            obs, actions = recorded[f"obs_{i}"], recorded[f"actions_{i}"]
            ep = datasets.EpisodeData()
            for t in range(len(actions)):
                ep.add("obs", {"policy": {k: torch.from_numpy(obs[t, s].astype(np.float32))
                                          for k, s in terms.items()}})
                ep.add("actions", torch.from_numpy(actions[t].astype(np.float32)))
            ep.seed, ep.success = i, True
            ep.pre_export()
            handler.write_episode(ep)
    handler.flush()
    handler.close()
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "reach_tiny.yaml").read_text())
    config["collect"] = {"source": "teleop.hdf5", "format": "isaaclab",
                         "obs_keys": [f"policy/{k}" for k in terms]}
    config["train"]["epochs"] = 5
    config["validate"]["suite"] = str(ROOT / "tests" / "fixtures" / "suite_tiny.yaml")
    config["name"] = config["promote"]["model_name"] = "reach-isaaclab"
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    state = ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL",
             "PHYSAI_MLFLOW_ARTIFACTS", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in state}
    done = subprocess.run(
        [str(PROJECT_PYTHON), "-m", "flows.cli", "run", "pipeline.yaml", "--direct"],
        cwd=tmp_path, env={**env, "PHYSAI_HOME": str(tmp_path / ".physai"), "COLUMNS": "200"},
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "models:/reach-isaaclab/1 -> @champion" in done.stdout, done.stdout[-3000:]

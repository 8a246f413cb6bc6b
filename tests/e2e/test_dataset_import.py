"""Demonstrations recorded by Minari's own DataCollector train and validate a policy through
``flows run`` with ``collect: {source: ..., format: minari}``; the champion's training dataset
exports to Minari (loaded by minari.load_dataset), LeRobot v3 (pyarrow) and Isaac Lab HDF5."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import FIXTURES, CliEnv
from tests.stages.datasets.demos import record_minari

pytestmark = pytest.mark.e2e
MODEL = "reach-imported"


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_minari_recording_trains_validates_and_exports(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], cli_env: CliEnv,
) -> None:
    minari = pytest.importorskip("minari")
    import h5py
    import pyarrow.parquet as pq

    datasets = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))
    record_minari("teleop/reach-v0", episodes=40, noise=0.1)
    recorded = minari.load_dataset("teleop/reach-v0")
    data = yaml.safe_load((FIXTURES / "reach_tiny.yaml").read_text())
    data["name"] = MODEL
    data["collect"] = {"source": str(datasets / "teleop" / "reach-v0"), "format": "minari"}
    data["train"]["epochs"] = 5
    data["validate"]["suite"] = str(FIXTURES / "suite_tiny.yaml")
    data["promote"]["model_name"] = MODEL
    config = tmp_path / "imported.yaml"
    config.write_text(yaml.safe_dump(data))
    env = cli_env(tmp_path / ".physai", MLFLOW_TRACKING_URI=mlflow_server,
                  MINARI_DATASETS_PATH=str(datasets))

    run = flows("run", str(config), env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"models:/{MODEL}/1 -> @champion" in run.stdout, run.stdout[-3000:]

    from flows.cli import main

    for var in ("PHYSAI_HOME", "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(var, env[var])
    out = datasets / "physai" / "reach-v0"
    for fmt, path in (("minari", out), ("lerobot", tmp_path / "lerobot"),
                      ("isaaclab", tmp_path / "isaaclab.hdf5")):
        assert main(["dataset", "export", f"models:/{MODEL}@champion", "--format", fmt,
                     "-o", str(path)]) == 0
    exported = minari.load_dataset("physai/reach-v0")
    assert exported.total_episodes == 40 and exported.total_steps == recorded.total_steps
    for a, b in zip(recorded.iterate_episodes(), exported.iterate_episodes(), strict=True):
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.observations[:-1], b.observations[:-1])
    info = json.loads((tmp_path / "lerobot" / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 40
    frames = pq.read_table(tmp_path / "lerobot" / "data" / "chunk-000" / "file-000.parquet")
    assert len(frames) == recorded.total_steps
    with h5py.File(tmp_path / "isaaclab.hdf5", "r") as f:
        assert f.attrs["format_version"] == 1 and len(f["data"]) == 40
        np.testing.assert_array_equal(f["data/demo_0/actions"][()], recorded[0].actions)

    # The same episodes from the LeRobot and Isaac Lab exports: another source digest, so the
    # import and training run again; the same episodes clone to the same policy, whose
    # validation, package and promotion are then reused from the cache. (Each run is its own
    # process, as a user runs it: Prefect fixes its state folder when first imported.)
    for fmt, path in (("lerobot", tmp_path / "lerobot"), ("isaaclab", tmp_path / "isaaclab.hdf5")):
        data["collect"] = {"source": str(path), "format": fmt}
        config.write_text(yaml.safe_dump(data))
        again = flows("run", str(config), env=env, cwd=tmp_path)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "cached stages: validate-scene, validate, package, promote" in again.stdout, (
            again.stdout[-3000:])

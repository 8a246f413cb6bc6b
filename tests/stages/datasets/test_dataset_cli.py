"""``flows dataset import|inspect|export`` and ``collect: {source: ...}`` configs: bad files
are one line naming the file, the key and the value, exit status 2, nothing published; a good
import is published once, with its lineage in MLflow."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from flows.cli import main
from physai_core.errors import ConfigError
from stages.datasets.formats import Export, get_format
from stages.pipeline.config import load_pipeline
from stages.sim.tasks.catalog import get_task
from tests.conftest import FIXTURES, ROOT
from tests.stages.datasets.demos import TASK, synthetic_episodes


def write(path: Path, fmt: str = "robomimic", **change: np.ndarray) -> Path:
    episodes = synthetic_episodes()
    episodes = (dataclasses.replace(episodes[0], **change), *episodes[1:])
    spec = get_task(TASK)
    get_format(fmt).write(path, Export(episodes, TASK, spec.obs_names, spec.action_names,
                                       spec.control_hz))
    return path


def published(home: Path) -> list[Path]:
    """Every manifest and payload in the store, and anything left in the scratch folders."""
    return [p for d in ("store", "tmp") for p in (home / d).rglob("*") if p.is_file()]


def fails(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> str:
    """Run ``flows`` expecting exit status 2, nothing published; returns the error line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert published(home) == []
    return err


def test_bad_files_name_file_key_and_value(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    wide = write(tmp_path / "wide.hdf5", actions=rng.uniform(-1, 1, (5, 6)).astype(np.float32))
    err = fails(capsys, physai_home, "dataset", "import", str(wide), "--format", "robomimic")
    assert err == (f"flows: error: {wide}: data/demo_0/actions: expected shape (T, 7) "
                   "(value: (5, 6))")
    obs = synthetic_episodes()[0].obs.copy()
    obs[3, 1] = np.inf
    nan = write(tmp_path / "nan.hdf5", obs=obs)
    err = fails(capsys, physai_home, "dataset", "import", str(nan), "--format", "isaaclab")
    assert err == (f"flows: error: {nan}: data/demo_0/obs/policy: non-finite value at step 3, "
                   "entry 1 (value: inf)")
    missing = write(tmp_path / "missing.hdf5")
    with h5py.File(missing, "r+") as f:
        del f["data/demo_1/actions"]
    err = fails(capsys, physai_home, "dataset", "import", str(missing), "--format", "robomimic")
    assert err == f"flows: error: {missing}: data/demo_1/actions: missing (value: None)"
    err = fails(capsys, physai_home, "dataset", "import", str(missing), "--format", "hdf5")
    assert err.startswith(f"flows: error: {missing}: --format: unknown dataset format 'hdf5'; "
                          "valid: isaaclab, lerobot, minari, robomimic")
    folder = write(tmp_path / "lerobot", "lerobot")
    err = fails(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot",
                "--obs-keys", "observation.state,observation.images.top")
    assert err.startswith(f"flows: error: {folder}: data/chunk-000/file-000.parquet:"
                          "observation.images.top: missing column")
    err = fails(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot",
                "--task", "reach-v9")
    assert err.startswith(f"flows: error: {folder}: --task: unknown task 'reach-v9'")
    err = fails(capsys, physai_home, "dataset", "inspect", str(wide))
    assert "data/demo_0/actions: expected shape (T, 7)" in err


def test_import_publishes_once_with_lineage(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    mlflow_server: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    folder = write(tmp_path / "lerobot", "lerobot")
    assert main(["dataset", "import", str(folder), "--format", "lerobot", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["episodes"], out["transitions"], out["task"]) == (3, 15, TASK)
    digest = out["digest"]
    run = MlflowClient(mlflow_server).get_run(out["mlflow_run_id"])
    assert run.data.tags["physai.dataset.source_format"] == "lerobot"
    assert run.data.tags["physai.dataset.source_sha256"] == out["source_sha256"]
    assert run.data.tags["physai.dataset.digest"] == digest
    assert [i.dataset.digest for i in run.inputs.dataset_inputs] == [digest[:36]]
    # the same content under another path and format is the same dataset
    hdf5 = tmp_path / "copy.hdf5"
    assert main(["dataset", "export", digest, "--format", "robomimic", "-o", str(hdf5)]) == 0
    capsys.readouterr()
    assert main(["dataset", "import", str(hdf5), "--format", "robomimic"]) == 0
    assert capsys.readouterr().out.strip() != digest  # another source: another lineage
    assert main(["dataset", "import", str(folder), "--format", "lerobot"]) == 0
    assert capsys.readouterr().out.strip() == digest
    assert main(["dataset", "inspect", f"sha256:{digest}", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["expert"] == f"import:lerobot:sha256:{out['source_sha256']}"
    assert (shown.get("source_sha256"), shown.get("source_format")) == (out["source_sha256"],
                                                                        "lerobot")
    assert shown["verified"] and shown["episodes"] == 3
    assert main(["dataset", "export", digest, "--format", "robomimic", "-o", str(hdf5)]) == 2
    assert "-o: already exists" in capsys.readouterr().err


def config(tmp_path: Path, collect: dict[str, object]) -> Path:
    data = yaml.safe_load((FIXTURES / "reach_tiny.yaml").read_text())
    data["collect"] = collect
    data["validate"]["suite"] = str(FIXTURES / "suite_tiny.yaml")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("collect", "says"), [
    ({"source": "nowhere.hdf5", "format": "robomimic"},
     "collect.source: no such file or folder"),
    ({"source": "demos.hdf5", "format": "rlds"}, "collect.format: unknown dataset format 'rlds'"),
    ({"source": "demos.hdf5"}, "collect: a source file needs its format"),
    ({"source": "demos.hdf5", "format": "robomimic", "episodes": 10},
     "collect: source imports a dataset; episodes applies only to recording"),
    ({"scene": str(ROOT / "sim_scenes/reach/collect.yaml"), "episodes": 4, "format": "minari"},
     "collect: format applies only to an imported source"),
    ({"source": "sha256:" + "ab" * 32, "format": "robomimic"},
     f"collect.source: no dataset {'ab' * 32} in the store"),
])
def test_collect_source_is_checked_with_the_config(
    physai_home: Path, tmp_path: Path, collect: dict[str, object], says: str
) -> None:
    write(tmp_path / "demos.hdf5")
    with pytest.raises(ConfigError) as err:
        load_pipeline(config(tmp_path, collect))
    assert says in str(err.value), str(err.value)


def test_collect_source_cache_key_follows_its_content(physai_home: Path, tmp_path: Path) -> None:
    src = write(tmp_path / "demos.hdf5")
    first = load_pipeline(config(tmp_path, {"source": "demos.hdf5", "format": "robomimic"}))
    (tmp_path / "moved").mkdir()
    src.rename(tmp_path / "moved" / "demos.hdf5")
    moved = load_pipeline(config(tmp_path, {"source": "moved/demos.hdf5",
                                            "format": "robomimic"}))
    assert first.stage_digest("collect") == moved.stage_digest("collect")
    (tmp_path / "moved" / "demos.hdf5").unlink()
    write(tmp_path / "moved" / "demos.hdf5", rewards=np.ones(5, np.float32))
    changed = load_pipeline(config(tmp_path, {"source": "moved/demos.hdf5",
                                              "format": "robomimic"}))
    assert changed.stage_digest("collect") != first.stage_digest("collect")
    assert changed.stages[0] == "collect"


def test_a_registered_format_is_reachable_by_name(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A format registered as a plugin registers (register_format) is what --format and
    collect.format look up."""
    from stages.datasets.formats import FORMATS, DatasetFormat, register_format

    FORMATS.load()
    monkeypatch.setattr(FORMATS, "_items", dict(FORMATS._items))
    register_format(DatasetFormat("team-hdf5", "a team's HDF5", "stages.datasets.hdf5_formats:"
                                  "read_hdf5", "stages.datasets.hdf5_formats:write_robomimic"))
    src = write(tmp_path / "demos.hdf5")
    assert main(["dataset", "inspect", str(src), "--format", "team-hdf5", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["format"], shown["episodes"], shown["task"]) == ("team-hdf5", 3, TASK)
    pipeline = load_pipeline(config(tmp_path, {"source": "demos.hdf5", "format": "team-hdf5"}))
    assert pipeline.collect_source_digest is not None
    err = fails(capsys, physai_home, "dataset", "inspect", str(src), "--format", "team-hdf6")
    assert "valid: isaaclab, lerobot, minari, robomimic, team-hdf5; did you mean 'team-hdf5'" in err

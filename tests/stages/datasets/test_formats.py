"""Every dataset format round-trips through its own library: h5py for Isaac Lab / robomimic
HDF5, pyarrow against LeRobot's published v3 layout, Minari's DataCollector and load_dataset."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from physai_core.errors import ConfigError, UnknownNameError
from stages.artifacts.records import Dataset, Producer
from stages.datasets.formats import Export, check_recording, format_names, get_format
from stages.datasets.importer import (
    convert,
    export_dataset,
    publish_converted,
    read_checked,
    source_digest,
)
from stages.sim.tasks.catalog import get_task
from stages.storage.store import LocalStore
from tests.stages.datasets.demos import ACT_DIM, OBS_DIM, TASK, record_minari, synthetic_episodes

PRODUCER = Producer(stage="import", stage_version="1", config_digest="0" * 64,
                    code_revision="test")


def export_of(episodes: tuple) -> Export:  # type: ignore[type-arg]
    spec = get_task(TASK)
    return Export(episodes, TASK, spec.obs_names, spec.action_names, spec.control_hz)


def stored(tmp_path: Path, source: Path, fmt: str) -> tuple[Dataset, LocalStore]:
    store = LocalStore(tmp_path / "store")
    converted = convert(source, fmt, tmp_path / "scratch", TASK)
    return publish_converted(converted, store, PRODUCER, None), store


def test_registry_lists_the_builtin_formats() -> None:
    assert set(format_names()) >= {"isaaclab", "robomimic", "lerobot", "minari"}
    with pytest.raises(UnknownNameError, match=r"unknown dataset format 'mini'; valid: "
                       r"isaaclab, lerobot, minari, robomimic.*did you mean 'minari'"):
        get_format("mini")


def test_separate_obs_keys_join_in_the_given_or_sorted_order(tmp_path: Path) -> None:
    """An Isaac Lab file with observation terms stored apart (obs/policy/<term>), no rewards,
    no dones: joined by --obs-keys order, or by sorted key without it."""
    rng = np.random.default_rng(1)
    terms = {"joint_vel": rng.normal(size=(6, 7)), "joint_pos": rng.normal(size=(6, 7)),
             "target": rng.normal(size=(6, 9))}
    actions = rng.uniform(-1, 1, (6, ACT_DIM))
    path = tmp_path / "terms.hdf5"
    with h5py.File(path, "w") as f:
        g = f.create_group("data/demo_0")
        for name, value in terms.items():
            g.create_dataset(f"obs/policy/{name}", data=value)
        g.create_dataset("actions", data=actions)
        g.attrs["success"] = True
    _, keys, (ep,) = read_checked(path, "isaaclab", TASK)
    assert keys == ("policy/joint_pos", "policy/joint_vel", "policy/target")
    np.testing.assert_array_equal(ep.obs, np.concatenate(
        [terms["joint_pos"], terms["joint_vel"], terms["target"]], axis=1).astype(np.float32))
    order = ("policy/target", "policy/joint_vel", "policy/joint_pos")
    _, keys, (ep,) = read_checked(path, "isaaclab", TASK, order)
    assert keys == order
    np.testing.assert_array_equal(ep.obs[:, :9], terms["target"].astype(np.float32))
    np.testing.assert_array_equal(ep.rewards, np.zeros(6))
    assert ep.dones.tolist() == [False] * 5 + [True] and ep.success
    with pytest.raises(ConfigError, match=r"data/demo_0/obs/\{policy/joint_pos,policy/target\}:"
                       r" expected shape \(T, 23\) \(value: \(6, 16\)\)"):
        read_checked(path, "isaaclab", TASK, ("policy/joint_pos", "policy/target"))


@pytest.mark.parametrize("fmt", ["robomimic", "isaaclab"])
def test_hdf5_export_reads_back_with_h5py(tmp_path: Path, fmt: str) -> None:
    episodes = synthetic_episodes()
    src = tmp_path / "src.hdf5"
    get_format("robomimic").write(src, export_of(episodes))
    dataset, store = stored(tmp_path, src, "robomimic")
    out = export_dataset(dataset, store, fmt, tmp_path / f"out-{fmt}.hdf5")
    with h5py.File(out, "r") as f:
        assert sorted(f["data"]) == ["demo_0", "demo_1", "demo_2"]
        assert f["data"].attrs["total"] == 15
        assert json.loads(f["data"].attrs["env_args"])["env_name"] == TASK
        for i, ep in enumerate(episodes):
            demo = f[f"data/demo_{i}"]
            np.testing.assert_array_equal(demo["obs/policy"][()], ep.obs)
            np.testing.assert_array_equal(demo["actions"][()], ep.actions)
            assert demo.attrs["num_samples"] == 5 and bool(demo.attrs["success"]) == ep.success
        assert ("format_version" in f.attrs) == (fmt == "isaaclab")


def test_lerobot_export_follows_the_published_v3_layout(tmp_path: Path) -> None:
    """LeRobot does not install here beside the CPU torch: the files are checked with pyarrow
    against the v3.0 layout (meta/info.json, stats.json, tasks.parquet, episodes and data
    parquet files), then imported back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    episodes = synthetic_episodes(n=3, steps=5)
    src = tmp_path / "src.hdf5"
    get_format("robomimic").write(src, export_of(episodes))
    dataset, store = stored(tmp_path, src, "robomimic")
    out = export_dataset(dataset, store, "lerobot", tmp_path / "lerobot")
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == 15
    assert info["total_episodes"] == 3 and info["fps"] == get_task(TASK).control_hz
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    feat = info["features"]
    assert feat["observation.state"]["shape"] == [OBS_DIM]
    assert feat["observation.state"]["names"] == list(get_task(TASK).obs_names)
    assert feat["action"] == {"dtype": "float32", "shape": [ACT_DIM],
                              "names": list(get_task(TASK).action_names)}
    data = pq.read_table(out / "data/chunk-000/file-000.parquet")
    assert set(feat) == set(data.column_names)
    assert data.schema.field("observation.state").type == pa.list_(pa.float32(), OBS_DIM)
    assert data.column("index").to_pylist() == list(range(15))
    assert data.column("frame_index").to_pylist() == [0, 1, 2, 3, 4] * 3
    state = np.array(data.column("observation.state").to_pylist(), np.float32)
    np.testing.assert_array_equal(state, np.concatenate([e.obs for e in episodes]))
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["dataset_from_index"], e["dataset_to_index"], e["length"]) for e in eps] == [
        (0, 5, 5), (5, 10, 5), (10, 15, 5)]
    assert all(e["tasks"] == [TASK] and e["data/file_index"] == 0 for e in eps)
    tasks = pq.read_table(out / "meta/tasks.parquet").to_pylist()
    assert tasks == [{"task_index": 0, "task": TASK}]
    stats = json.loads((out / "meta/stats.json").read_text())
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(0), rtol=1e-5)
    assert stats["action"]["count"] == [15]
    _, _, back = read_checked(out, "lerobot")  # the task comes from tasks.parquet
    for a, b in zip(episodes, back, strict=True):
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.actions, b.actions)
        assert a.success == b.success and a.dones.tolist() == b.dones.tolist()


def test_minari_round_trip_through_minari(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset Minari's DataCollector recorded imports with the arrays Minari reads; the
    export loads with minari.load_dataset and holds the stored episodes."""
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    record_minari("tests/reach-v0", episodes=2)
    recorded = minari.load_dataset("tests/reach-v0")
    dataset, store = stored(tmp_path, tmp_path / "minari" / "tests" / "reach-v0", "minari")
    assert (dataset.episodes, dataset.transitions) == (2, recorded.total_steps)
    assert dataset.expert.startswith("import:minari:sha256:")
    export_dataset(dataset, store, "minari", tmp_path / "minari" / "physai" / "reach-v0")
    exported = minari.load_dataset("physai/reach-v0")
    assert exported.total_episodes == 2 and exported.total_steps == recorded.total_steps
    for a, b in zip(recorded.iterate_episodes(), exported.iterate_episodes(), strict=True):
        np.testing.assert_array_equal(a.observations[:-1], b.observations[:-1])
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6)
        assert b.truncations[-1] and not b.terminations.any()


def test_source_digest_follows_content_not_path(tmp_path: Path) -> None:
    src = tmp_path / "a"
    get_format("lerobot").write(src, export_of(synthetic_episodes()))
    shutil.copytree(src, tmp_path / "b")
    assert source_digest(src) == source_digest(tmp_path / "b")
    (tmp_path / "b" / "meta" / "stats.json").write_text("{}")
    assert source_digest(src) != source_digest(tmp_path / "b")
    one, _ = stored(tmp_path / "x", src, "lerobot")
    two, _ = stored(tmp_path / "y", tmp_path / "a", "lerobot")
    assert one.digest == two.digest


def test_check_names_file_key_and_value(tmp_path: Path) -> None:
    ep = synthetic_episodes(n=1)[0]
    bad = ep.obs.copy()
    bad[2, 4] = np.nan
    path = tmp_path / "nan.hdf5"
    get_format("robomimic").write(path, export_of((dataclasses.replace(ep, obs=bad),)))
    rec = get_format("robomimic").read(path, ())
    with pytest.raises(ConfigError) as err:
        check_recording(path, rec, OBS_DIM, ACT_DIM)
    assert str(err.value) == (f"{path}: data/demo_0/obs/policy: non-finite value at step 2, "
                              "entry 4 (value: nan)")

"""Datasets hold their own bytes, of a size that fits, whatever their format: external HDF5
storage, external links, virtual datasets and symbolic links are refused by every reader
(the built-in ones and a plugin's, at the registry's door), declared shapes are checked before
anything is allocated, and a ``success`` flag is a boolean, never a truthy string. Each refusal
is one line naming the file and what was found, exit status 2, nothing published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flows.cli import main
from physai_core.errors import ConfigError
from stages.datasets.demonstrations import read_transitions
from stages.datasets.formats import Export, RawEpisode, Recording, get_format
from stages.datasets.importer import convert
from stages.sim.tasks.catalog import get_task
from tests.conftest import FIXTURES, ROOT
from tests.stages.datasets.demos import ACT_DIM, OBS_DIM, TASK, synthetic_episodes
from tests.support import minari_zero_episodes

SECRET = np.arange(6 * OBS_DIM, dtype=np.float32).reshape(6, OBS_DIM) / 100
"""What a file outside the dataset holds: finite float32 values, so that a reader that follows
a reference out of the dataset would import them as good observations."""


def published(home: Path) -> list[Path]:
    """Every manifest and payload in the store, and anything left in the scratch folders."""
    return [p for d in ("store", "tmp") for p in (home / d).rglob("*") if p.is_file()]


def refused(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> str:
    """``flows *argv`` exits 2 with one line and publishes nothing; returns the line."""
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert published(home) == []
    return err


def export(path: Path, fmt: str) -> Path:
    spec = get_task(TASK)
    get_format(fmt).write(path, Export(synthetic_episodes(), TASK, spec.obs_names,
                                       spec.action_names, spec.control_hz))
    return path


def steps_env() -> Any:
    """A one-world Gymnasium environment of reach-v0's widths whose episodes end by truncation
    after five steps, for Minari's ``DataCollector`` to record."""
    import gymnasium as gym

    class Steps(gym.Env[np.ndarray, np.ndarray]):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
        t = 0

        def reset(self, *, seed: int | None = None,
                  options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(OBS_DIM, np.float32), {}

        def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool,
                                                    dict[str, Any]]:
            self.t += 1
            return np.full(OBS_DIM, self.t, np.float32), 1.0, False, self.t == 5, {}

    return Steps()


@pytest.fixture
def minari_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Minari dataset of two episodes recorded by Minari's own ``DataCollector``."""
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    collector = minari_zero_episodes(steps_env(), ACT_DIM)
    collector.create_dataset(dataset_id="team/reach-v0", algorithm_name="zeros",
                             description="reach-v0 widths")
    collector.close()
    return tmp_path / "minari" / "team" / "reach-v0"


def _replace(file: Path, node: str, make: Callable[[h5py.File, str, np.ndarray], None]) -> None:
    """Replace dataset ``node`` of an HDF5 file by what ``make(file, node, its data)`` makes."""
    with h5py.File(file, "a") as f:
        data = f[node][()]
        del f[node]
        make(f, node, data)


def _outside(folder: Path, data: np.ndarray) -> Path:
    """An HDF5 file outside the dataset holding ``data`` (shaped as the dataset's) at ``x``."""
    other = folder / "other.hdf5"
    with h5py.File(other, "w") as g:
        g["x"] = np.resize(SECRET, data.shape).astype(data.dtype)
    return other


def external_storage(outside: Path) -> Callable[[h5py.File, str, np.ndarray], None]:
    def make(f: h5py.File, node: str, data: np.ndarray) -> None:
        raw = outside / "secret.bin"
        raw.write_bytes(np.resize(SECRET, data.shape).astype(data.dtype).tobytes())
        f.create_dataset(node, data.shape, data.dtype,
                         external=[(str(raw), 0, h5py.h5f.UNLIMITED)])
    return make


def external_link(outside: Path) -> Callable[[h5py.File, str, np.ndarray], None]:
    def make(f: h5py.File, node: str, data: np.ndarray) -> None:
        f[node] = h5py.ExternalLink(str(_outside(outside, data)), "x")
    return make


def virtual(outside: Path) -> Callable[[h5py.File, str, np.ndarray], None]:
    def make(f: h5py.File, node: str, data: np.ndarray) -> None:
        layout = h5py.VirtualLayout(data.shape, data.dtype)
        layout[...] = h5py.VirtualSource(str(_outside(outside, data)), "x", data.shape)
        f.create_virtual_dataset(node, layout)
    return make


HDF5_TAMPERS = {"external storage": (external_storage, "external"),
                "external link": (external_link, "ExternalLink"),
                "virtual dataset": (virtual, "virtual")}


@pytest.mark.parametrize("tamper", sorted(HDF5_TAMPERS))
def test_minari_import_refuses_data_from_outside_its_file(
    physai_home: Path, tmp_path: Path, minari_dataset: Path, tamper: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    main_data = minari_dataset / "data" / "main_data.hdf5"
    make, found = HDF5_TAMPERS[tamper]
    _replace(main_data, "episode_0/observations", make(outside))
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert err.startswith(f"flows: error: {main_data}: episode_0/observations: "), err
    assert f"(value: '{found}')" in err


def test_minari_import_refuses_symbolic_links(
    physai_home: Path, tmp_path: Path, minari_dataset: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A main_data.hdf5 that is a link to another dataset's file, a data folder that is a link,
    and the dataset folder itself named through a link."""
    main_data = minari_dataset / "data" / "main_data.hdf5"
    elsewhere = tmp_path / "elsewhere.hdf5"
    main_data.rename(elsewhere)
    main_data.symlink_to(elsewhere)
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert err == (f"flows: error: {minari_dataset}: data/main_data.hdf5: a dataset holds only "
                   "its own files and folders (value: 'symbolic link')")
    main_data.unlink()
    elsewhere.rename(main_data)
    (minari_dataset / "data").rename(tmp_path / "data")
    (minari_dataset / "data").symlink_to(tmp_path / "data", target_is_directory=True)
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert f"{minari_dataset}: data: a dataset holds only its own" in err
    (minari_dataset / "data").unlink()
    (tmp_path / "data").rename(minari_dataset / "data")
    link = tmp_path / "link"
    link.symlink_to(minari_dataset, target_is_directory=True)
    err = refused(capsys, physai_home, "dataset", "import", str(link), "--format", "minari",
                  "--task", TASK)
    assert err == (f"flows: error: {link}: the dataset is a symbolic link; name the file or "
                   "folder it points to (value: 'symbolic link')")
    assert main(["dataset", "import", str(minari_dataset), "--format", "minari",
                 "--task", TASK]) == 0


def mark(**kwargs: Any) -> None:
    """An environment's entry point that leaves a file behind: the code a dataset must never
    make run."""
    Path(kwargs["marker"]).write_text("ran")


def test_minari_metadata_cannot_make_an_environment(
    physai_home: Path, tmp_path: Path, minari_dataset: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without its spaces in metadata.json, Minari would make the environment ``env_spec``
    names (importing and calling its entry point) to learn them."""
    meta_file = minari_dataset / "data" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    del meta["observation_space"]
    marker = tmp_path / "ran"
    meta["env_spec"] = json.dumps({
        "id": "Mark-v0", "entry_point": f"{__name__}:mark", "reward_threshold": None,
        "nondeterministic": False, "max_episode_steps": None, "order_enforce": False,
        "disable_env_checker": True, "kwargs": {"marker": str(marker)},
        "additional_wrappers": [], "vector_entry_point": None})
    meta_file.write_text(json.dumps(meta))
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert not marker.exists()
    assert (f"{minari_dataset}: data/metadata.json:observation_space: a dataset must declare "
            "its space") in err


def test_minari_space_of_a_huge_shape_is_refused(
    physai_home: Path, minari_dataset: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    meta_file = minari_dataset / "data" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["observation_space"] = json.dumps({"type": "Box", "dtype": "float32",
                                            "shape": [2**40], "low": 0.0, "high": 1.0})
    meta_file.write_text(json.dumps(meta))
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert ("data/metadata.json:observation_space: declares 8.0 TiB (the bounds of its space), "
            "more than the") in err


def test_minari_success_must_be_a_boolean(
    physai_home: Path, minari_dataset: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with h5py.File(minari_dataset / "data" / "main_data.hdf5", "a") as f:
        f["episode_0"].attrs["success"] = "False"
        f["episode_1"].attrs["success"] = True
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert err == (f"flows: error: {minari_dataset}: episode 0/success: expected true or false "
                   "(value: 'False')")


def test_lerobot_import_refuses_symbolic_links(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A LeRobot folder whose data file, or data folder, is a link to another dataset's, and
    one with a link beside its files; a FIFO is refused without being opened."""
    folder = export(tmp_path / "lerobot", "lerobot")
    other = export(tmp_path / "other", "lerobot")
    data = folder / "data" / "chunk-000" / "file-000.parquet"
    data.unlink()
    data.symlink_to(other / "data" / "chunk-000" / "file-000.parquet")
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert err == (f"flows: error: {folder}: data/chunk-000/file-000.parquet: a dataset holds "
                   "only its own files and folders (value: 'symbolic link')")
    data.unlink()
    (folder / "data" / "chunk-000").rmdir()
    (folder / "data" / "chunk-000").symlink_to(other / "data" / "chunk-000")
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert f"{folder}: data/chunk-000: a dataset holds only its own" in err
    (folder / "data" / "chunk-000").unlink()
    (folder / "data").rmdir()
    (other / "data").rename(folder / "data")
    (folder / "meta" / "notes.txt").symlink_to("/etc/passwd")
    err = refused(capsys, physai_home, "dataset", "inspect", str(folder))
    assert f"{folder}: meta/notes.txt: a dataset holds only its own" in err
    (folder / "meta" / "notes.txt").unlink()
    os.mkfifo(folder / "meta" / "pipe")
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert err == (f"flows: error: {folder}: meta/pipe: a dataset holds only its own files and "
                   "folders (value: 'FIFO')")
    (folder / "meta" / "pipe").unlink()
    assert main(["dataset", "import", str(folder), "--format", "lerobot"]) == 0


def test_lerobot_declared_sizes_are_checked_before_reading(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parquet columns declare their values in the file's footer: 15 frames of 23 float32
    observations are 1380 bytes, more than a limit of 1000."""
    folder = export(tmp_path / "lerobot", "lerobot")
    monkeypatch.setenv("PHYSAI_DATASET_MAX_BYTES", "1000")
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    data = folder / "data" / "chunk-000" / "file-000.parquet"
    assert err == (f"flows: error: {data}: observation.state.list.element: declares 1.3 KiB "
                   "(345 values of FLOAT), more than the 1000 B a dataset may use "
                   "(PHYSAI_DATASET_MAX_BYTES) (value: 345)")
    monkeypatch.setenv("PHYSAI_DATASET_MAX_BYTES", "a lot")
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert err == ("flows: error: PHYSAI_DATASET_MAX_BYTES: expected a positive number of bytes "
                   "(value: 'a lot')")


def test_lerobot_success_must_be_zero_or_one(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    folder = export(tmp_path / "lerobot", "lerobot")
    data = folder / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(data)
    flags = np.zeros(len(table), np.float32)
    flags[4] = 0.5
    table = table.set_column(table.column_names.index("next.success"), "next.success",
                             pa.array(flags))
    pq.write_table(table, data)
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert err == (f"flows: error: {folder}: data/chunk-000/file-000.parquet:next.success: "
                   "expected true or false (0 or 1) at row 4 (value: 0.5)")


@pytest.mark.parametrize("value", ["False", b"False", "no", 2, 0.5, np.array([1, 0])])
def test_hdf5_success_must_be_a_boolean(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: object,
) -> None:
    path = export(tmp_path / "demos.hdf5", "robomimic")
    with h5py.File(path, "a") as f:
        for demo in f["data"].values():
            demo.attrs["success"] = value
    err = refused(capsys, physai_home, "dataset", "import", str(path), "--format", "robomimic")
    assert err.startswith(f"flows: error: {path}: data/demo_0.attrs.success: expected true "
                          "or false (value: ")


@pytest.mark.parametrize(("value", "rate"), [(True, 1.0), (np.uint8(0), 0.0), (1, 1.0),
                                             (np.array([True]), 1.0)])
def test_hdf5_success_as_a_boolean_or_zero_or_one(
    tmp_path: Path, value: object, rate: float,
) -> None:
    path = export(tmp_path / "demos.hdf5", "robomimic")
    with h5py.File(path, "a") as f:
        for demo in f["data"].values():
            demo.attrs["success"] = value
    assert convert(path, "robomimic", tmp_path / "scratch").success_rate == rate


def huge(path: Path) -> Path:
    """A robomimic file of a few KiB whose first demo declares 2**36 observations."""
    export(path, "robomimic")
    with h5py.File(path, "a") as f:
        del f["data/demo_0/obs/policy"]
        f.create_dataset("data/demo_0/obs/policy", shape=(2**36, OBS_DIM), dtype="f4",
                         chunks=(1024, OBS_DIM))
    return path


def test_huge_declared_shape_is_refused_with_its_estimate(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = huge(tmp_path / "huge.hdf5")
    assert path.stat().st_size < 64 * 1024
    err = refused(capsys, physai_home, "dataset", "import", str(path), "--format", "robomimic")
    assert err.startswith(f"flows: error: {path}: data/demo_0/obs/policy: declares 5.8 TiB "
                          "(float32), more than the "), err
    assert err.endswith("a dataset may use (PHYSAI_DATASET_MAX_BYTES) "
                        f"(value: ({2**36}, {OBS_DIM}))"), err
    with pytest.raises(ConfigError, match=r"declares 5\.8 TiB"):
        read_transitions(path, OBS_DIM, ACT_DIM)


def test_many_datasets_count_together(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each demo's arrays fit the limit, all of them do not."""
    path = export(tmp_path / "demos.hdf5", "robomimic")
    monkeypatch.setenv("PHYSAI_DATASET_MAX_BYTES", "1000")
    err = refused(capsys, physai_home, "dataset", "import", str(path), "--format", "robomimic")
    assert err == (f"flows: error: {path}: declares 1.8 KiB (12 datasets together), more than "
                   "the 1000 B a dataset may use (PHYSAI_DATASET_MAX_BYTES) (value: 1875)")


def naive_read(path: Path, obs_keys: tuple[str, ...]) -> Recording:
    """A plugin's reader that trusts its file: reads every demo with h5py as it is."""
    with h5py.File(path, "r") as f:
        episodes = tuple(
            RawEpisode(demo["obs/policy"][()], demo["actions"][()], None, None,
                       demo.attrs.get("success"), None, f"data/{name}/obs/policy",
                       f"data/{name}/actions")
            for name, demo in f["data"].items())
    return Recording(episodes, TASK, ("policy",))


@pytest.fixture
def plugin_format(monkeypatch: pytest.MonkeyPatch) -> str:
    """A format registered as a plugin registers it, reading with :func:`naive_read`."""
    from stages.datasets.formats import FORMATS, DatasetFormat, register_format

    FORMATS.load()
    monkeypatch.setattr(FORMATS, "_items", dict(FORMATS._items))
    register_format(DatasetFormat("team-hdf5", "a team's HDF5", f"{__name__}:naive_read",
                                  "stages.datasets.hdf5_formats:write_robomimic"))
    return "team-hdf5"


@pytest.mark.parametrize("tamper", sorted(HDF5_TAMPERS))
def test_a_plugin_format_is_checked_at_the_registry(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin_format: str,
    tamper: str,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = export(tmp_path / "demos.hdf5", "robomimic")
    make, found = HDF5_TAMPERS[tamper]
    _replace(path, "data/demo_1/obs/policy", make(outside))
    err = refused(capsys, physai_home, "dataset", "import", str(path), "--format", plugin_format)
    assert err.startswith(f"flows: error: {path}: data/demo_1/obs/policy: "), err
    assert f"(value: '{found}')" in err
    err = refused(capsys, physai_home, "dataset", "inspect", str(path), "--format",
                  plugin_format)
    assert f"{path}: data/demo_1/obs/policy: " in err


def test_a_plugin_format_gets_strict_success_and_size_checks(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin_format: str,
) -> None:
    path = export(tmp_path / "demos.hdf5", "robomimic")
    with h5py.File(path, "a") as f:
        f["data/demo_2"].attrs["success"] = "False"
    err = refused(capsys, physai_home, "dataset", "import", str(path), "--format", plugin_format)
    assert err == (f"flows: error: {path}: data/demo_2/success: expected true or false "
                   "(value: 'False')")
    path = huge(tmp_path / "huge.hdf5")
    err = refused(capsys, physai_home, "dataset", "import", str(path), "--format", plugin_format)
    assert "data/demo_0/obs/policy: declares 5.8 TiB (float32)" in err


def pipeline(tmp_path: Path, source: str, fmt: str) -> Path:
    data = yaml.safe_load((FIXTURES / "reach_tiny.yaml").read_text())
    data["collect"] = {"source": source, "format": fmt}
    data["validate"]["suite"] = str(FIXTURES / "suite_tiny.yaml")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_pipeline_source_is_refused_through_a_link(physai_home: Path, tmp_path: Path) -> None:
    """``collect.source`` through ``flows run``: a link inside the folder is refused when the
    config loads, the source named through a link when the collect stage imports it; nothing
    is published either way."""
    folder = export(tmp_path / "lerobot", "lerobot")
    (folder / "meta" / "notes.txt").symlink_to("/etc/passwd")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_HOME",
                        "PREFECT_API_URL", "PHYSAI_MLFLOW_ARTIFACTS")}
    env.update(PHYSAI_HOME=str(physai_home), COLUMNS="200", PYTHONPATH=str(ROOT))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.cli", "run", "pipeline.yaml",
                               "--direct"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, check=False)

    pipeline(tmp_path, "lerobot", "lerobot")
    done = run()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip() == (f"flows: error: {folder}: meta/notes.txt: a dataset holds "
                                   "only its own files and folders (value: 'symbolic link')")
    (folder / "meta" / "notes.txt").unlink()
    (tmp_path / "link").symlink_to(folder, target_is_directory=True)
    pipeline(tmp_path, "link", "lerobot")
    done = run()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip() == ("flows: error: pipeline.yaml: collect.source: is a "
                                   "symbolic link; name the file or folder it points to "
                                   "(value: 'link')")
    assert published(physai_home) == []


def test_deeply_nested_json_is_one_line(
    physai_home: Path, tmp_path: Path, minari_dataset: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """JSON nested deeper than Python's recursion limit, in LeRobot's info.json and in a Minari
    space, is a bad file, not a RecursionError."""
    folder = export(tmp_path / "lerobot", "lerobot")
    (folder / "meta" / "info.json").write_text("[" * 100_000 + "]" * 100_000)
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert err.startswith(f"flows: error: {folder}: meta/info.json: not JSON: nested too deeply")
    meta_file = minari_dataset / "data" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["action_space"] = "[" * 100_000 + "]" * 100_000
    meta_file.write_text(json.dumps(meta))
    err = refused(capsys, physai_home, "dataset", "import", str(minari_dataset), "--format",
                  "minari", "--task", TASK)
    assert err.startswith(f"flows: error: {minari_dataset}: data/metadata.json:action_space: "
                          "not JSON: maximum recursion")

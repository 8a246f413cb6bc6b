"""Camera images in datasets: this project's HDF5 holds them as robomimic does (read back here
with plain h5py the way robomimic's loaders read them), Minari's own collector and reader
carry them both ways, and every import checks them against the task's cameras, one line and
exit status 2 when they do not fit. Tiny episodes; no simulator."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from flows.cli import main
from physai_core.errors import ConfigError
from stages.artifacts.records import Dataset, Producer
from stages.datasets.demonstrations import Episode, read_transitions, write_dataset
from stages.datasets.formats import Export, get_format
from stages.datasets.importer import convert, export_dataset, publish_converted
from stages.sim.env.cameras import CameraSpec
from stages.sim.tasks.catalog import get_task
from stages.storage.store import LocalStore
from tests.stages.datasets.test_dataset_cli import fails
from tests.support import minari_zero_episodes

TASK = "reach-vision-v0"
OBS_DIM, ACT_DIM, SIZE = 17, 7, 64
KEY = "front_image"
CAMERA = "camera 'front' (width 64, height 64)"
PRODUCER = Producer(stage="import", stage_version="1", config_digest="0" * 64,
                    code_revision="test")


def episodes(n: int = 2, steps: int | tuple[int, ...] = 5, size: tuple[int, int] = (SIZE, SIZE),
             dtype: type = np.uint8) -> tuple[Episode, ...]:
    """``n`` random episodes of reach-vision-v0's widths with a ``front_image`` per step."""
    rng = np.random.default_rng(0)
    lengths = steps if isinstance(steps, tuple) else (steps,) * n
    return tuple(
        Episode(rng.normal(size=(t, OBS_DIM)).astype(np.float32),
                rng.uniform(-1, 1, (t, ACT_DIM)).astype(np.float32),
                rng.normal(size=t).astype(np.float32), np.arange(t) == t - 1, i % 2 == 0, i,
                {KEY: rng.integers(0, 256, (t, *size, 3)).astype(dtype)})
        for i, t in enumerate(lengths))


def export_of(eps: tuple[Episode, ...]) -> Export:
    spec = get_task(TASK)
    return Export(eps, TASK, spec.obs_names, spec.action_names, spec.control_hz)


def test_our_hdf5_holds_images_as_robomimic_reads_them(tmp_path: Path) -> None:
    """robomimic's loaders (``FileUtils.get_env_metadata_from_dataset``,
    ``get_shape_metadata_from_dataset``, ``SequenceDataset``) read ``data.attrs["env_args"]``,
    demos sorted by number, ``num_samples`` and ``obs/<key>[()]`` as HWC uint8 frames."""
    eps = episodes(steps=(20, 5), size=(8, 8))
    path = tmp_path / "demos.hdf5"
    get_format("robomimic").write(path, export_of(eps))
    with h5py.File(path, "r") as f:
        env_meta = json.loads(f["data"].attrs["env_args"])
        assert (env_meta["env_name"], env_meta["type"], env_meta["env_kwargs"]) == (TASK, 2, {})
        demos = sorted(f["data"].keys(), key=lambda name: int(name[5:]))
        assert demos == ["demo_0", "demo_1"]
        for demo, ep in zip(demos, eps, strict=True):
            frames = f[f"data/{demo}/obs/{KEY}"][()]
            assert frames.dtype == np.uint8 and frames.shape == (len(ep.actions), 8, 8, 3)
            np.testing.assert_array_equal(frames, ep.images[KEY])
            assert f[f"data/{demo}"].attrs["num_samples"] == len(ep.actions)
            assert f[f"data/{demo}/obs/{KEY}"].shape[1:] == (8, 8, 3)  # robomimic's shape_meta
            node = f[f"data/{demo}/obs/{KEY}"]
            assert node.chunks == (min(len(ep.actions), 16), 8, 8, 3)
            assert (node.compression, node.shuffle) == ("gzip", True)
    again = tmp_path / "again.hdf5"
    get_format("robomimic").write(again, export_of(eps))
    assert again.read_bytes() == path.read_bytes()
    data = read_transitions(path, OBS_DIM, ACT_DIM, (CameraSpec("front", "front", 8, 8),))
    assert data.images[KEY].shape == (25, 8, 8, 3) and data.images[KEY].dtype == np.uint8
    for i, ep in enumerate(eps):
        np.testing.assert_array_equal(data.images[KEY][data.episode_index == i], ep.images[KEY])
        np.testing.assert_array_equal(data.obs[data.episode_index == i], ep.obs)
    assert read_transitions(path, OBS_DIM, ACT_DIM).images == {}


@pytest.mark.parametrize(("camera", "change", "message"), [
    (CameraSpec("front", "front", 8, 6), None,
     "expected shape (5, 6, 8, 3) (T, height, width, channels) of camera 'front' (width 8, "
     "height 6) (value: (5, 8, 8, 3))"),
    (CameraSpec("front", "front", 8, 8), np.float32,
     "expected uint8 frames of camera 'front' (width 8, height 8) (value: 'float32')"),
    (CameraSpec("front", "front", 8, 8, depth=True), None, None),
    (CameraSpec("wrist", "wrist", 8, 8), None, None),
])
def test_training_reads_refuse_camera_tensors_that_do_not_fit(
    tmp_path: Path, camera: CameraSpec, change: type | None, message: str | None
) -> None:
    eps = episodes(size=(8, 8))
    path = tmp_path / "demos.hdf5"
    spec = get_task(TASK)
    write_dataset(path, eps, TASK, spec.obs_names, spec.action_names, {})
    if change is not None:
        with h5py.File(path, "r+") as f:
            frames = f[f"data/demo_1/obs/{KEY}"][()]
            del f[f"data/demo_1/obs/{KEY}"]
            f[f"data/demo_1/obs/{KEY}"] = frames.astype(change)
    demo = 1 if change is not None else 0
    key = f"{camera.name}_depth" if camera.depth else camera.image_key
    with pytest.raises(ConfigError) as err:
        read_transitions(path, OBS_DIM, ACT_DIM, (camera,))
    missing = (f"missing: the task observes through camera {camera.name!r} (width 8, height 8) "
               "(value: None)")
    assert str(err.value) == f"{path}: data/demo_{demo}/obs/{key}: {message or missing}"


def test_an_import_carries_the_task_cameras_and_exports_them_back(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Isaac Lab file of separate observation keys (frames left out of the joined state)
    imports with its images; the stored dataset gives them to training and exports them to
    robomimic's layout and to Minari, whose own reader gives them back."""
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    eps = episodes()
    src = tmp_path / "teleop.hdf5"
    with h5py.File(src, "w") as f:
        for i, ep in enumerate(eps):
            obs = f.create_group(f"data/demo_{i}/obs")
            obs["a_joint_pos"], obs["b_joint_vel"], obs["c_ee"] = np.split(ep.obs, [7, 14], 1)
            obs[KEY] = ep.images[KEY]
            obs["wrist_image"] = ep.images[KEY]  # a camera the task does not declare
            f[f"data/demo_{i}/actions"] = ep.actions
    assert main(["dataset", "import", str(src), "--format", "isaaclab", "--task", TASK,
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["images"] == [KEY] and out["obs_keys"] == ["a_joint_pos", "b_joint_vel", "c_ee"]
    store = LocalStore(physai_home / "store")
    dataset = store.get(out["digest"])
    assert isinstance(dataset, Dataset)
    stored = store.open_payload(dataset)
    data = read_transitions(stored, OBS_DIM, ACT_DIM, get_task(TASK).cameras)
    np.testing.assert_array_equal(data.images[KEY], np.concatenate([e.images[KEY] for e in eps]))
    np.testing.assert_array_equal(data.obs, np.concatenate([e.obs for e in eps]))
    with h5py.File(stored, "r") as f:
        assert sorted(f["data/demo_0/obs"]) == [KEY, "policy"]
    hdf5 = export_dataset(dataset, store, "isaaclab", tmp_path / "out.hdf5")
    with h5py.File(hdf5, "r") as f:
        np.testing.assert_array_equal(f[f"data/demo_1/obs/{KEY}"][()], eps[1].images[KEY])
    assert main(["dataset", "export", out["digest"], "--format", "minari", "-o",
                 str(tmp_path / "minari" / "physai" / "vision-v0")]) == 0
    capsys.readouterr()
    exported = minari.load_dataset("physai/vision-v0")
    assert set(exported.observation_space.spaces) == {"obs", KEY}
    for got, ep in zip(exported.iterate_episodes(), eps, strict=True):
        assert got.observations[KEY].dtype == np.uint8
        np.testing.assert_array_equal(got.observations[KEY][:-1], ep.images[KEY])
        np.testing.assert_array_equal(got.observations["obs"][:-1], ep.obs)
    assert main(["dataset", "inspect", str(tmp_path / "minari" / "physai" / "vision-v0"),
                 "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["task"], shown["obs_keys"]) == (TASK, ["obs"])
    assert shown["images"] == {KEY: {"shape": [SIZE, SIZE, 3], "dtype": "uint8"}}
    assert shown["checked"].endswith(f"camera images {KEY} (64, 64, 3) uint8")


def camera_env() -> Any:
    """A Gymnasium environment of reach-vision-v0's widths whose observation is a ``Dict`` of
    the state and a 64 x 64 camera frame; episodes of 5 steps end by truncation."""
    import gymnasium as gym

    spaces = gym.spaces

    class CameraEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
        observation_space = spaces.Dict({  # type: ignore[assignment]
            "obs": spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
            KEY: spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)})
        action_space = spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
            super().reset(seed=seed)
            self.t = 0
            return self.observe(), {}

        def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool,
                                                    dict[str, Any]]:
            self.t += 1
            return self.observe(), 1.0, False, self.t == 5, {}

        def observe(self) -> dict[str, np.ndarray]:
            frame = np.zeros((SIZE, SIZE, 3), np.uint8)
            frame[:, : 8 * (self.t + 1)] = 40 * self.t
            return {"obs": self.np_random.normal(size=OBS_DIM).astype(np.float32), KEY: frame}

    return CameraEnv()


def test_a_minari_recording_with_images_imports_as_minari_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    collector = minari_zero_episodes(camera_env(), ACT_DIM)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no eval_env, no author: not what this tests
        collector.create_dataset(dataset_id="team/vision-v0", algorithm_name="zeros",
                                 description="a camera dataset")
    collector.close()
    recorded = minari.load_dataset("team/vision-v0")
    store = LocalStore(tmp_path / "store")
    converted = convert(tmp_path / "minari" / "team" / "vision-v0", "minari",
                        tmp_path / "scratch", TASK)
    assert converted.obs_keys == ("obs",) and converted.image_keys == (KEY,)
    dataset = publish_converted(converted, store, PRODUCER, None)
    data = read_transitions(store.open_payload(dataset), OBS_DIM, ACT_DIM,
                            get_task(TASK).cameras)
    for i, ep in enumerate(recorded.iterate_episodes()):
        np.testing.assert_array_equal(data.images[KEY][data.episode_index == i],
                                      ep.observations[KEY][:-1])
        np.testing.assert_array_equal(data.obs[data.episode_index == i],
                                      ep.observations["obs"][:-1])


def minari_buffers(path: Path, eps: tuple[Episode, ...]) -> Path:
    """``eps`` written by ``minari.create_dataset_from_buffers`` as ``team/<path.name>``."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    frames = eps[0].images[KEY]
    space = gym.spaces.Dict({"obs": gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
                             KEY: gym.spaces.Box(0, 255, frames.shape[1:], frames.dtype)})
    buffers = [EpisodeBuffer(
        id=i, observations={"obs": np.concatenate([ep.obs, ep.obs[-1:]]),
                            KEY: np.concatenate([ep.images[KEY], ep.images[KEY][-1:]])},
        actions=ep.actions, rewards=ep.rewards.astype(np.float64),
        terminations=np.zeros(len(ep.actions), bool), truncations=ep.dones)
        for i, ep in enumerate(eps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            f"team/{path.name}", buffers, observation_space=space,
            action_space=gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32),
            algorithm_name="buffers", description="a camera dataset")
    return path


def test_images_that_do_not_fit_the_task_are_one_line(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = tmp_path / "small.hdf5"
    get_format("robomimic").write(small, export_of(episodes(size=(8, 8))))
    err = fails(capsys, physai_home, "dataset", "import", str(small), "--format", "robomimic")
    assert err == (f"flows: error: {small}: data/demo_0/obs/{KEY}: expected shape (5, 64, 64, 3) "
                   f"(T, height, width, channels) of {CAMERA} (value: (5, 8, 8, 3))")
    floats = tmp_path / "floats.hdf5"
    get_format("isaaclab").write(floats, export_of(episodes(dtype=np.float32)))
    err = fails(capsys, physai_home, "dataset", "import", str(floats), "--format", "isaaclab")
    assert err == (f"flows: error: {floats}: data/demo_0/obs/{KEY}: expected uint8 frames of "
                   f"{CAMERA} (value: 'float32')")
    blind = tmp_path / "blind.hdf5"
    get_format("robomimic").write(blind, export_of(tuple(
        dataclasses.replace(ep, images={}) for ep in episodes())))
    err = fails(capsys, physai_home, "dataset", "import", str(blind), "--format", "robomimic")
    assert err == (f"flows: error: {blind}: data/demo_0/obs/{KEY}: missing: the task observes "
                   f"through {CAMERA} (value: None)")
    err = fails(capsys, physai_home, "dataset", "inspect", str(blind), "--task", TASK)
    assert err.endswith(f"data/demo_0/obs/{KEY}: missing: the task observes through {CAMERA} "
                        "(value: None)")
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    folder = minari_buffers(tmp_path / "minari" / "team" / "small-v0", episodes(size=(8, 8)))
    err = fails(capsys, physai_home, "dataset", "import", str(folder), "--format", "minari",
                "--task", TASK)
    assert err == (f"flows: error: {folder}: episode 0/observations/{KEY}: expected shape "
                   f"(5, 64, 64, 3) (T, height, width, channels) of {CAMERA} "
                   "(value: (5, 8, 8, 3))")
    err = fails(capsys, physai_home, "dataset", "import", str(folder), "--format", "minari",
                "--task", TASK, "--obs-keys", f"obs,{KEY}")
    assert err.startswith(f"flows: error: {folder}: observation_space: camera frames are not "
                          f"joined into the state")


def read_without_images(path: Path, obs_keys: tuple[str, ...]) -> Any:
    """A plugin's reader that knows nothing of camera images."""
    from stages.datasets.hdf5_formats import read_hdf5

    return read_hdf5(path, obs_keys)


def test_a_reader_without_images_is_refused_for_a_task_that_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.datasets.formats import FORMATS, DatasetFormat, register_format

    FORMATS.load()
    monkeypatch.setattr(FORMATS, "_items", dict(FORMATS._items))
    register_format(DatasetFormat(
        "state-hdf5", "HDF5 without images", f"{__name__}:read_without_images",
        "stages.datasets.hdf5_formats:write_robomimic"))
    src = tmp_path / "demos.hdf5"
    get_format("robomimic").write(src, export_of(episodes(size=(8, 8))))
    with pytest.raises(ConfigError) as err:
        convert(src, "state-hdf5", tmp_path / "scratch", TASK)
    assert str(err.value) == (f"{src}: --format: this format's reader reads no camera images; "
                              f"the task observes through {KEY} (value: 'state-hdf5')")
    assert not (tmp_path / "scratch").exists()

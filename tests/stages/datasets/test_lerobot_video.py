"""LeRobot v3 datasets with cameras: ``observation.images.<camera>`` as MP4 (AV1, LeRobot's own
encoder settings) written and read back within the codec tolerance (tests/lerobot/frames.py),
the video features and per-episode timestamps as LeRobot writes them, a key map for cameras
named otherwise, frames stored as images, a feature of shape (1,) stored as a number column,
and bad videos refused in one line (exit 2, nothing published). LeRobot's own side of this is
tests/lerobot/, run in the lerobot stage environment."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flows.cli import main
from stages.datasets import lerobot_format
from stages.datasets.demonstrations import Episode
from stages.datasets.formats import Export, get_format
from stages.datasets.importer import read_checked
from stages.datasets.lerobot_reader import read_lerobot
from stages.sim.tasks.catalog import get_task
from tests.lerobot.frames import EPISODES, STEPS, TASK, assert_within_tolerance, episodes
from tests.stages.datasets.test_trust_datasets import refused

FRONT = "observation.images.front"
VIDEO = f"videos/{FRONT}/chunk-000/file-000.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
DATA_FILE = "data/chunk-000/file-000.parquet"


def export(path: Path, size: int = 64) -> dict[str, np.ndarray]:
    """reach-vision-v0 episodes with front-camera frames of ``size`` pixels written at
    ``path``; returns what was written."""
    arrays = episodes(size=size)
    spec = get_task(TASK)
    eps = tuple(
        Episode(arrays[f"obs{i}"], arrays[f"actions{i}"], np.zeros(STEPS, np.float32),
                np.arange(STEPS) == STEPS - 1, i == 0, i, {"front_image": arrays[f"front{i}"]})
        for i in range(EPISODES))
    get_format("lerobot").write(path, Export(eps, TASK, spec.obs_names, spec.action_names,
                                             spec.control_hz))
    return arrays


def rename_camera(path: Path, feature: str) -> None:
    """Store the front camera of the dataset at ``path`` as ``feature`` instead."""
    shutil.move(path / "videos" / FRONT, path / "videos" / feature)
    info = json.loads((path / "meta/info.json").read_text())
    info["features"][feature] = info["features"].pop(FRONT)
    (path / "meta/info.json").write_text(json.dumps(info))
    table = pq.read_table(path / EPISODES_FILE)
    pq.write_table(table.rename_columns([c.replace(FRONT, feature) for c in table.column_names]),
                   path / EPISODES_FILE)


def edit_info(path: Path, change: dict[str, object]) -> None:
    info = json.loads((path / "meta/info.json").read_text())
    info["features"].update(change)
    (path / "meta/info.json").write_text(json.dumps(info))


def test_videos_round_trip_within_the_codec_tolerance(tmp_path: Path) -> None:
    out = tmp_path / "ours"
    arrays = export(out)
    info = json.loads((out / "meta/info.json").read_text())
    assert info["video_path"] == ("videos/{video_key}/chunk-{chunk_index:03d}/"
                                  "file-{file_index:03d}.mp4") and info["fps"] == 25
    front = info["features"][FRONT]
    assert (front["dtype"], front["shape"], front["names"]) == (
        "video", [64, 64, 3], ["height", "width", "channels"])
    assert {k: front["info"][k] for k in ("video.codec", "video.pix_fmt", "video.fps",
                                          "video.g", "video.crf")} == {
        "video.codec": "av1", "video.pix_fmt": "yuv420p", "video.fps": 25, "video.g": 2,
        "video.crf": 30}
    assert (out / VIDEO).is_file()
    eps = pq.read_table(out / EPISODES_FILE).to_pylist()
    assert [(e[f"videos/{FRONT}/from_timestamp"], e[f"videos/{FRONT}/to_timestamp"])
            for e in eps] == [(0.0, 0.8), (0.8, 1.6)]
    assert all(e[f"videos/{FRONT}/file_index"] == 0 for e in eps)
    stats = json.loads((out / "meta/stats.json").read_text())[FRONT]
    assert np.asarray(stats["mean"]).shape == (3, 1, 1) and stats["count"] == [40]
    task, _, back = read_checked(out, "lerobot")  # the task comes from tasks.parquet
    assert task == TASK
    for i, e in enumerate(back):
        np.testing.assert_array_equal(e.actions, arrays[f"actions{i}"])
        np.testing.assert_array_equal(e.obs, arrays[f"obs{i}"])
        assert_within_tolerance(e.images["front_image"], arrays[f"front{i}"])


def test_a_feature_of_shape_one_stored_as_a_number_column_imports(tmp_path: Path) -> None:
    """LeRobot stores a feature of shape (1,) as a plain float column, not a list of one."""
    out = tmp_path / "ours"
    arrays = export(out)
    table = pq.read_table(out / DATA_FILE)
    state = np.array(table.column("observation.state").to_pylist(), np.float32)
    table = table.set_column(0, "observation.state", pa.FixedSizeListArray.from_arrays(
        pa.array(state[:, :16].ravel()), 16))
    table = table.append_column("observation.gripper", pa.array(state[:, 16]))
    pq.write_table(table, out / DATA_FILE)
    edit_info(out, {"observation.state": {"dtype": "float32", "shape": [16], "names": None},
                    "observation.gripper": {"dtype": "float32", "shape": [1], "names": None}})
    alone = read_lerobot(out, ("observation.gripper",))
    assert alone.episodes[0].obs.shape == (STEPS, 1)
    _, _, back = read_checked(out, "lerobot", TASK, ("observation.state", "observation.gripper"))
    for i, e in enumerate(back):
        np.testing.assert_array_equal(e.obs, arrays[f"obs{i}"])


def test_cameras_named_otherwise_import_through_a_key_map(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "top"
    export(out)
    top = "observation.images.top"
    rename_camera(out, top)
    base = ("dataset", "inspect", str(out), "--format", "lerobot", "--task", TASK)
    err = refused(capsys, physai_home, *base)
    assert err == (f"flows: error: {out}: meta/info.json:features: missing: the task's camera "
                   f"'front'; the dataset's cameras: {top} (map one with --camera-keys "
                   f"front=FEATURE) (value: '{FRONT}')")
    assert main([*base, "--camera-keys", f"front={top}", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["images"] == {"front_image": {"shape": [64, 64, 3], "dtype": "uint8"}}
    assert "camera images front_image" in shown["checked"]
    err = refused(capsys, physai_home, *base, "--camera-keys", "front")
    assert err == ("flows: error: --camera-keys: expected CAMERA=FEATURE, e.g. "
                   "front=observation.images.top (value: 'front')")
    hdf5 = tmp_path / "x.hdf5"
    err = refused(capsys, physai_home, "dataset", "import", str(hdf5), "--format", "robomimic",
                  "--camera-keys", f"front={top}")
    assert err.startswith(f"flows: error: {hdf5}: --camera-keys: camera keys are mapped for "
                          "--format lerobot only")


def test_bad_videos_are_refused_in_one_line(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "small"
    export(small, size=32)
    argv = ("dataset", "import", "--format", "lerobot", "--task", TASK)
    err = refused(capsys, physai_home, *argv[:2], str(small), *argv[2:])
    assert err.startswith(f"flows: error: {small}: {VIDEO} (episode 0)/front_image: expected "
                          "shape (20, 64, 64, 3) (T, height, width, channels) of camera "
                          "'front' (width 64, height 64) (value: (20, 32, 32, 3))")
    declared = tmp_path / "declared"
    export(declared)
    edit_info(declared, {FRONT: {**json.loads((declared / "meta/info.json").read_text())[
        "features"][FRONT], "shape": [48, 48, 3]}})
    err = refused(capsys, physai_home, *argv[:2], str(declared), *argv[2:])
    assert err == (f"flows: error: {declared}: {VIDEO}:resolution: meta/info.json declares "
                   f"{FRONT} of shape [48, 48, 3] (height, width, channels) "
                   "(value: [64, 64, 3])")
    short = tmp_path / "short"
    export(short)
    table = pq.read_table(short / EPISODES_FILE)
    column = f"videos/{FRONT}/to_timestamp"
    ends = table.column(column).to_numpy().copy()
    ends[0] -= 1 / 25  # the episode's window holds one frame fewer than its 20 rows
    table = table.set_column(table.column_names.index(column), column, pa.array(ends))
    pq.write_table(table, short / EPISODES_FILE)
    err = refused(capsys, physai_home, *argv[:2], str(short), *argv[2:])
    assert err == (f"flows: error: {short}: {VIDEO} (episode 0):frames: expected 20, the "
                   "episode's length (frames from 0.0000 s to 0.7600 s) (value: 19)")


def test_frames_stored_as_images_read_exactly(tmp_path: Path) -> None:
    """LeRobot without videos stores each frame as PNG bytes in the data (dtype ``image``)."""
    from PIL import Image

    out = tmp_path / "images"
    arrays = export(out)
    shutil.rmtree(out / "videos")
    pngs = []
    for i in range(EPISODES):
        for frame in arrays[f"front{i}"]:
            buf = io.BytesIO()
            Image.fromarray(frame).save(buf, format="PNG")
            pngs.append({"bytes": buf.getvalue(), "path": None})
    table = pq.read_table(out / DATA_FILE)
    pq.write_table(table.append_column(FRONT, pa.array(pngs)), out / DATA_FILE)
    info = json.loads((out / "meta/info.json").read_text())
    info["features"][FRONT]["dtype"] = "image"
    info["video_path"] = None
    (out / "meta/info.json").write_text(json.dumps(info))
    eps = pq.read_table(out / EPISODES_FILE)
    keep = [c for c in eps.column_names if not c.startswith("videos/")]
    pq.write_table(eps.select(keep), out / EPISODES_FILE)
    _, _, back = read_checked(out, "lerobot")
    for i, e in enumerate(back):
        np.testing.assert_array_equal(e.images["front_image"], arrays[f"front{i}"])


def test_collect_camera_keys_map_a_lerobot_source_and_nothing_else(tmp_path: Path) -> None:
    from physai_core.errors import ConfigError
    from stages.pipeline.config import load_pipeline
    from tests.conftest import FIXTURES

    out = tmp_path / "demos"
    export(out)
    rename_camera(out, "observation.images.top")
    base = yaml.safe_load((FIXTURES / "reach_vision_tiny.yaml").read_text())
    base["validate"]["suite"] = str(FIXTURES / base["validate"]["suite"])

    def load(collect: dict[str, object]) -> object:
        (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump({**base, "collect": collect}))
        return load_pipeline(tmp_path / "pipeline.yaml").config.collect

    mapped = {"front": "observation.images.top"}
    cfg = load({"source": "demos", "format": "lerobot", "camera_keys": mapped})
    assert cfg.camera_keys == mapped  # type: ignore[attr-defined]
    with lerobot_format.camera_keys(cfg.camera_keys):  # type: ignore[attr-defined]
        recording = read_lerobot(out, (), ("front_image",))
    assert recording.episodes[0].images["front_image"].shape == (STEPS, 64, 64, 3)
    cases: tuple[tuple[dict[str, object], str], ...] = (
        ({"source": "demos", "format": "robomimic", "camera_keys": mapped},
         "camera_keys applies only to a source of format lerobot"),
        ({"scene": "x.yaml", "episodes": 2, "camera_keys": mapped},
         "camera_keys applies only to an imported source"))
    for collect, problem in cases:
        with pytest.raises(ConfigError, match=problem):
            load(collect)

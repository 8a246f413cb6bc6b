"""LeRobot 0.6.1 itself and this project's LeRobot v3 datasets, both ways: a dataset with videos
that the project exports loads in LeRobot's own ``LeRobotDataset`` with the same actions and
states and the same frames within the codec tolerance (tests/lerobot/frames.py); datasets
LeRobot's own code records (``LeRobotDataset.create``, ``add_frame``, ``save_episode``,
``finalize``), with a feature of shape (1,) and a camera as video or as images, import with
``flows dataset import``. Each episode's instruction is its LeRobot ``task`` both ways."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from tests.lerobot.frames import (
    EPISODES,
    SIZE,
    STEPS,
    TASK,
    assert_within_tolerance,
    episodes,
)

Project = Callable[..., subprocess.CompletedProcess[str]]
FPS = 25
"""reach-vision-v0's control rate."""
COLOURS = ("red", "blue")
"""Episode e's instruction names COLOURS[e % 2]."""


def test_a_dataset_the_project_exports_loads_in_lerobot(tmp_path: Path,
                                                        project: Project) -> None:
    arrays = episodes()
    told = {e: f"reach the {COLOURS[e % len(COLOURS)]} target" for e in range(EPISODES)}
    np.savez(tmp_path / "episodes.npz", **arrays,
             **{f"instruction{e}": np.array(text) for e, text in told.items()})
    project("export", tmp_path / "episodes.npz", tmp_path / "ours")
    # torchcodec cannot load without FFmpeg's shared libraries on this machine; LeRobot falls
    # back to PyAV by itself, named here to keep its warning out of the log.
    ds = LeRobotDataset("physai/reach-vision", root=tmp_path / "ours", video_backend="pyav")
    assert (ds.num_episodes, ds.num_frames, ds.fps) == (EPISODES, EPISODES * STEPS, FPS)
    assert ds.meta.camera_keys == ["observation.images.front"]
    assert ds.meta.features["observation.images.front"]["info"]["video.codec"] == "av1"
    got: dict[str, list[np.ndarray]] = {}
    for i in range(len(ds)):
        item = ds[i]
        e, t = int(item["episode_index"]), int(item["frame_index"])
        assert t == len(got.get(f"actions{e}", []))
        assert item["task"] == told[e]  # the instruction, as LeRobot gives a policy its task
        image = (item["observation.images.front"].permute(1, 2, 0).numpy() * 255).round()
        for key, value in ((f"actions{e}", item["action"].numpy()),
                           (f"obs{e}", item["observation.state"].numpy()),
                           (f"front{e}", image.astype(np.uint8))):
            got.setdefault(key, []).append(value)
    for e in range(EPISODES):
        np.testing.assert_array_equal(np.stack(got[f"actions{e}"]), arrays[f"actions{e}"])
        np.testing.assert_array_equal(np.stack(got[f"obs{e}"]), arrays[f"obs{e}"])
        assert_within_tolerance(np.stack(got[f"front{e}"]), arrays[f"front{e}"])
    # LeRobot's own statistics of the camera: per channel, in 0..1, as it computes them
    stats = ds.meta.stats["observation.images.front"]
    assert np.asarray(stats["mean"]).shape == (3, 1, 1)
    assert 0 < float(np.asarray(stats["mean"]).min()) < 1


def record(root: Path, arrays: dict[str, np.ndarray], camera: str, use_videos: bool) -> None:
    """The episodes of ``arrays`` recorded with LeRobot's own API; reach-vision-v0's 17 state
    numbers as ``observation.state`` (16,) and ``observation.gripper`` (1,), which LeRobot
    stores as a plain number column."""
    features = {
        "observation.state": {"dtype": "float32", "shape": (16,), "names": None},
        "observation.gripper": {"dtype": "float32", "shape": (1,), "names": None},
        "action": {"dtype": "float32", "shape": (7,), "names": None},
        camera: {"dtype": "video" if use_videos else "image", "shape": (SIZE, SIZE, 3),
                 "names": ["height", "width", "channels"]},
    }
    ds = LeRobotDataset.create("local/reach-vision", fps=FPS, features=features, root=root,
                               robot_type="arm", use_videos=use_videos)
    for e in range(EPISODES):
        obs = arrays[f"obs{e}"]
        for t in range(STEPS):
            ds.add_frame({"observation.state": obs[t, :16], "observation.gripper": obs[t, 16:],
                          "action": arrays[f"actions{e}"][t], camera: arrays[f"front{e}"][t],
                          "task": f"reach the {COLOURS[e % len(COLOURS)]} target"})
        ds.save_episode()
    ds.finalize()


@pytest.mark.parametrize(("camera", "use_videos"), [
    ("observation.images.front", True),
    ("observation.images.top", True),
    ("observation.images.front", False),
], ids=["video", "video-key-map", "image"])
def test_a_dataset_lerobot_records_imports(tmp_path: Path, project: Project, flows: Project,
                                           camera: str, use_videos: bool) -> None:
    arrays = episodes(seed=1)
    root = tmp_path / "recorded"
    record(root, arrays, camera, use_videos)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"][camera]["dtype"] == ("video" if use_videos else "image")
    mapped = [] if camera.endswith(".front") else ["--camera-keys", f"front={camera}"]
    obs_keys = "observation.state,observation.gripper"
    done = flows("dataset", "import", root, "--format", "lerobot", "--task", TASK,
                 "--obs-keys", obs_keys, *mapped, "--json")
    imported = json.loads(done.stdout)
    assert (imported["episodes"], imported["transitions"]) == (EPISODES, EPISODES * STEPS)
    assert imported["images"] == ["front_image"] and imported["task"] == TASK
    project("read", root, tmp_path / "read.npz", "--obs-keys", obs_keys,
            *(["--camera-keys", f"front={camera}"] if mapped else []))
    read = np.load(tmp_path / "read.npz")
    for e in range(EPISODES):
        np.testing.assert_array_equal(read[f"obs{e}"], arrays[f"obs{e}"])
        np.testing.assert_array_equal(read[f"actions{e}"], arrays[f"actions{e}"])
        assert str(read[f"instruction{e}"]) == f"reach the {COLOURS[e % len(COLOURS)]} target"
        if use_videos:
            assert_within_tolerance(read[f"front{e}"], arrays[f"front{e}"])
        else:  # PNG in the data: exact
            np.testing.assert_array_equal(read[f"front{e}"], arrays[f"front{e}"])

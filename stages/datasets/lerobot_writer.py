"""Writing checked episodes as a LeRobot v3 dataset folder, with pyarrow and PyAV.

Every episode goes in ``data/chunk-000/file-000.parquet`` (one file, whatever its size), each
camera's frames in one MP4 per camera (AV1, LeRobot's default encoder settings). Each
episode's task (LeRobot's ``task``, the text a policy is instructed with) is its instruction,
or the task id for an episode given none; the task id is also ``robot_type`` and
``physai_task``, and the actions' units ``physai_action_units: normalized``.
``meta/stats.json`` keeps what LeRobot 0.6 keeps per feature (min, max, mean, std, count and
its quantiles). The layout:
:mod:`stages.datasets.lerobot_format`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from physai_core.errors import ConfigError
from stages.datasets.formats import Export
from stages.datasets.lerobot_format import (
    ACTION_KEY,
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    EPISODES_PATH,
    IMAGE_SUFFIX,
    IMAGES_PREFIX,
    INFO_PATH,
    STATE_KEY,
    STATS_PATH,
    TASK_KEY,
    TASKS_PATH,
    UNITS_KEY,
    VIDEO_PATH,
)
from stages.datasets.lerobot_video import encode_video


def _feature(dtype: str, shape: int, names: Sequence[str] | None = None) -> dict[str, Any]:
    return {"dtype": dtype, "shape": [shape], "names": list(names) if names else None}


QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
"""The quantiles LeRobot 0.6 keeps beside min, max, mean and std (its quantile
normalization reads them)."""


def _stats(values: np.ndarray) -> dict[str, list[float]]:
    v = values.reshape(len(values), -1).astype(np.float64)
    return {"min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(),
            "std": v.std(0).tolist(), "count": [len(v)],
            **{k: np.quantile(v, q, axis=0).tolist() for k, q in QUANTILES.items()}}


STATS_FRAMES = 1000
"""Frames an image feature's statistics are computed over at most (evenly spaced), as LeRobot
samples them."""


def _image_stats(frames: np.ndarray) -> dict[str, Any]:
    """Per-channel statistics of (N, H, W, 3) uint8 frames as LeRobot keeps them: values in
    0..1, each of shape (3, 1, 1)."""
    step = max(1, len(frames) // STATS_FRAMES)
    v = frames[::step].reshape(-1, 3).astype(np.float64) / 255.0

    def per_channel(x: np.ndarray) -> list[list[list[float]]]:
        return [[[float(c)]] for c in x]

    return {"min": per_channel(v.min(0)), "max": per_channel(v.max(0)),
            "mean": per_channel(v.mean(0)), "std": per_channel(v.std(0)),
            "count": [len(frames)],
            **{k: per_channel(np.quantile(v, q, axis=0)) for k, q in QUANTILES.items()}}


def _video_features(path: Path, export: Export, lengths: np.ndarray,
                    starts: np.ndarray) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Encode each camera's frames, every episode one after another, as one MP4; returns the
    features, the ``meta/episodes`` columns and the statistics of the video features."""
    import pyarrow as pa

    features: dict[str, Any] = {}
    columns: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    n = len(export.episodes)
    for key in export.episodes[0].images if n else ():
        if not key.endswith(IMAGE_SUFFIX):
            raise ConfigError.one(path, key, "depth", "LeRobot datasets are written with "
                                  "colour cameras only")
        source = IMAGES_PREFIX + key.removesuffix(IMAGE_SUFFIX)
        frames = np.concatenate([e.images[key] for e in export.episodes])
        file = VIDEO_PATH.format(video_key=source, chunk_index=0, file_index=0)
        info = encode_video(path / file, frames, export.control_hz)
        features[source] = {"dtype": "video", "shape": list(frames.shape[1:]),
                            "names": ["height", "width", "channels"], "info": info}
        columns.update({
            f"videos/{source}/chunk_index": pa.array(np.zeros(n, np.int64)),
            f"videos/{source}/file_index": pa.array(np.zeros(n, np.int64)),
            f"videos/{source}/from_timestamp": pa.array(starts / export.control_hz),
            f"videos/{source}/to_timestamp": pa.array((starts + lengths) / export.control_hz),
        })
        stats[source] = _image_stats(frames)
    return features, columns, stats


def episode_tasks(export: Export) -> tuple[list[str], np.ndarray]:
    """The dataset's tasks (each text once, in order of first use) and each episode's index
    among them: its instruction, or the task id for an episode given none."""
    texts = [e.instruction or export.task for e in export.episodes]
    tasks = list(dict.fromkeys(texts))
    return tasks, np.array([tasks.index(t) for t in texts], np.int64)


def _frame_columns(export: Export, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """The per-frame columns beside the state and the actions."""
    eps = export.episodes
    _, task_of = episode_tasks(export)
    total = int(lengths.sum())
    frame = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    return {
        "timestamp": (frame / export.control_hz).astype(np.float32),
        "frame_index": frame,
        "episode_index": np.repeat(np.arange(len(eps), dtype=np.int64), lengths),
        "index": np.arange(total, dtype=np.int64),
        "task_index": np.repeat(task_of, lengths),
        "next.reward": np.concatenate([e.rewards for e in eps]).astype(np.float32),
        "next.done": np.concatenate([e.dones for e in eps]).astype(bool),
        # success is marked on an episode's last frame, as LeRobot's sim datasets mark it
        "next.success": np.concatenate([(np.arange(len(e.actions)) == len(e.actions) - 1)
                                        & e.success for e in eps]),
    }


def write_lerobot(path: Path, export: Export) -> None:
    """Write ``export`` as a LeRobot v3 dataset folder at ``path`` (see the module doc).

    Steps: 1. the data file, one row per frame; 2. the videos; 3. ``meta/episodes``; 4.
    ``meta/tasks.parquet``; 5. ``meta/info.json``, its features; 6. ``meta/stats.json``."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    # -- 1. every episode's frames in one data file
    eps = export.episodes
    lengths = np.array([len(e.actions) for e in eps], np.int64)
    total = int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    obs = np.concatenate([e.obs for e in eps]).astype(np.float32)
    actions = np.concatenate([e.actions for e in eps]).astype(np.float32)
    columns = _frame_columns(export, lengths)
    data = pa.table({
        STATE_KEY: pa.FixedSizeListArray.from_arrays(pa.array(obs.ravel()), obs.shape[1]),
        ACTION_KEY: pa.FixedSizeListArray.from_arrays(pa.array(actions.ravel()),
                                                      actions.shape[1]),
        **{k: pa.array(v) for k, v in columns.items()},
    })
    data_file = path / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True)
    pq.write_table(data, data_file)
    # -- 2. one MP4 per camera, episode after episode
    videos, video_columns, video_stats = _video_features(path, export, lengths, starts)
    # -- 3. each episode's rows, task and video times
    tasks, task_of = episode_tasks(export)
    episodes = pa.table({
        "episode_index": pa.array(np.arange(len(eps), dtype=np.int64)),
        "tasks": pa.array([[tasks[i]] for i in task_of], type=pa.list_(pa.string())),
        "length": pa.array(lengths),
        "data/chunk_index": pa.array(np.zeros(len(eps), np.int64)),
        "data/file_index": pa.array(np.zeros(len(eps), np.int64)),
        "dataset_from_index": pa.array(starts.astype(np.int64)),
        "dataset_to_index": pa.array((starts + lengths).astype(np.int64)),
        **video_columns,
        "meta/episodes/chunk_index": pa.array(np.zeros(len(eps), np.int64)),
        "meta/episodes/file_index": pa.array(np.zeros(len(eps), np.int64)),
    })
    episodes_file = path / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_file.parent.mkdir(parents=True)
    pq.write_table(episodes, episodes_file)
    # -- 4. the tasks (LeRobot keeps them as a pandas frame indexed by the task string)
    pd.DataFrame({"task_index": list(range(len(tasks)))},
                 index=pd.Index(tasks, name="task")).to_parquet(path / TASKS_PATH)
    # -- 5. info.json: the features, the paths and the actions' units
    features = {
        STATE_KEY: _feature("float32", obs.shape[1], export.obs_names),
        ACTION_KEY: _feature("float32", actions.shape[1], export.action_names),
        **videos,
        "next.reward": _feature("float32", 1), "next.done": _feature("bool", 1),
        "next.success": _feature("bool", 1), "timestamp": _feature("float32", 1),
        "frame_index": _feature("int64", 1), "episode_index": _feature("int64", 1),
        "index": _feature("int64", 1), "task_index": _feature("int64", 1),
    }
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": export.task,
        "total_episodes": len(eps), "total_frames": total, "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        # LeRobot's fps is a whole number of frames a second; a rate that is not stays as is.
        "fps": int(export.control_hz) if float(export.control_hz).is_integer()
        else export.control_hz,
        "splits": {"train": f"0:{len(eps)}"},
        "data_path": DATA_PATH, "video_path": VIDEO_PATH if videos else None,
        "features": features, UNITS_KEY: "normalized", TASK_KEY: export.task,
    }
    (path / INFO_PATH).write_text(json.dumps(info, indent=4))
    # -- 6. per-feature statistics, as LeRobot 0.6 keeps them
    stats = {STATE_KEY: _stats(obs), ACTION_KEY: _stats(actions), **video_stats,
             **{k: _stats(v) for k, v in columns.items()}}
    (path / STATS_PATH).write_text(json.dumps(stats, indent=4))

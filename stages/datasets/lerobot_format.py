"""LeRobot v3 datasets, read and written with pyarrow.

LeRobot itself does not install beside this project's CPU torch (every release for Python 3.11
pins an older torch, a CUDA build from PyPI), so the files are read and written here with
pyarrow, following the published v3.0 layout (LeRobot's ``lerobot-dataset-v3`` docs and
``lerobot/datasets/utils.py``)::

    meta/info.json                              codebase_version "v3.0", fps, features, paths
    meta/stats.json                             min, max, mean, std, count per numeric feature
    meta/tasks.parquet                          task (the index) -> task_index
    meta/episodes/chunk-000/file-000.parquet    episode_index, tasks, length,
                                                dataset_from_index, dataset_to_index, ...
    data/chunk-000/file-000.parquet             one row per frame: observation.state, action,
                                                timestamp, frame_index, episode_index, index,
                                                task_index, next.reward, next.done,
                                                next.success

Reading: the observation is ``observation.state``, or the features ``--obs-keys`` names
(e.g. ``observation.state,observation.environment_state``) joined in that order; the action
is ``action``. Rows are grouped by ``episode_index``; each episode's ``frame_index`` must run
0, 1, ..., T-1, and its length must match ``meta/episodes`` when that file is there.
``next.reward``, ``next.done`` and ``next.success`` are used when present (``next.success``
holds booleans, or the numbers 0 and 1: any other value is refused). A single task
string in ``meta/tasks.parquet`` names the task when it is a registered task id. Actions are
the robot's or environment's own (``native``, as LeRobot records them), unless
``meta/info.json`` says otherwise in ``physai_action_units``; a dataset this project wrote says
``normalized`` (one whose ``robot_type`` is its only task was written before that key, and is
too).

Writing puts every episode in ``data/chunk-000/file-000.parquet`` (one file, whatever its
size), names the task id as the only task (and as ``robot_type``) and the actions' units as
``physai_action_units: normalized``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.datasets.formats import Export, RawEpisode, Recording, declared_units, join_obs
from stages.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
UNITS_KEY = "physai_action_units"
"""``meta/info.json`` key that says which units the actions are in (stages/units.py)."""
CHUNKS_SIZE = 1000


def read_lerobot(path: Path, obs_keys: Sequence[str]) -> Recording:
    """Every episode of a LeRobot v3 dataset folder, unchecked (see the module doc)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = _info(path)
    files = sorted((path / "data").glob("**/*.parquet"))
    if not files:
        raise ConfigError.one(path, "data/", [], "no parquet files")
    try:
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError.one(path, "data/", [f.name for f in files],
                              f"unreadable parquet: {exc}") from None
    where = str(files[0].relative_to(path)) if len(files) == 1 else "data/"
    keys = tuple(obs_keys) or (STATE_KEY,)
    obs = join_obs([_matrix(table, k, path, where) for k in keys])
    actions = _matrix(table, ACTION_KEY, path, where)
    episode = _vector(table, "episode_index", path, where).astype(np.int64)
    frame = _vector(table, "frame_index", path, where).astype(np.int64)
    extra = {k: _vector(table, k, path, where) for k in ("next.reward", "next.done",
                                                           "next.success")
             if k in table.column_names}
    success = extra.get("next.success")
    if success is not None and success.dtype != bool:
        bad = np.flatnonzero((success != 0) & (success != 1))
        if len(bad):
            raise ConfigError.one(path, f"{where}:next.success", success[bad[0]].item(),
                                  f"expected true or false (0 or 1) at row {bad[0]}")
    order = np.lexsort((frame, episode))
    bounds = np.flatnonzero(np.diff(episode[order])) + 1
    lengths = _episode_lengths(path)
    episodes = []
    obs_name = keys[0] if len(keys) == 1 else "{" + ",".join(keys) + "}"
    for rows in np.split(order, bounds):
        e = int(episode[rows[0]])
        if not np.array_equal(frame[rows], np.arange(len(rows))):
            raise ConfigError.one(path, f"{where}:frame_index (episode {e})",
                                  frame[rows][:8].tolist(), "expected 0, 1, ..., T-1")
        if lengths is not None and lengths.get(e, len(rows)) != len(rows):
            raise ConfigError.one(path, f"meta/episodes:length (episode {e})", lengths[e],
                                  f"the data holds {len(rows)} frames of this episode")
        episodes.append(RawEpisode(
            obs=obs[rows], actions=actions[rows],
            rewards=extra["next.reward"][rows] if "next.reward" in extra else None,
            dones=extra["next.done"][rows] != 0 if "next.done" in extra else None,
            success=bool(success[rows].any()) if success is not None else None,
            seed=None,
            obs_field=f"{where}:{obs_name} (episode {e})",
            actions_field=f"{where}:{ACTION_KEY} (episode {e})",
        ))
    if lengths is not None and len(lengths) != len(episodes):
        raise ConfigError.one(path, "meta/episodes", len(lengths),
                              f"episodes listed, but the data holds {len(episodes)}")
    task = _single_task(path)
    units = declared_units(path, f"{INFO_PATH}:{UNITS_KEY}", info.get(UNITS_KEY))
    if units is None and task is not None and info.get("robot_type") == task:
        units = "normalized"
    return Recording(tuple(episodes), task, keys, action_units=units)


def is_lerobot(path: Path) -> bool:
    """A folder with ``meta/info.json``."""
    return (path / INFO_PATH).is_file()


def _info(path: Path) -> dict[str, Any]:
    file = path / INFO_PATH
    if not file.is_file():
        raise ConfigError.one(path, INFO_PATH, None, "missing: not a LeRobot v3 dataset folder")
    try:
        info = json.loads(file.read_text())
    except (ValueError, RecursionError) as exc:
        raise ConfigError.one(path, INFO_PATH, None, f"not JSON: {exc}") from None
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if not isinstance(version, str) or not version.startswith("v3"):
        raise ConfigError.one(path, f"{INFO_PATH}:codebase_version", version,
                              "expected a LeRobot v3 dataset (v3.0)")
    return info


def _column(table: pa.Table, key: str, path: Path, where: str) -> pa.ChunkedArray:
    if key not in table.column_names:
        raise ConfigError.one(path, f"{where}:{key}", None,
                              f"missing column; columns: {', '.join(table.column_names)}")
    return table.column(key)


def _vector(table: pa.Table, key: str, path: Path, where: str) -> np.ndarray:
    import pyarrow as pa

    col = _column(table, key, path, where).combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type):
        col = col.flatten()
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
            or pa.types.is_boolean(col.type)) or len(col) != len(table) or col.null_count:
        raise ConfigError.one(path, f"{where}:{key}", str(col.type), "expected one number a row")
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _matrix(table: pa.Table, key: str, path: Path, where: str) -> np.ndarray:
    """A list column as an array of shape (rows, width), float32."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = _column(table, key, path, where).combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type)
            or pa.types.is_large_list(col.type)):
        raise ConfigError.one(path, f"{where}:{key}", str(col.type), "expected a list column")
    if col.null_count:
        raise ConfigError.one(path, f"{where}:{key}", col.null_count, "null rows")
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    width = int(lengths[0]) if len(lengths) else 0
    if len(lengths) and (lengths != width).any():
        raise ConfigError.one(path, f"{where}:{key}", sorted(set(lengths.tolist()))[:8],
                              "rows of different widths")
    values = col.flatten()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        raise ConfigError.one(path, f"{where}:{key}", str(values.type), "expected numbers")
    flat = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32)
    return flat.reshape(len(col), width)


def _episode_lengths(path: Path) -> dict[int, int] | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((path / "meta" / "episodes").glob("**/*.parquet"))
    if not files:
        return None
    try:
        table = pa.concat_tables([pq.read_table(f, columns=["episode_index", "length"])
                                  for f in files])
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise ConfigError.one(path, "meta/episodes", [f.name for f in files],
                              f"unreadable: {exc}") from None
    return dict(zip(table.column("episode_index").to_pylist(),
                    table.column("length").to_pylist(), strict=True))


def _single_task(path: Path) -> str | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = path / TASKS_PATH
    if not file.is_file():
        return None
    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError):
        return None
    names = [c for c in table.column_names if c != "task_index"]
    if len(table) != 1 or not names:
        return None
    value = table.column(names[0])[0].as_py()
    return value if isinstance(value, str) else None


def _feature(dtype: str, shape: int, names: Sequence[str] | None = None) -> dict[str, Any]:
    return {"dtype": dtype, "shape": [shape], "names": list(names) if names else None}


def _stats(values: np.ndarray) -> dict[str, list[float]]:
    v = values.reshape(len(values), -1).astype(np.float64)
    return {"min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(),
            "std": v.std(0).tolist(), "count": [len(v)]}


def write_lerobot(path: Path, export: Export) -> None:
    """Write ``export`` as a LeRobot v3 dataset folder at ``path`` (see the module doc)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    eps = export.episodes
    lengths = np.array([len(e.actions) for e in eps], np.int64)
    total = int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    obs = np.concatenate([e.obs for e in eps]).astype(np.float32)
    actions = np.concatenate([e.actions for e in eps]).astype(np.float32)
    frame = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    columns: dict[str, np.ndarray] = {
        "timestamp": (frame / export.control_hz).astype(np.float32),
        "frame_index": frame,
        "episode_index": np.repeat(np.arange(len(eps), dtype=np.int64), lengths),
        "index": np.arange(total, dtype=np.int64),
        "task_index": np.zeros(total, np.int64),
        "next.reward": np.concatenate([e.rewards for e in eps]).astype(np.float32),
        "next.done": np.concatenate([e.dones for e in eps]).astype(bool),
        # success is marked on an episode's last frame, as LeRobot's sim datasets mark it
        "next.success": np.concatenate([(np.arange(len(e.actions)) == len(e.actions) - 1)
                                        & e.success for e in eps]),
    }
    data = pa.table({
        STATE_KEY: pa.FixedSizeListArray.from_arrays(pa.array(obs.ravel()), obs.shape[1]),
        ACTION_KEY: pa.FixedSizeListArray.from_arrays(pa.array(actions.ravel()),
                                                      actions.shape[1]),
        **{k: pa.array(v) for k, v in columns.items()},
    })
    data_file = path / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True)
    pq.write_table(data, data_file)
    episodes = pa.table({
        "episode_index": pa.array(np.arange(len(eps), dtype=np.int64)),
        "tasks": pa.array([[export.task]] * len(eps), type=pa.list_(pa.string())),
        "length": pa.array(lengths),
        "data/chunk_index": pa.array(np.zeros(len(eps), np.int64)),
        "data/file_index": pa.array(np.zeros(len(eps), np.int64)),
        "dataset_from_index": pa.array(starts.astype(np.int64)),
        "dataset_to_index": pa.array((starts + lengths).astype(np.int64)),
        "meta/episodes/chunk_index": pa.array(np.zeros(len(eps), np.int64)),
        "meta/episodes/file_index": pa.array(np.zeros(len(eps), np.int64)),
    })
    episodes_file = path / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_file.parent.mkdir(parents=True)
    pq.write_table(episodes, episodes_file)
    # LeRobot keeps its tasks as a pandas frame indexed by the task string.
    pd.DataFrame({"task_index": [0]}, index=pd.Index([export.task], name="task")).to_parquet(
        path / TASKS_PATH)
    features = {
        STATE_KEY: _feature("float32", obs.shape[1], export.obs_names),
        ACTION_KEY: _feature("float32", actions.shape[1], export.action_names),
        "next.reward": _feature("float32", 1), "next.done": _feature("bool", 1),
        "next.success": _feature("bool", 1), "timestamp": _feature("float32", 1),
        "frame_index": _feature("int64", 1), "episode_index": _feature("int64", 1),
        "index": _feature("int64", 1), "task_index": _feature("int64", 1),
    }
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": export.task,
        "total_episodes": len(eps), "total_frames": total, "total_tasks": 1,
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "fps": export.control_hz, "splits": {"train": f"0:{len(eps)}"},
        "data_path": DATA_PATH, "video_path": None, "features": features,
        UNITS_KEY: "normalized",
    }
    (path / INFO_PATH).write_text(json.dumps(info, indent=4))
    stats = {STATE_KEY: _stats(obs), ACTION_KEY: _stats(actions),
             **{k: _stats(v) for k, v in columns.items()}}
    (path / STATS_PATH).write_text(json.dumps(stats, indent=4))

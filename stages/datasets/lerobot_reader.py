"""Reading a LeRobot v3 dataset folder with pyarrow, its videos with PyAV.

The observation is ``observation.state``, or the features ``--obs-keys`` names
(e.g. ``observation.state,observation.environment_state``) joined in that order; the action
is ``action``. A feature of shape (1,) may be a list column of one number or, as LeRobot
stores it, a plain number column. Rows are grouped by ``episode_index``; each episode's
``frame_index`` must run 0, 1, ..., T-1, and its length must match ``meta/episodes`` when that
file is there. ``next.reward``, ``next.done`` and ``next.success`` are used when present
(``next.success`` holds booleans, or the numbers 0 and 1: any other value is refused). A single
task string in ``meta/tasks.parquet`` names the task when it is a registered task id, and
``physai_task`` in ``meta/info.json`` does for a dataset this project wrote. Each episode's
instruction is its task text (its first frame's ``task_index`` in ``meta/tasks.parquet``), but
where it is the ``physai_task`` id, which stands for an episode given none. Actions
are the robot's or environment's own (``native``, as LeRobot records them), unless
``meta/info.json`` says otherwise in ``physai_action_units``; a dataset this project wrote says
``normalized`` (one whose ``robot_type`` is its only task was written before that key, and is
too).

Cameras (their features: :func:`stages.datasets.lerobot_format.camera_keys`): a ``video``
feature is decoded from its MP4 (:mod:`stages.datasets.lerobot_video`): an episode's frames are
those from its ``from_timestamp`` to its ``to_timestamp``, each matched to a row by
``from_timestamp`` plus the row's ``timestamp``; their count must be the episode's length and
their size the one ``meta/info.json`` declares. An ``image`` feature (LeRobot without videos)
is read from the data's PNG or JPEG bytes.

What a foreign file says is bounded before it is acted on. Only the columns the reader uses
are read, row group by row group; every frame's size comes from its header (an image's, a
video stream's), is checked against the size ``meta/info.json`` declares and the task's
camera, and is charged, with the row groups, to one
:class:`~stages.datasets.demonstrations.DecodeBudget` of ``PHYSAI_DATASET_MAX_BYTES``, before
anything is decoded. A video file an episode names is one of the dataset's own
(:func:`~stages.datasets.lerobot_format.inside_dataset`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import ConfigError
from stages.datasets.contained import read_parquet, source_files
from stages.datasets.demonstrations import DecodeBudget, check_camera_tensor, image_header
from stages.datasets.formats import RawEpisode, Recording, declared_units, join_obs, task_camera
from stages.datasets.lerobot_format import (
    ACTION_KEY,
    IMAGE_FORMATS,
    IMAGE_SUFFIX,
    INFO_PATH,
    MAX_INDEX,
    STATE_KEY,
    TASK_KEY,
    TASKS_PATH,
    UNITS_KEY,
    VIDEO_PATH,
    feature_of,
    inside_dataset,
    read_info,
)
from stages.datasets.lerobot_video import decode_video

if TYPE_CHECKING:
    import pyarrow as pa


def read_lerobot(path: Path, obs_keys: Sequence[str],
                 image_keys: Sequence[str] = ()) -> Recording:
    """Every episode of a LeRobot v3 dataset folder, unchecked, with the camera tensors
    ``image_keys`` names (``front_image``) when the dataset has them (see the module doc).
    Only the columns it uses are read, and what it decodes (row groups, frames) is charged to
    one :class:`~stages.datasets.demonstrations.DecodeBudget` before it is decoded.

    Steps: 1. ``meta/info.json`` and the cameras' features; 2. the columns it uses; 3. the rows
    grouped by episode; 4. the image frames checked and charged; 5. the episodes, each checked
    against ``meta/episodes``; 6. the task and the actions' units."""
    # -- 1. info.json (its path templates vetted) and the feature each camera is read from
    info = read_info(path)
    budget = DecodeBudget()
    keys = tuple(obs_keys) or (STATE_KEY,)
    features = info.get("features")
    sources = {key: _camera_feature(path, features if isinstance(features, dict) else {}, key)
               for key in image_keys}
    pictures = [s for s, feature in sources.values() if feature.get("dtype") == "image"]
    # -- 2. only the columns used, every file's row groups charged to the budget
    table, where = _data(path, budget, [*keys, ACTION_KEY, "episode_index", "frame_index"],
                         ["next.reward", "next.done", "next.success", "task_index",
                          *(["timestamp", *pictures] if image_keys else [])], pictures)
    obs = join_obs([_matrix(table, k, path, where) for k in keys])
    actions = _matrix(table, ACTION_KEY, path, where)
    episode = _vector(table, "episode_index", path, where).astype(np.int64)
    frame = _vector(table, "frame_index", path, where).astype(np.int64)
    extra = {k: _vector(table, k, path, where) for k in ("next.reward", "next.done",
                                                           "next.success", "task_index")
             if k in table.column_names}
    ours = info.get(TASK_KEY) if isinstance(info.get(TASK_KEY), str) else None
    texts = _task_texts(path, budget) if "task_index" in extra else {}
    success = extra.get("next.success")
    if success is not None and success.dtype != bool:
        bad = np.flatnonzero((success != 0) & (success != 1))
        if len(bad):
            raise ConfigError.one(path, f"{where}:next.success", success[bad[0]].item(),
                                  f"expected true or false (0 or 1) at row {bad[0]}")
    # -- 3. rows by episode, in frame order
    order = np.lexsort((frame, episode))
    split = [(int(episode[rows[0]]), rows)
             for rows in np.split(order, np.flatnonzero(np.diff(episode[order])) + 1)]
    meta = _episodes_meta(path, budget)
    cameras = (_Cameras(path, info, table, where, sources, meta, budget) if image_keys
               else None)
    # -- 4. every image frame checked and charged from its header, before any is decoded
    if cameras is not None:
        cameras.charge_images(split)
    # -- 5. each episode: frames 0..T-1, its length as meta/episodes says, its camera tensors
    episodes = []
    obs_name = keys[0] if len(keys) == 1 else "{" + ",".join(keys) + "}"
    for e, rows in split:
        if not np.array_equal(frame[rows], np.arange(len(rows))):
            raise ConfigError.one(path, f"{where}:frame_index (episode {e})",
                                  frame[rows][:8].tolist(), "expected 0, 1, ..., T-1")
        if meta is not None and meta.get(e, {}).get("length", len(rows)) != len(rows):
            raise ConfigError.one(path, f"meta/episodes:length (episode {e})",
                                  meta[e]["length"],
                                  f"the data holds {len(rows)} frames of this episode")
        images, images_field = cameras.episode(e, rows) if cameras else ({}, "")
        episodes.append(RawEpisode(
            obs=obs[rows], actions=actions[rows],
            rewards=extra["next.reward"][rows] if "next.reward" in extra else None,
            dones=extra["next.done"][rows] != 0 if "next.done" in extra else None,
            success=bool(success[rows].any()) if success is not None else None,
            seed=None,
            obs_field=f"{where}:{obs_name} (episode {e})",
            actions_field=f"{where}:{ACTION_KEY} (episode {e})",
            images=images, images_field=images_field,
            instruction=_instruction(texts, extra, rows, ours),
            instruction_field=f"{TASKS_PATH}:task (episode {e})",
        ))
    if meta is not None and len(meta) != len(episodes):
        raise ConfigError.one(path, "meta/episodes", len(meta),
                              f"episodes listed, but the data holds {len(episodes)}")
    # -- 6. a single task names the task; units as info.json declares them
    task = ours or _single_task(path, budget)
    units = declared_units(path, f"{INFO_PATH}:{UNITS_KEY}", info.get(UNITS_KEY))
    if units is None and task is not None and info.get("robot_type") == task:
        units = "normalized"
    return Recording(tuple(episodes), task, keys, action_units=units)


def _data(path: Path, budget: DecodeBudget, required: Sequence[str], optional: Sequence[str],
          pictures: Sequence[str]) -> tuple[pa.Table, str]:
    """The columns ``required`` and ``optional`` of every data file, no other (each file read
    within ``budget``), and where they are as errors name it; a required column missing
    from a file is a :class:`ConfigError` listing the file's columns."""
    import pyarrow as pa

    files = sorted((path / "data").glob("**/*.parquet"))
    if not files:
        raise ConfigError.one(path, "data/", [], "no parquet files")
    where = str(files[0].relative_to(path)) if len(files) == 1 else "data/"
    tables = []
    for file in files:
        table, names = read_parquet(file, [*dict.fromkeys([*required, *optional])], budget)
        for key in (*required, *pictures):
            if key not in names:
                raise ConfigError.one(path, f"{where}:{key}", None,
                                      f"missing column; columns: {', '.join(names)}")
        tables.append(table)
    try:
        return pa.concat_tables(tables, promote_options="default"), where
    except pa.ArrowException as exc:
        raise ConfigError.one(path, "data/", [f.name for f in files],
                              f"unreadable parquet: {exc}") from None


class _Cameras:
    """The camera tensors of a dataset's episodes: each camera's feature found in
    ``meta/info.json``, its image frames checked and charged from their headers before any is
    decoded, its videos decoded once per file."""

    def __init__(self, path: Path, info: dict[str, Any], table: pa.Table, where: str,
                 sources: dict[str, tuple[str, dict[str, Any]]],
                 meta: dict[int, dict[str, Any]] | None, budget: DecodeBudget) -> None:
        self.path, self.info, self.table, self.where, self.meta = path, info, table, where, meta
        fps = info.get("fps")
        if not isinstance(fps, int | float) or isinstance(fps, bool) or fps <= 0:
            raise ConfigError.one(path, f"{INFO_PATH}:fps", fps, "expected a positive rate")
        self.fps = float(fps)
        self.sources = sources
        self.timestamps = (_vector(table, "timestamp", path, where).astype(np.float64)
                           if "timestamp" in table.column_names else None)
        self.decoded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.budget = budget
        self.vetted = {f.relative_to(path).as_posix() for f in source_files(path)}

    def episode(self, e: int, rows: np.ndarray) -> tuple[dict[str, np.ndarray], str]:
        """Episode ``e``'s tensors (its data rows ``rows``, in frame order) and where they
        are, as :attr:`RawEpisode.images_field` names it."""
        out, fields = {}, []
        for key, (source, feature) in self.sources.items():
            if feature.get("dtype") == "video":
                out[key], field = self._video(e, rows, key, source, feature)
            else:
                out[key], field = self._images(e, rows, source), f"{self.where}:{source}"
            fields.append(field)
        return out, fields[0] if len(fields) == 1 else f"videos (episode {e})"

    def _video(self, e: int, rows: np.ndarray, key: str, source: str,
               feature: dict[str, Any]) -> tuple[np.ndarray, str]:
        row = (self.meta or {}).get(e)
        prefix = f"videos/{source}/"
        if row is None or prefix + "from_timestamp" not in row:
            raise ConfigError.one(self.path, f"meta/episodes:{prefix}from_timestamp "
                                  f"(episode {e})", None, "missing: where the episode's "
                                  f"frames of {source} are")
        file = self._video_file(e, source, row)
        field = f"{file} (episode {e})"
        steps = len(rows)
        if file not in self.decoded:
            def check(shape: tuple[int, int, int]) -> None:
                _check_size(self.path, file, source, feature, shape)
                _check_camera(self.path, f"{field}/{key}", key, steps, shape)

            self.decoded[file] = decode_video(self.path, file, self.budget, check)
        frames, times = self.decoded[file]
        start = _seconds(self.path, row, prefix + "from_timestamp", e)
        end = row.get(prefix + "to_timestamp")
        end = start + steps / self.fps if end is None else _seconds(
            self.path, row, prefix + "to_timestamp", e)
        half = 0.5 / self.fps
        inside = np.flatnonzero((times >= start - half) & (times < end - half))
        if len(inside) != steps:
            raise ConfigError.one(self.path, f"{field}:frames", len(inside),
                                  f"expected {steps}, the episode's length (frames from "
                                  f"{start:.4f} s to {end:.4f} s)")
        offsets = (self.timestamps[rows] if self.timestamps is not None
                   else np.arange(steps) / self.fps)
        wanted = start + offsets
        nearest = inside[_nearest(times[inside], wanted)]
        late = np.flatnonzero(np.abs(times[nearest] - wanted) > half)
        if len(late):
            i = int(late[0])
            raise ConfigError.one(self.path, f"{field}:timestamp", round(float(wanted[i]), 6),
                                  f"no frame within half a frame of row {i}'s time")
        return frames[nearest], field

    def _video_file(self, e: int, source: str, row: dict[str, Any]) -> str:
        """The video file holding episode ``e``'s frames of ``source``: ``video_path`` filled
        in with the episode's indices, a file of the dataset that was vetted."""
        template = self.info.get("video_path") or VIDEO_PATH
        indices = {}
        for name in ("chunk_index", "file_index"):
            value = row.get(f"videos/{source}/{name}")
            if not isinstance(value, int) or isinstance(value, bool) or not (
                    0 <= value <= MAX_INDEX):
                raise ConfigError.one(self.path, f"meta/episodes:videos/{source}/{name} "
                                      f"(episode {e})", value,
                                      f"expected a whole number from 0 to {MAX_INDEX}")
            indices[name] = value
        file = template.format(video_key=source, **indices)
        return inside_dataset(self.path, f"{INFO_PATH}:video_path", template, file, self.vetted)

    def charge_images(self, episodes: Sequence[tuple[int, np.ndarray]]) -> None:
        """Check every frame of the ``image`` features from its header (PNG or JPEG, the size
        ``meta/info.json`` declares and the task's camera gives) and charge the bytes it
        decodes to, before any frame is decoded."""
        for key, (source, feature) in self.sources.items():
            if feature.get("dtype") != "image":
                continue
            column = _column(self.table, source, self.path, self.where)
            for e, rows in episodes:
                field = f"{self.where}:{source} (episode {e})"
                for i, cell in enumerate(column.take(rows).to_pylist()):
                    with image_header(self.path, field, _cell_bytes(self.path, field, cell, i),
                                      IMAGE_FORMATS, f"frame {i}") as image:
                        width, height = image.size
                    shape = (height, width, 3)
                    _check_size(self.path, f"{field} frame {i}", source, feature, shape)
                    _check_camera(self.path, f"{self.where}:{source}/{key}", key, len(rows),
                                  shape)
                    self.budget.charge(self.path, f"{field} frame {i}", math.prod(shape),
                                       list(shape), f"a {width}x{height} image as RGB")

    def _images(self, e: int, rows: np.ndarray, source: str) -> np.ndarray:
        """Frames stored in the data as LeRobot's ``image`` feature: PNG or JPEG bytes, each
        checked and charged by :meth:`charge_images` before this decodes it."""
        column = _column(self.table, source, self.path, self.where).take(rows).to_pylist()
        field = f"{self.where}:{source} (episode {e})"
        out = []
        for i, cell in enumerate(column):
            with image_header(self.path, field, _cell_bytes(self.path, field, cell, i),
                              IMAGE_FORMATS, f"frame {i}") as image:
                try:
                    out.append(np.asarray(image.convert("RGB")))
                except (OSError, ValueError) as exc:
                    raise ConfigError.one(self.path, field, f"frame {i}",
                                          f"unreadable image: {exc}") from None
        return np.stack(out)


def _cell_bytes(path: Path, field: str, cell: object, i: int) -> bytes:
    """Frame ``i``'s bytes from a data cell (``{"bytes": ..., "path": ...}``, LeRobot's
    ``image``); a cell without bytes is a :class:`ConfigError` naming ``field``."""
    data = cell.get("bytes") if isinstance(cell, dict) else None
    if not isinstance(data, bytes):
        raise ConfigError.one(path, field, type(cell).__name__,
                              f"expected image bytes at frame {i}")
    return data


def _check_camera(path: Path, field: str, key: str, steps: int,
                  shape: tuple[int, int, int]) -> None:
    """Refuse frames of ``shape`` (H, W, 3) for the camera tensor ``key`` when the task's
    camera (:func:`~stages.datasets.formats.task_camera`) gives another, before any is
    decoded: the message an episode of ``steps`` such frames gets once decoded."""
    cam = task_camera(key)
    if cam is not None:
        stand_in = np.broadcast_to(np.zeros((), np.uint8), (steps, *shape))
        check_camera_tensor(path, field, cam, key, stand_in, steps)


def _seconds(path: Path, row: dict[str, Any], column: str, e: int) -> float:
    """A finite number of seconds from ``meta/episodes``' ``column`` of episode ``e``."""
    value = row.get(column)
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not np.isfinite(value)):
        raise ConfigError.one(path, f"meta/episodes:{column} (episode {e})", value,
                              "expected a number of seconds")
    return float(value)


def _nearest(times: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted`` (seconds), the index of the nearest of ``times`` (sorted)."""
    right = np.clip(np.searchsorted(times, wanted), 1, max(len(times) - 1, 1))
    left = right - 1
    closer_left = np.abs(times[left] - wanted) <= np.abs(times[np.minimum(right, len(times) - 1)]
                                                         - wanted)
    return np.where(closer_left, left, np.minimum(right, len(times) - 1))


def _camera_feature(path: Path, features: dict[str, Any],
                    key: str) -> tuple[str, dict[str, Any]]:
    """The feature camera tensor ``key`` (``front_image``) is read from, and its entry."""
    if not key.endswith(IMAGE_SUFFIX):
        raise ConfigError.one(path, INFO_PATH, key, "LeRobot datasets carry colour images "
                              "here, not depth")
    camera = key.removesuffix(IMAGE_SUFFIX)
    source = feature_of(camera)
    found = features.get(source)
    if not isinstance(found, dict) or found.get("dtype") not in ("video", "image"):
        cams = sorted(k for k, v in features.items()
                      if isinstance(v, dict) and v.get("dtype") in ("video", "image"))
        raise ConfigError.one(path, f"{INFO_PATH}:features", source,
                              f"missing: the task's camera {camera!r}; the dataset's cameras: "
                              f"{', '.join(cams) or '(none)'} (map one with --camera-keys "
                              f"{camera}=FEATURE)")
    return source, found


def _check_size(path: Path, file: str, source: str, feature: dict[str, Any],
                shape: tuple[int, ...]) -> None:
    """Refuse frames of ``shape`` (H, W, 3) when ``meta/info.json`` declares another."""
    declared = feature.get("shape")
    if isinstance(declared, list) and len(declared) == 3 and tuple(declared) != tuple(shape):
        raise ConfigError.one(path, f"{file}:resolution", list(shape),
                              f"{INFO_PATH} declares {source} of shape {declared} "
                              "(height, width, channels)")


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
    """A list column as an array of shape (rows, width), float32; a number column (how
    LeRobot stores a feature of shape (1,)) as (rows, 1)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = _column(table, key, path, where).combine_chunks()
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        if col.null_count:
            raise ConfigError.one(path, f"{where}:{key}", col.null_count, "null rows")
        return np.asarray(col.to_numpy(zero_copy_only=False), np.float32).reshape(-1, 1)
    if not (pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type)
            or pa.types.is_large_list(col.type)):
        raise ConfigError.one(path, f"{where}:{key}", str(col.type),
                              "expected a list column or one number a row")
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


def _episodes_meta(path: Path, budget: DecodeBudget) -> dict[int, dict[str, Any]] | None:
    """``meta/episodes``: each episode's ``length`` and where its videos are
    (``videos/<key>/...`` columns), by episode index, read within ``budget``; None when the
    dataset has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((path / "meta" / "episodes").glob("**/*.parquet"))
    if not files:
        return None
    tables = []
    for f in files:
        try:
            names = pq.read_schema(f).names
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError.one(path, "meta/episodes", f.name, f"unreadable: {exc}") from None
        wanted = ["episode_index", "length", *(n for n in names if n.startswith("videos/"))]
        tables.append(read_parquet(f, wanted, budget)[0])
    try:
        table = pa.concat_tables(tables, promote_options="default")
        return {int(row["episode_index"]): row for row in table.to_pylist()}
    except (pa.ArrowException, KeyError, TypeError, ValueError) as exc:
        raise ConfigError.one(path, "meta/episodes", [f.name for f in files],
                              f"unreadable: {exc}") from None


def _task_texts(path: Path, budget: DecodeBudget) -> dict[int, str]:
    """Every task of ``meta/tasks.parquet`` by its ``task_index`` (read within ``budget``);
    empty without the file or its ``task`` and ``task_index`` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = path / TASKS_PATH
    if not file.is_file():
        return {}
    try:
        names = pq.read_schema(file).names
    except (pa.ArrowException, OSError):
        return {}
    if "task" not in names or "task_index" not in names:
        return {}
    table = read_parquet(file, ["task", "task_index"], budget)[0]
    return {int(i): t for t, i in zip(table.column("task").to_pylist(),
                                      table.column("task_index").to_pylist(), strict=True)
            if isinstance(i, int) and isinstance(t, str)}


def _instruction(texts: dict[int, str], extra: dict[str, np.ndarray], rows: np.ndarray,
                 ours: str | None) -> str | None:
    """An episode's instruction: the task of its first frame's ``task_index``, but None where
    that is the ``physai_task`` id ``ours`` (an episode given none) or unknown."""
    if "task_index" not in extra or not len(rows):
        return None
    text = texts.get(int(extra["task_index"][rows[0]]))
    return None if text is None or text == ours else text


def _single_task(path: Path, budget: DecodeBudget) -> str | None:
    """The task ``meta/tasks.parquet`` names when it names one (its first column but
    ``task_index``, read within ``budget``), else None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = path / TASKS_PATH
    if not file.is_file():
        return None
    try:
        names = [c for c in pq.read_schema(file).names if c != "task_index"]
    except (pa.ArrowException, OSError):
        return None
    if not names:
        return None
    table = read_parquet(file, names[:1], budget)[0]
    if len(table) != 1:
        return None
    value = table.column(names[0])[0].as_py()
    return value if isinstance(value, str) else None

"""LeRobot v3 datasets, read and written with pyarrow, their videos with PyAV.

LeRobot itself does not install beside this project's CPU torch (it needs Python 3.12 and torch
< 2.12; it is the stage environment ``lerobot``, ``make lerobot``), so the files are read and
written here with pyarrow and PyAV, following the v3.0 layout that LeRobot 0.6 writes
(``lerobot/datasets/utils.py``, ``dataset_writer.py``)::

    meta/info.json                              codebase_version "v3.0", fps, features, paths
    meta/stats.json                             min, max, mean, std, count per feature
    meta/tasks.parquet                          task (the index) -> task_index
    meta/episodes/chunk-000/file-000.parquet    episode_index, tasks, length,
                                                dataset_from_index, dataset_to_index,
                                                videos/<camera key>/{chunk_index, file_index,
                                                from_timestamp, to_timestamp}, ...
    data/chunk-000/file-000.parquet             one row per frame: observation.state, action,
                                                timestamp, frame_index, episode_index, index,
                                                task_index, next.reward, next.done,
                                                next.success
    videos/observation.images.<camera>/chunk-000/file-000.mp4
                                                one camera's frames, episode after episode

Reading: the observation is ``observation.state``, or the features ``--obs-keys`` names
(e.g. ``observation.state,observation.environment_state``) joined in that order; the action
is ``action``. A feature of shape (1,) may be a list column of one number or, as LeRobot
stores it, a plain number column. Rows are grouped by ``episode_index``; each episode's
``frame_index`` must run 0, 1, ..., T-1, and its length must match ``meta/episodes`` when that
file is there. ``next.reward``, ``next.done`` and ``next.success`` are used when present
(``next.success`` holds booleans, or the numbers 0 and 1: any other value is refused). A single
task string in ``meta/tasks.parquet`` names the task when it is a registered task id. Actions
are the robot's or environment's own (``native``, as LeRobot records them), unless
``meta/info.json`` says otherwise in ``physai_action_units``; a dataset this project wrote says
``normalized`` (one whose ``robot_type`` is its only task was written before that key, and is
too).

Cameras: a task's camera ``<camera>`` (its tensor ``<camera>_image``) is the feature
``observation.images.<camera>``, or the one a key map names (:func:`camera_keys`; ``flows
dataset import --camera-keys front=observation.images.top``). A ``video`` feature is decoded
from its MP4 (:mod:`stages.datasets.lerobot_video`): an episode's frames are those from its
``from_timestamp`` to its ``to_timestamp``, each matched to a row by ``from_timestamp`` plus the
row's ``timestamp``; their count must be the episode's length and their size the one
``meta/info.json`` declares. An ``image`` feature (LeRobot without videos) is read from the
data's PNG or JPEG bytes.

What a foreign file says is bounded before it is acted on. Only the columns the reader uses
are read, row group by row group; every frame's size comes from its header (an image's, a
video stream's), is checked against the size ``meta/info.json`` declares and the task's
camera, and is charged, with the row groups, to one
:class:`~stages.datasets.demonstrations.DecodeBudget` of ``PHYSAI_DATASET_MAX_BYTES``, before
anything is decoded. ``meta/info.json``'s path templates (``video_path``, ``data_path``) name only
the fields LeRobot v3 fills in, an index only with an integer format of bounded width, and every
file they lead to is one of the dataset's own files, inside its folder (:func:`_vet_template`).

Writing puts every episode in ``data/chunk-000/file-000.parquet`` (one file, whatever its
size), each camera's frames in one MP4 per camera (AV1, LeRobot's default encoder settings),
names the task id as the only task (and as ``robot_type``) and the actions' units as
``physai_action_units: normalized``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import ConfigError
from stages.core.loading import read_json
from stages.datasets.contained import read_parquet, source_files
from stages.datasets.demonstrations import DecodeBudget, check_camera_tensor, image_header
from stages.datasets.formats import (
    Export,
    RawEpisode,
    Recording,
    declared_units,
    join_obs,
    task_camera,
)
from stages.datasets.lerobot_video import decode_video, encode_video

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
"""``meta/info.json`` key that says which units the actions are in (stages/core/units.py)."""
CHUNKS_SIZE = 1000
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
IMAGES_PREFIX = "observation.images."
"""A camera's feature is ``observation.images.<camera>`` unless a key map says otherwise."""
IMAGE_SUFFIX = "_image"

TEMPLATE_FIELDS = {"video_path": ("video_key", "chunk_index", "file_index"),
                   "data_path": ("chunk_index", "file_index")}
"""The fields LeRobot v3 fills in each path template of ``meta/info.json`` (``lerobot/datasets/
utils.py``): a template naming any other is refused."""
MAX_WIDTH = 20
"""The widest integer format a path template may give an index (``{chunk_index:03d}``: 3)."""
_INDEX_SPEC = re.compile(r"0?([0-9]{0,3})d?")
MAX_INDEX = 2**31 - 1
"""The largest chunk or file index ``meta/episodes`` may give."""
IMAGE_FORMATS = ("PNG", "JPEG")
"""What an ``image`` feature's frames may be stored as (what LeRobot writes)."""

_CAMERA_KEYS: ContextVar[Mapping[str, str] | None] = ContextVar("lerobot_camera_keys",
                                                                 default=None)


@contextlib.contextmanager
def camera_keys(mapping: Mapping[str, str]) -> Iterator[None]:
    """Within the block, read camera ``<camera>`` from the feature ``mapping[<camera>]``
    (e.g. ``{"front": "observation.images.top"}``); unmapped cameras keep their default
    feature ``observation.images.<camera>``."""
    token = _CAMERA_KEYS.set(dict(mapping))
    try:
        yield
    finally:
        _CAMERA_KEYS.reset(token)


def parse_camera_keys(text: str, where: str = "--camera-keys") -> dict[str, str]:
    """``front=observation.images.top,wrist=observation.images.hand`` as a key map; a pair
    without ``=`` or with an empty side is a :class:`ConfigError` naming ``where``."""
    out: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",") if p.strip()):
        camera, sep, key = (x.strip() for x in pair.partition("="))
        if not sep or not camera or not key:
            raise ConfigError.one(where, "", pair, "expected CAMERA=FEATURE, e.g. "
                                  "front=observation.images.top")
        out[camera] = key
    return out


def feature_of(camera: str) -> str:
    """The feature camera ``camera`` is read from (see :func:`camera_keys`)."""
    return (_CAMERA_KEYS.get() or {}).get(camera, IMAGES_PREFIX + camera)


def read_lerobot(path: Path, obs_keys: Sequence[str],
                 image_keys: Sequence[str] = ()) -> Recording:
    """Every episode of a LeRobot v3 dataset folder, unchecked, with the camera tensors
    ``image_keys`` names (``front_image``) when the dataset has them (see the module doc).
    Only the columns it uses are read, and what it decodes (row groups, frames) is charged to
    one :class:`~stages.datasets.demonstrations.DecodeBudget` before it is decoded."""
    info = _info(path)
    budget = DecodeBudget()
    keys = tuple(obs_keys) or (STATE_KEY,)
    features = info.get("features")
    sources = {key: _camera_feature(path, features if isinstance(features, dict) else {}, key)
               for key in image_keys}
    pictures = [s for s, feature in sources.values() if feature.get("dtype") == "image"]
    table, where = _data(path, budget, [*keys, ACTION_KEY, "episode_index", "frame_index"],
                         ["next.reward", "next.done", "next.success",
                          *(["timestamp", *pictures] if image_keys else [])], pictures)
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
    split = [(int(episode[rows[0]]), rows)
             for rows in np.split(order, np.flatnonzero(np.diff(episode[order])) + 1)]
    meta = _episodes_meta(path, budget)
    cameras = (_Cameras(path, info, table, where, sources, meta, budget) if image_keys
               else None)
    if cameras is not None:
        cameras.charge_images(split)
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
        ))
    if meta is not None and len(meta) != len(episodes):
        raise ConfigError.one(path, "meta/episodes", len(meta),
                              f"episodes listed, but the data holds {len(episodes)}")
    task = _single_task(path, budget)
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
        return _inside(self.path, f"{INFO_PATH}:video_path", template, file, self.vetted)

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


def is_lerobot(path: Path) -> bool:
    """A folder with ``meta/info.json``."""
    return (path / INFO_PATH).is_file()


def _info(path: Path) -> dict[str, Any]:
    """``meta/info.json`` of a LeRobot v3 dataset, its path templates vetted
    (:func:`_vet_template`)."""
    file = path / INFO_PATH
    if not file.is_file():
        raise ConfigError.one(path, INFO_PATH, None, "missing: not a LeRobot v3 dataset folder")
    info = read_json(file, INFO_PATH, where=path)
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if not isinstance(version, str) or not version.startswith("v3"):
        raise ConfigError.one(path, f"{INFO_PATH}:codebase_version", version,
                              "expected a LeRobot v3 dataset (v3.0)")
    for key in TEMPLATE_FIELDS:
        if info.get(key) is not None:
            _vet_template(path, key, info[key])
    return info


def _vet_template(path: Path, key: str, template: object) -> None:
    """Refuse ``meta/info.json``'s path template ``key`` (``video_path``, ``data_path``)
    unless it names only the fields LeRobot v3 fills in (:data:`TEMPLATE_FIELDS`), without
    attribute or index access or conversions, each index with an integer format of a bounded
    width (``{chunk_index:03d}``), and leads to a file inside the dataset folder: one
    :class:`ConfigError` naming the key and the template."""
    field = f"{INFO_PATH}:{key}"
    allowed = TEMPLATE_FIELDS[key]
    if not isinstance(template, str):
        raise ConfigError.one(path, field, template, "expected a path template")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError.one(path, field, template, f"not a path template: {exc}") from None
    names = ", ".join(f"{{{n}}}" for n in allowed)
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in allowed:
            what = ("attribute or index access" if any(c in name for c in ".[]")
                    else "unknown field")
            raise ConfigError.one(path, field, template,
                                  f"{what} {{{name}}}: a LeRobot v3 {key} names only {names}")
        if conversion:
            raise ConfigError.one(path, field, template,
                                  f"conversion !{conversion} of {{{name}}}: expected the "
                                  "field as it is")
        width = _INDEX_SPEC.fullmatch(spec or "")
        if name == "video_key" and spec:
            raise ConfigError.one(path, field, template,
                                  f"format {{{name}:{spec}}}: {{{name}}} takes no format")
        if width is None or int(width.group(1) or 0) > MAX_WIDTH:
            raise ConfigError.one(path, field, template,
                                  f"format {{{name}:{spec}}}: expected an integer format of "
                                  f"width at most {MAX_WIDTH}, such as {{{name}:03d}}")
    sample = {"video_key": IMAGES_PREFIX + "camera", "chunk_index": 0, "file_index": 0}
    _inside(path, field, template, template.format(**{n: sample[n] for n in allowed}), None)


def _inside(path: Path, field: str, template: str, file: str, vetted: set[str] | None) -> str:
    """``file`` (``template`` filled in) as a path relative to the dataset folder ``path``,
    once it resolves inside it and, given ``vetted`` (the dataset's files as
    :func:`~stages.datasets.contained.source_files` found them), is one of them; otherwise a
    :class:`ConfigError` naming ``field``."""
    root = path.resolve()
    resolved = (root / file).resolve()
    if not resolved.is_relative_to(root) or resolved == root:
        raise ConfigError.one(path, field, template,
                              f"leads to {file}, outside the dataset folder")
    relative = resolved.relative_to(root).as_posix()
    if vetted is not None and relative not in vetted:
        raise ConfigError.one(path, file, None, "missing video file")
    return relative


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


def _frame_columns(export: Export, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """The per-frame columns beside the state and the actions."""
    eps = export.episodes
    total = int(lengths.sum())
    frame = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    return {
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
    videos, video_columns, video_stats = _video_features(path, export, lengths, starts)
    episodes = pa.table({
        "episode_index": pa.array(np.arange(len(eps), dtype=np.int64)),
        "tasks": pa.array([[export.task]] * len(eps), type=pa.list_(pa.string())),
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
    # LeRobot keeps its tasks as a pandas frame indexed by the task string.
    pd.DataFrame({"task_index": [0]}, index=pd.Index([export.task], name="task")).to_parquet(
        path / TASKS_PATH)
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
        "total_episodes": len(eps), "total_frames": total, "total_tasks": 1,
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        # LeRobot's fps is a whole number of frames a second; a rate that is not stays as is.
        "fps": int(export.control_hz) if float(export.control_hz).is_integer()
        else export.control_hz,
        "splits": {"train": f"0:{len(eps)}"},
        "data_path": DATA_PATH, "video_path": VIDEO_PATH if videos else None,
        "features": features, UNITS_KEY: "normalized",
    }
    (path / INFO_PATH).write_text(json.dumps(info, indent=4))
    stats = {STATE_KEY: _stats(obs), ACTION_KEY: _stats(actions), **video_stats,
             **{k: _stats(v) for k, v in columns.items()}}
    (path / STATS_PATH).write_text(json.dumps(stats, indent=4))

"""LeRobot v3 datasets: the layout, ``meta/info.json`` and the paths it may name.

LeRobot itself does not install beside this project's CPU torch (it needs Python 3.12 and torch
< 2.12; it is the stage environment ``lerobot``, ``make lerobot``), so the files are read and
written with pyarrow and PyAV (:mod:`stages.datasets.lerobot_reader`,
:mod:`stages.datasets.lerobot_writer`), following the v3.0 layout that LeRobot 0.6 writes
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

A task's camera ``<camera>`` (its tensor ``<camera>_image``) is the feature
``observation.images.<camera>``, or the one a key map names (:func:`camera_keys`; ``flows
dataset import --camera-keys front=observation.images.top``).

``meta/info.json`` (:func:`read_info`) must say a v3 codebase version, and its path templates
(``video_path``, ``data_path``) name only the fields LeRobot v3 fills in, an index only with an
integer format of bounded width, and every file they lead to is one of the dataset's own files,
inside its folder (:func:`_vet_template`, :func:`inside_dataset`).
"""

from __future__ import annotations

import contextlib
import re
import string
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from physai_core.errors import ConfigError
from stages.core.loading import read_json

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
TASK_KEY = "physai_task"
"""``meta/info.json`` key naming the task id of a dataset this project wrote (its tasks are
then the episodes' instructions, the task id standing for an episode given none)."""
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


def is_lerobot(path: Path) -> bool:
    """A folder with ``meta/info.json``."""
    return (path / INFO_PATH).is_file()


def read_info(path: Path) -> dict[str, Any]:
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
    inside_dataset(path, field, template, template.format(**{n: sample[n] for n in allowed}), None)


def inside_dataset(path: Path, field: str, template: str, file: str,
                   vetted: set[str] | None) -> str:
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

"""Minari datasets, read and written through Minari's own storage (``pip install
'physai-flows[minari]'``).

A Minari dataset is a folder ``<id>/data/`` holding ``metadata.json`` and ``main_data.hdf5``;
``minari.load_dataset("<namespace>/<name>-v<N>")`` finds it under ``$MINARI_DATASETS_PATH``.
Import takes either that folder or its ``data/`` folder.

Reading: each episode holds T actions and T + 1 observations (the last one comes after the
last action); the first T are the observations the actions were taken on. A ``Dict``
observation space is joined in the order ``--obs-keys`` gives, or by sorted key, leaving out
camera frames (subspaces of rank 3 or more, such as ``Box(0, 255, (H, W, 3), uint8)``), which
are never joined into the state. The key ``<camera>_image`` of a ``Dict`` space is the image
of the task's camera ``<camera>``, read as stored when the task observes through it and
checked against it (:func:`~stages.datasets.formats.check_recording`). ``dones`` are
terminations or truncations. The metadata key ``physai_task`` names the task when this project
wrote the dataset. An episode's ``success`` metadata is a boolean (or 0 or 1) when present.
Actions are the environment's own (``native``: what the recording sent to ``env.step``), unless
the metadata key ``physai_action_units`` says otherwise; a dataset this project wrote says
``normalized`` (one that names ``physai_task`` alone was written before that key, and is too).

Before Minari opens it, ``metadata.json`` must declare both spaces: without them Minari makes
the environment its ``env_spec`` names to learn them, which imports and runs whatever code that
names. Its storage is Minari's ``hdf5`` (the ``arrow`` one holds compressed Arrow files
whose decoded size no header bounds). The observation space is a ``Box`` or a ``Dict`` of them,
the action space a ``Box``, and their shapes fit
:func:`stages.datasets.demonstrations.dataset_limit`, charged to a
:class:`~stages.datasets.demonstrations.DecodeBudget` (Minari fills arrays of that shape for their
bounds). The files themselves are checked as every source is
(:func:`stages.datasets.contained.check_source`), and ``main_data.hdf5`` again before Minari reads
an episode, its datasets charged to the same budget: ``total_episodes`` (Minari makes that many
indices) is at most its episodes, and, as Minari JPEG-encodes image spaces (``is_image_space``:
uint8 0..255, at least 32 x 32) unless ``metadata.json`` says ``jpeg_encoding: false``, and decodes
a frame to whatever size its header gives, every frame's JPEG header is read first: the shape it
decodes to must be its space's, and its bytes are charged before Minari decodes any.

Writing: the observation after an episode's last step is not in this project's datasets, so
the last observation is repeated as the (T + 1)-th; the fixed-length episodes end by
truncation; ``success`` is kept in each episode's metadata, and so is its ``instruction`` (text),
where it was given one (read back as the episode's instruction). Spaces: observations
``Box(-inf, inf, (obs_dim,))``, actions ``Box(-1, 1, (act_dim,))``, float32; the actions are the
task's normalized ones (``physai_action_units: normalized``). A dataset with camera images
has the observation space ``Dict(obs=Box(-inf, inf, (obs_dim,), float32),
<camera>_image=Box(0, 255, (height, width, 3), uint8))`` (a depth tensor
``<camera>_depth``: ``Box(0, inf, (height, width, 1), float32)``), stored as raw arrays
(Minari's ``jpeg_encoding`` off: the frames read back as they were written, not through
JPEG).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import ConfigError
from stages.core.loading import read_json
from stages.datasets.demonstrations import (
    DecodeBudget,
    Episode,
    check_self_contained,
    image_header,
    read_hdf5_file,
)
from stages.datasets.formats import (
    Export,
    RawEpisode,
    Recording,
    declared_units,
    join_obs,
    strict_flag,
)

if TYPE_CHECKING:
    import h5py

STATE_KEY = "obs"
"""Key of the state vector in the ``Dict`` observation space of an export with images."""
TASK_KEY = "physai_task"
UNITS_KEY = "physai_action_units"
"""Metadata key that says which units the actions are in (stages/core/units.py)."""
_ID_NAME = re.compile(r"^[A-Za-z0-9_.-]+-v\d+$")
MAIN_FILE = "main_data.hdf5"
"""The HDF5 file of Minari's ``hdf5`` storage, beside ``metadata.json``."""


def _data_dir(path: Path) -> Path:
    """``path/data`` when ``path`` is a dataset folder, ``path`` when it is its data folder."""
    for candidate in (path / "data", path):
        if (candidate / "metadata.json").is_file():
            return candidate
    raise ConfigError.one(path, "data/metadata.json", None, "missing: not a Minari dataset")


def is_minari(path: Path) -> bool:
    """A folder holding ``data/metadata.json`` (or ``metadata.json``)."""
    return path.is_dir() and any((p / "metadata.json").is_file() for p in (path / "data", path))


def _space_bytes(path: Path, field: str, space: object, kinds: tuple[str, ...]) -> int:
    """Bytes the bounds of a serialized space take; a space of another kind, or malformed, is
    a :class:`ConfigError` naming ``field``."""
    kind = space.get("type") if isinstance(space, dict) else None
    if kind not in kinds or not isinstance(space, dict):
        raise ConfigError.one(path, field, kind, f"expected a space of type {' or '.join(kinds)}")
    if kind == "Dict":
        subspaces = space.get("subspaces")
        if not isinstance(subspaces, dict):
            raise ConfigError.one(path, f"{field}.subspaces", type(subspaces).__name__,
                                  "expected a mapping of spaces")
        return sum(_space_bytes(path, f"{field}.{name}", sub, ("Box",))
                   for name, sub in subspaces.items())
    shape = space.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ConfigError.one(path, f"{field}.shape", shape, "expected a list of sizes")
    try:
        itemsize = np.dtype(str(space.get("dtype"))).itemsize
    except TypeError:
        raise ConfigError.one(path, f"{field}.dtype", space.get("dtype"),
                              "expected a numpy dtype") from None
    return 2 * math.prod(shape) * itemsize


def _check_metadata(path: Path, data: Path, budget: DecodeBudget) -> None:
    """Refuse a ``metadata.json`` that would have Minari run code or fill arrays too large
    (see the module doc); the bounds of its spaces are charged to ``budget``."""
    file = data / "metadata.json"
    field = file.relative_to(path.absolute()).as_posix()
    meta = read_json(file, field, where=path)
    if not isinstance(meta, dict):
        raise ConfigError.one(path, field, type(meta).__name__, "expected a JSON object")
    storage = meta.get("data_format")
    if storage != "hdf5":
        raise ConfigError.one(path, f"{field}:data_format", storage,
                              "only Minari's hdf5 storage is read: its arrays are checked "
                              "before Minari opens them (its arrow storage decodes JPEG frames "
                              "and compressed Arrow files of sizes no header bounds)")
    for key, kinds in (("observation_space", ("Box", "Dict")), ("action_space", ("Box",))):
        where = f"{field}:{key}"
        text = meta.get(key)
        if not isinstance(text, str):
            raise ConfigError.one(path, where, type(text).__name__,
                                  "a dataset must declare its space (without it Minari would "
                                  "make the environment env_spec names, running its code)")
        try:
            space = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ConfigError.one(path, where, None, f"not JSON: {exc}") from None
        budget.charge(path, where, _space_bytes(path, where, space, kinds), space.get("type"),
                      "the bounds of its space")


def _check_file(path: Path, data: Path, storage: Any, budget: DecodeBudget) -> None:
    """Check ``main_data.hdf5`` before Minari reads an episode of it: its datasets as
    :func:`~stages.datasets.demonstrations.check_self_contained` does (charged to ``budget``), the
    episode count Minari makes its indices from, and the JPEG frames Minari would decode
    (:func:`_charge_frames`)."""
    file = data / MAIN_FILE
    where, meta = (p.relative_to(path.absolute()).as_posix()
                   for p in (file, data / "metadata.json"))

    def check(f: h5py.File) -> None:
        check_self_contained(f, file, budget)
        count = storage.metadata.get("total_episodes")
        if (not isinstance(count, int) or isinstance(count, bool)
                or not 0 <= count <= len(f)):
            raise ConfigError.one(path, f"{meta}:total_episodes", count,
                                  f"expected the number of episodes, at most the {len(f)} "
                                  f"groups of {where}")
        if storage.jpeg_encoding:
            _charge_frames(f, path, (where, meta), storage, budget, count)

    read_hdf5_file(file, check)


def _image_spaces(storage: Any) -> list[tuple[str, str, Any]]:
    """The subspaces Minari stores as JPEG frames when its ``jpeg_encoding`` is on
    (``minari.dataset.minari_storage.is_image_space``): each one's key in an episode, the
    metadata key of the space it is part of, and the subspace."""
    import gymnasium as gym
    from minari.dataset.minari_storage import is_image_space

    out = []
    for group, name, space in (("observations", "observation_space", storage.observation_space),
                               ("actions", "action_space", storage.action_space)):
        subs = (space.spaces.items() if isinstance(space, gym.spaces.Dict)
                else [("", space)])
        out += [(f"{group}/{key}".rstrip("/"), name, sub) for key, sub in subs
                if is_image_space(sub)]
    return out


def _charge_frames(f: h5py.File, path: Path, files: tuple[str, str], storage: Any,
                   budget: DecodeBudget, episodes: int) -> None:
    """Check every JPEG frame Minari would decode from its header, before it decodes any: the
    shape Pillow decodes it to (height, width[, bands]) must be its space's, and its bytes are
    charged to ``budget``. Minari decodes whatever size a frame's header gives, whatever the
    space declares, so a few KiB of JPEG could otherwise make hundreds of MiB. ``files``: the
    HDF5 file and ``metadata.json``, as errors name them."""
    where, meta = files
    spaces = _image_spaces(storage)
    for e in range(episodes if spaces else 0):
        for key, declared_in, space in spaces:
            node = f.get(f"episode_{e}/{key}")
            field = f"{where}:episode_{e}/{key}"
            if node is None:
                continue
            for i, frame in enumerate(_frames(path, field, node)):
                with image_header(path, f"{field} frame {i}", frame.tobytes(), ("JPEG",),
                                  None) as image:
                    width, height = image.size
                    bands = len(image.getbands())
                    detail = f"a {width}x{height} JPEG frame as {image.mode}"
                shape = (height, width) if bands == 1 else (height, width, bands)
                if shape != space.shape:
                    raise ConfigError.one(path, f"{field} frame {i}", list(shape),
                                          f"{detail}; {meta}:{declared_in} declares "
                                          f"shape {list(space.shape)}")
                budget.charge(path, f"{field} frame {i}", math.prod(shape), list(shape),
                              detail)


def _frames(path: Path, field: str, node: object) -> np.ndarray:
    """The JPEG frames ``node`` holds, read as Minari reads them (whole: the stored bytes, which
    :func:`~stages.datasets.demonstrations.check_self_contained` charged, or a variable-length heap
    no larger than the file), laid out as Minari writes them: uint8 rows of one length, or
    variable-length uint8 rows, one a frame; anything else is a :class:`ConfigError` (Minari would
    fail on it unnamed, or on none with an ``IndexError``)."""
    import h5py

    if isinstance(node, h5py.Dataset):
        vlen = h5py.check_vlen_dtype(node.dtype)
        rows = ((node.ndim == 2 and vlen is None and node.dtype == np.uint8)
                or (node.ndim == 1 and vlen == np.uint8))
        if rows and len(node):
            return node[()]
    raise ConfigError.one(path, field, getattr(node, "shape", type(node).__name__),
                          "expected JPEG frames, one row of uint8 bytes each (the dataset's "
                          "jpeg_encoding is on)")


def _is_frame(space: object) -> bool:
    """Whether a subspace holds camera frames: a ``Box`` of rank 3 or more."""
    import gymnasium as gym

    return isinstance(space, gym.spaces.Box) and len(space.shape) >= 3


def _state_keys(path: Path, space: object, obs_keys: Sequence[str]) -> tuple[str, ...]:
    """The keys of a ``Dict`` observation space joined into the state (see the module doc);
    ``()`` for one array."""
    import gymnasium as gym

    if not isinstance(space, gym.spaces.Dict):
        if obs_keys:
            raise ConfigError.one(path, "observation_space", list(obs_keys),
                                  "the observations are one array: no keys to choose")
        return ()
    frames = {k for k, sub in space.spaces.items() if _is_frame(sub)}
    keys = tuple(obs_keys) or tuple(sorted(k for k in space.spaces if k not in frames))
    unknown = [k for k in keys if k not in space.spaces]
    if unknown:
        raise ConfigError.one(path, "observation_space", unknown[0],
                              f"no such key; keys: {', '.join(sorted(space.spaces))}")
    framed = [k for k in keys if k in frames]
    if framed:
        raise ConfigError.one(path, "observation_space", framed[0],
                              "camera frames are not joined into the state; the task's "
                              "cameras are read by their key, <camera>_image")
    if not keys:
        raise ConfigError.one(path, "observation_space", sorted(space.spaces),
                              "no state: every key holds camera frames")
    return keys


def _episode(path: Path, ep: Any, keys: tuple[str, ...],
             image_keys: Sequence[str]) -> RawEpisode:
    """One Minari episode as a file holds it: its first T observations, T actions, and the
    first T frames of each camera tensor of ``image_keys`` it holds."""
    where = f"episode {ep.id}"
    obs = (join_obs([np.asarray(ep.observations[k], np.float32) for k in keys]) if keys
           else np.asarray(ep.observations, np.float32))
    steps = len(ep.rewards)
    if len(obs) != steps + 1:
        raise ConfigError.one(path, f"{where}/observations", obs.shape,
                              f"expected {steps + 1} observations for {steps} steps")
    images: dict[str, np.ndarray] = {}
    held = ep.observations if isinstance(ep.observations, dict) else {}
    for key in image_keys:
        if key not in held:
            continue
        frames = np.asarray(held[key])
        if frames.ndim < 1 or len(frames) != steps + 1:
            raise ConfigError.one(path, f"{where}/observations/{key}", frames.shape,
                                  f"expected {steps + 1} frames for {steps} steps")
        images[key] = frames[:steps]
    return RawEpisode(
        obs=obs[:steps].reshape(steps, -1),
        actions=np.asarray(ep.actions, np.float32).reshape(steps, -1),
        rewards=np.asarray(ep.rewards, np.float32),
        dones=np.asarray(ep.terminations, bool) | np.asarray(ep.truncations, bool),
        success=None, seed=None,
        obs_field=f"{where}/observations" + (f"/{{{','.join(keys)}}}" if keys else ""),
        actions_field=f"{where}/actions",
        images=images, images_field=f"{where}/observations",
    )


def read_minari(path: Path, obs_keys: Sequence[str],
                image_keys: Sequence[str] = ()) -> Recording:
    """Every episode of a Minari dataset, unchecked (see the module doc), with the camera
    tensors of ``image_keys`` its ``Dict`` observations hold."""
    import minari
    from minari.dataset.minari_storage import MinariStorage

    data = _data_dir(path.absolute())
    budget = DecodeBudget()
    _check_metadata(path, data, budget)
    try:
        storage = MinariStorage.read(data)
        _check_file(path, data, storage, budget)
        ds = minari.MinariDataset(storage)
        meta = ds.storage.metadata
        space = ds.observation_space
        episodes = list(ds.iterate_episodes())
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError.one(path, data.name, None,
                              f"Minari cannot read it: {detail}") from None
    keys = _state_keys(path, space, obs_keys)
    out = [_episode(path, ep, keys, image_keys) for ep in episodes]
    ids = [ep.id for ep in episodes]
    success = [m.get("success") for m in ds.storage.get_episode_metadata(ids)]
    flags = [None if s is None else strict_flag(s) for s in success]
    for e, s, flag in zip(out, success, flags, strict=True):
        if s is not None and flag is None:
            raise ConfigError.one(path, e.obs_field.split("/")[0] + "/success", s,
                                  "expected true or false")
    said = [m.get("instruction") for m in ds.storage.get_episode_metadata(ids)]
    out = [dataclasses.replace(e, success=flag, instruction=text,
                               instruction_field=e.obs_field.split("/")[0] + "/instruction")
           for e, flag, text in zip(out, flags, said, strict=True)]
    task = meta.get(TASK_KEY)
    units = declared_units(path, f"{data.name}/metadata.json:{UNITS_KEY}", meta.get(UNITS_KEY))
    if units is None and TASK_KEY in meta:
        units = "normalized"
    return Recording(tuple(out), task if isinstance(task, str) else None, keys,
                     action_units=units)


def dataset_id(path: Path) -> str:
    """The Minari id of a dataset folder ``.../<namespace>/<name>-v<N>``."""
    if not _ID_NAME.fullmatch(path.name):
        raise ConfigError.one(path, "-o", str(path),
                              "a Minari dataset folder is named <name>-v<N> (e.g. reach-v0), "
                              "inside a namespace folder")
    return f"{path.parent.name}/{path.name}"


def write_minari(path: Path, export: Export) -> None:
    """Write ``export`` as the Minari dataset folder ``path`` (``<namespace>/<name>-v<N>``)."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    ident = dataset_id(path)
    path = path.absolute()
    act_dim = len(export.action_names)
    path.mkdir(parents=True)
    storage = MinariStorage.new(
        path / "data",
        observation_space=_observation_space(export),
        action_space=gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32),
        data_format="hdf5",
        jpeg_encoding=False,
    )
    meta: dict[str, Any] = {
        "dataset_id": ident, "minari_version": minari.__version__, TASK_KEY: export.task,
        UNITS_KEY: "normalized",
        "description": f"{export.task} demonstrations exported by physai-flows",
        "algorithm_name": "physai-flows export",
    }
    storage.update_metadata(meta)
    buffers = [
        EpisodeBuffer(
            id=i, seed=ep.seed,
            observations=_observations(ep),
            actions=np.asarray(ep.actions, np.float32),
            rewards=np.asarray(ep.rewards, np.float64),
            terminations=np.zeros(len(ep.actions), bool),
            truncations=np.asarray(ep.dones, bool),
        )
        for i, ep in enumerate(export.episodes)
    ]
    storage.update_episodes(buffers)
    storage.update_episode_metadata([
        {"success": bool(ep.success),
         **({"instruction": ep.instruction} if ep.instruction is not None else {})}
        for ep in export.episodes])


def _observation_space(export: Export) -> Any:
    """``Box(-inf, inf, (obs_dim,), float32)``; with camera images, a ``Dict`` of it under
    ``obs`` and a ``Box`` per camera tensor (uint8 0..255, float32 depth 0..inf)."""
    import gymnasium as gym

    state = gym.spaces.Box(-np.inf, np.inf, (len(export.obs_names),), np.float32)
    images = export.episodes[0].images if export.episodes else {}
    if not images:
        return state
    spaces: dict[str, Any] = {STATE_KEY: state}
    for key, frames in images.items():
        high = 255 if frames.dtype == np.uint8 else np.inf
        spaces[key] = gym.spaces.Box(0, high, frames.shape[1:], frames.dtype)
    return gym.spaces.Dict(spaces)


def _observations(ep: Episode) -> np.ndarray | dict[str, np.ndarray]:
    """An episode's T + 1 observations (the last one repeated), with its camera tensors."""
    def then_last(arr: np.ndarray) -> np.ndarray:
        return np.concatenate([arr, arr[-1:]])

    state = then_last(ep.obs).astype(np.float32)
    if not ep.images:
        return state
    return {STATE_KEY: state, **{key: then_last(frames) for key, frames in ep.images.items()}}

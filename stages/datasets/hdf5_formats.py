"""Isaac Lab and robomimic HDF5: ``data/demo_N/{obs/<key>, actions, rewards, dones}``.

Both formats share one layout (Isaac Lab's recorder writes robomimic's), read by one reader:

- demos are read in the order of their number (``demo_0``, ``demo_1``, ..., ``demo_10``);
- the observation is ``obs/policy`` when the file has that dataset (this project's layout and
  Isaac Lab's concatenated policy group); otherwise the datasets under ``obs/`` (nested groups
  included, named by their path, e.g. ``policy/joint_pos``) joined along the feature axis in
  the order ``--obs-keys`` (``collect.obs_keys``) gives, or, without it, sorted by name,
  leaving out camera frames (datasets of rank 3 or more);
- the camera tensors a task declares are ``obs/<camera>_image`` (robomimic's image key,
  (T, height, width, 3) uint8) and ``obs/<camera>_depth``; they are read as stored when the
  task observes through that camera (checked by
  :func:`~stages.datasets.formats.check_recording`) and never joined into the state;
- a key of shape (T,) is one column; ``rewards`` and ``dones`` are optional (Isaac Lab's
  recorder stores neither: rewards are then zeros and the last step is the episode's end);
- the demo attributes ``success`` and ``seed`` are kept when present: ``success`` a boolean
  (or 0 or 1), ``seed`` an integer; any other value (a string ``"False"``) is refused;
  ``data.attrs["task"]`` names the task when this project wrote the file; the demo attribute
  ``instruction`` (text) is the instruction the episode was given;
- a file whose ``obs/policy`` and ``actions`` are float32 already is in the store's layout:
  once checked it is published unchanged (no second copy written).

Files that read from outside themselves (soft or external links, external or virtual
datasets), and files whose datasets declare more than
:func:`stages.datasets.demonstrations.dataset_limit` bytes, are refused before this reader opens
them, at the registry's door (:meth:`stages.datasets.formats.DatasetFormat.read`), as every format's
files are; the reader then charges each array it reads to a
:class:`~stages.datasets.demonstrations.DecodeBudget` before reading it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from physai_core.errors import ConfigError
from stages.datasets.demonstrations import DecodeBudget, demo_number, write_dataset
from stages.datasets.formats import Export, RawEpisode, Recording, join_obs, strict_flag

if TYPE_CHECKING:
    import h5py

POLICY_KEY = "policy"
ISAACLAB_FORMAT_VERSION = 1
"""``format_version`` Isaac Lab's handler writes at the file's root (XYZW quaternions)."""


def read_hdf5(path: Path, obs_keys: Sequence[str], image_keys: Sequence[str] = ()) -> Recording:
    """Every demo of an Isaac Lab or robomimic HDF5 file, unchecked (see the module doc), with
    the camera tensors ``obs/<key>`` of ``image_keys`` that each demo holds; the file itself is
    checked by the registry (:meth:`~stages.datasets.formats.DatasetFormat.read`) before this
    reader is called."""
    from stages.datasets.demonstrations import read_hdf5_file

    if not path.is_file():
        found = "a folder" if path.is_dir() else "nothing"
        raise ConfigError.one(path, "", str(path), f"expected an HDF5 file, found {found}")
    return read_hdf5_file(path, lambda f: _read(f, path, tuple(obs_keys), tuple(image_keys)))


def _read(f: h5py.File, path: Path, obs_keys: tuple[str, ...],
          image_keys: tuple[str, ...]) -> Recording:
    import h5py

    data = f.get("data")
    if not isinstance(data, h5py.Group):
        raise ConfigError.one(path, "data", None if data is None else type(data).__name__,
                              "missing group")
    demos = sorted(data.keys(), key=demo_number)
    if not demos:
        raise ConfigError.one(path, "data", [], "dataset holds no demos")
    keys = obs_keys or default_obs_keys(data[demos[0]], path, f"data/{demos[0]}")
    budget = DecodeBudget()
    read = [_read_demo(data[name], path, f"data/{name}", keys, image_keys, budget)
            for name in demos]
    task = data.attrs.get("task")
    native = keys == (POLICY_KEY,) and all(float32 for _, float32 in read)
    return Recording(tuple(ep for ep, _ in read),
                     str(task) if isinstance(task, str) else None, keys, native)


def default_obs_keys(demo: object, path: Path, where: str) -> tuple[str, ...]:
    """``("policy",)`` when ``obs/policy`` is a dataset, else every dataset under ``obs/``
    but camera frames (rank 3 or more) sorted by its path."""
    import h5py

    obs = demo.get("obs") if isinstance(demo, h5py.Group) else None
    if not isinstance(obs, h5py.Group):
        raise ConfigError.one(path, f"{where}/obs", None, "missing group")
    if isinstance(obs.get(POLICY_KEY), h5py.Dataset):
        return (POLICY_KEY,)
    found: list[str] = []
    obs.visititems(lambda name, node: found.append(name)
                   if isinstance(node, h5py.Dataset) and node.ndim < 3 else None)
    if not found:
        raise ConfigError.one(path, f"{where}/obs", [],
                              "no observation datasets (camera frames aside)")
    return tuple(sorted(found))


def _stored(
    group: h5py.Group, key: str, path: Path, field: str, budget: DecodeBudget,
    optional: bool = False,
) -> np.ndarray | None:
    """The dataset ``key`` (a path below ``group``) as stored, numbers only, its bytes charged
    to ``budget`` before it is read; None when it is missing and ``optional``.

    Opened and read through h5py's low-level API (``H5Oopen``, ``H5Dread`` into a fresh
    array): the high-level ``Group.get`` and ``Dataset`` objects cost more than the read itself
    for the small per-demo arrays of a large file.
    """
    import h5py

    try:
        node = h5py.h5o.open(group.id, key.encode())
    except KeyError:
        if optional:
            return None
        raise ConfigError.one(path, field, None, "missing") from None
    if not isinstance(node, h5py.h5d.DatasetID):
        raise ConfigError.one(path, field, type(node).__name__.removesuffix("ID"),
                              "expected a dataset")
    dtype = node.dtype
    if dtype.kind not in "fiub" or dtype.fields is not None or dtype.subdtype is not None:
        raise ConfigError.one(path, field, str(dtype), "expected numbers")
    budget.charge(path, field, math.prod(node.shape) * dtype.itemsize, node.shape, str(dtype))
    out = np.empty(node.shape, dtype)
    if out.size:
        node.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
    return out


def _required(group: h5py.Group, key: str, path: Path, field: str,
              budget: DecodeBudget) -> np.ndarray:
    out = _stored(group, key, path, field, budget)
    if out is None:
        raise ConfigError.one(path, field, None, "missing")
    return out


def _read_demo(
    g: object, path: Path, where: str, keys: tuple[str, ...], image_keys: tuple[str, ...],
    budget: DecodeBudget,
) -> tuple[RawEpisode, bool]:
    """One demo, and whether its observation and actions are stored as float32."""
    import h5py

    if not isinstance(g, h5py.Group):
        raise ConfigError.one(path, where, type(g).__name__, "expected a group")
    stored = [_required(g, f"obs/{k}", path, f"{where}/obs/{k}", budget) for k in keys]
    actions = _required(g, "actions", path, f"{where}/actions", budget)
    float32 = all(a.dtype == np.float32 for a in (*stored, actions))
    with np.errstate(over="ignore"):
        parts = [np.asarray(a, dtype=np.float32) for a in stored]
        rewards = _stored(g, "rewards", path, f"{where}/rewards", budget, optional=True)
        dones = _stored(g, "dones", path, f"{where}/dones", budget, optional=True)
    for k, part in zip(keys, parts, strict=True):
        if part.ndim not in (1, 2) or len(part) != len(parts[0]):
            raise ConfigError.one(path, f"{where}/obs/{k}", part.shape,
                                  f"expected shape (T,) or (T, w) with T = {len(parts[0])}")
    obs_field = f"{where}/obs/{keys[0]}" if len(keys) == 1 else f"{where}/obs/{{{','.join(keys)}}}"
    success = g.attrs.get("success")
    flag = None if success is None else strict_flag(success)
    if success is not None and flag is None:
        raise ConfigError.one(path, f"{where}.attrs.success", success, "expected true or false")
    seed = g.attrs.get("seed")
    if seed is not None and (np.asarray(seed).dtype.kind not in "iu" or np.size(seed) != 1):
        raise ConfigError.one(path, f"{where}.attrs.seed", seed, "expected an integer")
    return RawEpisode(
        obs=join_obs(parts),
        actions=np.asarray(actions, dtype=np.float32),
        rewards=None if rewards is None else np.asarray(rewards, dtype=np.float32),
        dones=None if dones is None else dones != 0,
        success=flag,
        seed=None if seed is None else int(np.asarray(seed).reshape(())),
        obs_field=obs_field,
        actions_field=f"{where}/actions",
        images=_images(g, path, f"{where}/obs", image_keys, budget),
        images_field=f"{where}/obs",
        instruction=g.attrs.get("instruction"),
        instruction_field=f"{where}.attrs.instruction",
    ), float32


def _images(g: h5py.Group, path: Path, where: str, keys: tuple[str, ...],
            budget: DecodeBudget) -> dict[str, np.ndarray]:
    """The camera tensors ``obs/<key>`` of ``keys`` the demo holds, as stored."""
    found = {key: _stored(g, f"obs/{key}", path, f"{where}/{key}", budget, optional=True)
             for key in keys}
    return {key: arr for key, arr in found.items() if arr is not None}


def write_robomimic(path: Path, export: Export) -> None:
    """This project's layout, which robomimic reads: ``obs/policy``, ``env_args`` naming the
    task as robomimic's ``env_name``."""
    write_dataset(path, export.episodes, export.task, export.obs_names, export.action_names,
                  env_args={"env_name": export.task, "type": 2, "env_kwargs": {}})


def write_isaaclab(path: Path, export: Export) -> None:
    """The layout Isaac Lab's ``HDF5DatasetFileHandler`` writes and loads: the robomimic
    layout plus the root ``format_version`` attribute and ``env_args`` of ``{env_name, type}``."""
    import h5py

    write_dataset(path, export.episodes, export.task, export.obs_names, export.action_names,
                  env_args={"env_name": export.task, "type": 2})
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = ISAACLAB_FORMAT_VERSION


def _root_attrs(path: Path) -> dict[str, object] | None:
    """The root attributes of an HDF5 file with a ``data`` group, or None."""
    import h5py

    if not path.is_file():
        return None
    try:
        with h5py.File(path, "r") as f:
            return dict(f.attrs) if isinstance(f.get("data"), h5py.Group) else None
    except OSError:
        return None


def is_isaaclab(path: Path) -> bool:
    """An HDF5 file with ``data/`` whose root carries Isaac Lab's ``format_version``."""
    attrs = _root_attrs(path)
    return attrs is not None and "format_version" in attrs


def is_robomimic(path: Path) -> bool:
    """An HDF5 file with a ``data`` group."""
    return _root_attrs(path) is not None

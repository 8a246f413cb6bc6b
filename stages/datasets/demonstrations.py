"""Demonstration datasets in robomimic-style HDF5, the layout Isaac Lab records and Mimic reads.

::

    data/                      attrs: total (transitions), env_args (JSON), task
      demo_0/                  attrs: num_samples, success, seed, instruction (where the
                               episode was given one: its text)
        obs/policy             (T, obs_dim) float32, attr names
        obs/<camera>_image     (T, height, width, 3) uint8, one per camera (robomimic's
                               image keys): chunks of up to 16 frames, gzip with shuffle
        obs/<camera>_depth     (T, height, width, 1) float32 metres, a depth camera's
        actions                (T, act_dim) float32, attr names
        rewards                (T,) float32
        dones                  (T,) uint8
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from physai_core.errors import ConfigError
from stages.core.limits import memory_bytes

if TYPE_CHECKING:
    import h5py

    from stages.sim.env.cameras import CameraSpec

OBS_KEY = "policy"
IMAGE_CHUNK = 16
"""Frames per chunk of a stored camera tensor (each chunk compressed on its own)."""

T = TypeVar("T")


@dataclass(frozen=True)
class Episode:
    """One recorded episode. Shapes: obs (T, obs_dim), actions (T, act_dim), rewards/dones (T,);
    each camera image ``images[<camera>_image]`` (T, height, width, 3) uint8."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    success: bool
    seed: int
    images: Mapping[str, np.ndarray] = field(default_factory=dict)
    """What the task's cameras saw at every step, by tensor name (:mod:`stages.sim.env.cameras`)."""
    instruction: str | None = None
    """The instruction the episode was given (its scene's, :func:`stages.sim.scenes.scene.
    episode_instructions`), or None."""


def write_dataset(
    path: Path,
    episodes: Sequence[Episode],
    task: str,
    obs_names: Sequence[str],
    action_names: Sequence[str],
    env_args: dict[str, object],
    *,
    first: Path | None = None,
) -> int:
    """Write ``episodes`` to ``path``; returns the number of transitions. Deterministic bytes.

    Each episode's camera tensors (:attr:`Episode.images`) are stored as ``obs/<key>``, as
    robomimic stores its image observations: chunks of up to :data:`IMAGE_CHUNK` whole frames,
    gzip-compressed after byte shuffling, no timestamps. ``first``: a dataset file written
    here whose demos come first, copied as they are stored (DAgger's aggregation); the
    episodes follow them, numbered on.
    """
    import h5py

    total = 0
    with h5py.File(path, "w", track_order=True) as f:
        data = f.create_group("data", track_order=True)
        start = 0
        if first is not None:
            start, total = _copy_demos(first, data)
        for i, ep in enumerate(episodes, start):
            g = data.create_group(f"demo_{i}", track_order=True)
            obs = g.create_group("obs")
            d = obs.create_dataset(OBS_KEY, data=np.asarray(ep.obs, np.float32), track_times=False)
            d.attrs["names"] = json.dumps(list(obs_names))
            for key, frames in ep.images.items():
                _write_frames(obs, key, frames, len(ep.actions))
            a = g.create_dataset("actions", data=np.asarray(ep.actions, np.float32),
                                 track_times=False)
            a.attrs["names"] = json.dumps(list(action_names))
            g.create_dataset("rewards", data=np.asarray(ep.rewards, np.float32),
                             track_times=False)
            g.create_dataset("dones", data=np.asarray(ep.dones, np.uint8), track_times=False)
            g.attrs["num_samples"] = len(ep.actions)
            g.attrs["success"] = bool(ep.success)
            g.attrs["seed"] = int(ep.seed)
            if ep.instruction is not None:
                g.attrs["instruction"] = ep.instruction
            total += len(ep.actions)
        data.attrs["total"] = total
        data.attrs["task"] = task
        data.attrs["env_args"] = json.dumps(env_args, sort_keys=True)
    return total


def _copy_demos(source: Path, data: h5py.Group) -> tuple[int, int]:
    """Copy every demo of the dataset file ``source`` (written by :func:`write_dataset`) into
    ``data`` under its own name; returns (demos, transitions) copied."""
    import h5py

    with h5py.File(source, "r") as f:
        demos = sorted(f["data"], key=demo_number)
        for name in demos:
            f.copy(f["data"][name], data, name=name)
        return len(demos), int(f["data"].attrs["total"])


def _write_frames(obs: h5py.Group, key: str, frames: np.ndarray, steps: int) -> None:
    """Store one episode's camera tensor ``key`` (T, height, width, channels) under ``obs``."""
    arr = np.ascontiguousarray(frames)
    if arr.ndim != 4 or len(arr) != steps:
        raise ValueError(f"camera tensor {key!r}: shape {arr.shape}, expected "
                         f"({steps}, height, width, channels)")
    if not arr.size:
        obs.create_dataset(key, data=arr, track_times=False)
        return
    obs.create_dataset(key, data=arr, chunks=(min(steps, IMAGE_CHUNK), *arr.shape[1:]),
                       compression="gzip", shuffle=True, track_times=False)


@dataclass(frozen=True)
class Transitions:
    """All transitions of a dataset stacked. Shapes: obs (N, obs_dim), actions (N, act_dim),
    episode_index (N,); each camera tensor ``images[<camera>_image]`` (N, height, width, 3)
    uint8 (``<camera>_depth``: (N, height, width, 1) float32), row i seen with ``obs[i]``."""

    obs: np.ndarray
    actions: np.ndarray
    episode_index: np.ndarray
    images: dict[str, np.ndarray] = field(default_factory=dict)
    """Every camera tensor the reader was asked for, by name (:mod:`stages.sim.env.cameras`)."""


def read_transitions(path: Path, obs_dim: int, act_dim: int,
                     cameras: Sequence[CameraSpec] = ()) -> Transitions:
    """Read every demo of a dataset, checking the layout; bad files raise :class:`ConfigError`.

    Each camera of ``cameras`` (the task's, :attr:`TaskSpec.cameras
    <stages.sim.tasks.catalog.TaskSpec.cameras>`) must have its tensors in every demo
    (``data/demo_N/obs/<camera>_image``: (T, height, width, 3) uint8; ``_depth``: (T, height,
    width, 1) float32, finite), checked before any frame is read; a missing key, another shape
    or another dtype is a one-line error naming the key and what was found.

    The file must hold its own data: links other than plain ones (soft and external links),
    datasets stored in other files and virtual datasets are refused, so a dataset never reads
    from outside itself; and its datasets may declare no more than :func:`dataset_limit`
    bytes, checked before anything is read.
    """
    return read_hdf5_file(path, lambda f: _read_demos(f, path, obs_dim, act_dim, cameras))


LIMIT_ENV = "PHYSAI_DATASET_MAX_BYTES"
"""Environment variable that sets :func:`dataset_limit` (bytes)."""
GIB = 2**30


def dataset_limit(env: Mapping[str, str] | None = None) -> int:
    """The most bytes a dataset's arrays may declare: ``$PHYSAI_DATASET_MAX_BYTES``, else a
    quarter of this machine's physical memory (a reader holds the stored arrays, their float32
    copy and the checked episodes at once). A value that is not a positive integer is a
    :class:`ConfigError` naming the variable."""
    value = (os.environ if env is None else env).get(LIMIT_ENV, "").strip()
    if not value:
        return memory_bytes() // 4
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError.one(LIMIT_ENV, "", value, "expected a positive number of bytes")
    return int(value)


def size_text(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it at or above 1 (``1.2 TiB``)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def over_limit(path: Path, field: str, need: int, limit: int, what: object,
               detail: str) -> ConfigError:
    """The error for ``field`` of ``path`` declaring ``need`` bytes (``detail``: shape and type,
    ``what``: the value quoted) when a dataset may use ``limit``."""
    return ConfigError.one(path, field, what,
                           f"declares {size_text(need)} ({detail}), more than the "
                           f"{size_text(limit)} a dataset may use ({LIMIT_ENV})")


class DecodeBudget:
    """The bytes one read of a foreign dataset may still decode, shared by everything that
    read decodes: HDF5 datasets, Parquet row groups, image frames, video frames, a space's
    bounds. A reader charges what a header says it is about to decode before decoding it
    (:meth:`charge`), and what it finds past that once decoded, so that no header, however
    small its file, makes a reader hold more than :func:`dataset_limit` bytes."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = dataset_limit() if limit is None else limit
        """The most bytes the read may decode (:func:`dataset_limit` unless given)."""
        self.used = 0
        """The bytes charged so far."""

    def charge(self, path: Path, field: str, need: int, what: object, detail: str) -> None:
        """Count ``need`` more bytes, those of ``field`` of ``path`` (``detail``: its shape and
        type, ``what``: the value quoted), or refuse them with a :class:`ConfigError` when they
        pass the limit, alone or with what was charged before."""
        if self.used + need <= self.limit:
            self.used += need
            return
        if not self.used:
            raise over_limit(path, field, need, self.limit, what, detail)
        raise ConfigError.one(path, field, what,
                              f"declares {size_text(need)} ({detail}); with the "
                              f"{size_text(self.used)} decoded before it, more than the "
                              f"{size_text(self.limit)} a dataset may use ({LIMIT_ENV})")

    def check(self, path: Path, field: str, need: int, what: object, detail: str) -> None:
        """Refuse ``need`` bytes as :meth:`charge` would, without counting them (a size checked
        before the total it is part of is charged)."""
        if self.used + need > self.limit:
            self.charge(path, field, need, what, detail)


@contextlib.contextmanager
def image_header(path: Path, field: str, data: bytes, formats: Sequence[str],
                 value: object) -> Iterator[Any]:
    """A frame's bytes opened as one of ``formats`` (Pillow's names: ``PNG``, ``JPEG``), its
    header read and nothing decoded, so that its size can be checked and charged to a
    :class:`DecodeBudget` first; bytes that are none of them are a :class:`ConfigError`
    naming ``field`` and ``value``."""
    from PIL import Image

    with warnings.catch_warnings():
        # The size is checked and charged before any frame is decoded: Pillow's own bomb
        # warning would only repeat it.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=tuple(formats))
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ConfigError.one(path, field, value,
                                  f"unreadable image: {exc}") from None
    with image:
        yield image


def read_hdf5_file(path: Path, read: Callable[[h5py.File], T]) -> T:
    """``read(file)`` on the HDF5 file at ``path``, opened read-only; a file HDF5 cannot open
    or read is one :class:`ConfigError` naming it."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise ConfigError.one(path, "", str(path), f"not an HDF5 file: {exc}") from None
    try:
        with f:
            return read(f)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, SystemError) as exc:
        # h5py raises SystemError for some HDF5 errors met while visiting a corrupt file.
        raise ConfigError.one(path, "", str(path), f"unreadable HDF5 file: {exc}") from None


def check_self_contained(f: h5py.File, path: Path, budget: DecodeBudget | None = None) -> int:
    """Refuse a file that reads from outside itself: soft and external links, datasets stored
    in other files, virtual datasets (:class:`ConfigError` naming the key); and one whose
    datasets declare more than ``budget`` has left (default: a fresh :class:`DecodeBudget`),
    one of them or all together, before any is read; their bytes are charged to it. Returns
    the bytes its datasets declare.

    Walks the file with h5py's low-level visits (``H5Lvisit``, ``H5Ovisit``), which make no
    Python object per node: on a file of thousands of demos this costs a tenth of
    ``visititems``.
    """
    import h5py

    budget = DecodeBudget() if budget is None else budget

    def odd_link(name: bytes, info: h5py.h5l.LinkInfo) -> tuple[str, str] | None:
        if info.type == h5py.h5l.TYPE_HARD:
            return None
        kinds = {h5py.h5l.TYPE_SOFT: "SoftLink", h5py.h5l.TYPE_EXTERNAL: "ExternalLink"}
        return name.decode(errors="replace"), kinds.get(info.type, "UserDefinedLink")

    link = f.id.links.visit(odd_link, info=True)
    if link is not None:
        raise ConfigError.one(path, link[0], link[1],
                              "links other than plain ones are not allowed in a dataset")
    total = [0, 0]

    def stored_outside(name: bytes, info: h5py.h5o.ObjInfo) -> tuple[str, str] | None:
        if info.type != h5py.h5o.TYPE_DATASET:
            return None
        node = h5py.h5d.open(f.id, name)
        dcpl = node.get_create_plist()
        if dcpl.get_layout() == h5py.h5d.VIRTUAL:
            return name.decode(errors="replace"), "virtual"
        if dcpl.get_external_count():
            return name.decode(errors="replace"), "external"
        shape = node.shape or ()
        need = math.prod(shape) * node.get_type().get_size()
        budget.check(path, name.decode(errors="replace"), need, shape, str(node.dtype))
        total[0] += need
        total[1] += 1
        return None

    stored = h5py.h5o.visit(f.id, stored_outside, info=True)
    if stored is not None:
        raise ConfigError.one(path, stored[0], stored[1],
                              "data stored outside the file is not allowed in a dataset")
    budget.charge(path, "", total[0], total[0], f"{total[1]} datasets together")
    return total[0]


def _read_demos(f: h5py.File, path: Path, obs_dim: int, act_dim: int,
                cameras: Sequence[CameraSpec]) -> Transitions:
    import h5py

    check_self_contained(f, path)
    data = f.get("data")
    if not isinstance(data, h5py.Group):
        found = None if data is None else type(data).__name__
        raise ConfigError.one(path, "data", found, "missing group")
    demos = sorted(data.keys(), key=demo_number)
    if not demos:
        raise ConfigError.one(path, "data", [], "dataset holds no demos")
    obs_parts, act_parts, idx_parts = [], [], []
    for i, name in enumerate(demos):
        g = data[name]
        obs = _read(g, f"obs/{OBS_KEY}", path, name, (obs_dim,))
        act = _read(g, "actions", path, name, (act_dim,))
        if len(obs) != len(act):
            raise ConfigError.one(
                path, f"data/{name}/actions", act.shape, f"length differs from obs {obs.shape}"
            )
        obs_parts.append(obs)
        act_parts.append(act)
        idx_parts.append(np.full(len(act), i, dtype=np.int64))
    if not sum(len(a) for a in act_parts):
        raise ConfigError.one(path, "data", demos, "dataset holds no transitions")
    images = _read_images(data, demos, [len(a) for a in act_parts], path, cameras)
    return Transitions(
        np.concatenate(obs_parts), np.concatenate(act_parts), np.concatenate(idx_parts), images
    )


def _read_images(data: h5py.Group, demos: Sequence[str], lengths: Sequence[int], path: Path,
                 cameras: Sequence[CameraSpec]) -> dict[str, np.ndarray]:
    """Every tensor of ``cameras`` in every demo, stacked along time: (N, height, width, c).
    Every demo's tensors are checked (key, dtype, shape) before any frame is read."""
    nodes: dict[str, list[h5py.Dataset]] = {}
    for cam in cameras:
        for key in cam.tensors():
            nodes[key] = [
                camera_node(data[name], path, f"data/{name}/obs/{key}", cam, key, steps)
                for name, steps in zip(demos, lengths, strict=True)]
    out: dict[str, np.ndarray] = {}
    for key, found in nodes.items():
        arr = np.empty((sum(lengths), *found[0].shape[1:]), found[0].dtype)
        start = 0
        for node, name in zip(found, demos, strict=True):
            if len(node):
                node.read_direct(arr, dest_sel=np.s_[start:start + len(node)])
                if arr.dtype.kind == "f" and not np.isfinite(arr[start:start + len(node)]).all():
                    raise ConfigError.one(path, f"data/{name}/obs/{key}", "NaN/inf",
                                          "non-finite values")
            start += len(node)
        out[key] = arr
    return out


def camera_node(demo: object, path: Path, field: str, cam: CameraSpec, key: str,
                steps: int) -> h5py.Dataset:
    """The dataset ``obs/<key>`` of one demo of ``steps`` steps, once
    :func:`check_camera_tensor` passes it; otherwise a :class:`ConfigError` naming ``field``."""
    import h5py

    node = demo.get(f"obs/{key}") if isinstance(demo, h5py.Group) else None
    if node is not None and not isinstance(node, h5py.Dataset):
        raise ConfigError.one(path, field, type(node).__name__, "expected a dataset")
    check_camera_tensor(path, field, cam, key, node, steps)
    assert node is not None
    return node


def check_camera_tensor(path: Path, field: str, cam: CameraSpec, key: str,
                        found: np.ndarray | h5py.Dataset | None, steps: int) -> None:
    """Refuse camera ``cam``'s tensor ``key`` of an episode of ``steps`` steps when it is
    missing (``found`` None), or its dtype or shape is not what the camera gives: one
    :class:`ConfigError` naming ``path``, ``field`` and what was found."""
    what = f"camera {cam.name!r} (width {cam.width}, height {cam.height})"
    if found is None:
        raise ConfigError.one(path, field, None, f"missing: the task observes through {what}")
    dtype = cam.dtype(key)
    if found.dtype != dtype:
        raise ConfigError.one(path, field, str(found.dtype), f"expected {dtype} frames of {what}")
    want = (steps, *cam.shape(key))
    if tuple(found.shape) != want:
        raise ConfigError.one(path, field, tuple(found.shape),
                              f"expected shape {want} (T, height, width, channels) of {what}")


def demo_number(name: str) -> int:
    """The N of ``demo_N`` (-1 for any other name), the order demos are read in."""
    _, _, n = name.partition("_")
    return int(n) if n.isdigit() else -1


def _read(
    group: object, key: str, path: Path, demo: str, tail: tuple[int, ...]
) -> np.ndarray:
    import h5py

    field = f"data/{demo}/{key}"
    if not isinstance(group, h5py.Group) or key not in group:
        raise ConfigError.one(path, field, None, "missing")
    node = group[key]
    if not isinstance(node, h5py.Dataset):
        raise ConfigError.one(path, field, type(node).__name__, "expected a dataset")
    if node.dtype.kind not in "fiub":
        raise ConfigError.one(path, field, str(node.dtype), "expected numbers")
    with np.errstate(over="ignore"):
        arr = np.asarray(node[()], dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1:] != tail:
        raise ConfigError.one(path, field, arr.shape, f"expected shape (T, {tail[0]})")
    if not np.isfinite(arr).all():
        raise ConfigError.one(path, field, "NaN/inf", "non-finite values")
    return arr

"""The dataset-format registry: what ``flows dataset import --format`` and ``collect.format`` name.

A format is a name, a reader (file or folder -> :class:`Recording`, episodes as the file holds
them) and a writer (checked episodes -> files in that format). Readers only read; every
recording is then checked against the task's observation and action widths, finite values,
episode structure and camera images (shape and dtype of each camera the task declares) by
:func:`check_recording`, one rule for every format. The shipped formats
are ``isaaclab`` and ``robomimic`` (HDF5 ``data/demo_N``), ``lerobot`` (LeRobot v3 parquet) and
``minari`` (Minari's own storage); a plugin adds its own through the entry-point group
``physai_flows.dataset_formats`` (:mod:`physai_core.plugins`) by calling :func:`register_format`.

A format also says which action units its files hold unless they say so themselves
(:attr:`DatasetFormat.action_units`, :attr:`Recording.action_units`, stages/core/units.py):
``native`` for Minari and LeRobot, whose datasets record what the environment or robot was
sent; ``normalized`` for robomimic and Isaac Lab, whose environments take the policy's actions
and scale them in their own controllers and action terms.

Reading the registry imports no format library: readers and writers are ``module:function``
names imported on use. Whatever the format, a source is checked before its reader sees it
(:func:`stages.datasets.contained.check_source`): its own regular files only (no symbolic
links, no HDF5 links or storage reaching outside a file) and arrays whose decoded sizes (a
dictionary-encoded Parquet column's expanded values included) fit
:func:`stages.datasets.demonstrations.dataset_limit`. The shipped readers then charge what they
decode to a :class:`~stages.datasets.demonstrations.DecodeBudget` of the same limit before decoding
it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import BackendUnavailableError, ConfigError
from physai_core.plugins import Registry, resolve_ref
from stages.core.units import UNITS, ActionUnits
from stages.datasets.contained import check_source, source_files
from stages.datasets.demonstrations import Episode, check_camera_tensor

if TYPE_CHECKING:
    from stages.sim.env.cameras import CameraSpec


@dataclass(frozen=True)
class RawEpisode:
    """One episode as a file holds it, not yet checked.

    Shapes: obs (T, obs_width), actions (T, act_width), rewards and dones (T,) or None when the
    file stores none; each camera tensor ``images[<camera>_image]`` as stored, (T, height,
    width, 3) uint8 once checked. ``obs_field`` and ``actions_field`` name where the arrays came
    from, as error messages name them (``data/demo_3/obs/policy``), and ``images_field`` where
    the camera tensors are (``data/demo_3/obs``: ``data/demo_3/obs/front_image``).
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray | None
    dones: np.ndarray | None
    success: bool | None
    seed: int | None
    obs_field: str
    actions_field: str
    images: Mapping[str, np.ndarray] = field(default_factory=dict)
    """The camera tensors the reader was asked for and found, by name (``front_image``)."""
    images_field: str = ""
    """Where the camera tensors are; empty: beside the actions."""
    instruction: object = None
    """The instruction the file gives the episode (a text once checked), or None."""
    instruction_field: str = ""
    """Where the instruction is, as error messages name it."""


@dataclass(frozen=True)
class Recording:
    """Everything a reader found in one source."""

    episodes: tuple[RawEpisode, ...]
    task: str | None
    """The task id the file declares, if any (``--task`` overrides it)."""
    obs_keys: tuple[str, ...]
    """Observation keys joined into each observation, in order."""
    native: bool = False
    """Whether the source file already is in the store's layout
    (:mod:`stages.datasets.demonstrations`: float32 ``obs/policy`` and ``actions`` in every
    ``data/demo_N``), so that, once checked, it is published as it is instead of being written
    again."""
    action_units: ActionUnits | None = None
    """The units the file says its actions are in (one this project wrote says
    ``normalized``); None: it does not say, and the format's default holds."""


@dataclass(frozen=True)
class Export:
    """What a writer writes: checked episodes and the task's names and rate."""

    episodes: tuple[Episode, ...]
    task: str
    obs_names: tuple[str, ...]
    action_names: tuple[str, ...]
    control_hz: float
    """Control rate, Hz (LeRobot's ``fps``)."""


@dataclass(frozen=True)
class DatasetFormat:
    """A dataset format: name, reader and writer."""

    name: str
    """What ``--format`` and ``collect.format`` say, e.g. ``lerobot``."""
    description: str
    """One line on the layout, shown by ``flows dataset inspect``."""
    reader_ref: str
    """``module:function``: ``read(path, obs_keys[, image_keys]) -> Recording``; a reader of
    camera images takes ``image_keys`` (the tensor names to read, ``front_image``) and puts
    the ones it finds in :attr:`RawEpisode.images`; it is called with them only when the task
    declares cameras."""
    writer_ref: str
    """``module:function``: ``write(path, export) -> None``; writes a new file or folder."""
    sniff_ref: str | None = None
    """``module:function``: ``sniff(path) -> bool``, whether ``path`` looks like this format
    (what ``flows dataset inspect`` without ``--format`` asks); None: never guessed."""
    extra: str | None = None
    """The pip extra its library comes with (None: the core install has it)."""
    action_units: ActionUnits = "normalized"
    """The units of a file's actions when neither the import nor the file says
    (stages/core/units.py)."""

    def _resolve(self, ref: str) -> Callable[..., Any]:
        try:
            fn: Callable[..., Any] = resolve_ref(ref, what=f"dataset format {self.name!r}")
        except ImportError as exc:
            missing = exc.__cause__  # the import that failed; None: the attribute is missing
            if self.extra is None or not isinstance(missing, ImportError):
                raise
            raise BackendUnavailableError(f"dataset format {self.name}", self.extra,
                                          missing) from exc
        return fn

    def _call(self, ref: str, *args: Any) -> Any:
        return self._resolve(ref)(*args)

    def read(self, path: Path, obs_keys: Sequence[str] = (),
             image_keys: Sequence[str] = (), cameras: Sequence[CameraSpec] = ()) -> Recording:
        """Read ``path``; ``obs_keys`` picks and orders the observation keys to join,
        ``image_keys`` names the camera tensors to read beside them (a reader that takes none
        is refused then, in one line); ``cameras``, the task's, are what a reader checks
        frame sizes against before decoding them (:func:`task_camera`). The source is
        checked first (:func:`stages.datasets.contained.check_source`), whatever the
        format."""
        check_source(path)
        read = self._resolve(self.reader_ref)
        args: tuple[Any, ...] = (path, tuple(obs_keys))
        if image_keys:
            args = (*args, tuple(image_keys))
            if not _takes(read, args):
                raise ConfigError.one(path, "--format", self.name,
                                      f"this format's reader reads no camera images; the task "
                                      f"observes through {', '.join(image_keys)}")
        token = _TASK_CAMERAS.set(tuple(cameras))
        try:
            out: Recording = read(*args)
        finally:
            _TASK_CAMERAS.reset(token)
        return out

    def write(self, path: Path, export: Export) -> None:
        """Write ``export`` to ``path`` in this format."""
        self._call(self.writer_ref, path, export)

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` looks like this format (cheap: reads only headers)."""
        return self.sniff_ref is not None and bool(self._call(self.sniff_ref, path))


_TASK_CAMERAS: ContextVar[tuple[CameraSpec, ...]] = ContextVar("dataset_task_cameras",
                                                               default=())


def task_camera(key: str) -> CameraSpec | None:
    """The task's camera whose tensor ``key`` is (``front_image``), while
    :meth:`DatasetFormat.read` reads with the task's cameras; None otherwise. A reader checks
    the frame sizes a header gives against it before decoding any frame."""
    return next((cam for cam in _TASK_CAMERAS.get() if key in cam.tensors()), None)


def _takes(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    """Whether ``fn`` can be called with ``args`` (an uninspectable callable is trusted)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*args)
    except TypeError:
        return False
    return True


def register_format(fmt: DatasetFormat) -> DatasetFormat:
    """Add ``fmt`` to the registry and return it; a second one under one name is an error."""
    return FORMATS.register(fmt)


def _register_builtins() -> None:
    hdf5 = "stages.datasets.hdf5_formats"
    register_format(DatasetFormat(
        "robomimic", "robomimic HDF5: data/demo_N/{obs/<key>,actions,rewards,dones}",
        f"{hdf5}:read_hdf5", f"{hdf5}:write_robomimic", f"{hdf5}:is_robomimic"))
    register_format(DatasetFormat(
        "isaaclab", "Isaac Lab recorder HDF5 (HDF5DatasetFileHandler): data/demo_N/"
        "{obs/<key>,actions}", f"{hdf5}:read_hdf5", f"{hdf5}:write_isaaclab",
        f"{hdf5}:is_isaaclab"))
    register_format(DatasetFormat(
        "lerobot", "LeRobot v3: meta/info.json, meta/stats.json, meta/tasks.parquet, "
        "meta/episodes/chunk-000/file-000.parquet, data/chunk-000/file-000.parquet",
        "stages.datasets.lerobot_reader:read_lerobot",
        "stages.datasets.lerobot_writer:write_lerobot",
        "stages.datasets.lerobot_format:is_lerobot", action_units="native"))
    register_format(DatasetFormat(
        "minari", "Minari dataset folder: data/main_data.hdf5 and data/metadata.json",
        "stages.datasets.minari_format:read_minari",
        "stages.datasets.minari_format:write_minari",
        "stages.datasets.minari_format:is_minari", extra="minari", action_units="native"))


FORMATS: Registry[DatasetFormat] = Registry("dataset format", _register_builtins)
"""Every dataset format, plugins' included."""


def get_format(name: str) -> DatasetFormat:
    """The registered format ``name``; an unknown one lists the valid ones."""
    return FORMATS.get(name)


def format_names() -> tuple[str, ...]:
    """Names of every registered dataset format, sorted."""
    return FORMATS.names()


def guess_format(path: Path) -> str | None:
    """The first registered format (by name) whose sniff recognizes ``path``, or None. A
    source holding a symbolic link or a special file is refused before any sniff reads it."""
    source_files(path)
    for name in format_names():
        try:
            if get_format(name).sniff(path):
                return name
        except BackendUnavailableError:
            continue
    return None


def declared_units(path: Path, field: str, value: object) -> ActionUnits | None:
    """The action units a file declares at ``field`` (None when it declares none); any
    value but ``native`` or ``normalized`` is a :class:`ConfigError` naming the field."""
    if value is None:
        return None
    if value == "native":
        return "native"
    if value == "normalized":
        return "normalized"
    raise ConfigError.one(path, field, value, f"expected one of {', '.join(UNITS)}")


def strict_flag(value: object) -> bool | None:
    """``value`` as a boolean when it is one: a bool, or a number equal to 0 or 1 (numpy's
    included, or a one-element array of one); None for anything else, so that a string such
    as ``"False"`` never counts as true."""
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind not in "biuf":
        return None
    item = arr.reshape(()).item()
    return bool(item) if item in (0, 1) else None


def join_obs(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Observation arrays of one episode joined along the feature axis, in the order given.

    Each part has shape (T,) or (T, w); the result (T, sum of w), float32. One part is
    returned as it is (no copy) when it is already 2-D.
    """
    cols = [p[:, None] if p.ndim == 1 else p for p in parts]
    if len(cols) == 1:
        return cols[0]
    return np.concatenate(cols, axis=1, dtype=np.float32)


def check_recording(
    path: Path, rec: Recording, obs_dim: int, act_dim: int,
    cameras: Sequence[CameraSpec] = (),
) -> tuple[Episode, ...]:
    """Check every episode of ``rec`` against the task's widths and ``cameras`` (the task's);
    returns them as episodes, holding the images of ``cameras`` and no other.

    Raises :class:`ConfigError` naming the file, the field and the value on the first problem:
    a width that differs from the task's, a non-finite value, an empty episode, actions and
    observations of different lengths, rewards or dones of another length, a camera tensor
    missing or of another shape (T, height, width, channels) or dtype (uint8 colour, float32
    depth). Rewards missing from the file are zeros; dones missing mark the last step; a
    success the file does not record counts as False.
    """
    if not rec.episodes:
        raise ConfigError.one(path, "", str(path), "dataset holds no episodes")
    return tuple(_check_episode(path, ep, obs_dim, act_dim, cameras) for ep in rec.episodes)


def _check_array(path: Path, field: str, arr: np.ndarray, width: int) -> np.ndarray:
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ConfigError.one(path, field, tuple(arr.shape), f"expected shape (T, {width})")
    if not len(arr):
        raise ConfigError.one(path, field, tuple(arr.shape), "episode holds no steps")
    out = np.asarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out))[0]
        raise ConfigError.one(path, field, float(out[tuple(bad)]),
                              f"non-finite value at step {bad[0]}, entry {bad[1]}")
    return out


def _check_images(path: Path, ep: RawEpisode, steps: int,
                  cameras: Sequence[CameraSpec]) -> dict[str, np.ndarray]:
    """The tensors of ``cameras`` in ``ep``, each checked: present, dtype, (steps, *shape),
    finite depth."""
    where = ep.images_field or ep.actions_field.rpartition("/")[0] or ep.actions_field
    out: dict[str, np.ndarray] = {}
    for cam in cameras:
        for key in cam.tensors():
            arr = ep.images.get(key)
            check_camera_tensor(path, f"{where}/{key}", cam, key, arr, steps)
            assert arr is not None
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise ConfigError.one(path, f"{where}/{key}", "NaN/inf", "non-finite values")
            out[key] = np.ascontiguousarray(arr)
    return out


def _check_episode(path: Path, ep: RawEpisode, obs_dim: int, act_dim: int,
                   cameras: Sequence[CameraSpec]) -> Episode:
    obs = _check_array(path, ep.obs_field, ep.obs, obs_dim)
    actions = _check_array(path, ep.actions_field, ep.actions, act_dim)
    steps = len(actions)
    if len(obs) != steps:
        raise ConfigError.one(path, ep.actions_field, tuple(actions.shape),
                              f"length differs from the observations' {tuple(obs.shape)}")
    where = ep.actions_field.rpartition("/")[0] or ep.actions_field
    rewards = np.zeros(steps, np.float32) if ep.rewards is None else ep.rewards
    if rewards.shape != (steps,) or not np.isfinite(rewards).all():
        raise ConfigError.one(path, f"{where}/rewards", tuple(rewards.shape),
                              f"expected {steps} finite rewards")
    if ep.dones is None:
        dones = np.zeros(steps, bool)
        dones[-1] = True
    else:
        dones = np.asarray(ep.dones, dtype=bool)
    if dones.shape != (steps,):
        raise ConfigError.one(path, f"{where}/dones", tuple(dones.shape),
                              f"expected {steps} done flags")
    success = False if ep.success is None else strict_flag(ep.success)
    if success is None:
        raise ConfigError.one(path, f"{where}/success", ep.success, "expected true or false")
    return Episode(obs, actions, np.asarray(rewards, np.float32), dones, success,
                   int(ep.seed or 0), _check_images(path, ep, steps, cameras),
                   checked_instruction(path, ep.instruction_field or f"{where}/instruction",
                                       ep.instruction))


MAX_INSTRUCTION_CHARS = 1000
"""Longest instruction a dataset may give an episode (characters), as a scene may."""


def checked_instruction(path: Path, field: str, value: object) -> str | None:
    """An episode's instruction as a file gives it: None, or a text (UTF-8 bytes decoded) of
    1 .. :data:`MAX_INSTRUCTION_CHARS` characters; anything else a one-line
    :class:`ConfigError` naming ``path`` and ``field``."""
    if value is None:
        return None
    if isinstance(value, bytes | np.bytes_):
        raw = bytes(value)
        try:
            value = raw.decode()
        except UnicodeDecodeError:
            raise ConfigError.one(path, field, repr(raw[:40]), "expected UTF-8 text") from None
    if isinstance(value, np.str_):
        value = str(value)
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_INSTRUCTION_CHARS:
        shown = value[:40] + "..." if isinstance(value, str) and len(value) > 40 else value
        raise ConfigError.one(path, field, shown, f"expected a text of 1 .. "
                              f"{MAX_INSTRUCTION_CHARS} characters")
    return value

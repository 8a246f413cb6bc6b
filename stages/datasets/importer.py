"""Datasets in and out of the artifact store: import a file in any registered format, inspect
one, export a stored dataset to any format.

An import reads the source with its format's reader, checks every episode against the task's
observation and action widths and its cameras' image shapes and dtypes
(:func:`stages.datasets.formats.check_recording`), writes the episodes, with the images of the
task's cameras, in this project's HDF5 layout (:mod:`stages.datasets.demonstrations`) and publishes
that file as a :class:`~stages.artifacts.records.Dataset`. The artifact's ``expert`` field names
where the actions came from, ``import:<format>:sha256:<source digest>``, and the MLflow run that
made it carries the tags ``physai.dataset.source_sha256`` and ``physai.dataset.source_format``. The
published bytes depend only on the source's content, its format and the observation keys, never on
its path, so importing one file twice gives one artifact. A source already in the store's layout
(float32 ``obs/policy`` and ``actions``) is published unchanged once checked.

Actions are stored in the task's normalized convention (stages/core/units.py). A source's units are
what the import says (``--action-units``), else what the file says, else its format's default
(:attr:`~stages.datasets.formats.DatasetFormat.action_units`). Native actions of a task whose
environment has units of its own (a ``gymnasium:`` task's action Box) are converted to the
task's convention, and the published file says so: its ``env_args`` record
``source.action_units: native`` and the range converted from (``source.native_actions``); the
run's parameters and the tag ``physai.dataset.action_units`` say which units the source was in.
A source in units that already are the task's is published with the bytes it had before units
were declared.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from physai_core.errors import ConfigError, UnknownNameError
from stages.artifacts.records import Dataset, Producer
from stages.core.hashing import sha256_file, sha256_json
from stages.core.units import ActionRange, ActionUnits
from stages.datasets.contained import source_files
from stages.datasets.demonstrations import Episode, write_dataset
from stages.datasets.formats import (
    DatasetFormat,
    Export,
    Recording,
    check_recording,
    get_format,
)
from stages.storage.store import ArtifactStore
from stages.tracking.lineage import StageRun

log = logging.getLogger(__name__)

IMPORT_VERSION = "2"
"""Version of the import; part of the producer record of every imported dataset (2: native
actions are converted to the task's convention)."""
EXPERT_PREFIX = "import:"


def source_digest(path: Path) -> str:
    """sha256 of a source: of the file, or for a folder (LeRobot, Minari) of the sorted list of
    its files' relative paths and sha256s, so renaming the folder keeps its digest. A source
    holding a symbolic link or a special file is refused
    (:func:`stages.datasets.contained.source_files`)."""
    files = source_files(path)
    if files == [path]:
        return sha256_file(path)
    return sha256_json([[p.relative_to(path).as_posix(), sha256_file(p)] for p in files])


def expert_of(fmt: str, digest: str) -> str:
    """The ``expert`` an imported dataset records: ``import:<format>:sha256:<digest>``."""
    return f"{EXPERT_PREFIX}{fmt}:sha256:{digest}"


@dataclass(frozen=True)
class Converted:
    """A checked source in this project's HDF5 layout, ready to publish."""

    path: Path
    """The HDF5 file to publish (in a scratch folder, or the source itself)."""
    source: Path
    source_digest: str
    format: str
    task: str
    obs_keys: tuple[str, ...]
    episodes: int
    transitions: int
    success_rate: float
    """Share of episodes the source marks successful (unmarked ones count as failures)."""
    obs_names: tuple[str, ...]
    action_names: tuple[str, ...]
    owned: bool = True
    """Whether ``path`` is a file written for the import (removed once published), not the
    source itself (a source already in the store's layout is published as it is)."""
    action_units: ActionUnits = "normalized"
    """The units the source's actions were in (stages/core/units.py)."""
    converted_from: ActionRange | None = None
    """The native range the actions were converted from; None: stored as the source holds
    them (normalized, or native units that are the task's own)."""
    image_keys: tuple[str, ...] = ()
    """The camera tensors carried with the episodes (the task's, ``front_image``)."""

    def discard(self) -> None:
        """Remove the file written for the import, if any."""
        if self.owned:
            self.path.unlink(missing_ok=True)

    @property
    def expert(self) -> str:
        """The ``expert`` field of the published dataset."""
        return expert_of(self.format, self.source_digest)

    @property
    def conversion(self) -> str:
        """What was done to the actions, in words: ``native -1..1 maps to -3..3`` or
        ``none``."""
        if self.converted_from is None:
            return "none"
        return f"native {self.converted_from.describe()}"


def resolve_task(source: Path, task: str | None, declared: str | None) -> str:
    """``task``, else the one the file declares; an unknown or missing one is a
    :class:`ConfigError` naming the file."""
    from stages.sim.tasks.catalog import get_task

    name = task or declared
    if name is None:
        raise ConfigError.one(source, "--task", None,
                              "the file names no task of this project; pass --task")
    try:
        get_task(name)
    except UnknownNameError as exc:
        raise ConfigError.one(source, "--task", name, str(exc)) from None
    return name


def read_for_task(
    source: Path, reader: DatasetFormat, task: str | None, obs_keys: Sequence[str] = ()
) -> tuple[str | None, Recording]:
    """Read ``source`` with the camera tensors of its task: ``task``, else the one the file
    names (then read a second time, for the images, when that task observes through cameras);
    ``(None, recording)`` when neither names a task. An unknown task is a
    :class:`ConfigError` naming ``--task``."""
    from stages.sim.env.cameras import image_keys
    from stages.sim.tasks.catalog import get_task

    cameras = get_task(resolve_task(source, task, None)).cameras if task else ()
    rec = reader.read(source, obs_keys, image_keys(cameras), cameras)
    if task is not None or rec.task is None:
        return task, rec
    name = resolve_task(source, None, rec.task)
    cameras = get_task(name).cameras
    return name, reader.read(source, obs_keys, image_keys(cameras), cameras) if cameras else rec


def read_checked(
    source: Path, fmt: str, task: str | None = None, obs_keys: Sequence[str] = ()
) -> tuple[str, tuple[str, ...], tuple[Episode, ...]]:
    """Read ``source`` in format ``fmt`` and check it: ``(task, obs keys, episodes)``."""
    name, rec, episodes = _read(source, fmt, task, obs_keys)
    return name, rec.obs_keys, episodes


def source_units(fmt: str, rec: Recording, declared: ActionUnits | None = None) -> ActionUnits:
    """The units a source's actions are in: ``declared`` (by the import), else the file's
    own word, else the default of format ``fmt``."""
    return declared or rec.action_units or get_format(fmt).action_units


def normalized_episodes(
    episodes: tuple[Episode, ...], native: ActionRange
) -> tuple[Episode, ...]:
    """``episodes`` with their native actions in the normalized convention of ``native``."""
    return tuple(dataclasses.replace(e, actions=native.to_normalized(e.actions))
                 for e in episodes)


def _read(
    source: Path, fmt: str, task: str | None, obs_keys: Sequence[str]
) -> tuple[str, Recording, tuple[Episode, ...]]:
    from stages.sim.tasks.catalog import get_task

    try:
        reader = get_format(fmt)
    except UnknownNameError as exc:
        raise ConfigError.one(source, "--format", fmt, str(exc)) from None
    if not source.exists():
        raise ConfigError.one(source, "", str(source), "no such file or folder")
    found, rec = read_for_task(source, reader, task, obs_keys)
    name = resolve_task(source, found, rec.task)
    spec = get_task(name)
    return name, rec, check_recording(source, rec, spec.obs_dim, spec.act_dim, spec.cameras)


def convert(
    source: Path, fmt: str, scratch: Path, task: str | None = None,
    obs_keys: Sequence[str] = (), action_units: ActionUnits | None = None,
) -> Converted:
    """Read and check ``source``, then write it in this project's layout under ``scratch``,
    its actions in the task's normalized convention (see the module doc; ``action_units``:
    the units the import declares, None: the file's or its format's).

    Raises :class:`ConfigError` (exit status 2) naming the file, the key and the value on bad
    input; nothing is left in ``scratch`` then.
    """
    from stages.sim.tasks.catalog import get_task

    name, rec, episodes = _read(source, fmt, task, obs_keys)
    keys = rec.obs_keys
    digest = source_digest(source)
    spec = get_task(name)
    units = source_units(fmt, rec, action_units)
    native = spec.action_range()
    converted_from = native if units == "native" and not native.is_identity else None
    described: dict[str, object] = {"format": fmt, "sha256": digest, "obs_keys": list(keys)}
    if converted_from is not None:
        episodes = normalized_episodes(episodes, converted_from)
        described.update(action_units=units, native_actions={
            "low": list(converted_from.low), "high": list(converted_from.high)})
    _warn_outside(source, episodes, units, native)
    transitions = sum(len(e.actions) for e in episodes)
    out, owned = source, False
    if not rec.native or converted_from is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        out, owned = scratch / f"import-{digest[:16]}-{fmt}.hdf5", True
        write_dataset(
            out, episodes, task=name, obs_names=spec.obs_names, action_names=spec.action_names,
            env_args={"source": described},
        )
    return Converted(out, source, digest, fmt, name, keys, len(episodes), transitions,
                     float(np.mean([e.success for e in episodes])), spec.obs_names,
                     spec.action_names, owned, units, converted_from,
                     tuple(episodes[0].images))


def _warn_outside(
    source: Path, episodes: tuple[Episode, ...], units: ActionUnits, native: ActionRange,
) -> None:
    """Log a warning when the stored actions leave -1..1 by more than rounding: a source
    taken as normalized that holds native actions looks like this."""
    peak = max(float(np.abs(e.actions).max()) for e in episodes)
    if peak <= 1.0 + 1e-3:
        return
    hint = ("if the source holds the environment's own units, import it with action_units "
            "native" if units == "normalized" else
            f"the source's native actions leave the environment's range ({native.describe()}), "
            "which the simulator clips")
    log.warning("%s: actions reach %.3g in the task's convention (-1..1) taken as %s; %s",
                source, peak, units, hint)


def publish_converted(
    converted: Converted, store: ArtifactStore, producer: Producer, run: StageRun | None,
    parents: tuple[str, ...] = (),
) -> Dataset:
    """Publish a converted source as a Dataset; logs it as an input of ``run`` and tags the
    run with the source's digest and format. The scratch file is removed."""
    c = converted
    try:
        dataset = store.publish(
            c.path,
            lambda digest, uri: Dataset(
                digest=digest, uri=uri, producer=producer, parents=parents,
                mlflow_run_id=run.run_id if run is not None else None,
                task=c.task, episodes=c.episodes, transitions=c.transitions,
                obs_names=c.obs_names, action_names=c.action_names,
                scene_digest="", expert_success_rate=c.success_rate, expert=c.expert,
                source_sha256=c.source_digest, source_format=c.format,
            ),
        )
    finally:
        c.discard()
    if run is not None:
        run.log_params({"source": str(c.source), "source_sha256": c.source_digest,
                        "format": c.format, "task": c.task, "obs_keys": ",".join(c.obs_keys),
                        "episodes": c.episodes, "transitions": c.transitions,
                        "action_units": c.action_units,
                        "actions_converted": c.conversion})
        run.log_dataset(dataset, context="imported")
        run.set_tags({"physai.dataset.digest": dataset.digest,
                      "physai.dataset.source_sha256": c.source_digest,
                      "physai.dataset.source_format": c.format,
                      "physai.dataset.action_units": c.action_units,
                      "physai.expert": c.expert})
    log.info("imported %s (%s, sha256 %s, %s actions%s): %d episodes, %d transitions -> "
             "dataset %s", c.source, c.format, c.source_digest[:12], c.action_units,
             "" if c.converted_from is None
             else f" converted to the task's ({c.converted_from.describe()})",
             c.episodes, c.transitions, dataset.digest[:12])
    return dataset


def stored_export(dataset: Dataset, store: ArtifactStore, control_hz: float) -> Export:
    """A stored dataset's episodes, checked, with the images of its task's cameras, as a
    writer takes them."""
    from stages.sim.env.cameras import image_keys
    from stages.sim.tasks.catalog import get_task

    cameras = get_task(dataset.task).cameras
    path = store.open_payload(dataset)
    rec = get_format("robomimic").read(path, (), image_keys(cameras), cameras)
    episodes = check_recording(path, rec, len(dataset.obs_names), len(dataset.action_names),
                               cameras)
    return Export(episodes, dataset.task, dataset.obs_names, dataset.action_names, control_hz)


def export_dataset(dataset: Dataset, store: ArtifactStore, fmt: str, out: Path) -> Path:
    """Write a stored dataset to ``out`` in format ``fmt``; ``out`` must not exist, and a
    failed export removes what it wrote there."""
    from stages.sim.tasks.catalog import get_task

    try:
        writer = get_format(fmt)
    except UnknownNameError as exc:
        raise ConfigError.one(out, "--format", fmt, str(exc)) from None
    if out.exists() or out.is_symlink():
        raise ConfigError.one(out, "-o", str(out), "already exists; choose a new path")
    export = stored_export(dataset, store, get_task(dataset.task).control_hz)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer.write(out, export)
    except BaseException:
        if out.is_dir():
            shutil.rmtree(out, ignore_errors=True)
        else:
            out.unlink(missing_ok=True)
        raise
    return out

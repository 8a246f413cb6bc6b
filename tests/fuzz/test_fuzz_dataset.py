"""Fuzzing HDF5 datasets: every mutation of a dataset the project's writer made reads back
whole and finite, or is one ConfigError line naming the file (and the node), exit status 2,
with nothing written. Links, external storage and virtual datasets that reach outside the file
are refused, and so is a dataset declaring a shape larger than a dataset may use. Read both as
training reads the store's files (:func:`stages.datasets.demonstrations.read_transitions`) and as an
import reads a source, through the format registry: there a ``success`` that is not a boolean (or 0
or 1) is refused too. A symbolic link or a FIFO anywhere in a folder dataset is refused."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from physai_core.errors import ConfigError
from stages.datasets.demonstrations import Episode, read_transitions, write_dataset
from stages.datasets.formats import check_recording, get_format
from stages.datasets.importer import convert
from tests.fuzz.fuzzing import check_one_line, examples, listing, text_edits

if TYPE_CHECKING:
    from tests.fuzz.conftest import Tally

OBS_DIM, ACT_DIM = 5, 2
LENGTHS = (4, 6, 5)


def _valid_dataset() -> bytes:
    """Three short episodes written by the project's own writer."""
    rng = np.random.default_rng(0)
    episodes = [Episode(rng.standard_normal((t, OBS_DIM)), rng.uniform(-1, 1, (t, ACT_DIM)),
                        rng.standard_normal(t), np.eye(t, dtype=np.uint8)[-1], bool(i % 2), i)
                for i, t in enumerate(LENGTHS)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "demos.hdf5"
        write_dataset(path, episodes, "reach-v0", [f"o{i}" for i in range(OBS_DIM)],
                      [f"a{i}" for i in range(ACT_DIM)], {"num_worlds": 2})
        return path.read_bytes()


VALID = _valid_dataset()
NODES = ("data", *(f"data/demo_{i}{leaf}" for i in range(len(LENGTHS)) for leaf in
                   ("", "/obs", "/obs/policy", "/actions", "/rewards", "/dones")))
"""Every group and dataset of the valid file."""
DATASETS = tuple(n for n in NODES if n.endswith(("policy", "actions", "rewards", "dones")))

DTYPES = ("float32", "float64", "int32", "uint8", "bool", "complex64", "S4", "str", "compound")
SPECIAL = (np.nan, np.inf, -np.inf, 1e39, -0.0, 1e-45)
"""Values that break readers: NaN, the infinities, a float64 that overflows float32."""


@dataclass(frozen=True)
class Change:
    """One change of the HDF5 tree, made with h5py; ``outside`` is a folder beside the file's
    for links and external storage to point into."""

    op: str
    node: str
    arg: Any = None

    def apply(self, f: h5py.File, outside: Path) -> None:
        """Make this change in the open file ``f``."""
        node, arg = self.node, self.arg
        if self.op == "attr":
            f[node].attrs[arg[0]] = arg[1]
            return
        if self.op == "rename":
            parent, _, _ = node.rpartition("/")
            f.move(node, f"{parent}/{arg}")
            return
        if self.op == "empty":
            for name in list(f[node]):
                del f[node][name]
            return
        old = f[node]
        small = isinstance(old, h5py.Dataset) and old.size < 2**20  # not one "huge" made
        shape = old.shape if small else (3, OBS_DIM)
        del f[node]
        if self.op == "delete":
            return
        if self.op == "group":
            f.create_group(node)
        elif self.op == "dataset":
            f.create_dataset(node, data=_array(arg, shape))
        elif self.op == "soft":
            f[node] = h5py.SoftLink(arg)
        elif self.op == "external":
            other = outside / "other.hdf5"
            with h5py.File(other, "a") as g:
                g.require_dataset("x", shape, "f4", data=np.ones(shape, "f4"))
            f[node] = h5py.ExternalLink(str(other), "x")
        elif self.op == "raw":
            raw = outside / "secret.bin"
            raw.write_bytes(np.ones(shape, "f4").tobytes())
            f.create_dataset(node, shape, "f4", external=[(str(raw), 0, h5py.h5f.UNLIMITED)])
        elif self.op == "huge":
            f.create_dataset(node, (2**40, *shape[1:]), "f4", chunks=True)
        elif self.op == "virtual":
            other = outside / "source.hdf5"
            with h5py.File(other, "a") as g:
                g.require_dataset("x", shape, "f4", data=np.ones(shape, "f4"))
            layout = h5py.VirtualLayout(shape, "f4")
            layout[...] = h5py.VirtualSource(str(other), "x", shape)
            f.create_virtual_dataset(node, layout)

    def __str__(self) -> str:
        return f"{self.op} {self.node} {self.arg!r}"[:160]


REACHES_OUTSIDE = ("external", "raw", "virtual")
"""Changes whose data would come from another file: these must always be refused."""
MUST_REFUSE = (*REACHES_OUTSIDE, "huge")
"""Changes that must always be refused: data from another file, a declared shape of 2**40
rows (terabytes, in a file of a few KiB)."""


def _array(spec: tuple[str, int, int, float, int], shape: tuple[int, ...]) -> np.ndarray:
    """An array ``spec = (dtype, rows, cols, fill, seed)``: shaped like ``shape`` with ``rows``
    added to its length and ``cols`` to its width (a negative ``cols`` drops the second axis,
    ``cols`` > 2 adds a third), random but for one entry ``fill``."""
    dtype, rows, cols, fill, seed = spec
    dims = [max(0, (shape[0] if shape else 1) + rows)]
    width = shape[1] if len(shape) > 1 else 1
    if cols >= 0:
        dims.append(max(0, width + cols % 2))
    if cols > 2:
        dims.append(1)
    values = np.random.default_rng(seed).standard_normal(dims)
    if values.size:
        values.flat[seed % values.size] = fill
    if dtype == "str":
        return np.array(values.astype(str).tolist(), dtype=h5py.string_dtype())
    with np.errstate(all="ignore"):
        if dtype != "compound":
            return values.astype(dtype)
        out = np.zeros(dims, dtype=[("a", "f4"), ("b", "i2")])
        out["a"] = values
        return out


@st.composite
def changes(draw: st.DrawFn) -> tuple[Change, ...]:
    """One to three changes of the valid file's tree."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("delete", "group", "dataset", "dataset", "dataset", "soft",
                                   "rename", "attr", "empty", *MUST_REFUSE)))
        if op in ("raw", "virtual", "huge"):
            node = draw(st.sampled_from(DATASETS))
        elif op == "rename":
            node = draw(st.sampled_from([n for n in NODES if n.count("/") == 1]))
        elif op == "empty":
            node = "data"
        else:
            node = draw(st.sampled_from(NODES))
        arg: Any = None
        if op == "dataset":
            arg = (draw(st.sampled_from(DTYPES)), draw(st.integers(-5, 2)),
                   draw(st.integers(-1, 3)), draw(st.sampled_from([0.5, *SPECIAL])),
                   draw(st.integers(0, 1000)))
        elif op == "soft":
            arg = draw(st.sampled_from([*NODES, "/nowhere", "/data/demo_9/actions"]))
        elif op == "rename":
            arg = draw(st.sampled_from(["demo_x", "demo_", "demo_99", "demo_-1", "x",
                                        "demo_00", "demo_1 ", "démo_1"]))
        elif op == "attr":
            arg = (draw(st.sampled_from(["total", "num_samples", "env_args", "names", "x",
                                         "success", "seed"])),
                   draw(st.sampled_from([-1, "junk", np.nan, b"\xff", [1, 2], "False", 0, 1,
                                         True, 0.5])))
        out.append(Change(op, "/" + node, arg))
    return tuple(out)


def _must_refuse(edits: tuple[Change, ...]) -> bool:
    """Whether a change that must be refused is still there after all ``edits``."""
    return any(
        c.op in MUST_REFUSE and not any(
            later.op != "attr" and (c.node == later.node or c.node.startswith(later.node + "/"))
            for later in edits[i + 1:])
        for i, c in enumerate(edits))


def _read(path: Path) -> ConfigError | None:
    """Read ``path``; the error, or None when it reads. Nothing may be written beside it, and
    what reads back must be whole and finite."""
    before = listing(path.parent)
    try:
        got = read_transitions(path, OBS_DIM, ACT_DIM)
    except ConfigError as exc:
        error: ConfigError | None = exc
    else:
        error = None
        assert got.obs.shape == (len(got.actions), OBS_DIM) and len(got.actions) > 0
        assert got.actions.shape[1] == ACT_DIM and got.episode_index.shape == (len(got.obs),)
        assert np.isfinite(got.obs).all() and np.isfinite(got.actions).all()
    assert listing(path.parent) == before
    return error


def _odd_success(path: Path) -> bool:
    """Whether a demo of the file has a ``success`` attribute that is neither a boolean nor a
    number equal to 0 or 1."""
    with h5py.File(path, "r") as f:
        data = f.get("data")
        demos = [g for g in data.values() if isinstance(g, h5py.Group)] if isinstance(
            data, h5py.Group) else []
        values = [g.attrs["success"] for g in demos if "success" in g.attrs]
    return any(np.ndim(v) > 1 or np.size(v) != 1 or np.asarray(v).dtype.kind not in "biuf"
               or float(np.asarray(v).reshape(())) not in (0.0, 1.0) for v in values)


def _import(path: Path) -> ConfigError | None:
    """Read ``path`` as an import does, through the registry's robomimic format, and check its
    episodes; the error, or None when it reads. Nothing may be written beside it, what reads
    back is whole and finite, and its success flags are booleans the file holds as such."""
    before = listing(path.parent)
    try:
        episodes = check_recording(path, get_format("robomimic").read(path), OBS_DIM, ACT_DIM)
    except ConfigError as exc:
        error: ConfigError | None = exc
    else:
        error = None
        assert all(isinstance(e.success, bool) for e in episodes)
        assert all(np.isfinite(e.obs).all() and np.isfinite(e.actions).all() for e in episodes)
        assert not _odd_success(path)
    assert listing(path.parent) == before
    return error


def _check(error: ConfigError, path: Path) -> None:
    assert error.exit_code == 2
    check_one_line(str(error), path)


def _in_folders(run: Callable[[Path, Path], None]) -> None:
    """Call ``run(dataset folder, outside folder)`` in two fresh sibling folders."""
    with tempfile.TemporaryDirectory() as root:
        inside, outside = Path(root, "inside"), Path(root, "outside")
        inside.mkdir()
        outside.mkdir()
        run(inside, outside)


def _changed(edits: tuple[Change, ...], tally: Tally, kind: str,
             reader: Callable[[Path], Any]) -> Any:
    """Write the valid file with ``edits`` applied, beside an outside folder, and hand it to
    ``reader``; its error (or None) once it must refuse what the edits make it refuse. None
    when an edit does not apply."""
    seen: list[Any] = []

    def run(inside: Path, outside: Path) -> None:
        path = inside / "demos.hdf5"
        path.write_bytes(VALID)
        with h5py.File(path, "a") as f:
            for change in edits:
                try:
                    change.apply(f, outside)
                except (KeyError, ValueError, TypeError, AttributeError, OSError, RuntimeError):
                    tally.record(kind, "change not applicable")
                    return
        error = reader(path)
        tally.record(kind, "rejected" if error else "read")
        if _must_refuse(edits):
            assert error is not None, [str(c) for c in edits]
        if error is not None:
            _check(error, path)
        seen.append(error)

    _in_folders(run)
    return seen[0] if seen else None


@examples(300)
@given(edits=changes())
def test_changed_dataset_reads_whole_or_names_file_and_node(
    edits: tuple[Change, ...], tally: Tally
) -> None:
    error = _changed(edits, tally, "HDF5 dataset (nodes)", _read)
    if error is not None and not any(c.op == "delete" and c.node == "/data" for c in edits):
        assert all(p.field for p in error.problems), str(error)


@examples(300)
@given(edits=changes())
def test_changed_dataset_imports_whole_or_names_file_and_node(
    edits: tuple[Change, ...], tally: Tally
) -> None:
    _changed(edits, tally, "HDF5 dataset (import)", _import)


@examples(300)
@given(data=st.data())
def test_corrupted_dataset_bytes_read_whole_or_name_the_file(
    data: st.DataObject, tally: Tally
) -> None:
    corrupted = data.draw(text_edits(VALID), label="bytes")

    def run(inside: Path, _: Path) -> None:
        path = inside / "demos.hdf5"
        path.write_bytes(corrupted)
        error = _read(path)
        tally.record("HDF5 dataset (bytes)", "rejected" if error else "read")
        if error is not None:
            _check(error, path)

    _in_folders(run)


def test_the_unchanged_dataset_reads_whole() -> None:
    def run(inside: Path, _: Path) -> None:
        path = inside / "demos.hdf5"
        path.write_bytes(VALID)
        assert _read(path) is None
        assert len(read_transitions(path, OBS_DIM, ACT_DIM).obs) == sum(LENGTHS)

    _in_folders(run)


def _lerobot_folder() -> dict[str, bytes]:
    """A LeRobot v3 folder of reach-v0 written by the project's writer, as its files' bytes."""
    from stages.datasets.formats import Export
    from stages.sim.tasks.catalog import get_task

    spec = get_task("reach-v0")
    rng = np.random.default_rng(0)
    episodes = tuple(Episode(rng.standard_normal((t, spec.obs_dim)).astype(np.float32),
                             rng.uniform(-1, 1, (t, spec.act_dim)).astype(np.float32),
                             np.zeros(t, np.float32), np.arange(t) == t - 1, True, i)
                     for i, t in enumerate(LENGTHS))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "lerobot"
        get_format("lerobot").write(root, Export(episodes, "reach-v0", spec.obs_names,
                                                 spec.action_names, spec.control_hz))
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}


LEROBOT = _lerobot_folder()
LEROBOT_ENTRIES = tuple(sorted({*LEROBOT, *(str(Path(n).parent) for n in LEROBOT)} - {"."}))
"""Every file and folder of the LeRobot folder, relative to it."""


@examples(60)
@given(entry=st.sampled_from(LEROBOT_ENTRIES),
       kind=st.sampled_from(["link to a copy", "link to /etc/passwd", "link beside", "fifo"]))
def test_a_link_or_special_file_anywhere_in_a_folder_is_refused(
    entry: str, kind: str, tally: Tally
) -> None:
    """A symbolic link or FIFO replacing, or put beside, any file or folder of a LeRobot
    folder: the import is refused in one line naming the folder and the entry, and nothing is
    written."""

    def run(inside: Path, outside: Path) -> None:
        root = inside / "lerobot"
        for name, data in LEROBOT.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        target = root / entry
        if kind == "link beside":
            target = target.with_name(target.name + ".extra")
        elif kind == "link to a copy":
            copy = outside / target.name
            target.rename(copy)
        else:
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "link to a copy":
            target.symlink_to(copy, target_is_directory=copy.is_dir())
        else:
            target.symlink_to("/etc/passwd")
        before = listing(inside)
        with pytest.raises(ConfigError) as error:
            convert(root, "lerobot", outside / "scratch")
        tally.record("LeRobot folder (links)", "rejected")
        assert error.value.exit_code == 2
        check_one_line(str(error.value), root, target.relative_to(root).as_posix())
        assert listing(inside) == before and not (outside / "scratch").exists()

    _in_folders(run)

"""Readers of foreign datasets are bounded by what they decode, not by what the files store, and
the paths a dataset names stay inside it (issue 42, items 1 and 2).

A few KiB of PNG frames, a dictionary-encoded Parquet column, a video's frames: each is charged
to one :class:`stages.datasets.demonstrations.DecodeBudget` from its header (the image's size, the
footer's values, the dictionary's expanded values, the stream's frame count) before it is decoded,
so a reader never holds more than ``PHYSAI_DATASET_MAX_BYTES``; peak memory is measured in a
subprocess (Linux's ``VmHWM``).
``meta/info.json``'s path templates name only LeRobot's fields, integer formats of a bounded
width, and lead only to the dataset's own files. Every refusal is one line, exit status 2,
nothing published."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from physai_core.errors import ConfigError
from stages.datasets.contained import read_parquet
from stages.datasets.demonstrations import DecodeBudget
from stages.datasets.formats import Export, get_format
from stages.datasets.hdf5_formats import read_hdf5
from stages.sim.tasks.catalog import get_task
from tests.conftest import ROOT
from tests.stages.datasets.demos import TASK, synthetic_episodes
from tests.stages.datasets.test_lerobot_video import DATA_FILE, EPISODES_FILE, FRONT, VIDEO
from tests.stages.datasets.test_lerobot_video import export as export_video
from tests.stages.datasets.test_trust_datasets import huge, refused

MIB = 2**20
VISION = "reach-vision-v0"
INFO = "meta/info.json"
NOTES = "notes"


def lerobot(path: Path, n: int, steps: int) -> Path:
    """A LeRobot folder of ``n`` reach-v0 episodes of ``steps`` steps, no cameras."""
    spec = get_task(TASK)
    get_format("lerobot").write(path, Export(synthetic_episodes(n, steps), TASK, spec.obs_names,
                                             spec.action_names, spec.control_hz))
    return path


def edit_info(path: Path, **change: object) -> None:
    info = json.loads((path / INFO).read_text())
    info.update(change)
    (path / INFO).write_text(json.dumps(info))


def png_bomb(side: int) -> bytes:
    """A one-bit PNG ``side`` pixels square: a few hundred bytes, ``side**2 * 3`` once
    decoded to RGB."""
    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def image_dataset(path: Path, frame: bytes, declared: int, n: int = 4, steps: int = 8) -> Path:
    """A LeRobot folder whose front camera is an ``image`` feature (PNG bytes in the data,
    as LeRobot stores it without videos), every frame ``frame``, declared ``declared``
    pixels square."""
    lerobot(path, n, steps)
    table = pq.read_table(path / DATA_FILE)
    cells = pa.array([{"bytes": frame, "path": None}] * len(table))
    pq.write_table(table.append_column(FRONT, cells), path / DATA_FILE)
    info = json.loads((path / INFO).read_text())
    info["features"][FRONT] = {"dtype": "image", "shape": [declared, declared, 3],
                               "names": ["height", "width", "channels"]}
    (path / INFO).write_text(json.dumps(info))
    return path


PEAK = """
import json, sys
from pathlib import Path

import av, PIL.Image, pyarrow.parquet, h5py  # loaded before the baseline
from stages.datasets.demonstrations import DecodeBudget
from stages.datasets.contained import check_source
from stages.datasets.lerobot_reader import read_lerobot
from physai_core.errors import ConfigError

def peak():
    # VmHWM, this program's own peak: getrusage's ru_maxrss starts at the parent's after
    # a fork and an exec, and would hide what this read adds to it.
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

path, what = Path(sys.argv[1]), sys.argv[2]
before = peak()
try:
    if what == "check":
        check_source(path)
    else:
        read_lerobot(path, (), tuple(sys.argv[3:]))
    outcome = "read"
except ConfigError as exc:
    outcome = str(exc)
print(json.dumps({"outcome": outcome, "grown": peak() - before}))
"""


def measured(path: Path, what: str, *image_keys: str, limit: int) -> tuple[str, int]:
    """What reading ``path`` in a fresh process gives (``check``: the registry's check of the
    source; ``read``: the LeRobot reader alone) under a limit of ``limit`` bytes, and how much
    its peak memory grew while it did."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PHYSAI_DATASET_MAX_BYTES": str(limit)}
    done = subprocess.run([sys.executable, "-c", PEAK, str(path), what, *image_keys], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["outcome"], out["grown"]


def test_png_frames_are_charged_from_their_headers_before_any_is_decoded(
        tmp_path: Path) -> None:
    """32 frames of a 2048-pixel-square one-bit PNG: under 1 KiB each, 384 MiB as RGB, under a
    32 MiB limit. The third frame's header passes the limit: refused before any frame is
    decoded, peak memory unmoved (before the fix: all 384 MiB decoded, and read)."""
    frame = png_bomb(2048)
    folder = image_dataset(tmp_path / "bomb", frame, 2048)
    stored = len(frame) * 32
    assert stored < 32 * 1024 and (folder / DATA_FILE).stat().st_size < 64 * 1024
    outcome, grown = measured(folder, "read", "front_image", limit=32 * MIB)
    assert outcome.startswith(f"{folder}: {DATA_FILE}:{FRONT} (episode 0) frame 2: declares "
                              "12.0 MiB (a 2048x2048 image as RGB); with the "), outcome
    assert outcome.endswith("more than the 32.0 MiB a dataset may use "
                            "(PHYSAI_DATASET_MAX_BYTES) (value: [2048, 2048, 3])"), outcome
    small = image_dataset(tmp_path / "fits", png_bomb(64), 64)
    outcome, control = measured(small, "read", "front_image", limit=32 * MIB)
    assert outcome == "read"
    assert grown < control + 16 * MIB, (grown, control)  # the same read of 64-pixel frames


def test_frame_headers_are_checked_against_the_feature_and_the_camera(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A frame whose header gives another size than ``meta/info.json`` declares, or than the
    task's camera (64 x 64), is refused from its header, in the words the decoded episode
    would get; a cell that is neither PNG nor JPEG is unreadable."""
    argv = ("dataset", "import", "--format", "lerobot", "--task", VISION)
    declared = image_dataset(tmp_path / "declared", png_bomb(2048), 64)
    err = refused(capsys, physai_home, *argv[:2], str(declared), *argv[2:])
    assert err == (f"flows: error: {declared}: {DATA_FILE}:{FRONT} (episode 0) frame 0:"
                   f"resolution: {INFO} declares {FRONT} of shape [64, 64, 3] (height, width, "
                   "channels) (value: [2048, 2048, 3])")
    camera = image_dataset(tmp_path / "camera", png_bomb(2048), 2048)
    err = refused(capsys, physai_home, *argv[:2], str(camera), *argv[2:])
    assert err == (f"flows: error: {camera}: {DATA_FILE}:{FRONT}/front_image: expected shape "
                   "(8, 64, 64, 3) (T, height, width, channels) of camera 'front' (width 64, "
                   "height 64) (value: (8, 2048, 2048, 3))")
    buf = io.BytesIO()
    Image.new("RGB", (64, 64)).save(buf, format="GIF")
    gif = image_dataset(tmp_path / "gif", buf.getvalue(), 64)
    err = refused(capsys, physai_home, *argv[:2], str(gif), *argv[2:])
    assert err.startswith(f"flows: error: {gif}: {DATA_FILE}:{FRONT} (episode 0): unreadable "
                          "image: cannot identify image file"), err


def dictionary_column(folder: Path) -> Path:
    """Add to the data of ``folder`` a column of lists of strings, every string one 64 KiB
    text: stored once in the column's dictionary (a file under 128 KiB), 512.8 MiB once its
    8205 values are expanded."""
    file = folder / DATA_FILE
    table = pq.read_table(file)
    text = np.random.default_rng(0).integers(97, 123, 64 * 1024, np.uint8).tobytes().decode()
    notes = pa.array([[text] * 547] * len(table), pa.list_(pa.string()))
    pq.write_table(table.append_column(NOTES, notes), file)
    assert file.stat().st_size < 128 * 1024
    return file


def test_a_dictionary_column_counts_as_its_expanded_values(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the fix the footer's 64 KiB passed the check and the import exited 0, every
    column of the file read: 512 MiB decoded."""
    folder = lerobot(tmp_path / "notes", 3, 5)
    dictionary_column(folder)
    monkeypatch.setenv("PHYSAI_DATASET_MAX_BYTES", str(256 * MIB))
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "lerobot")
    assert err == (f"flows: error: {folder / DATA_FILE}: {NOTES}.list.element: declares "
                   "512.8 MiB (8205 values of BYTE_ARRAY), more than the 256.0 MiB a dataset "
                   "may use (PHYSAI_DATASET_MAX_BYTES) (value: 8205)")
    outcome, grown = measured(folder, "check", limit=256 * MIB)
    assert outcome == err.removeprefix("flows: error: ")
    _, control = measured(lerobot(tmp_path / "plain", 3, 5), "check", limit=256 * MIB)
    assert grown < control + 16 * MIB, (grown, control)


def test_the_lerobot_reader_reads_only_the_columns_it_uses(tmp_path: Path) -> None:
    """The reader alone (no check before it) never decodes the column it does not use: the
    read fits 32 MiB and peak memory stays put; a used column past the limit is refused."""
    folder = lerobot(tmp_path / "notes", 3, 5)
    dictionary_column(folder)
    outcome, grown = measured(folder, "read", limit=32 * MIB)
    assert outcome == "read"
    _, control = measured(lerobot(tmp_path / "plain", 3, 5), "read", limit=32 * MIB)
    assert grown < control + 16 * MIB, (grown, control)
    outcome, _ = measured(folder, "read", limit=1000)
    assert outcome == (f"{folder / DATA_FILE}: row group 0: declares 2.2 KiB (8 columns of 15 "
                       "rows), more than the 1000 B a dataset may use (PHYSAI_DATASET_MAX_BYTES) "
                       "(value: 15)")


def test_parquet_is_charged_row_group_by_row_group(tmp_path: Path) -> None:
    """What a row group holds once read is what was charged for it, before it was read; the
    row group that passes the budget is refused unread."""
    file = tmp_path / "groups.parquet"
    values = np.arange(4000, dtype=np.float64)
    pq.write_table(pa.table({"a": values, "b": values * 2}), file, row_group_size=1000)
    budget = DecodeBudget(10**6)
    table, names = read_parquet(file, ["a", "missing"], budget)
    assert names == ["a", "b"] and table.column_names == ["a"]
    assert budget.used == table.nbytes == 4 * (8000 + 125)  # values and validity bitmaps
    with pytest.raises(ConfigError) as err:
        read_parquet(file, ["a", "b"], DecodeBudget(40000))
    assert str(err.value) == (f"{file}: row group 2: declares 15.6 KiB (2 columns of 1000 "
                              "rows); with the 31.7 KiB decoded before it, more than the 39.1 "
                              "KiB a dataset may use (PHYSAI_DATASET_MAX_BYTES) (value: 1000)")


def test_a_byte_array_encoding_that_does_not_bound_its_values_is_refused(
        tmp_path: Path) -> None:
    """DELTA_BYTE_ARRAY stores a value as the length of the prefix it shares with the one
    before and its new bytes: a few bytes a value can decode to any length."""
    file = tmp_path / "delta.parquet"
    pq.write_table(pa.table({"s": ["x" * 1000 + str(i) for i in range(100)]}), file,
                   use_dictionary=False, column_encoding={"s": "DELTA_BYTE_ARRAY"})
    with pytest.raises(ConfigError, match="s: byte arrays in an encoding whose decoded size"):
        read_parquet(file, ["s"], DecodeBudget(10**9))


@pytest.fixture(scope="module")
def video_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """reach-vision-v0 episodes with front-camera video, written once for this module."""
    path = tmp_path_factory.mktemp("video") / "lerobot"
    export_video(path)
    return path


@pytest.fixture
def copy(video_dataset: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the video dataset, beside a copy of its videos outside it
    (``tmp_path/outside``), which a template leading out of the dataset would reach."""
    shutil.copytree(video_dataset / "videos", tmp_path / "outside" / "videos")
    yield Path(shutil.copytree(video_dataset, tmp_path / "lerobot"))


def test_video_frames_share_the_budget_of_the_read(
    physai_home: Path, copy: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The video's 40 frames of 64 x 64 (480 KiB) are charged from the stream's header after
    the data's row groups, to the same budget: a limit that holds the frames alone, not with
    the data, refuses the video before decoding it (before the fix, a video had the whole
    limit to itself, and the import passed)."""
    monkeypatch.setenv("PHYSAI_DATASET_MAX_BYTES", str(40 * 64 * 64 * 3 + 100))
    err = refused(capsys, physai_home, "dataset", "import", str(copy), "--format", "lerobot",
                  "--task", VISION)
    assert err.startswith(f"flows: error: {copy}: {VIDEO}: declares 480.0 KiB (40 frames of "
                          "64x64 RGB, from its header); with the "), err


VIDEO_TEMPLATE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


@pytest.mark.parametrize(("key", "template", "problem"), [
    ("video_path", "../outside/" + VIDEO_TEMPLATE,
     "leads to ../outside/videos/observation.images.camera/chunk-000/file-000.mp4, outside "
     "the dataset folder"),
    ("video_path", "ABSOLUTE/" + VIDEO_TEMPLATE, "leads to ABSOLUTE/videos/observation.images."
     "camera/chunk-000/file-000.mp4, outside the dataset folder"),
    ("video_path", "videos/{video_key.__class__}/x.mp4",
     "attribute or index access {video_key.__class__}: a LeRobot v3 video_path names only "
     "{video_key}, {chunk_index}, {file_index}"),
    ("video_path", "videos/{x[0]}.mp4", "attribute or index access {x[0]}: a LeRobot v3 "
     "video_path names only {video_key}, {chunk_index}, {file_index}"),
    ("video_path", "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}"
     ".mp4", "unknown field {episode_chunk}: a LeRobot v3 video_path names only {video_key}, "
     "{chunk_index}, {file_index}"),
    ("video_path", "videos/{video_key}/chunk-{chunk_index:999999999d}/file-{file_index:03d}"
     ".mp4", "format {chunk_index:999999999d}: expected an integer format of width at most "
     "20, such as {chunk_index:03d}"),
    ("video_path", "videos/{video_key!r}.mp4",
     "conversion !r of {video_key}: expected the field as it is"),
    ("video_path", "videos/{video_key:>99}.mp4",
     "format {video_key:>99}: {video_key} takes no format"),
    ("video_path", "videos/{", "not a path template: Single '{' encountered in format string"),
    ("data_path", "../../{chunk_index}.parquet",
     "leads to ../../0.parquet, outside the dataset folder"),
    ("data_path", "data/{video_key}.parquet",
     "unknown field {video_key}: a LeRobot v3 data_path names only {chunk_index}, "
     "{file_index}"),
])
def test_a_path_template_that_leaves_the_dataset_or_its_fields_is_one_line(
    physai_home: Path, copy: Path, capsys: pytest.CaptureFixture[str], key: str,
    template: str, problem: str,
) -> None:
    """Before the fix: ``../`` and absolute templates decoded the copy outside the dataset
    into the store (exit 0), an unknown field was a KeyError traceback, a format spec sized
    an allocation from the file."""
    outside = str(copy.parent / "outside")
    template = template.replace("ABSOLUTE", outside)
    problem = problem.replace("ABSOLUTE", outside)
    edit_info(copy, **{key: template})
    err = refused(capsys, physai_home, "dataset", "import", str(copy), "--format", "lerobot",
                  "--task", VISION)
    assert err.startswith(f"flows: error: {copy}: {INFO}:{key}: {problem} (value: "), err
    assert err.endswith(f"{template!r})" if len(repr(template)) <= 80 else "')"), err


def test_template_values_from_the_episodes_stay_inside_too(
    physai_home: Path, copy: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The feature a key map names fills ``{video_key}``, ``meta/episodes`` the indices: a
    feature named ``../../outside/...`` leads out of the folder, a negative or fractional
    index is not one."""
    argv = ("dataset", "import", str(copy), "--format", "lerobot", "--task", VISION)
    info = json.loads((copy / INFO).read_text())
    escape = "../../outside/videos/" + FRONT
    info["features"][escape] = info["features"][FRONT]
    (copy / INFO).write_text(json.dumps(info))
    episodes = pq.read_table(copy / EPISODES_FILE)
    renamed = episodes.rename_columns([c.replace(FRONT, escape) for c in episodes.column_names])
    pq.write_table(renamed, copy / EPISODES_FILE)
    err = refused(capsys, physai_home, *argv, "--camera-keys", f"front={escape}")
    assert err.startswith(f"flows: error: {copy}: {INFO}:video_path: leads to videos/{escape}/"
                          f"chunk-000/file-000.mp4, outside the dataset folder (value: "
                          "'videos/{video_key}/chunk-"), err
    column = f"videos/{FRONT}/chunk_index"
    for bad in (pa.array([-1, 0]), pa.array([0.5, 0.0])):
        table = episodes.set_column(episodes.column_names.index(column), column, bad)
        pq.write_table(table, copy / EPISODES_FILE)
        err = refused(capsys, physai_home, *argv)
        assert err == (f"flows: error: {copy}: meta/episodes:{column} (episode 0): expected a "
                       f"whole number from 0 to 2147483647 (value: {bad[0].as_py()!r})")


def test_the_flows_command_refuses_a_template_with_status_2(
    physai_home: Path, copy: Path,
) -> None:
    """The installed ``flows`` command, as a user runs it."""
    edit_info(copy, video_path="../outside/" + VIDEO_TEMPLATE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    env["PHYSAI_HOME"] = str(physai_home)
    done = subprocess.run([str(Path(sys.executable).parent / "flows"), "dataset", "import",
                           str(copy), "--format", "lerobot", "--task", VISION], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    line, = done.stderr.strip().splitlines()
    assert line.startswith(f"flows: error: {copy}: {INFO}:video_path: leads to ../outside/"
                           "videos/observation.images.camera/chunk-000/file-000.mp4, outside "
                           "the dataset folder (value: '../outside/videos/{video_key}/"), line


def test_the_hdf5_reader_charges_what_it_reads(tmp_path: Path) -> None:
    """Called without the registry's check, the robomimic reader still refuses a dataset
    that declares 5.8 TiB before allocating it (before the fix: a MemoryError)."""
    path = huge(tmp_path / "huge.hdf5")
    with pytest.raises(ConfigError, match=r"data/demo_0/obs/policy: declares 5\.8 TiB"):
        read_hdf5(path, ())


def test_minari_arrow_storage_is_refused(tmp_path: Path) -> None:
    """Minari's arrow storage decodes JPEG frames and compressed Arrow files no header
    bounds: only its hdf5 storage is read."""
    pytest.importorskip("minari")
    data = tmp_path / "team" / "reach-v0" / "data"
    data.mkdir(parents=True)
    with h5py.File(data / "main_data.hdf5", "w"):
        pass
    box = json.dumps({"type": "Box", "dtype": "float32", "shape": [3], "low": [0] * 3,
                      "high": [1] * 3})
    (data / "metadata.json").write_text(json.dumps({
        "data_format": "arrow", "observation_space": box, "action_space": box}))
    with pytest.raises(ConfigError) as err:
        get_format("minari").read(data.parent)
    assert str(err.value).endswith("data/metadata.json:data_format: only Minari's hdf5 "
                                   "storage is read: its arrays are checked before Minari "
                                   "opens them (its arrow storage decodes JPEG frames and "
                                   "compressed Arrow files of sizes no header bounds) "
                                   "(value: 'arrow')")



def jpeg_frame(side: int) -> np.ndarray:
    """A black RGB JPEG ``side`` pixels square as a row of bytes, as Minari's hdf5 storage
    holds a frame: about 25 KiB at 2048 pixels, 12 MiB once decoded."""
    buf = io.BytesIO()
    Image.new("RGB", (side, side)).save(buf, format="JPEG", optimize=True, quality=1)
    return np.frombuffer(buf.getvalue(), np.uint8)


def minari_jpeg(path: Path, monkeypatch: pytest.MonkeyPatch, size: int = 64) -> Path:
    """Two reach-vision-v0 episodes of 5 steps written by Minari's own
    ``create_dataset_from_buffers`` with its defaults, which JPEG-encode the ``front_image``
    frames of ``size`` pixels square (``jpeg_encoding`` on in ``metadata.json``)."""
    from tests.stages.datasets.test_image_datasets import episodes, minari_buffers

    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path.parent.parent))
    minari_buffers(path, episodes(size=(size, size)))
    assert json.loads((path / "data" / "metadata.json").read_text())["jpeg_encoding"] is True
    with h5py.File(path / "data" / "main_data.hdf5", "r") as f:
        stored = f["episode_0/observations/front_image"][0]  # a row of bytes, of any length
        assert stored.tobytes()[:3] == b"\xff\xd8\xff"  # a JPEG
    return path


def set_frames(folder: Path, frame: np.ndarray, rows: int | None = None) -> None:
    """Every episode's ``front_image`` frames ``frame`` (``rows`` of them, default as many
    as it had), in the layout Minari writes: one row of bytes a frame."""
    with h5py.File(folder / "data" / "main_data.hdf5", "a") as f:
        for name in f:
            group = f[f"{name}/observations"]
            count = len(group["front_image"]) if rows is None else rows
            del group["front_image"]
            group.create_dataset("front_image", data=np.tile(frame, (count, 1)))


MINARI_PEAK = PEAK.replace(
    "from stages.datasets.lerobot_reader import read_lerobot",
    "import minari\nfrom stages.datasets.formats import get_format",
).replace("read_lerobot(path, (), tuple(sys.argv[3:]))", "get_format('minari').read(path)")


def test_minari_jpeg_frames_are_checked_from_their_headers_before_minari_decodes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Minari's hdf5 storage JPEG-encodes image spaces by default, and decodes a frame to
    whatever size its header gives, whatever the space says. Twelve frames of a black
    2048-pixel-square JPEG (about 25 KiB each) in a space of 64 x 64 x 3, under a 32 MiB
    limit: refused from the first frame's header, peak memory unmoved (before the fix: all
    144 MiB decoded by Minari, and the reader returned)."""
    folder = minari_jpeg(tmp_path / "minari" / "team" / "bomb-v0", monkeypatch)
    set_frames(folder, jpeg_frame(2048))
    assert sum(f.stat().st_size for f in (folder / "data").iterdir()) < 512 * 1024
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PHYSAI_DATASET_MAX_BYTES": str(32 * MIB)}

    def measure(path: Path) -> tuple[str, int]:
        done = subprocess.run([sys.executable, "-c", MINARI_PEAK, str(path), "read"], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        return out["outcome"], out["grown"]

    outcome, grown = measure(folder)
    assert outcome == (f"{folder}: data/main_data.hdf5:episode_0/observations/front_image "
                       "frame 0: a 2048x2048 JPEG frame as RGB; data/metadata.json:"
                       "observation_space declares shape [64, 64, 3] (value: [2048, 2048, 3])")
    outcome, control = measure(minari_jpeg(tmp_path / "minari" / "team" / "plain-v0",
                                           monkeypatch))
    assert outcome == "read"  # the same dataset with Minari's own 64-pixel JPEG frames
    assert grown < control + 16 * MIB, (grown, control)


def test_minari_jpeg_frames_share_the_budget_of_the_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames of the size the space declares (512 x 512 x 3, 768 KiB each once decoded) are
    charged from their headers after the space's bounds (1.5 MiB): a 5 MiB limit is passed at
    the fifth frame, before Minari decodes any (before the fix: read)."""
    folder = minari_jpeg(tmp_path / "minari" / "team" / "big-v0", monkeypatch, size=512)
    monkeypatch.setenv("PHYSAI_DATASET_MAX_BYTES", str(5 * MIB))
    with pytest.raises(ConfigError) as err:
        get_format("minari").read(folder)
    assert str(err.value).startswith(
        f"{folder}: data/main_data.hdf5:episode_0/observations/front_image frame 4: declares "
        "768.0 KiB (a 512x512 JPEG frame as RGB); with the "), err.value


def png_frames(folder: Path) -> None:
    """Every frame a PNG of 64 x 64: Minari opens a frame in any format Pillow knows."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 64)).save(buf, format="PNG")
    set_frames(folder, np.frombuffer(buf.getvalue(), np.uint8))


def many_episodes(folder: Path) -> None:
    """``total_episodes`` of 2**40: Minari allocates that many indices (8 TiB)."""
    file = folder / "data" / "metadata.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "total_episodes": 2**40}))


FRAMES = "data/main_data.hdf5:episode_0/observations/front_image"


@pytest.mark.parametrize(("tamper", "line"), [
    (lambda folder: set_frames(folder, jpeg_frame(2048)),
     f"{FRAMES} frame 0: a 2048x2048 JPEG frame as RGB; data/metadata.json:observation_space "
     "declares shape [64, 64, 3] (value: [2048, 2048, 3])"),
    (png_frames, f"{FRAMES} frame 0: unreadable image: cannot identify image file"),
    (lambda folder: set_frames(folder, jpeg_frame(64), rows=0),
     f"{FRAMES}: expected JPEG frames, one row of uint8 bytes each (the dataset's "
     "jpeg_encoding is on) (value: (0, "),
    (many_episodes, "data/metadata.json:total_episodes: expected the number of episodes, at "
     "most the 2 groups of data/main_data.hdf5 (value: 1099511627776)"),
], ids=["jpeg-bomb", "png", "no-frames", "total-episodes"])
def test_minari_frames_and_counts_are_one_line(
    physai_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, tamper: Callable[[Path], None], line: str,
) -> None:
    """Through ``flows dataset import``: exit 2, one line naming the file, the field and the
    value, nothing published (before the fix: the bomb was decoded, then refused by the
    camera check; a PNG was decoded as a frame; no frames and the episode count were
    tracebacks, IndexError and MemoryError)."""
    folder = minari_jpeg(tmp_path / "minari" / "team" / "vision-v0", monkeypatch)
    tamper(folder)
    err = refused(capsys, physai_home, "dataset", "import", str(folder), "--format", "minari",
                  "--task", VISION)
    assert err.startswith(f"flows: error: {folder}: {line}"), err

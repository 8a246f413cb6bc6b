"""Running LeRobot's own trainer (``lerobot.scripts.lerobot_train``) in the ``lerobot`` stage
environment, watched from the project's side: its log lines become progress, Prefect log lines
and MLflow metrics, and every checkpoint it writes becomes a stage artifact the moment LeRobot
points ``checkpoints/last`` at it, so a killed stage resumes from it on the re-run (on this
machine or another: the checkpoint travels through the artifact store).

A LeRobot checkpoint is a folder ``checkpoints/<step>/`` holding ``pretrained_model/`` (the
policy, its processors and ``train_config.json``) and ``training_state/`` (optimizer, scheduler,
RNG, step); its artifact is that folder as an uncompressed tar.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from physai_core.errors import PhysaiError
from stages.artifacts.records import Checkpoint
from stages.core.limits import gib

log = logging.getLogger(__name__)

LOG_LINE = re.compile(r"\bstep:[0-9.]+[KMBTQ]?\s.*?\bloss:(?P<loss>[-+0-9.eE]+)")
"""LeRobot's metrics line (``MetricsTracker.__str__``): ``step:1K smpl:8K ... loss:0.123 ...``;
its step is rounded (``1K`` from 1000 to 1499), so the step of the k-th line is counted."""
MAX_CHECKPOINT_BYTES = 8 * 2**30
"""Most bytes one checkpoint folder may hold before it is refused as an artifact."""
MAX_MEMBERS = 10_000
"""Most files a checkpoint tar may hold when restored."""
TAIL_LINES = 40
"""Lines of LeRobot's output a failure quotes."""


def parse_loss(line: str) -> float | None:
    """The loss of one LeRobot metrics line, None for any other line."""
    match = LOG_LINE.search(line)
    return None if match is None else float(match["loss"])


def logged_step(start: int, log_freq: int, k: int) -> int:
    """The step of the ``k``-th metrics line (from 1) of a run from step ``start``: LeRobot
    logs after each step that is a multiple of ``log_freq``."""
    return (start // log_freq + k) * log_freq


def checkpoint_tar(folder: Path, path: Path) -> None:
    """Write the checkpoint ``folder`` as an uncompressed tar at ``path`` (members relative to
    it, sorted, no owners or times: the same files give the same bytes)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    if size > MAX_CHECKPOINT_BYTES:
        raise PhysaiError(f"{folder}: a checkpoint of {gib(size)}, over the "
                          f"{gib(MAX_CHECKPOINT_BYTES)} allowed")
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for file in files:
            info = tar.gettarinfo(str(file), file.relative_to(folder).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o644
            with file.open("rb") as f:
                tar.addfile(info, f)


def restore_checkpoint(payload: Path, folder: Path) -> None:
    """Unpack a checkpoint tar (:func:`checkpoint_tar`) into the new ``folder``: at most
    :data:`MAX_MEMBERS` regular files, each named by a relative path that stays inside it,
    :data:`MAX_CHECKPOINT_BYTES` in all; anything else is refused before a byte is written."""
    with tarfile.open(payload, "r:") as tar:
        members = tar.getmembers()
        if len(members) > MAX_MEMBERS or sum(m.size for m in members) > MAX_CHECKPOINT_BYTES:
            raise PhysaiError(f"{payload}: more files or bytes than a checkpoint holds")
        for member in members:
            parts = Path(member.name).parts
            if not member.isfile() or not parts or member.name.startswith("/") or ".." in parts:
                raise PhysaiError(f"{payload}: {member.name!r} is not a file of a checkpoint")
        folder.mkdir(parents=True)
        for member in members:
            source = tar.extractfile(member)
            if source is None:
                raise PhysaiError(f"{payload}: {member.name!r} cannot be read")
            target = folder.joinpath(*Path(member.name).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with source, target.open("wb") as out:
                shutil.copyfileobj(source, out)


def repoint_config(config: Path, output_dir: Path, dataset_root: Path) -> None:
    """Point a restored ``train_config.json`` at this attempt's output and dataset folders (the
    paths it holds are those of the attempt that wrote it)."""
    data = json.loads(config.read_text())
    data["output_dir"] = str(output_dir)
    data["dataset"]["root"] = str(dataset_root)
    config.write_text(json.dumps(data, indent=2))


@dataclass
class Watch:
    """What a LeRobot training run has shown so far."""

    curve: list[tuple[int, float]] = field(default_factory=list)
    """(step, loss) of every metrics line."""
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    """Its last lines of output."""
    published: set[str] = field(default_factory=set)
    """Checkpoint folders already published."""


OnCheckpoint = Callable[[Path, int], Checkpoint]
"""Publish a finished checkpoint folder of the given step; returns its artifact."""
OnMetrics = Callable[[int, float], None]
"""Called with the step and loss of every metrics line."""


def _newest(output_dir: Path) -> Path | None:
    """The folder ``checkpoints/last`` points at, once LeRobot has moved the link there (it
    does so after the folder is complete)."""
    last = output_dir / "checkpoints" / "last"
    if not last.is_symlink():
        return None
    target = (last.parent / os.readlink(last)).resolve()
    return target if target.is_dir() else None


def _publish_new(output_dir: Path, watch: Watch, on_checkpoint: OnCheckpoint,
                 lock: threading.Lock) -> None:
    with lock:
        folder = _newest(output_dir)
        if folder is None or folder.name in watch.published:
            return
        watch.published.add(folder.name)
        checkpoint = on_checkpoint(folder, int(folder.name))
        log.info("checkpoint of step %d stored (%s)", checkpoint.iteration,
                 checkpoint.digest[:12])


@contextmanager
def _polling(output_dir: Path, watch: Watch, on_checkpoint: OnCheckpoint,
             lock: threading.Lock) -> Iterator[None]:
    """Publish each new checkpoint within a second of LeRobot finishing it."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def poll() -> None:
        while not stop.wait(1.0):
            try:
                _publish_new(output_dir, watch, on_checkpoint, lock)
            except Exception as exc:  # reported by the caller below
                failed.append(exc)
                return

    thread = threading.Thread(target=poll, name="lerobot-checkpoints", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]


def run_training(argv: list[str], *, cwd: Path, output_dir: Path, steps: tuple[int, int, int],
                 on_checkpoint: OnCheckpoint, on_metrics: OnMetrics,
                 timeout_s: float) -> Watch:
    """Run LeRobot's trainer (``argv``) from step ``steps[0]`` to ``steps[1]``, logging every
    ``steps[2]``; report its metrics as they come and publish its checkpoints. A failure is a
    PhysaiError quoting the end of its output."""
    start, total, log_freq = steps
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    watch, lock = Watch(), threading.Lock()
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) as proc, \
            _polling(output_dir, watch, on_checkpoint, lock):
        if proc.stdout is None:
            raise PhysaiError("LeRobot's trainer has no output pipe")
        # \r ends tqdm's updates as \n ends log lines: either is a line here.
        for line in io.TextIOWrapper(proc.stdout, errors="replace", newline=None):
            text = line.strip()
            if text:
                watch.tail.append(text[:400])
            loss = parse_loss(text)
            if loss is not None:
                step = logged_step(start, log_freq, len(watch.curve) + 1)
                watch.curve.append((step, loss))
                on_metrics(step, loss)
                log.info("lerobot step %d of %d: loss %.4f", step, total, loss)
            if time.monotonic() > deadline:
                proc.kill()
                raise PhysaiError(f"LeRobot's trainer ran past {timeout_s:g} s and was stopped")
        code = proc.wait()
    if code != 0:
        raise PhysaiError(f"LeRobot's trainer failed (exit status {code}): "
                          + " | ".join(list(watch.tail)[-12:]))
    _publish_new(output_dir, watch, on_checkpoint, lock)
    return watch


def fresh_folder(path: Path) -> Path:
    """``path``, emptied (created when missing)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def train_config(*, policy: str, options: dict[str, Any], dataset_root: Path, repo_id: str,
                 output_dir: Path, device: str, seed: int, steps: int, batch_size: int,
                 save_freq: int, log_freq: int, num_workers: int) -> dict[str, Any]:
    """LeRobot's ``TrainPipelineConfig`` as the JSON ``--config_path`` reads."""
    return {
        "dataset": {"repo_id": repo_id, "root": str(dataset_root), "video_backend": "pyav"},
        "policy": {"type": policy, **options, "device": device, "push_to_hub": False},
        "output_dir": str(output_dir), "job_name": f"physai-{policy}", "seed": seed,
        "num_workers": num_workers, "batch_size": batch_size, "steps": steps,
        "log_freq": log_freq, "save_freq": save_freq, "save_checkpoint": True,
        "env_eval_freq": 0, "wandb": {"enable": False},
        "persistent_workers": num_workers > 0,
    }

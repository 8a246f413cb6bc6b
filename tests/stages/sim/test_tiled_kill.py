"""A validating process killed by SIGKILL leaves nothing behind: its tiled-camera worker
processes end and the shared memory they drew into is unlinked (stages/sim/env/tiled.py).

A SIGKILL runs no ``finally`` and no finalizer in the killed process: the workers must notice on
their own (their pipe to it closes), and the shared memory must be freed by a process that
outlives it (multiprocessing's resource tracker, which every segment is registered with)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
VALIDATOR = Path(__file__).with_name("tiled_validator.py")


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _wait_gone(workers: list[int], memory: list[str], seconds: float) -> tuple[list, list]:
    """The workers still alive and the shared memory files still present after ``seconds``
    (or as soon as none are)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid in workers if _alive(pid)]
        present = [m for m in memory if os.path.exists(m)]
        if not (alive or present) or time.monotonic() > deadline:
            return alive, present
        time.sleep(0.2)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
def test_sigkilled_validator_leaves_no_tile_workers_and_no_shared_memory(
        tmp_path: Path) -> None:
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
           "PYTHONPATH": str(ROOT)}
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as err:
        proc = subprocess.Popen([sys.executable, str(VALIDATOR), "2"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            proc.wait(timeout=30)
            pytest.fail(f"the validator ended before its workers drew: {errors.read_text()}")
        seen = json.loads(line)
        workers, memory = seen["workers"], seen["shared_memory"]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        assert len(memory) == 2 and all(os.path.exists(m) for m in memory)  # input rows, images
        time.sleep(1.0)  # mid-rollout: the workers are drawing
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)  # not communicate(): a surviving worker would hold the pipe
        if proc.stdout:
            proc.stdout.close()
    alive, present = _wait_gone(workers, memory, 20.0)
    for pid in alive:  # leave no process behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert alive == [], f"tile workers outlived the killed validator: {alive}"
    assert present == [], f"shared memory outlived the killed validator: {present}"

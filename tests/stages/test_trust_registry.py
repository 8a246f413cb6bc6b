"""The registry lock has one holder at a time, against a real MLflow server on SQLite: a
holder whose lock was broken cannot release its successor's, a breaker of a stale lock cannot
break the lock of whoever broke it first, and a live holder renews its lease past the expiry."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from physai_core.errors import PhysaiError
from stages.tracking import aliases as registry
from stages.tracking.aliases import LOCK_PREFIX, registry_lock
from stages.tracking.lineage import LineageRecorder

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys
import stages.tracking.aliases as registry
from stages.tracking.lineage import LineageRecorder

registry.LOCK_TTL_S = 1.0
with registry.registry_lock(LineageRecorder(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _locks(lineage: LineageRecorder) -> list[str]:
    return [m.name for m in lineage.client.search_registered_models()
            if m.name.startswith(LOCK_PREFIX)]


def _is_held(server: str, model: str) -> bool:
    """Whether someone holds the lock of ``model``: a third process cannot take it at once."""
    try:
        with registry_lock(LineageRecorder(server), model, timeout_s=1.0):
            return False
    except PhysaiError as exc:
        if "held by" not in str(exc):
            raise
        return True


def test_a_holder_whose_lock_was_broken_does_not_release_its_successors(
    mlflow_server: str,
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, mlflow_server, "paused"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "held\n", holder.stderr
        holder.send_signal(signal.SIGSTOP)  # a holder stalled past its 1 s lease
        time.sleep(2.0)
        with registry_lock(LineageRecorder(mlflow_server), "paused", timeout_s=30):
            holder.send_signal(signal.SIGCONT)
            holder.stdin.write("\n")
            holder.stdin.flush()
            out, err = holder.communicate(timeout=60)
            assert holder.returncode == 0 and out == "released\n", err
            assert _is_held(mlflow_server, "paused"), "the stalled holder released our lock"
        assert "was broken while this process held it" in err
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    assert _locks(LineageRecorder(mlflow_server)) == []


class _SlowFirstDelete(LineageRecorder):
    """A recorder whose first delete reaches MLflow only once ``go`` is set: a breaker on a
    slow link, whose delete arrives after someone else broke the same stale lock."""

    def __init__(self, server: str, go: threading.Event) -> None:
        super().__init__(server)
        self.go, self.waited = go, False

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "delete_registered_model" and not self.waited:
            self.waited = True
            self.go.wait(60)
        return super().call(method, *args, **kwargs)


def test_a_slow_breaker_of_a_stale_lock_does_not_break_its_successors(
    mlflow_server: str,
) -> None:
    lineage = LineageRecorder(mlflow_server)
    lineage.client.create_registered_model(
        f"{LOCK_PREFIX}stale", tags={"physai.lock.expires": f"{time.time() - 1:.3f}",
                                     "physai.lock.holder": "a crashed promoter"})
    fast_inside = threading.Event()
    slow = _SlowFirstDelete(mlflow_server, fast_inside)
    overlaps: list[str] = []
    inside = threading.Lock()

    def slow_breaker() -> None:
        with registry_lock(slow, "stale", timeout_s=60):
            if not inside.acquire(blocking=False):
                overlaps.append("the slow breaker held the lock with the fast one")
                return
            inside.release()

    breaker = threading.Thread(target=slow_breaker)
    breaker.start()
    deadline = time.monotonic() + 30
    while not slow.waited and time.monotonic() < deadline:  # it saw the stale lock
        time.sleep(0.05)
    assert slow.waited
    with registry_lock(lineage, "stale", timeout_s=30), inside:
        fast_inside.set()
        time.sleep(2.0)
    breaker.join(60)
    assert not breaker.is_alive() and overlaps == []
    assert _locks(lineage) == []


def test_a_live_holder_renews_its_lock_past_the_expiry(
    mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "LOCK_TTL_S", 4.0)
    lineage = LineageRecorder(mlflow_server)
    waited: list[str] = []

    def contend() -> None:
        try:
            with registry_lock(LineageRecorder(mlflow_server), "long", timeout_s=10.0):
                waited.append("took the lock of a live holder")
        except PhysaiError as exc:
            waited.append(str(exc))

    with registry_lock(lineage, "long") as lock:
        contender = threading.Thread(target=contend)
        contender.start()
        contender.join(60)
        assert len(waited) == 1 and "held by" in waited[0], waited
        lock.check()  # two and a half lease lengths later, still ours
    assert _locks(lineage) == []

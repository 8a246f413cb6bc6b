"""Alias compare-and-set, history and rollback against a real MLflow server on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from physai_core.errors import PhysaiError
from stages.tracking.aliases import (
    LOCK_PREFIX,
    AliasConflict,
    RollbackError,
    compare_and_set_alias,
    current_version,
    history,
    registry_lock,
    rollback_alias,
)
from stages.tracking.lineage import LineageRecorder


def _model(server: str, name: str, versions: int, tmp_path: Path) -> LineageRecorder:
    lineage = LineageRecorder(server)
    lineage.client.create_registered_model(name)
    for _ in range(versions):
        lineage.client.create_model_version(name, f"s3://models/{name}",
                                            tags={"physai.gates_passed": "true"})
    return lineage


def _locks(lineage: LineageRecorder) -> list[str]:
    return [m.name for m in lineage.client.search_registered_models()
            if m.name.startswith(LOCK_PREFIX)]


def test_ten_concurrent_promotions_leave_one_champion(mlflow_server: str, tmp_path: Path) -> None:
    lineage = _model(mlflow_server, "race", 11, tmp_path)
    compare_and_set_alias(lineage, "race", "champion", None, "1", why="first")
    barrier = threading.Barrier(10)
    won: list[str] = []
    lost: list[str] = []

    def attempt(version: str) -> None:
        mine = LineageRecorder(mlflow_server)
        barrier.wait()
        try:
            compare_and_set_alias(mine, "race", "champion", "1", version, why=f"try {version}")
            won.append(version)
        except AliasConflict as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=attempt, args=(str(v),)) for v in range(2, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(won) == 1 and len(lost) == 9, (won, lost)
    assert all(f"race@champion is v{won[0]}, not v1" in message for message in lost)
    assert current_version(lineage, "race", "champion") == won[0]
    events = history(lineage, "race", "champion")
    assert [(e.event, e.version, e.previous) for e in events] == [
        ("promote", "1", None), ("promote", won[0], "1")]
    tags = lineage.client.get_model_version("race", won[0]).tags
    assert tags["physai.champion.previous"] == "1"
    assert tags["physai.champion.promoted_why"] == f"try {won[0]}"
    assert _locks(lineage) == []


def test_rollback_restores_the_previous_champion(mlflow_server: str, tmp_path: Path) -> None:
    lineage = _model(mlflow_server, "roll", 3, tmp_path)
    for expected, version in ((None, "1"), ("1", "2"), ("2", "3")):
        compare_and_set_alias(lineage, "roll", "champion", expected, version, why="gates")
    back = rollback_alias(lineage, "roll", "champion", "bad on the robot")
    assert (back.version, back.previous, back.event) == ("2", "3", "rollback")
    assert current_version(lineage, "roll", "champion") == "2"
    assert "physai.champion.rolled_back_at" in lineage.client.get_model_version("roll", "3").tags
    restored = lineage.client.get_model_version("roll", "2").tags
    assert restored["physai.champion.restored_why"] == "bad on the robot"
    assert rollback_alias(lineage, "roll", "champion", "again").version == "1"
    with pytest.raises(RollbackError, match="v1, which has no previous @champion"):
        rollback_alias(lineage, "roll", "champion", "once more")
    with pytest.raises(RollbackError, match="is not set"):
        rollback_alias(lineage, "roll", "staging", "x")
    assert [e.event for e in history(lineage, "roll", "champion")] == [
        "promote", "promote", "promote", "rollback", "rollback"]


def test_stale_lock_is_broken_and_a_live_one_waited_for(
    mlflow_server: str, tmp_path: Path
) -> None:
    lineage = _model(mlflow_server, "locked", 1, tmp_path)
    lineage.client.create_registered_model(
        f"{LOCK_PREFIX}locked", tags={"physai.lock.expires": f"{time.time() - 1:.3f}",
                                      "physai.lock.holder": "a crashed promoter"})
    compare_and_set_alias(lineage, "locked", "champion", None, "1", why="after a crash")
    assert _locks(lineage) == []
    with registry_lock(lineage, "locked"), pytest.raises(PhysaiError, match="held by"):
        compare_and_set_alias(LineageRecorder(mlflow_server), "locked", "champion", "1", "1",
                              why="blocked", lock_timeout_s=0.5)
    assert _locks(lineage) == []


def test_flows_promote_cli_rolls_back_and_refuses_ungated_versions(
    mlflow_server: str, tmp_path: Path
) -> None:
    lineage = _model(mlflow_server, "cli", 2, tmp_path)
    lineage.client.create_model_version("cli", "s3://models/cli",
                                        tags={"physai.gates_passed": "false"})
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server,
           "PHYSAI_HOME": str(tmp_path / ".physai"), "PHYSAI_ACTOR": "ops", "COLUMNS": "200"}

    def flows(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.cli", "promote", "cli", *args],
                              env=env, cwd=tmp_path, capture_output=True, text=True,
                              check=False, timeout=120)

    assert flows("--version", "1").returncode == 0
    moved = flows("--version", "2", "--why", "better on pushes")
    assert moved.returncode == 0 and "v1 -> v2" in moved.stdout, moved.stderr
    refused = flows("--version", "3")
    assert refused.returncode == 2 and "physai.gates_passed" in refused.stderr
    back = flows("--rollback", "--why", "arm drifts")
    assert back.returncode == 0 and "v2 -> v1 (rolled back by ops)" in back.stdout
    assert "arm drifts" in back.stdout and "better on pushes" in back.stdout
    assert current_version(lineage, "cli", "champion") == "1"


def test_lock_of_a_dead_process_on_this_host_is_broken_at_once(
    mlflow_server: str, tmp_path: Path
) -> None:
    import socket

    lineage = _model(mlflow_server, "orphan", 1, tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lineage.client.create_registered_model(f"{LOCK_PREFIX}orphan", tags={
        "physai.lock.expires": f"{time.time() + 3600:.3f}", "physai.lock.holder": "killed",
        "physai.lock.host": socket.gethostname(), "physai.lock.pid": str(dead.pid)})
    start = time.monotonic()
    compare_and_set_alias(lineage, "orphan", "champion", None, "1", why="after SIGKILL",
                          lock_timeout_s=5)
    assert time.monotonic() - start < 3
    lineage.client.create_registered_model(f"{LOCK_PREFIX}orphan", tags={
        "physai.lock.expires": f"{time.time() + 3600:.3f}", "physai.lock.holder": "alive",
        "physai.lock.host": socket.gethostname(), "physai.lock.pid": str(os.getpid())})
    with pytest.raises(PhysaiError, match="held by alive"):
        compare_and_set_alias(lineage, "orphan", "champion", "1", "1", why="x",
                              lock_timeout_s=0.5)

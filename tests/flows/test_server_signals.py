"""``flows server up`` leaves no server behind when a signal stops it: in the foreground (as
systemd or a container runs it) on SIGTERM, and on Ctrl-C while the servers start (both signals
go through one handler, :func:`flows.servers.raise_on_stop_signals`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import CliEnv
from tests.support import free_port, processes


def _start(home: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "server", "up", "--prefect-port", str(free_port()),
         "--mlflow-port", str(free_port()), *extra], cwd=home.parent, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _servers(home: Path, timeout: float) -> list[dict[str, object]]:
    """The servers ``flows server up`` recorded, once it has recorded both."""
    path = home / "servers.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            servers: list[dict[str, object]] = json.loads(path.read_text())
            if len(servers) == 2:
                return servers
        time.sleep(0.1)
    raise AssertionError(f"no servers recorded in {path} within {timeout} s")


def _left_behind(servers: list[dict[str, object]], timeout: float = 40) -> list[int]:
    pgids = [int(str(s["pid"])) for s in servers]
    deadline = time.monotonic() + timeout
    while (left := [p for g in pgids for p in processes(group=g)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _kill(proc: subprocess.Popen[str], servers: list[dict[str, object]]) -> None:
    for pgid in [proc.pid, *(int(str(s["pid"])) for s in servers)]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def test_a_foreground_server_stops_both_servers_on_sigterm(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    sig = signal.SIGTERM
    home = tmp_path / ".physai"
    proc = _start(home, cli_env(home, shared_prefect=False), "--foreground")
    servers: list[dict[str, object]] = []
    try:
        servers = _servers(home, 60)
        deadline = time.monotonic() + 120
        out = proc.stdout
        assert out is not None
        while (line := out.readline()) and "serving in the foreground" not in line:
            assert time.monotonic() < deadline, "the servers never became healthy"
        assert line, f"flows server up exited early (status {proc.wait()})"
        assert all(processes(group=int(str(s["pid"]))) for s in servers), "a server is not running"
        proc.send_signal(sig)  # to flows alone, as a supervisor stopping its main pid
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0 and f"stopped by {sig.name}" in rest, rest
        assert _left_behind(servers) == [], f"a server outlived flows server up: {rest}"
        assert not (home / "servers.json").exists()
    finally:
        _kill(proc, servers)


def test_ctrl_c_while_the_servers_start_stops_what_was_started(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    home = tmp_path / ".physai"
    proc = _start(home, cli_env(home, shared_prefect=False))
    servers: list[dict[str, object]] = []
    try:
        servers = _servers(home, 60)  # both started, neither healthy yet
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 128 + signal.SIGINT, out
        assert "nothing left running" in out, out
        assert _left_behind(servers) == [], "a server outlived flows server up"
    finally:
        _kill(proc, servers)

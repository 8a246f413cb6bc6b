"""``flows server down`` stops only the processes ``flows server up`` started, whatever
``servers.json`` says; and ``flows server up`` runs from a venv whose ``bin/`` holds no
console script of its dependencies (a clone's thin venv over the shared one)."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliEnv
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process nobody asked ``flows server down`` to stop, leading its own process group."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])


def _forgeries(pid: int, genuine: dict[str, object] | None = None) -> list[dict[str, object]]:
    """Entries naming ``pid``: as older versions wrote them, with the process's own command
    line, and (given a genuine entry) with a server's command line and start time."""
    url = "http://127.0.0.1:5000"
    old = {"name": "mlflow", "pid": pid, "url": url, "health": f"{url}/health", "log": "x.log"}
    forged = [old, {**old, "cmdline": ["sleep", "600"], "started": _start_ticks(pid)}]
    if genuine is not None:
        forged.append({**genuine, "pid": pid})
    return forged


def test_server_down_leaves_a_process_it_did_not_start(
    tmp_path: Path, cli_env: CliEnv, bystander: subprocess.Popen[bytes]
) -> None:
    home = tmp_path / ".physai"
    home.mkdir()
    (home / "servers.json").write_text(json.dumps(_forgeries(bystander.pid)[:1]))
    down = subprocess.run([sys.executable, "-m", "flows.cli", "server", "down"], cwd=tmp_path,
                          env=cli_env(home, shared_prefect=False), capture_output=True,
                          text=True, timeout=120)
    assert down.returncode == 0 and "nothing was running" in down.stdout, down.stderr
    assert bystander.poll() is None, "flows server down killed a process it did not start"
    refusals = [line for line in down.stderr.splitlines() if line.startswith("not stopping")]
    assert refusals == [
        f"not stopping pid {bystander.pid} (mlflow): servers.json does not record how it was "
        "started"], down.stderr
    assert not (home / "servers.json").exists()


def test_servers_started_from_a_thin_venv_are_stopped_and_nothing_else(
    tmp_path: Path, cli_env: CliEnv, bystander: subprocess.Popen[bytes]
) -> None:
    thin = tmp_path / "thin"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(thin)], check=True)
    (site_dir,) = (thin / "lib").glob("python*/site-packages")
    (site_dir / "shared-deps.pth").write_text("\n".join(
        [str(ROOT), *(f"import site; site.addsitedir({d!r})" for d in site.getsitepackages())]
    ) + "\n")
    assert sorted(p.name for p in (thin / "bin").iterdir() if "prefect" in p.name) == []
    home = tmp_path / ".physai"
    env = cli_env(home, shared_prefect=False)

    def flows(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(thin / "bin" / "python"), "-m", "flows.cli", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)

    servers: list[dict[str, object]] = []
    try:
        up = flows("server", "up", "--prefect-port", str(free_port()),
                   "--mlflow-port", str(free_port()))
        assert up.returncode == 0, up.stdout + up.stderr
        servers = json.loads((home / "servers.json").read_text())
        assert [s["cmdline"][1:3] for s in servers] == [  # type: ignore[index]
            ["-m", "prefect"], ["-m", "mlflow"]]
        (home / "servers.json").write_text(
            json.dumps(servers + _forgeries(bystander.pid, servers[1])))
    finally:
        down = flows("server", "down")
    assert down.returncode == 0 and "stopped: prefect, mlflow" in down.stdout, down.stderr
    assert bystander.poll() is None, "flows server down killed a process it did not start"
    assert down.stderr.count(f"not stopping pid {bystander.pid} (mlflow)") == 3, down.stderr
    assert "its recorded command line is not one flows server up runs" in down.stderr
    assert "it runs another command line than the one recorded" in down.stderr
    for server in servers:
        with pytest.raises(ProcessLookupError):
            os.kill(int(str(server["pid"])), 0)

"""Local Prefect and MLflow servers for the UIs: ``flows server up`` and ``flows server down``.

Both run as detached processes with lightweight settings; their state (pids, URLs, logs) lives
under ``$PHYSAI_HOME``. While they run, ``flows run`` reports to them instead of starting a
temporary Prefect server and writing MLflow's database directly. ``flows server up --foreground``
stays in front instead, for a supervisor (systemd, a container): SIGTERM or SIGINT stops both
servers, and so does either of them dying. A signal while they start stops what was started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from stages.errors import PhysaiError
from stages.settings import Settings, embedded_environment

STARTUP_SECONDS = 120


@dataclass(frozen=True)
class Server:
    """One running server: what it is, its process group, where to reach it, where it logs."""

    name: str
    pid: int
    url: str
    health: str
    log: str


def state_file(settings: Settings) -> Path:
    """Where the running servers are recorded."""
    return settings.home / "servers.json"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a child of this process that exited is reaped here, so
    it does not linger as a zombie that still answers signals."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not a child of this process: ask the kernel
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running(settings: Settings) -> list[Server]:
    """The recorded servers whose processes are still alive."""
    path = state_file(settings)
    if not path.is_file():
        return []
    servers = [Server(**s) for s in json.loads(path.read_text())]
    return [s for s in servers if _alive(s.pid)]


def _healthy(url: str) -> bool:
    import http.client

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, http.client.HTTPException):  # nothing there, or something not HTTP
        return False


def _start(name: str, cmd: list[str], env: dict[str, str], health: str, url: str,
           logs: Path) -> Server:
    if _healthy(health):
        raise PhysaiError(f"{name}: something already answers at {url}; choose another port")
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Server(name, proc.pid, url, health, str(log))


def up(settings: Settings, prefect_port: int, mlflow_port: int) -> list[Server]:
    """Start the Prefect and MLflow servers (if not already running) and wait until healthy."""
    if running(settings):
        return running(settings)
    logs = settings.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **embedded_environment(settings),
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("PREFECT_API_URL", None)
    settings.prefect_home.mkdir(parents=True, exist_ok=True)
    prefect_url = f"http://127.0.0.1:{prefect_port}"
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    # The UI the Prefect server serves calls its API here, not at the default port 4200.
    if "PREFECT_UI_API_URL" not in env:
        env.setdefault("PREFECT_SERVER_UI_API_URL", f"{prefect_url}/api")
    servers = [
        _start("prefect", [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1",
                           "--port", str(prefect_port)],
               env, f"{prefect_url}/api/health", prefect_url, logs),
        _start("mlflow", [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                          "--port", str(mlflow_port), "--workers", "1",
                          "--backend-store-uri", f"sqlite:///{settings.home / 'mlflow.db'}",
                          "--artifacts-destination", str(settings.mlflow_artifacts)],
               env, f"{mlflow_url}/health", mlflow_url, logs),
    ]
    state_file(settings).write_text(json.dumps([asdict(s) for s in servers], indent=2))
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        for server in servers:
            while not _healthy(server.health):
                if not _alive(server.pid) or time.monotonic() > deadline:
                    raise PhysaiError(f"{server.name} server did not start; see {server.log}")
                time.sleep(0.5)
    except BaseException:  # a failure, or a signal turned into an exception: stop them all
        down(settings)
        raise
    return servers


class Stopped(Exception):
    """SIGTERM or SIGINT reached a process that stops its servers on them."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_stop_signals() -> None:
    """Turn SIGTERM and SIGINT into :class:`Stopped`, so that cleanup code runs on them."""

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def wait_foreground(settings: Settings, servers: list[Server], poll_s: float = 1.0) -> str:
    """Block until SIGTERM or SIGINT (see :func:`raise_on_stop_signals`) or until a server
    dies, then stop every server; returns why it stopped."""
    try:
        while True:
            dead = [s.name for s in servers if not _alive(s.pid)]
            if dead:
                why = f"{dead[0]} server exited"
                break
            time.sleep(poll_s)
    except Stopped as stop:
        why = f"stopped by {stop}"
    down(settings)
    return why


def down(settings: Settings) -> list[Server]:
    """Stop the recorded servers (their whole process groups); returns those stopped."""
    stopped = running(settings)
    for server in stopped:
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for server in stopped:
        while _alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
    state_file(settings).unlink(missing_ok=True)
    return stopped


def use_running(settings: Settings) -> list[Server]:
    """Point this process at the local servers when they run (unless the environment already
    names others); returns the servers used."""
    servers = {s.name: s for s in running(settings)}
    if "prefect" in servers:
        os.environ.setdefault("PREFECT_API_URL", f"{servers['prefect'].url}/api")
    if "mlflow" in servers:
        os.environ.setdefault("MLFLOW_TRACKING_URI", servers["mlflow"].url)
    return list(servers.values())


def prepare_environment() -> None:
    """Point Prefect and MLflow at the local servers when ``flows server up`` started them,
    else at the embedded state folder, unless the environment says else."""
    from stages.settings import apply_embedded_environment, resolve_settings

    settings = resolve_settings()
    os.environ["PHYSAI_HOME"] = str(settings.home)
    settings.home.mkdir(parents=True, exist_ok=True)
    use_running(settings)
    apply_embedded_environment(settings)

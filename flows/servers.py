"""Local Prefect and MLflow servers for the UIs: ``flows server up`` and ``flows server down``.

Both run as detached processes with lightweight settings; their state (pids, URLs, logs) lives
under ``$PHYSAI_HOME``. While they run, ``flows run`` reports to them instead of starting a
temporary Prefect server and writing MLflow's database directly. ``flows server up --foreground``
stays in front instead, for a supervisor (systemd, a container): SIGTERM or SIGINT stops both
servers, and so does either of them dying. A signal while they start stops what was started.

``flows server down`` stops only what ``flows server up`` started: a recorded process must
still lead its own process group, run the very command line recorded for it (one ``up`` builds
for this state folder) and have started when recorded; anything else named in
``servers.json`` is left alone, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from flows.prefect_db import seed_prefect_database
from physai_core.errors import ConfigError, PhysaiError, printable
from stages.core.settings import Settings, embedded_environment
from stages.tracking.schema_cache import seed_mlflow_database

log = logging.getLogger(__name__)

STARTUP_SECONDS = 120


@dataclass(frozen=True)
class Server:
    """One running server: what it is, its process group, where to reach it, where it logs."""

    name: str
    pid: int
    url: str
    health: str
    log: str
    cmdline: tuple[str, ...] = ()
    """The command line it was started with."""
    started: int = 0
    """When it started, in clock ticks after boot (``/proc/<pid>/stat``, field 22)."""


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


def recorded(settings: Settings) -> list[Server]:
    """The servers ``servers.json`` names, whatever they are now; an unreadable file names
    none (with a warning)."""
    path = state_file(settings)
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())
        servers = [_server(entry) for entry in entries]
    except (OSError, ValueError, TypeError, KeyError):
        log.warning("%s: not a record of flows server up; ignored", path)
        return []
    return servers


def _server(entry: dict[str, object]) -> Server:
    """One entry of ``servers.json``; ValueError, TypeError or KeyError when it is not one."""
    name, pid, url, health, log_path = (entry[k] for k in ("name", "pid", "url", "health", "log"))
    cmdline, started = entry.get("cmdline", []), entry.get("started", 0)
    if not (isinstance(name, str) and isinstance(url, str) and isinstance(health, str)
            and isinstance(log_path, str) and type(pid) is int and type(started) is int
            and isinstance(cmdline, list) and all(isinstance(a, str) for a in cmdline)):
        raise TypeError("an entry of servers.json")
    if pid <= 1:
        raise ValueError("pid")
    return Server(name, pid, url, health, log_path, tuple(cmdline), started)


def running(settings: Settings) -> list[Server]:
    """The recorded servers that are still alive and are the processes ``up`` started."""
    return [s for s in recorded(settings) if _alive(s.pid) and not _not_ours(settings, s)]


def _not_ours(settings: Settings, server: Server) -> str:
    """Why process ``server.pid`` is not the server ``up`` started; empty when it is."""
    if not server.cmdline:
        return "servers.json does not record how it was started"
    port = _port(server.cmdline)
    external = server.name == "mlflow" and "--backend-store-uri" not in server.cmdline
    expected = _command(settings, server.name, port, server.cmdline[0], external)
    if list(server.cmdline) != expected:
        return "its recorded command line is not one flows server up runs"
    url = f"http://127.0.0.1:{port}"
    if (server.url, server.health) != (url, _health(server.name, url)):
        return "its recorded address is not the one flows server up gave it"
    try:
        if os.getpgid(server.pid) != server.pid:
            return "it does not lead its own process group"
        proc = Path(f"/proc/{server.pid}")
        cmdline = proc.joinpath("cmdline").read_bytes().split(b"\0")
        stat = proc.joinpath("stat").read_text()
    except ProcessLookupError:
        return "it is not running"
    except OSError as exc:
        return f"its command line cannot be read ({exc.strerror or exc})"
    if [a.decode(errors="replace") for a in cmdline[:-1]] != expected:
        return "it runs another command line than the one recorded"
    if _start_ticks(stat) != server.started:
        return "it started at another time than the one recorded"
    return ""


def _port(cmdline: tuple[str, ...]) -> int:
    """The ``--port`` of a recorded command line; 0 when it has none."""
    args = list(cmdline)
    if "--port" in args[:-1]:
        value = args[args.index("--port") + 1]
        if value.isdigit():
            return int(value)
    return 0


def _start_ticks(stat: str) -> int:
    """Field 22 of ``/proc/<pid>/stat`` (start time); -1 when unreadable."""
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return -1


def _health(name: str, url: str) -> str:
    """Where server ``name`` at ``url`` answers whether it is healthy."""
    return f"{url}/api/health" if name == "prefect" else f"{url}/health"


def _command(settings: Settings, name: str, port: int, python: str,
             external: bool = False) -> list[str]:
    """The command line ``up`` runs for server ``name`` on ``port`` with interpreter ``python``;
    empty for a name it does not start. ``external``: MLflow's store is one given to ``up``
    (:class:`Stores`), which reaches it through the environment, not the command line."""
    if name == "prefect":
        return [python, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                "--port", str(port)]
    if name == "mlflow":
        cmd = [python, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]
        if external:
            return cmd
        return [*cmd, "--backend-store-uri", f"sqlite:///{settings.home / 'mlflow.db'}",
                "--artifacts-destination", str(settings.mlflow_artifacts)]
    return []


@dataclass(frozen=True)
class Stores:
    """Where ``flows server up`` keeps the servers' state when not in the state folder:
    Prefect's database, MLflow's database and MLflow's artifacts (a cluster's PostgreSQL and
    S3, as the README tells a cluster to run them). Empty fields keep the state folder's."""

    prefect_database: str = ""
    """A SQLAlchemy URL Prefect's server runs on: ``postgresql+asyncpg://USER@HOST:PORT/DB``."""
    mlflow_database: str = ""
    """MLflow's backend store: ``postgresql://USER@HOST:PORT/DB`` (psycopg: the postgres
    extra)."""
    mlflow_artifacts: str = ""
    """Where MLflow's server keeps the artifacts it serves: ``s3://BUCKET/PREFIX`` or a folder."""

    @property
    def external_mlflow(self) -> bool:
        return bool(self.mlflow_database or self.mlflow_artifacts)

    def check(self) -> None:
        """A one-line :class:`ConfigError` naming the option and its value (without a
        password) for a store the servers cannot run on, or whose driver is missing."""
        from stages.tracking.lineage import without_credentials

        def bad(option: str, value: str, message: str) -> ConfigError:
            return ConfigError.one("flows server up", option, without_credentials(value), message)

        def scheme(option: str, url: str) -> str:
            try:
                return urlsplit(url).scheme
            except ValueError as exc:  # a host's "[" without its "]"
                raise bad(option, url, f"not a URL ({exc})") from None

        if self.prefect_database and \
                scheme("--prefect-database", self.prefect_database) not in PREFECT_DATABASES:
            raise bad("--prefect-database", self.prefect_database,
                      f"not a database Prefect's server runs on "
                      f"({' or '.join(s + '://' for s in PREFECT_DATABASES)})")
        mlflow = scheme("--mlflow-database", self.mlflow_database)
        if self.mlflow_database and mlflow.partition("+")[0] not in MLFLOW_DATABASES:
            raise bad("--mlflow-database", self.mlflow_database,
                      f"not a database MLflow runs on "
                      f"({', '.join(s + '://' for s in MLFLOW_DATABASES)})")
        if mlflow.partition("+")[0] == "postgresql":
            import importlib.util

            # SQLAlchemy's driver for postgresql:// is psycopg (3); +DRIVER names another.
            driver = mlflow.partition("+")[2] or "psycopg"
            if importlib.util.find_spec(driver) is None:
                raise bad("--mlflow-database", self.mlflow_database,
                          f"MLflow reaches PostgreSQL through {driver}, which is not installed "
                          "(for psycopg, the postgres extra: pip install 'physai-flows[postgres]'; "
                          "make setup installs it)")
        if self.mlflow_artifacts and "://" not in self.mlflow_artifacts \
                and not Path(self.mlflow_artifacts).is_absolute():
            raise bad("--mlflow-artifacts", self.mlflow_artifacts,
                      "neither a URL (s3://BUCKET/PREFIX) nor an absolute folder")

    def environment(self, settings: Settings) -> dict[str, str]:
        """The variables that point the servers at these stores (passwords stay out of
        command lines, which every user of the machine can read)."""
        env = {}
        if self.prefect_database:
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = self.prefect_database
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self.prefect_database
        if self.external_mlflow:
            env["MLFLOW_BACKEND_STORE_URI"] = (self.mlflow_database
                                               or f"sqlite:///{settings.home / 'mlflow.db'}")
            env["MLFLOW_ARTIFACTS_DESTINATION"] = (self.mlflow_artifacts
                                                   or str(settings.mlflow_artifacts))
        return env

    def where(self, name: str) -> str:
        """Where server ``name`` keeps its state, as ``up`` prints it; empty for the state
        folder's."""
        from stages.tracking.lineage import without_credentials

        if name == "prefect" and self.prefect_database:
            return without_credentials(self.prefect_database)
        if name == "mlflow" and self.external_mlflow:
            return ", ".join(without_credentials(s) for s in
                             (self.mlflow_database, self.mlflow_artifacts) if s)
        return ""


PREFECT_DATABASES = ("postgresql+asyncpg", "sqlite+aiosqlite")
MLFLOW_DATABASES = ("postgresql", "mysql", "sqlite", "mssql")


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
    try:
        started = _start_ticks(Path(f"/proc/{proc.pid}/stat").read_text())
    except OSError:
        started = -1
    return Server(name, proc.pid, url, health, str(log), tuple(cmd), started)


def up(settings: Settings, prefect_port: int, mlflow_port: int,
       stores: Stores | None = None) -> list[Server]:
    """Start the Prefect and MLflow servers (if not already running) and wait until healthy;
    ``stores`` puts their state elsewhere than the state folder."""
    if running(settings):
        return running(settings)
    stores = stores or Stores()
    stores.check()
    logs = settings.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **embedded_environment(settings),
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **stores.environment(settings)}
    env.pop("PREFECT_API_URL", None)
    settings.prefect_home.mkdir(parents=True, exist_ok=True)
    seed_prefect_database(Path(env["PREFECT_HOME"]), env)
    if not stores.external_mlflow:
        seed_mlflow_database(f"sqlite:///{settings.home / 'mlflow.db'}", env)
    prefect_url = f"http://127.0.0.1:{prefect_port}"
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    # The UI the Prefect server serves calls its API here, not at the default port 4200.
    if "PREFECT_UI_API_URL" not in env:
        env.setdefault("PREFECT_SERVER_UI_API_URL", f"{prefect_url}/api")
    servers = [
        _start("prefect", _command(settings, "prefect", prefect_port, sys.executable),
               env, _health("prefect", prefect_url), prefect_url, logs),
        _start("mlflow", _command(settings, "mlflow", mlflow_port, sys.executable,
                                  stores.external_mlflow),
               env, _health("mlflow", mlflow_url), mlflow_url, logs),
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
    """Stop the recorded servers (their whole process groups) that are the processes ``up``
    started; returns those stopped. Any other process the record names is left running."""
    stopped = []
    for server in recorded(settings):
        if not _alive(server.pid):
            continue
        why = _not_ours(settings, server)
        if why:
            log.warning("not stopping pid %d (%s): %s", server.pid, printable(server.name[:40]),
                        why)
        else:
            stopped.append(server)
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
    servers = {}
    for server in recorded(settings):
        why = "it is not running" if not _alive(server.pid) else _not_ours(settings, server)
        if why:
            log.warning("%s: the %s server it names (pid %d) is not used (%s); "
                        "`flows server down` forgets it", state_file(settings), server.name,
                        server.pid, why)
        else:
            servers[server.name] = server
    if "prefect" in servers:
        os.environ.setdefault("PREFECT_API_URL", f"{servers['prefect'].url}/api")
    if "mlflow" in servers:
        os.environ.setdefault("MLFLOW_TRACKING_URI", servers["mlflow"].url)
    return list(servers.values())


def prepare_environment() -> None:
    """Point Prefect and MLflow at the local servers when ``flows server up`` started them,
    else at the embedded state folder, unless the environment says else."""
    from stages.core.settings import apply_embedded_environment, check_environment, resolve_settings

    check_environment()
    settings = resolve_settings()
    os.environ["PHYSAI_HOME"] = str(settings.home)
    settings.home.mkdir(parents=True, exist_ok=True)
    use_running(settings)
    apply_embedded_environment(settings)
    if "PREFECT_API_URL" not in os.environ:  # a temporary server will start on this database
        seed_prefect_database(Path(os.environ["PREFECT_HOME"]))
    seed_mlflow_database(os.environ.get("MLFLOW_TRACKING_URI") or settings.tracking_uri)

"""Helpers the end-to-end tests share: free ports, the ``flows`` command line as a subprocess,
and real servers started and waited for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REACH_TINY = ROOT / "tests" / "fixtures" / "reach_tiny.yaml"


def reach_tiny_config(path: Path, **sections: dict[str, object]) -> Path:
    """Write ``tests/fixtures/reach_tiny.yaml`` to ``path``, its scene and suite as absolute
    paths and ``sections``' values over its own (``validate={"video_episodes": 1}`` films a
    rollout per scene, which that file leaves off); returns ``path``."""
    import yaml

    data = yaml.safe_load(REACH_TINY.read_text())
    data["collect"]["scene"] = str(ROOT / "sim_scenes" / "reach" / "collect.yaml")
    data["validate"]["suite"] = str(ROOT / "tests" / "fixtures" / "suite_tiny.yaml")
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def stage_python(name: str) -> Path:
    """The interpreter of stage environment ``name``; the test is skipped, naming the make
    target that builds it, when it is not built."""
    import pytest

    from stages.core.environments import get_environment

    env = get_environment(name)
    python = env.python()
    if not os.access(python, os.X_OK):
        pytest.skip(f"the {name} stage environment is not built: make {env.make_target}")
    return python


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_stat(task: Path) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None when it is gone."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    fields = _proc_stat(Path(f"/proc/{pid}"))
    return fields is not None and fields[0] != "Z"


def processes(*, parent: int | None = None, group: int | None = None) -> list[int]:
    """Live processes whose parent is ``parent`` or whose process group is ``group``."""
    found = []
    for task in Path("/proc").glob("[0-9]*"):
        fields = _proc_stat(task)
        if fields is None or fields[0] == "Z":
            continue
        if (parent is not None and int(fields[1]) == parent) or (
                group is not None and int(fields[2]) == group):
            found.append(int(task.name))
    return found


def run_flows(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python -m flows.cli ARGS`` in ``cwd`` with ``env``; output captured as text."""
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_captured(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with output captured as text, ten minutes at most."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    """Wait until ``url`` answers; kill the server's process group and raise if it does not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
        if proc.poll() is not None:
            break
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"server at {url} did not become healthy: {log.read_text()[-2000:]}")


class MlflowServer:
    """An ``mlflow server`` on SQLite under ``root`` that can be stopped and started again on
    its port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from stages.tracking.schema_cache import seed_mlflow_database

        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        seed_mlflow_database(f"sqlite:///{self.root / 'mlflow.db'}", env)
        log = self.root / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--workers", "1", "--backend-store-uri",
             f"sqlite:///{self.root / 'mlflow.db'}", "--artifacts-destination",
             str(self.root / "artifacts")],
            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "ab"),  # noqa: SIM115
            start_new_session=True)
        wait_healthy(f"{self.url}/health", self.proc, log)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)
            self.proc = None


class PrefectServer:
    """A ``prefect server`` on SQLite under ``root``; ``api`` is its API URL once started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.api = f"http://127.0.0.1:{free_port()}/api"
        self.proc: subprocess.Popen[bytes] | None = None

    IDLE_SERVICES = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS",
                     "CANCELLATION_CLEANUP", "REPOSSESSOR", "CLEANUP_RECONCILER", "DB_VACUUM",
                     "TRIGGERS", "EVENT_LOGGER")
    """Server services the tests' flow-run records never need (no schedules, pauses,
    automations or workers of its own): off, each polls its database while the server idles
    (two servers side by side, 60 s: 6.8 CPU-s with them, 3.5 without)."""

    def start(self) -> None:
        env = {**os.environ, "PREFECT_HOME": str(self.root),
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
                  for name in self.IDLE_SERVICES}}
        env.pop("PREFECT_API_URL", None)
        from flows.prefect_db import seed_prefect_database

        seed_prefect_database(self.root, env)
        log = self.root / "server.log"
        port = self.api.rsplit(":", 1)[1].split("/")[0]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", port], env=env, stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"), start_new_session=True)  # noqa: SIM115
        wait_healthy(f"{self.api}/health", self.proc, log)

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
            self.proc = None


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (Debian's ``postgresql`` package puts them
    in ``/usr/lib/postgresql/VERSION/bin``), or None where it is not installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    import shutil

    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).resolve().parent if pg_ctl else None


class PostgresServer:
    """A PostgreSQL cluster of its own in a new temporary folder, on a free port of the
    loopback interface only, trusting local connections of user ``physai``; ``url(db)`` names
    a database of it that :meth:`create` made. PostgreSQL refuses to run as root: as root the
    folder belongs to the ``postgres`` user and the programs run as that user.

    The folder is not under pytest's (root's 0700 ``/tmp/pytest-of-root``), which the
    ``postgres`` user could not enter."""

    USER = "physai"

    def __init__(self) -> None:
        import tempfile

        bin_dir = postgres_bin()
        if bin_dir is None:
            raise FileNotFoundError("PostgreSQL (Debian's postgresql package: make postgres)")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="physai-pg-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True,
                              timeout=120, cwd=self.root)
        if done.returncode:
            raise RuntimeError(f"{args[0]}: {done.stdout[-1500:]}{done.stderr[-1500:]}")

    def start(self) -> None:
        if self.as_user:
            import shutil

            shutil.chown(self.root, "postgres", "postgres")
        data = self.root / "data"
        self._run(str(self.bin / "initdb"), "-D", str(data), "-A", "trust", "-U", self.USER,
                  "--no-sync", "--no-instructions", "-E", "UTF8")
        # Loopback only; no fsync, as for any database a test throws away.
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")

    def create(self, database: str) -> str:
        """Create ``database``; returns its ``postgresql://`` URL."""
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", self.USER, database)
        return self.url(database)

    def url(self, database: str, driver: str = "") -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{self.USER}@127.0.0.1:{self.port}/{database}"

    def query(self, database: str, sql: str) -> str:
        """What ``psql`` prints for ``sql`` in ``database``, unaligned, without headers."""
        done = subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER,
             "-d", database, "-A", "-t", "-c", sql], capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise RuntimeError(done.stderr[-1500:])
        return done.stdout.strip()

    def stop(self) -> None:
        import shutil

        if (self.root / "data" / "postmaster.pid").exists():
            subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D",
                            str(self.root / "data"), "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=60, cwd=self.root)
        shutil.rmtree(self.root, ignore_errors=True)


AWS_TEST = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}
"""moto's credentials."""


@dataclass(frozen=True)
class ClusterServers:
    """Prefect and MLflow as a cluster runs them (:func:`cluster_servers`)."""

    env: dict[str, str]
    """The environment ``flows`` ran ``server up`` in (AWS credentials for moto among it)."""
    mlflow: str
    """MLflow's URL."""
    postgres: PostgresServer
    s3: str
    """moto's S3 endpoint."""
    bucket: str


@contextmanager
def cluster_servers(env: dict[str, str], cwd: Path,
                    bucket: str = "physai-servers") -> Iterator[ClusterServers]:
    """``flows server up`` with Prefect and MLflow on a PostgreSQL of their own (databases
    ``prefect`` and ``mlflow``) and MLflow's artifacts in ``s3://BUCKET/mlflow`` on moto's
    server; ``flows server down`` after, which must stop both. Skips where PostgreSQL is not
    installed."""
    import boto3
    import pytest
    from moto.server import ThreadedMotoServer

    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (make postgres installs Debian's)")
    postgres = PostgresServer()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    s3.start()
    try:
        postgres.start()
        host, port = s3.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        postgres.create("prefect")
        env = {**env, **AWS_TEST, "MLFLOW_S3_ENDPOINT_URL": endpoint}
        up = run_flows("server", "up", "--prefect-port", str(free_port()), "--mlflow-port",
                       str(free_port()), "--prefect-database", postgres.url("prefect", "asyncpg"),
                       "--mlflow-database", postgres.create("mlflow"),
                       "--mlflow-artifacts", f"s3://{bucket}/mlflow", env=env, cwd=cwd,
                       timeout=300)
        if up.returncode != 0:
            raise RuntimeError(up.stdout + up.stderr)
        url = next(line.split()[1] for line in up.stdout.splitlines()
                   if line.startswith("mlflow"))
        try:
            yield ClusterServers(env, url, postgres, endpoint, bucket)
        finally:
            down = run_flows("server", "down", env=env, cwd=cwd, timeout=120)
            if "stopped: prefect, mlflow" not in down.stdout:
                raise RuntimeError(down.stdout + down.stderr)
    finally:
        s3.stop()
        postgres.stop()


def policy_manifest_fields(
    obs_mean: list[float], obs_std: list[float], act_dim: int, *, task: str = "test-v0",
    model_name: str = "test-policy",
) -> dict[str, Any]:
    """Every manifest field the package stage writes (but ``files``, ``format_version`` and
    ``engine``) for a policy with this normalizer, on Jetson AGX Orin at fp16, opset 17."""
    from edge.targets import get_target

    obs_dim = len(obs_mean)
    digest = "ab" * 32
    return {
        "task": task,
        "io": {
            "obs": {"name": "obs", "shape": ["batch", obs_dim], "dtype": "float32",
                    "names": [f"q{i}" for i in range(obs_dim)], "units": ["rad"] * obs_dim},
            "actions": {"name": "actions", "shape": ["batch", act_dim], "dtype": "float32",
                        "names": [f"j{i}" for i in range(act_dim)], "units": ["rad"] * act_dim,
                        "range": [-1.0, 1.0]},
        },
        "normalization": {"baked_into_model": True, "obs_mean": list(obs_mean),
                          "obs_std": list(obs_std)},
        "control_hz": 50.0,
        "latency_budget_ms": 20.0,
        "target": asdict(get_target("jetson-agx-orin")),
        "precision": "fp16",
        "opset": 17,
        "parity": {
            "dataset": {"samples": 64, "max_abs_diff": 1e-7, "mean_abs_diff": 1e-8,
                        "tolerance": 1e-5, "passed": True, "source": "dataset observations"},
            "ood": {"samples": 64, "max_abs_diff": 1e-6, "mean_abs_diff": 1e-7,
                    "tolerance": 1e-4, "passed": True},
        },
        "lineage": {"policy_digest": digest, "dataset_digest": None, "training": "bc",
                    "sim_report_digest": digest, "suite_digest": digest,
                    "code_revision": "test", "mlflow_model_name": model_name},
    }


def keypair(folder: Path, name: str = "signing") -> tuple[Path, Path]:
    """A fresh P-256 signing key pair as PEM files ``NAME.pem`` (mode 0600) and ``NAME.pub``."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                          ser.NoEncryption()))
    private.chmod(0o600)
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM,
                                                     ser.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def minari_zero_episodes(env: Any, act_dim: int, episodes: int = 2) -> Any:
    """A ``minari.DataCollector`` around ``env`` that has recorded ``episodes`` episodes of zero
    actions (seeds 0, 1, ...); the caller makes the dataset from it."""
    import minari
    import numpy as np

    collector = minari.DataCollector(env)
    for seed in range(episodes):
        collector.reset(seed=seed)
        done = False
        while not done:
            *_, terminated, truncated, _ = collector.step(np.zeros(act_dim, np.float32))
            done = terminated or truncated
    return collector


def version_made_of(tracking_uri: str, model: str, version: str = "1") -> dict[str, object]:
    """What ``version`` of ``model`` was made of: the digests of its dataset, policy and sim
    report, and its bundle's payload files (name -> sha256 and size; the bundle's own digest
    also covers its measured latency and a signature that differs at each signing)."""
    import json
    import tarfile

    from mlflow import MlflowClient

    tags = MlflowClient(tracking_uri, registry_uri=tracking_uri).get_model_version(
        model, version).tags
    made: dict[str, object] = {k: tags[f"physai.{k}.digest"]
                               for k in ("dataset", "policy", "sim_report")}
    with tarfile.open(tags["physai.bundle.uri"].removeprefix("file://")) as bundle:
        manifest = bundle.extractfile("manifest.json")
        if manifest is None:
            raise AssertionError(f"{model} v{version}: no manifest.json in its bundle")
        made["bundle files"] = json.loads(manifest.read())["files"]
    return made

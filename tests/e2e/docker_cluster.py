"""The Docker-pool cluster the container tests share: Prefect and MLflow servers on PostgreSQL
(MLflow's artifacts on moto's S3), ``flows deploy --docker``, podman serving the Docker API on a
socket and a Prefect Docker worker per pool (tests/e2e/test_docker_pools.py,
tests/e2e/test_docker_faults.py).

Skips, naming ``make images``, where podman, mmdebstrap or prefect-docker is missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ClusterServers, cluster_servers, run_flows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tests/fixtures/reach_tiny.yaml"
POOLS = ("dgx", "ovx", "jetson")

CliEnv = Callable[..., dict[str, str]]
Prepare = Callable[[ClusterServers], tuple[dict[str, str], Sequence[str]]]
"""Given the servers, the deploying environment and ``flows deploy`` options beyond
``--docker`` and ``--volume``."""


@dataclass(frozen=True)
class DockerCluster:
    """What :func:`docker_cluster` started."""

    env: dict[str, str]
    """The environment the pools were deployed and the workers started in."""
    images: dict[str, str]
    """The image each image environment's pools run (``physai``, ``jetson``)."""
    servers: ClusterServers
    logs: Path
    """The folder of the workers' logs."""

    def worker_logs(self) -> str:
        """The tail of every worker's log."""
        return "".join(p.read_text(errors="replace")[-2500:]
                       for p in self.logs.glob("worker-*.log"))


def skip_reason() -> str | None:
    """Why the cluster cannot start here, or None."""
    from flows.images import missing_tools

    missing = missing_tools()
    if missing:
        return f"{', '.join(missing)} not found: `make images` cannot build images here"
    try:
        import prefect_docker  # noqa: F401
    except ImportError:
        return "prefect-docker is not installed (the docker extra; make setup installs it)"
    return None


def stop(*procs: subprocess.Popen[bytes]) -> None:
    """SIGTERM every process group at once, then wait for each (SIGKILL after 30 s in all):
    the workers wind down side by side, not one after another."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def docker_cluster(tmp_path: Path, cli_env: CliEnv, prepare: Prepare | None = None
                   ) -> Iterator[DockerCluster]:
    """Servers on PostgreSQL and S3, Docker pools deployed (in the environment and with the
    options ``prepare`` gives), podman's Docker API and a worker per pool."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from flows.images import podman

    _build()
    home = tmp_path / ".physai"
    socket = tmp_path / "podman.sock"
    service = subprocess.Popen(
        [*podman(), "system", "service", "--time=0", f"unix://{socket}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "podman.log", "wb"),  # noqa: SIM115
        start_new_session=True)
    workers: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(stop, service)
        # Production's servers: Prefect and MLflow on PostgreSQL, MLflow's artifacts on S3.
        servers = stack.enter_context(cluster_servers(
            cli_env(home, shared_prefect=False, DOCKER_HOST=f"unix://{socket}",
                    PREFECT_WORKER_QUERY_SECONDS="1"), ROOT, "physai-docker"))
        stack.callback(lambda: stop(*workers))
        env, options = prepare(servers) if prepare else (servers.env, ())
        image, jetson = _deploy(env, options)
        for pool in POOLS:
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "worker", pool], cwd=ROOT, env=env,
                stdout=open(tmp_path / f"worker-{pool}.log", "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT, start_new_session=True))
        yield DockerCluster(env, {"physai": image, "jetson": jetson}, servers, tmp_path)


def _deploy(env: dict[str, str], options: Sequence[str], tries: int = 3) -> tuple[str, str]:
    """``flows deploy --docker``, again while the checkout changed between the deploy and the
    build after it (another hand editing or committing): the pools must name images that
    exist, the project's on dgx and ovx, the robot computer's stand-in on jetson."""
    tests = f"{ROOT / 'tests'}:/opt/physai-flows/tests:ro"
    for _ in range(tries):
        deploy = run_flows("deploy", "--docker", "--volume", tests, *options, CONFIG,
                           env=env, cwd=ROOT, timeout=300)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        image, jetson = _build()
        if deploy.stdout.count(f"docker ({image})") == 2 and f"docker ({jetson})" in deploy.stdout:
            return image, jetson
    raise AssertionError(f"the pools do not name {image} and {jetson}: {deploy.stdout}")


BUILD = """
from flows.images import build_image
print(build_image("physai")[0], build_image("jetson")[0])
"""


def _build() -> tuple[str, str]:
    """Build the project's image and the robot computer's stand-in from the checkout as it is
    now, in a process of their own (this one keeps the commit it read first); their names."""
    built = subprocess.run([sys.executable, "-c", BUILD], cwd=ROOT, capture_output=True,
                           text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    image, jetson = built.stdout.split()
    return image, jetson

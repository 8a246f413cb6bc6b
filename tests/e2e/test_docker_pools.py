"""A stage in its computer's container: Prefect and MLflow servers up, ``flows deploy --docker``
(Docker pools whose job template names the project's image), podman serving the Docker API on a
socket, a Docker worker for the ``dgx`` pool, then the collect stage of the tiny reach pipeline
run as a flow run of ``stage/dgx``: it runs in a container of the image, reaches both servers
over the host's network, publishes its dataset into the mounted state folder, and the
pipeline's MLflow run names the image it ran in.

Skips, naming ``make images``, where podman, mmdebstrap or prefect-docker is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import free_port, run_flows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tests/fixtures/reach_tiny.yaml"

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


def _skip_reason() -> str | None:
    from flows.images import missing_tools

    missing = missing_tools()
    if missing:
        return f"{', '.join(missing)} not found: `make images` cannot build images here"
    try:
        import prefect_docker  # noqa: F401
    except ImportError:
        return "prefect-docker is not installed (the docker extra; make setup installs it)"
    return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def docker_cluster(tmp_path: Path, cli_env: CliEnv) -> Iterator[tuple[dict[str, str], str]]:
    """Servers, Docker pools, podman's Docker API and a worker for ``dgx``; yields the
    environment and the image the pools run."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from flows.images import build_image, podman

    image = build_image("physai")[0]
    home = tmp_path / ".physai"
    socket = tmp_path / "podman.sock"
    env = cli_env(home, shared_prefect=False, DOCKER_HOST=f"unix://{socket}",
                  PREFECT_WORKER_QUERY_SECONDS="1")
    service = subprocess.Popen(
        [*podman(), "system", "service", "--time=0", f"unix://{socket}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "podman.log", "wb"),  # noqa: SIM115
        start_new_session=True)
    procs = [service]
    up = run_flows("server", "up", "--prefect-port", str(free_port()), "--mlflow-port",
                   str(free_port()), env=env, cwd=ROOT, timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        tests = f"{ROOT / 'tests'}:/opt/physai-flows/tests:ro"
        deploy = run_flows("deploy", "--docker", "--volume", tests, CONFIG, env=env, cwd=ROOT,
                           timeout=300)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        assert f"docker ({image})" in deploy.stdout, deploy.stdout
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "worker", "dgx"], cwd=ROOT, env=env,
            stdout=open(tmp_path / "worker.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True))
        yield env, image
    finally:
        for proc in reversed(procs):
            _stop(proc)
        run_flows("server", "down", env=env, cwd=ROOT, timeout=120)


def test_a_stage_runs_in_its_computers_container(
    docker_cluster: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, image = docker_cluster
    code = f"""
import json
from prefect.deployments import run_deployment
from flows.servers import prepare_environment
prepare_environment()
from stages.config import load_pipeline
from stages.context import open_services, start_pipeline
pipeline = load_pipeline({CONFIG!r})
run_id = start_pipeline(pipeline)
from stages.stage_table import stage_def
inputs = {{role: None for role in stage_def("collect").inputs}}
run = run_deployment("stage/dgx", parameters={{"config_path": {CONFIG!r}, "stage": "collect",
                     "run_id": run_id, "inputs": inputs}}, timeout=900, poll_interval=2)
out = run.state.result() if run.state.is_completed() else None
_, store, lineage = open_services()
tags = lineage.client.get_run(run_id).data.tags
digest = out["result"]["digest"] if out else None
print(json.dumps({{"state": run.state.name, "message": run.state.message,
                  "pool": run.work_pool_name, "digest": digest,
                  "stored": bool(digest) and store.has(digest),
                  "image": tags.get("physai.image.collect")}}))
"""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1000)
    took = time.monotonic() - start
    logs = (tmp_path / "worker.log").read_text(errors="replace")[-4000:]
    assert done.returncode == 0, done.stderr[-3000:] + logs
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state"] == "Completed", (out, logs)
    assert out["pool"] == "dgx" and out["stored"], out
    assert out["image"] == image, out
    print(f"\ncollect in a container of {image}: {took:.1f} s")

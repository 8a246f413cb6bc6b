"""Scale-out on this machine: servers up, deploy, one process worker per computer's pool, then a
triggered pipeline run whose every stage is a flow run executed by its own pool's worker.

The pipeline is the example plugin's task (examples/physai-pointmass, installed by make test):
every worker and stage flow run must load the plugin to resolve the config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import free_port, run_flows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tests/fixtures/pointmass_micro.yaml"
EXPECTED_POOL = {"collect": "dgx", "train": "dgx", "validate": "ovx", "package": "jetson",
                 "promote": "ovx"}

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


def flows(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_flows(*args, env=env, cwd=ROOT, timeout=300)


@pytest.fixture
def cluster(tmp_path: Path, cli_env: CliEnv) -> Iterator[tuple[dict[str, str], str]]:
    """Prefect and MLflow servers and a worker per pool, all under one PHYSAI_HOME; yields
    the environment and the MLflow server's URL."""
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    up = flows("server", "up", "--prefect-port", str(free_port()), "--mlflow-port",
               str(free_port()), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    mlflow_url = next(line.split()[1] for line in up.stdout.splitlines()
                      if line.startswith("mlflow"))
    workers: list[subprocess.Popen[bytes]] = []
    try:
        deploy = flows("deploy", "--project-dir", str(ROOT), CONFIG, env=env)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        # Each stage's flow run waits for its pool's worker to ask for work: every second,
        # not Prefect's default ten, so six runs one after another do not wait half a minute.
        polling = {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}
        for pool in ("dgx", "ovx", "jetson"):
            log = open(tmp_path / f"worker-{pool}.log", "wb")  # noqa: SIM115
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "worker", pool], cwd=ROOT, env=polling,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        yield env, mlflow_url
    finally:
        for proc in workers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        flows("server", "down", env=env)


def test_each_stage_runs_on_its_computers_pool(
    cluster: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, mlflow_url = cluster
    code = """
import json, sys
from prefect import get_client
from prefect.deployments import run_deployment
from flows.servers import prepare_environment
prepare_environment()
run = run_deployment("pipeline/pointmass_micro", timeout=600, poll_interval=2)
with get_client(sync_client=True) as client:
    children = client.read_flow_runs()
rows = [{"name": r.name, "pool": r.work_pool_name, "state": r.state.name,
          "parent": str(r.parent_task_run_id), "params": r.parameters} for r in children]
print(json.dumps({"state": run.state.name, "message": run.state.message, "runs": rows}))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=700)
    logs = "".join(p.read_text(errors="replace")[-1500:] for p in tmp_path.glob("worker-*.log"))
    assert done.returncode == 0, done.stderr[-3000:] + logs
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state"] == "Completed", (out, logs)
    stages = {r["params"]["stage"]: r for r in out["runs"] if "stage" in r["params"]}
    assert set(stages) == set(EXPECTED_POOL), out["runs"]
    for stage, pool in EXPECTED_POOL.items():
        assert stages[stage]["pool"] == pool, stages[stage]
        assert stages[stage]["state"] == "Completed"
    pipeline = [r for r in out["runs"] if r["params"].get("dispatch")]
    assert len(pipeline) == 1 and pipeline[0]["pool"] == "ovx"
    # Inputs crossed computers as digests only.
    assert set(stages["package"]["params"]["inputs"]) == {"policy", "report"}
    assert all(len(d) == 64 for d in stages["package"]["params"]["inputs"].values())

    from mlflow import MlflowClient

    client = MlflowClient(mlflow_url, registry_uri=mlflow_url)
    champion = client.get_model_version_by_alias("pointmass-micro", "champion")
    assert champion.tags["physai.gates_passed"] == "true"

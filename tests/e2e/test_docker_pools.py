"""Every stage in its computer's container: Prefect and MLflow servers up, ``flows deploy
--docker`` (Docker pools whose job templates name the project's image, and on ``jetson`` the
robot computer's stand-in), podman serving the Docker API on a socket, a Docker worker per pool,
then the tiny reach pipeline's deployment: the orchestrating flow and each stage run in
containers of their computers' images on their pools, reach both servers (on PostgreSQL,
MLflow's artifacts on moto's S3) over the host's network and share the mounted state folder;
the champion is promoted, the pipeline's MLflow run names the image of each stage, and the
dataset, policy, sim report and bundle files are the bytes the same pipeline makes in-process.

Skips, naming ``make images``, where podman, mmdebstrap or prefect-docker is missing
(the cluster: tests/e2e/docker_cluster.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.docker_cluster import CONFIG, DockerCluster, docker_cluster
from tests.support import run_flows

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_POOL = {"collect": "dgx", "train": "dgx", "validate": "ovx", "package": "jetson",
                 "promote": "ovx"}

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path, cli_env: CliEnv) -> Iterator[DockerCluster]:
    """Servers on PostgreSQL and S3, Docker pools, podman's Docker API and a worker per pool
    (:func:`tests.e2e.docker_cluster.docker_cluster`)."""
    with docker_cluster(tmp_path, cli_env) as started:
        yield started


def _made_of(tracking_uri: str) -> dict[str, object]:
    """What version 1 of ``reach-tiny`` was made of (:func:`tests.support.version_made_of`)."""
    from tests.support import version_made_of

    return version_made_of(tracking_uri, "reach-tiny")


def _trained(tracking_uri: str) -> tuple[str, str]:
    """The CPU threads torch trained version 1 of ``reach-tiny`` on (its train run's param)
    and the code revision its policy records."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    tags = client.get_model_version("reach-tiny", "1").tags
    params = client.get_run(tags["physai.train_run_id"]).data.params
    return params.get("torch_threads", "?"), tags["physai.code_revision"]


PIPELINE = """
from flows.servers import prepare_environment
prepare_environment()  # before Prefect's import, which reads its settings once
import json
import os
from mlflow import MlflowClient
from prefect import get_client
from prefect.deployments import run_deployment
run = run_deployment("pipeline/reach_tiny", timeout=1500, poll_interval=2)
with get_client(sync_client=True) as client:
    children = client.read_flow_runs()
rows = [{"pool": r.work_pool_name, "state": r.state.name, "params": r.parameters}
        for r in children]
url = os.environ["MLFLOW_TRACKING_URI"]
mlflow = MlflowClient(url, registry_uri=url)
champion = mlflow.get_model_version_by_alias("reach-tiny", "champion")
tags = mlflow.get_run(champion.tags["physai.pipeline_run_id"]).data.tags
print(json.dumps({"state": run.state.name, "message": run.state.message, "runs": rows,
                  "url": url, "gates": champion.tags.get("physai.gates_passed"),
                  "images": {k: v for k, v in tags.items() if k.startswith("physai.image.")}}))
"""


def test_the_pipeline_runs_each_stage_in_its_computers_container(
    cluster: DockerCluster, tmp_path: Path, cli_env: CliEnv
) -> None:
    env, images, servers = cluster.env, cluster.images, cluster.servers
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PIPELINE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1600)
    in_containers = time.monotonic() - start
    logs = cluster.worker_logs()
    assert done.returncode == 0, done.stderr[-3000:] + logs
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state"] == "Completed", (out["message"], logs)
    stages = {r["params"]["stage"]: r for r in out["runs"] if "stage" in r["params"]}
    assert {s: r["pool"] for s, r in stages.items()} == EXPECTED_POOL, out["runs"]
    assert all(r["state"] == "Completed" for r in stages.values()), out["runs"]
    assert out["gates"] == "true"
    # The lineage names the image each stage ran in: package in the robot computer's
    # stand-in, the others in the project's image.
    assert out["images"] == {f"physai.image.{s}": images["jetson" if p == "jetson" else "physai"]
                             for s, p in EXPECTED_POOL.items()}
    from flows.images import podman

    stand_in = subprocess.run([*podman(), "image", "inspect", "--format",
                               "{{index .Labels \"org.physai-flows.stand-in\"}}",
                               images["jetson"]], capture_output=True, text=True, check=True)
    assert "L4T" in stand_in.stdout and "no TensorRT" in stand_in.stdout
    # On production's servers: the version is a row of MLflow's PostgreSQL, the flow runs
    # rows of Prefect's, the policy an object on S3.
    assert servers.postgres.query("mlflow", "SELECT name, version FROM model_versions") \
        == "reach-tiny|1"
    assert int(servers.postgres.query("prefect", "SELECT count(*) FROM flow_run "
                                                 "WHERE state_type = 'COMPLETED'")) >= 6
    import boto3

    listed = boto3.client("s3", endpoint_url=servers.s3, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1"
                          ).list_objects_v2(Bucket=servers.bucket, Prefix="mlflow/")
    assert any(o["Key"].endswith("policy.onnx") for o in listed.get("Contents", [])), listed

    # The same pipeline in-process makes the same artifacts.
    here = tmp_path / "here"
    start = time.monotonic()
    proc = run_flows("run", CONFIG, env=cli_env(here), cwd=ROOT, timeout=900)
    in_process = time.monotonic() - start
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # Byte-identical: the dataset, the policy, the sim report and the bundle's files, though
    # the image's interpreter is Debian's Python 3.11.2 and the venv's pyenv's 3.11.7.
    containers, local = _made_of(out["url"]), _made_of(f"sqlite:///{here / 'mlflow.db'}")
    trained = _trained(out["url"]), _trained(f"sqlite:///{here / 'mlflow.db'}")
    assert containers == local, trained
    # Both name this checkout's commit: the image records the one it was built from.
    from stages.orchestration.context import code_revision

    assert trained[0][1] == trained[1][1] == code_revision(), trained
    print(f"\nreach-tiny: every stage in a container of {images}: {in_containers:.1f} s; "
          f"in-process: {in_process:.1f} s")

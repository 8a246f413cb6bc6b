"""Faults in containers: the tiny reach pipeline's deployment on Docker pools (every stage in its
computer's container, tests/e2e/docker_cluster.py) with its artifact store on S3 (moto's
server) and the containers' AWS credentials only as references to Prefect Secret blocks.

One pipeline run's train container SIGKILLs itself at its second epoch, the next run's validate
container at its first evaluated scene (:mod:`stages.core.crash`, the crash point given to the
pipeline run as a job variable, which reaches its stages' flow runs): each run fails and says
which stage's flow run crashed. A third run, without a crash, reuses what the killed runs
finished (collect, then train) and completes; its dataset, policy and sim report, read from
the store on S3 and MLflow's tags, have the digests of the same pipeline run in-process, and
its bundle's files are the same bytes.

Runs on request, ``PHYSAI_TEST_CONTAINER_FAULTS=1`` (about 6 minutes on 2 CPUs: the servers,
the images' checks, three container runs and the in-process run beside them); skips, naming
``make images``, where podman, mmdebstrap or prefect-docker is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.docker_cluster import CONFIG, DockerCluster, docker_cluster
from tests.support import ClusterServers, version_made_of

ROOT = Path(__file__).resolve().parents[2]
MODEL = "reach-tiny"
SECRETS = {"AWS_ACCESS_KEY_ID": ("aws-access-key-id", "physai-faults-key-id-5d1c"),
           "AWS_SECRET_ACCESS_KEY": ("aws-secret-access-key", "physai-faults-secret-83be")}
"""Variable -> (Secret block, value): values moto accepts and no template may hold."""
CRASHES = {"train": "train.epoch#2", "validate": "validate.scene_evaluated.nominal#1"}

ON_REQUEST = "PHYSAI_TEST_CONTAINER_FAULTS"

CliEnv = Callable[..., dict[str, str]]
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    os.environ.get(ON_REQUEST) != "1", reason=f"on request: {ON_REQUEST}=1 (about 6 minutes)")]

SAVE_SECRETS = """
from flows.servers import prepare_environment
prepare_environment()
import json, sys
from prefect.blocks.system import Secret
for block, value in json.loads(sys.argv[1]).items():
    Secret(value=value).save(block, overwrite=True)
"""

RUN = """
from flows.servers import prepare_environment
prepare_environment()  # before Prefect's import, which reads its settings once
import json
import sys
from prefect import get_client
from prefect.deployments import run_deployment
env = json.loads(sys.argv[1])
run = run_deployment("pipeline/reach_tiny", timeout=1500, poll_interval=2,
                     job_variables={"env": env})
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs()
    pools = {p.name: p.base_job_template for p in client.read_work_pools()}
    deployments = {d.name: d.job_variables for d in client.read_deployments()}
print(json.dumps({"state": run.state.name, "message": run.state.message, "id": str(run.id),
                  "runs": [{"id": str(r.id), "state": r.state.name,
                            "stage": r.parameters.get("stage")} for r in runs],
                  "pools": pools, "deployments": deployments}))
"""


def _python(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1600)


def _on_s3(servers: ClusterServers) -> tuple[dict[str, str], Sequence[str]]:
    """The store on moto's S3; the containers' credentials Secret blocks saved first."""
    saved = _python(SAVE_SECRETS, servers.env,
                    json.dumps({block: value for block, value in SECRETS.values()}))
    assert saved.returncode == 0, saved.stderr[-3000:]
    env = {**servers.env, "PHYSAI_STORE": f"s3://{servers.bucket}/store",
           "PHYSAI_S3_ENDPOINT_URL": servers.s3, "PHYSAI_WORKER_ENV": "AWS_DEFAULT_REGION"}
    options = [a for var, (block, _) in SECRETS.items() for a in ("--secret", f"{var}={block}")]
    return env, options


@pytest.fixture
def cluster(tmp_path: Path, cli_env: CliEnv) -> Iterator[DockerCluster]:
    """The Docker-pool cluster with its store on S3 and credentials by reference."""
    with docker_cluster(tmp_path, cli_env, _on_s3) as started:
        yield started


def _run(cluster: DockerCluster, seen: set[str], **env: str) -> dict[str, Any]:
    """One run of the pipeline's deployment with ``env`` as its job variable; its state and
    its stages' flow runs (stage -> state)."""
    done = _python(RUN, cluster.env, json.dumps(env))
    assert done.returncode == 0, done.stderr[-3000:] + cluster.worker_logs()
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    new = [r for r in out["runs"] if r["id"] not in seen and r["stage"]]
    seen.update(r["id"] for r in out["runs"])
    out["stages"] = {r["stage"]: r["state"] for r in new}
    return out


def _bundle_files(cluster: DockerCluster, uri: str) -> object:
    """The files a bundle on the S3 store lists in its manifest."""
    import boto3

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body = boto3.client("s3", endpoint_url=cluster.servers.s3, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1"
                        ).get_object(Bucket=bucket, Key=key)["Body"]
    with tarfile.open(fileobj=body, mode="r|*") as bundle:
        for member in bundle:
            if member.name == "manifest.json":
                manifest = bundle.extractfile(member)
                if manifest is not None:
                    return json.loads(manifest.read())["files"]
    raise AssertionError(f"{uri}: no manifest.json")


def test_killed_containers_resume_to_the_unkilled_digests(
    cluster: DockerCluster, tmp_path: Path, cli_env: CliEnv
) -> None:
    start = time.monotonic()
    # The same pipeline in-process, alongside: the digests an unkilled run makes.
    here = tmp_path / "here"
    local = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", CONFIG], cwd=ROOT,
                             env=cli_env(here), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    home = Path(cluster.env["PHYSAI_HOME"])
    seen: set[str] = set()
    for stage, point in CRASHES.items():
        trace = home / f"{stage}.trace"
        killed = _run(cluster, seen, PHYSAI_CRASH_AT=point, PHYSAI_CRASH_TRACE=str(trace))
        assert killed["state"] == "Failed", (killed["message"], cluster.worker_logs())
        assert f"stage {stage} on " in killed["message"], killed["message"]
        assert killed["stages"][stage] == "Crashed", killed["stages"]
        assert trace.read_text().split()[-1] == point, "killed at its crash point"
    trace = home / "final.trace"
    final = _run(cluster, seen, PHYSAI_CRASH_TRACE=str(trace))
    assert final["state"] == "Completed", (final["message"], cluster.worker_logs())
    assert all(s == "Completed" for s in final["stages"].values()), final["stages"]
    resumed = trace.read_text().split()
    # What the killed runs finished is reused, not made again.
    assert {"stage.collect.cached#1", "stage.train.cached#1"} <= set(resumed), resumed
    assert not any(p.startswith(("collect.batch", "train.epoch")) for p in resumed), resumed
    in_containers = time.monotonic() - start

    # No template or deployment holds a credential: the variables name Secret blocks.
    held = json.dumps([final["pools"], final["deployments"]])
    for var, (block, value) in SECRETS.items():
        assert value not in held, var
        for pool in ("dgx", "ovx", "jetson"):
            env = final["pools"][pool]["variables"]["properties"]["env"]["default"]
            assert env[var] == f"{{{{ prefect.blocks.secret.{block} }}}}", (pool, env)

    out, _ = local.communicate(timeout=900)
    assert local.returncode == 0, out[-4000:]
    url = cluster.servers.mlflow
    containers = version_made_of_s3(cluster, url)
    assert containers == version_made_of(f"sqlite:///{here / 'mlflow.db'}", MODEL)
    # The artifacts are objects of the store on S3, found by their digests.
    import boto3

    listed = boto3.client("s3", endpoint_url=cluster.servers.s3, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1"
                          ).list_objects_v2(Bucket=cluster.servers.bucket,
                                            Prefix="store/artifacts/")
    manifests = {o["Key"].rsplit("/", 1)[1].removesuffix(".json")
                 for o in listed.get("Contents", [])}
    assert {containers[k] for k in ("dataset", "policy", "sim_report")} <= manifests
    print(f"\nreach-tiny in containers on S3, killed in train and in validate, then resumed: "
          f"{in_containers:.1f} s; test {time.monotonic() - start:.1f} s")


def version_made_of_s3(cluster: DockerCluster, tracking_uri: str) -> dict[str, object]:
    """:func:`tests.support.version_made_of` for a version whose bundle is on the S3 store."""
    from mlflow import MlflowClient

    tags = MlflowClient(tracking_uri, registry_uri=tracking_uri).get_model_version(
        MODEL, "1").tags
    assert tags["physai.bundle.uri"].startswith(f"s3://{cluster.servers.bucket}/store/")
    made: dict[str, object] = {k: tags[f"physai.{k}.digest"]
                               for k in ("dataset", "policy", "sim_report")}
    made["bundle files"] = _bundle_files(cluster, tags["physai.bundle.uri"])
    return made

"""The reach pipeline with its artifact store and MLflow's artifacts on S3 behind injected faults.

One run keeps everything local (store folder, embedded MLflow); the other publishes to
``s3://physai-e2e/store`` and logs MLflow artifacts to ``s3://physai-e2e/mlflow``, both through
proxies that answer some requests with 5xx, drop connections, lose or truncate responses. Both
run at once. The S3 run must finish with the local run's digests and leave only whole,
verifiable objects; a store that refuses writes must fail the run at once and move no alias.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.conftest import STATE_VARS
from tests.s3_faults import FaultyS3Proxy
from tests.support import free_port, keypair, reach_tiny_config

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "reach_tiny.yaml"
MODEL = "reach-tiny"
BUCKET = "physai-e2e"
ROLES = ("dataset", "policy", "sim_report", "bundle")
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class S3Runs:
    """The local and the S3 run of the same config, and where their state lives."""

    local_home: Path
    s3_home: Path
    tracking_uri: str
    endpoint: str
    local: subprocess.CompletedProcess[str]
    s3: subprocess.CompletedProcess[str]
    store_requests: int
    store_faults: Counter[str]
    mlflow_faults: Counter[str]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server with the test bucket, AWS credentials set for this process."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for var, value in AWS.items():
            mp.setenv(var, value)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    server.stop()


@pytest.fixture(scope="module")
def store_proxy(s3_endpoint: str) -> Iterator[FaultyS3Proxy]:
    """The faulty endpoint the artifact store talks to."""
    with FaultyS3Proxy(s3_endpoint, seed=7, rate=0.12) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def s3_mlflow_server(
    s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, FaultyS3Proxy]]:
    """An ``mlflow server`` on SQLite whose artifacts go to ``s3://physai-e2e/mlflow`` through
    its own faulty proxy; yields its URL and that proxy."""
    root = tmp_path_factory.mktemp("mlflow-s3")
    port = free_port()
    with FaultyS3Proxy(s3_endpoint, seed=8, rate=0.12) as proxy:
        env = {**os.environ, **AWS, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
               "MLFLOW_S3_ENDPOINT_URL": proxy.url, "AWS_RETRY_MODE": "standard",
               "AWS_MAX_ATTEMPTS": "8"}
        from stages.tracking.schema_cache import seed_mlflow_database

        seed_mlflow_database(f"sqlite:///{root / 'mlflow.db'}", env)
        log = open(root / "server.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", f"s3://{BUCKET}/mlflow"],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()}")
            time.sleep(0.5)
        yield url, proxy
        server.terminate()
        server.wait(timeout=30)
        log.close()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def run_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STATE_VARS}
    return {**env, "PHYSAI_HOME": str(home), "COLUMNS": "200", **extra}


def s3_env(home: Path, proxy: FaultyS3Proxy, tracking_uri: str, **extra: str
           ) -> dict[str, str]:
    return run_env(home, **AWS, PHYSAI_STORE=f"s3://{BUCKET}/store",
                   PHYSAI_S3_ENDPOINT_URL=proxy.url, MLFLOW_TRACKING_URI=tracking_uri, **extra)


def start_run(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(config)],
                                cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                                text=True)


def finish(proc: subprocess.Popen[str], log: Path) -> subprocess.CompletedProcess[str]:
    try:
        proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, log.read_text(), "")


@pytest.fixture(scope="module")
def runs(
    s3_endpoint: str, store_proxy: FaultyS3Proxy,
    s3_mlflow_server: tuple[str, FaultyS3Proxy], shared_prefect_api: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> S3Runs:
    tracking_uri, mlflow_proxy = s3_mlflow_server
    work = tmp_path_factory.mktemp("s3-pipeline")
    local_home, s3_home = work / "local" / ".physai", work / "s3" / ".physai"
    local_log, s3_log = work / "local" / "run.log", work / "s3" / "run.log"
    # No temporary server a run; one signing key for both, as a team's packaging workers
    # share one (each state folder would otherwise make a project key of its own).
    prefect = {"PREFECT_API_URL": shared_prefect_api,
               "PHYSAI_SIGNING_KEY": str(keypair(work, "signing")[0])}
    # The tiny pipeline filming a rollout per scene: its videos go to S3 too.
    config = reach_tiny_config(work / "reach_tiny.yaml", validate={"video_episodes": 1})
    local = start_run(config, run_env(local_home, **prefect), local_log)
    s3 = start_run(config, s3_env(s3_home, store_proxy, tracking_uri, **prefect), s3_log)
    done_local, done_s3 = finish(local, local_log), finish(s3, s3_log)
    assert done_local.returncode == 0, done_local.stdout[-4000:]
    assert done_s3.returncode == 0, done_s3.stdout[-4000:]
    return S3Runs(local_home, s3_home, tracking_uri, s3_endpoint, done_local, done_s3,
                  store_proxy.requests, Counter(store_proxy.faults), Counter(mlflow_proxy.faults))


def direct(endpoint: str) -> S3Client:
    """A client that talks to moto itself, not through a proxy."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def keys(endpoint: str, prefix: str) -> list[str]:
    pages = direct(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                       Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def champion_tags(tracking_uri: str) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    return dict(client.get_model_version_by_alias(MODEL, "champion").tags)


def test_s3_run_completes_through_injected_faults(runs: S3Runs) -> None:
    assert f"models:/{MODEL}/1 -> @champion" in runs.s3.stdout
    assert runs.store_faults.total() >= 5, runs.store_faults
    assert len(runs.store_faults) >= 3, f"several kinds of fault: {runs.store_faults}"
    assert runs.mlflow_faults.total() >= 1, runs.mlflow_faults
    print(f"\nfaults injected: store {dict(runs.store_faults)} in {runs.store_requests} requests,"
          f" mlflow {dict(runs.mlflow_faults)}")


def test_digests_match_the_local_run(runs: S3Runs) -> None:
    local = champion_tags(f"sqlite:///{runs.local_home / 'mlflow.db'}")
    remote = champion_tags(runs.tracking_uri)
    for role in ROLES:
        assert remote[f"physai.{role}.digest"] == local[f"physai.{role}.digest"], role
    local_manifests = {p.stem for p in (runs.local_home / "store" / "artifacts").glob("*.json")}
    s3_manifests = {k.rsplit("/", 1)[1].removesuffix(".json")
                    for k in keys(runs.endpoint, "store/artifacts/")}
    assert s3_manifests == local_manifests
    assert {local[f"physai.{role}.digest"] for role in ROLES} <= s3_manifests


def test_every_object_on_s3_is_whole_and_verified(runs: S3Runs) -> None:
    from stages.artifacts.records import ARTIFACT_ADAPTER

    client = direct(runs.endpoint)
    stored = keys(runs.endpoint, "store/")
    objects = {k for k in stored if k.startswith("store/objects/")}
    manifests = [k for k in stored if k.startswith("store/artifacts/")]
    assert objects and manifests
    assert set(stored) == objects | set(manifests), "only objects and manifests in the store"
    for key in objects:
        _, _, shard, digest = key.split("/")
        data = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert hashlib.sha256(data).hexdigest() == digest and shard == digest[:2], key
    for key in manifests:
        digest = key.rsplit("/", 1)[1].removesuffix(".json")
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        artifact = ARTIFACT_ADAPTER.validate_json(body)
        assert artifact.digest == digest
        assert f"store/objects/{digest[:2]}/{digest}" in objects, f"{key} has no payload"
        assert artifact.uri == f"s3://{BUCKET}/store/objects/{digest[:2]}/{digest}"


def test_mlflow_artifacts_live_on_s3(runs: S3Runs) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(runs.tracking_uri, registry_uri=runs.tracking_uri)
    tags = champion_tags(runs.tracking_uri)
    run_id = tags["physai.validate_run_id"]
    logged = {f.path for f in client.list_artifacts(run_id)}
    assert {"sim_report.json", "success_rates.png", "videos"} <= logged
    on_s3 = keys(runs.endpoint, "mlflow/")
    assert any(k.endswith(f"/{run_id}/artifacts/sim_report.json") for k in on_s3), on_s3[:20]
    model_id = str(client.get_model_version_by_alias(MODEL, "champion").source)[len("models:/"):]
    assert any(f"/models/{model_id}/artifacts/" in k for k in on_s3), on_s3[:20]


def test_store_that_refuses_writes_fails_the_run_and_moves_no_alias(
    runs: S3Runs, store_proxy: FaultyS3Proxy, shared_prefect_api: str, tmp_path: Path
) -> None:
    """A permanent refusal is not retried: the run stops at the first publish with one clear
    line naming the object, writes no manifest and leaves @champion where it was."""
    data = yaml.safe_load(CONFIG.read_text())
    data["seed"] = 1
    data["collect"]["scene"] = str(ROOT / "sim_scenes" / "reach" / "collect.yaml")
    data["validate"]["suite"] = str(ROOT / "tests" / "fixtures" / "suite_tiny.yaml")
    config = tmp_path / "reach_seed1.yaml"
    config.write_text(yaml.safe_dump(data))
    before, champion = keys(runs.endpoint, "store/"), champion_tags(runs.tracking_uri)
    store_proxy.deny, store_proxy.rate = r"^(PUT|POST) ", 0.0
    log = tmp_path / "run" / "run.log"
    start = time.monotonic()
    try:
        env = s3_env(runs.s3_home, store_proxy, runs.tracking_uri,
                     PREFECT_API_URL=shared_prefect_api)
        done = finish(start_run(config, env, log), log)
    finally:
        store_proxy.deny = None
    seconds = time.monotonic() - start
    assert done.returncode != 0
    errors = [line for line in done.stdout.splitlines() if line.startswith("flows: error:")]
    assert len(errors) == 1, done.stdout[-3000:]
    assert re.search(rf"s3://{BUCKET}/store/objects/\S+: upload refused: AccessDenied",
                     errors[0]), errors[0]
    assert store_proxy.faults["403"] == 1, "a refusal is not retried"
    assert keys(runs.endpoint, "store/") == before
    assert champion_tags(runs.tracking_uri) == champion
    from mlflow import MlflowClient

    client = MlflowClient(runs.tracking_uri, registry_uri=runs.tracking_uri)
    assert [v.version for v in client.search_model_versions(f"name='{MODEL}'")] == ["1"]
    assert seconds < 120


def _flows(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_bundle_pull_from_s3_from_a_local_store_and_from_mlflow_alone(
    runs: S3Runs, tmp_path: Path
) -> None:
    champion = f"models:/{MODEL}@champion"
    digest = champion_tags(runs.tracking_uri)["physai.bundle.digest"]
    signing_public = runs.local_home.parents[1] / "signing.pub"  # the runs' PHYSAI_SIGNING_KEY
    empty_store = tmp_path / "empty-store"
    empty_store.mkdir()
    sources = {
        "s3": (run_env(runs.s3_home, **AWS, PHYSAI_STORE=f"s3://{BUCKET}/store",
                       PHYSAI_S3_ENDPOINT_URL=runs.endpoint,
                       MLFLOW_TRACKING_URI=runs.tracking_uri), "from the store (s3://"),
        "local": (run_env(runs.local_home), "from the store ("),
        "mlflow": (run_env(runs.local_home, PHYSAI_STORE=str(empty_store)), "from MLflow ("),
    }
    for name, (env, said) in sources.items():
        out = tmp_path / f"{name}.tar"
        pulled = _flows(env, tmp_path, "bundle", "pull", champion, "-o", str(out))
        assert pulled.returncode == 0, (name, pulled.stderr[-2000:])
        assert said in pulled.stdout and digest in pulled.stdout, (name, pulled.stdout)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == digest, name
        verified = _flows(env, tmp_path, "bundle", "verify", str(out), "--against", champion,
                          "--trust", str(signing_public))
        assert verified.returncode == 0, (name, verified.stderr[-2000:])
        assert f"registered: this file is the bundle of {champion}" in verified.stdout
    assert not list(empty_store.iterdir()), "pulling from MLflow wrote into the store"

    env = sources["local"][0]
    other = tmp_path / "other.tar"
    other.write_bytes((tmp_path / "local.tar").read_bytes() + b"\0" * 512)
    refused = _flows(env, tmp_path, "bundle", "verify", str(other), "--against", champion)
    assert refused.returncode == 2 and f"is not the bundle of {champion}" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    trust = tmp_path / "trust.pub"
    trust.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    foreign = _flows(env, tmp_path, "bundle", "pull", champion, "-o",
                     str(tmp_path / "trusted.tar"), "--trust", str(trust))
    assert foreign.returncode == 2 and "signed by another key" in foreign.stderr, foreign.stderr
    assert not (tmp_path / "trusted.tar").exists(), "a refused pull wrote its file"

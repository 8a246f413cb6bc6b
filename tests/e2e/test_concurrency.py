"""Four pipelines at once, two on each of two configs, against one Prefect and one MLflow server
as a cluster runs them (both on PostgreSQL, MLflow's artifacts on S3: moto's server) and one
store: every run succeeds, the store stays verifiable, each config's artifacts exist once, each
bundle is registered once, each model has one champion, and all of it is in PostgreSQL and on
S3, none in the state folder.

Ten concurrent promotions are in tests/stages/test_registry.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.support import ClusterServers, cluster_servers

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
MODEL = "reach-crash"
MODEL_B = "reach-crash-b"

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


BUCKET = "physai-concurrency"


def _s3(endpoint: str) -> S3Client:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


@pytest.fixture
def servers(tmp_path: Path, cli_env: CliEnv) -> Iterator[ClusterServers]:
    """``flows server up`` with Prefect and MLflow on a PostgreSQL of the test's own and
    MLflow's artifacts on moto's S3 server."""
    home = tmp_path / ".physai"
    with cluster_servers(cli_env(home, shared_prefect=False), tmp_path, BUCKET) as servers:
        # The databases' addresses travel in the servers' environment, not on their command
        # lines, which every user of the machine can read.
        record = (home / "servers.json").read_text()
        assert "postgresql" not in record and f"s3://{BUCKET}" not in record, record
        yield servers


def _second_config(folder: Path) -> Path:
    """The micro config under another name, model and seed: a second pipeline sharing the
    experiment-free parts (collect scene, suite) with the first."""
    data = yaml.safe_load(CONFIG.read_text())
    data["name"], data["seed"] = "reach-crash-b", 1
    data["promote"]["model_name"] = MODEL_B
    data["collect"]["scene"] = str(ROOT / "sim_scenes" / "reach" / "collect.yaml")
    data["validate"]["suite"] = str(CONFIG.parent / data["validate"]["suite"])
    path = folder / "second.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_four_pipelines_on_two_configs_at_once(servers: ClusterServers, tmp_path: Path
                                               ) -> None:
    env, url = servers.env, servers.mlflow
    configs = [CONFIG, _second_config(tmp_path)]
    runs = [subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(config)],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for config in configs for _ in range(2)]
    outputs = [run.communicate(timeout=900) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out[-2000:] + err[-2000:]

    from mlflow import MlflowClient

    from stages.storage.store import LocalStore

    store = LocalStore(tmp_path / ".physai" / "store")
    kinds: dict[str, set[str]] = {}
    for manifest in sorted((store.path / "artifacts").glob("*.json")):
        artifact = store.get(manifest.stem)
        store.open_payload(artifact)  # verifies the digest
        kinds.setdefault(json.loads(manifest.read_text())["kind"], set()).add(manifest.stem)
    for kind in ("dataset", "policy", "sim_report", "edge_bundle"):
        assert len(kinds[kind]) == 2, (kind, kinds[kind])
    assert not list(store.path.rglob(".tmp-*"))

    client = MlflowClient(url, registry_uri=url)
    for model in (MODEL, MODEL_B):
        versions = client.search_model_versions(f"name = '{model}'")
        assert [str(v.version) for v in versions] == ["1"], model
        assert str(client.get_model_version_by_alias(model, "champion").version) == "1"
        history = json.loads(client.get_registered_model(model).tags["physai.champion.history"])
        assert [(e["event"], e["version"]) for e in history] == [("promote", "1")]
    assert not [m for m in client.search_registered_models() if m.name.startswith("physai-")]

    # All of it in PostgreSQL and on S3, nothing in the state folder's databases.
    pg = servers.postgres
    assert pg.query("mlflow", "SELECT name, version FROM model_versions ORDER BY name") \
        == f"{MODEL}|1\n{MODEL_B}|1"
    assert pg.query("prefect", "SELECT count(*) FROM flow_run WHERE state_type = 'COMPLETED' "
                               "AND parent_task_run_id IS NULL") == "4"
    home = tmp_path / ".physai"
    assert not list(home.rglob("*.db")), list(home.rglob("*.db"))
    listed = _s3(servers.s3).list_objects_v2(Bucket=BUCKET, Prefix="mlflow/")
    onnx = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith("policy.onnx")]
    # Each run's trained policy, under its config's experiment. Two runs of one config race to
    # create its experiment: the loser reuses the winner's, and PostgreSQL's id sequence may
    # skip the number the loser drew, so the ids are read back by name, not assumed.
    # (The configs' names, "reach-crash" and "reach-crash-b", name their experiments.)
    experiments = sorted(client.get_experiment(key.split("/")[1]).name for key in onnx)
    assert experiments == ["reach-crash", "reach-crash", "reach-crash-b", "reach-crash-b"], onnx

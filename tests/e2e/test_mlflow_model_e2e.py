"""`flows run` promotes a version that MLflow's own tools load and serve: against a real
``mlflow server`` on SQLite, ``mlflow.pyfunc.load_model("models:/NAME@champion")`` and
``mlflow.onnx.load_model`` read it, its actions match ONNX Runtime on the bundle's network,
``mlflow models serve --env-manager local`` answers ``/invocations`` with the same actions, the
description holds the gate table and the logged model the per-scene rates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

from tests.conftest import STATE_VARS
from tests.support import free_port, run_flows, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
MODEL = "reach-crash"
SERVE_SECONDS = 120
"""Longest wait for ``mlflow models serve`` to answer ``/ping``."""

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Promoted:
    tracking_uri: str
    home: Path
    stdout: str
    work: Path


@pytest.fixture(scope="module")
def promoted(
    mlflow_server: str, shared_prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> Promoted:
    """One `flows run` of the micro reach pipeline reporting to the module's MLflow server (and
    the session's Prefect server, so no temporary one is started)."""
    work = tmp_path_factory.mktemp("mlflow-model-e2e")
    env = {k: v for k, v in os.environ.items() if k not in STATE_VARS}
    env |= {"PHYSAI_HOME": str(work / ".physai"), "MLFLOW_TRACKING_URI": mlflow_server,
            "PREFECT_API_URL": shared_prefect_api, "COLUMNS": "200"}
    run = run_flows("run", str(CONFIG), env=env, cwd=work)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return Promoted(mlflow_server, work / ".physai", run.stdout, work)


def champion(p: Promoted) -> tuple[MlflowClient, ModelVersion]:
    """A client of the test's server and the ``@champion`` version."""
    from mlflow import MlflowClient

    client = MlflowClient(p.tracking_uri, registry_uri=p.tracking_uri)
    return client, client.get_model_version_by_alias(MODEL, "champion")


def bundle_network(p: Promoted, tmp: Path) -> tuple[Path, np.ndarray]:
    """The champion bundle's ``policy.onnx`` (from the store) and its calibration observations."""
    from edge.bundle import unpack_bundle
    from stages.storage.store import LocalStore

    _, mv = champion(p)
    store = LocalStore(p.home / "store")
    unpack_bundle(store.open_payload(store.get(mv.tags["physai.bundle.digest"])), tmp / "b")
    return tmp / "b" / "policy.onnx", np.load(tmp / "b" / "calibration" / "obs.npy")


def test_pyfunc_serve_and_onnx_flavor_match_onnx_runtime(
    promoted: Promoted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    import mlflow.onnx
    import onnxruntime as ort

    assert f"models:/{MODEL}/1 -> @champion" in promoted.stdout
    onnx_path, obs = bundle_network(promoted, tmp_path)
    obs = obs[:32].astype(np.float32)
    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(
        ["actions"], {"obs": obs})[0]
    mlflow.set_tracking_uri(promoted.tracking_uri)
    mlflow.set_registry_uri(promoted.tracking_uri)  # not one an earlier in-process run left
    uri = f"models:/{MODEL}@champion"
    got = mlflow.pyfunc.load_model(uri).predict(obs)["actions"]
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6
    proto = mlflow.onnx.load_model(uri)
    assert ([i.name for i in proto.graph.input], [o.name for o in proto.graph.output]) == (
        ["obs"], ["actions"])

    port = free_port()
    log = tmp_path / "serve.log"
    # The server runs ``uvicorn`` from PATH, as in an activated venv.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_TRACKING_URI": promoted.tracking_uri, "PATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
        start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/ping", proc, log, timeout=SERVE_SECONDS)
        body = json.dumps({"inputs": {"obs": obs.tolist()}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            answer = json.load(r)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    served = np.asarray(answer["predictions"]["actions"], dtype=np.float32)
    assert served.shape == want.shape and np.abs(served - want).max() <= 1e-6


def test_description_metrics_and_experiment_kind(promoted: Promoted) -> None:
    from stages.artifacts.records import EdgeBundle, SimReport
    from stages.storage.store import LocalStore

    client, mv = champion(promoted)
    store = LocalStore(promoted.home / "store")
    report = store.get(mv.tags["physai.sim_report.digest"])
    bundle = store.get(mv.tags["physai.bundle.digest"])
    assert isinstance(report, SimReport) and isinstance(bundle, EdgeBundle)
    lines = str(mv.description).splitlines()
    assert lines[0].startswith(f"**Gates passed** - suite `{report.suite}`")
    rows = [line for line in lines if line.endswith(("| pass |", "| **FAIL** |"))]
    gates = (*report.gates, *bundle.gates)
    assert len(rows) == len(gates) >= 3
    for gate in gates:
        assert any(row.startswith(f"| {gate.name}") and row.endswith("| pass |")
                   for row in rows), (gate.name, rows)
    logged = client.get_logged_model(str(mv.source).removeprefix("models:/"))
    metrics = {m.key: m.value for m in logged.metrics or []}
    assert metrics == pytest.approx({
        f"{s.scene}/{stat}": getattr(s, stat) for s in report.scenes
        for stat in ("success_rate", "ci_low", "ci_high")})
    experiment = client.get_experiment(client.get_run(str(mv.run_id)).info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    lineage = run_flows("lineage", f"models:/{MODEL}@champion",
                        env={**os.environ, "PHYSAI_HOME": str(promoted.home),
                             "MLFLOW_TRACKING_URI": promoted.tracking_uri, "COLUMNS": "200"},
                        cwd=promoted.work)
    assert lineage.returncode == 0, lineage.stdout + lineage.stderr
    assert bundle.digest[:12] in lineage.stdout


"""`flows server up`: real Prefect and MLflow servers that `flows run` then reports to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import free_port

CliEnv = Callable[..., dict[str, str]]

pytestmark = pytest.mark.e2e


def test_run_reports_to_servers_started_by_flows_server_up(
    tmp_path: Path, tiny_config: Callable[..., Path], cli_env: CliEnv
) -> None:
    tiny_config(validate={"video_episodes": 0})
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    prefect_port, mlflow_port = free_port(), free_port()

    def flows(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)

    up = flows("server", "up", "--prefect-port", str(prefect_port),
               "--mlflow-port", str(mlflow_port))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"http://127.0.0.1:{prefect_port}" in up.stdout
        run = flows("run", "pipeline.yaml")
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:]
        assert "Starting temporary server" not in out
        assert f"MLflow run: http://127.0.0.1:{mlflow_port}/" in out

        request = urllib.request.Request(
            f"http://127.0.0.1:{prefect_port}/api/flow_runs/filter", data=b"{}",
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            flow_runs = json.load(r)
        assert [f["state_type"] for f in flow_runs] == ["COMPLETED"]
        from mlflow import MlflowClient

        uri = f"http://127.0.0.1:{mlflow_port}"
        mv = MlflowClient(uri, registry_uri=uri).get_model_version_by_alias("reach-tiny",
                                                                             "champion")
        assert mv.version == "1"
        pids = [s["pid"] for s in json.loads((tmp_path / ".physai" / "servers.json").read_text())]
    finally:
        down = flows("server", "down")
    assert down.returncode == 0 and "stopped: prefect, mlflow" in down.stdout
    assert not (tmp_path / ".physai" / "servers.json").exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(("args", "says"), [
    (("--prefect-database", "mysql://ops:hunter2@db/prefect"),
     "--prefect-database: not a database Prefect's server runs on"),
    (("--mlflow-database", "redis://ops:hunter2@db/0"),
     "--mlflow-database: not a database MLflow runs on"),
    (("--mlflow-database", "postgresql+nodriver://ops:hunter2@db/mlflow"),
     "MLflow reaches PostgreSQL through nodriver, which is not installed"),
    (("--mlflow-artifacts", "relative/folder"),
     "--mlflow-artifacts: neither a URL (s3://BUCKET/PREFIX) nor an absolute folder"),
])
def test_server_up_refuses_a_store_it_cannot_run_on_in_one_line(
    tmp_path: Path, cli_env: CliEnv, args: tuple[str, str], says: str
) -> None:
    home = tmp_path / ".physai"
    up = subprocess.run([sys.executable, "-m", "flows.cli", "server", "up", *args], cwd=tmp_path,
                        env=cli_env(home, shared_prefect=False), capture_output=True, text=True,
                        timeout=120)
    assert up.returncode == 2, up.stdout + up.stderr
    assert up.stderr.count("\n") == 1 and says in up.stderr, up.stderr
    assert "hunter2" not in up.stderr and "ops" not in up.stderr  # no user or password shown
    assert not home.exists()  # nothing written

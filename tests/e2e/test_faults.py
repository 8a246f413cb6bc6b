"""Injected faults on a real run: MLflow stopped for a while, and the store's disk full.

S3 5xx answers and dropped connections are injected in tests/e2e/test_s3_pipeline.py and
tests/stages/test_store.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import MlflowServer, run_flows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
MODEL = "reach-crash"
DOWN_S = 8.0

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


@pytest.fixture
def mlflow(tmp_path: Path) -> Iterator[MlflowServer]:
    root = tmp_path / "mlflow"
    root.mkdir()
    server = MlflowServer(root)
    server.start()
    yield server
    server.stop()


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_flows(*args, env=env, cwd=cwd, timeout=600)


def _digests(store: Path) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for manifest in (store / "artifacts").glob("*.json"):
        kind = json.loads(manifest.read_text())["kind"]
        if kind in ("dataset", "policy", "sim_report"):
            kinds[kind] = manifest.stem
    return kinds


def test_mlflow_down_for_a_while_is_ridden_out_with_the_same_digests(
    mlflow: MlflowServer, tmp_path: Path, cli_env: CliEnv
) -> None:
    local = cli_env(tmp_path / "local" / ".physai")
    (tmp_path / "local").mkdir()
    baseline = flows("run", str(CONFIG), env=local, cwd=tmp_path / "local")
    assert baseline.returncode == 0, baseline.stderr[-2000:]

    trace = tmp_path / "trace.txt"
    env = cli_env(tmp_path / "remote" / ".physai", MLFLOW_TRACKING_URI=mlflow.url,
                  PHYSAI_CRASH_TRACE=str(trace))
    (tmp_path / "remote").mkdir()
    outage: dict[str, float] = {}

    def take_down_after_training() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if trace.is_file() and "stage.train.completed" in trace.read_text():
                outage["start"] = time.monotonic()
                mlflow.stop()
                time.sleep(DOWN_S)
                mlflow.start()
                outage["end"] = time.monotonic()
                return
            time.sleep(0.05)

    saboteur = threading.Thread(target=take_down_after_training)
    saboteur.start()
    run = flows("run", str(CONFIG), env=env, cwd=tmp_path / "remote")
    finished = time.monotonic()
    saboteur.join()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert outage["end"] - outage["start"] >= DOWN_S
    # The outage began as training ended, so the validate stage's first MLflow calls met it.
    after = trace.read_text().split("stage.train.completed", 1)[1]
    assert "mlflow.run_created.validate" in after and finished > outage["end"]
    assert f"models:/{MODEL}/1 -> @champion" in run.stdout
    assert _digests(tmp_path / "remote" / ".physai" / "store") == _digests(
        tmp_path / "local" / ".physai" / "store")


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, check=False)
    return done.returncode == 0


def test_full_disk_fails_the_stage_with_one_line_and_leaves_nothing_half_written(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    store = tmp_path / "small-disk"
    if not _mount_tmpfs(store, "48k"):
        pytest.skip("needs root to mount a small tmpfs as a full disk")
    try:
        home = tmp_path / ".physai"
        env = cli_env(home, PHYSAI_STORE=str(store))
        run = flows("run", str(CONFIG), env=env, cwd=tmp_path)
        assert run.returncode != 0
        errors = [line for line in run.stderr.splitlines() if line.startswith("flows: error:")]
        assert len(errors) == 1, run.stderr[-3000:]
        assert "cannot write to the store: No space left on device" in errors[0]
        assert str(store) in errors[0]
        assert "Traceback" not in run.stderr.split("flows: error:")[-1]
        leftovers = [p for p in store.rglob("*") if p.is_file()]
        manifests = list(store.glob("artifacts/*.json"))
        assert manifests == [] and not [p for p in leftovers if p.name.startswith(".tmp-")]
        from mlflow import MlflowClient

        uri = f"sqlite:///{home / 'mlflow.db'}"
        assert MlflowClient(uri, registry_uri=uri).search_registered_models() == []
    finally:
        subprocess.run(["umount", str(store)], check=False)

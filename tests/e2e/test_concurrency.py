"""Two pipelines on one config at once, against one Prefect and one MLflow server and one store:
the store stays verifiable, the bundle is registered once, and there is one champion.

Ten concurrent promotions are in tests/stages/test_registry.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import free_port, run_flows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
MODEL = "reach-crash"

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


@pytest.fixture
def servers(tmp_path: Path, cli_env: CliEnv) -> Iterator[tuple[dict[str, str], str]]:
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    up = run_flows("server", "up", "--prefect-port", str(free_port()), "--mlflow-port",
               str(free_port()), env=env, cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    url = next(line.split()[1] for line in up.stdout.splitlines() if line.startswith("mlflow"))
    try:
        yield env, url
    finally:
        run_flows("server", "down", env=env, cwd=tmp_path)


def test_two_pipelines_on_one_config_at_once(
    servers: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, url = servers
    runs = [subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(CONFIG)],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out[-2000:] + err[-2000:]

    from mlflow import MlflowClient

    from stages.store import LocalStore

    store = LocalStore(tmp_path / ".physai" / "store")
    kinds: dict[str, set[str]] = {}
    for manifest in sorted((store.path / "artifacts").glob("*.json")):
        artifact = store.get(manifest.stem)
        store.open_payload(artifact)  # verifies the digest
        kinds.setdefault(json.loads(manifest.read_text())["kind"], set()).add(manifest.stem)
    for kind in ("dataset", "policy", "sim_report", "edge_bundle"):
        assert len(kinds[kind]) == 1, (kind, kinds[kind])
    assert not list(store.path.rglob(".tmp-*"))

    client = MlflowClient(url, registry_uri=url)
    versions = client.search_model_versions(f"name = '{MODEL}'")
    assert [str(v.version) for v in versions] == ["1"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"
    model = client.get_registered_model(MODEL)
    history = json.loads(model.tags["physai.champion.history"])
    assert [(e["event"], e["version"]) for e in history] == [("promote", "1")]
    assert not [m for m in client.search_registered_models() if m.name.startswith("physai-")]

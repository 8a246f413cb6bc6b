"""Four pipelines at once, two on each of two configs, against one Prefect and one MLflow server
and one store: every run succeeds, the store stays verifiable, each config's artifacts exist
once, each bundle is registered once, and each model has one champion.

Ten concurrent promotions are in tests/stages/test_registry.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import free_port, run_flows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
MODEL = "reach-crash"
MODEL_B = "reach-crash-b"

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


def test_four_pipelines_on_two_configs_at_once(
    servers: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, url = servers
    configs = [CONFIG, _second_config(tmp_path)]
    runs = [subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(config)],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for config in configs for _ in range(2)]
    outputs = [run.communicate(timeout=900) for run in runs]
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

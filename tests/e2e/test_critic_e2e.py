"""The Cosmos critic through ``flows run``: a config's ``validate.critic`` sends each filmed
scene to a Cosmos Reason endpoint, here a local STAND-IN of one (tests/cosmos_standin.py; no
machine here runs the model), and its gate holds a policy back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CliEnv, TinyConfig
from tests.cosmos_standin import serve_in_thread
from tests.support import run_flows

pytestmark = pytest.mark.e2e
SECRET = "nvapi-critic-key-that-must-never-be-written"


def test_verdicts_reach_report_and_mlflow_and_the_critic_gate_holds_promotion(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    from stages.storage.store import LocalStore

    pytest.importorskip("av")
    log = tmp_path / "requests.jsonl"
    server, url = serve_in_thread("fail-scene:heavy_payload", log)
    try:
        config = tiny_config(validate={"video_episodes": 1, "critic": {
            "url": url, "model": "nvidia/cosmos-reason2-8b", "min_pass_rate": 0.9}})
        home = tmp_path / ".physai"
        done = run_flows("run", str(config), env=cli_env(home, PHYSAI_COSMOS_API_KEY=SECRET),
                         cwd=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(sent) == 3 and all(r["authorized"] and r["frames"] > 1 for r in sent)

    store = LocalStore(home / "store")
    (report,) = [store.get(m.stem) for m in (home / "store" / "artifacts").glob("*.json")
                 if json.loads(m.read_text())["kind"] == "sim_report"]
    verdicts = {s.scene: s.critic for s in report.scenes}
    assert all(v is not None and v.model == "nvidia/cosmos-reason2-8b" for v in verdicts.values())
    assert [s for s, v in verdicts.items() if v is not None and not v.passed] == ["heavy_payload"]
    (gate,) = [g for g in report.gates if g.name == "critic/pass_rate"]
    assert not gate.passed and gate.measured == pytest.approx(2 / 3)
    assert not report.passed

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    logged = json.loads(Path(client.download_artifacts(report.mlflow_run_id, "critic.json",
                                                       str(tmp_path))).read_text())
    assert logged["heavy_payload"]["task_done"] is False
    assert client.get_run(report.mlflow_run_id).data.metrics["critic/pass_rate"] == \
        pytest.approx(2 / 3)
    (version,) = client.search_model_versions("name = 'reach-tiny'")
    assert version.tags["physai.gates_passed"] == "false"
    assert "critic/pass_rate" in done.stdout

    written = [p for p in home.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert written == [] and SECRET not in done.stdout + done.stderr

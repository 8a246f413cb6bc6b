"""A scene that sweeps a randomization field (``sweep:`` in its file): every grid point is
validated with the scene's episodes and seed, the report and MLflow hold the success curve,
the HTML report shows it, and the grid enters the suite digest and each point's cache key.
Under ``validate.sequential`` the scene itself stops once its gate is clear; its sweep points,
which measure a curve, still spend every episode. ``flows validate`` runs the sweep as well."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CliEnv, TinyConfig
from tests.support import run_flows

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PAYLOADS = [0.0, 10.0, 30.0]


def _suite(tmp_path: Path, payloads: list[float]) -> Path:
    nominal = (ROOT / "sim_scenes" / "reach" / "nominal.yaml").read_text()
    swept = nominal.replace("name: nominal", "name: payload")
    (tmp_path / "payload.yaml").write_text(f"{swept}sweep: {{payload_mass: {payloads}}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: swept\ntask: reach-v0\nscenes:\n"
                     "  - {scene: payload.yaml, episodes: 30, seed: 11}\n")
    return suite


def test_a_swept_scene_gives_a_success_curve_in_report_mlflow_and_html(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    from stages.sim.suites.loading import load_suite
    from stages.storage.store import LocalStore

    suite = _suite(tmp_path, PAYLOADS)
    config = tiny_config(validate={"suite": str(suite), "video_episodes": 1, "min_success": 0.2,
                                   "sequential": {"chunk": 10}})
    home = tmp_path / ".physai"
    done = run_flows("run", str(config), cwd=tmp_path, env=cli_env(home))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    store = LocalStore(home / "store")
    (report,) = [r for r in (store.get(m.stem) for m in (home / "store" / "artifacts")
                             .glob("*.json")) if r.kind == "sim_report"]
    assert [s.scene for s in report.scenes] == ["payload"]  # the scene itself, gated as ever
    assert [g.name for g in report.gates] == ["success/payload"]
    (scene,) = report.scenes
    seq = scene.sequential
    assert seq is not None and seq.max_episodes == 30 and seq.chunk == 10, scene
    assert scene.episodes == seq.episodes == len(scene.outcomes) < 30, scene  # stopped early
    assert (seq.p_fail, seq.p_hold) == (0.2, pytest.approx(0.3)) and seq.alpha <= 0.05
    (gate,) = report.gates
    assert gate.passed == (seq.verdict == "pass") and "sequential" in gate.detail
    print("sequential:", gate.detail)
    (curve,) = report.sweeps
    assert curve.scene == "payload" and curve.fields == ("payload_mass",)
    assert [p.sweep for p in curve.points] == [{"payload_mass": v} for v in PAYLOADS]
    assert all(p.episodes == 30 and p.video_digest is None for p in curve.points)
    light, _, heavy = curve.points
    assert light.success_rate > heavy.success_rate, curve  # 30 kg is past the arm's servos
    payloads = {f.name for f in report.scenes[0].factors}  # the base scene draws no payload
    assert "payload_mass" not in payloads
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri)
    files = {a.path for a in client.list_artifacts(report.mlflow_run_id)}
    assert {"sweeps.png", "sweeps.json", "report.html"} <= files
    logged = json.loads(Path(client.download_artifacts(report.mlflow_run_id, "sweeps.json",
                                                       str(tmp_path))).read_text())
    assert [p["sweep"] for p in logged["sweeps"][0]["points"]] == [
        {"payload_mass": v} for v in PAYLOADS]
    page = Path(client.download_artifacts(report.mlflow_run_id, "report.html",
                                          str(tmp_path))).read_text()
    assert 'id="sweeps"' in page and "payload_mass" in page
    assert f"{scene.episodes} of 30 (sequential {seq.verdict})" in page
    # flows validate of the same policy runs the sweep too: the same points, seeds, outcomes.
    cli = run_flows("validate", f"sha256:{report.parents[0]}", "--suite", str(suite), "--json",
                    "--min-success", "0.2", cwd=tmp_path, env=cli_env(home))
    assert cli.returncode in (0, 1), cli.stderr[-3000:]
    (swept,) = json.loads(cli.stdout)["sweeps"]
    assert swept["scene"] == "payload" and swept["fields"] == ["payload_mass"]
    assert [(p["sweep"], p["successes"], p["episodes"]) for p in swept["points"]] == [
        (p.sweep, p.successes, p.episodes) for p in curve.points]
    run_id = json.loads(cli.stdout)["mlflow_run_id"]
    assert "sweeps.png" in {a.path for a in client.list_artifacts(run_id)}
    other = tmp_path / "other"
    other.mkdir()
    assert load_suite(_suite(other, PAYLOADS[:2])).digest != load_suite(suite).digest

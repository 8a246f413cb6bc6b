"""Units at every boundary, through the command line against a real ``mlflow server``:
behaviour cloning on a Minari recording in InvertedPendulum-v5's own units (newtons) keeps the
pole up, and a raw-unit ONNX policy declared native validates exactly as the same law in the
task's convention."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
import yaml

from flows.cli import main
from tests.e2e.test_policy_import import SUITE, WEAK_GAINS, flows_env, run_json
from tests.fixtures.imported.policies import pd_onnx
from tests.stages.test_units import pd_native_onnx, record_pendulum

pytestmark = pytest.mark.e2e
__all__ = ["flows_env"]  # the shared fixture, imported for pytest to find here

TASK = "gymnasium:InvertedPendulum-v5"
EPISODE_STEPS = 400
"""Long enough that a clone of newtons read as -1..1 (3x the expert's gain, clipped) drifts
off the rail (it falls after about 320 steps), short enough to stay cheap."""


def test_bc_on_a_native_minari_recording_keeps_the_pendulum_up(
    flows_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    record_pendulum("pd/pendulum-v0", episodes=30, steps=100)
    source = tmp_path / "minari" / "pd" / "pendulum-v0"
    (tmp_path / "long.yaml").write_text(yaml.safe_dump({
        "name": "long", "task": TASK, "episode_steps": EPISODE_STEPS,
        "success": {"survive": True}}))
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({
        "name": "pendulum-long", "task": TASK,
        "scenes": [{"scene": "long.yaml", "episodes": 50, "seed": 1}]}))
    config = {
        "name": "pendulum-bc", "task": TASK,
        "collect": {"source": str(source), "format": "minari"},
        "train": {"epochs": 5, "batch_size": 256, "lr": 0.003, "hidden": [64, 64],
                  "device": "cpu"},
        "validate": {"suite": "suite.yaml", "min_success": 0.5, "video_episodes": 0},
        "package": {"latency_iters": 100, "max_latency_p99_ms": 50},
        "promote": {"model_name": "pendulum-bc"},
    }
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    assert main(["run", "pipeline.yaml", "--direct"]) == 0, capsys.readouterr().err[-3000:]

    from stages.artifacts.records import Dataset, SimReport
    from stages.orchestration.context import open_services

    _, store, lineage = open_services()
    tags = lineage.resolve_model("models:/pendulum-bc/1").tags
    report = store.get(tags["physai.sim_report.digest"])
    assert isinstance(report, SimReport)
    (scene,) = report.scenes
    assert scene.episodes == 50 and scene.successes >= 45, scene
    dataset = store.get(tags["physai.dataset.digest"])
    assert isinstance(dataset, Dataset)
    with h5py.File(store.open_payload(dataset), "r") as f:
        said = json.loads(f["data"].attrs["env_args"])["source"]
    assert said["action_units"] == "native" and said["native_actions"]["high"] == [3.0]
    # flows dataset import takes the same file to the same dataset, and says which units it
    # took the actions in and what it did to them.
    code, imported = run_json(capsys, "dataset", "import", str(source), "--format", "minari",
                              "--task", TASK, "--json")
    assert code == 0 and imported["digest"] == dataset.digest, imported
    assert imported["action_units"] == "native"
    assert imported["actions_converted"] == "native -1..1 maps to -3..3"
    # The config says so too: a source declared normalized is taken as it is, into a dataset
    # of its own (the declaration is part of collect's cache key).
    (tmp_path / "short.yaml").write_text(yaml.safe_dump({
        "name": "short", "task": TASK, "episode_steps": 20, "success": {"survive": True}}))
    (tmp_path / "short_suite.yaml").write_text(yaml.safe_dump({
        "name": "pendulum-short", "task": TASK,
        "scenes": [{"scene": "short.yaml", "episodes": 2, "seed": 1}]}))
    as_is_config = {
        **config, "name": "pendulum-as-is",
        "collect": {"source": str(source), "format": "minari", "action_units": "normalized"},
        "train": {**config["train"], "epochs": 1},
        "validate": {"suite": "short_suite.yaml", "min_success": 0.0, "video_episodes": 0},
        "promote": {"model_name": "pendulum-as-is"},
    }
    (tmp_path / "as_is.yaml").write_text(yaml.safe_dump(as_is_config))
    assert main(["run", "as_is.yaml", "--direct"]) == 0, capsys.readouterr().err[-3000:]
    as_is = store.get(lineage.resolve_model("models:/pendulum-as-is/1").tags[
        "physai.dataset.digest"])
    assert isinstance(as_is, Dataset) and as_is.digest != dataset.digest
    with h5py.File(store.open_payload(as_is), "r") as f:
        said = json.loads(f["data"].attrs["env_args"])["source"]
        taken = f["data/demo_0/actions"][:]
    with h5py.File(store.open_payload(dataset), "r") as f:
        converted = f["data/demo_0/actions"][:]
    assert "native_actions" not in said, said  # nothing converted
    assert abs(taken).max() > 1.0 and abs(converted).max() <= 1.0
    assert taken == pytest.approx(converted * 3.0, abs=1e-5)


def test_a_native_onnx_declared_native_validates_like_the_normalized_one(
    flows_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native = pd_native_onnx(tmp_path / "newtons.onnx", WEAK_GAINS)
    normalized = pd_onnx(tmp_path / "normalized.onnx", WEAK_GAINS)
    reports = {}
    for name, path, units in (("native", native, "native"),
                              ("normalized", normalized, "normalized")):
        code, report = run_json(capsys, "validate", str(path), "--suite", str(SUITE), "--json",
                                "--min-success", "0", "--action-units", units)
        assert code == 0, report
        reports[name] = report
    outcomes = {k: [s["outcomes"] for s in r["scenes"]] for k, r in reports.items()}
    assert outcomes["native"] == outcomes["normalized"]
    weak = next(s for s in reports["native"]["scenes"] if s["name"] == "weak_start")
    assert 0 < weak["successes"] < weak["episodes"]  # mixed outcomes: the match means something
    # The raw-unit file declared normalized is refused in one line, exit 2.
    assert main(["validate", str(native), "--suite", str(SUITE), "--action-units",
                 "normalized"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "newtons.onnx" in err and "action_units" in err and "outside -1..1" in err, err

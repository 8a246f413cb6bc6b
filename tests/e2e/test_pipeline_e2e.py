"""The reach pipeline end to end through Prefect against a real ``mlflow server`` on SQLite."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "reach-tiny"
STAGES = ("collect", "train", "validate-scene", "validate", "package", "promote")

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Runs:
    home: Path
    tracking_uri: str
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]
    second_seconds: float
    versions_after_second: tuple[str, ...]
    after_wipe: subprocess.CompletedProcess[str]
    lineage: subprocess.CompletedProcess[str]


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def runs(mlflow_server: str, shared_prefect_api: str,
         tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Three runs of the tiny pipeline (first, cached, after the store is wiped) reporting to
    the session's Prefect server, and the champion's lineage."""
    work = tmp_path_factory.mktemp("work")
    env = {**os.environ, "PHYSAI_HOME": str(work / ".physai"),
           "MLFLOW_TRACKING_URI": mlflow_server, "COLUMNS": "160"}
    for var in ("PHYSAI_STORE", "PREFECT_HOME"):
        env.pop(var, None)
    env["PREFECT_API_URL"] = shared_prefect_api
    from tests.support import reach_tiny_config

    # The tiny pipeline filming a rollout per scene: its videos are checked below.
    config = str(reach_tiny_config(tmp_path_factory.mktemp("config") / "reach_tiny.yaml",
                                   validate={"video_episodes": 1}))
    first = flows("run", config, env=env, cwd=work)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    start = time.perf_counter()
    second = flows("run", config, env=env, cwd=work)
    seconds = time.perf_counter() - start
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    from mlflow import MlflowClient

    versions = MlflowClient(mlflow_server, registry_uri=mlflow_server).search_model_versions(
        f"name='{MODEL}'")
    shutil.rmtree(work / ".physai" / "store")
    after_wipe = flows("run", config, env=env, cwd=work)
    assert after_wipe.returncode == 0, after_wipe.stdout[-3000:] + after_wipe.stderr[-3000:]
    lineage = flows("lineage", f"models:/{MODEL}@champion", env=env, cwd=work)
    return Runs(work / ".physai", mlflow_server, first, second, seconds,
                tuple(v.version for v in versions), after_wipe, lineage)


def client(runs: Runs):  # type: ignore[no-untyped-def]
    from mlflow import MlflowClient

    return MlflowClient(runs.tracking_uri, registry_uri=runs.tracking_uri)


def test_first_run_promotes_champion(runs: Runs) -> None:
    assert f"models:/{MODEL}/1 -> @champion" in runs.first.stdout
    mv = client(runs).get_model_version_by_alias(MODEL, "champion")
    assert mv.version == "1"
    assert mv.source.startswith("models:/m-")


def test_lineage_tags_point_at_verified_artifacts(runs: Runs) -> None:
    from stages.artifacts.records import Dataset, EdgeBundle, Policy, SimReport
    from stages.storage.store import LocalStore

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    store = LocalStore(runs.home / "store")
    kinds = {"dataset": Dataset, "policy": Policy, "sim_report": SimReport,
             "bundle": EdgeBundle}
    for role, cls in kinds.items():
        artifact = store.get(tags[f"physai.{role}.digest"])
        assert isinstance(artifact, cls)
        store.open_payload(artifact)
    policy = store.get(tags["physai.policy.digest"])
    assert policy.parents == (tags["physai.dataset.digest"],)
    train_run = client(runs).get_run(tags["physai.train_run_id"])
    assert train_run.data.tags["physai.policy.digest"] == tags["physai.policy.digest"]
    run = client(runs).get_run(tags["physai.collect_run_id"])
    assert run.data.tags["physai.dataset.digest"] == tags["physai.dataset.digest"]
    assert tags["physai.gates_passed"] == "true"


def test_bundle_digests_and_onnx_parity(runs: Runs, tmp_path: Path) -> None:
    import onnxruntime as ort
    import torch

    from edge.bundle import unpack_bundle, verify_bundle
    from stages.core.hashing import sha256_file
    from stages.datasets.demonstrations import read_transitions
    from stages.policies.local import load_policy
    from stages.storage.store import LocalStore

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    store = LocalStore(runs.home / "store")
    bundle = store.get(tags["physai.bundle.digest"])
    manifest = verify_bundle(store.open_payload(bundle))
    unpack_bundle(store.open_payload(bundle), tmp_path / "b")
    onnx_path = tmp_path / "b" / "policy.onnx"
    assert manifest["files"]["policy.onnx"]["sha256"] == sha256_file(onnx_path)
    assert manifest["lineage"]["dataset_digest"] == tags["physai.dataset.digest"]

    policy = store.get(tags["physai.policy.digest"])
    module, meta = load_policy(store.open_payload(policy))
    dataset = store.get(tags["physai.dataset.digest"])
    obs = read_transitions(store.open_payload(dataset), meta["obs_dim"], meta["act_dim"]).obs
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(["actions"], {"obs": obs})[0]
    with torch.inference_mode():
        want = module(torch.from_numpy(obs)).numpy()
    assert np.abs(got - want).max() <= 1e-5


def test_second_run_hits_cache_for_every_stage(runs: Runs) -> None:
    assert f"cached stages: {', '.join(STAGES)}" in runs.second.stdout
    assert runs.versions_after_second == ("1",)
    assert runs.second_seconds < 30, f"cached re-run took {runs.second_seconds:.1f} s"


def test_lineage_prints_the_verified_chain(runs: Runs) -> None:
    assert runs.lineage.returncode == 0, runs.lineage.stderr
    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    out = runs.lineage.stdout
    for role in ("bundle", "sim_report", "policy", "dataset"):
        assert tags[f"physai.{role}.digest"] in out
    assert out.count("verified") == 4 and "NOT VERIFIED" not in out
    assert tags["physai.code_revision"] in out
    assert tags["physai.collect_run_id"] in out


def test_cache_hit_whose_artifact_left_the_store_runs_again(runs: Runs) -> None:
    assert "cached stages: collect" not in runs.after_wipe.stdout
    assert "missing from the store" in runs.after_wipe.stdout + runs.after_wipe.stderr
    # Stages are deterministic: the re-made artifacts have the digests version 1 points to.
    versions = client(runs).search_model_versions(f"name='{MODEL}'")
    assert [v.version for v in versions] == ["1"]


def test_validation_run_holds_plot_and_one_video_and_usd_stage_per_scene(
    runs: Runs, tmp_path: Path
) -> None:
    from pxr import Usd, UsdGeom

    from stages.sim.suites.loading import load_scene
    from stages.storage.store import LocalStore

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    run_id = tags["physai.validate_run_id"]
    files = {f.path for f in client(runs).list_artifacts(run_id)}
    assert {"sim_report.json", "success_rates.png", "videos"} <= files
    videos = {f.path for f in client(runs).list_artifacts(run_id, "videos")}
    report = LocalStore(runs.home / "store").get(tags["physai.sim_report.digest"])
    assert videos == {f"videos/{s.scene}{suffix}" for s in report.scenes
                      for suffix in (".gif", ".usda")}
    assert all(s.video_digest and s.usd_digest for s in report.scenes)
    scene = report.scenes[0].scene
    local = client(runs).download_artifacts(run_id, f"videos/{scene}.usda", str(tmp_path))
    stage = Usd.Stage.Open(local)
    hand = next(p for p in stage.Traverse() if p.GetName() == "link7")
    move = UsdGeom.Xformable(hand).GetOrderedXformOps()[0]
    samples = move.GetTimeSamples()
    steps = load_scene(ROOT / "sim_scenes" / "reach" / f"{scene}.yaml").config.episode_steps
    assert samples[0] == stage.GetStartTimeCode() == 0
    assert samples[-1] == stage.GetEndTimeCode() == steps
    assert len({tuple(move.Get(t)) for t in samples}) > len(samples) // 2  # the arm moves


def test_every_episode_is_recorded_and_flows_validate_ranks_the_factors(
    runs: Runs, tmp_path: Path
) -> None:
    """The validation run holds each scene's episodes (conditions, outcome, failure mode) as a
    Parquet file; ``flows validate --json`` of the champion on wide targets, farther than its
    demonstrations went, ranks the factors of its failures with an interval on each."""
    import json

    import pyarrow.parquet as pq

    from stages.artifacts.records import SimReport
    from stages.storage.store import LocalStore

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    store = LocalStore(runs.home / "store")
    report = store.get(tags["physai.sim_report.digest"])
    assert isinstance(report, SimReport)
    run_id = report.mlflow_run_id
    files = {a.path for a in client(runs).list_artifacts(run_id, "episodes")}
    assert files == {f"episodes/{s.scene}.parquet" for s in report.scenes}
    heavy = next(s for s in report.scenes if s.scene == "heavy_payload")
    table = pq.read_table(client(runs).download_artifacts(
        run_id, "episodes/heavy_payload.parquet", str(tmp_path)))
    assert table.num_rows == heavy.episodes
    assert int(table.column("success").to_numpy().sum()) == heavy.successes
    assert {"mass_scale", "damping_scale", "gain_scale", "target_x", "failure", "miss",
            "return"} <= set(table.column_names)
    mass = table.column("mass_scale").to_numpy()
    assert 1.0 <= mass.min() < mass.max() <= 1.5  # heavy_payload draws links up to 50% heavier
    assert table.schema.field("target_x").metadata == {b"unit": b"m"}
    # A scene far beyond the demonstrations: payloads up to 20 kg on servos down to 30% gain.
    (tmp_path / "overload.yaml").write_text(
        "name: overload\ntask: reach-v0\nepisode_steps: 100\nrandomization:\n"
        "  target_low: [0.35, -0.25, 0.15]\n  target_high: [0.60, 0.25, 0.50]\n"
        "  payload_mass: [0.0, 20.0]\n  gain_scale: [0.3, 1.0]\n")
    suite = tmp_path / "overload_suite.yaml"
    suite.write_text("name: overload\ntask: reach-v0\nscenes:\n"
                     "  - {scene: overload.yaml, episodes: 200, seed: 9}\n")
    env = {**os.environ, "PHYSAI_HOME": str(runs.home), "MLFLOW_TRACKING_URI": runs.tracking_uri}
    done = flows("validate", f"models:/{MODEL}@champion", "--suite", str(suite), "--json",
                 "--min-success", "0", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (scene,) = json.loads(done.stdout)["scenes"]
    assert 0 < scene["successes"] < scene["episodes"], scene
    factors = scene["factors"]
    assert all({"name", "effect", "ci_low", "ci_high"} <= set(f) for f in factors)
    assert {f["name"] for f in factors} == {"payload_mass", "gain_scale", "target_x",
                                            "target_y", "target_z"}
    top = factors[0]
    assert top["name"] == "payload_mass" and top["unit"] == "kg", factors
    assert 0 < top["ci_low"] <= top["effect"] <= top["ci_high"]  # heavier, more failures
    sizes = [abs(f["effect"]) for f in factors]
    assert sizes == sorted(sizes, reverse=True)
    print("overload:", scene["successes"], "/", scene["episodes"],
          [(f["name"], round(f["effect"], 2)) for f in factors])


def test_served_bundle_answers_openpi_client_and_validates_as_its_file(
    runs: Runs, tmp_path: Path
) -> None:
    """``flows policy serve BUNDLE`` speaks OpenPI's protocol: openpi-client's own
    WebsocketClientPolicy gets what ONNX Runtime computes; ``flows validate ws://...`` gives the
    bundle's ONNX file's per-episode outcomes on the same suite and seeds, with latencies; a
    server that misbehaves fails its episodes with the reason, and one that is gone stops the
    run in one line."""
    import json
    import threading

    import onnxruntime as ort
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from edge.bundle import unpack_bundle
    from stages.policies import policy_server
    from stages.storage.store import LocalStore
    from tests.support import free_port

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    store = LocalStore(runs.home / "store")
    bundle = store.open_payload(store.get(tags["physai.bundle.digest"]))
    unpack_bundle(bundle, tmp_path / "b")
    onnx_file = tmp_path / "b" / "policy.onnx"
    port = free_port()
    env = {**os.environ, "PHYSAI_HOME": str(runs.home), "MLFLOW_TRACKING_URI": runs.tracking_uri}
    server = subprocess.Popen([sys.executable, "-m", "flows.cli", "policy", "serve", str(bundle),
                               "--port", str(port)], env=env, cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert f"on ws://127.0.0.1:{port}" in line, line
        openpi = WebsocketClientPolicy("127.0.0.1", port)
        meta = openpi.get_server_metadata()
        assert meta["task"] == "reach-v0" and (meta["obs_dim"], meta["act_dim"]) == (23, 7)
        obs = np.random.default_rng(0).normal(size=(16, 23)).astype(np.float32)
        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        expected = np.concatenate([session.run(None, {"obs": o[None]})[0] for o in obs])
        served = np.stack([openpi.infer({"obs": o})["actions"] for o in obs])
        assert np.abs(served - expected).max() <= 1e-6
        batch = openpi.infer({"obs": obs})["actions"]
        assert batch.shape == (16, 7) and np.abs(batch - expected).max() <= 1e-6

        suite = ROOT / "tests" / "fixtures" / "suite_tiny.yaml"
        args = ("--suite", str(suite), "--json", "--min-success", "0")
        there = flows("validate", f"ws://127.0.0.1:{port}", *args, env=env, cwd=tmp_path)
        here = flows("validate", str(onnx_file), *args, env=env, cwd=tmp_path)
        assert there.returncode == 0 and here.returncode == 0, there.stderr + here.stderr
        remote_body, local = json.loads(there.stdout), json.loads(here.stdout)
        assert [s["outcomes"] for s in remote_body["scenes"]] == \
            [s["outcomes"] for s in local["scenes"]]
        assert all(len(s["outcomes"]) == s["episodes"] for s in local["scenes"])
        latency = remote_body["remote_latency_ms"]
        assert latency["calls"] == 3 * 100 and 0 < latency["p50_ms"] <= latency["p99_ms"]
    finally:
        server.terminate()
        server.wait(timeout=30)

    # A server that answers NaN on some calls and stalls on one: those episodes fail, with why.
    calls = {"n": 0}

    def flaky(batch: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 40:
            time.sleep(1.5)
        out = np.zeros((len(batch), 7), np.float32)
        return out * np.nan if calls["n"] == 20 else out

    ready, stop, port = threading.Event(), threading.Event(), free_port()
    meta = {"task": "reach-v0", "obs_dim": 23, "act_dim": 7, "policy_digest": "flaky"}
    thread = threading.Thread(target=policy_server.serve, args=(flaky, meta, "127.0.0.1", port),
                              kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert ready.wait(10)
    one = tmp_path / "one.yaml"
    one.write_text(f"name: one\ntask: reach-v0\nscenes:\n  - {{scene: "
                   f"{ROOT / 'sim_scenes' / 'reach' / 'nominal.yaml'}, episodes: 4, seed: 1}}\n")
    try:
        bad = flows("validate", f"ws://127.0.0.1:{port}", "--suite", str(one), "--json",
                    "--min-success", "0", "--remote-timeout", "0.5", env=env, cwd=tmp_path)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert bad.returncode == 0, bad.stderr[-2000:]
    (scene,) = json.loads(bad.stdout)["scenes"]
    assert scene["successes"] == 0 and scene["outcomes"] == "0000"
    assert scene["failure_modes"] == {
        "remote policy: malformed answer: actions that are not finite": 4}, scene

    gone = flows("validate", f"ws://127.0.0.1:{free_port()}", "--suite", str(one),
                 env=env, cwd=tmp_path)
    assert gone.returncode == 2, gone.stderr
    (line,) = gone.stderr.strip().splitlines()
    assert "remote policy ws://127.0.0.1:" in line and "cannot connect" in line, line


def test_all_state_stays_under_physai_home(runs: Runs) -> None:
    assert sorted(p.name for p in runs.home.parent.iterdir()) == [".physai"]


def test_bundle_verify_and_inspect_from_the_cli(runs: Runs, tmp_path: Path) -> None:
    from stages.storage.store import LocalStore

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    store = LocalStore(runs.home / "store")
    bundle = store.open_payload(store.get(tags["physai.bundle.digest"]))
    env = {**os.environ, "COLUMNS": "200", "PHYSAI_HOME": str(runs.home)}
    ok = flows("bundle", "verify", str(bundle), env=env, cwd=tmp_path)  # the project's key
    assert ok.returncode == 0, ok.stderr
    assert "verified: 5 files match the manifest" in ok.stdout
    assert tags["physai.dataset.digest"] in ok.stdout
    shown = flows("bundle", "inspect", str(bundle), env=env, cwd=tmp_path)
    assert shown.returncode == 0 and "jetson-agx-thor" in shown.stdout

    tampered = tmp_path / "tampered.tar"
    with tarfile.open(bundle) as tar:
        offset = tar.getmember("policy.onnx").offset_data
    data = bytearray(bundle.read_bytes())
    data[offset + 100] ^= 0xFF
    tampered.write_bytes(bytes(data))
    bad = flows("bundle", "verify", str(tampered), env=env, cwd=tmp_path)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "tampered.tar" in bad.stderr


def test_runtime_drives_the_robot_from_the_bundle_as_validation_did(
    runs: Runs, tmp_path: Path
) -> None:
    """The edge runtime, loading the promoted bundle tar itself, drives the MuJoCo arm in the
    suite's first scene; its success rate lies inside the validation stage's 95% interval."""
    import re

    from stages.sim.suites.loading import load_suite
    from stages.storage.store import LocalStore

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    store = LocalStore(runs.home / "store")
    bundle = store.open_payload(store.get(tags["physai.bundle.digest"]))
    report = store.get(tags["physai.sim_report.digest"])
    scene = load_suite(ROOT / "tests" / "fixtures" / "suite_tiny.yaml").scenes[0].scene
    validated = next(s for s in report.scenes if s.scene == scene.name)
    # The bundle's signer is the run's project key, which the command trusts by default.
    env = {**os.environ, "COLUMNS": "200", "PHYSAI_HOME": str(runs.home)}
    done = flows("bundle", "drive", str(bundle), "--scene", str(scene.path), "--episodes", "30",
                 "--rate", "400", "--seed", "5", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = re.search(r"(\d+)/30 = ([0-9.]+) .* (\d+) deadline misses", done.stdout)
    assert found, done.stdout
    rate, misses = float(found.group(2)), int(found.group(3))
    assert validated.ci_low <= rate <= validated.ci_high, (rate, validated)
    # 3000 steps at 400 Hz on a CPU that make test shares with other test workers and their
    # servers, so a loaded scheduler wakes the loop late now and then (up to 5.5% of steps seen
    # on a quiet run, over a quarter on a machine shared with more work than its cores). A loop
    # that cannot keep the rate misses nearly every deadline; the bound catches that, and
    # benchmarks/edge_latency.py measures deadline performance on a quiet machine.
    assert misses <= 0.6 * 30 * 100, done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT present")
def test_engine_build_flow_without_tensorrt_stops_before_writing(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge.errors import TargetError
    from flows.engine import engine_build_flow

    tags = client(runs).get_model_version_by_alias(MODEL, "champion").tags
    monkeypatch.setenv("PHYSAI_HOME", str(runs.home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", runs.tracking_uri)
    with pytest.raises(TargetError, match="TensorRT is not installed on this machine"):
        engine_build_flow.fn(tags["physai.bundle.digest"])
    assert not (runs.home / "engines").exists()

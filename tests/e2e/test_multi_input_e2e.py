"""A vision policy exported elsewhere (``state`` and a CHW float ``rgb`` in 0..1, names not
this project's) through the command line and a pipeline: ``flows validate FILE --input ...``,
``flows run`` of ``train: {source: FILE, inputs: ...}`` and ``flows validate`` of the bundle
that run packs act, episode for episode, as the file does when fed as its exporter feeds it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv
from tests.fixtures.foreign_vision_onnx import foreign_actions, foreign_vision_onnx

pytestmark = pytest.mark.e2e

MAPPING = ["--input", "state=obs", "--input", "rgb=front_image"]


def write_suite(folder: Path) -> Path:
    """A suite of one reach-vision-v0 scene whose targets lie near the arm's home pose, where
    the fixture's policy reaches some and misses others: 8 episodes of 12 steps."""
    (folder / "near_home.yaml").write_text(yaml.safe_dump({
        "name": "near_home", "task": "reach-vision-v0", "episode_steps": 12,
        "randomization": {"target_low": [0.40, -0.04, 0.32],
                          "target_high": [0.48, 0.04, 0.38]}}))
    suite = folder / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "foreign-vision", "task": "reach-vision-v0", "backend": "mujoco",
        "scenes": [{"scene": "near_home.yaml", "episodes": 8, "seed": 3}]}))
    return suite


def reference(policy: Path, suite: Path) -> dict[str, tuple[str, float]]:
    """Each scene's per-episode success and mean return with the file fed by its exporter's
    own code (:func:`foreign_actions`), none of the import's mapping involved."""
    import onnxruntime

    from stages.evaluation.suite import evaluate_suite
    from stages.policies.local import SeeingPolicy
    from stages.sim.suites.loading import load_suite

    session = onnxruntime.InferenceSession(str(policy), providers=["CPUExecutionProvider"])
    act = SeeingPolicy(("obs", "front_image"),
                       lambda arrays: foreign_actions(session, arrays[0], arrays[1], "chw"))
    return {s.scene: (s.outcomes, s.mean_return) for s in evaluate_suite(load_suite(suite), act)}


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def validated(*args: str, env: dict[str, str], cwd: Path) -> dict[str, tuple[str, float]]:
    """``flows validate ... --json``'s per-episode success and mean return of each scene."""
    done = flows("validate", *args, "--min-success", "0", "--json", env=env, cwd=cwd)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return {s["name"]: (s["outcomes"], s["mean_return"])
            for s in json.loads(done.stdout)["scenes"]}


def test_a_foreign_vision_onnx_validates_imports_and_packs_as_its_exporter_runs_it(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    from mlflow import MlflowClient

    from stages.artifacts.records import EdgeBundle, SimReport
    from stages.storage.store import LocalStore

    policy = foreign_vision_onnx(tmp_path / "policy.onnx", "chw")
    suite = write_suite(tmp_path)
    expected = reference(policy, suite)
    (outcomes, _), = expected.values()
    assert "0" in outcomes and "1" in outcomes  # mixed: the episodes can tell policies apart
    home = tmp_path / ".physai"
    env = cli_env(home)

    # -- without the mapping: one line naming the file, the field and the flags, exit 2
    refused = flows("validate", "policy.onnx", "--suite", str(suite), env=env, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-2000:]
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert "policy.onnx: inputs: map each input" in line
    assert "--input state=obs --input rgb=front_image" in line

    # -- the file from the command line, mapped by flags
    assert validated("policy.onnx", "--suite", str(suite), *MAPPING, env=env,
                     cwd=tmp_path) == expected

    # -- the file through a pipeline: imported, validated, packaged, promoted
    config = {
        "name": "foreign-vision", "task": "reach-vision-v0",
        "train": {"source": "policy.onnx", "inputs": {"state": "obs", "rgb": "front_image"}},
        "validate": {"suite": str(suite), "min_success": 0.0, "video_episodes": 0},
        "package": {"latency_iters": 50, "parity_tolerance": 1.0e-4},
        "promote": {"model_name": "foreign-vision"},
    }
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    run = flows("run", "pipeline.yaml", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    uri = f"sqlite:///{home / 'mlflow.db'}"
    tags = MlflowClient(uri, registry_uri=uri).get_model_version_by_alias(
        "foreign-vision", "champion").tags
    store = LocalStore(home / "store")
    report = store.get(tags["physai.sim_report.digest"])
    assert isinstance(report, SimReport)
    assert {s.scene: (s.outcomes, s.mean_return) for s in report.scenes} == expected

    # -- the bundle that run packed, validated from the command line
    bundle = store.get(tags["physai.bundle.digest"])
    assert isinstance(bundle, EdgeBundle)
    assert validated(str(store.open_payload(bundle)), "--suite", str(suite), env=env,
                     cwd=tmp_path) == expected
    # ... which reads the task's tensors already: a mapping given to it is refused, not ignored
    mapped = flows("validate", str(store.open_payload(bundle)), "--suite", str(suite),
                   *MAPPING, env=env, cwd=tmp_path)
    assert mapped.returncode == 2, mapped.stderr[-2000:]
    (line,) = [ln for ln in mapped.stderr.splitlines() if ln.strip()]
    assert "command line: --input" in line and "leave the flag out" in line


def test_flows_policy_serve_takes_the_same_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flows policy serve FILE --task T --input ...`` serves the file as a policy that sees:
    it reads the state and the front camera, and tells clients the frame's shape."""
    from flows.cli import build_parser
    from flows.serve_cli import _served_policy
    from physai_core.errors import ConfigError
    from tests.conftest import STATE_VARS

    monkeypatch.setenv("PHYSAI_HOME", str(tmp_path / ".physai"))
    for var in STATE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    foreign_vision_onnx(tmp_path / "policy.onnx", "hwc")
    args = build_parser().parse_args(["policy", "serve", "policy.onnx", "--task",
                                      "reach-vision-v0", *MAPPING])
    act, meta = _served_policy(args, tmp_path)
    assert getattr(act, "inputs", None) == ("obs", "front_image")
    assert list(meta["image_shapes"].values()) == [[64, 64, 3]]
    unmapped = build_parser().parse_args(["policy", "serve", "policy.onnx", "--task",
                                          "reach-vision-v0"])
    with pytest.raises(ConfigError, match="--input state=obs --input rgb=front_image"):
        _served_policy(unmapped, tmp_path)

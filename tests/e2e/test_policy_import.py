"""Policies this project did not write, through the CLI against a real ``mlflow server``:
``flows validate`` against a plain Gymnasium loop, ``flows compare`` exit codes, MLflow models
by their onnx flavor only, and ``flows run`` of ``train: {source: policy.onnx}`` through
package, validation and promotion to ``flows lineage``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from flows.cli import main
from tests.conftest import CliEnv
from tests.fixtures.imported.policies import pd_onnx, pd_torchscript

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "imported"
SUITE = FIXTURES / "suite.yaml"
WEAK_GAINS = (0.0, 5.0, 0.0, 0.5)
"""A PD law that holds the pole in about half the episodes of the weak_start scene."""

pytestmark = pytest.mark.e2e


@pytest.fixture
def flows_env(tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """State under ``tmp_path`` and MLflow at the module's server, for ``main([...])`` in this
    process; every variable the CLI sets is restored afterwards."""
    from stages.core.settings import embedded_environment, resolve_settings

    home = tmp_path / ".physai"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("COLUMNS", "200")
    for var in ("PHYSAI_STORE", "PREFECT_API_URL", "PHYSAI_MLFLOW_ARTIFACTS"):
        monkeypatch.delenv(var, raising=False)
    for key, value in embedded_environment(resolve_settings()).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return home


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


def plain_gymnasium_rate(policy: Path, scene: Path, episodes: int, seed: int) -> float:
    """The success rate of ``policy`` by a plain Gymnasium loop: ``gymnasium.make`` per
    episode, seeded as the task seeds its worlds (world i of seed s: the i-th number of
    ``SeedSequence(s)``), actions in [-1, 1] scaled to the action Box, success = the pole
    never fell."""
    import gymnasium
    import onnxruntime

    cfg = yaml.safe_load(scene.read_text())
    session = onnxruntime.InferenceSession(str(policy), providers=["CPUExecutionProvider"])
    seeds = np.random.SeedSequence(seed).generate_state(episodes)
    survived = 0
    for s in seeds:
        env = gymnasium.make(cfg["task"].removeprefix("gymnasium:"),
                             max_episode_steps=cfg["episode_steps"], **cfg["make_kwargs"])
        box = env.action_space
        assert isinstance(box, gymnasium.spaces.Box)
        low, high = box.low, box.high
        obs, _ = env.reset(seed=int(s))
        terminated = truncated = False
        while not (terminated or truncated):
            (action,) = session.run(["actions"], {"obs": obs[None].astype(np.float32)})
            force = low + (np.clip(action[0], -1, 1) + 1) * 0.5 * (high - low)
            obs, _, terminated, truncated, _ = env.step(force.astype(env.action_space.dtype))
        env.close()
        survived += not terminated
    return survived / episodes


def test_validate_json_of_a_foreign_onnx_matches_a_plain_gymnasium_loop(
    flows_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = pd_onnx(tmp_path / "policy.onnx", WEAK_GAINS)
    code, report = run_json(capsys, "validate", str(policy), "--suite", str(SUITE), "--json",
                            "--min-success", "0.2")
    assert code == 0, report
    weak = next(s for s in report["scenes"] if s["name"] == "weak_start")
    assert {"name", "episodes", "successes", "success_rate", "ci_low", "ci_high"} <= set(weak)
    assert 0 < weak["successes"] < weak["episodes"] == 20  # mixed outcomes: seeds matter
    plain = plain_gymnasium_rate(policy, FIXTURES / "weak_start.yaml", 20, 0)
    assert weak["ci_low"] <= plain <= weak["ci_high"]
    assert plain == weak["success_rate"]  # the same seeds give the same episodes
    assert report["policy_digest"] == hashlib.sha256(policy.read_bytes()).hexdigest()
    from mlflow import MlflowClient

    run = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(report["mlflow_run_id"])
    assert run.data.metrics["weak_start/success_rate"] == weak["success_rate"]
    # --episodes: fewer episodes per scene.
    code, few = run_json(capsys, "validate", str(policy), "--suite", str(SUITE), "--json",
                         "--episodes", "3", "--min-success", "0.99")
    assert code == 1 and not few["passed"] and {s["episodes"] for s in few["scenes"]} == {3}


def test_sequential_validate_stops_each_scene_once_its_gate_is_clear(
    flows_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``flows validate --sequential``: a policy that keeps the pole up passes every scene in
    fewer than its 60 episodes, and one that does nothing fails each early too."""
    good = pd_onnx(tmp_path / "good.onnx")
    code, report = run_json(capsys, "validate", str(good), "--suite", str(SUITE), "--json",
                            "--sequential", "--episodes", "60", "--min-success", "0.5")
    assert code == 0, report
    for scene in report["scenes"]:
        seq = scene["sequential"]
        assert seq["verdict"] == "pass" and seq["max_episodes"] == 60, scene
        assert scene["episodes"] == seq["episodes"] == len(scene["outcomes"]) < 60, scene
        assert seq["episodes"] % 10 == 0 and seq["alpha"] <= 0.05
    fallen = pd_onnx(tmp_path / "zero.onnx", (0.0, 0.0, 0.0, 0.0))
    code, bad = run_json(capsys, "validate", str(fallen), "--suite", str(SUITE), "--json",
                         "--sequential", "--chunk", "5", "--episodes", "60",
                         "--min-success", "0.5")
    assert code == 1 and not bad["passed"], bad
    for scene in bad["scenes"]:
        assert scene["sequential"]["verdict"] == "fail" and scene["successes"] == 0, scene
        assert scene["episodes"] == scene["sequential"]["episodes"] < 60, scene
        assert scene["episodes"] % 5 == 0 and not scene["passed"]


def test_compare_exits_1_when_b_is_worse_and_0_when_equal(
    flows_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = pd_onnx(tmp_path / "good.onnx")
    fallen = pd_onnx(tmp_path / "zero.onnx", (0.0, 0.0, 0.0, 0.0))
    assert main(["compare", str(good), str(fallen), "--suite", str(SUITE)]) == 1
    assert "B is WORSE" in capsys.readouterr().out
    code, same = run_json(capsys, "compare", str(good), str(good), "--suite", str(SUITE),
                          "--json", "--episodes", "5")
    assert code == 0 and same["worse"] is False
    assert [s["difference"] for s in same["comparison"]["scenes"]] == [0.0, 0.0]


def test_bad_policy_files_are_one_line_and_exit_2(
    flows_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "text.onnx").write_text("hello\n")
    pd_onnx(tmp_path / "wide.onnx", (1.0, 20.0, 1.0, 2.0, 0.0))
    pd_onnx(tmp_path / "nan.onnx", scale=float("nan"))
    pd_torchscript(tmp_path / "policy.pt")
    for name, says in (("text.onnx", "not an ONNX model"), ("wide.onnx", "wrong input width"),
                       ("nan.onnx", "NaN or infinite actions"),
                       ("policy.pt", "--trust-code")):
        assert main(["validate", name, "--suite", str(SUITE), "--episodes", "2"]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and name in err and says in err, err
    assert main(["validate", "policy.pt", "--suite", str(SUITE), "--episodes", "2",
                 "--trust-code", "--min-success", "0"]) == 0
    capsys.readouterr()
    # A suite on a backend that lives in another stage environment is evaluated there; the
    # policy is checked here first, and a missing environment is one line naming its make target.
    elsewhere = tmp_path / "isaaclab_suite.yaml"
    elsewhere.write_text(
        "name: on-isaaclab\ntask: reach-v0\nbackend: isaaclab\nscenes:\n"
        f"  - {{scene: {ROOT / 'sim_scenes' / 'reach' / 'nominal.yaml'}, episodes: 2, seed: 1}}\n")
    assert main(["validate", "text.onnx", "--suite", str(elsewhere)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    from stages.core.environments import get_environment

    if os.access(get_environment("isaaclab").python(), os.X_OK):
        assert "text.onnx" in err and "not an ONNX model" in err, err
    else:
        assert f"{elsewhere}: backend isaaclab" in err and "make isaaclab" in err, err


def test_an_mlflow_model_enters_by_its_onnx_flavor_only(
    flows_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import mlflow
    import mlflow.onnx
    import mlflow.pyfunc
    import onnx
    from mlflow.pyfunc import PythonModel

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    mlflow.set_experiment("someone-elses-models")
    onnx_model = onnx.load(str(pd_onnx(tmp_path / "pd.onnx")))
    with mlflow.start_run():
        mlflow.onnx.log_model(onnx_model, name="policy", registered_model_name="foreign-pd")

    class Anything(PythonModel):
        def predict(self, context: Any, model_input: Any,
                    params: dict[str, Any] | None = None) -> Any:
            raise AssertionError("a pickled model must never be loaded")

    with mlflow.start_run():
        mlflow.pyfunc.log_model(name="policy", python_model=Anything(), pip_requirements=[],
                                registered_model_name="pickled")
    code, report = run_json(capsys, "validate", "models:/foreign-pd/1", "--suite", str(SUITE),
                            "--json", "--episodes", "3", "--min-success", "0.4")
    assert code == 0 and report["policy_kind"] == "mlflow", report
    assert report["policy_digest"] == hashlib.sha256(onnx_model.SerializeToString()).hexdigest()
    assert main(["validate", "models:/pickled/1", "--suite", str(SUITE)]) == 2
    err = capsys.readouterr().err
    assert "no onnx flavor" in err and "python_function" in err


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_train_source_packages_validates_promotes_and_lineage_shows_the_source(
    mlflow_server: str, tmp_path: Path, cli_env: CliEnv
) -> None:
    policy = pd_onnx(tmp_path / "policy.onnx")
    config = {
        "name": "pendulum-imported", "task": "gymnasium:InvertedPendulum-v5",
        "train": {"source": "policy.onnx"},
        "validate": {"suite": str(SUITE), "min_success": 0.5, "video_episodes": 0},
        "package": {"latency_iters": 200},
        "promote": {"model_name": "pendulum-imported"},
    }
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    env = cli_env(tmp_path / ".physai", MLFLOW_TRACKING_URI=mlflow_server)
    run = flows("run", "pipeline.yaml", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "models:/pendulum-imported/1 -> @champion" in run.stdout
    lineage = flows("lineage", "models:/pendulum-imported@champion", env=env, cwd=tmp_path)
    assert lineage.returncode == 0, lineage.stderr[-2000:]
    digest = hashlib.sha256(policy.read_bytes()).hexdigest()
    assert f"policy {digest} verified" in " ".join(lineage.stdout.split())
    assert "import training run" in lineage.stdout
    assert f"source {digest} (onnx) {policy.resolve()}" in " ".join(
        lineage.stdout.split()), lineage.stdout
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    version = client.get_model_version_by_alias("pendulum-imported", "champion")
    train_run = client.get_run(version.tags["physai.train_run_id"])
    assert train_run.data.tags["physai.source.digest"] == digest
    # The bundle carries the ONNX bytes as given.
    import tarfile

    bundle = next((tmp_path / ".physai" / "store" / "objects").glob(
        f"*/{version.tags['physai.bundle.digest']}"))
    with tarfile.open(bundle) as tar:
        member = tar.extractfile("policy.onnx")
        assert member is not None and member.read() == policy.read_bytes()
    # The registered version validates from the command line through its stored policy.
    again = flows("validate", "models:/pendulum-imported@champion", "--suite", str(SUITE),
                  "--episodes", "2", "--min-success", "0", "--json", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    report = json.loads(again.stdout)
    assert report["policy_kind"] == "registry" and report["policy_digest"] == digest
    # The nightly regression guards it like any other champion.
    from stages.core.settings import resolve_settings
    from stages.pipeline.config import load_pipeline
    from stages.pipeline.nightly import run_nightly

    nightly = run_nightly(load_pipeline(tmp_path / "pipeline.yaml"), settings=resolve_settings(
        {"PHYSAI_HOME": env["PHYSAI_HOME"], "MLFLOW_TRACKING_URI": mlflow_server}))
    assert not nightly.regressed and nightly.policy_digest == digest
    assert [s.successes for s in nightly.scenes] == [20, 10]
    # A bad source: one line naming the config file and field, exit 2, no policy stored.
    (tmp_path / "broken.onnx").write_text("not a network")
    config["train"] = {"source": "broken.onnx"}
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(config))
    store = tmp_path / ".physai" / "store" / "artifacts"
    before = sorted(store.iterdir())
    bad = flows("run", "broken.yaml", "--direct", env=env, cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout[-2000:] + bad.stderr[-2000:]
    (line,) = [ln for ln in bad.stderr.splitlines() if ln.startswith("flows: error:")]
    assert "broken.yaml: train.source: not an ONNX model" in line
    assert sorted(store.iterdir()) == before

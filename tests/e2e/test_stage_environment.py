"""Stages in their own environments (stages/core/environments.py): ``validate: {environment:
isaaclab}`` runs each scene in the Isaac Lab venv's interpreter (``make isaaclab``; make test
builds it first), and a missing environment stops ``flows run`` in one line; a suite with
``backend: isaaclab`` runs there from ``flows run``, ``flows nightly``, ``flows validate`` and
``flows compare``, whatever the policy's source."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv, TinyConfig
from tests.support import run_flows

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _report(home: Path):  # type: ignore[no-untyped-def]
    from stages.storage.store import LocalStore

    store = LocalStore(home / "store")
    return [store.get(m.stem) for m in sorted((home / "store" / "artifacts").glob("*.json"))
            if json.loads(m.read_text())["kind"] == "sim_report"]


def test_missing_environment_stops_the_run_in_one_line_and_writes_nothing(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    config = tiny_config(validate={"environment": "isaaclab"})
    home = tmp_path / ".physai"
    done = run_flows("run", str(config), cwd=tmp_path, env=cli_env(
        home, PHYSAI_ENV_ISAACLAB_PYTHON=str(tmp_path / "no-venv" / "bin" / "python")))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (f"flows: error: {config}: validate.environment: stage environment "
                    f"'isaaclab' is not built ({tmp_path / 'no-venv' / 'bin' / 'python'} is "
                    "missing); build it with `make isaaclab`, or set PHYSAI_ENV_ISAACLAB_PYTHON "
                    "to its interpreter")
    assert not home.exists()
    unknown = run_flows("run", str(tiny_config("other.yaml", validate={"environment": "nope"})),
                        cwd=tmp_path, env=cli_env(home))
    assert unknown.returncode == 2 and "validate.environment" in unknown.stderr
    assert ("unknown stage environment 'nope'; valid: gymnasium-robotics, isaaclab, lerobot, "
            "metaworld") in unknown.stderr
    assert not home.exists()


def test_scenes_validated_in_the_isaaclab_environment_match_this_one(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    from stages.core.environments import get_environment

    python = get_environment("isaaclab").python()
    if not os.access(python, os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    home = tmp_path / ".physai"
    filmed = {"video_episodes": 1}
    there = run_flows("run", str(tiny_config(validate={"environment": "isaaclab", **filmed})),
                      cwd=tmp_path, env=cli_env(home))
    assert there.returncode == 0, there.stdout[-3000:] + there.stderr[-3000:]
    for scene in ("nominal", "heavy_payload", "noisy_sensors"):  # each scene's subprocess logs
        assert f"[isaaclab] validate {scene} 30/30" in there.stderr, there.stderr[-3000:]
    elsewhere = tmp_path / "here" / ".physai"  # a state folder of its own: nothing cached
    elsewhere.parent.mkdir()
    here = run_flows("run", str(tiny_config("here.yaml", validate=filmed)), cwd=elsewhere.parent,
                     env=cli_env(elsewhere))
    assert here.returncode == 0, here.stdout[-3000:] + here.stderr[-3000:]
    assert "[isaaclab]" not in here.stderr
    (first,), (second,) = _report(home), _report(elsewhere)
    strip = {"video_digest", "usd_digest"}
    assert [s.model_dump(exclude=strip) for s in first.scenes] == \
        [s.model_dump(exclude=strip) for s in second.scenes]
    assert all(s.usd_digest for s in first.scenes + second.scenes)


def test_job_variables_carry_the_environment_image(tiny_config: TinyConfig) -> None:
    from flows.workpools import job_variables
    from stages.pipeline.config import load_pipeline

    pipeline = load_pipeline(tiny_config(validate={"environment": "isaaclab"}))
    assert job_variables(pipeline, "validate")["job_variables"]["image"] == \
        "physai-flows-isaaclab:0.1.0"
    assert "image" not in job_variables(pipeline, "train")["job_variables"]
    assert "image" not in job_variables(load_pipeline(tiny_config("plain.yaml")),
                                        "validate")["job_variables"]


def _isaaclab_or_skip() -> None:
    from stages.core.environments import get_environment

    if not os.access(get_environment("isaaclab").python(), os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")


def test_an_isaaclab_suite_validates_there_against_mujoco_and_the_nightly_guards_it(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    """``backend: isaaclab`` runs every scene in the Isaac Lab environment with no
    ``validate.environment``; ``compare_backend: mujoco`` runs them here too, and the report,
    MLflow and the sim-to-sim gate carry both rates and their test; the nightly regression
    evaluates the champion on Isaac Lab again."""
    from mlflow import MlflowClient

    _isaaclab_or_skip()
    scenes = ROOT / "sim_scenes" / "reach"
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: reach-sim2sim\ntask: reach-v0\nbackend: isaaclab\ncompare_backend: mujoco\n"
        f"scenes:\n  - {{scene: {scenes / 'heavy_payload.yaml'}, episodes: 30, seed: 12}}\n")
    config = tiny_config(validate={"suite": str(suite), "sim_to_sim": {"gate": True},
                                   "video_episodes": 1})
    home = tmp_path / ".physai"
    env = cli_env(home)
    done = run_flows("run", str(config), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[isaaclab] validate heavy_payload 30/30" in done.stderr, done.stderr[-3000:]
    assert "[isaaclab] validate heavy_payload on mujoco" not in done.stderr
    (report,) = _report(home)
    assert report.backend == "isaaclab"
    version, newton, warp = report.backend_version.split(" ")
    assert version.startswith("3.") and newton.startswith("newton-") and \
        warp.startswith("warp-lang-")
    check = report.sim_to_sim
    assert check is not None and check.backend == "mujoco" and check.agrees
    assert [s.backend for s in report.scenes] == ["isaaclab"]
    assert [s.backend for s in check.scenes] == ["mujoco"]
    assert [a.scene for a in check.agreement] == ["heavy_payload"]
    for first, second, a in zip(report.scenes, check.scenes, check.agreement, strict=True):
        assert (a.first_successes, a.second_successes) == (first.successes, second.successes)
        assert a.difference_ci_low <= a.difference <= a.difference_ci_high
    gates = {g.name: g for g in report.gates}
    assert gates["sim_to_sim/heavy_payload"].passed
    assert report.passed
    assert all(s.usd_digest for s in report.scenes + check.scenes)
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    run = client.get_run(report.mlflow_run_id)
    assert run.data.params["backend_version"] == report.backend_version
    assert run.data.params["compare_backend"] == "mujoco"
    assert run.data.metrics["heavy_payload/mujoco/success_rate"] == check.scenes[0].success_rate
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "videos")}
    assert {"videos/heavy_payload.usda", "videos/heavy_payload-mujoco.usda"} <= artifacts
    nightly = run_flows("nightly", str(config), cwd=tmp_path, env=env)
    assert nightly.returncode == 0, nightly.stdout[-3000:] + nightly.stderr[-3000:]
    assert "[isaaclab] nightly heavy_payload" in nightly.stderr, nightly.stderr[-3000:]
    assert "No regression" in nightly.stdout and "REGRESSED" not in nightly.stdout
    assert "Finalize builder" not in done.stdout + nightly.stdout  # Newton's prints: stderr
    _the_champion_validates_on_isaaclab_from_the_cli_and_as_a_pipeline_source(
        "reach-tiny", env, tmp_path)


def _the_champion_validates_on_isaaclab_from_the_cli_and_as_a_pipeline_source(
    model: str, env: dict[str, str], tmp_path: Path
) -> None:
    """``flows validate models:/NAME@champion --suite S`` with ``backend: isaaclab`` in S
    evaluates the champion in the Isaac Lab stage environment (as a pipeline's validate stage
    does), ``flows compare`` evaluates both of its policies there, and a pipeline whose
    ``train.source`` is that champion validates there too."""
    # The nominal scene cut to 1 s (25 control steps): what these commands check is where the
    # policies run and what they report, and each Isaac Lab step costs the same for 3 worlds
    # as for 30, so the episode's length is most of their time.
    scene = yaml.safe_load((ROOT / "sim_scenes" / "reach" / "nominal.yaml").read_text())
    (tmp_path / "nominal.yaml").write_text(yaml.safe_dump({**scene, "episode_steps": 25}))
    suite = tmp_path / "suite_isaaclab.yaml"
    suite.write_text(
        "name: reach-on-isaaclab\ntask: reach-v0\nbackend: isaaclab\nscenes:\n"
        f"  - {{scene: {tmp_path / 'nominal.yaml'}, episodes: 3, seed: 7}}\n")
    done = run_flows("validate", f"models:/{model}@champion", "--suite", str(suite), "--json",
                     "--min-success", "0", cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[isaaclab] validate nominal 3/3" in done.stderr, done.stderr[-3000:]
    body = json.loads(done.stdout)
    assert body["policy_kind"] == "registry" and body["suite"] == "reach-on-isaaclab"
    (scene,) = body["scenes"]
    assert scene["episodes"] == 3 and len(scene["outcomes"]) == 3
    assert body["passed"] and body["mlflow_run_id"]
    # Both policies of a comparison run in one interpreter of the environment, on the same
    # episodes: the champion against its own version is not worse, scene by scene equal.
    compared = run_flows("compare", f"models:/{model}@champion", f"models:/{model}/1",
                         "--suite", str(suite), "--json", cwd=tmp_path, env=env, timeout=900)
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]
    assert compared.stderr.count("[isaaclab] validate nominal 3/3") == 2, compared.stderr[-3000:]
    verdict = json.loads(compared.stdout)
    assert verdict["worse"] is False and verdict["suite"] == "reach-on-isaaclab"
    (same,) = verdict["comparison"]["scenes"]
    assert same["difference"] == 0.0 and same["champion_successes"] == scene["successes"]

    config = {
        "name": "reach-from-champion", "task": "reach-v0",
        "train": {"source": f"models:/{model}@champion"},
        "validate": {"suite": str(suite), "min_success": 0.0, "video_episodes": 0},
        "package": {"latency_iters": 50, "max_latency_p99_ms": 20},
        "promote": {"model_name": "reach-from-champion"},
    }
    (tmp_path / "from_champion.yaml").write_text(yaml.safe_dump(config))
    piped = run_flows("run", "from_champion.yaml", cwd=tmp_path, env=env, timeout=900)
    assert piped.returncode == 0, piped.stdout[-3000:] + piped.stderr[-3000:]
    assert "[isaaclab] validate nominal 3/3" in piped.stderr, piped.stderr[-3000:]
    assert "models:/reach-from-champion/1 -> @champion" in piped.stdout, piped.stdout[-3000:]

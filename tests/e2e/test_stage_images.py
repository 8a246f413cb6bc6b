"""Stage environments in their images (flows/images.py, flows/image_run.py): ``flows images
launcher ENV`` writes an interpreter that runs in ENV's image, and pointed at by
``PHYSAI_ENV_<NAME>_PYTHON`` it runs that environment's steps in containers, through the same
door as the venv: a validation scene in the ``isaaclab`` image, an ACT import (LeRobot's own
export and parity check) in the ``lerobot`` one, on Python 3.12.

The first test runs everywhere. The image tests build each image once per content (minutes and
gigabytes: the isaaclab image is 4.1 GB, the lerobot one about 6), so they run on request:
``PHYSAI_TEST_STAGE_IMAGES=1``, where podman and mmdebstrap are installed (``make images``)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv
from tests.support import run_flows

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
ON_REQUEST = "PHYSAI_TEST_STAGE_IMAGES"

pytestmark = pytest.mark.e2e


def test_the_container_sees_the_images_code_and_no_credential(tmp_path: Path) -> None:
    """What ``podman run`` a launcher makes: the image's copy of the checkout's code, the
    caller's folders at their own paths, the checkout read-only, locations without their
    credentials, and the stage environments' interpreters left behind."""
    from flows.image_run import run_argv
    from flows.images import PROJECT_DIR

    home = tmp_path / "state"
    environ = {"PHYSAI_HOME": str(home), "PATH": "/usr/bin",
               "MLFLOW_TRACKING_URI": "http://alice:hunter2@127.0.0.1:5000",
               "AWS_SECRET_ACCESS_KEY": "hunter3", "HF_HUB_OFFLINE": "1",
               "PHYSAI_ENV_LEROBOT_PYTHON": "/x/lerobot-python", "PHYSAI_SIM_THREADS": "1"}
    script = ROOT / "stages" / "policies" / "lerobot_export.py"
    argv = run_argv("localhost/img:1", ["-I", str(script), str(tmp_path / "request.json"),
                                        str(FIXTURES / "suite_tiny.yaml")],
                    cwd=tmp_path, environ=environ)
    image = argv.index("localhost/img:1")
    assert argv[image + 1:] == ["/opt/venv/bin/python", "-I",
                                f"{PROJECT_DIR}/stages/policies/lerobot_export.py",
                                str(tmp_path / "request.json"),
                                str(FIXTURES / "suite_tiny.yaml")]
    volumes = [argv[i + 1] for i, a in enumerate(argv[:image]) if a == "-v"]
    assert f"{ROOT}:{ROOT}:ro" in volumes or any(
        ROOT.is_relative_to(v.split(":")[0]) for v in volumes), volumes
    mounted = [Path(v.split(":")[0]) for v in volumes]
    assert any(tmp_path.resolve().is_relative_to(m) for m in mounted)
    assert any(home.resolve().is_relative_to(m) for m in mounted)
    env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv[:image]) if a == "-e")
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert env["HF_HUB_OFFLINE"] == "1" and env["PHYSAI_SIM_THREADS"] == "1"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "PATH" not in env
    assert "PHYSAI_ENV_LEROBOT_PYTHON" not in env
    assert "hunter2" not in " ".join(argv) and "hunter3" not in " ".join(argv)


def _launcher(environment: str, tmp_path: Path) -> Path:
    """``environment``'s image built (once per content) and a launcher for it."""
    if os.environ.get(ON_REQUEST) != "1":
        pytest.skip(f"builds a stage image of gigabytes: run with {ON_REQUEST}=1")
    from flows.images import build_image, missing_tools

    missing = missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not found: `make images` cannot build images here")
    build_image(environment)
    done = run_flows("images", "launcher", environment, "--out", str(tmp_path / "bin"),
                     env=dict(os.environ), cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    launcher = tmp_path / "bin" / f"{environment}-python"
    assert f"={launcher}" in done.stdout
    return launcher


def test_a_scene_validates_in_the_isaaclab_image(tmp_path: Path, cli_env: CliEnv) -> None:
    """``flows validate`` of a suite on Isaac Lab, its one scene run in the isaaclab image."""
    import onnx
    from onnx import TensorProto, helper

    from stages.sim.tasks.catalog import get_task

    launcher = _launcher("isaaclab", tmp_path)
    task = get_task("reach-v0")
    weights = helper.make_tensor("w", TensorProto.FLOAT, (task.obs_dim, task.act_dim),
                                 [0.0] * (task.obs_dim * task.act_dim))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["actions"])], "still",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", task.obs_dim])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", task.act_dim])],
        [weights])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "still.onnx")
    scene = yaml.safe_load((ROOT / "sim_scenes" / "reach" / "nominal.yaml").read_text())
    (tmp_path / "nominal.yaml").write_text(yaml.safe_dump({**scene, "episode_steps": 25}))
    (tmp_path / "suite.yaml").write_text(
        "name: reach-in-image\ntask: reach-v0\nbackend: isaaclab\nscenes:\n"
        f"  - {{scene: {tmp_path / 'nominal.yaml'}, episodes: 3, seed: 7}}\n")
    env = {**cli_env(tmp_path / ".physai"), "PHYSAI_ENV_ISAACLAB_PYTHON": str(launcher)}
    since = _podman_now()
    done = run_flows("validate", "still.onnx", "--suite", "suite.yaml", "--json",
                     "--min-success", "0", cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[isaaclab] validate nominal 3/3" in done.stderr, done.stderr[-3000:]
    (result,) = json.loads(done.stdout)["scenes"]
    # A policy that never moves misses the target in every episode.
    assert result["episodes"] == 3 and result["failure_modes"] == {"missed": 3}
    assert _started(since, "isaaclab") >= 1


def _podman_now() -> str:
    """The time now, as podman's ``events --since`` takes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))


def _started(since: str, environment: str) -> int:
    """Containers of ``environment``'s image (as the checkout builds it) started since."""
    from flows.images import image_name, podman

    events = subprocess.run([*podman(), "events", "--stream=false", "--since", since,
                             "--filter", "event=start", "--format", "{{.Image}}"],
                            capture_output=True, text=True, timeout=120, check=True)
    return events.stdout.split().count(image_name(environment))


def test_an_act_import_runs_in_the_lerobot_image(tmp_path: Path, cli_env: CliEnv) -> None:
    """A tiny ACT trained by LeRobot in the lerobot image, then imported by ``flows validate``:
    the export and the parity check against ``select_action`` run in that image too."""
    launcher = _launcher("lerobot", tmp_path)
    probe = subprocess.run([str(launcher), "-c", "import sys, lerobot; "
                            "print(sys.version_info[:2], lerobot.__version__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert probe.stdout.split() == ["(3,", "12)", "0.6.1"], probe.stderr[-2000:]
    trained = subprocess.run([str(launcher), str(FIXTURES / "lerobot_act.py"),
                              str(tmp_path / "act")], cwd=tmp_path,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                             text=True, timeout=900)
    assert trained.returncode == 0, trained.stderr[-3000:]
    env = {**cli_env(tmp_path / ".physai"), "PHYSAI_ENV_LEROBOT_PYTHON": str(launcher)}
    config = yaml.safe_load((FIXTURES / "lerobot_act_tiny.yaml").read_text())
    config["validate"]["suite"] = str(FIXTURES / config["validate"]["suite"])
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    since = _podman_now()
    done = run_flows("run", "pipeline.yaml", cwd=tmp_path, env=env, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "models:/lerobot-act-tiny/1 -> @champion" in done.stdout, done.stdout[-3000:]
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / '.physai' / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version_by_alias("lerobot-act-tiny", "champion")
    params = client.get_run(version.tags["physai.train_run_id"]).data
    assert params.params["lerobot_version"] == "0.6.1"
    assert params.metrics["parity_max_abs_diff"] <= 1e-4
    assert _started(since, "lerobot") >= 1  # the export ran in the image

"""The reach template on a stock model it was not written for: Gymnasium's planar reacher,
unedited, from the task file that docs/extending.md shows, and what that needed (free joints,
joint ranges in the task file, 2-D workspaces, the template's own names, derived expert gains)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from physai_core.errors import ConfigError
from stages.core.resources import resolve_file
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import TaskSpec
from stages.sim.tasks.template import load_template, register_task_file
from stages.sim.tasks.template_config import EE_SITE, TARGET_BODY, ReachTemplateConfig

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "extending.md"
REACHER_XML = "pkg:gymnasium/envs/mujoco/assets/reacher.xml"
BLOCK = re.compile(r"^```\w+ title=(\S+)\n(.*?)^```$", re.S | re.M)
REQUIRED = {"template", "name", "model", "end_effector", "joints", "workspace", "control_hz",
            "success_distance"}


def doc_files(folder: Path) -> Path:
    """The doc's ``reacher/`` files written under ``folder``; returns that folder."""
    for title, body in BLOCK.findall(DOC.read_text()):
        if title.startswith("reacher/"):
            (folder / title).parent.mkdir(parents=True, exist_ok=True)
            (folder / title).write_text(body)
    return folder / "reacher"


@pytest.fixture(scope="module")
def reacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The doc's reacher folder, its task registered."""
    folder = doc_files(tmp_path_factory.mktemp("doc"))
    register_task_file(folder / "task.yaml")
    return folder


@pytest.fixture(scope="module")
def spec(reacher: Path) -> TaskSpec:
    """reacher-reach-v0, from the doc's task file."""
    return register_task_file(reacher / "task.yaml")


def test_the_doc_task_file_holds_only_the_required_fields(reacher: Path) -> None:
    required = {n for n, f in ReachTemplateConfig.model_fields.items() if f.is_required()}
    data = yaml.safe_load((reacher / "task.yaml").read_text())
    assert set(data) == required == REQUIRED
    assert data["model"] == REACHER_XML


def test_the_stock_reacher_is_a_planar_reach_task(spec: TaskSpec, reacher: Path) -> None:
    assert (spec.obs_dim, spec.act_dim, spec.control_hz) == (11, 2, 50)
    assert spec.target_names == ("x", "y") and spec.target_units == ("m", "m")
    assert spec.obs_names[-4:] == ("target.x", "target.y", "target_minus_ee.x",
                                   "target_minus_ee.y")
    assert resolve_file(REACHER_XML, ROOT) in spec.asset_files
    template = load_template(reacher / "task.yaml")
    model = template.edited_spec().compile()
    bodies = {model.body(i).name for i in range(model.nbody)}
    assert "target" not in bodies and TARGET_BODY in bodies
    assert model.site(EE_SITE).id >= 0 and model.nu == 2
    free = model.joint("joint0").id
    assert not model.jnt_limited[free] and not model.actuator_ctrllimited[0]
    assert model.actuator_ctrllimited[1] and list(model.actuator_ctrlrange[1]) == [-3.0, 3.0]
    assert template.expert.null_gain == 0.0 and 0 < template.expert.gain < 0.2
    env = spec.make_env(load_scene(reacher / "nominal.yaml"), 4, 0, num_threads=1)
    obs = env.reset()
    for _ in range(5):
        obs, _, _ = env.step(np.ones((4, 2)))
    assert obs.shape == (4, 11) and np.isfinite(obs).all()
    np.testing.assert_allclose(obs[:, 9:11], obs[:, 7:9] - obs[:, 4:6], atol=1e-5)
    assert env.episode_conditions()["target_y"].shape == (4,)


def test_the_default_expert_reaches_the_doc_nominal_targets(spec: TaskSpec, reacher: Path) -> None:
    suite = yaml.safe_load((reacher / "suite.yaml").read_text())
    (entry,) = suite["scenes"]
    env = spec.make_env(load_scene(reacher / entry["scene"]), entry["episodes"], entry["seed"],
                        num_threads=1)
    env.reset()
    for _ in range(env.episode_steps):
        env.step(env.expert_action())
    rate = float(env.success().mean())
    print(f"reacher default expert: {rate:.2f} of {entry['episodes']} nominal episodes")
    assert entry["episodes"] >= 50 and rate >= 0.9


def stock_task(folder: Path, name: str, **changes: object) -> Path:
    """The doc's reacher task file under the id ``name``, with some fields replaced."""
    data = yaml.safe_load((folder / "task.yaml").read_text()) | {"name": name} | changes
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_joint_ranges_bound_a_free_joint(reacher: Path) -> None:
    path = stock_task(reacher, "reacher-ranged-v0", joint_ranges={"joint0": [-1.5, 1.5]})
    model = load_template(path).edited_spec().compile()
    joint = model.joint("joint0").id
    assert model.jnt_limited[joint] and list(model.jnt_range[joint]) == [-1.5, 1.5]
    assert list(model.actuator_ctrlrange[0]) == [-1.5, 1.5]


def test_the_planar_workspace_can_lie_on_other_axes(reacher: Path) -> None:
    path = stock_task(reacher, "reacher-yx-v0",
                      workspace={"low": [-0.1, -0.1], "high": [0.1, 0.1], "axes": ["y", "x"]})
    spec = register_task_file(path)
    assert spec.target_names == ("y", "x") and spec.obs_names[7] == "target.y"


def test_a_model_that_uses_the_template_s_names_is_refused(reacher: Path) -> None:
    xml = resolve_file(REACHER_XML, ROOT).read_text()
    model = reacher / "renamed.xml"
    model.write_text(xml.replace("<!-- Arm -->", f'<body name="{TARGET_BODY}"/>'))
    path = stock_task(reacher, "reacher-clash-v0", model=str(model))
    with pytest.raises(ConfigError, match=f"has a body '{TARGET_BODY}'") as info:
        register_task_file(path)
    assert "\n" not in str(info.value) and info.value.problems[0].field == "model"


BAD = {
    "range of an uncontrolled joint": ({"joint_ranges": {"target_x": [-1, 1]}},
                                       "joint_ranges", "is not in joints"),
    "empty range": ({"joint_ranges": {"joint0": [1, 1]}}, "joint_ranges", "not below"),
    "corners of two sizes": ({"workspace": {"low": [0, 0], "high": [1, 1, 1]}}, "workspace",
                             "coordinates"),
    "four coordinates": ({"workspace": {"low": [0] * 4, "high": [1] * 4}}, "workspace.low",
                         "at most 3"),
    "axes not one per coordinate": ({"workspace": {"low": [0], "high": [1], "axes": ["x", "y"]}},
                                    "workspace", "distinct axes"),
    "end effector on a removed body": ({"end_effector": {"body": "target"}},
                                       "end_effector.body", "no such body"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_stock_task_file_is_one_line_naming_its_field(reacher: Path, case: str) -> None:
    changes, field, needle = BAD[case]
    path = stock_task(reacher, "reacher-bad-v0", **changes)
    with pytest.raises(ConfigError) as info:
        register_task_file(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and needle in message, message
    assert any(p.field.startswith(field) for p in info.value.problems), message


def test_a_scene_target_box_has_the_task_s_coordinates(spec: TaskSpec, reacher: Path) -> None:
    data = yaml.safe_load((reacher / "nominal.yaml").read_text())
    data["randomization"] |= {"target_low": [0.0, 0.0, 0.0], "target_high": [0.1, 0.1, 0.0]}
    scene = reacher / "three.yaml"
    scene.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"randomization\.target_low") as info:
        load_scene(scene)
    assert "has 3 coordinates" in str(info.value) and "x m, y m" in str(info.value)


def run_cli(*args: str) -> int:
    """``flows ARGS`` in this process; returns the exit status."""
    from flows.cli import main

    return main(list(args))


def collect_runs(home: Path) -> list[object]:
    """The collect stage's MLflow runs under ``home``."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(ids, "tags.`physai.stage` = 'collect'"))


@pytest.mark.e2e
def test_the_doc_reacher_pipeline_runs_through_the_cli(
    reacher: Path, physai_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load((reacher / "pipeline.yaml").read_text())
    data["collect"] |= {"episodes": 20, "num_worlds": 20}
    data["train"] |= {"epochs": 2, "hidden": [32, 32], "device": "cpu"}
    data["validate"] |= {"suite": "tiny_suite.yaml", "min_success": 0.0, "video_episodes": 0}
    # The latency gate is tested on its own; a busy machine's p99 is not the robot's.
    data["package"] = {"latency_iters": 50, "max_latency_p99_ms": 20}
    (reacher / "tiny.yaml").write_text(yaml.safe_dump(data))
    suite = yaml.safe_load((reacher / "suite.yaml").read_text())
    suite["scenes"][0]["episodes"] = 5
    (reacher / "tiny_suite.yaml").write_text(yaml.safe_dump(suite))
    assert run_cli("run", "--direct", str(reacher / "tiny.yaml")) == 0, capsys.readouterr().err
    (run,) = collect_runs(physai_home)
    assert run.data.metrics["expert_clean_success"] >= 0.9
    assert "models:/reacher/1 -> @champion" in capsys.readouterr().out


@pytest.mark.e2e
def test_an_expert_below_the_floor_stops_collect_naming_its_fields(
    reacher: Path, physai_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    former = {"gain": 0.2, "damping": 0.05, "null_gain": 0.1}  # the gains before they were derived
    task = stock_task(reacher, "reacher-former-v0", expert=former)
    for name in ("nominal.yaml", "suite.yaml", "pipeline.yaml"):
        text = (reacher / name).read_text().replace("reacher-reach-v0", "reacher-former-v0")
        (reacher / f"former-{name}").write_text(text.replace("task.yaml", task.name).replace(
            "nominal.yaml", "former-nominal.yaml").replace("suite.yaml", "former-suite.yaml"))
    pipeline = reacher / "former-pipeline.yaml"
    assert run_cli("run", "--direct", str(pipeline)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"flows: error: {task}: expert: ") and str(pipeline) in line, line
    assert "below collect.min_expert_success 0.9" in line, line
    assert "tune expert.gain, expert.damping and expert.null_gain" in line, line
    (run,) = collect_runs(physai_home)
    assert run.info.status == "FAILED" and run.data.metrics["expert_clean_success"] < 0.9
    assert not (physai_home / "store" / "artifacts").exists()

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from physai_core.errors import ConfigError
from stages.pipeline.config import load_pipeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of configs/ and sim_scenes/ that a test may edit."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "sim_scenes", tmp_path / "sim_scenes")
    return tmp_path


def edit(path: Path, change: dict[str, dict[str, object]]) -> None:
    data = yaml.safe_load(path.read_text())
    for section, fields in change.items():
        data.setdefault(section, {}).update(fields)
    path.write_text(yaml.safe_dump(data))


def test_default_config_loads_whole() -> None:
    pipeline = load_pipeline(ROOT / "configs" / "reach.yaml")
    assert pipeline.config.task == "reach-v0"
    assert len(pipeline.suite.scenes) >= 3
    assert len(pipeline.suite_digest) == 64


def test_misspelled_field_names_file_and_field(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"train": {"epocs": 5}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    message = str(err.value)
    assert str(cfg) in message and "train.epocs" in message and "unknown field" in message
    assert "\n" not in message


def test_every_problem_is_reported_at_once(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"train": {"lr": -1}, "collect": {"episodes": 0}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    fields = {p.field for p in err.value.problems}
    assert {"train.lr", "collect.episodes"} <= fields


def test_missing_scene_file_is_named(project: Path) -> None:
    (project / "sim_scenes" / "reach" / "noisy_sensors.yaml").unlink()
    with pytest.raises(ConfigError) as err:
        load_pipeline(project / "configs" / "reach.yaml")
    assert "noisy_sensors.yaml" in str(err.value)
    assert "suite.yaml" in str(err.value)


def test_missing_suite_reference_is_named(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"validate": {"suite": "../sim_scenes/reach/nope.yaml"}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    assert "validate.suite" in str(err.value) and "nope.yaml" in str(err.value)


def test_unknown_edge_target_lists_valid_ones(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"package": {"target": "jetson-agx-thorr"}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    assert "jetson-agx-thor" in str(err.value) and "package" in str(err.value)


def test_changing_a_validation_scene_changes_only_validation_digest(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    before = load_pipeline(cfg)
    scene = project / "sim_scenes" / "reach" / "wide_targets.yaml"
    scene.write_text(scene.read_text().replace("episode_steps: 100", "episode_steps: 101"))
    after = load_pipeline(cfg)
    assert after.stage_digest("validate") != before.stage_digest("validate")
    for stage in ("collect", "train", "package", "promote"):
        assert after.stage_digest(stage) == before.stage_digest(stage)


def test_every_shipped_config_loads() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name.startswith(("workpool", "k8s")):
            continue
        pipeline = load_pipeline(path)
        assert pipeline.stages[-4:] == ("train", "validate", "package", "promote"), path


def test_ppo_config_resolves_its_training_scene(project: Path) -> None:
    pipeline = load_pipeline(project / "configs" / "locomotion.yaml")
    assert pipeline.stages == ("train", "validate", "package", "promote")
    assert pipeline.train_scene is not None and pipeline.collect_scene is None
    assert pipeline.train_scene.config.name == "train"
    before = pipeline.stage_digest("train")
    edit(project / "configs" / "locomotion.yaml", {"train": {"resources": {"nproc_per_node": 8}}})
    assert load_pipeline(project / "configs" / "locomotion.yaml").stage_digest("train") == before
    scene = project / "sim_scenes" / "locomotion" / "train.yaml"
    scene.write_text(scene.read_text().replace("episode_steps: 250", "episode_steps: 200"))
    assert load_pipeline(project / "configs" / "locomotion.yaml").stage_digest("train") != before


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"train": {"algorithm": "sac"}}, "train.algorithm",
         "unknown algorithm 'sac'; valid: bc, import, lerobot, ppo"),
        ({"train": {"iterations": 0}}, "train.iterations", "greater than 0"),
        ({"train": {"epochs": 3}}, "train.epochs", "unknown field"),
        ({"collect": {"scene": "x.yaml", "episodes": 4}}, "collect", "reads no dataset"),
    ],
)
def test_bad_ppo_configs_are_named(
    project: Path, change: dict[str, dict[str, object]], field: str, says: str
) -> None:
    cfg = project / "configs" / "locomotion.yaml"
    edit(cfg, change)
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    message = str(err.value)
    assert f"{cfg}: {field}" in message and says in message, message
    assert err.value.exit_code == 2


def test_behaviour_cloning_without_collect_is_refused(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    data = yaml.safe_load(cfg.read_text())
    del data["collect"]
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError,
                       match=r"reach.yaml: collect: train.algorithm: bc learns from a dataset"):
        load_pipeline(cfg)


def test_behaviour_cloning_on_several_processes_is_refused_at_load(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["train"]["resources"] = {"nproc_per_node": 4}
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_pipeline(cfg)
    (problem,) = info.value.problems
    assert (problem.field, problem.value) == ("train.resources.nproc_per_node", 4)
    assert "bc trains in one process" in problem.message
    data["train"]["resources"] = {"nproc_per_node": 1, "gpus_per_node": 1}
    cfg.write_text(yaml.safe_dump(data))
    assert load_pipeline(cfg).stages[-1] == "promote"


def test_teacher_and_expert_must_agree(project: Path) -> None:
    student = project / "configs" / "locomotion_student.yaml"
    assert load_pipeline(student).stages[:3] == ("teacher", "collect", "train")
    edit(student, {"collect": {"expert": "scripted"}})
    with pytest.raises(ConfigError, match="teacher: the teacher is never used"):
        load_pipeline(student)
    data = yaml.safe_load(student.read_text())
    del data["teacher"]
    data["collect"]["expert"] = "teacher"
    student.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"collect\.expert: no teacher section"):
        load_pipeline(student)
    edit(student, {"collect": {"expert": "my-best-policy"}})
    with pytest.raises(ConfigError, match=r"collect.expert: .*unknown expert"):
        load_pipeline(student)
    for good in ("models:/locomotion@champion", "a" * 64, "sha256:" + "b" * 64):
        edit(student, {"collect": {"expert": good}})
        assert load_pipeline(student).config.collect.expert == good.removeprefix("sha256:")  # type: ignore[union-attr]


def test_student_config_reuses_the_locomotion_ppo_run_as_teacher() -> None:
    from stages.pipeline.run import stage_key

    trained = load_pipeline(ROOT / "configs" / "locomotion.yaml")
    taught = load_pipeline(ROOT / "configs" / "locomotion_student.yaml")
    assert stage_key("train", trained, ()) == stage_key("teacher", taught, ())


def test_a_scene_that_is_another_file_is_named_by_type_never_quoted(
    project: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:hunter2-secret:/root:/bin/bash\n")
    cfg = project / "configs" / "reach.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["collect"]["scene"] = str(secret)
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_pipeline(cfg)
    message = str(info.value)
    assert "hunter2" not in message and "root:x" not in message
    assert f"{secret}: expected a scene file (a mapping with name, task, episode_steps), " \
        "found a str" in message


@pytest.mark.parametrize(("section", "change", "field", "says"), [
    ("train", {"hidden": [10_000_000, 10_000_000]}, "train.hidden", "GiB to train"),
    ("collect", {"episodes": 10**9}, "collect.episodes", "recorded steps"),
])
def test_sizes_that_cannot_fit_are_refused_at_load_with_the_estimate(
    project: Path, section: str, change: dict[str, object], field: str, says: str
) -> None:
    cfg = project / "configs" / "reach.yaml"
    data = yaml.safe_load(cfg.read_text())
    data[section].update(change)
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_pipeline(cfg)
    (problem,) = info.value.problems
    assert problem.field == field and says in problem.message and "more than" in problem.message
    assert not (project / ".physai").exists()


def test_loading_a_config_imports_no_simulator_or_trainer() -> None:
    """Reading a config (flows check, the CLI, a worker resolving its stage) loads no MuJoCo,
    torch, MLflow or Prefect. (A task from a model file reads it with MuJoCo, and a gymnasium:
    task makes its environment to learn its spaces; those load what they need.)"""
    import subprocess
    import sys

    code = ("import sys\nfrom stages.pipeline.config import load_pipeline\n"
            "for c in ('configs/reach.yaml', 'configs/locomotion.yaml'):\n"
            "    load_pipeline(c)\n"
            "print(sorted(m for m in ('mujoco', 'torch', 'mlflow', 'prefect') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout

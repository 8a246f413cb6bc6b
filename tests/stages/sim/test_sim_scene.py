"""Scene and suite loading: every problem names file, field and value; the suite digest."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from physai_core.errors import ConfigError
from stages.sim.scenes.scene import RandomizationConfig, SceneConfig
from stages.sim.suites.digest import suite_digest
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.suites.suite import SuiteConfig, SuiteEntry
from stages.sim.tasks import catalog as tasks
from stages.sim.tasks.catalog import get_task

REACH = Path(__file__).resolve().parents[3] / "sim_scenes" / "reach"

GOOD_SCENE = """\
name: s
task: reach-v0
episode_steps: 50
randomization:
  target_low: [0.4, -0.1, 0.2]
  target_high: [0.5, 0.1, 0.3]
"""


def write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` and return the path."""
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    """A copy of sim_scenes/reach (scenes and suite) in a temporary folder."""
    target = tmp_path / "reach"
    shutil.copytree(REACH, target)
    return target


def test_repository_suite_loads() -> None:
    suite = load_suite(REACH / "suite.yaml")
    assert [s.scene.name for s in suite.scenes] == [
        "nominal",
        "heavy_payload",
        "noisy_sensors",
        "wide_targets",
    ]
    assert all(s.episodes == 100 for s in suite.scenes)
    assert len({s.seed for s in suite.scenes}) == len(suite.scenes)
    assert len(suite.digest) == 64


def test_config_fields_are_documented() -> None:
    for model in (RandomizationConfig, SceneConfig, SuiteEntry, SuiteConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("episode_steps: 50", "episode_step: 50", "episode_step", "unknown field"),
        ("episode_steps: 50", "episode_steps: 0", "episode_steps", "greater than 0"),
        ("task: reach-v0", "task: rech-v0", "task", "did you mean 'reach-v0'"),
        ("[0.5, 0.1, 0.3]", "[0.3, 0.1, 0.3]", "randomization.target_high", "target_low"),
        ("[0.5, 0.1, 0.3]", "[0.5, 0.1, 1.5]", "randomization.target_high", "workspace"),
        (
            "target_low: [0.4, -0.1, 0.2]",
            "target_low: [0.4, -0.1, 0.2]\n  mass_scale: [0, 1]",
            "randomization.mass_scale",
            "0 < low <= high",
        ),
        (
            "target_low: [0.4, -0.1, 0.2]",
            "target_low: [0.4, -0.1, 0.2]\n  obs_noise_std: -1",
            "randomization.obs_noise_std",
            "greater than or equal to 0",
        ),
        ("[0.5, 0.1, 0.3]", "[0.5, .nan, 0.3]", "randomization.target_high.1", "finite number"),
    ],
)
def test_bad_scene_names_file_and_field(
    tmp_path: Path, old: str, new: str, field: str, words: str
) -> None:
    path = write(tmp_path / "bad.yaml", GOOD_SCENE.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    message = str(info.value)
    assert f"{path}: {field}:" in message
    assert words in message
    assert info.value.exit_code == 2


def test_unknown_task_lists_valid_tasks(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", GOOD_SCENE.replace("reach-v0", "push-v0"))
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.field, problem.value) == (str(path), "task", "push-v0")
    valid = problem.message.split("valid: ", 1)[1]
    assert "locomotion-v0, " in valid and "reach-v0" in valid and "gymnasium:<id>" in valid


def test_missing_scene_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_scene(tmp_path / "absent.yaml")


def test_every_suite_problem_is_reported_at_once(suite_dir: Path) -> None:
    suite = suite_dir / "suite.yaml"
    text = suite.read_text(encoding="utf-8")
    text = text.replace("episodes: 100, seed: 1000", "episodes: -5, seed: 1000")
    text = text.replace("seed: 2000", "sed: 2000")
    write(suite, text)
    with pytest.raises(ConfigError) as info:
        load_suite(suite)
    fields = {p.field for p in info.value.problems}
    assert {"scenes.0.episodes", "scenes.1.sed", "scenes.1.seed"} <= fields
    assert f"{suite}: scenes.0.episodes:" in str(info.value)


def test_suite_with_missing_scene_file(suite_dir: Path) -> None:
    (suite_dir / "noisy_sensors.yaml").unlink()
    with pytest.raises(ConfigError) as info:
        load_suite(suite_dir / "suite.yaml")
    (problem,) = info.value.problems
    assert problem.file == str(suite_dir / "suite.yaml")
    assert problem.field == "scenes.2.scene"
    assert problem.value == "noisy_sensors.yaml"
    assert problem.message == f"scene file not found: {suite_dir / 'noisy_sensors.yaml'}"


def test_suite_reports_problems_inside_its_scenes(suite_dir: Path) -> None:
    scene = suite_dir / "wide_targets.yaml"
    write(scene, scene.read_text(encoding="utf-8").replace("episode_steps", "episode_stepz"))
    with pytest.raises(ConfigError) as info:
        load_suite(suite_dir / "suite.yaml")
    assert f"{scene}: episode_stepz: unknown field" in str(info.value)


def test_suite_rejects_repeated_scenes(suite_dir: Path) -> None:
    suite = suite_dir / "suite.yaml"
    write(suite, suite.read_text(encoding="utf-8").replace("heavy_payload.yaml", "nominal.yaml"))
    with pytest.raises(ConfigError, match="scenes: scene files listed more than once"):
        load_suite(suite)
    shutil.copy(suite_dir / "nominal.yaml", suite_dir / "nominal_copy.yaml")
    write(suite, suite.read_text(encoding="utf-8").replace("nominal.yaml", "nominal_copy.yaml", 1))
    with pytest.raises(
        ConfigError, match=r"scenes\.1\.scene: scene name 'nominal' is already used"
    ):
        load_suite(suite)


def test_suite_rejects_unknown_backend_and_empty_scene_list(tmp_path: Path) -> None:
    path = write(tmp_path / "suite.yaml", "name: x\ntask: reach-v0\nbackend: bullet\nscenes: []\n")
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    assert {p.field for p in info.value.problems} == {"backend", "scenes"}


def test_scene_task_must_match_suite_task(suite_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = dataclasses.replace(get_task("reach-v0"), name="reach-other-v0")
    monkeypatch.setitem(tasks.TASKS._items, other.name, other)
    scene = suite_dir / "nominal.yaml"
    write(scene, scene.read_text(encoding="utf-8").replace("reach-v0", other.name))
    with pytest.raises(ConfigError) as info:
        load_suite(suite_dir / "suite.yaml")
    (problem,) = info.value.problems
    assert (problem.file, problem.field, problem.value) == (str(scene), "task", other.name)
    assert "reach-v0" in problem.message


def test_digest_does_not_depend_on_suite_location(suite_dir: Path) -> None:
    assert load_suite(suite_dir / "suite.yaml").digest == load_suite(REACH / "suite.yaml").digest


def test_digest_changes_with_a_scene_byte(suite_dir: Path) -> None:
    before = load_suite(suite_dir / "suite.yaml").digest
    scene = suite_dir / "heavy_payload.yaml"
    scene.write_bytes(scene.read_bytes() + b"\n")
    assert load_suite(suite_dir / "suite.yaml").digest != before


@pytest.mark.parametrize(
    ("old", "new"),
    [("episodes: 100, seed: 3000", "episodes: 99, seed: 3000"), ("seed: 4000", "seed: 4001")],
)
def test_digest_changes_with_episodes_and_seeds(suite_dir: Path, old: str, new: str) -> None:
    suite = suite_dir / "suite.yaml"
    before = load_suite(suite).digest
    write(suite, suite.read_text(encoding="utf-8").replace(old, new))
    assert load_suite(suite).digest != before


def test_digest_covers_the_task_assets(suite_dir: Path) -> None:
    suite = load_suite(suite_dir / "suite.yaml")
    spec = get_task("reach-v0")
    assert suite.digest == suite_digest(
        suite.config.task, suite.config.backend, suite.scenes, spec.asset_files
    )
    mjcf = suite_dir / "arm7.xml"
    mjcf.write_bytes(mjcf.read_bytes().replace(b'kp="600"', b'kp="601"', 1))
    changed = suite_digest(suite.config.task, suite.config.backend, suite.scenes, (mjcf,))
    assert changed != suite.digest


def test_digest_changes_with_the_mujoco_version(
    suite_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    from stages.sim.backends import catalog as backends
    before = load_suite(suite_dir / "suite.yaml").digest
    real = importlib.metadata.version
    monkeypatch.setattr(backends, "version",
                        lambda dist: "0.0.0" if dist == "mujoco" else real(dist))
    assert load_suite(suite_dir / "suite.yaml").digest != before


LOCOMOTION = REACH.parent / "locomotion"

GOOD_LOCOMOTION_SCENE = """\
name: s
task: locomotion-v0
episode_steps: 100
randomization:
  target_low: [0.1, 0.0, 0.0]
  target_high: [0.5, 0.0, 0.0]
"""


def test_repository_locomotion_suite_loads() -> None:
    suite = load_suite(LOCOMOTION / "suite.yaml")
    assert suite.config.task == "locomotion-v0"
    assert [s.scene.name for s in suite.scenes] == [
        "flat",
        "heavy_payload",
        "low_friction",
        "pushes",
    ]
    assert len({s.seed for s in suite.scenes}) == len(suite.scenes)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ("  push_speed: [0.1, 0.2]", "randomization.push_speed", "unknown field"),
        ("  mass_scale: [-0.5, 1.2]", "randomization.mass_scale", "0 < low <= high"),
        ("  payload_mass: [-1.0, 2.0]", "randomization.payload_mass", "0 <= low <= high"),
        ("  payload_mass: [3.0, 2.0]", "randomization.payload_mass", "0 <= low <= high"),
        (
            "  contact_friction_scale: [0.0, 1.0]",
            "randomization.contact_friction_scale",
            "0 < low <= high",
        ),
        (
            "  push_velocity: [0.2, 0.5]",
            "randomization.push_interval_steps",
            "needed when push_velocity is above zero",
        ),
        (
            "  push_interval_steps: [10, 20]",
            "randomization.push_interval_steps",
            "pushes need push_velocity above zero",
        ),
        (
            "  push_velocity: [0.2, 0.5]\n  push_interval_steps: [0, 20]",
            "randomization.push_interval_steps",
            "1 <= low <= high",
        ),
        (
            "  push_velocity: [0.5, 0.2]\n  push_interval_steps: [10, 20]",
            "randomization.push_velocity",
            "0 <= low <= high",
        ),
    ],
)
def test_bad_locomotion_randomization_names_file_and_field(
    tmp_path: Path, extra: str, field: str, words: str
) -> None:
    path = write(tmp_path / "bad.yaml", GOOD_LOCOMOTION_SCENE + extra + "\n")
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    message = str(info.value)
    assert f"{path}: {field}:" in message
    assert words in message


def test_command_outside_the_gait_range_is_rejected(tmp_path: Path) -> None:
    text = GOOD_LOCOMOTION_SCENE.replace("[0.5, 0.0, 0.0]", "[1.5, 0.0, 0.0]")
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.field) == (str(path), "randomization.target_high")
    assert "outside the workspace of 'locomotion-v0'" in problem.message
    assert "vx m/s" in problem.message


def test_pushes_on_a_fixed_base_are_rejected(tmp_path: Path) -> None:
    text = GOOD_SCENE + "  push_velocity: [0.2, 0.5]\n  push_interval_steps: [10, 20]\n"
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.field) == (str(path), "randomization.push_velocity")
    assert "fixed base" in problem.message


def test_missing_task_asset_is_a_config_error_before_any_simulation(
    suite_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "gone" / "arm7.xml"
    spec = dataclasses.replace(get_task("reach-v0"), asset_files=(missing,))
    monkeypatch.setitem(tasks.TASKS._items, "reach-v0", spec)
    scene = suite_dir / "nominal.yaml"
    with pytest.raises(ConfigError) as info:
        load_scene(scene)
    (problem,) = info.value.problems
    assert (problem.file, problem.field, problem.value) == (str(scene), "task", "reach-v0")
    assert str(missing) in problem.message
    assert f"{scene}: task: asset file of the task not found" in str(info.value)
    with pytest.raises(ConfigError) as suite_info:
        load_suite(suite_dir / "suite.yaml")
    assert {p.field for p in suite_info.value.problems} == {"task"}
    assert len(suite_info.value.problems) == 4


def test_locomotion_pipeline_config_names_the_locomotion_scenes() -> None:
    from stages.pipeline.config import load_pipeline

    configs = REACH.parents[1] / "configs"
    pipeline = load_pipeline(configs / "locomotion.yaml")
    assert pipeline.config.task == "locomotion-v0"
    assert pipeline.train_scene is not None
    assert pipeline.train_scene.config.task == "locomotion-v0"
    scripted = load_pipeline(configs / "locomotion_scripted.yaml")
    assert scripted.collect_scene is not None
    assert scripted.collect_scene.config.task == "locomotion-v0"
    assert pipeline.suite.digest == load_suite(LOCOMOTION / "suite.yaml").digest
    assert pipeline.config.package.control_hz == get_task("locomotion-v0").control_hz


def test_replace_makes_a_validated_variant_and_leaves_the_scene_alone() -> None:
    from pydantic import ValidationError

    scene = load_scene(REACH / "nominal.yaml")
    heavy = scene.replace(episode_steps=20, mass_scale=(1.2, 1.4))
    assert heavy.config.episode_steps == 20
    assert heavy.config.randomization.mass_scale == (1.2, 1.4)
    assert scene.config.randomization.mass_scale == (1.0, 1.0)
    assert heavy.path == scene.path
    with pytest.raises(ValidationError):
        scene.replace(mass_scale=(-1.0, 1.0))


def test_a_sweep_names_sweepable_fields_and_expands_to_its_grid(tmp_path: Path) -> None:
    from stages.sim.scenes.scene import point_label, sweep_variant

    path = write(tmp_path / "s.yaml", GOOD_SCENE + "sweep: {friction_scale: [0.5, 1.0], "
                 "action_delay_steps: [0, 2]}\n")
    scene = load_scene(path)
    grid = scene.config.sweep_points()
    assert grid == [{"friction_scale": 0.5, "action_delay_steps": 0},
                    {"friction_scale": 0.5, "action_delay_steps": 2},
                    {"friction_scale": 1.0, "action_delay_steps": 0},
                    {"friction_scale": 1.0, "action_delay_steps": 2}]
    held = sweep_variant(scene, grid[1])
    assert held.config.randomization.friction_scale == (0.5, 0.5)
    assert held.config.randomization.action_delay_steps == 2 and held.config.sweep == {}
    assert held.config.randomization.target_low == scene.config.randomization.target_low
    assert point_label(grid[1]) == "friction_scale=0.5, action_delay_steps=2"
    suite = write(tmp_path / "suite.yaml", "name: x\ntask: reach-v0\nscenes:\n"
                  "  - {scene: s.yaml, episodes: 7, seed: 3}\n")
    loaded = load_suite(suite)
    assert loaded.runs == 1 + 4 and loaded.sweep_point(0) is None
    backend, (variant, episodes, seed) = loaded.run(2)
    assert (backend, episodes, seed) == ("mujoco", 7, 3) and loaded.sweep_point(2) == grid[1]
    assert variant.config.randomization.friction_scale == (0.5, 0.5)
    for bad, words in (("sweep: {target_low: [0.1]}", "cannot sweep target_low"),
                       ("sweep: {friction_scale: []}", "needs distinct values")):
        with pytest.raises(ConfigError) as info:
            load_scene(write(tmp_path / "bad.yaml", GOOD_SCENE + bad + "\n"))
        assert f"{tmp_path / 'bad.yaml'}: sweep:" in str(info.value) and words in str(info.value)


def test_a_scene_without_a_sweep_adds_no_validation(tmp_path: Path) -> None:
    write(tmp_path / "s.yaml", GOOD_SCENE)
    suite = load_suite(write(tmp_path / "suite.yaml", "name: x\ntask: reach-v0\nscenes:\n"
                             "  - {scene: s.yaml, episodes: 7, seed: 3}\n"))
    assert suite.sweeps == () and suite.runs == 1

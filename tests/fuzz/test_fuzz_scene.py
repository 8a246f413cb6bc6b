"""Fuzzing scene and suite files: every mutation of a shipped scene or suite loads, or is one
ConfigError line naming file, field and value, exit status 2, with nothing written."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks.template import register_task_file
from tests.fuzz.fuzzing import (
    check_rejected_share,
    check_unknown_fields_rejected,
    edited,
    examples,
    load_yaml_input,
    text_edits,
    yaml_bytes,
)

if TYPE_CHECKING:

    from tests.fuzz.conftest import Tally

ROOT = Path(__file__).resolve().parents[2]


def _is_suite(path: Path) -> bool:
    """Whether the YAML file at ``path`` is a suite (it lists scenes)."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and "scenes" in data


SCENE_FILES = sorted(p for p in (ROOT / "sim_scenes").glob("*/*.yaml")
                     if p.name != "task.yaml" and not _is_suite(p))
for task_file in sorted((ROOT / "sim_scenes").glob("*/task.yaml")):  # template tasks
    register_task_file(task_file)
SCENES: dict[str, Any] = {str(p.relative_to(ROOT)): yaml.safe_load(p.read_text())
                          for p in SCENE_FILES}
"""Every scene the project ships: reach, locomotion (with and without pushes), the template's
pusher arm and a Gymnasium environment."""


def _suite(path: Path) -> Any:
    """A suite file with its scene references made absolute."""
    tree = yaml.safe_load(path.read_text())
    for entry in tree["scenes"]:
        entry["scene"] = str((path.parent / entry["scene"]).resolve())
    return tree


SUITES = {str(p.relative_to(ROOT)): _suite(p) for p in
          [*sorted(p for p in (ROOT / "sim_scenes").glob("*/*.yaml") if _is_suite(p)),
           ROOT / "tests" / "fixtures" / "suite_tiny.yaml"]}
"""Every suite the project ships, and the tests' tiny one."""

SCENE_CROSS = {"task": {"randomization"}, "randomization": {"randomization"}}
"""A scene's task decides its workspace and whether it can be pushed; within randomization,
target_low bounds target_high and push_velocity needs push_interval_steps."""


@examples(400)
@given(base=st.sampled_from(sorted(SCENES)), data=st.data())
def test_edited_scene_loads_or_names_file_field_and_value(
    base: str, data: st.DataObject, tally: Tally
) -> None:
    tree, edits = data.draw(edited(SCENES[base]), label="edits")
    load_yaml_input(load_scene, yaml_bytes(tree), "scene.yaml",
                    partial(tally.record, "scene (fields)"), edits, SCENE_CROSS)


@examples(200)
@given(base=st.sampled_from(sorted(SCENES)), data=st.data())
def test_corrupted_scene_text_loads_or_names_the_file(
    base: str, data: st.DataObject, tally: Tally
) -> None:
    corrupted = data.draw(text_edits(yaml.safe_dump(SCENES[base]).encode()), label="text")
    load_yaml_input(load_scene, corrupted, "scene.yaml", partial(tally.record, "scene (bytes)"))


@examples(250)
@given(base=st.sampled_from(sorted(SUITES)), data=st.data())
def test_edited_suite_loads_or_names_file_field_and_value(
    base: str, data: st.DataObject, tally: Tally
) -> None:
    tree, edits = data.draw(edited(SUITES[base]), label="edits")
    load_yaml_input(load_suite, yaml_bytes(tree), "suite.yaml",
                    partial(tally.record, "suite (fields)"), edits, {"task": {"scenes"}})


@examples(100)
@given(base=st.sampled_from(sorted(SUITES)), data=st.data())
def test_corrupted_suite_text_loads_or_names_the_file(
    base: str, data: st.DataObject, tally: Tally
) -> None:
    corrupted = data.draw(text_edits(yaml.safe_dump(SUITES[base]).encode()), label="text")
    load_yaml_input(load_suite, corrupted, "suite.yaml", partial(tally.record, "suite (bytes)"))


def test_the_unchanged_scenes_and_suites_load() -> None:
    for name, tree in [*SCENES.items(), *SUITES.items()]:
        outcomes: list[str] = []
        load_yaml_input(load_suite if name in SUITES else load_scene, yaml_bytes(tree),
                        Path(name).name, outcomes.append)
        assert outcomes == ["loaded"], name


def test_an_inserted_unknown_field_is_rejected_everywhere() -> None:
    tried = 0
    for name, tree in SCENES.items():
        tried += check_unknown_fields_rejected(load_scene, tree, Path(name).name,
                                               free=(("make_kwargs",),))
    for name, tree in SUITES.items():
        tried += check_unknown_fields_rejected(load_suite, tree, Path(name).name)
    assert tried >= 40, tried


def test_enough_mutated_scenes_and_suites_were_rejected() -> None:
    check_rejected_share("scene (fields)", 0.8)
    check_rejected_share("scene (bytes)", 0.8)
    check_rejected_share("suite (fields)", 0.8)
    check_rejected_share("suite (bytes)", 0.8)

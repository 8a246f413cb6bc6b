"""Fuzzing pipeline configs: every mutation of a valid config loads, or is one ConfigError line
naming file, field and value, exit status 2, with nothing written."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from stages.pipeline.config import load_pipeline
from tests.fuzz.fuzzing import (
    check_rejected_share,
    check_unknown_fields_rejected,
    edited,
    examples,
    listing,
    load_yaml_input,
    text_edits,
    yaml_bytes,
)

if TYPE_CHECKING:
    from tests.conftest import CliEnv
    from tests.fuzz.conftest import Tally

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
REFS = (("collect", "scene"), ("train", "scene"), ("teacher", "scene"), ("validate", "suite"))
"""Fields that name another file, relative to the config."""

CROSS = {"task": {"collect", "train", "teacher", "validate"}, "train": {"collect", "train"},
         "collect": {"teacher", "train"}, "teacher": {"collect"}}
"""Sections whose change can make another section wrong: a different task makes every scene's
task differ; train.algorithm decides which train fields exist and whether collect is needed;
collect.expert needs a teacher."""


def _absolute(name: str) -> dict[str, Any]:
    """A fixture config with its scene and suite references made absolute."""
    tree: dict[str, Any] = yaml.safe_load((FIXTURES / name).read_text())
    for section, field in REFS:
        if isinstance(tree.get(section), dict) and field in tree[section]:
            tree[section][field] = str((FIXTURES / tree[section][field]).resolve())
    return tree


BASES = {name: _absolute(name) for name in ("reach_tiny.yaml", "ppo_tiny.yaml",
                                            "student_tiny.yaml")}
"""Valid configs of every shape: behaviour cloning, PPO, and a PPO teacher with a student."""


@examples(400)
@given(base=st.sampled_from(sorted(BASES)), data=st.data())
def test_edited_config_loads_or_names_file_field_and_value(
    base: str, data: st.DataObject, tally: Tally
) -> None:
    tree, edits = data.draw(edited(BASES[base]), label="edits")
    load_yaml_input(load_pipeline, yaml_bytes(tree), "pipeline.yaml",
                    partial(tally.record, "pipeline config (fields)"), edits, CROSS)


@examples(250)
@given(base=st.sampled_from(sorted(BASES)), data=st.data())
def test_corrupted_config_text_loads_or_names_the_file(
    base: str, data: st.DataObject, tally: Tally
) -> None:
    text = yaml.safe_dump(BASES[base]).encode()
    corrupted = data.draw(text_edits(text), label="text")
    load_yaml_input(load_pipeline, corrupted, "pipeline.yaml",
                    partial(tally.record, "pipeline config (bytes)"))


def test_the_unchanged_bases_load() -> None:
    for name, tree in BASES.items():
        outcomes: list[str] = []
        load_yaml_input(load_pipeline, yaml_bytes(tree), name, outcomes.append)
        assert outcomes == ["loaded"], name


BAD_SCENE = "name: s\ntask: reach-v0\nepisode_steps: -3\nrandomization: {target_low: [0, 0, 0]}\n"

CLI_CASES: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "unknown field": ({"train": {"epochs": 1, "epocs": 5}}, "config", ("train.epocs", "5")),
    "bad YAML": ("name: [unclosed\n", "config", ("invalid YAML",)),
    "bad scene": ({"collect": {"scene": "scene.yaml"}}, "scene.yaml",
                  ("episode_steps", "-3", "randomization.target_high")),
}
"""A bad config, bad YAML, and a bad scene the config refers to: what to write, the file the
error must name, and what else it must say."""


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_rejects_bad_input_in_one_line_with_status_two(
    case: str, tmp_path: Path, cli_env: CliEnv
) -> None:
    change, named, fragments = CLI_CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    config = work / "pipeline.yaml"
    if isinstance(change, str):
        config.write_text(change)
    else:
        tree = BASES["reach_tiny.yaml"]
        config.write_text(yaml.safe_dump({k: ({**v, **change[k]} if k in change else v)
                                          for k, v in tree.items()}))
    (work / "scene.yaml").write_text(BAD_SCENE)
    before = listing(tmp_path)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config)], cwd=work,
                          env=cli_env(tmp_path / "home"), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("flows: error: ") and done.stderr.count("\n") == 1, done.stderr
    path = config if named == "config" else work / named
    for fragment in (str(path), *fragments):
        assert fragment in done.stderr, (fragment, done.stderr)
    assert listing(tmp_path) == before


def test_an_inserted_unknown_field_is_rejected_everywhere() -> None:
    tried = sum(check_unknown_fields_rejected(load_pipeline, tree, "pipeline.yaml",
                                              free=(("validate", "scene_min_success"),))
                for tree in BASES.values())
    assert tried >= 15, tried


def test_enough_mutated_configs_were_rejected() -> None:
    check_rejected_share("pipeline config (fields)", 0.8)
    check_rejected_share("pipeline config (bytes)", 0.8)

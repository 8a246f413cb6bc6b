"""docs/configuration.md is every key the models take, and every key our shipped files use is
on it; ``flows keys`` prints it with a plugin's algorithm added."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import Field

from flows.cli import main
from stages.core.schema import FrozenModel
from stages.pipeline.config_reference import reference, type_name
from stages.training.algorithms import ALGORITHMS, AlgorithmSpec, register_algorithm

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"


def page_keys(text: str) -> dict[str, dict[str, str]]:
    """The keys of each section of a reference page and their types, by the section's title."""
    sections: dict[str, dict[str, str]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
            sections[title] = {}
        elif found := re.match(r"\| `([^`]+)` \| ((?:[^|\\]|\\.)+) \|", line):
            sections[title][found.group(1)] = found.group(2)
    return sections


def used_keys(data: Any, prefix: str = "") -> Iterator[str]:
    """Every key a YAML document uses, dotted, list items as ``[]``."""
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        yield prefix + str(key)
        if isinstance(value, dict):
            yield from used_keys(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            for item in value:
                yield from used_keys(item, f"{prefix}{key}[].")


def documented(key: str, keys: dict[str, str]) -> bool:
    """Whether ``key`` is on the page: itself or with names in place of some parts
    (``geom_colours.<name>``), or under a documented mapping of free names
    (``scene_min_success``, whose keys are scene names)."""
    parts = key.split(".")
    for named in itertools.product(*[(p, "<name>") for p in parts]):
        if ".".join(named) in keys:
            return True
        if any(keys.get(".".join(named[:i]), "").startswith("mapping of")
               for i in range(1, len(parts))):
            return True
    return False


def shipped_files() -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every YAML mapping the project ships: configs, scenes, suites, task files."""
    for path in sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("sim_scenes/**/*.yaml"),
                        *ROOT.glob("examples/*/src/*/**/*.yaml")]):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict):
            yield path, data


def test_the_page_is_what_the_models_take() -> None:
    assert PAGE.read_text() == reference(shipped_only=True), (
        "docs/configuration.md is out of date: .venv/bin/flows keys --shipped > "
        "docs/configuration.md")


def test_every_key_of_every_shipped_file_is_on_the_page() -> None:
    sections = page_keys(PAGE.read_text())
    checked = 0
    for path, data in shipped_files():
        if "template" in data:
            titles = ["Task file (`template: reach`)"]
        elif "scenes" in data:
            titles = ["Suite file"]
        elif "promote" in data:
            train = data.get("train") or {}
            algorithm = train.get("algorithm", "import" if "source" in train else "bc")
            titles = ["Pipeline config", f"Pipeline config: `train` with `{algorithm}`"]
        else:
            titles = ["Scene file"]
        for key in used_keys(data):
            in_train = key.startswith("train.") and "promote" in data
            keys = sections[titles[-1] if in_train else titles[0]] | {"train": "mapping"}
            assert documented(key, keys), f"{path.relative_to(ROOT)}: {key}"
            checked += 1
    assert checked > 500


def test_the_page_parser_finds_what_a_file_leaves_out() -> None:
    sections = page_keys(PAGE.read_text())
    assert documented("validate.scene_min_success.pushes", sections["Pipeline config"])
    assert documented("randomization.geom_colours.table", sections["Scene file"])
    assert not documented("validate.no_such_key", sections["Pipeline config"])
    assert not documented("randomization.mass_scales", sections["Scene file"])
    assert not documented("train.lr", sections["Pipeline config"])


def test_types_read_as_a_person_would_say_them() -> None:
    assert type_name(dict[str, tuple[int | str, ...]] | None) == (
        "mapping of str to list of (int \\| str), or null")
    assert type_name(tuple[float, float]) == "[float, float]"
    assert type_name(Literal["a", "b"]) == "'a' \\| 'b'"


class _TeleopConfig(FrozenModel):
    """Imitation from a teleoperation rig (a plugin's algorithm)."""

    algorithm: Literal["teleop-bc"] = "teleop-bc"
    rig: str = Field(description="the rig's serial number")


@pytest.fixture
def plugin_algorithm() -> Iterator[str]:
    register_algorithm(AlgorithmSpec("teleop-bc", _TeleopConfig, "x:y", "x:Y",
                                     reads_dataset=True))
    yield "teleop-bc"
    ALGORITHMS._items.pop("teleop-bc")


def test_flows_keys_adds_a_plugins_algorithm(
    plugin_algorithm: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "pipeline"]) == 0
    out = capsys.readouterr().out
    assert f"## Pipeline config: `train` with `{plugin_algorithm}`" in out
    assert "| `train.rig` | str | *required* | the rig's serial number |" in out
    assert "(plugin, `" in out and "## Scene file" not in out
    assert main(["keys", "pipeline", "--shipped"]) == 0
    assert plugin_algorithm not in capsys.readouterr().out


def test_flows_keys_of_one_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "scene"]) == 0
    sections = page_keys(capsys.readouterr().out)
    assert list(sections) == ["Scene file"]
    assert {"randomization.push_velocity", "success.min_return"} <= set(sections["Scene file"])

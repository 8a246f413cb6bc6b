"""What the CLI resolves through the registries and package resources: ``flows plugins``
lists every kind a plugin may extend, and ``flows check``/``run`` take a config named
``pkg:PACKAGE/PATH`` inside an installed package (the example plugin's, installed by
``make setup``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from physai_core.plugins import KINDS


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PHYSAI_HOME", str(tmp_path / ".physai"))
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)


def test_plugins_json_lists_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert list(listing) == ["plugins", *KINDS]
    assert len(KINDS) == 6
    assert {"reach-v0", "pointmass-v0"} <= set(listing["tasks"])
    assert "mujoco" in listing["backends"] and {"bc", "ppo"} <= set(listing["algorithms"])
    assert "jetson-agx-thor" in listing["targets"] and "lerobot" in listing["dataset_formats"]
    assert "isaaclab" in listing["environments"]
    assert any("physai_pointmass:register" in p for p in listing["plugins"])


def test_plugins_text_has_a_line_per_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.partition(":")[0] for line in lines] == ["plugins", *KINDS]
    assert "backends: gymnasium-robotics, isaaclab, metaworld, mujoco" in lines


def test_check_takes_a_config_inside_an_installed_package(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["check", "pkg:physai_pointmass/pipeline.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["config: pkg:physai_pointmass/pipeline.yaml",
                         "task: pointmass-v0 (8 observations, 2 actions, 20 Hz)"]
    assert any(line.startswith("suite: pointmass-regression [nominal, heavy_puck]")
               for line in lines)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("ref", "message"), [
    ("pkg:physai_pointmass/no_such.yaml",
     "pkg:physai_pointmass/no_such.yaml: no such file in the package 'physai_pointmass' "
     "(value: '"),
    ("pkg:no_such_package_xyz/pipeline.yaml",
     "pkg:no_such_package_xyz/pipeline.yaml: package 'no_such_package_xyz' of "
     "'pkg:no_such_package_xyz/pipeline.yaml' is not installed"),
    ("pkg:physai_pointmass/../pipeline.yaml",
     "pkg:physai_pointmass/../pipeline.yaml: expected pkg:PACKAGE/PATH inside the package"),
])
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_bad_pkg_config_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, ref: str, message: str
) -> None:
    assert main([command, ref]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flows: error: {message}"), out.err
    assert not list(tmp_path.iterdir())

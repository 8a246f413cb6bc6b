"""The CLI on bad input: one line naming file and field, exit status 2, nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def flows(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PHYSAI_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "sim_scenes", tmp_path / "sim_scenes")
    return tmp_path


def _misspelled(project: Path) -> tuple[Path, str]:
    cfg = project / "configs" / "reach.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["train"]["epochz"] = data["train"].pop("epochs")
    cfg.write_text(yaml.safe_dump(data))
    return cfg, "train.epochz"


def _missing_scene(project: Path) -> tuple[Path, str]:
    (project / "sim_scenes" / "reach" / "heavy_payload.yaml").unlink()
    return project / "configs" / "reach.yaml", "scenes.1.scene"


def _unknown_parameter(project: Path) -> tuple[Path, str]:
    cfg = project / "configs" / "reach.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["package"]["quantize_everything"] = True
    cfg.write_text(yaml.safe_dump(data))
    return cfg, "package.quantize_everything"


@pytest.mark.parametrize("breakage", [_misspelled, _missing_scene, _unknown_parameter])
def test_bad_config_exits_2_with_one_line_and_writes_nothing(project: Path, breakage) -> None:
    cfg, field = breakage(project)
    home = project / ".physai"
    result = flows("run", str(cfg), home=home, cwd=project)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert field in lines[0]
    assert ".yaml" in lines[0]
    assert not home.exists()


def test_malformed_model_uri_exits_2(tmp_path: Path) -> None:
    result = flows("lineage", "reach@champion", home=tmp_path / ".physai", cwd=tmp_path)
    assert result.returncode == 2
    assert "models:/" in result.stderr

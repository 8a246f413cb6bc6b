"""A team's own task from an installed plugin package (examples/physai-pointmass, installed by
``make test``), through the doors a user has: ``flows run`` from an empty folder, a two-rank
torchrun PPO stage, and a broken plugin that stops the command. The deployed pipeline with
process workers runs the same task in tests/e2e/test_scale_out.py."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support import run_flows

ROOT = Path(__file__).resolve().parents[2]
MICRO = ROOT / "tests" / "fixtures" / "pointmass_micro.yaml"

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


def _champion(home: Path, model: str) -> str | None:
    with sqlite3.connect(home / "mlflow.db") as db:
        row = db.execute("SELECT version FROM registered_model_aliases WHERE name = ? AND "
                         "alias = 'champion'", (model,)).fetchone()
    return None if row is None else str(row[0])


def test_plugin_task_runs_from_an_empty_folder(tmp_path: Path, cli_env: CliEnv) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    shutil.copy(MICRO, work / "pipeline.yaml")
    done = run_flows("run", "pipeline.yaml", env=cli_env(work / ".physai"), cwd=work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if "nominal" in line and "[" in line]
    assert rows, done.stdout[-2000:]
    assert "pass" in rows[-1]
    assert _champion(work / ".physai", "pointmass-micro") == "1", done.stdout[-1500:]
    # The task's drawn targets and misses reach validation's episode records.
    records = [json.loads(m.read_text()) for m in (work / ".physai" / "store" / "artifacts")
               .glob("*.json")]
    columns = [r["columns"] for r in records if r["kind"] == "episode_records"]
    assert columns and all({"miss", "target_x", "target_y"} <= set(c) for c in columns), columns


def test_plugin_task_trains_ppo_on_two_ranks(tmp_path: Path, cli_env: CliEnv) -> None:
    data = yaml.safe_load(MICRO.read_text())
    del data["collect"]
    data["name"] = data["promote"]["model_name"] = "pointmass-ddp"
    data["train"] = {"algorithm": "ppo", "scene": "pkg:physai_pointmass/scenes/collect.yaml",
                     "iterations": 2, "num_worlds": 16, "steps_per_iteration": 8,
                     "hidden": [16, 16], "checkpoint_every": 1, "device": "cpu",
                     "resources": {"nproc_per_node": 2}}
    data["validate"]["min_success"] = 0.0
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(data))
    env = cli_env(tmp_path / ".physai", OMP_NUM_THREADS="1")
    done = run_flows("run", str(config), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "[rank 0]" in output and "[rank 1]" in output, output[-3000:]
    manifests = [json.loads(p.read_text()) for p in
                 (tmp_path / ".physai" / "store" / "artifacts").glob("*.json")]
    policies = [m for m in manifests if m["kind"] == "policy"]
    assert [(p["task"], p["algorithm"]) for p in policies] == [("pointmass-v0", "ppo")]


def _broken_plugin(site: Path, error: str) -> None:
    """An installed distribution (dist-info on the path) whose entry point raises ``error``."""
    info = site / "broken_robot-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-robot\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[physai_flows.tasks]\nbroken = broken_robot:register\n")
    (site / "broken_robot.py").write_text(f"def register():\n    {error}\n")


@pytest.mark.parametrize("error", ["import no_such_robot_driver",
                                   "raise RuntimeError('arm.xml:\\n not found')"])
def test_broken_plugin_stops_the_command_in_one_line(
    tmp_path: Path, cli_env: CliEnv, error: str
) -> None:
    site = tmp_path / "site"
    _broken_plugin(site, error)
    home = tmp_path / ".physai"
    env = cli_env(home, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    done = run_flows("run", str(MICRO), env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "physai_flows.tasks:broken = broken_robot:register (broken-robot 0.3)" in lines[0]
    assert ("ModuleNotFoundError" in lines[0]) if "import" in error else (
        "RuntimeError: arm.xml: not found" in lines[0])
    assert not home.exists() or not list((home / "store").rglob("*.json"))

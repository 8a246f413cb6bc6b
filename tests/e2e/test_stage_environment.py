"""Stages in their own environments (stages/environments.py): ``validate: {environment:
isaaclab}`` runs each scene in the Isaac Lab venv's interpreter (``make isaaclab``; make test
builds it first), and a missing environment stops ``flows run`` in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import CliEnv, TinyConfig
from tests.support import run_flows

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _report(home: Path):  # type: ignore[no-untyped-def]
    from stages.store import LocalStore

    store = LocalStore(home / "store")
    return [store.get(m.stem) for m in sorted((home / "store" / "artifacts").glob("*.json"))
            if json.loads(m.read_text())["kind"] == "sim_report"]


def test_missing_environment_stops_the_run_in_one_line_and_writes_nothing(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    config = tiny_config(validate={"environment": "isaaclab"})
    home = tmp_path / ".physai"
    done = run_flows("run", str(config), cwd=tmp_path, env=cli_env(
        home, PHYSAI_ENV_ISAACLAB_PYTHON=str(tmp_path / "no-venv" / "bin" / "python")))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (f"flows: error: {config}: validate.environment: stage environment "
                    f"'isaaclab' is not built ({tmp_path / 'no-venv' / 'bin' / 'python'} is "
                    "missing); build it with `make isaaclab`, or set PHYSAI_ENV_ISAACLAB_PYTHON "
                    "to its interpreter")
    assert not home.exists()
    unknown = run_flows("run", str(tiny_config("other.yaml", validate={"environment": "nope"})),
                        cwd=tmp_path, env=cli_env(home))
    assert unknown.returncode == 2 and "validate.environment" in unknown.stderr
    assert "unknown stage environment 'nope'; valid: isaaclab" in unknown.stderr
    assert not home.exists()


def test_scenes_validated_in_the_isaaclab_environment_match_this_one(
    tiny_config: TinyConfig, cli_env: CliEnv, tmp_path: Path
) -> None:
    from stages.environments import get_environment

    python = get_environment("isaaclab").python()
    if not os.access(python, os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    home = tmp_path / ".physai"
    there = run_flows("run", str(tiny_config(validate={"environment": "isaaclab"})),
                      cwd=tmp_path, env=cli_env(home))
    assert there.returncode == 0, there.stdout[-3000:] + there.stderr[-3000:]
    for scene in ("nominal", "heavy_payload", "noisy_sensors"):  # each scene's subprocess logs
        assert f"[isaaclab] validate {scene} 30/30" in there.stderr, there.stderr[-3000:]
    elsewhere = tmp_path / "here" / ".physai"  # a state folder of its own: nothing cached
    elsewhere.parent.mkdir()
    here = run_flows("run", str(tiny_config("here.yaml")), cwd=elsewhere.parent,
                     env=cli_env(elsewhere))
    assert here.returncode == 0, here.stdout[-3000:] + here.stderr[-3000:]
    assert "[isaaclab]" not in here.stderr
    (first,), (second,) = _report(home), _report(elsewhere)
    strip = {"video_digest", "usd_digest"}
    assert [s.model_dump(exclude=strip) for s in first.scenes] == \
        [s.model_dump(exclude=strip) for s in second.scenes]
    assert all(s.usd_digest for s in first.scenes + second.scenes)


def test_job_variables_carry_the_environment_image(tiny_config: TinyConfig) -> None:
    from flows.workpools import job_variables
    from stages.config import load_pipeline

    pipeline = load_pipeline(tiny_config(validate={"environment": "isaaclab"}))
    assert job_variables(pipeline, "validate")["job_variables"]["image"] == \
        "physai-flows-isaaclab:0.1.0"
    assert "image" not in job_variables(pipeline, "train")["job_variables"]
    assert "image" not in job_variables(load_pipeline(tiny_config("plain.yaml")),
                                        "validate")["job_variables"]

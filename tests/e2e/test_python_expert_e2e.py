"""Python code as expert and policy, through the config and command-line doors: a team's PD
controller (tests/fixtures/python_code/controllers.py, a stateful one that refuses to run past
one episode) records the demonstrations of a pipeline, labels its DAgger round, and is judged by
``flows validate`` like any policy; neither runs without being trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import run_flows

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "python_code"

pytestmark = pytest.mark.e2e


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PHYSAI_HOME": str(tmp_path / "home"), "COLUMNS": "200",
            "PYTHONPATH": os.pathsep.join(p for p in (str(FIXTURES),
                                                      os.environ.get("PYTHONPATH", "")) if p)}


def test_a_pipeline_clones_a_python_controller_and_validate_judges_it(tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = run_flows("run", str(FIXTURES / "pendulum_expert.yaml"), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "models:/pendulum-python-expert/1 -> @champion" in done.stdout
    suite = str(FIXTURES / "pendulum_suite.yaml")
    verdicts = {}
    for ref in ("python:controllers:PendulumPD", "python:controllers:pushes_right"):
        done = run_flows("validate", ref, "--suite", suite, "--trust-code", "--json",
                         env=env, cwd=tmp_path)
        assert done.returncode in (0, 1), done.stderr[-3000:]
        body = json.loads(done.stdout)
        assert body["policy_kind"] == "python"
        verdicts[ref] = body["scenes"][0]["outcomes"]
    assert verdicts == {"python:controllers:PendulumPD": "1" * 8,
                        "python:controllers:pushes_right": "0" * 8}


def test_python_code_runs_only_when_trusted(tmp_path: Path) -> None:
    env = _env(tmp_path)
    suite = str(FIXTURES / "pendulum_suite.yaml")
    done = run_flows("validate", "python:controllers:PendulumPD", "--suite", suite,
                     env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert "is Python code, which runs when it is imported; admit it with --trust-code" \
        in done.stderr
    config = (FIXTURES / "pendulum_expert.yaml").read_text().replace("  trust_code: true\n", "")
    for name in ("pendulum_short.yaml", "pendulum_suite.yaml"):
        config = config.replace(name, str(FIXTURES / name))
    (tmp_path / "untrusted.yaml").write_text(config)
    done = run_flows("run", "untrusted.yaml", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert "collect" in done.stderr and "admit it with trust_code: true" in done.stderr
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.hdf5"))

"""A pipeline on a benchmark in its stage environment: ``flows run`` of a config that collects
from MetaWorld's pick-place policy (Python code) records, trains (with a DAgger round labelled
by the same policy), validates and packages in the metaworld environment and registers the
policy. Tiny settings: a test of the path; configs/metaworld_pick_place.yaml is the skill."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_benchmarks_e2e import FIXTURES, _env, _python
from tests.support import run_flows

pytestmark = pytest.mark.e2e


def test_a_pipeline_clones_metaworlds_pick_place_policy_in_its_environment(
        tmp_path: Path) -> None:
    _python("metaworld")
    done = run_flows("run", str(FIXTURES / "metaworld_tiny.yaml"), env=_env(tmp_path),
                     cwd=tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "models:/metaworld-tiny/1" in done.stdout
    # what the metaworld environment's interpreter said, stage by stage
    for step in ("[metaworld] expert python:metaworld.policies:SawyerPickPlaceV3Policy "
                 "succeeds in 1.00 of 20", "[metaworld] collected 8 episodes",
                 "[metaworld] DAgger round 1:", "[metaworld] validate pick-place 4/4"):
        assert step in log, step

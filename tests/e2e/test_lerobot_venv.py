"""The tests that need LeRobot itself (tests/lerobot/: datasets this project exports load in
LeRobot 0.6.1's ``LeRobotDataset``, datasets LeRobot records import here), run by the lerobot
stage environment's own interpreter as one test of this suite, so that make test's workers run
them beside the other files; the project's side of each runs in this interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_the_lerobot_tests_pass_in_their_environment() -> None:
    from stages.core.environments import get_environment

    python = get_environment("lerobot").python()
    if not os.access(python, os.X_OK):
        pytest.skip("the lerobot stage environment is not built: make lerobot")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--confcutdir=tests/lerobot", "tests/lerobot"],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT), "PHYSAI_PROJECT_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=900)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 4 and "skipped" not in summary, summary
    print(f"\nlerobot environment: {summary}")

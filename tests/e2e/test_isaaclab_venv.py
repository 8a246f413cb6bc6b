"""The tests that need Isaac Lab itself (tests/isaaclab_tests.txt: the reach and locomotion
backends, registered tasks, the dataset handler), run by the isaaclab stage environment's own
interpreter as one test of this suite, so that make test's workers run them beside the other
files rather than after them (``make test-isaaclab`` runs the same files on their own)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = (ROOT / "tests" / "isaaclab_tests.txt").read_text().split()

pytestmark = pytest.mark.e2e


def test_the_isaaclab_tests_pass_in_their_environment() -> None:
    from stages.core.environments import get_environment

    python = get_environment("isaaclab").python()
    if not os.access(python, os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=900)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 20 and "skipped" not in summary, summary
    print(f"\nisaaclab environment: {summary}")

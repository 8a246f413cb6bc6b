"""docs/extending.md, run as written: every ``title=PATH`` block is written to PATH, every
``console`` block's ``$`` commands run in order, and each line shown under a command must be a
line (or, for JSON, a piece) of what it printed. The commands run from a copy of the repository's
examples in a fresh venv holding physai-flows from a wheel (tests/e2e/conftest.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"^```(\w+)(?: title=(\S+))?\n(.*?)^```$", re.S | re.M)

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


def doc_steps(text: str) -> list[tuple[str, str, list[str]]]:
    """``("file", path, [content])`` and ``("run", command, expected lines)``, in order."""
    steps: list[tuple[str, str, list[str]]] = []
    for lang, title, body in BLOCK.findall(text):
        if title:
            steps.append(("file", title, [body]))
        elif lang == "console":
            for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                command, *expected = chunk.rstrip("\n").split("\n")
                steps.append(("run", command, expected))
    return steps


def test_the_doc_has_steps_to_run() -> None:
    steps = doc_steps(DOC.read_text())
    commands = [s[1] for s in steps if s[0] == "run"]
    assert "pip install ./my-jetson" in commands and "flows plugins" in commands
    files = {s[1] for s in steps if s[0] == "file"}
    assert {"my-arm/task.yaml", "my-arm/pipeline.yaml", "pendulum/pipeline.yaml",
            "wide-bc/wide_bc.py", "my-jetson/my_jetson.py"} <= files
    assert {"flows check my-arm/pipeline.yaml", "flows check pendulum/pipeline.yaml",
            "flows check my-arm/wide.yaml", "pip install ./wide-bc"} <= set(commands)


def test_extending_steps_pass_as_written(
    installed: Path, tmp_path: Path, cli_env: CliEnv
) -> None:
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "examples", work / "examples",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {k: v for k, v in cli_env(tmp_path / ".physai").items() if k != "PYTHONPATH"}
    env |= {"PATH": f"{installed}{os.pathsep}{env['PATH']}", "PIP_NO_DEPS": "1",
            "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for kind, what, rest in doc_steps(DOC.read_text()):
        if kind == "file":
            (work / what).parent.mkdir(parents=True, exist_ok=True)
            (work / what).write_text(rest[0])
            continue
        done = subprocess.run(["bash", "-c", what], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (what, done.stdout[-2000:], done.stderr[-2000:])
        lines = done.stdout.splitlines()
        for expected in rest:
            assert expected in lines or (what.endswith("--json") and expected in done.stdout), (
                what, expected, done.stdout[-2000:])

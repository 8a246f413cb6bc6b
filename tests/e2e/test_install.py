"""physai-flows installed like a library (a wheel, not editable) runs a tiny config from an
empty folder: scenes and model files resolve through the installed package, never the checkout.

The fresh venv borrows the test venv's dependencies through a ``.pth`` line (the dependencies
are not under test, and downloading them again would cost minutes); physai-flows itself comes
only from the wheel, since the test venv's editable install is not activated by a plain path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,  # type: ignore[call-overload]
                          **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding physai-flows from a freshly built wheel; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"  # a copy, so no build output left in the checkout is reused
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for name in ("stages", "flows", "edge", "sim_scenes"):
        shutil.copytree(ROOT / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheel = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                  "--no-build-isolation", "-w", str(tmp / "dist"), str(source)])
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
                     ).stdout.strip())
    (site / "physai-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (whl,) = (tmp / "dist").glob("physai_flows-*.whl")
    install = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(whl)])
    assert install.returncode == 0, install.stderr[-2000:]
    return venv / "bin"


def test_wheel_install_runs_a_tiny_config_from_an_empty_folder(
    installed: Path, tmp_path: Path, cli_env: CliEnv
) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    config = {
        "name": "installed", "task": "reach-v0", "seed": 0,
        "collect": {"scene": "pkg:sim_scenes/reach/collect.yaml", "episodes": 20,
                    "num_worlds": 10},
        "train": {"epochs": 3, "hidden": [32, 32], "device": "cpu"},
        "validate": {"suite": "pkg:sim_scenes/reach/suite.yaml", "min_success": 0.0,
                     "video_episodes": 0},
        "package": {"latency_iters": 50},
        "promote": {"model_name": "installed"},
    }
    (work / "pipeline.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in cli_env(work / ".physai").items() if k != "PYTHONPATH"}
    where = _run([str(installed / "python"), "-c",
                  "import stages.sim.reach as r, sim_scenes, edge; "
                  "print(r.__file__); print(r.ARM7_XML); print(sim_scenes.__path__[0])"],
                 cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert not Path(line).is_relative_to(ROOT), where.stdout
        assert Path(line).exists(), line
    done = _run([str(installed / "flows"), "run", "pipeline.yaml"], cwd=work, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "wide_targets" in done.stdout and "models:/installed/1" in done.stdout, done.stdout
    assert sorted(os.listdir(work)) == [".physai", "pipeline.yaml"]

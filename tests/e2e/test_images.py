"""The stage environments as container images (flows/images.py, ``make images``): the project's
image is built with podman (or reused: its layers are keyed by content), holds the CPU torch and
the project, and runs the ``flows`` command in a container; building it again builds nothing.

A machine without podman or mmdebstrap skips the image tests naming ``make images``; the key
tests run everywhere."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from flows.images import (
    IMAGE_VARIABLE,
    PROJECT_DIR,
    RECIPES,
    RUN_OPTIONS,
    build_image,
    deps_image,
    image_name,
    missing_tools,
    podman,
    stale_images,
)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _copy(tmp_path: Path) -> Path:
    """A copy of what decides the images' keys."""
    copy = tmp_path / "checkout"
    for name in ("pyproject.toml", "README.md"):
        copy.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    for name in ("physai_core", "stages", "flows", "edge", "sim_scenes", "configs", "scripts"):
        shutil.copytree(ROOT / name, copy / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return copy


def test_keys_follow_what_decides_each_layer(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    recipe = RECIPES["physai"]
    again = _copy(tmp_path / "again")
    assert image_name("physai", copy) == image_name("physai", again)
    # The commit decides too: what runs in the image records it as its code revision.
    committed = _copy(tmp_path / "committed")
    git = ["git", "-C", str(committed), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    assert image_name("physai", committed) != image_name("physai", copy)
    deps, image = deps_image(recipe, copy), image_name("physai", copy)
    # A source change rebuilds only the project layer.
    store = copy / "stages" / "storage" / "store.py"
    store.write_text(store.read_text() + "\n")
    assert deps_image(recipe, copy) == deps
    assert image_name("physai", copy) != image
    # A setting outside the requirements rebuilds nothing below the project layer.
    (copy / "pyproject.toml").write_text((copy / "pyproject.toml").read_text() + "\n# x\n")
    assert deps_image(recipe, copy) == deps
    # A dependency change rebuilds the dependency layer too.
    text = (copy / "pyproject.toml").read_text()
    (copy / "pyproject.toml").write_text(text.replace('"rich>=13"', '"rich>=14"', 1))
    assert deps_image(recipe, copy) != deps
    # The robot computer's stand-in shares the project's dependency layer, not its name.
    assert deps_image(RECIPES["jetson"], copy) == deps_image(recipe, copy)
    assert image_name("jetson", copy).startswith("localhost/physai-flows-jetson:")
    assert image_name("jetson", copy).split(":")[1] != image_name("physai", copy).split(":")[1]
    # Isaac Lab's dependencies do not follow the project's pyproject.toml.
    assert deps_image(RECIPES["isaaclab"], copy) == deps_image(RECIPES["isaaclab"], ROOT)
    assert image_name("physai", copy).startswith("localhost/physai-flows:")


@pytest.fixture(scope="module")
def physai_image() -> str:
    """The project's image, built once per content on this machine (podman's storage)."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not found: `make images` cannot build images here")
    return build_image("physai")[0]


def test_the_project_image_runs_flows_with_the_cpu_torch(physai_image: str) -> None:
    probe = ("import os, torch, stages, flows.cli; "
             "print(torch.__version__, torch.version.cuda, stages.__file__, "
             f"os.getcwd(), os.environ['{IMAGE_VARIABLE}'])")
    done = subprocess.run([*podman(), "run", "--rm", *RUN_OPTIONS, physai_image,
                           "python", "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    version, cuda, stages_file, cwd, image = done.stdout.split()
    assert version == "2.13.0+cpu" and cuda == "None"
    assert stages_file == f"{PROJECT_DIR}/stages/__init__.py" and cwd == PROJECT_DIR
    assert image == physai_image
    # The flows command line answers in the container, with the pipeline's configs beside it.
    done = subprocess.run([*podman(), "run", "--rm", *RUN_OPTIONS, physai_image,
                           "flows", "check", "configs/reach.yaml"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "stage: collect on dgx" in done.stdout and "stage: promote on ovx" in done.stdout


def test_an_unchanged_image_is_not_built_again(physai_image: str) -> None:
    start = time.monotonic()
    name, built = build_image("physai")
    took = time.monotonic() - start
    assert (name, built) == (physai_image, False)
    assert took < 30, f"an unchanged image took {took:.1f} s to confirm"
    labels = subprocess.run([*podman(), "image", "inspect", "--format",
                             "{{index .Labels \"org.physai-flows.environment\"}}", name],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert labels == "physai"
    # Pruning keeps what the checkout builds now.
    assert name not in stale_images() and deps_image(RECIPES["physai"]) not in stale_images()

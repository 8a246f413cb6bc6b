"""Stage environments as OCI images, built here with podman and no registry: ``flows images``.

Each image is built in three layers, each tagged with a key computed from what decides its
contents and built only when no image holds that tag, so an unchanged environment is never
rebuilt and a source change rebuilds only the thin top layer:

- ``localhost/physai-base:<key>``: a Debian bookworm root file system with Python 3.11
  (``mmdebstrap``, then ``podman import``); the key covers the suite and package list.
- ``localhost/physai-flows-<env>-deps:<key>``: the environment's dependencies in the venv
  ``/opt/venv``, installed by pip inside a container with the host's pip settings (its local
  wheel folders, indexes, constraints and CA bundle mounted read-only), so torch is the same
  CPU build the project's venv takes; the settings reach pip as a file in the build folder
  (:data:`PIP_CONFIG`), never as ``podman run -e``, whose variables the committed image keeps
  in its config (an index URL's token with them); the key covers the base and the install
  recipe (the requirements ``pyproject.toml`` declares with :data:`IMAGE_EXTRAS` for ``physai``,
  ``scripts/install_isaaclab.sh`` for ``isaaclab``).
- ``localhost/physai-flows[-<env>]:<key>``: the project's files at ``/opt/physai-flows`` (its
  working directory, ``PHYSAI_CODE_REVISION`` the commit they are); the key covers the
  dependency layer, every project file and that commit.

Containers run with ``--runtime runc``, explicit ulimits and host networking, as this kind of
machine needs (``PHYSAI_PODMAN`` names another podman binary). ``flows deploy --docker`` puts
:func:`image_name` of each environment into its pools' job variables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from physai_core.errors import PhysaiError, UnknownNameError
from stages.core.environments import ENVIRONMENTS
from stages.core.redaction import redact_urls
from stages.core.settings import resolve_settings

if TYPE_CHECKING:
    from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DIR = "/opt/physai-flows"
"""Where the project's files lie in every image, and its containers' working directory."""
VENV = "/opt/venv"
"""The venv of an image's environment."""
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates", "libegl1",
                 "libopengl0", "libgl1-mesa-dri")
"""What the base root file system holds beside Debian's ``apt`` variant: Python, and EGL with
Mesa's software renderer for MuJoCo's offscreen rendering (``MUJOCO_GL=egl``)."""
TORCH = "torch==2.13.0"
"""The CPU torch the project's venv takes (the Makefile's ``deps``), installed first."""
IMAGE_EXTRAS = ("cosmos", "gymnasium", "onnxscript", "rl")
"""The project's extras in the ``physai`` image: what its stages run, not its tests' tools."""
PROJECT_FILES = ("pyproject.toml", "README.md", "physai_core", "stages", "flows", "edge",
                 "sim_scenes", "configs", "scripts")
"""What of the checkout goes into an image (and into its key)."""
RUN_OPTIONS = ("--network", "host", "--ulimit", "nofile=1024:1024",
               "--ulimit", "nproc=4096:4096")
"""What every container here needs: the host's network and explicit limits."""
IMAGE_VARIABLE = "PHYSAI_IMAGE"
"""Set in every image to the image's own name, so a stage can record where it ran."""
LABEL = "org.physai-flows"
"""Prefix of the labels an image records its environment and key under."""
PIP_OPTIONS = ("find-links", "index-url", "extra-index-url", "constraint", "cert")
"""The host's pip settings a dependency build takes."""
PIP_CONFIG = "/build/pip.conf"
"""Where a dependency build's pip reads them: the build folder, mounted read-only for that one
container, and so in no image."""


@dataclass(frozen=True)
class ImageRecipe:
    """How one stage environment's image is built."""

    environment: str
    """The stage environment, ``physai`` for the project's own."""
    repository: str
    """The image's name without tag, e.g. ``localhost/physai-flows``."""
    inputs: tuple[str, ...]
    """Files (relative to the checkout) whose content decides the dependency layer beside the
    requirements it installs."""
    install: str
    """Shell run in the base container to fill :data:`VENV`; the checkout is at ``/build/src``
    and the requirements file at ``/build/requirements.txt``."""
    editable: bool
    """Install the project into the venv (``pip -e``); otherwise it is on ``PYTHONPATH``."""
    deps_from: str = ""
    """Another recipe whose dependency layer this image is built on (the same venv, one copy
    in podman's storage); empty: its own."""
    stand_in: str = ""
    """What the image stands in for, when it is a stand-in (its ``...stand-in`` label)."""
    python_variable: str = ""
    """For an environment whose Python Debian bookworm does not ship: the variable naming this
    machine's interpreter of that version, which the install script reads too; empty: the
    base image's ``python3``."""
    python_default: str = ""
    """That interpreter when the variable is unset (``~`` expanded)."""


@dataclass(frozen=True)
class HostPython:
    """An interpreter of this machine that a dependency build copies into its image, at the
    same path, so the install script finds it where it would find it here."""

    executable: str
    """The interpreter, as the recipe's variable (or default) names it."""
    prefix: str
    """Its installation (``sys.base_prefix``): what is copied."""
    version: str
    """``sys.version``, part of the dependency layer's key."""


RECIPES: dict[str, ImageRecipe] = {
    "physai": ImageRecipe(
        "physai", "localhost/physai-flows", ("scripts/requirements.py",),
        f"python3 -m venv {VENV} && {VENV}/bin/pip install -q {TORCH} && "
        f"{VENV}/bin/pip install -q -r /build/requirements.txt 'setuptools>=77' wheel",
        editable=True),
    "isaaclab": ImageRecipe(
        "isaaclab", "localhost/physai-flows-isaaclab", ("scripts/install_isaaclab.sh",),
        f"bash /build/src/scripts/install_isaaclab.sh {VENV}", editable=False),
    "lerobot": ImageRecipe(
        "lerobot", "localhost/physai-flows-lerobot", ("scripts/install_lerobot.sh",),
        f"bash /build/src/scripts/install_lerobot.sh {VENV}", editable=False,
        python_variable="PHYSAI_LEROBOT_BASE_PYTHON",
        python_default="~/.pyenv/versions/3.12.1/bin/python"),
    "metaworld": ImageRecipe(
        "metaworld", "localhost/physai-flows-metaworld", ("scripts/install_benchmark.sh",),
        f"bash /build/src/scripts/install_benchmark.sh metaworld {VENV}", editable=False),
    "gymnasium-robotics": ImageRecipe(
        "gymnasium-robotics", "localhost/physai-flows-gymnasium-robotics",
        ("scripts/install_benchmark.sh",),
        f"bash /build/src/scripts/install_benchmark.sh gymnasium-robotics {VENV}", editable=False),
    "jetson": ImageRecipe(
        "jetson", "localhost/physai-flows-jetson", (), "", editable=True, deps_from="physai",
        stand_in="NVIDIA L4T for Jetson AGX Thor (arm64, TensorRT): an x86 image with the "
                 "project's entry point and checks, no TensorRT"),
}
"""The environments with an image recipe: the project's own, Isaac Lab's, LeRobot's, the
manipulation benchmarks' (MetaWorld's, Gymnasium-Robotics'), and the robot computer's stand-in
(the ``jetson`` pool's: the project's venv and files, its own name and labels; a real one is
built on NVIDIA's L4T base for arm64). LeRobot 0.6 needs Python 3.12, which Debian bookworm does
not ship: its build copies this machine's 3.12 (the interpreter ``scripts/install_lerobot.sh``
takes here) into the image."""


class ImageBuildError(PhysaiError):
    """An image could not be built: podman or mmdebstrap is missing or a step failed."""

    exit_code = 2


def podman() -> list[str]:
    """The podman command with the options this machine kind needs (``runc``)."""
    binary = os.environ.get("PHYSAI_PODMAN", "podman")
    return [binary, "--runtime", "runc"]


def missing_tools() -> list[str]:
    """The programs an image build needs that are not on ``PATH``."""
    tools = [os.environ.get("PHYSAI_PODMAN", "podman"), "mmdebstrap"]
    return [t for t in tools if shutil.which(t) is None]


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def _files(root: Path, names: Sequence[str]) -> list[Path]:
    """Every file under ``names`` in ``root``, sorted, less caches and build outputs."""
    out: list[Path] = []
    for name in names:
        path = root / name
        found = sorted(path.rglob("*")) if path.is_dir() else [path]
        out += [f for f in found if f.is_file() and "__pycache__" not in f.parts
                and not any(p.endswith(".egg-info") for p in f.parts) and f.suffix != ".pyc"]
    return out


def files_key(root: Path, names: Sequence[str], *salt: str) -> str:
    """A 16-hex key of the files under ``names`` in ``root`` (paths, contents, executable
    bits) and of ``salt``; a missing file counts as its name alone."""
    parts = [s.encode() for s in salt]
    for name in names:
        if not (root / name).exists():
            parts.append(f"missing {name}".encode())
    for f in _files(root, names):
        rel = f.relative_to(root).as_posix()
        parts += [rel.encode(), b"x" if os.access(f, os.X_OK) else b"-", f.read_bytes()]
    return _digest(parts)


def base_image() -> str:
    """The base image's name, keyed by the suite and package list."""
    return f"localhost/physai-base:{_digest([SUITE.encode(), *map(str.encode, BASE_PACKAGES)])}"


def deps_image(recipe: ImageRecipe, root: Path = ROOT) -> str:
    """The dependency layer's name, keyed by the base, the recipe, its input files and the
    requirements it installs (not by the rest of ``pyproject.toml``: a tool's setting or an
    extra the image leaves out rebuilds nothing)."""
    if recipe.deps_from:
        return deps_image(_recipe(recipe.deps_from), root)
    python = host_python(recipe)
    key = files_key(root, recipe.inputs, base_image(), recipe.install, TORCH,
                    _requirements(root, recipe),
                    *((python.executable, python.prefix, python.version) if python else ()))
    return f"{recipe.repository}-deps:{key}"


def image_name(environment: str, root: Path = ROOT) -> str:
    """The image of ``environment`` as the checkout at ``root`` would build it.

    Raises:
        UnknownNameError: no recipe builds ``environment``.
    """
    from stages.orchestration.context import code_revision

    recipe = _recipe(environment)
    key = files_key(root, PROJECT_FILES, deps_image(recipe, root), str(recipe.editable),
                    recipe.stand_in, code_revision(root))
    return f"{recipe.repository}:{key}"


def host_python(recipe: ImageRecipe) -> HostPython | None:
    """The interpreter of this machine ``recipe`` copies into its image (None: the base's
    ``python3``); one that does not run has the version ``missing``, which no build takes."""
    if not recipe.python_variable:
        return None
    given = os.environ.get(recipe.python_variable) or os.path.expanduser(recipe.python_default)
    try:
        proc = subprocess.run([given, "-c", "import sys; print(sys.base_prefix); "
                               "print(sys.version.replace(chr(10), ' '))"],
                              capture_output=True, text=True, timeout=60)
    except OSError:
        return HostPython(given, "", "missing")
    prefix, _, version = proc.stdout.strip().partition("\n")
    if proc.returncode != 0 or not prefix.startswith("/"):
        return HostPython(given, "", "missing")
    return HostPython(given, prefix, version)


def _recipe(environment: str) -> ImageRecipe:
    if environment not in RECIPES:
        raise UnknownNameError("image environment", environment, RECIPES)
    return RECIPES[environment]


def image_exists(name: str) -> bool:
    """Whether podman's local storage holds ``name``."""
    return subprocess.run([*podman(), "image", "exists", name],
                          capture_output=True).returncode == 0


def _check(cmd: list[str], what: str) -> None:
    """Run ``cmd``; a failure is an :class:`ImageBuildError` with the command and the last 15
    lines of its output, URL credentials redacted (:func:`~stages.core.redaction.redact_urls`)."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ImageBuildError(redact_urls(
            f"{what} failed (exit {proc.returncode}): {shlex.join(cmd)}\n{tail}"))


def build_base(work: Path) -> str:
    """Build the base image unless it exists; returns its name."""
    name = base_image()
    if image_exists(name):
        return name
    rootfs = work / "rootfs.tar"
    _check(["mmdebstrap", "--quiet", "--variant=apt", f"--include={','.join(BASE_PACKAGES)}",
            SUITE, str(rootfs)], "mmdebstrap")
    _check([*podman(), "import", "--change", "CMD [\"/bin/bash\"]", str(rootfs), name],
           "podman import")
    rootfs.unlink()
    return name


def pip_settings(folder: Path) -> list[str]:
    """Write the host's pip settings (:data:`PIP_OPTIONS`, from ``pip config list``: its files
    and ``PIP_*`` variables) to ``folder/pip.conf``, readable by its owner alone; return the
    read-only mounts of the local paths they name (wheel folders, ``file://`` indexes,
    constraints, CA bundle). A build container mounts ``folder`` at ``/build`` and reads the
    file at :data:`PIP_CONFIG`: an index URL's token stays out of podman's command line, which
    a failed build prints, and out of the committed image's config."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                          capture_output=True, text=True)
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if option in PIP_OPTIONS:
            values[option] = value.strip().strip("'\"")
    lines = ["[global]", "disable-pip-version-check = true",
             *(f"{k} = {v}" for k, v in values.items())]
    descriptor = os.open(folder / "pip.conf", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as conf:
        conf.write("\n".join(lines) + "\n")
    mounts: list[str] = []
    for value in values.values():
        for item in value.split():
            path = item.removeprefix("file://").rstrip("/")
            if item.startswith("file://") and path.endswith("/simple"):
                path = path.removesuffix("/simple")  # an index's files lie beside simple/
            if path.startswith("/") and os.path.exists(path) and path not in mounts:
                mounts.append(path)
    return [arg for p in mounts for arg in ("-v", f"{p}:{p}:ro")]


def run_command(container: str, base: str, script: str, mounts: Sequence[str]) -> list[str]:
    """The ``podman run`` that runs ``script`` in a container named ``container`` of ``base``:
    no ``-e``, since the committed image would keep every variable given so."""
    return [*podman(), "run", "--name", container, *RUN_OPTIONS, *mounts, base,
            "sh", "-euc", script]


def _commit_run(base: str, name: str, script: str, mounts: Sequence[str],
                changes: Sequence[str]) -> None:
    """Run ``script`` in a container of ``base`` and commit it as ``name`` with ``changes``
    (Containerfile instructions)."""
    container = f"physai-build-{os.getpid()}-{int(time.time() * 1000)}"
    try:
        _check(run_command(container, base, script, mounts), f"building {name}")
        _check([*podman(), "commit", "--quiet",
                *(a for c in changes for a in ("--change", c)), container, name],
               f"committing {name}")
    finally:
        subprocess.run([*podman(), "rm", "--force", container], capture_output=True)


def build_deps(base: str, name: str, recipe: ImageRecipe, work: Path) -> None:
    """Build the dependency layer ``name`` of ``recipe`` on ``base``: its install script in a
    container that sees ``work`` (the requirements, the sources, the host's pip settings) at
    ``/build``, read-only, and pip's settings at :data:`PIP_CONFIG`."""
    mounts = [*pip_settings(work), "-v", f"{work}:/build:ro"]
    script = f"export PIP_CONFIG_FILE={PIP_CONFIG}; {recipe.install}"
    python = host_python(recipe)
    if python is not None:
        if python.version == "missing":
            raise ImageBuildError(
                f"{recipe.environment}'s image needs the Python that "
                f"${recipe.python_variable} names ({python.executable}), which does not run "
                f"here; point {recipe.python_variable} at one")
        # Copied, not installed: the same interpreter the environment's venv is built on here.
        prefix, executable = shlex.quote(python.prefix), shlex.quote(python.executable)
        script = (f"mkdir -p {prefix} && cp -a /build-python/. {prefix}/ && "
                  f"export {recipe.python_variable}={executable}; {script}")
        mounts += ["-v", f"{python.prefix}:/build-python:ro"]
    _commit_run(base, name, script, mounts,
                [f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                 "/sbin:/bin", f"LABEL {LABEL}.environment={recipe.environment}"])


def _requirements(root: Path, recipe: ImageRecipe) -> str:
    """The requirements file of the ``physai`` image: the project's dependencies and
    :data:`IMAGE_EXTRAS` (``scripts/requirements.py``); empty for other recipes."""
    if recipe.environment != "physai":
        return ""
    import runpy

    module = runpy.run_path(str(root / "scripts" / "requirements.py"))
    return "\n".join(module["requirements"](root / "pyproject.toml", list(IMAGE_EXTRAS))) + "\n"


def _stage_sources(work: Path, root: Path) -> Path:
    """A copy of the project's files under ``work/src``, as an image holds them."""
    src = work / "src"
    for f in _files(root, PROJECT_FILES):
        target = src / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return src


def build_image(environment: str, root: Path = ROOT, rebuild: bool = False) -> tuple[str, bool]:
    """Build ``environment``'s image from the checkout at ``root`` unless it exists.

    Returns:
        The image's name and whether anything was built.

    Raises:
        ImageBuildError: podman or mmdebstrap is missing, or a build step failed.
    """
    missing = missing_tools()
    if missing:
        raise ImageBuildError(f"cannot build images: {', '.join(missing)} not found "
                              "(Debian: apt-get install podman runc mmdebstrap)")
    recipe = _recipe(environment)
    name = image_name(environment, root)
    with _build_lock():
        built = rebuild or not image_exists(name)
        if built:
            _build_layers(recipe, name, root, rebuild)
        alias = _declared_image(environment)
        if alias:
            _check([*podman(), "tag", name, alias], f"tagging {name} as {alias}")
    return name, built


@contextmanager
def _build_lock() -> Iterator[None]:
    """One image build at a time on this machine (two clones take turns)."""
    import fcntl

    cache = Path(os.environ.get("PHYSAI_CACHE") or Path.home() / ".cache" / "physai-flows")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _declared_image(environment: str) -> str | None:
    """The image name a registered stage environment declares (its pools' job variable, e.g.
    ``physai-flows-isaaclab:0.1.0``) when it is a local one: the build tags it too."""
    env = ENVIRONMENTS.find(environment)
    image = env.image if env is not None else None
    first = image.split("/")[0] if image and "/" in image else ""
    return image if image and (not first or first == "localhost") else None


def _build_layers(recipe: ImageRecipe, name: str, root: Path, rebuild: bool) -> None:
    """Build the missing layers of ``recipe``'s image ``name`` (every one with ``rebuild``)."""
    environment = recipe.environment
    labels = [f"LABEL {LABEL}.environment={environment}", f"LABEL {LABEL}.image={name}"]
    deps_recipe = _recipe(recipe.deps_from) if recipe.deps_from else recipe
    with tempfile.TemporaryDirectory(prefix="physai-image-") as tmp:
        work = Path(tmp)
        src = _stage_sources(work, root)
        deps = deps_image(recipe, root)
        if rebuild or not image_exists(deps):
            (work / "requirements.txt").write_text(_requirements(root, deps_recipe))
            build_deps(build_base(work), deps, deps_recipe, work)
        install = (f"cp -a /build/src {PROJECT_DIR} && {VENV}/bin/pip install -q --no-deps "
                   f"--no-build-isolation --no-index -e {PROJECT_DIR}" if recipe.editable
                   else f"cp -a /build/src {PROJECT_DIR}")
        from stages.orchestration.context import CODE_REVISION_VARIABLE, code_revision

        # The lineage of what runs in the image names the commit it was built from.
        changes = [f"WORKDIR {PROJECT_DIR}", *labels, f"ENV {IMAGE_VARIABLE}={name}",
                   f"ENV {CODE_REVISION_VARIABLE}={code_revision(root)}", "ENV MUJOCO_GL=egl"]
        if not recipe.editable:
            changes.append(f"ENV PYTHONPATH={PROJECT_DIR}")
        if recipe.stand_in:
            changes.append(f"LABEL {LABEL}.stand-in={json.dumps(recipe.stand_in)}")
        _commit_run(deps, name, install, ["-v", f"{src}:/build/src:ro"], changes)


def stale_images(root: Path = ROOT) -> list[str]:
    """The images of this project in podman's storage that the checkout at ``root`` would not
    build now (older keys), less the names stage environments declare."""
    keep = {base_image()} | {deps_image(r, root) for r in RECIPES.values()}
    keep |= {image_name(e, root) for e in RECIPES} | {
        a for e in RECIPES if (a := _declared_image(e))}
    keep |= {f"localhost/{k}" for k in keep}
    listed = subprocess.run([*podman(), "images", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True, check=True).stdout.split()
    ours = ("localhost/physai-base:", *(f"{r.repository}{s}:" for r in RECIPES.values()
                                        for s in ("", "-deps")))
    return [n for n in listed if n.startswith(ours) and n not in keep]


def write_launcher(environment: str, folder: Path) -> Path:
    """Write ``folder/<environment>-python``, an executable that runs ``environment``'s
    interpreter in its image (:mod:`flows.image_run` under this interpreter); returns its path."""
    image_name(environment)  # an environment with no image recipe is refused here
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / f"{environment}-python"
    launcher.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m flows.image_run "
                        f"{shlex.quote(environment)} \"$@\"\n")
    launcher.chmod(0o755)
    return launcher


def cmd_images(args: argparse.Namespace, console: Console) -> int:
    """Build the named environments' images (``build``), list them and whether they exist,
    or remove the project's images of older keys (``prune``)."""
    environments = args.environments or list(RECIPES)
    for environment in environments:
        _recipe(environment)
    if args.action == "prune":
        for name in stale_images():
            _check([*podman(), "rmi", name], f"removing {name}")
            console.print(f"removed {name}", highlight=False, markup=False)
        return 0
    if args.action == "launcher":
        out = args.out or resolve_settings().home / "launchers"
        staged = args.environments or [e for e in RECIPES if ENVIRONMENTS.find(e) is not None]
        for environment in staged:
            launcher = write_launcher(environment, out)
            variable = ENVIRONMENTS.get(environment).python_variable
            console.print(f"export {variable}={shlex.quote(str(launcher))}", highlight=False,
                          markup=False, soft_wrap=True)
        return 0
    if args.action == "list":
        for environment in environments:
            name = image_name(environment)
            state = "built" if not missing_tools() and image_exists(name) else "not built"
            console.print(f"{environment}\t{name}\t{state}", highlight=False, markup=False)
        return 0
    for environment in environments:
        start = time.monotonic()
        name, built = build_image(environment, rebuild=args.rebuild)
        took = f"built in {time.monotonic() - start:.1f} s" if built else "unchanged"
        console.print(f"{environment}\t{name}\t{took}", highlight=False, markup=False)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows images`` to the ``flows`` command line."""
    images = sub.add_parser("images", help="build the stage environments' container images "
                            "(podman, no registry; content-keyed, cached)")
    images.add_argument("action", choices=("build", "list", "prune", "launcher"),
                        help="build what is missing, list the images and whether they exist, "
                             "remove the project's images of older keys, or write for each "
                             "environment a launcher that runs its interpreter in its image "
                             "(point PHYSAI_ENV_<NAME>_PYTHON at it: its stages then run in "
                             "containers of the image)")
    images.add_argument("environments", nargs="*",
                        help=f"environments (default: all: {', '.join(RECIPES)})")
    images.add_argument("--out", type=Path, default=None, metavar="FOLDER",
                        help="where `launcher` writes (default: the state folder's "
                             "launchers/, $PHYSAI_HOME/launchers)")
    images.add_argument("--rebuild", action="store_true",
                        help="build every layer again even when its image exists")
    images.set_defaults(func=cmd_images)

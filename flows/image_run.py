"""A stage environment's interpreter in its container image.

``PHYSAI_ENV_<NAME>_PYTHON`` points a stage environment at another interpreter
(:mod:`stages.core.environments`). Pointed at the launcher ``flows images launcher ENV FOLDER``
writes, every step that runs in that environment (a validation scene or suite, a training stage, the
LeRobot export) runs in a container of the environment's image, as a cluster's pool runs it,
and nothing else changes: the caller writes its request, reads the result and the store as it
does with a venv. Locally this is how an image is tried before a cluster runs it.

The container:

- is of the image the checkout builds now (:func:`flows.images.image_name`); an image not built
  is one line naming ``flows images build ENV`` (exit status 2);
- runs the image's venv interpreter on the caller's arguments, where a path into the
  checkout's own files (``stages/``, ``edge/``, ...) becomes the image's copy of it, so the code
  that runs is the image's;
- sees the caller's working folder, the state folder (``PHYSAI_HOME``) and the temporary
  folder at their own paths, and the checkout read-only (a config or a fixture beside the code);
- gets what a pool's container gets (:func:`stages.core.settings.travelling_environment`: the
  locations of the store, MLflow and Prefect, URLs without credentials, never a credential) and
  the host's network, so servers on loopback answer.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from flows.docker_pools import KEPT_OUT, PASSED_VARIABLES
from flows.images import (
    PROJECT_DIR,
    PROJECT_FILES,
    ROOT,
    RUN_OPTIONS,
    VENV,
    ImageBuildError,
    image_exists,
    image_name,
    missing_tools,
    podman,
)
from stages.core.settings import resolve_settings, travelling_environment

PASSED = (*PASSED_VARIABLES, "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
"""What of the caller's environment a stage's container gets beside the project's settings:
a pool's (:data:`flows.docker_pools.PASSED_VARIABLES`) and the offline switches the LeRobot
export sets for its interpreter."""
KEPT_HOME = (*KEPT_OUT, "PHYSAI_ENV_")
"""The project's settings that stay here: a pool's, and the stage environments' interpreters
(inside the image the environment is the image's own)."""


def _in_image(arg: str) -> str:
    """``arg``, or the image's copy of the checkout's file it names."""
    path = Path(arg)
    if not path.is_absolute() or not path.is_relative_to(ROOT):
        return arg
    rel = path.relative_to(ROOT)
    return str(Path(PROJECT_DIR) / rel) if rel.parts[:1] and rel.parts[0] in PROJECT_FILES \
        else arg


def _shared_folders(folders: Sequence[Path]) -> list[Path]:
    """``folders`` resolved, less those inside another one of them (mounted with it)."""
    resolved = sorted({f.resolve() for f in folders}, key=lambda f: len(f.parts))
    kept: list[Path] = []
    for folder in resolved:
        if not any(folder.is_relative_to(k) for k in kept):
            kept.append(folder)
    return kept


def container_command(environment: str, args: Sequence[str], *, cwd: Path,
                      environ: Mapping[str, str]) -> list[str]:
    """The ``podman run`` that runs ``environment``'s interpreter in its image on ``args``,
    called from ``cwd`` with ``environ`` (module doc).

    Raises:
        ImageBuildError: podman is missing or the image is not built (exit status 2).
        ConfigError: a variable that would travel holds a credential (named, not shown).
    """
    image = image_name(environment)
    if missing_tools() or not image_exists(image):
        raise ImageBuildError(f"stage environment {environment!r} runs in image {image}, "
                              f"which is not built: `flows images build {environment}`")
    return run_argv(image, args, cwd=cwd, environ=environ)


def run_argv(image: str, args: Sequence[str], *, cwd: Path,
             environ: Mapping[str, str]) -> list[str]:
    """The ``podman run`` of :func:`container_command` for ``image``, built or not.

    Raises:
        ConfigError: a variable that would travel holds a credential (named, not shown).
    """
    settings = resolve_settings(environ)
    shared = _shared_folders([cwd, settings.home, Path(tempfile.gettempdir())])
    mounts = [a for f in shared for a in ("-v", f"{f}:{f}")]
    if not any(ROOT.is_relative_to(f) for f in shared):
        mounts += ["-v", f"{ROOT}:{ROOT}:ro"]
    env = travelling_environment(environ, PASSED, KEPT_HOME)
    return [*podman(), "run", "--rm", *RUN_OPTIONS, *mounts, "-w", str(cwd.resolve()),
            *(a for k, v in sorted(env.items()) for a in ("-e", f"{k}={v}")), image,
            f"{VENV}/bin/python", *(_in_image(a) for a in args)]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m flows.image_run ENV ARGS...``: replace this process by the container."""
    from physai_core.errors import PhysaiError

    environment, *args = sys.argv[1:] if argv is None else argv
    try:
        cmd = container_command(environment, args, cwd=Path.cwd(), environ=os.environ)
    except PhysaiError as exc:
        print(f"flows images: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()

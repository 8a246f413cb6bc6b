"""What pins a suite's results: its digest, and a Gymnasium scene's provenance.

A suite's digest covers the scene files, the task's asset bytes and the simulator version (for a
Gymnasium task also the environment id, the package providing it and its version, and every
scene's make_kwargs), so a success rate is always tied to the exact simulator revision that
produced it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stages.core.hashing import sha256_file, sha256_json
from stages.core.loading import read_yaml
from stages.sim.backends import gymnasium_tasks as gym_task
from stages.sim.backends.catalog import backend_version
from stages.sim.suites.suite import SuiteScene


def gym_provenance(task: str, make_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a scene's results depend on beyond its file and assets, for a digest: for a
    Gymnasium task the environment id, its providing package and version, Gymnasium's version
    and the make_kwargs; nothing (an empty dict) for other tasks."""
    if not gym_task.is_gym_task(task):
        return {}
    return {"gymnasium": {**gym_task.env_provenance(task), "make_kwargs": make_kwargs}}


def scene_provenance(path: Path) -> dict[str, Any]:
    """:func:`gym_provenance` of the scene file ``path`` (read as YAML, not checked)."""
    raw = read_yaml(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("task"), str):
        return {}
    kwargs = raw.get("make_kwargs")
    return gym_provenance(raw["task"], kwargs if isinstance(kwargs, dict) else {})


def suite_digest(
    task: str, backend: str, scenes: tuple[SuiteScene, ...], asset_files: tuple[Path, ...],
    compare_backend: str | None = None,
) -> str:
    """Hex sha256 pinning a suite: task id, backend and its version (and the sim-to-sim
    backend's), asset bytes, scene files, episodes and seeds (and, for a Gymnasium task,
    :func:`gym_provenance` of every scene). Assets are keyed by file name, so the digest does
    not depend on where the repository is checked out."""
    second = {} if compare_backend is None else {
        "compare_backend": compare_backend,
        "compare_backend_version": backend_version(compare_backend)}
    return sha256_json(
        {
            "task": task,
            "backend": backend,
            "backend_version": backend_version(backend),
            **second,
            "assets": {p.name: sha256_file(p) for p in asset_files},
            "scenes": [
                {
                    "name": s.scene.name,
                    "sha256": sha256_file(s.scene.path),
                    "episodes": s.episodes,
                    "seed": s.seed,
                    **({"sweep": s.scene.config.sweep} if s.scene.config.sweep else {}),
                    **gym_provenance(task, dict(s.scene.config.make_kwargs)),
                }
                for s in scenes
            ],
        }
    )

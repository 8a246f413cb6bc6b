"""A validating process for tests/stages/sim/test_tiled_kill.py: validation rollouts of a tiny
reach-vision scene with its camera tiles drawn by worker processes (``PHYSAI_CAMERA_TILES``),
one after another until it is killed.

Once the workers have drawn a frame, it prints one JSON line on stdout: its tile workers'
process ids and the shared memory files they have mapped.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
SCENE = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"


def _shm(pid: int) -> set[str]:
    """The shared memory files process ``pid`` has mapped (from ``/proc/PID/maps``)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if "/dev/shm/" in line}


class ReportingPolicy:
    """The expert, bent by what the camera sees; at its first call it prints the workers."""

    inputs = ("obs", "front_image")

    def __init__(self, env: Any) -> None:
        self._env = env
        self._told = False

    def __call__(self, observation: Any) -> np.ndarray:
        if not self._told:
            self._told = True
            workers = [int(p.pid or 0) for p in multiprocessing.active_children()
                       if p.name.startswith("Spawn")]
            print(json.dumps({"workers": workers,
                              "shared_memory": sorted({m for w in workers for m in _shm(w)})}),
                  flush=True)
        image = observation["front_image"].astype(np.float64)
        bend = np.sin(image.reshape(len(image), -1).mean(axis=1))
        return np.asarray(self._env.expert_action() * (1.0 + 0.1 * bend[:, None]))


def main() -> None:
    """Validate until killed."""
    from stages.evaluation.rollout import rollout
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    env: Any = get_task("reach-vision-v0").make_env(load_scene(SCENE), 4, 7)
    env.camera_tiles = sys.argv[1] if len(sys.argv) > 1 else "2"
    policy = ReportingPolicy(env)
    while True:
        rollout(env, policy)


if __name__ == "__main__":
    main()

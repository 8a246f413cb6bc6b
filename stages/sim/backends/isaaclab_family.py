"""The ``isaaclab:<gym id>`` task family: Isaac Lab's own registered tasks in a pipeline.

``task: isaaclab:Isaac-Cartpole-Direct-v0`` names an environment that Isaac Lab registers with
Gymnasium; :class:`stages.sim.backends.isaaclab_tasks.IsaacLabTaskEnv` runs it with the semantics of
the Gymnasium adapter (normalized actions, fixed-length episodes, a scene's ``success``
predicate, single worlds restarted for PPO). Isaac Lab lives in the ``isaaclab`` stage
environment, so such a task says so (``TaskSpec.environment``): every stage that builds its
environment (training, validation, the package stage's parity observations) runs there, and
its suites run on ``backend: isaaclab``. The task's sizes and rate come from that
environment's interpreter (``python -m stages.sim.backends.isaaclab_tasks describe <gym id>``), read
once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from typing import TYPE_CHECKING, Any

from stages.core.environments import INSIDE_ENV, ROOT, require_python, runs_here
from stages.sim.backends import isaaclab_tasks
from stages.sim.backends.isaaclab_tasks import PREFIX, IsaacLabTaskEnv, IsaacLabTaskError
from stages.sim.tasks.catalog import TaskSpec

if TYPE_CHECKING:
    from stages.sim.env.batched import BatchedEnv
    from stages.sim.scenes.scene import Scene

ENVIRONMENT = "isaaclab"
"""The stage environment its stages run in."""

SUCCESS_HELP = "a success predicate: {survive: true} or {min_return: R}"
"""What an Isaac Lab task's scene must say about success."""


def is_isaaclab_task(task: str) -> bool:
    """Whether ``task`` names an Isaac Lab-registered task (``isaaclab:<gym id>``)."""
    return task.startswith(f"{PREFIX}:")


@cache
def describe(gym_id: str) -> dict[str, Any]:
    """Sizes, names and rate of Isaac Lab's task ``gym_id``, from the ``isaaclab`` stage
    environment (in this process when it is that environment)."""
    if runs_here(ENVIRONMENT):
        return isaaclab_tasks.describe(gym_id)
    python = require_python(ENVIRONMENT, f"task {PREFIX}:{gym_id}")
    env = {**os.environ, INSIDE_ENV: ENVIRONMENT, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([str(python), "-m", "stages.sim.backends.isaaclab_tasks", "describe",
                           gym_id],
                          capture_output=True, text=True, env=env, check=False, timeout=600)
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        raise IsaacLabTaskError(f"task {PREFIX}:{gym_id}: {last.removeprefix('error: ')}")
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return facts


def make_task(rest: str) -> TaskSpec:
    """The task ``isaaclab:<rest>``, described by the Isaac Lab environment."""
    facts = describe(rest)
    name = f"{PREFIX}:{rest}"
    obs_dim, act_dim = int(facts["obs_dim"]), int(facts["act_dim"])

    def make_env(
        scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None,
        device: str = "auto",
    ) -> BatchedEnv:
        return IsaacLabTaskEnv(scene, num_worlds, seed, num_threads=num_threads, device=device,
                               gym_id=rest)

    return TaskSpec(
        name=name,
        obs_dim=obs_dim,
        act_dim=act_dim,
        obs_names=tuple(facts.get("obs_names") or (f"obs[{i}]" for i in range(obs_dim))),
        obs_units=("",) * obs_dim,
        action_names=tuple(facts.get("action_names") or (f"act[{i}]" for i in range(act_dim))),
        action_units=("-1..1: the environment's action scale",) * act_dim,
        control_hz=float(facts["control_hz"]),
        target_names=("-", "-", "-"),
        target_units=("-", "-", "-"),
        workspace_low=(0.0, 0.0, 0.0),
        workspace_high=(0.0, 0.0, 0.0),
        floating_base=False,
        asset_files=(),
        camera="-",
        make_env=make_env,
        success_tolerance=SUCCESS_HELP,
        environment=ENVIRONMENT,
    )

"""Upper bounds on what a config may ask for, and what exceeding each would cost.

A bound is far above every config the project ships (the largest asks for 2,048 worlds, 700
PPO iterations, 400 episodes of 1,000 steps and 320 x 240 video): it stops a typo or a hostile
config before it allocates or runs for days, not a real experiment. The numbers are listed in
docs/guarantees.md ("Input and secrets").
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

MAX_WORLDS = 65_536
"""Most worlds stepped together: PPO's and collect's ``num_worlds``, and a suite scene's
``episodes`` (validation runs one world per episode, all at once)."""

WORLD_BYTES = 8 * 2**10
"""Resident simulator state of one world, bytes: 7.6 KiB measured for the locomotion model
(the larger of the two shipped MuJoCo models; reach: 1.5 KiB), rounded up."""

MAX_COLLECT_EPISODES = 1_000_000
"""Most episodes one collect stage records."""

MAX_EPISODE_STEPS = 100_000
"""Most control steps in one episode (a scene's ``episode_steps``)."""

MAX_ITERATIONS = 100_000
"""Most PPO iterations."""

MAX_ROLLOUT = 2**24
"""Most transitions one PPO rollout keeps (``num_worlds`` x ``steps_per_iteration``): each
holds its observation, action, reward, value and log-probability until the update."""

MAX_NODES = 1_024
"""Most machines a training stage asks for (``resources.nodes``)."""

MAX_PROCS_PER_NODE = 256
"""Most processes or GPUs per machine (``resources.nproc_per_node``, ``gpus_per_node``)."""

MAX_THREADS = 1_024
"""Most CPU threads a stage is told to use (PPO's ``update_threads`` and ``sim_threads``)."""

MAX_SWEEP_POINTS = 1_000
"""Most points of one scene's sweep grid; each point is a whole validation of the scene."""

MAX_VIDEO_SIDE = 3_840
"""Most pixels on either side of one filmed episode's frame (``validate.video_size``)."""

MAX_POLICY_JSON_BYTES = 16 * 2**20
"""Largest JSON file of a foreign policy folder read (a LeRobot policy's ``config.json`` and its
processor files, a few KiB each): it is parsed whole into memory."""

MAX_PROBE_BYTES = 2**30
"""Most bytes of probe observations a LeRobot policy's parity check holds: ``2 * chunk_size + 1``
steps of two worlds, each the state and every camera's frame."""

STEP_RATE = 100_000.0
"""Simulated world-steps a second that time estimates assume (a many-core machine stepping
MuJoCo worlds in parallel; this project's CI machine does about 3,000)."""


def gib(size: float) -> str:
    """A size in bytes as GiB (or MiB below one GiB), e.g. ``1.5 GiB``."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def duration(steps: float) -> str:
    """How long ``steps`` world-steps take at :data:`STEP_RATE`, in hours or days."""
    hours = steps / STEP_RATE / 3600
    when = f"{hours / 24:.0f} days" if hours >= 48 else f"{hours:.1f} h"
    return f"{when} at {STEP_RATE:,.0f} steps a second"


def worlds_cost(worlds: int) -> str:
    """What ``worlds`` worlds stepped together hold in memory, in words."""
    return (f"{worlds:,} worlds hold about {gib(worlds * WORLD_BYTES)} of simulator state "
            f"alone ({WORLD_BYTES // 2**10} KiB a world)")


def at_most(value: int, limit: int, cost: str) -> None:
    """In a field validator: fail when ``value`` exceeds ``limit``, saying ``cost``."""
    if value > limit:
        raise PydanticCustomError("too_large", "at most {limit}: {cost}",
                                  {"limit": f"{limit:,}", "cost": cost})


def too_large(model: str, found: Sequence[tuple[str, int, int, str]]) -> ValidationError:
    """One validation error for every ``(field, value, limit, cost)`` whose value exceeds its
    limit; raise it from a model validator and each error names its own field."""
    return ValidationError.from_exception_data(model, [
        InitErrorDetails(type=PydanticCustomError(
            "too_large", "at most {limit}: {cost}", {"limit": f"{limit:,}", "cost": cost}),
            loc=(field,), input=value)
        for field, value, limit, cost in found
    ])


def check_caps(model: str, found: Sequence[tuple[str, int, int, str]]) -> None:
    """Raise :func:`too_large` for the entries of ``found`` whose value exceeds its limit."""
    over = [entry for entry in found if entry[1] > entry[2]]
    if over:
        raise too_large(model, over)


def memory_bytes() -> int:
    """Physical memory of this machine (bytes): the bound a stage's estimated size must fit."""
    import os

    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))

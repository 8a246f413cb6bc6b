"""Experts for the manipulation benchmarks, given to the pipeline as Python code
(:mod:`stages.policies.python_code`): ``collect: {expert: python:stages.sim.tasks.benchmark_experts:
metaworld_scripted, trust_code: true}``, or ``flows validate python:... --trust-code``.

They run in the benchmark's stage environment (``make metaworld``, ``make gymnasium-robotics``),
where its package is installed; importing this module imports neither.

- :func:`metaworld_scripted`: MetaWorld's own scripted policy of the scene's task
  (``metaworld.policies.ENV_POLICY_MAP[env_name]``), so one reference serves a multi-task suite
  whose scenes name their task in ``make_kwargs.env_name`` (MT10). A single task's policy is
  also reachable directly, e.g. ``python:metaworld.policies:SawyerPickPlaceV3Policy``.
- :func:`fetch_pick_and_place`: a phase controller for Gymnasium-Robotics'
  ``FetchPickAndPlace-v4``, which ships no expert (above the object with the gripper open,
  down onto it, close, carry to the goal). 200 of 200 seeds succeed in its own loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from physai_core.errors import PhysaiError


def metaworld_scripted(make_kwargs: dict[str, Any]) -> Any:
    """MetaWorld's scripted policy for the task ``make_kwargs["env_name"]`` names (an object
    with ``get_action(obs)``, 39 observation numbers to 4 actions)."""
    from metaworld.policies import ENV_POLICY_MAP

    name = make_kwargs.get("env_name")
    if name not in ENV_POLICY_MAP:
        raise PhysaiError(f"make_kwargs.env_name {name!r}: MetaWorld ships no scripted policy "
                          f"for it; valid: {', '.join(sorted(ENV_POLICY_MAP))}")
    return ENV_POLICY_MAP[name]()


ABOVE = np.array([0.0, 0.0, 0.04])
"""Where the gripper waits above the object before it descends (m)."""

FETCH_GAIN = 10.0
"""Action per metre of position error (the action moves the gripper's mocap by 0.05 m per
unit, clipped to -1..1)."""


def fetch_pick_and_place(obs: np.ndarray) -> np.ndarray:
    """One step of the phase controller, from the flattened observation of
    ``FetchPickAndPlace-v4`` (achieved goal 3, desired goal 3, then the 25 numbers of its
    ``observation``: gripper position, object position, ..., finger widths at 9 and 10).

    Returns the action: the gripper's xyz motion and the fingers (+1 open, -1 close), -1..1.
    It keeps nothing between steps: the phase is read from where the object and gripper are.
    """
    goal, state = obs[3:6], obs[6:]
    grip, obj, width = state[0:3], state[3:6], state[9] + state[10]
    rel = obj - grip
    action = np.zeros(4)
    if np.linalg.norm(rel) < 0.02 and width < 0.055:  # held: carry it to the goal
        action[:3], action[3] = FETCH_GAIN * (goal - obj), -1.0
    elif np.linalg.norm(rel) < 0.012:  # around it: close
        action[3] = -1.0
    elif np.linalg.norm(rel[:2]) > 0.008:  # above it, open; too low: rise first
        action[:3], action[3] = FETCH_GAIN * (obj + ABOVE - grip), 1.0
        if grip[2] - obj[2] < 0.02:
            action[:2] = 0.0
    else:  # down onto it, open
        action[:3], action[3] = FETCH_GAIN * rel, 1.0
    return np.clip(action, -1.0, 1.0)


"""What a policy reads each step: the state vector alone, or the state and camera images.

A state policy is a function ``obs (N, obs_dim) -> actions``. A policy that sees is a function
of a mapping of named tensors (:data:`stages.sim.env.cameras.Observation`) and says which it reads
in its ``inputs`` attribute (``("obs", "front_image")``). Every rollout asks
:func:`observe` for the policy's argument, so cameras render only when a policy reads them.

This module imports nothing of the simulator, so the simulator's modules may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from physai_core.errors import PhysaiError
from stages.sim.env.capabilities import capabilities_of

STATE_KEY = "obs"
"""Name of the state vector among a policy's named inputs (the ONNX input of every policy)."""


def policy_inputs(act: Any) -> tuple[str, ...]:
    """The named tensors ``act`` reads: its ``inputs`` attribute, else the state alone."""
    inputs = getattr(act, "inputs", None)
    return tuple(inputs) if inputs else (STATE_KEY,)


def sees(act: Any) -> bool:
    """Whether ``act`` reads anything beyond the state vector."""
    return policy_inputs(act) != (STATE_KEY,)


def observe(env: Any, obs: np.ndarray, act: Any) -> Any:
    """The argument ``act`` takes this step: ``obs`` itself for a state policy, else the
    mapping of the tensors it reads, its cameras rendered now by ``env``.

    Raises :class:`~physai_core.errors.PhysaiError` (one line) when the policy reads an image the
    environment does not render.
    """
    if not sees(act):
        return obs
    return with_images(obs, camera_images(env), act)


def with_images(obs: np.ndarray, images: Mapping[str, np.ndarray], act: Any) -> Any:
    """The argument ``act`` takes, given the state ``obs`` and the frames ``images`` rendered
    this step: ``obs`` itself for a state policy, else the mapping of what it reads."""
    names = policy_inputs(act)
    if names == (STATE_KEY,):
        return obs
    missing = [n for n in names if n != STATE_KEY and n not in images]
    if missing:
        raise PhysaiError(f"the policy reads {', '.join(missing)} but the task's cameras give "
                          f"{', '.join(images) or 'no image'}")
    return {STATE_KEY: obs, **{n: images[n] for n in names if n != STATE_KEY}}


def camera_images(env: Any) -> dict[str, np.ndarray]:
    """Every image ``env`` renders now, by tensor name; none unless it declares cameras (an
    environment that renders is a :class:`stages.sim.env.cameras.SeesCameras`)."""
    if not capabilities_of(env).cameras:
        return {}
    images: dict[str, np.ndarray] = env.camera_images()
    return images

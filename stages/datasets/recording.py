"""Recording demonstrations: an expert labels every world of a batched environment each step
(the task's scripted expert, a trained teacher policy on the noise-free observation, or Python
code: a benchmark's scripted policy or a team's controller), a driver chooses what is executed,
and each world's steps become one :class:`Episode`. An expert with ``start_episode(env)`` is told
as each episode starts (a stateful controller starts afresh in every world).

The collect stage records its dataset this way and DAgger its rounds; both sit above this
layer, so the recording itself lives with the datasets it produces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from physai_core.errors import PhysaiError
from stages.core.units import ActionRange
from stages.datasets.demonstrations import Episode
from stages.policies.local import load_actor
from stages.policies.python_code import PythonPolicy, python_policy
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.capabilities import ShowsCleanObservation, capabilities_of
from stages.sim.env.observation import camera_images

if TYPE_CHECKING:
    from stages.artifacts.records import Policy
    from stages.orchestration.context import StageContext


Expert = Callable[[BatchedEnv], np.ndarray]
"""Labels the current state of every world: actions in [-1, 1], shape (num_worlds, act_dim)."""


def scripted_expert(env: BatchedEnv) -> np.ndarray:
    """The task's scripted expert."""
    return env.expert_action()


def teacher_expert(teacher: Policy, ctx: StageContext) -> Expert:
    """A trained policy acting on the noise-free observation."""
    act = load_actor(ctx.store.open_payload(teacher))

    def label(env: BatchedEnv) -> np.ndarray:
        return np.asarray(act(_clean(env, "a teacher")), dtype=np.float32)

    return label


def _clean(env: BatchedEnv, who: str) -> np.ndarray:
    """The noise-free observation of every world, which an expert acts on."""
    if not capabilities_of(env).clean_observation:
        raise PhysaiError(f"{type(env).__name__} cannot show {who} the clean observation")
    return cast(ShowsCleanObservation, env).clean_observation()


class PythonExpert:
    """Python code as the expert (:mod:`stages.policies.python_code`): every world's own
    controller, made afresh as each episode starts, acting on the noise-free observation."""

    def __init__(self, policy: PythonPolicy) -> None:
        self.policy = policy

    def start_episode(self, env: BatchedEnv) -> None:
        """A new episode in every world of ``env``: new controllers, given its make kwargs."""
        self.policy.start_episode(env)

    def __call__(self, env: BatchedEnv) -> np.ndarray:
        return self.policy(_clean(env, self.policy.ref))


def python_expert(ref: str, actions: ActionRange, file: object, field: str) -> PythonExpert:
    """The expert Python code ``ref`` names, acting in ``actions``' native units; import
    problems name ``file`` and ``field`` (trust is the caller's to check)."""
    return PythonExpert(python_policy(ref, actions, file, field))


def start_episode(expert: object, env: BatchedEnv) -> None:
    """Tell ``expert`` (if it keeps anything per episode) that every world of ``env`` starts
    a new episode."""
    start = getattr(expert, "start_episode", None)
    if callable(start):
        start(env)


Driver = Callable[[np.ndarray, dict[str, np.ndarray], np.ndarray], np.ndarray]
"""What a recording executes each step, given the observation, the camera frames rendered for
it and the expert's label. Shapes: obs (N, obs_dim), label and result (N, act_dim)."""


def record_episodes(env: BatchedEnv, expert: Expert, drive: Driver, seed: int,
                    instructions: Sequence[str] | None = None) -> list[Episode]:
    """One episode per world of ``env``: at every step the expert labels the state, the task's
    cameras render (a task with cameras), ``drive`` chooses what is executed (clipped to
    [-1, 1]); the observation, frames and label are recorded, with each world's instruction
    (``instructions``, one a world, where its scene gives them)."""
    obs = env.reset()
    start_episode(expert, env)
    n, steps = env.num_worlds, env.episode_steps
    obs_buf = np.empty((steps, n, env.obs_dim), np.float32)
    act_buf = np.empty((steps, n, env.act_dim), np.float32)
    rew_buf = np.empty((steps, n), np.float32)
    done_buf = np.empty((steps, n), bool)
    image_buf: dict[str, np.ndarray] = {}
    for t in range(steps):
        label = expert(env)
        images = camera_images(env)
        for key, frames in images.items():
            image_buf.setdefault(key, np.empty((steps, *frames.shape), frames.dtype))[t] = frames
        executed = drive(obs, images, label)
        obs_buf[t], act_buf[t] = obs, label
        obs, rew_buf[t], done_buf[t] = env.step(np.clip(executed, -1.0, 1.0))
    success = env.success()
    return [
        Episode(obs_buf[:, i], act_buf[:, i], rew_buf[:, i], done_buf[:, i], bool(success[i]),
                seed, {key: np.ascontiguousarray(buf[:, i]) for key, buf in image_buf.items()},
                instructions[i] if instructions is not None else None)
        for i in range(n)
    ]

"""Overlapped rollouts: the policy of one group of worlds runs while the others step in C.

A rollout through one environment takes turns: the policy computes every world's action, then
the batch steps every world, and the task's Python reads the new state of every world before
the policy can run again. MuJoCo's ``Batch.step`` and torch's and ONNX Runtime's inference
all release the GIL (``docs/validation.md``, Overlapped rollouts), but nothing can run beside
a step whose every world the next Python line waits for.

:class:`GroupedEnv` splits a scene's worlds into groups, each an environment of its own with
its own seed and its share of the C stepping threads (one on a machine of as many cores as
groups). :meth:`GroupedEnv.episode` runs every group's episode
on a thread of its own (group 0 on the caller's), each calling the policy for its worlds and
stepping them in turn, so that one group's policy and Python run while another group's worlds
step. Each group is exactly the environment it would be alone (same seed, same worlds, same
order of every random draw), so the outcomes per world and per seed are those of the groups
run one after the other (``overlap=False``), whatever the timing.

The task's Python between two steps reads every world of its environment, and the order of
the random draws runs across all of them (pushes, observation noise, restarts), so the worlds
of one environment cannot be stepped in parts without changing what each world draws: the
groups are environments of their own.

A grouped scene is not the one-environment scene of the same seed: group 0 is seeded with the
scene's seed and group g > 0 with ``SeedSequence([seed, g])``, as the sequential gate seeds
its chunks (:func:`stages.evaluation.suite.evaluate_scene_sequential`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from threading import Event, Thread
from typing import cast

import numpy as np

from stages.sim.env.batched import BatchedEnv, default_num_threads
from stages.sim.env.bodies import BodyLayout, RecordsBodies
from stages.sim.env.cameras import CameraSpec, SeesCameras
from stages.sim.env.capabilities import (
    EnvCapabilities,
    ExplainsFailures,
    Falls,
    StepsOffThread,
    capabilities_of,
)

PolicyFn = Callable[[np.ndarray], np.ndarray]
"""A policy: observations (n, obs_dim) float32 to actions (n, act_dim)."""



def group_sizes(worlds: int, groups: int) -> list[int]:
    """``worlds`` split into ``groups`` consecutive groups, the first ones larger by one where
    they do not divide evenly; refuses fewer worlds than groups."""
    if groups < 1 or worlds < groups:
        raise ValueError(f"cannot split {worlds} worlds into {groups} groups")
    base, extra = divmod(worlds, groups)
    return [base + (g < extra) for g in range(groups)]


def group_threads(groups: int) -> int:
    """C threads stepping each of ``groups`` groups: the stepping threads
    (:func:`~stages.sim.env.batched.default_num_threads`, every core unless
    ``$PHYSAI_SIM_THREADS`` says otherwise) shared out among the groups, at least one each:
    two groups on two cores step on one thread each, on sixteen cores on eight each."""
    return max(1, default_num_threads() // groups)


def group_seed(seed: int, group: int) -> int:
    """The seed of group ``group`` of a scene seeded ``seed``: the seed itself for group 0,
    else the first word of ``SeedSequence([seed, group])`` (the sequential gate's chunks)."""
    if group == 0:
        return seed
    return int(np.random.SeedSequence([seed, group]).generate_state(1)[0])


class GroupedEnv:
    """N worlds as consecutive groups, each an environment of its own, seen as one
    :class:`~stages.sim.env.batched.BatchedEnv` of N worlds (world i of group g is world
    ``offset(g) + i``).

    :meth:`step` steps every group with the actions of its worlds; :meth:`episode` runs a whole
    episode with the policy called once per group and step, overlapped with the other groups'
    physics when ``overlap`` is True.
    """

    def __init__(self, envs: Sequence[BatchedEnv], *, overlap: bool = True) -> None:
        """Group ``envs`` (at least one, all of the same task) in order.

        Args:
            envs: The groups; each is closed by :meth:`close`.
            overlap: Step each group's physics on a thread of its own (where the environment
                allows it, :class:`SplitStep`) while the policy runs for another.
        """
        if not envs:
            raise ValueError("a grouped environment needs at least one group")
        first = envs[0]
        shape = (first.obs_dim, first.act_dim, first.episode_steps)
        odd = [i for i, e in enumerate(envs) if (e.obs_dim, e.act_dim, e.episode_steps) != shape]
        if odd:
            raise ValueError(f"groups {odd} differ from group 0 in observation, action or "
                             "episode length")
        self.groups = tuple(envs)
        self.overlap = overlap
        bounds = np.cumsum([0, *(e.num_worlds for e in envs)])
        self._slices = [slice(int(a), int(b)) for a, b in pairwise(bounds)]
        self._threaded = overlap and len(envs) > 1 and all(
            capabilities_of(e).steps_off_thread for e in envs)

    @property
    def capabilities(self) -> EnvCapabilities:
        """What the groups can do (group 0's: they share a task) and this class passes on:
        cameras, the model draws and the failure modes; :meth:`fallen` answers for every
        group."""
        first = capabilities_of(self.groups[0])
        return EnvCapabilities(cameras=first.cameras, falls=True, model_draws=first.model_draws,
                               failure_modes=first.failure_modes)

    @property
    def num_worlds(self) -> int:
        """Worlds N of every group together."""
        return self._slices[-1].stop

    @property
    def obs_dim(self) -> int:
        """Length of one world's observation vector."""
        return self.groups[0].obs_dim

    @property
    def act_dim(self) -> int:
        """Length of one world's action vector."""
        return self.groups[0].act_dim

    @property
    def episode_steps(self) -> int:
        """Control steps in every episode."""
        return self.groups[0].episode_steps

    def reset(self) -> np.ndarray:
        """Start a new episode in every group. Returns: shape (N, obs_dim), float32."""
        return np.concatenate([e.reset() for e in self.groups])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One control step of every group, each with the rows of ``actions`` of its worlds
        (shape (N, act_dim)). Returns ``(obs, reward, done)`` of all N worlds."""
        parts = [e.step(actions[s]) for e, s in zip(self.groups, self._slices, strict=True)]
        return tuple(np.concatenate(p) for p in zip(*parts, strict=True))  # type: ignore[return-value]

    def episode(self, act: PolicyFn, watch: Callable[[int], None] | None = None, *,
                policy_of: Callable[[int, BatchedEnv], Callable[[np.ndarray], np.ndarray]]
                | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One episode in every group, the policy called once per group and control step.

        With ``overlap`` (and environments that allow it), group 0 runs its episode on this
        thread and every other group on a thread of its own, each calling the policy for its
        worlds and stepping them in turn: the physics and the policy release the GIL, so one
        group's policy runs while another group's worlds step. Without, the groups run their
        episodes one after the other on this thread. Either way each group sees the same
        calls in the same order, so its outcomes do not depend on the timing.

        Args:
            act: The policy, called with one group's observations at a time, from several
                threads at once with ``overlap``; it must keep nothing from one call to the
                next.
            watch: Called on this thread with k once group 0 holds the state after k control
                steps (0: the reset) and before its next step begins: the moment to film or
                record group 0's worlds.
            policy_of: ``(g, env)`` to what group g calls with its state vectors each step
                (default: ``act``): a policy that reads cameras renders them there, from
                group g's environment, on group g's thread, so one group's frames are drawn
                while another group's policy runs and its worlds step.

        Returns:
            Every world's return and its reward at the last step. Shapes: (N,), (N,) float.
        """
        n = len(self.groups)
        results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n
        if not self._threaded:
            for g in range(n):
                results[g] = self._group_episode(g, self._policy(g, act, policy_of),
                                                 watch if g == 0 else None)
        else:
            stop = Event()
            errors: list[BaseException] = []

            def run(g: int) -> None:
                try:
                    results[g] = self._group_episode(g, self._policy(g, act, policy_of),
                                                     None, stop)
                except BaseException as exc:  # handed to the thread that runs the episode
                    errors.append(exc)
                    stop.set()
                finally:  # what this thread rendered with, the caller's thread may free
                    cast(StepsOffThread, self.groups[g]).release_thread()

            workers = [Thread(target=run, args=(g,), name=f"group-{g}", daemon=True)
                       for g in range(1, n)]
            for worker in workers:
                worker.start()
            try:
                results[0] = self._group_episode(0, self._policy(0, act, policy_of), watch,
                                                 stop)
            finally:
                if results[0] is None:  # this thread's group failed: the others stop too
                    stop.set()
                for worker in workers:
                    worker.join()
            if errors:
                raise errors[0]
        done = [r for r in results if r is not None]
        return np.concatenate([r[0] for r in done]), np.concatenate([r[1] for r in done])

    def _policy(self, group: int, act: PolicyFn,
                policy_of: Callable[[int, BatchedEnv], Callable[[np.ndarray], np.ndarray]]
                | None) -> Callable[[np.ndarray], np.ndarray]:
        """What group ``group`` steps with (see :meth:`episode`)."""
        return act if policy_of is None else policy_of(group, self.groups[group])

    def _group_episode(self, group: int, act: Callable[[np.ndarray], np.ndarray],
                       watch: Callable[[int], None] | None,
                       stop: Event | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Group ``group``'s episode: its return and last reward per world (see
        :meth:`episode`); ends early, unfinished, once ``stop`` is set."""
        env = self.groups[group]
        obs = env.reset()
        returns = np.zeros(env.num_worlds)
        reward = np.zeros(env.num_worlds, np.float32)
        if watch is not None:
            watch(0)
        for k in range(1, self.episode_steps + 1):
            if stop is not None and stop.is_set():
                break
            obs, reward, _ = env.step(act(obs))
            returns += reward
            if watch is not None:
                watch(k)
        return returns, reward

    @property
    def cameras(self) -> tuple[CameraSpec, ...]:
        """The cameras every group renders (group 0's; the groups share a task); none where
        the groups render none."""
        if not self.capabilities.cameras:
            return ()
        return cast(SeesCameras, self.groups[0]).cameras

    def camera_images(self) -> dict[str, np.ndarray]:
        """Every group's camera images now, in world order, by tensor name: what a policy
        that reads cameras is given when all N worlds step together (:meth:`step`)."""
        parts = [cast(SeesCameras, e).camera_images() for e in self.groups]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def success(self) -> np.ndarray:
        """Every group's success predicate, in world order. Shape: (N,), bool."""
        return np.concatenate([e.success() for e in self.groups])

    def fallen(self) -> np.ndarray:
        """Every group's fallen robots (none where a group has no falls). Shape: (N,), bool."""
        return np.concatenate([
            np.asarray(cast(Falls, e).fallen(), bool) if capabilities_of(e).falls
            else np.zeros(e.num_worlds, bool) for e in self.groups])

    def expert_action(self) -> np.ndarray:
        """Every group's scripted expert action. Shape: (N, act_dim), float32."""
        return np.concatenate([e.expert_action() for e in self.groups])

    def episode_conditions(self) -> dict[str, np.ndarray]:
        """Every group's episode conditions, joined by name. Shape of each: (N,)."""
        parts = [e.episode_conditions() for e in self.groups]  # type: ignore[attr-defined]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def condition_units(self) -> dict[str, str]:
        """The unit of every condition (the groups share them)."""
        return dict(self.groups[0].condition_units())  # type: ignore[attr-defined]

    def episode_failures(self) -> np.ndarray:
        """Every group's failure modes (where the groups explain them). Shape: (N,), str."""
        return np.concatenate([cast(ExplainsFailures, e).episode_failures()
                               for e in self.groups])

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """Every group's miss, in the unit the groups share. Shape: (N,)."""
        parts = [e.episode_miss() for e in self.groups]  # type: ignore[attr-defined]
        return np.concatenate([p[0] for p in parts]), parts[0][1]

    def locate(self, world: int) -> tuple[int, int]:
        """The group of world ``world`` (an index of the N) and its index in that group."""
        for g, part in enumerate(self._slices):
            if part.start <= world < part.stop:
                return g, world - part.start
        raise ValueError(f"worlds must be in [0, {self.num_worlds}), got {world}")

    def first_group_worlds(self) -> int:
        """Worlds of group 0, the ones :meth:`episode` lets a caller watch."""
        return self.groups[0].num_worlds

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Frames of ``worlds`` (indices of the N), each rendered by its group.
        Shape: (len(worlds), height, width, 3), uint8."""
        frames = [self.groups[g].render([w], width, height, camera)
                  for g, w in map(self.locate, worlds)]
        return np.concatenate(frames) if frames else np.zeros((0, height, width, 3), np.uint8)

    def close(self) -> None:
        """Close every group."""
        for env in self.groups:
            env.close()


class GroupedBodiesEnv(GroupedEnv):
    """A :class:`GroupedEnv` whose groups record their bodies
    (:class:`~stages.sim.env.bodies.RecordsBodies`)."""

    @property
    def capabilities(self) -> EnvCapabilities:
        """A grouped environment's, and its bodies."""
        return replace(super().capabilities, body_layout=True)

    def body_layout(self) -> BodyLayout | None:
        """The bodies every group shares (group 0's layout)."""
        return cast(RecordsBodies, self.groups[0]).body_layout()

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every body's pose in each of ``worlds`` (indices of the N), from its group.
        Shape: (len(worlds), bodies, 7)."""
        return np.concatenate([cast(RecordsBodies, self.groups[g]).body_poses([w])
                               for g, w in map(self.locate, worlds)])


def grouped_env(make_env: Callable[[int, int, int | None], BatchedEnv], worlds: int, seed: int,
                groups: int, *, overlap: bool = True) -> BatchedEnv | GroupedEnv:
    """A scene of ``worlds`` worlds seeded ``seed``: one environment ``make_env(worlds, seed,
    None)`` for ``groups`` = 1, else :func:`group_sizes` groups seeded :func:`group_seed`, each
    ``make_env(size, seed, threads)`` stepping on :func:`group_threads` C threads (the groups
    run beside each other).

    Args:
        make_env: ``(worlds, seed, threads)`` to an environment; ``threads`` None: the default.
        worlds: Worlds of the scene (>= ``groups``).
        seed: The scene's seed.
        groups: Groups to split the worlds into (>= 1).
        overlap: See :class:`GroupedEnv`.
    """
    if groups == 1:
        return make_env(worlds, seed, None)
    envs: list[BatchedEnv] = []
    threads = group_threads(groups)
    try:
        for g, size in enumerate(group_sizes(worlds, groups)):
            envs.append(make_env(size, group_seed(seed, g), threads))
    except BaseException:
        for env in envs:
            env.close()
        raise
    if all(capabilities_of(env).body_layout for env in envs):
        return GroupedBodiesEnv(envs, overlap=overlap)
    return GroupedEnv(envs, overlap=overlap)



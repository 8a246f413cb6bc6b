"""A batched simulator seen as an rsl_rl vectorized environment, with per-world episodes.

rsl_rl's PPO wants every world to run its own episode: a robot that falls is terminated and
restarted at once, while the others go on. The batched simulators step fixed-length episodes
in lockstep; this adapter has fallen worlds restart in place (``step(...,
restart_fallen=True)``) and ends every surviving world's episode as a time-out when the batch's
episode ends, so PPO bootstraps the value of time-outs and not of falls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from tensordict import TensorDict

from physai_core.errors import PhysaiError
from stages.sim.env.capabilities import Falls, Restarts, capabilities_of

if TYPE_CHECKING:
    from stages.sim.env.batched import BatchedEnv


OBS_GROUP = "policy"
"""Name of the one observation group the adapter returns (actor and critic both read it)."""


class RslRlEnv:
    """rsl_rl's ``VecEnv`` interface over a batched simulator whose worlds, where they can
    fall, can restart single worlds (it declares ``restarts``,
    :mod:`stages.sim.env.capabilities`).

    Besides stepping, it keeps the episode statistics a training log wants: the return and
    length of every finished episode and whether it ended in a fall, read and cleared with
    :meth:`pop_episode_stats`.
    """

    def __init__(self, env: BatchedEnv, device: str = "cpu") -> None:
        """Wrap ``env`` and start its first episode; refuses an environment whose robots can
        fall but that cannot restart them."""
        caps = capabilities_of(env)
        if caps.falls and not caps.restarts:
            raise PhysaiError(f"{type(env).__name__} cannot restart single worlds, which PPO "
                              "training needs")
        self.env = env
        self.num_envs = env.num_worlds
        self.num_actions = env.act_dim
        self.max_episode_length = env.episode_steps
        self.device = device
        self.cfg: dict[str, Any] = {}
        self.episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long, device=device)
        self._falls = caps.falls
        self._restarts_itself = caps.restarts
        self._obs = env.reset()
        self._return = np.zeros(self.num_envs)
        self._length = np.zeros(self.num_envs, dtype=np.int64)
        self._finished_returns: list[float] = []
        self._finished_lengths: list[int] = []
        self._finished_falls: list[bool] = []
        self._finished_successes: list[bool] = []

    def get_observations(self) -> TensorDict:
        """The current observation of every world, as rsl_rl's observation dictionary."""
        return self._wrap(self._obs)

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """One control step in every world; fallen worlds restart, all restart at episode end.

        Returns:
            ``(obs, rewards, dones, extras)`` as rsl_rl expects; ``extras["time_outs"]`` marks
            episodes cut by the time limit rather than ended by a fall.
        """
        act = actions.detach().cpu().numpy()
        if self._restarts_itself:
            # the simulator restarts fallen robots before observing: one observation per step
            restarts = cast(Restarts, self.env)
            obs, reward, episode_over = restarts.step(act, restart_fallen=True)
            fell = restarts.restarted
            if episode_over.all():
                fell = fell | self._fallen()  # fell on the last step: everything resets
        else:
            obs, reward, episode_over = self.env.step(act)
            fell = self._fallen()
        self._return += reward
        self._length += 1
        time_out = episode_over & ~fell
        done = fell | episode_over
        self._record(np.flatnonzero(done), fell)
        if episode_over.all():
            self._finished_successes.extend(self.env.success()[time_out].tolist())
            obs = self.env.reset()
        self._obs = obs
        # Everything on the learner's device: rsl_rl's process_env_step adds to the rewards
        # tensors of its own device, as its runner would have moved them.
        device = self.device
        self.episode_length_buf = torch.as_tensor(self._length, device=device)
        extras = {"time_outs": torch.as_tensor(time_out, device=device), "log": {}}
        return (
            self._wrap(obs),
            torch.as_tensor(reward, dtype=torch.float32, device=device),
            torch.as_tensor(done, device=device),
            extras,
        )

    def _fallen(self) -> np.ndarray:
        """Worlds whose robot has fallen (never, for a task without falls)."""
        if not self._falls:
            return np.zeros(self.num_envs, dtype=bool)
        return np.asarray(cast(Falls, self.env).fallen(), dtype=bool)

    def pop_episode_stats(self) -> tuple[list[float], list[int], list[bool], list[bool]]:
        """Returns, lengths and fall flags of the episodes finished since the last call, and
        the task's success predicate of the worlds that reached the time limit.

        The success predicate covers a world's whole batch episode; a world restarted after a
        fall is judged on its last life, so it is a training signal, not a validation figure.
        """
        stats = (self._finished_returns, self._finished_lengths, self._finished_falls,
                 self._finished_successes)
        self._finished_returns, self._finished_lengths = [], []
        self._finished_falls, self._finished_successes = [], []
        return stats

    def _record(self, worlds: np.ndarray, fell: np.ndarray) -> None:
        """Move the finished episodes of ``worlds`` into the statistics and clear them."""
        if not worlds.size:
            return
        self._finished_returns.extend(self._return[worlds].tolist())
        self._finished_lengths.extend(self._length[worlds].tolist())
        self._finished_falls.extend(fell[worlds].tolist())
        self._return[worlds] = 0.0
        self._length[worlds] = 0

    def _wrap(self, obs: np.ndarray) -> TensorDict:
        """Observations as a TensorDict with the one group :data:`OBS_GROUP`."""
        tensor = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32)).to(self.device)
        return TensorDict({OBS_GROUP: tensor}, batch_size=[self.num_envs], device=self.device)

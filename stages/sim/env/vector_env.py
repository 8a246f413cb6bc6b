"""Fixed-length episodes over a vector env whose worlds end on their own.

A vector env (Gymnasium's, Isaac Lab's direct env) steps N worlds, each of which may terminate
(or truncate itself) at any step. The pipeline's episodes last the scene's ``episode_steps``
all the same: a world that ends early stays as it ended (its observation and return frozen, no
more reward) until the others are done, so that the success predicate sees how its episode
ended; ``step(..., restart_fallen=True)`` restarts it instead, and :meth:`respawn` restarts
chosen worlds (per-world episodes for PPO training).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from physai_core.errors import PhysaiError
from stages.sim.env.batched import EpisodeWorlds

if TYPE_CHECKING:
    from stages.sim.scenes.scene import SuccessConfig


class VectorEpisodes(EpisodeWorlds):
    """The episodes of a vector env's N worlds, judged by a scene's success predicate.

    A subclass builds its vector env, calls :meth:`_start_vector` after
    :meth:`~stages.sim.env.batched.EpisodeWorlds._start_worlds`, and translates to its library:

    - :meth:`_vector_reset`: a fresh episode in every world;
    - :meth:`_vector_step`: one step of every world with actions clipped to [-1, 1];
    - :meth:`_reset_worlds`: fresh episodes in some worlds, the others untouched.

    It may extend :meth:`_clear` (episode statistics of its own), :meth:`_worlds_ended` (what to
    keep of a world as it freezes), :meth:`_restart_ended` (a library that restarts ended worlds
    itself) and :meth:`_info_success` (success predicates other than ``survive`` and
    ``min_return``).
    """

    _action_dtype: ClassVar[type] = np.float64
    """The dtype actions are checked and clipped in before :meth:`_vector_step`."""

    _family: ClassVar[str] = "a vector env's task"
    """The kind of task, in words, for messages: ``a Gymnasium task``."""

    _task: str
    """The task id, set by the subclass."""

    def _start_vector(self, obs_dim: int, act_dim: int, success: SuccessConfig) -> None:
        """Set the sizes and the success predicate, and empty the episode statistics.

        Args:
            obs_dim: Length of one world's observation vector.
            act_dim: Length of one world's action vector.
            success: The scene's success predicate.
        """
        n = self._num_worlds
        self._obs_dim = obs_dim
        self._act_dim = act_dim
        self._success = success
        self._obs = np.zeros((n, obs_dim), np.float32)
        self._return = np.zeros(n, np.float64)
        self._ended = np.zeros(n, bool)
        self._fallen = np.zeros(n, bool)
        self._everyone = np.ones(n, bool)
        # Flags that spare the step's hot path the masked updates while no world has ended and
        # none was restarted in the last step.
        self._any_ended = False
        self._restarted_any = False

    @property
    def obs_dim(self) -> int:
        """Length of one world's (flattened) observation vector."""
        return self._obs.shape[1]

    @property
    def act_dim(self) -> int:
        """Length of one world's action vector."""
        return self._act_dim

    def reset(self) -> np.ndarray:
        """Start a new episode in every world.

        Returns:
            Observations. Shape: (num_worlds, obs_dim), float32.
        """
        self._clear(self._everyone)
        self._ended[:] = False
        self._any_ended = False
        self._restarted[:] = False
        self._restarted_any = False
        self._obs[:] = self._vector_reset()
        self._steps_done = 0
        return self._obs.copy()

    def step(
        self, actions: np.ndarray, *, restart_fallen: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply one control step in every world.

        Args:
            actions: Normalized actions, clipped to [-1, 1] (what the library receives is the
                subclass's to say). Shape: (num_worlds, act_dim).
            restart_fallen: Restart the worlds whose env terminated (or truncated itself) in
                this step, as :meth:`respawn` does (not on the episode's last step);
                :attr:`restarted` tells which. Otherwise such a world stays as it ended until
                the episode's end.

        Returns:
            ``(obs, reward, done)``: shape (num_worlds, obs_dim) float32, (num_worlds,) float32
            (zero for a world that has ended) and (num_worlds,) bool, True for every world at
            the last step of the episode.
        """
        actions = self._checked_actions(actions, self._action_dtype)
        obs, reward, terminated, truncated, final = self._vector_step(
            np.clip(actions, -1.0, 1.0))
        self._steps_done += 1
        last = self._steps_done >= self._episode_steps
        ending = terminated | truncated
        if self._any_ended:
            live = ~self._ended
            reward = np.where(live, reward, 0.0)
            ending &= live
            self._obs[live] = obs[live]
        else:
            self._obs[:] = obs
        self._return += reward
        if self._restarted_any:
            self._restarted = np.zeros(self._num_worlds, bool)
            self._restarted_any = False
        if ending.any():
            self._fallen |= terminated & ending
            if restart_fallen and not last:
                self._restart_ended(ending)
                self._restarted = ending
                self._restarted_any = True
            else:
                if final is not None:
                    self._obs[ending] = final[ending]
                if not last:
                    self._ended |= ending
                    self._any_ended = True
                    self._worlds_ended(ending)
        return self._obs.copy(), reward.astype(np.float32), np.full(self._num_worlds, last)

    def success(self) -> np.ndarray:
        """The scene's success predicate for the episode so far. Shape: (num_worlds,), bool.

        ``survive``: the world's env has not terminated; ``min_return``: the episode's return
        reaches it; any other predicate is :meth:`_info_success`'s.
        """
        self._require_episode()
        rule = self._success
        if rule.survive:
            return ~self._fallen
        if rule.min_return is not None:
            return self._return >= rule.min_return
        return self._info_success()

    def expert_action(self) -> np.ndarray:
        """Always an error: a task of a library's vector env has no scripted expert."""
        raise PhysaiError(
            f"{self._task} has no scripted expert ({self._family} has none); collect needs "
            "`expert:` a policy: a policy digest in the artifact store, or models:/NAME@ALIAS "
            "or models:/NAME/VERSION from the registry"
        )

    def _live(self) -> np.ndarray:
        """Worlds that have not ended in this episode. Shape: (num_worlds,), bool."""
        return ~self._ended if self._any_ended else self._everyone

    def _fallen_worlds(self) -> np.ndarray:
        """Worlds whose env terminated since their episode (re)started. Shape: (N,), bool."""
        return self._fallen

    def _observe(self) -> np.ndarray:
        """Every world's observation (an ended world's as it ended). Shape: (N, obs_dim)."""
        return self._obs.copy()

    def _clean_observation(self) -> np.ndarray:
        """The observation as :meth:`_observe` gives it: the env's own, with no noise added
        by the adapter. Shape: (N, obs_dim), float32."""
        return self._obs.copy()

    def _restart(self, worlds: np.ndarray) -> None:
        """Fresh episodes in ``worlds`` (int64 indices); the other worlds continue."""
        mask = np.zeros(self._num_worlds, bool)
        mask[worlds] = True
        self._restart_worlds(mask)

    def _restart_worlds(self, mask: np.ndarray) -> None:
        """Fresh episodes in the worlds of ``mask`` (shape (N,), bool): their statistics
        cleared, no longer ended, and their observation the library's fresh one."""
        self._clear(mask)
        self._ended[mask] = False
        self._any_ended = bool(self._ended.any())
        obs = self._reset_worlds(mask)
        self._obs[mask] = obs[mask]

    def _restart_ended(self, mask: np.ndarray) -> None:
        """Fresh episodes in the worlds of ``mask``, whose env ended in this step (restarted
        by ``step(..., restart_fallen=True)``)."""
        self._restart_worlds(mask)

    def _clear(self, mask: np.ndarray) -> None:
        """Forget the episode statistics of the worlds of ``mask`` (shape (N,), bool)."""
        self._fallen[mask] = False
        self._return[mask] = 0.0

    def _worlds_ended(self, mask: np.ndarray) -> None:
        """The worlds of ``mask`` ended early in this step and freeze as they are now."""

    def _info_success(self) -> np.ndarray:
        """A success predicate other than ``survive`` and ``min_return``. Shape: (N,), bool."""
        raise NotImplementedError(f"{type(self).__name__} judges only survive and min_return")

    def _vector_reset(self) -> np.ndarray:
        """Reset every world's env.

        Returns:
            Observations. Shape: (num_worlds, obs_dim).
        """
        raise NotImplementedError

    def _vector_step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Step every world's env once.

        Args:
            actions: Normalized actions in [-1, 1], a fresh array the method may change.
                Shape: (num_worlds, act_dim), :attr:`_action_dtype`.

        Returns:
            ``(obs, reward, terminated, truncated, final_obs)``: observations, shape
            (num_worlds, obs_dim); rewards, shape (num_worlds,), float64; the env's terminated
            and truncated flags, shape (num_worlds,), bool; and, for a library that restarts
            ended worlds within its step, the observation where they ended (shape as ``obs``;
            None when ``obs`` is already that).
        """
        raise NotImplementedError

    def _reset_worlds(self, mask: np.ndarray) -> np.ndarray:
        """Reset the envs of the worlds of ``mask`` (shape (N,), bool); the others continue.

        Returns:
            Observations, read for the worlds of ``mask``. Shape: (num_worlds, obs_dim).
        """
        raise NotImplementedError

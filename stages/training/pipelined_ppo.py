"""Pipelined PPO: the next rollout is collected while the update runs.

A PPO iteration collects a rollout with the current parameters, then updates them on it; the
two take turns, so the update's time adds to the collection's. OPPO's pipelined PPO collects
rollout k+1 with the parameters before update k while update k runs, and update k+1 learns
from a rollout one update old: its actions come from the parameters before update k, while
PPO's ratio, clip and adaptive learning rate measure update k+1 from the parameters it starts
at (the rollout's log-probabilities, distribution, values and returns are evaluated afresh
before it), as in a sequential run.

:class:`PipelinedPPO` keeps a second rsl_rl PPO, the collector: its actor and critic are the
learner's of one update ago (copied after every update, the observation normalizers with them),
its rollout storage is the one the learner's next update reads (the two storages swap; before
the update the learner evaluates that rollout afresh under its own parameters, see
:meth:`PipelinedPPO.refresh`), and its
exploration noise comes from a generator of its own
(:attr:`stages.training.rl_noise.CorrelatedGaussian.generator`), so the update's minibatch shuffles
on torch's default generator and the collection's draws do not interleave by timing: a pipelined
run is as reproducible as a sequential one. The update runs on a thread of its own (torch
releases the GIL in its kernels; gradient mode is per thread), the collection on the caller's.

The first rollout of a run, and the first after a resume, has nothing to overlap with and is
collected alone, with the current parameters; the last iteration collects nothing after it.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable
from typing import Any

from physai_core.errors import PhysaiError


class PipelinedPPO:
    """Iterations of rsl_rl's PPO whose next rollout is collected beside the update."""

    def __init__(self, alg: Any, venv: Any, rsl_cfg: dict[str, Any], device: str,
                 seed: int) -> None:
        """Pipeline ``alg`` (the learner) over ``venv``.

        Args:
            alg: The learner, an rsl_rl ``PPO`` whose actor samples through
                :class:`~stages.training.rl_noise.CorrelatedGaussian`.
            venv: The rsl_rl environment the collector steps.
            rsl_cfg: The rsl_rl configuration the learner was built from.
            device: Where the learner lives; the collector lives there too.
            seed: Seed of the collector's noise generator.
        """
        import torch
        from rsl_rl.algorithms import PPO

        from stages.training.rl_noise import CorrelatedGaussian

        with contextlib.redirect_stdout(io.StringIO()):
            self.collector = PPO.construct_algorithm(venv.get_observations(), venv, rsl_cfg,
                                                     device)
        distribution = getattr(self.collector.actor, "distribution", None)
        if not isinstance(distribution, CorrelatedGaussian):
            raise PhysaiError("pipelined PPO samples through "
                              "stages.training.rl_noise:CorrelatedGaussian "
                              f"(got {type(distribution).__name__})")
        distribution.generator = torch.Generator(device=device)
        distribution.generator.manual_seed(seed)
        self.collector.train_mode()
        self.alg, self.venv = alg, venv
        self._ready = False  # whether the collector's storage holds the next rollout
        self._last_obs: Any = None  # the observation after the rollout collected last

    def sync(self) -> None:
        """Give the collector the learner's parameters (normalizers and noise std included)."""
        self.collector.actor.load_state_dict(self.alg.actor.state_dict())
        self.collector.critic.load_state_dict(self.alg.critic.state_dict())

    def collect(self, obs: Any, steps: int) -> Any:
        """A rollout of ``steps`` control steps into the collector's storage (its returns are
        left to :meth:`refresh`); returns the observation after it."""
        import torch

        collector, venv = self.collector, self.venv
        with torch.inference_mode():
            for _ in range(steps):
                actions = collector.act(obs)
                obs, rewards, dones, extras = venv.step(actions)
                collector.process_env_step(obs, rewards, dones, extras)
        return obs

    def refresh(self, last_obs: Any) -> None:
        """Evaluate the learner's rollout under the learner's parameters: every stored
        action's log-probability, the action distribution and the values, then the returns
        and advantages from ``last_obs`` (the observation after the rollout).

        The rollout was collected with the parameters of one update ago. Left as collected,
        PPO's ratio, clip and adaptive learning rate would measure each update from those, one
        update's KL (about ``desired_kl``) away before the update moves at all: the adaptive
        schedule then halves the learning rate at nearly every minibatch (on the quadruped it
        sat at its floor from iteration 250 on, and the walk failed every gate). Evaluated
        afresh, each update is measured from the parameters it starts at, as in a sequential
        run; the actions themselves stay those of the older parameters.
        """
        import torch

        alg = self.alg
        storage, actor = alg.storage, alg.actor
        with torch.inference_mode():  # the rollout's tensors were made in inference mode
            obs = storage.observations.flatten(0, 1)
            actor(obs, stochastic_output=True)  # sets the distribution at every observation
            storage.actions_log_prob.copy_(actor.get_output_log_prob(
                storage.actions.flatten(0, 1)).view_as(storage.actions_log_prob))
            for stored, fresh in zip(storage.distribution_params,
                                     actor.output_distribution_params, strict=True):
                stored.copy_(fresh.reshape(stored.shape))
            storage.values.copy_(alg.critic(obs).view_as(storage.values))
            alg.compute_returns(last_obs)

    def iteration(self, obs: Any, steps: int, index: int, *, collect_next: bool,
                  cap: Callable[[Any, int], None] | None = None
                  ) -> tuple[Any, dict[str, float], float, float]:
        """Iteration ``index``: one update, with the next rollout collected beside it when
        ``collect_next``.

        Args:
            obs: The observation the next rollout starts from.
            steps: Control steps per world of a rollout.
            index: The iteration's number in the run.
            collect_next: Collect the rollout of the next iteration during this update (False
                on a run's last iteration).
            cap: ``cap(collector, i)`` after each copy of the learner's parameters, ``i`` the
                iteration whose rollout they collect: ``index`` for a rollout collected first,
                ``index + 2`` after the update (they collect beside the next update).

        Returns:
            The next observation, rsl_rl's mean losses, the seconds of collection (the rollout
            this update reads, where it had to be collected first, plus the one beside the
            update) and the update's seconds.
        """
        collect_s = 0.0
        if not self._ready:  # nothing collected yet: this update's rollout comes first
            self._copy(cap, index)
            began = time.perf_counter()
            obs = self.collect(obs, steps)
            collect_s += time.perf_counter() - began
            self._last_obs = obs
        alg, collector = self.alg, self.collector
        alg.storage, collector.storage = collector.storage, alg.storage
        last_obs = self._last_obs
        result: dict[str, Any] = {}

        def update() -> None:
            began = time.perf_counter()
            try:
                self.refresh(last_obs)
                result["losses"] = alg.update()
            except BaseException as exc:  # handed to the caller's thread
                result["error"] = exc
            result["seconds"] = time.perf_counter() - began

        worker = threading.Thread(target=update, name="ppo-update", daemon=True)
        worker.start()
        try:
            if collect_next:
                began = time.perf_counter()
                obs = self.collect(obs, steps)
                collect_s += time.perf_counter() - began
                self._last_obs = obs
        finally:
            worker.join()
        if "error" in result:
            raise result["error"]
        self._copy(cap, index + 2)
        self._ready = collect_next
        return obs, result["losses"], collect_s, result["seconds"]

    def _copy(self, cap: Callable[[Any, int], None] | None, index: int) -> None:
        """:meth:`sync`, then ``cap(collector, index)``."""
        self.sync()
        if cap is not None:
            cap(self.collector, index)

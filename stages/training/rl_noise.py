"""Time-correlated exploration noise for rsl_rl's Gaussian policy.

White action noise at the control rate lets PPO find a cheat on stiff position servos: the
robot vibrates forward on the jitter, and the deterministic policy that gets deployed, without
the jitter, stands still or falls. Noise that is correlated in time (an AR(1) process per world
and action, the same Gaussian marginal) explores as widely but cannot shake the robot along,
so what the policy learns is a gait of its own.

Loaded by rsl_rl by name (``stages.training.rl_noise:CorrelatedGaussian``); imports rsl_rl.
"""

from __future__ import annotations

import math

import torch
from rsl_rl.modules.distribution import GaussianDistribution


class CorrelatedGaussian(GaussianDistribution):
    """rsl_rl's Gaussian with state-independent std whose rollout samples are AR(1) in time.

    During rollouts (inference mode) ``eps_t = rho eps_{t-1} + sqrt(1 - rho^2) xi_t`` with
    ``xi_t`` standard normal, so every action's noise stays N(0, std^2) and PPO's likelihood
    ratios keep their meaning; updates (gradients on) sample white noise as rsl_rl does.
    """

    def __init__(
        self,
        output_dim: int,
        init_std: float = 1.0,
        std_range: tuple[float, float] = (1e-6, 1e6),
        std_type: str = "scalar",
        learn_std: bool = True,
        correlation: float = 0.9,
    ) -> None:
        """Args as rsl_rl's GaussianDistribution, plus ``correlation`` rho in [0, 1)."""
        if not 0.0 <= correlation < 1.0:
            raise ValueError(f"correlation must be in [0, 1), got {correlation}")
        super().__init__(output_dim, init_std, std_range, std_type, learn_std)
        self.correlation = correlation
        self._eps: torch.Tensor | None = None
        self.generator: torch.Generator | None = None
        """Where the rollout noise is drawn from; None: torch's default generator. A
        collector beside an update on another thread (:mod:`stages.training.pipelined_ppo`) draws
        from one of its own, so the two threads' draws do not interleave by timing."""

    def sample(self) -> torch.Tensor:
        """An action per world: the mean plus std times the world's correlated noise."""
        dist = self._distribution
        if dist is None:
            raise RuntimeError("update() the distribution before sampling")
        if not torch.is_inference_mode_enabled():
            return dist.sample()
        mean = dist.mean
        if self.generator is None:
            white = torch.randn_like(mean)
        else:
            white = torch.randn(mean.shape, generator=self.generator, dtype=mean.dtype,
                                device=mean.device)
        eps = self._eps
        if eps is None or eps.shape != white.shape:
            eps = white
        else:
            rho = self.correlation
            eps = rho * eps + math.sqrt(1.0 - rho * rho) * white
        self._eps = eps
        return dist.mean + dist.stddev * eps

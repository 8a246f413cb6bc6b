"""False-alarm and detection rates of the champion-challenger gate, measured in simulation.

A policy is the reach-v0 expert with its actions scaled, Gaussian noise of standard deviation
``sigma`` added per action entry, and optionally applied some control steps late. Every run
evaluates a policy on every scene of the suite with ``--episodes`` worlds and fresh seeds,
through the validate stage's own :func:`stages.validate.evaluate_scene`.

With ``R`` = ``--comparisons``, the benchmark makes ``2R`` runs of the policy and ``R`` of the
degraded policy, then pairs them without reuse inside either family of comparisons:

- false alarms: run ``2i`` (champion) against run ``2i + 1`` (challenger) of the same policy;
- detections: run ``2i`` of the policy (champion) against run ``i`` of the degraded one.

Comparisons within a family share no episodes, so they are independent and each family's rate
gets a Wilson interval. Episodes are independent within a run (every world draws its own
randomization and noise), so every scene's count is binomial; the ``model_rate`` fields give
the gate's exact rates under that binomial model at the per-scene rates estimated from all
runs, a far tighter figure than the Monte-Carlo one; ``model_rate_worst_equal_rates`` is the
largest false-alarm rate over a grid of rates shared by both sides.

An episode costs about 12 ms of one core (100 control steps of 20 physics steps), a suite run
of 4 x 100 episodes about 5 s, so the default 20 comparisons per family (60 suite runs) take
about 5 minutes on one core; ``--comparisons 200`` takes ten times as long. Prints one JSON
line; progress goes to stderr.

    python benchmarks/gate_power.py [--comparisons 20] [--episodes 100] [--margin 0.05]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from stages.artifacts import SceneResult
from stages.compare import METHOD, compare_scenes
from stages.sim.batched import BatchedEnv
from stages.sim.scene import Suite, load_suite
from stages.sim.tasks import get_task
from stages.stats import newcombe_regression_p_value, wilson_interval
from stages.validate import PolicyFn, evaluate_scene

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class NoisyExpert:
    """The task's scripted expert, scaled, with Gaussian action noise and an action delay."""

    sigma: float
    """Standard deviation of the noise added to every action entry (normalized action units)."""
    scale: float = 1.0
    """Factor on the expert's action before the noise is added (dimensionless)."""
    delay_steps: int = 0
    """Control steps (count) between the policy choosing an action and handing it out."""

    def controller(self, env: BatchedEnv, rng: np.random.Generator) -> PolicyFn:
        """A policy function for one episode of ``env``; it ignores the observation."""
        pending = deque(np.zeros((env.num_worlds, env.act_dim)) for _ in range(self.delay_steps))

        def act(obs: np.ndarray) -> np.ndarray:
            """Shape: obs (num_worlds, obs_dim) -> actions (num_worlds, act_dim)."""
            action = self.scale * env.expert_action() + self.sigma * rng.standard_normal(
                (env.num_worlds, env.act_dim)
            )
            pending.append(action)
            return pending.popleft()

        return act


def run_suite(
    policy: NoisyExpert, suite: Suite, episodes: int, seed: Sequence[int]
) -> tuple[SceneResult, ...]:
    """Evaluate ``policy`` on every scene of ``suite``, each scene seeded from ``seed``."""
    spec = get_task(suite.config.task)
    results = []
    for index, (scene, _, _) in enumerate(suite.scenes):
        env_seed, noise_seed = np.random.SeedSequence([*seed, index]).generate_state(2)
        env = spec.make_env(scene, episodes, int(env_seed))
        act = policy.controller(env, np.random.default_rng(int(noise_seed)))
        results.append(evaluate_scene(env, act, scene.name, episodes)[0])
    return tuple(results)


def binomial_pmf(n: int, p: float) -> np.ndarray:
    """Probabilities of 0..n successes in ``n`` trials of rate ``p``. Shape: (n + 1,)."""
    return np.array([math.comb(n, k) * p**k * (1.0 - p) ** (n - k) for k in range(n + 1)])


def flagged_counts(episodes: int, margin: float, threshold: float) -> np.ndarray:
    """Which count pairs give a p-value at most ``threshold``, both sides with ``episodes``.

    Shape: (episodes + 1, episodes + 1), indexed [challenger successes, champion successes].
    """
    n = episodes
    return np.array(
        [
            [
                newcombe_regression_p_value(k_new, n, k_old, n, margin) <= threshold
                for k_old in range(n + 1)
            ]
            for k_new in range(n + 1)
        ],
        dtype=np.float64,
    )


def model_regression_rate(flagged: np.ndarray, old: Sequence[float], new: Sequence[float]) -> float:
    """Exact probability that the gate flags a regression when every scene's count is binomial.

    Holm rejects anything only if the smallest of ``m`` p-values is at most ``alpha / m``, so
    with independent scenes the rate is ``1 - prod(1 - q_s)``, where ``q_s`` is the chance
    that scene ``s`` lands on a pair marked in ``flagged`` (:func:`flagged_counts` at
    ``alpha / m``).
    """
    n = flagged.shape[0] - 1
    quiet = 1.0
    for p_old, p_new in zip(old, new, strict=True):
        quiet *= 1.0 - float(binomial_pmf(n, p_new) @ flagged @ binomial_pmf(n, p_old))
    return 1.0 - quiet


def rate(hits: int, trials: int) -> dict[str, object]:
    """A count as a rate with its 95% Wilson interval."""
    low, high = wilson_interval(hits, trials)
    return {
        "count": hits,
        "of": trials,
        "rate": round(hits / trials, 4),
        "ci95": [round(low, 4), round(high, 4)],
    }


def pooled(runs: Sequence[tuple[SceneResult, ...]]) -> dict[str, tuple[int, int]]:
    """Successes and episodes per scene, summed over ``runs``."""
    totals: dict[str, tuple[int, int]] = {}
    for run in runs:
        for r in run:
            k, n = totals.get(r.scene, (0, 0))
            totals[r.scene] = (k + r.successes, n + r.episodes)
    return totals


def worst_equal_rates_alarm(flagged: np.ndarray, scenes: int) -> float:
    """Worst false-alarm rate when each scene's two policies share a rate, any rate.

    The largest per-scene chance ``q`` over a grid of shared rates in [0, 1] (step 0.005),
    combined over ``scenes`` independent scenes as ``1 - (1 - q)^scenes``.
    """
    n = flagged.shape[0] - 1
    worst = max(
        float(binomial_pmf(n, p) @ flagged @ binomial_pmf(n, p)) for p in np.linspace(0, 1, 201)
    )
    return 1.0 - (1.0 - worst) ** scenes


def simulate(
    policies: dict[str, tuple[NoisyExpert, int]], suite: Suite, episodes: int, seed: int
) -> dict[str, list[tuple[SceneResult, ...]]]:
    """Run every named policy the given number of times on ``suite``, each run freshly seeded."""
    start = time.perf_counter()
    total = sum(count for _, count in policies.values())
    runs: dict[str, list[tuple[SceneResult, ...]]] = {}
    for index, (name, (policy, count)) in enumerate(policies.items()):
        runs[name] = []
        for i in range(count):
            runs[name].append(run_suite(policy, suite, episodes, (seed, index, i)))
            done = sum(len(r) for r in runs.values())
            print(f"run {done}/{total} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return runs


def summarize(
    runs: dict[str, list[tuple[SceneResult, ...]]],
    names: Sequence[str],
    episodes: int,
    margin: float,
    alpha: float,
) -> dict[str, object]:
    """Pair the runs into comparisons and report measured and model rates; see the module doc."""
    base, worse = runs["policy"], runs["degraded"]
    r = len(worse)
    alarms = sum(
        compare_scenes(base[2 * i], base[2 * i + 1], margin=margin, alpha=alpha).regressed
        for i in range(r)
    )
    detections = sum(
        compare_scenes(base[2 * i], worse[i], margin=margin, alpha=alpha).regressed
        for i in range(r)
    )
    counts = {key: pooled(value) for key, value in runs.items()}
    rates = {key: [counts[key][s][0] / counts[key][s][1] for s in names] for key in counts}
    flagged = flagged_counts(episodes, margin, alpha / len(names))
    return {
        "comparisons": r,
        "false_alarm": {
            **rate(alarms, r),
            "model_rate": round(
                model_regression_rate(flagged, rates["policy"], rates["policy"]), 5
            ),
            "model_rate_worst_equal_rates": round(worst_equal_rates_alarm(flagged, len(names)), 5),
            "target_max": 0.05,
        },
        "detection": {
            **rate(detections, r),
            "model_rate": round(
                model_regression_rate(flagged, rates["policy"], rates["degraded"]), 5
            ),
            "target_min": 0.95,
        },
        "true_rates": {key: {s: rate(*counts[key][s]) for s in names} for key in counts},
        "true_drop": {
            s: round(a - b, 4)
            for s, a, b in zip(names, rates["policy"], rates["degraded"], strict=True)
        },
    }


def main() -> None:
    """Run both policies, pair the runs into comparisons, and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=ROOT / "sim_scenes/reach/suite.yaml")
    parser.add_argument("--comparisons", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--delay-steps", type=int, default=0)
    parser.add_argument("--degraded-sigma", type=float, default=0.15)
    parser.add_argument("--degraded-scale", type=float, default=1.0)
    parser.add_argument("--degraded-delay-steps", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.comparisons < 1 or args.episodes < 1:
        parser.error("--comparisons and --episodes must be positive")

    start = time.perf_counter()
    suite = load_suite(args.suite)
    policy = NoisyExpert(args.sigma, delay_steps=args.delay_steps)
    degraded = NoisyExpert(args.degraded_sigma, args.degraded_scale, args.degraded_delay_steps)
    plan = {"policy": (policy, 2 * args.comparisons), "degraded": (degraded, args.comparisons)}
    runs = simulate(plan, suite, args.episodes, args.seed)
    sim_s = time.perf_counter() - start
    names = [scene.name for scene, _, _ in suite.scenes]
    summary = summarize(runs, names, args.episodes, args.margin, args.alpha)
    print(
        json.dumps(
            {
                "benchmark": "gate_power",
                "suite": suite.name,
                "suite_digest": suite.digest,
                "method": METHOD,
                "margin": args.margin,
                "alpha": args.alpha,
                "episodes_per_scene": args.episodes,
                "policy": asdict(policy),
                "degraded_policy": asdict(degraded),
                **summary,
                "sim_s": round(sim_s, 1),
                "wall_s": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

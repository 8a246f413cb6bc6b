"""False-alarm and detection rates of the champion-challenger gate, measured in simulation.

A policy is the reach-v0 expert with its actions scaled, Gaussian noise of standard deviation
``sigma`` added per action entry, and optionally applied some control steps late. Every run
evaluates a policy on every scene of the suite with ``--episodes`` worlds and fresh seeds,
through the validate stage's own :func:`stages.evaluation.suite.evaluate_scene`.

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

Power curves of the scene gate, fixed design against sequential (``power_curves``): a policy
that should pass has true success rate ``--good`` (0.95) on a scene whose threshold is
``--threshold`` (0.85); a true drop of ``d`` points brings it to ``good - d``. The fixed design
is the validate stage's gate, 95% Wilson lower bound against the threshold after
``--episodes`` episodes; the sequential one is ``validate.sequential`` with the threshold plus
``--indifference`` (0.10) as the rate it must pass, looking every ``--chunk`` episodes up to
``--sequential-max`` (stages/evaluation/sequential.py). For every drop the curves give the chance to
fail the scene (at drop 0, the false-alarm rate; above the indifference, the power) and the median
episodes spent, three ways: exact (binomial recursion), over ``--streams`` simulated Bernoulli
episode streams through the gates' own decision rules, and over ``--sim-reps`` real MuJoCo
validations of the reach scene through :func:`stages.evaluation.suite.evaluate_scene` and
:func:`stages.evaluation.suite.evaluate_scene_sequential`. The simulated policy is the scripted
expert (it succeeds in every nominal reach episode) holding still, so failing, in each world with
probability ``d + 1 - good``: its true rate is known exactly.

An episode costs about 12 ms of one core (100 control steps of 20 physics steps), a suite run
of 4 x 100 episodes about 5 s, so the default 20 comparisons per family (60 suite runs) take
about 5 minutes on one core; ``--comparisons 200`` takes ten times as long. Prints one JSON
line; progress goes to stderr.

    python benchmarks/gate_power.py [--comparisons 20] [--episodes 100] [--margin 0.05]
        [--sim-reps 40] [--streams 4000] [--sequential-max 150] [--chunk 10] [--plot F.png]
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

from stages.artifacts.records import SceneResult
from stages.evaluation.compare import METHOD, compare_scenes
from stages.evaluation.sequential import METHOD as SEQUENTIAL_METHOD
from stages.evaluation.sequential import Design, design
from stages.evaluation.stats import newcombe_regression_p_value, wilson_interval
from stages.evaluation.suite import evaluate_scene, evaluate_scene_sequential
from stages.policies.local import PolicyFn
from stages.sim.env.batched import BatchedEnv
from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_suite
from stages.sim.suites.suite import Suite
from stages.sim.tasks.catalog import TaskSpec, get_task

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


@dataclass(frozen=True)
class StillInSome:
    """The scripted expert, holding still (zero action) in each world with probability
    ``still``, drawn once per world when its episode starts."""

    still: float

    def controller(self, env: BatchedEnv, rng: np.random.Generator) -> PolicyFn:
        held = rng.random(env.num_worlds) < self.still

        def act(obs: np.ndarray) -> np.ndarray:
            """Shape: obs (num_worlds, obs_dim) -> actions (num_worlds, act_dim)."""
            action = env.expert_action()
            action[held] = 0.0
            return action

        return act


class Chunks:
    """A scene's chunks for :func:`stages.evaluation.suite.evaluate_scene_sequential`: each chunk's
    env, and ``policy`` controlling it (each chunk's own worlds held still)."""

    def __init__(self, spec: TaskSpec, scene: Scene, policy: StillInSome,
                 rng: np.random.Generator) -> None:
        self._spec, self._scene, self._policy, self._rng = spec, scene, policy, rng
        self._act: PolicyFn | None = None

    def make_env(self, worlds: int, seed: int) -> BatchedEnv:
        env = self._spec.make_env(self._scene, worlds, seed)
        self._act = self._policy.controller(env, self._rng)
        return env

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._act is None:
            raise RuntimeError("no chunk was made")
        return self._act(obs)


def fixed_fails(episodes: int, threshold: float) -> np.ndarray:
    """Which success counts of ``episodes`` fail the fixed gate (95% Wilson lower bound below
    ``threshold``). Shape: (episodes + 1,), bool."""
    return np.array([wilson_interval(k, episodes)[0] < threshold for k in range(episodes + 1)])


def stream_rates(gate: Design, fails: np.ndarray, p: float, streams: int,
                 rng: np.random.Generator) -> tuple[float, float, int]:
    """Chance to fail of the fixed and the sequential gate over ``streams`` Bernoulli(p)
    episode streams, and the sequential gate's median episodes."""
    n = len(fails) - 1
    fixed = float(fails[rng.binomial(n, p, streams)].mean())
    sequential, spent = gate.simulate(p, streams, rng)
    return fixed, sequential, int(np.median(spent))


def sim_rates(gate: Design, episodes: int, threshold: float, still: float, reps: int,
              seed: int) -> dict[str, object]:
    """``reps`` real validations of the nominal reach scene by the fixed and the sequential
    gate, with the expert held still in a share ``still`` of the worlds."""
    suite = load_suite(ROOT / "sim_scenes/reach/suite.yaml")
    spec = get_task(suite.config.task)
    scene = suite.scenes[0].scene
    policy = StillInSome(still)
    fixed_fail = seq_fail = 0
    spent = []
    for rep in range(reps):
        env_seed, noise_seed = np.random.SeedSequence([seed, rep]).generate_state(2)
        env = spec.make_env(scene, episodes, int(env_seed))
        rng = np.random.default_rng(int(noise_seed))
        result, _ = evaluate_scene(env, policy.controller(env, rng), scene.config.name, episodes)
        fixed_fail += result.ci_low < threshold

        chunks = Chunks(spec, scene, policy, rng)
        seq, _ = evaluate_scene_sequential(chunks.make_env, chunks.act, scene.config.name,
                                           int(env_seed) + 1, gate)
        if seq.sequential is None:
            raise RuntimeError("the sequential evaluation returned no verdict")
        seq_fail += seq.sequential.verdict == "fail"
        spent.append(seq.episodes)
    return {"reps": reps, "fixed_fail": rate(fixed_fail, reps),
            "sequential_fail": rate(seq_fail, reps),
            "sequential_median_episodes": int(np.median(spent))}


def power_curves(args: argparse.Namespace) -> tuple[dict[str, object], Design]:
    """The scene gate's chance to fail and episodes spent against the true drop, fixed
    design against sequential; see the module doc."""
    gate = design(args.threshold, min(1.0, args.threshold + args.indifference), args.alpha,
                  args.alpha, args.sequential_max, args.chunk)
    fails = fixed_fails(args.episodes, args.threshold)
    rng = np.random.default_rng(args.seed)
    rows = []
    for drop in args.drops:
        p = max(0.0, args.good - drop)
        exact_fixed = float(binomial_pmf(args.episodes, p) @ fails)
        exact_seq = gate.operating(p)
        fixed_mc, seq_mc, median_mc = stream_rates(gate, fails, p, args.streams, rng)
        row: dict[str, object] = {
            "drop": drop, "true_rate": round(p, 4),
            "fixed": {"fail": round(exact_fixed, 4), "median_episodes": args.episodes,
                      "streams_fail": round(fixed_mc, 4)},
            "sequential": {"fail": round(exact_seq.fail, 4),
                           "median_episodes": exact_seq.median_episodes,
                           "mean_episodes": round(exact_seq.mean_episodes, 1),
                           "streams_fail": round(seq_mc, 4),
                           "streams_median_episodes": median_mc},
        }
        if args.sim_reps:
            row["sim"] = sim_rates(gate, args.episodes, args.threshold, 1.0 - p, args.sim_reps,
                                   args.seed + round(drop * 1000))
        rows.append(row)
        print(f"drop {drop:.2f}: fixed fails {exact_fixed:.3f}, sequential "
              f"{exact_seq.fail:.3f} after a median {exact_seq.median_episodes}",
              file=sys.stderr)
    return {
        "threshold": args.threshold, "good_rate": args.good,
        "fixed_design": f"95% Wilson lower bound >= threshold after {args.episodes} episodes",
        "sequential_design": {"method": SEQUENTIAL_METHOD, "p_fail": gate.p_fail,
                              "p_hold": gate.p_hold, "alpha": round(gate.alpha, 4),
                              "beta": round(gate.beta, 4), "chunk": args.chunk,
                              "max_episodes": gate.max_episodes},
        "drops": rows,
    }, gate


def plot_curves(curves: dict[str, object], path: Path) -> None:
    """Chance to fail and median episodes against the drop, both designs, to ``path``."""
    from matplotlib.figure import Figure

    rows = curves["drops"]
    if not isinstance(rows, list):
        raise TypeError("power curves without rows")
    drops = [100 * r["drop"] for r in rows]
    fig = Figure(figsize=(9, 3.6), dpi=110)
    power, cost = fig.subplots(1, 2)
    for key, style in (("fixed", "o--"), ("sequential", "s-")):
        power.plot(drops, [r[key]["fail"] for r in rows], style, label=key)
        cost.plot(drops, [r[key]["median_episodes"] for r in rows], style, label=key)
    power.axhline(0.95, color="grey", lw=0.8)
    power.axhline(0.05, color="grey", lw=0.8)
    power.set_xlabel("true drop (points)")
    power.set_ylabel("chance the gate fails the scene")
    cost.set_xlabel("true drop (points)")
    cost.set_ylabel("median episodes per scene")
    power.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    """The scene gate's power curves, then both policies' runs paired into comparisons; print
    the JSON line."""
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
    parser.add_argument("--threshold", type=float, default=0.85,
                        help="the scene gate's threshold (min_success) of the power curves")
    parser.add_argument("--good", type=float, default=0.95,
                        help="true success rate of the policy before any drop")
    parser.add_argument("--indifference", type=float, default=0.10)
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--sequential-max", type=int, default=150,
                        help="the sequential gate's most episodes per scene")
    parser.add_argument("--drops", type=lambda v: [float(x) for x in v.split(",")],
                        default=[0.0, 0.05, 0.10, 0.15, 0.25])
    parser.add_argument("--streams", type=int, default=4000,
                        help="simulated Bernoulli episode streams per drop")
    parser.add_argument("--sim-reps", type=int, default=40,
                        help="real MuJoCo validations per drop and design (0: none)")
    parser.add_argument("--skip-champion", action="store_true",
                        help="only the scene gate's power curves")
    parser.add_argument("--plot", type=Path, default=None,
                        help="write the power curves to this PNG")
    args = parser.parse_args()
    if args.comparisons < 1 or args.episodes < 1:
        parser.error("--comparisons and --episodes must be positive")

    start = time.perf_counter()
    curves, _ = power_curves(args)
    if args.plot is not None:
        plot_curves(curves, args.plot)
    curves_s = time.perf_counter() - start
    suite = load_suite(args.suite)
    out: dict[str, object] = {"benchmark": "gate_power", "suite": suite.name,
                              "suite_digest": suite.digest, "method": METHOD,
                              "margin": args.margin, "alpha": args.alpha,
                              "episodes_per_scene": args.episodes}
    if not args.skip_champion:
        policy = NoisyExpert(args.sigma, delay_steps=args.delay_steps)
        degraded = NoisyExpert(args.degraded_sigma, args.degraded_scale,
                               args.degraded_delay_steps)
        plan = {"policy": (policy, 2 * args.comparisons),
                "degraded": (degraded, args.comparisons)}
        runs = simulate(plan, suite, args.episodes, args.seed)
        names = [scene.name for scene, _, _ in suite.scenes]
        out.update(policy=asdict(policy), degraded_policy=asdict(degraded),
                   **summarize(runs, names, args.episodes, args.margin, args.alpha))
    out.update(power_curves=curves, power_curves_s=round(curves_s, 1),
               sim_s=round(time.perf_counter() - start - curves_s, 1),
               wall_s=round(time.perf_counter() - start, 1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

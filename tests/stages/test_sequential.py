"""The sequential scene gate's design (stages/evaluation/sequential.py): its error rates hold
exactly at both hypotheses, the exact recursion agrees with simulated Bernoulli streams, it spends
fewer episodes than the fixed design, and Wald's uncalibrated boundaries, cut off at the scene's
count, would not hold them."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stages.evaluation.sequential import design, operating, schedule

ROOT = Path(__file__).resolve().parents[2]


def test_both_error_rates_hold_and_simulation_agrees_with_the_recursion() -> None:
    d = design(0.85, 0.95, 0.05, 0.05, 150, 10)
    assert d.alpha <= 0.05 and d.beta <= 0.05
    assert d.looks == tuple(range(10, 151, 10))
    for p in (0.95, 0.90, 0.85, 0.75):
        exact = d.operating(p)
        rate, spent = d.simulate(p, 3000, np.random.default_rng(int(p * 100)))
        se = max(np.sqrt(exact.fail * (1 - exact.fail) / 3000), 1e-3)
        assert abs(rate - exact.fail) <= 4.5 * se, (p, rate, exact.fail)
        assert abs(spent.mean() - exact.mean_episodes) <= 0.06 * exact.mean_episodes, p
        assert abs(float(np.median(spent)) - exact.median_episodes) <= 10, p
    assert d.operating(0.85).fail == pytest.approx(1 - d.alpha)
    assert d.operating(0.95).fail == pytest.approx(d.beta)
    # Monotone in the true rate: worse than the threshold passes less, better fails less.
    fails = [d.operating(p).fail for p in np.linspace(0.5, 1.0, 51)]
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(fails))


def test_it_spends_a_median_below_the_fixed_designs_hundred_episodes() -> None:
    d = design(0.85, 0.95, 0.05, 0.05, 150, 10)
    for p in (0.95, 0.85, 0.80):
        assert d.operating(p).median_episodes < 100, p
    assert d.operating(0.70).median_episodes <= 20  # a clear failure is seen at once


def test_walds_boundaries_cut_off_at_the_scenes_count_miss_the_error_rates() -> None:
    """The calibration is what holds the rates: the same looks with Wald's textbook boundaries
    and a final look at the likelihood ratio's sign fail a policy at 0.95 too often."""
    looks = schedule(60, 10)
    upper, lower = np.log(0.95 / 0.05), np.log(0.05 / 0.95)
    wald_fail_good = operating(looks, 0.85, 0.95, upper, lower, 0.0, 0.95).fail
    wald_pass_bad = 1 - operating(looks, 0.85, 0.95, upper, lower, 0.0, 0.85).fail
    assert max(wald_fail_good, wald_pass_bad) > 0.05
    d = design(0.85, 0.95, 0.05, 0.05, 60, 10)
    assert d.alpha <= 0.05  # the calibrated one keeps alpha, and says what beta it reaches
    assert d.beta == pytest.approx(d.operating(0.95).fail)


def test_a_gate_at_one_fails_on_the_first_failed_episode() -> None:
    d = design(0.9, 1.0, 0.05, 0.05, 100, 10)
    assert d.decide(9, 10) == "fail"
    assert d.alpha <= 0.05


@pytest.mark.parametrize("args", [(0.0, 0.5, 0.05, 0.05, 100, 10),
                                  (0.6, 0.5, 0.05, 0.05, 100, 10),
                                  (0.5, 0.6, 0.5, 0.05, 100, 10),
                                  (0.5, 0.6, 0.05, 0.05, 0, 10)])
def test_impossible_designs_are_refused(args: tuple[float, float, float, float, int, int]
                                        ) -> None:
    with pytest.raises(ValueError):
        design(*args)


def test_gate_power_benchmark_shows_the_sequential_gates_power_and_cost(tmp_path: Path
                                                                        ) -> None:
    """benchmarks/gate_power.py's power curves: at a 10-point drop the sequential gate fails
    the scene at least 95% of the time, at no drop at most 5%, spending a median below the
    fixed design's 100 episodes; one real MuJoCo validation per design and drop runs too."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gate_power.py"), "--skip-champion",
         "--sim-reps", "1", "--streams", "300", "--drops", "0,0.1",
         "--plot", str(tmp_path / "power.png")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    curves = json.loads(done.stdout)["power_curves"]
    none, ten = curves["drops"]
    assert (none["drop"], ten["drop"]) == (0.0, 0.1)
    assert none["sequential"]["fail"] <= 0.05 and ten["sequential"]["fail"] >= 0.95
    assert ten["sequential"]["median_episodes"] < 100 == ten["fixed"]["median_episodes"]
    assert none["sequential"]["median_episodes"] < 100
    assert {"fixed_fail", "sequential_fail", "sequential_median_episodes"} <= set(ten["sim"])
    assert (tmp_path / "power.png").stat().st_size > 10_000


def test_a_threshold_of_0_or_1_leaves_the_scene_its_full_count() -> None:
    """No policy fails a threshold of 0 and no interval reaches 1: nothing to decide early."""
    from stages.evaluation.gates import sequential_design
    from stages.sections.models import SequentialConfig, ValidateConfig

    for threshold in (0.0, 1.0):
        cfg = ValidateConfig(suite="s.yaml", min_success=threshold,
                             sequential=SequentialConfig())
        assert sequential_design(cfg, "nominal", 100) is None
    cfg = ValidateConfig(suite="s.yaml", min_success=0.95, sequential=SequentialConfig())
    plan = sequential_design(cfg, "nominal", 100)
    assert plan is not None and (plan.p_fail, plan.p_hold) == (0.95, 1.0)

"""The sensitivity analysis (stages/evaluation/sensitivity.py) on real rollouts: a policy built to
fail exactly beyond a threshold of one factor has that factor ranked first with the right sign, and
a factor with no effect keeps an interval around zero across seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stages.evaluation.sensitivity import factor_effects
from stages.evaluation.suite import evaluate_scene
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.reach import ReachEnv

ROOT = Path(__file__).resolve().parents[2]
THRESHOLD = 0.50
"""The planted policy gives up on targets farther out than this (m, target x)."""


def _planted(seed: int, worlds: int = 100) -> tuple[object, object]:
    """The expert, except that it holds still wherever the target lies beyond THRESHOLD in x;
    over heavy_payload's randomization (masses, damping, gains), which the expert rides out."""
    scene = load_scene(ROOT / "sim_scenes" / "reach" / "heavy_payload.yaml")
    env = ReachEnv(scene, worlds, seed, num_threads=1)

    def act(obs: np.ndarray) -> np.ndarray:
        action = env.expert_action()
        action[obs[:, 17] > THRESHOLD] = 0.0  # obs[17]: the target's x
        return action

    result, out = evaluate_scene(env, act, scene.name, worlds)
    return result, out


def test_the_planted_factor_ranks_first_with_the_right_sign() -> None:
    result, out = _planted(seed=3)
    failed = ~out.success
    assert 0.2 < failed.mean() < 0.8  # targets beyond the threshold fail, the others succeed
    top = result.factors[0]
    assert top.name == "target_x" and top.unit == "m"
    assert top.effect > 0 and top.ci_low > 0  # farther out, more failures
    assert top.mean_failed > THRESHOLD > top.mean_succeeded
    assert {f.name for f in result.factors} >= {"mass_scale", "damping_scale", "gain_scale",
                                                 "target_y", "target_z"}
    assert "payload_mass" not in {f.name for f in result.factors}  # it did not vary
    columns = out.episodes
    assert set(columns["failure"][failed]) == {"missed"} and set(columns["failure"][~failed]) \
        == {""}
    assert (columns["miss"][failed] > 0.03).all()  # farther than the success distance


def test_a_factor_without_effect_has_an_interval_covering_zero_for_18_of_20_seeds() -> None:
    covered = 0
    for seed in range(20):
        result, _ = _planted(seed, worlds=60)
        mass = next(f for f in result.factors if f.name == "mass_scale")
        covered += mass.ci_low <= 0.0 <= mass.ci_high
    assert covered >= 18, covered


def test_no_failures_or_no_variation_rank_nothing() -> None:
    n = 50
    rng = np.random.default_rng(0)
    columns = {"episode": np.arange(n), "success": np.ones(n, bool), "x": rng.normal(size=n)}
    assert factor_effects(columns, {}) == ()
    columns["success"] = rng.random(n) < 0.5
    columns["x"] = np.ones(n)
    assert factor_effects(columns, {}) == ()


def test_complete_separation_gives_a_finite_effect_and_interval() -> None:
    x = np.linspace(0.0, 1.0, 80)
    effects = factor_effects({"success": x < 0.5, "x": x, "noise": np.sin(37 * x)}, {"x": "m"})
    top = effects[0]
    assert top.name == "x" and np.isfinite([top.effect, top.ci_low, top.ci_high]).all()
    assert top.ci_low > 0 and effects[1].ci_low < 0 < effects[1].ci_high


def test_the_forest_plot_draws_any_number_of_factors(tmp_path: Path) -> None:
    from stages.evaluation.plots import sensitivity_plot

    result, _ = _planted(seed=3, worlds=60)
    for keep in (1, 3, 4, len(result.factors)):
        scene = result.model_copy(update={"factors": result.factors[:keep]})
        sensitivity_plot((scene,)).savefig(tmp_path / f"forest-{keep}.png")
        assert (tmp_path / f"forest-{keep}.png").stat().st_size > 1000

import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.artifacts.records import Producer, SceneResult, SimReport
from stages.evaluation.compare import SuiteComparison, compare_reports, compare_scenes
from stages.evaluation.stats import wilson_interval

SCENES = ("nominal", "heavy_payload", "noisy_sensors", "wide_targets")


def result(scene: str, successes: int, episodes: int = 100) -> SceneResult:
    low, high = wilson_interval(successes, episodes)
    return SceneResult(
        scene=scene,
        episodes=episodes,
        successes=successes,
        success_rate=successes / episodes,
        ci_low=low,
        ci_high=high,
        mean_return=0.0,
        mean_final_reward=0.0,
    )


def suite(*successes: int, episodes: int = 100) -> tuple[SceneResult, ...]:
    return tuple(result(s, k, episodes) for s, k in zip(SCENES, successes, strict=True))


@pytest.mark.parametrize("k", [0, 1, 50, 95, 99, 100])
def test_identical_results_never_regress(k: int) -> None:
    cmp = compare_scenes(suite(k, k, k, k), suite(k, k, k, k), margin=0.05)
    assert not cmp.regressed
    assert cmp.reasons == ()
    assert all(s.p_value > 0.5 and s.difference == 0.0 for s in cmp.scenes)


def test_identical_results_do_not_regress_without_a_margin() -> None:
    assert not compare_scenes(suite(95, 95, 95, 95), suite(95, 95, 95, 95), margin=0.0).regressed


def test_clear_drop_regresses_on_that_scene_and_names_it() -> None:
    cmp = compare_scenes(suite(95, 95, 95, 95), suite(95, 95, 60, 95), margin=0.05)
    assert cmp.regressed
    assert [s.scene for s in cmp.scenes if s.regressed] == ["noisy_sensors"]
    assert len(cmp.reasons) == 1
    assert cmp.reasons[0].startswith("noisy_sensors: challenger 60/100 = 0.600 vs champion 95/100")
    noisy = cmp.scenes[2]
    assert noisy.difference == pytest.approx(-0.35)
    assert noisy.difference_ci_low < -0.35 < noisy.difference_ci_high < -0.05
    assert noisy.p_adjusted <= 0.05


@pytest.mark.parametrize(("old", "new"), [(95, 92), (100, 96), (90, 87), (95, 100), (50, 47)])
def test_differences_within_the_margin_do_not_regress(old: int, new: int) -> None:
    cmp = compare_scenes(suite(old, old, old, old), suite(new, new, new, new), margin=0.05)
    assert not cmp.regressed


def test_a_drop_beyond_the_margin_without_evidence_does_not_regress() -> None:
    cmp = compare_scenes(suite(95, 95, 95, 95), suite(88, 95, 95, 95), margin=0.05)
    assert cmp.scenes[0].p_value < 0.5
    assert not cmp.regressed


def test_records_counts_rates_and_the_settings() -> None:
    cmp = compare_scenes(
        suite(90, 80, 70, 60, episodes=200), suite(100, 100, 100, 100), margin=0.1, alpha=0.01
    )
    assert isinstance(cmp, SuiteComparison)
    assert (cmp.margin, cmp.alpha) == (0.1, 0.01)
    first = cmp.scenes[0]
    assert (first.champion_successes, first.champion_episodes) == (90, 200)
    assert (first.challenger_successes, first.challenger_episodes) == (100, 100)
    assert first.champion_rate == 0.45
    assert first.challenger_rate == 1.0
    assert first.difference == pytest.approx(0.55)
    assert SuiteComparison.model_validate_json(cmp.model_dump_json()) == cmp


def test_scenes_match_by_name_not_position() -> None:
    old = suite(95, 95, 95, 95)
    cmp = compare_scenes(old, tuple(reversed(old)), margin=0.05)
    assert [s.scene for s in cmp.scenes] == list(SCENES)
    assert not cmp.regressed


def test_missing_scene_on_either_side_names_it() -> None:
    old = suite(95, 95, 95, 95)
    with pytest.raises(ConfigError, match="'wide_targets' is missing") as err:
        compare_scenes(old, old[:3], margin=0.05)
    assert [p.file for p in err.value.problems] == ["challenger"]
    with pytest.raises(ConfigError) as err:
        compare_scenes(old[1:], old[:3], margin=0.05)
    assert {(p.file, p.value) for p in err.value.problems} == {
        ("challenger", "wide_targets"),
        ("champion", "nominal"),
    }


def test_empty_results_are_an_error() -> None:
    with pytest.raises(ConfigError, match="no scene results"):
        compare_scenes((), (), margin=0.05)


def test_repeated_scene_and_impossible_counts_are_errors() -> None:
    old = suite(95, 95, 95, 95)
    with pytest.raises(ConfigError, match="listed twice"):
        compare_scenes(old, (*old, old[0]), margin=0.05)
    bad = result("nominal", 5, episodes=100).model_copy(update={"successes": 101})
    with pytest.raises(ConfigError, match="successes"):
        compare_scenes(old, (bad, *old[1:]), margin=0.05)


@pytest.mark.parametrize(("margin", "alpha"), [(-0.1, 0.05), (1.0, 0.05), (0.05, 0.0), (0.05, 1)])
def test_rejects_impossible_margin_or_alpha(margin: float, alpha: float) -> None:
    with pytest.raises(ValueError):
        compare_scenes(suite(9, 9, 9, 9), suite(9, 9, 9, 9), margin=margin, alpha=alpha)


def test_holm_flags_a_scene_that_one_test_alone_would_and_four_do_not() -> None:
    # 82 vs 95 alone: p ~ 0.037, under alpha but over alpha / 4.
    single = compare_scenes(suite(95, 95, 95, 95)[:1], suite(82, 95, 95, 95)[:1], margin=0.05)
    assert 0.0125 < single.scenes[0].p_value <= 0.05
    assert single.regressed
    family = compare_scenes(suite(95, 95, 95, 95), suite(82, 95, 95, 95), margin=0.05)
    assert family.scenes[0].p_value == single.scenes[0].p_value
    assert family.scenes[0].p_adjusted == pytest.approx(4 * single.scenes[0].p_value)
    assert not family.regressed


def test_holm_steps_down_after_a_strong_regression() -> None:
    """A strong regression frees the next scene to be tested at alpha / 3, not alpha / 4."""
    cmp = compare_scenes(suite(95, 95, 95, 95), suite(40, 80, 95, 95), margin=0.05)
    strong, weaker = cmp.scenes[0], cmp.scenes[1]
    assert 0.05 / 4 < weaker.p_value <= 0.05 / 3
    assert strong.regressed and weaker.regressed
    assert weaker.p_adjusted == pytest.approx(3 * weaker.p_value)


def test_false_alarm_rate_at_equal_rates_is_at_most_alpha() -> None:
    """Seeded binomial draws: champion and challenger share the true rate on every scene."""
    rng = np.random.default_rng(7)
    rates = np.array([0.5, 0.8, 0.95, 1.0])
    trials, alarms = 2000, 0
    for _ in range(trials):
        old = rng.binomial(100, rates)
        new = rng.binomial(100, rates)
        alarms += compare_scenes(suite(*old), suite(*new), margin=0.05).regressed
    assert alarms / trials <= 0.05 + 0.01


def test_false_alarm_rate_at_the_margin_is_near_alpha() -> None:
    """With every scene exactly ``margin`` worse, the family-wise rate stays close to alpha."""
    rng = np.random.default_rng(11)
    old_rates = np.array([0.9, 0.95, 0.97, 1.0])
    trials, alarms = 2000, 0
    for _ in range(trials):
        old = rng.binomial(100, old_rates)
        new = rng.binomial(100, old_rates - 0.05)
        alarms += compare_scenes(suite(*old), suite(*new), margin=0.05).regressed
    assert alarms / trials <= 0.05 + 0.01


def report(suite_digest: str, scenes: tuple[SceneResult, ...]) -> SimReport:
    return SimReport(
        digest="d" * 64,
        uri=f"store://{suite_digest}/report.json",
        producer=Producer(
            stage="validate", stage_version="1", config_digest="c", code_revision="r"
        ),
        parents=(),
        suite="reach-regression",
        suite_digest=suite_digest,
        backend="mujoco",
        backend_version="4.0.0",
        scenes=scenes,
        gates=(),
        passed=True,
    )


def test_reports_compare_only_on_the_same_suite() -> None:
    old = report("a" * 64, suite(95, 95, 95, 95))
    assert compare_reports(old, report("a" * 64, suite(95, 95, 60, 95)), margin=0.05).regressed
    with pytest.raises(ConfigError, match="suite_digest"):
        compare_reports(old, report("b" * 64, suite(95, 95, 95, 95)), margin=0.05)


def test_backends_agree_within_the_margin_and_disagree_either_way_beyond_it() -> None:
    from stages.evaluation.compare import compare_backends

    first = [result("nominal", 97), result("heavy", 90), result("noisy", 40)]
    same = compare_backends(first, [result("nominal", 95), result("heavy", 92),
                                    result("noisy", 38)], margin=0.1)
    assert [a.agrees for a in same] == [True, True, True]
    assert all(a.p_value > 0.05 for a in same)
    # The second backend far worse on one scene, far better on another: both disagree.
    apart = compare_backends(first, [result("nominal", 60), result("heavy", 91),
                                     result("noisy", 80)], margin=0.1)
    assert [a.agrees for a in apart] == [False, True, False]
    nominal = apart[0]
    assert (nominal.first_successes, nominal.second_successes) == (97, 60)
    assert nominal.difference == pytest.approx(-0.37)
    assert nominal.difference_ci_low < -0.1 and nominal.difference_ci_high < 0
    assert apart[2].difference == pytest.approx(0.40) and apart[2].difference_ci_low > 0.1
    # Two one-sided tests at alpha / 2: a p-value just inside alpha still disagrees.
    assert all(a.p_value <= 0.05 for a in apart if not a.agrees)

import pytest

from stages.evaluation.stats import (
    Z95,
    holm_adjust,
    newcombe_difference_interval,
    newcombe_regression_p_value,
    normal_cdf,
    wilson_gate_fail_chance,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (50, 100, 0.4038, 0.5962),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (95, 100, 0.8883, 0.9785),
    ],
)
def test_wilson_matches_reference_values(k: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)


def test_interval_narrows_with_more_trials() -> None:
    small = wilson_interval(9, 10)
    large = wilson_interval(900, 1000)
    assert large[1] - large[0] < small[1] - small[0]


@pytest.mark.parametrize(("k", "n"), [(1, 0), (-1, 5), (6, 5)])
def test_rejects_impossible_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


@pytest.mark.parametrize("n", [1, 7, 30, 100, 1000])
def test_interval_contains_the_estimate_at_the_extremes(n: int) -> None:
    assert wilson_interval(n, n)[1] == 1.0
    assert wilson_interval(0, n)[0] == 0.0


# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10.
NEWCOMBE_TABLE_II = [
    (56, 70, 48, 80, 0.0524, 0.3339),
    (9, 10, 3, 10, 0.1705, 0.8090),
    (6, 7, 2, 7, 0.0582, 0.8062),
    (5, 56, 0, 29, -0.0381, 0.1926),
    (0, 10, 0, 20, -0.1611, 0.2775),
    (0, 10, 0, 10, -0.2775, 0.2775),
    (10, 10, 0, 20, 0.6791, 1.0000),
    (10, 10, 0, 10, 0.6075, 1.0000),
]


@pytest.mark.parametrize(("k1", "n1", "k2", "n2", "low", "high"), NEWCOMBE_TABLE_II)
def test_newcombe_interval_matches_published_values(
    k1: int, n1: int, k2: int, n2: int, low: float, high: float
) -> None:
    lo, hi = newcombe_difference_interval(k1, n1, k2, n2)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)


def test_newcombe_interval_mirrors_when_the_groups_swap() -> None:
    lo, hi = newcombe_difference_interval(56, 70, 48, 80)
    swapped = newcombe_difference_interval(48, 80, 56, 70)
    assert swapped == pytest.approx((-hi, -lo))


def test_newcombe_interval_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        newcombe_difference_interval(11, 10, 3, 10)


def test_normal_cdf_reference_values() -> None:
    assert normal_cdf(0.0) == 0.5
    assert normal_cdf(Z95) == pytest.approx(0.975, abs=1e-12)
    assert normal_cdf(-1.6448536269514722) == pytest.approx(0.05, abs=1e-12)


@pytest.mark.parametrize("z", [1.0, 1.6448536269514722, Z95, 2.5])
def test_regression_p_value_inverts_the_interval(z: float) -> None:
    """At the margin that the upper bound at z touches, the p-value is 1 - Phi(z)."""
    _, high = newcombe_difference_interval(70, 100, 95, 100, z)
    p = newcombe_regression_p_value(70, 100, 95, 100, margin=-high)
    assert p == pytest.approx(normal_cdf(-z), rel=1e-9)


def test_regression_p_value_is_one_half_at_the_margin() -> None:
    assert newcombe_regression_p_value(90, 100, 95, 100, margin=0.05) == pytest.approx(0.5)


def test_regression_p_value_orders_the_evidence() -> None:
    p_small_drop = newcombe_regression_p_value(85, 100, 95, 100, margin=0.05)
    p_large_drop = newcombe_regression_p_value(60, 100, 95, 100, margin=0.05)
    p_equal = newcombe_regression_p_value(95, 100, 95, 100, margin=0.05)
    assert p_large_drop < 1e-5 < p_small_drop < 0.5 < p_equal


def test_regression_p_value_at_the_extremes() -> None:
    assert newcombe_regression_p_value(0, 100, 100, 100, margin=0.05) < 1e-30
    assert newcombe_regression_p_value(100, 100, 0, 100, margin=0.05) > 1 - 1e-12


@pytest.mark.parametrize("margin", [-0.01, 1.0])
def test_regression_p_value_rejects_impossible_margins(margin: float) -> None:
    with pytest.raises(ValueError):
        newcombe_regression_p_value(9, 10, 9, 10, margin)


def test_holm_matches_reference_values() -> None:
    # R: p.adjust(c(0.01, 0.02, 0.03, 0.04, 0.05), "holm")
    assert holm_adjust([0.01, 0.02, 0.03, 0.04, 0.05]) == pytest.approx(
        (0.05, 0.08, 0.09, 0.09, 0.09)
    )


def test_holm_keeps_the_input_order_and_caps_at_one() -> None:
    assert holm_adjust([0.5, 0.01, 0.03, 0.04]) == pytest.approx((0.5, 0.04, 0.09, 0.09))
    assert holm_adjust([0.4, 0.9]) == pytest.approx((0.8, 0.9))
    assert holm_adjust([]) == ()


def test_holm_rejects_values_outside_zero_one() -> None:
    with pytest.raises(ValueError):
        holm_adjust([0.1, 1.5])


@pytest.mark.parametrize(("threshold", "rate", "n"), [(0.8, 0.9, 100), (0.5, 0.6, 50),
                                                       (0.85, 0.95, 100), (0.3, 0.2, 2000)])
def test_the_full_count_gate_fails_as_often_as_the_binomial_says(
        threshold: float, rate: float, n: int) -> None:
    from scipy.stats import binom

    needed = next(k for k in range(n + 1) if wilson_interval(k, n)[0] >= threshold)
    assert wilson_interval(needed - 1, n)[0] < threshold
    assert wilson_gate_fail_chance(threshold, rate, n) == pytest.approx(
        binom.cdf(needed - 1, n, rate), rel=1e-9, abs=1e-15)


def test_the_full_count_gate_at_its_edges() -> None:
    assert wilson_gate_fail_chance(1.0, 0.99, 10) == 1.0  # no count reaches a bound of 1
    assert wilson_gate_fail_chance(0.0, 0.1, 10) == 0.0  # every count reaches 0
    assert wilson_gate_fail_chance(0.5, 0.0, 10) == 1.0
    assert wilson_gate_fail_chance(0.5, 1.0, 10) == 0.0
    with pytest.raises(ValueError):
        wilson_gate_fail_chance(0.5, 0.5, 0)

import pytest

from stages.stats import wilson_interval


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

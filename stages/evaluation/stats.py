"""Statistics for success rates: Wilson score intervals, Newcombe's interval for a difference
of two rates, its one-sided p-value against a margin, and Holm's multiple-testing adjustment."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054
"""Standard normal quantile of 0.975: the z of a two-sided 95% interval."""

_Z_SEARCH = 40.0
"""Half-width of the z range searched when inverting an interval into a p-value; the normal
tail beyond it is below the smallest positive double."""

_BISECTIONS = 60
"""Halvings of the z range: enough to pin z to the last bits of a double."""


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default).

    Well-behaved at 0 and ``trials`` successes, unlike the normal approximation.
    """
    if trials <= 0:
        raise ValueError(f"trials must be positive, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def normal_cdf(x: float) -> float:
    """Standard normal cumulative distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def newcombe_difference_interval(
    k1: int, n1: int, k2: int, n2: int, z: float = Z95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval (1998, method 10) for the difference ``p1 - p2``.

    With ``d = k1/n1 - k2/n2`` and the Wilson intervals ``(l1, u1)`` of ``k1/n1`` and
    ``(l2, u2)`` of ``k2/n2``, the interval is
    ``(d - sqrt((p1 - l1)^2 + (u2 - p2)^2), d + sqrt((u1 - p1)^2 + (p2 - l2)^2))``.
    It stays inside [-1, 1], has a non-zero width at 0 or n successes, and covers close to
    its nominal level down to a few trials per group. 95% two-sided by default; with ``z``
    the quantile of ``1 - a``, each bound alone is a one-sided ``1 - a`` bound.
    """
    l1, u1 = wilson_interval(k1, n1, z)
    l2, u2 = wilson_interval(k2, n2, z)
    p1, p2 = k1 / n1, k2 / n2
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)


def _upper_bound(k1: int, n1: int, k2: int, n2: int, z: float) -> float:
    """Newcombe's one-sided upper bound on ``p1 - p2`` at quantile ``z``, increasing in ``z``.

    For ``z >= 0`` it is the interval's upper bound at ``z``; for ``z < 0`` the lower bound at
    ``-z``, which continues it through the point estimate at ``z = 0``.
    """
    low, high = newcombe_difference_interval(k1, n1, k2, n2, abs(z))
    return high if z >= 0 else low


def newcombe_regression_p_value(k1: int, n1: int, k2: int, n2: int, margin: float) -> float:
    """One-sided p-value of ``p1 >= p2 - margin`` against ``p1 < p2 - margin``.

    Small values are evidence that rate 1 falls short of rate 2 by more than ``margin``. It
    inverts Newcombe's interval: the p-value is ``1 - Phi(z)`` for the ``z`` at which the
    one-sided upper bound on ``p1 - p2`` (:func:`newcombe_difference_interval`) equals
    ``-margin``, so ``p <= a`` exactly when that ``1 - a`` upper bound lies at or below
    ``-margin``. Above 0.5 when the observed difference is already within the margin.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    low, high = -_Z_SEARCH, _Z_SEARCH
    if _upper_bound(k1, n1, k2, n2, high) < -margin:
        return 0.0
    if _upper_bound(k1, n1, k2, n2, low) >= -margin:
        return 1.0
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        if _upper_bound(k1, n1, k2, n2, mid) < -margin:
            low = mid
        else:
            high = mid
    return normal_cdf(-0.5 * (low + high))


def holm_adjust(p_values: Sequence[float]) -> tuple[float, ...]:
    """Holm's step-down adjusted p-values, in the order given.

    Rejecting every hypothesis whose adjusted p-value is at most ``alpha`` keeps the
    probability of any false rejection at most ``alpha`` under any dependence between the
    tests, and rejects at least as much as Bonferroni. With ``m`` p-values sorted ascending,
    the ``i``-th (from 0) adjusts to ``max over j <= i of min(1, (m - j) p_j)``.
    """
    for p in p_values:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-values must be in [0, 1], got {p}")
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return tuple(adjusted)


def wilson_gate_fail_chance(threshold: float, rate: float, trials: int) -> float:
    """Chance that a policy whose true success rate is ``rate`` fails the fixed-count gate of
    ``trials`` episodes: its 95% Wilson lower bound stays below ``threshold``.

    It is the binomial probability of fewer successes than the fewest whose lower bound
    reaches ``threshold`` (1 when no count reaches it), summed in log space so that thousands
    of trials neither overflow nor underflow.
    """
    if trials <= 0:
        raise ValueError(f"trials must be positive, got {trials}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    needed = next((k for k in range(trials + 1) if wilson_interval(k, trials)[0] >= threshold),
                  None)
    if needed is None:
        return 1.0
    if rate in (0.0, 1.0):
        return float(needed > 0) if rate == 0.0 else float(needed > trials)
    log_p, log_q = math.log(rate), math.log1p(-rate)
    lgn = math.lgamma(trials + 1)
    return min(1.0, sum(math.exp(lgn - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
                                 + k * log_p + (trials - k) * log_q) for k in range(needed)))

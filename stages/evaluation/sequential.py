"""Sequential gates: a scene stops spending episodes once its verdict is clear.

A scene's gate decides between two rates of success: ``p_fail``, at which the policy must fail
the gate, and ``p_hold`` (above it), at which it must pass. Between them lies the indifference
zone, where either verdict is acceptable. The design is a truncated sequential probability
ratio test (Wald 1945) that looks at the episodes every ``chunk`` of them, up to ``max_episodes``:
with ``k`` successes in ``n`` episodes, the log-likelihood ratio of failing against holding is

    llr(k, n) = k ln(p_fail / p_hold) + (n - k) ln((1 - p_fail) / (1 - p_hold)),

the scene fails as soon as ``llr >= upper``, passes as soon as ``llr <= lower``, and at the
last look fails exactly when ``llr >= final``.

Wald's boundaries ``ln((1 - beta) / alpha)`` and ``ln(beta / (1 - alpha))`` hold the error
rates only approximately, and not at all once the test is cut off at ``max_episodes``. Here
they are instead calibrated exactly: the episodes of a scene are independent Bernoulli trials,
so the chance of every verdict at every look follows from the binomial distribution by a
forward recursion over the looks (:func:`operating`). :func:`design` scales Wald's boundaries
and picks the final threshold so that

- P(pass | p = p_fail) <= alpha   (a policy at the threshold passes: the dangerous error), and
- P(fail | p = p_hold) <= beta    (a good policy fails: the costly one),

and among the scales that meet both, keeps the one with the fewest expected episodes. Both rates
are exact, not approximations, and bound every rate beyond them: the verdict is monotone in the
successes seen, so the chance to fail only falls as the true rate rises. Where
``max_episodes`` is too few for ``beta``, alpha still holds and the design reports the beta it
reaches. The same recursion gives the whole operating curve: the chance to fail and the
distribution of episodes spent at any true rate.

Written here rather than taken from a library: the statistical packages on PyPI offer the
untruncated SPRT with Wald's approximate boundaries (or none at all), not an exactly
calibrated truncated design with looks every few episodes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

METHOD = ("truncated SPRT on the success rate, a look every chunk of episodes, boundaries "
          "calibrated by exact binomial recursion")
"""How a sequential gate decides, recorded in every verdict."""

Verdict = Literal["pass", "fail"]

_SCALES = np.round(np.arange(0.3, 2.001, 0.05), 2)
"""Multiples of Wald's boundaries tried by :func:`design`."""


@dataclass(frozen=True)
class Operating:
    """What a design does at one true success rate."""

    p: float
    fail: float
    """Chance that the gate fails the scene."""
    mean_episodes: float
    median_episodes: int
    stop: np.ndarray
    """Chance of stopping at each look. Shape: (looks,)."""


@dataclass(frozen=True)
class Design:
    """A calibrated sequential gate; see the module doc."""

    p_fail: float
    p_hold: float
    alpha: float
    """Exact chance of passing at ``p_fail``."""
    beta: float
    """Exact chance of failing at ``p_hold``."""
    looks: tuple[int, ...]
    """Episodes seen at each look, increasing; the last is the scene's episode count."""
    upper: float
    lower: float
    final: float
    scale: float
    """The multiple of Wald's boundaries chosen."""

    @property
    def max_episodes(self) -> int:
        return self.looks[-1]

    def llr(self, successes: int, episodes: int) -> float:
        """Log-likelihood ratio of failing against holding after ``successes`` of ``episodes``."""
        return float(_llr(np.array([successes]), episodes, self.p_fail, self.p_hold)[0])

    def decide(self, successes: int, episodes: int) -> Verdict | None:
        """The verdict at a look after ``episodes`` (one of :attr:`looks`), or None: go on."""
        llr = self.llr(successes, episodes)
        if episodes >= self.max_episodes:
            return "fail" if llr >= self.final else "pass"
        if llr >= self.upper:
            return "fail"
        if llr <= self.lower:
            return "pass"
        return None

    def simulate(self, p: float, streams: int, rng: np.random.Generator
                 ) -> tuple[float, np.ndarray]:
        """What :meth:`operating` computes, by simulation: the share of ``streams`` streams of
        Bernoulli(``p``) episodes that :meth:`decide` fails, looking at every look, and the
        episodes each stream spent. Shape of the latter: (streams,)."""
        fails = 0
        spent = np.zeros(streams, np.int64)
        for i in range(streams):
            k = seen = 0
            for look in self.looks:
                k += int(rng.binomial(look - seen, p))
                seen = look
                verdict = self.decide(k, seen)
                if verdict is not None:
                    fails += verdict == "fail"
                    spent[i] = seen
                    break
        return fails / streams, spent

    def operating(self, p: float) -> Operating:
        """The gate's chance to fail and the episodes it spends when the true rate is ``p``."""
        return operating(self.looks, self.p_fail, self.p_hold, self.upper, self.lower,
                         self.final, p)


def _llr(k: np.ndarray, n: int, p_fail: float, p_hold: float) -> np.ndarray:
    """``llr(k, n)`` for every ``k``; with ``p_hold = 1`` one failed episode makes it infinite."""
    k = np.asarray(k, np.float64)
    out = k * math.log(p_fail / p_hold)
    if p_hold < 1.0:
        return out + (n - k) * math.log((1.0 - p_fail) / (1.0 - p_hold))
    return np.where(n - k > 0, math.inf, out)


@functools.lru_cache(maxsize=4096)
def _binomial(n: int, p: float) -> np.ndarray:
    """Probabilities of 0..n successes in ``n`` trials of rate ``p``, summed in log space.
    Shape: (n + 1,); read-only (it is cached)."""
    out = np.zeros(n + 1)
    if p <= 0.0 or p >= 1.0:
        out[0 if p <= 0.0 else n] = 1.0
    else:
        k = np.arange(n + 1)
        log_choose = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                               for i in k])
        out = np.exp(log_choose + k * math.log(p) + (n - k) * math.log1p(-p))
    out.flags.writeable = False
    return out


def _paths(looks: tuple[int, ...], p_fail: float, p_hold: float, upper: float, lower: float,
           p: float) -> tuple[list[tuple[float, float]], np.ndarray]:
    """Forward recursion to the last look: the chance of failing and of passing at each look
    before it, and the distribution of successes of the paths still going at the last one."""
    alive = np.ones(1)
    stops: list[tuple[float, float]] = []
    seen = 0
    for i, n in enumerate(looks):
        alive = np.convolve(alive, _binomial(n - seen, p))
        seen = n
        if i == len(looks) - 1:
            break
        llr = _llr(np.arange(n + 1), n, p_fail, p_hold)
        fail, hold = llr >= upper, llr <= lower
        stops.append((float(alive[fail].sum()), float(alive[hold].sum())))
        alive = np.where(fail | hold, 0.0, alive)
    return stops, alive


def operating(looks: tuple[int, ...], p_fail: float, p_hold: float, upper: float,
              lower: float, final: float, p: float) -> Operating:
    """Exact chance to fail, mean and median episodes of the design at true rate ``p``."""
    stops, alive = _paths(looks, p_fail, p_hold, upper, lower, p)
    n = looks[-1]
    last_fail = float(alive[_llr(np.arange(n + 1), n, p_fail, p_hold) >= final].sum())
    stop = np.array([f + h for f, h in stops] + [float(alive.sum())])
    fail = sum(f for f, _ in stops) + last_fail
    cdf = np.cumsum(stop)
    median = looks[int(np.searchsorted(cdf, 0.5 - 1e-12))]
    return Operating(p=p, fail=float(fail), mean_episodes=float(stop @ np.array(looks)),
                     median_episodes=int(median), stop=stop)


def schedule(max_episodes: int, chunk: int) -> tuple[int, ...]:
    """The looks: every ``chunk`` episodes, and the scene's last episode."""
    if max_episodes < 1 or chunk < 1:
        raise ValueError(f"episodes and chunk must be positive, got {max_episodes}, {chunk}")
    looks = list(range(chunk, max_episodes, chunk))
    return (*looks, max_episodes)


def design(p_fail: float, p_hold: float, alpha: float, beta: float, max_episodes: int,
           chunk: int) -> Design:
    """The calibrated design with the fewest expected episodes; see the module doc.

    ``0 < p_fail < p_hold <= 1``, ``alpha`` and ``beta`` in (0, 0.5), otherwise ``ValueError``.
    """
    if not 0.0 < p_fail < p_hold <= 1.0:
        raise ValueError(f"need 0 < p_fail < p_hold <= 1, got {p_fail}, {p_hold}")
    if not (0.0 < alpha < 0.5 and 0.0 < beta < 0.5):
        raise ValueError(f"alpha and beta must be in (0, 0.5), got {alpha}, {beta}")
    looks = schedule(max_episodes, chunk)
    n = looks[-1]
    llr_last = _llr(np.arange(n + 1), n, p_fail, p_hold)
    wald_upper, wald_lower = math.log((1 - beta) / alpha), math.log(beta / (1 - alpha))
    best: tuple[float, Design] | None = None
    fallback: Design | None = None
    for scale in _SCALES:
        upper, lower = float(scale * wald_upper), float(scale * wald_lower)
        stop_bad, alive_bad = _paths(looks, p_fail, p_hold, upper, lower, p_fail)
        stop_good, alive_good = _paths(looks, p_fail, p_hold, upper, lower, p_hold)
        pass_early = sum(h for _, h in stop_bad)
        fail_early = sum(f for f, _ in stop_good)
        # the last look fails at llr >= final: the highest final whose passes keep alpha
        final = next((float(t) for t in np.unique(llr_last)[::-1]
                      if pass_early + float(alive_bad[llr_last < t].sum()) <= alpha), None)
        if final is None:
            continue
        a = pass_early + float(alive_bad[llr_last < final].sum())
        b = fail_early + float(alive_good[llr_last >= final].sum())
        candidate = Design(p_fail, p_hold, a, b, looks, upper, lower, final, float(scale))
        if b <= beta:
            cost = candidate.operating(p_fail).mean_episodes + \
                candidate.operating(p_hold).mean_episodes
            if best is None or cost < best[0] - 1e-9:
                best = (cost, candidate)
        elif fallback is None or b < fallback.beta:
            fallback = candidate
    if best is not None:
        return best[1]
    if fallback is None:
        raise ValueError(f"no design keeps alpha {alpha} within {n} episodes")
    return fallback

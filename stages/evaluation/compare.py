"""Challenger against champion on the same frozen suite: did any scene's success rate regress?

Per scene, with ``p_new`` the challenger's and ``p_old`` the champion's true success rate, the
hypotheses are

    H0: p_new >= p_old - margin   (no worse than the tolerated drop)
    H1: p_new <  p_old - margin   (a regression)

and a scene regresses when H0 is rejected at level ``alpha`` after Holm's adjustment over the
suite's scenes. A false alarm (any scene flagged while no scene dropped by more than
``margin``) therefore happens with probability at most ``alpha``, whatever the number of
scenes, up to the small excess of the discrete test quantified below. Putting "within the
margin" under H0 is deliberate: with ~100 episodes per scene, the reverse framing (demanding
proof of non-inferiority) fails a challenger exactly as good as the champion on about half of
the scenes.

The per-scene test inverts Newcombe's hybrid score interval for a difference of two
proportions (1998, method 10; :func:`stages.evaluation.stats.newcombe_difference_interval`), so the
reported interval and the decision never disagree. Why this test:

- The Wald interval collapses to zero width at 100/100, the usual champion count, and would
  flag any single failed episode; Wilson-based intervals keep a width at 0 and n successes.
- Its size, computed exactly over the binomial distributions with 100 episodes per side and
  the challenger exactly ``margin`` = 0.05 below the champion, is 0.028-0.051 at level 0.05
  and 0.0015-0.0138 at 0.0125 for champion rates 0.5-1.0: near nominal around 0.5 and
  conservative near 1, where validated policies live. So the family-wise rate stays at or
  below ``alpha`` up to that small excess; with equal rates on four scenes it is below 0.01.
- It is closed-form and its published reference values are tested. The Farrington-Manning
  score test is a sound alternative, but its interval needs a root search per bound; exact
  unconditional tests cost orders of magnitude more.

The test treats the two runs as independent samples. Run on the same frozen suite, both
policies see the same seeds and randomization draws, which correlates their outcomes
positively; that only makes the test more conservative.

Sensitivity, for planning suites: with 100 episodes per scene, margin 0.05 and four scenes
(Holm's first step at 0.0125), a single scene that drops from 1.0 by 0.20, or from 0.95 by
0.25, is flagged with probability >= 0.95; a drop of 0.10 is flagged 10-20% of the time.
"""

from __future__ import annotations

from collections.abc import Sequence

from physai_core.errors import ConfigError, Problem
from stages.artifacts.records import SceneAgreement, SceneResult, SimReport
from stages.core.schema import DocumentedModel
from stages.evaluation.stats import (
    holm_adjust,
    newcombe_difference_interval,
    newcombe_regression_p_value,
)

METHOD = "Newcombe hybrid score (method 10), one-sided per scene, Holm over scenes"
"""How :func:`compare_scenes` decides, recorded in every comparison."""


class SceneComparison(DocumentedModel):
    """Challenger against champion on one scene."""

    scene: str
    """Scene name."""
    champion_successes: int
    """Successful champion episodes (count)."""
    champion_episodes: int
    """Champion episodes (count)."""
    champion_rate: float
    """Champion success rate (fraction)."""
    challenger_successes: int
    """Successful challenger episodes (count)."""
    challenger_episodes: int
    """Challenger episodes (count)."""
    challenger_rate: float
    """Challenger success rate (fraction)."""
    difference: float
    """Challenger rate minus champion rate (fraction); negative when the challenger is worse."""
    difference_ci_low: float
    """Lower bound of the 95% Newcombe interval on the difference."""
    difference_ci_high: float
    """Upper bound of the 95% Newcombe interval on the difference."""
    p_value: float
    """One-sided p-value of "the challenger is not worse by more than the margin",
    unadjusted."""
    p_adjusted: float
    """``p_value`` after Holm's adjustment over every scene of the suite."""
    regressed: bool
    """Whether ``p_adjusted <= alpha``: the challenger is worse by more than the margin."""


class SuiteComparison(DocumentedModel):
    """Challenger against champion on every scene of a suite, and the overall verdict."""

    margin: float
    """Tolerated drop in success rate (fraction) before a scene counts as regressed."""
    alpha: float
    """Family-wise false-alarm level over all scenes."""
    method: str
    """The test and the multiple-testing correction used."""
    scenes: tuple[SceneComparison, ...]
    """One comparison per scene, in the champion's order."""
    regressed: bool
    """Whether any scene regressed."""
    reasons: tuple[str, ...]
    """One line per regressed scene with counts, difference and p-value; empty if none."""


def _by_name(
    results: Sequence[SceneResult], side: str, problems: list[Problem]
) -> dict[str, SceneResult]:
    """Index ``results`` by scene name, recording repeated names and impossible counts."""
    out: dict[str, SceneResult] = {}
    for i, r in enumerate(results):
        if r.scene in out:
            problems.append(Problem(side, f"scenes.{i}.scene", r.scene, "scene listed twice"))
        if r.episodes <= 0:
            problems.append(
                Problem(
                    side,
                    f"scenes.{i}.episodes",
                    r.episodes,
                    f"scene {r.scene!r} needs at least one episode",
                )
            )
        elif not 0 <= r.successes <= r.episodes:
            problems.append(
                Problem(
                    side,
                    f"scenes.{i}.successes",
                    r.successes,
                    f"scene {r.scene!r} needs successes in [0, {r.episodes}]",
                )
            )
        out.setdefault(r.scene, r)
    return out


def _missing(
    have: dict[str, SceneResult], want: dict[str, SceneResult], side: str, other: str
) -> list[Problem]:
    """One problem per scene that ``other`` was validated on and ``side`` was not."""
    return [
        Problem(side, "scenes", name, f"scene {name!r} is missing; the {other} has it")
        for name in want
        if name not in have
    ]


def _scene(old: SceneResult, new: SceneResult, margin: float) -> tuple[float, float, float]:
    """Difference interval (95%) and unadjusted one-sided p-value for one scene."""
    low, high = newcombe_difference_interval(
        new.successes, new.episodes, old.successes, old.episodes
    )
    p = newcombe_regression_p_value(
        new.successes, new.episodes, old.successes, old.episodes, margin
    )
    return low, high, p


def compare_scenes(
    champion: Sequence[SceneResult],
    challenger: Sequence[SceneResult],
    *,
    margin: float,
    alpha: float = 0.05,
) -> SuiteComparison:
    """Test every scene for a drop of more than ``margin`` in success rate; see the module doc.

    Scenes are matched by name and only their ``successes`` and ``episodes`` are used. No
    scenes, a scene on one side only, a name listed twice, or impossible counts raise one
    :class:`~physai_core.errors.ConfigError` naming every such scene. ``margin`` must be in
    [0, 1) and ``alpha`` in (0, 1), otherwise ``ValueError``.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    problems: list[Problem] = []
    if not champion:
        problems.append(Problem("champion", "scenes", (), "no scene results to compare"))
    old = _by_name(champion, "champion", problems)
    new = _by_name(challenger, "challenger", problems)
    problems += _missing(new, old, "challenger", "champion")
    problems += _missing(old, new, "champion", "challenger")
    if problems:
        raise ConfigError(problems)

    names = list(old)
    tests = [_scene(old[name], new[name], margin) for name in names]
    adjusted = holm_adjust([p for _, _, p in tests])
    scenes = []
    for name, (low, high, p), p_adj in zip(names, tests, adjusted, strict=True):
        o, n = old[name], new[name]
        scenes.append(
            SceneComparison(
                scene=name,
                champion_successes=o.successes,
                champion_episodes=o.episodes,
                champion_rate=o.successes / o.episodes,
                challenger_successes=n.successes,
                challenger_episodes=n.episodes,
                challenger_rate=n.successes / n.episodes,
                difference=n.successes / n.episodes - o.successes / o.episodes,
                difference_ci_low=low,
                difference_ci_high=high,
                p_value=p,
                p_adjusted=p_adj,
                regressed=p_adj <= alpha,
            )
        )
    reasons = tuple(_reason(s, margin, alpha) for s in scenes if s.regressed)
    return SuiteComparison(
        margin=margin,
        alpha=alpha,
        method=METHOD,
        scenes=tuple(scenes),
        regressed=bool(reasons),
        reasons=reasons,
    )


def compare_reports(
    champion: SimReport, challenger: SimReport, *, margin: float, alpha: float = 0.05
) -> SuiteComparison:
    """:func:`compare_scenes` on two validation reports, which must share one suite digest.

    Reports of different suites, or of one suite on another simulator revision, measure
    different things; comparing them raises a :class:`~physai_core.errors.ConfigError`.
    """
    if champion.suite_digest != challenger.suite_digest:
        raise ConfigError.one(
            challenger.uri,
            "suite_digest",
            challenger.suite_digest,
            f"differs from the champion's suite digest {champion.suite_digest} "
            f"({champion.uri}); both must be validated on the same frozen suite",
        )
    return compare_scenes(champion.scenes, challenger.scenes, margin=margin, alpha=alpha)


def _reason(s: SceneComparison, margin: float, alpha: float) -> str:
    """Why one scene counts as regressed, in one line."""
    return (
        f"{s.scene}: challenger {s.challenger_successes}/{s.challenger_episodes} "
        f"= {s.challenger_rate:.3f} vs champion {s.champion_successes}/{s.champion_episodes} "
        f"= {s.champion_rate:.3f}, difference {s.difference:+.3f} "
        f"[95% CI {s.difference_ci_low:+.3f}, {s.difference_ci_high:+.3f}] is worse than "
        f"-{margin:g} (Holm-adjusted p = {s.p_adjusted:.2g} <= {alpha:g})"
    )


AGREEMENT_METHOD = ("Newcombe hybrid score (method 10), two one-sided tests at alpha/2, Holm "
                    "over scenes")
"""How :func:`compare_backends` decides, recorded in every sim-to-sim check."""


def compare_backends(
    first: Sequence[SceneResult], second: Sequence[SceneResult], *, margin: float,
    alpha: float = 0.05,
) -> tuple[SceneAgreement, ...]:
    """Whether each scene's success rate on a second simulator backend agrees with the first.

    The promotion gate's test (:func:`compare_scenes`) run both ways at ``alpha / 2``: a scene
    disagrees when either backend is worse than the other by more than ``margin``, Holm-
    adjusted over the scenes in each direction. Its two-sided p-value is twice the smaller
    adjusted one-sided p-value (capped at 1), so ``agrees`` is ``p_value > alpha``.
    """
    lower = compare_scenes(first, second, margin=margin, alpha=alpha / 2)
    higher = {s.scene: s for s in compare_scenes(second, first, margin=margin,
                                                 alpha=alpha / 2).scenes}
    out = []
    for s in lower.scenes:
        p = min(1.0, 2.0 * min(s.p_adjusted, higher[s.scene].p_adjusted))
        out.append(SceneAgreement(
            scene=s.scene, first_successes=s.champion_successes,
            first_episodes=s.champion_episodes, second_successes=s.challenger_successes,
            second_episodes=s.challenger_episodes, difference=s.difference,
            difference_ci_low=s.difference_ci_low, difference_ci_high=s.difference_ci_high,
            p_value=p, agrees=p > alpha))
    return tuple(out)

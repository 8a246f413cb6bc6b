"""Gates of a validation: each scene's success gate (its Wilson lower bound against its
threshold, or a calibrated sequential design's verdict), the Cosmos critic's gate and the
sim-to-sim agreement gate; gates are results, never exceptions."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from stages.artifacts.records import GateResult, SceneResult, SimToSim
from stages.sections.models import ValidateConfig

if TYPE_CHECKING:
    from stages.evaluation.sequential import Design
    from stages.sim.suites.suite import Suite

log = logging.getLogger(__name__)


def scene_threshold(cfg: ValidateConfig, scene: str) -> float:
    """The success rate scene ``scene``'s gate asks of its interval's lower bound."""
    return cfg.scene_min_success.get(scene, cfg.min_success)


def sequential_design(cfg: ValidateConfig | None, scene: str, episodes: int) -> Design | None:
    """The calibrated sequential gate of a scene (stages/evaluation/sequential.py), or None where
    the scene spends its full count: no ``validate.sequential``, a threshold of 0, which no policy
    can fail short of, or of 1, which no interval reaches."""
    if cfg is None or cfg.sequential is None:
        return None
    threshold = scene_threshold(cfg, scene)
    if not 0.0 < threshold < 1.0:
        return None
    seq = cfg.sequential
    from stages.evaluation.sequential import design

    plan = design(threshold, min(1.0, threshold + seq.indifference), seq.alpha, seq.beta,
                  episodes, min(seq.chunk, episodes))
    if plan.beta > seq.beta:
        _short_of_beta(scene, episodes, plan, seq.beta)
    return plan


def _short_of_beta(scene: str, episodes: int, plan: Design, beta: float) -> None:
    """Say that ``episodes`` are too few for a sequential gate to fail a policy at
    ``plan.p_hold`` at most ``beta`` of the time: a warning where the sequential gate fails it
    more often than the full-count gate of as many episodes would (the Wilson lower bound
    against the threshold, :func:`stages.evaluation.stats.wilson_gate_fail_chance`), else a note,
    since the count, not the early stop, is what falls short (the gate's detail records the rate
    either way)."""
    from stages.evaluation.stats import wilson_gate_fail_chance

    full = wilson_gate_fail_chance(plan.p_fail, plan.p_hold, episodes)
    worse = plan.beta > full
    (log.warning if worse else log.info)(
        "scene %s: %d episodes are too few for a sequential gate that fails a policy at %.3g "
        "at most %.3g of the time; it does %.3g of the time, %s the %.3g of the full-count "
        "gate of %d episodes (a policy at the threshold %.3g passes %.3g of the time)",
        scene, episodes, plan.p_hold, beta, plan.beta,
        "more often than" if worse else "no more often than", full, episodes, plan.p_fail,
        plan.alpha)


def sequential_threshold(cfg: ValidateConfig, suite: Suite, index: int) -> float | None:
    """The threshold of run ``index`` of ``suite`` (:meth:`Suite.run`) where it runs under a
    sequential gate, else None: scenes on the suite's own backend with a threshold between 0
    and 1, not their sweep points or their runs on a ``compare_backend``, which measure a rate
    rather than decide a gate."""
    if cfg.sequential is None or index >= len(suite.scenes) or \
            suite.sweep_point(index) is not None:
        return None
    threshold = scene_threshold(cfg, suite.scenes[index].scene.config.name)
    return threshold if 0.0 < threshold < 1.0 else None


def scene_sequential(cfg: ValidateConfig, suite: Suite, index: int) -> Design | None:
    """The calibrated sequential design of run ``index`` of ``suite``, or None: see
    :func:`sequential_threshold`."""
    if sequential_threshold(cfg, suite, index) is None:
        return None
    scene, episodes, _ = suite.scenes[index]
    return sequential_design(cfg, scene.config.name, episodes)


def gate_scenes(cfg: ValidateConfig, scenes: tuple[SceneResult, ...]) -> tuple[GateResult, ...]:
    """One gate per scene: the interval's lower bound must reach the scene's threshold, or,
    for a scene run sequentially, the sequential design's verdict
    (stages/evaluation/sequential.py)."""
    gates = []
    for s in scenes:
        threshold = scene_threshold(cfg, s.scene)
        detail = (f"{s.successes}/{s.episodes} = {s.success_rate:.3f} "
                  f"[{s.ci_low:.3f}, {s.ci_high:.3f}]")
        passed = s.ci_low >= threshold
        if s.sequential is not None:
            seq = s.sequential
            passed = seq.verdict == "pass"
            detail += (f"; sequential {seq.verdict} after {seq.episodes} of {seq.max_episodes} "
                       f"episodes (chance to pass at {seq.p_fail:g}: {seq.alpha:.3f}, to fail "
                       f"at {seq.p_hold:.3g}: {seq.beta:.3f})")
        gates.append(GateResult(name=f"success/{s.scene}", measured=s.ci_low,
                                threshold=threshold, passed=passed, detail=detail))
    return tuple(gates)


def gate_critic(cfg: ValidateConfig, scenes: tuple[SceneResult, ...]) -> tuple[GateResult, ...]:
    """The critic's gate, when ``validate.critic.min_pass_rate`` asks for one: the share of
    judged scenes found plausible and done."""
    if cfg.critic is None or cfg.critic.min_pass_rate is None:
        return ()
    verdicts = [s.critic for s in scenes if s.critic is not None]
    passed = sum(v.passed for v in verdicts)
    rate = passed / len(verdicts) if verdicts else 0.0
    model = verdicts[0].model if verdicts else "no verdict"
    return (GateResult(name="critic/pass_rate", measured=rate,
                       threshold=cfg.critic.min_pass_rate,
                       passed=bool(verdicts) and rate >= cfg.critic.min_pass_rate,
                       detail=f"{passed}/{len(verdicts)} scenes plausible and done ({model})"),)


def sim_to_sim_check(cfg: ValidateConfig, other: str | None, first: tuple[SceneResult, ...],
                     second: tuple[SceneResult, ...]) -> SimToSim | None:
    """The second backend's results and their agreement with the first's, if there is one."""
    from stages.evaluation.compare import AGREEMENT_METHOD, compare_backends
    from stages.sim.backends.catalog import backend_version

    if other is None:
        return None
    check = cfg.sim_to_sim
    agreement = compare_backends(first, second, margin=check.margin, alpha=check.alpha)
    return SimToSim(backend=other, backend_version=backend_version(other), margin=check.margin,
                    alpha=check.alpha, method=AGREEMENT_METHOD, scenes=second,
                    agreement=agreement, agrees=all(a.agrees for a in agreement))


def gate_sim_to_sim(cfg: ValidateConfig, check: SimToSim | None) -> tuple[GateResult, ...]:
    """One gate per scene when ``validate.sim_to_sim.gate`` asks: the two backends agree."""
    if check is None or not cfg.sim_to_sim.gate:
        return ()
    return tuple(
        GateResult(name=f"sim_to_sim/{a.scene}", measured=a.p_value, threshold=check.alpha,
                   passed=a.agrees,
                   detail=f"{a.first_successes}/{a.first_episodes} vs {check.backend} "
                   f"{a.second_successes}/{a.second_episodes}, difference {a.difference:+.3f} "
                   f"[{a.difference_ci_low:+.3f}, {a.difference_ci_high:+.3f}], p {a.p_value:.3g}")
        for a in check.agreement)

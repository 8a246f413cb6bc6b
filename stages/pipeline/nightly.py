"""The nightly sim regression: the production model on its frozen suite, against its baseline.

It loads the version ``@champion`` points at, runs that version's policy over the pipeline
config's suite (which must still be the suite the champion was validated on: same digest),
and compares every scene with the champion's recorded validation report using the promotion
gate's statistical test (Newcombe interval, Holm-adjusted over scenes). Simulator, task or
asset drift, or a policy that is not what its baseline says, shows up as regressed scenes.
The result is an MLflow run in the experiment ``<config name>-nightly`` (FAILED when a scene
regressed) with the comparison and a markdown report. It never moves an alias.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from physai_core.errors import ConfigError, PhysaiError
from stages.artifacts.records import Policy, SceneResult, SimReport
from stages.core.schema import FrozenModel
from stages.core.settings import Settings
from stages.evaluation.compare import SuiteComparison, compare_scenes
from stages.evaluation.suite import evaluate_suite, scene_environment
from stages.orchestration.context import current_progress, open_services
from stages.orchestration.envcall import evaluate_suite_in, placed
from stages.pipeline.config import ResolvedPipeline
from stages.policies.local import load_actor

if TYPE_CHECKING:
    from stages.storage.store import ArtifactStore

log = logging.getLogger(__name__)


class RegressionDetected(PhysaiError):
    """The champion regressed on at least one scene of its frozen suite."""

    exit_code = 3
    markdown: str = ""
    """The nightly report, when there is one."""


class NightlyReport(FrozenModel):
    """One nightly regression run of the champion."""

    model: str
    version: str
    alias: str
    policy_digest: str
    baseline_report: str
    suite: str
    suite_digest: str
    seed_offset: int
    scenes: tuple[SceneResult, ...]
    comparison: SuiteComparison
    regressed: bool
    mlflow_run_id: str


def run_nightly(
    pipeline: ResolvedPipeline,
    *,
    alias: str = "champion",
    seed_offset: int = 0,
    settings: Settings | None = None,
) -> NightlyReport:
    """Evaluate ``@alias`` of the pipeline's model on its suite and compare with its baseline.

    ``seed_offset`` shifts every scene's seed (0: the frozen episodes the baseline ran).
    """
    _, store, lineage = open_services(settings)
    cfg = pipeline.config
    model = cfg.promote.model_name
    ref = lineage.find_alias(model, alias)
    if ref is None:
        raise ConfigError.one(pipeline.path, "promote.model_name", model,
                              f"has no @{alias} version to guard")
    policy = store.get(ref.tags.get("physai.policy.digest", ""))
    baseline = store.get(ref.tags.get("physai.sim_report.digest", ""))
    if not isinstance(policy, Policy) or not isinstance(baseline, SimReport):
        raise ConfigError.one(f"models:/{model}/{ref.version}", "physai.policy.digest",
                              policy.digest, "does not point at a policy and a sim report")
    suite = pipeline.suite
    if suite.digest != baseline.suite_digest:
        raise ConfigError.one(pipeline.path, "validate.suite", str(suite.path),
                              f"suite digest {suite.digest[:12]} differs from the one "
                              f"v{ref.version} was validated on ({baseline.suite_digest[:12]})")
    results = nightly_scenes(pipeline, policy, seed_offset, store)
    comparison = compare_scenes(baseline.scenes, results, margin=cfg.promote.regression_margin,
                                alpha=cfg.promote.regression_alpha)
    run = lineage.start_run(f"{cfg.name}-nightly", f"nightly {model} v{ref.version}", {
        "physai.model": f"{model}/{ref.version}", "physai.alias": alias,
        "physai.policy.digest": policy.digest, "physai.sim_report.digest": baseline.digest,
        "physai.suite_digest": suite.digest, "physai.regressed": comparison.regressed,
    })
    run.log_params({"seed_offset": seed_offset, "margin": comparison.margin,
                    "alpha": comparison.alpha, "suite": suite.config.name})
    for s in comparison.scenes:
        run.log_metrics({f"{s.scene}/success_rate": s.challenger_rate,
                         f"{s.scene}/baseline_rate": s.champion_rate,
                         f"{s.scene}/p_adjusted": s.p_adjusted})
    report = NightlyReport(
        model=model, version=ref.version, alias=alias, policy_digest=policy.digest,
        baseline_report=baseline.digest, suite=suite.config.name, suite_digest=suite.digest,
        seed_offset=seed_offset, scenes=tuple(results), comparison=comparison,
        regressed=comparison.regressed, mlflow_run_id=run.run_id,
    )
    run.log_dict(report.model_dump(mode="json"), "nightly_report.json")
    run.recorder.call("log_text", run.run_id, nightly_markdown(report), "nightly_report.md")
    run.flush()
    lineage.end_run(run.run_id, "FAILED" if report.regressed else "FINISHED")
    log.info("nightly %s v%s: %s", model, ref.version,
             "REGRESSED" if report.regressed else "no regression")
    return report


def _suite_environment(pipeline: ResolvedPipeline, policy: Policy, seed_offset: int,
                       store: ArtifactStore) -> str | None:
    """The stage environment the pipeline's suite runs in (:func:`scene_environment`)."""
    return scene_environment(pipeline.config.validate_, pipeline.suite.config.backend)


@placed(_suite_environment, evaluate_suite_in)
def nightly_scenes(pipeline: ResolvedPipeline, policy: Policy, seed_offset: int,
                   store: ArtifactStore) -> tuple[SceneResult, ...]:
    """``policy`` (its payload in ``store``) over every scene of the pipeline's suite, each
    seed shifted by ``seed_offset``, in the suite's stage environment when it has one; one
    result per scene."""
    act = load_actor(store.open_payload(policy))
    return evaluate_suite(pipeline.suite, act, seed_offset=seed_offset,
                          progress=current_progress(), label="nightly",
                          device=pipeline.config.validate_.device,
                          chunk=pipeline.config.validate_.chunk)


def nightly_rows(report: NightlyReport) -> list[dict[str, object]]:
    """One row per scene: baseline and tonight's counts, difference, p-value, verdict."""
    return [
        {"scene": s.scene,
         "baseline": f"{s.champion_successes}/{s.champion_episodes}",
         "tonight": f"{s.challenger_successes}/{s.challenger_episodes}",
         "difference": round(s.difference, 3),
         "95% CI": f"[{s.difference_ci_low:+.3f}, {s.difference_ci_high:+.3f}]",
         "p (Holm)": round(s.p_adjusted, 4),
         "verdict": "REGRESSED" if s.regressed else "ok"}
        for s in report.comparison.scenes
    ]


def nightly_markdown(report: NightlyReport) -> str:
    """The report as markdown: verdict, what was run, the per-scene table, the reasons."""
    verdict = ("**REGRESSED**: " + ", ".join(s.scene for s in report.comparison.scenes
                                             if s.regressed)
               if report.regressed else "**No regression**")
    rows = nightly_rows(report)
    head = list(rows[0]) if rows else []
    lines = [
        f"# Nightly sim regression: models:/{report.model}@{report.alias} (v{report.version})",
        "",
        verdict,
        "",
        f"Suite `{report.suite}` ({report.suite_digest[:12]}), seed offset {report.seed_offset}, "
        f"baseline report `{report.baseline_report[:12]}`, policy `{report.policy_digest[:12]}`;"
        f" margin {report.comparison.margin:g}, alpha {report.comparison.alpha:g} "
        f"({report.comparison.method}).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows),
    ]
    if report.comparison.reasons:
        lines += ["", *(f"- {reason}" for reason in report.comparison.reasons)]
    return "\n".join(lines) + "\n"

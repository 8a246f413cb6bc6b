"""The promote stage: register the model version and move the alias only when every gate passes."""

from __future__ import annotations

import logging
import shutil

from physai_core.errors import ArtifactNotFoundError
from stages.artifacts.records import EdgeBundle, Policy, Promotion, SimReport
from stages.core.crash import crash_point
from stages.evaluation.compare import SuiteComparison, compare_reports
from stages.orchestration.context import StageContext
from stages.sections.models import PromoteConfig
from stages.steps.package import training_dataset
from stages.tracking.aliases import AliasConflict, compare_and_set_alias, registry_lock
from stages.tracking.lineage import artifact_tags
from stages.tracking.mlflow_model import BUNDLE_FILE, policy_model

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
CHALLENGER = "challenger"
"""Alias of the newest registered candidate; ``@champion`` follows only through the gates."""


def lineage_tags(
    policy: Policy, report: SimReport, bundle: EdgeBundle, ctx: StageContext
) -> dict[str, str]:
    """Model-version tags that point to every artifact and run the version came from."""
    dataset = training_dataset(policy, ctx)
    upstream: dict[str, str] = {"physai.training": policy.algorithm}
    if dataset is not None:
        upstream |= {**artifact_tags("dataset", dataset),
                     "physai.collect_run_id": str(dataset.mlflow_run_id)}
        if dataset.parents:
            teacher = ctx.store.get(dataset.parents[0])
            upstream |= {**artifact_tags("teacher", teacher),
                         "physai.teacher_run_id": str(teacher.mlflow_run_id)}
    if policy.attempts:
        upstream["physai.train_attempts"] = ",".join(policy.attempts)
    if policy.algorithm == "import" and policy.mlflow_run_id:
        train_tags = ctx.lineage.run_info(policy.mlflow_run_id)[1]
        upstream |= {k: v for k, v in train_tags.items() if k.startswith("physai.source.")}
    return {
        **artifact_tags("policy", policy),
        **upstream,
        **artifact_tags("sim_report", report),
        **artifact_tags("bundle", bundle),
        "physai.suite_digest": report.suite_digest,
        "physai.train_run_id": str(policy.mlflow_run_id),
        "physai.validate_run_id": str(report.mlflow_run_id),
        "physai.package_run_id": str(bundle.mlflow_run_id),
        "physai.pipeline_run_id": ctx.pipeline_run_id,
        "physai.code_revision": policy.producer.code_revision,
        "physai.gates_passed": str(report.passed and bundle.passed).lower(),
    }


def registered_version(
    ctx: StageContext, model_name: str, bundle: EdgeBundle, report: SimReport
) -> str | None:
    """The version already registering this bundle with this validation report (a run that
    died after registering, or a concurrent one that got there first), or None."""
    query = (f"name = '{model_name}' and tags.`physai.bundle.digest` = '{bundle.digest}' "
             f"and tags.`physai.sim_report.digest` = '{report.digest}'")
    found = ctx.lineage.call("search_model_versions", query)
    versions = sorted(int(v.version) for v in found)
    return str(versions[0]) if versions else None


def failed_gates(report: SimReport, bundle: EdgeBundle) -> tuple[str, ...]:
    """Names and values of every gate that did not pass."""
    return tuple(
        f"{g.name}: {g.measured:.4g} vs {g.threshold:.4g}"
        for g in (*report.gates, *bundle.gates)
        if not g.passed
    )


def against_champion(
    cfg: PromoteConfig, report: SimReport, ctx: StageContext
) -> tuple[str | None, SuiteComparison | None, str]:
    """Compare ``report`` with the current champion's on the same frozen suite.

    Returns (champion version or None, the comparison or None, a one-line outcome).
    """
    champion = ctx.lineage.find_alias(cfg.model_name, cfg.alias)
    if champion is None:
        return None, None, f"no @{cfg.alias} yet"
    digest = champion.tags.get("physai.sim_report.digest", "")
    try:
        old = ctx.store.get(digest)
    except ArtifactNotFoundError:
        return champion.version, None, (
            f"v{champion.version}'s sim report {digest[:12] or '(none)'} is not in this store; "
            "not compared")
    if not isinstance(old, SimReport) or old.suite_digest != report.suite_digest:
        return champion.version, None, (
            f"v{champion.version} was validated on another suite revision; not compared")
    comparison = compare_reports(old, report, margin=cfg.regression_margin,
                                 alpha=cfg.regression_alpha)
    verdict = "regressed" if comparison.regressed else "not worse"
    return champion.version, comparison, (
        f"{verdict} than v{champion.version} (margin {cfg.regression_margin}, "
        f"alpha {cfg.regression_alpha})")


def promote(
    cfg: PromoteConfig, policy: Policy, report: SimReport, bundle: EdgeBundle, ctx: StageContext
) -> Promotion:
    """Register the bundle as an MLflow model (ONNX flavor, bundle files beside it, gate table
    as description, per-scene rates as metrics; stages/tracking/mlflow_model.py) with lineage tags
    as ``@challenger``; move ``@alias`` to it if no gate failed, as a compare-and-set against the
    champion it was compared with (a champion that moved meanwhile leaves the alias alone,
    with the reason)."""
    from edge.bundle import unpack_bundle

    previous, comparison, outcome = against_champion(cfg, report, ctx)
    reasons = failed_gates(report, bundle)
    if comparison is not None and comparison.regressed:
        reasons += tuple(f"regression vs v{previous}: {r}" for r in comparison.reasons)
    if cfg.require_engine_report:
        from stages.tracking.engine_record import engine_report_problem

        waiting = engine_report_problem(ctx.lineage, bundle.digest)
        reasons += (waiting,) if waiting else ()
    work = ctx.scratch / f"promote-{bundle.digest[:16]}"
    shutil.rmtree(work, ignore_errors=True)
    with ctx.lineage.stage_run(ctx.experiment, "promote", ctx.pipeline_run_id, {}) as run:
        payload = ctx.store.open_payload(bundle)
        work.mkdir(parents=True)
        unpack_bundle(payload, work / "bundle")
        shutil.copyfile(payload, work / BUNDLE_FILE)
        model = policy_model(work / "bundle", work / BUNDLE_FILE, report, bundle)
        tags = lineage_tags(policy, report, bundle, ctx)
        if cfg.require_engine_report:
            tags["physai.engine.required"] = "true"
        with registry_lock(ctx.lineage, cfg.model_name) as lock:
            version = registered_version(ctx, cfg.model_name, bundle, report)
            if version is None:
                lock.check()
                version = ctx.lineage.register_policy(cfg.model_name, model, run.run_id, tags)
            else:
                log.info("%s v%s already registers bundle %s; not registering it again",
                         cfg.model_name, version, bundle.digest[:12])
        ctx.lineage.set_alias(cfg.model_name, CHALLENGER, version)
        crash_point("promote.challenger_set")
        if not reasons and version != previous:
            try:
                compare_and_set_alias(ctx.lineage, cfg.model_name, cfg.alias, previous, version,
                                      why=f"every gate passed; {outcome}")
            except AliasConflict as exc:
                reasons = (str(exc),)
        if comparison is not None:
            run.log_dict(comparison.model_dump(mode="json"), "champion_comparison.json")
        run.set_tags({"physai.model": f"{cfg.model_name}/{version}",
                      "physai.promoted": not reasons, "physai.comparison": outcome, **tags})
    shutil.rmtree(work, ignore_errors=True)
    if reasons:
        log.warning("%s v%s registered, @%s not moved: %s", cfg.model_name, version, cfg.alias,
                    "; ".join(reasons))
    else:
        log.info("%s v%s is now @%s", cfg.model_name, version, cfg.alias)
    return Promotion(
        model_name=cfg.model_name,
        version=version,
        alias=cfg.alias,
        promoted=not reasons,
        reasons=reasons,
        mlflow_run_id=run.run_id,
        previous=previous,
        comparison=outcome,
    )

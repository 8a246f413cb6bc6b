"""Pipeline-level pieces shared by the Prefect flow and direct calls: run bookkeeping, cache keys,
the summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from physai_core.errors import ArtifactNotFoundError, ConfigError
from stages.artifacts.records import (
    ArtifactBase,
    Dataset,
    EdgeBundle,
    Policy,
    Promotion,
    SceneResult,
    SimReport,
)
from stages.core.crash import crash_point
from stages.core.hashing import sha256_json
from stages.core.schema import FrozenModel
from stages.evaluation.gates import sequential_threshold
from stages.orchestration.context import Progress, StageContext
from stages.orchestration.envcall import collect_in, placed, train_in
from stages.orchestration.stage_table import STAGES, stage_def
from stages.pipeline.config import ResolvedPipeline, scene_digest
from stages.pipeline.launch import run_under_torchrun
from stages.pipeline.session import stage_context, start_pipeline, training_context
from stages.pipeline.stage_algorithm import stage_algorithm
from stages.sections.models import expert_kind
from stages.steps import collect, package, promote, validate
from stages.tracking.lineage import StageRun


def stage_key(stage: str, pipeline: ResolvedPipeline, parents: Sequence[ArtifactBase],
              scenes: Sequence[FrozenModel] = ()) -> str:
    """Cache key of a stage: hash(stage, stage version, its config, its parents' digests and,
    for a stage of per-scene results (validate's suite), those results: a scene run afresh
    gives the suite's verdict afresh).

    PPO is one stage whether a pipeline runs it as ``train`` or as ``teacher``: the same PPO
    config in the same scene gives the same policy, so a teacher reuses a finished PPO run
    of another pipeline (and vice versa).
    """
    kind = stage
    version = stage_def(stage).version
    algorithm = stage_algorithm(pipeline, stage)
    if algorithm is not None and algorithm.shared_cache:
        kind, version = algorithm.name, algorithm.version
    key: dict[str, object] = {
        "stage": kind,
        "version": version,
        "config": pipeline.stage_digest(stage),
        "parents": [p.digest for p in parents],
    }
    if scenes:
        key["scenes"] = [s.model_dump(mode="json") for s in scenes]
    if algorithm is not None and algorithm.cache_inputs_ref is not None:
        section = getattr(pipeline.config, stage_def(stage).section)
        key["inputs"] = algorithm.cache_inputs(section, pipeline.path)
    return f"physai-{kind}-" + sha256_json(key)


def scene_key(pipeline: ResolvedPipeline, policy: ArtifactBase, index: int) -> str:
    """Cache key of one validation scene: the scene's bytes, assets, simulator, episodes, seed,
    how the policy's chunks run (``validate.chunk``) and the policy, so editing one scene
    re-runs only that scene."""
    backend, (scene, episodes, seed) = pipeline.suite.run(index)
    point = pipeline.suite.sweep_point(index)
    cfg = pipeline.config.validate_
    threshold = sequential_threshold(cfg, pipeline.suite, index)
    sequential = {} if threshold is None or cfg.sequential is None else {
        "sequential": {**cfg.sequential.model_dump(mode="json"), "threshold": threshold}}
    return "physai-validate-scene-" + sha256_json(
        {
            **({"sweep": point} if point is not None else {}),
            **sequential,
            "version": validate.STAGE_VERSION,
            "scene": scene_digest(scene.path, pipeline.task.asset_files,
                                  backend),
            "episodes": episodes,
            "seed": seed,
            "chunk": cfg.chunk.how() if cfg.chunk is not None else None,
            "policy": policy.digest,
        }
    )


@dataclass(frozen=True)
class PipelineResult:
    """Everything one pipeline run produced: each stage's result by the role the stage table
    gives it (:attr:`stages.orchestration.stage_table.StageDef.output`)."""

    run_id: str
    run_url: str
    outputs: Mapping[str, Any]
    """Role -> what the stage of that role returned (``teacher``, ``dataset``, ``policy``,
    ``report``, ``bundle``, ``promotion``); roles of stages the pipeline skips are absent or
    None."""
    cached: tuple[str, ...] = ()

    @property
    def teacher(self) -> Policy | None:
        """The teacher policy collect rolled out (the teacher stage's, or a stored expert)."""
        return self._role("teacher", Policy, optional=True)

    @property
    def dataset(self) -> Dataset | None:
        """The collected dataset (None when the pipeline trains without one)."""
        return self._role("dataset", Dataset, optional=True)

    @property
    def policy(self) -> Policy:
        """The trained policy."""
        return self._role("policy", Policy)

    @property
    def report(self) -> SimReport:
        """The validation report."""
        return self._role("report", SimReport)

    @property
    def bundle(self) -> EdgeBundle:
        """The edge bundle."""
        return self._role("bundle", EdgeBundle)

    @property
    def promotion(self) -> Promotion:
        """The promotion decision."""
        return self._role("promotion", Promotion)

    def _role(self, role: str, cls: type[Any], optional: bool = False) -> Any:
        value = self.outputs.get(role)
        if value is None and optional:
            return None
        if not isinstance(value, cls):
            raise KeyError(f"pipeline run {self.run_id} has no {role} ({cls.__name__})")
        return value

    @property
    def artifacts(self) -> tuple[ArtifactBase, ...]:
        """Every artifact of the run, in stage order (absent stages left out)."""
        found = (self.outputs.get(s.output) for s in STAGES)
        return tuple(a for a in found if isinstance(a, ArtifactBase))


def resolve_expert(pipeline: ResolvedPipeline, ctx: StageContext) -> Policy | None:
    """The policy that ``collect.expert`` names in the registry or the store, or None for the
    scripted expert, for Python code and for the pipeline's own teacher stage (passed in by
    the caller)."""
    cfg = pipeline.config.collect
    if cfg is None or expert_kind(cfg.expert) in ("scripted", "teacher", "python"):
        return None
    digest = cfg.expert
    if expert_kind(cfg.expert) == "registry":
        model = ctx.lineage.resolve_model(cfg.expert)
        digest = model.tags.get("physai.policy.digest", "")
    try:
        policy = ctx.store.get(digest)
    except ArtifactNotFoundError as exc:
        raise ConfigError.one(pipeline.path, "collect.expert", cfg.expert, str(exc)) from None
    if not isinstance(policy, Policy):
        raise ConfigError.one(pipeline.path, "collect.expert", cfg.expert,
                              f"{digest} is a {policy.kind}, not a policy")
    if policy.task != pipeline.config.task:
        raise ConfigError.one(pipeline.path, "collect.expert", cfg.expert,
                              f"the policy is for task {policy.task}, not {pipeline.config.task}")
    return policy


def _collect_environment(pipeline: ResolvedPipeline, ctx: StageContext,
                         teacher: Policy | None) -> str | None:
    """The stage environment collect records in: the task's own (a benchmark's Gymnasium
    task, an Isaac Lab task), else any; an imported source is read here."""
    cfg = pipeline.config.collect
    if cfg is None or cfg.source is not None:
        return None
    return pipeline.task.environment


@placed(_collect_environment, collect_in)
def run_collect(pipeline: ResolvedPipeline, ctx: StageContext, teacher: Policy | None) -> Dataset:
    """The collect stage: demonstrations from the scripted expert, Python code or ``teacher``,
    or a dataset imported from ``collect.source``; recorded in the task's stage environment
    when it has one (:func:`_collect_environment`)."""
    cfg = pipeline.config.collect
    if cfg is None:
        raise KeyError(f"pipeline {pipeline.config.name} has no collect stage")
    return collect.collect(cfg, ctx, task=pipeline.task, scene=pipeline.collect_scene,
                           scene_digest=pipeline.collect_scene_digest,
                           source_digest=pipeline.collect_source_digest, teacher=teacher)


def run_validate(
    pipeline: ResolvedPipeline, ctx: StageContext, policy: Policy,
    scenes: Sequence[SceneResult] | None = None,
) -> SimReport:
    """The validate stage: every suite scene (unless the orchestration ran them one by one and
    passes their ``scenes``), then the gated report."""
    cfg = pipeline.config.validate_
    if scenes is None:
        return validate.validate(cfg, policy, ctx, pipeline.suite)
    return validate.assemble_report(cfg, policy, tuple(scenes), ctx, pipeline.suite)


def run_package(
    pipeline: ResolvedPipeline, ctx: StageContext, policy: Policy, report: SimReport,
) -> EdgeBundle:
    """The package stage: ONNX export, parity, latency and the edge bundle."""
    return package.package(pipeline.config.package, policy, report, ctx,
                           parity_scene=parity_scene(pipeline),
                           model_name=pipeline.config.promote.model_name)


def parity_scene(pipeline: ResolvedPipeline) -> package.ParityScene:
    """Where the package stage rolls a policy with no dataset out: the first scene of the
    pipeline's suite, with its validate section's chunking."""
    scene, _, seed = pipeline.suite.scenes[0]
    return package.ParityScene(pipeline.suite.config.backend, scene, seed,
                               pipeline.config.validate_)


def run_promote(
    pipeline: ResolvedPipeline, ctx: StageContext, policy: Policy, report: SimReport,
    bundle: EdgeBundle,
) -> Promotion:
    """The promote stage: register the version, move the alias when every gate passes."""
    return promote.promote(pipeline.config.promote, policy, report, bundle, ctx)


def run_teacher(pipeline: ResolvedPipeline, ctx: StageContext) -> Policy:
    """The teacher stage: PPO in the teacher scene."""
    return run_algorithm(pipeline, ctx, "teacher", None)


def run_train(pipeline: ResolvedPipeline, ctx: StageContext, dataset: Dataset | None) -> Policy:
    """The train stage: the algorithm its section names (behaviour cloning of ``dataset``, PPO
    in the train scene, or a plugin's)."""
    return run_algorithm(pipeline, ctx, "train", dataset)


def _training_environment(pipeline: ResolvedPipeline, ctx: StageContext, stage: str,
                          dataset: Dataset | None) -> str | None:
    """The stage environment training runs in: the task's own (Isaac Lab's tasks), else any."""
    return pipeline.task.environment


@placed(_training_environment, train_in)
def run_algorithm(pipeline: ResolvedPipeline, ctx: StageContext, stage: str,
                  dataset: Dataset | None) -> Policy:
    """Run training stage ``stage`` (``train`` or ``teacher``) on ``dataset``, in the task's
    stage environment when it has one (:func:`_training_environment`); there in one process,
    or under torchrun when the stage asks for several. The algorithm is given a
    :class:`~stages.training.algorithms.TrainingContext`: the run's context with the task and
    the scenes it trains on."""
    cfg = getattr(pipeline.config, stage_def(stage).section)
    algorithm = stage_algorithm(pipeline, stage)
    if cfg is None or algorithm is None:
        raise KeyError(f"pipeline {pipeline.config.name} has no {stage} stage")
    if algorithm.distributed and cfg.resources.nproc_per_node * cfg.resources.nodes > 1:
        return run_under_torchrun(ctx, stage, cfg.resources)
    return algorithm.train(cfg, training_context(pipeline, ctx, stage), stage, dataset)


def finish_pipeline(
    ctx: StageContext, outputs: Mapping[str, Any], cached: Sequence[str] = (),
) -> str:
    """Tag and end the parent run with the digest of every stage's result (``outputs`` by
    role); returns the run's MLflow URL."""
    result = PipelineResult(ctx.pipeline_run_id, "", outputs)
    teacher, promotion = result.teacher, result.promotion
    tags = {f"physai.{a.kind}.digest": a.digest for a in result.artifacts if a is not teacher}
    if teacher is not None:
        tags["physai.teacher.digest"] = teacher.digest
    tags["physai.model"] = f"{promotion.model_name}/{promotion.version}"
    tags["physai.promoted"] = str(promotion.promoted).lower()
    tags["physai.cached_stages"] = ",".join(cached) or "none"
    StageRun(ctx.lineage, ctx.pipeline_run_id).set_tags(tags)
    crash_point("pipeline.finishing")
    ctx.lineage.end_run(ctx.pipeline_run_id)
    return ctx.lineage.run_url(ctx.pipeline_run_id)


def run_direct(pipeline: ResolvedPipeline, progress: Progress) -> PipelineResult:
    """Run every stage in this process without Prefect and without caching."""
    run_id = start_pipeline(pipeline)
    ctx = stage_context(pipeline, run_id, progress)
    done: dict[str, Any] = {"teacher": resolve_expert(pipeline, ctx)}
    for stage in STAGES:
        if stage.name in pipeline.stages:
            done[stage.output] = stage.run(pipeline, ctx,
                                           *(done.get(role) for role in stage.inputs))
    url = finish_pipeline(ctx, done)
    return PipelineResult(run_id, url, done)


def summary_markdown(result: PipelineResult) -> str:
    """A markdown summary of one pipeline run: scenes, gates, latency, model version."""
    r, b, p = result.report, result.bundle, result.promotion
    lines = [
        f"# Pipeline run `{result.run_id}`",
        "",
        f"MLflow run: {result.run_url}",
        "",
        "| scene | episodes | success | 95% CI | mean return | gate |",
        "|---|---|---|---|---|---|",
    ]
    gates = {g.name: g for g in r.gates}
    for s in r.scenes:
        g = gates.get(f"success/{s.scene}")
        verdict = "pass" if g is not None and g.passed else "FAIL"
        lines.append(
            f"| {s.scene} | {s.episodes} | {s.success_rate:.3f} | "
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}] | {s.mean_return:.2f} | {verdict} |"
        )
    lines += [
        "",
        f"- latency (ONNX Runtime, CPU, batch 1): p50 {b.latency_p50_us:.1f} us, "
        f"p99 {b.latency_p99_us:.1f} us",
        f"- ONNX parity max |diff|: {b.parity_max_abs_diff:.2e}",
        f"- model: `models:/{p.model_name}/{p.version}`"
        + (f" is now `@{p.alias}`" if p.promoted else f", `@{p.alias}` not moved"),
    ]
    lines += [f"  - not promoted: {reason}" for reason in p.reasons]
    lines.append(f"- against the champion: {p.comparison}")
    if result.cached:
        lines.append(f"- cached stages: {', '.join(result.cached)}")
    lines += ["", "| artifact | digest |", "|---|---|"]
    names = {id(result.teacher): "teacher policy"}
    lines += [f"| {names.get(id(a), a.kind)} | `{a.digest}` |" for a in result.artifacts]
    return "\n".join(lines) + "\n"

"""The one table of pipeline stages: name, computer, inputs, result type, version and runner.

The Prefect flow, scale-out dispatch, the work pools, deployments and cache keys all read this
table; nothing else lists stage names. Runners and versions are named as ``module:attribute``
and imported on use, so reading the table (and loading a config) imports no stage module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from physai_core.errors import UnknownNameError
from physai_core.plugins import resolve_ref

if TYPE_CHECKING:
    from stages.orchestration.context import StageContext

Computer = Literal["dgx", "ovx", "jetson"]
"""The three computers: training (dgx), simulation (ovx), robot (jetson)."""

COMPUTERS: tuple[Computer, ...] = ("dgx", "ovx", "jetson")
"""Every computer, in the order a pipeline first uses them."""


@dataclass(frozen=True)
class EnvEntry:
    """A step that may run in a stage environment's interpreter (:mod:`stages.pipeline.envrun`)."""

    name: str
    """Its name, as ``python -m stages.pipeline.envrun --stage`` takes it."""
    runner_ref: str
    """``module:function`` that runs it there: ``runner(config, run_id, request)`` returns the
    result record as JSON (``config`` is the pipeline's file, or the step's own input file)."""
    needs_run_id: bool = True
    """Whether it records into the pipeline's MLflow run (then ``--run-id`` is required)."""

    def run(self, config: str, run_id: str | None, request: dict[str, Any]) -> str:
        """Run the step in this process; its result record (JSON)."""
        runner = resolve_ref(self.runner_ref, what=f"stage environment step {self.name!r}")
        body: str = runner(config, run_id, request)
        return body


@dataclass(frozen=True)
class StageDef:
    """One stage of the pipeline and everything the orchestration needs to know about it."""

    name: str
    """Stage name, as flows, caches, MLflow child runs and crash points call it."""
    computer: Computer
    """The computer whose work pool runs it."""
    inputs: tuple[str, ...]
    """Roles of the upstream artifacts it takes, in call order (``dataset``, ``policy``, ...)."""
    output: str
    """The role of what it returns, as later stages' ``inputs`` name it."""
    result: str
    """``module:Class`` of the record it returns (an artifact, or the promotion)."""
    section: str
    """Attribute of :class:`~stages.pipeline.config.PipelineConfig` holding its config; a pipeline
    runs the stage only when that attribute is set."""
    scenes: str | None
    """Attribute of :class:`~stages.pipeline.config.ResolvedPipeline` holding the digest of the
    scenes it runs (None: it runs none); part of its cache key."""
    version_ref: str
    """``module:NAME`` of its version string; bumping it invalidates cached results."""
    runner_ref: str
    """``module:function`` that runs it: ``runner(pipeline, ctx, *inputs)``."""
    per_scene: bool = False
    """Whether orchestration fans it out per suite scene before assembling the result."""
    env: tuple[EnvEntry, ...] = ()
    """Its steps that may run in a stage environment of their own (training whose simulator
    lives there, one validation scene, the package stage's rollout observations)."""

    @property
    def version(self) -> str:
        """The stage's version string."""
        return str(resolve_ref(self.version_ref, what=f"stage {self.name!r} version"))

    @property
    def result_type(self) -> type[Any]:
        """The pydantic class of its result."""
        cls: type[Any] = resolve_ref(self.result, what=f"stage {self.name!r} result")
        return cls

    def run(self, pipeline: object, ctx: StageContext, *inputs: Any) -> Any:
        """Run the stage in this process on ``inputs`` (one per role of :attr:`inputs`): its
        runner takes the resolved ``pipeline`` (what the stage is given of it is the runner's
        choice), the run's context and the inputs."""
        return resolve_ref(self.runner_ref, what=f"stage {self.name!r} runner")(
            pipeline, ctx, *inputs)


_ENV_TRAIN = EnvEntry("train", "stages.pipeline.envrun:train_here")

STAGES: tuple[StageDef, ...] = (
    StageDef("teacher", "dgx", (), "teacher", "stages.artifacts.records:Policy", "teacher",
             "teacher_scene_digest", "stages.training.ppo:STAGE_VERSION",
             "stages.pipeline.run:run_teacher", env=(_ENV_TRAIN,)),
    StageDef("collect", "dgx", ("teacher",), "dataset", "stages.artifacts.records:Dataset",
             "collect", "collect_digest", "stages.steps.collect:STAGE_VERSION",
             "stages.pipeline.run:run_collect",
             env=(EnvEntry("collect", "stages.pipeline.envrun:collect_here"),)),
    StageDef("train", "dgx", ("dataset",), "policy", "stages.artifacts.records:Policy", "train",
             "train_scene_digest", "stages.steps.train:STAGE_VERSION",
             "stages.pipeline.run:run_train", env=(_ENV_TRAIN,)),
    StageDef("validate", "ovx", ("policy",), "report", "stages.artifacts.records:SimReport",
             "validate_", "suite_digest", "stages.steps.validate:STAGE_VERSION",
             "stages.pipeline.run:run_validate", per_scene=True,
             env=(EnvEntry("validate-scene", "stages.pipeline.envrun:validate_scene_here"),)),
    StageDef("package", "jetson", ("policy", "report"), "bundle",
             "stages.artifacts.records:EdgeBundle", "package", None,
             "stages.steps.package:STAGE_VERSION", "stages.pipeline.run:run_package",
             env=(EnvEntry("rollout-observations",
                           "stages.pipeline.envrun:rollout_observations_here"),)),
    StageDef("promote", "ovx", ("policy", "report", "bundle"), "promotion",
             "stages.artifacts.records:Promotion", "promote", None,
             "stages.steps.promote:STAGE_VERSION", "stages.pipeline.run:run_promote"),
)
"""Every stage, in pipeline order."""



def stage_def(name: str) -> StageDef:
    """The stage ``name``; an unknown one lists the valid names."""
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise UnknownNameError("stage", name, [s.name for s in STAGES])


def stages_on(computer: str) -> tuple[StageDef, ...]:
    """The stages that run on ``computer``, in pipeline order."""
    return tuple(s for s in STAGES if s.computer == computer)


ENV_COMMANDS: tuple[EnvEntry, ...] = (
    EnvEntry("evaluate-suite", "stages.pipeline.envrun:evaluate_suite_here", needs_run_id=False),
    EnvEntry("validate-suite", "stages.pipeline.envrun:validate_suite_here", needs_run_id=False),
)
"""Steps outside the pipeline's stages that may run in a stage environment: a whole suite as
the nightly regression evaluates it, and a suite file as ``flows validate`` and ``flows
compare`` evaluate it (its config is then the suite)."""


def env_entries() -> dict[str, EnvEntry]:
    """Every step that may run in a stage environment, by name: the stages' own
    (:attr:`StageDef.env`, in pipeline order), then :data:`ENV_COMMANDS`."""
    found: dict[str, EnvEntry] = {}
    for entry in (*(e for s in STAGES for e in s.env), *ENV_COMMANDS):
        if found.setdefault(entry.name, entry) != entry:
            raise ValueError(f"stage environment step {entry.name!r} is declared twice, "
                             "differently")
    return found

"""What a training algorithm is given beside its section and the dataset: the run's context and
what it trains on.

An algorithm keeps the signature plugins write (``train(cfg, ctx, stage, dataset)``,
docs/extending.md); its ``ctx`` is a :class:`TrainingContext`, the run's
:class:`~stages.orchestration.context.StageContext` with the task, the stage's scene and the
collect section's scene (DAgger records there), typed, which the pipeline layer fills in
(:func:`stages.pipeline.session.training_context`). An algorithm reads no pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from stages.orchestration.context import StageContext

if TYPE_CHECKING:
    from stages.sections.models import CollectConfig
    from stages.sim.scenes.scene import Scene
    from stages.sim.tasks.catalog import TaskSpec


@dataclass(frozen=True, kw_only=True)
class TrainingContext(StageContext):
    """A training stage's context: the run's services and what the stage trains on."""

    task: TaskSpec
    """The pipeline's task."""
    scene: Scene | None = None
    """The scene this stage trains in (PPO's ``train.scene`` or ``teacher.scene``), if any."""
    scene_digest: str | None = None
    """That scene's digest (its file and assets), recorded on the policy."""
    collect: CollectConfig | None = None
    """The pipeline's collect section, which DAgger's rounds record as."""
    collect_scene: Scene | None = None
    """The collect scene, where DAgger's rounds are recorded."""
    collect_scene_digest: str | None = None
    """Its digest."""

    @classmethod
    def of(cls, ctx: StageContext, *, task: TaskSpec, scene: Scene | None = None,
           scene_digest: str | None = None, collect: CollectConfig | None = None,
           collect_scene: Scene | None = None,
           collect_scene_digest: str | None = None) -> TrainingContext:
        """``ctx`` with what a training stage works on."""
        shared = {f.name: getattr(ctx, f.name) for f in fields(StageContext)}
        return cls(**shared, task=task, scene=scene, scene_digest=scene_digest,
                   collect=collect, collect_scene=collect_scene,
                   collect_scene_digest=collect_scene_digest)

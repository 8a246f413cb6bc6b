"""Which registered training algorithm a stage of a pipeline runs.

Read by the pipeline (:mod:`stages.pipeline.run`: cache keys, where training runs), by every
torchrun rank (:mod:`stages.pipeline.launch`) and by ``flows check``; it sits below them all, so the
pipeline can start torchrun and a rank can look up its algorithm without an import circle.
"""

from __future__ import annotations

from stages.orchestration.stage_table import stage_def
from stages.pipeline.config import ResolvedPipeline
from stages.training.algorithms import AlgorithmSpec, get_algorithm


def stage_algorithm(pipeline: ResolvedPipeline, stage: str) -> AlgorithmSpec | None:
    """The training algorithm ``stage`` runs, or None when its section names none."""
    name = getattr(getattr(pipeline.config, stage_def(stage).section), "algorithm", None)
    return get_algorithm(name) if isinstance(name, str) else None

"""Which registered training algorithm a stage of a pipeline runs.

Read by the pipeline (:mod:`stages.pipeline`: cache keys, where training runs), by every
torchrun rank (:mod:`stages.launch`) and by ``flows check``; it sits below them all, so the
pipeline can start torchrun and a rank can look up its algorithm without an import circle.
"""

from __future__ import annotations

from stages.algorithms import AlgorithmSpec, get_algorithm
from stages.config import ResolvedPipeline
from stages.stage_table import stage_def


def stage_algorithm(pipeline: ResolvedPipeline, stage: str) -> AlgorithmSpec | None:
    """The training algorithm ``stage`` runs, or None when its section names none."""
    name = getattr(getattr(pipeline.config, stage_def(stage).section), "algorithm", None)
    return get_algorithm(name) if isinstance(name, str) else None

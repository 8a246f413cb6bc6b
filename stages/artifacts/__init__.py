"""The typed records every stage produces (:mod:`stages.artifacts.records`): dataset,
policy, report, bundle, promotion, each with its digest, location, producer and parents.
Imports :mod:`stages.core` only.

This package is also ``stages.artifacts``, the promised path of
:mod:`stages.artifacts.records` that stored Prefect results name the records by
(``stages.artifacts.Policy``...): it names them, and nothing inside the project imports them
from here.
"""

from __future__ import annotations

from stages.artifacts.records import (
    ARTIFACT_ADAPTER as ARTIFACT_ADAPTER,
)
from stages.artifacts.records import (
    Artifact as Artifact,
)
from stages.artifacts.records import (
    ArtifactBase as ArtifactBase,
)
from stages.artifacts.records import (
    Checkpoint as Checkpoint,
)
from stages.artifacts.records import (
    CriticVerdict as CriticVerdict,
)
from stages.artifacts.records import (
    Dataset as Dataset,
)
from stages.artifacts.records import (
    EdgeBundle as EdgeBundle,
)
from stages.artifacts.records import (
    EpisodeRecords as EpisodeRecords,
)
from stages.artifacts.records import (
    FactorEffect as FactorEffect,
)
from stages.artifacts.records import (
    GateResult as GateResult,
)
from stages.artifacts.records import (
    Policy as Policy,
)
from stages.artifacts.records import (
    Producer as Producer,
)
from stages.artifacts.records import (
    Promotion as Promotion,
)
from stages.artifacts.records import (
    RolloutUsd as RolloutUsd,
)
from stages.artifacts.records import (
    RolloutVideo as RolloutVideo,
)
from stages.artifacts.records import (
    SceneAgreement as SceneAgreement,
)
from stages.artifacts.records import (
    SceneResult as SceneResult,
)
from stages.artifacts.records import (
    SequentialVerdict as SequentialVerdict,
)
from stages.artifacts.records import (
    SimReport as SimReport,
)
from stages.artifacts.records import (
    SimToSim as SimToSim,
)
from stages.artifacts.records import (
    SweepCurve as SweepCurve,
)

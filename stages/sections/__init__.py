"""The config of each pipeline stage, one frozen model per section of the pipeline YAML
(:mod:`stages.sections.models`). Imports :mod:`stages.core` only.

This package is also ``stages.sections``, the promised path of :mod:`stages.sections.models`
that docs/extending.md gives plugins (a plugin's algorithm config derives from
``stages.sections.TrainConfig``): it names the models' public names, and nothing inside the
project imports them from here.
"""

from __future__ import annotations

from stages.sections.models import (
    EXPERT_HELP as EXPERT_HELP,
)
from stages.sections.models import (
    LOOPBACK_HOSTS as LOOPBACK_HOSTS,
)
from stages.sections.models import (
    MAX_CHUNK_SIZE as MAX_CHUNK_SIZE,
)
from stages.sections.models import (
    ChunkConfig as ChunkConfig,
)
from stages.sections.models import (
    CollectConfig as CollectConfig,
)
from stages.sections.models import (
    CriticConfig as CriticConfig,
)
from stages.sections.models import (
    DaggerConfig as DaggerConfig,
)
from stages.sections.models import (
    PackageConfig as PackageConfig,
)
from stages.sections.models import (
    PPOConfig as PPOConfig,
)
from stages.sections.models import (
    PromoteConfig as PromoteConfig,
)
from stages.sections.models import (
    Resources as Resources,
)
from stages.sections.models import (
    SequentialConfig as SequentialConfig,
)
from stages.sections.models import (
    SimToSimConfig as SimToSimConfig,
)
from stages.sections.models import (
    TrainConfig as TrainConfig,
)
from stages.sections.models import (
    ValidateConfig as ValidateConfig,
)
from stages.sections.models import (
    critic_url_problem as critic_url_problem,
)
from stages.sections.models import (
    expert_kind as expert_kind,
)

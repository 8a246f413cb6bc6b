"""``stages.train``: the promised path of :mod:`stages.steps.train`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.steps.train`. Nothing inside the project imports this
module.
"""

from __future__ import annotations

from stages.steps.train import (
    MIN_STD as MIN_STD,
)
from stages.steps.train import (
    STAGE_VERSION as STAGE_VERSION,
)
from stages.steps.train import (
    VAL_CHUNK_BYTES as VAL_CHUNK_BYTES,
)
from stages.steps.train import (
    EpochHook as EpochHook,
)
from stages.steps.train import (
    chunked as chunked,
)
from stages.steps.train import (
    fit as fit,
)
from stages.steps.train import (
    held_out as held_out,
)
from stages.steps.train import (
    new_policy as new_policy,
)
from stages.steps.train import (
    policy_meta as policy_meta,
)
from stages.steps.train import (
    train as train,
)
from stages.steps.train import (
    train_more as train_more,
)
from stages.steps.train import (
    train_stage as train_stage,
)

"""``stages.sim.batched``: the promised path of :mod:`stages.sim.env.batched`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.sim.env.batched`. Nothing inside the project imports this
module.
"""

from __future__ import annotations

from stages.sim.env.batched import (
    CHANNELS as CHANNELS,
)
from stages.sim.env.batched import (
    LOOK_UNITS as LOOK_UNITS,
)
from stages.sim.env.batched import (
    THREADS_ENV as THREADS_ENV,
)
from stages.sim.env.batched import (
    BatchedEnv as BatchedEnv,
)
from stages.sim.env.batched import (
    EpisodeWorlds as EpisodeWorlds,
)
from stages.sim.env.batched import (
    LookDraws as LookDraws,
)
from stages.sim.env.batched import (
    ModelDraws as ModelDraws,
)
from stages.sim.env.batched import (
    RobotEpisodes as RobotEpisodes,
)
from stages.sim.env.batched import (
    default_num_threads as default_num_threads,
)
from stages.sim.env.batched import (
    randomizes_model as randomizes_model,
)
from stages.sim.env.batched import (
    scaled_masses as scaled_masses,
)

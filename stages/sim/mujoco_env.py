"""``stages.sim.mujoco_env``: the promised path of :mod:`stages.sim.env.mujoco_env`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.sim.env.mujoco_env`. Nothing inside the project imports this
module.
"""

from __future__ import annotations

from stages.sim.env.mujoco_env import (
    IMAGE_NOISE_STREAM as IMAGE_NOISE_STREAM,
)
from stages.sim.env.mujoco_env import (
    MujocoBatchedEnv as MujocoBatchedEnv,
)
from stages.sim.env.mujoco_env import (
    WorldLooks as WorldLooks,
)
from stages.sim.env.mujoco_env import (
    release_egl_thread as release_egl_thread,
)
from stages.sim.env.mujoco_env import (
    rotated as rotated,
)
from stages.sim.env.mujoco_env import (
    tilted as tilted,
)

"""``stages.sim.reach_arm``: the promised path of :mod:`stages.sim.tasks.reach_arm`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.sim.tasks.reach_arm`. Nothing inside the project imports
this module.
"""

from __future__ import annotations

from stages.sim.tasks.reach_arm import (
    TARGET_NAMES as TARGET_NAMES,
)
from stages.sim.tasks.reach_arm import (
    TARGET_UNITS as TARGET_UNITS,
)
from stages.sim.tasks.reach_arm import (
    ArmModel as ArmModel,
)
from stages.sim.tasks.reach_arm import (
    ArmState as ArmState,
)
from stages.sim.tasks.reach_arm import (
    ReachArm as ReachArm,
)
from stages.sim.tasks.reach_arm import (
    ReachArmEnv as ReachArmEnv,
)
from stages.sim.tasks.reach_arm import (
    ReachTask as ReachTask,
)
from stages.sim.tasks.reach_arm import (
    dls_joint_step as dls_joint_step,
)
from stages.sim.tasks.reach_arm import (
    reach_action_names as reach_action_names,
)
from stages.sim.tasks.reach_arm import (
    reach_obs_names as reach_obs_names,
)
from stages.sim.tasks.reach_arm import (
    reach_obs_units as reach_obs_units,
)
from stages.sim.tasks.reach_arm import (
    reach_success_tolerance as reach_success_tolerance,
)

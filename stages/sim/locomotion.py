"""``stages.sim.locomotion``: the promised path of :mod:`stages.sim.tasks.locomotion`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.sim.tasks.locomotion`. Nothing inside the project imports
this module.
"""

from __future__ import annotations

from stages.sim.tasks.locomotion import (
    ACTION_NAMES as ACTION_NAMES,
)
from stages.sim.tasks.locomotion import (
    ACTION_RATE_WEIGHT as ACTION_RATE_WEIGHT,
)
from stages.sim.tasks.locomotion import (
    ACTION_SCALE as ACTION_SCALE,
)
from stages.sim.tasks.locomotion import (
    ACTION_UNITS as ACTION_UNITS,
)
from stages.sim.tasks.locomotion import (
    CONTROL_HZ as CONTROL_HZ,
)
from stages.sim.tasks.locomotion import (
    FALL_HEIGHT as FALL_HEIGHT,
)
from stages.sim.tasks.locomotion import (
    FALL_PENALTY as FALL_PENALTY,
)
from stages.sim.tasks.locomotion import (
    FALL_TILT_COS as FALL_TILT_COS,
)
from stages.sim.tasks.locomotion import (
    FOOT_CLEARANCE as FOOT_CLEARANCE,
)
from stages.sim.tasks.locomotion import (
    FOOT_RADIUS as FOOT_RADIUS,
)
from stages.sim.tasks.locomotion import (
    FRAME_SKIP as FRAME_SKIP,
)
from stages.sim.tasks.locomotion import (
    GAIT as GAIT,
)
from stages.sim.tasks.locomotion import (
    GAIT_WEIGHT as GAIT_WEIGHT,
)
from stages.sim.tasks.locomotion import (
    INIT_JOINT_NOISE as INIT_JOINT_NOISE,
)
from stages.sim.tasks.locomotion import (
    JOINTS as JOINTS,
)
from stages.sim.tasks.locomotion import (
    LEG_JOINTS as LEG_JOINTS,
)
from stages.sim.tasks.locomotion import (
    LEGS as LEGS,
)
from stages.sim.tasks.locomotion import (
    NUM_JOINTS as NUM_JOINTS,
)
from stages.sim.tasks.locomotion import (
    OBS_NAMES as OBS_NAMES,
)
from stages.sim.tasks.locomotion import (
    OBS_UNITS as OBS_UNITS,
)
from stages.sim.tasks.locomotion import (
    POWER_WEIGHT as POWER_WEIGHT,
)
from stages.sim.tasks.locomotion import (
    QUADRUPED_XML as QUADRUPED_XML,
)
from stages.sim.tasks.locomotion import (
    SUCCESS_SPEED_ERROR as SUCCESS_SPEED_ERROR,
)
from stages.sim.tasks.locomotion import (
    SUCCESS_TOLERANCE as SUCCESS_TOLERANCE,
)
from stages.sim.tasks.locomotion import (
    TARGET_NAMES as TARGET_NAMES,
)
from stages.sim.tasks.locomotion import (
    TARGET_UNITS as TARGET_UNITS,
)
from stages.sim.tasks.locomotion import (
    TASK_NAME as TASK_NAME,
)
from stages.sim.tasks.locomotion import (
    TRACKING_SIGMA2 as TRACKING_SIGMA2,
)
from stages.sim.tasks.locomotion import (
    TROT_OFFSETS as TROT_OFFSETS,
)
from stages.sim.tasks.locomotion import (
    WORKSPACE_HIGH as WORKSPACE_HIGH,
)
from stages.sim.tasks.locomotion import (
    WORKSPACE_LOW as WORKSPACE_LOW,
)
from stages.sim.tasks.locomotion import (
    YAW_WEIGHT as YAW_WEIGHT,
)
from stages.sim.tasks.locomotion import (
    LocomotionEnv as LocomotionEnv,
)
from stages.sim.tasks.locomotion import (
    LocomotionTask as LocomotionTask,
)
from stages.sim.tasks.locomotion import (
    QuadrupedParams as QuadrupedParams,
)
from stages.sim.tasks.locomotion import (
    QuadrupedState as QuadrupedState,
)
from stages.sim.tasks.locomotion import (
    rotation_matrices as rotation_matrices,
)

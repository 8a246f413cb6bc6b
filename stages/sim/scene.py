"""``stages.sim.scene``: the promised path of :mod:`stages.sim.scenes.scene`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.sim.scenes.scene`. Nothing inside the project imports this
module.
"""

from __future__ import annotations

from stages.sim.scenes.scene import (
    CAMERA_FIELDS as CAMERA_FIELDS,
)
from stages.sim.scenes.scene import (
    LOOK_DEFAULTS as LOOK_DEFAULTS,
)
from stages.sim.scenes.scene import (
    SWEEPABLE as SWEEPABLE,
)
from stages.sim.scenes.scene import (
    BackendName as BackendName,
)
from stages.sim.scenes.scene import (
    Channel as Channel,
)
from stages.sim.scenes.scene import (
    Colour as Colour,
)
from stages.sim.scenes.scene import (
    ColourBox as ColourBox,
)
from stages.sim.scenes.scene import (
    RandomizationConfig as RandomizationConfig,
)
from stages.sim.scenes.scene import (
    RemoteInputsConfig as RemoteInputsConfig,
)
from stages.sim.scenes.scene import (
    Scene as Scene,
)
from stages.sim.scenes.scene import (
    SceneConfig as SceneConfig,
)
from stages.sim.scenes.scene import (
    SuccessConfig as SuccessConfig,
)
from stages.sim.scenes.scene import (
    Suite as Suite,
)
from stages.sim.scenes.scene import (
    SuiteConfig as SuiteConfig,
)
from stages.sim.scenes.scene import (
    SuiteEntry as SuiteEntry,
)
from stages.sim.scenes.scene import (
    SuiteScene as SuiteScene,
)
from stages.sim.scenes.scene import (
    TaskId as TaskId,
)
from stages.sim.scenes.scene import (
    gym_provenance as gym_provenance,
)
from stages.sim.scenes.scene import (
    load_scene as load_scene,
)
from stages.sim.scenes.scene import (
    load_suite as load_suite,
)
from stages.sim.scenes.scene import (
    point_label as point_label,
)
from stages.sim.scenes.scene import (
    scene_provenance as scene_provenance,
)
from stages.sim.scenes.scene import (
    suite_digest as suite_digest,
)
from stages.sim.scenes.scene import (
    sweep_variant as sweep_variant,
)

"""``stages.sim.scene``: the promised path of the scene and suite names plugins use.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.sim.scenes.scene` (scene data) and
:mod:`stages.sim.suites` (suites, loading, digests). Nothing inside the project imports this
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
    Scene as Scene,
)
from stages.sim.scenes.scene import (
    SceneConfig as SceneConfig,
)
from stages.sim.scenes.scene import (
    SuccessConfig as SuccessConfig,
)
from stages.sim.scenes.scene import (
    TaskId as TaskId,
)
from stages.sim.scenes.scene import (
    point_label as point_label,
)
from stages.sim.scenes.scene import (
    sweep_variant as sweep_variant,
)
from stages.sim.suites.digest import (
    gym_provenance as gym_provenance,
)
from stages.sim.suites.digest import (
    scene_provenance as scene_provenance,
)
from stages.sim.suites.digest import (
    suite_digest as suite_digest,
)
from stages.sim.suites.loading import (
    load_scene as load_scene,
)
from stages.sim.suites.loading import (
    load_suite as load_suite,
)
from stages.sim.suites.suite import (
    BackendName as BackendName,
)
from stages.sim.suites.suite import (
    RemoteInputsConfig as RemoteInputsConfig,
)
from stages.sim.suites.suite import (
    Suite as Suite,
)
from stages.sim.suites.suite import (
    SuiteConfig as SuiteConfig,
)
from stages.sim.suites.suite import (
    SuiteEntry as SuiteEntry,
)
from stages.sim.suites.suite import (
    SuiteScene as SuiteScene,
)

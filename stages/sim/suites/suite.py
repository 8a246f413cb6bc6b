"""A suite: the scenes a policy is validated on, with episode counts and fixed seeds.

:class:`SuiteConfig` is the suite file; :class:`Suite` the suite loaded, every scene with it,
and the digest that pins what it measures (:mod:`stages.sim.suites.digest`). Its backends are
checked against the backend registry as the file is read; its task through
:func:`~stages.sim.scenes.scene.tasks_from`, in force while :mod:`stages.sim.suites.loading`
loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NamedTuple

from pydantic import AfterValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from physai_core.errors import UnknownNameError
from stages.core.limits import MAX_WORLDS, at_most, worlds_cost
from stages.core.schema import DocumentedModel
from stages.sim.backends.catalog import get_backend
from stages.sim.scenes.scene import Scene, TaskId, sweep_variant


def _known_backend(name: str) -> str:
    """A backend name the backend registry knows, or a failure listing the valid ones."""
    try:
        get_backend(name)
    except UnknownNameError as exc:
        raise PydanticCustomError("unknown_backend", str(exc)) from None
    return name


BackendName = Annotated[str, AfterValidator(_known_backend)]
"""A registered simulator backend, e.g. ``mujoco``."""


class SuiteEntry(DocumentedModel):
    """One scene of a suite, with how many episodes to run and the seed they start from."""

    scene: str = Field(min_length=1)
    """Path of the scene YAML, relative to the suite file."""
    episodes: int = Field(gt=0)
    """Episodes (count, at most 65,536) to run in this scene; they run as that many worlds at
    once."""
    seed: int = Field(ge=0)
    """Seed of the scene's random generator; fixes every randomization draw."""

    @field_validator("episodes")
    @classmethod
    def _bounded_episodes(cls, value: int) -> int:
        """At most :data:`~stages.core.limits.MAX_WORLDS`: a scene's episodes are its worlds."""
        at_most(value, MAX_WORLDS, f"a scene's episodes run as that many worlds at once; "
                f"{worlds_cost(value)}")
        return value


class RemoteInputsConfig(DocumentedModel):
    """How the suite's observations go to a policy served over OpenPI's websocket protocol
    (``flows validate ws://...``, ``flows compare``; stages/policies/remote.py). Without it the keys
    are the server's own (this project's servers state them), else OpenPI's
    (:func:`stages.policies.wire.default_keys`)."""

    keys: dict[str, str] = Field(default_factory=dict)
    """The message key of a policy input (``obs``, ``<camera>_image``), e.g.
    ``{obs: observation/state, front_image: observation/image}``; over the default keys."""
    prompt: str | None = None
    """The instruction sent beside every observation as ``prompt``, for the scenes that give
    no ``instruction`` of their own (a scene's wins)."""

    @field_validator("keys")
    @classmethod
    def _named(cls, value: dict[str, str]) -> dict[str, str]:
        """Every key is a non-empty message key."""
        empty = sorted(name for name, key in value.items() if not key.strip())
        if empty:
            raise PydanticCustomError("empty_key", "no message key for {inputs}",
                                      {"inputs": ", ".join(empty)})
        return value


class SuiteConfig(DocumentedModel):
    """A frozen list of scenes that a policy is validated on."""

    name: str = Field(min_length=1)
    """Suite name."""
    task: TaskId
    """Registered task id that every scene of the suite must use."""
    backend: BackendName = "mujoco"
    """Registered simulator backend that runs the suite (stages/sim/backends/catalog.py)."""
    compare_backend: BackendName | None = None
    """A second backend that runs every scene too, for a sim-to-sim check: the report shows
    both rates side by side and tests their difference (``validate.sim_to_sim``)."""
    scenes: list[SuiteEntry] = Field(min_length=1)
    """The scenes, each listed once."""
    remote: RemoteInputsConfig | None = None
    """The keys and prompt a policy served over the network is sent the observations with;
    what a policy reads and the suite's digest do not depend on it."""

    @field_validator("scenes")
    @classmethod
    def _unique_scenes(cls, value: list[SuiteEntry]) -> list[SuiteEntry]:
        """A scene file may be listed only once."""
        paths = [entry.scene for entry in value]
        repeated = sorted({p for p in paths if paths.count(p) > 1})
        if repeated:
            raise PydanticCustomError(
                "repeated_scene",
                "scene files listed more than once: {files}",
                {"files": ", ".join(repeated)},
            )
        return value


class SuiteScene(NamedTuple):
    """One resolved entry of a suite: the scene, its episode count and its seed."""

    scene: Scene
    """The loaded scene."""
    episodes: int
    """Episodes (count) to run in the scene."""
    seed: int
    """Seed of the scene's random generator."""


@dataclass(frozen=True)
class Suite:
    """A suite config with every scene loaded, and the digest that pins what it measures."""

    config: SuiteConfig
    """The validated config."""
    path: Path
    """The suite YAML file."""
    scenes: tuple[SuiteScene, ...]
    """The scenes in the order the suite lists them."""
    digest: str
    """Hex sha256 over scene files, asset bytes, episodes, seeds and backend version."""

    @property
    def name(self) -> str:
        """The suite's name."""
        return self.config.name

    @property
    def backends(self) -> tuple[str, ...]:
        """The backend, then the sim-to-sim one when the suite names it."""
        second = self.config.compare_backend
        return (self.config.backend,) if second is None else (self.config.backend, second)

    @property
    def sweeps(self) -> tuple[tuple[int, dict[str, float]], ...]:
        """Every sweep point of the suite: the index of its scene, and the point."""
        return tuple((i, point) for i, s in enumerate(self.scenes)
                     for point in s.scene.config.sweep_points())

    @property
    def runs(self) -> int:
        """Scene validations: every scene on every backend of :attr:`backends`, then every
        sweep point (on the first backend)."""
        return len(self.scenes) * len(self.backends) + len(self.sweeps)

    def run(self, index: int) -> tuple[str, SuiteScene]:
        """Validation ``index`` of :attr:`runs`: the backend, then the scene (every scene on
        the first backend, then every scene on the second, then every sweep point: its
        scene with the swept fields held at the point's values, same episodes and seed)."""
        plain = len(self.scenes) * len(self.backends)
        if index >= plain:
            scene, point = self.sweeps[index - plain]
            entry = self.scenes[scene]
            return self.backends[0], SuiteScene(sweep_variant(entry.scene, point),
                                                entry.episodes, entry.seed)
        backend, scene = divmod(index, len(self.scenes))
        return self.backends[backend], self.scenes[scene]

    def sweep_point(self, index: int) -> dict[str, float] | None:
        """The sweep point validation ``index`` runs, or None for a plain one."""
        plain = len(self.scenes) * len(self.backends)
        return None if index < plain else self.sweeps[index - plain][1]

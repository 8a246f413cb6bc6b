"""The training-algorithm registry: one registration point for what a ``train:`` section names.

An algorithm is a name (``train.algorithm``), the frozen config class of its section, and the
function that trains with it, plus what the pipeline must know to check and cache it: whether
it reads the collected dataset or trains in a scene, whether it runs under torchrun, and whether
its results are shared between the stages that run it (a PPO teacher and a PPO train stage are
one computation). The shipped algorithms are behaviour cloning (``bc``, the default) and PPO
through rsl_rl (``ppo``), ``import``, a policy trained elsewhere brought in untrained
(:mod:`stages.training.imported`, selected by ``train: {source: ...}``), and ``lerobot``,
LeRobot's own trainer in its stage environment (:mod:`stages.training.lerobot_train`); a plugin
adds its own through the ``physai_flows.algorithms`` entry point group
(:mod:`physai_core.plugins`) by calling :func:`register_algorithm`.

Reading the registry imports no trainer: configs are classes, trainers are ``module:function``
names imported on use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from physai_core.plugins import Registry, resolve_ref
from stages.sections.models import PPOConfig, TrainConfig
from stages.training.imported import IMPORT, ImportConfig
from stages.training.lerobot_train import LeRobotTrainConfig

if TYPE_CHECKING:
    from physai_core.errors import Problem
    from stages.artifacts.records import Dataset, Policy
    from stages.core.schema import FrozenModel
    from stages.orchestration.context import StageContext

DEFAULT = "bc"
"""The algorithm of a ``train:`` section that names none."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """A training algorithm and everything the pipeline needs to know about it."""

    name: str
    """What ``train.algorithm`` says, e.g. ``ppo``."""
    config: type[FrozenModel]
    """Frozen config class of its section; has an ``algorithm`` field and ``resources``."""
    train_ref: str
    """``module:function`` that trains: ``train(cfg, ctx, stage, dataset) -> Policy``."""
    version_ref: str
    """``module:NAME`` of its version string, part of every cache key of its results."""
    reads_dataset: bool
    """Whether it learns from the collected dataset (then the pipeline needs ``collect``)."""
    scene_field: str | None = None
    """Field of its config naming the scene it trains in, relative to the config file; None
    when it trains in none."""
    distributed: bool = False
    """Whether it runs on several processes (torchrun) when its resources ask for them."""
    shared_cache: bool = False
    """Whether one config's result is shared by every stage that runs it (cache key by
    algorithm, not by stage)."""
    cache_inputs_ref: str | None = None
    """``module:function`` giving what else, beside the config, decides its result:
    ``f(cfg, config_file) -> JSON-able`` (the bytes of a file it reads, the version an alias
    points at), part of its cache key; None when the config decides everything."""

    check_ref: str | None = None
    """``module:function`` checking, at config load, what the config alone cannot show (a
    file it names exists): ``f(cfg, config_file) -> list[Problem]``; None: nothing to check."""

    def check(self, cfg: Any, config_file: Path) -> list[Problem]:
        """What :attr:`check_ref` finds wrong with ``cfg`` (nothing without one)."""
        if self.check_ref is None:
            return []
        check = resolve_ref(self.check_ref, what=f"algorithm {self.name!r} check")
        found: list[Problem] = check(cfg, config_file)
        return found

    def cache_inputs(self, cfg: Any, config_file: Path) -> Any:
        """What :attr:`cache_inputs_ref` says for ``cfg`` (None without one)."""
        if self.cache_inputs_ref is None:
            return None
        inputs = resolve_ref(self.cache_inputs_ref, what=f"algorithm {self.name!r} cache inputs")
        return inputs(cfg, config_file)

    def train(self, cfg: Any, ctx: StageContext, stage: str, dataset: Dataset | None) -> Policy:
        """Train with ``cfg`` as stage ``stage`` (``train`` or ``teacher``)."""
        train = resolve_ref(self.train_ref, what=f"algorithm {self.name!r} trainer")
        out: Policy = train(cfg, ctx, stage, dataset)
        return out

    @property
    def version(self) -> str:
        """Its version string."""
        return str(resolve_ref(self.version_ref, what=f"algorithm {self.name!r} version"))


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` to the registry and return it; a second one under one name is an error."""
    if "algorithm" not in spec.config.model_fields:
        raise ValueError(f"{spec.config.__name__} has no 'algorithm' field")
    return ALGORITHMS.register(spec)


def _register_builtins() -> None:
    register_algorithm(AlgorithmSpec(
        "bc", TrainConfig, "stages.steps.train:train_stage", "stages.steps.train:STAGE_VERSION",
        reads_dataset=True))
    register_algorithm(AlgorithmSpec(
        IMPORT, ImportConfig, "stages.training.imported:train_stage",
        "stages.training.imported:STAGE_VERSION",
        reads_dataset=False, cache_inputs_ref="stages.training.imported:cache_inputs",
        check_ref="stages.training.imported:check_source"))
    register_algorithm(AlgorithmSpec(
        "ppo", PPOConfig, "stages.training.ppo:train_stage", "stages.training.ppo:STAGE_VERSION",
        reads_dataset=False, scene_field="scene", distributed=True, shared_cache=True))
    register_algorithm(AlgorithmSpec(
        "lerobot", LeRobotTrainConfig, "stages.training.lerobot_train:train_stage",
        "stages.training.lerobot_train:STAGE_VERSION", reads_dataset=True,
        check_ref="stages.training.lerobot_train:check_config"))


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm", _register_builtins)
"""Every training algorithm, plugins' included."""


def get_algorithm(name: str) -> AlgorithmSpec:
    """The registered algorithm ``name``; an unknown one lists the valid ones."""
    return ALGORITHMS.get(name)


def algorithm_names() -> tuple[str, ...]:
    """Names of every registered algorithm, sorted."""
    return ALGORITHMS.names()

"""The pipeline config: one YAML file, one frozen model per stage, checked whole before any run.

Scene and suite paths are relative to the config file. :func:`load_pipeline` reads the config,
every scene it names and the edge target, collects every problem and raises one
:class:`~physai_core.errors.ConfigError` naming file, field and value.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field, SerializeAsAny
from pydantic_core import PydanticCustomError

from physai_core.errors import ConfigError, Problem, UnknownNameError
from stages.core.hashing import sha256_file, sha256_json
from stages.core.limits import MAX_COLLECT_EPISODES, duration, memory_bytes
from stages.core.loading import named_by, parse_model, read_yaml
from stages.core.redaction import shown_all
from stages.core.resources import is_resource, resolve_file
from stages.core.schema import ConfigModel, FrozenModel
from stages.sections.models import (
    CollectConfig,
    PackageConfig,
    PPOConfig,
    PromoteConfig,
    Resources,
    ValidateConfig,
)

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene
    from stages.sim.suites.suite import Suite
    from stages.sim.tasks.catalog import TaskSpec
    from stages.training.algorithms import AlgorithmSpec



__all__ = [
    "PipelineConfig",
    "ResolvedPipeline",
    "TrainSection",
    "collect_source_problems",
    "load_pipeline",
    "scene_digest",
    "size_problems",
]

def _train_section(value: Any) -> Any:
    """A ``train:`` mapping as the config class of the algorithm it names (default ``bc``),
    from the algorithm registry (:mod:`stages.training.algorithms`), plugins' included."""
    from stages.training.algorithms import DEFAULT, IMPORT, get_algorithm

    if not isinstance(value, dict):
        return value
    # train: {source: ...} brings a policy trained elsewhere (the ``import`` algorithm).
    name = value.get("algorithm", IMPORT if "source" in value else DEFAULT)
    try:
        algorithm = get_algorithm(str(name))
    except UnknownNameError as exc:
        raise PydanticCustomError("unknown_algorithm", str(exc)) from None
    return algorithm.config.model_validate(value)


TrainSection = SerializeAsAny[Annotated[FrozenModel, BeforeValidator(_train_section)]]
"""A train stage: the config of the registered algorithm its ``algorithm`` field names
(``bc``, the default: behaviour cloning; ``ppo``; or a plugin's)."""


class PipelineConfig(ConfigModel):
    """A whole pipeline: task, seed and one config per stage."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="the pipeline's name: its MLflow experiment and Prefect runs")
    task: str = Field(description="registered task id, e.g. reach-v0")
    tasks: tuple[str, ...] = Field(
        (), description="task definition files registered before the task is looked up "
        "(stages/sim/tasks/template.py), relative to the config file or pkg:PACKAGE/PATH"
    )
    seed: int = Field(0, ge=0, description="seed of training and collection")
    teacher: PPOConfig | None = Field(
        None, description="a PPO teacher trained first; collect.expert: teacher records with it"
    )
    collect: CollectConfig | None = Field(None, description="record or import demonstrations; "
                                          "needed by an algorithm that reads a dataset")
    train: TrainSection
    validate_: ValidateConfig = Field(alias="validate", description="the policy over a scene "
                                      "suite, gated per scene")
    package: PackageConfig = Field(default_factory=lambda: PackageConfig(),
                                   description="the signed edge bundle for the robot")
    promote: PromoteConfig = Field(description="registry version and alias")

    model_config = ConfigModel.model_config | {"populate_by_name": True}


@dataclass(frozen=True)
class ResolvedPipeline:
    """A checked pipeline config with its scenes loaded and digests taken. Never mutated."""

    path: Path
    config: PipelineConfig
    task: TaskSpec
    """The spec of the task ``config.task`` names, looked up once when the config loads."""
    config_digest: str
    suite: Suite
    suite_digest: str
    collect_scene: Scene | None = None
    collect_scene_digest: str | None = None
    collect_source_digest: str | None = None
    """sha256 of an imported ``collect.source`` file or folder (a store digest as it is)."""
    train_scene: Scene | None = None
    train_scene_digest: str | None = None
    teacher_scene: Scene | None = None
    teacher_scene_digest: str | None = None

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this pipeline runs, in order: those whose config section is set."""
        from stages.orchestration.stage_table import STAGES

        return tuple(s.name for s in STAGES if getattr(self.config, s.section) is not None)

    @property
    def collect_digest(self) -> str | None:
        """What the collect stage's result depends on besides its config: the recording
        scene's digest, or the imported source's."""
        return self.collect_source_digest or self.collect_scene_digest

    def stage_digest(self, stage: str) -> str:
        """Digest of everything in the config that decides ``stage``'s output.

        A training stage's ``resources`` are left out: the same run on more processes is the
        same stage (its result differs only by floating-point reduction order). An imported
        collect source is keyed by its digest, not its path. Collect's ``min_expert_success``
        is left out: it decides whether collect finishes, not what it records; so are an unset
        ``action_units`` and PPO's ``pipelined`` when off.
        """
        from stages.orchestration.stage_table import stage_def

        cfg = self.config
        defn = stage_def(stage)
        stage_cfg = getattr(cfg, defn.section)
        if stage_cfg is None:
            raise KeyError(f"pipeline {cfg.name} has no {stage} stage")
        extra = (getattr(self, defn.scenes) if defn.scenes else None) or ""
        exclude = {"resources"}
        if stage == "collect":
            exclude.add("min_expert_success")
            if stage_cfg.action_units is None:
                exclude.add("action_units")
        if stage == "collect" and self.collect_source_digest is not None:
            exclude.add("source")
        if getattr(stage_cfg, "pipelined", None) is False:
            exclude.add("pipelined")  # PPO's default: the keys of runs before the option stand
        return sha256_json(
            {
                "task": cfg.task,
                "seed": cfg.seed,
                "config": stage_cfg.model_dump(mode="json", exclude=exclude),
                "scenes": extra,
            }
        )


def load_pipeline(path: str | Path) -> ResolvedPipeline:
    """Read and check a pipeline config and everything it refers to.

    Problems quote values of the config itself (secret-shaped ones redacted); the files it
    names (scenes, suite, task files) are read as named files
    (:func:`stages.core.loading.named_by`), so one that is not what was expected is described by
    type and key names only.
    """
    try:
        return _load_pipeline(Path(path))
    except ConfigError as exc:
        raise ConfigError(shown_all(exc.problems)) from None


def _load_pipeline(path: Path) -> ResolvedPipeline:
    """:func:`load_pipeline`, its problems not yet redacted: 1. the config parsed, its task
    looked up; 2. its sections and edge target checked, the files they name resolved; 3. the
    scenes and the suite loaded and checked; 4. the scenes digested: the resolved pipeline."""
    from edge.errors import EdgeError
    from edge.targets import get_target, preflight
    from stages.sim.suites.loading import load_scene, load_suite

    # -- 1. the config parsed, its task files registered, its task looked up
    cfg, algorithm = _parsed(path)
    problems: list[Problem] = []
    spec, postponed = _task_of(cfg, path, problems)

    def scene_ref(field: str, ref: str) -> Path:
        try:
            resolved = resolve_file(ref, path.parent)
        except ValueError as exc:
            problems.append(Problem(str(path), field, ref, str(exc)))
            return path.parent / ref
        if not resolved.is_file():
            problems.append(Problem(str(path), field, ref, f"file not found: {resolved}"))
        return resolved

    # -- 2. sections, files and target: every problem collected first, so one error lists all
    problems += _section_problems(cfg, algorithm, path)
    collect_path = (scene_ref("collect.scene", cfg.collect.scene)
                    if cfg.collect is not None and cfg.collect.scene is not None else None)
    source_digest = (collect_source_problems(cfg.collect, path, problems)
                     if cfg.collect is not None and cfg.collect.source is not None else None)
    with named_by(path):
        problems.extend(algorithm.check(cfg.train, path))
    field = algorithm.scene_field
    train_path = (scene_ref(f"train.{field}", getattr(cfg.train, field)) if field else None)
    teacher_path = scene_ref("teacher.scene", cfg.teacher.scene) if cfg.teacher else None
    suite_path = scene_ref("validate.suite", cfg.validate_.suite)
    try:
        target = get_target(cfg.package.target)
        preflight(target, cfg.package.opset, cfg.package.precision)
    except (EdgeError, KeyError) as exc:
        problems.append(Problem(str(path), "package", cfg.package.target, str(exc).strip("'\"")))
    if problems or (spec is None and not postponed):
        raise ConfigError(problems)

    # -- 3. scenes and suite: read only once every file they come from is known to exist
    with named_by(path):
        scenes = {label: load_scene(p) for label, p in
                  (("collect.scene", collect_path), ("train.scene", train_path),
                   ("teacher.scene", teacher_path)) if p is not None}
        suite = load_suite(suite_path)
    if spec is None:  # probed with its scenes' make_kwargs now
        spec = _postponed_task(cfg, path)
    problems += _scene_problems(cfg, path, scenes, suite, spec)
    if problems:
        raise ConfigError(problems)
    # -- 4. the digests cover the task's model files too, so a changed robot re-runs stages
    assets = spec.asset_files

    def digest_of(scene_path: Path | None) -> str | None:
        return scene_digest(scene_path, assets) if scene_path is not None else None

    return ResolvedPipeline(
        path=path,
        config=cfg,
        task=spec,
        config_digest=sha256_json(cfg.model_dump(mode="json", by_alias=True)),
        suite=suite,
        suite_digest=suite.digest,
        collect_scene=scenes.get("collect.scene"),
        collect_scene_digest=digest_of(collect_path),
        collect_source_digest=source_digest,
        train_scene=scenes.get("train.scene"),
        train_scene_digest=digest_of(train_path),
        teacher_scene=scenes.get("teacher.scene"),
        teacher_scene_digest=digest_of(teacher_path),
    )


def _task_of(cfg: PipelineConfig, path: Path, problems: list[Problem]
             ) -> tuple[TaskSpec | None, bool]:
    """The config's task, and whether looking it up waits for its scenes: a Gymnasium task
    that cannot be made bare (MetaWorld's Meta-World/MT1 needs an env_name) is probed once its
    scenes have offered their make_kwargs (:func:`_postponed_task`). A failure of any other is
    added to ``problems``."""
    from stages.sim.tasks.catalog import get_task

    try:
        return get_task(cfg.task), False
    except UnknownNameError as exc:
        if cfg.task.startswith("gymnasium:"):
            return None, True
        problems.append(Problem(str(path), "task", cfg.task, str(exc)))
        return None, False


def _postponed_task(cfg: PipelineConfig, path: Path) -> TaskSpec:
    """The config's Gymnasium task, probed with the make_kwargs its loaded scenes offered."""
    from stages.sim.tasks.catalog import get_task

    try:
        return get_task(cfg.task)
    except UnknownNameError as exc:
        raise ConfigError.one(path, "task", cfg.task, str(exc)) from None


def _parsed(path: Path) -> tuple[PipelineConfig, AlgorithmSpec]:
    """The config at ``path`` parsed, its train algorithm, and the task files it names
    registered."""
    from stages.training.algorithms import DEFAULT, get_algorithm

    raw = read_yaml(path)
    train_raw = raw.get("train") if isinstance(raw, dict) else None
    if isinstance(train_raw, dict) and "algorithm" in train_raw:
        try:
            get_algorithm(str(train_raw["algorithm"]))
        except UnknownNameError as exc:
            raise ConfigError.one(path, "train.algorithm", train_raw["algorithm"],
                                  str(exc)) from None
    cfg = parse_model(PipelineConfig, raw, path, sections=_train_model(train_raw))
    algorithm = get_algorithm(getattr(cfg.train, "algorithm", DEFAULT))
    if cfg.tasks:  # the template needs MuJoCo to read its model; other configs load without it
        from stages.sim.tasks.template import register_task_refs

        with named_by(path):
            register_task_refs(cfg.tasks, path)
    return cfg, algorithm


def _train_model(train: object) -> dict[tuple[str, ...], type[FrozenModel]]:
    """The config class the ``train:`` mapping ``train`` is read as (its algorithm's, as
    :func:`_train_section` chooses it), so an unknown field there is answered with the
    closest of that class's names; none where it names no known algorithm."""
    from stages.training.algorithms import DEFAULT, IMPORT, get_algorithm

    if not isinstance(train, dict):
        return {}
    try:
        algorithm = get_algorithm(str(train.get("algorithm",
                                                IMPORT if "source" in train else DEFAULT)))
    except UnknownNameError:
        return {}
    return {("train",): algorithm.config}


def _section_problems(cfg: PipelineConfig, algorithm: AlgorithmSpec,
                      path: Path) -> list[Problem]:
    """Sections that do not fit together: a dataset for an algorithm that reads none (or
    none for one that does), an unused or missing teacher, several processes for an
    algorithm that trains in one."""
    problems: list[Problem] = []
    if algorithm.reads_dataset and cfg.collect is None:
        problems.append(Problem(str(path), "collect", None,
                                f"train.algorithm: {algorithm.name} learns from a dataset and "
                                "needs a collect section"))
    if not algorithm.reads_dataset and cfg.collect is not None:
        problems.append(Problem(str(path), "collect", "present",
                                f"train.algorithm: {algorithm.name} reads no dataset; "
                                "remove collect, or train with algorithm: bc"))
    teacher_used = cfg.collect is not None and cfg.collect.expert == "teacher"
    if teacher_used and cfg.teacher is None:
        problems.append(Problem(str(path), "collect.expert", "teacher",
                                "no teacher section to train the teacher with"))
    if cfg.teacher is not None and not teacher_used:
        problems.append(Problem(str(path), "teacher", "present",
                                "the teacher is never used; set collect.expert: teacher"))
    resources = getattr(cfg.train, "resources", None)
    if (isinstance(resources, Resources) and not algorithm.distributed
            and resources.nodes * resources.nproc_per_node > 1):
        problems.append(Problem(
            str(path), "train.resources.nproc_per_node", resources.nproc_per_node,
            f"train.algorithm: {algorithm.name} trains in one process; several processes "
            f"({resources.nodes} x {resources.nproc_per_node}) would run it once each"))
    return problems


def _scene_problems(cfg: PipelineConfig, path: Path, scenes: dict[str, Scene],
                    suite: Suite, spec: TaskSpec) -> list[Problem]:
    """What the loaded scenes and suite say against the config: another task, a sim-to-sim
    gate with no second backend, per-scene floors of scenes the suite lacks, sizes over the
    caps."""

    problems: list[Problem] = []
    tasks = [(label, scene.config.task) for label, scene in scenes.items()]
    tasks.append(("validate.suite", suite.config.task))
    for label, task in tasks:
        if task != cfg.task:
            problems.append(Problem(str(path), label, task, f"task differs from {cfg.task!r}"))
    if cfg.validate_.sim_to_sim.gate and suite.config.compare_backend is None:
        problems.append(Problem(str(path), "validate.sim_to_sim.gate", True,
                                f"suite {suite.path} names no compare_backend to agree with"))
    known = {s.config.name for s, _, _ in suite.scenes}
    for name in cfg.validate_.scene_min_success:
        if name not in known:
            problems.append(
                Problem(str(path), f"validate.scene_min_success.{name}", name,
                        f"no such scene in the suite; valid: {', '.join(sorted(known))}")
            )
    problems.extend(size_problems(cfg, spec.obs_dim, spec.act_dim, scenes, path))
    return problems


def collect_source_problems(
    collect: CollectConfig, path: Path, problems: list[Problem]
) -> str | None:
    """Check an imported ``collect.source``: the format is registered, and the file or folder
    exists (or the store holds the dataset a ``sha256:`` source names). Appends what is wrong
    to ``problems``; returns the source's digest, or None when it could not be taken."""
    from stages.datasets.formats import get_format
    from stages.datasets.importer import source_digest

    source = collect.source or ""
    if collect.format is not None:
        try:
            get_format(collect.format)
        except UnknownNameError as exc:
            problems.append(Problem(str(path), "collect.format", collect.format, str(exc)))
    stored = collect.source_digest
    if stored is not None:
        from stages.orchestration.context import open_services

        store = open_services()[1]
        if not store.has(stored):
            problems.append(Problem(str(path), "collect.source", source,
                                    f"no dataset {stored} in the store {store.root}"))
        return stored
    if not is_resource(source) and (path.parent / source).is_symlink():
        problems.append(Problem(str(path), "collect.source", source,
                                "is a symbolic link; name the file or folder it points to"))
        return None
    try:
        resolved = resolve_file(source, path.parent)
    except ValueError as exc:
        problems.append(Problem(str(path), "collect.source", source, str(exc)))
        return None
    if not resolved.exists():
        problems.append(Problem(str(path), "collect.source", source,
                                f"no such file or folder: {resolved}"))
        return None
    try:
        return source_digest(resolved)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None


def size_problems(
    cfg: PipelineConfig, obs_dim: int, act_dim: int, scenes: dict[str, Scene], path: Path
) -> list[Problem]:
    """Sizes that cannot fit in this machine's memory, each with its estimate: a network's
    float32 weights with their gradients and Adam's two moments (4 copies), and the collected
    dataset's observations and actions (float32, every episode and step), which also holds
    at most :data:`~stages.core.limits.MAX_COLLECT_EPISODES` episodes."""
    limit = memory_bytes()
    one_gib = 2.0**30
    found = []
    for section in ("teacher", "train"):
        hidden = getattr(getattr(cfg, section), "hidden", None)
        if not hidden:
            continue
        widths = (obs_dim, *hidden, act_dim)
        params = sum((a + 1) * b for a, b in itertools.pairwise(widths))
        need = 16 * params
        if need > limit:
            found.append(Problem(
                str(path), f"{section}.hidden", list(hidden),
                f"a network of {params:.3g} parameters needs about {need / one_gib:.1f} GiB to "
                f"train (weights, gradients, two Adam moments), more than this machine's "
                f"{limit / one_gib:.1f} GiB"))
    scene = scenes.get("collect.scene")
    if cfg.collect is not None and cfg.collect.episodes is not None and scene is not None:
        steps = cfg.collect.episodes * scene.config.episode_steps
        need = 4 * steps * (obs_dim + act_dim)
        capped = cfg.collect.episodes > MAX_COLLECT_EPISODES
        if capped or need > limit:
            said = (f"{steps:.3g} recorded steps of {obs_dim} observations and {act_dim} "
                    f"actions need about {need / one_gib:.1f} GiB")
            if need > limit:
                said += f", more than this machine's {limit / one_gib:.1f} GiB"
            if capped:
                said = (f"at most {MAX_COLLECT_EPISODES:,} episodes: {said}, and "
                        f"{duration(steps)} to simulate")
            found.append(Problem(str(path), "collect.episodes", cfg.collect.episodes, said))
    return found


def scene_digest(scene_path: Path, asset_files: tuple[Path, ...], backend: str | None = None
                 ) -> str:
    """Digest of one scene file, its task's asset bytes and the simulator (``backend``, default
    MuJoCo) and its version (for a Gymnasium task also the environment's id, package and
    version, and the make_kwargs)."""
    from stages.sim.backends.catalog import DEFAULT, backend_version
    from stages.sim.suites.digest import scene_provenance

    backend = backend or DEFAULT
    return sha256_json(
        {
            "scene": sha256_file(scene_path),
            "assets": [sha256_file(p) for p in asset_files],
            "backend": f"{backend}-{backend_version(backend)}",
            **scene_provenance(scene_path),
        }
    )

"""The pipeline config: one YAML file, one frozen model per stage, checked whole before any run.

Scene and suite paths are relative to the config file. :func:`load_pipeline` reads the config,
every scene it names and the edge target, collects every problem and raises one
:class:`~stages.errors.ConfigError` naming file, field and value.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BeforeValidator,
    Field,
    PositiveFloat,
    PositiveInt,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from stages.errors import ConfigError, Problem, UnknownNameError
from stages.hashing import sha256_file, sha256_json
from stages.limits import (
    MAX_COLLECT_EPISODES,
    MAX_ITERATIONS,
    MAX_VIDEO_SIDE,
    MAX_WORLDS,
    at_most,
    check_caps,
    duration,
    gib,
    worlds_cost,
)
from stages.resources import is_resource, resolve_file
from stages.schema import FrozenModel, named_by, parse_model, read_yaml, shown_all
from stages.units import ActionUnits

if TYPE_CHECKING:
    from stages.algorithms import AlgorithmSpec
    from stages.sim.scene import Scene, Suite


EXPERT_HELP = (
    "'scripted' (the task's scripted expert), 'teacher' (this pipeline's PPO teacher stage), "
    "models:/NAME@ALIAS or models:/NAME/VERSION (a registered policy), or a policy digest in "
    "the artifact store"
)


def expert_kind(expert: str) -> Literal["scripted", "teacher", "registry", "store"]:
    """Which kind of expert a ``collect.expert`` value names (see :data:`EXPERT_HELP`)."""
    if expert in ("scripted", "teacher"):
        return expert  # type: ignore[return-value]
    if expert.startswith("models:/"):
        return "registry"
    if re.fullmatch(r"(sha256:)?[0-9a-f]{64}", expert):
        return "store"
    raise ValueError(f"unknown expert; use {EXPERT_HELP}")


class CollectConfig(FrozenModel):
    """Record demonstrations with an expert (the scripted one or a trained teacher policy), or
    import them: ``source`` (a file or folder, or ``sha256:DIGEST`` of a dataset in the store)
    in a registered ``format`` replaces recording, and then no scene, episodes or expert is
    given (see docs/datasets.md)."""

    scene: str | None = Field(None, description="scene file the episodes are recorded in, "
                              "relative to the config file, or pkg:PACKAGE/PATH inside an "
                              "installed package; required unless source is given")
    episodes: PositiveInt | None = Field(None, description="number of episodes to record "
                                         "(at most 1,000,000); required unless source is given")
    num_worlds: PositiveInt = Field(32, description="worlds stepped together (at most 65,536)")
    exploration_noise: float = Field(
        0.2, ge=0, le=1, description="std of noise added to executed actions; labels stay clean"
    )
    expert: str = Field("scripted", description=EXPERT_HELP)
    min_expert_success: float = Field(
        0.9, ge=0, le=1, description="least success rate of the scripted expert in noise-free "
        "episodes of the collect scene, checked before recording; below it collect stops and "
        "names the expert's fields to tune",
    )
    source: str | None = Field(
        None, description="import instead of recording: a dataset file or folder, relative to "
        "the config file (or pkg:PACKAGE/PATH), or sha256:DIGEST of a dataset in the store",
    )
    format: str | None = Field(
        None, description="the source's dataset format (isaaclab, robomimic, lerobot, minari or "
        "a plugin's); required with a source file",
    )
    obs_keys: tuple[str, ...] = Field(
        (), description="observation keys of the source joined, in this order, into the "
        "task's observation; empty: the format's default (docs/datasets.md)",
    )
    action_units: ActionUnits | None = Field(
        None, description="units of the source file's actions: native (the environment's own) "
        "or normalized (-1..1); unset: the file's or its format's default (docs/datasets.md)",
    )

    @field_validator("expert")
    @classmethod
    def _known_expert(cls, value: str) -> str:
        expert_kind(value)
        return value.removeprefix("sha256:")

    @field_validator("num_worlds")
    @classmethod
    def _bounded_worlds(cls, value: int) -> int:
        at_most(value, MAX_WORLDS, worlds_cost(value))
        return value

    @model_validator(mode="after")
    def _one_way(self) -> CollectConfig:
        recording = ("scene", "episodes", "num_worlds", "exploration_noise", "expert",
                     "min_expert_success")
        if self.source is None:
            for name in ("format", "obs_keys", "action_units"):
                if name in self.model_fields_set:
                    raise PydanticCustomError(
                        "needs_source", f"{name} applies only to an imported source")
            missing = [n for n in ("scene", "episodes") if getattr(self, n) is None]
            if missing:
                raise PydanticCustomError(
                    "missing", f"{' and '.join(missing)} required (or a source to import)")
            return self
        given = [n for n in recording if n in self.model_fields_set]
        if given:
            raise PydanticCustomError(
                "source_and_recording", f"source imports a dataset; {', '.join(given)} "
                "applies only to recording: remove it")
        if self.source_digest is None and self.format is None:
            raise PydanticCustomError("missing_format", "a source file needs its format")
        if self.source_digest is not None and self.action_units is not None:
            raise PydanticCustomError(
                "stored_units", "a stored dataset's actions are already in the task's "
                "convention: action_units applies only to a source file")
        return self

    @property
    def source_digest(self) -> str | None:
        """The store digest a ``sha256:DIGEST`` source names, else None."""
        if self.source is not None and re.fullmatch(r"sha256:[0-9a-f]{64}", self.source):
            return self.source.removeprefix("sha256:")
        return None


class Resources(FrozenModel):
    """What a training stage asks of its computer; becomes the ``dgx`` work pool's job
    variables, and ``nproc_per_node`` > 1 runs the stage under ``torchrun`` with DDP."""

    nodes: PositiveInt = Field(1, description="machines (torchrun --nnodes)")
    nproc_per_node: PositiveInt = Field(
        1, description="training processes per machine (torchrun --nproc-per-node); one per GPU"
    )
    gpus_per_node: int = Field(0, ge=0, description="GPUs per machine (nvidia.com/gpu)")
    cpus_per_node: PositiveInt | None = Field(None, description="CPU cores per machine")
    memory_gb: PositiveFloat | None = Field(None, description="memory per machine, GiB")


class TrainConfig(FrozenModel):
    """Behaviour cloning of the recorded actions with observation normalization."""

    algorithm: Literal["bc"] = "bc"
    epochs: PositiveInt = Field(description="passes over the training split")
    batch_size: PositiveInt = 256
    lr: PositiveFloat = Field(1e-3, description="Adam learning rate")
    weight_decay: float = Field(0.0, ge=0)
    hidden: tuple[PositiveInt, ...] = Field((256, 256), min_length=1)
    val_fraction: float = Field(0.1, gt=0, lt=0.5, description="episodes held out for val loss")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    resources: Resources = Field(default_factory=lambda: Resources())


class PPOConfig(FrozenModel):
    """PPO in the batched simulator through rsl_rl (the library Isaac Lab trains with)."""

    algorithm: Literal["ppo"] = "ppo"
    scene: str = Field(description="scene file trained in, relative to the config file")
    iterations: PositiveInt = Field(description="PPO iterations (rollout, then update); at "
                                    "most 100,000")
    num_worlds: PositiveInt = Field(1024, description="worlds stepped together, per process "
                                    "(at most 65,536)")
    steps_per_iteration: PositiveInt = Field(24, description="control steps per world per rollout")
    learning_epochs: PositiveInt = 5
    mini_batches: PositiveInt = 4
    lr: PositiveFloat = Field(1e-3, description="Adam learning rate (adapted to desired_kl)")
    desired_kl: PositiveFloat = 0.01
    gamma: float = Field(0.99, gt=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    clip: PositiveFloat = 0.2
    entropy_coef: float = Field(0.005, ge=0)
    max_grad_norm: PositiveFloat = 1.0
    init_noise_std: PositiveFloat = Field(0.4, description="initial action noise std")
    final_noise_std: PositiveFloat | None = Field(
        None, description="cap on the action noise std, lowered geometrically from "
        "init_noise_std to this over the first 3/4 of the run, so the deterministic policy "
        "that gets deployed walks without the noise it was trained with; None: no cap",
    )
    noise_correlation: float = Field(
        0.0, ge=0, lt=1, description="AR(1) correlation in time of the exploration noise "
        "(0: white noise, rsl_rl's default); see stages/rl_noise.py",
    )
    hidden: tuple[PositiveInt, ...] = Field((128, 128), min_length=1)
    checkpoint_every: PositiveInt = Field(
        25, description="iterations between checkpoints in the artifact store"
    )
    sim_threads: PositiveInt | None = Field(None, description="C threads stepping; None: all")
    update_threads: PositiveInt = Field(
        1, description="torch CPU threads of the PPO update; more than 1 pays only on an "
        "otherwise idle machine (OpenMP workers waiting beside other load slow it tenfold)",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    resources: Resources = Field(default_factory=lambda: Resources())

    @model_validator(mode="after")
    def _bounded(self) -> PPOConfig:
        """At most :data:`~stages.limits.MAX_WORLDS` worlds and
        :data:`~stages.limits.MAX_ITERATIONS` iterations, each said with its cost."""
        rollout = self.num_worlds * self.steps_per_iteration
        steps = self.iterations * rollout
        check_caps("PPOConfig", [
            ("iterations", self.iterations, MAX_ITERATIONS,
             f"{self.iterations:,} iterations of {self.num_worlds:,} worlds x "
             f"{self.steps_per_iteration} steps are {steps:.3g} simulated steps, "
             f"{duration(steps)}"),
            ("num_worlds", self.num_worlds, MAX_WORLDS,
             f"{worlds_cost(self.num_worlds)}, and every rollout keeps {rollout:,} "
             "transitions"),
        ])
        return self


def _train_section(value: Any) -> Any:
    """A ``train:`` mapping as the config class of the algorithm it names (default ``bc``),
    from the algorithm registry (:mod:`stages.algorithms`), plugins' included."""
    from stages.algorithms import DEFAULT, IMPORT, get_algorithm

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


class CriticConfig(FrozenModel):
    """A Cosmos Reason endpoint that watches each scene's filmed rollout (stages/critic.py).

    The URL and model may instead come from ``PHYSAI_COSMOS_URL`` and ``PHYSAI_COSMOS_MODEL``;
    the key only ever from ``PHYSAI_COSMOS_API_KEY``.
    """

    url: str | None = Field(None, description="base URL of the NIM, e.g. http://localhost:8000")
    model: str | None = Field(None, description="served model id, e.g. nvidia/cosmos-reason2-8b")
    min_pass_rate: float | None = Field(
        None, ge=0, le=1,
        description="gate: share of filmed scenes judged plausible and done; unset: no gate")
    timeout_s: PositiveFloat = Field(120.0, description="wait for one answer, seconds")
    retries: int = Field(2, ge=0, le=10, description="retries of a timeout, 429 or 5xx answer")
    backoff_s: float = Field(2.0, ge=0, description="first retry's delay; doubles each retry")

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, url: str | None) -> str | None:
        """A URL with a user or password would be written into the run's resolved config."""
        if url is not None and "@" in urlsplit(url).netloc:
            raise ValueError("holds a user or password; give the key in PHYSAI_COSMOS_API_KEY")
        return url


class SimToSimConfig(FrozenModel):
    """The sim-to-sim check of a suite with a ``compare_backend`` (stages/compare.py)."""

    margin: float = Field(0.1, ge=0, lt=1,
                          description="tolerated difference between the backends' success rates")
    alpha: float = Field(0.05, gt=0, lt=1, description="false-alarm level over the scenes")
    gate: bool = Field(False, description="promotion requires every scene to agree")


class SequentialConfig(FrozenModel):
    """The sequential scene gate (stages/sequential.py): a scene looks at its episodes every
    ``chunk`` and stops once its verdict is clear, its episode count the most it spends."""

    chunk: PositiveInt = Field(10, description="episodes between two looks")
    indifference: float = Field(
        0.1, gt=0, lt=1, description="a policy this far above the scene's threshold passes "
        "with probability at least 1 - beta")
    alpha: float = Field(0.05, gt=0, lt=0.5,
                         description="most chance of passing a policy at the threshold")
    beta: float = Field(0.05, gt=0, lt=0.5, description="most chance of failing a policy "
                        "at the threshold plus the indifference")


class ValidateConfig(FrozenModel):
    """Roll the policy out over a scene suite and gate on the success-rate interval."""

    suite: str = Field(description="suite file, relative to the config file")
    min_success: float = Field(
        ge=0, le=1, description="each scene passes when its 95% Wilson lower bound is at least this"
    )
    scene_min_success: dict[str, float] = Field(
        default_factory=dict, description="per-scene overrides of min_success, by scene name"
    )
    video_episodes: int = Field(
        2, ge=0, le=8, description="episodes per scene rendered side by side to a GIF; 0: none"
    )
    video_size: tuple[PositiveInt, PositiveInt] = Field(
        (320, 240), description="width and height of one episode's frame, pixels (at most "
        "3,840 each)"
    )
    video_every: PositiveInt = Field(2, description="render every n-th control step")
    critic: CriticConfig | None = Field(
        None, description="a Cosmos Reason model judges each filmed scene (stages/critic.py)")
    environment: str | None = Field(
        None, description="stage environment the scenes run in (stages/environments.py), "
        "e.g. isaaclab; unset: the one the suite's backend implies, else this one")
    sim_to_sim: SimToSimConfig = Field(
        default_factory=SimToSimConfig,
        description="the test (and optional gate) of a suite's compare_backend")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where a backend that can simulates (Isaac Lab): auto is a CUDA "
        "GPU when there is one, else the CPU")
    sequential: SequentialConfig | None = Field(
        None, description="scenes with a threshold above 0 stop early once their gate's "
        "verdict is clear, at controlled error rates; unset: every scene spends its count")

    @field_validator("video_size")
    @classmethod
    def _bounded_video(cls, value: tuple[int, int], info: ValidationInfo) -> tuple[int, int]:
        """Each side at most :data:`~stages.limits.MAX_VIDEO_SIDE` pixels, said in memory."""
        width, height = value
        filmed = info.data.get("video_episodes", 2) or 1
        frame = filmed * width * height * 3
        at_most(max(width, height), MAX_VIDEO_SIDE,
                f"a frame of {filmed} filmed episode(s) of {width} x {height} pixels is "
                f"{gib(frame)}, and a scene's frames stay in memory until its video is "
                f"written: {gib(frame * 500)} for a 1,000-step episode filmed every 2nd step")
        return value

    @field_validator("environment")
    @classmethod
    def _registered_environment(cls, value: str | None) -> str | None:
        if value is not None:
            from stages.environments import get_environment

            try:
                get_environment(value)
            except UnknownNameError as exc:
                raise PydanticCustomError("unknown_environment", str(exc)) from None
        return value

    @model_validator(mode="after")
    def _critic_watches_a_video(self) -> ValidateConfig:
        if self.critic is not None and self.video_episodes == 0:
            raise PydanticCustomError(
                "critic_without_video", "the critic judges the filmed episodes: set "
                "video_episodes to 1 or more, or remove critic")
        return self


class PackageConfig(FrozenModel):
    """Export to ONNX, check parity and latency, and pack an edge bundle."""

    target: str = Field("jetson-agx-thor", description="edge target name")
    opset: PositiveInt = 17
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    control_hz: PositiveFloat = Field(25.0, description="control rate on the robot, Hz")
    max_latency_p99_ms: PositiveFloat = Field(
        2.0, description="gate on ONNX Runtime batch-1 p99 latency, ms"
    )
    parity_tolerance: PositiveFloat = Field(1e-5, description="max |onnx - torch| on dataset obs")
    latency_iters: PositiveInt = 2000


class PromoteConfig(FrozenModel):
    """Register the model version; move the alias when every gate passes and the challenger is
    not worse than the current champion on the same frozen suite."""

    model_name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    alias: str = Field("champion", pattern=r"^[a-z][a-z0-9_-]*$")
    regression_margin: float = Field(
        0.05, ge=0, lt=1, description="tolerated drop in success rate against the champion"
    )
    regression_alpha: float = Field(
        0.05, gt=0, lt=0.5, description="family-wise false-alarm rate of the regression test"
    )
    require_engine_report: bool = Field(
        False, description="move the alias only once an on-target TensorRT engine report of "
        "the bundle passed (its check, and its p99 within the bundle's latency budget): the "
        "packaging host's ONNX Runtime latency is not the robot's. The version is registered "
        "either way; flows engine build (or the engine-build deployment) on the target records "
        "the report, then flows promote NAME --version V moves the alias",
    )


class PipelineConfig(FrozenModel):
    """A whole pipeline: task, seed and one config per stage."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    task: str = Field(description="registered task id, e.g. reach-v0")
    tasks: tuple[str, ...] = Field(
        (), description="task definition files registered before the task is looked up "
        "(stages/sim/template.py), relative to the config file or pkg:PACKAGE/PATH"
    )
    seed: int = Field(0, ge=0)
    teacher: PPOConfig | None = Field(
        None, description="a PPO teacher trained first; collect.expert: teacher records with it"
    )
    collect: CollectConfig | None = None
    train: TrainSection
    validate_: ValidateConfig = Field(alias="validate")
    package: PackageConfig = Field(default_factory=lambda: PackageConfig())
    promote: PromoteConfig

    model_config = FrozenModel.model_config | {"populate_by_name": True}


@dataclass(frozen=True)
class ResolvedPipeline:
    """A checked pipeline config with its scenes loaded and digests taken. Never mutated."""

    path: Path
    config: PipelineConfig
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
        from stages.stage_table import STAGES

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
        is left out: it decides whether collect finishes, not what it records; so is an unset
        ``action_units``.
        """
        from stages.stage_table import stage_def

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
    names (scenes, suite, task files) are read as named files (:func:`stages.schema.named_by`),
    so one that is not what was expected is described by type and key names only.
    """
    try:
        return _load_pipeline(Path(path))
    except ConfigError as exc:
        raise ConfigError(shown_all(exc.problems)) from None


def _load_pipeline(path: Path) -> ResolvedPipeline:
    """:func:`load_pipeline`, its problems not yet redacted."""
    from edge.errors import EdgeError
    from edge.targets import get_target, preflight
    from stages.sim.scene import load_scene, load_suite
    from stages.sim.tasks import get_task

    cfg, algorithm = _parsed(path)
    problems: list[Problem] = []
    try:
        get_task(cfg.task)
    except UnknownNameError as exc:
        problems.append(Problem(str(path), "task", cfg.task, str(exc)))

    def scene_ref(field: str, ref: str) -> Path:
        try:
            resolved = resolve_file(ref, path.parent)
        except ValueError as exc:
            problems.append(Problem(str(path), field, ref, str(exc)))
            return path.parent / ref
        if not resolved.is_file():
            problems.append(Problem(str(path), field, ref, f"file not found: {resolved}"))
        return resolved

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
    if problems:
        raise ConfigError(problems)

    with named_by(path):
        scenes = {label: load_scene(p) for label, p in
                  (("collect.scene", collect_path), ("train.scene", train_path),
                   ("teacher.scene", teacher_path)) if p is not None}
        suite = load_suite(suite_path)
    problems += _scene_problems(cfg, path, scenes, suite)
    if problems:
        raise ConfigError(problems)
    assets = get_task(cfg.task).asset_files

    def digest_of(scene_path: Path | None) -> str | None:
        return scene_digest(scene_path, assets) if scene_path is not None else None

    return ResolvedPipeline(
        path=path,
        config=cfg,
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


def _parsed(path: Path) -> tuple[PipelineConfig, AlgorithmSpec]:
    """The config at ``path`` parsed, its train algorithm, and the task files it names
    registered."""
    from stages.algorithms import DEFAULT, get_algorithm

    raw = read_yaml(path)
    train_raw = raw.get("train") if isinstance(raw, dict) else None
    if isinstance(train_raw, dict) and "algorithm" in train_raw:
        try:
            get_algorithm(str(train_raw["algorithm"]))
        except UnknownNameError as exc:
            raise ConfigError.one(path, "train.algorithm", train_raw["algorithm"],
                                  str(exc)) from None
    cfg = parse_model(PipelineConfig, raw, path)
    algorithm = get_algorithm(getattr(cfg.train, "algorithm", DEFAULT))
    if cfg.tasks:  # the template needs MuJoCo to read its model; other configs load without it
        from stages.sim.template import register_task_refs

        with named_by(path):
            register_task_refs(cfg.tasks, path)
    return cfg, algorithm


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
                    suite: Suite) -> list[Problem]:
    """What the loaded scenes and suite say against the config: another task, a sim-to-sim
    gate with no second backend, per-scene floors of scenes the suite lacks, a collect the
    task's stage environment cannot run, sizes over the caps."""
    from stages.sim.tasks import get_task

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
    spec = get_task(cfg.task)
    if spec.environment is not None and cfg.collect is not None:
        problems.append(Problem(str(path), "collect", "present",
                                f"task {cfg.task} runs in the stage environment "
                                f"{spec.environment!r}, where collect does not run yet; "
                                "train it with algorithm: ppo, or import a dataset"))
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
        from stages.context import open_services

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


def memory_bytes() -> int:
    """Physical memory of this machine (bytes): the bound a stage's estimated size must fit."""
    import os

    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def size_problems(
    cfg: PipelineConfig, obs_dim: int, act_dim: int, scenes: dict[str, Scene], path: Path
) -> list[Problem]:
    """Sizes that cannot fit in this machine's memory, each with its estimate: a network's
    float32 weights with their gradients and Adam's two moments (4 copies), and the collected
    dataset's observations and actions (float32, every episode and step), which also holds
    at most :data:`~stages.limits.MAX_COLLECT_EPISODES` episodes."""
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
    from stages.sim.backends import DEFAULT, backend_version
    from stages.sim.scene import scene_provenance

    backend = backend or DEFAULT
    return sha256_json(
        {
            "scene": sha256_file(scene_path),
            "assets": [sha256_file(p) for p in asset_files],
            "backend": f"{backend}-{backend_version(backend)}",
            **scene_provenance(scene_path),
        }
    )

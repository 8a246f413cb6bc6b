"""The pipeline config: one YAML file, one frozen model per stage, checked whole before any run.

Scene and suite paths are relative to the config file. :func:`load_pipeline` reads the config,
every scene it names and the edge target, collects every problem and raises one
:class:`~stages.errors.ConfigError` naming file, field and value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from stages.errors import ConfigError, Problem, UnknownNameError
from stages.hashing import sha256_file, sha256_json
from stages.schema import FrozenModel, parse_model, read_yaml

if TYPE_CHECKING:
    from stages.sim.scene import Scene, Suite


class CollectConfig(FrozenModel):
    """Record demonstrations with the task's scripted expert."""

    scene: str = Field(description="scene file the episodes are recorded in, relative to config")
    episodes: PositiveInt = Field(description="number of episodes to record")
    num_worlds: PositiveInt = Field(32, description="worlds stepped together")
    exploration_noise: float = Field(
        0.2, ge=0, le=1, description="std of noise added to executed actions; labels stay clean"
    )


class TrainConfig(FrozenModel):
    """Behaviour cloning of the recorded actions with observation normalization."""

    epochs: PositiveInt = Field(description="passes over the training split")
    batch_size: PositiveInt = 256
    lr: PositiveFloat = Field(1e-3, description="Adam learning rate")
    weight_decay: float = Field(0.0, ge=0)
    hidden: tuple[PositiveInt, ...] = Field((256, 256), min_length=1)
    val_fraction: float = Field(0.1, gt=0, lt=0.5, description="episodes held out for val loss")
    device: Literal["auto", "cpu", "cuda"] = "auto"


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
        (320, 240), description="width and height of one episode's frame, pixels"
    )
    video_every: PositiveInt = Field(2, description="render every n-th control step")


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


class PipelineConfig(FrozenModel):
    """A whole pipeline: task, seed and one config per stage."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    task: str = Field(description="registered task id, e.g. reach-v0")
    seed: int = Field(0, ge=0)
    collect: CollectConfig
    train: TrainConfig
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
    collect_scene: Scene
    collect_scene_digest: str
    suite: Suite
    suite_digest: str

    def stage_digest(self, stage: str) -> str:
        """Digest of everything in the config that decides ``stage``'s output."""
        cfg = self.config
        stage_cfg = {
            "collect": cfg.collect,
            "train": cfg.train,
            "validate": cfg.validate_,
            "package": cfg.package,
            "promote": cfg.promote,
        }[stage]
        extra = {
            "collect": self.collect_scene_digest,
            "validate": self.suite_digest,
        }.get(stage, "")
        return sha256_json(
            {
                "task": cfg.task,
                "seed": cfg.seed,
                "config": stage_cfg.model_dump(mode="json"),
                "scenes": extra,
            }
        )


def load_pipeline(path: str | Path) -> ResolvedPipeline:
    """Read and check a pipeline config and everything it refers to."""
    from edge.errors import EdgeError
    from edge.targets import get_target, preflight
    from stages.sim.scene import load_scene, load_suite
    from stages.sim.tasks import get_task

    path = Path(path)
    cfg = parse_model(PipelineConfig, read_yaml(path), path)
    problems: list[Problem] = []
    try:
        get_task(cfg.task)
    except UnknownNameError as exc:
        problems.append(Problem(str(path), "task", cfg.task, str(exc)))

    def scene_ref(field: str, ref: str) -> Path:
        resolved = (path.parent / ref).resolve()
        if not resolved.is_file():
            problems.append(Problem(str(path), field, ref, f"file not found: {resolved}"))
        return resolved

    collect_path = scene_ref("collect.scene", cfg.collect.scene)
    suite_path = scene_ref("validate.suite", cfg.validate_.suite)
    try:
        target = get_target(cfg.package.target)
        preflight(target, cfg.package.opset, cfg.package.precision)
    except (EdgeError, KeyError) as exc:
        problems.append(Problem(str(path), "package", cfg.package.target, str(exc).strip("'\"")))
    if problems:
        raise ConfigError(problems)

    scene = load_scene(collect_path)
    suite = load_suite(suite_path)
    tasks = (("collect.scene", scene.config.task), ("validate.suite", suite.config.task))
    for label, task in tasks:
        if task != cfg.task:
            problems.append(Problem(str(path), label, task, f"task differs from {cfg.task!r}"))
    known = {s.config.name for s, _, _ in suite.scenes}
    for name in cfg.validate_.scene_min_success:
        if name not in known:
            problems.append(
                Problem(str(path), f"validate.scene_min_success.{name}", name,
                        f"no such scene in the suite; valid: {', '.join(sorted(known))}")
            )
    if problems:
        raise ConfigError(problems)
    return ResolvedPipeline(
        path=path,
        config=cfg,
        config_digest=sha256_json(cfg.model_dump(mode="json", by_alias=True)),
        collect_scene=scene,
        collect_scene_digest=scene_digest(collect_path, get_task(cfg.task).asset_files),
        suite=suite,
        suite_digest=suite.digest,
    )


def scene_digest(scene_path: Path, asset_files: tuple[Path, ...]) -> str:
    """Digest of one scene file, its task's asset bytes and the simulator version."""
    import mujoco

    return sha256_json(
        {
            "scene": sha256_file(scene_path),
            "assets": [sha256_file(p) for p in asset_files],
            "backend": f"mujoco-{mujoco.__version__}",
        }
    )

"""LeRobot's own trainer as a train stage: ``train: {algorithm: lerobot, policy: act |
diffusion, steps, batch_size, ...}``.

The section's own keys say how long and how to train; every other key is the policy's own
(LeRobot's ``ACTConfig`` or ``DiffusionConfig`` field, ``dim_model: 64``), passed through and
checked against that class in the ``lerobot`` stage environment before anything is written
(:mod:`stages.training.lerobot_options`). The stage:

1. writes the pipeline's dataset as a LeRobot v3 folder, cameras as videos
   (:mod:`stages.datasets.lerobot_writer`, the format LeRobot's ``LeRobotDataset`` reads,
   tests/lerobot/test_lerobot_datasets.py), with the cameras ``cameras`` names;
2. runs LeRobot's trainer (``lerobot.scripts.lerobot_train``) there, on the CPU or the GPU
   ``device`` names (:mod:`stages.training.lerobot_run`): loss and progress reach the Prefect log
   and MLflow as it trains, and each checkpoint it writes is stored as a
   :class:`~stages.artifacts.records.Checkpoint` artifact under the reference
   ``checkpoints/lerobot/<run key>``; a re-run of a killed stage restores the newest and passes
   LeRobot ``--resume=true``;
3. brings the trained policy in as a LeRobot folder is brought in by ``train: {source:
   FOLDER}`` (:func:`stages.training.imported.import_lerobot`): exported to ONNX with its
   processors, its parity with LeRobot's ``select_action`` within ``parity_tolerance``; the
   policy's parents are the dataset and the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

from physai_core.errors import ConfigError, PhysaiError, Problem
from stages.artifacts.records import Checkpoint, Dataset, Policy
from stages.core.environments import get_environment, require_python
from stages.core.hashing import sha256_json
from stages.core.schema import ConfigModel
from stages.sections.models import Resources
from stages.training.lerobot_run import (
    checkpoint_tar,
    fresh_folder,
    repoint_config,
    restore_checkpoint,
    run_training,
    train_config,
)

if TYPE_CHECKING:
    from stages.orchestration.context import StageContext
    from stages.sim.tasks.catalog import TaskSpec
    from stages.training.context import TrainingContext

log = logging.getLogger(__name__)

ALGORITHM = "lerobot"
STAGE_VERSION = "1"
ENVIRONMENT = "lerobot"
OPTIONS_SCRIPT = Path(__file__).with_name("lerobot_options.py")
RESERVED = frozenset({"type", "device", "input_features", "output_features", "push_to_hub",
                      "repo_id", "pretrained_path"})
"""Policy fields the stage sets itself: from the task, the dataset and ``device``."""
CHECK_TIMEOUT_S = 300.0
TRAIN_TIMEOUT_S = 24 * 3600.0


class LeRobotTrainConfig(ConfigModel):
    """Train a LeRobot policy with LeRobot's own trainer, in the ``lerobot`` stage environment.
    Keys beyond these are the policy's own config fields, passed through."""

    model_config = ConfigDict(extra="allow")
    EXTRA_KEYS: ClassVar[str] = (
        "any other key is a field of LeRobot's config class of `policy` (ACTConfig, "
        "DiffusionConfig: `dim_model`, `chunk_size`, `down_dims`...), passed through as it is "
        "and checked against that class in the lerobot environment when the config loads")

    algorithm: Literal["lerobot"] = Field(description="LeRobot's trainer")
    policy: Literal["act", "diffusion"] = Field(description="LeRobot's policy type")
    steps: PositiveInt = Field(description="optimizer steps (LeRobot's --steps)")
    batch_size: PositiveInt = Field(8, description="frames per optimizer step")
    save_freq: PositiveInt = Field(500, description="a checkpoint every this many steps (and "
                                   "after the last), each stored as a stage artifact")
    log_freq: PositiveInt = Field(50, description="loss logged every this many steps")
    num_workers: NonNegativeInt = Field(0, description="dataloader worker processes")
    cameras: tuple[str, ...] | None = Field(
        None, min_length=1, description="the task cameras the policy sees; unset: all of them")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where it trains: auto (cuda when torch sees a GPU), cpu or cuda")
    resources: Resources = Field(default_factory=lambda: Resources(),
                                 description="what the stage asks of the cluster")
    parity_tolerance: PositiveFloat = Field(
        1e-4, description="max |exported ONNX - LeRobot's select_action| on probe observations")

    @property
    def options(self) -> dict[str, Any]:
        """The policy's own config fields, as written."""
        return dict(self.model_extra or {})


def check_config(cfg: LeRobotTrainConfig, config_file: Path) -> list[Problem]:
    """What is wrong with the section, checked at config load: a pass-through key the stage
    sets itself, or one LeRobot's config class of ``cfg.policy`` refuses (checked in the
    ``lerobot`` environment when it is built; otherwise the train stage names ``make lerobot``
    before it writes anything)."""
    found = [Problem(str(config_file), f"train.{key}", value, "set by the stage from the "
                     "task, the dataset and train.device; leave it out")
             for key, value in cfg.options.items() if key in RESERVED]
    python = get_environment(ENVIRONMENT).python()
    if found or not os.access(python, os.X_OK):
        return found
    answer = lerobot_check(python, cfg.policy, json.dumps(cfg.options, sort_keys=True))
    if answer["problem"] is not None:
        key = answer["key"]
        found.append(Problem(str(config_file), f"train.{key}" if key else "train.policy",
                             cfg.options.get(key, cfg.policy), answer["problem"]))
    return found


def lerobot_check(python: Path, policy: str, options: str) -> dict[str, Any]:
    """LeRobot's verdict on ``options`` (JSON) for ``policy`` (:mod:`.lerobot_options`), kept
    beside the environment (``.physai-checks/``) so a config is checked once per environment."""
    key = sha256_json({"python": str(python), "policy": policy, "options": options,
                       "script": OPTIONS_SCRIPT.read_text()})
    cache = python.resolve().parent.parent / ".physai-checks" / f"{key[:32]}.json"
    if cache.is_file():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    try:
        done = subprocess.run([str(python), "-I", str(OPTIONS_SCRIPT), "check", policy, options],
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PhysaiError(f"LeRobot's config check ran past {CHECK_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise PhysaiError(f"LeRobot's config check failed: {done.stderr.strip()[-1500:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(answer))
        tmp.replace(cache)
    except OSError:
        pass  # a read-only environment: checked again next time
    return answer


def check_options(cfg: LeRobotTrainConfig, file: Path, stage: str) -> None:
    """The config-load check again, where the stage runs (its environment must be built now):
    a refusal is one line naming the key."""
    for problem in check_config(cfg, file):
        raise ConfigError.one(file, problem.field.replace("train.", f"{stage}.", 1),
                              problem.value, problem.message)


def seen_cameras(cfg: LeRobotTrainConfig, spec: TaskSpec, file: Path, stage: str) -> set[str]:
    """Tensor names of the camera images the policy sees (``front_image``)."""
    by_name = {cam.name: cam.image_key for cam in spec.cameras if cam.rgb}
    if cfg.cameras is None:
        return set(by_name.values())
    for name in cfg.cameras:
        if name not in by_name:
            raise ConfigError.one(file, f"{stage}.cameras", name, f"task {spec.name} has no "
                                  f"camera of that name; its cameras: "
                                  f"{', '.join(by_name) or 'none'}")
    return {by_name[name] for name in cfg.cameras}


def run_key(stage: str, ctx: StageContext, dataset: Dataset) -> str:
    """What decides the run: its config and its dataset. Checkpoints are filed under it."""
    return sha256_json({"stage": ALGORITHM, "version": STAGE_VERSION,
                        "config": ctx.config_digests[stage], "dataset": dataset.digest})


def checkpoint_ref(key: str) -> str:
    """The store reference to the newest checkpoint of run ``key``."""
    return f"checkpoints/{ALGORITHM}/{key}"


def latest_checkpoint(ctx: StageContext, key: str) -> Checkpoint | None:
    """The newest stored checkpoint of run ``key``, or None."""
    digest = ctx.store.get_ref(checkpoint_ref(key))
    if digest is None:
        return None
    checkpoint = ctx.store.get(digest)
    if not isinstance(checkpoint, Checkpoint) or checkpoint.run_key != key:
        raise PhysaiError(f"{checkpoint_ref(key)} points at {digest}, which is not a "
                          "checkpoint of this run")
    return checkpoint


def export_dataset(ctx: TrainingContext, dataset: Dataset, cameras: set[str], out: Path) -> None:
    """Write ``dataset`` to ``out`` as LeRobot v3, with only the ``cameras`` images."""
    from stages.datasets.formats import Export, get_format
    from stages.datasets.importer import stored_export

    export = stored_export(dataset, ctx.store, ctx.task.control_hz)
    kept = tuple(replace(ep, images={k: v for k, v in ep.images.items() if k in cameras})
                 for ep in export.episodes)
    get_format("lerobot").write(out, Export(kept, export.task, export.obs_names,
                                            export.action_names, export.control_hz))


def _publisher(ctx: StageContext, stage: str, key: str, attempts: tuple[str, ...],
               run_id: str) -> Any:
    def publish(folder: Path, step: int) -> Checkpoint:
        path = ctx.scratch / f"lerobot-checkpoint-{key[:12]}-{step}.tar"
        checkpoint_tar(folder, path)
        checkpoint = ctx.store.publish(path, lambda digest, uri: Checkpoint(
            digest=digest, uri=uri, producer=ctx.producer(stage, STAGE_VERSION), parents=(),
            mlflow_run_id=run_id, stage=stage, iteration=step, run_key=key, attempts=attempts))
        path.unlink(missing_ok=True)
        ctx.store.set_ref(checkpoint_ref(key), checkpoint.digest)
        return checkpoint

    return publish


def _argv(python: Path, work: Path, resume: Path | None) -> list[str]:
    base = [str(python), "-I", "-m", "lerobot.scripts.lerobot_train"]
    if resume is None:
        return [*base, f"--config_path={work / 'train_config.json'}"]
    return [*base, f"--config_path={resume}", "--resume=true",
            f"--output_dir={work / 'train'}"]


def _prepare(ctx: TrainingContext, cfg: LeRobotTrainConfig, dataset: Dataset, work: Path,
             cameras: set[str], checkpoint: Checkpoint | None, device: str) -> Path | None:
    """Lay out ``work``: the dataset, LeRobot's config, and the restored checkpoint if any;
    returns the ``train_config.json`` to resume from (None: a fresh start)."""
    fresh_folder(work)
    export_dataset(ctx, dataset, cameras, work / "dataset")
    config = train_config(
        policy=cfg.policy, options=cfg.options, dataset_root=work / "dataset",
        repo_id=f"physai/{dataset.task}", output_dir=work / "train", device=device,
        seed=ctx.seed, steps=cfg.steps, batch_size=cfg.batch_size, save_freq=cfg.save_freq,
        log_freq=cfg.log_freq, num_workers=cfg.num_workers)
    (work / "train_config.json").write_text(json.dumps(config, indent=2))
    if checkpoint is None:
        return None
    folder = work / "train" / "checkpoints" / f"{checkpoint.iteration:06d}"
    restore_checkpoint(ctx.store.open_payload(checkpoint), folder)
    (folder.parent / "last").symlink_to(folder.name)
    resume = folder / "pretrained_model" / "train_config.json"
    repoint_config(resume, work / "train", work / "dataset")
    return resume


def _device(cfg: LeRobotTrainConfig) -> str:
    if cfg.device != "auto":
        return cfg.device
    from stages.orchestration.context import resolve_device

    return resolve_device("auto")


def train_stage(cfg: LeRobotTrainConfig, ctx: TrainingContext, stage: str,
                dataset: Dataset | None) -> Policy:
    """The ``lerobot`` algorithm's entry in :mod:`stages.training.algorithms` (module doc)."""
    file, spec = ctx.config_path, ctx.task
    if dataset is None:
        raise ConfigError.one(file, f"{stage}.algorithm", ALGORITHM, "LeRobot's trainer "
                              "learns from the collected dataset; add a collect section")
    require_python(ENVIRONMENT, f"{file}: {stage}.algorithm")
    check_options(cfg, file, stage)
    cameras = seen_cameras(cfg, spec, file, stage)
    key = run_key(stage, ctx, dataset)
    checkpoint = latest_checkpoint(ctx, key)
    attempts = checkpoint.attempts if checkpoint is not None else ()
    work = ctx.settings.home / "work" / ALGORITHM / key[:24]
    device = _device(cfg)
    with ctx.lineage.stage_run(ctx.experiment, stage, ctx.pipeline_run_id,
                               {"physai.algorithm": ALGORITHM, "physai.run_key": key}) as run:
        attempts = (*attempts, run.run_id)
        run.log_params({"algorithm": ALGORITHM, "policy": cfg.policy, "steps": cfg.steps,
                        "batch_size": cfg.batch_size, "device": device,
                        "cameras": ",".join(sorted(cameras)) or "none",
                        **{f"policy.{k}": v for k, v in cfg.options.items()}})
        if checkpoint is not None:
            run.set_tags({"physai.resumed_from.checkpoint": checkpoint.digest,
                          "physai.resumed_from.iteration": checkpoint.iteration,
                          "physai.previous_attempts": ",".join(checkpoint.attempts)})
            log.info("%s: resuming LeRobot's training from checkpoint %s at step %d of %d",
                     stage, checkpoint.digest[:12], checkpoint.iteration, cfg.steps)
            for attempt in checkpoint.attempts:
                if ctx.lineage.end_abandoned(attempt):
                    log.info("%s: attempt %s died; its run is marked KILLED", stage, attempt)
        last = _train(ctx, cfg, dataset, work, cameras, checkpoint, device, stage, key,
                      attempts, run)
        policy = _bring_in(ctx, cfg, stage, work, dataset, last, attempts, run)
    shutil.rmtree(work, ignore_errors=True)
    return policy


def _train(ctx: TrainingContext, cfg: LeRobotTrainConfig, dataset: Dataset, work: Path,
           cameras: set[str], checkpoint: Checkpoint | None, device: str, stage: str,
           key: str, attempts: tuple[str, ...], run: Any) -> Checkpoint:
    """Run LeRobot's trainer to ``cfg.steps`` (from ``checkpoint`` when given); returns the
    last checkpoint."""
    python = require_python(ENVIRONMENT, f"{ctx.config_path}: {stage}.algorithm")
    start = checkpoint.iteration if checkpoint is not None else 0
    if start >= cfg.steps and checkpoint is not None:
        return checkpoint
    resume = _prepare(ctx, cfg, dataset, work, cameras, checkpoint, device)
    publish = _publisher(ctx, stage, key, attempts, run.run_id)
    with ctx.progress.bar(f"{stage} (lerobot {cfg.policy})", cfg.steps) as bar:
        done = [start]
        bar.advance(start)

        def on_metrics(step: int, loss: float) -> None:
            run.log_metrics({"loss": loss}, step=step)
            run.flush()
            bar.advance(max(0, step - done[0]), loss=f"{loss:.4f}")
            done[0] = max(done[0], step)

        watch = run_training(_argv(python, work, resume), cwd=work, output_dir=work / "train",
                             steps=(start, cfg.steps, cfg.log_freq), on_checkpoint=publish,
                             on_metrics=on_metrics, timeout_s=TRAIN_TIMEOUT_S)
        bar.advance(max(0, cfg.steps - done[0]))
    if watch.curve:
        run.log_metrics({"final_loss": watch.curve[-1][1]}, step=watch.curve[-1][0])
    last = latest_checkpoint(ctx, key)
    if last is None or last.iteration < cfg.steps:
        raise PhysaiError(f"{ctx.config_path}: {stage}: LeRobot's trainer ended without a "
                          f"checkpoint of step {cfg.steps}")
    return last


def _bring_in(ctx: TrainingContext, cfg: LeRobotTrainConfig, stage: str, work: Path,
              dataset: Dataset, last: Checkpoint, attempts: tuple[str, ...], run: Any) -> Policy:
    """Export the last checkpoint's policy and check its parity (``import_lerobot``), then
    publish it with the dataset and the checkpoint as parents."""
    from stages.training.import_sources import Where
    from stages.training.imported import ImportConfig, import_lerobot

    spec = ctx.task
    with tempfile.TemporaryDirectory(dir=ctx.scratch) as tmp:
        folder = Path(tmp) / "checkpoint"
        restore_checkpoint(ctx.store.open_payload(last), folder)
        source = folder / "pretrained_model"
        imported = import_lerobot(
            ImportConfig(source=str(source), parity_tolerance=cfg.parity_tolerance),
            source, spec, Where(ctx.config_path, f"{stage}.policy"), Path(tmp))
    run.log_params({**{k: v for k, v in imported.params.items() if k != "lerobot_inputs"},
                    "checkpoint": last.digest})
    run.log_metrics({"parity_max_abs_diff": imported.parity_max_abs_diff, **imported.metrics})
    path = ctx.scratch / f"policy-{run.run_id}.onnx"
    path.write_bytes(imported.onnx)
    policy = ctx.publish(path, Policy, stage, STAGE_VERSION, (dataset.digest, last.digest),
                         run.run_id, task=spec.name, obs_dim=spec.obs_dim,
                         act_dim=spec.act_dim, hidden=(), algorithm=ALGORITHM,
                         attempts=attempts)
    run.set_tags({"physai.policy.digest": policy.digest, "physai.checkpoint.digest": last.digest,
                  "physai.train_attempts": ",".join(attempts)})
    log.info("%s: LeRobot %s trained %d steps, exported with parity %.2g (sha256 %s)", stage,
             cfg.policy, last.iteration, imported.parity_max_abs_diff, policy.digest[:12])
    return policy

"""The config of each pipeline stage: one frozen model per section of the pipeline YAML.

These are the sections alone, checked field by field; :mod:`stages.pipeline.config` puts them
together into a pipeline (the ``train:`` section through the algorithm registry, which names one of
these or a plugin's model) and checks the whole. Every model here is also importable from
:mod:`stages.pipeline.config`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from physai_core.errors import UnknownNameError
from stages.core.limits import (
    MAX_ITERATIONS,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    MAX_ROLLOUT,
    MAX_THREADS,
    MAX_VIDEO_SIDE,
    MAX_WORLDS,
    at_most,
    check_caps,
    duration,
    gib,
    worlds_cost,
)
from stages.core.schema import ConfigModel
from stages.core.units import ActionUnits

if TYPE_CHECKING:
    pass


EXPERT_HELP = (
    "'scripted' (the task's scripted expert), 'teacher' (this pipeline's PPO teacher stage), "
    "models:/NAME@ALIAS or models:/NAME/VERSION (a registered policy), a policy digest in "
    "the artifact store, or python:PACKAGE.MODULE:CALLABLE (Python code, a benchmark's "
    "scripted policy or a team's controller, with trust_code: true; docs/benchmarks.md)"
)


def expert_kind(expert: str) -> Literal["scripted", "teacher", "registry", "store", "python"]:
    """Which kind of expert a ``collect.expert`` value names (see :data:`EXPERT_HELP`)."""
    if expert in ("scripted", "teacher"):
        return expert  # type: ignore[return-value]
    if expert.startswith("python:"):
        from stages.core.code_refs import ref_problem

        problem = ref_problem(expert)
        if problem is not None:
            raise ValueError(problem)
        return "python"
    if expert.startswith("models:/"):
        return "registry"
    if re.fullmatch(r"(sha256:)?[0-9a-f]{64}", expert):
        return "store"
    raise ValueError(f"unknown expert; use {EXPERT_HELP}")


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Hosts a critic may be reached on over plain http: this machine."""


def critic_url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a critic endpoint (None: nothing): it must be http(s)
    with a host, https unless the host is this machine, and carry no user or password."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "is not an http(s) URL"
    if parts.scheme not in ("http", "https") or not host:
        return "is not an http(s) URL"
    if parts.scheme == "http" and host not in LOOPBACK_HOSTS:
        return ("is plain http to another machine; the critic needs https there (http only "
                "to localhost, 127.0.0.1 or ::1)")
    if "@" in parts.netloc:
        return "carries a user or password, which is never sent; give the key in " \
               "PHYSAI_COSMOS_API_KEY"
    return None


class CollectConfig(ConfigModel):
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
    trust_code: bool = Field(
        False, description="admit an expert given as Python code (python:...), which runs "
        "when it is imported")
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
    camera_keys: dict[str, str] = Field(
        default_factory=dict, description="a LeRobot source's feature of each task camera "
        "whose feature is not observation.images.<camera>, e.g. {front: observation.images.top} "
        "(as flows dataset import --camera-keys)",
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
                     "min_expert_success", "trust_code")
        if self.source is None:
            if expert_kind(self.expert) == "python" and not self.trust_code:
                raise PydanticCustomError(
                    "untrusted_code", "expert {expert} is Python code, which runs when it is "
                    "imported; admit it with trust_code: true", {"expert": self.expert})
            for name in ("format", "obs_keys", "action_units", "camera_keys"):
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
        if self.camera_keys and self.format != "lerobot":
            raise PydanticCustomError(
                "camera_keys_format", "camera_keys applies only to a source of format lerobot")
        return self

    @property
    def source_digest(self) -> str | None:
        """The store digest a ``sha256:DIGEST`` source names, else None."""
        if self.source is not None and re.fullmatch(r"sha256:[0-9a-f]{64}", self.source):
            return self.source.removeprefix("sha256:")
        return None


class Resources(ConfigModel):
    """What a training stage asks of its computer; becomes the ``dgx`` work pool's job
    variables, and ``nproc_per_node`` > 1 runs the stage under ``torchrun`` with DDP."""

    nodes: PositiveInt = Field(1, description="machines (torchrun --nnodes)")
    nproc_per_node: PositiveInt = Field(
        1, description="training processes per machine (torchrun --nproc-per-node); one per GPU"
    )
    gpus_per_node: int = Field(0, ge=0, description="GPUs per machine (nvidia.com/gpu)")
    cpus_per_node: PositiveInt | None = Field(None, description="CPU cores per machine")
    memory_gb: PositiveFloat | None = Field(None, description="memory per machine, GiB")

    @model_validator(mode="after")
    def _bounded(self) -> Resources:
        """At most :data:`~stages.core.limits.MAX_NODES` machines and
        :data:`~stages.core.limits.MAX_PROCS_PER_NODE` processes and GPUs on each."""
        per_node = "processes started by torchrun on one machine"
        check_caps("Resources", [
            ("nodes", self.nodes, MAX_NODES, f"{self.nodes:,} machines joined by torchrun"),
            ("nproc_per_node", self.nproc_per_node, MAX_PROCS_PER_NODE,
             f"{self.nproc_per_node:,} {per_node}"),
            ("gpus_per_node", self.gpus_per_node, MAX_PROCS_PER_NODE,
             f"{self.gpus_per_node:,} GPUs asked of one machine"),
        ])
        return self


class DaggerConfig(ConfigModel):
    """DAgger: the cloned policy (the student) drives the collect scene, the expert labels
    every state it visits, the labels join the dataset and the student is trained again."""

    rounds: PositiveInt = Field(description="rounds of roll out, label, aggregate, retrain "
                                "after the first cloning (at most 20)")
    episodes: PositiveInt = Field(description="student episodes recorded per round")
    beta: float = Field(0.5, ge=0, le=1, description="chance that a world executes the "
                        "expert's action instead of the student's in round 1; halved every "
                        "round after")
    epochs: PositiveInt | None = Field(None, description="training epochs per round, starting "
                                       "from the last round's weights; None: train.epochs")


class ChunkConfig(ConfigModel):
    """How a policy that emits chunks of actions runs (:class:`edge.runtime.ActionChunks`):
    the first ``execute`` actions of each chunk, then a new query; or a query every step and
    ACT's temporal ensembling of every chunk's action for the step, weighted ``exp(-m * i)``
    from the oldest (``ensemble: m``). Exactly one of the two."""

    execute: PositiveInt | None = Field(None, description="actions run from each chunk "
                                        "before the policy is asked again (at most its chunk "
                                        "size)")
    ensemble: float | None = Field(None, ge=0, allow_inf_nan=False, description="ACT's "
                                   "temporal ensembling: the policy is asked every step, the "
                                   "i-th oldest chunk's action for the step weighs exp(-m i) "
                                   "(ACT's default m: 0.01)")

    @model_validator(mode="after")
    def _one_way(self) -> ChunkConfig:
        if (self.execute is None) == (self.ensemble is None):
            raise PydanticCustomError("chunk_one_way", "give execute or ensemble, exactly one")
        return self

    def how(self) -> dict[str, int | float]:
        """The keyword :class:`edge.runtime.ActionChunks` takes: ``{"execute": n}`` or
        ``{"ensemble": m}``."""
        if self.execute is not None:
            return {"execute": self.execute}
        return {"ensemble": self.ensemble if self.ensemble is not None else 0.0}


MAX_CHUNK_SIZE = 256
"""Most actions one chunk of a cloned policy may hold."""


class TrainConfig(ConfigModel):
    """Behaviour cloning of the recorded actions with observation normalization. A task that
    sees (declares cameras) clones a policy that reads its camera images beside the state."""

    algorithm: Literal["bc"] = Field("bc", description="behaviour cloning")
    epochs: PositiveInt = Field(description="passes over the training split")
    batch_size: PositiveInt = Field(256, description="transitions per gradient step")
    lr: PositiveFloat = Field(1e-3, description="Adam learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    hidden: tuple[PositiveInt, ...] = Field((256, 256), min_length=1, description="widths of "
                                            "the MLP's hidden layers")
    val_fraction: float = Field(0.1, gt=0, lt=0.5, description="episodes held out for val loss")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where it trains: auto "
                                                  "(cuda when torch sees a GPU), cpu or cuda")
    resources: Resources = Field(default_factory=lambda: Resources(),
                                 description="what the stage asks of the cluster")
    image_shift: int = Field(4, ge=0, le=32, description="random-shift augmentation of "
                             "training camera images: pad by this many pixels (edge) and crop "
                             "back at a random offset; 0: none")
    encoder_channels: tuple[PositiveInt, ...] = Field(
        (16, 32), min_length=1, max_length=6, description="channels of the image encoder's "
        "convolutions; a spatial softmax turns the last into keypoints")
    dagger: DaggerConfig | None = Field(None, description="rounds of DAgger after the first "
                                        "cloning (a task with a scripted expert); None: "
                                        "cloning only")
    chunk_size: PositiveInt = Field(1, le=MAX_CHUNK_SIZE, description="actions the policy "
                                    "predicts at each step: the next chunk_size actions of the "
                                    "demonstration (the episode's last repeated past its end); "
                                    "1: one action a step. How the chunks run is "
                                    "validate.chunk")

    @model_validator(mode="after")
    def _student_acts_per_step(self) -> TrainConfig:
        if self.chunk_size > 1 and self.dagger is not None:
            raise PydanticCustomError(
                "chunk_with_dagger", "chunk_size above 1 with dagger: DAgger's student drives "
                "one action a step; set chunk_size to 1 or remove dagger")
        return self


class PPOConfig(ConfigModel):
    """PPO in the batched simulator through rsl_rl (the library Isaac Lab trains with)."""

    algorithm: Literal["ppo"] = Field("ppo", description="PPO through rsl_rl")
    scene: str = Field(description="scene file trained in, relative to the config file")
    iterations: PositiveInt = Field(description="PPO iterations (rollout, then update); at "
                                    "most 100,000")
    num_worlds: PositiveInt = Field(1024, description="worlds stepped together, per process "
                                    "(at most 65,536)")
    steps_per_iteration: PositiveInt = Field(24, description="control steps per world per rollout")
    learning_epochs: PositiveInt = Field(5, description="passes over each rollout per update")
    mini_batches: PositiveInt = Field(4, description="minibatches each pass splits the rollout "
                                      "into")
    lr: PositiveFloat = Field(1e-3, description="Adam learning rate (adapted to desired_kl)")
    desired_kl: PositiveFloat = Field(0.01, description="KL divergence per minibatch the "
                                      "adaptive learning rate aims at")
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    clip: PositiveFloat = Field(0.2, description="clip range of the probability ratio")
    entropy_coef: float = Field(0.005, ge=0, description="weight of the entropy bonus")
    max_grad_norm: PositiveFloat = Field(1.0, description="gradient norm clipped to this")
    init_noise_std: PositiveFloat = Field(0.4, description="initial action noise std")
    final_noise_std: PositiveFloat | None = Field(
        None, description="cap on the action noise std, lowered geometrically from "
        "init_noise_std to this over the first 3/4 of the run, so the deterministic policy "
        "that gets deployed walks without the noise it was trained with; None: no cap",
    )
    noise_correlation: float = Field(
        0.0, ge=0, lt=1, description="AR(1) correlation in time of the exploration noise "
        "(0: white noise, rsl_rl's default); see stages/training/rl_noise.py",
    )
    hidden: tuple[PositiveInt, ...] = Field((128, 128), min_length=1, description="widths of "
                                            "the actor's and the critic's hidden layers")
    checkpoint_every: PositiveInt = Field(
        25, description="iterations between checkpoints in the artifact store"
    )
    sim_threads: PositiveInt | None = Field(None, description="C threads stepping; None: all")
    update_threads: PositiveInt = Field(
        1, description="torch CPU threads of the PPO update; more than 1 pays only on an "
        "otherwise idle machine (OpenMP workers waiting beside other load slow it tenfold)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where it trains: auto "
                                                  "(cuda when torch sees a GPU), cpu or cuda")
    pipelined: bool = Field(
        False, description="collect the next rollout while the update runs, with the "
        "parameters of one update ago (OPPO's pipelined PPO, stages/training/pipelined_ppo.py): "
        "the "
        "update hides behind the collection where the two do not share the cores (update on "
        "a GPU, or cores to spare); the update then runs on one torch thread. Off by default: "
        "it changes what a run learns (on the quadruped it fails gates the sequential run "
        "passes, docs/validation.md)")
    resources: Resources = Field(default_factory=lambda: Resources(),
                                 description="what the stage asks of the cluster")

    @model_validator(mode="after")
    def _bounded(self) -> PPOConfig:
        """At most :data:`~stages.core.limits.MAX_WORLDS` worlds and
        :data:`~stages.core.limits.MAX_ITERATIONS` iterations, each said with its cost."""
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
            ("steps_per_iteration", self.steps_per_iteration, MAX_ROLLOUT // self.num_worlds,
             f"a rollout of {self.num_worlds:,} worlds x {self.steps_per_iteration:,} steps "
             f"keeps {rollout:,} transitions in memory until its update (at most "
             f"{MAX_ROLLOUT:,})"),
            ("update_threads", self.update_threads, MAX_THREADS,
             f"{self.update_threads:,} torch threads"),
            ("sim_threads", self.sim_threads or 1, MAX_THREADS,
             f"{self.sim_threads or 1:,} stepping threads"),
        ])
        return self


class CriticConfig(ConfigModel):
    """A Cosmos Reason endpoint that watches each scene's filmed rollout
    (stages/evaluation/critic.py).

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
    camera: str | None = Field(
        None, min_length=1,
        description="what the critic watches: unset, the filmed video (the task's video "
        "camera); policy, the frames the policy saw (its first camera); or the name of a "
        "camera the policy reads (front)")

    @field_validator("url")
    @classmethod
    def _reachable_safely(cls, url: str | None) -> str | None:
        """Checked at load, not when validation reaches the critic after training (a URL
        with a user or password would also be written into the run's resolved config)."""
        problem = None if url is None else critic_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url


class SimToSimConfig(ConfigModel):
    """The sim-to-sim check of a suite with a ``compare_backend`` (stages/evaluation/compare.py)."""

    margin: float = Field(0.1, ge=0, lt=1,
                          description="tolerated difference between the backends' success rates")
    alpha: float = Field(0.05, gt=0, lt=1, description="false-alarm level over the scenes")
    gate: bool = Field(False, description="promotion requires every scene to agree")


class SequentialConfig(ConfigModel):
    """The sequential scene gate (stages/evaluation/sequential.py): a scene looks at its episodes
    every ``chunk`` and stops once its verdict is clear, its episode count the most it spends."""

    chunk: PositiveInt = Field(10, description="episodes between two looks")
    indifference: float = Field(
        0.1, gt=0, lt=1, description="a policy this far above the scene's threshold passes "
        "with probability at least 1 - beta")
    alpha: float = Field(0.05, gt=0, lt=0.5,
                         description="most chance of passing a policy at the threshold")
    beta: float = Field(0.05, gt=0, lt=0.5, description="most chance of failing a policy "
                        "at the threshold plus the indifference")


class ValidateConfig(ConfigModel):
    """Roll the policy out over a scene suite and gate on the success-rate interval."""

    suite: str = Field(description="suite file, relative to the config file")
    min_success: float = Field(
        ge=0, le=1, description="each scene passes when its 95% Wilson lower bound is at least this"
    )
    scene_min_success: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
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
        None,
        description="a Cosmos Reason model judges each filmed scene (stages/evaluation/critic.py)")
    environment: str | None = Field(
        None, description="stage environment the scenes run in (stages/core/environments.py), "
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
    chunk: ChunkConfig | None = Field(
        None, description="how a policy that emits chunks of actions runs: {execute: n} "
        "(n actions of each chunk, then a new query) or {ensemble: m} (ACT's temporal "
        "ensembling); unset: all of each chunk. Packaging records it in the bundle's "
        "io.chunk; a policy of one action a step takes none")
    overlap_groups: PositiveInt = Field(
        1, description="groups a scene's worlds are split into, each an environment of its own "
        "stepping on one C thread while the policy runs for another (stages/sim/env/overlap.py); "
        "1: one environment. Group 0 keeps the scene's seed, group g is seeded as sequential "
        "chunk g, so the draws of a scene change with the count (the outcomes per world and "
        "seed do not change with the threads)")

    camera_tiles: str | None = Field(
        None, description="how a scene's cameras render (stages/sim/env/tiled.py): off (one world "
        "at a time), on (tiles of one framebuffer in the scene's process), auto, or a number "
        "of worker processes to spread the tiles over; the images are the same either way. "
        "Unset: $PHYSAI_CAMERA_TILES, else auto")

    @field_validator("camera_tiles", mode="before")
    @classmethod
    def _tiles_setting(cls, value: object) -> object:
        """YAML's ``off``/``on`` (booleans) and a process count as the setting's text."""
        if value is None:
            return None
        if isinstance(value, bool):
            return "on" if value else "off"
        text = str(value).strip().lower()
        if text in ("off", "on", "auto") or (text.isdigit() and not isinstance(value, float)
                                             and int(text) <= MAX_PROCS_PER_NODE):
            return text
        raise PydanticCustomError(
            "camera_tiles", "must be off, on, auto or a number of processes (at most "
            "{limit}), got {value!r}", {"value": value, "limit": MAX_PROCS_PER_NODE})

    @field_validator("video_size")
    @classmethod
    def _bounded_video(cls, value: tuple[int, int], info: ValidationInfo) -> tuple[int, int]:
        """Each side at most :data:`~stages.core.limits.MAX_VIDEO_SIDE` pixels, said in memory."""
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
            from stages.core.environments import get_environment

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


class PackageConfig(ConfigModel):
    """Export to ONNX, check parity and latency, and pack an edge bundle."""

    target: str = Field("jetson-agx-thor", description="edge target name")
    opset: PositiveInt = Field(17, description="ONNX opset the policy is exported to")
    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp16", description="precision of the TensorRT engine built on the target; the target "
        "must support it")
    control_hz: PositiveFloat = Field(25.0, description="control rate on the robot, Hz")
    max_latency_p99_ms: PositiveFloat = Field(
        2.0, description="gate on ONNX Runtime batch-1 p99 latency, ms"
    )
    parity_tolerance: PositiveFloat = Field(1e-5, description="max |onnx - torch| on dataset obs")
    latency_iters: PositiveInt = Field(2000, description="batch-1 calls timed for the latency "
                                       "gate")
    denoising_steps: PositiveInt | None = Field(
        None, description="denoising steps a diffusion policy runs per query on the robot "
        "(the manifest's io.diffusion.steps), timed by the latency gate; unset: the policy's "
        "own. Only for a diffusion policy")


class PromoteConfig(ConfigModel):
    """Register the model version; move the alias when every gate passes and the challenger is
    not worse than the current champion on the same frozen suite."""

    model_name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
                            description="registered model the version is added to")
    alias: str = Field("champion", pattern=r"^[a-z][a-z0-9_-]*$",
                       description="registry alias moved to the version when it passes")
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

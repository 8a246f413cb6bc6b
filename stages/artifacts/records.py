"""Typed artifacts: what each stage produces, with digest, location, producer and parents.

Every artifact's payload is one file in the artifact store, addressed by its sha256.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from stages.core.schema import DocumentedModel, FrozenModel


class FactorEffect(DocumentedModel):
    """One factor's association with failure in one scene."""

    name: str
    """The factor, as the episode records name it (``payload_mass``, ``target_x``)."""
    unit: str
    """Its unit."""
    effect: float
    """Change in the log-odds of failure per standard deviation of the factor (posterior
    mode); positive: more of the factor, more failures."""
    ci_low: float = Field(description="95% interval on the effect, lower bound")
    ci_high: float = Field(description="95% interval on the effect, upper bound")
    sd: float
    """The factor's standard deviation over the scene's episodes, in its unit."""
    mean_failed: float
    """The factor's mean over failed episodes (NaN without any)."""
    mean_succeeded: float
    """The factor's mean over successful episodes (NaN without any)."""


class Producer(FrozenModel):
    """What made an artifact: the stage, its version, the config digest and the code revision."""

    stage: str
    stage_version: str
    config_digest: str
    code_revision: str


class ArtifactBase(FrozenModel):
    """Fields common to every artifact."""

    kind: str
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the payload file "
                        "(64 lowercase hex digits, so the payload's path in the store is too)")
    uri: str = Field(description="where the payload lives in the store")
    producer: Producer
    parents: tuple[str, ...] = Field(description="digests of the artifacts this one was made from")
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    mlflow_run_id: str | None = None


class Dataset(ArtifactBase):
    """Demonstrations in robomimic-style HDF5 (``data/demo_N/{obs,actions,rewards,dones}``)."""

    kind: Literal["dataset"] = "dataset"
    task: str
    episodes: int
    transitions: int
    obs_names: tuple[str, ...]
    action_names: tuple[str, ...]
    scene_digest: str = Field(description="digest of the scene the episodes were recorded in")
    expert_success_rate: float
    expert: str = Field(
        "scripted", description="who labelled the actions: 'scripted', a teacher policy digest, "
        "or import:<format>:sha256:<source digest> for a dataset recorded elsewhere"
    )
    source_sha256: str | None = Field(
        None, description="sha256 of the file or folder an imported dataset came from"
    )
    source_format: str | None = Field(
        None, description="the dataset format it was imported from (isaaclab, minari, ...)"
    )


class Policy(ArtifactBase):
    """A trained policy: weights, normalizer and architecture in one ``.npz`` file."""

    kind: Literal["policy"] = "policy"
    task: str
    obs_dim: int
    act_dim: int
    hidden: tuple[int, ...]
    train_loss: float | None = Field(None, description="final behaviour-cloning loss")
    val_loss: float | None = Field(None, description="final held-out behaviour-cloning loss")
    algorithm: str = Field("bc", description="the training algorithm that made it (a name in "
                           "the algorithm registry, stages/training/algorithms.py)")
    scene_digest: str | None = Field(None, description="scene trained in (PPO)")
    mean_return: float | None = Field(None, description="mean training episode return at the end")
    attempts: tuple[str, ...] = Field(
        (), description="MLflow runs of every attempt, oldest first, when resumed from a checkpoint"
    )


class Checkpoint(ArtifactBase):
    """Training state mid-run (weights, optimizer, normalizer; ``torch.save`` of tensors only)."""

    kind: Literal["checkpoint"] = "checkpoint"
    stage: str
    iteration: int = Field(description="training iterations completed")
    run_key: str = Field(description="digest of what decides the run: stage, config, parents")
    attempts: tuple[str, ...] = Field(
        description="MLflow runs of the attempts so far, oldest first"
    )


class CriticVerdict(FrozenModel):
    """What the Cosmos critic said about one scene's filmed rollout."""

    model: str = Field(description="the model that judged")
    plausible: bool = Field(description="the motion is physically plausible")
    task_done: bool = Field(description="the task is done in every filmed episode")
    passed: bool = Field(description="plausible and done")
    reasoning: str = Field(description="the model's reasons, as it gave them")


class SequentialVerdict(FrozenModel):
    """How a sequential scene gate (stages/evaluation/sequential.py) decided a scene."""

    verdict: Literal["pass", "fail"]
    episodes: int = Field(description="episodes spent before the verdict")
    max_episodes: int = Field(description="the most the scene could have spent")
    chunk: int = Field(description="episodes between two looks")
    p_fail: float = Field(description="success rate at which the gate must fail")
    p_hold: float = Field(description="success rate at which the gate must pass")
    alpha: float = Field(description="exact chance of passing at p_fail")
    beta: float = Field(description="exact chance of failing at p_hold")
    method: str


class SceneResult(FrozenModel):
    """Success statistics of one scene of a suite."""

    scene: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float = Field(description="95% Wilson interval, lower bound")
    ci_high: float = Field(description="95% Wilson interval, upper bound")
    mean_return: float
    mean_final_reward: float
    video_digest: str | None = Field(None, description="rollout GIF of the first episodes")
    usd_digest: str | None = Field(
        None, description="the filmed episodes' body poses over time as a USD stage")
    critic: CriticVerdict | None = Field(None, description="the Cosmos critic's verdict")
    backend: str | None = Field(None, description="the simulator backend it ran on")
    factors: tuple[FactorEffect, ...] = Field(
        (), description="randomized factors ranked by their association with failure")
    episodes_digest: str | None = Field(
        None, description="every episode's conditions and outcome (a Parquet file)")
    failure_modes: dict[str, int] = Field(
        default_factory=dict, description="failed episodes by failure mode (fell, missed, or "
        "the policy's own reason)")
    outcomes: str = Field("", description="every episode's success in order: 1 or 0")
    sweep: dict[str, float] | None = Field(
        None, description="the sweep point it ran: each swept field's value")
    sequential: SequentialVerdict | None = Field(
        None, description="the sequential gate's verdict, where the scene stopped early or could")


class RolloutVideo(ArtifactBase):
    """A rollout of a policy in one scene, rendered offscreen (payload: an animated GIF)."""

    kind: Literal["rollout_video"] = "rollout_video"
    scene: str
    episodes: int = Field(description="episodes shown side by side")


class EpisodeRecords(ArtifactBase):
    """One scene's episodes, a row each: the conditions drawn for it, its outcome, return,
    failure mode and miss (payload: Parquet, each column's unit in its metadata; see
    :mod:`stages.evaluation.episodes`)."""

    kind: Literal["episode_records"] = "episode_records"
    scene: str
    episodes: int
    columns: tuple[str, ...]


class RolloutUsd(ArtifactBase):
    """The filmed episodes of a scene as a USD stage: every body's pose at every control step
    (payload: ``.usda``, see :mod:`stages.evaluation.usd`), for Isaac Sim, Omniverse and usdview."""

    kind: Literal["rollout_usd"] = "rollout_usd"
    scene: str
    episodes: int = Field(description="episodes, side by side along +y")
    steps: int = Field(description="time samples per body: the episode's control steps + 1")


class GateResult(FrozenModel):
    """One gate: what was measured, against what threshold, and whether it passed."""

    name: str
    measured: float
    threshold: float
    passed: bool
    detail: str = ""


class SceneAgreement(FrozenModel):
    """One scene on two simulator backends: do their success rates agree within a margin?"""

    scene: str
    first_successes: int
    first_episodes: int
    second_successes: int
    second_episodes: int
    difference: float = Field(description="second backend's rate minus the first's")
    difference_ci_low: float = Field(description="95% Newcombe interval, lower bound")
    difference_ci_high: float = Field(description="95% Newcombe interval, upper bound")
    p_value: float = Field(
        description="two-sided: the rates differ by more than the margin, Holm over scenes")
    agrees: bool = Field(description="p_value > alpha")


class SimToSim(FrozenModel):
    """The suite's scenes on its second backend (``compare_backend``), against the first."""

    backend: str
    backend_version: str
    margin: float = Field(description="tolerated difference in success rate (fraction)")
    alpha: float = Field(description="family-wise false-alarm level over the scenes")
    method: str
    scenes: tuple[SceneResult, ...]
    agreement: tuple[SceneAgreement, ...]
    agrees: bool


class SweepCurve(FrozenModel):
    """A scene's success over its sweep's grid (``sweep:`` in the scene file)."""

    scene: str
    fields: tuple[str, ...] = Field(description="the swept randomization fields, in order")
    points: tuple[SceneResult, ...] = Field(
        description="one result per grid point, its values in ``sweep``")


class SimReport(ArtifactBase):
    """Validation of a policy over a frozen scene suite (payload: ``report.json``)."""

    kind: Literal["sim_report"] = "sim_report"
    suite: str
    suite_digest: str
    backend: str
    backend_version: str
    scenes: tuple[SceneResult, ...]
    gates: tuple[GateResult, ...]
    passed: bool
    sim_to_sim: SimToSim | None = Field(
        None, description="every scene on the suite's second backend, and the agreement test")
    sweeps: tuple[SweepCurve, ...] = Field(
        (), description="each swept scene's success over its grid")


class EdgeBundle(ArtifactBase):
    """A deployable bundle (tar: ONNX model, manifest, on-target scripts) for one edge target."""

    kind: Literal["edge_bundle"] = "edge_bundle"
    target: str
    onnx_digest: str
    opset: int
    parity_max_abs_diff: float
    latency_p50_us: float
    latency_p99_us: float
    gates: tuple[GateResult, ...]
    passed: bool


Artifact = Annotated[
    Dataset | Policy | Checkpoint | SimReport | EdgeBundle | RolloutVideo | RolloutUsd
    | EpisodeRecords,
    Field(discriminator="kind"),
]
"""Any stored artifact, told apart by ``kind``."""

ARTIFACT_ADAPTER: TypeAdapter[
    Dataset | Policy | Checkpoint | SimReport | EdgeBundle | RolloutVideo | RolloutUsd
    | EpisodeRecords
] = TypeAdapter(Artifact)


class Promotion(FrozenModel):
    """Outcome of the promote stage: the registered version and whether the alias moved."""

    model_name: str
    version: str
    alias: str
    promoted: bool
    reasons: tuple[str, ...] = Field(description="why the alias did not move, empty if promoted")
    mlflow_run_id: str
    previous: str | None = Field(None, description="version the alias pointed at before")
    comparison: str = Field("", description="outcome of the test against that version")

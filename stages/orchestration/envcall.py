"""Call a stage in its stage environment (:mod:`stages.core.environments`): the caller's side.

The caller writes the stage's inputs as a typed record to a request file and starts the
environment's interpreter on :mod:`stages.pipeline.envrun`, the subprocess's side; the subprocess
loads the same config, runs the stage against the same store and MLflow (the state variables are
inherited) and writes the stage's result record, which the caller reads back. Nothing but
digests and records crosses. ``flows validate`` and ``flows compare`` use the same door for a
suite file (the ``validate-suite`` stage, whose config is the suite): the policy crosses as a
file the command resolved (a stored policy's payload, an imported ONNX, a verified bundle's
ONNX).

Where a step runs is decided in one place, :func:`placed`: a step declares the environment its
inputs need and the call that sends it there, and every call of it runs here or there
accordingly. This module imports no stage: the stages that may run elsewhere (training,
validation, the package stage's observations, the nightly's suite) call it, and
:mod:`stages.pipeline.envrun` calls them.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import numpy as np

from physai_core.errors import PhysaiError
from stages.artifacts.records import Dataset, Policy, SceneResult, SweepCurve
from stages.core.environments import INSIDE_ENV, ROOT, require_python, runs_here
from stages.orchestration.context import StageContext
from stages.orchestration.stage_table import env_entries

if TYPE_CHECKING:
    from stages.sections.models import ValidateConfig
    from stages.storage.store import ArtifactStore

log = logging.getLogger(__name__)

STAGES: tuple[str, ...] = tuple(env_entries())
"""Steps that may run in an environment of their own, from the stage table
(:func:`stages.orchestration.stage_table.env_entries`): the collect stage of a task whose
simulator lives there, one validation scene of a pipeline run, a
training stage (teacher or train) of a task whose simulator lives there, the package stage's rollout
observations, a whole suite as the nightly regression evaluates it, and a suite file as
``flows validate`` and ``flows compare`` evaluate it (the config is then the suite)."""


P = ParamSpec("P")
R = TypeVar("R")


class Placed(Generic[P, R]):
    """A step that runs where its inputs need it (:func:`placed`): calling it runs
    :attr:`here` in this process, or, when :attr:`where` names a stage environment this
    process is not, :attr:`there` in that environment's interpreter."""

    def __init__(self, here: Callable[P, R], where: Callable[P, str | None],
                 there: Callable[Concatenate[str, P], R]) -> None:
        self.here = here
        """The step in this process; the stage environment's side (:mod:`stages.pipeline.envrun`)
        calls it with the inputs it rebuilt from the request."""
        self.where = where
        """The stage environment a call's inputs need (None: any, so this process)."""
        self.there = there
        """Sends a call to that environment's interpreter, by its step name
        (:func:`stages.orchestration.stage_table.env_entries`), and reads its result back."""
        functools.update_wrapper(self, here)
        takes = _parameters(here)
        if _parameters(where) != takes or _parameters(there)[1:] != takes:
            raise TypeError(f"{here.__qualname__}: where and there take its parameters "
                            f"({', '.join(name for name, _ in takes)}), there after the "
                            "environment")

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the step where ``where(*args, **kwargs)`` says; its result."""
        environment = self.where(*args, **kwargs)
        if environment is not None and not runs_here(environment):
            return self.there(environment, *args, **kwargs)
        return self.here(*args, **kwargs)


def placed(where: Callable[P, str | None], there: Callable[Concatenate[str, P], R],
           ) -> Callable[[Callable[P, R]], Placed[P, R]]:
    """Decorate a step that may run in a stage environment: ``where`` takes the step's inputs
    and names the environment they need (None: any), ``there`` takes that environment and the
    same inputs and sends them through :func:`_run_in` (inputs the environment rebuilds from
    the config file and the inherited settings, such as the store, do not cross). The step
    itself stays reachable as :attr:`Placed.here` for the environment's side."""
    def wrap(here: Callable[P, R]) -> Placed[P, R]:
        return Placed(here, where, there)
    return wrap


def _parameters(function: Callable[..., object]) -> tuple[tuple[str, object], ...]:
    """The names and kinds of ``function``'s parameters, in order."""
    return tuple((p.name, p.kind) for p in inspect.signature(function).parameters.values())


class ConfigFile(Protocol):
    """What a stage environment needs of a resolved pipeline to load it again: its file."""

    @property
    def path(self) -> Path:
        """The pipeline's config file."""
        ...


@dataclass(frozen=True)
class SuiteEvaluation:
    """A suite file evaluated in a stage environment (:func:`validate_suite_in`)."""

    scenes: tuple[SceneResult, ...]
    sweeps: tuple[SweepCurve, ...]


def validate_scene_in(environment: str, cfg: ValidateConfig, policy: Policy, index: int,
                      ctx: StageContext, suite: object) -> SceneResult:
    """Run the validate-scene stage for scene ``index`` in ``environment``; its result. ``cfg``
    is the pipeline's validate section and ``suite`` its suite, which the environment reads
    from the same config."""
    stem = f"envrun-{environment}-{index}-{ctx.pipeline_run_id}"
    out = _run_in(environment, "validate-scene", ctx.config_path, ctx.scratch / stem,
                  {"index": index, "policy": policy.model_dump(mode="json")},
                  ["--run-id", ctx.pipeline_run_id], f"validate-scene {index}")
    return SceneResult.model_validate(out)


def evaluate_suite_in(environment: str, pipeline: ConfigFile, policy: Policy,
                      seed_offset: int, store: ArtifactStore) -> tuple[SceneResult, ...]:
    """The nightly's evaluation of ``policy`` over the suite of ``pipeline``, run in
    ``environment``; one result per scene. ``store`` is the one the environment opens from
    the inherited settings."""
    stem = f"envrun-{environment}-suite-{policy.digest[:12]}-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="physai-nightly-") as scratch:
        out = _run_in(environment, "evaluate-suite", pipeline.path, Path(scratch) / stem,
                      {"policy": policy.model_dump(mode="json"), "seed_offset": seed_offset},
                      [], "evaluate-suite")
    if not isinstance(out, list):
        raise PhysaiError(f"evaluate-suite in stage environment {environment!r} returned "
                          "no list of scene results")
    return tuple(SceneResult.model_validate(s) for s in out)


def train_in(environment: str, pipeline: object, ctx: StageContext, stage: str,
             dataset: Dataset | None) -> Policy:
    """Run training stage ``stage`` (``train`` or ``teacher``) in ``environment``; its policy.
    The ``pipeline`` does not cross: the environment loads it from the config file."""
    stem = ctx.scratch / f"envrun-{environment}-{stage}-{ctx.pipeline_run_id}"
    out = _run_in(environment, "train", ctx.config_path, stem,
                  {"stage": stage,
                   "dataset": dataset.model_dump(mode="json") if dataset else None},
                  ["--run-id", ctx.pipeline_run_id], stage)
    return Policy.model_validate(out)


def collect_in(environment: str, pipeline: object, ctx: StageContext,
               teacher: Policy | None) -> Dataset:
    """Run the collect stage in ``environment``; its dataset. The ``pipeline`` does not cross:
    the environment loads it from the config file."""
    stem = ctx.scratch / f"envrun-{environment}-collect-{ctx.pipeline_run_id}"
    out = _run_in(environment, "collect", ctx.config_path, stem,
                  {"teacher": teacher.model_dump(mode="json") if teacher else None},
                  ["--run-id", ctx.pipeline_run_id], "collect")
    return Dataset.model_validate(out)


def rollout_observations_in(environment: str, policy: Policy, ctx: StageContext,
                            where: object) -> np.ndarray:
    """The package stage's observations of ``policy``'s own rollouts, met in
    ``environment`` (:func:`stages.steps.package.rollout_observations`); shape (steps, obs_dim).
    ``where`` (the suite's first scene) does not cross: the environment reads it from the
    pipeline's config file."""
    stem = ctx.scratch / f"envrun-{environment}-observations-{policy.digest[:12]}"
    array = stem.with_name(stem.name + ".npy")
    _run_in(environment, "rollout-observations", ctx.config_path, stem,
            {"policy": policy.model_dump(mode="json"), "out": str(array)},
            ["--run-id", ctx.pipeline_run_id], "package observations")
    obs: np.ndarray = np.load(array, allow_pickle=False)
    array.unlink()
    return obs


def validate_suite_in(
    environment: str, suite: Path, policies: Sequence[Path | str], *, episodes: int | None,
    gates: ValidateConfig | None, sweeps: bool, scratch: Path,
) -> tuple[SuiteEvaluation, ...]:
    """Every scene of the suite file ``suite`` (and with ``sweeps`` every sweep point) with
    each policy of ``policies`` (a file, ``.npz`` or ONNX, loaded there by
    :func:`stages.policies.local.load_actor`, or Python code ``python:...`` imported there, the
    caller having admitted it), evaluated in ``environment`` as
    :func:`stages.evaluation.suite.evaluate_suite` and
    :func:`stages.evaluation.suite.evaluate_sweeps` do here, with ``episodes`` per scene (default:
    the suite's) and ``gates``' sequential design; one interpreter for them all, one evaluation
    per policy, in order."""
    stem = scratch / f"envrun-{environment}-suite-{os.getpid()}"
    body = {"policies": [str(p) for p in policies], "episodes": episodes, "sweeps": sweeps,
            "gates": gates.model_dump(mode="json") if gates is not None else None}
    out = _run_in(environment, "validate-suite", suite, stem, body, [], "validate-suite")
    if not isinstance(out, list) or len(out) != len(policies):
        raise PhysaiError(f"validate-suite in stage environment {environment!r} returned no "
                          f"record of scene results for each of {len(policies)} policies")
    return tuple(SuiteEvaluation(tuple(SceneResult.model_validate(r) for r in e["scenes"]),
                                 tuple(SweepCurve.model_validate(c) for c in e["sweeps"]))
                 for e in out)


def _run_in(environment: str, stage: str, config: Path, stem: Path, request_body: object,
            extra: list[str], what: str) -> object:
    """Run ``stage`` of ``config`` in ``environment``'s interpreter; its result record (JSON)."""
    python = require_python(environment, f"{config}: stage environment")
    stem.parent.mkdir(parents=True, exist_ok=True)
    request = stem.with_name(stem.name + ".request.json")
    result = stem.with_name(stem.name + ".result.json")
    request.write_text(json.dumps(request_body))
    result.unlink(missing_ok=True)
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, INSIDE_ENV: environment,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p)}
    cmd = [str(python), "-m", "stages.pipeline.envrun", str(config.resolve()), "--stage", stage,
           "--request", str(request), "--result", str(result), *extra]
    log.info("%s in environment %s: %s", what, environment, " ".join(cmd))
    # Its stdout goes to stderr too, line by line as it comes (a training stage's progress):
    # the simulator's own prints must not mix into what this command prints (a table, JSON).
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        tail: deque[str] = deque(maxlen=20)
        for line in proc.stdout or ():
            sys.stderr.write(line)
            if line.strip():
                tail.append(line.rstrip())
        code = proc.wait()
    request.unlink(missing_ok=True)
    if code != 0 or not result.is_file():
        last = tail[-1] if tail else ""
        raise PhysaiError(f"{what} in stage environment {environment!r} ({python}) failed "
                          f"with exit status {code}: {last}")
    out: object = json.loads(result.read_text())
    result.unlink()
    return out

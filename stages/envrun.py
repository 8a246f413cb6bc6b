"""Run one stage of a pipeline in its stage environment (:mod:`stages.environments`).

The pipeline writes the stage's inputs as a typed record to a request file and starts the
environment's interpreter on this module; the subprocess loads the same config, runs the
stage against the same store and MLflow (the state variables are inherited) and writes the
stage's result record, which the caller reads back. Nothing but digests and records crosses.
``flows validate`` and ``flows compare`` use the same door for a suite file (the
``validate-suite`` stage, whose config is the suite): the policy crosses as a file the
command resolved (a stored policy's payload, an imported ONNX, a verified bundle's ONNX).

    .venv-isaaclab/bin/python -m stages.envrun configs/reach.yaml --stage validate-scene \\
        --request request.json --result result.json --run-id RUN
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.artifacts import Dataset, Policy, SceneResult, SweepCurve
from stages.context import StageContext
from stages.environments import INSIDE_ENV, ROOT, require_python
from stages.errors import PhysaiError

if TYPE_CHECKING:
    from stages.config import ValidateConfig

log = logging.getLogger(__name__)

STAGES = ("validate-scene", "evaluate-suite", "train", "rollout-observations",
          "validate-suite")
"""Stages that may run in an environment of their own: one validation scene of a pipeline
run, a whole suite as the nightly regression evaluates it, a training stage (teacher or train)
of a task whose simulator lives there, the package stage's rollout observations, and a suite
file as ``flows validate`` and ``flows compare`` evaluate it (the config is then the suite)."""


@dataclass(frozen=True)
class SuiteEvaluation:
    """A suite file evaluated in a stage environment (:func:`validate_suite_in`)."""

    scenes: tuple[SceneResult, ...]
    sweeps: tuple[SweepCurve, ...]


def validate_scene_in(environment: str, policy: Policy, index: int,
                      ctx: StageContext) -> SceneResult:
    """Run the validate-scene stage for scene ``index`` in ``environment``; its result."""
    stem = f"envrun-{environment}-{index}-{ctx.pipeline_run_id}"
    out = _run_in(environment, "validate-scene", Path(ctx.pipeline.path), ctx.scratch / stem,
                  {"index": index, "policy": policy.model_dump(mode="json")},
                  ["--run-id", ctx.pipeline_run_id], f"validate-scene {index}")
    return SceneResult.model_validate(out)


def evaluate_suite_in(environment: str, config: Path, policy: Policy, seed_offset: int,
                      scratch: Path) -> tuple[SceneResult, ...]:
    """The nightly's evaluation of ``policy`` over the suite of ``config``, run in
    ``environment``; one result per scene."""
    stem = f"envrun-{environment}-suite-{policy.digest[:12]}-{os.getpid()}"
    out = _run_in(environment, "evaluate-suite", config, scratch / stem,
                  {"policy": policy.model_dump(mode="json"), "seed_offset": seed_offset}, [],
                  "evaluate-suite")
    if not isinstance(out, list):
        raise PhysaiError(f"evaluate-suite in stage environment {environment!r} returned "
                          "no list of scene results")
    return tuple(SceneResult.model_validate(s) for s in out)


def train_in(environment: str, stage: str, dataset: Dataset | None,
             ctx: StageContext) -> Policy:
    """Run training stage ``stage`` (``train`` or ``teacher``) in ``environment``; its policy."""
    stem = ctx.scratch / f"envrun-{environment}-{stage}-{ctx.pipeline_run_id}"
    out = _run_in(environment, "train", Path(ctx.pipeline.path), stem,
                  {"stage": stage,
                   "dataset": dataset.model_dump(mode="json") if dataset else None},
                  ["--run-id", ctx.pipeline_run_id], stage)
    return Policy.model_validate(out)


def rollout_observations_in(environment: str, policy: Policy, ctx: StageContext) -> np.ndarray:
    """The package stage's observations of ``policy``'s own rollouts, met in
    ``environment`` (:func:`stages.package.rollout_observations`)."""
    stem = ctx.scratch / f"envrun-{environment}-observations-{policy.digest[:12]}"
    array = stem.with_name(stem.name + ".npy")
    _run_in(environment, "rollout-observations", Path(ctx.pipeline.path), stem,
            {"policy": policy.model_dump(mode="json"), "out": str(array)},
            ["--run-id", ctx.pipeline_run_id], "package observations")
    obs: np.ndarray = np.load(array, allow_pickle=False)
    array.unlink()
    return obs


def validate_suite_in(
    environment: str, suite: Path, policies: Sequence[Path], *, episodes: int | None,
    gates: ValidateConfig | None, sweeps: bool, scratch: Path,
) -> tuple[SuiteEvaluation, ...]:
    """Every scene of the suite file ``suite`` (and with ``sweeps`` every sweep point) with
    each policy file of ``policies`` (``.npz`` or ONNX, loaded there by
    :func:`stages.policy.load_actor`), evaluated in ``environment`` as
    :func:`stages.validate.evaluate_suite` and :func:`stages.validate.evaluate_sweeps` do
    here, with ``episodes`` per scene (default: the suite's) and ``gates``' sequential
    design; one interpreter for them all, one evaluation per policy, in order."""
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


def _validate_suite(suite_file: str, request: dict[str, Any]) -> str:
    """The ``validate-suite`` stage in this process: its result record (JSON)."""
    from stages.config import ValidateConfig
    from stages.launch import LogProgress
    from stages.policy import load_actor
    from stages.sim.scene import load_suite
    from stages.validate import evaluate_suite, evaluate_sweeps

    suite = load_suite(Path(suite_file))
    given = request["gates"]
    gates = ValidateConfig.model_validate(given) if given is not None else None
    progress = LogProgress()
    out = []
    for policy in request["policies"]:
        act = load_actor(Path(policy))
        scenes = evaluate_suite(suite, act, episodes=request["episodes"], progress=progress,
                                gates=gates)
        curves = evaluate_sweeps(suite, act, episodes=request["episodes"], progress=progress) \
            if request["sweeps"] and suite.sweeps else ()
        out.append({"scenes": [r.model_dump(mode="json") for r in scenes],
                    "sweeps": [c.model_dump(mode="json") for c in curves]})
    return json.dumps(out)


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
    cmd = [str(python), "-m", "stages.envrun", str(config.resolve()), "--stage", stage,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a stage subprocess."""
    from stages.config import load_pipeline
    from stages.context import open_services, stage_context, use_progress
    from stages.launch import LogProgress
    from stages.policy import load_actor
    from stages.validate import evaluate_suite, validate_scene

    parser = argparse.ArgumentParser(prog="python -m stages.envrun")
    parser.add_argument("config")
    parser.add_argument("--stage", choices=STAGES, required=True)
    parser.add_argument("--request", required=True, help="the stage's inputs (JSON)")
    parser.add_argument("--result", required=True, help="where its result record goes (JSON)")
    parser.add_argument("--run-id", help="the pipeline's MLflow run (validate-scene)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"[{os.environ.get(INSIDE_ENV, 'env')}] %(message)s")
    try:
        request = json.loads(Path(args.request).read_text())
        if args.stage == "validate-suite":
            Path(args.result).write_text(_validate_suite(args.config, request))
            return 0
        pipeline = load_pipeline(args.config)
        if args.stage != "evaluate-suite" and not args.run_id:
            parser.error(f"{args.stage} needs --run-id")
        if args.stage == "train":
            from stages.pipeline import run_algorithm_here

            ctx = stage_context(pipeline, str(args.run_id), LogProgress())
            given = request["dataset"]
            trained = run_algorithm_here(ctx, str(request["stage"]),
                                         Dataset.model_validate(given) if given else None)
            Path(args.result).write_text(trained.model_dump_json())
            return 0
        policy = Policy.model_validate(request["policy"])
        if args.stage == "validate-scene":
            ctx = stage_context(pipeline, str(args.run_id), LogProgress())
            out = validate_scene(pipeline.config.validate_, policy, int(request["index"]), ctx)
            body = out.model_dump_json()
        elif args.stage == "rollout-observations":
            from stages.package import rollout_observations

            ctx = stage_context(pipeline, str(args.run_id), LogProgress())
            obs = rollout_observations(load_actor(ctx.store.open_payload(policy)), ctx)
            np.save(request["out"], obs)
            body = json.dumps({"out": request["out"], "shape": list(obs.shape)})
        else:
            _, store, _ = open_services()
            with use_progress(LogProgress()):
                results = evaluate_suite(pipeline.suite, load_actor(store.open_payload(policy)),
                                         seed_offset=int(request["seed_offset"]),
                                         label="nightly",
                                         device=pipeline.config.validate_.device)
            body = json.dumps([r.model_dump(mode="json") for r in results])
    except PhysaiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    Path(args.result).write_text(body)
    return 0


if __name__ == "__main__":
    # The result is written and every run flushed by now: leave without the interpreter's
    # teardown, which in Isaac Lab's environment (warp, Newton, USD) costs seconds a stage.
    status = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

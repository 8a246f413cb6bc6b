"""Run one stage of a pipeline in its stage environment (:mod:`stages.core.environments`): the
subprocess's side, the entry point the environment's interpreter runs.

The caller (:mod:`stages.orchestration.envcall`) writes the stage's inputs as a typed record to a
request file and starts the environment's interpreter on this module; the subprocess loads the same
config, runs the stage against the same store and MLflow (the state variables are inherited)
and writes the stage's result record, which the caller reads back. Nothing but digests and
records crosses. ``flows validate`` and ``flows compare`` use the same door for a suite file
(the ``validate-suite`` stage, whose config is the suite): the policy crosses as a file the
command resolved (a stored policy's payload, an imported ONNX, a verified bundle's ONNX).

    .venv-isaaclab/bin/python -m stages.pipeline.envrun configs/reach.yaml --stage validate-scene \\
        --request request.json --result result.json --run-id RUN
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from physai_core.errors import PhysaiError
from stages.artifacts.records import Dataset, Policy
from stages.core.code_refs import is_python_ref
from stages.core.environments import INSIDE_ENV
from stages.core.redaction import redact_urls
from stages.evaluation.suite import evaluate_suite, evaluate_sweeps
from stages.orchestration.context import open_services, use_progress
from stages.orchestration.stage_table import env_entries
from stages.pipeline.config import load_pipeline
from stages.pipeline.launch import LogProgress
from stages.pipeline.nightly import nightly_scenes
from stages.pipeline.run import parity_scene, run_algorithm, run_collect
from stages.pipeline.session import stage_context
from stages.policies.local import load_actor
from stages.policies.python_code import python_policy
from stages.sections.models import ValidateConfig
from stages.sim.suites.loading import load_suite
from stages.sim.tasks.catalog import get_task
from stages.steps.package import rollout_observations
from stages.steps.validate import validate_scene


def validate_suite_here(suite_file: str, run_id: str | None, request: dict[str, Any]) -> str:
    """The ``validate-suite`` step in this process: every policy of ``request`` over the suite
    file; its result record (JSON)."""
    suite = load_suite(Path(suite_file))
    given = request["gates"]
    gates = ValidateConfig.model_validate(given) if given is not None else None
    progress = LogProgress()
    out = []
    for policy in request["policies"]:
        act = (python_policy(policy, get_task(suite.config.task).action_range(), policy, "")
               if is_python_ref(policy) else load_actor(Path(policy)))
        scenes = evaluate_suite(suite, act, episodes=request["episodes"], progress=progress,
                                gates=gates)
        curves = evaluate_sweeps(suite, act, episodes=request["episodes"], progress=progress) \
            if request["sweeps"] and suite.sweeps else ()
        out.append({"scenes": [r.model_dump(mode="json") for r in scenes],
                    "sweeps": [c.model_dump(mode="json") for c in curves]})
    return json.dumps(out)


def train_here(config: str, run_id: str | None, request: dict[str, Any]) -> str:
    """The ``train`` step in this process: training stage ``request["stage"]`` on its dataset;
    the policy's record (JSON)."""
    pipeline = load_pipeline(config)
    ctx = stage_context(pipeline, str(run_id), LogProgress())
    given = request["dataset"]
    trained = run_algorithm.here(pipeline, ctx, str(request["stage"]),
                                 Dataset.model_validate(given) if given else None)
    return trained.model_dump_json()


def collect_here(config: str, run_id: str | None, request: dict[str, Any]) -> str:
    """The ``collect`` step in this process: the pipeline's demonstrations recorded with its
    expert (the teacher policy of the request, if any); the dataset's record (JSON)."""
    pipeline = load_pipeline(config)
    ctx = stage_context(pipeline, str(run_id), LogProgress())
    given = request["teacher"]
    dataset = run_collect.here(pipeline, ctx, Policy.model_validate(given) if given else None)
    return dataset.model_dump_json()


def validate_scene_here(config: str, run_id: str | None, request: dict[str, Any]) -> str:
    """The ``validate-scene`` step in this process: scene ``request["index"]``; its result
    record (JSON)."""
    pipeline = load_pipeline(config)
    ctx = stage_context(pipeline, str(run_id), LogProgress())
    policy = Policy.model_validate(request["policy"])
    out = validate_scene.here(pipeline.config.validate_, policy, int(request["index"]), ctx,
                              pipeline.suite)
    return out.model_dump_json()


def rollout_observations_here(config: str, run_id: str | None, request: dict[str, Any]) -> str:
    """The ``rollout-observations`` step in this process: the observations of the policy's
    own rollouts, saved to ``request["out"]``; where they are and their shape (JSON)."""
    pipeline = load_pipeline(config)
    ctx = stage_context(pipeline, str(run_id), LogProgress())
    policy = Policy.model_validate(request["policy"])
    obs = rollout_observations.here(policy, ctx, parity_scene(pipeline))
    np.save(request["out"], obs)
    return json.dumps({"out": request["out"], "shape": list(obs.shape)})


def evaluate_suite_here(config: str, run_id: str | None, request: dict[str, Any]) -> str:
    """The ``evaluate-suite`` step in this process: the nightly's evaluation of the policy over
    the pipeline's suite; one result record per scene (JSON)."""
    policy = Policy.model_validate(request["policy"])
    _, store, _ = open_services()
    with use_progress(LogProgress()):
        results = nightly_scenes.here(load_pipeline(config), policy,
                                      int(request["seed_offset"]), store)
    return json.dumps([r.model_dump(mode="json") for r in results])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a stage subprocess: runs the step that ``--stage`` names (one of
    :func:`stages.orchestration.stage_table.env_entries`)."""
    entries = env_entries()
    parser = argparse.ArgumentParser(prog="python -m stages.pipeline.envrun")
    parser.add_argument("config")
    parser.add_argument("--stage", choices=tuple(entries), required=True)
    parser.add_argument("--request", required=True, help="the stage's inputs (JSON)")
    parser.add_argument("--result", required=True, help="where its result record goes (JSON)")
    parser.add_argument("--run-id", help="the pipeline's MLflow run (validate-scene)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"[{os.environ.get(INSIDE_ENV, 'env')}] %(message)s")
    entry = entries[args.stage]
    if entry.needs_run_id and not args.run_id:
        parser.error(f"{args.stage} needs --run-id")
    try:
        request = json.loads(Path(args.request).read_text())
        body = entry.run(args.config, args.run_id, request)
    except PhysaiError as exc:
        print(f"error: {redact_urls(str(exc))}", file=sys.stderr)
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

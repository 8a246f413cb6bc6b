"""Run one stage of a pipeline in its stage environment (:mod:`stages.environments`).

The pipeline writes the stage's inputs as a typed record to a request file and starts the
environment's interpreter on this module; the subprocess loads the same config, runs the
stage against the same store and MLflow (the state variables are inherited) and writes the
stage's result record, which the caller reads back. Nothing but digests and records crosses.

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
from collections.abc import Sequence
from pathlib import Path

from stages.artifacts import Policy, SceneResult
from stages.context import StageContext
from stages.environments import INSIDE_ENV, ROOT, require_python
from stages.errors import PhysaiError

log = logging.getLogger(__name__)

STAGES = ("validate-scene",)
"""Stages that may run in an environment of their own."""


def validate_scene_in(environment: str, policy: Policy, index: int,
                      ctx: StageContext) -> SceneResult:
    """Run the validate-scene stage for scene ``index`` in ``environment``; its result."""
    where = f"{ctx.pipeline.path}: validate.environment"
    python = require_python(environment, where)
    stem = f"envrun-{environment}-{index}-{ctx.pipeline_run_id}"
    request, result = ctx.scratch / f"{stem}.request.json", ctx.scratch / f"{stem}.result.json"
    request.write_text(json.dumps({"index": index, "policy": policy.model_dump(mode="json")}))
    result.unlink(missing_ok=True)
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, INSIDE_ENV: environment,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p)}
    cmd = [str(python), "-m", "stages.envrun", str(Path(ctx.pipeline.path).resolve()),
           "--stage", "validate-scene", "--request", str(request), "--result", str(result),
           "--run-id", ctx.pipeline_run_id]
    log.info("validate-scene %d in environment %s: %s", index, environment, " ".join(cmd))
    done = subprocess.run(cmd, env=env, check=False, stderr=subprocess.PIPE, text=True)
    request.unlink(missing_ok=True)
    if done.returncode != 0 or not result.is_file():
        sys.stderr.write(done.stderr)
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        raise PhysaiError(f"validate-scene {index} in stage environment {environment!r} "
                          f"({python}) failed with exit status {done.returncode}: {last}")
    sys.stderr.write(done.stderr)
    scene = SceneResult.model_validate_json(result.read_text())
    result.unlink()
    return scene


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a stage subprocess."""
    from stages.config import load_pipeline
    from stages.context import stage_context
    from stages.launch import LogProgress
    from stages.validate import validate_scene

    parser = argparse.ArgumentParser(prog="python -m stages.envrun")
    parser.add_argument("config")
    parser.add_argument("--stage", choices=STAGES, required=True)
    parser.add_argument("--request", required=True, help="the stage's inputs (JSON)")
    parser.add_argument("--result", required=True, help="where its result record goes (JSON)")
    parser.add_argument("--run-id", required=True, help="the pipeline's MLflow run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"[{os.environ.get(INSIDE_ENV, 'env')}] %(message)s")
    try:
        pipeline = load_pipeline(args.config)
        request = json.loads(Path(args.request).read_text())
        ctx = stage_context(pipeline, args.run_id, LogProgress())
        out = validate_scene(pipeline.config.validate_,
                             Policy.model_validate(request["policy"]), int(request["index"]),
                             ctx)
    except PhysaiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    Path(args.result).write_text(out.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run a PPO stage under ``torchrun``: one process per GPU (or several on CPU), DDP over gloo
or NCCL.

The pipeline calls :func:`run_under_torchrun` when a stage's ``resources`` ask for more than
one process. It starts ``torchrun`` on this module; every rank loads the same pipeline config
and runs :func:`stages.training.ppo.train_ppo`, and rank 0 writes the published policy to a result
file that the caller reads back. On a cluster the ``dgx`` work pool's job runs the same
command on every node (see :func:`torchrun_command`).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m stages.pipeline.launch configs/locomotion.yaml --stage train --result policy.json
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

from physai_core.errors import PhysaiError
from stages.artifacts.records import Policy
from stages.orchestration.context import StageContext
from stages.pipeline.config import load_pipeline
from stages.pipeline.session import stage_context, start_pipeline, training_context
from stages.pipeline.stage_algorithm import stage_algorithm
from stages.sections.models import Resources

log = logging.getLogger(__name__)

RDZV_ENV = "PHYSAI_RDZV_ENDPOINT"
"""Rendezvous endpoint ``host:port`` of a multi-node torchrun job (every node gets the same)."""


def torchrun_command(
    resources: Resources, config: Path, stage: str, result: Path | None = None,
    run_id: str | None = None, rdzv_endpoint: str | None = None,
) -> list[str]:
    """The command that runs ``stage`` of ``config`` with ``resources`` under torchrun.

    One node runs standalone (a local rendezvous); several nodes meet at ``rdzv_endpoint``.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nproc-per-node", str(resources.nproc_per_node)]
    if resources.nodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise PhysaiError(f"{resources.nodes} nodes need a rendezvous endpoint: set "
                              f"{RDZV_ENV}=host:port on every node")
        cmd += ["--nnodes", str(resources.nodes), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv_endpoint]
    cmd += ["-m", "stages.pipeline.launch", str(config), "--stage", stage]
    if result is not None:
        cmd += ["--result", str(result)]
    if run_id is not None:
        cmd += ["--run-id", run_id]
    return cmd


def run_under_torchrun(ctx: StageContext, stage: str, resources: Resources) -> Policy:
    """Run a PPO stage of ``ctx``'s pipeline under torchrun; returns rank 0's policy."""
    result = ctx.scratch / f"torchrun-{stage}-{ctx.pipeline_run_id}.json"
    result.unlink(missing_ok=True)
    cmd = torchrun_command(resources, ctx.config_path.resolve(), stage, result,
                           ctx.pipeline_run_id, os.environ.get(RDZV_ENV))
    log.info("%s: %s", stage, " ".join(cmd))
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0 or not result.is_file():
        raise PhysaiError(f"{stage} under torchrun failed with exit status {done.returncode}")
    policy = Policy.model_validate_json(result.read_text())
    result.unlink()
    return policy


class LogProgress:
    """Progress as log lines (a torchrun rank has no terminal of its own)."""

    def bar(self, description: str, total: int) -> _LogBar:
        """A bar that logs every tenth of the way."""
        return _LogBar(description, total)


class _LogBar:
    def __init__(self, description: str, total: int) -> None:
        self.description, self.total, self.done, self.next_log = description, total, 0, 0

    def __enter__(self) -> _LogBar:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def advance(self, n: int = 1, **fields: object) -> None:
        self.done += n
        if self.done >= self.next_log or self.done == self.total:
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            log.info("%s %d/%d %s", self.description, self.done, self.total, extra)
            self.next_log = self.done + max(1, self.total // 10)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one torchrun rank."""
    parser = argparse.ArgumentParser(prog="python -m stages.pipeline.launch")
    parser.add_argument("config")
    parser.add_argument("--stage", choices=("train", "teacher"), default="train")
    parser.add_argument("--result", help="file rank 0 writes the policy's JSON record to")
    parser.add_argument("--run-id", help="parent MLflow run (default: a new pipeline run)")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s")
    pipeline = load_pipeline(args.config)
    cfg = pipeline.config.teacher if args.stage == "teacher" else pipeline.config.train
    algorithm = stage_algorithm(pipeline, args.stage)
    if cfg is None or algorithm is None or not algorithm.distributed:
        raise PhysaiError(f"{args.config}: {args.stage} runs no algorithm that trains on "
                          "several processes")
    run_id = args.run_id or (start_pipeline(pipeline) if rank == 0 else "")
    ctx = stage_context(pipeline, run_id, LogProgress())
    policy = algorithm.train(cfg, training_context(pipeline, ctx, args.stage), args.stage, None)
    if rank == 0 and args.result:
        Path(args.result).write_text(json.dumps(policy.model_dump(mode="json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Deployments and workers of the three computers: ``flows deploy`` and ``flows worker POOL``.

``flows deploy`` makes the Prefect server hold what the three computers need: one work pool per
computer (process pools, or with ``--kubernetes`` Kubernetes pools whose base job templates
live in ``configs/k8s/<computer>.yaml``), a deployment of the pipeline flow for every config in
``configs/``, and for each config the nightly sim regression of its model's ``@champion`` on a
cron schedule, one run at a time. It reads
what the server holds first and writes only what differs, so deploying twice changes nothing.
``--dry-run`` contacts no server: it prints the plan and, for Kubernetes pools, the Job
manifest of every stage of every config, each checked against the Kubernetes API models.

``flows worker POOL`` starts a Prefect worker that polls one of the three pools.

This module is the command line; the plan is :mod:`flows.deploy_plan`, applying it
:mod:`flows.deploy_apply`, and the Kubernetes job templates :mod:`flows.k8s_templates`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from flows.deploy_apply import apply_plan, prefect_api_url
from flows.deploy_plan import NIGHTLY_CRON, NIGHTLY_TIMEZONE, DeployPlan, Outcome, plan_deployments
from physai_core.errors import ConfigError, PhysaiError, UnknownNameError
from stages.orchestration.stage_table import COMPUTERS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def _plan_table(plan: DeployPlan, outcomes: Iterable[Outcome], title: str) -> Table:
    """One row per pool and deployment: where it runs, what it holds, what deploying did."""
    from rich.table import Table

    action = {(o.kind, o.name): o.action for o in outcomes}
    table = Table(title=title, title_justify="left")
    for column in ("kind", "name", "work pool", "what", "status"):
        table.add_column(column)
    for pool in plan.pools:
        image = pool.base_job_template["variables"]["properties"].get("image", {})
        what = (f"kubernetes ({pool.template_file})" if pool.template_file
                else f"docker ({image.get('default')})" if pool.type == "docker"
                else f"{pool.type} worker")
        table.add_row("work pool", pool.name, pool.name, what,
                      action.get(("work pool", pool.name), ""))
    for d in plan.deployments:
        if d.cron:
            what = (f"{d.entrypoint}, cron {d.cron!r} {d.timezone}, "
                    f"{d.concurrency_limit} at a time (cancel new)")
        else:
            what = f"{d.entrypoint}, config_path={d.parameters.get('config_path')}"
        table.add_row("deployment", d.full_name, d.work_pool, what,
                      action.get(("deployment", d.full_name), ""))
    return table


def _print_jobs(console: Console, plan: DeployPlan) -> None:
    """The rendered Job manifests, as one YAML stream."""
    import yaml

    for job in plan.jobs:
        header = f"# {job.config} {job.stage} -> work pool {job.pool} ({job.template_file})"
        body = yaml.safe_dump(job.manifest, sort_keys=False)
        console.print(f"---\n{header}\n{body}", end="", soft_wrap=True, highlight=False,
                      markup=False)


def cmd_deploy(args: argparse.Namespace, console: Console) -> int:
    """Create or update the work pools and deployments, or print the plan (``--dry-run``)."""
    from flows.servers import prepare_environment

    prepare_environment()
    configs = [Path(c) for c in args.configs] or sorted(Path("configs").glob("*.yaml"))
    if not configs:
        raise ConfigError.one("configs", "", "configs/*.yaml", "no pipeline configs to deploy")
    if args.docker and args.kubernetes:
        raise ConfigError.one("flows deploy", "--docker", "", "give --docker or --kubernetes")
    if args.secret and not args.docker:
        raise ConfigError.one("flows deploy", "--secret", "", "only Docker pools (--docker) "
                              "take Secret block references")
    project_dir = args.project_dir
    if project_dir is None:
        from flows.images import PROJECT_DIR

        project_dir = PROJECT_DIR if args.docker else "."
    plan = plan_deployments(
        configs, kubernetes=args.kubernetes, templates=Path(args.templates),
        project_dir=Path(project_dir).resolve(), nightly_cron=args.nightly_cron,
        timezone=args.timezone, dispatch=not args.no_dispatch,
        docker=args.volume if args.docker else None, secrets=args.secret,
    )
    if args.dry_run:
        planned = [Outcome("work pool", p.name, "planned") for p in plan.pools]
        planned += [Outcome("deployment", d.full_name, "planned") for d in plan.deployments]
        console.print(_plan_table(plan, planned, "flows deploy --dry-run (no server contacted)"))
        if plan.jobs:
            console.print(f"{len(plan.jobs)} stage Jobs, each checked against the Kubernetes "
                          "API models:", highlight=False)
            _print_jobs(console, plan)
        else:
            kind = "docker" if args.docker else "process"
            console.print(f"{kind} pools: no Job manifests (--kubernetes renders and checks "
                          f"them from {args.templates}/)", highlight=False, markup=False)
        return 0
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = prefect_api_url()
    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        error = client.api_healthcheck()
        if error is not None:
            raise PhysaiError(f"the Prefect API at {url} does not answer: {error}")
        outcomes = apply_plan(plan, client)
    console.print(_plan_table(plan, outcomes, f"flows deploy -> {url}"))
    pools = " | ".join(p.name for p in plan.pools)
    console.print(f"start a worker per pool: flows worker {pools}", highlight=False)
    return 0


def worker_command(pool: str, worker_type: str | None = None, name: str | None = None,
                   limit: int | None = None, run_once: bool = False) -> list[str]:
    """The ``prefect worker start`` command line for ``pool`` (without a type, Prefect uses the
    pool's own, or a process worker when the pool does not exist yet)."""
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool]
    if worker_type:
        cmd += ["--type", worker_type]
    if name:
        cmd += ["--name", name]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if run_once:
        cmd.append("--run-once")
    return cmd


def cmd_worker(args: argparse.Namespace, console: Console) -> int:
    """Start a Prefect worker for one of the three pools; returns when the worker exits."""
    from flows.workpools import work_pool

    pools = {work_pool(c): c for c in COMPUTERS}
    if args.pool not in pools:
        raise UnknownNameError("work pool", args.pool, pools)
    from flows.servers import prepare_environment

    prepare_environment()
    url = prefect_api_url()
    cmd = worker_command(args.pool, args.type, args.name, args.limit, args.run_once)
    console.print(f"worker for {pools[args.pool]}'s pool {args.pool!r} at {url}; "
                  "stop it with Ctrl-C", highlight=False, markup=False)
    return supervise(subprocess.Popen(cmd, env=dict(os.environ)))


STOP_GRACE_S = 30.0
"""Seconds a child has to exit after a forwarded SIGTERM or SIGINT before it is killed."""


def supervise(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc``, passing SIGTERM and SIGINT on to it, so a supervisor (systemd,
    Kubernetes, Ctrl-C) that stops this process stops the child too; a child still running
    :data:`STOP_GRACE_S` after the signal is killed. Returns the child's exit status (128 + N
    for a child ended by signal N, as a shell reports it)."""
    stopping: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)
            stopping.append(time.monotonic())

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                return 128 - code if code < 0 else code
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > STOP_GRACE_S:
                    proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows deploy``, ``flows worker`` and ``flows images`` to the ``flows`` command
    line."""
    from flows.images import register as register_images

    register_images(sub)
    deploy = sub.add_parser("deploy", help="create the work pools and deployments on the "
                            "Prefect server (idempotent)")
    deploy.add_argument("configs", nargs="*",
                        help="pipeline configs to deploy (default: configs/*.yaml)")
    deploy.add_argument("--kubernetes", action="store_true",
                        help="Kubernetes work pools from the templates, not process pools")
    deploy.add_argument("--templates", default="configs/k8s",
                        help="folder of the Kubernetes base job templates, <computer>.yaml")
    deploy.add_argument("--docker", action="store_true",
                        help="Docker work pools: each flow run in a container of its "
                             "computer's image (make images; prefect-docker)")
    deploy.add_argument("--volume", action="append", default=[], metavar="SRC:DST[:ro]",
                        help="with --docker, a folder the containers mount besides the state "
                             "folder (repeatable)")
    deploy.add_argument("--secret", action="append", default=[], metavar="VAR=BLOCK",
                        help="with --docker, a credential the containers get in VAR from the "
                             "Prefect Secret block BLOCK, which the job template names and the "
                             "worker reads (repeatable; credentials never enter the template)")
    deploy.add_argument("--project-dir", default=None,
                        help="where flow runs start: this checkout, or the project's folder "
                             "in the image (default: the current directory; with --docker "
                             "the image's /opt/physai-flows); a deployment runs only configs "
                             "inside it")
    deploy.add_argument("--nightly-cron", default=NIGHTLY_CRON,
                        help=f"schedule of the nightly regression (default: {NIGHTLY_CRON!r})")
    deploy.add_argument("--timezone", default=NIGHTLY_TIMEZONE,
                        help=f"time zone of the schedule (default: {NIGHTLY_TIMEZONE})")
    deploy.add_argument("--no-dispatch", action="store_true",
                        help="run each pipeline whole on the dgx pool instead of each stage "
                             "on its own computer's pool")
    deploy.add_argument("--dry-run", action="store_true",
                        help="print the plan and the Job manifests; contact no server")
    deploy.set_defaults(func=cmd_deploy)
    worker = sub.add_parser("worker", help="start a Prefect worker for a work pool")
    worker.add_argument("pool", help="dgx, ovx or jetson (or their PHYSAI_POOL_<X> names)")
    worker.add_argument("--type", default=None,
                        help="worker type (default: the pool's; process for a new pool)")
    worker.add_argument("--name", default=None, help="worker name shown in the Prefect UI")
    worker.add_argument("--limit", type=int, default=None, help="most flow runs at a time")
    worker.add_argument("--run-once", action="store_true",
                        help="poll once, run what is due, then exit")
    worker.set_defaults(func=cmd_worker)

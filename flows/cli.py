"""The ``flows`` command line.

``flows run CONFIG`` runs a pipeline through Prefect with a progress bar per stage and a summary
table; ``flows lineage models:/NAME@ALIAS`` prints the chain back to the raw data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.tree import Tree

from flows.bundle_cli import trust_key
from flows.servers import prepare_environment
from physai_core.errors import PhysaiError
from stages.core.redaction import redact_urls

if TYPE_CHECKING:
    pass


def cmd_server(args: argparse.Namespace, console: Console) -> int:
    """Start or stop the local Prefect and MLflow servers."""
    from flows import servers
    from stages.core.settings import resolve_settings

    settings = resolve_settings()
    if args.action == "up":
        stores = servers.Stores(args.prefect_database, args.mlflow_database,
                                args.mlflow_artifacts)
        stores.check()  # before anything is written
        if servers.running(settings):  # up returns them as they are, on their own stores
            stores = servers.Stores()
        settings.home.mkdir(parents=True, exist_ok=True)
        servers.raise_on_stop_signals()
        try:
            started = servers.up(settings, args.prefect_port, args.mlflow_port, stores)
        except servers.Stopped as stop:
            console.print(f"stopped by {stop} while starting; nothing left running",
                          highlight=False)
            return 128 + stop.signum
        try:  # a signal may come while this prints: the servers are up by now
            for s in started:
                on = stores.where(s.name)
                console.print(f"{s.name:<8} {s.url}  (pid {s.pid}, log {s.log})"
                              + (f"  on {on}" if on else ""), soft_wrap=True, highlight=False,
                              markup=False)
            if not args.foreground:
                console.print("flows run now reports to these servers; stop them with: "
                              "flows server down", highlight=False)
                return 0
            console.print("serving in the foreground; SIGTERM or Ctrl-C stops both servers",
                          highlight=False)
        except servers.Stopped as stop:
            if not args.foreground:
                console.print(f"stopped by {stop}; the servers run on (flows server down "
                              "stops them)", highlight=False)
                return 128 + stop.signum
            servers.down(settings)
            why = f"stopped by {stop}"
        else:
            why = servers.wait_foreground(settings, started)
        console.print(f"servers stopped ({why})", highlight=False)
        return 0 if why.startswith("stopped by") else 1
    else:
        stopped = servers.down(settings)
        console.print(f"stopped: {', '.join(s.name for s in stopped) or 'nothing was running'}",
                      highlight=False)
    return 0


def config_file(arg: str) -> Path:
    """The pipeline config a command line names: a path, or ``pkg:PACKAGE/PATH``, a file
    inside an installed package (:mod:`stages.core.resources`, as scenes and task files name
    them). A ``pkg:`` one that is malformed, whose package is not installed or that names no
    file there is a one-line :class:`ConfigError`."""
    from physai_core.errors import ConfigError
    from stages.core.resources import is_resource, resolve_file

    if not is_resource(arg):
        return Path(arg)
    try:
        path = resolve_file(arg, Path.cwd())
    except ValueError as exc:
        raise ConfigError.one(arg, "", arg, str(exc)) from None
    if not path.is_file():
        package = arg.removeprefix("pkg:").partition("/")[0]
        raise ConfigError.one(arg, "", str(path), f"no such file in the package {package!r}")
    return path


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """Check the config whole, then run the pipeline flow and print the summary."""
    from stages.pipeline.config import load_pipeline

    config = config_file(args.config)
    pipeline = load_pipeline(config)
    if pipeline.config.validate_.environment is not None:  # before anything is written
        from stages.core.environments import require_python

        require_python(pipeline.config.validate_.environment,
                       f"{args.config}: validate.environment")
    prepare_environment()
    from flows.console import RichProgress, summary_lines, summary_table
    from stages.orchestration.context import use_progress

    start = time.perf_counter()
    with RichProgress(console) as progress, use_progress(progress):
        if args.direct:
            from stages.pipeline.run import run_direct

            result = run_direct(pipeline, progress)
        else:
            from flows.pipeline import pipeline_flow
            from flows.runners import api_for_workers, make_task_runner

            flow = pipeline_flow.with_options(
                task_runner=make_task_runner(args.task_runner, args.ray_address)
            )
            with api_for_workers(args.task_runner):
                result = flow(config_path=str(config), refresh=args.refresh)
    console.print(summary_table(result, time.perf_counter() - start))
    for line in summary_lines(result):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    """Check a pipeline config whole (every scene, task file, algorithm and target), run
    nothing, write nothing, and print what it would run where."""
    from stages.orchestration.stage_table import stage_def
    from stages.pipeline.config import load_pipeline
    from stages.pipeline.stage_algorithm import stage_algorithm

    pipeline = load_pipeline(config_file(args.config))
    spec = pipeline.task
    lines = [f"config: {args.config}", f"task: {spec.name} ({spec.obs_dim} observations, "
             f"{spec.act_dim} actions, {spec.control_hz:g} Hz)"]
    for stage in pipeline.stages:
        algorithm = stage_algorithm(pipeline, stage)
        how = f" ({algorithm.name})" if algorithm is not None else ""
        lines.append(f"stage: {stage}{how} on {stage_def(stage).computer}")
    scenes = ", ".join(s.scene.name for s in pipeline.suite.scenes)
    lines.append(f"suite: {pipeline.suite.name} [{scenes}] {pipeline.suite_digest[:12]}")
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    return 0


def cmd_keys(args: argparse.Namespace, console: Console) -> int:
    """Print every key of the files of ``args.kind`` (all kinds by default) as Markdown
    tables, the installed plugins' training algorithms included unless ``--shipped``."""
    from stages.pipeline.config_reference import KINDS, reference

    kinds = (args.kind,) if args.kind else KINDS
    page = reference(kinds, shipped_only=args.shipped)
    console.print(page, soft_wrap=True, highlight=False, markup=False, emoji=False, end="")
    return 0


def cmd_lineage(args: argparse.Namespace, console: Console) -> int:
    """Print the lineage chain of a registered model version, verifying every digest."""
    from stages.orchestration.context import open_services
    from stages.tracking.trace import trace_model

    _, store, lineage = open_services()
    chain = trace_model(args.model_uri, store, lineage)
    m = chain.model
    tree = Tree(f"[bold]{args.model_uri}[/] -> {m.name} version {m.version} "
                f"(aliases: {', '.join(m.aliases) or 'none'}; source {m.source})")

    def mark(role: str) -> str:
        link = chain.link(role)
        ok = "[green]verified[/]" if link.verified else f"[red]NOT VERIFIED[/] ({link.error})"
        return f"{role} {link.digest} {ok}"

    tags = m.tags
    tree.add(f"{mark('bundle')}  package run {tags.get('physai.package_run_id')}")
    tree.add(f"{mark('sim_report')}  suite {tags.get('physai.suite_digest', '?')[:16]}  "
             f"validation run {tags.get('physai.validate_run_id')}")
    training = tags.get("physai.training", "bc")
    attempts = tags.get("physai.train_attempts", "")
    resumed = f", attempts {attempts.replace(',', ' then ')}" if "," in attempts else ""
    leaf = tree.add(f"{mark('policy')}  {training} training run "
                    f"{tags.get('physai.train_run_id')}{resumed}")
    if "physai.source.digest" in tags:
        leaf.add(f"source {tags['physai.source.digest']} ({tags.get('physai.source.kind')}) "
                 f"{tags.get('physai.source.uri')}", highlight=False)
    if chain.has("dataset"):
        leaf = leaf.add(f"{mark('dataset')}  collection run {tags.get('physai.collect_run_id')}")
    if chain.has("teacher"):
        leaf = leaf.add(f"{mark('teacher')}  teacher training run "
                        f"{tags.get('physai.teacher_run_id')}")
    leaf.add(f"code revision {tags.get('physai.code_revision')}")
    console.print(tree)
    return 0 if chain.verified else 1


def cmd_engine(args: argparse.Namespace, console: Console) -> int:
    """Build the TensorRT engine of a bundle on this machine, or record a report, in MLflow."""
    import json

    from physai_core.errors import ConfigError
    from stages.orchestration.context import open_services
    from stages.tracking.engine_record import (
        build_from_bundle,
        check_bundle_digest,
        check_report_matches_bundle,
        read_engine_report,
        record_engine,
    )

    if args.action == "report":
        path = Path(args.file)
        report = read_engine_report(path)
        if args.allow_unsigned or args.trust:
            raise ConfigError.one(path, "--trust" if args.trust else "--allow-unsigned",
                                  args.trust or True, "only engine build takes it")
        bundle_digest = (check_bundle_digest(args.bundle_digest, path)
                         if args.bundle_digest is not None else None)
        prepare_environment()
        _, store, lineage = open_services()
        if bundle_digest is not None:
            if not store.has(bundle_digest):
                raise ConfigError.one(path, "--bundle-digest", bundle_digest,
                                      "no bundle with this digest in the store")
            check_report_matches_bundle(report, store.open_payload(store.get(bundle_digest)),
                                        path)
    else:
        path = Path(args.file)
        if not path.is_file():
            raise ConfigError.one(path, "", None, "bundle file not found")
        report, bundle_digest = build_from_bundle(
            path, Path(args.out) if args.out else None, precision=args.precision,
            builder=args.builder, any_gpu=args.any_gpu, trust_key=trust_key(args),
            allow_unsigned=args.allow_unsigned)
        console.print(json.dumps(report["check"]), soft_wrap=True, highlight=False, markup=False)
        prepare_environment()
        _, _, lineage = open_services()
    run_id, model_id = record_engine(report, lineage, experiment=args.experiment,
                                     bundle_digest=bundle_digest)
    verdict = "passed" if report["passed"] else "FAILED"
    console.print(f"engine {report['engine_sha256'][:16]} ({report['precision']}, TensorRT "
                  f"{report['tensorrt']}, {report['gpu']}) {verdict}; MLflow run {run_id}, "
                  f"external model {model_id}", soft_wrap=True, highlight=False, markup=False)
    return 0 if report["passed"] else 1


def cmd_nightly(args: argparse.Namespace, console: Console) -> int:
    """Run the nightly sim regression of a config's champion now, through Prefect."""
    from rich.markdown import Markdown

    from stages.pipeline.config import load_pipeline
    from stages.pipeline.nightly import RegressionDetected

    config = config_file(args.config)
    load_pipeline(config)
    prepare_environment()
    from flows.console import RichProgress
    from flows.nightly import nightly_regression
    from stages.orchestration.context import use_progress

    with RichProgress(console) as progress, use_progress(progress):
        state = nightly_regression(config_path=str(config), alias=args.alias,
                                   seed_offset=args.seed_offset, return_state=True)
    outcome = state.result(raise_on_failure=False)
    if isinstance(outcome, RegressionDetected):
        console.print(Markdown(outcome.markdown))
        raise outcome
    if isinstance(outcome, BaseException):
        raise outcome
    console.print(Markdown(outcome["markdown"]))
    return 0


def cmd_promote(args: argparse.Namespace, console: Console) -> int:
    """Roll an alias back, move it to a gated version, or show its history; compare-and-set."""
    from rich.table import Table

    from physai_core.errors import ConfigError
    from stages.orchestration.context import open_services
    from stages.tracking import aliases as registry

    prepare_environment()
    _, _, lineage = open_services()
    model, alias = args.model, args.alias
    if args.rollback:
        change = registry.rollback_alias(lineage, model, alias, args.why or "rollback")
        console.print(f"models:/{model}@{alias}: v{change.previous} -> v{change.version} "
                      f"(rolled back by {change.by})", highlight=False, markup=False)
    elif args.version:
        ref = lineage.resolve_model(f"models:/{model}/{args.version}")
        if ref.tags.get("physai.gates_passed") != "true":
            raise ConfigError.one(f"models:/{model}/{args.version}", "physai.gates_passed",
                                  ref.tags.get("physai.gates_passed"),
                                  f"only a version that passed every gate can be @{alias}")
        if ref.tags.get("physai.engine.required") == "true":
            from stages.tracking.engine_record import engine_report_problem

            waiting = engine_report_problem(lineage, ref.tags.get("physai.bundle.digest", ""))
            if waiting:
                raise ConfigError.one(f"models:/{model}/{args.version}",
                                      "physai.engine.required", "true", waiting)
        expected = registry.current_version(lineage, model, alias)
        change = registry.compare_and_set_alias(lineage, model, alias, expected, ref.version,
                                                why=args.why or "manual promotion")
        console.print(f"models:/{model}@{alias}: "
                      f"{'v' + str(change.previous) if change.previous else 'unset'} -> "
                      f"v{change.version}", highlight=False, markup=False)
    table = Table(title=f"models:/{model}@{alias} history")
    for column in ("at", "event", "version", "previous", "by", "why"):
        table.add_column(column)
    for e in registry.history(lineage, model, alias):
        table.add_row(e.at, e.event, e.version, e.previous or "-", e.by, e.why)
    console.print(table)
    return 0


def cmd_plugins(args: argparse.Namespace, console: Console) -> int:
    """List the installed plugins and what every registry holds (the kinds a plugin may
    extend, :data:`physai_core.plugins.KINDS`), plugins' included."""
    from edge.targets import TARGETS
    from physai_core.plugins import KINDS, Registry, load_plugins
    from stages.core.environments import ENVIRONMENTS
    from stages.datasets.formats import FORMATS
    from stages.sim.backends.catalog import BACKENDS
    from stages.sim.tasks.catalog import TASKS
    from stages.training.algorithms import ALGORITHMS

    registries: dict[str, Registry[Any]] = {
        "tasks": TASKS, "backends": BACKENDS, "algorithms": ALGORITHMS, "targets": TARGETS,
        "dataset_formats": FORMATS, "environments": ENVIRONMENTS}
    kinds = {kind: list(registries[kind].names()) for kind in KINDS}  # loads every plugin
    listing = {"plugins": list(load_plugins()), **kinds}
    if args.json:
        print(json.dumps(listing))
        return 0
    for kind, names in listing.items():
        console.print(f"[bold]{kind}[/bold]: " + (", ".join(names) or "(none)"),
                      soft_wrap=True, highlight=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``flows``."""
    parser = argparse.ArgumentParser(prog="flows", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_pipeline_commands(sub)
    _add_registry_commands(sub)
    _add_engine_command(sub)
    from flows.bundle_cli import register as register_bundle
    from flows.compare_cli import register as register_compare
    from flows.dataset_cli import register as register_dataset
    from flows.deploy import register as register_deploy
    from flows.serve_cli import register as register_serve
    from flows.validate_cli import register as register_validate

    register_bundle(sub)
    register_deploy(sub)
    register_dataset(sub)
    register_validate(sub)
    register_compare(sub)
    register_serve(sub)
    return parser


def _add_pipeline_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``run``, ``check``, ``server`` and ``nightly``."""
    from flows.policy_cli import port_number

    run = sub.add_parser("run", help="run a pipeline config end to end")
    run.add_argument("config", help="pipeline config, e.g. configs/reach.yaml, or "
                     "pkg:PACKAGE/PATH inside an installed package")
    run.add_argument("--refresh", action="store_true", help="ignore cached stage results")
    run.add_argument("--direct", action="store_true",
                     help="call the stages in this process without Prefect (no caching)")
    run.add_argument("--task-runner", choices=("threads", "ray"), default="threads",
                     help="where validation scenes fan out (ray needs the 'ray' extra)")
    run.add_argument("--ray-address", default=None,
                     help="Ray cluster address (default: start a local Ray instance)")
    run.set_defaults(func=cmd_run)
    check = sub.add_parser("check", help="check a pipeline config whole and print its stages; "
                           "runs and writes nothing")
    check.add_argument("config", help="pipeline config, e.g. configs/reach.yaml, or "
                       "pkg:PACKAGE/PATH inside an installed package")
    check.set_defaults(func=cmd_check)
    keys = sub.add_parser("keys", help="print every key a pipeline config, scene, suite or task "
                          "file takes: type, default, bounds, meaning (Markdown)")
    keys.add_argument("kind", nargs="?", choices=("pipeline", "scene", "suite", "task"),
                      help="one kind of file (default: all)")
    keys.add_argument("--shipped", action="store_true",
                      help="only the training algorithms physai-flows ships, as "
                      "docs/configuration.md lists them")
    keys.set_defaults(func=cmd_keys)
    server = sub.add_parser("server", help="start or stop local Prefect and MLflow servers")
    server.add_argument("action", choices=("up", "down"))
    server.add_argument("--prefect-port", type=port_number, default=4200)
    server.add_argument("--mlflow-port", type=port_number, default=5000)
    server.add_argument("--prefect-database", default="", metavar="URL",
                        help="up: Prefect's database instead of the state folder's SQLite "
                             "(postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB)")
    server.add_argument("--mlflow-database", default="", metavar="URL",
                        help="up: MLflow's backend store instead of the state folder's SQLite "
                             "(postgresql://USER:PASSWORD@HOST:PORT/DB; the postgres extra)")
    server.add_argument("--mlflow-artifacts", default="", metavar="DEST",
                        help="up: where MLflow's server keeps the artifacts it serves "
                             "(s3://BUCKET/PREFIX, with the AWS_* and MLFLOW_S3_ENDPOINT_URL "
                             "variables; default: the state folder's mlartifacts)")
    server.add_argument("--foreground", action="store_true",
                        help="up: stay in front until SIGTERM or Ctrl-C, then stop both servers "
                             "(for systemd or a container)")
    server.set_defaults(func=cmd_server)
    nightly = sub.add_parser("nightly", help="run the nightly sim regression of a config's "
                                             "@champion now (exit 3 when it regressed)")
    nightly.add_argument("config", help="pipeline config whose model and suite to check")
    nightly.add_argument("--alias", default="champion")
    nightly.add_argument("--seed-offset", type=int, default=0,
                         help="shift every scene's seed (0: the frozen episodes)")
    nightly.set_defaults(func=cmd_nightly)


def _add_registry_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``lineage``, ``promote`` and ``plugins``."""
    lineage = sub.add_parser("lineage", help="print the lineage chain of a model version")
    lineage.add_argument("model_uri", help="models:/NAME@ALIAS or models:/NAME/VERSION")
    lineage.set_defaults(func=cmd_lineage)
    prom = sub.add_parser("promote", help="roll back or move a registry alias (compare-and-set) "
                                          "and show its history")
    prom.add_argument("model", help="registered model name")
    prom.add_argument("--alias", default="champion")
    how = prom.add_mutually_exclusive_group()
    how.add_argument("--rollback", action="store_true",
                     help="restore the version the alias pointed at before the current one")
    how.add_argument("--version", help="move the alias to this version (it must have passed "
                                       "every gate)")
    prom.add_argument("--why", help="reason recorded in the history")
    prom.set_defaults(func=cmd_promote)
    plugins = sub.add_parser("plugins", help="list installed plugins (physai_flows.* entry "
                             "points) and the tasks and edge targets they add")
    plugins.add_argument("--json", action="store_true", help="print one JSON object")
    plugins.set_defaults(func=cmd_plugins)


def _add_engine_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``engine build|report``."""
    eng = sub.add_parser("engine", help="build a bundle's TensorRT engine on the target, or "
                                        "record an engine report in MLflow")
    eng.add_argument("action", choices=("build", "report"))
    eng.add_argument("file", help="build: bundle tar file; report: engine_report.json")
    eng.add_argument("--precision", choices=("fp32", "fp16", "bf16", "int8"),
                     help="build: engine precision (default: the bundle's)")
    eng.add_argument("--builder", choices=("python", "trtexec"), default="python")
    eng.add_argument("--out", help="build: output folder (default: ./engine-<bundle digest>)")
    eng.add_argument("--any-gpu", action="store_true",
                     help="build: allow a GPU that is not the bundle's target")
    eng.add_argument("--trust", help="build: PEM public key of the bundle's signer (default: "
                                     "the project's own, PHYSAI_HOME/keys/bundle-signing.pub)")
    eng.add_argument("--allow-unsigned", action="store_true",
                     help="build: build a bundle no trusted key signed (a warning each time)")
    eng.add_argument("--bundle-digest", help="report: sha256 of the bundle the engine came from "
                                             "(it must be in the store, and the report made "
                                             "from it)")
    eng.add_argument("--experiment", default="edge-engines", help="MLflow experiment")
    eng.set_defaults(func=cmd_engine)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flows`` console script."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    console = Console()
    try:
        return int(args.func(args, console))
    except PhysaiError as exc:
        print(f"flows: error: {redact_urls(str(exc))}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except KeyboardInterrupt:
        print("flows: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``flows`` command line.

``flows run CONFIG`` runs a pipeline through Prefect with a progress bar per stage and a summary
table; ``flows lineage models:/NAME@ALIAS`` prints the chain back to the raw data.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.tree import Tree

from stages.errors import PhysaiError


def _prepare_environment() -> None:
    """Point Prefect and MLflow at the local servers when ``flows server up`` started them,
    else at the embedded state folder, unless the environment says else."""
    from flows.servers import use_running
    from stages.settings import apply_embedded_environment, resolve_settings

    settings = resolve_settings()
    os.environ["PHYSAI_HOME"] = str(settings.home)
    settings.home.mkdir(parents=True, exist_ok=True)
    use_running(settings)
    apply_embedded_environment(settings)


def cmd_server(args: argparse.Namespace, console: Console) -> int:
    """Start or stop the local Prefect and MLflow servers."""
    from flows import servers
    from stages.settings import resolve_settings

    settings = resolve_settings()
    if args.action == "up":
        settings.home.mkdir(parents=True, exist_ok=True)
        started = servers.up(settings, args.prefect_port, args.mlflow_port)
        for s in started:
            console.print(f"{s.name:<8} {s.url}  (pid {s.pid}, log {s.log})", soft_wrap=True,
                          highlight=False, markup=False)
        console.print("flows run now reports to these servers; stop them with: flows server down",
                      highlight=False)
    else:
        stopped = servers.down(settings)
        console.print(f"stopped: {', '.join(s.name for s in stopped) or 'nothing was running'}",
                      highlight=False)
    return 0


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """Check the config whole, then run the pipeline flow and print the summary."""
    from stages.config import load_pipeline

    load_pipeline(args.config)
    _prepare_environment()
    from flows.console import RichProgress, summary_lines, summary_table
    from stages.context import use_progress

    start = time.perf_counter()
    with RichProgress(console) as progress, use_progress(progress):
        if args.direct:
            from stages.pipeline import run_direct

            result = run_direct(load_pipeline(args.config), progress)
        else:
            from flows.pipeline import pipeline_flow
            from flows.runners import api_for_workers, make_task_runner

            flow = pipeline_flow.with_options(
                task_runner=make_task_runner(args.task_runner, args.ray_address)
            )
            with api_for_workers(args.task_runner):
                result = flow(config_path=str(args.config), refresh=args.refresh)
    console.print(summary_table(result, time.perf_counter() - start))
    for line in summary_lines(result):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    return 0


def cmd_lineage(args: argparse.Namespace, console: Console) -> int:
    """Print the lineage chain of a registered model version, verifying every digest."""
    from stages.context import open_services
    from stages.trace import trace_model

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
    if chain.has("dataset"):
        leaf = leaf.add(f"{mark('dataset')}  collection run {tags.get('physai.collect_run_id')}")
    if chain.has("teacher"):
        leaf = leaf.add(f"{mark('teacher')}  teacher training run "
                        f"{tags.get('physai.teacher_run_id')}")
    leaf.add(f"code revision {tags.get('physai.code_revision')}")
    console.print(tree)
    return 0 if chain.verified else 1


def cmd_bundle(args: argparse.Namespace, console: Console) -> int:
    """Verify a bundle's every digest, or print what it holds."""
    from edge.bundle import read_manifest, verify_bundle
    from stages.hashing import sha256_file

    path = Path(args.file)
    manifest = verify_bundle(path) if args.action == "verify" else read_manifest(path)
    target = manifest.get("target", {})
    io = manifest.get("io", {})
    lineage = manifest.get("lineage", {})
    lines = [
        f"bundle {path} sha256 {sha256_file(path)}",
        f"task {manifest.get('task')}  target {target.get('name')} "
        f"(JetPack {target.get('jetpack')}, TensorRT {target.get('tensorrt')}, "
        f"{target.get('gpu_arch')})  precision {manifest.get('precision')}  "
        f"opset {manifest.get('opset')}",
        f"control {manifest.get('control_hz')} Hz, latency budget "
        f"{manifest.get('latency_budget_ms')} ms",
    ]
    for name in ("obs", "actions"):
        spec = io.get(name, {})
        lines.append(f"{name}: {spec.get('shape')} {', '.join(spec.get('names', []))}")
    lines += [f"file {n}: {f['bytes']} bytes sha256 {f['sha256']}"
              for n, f in sorted(manifest.get("files", {}).items())]
    lines += [f"lineage {k}: {v}" for k, v in sorted(lineage.items())]
    if args.action == "verify":
        lines.append(f"verified: {len(manifest.get('files', {}))} files match the manifest")
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``flows``."""
    parser = argparse.ArgumentParser(prog="flows", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a pipeline config end to end")
    run.add_argument("config", help="pipeline config, e.g. configs/reach.yaml")
    run.add_argument("--refresh", action="store_true", help="ignore cached stage results")
    run.add_argument("--direct", action="store_true",
                     help="call the stages in this process without Prefect (no caching)")
    run.add_argument("--task-runner", choices=("threads", "ray"), default="threads",
                     help="where validation scenes fan out (ray needs the 'ray' extra)")
    run.add_argument("--ray-address", default=None,
                     help="Ray cluster address (default: start a local Ray instance)")
    run.set_defaults(func=cmd_run)
    lineage = sub.add_parser("lineage", help="print the lineage chain of a model version")
    lineage.add_argument("model_uri", help="models:/NAME@ALIAS or models:/NAME/VERSION")
    lineage.set_defaults(func=cmd_lineage)
    server = sub.add_parser("server", help="start or stop local Prefect and MLflow servers")
    server.add_argument("action", choices=("up", "down"))
    server.add_argument("--prefect-port", type=int, default=4200)
    server.add_argument("--mlflow-port", type=int, default=5000)
    server.set_defaults(func=cmd_server)
    bundle = sub.add_parser("bundle", help="verify or inspect an edge bundle")
    bundle.add_argument("action", choices=("verify", "inspect"))
    bundle.add_argument("file", help="bundle tar file")
    bundle.set_defaults(func=cmd_bundle)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flows`` console script."""
    from edge.errors import EdgeError

    args = build_parser().parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    console = Console()
    try:
        return int(args.func(args, console))
    except (PhysaiError, EdgeError) as exc:
        print(f"flows: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except KeyboardInterrupt:
        print("flows: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

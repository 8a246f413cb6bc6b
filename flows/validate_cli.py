"""``flows validate``: any policy over a scene suite, from the command line (the policy
named as flows/policy_cli.py says).

``flows validate`` prints the per-scene table with 95% Wilson intervals and the gates, logs
an MLflow run, and exits 0 when every gate passes (1 otherwise). Its MLflow run and report
are the evaluation package's (:func:`stages.evaluation.reporting.log_evaluation`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from flows.policy_cli import (
    POLICY_HELP,
    chunk_config,
    common_flags,
    episode_count,
    evaluate_policies,
    latency_line,
    stdout_for,
    within,
)

if TYPE_CHECKING:
    from stages.evaluation.suite import Evaluation

DEFAULT_EXPERIMENT = "flows-validate"
"""MLflow experiment of ``flows validate`` runs unless ``--experiment`` names another."""


DEFAULT_MIN_SUCCESS = 0.5
"""``flows validate``'s gate without ``--min-success``: each scene's 95% Wilson lower bound
must reach this. A pipeline gates at its config's ``validate.min_success``, higher in every
config shipped here; :func:`gate_note` says so when the default is the looser."""


_fraction = within(0.0, 1.0, "[0, 1]")
"""A number in [0, 1]."""


def pipeline_gates(suite: Path, folders: tuple[Path, ...] | None = None) -> dict[str, float]:
    """``validate.min_success`` of every pipeline config that validates on ``suite``, by the
    config's path: the YAML files of ``folders`` (by default ``./configs`` and the
    ``configs`` folder beside the suite's ``sim_scenes``, as this project lays them out)
    whose ``validate.suite`` names this very file. Files that are no such config are passed
    over."""
    from physai_core.errors import ConfigError
    from stages.core.loading import read_yaml
    from stages.core.resources import resolve_file

    target = suite.resolve()
    if folders is None:
        folders = (Path("configs"), target.parent.parent.parent / "configs")
    found: dict[str, float] = {}
    seen: set[Path] = set()
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            try:
                data = read_yaml(path)
                section = data.get("validate") if isinstance(data, dict) else None
                if not isinstance(section, dict) or not isinstance(section.get("suite"), str):
                    continue
                named = resolve_file(section["suite"], path.parent)
                gate = section.get("min_success")
            except (ConfigError, ValueError, OSError):
                continue
            if named == target and isinstance(gate, int | float):
                shown = os.path.relpath(path)
                found[str(path.resolve()) if shown.startswith("..") else shown] = float(gate)
    return found


def gate_note(min_success: float, given: bool, suite: Path) -> str | None:
    """One line when ``flows validate`` gates more loosely than a pipeline would: without
    ``--min-success``, the default against the ``validate.min_success`` of the pipeline
    configs found for ``suite`` (:func:`pipeline_gates`), or against none found. None when
    the gate was given, or no config found asks more of this suite."""
    if given:
        return None
    gates = pipeline_gates(suite)
    stricter = {path: gate for path, gate in gates.items() if gate > min_success}
    if gates and not stricter:
        return None
    head = (f"gate: each scene's 95% lower bound must reach {min_success:g}, flows validate's "
            "default")
    if not stricter:
        return (f"{head}; a pipeline gates at its config's validate.min_success, which no "
                "config found here sets for this suite: --min-success gates as it does")
    by_gate: dict[float, list[str]] = {}
    for path, gate in stricter.items():
        by_gate.setdefault(gate, []).append(path)
    said = "; ".join(f"{gate:g} in {', '.join(paths)}" for gate, paths in sorted(by_gate.items()))
    return (f"{head}, looser than the pipeline configs that validate on this suite "
            f"(validate.min_success {said}): --min-success {max(by_gate):g} gates as they do")


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    """Validate one policy over a suite; exit 0 when every gate passes, 1 otherwise.

    Steps: 1. the gate the flags ask for; 2. the policy over the suite, gated; 3. its MLflow
    run and report page; 4. the JSON object, or the table and the lines after it.
    """
    from stages.evaluation.gates import gate_scenes
    from stages.evaluation.reporting import log_evaluation, validation_body
    from stages.orchestration.context import open_services
    from stages.sections.models import SequentialConfig, ValidateConfig

    # -- 1. the gate
    sequential = SequentialConfig(chunk=args.chunk) if args.sequential else None
    min_success = DEFAULT_MIN_SUCCESS if args.min_success is None else args.min_success
    cfg = ValidateConfig(suite=str(args.suite), min_success=min_success,
                         sequential=sequential, chunk=chunk_config(args))
    with stdout_for(args):
        # -- 2. the policy over the suite, gated
        (ev,) = evaluate_policies([args.policy], args, quiet=args.json, gates=cfg)
        gates = gate_scenes(cfg, ev.scenes)
        passed = all(g.passed for g in gates)
        body = validation_body(ev, gates, min_success, args.min_success is not None)
        # -- 3. its MLflow run and report
        _, _, lineage = open_services()
        body["mlflow_run_id"], body["report"] = log_evaluation(lineage, ev, gates, body,
                                                               args.experiment)
    # -- 4. what is printed
    note = gate_note(min_success, args.min_success is not None, ev.suite.path)
    if args.json:
        if note:
            print(note, file=sys.stderr)
        print(json.dumps(body))
        return 0 if passed else 1
    _print_validation(console, ev, body, note)
    return 0 if passed else 1


def _print_validation(console: Console, ev: Evaluation, body: dict[str, Any],
                      note: str | None) -> None:
    """The table of scenes, what the failures go with, the sweeps, the gate's note and where
    the report and the run are.

    Steps: 1. the table; 2. the factors failure goes with, and the sweeps; 3. the note, the
    remote policy's latency, the verdict and where the report and the run are.
    """
    from flows.console import mlflow_line
    from stages.evaluation.reporting import summary_line
    from stages.orchestration.context import open_services
    from stages.sim.scenes.scene import point_label

    def say(line: str) -> None:
        console.print(line, soft_wrap=True, highlight=False, markup=False)

    # -- 1. the table
    table = Table(title=f"{ev.policy} on suite {ev.suite.config.name} ({ev.suite.config.task})")
    for column in ("scene", "episodes", "success", "95% CI", "mean return", "gate"):
        table.add_column(column)
    for row in body["scenes"]:
        table.add_row(row["name"], str(row["episodes"]),
                      f"{row['successes']}/{row['episodes']} = {row['success_rate']:.3f}",
                      f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]",
                      f"{row['mean_return']:.2f}",
                      f"{'pass' if row['passed'] else 'FAIL'} (>= {row['min_success']:g})")
    console.print(table)
    if len(ev.scenes) > 1:
        say(summary_line(body["summary"]))
    for row in body["scenes"]:
        for told in row.get("by_instruction", ()):
            say(f"{row['name']}: instructed {told['instruction']!r}: {told['successes']}/"
                f"{told['episodes']} [{told['ci_low']:.3f}, {told['ci_high']:.3f}]")
    # -- 2. the factors and the sweeps
    for s in ev.scenes:
        if s.factors:
            top = ", ".join(f"{f.name} {f.effect:+.2f} [{f.ci_low:+.2f}, {f.ci_high:+.2f}]"
                            for f in s.factors[:3])
            say(f"{s.scene}: failure most associated with {top} (log-odds per SD)")
    for curve in ev.sweeps:
        line = "; ".join(f"{point_label(p.sweep or {})}: {p.successes}/{p.episodes}"
                         for p in curve.points)
        say(f"{curve.scene} swept: {line}")
    # -- 3. the note, the latency, the verdict and where to look
    if note:
        say(note)
    if ev.latency_ms:
        say(latency_line(ev.latency_ms))
    run_id = body["mlflow_run_id"]
    say(f"policy {ev.digest} ({ev.kind}); suite {ev.suite.digest[:12]}; "
        f"{'every gate passed' if body['passed'] else 'a gate FAILED'}")
    say(f"evaluation report: {body['report']}")
    _, _, lineage = open_services()
    say(mlflow_line(lineage.run_url(run_id), run_id))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows validate``."""
    val = sub.add_parser("validate", help="run any policy over a scene suite: per-scene "
                         "success with 95%% Wilson intervals and gates (exit 1: a gate failed)")
    val.add_argument("policy", help=POLICY_HELP)
    common_flags(val)
    val.add_argument("--min-success", type=_fraction, default=None,
                     help="each scene passes when its 95%% Wilson lower bound reaches this "
                          f"(default {DEFAULT_MIN_SUCCESS:g}; a line says when it is looser "
                          "than a pipeline config's validate.min_success for the suite)")
    val.add_argument("--sequential", action="store_true",
                     help="each scene stops once its gate's verdict is clear: a policy at "
                          "--min-success passes, and one 0.1 above it fails, each at most 5%% of "
                          "the time; the suite's episodes are the most a scene spends")
    val.add_argument("--chunk", type=episode_count, default=10,
                     help="with --sequential: episodes between two looks (default 10)")
    val.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                     help=f"MLflow experiment of the run (default {DEFAULT_EXPERIMENT})")
    val.set_defaults(func=cmd_validate)

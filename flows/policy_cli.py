"""``flows validate`` and ``flows compare``: any policy over a scene suite, from the command line.

A policy is named by an ONNX or TorchScript file (TorchScript only with ``--trust-code``), an
edge bundle (a file or its digest: signed with ``--trust KEY``, by default this project's own
public key, or run unauthenticated with ``--allow-unsigned``), a policy digest in the artifact
store, or an MLflow model URI (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``: a version this
project registered runs its stored policy, any other enters through its onnx flavor;
``runs:/RUN_ID/PATH``). The task is the suite's. A suite whose backend lives in a stage
environment (``backend: isaaclab``) is evaluated in that environment's interpreter.
``--action-units native`` says that a policy file or MLflow model acts in the environment's own
units (its actions are mapped to the task's -1..1); ``--action-units normalized`` that it acts
in -1..1, which its probe actions must keep to (docs/policies.md).

``flows validate`` prints the per-scene table with 95% Wilson intervals and the gates, logs
an MLflow run, and exits 0 when every gate passes (1 otherwise). ``flows compare A B`` runs
both policies on the same episodes and applies promotion's champion test (Newcombe per scene,
Holm over scenes) with A as the champion: exit 0 when B is not worse, 1 when it is. Bad
input (an unknown file, model, alias or digest among them) is one line and exit 2, with
nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from stages.artifacts.records import GateResult, SceneResult, SweepCurve
    from stages.evaluation.compare import SuiteComparison
    from stages.policies.policy_server import ServerLimits
    from stages.sections.models import ChunkConfig, ValidateConfig
    from stages.sim.suites.suite import Suite
    from stages.sim.tasks.catalog import TaskSpec
    from stages.steps.validate import Rollout
    from stages.training.imported import ResolvedPolicy

DEFAULT_EXPERIMENT = "flows-validate"
"""MLflow experiment of ``flows validate`` runs unless ``--experiment`` names another."""

MAX_KEY_BYTES = 64 * 2**10
"""Largest ``--api-key-file`` read: a key is one line of well under a KiB."""

DEFAULT_MIN_SUCCESS = 0.5
"""``flows validate``'s gate without ``--min-success``: each scene's 95% Wilson lower bound
must reach this. A pipeline gates at its config's ``validate.min_success``, higher in every
config shipped here; :func:`gate_note` says so when the default is the looser."""


@dataclass(frozen=True)
class Evaluation:
    """One policy over one suite: per-scene results and, for validate, the gates."""

    policy: str
    digest: str
    kind: str
    suite: Suite
    scenes: tuple[SceneResult, ...]
    latency_ms: dict[str, float]
    """A remote policy's call latencies (calls, p50_ms, p99_ms, max_ms); empty otherwise."""
    sweeps: tuple[SweepCurve, ...] = ()
    """For validate, the success curve of every swept scene (``sweep:`` in its file)."""
    rollouts: Mapping[str, Rollout] = field(default_factory=dict)
    """Each scene's rollout by scene name (its episode table, what a policy that sees was
    shown), where the suite ran in this process."""


def _whole(low: int, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (None: no upper end);
    argparse exits 2 with the reason otherwise."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
        if n < low or (high is not None and n > high):
            bound = f"at least {low}" if high is None else f"{what}{low}-{high}"
            raise argparse.ArgumentTypeError(f"must be {bound} (value: {n})")
        return n

    return parse


_episodes = _whole(1)
"""``--episodes`` and ``--chunk``: a positive count."""

port_number = _whole(1, 65535, "a port, ")
"""A TCP port, 1-65535, refused before any server starts."""


def _within(low: float, high: float, shown: str) -> Callable[[str], float]:
    """An argparse type: a number in the interval ``shown`` from ``low`` to ``high``, each end
    included where ``shown`` has a square bracket (``[0, 1)``)."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        above = x >= low if shown.startswith("[") else x > low
        below = x <= high if shown.endswith("]") else x < high
        if not (above and below):
            raise argparse.ArgumentTypeError(f"must be within {shown} (value: {x:g})")
        return x

    return parse


_fraction = _within(0.0, 1.0, "[0, 1]")
"""A number in [0, 1]."""


def _stdout_for(args: argparse.Namespace) -> contextlib.AbstractContextManager[object]:
    """With ``--json``, whatever libraries print (MLflow's run links) goes to stderr, so
    stdout holds the one JSON object."""
    if args.json:
        return contextlib.redirect_stdout(sys.stderr)
    return contextlib.nullcontext()


def _evaluate(refs: list[str], args: argparse.Namespace, quiet: bool,
              gates: ValidateConfig | None = None) -> list[Evaluation]:
    """Load the suite, resolve every policy of ``refs`` and run each over it (each scene
    stopping early where ``gates`` ask for a sequential gate). With ``gates`` (validate),
    every sweep point of the suite runs too. A suite whose backend lives in a stage
    environment (Isaac Lab's) is evaluated in that environment's interpreter, as a pipeline's
    validate stage does (:func:`stages.pipeline.envrun.validate_suite_in`)."""
    from flows.servers import prepare_environment
    from stages.orchestration.context import open_services
    from stages.sim.tasks.catalog import get_task
    from stages.training.imported import resolve_policy

    register_tasks(args.tasks or [])
    suite = _suite(args.suite, bool(args.tasks))
    environment = _suite_environment(suite)
    spec = get_task(suite.config.task)
    refuse_unknown(refs)
    trust_key = bundle_trust(args)
    prepare_environment()
    _, store, lineage = open_services()
    out = []
    with tempfile.TemporaryDirectory(prefix="physai-policy-") as work:
        resolved = [resolve_policy(ref, spec, store, lineage, trust_code=args.trust_code,
                                   work=Path(work), remote_timeout_s=args.remote_timeout,
                                   trust_key=trust_key, allow_unsigned=args.allow_unsigned,
                                   action_units=args.action_units)
                    for ref in refs]
        remote_inputs(resolved, spec, suite, args)
        if environment is not None:
            return _evaluate_there(environment, refs, resolved, suite, args, gates, Path(work))
        for ref, policy in zip(refs, resolved, strict=True):
            out.append(_evaluate_here(ref, policy, suite, args, quiet, gates))
    return out


def remote_inputs(resolved: list[ResolvedPolicy], spec: TaskSpec, suite: Suite,
                  args: argparse.Namespace) -> None:
    """Tell every policy of ``resolved`` served over the network what to send it: the task's
    camera images beside the state, under ``--obs-key`` over the suite's ``remote.keys`` over
    the server's own keys (:meth:`stages.policies.remote.RemotePolicy.send_as`), and ``--prompt``,
    else the suite's ``remote.prompt``. A refusal (a key naming no input, an image of another size
    than the server's) closes every connection and is one line, exit status 2."""
    from stages.policies.remote import RemotePolicy

    section = suite.config.remote
    keys = {**(section.keys if section else {}), **dict(args.obs_key or [])}
    prompt = args.prompt if args.prompt is not None else section.prompt if section else None
    images = {key: camera.shape(key) for camera in spec.cameras for key in camera.tensors()
              if key == camera.image_key or key in keys}
    try:
        for policy in resolved:
            if isinstance(policy.act, RemotePolicy):
                policy.act.send_as(images, keys or None, prompt)
    except Exception:
        for policy in resolved:
            close = getattr(policy.act, "close", None)
            if callable(close):
                close()
        raise


def register_tasks(refs: list[str]) -> None:
    """Register the task files ``--tasks`` names (paths relative to this folder, or
    ``pkg:PACKAGE/PATH``), as a pipeline config's ``tasks:`` does; a bad one is one line, exit
    status 2."""
    from physai_core.errors import ConfigError, Problem
    from stages.core.resources import resolve_file
    from stages.sim.tasks.template import register_task_file

    problems = []
    for ref in refs:
        try:
            path = resolve_file(ref, Path.cwd())
        except ValueError as exc:
            problems.append(Problem(ref, "--tasks", ref, str(exc)))
            continue
        if not path.is_file():
            problems.append(Problem(ref, "--tasks", ref, f"task file not found: {path}"))
            continue
        try:
            register_task_file(path)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)


def _suite(path: Path, tasks_given: bool) -> Suite:
    """The suite at ``path``; where its task is unknown and no ``--tasks`` was given, the
    message says how a task file's task is named."""
    from physai_core.errors import ConfigError, Problem
    from stages.sim.suites.loading import load_suite

    try:
        return load_suite(path)
    except ConfigError as exc:
        if tasks_given:
            raise
        raise ConfigError([
            Problem(p.file, p.field, p.value, f"{p.message} (a task a task file defines: "
                    "--tasks FILE)") if p.field == "task" and "unknown task" in p.message
            else p for p in exc.problems]) from None


def _evaluate_here(ref: str, policy: ResolvedPolicy, suite: Suite, args: argparse.Namespace,
                   quiet: bool, gates: ValidateConfig | None) -> Evaluation:
    """One policy over the suite in this process."""
    from flows.console import RichProgress
    from stages.orchestration.context import NullProgress
    from stages.policies.local import run_chunks
    from stages.steps.validate import evaluate_suite, evaluate_sweeps

    chunk = chunk_config(args)
    act = run_chunks(policy.act, chunk.how() if chunk is not None else None, CHUNK_FLAGS)
    progress: Any = NullProgress() if quiet else RichProgress(Console(stderr=True))
    curves: tuple[SweepCurve, ...] = ()
    rollouts: dict[str, Rollout] = {}
    with progress if not quiet else contextlib.nullcontext():
        scenes = evaluate_suite(suite, act, episodes=args.episodes, progress=progress,
                                gates=gates, rollouts=rollouts)
        if gates is not None and suite.sweeps:
            curves = evaluate_sweeps(suite, act, episodes=args.episodes,
                                     progress=progress)
    latency = getattr(policy.act, "latency_summary", None)
    close = getattr(policy.act, "close", None)
    if callable(close):
        close()
    return Evaluation(ref, policy.digest, policy.kind, suite, scenes,
                      latency() if callable(latency) else {}, curves, rollouts)


CHUNK_FLAGS = "--chunk-execute/--chunk-ensemble"
"""How a chunk setting of the command line is named in a message."""


def chunk_config(args: argparse.Namespace) -> ChunkConfig | None:
    """``--chunk-execute N`` or ``--chunk-ensemble M`` as ``validate.chunk``; None for
    neither (a chunk policy then runs all of each chunk)."""
    from stages.sections.models import ChunkConfig

    if args.chunk_execute is not None:
        return ChunkConfig(execute=args.chunk_execute)
    if args.chunk_ensemble is not None:
        return ChunkConfig(ensemble=args.chunk_ensemble)
    return None


def _evaluate_there(environment: str, refs: list[str], resolved: list[ResolvedPolicy],
                    suite: Suite, args: argparse.Namespace, gates: ValidateConfig | None,
                    work: Path) -> list[Evaluation]:
    """The policies over the suite in the stage environment ``environment``, one interpreter
    for all: their policy files go there, the scenes' results come back."""
    from physai_core.errors import ConfigError
    from stages.pipeline.envrun import validate_suite_in

    paths = []
    for ref, policy in zip(refs, resolved, strict=True):
        if policy.path is None:
            for each in resolved:
                close = getattr(each.act, "close", None)
                if callable(close):
                    close()
            raise ConfigError.one(str(suite.path), "backend", suite.config.backend,
                                  f"runs in the stage environment {environment!r}, where a "
                                  f"policy served over the network ({ref}) is not evaluated: "
                                  "validate its file, digest or model instead")
        paths.append(policy.path)
    there = validate_suite_in(environment, suite.path, paths, episodes=args.episodes,
                              gates=gates, sweeps=gates is not None, scratch=work)
    return [Evaluation(ref, policy.digest, policy.kind, suite, e.scenes, {}, e.sweeps)
            for ref, policy, e in zip(refs, resolved, there, strict=True)]


def _suite_environment(suite: Suite) -> str | None:
    """The stage environment the suite's backend runs in, when not this process; its
    interpreter must be there (one line naming what builds it, exit status 2)."""
    from stages.core.environments import require_python, runs_here
    from stages.sim.backends.catalog import get_backend

    environment = get_backend(suite.config.backend).environment
    if runs_here(environment):
        return None
    require_python(str(environment), f"{suite.path}: backend {suite.config.backend}")
    return environment


def refuse_unknown(refs: list[str]) -> None:
    """Refuse, before any state is created, a policy reference that can name nothing: a file
    that is not there, or a model or digest while this project has no registry or store yet
    (exit status 2, nothing written)."""
    from physai_core.errors import ConfigError
    from stages.core.settings import resolve_settings
    from stages.training.imported import check_reference, is_mlflow_uri

    settings = resolve_settings()
    database = settings.tracking_uri.removeprefix("sqlite:///")
    # Without a state folder no local server is running that could name another registry.
    no_registry = (settings.tracking_uri.startswith("sqlite:///") and not Path(database).exists()
                   and ("MLFLOW_TRACKING_URI" in os.environ or not settings.home.exists()))
    no_store = "://" not in settings.store_uri and not Path(settings.store_uri).is_dir()
    for ref in refs:
        check_reference(ref)
        if is_mlflow_uri(ref) and no_registry:
            raise ConfigError.one(ref, "", ref, f"no such model: this project has no MLflow "
                                  f"registry yet ({database} does not exist)")
        digest = ref.removeprefix("sha256:")
        if len(digest) == 64 and not Path(ref).exists() and no_store:
            raise ConfigError.one(ref, "", ref, f"no such artifact: this project has no store "
                                  f"yet ({settings.store_uri} does not exist)")


def bundle_trust(args: argparse.Namespace) -> Path | None:
    """The public key a bundle named as a policy must be signed with: ``--trust``, else the
    project's own (``stages.steps.bundles.default_trust_key``), else none (then only
    ``--allow-unsigned`` admits a bundle); none with ``--allow-unsigned``."""
    from physai_core.errors import ConfigError
    from stages.steps.bundles import default_trust_key

    if args.allow_unsigned:
        return None
    if args.trust is not None:
        if not args.trust.is_file():
            raise ConfigError.one(args.trust, "--trust", str(args.trust),
                                  "no such public key file")
        return Path(args.trust)
    return default_trust_key()


def scene_rows(scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...]
               ) -> list[dict[str, Any]]:
    """One JSON row per scene: counts, rate, Wilson interval, mean return and its gate."""
    by_name = {g.name: g for g in gates}
    rows = []
    for s in scenes:
        gate = by_name[f"success/{s.scene}"]
        rows.append({"name": s.scene, "episodes": s.episodes, "successes": s.successes,
                     "success_rate": s.success_rate, "ci_low": s.ci_low, "ci_high": s.ci_high,
                     "mean_return": s.mean_return, "min_success": gate.threshold,
                     "passed": gate.passed,
                     "factors": [f.model_dump(mode="json") for f in s.factors],
                     "failure_modes": dict(s.failure_modes), "outcomes": s.outcomes,
                     **({"sequential": s.sequential.model_dump(mode="json")}
                        if s.sequential is not None else {})})
    return rows


def sweep_row(curve: SweepCurve) -> dict[str, Any]:
    """One swept scene's curve as JSON: its fields, and per grid point the values and the
    success rate with its Wilson interval."""
    return {"scene": curve.scene, "fields": list(curve.fields), "points": [
        {"sweep": p.sweep, "episodes": p.episodes, "successes": p.successes,
         "success_rate": p.success_rate, "ci_low": p.ci_low, "ci_high": p.ci_high,
         "mean_return": p.mean_return} for p in curve.points]}


def _log_run(ev: Evaluation, gates: tuple[GateResult, ...], body: dict[str, Any],
             experiment: str) -> tuple[str, str]:
    """An MLflow run holding the validation: params, per-scene metrics, the report JSON and
    the evaluation report the validate stage writes (``report.html``). Returns the run's id
    and where the report can be opened."""
    from stages.orchestration.context import open_services
    from stages.steps.validate import report_location

    _, _, lineage = open_services()
    passed = all(g.passed for g in gates)
    run = lineage.start_run(experiment, f"validate {Path(ev.policy).name or ev.policy}", {
        "physai.policy.digest": ev.digest, "physai.policy.source": ev.policy,
        "physai.suite_digest": ev.suite.digest, "physai.gates_passed": passed})
    run.log_params({"policy": ev.policy, "policy_kind": ev.kind, "suite": ev.suite.config.name,
                    "suite_path": str(ev.suite.path), "task": ev.suite.config.task})
    for r in ev.scenes:
        run.log_metrics({f"{r.scene}/success_rate": r.success_rate,
                         f"{r.scene}/ci_low": r.ci_low, f"{r.scene}/ci_high": r.ci_high,
                         f"{r.scene}/mean_return": r.mean_return})
    plots = _plots(ev, gates)
    if ev.sweeps:
        for curve in ev.sweeps:
            for i, p in enumerate(curve.points):
                run.log_metrics({f"{curve.scene}/sweep/{i}/success_rate": p.success_rate})
        run.log_figure(plots["sweeps"], "sweeps.png")
    run.log_dict(body, "sim_report.json")
    _log_page(run, ev, gates, plots)
    run.flush()
    lineage.end_run(run.run_id)
    return run.run_id, report_location(lineage, run.run_id)


def _plots(ev: Evaluation, gates: tuple[GateResult, ...]) -> dict[str, Any]:
    """The report's plots, as the validate stage draws them: success, sweeps, sensitivity."""
    from stages.steps.validate import sensitivity_plot, success_plot, sweep_plot

    plots = {"success": success_plot(ev.scenes, gates)}
    if ev.sweeps:
        plots["sweeps"] = sweep_plot(ev.sweeps)
    if any(s.factors for s in ev.scenes):
        plots["sensitivity"] = sensitivity_plot(ev.scenes)
    return plots


def _log_page(run: Any, ev: Evaluation, gates: tuple[GateResult, ...],
              plots: dict[str, Any]) -> None:
    """The evaluation report of ``ev`` (stages/evaluation/report_page.py) as ``report.html`` in
    ``run``: the page the validate stage writes, with the episodes' misses and what a policy that
    sees was shown; no rollout is filmed here."""
    from stages.evaluation.report_page import ReportView, render_page
    from stages.sim.backends.catalog import backend_version
    from stages.steps.validate import log_page

    backend = ev.suite.config.backend
    view = ReportView(f"{ev.policy} ({ev.digest[:12]})", ev.suite.config.name,
                      ev.suite.digest, backend, backend_version(backend), run.run_id,
                      ev.scenes, gates, all(g.passed for g in gates), ev.sweeps)
    tables = {name: (out.episodes, out.units or {}) for name, out in ev.rollouts.items()
              if out.episodes is not None}
    seen = {name: out.seen for name, out in ev.rollouts.items() if out.seen}
    title = f"{Path(ev.policy).name or ev.policy}: validation on suite {ev.suite.config.name}"
    with tempfile.TemporaryDirectory(prefix="physai-report-") as scratch:
        log_page(run, render_page(view, plots, {}, title, tables, seen), Path(scratch))


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
    """Validate one policy over a suite; exit 0 when every gate passes, 1 otherwise."""
    from stages.sections.models import SequentialConfig, ValidateConfig
    from stages.steps.validate import gate_scenes

    sequential = SequentialConfig(chunk=args.chunk) if args.sequential else None
    min_success = DEFAULT_MIN_SUCCESS if args.min_success is None else args.min_success
    cfg = ValidateConfig(suite=str(args.suite), min_success=min_success,
                         sequential=sequential, chunk=chunk_config(args))
    with _stdout_for(args):
        (ev,) = _evaluate([args.policy], args, quiet=args.json, gates=cfg)
        gates = gate_scenes(cfg, ev.scenes)
        passed = all(g.passed for g in gates)
        body: dict[str, Any] = {
            "policy": ev.policy, "policy_digest": ev.digest, "policy_kind": ev.kind,
            "task": ev.suite.config.task, "suite": ev.suite.config.name,
            "suite_digest": ev.suite.digest, "scenes": scene_rows(ev.scenes, gates),
            "gates": [g.model_dump() for g in gates], "passed": passed,
            "min_success": min_success, "min_success_given": args.min_success is not None,
        }
        if ev.latency_ms:
            body["remote_latency_ms"] = ev.latency_ms
        if ev.sweeps:
            body["sweeps"] = [sweep_row(c) for c in ev.sweeps]
        body["mlflow_run_id"], body["report"] = _log_run(ev, gates, body, args.experiment)
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
    the report and the run are."""
    from flows.console import mlflow_line
    from stages.orchestration.context import open_services
    from stages.sim.scenes.scene import point_label

    def say(line: str) -> None:
        console.print(line, soft_wrap=True, highlight=False, markup=False)

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
    for s in ev.scenes:
        if s.factors:
            top = ", ".join(f"{f.name} {f.effect:+.2f} [{f.ci_low:+.2f}, {f.ci_high:+.2f}]"
                            for f in s.factors[:3])
            say(f"{s.scene}: failure most associated with {top} (log-odds per SD)")
    for curve in ev.sweeps:
        line = "; ".join(f"{point_label(p.sweep or {})}: {p.successes}/{p.episodes}"
                         for p in curve.points)
        say(f"{curve.scene} swept: {line}")
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


def latency_line(latency: Mapping[str, float]) -> str:
    """A remote policy's call latencies in one line (``remote_latency_ms`` of the JSON)."""
    return (f"remote policy: {int(latency['calls'])} calls, p50 {latency['p50_ms']:.2f} ms, "
            f"p99 {latency['p99_ms']:.2f} ms, max {latency['max_ms']:.2f} ms a call")


def comparison_table(a: str, b: str, comparison: SuiteComparison) -> Table:
    """Champion ``a`` against challenger ``b``, one row per scene."""
    table = Table(title=f"{b} against {a} (margin {comparison.margin:g}, alpha "
                        f"{comparison.alpha:g}; {comparison.method})")
    for column in ("scene", "A", "B", "difference", "95% CI", "p (Holm)", "verdict"):
        table.add_column(column)
    for s in comparison.scenes:
        table.add_row(s.scene, f"{s.champion_successes}/{s.champion_episodes}",
                      f"{s.challenger_successes}/{s.challenger_episodes}",
                      f"{s.difference:+.3f}",
                      f"[{s.difference_ci_low:+.3f}, {s.difference_ci_high:+.3f}]",
                      f"{s.p_adjusted:.3g}", "WORSE" if s.regressed else "ok")
    return table


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    """Compare policy B with policy A on one suite; exit 0 when B is not worse, else 1."""
    from stages.evaluation.compare import compare_scenes

    with _stdout_for(args):
        a, b = _evaluate([args.a, args.b], args, quiet=args.json)
    comparison = compare_scenes(a.scenes, b.scenes, margin=args.margin, alpha=args.alpha)
    if args.json:
        print(json.dumps({"a": {"policy": a.policy, "digest": a.digest},
                          "b": {"policy": b.policy, "digest": b.digest},
                          "suite": a.suite.config.name, "suite_digest": a.suite.digest,
                          "worse": comparison.regressed,
                          "comparison": comparison.model_dump(mode="json")}))
    else:
        console.print(comparison_table(a.policy, b.policy, comparison))
        for ev in (a, b):
            if ev.latency_ms:
                console.print(f"{ev.policy}: {latency_line(ev.latency_ms)}", soft_wrap=True,
                              highlight=False, markup=False)
        verdict = ("B is WORSE: " + "; ".join(comparison.reasons) if comparison.regressed
                   else "B is not worse than A on any scene")
        console.print(verdict, soft_wrap=True, highlight=False, markup=False)
    return 1 if comparison.regressed else 0


POLICY_HELP = ("an ONNX or TorchScript file, a policy digest in the store, or models:/NAME/"
               "VERSION, models:/NAME@ALIAS, runs:/RUN_ID/PATH")


def _common(parser: argparse.ArgumentParser) -> None:
    """Flags that validate and compare share."""
    parser.add_argument("--suite", required=True, type=Path,
                        help="scene suite file; its task is the policy's task")
    parser.add_argument("--episodes", type=_episodes, default=None,
                        help="episodes per scene (default: the suite's)")
    parser.add_argument("--trust-code", action="store_true",
                        help="admit a TorchScript file, which is code that runs when loaded")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--tasks", action="append", default=None, metavar="FILE",
                        help="a task file to register first, as a pipeline config's tasks: "
                        "does (the suite's task when a task file defines it, e.g. "
                        "sim_scenes/pusher_reach/task.yaml); repeatable")
    parser.add_argument("--remote-timeout", type=float, default=5.0, metavar="S",
                        help="for a ws:// policy server: longest wait for one answer before "
                        "the call's episodes count as failed (default 5 s)")
    _obs_key_flag(parser, "for a ws:// policy server: send the policy input INPUT (obs, "
                  "<camera>_image) as KEY, e.g. front_image=observation/image; over the "
                  "suite's remote.keys, the server's own keys, else OpenPI's "
                  "(observation/state, observation/image, observation/wrist_image)")
    parser.add_argument("--prompt", default=None, metavar="TEXT",
                        help="for a ws:// policy server: the instruction sent as prompt "
                        "with every observation (default: the suite's remote.prompt)")
    chunks = parser.add_mutually_exclusive_group()
    chunks.add_argument("--chunk-execute", type=_positive(int), default=None, metavar="N",
                        help="a policy that emits chunks of actions runs the first N of each "
                        "chunk, then is asked again (default: all of each chunk)")
    chunks.add_argument("--chunk-ensemble", type=_non_negative, default=None, metavar="M",
                        help="a policy that emits chunks is asked every step, and acts on "
                        "ACT's temporal ensembling of its chunks (the i-th oldest weighs "
                        "exp(-M i); ACT's default M is 0.01)")
    _trust_flags(parser)
    _units_flag(parser)


def _non_negative(value: str) -> float:
    """A finite number of at least 0 (argparse exits 2 otherwise)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (x >= 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (value: {x})")
    return x


def _obs_key(value: str) -> tuple[str, str]:
    """``--obs-key INPUT=KEY`` (argparse exits 2 otherwise)."""
    name, _, key = value.partition("=")
    if not name.strip() or not key.strip():
        raise argparse.ArgumentTypeError(f"expected INPUT=KEY, e.g. "
                                         f"front_image=observation/image (value: {value!r})")
    return name.strip(), key.strip()


def _obs_key_flag(parser: argparse.ArgumentParser, text: str) -> None:
    """``--obs-key INPUT=KEY``, repeatable: the message key of a policy input."""
    parser.add_argument("--obs-key", type=_obs_key, action="append", default=None,
                        metavar="INPUT=KEY", help=f"{text}; repeatable")


def _units_flag(parser: argparse.ArgumentParser) -> None:
    """``--action-units``: the units of the actions of a policy file or MLflow model."""
    from stages.core.units import UNITS

    parser.add_argument("--action-units", choices=UNITS, default=None,
                        help="the units a policy file's or MLflow model's actions are in: "
                        "native (the environment's own; mapped to the task's -1..1) or "
                        "normalized (-1..1; probe actions beyond are refused); default: taken "
                        "as normalized, unchecked. Policies stored here, bundles and servers "
                        "act in the task's convention already")


def _trust_flags(parser: argparse.ArgumentParser) -> None:
    """``--trust`` or ``--allow-unsigned``: how a bundle named as a policy is admitted."""
    trust = parser.add_mutually_exclusive_group()
    trust.add_argument("--trust", type=Path, default=None, metavar="KEY",
                       help="a bundle must be signed with this public key's private key "
                       "(default: this project's own public key)")
    trust.add_argument("--allow-unsigned", action="store_true",
                       help="run a bundle that is unsigned or signed by another key, "
                       "unauthenticated (a warning line each time)")


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    """Serve a policy over OpenPI's websocket protocol until interrupted."""
    import math
    import signal
    import threading

    from stages.policies import policy_server
    limits = _server_limits(args)
    if limits.api_key is None:
        _refuse_open_server(args.host, args.allow_no_key)
    with tempfile.TemporaryDirectory(prefix="physai-serve-") as work:
        act, metadata = _served_policy(args, Path(work))
        metadata["max_batch"] = limits.max_batch
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        ready = threading.Event()
        thread = threading.Thread(target=policy_server.serve,
                                  args=(act, metadata, args.host, args.port),
                                  kwargs={"ready": ready, "stop": stop, "limits": limits},
                                  daemon=True)
        thread.start()
        if not ready.wait(30):
            from physai_core.errors import PhysaiError

            raise PhysaiError(f"flows policy serve: could not listen on {args.host}:{args.port}")
        images = metadata.get("image_shapes", {})
        reads = ", ".join(f"{key} ({'x'.join(map(str, images[key]))})" if key in images
                          else key for key in metadata["keys"].values())
        frame = limits.max_frame_bytes(int(metadata["obs_dim"]),
                                       sum(math.prod(shape) for shape in images.values()))
        print(f"serving {args.policy} ({metadata['task']}, policy {metadata['policy_digest'][:12]}"
              f") on ws://{args.host}:{args.port}; reads {reads}; at most "
              f"{limits.max_connections} clients, {limits.max_batch} observations a call, "
              f"{frame} bytes a frame, {limits.call_timeout_s:g} s a call; "
              f"{'API key required' if limits.api_key else 'no API key'}",
              file=sys.stderr, flush=True)
        thread.join()
    return 0


def _refuse_open_server(host: str, allow_no_key: bool) -> None:
    """Refuse to serve with no API key on ``host`` unless every address it resolves to is a
    loopback one, or ``--allow-no-key`` says to (then a warning line): one line naming
    ``--host`` and its value, exit status 2, before anything is loaded or bound."""
    from physai_core.errors import ConfigError
    from stages.policies.wire import API_KEY_VAR

    beyond = beyond_loopback(host)
    if beyond is None:
        return
    if not allow_no_key:
        raise ConfigError.one("flows policy serve", "--host", host,
                              f"{beyond}: with no API key anyone who reaches it could call the "
                              f"policy; give --api-key-file FILE or ${API_KEY_VAR}, or "
                              "--allow-no-key to serve it open")
    print(f"warning: serving on {host} with no API key ({beyond}; --allow-no-key): anyone who "
          "reaches this address may call the policy", file=sys.stderr, flush=True)


def beyond_loopback(host: str) -> str | None:
    """Why serving on ``host`` may answer other machines, or None when every address it
    resolves to (:func:`socket.getaddrinfo`, as the server binds it) is a loopback one:
    ``localhost``, ``127.0.0.2`` and ``::1`` are; ``0.0.0.0``, ``::``, a name resolving
    elsewhere and one that does not resolve are not."""
    import ipaddress
    import socket

    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f"it does not resolve to an address ({type(exc).__name__})"

    def loopback(address: str) -> bool:
        try:
            return ipaddress.ip_address(address.partition("%")[0]).is_loopback
        except ValueError:
            return False

    outside = sorted({str(info[4][0]) for info in found if not loopback(str(info[4][0]))})
    if not found or outside:
        return f"it resolves to {', '.join(outside) or 'no address'}, beyond loopback"
    return None


def _server_limits(args: argparse.Namespace) -> ServerLimits:
    """The server's :class:`stages.policies.policy_server.ServerLimits` from the flags; the API
    key from ``--api-key-file`` or ``$PHYSAI_POLICY_API_KEY`` (never printed)."""
    from physai_core.errors import ConfigError
    from stages.core.loading import read_capped
    from stages.policies.policy_server import ServerLimits
    from stages.policies.wire import API_KEY_VAR

    key = os.environ.get(API_KEY_VAR, "").strip() or None
    if args.api_key_file is not None:
        raw = read_capped(args.api_key_file, MAX_KEY_BYTES, "--api-key-file")
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError.one(args.api_key_file, "--api-key-file", str(args.api_key_file),
                                  "cannot read the key (not UTF-8)") from None
        if not key or len(key.splitlines()) != 1:
            raise ConfigError.one(args.api_key_file, "--api-key-file", str(args.api_key_file),
                                  "the file must hold the key on one line")
    return ServerLimits(max_batch=args.max_batch, max_connections=args.max_connections,
                        call_timeout_s=args.call_timeout, api_key=key)


def _served_policy(args: argparse.Namespace, work: Path) -> tuple[Any, dict[str, Any]]:
    """The policy ``args.policy`` names and the metadata the server sends: a bundle (its
    verified ONNX; a bundle file, or one the store holds by its digest, signed with the trust
    key unless ``--allow-unsigned``), or anything ``flows validate`` takes (``--task`` for a
    bare file)."""
    from flows.servers import prepare_environment
    from stages.artifacts.records import EdgeBundle
    from stages.orchestration.context import open_services
    from stages.sim.tasks.catalog import get_task
    from stages.training.imported import is_bundle, is_mlflow_uri, open_bundle, resolve_policy

    ref = args.policy
    refuse_unknown([ref])
    trust_key = bundle_trust(args)
    if not is_mlflow_uri(ref) and is_bundle(Path(ref)):
        resolved, task = open_bundle(Path(ref), work, trust_key=trust_key,
                                     allow_unsigned=args.allow_unsigned)
    else:
        prepare_environment()
        _, store, lineage = open_services()
        digest = ref.removeprefix("sha256:")
        stored = store.get(digest) if len(digest) == 64 and store.has(digest) else None
        if isinstance(stored, EdgeBundle):
            resolved, task = open_bundle(store.open_payload(stored), work, trust_key=trust_key,
                                         allow_unsigned=args.allow_unsigned, shown=ref)
            return resolved.act, _metadata(get_task(task), resolved, args.obs_key)
        task = args.task or _policy_task(ref, store, lineage)
        resolved = resolve_policy(ref, get_task(task), store, lineage,
                                  trust_code=args.trust_code, work=work, trust_key=trust_key,
                                  allow_unsigned=args.allow_unsigned,
                                  action_units=args.action_units)
    return resolved.act, _metadata(get_task(task), resolved, args.obs_key)


def _metadata(spec: TaskSpec, resolved: ResolvedPolicy,
              obs_keys: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """What the server sends a client on connecting: the task, its sizes, the policy, the key
    of each input it reads (``--obs-key`` over :func:`stages.policies.wire.default_keys`), the
    shape of each image by its key, and a chunk policy's ``chunk_size``. A key naming no input of
    the policy, or an image input no camera of the task gives, is one line (exit status 2)."""
    from physai_core.errors import ConfigError
    from stages.policies.wire import key_map
    from stages.sim.env.observation import STATE_KEY, policy_inputs

    inputs = policy_inputs(resolved.act)
    try:
        keys = key_map(inputs, dict(obs_keys or []))
    except ValueError as exc:
        raise ConfigError.one(resolved.digest[:12], "--obs-key", dict(obs_keys or []),
                              str(exc)) from None
    shapes = {keys[key]: list(camera.shape(key)) for camera in spec.cameras
              for key in camera.tensors() if key in keys}
    unseen = [name for name in inputs if name != STATE_KEY and keys[name] not in shapes]
    if unseen:
        raise ConfigError.one(resolved.digest[:12], "inputs", unseen,
                              f"no camera of task {spec.name} gives them")
    meta = {"task": spec.name, "obs_dim": spec.obs_dim, "act_dim": spec.act_dim,
            "obs_names": list(spec.obs_names), "action_names": list(spec.action_names),
            "control_hz": spec.control_hz, "policy_digest": resolved.digest,
            "policy_kind": resolved.kind, "server": "physai-flows", "keys": keys}
    if shapes:
        meta["image_shapes"] = shapes
    chunk = getattr(resolved.act, "chunk_size", None)
    if isinstance(chunk, int) and chunk > 0:
        meta["chunk_size"] = chunk
    return meta


def _policy_task(ref: str, store: Any, lineage: Any) -> str:
    """The task of a policy in the store or the registry; a bare file needs ``--task``."""
    from physai_core.errors import ConfigError
    from stages.artifacts.records import Policy
    from stages.training.imported import registered_model

    digest = ref.removeprefix("sha256:")
    if ref.startswith("models:/"):
        digest = registered_model(lineage, ref).tags.get("physai.policy.digest", "")
    if digest and store.has(digest):
        artifact = store.get(digest)
        if isinstance(artifact, Policy):
            return artifact.task
    raise ConfigError.one(ref, "--task", None, "name the policy's task (--task reach-v0): "
                          "it is neither a bundle nor a policy of this project's store")


def _positive(kind: type[int] | type[float]) -> Any:
    """An argparse type: a positive ``kind`` (argparse exits 2 otherwise)."""
    def parse(value: str) -> int | float:
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {value!r}") from None
        if not x > 0:
            raise argparse.ArgumentTypeError(f"must be positive (value: {x})")
        return x

    return parse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows validate`` and ``flows compare``."""
    val = sub.add_parser("validate", help="run any policy over a scene suite: per-scene "
                         "success with 95%% Wilson intervals and gates (exit 1: a gate failed)")
    val.add_argument("policy", help=POLICY_HELP)
    _common(val)
    val.add_argument("--min-success", type=_fraction, default=None,
                     help="each scene passes when its 95%% Wilson lower bound reaches this "
                          f"(default {DEFAULT_MIN_SUCCESS:g}; a line says when it is looser "
                          "than a pipeline config's validate.min_success for the suite)")
    val.add_argument("--sequential", action="store_true",
                     help="each scene stops once its gate's verdict is clear: a policy at "
                          "--min-success passes, and one 0.1 above it fails, each at most 5%% of "
                          "the time; the suite's episodes are the most a scene spends")
    val.add_argument("--chunk", type=_episodes, default=10,
                     help="with --sequential: episodes between two looks (default 10)")
    val.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                     help=f"MLflow experiment of the run (default {DEFAULT_EXPERIMENT})")
    val.set_defaults(func=cmd_validate)
    cmp = sub.add_parser("compare", help="promotion's champion test between two policies on "
                         "one suite (exit 0: B is not worse than A; 1: it is)")
    cmp.add_argument("a", help=f"the reference (champion): {POLICY_HELP}")
    cmp.add_argument("b", help="the challenger, named the same ways")
    _common(cmp)
    cmp.add_argument("--margin", type=_within(0.0, 1.0, "[0, 1)"), default=0.05,
                     help="tolerated drop in success rate (default 0.05)")
    cmp.add_argument("--alpha", type=_within(0.0, 0.5, "(0, 0.5)"), default=0.05,
                     help="family-wise false-alarm rate (default 0.05)")
    cmp.set_defaults(func=cmd_compare)
    pol = sub.add_parser("policy", help="serve a policy to robots and other harnesses")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    srv = pol_sub.add_parser("serve", help="serve a policy over OpenPI's websocket policy "
                             "protocol (openpi-client's WebsocketClientPolicy talks to it)")
    srv.add_argument("policy", help=f"an edge bundle (.tar), or {POLICY_HELP}")
    srv.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    srv.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1; "
                     "0.0.0.0 serves every interface); one that resolves beyond loopback "
                     "needs an API key (--api-key-file) or --allow-no-key")
    srv.add_argument("--task", default=None, help="the policy's task, for a bare ONNX or "
                     "TorchScript file")
    srv.add_argument("--trust-code", action="store_true",
                     help="admit a TorchScript file, which is code that runs when loaded")
    _obs_key_flag(srv, "read the policy input INPUT (obs, <camera>_image) from the message "
                  "key KEY (its own name is read too); default: obs alone for a state "
                  "policy, else OpenPI's observation/state, observation/image (the first "
                  "camera), observation/wrist_image (a camera named wrist), "
                  "observation/<camera>_image")
    _trust_flags(srv)
    _units_flag(srv)
    from stages.policies import policy_server, wire
    srv.add_argument("--max-batch", type=_positive(int), default=wire.DEFAULT_MAX_BATCH,
                     help="most observations in one call; a frame's size cap follows from "
                     f"it and the observation width (default {wire.DEFAULT_MAX_BATCH})")
    srv.add_argument("--max-connections", type=_positive(int),
                     default=policy_server.DEFAULT_MAX_CONNECTIONS,
                     help=f"most clients at once (default {policy_server.DEFAULT_MAX_CONNECTIONS})")
    srv.add_argument("--call-timeout", type=_positive(float),
                     default=policy_server.DEFAULT_CALL_TIMEOUT_S, metavar="S",
                     help="longest the policy may take over one call before the answer is "
                     f"an error (default {policy_server.DEFAULT_CALL_TIMEOUT_S:g} s)")
    srv.add_argument("--api-key-file", type=Path, default=None, metavar="FILE",
                     help="clients must send the key this file holds (openpi-client's "
                     f"api_key); default: ${wire.API_KEY_VAR} when set, else no key")
    srv.add_argument("--allow-no-key", action="store_true",
                     help="serve with no API key on a --host beyond loopback, where anyone "
                     "who reaches it may call the policy (a warning line); without it that "
                     "is refused, exit 2")
    srv.set_defaults(func=cmd_serve)

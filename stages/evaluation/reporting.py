"""Reporting an evaluation: its MLflow run (parameters, per-scene metrics, the report JSON,
the plots, the rollout videos, USD stages and episode tables), the HTML report page in that
run, and the Cosmos critic's verdict on the filmed episodes. The validate stage and
``flows validate`` both report through here."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.artifacts.records import (
    CriticVerdict,
    GateResult,
    SceneResult,
    SimReport,
    SimToSim,
    SweepCurve,
)
from stages.evaluation.plots import report_plots
from stages.evaluation.rollout import Rollout, VideoSpec
from stages.evaluation.sensitivity import METHOD as SENSITIVITY_METHOD
from stages.evaluation.suite import Evaluation
from stages.sections.models import CriticConfig
from stages.sim.tasks.catalog import TaskSpec
from stages.storage.store import ArtifactStore
from stages.tracking.lineage import LineageRecorder, StageRun

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

REPORT_HTML = "report.html"
"""The evaluation report's file name in the validation run's MLflow artifacts."""


def log_scene_metrics(run: Any, scenes: tuple[SceneResult, ...]) -> None:
    """Each scene's success rate, its 95% interval and its mean return as metrics of ``run``:
    ``<scene>/success_rate``, ``<scene>/ci_low``, ``<scene>/ci_high``, ``<scene>/mean_return``."""
    for r in scenes:
        run.log_metrics({f"{r.scene}/success_rate": r.success_rate,
                         f"{r.scene}/ci_low": r.ci_low, f"{r.scene}/ci_high": r.ci_high,
                         f"{r.scene}/mean_return": r.mean_return})


def log_sweep_metrics(run: Any, sweeps: tuple[SweepCurve, ...]) -> None:
    """Every sweep point's success rate as a metric of ``run``:
    ``<scene>/sweep/<i>/success_rate``."""
    for curve in sweeps:
        for i, r in enumerate(curve.points):
            run.log_metrics({f"{curve.scene}/sweep/{i}/success_rate": r.success_rate})


def log_extras(run: Any, body: dict[str, Any], scenes: tuple[SceneResult, ...],
               sweeps: tuple[SweepCurve, ...], sim_to_sim: SimToSim | None) -> None:
    """Log the sweeps, the second backend's rates and the critic's verdicts, and add the first
    two to the report's ``body``."""
    if sweeps:
        body["sweeps"] = [c.model_dump() for c in sweeps]
        run.log_dict({"sweeps": body["sweeps"]}, "sweeps.json")
        log_sweep_metrics(run, sweeps)
    if sim_to_sim is not None:
        body["sim_to_sim"] = sim_to_sim.model_dump()
        other = sim_to_sim.backend
        run.log_params({"compare_backend": other,
                        "compare_backend_version": sim_to_sim.backend_version})
        for r, a in zip(sim_to_sim.scenes, sim_to_sim.agreement, strict=True):
            run.log_metrics({f"{r.scene}/{other}/success_rate": r.success_rate,
                             f"{r.scene}/{other}/difference": a.difference,
                             f"{r.scene}/{other}/p_value": a.p_value})
    verdicts = {r.scene: r.critic.model_dump() for r in scenes if r.critic is not None}
    if verdicts:
        run.log_metrics({"critic/pass_rate": sum(v["passed"] for v in verdicts.values())
                         / len(verdicts)})
        run.log_metrics({f"{scene}/critic_passed": float(v["passed"])
                         for scene, v in verdicts.items()})
        run.log_dict(verdicts, "critic.json")


def log_plots(run: Any, scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...],
              sweeps: tuple[SweepCurve, ...], sim_to_sim: SimToSim | None) -> dict[str, Any]:
    """Draw the report's plots (:func:`~stages.evaluation.plots.report_plots`), log the sweeps
    and the sensitivity with its ranking, and return them all by name."""
    plots = report_plots(scenes, gates, sweeps, sim_to_sim)
    if "sweeps" in plots:
        run.log_figure(plots["sweeps"], "sweeps.png")
    if "sensitivity" in plots:
        ranked = {r.scene: [f.model_dump(mode="json") for f in r.factors]
                  for r in scenes if r.factors}
        run.log_dict({"method": SENSITIVITY_METHOD, "scenes": ranked}, "sensitivity.json")
        run.log_figure(plots["sensitivity"], "sensitivity.png")
    return plots


def log_report_page(run: StageRun, report: SimReport, plots: dict[str, Figure], title: str,
                    store: ArtifactStore, scratch: Path) -> None:
    """The evaluation report (stages/evaluation/report_page.py) as ``report.html`` in the run,
    with each scene's misses read from its episode table in the store."""
    from stages.evaluation.episodes import read_parquet
    from stages.evaluation.report_page import render_report

    gifs = {s.scene: store.open_payload(store.get(s.video_digest)).read_bytes()
            for s in report.scenes if s.video_digest is not None}
    tables = {s.scene: read_parquet(store.open_payload(store.get(s.episodes_digest)))
              for s in report.scenes if s.episodes_digest is not None}
    log_page(run, render_report(report, plots, gifs, title, tables), scratch)


def log_page(run: StageRun, page: str, scratch: Path) -> None:
    """Log the HTML ``page`` as :data:`REPORT_HTML` in ``run``'s artifacts (written under
    ``scratch`` on the way, and removed)."""
    path = scratch / f"report-{run.run_id}" / REPORT_HTML
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    run.log_artifact(path)
    shutil.rmtree(path.parent)


def report_location(lineage: LineageRecorder, run_id: str) -> str:
    """Where run ``run_id``'s :data:`REPORT_HTML` can be opened: a local file where MLflow
    keeps the run's artifacts on this machine (a ``file:`` root, or the artifact folder of the
    ``flows server up`` server), else the artifact's URI."""
    from urllib.parse import unquote, urlparse
    from urllib.request import url2pathname

    from stages.core.settings import resolve_settings

    uri = f"{lineage.call('get_run', run_id).info.artifact_uri.rstrip('/')}/{REPORT_HTML}"
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return url2pathname(unquote(parsed.path))
    if parsed.scheme == "mlflow-artifacts":
        local = resolve_settings().mlflow_artifacts / unquote(parsed.path).lstrip("/")
        if local.is_file():
            return str(local)
    return uri


def log_episodes(run: StageRun, scenes: tuple[SceneResult, ...], store: ArtifactStore,
                 scratch: Path) -> None:
    """Upload each scene's per-episode records to the validation run:
    ``episodes/<scene>.parquet``."""
    folder = scratch / f"episodes-{run.run_id}"
    folder.mkdir(exist_ok=True)
    for s in scenes:
        if s.episodes_digest is None:
            continue
        table = folder / f"{s.scene}.parquet"
        shutil.copyfile(store.open_payload(store.get(s.episodes_digest)), table)
        run.log_artifact(table, "episodes")
    shutil.rmtree(folder)


def log_videos(run: StageRun, scenes: tuple[SceneResult, ...], store: ArtifactStore,
               scratch: Path, suffix_name: str = "") -> None:
    """Upload each scene's rollout GIF and USD stage to the validation run, beside each other:
    ``videos/<scene>.gif`` and ``videos/<scene>.usda`` (``<scene>-<backend>`` on a suite's
    second backend)."""
    folder = scratch / f"videos-{run.run_id}{suffix_name}"
    folder.mkdir(exist_ok=True)
    for s in scenes:
        for digest, suffix in ((s.video_digest, ".gif"), (s.usd_digest, ".usda")):
            if digest is None:
                continue
            clip = folder / f"{s.scene}{suffix_name}{suffix}"
            shutil.copyfile(store.open_payload(store.get(digest)), clip)
            run.log_artifact(clip, "videos")
    shutil.rmtree(folder)


def critique(cfg: CriticConfig, spec: TaskSpec, scene: str, episodes: int, out: Rollout,
             video: VideoSpec) -> CriticVerdict:
    """The Cosmos critic's verdict on a scene's filmed episodes, or on what the policy saw of
    them (``validate.critic.camera``; stages/evaluation/critic.py)."""
    from stages.evaluation import critic
    frames, camera = critic.watched(cfg, scene, out.frames, out.seen)
    ep = critic.endpoint(cfg)
    clip = critic.encode_mp4(frames, fps=spec.control_hz / video.every)
    prompt = critic.PROMPT.format(episodes=episodes, task=spec.name, scene=scene,
                                  success=spec.success_tolerance)
    if camera is not None:
        prompt += critic.SEEN_NOTE.format(camera=camera)
    verdict = critic.judge(ep, scene, clip, prompt)
    log.info("Cosmos critic on %s: %s", scene, "pass" if verdict.passed else "FAIL")
    return verdict


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


def suite_summary(scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...]
                  ) -> dict[str, Any]:
    """The suite as one line, for a multi-task suite (MetaWorld's MT10: one scene per task):
    the mean of the scenes' success rates (the number such suites publish), the episodes
    pooled with their Wilson interval, and how many scenes passed their own gate."""
    from stages.evaluation.stats import wilson_interval

    episodes = sum(s.episodes for s in scenes)
    successes = sum(s.successes for s in scenes)
    low, high = wilson_interval(successes, episodes) if episodes else (0.0, 0.0)
    passed = sum(g.passed for g in gates if g.name.startswith("success/"))
    return {"scenes": len(scenes), "scenes_passed": passed,
            "mean_success": sum(s.success_rate for s in scenes) / len(scenes) if scenes else 0.0,
            "episodes": episodes, "successes": successes, "ci_low": low, "ci_high": high}


def summary_line(summary: dict[str, Any]) -> str:
    """:func:`suite_summary` in words."""
    return (f"suite: mean success {summary['mean_success']:.3f} over {summary['scenes']} "
            f"scenes; pooled {summary['successes']}/{summary['episodes']} "
            f"[{summary['ci_low']:.3f}, {summary['ci_high']:.3f}]; {summary['scenes_passed']}"
            f"/{summary['scenes']} scenes pass their gate")


def sweep_row(curve: SweepCurve) -> dict[str, Any]:
    """One swept scene's curve as JSON: its fields, and per grid point the values and the
    success rate with its Wilson interval."""
    return {"scene": curve.scene, "fields": list(curve.fields), "points": [
        {"sweep": p.sweep, "episodes": p.episodes, "successes": p.successes,
         "success_rate": p.success_rate, "ci_low": p.ci_low, "ci_high": p.ci_high,
         "mean_return": p.mean_return} for p in curve.points]}


def validation_body(ev: Evaluation, gates: tuple[GateResult, ...], min_success: float,
                    min_success_given: bool) -> dict[str, Any]:
    """``flows validate``'s JSON object for ``ev`` gated by ``gates`` (before its MLflow run
    and report are added): the policy, the suite, one row per scene, the gates, the verdict and
    the threshold; a remote policy's latencies and the sweep curves where there are any."""
    body: dict[str, Any] = {
        "policy": ev.policy, "policy_digest": ev.digest, "policy_kind": ev.kind,
        "task": ev.suite.config.task, "suite": ev.suite.config.name,
        "suite_digest": ev.suite.digest, "scenes": scene_rows(ev.scenes, gates),
        "summary": suite_summary(ev.scenes, gates),
        "gates": [g.model_dump() for g in gates], "passed": all(g.passed for g in gates),
        "min_success": min_success, "min_success_given": min_success_given,
    }
    if ev.latency_ms:
        body["remote_latency_ms"] = ev.latency_ms
    if ev.sweeps:
        body["sweeps"] = [sweep_row(c) for c in ev.sweeps]
    add_instructions(body["scenes"], ev)
    return body


def add_instructions(rows: list[dict[str, Any]], ev: Evaluation) -> None:
    """Add to each scene row of ``ev`` whose scene gives an instruction its ``instruction``
    (the scene file's text or list) and, where its episodes ran here, ``by_instruction``: each
    instruction's episodes and success (:func:`~stages.evaluation.episodes.by_instruction`)."""
    from stages.evaluation.episodes import by_instruction

    given = {s.scene.config.name: s.scene.config.instruction for s in ev.suite.scenes}
    for row in rows:
        instruction = given.get(row["name"])
        if instruction is None:
            continue
        row["instruction"] = instruction
        out = ev.rollouts.get(row["name"])
        if out is not None and out.episodes is not None:
            row["by_instruction"] = by_instruction(out.episodes)


def log_evaluation(lineage: LineageRecorder, ev: Evaluation, gates: tuple[GateResult, ...],
                   body: dict[str, Any], experiment: str) -> tuple[str, str]:
    """An MLflow run in ``experiment`` holding the evaluation ``ev`` (``flows validate``'s):
    params, per-scene metrics, the report JSON ``body`` and the evaluation report the validate
    stage writes (``report.html``). Returns the run's id and where the report can be opened."""
    passed = all(g.passed for g in gates)
    run = lineage.start_run(experiment, f"validate {Path(ev.policy).name or ev.policy}", {
        "physai.policy.digest": ev.digest, "physai.policy.source": ev.policy,
        "physai.suite_digest": ev.suite.digest, "physai.gates_passed": passed})
    run.log_params({"policy": ev.policy, "policy_kind": ev.kind, "suite": ev.suite.config.name,
                    "suite_path": str(ev.suite.path), "task": ev.suite.config.task})
    log_scene_metrics(run, ev.scenes)
    plots = report_plots(ev.scenes, gates, ev.sweeps)
    if ev.sweeps:
        log_sweep_metrics(run, ev.sweeps)
        run.log_figure(plots["sweeps"], "sweeps.png")
    run.log_dict(body, "sim_report.json")
    log_evaluation_page(run, ev, gates, plots)
    run.flush()
    lineage.end_run(run.run_id)
    return run.run_id, report_location(lineage, run.run_id)


def log_evaluation_page(run: Any, ev: Evaluation, gates: tuple[GateResult, ...],
                        plots: dict[str, Any]) -> None:
    """The evaluation report of ``ev`` (stages/evaluation/report_page.py) as ``report.html`` in
    ``run``: the page the validate stage writes, with the episodes' misses and what a policy that
    sees was shown; no rollout is filmed here."""
    from stages.evaluation.report_page import ReportView, render_page
    from stages.sim.backends.catalog import backend_version

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

"""Terminal output of the CLI: progress bars per stage, the summary table, the lineage tree."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from stages.orchestration.context import ProgressBar
from stages.pipeline.run import PipelineResult

PREFECT_LOG_EVERY_S = 10.0
"""Shortest time between two progress lines a bar sends to its Prefect task run's log."""
_API_HANDLER: list[logging.Handler] = []


def to_prefect_log(text: str) -> None:
    """Send ``text`` to the Prefect log of the task run of this thread (none: nothing), through
    Prefect's API handler alone: no logger is configured, nothing more is printed."""
    from prefect.context import TaskRunContext

    if TaskRunContext.get() is None:
        return
    if not _API_HANDLER:
        from prefect.logging.handlers import APILogHandler

        _API_HANDLER.append(APILogHandler())
    record = logging.LogRecord("physai.progress", logging.INFO, __file__, 0, text, None, None)
    _API_HANDLER[0].handle(record)


class _RichBar:
    def __init__(self, progress: Progress, task_id: TaskID, description: str,
                 total: int) -> None:
        self.progress = progress
        self.task_id = task_id
        self.description = description
        self.total = total
        self.done = 0
        self.logged = time.monotonic()

    def advance(self, n: int = 1, **fields: object) -> None:
        """Advance the bar and show ``fields`` beside it; every
        :data:`PREFECT_LOG_EVERY_S` (and at the end) the same line goes to the Prefect log of
        the stage's task run (a training's loss, a validation's success so far)."""
        extra = "  ".join(f"{k}={v}" for k, v in fields.items())
        self.progress.update(self.task_id, advance=n,
                             description=f"{self.description:<9} {extra}")
        self.done += n
        now = time.monotonic()
        if extra and (now - self.logged >= PREFECT_LOG_EVERY_S or self.done >= self.total):
            self.logged = now
            to_prefect_log(f"{self.description}: {self.done}/{self.total} {extra}")


class RichProgress:
    """Progress bars on the terminal, one per stage, with counts, elapsed time and ETA."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )

    @contextmanager
    def bar(self, description: str, total: int) -> Iterator[ProgressBar]:
        """A bar for ``total`` units of ``description``."""
        task_id = self.progress.add_task(f"{description:<9}", total=total)
        try:
            yield _RichBar(self.progress, task_id, description, total)
        finally:
            self.progress.update(task_id, completed=total)

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


ANSWER_TIMEOUT_S = 1.0
"""Longest wait for an MLflow server to answer before its link is left out."""


def server_answers(url: str, timeout_s: float = ANSWER_TIMEOUT_S) -> bool:
    """Whether an HTTP server at ``url`` answers it within ``timeout_s`` seconds with the
    resource (200) or a demand for credentials (401, 403); a refused or silent address, or any
    other answer, does not count."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    # A proxy answering for this machine's own address would say nothing about a server here.
    local = parts.hostname in ("127.0.0.1", "localhost", "::1")
    opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if local else []))
    try:
        with opener.open(url, timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code in (401, 403)
    except (OSError, ValueError):
        return False


def mlflow_line(url: str, run_id: str) -> str:
    """``MLflow run: URL`` when the MLflow server of ``url`` answers for run ``run_id``
    (:func:`server_answers`, its REST API); else the run's id and how to serve the UI."""
    base = url.partition("#")[0].rstrip("/")
    if server_answers(f"{base}/api/2.0/mlflow/runs/get?run_id={run_id}"):
        return f"MLflow run: {url}"
    return (f"MLflow run {run_id}: no MLflow server answers for it at {base} "
            "(`flows server up` serves the UI)")


def report_line(run_id: str | None) -> str | None:
    """Where the validation run ``run_id``'s evaluation report can be opened
    (:func:`stages.evaluation.reporting.report_location`); None without a run."""
    from stages.evaluation.reporting import report_location
    from stages.orchestration.context import open_services

    if run_id is None:
        return None
    _, _, lineage = open_services()
    return f"evaluation report: {report_location(lineage, run_id)}"


def summary_lines(result: PipelineResult) -> list[str]:
    """The lines under the summary table: the suite in one line (several scenes), latency,
    parity, model and alias, cache hits, the evaluation report and the run (its link only when
    an MLflow server answers there)."""
    from stages.evaluation.reporting import suite_summary, summary_line

    b, p = result.bundle, result.promotion
    alias = (f"-> @{p.alias}" if p.promoted
             else f"(@{p.alias} not moved: " + "; ".join(p.reasons) + ")")
    report = report_line(result.report.mlflow_run_id)
    scenes = result.report.scenes
    suite = [summary_line(suite_summary(scenes, result.report.gates))] if len(scenes) > 1 else []
    return [
        *suite,
        f"latency p99 {b.latency_p99_us:.1f} us, p50 {b.latency_p50_us:.1f} us "
        f"(ONNX Runtime, CPU, batch 1); parity max |diff| {b.parity_max_abs_diff:.1e}",
        f"model models:/{p.model_name}/{p.version} {alias}",
        f"against the champion: {p.comparison}",
        f"cached stages: {', '.join(result.cached) or 'none'}",
        *([report] if report else []),
        mlflow_line(result.run_url, result.run_id),
    ]


def summary_table(result: PipelineResult, seconds: float) -> Table:
    """The end-of-run table: per-scene success with 95% intervals and the gate of each scene."""
    r = result.report
    table = Table(title=f"pipeline finished in {seconds:.1f} s", title_justify="left")
    table.add_column("scene", no_wrap=True)
    table.add_column("n", justify="right")
    table.add_column("success [95% CI]", justify="right", no_wrap=True)
    table.add_column("return", justify="right")
    table.add_column("gate: CI low >=", no_wrap=True)
    judged = any(s.critic is not None for s in r.scenes)
    if judged:
        table.add_column("Cosmos critic", no_wrap=True)
    gates = {g.name: g for g in r.gates}
    for s in r.scenes:
        g = gates[f"success/{s.scene}"]
        verdict = "[green]pass[/]" if g.passed else "[red]FAIL[/]"
        row = [s.scene, str(s.episodes), f"{s.success_rate:.3f} [{s.ci_low:.3f}, {s.ci_high:.3f}]",
               f"{s.mean_return:.2f}", f"{verdict} {g.threshold:.2f}"]
        if judged:
            row.append("" if s.critic is None else
                       "[green]pass[/]" if s.critic.passed else "[red]FAIL[/]")
        table.add_row(*row)
    return table

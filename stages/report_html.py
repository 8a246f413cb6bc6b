"""The evaluation report: one self-contained HTML page per validation run.

It holds what a person reviewing a policy looks at, in this order: the verdict, the suite (its
digest, the simulator and its versions), a table per scene (counts, success rate, 95% Wilson
interval, gate), every gate, the success plot, the sweep curves and the sim-to-sim check when
the suite has them,
the sensitivity ranking of each scene (table and forest plot), and the rollout GIFs. Plots and
GIFs are embedded as data URIs, so the one file opens anywhere, offline; the validate stage logs
it to MLflow as ``report.html`` and links it from the Prefect flow run.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from typing import TYPE_CHECKING

from stages.artifacts import SimReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.pass { color: #17752b; font-weight: 600; } .fail { color: #b3261e; font-weight: 600; }
.rollouts figure { display: inline-block; margin: 0.5em 1em 0.5em 0; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _verdict(passed: bool) -> str:
    return '<span class="pass">pass</span>' if passed else '<span class="fail">FAIL</span>'


def _png(fig: Figure) -> str:
    """A figure as an ``<img>`` with a PNG data URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def render_report(report: SimReport, plots: Mapping[str, Figure],
                  gifs: Mapping[str, bytes], title: str) -> str:
    """The page for ``report``: ``plots`` by section (``success``, ``sensitivity``) and each
    scene's rollout GIF bytes by scene name."""
    esc = html.escape
    gate_of = {g.name: g for g in report.gates}
    scene_rows = []
    for s in report.scenes:
        gate = gate_of.get(f"success/{s.scene}")
        spent = str(s.episodes)
        if s.sequential is not None:
            spent += f" of {s.sequential.max_episodes} (sequential {s.sequential.verdict})"
        scene_rows.append([
            esc(s.scene), spent, f"{s.successes}/{s.episodes} = {s.success_rate:.3f}",
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}]", f"{s.mean_return:.3f}",
            f"{_verdict(gate.passed)} (&ge; {gate.threshold:g})" if gate else "-"])
    parts = [
        f"<h1>{esc(title)}</h1>",
        f"<p>Verdict: {_verdict(report.passed)}. Policy <code>{esc(report.parents[0])}</code>"
        f" on suite <code>{esc(report.suite)}</code>.</p>",
        '<h2 id="suite">Suite and simulator</h2>',
        _table(["field", "value"], [
            ["suite", esc(report.suite)],
            ["suite digest", f"<code>{esc(report.suite_digest)}</code>"],
            ["backend", esc(report.backend)], ["backend version", esc(report.backend_version)],
            ["MLflow run", esc(str(report.mlflow_run_id))]]),
        '<h2 id="scenes">Scenes</h2>',
        _table(["scene", "episodes", "success", "95% Wilson CI", "mean return", "gate"],
               scene_rows),
        '<h2 id="gates">Gates</h2>',
        _table(["gate", "measured", "threshold", "result", "detail"],
               [[esc(g.name), f"{g.measured:.4g}", f"{g.threshold:.4g}", _verdict(g.passed),
                 esc(g.detail)] for g in report.gates]),
    ]
    if "success" in plots:
        parts.append(_png(plots["success"]))
    parts += _sweep_section(report, plots) + _sim_to_sim_section(report)
    parts += _sensitivity_section(report, plots)
    parts.append('<h2 id="rollouts">Rollouts</h2>')
    if not gifs:
        parts.append("<p>No scene was filmed.</p>")
    figures = [f'<figure><img alt="{esc(name)}" src="data:image/gif;base64,'
               f'{base64.b64encode(data).decode()}"><figcaption>{esc(name)}</figcaption></figure>'
               for name, data in gifs.items()]
    parts.append(f'<div class="rollouts">{"".join(figures)}</div>')
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>")


def _sweep_section(report: SimReport, plots: Mapping[str, Figure]) -> list[str]:
    """The sweeps: their plot and a table per swept scene."""
    esc = html.escape
    parts: list[str] = []
    if report.sweeps:
        parts.append('<h2 id="sweeps">Sweeps</h2>')
        if "sweeps" in plots:
            parts.append(_png(plots["sweeps"]))
        for curve in report.sweeps:
            parts.append(f"<h3>{esc(curve.scene)}: {esc(', '.join(curve.fields))}</h3>")
            parts.append(_table(
                [*curve.fields, "success", "95% Wilson CI", "mean return"],
                [[*(f"{(r.sweep or {}).get(f, float('nan')):g}" for f in curve.fields),
                  f"{r.successes}/{r.episodes} = {r.success_rate:.3f}",
                  f"[{r.ci_low:.3f}, {r.ci_high:.3f}]", f"{r.mean_return:.3f}"]
                 for r in curve.points]))
    return parts


def _sim_to_sim_section(report: SimReport) -> list[str]:
    """The second backend's agreement table, when the suite has one."""
    esc = html.escape
    parts: list[str] = []
    if report.sim_to_sim is not None:
        check = report.sim_to_sim
        parts += [
            '<h2 id="sim-to-sim">Sim-to-sim</h2>',
            f"<p>{esc(report.backend)} against {esc(check.backend)} "
            f"({esc(check.backend_version)}); margin {check.margin:g}, alpha {check.alpha:g}; "
            f"{esc(check.method)}.</p>",
            _table(["scene", esc(report.backend), esc(check.backend), "difference", "95% CI",
                    "p", "agree"],
                   [[esc(a.scene), f"{a.first_successes}/{a.first_episodes}",
                     f"{a.second_successes}/{a.second_episodes}", f"{a.difference:+.3f}",
                     f"[{a.difference_ci_low:+.3f}, {a.difference_ci_high:+.3f}]",
                     f"{a.p_value:.3g}", _verdict(a.agrees)] for a in check.agreement])]
    return parts


def _sensitivity_section(report: SimReport, plots: Mapping[str, Figure]) -> list[str]:
    """What the failures go with, per scene that has both outcomes."""
    esc = html.escape
    parts: list[str] = []
    parts.append('<h2 id="sensitivity">Sensitivity: what the failures go with</h2>')
    ranked = [s for s in report.scenes if s.factors]
    if not ranked:
        parts.append("<p>No scene has both failed and successful episodes: nothing to "
                     "rank.</p>")
    for s in ranked:
        parts += [f"<h3>{esc(s.scene)}: {s.episodes - s.successes}/{s.episodes} failed</h3>",
                  _table(["factor", "unit", "effect (log-odds per SD)", "95% interval",
                          "mean when failed", "mean when succeeded"],
                         [[esc(f.name), esc(f.unit), f"{f.effect:+.3f}",
                           f"[{f.ci_low:+.3f}, {f.ci_high:+.3f}]", f"{f.mean_failed:.4g}",
                           f"{f.mean_succeeded:.4g}"] for f in s.factors])]
    if "sensitivity" in plots:
        parts.append(_png(plots["sensitivity"]))
    return parts

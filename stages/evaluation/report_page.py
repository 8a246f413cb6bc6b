"""The evaluation report: one self-contained HTML page per validation run.

It holds what a person reviewing a policy looks at, in this order: the verdict, the suite (its
digest, the simulator and its versions), a table per scene (counts, success rate, 95% Wilson
interval, gate, failures by mode), every gate, the success plot, the sweep curves and the
sim-to-sim check when the suite has them, how far the failed episodes missed (each scene's
``miss`` against the success boundary: near misses and episodes that never came close), the
sensitivity ranking of each scene (table and forest plot), what a policy that sees was shown
by its cameras, and the rollout GIFs. Plots, frames and GIFs are embedded as data URIs, so the
one file opens anywhere, offline; every plot fits a page 1,400 px wide. The validate stage and
``flows validate`` both write it and log it to MLflow as ``report.html``; the pipeline links it
from the Prefect flow run.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from stages.artifacts.records import GateResult, SceneResult, SimReport, SimToSim, SweepCurve
from stages.evaluation.episodes import by_instruction

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PAGE_WIDTH_IN = 13.6
"""Widest figure (inches): 1,360 px at the plots' 100 dpi, inside a 1,400 px page."""
PANELS_PER_ROW = 3
"""Most panels side by side in a figure of one panel per scene."""
NEAR = 2.0
"""A failed episode is a near miss when its miss is within this many times the success
boundary; beyond, it never came close."""
MISSED = "missed"
"""The failure mode of an episode that ran to its end without success
(:data:`stages.evaluation.episodes.MISSED`)."""


@dataclass(frozen=True)
class ReportView:
    """What the page shows of one validation: the pipeline's :class:`SimReport`, or what
    ``flows validate`` measured (:meth:`from_report` makes one from the first)."""

    policy: str
    """The policy as the page names it (its digest, or the reference it was given by)."""
    suite: str
    suite_digest: str
    backend: str
    backend_version: str
    mlflow_run_id: str | None
    scenes: tuple[SceneResult, ...]
    gates: tuple[GateResult, ...]
    passed: bool
    sweeps: tuple[SweepCurve, ...] = ()
    sim_to_sim: SimToSim | None = None

    @classmethod
    def from_report(cls, report: SimReport) -> ReportView:
        """The view of a published sim report; its first parent is the policy."""
        return cls(report.parents[0], report.suite, report.suite_digest, report.backend,
                   report.backend_version, report.mlflow_run_id, report.scenes, report.gates,
                   report.passed, report.sweeps, report.sim_to_sim)


SUCCESS_MISS = "success_miss"
"""Episode-table column of the miss below which an episode succeeds, where the environment
states it (``env.success_miss()``, in the unit of ``miss``); the same in every row."""


@dataclass(frozen=True)
class MissSummary:
    """How far one scene's episodes ended from success, in the unit of its ``miss`` column."""

    scene: str
    unit: str
    succeeded: np.ndarray
    """The finite misses of the successful episodes. Shape: (k,), float64."""
    failed: dict[str, np.ndarray]
    """The finite misses of the failed episodes, by failure mode. Each (m,), float64."""
    threshold: float | None
    """The miss below which an episode succeeds, as the environment states it; None where it
    states none."""
    boundary: tuple[float, float] | None
    """Without a stated threshold, where success ends as the outcomes place it: between the
    largest miss of a success and the smallest of a failure that ran to its end (of any
    failure where none did); None where they do not (no success, or the two overlap)."""

    @property
    def limit(self) -> float | None:
        """The near-miss limit: :data:`NEAR` times the threshold, or times the upper edge of
        the boundary (the closest failure that ran out, at or beyond the threshold)."""
        if self.threshold is not None:
            return NEAR * self.threshold
        return None if self.boundary is None else NEAR * self.boundary[1]

    def near_far(self) -> tuple[int, int] | None:
        """Failed episodes within the near-miss limit, and beyond it; None without one."""
        limit = self.limit
        if limit is None:
            return None
        misses = np.concatenate([*self.failed.values(), np.zeros(0)])
        near = int((misses <= limit).sum())
        return near, len(misses) - near


def miss_summary(scene: str, columns: Mapping[str, np.ndarray],
                 units: Mapping[str, str]) -> MissSummary | None:
    """The miss of each episode of a scene's table
    (:func:`stages.evaluation.episodes.episode_table`) split by outcome, against its
    :data:`SUCCESS_MISS` when it has one; None when the table has no ``miss`` column or no episode
    failed."""
    if "miss" not in columns:
        return None
    miss = np.asarray(columns["miss"], np.float64)
    success = np.asarray(columns["success"], bool)
    failure = np.asarray(columns.get("failure", np.where(success, "", MISSED))).astype(str)
    finite = np.isfinite(miss)
    if success.all():
        return None
    failed = {str(mode): miss[(failure == mode) & ~success & finite]
              for mode in sorted(set(failure[~success].tolist()))}
    succeeded = miss[success & finite]
    stated = np.asarray(columns.get(SUCCESS_MISS, np.zeros(0)), np.float64)
    threshold = float(stated[0]) if len(stated) and np.isfinite(stated[0]) else None
    ran_out = failed.get(MISSED, np.zeros(0))
    beyond = ran_out if len(ran_out) else np.concatenate([*failed.values(), np.zeros(0)])
    boundary = None
    if threshold is None and len(succeeded) and len(beyond) and succeeded.max() < beyond.min():
        boundary = (float(succeeded.max()), float(beyond.min()))
    return MissSummary(scene, units.get("miss", ""), succeeded, failed, threshold, boundary)


def panel_grid(panels: int, width: float, height: float, extra: float = 0.0
               ) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` panels of ``width`` x ``height`` inches, at most
    :data:`PANELS_PER_ROW` a row and never wider than :data:`PAGE_WIDTH_IN` (the panels
    shrink to fit); ``extra`` inches are added to the height (titles, labels)."""
    from matplotlib.figure import Figure

    columns = max(1, min(panels, PANELS_PER_ROW))
    rows = -(-panels // columns)
    scale = min(1.0, PAGE_WIDTH_IN / (columns * width + 0.4))
    fig = Figure(figsize=(columns * width * scale + 0.4, rows * height + extra), dpi=100)
    axes = list(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


_MODE_COLORS = {"succeeded": "tab:green", MISSED: "tab:red", "fell": "tab:orange"}
"""Bar colours of the miss histogram by outcome; other failure modes (a policy's own
reasons) are purple."""


def miss_plot(summaries: list[MissSummary]) -> Figure:
    """Per scene, a histogram of the episodes' miss: successes and each failure mode
    stacked, the success threshold drawn (or the boundary the outcomes place shaded) and the
    near-miss limit dashed."""
    fig, axes = panel_grid(len(summaries), 4.4, 3.2, 0.3)
    for ax, m in zip(axes, summaries, strict=True):
        groups = {"succeeded": m.succeeded, **m.failed}
        values = np.concatenate([*groups.values(), np.zeros(1)])
        top = float(values.max()) if values.max() > 0 else 1.0
        bins = np.linspace(0.0, top * 1.02, 31).tolist()
        colors = [_MODE_COLORS.get(k, "tab:purple") for k in groups]
        ax.hist(list(groups.values()), bins=bins, stacked=True, color=colors,
                label=[f"{k} ({len(v)})" for k, v in groups.items()])
        if m.threshold is not None:
            ax.axvline(m.threshold, color="k", linewidth=1.2,
                       label=f"success below {m.threshold:.3g}")
        elif m.boundary is not None:
            ax.axvspan(*m.boundary, color="k", alpha=0.2, label="success boundary")
        if m.limit is not None:
            ax.axvline(m.limit, color="k", linestyle="dashed", linewidth=0.9,
                       label=f"near miss: <= {m.limit:.3g}")
        ax.set_xlabel(f"miss ({m.unit})" if m.unit else "miss")
        ax.set_ylabel("episodes")
        ax.set_title(m.scene, fontsize="medium")
        ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.pass { color: #17752b; font-weight: 600; } .fail { color: #b3261e; font-weight: 600; }
.rollouts figure { display: inline-block; margin: 0.5em 1em 0.5em 0; }
img { max-width: 100%; height: auto; }
.seen img { image-rendering: pixelated; }
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


EpisodeTables = Mapping[str, tuple[Mapping[str, np.ndarray], Mapping[str, str]]]
"""Each scene's episode table and the unit of each column, by scene name."""
SeenImages = Mapping[str, Mapping[str, np.ndarray]]
"""What a policy that sees was shown, by scene name, then image name: (frames, worlds, H, W,
3) uint8 each (:attr:`stages.evaluation.rollout.Rollout.seen`)."""


def render_report(report: SimReport, plots: Mapping[str, Figure],
                  gifs: Mapping[str, bytes], title: str, episodes: EpisodeTables | None = None,
                  seen: SeenImages | None = None) -> str:
    """The page for ``report``: :func:`render_page` of its :class:`ReportView`."""
    return render_page(ReportView.from_report(report), plots, gifs, title, episodes, seen)


def render_page(view: ReportView, plots: Mapping[str, Figure], gifs: Mapping[str, bytes],
                title: str, episodes: EpisodeTables | None = None,
                seen: SeenImages | None = None) -> str:
    """The page for ``view``: ``plots`` by section (``success``, ``sweeps``,
    ``sensitivity``), each scene's rollout GIF bytes by scene name, its episode table
    (``episodes``, for the misses) and the camera images its policy was shown (``seen``)."""
    esc = html.escape
    parts = [
        f"<h1>{esc(title)}</h1>",
        f"<p>Verdict: {_verdict(view.passed)}. Policy <code>{esc(view.policy)}</code>"
        f" on suite <code>{esc(view.suite)}</code>.</p>",
        '<h2 id="suite">Suite and simulator</h2>',
        _table(["field", "value"], [
            ["suite", esc(view.suite)],
            ["suite digest", f"<code>{esc(view.suite_digest)}</code>"],
            ["backend", esc(view.backend)], ["backend version", esc(view.backend_version)],
            ["MLflow run", esc(str(view.mlflow_run_id))]]),
        '<h2 id="scenes">Scenes</h2>',
        _table(["scene", "episodes", "success", "95% Wilson CI", "mean return", "gate",
                "failures by mode"], _scene_rows(view)),
        '<h2 id="gates">Gates</h2>',
        _table(["gate", "measured", "threshold", "result", "detail"],
               [[esc(g.name), f"{g.measured:.4g}", f"{g.threshold:.4g}", _verdict(g.passed),
                 esc(g.detail)] for g in view.gates]),
    ]
    if "success" in plots:
        parts.append(_png(plots["success"]))
    parts += _sweep_section(view, plots) + _sim_to_sim_section(view)
    parts += _instruction_section(episodes) + _miss_section(view, episodes)
    parts += _sensitivity_section(view, plots) + _seen_section(seen or {})
    parts.append('<h2 id="rollouts">Rollouts</h2>')
    parts.append("<p>The first episodes of each scene side by side; for a policy that reads "
                 "images, what its cameras showed it at each frame to their right.</p>"
                 if gifs else "<p>No scene was filmed.</p>")
    figures = [f'<figure><img alt="{esc(name)}" src="data:image/gif;base64,'
               f'{base64.b64encode(data).decode()}"><figcaption>{esc(name)}</figcaption></figure>'
               for name, data in gifs.items()]
    parts.append(f'<div class="rollouts">{"".join(figures)}</div>')
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>")


def _scene_rows(view: ReportView) -> list[list[str]]:
    """One row per scene: episodes spent, success, interval, return, gate and failure modes."""
    esc = html.escape
    gate_of = {g.name: g for g in view.gates}
    rows = []
    for s in view.scenes:
        gate = gate_of.get(f"success/{s.scene}")
        spent = str(s.episodes)
        if s.sequential is not None:
            spent += f" of {s.sequential.max_episodes} (sequential {s.sequential.verdict})"
        modes = ", ".join(f"{esc(mode)} {n}" for mode, n in
                          sorted(s.failure_modes.items(), key=lambda m: (-m[1], m[0])))
        rows.append([
            esc(s.scene), spent, f"{s.successes}/{s.episodes} = {s.success_rate:.3f}",
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}]", f"{s.mean_return:.3f}",
            f"{_verdict(gate.passed)} (&ge; {gate.threshold:g})" if gate else "-",
            modes or "-"])
    return rows


def _instruction_section(episodes: EpisodeTables | None) -> list[str]:
    """Each scene's success per instruction its episodes were given, where it gives any."""
    esc = html.escape
    rows = [[esc(scene), esc(str(r["instruction"])), str(r["episodes"]),
             f"{r['successes']}/{r['episodes']} = {r['success_rate']:.3f}",
             f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"]
            for scene, (columns, _) in (episodes or {}).items()
            for r in by_instruction(columns)]
    if not rows:
        return []
    return ['<h2 id="instructions">Instructions</h2>',
            "<p>The instruction each scene's episodes were given (a policy that takes text "
            "is sent it), and the success of each.</p>",
            _table(["scene", "instruction", "episodes", "success", "95% Wilson CI"], rows)]


def _miss_section(view: ReportView, episodes: EpisodeTables | None) -> list[str]:
    """How far each scene's failed episodes ended from success: a table and a histogram."""
    esc = html.escape
    parts = ['<h2 id="misses">Misses: how far the failures ended from success</h2>']
    summaries = [m for s in view.scenes if s.scene in (episodes or {})
                 for m in [miss_summary(s.scene, *(episodes or {})[s.scene])] if m is not None]
    if not summaries:
        parts.append("<p>" + ("No episode failed, or the simulator records no miss." if episodes
                              else "No per-episode records were kept.") + "</p>")
        return parts
    rows = []
    for m in summaries:
        failed = np.concatenate([*m.failed.values(), np.zeros(0)])
        split = m.near_far()
        unit = f" {esc(m.unit)}" if m.unit else ""
        if m.threshold is not None:
            where = f"below {m.threshold:.4g}{unit} (the task's)"
        elif m.boundary is not None:
            where = f"{m.boundary[0]:.4g} .. {m.boundary[1]:.4g}{unit} (from the outcomes)"
        else:
            where = "not placed: " + ("no success" if not len(m.succeeded) else
                                      "the outcomes overlap")
        rows.append([
            esc(m.scene), str(len(failed)),
            f"{np.median(failed):.4g}{unit}" if len(failed) else "-", where,
            f"{split[0]} (&le; {m.limit:.4g}{unit})" if split and m.limit is not None else "-",
            str(split[1]) if split else "-"])
    parts += [
        "<p>Each episode's <code>miss</code> at its end, in the task's own measure (a reach: "
        "the end effector's distance to its target; locomotion: the speed error; a Gymnasium "
        "task: the control steps short of the end). Success lies below the task's threshold "
        "where the simulator states it; elsewhere between the largest miss of a success and "
        "the smallest of a failure that ran to its end. A near miss ended within "
        f"{NEAR:g} times the threshold (or that smallest failure); the rest never came "
        "close.</p>",
        _table(["scene", "failed", "median miss of failures", "success threshold",
                "near misses", "never close"], rows),
        _png(miss_plot(summaries))]
    return parts


def _seen_section(seen: SeenImages) -> list[str]:
    """The camera images a policy that sees was shown: per scene and camera, a sheet of its
    first worlds (rows) over the episode (columns)."""
    esc = html.escape
    shown = {scene: images for scene, images in seen.items() if images}
    if not shown:
        return []
    parts = ['<h2 id="seen">What the policy saw</h2>',
             "<p>The camera images the policy was given, as it was given them: its first "
             "worlds top to bottom, the episode from left to right.</p>", '<div class="seen">']
    for scene, images in shown.items():
        for name, frames in images.items():
            parts.append(f"<figure>{_sheet(frames, f'{scene} {name}')}<figcaption>"
                         f"{esc(scene)}: {esc(name)}, {frames.shape[1]} worlds, "
                         f"{frames.shape[0]} frames</figcaption></figure>")
    parts.append("</div>")
    return parts


def _sheet(frames: np.ndarray, alt: str) -> str:
    """Frames (F, K, H, W, 3) uint8 as one PNG ``<img>``: world k's frames along row k, a
    white line between, small frames enlarged to about 128 px."""
    from PIL import Image

    f, k, h, w, _ = frames.shape
    gap = 2
    sheet = np.full((k * (h + gap) - gap, f * (w + gap) - gap, 3), 255, np.uint8)
    for i in range(f):
        for j in range(k):
            sheet[j * (h + gap):j * (h + gap) + h, i * (w + gap):i * (w + gap) + w] = frames[i, j]
    scale = max(1, round(128 / max(h, 1)))
    buffer = io.BytesIO()
    Image.fromarray(np.repeat(np.repeat(sheet, scale, 0), scale, 1)).save(buffer, format="png")
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _sweep_section(report: ReportView, plots: Mapping[str, Figure]) -> list[str]:
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


def _sim_to_sim_section(report: ReportView) -> list[str]:
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


def _sensitivity_section(report: ReportView, plots: Mapping[str, Figure]) -> list[str]:
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

"""The validation report's figures (success rates per scene, sweep curves, the sensitivity
forest plot) and its rollout frames beside what the policy's cameras showed it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.artifacts.records import GateResult, SceneResult, SimToSim, SweepCurve
from stages.evaluation.video import tile

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def report_plots(scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...],
                 sweeps: tuple[SweepCurve, ...] = (), sim_to_sim: SimToSim | None = None
                 ) -> dict[str, Figure]:
    """The report's plots by name: ``success`` always, ``sweeps`` with sweep curves,
    ``sensitivity`` where a scene ranks factors."""
    plots = {"success": success_plot(scenes, gates, sim_to_sim)}
    if sweeps:
        plots["sweeps"] = sweep_plot(sweeps)
    if any(s.factors for s in scenes):
        plots["sensitivity"] = sensitivity_plot(scenes)
    return plots


def success_plot(scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...],
                 sim_to_sim: SimToSim | None = None) -> Figure:
    """Bar chart of success rate per scene with 95% intervals and the gate thresholds; with a
    sim-to-sim check, the second backend's bar beside each (hatched where they disagree)."""
    from matplotlib.figure import Figure

    from stages.evaluation.report_page import PAGE_WIDTH_IN

    fig = Figure(figsize=(min(max(1.6 * len(scenes) + 2, 5.2), PAGE_WIDTH_IN), 3.8), dpi=100)
    ax = fig.add_subplot()
    x = np.arange(len(scenes))
    width = 0.8 if sim_to_sim is None else 0.4

    def bars(results: tuple[SceneResult, ...], at: np.ndarray, **style: Any) -> None:
        rates = np.array([s.success_rate for s in results])
        err = np.clip([[s.success_rate - s.ci_low for s in results],
                       [s.ci_high - s.success_rate for s in results]], 0.0, None)
        ax.bar(at, rates, width, yerr=err, capsize=6, alpha=0.8, **style)

    colors = ["tab:green" if g.passed else "tab:red" for g in gates[:len(scenes)]]
    first = x if sim_to_sim is None else x - width / 2
    bars(scenes, first, color=colors, label=scenes[0].backend if sim_to_sim else None)
    if sim_to_sim is not None:
        hatch = ["" if a.agrees else "//" for a in sim_to_sim.agreement]
        bars(sim_to_sim.scenes, x + width / 2, color="tab:blue", hatch=hatch,
             label=f"{sim_to_sim.backend} (hatched: disagrees)")
        ax.legend(loc="lower left", fontsize="small")
    for i, g in enumerate(gates[:len(scenes)]):
        ax.hlines(g.threshold, i - 0.4, i + 0.4, colors="k", linestyles="dashed")
    ax.set_xticks(x, [s.scene for s in scenes], rotation=15)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_title("validation per scene (dashed: gate on lower bound)")
    fig.tight_layout()
    return fig


def sweep_plot(curves: tuple[SweepCurve, ...]) -> Figure:
    """Success rate over each swept scene's grid with 95% Wilson intervals: against the first
    swept field, one line per combination of the others."""
    from stages.evaluation.report_page import panel_grid

    fig, axes = panel_grid(len(curves), 4.4, 3.6)
    for ax, curve in zip(axes, curves, strict=True):
        first, rest = curve.fields[0], curve.fields[1:]
        lines: dict[tuple[float, ...], list[SceneResult]] = {}
        for r in curve.points:
            point = r.sweep or {}
            lines.setdefault(tuple(point[f] for f in rest), []).append(r)
        for key, results in lines.items():
            x = np.array([(r.sweep or {})[first] for r in results])
            y = np.array([r.success_rate for r in results])
            err = np.clip([[r.success_rate - r.ci_low for r in results],
                           [r.ci_high - r.success_rate for r in results]], 0.0, None)
            label = ", ".join(f"{f}={v:g}" for f, v in zip(rest, key, strict=True)) or None
            ax.errorbar(x, y, yerr=err, marker="o", capsize=4, label=label)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel(first)
        ax.set_ylabel("success rate (95% Wilson CI)")
        ax.set_title(f"{curve.scene}: sweep of {', '.join(curve.fields)}", fontsize="medium")
        if rest:
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def sensitivity_plot(scenes: tuple[SceneResult, ...]) -> Figure:
    """Per scene, each factor's effect on the log-odds of failure with its 95% interval,
    ranked (a forest plot); factors whose interval excludes zero in red. At most three scenes
    a row, so the figure fits a page 1,400 px wide."""
    from stages.evaluation.report_page import panel_grid

    shown = [s for s in scenes if s.factors]
    rows = max(len(s.factors) for s in shown)
    fig, axes = panel_grid(len(shown), 4.4, 0.35 * rows + 1.6, 0.2)
    for ax, s in zip(axes, shown, strict=True):
        y = np.arange(len(s.factors))[::-1]
        effect = np.array([f.effect for f in s.factors])
        err = np.array([[f.effect - f.ci_low for f in s.factors],
                        [f.ci_high - f.effect for f in s.factors]])
        colors = ["tab:red" if f.ci_low > 0 or f.ci_high < 0 else "tab:gray" for f in s.factors]
        for i, color in enumerate(colors):
            ax.errorbar(effect[i], y[i], xerr=err[:, i:i + 1], fmt="o", color=color, capsize=3)
        ax.axvline(0.0, color="k", linewidth=0.8)
        ax.set_yticks(y, [f.name for f in s.factors], fontsize="small")
        ax.set_title(f"{s.scene}: {s.episodes - s.successes}/{s.episodes} failed",
                     fontsize="medium")
        ax.set_xlabel("log-odds of failure per SD (95% interval)")
    fig.tight_layout()
    return fig


def beside_seen(frames: list[np.ndarray], seen: Mapping[str, np.ndarray] | None
                ) -> list[np.ndarray]:
    """The rollout's frames, each with what the policy's cameras showed it at that step to its
    right (the same worlds side by side, one camera under the other, scaled by a whole
    factor to fit the frame's height); the frames alone when it was shown none. A frame after the
    policy's last call shows its last images.

    Shapes: ``frames`` (H, K * W, 3) uint8 each; ``seen`` (F, K, h, w, 3) uint8 by name.
    """
    if not seen or not frames:
        return frames
    height = frames[0].shape[0]
    out = []
    for i, frame in enumerate(frames):
        strips = [tile(images[min(i, len(images) - 1)]) for images in seen.values()]
        wide = max(strip.shape[1] for strip in strips)
        column = np.concatenate([np.pad(strip, ((0, 0), (0, wide - strip.shape[1]), (0, 0)))
                                 for strip in strips], axis=0)
        shrink = -(-column.shape[0] // height)
        column = column[::shrink, ::shrink]
        scale = max(1, height // column.shape[0])
        big = np.repeat(np.repeat(column, scale, 0), scale, 1)
        pad = np.zeros((height - big.shape[0], big.shape[1], 3), np.uint8)
        out.append(np.concatenate([frame, np.concatenate([big, pad], axis=0)], axis=1))
    return out

"""``flows compare``: promotion's champion test between two policies on one suite, from the
command line (each policy named as flows/policy_cli.py says).

``flows compare A B`` runs
both policies on the same episodes and applies promotion's champion test (Newcombe per scene,
Holm over scenes) with A as the champion: exit 0 when B is not worse, 1 when it is.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from flows.policy_cli import (
    POLICY_HELP,
    common_flags,
    evaluate_policies,
    latency_line,
    stdout_for,
    within,
)

if TYPE_CHECKING:
    from stages.evaluation.compare import SuiteComparison


def comparison_table(a: str, b: str, comparison: SuiteComparison,
                     instructions: Mapping[str, object] | None = None) -> Table:
    """Champion ``a`` against challenger ``b``, one row per scene (per task of a multi-task
    suite), with each scene's ``instructions`` where the suite gives any."""
    instructions = instructions or {}
    table = Table(title=f"{b} against {a} (margin {comparison.margin:g}, alpha "
                        f"{comparison.alpha:g}; {comparison.method})")
    columns = ("scene", *(("instruction",) if instructions else ()), "A", "B", "difference",
               "95% CI", "p (Holm)", "verdict")
    for column in columns:
        table.add_column(column)
    for s in comparison.scenes:
        told = instructions.get(s.scene)
        said = () if not instructions else (
            "" if told is None else told if isinstance(told, str)
            else " | ".join(map(str, told)) if isinstance(told, list) else str(told),)
        table.add_row(s.scene, *said, f"{s.champion_successes}/{s.champion_episodes}",
                      f"{s.challenger_successes}/{s.challenger_episodes}",
                      f"{s.difference:+.3f}",
                      f"[{s.difference_ci_low:+.3f}, {s.difference_ci_high:+.3f}]",
                      f"{s.p_adjusted:.3g}", "WORSE" if s.regressed else "ok")
    return table


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    """Compare policy B with policy A on one suite; exit 0 when B is not worse, else 1."""
    from stages.evaluation.compare import compare_scenes

    with stdout_for(args):
        a, b = evaluate_policies([args.a, args.b], args, quiet=args.json)
    comparison = compare_scenes(a.scenes, b.scenes, margin=args.margin, alpha=args.alpha)
    instructions = {s.scene.name: s.scene.config.instruction for s in a.suite.scenes
                    if s.scene.config.instruction is not None}
    if args.json:
        print(json.dumps({"a": {"policy": a.policy, "digest": a.digest},
                          "b": {"policy": b.policy, "digest": b.digest},
                          "suite": a.suite.config.name, "suite_digest": a.suite.digest,
                          "worse": comparison.regressed,
                          "comparison": comparison.model_dump(mode="json"),
                          **({"instructions": instructions} if instructions else {})}))
    else:
        console.print(comparison_table(a.policy, b.policy, comparison, instructions))
        for ev in (a, b):
            if ev.latency_ms:
                console.print(f"{ev.policy}: {latency_line(ev.latency_ms)}", soft_wrap=True,
                              highlight=False, markup=False)
        verdict = ("B is WORSE: " + "; ".join(comparison.reasons) if comparison.regressed
                   else "B is not worse than A on any scene")
        console.print(verdict, soft_wrap=True, highlight=False, markup=False)
    return 1 if comparison.regressed else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows compare``."""
    cmp = sub.add_parser("compare", help="promotion's champion test between two policies on "
                         "one suite (exit 0: B is not worse than A; 1: it is)")
    cmp.add_argument("a", help=f"the reference (champion): {POLICY_HELP}")
    cmp.add_argument("b", help="the challenger, named the same ways")
    common_flags(cmp)
    cmp.add_argument("--margin", type=within(0.0, 1.0, "[0, 1)"), default=0.05,
                     help="tolerated drop in success rate (default 0.05)")
    cmp.add_argument("--alpha", type=within(0.0, 0.5, "(0, 0.5)"), default=0.05,
                     help="family-wise false-alarm rate (default 0.05)")
    cmp.set_defaults(func=cmd_compare)

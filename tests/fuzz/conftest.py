"""The fuzz suites' tally, and examples that stay the same from run to run.

The tally counts how many inputs each suite tried and how each ended; the counts are printed
in pytest's terminal summary, with or without ``-s``.

The suites run derandomized; with the label fix below the same command on the same code tries
the same inputs on every run. (Hypothesis also mixes in literals from the project modules
loaded so far, so running a different selection of tests may try other inputs.) Hypothesis
keeps its cache in the system's temporary folder, not in the working tree.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.internal.conjecture import utils as hypothesis_labels
from hypothesis.strategies._internal import strategies as hypothesis_sampling


def _stable_label(obj: object) -> int:
    """Hypothesis' label of a sampled value or a strategy function, from its repr (memory
    addresses left out) instead of its ``hash()``, which Python salts per process for strings:
    without this, the examples tried after the first hundred or so differ from run to run
    despite ``derandomize``."""
    return hypothesis_labels.calc_label_from_name(re.sub(r" at 0x[0-9a-f]+", "", repr(obj)))


hypothesis_labels.calc_label_from_hash = _stable_label
hypothesis_sampling.calc_label_from_hash = _stable_label
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "physai-hypothesis")

TALLY: Counter[tuple[str, str]] = Counter()
"""(suite, outcome) -> inputs tried, for the whole session."""


class Tally:
    """Counts the inputs a fuzz suite tried, by outcome (``accepted``, ``rejected``, ...)."""

    def record(self, suite: str, outcome: str) -> None:
        """Count one input of ``suite`` that ended in ``outcome``."""
        TALLY[suite, outcome] += 1


@pytest.fixture(scope="session")
def tally() -> Tally:
    """The session's fuzz tally."""
    return Tally()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many inputs each fuzz suite tried."""
    if not TALLY:
        return
    suites: dict[str, dict[str, int]] = {}
    for (suite, outcome), count in sorted(TALLY.items()):
        suites.setdefault(suite, {})[outcome] = count
    terminalreporter.section("fuzz inputs tried")
    for suite, outcomes in suites.items():
        detail = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())
        terminalreporter.write_line(f"{suite}: {sum(outcomes.values())} ({detail})")
    terminalreporter.write_line(f"total: {sum(TALLY.values())}")

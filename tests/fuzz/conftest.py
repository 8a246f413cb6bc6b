"""The fuzz suites' tally: how many inputs each suite tried, loaded and rejected.

The counts are printed in pytest's terminal summary, with or without ``-s``.
"""

from __future__ import annotations

from collections import Counter

import pytest

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

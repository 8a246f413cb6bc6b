"""The crash harness of tests/e2e/test_crash.py on the second half of the crash points, in a
file of its own so that a second test worker runs it beside the first half."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.test_crash import (
    Harness,
    crash_harness,
    prefect_api,
    test_every_kill_is_survived,
    test_one_champion_and_no_duplicate_version_after_the_crashes,
    test_the_finished_run_has_the_uninterrupted_digests,
)

pytestmark = pytest.mark.e2e

__all__ = ["prefect_api", "test_every_kill_is_survived",
           "test_one_champion_and_no_duplicate_version_after_the_crashes",
           "test_the_finished_run_has_the_uninterrupted_digests"]


@pytest.fixture(scope="module")
def harness(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    yield from crash_harness(prefect_api, tmp_path_factory, part=1)

"""Per-episode records of a validation rollout: the conditions drawn for each episode and how
it ended.

An environment that can say what it drew implements :class:`RecordsEpisodes`: every randomized
factor of the episode by name and unit (per world, one number each), and each world's failure
mode and miss. :func:`episode_table` turns that, with the rollout's outcomes and returns, into
one column per field, which the validate stage stores as a Parquet file beside its report and
which :mod:`stages.evaluation.sensitivity` reads to rank the factors by their association with
failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, cast, runtime_checkable

import numpy as np

from stages.sim.env.capabilities import ExplainsFailures, capabilities_of

FELL = "fell"
"""Failure mode of an episode whose robot fell (or whose environment terminated early)."""
MISSED = "missed"
"""Failure mode of an episode that ran to its end without meeting the success predicate."""
INSTRUCTION = "instruction"
"""Column of the instruction each episode was given, where its scene names one (text: a
categorical factor, :mod:`stages.evaluation.sensitivity`)."""


@runtime_checkable
class RecordsEpisodes(Protocol):
    """A batched environment that records each episode's conditions and failure mode."""

    def episode_conditions(self) -> dict[str, np.ndarray]:
        """Every randomized factor of the current episode: name -> one value per world.

        Returns:
            Name -> shape (num_worlds,), float64; units in :meth:`condition_units`.
        """
        ...

    def condition_units(self) -> dict[str, str]:
        """The unit of every factor of :meth:`episode_conditions` (``""``: a plain number)."""
        ...

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """How far each world is from success at the episode's end, and its unit (for example
        the end effector's distance to its target in m). Shape: (num_worlds,), float64."""
        ...


def episode_table(env: object, success: np.ndarray, returns: np.ndarray,
                  fallen: np.ndarray | None, reasons: dict[int, str] | None = None,
                  instructions: Sequence[str] | None = None,
                  ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The columns of one scene's episodes: ``episode``, ``success``, ``return``, ``failure``
    (``""``, ``fell``, ``missed``, the task's own mode where its environment explains its
    failures (``missed_grasp``, ``dropped``, ...), or the reason the policy gave, ``reasons``:
    world -> why, e.g. a remote policy's bad answer), ``miss``, every condition of a
    :class:`RecordsEpisodes` environment and, where the scene gives them, each episode's
    :data:`INSTRUCTION` (``instructions``, one a world); and the unit of every column."""
    n = len(success)
    failure = np.where(success, "", MISSED).astype(object)
    if capabilities_of(env).failure_modes:
        said = np.asarray(cast(ExplainsFailures, env).episode_failures(), dtype=object)
        failure = np.where(success, "", np.where(said == "", MISSED, said)).astype(object)
    if fallen is not None:
        failure[~success & fallen] = FELL
    for world, why in (reasons or {}).items():
        failure[world] = why
    columns: dict[str, np.ndarray] = {
        "episode": np.arange(n, dtype=np.int64),
        "success": np.asarray(success, bool),
        "return": np.asarray(returns, np.float64),
        "failure": failure.astype(str),
    }
    units = {"episode": "", "success": "", "return": "", "failure": ""}
    if isinstance(env, RecordsEpisodes):
        miss, unit = env.episode_miss()
        columns["miss"] = np.asarray(miss, np.float64)
        units["miss"] = unit
        cond_units = env.condition_units()
        for name, values in env.episode_conditions().items():
            columns[name] = np.asarray(values, np.float64).reshape(n)
            units[name] = cond_units.get(name, "")
    if instructions is not None:
        columns[INSTRUCTION] = np.asarray(instructions, dtype=str)
        units[INSTRUCTION] = ""
    return columns, units


def by_instruction(columns: Mapping[str, np.ndarray]) -> list[dict[str, object]]:
    """Each instruction of an episode table (its :data:`INSTRUCTION` column) with its
    ``episodes``, ``successes``, ``success_rate`` and 95% Wilson ``ci_low`` and ``ci_high``,
    in order of first appearance; empty for a table without instructions."""
    from stages.evaluation.stats import wilson_interval

    if INSTRUCTION not in columns:
        return []
    text = np.asarray(columns[INSTRUCTION]).astype(str)
    success = np.asarray(columns["success"], bool)
    rows: list[dict[str, object]] = []
    for level in dict.fromkeys(text.tolist()):
        given = text == level
        n, k = int(given.sum()), int(success[given].sum())
        low, high = wilson_interval(k, n)
        rows.append({"instruction": level, "episodes": n, "successes": k,
                     "success_rate": k / n, "ci_low": low, "ci_high": high})
    return rows


def write_parquet(path: object, columns: dict[str, np.ndarray], units: dict[str, str]) -> None:
    """Write ``columns`` as a Parquet file, each column's unit in its field metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = [pa.field(name, pa.array(values).type, metadata={"unit": units.get(name, "")})
              for name, values in columns.items()]
    table = pa.table({name: pa.array(values) for name, values in columns.items()},
                     schema=pa.schema(fields))
    pq.write_table(table, str(path))


def read_parquet(path: object) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The columns and units :func:`write_parquet` wrote."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(path))
    units = {f.name: (f.metadata or {}).get(b"unit", b"").decode() for f in table.schema}
    return {name: table.column(name).to_numpy() for name in table.column_names}, units

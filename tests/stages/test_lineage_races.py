"""Writes two runs make to MLflow at the same moment, against a real SQLite tracking store.

The race is made deterministic: just before MLflow flushes its new dataset row, a second
connection commits the same dataset, as a concurrent pipeline whose check ran at the same time
would. MLflow then fails its unique key, exactly as seen with two pipelines on one config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stages.artifacts.records import Dataset
from stages.tracking.lineage import LineageRecorder


@pytest.fixture
def lost_race(tmp_path: Path) -> Iterator[list[str]]:
    """Make the next dataset insert lose to an identical one committed by another connection;
    yields the list of dataset names that were written behind MLflow's back."""
    import sqlalchemy
    from mlflow.store.tracking.dbmodels.models import SqlDataset
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    planted: list[str] = []

    def plant(session: Session, _context: Any, _instances: Any) -> None:
        for obj in session.new:
            if isinstance(obj, SqlDataset) and not planted:
                other = sqlalchemy.create_engine(str(session.get_bind().url))
                with other.begin() as conn:
                    conn.execute(SqlDataset.__table__.insert().values(
                        dataset_uuid="0" * 32, experiment_id=obj.experiment_id, name=obj.name,
                        digest=obj.digest, dataset_source_type=obj.dataset_source_type,
                        dataset_source=obj.dataset_source))
                other.dispose()
                planted.append(obj.name)

    event.listen(Session, "before_flush", plant)
    try:
        yield planted
    finally:
        event.remove(Session, "before_flush", plant)


def _dataset() -> Dataset:
    return Dataset.model_construct(task="reach-v0", digest="ab" * 32,
                                   uri="store://ab", episodes=3, transitions=30)


def test_dataset_input_logged_while_another_run_registers_it(
    tmp_path: Path, lost_race: list[str]
) -> None:
    lineage = LineageRecorder(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = lineage.start_run("races", "train")
    run.log_dataset(_dataset(), context="training")
    assert lost_race == ["reach-v0-demos"]  # the race was really run
    inputs = lineage.client.get_run(run.run_id).inputs.dataset_inputs
    assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [
        ("reach-v0-demos", ("ab" * 32)[:36])]


def test_conflicts_are_told_from_other_errors() -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS

    from stages.tracking.lineage import is_conflict

    assert is_conflict(MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: "
                                       "datasets.experiment_id, datasets.name, datasets.digest"))
    assert is_conflict(MlflowException("x", error_code=RESOURCE_ALREADY_EXISTS))
    assert not is_conflict(MlflowException("Run 'abc' not found"))
    assert not is_conflict(MlflowException("UNIQUE", error_code=INVALID_PARAMETER_VALUE))

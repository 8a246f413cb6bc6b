"""A new SQLite tracking database starts as a copy of MLflow's own empty one: the same schema
version, a usable registry, the default experiment where MLflow would put it, and never over a
database that exists."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from stages.lineage import SCHEMA_CACHE_ENV, LineageRecorder, seed_sqlite_database


def _tables(db: Path) -> tuple[set[str], str]:
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        (head,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    conn.close()
    return tables, head


def test_seeded_database_is_the_one_mlflow_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv(SCHEMA_CACHE_ENV, str(tmp_path / "cache"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the cached database is built from another folder
    assert seed_sqlite_database(f"sqlite:///{elsewhere / 'first.db'}")
    monkeypatch.chdir(tmp_path)
    built = tmp_path / "built.db"
    MlflowClient(f"sqlite:///{built}").search_experiments()
    seeded = tmp_path / "home" / "mlflow.db"
    seeded.parent.mkdir()

    assert seed_sqlite_database(f"sqlite:///{seeded}")
    assert _tables(seeded) == _tables(built)
    assert list(seeded.parent.iterdir()) == [seeded]  # no temporary file left
    uri = f"sqlite:///{seeded}"
    client = MlflowClient(uri, registry_uri=uri)
    assert client.get_experiment("0").artifact_location == str(tmp_path / "mlruns" / "0")
    recorder = LineageRecorder(uri, tmp_path / "artifacts")
    run = client.create_run(recorder.experiment_id("reach"))
    client.log_metric(run.info.run_id, "loss", 0.5)
    client.create_registered_model("reach")
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}


def test_an_existing_database_and_other_uris_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCHEMA_CACHE_ENV, str(tmp_path / "cache"))
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"someone's database")
    assert not seed_sqlite_database(f"sqlite:///{db}")
    assert db.read_bytes() == b"someone's database"
    assert not seed_sqlite_database("http://127.0.0.1:5000")
    assert not seed_sqlite_database(f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}")
    assert not (tmp_path / "missing").exists()
    monkeypatch.setenv(SCHEMA_CACHE_ENV, "")
    assert not seed_sqlite_database(f"sqlite:///{tmp_path / 'other.db'}")
    assert not (tmp_path / "other.db").exists()

"""The lineage recorder starts a new SQLite tracking database as a copy of MLflow's own empty
one, from the same cached file the servers' databases are copied from: the same schema, a
usable registry, and the default experiment where MLflow would put it in the folder that opens
the database, whichever process built the cache and wherever it ran."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from stages.tracking.lineage import LineageRecorder
from stages.tracking.schema_cache import MLFLOW_SCHEMA_CACHE_ENV, seed_mlflow_database


def _tables(db: Path) -> tuple[set[str], str]:
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        (head,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    conn.close()
    return tables, head


def _experiments(db: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
    conn.close()
    return [(int(i), str(location)) for i, location in rows]


def test_recorder_seeds_the_database_mlflow_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    cache = tmp_path / "cache"
    monkeypatch.setenv(MLFLOW_SCHEMA_CACHE_ENV, str(cache))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the cached database is built from another folder
    first = elsewhere / "first.db"
    LineageRecorder(f"sqlite:///{first}").experiment_id("built-here")
    (cached,) = cache.glob("mlflow-*.db")
    assert _experiments(cached) == []  # the default experiment would name this folder
    monkeypatch.chdir(tmp_path)
    built = tmp_path / "built.db"
    MlflowClient(f"sqlite:///{built}").search_experiments()
    seeded = tmp_path / "home" / "mlflow.db"
    seeded.parent.mkdir()

    uri = f"sqlite:///{seeded}"
    recorder = LineageRecorder(uri, tmp_path / "artifacts")
    client = recorder.client
    assert seeded.is_file() and list(seeded.parent.iterdir()) == [seeded]  # no temporary left
    assert _tables(seeded) == _tables(built)
    assert client.get_experiment("0").artifact_location == str(tmp_path / "mlruns" / "0")
    run = client.create_run(recorder.experiment_id("reach"))
    client.log_metric(run.info.run_id, "loss", 0.5)
    client.create_registered_model("reach")
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}


def test_a_server_database_seeded_after_a_run_names_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``flows run`` in one folder builds the cache; ``flows server up`` in another then
    seeds its database from it: the server's default experiment must not name the run's
    folder."""
    monkeypatch.setenv(MLFLOW_SCHEMA_CACHE_ENV, str(tmp_path / "cache"))
    run_folder, server_folder = tmp_path / "run", tmp_path / "server"
    run_folder.mkdir()
    server_folder.mkdir()
    monkeypatch.chdir(run_folder)
    LineageRecorder(f"sqlite:///{run_folder / 'mlflow.db'}").experiment_id("reach")
    assert _experiments(run_folder / "mlflow.db")[0] == (0, str(run_folder / "mlruns" / "0"))

    monkeypatch.chdir(server_folder)
    assert seed_mlflow_database(f"sqlite:///{server_folder / 'mlflow.db'}")
    assert _experiments(server_folder / "mlflow.db") == []

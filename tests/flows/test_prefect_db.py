"""A new state folder's Prefect and MLflow databases start as copies of ones the libraries
migrated: at the head of their own SQLite migrations, served by a real Prefect server and used
by MLflow's own client, with the schema MLflow gives a database it creates itself, and never
over a database that exists or instead of one the environment names."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

from flows.prefect_db import (
    DATABASE_URL_VARS,
    SCHEMA_CACHE_ENV,
    seed_prefect_database,
)
from stages.tracking.schema_cache import MLFLOW_SCHEMA_CACHE_ENV, seed_mlflow_database


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A schema cache of this module's own, its database built once by Prefect."""
    folder = tmp_path_factory.mktemp("prefect-schema")
    first = tmp_path_factory.mktemp("first")
    assert seed_prefect_database(first, {**os.environ, SCHEMA_CACHE_ENV: str(folder)})
    return folder


def _migration_head() -> str:
    """The head of Prefect's SQLite migrations, read from its migration scripts."""
    import prefect.server.database
    from alembic.script import ScriptDirectory

    scripts = Path(prefect.server.database.__file__).parent / "_migrations"
    (head,) = ScriptDirectory(str(scripts), version_locations=[
        str(scripts / "versions" / "sqlite")]).get_heads()
    return str(head)


def test_seeded_database_is_at_prefects_head_and_serves(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import PrefectServer, run_captured

    home = tmp_path / "prefect"
    home.mkdir()
    monkeypatch.setenv(SCHEMA_CACHE_ENV, str(cache))
    assert seed_prefect_database(home)
    assert sorted(p.name for p in home.iterdir()) == ["prefect.db"]  # no temporary file left
    with sqlite3.connect(home / "prefect.db") as conn:
        (head,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert head == _migration_head()
    assert {"flow", "flow_run", "task_run", "deployment", "work_pool"} <= tables

    server = PrefectServer(home)  # seeds nothing more: the database exists
    server.start()
    try:
        env = {**os.environ, "PREFECT_API_URL": server.api, "PREFECT_HOME": str(tmp_path)}
        made = run_captured([sys.executable, "-c", (
            "from prefect import flow\n"
            "@flow(name='seeded')\n"
            "def f():\n    return 41 + 1\n"
            "print(f())\n")], env=env, cwd=tmp_path)
    finally:
        server.stop()
    assert made.returncode == 0, made.stderr[-3000:]
    assert made.stdout.strip().splitlines()[-1] == "42"
    with sqlite3.connect(home / "prefect.db") as conn:
        (name,) = conn.execute("SELECT name FROM flow").fetchone()
    conn.close()
    assert name == "seeded"


def test_an_existing_database_and_another_named_one_are_left_alone(
    cache: Path, tmp_path: Path
) -> None:
    env = {**os.environ, SCHEMA_CACHE_ENV: str(cache)}
    db = tmp_path / "prefect.db"
    db.write_bytes(b"someone's database")
    assert not seed_prefect_database(tmp_path, env)
    assert db.read_bytes() == b"someone's database"
    other = tmp_path / "other"
    other.mkdir()
    for name in DATABASE_URL_VARS:
        assert not seed_prefect_database(other, {**env, name: "postgresql+asyncpg://db/prefect"})
    assert not seed_prefect_database(tmp_path / "missing", env)
    assert not (tmp_path / "missing").exists()
    assert not seed_prefect_database(other, {**env, SCHEMA_CACHE_ENV: ""})
    assert list(other.iterdir()) == []


@pytest.fixture(scope="module")
def mlflow_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow schema cache of this module's own, its database built once by MLflow."""
    folder = tmp_path_factory.mktemp("mlflow-schema")
    first = tmp_path_factory.mktemp("first") / "mlflow.db"
    assert seed_mlflow_database(f"sqlite:///{first}",
                                {**os.environ, MLFLOW_SCHEMA_CACHE_ENV: str(folder)})
    return folder


def _schema(db: Path) -> list[tuple[str, list[str]]]:
    """Each table's and index's definition, its lines sorted: alembic's batch migrations
    rebuild a table with its constraints in an order that varies from process to process
    (Python's string hashing), which SQLite keeps in the text."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL "
                            "ORDER BY name").fetchall()
    conn.close()
    return [(str(name), sorted(line.strip().rstrip(",") for line in str(sql).splitlines()))
            for name, sql in rows]


USE_MLFLOW = """
import sys
from mlflow import MlflowClient
client = MlflowClient(sys.argv[1], registry_uri=sys.argv[1])
default = client.get_experiment("0")
experiment = client.create_experiment("seeded")
run = client.create_run(experiment)
client.log_metric(run.info.run_id, "success_rate", 0.75)
client.create_registered_model("seeded-model")
version = client.create_model_version("seeded-model", "file:///tmp/x", run.info.run_id)
client.set_registered_model_alias("seeded-model", "champion", version.version)
print(default.artifact_location, experiment, version.version)
"""


def test_seeded_mlflow_database_is_at_mlflows_head_and_records(
    mlflow_cache: Path, tmp_path: Path
) -> None:
    from mlflow.store.db.utils import _get_latest_schema_revision

    from tests.support import run_captured

    env = {**os.environ, MLFLOW_SCHEMA_CACHE_ENV: str(mlflow_cache)}
    seeded = tmp_path / "seeded" / "mlflow.db"
    seeded.parent.mkdir()
    assert seed_mlflow_database(f"sqlite:///{seeded}", env)
    assert sorted(p.name for p in seeded.parent.iterdir()) == ["mlflow.db"]
    with sqlite3.connect(seeded) as conn:
        (head,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        (experiments,) = conn.execute("SELECT count(*) FROM experiments").fetchone()
    conn.close()
    assert head == _get_latest_schema_revision()
    assert experiments == 0  # the default experiment would name the building folder

    # MLflow's client records on it as on a database it creates itself, whose schema it has.
    fresh = tmp_path / "fresh" / "mlflow.db"
    fresh.parent.mkdir()
    outputs = []
    for db in (seeded, fresh):
        made = run_captured([sys.executable, "-c", USE_MLFLOW, f"sqlite:///{db}"],
                            cwd=db.parent, env=env)
        assert made.returncode == 0, made.stderr[-3000:]
        outputs.append(made.stdout.split())
    (seeded_root, *seeded_ids), (fresh_root, *fresh_ids) = outputs
    assert seeded_ids == fresh_ids == ["1", "1"]
    # The default experiment is MLflow's, made in the folder of the process that opened it.
    assert Path(seeded_root).parent == seeded.parent / "mlruns"
    assert Path(fresh_root).parent == fresh.parent / "mlruns"
    assert _schema(seeded) == _schema(fresh)


def test_mlflow_databases_not_ours_to_start_are_left_alone(
    mlflow_cache: Path, tmp_path: Path
) -> None:
    env = {**os.environ, MLFLOW_SCHEMA_CACHE_ENV: str(mlflow_cache)}
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"someone's database")
    assert not seed_mlflow_database(f"sqlite:///{db}", env)
    assert db.read_bytes() == b"someone's database"
    other = tmp_path / "other"
    other.mkdir()
    for uri in ("http://127.0.0.1:5000", "postgresql://db/mlflow",
                f"sqlite:///{other / 'x.db'}?timeout=20", f"sqlite:///{tmp_path / 'no' / 'x.db'}"):
        assert not seed_mlflow_database(uri, env), uri
    assert not seed_mlflow_database(f"sqlite:///{other / 'x.db'}",
                                    {**env, MLFLOW_SCHEMA_CACHE_ENV: ""})
    assert list(other.iterdir()) == []
    assert not (tmp_path / "no").exists()

"""A new state folder's Prefect database starts as a copy of one Prefect migrated: at the head of
Prefect's own SQLite migrations, served by a real Prefect server, and never over a database that
exists or instead of one the environment names."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

from flows.prefect_db import DATABASE_URL_VARS, SCHEMA_CACHE_ENV, seed_prefect_database


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

"""New SQLite databases start as copies of migrated empty ones, built once per library version.

A library that keeps its state in SQLite (MLflow's tracking store here, Prefect's server in
flows/prefect_db.py) builds a new database by running each of its schema migrations: about 1 s
of CPU for MLflow, 10 s for Prefect, for every new state folder. A migrated empty database
holds nothing of its folder, so it is built once per library version, by the library's own
code, into a schema cache folder, and copied from there in milliseconds. Neither library offers
a way to start from a built schema, so the copy is done here.

MLflow's default experiment names an artifact folder of the process that created it, so the
cached database holds none: MLflow creates it on first opening the copy, in that process's
folder, as it does in a database it migrates itself. Every MLflow database of the project,
the stages' (:class:`stages.tracking.lineage.LineageRecorder`) and the servers', is seeded here,
from one cached file per MLflow version.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["BUILD_TIMEOUT_S", "MLFLOW_SCHEMA_CACHE_ENV", "seed_copy", "seed_mlflow_database"]

MLFLOW_SCHEMA_CACHE_ENV = "PHYSAI_MLFLOW_SCHEMA_CACHE"
"""Folder of the migrated empty MLflow databases, one per MLflow version (default
``$XDG_CACHE_HOME/physai-flows/mlflow-schema``, else ``~/.cache/physai-flows/mlflow-schema``);
empty: every new database is migrated by MLflow."""

BUILD_TIMEOUT_S = 600
"""Longest a library may take to migrate the empty database it builds."""

Builder = Callable[[Path, Mapping[str, str]], None]
"""Builds the migrated empty database at the given path, with the given environment."""


def seed_mlflow_database(tracking_uri: str, env: Mapping[str, str] | None = None) -> bool:
    """Start the SQLite database ``tracking_uri`` names (``sqlite:////abs/path.db``) as a copy
    of the migrated empty one of this MLflow version; MLflow adds its default experiment on
    first opening it.

    Does nothing (returns False) for another kind of store, an existing database, a missing
    folder, or when the cache cannot be used (``env``, default the process environment, sets
    it to empty): MLflow then migrates a new database itself."""
    env = os.environ if env is None else env
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix) or "?" in tracking_uri:
        return False
    return seed_copy(Path(tracking_uri[len(prefix):]), env, MLFLOW_SCHEMA_CACHE_ENV, "mlflow",
                     _build_mlflow)


def seed_copy(dest: Path, env: Mapping[str, str], cache_env: str, package: str,
              build: Builder) -> bool:
    """Copy the cached empty database of ``package``'s version to ``dest`` (building it with
    ``build`` first if missing) unless ``dest`` exists or its folder does not; True when
    copied. Never writes over a database that exists: the copy is a hard link of a finished
    temporary file."""
    if dest.exists() or not dest.parent.is_dir():
        return False
    try:
        empty = _empty_database(env, cache_env, package, build)
        if empty is None:
            return False
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            tmp.write_bytes(empty.read_bytes())
            os.link(tmp, dest)  # never over a database another process created meanwhile
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, sqlite3.Error, subprocess.SubprocessError) as exc:
        log.debug("%s database %s not seeded: %s", package, dest, exc)
        return False
    return True


def _cache_folder(env: Mapping[str, str], cache_env: str, package: str) -> Path | None:
    folder = env.get(cache_env)
    if folder is None:
        base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = str(Path(base) / "physai-flows" / f"{package}-schema")
    return Path(folder) if folder else None


def _empty_database(env: Mapping[str, str], cache_env: str, package: str,
                    build: Builder) -> Path | None:
    """The cached migrated empty database of this version of ``package``, built on first use
    (one builder at a time: the others wait for it); None without a cache folder."""
    folder = _cache_folder(env, cache_env, package)
    if folder is None:
        return None
    path = folder / f"{package}-{version(package)}.db"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            build(path, env)
    return path


def _build_mlflow(path: Path, env: Mapping[str, str]) -> None:
    """Migrate a new database with MLflow's own store, in a subprocess (it sets up logging and
    reads MLflow's variables), remove the default experiment it adds (it names the building
    folder), fold the journal into the one file, and move it to ``path``."""
    with tempfile.TemporaryDirectory(prefix=".building.", dir=path.parent) as folder:
        built = Path(folder) / "mlflow.db"
        code = ("import sys\n"
                "from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore\n"
                "SqlAlchemyStore('sqlite:///' + sys.argv[1], sys.argv[2]).engine.dispose()\n")
        clean = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}
        subprocess.run([sys.executable, "-c", code, str(built), str(Path(folder) / "artifacts")],
                       env=clean, check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)
        with contextlib.closing(sqlite3.connect(built)) as conn:
            with conn:
                conn.execute("DELETE FROM experiment_tags")
                conn.execute("DELETE FROM experiments")
            conn.execute("PRAGMA journal_mode=DELETE")
            (head,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        log.info("migrated an empty MLflow database (head %s) into %s", head, path)
        os.replace(built, path)

"""A new state folder's databases, Prefect's and MLflow's, start as copies of migrated empty ones.

Prefect builds a new SQLite database by running each of its schema migrations when its server
first starts (the temporary server of a ``flows run`` without ``PREFECT_API_URL``, or ``flows
server up``): about 10 s of CPU, for every new state folder. MLflow does the same for its
database when a process first opens it (``flows run`` on the state folder's ``mlflow.db``, or
its server): about 1 s. A database either has migrated holds nothing of its folder (its tables,
the migration head, MLflow's default workspace), so each migrated empty database is built once
per version, by the library's own code, into a schema cache (:data:`SCHEMA_CACHE_ENV`,
:data:`MLFLOW_SCHEMA_CACHE_ENV`), and copied from there in milliseconds. Neither library offers
a way to start from a built schema, so the copy is done here.

MLflow's default experiment names an artifact folder of the process that created it, so the
cached database holds none: MLflow creates it on first opening the copy, in that folder.
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

__all__ = ["DATABASE_URL_VARS", "MLFLOW_SCHEMA_CACHE_ENV", "SCHEMA_CACHE_ENV",
           "seed_mlflow_database", "seed_prefect_database"]

SCHEMA_CACHE_ENV = "PHYSAI_PREFECT_SCHEMA_CACHE"
"""Folder of the migrated empty Prefect databases, one per Prefect version (default
``~/.cache/physai-flows/prefect-schema``); empty: every new database is migrated by Prefect."""

MLFLOW_SCHEMA_CACHE_ENV = "PHYSAI_MLFLOW_SCHEMA_CACHE"
"""Folder of the migrated empty MLflow databases, one per MLflow version (default
``~/.cache/physai-flows/mlflow-schema``); empty: every new database is migrated by MLflow."""

DATABASE_URL_VARS = ("PREFECT_API_DATABASE_CONNECTION_URL",
                     "PREFECT_SERVER_DATABASE_CONNECTION_URL")
"""Variables that point Prefect at a database of the user's own: nothing is seeded then."""

BUILD_TIMEOUT_S = 600


def seed_prefect_database(prefect_home: Path, env: Mapping[str, str] | None = None) -> bool:
    """Start ``prefect_home``'s database (``prefect.db``, Prefect's default) as a copy of the
    migrated empty one of this Prefect version.

    Does nothing (returns False) when ``env`` (default: the process environment) names another
    database, when the database or its folder's absence says it is not ours to start, or when
    the cache cannot be used: Prefect then migrates a new database itself. Never writes over a
    database that exists (a hard link of a finished temporary copy)."""
    env = os.environ if env is None else env
    if any(env.get(name) for name in DATABASE_URL_VARS):
        return False
    return _seed(prefect_home / "prefect.db", env, SCHEMA_CACHE_ENV, "prefect", _build)


def seed_mlflow_database(tracking_uri: str, env: Mapping[str, str] | None = None) -> bool:
    """Start the SQLite database ``tracking_uri`` names (``sqlite:////abs/path.db``) as a copy
    of the migrated empty one of this MLflow version; MLflow adds its default experiment on
    first opening it.

    Does nothing (returns False) for another kind of store, an existing database, a missing
    folder, or when the cache cannot be used: MLflow then migrates a new database itself."""
    env = os.environ if env is None else env
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix) or "?" in tracking_uri:
        return False
    return _seed(Path(tracking_uri[len(prefix):]), env, MLFLOW_SCHEMA_CACHE_ENV, "mlflow",
                 _build_mlflow)


def _seed(dest: Path, env: Mapping[str, str], cache_env: str, package: str,
          build: Callable[[Path, Mapping[str, str]], None]) -> bool:
    """Copy the cached empty database of ``package``'s version to ``dest`` (building it with
    ``build`` first if missing) unless ``dest`` exists or its folder does not."""
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
            os.link(tmp, dest)  # never over a database a server created meanwhile
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
                    build: Callable[[Path, Mapping[str, str]], None]) -> Path | None:
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


def _build(path: Path, env: Mapping[str, str]) -> None:
    """Migrate a new database in a temporary Prefect home with Prefect's own command, fold its
    write-ahead log into the one file, and move it to ``path``."""
    with tempfile.TemporaryDirectory(prefix=".building.", dir=path.parent) as home:
        clean = {k: v for k, v in env.items()
                 if k not in DATABASE_URL_VARS and k != "PREFECT_API_URL"}
        subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                       env={**clean, "PREFECT_HOME": home}, check=True, capture_output=True,
                       timeout=BUILD_TIMEOUT_S)
        built = Path(home) / "prefect.db"
        with contextlib.closing(sqlite3.connect(built)) as conn:
            conn.execute("PRAGMA journal_mode=DELETE")
            (head,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        log.info("migrated an empty Prefect database (head %s) into %s", head, path)
        os.replace(built, path)


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

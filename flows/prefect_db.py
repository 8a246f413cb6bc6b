"""A new state folder's Prefect database starts as a copy of a migrated empty one.

Prefect builds a new SQLite database by running each of its schema migrations when its server
first starts (the temporary server of a ``flows run`` without ``PREFECT_API_URL``, or ``flows
server up``): about 10 s of CPU, for every new state folder. A database Prefect has migrated
holds nothing of its folder (its tables and the migration head only), so the migrated empty
database is built once per Prefect version, by Prefect's own ``prefect server database upgrade``,
into the schema cache (:data:`SCHEMA_CACHE_ENV`), and copied from there in milliseconds. Prefect
offers no way to start a server from a built schema, so the copy is done here.
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
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["DATABASE_URL_VARS", "SCHEMA_CACHE_ENV", "seed_prefect_database"]

SCHEMA_CACHE_ENV = "PHYSAI_PREFECT_SCHEMA_CACHE"
"""Folder of the migrated empty Prefect databases, one per Prefect version (default
``~/.cache/physai-flows/prefect-schema``); empty: every new database is migrated by Prefect."""

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
    dest = prefect_home / "prefect.db"
    if dest.exists() or not prefect_home.is_dir():
        return False
    try:
        empty = _empty_database(env)
        if empty is None:
            return False
        fd, name = tempfile.mkstemp(prefix=".prefect.db.", dir=prefect_home)
        os.close(fd)
        tmp = Path(name)
        try:
            tmp.write_bytes(empty.read_bytes())
            os.link(tmp, dest)  # never over a database a server created meanwhile
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, sqlite3.Error, subprocess.SubprocessError) as exc:
        log.debug("Prefect database %s not seeded: %s", dest, exc)
        return False
    return True


def _cache_folder(env: Mapping[str, str]) -> Path | None:
    folder = env.get(SCHEMA_CACHE_ENV)
    if folder is None:
        base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = str(Path(base) / "physai-flows" / "prefect-schema")
    return Path(folder) if folder else None


def _empty_database(env: Mapping[str, str]) -> Path | None:
    """The cached migrated empty database of this Prefect version, built by Prefect on first
    use (one builder at a time: the others wait for it); None without a cache folder."""
    folder = _cache_folder(env)
    if folder is None:
        return None
    path = folder / f"prefect-{version('prefect')}.db"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            _build(path, env)
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

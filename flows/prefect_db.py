"""A new state folder's Prefect database starts as a copy of a migrated empty one.

Prefect builds a new SQLite database by running each of its schema migrations when its server
first starts (the temporary server of a ``flows run`` without ``PREFECT_API_URL``, or ``flows
server up``): about 10 s of CPU, for every new state folder. The migrated empty database is
built once per Prefect version, by Prefect's own command, into a schema cache
(:data:`SCHEMA_CACHE_ENV`), and copied from there in milliseconds (stages/tracking/schema_cache.py,
which seeds every MLflow database of the project the same way; :func:`seed_mlflow_database`
is that one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from stages.tracking.schema_cache import (
    BUILD_TIMEOUT_S,
    seed_copy,
)

log = logging.getLogger(__name__)

__all__ = ["DATABASE_URL_VARS", "SCHEMA_CACHE_ENV", "seed_prefect_database"]

SCHEMA_CACHE_ENV = "PHYSAI_PREFECT_SCHEMA_CACHE"
"""Folder of the migrated empty Prefect databases, one per Prefect version (default
``$XDG_CACHE_HOME/physai-flows/prefect-schema``, else ``~/.cache/physai-flows/prefect-schema``);
empty: every new database is migrated by Prefect."""

DATABASE_URL_VARS = ("PREFECT_API_DATABASE_CONNECTION_URL",
                     "PREFECT_SERVER_DATABASE_CONNECTION_URL")
"""Variables that point Prefect at a database of the user's own: nothing is seeded then."""


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
    return seed_copy(prefect_home / "prefect.db", env, SCHEMA_CACHE_ENV, "prefect", _build)


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

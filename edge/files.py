"""File helpers shared by the edge package: streaming sha256 and atomic replacement."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CHUNK_BYTES = 1 << 20
"""Read size for streaming digests and copies."""


def sha256_stream(stream: IO[bytes], sink: IO[bytes] | None = None) -> tuple[str, int]:
    """Hex sha256 and byte count of everything left in ``stream``, read in chunks.

    When ``sink`` is given, every chunk is also written to it.
    """
    digest = hashlib.sha256()
    size = 0
    for chunk in iter(lambda: stream.read(CHUNK_BYTES), b""):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return digest.hexdigest(), size


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    with path.open("rb") as stream:
        return sha256_stream(stream)[0]


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    The file gets mode 0o644 and is flushed to disk before the rename. If the body raises,
    the temporary file is removed and ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.chmod(0o644)
    try:
        yield tmp
        with tmp.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)

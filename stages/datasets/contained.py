"""What a dataset source must be before any reader sees it: its own bytes, of a size that fits.

Every format's reader, the built-in ones and those a plugin registers, is handed a source
only after :func:`check_source` (called by :meth:`stages.datasets.formats.DatasetFormat.read`):

- the source (the file or folder named) and every entry below a folder source is a regular
  file or a folder. A symbolic link anywhere, the named path included, is refused, as are
  FIFOs, sockets and devices, so that a dataset never hands a reader a file from outside it
  (``/etc/passwd``, another user's dataset) nor blocks it on a pipe. To import a dataset
  reached through a link, name the file or folder it points to;
- every HDF5 file in it (found by its signature, whatever its name) holds its own data: no
  soft or external links, no external or virtual datasets
  (:func:`stages.data.check_self_contained`), and every Parquet file stores its columns in
  itself;
- the arrays its HDF5 datasets and Parquet columns declare (shape times item size, read from
  their headers before any data) fit :func:`stages.data.dataset_limit`, each and all together.

Each refusal is one :class:`~stages.errors.ConfigError` naming the file, the entry and what
was found.
"""

from __future__ import annotations

import os
import stat
from functools import partial
from pathlib import Path

from stages.data import check_self_contained, dataset_limit, over_limit, read_hdf5_file
from stages.errors import ConfigError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The HDF5 superblock signature, at offset 0, 512, 1024, 2048, ... of a file."""
PARQUET_MAGIC = b"PAR1"
_PARQUET_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}
"""Bytes one decoded value of a Parquet physical type takes in memory."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        return "device"
    return "special file"


def source_files(path: Path) -> list[Path]:
    """Every regular file of a source: the file itself, or every file below the folder, sorted
    as paths sort (by their parts: the order source digests take them in). A symbolic link
    (the source itself or any entry below it), a FIFO, a socket or a device is a
    :class:`ConfigError` naming it; so is a source that does not exist."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        raise ConfigError.one(path, "", str(path), "no such file or folder") from None
    if stat.S_ISLNK(mode):
        raise ConfigError.one(path, "", "symbolic link",
                              "the dataset is a symbolic link; name the file or folder it "
                              "points to")
    if stat.S_ISREG(mode):
        return [path]
    if not stat.S_ISDIR(mode):
        raise ConfigError.one(path, "", _kind(mode), "expected a dataset file or folder")
    files: list[Path] = []
    folders = [path]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise ConfigError.one(path, folder.relative_to(path).as_posix() or ".", None,
                                  f"unreadable folder: {exc.strerror}") from None
        for entry in entries:
            where = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                folders.append(where)
            elif entry.is_file(follow_symlinks=False):
                files.append(where)
            else:
                kind = _kind(entry.stat(follow_symlinks=False).st_mode)
                raise ConfigError.one(path, where.relative_to(path).as_posix(), kind,
                                      "a dataset holds only its own files and folders")
    return sorted(files)


def _signature(file: Path) -> str | None:
    """``"hdf5"`` or ``"parquet"`` when the file's bytes say so, else None. Opened without
    following a link, and only when it still is a regular file."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError.one(file, "", None, f"unreadable: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError.one(file, "", _kind(info.st_mode),
                                  "a dataset holds only its own files and folders")
        size = info.st_size
        head = f.read(8)
        if head[:4] == PARQUET_MAGIC and size >= 12:
            f.seek(-4, os.SEEK_END)
            if f.read(4) == PARQUET_MAGIC:
                return "parquet"
        offset = 0
        while offset + len(HDF5_SIGNATURE) <= size:
            f.seek(offset)
            if f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                return "hdf5"
            offset = 512 if offset == 0 else 2 * offset
    return None


def _parquet_bytes(file: Path, limit: int) -> int:
    """Bytes the columns of a Parquet file declare once decoded (values times their width;
    variable-width values by their uncompressed size); refuses columns stored in another
    file and a column over ``limit``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(file) as pf:
            meta = pf.metadata
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError.one(file, "", None, f"unreadable parquet: {exc}") from None
    need: dict[str, int] = {}
    values: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            if col.file_path:
                raise ConfigError.one(file, col.path_in_schema, "file_path",
                                      "data stored outside the file is not allowed in a "
                                      "dataset")
            width = _PARQUET_WIDTH.get(col.physical_type)
            if width is None and col.physical_type == "FIXED_LEN_BYTE_ARRAY":
                width = meta.schema.column(c).length
            name = col.path_in_schema
            need[name] = need.get(name, 0) + (col.num_values * width if width is not None
                                              else col.total_uncompressed_size)
            values[name] = values.get(name, 0) + col.num_values
            kinds[name] = col.physical_type
    for name, size in need.items():
        if size > limit:
            raise over_limit(file, name, size, limit, values[name],
                             f"{values[name]} values of {kinds[name]}")
    return sum(need.values())


def check_source(path: Path, limit: int | None = None) -> None:
    """Check a dataset source as the module doc says, before a reader opens it; ``limit``:
    the bytes its arrays may declare (default :func:`stages.data.dataset_limit`). Raises
    :class:`ConfigError` naming the file, the entry and what was found."""
    limit = dataset_limit() if limit is None else limit
    total = 0
    files = source_files(path)
    for file in files:
        kind = _signature(file)
        if kind == "hdf5":
            total += read_hdf5_file(file, partial(check_self_contained, path=file, limit=limit))
        elif kind == "parquet":
            total += _parquet_bytes(file, limit)
    if total > limit:
        raise over_limit(path, "", total, limit, total, f"{len(files)} files together")


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
  (:func:`stages.datasets.demonstrations.check_self_contained`), and every Parquet file stores its
  columns in itself;
- the arrays its HDF5 datasets and Parquet columns take once decoded fit
  :func:`stages.datasets.demonstrations.dataset_limit`, each and all together, charged to one
  :class:`~stages.datasets.demonstrations.DecodeBudget` before any reader decodes them: an HDF5
  dataset's shape times its item size, from its header; a Parquet column's values times their width
  from the file's footer, its byte arrays by their stored size when they are stored whole, by their
  expanded values when dictionary-encoded (counted in dictionary form, one row group at a
  time: a few KiB of dictionary can expand to GiB).

The readers themselves charge what they decode to a budget of their own, Parquet row group by
row group (:func:`read_parquet`, only the columns they use), image and video frames from their
headers before decoding them.

Each refusal is one :class:`~physai_core.errors.ConfigError` naming the file, the entry and what
was found.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from physai_core.errors import ConfigError
from stages.datasets.demonstrations import DecodeBudget, check_self_contained, read_hdf5_file

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The HDF5 superblock signature, at offset 0, 512, 1024, 2048, ... of a file."""
PARQUET_MAGIC = b"PAR1"
_PARQUET_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}
"""Bytes one decoded value of a Parquet physical type takes in memory."""
OFFSET_BYTES = 4
"""Bytes of the offset Arrow keeps beside each byte-array value."""
_BYTES_ENCODINGS = frozenset({"PLAIN", "DELTA_LENGTH_BYTE_ARRAY", "RLE", "BIT_PACKED"})
"""Encodings of a byte-array column that store every value's bytes whole (RLE and BIT_PACKED:
its levels): its decoded size is bounded by its stored size."""
_DICTIONARY_ENCODINGS = frozenset({"PLAIN_DICTIONARY", "RLE_DICTIONARY"})


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


def open_parquet(file: Path, dictionary: Sequence[str] = ()) -> pq.ParquetFile:
    """The Parquet file ``file`` with only its footer read, every column chunk stored in it;
    the leaf columns ``dictionary`` names read as dictionaries. A file Arrow cannot open, or a
    column stored in another file, is a :class:`ConfigError` naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(file, read_dictionary=list(dictionary) or None)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError.one(file, "", None, f"unreadable parquet: {exc}") from None
    meta = pf.metadata
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            if col.file_path:
                pf.close()
                raise ConfigError.one(file, col.path_in_schema, "file_path",
                                      "data stored outside the file is not allowed in a "
                                      "dataset")
    return pf


def _value_bytes(arr: pa.Array) -> int:
    """Bytes of the byte-array values in ``arr`` (one leaf column, in its struct and list
    parents), its dictionaries expanded: what the values take once read without them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = arr.type
    if pa.types.is_dictionary(kind):
        lengths = pc.binary_length(arr.dictionary).take(arr.indices)
        return int(pc.sum(lengths).as_py() or 0)
    if pa.types.is_struct(kind):
        return sum(_value_bytes(field) for field in arr.flatten())
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind)
            or pa.types.is_fixed_size_list(kind)):
        return _value_bytes(arr.flatten())
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        return int(pc.sum(pc.binary_length(arr)).as_py() or 0)
    return 0


def _expanded_bytes(file: Path, g: int, col: pq.ColumnChunkMetaData) -> int:
    """Bytes the dictionary-encoded byte-array column chunk ``col`` (of row group ``g``) takes
    once its values are expanded: read in dictionary form (an int32 index a value and the
    dictionary, no larger than its stored pages), one row group at a time."""
    import pyarrow as pa

    name = col.path_in_schema
    with open_parquet(file, (name,)) as pf:
        try:
            table = pf.read_row_group(g, columns=[name])
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError.one(file, name, None, f"unreadable parquet: {exc}") from None
    return OFFSET_BYTES * col.num_values + sum(
        _value_bytes(chunk) for chunk in table.column(0).chunks)


def _leaf_bytes(file: Path, pf: pq.ParquetFile, g: int, c: int, budget: DecodeBudget) -> int:
    """Bytes leaf column ``c`` of row group ``g`` takes once decoded: values times their width;
    byte arrays stored whole (PLAIN, DELTA_LENGTH_BYTE_ARRAY) by their uncompressed size and an
    offset each; dictionary-encoded byte arrays by their expanded values, measured in
    dictionary form (within ``budget`` before they are read). A byte-array encoding whose
    values can be longer than what it stores (DELTA_BYTE_ARRAY's shared prefixes) is
    refused."""
    meta = pf.metadata
    col = meta.row_group(g).column(c)
    width = _PARQUET_WIDTH.get(col.physical_type)
    if width is None and col.physical_type == "FIXED_LEN_BYTE_ARRAY":
        width = meta.schema.column(c).length
    if width is not None:
        return int(col.num_values) * int(width)
    encodings = set(col.encodings)
    stored = OFFSET_BYTES * col.num_values + col.total_uncompressed_size
    if not encodings <= _BYTES_ENCODINGS | _DICTIONARY_ENCODINGS:
        raise ConfigError.one(file, col.path_in_schema, sorted(encodings - _BYTES_ENCODINGS
                                                                - _DICTIONARY_ENCODINGS),
                              "byte arrays in an encoding whose decoded size the file does "
                              f"not bound; expected {', '.join(sorted(_BYTES_ENCODINGS))} or "
                              "a dictionary")
    if encodings.isdisjoint(_DICTIONARY_ENCODINGS):
        return stored
    budget.check(file, col.path_in_schema, stored, col.num_values,
                 f"{col.num_values} values of {col.physical_type} in dictionary form")
    return _expanded_bytes(file, g, col)


def _parquet_bytes(file: Path, budget: DecodeBudget) -> int:
    """Charge ``budget`` with the bytes every column of a Parquet file takes once decoded
    (:func:`_leaf_bytes`, row group by row group); refuses columns stored in another file and
    a column, or the file, over what ``budget`` has left. Returns the bytes charged."""
    with open_parquet(file) as pf:
        meta = pf.metadata
        total = 0
        for c in range(meta.num_columns):
            name = meta.schema.column(c).path
            kind = meta.schema.column(c).physical_type
            size = values = 0
            for g in range(meta.num_row_groups):
                size += _leaf_bytes(file, pf, g, c, budget)
                values += meta.row_group(g).column(c).num_values
                budget.check(file, name, size, values, f"{values} values of {kind}")
            total += size
    budget.charge(file, "", total, total, f"{meta.num_columns} columns together")
    return total


def read_parquet(file: Path, columns: Sequence[str],
                 budget: DecodeBudget) -> tuple[pa.Table, list[str]]:
    """The columns of ``columns`` that a Parquet file holds (a name selects a column and every
    field below it), read row group by row group, and the names of every column it holds.
    Before a row group is read its decoded size (:func:`_leaf_bytes`) is charged to
    ``budget``, and what it holds past that once read (list offsets, validity bitmaps), so that
    a reader holds no more than the budget allows, however few bytes the file stores."""
    import pyarrow as pa

    with open_parquet(file) as pf:
        names = list(pf.schema_arrow.names)
        wanted = [n for n in columns if n in names]
        meta = pf.metadata
        leaves = [c for c in range(meta.num_columns)
                  if any(_below(meta.schema.column(c).path, n) for n in wanted)]
        parts = []
        try:
            for g in range(meta.num_row_groups):
                rows = meta.row_group(g).num_rows
                where = f"row group {g}"
                need = sum(_leaf_bytes(file, pf, g, c, budget) for c in leaves)
                budget.charge(file, where, need, rows, f"{len(wanted)} columns of {rows} rows")
                part = pf.read_row_group(g, columns=wanted)
                budget.charge(file, where, max(0, part.nbytes - need), rows,
                              "decoded past its declared size")
                parts.append(part)
            table = pa.concat_tables(parts) if parts else pf.read(columns=wanted)
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError.one(file, "", wanted, f"unreadable parquet: {exc}") from None
    return table, names


def _below(path: str, name: str) -> bool:
    """Whether the leaf column ``path`` is ``name`` or a field below it (as Arrow selects
    columns by name)."""
    return path == name or path.startswith(name + ".")


def check_source(path: Path, limit: int | None = None) -> None:
    """Check a dataset source as the module doc says, before a reader opens it; ``limit``:
    the bytes its arrays may declare (default :func:`stages.datasets.demonstrations.dataset_limit`).
    Raises :class:`ConfigError` naming the file, the entry and what was found."""
    budget = DecodeBudget(limit)
    for file in source_files(path):
        kind = _signature(file)
        if kind == "hdf5":
            read_hdf5_file(file, partial(check_self_contained, path=file, budget=budget))
        elif kind == "parquet":
            _parquet_bytes(file, budget)


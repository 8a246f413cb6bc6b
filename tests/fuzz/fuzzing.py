"""Shared pieces of the bad-input fuzz suites: settings, mutation strategies and the checks.

Every suite starts from a valid input the project itself wrote or ships and mutates it: a
field removed, replaced by junk of any type, renamed, retyped or added; the file's text or
bytes truncated, overwritten or spliced. A mutated input must either load or be rejected
with the project's error for that input, in one line naming the file, exit status 2, and
with nothing written.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from physai_core.errors import ConfigError, Problem

EXAMPLES_SCALE = float(os.environ.get("PHYSAI_FUZZ_SCALE", "1"))
"""Multiplies every suite's example count (``PHYSAI_FUZZ_SCALE=10`` for a long local run)."""

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""Reproducible and bounded: the same examples on every run, no example database written."""


def examples(count: int) -> settings:
    """:data:`FUZZ` with ``count`` examples (scaled by :data:`EXAMPLES_SCALE`)."""
    return settings(FUZZ, max_examples=max(1, round(count * EXAMPLES_SCALE)))


Path_ = tuple[str | int, ...]
"""Where a node sits in a YAML/JSON tree: mapping keys and list indices from the root."""


def dotted(path: Path_) -> str:
    """A tree path as the project's error messages spell a field: ``scenes.0.scene``."""
    return ".".join(str(p) for p in path)


def nodes(tree: Any, path: Path_ = ()) -> Iterator[Path_]:
    """Every node's path, the root first."""
    yield path
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from nodes(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from nodes(value, (*path, i))


def get(tree: Any, path: Path_) -> Any:
    """The node at ``path``."""
    for part in path:
        tree = tree[part]
    return tree


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=24),
    st.sampled_from(["", " ", "../../../etc/passwd", "/etc/passwd", "a\nb", "\x00", "\u202e",
                     "models:/x@y", "sha256:" + "0" * 64, "é" * 40, "1e309", "nan", "yes"]),
)
"""Junk of every scalar type, with the values that break parsers most often."""

junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers(-3, 3)), inner, max_size=3),
    ),
    max_leaves=6,
)
"""Any YAML/JSON value, nested a little."""

field_names = st.one_of(
    st.text(min_size=1, max_size=16).filter(lambda s: yaml.safe_load(yaml.safe_dump(s)) == s),
    st.sampled_from(["extra", "Name", "__class__", "files", "format_version", "a.b", "a\nb"]),
)
"""Names of fields to insert or rename to: typos, dotted, reserved, with control characters;
only names that come back from YAML as they went in."""


@dataclass(frozen=True)
class Edit:
    """One structural change of a tree: what, where and with what value."""

    op: str
    """``delete``, ``replace``, ``insert`` (a new key), ``rename`` (a key), or ``retype``
    (the same value as a string, or wrapped in a list or a mapping)."""
    path: Path_
    """The node changed: for ``insert`` the new key's path, for ``rename`` the old one's."""
    value: Any = None
    """The new value; for ``rename`` the new key."""

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields an error about this edit may name, dotted."""
        named = [self.path]
        if self.op == "rename":
            named.append((*self.path[:-1], self.value))
        if self.path and isinstance(self.path[-1], int):
            named.append(self.path[:-1])
        return tuple(dotted(p) for p in named)

    def __str__(self) -> str:
        return f"{self.op} {dotted(self.path) or '(root)'}: {self.value!r}"[:200]


@st.composite
def edited(draw: st.DrawFn, tree: Any, max_edits: int = 3) -> tuple[Any, tuple[Edit, ...]]:
    """A copy of ``tree`` (which is never changed) with 1 to ``max_edits`` structural edits;
    returns the new tree and the edits, in order."""
    tree = copy.deepcopy(tree)
    done: list[Edit] = []
    for _ in range(draw(st.integers(1, max_edits))):
        paths = list(nodes(tree))
        path = draw(st.sampled_from(paths))
        node = get(tree, path)
        parent: Any = get(tree, path[:-1]) if path else None
        ops = ["replace", "retype", *(["delete"] if path else []),
               *(["rename"] if isinstance(parent, dict) else []),
               *(["insert"] if isinstance(node, dict) else [])]
        op = draw(st.sampled_from(ops))
        if op == "replace":
            others = [get(tree, p) for p in paths if p != path]
            value = copy.deepcopy(draw(st.one_of(junk, st.sampled_from(others)) if others
                                       else junk))
        elif op == "retype":
            value = copy.deepcopy(draw(st.sampled_from([str(node), [node], {"value": node}])))
        elif op == "insert":
            path, parent = (*path, draw(field_names)), node
            value = draw(junk)
        elif op == "rename":
            value = draw(field_names)
        else:
            value = None
        if not path:
            tree = value
        elif op == "delete":
            del parent[path[-1]]
        elif op == "rename":
            parent[value] = parent.pop(path[-1])
        else:
            parent[path[-1]] = value
        done.append(Edit(op, path, value))
    return tree, tuple(done)


class Blob(bytes):
    """Bytes that show as their size and digest, so a failing example's report stays short."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes, sha256 {hashlib.sha256(self).hexdigest()[:16]}>"


def text_edits(text: bytes) -> st.SearchStrategy[Blob]:
    """``text`` truncated, overwritten, spliced with junk bytes, or replaced by junk."""
    n = len(text)
    position = st.integers(0, max(0, n - 1))
    raw = st.binary(min_size=1, max_size=16)
    return st.one_of(
        position.map(lambda i: text[:i]),
        st.tuples(position, raw).map(lambda t: text[: t[0]] + t[1] + text[t[0] + len(t[1]):]),
        st.tuples(position, raw).map(lambda t: text[: t[0]] + t[1] + text[t[0]:]),
        st.tuples(position, st.integers(1, 255)).map(
            lambda t: text[: t[0]] + bytes([text[t[0]] ^ t[1]]) + text[t[0] + 1:]
        ),
        st.binary(max_size=64),
        st.sampled_from([
            b"", b"\xff\xfe\x00", b"- a\n- b\n", b"just text", b"{", b"key: [unclosed",
            b"!!python/object/apply:os.system ['true']", b"a: &x [1]\nb: *x\n", b"\t- tab",
            b"%YAML 9.9\n---\na: 1", b"a: 1\na: 2\n", b"null", b"[]", b"42",
        ]),
    ).map(Blob)


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder`` with its size and mtime: a snapshot to compare."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            stat = path.lstat()
            out[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return out


def check_one_line(message: str, *names: str | Path) -> None:
    """The message is one non-empty line and names each of ``names``."""
    assert message and "\n" not in message and "\r" not in message, repr(message)
    for name in names:
        assert str(name) in message, (str(name), message)


Cross = dict[str, set[str]]
"""Top-level fields whose change can make a field under another top-level one wrong."""


def related(problem: Problem, edit: Edit, file: Path, cross: Cross) -> bool:
    """Whether ``problem`` can be about ``edit`` of ``file``: the same field, one inside it or
    around it, a field under a section that ``cross`` says the edited one decides, or any
    field of another file that ``file`` refers to."""
    if problem.file != str(file):
        return True
    for field in edit.fields:
        if (problem.field == field or problem.field.startswith(f"{field}.")
                or field.startswith(f"{problem.field}.")):
            return True
        if problem.field.split(".")[0] in cross.get(field.split(".")[0], ()):
            return True
    return False


def check_rejection(
    error: ConfigError, file: Path, edits: tuple[Edit, ...] = (), cross: Cross | None = None
) -> None:
    """``error`` is a one-line, exit-status-2 rejection of ``file`` whose every problem names
    the file (``file`` or a file it refers to) and a value; after structural ``edits`` of a
    mapping every problem also names a field, and one of them a field the edits touched."""
    message = str(error)
    assert error.exit_code == 2
    check_one_line(message)
    assert error.problems
    for problem in error.problems:
        assert problem.file and problem.file in message
        assert problem.file == str(file) or Path(problem.file).is_file(), problem
        assert "(value: " in str(problem)
    if not edits:
        assert str(file) in message
        return
    if any(not e.path for e in edits):
        return
    for problem in error.problems:
        assert problem.field, f"no field named: {message}"
    assert any(related(p, e, file, cross or {}) for p in error.problems for e in edits), (
        f"{message} names no field of the edits {[str(e) for e in edits]}")


def load_yaml_input(
    loader: Callable[[Path], object],
    content: bytes,
    name: str,
    record: Callable[[str], None],
    edits: tuple[Edit, ...] = (),
    cross: Cross | None = None,
) -> None:
    """Write ``content`` as ``name`` in a fresh folder and load it there with ``loader``:
    it loads, or it is rejected as :func:`check_rejection` demands; nothing is written beside
    it either way. ``record`` gets ``loaded`` or ``rejected``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(content)
        before = listing(path.parent)
        error: ConfigError | None = None
        try:
            with contextlib.chdir(path.parent):
                loader(path)
        except ConfigError as exc:
            error = exc
        assert listing(path.parent) == before
        record("rejected" if error else "loaded")
        if error is not None:
            check_rejection(error, path, edits, cross)


def yaml_bytes(tree: Any) -> bytes:
    """``tree`` as the YAML text a person would write (UTF-8)."""
    return yaml.safe_dump(tree, allow_unicode=True).encode("utf-8")


UNKNOWN_FIELD = "physai_no_such_field"
"""A key no model of the project has: inserted anywhere a model is, it must be rejected."""


def check_unknown_fields_rejected(
    loader: Callable[[Path], object], tree: Any, name: str, free: tuple[Path_, ...] = ()
) -> int:
    """Insert :data:`UNKNOWN_FIELD` into every mapping of ``tree`` in turn (but the free-form
    mappings ``free``): each must be rejected in one line naming the inserted field. Returns
    how many were tried, so a caller can check that the oracle ran."""
    tried = 0
    for path in nodes(tree):
        if not isinstance(get(tree, path), dict) or path in free:
            continue
        mutated = copy.deepcopy(tree)
        get(mutated, path)[UNKNOWN_FIELD] = 1
        with tempfile.TemporaryDirectory() as folder:
            file = Path(folder) / name
            file.write_bytes(yaml_bytes(mutated))
            try:
                with contextlib.chdir(folder):
                    loader(file)
            except ConfigError as exc:
                check_one_line(str(exc), file, dotted((*path, UNKNOWN_FIELD)))
            else:
                raise AssertionError(f"{name}: {dotted((*path, UNKNOWN_FIELD))} was accepted")
        tried += 1
    return tried


def check_rejected_share(suite: str, minimum: float) -> None:
    """At least ``minimum`` of the inputs ``suite`` tried in this session were rejected: a
    mutation strategy that stopped producing bad inputs would test nothing."""
    from tests.fuzz.conftest import TALLY

    counts = {outcome: n for (name, outcome), n in TALLY.items() if name == suite}
    total = sum(counts.values())
    if total == 0:
        return
    rejected = sum(n for outcome, n in counts.items() if outcome in ("rejected", "refused"))
    assert rejected / total >= minimum, (suite, counts)

"""docs/architecture.md names only what exists.

The page's code spans are read word by word:

- ``path/to/file.py`` (a word with a ``/``, or a file name with a known suffix) is a file, and
  ``path/to/folder/`` a folder, of the repository;
- ``path/to/file.py:name`` is a function, class or assignment at the top level of that file,
  and ``path/to/file.py:Class.method`` a method of a top-level class (read with :mod:`ast`);
  ``pyproject.toml:id`` is the id of an import-linter contract;
- ``stages.x.y`` (a dotted name under one of the project's packages) imports, as a module or
  as an attribute of the longest module prefix that imports.

Its relative links lead to files, and a link's ``#anchor`` to a heading of that file.
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("physai_core", "stages", "flows", "edge")
SUFFIXES = (".py", ".md", ".toml", ".yaml", ".txt", ".sh", ".json", ".xml", ".usda")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_WORD = re.compile(r"(?P<file>[\w.-]+(?:/[\w.-]+)*/?)(?::(?P<name>[\w.-]+))?")
DOTTED_WORD = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.\w+)+")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Reference:
    """One thing the page names: a path (with the name defined there, if any) or a dotted
    name."""

    word: str
    """The word as the page writes it."""
    file: str | None = None
    """The repository path it names (a folder ends with ``/``)."""
    name: str | None = None
    """What it names inside that file."""
    dotted: str | None = None
    """The dotted name it names."""


def references(text: str) -> list[Reference]:
    """Every path, ``path:name`` and dotted name in the code spans of ``text``, in order."""
    found: list[Reference] = []
    for span in CODE_SPAN.findall(text):
        for word in re.split(r"[\s(),=\[\]]+", span):
            word = word.rstrip(".;")
            path = PATH_WORD.fullmatch(word)
            if path and ("/" in path["file"] or path["file"].endswith(SUFFIXES)):
                found.append(Reference(word, file=path["file"], name=path["name"]))
            elif DOTTED_WORD.fullmatch(word):
                found.append(Reference(word, dotted=word))
    return found


def defined(tree: ast.Module, name: str) -> bool:
    """Whether ``name`` (``f``, or ``Class.member``) is defined at the top level of ``tree``."""
    head, _, member = name.partition(".")
    for node in tree.body:
        if member and isinstance(node, ast.ClassDef) and node.name == head:
            return member in _names(node.body)
        if not member and head in _names([node]):
            return True
    return False


def _names(body: list[ast.stmt]) -> set[str]:
    """The names the statements of ``body`` define: functions, classes and assignments."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def contract_ids() -> set[str]:
    """The ids of the import-linter contracts in pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["id"] for c in config["tool"]["importlinter"]["contracts"]}


def problem(ref: Reference, root: Path = ROOT) -> str | None:
    """Why ``ref`` names nothing under ``root``, or None when it names something."""
    if ref.dotted is not None:
        return _import_problem(ref.dotted)
    assert ref.file is not None
    path = root / ref.file
    if not (path.is_dir() if ref.file.endswith("/") else path.is_file()):
        return f"{ref.word}: no such {'folder' if ref.file.endswith('/') else 'file'}"
    if ref.name is None:
        return None
    if ref.file == "pyproject.toml":
        return None if ref.name in contract_ids() else f"{ref.word}: no such contract id"
    if path.suffix != ".py":
        return f"{ref.word}: a name in a file that is not Python"
    if not defined(ast.parse(path.read_text(), str(path)), ref.name):
        return f"{ref.word}: {ref.name} is not defined at the top level of {ref.file}"
    return None


def _import_problem(dotted: str) -> str | None:
    """Why ``dotted`` does not import, as a module or as attributes of its longest module
    prefix that imports; None when it does."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return f"{dotted}: {'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}"
            found = getattr(found, attribute)
        return None
    return f"{dotted}: no such module"


def slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    words = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return words.replace(" ", "-")


def link_problem(target: str, page: Path) -> str | None:
    """Why the relative link ``target`` on ``page`` leads nowhere, or None."""
    if re.match(r"\w+:", target):
        return None
    file, _, anchor = target.partition("#")
    path = (page.parent / file).resolve() if file else page
    if not path.is_file():
        return f"{target}: no such file"
    if anchor:
        headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
        if anchor not in {slug(h) for h in headings}:
            return f"{target}: no heading {anchor!r} in {path.name}"
    return None


def test_every_path_function_and_module_the_page_names_exists() -> None:
    refs = references(PAGE.read_text())
    assert sum(r.name is not None and r.file is not None and r.file.endswith(".py")
               for r in refs) >= 60
    assert sum(r.dotted is not None for r in refs) >= 15
    assert [p for r in refs if (p := problem(r)) is not None] == []


def test_every_link_of_the_page_leads_somewhere() -> None:
    links = LINK.findall(PAGE.read_text())
    assert len(links) >= 8
    assert [p for link in links if (p := link_problem(link, PAGE)) is not None] == []


def test_the_readme_and_the_extending_guide_link_the_page() -> None:
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
    top = (ROOT / "docs" / "extending.md").read_text().split("\n## ")[0]
    assert "(architecture.md)" in top


def test_a_name_that_is_not_there_is_found() -> None:
    text = ("`stages/steps/collect.py:collect` and `stages/steps/collect.py:no_such_step`, "
            "`stages/no_such.py`, `stages/sim/` `stages/no_such/`, "
            "`flows/stage_tasks.py:StageRunner.each_scene` "
            "`flows/stage_tasks.py:StageRunner.no_such`, `pyproject.toml:stages-layers` "
            "`pyproject.toml:no-such-contract`, `stages.sim.tasks.register_task(TaskSpec(...))` "
            "`stages.sim.tasks.no_such` `stages.no_such_module`, `python -m stages.envrun`")
    refs = references(text)
    assert [r.word for r in refs] == [
        "stages/steps/collect.py:collect", "stages/steps/collect.py:no_such_step",
        "stages/no_such.py", "stages/sim/", "stages/no_such/",
        "flows/stage_tasks.py:StageRunner.each_scene", "flows/stage_tasks.py:StageRunner.no_such",
        "pyproject.toml:stages-layers", "pyproject.toml:no-such-contract",
        "stages.sim.tasks.register_task", "stages.sim.tasks.no_such", "stages.no_such_module",
        "stages.envrun"]
    assert [problem(r) is None for r in refs] == [
        True, False, False, True, False, True, False, True, False, True, False, False, True]


def test_a_link_that_leads_nowhere_is_found() -> None:
    assert link_problem("extending.md#add-an-edge-target", PAGE) is None
    assert link_problem("extending.md#no-such-heading", PAGE) is not None
    assert link_problem("no_such.md", PAGE) is not None
    assert link_problem("https://example.org/x", PAGE) is None

"""The paths the project promised outside readers keep working, and nothing inside uses them.

Plugins (docs/extending.md, examples/), stored records (Prefect's JSON results name
``stages.artifacts.<Class>``, MLflow models) and commands (``python -m stages.envrun``,
``python -m stages.launch``) name paths from before the move into concept folders. Each such
path is a thin alias of the module that holds the code now (:data:`ALIASES`, the one table of
them): every name it offers is the real module's very object, and a command reaches the real
``main`` and exits as it does. Every dotted name docs/extending.md uses, in its prose and in its
code blocks' imports, and every project name the plugin examples import resolves; a new one
there is pinned without editing this file.

No module of the project imports an alias: every import statement of :data:`IMPORTERS` (module
level, function level and type-only alike) is read, and so are string references to modules
in code (``"pkg.module:name"`` and ``-m pkg.module``). Importing a submodule of an alias package
(``stages.sim.tasks.catalog``) is not importing the alias.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest
from pydantic import BaseModel

from tests.test_import_cycles import SHIPPED, imports_of, project_modules

ROOT = Path(__file__).resolve().parents[1]
EXTENDING = ROOT / "docs" / "extending.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
EXAMPLES = ROOT / "examples"
"""Plugin packages that show how a team extends the project: what they import is promised."""
IMPORTERS = (*SHIPPED, "benchmarks")
"""The packages that may not import an alias (tests and the plugin examples may)."""


class Alias(NamedTuple):
    """A promised path and the modules that hold its code now."""

    path: str
    real: tuple[str, ...]
    """The modules (or packages, any module inside counts) its names come from; a command's
    first is the module it runs."""
    command: bool = False
    """Run as ``python -m <path>`` rather than imported."""

    def takes_from(self, module: str) -> bool:
        """Whether ``module`` is one the alias may take names from."""
        return any(module == real or module.startswith(real + ".") for real in self.real)


ALIASES = (
    Alias("stages.algorithms", ("stages.training.algorithms",)),
    Alias("stages.artifacts", ("stages.artifacts.records",)),
    Alias("stages.environments", ("stages.core.environments",)),
    Alias("stages.envrun", ("stages.pipeline.envrun",), command=True),
    Alias("stages.launch", ("stages.pipeline.launch",), command=True),
    Alias("stages.mlflow_model", ("stages.tracking.mlflow_model",)),
    Alias("stages.sections", ("stages.sections.models",)),
    Alias("stages.sim.backends", ("stages.sim.backends.catalog",)),
    Alias("stages.sim.batched", ("stages.sim.env.batched",)),
    Alias("stages.sim.locomotion", ("stages.sim.tasks.locomotion",)),
    Alias("stages.sim.mujoco_env", ("stages.sim.env.mujoco_env",)),
    Alias("stages.sim.reach_arm", ("stages.sim.tasks.reach_arm",)),
    Alias("stages.sim.scene", ("stages.sim.scenes.scene", "stages.sim.suites")),
    Alias("stages.sim.tasks", ("stages.sim.tasks.catalog",)),
    Alias("stages.train", ("stages.steps.train",)),
    Alias("stages.units", ("stages.core.units",)),
)
"""Every alias module of the project: its promised path, the real modules, whether a command."""
ALIAS_PATHS = frozenset(a.path for a in ALIASES)

PROMISED = (
    "stages.algorithms.AlgorithmSpec",
    "stages.algorithms.register_algorithm",
    "stages.datasets.formats.DatasetFormat",
    "stages.datasets.formats.register_format",
    "stages.environments.StageEnvironment",
    "stages.environments.register_environment",
    "stages.sim.backends.BackendSpec",
    "stages.sim.backends.register_backend",
    "stages.sim.tasks.TaskSpec",
    "stages.sim.tasks.register_task",
    "stages.sections.TrainConfig",
    "stages.train.train",
    "stages.units.ActionRange",
    "stages.sim.batched.RobotEpisodes",
    "stages.sim.locomotion.LocomotionTask",
    "stages.sim.mujoco_env.MujocoBatchedEnv",
    "stages.sim.reach_arm.ReachTask",
    "stages.sim.scene.Scene",
    "edge.targets.EdgeTarget",
    "edge.targets.register_target",
)
"""Names plugins are known to use, pinned even if the guide stops showing them."""

_OUR_NAME = r"(?:stages|edge|physai_core|flows)(?:\.\w+)+"
_CODE_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_INLINE_CODE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")
_CALL_OF = re.compile(rf"({_OUR_NAME})\((\w+)\(")
_DOTTED = re.compile(rf"\b{_OUR_NAME}\b")
_MODULE_ATTR = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_][\w.]*$")
_DASH_M = re.compile(r"(?:^|\s)-m\s+([A-Za-z_][\w.]*)")


# -- what docs/extending.md promises

def documented_names(text: str) -> list[str]:
    """Every dotted project name ``text`` (markdown) uses: the names its Python code blocks
    import (``from M import N`` gives ``M.N``), the dotted names in its inline code, and the
    argument class of a call written ``M.f(Cls(...))`` (``M.Cls``)."""
    found: list[str] = []
    for block in _CODE_BLOCK.findall(text):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and re.fullmatch(
                    _OUR_NAME + "|stages|edge", node.module):
                found += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if re.fullmatch(_OUR_NAME, a.name)]
    for span in _INLINE_CODE.findall(text):
        span = re.sub(r"\.\s+", ".", span)
        found += _DOTTED.findall(span)
        found += [f"{call.rpartition('.')[0]}.{arg}" for call, arg in _CALL_OF.findall(span)]
    return sorted(set(found))


def example_names(root: Path = EXAMPLES) -> list[str]:
    """Every project name the plugin examples under ``root`` import (``from M import N`` gives
    ``M.N``, ``import M`` gives ``M``)."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for imp in imports_of(path.stem, path):
            if imp.module.partition(".")[0] in SHIPPED:
                found += [f"{imp.module}.{n}" for n in imp.names] if imp.names else [imp.module]
    return sorted(set(found))


def resolve_name(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not ".".join(parts[:cut]).startswith(exc.name):
                raise
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("dotted", sorted(
    {*PROMISED, *documented_names(EXTENDING.read_text(encoding="utf-8")), *example_names()}))
def test_every_promised_name_resolves(dotted: str) -> None:
    found = resolve_name(dotted)
    module, _, name = dotted.rpartition(".")
    alias = next((a for a in ALIASES if a.path == module), None)
    if alias is not None:
        real, real_name = alias_names(alias)[name]
        assert found is getattr(importlib.import_module(real), real_name), \
            f"{dotted} is not {real}.{real_name}"


def test_the_guide_parser_reads_code_and_prose() -> None:
    text = ("Call `pkg.x` or `stages.a.\nreg(Spec(...))`, `edge.t.f`.\n\n```python title=x.py\n"
            "def f():\n    from stages.b import c as d\n```\n")
    assert documented_names(text) == ["edge.t.f", "stages.a.Spec", "stages.a.reg", "stages.b.c"]


# -- the aliases are thin and give the real objects

def alias_names(alias: Alias) -> dict[str, tuple[str, str]]:
    """Name in the alias module to (real module, name there), for every ``from REAL import``
    in the alias's file (type-only ones included: a lazy alias declares its names there)."""
    module = importlib.import_module(alias.path)
    assert module.__file__ is not None
    found: dict[str, tuple[str, str]] = {}
    for node in ast.walk(ast.parse(Path(module.__file__).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and alias.takes_from(node.module):
            found |= {a.asname or a.name: (node.module, a.name) for a in node.names}
    return found


@pytest.mark.parametrize("alias", [a for a in ALIASES if not a.command], ids=lambda a: a.path)
def test_an_alias_gives_the_real_modules_objects(alias: Alias) -> None:
    module = importlib.import_module(alias.path)
    names = alias_names(alias)
    assert names, f"{alias.path} takes nothing from {alias.real}"
    for name, (real, real_name) in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(real), real_name), \
            f"{alias.path}.{name} is not {real}.{real_name}"


@pytest.mark.parametrize("alias", ALIASES, ids=lambda a: a.path)
def test_an_alias_imports_only_its_real_module(alias: Alias) -> None:
    spec = importlib.util.find_spec(alias.path)
    assert spec is not None and spec.origin is not None
    modules = project_modules(ROOT, SHIPPED)
    ours = {i.module for i in imports_of(alias.path, Path(spec.origin))
            if i.module.partition(".")[0] in SHIPPED}
    assert all(alias.takes_from(m) for m in ours), f"{alias.path} imports {sorted(ours)}"
    assert all(real in modules for real in alias.real)


def _artifact_classes(module: ModuleType) -> list[str]:
    """The pydantic models defined in ``module``, in file order."""
    return [name for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, BaseModel)
            and value.__module__ == module.__name__]


def test_every_artifact_class_has_its_stored_name() -> None:
    records = importlib.import_module("stages.artifacts.records")
    alias = importlib.import_module("stages.artifacts")
    classes = _artifact_classes(records)
    assert "SimReport" in classes
    for name in classes:
        assert getattr(alias, name, None) is getattr(records, name), \
            f"stages.artifacts.{name}: the path of every record before the move"


def test_every_alias_module_is_in_the_table() -> None:
    said = set()
    for module, path in project_modules(ROOT, ["stages"]).items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if re.search(r"the promised (?:path|command) of", doc):
            said.add(module)
    assert said == ALIAS_PATHS


def test_the_architecture_page_lists_the_aliases_of_the_table() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("Promised paths", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| `([\w.]+)`", section, re.MULTILINE)
    assert sorted(rows) == sorted((a.path, a.real[0]) for a in ALIASES)


# -- the promised commands reach the real main

def _run(args: Iterable[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("alias", [a for a in ALIASES if a.command], ids=lambda a: a.path)
def test_a_promised_command_runs_the_real_main(alias: Alias) -> None:
    real = alias.real[0]
    cases = {"help": ["--help"], "bad": ["pipeline.yaml", "--stage", "no-such-stage"]}
    runs = {(case, module): _run(["-m", module, *args])
            for case, args in cases.items() for module in (alias.path, real)}
    done = {key: (proc.communicate(timeout=300), proc.returncode) for key, proc in runs.items()}
    (out, err), code = done[("help", alias.path)]
    assert code == 0 and out.startswith(f"usage: python -m {real}"), out + err
    (out, err), code = done[("bad", alias.path)]
    assert code == 2 and "invalid choice: 'no-such-stage'" in err, out + err
    for case in cases:
        assert done[(case, alias.path)] == done[(case, real)], case


# -- nothing inside imports an alias

def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node of ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def string_refs(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every module a string constant of ``path``'s code names: as
    ``"module:attr"``, as ``"-m module"`` or as ``"-m", "module"`` in a list, tuple or call."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            for pattern in (_MODULE_ATTR, _DASH_M):
                yield from ((node.lineno, m.group(1)) for m in pattern.finditer(node.value))
        items = (node.elts if isinstance(node, ast.List | ast.Tuple)
                 else node.args if isinstance(node, ast.Call) else [])
        for flag, value in itertools.pairwise(items):
            if (isinstance(flag, ast.Constant) and flag.value == "-m"
                    and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                yield value.lineno, value.value


def alias_uses(root: Path, packages: Iterable[str], aliases: Iterable[str],
               modules: Mapping[str, Path] | None = None) -> list[str]:
    """``path:line module -> alias`` of every import of, or string reference to, an alias
    module by a module of ``packages`` under ``root``."""
    aliases = frozenset(aliases)
    known = dict(modules if modules is not None else project_modules(root, SHIPPED))
    scanned = project_modules(root, packages)
    known |= scanned
    found: list[tuple[Path, int, str]] = []
    for module, path in scanned.items():
        where = path.relative_to(root)
        for imp in imports_of(module, path):
            named = ([f"{imp.module}.{n}" if f"{imp.module}.{n}" in known else imp.module
                      for n in imp.names] if imp.names else [imp.module])
            found += [(where, imp.line, f"{module} -> {n}") for n in dict.fromkeys(named)
                      if n in aliases]
        found += [(where, line, f"{module} -> {ref} (a string)")
                  for line, ref in string_refs(path) if ref in aliases]
    return [f"{where}:{line} {text}" for where, line, text in sorted(set(found))]


def test_no_module_of_the_project_uses_an_alias() -> None:
    found = alias_uses(ROOT, IMPORTERS, ALIAS_PATHS)
    assert not found, "aliases used inside the project:\n" + "\n".join(found)


def _tree(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_scan_finds_every_way_of_using_an_alias(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "stages/__init__.py": "",
        "stages/sim/__init__.py": "",
        "stages/sim/tasks/__init__.py": "from stages.sim.tasks.catalog import x as x\n",
        "stages/sim/tasks/catalog.py": "x = 1\n",
        "stages/sim/ok.py": '"""Say stages.sim.tasks:x and -m stages.sim.tasks freely."""\n'
                            "from stages.sim.tasks import catalog\n"
                            "import stages.sim.tasks.catalog\n"
                            "from stages.sim.tasks.catalog import x\n"
                            'REF = "stages.sim.tasks.catalog:x"\n',
        "stages/sim/bad.py": "from typing import TYPE_CHECKING\n"
                             "if TYPE_CHECKING:\n    from stages.sim.tasks import x\n"
                             "def f() -> None:\n    import stages.sim.tasks\n"
                             "    from .tasks import x\n"
                             'REF = "stages.sim.tasks:x"\n'
                             'CMD = ["python", "-m", "stages.sim.tasks"]\n'
                             'SHELL = "python -m stages.sim.tasks --help"\n',
        "stages/sim/parent.py": "from stages.sim import tasks\n",
    })
    assert alias_uses(tmp_path, ["stages"], ["stages.sim.tasks"], {}) == [
        "stages/sim/bad.py:3 stages.sim.bad -> stages.sim.tasks",
        "stages/sim/bad.py:5 stages.sim.bad -> stages.sim.tasks",
        "stages/sim/bad.py:6 stages.sim.bad -> stages.sim.tasks",
        "stages/sim/bad.py:7 stages.sim.bad -> stages.sim.tasks (a string)",
        "stages/sim/bad.py:8 stages.sim.bad -> stages.sim.tasks (a string)",
        "stages/sim/bad.py:9 stages.sim.bad -> stages.sim.tasks (a string)",
        "stages/sim/parent.py:1 stages.sim.parent -> stages.sim.tasks",
    ]

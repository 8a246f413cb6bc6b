"""Models described by the docstring under each field (stages.core.schema.DocumentedModel): the
descriptions pydantic's ``use_attribute_docstrings`` gives, without its failure when another
thread builds a syntax tree at the same moment (CPython gh-106905, Python 3.11 before 3.11.8)."""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import stages.evaluation.compare
import stages.evaluation.sensitivity
import stages.sim.scenes.scene
import stages.sim.suites.suite
import stages.sim.tasks.template_config
from stages.core.schema import DocumentedModel, attribute_docstrings

MODULE = textwrap.dedent('''
    """A team's documented config."""

    from pydantic import Field

    from stages.core.schema import DocumentedModel, attribute_docstrings


    class Gripper(DocumentedModel):
        """A gripper."""

        width_m: float = 0.08
        """Opening at rest, in metres."""

        force_n: float = Field(40.0, description="Given to Field.")
        """Under the field, and not used: Field's description wins."""

        plain: int = 0

        class Finger(DocumentedModel):
            """One finger."""

            pad: str = "rubber"
            """Pad material."""
''')

MORE = textwrap.dedent('''

    class Part{i}(DocumentedModel):
        """Part {i}."""

        size: float = {i}.0
        """Size {i}."""

        mass: float = 1.0
        """Mass, in kilograms."""

        name: str = "part"
        """Name."""
''')


def _documented_models() -> Iterator[type[DocumentedModel]]:
    todo = list(DocumentedModel.__subclasses__())
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        yield model


def _import(path: Path, name: str) -> object:
    path.joinpath(f"{name}.py").write_text(MODULE)
    return importlib.import_module(name)


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("documented_")]:
        del sys.modules[name]


def test_a_field_takes_the_docstring_under_it_and_the_json_schema_shows_it(on_path: Path) -> None:
    module = _import(on_path, "documented_one")
    gripper = module.Gripper  # type: ignore[attr-defined]
    fields = gripper.model_fields
    assert fields["width_m"].description == "Opening at rest, in metres."
    assert fields["force_n"].description == "Given to Field."
    assert fields["plain"].description is None
    assert gripper.Finger.model_fields["pad"].description == "Pad material."
    properties = gripper.model_json_schema()["properties"]
    assert properties["width_m"]["description"] == "Opening at rest, in metres."
    assert "description" not in properties["plain"]


def test_every_documented_model_of_the_project_describes_every_field() -> None:
    models = {m for m in _documented_models() if m.__module__.startswith("stages.")}
    assert {stages.evaluation.compare.SuiteComparison, stages.artifacts.records.FactorEffect,
            stages.sim.scenes.scene.SceneConfig, stages.sim.suites.suite.SuiteConfig,
            stages.sim.tasks.template_config.ReachTemplateConfig} <= models
    for model in models:
        properties = model.model_json_schema()["properties"]
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            assert properties[field.alias or name].get("description") == field.description


def test_docstrings_are_read_while_another_thread_parses(tmp_path: Path) -> None:
    # Another thread builds syntax trees without pause while this one reads the docstrings of
    # classes in fresh module files, as a documented model's creation does; collections and a
    # short switch interval let the threads interleave inside a parse. On Python 3.11 before
    # 3.11.8 about one parse in six then fails: a plain parse of the same source, done here
    # each time too, shows the race is met (pydantic's use_attribute_docstrings raised
    # SystemError under it in a stage container).
    stop = threading.Event()
    source = MODULE + "".join(MORE.format(i=i) for i in range(20))

    class Garbage:
        def __del__(self) -> None:
            pass

    def parse() -> None:
        while not stop.is_set():
            for _ in range(1000):
                cycle: list[object] = [Garbage()]
                cycle.append(cycle)
            with contextlib.suppress(SystemError):
                ast.parse(source)

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-5)
    gc.set_threshold(200, 5, 5)
    parser = threading.Thread(target=parse, daemon=True)
    parser.start()
    read, plain_failures, end = [], 0, time.monotonic() + 30
    try:
        while (len(read) < 60 or plain_failures < 3) and time.monotonic() < end:
            name = f"documented_race_{len(read)}"
            path = tmp_path / f"{name}.py"
            path.write_text(source)
            module = types.ModuleType(name)
            module.__file__ = str(path)
            sys.modules[name] = module
            read.append(attribute_docstrings(type("Part19", (), {"__module__": name})))
            del sys.modules[name]
            try:
                ast.parse(source)
            except SystemError as error:
                assert "recursion depth mismatch" in str(error)
                plain_failures += 1
    finally:
        stop.set()
        parser.join()
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    docs = {"size": "Size 19.", "mass": "Mass, in kilograms.", "name": "Name."}
    assert read == [docs] * len(read)
    if sys.version_info < (3, 11, 8):
        assert plain_failures, f"no plain parse of {len(read)} met the other thread's"

"""Frozen pydantic base models: every config and artifact of the project is one.

:class:`FrozenModel` is immutable and rejects unknown fields; :class:`ConfigModel` adds that
the numbers a person writes are finite; :class:`DocumentedModel` describes each field by the
docstring under it. Reading files into them is :mod:`stages.core.loading`'s; what a message may
show of a value, :mod:`stages.core.redaction`'s.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import linecache
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """Immutable model that rejects unknown fields, the base of every config and artifact."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ConfigModel(FrozenModel):
    """A :class:`FrozenModel` of what a person writes (a config section): its numbers must be
    finite, since an infinite tolerance or latency budget would switch a gate off unseen."""

    model_config = ConfigDict(allow_inf_nan=False)


class DocumentedModel(FrozenModel):
    """A :class:`FrozenModel` whose fields are described by the docstring under each.

    This is what pydantic's ``use_attribute_docstrings`` does, done here because of how it does
    it: it parses the class's source with :func:`ast.parse` while the class is created, and
    CPython 3.11 before 3.11.8 shares one depth counter between threads that build syntax trees
    at once (CPython gh-106905), so the import raises ``SystemError: AST constructor recursion
    depth mismatch`` when another thread parses at that moment (seen in a stage container on
    Debian's Python 3.11.2, under Prefect's threads). :func:`attribute_docstrings` parses each
    module once and parses again on that error. A description given to ``Field`` wins.
    """

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        docs = attribute_docstrings(cls)
        undescribed = {name: field for name, field in cls.model_fields.items()
                       if field.description is None and name in docs}
        for name, field in undescribed.items():
            field.description = docs[name]
        if undescribed:
            cls.model_rebuild(force=True, raise_errors=False)


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each annotated attribute of ``cls``'s own body, cleaned as
    :func:`inspect.getdoc` cleans; empty where its source cannot be read."""
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    tree = _module_tree(file) if file else None
    body: list[ast.stmt] = tree.body if tree else []
    for part in cls.__qualname__.split("."):
        found = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        body = found.body if found else []
    return {stmt.target.id: inspect.cleandoc(doc.value.value)
            for stmt, doc in itertools.pairwise(body)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)}


@functools.lru_cache(maxsize=2)
def _module_tree(file: str) -> ast.Module | None:
    """``file``'s syntax tree (``None`` if it cannot be read or parsed), kept while the classes
    of one module are created.

    A parse that hits CPython gh-106905 (another thread parsed at the same moment) is repeated:
    the tree was built, only the shared counter's check failed.
    """
    source = "".join(linecache.getlines(file))
    for attempt in range(10):
        try:
            return ast.parse(source) if source else None
        except SyntaxError:
            return None
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == 9:
                raise
    return None

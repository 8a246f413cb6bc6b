"""Every key of every file the project reads, as Markdown tables made from the config models.

The models of :mod:`stages.sections.models`, :mod:`stages.pipeline.config`,
:mod:`stages.sim.scenes.scene`, :mod:`stages.sim.suites.suite` and
:mod:`stages.sim.tasks.template_config` reject unknown keys and describe each field
(``Field(description=)`` or the docstring under it); this module walks them and writes one
table per file kind: key (dotted, ``[]`` for a list item, ``<name>`` for a mapping's key), type,
default and what it means, with the bounds the model checks. ``train:`` gets one table per
registered algorithm. ``docs/configuration.md`` is the shipped algorithms' reference; ``flows keys``
prints the same tables with the installed plugins' algorithms, so a plugin's keys are documented
where ours are.

Pydantic's own ``model_json_schema`` gives the same facts as JSON Schema; the tables are
written from ``model_fields`` instead because a schema's ``$defs`` and ``anyOf`` would need a
renderer as long as this module to read as one row a key.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

KINDS = ("pipeline", "scene", "suite", "task")
"""The file kinds ``flows keys`` takes: a pipeline config, a scene, a suite, a task file."""

HEADER = """\
# Configuration reference

Every key of the files physai-flows reads, made from the models that check them, so a key that
is not here is refused (`flows check CONFIG` checks a pipeline config whole and writes
nothing). Keys are dotted; `[]` is an item of a list and `<name>` a mapping's key. A default of
*required* means the file must give it. `flows keys` prints these tables with the algorithms of
installed plugins added (`flows keys pipeline`, `scene`, `suite` or `task` for one kind).
"""


@dataclass(frozen=True)
class Row:
    """One key of one file kind."""

    key: str
    type: str
    default: str
    description: str


def _bounds(info: FieldInfo | None, extra: tuple[Any, ...] = ()) -> str:
    """The checks ``info`` (and annotation metadata ``extra``) add to its type: ``>= 0``,
    ``<= 1``, ``1-3 items``, ``pattern ...``."""
    found: list[str] = []
    items = [*(info.metadata if info else ()), *extra]
    items += [m for item in extra if isinstance(item, FieldInfo) for m in item.metadata]
    for item in items:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value:g}" if isinstance(value, float) else
                             f"{sign} {value}")
        if getattr(item, "min_length", None) is not None:
            found.append(f"at least {item.min_length}")
        if getattr(item, "max_length", None) is not None:
            found.append(f"at most {item.max_length}")
        if getattr(item, "pattern", None) is not None:
            found.append(f"pattern `{item.pattern}`")
    return ", ".join(found)


def type_name(annotation: Any) -> str:
    """A short reading of a field's type: ``int``, ``float | None``, ``'a' | 'b'``,
    ``list of float``, ``mapping of str to float``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        inner, bounds = type_name(args[0]), _bounds(None, args[1:])
        return f"{inner} ({bounds})" if bounds else inner
    if origin is Literal:
        return " \\| ".join(repr(a) if isinstance(a, str) else str(a) for a in args)
    if origin in (Union, types.UnionType):
        named = " \\| ".join(type_name(a) for a in args if a is not type(None))
        return f"{named}, or null" if type(None) in args else named
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"[{', '.join(_item(a) for a in args)}]"
        return f"list of {_item(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_item(args[0])} to {_item(args[1])}"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (keys below)"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _item(annotation: Any) -> str:
    """:func:`type_name` of a container's item, in parentheses when it is a choice."""
    name = type_name(annotation)
    return f"({name})" if get_origin(annotation) in (Union, types.UnionType) else name


def _default(info: FieldInfo) -> str:
    """The field's default as YAML would say it, or *required*."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "*required*"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(defaults below)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[]" if not value else "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return f"`{value}`" if isinstance(value, str) and value else str(value) or "''"


def _nested(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """Where a model sits in ``annotation``: ``("", M)`` for ``M`` or ``M | None``, ``("[]", M)``
    for a list of ``M``, ``(".<name>", M)`` for a mapping to ``M``; None when none does."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "", annotation
    if origin is typing.Annotated:
        return _nested(args[0])
    if origin in (Union, types.UnionType):
        found = [n for n in map(_nested, args) if n is not None]
        return found[0] if len(found) == 1 else None
    if origin in (tuple, list) and args:
        inner = _nested(args[0])
        return ("[]" + inner[0], inner[1]) if inner else None
    if origin is dict and len(args) == 2:
        inner = _nested(args[1])
        return (".<name>" + inner[0], inner[1]) if inner else None
    return None


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[Row]:
    """One row per key of ``model``, nested models' keys after their parent's, dotted."""
    hints = typing.get_type_hints(model, include_extras=True)
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        annotation = hints.get(name, info.annotation)
        bounds = _bounds(info)
        kind = type_name(info.annotation if info.metadata else annotation)
        description = _inline(info.description or "")
        yield Row(key, f"{kind} ({bounds})" if bounds else kind, _default(info), description)
        nested = _nested(annotation)
        if nested is not None:
            yield from rows(nested[1], f"{key}{nested[0]}.")
    if model.model_config.get("extra") == "allow":  # keys passed through to another's config
        yield Row(f"{prefix}<name>", "any", "", _inline(str(getattr(model, "EXTRA_KEYS", ""))))


def _inline(text: str) -> str:
    """``text`` on one line of a Markdown table: reST's double backquotes as Markdown's
    single ones, pipes escaped."""
    text = re.sub(r":[a-z]+:`~?", "`", " ".join(text.split()).replace("``", "`"))
    return text.replace("|", "\\|")


def table(title: str, intro: str, found: Iterator[Row]) -> str:
    """A Markdown section: ``## title``, ``intro`` and the table of ``found``."""
    lines = [f"## {title}", "", intro, "", "| key | type | default | meaning |",
             "|---|---|---|---|"]
    lines += [f"| `{r.key}` | {r.type} | {r.default} | {r.description} |" for r in found]
    return "\n".join(lines) + "\n"


def _train_sections(shipped_only: bool) -> list[str]:
    """One section per registered algorithm (only the shipped ones with ``shipped_only``)."""
    from stages.training.algorithms import ALGORITHMS, DEFAULT

    out = []
    for name in ALGORITHMS.names():
        spec = ALGORITHMS.get(name)
        shipped = spec.config.__module__.startswith("stages.")
        if shipped_only and not shipped:
            continue
        origin = "" if shipped else f" (plugin, `{spec.config.__module__}`)"
        default = " (the default when `algorithm` is not given)" if name == DEFAULT else ""
        intro = f"`train.algorithm: {name}`{default}{origin}: " + _inline(spec.config.__doc__ or "")
        out.append(table(f"Pipeline config: `train` with `{name}`", intro,
                         rows(spec.config, "train.")))
    return out


def reference(kinds: tuple[str, ...] = KINDS, *, shipped_only: bool = False) -> str:
    """The reference of ``kinds`` as one Markdown page (every algorithm registered, plugins'
    included, unless ``shipped_only``)."""
    from stages.pipeline.config import PipelineConfig
    from stages.sim.scenes.scene import SceneConfig
    from stages.sim.suites.suite import SuiteConfig
    from stages.sim.tasks.template_config import ReachTemplateConfig

    parts = [HEADER]
    if "pipeline" in kinds:
        top = (r for r in rows(PipelineConfig) if not r.key.startswith("train"))
        parts.append(table(
            "Pipeline config", "A file under `configs/` (`flows run`, `flows check`). "
            + _inline(PipelineConfig.__doc__ or "")
            + " Its `train` section follows, one table per training algorithm.", top))
        parts += _train_sections(shipped_only)
    if "scene" in kinds:
        parts.append(table("Scene file", "A file under `sim_scenes/` that a pipeline's "
                           "`collect.scene`, `train.scene` or a suite names. "
                           + _inline(SceneConfig.__doc__ or ""), rows(SceneConfig)))
    if "suite" in kinds:
        parts.append(table("Suite file", "What `validate.suite` names. "
                           + _inline(SuiteConfig.__doc__ or ""), rows(SuiteConfig)))
    if "task" in kinds:
        parts.append(table("Task file (`template: reach`)", "What a pipeline's `tasks` list "
                           "names (docs/extending.md). "
                           + _inline(ReachTemplateConfig.__doc__ or ""),
                           rows(ReachTemplateConfig)))
    return "\n".join(parts)

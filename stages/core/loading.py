"""Reading YAML and JSON files into frozen models, each error naming file, field and value.

Values are quoted only from the config being loaded, and never when they look like secrets
(:func:`~stages.core.redaction.shown`). A file that a config names (a scene, suite or task
file), read inside :func:`named_by`, that turns out not to be what was expected is described by
type and key names, never by its values: a credentials file named as a suite cannot leak into
terminals, logs and Prefect through an error message. Every read is capped
(:data:`MAX_YAML_BYTES`, :data:`MAX_JSON_BYTES`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from physai_core.errors import ConfigError, Problem, closest_name, printable
from stages.core.redaction import Withheld, scrub, secret_text, shown

M = TypeVar("M", bound=BaseModel)

MAX_YAML_BYTES = 8 * 2**20
"""Largest YAML file read (8 MiB); every config, scene and suite the project ships is under
100 KiB, and a larger file named by mistake is refused before it is read."""


_NAMED_BY: ContextVar[str | None] = ContextVar("physai_named_by", default=None)


@contextmanager
def named_by(config: str | Path) -> Iterator[None]:
    """Within this block, the files :func:`load_model` and :func:`read_yaml` read are files
    ``config`` names: one that turns out not to be what was expected is described by type and
    key names, never by its values."""
    token = _NAMED_BY.set(str(config))
    try:
        yield
    finally:
        _NAMED_BY.reset(token)


MAX_JSON_BYTES = 16 * 2**20
"""Largest JSON record read (16 MiB): an engine report, a dataset's ``info.json`` or
``metadata.json`` (each a few KiB)."""


def read_capped(path: Path, limit: int, field: str = "", where: Path | None = None) -> bytes:
    """The bytes of ``path``, read no further than ``limit``; a missing, unreadable or larger
    file is a :class:`ConfigError` naming ``where`` (default: the file) and ``field``."""
    where = path if where is None else where
    try:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError.one(where, field, str(path), "file not found") from None
    except OSError as exc:
        raise ConfigError.one(where, field, str(path),
                              f"cannot read it ({type(exc).__name__})") from None
    if len(data) > limit:
        raise ConfigError.one(where, field, Withheld(f"<more than {limit} bytes>"),
                              f"expected at most {limit / 2**20:g} MiB")
    return data


def read_json(path: Path, field: str = "", limit: int = MAX_JSON_BYTES,
              where: Path | None = None) -> Any:
    """The JSON document in ``path``, read through :func:`read_capped`; text that is not
    JSON, or nested past what Python parses, is a :class:`ConfigError` naming ``where``
    (default: the file) and ``field``."""
    where = path if where is None else where
    data = read_capped(path, limit, field, where)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError.one(where, field, Withheld("<text>"), f"not JSON: {reason}") from None


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file safely, turning a missing, oversized or unparsable file into a
    :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError.one(path, "", str(path), "file not found")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError.one(path, "", Withheld(f"<{size} bytes>"),
                              f"expected a YAML file of at most {MAX_YAML_BYTES // 2**20} MiB, "
                              f"found {size / 2**20:.1f} MiB")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ConfigError.one(path, "", Withheld("<text>"),
                              "YAML nested too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        if _NAMED_BY.get() is not None:
            raise ConfigError.one(path, where, Withheld("<text>"),
                                  f"expected YAML, found text that is not YAML (named by "
                                  f"{_NAMED_BY.get()})") from None
        raise ConfigError.one(path, where, "", f"invalid YAML: {exc}".splitlines()[0]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError.one(path, "", Withheld("<bytes>"),
                              f"not UTF-8 text: {exc.reason}") from None


def _is_union_tag(part: object) -> bool:
    """Tagged-union members are named ``<tag>`` in error locations; files never say them."""
    return isinstance(part, str) and part.startswith("<") and part.endswith(">")


def _type_of(value: object) -> Withheld:
    """``value`` by its type alone: ``<str>``, ``<int>``, ``<mapping>``, ``<list>``."""
    name = {dict: "mapping", list: "list", type(None): "null"}.get(type(value),
                                                                    type(value).__name__)
    return Withheld(f"<{name}>")


def _key_name(key: object) -> str:
    """A key of a named file as a message may show it: printable, at most 40 characters,
    ``<redacted>`` when it looks like a secret."""
    text = printable(str(key))
    if secret_text(text):
        return "<redacted>"
    return text if len(text) <= 40 else text[:37] + "..."


def _strings_in(data: object, limit: int = 100_000) -> list[str]:
    """Every string scalar in ``data`` (at most ``limit`` nodes visited)."""
    found: list[str] = []
    stack = [data]
    seen = 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


Sections = Mapping[tuple[str, ...], type[BaseModel]]
"""The model of a field whose annotation does not say it, by the field's path of names (the
train section's, which its ``algorithm`` chooses)."""


def field_names(model: type[BaseModel]) -> list[str]:
    """The names a file may give ``model``'s fields: each field's alias, else its name."""
    return [f.alias or name for name, f in model.model_fields.items()]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds directly: itself, or the members of a union or an
    ``Annotated`` type that are models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) is Annotated:
        return _models_in(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def _inner(annotation: Any) -> list[Any]:
    """What one item of a list, tuple or mapping annotation (or of any member of a union)
    is annotated as."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _inner(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return [inner for arg in get_args(annotation) for inner in _inner(arg)]
    if origin in (list, tuple, set, frozenset, dict, Sequence, Mapping):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        return args[-1:] if origin in (dict, Mapping) else args
    return []


def model_at(model: type[BaseModel], loc: tuple[Any, ...],
             sections: Sections | None = None) -> list[type[BaseModel]]:
    """The models whose field ``loc[-1]`` an error location names, following the fields,
    list items and mapping values of ``loc[:-1]`` down from ``model``; ``sections`` name the
    model of a field whose annotation does not (a union gives all its members that fit)."""
    found: list[Any] = [model]
    names: list[str] = []
    for part in loc[:-1]:
        if _is_union_tag(part):
            continue
        step: list[Any] = []
        for current in found:
            for m in _models_in(current):
                field = next((f for n, f in m.model_fields.items() if part in (n, f.alias)),
                             None)
                if field is not None:
                    step.append(field.annotation)
            if not _models_in(current):
                step += _inner(current)
        if isinstance(part, str):
            names.append(part)
            chosen = (sections or {}).get(tuple(names))
            if chosen is not None:
                step = [chosen]
        found = step
    return [m for current in found for m in _models_in(current)]


def closest_field(name: object, models: list[type[BaseModel]]) -> str | None:
    """The valid field name of ``models`` closest to ``name``
    (:func:`~physai_core.errors.closest_name`), if one is close."""
    return closest_name(str(name), {n for m in models for n in field_names(m)})


def problems_from(exc: ValidationError, file: str | Path, prefix: str = "",
                  *, withhold: object = None, model: type[BaseModel] | None = None,
                  sections: Sections | None = None) -> list[Problem]:
    """Translate a pydantic validation error into problems naming file, dotted field and value.

    Values are shown as :func:`shown` allows; with ``withhold`` (the data of a named file that
    is not what was expected), every value is shown by its type and every string of
    ``withhold`` is left out of the messages. With the ``model`` validated (and the
    ``sections`` its annotations leave open), an unknown field is answered with the closest
    valid name, as an unknown task is.
    """
    out = []
    strings = _strings_in(withhold) if withhold is not None else []
    for err in exc.errors():
        field = ".".join(_key_name(p) if withhold is not None else str(p)
                         for p in err["loc"] if not _is_union_tag(p))
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        if err["type"] == "extra_forbidden" and model is not None and err["loc"]:
            close = closest_field(err["loc"][-1], model_at(model, err["loc"], sections))
            message += f"; did you mean {close!r}?" if close else ""
        if withhold is not None:
            out.append(Problem(str(file), field, _type_of(err.get("input")),
                               scrub(message, strings)))
        else:
            out.append(shown(Problem(str(file), field, err.get("input"), message)))
    return out


def parse_model(cls: type[M], data: Any, file: str | Path, prefix: str = "",
                sections: Sections | None = None) -> M:
    """Validate ``data`` into ``cls``, raising one :class:`ConfigError` listing every problem
    (an unknown field with the closest valid name; ``sections``: see :func:`model_at`)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        # Said by type, never quoted: a path that names the wrong file (/etc/passwd as a scene)
        # must not copy that file's contents into terminals, logs and Prefect.
        raise ConfigError.one(file, prefix, _type_of(data),
                              f"expected a mapping for {cls.__name__}, found a "
                              f"{_type_of(data).text.strip('<>')}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from(exc, file, prefix, model=cls,
                                        sections=sections)) from None


def _kind(cls: type[BaseModel]) -> str:
    """What a model's file is, in words: ``SuiteConfig`` -> ``suite``."""
    name = cls.__name__.removesuffix("Config")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower() or name


def _recognized(cls: type[BaseModel], data: dict[Any, Any]) -> bool:
    """Whether ``data`` has the shape of a ``cls`` file: every key one of its fields, and
    every required field present."""
    names = {n for n, f in cls.model_fields.items()} | {
        f.alias for f in cls.model_fields.values() if f.alias}
    required = {f.alias or n for n, f in cls.model_fields.items() if f.is_required()}
    keys = set(data)
    return keys <= names and required <= keys


def parse_named(cls: type[M], data: Any, file: str | Path, referrer: str) -> M:
    """Validate the data of a file that the config ``referrer`` names into ``cls``.

    A file with the shape of a ``cls`` file (:func:`_recognized`) is reported as
    :func:`parse_model` reports it; one without is said by type and key names only: what was
    expected, what was found, and which field is wrong, never a value.
    """
    if data is None:
        data = {}
    kind = _kind(cls)
    fields = ", ".join(f.alias or n for n, f in cls.model_fields.items() if f.is_required())
    if not isinstance(data, dict):
        found = _type_of(data)
        raise ConfigError.one(file, "", found, f"expected a {kind} file (a mapping with "
                              f"{fields}), found a {found.text.strip('<>')} (named by "
                              f"{referrer})")
    if _recognized(cls, data):
        return parse_model(cls, data, file)
    names = {f.alias or n for n, f in cls.model_fields.items()} | set(cls.model_fields)
    if not set(data) & names:
        keys = sorted(_key_name(k) for k in data)
        listed = ", ".join(keys[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")
        raise ConfigError.one(file, "", _type_of(data),
                              f"expected a {kind} file (a mapping with {fields}), found a "
                              f"mapping with keys {listed or '(none)'} (named by {referrer})")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from(exc, file, withhold=data, model=cls)) from None


def load_model(cls: type[M], path: str | Path) -> M:
    """Read a YAML file into a frozen model; every problem is reported with file and field.

    Inside :func:`named_by`, the file is one a config names, checked by :func:`parse_named`.
    """
    data = read_yaml(path)
    referrer = _NAMED_BY.get()
    if referrer is None:
        return parse_model(cls, data, path)
    return parse_named(cls, data, path, referrer)

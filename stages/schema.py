"""Frozen pydantic base model and YAML loading that names file, field and value on error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from stages.errors import ConfigError, Problem

M = TypeVar("M", bound=BaseModel)


class FrozenModel(BaseModel):
    """Immutable model that rejects unknown fields, the base of every config and artifact."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file safely, turning a missing or unparsable file into a :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError.one(path, "", str(path), "file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ConfigError.one(path, where, "", f"invalid YAML: {exc}".splitlines()[0]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError.one(path, "", "", f"not UTF-8 text: {exc.reason}") from None


def _is_union_tag(part: object) -> bool:
    """Tagged-union members are named ``<tag>`` in error locations; files never say them."""
    return isinstance(part, str) and part.startswith("<") and part.endswith(">")


def problems_from(exc: ValidationError, file: str | Path, prefix: str = "") -> list[Problem]:
    """Translate a pydantic validation error into problems naming file, dotted field and value."""
    out = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p))
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        out.append(Problem(str(file), field, err.get("input"), message))
    return out


def parse_model(cls: type[M], data: Any, file: str | Path, prefix: str = "") -> M:
    """Validate ``data`` into ``cls``, raising one :class:`ConfigError` listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        # Said by type, never quoted: a path that names the wrong file (/etc/passwd as a scene)
        # must not copy that file's contents into terminals, logs and Prefect.
        raise ConfigError.one(file, prefix, f"<{type(data).__name__}>",
                              f"expected a mapping for {cls.__name__}, found a "
                              f"{type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from(exc, file, prefix)) from None


def load_model(cls: type[M], path: str | Path) -> M:
    """Read a YAML file into a frozen model; every problem is reported with file and field."""
    return parse_model(cls, read_yaml(path), path)

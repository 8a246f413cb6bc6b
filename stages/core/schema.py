"""Frozen pydantic base model and YAML loading that names file, field and value on error.

Values are quoted only from the config being loaded, and never when they look like secrets
(:func:`shown`). A file that a config names (a scene, suite or task file), read inside
:func:`named_by`, that turns out not to be what was expected is described by type and key
names, never by its values: a credentials file named as a suite cannot leak into terminals,
logs and Prefect through an error message.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import json
import linecache
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from physai_core.errors import ConfigError, Problem, closest_name, printable

M = TypeVar("M", bound=BaseModel)

MAX_YAML_BYTES = 8 * 2**20
"""Largest YAML file read (8 MiB); every config, scene and suite the project ships is under
100 KiB, and a larger file named by mistake is refused before it is read."""


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


class Withheld:
    """A value left out of a message, shown as a placeholder: ``<redacted>``, ``<str>``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Withheld) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


REDACTED = Withheld("<redacted>")
"""What a secret-shaped value is shown as."""

_SECRET_WORDS = ("secret", "password", "passwd", "passphrase", "token", "credential",
                 "apikey", "private", "cookie", "signature")
_SECRET_PARTS = frozenset({"key", "pwd", "pass", "auth", "authorization", "session", "sig"})
_SECRET_VALUE = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@"  # a URL with a password
    r"|\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA)[A-Z0-9]{16}\b"  # AWS key id
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|xox[abposr]-[\w-]{10,}"
    r"|sk-[\w-]{20,}|hf_[A-Za-z0-9]{20,}|nvapi-[\w-]{20,}|AIza[\w-]{35})"
    r"|\beyJ[\w-]{5,}\.eyJ[\w-]{5,}\.[\w-]+"  # a JSON web token
    r"|(?i:\bbearer\s+\S{8,})"
)
_OPAQUE = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
"""A run of 32 or more key-like characters: an opaque credential when it mixes upper and
lower case letters and digits (a hex digest does not)."""


def secret_name(name: str) -> bool:
    """Whether a field or key ``name`` holds secrets by its name (``api_key``, ``password``,
    ``aws_secret_access_key``, ``authToken``); ``obs_keys`` and ``make_kwargs`` do not."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    parts = set(re.split(r"[_\-.\s]+", words))
    return any(w in words.replace("_", "") for w in _SECRET_WORDS) or bool(parts & _SECRET_PARTS)


def secret_text(text: str) -> bool:
    """Whether ``text`` looks like a credential or holds one: a URL with a password, an AWS
    access key id, a private key, a well-known token format, or an opaque 32-character run
    mixing upper and lower case letters and digits."""
    if _SECRET_VALUE.search(text):
        return True
    return any(re.search(r"[a-z]", m) and re.search(r"[A-Z]", m) and re.search(r"[0-9]", m)
               for m in _OPAQUE.findall(text))


def known_credential(text: str) -> bool:
    """Whether ``text`` holds a credential of a recognisable form: a URL with a password, an
    AWS access key id, a private key, a well-known token format, a JSON web token or a bearer
    header (:func:`secret_text` less its guess at opaque runs, which paths can match)."""
    return bool(_SECRET_VALUE.search(text))


_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
"""A URL inside free text: up to the first space or quote."""


def _clean_url(url: str, mark: str | None) -> str:
    """``url`` with its user information and every query parameter named like a secret
    (:func:`secret_name`: ``token``, ``api_key``, ``X-Amz-Signature``) replaced by ``mark``, or
    removed where ``mark`` is None.

    Removed, the user information is what precedes an ``@`` before the first ``/`` (RFC 3986:
    what is left is the URL the same server answers). Marked, it runs to the last ``@`` before
    the query, so a password with a bare ``/`` in it is hidden whole; a URL without authority
    (``file:///home/a@b``) has none either way.
    """
    scheme, _, rest = url.partition("://")
    stop = "/?#" if mark is None else "?#"
    end = min((i for i in (rest.find(c) for c in stop) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    if at >= 0 and not rest.startswith("/"):
        rest = rest[at + 1:] if mark is None else f"{mark}@{rest[at + 1:]}"
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    path, question, query = tail.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        kept = []
        for param in re.split(r"[&;]", query):
            name = param.partition("=")[0]
            if not secret_name(name):
                kept.append(param)
            elif mark is not None:
                kept.append(f"{name}={mark}")
        path += ("?" + "&".join(kept) if kept else "") + hash_ + fragment
    return f"{scheme}://{authority}{path}"


def strip_url_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it removed: ``scheme://user:pass@host``
    becomes ``scheme://host`` and secret-named query parameters (``?token=...``) go; what is
    left locates a server without granting access to it."""
    return _URL.sub(lambda m: _clean_url(m.group(0), None), text)


_LINE_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\n]*@")
"""``scheme://`` up to the last ``@`` before the next ``/`` on its line, whatever lies between:
user information holding a space or a quote, which :data:`_URL` stops at."""
_SETTING_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)(?:[^:/@]*:.*|[^/]*)@", re.S)
"""In one setting's value: ``scheme://`` up to an ``@`` a client may read as the end of a
password: the last one before the first ``/`` (RFC 3986), or after ``user:`` the last one of
all (SQLAlchemy reads ``postgresql://u:p s/x@h/db`` as the password ``p s/x``)."""


def redact_urls(text: str) -> str:
    """``text`` (an error message) with the credentials of every URL in it shown as
    ``<redacted>``: ``scheme://<redacted>@host``, ``?token=<redacted>``; unchanged when no URL
    in it may hold any.

    A password may hold a space or a quote (``postgresql://u:pa ss@h/db``, which SQLAlchemy
    accepts), so an ``@`` after ``scheme://`` and before the next ``/`` on the same line ends
    user information whatever lies between. A line where a URL without a path is followed by
    an ``@`` with no ``/`` between (``http://h:9 down; ask ops@corp``) loses the words between
    to ``<redacted>``: a line may hide too much, never a password.
    """
    text = _URL.sub(lambda m: _clean_url(m.group(0), "<redacted>"), text)
    return _LINE_USERINFO.sub(lambda m: f"{m.group(1)}<redacted>@", text)


def redact_setting(value: str) -> str:
    """``value``, one setting read whole as an address (not free text), with whatever a
    client may read as a URL's user or password shown as ``<redacted>``: what
    :func:`redact_urls` hides, and from ``scheme://`` to the last ``@`` before the first ``/``
    or, after a ``user:``, to the last ``@`` of all, slashes included (SQLAlchemy's reading).
    ``file:///home/a@b`` has no user information and stays as it is."""
    return _SETTING_USERINFO.sub(lambda m: f"{m.group(1)}<redacted>@", redact_urls(value))


def _secrets_in(value: object, depth: int = 0) -> Iterator[str]:
    """The secret-shaped strings inside ``value`` (looking 4 levels and 16 items deep)."""
    if isinstance(value, str):
        if secret_text(value):
            yield value
    elif depth < 4 and isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            if i >= 16:
                break
            if secret_name(str(key)) and isinstance(item, str):
                yield item
            else:
                yield from _secrets_in(item, depth + 1)
    elif depth < 4 and isinstance(value, list | tuple):
        for item in list(value)[:16]:
            yield from _secrets_in(item, depth + 1)


def _redacted(value: object, depth: int = 0) -> object:
    """``value`` with every secret-shaped string (and everything under a secret-named key)
    replaced by :data:`REDACTED`; containers are copied to their first 9 items, which is all
    an error message shows."""
    if isinstance(value, str):
        return REDACTED if secret_text(value) else value
    if depth >= 4:
        return value
    if isinstance(value, dict):
        items = list(value.items())[:9]
        return {(REDACTED if isinstance(k, str) and secret_text(k) else k):
                (REDACTED if secret_name(str(k)) else _redacted(v, depth + 1)) for k, v in items}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v, depth + 1) for v in list(value)[:9])
    return value


def _scrub(message: str, texts: Iterable[str], pieces: bool = False) -> str:
    """``message`` with each of ``texts`` (quoted, or bare when 4 characters or longer)
    replaced by ``<redacted>``; with ``pieces``, also every part of 6 or more characters
    between a text's ``/``, ``:`` and ``@`` (a path made from a secret URL keeps its parts,
    not its slashes)."""
    words = set(texts)
    if pieces:
        words |= {p for text in list(words) for p in re.split(r"[/:@\s]+", text) if len(p) >= 6}
    for text in sorted(words, key=len, reverse=True):
        if not text:
            continue
        message = message.replace(repr(text), "<redacted>")
        if len(text) >= 4:
            message = message.replace(text, "<redacted>")
    return message


def shown(problem: Problem) -> Problem:
    """``problem`` as it may be shown: a value that is secret-shaped, or held by a field named
    like a secret, becomes ``<redacted>``, in the value and in the message."""
    last = next((p for p in reversed(problem.field.split(".")) if not p.isdigit()), "")
    secrets = list(_secrets_in(problem.value))
    if last and secret_name(last) and problem.value is not None:
        value: object = REDACTED
        if isinstance(problem.value, str | int | float):
            secrets.append(str(problem.value))
    else:
        value = _redacted(problem.value)
    if not secrets and value is problem.value:
        return problem
    return Problem(problem.file, problem.field, value,
                   _scrub(problem.message, secrets, pieces=True))


def shown_all(problems: Iterable[Problem]) -> list[Problem]:
    """:func:`shown` of every problem."""
    return [shown(p) for p in problems]


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
                               _scrub(message, strings)))
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

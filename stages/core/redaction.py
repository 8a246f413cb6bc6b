"""What a message may show of a value: secrets recognised and withheld, URL credentials removed.

A value is withheld when it looks like a credential (:func:`secret_text`) or is held under a
name that says it is one (:func:`secret_name`), and shown as ``<redacted>`` (:data:`REDACTED`);
:func:`shown` applies both to a :class:`~physai_core.errors.Problem`, its value and its message.
A URL inside free text keeps its host and path but not its user information or secret-named
query parameters (:func:`redact_urls`, :func:`strip_url_credentials`); one setting read whole
as an address hides whatever a client may read as a password (:func:`redact_setting`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from physai_core.errors import Problem


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


def scrub(message: str, texts: Iterable[str], pieces: bool = False) -> str:
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
                   scrub(problem.message, secrets, pieces=True))


def shown_all(problems: Iterable[Problem]) -> list[Problem]:
    """:func:`shown` of every problem."""
    return [shown(p) for p in problems]

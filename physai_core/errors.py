"""The one error hierarchy of physai-flows: stages, flows and edge errors all derive from
:class:`PhysaiError` (the edge package's :class:`edge.errors.EdgeError` included); only the
on-robot runtime, which ships alone, keeps its own (:class:`edge.runtime.RuntimeRefusal`).
The root lives here, in the foundation package every other one imports (edge included, which
imports nothing of stages or flows).

Bad input (configs, scenes, datasets, bundles) raises :class:`ConfigError`, which the CLI turns
into a one-line message and exit status 2. Transient faults raise :class:`TransientError`, the
only kind that is retried.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ArtifactNotFoundError", "BackendUnavailableError", "ConfigError", "DuplicateNameError",
    "IntegrityError", "PhysaiError", "Problem", "TransientError", "UnknownNameError",
    "closest_name", "one_line", "printable",
]


class PhysaiError(Exception):
    """Base of every error physai-flows raises on purpose."""

    exit_code: int = 1


def printable(text: str) -> str:
    """``text`` on one line: line breaks and other control characters escaped as in a repr."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(exc: BaseException) -> str:
    """First line of an exception's message, or its type name when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _short_repr() -> reprlib.Repr:
    """A repr that stops early, so a huge value (a YAML alias bomb) costs no more than a small
    one."""
    short = reprlib.Repr()
    short.maxlevel = 3
    short.maxtuple = short.maxlist = short.maxdict = short.maxset = 8
    short.maxstring = short.maxlong = short.maxother = 80
    return short


_SHORT = _short_repr()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is, which field, what value, and why."""

    file: str
    field: str
    value: object
    message: str

    def __str__(self) -> str:
        value = _SHORT.repr(self.value)
        if len(value) > 80:
            value = value[:77] + "..."
        where = f"{self.file}: {self.field}" if self.field else self.file
        return printable(f"{where}: {self.message} (value: {value})")


class ConfigError(PhysaiError):
    """Malformed user input. Carries every problem found, rendered on one line."""

    exit_code = 2

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    @classmethod
    def one(cls, file: str | Path, field: str, value: object, message: str) -> ConfigError:
        """Build an error holding a single problem."""
        return cls([Problem(str(file), field, value, message)])


def closest_name(name: str, valid: Iterable[str]) -> str | None:
    """The one of ``valid`` closest to ``name`` (difflib's ratio of at least 0.6), if any:
    what an unknown task, algorithm or config field is answered with."""
    close = difflib.get_close_matches(name, sorted(valid), n=1)
    return close[0] if close else None


class UnknownNameError(PhysaiError, KeyError):
    """A name that no registry knows; the message lists the valid names and the closest one."""

    exit_code = 2

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        names = sorted(valid)
        close = closest_name(name, names)
        hint = f"; did you mean {close!r}?" if close else ""
        self.message = f"unknown {kind} {name!r}; valid: {', '.join(names) or '(none)'}{hint}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class DuplicateNameError(PhysaiError):
    """A second registration under a name that is already taken."""


class IntegrityError(PhysaiError):
    """Stored bytes whose digest does not match the one recorded for them."""


class ArtifactNotFoundError(PhysaiError):
    """An artifact digest or URI that the store does not hold."""


class BackendUnavailableError(PhysaiError):
    """An optional backend whose extra is not installed."""

    def __init__(self, backend: str, extra: str, cause: BaseException | None = None, *,
                 environment: str | None = None) -> None:
        detail = f" ({cause})" if cause else ""
        if environment is not None:
            how = (f"it runs in the stage environment {environment!r}: build it with "
                   f"`make {environment}`, and name it in the stage's `environment:` or a "
                   "suite's `backend:`")
        else:
            how = f"install it with: pip install 'physai-flows[{extra}]'"
        super().__init__(f"backend {backend!r} is not installed{detail}; {how}")


class TransientError(PhysaiError):
    """A fault that may go away by itself (S3 5xx, MLflow unreachable); safe to retry."""

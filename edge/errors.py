"""The root of physai-flows' one error hierarchy, :class:`PhysaiError`, and the errors of the
edge package, each carrying the process exit status it maps to.

The root lives here, in the lowest layer, because edge imports nothing of stages or flows:
:mod:`stages.errors` builds the rest of the hierarchy on it (and names it too). Only the
on-robot runtime, which ships alone, keeps its own (:class:`edge.runtime.RuntimeRefusal`).
"""

from __future__ import annotations

__all__ = ["BundleError", "EdgeError", "PhysaiError", "TargetError", "one_line", "printable"]


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


class EdgeError(PhysaiError):
    """A failure while exporting, checking, measuring or packaging a policy for a robot."""

    exit_code: int = 1


class TargetError(EdgeError):
    """An edge target name, ONNX opset or precision that the registry or the target refuses."""

    exit_code = 2


class BundleError(EdgeError):
    """A malformed or tampered bundle; the message names the bundle file and the member."""

    exit_code = 2

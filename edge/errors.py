"""Errors raised by the edge package, each carrying the process exit status it maps to."""

from __future__ import annotations


class EdgeError(Exception):
    """A failure while exporting, checking, measuring or packaging a policy for a robot."""

    exit_code: int = 1


class TargetError(EdgeError):
    """An edge target name, ONNX opset or precision that the registry or the target refuses."""

    exit_code = 2


class BundleError(EdgeError):
    """A malformed or tampered bundle; the message names the bundle file and the member."""

    exit_code = 2


def one_line(exc: BaseException) -> str:
    """First line of an exception's message, or its type name when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def printable(text: str) -> str:
    """``text`` on one line: line breaks and other control characters escaped as in a repr."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

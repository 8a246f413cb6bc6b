"""Errors raised by the edge package, each carrying the process exit status it maps to; all
are :class:`stages.errors.PhysaiError` (the shipped runtime keeps its own, standalone)."""

from __future__ import annotations

from stages.errors import PhysaiError, one_line, printable

__all__ = ["BundleError", "EdgeError", "TargetError", "one_line", "printable"]


class EdgeError(PhysaiError):
    """A failure while exporting, checking, measuring or packaging a policy for a robot."""

    exit_code: int = 1


class TargetError(EdgeError):
    """An edge target name, ONNX opset or precision that the registry or the target refuses."""

    exit_code = 2


class BundleError(EdgeError):
    """A malformed or tampered bundle; the message names the bundle file and the member."""

    exit_code = 2

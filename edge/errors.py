"""The errors of the edge package, each carrying the process exit status it maps to, on the
one root every package shares (:class:`physai_core.errors.PhysaiError`). Only the on-robot
runtime, which ships alone, keeps its own (:class:`edge.runtime.RuntimeRefusal`).
"""

from __future__ import annotations

from physai_core.errors import PhysaiError

__all__ = ["BundleError", "EdgeError", "TargetError"]


class EdgeError(PhysaiError):
    """A failure while exporting, checking, measuring or packaging a policy for a robot."""

    exit_code: int = 1


class TargetError(EdgeError):
    """An edge target name, ONNX opset or precision that the registry or the target refuses."""

    exit_code = 2


class BundleError(EdgeError):
    """A malformed or tampered bundle; the message names the bundle file and the member."""

    exit_code = 2

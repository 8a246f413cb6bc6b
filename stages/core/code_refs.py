"""References to Python code, ``python:PACKAGE.MODULE:CALLABLE``, by their form only: what a
config field may name before anything is imported (:mod:`stages.policies.python_code` imports
and runs them)."""

from __future__ import annotations

import re

PREFIX = "python:"
"""What a reference to Python code starts with."""

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
REF_PATTERN = re.compile(rf"python:({_DOTTED}):({_DOTTED})")
"""A reference's form: the module's dotted name, then the attribute's."""

REF_HELP = "python:PACKAGE.MODULE:CALLABLE (a class or factory of controllers, or a controller)"


def is_python_ref(ref: str) -> bool:
    """Whether ``ref`` names Python code (``python:...``)."""
    return ref.startswith(PREFIX)


def ref_problem(ref: str) -> str | None:
    """What is wrong with the form of ``ref`` (None: nothing); nothing is imported."""
    if REF_PATTERN.fullmatch(ref) is None:
        return f"is not {REF_HELP}"
    return None


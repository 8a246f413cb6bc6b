"""Action units: the task's normalized convention, and the native units of its environment.

Every policy this project trains, stores, validates and packages acts in its task's
*normalized* convention: each action entry lies in -1..1, and the task states what that means
in the units of the environment it wraps, entry by entry, as an affine map from -1..1 onto
``low..high`` (:class:`ActionRange`; for a ``gymnasium:`` task, the action Box's bounds). A task
whose environment takes the normalized actions themselves (this project's own tasks, whose
action entries the task scales into joint targets; Isaac Lab's, whose action terms scale what
they are given) states no range: there native and normalized coincide.

Data and policies from elsewhere say which of the two they act in (:data:`ActionUnits`):
``native``, the environment's own units (a Gymnasium recording of InvertedPendulum-v5 holds
forces in -3..3 N), or ``normalized``. An import converts native actions to the task's
convention and records that it did (docs/datasets.md, docs/policies.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

ActionUnits = Literal["native", "normalized"]
"""The units actions are in: the environment's own (``native``) or the task's convention
(``normalized``, -1..1 per entry)."""

UNITS: tuple[str, ...] = get_args(ActionUnits)
"""Every value of :data:`ActionUnits`, as the command line and configs spell them."""

UNITS_HELP = (
    "the units its actions are in: native (the environment's own, e.g. newtons for "
    "gymnasium:InvertedPendulum-v5) or normalized (-1..1, the task's convention)"
)
"""What ``action_units`` means, for config field descriptions and ``--help``."""


@dataclass(frozen=True)
class ActionRange:
    """An environment's native action range: the normalized action -1 is ``low``, 1 is
    ``high``, and values between map linearly, entry by entry (values beyond map beyond)."""

    low: tuple[float, ...]
    """Native value of each entry at the normalized action -1. Length: act_dim."""
    high: tuple[float, ...]
    """Native value of each entry at the normalized action 1. Length: act_dim."""

    def __post_init__(self) -> None:
        """Reject bounds of different lengths, non-finite ones, or a low above its high."""
        if len(self.low) != len(self.high) or not self.low:
            raise ValueError(f"action range needs as many lows as highs (at least one), got "
                             f"{len(self.low)} and {len(self.high)}")
        if not all(math.isfinite(v) for v in (*self.low, *self.high)):
            raise ValueError("action range bounds must be finite")
        if any(lo > hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError(f"action range low {self.low} exceeds high {self.high}")

    @classmethod
    def of(cls, low: Sequence[float] | np.ndarray, high: Sequence[float] | np.ndarray
           ) -> ActionRange:
        """The range from two arrays (any shape, flattened), as floats."""
        return cls(tuple(float(v) for v in np.asarray(low, np.float64).reshape(-1)),
                   tuple(float(v) for v in np.asarray(high, np.float64).reshape(-1)))

    @classmethod
    def identity(cls, act_dim: int) -> ActionRange:
        """The range of an environment that takes normalized actions: -1..1 per entry."""
        return cls((-1.0,) * act_dim, (1.0,) * act_dim)

    @property
    def act_dim(self) -> int:
        """Number of action entries."""
        return len(self.low)

    @property
    def is_identity(self) -> bool:
        """Whether native and normalized actions coincide (every entry's range is -1..1)."""
        return all(lo == -1.0 for lo in self.low) and all(hi == 1.0 for hi in self.high)

    @property
    def mid(self) -> np.ndarray:
        """Native value of the normalized action 0. Shape: (act_dim,), float64."""
        return np.asarray(self.low) + self.half_span

    @property
    def half_span(self) -> np.ndarray:
        """Native change per unit of normalized action. Shape: (act_dim,), float64."""
        return 0.5 * (np.asarray(self.high) - np.asarray(self.low))

    @property
    def inverse_half_span(self) -> np.ndarray:
        """Normalized change per native unit; 0 for an entry whose range is one value (it
        has nothing to choose). Shape: (act_dim,), float64."""
        half = self.half_span
        return np.divide(1.0, half, out=np.zeros_like(half), where=half > 0)

    def to_native(self, actions: np.ndarray) -> np.ndarray:
        """Normalized actions in native units. Shape: (..., act_dim) -> same, float64."""
        return self.mid + self.half_span * np.asarray(actions, np.float64)

    def to_normalized(self, actions: np.ndarray) -> np.ndarray:
        """Native actions in the normalized convention (not clipped). Shape: (..., act_dim)
        -> same, float32, computed as ``(a - mid) * (1 / half_span)`` in float32, the same
        arithmetic a wrapped ONNX policy does."""
        a = np.asarray(actions, np.float32)
        return (a - self.mid.astype(np.float32)) * self.inverse_half_span.astype(np.float32)

    def describe(self) -> str:
        """The range in one short phrase, e.g. ``-1..1 maps to -3..3``."""
        pairs = sorted({(lo, hi) for lo, hi in zip(self.low, self.high, strict=True)})
        shown = ", ".join(f"{lo:g}..{hi:g}" for lo, hi in pairs[:4])
        more = f" (and {len(pairs) - 4} more)" if len(pairs) > 4 else ""
        return f"-1..1 maps to {shown}{more}"

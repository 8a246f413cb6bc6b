"""``stages.units``: the promised path of :mod:`stages.core.units`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.core.units`. Nothing inside the project imports this module.
"""

from __future__ import annotations

from stages.core.units import (
    UNITS as UNITS,
)
from stages.core.units import (
    UNITS_HELP as UNITS_HELP,
)
from stages.core.units import (
    ActionRange as ActionRange,
)
from stages.core.units import (
    ActionUnits as ActionUnits,
)

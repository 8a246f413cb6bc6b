"""``stages.environments``: the promised path of :mod:`stages.core.environments`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.core.environments`. Nothing inside the project imports this
module.
"""

from __future__ import annotations

from stages.core.environments import (
    ENVIRONMENTS as ENVIRONMENTS,
)
from stages.core.environments import (
    INSIDE_ENV as INSIDE_ENV,
)
from stages.core.environments import (
    ROOT as ROOT,
)
from stages.core.environments import (
    EnvironmentMissingError as EnvironmentMissingError,
)
from stages.core.environments import (
    StageEnvironment as StageEnvironment,
)
from stages.core.environments import (
    get_environment as get_environment,
)
from stages.core.environments import (
    register_environment as register_environment,
)
from stages.core.environments import (
    require_python as require_python,
)
from stages.core.environments import (
    runs_here as runs_here,
)

"""``stages.algorithms``: the promised path of :mod:`stages.training.algorithms`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.training.algorithms`. Nothing inside the project imports
this module.
"""

from __future__ import annotations

from stages.training.algorithms import (
    ALGORITHMS as ALGORITHMS,
)
from stages.training.algorithms import (
    DEFAULT as DEFAULT,
)
from stages.training.algorithms import (
    AlgorithmSpec as AlgorithmSpec,
)
from stages.training.algorithms import (
    algorithm_names as algorithm_names,
)
from stages.training.algorithms import (
    get_algorithm as get_algorithm,
)
from stages.training.algorithms import (
    register_algorithm as register_algorithm,
)

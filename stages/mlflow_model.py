"""``stages.mlflow_model``: the promised path of :mod:`stages.tracking.mlflow_model`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.tracking.mlflow_model`. Nothing inside the project imports
this module.
"""

from __future__ import annotations

from stages.tracking.mlflow_model import (
    BUNDLE_FILE as BUNDLE_FILE,
)
from stages.tracking.mlflow_model import (
    DESCRIPTION_LIMIT as DESCRIPTION_LIMIT,
)
from stages.tracking.mlflow_model import (
    EXAMPLE_ROWS as EXAMPLE_ROWS,
)
from stages.tracking.mlflow_model import (
    PolicyModel as PolicyModel,
)
from stages.tracking.mlflow_model import (
    gate_table as gate_table,
)
from stages.tracking.mlflow_model import (
    input_example as input_example,
)
from stages.tracking.mlflow_model import (
    log_onnx_model as log_onnx_model,
)
from stages.tracking.mlflow_model import (
    policy_model as policy_model,
)
from stages.tracking.mlflow_model import (
    scene_metrics as scene_metrics,
)
from stages.tracking.mlflow_model import (
    signature as signature,
)

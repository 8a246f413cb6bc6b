"""The ``polygraphy run`` comparison of an engine build, for a person to repeat by hand: the
command comparing TensorRT with ONNX Runtime at the plan's tolerance, and the input-data file
it loads. The on-target builder (:mod:`edge.engine`) runs the same comparison through
Polygraphy's Python API; this module stays with the packager, where the command is shown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge.engine import (
    CALIBRATION_BATCH,
    BuildPlan,
    Inputs,
    calibration_batches,
    precision_flags,
    profile_shapes,
)

__all__ = ["polygraphy_command", "save_polygraphy_inputs"]


def polygraphy_command(plan: BuildPlan, inputs_json: Path) -> list[str]:
    """The ``polygraphy run`` command comparing TensorRT with ONNX Runtime on ``inputs_json``
    (written by :func:`save_polygraphy_inputs`) at the plan's tolerance."""
    low, opt, high = profile_shapes(plan, ",", "{n}:[{d}]")
    cmd = [
        "polygraphy", "run", str(plan.onnx), "--trt", "--onnxrt",
        "--trt-min-shapes", *low, "--trt-opt-shapes", *opt, "--trt-max-shapes", *high,
        "--load-inputs", str(inputs_json),
        "--atol", f"{plan.tolerance:g}", "--rtol", "0", "--check-error-stat", "max",
        *precision_flags(plan.precision),
    ]
    if plan.precision == "int8":
        cmd += ["--calibration-cache", str(plan.calibration_cache)]
    return cmd


def save_polygraphy_inputs(obs: np.ndarray | Inputs, path: Path,
                           batch: int = CALIBRATION_BATCH) -> Path:
    """Write ``obs`` (the state alone, or every input by name) as Polygraphy's input-data JSON
    (a list of feed dicts) for :func:`polygraphy_command`."""
    from polygraphy.json import save_json

    save_json(list(calibration_batches(obs, batch)), str(path))
    return path

"""Wall time of the Prefect-orchestrated pipeline against the same stages called directly.

The two are compared on equal schedules: the direct run validates its scenes one after
another, so the orchestrated run that ``ratio`` compares it with runs on a one-worker task
runner (scenes one after another too). The orchestrated run on its default thread pool (scenes
in parallel, as ``flows run`` runs them) is reported beside it as ``prefect_parallel_s`` and
``ratio_parallel``: that ratio measures the schedule as well as the overhead.

All variants run in this process on the same config with cold caches: each gets an empty state
folder (new store, new MLflow database) and the orchestrated one recomputes every stage
(``refresh``). One untimed direct run first pays the one-time costs both share (imports, font
caches). Prefect's temporary API server is started once beforehand, as a team's Prefect server
is already running; its start-up time is measured and reported separately, and
``ratio_with_server_start`` charges it to the orchestrated run. Prints one JSON line.

    python benchmarks/pipeline_overhead.py [--config configs/reach.yaml] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    """Warm up, start Prefect, then time direct and orchestrated runs; print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "reach.yaml")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    config = str(args.config.resolve())

    with tempfile.TemporaryDirectory(prefix="physai-bench-") as tmp:
        os.environ["PHYSAI_HOME"] = f"{tmp}/warmup"
        for var in ("MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL", "PHYSAI_STORE"):
            os.environ.pop(var, None)
        from stages.core.settings import apply_embedded_environment, resolve_settings

        apply_embedded_environment(resolve_settings())
        from prefect import flow
        from prefect.task_runners import ThreadPoolTaskRunner

        from flows.pipeline import pipeline_flow
        from stages.orchestration.context import NullProgress
        from stages.pipeline.config import load_pipeline
        from stages.pipeline.run import run_direct

        run_direct(load_pipeline(config), NullProgress())
        server_start = timed(flow(name="warmup")(lambda: None))
        sequential = pipeline_flow.with_options(
            task_runner=ThreadPoolTaskRunner(max_workers=1))  # type: ignore[arg-type]
        direct: list[float] = []
        orchestrated: list[float] = []
        parallel: list[float] = []
        for i in range(args.repeat):
            os.environ["PHYSAI_HOME"] = f"{tmp}/direct-{i}"
            direct.append(timed(lambda: run_direct(load_pipeline(config), NullProgress())))
            os.environ["PHYSAI_HOME"] = f"{tmp}/prefect-{i}"
            orchestrated.append(timed(lambda: sequential(config_path=config, refresh=True)))
            os.environ["PHYSAI_HOME"] = f"{tmp}/prefect-parallel-{i}"
            parallel.append(timed(lambda: pipeline_flow(config_path=config, refresh=True)))

    d, o = statistics.median(direct), statistics.median(orchestrated)
    p = statistics.median(parallel)
    print(json.dumps({
        "benchmark": "pipeline_overhead",
        "config": str(args.config),
        "repeat": args.repeat,
        "direct_s": round(d, 2),
        "prefect_s": round(o, 2),
        "schedule": "scenes one after another in both",
        "ratio": round(o / d, 3),
        "prefect_parallel_s": round(p, 2),
        "ratio_parallel": round(p / d, 3),
        "prefect_server_start_s": round(server_start, 2),
        "ratio_with_server_start": round((o + server_start) / d, 3),
        "target_ratio_max": 1.2,
    }))


if __name__ == "__main__":
    main()

"""Fork server of the crash harness (tests/e2e/test_crash.py).

Imports the pipeline's modules once, then reads one JSON request a line on stdin and runs each
in a forked child: ``{"home", "api", "log", "crash_at", "trace"}``. It answers each with the
child's exit status (negative: killed by that signal) on a line of stdout.

The harness does not fork pytest itself: a pytest process may run threads (pytest-xdist's
execnet channel), and a fork while another thread holds a lock leaves the child waiting on that
lock for ever. This process runs one thread.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
CLEARED = ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "PHYSAI_MLFLOW_ARTIFACTS",
           "PHYSAI_CRASH_AT")


def _child(request: dict[str, str | None]) -> int:
    """Run the pipeline once as the request says, output to its log; the exit status."""
    home = Path(str(request["home"]))
    fd = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    for var in CLEARED:
        os.environ.pop(var, None)
    api = str(request["api"])
    os.environ.update({"PHYSAI_HOME": str(home), "PHYSAI_CRASH_TRACE": str(request["trace"]),
                       "PREFECT_API_URL": api, "COLUMNS": "200"})
    if request["crash_at"]:
        os.environ["PHYSAI_CRASH_AT"] = str(request["crash_at"])
    os.chdir(home.parent)
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from flows.cli import main

    with temporary_settings({PREFECT_API_URL: api, PREFECT_HOME: home / "prefect"}):
        return main(["run", str(CONFIG)])


def serve() -> None:
    # What a run imports lazily, imported once here: MLflow and its SQL stores, torch with the
    # optimizers' compiler hooks (AdamW imports torch._dynamo on first use), matplotlib's Agg
    # canvas, ONNX, MuJoCo and model-signing (every bundle is signed) are most of what a run would
    # otherwise spend (pxr is left to the
    # runs: see stages/evaluation/usd.py). None of them runs an operation here, so each child starts
    # with no thread pool to inherit.
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401
    import mlflow
    import mlflow.store.model_registry.sqlalchemy_store
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import model_signing.hashing
    import model_signing.signing  # noqa: F401
    import mujoco  # noqa: F401
    import onnx  # noqa: F401
    import prefect.flow_engine
    import prefect.task_engine  # noqa: F401
    import torch
    import torch._dynamo
    import torch.optim  # noqa: F401
    from model_signing._signing import sign_ec_key, sign_sigstore_pb  # noqa: F401

    import edge.bundle
    import edge.export
    import edge.pack  # noqa: F401
    import flows.cli
    import flows.pipeline  # noqa: F401
    import stages.sim.backends.builtin_tasks
    import stages.steps.collect
    import stages.steps.package
    import stages.steps.train  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child never returns into this loop
            code = 1
            try:
                code = _child(request)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    serve()

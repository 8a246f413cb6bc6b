"""Named crash points: where the crash-consistency harness kills the pipeline process.

Code that writes state calls :func:`crash_point` at the moments a crash would be most
harmful: between an artifact's payload and its manifest, inside a model registration, while
the registry lock is held, between stages. Normally it does nothing but read two variables.

- ``PHYSAI_CRASH_TRACE=FILE`` appends ``name#k`` (the k-th time this process reached
  ``name``) to FILE at every point, so a harness can list every point a run passes;
- ``PHYSAI_CRASH_AT=name#k`` makes the process SIGKILL itself at that point, as a power cut
  or the OOM killer would: no handler, no cleanup, no flush.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

CRASH_AT = "PHYSAI_CRASH_AT"
CRASH_TRACE = "PHYSAI_CRASH_TRACE"

_seen: Counter[str] = Counter()
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Record reaching ``name`` and die here if the harness asked for this occurrence."""
    target = os.environ.get(CRASH_AT)
    trace = os.environ.get(CRASH_TRACE)
    if target is None and trace is None:
        return
    with _lock:
        _seen[name] += 1
        point = f"{name}#{_seen[name]}"
        if trace:
            fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{point}\n".encode())
            finally:
                os.close(fd)
        if point == target:
            os.kill(os.getpid(), signal.SIGKILL)

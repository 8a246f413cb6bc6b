"""``python -m stages.envrun``: the promised command of :mod:`stages.pipeline.envrun`.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths"); the code lives in :mod:`stages.pipeline.envrun`. Nothing inside the project imports this
module.
"""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("stages.pipeline.envrun", run_name="__main__", alter_sys=True)

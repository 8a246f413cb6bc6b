"""Sum a ``PHYSAI_TEST_TIMELINE`` file (tests/conftest.py) by test file: wall seconds, CPU
seconds of the worker and its waited-for children, and when each file started and ended
relative to the first test; the busiest files first, then how busy the workers were.

    PHYSAI_TEST_TIMELINE=/tmp/timeline.jsonl make test
    python scripts/test_timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(path: str, top: int = 40) -> None:
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{path}: no tests recorded")
    t0 = min(r["start"] for r in lines)
    files: dict[str, dict[str, float]] = defaultdict(
        lambda: {"wall": 0.0, "cpu": 0.0, "first": float("inf"), "last": 0.0})
    for r in lines:
        f = files[r["test"].split("::")[0]]
        f["wall"] += r["end"] - r["start"]
        f["cpu"] += r["cpu_self"] + r["cpu_children"]
        f["first"] = min(f["first"], r["start"] - t0)
        f["last"] = max(f["last"], r["end"] - t0)
    print(f"{'file':60} {'wall':>7} {'cpu':>7} {'from':>6} {'to':>6}")
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["cpu"])[:top]:
        print(f"{name:60} {f['wall']:7.1f} {f['cpu']:7.1f} {f['first']:6.0f} {f['last']:6.0f}")
    end = max(r["end"] for r in lines) - t0
    busy: dict[str, float] = defaultdict(float)
    for r in lines:
        busy[r["worker"]] += r["end"] - r["start"]
    total = sum(f["cpu"] for f in files.values())
    print(json.dumps({"tests": len(lines), "span_s": round(end, 1), "cpu_s": round(total, 1),
                      "worker_busy_s": {w: round(b, 1) for w, b in sorted(busy.items())}}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/test_timeline.py TIMELINE.jsonl")
    main(sys.argv[1])

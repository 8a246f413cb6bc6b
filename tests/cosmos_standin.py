"""A local STAND-IN for a Cosmos Reason NIM, for tests only: no machine here can run the model.

It implements the request and response shapes of NIM's OpenAI-compatible
``POST /v1/chat/completions`` as the critic uses them (stages/evaluation/critic.py): it checks the
request (model, one user message with a ``video_url`` part holding a ``data:video/mp4;base64,...``
URL that PyAV decodes, and a text part), and answers with a chat completion whose content is a
``<think>`` block and an ``<answer>`` JSON verdict. It judges nothing: its verdict follows its
``--mode``:

- ``pass``: plausible and done;
- ``fail-scene:NAME``: not done for the prompt that names scene NAME, plausible and done else;
- ``malformed``: a completion whose content holds no JSON;
- ``flaky:N``: HTTP 503 for the first N requests, then as ``pass``;
- ``down``: HTTP 503 always;
- ``slow:S``: as ``pass`` after S seconds;
- ``key:K``: HTTP 401 unless the request carries ``Authorization: Bearer K``, then as ``pass``.

Every request is appended to ``--log`` as one JSON line (path, model, frames, whether an
Authorization header came, the answer status).

    python tests/cosmos_standin.py --port 8123 --mode pass --log requests.jsonl
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PREFIX = "data:video/mp4;base64,"


def _frames(video: bytes) -> int:
    import av

    with av.open(io.BytesIO(video)) as container:
        return sum(1 for _ in container.decode(video=0))


class StandIn(ThreadingHTTPServer):
    """The stand-in server; ``mode`` and ``log`` as the module says."""

    daemon_threads = True

    def __init__(self, port: int, mode: str, log: Path | None) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.mode, self.log, self.requests = mode, log, 0
        self.lock = threading.Lock()

    def record(self, entry: dict[str, Any]) -> None:
        if self.log is not None:
            with self.lock, self.log.open("a") as out:
                out.write(json.dumps(entry) + "\n")


class _Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_POST(self) -> None:
        server = self.server
        with server.lock:
            server.requests += 1
            count = server.requests
        entry: dict[str, Any] = {"path": self.path,
                                 "authorized": "Authorization" in self.headers}
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, answer = self._answer(body, count, entry)
        entry["status"] = status
        server.record(entry)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except BrokenPipeError:  # the client gave up waiting (its timeout)
            return

    def _answer(self, body: bytes, count: int, entry: dict[str, Any]) -> tuple[int, Any]:
        mode, _, arg = self.server.mode.partition(":")
        if self.path != "/v1/chat/completions":
            return 404, {"error": f"no route {self.path}"}
        try:
            request = json.loads(body)
            parts = request["messages"][0]["content"]
            video = next(p for p in parts if p["type"] == "video_url")["video_url"]["url"]
            prompt = next(p for p in parts if p["type"] == "text")["text"]
            if not video.startswith(PREFIX):
                raise ValueError("video_url is not a data:video/mp4;base64 URL")
            entry["model"] = request["model"]
            entry["frames"] = _frames(base64.b64decode(video[len(PREFIX):]))
        except Exception as exc:
            return 400, {"error": f"bad request: {exc.__class__.__name__}: {exc}"}
        if mode == "down" or (mode == "flaky" and count <= int(arg)):
            return 503, {"error": "model is loading"}
        if mode == "key" and self.headers.get("Authorization") != f"Bearer {arg}":
            return 401, {"error": "unauthorized"}
        if mode == "slow":
            time.sleep(float(arg))
        if mode == "malformed":
            return 200, _completion("The robot moves. It looks fine to me.")
        scene = re.search(r"in the scene '([^']*)'", prompt)
        done = not (mode == "fail-scene" and scene is not None and scene.group(1) == arg)
        verdict = {"plausible": True, "task_done": done,
                   "reasoning": f"stand-in verdict on {entry['frames']} frames"}
        return 200, _completion(f"<think>stand-in</think>\n\n<answer>{json.dumps(verdict)}"
                                "</answer>")


def _completion(content: str) -> dict[str, Any]:
    return {"id": "standin", "object": "chat.completion", "model": "stand-in",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]}


def serve_in_thread(mode: str, log: Path | None = None) -> tuple[StandIn, str]:
    """Start a stand-in on a free port in a thread of this process; the server and its URL."""
    server = StandIn(0, mode, log)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="pass")
    parser.add_argument("--log", type=Path)
    args = parser.parse_args()
    StandIn(args.port, args.mode, args.log).serve_forever()


if __name__ == "__main__":
    main()

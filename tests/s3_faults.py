"""A fault-injecting HTTP proxy in front of an S3 endpoint (moto's server in tests).

Each request draws from a seeded schedule: forwarded untouched, or answered with one of the
faults in :data:`FAULTS`. At most ``max_in_a_row`` faults come back to back, so a client that
retries a few times always gets through. Requests are matched as ``"METHOD /path?query"``:
``only`` limits faults to matching requests, and ``deny`` answers matching ones with 403
AccessDenied, every time.
"""

from __future__ import annotations

import hashlib
import http.client
import random
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

FAULTS = ("500", "503", "drop", "lost-response", "truncated")
"""``500``/``503``: an S3 XML error, request not forwarded. ``drop``: the connection closes
before any response, request not forwarded. ``lost-response``: forwarded (the write happens),
then the connection closes before any response. ``truncated``: forwarded, then the status,
headers and half the body are sent and the connection closes."""

SWALLOWED = "swallowed"
"""Not among the transient faults: a 200 with the body's ETag, but nothing forwarded (a gateway
that loses writes)."""

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection",
              "te", "trailer", "upgrade", "content-length"}

ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "AccessDenied", "Access Denied"),
}


def error_body(code: str, message: str, resource: str) -> bytes:
    """The XML body S3 sends with an error status."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><Resource>{escape(resource)}</Resource>"
            "<RequestId>INJECTED</RequestId></Error>").encode()


class FaultyS3Proxy:
    """Threaded HTTP proxy to ``upstream`` that injects faults at ``rate`` on a seeded schedule.

    ``faults`` counts the injected faults by kind, ``requests`` the requests seen; ``url`` is the
    endpoint to give clients. Use as a context manager or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, upstream: str, *, seed: int, rate: float, kinds: Iterable[str] = FAULTS,
                 max_in_a_row: int = 2, only: str | None = None, deny: str | None = None) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rate = rate
        self.kinds = tuple(kinds)
        self.max_in_a_row = max_in_a_row
        self.only = only
        self.deny = deny
        self.faults: Counter[str] = Counter()
        self.requests = 0
        self._random = random.Random(seed)
        self._in_a_row = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The endpoint URL clients use."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def injected(self) -> int:
        """Faults injected so far, all kinds together."""
        return sum(self.faults.values())

    def start(self) -> FaultyS3Proxy:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultyS3Proxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def decide(self, request: str) -> str | None:
        """The fault for ``request`` (``"METHOD /path?query"``); None: forward it untouched."""
        with self._lock:
            self.requests += 1
            if self.deny is not None and re.search(self.deny, request):
                self.faults["403"] += 1
                return "403"
            if self.only is not None and not re.search(self.only, request):
                return None
            draw = self._random.random()
            kind = self._random.choice(self.kinds) if self.kinds else None
            if kind is None or draw >= self.rate or self._in_a_row >= self.max_in_a_row:
                self._in_a_row = 0
                return None
            self._in_a_row += 1
            self.faults[kind] += 1
            return kind


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the proxy's counters say what happened."""

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _proxy(self) -> None:
        proxy: FaultyS3Proxy = self.server.proxy  # type: ignore[attr-defined]
        body = self._read_body()
        fault = proxy.decide(f"{self.command} {self.path}")
        if fault in ERRORS:
            status, code, message = ERRORS[fault]
            self._send(status, [("Content-Type", "application/xml")],
                       error_body(code, message, self.path))
            return
        if fault == "drop":
            self._drop()
            return
        if fault == SWALLOWED:
            etag = f'"{hashlib.md5(body).hexdigest()}"'
            self._send(200, [("ETag", etag)], b"")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            reply = [(k, v) for k, v in response.getheaders()
                     if k.lower() not in HOP_BY_HOP | {"date", "server"}]
            length = response.getheader("Content-Length")
        finally:
            upstream.close()
        if self.command == "HEAD":
            reply.append(("Content-Length", length or "0"))
        if fault == "lost-response" or (fault == "truncated" and not data):
            self._drop()
            return
        if fault == "truncated":
            self._send(response.status, reply, data, cut=len(data) // 2)
            self._drop()
            return
        self._send(response.status, reply, data)

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes,
              cut: int | None = None) -> None:
        self.send_response_only(status)
        for key, value in headers:
            self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body if cut is None else body[:cut])
        self.wfile.flush()

"""The Cosmos critic's client keeps its key to the one address it was given: it follows no
redirect, speaks plain http only on this machine, takes no user or password in the URL, and
reads no answer past its size cap. Against small local servers that answer as an endpoint, a
redirector or a flood would; the stand-in (tests/cosmos_standin.py) is the loopback endpoint."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from stages.evaluation.critic import KEY_ENV, URL_ENV, CriticError, encode_mp4, endpoint, judge
from stages.sections.models import CriticConfig
from tests.cosmos_standin import serve_in_thread

pytest.importorskip("av")

FRAMES = [np.full((24, 33, 3), 20 * i, np.uint8) for i in range(4)]
PROMPT = "the task 'reach-v0' in the scene 'nominal'."
VERDICT = {"choices": [{"index": 0, "message": {"role": "assistant", "content":
           '<answer>{"plausible": true, "task_done": true, "reasoning": "fine"}</answer>'}}]}

Answer = Callable[[BaseHTTPRequestHandler], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: Answer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.seen: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _any(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append({"method": self.command, "path": self.path,
                                 "authorization": self.headers.get("Authorization")})
        self.server.answer(self)

    do_GET = do_POST = do_HEAD = _any


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], _Server]]:
    started: list[_Server] = []

    def start(answer: Answer) -> _Server:
        server = _Server(answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def _verdict(handler: BaseHTTPRequestHandler) -> None:
    body = json.dumps(VERDICT).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _judge(url: str, **env: str) -> Any:
    ep = endpoint(CriticConfig(url=url, retries=0, backoff_s=0.01), env=env)
    return judge(ep, "nominal", encode_mp4(FRAMES, 10.0), PROMPT)


@pytest.mark.parametrize("status", [301, 302, 303, 307])
def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(
    serve: Callable[[Answer], _Server], status: int
) -> None:
    elsewhere = serve(_verdict)

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", f"{elsewhere.url}/v1/chat/completions")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    redirector = serve(redirect)
    with pytest.raises(CriticError) as err:
        _judge(redirector.url, **{KEY_ENV: "s3cret-key"})
    assert str(err.value) == (f"Cosmos critic at {redirector.url}: HTTP {status} redirect "
                              "refused; set the URL to the address that answers")
    assert [r["authorization"] for r in redirector.seen] == ["Bearer s3cret-key"]
    assert elsewhere.seen == [], "the key followed the redirect to another address"


@pytest.mark.parametrize("url", ["http://nim.example.com:8000", "http://10.0.0.7:8000/",
                                 "http://127.0.0.1.nip.io:8000"])
def test_plain_http_to_another_machine_is_refused(url: str) -> None:
    """In a config, when the config is made (``flows check``, before anything runs); from
    the environment, by the client."""
    with pytest.raises(ValidationError, match=r"url\n.* is plain http to another machine; the "
                                              r"critic needs https"):
        CriticConfig(url=url)
    with pytest.raises(CriticError, match=f"{URL_ENV}: .* is plain http"):
        endpoint(CriticConfig(), env={URL_ENV: url})


@pytest.mark.parametrize("url", ["https://nim.example.com", "http://localhost:8000",
                                 "http://127.0.0.1:8000", "http://[::1]:8000/"])
def test_https_and_loopback_http_are_taken(url: str) -> None:
    assert endpoint(CriticConfig(url=url), env={}).url == url.rstrip("/")


def test_the_loopback_standin_still_answers(tmp_path: Path) -> None:
    server, url = serve_in_thread("key:k3y", tmp_path / "requests.jsonl")
    try:
        assert _judge(url, **{KEY_ENV: "k3y"}).passed
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("url", ["https://user:pa55word@nim.example.com",
                                 "http://user:pa55word@127.0.0.1:8000"])
def test_a_url_with_a_password_is_refused_without_showing_it(url: str) -> None:
    """From the environment, by the client; in a config, when the config is made (so it never
    reaches the run's resolved config: tests/stages/test_trust_config.py shows the message)."""
    with pytest.raises(CriticError, match=f"carries a user or password, which is never "
                                          f"sent; give the key in {KEY_ENV}") as err:
        endpoint(CriticConfig(), env={URL_ENV: url})
    assert "pa55word" not in str(err.value) and "user" not in str(err.value).split(":")[1]
    with pytest.raises(ValidationError, match="carries a user or password"):
        CriticConfig(url=url)


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "until-close"])
def test_an_answer_past_the_size_cap_is_refused(
    serve: Callable[[Answer], _Server], declared: bool
) -> None:
    body = json.dumps({**VERDICT, "padding": "x" * (2 << 20)}).encode()

    def flood(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if declared:
            handler.send_header("Content-Length", str(len(body)))
        else:
            handler.close_connection = True
        handler.end_headers()
        try:
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            return

    server = serve(flood)
    with pytest.raises(CriticError) as err:
        _judge(server.url)
    assert str(err.value) == (f"Cosmos critic at {server.url}: answer larger than "
                              f"{1 << 20} bytes refused")

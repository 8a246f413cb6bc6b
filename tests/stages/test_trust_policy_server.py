"""The policy server against the network: a frame size cap from the policy's input sizes, a
batch cap, a connection cap, a per-call timeout and an API key, each refusal one line to the
client and the log while the server keeps answering the others; openpi-client is the client."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from stages.policies import policy_server, remote, wire
from tests.support import free_port

OBS_DIM, ACT_DIM = 5, 2
KEY = "s3cret-key-0123"


def _act(obs: np.ndarray) -> np.ndarray:
    if obs[0, 0] > 100:  # the slow observation
        time.sleep(1.0)
    return obs[:, :ACT_DIM] * 2


@dataclass
class Server:
    port: int
    limits: policy_server.ServerLimits

    def client(self, key: str | None = KEY) -> WebsocketClientPolicy:
        return WebsocketClientPolicy("127.0.0.1", self.port, api_key=key)


@pytest.fixture
def server() -> Iterator[Server]:
    limits = policy_server.ServerLimits(max_batch=8, max_connections=2, call_timeout_s=0.3,
                                 api_key=KEY)
    meta = {"task": "toy", "obs_dim": OBS_DIM, "act_dim": ACT_DIM, "policy_digest": "toy"}
    ready, stop, port = threading.Event(), threading.Event(), free_port()
    thread = threading.Thread(target=policy_server.serve, args=(_act, meta, "127.0.0.1", port),
                              kwargs={"ready": ready, "stop": stop, "limits": limits},
                              daemon=True)
    thread.start()
    assert ready.wait(10)
    yield Server(port, limits)
    stop.set()
    thread.join(timeout=10)


def _answered(client: WebsocketClientPolicy) -> None:
    obs = np.arange(OBS_DIM, dtype=np.float32)
    assert np.array_equal(client.infer({"obs": obs})["actions"], obs[:ACT_DIM] * 2)


def _refusals(caplog: pytest.LogCaptureFixture, expected: int = 1) -> list[str]:
    """The server's log lines, once ``expected`` of them are there (the server thread logs
    after the client has its answer)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [r.getMessage() for r in caplog.records
                 if r.name == "stages.policies.policy_server"]
        if len(lines) >= expected or time.monotonic() > deadline:
            return lines


def test_an_oversize_frame_is_refused_unread_and_the_next_client_is_answered(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stages.policies.policy_server")
    cap = server.limits.max_frame_bytes(OBS_DIM)
    assert cap == 8 * OBS_DIM * 8 + wire.FRAME_OVERHEAD_BYTES
    with connect(f"ws://127.0.0.1:{server.port}", max_size=None,
                 additional_headers={"Authorization": f"Api-Key {KEY}"}) as raw:
        raw.recv(timeout=5)
        raw.send(b"\0" * (cap + 1))
        with pytest.raises(ConnectionClosed) as closed:
            raw.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    (line,) = _refusals(caplog)
    assert f"a frame over the cap of {cap} bytes" in line and "\n" not in line
    _answered(server.client())


def test_a_batch_over_the_cap_and_a_slow_call_are_error_frames_and_the_client_goes_on(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stages.policies.policy_server")
    client = server.client()
    with pytest.raises(RuntimeError, match="a batch of 9 observations, over the cap of 8"):
        client.infer({"obs": np.zeros((9, OBS_DIM), np.float32)})
    _answered(client)
    slow = np.full(OBS_DIM, 1000, np.float32)
    with pytest.raises(RuntimeError, match=r"the policy took longer than 0\.3 s"):
        client.infer({"obs": slow})
    _answered(client)
    lines = _refusals(caplog, 2)
    assert len(lines) == 2 and all(line.count("\n") == 0 for line in lines), lines


def test_a_wrong_or_missing_api_key_is_refused_and_never_logged(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for key in ("wrong", None):
        with pytest.raises(InvalidStatus) as refused:
            server.client(key)
        assert refused.value.response.status_code == 401
        assert b"API key" in refused.value.response.body
    _answered(server.client())
    lines = _refusals(caplog, 2)
    assert len(lines) == 2 and all("missing or wrong API key" in line for line in lines)
    server_side = [r for r in caplog.records if not r.name.startswith("websockets.client")]
    assert server_side and not any(KEY in r.getMessage() for r in server_side)


def test_a_client_over_the_connection_cap_is_closed_and_the_others_still_answered(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stages.policies.policy_server")
    first, second = server.client(), server.client()
    with pytest.raises(ConnectionClosed) as closed:
        server.client()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    assert "too many connections (cap 2)" in closed.value.rcvd.reason
    _answered(first)
    _answered(second)
    (line,) = _refusals(caplog)
    assert "2 clients are connected (the cap)" in line


def test_the_remote_policy_client_sends_the_key_from_the_environment(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"ws://127.0.0.1:{server.port}"
    monkeypatch.delenv(wire.API_KEY_VAR, raising=False)
    with pytest.raises(remote.RemotePolicyError, match=f"HTTP 401 \\(set {wire.API_KEY_VAR}"):
        remote.RemotePolicy(uri, OBS_DIM, ACT_DIM)
    monkeypatch.setenv(wire.API_KEY_VAR, KEY)
    caplog.set_level(logging.DEBUG)
    policy = remote.RemotePolicy(uri, OBS_DIM, ACT_DIM)
    assert not any(KEY in r.getMessage() for r in caplog.records)
    obs = np.ones((3, OBS_DIM), np.float32)
    assert np.array_equal(policy(obs), obs[:, :ACT_DIM] * 2) and not policy.failures
    policy.close()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch must be positive"):
        policy_server.ServerLimits(max_batch=0)

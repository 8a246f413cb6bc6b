"""Policies on another machine, over OpenPI's websocket policy protocol.

OpenPI (and GR00T's) policy servers speak a small protocol over one websocket: on connecting,
the server sends its metadata; then each message from the client is an observation and each
answer the action, both msgpack maps whose numpy arrays are encoded as maps with the keys
``__ndarray__``, ``data``, ``dtype`` and ``shape`` (``openpi_client.msgpack_numpy``); an answer
that is a text frame is the server's error. ``openpi-client`` (PyPI) is the real client.

- :func:`serve` serves any policy of this project over that protocol (``flows policy serve``):
  the observation map's ``obs`` (one observation, or a batch of them) goes through the policy
  and the answer is ``{"actions": ...}`` of the same batch shape; the metadata names the
  task, the sizes and the policy's digest. It admits what :class:`ServerLimits` allows (a
  frame size cap derived from the observation width, a batch cap, a connection cap, a
  per-call timeout, an optional API key sent as openpi-client's ``api_key``); each refusal is
  one line to the client and the log, and the server keeps serving.
- :class:`RemotePolicy` is the client validation uses for a policy given as ``ws://host:port``:
  one call per control step for every world, each call's latency recorded. An answer that is
  an error, malformed (wrong shape, not finite) or later than ``timeout_s`` fails the episodes
  of that call, with the reason recorded, and the rollout goes on; a server that is gone
  stops the run with one line.

The wire format is written here (a few lines over ``msgpack``) rather than imported from
``openpi-client``: that package pins ``numpy<2``, which this project's stack cannot take; the
tests check every message against ``openpi-client`` itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.errors import PhysaiError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""Longest wait for one answer before the call's episodes count as failed."""
DEFAULT_MAX_BATCH = 4096
"""Most observations the server takes in one message."""
DEFAULT_MAX_CONNECTIONS = 8
"""Most clients the server serves at once."""
DEFAULT_CALL_TIMEOUT_S = 5.0
"""Longest the server lets the policy take over one message."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""A client silent this long is closed."""
FRAME_OVERHEAD_BYTES = 64 * 1024
"""Room in a frame beside the observations: other keys of the message, msgpack's framing."""
API_KEY_VAR = "PHYSAI_POLICY_API_KEY"
"""Environment variable holding the policy server's API key; the client sends it too."""


class RemotePolicyError(PhysaiError):
    """A remote policy server that cannot be reached, or that went away."""

    exit_code = 2


def _pack_array(obj: object) -> object:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _unpack_array(obj: dict[Any, Any]) -> object:
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]),
                          shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(message: object) -> bytes:
    """``message`` in the protocol's msgpack encoding (numpy arrays as ndarray maps)."""
    import msgpack

    data: bytes = msgpack.packb(message, default=_pack_array)
    return data


def unpackb(data: bytes) -> Any:
    """A message of the protocol, its ndarray maps as numpy arrays."""
    import msgpack

    return msgpack.unpackb(data, object_hook=_unpack_array)


@dataclass(frozen=True)
class ServerLimits:
    """What the policy server admits: every refusal is one line to the client and the log,
    and the server goes on serving the others."""

    max_batch: int = DEFAULT_MAX_BATCH
    """Most observations in one message; a frame's size cap follows from it
    (:meth:`max_frame_bytes`)."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Most clients connected at once; one more is closed with code 1013 (try again later)."""
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    """Longest the policy may take over one message before the answer is an error frame."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """A client that sends nothing for this long is closed, its place freed."""
    api_key: str | None = None
    """When set, a client must send ``Authorization: Api-Key <key>`` (openpi-client's
    ``api_key``); never logged."""

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_connections", "call_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")

    def max_frame_bytes(self, obs_dim: int) -> int:
        """The largest frame read: ``max_batch`` observations of ``obs_dim`` float64 values
        (the widest dtype a client may send) plus :data:`FRAME_OVERHEAD_BYTES` for the
        message's other keys and msgpack's framing. Anything longer is refused unread."""
        return self.max_batch * obs_dim * 8 + FRAME_OVERHEAD_BYTES


class _NoDebug(logging.LoggerAdapter):
    """A websockets logger that never logs at DEBUG, where websockets writes every request
    header (the API key's ``Authorization`` among them)."""

    def isEnabledFor(self, level: int) -> bool:
        """Whether ``level`` is logged: never DEBUG."""
        return level > logging.DEBUG and self.logger.isEnabledFor(level)


def _authorized(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``key`` (``Api-Key <key>``, or ``Bearer``),
    compared in constant time."""
    import hmac

    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() not in ("api-key", "bearer"):
        return False
    return hmac.compare_digest(given.strip().encode(), key.encode())


def serve(act: Callable[[np.ndarray], np.ndarray], metadata: dict[str, Any], host: str,
          port: int, *, ready: threading.Event | None = None,
          stop: threading.Event | None = None, limits: ServerLimits | None = None) -> None:
    """Serve ``act`` over the protocol on ``host:port`` until ``stop`` is set (or forever).

    ``act`` takes observations (N, obs_dim) float32 and returns actions (N, act_dim); a
    message's ``obs`` may be one observation (obs_dim,) or a batch, and the answer keeps that
    shape. A message without a usable ``obs``, a batch over ``limits.max_batch`` or a call over
    ``limits.call_timeout_s`` gets a text frame naming what is wrong; a frame over
    :meth:`ServerLimits.max_frame_bytes` closes its connection (code 1009) unread; a client
    without the API key is answered 401, one over the connection cap closed with code 1013.
    Each refusal is logged in one line; the server keeps serving.
    """
    from concurrent.futures import ThreadPoolExecutor

    from websockets.sync.server import serve as ws_serve

    limits = limits or ServerLimits()
    calls = ThreadPoolExecutor(max_workers=limits.max_connections,
                               thread_name_prefix="policy-call")
    policy = _PolicyServer(act, metadata, limits, calls)
    try:
        with ws_serve(policy.handle, host, port, compression=None, max_size=policy.max_frame,
                      max_queue=2, process_request=policy.check_key,
                      logger=_NoDebug(logging.getLogger("websockets.server"))) as server:
            if ready is not None:
                ready.set()
            if stop is None:
                server.serve_forever()
                return
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            stop.wait()
            server.shutdown()
            thread.join(timeout=10)
    finally:
        calls.shutdown(wait=False, cancel_futures=True)


class _PolicyServer:
    """One served policy's connection handler, with its limits (see :func:`serve`)."""

    def __init__(self, act: Callable[[np.ndarray], np.ndarray], metadata: dict[str, Any],
                 limits: ServerLimits, calls: Any) -> None:
        self.act, self.metadata, self.limits, self.calls = act, metadata, limits, calls
        self.obs_dim = int(metadata["obs_dim"])
        self.max_frame = limits.max_frame_bytes(self.obs_dim)
        self.slots = threading.BoundedSemaphore(limits.max_connections)

    @staticmethod
    def refuse(peer: str, message: str) -> None:
        log.warning("policy server: %s: %s", peer, message)

    def check_key(self, conn: Any, request: Any) -> Any:
        """The handshake's answer: None to go on, 401 without the API key."""
        key = self.limits.api_key
        if key is None or _authorized(request.headers.get("Authorization"), key):
            return None
        self.refuse(_peer(conn), "missing or wrong API key")
        return conn.respond(401, "missing or wrong API key (Authorization: Api-Key KEY)\n")

    def answer(self, message: bytes) -> bytes | str:
        """The reply to one binary frame: packed actions, or a line naming what is wrong."""
        from concurrent.futures import TimeoutError as CallTimeout

        obs_dim, limits = self.obs_dim, self.limits
        try:
            request = unpackb(message)
            obs = np.asarray(request["obs"] if isinstance(request, dict) else None, np.float32)
            if obs.ndim not in (1, 2) or obs.shape[-1] != obs_dim:
                raise ValueError(f"obs must have shape ({obs_dim},) or (N, {obs_dim}), "
                                 f"got {obs.shape}")
        except (KeyError, TypeError, ValueError) as exc:
            return f"bad observation: {exc}"
        if obs.ndim == 2 and len(obs) > limits.max_batch:
            return f"refused: a batch of {len(obs)} observations, over the cap of " \
                f"{limits.max_batch}"
        future = self.calls.submit(self.act, obs.reshape(-1, obs_dim))
        try:
            actions = future.result(timeout=limits.call_timeout_s)
        except CallTimeout:
            return f"refused: the policy took longer than {limits.call_timeout_s:g} s"
        out = actions[0] if obs.ndim == 1 else actions
        return packb({"actions": np.asarray(out, np.float32)})

    def handle(self, conn: Any) -> None:
        """Serve one connection: the metadata, then an answer per frame until it closes."""
        from websockets.exceptions import ConnectionClosed

        peer, cap = _peer(conn), self.limits.max_connections
        if not self.slots.acquire(blocking=False):
            self.refuse(peer, f"refused: {cap} clients are connected (the cap)")
            conn.close(1013, f"too many connections (cap {cap})")
            return
        try:
            conn.send(packb(self.metadata))
            while (message := self._receive(conn, peer)) is not None:
                if isinstance(message, str):
                    conn.send("expected a msgpack binary frame, got text")
                    continue
                reply = self.answer(message)
                if isinstance(reply, str) and reply.startswith("refused"):
                    self.refuse(peer, reply.removeprefix("refused: "))
                conn.send(reply)
        except ConnectionClosed:
            return
        finally:
            self.slots.release()

    def _receive(self, conn: Any, peer: str) -> bytes | str | None:
        """The next frame, or None once the connection is closed or idle too long."""
        from websockets.exceptions import ConnectionClosed
        from websockets.frames import CloseCode

        idle = self.limits.idle_timeout_s
        try:
            message: bytes | str = conn.recv(timeout=idle)
        except TimeoutError:
            self.refuse(peer, f"closed: idle for {idle:g} s")
            conn.close(1001, f"idle for {idle:g} s")
            return None
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CloseCode.MESSAGE_TOO_BIG:
                self.refuse(peer, f"a frame over the cap of {self.max_frame} bytes")
            return None
        return message


def _peer(conn: Any) -> str:
    """``host:port`` of a connection's client."""
    try:
        address = conn.remote_address
        return f"{address[0]}:{address[1]}"
    except (AttributeError, IndexError, OSError, TypeError):
        return "a client"


class RemotePolicy:
    """A policy served over the protocol at ``uri``, called like a local one.

    ``act(obs)`` sends the batch of observations of every world in one message and returns
    the actions. A failed call (an error frame, a malformed answer, no answer in
    ``timeout_s``) returns zero actions for its worlds and records why in :attr:`failures`
    (world -> reason, the first reason per world kept); after a timeout the connection is
    opened again, so a late answer cannot be read as the next one.
    """

    def __init__(self, uri: str, obs_dim: int, act_dim: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.uri = uri
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.timeout_s = timeout_s
        self.latencies_s: list[float] = []
        """Seconds of every call, answered or not."""
        self.failures: dict[int, str] = {}
        """World -> why its episode failed on the remote side."""
        self.metadata: dict[str, Any] = {}
        self._conn: Any = None
        self._connect()

    def _connect(self) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.sync.client import connect

        key = os.environ.get(API_KEY_VAR, "").strip()
        headers = {"Authorization": f"Api-Key {key}"} if key else None
        try:
            self._conn = connect(self.uri, compression=None, max_size=None,
                                 open_timeout=self.timeout_s, additional_headers=headers,
                                 logger=_NoDebug(logging.getLogger("websockets.client")))
            hello = self._conn.recv(timeout=self.timeout_s)
        except InvalidStatus as exc:
            status = exc.response.status_code
            hint = f" (set {API_KEY_VAR})" if status == 401 else ""
            raise RemotePolicyError(f"remote policy {self.uri}: the server refused the "
                                    f"connection with HTTP {status}{hint}") from None
        except ConnectionClosed as exc:
            reason = exc.rcvd.reason if exc.rcvd is not None else str(exc)
            raise RemotePolicyError(f"remote policy {self.uri}: the server closed the "
                                    f"connection ({reason})") from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise RemotePolicyError(f"remote policy {self.uri}: cannot connect "
                                    f"({type(exc).__name__}: {exc})") from None
        meta = unpackb(hello) if isinstance(hello, bytes) else {}
        self.metadata = meta if isinstance(meta, dict) else {}

    def reset(self) -> None:
        """Forget the failures of the last episode (latencies are kept)."""
        self.failures = {}

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions of every world for ``obs`` (N, obs_dim), float32."""
        from websockets.exceptions import ConnectionClosed

        n = len(obs)
        start = time.perf_counter()
        reason = None
        try:
            self._conn.send(packb({"obs": np.asarray(obs, np.float32)}))
            answer = self._conn.recv(timeout=self.timeout_s)
        except TimeoutError:
            reason = f"no answer in {self.timeout_s:g} s"
            self._conn.close()
            self._connect()
        except ConnectionClosed as exc:
            raise RemotePolicyError(f"remote policy {self.uri} closed the connection "
                                    f"({exc})") from None
        finally:
            self.latencies_s.append(time.perf_counter() - start)
        actions = np.zeros((n, self.act_dim), np.float32)
        if reason is None:
            actions, reason = self._actions(answer, n, actions)
        if reason is not None:
            for world in range(n):
                self.failures.setdefault(world, f"remote policy: {reason}")
        return actions

    def _actions(self, answer: object, n: int, zeros: np.ndarray
                 ) -> tuple[np.ndarray, str | None]:
        if isinstance(answer, str):
            return zeros, f"server error: {answer.strip().splitlines()[-1][:200]}"
        try:
            message = unpackb(answer) if isinstance(answer, bytes) else None
            actions = np.asarray(message["actions"] if isinstance(message, dict) else None,
                                 np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            return zeros, f"malformed answer ({exc})"
        if actions.shape != (n, self.act_dim):
            return zeros, f"malformed answer: actions of shape {actions.shape}, not " \
                f"({n}, {self.act_dim})"
        if not np.isfinite(actions).all():
            return zeros, "malformed answer: actions that are not finite"
        return actions, None

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()

    def latency_summary(self) -> dict[str, float]:
        """p50, p99 and max of the calls' latencies, in milliseconds."""
        if not self.latencies_s:
            return {}
        ms = np.asarray(self.latencies_s) * 1e3
        p50, p99, top = np.percentile(ms, [50, 99, 100])
        return {"calls": float(len(ms)), "p50_ms": float(p50), "p99_ms": float(p99),
                "max_ms": float(top)}

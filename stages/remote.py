"""Policies on another machine, over OpenPI's websocket policy protocol.

OpenPI (and GR00T's) policy servers speak a small protocol over one websocket: on connecting,
the server sends its metadata; then each message from the client is an observation and each
answer the action, both msgpack maps whose numpy arrays are encoded as maps with the keys
``__ndarray__``, ``data``, ``dtype`` and ``shape`` (``openpi_client.msgpack_numpy``); an answer
that is a text frame is the server's error. ``openpi-client`` (PyPI) is the real client.

- :func:`serve` serves any policy of this project over that protocol (``flows policy serve``):
  the observation map's ``obs`` (one observation, or a batch of them) goes through the policy
  and the answer is ``{"actions": ...}`` of the same batch shape; the metadata names the
  task, the sizes and the policy's digest.
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
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stages.errors import PhysaiError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""Longest wait for one answer before the call's episodes count as failed."""


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


def serve(act: Callable[[np.ndarray], np.ndarray], metadata: dict[str, Any], host: str,
          port: int, *, ready: threading.Event | None = None,
          stop: threading.Event | None = None) -> None:
    """Serve ``act`` over the protocol on ``host:port`` until ``stop`` is set (or forever).

    ``act`` takes observations (N, obs_dim) float32 and returns actions (N, act_dim); a
    message's ``obs`` may be one observation (obs_dim,) or a batch, and the answer keeps that
    shape. A message without a usable ``obs`` gets a text frame naming what is wrong.
    """
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.server import ServerConnection
    from websockets.sync.server import serve as ws_serve

    obs_dim = int(metadata["obs_dim"])

    def handle(conn: ServerConnection) -> None:
        conn.send(packb(metadata))
        while True:
            try:
                message = conn.recv()
            except ConnectionClosed:
                return
            if isinstance(message, str):
                conn.send("expected a msgpack binary frame, got text")
                continue
            try:
                request = unpackb(message)
                obs = np.asarray(request["obs"] if isinstance(request, dict) else None,
                                 np.float32)
                if obs.ndim not in (1, 2) or obs.shape[-1] != obs_dim:
                    raise ValueError(f"obs must have shape ({obs_dim},) or (N, {obs_dim}), "
                                     f"got {obs.shape}")
                actions = act(obs.reshape(-1, obs_dim))
                out = actions[0] if obs.ndim == 1 else actions
                conn.send(packb({"actions": np.asarray(out, np.float32)}))
            except (KeyError, TypeError, ValueError) as exc:
                conn.send(f"bad observation: {exc}")

    with ws_serve(handle, host, port, compression=None, max_size=None) as server:
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
        from websockets.sync.client import connect

        try:
            self._conn = connect(self.uri, compression=None, max_size=None,
                                 open_timeout=self.timeout_s)
            hello = self._conn.recv(timeout=self.timeout_s)
        except (OSError, TimeoutError) as exc:
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

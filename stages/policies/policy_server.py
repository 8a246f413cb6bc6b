"""Serving any policy of this project over OpenPI's websocket protocol (``flows policy serve``).

:func:`serve` reads each input under its key (:mod:`stages.policies.wire`'s key map)
or its own name, one observation or a batch of them; the answer is ``{"actions": ...}`` of the
same batch shape, a chunk policy's (k, act_dim) per observation; a message's ``prompt`` (the
episode's instruction) goes to a policy that takes instructions (an ``instruct`` method, as
:class:`stages.evaluation.rollout.TakesInstructions` declares it), one per observation, before it
acts on them; the metadata names the task,
the sizes, the key map, the image shapes and the policy's digest. It admits what
:class:`ServerLimits` allows (a frame size cap derived from the observation's size, a batch cap,
a connection cap, a per-call timeout, an optional API key sent as openpi-client's ``api_key``);
each refusal is one line to the client and the log, and the server keeps serving.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.policies.wire import (
    DEFAULT_MAX_BATCH,
    FRAME_OVERHEAD_BYTES,
    PROMPT_KEY,
    NoDebug,
    key_map,
    packb,
    unpackb,
)
from stages.sim.env.observation import STATE_KEY, policy_inputs, sees

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 8
"""Most clients the server serves at once."""
DEFAULT_CALL_TIMEOUT_S = 5.0
"""Longest the server lets the policy take over one message."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""A client silent this long is closed."""


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

    def max_frame_bytes(self, obs_dim: int, image_bytes: int = 0) -> int:
        """The largest frame read: ``max_batch`` observations of ``obs_dim`` float64 values
        (the widest dtype a client may send) and ``image_bytes`` bytes of uint8 images each,
        plus :data:`FRAME_OVERHEAD_BYTES` for the message's other keys (a prompt) and
        msgpack's framing. Anything longer is refused unread."""
        return self.max_batch * (obs_dim * 8 + image_bytes) + FRAME_OVERHEAD_BYTES


def _authorized(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``key`` (``Api-Key <key>``, or ``Bearer``),
    compared in constant time."""
    import hmac

    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() not in ("api-key", "bearer"):
        return False
    return hmac.compare_digest(given.strip().encode(), key.encode())


def serve(act: Callable[[Any], np.ndarray], metadata: dict[str, Any], host: str,
          port: int, *, ready: threading.Event | None = None,
          stop: threading.Event | None = None, limits: ServerLimits | None = None) -> None:
    """Serve ``act`` over the protocol on ``host:port`` until ``stop`` is set (or forever).

    ``act`` takes observations (N, obs_dim) float32, or for a policy that sees (an ``inputs``
    attribute) the mapping of its named inputs, each image (N, H, W, 3) uint8; it returns
    actions (N, act_dim), or a chunk policy's (N, k, act_dim). ``metadata`` (sent to every
    client) gives ``obs_dim``, and may give ``keys`` (input -> message key; by default
    :func:`~stages.policies.wire.default_keys`) and, for a policy that sees, must
    give ``image_shapes`` (message key -> (H, W, 3)). A message holds each input under its key
    or its own name, one observation or a batch of them, and the answer keeps that shape. A
    message without a usable input, a batch over ``limits.max_batch`` or a call over
    ``limits.call_timeout_s`` gets a text frame naming what is wrong; a frame over
    :meth:`ServerLimits.max_frame_bytes` closes its connection (code 1009) unread; a client
    without the API key is answered 401, one over the connection cap closed with code 1013. Each
    refusal is logged in one line; the server keeps serving.

    Steps: 1. the connection handler, checked against ``metadata``, and the pool the policy's
    calls run in; 2. serve, forever or in a thread until ``stop`` is set; 3. the pool let go.

    Raises:
        ValueError: ``metadata`` lacks the shape of an image the policy reads, or its key map
            does not fit the policy's inputs.
    """
    from concurrent.futures import ThreadPoolExecutor

    from websockets.sync.server import serve as ws_serve

    # -- 1. the handler (its key map and image shapes checked) and the policy's call pool
    limits = limits or ServerLimits()
    policy = _PolicyServer(act, metadata, limits, None)
    calls = ThreadPoolExecutor(max_workers=limits.max_connections,
                               thread_name_prefix="policy-call")
    policy.calls = calls
    try:
        # -- 2. serve: forever, or in a thread until stop is set
        with ws_serve(policy.handle, host, port, compression=None, max_size=policy.max_frame,
                      max_queue=2, process_request=policy.check_key,
                      logger=NoDebug(logging.getLogger("websockets.server"))) as server:
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
        # -- 3. calls still running are not waited for: the server is gone
        calls.shutdown(wait=False, cancel_futures=True)


def served_shapes(metadata: Mapping[str, Any], inputs: Sequence[str]
                  ) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """The key map and the shape of one observation of every input (``obs``: (obs_dim,); an
    image: (H, W, 3)) of a server whose policy reads ``inputs``, from its ``metadata``.

    Raises:
        ValueError: an image's shape is missing, or the key map does not fit ``inputs``.
    """
    keys = key_map(inputs, metadata.get("keys") or None)
    images = dict(metadata.get("image_shapes") or {})
    shapes: dict[str, tuple[int, ...]] = {STATE_KEY: (int(metadata["obs_dim"]),)}
    for name in inputs:
        if name == STATE_KEY:
            continue
        if keys[name] not in images:
            raise ValueError(f"the metadata gives no image_shapes[{keys[name]!r}] for the "
                             f"policy's input {name}")
        shapes[name] = tuple(int(x) for x in images[keys[name]])
    return keys, shapes


class _PolicyServer:
    """One served policy's connection handler, with its limits (see :func:`serve`)."""

    def __init__(self, act: Callable[[Any], np.ndarray], metadata: dict[str, Any],
                 limits: ServerLimits, calls: Any) -> None:
        self.act, self.metadata, self.limits, self.calls = act, metadata, limits, calls
        self.inputs = policy_inputs(act)
        self.sees = sees(act)
        self.keys, self.shapes = served_shapes(metadata, self.inputs)
        self.obs_dim = self.shapes[STATE_KEY][0]
        image_bytes = sum(int(np.prod(shape)) for name, shape in self.shapes.items()
                          if name != STATE_KEY)
        self.max_frame = limits.max_frame_bytes(self.obs_dim, image_bytes)
        self.slots = threading.BoundedSemaphore(limits.max_connections)
        instruct = getattr(act, "instruct", None)
        self.instruct: Callable[[Sequence[str] | None], None] | None = \
            instruct if callable(instruct) else None
        self.instructed = threading.Lock()
        """Held from a policy's instructions to its answer: its calls run one at a time."""

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

    def observation(self, request: object) -> tuple[dict[str, np.ndarray], bool]:
        """Every input of the policy from a message, each with a batch axis, and whether the
        message held a batch. Raises ValueError (or TypeError) naming what is wrong."""
        if not isinstance(request, dict):
            raise TypeError("the message is not a map")
        arrays: dict[str, np.ndarray] = {}
        batches: set[int | None] = set()
        for name in self.inputs:
            key = self.keys[name]
            value = request.get(key, request.get(name))
            if value is None:
                raise ValueError(f"no {key!r} (the policy's {name}) in the message, which "
                                 f"holds {', '.join(map(str, request)) or 'nothing'}")
            shape = self.shapes[name]
            array = np.asarray(value, np.float32) if name == STATE_KEY else np.asarray(value)
            if name != STATE_KEY and array.dtype != np.uint8:
                raise ValueError(f"{key} must be uint8 images, got {array.dtype}")
            if array.shape[-len(shape):] != shape or array.ndim not in (len(shape),
                                                                        len(shape) + 1):
                wanted = ", ".join(map(str, shape))
                raise ValueError(f"{key} must have shape ({wanted}{',' * (len(shape) == 1)}) "
                                 f"or (N, {wanted}), got {array.shape}")
            batches.add(len(array) if array.ndim > len(shape) else None)
            arrays[name] = array if array.ndim > len(shape) else array[None]
        if len(batches) > 1:
            raise ValueError("the inputs hold different batches: "
                             + ", ".join(f"{self.keys[n]} {arrays[n].shape}" for n in arrays))
        return arrays, batches != {None}

    def answer(self, message: bytes) -> bytes | str:
        """The reply to one binary frame: packed actions, or a line naming what is wrong."""
        from concurrent.futures import TimeoutError as CallTimeout

        limits = self.limits
        try:
            request = unpackb(message)
            arrays, batched = self.observation(request)
        except (KeyError, TypeError, ValueError) as exc:
            return f"bad observation: {exc}"
        n = len(arrays[STATE_KEY])
        if batched and n > limits.max_batch:
            return f"refused: a batch of {n} observations, over the cap of {limits.max_batch}"
        prompt = request.get(PROMPT_KEY) if self.instruct is not None else None
        if prompt is not None and not isinstance(prompt, str):
            return f"bad observation: {PROMPT_KEY} is a {type(prompt).__name__}, not a text"
        future = self.calls.submit(self.told, prompt, n,
                                   arrays if self.sees else arrays[STATE_KEY])
        try:
            actions = future.result(timeout=limits.call_timeout_s)
        except CallTimeout:
            return f"refused: the policy took longer than {limits.call_timeout_s:g} s"
        out = np.asarray(actions, np.float32)
        return packb({"actions": out if batched else out[0]})

    def told(self, prompt: str | None, n: int, observation: Any) -> np.ndarray:
        """The policy's actions for ``observation`` (``n`` of them), a policy that takes
        instructions told ``prompt`` for each first (None: the message had none)."""
        if self.instruct is None:
            return self.act(observation)
        with self.instructed:
            self.instruct(None if prompt is None else [prompt] * n)
            return self.act(observation)

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

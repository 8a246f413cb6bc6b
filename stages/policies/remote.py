"""Policies on another machine, over OpenPI's websocket policy protocol.

OpenPI (and GR00T's) policy servers speak a small protocol over one websocket: on connecting,
the server sends its metadata; then each message from the client is an observation and each
answer the action, both msgpack maps whose numpy arrays are encoded as maps with the keys
``__ndarray__``, ``data``, ``dtype`` and ``shape`` (``openpi_client.msgpack_numpy``); an answer
that is a text frame is the server's error. ``openpi-client`` (PyPI) is the real client.

An observation travels as a map of named arrays. Each input of a policy (``obs``, the state;
``<camera>_image``, a camera's frame) goes under a message key, the **key map**
(:func:`default_keys`): a policy that reads only the state sends it as ``obs``, as this
protocol always has; a policy that sees uses the names of OpenPI's examples (LIBERO's client):
``observation/state``, ``observation/image`` for the first camera, ``observation/wrist_image``
for a camera named ``wrist``, ``observation/<camera>_image`` for any other, and a ``prompt``
string beside them when one is given.

- :func:`serve` serves any policy of this project over that protocol (``flows policy serve``):
  each input read under its key (or its own name), one observation or a batch of them; the
  answer is ``{"actions": ...}`` of the same batch shape, a chunk policy's (k, act_dim) per
  observation; the metadata names the task, the sizes, the key map, the image shapes and the
  policy's digest. It admits what :class:`ServerLimits` allows (a frame size cap derived from
  the observation's size, a batch cap, a connection cap, a per-call timeout, an optional API
  key sent as openpi-client's ``api_key``); each refusal is one line to the client and the
  log, and the server keeps serving.
- :class:`RemotePolicy` is the client validation uses for a policy given as ``ws://host:port``:
  the worlds' observations in one message per control step where the server takes batches
  (its metadata gives ``obs_dim``, as this project's does), else one message per world as
  OpenPI's clients send; each call's latency recorded. An answer that is an error, malformed
  (wrong shape, not finite) or later than ``timeout_s`` fails the episodes of that call, with
  the reason recorded, and the rollout goes on; a server that is gone, or that refuses the
  first call, stops the run with one line. The client is bounded like the server: the
  metadata is read under a 1 MiB cap and its numbers checked before they size anything
  (:func:`checked_metadata`), each answer under a cap derived from the actions it owes
  (:attr:`RemotePolicy.answer_cap`), and every reason is one line of at most
  :data:`REASON_CHARS` of the server's words.

The wire format is written here (a few lines over ``msgpack``) rather than imported from
``openpi-client``: that package pins ``numpy<2``, which this project's stack cannot take; the
tests check every message against ``openpi-client`` itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.runtime import MAX_CHUNK_SIZE, MAX_IMAGE_SIDE
from physai_core.errors import PhysaiError, printable
from stages.sim.env.observation import STATE_KEY, policy_inputs, sees

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
METADATA_MAX_BYTES = 1 << 20
"""Cap on the metadata frame a client reads on connecting (1 MiB): names, sizes and a key map
take a few hundred bytes."""
ANSWER_VALUE_BYTES = 16
"""Room for one action value in an answer: 8 bytes as float64 (the widest dtype) in an ndarray
map, 9 as a float64 in a msgpack list, the rest for nested lists' headers."""
REASON_CHARS = 200
"""Longest piece of a server's words (an error frame, a malformed answer) kept in a reason."""
ARRAY_KINDS = "biuf"
"""The dtype kinds an ndarray map may have (bool, signed, unsigned, float): the bytes of any
other (an object array's are pointers) are not read as an array."""
API_KEY_VAR = "PHYSAI_POLICY_API_KEY"
"""Environment variable holding the policy server's API key; the client sends it too."""
PROMPT_KEY = "prompt"
"""Message key of the instruction text sent beside the observation (OpenPI's)."""
OPENPI_STATE_KEY = "observation/state"
"""Message key of the state vector of a policy that sees (OpenPI's LIBERO example)."""
OPENPI_IMAGE_KEY = "observation/image"
"""Message key of the first camera's image (OpenPI's LIBERO example)."""
OPENPI_WRIST_KEY = "observation/wrist_image"
"""Message key of the image of a camera named ``wrist`` (OpenPI's LIBERO example)."""
WRIST_IMAGE = "wrist_image"
"""The input a camera named ``wrist`` gives (``<camera>_image``)."""


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
    if b"__ndarray__" in obj or b"__npgeneric__" in obj:
        dtype = np.dtype(obj[b"dtype"])
        if dtype.kind not in ARRAY_KINDS:
            raise ValueError(f"an array of dtype {str(dtype)[:40]}; only bool, integer and "
                             "float arrays are read")
        if b"__npgeneric__" in obj:
            return dtype.type(obj[b"data"])
        return np.ndarray(buffer=obj[b"data"], dtype=dtype, shape=obj[b"shape"])
    return obj


def packb(message: object) -> bytes:
    """``message`` in the protocol's msgpack encoding (numpy arrays as ndarray maps)."""
    import msgpack

    data: bytes = msgpack.packb(message, default=_pack_array)
    return data


def unpackb(data: bytes) -> Any:
    """A message of the protocol, its ndarray maps as numpy arrays (of bool, integer or float
    dtypes only, each a view of the frame's bytes: nothing larger than the frame is made).

    Raises:
        ValueError: ``data`` is not such a message, in one short line saying why.
    """
    import msgpack

    try:
        return msgpack.unpackb(data, object_hook=_unpack_array)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError,
            msgpack.UnpackException) as exc:
        raise ValueError(f"not a msgpack message of the protocol: {reason_line(exc)}") \
            from None


def reason_line(what: BaseException | str, limit: int = REASON_CHARS) -> str:
    """An exception's message, or a server's text, as one printable line of at most ``limit``
    characters (its last non-empty line for a text, where a traceback ends; the first of an
    exception's), led by the exception's type."""
    if isinstance(what, str):
        lines = [line for line in what.strip().splitlines() if line.strip()]
        text = lines[-1].strip() if lines else "(empty)"
    else:
        first = str(what).strip().splitlines()
        text = f"{type(what).__name__}: {first[0]}" if first else type(what).__name__
    text = printable(text[:limit])
    return text if len(text) <= limit else text[:limit - 3] + "..."


def default_keys(inputs: Sequence[str]) -> dict[str, str]:
    """The message key of each of a policy's ``inputs`` when no key map is given.

    The state alone travels as ``obs``, as this protocol always had it. Beside images, the
    names of OpenPI's examples: the state as ``observation/state``, the first camera's image
    (other than a wrist camera's) as ``observation/image``, the image of a camera named
    ``wrist`` as ``observation/wrist_image`` and any other as ``observation/<camera>_image``.
    """
    images = [name for name in inputs if name != STATE_KEY]
    if not images:
        return {STATE_KEY: STATE_KEY}
    first = next((name for name in images if name != WRIST_IMAGE), None)
    keys = {STATE_KEY: OPENPI_STATE_KEY}
    for name in images:
        keys[name] = (OPENPI_IMAGE_KEY if name == first else OPENPI_WRIST_KEY
                      if name == WRIST_IMAGE else f"observation/{name}")
    return keys


def key_map(inputs: Sequence[str], given: Mapping[str, str] | None = None,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The key of every one of ``inputs``: ``given`` over ``base`` (by default
    :func:`default_keys`); an input ``given`` that is not among ``inputs``, or two inputs under
    one key, is a :class:`ValueError` naming them."""
    keys = {**(dict(base) if base is not None else default_keys(inputs)), **(given or {})}
    unknown = sorted(set(given or {}) - set(inputs))
    if unknown:
        raise ValueError(f"the key map names {', '.join(unknown)}, which is not among the "
                         f"inputs {', '.join(inputs)}")
    keys = {name: keys.get(name, name) for name in inputs}
    shared = sorted({key for key in keys.values() if list(keys.values()).count(key) > 1})
    if shared:
        raise ValueError(f"the key map sends two inputs under {', '.join(shared)}")
    return keys


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


def serve(act: Callable[[Any], np.ndarray], metadata: dict[str, Any], host: str,
          port: int, *, ready: threading.Event | None = None,
          stop: threading.Event | None = None, limits: ServerLimits | None = None) -> None:
    """Serve ``act`` over the protocol on ``host:port`` until ``stop`` is set (or forever).

    ``act`` takes observations (N, obs_dim) float32, or for a policy that sees (an ``inputs``
    attribute) the mapping of its named inputs, each image (N, H, W, 3) uint8; it returns
    actions (N, act_dim), or a chunk policy's (N, k, act_dim). ``metadata`` (sent to every
    client) gives ``obs_dim``, and may give ``keys`` (input -> message key; by default
    :func:`default_keys`) and, for a policy that sees, must give ``image_shapes`` (message key
    -> (H, W, 3)). A message holds each input under its key or its own name, one observation
    or a batch of them, and the answer keeps that shape. A message without a usable input, a
    batch over ``limits.max_batch`` or a call over ``limits.call_timeout_s`` gets a text frame
    naming what is wrong; a frame over :meth:`ServerLimits.max_frame_bytes` closes its
    connection (code 1009) unread; a client without the API key is answered 401, one over the
    connection cap closed with code 1013. Each refusal is logged in one line; the server keeps
    serving.

    Raises:
        ValueError: ``metadata`` lacks the shape of an image the policy reads, or its key map
            does not fit the policy's inputs.
    """
    from concurrent.futures import ThreadPoolExecutor

    from websockets.sync.server import serve as ws_serve

    limits = limits or ServerLimits()
    policy = _PolicyServer(act, metadata, limits, None)
    calls = ThreadPoolExecutor(max_workers=limits.max_connections,
                               thread_name_prefix="policy-call")
    policy.calls = calls
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
            arrays, batched = self.observation(unpackb(message))
        except (KeyError, TypeError, ValueError) as exc:
            return f"bad observation: {exc}"
        n = len(arrays[STATE_KEY])
        if batched and n > limits.max_batch:
            return f"refused: a batch of {n} observations, over the cap of {limits.max_batch}"
        future = self.calls.submit(self.act, arrays if self.sees else arrays[STATE_KEY])
        try:
            actions = future.result(timeout=limits.call_timeout_s)
        except CallTimeout:
            return f"refused: the policy took longer than {limits.call_timeout_s:g} s"
        out = np.asarray(actions, np.float32)
        return packb({"actions": out if batched else out[0]})

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

    ``act(observation)`` sends the observations of every world, the state (N, obs_dim) or the
    mapping of the named inputs :attr:`inputs` names, and returns the actions (N, act_dim), or
    (N, k, act_dim) where the server states its policy's ``chunk_size`` k. A server that takes
    batches (its metadata gives ``obs_dim``, as this project's does) gets one message a call,
    split at its ``max_batch``; any other one message per world, as OpenPI's clients send. By
    default the state alone is sent, as ``obs``; :meth:`send_as` names the images and the keys.

    A failed call (an error frame, a malformed answer, no answer in ``timeout_s``) returns zero
    actions for its worlds and records why in :attr:`failures` (world -> reason, the first
    reason per world kept); after a timeout the connection is opened again, so a late answer
    cannot be read as the next one. The first call is a check: an error or an answer of the
    wrong shape then raises :class:`RemotePolicyError` in one line naming what was sent.

    The client is bounded like the server: the metadata frame is read under
    :data:`METADATA_MAX_BYTES` and its numbers checked before they size anything (a
    ``chunk_size`` over :data:`edge.runtime.MAX_CHUNK_SIZE`, an image side over
    :data:`edge.runtime.MAX_IMAGE_SIDE`, a size that is not a whole number, a key map that is
    not names: one line); every answer frame is read under :attr:`answer_cap` (websockets'
    ``max_size``), derived from the largest answer the client can be owed; a longer one is
    refused unread, as a malformed answer. Every reason is one line of at most
    :data:`REASON_CHARS` of the server's words.
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
        self._hello: bytes | str | None = None
        self._conn: Any = None
        self.inputs: tuple[str, ...] = (STATE_KEY,)
        """What the rollout hands it: the state, then the images it sends."""
        self.keys: dict[str, str] = {STATE_KEY: STATE_KEY}
        """The message key of every input of :attr:`inputs`."""
        self.prompt: str | None = None
        """The instruction sent with every observation as ``prompt``, if any."""
        self.chunk_size: int | None = None
        """k, where the server says its policy answers chunks of k actions; else None."""
        self.batched = False
        """Whether a message carries every world's observation (else one message a world)."""
        self.max_batch = DEFAULT_MAX_BATCH
        """Most observations in one message: the server's ``max_batch``, at most
        :data:`DEFAULT_MAX_BATCH`."""
        self._checked = False
        self._cut_chunks = False
        self._connect()

    @property
    def answer_cap(self) -> int:
        """The longest answer frame read, bytes: the actions of the most observations one
        message carries (:attr:`max_batch`, or one), of k actions each (the stated
        ``chunk_size``; one for a batch server that states none; else
        :data:`edge.runtime.MAX_CHUNK_SIZE`), ``act_dim`` values of
        :data:`ANSWER_VALUE_BYTES`, plus :data:`FRAME_OVERHEAD_BYTES` for the envelope."""
        rows = self.max_batch if self.batched else 1
        k = self.chunk_size or (1 if self.batched else MAX_CHUNK_SIZE)
        return rows * k * self.act_dim * ANSWER_VALUE_BYTES + FRAME_OVERHEAD_BYTES

    def _connect(self) -> None:
        """Open the connection, read the metadata under :data:`METADATA_MAX_BYTES`, check it
        (:func:`checked_metadata`) and hold every later frame to :attr:`answer_cap`. On
        reconnecting, the server must send the same metadata again."""
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.frames import CloseCode
        from websockets.sync.client import connect

        key = os.environ.get(API_KEY_VAR, "").strip()
        headers = {"Authorization": f"Api-Key {key}"} if key else None
        try:
            self._conn = connect(self.uri, compression=None, max_size=METADATA_MAX_BYTES,
                                 open_timeout=self.timeout_s, additional_headers=headers,
                                 logger=_NoDebug(logging.getLogger("websockets.client")))
            hello = self._conn.recv(timeout=self.timeout_s)
            if self._hello is None:
                self._adopt(hello)
            elif hello != self._hello:
                raise self._error("the server sent other metadata on reconnecting")
            # websockets takes max_size when the connection opens, and the answer's size
            # follows from the metadata read on it: the cap goes on the connection's protocol
            # (what max_size sets), which sizes each frame as its first bytes arrive, so every
            # answer to a request sent from now on is held to it.
            self._conn.protocol.max_message_size = self.answer_cap
        except RemotePolicyError:
            self._conn.close()
            raise
        except InvalidStatus as exc:
            status = exc.response.status_code
            hint = f" (set {API_KEY_VAR})" if status == 401 else ""
            raise self._error(f"the server refused the connection with HTTP {status}{hint}") \
                from None
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CloseCode.MESSAGE_TOO_BIG:
                raise self._error(f"the metadata frame is over the cap of "
                                  f"{METADATA_MAX_BYTES:,} bytes; refused unread") from None
            reason = exc.rcvd.reason if exc.rcvd is not None else str(exc)
            raise self._error(f"the server closed the connection ({reason_line(reason)})") \
                from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise self._error(f"cannot connect ({reason_line(exc)})") from None

    def _adopt(self, hello: bytes | str) -> None:
        """Take the first metadata frame: checked, then what it says of chunks and batches."""
        self.metadata = checked_metadata(hello, self._error)
        self._hello = hello
        self.chunk_size = self.metadata.get("chunk_size")
        self.batched = "obs_dim" in self.metadata
        self.max_batch = min(self.metadata.get("max_batch", DEFAULT_MAX_BATCH),
                             DEFAULT_MAX_BATCH)

    def _error(self, message: str) -> RemotePolicyError:
        """A one-line refusal of this server."""
        return RemotePolicyError(printable(f"remote policy {self.uri}: {message}"))

    def send_as(self, images: Mapping[str, tuple[int, ...]],
                keys: Mapping[str, str] | None = None, prompt: str | None = None) -> None:
        """Send the state and the task's camera ``images`` (input name -> (H, W, 3)) under
        ``keys`` (input -> message key) over the server's own key map (its metadata's
        ``keys``) or, without one, :func:`default_keys`; ``prompt`` beside them. Checks the
        image sizes the server's metadata states (``image_shapes``, by message key).

        Raises:
            RemotePolicyError: a key that names no input, two inputs under one key, an image
                the server reads that nothing is sent as, or an image of another size than
                the server's, each in one line naming the key and the sizes.
        """
        inputs = (STATE_KEY, *images)
        served = self.metadata.get("keys")
        base = {n: k for n, k in served.items() if n in inputs} \
            if isinstance(served, dict) and served else None
        try:
            self.keys = key_map(inputs, keys, base)
        except ValueError as exc:
            raise RemotePolicyError(f"remote policy {self.uri}: {exc}") from None
        if base is not None and not keys:  # the server's own map: what it reads, nothing else
            self.keys = {n: k for n, k in self.keys.items() if n in base}
        self.inputs = (STATE_KEY, *[n for n in self.keys if n != STATE_KEY])
        self.prompt = prompt
        sent = {self.keys[n]: (n, tuple(images[n])) for n in self.inputs if n != STATE_KEY}
        wanted: dict[str, tuple[int, ...]] = self.metadata.get("image_shapes") or {}
        for key, expected in wanted.items():
            if key not in sent:
                raise RemotePolicyError(
                    f"remote policy {self.uri}: the server reads {key} ({_size(expected)} "
                    f"images), which no input is sent as (a key map: INPUT={key})")
            name, given = sent[key]
            if given != expected:
                raise RemotePolicyError(
                    f"remote policy {self.uri}: {key}: the server expects {_size(expected)} "
                    f"images, the task's {name} is {_size(given)}")

    def reset(self) -> None:
        """Forget the failures of the last episode (latencies are kept)."""
        self.failures = {}

    def __call__(self, observation: Any) -> np.ndarray:
        """Actions of every world for ``observation``: the state (N, obs_dim), or the mapping
        of :attr:`inputs`; (N, act_dim) float32, or (N, k, act_dim) for a chunk policy."""
        arrays = dict(observation) if isinstance(observation, Mapping) \
            else {STATE_KEY: observation}
        n = len(arrays[STATE_KEY])
        chunk = () if self.chunk_size is None else (self.chunk_size,)
        actions = np.zeros((n, *chunk, self.act_dim), np.float32)
        for worlds in self._batches(n):
            message: dict[str, Any] = {
                self.keys[name]: np.asarray(
                    arrays[name][worlds] if self.batched else arrays[name][worlds.start],
                    np.float32 if name == STATE_KEY else None)
                for name in self.inputs}
            if self.prompt is not None:
                message[PROMPT_KEY] = self.prompt
            answer, reason = self._call(message)
            if reason is None:
                got, reason = self._actions(answer, worlds.stop - worlds.start)
                if got is not None:
                    actions[worlds] = got
            if not self._checked and reason is not None and reason.startswith(_REFUSALS):
                raise RemotePolicyError(f"remote policy {self.uri}: the first call failed "
                                        f"({reason}); it sent {_describe(message)}")
            self._checked = True
            for world in range(worlds.start, worlds.stop) if reason is not None else ():
                self.failures.setdefault(world, f"remote policy: {reason}")
        return actions

    def _batches(self, n: int) -> list[slice]:
        """The worlds of each message: all of them (in pieces of at most the server's
        ``max_batch``) for a server that takes batches, else one each."""
        step = self.max_batch if self.batched else 1
        return [slice(i, min(n, i + step)) for i in range(0, n, step)]

    def _call(self, message: dict[str, Any]) -> tuple[object, str | None]:
        """One round trip, timed: the answer, or why there is none."""
        from websockets.exceptions import ConnectionClosed
        from websockets.frames import CloseCode

        start = time.perf_counter()
        try:
            self._conn.send(packb(message))
            return self._conn.recv(timeout=self.timeout_s), None
        except TimeoutError:
            self._conn.close()
            self._connect()
            return None, f"no answer in {self.timeout_s:g} s"
        except ConnectionClosed as exc:
            if exc.sent is None or exc.sent.code != CloseCode.MESSAGE_TOO_BIG:
                raise self._error(f"the server closed the connection ({reason_line(exc)})") \
                    from None
            self._connect()
            return None, (f"{OVERSIZE} of {self.answer_cap:,} bytes (the actions of "
                          f"{self.max_batch if self.batched else 1} observations); refused "
                          "unread")
        finally:
            self.latencies_s.append(time.perf_counter() - start)

    def _actions(self, answer: object, n: int) -> tuple[np.ndarray | None, str | None]:
        """The actions of ``n`` worlds in an answer, shaped (n, act_dim) or (n, k, act_dim),
        or why there are none. One world's answer may be (act_dim,), (1, act_dim) or a chunk
        (k, act_dim); a chunk from a server that did not state its size gives its first
        action (said once in the log)."""
        if isinstance(answer, str):
            return None, f"server error: {reason_line(answer)}"
        try:
            message = unpackb(answer) if isinstance(answer, bytes) else None
            if not isinstance(message, dict) or "actions" not in message:
                raise ValueError(f"a {type(message).__name__} without actions, not a map "
                                 "with actions")
            actions = np.asarray(message["actions"], np.float32)
        except (TypeError, ValueError, OverflowError) as exc:
            return None, f"malformed answer ({reason_line(exc)})"
        if not self.batched:
            actions = self._one_world(actions)
        k, a = self.chunk_size, self.act_dim
        want = (n, a) if k is None else (n, k, a)
        if actions.shape != want:
            return None, f"malformed answer: actions of shape {_shown(actions.shape)}, not {want}"
        if not np.isfinite(actions).all():
            return None, "malformed answer: actions that are not finite"
        return actions, None

    def _one_world(self, actions: np.ndarray) -> np.ndarray:
        """One world's answer with a batch axis: (act_dim,) or (1, act_dim) -> (1, act_dim);
        a chunk (k, act_dim) -> (1, k, act_dim), or where the server stated no chunk size,
        its first action (1, act_dim)."""
        if self.chunk_size is None and actions.ndim == 2 and len(actions) > 1 and \
                actions.shape[1] == self.act_dim:
            if not self._cut_chunks:
                log.warning("remote policy %s answers chunks of %d actions and states no "
                            "chunk_size in its metadata: the first action of each is run",
                            self.uri, len(actions))
                self._cut_chunks = True
            actions = actions[:1]
        single = 1 if self.chunk_size is None else 2
        return actions[None] if actions.ndim == single else actions

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


OVERSIZE = "malformed answer: a frame over the cap"
"""How the reason for an answer over :attr:`RemotePolicy.answer_cap` begins."""
_REFUSALS = ("server error", "malformed answer (", "malformed answer: actions of shape",
             OVERSIZE)
"""How a first call's failure that stops the run begins: the server refused the message, or
answered in another shape or size (a slow or not finite answer fails its episodes only)."""


def _whole(value: object) -> int | None:
    """``value`` as an int when it is a whole number (not a bool), else None."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return int(value)
    return None


def _name(value: object) -> bool:
    """Whether ``value`` is a text of at most :data:`REASON_CHARS` characters: a name a
    refusal may quote whole."""
    return isinstance(value, str) and len(value) <= REASON_CHARS


def _shown(value: object) -> str:
    """``value`` as it is named in a refusal: its repr, at most 40 characters."""
    text = printable(repr(value)[:41])
    return text if len(text) <= 40 else text[:37] + "..."


def checked_metadata(hello: bytes | str,
                     refuse: Callable[[str], Exception]) -> dict[str, Any]:
    """A server's metadata frame, checked before any of it sizes anything: a msgpack map whose
    ``chunk_size`` is a whole number 1 .. :data:`edge.runtime.MAX_CHUNK_SIZE`, ``max_batch``,
    ``obs_dim`` and ``act_dim`` whole numbers from 1, ``image_shapes`` message keys -> three
    sides 1 .. :data:`edge.runtime.MAX_IMAGE_SIDE`, ``keys`` names -> names, ``task`` and
    ``policy_digest`` short texts, each when present. A text frame states nothing (``{}``).
    Anything else raises ``refuse(reason)``, the reason one line naming the field and value."""
    if isinstance(hello, str):
        return {}
    try:
        meta = unpackb(hello)
    except ValueError as exc:
        raise refuse(f"the metadata frame is {exc}") from None
    if not isinstance(meta, dict):
        raise refuse(f"the metadata is a {type(meta).__name__}, not a map")
    meta = dict(meta)
    for key, top in (("chunk_size", MAX_CHUNK_SIZE), ("max_batch", None), ("obs_dim", None),
                     ("act_dim", None)):
        if key not in meta:
            continue
        number = _whole(meta[key])
        if number is None or number < 1 or (top is not None and number > top):
            bound = f"1 .. {top:,}" if top is not None else "from 1"
            raise refuse(f"the metadata's {key} is {_shown(meta[key])}, not a whole number "
                         f"{bound}")
        meta[key] = number
    for key in ("task", "policy_digest"):
        if key in meta and not _name(meta[key]):
            raise refuse(f"the metadata's {key} is {_shown(meta[key])}, not a text of at most "
                         f"{REASON_CHARS} characters")
    keys = meta.get("keys")
    if keys is not None and (not isinstance(keys, dict) or not all(
            _name(k) and _name(v) for k, v in keys.items())):
        raise refuse(f"the metadata's keys is {_shown(keys)}, not a map of names to names "
                     f"(texts of at most {REASON_CHARS} characters)")
    if meta.get("image_shapes") is not None:
        meta["image_shapes"] = _image_shapes(meta["image_shapes"], refuse)
    return meta


def _image_shapes(shapes: object, refuse: Callable[[str], Exception]
                  ) -> dict[str, tuple[int, ...]]:
    """The metadata's ``image_shapes``: message key -> (H, W, C), each side a whole number
    1 .. :data:`edge.runtime.MAX_IMAGE_SIDE`."""
    if not isinstance(shapes, dict):
        raise refuse(f"the metadata's image_shapes is {_shown(shapes)}, not a map")
    checked: dict[str, tuple[int, ...]] = {}
    for key, shape in shapes.items():
        sides = [_whole(x) for x in shape] \
            if isinstance(shape, list | tuple) and len(shape) == 3 else []
        if not _name(key) or len(sides) != 3 or \
                not all(n is not None and 1 <= n <= MAX_IMAGE_SIDE for n in sides):
            raise refuse(f"the metadata's image_shapes[{_shown(key)}] is {_shown(shape)}, "
                         f"not three sides 1 .. {MAX_IMAGE_SIDE:,}")
        checked[key] = tuple(n for n in sides if n is not None)
    return checked


def _size(shape: tuple[int, ...]) -> str:
    """An image shape as ``HxWxC``."""
    return "x".join(map(str, shape))


def _describe(message: Mapping[str, Any]) -> str:
    """What a message holds, each key with its dtype and shape, for a one-line error."""
    return ", ".join(f"{key} {value.dtype} {value.shape}" if isinstance(value, np.ndarray)
                     else f"{key} {type(value).__name__}" for key, value in message.items())

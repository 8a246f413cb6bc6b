"""Policies on another machine, called like local ones over OpenPI's websocket protocol.

:class:`RemotePolicy` is the client validation uses for a policy given as ``ws://host:port``
(the protocol: :mod:`stages.policies.wire`; this project's server:
:mod:`stages.policies.policy_server`): the worlds' observations in one message per control step
where the server takes batches (its metadata gives ``obs_dim``, as this project's does), else
one message per world as OpenPI's clients send; each call's latency recorded. An answer that is
an error, malformed (wrong shape, not finite) or later than ``timeout_s`` fails the episodes of
that call, with the reason recorded, and the rollout goes on; a server that is gone, or that
refuses the first call, stops the run with one line. The client is bounded like the server: the
metadata is read under a 1 MiB cap and its numbers checked before they size anything
(:func:`checked_metadata`), each answer under a cap derived from the actions it owes
(:attr:`RemotePolicy.answer_cap`), and every reason is one line of at most
:data:`~stages.policies.wire.REASON_CHARS` of the server's words.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edge.runtime import MAX_CHUNK_SIZE, MAX_IMAGE_SIDE
from physai_core.errors import PhysaiError, printable
from stages.policies.wire import (
    API_KEY_VAR,
    DEFAULT_MAX_BATCH,
    FRAME_OVERHEAD_BYTES,
    PROMPT_KEY,
    REASON_CHARS,
    NoDebug,
    key_map,
    packb,
    reason_line,
    unpackb,
)
from stages.sim.env.observation import STATE_KEY

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""Longest wait for one answer before the call's episodes count as failed."""
METADATA_MAX_BYTES = 1 << 20
"""Cap on the metadata frame a client reads on connecting (1 MiB): names, sizes and a key map
take a few hundred bytes."""
ANSWER_VALUE_BYTES = 16
"""Room for one action value in an answer: 8 bytes as float64 (the widest dtype) in an ndarray
map, 9 as a float64 in a msgpack list, the rest for nested lists' headers."""


class RemotePolicyError(PhysaiError):
    """A remote policy server that cannot be reached, or that went away."""

    exit_code = 2


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
        """The instruction sent with every observation as ``prompt``, if any: the run's,
        for the episodes of a scene that gives none (:meth:`instruct`)."""
        self.instructions: tuple[str, ...] | None = None
        """Each world's instruction for this episode (:meth:`instruct`), sent as its
        ``prompt`` over :attr:`prompt`; None: every world's is :attr:`prompt`."""
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
                                 logger=NoDebug(logging.getLogger("websockets.client")))
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

    def instruct(self, instructions: Sequence[str] | None) -> None:
        """The instruction of every world's coming episode, each sent as that world's
        ``prompt`` (worlds of one instruction share a message at a server that takes
        batches); None: the scene gives none, and :attr:`prompt` goes with every world."""
        self.instructions = None if instructions is None else tuple(instructions)

    def __call__(self, observation: Any) -> np.ndarray:
        """Actions of every world for ``observation``: the state (N, obs_dim), or the mapping
        of :attr:`inputs`; (N, act_dim) float32, or (N, k, act_dim) for a chunk policy."""
        arrays = dict(observation) if isinstance(observation, Mapping) \
            else {STATE_KEY: observation}
        n = len(arrays[STATE_KEY])
        chunk = () if self.chunk_size is None else (self.chunk_size,)
        actions = np.zeros((n, *chunk, self.act_dim), np.float32)
        for prompt, worlds in self._batches(n):
            message: dict[str, Any] = {
                self.keys[name]: np.asarray(
                    arrays[name][worlds] if self.batched else arrays[name][worlds[0]],
                    np.float32 if name == STATE_KEY else None)
                for name in self.inputs}
            if prompt is not None:
                message[PROMPT_KEY] = prompt
            answer, reason = self._call(message)
            if reason is None:
                got, reason = self._actions(answer, len(worlds))
                if got is not None:
                    actions[worlds] = got
            if not self._checked and reason is not None and reason.startswith(_REFUSALS):
                raise RemotePolicyError(f"remote policy {self.uri}: the first call failed "
                                        f"({reason}); it sent {_describe(message)}")
            self._checked = True
            for world in worlds.tolist() if reason is not None else ():
                self.failures.setdefault(world, f"remote policy: {reason}")
        return actions

    def _batches(self, n: int) -> list[tuple[str | None, np.ndarray]]:
        """The prompt and the worlds of each message: for a server that takes batches, the
        worlds of each prompt in pieces of at most its ``max_batch``, else one each. A world's
        prompt is its instruction (:attr:`instructions`), else :attr:`prompt`."""
        told = self.instructions
        if told is not None and len(told) != n:
            raise RemotePolicyError(f"remote policy {self.uri}: {len(told)} instructions for "
                                    f"{n} worlds")
        prompts = [self.prompt] * n if told is None else list(told)
        step = self.max_batch if self.batched else 1
        out = []
        for prompt in dict.fromkeys(prompts):
            worlds = np.flatnonzero(np.asarray([p == prompt for p in prompts]))
            out += [(prompt, worlds[i:i + step]) for i in range(0, len(worlds), step)]
        return out

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
    Anything else raises ``refuse(reason)``, the reason one line naming the field and value.

    Steps: 1. the frame read as a map; 2. its sizes, whole numbers in range; 3. its names,
    short texts; 4. its image shapes."""
    # -- 1. a text frame states nothing; a binary one must be a msgpack map
    if isinstance(hello, str):
        return {}
    try:
        meta = unpackb(hello)
    except ValueError as exc:
        raise refuse(f"the metadata frame is {exc}") from None
    if not isinstance(meta, dict):
        raise refuse(f"the metadata is a {type(meta).__name__}, not a map")
    meta = dict(meta)
    # -- 2. the numbers that size buffers and frames, before any of them is used
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
    # -- 3. the names a refusal may quote whole
    for key in ("task", "policy_digest"):
        if key in meta and not _name(meta[key]):
            raise refuse(f"the metadata's {key} is {_shown(meta[key])}, not a text of at most "
                         f"{REASON_CHARS} characters")
    keys = meta.get("keys")
    if keys is not None and (not isinstance(keys, dict) or not all(
            _name(k) and _name(v) for k, v in keys.items())):
        raise refuse(f"the metadata's keys is {_shown(keys)}, not a map of names to names "
                     f"(texts of at most {REASON_CHARS} characters)")
    # -- 4. every image shape, each side bounded
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

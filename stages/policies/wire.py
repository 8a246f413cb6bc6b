"""OpenPI's websocket policy protocol, what both its ends share: the frames and the message keys.

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

The wire format is written here (a few lines over ``msgpack``) rather than imported from
``openpi-client``: that package pins ``numpy<2``, which this project's stack cannot take; the
tests check every message against ``openpi-client`` itself. The server is
:mod:`stages.policies.policy_server`, the client :mod:`stages.policies.remote`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from physai_core.errors import printable
from stages.sim.env.observation import STATE_KEY

DEFAULT_MAX_BATCH = 4096
"""Most observations the server takes in one message."""
FRAME_OVERHEAD_BYTES = 64 * 1024
"""Room in a frame beside the observations: other keys of the message, msgpack's framing."""
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


class NoDebug(logging.LoggerAdapter):
    """A websockets logger that never logs at DEBUG, where websockets writes every request
    header (the API key's ``Authorization`` among them)."""

    def isEnabledFor(self, level: int) -> bool:
        """Whether ``level`` is logged: never DEBUG."""
        return level > logging.DEBUG and self.logger.isEnabledFor(level)

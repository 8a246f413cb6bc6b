"""The Cosmos critic: a vision-language model watches each scene's filmed rollout.

Validation sends every filmed scene's rollout, as an MP4 video, to a Cosmos Reason endpoint
(NVIDIA NIM's OpenAI-compatible ``POST /v1/chat/completions``, the video as a ``video_url``
content part carrying a ``data:video/mp4;base64,...`` URL) and asks two questions: is the
motion physically plausible, and is the task done. The model answers in a JSON object
(``plausible``, ``task_done``, ``reasoning``), optionally after its ``<think>`` block and inside
``<answer>`` tags. Each verdict and its reasoning go into the sim report and the MLflow run, and
``validate.critic.min_pass_rate`` makes it a gate.

``validate.critic.camera`` may instead send the critic what a policy that sees was shown:
``policy`` (its first camera) or a camera's name (:func:`watched`), the filmed worlds side by
side as in the video, the question saying so.

Where the endpoint lives: ``validate.critic.url`` and ``.model`` in the config, or
``PHYSAI_COSMOS_URL`` and ``PHYSAI_COSMOS_MODEL``; its key, if it needs one, only from
``PHYSAI_COSMOS_API_KEY`` (sent as a bearer token, never logged, recorded or cached). The URL
is ``https://``, or ``http://`` on this machine only (localhost, 127.0.0.1, ::1), and carries
no user or password. The key goes to that address alone: a redirect is refused, not followed.
Connection failures, timeouts, 429 and 5xx answers are retried with backoff, up to
``retries`` times; any other answer, one larger than :data:`MAX_ANSWER_BYTES`, and an answer
that is not the JSON asked for, fail the stage with one line.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from physai_core.errors import BackendUnavailableError, PhysaiError, TransientError
from stages.artifacts.records import CriticVerdict
from stages.sections.models import CriticConfig, critic_url_problem
from stages.tracking.lineage import without_credentials

log = logging.getLogger(__name__)

URL_ENV = "PHYSAI_COSMOS_URL"
MODEL_ENV = "PHYSAI_COSMOS_MODEL"
KEY_ENV = "PHYSAI_COSMOS_API_KEY"
DEFAULT_MODEL = "nvidia/cosmos-reason2-8b"
MAX_ANSWER_BYTES = 1 << 20
"""The largest answer read: a verdict of ``max_tokens`` 1024 takes a few KiB."""
PROMPT = (
    "This video shows {episodes} simulated episode(s) of a robot, side by side, for the task "
    "'{task}' in the scene '{scene}'. The task is done when: {success}.\n"
    "Judge two things: is the motion physically plausible (no interpenetration, teleporting, "
    "exploding joints or motion against gravity), and is the task done at the end of every "
    "episode? Answer with one JSON object and nothing else, inside <answer></answer> tags: "
    '{{"plausible": true or false, "task_done": true or false, "reasoning": "one or two '
    'sentences"}}'
)


POLICY_CAMERA = "policy"
"""``validate.critic.camera`` asking for the frames the policy saw (its first camera)."""
SEEN_NOTE = (" The video is what the robot's camera '{camera}' showed its control policy, the "
             "episodes side by side, rather than a view of the whole scene.")
"""Added to :data:`PROMPT` when the critic watches what the policy saw."""


class CriticError(PhysaiError):
    """The critic's endpoint gave no usable verdict."""


def watched(cfg: CriticConfig, scene: str, frames: Sequence[np.ndarray],
            seen: Mapping[str, np.ndarray] | None) -> tuple[list[np.ndarray], str | None]:
    """The frames the critic watches of a scene, and the policy's camera they come from
    (None: the filmed video), as ``validate.critic.camera`` says: unset, the filmed
    ``frames``; ``policy``, what the policy was shown by its first camera; a camera's name
    (``front``, or its input ``front_image``), what that camera showed it. The filmed worlds
    stand side by side in each frame.

    Shapes: ``frames`` (H, K * W, 3) uint8 each; ``seen`` (F, K, h, w, 3) uint8 by input name;
    returned (h, K * w, 3) uint8 each for a camera.

    Raises:
        CriticError: no video was filmed, the policy was shown no image, or the camera named
            is not one it reads; one line naming the scene.
    """
    from stages.evaluation.video import tile

    if cfg.camera is None:
        if not frames:
            raise CriticError(f"validate.critic: scene {scene!r} has no video to judge "
                              "(its rendering failed; see the warning above)")
        return list(frames), None
    if not seen:
        raise CriticError(f"validate.critic.camera: {cfg.camera}: scene {scene!r}: the policy "
                          "was shown no camera image (it reads the state alone)")
    key = next(iter(seen)) if cfg.camera == POLICY_CAMERA else \
        cfg.camera if cfg.camera in seen else f"{cfg.camera}_image"
    if key not in seen:
        raise CriticError(f"validate.critic.camera: {cfg.camera}: scene {scene!r}: not a "
                          f"camera the policy reads (it reads {', '.join(seen)})")
    return [tile(images) for images in seen[key]], key.removesuffix("_image")


@dataclass(frozen=True)
class Endpoint:
    """Where the critic's model is served and how long to wait for it."""

    url: str
    model: str
    api_key: str | None
    timeout_s: float
    retries: int
    backoff_s: float

    @property
    def shown(self) -> str:
        """The URL as messages show it: without credentials."""
        return without_credentials(self.url)


def endpoint(cfg: CriticConfig, env: dict[str, str] | None = None) -> Endpoint:
    """The endpoint from the config, else the environment; no URL at all, or one that is
    not https (but on this machine) or carries a user or password, is an error."""
    env = dict(os.environ) if env is None else env
    field = "validate.critic.url" if cfg.url else URL_ENV
    url = cfg.url or env.get(URL_ENV, "").strip()
    if not url:
        raise CriticError(f"validate.critic: no endpoint; set validate.critic.url or {URL_ENV}")
    problem = critic_url_problem(url)
    if problem is not None:
        raise CriticError(f"{field}: {without_credentials(url)!r} {problem}")
    return Endpoint(url=url.rstrip("/"), model=cfg.model or env.get(MODEL_ENV) or DEFAULT_MODEL,
                    api_key=env.get(KEY_ENV) or None, timeout_s=cfg.timeout_s,
                    retries=cfg.retries, backoff_s=cfg.backoff_s)


def encode_mp4(frames: Sequence[np.ndarray], fps: float) -> bytes:
    """RGB frames, each (H, W, 3) uint8, as an H.264 MP4 (odd sizes padded by one pixel).

    Needs PyAV (the ``cosmos`` extra).
    """
    try:
        import av
    except ImportError as exc:
        raise BackendUnavailableError("cosmos critic", "cosmos", exc) from None
    if not frames:
        raise ValueError("no frames to encode")
    height, width = frames[0].shape[:2]
    padded_h, padded_w = height + height % 2, width + width % 2
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=max(1, round(fps)))
        stream.width, stream.height, stream.pix_fmt = padded_w, padded_h, "yuv420p"
        for frame in frames:
            image = np.zeros((padded_h, padded_w, 3), np.uint8)
            image[:height, :width] = frame[..., :3]
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def request_body(model: str, video: bytes, prompt: str) -> dict[str, Any]:
    """The chat-completions request: the video, then the question."""
    url = "data:video/mp4;base64," + base64.b64encode(video).decode("ascii")
    return {
        "model": model,
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url}},
            {"type": "text", "text": prompt},
        ]}],
        "max_tokens": 1024,
        "temperature": 0.0,
    }


def judge(ep: Endpoint, scene: str, video: bytes, prompt: str) -> CriticVerdict:
    """Ask the endpoint about one scene's video; retries transient failures, then one line."""
    body = json.dumps(request_body(ep.model, video, prompt)).encode()
    attempts = ep.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            answer = _post(ep, body)
            break
        except TransientError as exc:
            if attempt == attempts:
                raise CriticError(f"Cosmos critic at {ep.shown}: {exc} ({attempts} tries)"
                                  ) from None
            log.warning("Cosmos critic at %s: %s; retrying (%d/%d)", ep.shown, exc,
                        attempt, ep.retries)
            time.sleep(ep.backoff_s * 2 ** (attempt - 1))
    return parse_verdict(ep, scene, answer)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the answer stays the 3xx it is, and the key goes nowhere else."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _post(ep: Endpoint, body: bytes) -> bytes:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if ep.api_key:
        headers["Authorization"] = f"Bearer {ep.api_key}"
    request = urllib.request.Request(f"{ep.url}/v1/chat/completions", data=body,
                                     headers=headers, method="POST")
    try:
        opener = urllib.request.build_opener(_NoRedirects())
        with opener.open(request, timeout=ep.timeout_s) as response:
            return _read_bounded(ep, response)
    except urllib.error.HTTPError as exc:
        if exc.code == 429 or exc.code >= 500:
            raise TransientError(f"HTTP {exc.code}") from None
        if 300 <= exc.code < 400:
            raise CriticError(f"Cosmos critic at {ep.shown}: HTTP {exc.code} redirect refused; "
                              "set the URL to the address that answers") from None
        raise CriticError(f"Cosmos critic at {ep.shown}: HTTP {exc.code} {exc.reason}"
                          ) from None
    except TimeoutError:
        raise TransientError(f"no answer within {ep.timeout_s:g} s") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise TransientError(f"no answer within {ep.timeout_s:g} s") from None
        raise TransientError(f"unreachable ({exc.reason})") from None
    except (ConnectionError, OSError) as exc:
        raise TransientError(f"connection failed ({exc.__class__.__name__})") from None


def _read_bounded(ep: Endpoint, response: Any) -> bytes:
    """The answer's body, refused past :data:`MAX_ANSWER_BYTES` or past the timeout."""
    too_large = CriticError(f"Cosmos critic at {ep.shown}: answer larger than "
                            f"{MAX_ANSWER_BYTES} bytes refused")
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise too_large
    deadline = time.monotonic() + ep.timeout_s
    answer = bytearray()
    while chunk := response.read(min(1 << 16, MAX_ANSWER_BYTES + 1 - len(answer))):
        answer += chunk
        if len(answer) > MAX_ANSWER_BYTES:
            raise too_large
        if time.monotonic() > deadline:
            raise TransientError(f"no answer within {ep.timeout_s:g} s")
    return bytes(answer)


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_verdict(ep: Endpoint, scene: str, answer: bytes) -> CriticVerdict:
    """The verdict in a chat-completions answer; anything else is one line naming what is
    wrong (not the answer itself)."""
    where = f"Cosmos critic at {ep.shown}, scene {scene!r}"
    try:
        data = json.loads(answer)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CriticError(f"{where}: malformed answer: not a chat completion with "
                          "choices[0].message.content") from None
    if not isinstance(content, str):
        raise CriticError(f"{where}: malformed answer: message content is not text") from None
    inner = _ANSWER.search(content)
    found = _OBJECT.search(inner.group(1) if inner else content)
    try:
        verdict = json.loads(found.group(0)) if found else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict):
        raise CriticError(f"{where}: malformed answer: no JSON object in the message")
    for key in ("plausible", "task_done"):
        if not isinstance(verdict.get(key), bool):
            raise CriticError(f"{where}: malformed answer: {key!r} is "
                              f"{_kind(verdict.get(key))}, not true or false")
    reasoning = verdict.get("reasoning", "")
    if not isinstance(reasoning, str):
        raise CriticError(f"{where}: malformed answer: 'reasoning' is {_kind(reasoning)}, "
                          "not text")
    return CriticVerdict(model=ep.model, plausible=verdict["plausible"],
                         task_done=verdict["task_done"],
                         passed=verdict["plausible"] and verdict["task_done"],
                         reasoning=reasoning[:2000])


def _kind(value: object) -> str:
    return "missing" if value is None else type(value).__name__
